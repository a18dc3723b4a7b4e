/*
 * nn/models/convnet.c — a plain convolutional network on NCHW images, no
 * residual connections:
 *
 *   stage s < depth, c_s = width x 2^s channels:
 *     conv 3x3 (c_{s-1} -> c_s, no bias) -> BN -> act -> max pool 2x2, stride 2
 *   -> global average pool -> linear(c_{depth-1}, classes)
 *
 * Each pool halves the image (rounding down), so its sides must be at
 * least 2^depth.  Stage s's channels are width layer s, as an mlp's hidden
 * layers are: its convolution's output channels (rows), its batch norm's,
 * and the next convolution's input channels (columns, 9 per channel) or,
 * after the last stage, the head's inputs.  No layer groups.
 *
 * Buffers per stage (c_s channels of H_s x W_s, H_{s+1} = H_s / 2): saved
 * for the backward c (the convolution's output), r (after the activation;
 * with an activation other than ReLU the batch norm's output b too) and
 * p (pooled); their gradients dc, dr (db) and dp, a set per stage.
 */
#include <stdio.h>

#include "nn/conv_block.h"

/* A tensor of c x h x w of stage s's width layer; *ok = 0 when out of memory. */
static int image(st_model *m, int64_t c, int64_t h, int64_t w, int unit, int *ok)
{
    const int t = st_graph_image(m, c, h, w, unit);
    *ok = *ok && t >= 0;
    return t;
}

static st_status declare(st_model *m)
{
    const st_model_config *c = &m->cfg;
    int64_t cin = c->in_channels, H = c->in_height, W = c->in_width;
    int x = ST_T_INPUT, dx = ST_T_NONE, ok = 1;   /* nobody needs the input's gradient */
    const int fused = st_graph_bn_fuses_relu(m);
    char name[32];
    for (int s = 0; s < c->depth && ok; s++) {
        const int64_t cs = (int64_t)c->width << s;
        const int y = image(m, cs, H, W, s, &ok), dy = image(m, cs, H, W, s, &ok);
        const int r = image(m, cs, H, W, s, &ok), dr = image(m, cs, H, W, s, &ok);
        const int b = fused ? ST_T_NONE : image(m, cs, H, W, s, &ok);
        const int db = fused ? ST_T_NONE : image(m, cs, H, W, s, &ok);
        const int p = image(m, cs, H / 2, W / 2, s, &ok), dp = image(m, cs, H / 2, W / 2, s, &ok);
        snprintf(name, sizeof name, "stage%d.conv", s);
        st_layer *l = ok ? st_graph_conv(m, name, x, y, dx, dy, cin, cs, 3, 1) : NULL;
        if (l) {
            l->in_unit = s > 0 ? s - 1 : ST_W_FULL;
            l->out_unit = s;
        }
        snprintf(name, sizeof name, "stage%d.bn", s);
        ok = l && st_graph_bn_act(m, name, y, r, dy, dr, b, db, cs, s);
        l = ok ? st_graph_add(m, &st_layer_maxpool, "pool", r, p, dr, dp) : NULL;
        if (l) {
            l->in = l->out = cs;
            l->in_unit = l->out_unit = s;
            l->kernel = l->stride = 2;
        }
        ok = ok && l;
        x = p;
        dx = dp;
        cin = cs;
        H /= 2;
        W /= 2;
    }
    const int last = c->depth - 1;
    const int pooled = ok ? st_graph_tensor(m, cin, last) : -1;
    const int dpooled = ok ? st_graph_tensor(m, cin, last) : -1;
    st_layer *gap = pooled >= 0 && dpooled >= 0
                        ? st_graph_add(m, &st_layer_avgpool, "gap", x, pooled, dx, dpooled)
                        : NULL;
    if (gap) {
        gap->in = gap->out = cin;
        gap->in_unit = gap->out_unit = last;
    }
    st_layer *head = gap ? st_graph_linear(m, "head", pooled, ST_T_LOGITS, dpooled,
                                           ST_T_DLOGITS, cin, c->n_classes)
                         : NULL;
    if (!head)
        return st_fail(ST_ERR_NOMEM, "out of memory declaring the convnet");
    head->in_unit = last;
    return ST_OK;
}

/* Three stages of 32, 64 and 128 channels, BN -> ReLU. */
static void defaults(st_model_config *c, unsigned given)
{
    if (!(given & ST_MODEL_OPT_DEPTH))
        c->depth = 3;
    if (!(given & ST_MODEL_OPT_WIDTH))
        c->width = 32;
    if (!(given & ST_MODEL_OPT_ACTIVATION))
        c->activation = ST_ACT_RELU;
}

/* The last stage's channels within a layer's limit, before the data (in
 * a front end's words); the stages the images can take once known. */
static st_status check(const st_model_config *c)
{
    if (c->depth > 17 || ((int64_t)c->width << (c->depth - 1)) > 65536)
        return st_fail(ST_ERR_INVALID, "--model convnet --depth %d --width %d: its last stage "
                       "would have more than 65536 channels (width x 2^(depth - 1))", c->depth,
                       c->width);
    const int side = c->in_height < c->in_width ? c->in_height : c->in_width;
    int most = 0;
    while (side >> (most + 1) >= 1)
        most++;
    if (c->in_channels && c->depth > most)
        return st_fail(ST_ERR_INVALID, "--model convnet --depth %d: each stage halves the "
                       "image, and %dx%d images take at most %d stages", c->depth,
                       c->in_height, c->in_width, most);
    return ST_OK;
}

const st_model_builder st_model_convnet = {
    .name = "convnet",
    .help = "convnet: plain convolutional network, --depth stages of conv 3x3 -> batch norm "
            "-> activation -> 2x2 max pool, --width channels doubling each stage (default 3 "
            "stages from 32, relu), global average pool, linear head; image data",
    .reads = ST_MODEL_READS_IMAGES,
    .options = ST_MODEL_OPT_DEPTH | ST_MODEL_OPT_WIDTH | ST_MODEL_OPT_ACTIVATION,
    .defaults = defaults, .check = check, .declare = declare,
};

/*
 * nn/models/resnet.c — residual convolutional networks on NCHW images,
 * pre-activation basic blocks (BN -> ReLU -> conv 3x3, twice, plus the
 * skip), as in the identity-mapping ResNets (the activation is the
 * config's: ReLU as usual, GELU for a smooth one):
 *
 *   resnet   (CIFAR family)  stem conv 3x3 (C -> w), 3 stages of `depth`
 *                            blocks with w, 2w, 4w channels, strides 1, 2, 2
 *   resnet18                 the same with 4 stages of 2 blocks, w .. 8w
 *   then BN -> ReLU -> global average pool -> linear head.
 *
 * The first block of a stage that halves the resolution has a projection
 * shortcut (conv 1x1, stride 2, on the pre-activated input); every other
 * block is a layer group with an identity skip: a subnetwork that leaves
 * it out passes its input through.  The stem, the projection blocks, the
 * final norm and the head belong to no group: everybody holds them.  A
 * group's width layer is its first convolution's output channels (and its
 * batch norm's, and the second convolution's input channels).
 *
 * Buffers per stage s (c channels, H x W): the saved activations of each
 * block (a0, p, c1, b1, r1, out: 6 c H W floats; a projection block also
 * c2 and the shortcut's s, which a join adds: an identity block's conv2
 * adds its skip as it writes out),
 * and gradients shared by the stage's blocks: dh (the stream's), dtmp,
 * da0, dp, dc1, db1, dr1 (and dq at a projection).  dh is written by the
 * layer after the stage and by the next stage's projection block, and
 * every block's skip adds its branch's share to it (see residual.c).
 */
#include <stdio.h>

#include "nn/conv_block.h"

/* The gradients one stage's blocks share (full width: a subnetwork's
 * kept channels use a prefix). */
typedef struct stage_grads {
    int dh, dtmp, da0, dp, dc1, db1, dr1, dq;
} stage_grads;

static int image(st_model *m, int64_t c, int64_t h, int64_t w, int unit, int *ok)
{
    const int t = st_graph_image(m, c, h, w, unit);
    *ok = *ok && t >= 0;
    return t;
}

/* One block from h (cin x H x W) to a new tensor (c x H/stride x W/stride):
 * a group with an identity skip when stride is 1 and cin == c, else a
 * projection block.  in: the previous stage's gradients at a projection. */
static int block(st_model *m, int h, int64_t cin, int64_t c, int64_t H, int64_t W, int stride,
                 const stage_grads *in, const stage_grads *g, int *group, const char *prefix,
                 int *ok)
{
    const int proj = stride != 1 || cin != c;
    const int64_t Ho = (H - 1) / stride + 1, Wo = (W - 1) / stride + 1;
    const int unit = proj ? ST_W_FULL : *group;
    char name[48];
    if (!proj)
        st_graph_group_begin(m, *group);
    /* pre-activation of the input: at a projection its gradients are the
     * previous stage's (the stream's dh is written there, not added to) */
    const stage_grads *pre = proj ? in : g;
    const int a0_dx = proj ? pre->dh : g->dtmp;
    if (!proj && !st_graph_add(m, &st_layer_residual, "skip", h, h, g->dh, g->dtmp))
        *ok = 0;
    const int a0 = image(m, cin, H, W, ST_W_FULL, ok), p = image(m, cin, H, W, ST_W_FULL, ok);
    snprintf(name, sizeof name, "%s.bn0", prefix);
    if (!st_graph_bn_act(m, name, h, p, a0_dx, pre->dp, a0, pre->da0, cin, ST_W_FULL))
        *ok = 0;
    /* a projection forks the pre-activated input: its two paths' gradients
     * meet in dp (the branch's) += dq (the shortcut's) */
    if (proj && !st_graph_add(m, &st_layer_residual, "fork", p, p, pre->dp, pre->dq))
        *ok = 0;
    const int c1 = image(m, c, Ho, Wo, unit, ok), b1 = image(m, c, Ho, Wo, unit, ok);
    const int r1 = image(m, c, Ho, Wo, unit, ok);
    /* an identity block's conv2 adds the skip as it writes the stream; a
     * projection's shortcut runs after it, so a join adds the two */
    const int c2 = proj ? image(m, c, Ho, Wo, ST_W_FULL, ok) : ST_T_NONE;
    const int out = image(m, c, Ho, Wo, ST_W_FULL, ok);
    snprintf(name, sizeof name, "%s.conv1", prefix);
    st_layer *l = st_graph_conv(m, name, p, c1, pre->dp, g->dc1, cin, c, 3, stride);
    if (l)
        l->out_unit = unit;
    snprintf(name, sizeof name, "%s.bn1", prefix);
    if (!st_graph_bn_act(m, name, c1, r1, g->dc1, g->dr1, b1, g->db1, c, unit))
        *ok = 0;
    snprintf(name, sizeof name, "%s.conv2", prefix);
    st_layer *l2 = st_graph_conv(m, name, r1, proj ? c2 : out, g->dr1, g->dh, c, c, 3, 1);
    if (l2) {
        l2->in_unit = unit;
        /* the branch scale multiplies an identity block's branch */
        l2->closes_group = !proj;
        if (!proj)
            l2->residual = h;
    }
    if (proj) {
        const int skip = image(m, c, Ho, Wo, ST_W_FULL, ok);
        snprintf(name, sizeof name, "%s.shortcut", prefix);
        if (!st_graph_conv(m, name, p, skip, pre->dq, g->dh, cin, c, 1, stride))
            *ok = 0;
        st_layer *j = st_graph_add(m, &st_layer_join, "join", skip, out, ST_T_NONE, g->dh);
        if (j)
            j->residual = c2;
        *ok = *ok && j;
    }
    *ok = *ok && l && l2;
    if (!proj) {
        st_graph_group_end(m, h, out);
        (*group)++;
    }
    return out;
}

static st_status declare(st_model *m, int stages, int blocks)
{
    const st_model_config *cf = &m->cfg;
    int64_t H = cf->in_height, W = cf->in_width, c = cf->width;
    int ok = 1, group = 0;
    stage_grads g[8];
    for (int s = 0; s < stages && ok; s++) {
        const int64_t cs = c << s, Hs = s ? (H - 1) / 2 + 1 : H, Ws = s ? (W - 1) / 2 + 1 : W;
        int *f = &g[s].dh;
        for (int k = 0; k < 8; k++)
            f[k] = image(m, cs, Hs, Ws, ST_W_FULL, &ok);
        H = Hs;
        W = Ws;
    }
    H = cf->in_height;
    W = cf->in_width;
    int h = image(m, c, H, W, ST_W_FULL, &ok);
    if (!ok || !st_graph_conv(m, "stem", ST_T_INPUT, h, ST_T_NONE, g[0].dh, cf->in_channels, c, 3,
                              1))
        return st_fail(ST_ERR_NOMEM, "out of memory declaring the resnet");
    int64_t cin = c;
    char prefix[32];
    for (int s = 0; s < stages && ok; s++) {
        const int64_t cs = c << s;
        st_graph_section(m, s);   /* ResIST deals each stage's blocks */
        for (int b = 0; b < blocks && ok; b++) {
            const int stride = s > 0 && b == 0 ? 2 : 1;
            snprintf(prefix, sizeof prefix, "stage%d.block%d", s, b);
            /* a projection block is in no group: a recomputation block of its own */
            st_graph_block(m, stride != 1 || cin != cs ? s : -1);
            h = block(m, h, cin, cs, H, W, stride, s ? &g[s - 1] : &g[0], &g[s], &group, prefix,
                      &ok);
            st_graph_block(m, -1);
            if (stride == 2) {
                H = (H - 1) / 2 + 1;
                W = (W - 1) / 2 + 1;
            }
            cin = cs;
        }
    }
    const stage_grads *last = &g[stages - 1];
    const int af = image(m, cin, H, W, ST_W_FULL, &ok), pf = image(m, cin, H, W, ST_W_FULL, &ok);
    const int pooled = st_graph_tensor(m, cin, ST_W_FULL), dpool = st_graph_tensor(m, cin, ST_W_FULL);
    ok = ok && pooled >= 0 && dpool >= 0;
    if (ok && !st_graph_bn_act(m, "final_bn", h, pf, last->dh, last->dp, af, last->da0, cin,
                               ST_W_FULL))
        ok = 0;
    st_layer *gap = ok ? st_graph_add(m, &st_layer_avgpool, "pool", pf, pooled, last->dp, dpool)
                       : NULL;
    if (gap)
        gap->in = gap->out = cin;
    ok = ok && gap && st_graph_linear(m, "head", pooled, ST_T_LOGITS, dpool, ST_T_DLOGITS, cin,
                                      cf->n_classes);
    return ok ? ST_OK : st_fail(ST_ERR_NOMEM, "out of memory declaring the resnet");
}

static st_status declare_resnet(st_model *m)
{
    return declare(m, 3, m->cfg.depth);
}

static st_status declare_resnet18(st_model *m)
{
    return declare(m, 4, 2);
}

/* A CIFAR ResNet-20-like default: 3 blocks per stage, 16 channels first;
 * ResNets use ReLU unless asked otherwise. */
static void defaults(st_model_config *c, unsigned given)
{
    if (!(given & ST_MODEL_OPT_DEPTH))
        c->depth = 3;
    if (!(given & ST_MODEL_OPT_WIDTH))
        c->width = 16;
    if (!(given & ST_MODEL_OPT_ACTIVATION))
        c->activation = ST_ACT_RELU;
}

static st_status check_options(const st_model_config *c, unsigned given)
{
    (void)c;
    if (given & ST_MODEL_OPT_HIDDEN)
        return st_fail(ST_ERR_INVALID, "--hidden applies to resmlp only (a resnet's blocks are "
                       "as wide as their stage)");
    return ST_OK;
}

const st_model_builder st_model_resnet = {
    .name = "resnet",
    .help = "resnet: pre-activation ResNet of 3 stages (CIFAR family), resnet18: 4 stages of 2 "
            "blocks; both take image data (C x H x W)",
    .reads = ST_MODEL_READS_IMAGES,
    .options = ST_MODEL_OPT_DEPTH | ST_MODEL_OPT_WIDTH | ST_MODEL_OPT_ACTIVATION,
    .defaults = defaults, .check_options = check_options, .declare = declare_resnet,
};

/* --depth is accepted and ignored: 2 blocks a stage */
const st_model_builder st_model_resnet18 = {
    .name = "resnet18", .reads = ST_MODEL_READS_IMAGES,
    .options = ST_MODEL_OPT_WIDTH | ST_MODEL_OPT_ACTIVATION,
    .defaults = defaults, .check_options = check_options, .declare = declare_resnet18,
};

/*
 * nn/models/vit.c — a vision transformer: an image as a sequence of
 * patches through pre-norm blocks (gpt's, attention not causal), no
 * dropout:
 *
 *   patches: the image's N = (H / P) (W / P) patches of P x P   (B N, C P P)
 *   e = patch(patches)                       linear C P P -> D  (B N, D)
 *   h0 = [cls,] e + pos                      T = N (+ 1)        (B T, D)
 *   block g < depth (a layer group, nn/transformer_block.c):
 *     h' = h + proj(attn(qkv(LN1(h))))       every token sees every token
 *     h_{g+1} = h' + fc2(gelu(fc1(LN2(h'))))
 *   z = pool(LN(h_depth))                    the class token, or the mean
 *                                            over tokens (--pool)  (B, D)
 *   logits = head(z)                                                (B, classes)
 *
 * The token tensors have T rows a sample (st_graph_tokens); the pooled
 * vector and the logits one, so the loss is a sample's, as for any
 * classifier.  Units are gpt's: block g is layer group g, its heads width
 * layer 2g, its MLP neurons width layer 2g + 1; the patch map, positions,
 * final norm and head are held by every subnetwork.  Width D = H heads of
 * D / H; F = hidden, 4 D unless --hidden says otherwise.
 */
#include <stdio.h>

#include "nn/transformer_block.h"

static st_status declare(st_model *m)
{
    const st_model_config *c = &m->cfg;
    const int64_t D = c->width, F = c->hidden > 0 ? c->hidden : 4 * (int64_t)c->width;
    const int64_t P = c->patch, K = (int64_t)c->in_channels * P * P;
    const int64_t N = P > 0 ? (c->in_height / P) * (c->in_width / P) : 0;
    const int cls = c->pool == ST_POOL_CLS;
    const int64_t T = N + cls;
    st_layer *l;
    if (N < 1)
        return st_fail(ST_ERR_INVALID, "vit: patches of %lld do not fit %d x %d images",
                       (long long)P, c->in_height, c->in_width);
    /* a row per patch */
    st_graph_tokens(m, N);
    const int pt = st_graph_tensor(m, K, ST_W_FULL), e = st_graph_tensor(m, D, ST_W_FULL);
    const int de = st_graph_tensor(m, D, ST_W_FULL);
    int ok = pt >= 0 && e >= 0 && de >= 0;
    if (ok && (l = st_graph_add(m, &st_layer_patches, "patches", ST_T_INPUT, pt, ST_T_NONE,
                                ST_T_NONE)))
        l->kernel = (int)P;
    ok = ok && l && st_graph_linear(m, "patch", pt, e, ST_T_NONE, de, K, D);
    /* a row per token */
    st_graph_tokens(m, T);
    const int h0 = st_graph_tensor(m, D, ST_W_FULL);
    const int dh = st_graph_tensor(m, D, ST_W_FULL), dn = st_graph_tensor(m, D, ST_W_FULL);
    const int dtmp = st_graph_tensor(m, D, ST_W_FULL);
    const int dqkv = st_graph_tensor_widest_of(m, D, 3), dout = st_graph_tensor_widest_of(m, D, 1);
    const int da = st_graph_tensor_widest_of(m, F, 1), dz = st_graph_tensor_widest_of(m, F, 1);
    ok = ok && h0 >= 0 && dh >= 0 && dn >= 0 && dtmp >= 0 && dqkv >= 0 && dout >= 0 &&
         da >= 0 && dz >= 0;
    if (ok && (l = st_graph_add(m, &st_layer_positions, "tokens", e, h0, de, dh))) {
        l->in = l->out = D;
        l->tokens = T;
        l->class_token = cls;
    }
    ok = ok && l;
    const st_block_grads d = { { dh, dtmp, dn, da, dz }, dqkv, dout };
    const st_block_shape shape = { D, F, c->heads, c->activation, 1 };
    int h = h0;
    for (int g = 0; ok && g < c->depth; g++)
        ok = (h = st_graph_transformer_block(m, g, h, &shape, &d)) >= 0;
    const int nf = st_graph_tensor(m, D, ST_W_FULL);
    /* going backward the final norm writes dh: it starts the accumulation
     * that every block's residual layer then adds to */
    ok = ok && nf >= 0 && st_graph_add(m, &st_layer_layernorm, "final_ln", h, nf, dh, dn);
    /* a row per sample */
    st_graph_tokens(m, 0);
    const int z = st_graph_tensor(m, D, ST_W_FULL), dzp = st_graph_tensor(m, D, ST_W_FULL);
    ok = ok && z >= 0 && dzp >= 0;
    if (ok && (l = st_graph_add(m, &st_layer_token_pool, "pool", nf, z, dn, dzp))) {
        l->in = l->out = D;
        l->tokens = T;
        l->class_token = cls;
    }
    ok = ok && l && st_graph_linear(m, "head", z, ST_T_LOGITS, dzp, ST_T_DLOGITS, D,
                                    c->n_classes);
    if (ok)
        return ST_OK;
    return st_fail(ST_ERR_NOMEM, "out of memory declaring the vit model");
}

/* 4 x 4 patches (they tile 28 x 28 and 32 x 32 images), 4 heads. */
static void defaults(st_model_config *c, unsigned given)
{
    if (!(given & ST_MODEL_OPT_HEADS))
        c->heads = 4;
    if (!(given & ST_MODEL_OPT_PATCH))
        c->patch = 4;
}

static st_status check_options(const st_model_config *c, unsigned given)
{
    (void)given;
    if (c->width % c->heads)
        return st_fail(ST_ERR_INVALID, "--heads %d does not divide --width %d", c->heads,
                       c->width);
    return ST_OK;
}

/* The image is known once the data is: its sides must be whole patches. */
static st_status check(const st_model_config *c)
{
    if (c->patch < 1)
        return st_fail(ST_ERR_INVALID, "--model vit needs a patch side (--patch P), got %d",
                       c->patch);
    if (c->in_channels && (c->in_height % c->patch || c->in_width % c->patch))
        return st_fail(ST_ERR_INVALID, "--patch %d does not divide the %d x %d images (a "
                       "patch side must divide both)", c->patch, c->in_height, c->in_width);
    return ST_OK;
}

static void describe(const st_model_config *c, char *out, size_t n)
{
    snprintf(out, n, " heads %d patch %d pool %s hidden %d", c->heads, c->patch,
             st_token_pool_name(c->pool), c->hidden ? c->hidden : 4 * c->width);
}

const st_model_builder st_model_vit = {
    .name = "vit",
    .help = "vit: a vision transformer, patches of --patch P through pre-norm blocks "
            "(non-causal attention, GELU MLP of 4 x width), images",
    .reads = ST_MODEL_READS_IMAGES,
    .options = ST_MODEL_OPT_DEPTH | ST_MODEL_OPT_WIDTH | ST_MODEL_OPT_HIDDEN |
               ST_MODEL_OPT_ACTIVATION | ST_MODEL_OPT_HEADS | ST_MODEL_OPT_PATCH |
               ST_MODEL_OPT_POOL,
    .defaults = defaults, .check_options = check_options, .check = check,
    .describe = describe, .declare = declare,
};

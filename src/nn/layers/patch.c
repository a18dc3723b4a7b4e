/*
 * nn/layers/patch.c — an image cut into its patches, a row per patch (a
 * ViT's tokens before their linear map, models/vit.c):
 *
 *   x     (B, C, H, W)            NCHW, the model's input
 *   y     (B x N, C P P)          N = (H / P) (W / P) patches of P x P, in
 *                                 row-major order over the grid; a patch's
 *                                 row runs over (c, i, j), PyTorch's order
 *                                 of a conv weight (D, C, P, P) flattened
 *
 * So the linear map that follows, (D, C P P), is PyTorch's Conv2d(C, D, P,
 * stride P) reshaped.  The layer has no parameters and no backward: it
 * reads the model's input, whose gradient nothing needs.
 */
#include <string.h>

#include "nn/graph.h"

/* For every patch row r, its element k: the input element it copies. */
static int64_t source(const struct st_patches *p, int64_t r, int64_t k)
{
    const int64_t P = p->patch, gw = p->width / P, n = r % p->n_patches, b = r / p->n_patches;
    const int64_t c = k / (P * P), i = k / P % P, j = k % P;
    const int64_t y = n / gw * P + i, x = n % gw * P + j;
    return ((b * p->channels + c) * p->height + y) * p->width + x;
}

static st_status patch_build(st_model *m, st_layer *l)
{
    const st_tensor *t = st_graph_tensor_info(m, l->x);
    const int64_t P = l->kernel;
    if (P < 1 || t->h % P || t->w % P)
        return st_fail(ST_ERR_INVALID, "%s: patches of %lld do not tile %lld x %lld images",
                       l->name, (long long)P, (long long)t->h, (long long)t->w);
    l->u.patches = (struct st_patches){
        .batch = m->batch, .channels = t->channels, .height = t->h, .width = t->w, .patch = P,
        .n_patches = (t->h / P) * (t->w / P), .x = st_graph_data(m, l->x),
        .y = st_graph_data(m, l->y),
    };
    if (l->dx != ST_T_NONE)
        return st_fail(ST_ERR_INVALID, "%s: reads the model's input and passes no gradient on",
                       l->name);
    if (st_graph_cols(m, l->y) != t->channels * P * P ||
        st_graph_rows(m, l->y) != m->batch * l->u.patches.n_patches)
        return st_fail(ST_ERR_INVALID, "%s: writes a row of %lld per patch", l->name,
                       (long long)(t->channels * P * P));
    return ST_OK;
}

static st_status patch_forward(const st_nn_ctx *ctx, const st_layer *l, st_phase phase)
{
    const struct st_patches *p = &l->u.patches;
    const int64_t K = p->channels * p->patch * p->patch;
    for (int64_t r = 0; r < p->batch * p->n_patches; r++)
        for (int64_t k = 0; k < K; k++)
            p->y[r * K + k] = p->x[source(p, r, k)];
    return ST_OK;
}

const st_layer_kind st_layer_patches = {
    .name = "patches", .build = patch_build, .forward = patch_forward,
};

/*
 * nn/layers/embedding.c — token and learned position embeddings of a
 * sequence model.
 *
 *   x     (B x T, 1)  token ids (bytes), stored as floats (exact below 2^24)
 *   tok   (V, D)      a row per token id           "<name>.token"
 *   pos   (T, D)      a row per position           "<name>.position"
 *   y     (B x T, D)  y[b, t] = tok[x[b, t]] + pos[t]
 *
 * oneDNN 2.6 has no gather primitive, so both passes are loops; they are
 * B T D adds each way, against the step's O(B T D^2) matrix products.
 * The backward scatter-adds dy into the token rows the batch used and sums
 * it over the batch for the positions: both in row order, so the sums are
 * the same on every run (no atomics, no threads racing on a row).
 * Neither is a width unit: the residual stream is held whole by every
 * subnetwork.
 */
#include <stdio.h>
#include <string.h>

#include "nn/graph.h"

static st_status embed_layout(st_model *m, st_layer *l)
{
    const int64_t V = m->cfg.n_classes, T = m->cfg.context, D = l->out;
    /* U(-1/sqrt(D), 1/sqrt(D)): the scale of the linear layers' rows */
    const st_seg_map tok = { .full_rows = V, .full_cols = D, .n_rows = V, .n_cols = D,
                             .fan_in = D };
    const st_seg_map pos = { .full_rows = T, .full_cols = D, .n_rows = T, .n_cols = D,
                             .fan_in = D };
    char name[48];
    snprintf(name, sizeof name, "%s.token", l->name);
    ST_TRY(st_graph_add_segment(m, name, 1, tok, &l->seg[0]));
    snprintf(name, sizeof name, "%s.position", l->name);
    return st_graph_add_segment(m, name, 1, pos, &l->seg[1]);
}

static st_status embed_build(st_model *m, st_layer *l)
{
    struct st_embedding *e = &l->u.embed;
    if (m->cfg.context < 1)
        return st_fail(ST_ERR_INVALID, "%s: an embedding needs a sequence model (a context)",
                       l->name);
    *e = (struct st_embedding){
        .batch = m->batch, .tokens = m->cfg.context, .vocab = m->cfg.n_classes,
        .width = st_graph_cols(m, l->y),
        .ids = st_graph_data(m, l->x), .tok = st_graph_seg_params(m, l->seg[0]),
        .pos = st_graph_seg_params(m, l->seg[1]), .y = st_graph_data(m, l->y),
        .dy = st_graph_data(m, l->dy), .dtok = st_graph_seg_grads(m, l->seg[0]),
        .dpos = st_graph_seg_grads(m, l->seg[1]),
    };
    if (st_graph_cols(m, l->x) != 1 || e->width != l->out)
        return st_fail(ST_ERR_INVALID, "%s: reads one id per token and writes the whole "
                       "width", l->name);
    return ST_OK;
}

static st_status embed_forward(const st_nn_ctx *ctx, const st_layer *l, st_phase phase)
{
    const struct st_embedding *e = &l->u.embed;
    const int64_t D = e->width;
    for (int64_t r = 0; r < e->batch * e->tokens; r++) {
        const float id = e->ids[r];
        if (!(id >= 0.0f && id < (float)e->vocab) || id != (float)(int64_t)id)
            return st_fail(ST_ERR_INVALID, "%s: token id %g of row %lld is not in [0, %lld)",
                           l->name, (double)id, (long long)r, (long long)e->vocab);
        const float *a = e->tok + (int64_t)id * D, *p = e->pos + (r % e->tokens) * D;
        float *y = e->y + r * D;
        for (int64_t k = 0; k < D; k++)
            y[k] = a[k] + p[k];
    }
    return ST_OK;
}

static st_status embed_backward(const st_nn_ctx *ctx, const st_layer *l)
{
    const struct st_embedding *e = &l->u.embed;
    const int64_t D = e->width;
    if (e->dtok)
        memset(e->dtok, 0, (size_t)(e->vocab * D) * sizeof *e->dtok);
    if (e->dpos)
        memset(e->dpos, 0, (size_t)(e->tokens * D) * sizeof *e->dpos);
    for (int64_t r = 0; r < e->batch * e->tokens; r++) {
        const float *dy = e->dy + r * D;
        float *a = e->dtok ? e->dtok + (int64_t)e->ids[r] * D : NULL;
        float *p = e->dpos ? e->dpos + (r % e->tokens) * D : NULL;
        for (int64_t k = 0; a && k < D; k++)
            a[k] += dy[k];
        for (int64_t k = 0; p && k < D; k++)
            p[k] += dy[k];
    }
    return ST_OK;
}

/* The backward reads the ids (x), not the vectors it wrote (y). */
static unsigned embed_backward_reads(const st_model *m, const st_layer *l)
{
    return ST_READS_X;
}

const st_layer_kind st_layer_embedding = {
    .name = "embedding", .layout = embed_layout, .build = embed_build,
    .forward = embed_forward, .backward = embed_backward,
    .backward_reads = embed_backward_reads,
};

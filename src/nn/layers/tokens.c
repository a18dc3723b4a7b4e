/*
 * nn/layers/tokens.c — the token rows of a ViT (models/vit.c) around its
 * encoder: learned positions (and a class token) in, a row per sample out.
 *
 * positions, N patch rows per sample in, T = N + c rows out (c = 1 with a
 * class token, l->class_token):
 *   x     (B x N, D)
 *   cls   (1, D)          "<name>.class" (with a class token only)
 *   pos   (T, D)          "<name>.position"
 *   y     (B x T, D)      y[b, 0] = cls + pos[0] (class token), then
 *                         y[b, c + n] = x[b, n] + pos[c + n]
 * pool, T rows per sample in, one out:
 *   y[b] = x[b, 0]                    (class token)
 *   y[b] = (1 / T) sum_t x[b, t]      (mean)
 *
 * Loops, B T D adds each way against the encoder's O(B T D^2) products;
 * the backward's sums over the batch run in row order, so they are the
 * same on every run.  Neither is a width unit: the stream is held whole
 * by every subnetwork.
 */
#include <stdio.h>
#include <string.h>

#include "nn/graph.h"

/* ------------------------------------------------------------ positions */

static st_status positions_layout(st_model *m, st_layer *l)
{
    const int64_t D = l->out, T = l->tokens;
    char name[48];
    l->seg[0] = (size_t)-1;
    if (l->class_token) {
        /* U(-1/sqrt(D), 1/sqrt(D)): the scale of the linear layers' rows */
        const st_seg_map cls = { .full_rows = 1, .full_cols = D, .n_rows = 1, .n_cols = D,
                                 .fan_in = D };
        snprintf(name, sizeof name, "%s.class", l->name);
        ST_TRY(st_graph_add_segment(m, name, 1, cls, &l->seg[0]));
    }
    const st_seg_map pos = { .full_rows = T, .full_cols = D, .n_rows = T, .n_cols = D,
                             .fan_in = D };
    snprintf(name, sizeof name, "%s.position", l->name);
    return st_graph_add_segment(m, name, 1, pos, &l->seg[1]);
}

static st_status tokens_io(st_model *m, st_layer *l, int64_t in_rows, int64_t out_rows)
{
    l->u.tokens = (struct st_tokens){
        .batch = m->batch, .in_rows = in_rows, .out_rows = out_rows, .width = l->out,
        .class_token = l->class_token, .x = st_graph_data(m, l->x), .y = st_graph_data(m, l->y),
        .dx = st_graph_data(m, l->dx), .dy = st_graph_data(m, l->dy),
    };
    if (st_graph_rows(m, l->x) != m->batch * in_rows ||
        st_graph_rows(m, l->y) != m->batch * out_rows || st_graph_cols(m, l->x) != l->out ||
        st_graph_cols(m, l->y) != l->out)
        return st_fail(ST_ERR_INVALID, "%s: reads %lld rows of %lld a sample and writes %lld",
                       l->name, (long long)in_rows, (long long)l->out, (long long)out_rows);
    return ST_OK;
}

static st_status positions_build(st_model *m, st_layer *l)
{
    const int c = l->class_token != 0;
    ST_TRY(tokens_io(m, l, l->tokens - c, l->tokens));
    struct st_tokens *t = &l->u.tokens;
    if (c) {
        t->cls = st_graph_seg_params(m, l->seg[0]);
        t->dcls = st_graph_seg_grads(m, l->seg[0]);
    }
    t->pos = st_graph_seg_params(m, l->seg[1]);
    t->dpos = st_graph_seg_grads(m, l->seg[1]);
    return ST_OK;
}

static void add_rows(float *restrict y, const float *restrict a, const float *restrict b,
                     int64_t n)
{
    for (int64_t k = 0; k < n; k++)
        y[k] = a[k] + b[k];
}

static void acc_rows(float *restrict y, const float *restrict a, int64_t n)
{
    for (int64_t k = 0; k < n; k++)
        y[k] += a[k];
}

static st_status positions_forward(const st_nn_ctx *ctx, const st_layer *l, st_phase phase)
{
    const struct st_tokens *t = &l->u.tokens;
    const int64_t D = t->width, T = t->out_rows, N = t->in_rows, c = t->class_token != 0;
    for (int64_t b = 0; b < t->batch; b++) {
        float *y = t->y + b * T * D;
        if (c)
            add_rows(y, t->cls, t->pos, D);
        for (int64_t n = 0; n < N; n++)
            add_rows(y + (c + n) * D, t->x + (b * N + n) * D, t->pos + (c + n) * D, D);
    }
    return ST_OK;
}

static st_status positions_backward(const st_nn_ctx *ctx, const st_layer *l)
{
    const struct st_tokens *t = &l->u.tokens;
    const int64_t D = t->width, T = t->out_rows, N = t->in_rows, c = t->class_token != 0;
    if (t->dcls)
        memset(t->dcls, 0, (size_t)D * sizeof *t->dcls);
    if (t->dpos)
        memset(t->dpos, 0, (size_t)(T * D) * sizeof *t->dpos);
    for (int64_t b = 0; b < t->batch; b++) {
        const float *dy = t->dy + b * T * D;
        if (t->dcls)
            acc_rows(t->dcls, dy, D);
        for (int64_t r = 0; t->dpos && r < T; r++)
            acc_rows(t->dpos + r * D, dy + r * D, D);
        if (t->dx)
            memcpy(t->dx + b * N * D, dy + c * D, (size_t)(N * D) * sizeof *t->dx);
    }
    return ST_OK;
}

/* The backward reads dy only. */
static unsigned tokens_backward_reads(const st_model *m, const st_layer *l)
{
    return 0u;
}

const st_layer_kind st_layer_positions = {
    .name = "positions", .layout = positions_layout, .build = positions_build,
    .forward = positions_forward, .backward = positions_backward,
    .backward_reads = tokens_backward_reads,
};

/* ------------------------------------------------------------ pool */

static st_status pool_build(st_model *m, st_layer *l)
{
    return tokens_io(m, l, l->tokens, 1);
}

static st_status pool_forward(const st_nn_ctx *ctx, const st_layer *l, st_phase phase)
{
    const struct st_tokens *t = &l->u.tokens;
    const int64_t D = t->width, T = t->in_rows;
    const float inv = 1.0f / (float)T;
    for (int64_t b = 0; b < t->batch; b++) {
        const float *x = t->x + b * T * D;
        float *y = t->y + b * D;
        memcpy(y, x, (size_t)D * sizeof *y);
        if (t->class_token)
            continue;
        for (int64_t r = 1; r < T; r++)
            acc_rows(y, x + r * D, D);
        for (int64_t k = 0; k < D; k++)
            y[k] *= inv;
    }
    return ST_OK;
}

static st_status pool_backward(const st_nn_ctx *ctx, const st_layer *l)
{
    const struct st_tokens *t = &l->u.tokens;
    const int64_t D = t->width, T = t->in_rows;
    const float inv = 1.0f / (float)T;
    for (int64_t b = 0; t->dx && b < t->batch; b++) {
        const float *dy = t->dy + b * D;
        float *dx = t->dx + b * T * D;
        if (t->class_token) {
            memcpy(dx, dy, (size_t)D * sizeof *dx);
            memset(dx + D, 0, (size_t)((T - 1) * D) * sizeof *dx);
            continue;
        }
        for (int64_t r = 0; r < T; r++)
            for (int64_t k = 0; k < D; k++)
                dx[r * D + k] = dy[k] * inv;
    }
    return ST_OK;
}

const st_layer_kind st_layer_token_pool = {
    .name = "token_pool", .build = pool_build, .forward = pool_forward,
    .backward = pool_backward, .backward_reads = tokens_backward_reads,
};

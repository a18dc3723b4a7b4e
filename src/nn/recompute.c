/*
 * nn/recompute.c — activation recomputation (cfg.recompute, nn/graph.h):
 * which of a model's activations the training forward keeps, where the
 * others live, and the forward the backward runs again.
 *
 * A block is a run of layers of one recomputation block (a layer group,
 * or what st_graph_block declares) that this instance keeps.  A tensor
 * is internal to block k when only block k's forwards touch it, the
 * first of them writing it, and it is nobody's gradient nor the model's
 * output.  Internal tensors and the block's layers' own saved buffers
 * (norm statistics, bf16 copies, attention probabilities, blocked copies)
 * are lane k of region 0: every block's start at the region's start, so
 * the region is one block's worth.  BLOCKS keeps the rest; before block
 * k's backward its layers run forward again from its kept input.  ALL
 * also puts the boundary that block k writes and block k + 1 reads (or
 * the layers after the last block) in lane K + k, of region 1 + k mod 2
 * (a block's input and output are in different regions), and
 * before block k's backward runs blocks 0..k again from block 0's input.
 *
 * The regions are sized by a build that counts each lane's bytes
 * (st_model_activation_layout), then the model is built with them.  The
 * recomputed forward runs the same primitives on the same inputs, so the
 * saved buffers hold the same bits; ST_PHASE_RECOMPUTE keeps batch norm's
 * running statistics as the first forward left them.
 */
#include <stdlib.h>
#include <string.h>

#include "nn/graph.h"

/* The kept blocks as runs of layers, in order. */
static st_status find_blocks(st_model *m)
{
    m->layer_block = malloc((size_t)(m->n_layers ? m->n_layers : 1) * sizeof *m->layer_block);
    m->block_lo = malloc((size_t)(m->n_layers ? m->n_layers : 1) * sizeof *m->block_lo);
    m->block_hi = malloc((size_t)(m->n_layers ? m->n_layers : 1) * sizeof *m->block_hi);
    if (!m->layer_block || !m->block_lo || !m->block_hi)
        return st_fail(ST_ERR_NOMEM, "out of memory planning recomputation");
    int last = -1;
    m->n_blocks = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const st_layer *l = &m->layers[i];
        m->layer_block[i] = -1;
        if (l->dropped)
            continue;
        if (l->block >= 0) {
            if (m->n_blocks == 0 || l->block != last) {
                m->block_lo[m->n_blocks] = i;
                m->n_blocks++;
            }
            m->block_hi[m->n_blocks - 1] = i;
            m->layer_block[i] = m->n_blocks - 1;
        }
        last = l->block;
    }
    return ST_OK;
}

/* Where tensor t's forward touches are: *first the first layer (-1:
 * none), *written 1 if that layer writes it without reading it, *lo and
 * *hi the least and greatest kept block of its touches (-1: a layer in
 * no block), *after 1 if a layer in no block touches it after the last
 * block's end, *grad 1 if a layer touches it as a gradient. */
typedef struct touches {
    int first, written, lo, hi, outside, after, grad;
} touches;

static touches touches_of(const st_model *m, int t)
{
    touches w = { -1, 0, -1, -1, 0, 0, 0 };
    const int end = m->n_blocks ? m->block_hi[m->n_blocks - 1] : -1;
    int started = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const st_layer *l = &m->layers[i];
        if (l->dropped)
            continue;
        /* t >= 0: a missing tensor (-1) resolves to -1 */
        if (st_graph_resolve(m, l->dx) == t || st_graph_resolve(m, l->dy) == t)
            w.grad = 1;
        const int x = st_graph_resolve(m, l->x) == t, y = st_graph_resolve(m, l->y) == t;
        const int r = st_graph_resolve(m, l->residual) == t;
        if (!x && !y && !r)
            continue;
        if (w.first < 0) {
            w.first = i;
            w.written = y && !x && !r;
        }
        const int b = m->layer_block[i];
        if (b < 0) {
            w.outside = 1;
            w.after |= i > end;
            continue;
        }
        if (!started || b < w.lo)
            w.lo = b;
        if (!started || b > w.hi)
            w.hi = b;
        started = 1;
    }
    return w;
}

/* The last layer this instance runs: its output is read by the loss. */
static int output_tensor(const st_model *m)
{
    for (int i = m->n_layers - 1; i >= 0; i--)
        if (!m->layers[i].dropped)
            return m->layers[i].y >= 0 ? st_graph_resolve(m, m->layers[i].y) : ST_T_NONE;
    return ST_T_NONE;
}

int st_recompute_one_block(const st_model *m, int t)
{
    if (m->cfg.recompute == ST_RECOMPUTE_NONE || m->n_blocks == 0)
        return 1;
    const touches w = touches_of(m, t);
    return w.lo < 0 ? 1 : !w.outside && w.lo == w.hi;
}

st_status st_recompute_plan(st_model *m)
{
    m->n_blocks = 0;
    if (m->cfg.recompute == ST_RECOMPUTE_NONE || !m->arena)
        return ST_OK;
    ST_TRY(find_blocks(m));
    const int K = m->n_blocks, lanes = 2 * K;
    m->tensor_lane = malloc((size_t)(m->n_tensors ? m->n_tensors : 1) * sizeof *m->tensor_lane);
    m->lane_region = malloc((size_t)lanes * sizeof *m->lane_region);
    m->lane_used = calloc((size_t)lanes * ST_MEM_KIND_COUNT, sizeof *m->lane_used);
    if (!m->tensor_lane || !m->lane_region || !m->lane_used)
        return st_fail(ST_ERR_NOMEM, "out of memory planning recomputation");
    for (int k = 0; k < lanes; k++)
        m->lane_region[k] = k < K ? 0 : 1 + ((k - K) & 1);
    const int out = output_tensor(m);
    for (int t = 0; t < m->n_tensors; t++) {
        m->tensor_lane[t] = -1;
        if (t < ST_T_FIRST_FREE || st_graph_resolve(m, t) != t || t == out)
            continue;
        const touches w = touches_of(m, t);
        if (w.first < 0 || !w.written || w.grad || w.lo < 0 || m->layer_block[w.first] != w.lo)
            continue;
        if (!w.outside && w.lo == w.hi)
            m->tensor_lane[t] = w.lo;
        else if (m->cfg.recompute == ST_RECOMPUTE_ALL &&
                 ((!w.outside && w.hi == w.lo + 1) ||
                  (w.hi == w.lo && w.lo == K - 1 && w.after)))
            m->tensor_lane[t] = K + w.lo;
    }
    memset(&m->lanes, 0, sizeof m->lanes);
    m->lanes.open = -1;
    m->lanes.n = lanes;
    m->lanes.region = m->lane_region;
    m->lanes.used = m->lane_used;
    if (m->regions_known)
        for (int r = 0; r < ST_ARENA_REGIONS; r++)
            for (int k = 0; k < ST_MEM_KIND_COUNT; k++)
                if (m->region_size[r][k]) {
                    void *p;
                    ST_TRY(st_arena_alloc(m->arena, (st_mem_kind)k, m->region_size[r][k], &p));
                    m->lanes.base[r][k] = p;
                    m->lanes.size[r][k] = m->region_size[r][k];
                }
    m->arena->lanes = &m->lanes;
    return ST_OK;
}

void st_recompute_open_tensor(st_model *m, int t)
{
    if (m->n_blocks)
        m->lanes.open = m->tensor_lane[t];
}

void st_recompute_open_layer(st_model *m, int i)
{
    if (m->n_blocks)
        m->lanes.open = m->layer_block[i];
}

void st_recompute_close(st_model *m)
{
    if (m->n_blocks)
        m->lanes.open = -1;
}

void st_recompute_done(st_model *m)
{
    if (m->arena && m->arena->lanes == &m->lanes)
        m->arena->lanes = NULL;
}

/* Whether any layer of block k runs a backward. */
static int block_backward(const st_model *m, int k)
{
    for (int i = m->block_lo[k]; i <= m->block_hi[k]; i++)
        if (!m->layers[i].dropped && m->layers[i].backward)
            return 1;
    return 0;
}

st_status st_recompute_before(const st_model *m, int i)
{
    if (!m->n_blocks)
        return ST_OK;
    const int k = m->layer_block[i];
    if (k < 0 || m->block_hi[k] != i || !block_backward(m, k))
        return ST_OK;
    const int lo = m->cfg.recompute == ST_RECOMPUTE_ALL ? m->block_lo[0] : m->block_lo[k];
    for (int j = lo; j <= i; j++) {
        const st_layer *l = &m->layers[j];
        if (!l->dropped && l->kind->forward)
            ST_TRY(l->kind->forward(&m->ctx, l, ST_PHASE_RECOMPUTE));
    }
    return ST_OK;
}

double st_recompute_flops(const st_model *m)
{
    double f = 0.0;
    for (int k = 0; k < m->n_blocks; k++) {
        if (!block_backward(m, k))
            continue;
        const int lo = m->cfg.recompute == ST_RECOMPUTE_ALL ? m->block_lo[0] : m->block_lo[k];
        for (int j = lo; j <= m->block_hi[k]; j++) {
            const st_layer *l = &m->layers[j];
            if (!l->dropped && l->kind->forward && l->kind->flops)
                f += l->kind->flops(l) / 3.0;
        }
    }
    return f;
}

void st_recompute_costs(const st_model *m, st_cost_sink *s)
{
    for (int k = 0; k < m->n_blocks; k++) {
        if (!block_backward(m, k))
            continue;
        const int lo = m->cfg.recompute == ST_RECOMPUTE_ALL ? m->block_lo[0] : m->block_lo[k];
        for (int j = lo; j <= m->block_hi[k]; j++) {
            const st_layer *l = &m->layers[j];
            if (!l->dropped && l->kind->forward)
                st_cost_layer(m, l, 1, s);
        }
    }
}

void st_recompute_free(st_model *m)
{
    free(m->layer_block);
    free(m->block_lo);
    free(m->block_hi);
    free(m->tensor_lane);
    free(m->lane_region);
    free(m->lane_used);
    m->layer_block = m->block_lo = m->block_hi = m->tensor_lane = m->lane_region = NULL;
    m->lane_used = NULL;
    m->n_blocks = 0;
}

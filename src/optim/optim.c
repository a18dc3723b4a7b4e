/*
 * optim/optim.c — SGD with momentum and AdamW over flat parameter ranges.
 *
 * The update loops are single passes over p, g and the state, written so
 * that the compiler vectorises them (restrict, `omp simd`, no branches in
 * the loop, -fno-math-errno from configure so that sqrtf is an instruction):
 * for a large model the optimizer streams 4-5 arrays of P floats per step
 * and is bound by memory bandwidth and by the divide and square root of
 * AdamW.  They are compiled also for AVX2 and AVX-512 (chosen at load
 * time, below) because at SSE2 width the divide and square root, not
 * memory, limit AdamW (doc/benchmarks.md has the timings).  A bf16 state
 * (st_moments) has its own loops, state16.c; this file dispatches.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/bf16.h"
#include "core/blocked.h"
#include "core/enum_table.h"
#include "core/error.h"
#include "core/simd.h"
#include "optim/optim_impl.h"
#include "optim/state16.h"

st_optim_config st_optim_config_default(void)
{
    st_optim_config c = {
        .kind = ST_OPT_ADAMW, .lr = 1e-3f, .momentum = 0.9f, .weight_decay = 0.01f,
        .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .moments = ST_MOMENTS_FP32,
    };
    return c;
}

st_status st_optim_config_check(const st_optim_config *c)
{
    if (c->kind != ST_OPT_SGD && c->kind != ST_OPT_ADAMW)
        return st_fail(ST_ERR_INVALID, "unknown optimizer %d (allowed: sgd, adamw)", (int)c->kind);
    if (!(c->lr > 0.0f) || !isfinite(c->lr))
        return st_fail(ST_ERR_INVALID, "learning rate must be a positive number, got %g", c->lr);
    if (!(c->momentum >= 0.0f && c->momentum < 1.0f))
        return st_fail(ST_ERR_INVALID, "momentum must be in [0, 1), got %g", c->momentum);
    if (!(c->weight_decay >= 0.0f) || !isfinite(c->weight_decay))
        return st_fail(ST_ERR_INVALID, "weight decay must be >= 0, got %g", c->weight_decay);
    if (!(c->beta1 >= 0.0f && c->beta1 < 1.0f) || !(c->beta2 >= 0.0f && c->beta2 < 1.0f))
        return st_fail(ST_ERR_INVALID, "Adam betas must be in [0, 1), got %g and %g",
                       c->beta1, c->beta2);
    if (!(c->eps > 0.0f))
        return st_fail(ST_ERR_INVALID, "Adam epsilon must be > 0, got %g", c->eps);
    if (c->moments != ST_MOMENTS_FP32 && c->moments != ST_MOMENTS_BF16 &&
        c->moments != ST_MOMENTS_BF16_SR)
        return st_fail(ST_ERR_INVALID, "unknown optimizer moments %d (allowed: fp32, bf16, "
                       "bf16-sr)", (int)c->moments);
    if (c->master != ST_MASTER_FP32 && c->master != ST_MASTER_BF16_SR)
        return st_fail(ST_ERR_INVALID, "unknown master weights %d (allowed: fp32, bf16-sr)",
                       (int)c->master);
    if (c->master == ST_MASTER_BF16_SR && c->kind != ST_OPT_ADAMW)
        return st_fail(ST_ERR_INVALID, "a bf16 master (--master-weights bf16-sr) is updated by "
                       "AdamW only, not by --optimizer %s", st_optimizer_name(c->kind));
    return ST_OK;
}

static const st_enum_entry optimizer_entries[] = {
    { "sgd", ST_OPT_SGD },
    { "adamw", ST_OPT_ADAMW },
};
static const st_enum_table optimizers = ST_ENUM_TABLE("optimizer", optimizer_entries);

const char *st_optimizer_name(st_optimizer_kind kind)
{
    return st_enum_name(&optimizers, (int)kind);
}

st_status st_optimizer_parse(const char *name, st_optimizer_kind *out)
{
    int v;
    ST_TRY(st_enum_parse(&optimizers, name, &v));
    *out = (st_optimizer_kind)v;
    return ST_OK;
}

static const st_enum_entry moments_entries[] = {
    { "fp32", ST_MOMENTS_FP32 },
    { "bf16", ST_MOMENTS_BF16 },
    { "bf16-sr", ST_MOMENTS_BF16_SR },
};
static const st_enum_table moments_table = ST_ENUM_TABLE("optimizer moments", moments_entries);

const char *st_moments_name(st_moments m)
{
    return st_enum_name(&moments_table, (int)m);
}

st_status st_moments_parse(const char *name, st_moments *out)
{
    int v;
    ST_TRY(st_enum_parse(&moments_table, name, &v));
    *out = (st_moments)v;
    return ST_OK;
}

static const st_enum_entry master_entries[] = {
    { "fp32", ST_MASTER_FP32 },
    { "bf16-sr", ST_MASTER_BF16_SR },
};
static const st_enum_table master_table = ST_ENUM_TABLE("master weights", master_entries);

const char *st_master_name(st_master m)
{
    return st_enum_name(&master_table, (int)m);
}

st_status st_master_parse(const char *name, st_master *out)
{
    int v;
    ST_TRY(st_enum_parse(&master_table, name, &v));
    *out = (st_master)v;
    return ST_OK;
}

/* State vectors: AdamW's m and v, SGD's momentum buffer (none without). */
static int state_vectors(const st_optim_config *c)
{
    return c->kind == ST_OPT_ADAMW ? 2 : c->momentum > 0.0f;
}

int st_optim_bytes_per_param(const st_optim_config *c, int copy)
{
    const int state = c->moments == ST_MOMENTS_FP32 ? 4 : 2;
    if (c->master == ST_MASTER_BF16_SR && copy)   /* the copy is the master */
        return 4 + 2 * 2 + state_vectors(c) * 2 * state;
    return 4 + 2 * 4 + state_vectors(c) * 2 * state + 2 * copy;
}

st_status st_optim_init(st_optim *opt, const st_optim_config *cfg, size_t n, st_arena *arena)
{
    return st_optim_init_range(opt, cfg, 0, n, arena);
}

st_status st_optim_init_range(st_optim *opt, const st_optim_config *cfg, size_t begin,
                              size_t end, st_arena *arena)
{
    memset(opt, 0, sizeof *opt);
    ST_TRY(st_optim_config_check(cfg));
    if (end < begin)
        return st_fail(ST_ERR_INVALID, "optimizer range [%zu, %zu) is reversed", begin, end);
    size_t n = end - begin;
    opt->cfg = *cfg;
    opt->base = begin;
    opt->n = n;
    const int vectors = state_vectors(cfg);
    if (cfg->moments == ST_MOMENTS_FP32) {
        if (vectors >= 1)
            ST_TRY(st_arena_alloc_floats(arena, ST_MEM_OPTIMIZER, n, &opt->m));
        if (vectors == 2)
            ST_TRY(st_arena_alloc_floats(arena, ST_MEM_OPTIMIZER, n, &opt->v));
        return ST_OK;
    }
    /* zeroed by the arena, as the fp32 vectors are (bf16 zero is zero
     * bits); a sizing run's arena writes nothing, and nor may we */
    void *m16 = NULL, *v16 = NULL;
    if (vectors >= 1)
        ST_TRY(st_arena_alloc(arena, ST_MEM_OPTIMIZER, n * sizeof(uint16_t), &m16));
    if (vectors == 2)
        ST_TRY(st_arena_alloc(arena, ST_MEM_OPTIMIZER, n * sizeof(uint16_t), &v16));
    opt->m16 = m16;
    opt->v16 = v16;
    return ST_OK;
}

st_status st_optim_create(const st_optim_config *cfg, size_t begin, size_t end,
                          st_arena *arena, st_optim **out)
{
    *out = malloc(sizeof **out);
    if (!*out)
        return st_fail(ST_ERR_NOMEM, "out of memory creating an optimizer");
    st_status s = st_optim_init_range(*out, cfg, begin, end, arena);
    if (s != ST_OK) {
        free(*out);
        *out = NULL;
    }
    return s;
}

void st_optim_destroy(st_optim *opt)
{
    free(opt);
}

void st_optim_reset(st_optim *opt)
{
    if (opt->m)
        memset(opt->m, 0, opt->n * sizeof *opt->m);
    if (opt->v)
        memset(opt->v, 0, opt->n * sizeof *opt->v);
    if (opt->m16)
        memset(opt->m16, 0, opt->n * sizeof *opt->m16);
    if (opt->v16)
        memset(opt->v16, 0, opt->n * sizeof *opt->v16);
}

/* The hot loops below are cloned for wider vector units (core/simd.h). */

/* p, g, buf are (n) */
ST_VECTOR_CLONES
static void sgd_range(float *restrict p, const float *restrict g, float *restrict buf,
                      size_t n, float lr, float momentum, float wd)
{
    if (!buf) {
#pragma omp simd
        for (size_t i = 0; i < n; i++)
            p[i] -= lr * (g[i] + wd * p[i]);
        return;
    }
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float b = momentum * buf[i] + g[i] + wd * p[i];
        buf[i] = b;
        p[i] -= lr * b;
    }
}

/* p[i] = v and its bf16 copy h[i] = bf16(v), rounded as oneDNN rounds */
static inline void store_h(float *restrict p, uint16_t *restrict h, size_t i, float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    p[i] = v;
    h[i] = (uint16_t)(st_bf16_rne_bits(u) >> 16);
}

/* The same, writing h[i] = bf16(p[i]) as well (h: a weight copy; 16-bit
 * lanes: core/simd.h) */
ST_VECTOR_CLONES_BW
static void sgd_range_h(float *restrict p, const float *restrict g, float *restrict buf,
                        uint16_t *restrict h, size_t n, float lr, float momentum, float wd)
{
    if (!buf) {
#pragma omp simd
        for (size_t i = 0; i < n; i++) {
            float pi = p[i] - lr * (g[i] + wd * p[i]);
            store_h(p, h, i, pi);
        }
        return;
    }
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float b = momentum * buf[i] + g[i] + wd * p[i];
        buf[i] = b;
        float pi = p[i] - lr * b;
        store_h(p, h, i, pi);
    }
}

typedef st_adam_step adam_step;

/* Element i's moments updated in place; returns its new value (shrink:
 * the decoupled weight decay's factor, 1 where the segment does not
 * decay).  Inlined into both loops below. */
static inline float adamw_one(const float *restrict p, const float *restrict g,
                              float *restrict m, float *restrict v, size_t i,
                              const adam_step *a, float shrink)
{
    float mi = a->b1 * m[i] + (1.0f - a->b1) * g[i];
    float vi = a->b2 * v[i] + (1.0f - a->b2) * g[i] * g[i];
    m[i] = mi;
    v[i] = vi;
    return p[i] * shrink - a->lr * (mi * a->c1) / (sqrtf(vi * a->c2) + a->eps);
}

/* p, g, m, v are (n) */
ST_VECTOR_CLONES
static void adamw_range(float *restrict p, const float *restrict g, float *restrict m,
                        float *restrict v, size_t n, const adam_step *a, int decay)
{
    const float shrink = decay ? 1.0f - a->lr * a->wd : 1.0f;
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        p[i] = adamw_one(p, g, m, v, i, a, shrink);
}

/* p, g, m, v are (n); h[i] = bf16(p[i]) after the update.  One loop, not
 * a chunk updated and then rounded from L1: that is faster only while the
 * parameters fit in cache, and slower from memory, where one loop runs
 * the copy's stream alongside the other seven (doc/benchmarks.md). */
ST_VECTOR_CLONES_BW
static void adamw_range_h(float *restrict p, const float *restrict g, float *restrict m,
                          float *restrict v, uint16_t *restrict h, size_t n,
                          const adam_step *a, int decay)
{
    const float shrink = decay ? 1.0f - a->lr * a->wd : 1.0f;
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        store_h(p, h, i, adamw_one(p, g, m, v, i, a, shrink));
}

/* Elements [lo, hi) of the vector (at: lo's place in the state), h: their
 * bf16 copy or NULL; rnd: a bf16 state's rounding. */
static void update_piece(const st_optim *opt, float *params, const float *grads, size_t lo,
                         size_t hi, uint16_t *h, const adam_step *a, float wd, int decay,
                         st_state_rounding *rnd)
{
    const st_optim_config *c = &opt->cfg;
    size_t n = hi - lo, at = lo - opt->base;
    float *m = opt->m ? opt->m + at : NULL;
    if (h && c->master == ST_MASTER_BF16_SR) {   /* AdamW (st_optim_config_check) */
        rnd->first = lo;
        st_adamw_master16(grads + at, m, opt->v ? opt->v + at : NULL,
                          opt->m16 ? opt->m16 + at : NULL, opt->v16 ? opt->v16 + at : NULL, h,
                          n, a, decay ? 1.0f - a->lr * a->wd : 1.0f, rnd);
        return;
    }
    if (opt->m16) {   /* a bf16 state (SGD without momentum has none) */
        rnd->first = lo;
        if (c->kind == ST_OPT_SGD)
            st_sgd16(params + at, grads + at, opt->m16 + at, h, n, a->lr, c->momentum, wd, rnd);
        else
            st_adamw16(params + at, grads + at, opt->m16 + at, opt->v16 + at, h, n, a,
                       decay ? 1.0f - a->lr * a->wd : 1.0f, rnd);
        return;
    }
    if (c->kind == ST_OPT_SGD) {
        if (h)
            sgd_range_h(params + at, grads + at, m, h, n, a->lr, c->momentum, wd);
        else
            sgd_range(params + at, grads + at, m, n, a->lr, c->momentum, wd);
    } else if (h) {
        adamw_range_h(params + at, grads + at, m, opt->v + at, h, n, a, decay);
    } else {
        adamw_range(params + at, grads + at, m, opt->v + at, n, a, decay);
    }
}

/* Elements [lo, hi) inside b: updated, then packed into its copies a slab
 * at a time (st_blocked_slab_end), so that the packing reads the new
 * values from cache. */
static void update_blocked(const st_optim *opt, float *params, const float *grads, size_t lo,
                           size_t hi, const st_param_blocked *b, const adam_step *a, float wd,
                           int decay, st_state_rounding *rnd)
{
    for (size_t x = lo; x < hi;) {
        size_t y = st_blocked_slab_end(b, x);
        if (y > hi)
            y = hi;
        update_piece(opt, params, grads, x, y, NULL, a, wd, decay, rnd);
        st_blocked_pack(b, params + (x - opt->base), x, y);
        x = y;
    }
}

void st_optim_update(st_optim *opt, float *params, const float *grads,
                     const st_param_segment *segs, int n_segs,
                     size_t begin, size_t end, uint64_t t, float lr)
{
    st_optim_update_blocked(opt, params, grads, segs, n_segs, begin, end, t, lr, NULL, 0, NULL,
                            0);
}

void st_optim_update_copies(st_optim *opt, float *params, const float *grads,
                            const st_param_segment *segs, int n_segs, size_t begin,
                            size_t end, uint64_t t, float lr, const st_param_copy *copies,
                            int n_copies)
{
    st_optim_update_blocked(opt, params, grads, segs, n_segs, begin, end, t, lr, copies,
                            n_copies, NULL, 0);
}

void st_optim_update_blocked(st_optim *opt, float *params, const float *grads,
                             const st_param_segment *segs, int n_segs, size_t begin,
                             size_t end, uint64_t t, float lr, const st_param_copy *copies,
                             int n_copies, const st_param_blocked *blocked, int n_blocked)
{
    const st_optim_config *c = &opt->cfg;
    adam_step a = { lr, c->weight_decay, c->beta1, c->beta2, c->eps,
                    (float)(1.0 / (1.0 - pow(c->beta1, (double)t))),
                    (float)(1.0 / (1.0 - pow(c->beta2, (double)t))) };
    if (begin < opt->base)
        begin = opt->base;
    if (end > opt->base + opt->n)
        end = opt->base + opt->n;
    st_state_rounding rnd = { c->moments == ST_MOMENTS_BF16_SR, 0, 0, 0 };
    if (rnd.sr)
        rnd.key = st_state_rounding_key(c->seed, t);
    if (c->master == ST_MASTER_BF16_SR)
        rnd.master_key = opt->master_worker
                             ? st_master_replica_key(c->seed, opt->master_step,
                                                     (uint64_t)(opt->master_worker - 1))
                             : st_master_rounding_key(c->seed, t);
    /* a piece's bytes: without a copy, with one */
    const size_t bytes = (size_t)st_optim_bytes_per_param(c, 0);
    const size_t bytes_h = (size_t)st_optim_bytes_per_param(c, 1);
    opt->updated = opt->update_bytes = 0;
    int k = 0;   /* the first copy that may still cover what comes */
    int j = 0;   /* the same among the blocked copies */
    for (int s = 0; s < n_segs; s++) {
        size_t lo = segs[s].offset, hi = segs[s].offset + segs[s].count;
        if (lo < begin) lo = begin;
        if (hi > end) hi = end;
        if (lo >= hi)
            continue;
        float wd = segs[s].decay ? c->weight_decay : 0.0f;
        /* the segment in pieces: outside any copy, or inside one (copies
         * are increasing, so the walk over them never goes back) */
        while (lo < hi) {
            while (k < n_copies && copies[k].offset + copies[k].count <= lo)
                k++;
            while (j < n_blocked && st_blocked_end(&blocked[j]) <= lo)
                j++;
            size_t cut = hi;
            uint16_t *h = NULL;
            if (k < n_copies && copies[k].offset <= lo) {
                size_t c_end = copies[k].offset + copies[k].count;
                cut = c_end < hi ? c_end : hi;
                h = copies[k].bf16 + (lo - copies[k].offset);
            } else if (k < n_copies && copies[k].offset < hi) {
                cut = copies[k].offset;
            }
            const st_param_blocked *b = NULL;
            if (j < n_blocked && blocked[j].offset <= lo) {
                b = &blocked[j];
                cut = st_blocked_end(b) < cut ? st_blocked_end(b) : cut;
            } else if (j < n_blocked && blocked[j].offset < cut) {
                cut = blocked[j].offset;
            }
            if (b)
                update_blocked(opt, params, grads, lo, cut, b, &a, wd, segs[s].decay, &rnd);
            else
                update_piece(opt, params, grads, lo, cut, h, &a, wd, segs[s].decay, &rnd);
            opt->updated += cut - lo;
            opt->update_bytes +=
                (cut - lo) * (b   ? (size_t)st_optim_bytes_per_param(c, b->n)
                              : h ? bytes_h
                                  : bytes);
            lo = cut;
        }
    }
}

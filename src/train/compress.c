/*
 * train/compress.c — compressed communication for data parallelism:
 * random-k sparsification with a subset all workers share (compress.h,
 * doc/reduction.md "Compressed communication").
 *
 * A step of worker w (after its compute and the step's barrier):
 *   draw    before the barrier: shard w's kept offsets of this step, from
 *           (seed, step, w), into the shared index buffer
 *   pack    every shard v's kept gradient coordinates, times S_v / k_v
 *           (error feedback: plus the residual, unscaled; the residual
 *           keeps the dropped ones) into packed[v L .. v L + k_v)
 *   reduce  the packed engine's reduce-scatter: w's k_w means
 *   spread  w's shard gradient: the means at the kept offsets, 0 elsewhere
 * then the owner's update and the masters' all-gather, as in dp.
 *
 * Why this is safe without more barriers: w writes its offsets for step
 * t + 1 after its all-gather of step t, whose entry barrier every worker
 * reaches after packing step t; the padding of the packed vectors (past
 * k_v) is zero from the arena and never written.
 */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include <subtrain/rng.h>

#include "core/error.h"
#include "core/rng_streams.h"
#include "train/compress.h"

typedef struct randk_worker {
    _Alignas(64) float *packed;   /* n L: its kept coordinates, shard by shard */
    float *shard_grad;            /* its shard's gradient, full layout */
    float *residual;              /* P: error feedback's, else NULL */
} randk_worker;

struct st_randk {
    st_comm *packed;              /* reduces n L floats; shard v is [v L, (v + 1) L) */
    int n;
    size_t P, L;
    size_t *begin;                /* n + 1: the masters' shards */
    uint32_t *kept;               /* n: k_v */
    float *scale;                 /* n: S_v / k_v, or 1 with error feedback */
    uint32_t *index;              /* n L: shard v's kept offsets at v L, increasing */
    randk_worker *w;              /* n */
    int error_feedback;
    st_rng root;                  /* the run's random-k stream */
};

/* At least the fraction Q of a shard of S, and at least one of a
 * non-empty shard. */
static size_t kept_of(float keep, size_t S)
{
    size_t kv = (size_t)ceil((double)keep * (double)S);
    return kv > S ? S : kv < 1 && S ? 1 : kv;
}

/* L: the largest k rounded up to 16 floats (a cache line: the packed
 * engine's shards are then [v L, (v + 1) L)), at least 16. */
static size_t packed_width(size_t most)
{
    return most ? (most + 15) / 16 * 16 : 16;
}

/* The draw, the pack and the spread of worker w: `begin` the n + 1
 * shard bounds, `kept` each shard's k. */
static void add_pass_bytes(int n, const size_t *begin, const uint32_t *kept, size_t P, int ef,
                           int w, st_comm_bytes *b)
{
    const size_t f = sizeof(float), u = sizeof(uint32_t);
    size_t K = 0;
    for (int v = 0; v < n; v++)
        K += kept[v];
    const size_t Kw = kept[w], Sw = begin[w + 1] - begin[w];
    /* the draw */
    b->written += Kw * u;
    /* the pack: every shard's offsets, the kept gradients (error feedback:
     * every gradient and residual element, the residual written back) */
    b->read += K * u + (ef ? 2 * P * f : K * f);
    b->written += K * f + (ef ? P * f : 0);
    /* the spread: its offsets and means, its shard gradient */
    b->read += Kw * (u + f);
    b->written += Sw * f;
}

static void add_bytes(st_comm_bytes *b, const st_comm_bytes *p)
{
    b->read += p->read;
    b->written += p->written;
    b->cross_domain_read += p->cross_domain_read;
    b->gather_read += p->gather_read;
    b->gather_written += p->gather_written;
}

st_status st_randk_create(run_shared *r, st_randk **out)
{
    const st_dp_config *o = &r->cfg->dp;
    if (r->ranks > 1)
        return st_fail(ST_ERR_INVALID, "--compress randk runs in one process: the step's kept "
                       "coordinates are shared in memory, not sent between ranks");
    st_randk *k = calloc(1, sizeof *k);
    *out = k;
    if (!k)
        return st_fail(ST_ERR_NOMEM, "out of memory for random-k's state");
    const int n = r->n;
    k->n = n;
    k->P = r->n_params;
    k->error_feedback = o->error_feedback;
    k->begin = malloc(sizeof *k->begin * ((size_t)n + 1));
    k->kept = malloc(sizeof *k->kept * (size_t)n);
    k->scale = malloc(sizeof *k->scale * (size_t)n);
    k->w = aligned_alloc(64, sizeof *k->w * (size_t)n);
    if (!k->begin || !k->kept || !k->scale || !k->w)
        return st_fail(ST_ERR_NOMEM, "out of memory for random-k's shards");
    memset(k->w, 0, sizeof *k->w * (size_t)n);
    size_t most = 0, kept_total = 0;
    for (int v = 0; v < n; v++) {
        const st_range s = st_comm_shard(r->comm, v);
        const size_t S = s.end - s.begin;
        if (S > UINT32_MAX)
            return st_fail(ST_ERR_INVALID, "--compress randk: a shard of %zu parameters is "
                           "more than it indexes (2^32 - 1)", S);
        k->begin[v] = s.begin;
        k->begin[v + 1] = s.end;
        const size_t kv = kept_of(o->keep, S);
        k->kept[v] = (uint32_t)kv;
        k->scale[v] = k->error_feedback || kv == 0 ? 1.0f : (float)((double)S / (double)kv);
        most = kv > most ? kv : most;
        kept_total += kv;
    }
    r->ring_params = kept_total;   /* a ring would all-reduce the kept ones only */
    k->L = packed_width(most);
    k->index = malloc(sizeof *k->index * (size_t)n * k->L);
    if (!k->index)
        return st_fail(ST_ERR_NOMEM, "out of memory for random-k's index");
    st_rng seed = st_rng_seed(r->cfg->seed);
    k->root = st_rng_split(&seed, ST_RNG_STREAM_RANDK);
    ST_TRY(st_run_create_vector_engine(r, (size_t)n * k->L, ST_COMM_REDUCE, &k->packed));
    for (int v = 0; v < n; v++) {
        const st_range s = st_comm_shard(k->packed, v);
        if (s.begin != (size_t)v * k->L || s.end != (size_t)(v + 1) * k->L)
            return st_fail(ST_ERR_INVALID, "internal: random-k's packed shard %d is [%zu, %zu), "
                           "not [%zu, %zu)", v, s.begin, s.end, (size_t)v * k->L,
                           (size_t)(v + 1) * k->L);
    }
    return ST_OK;
}

void st_randk_destroy(st_randk *k)
{
    if (!k)
        return;
    st_comm_destroy(k->packed);
    free(k->begin);
    free(k->kept);
    free(k->scale);
    free(k->index);
    free(k->w);
    free(k);
}

void st_randk_abort(st_randk *k)
{
    if (k && k->packed)
        st_comm_abort(k->packed);
}

st_status st_randk_attach(st_randk *k, run_shared *r, st_worker *w)
{
    (void)r;
    randk_worker *me = &k->w[w->id];
    const size_t NL = (size_t)k->n * k->L, S = k->begin[w->id + 1] - k->begin[w->id];
    void *p;
    ST_TRY(st_arena_alloc(&w->arena, ST_MEM_GRADIENTS, NL * sizeof(float), &p));
    me->packed = p;
    ST_TRY(st_arena_alloc(&w->arena, ST_MEM_GRADIENTS, (S ? S : 1) * sizeof(float), &p));
    me->shard_grad = p;
    if (k->error_feedback) {
        ST_TRY(st_arena_alloc(&w->arena, ST_MEM_GRADIENTS, k->P * sizeof(float), &p));
        me->residual = p;
    }
    const st_range all = { 0, NL };
    return st_comm_attach(k->packed, w->id, &w->arena, me->packed, me->packed, &all, 1);
}

/* Selection sampling (Knuth's algorithm S): offset i of the S is kept
 * with probability (still to keep) / (S - i), so exactly k are, each with
 * probability k / S, in increasing order. */
void st_randk_draw(st_randk *k, int wid, uint64_t step)
{
    const size_t S = k->begin[wid + 1] - k->begin[wid];
    uint32_t need = k->kept[wid], *out = k->index + (size_t)wid * k->L;
    st_rng g = st_rng_split(&k->root, step);
    g = st_rng_split(&g, (uint64_t)wid);
    for (uint32_t i = 0; need > 0; i++) {
        const double u = (double)(st_rng_u64(&g) >> 11) * 0x1p-53;
        if (u * (double)(S - i) < (double)need) {
            *out++ = i;
            need--;
        }
    }
}

/* Shard v of gradient g into w's packed vector (error feedback: g plus
 * the residual, which keeps what is not sent). */
static void pack(const st_randk *k, randk_worker *me, const float *g, int v)
{
    const size_t b = k->begin[v], S = k->begin[v + 1] - b;
    const uint32_t K = k->kept[v], *idx = k->index + (size_t)v * k->L;
    float *out = me->packed + (size_t)v * k->L;
    if (!me->residual) {
        const float s = k->scale[v];
        for (uint32_t j = 0; j < K; j++)
            out[j] = g[b + idx[j]] * s;
        return;
    }
    float *e = me->residual + b;
    g += b;
    uint32_t j = 0;
    for (size_t i = 0; i < S; i++) {
        const float a = g[i] + e[i];
        if (j < K && idx[j] == i) {
            out[j++] = a;
            e[i] = 0.0f;
        } else {
            e[i] = a;
        }
    }
}

st_status st_randk_reduce(run_shared *r, void *ctx, st_worker *w, float **out)
{
    (void)r;
    st_randk *k = ctx;
    randk_worker *me = &k->w[w->id];
    const float *g = st_model_grads(w->model);
    for (int v = 0; v < k->n; v++)
        pack(k, me, g, v);
    ST_TRY(st_comm_reduce_scatter(k->packed, w->id));
    const size_t S = k->begin[w->id + 1] - k->begin[w->id];
    const uint32_t K = k->kept[w->id], *idx = k->index + (size_t)w->id * k->L;
    const float *mean = st_comm_shard_grads(k->packed, w->id);
    memset(me->shard_grad, 0, S * sizeof(float));
    for (uint32_t j = 0; j < K; j++)
        me->shard_grad[idx[j]] = mean[j];
    *out = me->shard_grad;
    return ST_OK;
}

st_comm_bytes st_randk_bytes(const st_randk *k, const run_shared *r, int wid)
{
    st_comm_bytes b = st_comm_bytes_per_step(r->comm, wid);
    const st_comm_bytes p = st_comm_bytes_per_step(k->packed, wid);
    add_bytes(&b, &p);
    add_pass_bytes(k->n, k->begin, k->kept, k->P, k->error_feedback, wid, &b);
    return b;
}

st_status st_compress_plan_bytes(const st_dp_config *c, const st_comm_config *cfg, int w,
                                 st_comm_bytes *out)
{
    if (c->compress == ST_COMPRESS_NONE)
        return st_comm_plan_bytes(cfg, w, out);
    memset(out, 0, sizeof *out);
    const int n = cfg->n_workers;
    st_comm_config masters = *cfg;
    masters.roles = ST_COMM_GATHER;
    masters.backend = ST_COMM_BACKEND_SHARED;
    st_comm *e = NULL;
    ST_TRY(st_comm_create(&masters, &e));
    size_t *begin = malloc(sizeof *begin * ((size_t)n + 1));
    uint32_t *kept = malloc(sizeof *kept * (size_t)n);
    st_status s = begin && kept ? ST_OK : st_fail(ST_ERR_NOMEM, "out of memory for the shards");
    size_t most = 0;
    for (int v = 0; s == ST_OK && v < n; v++) {
        const st_range r = st_comm_shard(e, v);
        begin[v] = r.begin;
        begin[v + 1] = r.end;
        kept[v] = (uint32_t)kept_of(c->keep, r.end - r.begin);
        most = kept[v] > most ? kept[v] : most;
    }
    st_comm_destroy(e);
    st_comm_config packed = *cfg;
    packed.roles = ST_COMM_REDUCE;
    packed.shared_params = 0;
    packed.n_params = (size_t)n * packed_width(most);
    st_comm_bytes g, p;
    if (s == ST_OK)
        s = st_comm_plan_bytes(&masters, w, &g);
    if (s == ST_OK)
        s = st_comm_plan_bytes(&packed, w, &p);
    if (s == ST_OK) {
        *out = g;
        add_bytes(out, &p);
        add_pass_bytes(n, begin, kept, cfg->n_params, c->error_feedback, w, out);
    }
    free(begin);
    free(kept);
    return s;
}

st_status st_compress_parse(const char *text, st_dp_config *out)
{
    if (strcmp(text, "none") == 0) {
        out->compress = ST_COMPRESS_NONE;
        return ST_OK;
    }
    if (strncmp(text, "randk:", 6) != 0)
        return st_fail(ST_ERR_INVALID, "expected none or randk:Q (Q, the fraction of "
                       "coordinates kept, in (0, 1], e.g. randk:0.25)");
    char *end;
    const double q = strtod(text + 6, &end);
    if (end == text + 6 || *end != '\0' || !(q > 0.0 && q <= 1.0) || (float)q <= 0.0f)
        return st_fail(ST_ERR_INVALID, "Q, the fraction of coordinates kept, must be a number "
                       "in (0, 1]");
    out->compress = ST_COMPRESS_RANDK;
    out->keep = (float)q;
    return ST_OK;
}

static void residual_name(const run_shared *r, int wid, char *out, size_t n)
{
    snprintf(out, n, "train.randk.residual.worker%d", st_run_global(r, wid));
}

st_status st_randk_save(st_randk *k, run_shared *r, run_ckpt *ck)
{
    char name[ST_SAFETENSORS_MAX_NAME];
    for (int v = 0; k->error_feedback && v < k->n; v++) {
        residual_name(r, v, name, sizeof name);
        ST_TRY(st_run_ckpt_tensor(ck, name, k->w[v].residual, k->P));
    }
    return ST_OK;
}

st_status st_randk_resume(st_randk *k, run_shared *r, st_worker *w)
{
    char name[ST_SAFETENSORS_MAX_NAME];
    if (!k->error_feedback)
        return ST_OK;
    residual_name(r, w->id, name, sizeof name);
    return st_run_resume_load(r, name, k->w[w->id].residual, k->P);
}

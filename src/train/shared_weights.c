/*
 * train/shared_weights.c — the run's weights when its workers share them: one
 * copy per NUMA domain (doc/reduction.md, "Weights").
 *
 * With shared weights (r->shared_weights, decided before the strategy's
 * prepare from its ops' weights hook), the workers of a domain build their
 * models over one vector of the full model's parameters, and one of bf16
 * copies of its weights in bf16 (st_model_create_on), taken by the
 * domain's first worker from an arena of the domain's own, whose chunks
 * come from that worker's NUMA backend: they sit on the domain's node.
 * The engine (st_comm_config.shared_params) makes each owner's master
 * shard its slice of its domain's vector and copies shards between
 * domains; nothing else writes the vector during training.
 *
 * Whatever writes the vector outside the engine (the initial values, a
 * resumed checkpoint's, synth's joined network) is split over the
 * domain's workers: worker k of a domain of m writes the k-th of m even
 * parts, values and bf16 copies, and a barrier follows
 * before anybody reads.  Nobody else writes those elements meanwhile, so
 * the parts are written by one thread each.
 *
 * A bf16 master (--master-weights bf16-sr) lives in the copies, each
 * domain's (the engine copies an owner's into the other domains' as
 * bf16): the fp32 vector has no memory under them
 * (st_arena_reserve_floats), and its readers get a widened vector
 * (st_run_master_full).
 *
 * Memory: a worker's record counts its arena and its share of its
 * domain's copy (the copy's bytes over the domain's workers), so that a
 * domain of m workers shows one copy, not m replicas.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bf16.h"
#include "core/blocked.h"
#include "core/error.h"
#include "train/run.h"

st_status st_run_weights_prepare(run_shared *r, int shared)
{
    r->shared_weights = shared;
    if (!shared)
        return ST_OK;
    r->domains = calloc((size_t)r->placement.n_domains, sizeof *r->domains);
    if (!r->domains)
        return st_fail(ST_ERR_NOMEM, "out of memory for the weights of %d NUMA domains",
                       r->placement.n_domains);
    return ST_OK;
}

void st_run_weights_release(run_shared *r)
{
    for (int d = 0; r->domains && d < r->placement.n_domains; d++) {
        st_blocked_store_destroy(r->domains[d].blocked);
        if (r->domains[d].arena_made)
            st_arena_release(&r->domains[d].arena);
    }
    free(r->domains);
    r->domains = NULL;
}

/* Worker wid's domain, the domain's first worker and its size. */
static int domain_of(const run_shared *r, int wid, int *first, int *m)
{
    const int d = r->placement.workers[wid].domain;
    *first = r->placement.domain_first[d];
    *m = r->placement.domain_first[d + 1] - *first;
    return d;
}

/* The bf16 copies of the weights, shared too, unless the model makes its
 * own in every forward (ST_UNFUSE_WEIGHT_COPY lists none) or keeps them
 * blocked (each worker its own). */
static int shares_bf16(const st_train_config *cfg)
{
    return cfg->model.precision == ST_PRECISION_BF16 &&
           !(cfg->model.unfuse & ST_UNFUSE_WEIGHT_COPY) &&
           cfg->model.weight_layout != ST_WEIGHT_LAYOUT_BLOCKED;
}

/* The blocked copies (--weight-layout blocked), shared too, unless the
 * model packs its own in every forward (ST_UNFUSE_WEIGHT_COPY). */
static int shares_blocked(const st_train_config *cfg)
{
    return cfg->model.precision == ST_PRECISION_BF16 &&
           !(cfg->model.unfuse & ST_UNFUSE_WEIGHT_COPY) &&
           cfg->model.weight_layout == ST_WEIGHT_LAYOUT_BLOCKED;
}

/* A bf16 master, kept in the copies alone: the fp32 vector's elements
 * under them are never read or written, so their pages are left out
 * (st_arena_reserve_floats). */
int st_run_copies_master(const run_shared *r)
{
    return r->cfg->optim.master == ST_MASTER_BF16_SR && shares_bf16(r->cfg);
}

st_status st_run_weights_storage(run_shared *r, st_worker *w, const st_train_config *cfg,
                                  const st_chunk_backend *backend)
{
    const int sparse = st_run_copies_master(r);
    if (!r->shared_weights) {   /* one worker alone: its own vector */
        float *p;
        if (!sparse)
            return ST_OK;
        ST_TRY(st_arena_reserve_floats(&w->arena, r->n_params, &p));
        w->storage = (st_model_storage){ p, NULL, r->n_params, 1, NULL };
        return ST_OK;
    }
    int first, m;
    const int d = domain_of(r, w->id, &first, &m);
    run_domain *dom = &r->domains[d];
    if (w->id == first && !dom->params) {
        char owner[32];
        snprintf(owner, sizeof owner, "domain %d", d);
        st_arena_init(&dom->arena, owner, backend, 0);
        dom->arena_made = 1;
        if (sparse)
            ST_TRY(st_arena_reserve_floats(&dom->arena, r->n_params, &dom->params));
        else
            ST_TRY(st_arena_alloc_floats(&dom->arena, ST_MEM_WEIGHTS, r->n_params,
                                         &dom->params));
        if (shares_bf16(cfg)) {
            void *p;
            ST_TRY(st_arena_alloc(&dom->arena, ST_MEM_WEIGHTS, r->n_params * sizeof(uint16_t),
                                  &p));
            dom->bf16 = p;
        }
        if (shares_blocked(cfg))
            ST_TRY(st_blocked_store_create(&dom->arena, &dom->blocked));
    }
    /* every domain's copy exists (its first worker wrote the pointers) */
    ST_TRY(st_run_sync(r, w->id));
    w->storage = (st_model_storage){ dom->params, dom->bf16, r->n_params, sparse, dom->blocked };
    return ST_OK;
}

/* The worker that made w's sparse vector, its model built: the vector's
 * memory outside the copies its model lists. */
static st_status commit_sparse(run_shared *r, st_worker *w)
{
    int first = w->id, m = 1;
    st_arena *a = &w->arena;
    if (r->shared_weights) {
        a = &r->domains[domain_of(r, w->id, &first, &m)].arena;
        if (w->id != first)
            return ST_OK;
    }
    int n;
    const st_param_copy *c = st_model_copies(w->model, &n);
    size_t *skip = malloc((size_t)(n > 0 ? 2 * n : 1) * sizeof *skip);
    if (!skip)
        return st_fail(ST_ERR_NOMEM, "out of memory listing the weight copies");
    for (int i = 0; i < n; i++) {
        skip[2 * i] = c[i].offset;
        skip[2 * i + 1] = c[i].offset + c[i].count;
    }
    st_status s = st_arena_commit_floats(a, ST_MEM_WEIGHTS, w->storage.params, skip, n);
    free(skip);
    return s;
}

/* Where part k of n parts of a P-element vector begins: even parts, the
 * first P mod n one element longer. */
static size_t part_begin(size_t P, int n, int k)
{
    const size_t q = P / (size_t)n, rem = P % (size_t)n, kk = (size_t)k;
    return kk * q + (kk < rem ? kk : rem);
}

/* Elements [lo, hi) of a bf16 master's vector: the values of `full` (NULL:
 * the initial ones), rounded into the copies where there is one. */
static st_status load_master(const run_shared *r, st_worker *w, const float *full, size_t lo,
                             size_t hi)
{
    float *made = NULL;
    if (!full) {
        made = malloc((hi - lo) * sizeof *made);
        if (!made)
            return st_fail(ST_ERR_NOMEM, "out of memory for %zu initial weights", hi - lo);
        st_status s = st_run_initial_range(r->cfg, lo, hi, made);
        if (s != ST_OK) {
            free(made);
            return s;
        }
    }
    const float *v = made ? made : full + lo;   /* v[i - lo]: element i's value */
    float *p = w->storage.params;
    int n;
    const st_param_copy *c = st_model_copies(w->model, &n);
    size_t at = lo;   /* written below `at`; the copies are sorted and disjoint */
    for (int i = 0; i <= n && at < hi; i++) {
        const size_t c_lo = i < n ? c[i].offset : hi, c_hi = i < n ? c_lo + c[i].count : hi;
        const size_t from = c_lo > at ? (c_lo < hi ? c_lo : hi) : at;
        const size_t to = c_hi < hi ? c_hi : hi;
        if (from > at)   /* no copy: fp32 */
            memcpy(p + at, v + (at - lo), (from - at) * sizeof *p);
        if (i < n && from < to)
            st_bf16_round_n(c[i].bf16 + (from - c_lo), v + (from - lo), to - from);
        if (to > at)
            at = to;
    }
    free(made);
    return ST_OK;
}

st_status st_run_weights_load(run_shared *r, st_worker *w, const float *full)
{
    if (!r->shared_weights && !w->storage.copies_master) {
        if (full && !r->sizing)   /* the layout is all a sizing run reads */
            memcpy(st_model_params(w->model), full,
                   st_model_param_count(w->model) * sizeof(float));
        return ST_OK;
    }
    int first = w->id, m = 1;
    if (r->shared_weights)
        domain_of(r, w->id, &first, &m);
    const size_t part[2] = { part_begin(r->n_params, m, w->id - first),
                             part_begin(r->n_params, m, w->id - first + 1) };
    float *p = w->storage.params;
    if (r->sizing)   /* the layout is all a sizing run reads */
        return r->shared_weights ? st_run_sync(r, w->id) : ST_OK;
    if (part[1] > part[0] && w->storage.copies_master) {
        ST_TRY(load_master(r, w, full, part[0], part[1]));
    } else if (part[1] > part[0]) {
        if (full)
            memcpy(p + part[0], full + part[0], (part[1] - part[0]) * sizeof *p);
        else
            ST_TRY(st_run_initial_range(r->cfg, part[0], part[1], p + part[0]));
        int n;
        const st_param_copy *c = st_model_copies(w->model, &n);
        for (int i = 0; w->storage.bf16 && i < n; i++) {
            size_t lo = c[i].offset > part[0] ? c[i].offset : part[0];
            size_t hi = c[i].offset + c[i].count < part[1] ? c[i].offset + c[i].count : part[1];
            if (lo < hi)
                st_bf16_round_n(c[i].bf16 + (lo - c[i].offset), p + lo, hi - lo);
        }
        if (w->storage.blocked)
            st_run_pack_blocked(w, part[0], part[1]);
    }
    /* every part is written before anybody reads the vector */
    return r->shared_weights ? st_run_sync(r, w->id) : ST_OK;
}

void st_run_pack_blocked(const st_worker *w, size_t lo, size_t hi)
{
    int n;
    const st_param_blocked *b = st_model_blocked_copies(w->model, &n);
    const float *p = st_model_params(w->model);
    for (int i = 0; i < n && b[i].offset < hi; i++) {
        const size_t end = st_blocked_end(&b[i]);
        const size_t from = b[i].offset > lo ? b[i].offset : lo, to = end < hi ? end : hi;
        if (from < to)
            st_blocked_pack(&b[i], p + from, from, to);
    }
}

st_status st_run_pack_gathered(run_shared *r, st_comm *masters, st_worker *w)
{
    if (!w->storage.blocked || r->placement.n_domains < 2)
        return ST_OK;
    int first, m;
    const int d = domain_of(r, w->id, &first, &m);
    /* the other domains' shards, dealt round the domain's workers */
    for (int j = 0, k = 0; j < r->n; j++) {
        if (r->placement.workers[j].domain == d)
            continue;
        if (k++ % m == w->id - first) {
            const st_range sh = st_comm_shard(masters, j);
            st_run_pack_blocked(w, sh.begin, sh.end);
        }
    }
    /* every copy whole before any forward reads it */
    return st_comm_barrier(masters, w->id);
}

st_status st_run_build_model(run_shared *r, st_worker *w, const st_train_config *cfg,
                             const st_chunk_backend *backend)
{
    ST_TRY(st_run_weights_storage(r, w, cfg, backend));
    ST_TRY(st_worker_build_model(w, cfg));
    return st_run_weights_built(r, w);
}

st_status st_run_weights_built(run_shared *r, st_worker *w)
{
    if (w->storage.copies_master) {
        ST_TRY(commit_sparse(r, w));
        if (r->shared_weights)   /* committed before anybody writes it */
            ST_TRY(st_run_sync(r, w->id));
    }
    return r->shared_weights || w->storage.copies_master ? st_run_weights_load(r, w, NULL)
                                                         : ST_OK;
}

void st_run_master_widen(const st_worker *w, size_t begin, size_t end, float *dst)
{
    const float *p = st_model_params(w->model);
    int n;
    const st_param_copy *c = st_model_copies(w->model, &n);
    size_t at = begin;   /* dst[i - begin]: element i; the copies are sorted and disjoint */
    for (int i = 0; i <= n && at < end; i++) {
        const size_t lo = i < n ? c[i].offset : end, hi = i < n ? lo + c[i].count : end;
        const size_t to = lo < end ? (lo > at ? lo : at) : end;
        memcpy(dst + (at - begin), p + at, (to - at) * sizeof *dst);
        const size_t stop = hi < end ? hi : end;
        if (i < n && stop > to)
            st_bf16_widen_n(dst + (to - begin), c[i].bf16 + (to - lo), stop - to);
        at = stop > at ? stop : at;
    }
}

st_status st_run_master_full(run_shared *r, st_worker *w, const float **out)
{
    *out = st_model_params(w->model);
    if (!w->storage.copies_master)
        return ST_OK;
    const size_t P = r->n_params;
    if (!r->widened && !(r->widened = malloc((P ? P : 1) * sizeof *r->widened)))
        return st_fail(ST_ERR_NOMEM, "out of memory widening %zu weights", P);
    st_run_master_widen(w, 0, P, r->widened);
    *out = r->widened;
    return ST_OK;
}

void st_run_master_full_done(run_shared *r)
{
    free(r->widened);
    r->widened = NULL;
}

void st_run_worker_memory(const run_shared *r, const st_worker *w, st_mem_stats *out)
{
    *out = w->arena.stats;
    if (!r->shared_weights)
        return;
    int first, m;
    const run_domain *dom = &r->domains[domain_of(r, w->id, &first, &m)];
    if (!dom->arena_made)
        return;
    /* its share, rounded up: m shares hold at least the copy */
    const st_mem_stats *s = &dom->arena.stats;
    for (int k = 0; k < ST_MEM_KIND_COUNT; k++) {
        out->current[k] += (s->current[k] + (size_t)m - 1) / (size_t)m;
        out->peak[k] += (s->peak[k] + (size_t)m - 1) / (size_t)m;
    }
    out->current_total += (s->current_total + (size_t)m - 1) / (size_t)m;
    out->peak_total += (s->peak_total + (size_t)m - 1) / (size_t)m;
    out->reserved += (s->reserved + (size_t)m - 1) / (size_t)m;
}

/*
 * comm/plan.c — the plan of the reduction: shards, NUMA domains, segments
 * and holder counts, each worker's work lists for the two-level
 * reduce-scatter and all-gather, and the bytes they move.
 *
 * Everything is planned once, in st_comm_attach(); a step only runs the
 * plan (the work items of kernels.h).  This file never synchronises: the
 * backend calls its phases between barriers (see plan.h for which phase
 * reads what the others wrote).
 *
 * The plan.  The owner of each shard splits its shard into segments, the
 * maximal runs of elements whose set of holders is the same; a segment
 * stores its holder count (the divisor) and its holders in increasing
 * worker order.  Since the workers of a domain are consecutive, the holders
 * of one domain are a contiguous part of that list.  For every remote
 * domain with two or more holders of a segment, one worker of that domain
 * (the least loaded so far, ties to the lowest number) sums their gradients
 * into a partial on its own node; with one holder the owner reads that
 * holder's gradient directly.  For the all-gather one holder per remote
 * domain (again the least loaded) copies the segment from the owner's
 * master into its replica, and the domain's other holders copy it from
 * there.  Every worker runs the same deterministic assignment over the same
 * tables, so they agree without talking.
 *
 * Summation order, fixed: within a domain the holders in increasing worker
 * order; then the domains' partials in increasing domain order; then one
 * division by the holder count.  With one domain that is workers 0..N-1 in
 * order.  Each output element is computed by one thread with one sequence
 * of IEEE operations (element-wise, so vector width does not matter), hence
 * the bitwise reproducibility.  The order is set here, by the order in
 * which the ops of an rs item are emitted; the kernels only follow it.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/comm.h>

#include "comm/plan.h"
#include "core/arena_impl.h"
#include "core/bf16.h"
#include "core/blocked.h"
#include "core/error.h"
#include "core/ranges.h"

/* ------------------------------------------------------------ layout */

static size_t min_size(size_t a, size_t b)
{
    return a < b ? a : b;
}

void st_comm_shards(size_t n_params, int n, size_t *begin)
{
    size_t blocks = n_params / ST_COMM_SHARD_ALIGN + (n_params % ST_COMM_SHARD_ALIGN != 0);
    size_t q = blocks / (size_t)n, r = blocks % (size_t)n;
    for (int w = 0; w <= n; w++) {
        size_t b = (size_t)w * q + min_size((size_t)w, r);
        begin[w] = min_size(b * ST_COMM_SHARD_ALIGN, n_params);
    }
}

st_status st_comm_map_domains(int n, const int *domain_of, int *dense, int *domain_first,
                              int *n_domains)
{
    int d = 0;
    if (dense)
        dense[0] = 0;
    if (domain_first)
        domain_first[0] = 0;
    if (domain_of && domain_of[0] < 0)
        return st_fail(ST_ERR_INVALID, "NUMA domain of worker 0 is %d; domains must be >= 0",
                       domain_of[0]);
    for (int w = 1; w < n; w++) {
        if (domain_of) {
            if (domain_of[w] < domain_of[w - 1])
                return st_fail(ST_ERR_INVALID,
                               "NUMA domains must be non-decreasing (the workers of a domain "
                               "consecutive): worker %d is in domain %d after worker %d in %d",
                               w, domain_of[w], w - 1, domain_of[w - 1]);
            if (domain_of[w] != domain_of[w - 1]) {
                d++;
                if (domain_first)
                    domain_first[d] = w;
            }
        }
        if (dense)
            dense[w] = d;
    }
    if (domain_first)
        domain_first[d + 1] = n;
    *n_domains = d + 1;
    return ST_OK;
}

st_status st_comm_check_size(int n_workers, size_t n_params)
{
    if (n_workers < 1 || n_workers > ST_COMM_MAX_WORKERS)
        return st_fail(ST_ERR_INVALID, "number of workers must be in [1, %d], got %d",
                       ST_COMM_MAX_WORKERS, n_workers);
    if (n_params < 1)
        return st_fail(ST_ERR_INVALID, "the parameter vector must have at least 1 element");
    if (n_params > SIZE_MAX / sizeof(float) / 2)
        return st_fail(ST_ERR_INVALID, "%zu parameters is more than can be addressed", n_params);
    return ST_OK;
}

size_t st_comm_least_loaded(const size_t *load, size_t n)
{
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (load[i] < load[best])
            best = i;
    return best;
}

st_status st_comm_check_held(size_t n_params, int w, const st_arena *arena, const float *grads,
                             const float *params, const st_range *held, int n_held)
{
    if (!arena || !grads || !params)
        return st_fail(ST_ERR_INVALID, "worker %d: arena, gradient and parameter vectors "
                       "must be given", w);
    if (n_held < 0 || (n_held > 0 && !held))
        return st_fail(ST_ERR_INVALID, "worker %d: bad held-range list (%d ranges)", w, n_held);
    for (int i = 0; i < n_held; i++) {
        const st_range *r = &held[i];
        if (r->begin >= r->end)
            return st_fail(ST_ERR_INVALID, "worker %d: held range %d [%zu, %zu) is empty or "
                           "reversed", w, i, r->begin, r->end);
        if (r->end > n_params)
            return st_fail(ST_ERR_INVALID, "worker %d: held range %d [%zu, %zu) is out of range: "
                           "the vector has %zu elements", w, i, r->begin, r->end, n_params);
        if (i > 0 && r->begin < held[i - 1].end)
            return st_fail(ST_ERR_INVALID, "worker %d: held ranges %d [%zu, %zu) and %d "
                           "[%zu, %zu) overlap or are not sorted", w, i - 1, held[i - 1].begin,
                           held[i - 1].end, i, r->begin, r->end);
    }
    return ST_OK;
}

double st_comm_ring_bytes(int n_workers, size_t n_params)
{
    if (n_workers < 1)
        return 0.0;
    return 2.0 * (double)(n_workers - 1) / (double)n_workers * (double)n_params * sizeof(float);
}

/* ------------------------------------------------------------ tables */

st_status st_comm_plan_init(comm_plan *pl, const st_comm_config *cfg)
{
    memset(pl, 0, sizeof *pl);
    int n = cfg->n_workers, n_domains;
    ST_TRY(st_comm_map_domains(n, cfg->domain_of, NULL, NULL, &n_domains));
    pl->n_workers = n;
    pl->roles = cfg->roles ? cfg->roles : ST_COMM_REDUCE | ST_COMM_GATHER;
    pl->payload = cfg->payload;
    pl->bf16_at = cfg->bf16_at;
    pl->allow_unheld = cfg->allow_unheld;
    pl->shared_params = cfg->shared_params;
    pl->copies_master = cfg->copies_master;
    if (cfg->n_bf16_master > 0) {
        pl->bf16_master = malloc((size_t)cfg->n_bf16_master * sizeof *pl->bf16_master);
        if (!pl->bf16_master)
            return st_fail(ST_ERR_NOMEM, "out of memory creating the reduction engine");
        memcpy(pl->bf16_master, cfg->bf16_master,
               (size_t)cfg->n_bf16_master * sizeof *pl->bf16_master);
        pl->n_bf16_master = cfg->n_bf16_master;
    }
    if (cfg->allow_unheld && cfg->unheld_ranges && cfg->n_unheld_ranges > 0) {
        pl->unheld_ranges = malloc((size_t)cfg->n_unheld_ranges * sizeof *pl->unheld_ranges);
        if (!pl->unheld_ranges)
            return st_fail(ST_ERR_NOMEM, "out of memory creating the reduction engine");
        memcpy(pl->unheld_ranges, cfg->unheld_ranges,
               (size_t)cfg->n_unheld_ranges * sizeof *pl->unheld_ranges);
        pl->n_unheld_ranges = cfg->n_unheld_ranges;
    }
    pl->n_params = cfg->n_params;
    pl->n_domains = n_domains;
    pl->domain_of = malloc((size_t)n * sizeof *pl->domain_of);
    pl->domain_first = malloc(((size_t)n_domains + 1) * sizeof *pl->domain_first);
    pl->shard_begin = malloc(((size_t)n + 1) * sizeof *pl->shard_begin);
    /* slots are 64-byte aligned (comm_slot starts with an alignas(64)
     * member), so aligned_alloc's size rule holds */
    pl->slots = aligned_alloc(64, (size_t)n * sizeof *pl->slots);
    if (!pl->domain_of || !pl->domain_first || !pl->shard_begin || !pl->slots)
        return st_fail(ST_ERR_NOMEM, "out of memory creating the reduction engine for %d workers",
                       n);
    memset(pl->slots, 0, (size_t)n * sizeof *pl->slots);
    st_comm_map_domains(n, cfg->domain_of, pl->domain_of, pl->domain_first, &n_domains);
    st_comm_shards(pl->n_params, n, pl->shard_begin);
    for (int w = 0; w < n; w++)
        pl->slots[w].domain = pl->domain_of[w];
    return ST_OK;
}

void st_comm_plan_free(comm_plan *pl)
{
    free(pl->unheld_ranges);
    free(pl->bf16_master);
    free(pl->domain_of);
    free(pl->domain_first);
    free(pl->shard_begin);
    free(pl->slots);
    memset(pl, 0, sizeof *pl);
}

void st_comm_plan_forget(comm_plan *pl)
{
    for (int w = 0; w < pl->n_workers; w++) {
        comm_slot *s = &pl->slots[w];
        int domain = s->domain;
        float *out = s->shard_out;
        memset(s, 0, sizeof *s);
        s->domain = domain;
        s->shard_out = out;
    }
}

/* ------------------------------------------------------------ attach */

/* Where element x of the vector lives in worker s's storage: its vectors
 * may be compact (only the held ranges, back to back).  x must be held by
 * s.  Used when the step's work lists are built, never during a step. */
static float *local_at(const comm_slot *s, float *base, size_t x)
{
    int lo = 0, hi = s->n_held - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (s->held[mid].begin <= x)
            lo = mid;
        else
            hi = mid - 1;
    }
    return base + s->local[lo] + (x - s->held[lo].begin);
}

/* Worker v's gradient of element x. */
static float *grad_of(const comm_plan *pl, int v, size_t x)
{
    return local_at(&pl->slots[v], pl->slots[v].grads, x);
}

/* What a step reads for worker v's gradient of element x: the fp32 value,
 * its bf16 payload (a buffer), or the fp32 value rounded as it is read;
 * and the bytes per element that reading costs. */
typedef struct grad_src {
    const void *p;
    uint8_t kind;             /* SRC_* */
    size_t elt;               /* bytes per element read */
} grad_src;

static grad_src source_of(const comm_plan *pl, int v, size_t x)
{
    const comm_slot *s = &pl->slots[v];
    if (pl->payload != ST_COMM_PAYLOAD_BF16)
        return (grad_src){ grad_of(pl, v, x), SRC_F32, sizeof(float) };
    if (pl->bf16_at == ST_COMM_BF16_ON_READ)
        return (grad_src){ grad_of(pl, v, x), SRC_F32_RNE, sizeof(float) };
    /* the buffer has the layout of the vector: the same offset */
    size_t at = (size_t)(grad_of(pl, v, x) - s->grads);
    return (grad_src){ s->bf16 + at, SRC_BF16, sizeof(uint16_t) };
}

void st_comm_plan_convert(const comm_plan *pl, int w, size_t lo, size_t hi)
{
    const comm_slot *me = &pl->slots[w];
    if (!me->bf16)
        return;
    for (int i = 0; i < me->n_held; i++) {
        const size_t a = me->held[i].begin > lo ? me->held[i].begin : lo;
        const size_t b = me->held[i].end < hi ? me->held[i].end : hi;
        if (a < b) {
            const size_t at = me->local[i] + (a - me->held[i].begin);
            st_bf16_round_n(me->bf16 + at, me->grads + at, b - a);
        }
    }
}

void st_comm_plan_reduce_part(const comm_plan *pl, int w, size_t lo, size_t hi)
{
    comm_slot *me = &pl->slots[w];
    for (size_t g = 0; g < me->n_rs2; g++) {
        const comm_seg *seg = &me->segs[g];
        const size_t a = seg->begin > lo ? seg->begin : lo;
        const size_t b = seg->end < hi ? seg->end : hi;
        if (a < b)
            st_comm_run_rs_part(&me->rs2[g], me->ops2, a - seg->begin, b - seg->begin,
                                me->scratch, me->wide);
    }
}

void st_comm_plan_partials_part(const comm_plan *pl, int w, size_t lo, size_t hi)
{
    const comm_slot *me = &pl->slots[w];
    for (size_t g = 0; g < me->n_rs1; g++) {
        const size_t at = me->rs1_at[g], end = at + me->rs1[g].n;
        const size_t a = at > lo ? at : lo;
        const size_t b = end < hi ? end : hi;
        if (a < b)
            st_comm_run_rs_part(&me->rs1[g], me->ops1, a - at, b - at, me->scratch, me->wide);
    }
}

st_status st_comm_alloc_master(st_arena *arena, size_t begin, size_t len,
                               const st_param_copy *copies, int n, float **out)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        k += copies[i].offset < begin + len && copies[i].offset + copies[i].count > begin;
    if (!k)
        return st_arena_alloc_floats(arena, ST_MEM_WEIGHTS, len, out);
    size_t *skip = malloc(2 * (size_t)k * sizeof *skip);
    if (!skip)
        return st_fail(ST_ERR_NOMEM, "out of memory listing the weight copies");
    k = 0;
    for (int i = 0; i < n; i++) {
        const size_t lo = copies[i].offset, hi = lo + copies[i].count;
        if (lo >= begin + len || hi <= begin)
            continue;
        skip[2 * k] = (lo > begin ? lo : begin) - begin;
        skip[2 * k + 1] = (hi < begin + len ? hi : begin + len) - begin;
        k++;
    }
    st_status s = st_arena_reserve_floats(arena, len, out);
    if (s == ST_OK)
        s = st_arena_commit_floats(arena, ST_MEM_WEIGHTS, *out, skip, k);
    free(skip);
    return s;
}

/* The first of pl's bf16 master ranges that ends after x (n if none). */
static int bf16_range_after(const comm_plan *pl, size_t x)
{
    return st_ranges_after(pl->bf16_master, pl->n_bf16_master, x);
}

/* Where [x, x + n) lies against the bf16 master ranges: 1 inside one, 0
 * outside all, -1 across a border. */
static int bf16_inside(const comm_plan *pl, size_t x, size_t n)
{
    const int i = bf16_range_after(pl, x);
    if (i == pl->n_bf16_master || pl->bf16_master[i].begin >= x + n)
        return 0;
    return pl->bf16_master[i].begin <= x && pl->bf16_master[i].end >= x + n ? 1 : -1;
}

/* bf16 master shards: the fp32 shard without memory under the ranges,
 * and the bf16 shard (its whole length, where it meets a range). */
static st_status alloc_master16(const comm_plan *pl, comm_slot *me, st_arena *arena,
                                size_t begin, size_t len)
{
    int n = 0;
    for (int i = bf16_range_after(pl, begin);
         i < pl->n_bf16_master && pl->bf16_master[i].begin < begin + len; i++)
        n++;
    me->master16 = NULL;
    if (!n)
        return st_arena_alloc_floats(arena, ST_MEM_WEIGHTS, len, &me->master);
    st_param_copy *as_copies = malloc((size_t)n * sizeof *as_copies);
    if (!as_copies)
        return st_fail(ST_ERR_NOMEM, "out of memory listing the bf16 master ranges");
    const int first = bf16_range_after(pl, begin);
    for (int i = 0; i < n; i++) {
        const st_range *r = &pl->bf16_master[first + i];
        as_copies[i] = (st_param_copy){ .offset = r->begin, .count = r->end - r->begin };
    }
    st_status s = st_comm_alloc_master(arena, begin, len, as_copies, n, &me->master);
    free(as_copies);
    ST_TRY(s);
    void *p;
    ST_TRY(st_arena_alloc(arena, ST_MEM_WEIGHTS, len * sizeof(uint16_t), &p));
    me->master16 = p;
    return ST_OK;
}

st_status st_comm_plan_register(comm_plan *pl, int w, st_arena *arena, float *grads,
                                float *params, const st_range *held, const size_t *local,
                                int n_held)
{
    comm_slot *me = &pl->slots[w];
    me->arena = arena;
    me->grads = grads;
    me->params = params;
    me->n_held = n_held;
    me->ready_from = pl->n_params;
    me->done_from = pl->shard_begin[w + 1];
    me->partial_from = pl->n_params;
    me->step = 0;
    memset(&me->bytes, 0, sizeof me->bytes);
    if (n_held > 0) {
        void *p;
        ST_TRY(st_arena_alloc(arena, ST_MEM_WORKSPACE, (size_t)n_held * sizeof *held, &p));
        memcpy(p, held, (size_t)n_held * sizeof *held);
        me->held = p;
        ST_TRY(st_arena_alloc(arena, ST_MEM_WORKSPACE, (size_t)n_held * sizeof *local, &p));
        me->local = p;
        for (int i = 0; i < n_held; i++)
            me->local[i] = local ? local[i] : held[i].begin; /* full layout: identity */
    }
    size_t len = pl->shard_begin[w + 1] - pl->shard_begin[w];
    me->bf16 = NULL;
    me->wide = NULL;
    if ((pl->roles & ST_COMM_REDUCE) && pl->payload == ST_COMM_PAYLOAD_BF16) {
        /* the widening chunks; and, with buffers, w's bf16 payload: as long
         * as its (compact) vector's held part, converted every step (read
         * 4, write 2 bytes per held element, counted here) */
        ST_TRY(st_arena_alloc_floats(arena, ST_MEM_WORKSPACE, 2 * (size_t)ST_CHUNK, &me->wide));
        if (pl->bf16_at == ST_COMM_BF16_BUFFER && n_held > 0) {
            size_t extent = 0, count = 0;
            for (int i = 0; i < n_held; i++) {
                size_t e = me->local[i] + (held[i].end - held[i].begin);
                extent = e > extent ? e : extent;
                count += held[i].end - held[i].begin;
            }
            void *p;
            ST_TRY(st_arena_alloc(arena, ST_MEM_GRADIENTS, extent * sizeof(uint16_t), &p));
            me->bf16 = p;
            me->bytes.read += count * sizeof(float);
            me->bytes.written += count * sizeof(uint16_t);
        }
    }
    if (pl->shared_params) {
        /* the master is w's shard of its domain's vector: updated there,
         * read from there by the workers of the domain */
        size_t at = 0;
        for (int i = 0; i < n_held && at == held[i].begin && me->local[i] == at; i++)
            at = held[i].end;
        if (at != pl->n_params)
            return st_fail(ST_ERR_INVALID, "worker %d: shared parameters are one vector held "
                           "whole, in the full layout: element %zu is not held there", w, at);
        me->master = params + pl->shard_begin[w];
    } else if ((pl->roles & ST_COMM_GATHER) && pl->n_bf16_master) {
        ST_TRY(alloc_master16(pl, me, arena, pl->shard_begin[w], len));
    } else if (pl->roles & ST_COMM_GATHER) {
        /* a bf16 master's shard: no memory under the copies (its update
         * and all-gather read the owner's copies there) */
        ST_TRY(st_comm_alloc_master(arena, pl->shard_begin[w], len,
                                    pl->copies_master ? me->copies : NULL,
                                    pl->copies_master ? me->n_copies : 0, &me->master));
    }
    if ((pl->roles & ST_COMM_REDUCE) && me->shard_out) {
        me->shard_grad = me->shard_out;   /* what no reduction writes keeps its value */
    } else if (pl->roles & ST_COMM_REDUCE) {
        /* zero-filled by the arena: what no reduction writes (allow_unheld)
         * reads as a zero gradient */
        ST_TRY(st_arena_alloc_floats(arena, ST_MEM_GRADIENTS, len, &me->shard_grad));
    }
    return ST_OK;
}

/* The end of the allowed-unheld range containing pos, or pos if none
 * (with allow_unheld and no list: everything is allowed). */
static size_t unheld_allowed_until(const comm_plan *pl, size_t pos)
{
    if (!pl->allow_unheld)
        return pos;
    if (!pl->unheld_ranges)
        return pl->n_params;
    for (int i = 0; i < pl->n_unheld_ranges; i++)
        if (pl->unheld_ranges[i].begin <= pos && pos < pl->unheld_ranges[i].end)
            return pl->unheld_ranges[i].end;
    return pos;
}

/* Every element held by at least one worker, except where unheld elements
 * are allowed: a sweep over all workers' sorted ranges.  Every worker runs
 * it and reports the same element. */
st_status st_comm_plan_check_coverage(const comm_plan *pl)
{
    int n = pl->n_workers;
    int *cur = calloc((size_t)n, sizeof *cur);
    if (!cur)
        return st_fail(ST_ERR_NOMEM, "out of memory checking the held ranges");
    size_t pos = 0;
    st_status s = ST_OK;
    while (pos < pl->n_params) {
        size_t best = pos, next_held = pl->n_params;
        for (int v = 0; v < n; v++) {
            const comm_slot *sv = &pl->slots[v];
            while (cur[v] < sv->n_held && sv->held[cur[v]].end <= pos)
                cur[v]++;
            if (cur[v] < sv->n_held && sv->held[cur[v]].begin <= pos && sv->held[cur[v]].end > best)
                best = sv->held[cur[v]].end;
            if (cur[v] < sv->n_held && sv->held[cur[v]].begin > pos &&
                sv->held[cur[v]].begin < next_held)
                next_held = sv->held[cur[v]].begin;
        }
        if (best == pos) {
            size_t allowed = unheld_allowed_until(pl, pos);
            if (allowed == pos) {
                s = st_fail(ST_ERR_INVALID, "element %zu of the %zu-element vector is held by "
                            "no worker (every element needs at least one holder%s)", pos,
                            pl->n_params, pl->allow_unheld ? " outside the ranges allowed to be "
                            "unheld" : "");
                break;
            }
            best = allowed < next_held ? allowed : next_held;
        }
        pos = best;
    }
    free(cur);
    return s;
}

st_status st_comm_plan_check_shared(const comm_plan *pl)
{
    if (!pl->shared_params)
        return ST_OK;
    for (int v = 0; v < pl->n_workers; v++) {
        const int d = pl->domain_of[v], f = pl->domain_first[d];
        if (pl->slots[v].params != pl->slots[f].params)
            return st_fail(ST_ERR_INVALID, "workers %d and %d of NUMA domain %d attach different "
                           "parameter vectors: shared parameters are one vector a domain", f, v,
                           d);
        if (v == f)
            for (int e = 0; e < d; e++)
                if (pl->slots[pl->domain_first[e]].params == pl->slots[v].params)
                    return st_fail(ST_ERR_INVALID, "NUMA domains %d and %d attach the same "
                                   "parameter vector: shared parameters are a vector a domain",
                                   e, d);
    }
    return ST_OK;
}

static int cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return (x > y) - (x < y);
}

/* Workers holding element x (and so the whole elementary interval starting
 * at x: no range boundary lies inside it), in increasing order. cur[] are
 * per-worker cursors, valid for non-decreasing x. */
static int holders_at(const comm_plan *pl, size_t x, int *cur, uint16_t *out)
{
    int nh = 0;
    for (int v = 0; v < pl->n_workers; v++) {
        const comm_slot *sv = &pl->slots[v];
        while (cur[v] < sv->n_held && sv->held[cur[v]].end <= x)
            cur[v]++;
        if (cur[v] < sv->n_held && sv->held[cur[v]].begin <= x)
            out[nh++] = (uint16_t)v;
    }
    return nh;
}

/* Segments of w's shard (two passes: count, then fill), the master shard
 * from each element's first holder, and the tables of the two-level path. */
st_status st_comm_plan_segments(comm_plan *pl, int w)
{
    comm_slot *me = &pl->slots[w];
    size_t sb = pl->shard_begin[w], se = pl->shard_begin[w + 1];
    me->n_segs = 0;
    if (sb == se)
        return ST_OK;

    int n = pl->n_workers;
    size_t n_cuts = 2;
    for (int v = 0; v < n; v++)
        n_cuts += 2 * (size_t)pl->slots[v].n_held;
    size_t *cuts = malloc(n_cuts * sizeof *cuts);
    int *cur = malloc((size_t)n * sizeof *cur);
    uint16_t *hl = malloc(2 * (size_t)n * sizeof *hl);
    if (!cuts || !cur || !hl) {
        free(cuts);
        free(cur);
        free(hl);
        return st_fail(ST_ERR_NOMEM, "worker %d: out of memory planning the reduction", w);
    }
    size_t k = 0;
    cuts[k++] = sb;
    cuts[k++] = se;
    for (int v = 0; v < n; v++) {
        for (int i = 0; i < pl->slots[v].n_held; i++) {
            const st_range *r = &pl->slots[v].held[i];
            if (r->begin > sb && r->begin < se)
                cuts[k++] = r->begin;
            if (r->end > sb && r->end < se)
                cuts[k++] = r->end;
        }
    }
    qsort(cuts, k, sizeof *cuts, cmp_size);
    size_t m = 0;
    for (size_t i = 0; i < k; i++)
        if (m == 0 || cuts[i] != cuts[m - 1])
            cuts[m++] = cuts[i];

    st_status s = ST_OK;
    size_t n_segs = 0, n_hold = 0;
    /* pass 0: count; pass 1: fill */
    uint16_t *now = hl, *prev = hl + n;
    int prev_n = -1;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            void *p1, *p2;
            s = st_arena_alloc(me->arena, ST_MEM_WORKSPACE, n_segs * sizeof *me->segs, &p1);
            if (s == ST_OK)
                s = st_arena_alloc(me->arena, ST_MEM_WORKSPACE, n_hold * sizeof *me->holders, &p2);
            if (s != ST_OK)
                break;
            me->segs = p1;
            me->holders = p2;
        }
        for (int v = 0; v < n; v++)
            cur[v] = 0;
        n_segs = 0;
        n_hold = 0;
        prev_n = -1;
        for (size_t i = 0; i + 1 < m; i++) {
            int nh = holders_at(pl, cuts[i], cur, now);
            if (nh == 0 && pl->allow_unheld) {  /* nobody's: no segment, never touched */
                prev_n = -1;
                continue;
            }
            if (nh == 0) {  /* st_comm_plan_check_coverage rules this out */
                s = st_fail(ST_ERR_INVALID, "element %zu is held by no worker", cuts[i]);
                break;
            }
            if (nh == prev_n && memcmp(now, prev, (size_t)nh * sizeof *now) == 0) {
                if (pass == 1)
                    me->segs[n_segs - 1].end = cuts[i + 1];
                continue;
            }
            if (pass == 1) {
                me->segs[n_segs] = (comm_seg){ cuts[i], cuts[i + 1], n_hold, (uint16_t)nh };
                memcpy(me->holders + n_hold, now, (size_t)nh * sizeof *now);
            }
            n_segs++;
            n_hold += (size_t)nh;
            uint16_t *t = prev;
            prev = now;
            now = t;
            prev_n = nh;
        }
        if (s != ST_OK)
            break;
    }
    free(cuts);
    free(cur);
    free(hl);
    ST_TRY(s);
    me->n_segs = n_segs;

    /* master shard <- first holder's parameters (shared: it is them); a
     * sizing run's buffers stay untouched */
    const int copy = me->master && !pl->shared_params && !st_arena_is_sizing(me->arena);
    for (size_t i = 0; copy && me->master16 && i < n_segs; i++) {
        /* bf16 master shards: the first holder's values rounded there */
        const comm_seg *g = &me->segs[i];
        const comm_slot *first = &pl->slots[me->holders[g->holder_first]];
        int inside;
        for (size_t at = g->begin, to; at < g->end; at = to) {
            to = st_ranges_piece(pl->bf16_master, pl->n_bf16_master, at, g->end, &inside);
            if (inside)
                st_bf16_round_n(me->master16 + (at - sb), local_at(first, first->params, at),
                                to - at);
            else
                memcpy(me->master + (at - sb), local_at(first, first->params, at),
                       (to - at) * sizeof(float));
        }
    }
    for (size_t i = 0; copy && !me->master16 && i < n_segs; i++) {
        const comm_seg *g = &me->segs[i];
        const comm_slot *first = &pl->slots[me->holders[g->holder_first]];
        const int nc = pl->copies_master ? first->n_own_copies : 0;
        size_t at = g->begin;   /* a bf16 master's copied elements are not read */
        for (int c = 0; c <= nc && at < g->end; c++) {
            const st_param_copy *cp = c < nc ? &first->own_copies[c] : NULL;
            const size_t lo = cp ? cp->offset : g->end, hi = cp ? lo + cp->count : g->end;
            const size_t to = lo < g->end ? (lo > at ? lo : at) : g->end;
            if (to > at)
                memcpy(me->master + (at - sb), local_at(first, first->params, at),
                       (to - at) * sizeof(float));
            if (hi > at)
                at = hi;
        }
    }
    if (pl->n_domains > 1) {
        void *p;
        ST_TRY(st_arena_alloc(me->arena, ST_MEM_WORKSPACE,
                              n_segs * (size_t)pl->n_domains * sizeof *me->seg_src, &p));
        me->seg_src = p;
        ST_TRY(st_arena_alloc_floats(me->arena, ST_MEM_WORKSPACE, ST_CHUNK, &me->scratch));
    }
    return ST_OK;
}

/* Holders of segment g of so's shard that are in domain d: so->holders
 * [*h0, *h1) (contiguous: holders are sorted, domains consecutive). */
static void domain_holders(const comm_plan *pl, const comm_slot *so, size_t g, int d,
                           size_t *h0, size_t *h1)
{
    const comm_seg *seg = &so->segs[g];
    size_t i = seg->holder_first, e = i + seg->count;
    int lo = pl->domain_first[d], hi = pl->domain_first[d + 1];
    while (i < e && so->holders[i] < lo)
        i++;
    *h0 = i;
    while (i < e && so->holders[i] < hi)
        i++;
    *h1 = i;
}

/* A computer's partials sit back to back in one buffer; rounding each up
 * to 16 floats starts every partial on a 64-byte line, like the shards,
 * so the loops that write and read it start aligned. */
static size_t round_up_block(size_t n)
{
    return (n + ST_COMM_SHARD_ALIGN - 1) / ST_COMM_SHARD_ALIGN * ST_COMM_SHARD_ALIGN;
}

/* An all-gather copy of n elements, read just counted: its read and its
 * write are the all-gather's. */
static void count_gather(comm_slot *me, size_t n)
{
    me->bytes.written += n * sizeof(float);
    me->bytes.gather_read += n * sizeof(float);
    me->bytes.gather_written += n * sizeof(float);
}

static void count_read_bytes(comm_slot *me, size_t bytes, int src_domain)
{
    me->bytes.read += bytes;
    if (src_domain != me->domain)
        me->bytes.cross_domain_read += bytes;
}

static void count_read(comm_slot *me, size_t n, int src_domain)
{
    count_read_bytes(me, n * sizeof(float), src_domain);
}

typedef struct plan_count {
    size_t rs1, ops1, partial, ag1, ag2;
    size_t copied;            /* elements of w's bf16 copies its items write */
    size_t packed;            /* elements of w's blocked copies its items pack */
    size_t misfit16;          /* bf16 master shards: 1 + the first element w
                               * holds in a copy outside the ranges, or
                               * outside a copy inside them; 0: none */
} plan_count;

/* Appends the all-gather item dst[0..n) = src[0..n) to list at *at (only
 * counts when !fill; fill also accounts the bytes, src in src_domain), cut
 * where w's bf16 weight copies begin and end: each piece is inside one
 * copy (and writes its bf16 too) or outside all of them.  The copies are
 * sorted and disjoint (st_model_copies); a list that is not leaves some
 * copied element unwritten, and then the plan does not claim the copies
 * (st_comm_plan_tasks).  With copies_master a piece inside a copy is
 * brought in as bf16 from `from`'s copy (the owner's, or the copier's),
 * nothing where `from` is w; with bf16 master shards from the owner's
 * (m16: its element at dst[0], whose full index is `full`), w's too.
 * Cut also where w's blocked copies begin and end (sorted, disjoint, and
 * apart from the bf16 copies): a piece inside one packs it as it copies. */
static void push_ag(const comm_plan *pl, comm_slot *me, ag_item *list, size_t *at, int fill,
                    plan_count *k, float *dst, const float *src, size_t n,
                    const comm_slot *from, int src_domain, size_t full, const uint16_t *m16)
{
    const size_t off = (size_t)(dst - me->params);
    int c = 0, b = 0;
    while (c < me->n_copies && me->copies[c].offset + me->copies[c].count <= off)
        c++;
    for (size_t pos = 0; pos < n;) {
        const size_t x = off + pos;
        size_t len = n - pos;
        uint16_t *half = NULL;
        const uint16_t *src16 = NULL;
        const st_param_blocked *blk = NULL;
        while (b < me->n_blocked && st_blocked_end(&me->blocked[b]) <= x)
            b++;
        if (b < me->n_blocked && me->blocked[b].offset <= x) {   /* inside blocked copy b */
            blk = &me->blocked[b];
            if (st_blocked_end(blk) - x < len)
                len = st_blocked_end(blk) - x;
        } else if (b < me->n_blocked && me->blocked[b].offset - x < len) {
            len = me->blocked[b].offset - x;
        }
        if (c < me->n_copies && me->copies[c].offset <= x) {   /* inside copy c */
            const st_param_copy *cp = &me->copies[c];
            const size_t end = cp->offset + cp->count;
            if (end - x <= len)
                len = end - x;
            half = cp->bf16 + (x - cp->offset);
            if (pl->copies_master)   /* the same list on every worker */
                src16 = from->own_copies[c].bf16 + (x - cp->offset);
            else if (m16)   /* the owner's bf16 master shard */
                src16 = m16 + pos;
            if (end - x == len)
                c++;
            if (fill)
                k->copied += len;
            if (fill && !(pl->copies_master && from == me)) {
                me->bytes.written += len * sizeof(uint16_t);
                me->bytes.gather_written += len * sizeof(uint16_t);
            }
        } else if (c < me->n_copies && me->copies[c].offset - x < len) {
            len = me->copies[c].offset - x;   /* up to the next copy */
        }
        if (fill && pl->n_bf16_master && !k->misfit16 &&
            bf16_inside(pl, full + pos, len) != (half && src16 ? 1 : 0))
            k->misfit16 = 1 + full + pos;
        if (pl->copies_master && src16 && from == me) {   /* w's own copy: its update wrote it */
            pos += len;
            continue;
        }
        if (fill && src16) {
            count_read_bytes(me, len * sizeof(uint16_t), src_domain);
            me->bytes.gather_read += len * sizeof(uint16_t);
        } else if (fill) {
            count_read(me, len, src_domain);
            count_gather(me, len);
        }
        if (fill && blk && !half && !src16 && !pl->shared_params) {
            k->packed += len;
            me->bytes.written += len * sizeof(uint16_t) * (size_t)blk->n;
            me->bytes.gather_written += len * sizeof(uint16_t) * (size_t)blk->n;
        } else {
            blk = NULL;
        }
        if (fill && src16)
            list[*at] = (ag_item){ NULL, (const float *)(const void *)src16, len, half, NULL, 0 };
        else if (fill)
            list[*at] = (ag_item){ dst + pos, src + pos, len, half, blk, x };
        (*at)++;
        pos += len;
    }
}

/* Worker w's level-1 items and all-gather items: one walk over every
 * shard's segments, the same walk (and so the same assignments) on every
 * worker of w's domain.  fill = 0 counts, fill = 1 writes into the arrays
 * sized by the count and accounts the bytes. */
static void plan_tasks(comm_plan *pl, int w, size_t *load_p, size_t *load_c, int fill,
                       plan_count *k)
{
    comm_slot *me = &pl->slots[w];
    int dw = me->domain, D = pl->n_domains;
    int df = pl->domain_first[dw];
    size_t m = (size_t)(pl->domain_first[dw + 1] - df);
    memset(k, 0, sizeof *k);
    memset(load_p, 0, m * sizeof *load_p);
    memset(load_c, 0, m * sizeof *load_c);
    for (int s = 0; s < pl->n_workers; s++) {
        comm_slot *so = &pl->slots[s];
        size_t sb = pl->shard_begin[s];
        int local = so->domain == dw;
        for (size_t g = 0; g < so->n_segs; g++) {
            const comm_seg *seg = &so->segs[g];
            size_t n = seg->end - seg->begin, h0, h1;
            domain_holders(pl, so, g, dw, &h0, &h1);
            if (h0 == h1)
                continue;
            int holds = 0;
            for (size_t i = h0; i < h1; i++)
                holds |= so->holders[i] == w;
            const int gather = pl->roles & ST_COMM_GATHER, reduce = pl->roles & ST_COMM_REDUCE;
            if (local) {
                /* own domain's shard: straight from the owner's master
                 * (shared: the owner updated it in the domain's vector) */
                if (holds && gather && !pl->shared_params)
                    push_ag(pl, me, me->ag1, &k->ag1, fill, k,
                            local_at(me, me->params, seg->begin),
                            so->master + (seg->begin - sb), n, so, so->domain, seg->begin,
                            so->master16 ? so->master16 + (seg->begin - sb) : NULL);
                continue;
            }
            if (h1 - h0 >= 2 && reduce) {
                /* a partial of this domain's holders, for the remote owner */
                size_t j = st_comm_least_loaded(load_p, m);
                load_p[j] += n;
                if (df + (int)j == w) {
                    if (fill) {
                        float *out = me->partials + k->partial;
                        me->rs1[k->rs1] = (rs_item){ out, n, k->ops1, h1 - h0 - 1, 1.0f };
                        me->rs1_at[k->rs1] = seg->begin;
                        rs_op *op = me->ops1 + k->ops1;
                        grad_src a = source_of(pl, so->holders[h0], seg->begin);
                        grad_src b = source_of(pl, so->holders[h0 + 1], seg->begin);
                        op[0] = (rs_op){ a.p, b.p, OP_SUM2, 0, 0, a.kind, b.kind };
                        for (size_t i = h0 + 2; i < h1; i++) {
                            grad_src c = source_of(pl, so->holders[i], seg->begin);
                            op[i - h0 - 1] = (rs_op){ c.p, NULL, OP_ACC, 0, 0, c.kind, 0 };
                        }
                        so->seg_src[g * (size_t)D + (size_t)dw] = out;
                        for (size_t i = h0; i < h1; i++)
                            count_read_bytes(me, n * source_of(pl, so->holders[i], seg->begin).elt,
                                             pl->slots[so->holders[i]].domain);
                        me->bytes.written += n * sizeof(float);
                    }
                    k->rs1++;
                    k->ops1 += h1 - h0 - 1;
                    k->partial += round_up_block(n);
                }
            }
            /* the all-gather: one holder of this domain brings the segment in */
            int copier = so->holders[h0];
            if (h1 - h0 >= 2) {
                size_t best = h0;
                for (size_t i = h0 + 1; i < h1; i++)
                    if (load_c[so->holders[i] - df] < load_c[so->holders[best] - df])
                        best = i;
                copier = so->holders[best];
            }
            load_c[copier - df] += n;
            if (!holds || !gather)
                continue;
            if (copier == w) {
                push_ag(pl, me, me->ag1, &k->ag1, fill, k, local_at(me, me->params, seg->begin),
                        so->master + (seg->begin - sb), n, so, so->domain, seg->begin,
                        so->master16 ? so->master16 + (seg->begin - sb) : NULL);
            } else if (!pl->shared_params) {   /* shared: the copier's vector is w's */
                const comm_slot *cs = &pl->slots[copier];
                push_ag(pl, me, me->ag2, &k->ag2, fill, k, local_at(me, me->params, seg->begin),
                        local_at(cs, cs->params, seg->begin), n, cs, cs->domain, seg->begin,
                        NULL);
            }
        }
    }
}

/* copies_master: every worker lists the copies w lists (push_ag reads
 * theirs by w's index). */
static st_status check_copies_alike(const comm_plan *pl, int w)
{
    const comm_slot *me = &pl->slots[w];
    for (int s = 0; pl->copies_master && s < pl->n_workers; s++) {
        const comm_slot *o = &pl->slots[s];
        int same = o->n_own_copies == me->n_copies;
        for (int c = 0; same && c < me->n_copies; c++)
            same = o->own_copies[c].offset == me->copies[c].offset &&
                   o->own_copies[c].count == me->copies[c].count;
        if (!same)
            return st_fail(ST_ERR_INVALID, "workers %d and %d list different bf16 copies: they "
                           "cannot hold a bf16 master", w, s);
    }
    return ST_OK;
}

st_status st_comm_plan_tasks(comm_plan *pl, int w)
{
    ST_TRY(check_copies_alike(pl, w));
    comm_slot *me = &pl->slots[w];
    int dw = me->domain;
    size_t m = (size_t)(pl->domain_first[dw + 1] - pl->domain_first[dw]);
    size_t *load = malloc(2 * m * sizeof *load);
    if (!load)
        return st_fail(ST_ERR_NOMEM, "worker %d: out of memory planning the reduction", w);
    plan_count k;
    plan_tasks(pl, w, load, load + m, 0, &k);
    st_status s = ST_OK;
    void *p;
    if (k.rs1) {
        ST_TRY_GOTO(s, st_arena_alloc(me->arena, ST_MEM_WORKSPACE, k.rs1 * sizeof *me->rs1, &p),
                    out);
        me->rs1 = p;
        ST_TRY_GOTO(s, st_arena_alloc(me->arena, ST_MEM_WORKSPACE, k.rs1 * sizeof *me->rs1_at,
                                      &p), out);
        me->rs1_at = p;
        ST_TRY_GOTO(s, st_arena_alloc(me->arena, ST_MEM_WORKSPACE, k.ops1 * sizeof *me->ops1, &p),
                    out);
        me->ops1 = p;
        ST_TRY_GOTO(s, st_arena_alloc_floats(me->arena, ST_MEM_GRADIENTS, k.partial,
                                             &me->partials), out);
    }
    if (k.ag1) {
        ST_TRY_GOTO(s, st_arena_alloc(me->arena, ST_MEM_WORKSPACE, k.ag1 * sizeof *me->ag1, &p),
                    out);
        me->ag1 = p;
    }
    if (k.ag2) {
        ST_TRY_GOTO(s, st_arena_alloc(me->arena, ST_MEM_WORKSPACE, k.ag2 * sizeof *me->ag2, &p),
                    out);
        me->ag2 = p;
    }
    plan_tasks(pl, w, load, load + m, 1, &k);
    if (k.misfit16) {
        s = st_fail(ST_ERR_INVALID, "worker %d holds element %zu %s its bf16 copies, but %s "
                    "the bf16 master ranges", w, k.misfit16 - 1,
                    bf16_inside(pl, k.misfit16 - 1, 1) ? "outside" : "inside",
                    bf16_inside(pl, k.misfit16 - 1, 1) ? "inside" : "outside");
        goto out;
    }
    me->n_rs1 = k.rs1;
    me->n_ag1 = k.ag1;
    me->n_ag2 = k.ag2;
    /* the copies are the model's to convert unless every element of them
     * comes with the all-gather */
    size_t want = 0;
    for (int i = 0; i < me->n_copies; i++)
        want += me->copies[i].count;
    me->copies_gathered = me->n_copies > 0 && (pl->shared_params || k.copied == want);
    me->copies = NULL;   /* read by this attach only (comm.h) */
    me->n_copies = 0;
    /* and the blocked copies unless every element of them is packed; a
     * shared vector's are its domain's, which the updates pack */
    want = 0;
    for (int i = 0; i < me->n_blocked; i++)
        want += (size_t)(me->blocked[i].rows * me->blocked[i].cols);
    me->blocked_gathered = me->n_blocked > 0 && !pl->shared_params && k.packed == want;
    me->blocked = NULL;
    me->n_blocked = 0;
out:
    free(load);
    return s;
}

/* An fp32 source of the level-2 program (a partial, the scratch chunk). */
static grad_src f32_src(const float *p)
{
    return (grad_src){ p, SRC_F32, sizeof(float) };
}

/* Appends one op of w's level-2 program (fill: writes it and accounts the
 * bytes of its sources). */
static void emit_op(comm_slot *me, int fill, size_t *n_ops, size_t n, int kind, int to_tmp,
                    grad_src a, int a_domain, grad_src b, int b_domain)
{
    if (fill) {
        me->ops2[*n_ops] = (rs_op){ a.p, b.p, (uint8_t)kind, (uint8_t)to_tmp, 0, a.kind,
                                    b.kind };
        if (a.p)
            count_read_bytes(me, n * a.elt, a_domain);
        if (b.p)
            count_read_bytes(me, n * b.elt, b_domain);
    }
    (*n_ops)++;
}

/* The owner's level-2 program: per segment, the domains in increasing
 * order, each its holders summed in increasing order (the own domain's
 * directly from their gradients, a remote domain's as its partial or its
 * single holder's gradient), then one division by the holder count. */
st_status st_comm_plan_owner(comm_plan *pl, int w)
{
    comm_slot *me = &pl->slots[w];
    if (!(pl->roles & ST_COMM_REDUCE)) {
        me->n_rs2 = 0;
        return ST_OK;
    }
    int dw = me->domain, D = pl->n_domains;
    size_t sb = pl->shard_begin[w], n_ops = 0;
    for (int fill = 0; fill < 2; fill++) {
        if (fill && me->n_segs) {
            void *p;
            ST_TRY(st_arena_alloc(me->arena, ST_MEM_WORKSPACE, me->n_segs * sizeof *me->rs2, &p));
            me->rs2 = p;
            ST_TRY(st_arena_alloc(me->arena, ST_MEM_WORKSPACE, n_ops * sizeof *me->ops2, &p));
            me->ops2 = p;
        }
        n_ops = 0;
        for (size_t g = 0; g < me->n_segs; g++) {
            const comm_seg *seg = &me->segs[g];
            size_t n = seg->end - seg->begin, first_op = n_ops;
            int first = 1;
            for (int d = 0; d < D; d++) {
                size_t h0, h1;
                domain_holders(pl, me, g, d, &h0, &h1);
                if (h0 == h1)
                    continue;
                const grad_src none = f32_src(NULL);
                grad_src s0 = source_of(pl, me->holders[h0], seg->begin);
                if (d == dw && h1 - h0 == 1) {
                    emit_op(me, fill, &n_ops, n, first ? OP_COPY : OP_ACC, 0, s0, d, none, d);
                } else if (d == dw) {
                    /* the own domain's partial: into the output if it comes
                     * first, else into the scratch chunk, then added */
                    emit_op(me, fill, &n_ops, n, OP_SUM2, !first, s0, d,
                            source_of(pl, me->holders[h0 + 1], seg->begin), d);
                    for (size_t i = h0 + 2; i < h1; i++)
                        emit_op(me, fill, &n_ops, n, OP_ACC, !first,
                                source_of(pl, me->holders[i], seg->begin), d, none, d);
                    if (!first)
                        emit_op(me, fill, &n_ops, n, OP_ACC, 0, none, dw, none, d);
                } else {
                    grad_src src = s0;
                    if (h1 - h0 >= 2) {
                        src = f32_src(me->seg_src[g * (size_t)D + (size_t)d]);
                        if (!src.p)
                            return st_fail(ST_ERR_INVALID, "worker %d: internal error: no "
                                           "partial of domain %d for elements [%zu, %zu)", w, d,
                                           seg->begin, seg->end);
                    }
                    emit_op(me, fill, &n_ops, n, first ? OP_COPY : OP_ACC, 0, src, d, none, d);
                }
                first = 0;
            }
            if (fill) {
                me->ops2[n_ops - 1].divide = seg->count > 1;
                me->rs2[g] = (rs_item){ me->shard_grad + (seg->begin - sb), n, first_op,
                                        n_ops - first_op, (float)seg->count };
                me->bytes.written += n * sizeof(float);
            }
        }
    }
    me->n_rs2 = me->n_segs;
    return ST_OK;
}


void st_comm_plan_finish(comm_plan *pl, int w)
{
    comm_slot *me = &pl->slots[w];
    me->rs_mid_barrier = 0;
    me->ag_mid_barrier = 0;
    for (int v = 0; v < pl->n_workers; v++) {
        me->rs_mid_barrier |= pl->slots[v].n_rs1 > 0;
        me->ag_mid_barrier |= pl->slots[v].n_ag2 > 0;
    }
    me->ag_exit_barrier = pl->shared_params && pl->n_domains > 1;
}

/*
 * comm/comm.c — the reduction engine: reduce-scatter to shard owners,
 * all-gather back to the replicas, one or two levels (NUMA domains).
 *
 * Everything is planned once, in st_comm_attach(); a step only runs the
 * plan.  Three kinds of precomputed work items:
 *
 *   rs items   "out[0..n) = combination of some source arrays": a short
 *              program of ops (copy, a + b, +=, the last one optionally
 *              divided by the holder count), run in chunks of ST_CHUNK
 *              floats so that the output chunk (and the scratch chunk of a
 *              local partial) stays in L1 while every source is streamed
 *              from memory exactly once.  Level 1 (remote domains' partials)
 *              and level 2 (the owner's shard gradient) are both rs items.
 *   ag items   "copy n floats from src to dst": all-gather phase 1 (from an
 *              owner's master shard) and phase 2 (from a copier's replica
 *              in the same domain).
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
 * the bitwise reproducibility.
 */
#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/comm.h>

#include "comm/barrier.h"
#include "core/error.h"

#define SHARD_ALIGN 16          /* floats: shard boundaries on 64-byte lines */
#define ST_CHUNK 2048           /* floats per pass of the summing loops (8 KiB) */
#define MAX_WORKERS 65535       /* holder ids and counts are uint16 */

/* Clones of the hot loops for wider vector units, picked at load time (as
 * in optim/optim.c).  Not under ThreadSanitizer: the clones' ifunc
 * resolvers run before its runtime is up and crash the loader. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(__SANITIZE_THREAD__)
#define ST_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ST_VECTOR_CLONES
#endif

/* ------------------------------------------------------------ structures */

/* A run of the owner's shard with a constant set of holders. */
typedef struct comm_seg {
    size_t begin, end;        /* absolute indices into the vector */
    size_t holder_first;      /* index of its first holder in slot->holders */
    uint16_t count;           /* number of holders: the divisor */
} comm_seg;

enum { OP_COPY, OP_SUM2, OP_ACC };

/* One pass over an rs item's chunk. a and b point at element 0 of the item
 * in their source; a == NULL means the scratch chunk. */
typedef struct rs_op {
    const float *a, *b;
    uint8_t kind;
    uint8_t to_tmp;           /* destination: the scratch chunk, not the output */
    uint8_t divide;           /* divide the result by the item's count */
} rs_op;

typedef struct rs_item {
    float *out;
    size_t n;
    size_t op_first, n_ops;
    float count;
} rs_item;

typedef struct ag_item {
    float *dst;
    const float *src;
    size_t n;
} ag_item;

typedef struct comm_slot {
    alignas(64) atomic_int attached;
    int ready;                /* attach completed: the plan below is valid */
    int domain;               /* dense domain index */
    st_arena *arena;
    /* registered by attach, read by everyone after the first barrier */
    float *grads, *params;
    st_range *held;
    size_t *local;            /* held[i] starts at grads/params + local[i] */
    int n_held;
    float *master, *shard_grad;
    float *shard_out;         /* the caller's buffer for shard_grad, or NULL
                               * (st_comm_set_shard_output; survives a reset) */
    /* the owner's segments (read by everyone after the second barrier) */
    comm_seg *segs;
    size_t n_segs;
    uint16_t *holders;
    const float **seg_src;    /* [seg * n_domains + d]: the partial of domain d
                               * (>= 2 holders there), set by its computer */
    /* the step's program */
    rs_item *rs1, *rs2;       /* level 1 (partials for remote owners), level 2 */
    size_t n_rs1, n_rs2;
    rs_op *ops1, *ops2;
    ag_item *ag1, *ag2;       /* all-gather phases 1 and 2 */
    size_t n_ag1, n_ag2;
    float *partials;
    float *scratch;           /* ST_CHUNK floats, for a local partial */
    int rs_mid_barrier, ag_mid_barrier;
    st_comm_bytes bytes;
} comm_slot;

struct st_comm {
    int roles;                /* ST_COMM_REDUCE | ST_COMM_GATHER */
    int allow_unheld;         /* elements nobody holds are skipped */
    st_range *unheld_ranges;  /* where they may be (NULL: anywhere) */
    int n_unheld_ranges;
    st_spin_barrier barrier;
    int n_workers, n_domains;
    size_t n_params;
    int *domain_of;           /* dense domain index of each worker */
    int *domain_first;        /* n_domains + 1 */
    size_t *shard_begin;      /* n_workers + 1 */
    comm_slot *slots;
};

/* ------------------------------------------------------------ helpers */

static size_t min_size(size_t a, size_t b)
{
    return a < b ? a : b;
}

/* Shard boundaries: ceil(P / 16) blocks of 16 floats split as evenly as
 * possible (the first P_blocks mod N shards get one more); the last block
 * may be partial, and shards past the last block are empty. */
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
static float *grad_of(const st_comm *c, int v, size_t x)
{
    return local_at(&c->slots[v], c->slots[v].grads, x);
}

static void compute_shards(size_t n_params, int n, size_t *begin)
{
    size_t blocks = n_params / SHARD_ALIGN + (n_params % SHARD_ALIGN != 0);
    size_t q = blocks / (size_t)n, r = blocks % (size_t)n;
    for (int w = 0; w <= n; w++) {
        size_t b = (size_t)w * q + min_size((size_t)w, r);
        begin[w] = min_size(b * SHARD_ALIGN, n_params);
    }
}

/* Dense domain indices from domain_of (NULL: all 0). */
static st_status map_domains(int n, const int *domain_of, int *dense, int *domain_first,
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

static st_status check_config(int n_workers, size_t n_params)
{
    if (n_workers < 1 || n_workers > MAX_WORKERS)
        return st_fail(ST_ERR_INVALID, "number of workers must be in [1, %d], got %d",
                       MAX_WORKERS, n_workers);
    if (n_params < 1)
        return st_fail(ST_ERR_INVALID, "the parameter vector must have at least 1 element");
    if (n_params > SIZE_MAX / sizeof(float) / 2)
        return st_fail(ST_ERR_INVALID, "%zu parameters is more than can be addressed", n_params);
    return ST_OK;
}

static st_status another_failed(void)
{
    return st_fail(ST_ERR_INVALID, "another worker failed");
}

/* ------------------------------------------------------------ kernels */

ST_VECTOR_CLONES
static void k_copy_div(float *restrict o, const float *restrict a, size_t n, float d)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        o[i] = a[i] / d;
}

ST_VECTOR_CLONES
static void k_sum2(float *restrict o, const float *restrict a, const float *restrict b, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        o[i] = a[i] + b[i];
}

ST_VECTOR_CLONES
static void k_sum2_div(float *restrict o, const float *restrict a, const float *restrict b,
                       size_t n, float d)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        o[i] = (a[i] + b[i]) / d;
}

ST_VECTOR_CLONES
static void k_acc(float *restrict o, const float *restrict a, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        o[i] += a[i];
}

ST_VECTOR_CLONES
static void k_acc_div(float *restrict o, const float *restrict a, size_t n, float d)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        o[i] = (o[i] + a[i]) / d;
}

static void run_rs(const rs_item *items, size_t n_items, const rs_op *ops, float *tmp)
{
    for (size_t t = 0; t < n_items; t++) {
        const rs_item *it = &items[t];
        const rs_op *first = ops + it->op_first, *last = first + it->n_ops;
        for (size_t off = 0; off < it->n; off += ST_CHUNK) {
            size_t n = min_size(ST_CHUNK, it->n - off);
            for (const rs_op *op = first; op < last; op++) {
                float *o = op->to_tmp ? tmp : it->out + off;
                const float *a = op->a ? op->a + off : tmp;
                switch (op->kind) {
                case OP_COPY:
                    if (op->divide)
                        k_copy_div(o, a, n, it->count);
                    else
                        memcpy(o, a, n * sizeof *o);
                    break;
                case OP_SUM2:
                    if (op->divide)
                        k_sum2_div(o, a, op->b + off, n, it->count);
                    else
                        k_sum2(o, a, op->b + off, n);
                    break;
                default:
                    if (op->divide)
                        k_acc_div(o, a, n, it->count);
                    else
                        k_acc(o, a, n);
                    break;
                }
            }
        }
    }
}

static void run_ag(const ag_item *items, size_t n_items)
{
    for (size_t t = 0; t < n_items; t++)
        memcpy(items[t].dst, items[t].src, items[t].n * sizeof(float));
}

/* ------------------------------------------------------------ create */

st_status st_comm_create(const st_comm_config *cfg, st_comm **out)
{
    *out = NULL;
    if (!cfg)
        return st_fail(ST_ERR_INVALID, "st_comm_create: no configuration");
    ST_TRY(check_config(cfg->n_workers, cfg->n_params));
    int n = cfg->n_workers, n_domains;
    ST_TRY(map_domains(n, cfg->domain_of, NULL, NULL, &n_domains));

    size_t cbytes = (sizeof(st_comm) + 63) / 64 * 64;
    st_comm *c = aligned_alloc(64, cbytes);
    if (!c)
        return st_fail(ST_ERR_NOMEM, "out of memory creating the reduction engine");
    memset(c, 0, sizeof *c);
    c->n_workers = n;
    c->roles = cfg->roles ? cfg->roles : ST_COMM_REDUCE | ST_COMM_GATHER;
    c->allow_unheld = cfg->allow_unheld;
    if (cfg->allow_unheld && cfg->unheld_ranges && cfg->n_unheld_ranges > 0) {
        c->unheld_ranges = malloc((size_t)cfg->n_unheld_ranges * sizeof *c->unheld_ranges);
        if (!c->unheld_ranges) {
            free(c);
            return st_fail(ST_ERR_NOMEM, "out of memory creating the reduction engine");
        }
        memcpy(c->unheld_ranges, cfg->unheld_ranges,
               (size_t)cfg->n_unheld_ranges * sizeof *c->unheld_ranges);
        c->n_unheld_ranges = cfg->n_unheld_ranges;
    }
    c->n_params = cfg->n_params;
    c->n_domains = n_domains;
    c->domain_of = malloc((size_t)n * sizeof *c->domain_of);
    c->domain_first = malloc(((size_t)n_domains + 1) * sizeof *c->domain_first);
    c->shard_begin = malloc(((size_t)n + 1) * sizeof *c->shard_begin);
    c->slots = aligned_alloc(64, (size_t)n * sizeof *c->slots);
    if (!c->domain_of || !c->domain_first || !c->shard_begin || !c->slots) {
        st_comm_destroy(c);
        return st_fail(ST_ERR_NOMEM, "out of memory creating the reduction engine for %d workers",
                       n);
    }
    memset(c->slots, 0, (size_t)n * sizeof *c->slots);
    map_domains(n, cfg->domain_of, c->domain_of, c->domain_first, &n_domains);
    compute_shards(c->n_params, n, c->shard_begin);
    for (int w = 0; w < n; w++) {
        atomic_init(&c->slots[w].attached, 0);
        c->slots[w].domain = c->domain_of[w];
    }
    st_spin_barrier_init(&c->barrier, (unsigned)n);
    *out = c;
    return ST_OK;
}

void st_comm_set_shard_output(st_comm *c, int w, float *out)
{
    c->slots[w].shard_out = out;
}

void st_comm_reset(st_comm *c)
{
    for (int w = 0; w < c->n_workers; w++) {
        comm_slot *s = &c->slots[w];
        int domain = s->domain;
        float *out = s->shard_out;
        memset(s, 0, sizeof *s);
        s->domain = domain;
        s->shard_out = out;
        atomic_init(&s->attached, 0);
    }
}

void st_comm_destroy(st_comm *c)
{
    if (!c)
        return;
    free(c->unheld_ranges);
    free(c->domain_of);
    free(c->domain_first);
    free(c->shard_begin);
    free(c->slots);
    free(c);
}

/* ------------------------------------------------------------ attach */

static st_status check_attach_args(const st_comm *c, int w, const st_arena *arena,
                                   const float *grads, const float *params,
                                   const st_range *held, int n_held)
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
        if (r->end > c->n_params)
            return st_fail(ST_ERR_INVALID, "worker %d: held range %d [%zu, %zu) is out of range: "
                           "the vector has %zu elements", w, i, r->begin, r->end, c->n_params);
        if (i > 0 && r->begin < held[i - 1].end)
            return st_fail(ST_ERR_INVALID, "worker %d: held ranges %d [%zu, %zu) and %d "
                           "[%zu, %zu) overlap or are not sorted", w, i - 1, held[i - 1].begin,
                           held[i - 1].end, i, r->begin, r->end);
    }
    return ST_OK;
}

/* The end of the allowed-unheld range containing pos, or pos if none
 * (with allow_unheld and no list: everything is allowed). */
static size_t unheld_allowed_until(const st_comm *c, size_t pos)
{
    if (!c->allow_unheld)
        return pos;
    if (!c->unheld_ranges)
        return c->n_params;
    for (int i = 0; i < c->n_unheld_ranges; i++)
        if (c->unheld_ranges[i].begin <= pos && pos < c->unheld_ranges[i].end)
            return c->unheld_ranges[i].end;
    return pos;
}

/* Every element held by at least one worker, except where unheld elements
 * are allowed: a sweep over all workers' sorted ranges.  Every worker runs
 * it and reports the same element. */
static st_status check_coverage(const st_comm *c)
{
    int n = c->n_workers;
    int *cur = calloc((size_t)n, sizeof *cur);
    if (!cur)
        return st_fail(ST_ERR_NOMEM, "out of memory checking the held ranges");
    size_t pos = 0;
    st_status s = ST_OK;
    while (pos < c->n_params) {
        size_t best = pos, next_held = c->n_params;
        for (int v = 0; v < n; v++) {
            const comm_slot *sv = &c->slots[v];
            while (cur[v] < sv->n_held && sv->held[cur[v]].end <= pos)
                cur[v]++;
            if (cur[v] < sv->n_held && sv->held[cur[v]].begin <= pos && sv->held[cur[v]].end > best)
                best = sv->held[cur[v]].end;
            if (cur[v] < sv->n_held && sv->held[cur[v]].begin > pos &&
                sv->held[cur[v]].begin < next_held)
                next_held = sv->held[cur[v]].begin;
        }
        if (best == pos) {
            size_t allowed = unheld_allowed_until(c, pos);
            if (allowed == pos) {
                s = st_fail(ST_ERR_INVALID, "element %zu of the %zu-element vector is held by "
                            "no worker (every element needs at least one holder%s)", pos,
                            c->n_params, c->allow_unheld ? " outside the ranges allowed to be "
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

static int cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return (x > y) - (x < y);
}

/* Workers holding element x (and so the whole elementary interval starting
 * at x: no range boundary lies inside it), in increasing order. cur[] are
 * per-worker cursors, valid for non-decreasing x. */
static int holders_at(const st_comm *c, size_t x, int *cur, uint16_t *out)
{
    int nh = 0;
    for (int v = 0; v < c->n_workers; v++) {
        const comm_slot *sv = &c->slots[v];
        while (cur[v] < sv->n_held && sv->held[cur[v]].end <= x)
            cur[v]++;
        if (cur[v] < sv->n_held && sv->held[cur[v]].begin <= x)
            out[nh++] = (uint16_t)v;
    }
    return nh;
}

/* Segments of w's shard (two passes: count, then fill), the master shard
 * from each element's first holder, and the tables of the two-level path. */
static st_status build_shard(st_comm *c, int w)
{
    comm_slot *me = &c->slots[w];
    size_t sb = c->shard_begin[w], se = c->shard_begin[w + 1];
    me->n_segs = 0;
    if (sb == se)
        return ST_OK;

    int n = c->n_workers;
    size_t n_cuts = 2;
    for (int v = 0; v < n; v++)
        n_cuts += 2 * (size_t)c->slots[v].n_held;
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
        for (int i = 0; i < c->slots[v].n_held; i++) {
            const st_range *r = &c->slots[v].held[i];
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
            int nh = holders_at(c, cuts[i], cur, now);
            if (nh == 0 && c->allow_unheld) {  /* nobody's: no segment, never touched */
                prev_n = -1;
                continue;
            }
            if (nh == 0) {  /* check_coverage rules this out */
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

    /* master shard <- first holder's parameters */
    for (size_t i = 0; me->master && i < n_segs; i++) {
        const comm_seg *g = &me->segs[i];
        const comm_slot *first = &c->slots[me->holders[g->holder_first]];
        memcpy(me->master + (g->begin - sb), local_at(first, first->params, g->begin),
               (g->end - g->begin) * sizeof(float));
    }
    if (c->n_domains > 1) {
        void *p;
        ST_TRY(st_arena_alloc(me->arena, ST_MEM_WORKSPACE,
                              n_segs * (size_t)c->n_domains * sizeof *me->seg_src, &p));
        me->seg_src = p;
        ST_TRY(st_arena_alloc_floats(me->arena, ST_MEM_WORKSPACE, ST_CHUNK, &me->scratch));
    }
    return ST_OK;
}

/* Holders of segment g of so's shard that are in domain d: so->holders
 * [*h0, *h1) (contiguous: holders are sorted, domains consecutive). */
static void domain_holders(const st_comm *c, const comm_slot *so, size_t g, int d,
                           size_t *h0, size_t *h1)
{
    const comm_seg *seg = &so->segs[g];
    size_t i = seg->holder_first, e = i + seg->count;
    int lo = c->domain_first[d], hi = c->domain_first[d + 1];
    while (i < e && so->holders[i] < lo)
        i++;
    *h0 = i;
    while (i < e && so->holders[i] < hi)
        i++;
    *h1 = i;
}

/* Index of the least loaded of load[0..n), ties to the lowest. */
static size_t least_loaded(const size_t *load, size_t n)
{
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (load[i] < load[best])
            best = i;
    return best;
}

static size_t round_up_block(size_t n)
{
    return (n + SHARD_ALIGN - 1) / SHARD_ALIGN * SHARD_ALIGN;
}

/* An all-gather copy of n elements, read just counted: its read and its
 * write are the all-gather's. */
static void count_gather(comm_slot *me, size_t n)
{
    me->bytes.written += n * sizeof(float);
    me->bytes.gather_read += n * sizeof(float);
    me->bytes.gather_written += n * sizeof(float);
}

static void count_read(comm_slot *me, size_t n, int src_domain)
{
    me->bytes.read += n * sizeof(float);
    if (src_domain != me->domain)
        me->bytes.cross_domain_read += n * sizeof(float);
}

typedef struct plan_count {
    size_t rs1, ops1, partial, ag1, ag2;
} plan_count;

/* Worker w's level-1 items and all-gather items: one walk over every
 * shard's segments, the same walk (and so the same assignments) on every
 * worker of w's domain.  fill = 0 counts, fill = 1 writes into the arrays
 * sized by the count and accounts the bytes. */
static void plan_tasks(st_comm *c, int w, size_t *load_p, size_t *load_c, int fill,
                       plan_count *k)
{
    comm_slot *me = &c->slots[w];
    int dw = me->domain, D = c->n_domains;
    int df = c->domain_first[dw];
    size_t m = (size_t)(c->domain_first[dw + 1] - df);
    memset(k, 0, sizeof *k);
    memset(load_p, 0, m * sizeof *load_p);
    memset(load_c, 0, m * sizeof *load_c);
    for (int s = 0; s < c->n_workers; s++) {
        comm_slot *so = &c->slots[s];
        size_t sb = c->shard_begin[s];
        int local = so->domain == dw;
        for (size_t g = 0; g < so->n_segs; g++) {
            const comm_seg *seg = &so->segs[g];
            size_t n = seg->end - seg->begin, h0, h1;
            domain_holders(c, so, g, dw, &h0, &h1);
            if (h0 == h1)
                continue;
            int holds = 0;
            for (size_t i = h0; i < h1; i++)
                holds |= so->holders[i] == w;
            const int gather = c->roles & ST_COMM_GATHER, reduce = c->roles & ST_COMM_REDUCE;
            if (local) {
                /* own domain's shard: straight from the owner's master */
                if (holds && gather) {
                    if (fill) {
                        me->ag1[k->ag1] = (ag_item){ local_at(me, me->params, seg->begin),
                                                     so->master + (seg->begin - sb), n };
                        count_read(me, n, so->domain);
                        count_gather(me, n);
                    }
                    k->ag1++;
                }
                continue;
            }
            if (h1 - h0 >= 2 && reduce) {
                /* a partial of this domain's holders, for the remote owner */
                size_t j = least_loaded(load_p, m);
                load_p[j] += n;
                if (df + (int)j == w) {
                    if (fill) {
                        float *out = me->partials + k->partial;
                        me->rs1[k->rs1] = (rs_item){ out, n, k->ops1, h1 - h0 - 1, 1.0f };
                        rs_op *op = me->ops1 + k->ops1;
                        op[0] = (rs_op){ grad_of(c, so->holders[h0], seg->begin),
                                         grad_of(c, so->holders[h0 + 1], seg->begin),
                                         OP_SUM2, 0, 0 };
                        for (size_t i = h0 + 2; i < h1; i++)
                            op[i - h0 - 1] = (rs_op){ grad_of(c, so->holders[i], seg->begin),
                                                      NULL, OP_ACC, 0, 0 };
                        so->seg_src[g * (size_t)D + (size_t)dw] = out;
                        for (size_t i = h0; i < h1; i++)
                            count_read(me, n, c->slots[so->holders[i]].domain);
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
                if (fill) {
                    me->ag1[k->ag1] = (ag_item){ local_at(me, me->params, seg->begin),
                                                 so->master + (seg->begin - sb), n };
                    count_read(me, n, so->domain);
                    count_gather(me, n);
                }
                k->ag1++;
            } else {
                if (fill) {
                    me->ag2[k->ag2] = (ag_item){ local_at(me, me->params, seg->begin),
                                                 local_at(&c->slots[copier],
                                                          c->slots[copier].params, seg->begin),
                                                 n };
                    count_read(me, n, c->slots[copier].domain);
                    count_gather(me, n);
                }
                k->ag2++;
            }
        }
    }
}

static st_status build_tasks(st_comm *c, int w)
{
    comm_slot *me = &c->slots[w];
    int dw = me->domain;
    size_t m = (size_t)(c->domain_first[dw + 1] - c->domain_first[dw]);
    size_t *load = malloc(2 * m * sizeof *load);
    if (!load)
        return st_fail(ST_ERR_NOMEM, "worker %d: out of memory planning the reduction", w);
    plan_count k;
    plan_tasks(c, w, load, load + m, 0, &k);
    st_status s = ST_OK;
    void *p;
    if (k.rs1) {
        ST_TRY_GOTO(s, st_arena_alloc(me->arena, ST_MEM_WORKSPACE, k.rs1 * sizeof *me->rs1, &p),
                    out);
        me->rs1 = p;
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
    plan_tasks(c, w, load, load + m, 1, &k);
    me->n_rs1 = k.rs1;
    me->n_ag1 = k.ag1;
    me->n_ag2 = k.ag2;
out:
    free(load);
    return s;
}

/* Appends one op of w's level-2 program (fill: writes it and accounts the
 * bytes of its sources). */
static void emit_op(comm_slot *me, int fill, size_t *n_ops, size_t n, int kind, int to_tmp,
                    const float *a, int a_domain, const float *b, int b_domain)
{
    if (fill) {
        me->ops2[*n_ops] = (rs_op){ a, b, (uint8_t)kind, (uint8_t)to_tmp, 0 };
        if (a)
            count_read(me, n, a_domain);
        if (b)
            count_read(me, n, b_domain);
    }
    (*n_ops)++;
}

/* The owner's level-2 program: per segment, the domains in increasing
 * order, each its holders summed in increasing order (the own domain's
 * directly from their gradients, a remote domain's as its partial or its
 * single holder's gradient), then one division by the holder count. */
static st_status build_rs2(st_comm *c, int w)
{
    comm_slot *me = &c->slots[w];
    if (!(c->roles & ST_COMM_REDUCE)) {
        me->n_rs2 = 0;
        return ST_OK;
    }
    int dw = me->domain, D = c->n_domains;
    size_t sb = c->shard_begin[w], n_ops = 0;
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
                domain_holders(c, me, g, d, &h0, &h1);
                if (h0 == h1)
                    continue;
                const comm_slot *s0 = &c->slots[me->holders[h0]];
                if (d == dw && h1 - h0 == 1) {
                    emit_op(me, fill, &n_ops, n, first ? OP_COPY : OP_ACC, 0,
                            local_at(s0, s0->grads, seg->begin), d, NULL, d);
                } else if (d == dw) {
                    /* the own domain's partial: into the output if it comes
                     * first, else into the scratch chunk, then added */
                    const comm_slot *s1 = &c->slots[me->holders[h0 + 1]];
                    emit_op(me, fill, &n_ops, n, OP_SUM2, !first, local_at(s0, s0->grads, seg->begin), d,
                            local_at(s1, s1->grads, seg->begin), d);
                    for (size_t i = h0 + 2; i < h1; i++)
                        emit_op(me, fill, &n_ops, n, OP_ACC, !first,
                                grad_of(c, me->holders[i], seg->begin), d, NULL, d);
                    if (!first)
                        emit_op(me, fill, &n_ops, n, OP_ACC, 0, NULL, dw, NULL, d);
                } else {
                    const float *src = local_at(s0, s0->grads, seg->begin);
                    if (h1 - h0 >= 2) {
                        src = me->seg_src[g * (size_t)D + (size_t)d];
                        if (!src)
                            return st_fail(ST_ERR_INVALID, "worker %d: internal error: no "
                                           "partial of domain %d for elements [%zu, %zu)", w, d,
                                           seg->begin, seg->end);
                    }
                    emit_op(me, fill, &n_ops, n, first ? OP_COPY : OP_ACC, 0, src, d, NULL, d);
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

static st_status attach_register(st_comm *c, int w, st_arena *arena, float *grads,
                                 float *params, const st_range *held, const size_t *local,
                                 int n_held)
{
    comm_slot *me = &c->slots[w];
    me->arena = arena;
    me->grads = grads;
    me->params = params;
    me->n_held = n_held;
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
    size_t len = c->shard_begin[w + 1] - c->shard_begin[w];
    if (c->roles & ST_COMM_GATHER)
        ST_TRY(st_arena_alloc_floats(arena, ST_MEM_WEIGHTS, len, &me->master));
    if ((c->roles & ST_COMM_REDUCE) && me->shard_out) {
        me->shard_grad = me->shard_out;   /* what no reduction writes keeps its value */
    } else if (c->roles & ST_COMM_REDUCE) {
        /* zero-filled by the arena: what no reduction writes (allow_unheld)
         * reads as a zero gradient */
        ST_TRY(st_arena_alloc_floats(arena, ST_MEM_GRADIENTS, len, &me->shard_grad));
    }
    return ST_OK;
}

st_status st_comm_attach(st_comm *c, int w, st_arena *arena, float *grads, float *params,
                         const st_range *held, int n_held)
{
    return st_comm_attach_compact(c, w, arena, grads, params, held, NULL, n_held);
}

st_status st_comm_attach_compact(st_comm *c, int w, st_arena *arena, float *grads,
                                 float *params, const st_range *held, const size_t *local,
                                 int n_held)
{
    if (!c)
        return st_fail(ST_ERR_INVALID, "st_comm_attach: no reduction engine");
    if (w < 0 || w >= c->n_workers) {
        st_comm_abort(c);
        return st_fail(ST_ERR_INVALID, "st_comm_attach: worker %d is out of range [0, %d)", w,
                       c->n_workers);
    }
    comm_slot *me = &c->slots[w];
    st_status s = check_attach_args(c, w, arena, grads, params, held, n_held);
    if (s == ST_OK && atomic_exchange(&me->attached, 1))
        s = st_fail(ST_ERR_INVALID, "worker %d attached twice", w);
    if (s == ST_OK)
        s = attach_register(c, w, arena, grads, params, held, local, n_held);
    if (s != ST_OK) {
        st_comm_abort(c);
        return s;
    }
    /* 1: everyone's pointers, ranges and shard buffers are registered */
    if (st_spin_barrier_wait(&c->barrier))
        return another_failed();
    s = check_coverage(c);
    if (s == ST_OK)
        s = build_shard(c, w);
    if (s != ST_OK) {
        st_comm_abort(c);
        return s;
    }
    /* 2: every shard's segments (and master values) exist */
    if (st_spin_barrier_wait(&c->barrier))
        return another_failed();
    s = build_tasks(c, w);
    if (s != ST_OK) {
        st_comm_abort(c);
        return s;
    }
    /* 3: every partial's address is in its owner's table */
    if (st_spin_barrier_wait(&c->barrier))
        return another_failed();
    s = build_rs2(c, w);
    if (s != ST_OK) {
        st_comm_abort(c);
        return s;
    }
    me->rs_mid_barrier = 0;
    me->ag_mid_barrier = 0;
    for (int v = 0; v < c->n_workers; v++) {
        me->rs_mid_barrier |= c->slots[v].n_rs1 > 0;
        me->ag_mid_barrier |= c->slots[v].n_ag2 > 0;
    }
    me->ready = 1;
    return ST_OK;
}

/* ------------------------------------------------------------ the step */

static st_status step_check(st_comm *c, int w, const char *what)
{
    if (!c)
        return st_fail(ST_ERR_INVALID, "%s: no reduction engine", what);
    if (w < 0 || w >= c->n_workers) {
        st_comm_abort(c);
        return st_fail(ST_ERR_INVALID, "%s: worker %d is out of range [0, %d)", what, w,
                       c->n_workers);
    }
    if (!c->slots[w].ready) {
        st_comm_abort(c);
        return st_fail(ST_ERR_INVALID, "%s: worker %d has not attached", what, w);
    }
    return ST_OK;
}

st_status st_comm_reduce_scatter(st_comm *c, int w)
{
    ST_TRY(step_check(c, w, "reduce-scatter"));
    if (!(c->roles & ST_COMM_REDUCE))
        return st_fail(ST_ERR_INVALID, "reduce-scatter on a gather-only engine");
    comm_slot *me = &c->slots[w];
    /* every gradient vector is complete (and the previous all-gather,
     * which read the master shards, is over everywhere) */
    if (st_spin_barrier_wait(&c->barrier))
        return another_failed();
    if (me->rs_mid_barrier) {
        run_rs(me->rs1, me->n_rs1, me->ops1, me->scratch);
        /* every domain partial is complete */
        if (st_spin_barrier_wait(&c->barrier))
            return another_failed();
    }
    run_rs(me->rs2, me->n_rs2, me->ops2, me->scratch);
    return ST_OK;
}

st_status st_comm_all_gather(st_comm *c, int w)
{
    ST_TRY(step_check(c, w, "all-gather"));
    if (!(c->roles & ST_COMM_GATHER))
        return st_fail(ST_ERR_INVALID, "all-gather on a reduce-only engine");
    comm_slot *me = &c->slots[w];
    /* every master shard is updated (and every owner is done reading the
     * gradients and partials) */
    if (st_spin_barrier_wait(&c->barrier))
        return another_failed();
    run_ag(me->ag1, me->n_ag1);
    if (me->ag_mid_barrier) {
        /* every copier's replica holds the remote segments it brings in */
        if (st_spin_barrier_wait(&c->barrier))
            return another_failed();
        run_ag(me->ag2, me->n_ag2);
    }
    return ST_OK;
}

st_status st_comm_barrier(st_comm *c, int w)
{
    if (!c)
        return st_fail(ST_ERR_INVALID, "barrier: no reduction engine");
    if (w < 0 || w >= c->n_workers) {
        st_comm_abort(c);
        return st_fail(ST_ERR_INVALID, "barrier: worker %d is out of range [0, %d)", w,
                       c->n_workers);
    }
    if (st_spin_barrier_wait(&c->barrier))
        return another_failed();
    return ST_OK;
}

void st_comm_abort(st_comm *c)
{
    if (c)
        st_spin_barrier_abort(&c->barrier);
}

/* ------------------------------------------------------------ queries */

st_range st_comm_shard(const st_comm *c, int w)
{
    st_range r = { 0, 0 };
    if (c && w >= 0 && w < c->n_workers) {
        r.begin = c->shard_begin[w];
        r.end = c->shard_begin[w + 1];
    }
    return r;
}

float *st_comm_shard_grads(st_comm *c, int w)
{
    return c && w >= 0 && w < c->n_workers ? c->slots[w].shard_grad : NULL;
}

float *st_comm_shard_params(st_comm *c, int w)
{
    return c && w >= 0 && w < c->n_workers ? c->slots[w].master : NULL;
}

st_comm_bytes st_comm_bytes_per_step(const st_comm *c, int w)
{
    st_comm_bytes b = { 0, 0, 0, 0, 0 };
    if (c && w >= 0 && w < c->n_workers && c->slots[w].ready)
        b = c->slots[w].bytes;
    return b;
}

double st_comm_ring_bytes(int n_workers, size_t n_params)
{
    if (n_workers < 1)
        return 0.0;
    return 2.0 * (double)(n_workers - 1) / (double)n_workers * (double)n_params * sizeof(float);
}

/* ------------------------------------------------------------ describe */

static double mib(size_t bytes)
{
    return (double)bytes / (1024.0 * 1024.0);
}

static void print_workers(FILE *f, const char *what, int lo, int hi)
{
    if (hi - lo == 1)
        fprintf(f, "%s %d", what, lo);
    else
        fprintf(f, "%ss %d-%d", what, lo, hi - 1);
}

/* The data-parallel plan (everyone holds everything), as st_comm_attach
 * builds it: one segment per non-empty shard, the same assignments. */
void st_comm_describe(FILE *f, int n_workers, const int *domain_of, size_t n_params)
{
    if (!f)
        return;
    int D;
    if (check_config(n_workers, n_params) != ST_OK ||
        map_domains(n_workers, domain_of, NULL, NULL, &D) != ST_OK) {
        fprintf(f, "reduction: cannot describe: %s\n", st_last_error());
        return;
    }
    int n = n_workers;
    int *dom = malloc((size_t)n * sizeof *dom);
    int *first = malloc(((size_t)D + 1) * sizeof *first);
    size_t *sb = malloc(((size_t)n + 1) * sizeof *sb);
    size_t *load = malloc(2 * (size_t)n * sizeof *load);
    if (!dom || !first || !sb || !load) {
        fprintf(f, "reduction: cannot describe: out of memory\n");
        goto out;
    }
    map_domains(n, domain_of, dom, first, &D);
    compute_shards(n_params, n, sb);
    size_t largest = 0;
    for (int w = 0; w < n; w++)
        if (sb[w + 1] - sb[w] > largest)
            largest = sb[w + 1] - sb[w];
    fprintf(f, "reduction: %d worker%s, %d NUMA domain%s, %zu parameters (%.2f MiB); "
            "shard w (up to %zu floats, boundaries on 16-float lines) owned by worker w; %s\n",
            n, n == 1 ? "" : "s", D, D == 1 ? "" : "s", n_params, mib(n_params * sizeof(float)),
            largest, D == 1 ? "single level" : "two levels (domain partials, then owners)");
    for (int d = 0; d < D; d++) {
        int lo = first[d], hi = first[d + 1], m = hi - lo;
        size_t own = sb[hi] - sb[lo], remote = n_params - own;
        fprintf(f, "domain %d: ", d);
        print_workers(f, "worker", lo, hi);
        fprintf(f, " own%s ", m == 1 ? "s" : "");
        print_workers(f, "shard", lo, hi);
        fprintf(f, " = [%zu, %zu) (%.2f MiB)", sb[lo], sb[hi], mib(own * sizeof(float)));
        if (D == 1) {
            fprintf(f, "; each owner sums workers 0-%d in order and divides by %d; the "
                    "all-gather copies every shard from its owner; no cross-domain reads\n",
                    n - 1, n);
            continue;
        }
        fprintf(f, "\n");
        /* level 1: this domain's partials of remote shards */
        size_t *load_p = load, *load_c = load + n;
        memset(load, 0, 2 * (size_t)n * sizeof *load);
        fprintf(f, "  domain %d level 1: ", d);
        if (m == 1) {
            fprintf(f, "no partials (one worker: remote owners read its gradient directly)\n");
        } else {
            fprintf(f, "partials of remote shards, each the sum of workers %d-%d in order, "
                    "written on this node:", lo, hi - 1);
            size_t written = 0;
            for (int s = 0; s < n; s++) {
                size_t len = sb[s + 1] - sb[s];
                if (dom[s] == d || len == 0)
                    continue;
                size_t j = least_loaded(load_p, (size_t)m);
                load_p[j] += len;
                written += len * sizeof(float);
                fprintf(f, " s%d:w%d", s, lo + (int)j);
            }
            fprintf(f, " (%.2f MiB)\n", mib(written));
        }
        /* level 2: what this domain's owners read from other nodes */
        fprintf(f, "  domain %d level 2: owners sum their domain's %d gradient%s, then one "
                "partial (or a lone worker's gradient) from each of the %d other domain%s in "
                "domain order, and divide by %d: %.2f MiB cross-domain per step (single level: "
                "%.2f MiB)\n", d, m, m == 1 ? "" : "s", D - 1, D == 2 ? "" : "s", n,
                mib((size_t)(D - 1) * own * sizeof(float)),
                mib((size_t)(n - m) * own * sizeof(float)));
        /* all-gather: each remote shard enters the domain once */
        fprintf(f, "  domain %d all-gather: remote shards copied in once, by:", d);
        for (int s = 0; s < n; s++) {
            size_t len = sb[s + 1] - sb[s];
            if (dom[s] == d || len == 0)
                continue;
            size_t j = least_loaded(load_c, (size_t)m);
            load_c[j] += len;
            fprintf(f, " s%d:w%d", s, lo + (int)j);
        }
        fprintf(f, "%s: %.2f MiB cross-domain per step (single level: %.2f MiB)\n",
                m > 1 ? ", the others copy from them locally" : "",
                mib(remote * sizeof(float)), mib((size_t)m * remote * sizeof(float)));
    }
out:
    free(dom);
    free(first);
    free(sb);
    free(load);
}

/*
 * comm/mpi.c — the MPI backend: the ranks of an MPI job, each with its own
 * pinned worker threads, reduce over owner shards of the global worker
 * count, hierarchically.
 *
 * R ranks, rank r with n_r workers: global worker g = f_r + w, where f_r =
 * n_0 + ... + n_{r-1}, owns global shard g of st_comm_shards(P, N), N the
 * sum of the n_r, so rank r owns the contiguous run of shards f_r ..
 * f_r + n_r - 1 (its "rank shard").  The ranks are the whole job, or a
 * consecutive range of it (synth's groups of workers, which may start and
 * end inside a rank).  One step:
 *
 *   reduce-scatter
 *     pack     the rank's workers sum, for every element the rank holds,
 *              its local holders' gradients in worker order: one partial
 *              per (element, rank), laid out per destination rank;
 *     exchange local worker 0: one message to each peer — each rank
 *              receives, for its rank shard, the partial of every rank
 *              that holds anything there (holder-count aware: nothing is
 *              sent for an element a rank does not hold);
 *     owner    the owner sums the partials in rank order and divides by
 *              the element's total holder count.
 *   all-gather the same exchange backwards: each owner copies its master
 *              values into the slots the reduce-scatter received into, the
 *              messages return them to the ranks that hold them, and
 *              every worker copies what it holds into its replica (values
 *              of its own rank shard straight from the local owner).
 *
 * Summation order is therefore fixed: within a rank, worker 0, 1, ...;
 * then the ranks in order; then one division.  A layout of R ranks x n
 * workers is bitwise reproducible, and R x 1 is bitwise the shared backend
 * with R workers in one domain (both sum worker 0, 1, ... then divide).
 *
 * In place: a region that is one run of a single local holder's vector
 * (or of one owner's master) is sent from there or received there, and a
 * lone local holder's values are read by the owner where they are: no
 * pack, copy-out or unpack (find_direct).  Data parallelism with one
 * worker a rank copies nothing then but the owner's sum and its shard.
 *
 * Why the messages come from local worker 0 alone, between barriers of the
 * rank's workers: each peer's region is one contiguous run (a buffer's,
 * or a vector's in place), so one message per peer and direction moves
 * it, all posted at once so that MPI schedules them; and
 * MPI_THREAD_SERIALIZED is enough (world.h).  The other workers wait at
 * the spin barrier (comm/barrier.h) meanwhile.
 *
 * Attach (every worker, not the hot path: it may allocate) learns what
 * every rank holds: each rank's profile — its held elements as segments of
 * constant local holders, with their count — is all-gathered, split at the
 * shard boundaries, and every rank computes the same layout of the
 * exchange from the R profiles.  Then each worker turns its part into work
 * items (comm/kernels.h) in its arena: the step only runs them.  The
 * master shards start from the first holder's values (global order)
 * through one extra exchange of parameters.
 *
 * bf16 payloads (st_comm_config.payload, --comm-precision bf16): the pack
 * reads each local gradient rounded to bf16 (SRC_F32_RNE) and sums in
 * fp32; each worker then rounds its part of the partials bound for other
 * ranks into a bf16 send buffer, and the exchange moves those: half the
 * bytes between ranks.  The owner sums in fp32 the bf16 partials of the
 * other ranks (SRC_BF16) and its own rank's, which never left the rank
 * and is not rounded again.  A rank of one worker sends its one rounded
 * gradient, which bf16 holds exactly: R ranks x 1 worker is bitwise the
 * shared engine with R workers and bf16 payloads.  With n > 1 workers a
 * rank, a partial of n rounded gradients is rounded once more on the way
 * out (the price of half the bytes; doc/reduction.md).  The reduce-
 * scatter then sends nothing in place (every partial is converted); the
 * all-gather moves fp32 masters as before.
 *
 * Buffers: the send and receive buffers are worker 0's (its arena, its
 * node); the masters and shard gradients are each owner's.  A rank whose
 * workers span NUMA domains still reduces in one level inside the rank:
 * run a rank per socket (doc/scaling.md).
 */
#ifdef HAVE_MPI

#include <limits.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/comm.h>

#include "comm/backend.h"
#include "comm/barrier.h"
#include "comm/kernels.h"
#include "comm/plan.h"
#include "comm/world_mpi.h"
#include "core/bf16.h"
#include "core/error.h"

/* A segment of one rank's profile: elements [begin, end) with `count`
 * local holders (>= 1), inside one global shard; `off`: where it starts in
 * that rank's region for the shard's rank (its position in the exchange). */
typedef struct prof_seg {
    uint64_t begin, end, count, off;
} prof_seg;

typedef struct mpi_worker {
    alignas(64) atomic_int attached;
    int ready;
    /* registered */
    float *grads, *params;
    st_range *held;
    size_t *local;
    int n_held;
    float *master, *shard_grad, *shard_out;
    st_arena *arena;
    /* the step's program (in the arena) */
    rs_item *pack, *own;
    rs_op *pack_ops, *own_ops;
    size_t n_pack, n_own;
    ag_item *ag_out, *ag_in;
    size_t n_ag_out, n_ag_in;
    float *scratch;
    float *wide;              /* bf16 payloads: 2 x ST_CHUNK, where sources widen */
    st_comm_bytes bytes;
} mpi_worker;

typedef struct mpi_comm {
    st_spin_barrier barrier;
    MPI_Comm comm;
    int rank, size, n, N;
    int *first;               /* R + 1: rank r's workers are global f[r] .. f[r + 1] - 1 */
    size_t P;
    int roles, allow_unheld;
    st_range *unheld;
    int n_unheld;
    size_t *shard_begin;      /* N + 1 */
    mpi_worker *workers;      /* n */
    /* the exchange, made by worker 0 at attach */
    prof_seg **prof;          /* [rank]: its profile, split at shard boundaries */
    size_t *n_prof;
    size_t *send_off, *send_len;   /* [d]: this rank's region for rank d in `send` */
    size_t *recv_off, *recv_len;   /* [s]: rank s's region in `recv` */
    /* Per peer, where the step's exchange reads and writes: the packed
     * region of send or recv, or (direct) the run of one local worker's
     * vector, or of one owner's master, that the region is, with no copy
     * (data parallelism with one worker a rank, for instance) */
    const float **rs_out;     /* [d]: this rank's partial for d */
    const float **ag_src;     /* [s]: the masters s holds */
    float **ag_dst;           /* [d]: where d's masters land */
    int *rs_direct, *ag_src_direct, *ag_dst_direct;
    MPI_Request *reqs;        /* 2 per peer */
    float *send, *recv;
    int bf16;                 /* bf16 gradient payloads between ranks */
    uint16_t *send16, *recv16; /* bf16: the reduce-scatter's payloads, laid out
                               * as send and recv (same offsets, in elements) */
    size_t mpi_bytes;         /* what this rank receives per step */
    int plan_failed;          /* worker 0's planning failed (its message is its own) */
} mpi_comm;

static mpi_comm *mpi_of(st_comm_backend *b)
{
    return (mpi_comm *)b;
}

static const mpi_comm *mpi_of_const(const st_comm_backend *b)
{
    return (const mpi_comm *)b;
}

static st_status another_failed(void)
{
    return st_fail(ST_ERR_INVALID, "another worker failed");
}

/* ------------------------------------------------------------ create */

static void forget_exchange(mpi_comm *mc)
{
    if (mc->prof)
        for (int r = 0; r < mc->size; r++)
            free(mc->prof[r]);
    memset(mc->n_prof, 0, sizeof *mc->n_prof * (size_t)mc->size);
    if (mc->prof)
        memset(mc->prof, 0, sizeof *mc->prof * (size_t)mc->size);
    mc->send = mc->recv = NULL;
    mc->send16 = mc->recv16 = NULL;
    mc->mpi_bytes = 0;
    mc->plan_failed = 0;
}

static void mpi_destroy(st_comm_backend *b)
{
    mpi_comm *mc = mpi_of(b);
    if (!mc)
        return;
    if (mc->n_prof)
        forget_exchange(mc);
    if (mc->comm != MPI_COMM_NULL)
        MPI_Comm_free(&mc->comm);
    free(mc->prof);
    free(mc->n_prof);
    free(mc->send_off);
    free(mc->rs_out);
    free(mc->ag_src);
    free(mc->ag_dst);
    free(mc->rs_direct);
    free(mc->reqs);
    free(mc->shard_begin);
    free(mc->first);
    free(mc->unheld);
    free(mc->workers);
    free(mc);
}

/* The engine's communicator: a duplicate of the world's, or, for a range
 * of ranks, one made by the ranks of the range alone
 * (MPI_Comm_create_group: the other ranks take no part, so that synth's
 * groups make theirs without the ranks they do not span; its tag, the
 * range's first rank, tells apart two ranges a rank makes one after the
 * other). */
static st_status make_communicator(const st_comm_config *cfg, MPI_Comm world, MPI_Comm *out)
{
    int size, me;
    MPI_Comm_size(world, &size);
    MPI_Comm_rank(world, &me);
    *out = MPI_COMM_NULL;
    int all = cfg->n_ranks == 0 || (cfg->rank_first == 0 && cfg->n_ranks == size);
    if (!all && (cfg->rank_first < 0 || cfg->n_ranks < 0 || cfg->rank_first >= size ||
                 cfg->n_ranks > size - cfg->rank_first || me < cfg->rank_first ||
                 me >= cfg->rank_first + cfg->n_ranks))
        return st_fail(ST_ERR_INVALID, "reduction backend 'mpi': ranks %d..%d of %d do not "
                       "include this rank (%d)", cfg->rank_first,
                       cfg->rank_first + cfg->n_ranks - 1, size, me);
    int rc;
    if (all) {
        rc = MPI_Comm_dup(world, out);
    } else {
        MPI_Group wg, g;
        int range[1][3] = { { cfg->rank_first, cfg->rank_first + cfg->n_ranks - 1, 1 } };
        rc = MPI_Comm_group(world, &wg);
        if (rc == MPI_SUCCESS) {
            rc = MPI_Group_range_incl(wg, 1, range, &g);
            MPI_Group_free(&wg);
        }
        if (rc == MPI_SUCCESS) {
            rc = MPI_Comm_create_group(world, g, cfg->rank_first, out);
            MPI_Group_free(&g);
        }
    }
    if (rc != MPI_SUCCESS) {
        *out = MPI_COMM_NULL;
        return st_world_fail(rc, "creating the MPI reduction engine");
    }
    return ST_OK;
}

static st_status mpi_create(const st_comm_config *cfg, st_comm_backend **out)
{
    *out = NULL;
    MPI_Comm world = st_world_comm();
    if (world == MPI_COMM_NULL)
        return st_fail(ST_ERR_INVALID, "reduction backend 'mpi': MPI is not running (start the "
                       "program with mpirun or srun)");
    mpi_comm *mc = aligned_alloc(64, sizeof *mc);
    if (!mc)
        return st_fail(ST_ERR_NOMEM, "out of memory creating the MPI reduction engine");
    memset(mc, 0, sizeof *mc);
    mc->comm = MPI_COMM_NULL;
    st_status s = ST_OK;
    /* its own communicator: the engines of a run (gradients, masters) and
     * the loop's own collectives never match each other's messages */
    s = make_communicator(cfg, world, &mc->comm);
    if (s != ST_OK)
        goto fail;
    MPI_Comm_set_errhandler(mc->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(mc->comm, &mc->rank);
    MPI_Comm_size(mc->comm, &mc->size);
    mc->n = cfg->n_workers;
    mc->P = cfg->n_params;
    mc->roles = cfg->roles ? cfg->roles : (ST_COMM_REDUCE | ST_COMM_GATHER);
    mc->allow_unheld = cfg->allow_unheld;
    mc->bf16 = cfg->payload == ST_COMM_PAYLOAD_BF16;
    /* every rank must describe the same vector: one bad rank would
     * otherwise make the others wait in an exchange that never matches */
    unsigned long long mine[2] = { (unsigned long long)mc->n, (unsigned long long)mc->P };
    unsigned long long *all = malloc(sizeof mine * (size_t)mc->size);
    mc->first = malloc(sizeof *mc->first * ((size_t)mc->size + 1));
    if (!all || !mc->first) {
        free(all);
        s = st_fail(ST_ERR_NOMEM, "out of memory creating the MPI reduction engine");
        goto fail;
    }
    int rc = MPI_Allgather(mine, 2, MPI_UNSIGNED_LONG_LONG, all, 2, MPI_UNSIGNED_LONG_LONG,
                           mc->comm);
    if (rc != MPI_SUCCESS) {
        free(all);
        s = st_world_fail(rc, "creating the MPI reduction engine");
        goto fail;
    }
    long long total = 0;
    mc->first[0] = 0;
    for (int r = 0; r < mc->size && s == ST_OK; r++) {
        if (all[2 * r + 1] != mine[1])
            s = st_fail(ST_ERR_INVALID, "rank %d has %llu parameters, rank %d has %llu: every "
                        "rank must run the same model", r, all[2 * r + 1], mc->rank, mine[1]);
        else if (all[2 * r] < 1)
            s = st_fail(ST_ERR_INVALID, "rank %d has no worker in an MPI reduction engine", r);
        total += (long long)all[2 * r];
        if (total > ST_COMM_MAX_WORKERS && s == ST_OK)
            s = st_fail(ST_ERR_INVALID, "%d ranks run more than %d workers", mc->size,
                        ST_COMM_MAX_WORKERS);
        if (s == ST_OK)
            mc->first[r + 1] = (int)total;
    }
    free(all);
    if (s != ST_OK)
        goto fail;
    mc->N = mc->first[mc->size];
    int R = mc->size;
    mc->shard_begin = malloc(sizeof *mc->shard_begin * ((size_t)mc->N + 1));
    mc->workers = aligned_alloc(64, sizeof *mc->workers * (size_t)mc->n);
    mc->prof = calloc((size_t)R, sizeof *mc->prof);
    mc->n_prof = calloc((size_t)R, sizeof *mc->n_prof);
    mc->send_off = calloc(4 * (size_t)R, sizeof *mc->send_off);
    mc->rs_out = calloc((size_t)R, sizeof *mc->rs_out);
    mc->ag_src = calloc((size_t)R, sizeof *mc->ag_src);
    mc->ag_dst = calloc((size_t)R, sizeof *mc->ag_dst);
    mc->rs_direct = calloc(3 * (size_t)R, sizeof *mc->rs_direct);
    mc->reqs = calloc(2 * (size_t)R, sizeof *mc->reqs);
    if (cfg->allow_unheld && cfg->unheld_ranges && cfg->n_unheld_ranges > 0) {
        mc->unheld = malloc(sizeof *mc->unheld * (size_t)cfg->n_unheld_ranges);
        if (mc->unheld) {
            memcpy(mc->unheld, cfg->unheld_ranges, sizeof *mc->unheld * (size_t)cfg->n_unheld_ranges);
            mc->n_unheld = cfg->n_unheld_ranges;
        }
    }
    if (!mc->shard_begin || !mc->workers || !mc->prof || !mc->n_prof || !mc->send_off ||
        !mc->rs_out || !mc->ag_src || !mc->ag_dst || !mc->rs_direct || !mc->reqs || (cfg->allow_unheld && cfg->unheld_ranges && cfg->n_unheld_ranges > 0 &&
                            !mc->unheld)) {
        s = st_fail(ST_ERR_NOMEM, "out of memory creating the MPI reduction engine");
        goto fail;
    }
    mc->send_len = mc->send_off + R;
    mc->recv_off = mc->send_off + 2 * R;
    mc->recv_len = mc->send_off + 3 * R;
    mc->ag_src_direct = mc->rs_direct + R;
    mc->ag_dst_direct = mc->rs_direct + 2 * R;
    st_comm_shards(mc->P, mc->N, mc->shard_begin);
    memset(mc->workers, 0, sizeof *mc->workers * (size_t)mc->n);
    for (int w = 0; w < mc->n; w++)
        atomic_init(&mc->workers[w].attached, 0);
    st_spin_barrier_init(&mc->barrier, (unsigned)mc->n);
    *out = (st_comm_backend *)mc;
    return ST_OK;
fail:
    mpi_destroy((st_comm_backend *)mc);
    return s;
}

static void mpi_set_shard_output(st_comm_backend *b, int w, float *out)
{
    mpi_of(b)->workers[w].shard_out = out;
}

static void mpi_reset(st_comm_backend *b)
{
    mpi_comm *mc = mpi_of(b);
    forget_exchange(mc);
    for (int w = 0; w < mc->n; w++) {
        mpi_worker *me = &mc->workers[w];
        float *out = me->shard_out;
        memset(me, 0, sizeof *me);
        atomic_init(&me->attached, 0);
        me->shard_out = out;
    }
}

/* ------------------------------------------------------------ growable lists
 * (attach only: the step's lists are copied into the worker's arena) */

typedef struct list {
    void *v;
    size_t n, cap, size;
} list;

static void *list_push(list *l)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        void *v = realloc(l->v, cap * l->size);
        if (!v)
            return NULL;
        l->v = v;
        l->cap = cap;
    }
    return (char *)l->v + l->size * l->n++;
}

static st_status list_to_arena(st_arena *arena, const list *l, void **out)
{
    *out = NULL;
    if (!l->n)
        return ST_OK;
    ST_TRY(st_arena_alloc(arena, ST_MEM_WORKSPACE, l->n * l->size, out));
    memcpy(*out, l->v, l->n * l->size);
    return ST_OK;
}

static st_status no_memory(void)
{
    return st_fail(ST_ERR_NOMEM, "out of memory planning the MPI reduction");
}

/* ------------------------------------------------------------ planning */

static int rank_of_element(const mpi_comm *mc, uint64_t x)
{
    /* the rank shard of rank r is [shard_begin[f[r]], shard_begin[f[r + 1]]) */
    int lo = 0, hi = mc->size - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (mc->shard_begin[mc->first[mid]] <= x)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The local profile: the elements the rank's workers hold, cut wherever
 * any worker's held range starts or ends and at every shard boundary, with
 * the number of local holders of each piece.  Each piece thus has one set
 * of local holders (the pack items name them) and lies in one shard. */
static st_status local_profile(const mpi_comm *mc, list *out)
{
    list cuts = { NULL, 0, 0, sizeof(uint64_t) };
    st_status s = ST_OK;
    for (int w = 0; w < mc->n && s == ST_OK; w++)
        for (int i = 0; i < mc->workers[w].n_held && s == ST_OK; i++) {
            uint64_t *a = list_push(&cuts);
            uint64_t *b = a ? list_push(&cuts) : NULL;
            if (!b) {
                s = no_memory();
                break;
            }
            b[-1] = mc->workers[w].held[i].begin;   /* a may have moved */
            b[0] = mc->workers[w].held[i].end;
        }
    for (int g = 0; g <= mc->N && s == ST_OK; g++) {
        uint64_t *c = list_push(&cuts);
        if (!c)
            s = no_memory();
        else
            *c = mc->shard_begin[g];
    }
    int *cur = s == ST_OK ? calloc((size_t)mc->n, sizeof *cur) : NULL;
    if (s == ST_OK && !cur)
        s = no_memory();
    if (s != ST_OK) {
        free(cuts.v);
        return s;
    }
    uint64_t *c = cuts.v;
    qsort(c, cuts.n, sizeof *c, cmp_u64);
    for (size_t k = 0; k + 1 < cuts.n && s == ST_OK; k++) {
        uint64_t a = c[k], b = c[k + 1];
        if (a == b || a >= mc->P)
            continue;
        uint64_t count = 0;
        for (int w = 0; w < mc->n; w++) {
            const mpi_worker *v = &mc->workers[w];
            while (cur[w] < v->n_held && v->held[cur[w]].end <= a)
                cur[w]++;
            if (cur[w] < v->n_held && v->held[cur[w]].begin <= a)
                count++;
        }
        if (!count)
            continue;
        prof_seg *p = list_push(out);
        if (!p)
            s = no_memory();
        else
            *p = (prof_seg){ a, b, count, 0 };
    }
    free(cur);
    free(cuts.v);
    return s;
}

/* The end of the allowed-unheld range containing pos, or pos if none. */
static uint64_t unheld_allowed_until(const mpi_comm *mc, uint64_t pos)
{
    if (!mc->allow_unheld)
        return pos;
    if (!mc->unheld)
        return mc->P;
    for (int i = 0; i < mc->n_unheld; i++)
        if (mc->unheld[i].begin <= pos && pos < mc->unheld[i].end)
            return mc->unheld[i].end;
    return pos;
}

/* Every element has a holder on some rank (or may be unheld).  Every rank
 * checks the whole vector, so they all fail alike. */
static st_status check_coverage(const mpi_comm *mc)
{
    size_t *cur = calloc((size_t)mc->size, sizeof *cur);
    if (!cur)
        return no_memory();
    st_status s = ST_OK;
    uint64_t pos = 0;
    while (pos < mc->P && s == ST_OK) {
        uint64_t next = mc->P;
        int held = 0;
        for (int r = 0; r < mc->size; r++) {
            const prof_seg *p = mc->prof[r];
            while (cur[r] < mc->n_prof[r] && p[cur[r]].end <= pos)
                cur[r]++;
            if (cur[r] == mc->n_prof[r])
                continue;
            if (p[cur[r]].begin <= pos) {
                held = 1;
                next = p[cur[r]].end < next ? p[cur[r]].end : next;
            } else if (p[cur[r]].begin < next) {
                next = p[cur[r]].begin;
            }
        }
        if (!held) {
            uint64_t allowed = unheld_allowed_until(mc, pos);
            if (allowed == pos) {
                s = st_fail(ST_ERR_INVALID, "element %llu of the %zu-element vector is held by "
                            "no worker of any rank (every element needs at least one holder%s)",
                            (unsigned long long)pos, mc->P, mc->allow_unheld ? " outside the "
                            "ranges allowed to be unheld" : "");
                break;
            }
            next = allowed < next ? allowed : next;
        }
        pos = next;
    }
    free(cur);
    return s;
}

/* Local worker v's address of element x in its gradient (or parameter)
 * vector, v being x's one local holder; NULL if no local worker holds x. */
static float *sole_holder_at(const mpi_comm *mc, uint64_t x, int params, int *who)
{
    for (int v = 0; v < mc->n; v++) {
        const mpi_worker *wv = &mc->workers[v];
        int lo = 0, hi = wv->n_held;
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (wv->held[mid].end <= x)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < wv->n_held && wv->held[lo].begin <= x) {
            *who = v;
            return (params ? wv->params : wv->grads) + wv->local[lo] + (x - wv->held[lo].begin);
        }
    }
    return NULL;
}

/* This rank's region for rank d (its profile's segments in d's rank
 * shard) as one run of a single local worker's vector: its start, or NULL
 * if it is not one (several holders, several workers, a gap). */
static float *direct_region(const mpi_comm *mc, int d, int params)
{
    const prof_seg *p = mc->prof[mc->rank];
    float *start = NULL, *expect = NULL;
    int holder = -1;
    for (size_t j = 0; j < mc->n_prof[mc->rank]; j++) {
        if (rank_of_element(mc, p[j].begin) != d)
            continue;
        int v = -1;
        float *a = p[j].count == 1 ? sole_holder_at(mc, p[j].begin, params, &v) : NULL;
        if (!a || (start && (v != holder || a != expect)))
            return NULL;
        if (!start) {
            start = a;
            holder = v;
        }
        expect = a + (p[j].end - p[j].begin);
    }
    return start;
}

/* Rank s's region of this rank shard as one run of one local owner's
 * master: its start, or NULL. */
static const float *direct_masters(const mpi_comm *mc, int s)
{
    const prof_seg *p = mc->prof[s];
    uint64_t begin = 0, end = 0;
    int any = 0;
    for (size_t j = 0; j < mc->n_prof[s]; j++) {
        if (rank_of_element(mc, p[j].begin) != mc->rank)
            continue;
        if (any && p[j].begin != end)
            return NULL;
        if (!any)
            begin = p[j].begin;
        any = 1;
        end = p[j].end;
    }
    if (!any)
        return NULL;
    int g = mc->first[mc->rank];
    while (mc->shard_begin[g + 1] <= begin)
        g++;
    if (end > mc->shard_begin[g + 1])
        return NULL;
    return mc->workers[g - mc->first[mc->rank]].master + (begin - mc->shard_begin[g]);
}

/* Worker 0, after the layout: where the step's exchange can read and
 * write in place (the pack, the all-gather's copies and the masters'
 * copy-out then skip those regions); else the packed buffers. */
static void find_direct(mpi_comm *mc)
{
    for (int r = 0; r < mc->size; r++) {
        /* bf16: every partial is converted on its way out, none sent in place */
        float *a = r == mc->rank || mc->bf16 ? NULL : direct_region(mc, r, 0);
        mc->rs_direct[r] = a != NULL && (mc->roles & ST_COMM_REDUCE);
        mc->rs_out[r] = mc->rs_direct[r] ? a : mc->send + mc->send_off[r];
        const float *m = r == mc->rank || !(mc->roles & ST_COMM_GATHER) ? NULL
                                                                          : direct_masters(mc, r);
        mc->ag_src_direct[r] = m != NULL;
        mc->ag_src[r] = m ? m : mc->recv + mc->recv_off[r];
        float *b = r == mc->rank || !(mc->roles & ST_COMM_GATHER) ? NULL
                                                                  : direct_region(mc, r, 1);
        mc->ag_dst_direct[r] = b != NULL;
        mc->ag_dst[r] = b ? b : mc->send + mc->send_off[r];
    }
}

/* Worker 0, between the barriers of attach: every rank's profile, the
 * layout of the exchange and its buffers.  Every rank computes the same
 * layout from the same profiles. */
static st_status plan_exchange(mpi_comm *mc, st_arena *arena)
{
    const int R = mc->size, me = mc->rank;
    list mine = { NULL, 0, 0, sizeof(prof_seg) };
    st_status s = local_profile(mc, &mine);
    unsigned long long my_n = mine.n, *all_n = NULL;
    int *counts = NULL, *displs = NULL;
    uint64_t *all = NULL;
    if (s == ST_OK) {
        all_n = malloc(sizeof *all_n * (size_t)R);
        counts = malloc(sizeof *counts * 2 * (size_t)R);
        if (!all_n || !counts)
            s = no_memory();
    }
    if (s == ST_OK) {
        int rc = MPI_Allgather(&my_n, 1, MPI_UNSIGNED_LONG_LONG, all_n, 1,
                               MPI_UNSIGNED_LONG_LONG, mc->comm);
        if (rc != MPI_SUCCESS)
            s = st_world_fail(rc, "gathering the ranks' holdings");
    }
    size_t total = 0;
    for (int r = 0; r < R && s == ST_OK; r++) {
        if (4 * (total + all_n[r]) > (size_t)INT_MAX)
            s = st_fail(ST_ERR_INVALID, "the ranks' holdings have too many pieces to exchange");
        total += all_n[r];
    }
    if (s == ST_OK) {
        displs = counts + R;
        for (int r = 0, at = 0; r < R; r++) {
            counts[r] = (int)(4 * all_n[r]);
            displs[r] = at;
            at += counts[r];
        }
        all = malloc(sizeof *all * 4 * (total ? total : 1));
        if (!all)
            s = no_memory();
    }
    if (s == ST_OK) {
        int rc = MPI_Allgatherv(mine.v ? mine.v : (void *)all, (int)(4 * my_n), MPI_UINT64_T, all,
                                counts, displs, MPI_UINT64_T, mc->comm);
        if (rc != MPI_SUCCESS)
            s = st_world_fail(rc, "gathering the ranks' holdings");
    }
    /* each rank's profile, with the offset of each segment in its region
     * for the rank that owns it (a running count per destination) */
    size_t *run = s == ST_OK ? calloc((size_t)R, sizeof *run) : NULL;
    if (s == ST_OK && !run)
        s = no_memory();
    for (int r = 0, at = 0; r < R && s == ST_OK; r++) {
        size_t n = all_n[r];
        mc->prof[r] = malloc(sizeof(prof_seg) * (n ? n : 1));
        if (!mc->prof[r]) {
            s = no_memory();
            break;
        }
        memcpy(mc->prof[r], all + at, sizeof(prof_seg) * n);
        mc->n_prof[r] = n;
        at += (int)(4 * n);
        memset(run, 0, sizeof *run * (size_t)R);
        for (size_t j = 0; j < n; j++) {
            prof_seg *p = &mc->prof[r][j];
            int d = rank_of_element(mc, p->begin);
            p->off = run[d];
            run[d] += p->end - p->begin;
        }
        if (r == me)
            for (int d = 0; d < R; d++)
                mc->send_len[d] = d == me ? 0 : run[d];
        mc->recv_len[r] = run[me];
    }
    if (s == ST_OK)
        s = check_coverage(mc);
    size_t n_send = 0, n_recv = 0;
    for (int r = 0; r < R && s == ST_OK; r++) {
        mc->send_off[r] = n_send;
        mc->recv_off[r] = n_recv;
        if (mc->send_len[r] > (size_t)INT_MAX || mc->recv_len[r] > (size_t)INT_MAX ||
            n_send + mc->send_len[r] > (size_t)INT_MAX || n_recv + mc->recv_len[r] > (size_t)INT_MAX)
            s = st_fail(ST_ERR_INVALID, "more than %d floats to exchange with one rank: use more "
                        "ranks or a smaller model", INT_MAX);
        n_send += mc->send_len[r];
        n_recv += mc->recv_len[r];
    }
    if (s == ST_OK && n_send)
        s = st_arena_alloc_floats(arena, ST_MEM_WORKSPACE, n_send, &mc->send);
    if (s == ST_OK && n_recv)
        s = st_arena_alloc_floats(arena, ST_MEM_WORKSPACE, n_recv, &mc->recv);
    void *p16;
    if (s == ST_OK && mc->bf16 && n_send &&
        (s = st_arena_alloc(arena, ST_MEM_WORKSPACE, n_send * sizeof(uint16_t), &p16)) == ST_OK)
        mc->send16 = p16;
    if (s == ST_OK && mc->bf16 && n_recv &&
        (s = st_arena_alloc(arena, ST_MEM_WORKSPACE, n_recv * sizeof(uint16_t), &p16)) == ST_OK)
        mc->recv16 = p16;
    if (s == ST_OK)
        find_direct(mc);
    if (s == ST_OK) {
        size_t in = 0;
        const size_t rs_size = mc->bf16 ? sizeof(uint16_t) : sizeof(float);
        for (int r = 0; r < R; r++)
            if (r != me)
                in += (mc->roles & ST_COMM_REDUCE ? mc->recv_len[r] * rs_size : 0) +
                      (mc->roles & ST_COMM_GATHER ? mc->send_len[r] * sizeof(float) : 0);
        mc->mpi_bytes = in;
    }
    free(run);
    free(all);
    free(counts);
    free(all_n);
    free(mine.v);
    return s;
}

/* ------------------------------------------------------------ work items */

/* Where element x of local worker v's held ranges lives in `base` (its
 * gradient or parameter vector), or NULL if v does not hold x; cur: v's
 * cursor over its ranges, for non-decreasing x. */
static float *held_at(const mpi_worker *v, float *base, uint64_t x, int *cur)
{
    while (*cur < v->n_held && v->held[*cur].end <= x)
        (*cur)++;
    if (*cur < v->n_held && v->held[*cur].begin <= x)
        return base + v->local[*cur] + (x - v->held[*cur].begin);
    return NULL;
}

/* An rs item whose ops add srcs[0..k) in order into out (divided by
 * `count` at the end if divide); kinds[j]: srcs[j]'s SRC_* (NULL: all
 * fp32). */
static st_status push_sum(list *items, list *ops, float *out, size_t len, void *const *srcs,
                          const uint8_t *kinds, int k, int divide, float count)
{
    rs_item *it = list_push(items);
    if (!it)
        return no_memory();
    *it = (rs_item){ out, len, ops->n, 0, count };
    for (int j = 0; j < k; j++) {
        if (j == 1)
            continue;              /* folded into the OP_SUM2 of j = 0 */
        rs_op *op = list_push(ops);
        if (!op)
            return no_memory();
        const uint8_t ka = kinds ? kinds[j] : SRC_F32;
        const uint8_t kb = kinds && j == 0 && k > 1 ? kinds[1] : SRC_F32;
        if (j == 0)
            *op = (rs_op){ srcs[0], k > 1 ? srcs[1] : NULL, k > 1 ? OP_SUM2 : OP_COPY, 0,
                           (uint8_t)(divide && k <= 2), ka, kb };
        else
            *op = (rs_op){ srcs[j], NULL, OP_ACC, 0, (uint8_t)(divide && j == k - 1), ka,
                           SRC_F32 };
        ((rs_item *)items->v)[items->n - 1].n_ops++;
    }
    return ST_OK;
}

/* Worker w's share of the rank's partials: the local profile's segments
 * in exchange order, split evenly over the rank's workers by element
 * count.  first_only: the first local holder's value alone (the masters'
 * initial values, from params); else the sum of all local holders'
 * gradients. */
static st_status build_pack(const mpi_comm *mc, int w, int first_only, list *items, list *ops)
{
    const int me = mc->rank;
    const prof_seg *p = mc->prof[me];
    size_t n = mc->n_prof[me], total = 0;
    for (size_t j = 0; j < n; j++)
        total += p[j].end - p[j].begin;
    /* worker w's part of the concatenation: [lo, hi) */
    size_t lo = total * (size_t)w / (size_t)mc->n, hi = total * (size_t)(w + 1) / (size_t)mc->n;
    int *cur = calloc((size_t)mc->n, sizeof *cur);
    void **srcs = calloc((size_t)mc->n, sizeof *srcs);
    uint8_t *kinds = calloc((size_t)mc->n, sizeof *kinds);
    st_status s = cur && srcs && kinds ? ST_OK : no_memory();
    /* bf16 payloads: each gradient rounded as it is read (not the
     * parameters of the masters' first exchange) */
    const uint8_t kind = mc->bf16 && !first_only ? SRC_F32_RNE : SRC_F32;
    size_t at = 0;
    for (size_t j = 0; j < n && s == ST_OK; j++) {
        size_t len = p[j].end - p[j].begin;
        size_t a = at > lo ? at : lo, b = at + len < hi ? at + len : hi;
        at += len;
        if (a >= b)
            continue;
        uint64_t x = p[j].begin + (a - (at - len));
        int d = rank_of_element(mc, x);
        /* the step sends a direct region as it is, and the owner reads a
         * lone local holder's value in place */
        if (!first_only && (d == me ? p[j].count == 1 : mc->rs_direct[d]))
            continue;
        float *out = d == me ? mc->recv + mc->recv_off[me] : mc->send + mc->send_off[d];
        out += p[j].off + (x - p[j].begin);
        int k = 0;
        for (int v = 0; v < mc->n; v++) {
            const mpi_worker *wv = &mc->workers[v];
            float *src = held_at(wv, first_only ? wv->params : wv->grads, x, &cur[v]);
            if (src && !(first_only && k)) {
                kinds[k] = kind;
                srcs[k++] = src;
            }
        }
        s = push_sum(items, ops, out, b - a, srcs, kinds, k, 0, 1.0f);
    }
    free(kinds);
    free(srcs);
    free(cur);
    return s;
}

/* Owner w's shard from the partials in `recv`: the ranks that hold each
 * piece, in rank order; the sum divided by the total holder count (mean),
 * or the first rank's value alone (first_only: the initial masters). */
static st_status build_own(const mpi_comm *mc, int w, int first_only, float *out, list *items,
                           list *ops)
{
    const int R = mc->size, me = mc->rank, g = mc->first[me] + w;
    const uint64_t b0 = mc->shard_begin[g], b1 = mc->shard_begin[g + 1];
    size_t *cur = calloc((size_t)R, sizeof *cur);
    void **srcs = calloc((size_t)R, sizeof *srcs);
    uint8_t *kinds = calloc((size_t)R, sizeof *kinds);
    if (!cur || !srcs || !kinds) {
        free(cur);
        free(srcs);
        free(kinds);
        return no_memory();
    }
    const int half = mc->bf16 && !first_only;   /* the step's sums of bf16 payloads */
    st_status s = ST_OK;
    uint64_t pos = b0;
    while (pos < b1 && s == ST_OK) {
        uint64_t next = b1, count = 0;
        int k = 0;
        for (int r = 0; r < R; r++) {
            const prof_seg *p = mc->prof[r];
            while (cur[r] < mc->n_prof[r] && p[cur[r]].end <= pos)
                cur[r]++;
            if (cur[r] == mc->n_prof[r])
                continue;
            const prof_seg *q = &p[cur[r]];
            if (q->begin <= pos) {
                next = q->end < next ? q->end : next;
                count += q->count;
                int v;
                const size_t at = mc->recv_off[r] + q->off + (pos - q->begin);
                if (!first_only && r == me && q->count == 1) {
                    /* in place (pack skips it); bf16: rounded as read */
                    kinds[k] = half ? SRC_F32_RNE : SRC_F32;
                    srcs[k++] = sole_holder_at(mc, pos, 0, &v);
                } else if (half && r != me) {
                    kinds[k] = SRC_BF16;       /* another rank's bf16 partial */
                    srcs[k++] = mc->recv16 + at;
                } else {
                    kinds[k] = SRC_F32;        /* this rank's partial: stays fp32 */
                    srcs[k++] = mc->recv + at;
                }
            } else if (q->begin < next) {
                next = q->begin;
            }
        }
        if (k)
            s = push_sum(items, ops, out + (pos - b0), next - pos, srcs, kinds,
                         first_only ? 1 : k, !first_only, (float)count);
        pos = next;
    }
    free(kinds);
    free(srcs);
    free(cur);
    return s;
}

/* Owner w's master values into the receive buffer's slots of every other
 * rank that holds them: what the all-gather's exchange sends back. */
static st_status build_ag_out(const mpi_comm *mc, int w, list *items)
{
    const int me = mc->rank, g = mc->first[me] + w;
    const uint64_t b0 = mc->shard_begin[g], b1 = mc->shard_begin[g + 1];
    for (int r = 0; r < mc->size; r++) {
        if (r == me || mc->ag_src_direct[r])   /* direct: sent from the master itself */
            continue;
        for (size_t j = 0; j < mc->n_prof[r]; j++) {
            const prof_seg *q = &mc->prof[r][j];
            if (q->end <= b0 || q->begin >= b1)
                continue;    /* segments never straddle a shard boundary */
            ag_item *it = list_push(items);
            if (!it)
                return no_memory();
            *it = (ag_item){ mc->recv + mc->recv_off[r] + q->off,
                             mc->workers[w].master + (q->begin - b0), q->end - q->begin, NULL };
        }
    }
    return ST_OK;
}

/* Worker w's replica: each held piece from the local owner's master (its
 * own rank shard) or from the slot the all-gather's exchange filled. */
static st_status build_ag_in(const mpi_comm *mc, int w, list *items)
{
    const int me = mc->rank;
    const mpi_worker *v = &mc->workers[w];
    const prof_seg *p = mc->prof[me];
    size_t j = 0;
    for (int i = 0; i < v->n_held; i++) {
        uint64_t pos = v->held[i].begin, end = v->held[i].end;
        while (pos < end) {
            while (j < mc->n_prof[me] && p[j].end <= pos)
                j++;
            /* w holds pos, so the local profile covers it */
            const prof_seg *q = &p[j];
            uint64_t stop = q->end < end ? q->end : end;
            int d = rank_of_element(mc, pos);
            if (d != me && mc->ag_dst_direct[d]) {   /* received in place */
                pos = stop;
                continue;
            }
            const float *src;
            if (d == me) {
                int o = mc->first[me], g = o;
                while (mc->shard_begin[g + 1] <= pos)
                    g++;
                src = mc->workers[g - o].master + (pos - mc->shard_begin[g]);
            } else {
                src = mc->send + mc->send_off[d] + q->off + (pos - q->begin);
            }
            ag_item *it = list_push(items);
            if (!it)
                return no_memory();
            *it = (ag_item){ v->params + v->local[i] + (pos - v->held[i].begin), src, stop - pos,
                             NULL };   /* no bf16 copies over MPI (no set_param_copies) */
            pos = stop;
        }
    }
    return ST_OK;
}

/* ------------------------------------------------------------ attach */

/* The rank's exchange, by local worker 0 between two barriers of its
 * workers (MPI_THREAD_SERIALIZED): rs: the partials to the owners (into
 * recv); else the masters back.  One message each way per peer with
 * anything to move, all posted at once, receives first; the tag tells the
 * two collectives apart (a rank is at most one collective ahead of
 * another).  direct: the step's regions in place (find_direct); else the
 * packed buffers (the masters' initial exchange). */
static st_status exchange(mpi_comm *mc, int rs, int direct)
{
    const int me = mc->rank;
    /* the step's reduce-scatter with bf16 payloads: the 2-byte buffers
     * (MPI_UINT16_T: bf16 is only bits to MPI; nothing sums in flight) */
    const int half = mc->bf16 && rs && direct;
    int n = 0, rc = MPI_SUCCESS;
    for (int r = 0; r < mc->size && rc == MPI_SUCCESS; r++) {
        size_t len = rs ? mc->recv_len[r] : mc->send_len[r];
        if (r == me || !len)
            continue;
        if (half) {
            rc = MPI_Irecv(mc->recv16 + mc->recv_off[r], (int)len, MPI_UINT16_T, r, rs,
                           mc->comm, &mc->reqs[n++]);
            continue;
        }
        float *in = rs ? mc->recv + mc->recv_off[r]
                       : direct ? mc->ag_dst[r] : mc->send + mc->send_off[r];
        rc = MPI_Irecv(in, (int)len, MPI_FLOAT, r, rs, mc->comm, &mc->reqs[n++]);
    }
    for (int r = 0; r < mc->size && rc == MPI_SUCCESS; r++) {
        size_t len = rs ? mc->send_len[r] : mc->recv_len[r];
        if (r == me || !len)
            continue;
        if (half) {
            rc = MPI_Isend(mc->send16 + mc->send_off[r], (int)len, MPI_UINT16_T, r, rs,
                           mc->comm, &mc->reqs[n++]);
            continue;
        }
        const float *out = rs ? (direct ? mc->rs_out[r] : mc->send + mc->send_off[r])
                              : (direct ? mc->ag_src[r] : mc->recv + mc->recv_off[r]);
        rc = MPI_Isend(out, (int)len, MPI_FLOAT, r, rs, mc->comm, &mc->reqs[n++]);
    }
    if (rc == MPI_SUCCESS)
        rc = MPI_Waitall(n, mc->reqs, MPI_STATUSES_IGNORE);
    return rc == MPI_SUCCESS ? ST_OK
                             : st_world_fail(rc, rs ? "reduce-scatter between the ranks"
                                                    : "all-gather between the ranks");
}

/* A failed worker: the rank's others stop waiting for it. */
static st_status fail_all(mpi_comm *mc, st_status s)
{
    st_spin_barrier_abort(&mc->barrier);
    return s;
}

#define WAIT(mc)                                      \
    do {                                              \
        if (st_spin_barrier_wait(&(mc)->barrier))     \
            return another_failed();                  \
    } while (0)

/* The initial master shards: the first holder's parameters (global order),
 * through one exchange like the reduce-scatter's. */
static st_status init_masters(mpi_comm *mc, int w)
{
    list items = { NULL, 0, 0, sizeof(rs_item) }, ops = { NULL, 0, 0, sizeof(rs_op) };
    mpi_worker *me = &mc->workers[w];
    st_status s = build_pack(mc, w, 1, &items, &ops);
    if (s == ST_OK)
        st_comm_run_rs(items.v, items.n, ops.v, me->scratch, NULL);
    items.n = ops.n = 0;
    if (s != ST_OK) {
        free(items.v);
        free(ops.v);
        return fail_all(mc, s);
    }
    /* every rank's first-holder values are in place */
    if (st_spin_barrier_wait(&mc->barrier)) {
        free(items.v);
        free(ops.v);
        return another_failed();
    }
    if (w == 0)
        s = exchange(mc, 1, 0);
    if (s != ST_OK) {
        free(items.v);
        free(ops.v);
        return fail_all(mc, s);
    }
    /* the owners' inputs have arrived */
    if (st_spin_barrier_wait(&mc->barrier)) {
        free(items.v);
        free(ops.v);
        return another_failed();
    }
    s = build_own(mc, w, 1, me->master, &items, &ops);
    if (s == ST_OK)
        st_comm_run_rs(items.v, items.n, ops.v, me->scratch, NULL);
    free(items.v);
    free(ops.v);
    return s == ST_OK ? ST_OK : fail_all(mc, s);
}

/* Bytes an rs item reads per element: each op's a (and b of a sum of
 * two), 2 for a bf16 source, 4 for the others. */
static size_t item_sources_bytes(const rs_item *it, const rs_op *ops)
{
    size_t b = 0;
    for (size_t j = 0; j < it->n_ops; j++) {
        const rs_op *op = &ops[it->op_first + j];
        b += op->a_src == SRC_BF16 ? sizeof(uint16_t) : sizeof(float);
        if (op->kind == OP_SUM2)
            b += op->b_src == SRC_BF16 ? sizeof(uint16_t) : sizeof(float);
    }
    return b;
}

static st_status step_lists(mpi_comm *mc, int w)
{
    mpi_worker *me = &mc->workers[w];
    list pack = { NULL, 0, 0, sizeof(rs_item) }, pack_ops = { NULL, 0, 0, sizeof(rs_op) };
    list own = { NULL, 0, 0, sizeof(rs_item) }, own_ops = { NULL, 0, 0, sizeof(rs_op) };
    list ag_out = { NULL, 0, 0, sizeof(ag_item) }, ag_in = { NULL, 0, 0, sizeof(ag_item) };
    st_status s = ST_OK;
    if (mc->roles & ST_COMM_REDUCE) {
        s = build_pack(mc, w, 0, &pack, &pack_ops);
        if (s == ST_OK)
            s = build_own(mc, w, 0, me->shard_grad, &own, &own_ops);
    }
    if (s == ST_OK && (mc->roles & ST_COMM_GATHER)) {
        s = build_ag_out(mc, w, &ag_out);
        if (s == ST_OK)
            s = build_ag_in(mc, w, &ag_in);
    }
    void *v;
    if (s == ST_OK && (s = list_to_arena(me->arena, &pack, &v)) == ST_OK)
        me->pack = v, me->n_pack = pack.n;
    if (s == ST_OK && (s = list_to_arena(me->arena, &pack_ops, &v)) == ST_OK)
        me->pack_ops = v;
    if (s == ST_OK && (s = list_to_arena(me->arena, &own, &v)) == ST_OK)
        me->own = v, me->n_own = own.n;
    if (s == ST_OK && (s = list_to_arena(me->arena, &own_ops, &v)) == ST_OK)
        me->own_ops = v;
    if (s == ST_OK && (s = list_to_arena(me->arena, &ag_out, &v)) == ST_OK)
        me->ag_out = v, me->n_ag_out = ag_out.n;
    if (s == ST_OK && (s = list_to_arena(me->arena, &ag_in, &v)) == ST_OK)
        me->ag_in = v, me->n_ag_in = ag_in.n;
    /* bytes: what w's items read and write, and (worker 0, which calls
     * MPI) what the rank receives from the others */
    st_comm_bytes *by = &me->bytes;
    memset(by, 0, sizeof *by);
    const rs_item *it = pack.v;
    const size_t n_send = mc->send_off[mc->size - 1] + mc->send_len[mc->size - 1];
    for (size_t t = 0; s == ST_OK && t < pack.n; t++) {
        by->read += it[t].n * item_sources_bytes(&it[t], pack_ops.v);
        by->written += it[t].n * sizeof(float);
        if (mc->bf16 && mc->send && it[t].out >= mc->send && it[t].out < mc->send + n_send) {
            by->read += it[t].n * sizeof(float);          /* to_payload */
            by->written += it[t].n * sizeof(uint16_t);
        }
    }
    it = own.v;
    for (size_t t = 0; s == ST_OK && t < own.n; t++) {
        by->read += it[t].n * item_sources_bytes(&it[t], own_ops.v);
        by->written += it[t].n * sizeof(float);
    }
    const ag_item *ai = ag_out.v;
    for (size_t t = 0; s == ST_OK && t < ag_out.n; t++)
        by->gather_read += ai[t].n * sizeof(float);
    ai = ag_in.v;
    for (size_t t = 0; s == ST_OK && t < ag_in.n; t++)
        by->gather_read += ai[t].n * sizeof(float);
    by->gather_written = by->gather_read;
    by->read += by->gather_read;
    by->written += by->gather_written;
    if (w == 0) {
        by->cross_domain_read = mc->mpi_bytes;
        by->read += mc->mpi_bytes;
    }
    free(pack.v);
    free(pack_ops.v);
    free(own.v);
    free(own_ops.v);
    free(ag_out.v);
    free(ag_in.v);
    return s;
}

static st_status mpi_attach(st_comm_backend *b, int w, st_arena *arena, float *grads,
                            float *params, const st_range *held, const size_t *local, int n_held)
{
    mpi_comm *mc = mpi_of(b);
    mpi_worker *me = &mc->workers[w];
    st_status s = ST_OK;
    if (atomic_exchange(&me->attached, 1))
        return fail_all(mc, st_fail(ST_ERR_INVALID, "worker %d attached twice", w));
    me->arena = arena;
    me->grads = grads;
    me->params = params;
    me->n_held = n_held;
    void *p;
    s = st_arena_alloc(arena, ST_MEM_WORKSPACE, (size_t)n_held * sizeof *held, &p);
    if (s == ST_OK) {
        memcpy(p, held, (size_t)n_held * sizeof *held);
        me->held = p;
        s = st_arena_alloc(arena, ST_MEM_WORKSPACE, (size_t)n_held * sizeof *local, &p);
    }
    if (s == ST_OK) {
        me->local = p;
        for (int i = 0; i < n_held; i++)
            me->local[i] = local ? local[i] : held[i].begin;
        s = st_arena_alloc_floats(arena, ST_MEM_WORKSPACE, ST_CHUNK, &me->scratch);
    }
    if (s == ST_OK && mc->bf16)
        s = st_arena_alloc_floats(arena, ST_MEM_WORKSPACE, 2 * ST_CHUNK, &me->wide);
    int g = mc->first[mc->rank] + w;
    size_t len = mc->shard_begin[g + 1] - mc->shard_begin[g];
    if (s == ST_OK && (mc->roles & ST_COMM_GATHER))
        s = st_arena_alloc_floats(arena, ST_MEM_WEIGHTS, len, &me->master);
    if (s == ST_OK && (mc->roles & ST_COMM_REDUCE)) {
        if (me->shard_out)
            me->shard_grad = me->shard_out;   /* what no reduction writes keeps its value */
        else
            s = st_arena_alloc_floats(arena, ST_MEM_GRADIENTS, len, &me->shard_grad);
    }
    if (s != ST_OK)
        return fail_all(mc, s);
    /* 1: every worker of the rank is registered */
    WAIT(mc);
    if (w == 0) {
        s = plan_exchange(mc, arena);
        if (s != ST_OK)
            return fail_all(mc, s);
    }
    /* 2: the exchange's layout and buffers exist */
    WAIT(mc);
    if (mc->roles & ST_COMM_GATHER)
        ST_TRY(init_masters(mc, w));
    s = step_lists(mc, w);
    if (s != ST_OK)
        return fail_all(mc, s);
    /* 3: every master is initialised before anyone's all-gather reads it,
     * and the initial exchange is done with the buffers */
    WAIT(mc);
    me->ready = 1;
    return ST_OK;
}

/* ------------------------------------------------------------ the step */

static st_status step_check(mpi_comm *mc, int w, int role, const char *what)
{
    if (!mc->workers[w].ready)
        return fail_all(mc, st_fail(ST_ERR_INVALID, "%s: worker %d has not attached", what, w));
    if (!(mc->roles & role))
        return fail_all(mc, st_fail(ST_ERR_INVALID, "%s on an engine without that role", what));
    return ST_OK;
}

/* The middle of a collective: the rank's workers have written what goes
 * out; local worker 0 exchanges it (rs: partials to the owners; else the
 * masters back) while the others wait at the spin barrier; then everyone
 * may read what came in. */
static st_status meet_and_exchange(mpi_comm *mc, int w, int rs)
{
    /* what goes out is complete */
    WAIT(mc);
    if (w == 0) {
        st_status s = exchange(mc, rs, 1);
        if (s != ST_OK)
            return fail_all(mc, s);
    }
    /* what the other ranks sent has arrived */
    WAIT(mc);
    return ST_OK;
}

/* bf16 payloads: w's packed partials bound for other ranks, rounded into
 * the 2-byte send buffer at the same offsets.  Each worker converts what
 * it packed, so the workers' ranges are disjoint; the rank's own partials
 * (in recv) stay fp32. */
static void to_payload(const mpi_comm *mc, const mpi_worker *me)
{
    const size_t n_send = mc->send_off[mc->size - 1] + mc->send_len[mc->size - 1];
    for (size_t t = 0; t < me->n_pack; t++) {
        const rs_item *it = &me->pack[t];
        if (mc->send && it->out >= mc->send && it->out < mc->send + n_send)
            st_bf16_round_n(mc->send16 + (it->out - mc->send), it->out, it->n);
    }
}

static st_status mpi_reduce_scatter(st_comm_backend *b, int w)
{
    mpi_comm *mc = mpi_of(b);
    ST_TRY(step_check(mc, w, ST_COMM_REDUCE, "reduce-scatter"));
    mpi_worker *me = &mc->workers[w];
    /* every gradient of the rank is complete, and every worker has done
     * reading `send` in the last all-gather */
    WAIT(mc);
    st_comm_run_rs(me->pack, me->n_pack, me->pack_ops, me->scratch, me->wide);
    if (mc->bf16)
        to_payload(mc, me);
    ST_TRY(meet_and_exchange(mc, w, 1));   /* the partials of this rank shard */
    st_comm_run_rs(me->own, me->n_own, me->own_ops, me->scratch, me->wide);
    return ST_OK;
}

static st_status mpi_all_gather(st_comm_backend *b, int w)
{
    mpi_comm *mc = mpi_of(b);
    ST_TRY(step_check(mc, w, ST_COMM_GATHER, "all-gather"));
    mpi_worker *me = &mc->workers[w];
    /* every master is updated, and every owner has done reading `recv` */
    WAIT(mc);
    st_comm_run_ag(me->ag_out, me->n_ag_out);
    ST_TRY(meet_and_exchange(mc, w, 0));   /* the other ranks' masters, in `send` */
    st_comm_run_ag(me->ag_in, me->n_ag_in);
    return ST_OK;
}

/* Over every worker of every rank: the rank's workers meet, worker 0
 * meets the other ranks, and the rank's workers meet again. */
static st_status mpi_barrier(st_comm_backend *b, int w)
{
    mpi_comm *mc = mpi_of(b);
    WAIT(mc);
    if (w == 0) {
        int rc = MPI_Barrier(mc->comm);
        if (rc != MPI_SUCCESS)
            return fail_all(mc, st_world_fail(rc, "waiting for the other ranks"));
    }
    WAIT(mc);
    return ST_OK;
}

static void mpi_abort(st_comm_backend *b)
{
    st_spin_barrier_abort(&mpi_of(b)->barrier);
}

/* ------------------------------------------------------------ queries */

static st_range mpi_shard(const st_comm_backend *b, int w)
{
    const mpi_comm *mc = mpi_of_const(b);
    int g = mc->first[mc->rank] + w;
    st_range r = { mc->shard_begin[g], mc->shard_begin[g + 1] };
    return r;
}

static float *mpi_shard_grads(st_comm_backend *b, int w)
{
    return mpi_of(b)->workers[w].shard_grad;
}

static float *mpi_shard_params(st_comm_backend *b, int w)
{
    return mpi_of(b)->workers[w].master;
}

static st_comm_bytes mpi_bytes_per_step(const st_comm_backend *b, int w)
{
    const mpi_comm *mc = mpi_of_const(b);
    st_comm_bytes none = { 0, 0, 0, 0, 0 };
    return mc->workers[w].ready ? mc->workers[w].bytes : none;
}

const st_comm_backend_ops st_comm_mpi_ops = {
    .create = mpi_create,
    .destroy = mpi_destroy,
    .attach = mpi_attach,
    .set_shard_output = mpi_set_shard_output,
    .reset = mpi_reset,
    .shard = mpi_shard,
    .shard_grads = mpi_shard_grads,
    .shard_params = mpi_shard_params,
    .reduce_scatter = mpi_reduce_scatter,
    .all_gather = mpi_all_gather,
    .barrier = mpi_barrier,
    .abort = mpi_abort,
    .bytes_per_step = mpi_bytes_per_step,
};

#endif /* HAVE_MPI */

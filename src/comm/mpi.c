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
 * exchange from the R profiles (mpi_plan.c).  Then each worker turns its
 * part into work items (comm/kernels.h) in its arena (mpi_items.c): the
 * step only runs them.  The master shards start from the first holder's
 * values (global order) through one extra exchange of parameters.
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
 * A bf16 master (st_comm_config.copies_master): the copies the workers
 * list hold the master of their elements, and each owner's update writes
 * its own replica's.  The all-gather brings a copied element in as bf16:
 * the owner copies its copies' values into the slots of the ranks that
 * hold them, each region laid out as its fp32 elements then its copied
 * ones (2 bytes each; one message a peer, in 2-byte units), and every
 * worker copies them into its copies; within the rank, from the local
 * owner's copies (its own: nothing).  Nothing is then in place.  The
 * master shards have no memory under the copies, and the first
 * exchange fills only the elements outside them (the copies start from
 * the same initial values on every worker).
 *
 * Buffers: the send and receive buffers are worker 0's (its arena, its
 * node); the masters and shard gradients are each owner's.  A rank whose
 * workers span NUMA domains still reduces in one level inside the rank:
 * run a rank per socket (doc/scaling.md).
 */
#ifdef HAVE_MPI

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/comm.h>

#include "comm/backend.h"
#include "comm/mpi_engine.h"
#include "comm/plan.h"
#include "comm/sizing_world.h"
#include "core/bf16.h"
#include "core/error.h"

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
    for (int r = 0; r < mc->size; r++) {
        if (mc->prof)
            free(mc->prof[r]);
        if (mc->f_off) {
            free(mc->f_off[r]);
            mc->f_off[r] = NULL;
        }
    }
    mc->copies = NULL;
    mc->n_copies = 0;
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
    free(mc->f_off);
    free(mc->send_f);
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

/* The engine over MPI's world, or (sized) rank `sized_rank` of a
 * described job, whose ranks all run cfg's workers. */
static st_status create_in(const st_comm_config *cfg, st_comm_world *sized, int sized_rank,
                           st_comm_backend **out)
{
    *out = NULL;
    if (cfg->shared_params)
        return st_fail(ST_ERR_INVALID, "reduction backend 'mpi' keeps a replica per worker: "
                       "shared parameters are the shared backend's");
    MPI_Comm world = sized ? MPI_COMM_NULL : st_world_comm();
    if (!sized && world == MPI_COMM_NULL)
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
    if (sized) {
        mc->world = sized;
        mc->rank = sized_rank;
        mc->size = st_comm_world_size(sized);
    } else {
        s = make_communicator(cfg, world, &mc->comm);
        if (s != ST_OK)
            goto fail;
        MPI_Comm_set_errhandler(mc->comm, MPI_ERRORS_RETURN);
        MPI_Comm_rank(mc->comm, &mc->rank);
        MPI_Comm_size(mc->comm, &mc->size);
    }
    mc->n = cfg->n_workers;
    mc->P = cfg->n_params;
    mc->roles = cfg->roles ? cfg->roles : (ST_COMM_REDUCE | ST_COMM_GATHER);
    mc->allow_unheld = cfg->allow_unheld;
    mc->bf16 = cfg->payload == ST_COMM_PAYLOAD_BF16;
    mc->copies_master = cfg->copies_master && (mc->roles & ST_COMM_GATHER);
    /* every rank must describe the same vector: one bad rank would
     * otherwise make the others wait in an exchange that never matches */
    unsigned long long mine[2] = { (unsigned long long)mc->n, (unsigned long long)mc->P };
    unsigned long long *all = malloc(sizeof mine * (size_t)mc->size);
    mc->first = malloc(sizeof *mc->first * ((size_t)mc->size + 1));
    int rc = MPI_SUCCESS;
    if (!all || !mc->first)
        s = st_fail(ST_ERR_NOMEM, "out of memory creating the MPI reduction engine");
    else if (sized)   /* every described rank runs the same workers */
        for (int r = 0; r < mc->size; r++)
            memcpy(all + 2 * r, mine, sizeof mine);
    else if ((rc = MPI_Allgather(mine, 2, MPI_UNSIGNED_LONG_LONG, all, 2,
                                 MPI_UNSIGNED_LONG_LONG, mc->comm)) != MPI_SUCCESS)
        s = st_world_fail(rc, "creating the MPI reduction engine");
    long long total = 0;
    if (s == ST_OK)
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
    mc->f_off = calloc((size_t)R, sizeof *mc->f_off);
    mc->send_f = calloc(2 * (size_t)R, sizeof *mc->send_f);
    const int unheld = cfg->allow_unheld && cfg->unheld_ranges && cfg->n_unheld_ranges > 0;
    if (unheld) {
        const size_t bytes = sizeof *mc->unheld * (size_t)cfg->n_unheld_ranges;
        mc->unheld = malloc(bytes);
        if (mc->unheld) {
            memcpy(mc->unheld, cfg->unheld_ranges, bytes);
            mc->n_unheld = cfg->n_unheld_ranges;
        }
    }
    if (!mc->shard_begin || !mc->workers || !mc->prof || !mc->n_prof || !mc->send_off ||
        !mc->rs_out || !mc->ag_src || !mc->ag_dst || !mc->rs_direct || !mc->reqs ||
        !mc->f_off || !mc->send_f ||
        (unheld && !mc->unheld)) {
        s = st_fail(ST_ERR_NOMEM, "out of memory creating the MPI reduction engine");
        goto fail;
    }
    mc->send_len = mc->send_off + R;
    mc->recv_off = mc->send_off + 2 * R;
    mc->recv_len = mc->send_off + 3 * R;
    mc->ag_src_direct = mc->rs_direct + R;
    mc->ag_dst_direct = mc->rs_direct + 2 * R;
    mc->recv_f = mc->send_f + R;
    st_comm_shards(mc->P, mc->N, mc->shard_begin);
    memset(mc->workers, 0, sizeof *mc->workers * (size_t)mc->n);
    for (int w = 0; w < mc->n; w++)
        atomic_init(&mc->workers[w].attached, 0);
    st_spin_barrier_init(&mc->barrier, (unsigned)mc->n, cfg->blocking);
    *out = (st_comm_backend *)mc;
    return ST_OK;
fail:
    mpi_destroy((st_comm_backend *)mc);
    return s;
}

static st_status mpi_create(const st_comm_config *cfg, st_comm_backend **out)
{
    return create_in(cfg, NULL, 0, out);
}

st_status st_comm_mpi_create_sizing(const st_comm_config *cfg, struct st_comm_world *world,
                                    int rank, st_comm_backend **out)
{
    return create_in(cfg, world, rank, out);
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

/* Kept for w's attach.  A bf16 master's (copies_master): left out of its
 * master shard, and its all-gather items cut at their edges; else its
 * replica's items are cut at their edges and write them as they copy.  A
 * list that is not sorted and disjoint is not taken. */
static void mpi_set_param_copies(st_comm_backend *b, int w, const st_param_copy *copies, int n)
{
    mpi_worker *me = &mpi_of(b)->workers[w];
    for (int i = 1; i < n; i++)
        if (copies[i].offset < copies[i - 1].offset + copies[i - 1].count)
            n = 0;
    me->copies = n > 0 ? copies : NULL;
    me->n_copies = n > 0 ? n : 0;
}

static int mpi_gathers_copies(const st_comm_backend *b, int w)
{
    const mpi_comm *mc = mpi_of_const(b);
    const mpi_worker *me = &mc->workers[w];
    return me->ready && (mc->copies_master ? me->n_copies > 0 : me->copies_gathered);
}

/* Kept for w's attach, which cuts its replica's items at their edges (a
 * list that is not sorted and disjoint is not taken). */
static void mpi_set_param_blocked(st_comm_backend *b, int w, const st_param_blocked *blocked,
                                  int n)
{
    mpi_worker *me = &mpi_of(b)->workers[w];
    me->n_blocked = st_comm_blocked_taken(blocked, n);
    me->blocked = me->n_blocked ? blocked : NULL;
}

static int mpi_gathers_blocked(const st_comm_backend *b, int w)
{
    const mpi_worker *me = &mpi_of_const(b)->workers[w];
    return me->ready && me->blocked_gathered;
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
    /* the step's all-gather of a bf16 master: each region's fp32 part,
     * then its bf16 part, counted in 2-byte units */
    const int mixed = mc->copies_master && !rs && direct;
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
        if (mixed) {
            rc = MPI_Irecv(mc->send + mc->send_off[r], (int)(len + mc->send_f[r]), MPI_UINT16_T,
                           r, rs, mc->comm, &mc->reqs[n++]);
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
        if (mixed) {
            rc = MPI_Isend(mc->recv + mc->recv_off[r], (int)(len + mc->recv_f[r]), MPI_UINT16_T,
                           r, rs, mc->comm, &mc->reqs[n++]);
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
 * through one exchange like the reduce-scatter's.  One exit frees the
 * lists; a failure found at a barrier (another worker's) has aborted it
 * already, so fail_all changes nothing for it. */
static st_status init_masters(mpi_comm *mc, int w)
{
    list items = { NULL, 0, 0, sizeof(rs_item) }, ops = { NULL, 0, 0, sizeof(rs_op) };
    mpi_worker *me = &mc->workers[w];
    st_status s = st_mpi_build_pack(mc, w, 1, &items, &ops);
    if (s == ST_OK)
        st_comm_run_rs(items.v, items.n, ops.v, me->scratch, NULL);
    items.n = ops.n = 0;
    /* every rank's first-holder values are in place */
    if (s == ST_OK && st_spin_barrier_wait(&mc->barrier))
        s = another_failed();
    if (s == ST_OK && w == 0)
        s = exchange(mc, 1, 0);
    /* the owners' inputs have arrived */
    if (s == ST_OK && st_spin_barrier_wait(&mc->barrier))
        s = another_failed();
    if (s == ST_OK)
        s = st_mpi_build_own(mc, w, 1, me->master, &items, &ops);
    if (s == ST_OK)
        st_comm_run_rs(items.v, items.n, ops.v, me->scratch, NULL);
    free(items.v);
    free(ops.v);
    return s == ST_OK ? ST_OK : fail_all(mc, s);
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
    if (s == ST_OK && (mc->roles & ST_COMM_GATHER))   /* a bf16 master's: not under copies */
        s = st_comm_alloc_master(arena, mc->shard_begin[g], len,
                                 mc->copies_master ? me->copies : NULL,
                                 mc->copies_master ? me->n_copies : 0, &me->master);
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
        s = st_mpi_plan_exchange(mc, arena);
        if (s != ST_OK)
            return fail_all(mc, s);
    }
    /* 2: the exchange's layout and buffers exist */
    WAIT(mc);
    /* a sizing run's buffers stay untouched, and its ranks exchange nothing */
    if ((mc->roles & ST_COMM_GATHER) && !mc->world)
        ST_TRY(init_masters(mc, w));
    s = st_mpi_step_lists(mc, w);
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
    if (w == 0 && mc->world) {   /* a described job: its ranks are threads here */
        st_status s = st_comm_world_barrier(mc->world);
        if (s != ST_OK)
            return fail_all(mc, s);
    } else if (w == 0) {
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
    .set_param_copies = mpi_set_param_copies,
    .gathers_copies = mpi_gathers_copies,
    .set_param_blocked = mpi_set_param_blocked,
    .gathers_blocked = mpi_gathers_blocked,
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

/*
 * comm/shared.c — the shared-buffer backend: the workers of one process
 * reduce through buffers placed on their own NUMA nodes (each worker's
 * shard buffers, partials and work lists come from its arena), and meet at
 * a spin barrier on C11 atomics (comm/barrier.h).
 *
 * Attach runs the planning phases of plan.h with three barriers between
 * them, because each phase reads what every worker wrote in the one
 * before.  A step then only runs its precomputed work items (kernels.c):
 *
 *   reduce-scatter  entry barrier; level 1 (this worker's partials of
 *                   remote shards); middle barrier, only if some worker
 *                   computes a partial; level 2 (the owner's sum).
 *   all-gather      entry barrier; phase 1 (copies from owners' masters);
 *                   middle barrier, only if some worker copies from a
 *                   copier's replica; phase 2 (those local copies).
 *
 * During the backward (st_comm_reduce_ready), a worker says which tail
 * of its gradient is final, sums its partials over the part its domain's
 * workers have all said, and reduces the part of its own shard that
 * every worker has said and every partial covers: the reduce-scatter
 * then only does the rest.  No barrier there: two atomic counters per
 * worker say how far it is (shared_worker.said and .summed).
 *
 * There is no exit barrier: the next collective's entry barrier is the
 * one that matters (see the comments at each wait).  A step costs 2
 * barriers on one NUMA domain, 4 when partials or local copies exist
 * (several domains, two holders of a remote shard's element in one of
 * them).  Shared parameters (one vector a domain, comm.h) have no local
 * copies: the all-gather copies remote shards into the domain's vector
 * and ends at a barrier of the domain's workers, who read it next; on
 * one domain it copies nothing.  Nothing on the step's
 * path allocates, creates or locks: the barrier is counters on their own
 * cache lines, and waiting is spinning (workers are pinned one per core).
 */
#include <stdalign.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/comm.h>

#include "comm/backend.h"
#include "comm/barrier.h"
#include "comm/kernels.h"
#include "comm/plan.h"
#include "core/error.h"

/* Worker w's attach state, on its own 64-byte line: `attached` is written
 * by w's attach while the other workers attach too; `said`, on a line of
 * its own, by w during its backward while the owners read it. */
typedef struct shared_worker {
    alignas(64) atomic_int attached;   /* w has called attach (a second call fails) */
    int ready;                         /* w's attach completed: its plan is valid */
    /* What of its gradient w has said final (st_comm_reduce_ready): in
     * step s (0-based since attach), elements [from, P) are said by the
     * value s (P + 1) + P - from, so it only grows and a value of an
     * earlier step never says anything of this one */
    alignas(64) atomic_uint_least64_t said;
    /* Two levels: w's partials (level-1 items) are summed for [from, P),
     * by the same value; written by w, read by the owners */
    alignas(64) atomic_uint_least64_t summed;
} shared_worker;

typedef struct shared_comm {
    st_spin_barrier barrier;           /* its members start 64-byte lines */
    comm_plan plan;
    shared_worker *workers;            /* n_workers */
    st_spin_barrier *domain_barrier;   /* n_domains, each of its domain's workers
                                        * (shared parameters over several domains) */
} shared_comm;

static shared_comm *shared_of(st_comm_backend *b)
{
    return (shared_comm *)b;
}

static const shared_comm *shared_of_const(const st_comm_backend *b)
{
    return (const shared_comm *)b;
}

static st_status another_failed(void)
{
    return st_fail(ST_ERR_INVALID, "another worker failed");
}

/* ------------------------------------------------------------ create */

static void shared_destroy(st_comm_backend *b)
{
    shared_comm *sc = shared_of(b);
    if (!sc)
        return;
    st_comm_plan_free(&sc->plan);
    free(sc->workers);
    free(sc->domain_barrier);
    free(sc);
}

static st_status shared_create(const st_comm_config *cfg, st_comm_backend **out)
{
    *out = NULL;
    /* 64-byte aligned for the barrier's lines; the size of a structure with
     * alignas(64) members is a multiple of 64, as aligned_alloc wants */
    shared_comm *sc = aligned_alloc(64, sizeof *sc);
    if (!sc)
        return st_fail(ST_ERR_NOMEM, "out of memory creating the reduction engine");
    memset(sc, 0, sizeof *sc);
    st_status s = st_comm_plan_init(&sc->plan, cfg);
    int n = cfg->n_workers;
    if (s == ST_OK) {
        sc->workers = aligned_alloc(64, (size_t)n * sizeof *sc->workers);
        sc->domain_barrier = aligned_alloc(64, (size_t)sc->plan.n_domains *
                                               sizeof *sc->domain_barrier);
        if (!sc->workers || !sc->domain_barrier)
            s = st_fail(ST_ERR_NOMEM, "out of memory creating the reduction engine for %d "
                        "workers", n);
    }
    if (s != ST_OK) {
        shared_destroy((st_comm_backend *)sc);
        return s;
    }
    for (int w = 0; w < n; w++) {
        atomic_init(&sc->workers[w].attached, 0);
        atomic_init(&sc->workers[w].said, 0);
        atomic_init(&sc->workers[w].summed, 0);
        sc->workers[w].ready = 0;
    }
    st_spin_barrier_init(&sc->barrier, (unsigned)n, cfg->blocking);
    for (int d = 0; d < sc->plan.n_domains; d++)
        st_spin_barrier_init(&sc->domain_barrier[d],
                             (unsigned)(sc->plan.domain_first[d + 1] - sc->plan.domain_first[d]),
                             cfg->blocking);
    *out = (st_comm_backend *)sc;
    return ST_OK;
}

static void shared_set_shard_output(st_comm_backend *b, int w, float *out)
{
    shared_of(b)->plan.slots[w].shard_out = out;
}

/* Kept for w's attach, which cuts its all-gather items at the copies'
 * edges (plan.c, push_ag); a list that is not sorted and disjoint is not
 * taken (the model then converts its weights itself). */
static void shared_set_param_copies(st_comm_backend *b, int w, const st_param_copy *copies,
                                    int n)
{
    comm_slot *me = &shared_of(b)->plan.slots[w];
    for (int i = 1; i < n; i++)
        if (copies[i].offset < copies[i - 1].offset + copies[i - 1].count)
            n = 0;
    me->copies = n > 0 ? copies : NULL;
    me->n_copies = n > 0 ? n : 0;
    me->own_copies = me->copies;
    me->n_own_copies = me->n_copies;
}

static int shared_gathers_copies(const st_comm_backend *b, int w)
{
    return shared_of_const(b)->plan.slots[w].copies_gathered;
}

/* Kept for w's attach like the bf16 copies, and taken alike. */
static void shared_set_param_blocked(st_comm_backend *b, int w, const st_param_blocked *blocked,
                                     int n)
{
    comm_slot *me = &shared_of(b)->plan.slots[w];
    me->n_blocked = st_comm_blocked_taken(blocked, n);
    me->blocked = me->n_blocked ? blocked : NULL;
}

static int shared_gathers_blocked(const st_comm_backend *b, int w)
{
    return shared_of_const(b)->plan.slots[w].blocked_gathered;
}

static void shared_reset(st_comm_backend *b)
{
    shared_comm *sc = shared_of(b);
    st_comm_plan_forget(&sc->plan);
    for (int w = 0; w < sc->plan.n_workers; w++) {
        atomic_init(&sc->workers[w].attached, 0);
        atomic_init(&sc->workers[w].said, 0);   /* the steps count from the next attach */
        atomic_init(&sc->workers[w].summed, 0);
        sc->workers[w].ready = 0;
    }
}

/* ------------------------------------------------------------ attach */

static st_status shared_attach(st_comm_backend *b, int w, st_arena *arena, float *grads,
                               float *params, const st_range *held, const size_t *local,
                               int n_held)
{
    shared_comm *sc = shared_of(b);
    comm_plan *pl = &sc->plan;
    st_status s = ST_OK;
    if (atomic_exchange(&sc->workers[w].attached, 1))
        s = st_fail(ST_ERR_INVALID, "worker %d attached twice", w);
    if (s == ST_OK)
        s = st_comm_plan_register(pl, w, arena, grads, params, held, local, n_held);
    if (s != ST_OK) {
        st_spin_barrier_abort(&sc->barrier);
        return s;
    }
    /* 1: everyone's pointers, ranges and shard buffers are registered */
    if (st_spin_barrier_wait(&sc->barrier))
        return another_failed();
    s = st_comm_plan_check_coverage(pl);
    if (s == ST_OK)
        s = st_comm_plan_check_shared(pl);
    if (s == ST_OK)
        s = st_comm_plan_segments(pl, w);
    if (s != ST_OK) {
        st_spin_barrier_abort(&sc->barrier);
        return s;
    }
    /* 2: every shard's segments (and master values) exist */
    if (st_spin_barrier_wait(&sc->barrier))
        return another_failed();
    s = st_comm_plan_tasks(pl, w);
    if (s != ST_OK) {
        st_spin_barrier_abort(&sc->barrier);
        return s;
    }
    /* 3: every partial's address is in its owner's table */
    if (st_spin_barrier_wait(&sc->barrier))
        return another_failed();
    s = st_comm_plan_owner(pl, w);
    if (s != ST_OK) {
        st_spin_barrier_abort(&sc->barrier);
        return s;
    }
    st_comm_plan_finish(pl, w);
    sc->workers[w].ready = 1;
    return ST_OK;
}

/* ------------------------------------------------------------ the step */

static st_status step_check(shared_comm *sc, int w, const char *what)
{
    if (!sc->workers[w].ready) {
        st_spin_barrier_abort(&sc->barrier);
        return st_fail(ST_ERR_INVALID, "%s: worker %d has not attached", what, w);
    }
    return ST_OK;
}

static st_status shared_reduce_scatter(st_comm_backend *b, int w)
{
    shared_comm *sc = shared_of(b);
    ST_TRY(step_check(sc, w, "reduce-scatter"));
    if (!(sc->plan.roles & ST_COMM_REDUCE))
        return st_fail(ST_ERR_INVALID, "reduce-scatter on a gather-only engine");
    comm_slot *me = &sc->plan.slots[w];
    /* bf16 payloads in buffers: w rounds its own gradient into its buffer
     * (what it has not said final yet: the rest is).  Nobody reads that
     * part of the buffer now, for the reason w's gradient vector could be
     * written: the readers of the previous reduce-scatter are done (the
     * all-gather's entry barrier, or whatever the caller of a reduce-only
     * engine waits at before its next backward), and this write comes
     * after that backward's. */
    st_comm_plan_convert(&sc->plan, w, 0, me->ready_from);
    /* every gradient vector is complete (and the previous all-gather,
     * which read the master shards, is over everywhere).  Shared
     * parameters: every worker's backward, the step's last reader of its
     * domain's vector, is done too, so from here on each owner may write
     * its shard there (its update) until the all-gather's entry barrier */
    if (st_spin_barrier_wait(&sc->barrier))
        return another_failed();
    const size_t sb = sc->plan.shard_begin[w], se = sc->plan.shard_begin[w + 1];
    if (me->rs_mid_barrier) {
        if (me->partial_from == sc->plan.n_params)
            st_comm_run_rs(me->rs1, me->n_rs1, me->ops1, me->scratch, me->wide);
        else   /* the rest of the partials st_comm_reduce_ready began */
            st_comm_plan_partials_part(&sc->plan, w, 0, me->partial_from);
        /* every domain partial is complete */
        if (st_spin_barrier_wait(&sc->barrier))
            return another_failed();
    }
    if (me->done_from == se) {
        st_comm_run_rs(me->rs2, me->n_rs2, me->ops2, me->scratch, me->wide);
    } else {   /* the rest of what st_comm_reduce_ready began */
        st_comm_plan_reduce_part(&sc->plan, w, sb, me->done_from);
    }
    me->step++;
    me->ready_from = sc->plan.n_params;
    me->partial_from = sc->plan.n_params;
    me->done_from = se;
    return ST_OK;
}

/* The least `from` that every worker of [first, last) has published this
 * step, in its `said` counter (summed 0) or its `summed` one: from there
 * on, what they published is true of all of them (acquire: what a worker
 * wrote before publishing is visible here). */
static size_t published_by(const shared_comm *sc, int summed, int first, int last,
                           uint64_t base)
{
    const size_t P = sc->plan.n_params;
    size_t from = 0;
    for (int v = first; v < last; v++) {
        const shared_worker *sw = &sc->workers[v];
        const uint64_t s = atomic_load_explicit(summed ? &sw->summed : &sw->said,
                                                memory_order_acquire);
        const size_t f = s >= base ? P - (size_t)(s - base) : P;
        from = f > from ? f : from;
    }
    return from;
}

static st_status shared_reduce_ready(st_comm_backend *b, int w, size_t from, st_range *done)
{
    shared_comm *sc = shared_of(b);
    ST_TRY(step_check(sc, w, "reduce-ready"));
    comm_plan *pl = &sc->plan;
    comm_slot *me = &pl->slots[w];
    if (!(pl->roles & ST_COMM_REDUCE))
        return ST_OK;
    const size_t P = pl->n_params;
    const int n = pl->n_workers;
    const uint64_t base = me->step * ((uint64_t)P + 1);
    if (from < me->ready_from) {
        st_comm_plan_convert(pl, w, from, me->ready_from);
        me->ready_from = from;
        /* release: w's gradient (and bf16 payload) of [from, P) is written
         * before anyone who reads this value reads them */
        atomic_store_explicit(&sc->workers[w].said, base + (uint64_t)(P - from),
                              memory_order_release);
    }
    /* Every holder's gradient of [lo, P) is final and stays so until the
     * all-gather's entry barrier (no worker writes its gradient before its
     * next backward); the owner alone writes its means.  From the top
     * down, as the backward completes them. */
    size_t lo = published_by(sc, 0, 0, n, base);
    if (me->rs_mid_barrier) {
        /* Two levels: w's partials sum holders of its own domain alone, over
         * what they have all said; the owners' programs read every domain's
         * partials, so an owner reduces only what every worker has summed
         * (a worker without partials publishes what its domain said).  A
         * partial of this step is written after its computer's all-gather of
         * the last, whose entry barrier every owner passed after reading the
         * last step's partials. */
        const int d = me->domain;
        const size_t lo1 = published_by(sc, 0, pl->domain_first[d],
                                        pl->domain_first[d + 1], base);
        if (lo1 < me->partial_from) {
            st_comm_plan_partials_part(pl, w, lo1, me->partial_from);
            me->partial_from = lo1;
            atomic_store_explicit(&sc->workers[w].summed, base + (uint64_t)(P - lo1),
                                  memory_order_release);
        }
        const size_t lo2 = published_by(sc, 1, 0, n, base);
        lo = lo2 > lo ? lo2 : lo;
    }
    if (lo < pl->shard_begin[w])
        lo = pl->shard_begin[w];
    if (lo < me->done_from) {
        st_comm_plan_reduce_part(pl, w, lo, me->done_from);
        *done = (st_range){ lo, me->done_from };
        me->done_from = lo;
    }
    return ST_OK;
}

static st_status shared_all_gather(st_comm_backend *b, int w)
{
    shared_comm *sc = shared_of(b);
    ST_TRY(step_check(sc, w, "all-gather"));
    if (!(sc->plan.roles & ST_COMM_GATHER))
        return st_fail(ST_ERR_INVALID, "all-gather on a reduce-only engine");
    comm_slot *me = &sc->plan.slots[w];
    /* every master shard is updated (and every owner is done reading the
     * gradients and partials).  Shared parameters on one domain: that is
     * all a reader needs, since the owners wrote the vector itself: no
     * copy follows and no other barrier */
    if (st_spin_barrier_wait(&sc->barrier))
        return another_failed();
    st_comm_run_ag(me->ag1, me->n_ag1);
    if (me->ag_mid_barrier) {
        /* every copier's replica holds the remote segments it brings in */
        if (st_spin_barrier_wait(&sc->barrier))
            return another_failed();
        st_comm_run_ag(me->ag2, me->n_ag2);
    }
    if (me->ag_exit_barrier) {
        /* Shared parameters: w's next forward reads the segments the other
         * copiers of its domain are writing into the domain's vector, so it
         * waits for them; only they write what its domain reads (a shard
         * of its own domain was updated before the entry barrier, remote
         * shards come in through this domain's copiers alone), so the
         * domain's barrier suffices.  No copy can still be reading an
         * owner's shard when the owner writes it next: the owner updates
         * after the next reduce-scatter's entry barrier, which every
         * copier reaches after this one. */
        if (st_spin_barrier_wait(&sc->domain_barrier[me->domain]))
            return another_failed();
    }
    return ST_OK;
}

static st_status shared_barrier(st_comm_backend *b, int w)
{
    if (st_spin_barrier_wait(&shared_of(b)->barrier))
        return another_failed();
    return ST_OK;
}

static void shared_abort(st_comm_backend *b)
{
    shared_comm *sc = shared_of(b);
    st_spin_barrier_abort(&sc->barrier);
    for (int d = 0; d < sc->plan.n_domains; d++)
        st_spin_barrier_abort(&sc->domain_barrier[d]);
}

/* ------------------------------------------------------------ queries */

static st_range shared_shard(const st_comm_backend *b, int w)
{
    const comm_plan *pl = &shared_of_const(b)->plan;
    st_range r = { pl->shard_begin[w], pl->shard_begin[w + 1] };
    return r;
}

static float *shared_shard_grads(st_comm_backend *b, int w)
{
    return shared_of(b)->plan.slots[w].shard_grad;
}

static float *shared_shard_params(st_comm_backend *b, int w)
{
    return shared_of(b)->plan.slots[w].master;
}

static uint16_t *shared_shard_params16(st_comm_backend *b, int w)
{
    return shared_of(b)->plan.slots[w].master16;
}

static st_comm_bytes shared_bytes_per_step(const st_comm_backend *b, int w)
{
    const shared_comm *sc = shared_of_const(b);
    st_comm_bytes none = { 0, 0, 0, 0, 0 };
    return sc->workers[w].ready ? sc->plan.slots[w].bytes : none;
}

const st_comm_backend_ops st_comm_shared_ops = {
    .create = shared_create,
    .destroy = shared_destroy,
    .attach = shared_attach,
    .set_shard_output = shared_set_shard_output,
    .set_param_copies = shared_set_param_copies,
    .gathers_copies = shared_gathers_copies,
    .set_param_blocked = shared_set_param_blocked,
    .gathers_blocked = shared_gathers_blocked,
    .reset = shared_reset,
    .shard = shared_shard,
    .shard_grads = shared_shard_grads,
    .shard_params = shared_shard_params,
    .shard_params16 = shared_shard_params16,
    .reduce_scatter = shared_reduce_scatter,
    .reduce_ready = shared_reduce_ready,
    .all_gather = shared_all_gather,
    .barrier = shared_barrier,
    .abort = shared_abort,
    .bytes_per_step = shared_bytes_per_step,
};

/*
 * train/run.c — the common run helpers (run.h): the plan of a run, the
 * run's engine, attaching a worker to engines, the sharded data-parallel
 * step that dp, sdp and synth's recovery epochs share, and evaluation.
 * Calls no strategy.
 *
 * The sharded step of worker w (N > 1, or subnetworks):
 *   compute   samples [(i N + w) B, (i N + w + 1) B) of the epoch's order:
 *             forward, backward -> w's gradient vector
 *   wait      barrier: every gradient is complete (the time spent here is
 *             the imbalance between workers, reported as `wait`)
 *   reduce    reduce-scatter: w's shard of the mean gradient
 *   optimizer w updates its shard of the master weights and optimizer state
 *   gather    all-gather: w's replica gets every updated shard
 */
#include <stdlib.h>
#include <string.h>

#include <subtrain/world.h>

#include "comm/sizing_world.h"
#include "core/error.h"
#include "train/run.h"

st_status st_run_make_plan(const st_train_config *cfg, int workers, const st_dataset *train,
                           run_plan *p)
{
    uint64_t global_batch = st_run_step_rows(cfg) * (uint64_t)workers;
    p->steps_per_epoch = train->count / global_batch;
    if (p->steps_per_epoch == 0 && cfg->accumulate > 1)
        return st_fail(ST_ERR_INVALID, "a global batch of %d worker%s x %d micro-batches x "
                       "%d samples is larger than the training set (%u samples)", workers,
                       workers == 1 ? "" : "s", cfg->accumulate, cfg->batch, train->count);
    if (p->steps_per_epoch == 0)
        return st_fail(ST_ERR_INVALID, "a global batch of %d worker%s x %d samples is larger "
                       "than the training set (%u samples)", workers, workers == 1 ? "" : "s",
                       cfg->batch, train->count);
    p->total_steps = cfg->steps ? cfg->steps : (uint64_t)cfg->epochs * p->steps_per_epoch;
    p->epochs = (int)((p->total_steps + p->steps_per_epoch - 1) / p->steps_per_epoch);
    uint64_t warmup = cfg->warmup_steps == ST_WARMUP_AUTO ? p->total_steps / 20 : cfg->warmup_steps;
    if (cfg->schedule == ST_SCHED_WARMUP_COSINE && warmup >= p->total_steps)
        return st_fail(ST_ERR_INVALID, "warmup (%llu steps) must be shorter than the run (%llu steps)",
                       (unsigned long long)warmup, (unsigned long long)p->total_steps);
    p->schedule = (st_schedule){ cfg->schedule, cfg->optim.lr, warmup, p->total_steps };
    return ST_OK;
}

st_comm_payload st_run_comm_payload(const st_train_config *cfg)
{
    /* bf16 payloads in buffers (ST_COMM_BF16_BUFFER, the config's 0):
     * what the other workers read of a worker's gradient is bf16, half the
     * bytes, at the price of the worker's conversion pass.  The engine can
     * also round as it reads (no buffer, fp32 bytes read, bitwise the
     * same result); doc/reduction.md says what bench_reduce measured of
     * both. */
    return cfg->comm_precision == ST_PRECISION_BF16 ? ST_COMM_PAYLOAD_BF16 : ST_COMM_PAYLOAD_FP32;
}

static st_status create_engine(const run_shared *r, size_t n_params, int roles, int params,
                               int allow_unheld, const st_range *unheld, int n_unheld,
                               const st_range *m16, int n_m16, st_comm **out)
{
    int *domain_of = malloc(sizeof(int) * (size_t)r->n);
    if (!domain_of)
        return st_fail(ST_ERR_NOMEM, "out of memory for the reduction plan");
    for (int k = 0; k < r->n; k++)
        domain_of[k] = r->placement.workers[k].domain;
    st_comm_config cc = { .n_workers = r->n,
                          .n_params = n_params,
                          .domain_of = domain_of,
                          .roles = roles,
                          .allow_unheld = allow_unheld,
                          .unheld_ranges = unheld,
                          .n_unheld_ranges = n_unheld,
                          /* ranks: each rank's workers, the ranks over MPI */
                          .backend = r->ranks > 1 ? ST_COMM_BACKEND_MPI
                                                  : ST_COMM_BACKEND_SHARED,
                          .payload = st_run_comm_payload(r->cfg),
                          /* the engine that carries the masters writes the
                           * domains' copies */
                          .shared_params = params && r->shared_weights &&
                                           (roles == 0 || (roles & ST_COMM_GATHER)),
                          /* a bf16 master in the replicas' or the
                           * domains' copies */
                          .copies_master = params && st_run_copies_master(r) && !n_m16,
                          .bf16_master = m16,
                          .n_bf16_master = n_m16,
                          /* a sizing run's workers only meet, on threads
                           * that outnumber the cores */
                          .blocking = r->sizing };
    st_status s = r->sizing_world && r->ranks > 1
                      ? st_comm_create_sizing(&cc, r->sizing_world, r->rank, out)
                      : st_comm_create(&cc, out);
    free(domain_of);
    return s;
}

st_status st_run_create_engine(const run_shared *r, int roles, int allow_unheld,
                               const st_range *unheld, int n_unheld, st_comm **out)
{
    return create_engine(r, r->n_params, roles, 1, allow_unheld, unheld, n_unheld, NULL, 0,
                         out);
}

st_status st_run_create_engine16(const run_shared *r, int roles, int allow_unheld,
                                 const st_range *unheld, int n_unheld, const st_range *m16,
                                 int n_m16, st_comm **out)
{
    return create_engine(r, r->n_params, roles, 1, allow_unheld, unheld, n_unheld, m16, n_m16,
                         out);
}

st_status st_run_create_vector_engine(const run_shared *r, size_t n, int roles, st_comm **out)
{
    return create_engine(r, n, roles, 0, 0, NULL, 0, NULL, 0, out);
}

/* ------------------------------------------------------------ attaching */

st_status st_run_model_ranges(st_worker *w, int grads, st_range **ranges, size_t **local, int *n)
{
    int count = grads ? st_model_full_grad_ranges(w->model, NULL, NULL, 0)
                      : st_model_full_ranges(w->model, NULL, NULL, 0);
    void *pr, *pl;
    ST_TRY(st_arena_alloc(&w->arena, ST_MEM_WORKSPACE, (size_t)count * sizeof(st_range), &pr));
    ST_TRY(st_arena_alloc(&w->arena, ST_MEM_WORKSPACE, (size_t)count * sizeof(size_t), &pl));
    *ranges = pr;
    *local = pl;
    *n = grads ? st_model_full_grad_ranges(w->model, *ranges, *local, count)
               : st_model_full_ranges(w->model, *ranges, *local, count);
    return ST_OK;
}

static void set_copies(st_comm *c, int wid, const st_model *m, int store)
{
    /* bf16: the engine that gathers the parameters writes the weights' bf16
     * copies as it brings them in (st_run_sharded_update) */
    int n_copies;
    const st_param_copy *copies = st_model_copies(m, &n_copies);
    st_comm_set_param_copies(c, wid, copies, n_copies);
    /* --weight-layout blocked: a replica's copies are packed by the engine
     * as it gathers them, a domain's store by the owners' updates */
    if (!store) {
        int n_blocked;
        const st_param_blocked *blocked = st_model_blocked_copies(m, &n_blocked);
        st_comm_set_param_blocked(c, wid, blocked, n_blocked);
    }
}

void st_run_set_copies(st_comm *c, int wid, const st_worker *w)
{
    set_copies(c, wid, w->model, w->storage.blocked != NULL);
}

void st_run_set_model_copies(st_comm *c, int wid, const st_model *m)
{
    set_copies(c, wid, m, 0);
}

/* Which elements of the full vector w holds, and where they sit in its
 * own.  Backward masking has two engines, because there a worker
 * contributes gradients for its blocks only but needs every parameter for
 * its full forward: a reduce-only engine averages over the gradient
 * holders (it keeps no master and never writes the parameter vector it is
 * given: the gradient vector), a gather-only engine, where everyone holds
 * everything, carries the masters and the all-gather. */
st_status st_run_attach_worker(st_comm *grads_comm, st_comm *params_comm, int wid, st_worker *w,
                               run_attachment *att)
{
    st_range *ranges;
    size_t *local;
    int n;
    ST_TRY(st_run_model_ranges(w, params_comm != NULL, &ranges, &local, &n));
    float *grads = st_model_grads(w->model), *params = st_model_params(w->model);
    if (att) {
        int in_order = 1;
        for (int i = 1; i < n; i++)
            in_order &= local[i] >= local[i - 1] + (ranges[i - 1].end - ranges[i - 1].begin);
        *att = (run_attachment){ grads, ranges, local, n, in_order };
    }
    st_run_set_copies(params_comm ? params_comm : grads_comm, wid, w);
    if (!params_comm)
        return st_comm_attach_compact(grads_comm, wid, &w->arena, grads, params, ranges, local, n);
    ST_TRY(st_comm_attach_compact(grads_comm, wid, &w->arena, grads, grads, ranges, local, n));
    st_range all = { 0, st_model_param_count(w->model) };
    return st_comm_attach(params_comm, wid, &w->arena, params, params, &all, 1);
}

/* ------------------------------------------------------------ the sharded step */

st_status st_run_mean_loss(run_shared *r, float *loss)
{
    /* every worker's loss of every rank, summed in global worker order:
     * the same sum as one process of n_all workers makes */
    double sum = 0.0;
    if (r->ranks == 1) {
        for (int k = 0; k < r->n; k++)
            sum += r->slots[k].loss;
    } else {
        for (int k = 0; k < r->n; k++)
            r->losses_mine[k] = r->slots[k].loss;
        ST_TRY(st_world_allgather(r->losses_mine, sizeof(float) * (size_t)r->n, r->losses_all));
        for (int k = 0; k < r->n_all; k++)
            sum += r->losses_all[k];
    }
    *loss = (float)(sum / r->n_all);
    return ST_OK;
}

/* The optimizer over elements [lo, hi) of w's shard (full layout: the
 * full model's segments say which decay, not w's subnetwork's).  Shared
 * weights: the master shard is w's part of its domain's copy, which its
 * domain reads as it is, so the update writes the shard's bf16 copies too
 * (the all-gather brings other domains' shards); a bf16 master's copies
 * too, where they say which elements it covers. */
static void update_part(run_shared *r, const run_sharded *e, st_worker *w, const float *grads,
                        uint64_t step, float lr, size_t lo, size_t hi)
{
    int n_copies = e->n_copies, n_blocked = 0;
    const st_param_copy *copies = e->copies;
    const st_param_blocked *blocked = NULL;
    if (!e->own_copies && (r->shared_weights || r->cfg->optim.master == ST_MASTER_BF16_SR))
        copies = st_model_copies(w->model, &n_copies);
    if (w->storage.blocked)   /* the domain's, which no forward packs */
        blocked = st_model_blocked_copies(w->model, &n_blocked);
    st_optim_update_blocked(&w->optim, st_comm_shard_params(e->masters, w->id), grads,
                            r->full_segs, r->n_full_segs, lo, hi, step, lr, copies, n_copies,
                            blocked, n_blocked);
}

/* What the updates during the backward did: the shard's elements from
 * `upto` on, `updated` parameters and `bytes` moved (the optimizer counts
 * its last call's, and a step's are all of them). */
typedef struct parts_done {
    size_t upto, updated, bytes;
} parts_done;

/* From the barrier on, the updates during the backward counted in. */
static st_status sharded_update(run_shared *r, const run_sharded *e, st_worker *w, uint64_t i,
                                uint64_t step, double t, float *loss, float *lr,
                                const parts_done *early)
{
    worker_slot *slot = &r->slots[w->id];
    double t1;
    ST_TRY(st_comm_barrier(e->reduce ? e->masters : e->grads, w->id));
    t1 = st_run_now_s();
    slot->times.wait += t1 - t;
    t = t1;
    /* Between this barrier and the all-gather (which needs every worker)
     * no worker can start the next step, so the loss slots are stable. */
    if (w->id == 0) {
        ST_TRY(st_run_mean_loss(r, loss));
        if (e->at_barrier)
            ST_TRY(e->at_barrier(r, e->ctx, w, i, step));
    }
    float *grads;
    if (e->reduce) {
        ST_TRY(e->reduce(r, e->ctx, w, &grads));
    } else {
        ST_TRY(st_comm_reduce_scatter(e->grads, w->id));
        grads = st_comm_shard_grads(e->grads, w->id);
    }
    t1 = st_run_now_s();
    slot->times.reduce += t1 - t;
    t = t1;
    const st_range shard = st_comm_shard(e->masters, w->id);
    *lr = st_schedule_lr(&r->plan.schedule, step);
    update_part(r, e, w, grads, step, *lr, shard.begin, early->upto);
    w->optim.updated += early->updated;
    w->optim.update_bytes += early->bytes;
    t1 = st_run_now_s();
    slot->times.optimizer += t1 - t;
    t = t1;
    ST_TRY(st_comm_all_gather(e->masters, w->id));
    /* nothing writes w's parameters between here and its next forward
     * (a new round of subnetworks builds a new model) */
    if (st_comm_gathers_copies(e->masters, w->id))
        st_model_copies_written(w->model);
    if (st_comm_gathers_blocked(e->masters, w->id))
        st_model_blocked_written(w->model);
    ST_TRY(st_run_pack_gathered(r, e->masters, w));
    slot->times.reduce += st_run_now_s() - t;
    return ST_OK;
}

st_status st_run_sharded_update(run_shared *r, const run_sharded *e, st_worker *w, uint64_t i,
                                uint64_t step, double t, float *loss, float *lr)
{
    const parts_done none = { st_comm_shard(e->masters, w->id).end, 0, 0 };
    return sharded_update(r, e, w, i, step, t, loss, lr, &none);
}

/* What the backward's ready calls need, what they did (the shard's
 * elements from updated_from on are reduced and updated), the time they
 * took and the first failure. */
typedef struct overlap_ctx {
    run_shared *r;
    const run_sharded *e;
    st_worker *w;
    uint64_t step;
    float lr;
    parts_done done;
    double seconds;
    st_status status;
} overlap_ctx;

/* A tail of w's gradient is final: w says so, reduces what of its shard
 * every worker has said (comm.h: st_comm_reduce_ready), and updates that
 * part at once.  Its weights are read by nobody until the next forward:
 * every worker has run the backward of the layers they belong to (a layer
 * reads its own weights alone, in its forward and its backward), and with
 * replicas they are the owner's master, which the all-gather reads after
 * its entry barrier. */
/* A tail [from, ...) of a compact gradient vector as a tail of the full
 * layout: the elements w holds from the full index returned on are those
 * of that tail (the ranges in order; a binary search, nothing stored). */
static size_t full_from(const run_attachment *a, size_t from)
{
    int lo = 0, hi = a->n_ranges;   /* the last range starting at or below from */
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (a->local[mid] <= from)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return 0;   /* every held element is in the tail */
    const st_range *r = &a->ranges[lo - 1];
    const size_t at = a->local[lo - 1];
    return from - at < r->end - r->begin ? r->begin + (from - at) : r->end;
}

static void reduce_ready(void *ctx, size_t from)
{
    overlap_ctx *o = ctx;
    if (o->status != ST_OK)
        return;
    const double t = st_run_now_s();
    st_range done;
    if (o->e->att)
        from = full_from(o->e->att, from);
    o->status = st_comm_reduce_ready(o->e->grads, o->w->id, from, &done);
    if (o->status == ST_OK && done.end > done.begin) {
        update_part(o->r, o->e, o->w, st_comm_shard_grads(o->e->grads, o->w->id), o->step,
                    o->lr, done.begin, done.end);
        o->done.upto = done.begin;
        o->done.updated += o->w->optim.updated;
        o->done.bytes += o->w->optim.update_bytes;
    }
    o->seconds += st_run_now_s() - t;
}

st_status st_run_sharded_step(run_shared *r, const run_sharded *e, st_worker *w, uint64_t i,
                              uint64_t step, float *loss, float *lr)
{
    worker_slot *slot = &r->slots[w->id];
    double t = st_run_now_s(), t1;
    uint32_t first = (uint32_t)((i * (uint64_t)r->n_all + (uint64_t)st_run_global(r, w->id)) *
                                st_run_step_rows(r->cfg));
    overlap_ctx o = { r, e, w, step, st_schedule_lr(&r->plan.schedule, step),
                      { st_comm_shard(e->grads ? e->grads : e->masters, w->id).end, 0, 0 },
                      0.0, ST_OK };
    const int overlap = e->overlap && !r->cfg->reduce_after_backward &&
                        (!e->att || e->att->in_order);
    ST_TRY(st_worker_compute_ready(w, r->train, w->order, first, &slot->loss,
                                   overlap ? reduce_ready : NULL, &o));
    ST_TRY(o.status);
    t1 = st_run_now_s();
    slot->times.compute += t1 - t - o.seconds;
    slot->times.overlapped += o.seconds;
    return sharded_update(r, e, w, i, step, t1, loss, lr, &o.done);
}

st_comm_bytes st_run_engine_bytes(const run_shared *r, int w)
{
    return st_comm_bytes_per_step(r->comm, w);
}

st_status st_run_initial_range(const st_train_config *cfg, size_t begin, size_t end, float *out)
{
    if (!cfg->init_params)
        return st_model_init_full_range(&cfg->model, cfg->seed, begin, end, out);
    memcpy(out, cfg->init_params + begin, (end - begin) * sizeof *out);
    return ST_OK;
}

/* ------------------------------------------------------------ evaluation */

st_status st_run_evaluate_model(st_model *m, const st_dataset *d, double *loss, double *acc)
{
    const int B = st_model_batch(m);
    float *x = st_model_input(m);
    int32_t *y = st_model_labels(m);
    double sum = 0.0;
    int64_t correct = 0;
    for (uint32_t first = 0; first < d->count; first += (uint32_t)B) {
        int rows = d->count - first < (uint32_t)B ? (int)(d->count - first) : B;
        st_dataset_gather_rows(d, first, rows, B, x, y);
        ST_TRY(st_model_evaluate(m, rows, &sum, &correct));
    }
    const double n = (double)d->count * st_dataset_labels_per_sample(d);
    *loss = sum / n;
    *acc = (double)correct / n;
    return ST_OK;
}

/* The test set in its stored order, in batches of B, split round-robin
 * over the workers (all replicas are identical after the all-gather);
 * worker 0 adds the sums up in worker order, so the result does not depend
 * on timing. */
st_status st_run_evaluate_replicas(run_shared *r, st_worker *w, double *loss, double *acc)
{
    const st_dataset *d = r->test;
    const uint32_t B = (uint32_t)r->cfg->batch;
    worker_slot *slot = &r->slots[w->id];
    slot->eval_loss = 0.0;
    slot->eval_correct = 0;
    uint32_t batches = (d->count + B - 1) / B;
    for (uint32_t b = (uint32_t)st_run_global(r, w->id); b < batches; b += (uint32_t)r->n_all) {
        uint32_t first = b * B;
        int rows = d->count - first < B ? (int)(d->count - first) : (int)B;
        st_worker_load_batch(w, d, NULL, first, rows);
        ST_TRY(st_model_evaluate(w->model, rows, &slot->eval_loss, &slot->eval_correct));
    }
    ST_TRY(st_run_sync(r, w->id));
    if (w->id == 0) {
        double sum = 0.0;
        int64_t correct = 0;
        for (int k = 0; k < r->n; k++) {
            sum += r->slots[k].eval_loss;
            correct += r->slots[k].eval_correct;
        }
        if (r->ranks > 1) {   /* the ranks' sums, added in rank order */
            double mine[2] = { sum, (double)correct }, *all = r->eval_all;
            ST_TRY(st_world_allgather(mine, sizeof mine, all));
            sum = 0.0;
            correct = 0;
            for (int k = 0; k < r->ranks; k++) {
                sum += all[2 * k];
                correct += (int64_t)all[2 * k + 1];
            }
        }
        const double n = (double)d->count * st_dataset_labels_per_sample(d);
        *loss = sum / n;
        *acc = (double)correct / n;
    }
    return ST_OK;
}

/* ------------------------------------------------------------ model state */

/* Worker 0 sums in worker order, so the mean does not depend on who
 * arrived first; the state is a few floats per channel (a ResNet's: some
 * thousands), too small to be worth splitting over the workers. */
st_status st_run_sync_state(run_shared *r, st_worker *w)
{
    if (!r->state_full)
        return ST_OK;
    r->slots[w->id].model = w->model;
    ST_TRY(st_run_sync(r, w->id));   /* every model's state final, published */
    if (w->id == 0) {
        memset(r->state_sum, 0, r->n_state * sizeof *r->state_sum);
        memset(r->state_count, 0, r->n_state * sizeof *r->state_count);
        for (int k = 0; k < r->n; k++)
            st_model_state_accumulate(r->slots[k].model, r->state_sum, r->state_count);
        if (r->ranks > 1) {   /* the other ranks' sums and counts */
            ST_TRY(st_world_sum_doubles(r->state_sum, r->n_state));
            ST_TRY(st_world_sum_u32(r->state_count, r->n_state));
        }
        for (size_t f = 0; f < r->n_state; f++)   /* held by nobody: keeps its value */
            if (r->state_count[f])
                r->state_full[f] = (float)(r->state_sum[f] / (double)r->state_count[f]);
    }
    ST_TRY(st_run_sync(r, w->id));   /* the means are there */
    st_run_load_state(r, w->model);
    return ST_OK;
}

void st_run_load_state(const run_shared *r, st_model *m)
{
    if (r->state_full)
        st_model_state_load(m, r->state_full);
}

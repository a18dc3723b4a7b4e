/*
 * train/dp.c — data parallelism: every worker trains the full model on its
 * part of each global batch.
 *
 * N > 1: the sharded step (run.c: compute, wait, reduce-scatter, the
 * shard's update, all-gather) through the run's engine, each worker
 * keeping the optimizer state of its shard only (ZeRO-1).  One worker
 * alone has no engine: it computes and updates its own vector (the solo
 * step below, the hot path of a one-worker run).
 */
#include "core/error.h"
#include "train/strategy.h"

/* Every config: dp has no options of its own. */
static st_status dp_check(const st_train_config *c, int chosen)
{
    (void)c;
    (void)chosen;
    return ST_OK;
}

/* Every worker holds the full model and writes its weights only as a
 * shard owner: one copy per NUMA domain. */
static st_weights dp_weights(const st_train_config *c)
{
    (void)c;
    return ST_WEIGHTS_SHARED;
}

/* No state of its own: the run's engine (N > 1) is all it needs. */
static st_status dp_prepare(run_shared *r, void **state)
{
    *state = NULL;
    ST_TRY(st_run_make_plan(r->cfg, r->n_all, r->train, &r->plan));
    if (r->n_all > 1)
        ST_TRY(st_run_create_engine(r, 0, 0, NULL, 0, &r->comm));
    return ST_OK;
}

static st_status dp_init_worker(run_shared *r, void *state, int wid, st_worker *w,
                                const st_chunk_backend *backend)
{
    (void)state;
    ST_TRY(st_worker_init_base(w, wid, r->train->count, backend));
    ST_TRY(st_run_build_model(r, w, r->cfg, backend));
    if (!r->comm)
        return st_worker_init_optimizer(w, r->cfg, 0, st_model_param_count(w->model));
    ST_TRY(st_run_attach_worker(r->comm, NULL, wid, w, NULL));
    st_range shard = st_comm_shard(r->comm, wid);
    return st_worker_init_optimizer(w, r->cfg, shard.begin, shard.end);
}

/* One worker alone, after its compute: the update of its own vector,
 * writing the bf16 weight copies too (bf16): nothing else writes this
 * vector before the next forward, which then skips their conversion. */
static void solo_update(run_shared *r, st_worker *w, uint64_t step, float *lr)
{
    *lr = st_schedule_lr(&r->plan.schedule, step);
    st_worker_update_own(w, step, *lr);
}

/* One worker alone: compute, then update its own vector. */
static st_status solo_step(run_shared *r, st_worker *w, uint64_t i, uint64_t step, float *loss,
                           float *lr)
{
    worker_slot *slot = &r->slots[0];
    double t = st_run_now_s();
    uint32_t first = (uint32_t)(i * st_run_step_rows(r->cfg));
    ST_TRY(st_worker_compute(w, r->train, w->order, first, loss));
    double t1 = st_run_now_s();
    slot->times.compute += t1 - t;
    solo_update(r, w, step, lr);
    slot->times.optimizer += st_run_now_s() - t1;
    return ST_OK;
}

static st_status dp_step(run_shared *r, void *state, st_worker *w, uint64_t i, uint64_t step,
                         float *loss, float *lr)
{
    (void)state;
    if (!r->comm)
        return solo_step(r, w, i, step, loss, lr);
    run_sharded e = { r->comm, r->comm, NULL, NULL, 1, NULL };
    return st_run_sharded_step(r, &e, w, i, step, loss, lr);
}

/* The update half alone, on the gradients the models hold (the caller ran
 * their forward and backward).  *loss: the workers' mean of their last
 * computed losses (N > 1); left as it is for one worker. */
static st_status dp_update(run_shared *r, void *state, st_worker *w, uint64_t i, uint64_t step,
                           float *loss, float *lr)
{
    (void)state;
    double t = st_run_now_s();
    if (r->comm) {
        run_sharded e = { r->comm, r->comm, NULL, NULL, 0, NULL };
        return st_run_sharded_update(r, &e, w, i, step, t, loss, lr);
    }
    solo_update(r, w, step, lr);
    r->slots[0].times.optimizer += st_run_now_s() - t;
    return ST_OK;
}

/* Resuming: the replica (or w's part of its domain's copy) and optimizer
 * shard, and the master shard (the replica is its all-gather). */
static st_status dp_resume(run_shared *r, void *state, st_worker *w)
{
    (void)state;
    ST_TRY(st_run_resume_model(r, w));
    if (!r->comm)
        return ST_OK;
    st_run_resume_shard(r, r->comm, w->id, st_comm_shard_params(r->comm, w->id));
    return ST_OK;
}

static st_status dp_evaluate(run_shared *r, void *state, st_worker *w, double *loss, double *acc)
{
    (void)state;
    return st_run_evaluate_replicas(r, w, loss, acc);
}

static st_comm_bytes dp_bytes(const run_shared *r, const void *state, int wid)
{
    (void)state;
    return st_run_engine_bytes(r, wid);
}

/* Worker 0's replica (its domain's copy) is the full model (after the
 * all-gather). */
static st_status dp_full_params(run_shared *r, void *state, st_worker *w0, const float **out,
                                size_t *count)
{
    (void)r;
    (void)state;
    *count = st_model_param_count(w0->model);
    *out = st_model_params(w0->model);
    return ST_OK;
}

const st_strategy_ops st_dp_ops = {
    .info = {
        .name = "dp",
        .help = "dp: data parallelism, every worker trains the full\n"
                "model on its part of each global batch (default)",
    },
    .check = dp_check,
    .weights = dp_weights,
    .prepare = dp_prepare,
    .init_worker = dp_init_worker,
    .step = dp_step,
    .update = dp_update,
    .resume = dp_resume,
    .evaluate = dp_evaluate,
    .bytes = dp_bytes,
    .full_params = dp_full_params,
};

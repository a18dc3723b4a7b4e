/*
 * train/dp.c — data parallelism: every worker trains the full model on its
 * part of each global batch.
 *
 * N > 1: the sharded step (run.c: compute, wait, reduce-scatter, the
 * shard's update, all-gather) through the run's engine, each worker
 * keeping the optimizer state of its shard only (ZeRO-1).  One worker
 * alone has no engine: it computes and updates its own vector (the solo
 * step below, the hot path of a one-worker run).
 *
 * --compress randk:Q (compress.c): the gradients' reduce-scatter is
 * replaced by random-k's (a packed engine of the kept coordinates), the
 * run's engine carries the masters and the all-gather only; with any
 * number of workers, one included.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "train/compress.h"
#include "train/strategy.h"

static st_status dp_check(const st_train_config *c, int chosen)
{
    const st_dp_config *o = &c->dp;
    if (!chosen && (o->compress != ST_COMPRESS_NONE || o->error_feedback))
        return st_fail(ST_ERR_INVALID, "%s applies to --strategy dp only",
                       o->compress != ST_COMPRESS_NONE ? "--compress" : "--error-feedback");
    if (!chosen)
        return ST_OK;
    if (o->compress == ST_COMPRESS_RANDK && !(o->keep > 0.0f && o->keep <= 1.0f))
        return st_fail(ST_ERR_INVALID, "--compress randk: Q, the fraction of coordinates kept, "
                       "must be a number in (0, 1]");
    if (o->error_feedback && o->compress == ST_COMPRESS_NONE)
        return st_fail(ST_ERR_INVALID, "--error-feedback keeps what --compress randk:Q drops; "
                       "without --compress there is nothing dropped");
    return ST_OK;
}

/* Every worker holds the full model and writes its weights only as a
 * shard owner: one copy per NUMA domain. */
static st_weights dp_weights(const st_train_config *c)
{
    (void)c;
    return ST_WEIGHTS_SHARED;
}

/* The run's engine (N > 1); compressed, the masters' engine and
 * random-k's state (its own engine), whatever N. */
static st_status dp_prepare(run_shared *r, void **state)
{
    *state = NULL;
    ST_TRY(st_run_make_plan(r->cfg, r->n_all, r->train, &r->plan));
    if (r->cfg->dp.compress == ST_COMPRESS_RANDK) {
        ST_TRY(st_run_create_engine(r, ST_COMM_GATHER, 0, NULL, 0, &r->comm));
        st_randk *k = NULL;
        st_status s = st_randk_create(r, &k);
        *state = k;
        return s;
    }
    if (r->n_all > 1)
        ST_TRY(st_run_create_engine(r, 0, 0, NULL, 0, &r->comm));
    return ST_OK;
}

/* Compressed: w's parameters (its domain's copy) on the masters' engine,
 * which reads no gradient; random-k's buffers. */
static st_status attach_compressed(run_shared *r, st_randk *k, st_worker *w)
{
    st_run_set_copies(r->comm, w->id, w);
    float *p = st_model_params(w->model);
    const st_range all = { 0, st_model_param_count(w->model) };
    ST_TRY(st_comm_attach(r->comm, w->id, &w->arena, p, p, &all, 1));
    return st_randk_attach(k, r, w);
}

static st_status dp_init_worker(run_shared *r, void *state, int wid, st_worker *w,
                                const st_chunk_backend *backend)
{
    ST_TRY(st_worker_init_base(w, wid, r->train->count, backend));
    ST_TRY(st_run_build_model(r, w, r->cfg, backend));
    if (!r->comm)
        return st_worker_init_optimizer(w, r->cfg, 0, st_model_param_count(w->model));
    if (state)
        ST_TRY(attach_compressed(r, state, w));
    else
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
    if (!r->comm)
        return solo_step(r, w, i, step, loss, lr);
    if (state) {
        st_randk_draw(state, w->id, step);
        run_sharded e = { .masters = r->comm, .ctx = state, .reduce = st_randk_reduce };
        return st_run_sharded_step(r, &e, w, i, step, loss, lr);
    }
    run_sharded e = { .grads = r->comm, .masters = r->comm, .overlap = 1 };
    return st_run_sharded_step(r, &e, w, i, step, loss, lr);
}

/* The update half alone, on the gradients the models hold (the caller ran
 * their forward and backward).  *loss: the workers' mean of their last
 * computed losses (N > 1); left as it is for one worker. */
static st_status dp_update(run_shared *r, void *state, st_worker *w, uint64_t i, uint64_t step,
                           float *loss, float *lr)
{
    double t = st_run_now_s();
    if (state) {
        st_randk_draw(state, w->id, step);
        run_sharded e = { .masters = r->comm, .ctx = state, .reduce = st_randk_reduce };
        return st_run_sharded_update(r, &e, w, i, step, t, loss, lr);
    }
    if (r->comm) {
        run_sharded e = { .grads = r->comm, .masters = r->comm };
        return st_run_sharded_update(r, &e, w, i, step, t, loss, lr);
    }
    solo_update(r, w, step, lr);
    r->slots[0].times.optimizer += st_run_now_s() - t;
    return ST_OK;
}

/* Resuming: the replica (or w's part of its domain's copy) and optimizer
 * shard, and the master shard (the replica is its all-gather); error
 * feedback's residual. */
static st_status dp_resume(run_shared *r, void *state, st_worker *w)
{
    ST_TRY(st_run_resume_model(r, w));
    if (!r->comm)
        return ST_OK;
    st_run_resume_master(r, r->comm, w);
    return state ? st_randk_resume(state, r, w) : ST_OK;
}

/* Error feedback's residuals, every worker's. */
static st_status dp_save(run_shared *r, void *state, run_ckpt *ck)
{
    return state ? st_randk_save(state, r, ck) : ST_OK;
}

static st_status dp_evaluate(run_shared *r, void *state, st_worker *w, double *loss, double *acc)
{
    (void)state;
    return st_run_evaluate_replicas(r, w, loss, acc);
}

static st_comm_bytes dp_bytes(const run_shared *r, const void *state, int wid)
{
    return state ? st_randk_bytes(state, r, wid) : st_run_engine_bytes(r, wid);
}

/* Worker 0's replica (its domain's copy) is the full model (after the
 * all-gather), a bf16 master in the copies widened. */
static st_status dp_full_params(run_shared *r, void *state, st_worker *w0, const float **out,
                                size_t *count)
{
    (void)state;
    *count = st_model_param_count(w0->model);
    return st_run_master_full(r, w0, out);
}

static void dp_abort(run_shared *r, void *state)
{
    (void)r;
    st_randk_abort(state);
}

static void dp_release(run_shared *r, void *state)
{
    (void)r;
    st_randk_destroy(state);
}

/* ------------------------------------------------------------ options */

static void dp_defaults(st_train_config *c)
{
    c->dp = (st_dp_config){ .compress = ST_COMPRESS_NONE, .keep = 1.0f, .error_feedback = 0 };
}

static void dp_describe(const st_train_config *c, int workers, char *out, size_t n)
{
    (void)workers;
    if (c->dp.compress == ST_COMPRESS_RANDK)
        snprintf(out, n, " (randk %g%s)", (double)c->dp.keep,
                 c->dp.error_feedback ? ", error feedback" : "");
}

/* none, or randk:Q (st_compress_parse) */
static int parse_compress(const char *text, st_option_value *v, char *why, size_t n)
{
    st_dp_config c = { .compress = ST_COMPRESS_NONE, .keep = 0.0f };
    if (st_compress_parse(text, &c) != ST_OK) {
        snprintf(why, n, "%s", st_last_error());
        return -1;
    }
    v->name = (int)c.compress;
    v->real = c.keep;
    return 0;
}

/* The shortest of %.6g .. %.9g that reads back as the same float. */
static void print_compress(const st_option_value *v, char *out, size_t n)
{
    if (v->name == ST_COMPRESS_NONE) {
        snprintf(out, n, "none");
        return;
    }
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(out, n, "randk:%.*g", digits, v->real);
        if ((float)strtod(out + 6, NULL) == (float)v->real)
            return;
    }
}

static void set_compress(st_train_config *c, const st_option_value *v)
{
    c->dp.compress = (st_compress_kind)v->name;
    if (v->name == ST_COMPRESS_RANDK)
        c->dp.keep = (float)v->real;
}

static int get_compress(const st_train_config *c, st_option_value *v)
{
    v->name = (int)c->dp.compress;
    v->real = c->dp.compress == ST_COMPRESS_RANDK ? c->dp.keep : 0.0;
    return 1;
}

static void set_error_feedback(st_train_config *c, const st_option_value *v)
{
    c->dp.error_feedback = v->name;
}

static int get_error_feedback(const st_train_config *c, st_option_value *v)
{
    v->name = c->dp.error_feedback != 0;
    return 1;
}

static const st_strategy_option dp_options[] = {
    { .name = "compress", .syntax = "none|randk:Q",
      .help = "dp: the gradients' reduction: every coordinate\n"
              "(none, default), or randk:Q, each step a random\n"
              "fraction Q of them, the same for all workers,\n"
              "scaled by 1/Q (unbiased)",
      .kind = ST_OPTION_TEXT, .parse = parse_compress, .print = print_compress, .only = 1,
      .set = set_compress, .get = get_compress },
    { .name = "error-feedback", .syntax = "",
      .help = "dp with --compress randk:Q: each worker adds\n"
              "what it dropped to its next gradient and sends\n"
              "the kept coordinates unscaled (biased)",
      .kind = ST_OPTION_FLAG, .only = 1, .set = set_error_feedback, .get = get_error_feedback },
    { .name = NULL },
};

const st_strategy_ops st_dp_ops = {
    .info = {
        .name = "dp",
        .help = "dp: data parallelism, every worker trains the full\n"
                "model on its part of each global batch (default)",
        .options = dp_options,
    },
    .defaults = dp_defaults,
    .describe = dp_describe,
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
    .save = dp_save,
    .abort = dp_abort,
    .release = dp_release,
};

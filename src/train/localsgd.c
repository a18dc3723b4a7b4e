/*
 * train/localsgd.c — local SGD: every worker trains the full model on its
 * own part of each global batch with its own optimizer, without
 * communication, and every R steps (--local-steps) the parameters are
 * averaged over all workers.  See doc/localsgd.md.
 *
 * The average is the reduction engine's reduce-scatter and all-gather
 * applied to the parameters instead of the gradients, as ist averages its
 * parameters: each owner's shard of the mean goes into its master shard,
 * and the all-gather hands it to every replica.  A round also ends at
 * every epoch end, so that evaluation sees one model.  The optimizer
 * state is zeroed at every average (--optimizer-state reset, the default:
 * Adam's bias correction restarts with it), or averaged like the
 * parameters through engines of its own (keep: its step count runs on).
 *
 * A bf16 master (--master-weights bf16-sr) lives in each replica's bf16
 * copies, as one dp worker's (the fp32 vector has no memory under them):
 * each worker's update rounds its own draw (st_master_replica_key: the
 * run's step and the worker).  The average reads each replica widened
 * into its gradient vector (free between two steps) and rounds the mean
 * stochastically from a stream of its own (st_master_average_key: the
 * run's step and the element), the owner into its replica's copies, which
 * the engine gathers as bf16 (st_comm_config.copies_master).
 *
 * With R = 1 and SGD that is linear in what is averaged (no momentum,
 * or momentum kept), this is data parallelism: the mean of the workers'
 * updated parameters (and momenta) is the update by the mean gradient.
 * The run is then dp's (is_dp): the same sums in dp's order, so bitwise
 * dp's run (tests/test_localsgd.c).  AdamW's update is not linear in the
 * gradient, and momentum reset at every average is plain SGD's, not the
 * configured momentum's: those keep the local path.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "optim/state16.h"
#include "train/strategy.h"

/* What one worker keeps between its steps: its own line, written every
 * step. */
typedef struct lsgd_worker {
    _Alignas(64) uint64_t round_step; /* optimizer steps since its state began */
} lsgd_worker;

typedef struct lsgd_run {
    st_comm *state_comm[2];      /* keep: one engine per state vector (Adam: m
                                  * and v; SGD: momentum) */
    int n_state;                 /* of them in use */
    lsgd_worker *workers;        /* n */
    uint64_t resumed_round_step; /* of the checkpoint resumed */
} lsgd_run;

extern const st_strategy_ops st_dp_ops;

/* One average a step of an update linear in (parameters, momentum,
 * gradient): data parallelism, run as dp runs it. */
static int is_dp(const st_train_config *c)
{
    return c->localsgd.local_steps == 1 && c->optim.kind == ST_OPT_SGD &&
           (c->optim.momentum == 0.0f || c->localsgd.keep_state);
}

static st_weights localsgd_weights(const st_train_config *c)
{
    return is_dp(c) ? st_dp_ops.weights(c) : ST_WEIGHTS_PRIVATE;
}

static st_status localsgd_check(const st_train_config *c, int chosen)
{
    const st_localsgd_config *o = &c->localsgd;
    if (!chosen)
        return ST_OK;
    if (o->local_steps < 1)
        return st_fail(ST_ERR_INVALID, "--local-steps must be >= 1");
    /* the parameters themselves are averaged: bf16 would round them */
    if (c->comm_precision == ST_PRECISION_BF16)
        return st_fail(ST_ERR_INVALID, "--comm-precision bf16 rounds gradients; --strategy "
                       "localsgd averages parameters, which stay fp32 (use dp, sdp or synth, or "
                       "--comm-precision fp32)");
    if (o->keep_state && c->optim.kind == ST_OPT_SGD && c->optim.momentum == 0.0f)
        return st_fail(ST_ERR_INVALID, "--optimizer-state keep: SGD without momentum keeps no "
                       "state");
    if (o->keep_state && c->optim.moments != ST_MOMENTS_FP32)
        return st_fail(ST_ERR_INVALID, "--optimizer-state keep averages the optimizer state "
                       "over the workers in fp32; --optimizer-moments %s keeps it in bf16 (use "
                       "--optimizer-state reset or --optimizer-moments fp32)",
                       st_moments_name(c->optim.moments));
    return ST_OK;
}

/* The plan, the parameters' engine (reduce and gather) and, keeping the
 * optimizer state, one engine per state vector. */
static st_status localsgd_prepare(run_shared *r, void **state)
{
    const st_train_config *cfg = r->cfg;
    if (is_dp(cfg))
        return st_dp_ops.prepare(r, state);
    lsgd_run *s = calloc(1, sizeof *s);
    if (!s)
        return st_fail(ST_ERR_NOMEM, "out of memory for local SGD's state");
    *state = s;
    ST_TRY(st_run_make_plan(cfg, r->n_all, r->train, &r->plan));
    s->workers = aligned_alloc(64, sizeof(lsgd_worker) * (size_t)r->n);
    if (!s->workers)
        return st_fail(ST_ERR_NOMEM, "out of memory for %d workers' rounds", r->n);
    memset(s->workers, 0, sizeof(lsgd_worker) * (size_t)r->n);
    if (r->resume && st_safetensors_meta(r->resume->file, "subtrain.localsgd.round_step"))
        ST_TRY(st_run_resume_meta_steps(r, "subtrain.localsgd.round_step",
                                        &s->resumed_round_step));
    ST_TRY(st_run_create_engine(r, 0, 0, NULL, 0, &r->comm));
    if (cfg->localsgd.keep_state)
        s->n_state = cfg->optim.kind == ST_OPT_ADAMW ? 2 : cfg->optim.momentum > 0.0f;
    for (int i = 0; i < s->n_state; i++)
        ST_TRY(st_run_create_engine(r, 0, 0, NULL, 0, &s->state_comm[i]));
    return ST_OK;
}

/* State vector i of w's optimizer (the full vector's). */
static float *state_vector(st_worker *w, int i)
{
    return i == 0 ? w->optim.m : w->optim.v;
}

/* The full model and its optimizer over the whole vector; the engines
 * read the parameters (and kept state vectors) as if they were gradients
 * and gather the means back into them. */
static st_status localsgd_init_worker(run_shared *r, void *state, int wid, st_worker *w,
                                      const st_chunk_backend *backend)
{
    if (is_dp(r->cfg))
        return st_dp_ops.init_worker(r, state, wid, w, backend);
    lsgd_run *s = state;
    ST_TRY(st_worker_init_base(w, wid, r->train->count, backend));
    ST_TRY(st_run_build_model(r, w, r->cfg, backend));   /* a bf16 master's storage */
    const size_t P = st_model_param_count(w->model);
    ST_TRY(st_worker_init_optimizer(w, r->cfg, 0, P));
    const st_range all = { 0, P };
    float *p = st_model_params(w->model);
    /* a bf16 master's replica is averaged from its gradient vector,
     * which holds it widened then */
    float *read = p;
    if (w->storage.copies_master) {
        if (st_model_grad_count(w->model) != P)
            return st_fail(ST_ERR_INVALID, "localsgd with a bf16 master: the model's gradient "
                           "vector (%zu) is not its parameters' (%zu)",
                           st_model_grad_count(w->model), P);
        read = st_model_grads(w->model);
        w->optim.master_worker = st_run_global(r, wid) + 1;
    }
    st_run_set_copies(r->comm, wid, w);
    ST_TRY(st_comm_attach(r->comm, wid, &w->arena, read, p, &all, 1));
    for (int i = 0; i < s->n_state; i++) {
        float *v = state_vector(w, i);
        ST_TRY(st_comm_attach(s->state_comm[i], wid, &w->arena, v, v, &all, 1));
    }
    return ST_OK;
}

/* One local step: compute on the worker's part of the global batch, then
 * its own optimizer over its replica; no communication. */
static st_status localsgd_step(run_shared *r, void *state, st_worker *w, uint64_t i,
                               uint64_t step, float *loss, float *lr)
{
    if (is_dp(r->cfg))
        return st_dp_ops.step(r, state, w, i, step, loss, lr);
    lsgd_run *s = state;
    worker_slot *slot = &r->slots[w->id];
    double t = st_run_now_s();
    uint32_t first = (uint32_t)((i * (uint64_t)r->n_all + (uint64_t)st_run_global(r, w->id)) *
                                st_run_step_rows(r->cfg));
    ST_TRY(st_worker_compute(w, r->train, w->order, first, loss));
    double t1 = st_run_now_s();
    slot->times.compute += t1 - t;
    *lr = st_schedule_lr(&r->plan.schedule, step);
    w->optim.master_step = step;   /* a bf16 master's draw (master_worker) */
    st_worker_update_own(w, ++s->workers[w->id].round_step, *lr);
    slot->times.optimizer += st_run_now_s() - t1;
    return ST_OK;
}

/* Every worker's vector v replaced by the mean over the workers: the
 * owners' shards of the mean become the master shards, gathered back. */
static st_status average(st_comm *c, int wid)
{
    ST_TRY(st_comm_reduce_scatter(c, wid));
    const st_range shard = st_comm_shard(c, wid);
    memcpy(st_comm_shard_params(c, wid), st_comm_shard_grads(c, wid),
           (shard.end - shard.begin) * sizeof(float));
    return st_comm_all_gather(c, wid);
}

/* The same for a bf16 master's replicas after the run's step `step`: each
 * widened into its gradient vector (attached as what is reduced), the
 * owner's shard of the mean rounded stochastically into its replica's
 * copies (the elements outside them into its master shard, fp32), and
 * the all-gather brings the copies in as bf16. */
static st_status average_master(const run_shared *r, st_worker *w, uint64_t step)
{
    st_comm *c = r->comm;
    const int wid = w->id;
    st_run_master_widen(w, 0, st_model_param_count(w->model), st_model_grads(w->model));
    ST_TRY(st_comm_reduce_scatter(c, wid));
    const st_range shard = st_comm_shard(c, wid);
    const float *mean = st_comm_shard_grads(c, wid);   /* mean[i - shard.begin] */
    float *master = st_comm_shard_params(c, wid);
    const uint32_t key = st_master_average_key(r->cfg->seed, step);
    int n;
    const st_param_copy *cp = st_model_copies(w->model, &n);
    size_t at = shard.begin;   /* the copies are sorted and disjoint */
    for (int i = 0; i <= n && at < shard.end; i++) {
        const size_t lo = i < n ? cp[i].offset : shard.end, hi = i < n ? lo + cp[i].count : lo;
        const size_t to = lo < shard.end ? (lo > at ? lo : at) : shard.end;
        if (to > at)   /* no copy: fp32 */
            memcpy(master + (at - shard.begin), mean + (at - shard.begin),
                   (to - at) * sizeof *master);
        const size_t end = hi < shard.end ? hi : shard.end;
        if (i < n && end > to)
            st_master_round_sr(cp[i].bf16 + (to - lo), mean + (to - shard.begin), end - to, key,
                               to);
        at = end > at ? end : at;
    }
    return st_comm_all_gather(c, wid);
}

/* The end of a round (every R steps and at the end of an epoch): the
 * parameters averaged, the optimizer state averaged or zeroed. */
static st_status localsgd_round_end(run_shared *r, void *state, st_worker *w, uint64_t step,
                                    int last)
{
    lsgd_run *s = state;
    if (is_dp(r->cfg) || (step % r->cfg->localsgd.local_steps != 0 && !last))
        return ST_OK;
    const int wid = w->id;
    double t = st_run_now_s();
    if (w->storage.copies_master)
        ST_TRY(average_master(r, w, step));
    else
        ST_TRY(average(r->comm, wid));
    if (st_comm_gathers_copies(r->comm, wid))
        st_model_copies_written(w->model);
    else
        st_model_params_changed(w->model);
    if (st_comm_gathers_blocked(r->comm, wid))
        st_model_blocked_written(w->model);
    for (int i = 0; i < s->n_state; i++)
        ST_TRY(average(s->state_comm[i], wid));
    if (!r->cfg->localsgd.keep_state) {
        st_optim_reset(&w->optim);
        s->workers[wid].round_step = 0;
    }
    r->slots[wid].times.reduce += st_run_now_s() - t;
    return ST_OK;
}

/* A checkpoint holds the state at a round end only: in a round the
 * replicas differ. */
static int localsgd_whole_after(const run_shared *r, uint64_t step, int last)
{
    return last || step % r->cfg->localsgd.local_steps == 0;
}

/* At a round end every replica is the model and every optimizer state the
 * same (the loop saves them); Adam's step count (every worker's is
 * equal). */
static st_status localsgd_save(run_shared *r, void *state, run_ckpt *ck)
{
    if (is_dp(r->cfg))
        return st_dp_ops.save ? st_dp_ops.save(r, state, ck) : ST_OK;
    lsgd_run *s = state;
    return st_run_ckpt_meta(ck, "subtrain.localsgd.round_step", "%llu",
                            (unsigned long long)s->workers[0].round_step);
}

static st_status localsgd_resume(run_shared *r, void *state, st_worker *w)
{
    if (is_dp(r->cfg))
        return st_dp_ops.resume(r, state, w);
    lsgd_run *s = state;
    ST_TRY(st_run_resume_model(r, w));
    s->workers[w->id].round_step = s->resumed_round_step;
    return ST_OK;
}

/* The replicas are the model after a round end (one ends every epoch). */
static st_status localsgd_evaluate(run_shared *r, void *state, st_worker *w, double *loss,
                                   double *acc)
{
    (void)state;
    return st_run_evaluate_replicas(r, w, loss, acc);
}

/* Per round: the parameters' reduce-scatter and all-gather, and the kept
 * state vectors'. */
static st_comm_bytes localsgd_bytes(const run_shared *r, const void *state, int wid)
{
    if (is_dp(r->cfg))
        return st_dp_ops.bytes(r, state, wid);
    const lsgd_run *s = state;
    st_comm_bytes b = st_run_engine_bytes(r, wid);
    for (int i = 0; i < s->n_state; i++) {
        st_comm_bytes g = st_comm_bytes_per_step(s->state_comm[i], wid);
        b.read += g.read;
        b.written += g.written;
        b.cross_domain_read += g.cross_domain_read;
        b.gather_read += g.gather_read;
        b.gather_written += g.gather_written;
    }
    return b;
}

/* The bytes are a round's, once every R steps. */
static void localsgd_record(const run_shared *r, void *state, st_epoch_record *rec)
{
    (void)state;
    const double R = (double)r->cfg->localsgd.local_steps;
    rec->comm_bytes_per_worker_step /= R;
    rec->comm_bytes_per_worker_round = rec->comm_bytes_per_worker_step * R;
}

/* Worker 0's replica (the model, after the run's last round end), a
 * bf16 master's widened. */
static st_status localsgd_full_params(run_shared *r, void *state, st_worker *w0,
                                      const float **out, size_t *count)
{
    (void)state;
    *count = st_model_param_count(w0->model);
    return st_run_master_full(r, w0, out);
}

static void localsgd_abort(run_shared *r, void *state)
{
    if (is_dp(r->cfg)) {
        if (st_dp_ops.abort)
            st_dp_ops.abort(r, state);
        return;
    }
    lsgd_run *s = state;
    for (int i = 0; i < s->n_state; i++)
        st_comm_abort(s->state_comm[i]);
}

static void localsgd_release(run_shared *r, void *state)
{
    if (is_dp(r->cfg)) {
        if (st_dp_ops.release)
            st_dp_ops.release(r, state);
        return;
    }
    lsgd_run *s = state;
    if (!s)
        return;
    for (int i = 0; i < 2; i++)
        st_comm_destroy(s->state_comm[i]);
    free(s->workers);
    free(s);
}

/* ------------------------------------------------------------ options */

static void localsgd_defaults(st_train_config *c)
{
    c->localsgd = (st_localsgd_config){ .local_steps = 50, .keep_state = 0 };
}

static void localsgd_describe(const st_train_config *c, int workers, char *out, size_t n)
{
    (void)workers;
    snprintf(out, n, " (%llu local steps, optimizer state %s)",
             (unsigned long long)c->localsgd.local_steps,
             c->localsgd.keep_state ? "averaged" : "reset");
}

static const char *const state_names[] = { "reset", "keep", NULL };

static void set_local_steps(st_train_config *c, const st_option_value *v)
{
    c->localsgd.local_steps = v->count;
}

static int get_local_steps(const st_train_config *c, st_option_value *v)
{
    v->count = c->localsgd.local_steps;
    return 1;
}

static void set_state(st_train_config *c, const st_option_value *v)
{
    c->localsgd.keep_state = v->name;
}

static int get_state(const st_train_config *c, st_option_value *v)
{
    v->name = c->localsgd.keep_state != 0;
    return 1;
}

static const st_strategy_option localsgd_options[] = {
    { .name = "local-steps", .syntax = "R",
      .help = "localsgd: steps between two averages (default 50)",
      .kind = ST_OPTION_COUNT, .lo = 1, .hi = 1000000000, .set = set_local_steps,
      .get = get_local_steps },
    { .name = "optimizer-state", .syntax = "reset|keep",
      .help = "localsgd: zero the optimizer state at\n"
              "every average (default) or keep it, averaged too",
      .kind = ST_OPTION_NAME, .names = state_names, .set = set_state, .get = get_state },
    { .name = NULL },
};

const st_strategy_ops st_localsgd_ops = {
    .info = {
        .name = "localsgd",
        .help = "localsgd: every worker trains the full model on its\n"
                "own batches, and every --local-steps steps the\n"
                "parameters are averaged over all workers (local SGD)",
        .options = localsgd_options,
    },
    .defaults = localsgd_defaults,
    .check = localsgd_check,
    .weights = localsgd_weights,
    .describe = localsgd_describe,
    .prepare = localsgd_prepare,
    .init_worker = localsgd_init_worker,
    .step = localsgd_step,
    .round_end = localsgd_round_end,
    .whole_after = localsgd_whole_after,
    .save = localsgd_save,
    .resume = localsgd_resume,
    .evaluate = localsgd_evaluate,
    .bytes = localsgd_bytes,
    .record = localsgd_record,
    .full_params = localsgd_full_params,
    .abort = localsgd_abort,
    .release = localsgd_release,
};

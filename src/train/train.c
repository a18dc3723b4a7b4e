/*
 * train/train.c — the training loop: N workers, epochs of shuffled global
 * batches, one optimizer step per global batch, evaluation on the test set
 * after each epoch.
 *
 * One persistent OpenMP parallel region runs the whole training, one thread
 * per worker; no thread is created per step.  Each thread binds itself to
 * its PU (st_plan_bind_self; subtrain is the binding authority), sets its
 * OpenMP nthreads-var to 1 (oneDNN's OpenMP runtime sizes a primitive's
 * parallelism from the calling thread's, so this keeps a worker on its
 * core), and then creates its arena, model and primitives itself, so that
 * they live on its NUMA node and belong to its thread.
 *
 * A data-parallel step of worker w (N > 1):
 *   compute   samples [(i N + w) B, (i N + w + 1) B) of the epoch's order:
 *             forward, backward -> w's gradient vector
 *   wait      barrier: every gradient is complete (the time spent here is
 *             the imbalance between workers, reported as `wait`)
 *   reduce    reduce-scatter: w's shard of the mean gradient
 *   optimizer w updates its shard of the master weights and optimizer state
 *   gather    all-gather: w's replica gets every updated shard
 * With one worker there is no reduction: the worker updates its own vector.
 * Subnetwork data parallelism (sdp.c) runs the same step on subnetworks.
 */
#define _GNU_SOURCE /* pthread_{get,set}affinity_np */
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <subtrain/comm.h>
#include <subtrain/topo.h>

#include "core/error.h"
#include "train/run.h"

st_train_config st_train_config_default(void)
{
    st_train_config c = {
        .strategy = ST_STRATEGY_DP,
        .subnet = ST_SUBNET_BLOCK,
        .masking = ST_MASKING_FORWARD,
        .coverage = 0.5,
        .resample = 0,
        .scale_branches = 1,
        .local_steps = 50,
        .ist_eval_scale = 1,
        .ist_train_scale = -1,
        .neuron_group = 16,
        .workers = 1,
        .model = st_model_config_default(),
        .optim = st_optim_config_default(),
        .schedule = ST_SCHED_WARMUP_COSINE,
        .warmup_steps = ST_WARMUP_AUTO,
        .batch = 128,
        .epochs = 5,
        .steps = 0,
        .seed = 1,
        .synth = st_synth_config_default(),
    };
    return c;
}

st_status st_train_config_check(const st_train_config *c)
{
    ST_TRY(st_model_config_check(&c->model));
    ST_TRY(st_optim_config_check(&c->optim));
    if (c->strategy != ST_STRATEGY_DP && c->strategy != ST_STRATEGY_SDP &&
        c->strategy != ST_STRATEGY_IST && c->strategy != ST_STRATEGY_SYNTH)
        return st_fail(ST_ERR_INVALID, "unknown strategy %d (allowed: dp, sdp, ist, synth)",
                       (int)c->strategy);
    if (c->neuron_group < 1 || c->neuron_group > 65536)
        return st_fail(ST_ERR_INVALID, "--neuron-group must be in [1, 65536], got %d",
                       c->neuron_group);
    ST_TRY(st_sdp_check_config(c));
    ST_TRY(st_ist_check_config(c));
    ST_TRY(st_synth_check_config(c));
    if (c->workers < 0 || c->workers > 4096)
        return st_fail(ST_ERR_INVALID, "workers must be in [1, 4096] (or 0: one per core), got %d",
                       c->workers);
    if (c->batch < 1 || c->batch > 65536)
        return st_fail(ST_ERR_INVALID, "batch must be in [1, 65536], got %d", c->batch);
    if (c->steps == 0 && (c->epochs < 1 || c->epochs > 100000))
        return st_fail(ST_ERR_INVALID, "epochs must be in [1, 100000], got %d", c->epochs);
    if (c->schedule == ST_SCHED_WARMUP_COSINE && c->warmup_steps != ST_WARMUP_AUTO &&
        c->steps && c->warmup_steps >= c->steps)
        return st_fail(ST_ERR_INVALID, "warmup (%llu steps) must be shorter than the run (%llu steps)",
                       (unsigned long long)c->warmup_steps, (unsigned long long)c->steps);
    return ST_OK;
}

st_status st_run_make_plan(const st_train_config *cfg, int workers, const st_dataset *train,
                           run_plan *p)
{
    uint64_t global_batch = (uint64_t)cfg->batch * (uint64_t)workers;
    p->steps_per_epoch = train->count / global_batch;
    if (p->steps_per_epoch == 0)
        return st_fail(ST_ERR_INVALID, "a global batch of %d workers x %d samples is larger than "
                       "the training set (%u samples)", workers, cfg->batch, train->count);
    p->total_steps = cfg->steps ? cfg->steps : (uint64_t)cfg->epochs * p->steps_per_epoch;
    p->epochs = (int)((p->total_steps + p->steps_per_epoch - 1) / p->steps_per_epoch);
    uint64_t warmup = cfg->warmup_steps == ST_WARMUP_AUTO ? p->total_steps / 20 : cfg->warmup_steps;
    if (cfg->schedule == ST_SCHED_WARMUP_COSINE && warmup >= p->total_steps)
        return st_fail(ST_ERR_INVALID, "warmup (%llu steps) must be shorter than the run (%llu steps)",
                       (unsigned long long)warmup, (unsigned long long)p->total_steps);
    p->schedule = (st_schedule){ cfg->schedule, cfg->optim.lr, warmup, p->total_steps };
    return ST_OK;
}


/* ------------------------------------------------------------ one step */

/* Data parallel, N > 1: compute, wait, reduce, update the shard, gather. */
static st_status dp_step(run_shared *r, st_worker *w, uint64_t i, uint64_t step, float *loss,
                         float *lr)
{
    const int n = r->n, B = r->cfg->batch;
    worker_slot *slot = &r->slots[w->id];
    double t = st_run_now_s(), t1;
    uint32_t first = (uint32_t)((i * (uint64_t)n + (uint64_t)w->id) * (uint64_t)B);
    ST_TRY(st_worker_compute(w, r->train, w->order, first, &slot->loss));
    t1 = st_run_now_s();
    slot->times.compute += t1 - t;
    t = t1;
    ST_TRY(st_comm_barrier(r->comm, w->id));
    t1 = st_run_now_s();
    slot->times.wait += t1 - t;
    t = t1;
    /* Between this barrier and the all-gather (which needs every worker)
     * no worker can start the next step, so the loss slots are stable. */
    if (w->id == 0) {
        double sum = 0.0;
        for (int k = 0; k < n; k++)
            sum += r->slots[k].loss;
        *loss = (float)(sum / n);
        if (r->cfg->align_every && step % r->cfg->align_every == 0)
            ST_TRY(st_sdp_measure_alignment(r, w, i));
    }
    ST_TRY(st_comm_reduce_scatter(r->comm, w->id));
    t1 = st_run_now_s();
    slot->times.reduce += t1 - t;
    t = t1;
    /* the shard is a range of the full layout: the full model's segments
     * say which of its elements decay, not w's subnetwork's */
    st_range shard = st_comm_shard(r->comm, w->id);
    *lr = st_schedule_lr(&r->plan.schedule, step);
    st_optim_update(&w->optim, st_comm_shard_params(st_run_masters(r), w->id),
                    st_comm_shard_grads(r->comm, w->id), r->full_segs, r->n_full_segs,
                    shard.begin, shard.end, step, *lr);
    t1 = st_run_now_s();
    slot->times.optimizer += t1 - t;
    t = t1;
    ST_TRY(st_comm_all_gather(st_run_masters(r), w->id));
    slot->times.reduce += st_run_now_s() - t;
    return ST_OK;
}

/* One worker alone: compute, then update its own vector. */
static st_status solo_step(run_shared *r, st_worker *w, uint64_t i, uint64_t step, float *loss,
                           float *lr)
{
    worker_slot *slot = &r->slots[0];
    double t = st_run_now_s();
    uint32_t first = (uint32_t)(i * (uint64_t)r->cfg->batch);
    ST_TRY(st_worker_compute(w, r->train, w->order, first, loss));
    double t1 = st_run_now_s();
    slot->times.compute += t1 - t;
    int n_segs;
    const st_param_segment *segs = st_model_segments(w->model, &n_segs);
    *lr = st_schedule_lr(&r->plan.schedule, step);
    st_optim_update(&w->optim, st_model_params(w->model), st_model_grads(w->model), segs,
                    n_segs, 0, st_model_param_count(w->model), step, *lr);
    slot->times.optimizer += st_run_now_s() - t1;
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
        memcpy(x, d->x + (size_t)first * d->dim, (size_t)rows * d->dim * sizeof *x);
        memset(x + (size_t)rows * d->dim, 0, (size_t)(B - rows) * d->dim * sizeof *x);
        for (int i = 0; i < B; i++)
            y[i] = i < rows ? d->y[first + (uint32_t)i] : 0;
        ST_TRY(st_model_evaluate(m, rows, &sum, &correct));
    }
    *loss = sum / d->count;
    *acc = (double)correct / d->count;
    return ST_OK;
}

/* The test set in its stored order, in batches of B, split round-robin
 * over the workers (all replicas are identical after the all-gather);
 * worker 0 adds the sums up in worker order, so the result does not depend
 * on timing. */
static st_status evaluate_replicas(run_shared *r, st_worker *w, double *loss, double *acc)
{
    const st_dataset *d = r->test;
    const uint32_t B = (uint32_t)r->cfg->batch;
    worker_slot *slot = &r->slots[w->id];
    slot->eval_loss = 0.0;
    slot->eval_correct = 0;
    uint32_t batches = (d->count + B - 1) / B;
    for (uint32_t b = (uint32_t)w->id; b < batches; b += (uint32_t)r->n) {
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
        *loss = sum / d->count;
        *acc = (double)correct / d->count;
    }
    return ST_OK;
}

static st_status evaluate(run_shared *r, st_worker *w, double *loss, double *acc)
{
    return r->eval_model ? st_sdp_evaluate_full(r, w, loss, acc) : evaluate_replicas(r, w, loss, acc);
}

/* ------------------------------------------------------------ records */

/* What worker w reads and writes in a step: with two engines, the
 * gradients' reduce-scatter and the parameters' all-gather. */
static st_comm_bytes step_bytes(const run_shared *r, int w)
{
    st_comm_bytes b = st_comm_bytes_per_step(r->comm, w);
    for (int i = 0; i < r->n_state; i++) {   /* ist: state vectors travel too */
        st_comm_bytes g = st_comm_bytes_per_step(r->state_comm[i], w);
        b.read += g.read;
        b.written += g.written;
        b.cross_domain_read += g.cross_domain_read;
    }
    if (r->cfg->strategy == ST_STRATEGY_IST) {
        /* the next round's subnetwork loaded from the saved shards: ist's
         * counterpart of the all-gather (cross-domain reads not split out) */
        size_t half = r->slots[w].load_bytes / 2;
        b.read += half;
        b.written += half;
        b.gather_read += half;
        b.gather_written += half;
    }
    if (!r->params_comm)
        return b;
    st_comm_bytes g = st_comm_bytes_per_step(r->params_comm, w);
    b.read = b.read - b.gather_read + g.gather_read;
    b.written = b.written - b.gather_written + g.gather_written;
    b.gather_read = g.gather_read;
    b.gather_written = g.gather_written;
    return b;
}

/* Worker 0, after a barrier: combine the slots into the epoch record. */
static void fill_record(run_shared *r, st_epoch_record *rec, uint64_t steps_in_epoch)
{
    step_times sum = { 0, 0, 0, 0 };
    size_t worst = 0;
    double bytes = 0.0;
    for (int k = 0; k < r->n; k++) {
        const worker_slot *s = &r->slots[k];
        sum.compute += s->times.compute;
        sum.wait += s->times.wait;
        sum.reduce += s->times.reduce;
        sum.optimizer += s->times.optimizer;
        if (s->memory.peak_total > r->slots[worst].memory.peak_total)
            worst = (size_t)k;
        double b = (double)(s->bytes.read + s->bytes.written);
        if (r->cfg->strategy == ST_STRATEGY_IST) /* once a round of R steps */
            b /= (double)r->cfg->local_steps;
        if (b > bytes)
            bytes = b;
    }
    double per = 1e3 / ((double)r->n * (double)(steps_in_epoch ? steps_in_epoch : 1));
    rec->step_ms_compute = sum.compute * per;
    rec->step_ms_wait = sum.wait * per;
    rec->step_ms_reduce = sum.reduce * per;
    rec->step_ms_optimizer = sum.optimizer * per;
    rec->memory = r->slots[worst].memory;
    for (int k = 0; k < r->n; k++)
        r->memory[k] = r->slots[k].memory;
    rec->worker_memory = r->memory;
    rec->align_measured = r->align_count;
    rec->align_mean = r->align_count ? r->align_sum / r->align_count : 0.0;
    rec->align_min = r->align_count ? r->align_min : 0.0;
    rec->workers = r->n;
    rec->comm_bytes_per_worker_step = bytes;
    rec->comm_bytes_per_worker_round =
        r->cfg->strategy == ST_STRATEGY_IST ? bytes * (double)r->cfg->local_steps : 0.0;
    rec->ring_bytes_per_worker_step =
        r->n > 1 ? st_comm_ring_bytes(r->n, st_model_config_param_count(&r->cfg->model)) : 0.0;
}

static void report_step(run_shared *r, int epoch, uint64_t step, float loss, float lr,
                        double train_time)
{
    const st_train_callbacks *cb = r->cb;
    if (!cb || !cb->on_step)
        return;
    double now = st_run_now_s();
    double samples = (double)step * r->cfg->batch * r->n;
    st_step_info info = {
        step, r->plan.total_steps, epoch, r->plan.epochs, loss, lr, samples / train_time,
        now - r->t0, train_time / (double)step * (double)(r->plan.total_steps - step),
    };
    cb->on_step(&info, cb->user);
}

/* ------------------------------------------------------------ a worker */

st_status st_run_worker_loop(run_shared *r, st_worker *w)
{
    const run_plan *p = &r->plan;
    const int global_batch = r->cfg->batch * r->n;
    worker_slot *slot = &r->slots[w->id];
    double train_time = 0.0;   /* worker 0's view: training time so far */
    uint64_t step = 0, rounds = 0;
    st_epoch_record rec;
    memset(&rec, 0, sizeof rec);

    for (int epoch = 1; epoch <= p->epochs; epoch++) {
        /* Every worker draws the same order from the seed: no sharing. */
        st_epoch_order(r->cfg->seed, r->order_offset + (uint64_t)epoch - 1, w->order,
                       r->train->count);
        memset(&slot->times, 0, sizeof slot->times);
        if (w->id == 0) {
            r->align_sum = 0.0;
            r->align_count = 0;
        }
        double loss_sum = 0.0, te = st_run_now_s();
        uint64_t n = 0;
        float lr = 0.0f;
        for (uint64_t i = 0; i < p->steps_per_epoch && step < p->total_steps; i++, n++) {
            float loss = 0.0f;
            if (r->cfg->strategy == ST_STRATEGY_SDP && r->cfg->resample && step > 0 &&
                step % r->cfg->resample == 0)
                ST_TRY(st_sdp_new_round(r, w, step / r->cfg->resample));
            step++;
            if (r->cfg->strategy == ST_STRATEGY_IST) {
                ST_TRY(st_ist_step(r, w, i, step, &loss, &lr));
                /* a round ends every R steps and at the end of an epoch */
                int epoch_end = i + 1 == p->steps_per_epoch || step == p->total_steps;
                if (step % r->cfg->local_steps == 0 || epoch_end)
                    ST_TRY(st_ist_round_end(r, w, ++rounds));
            } else {
                ST_TRY(r->comm ? dp_step(r, w, i, step, &loss, &lr)
                               : solo_step(r, w, i, step, &loss, &lr));
            }
            if (w->id == 0) {
                loss_sum += loss;
                report_step(r, epoch, step, loss, lr, train_time + (st_run_now_s() - te));
            }
        }
        double epoch_time = st_run_now_s() - te;
        train_time += epoch_time;

        ST_TRY(evaluate(r, w, &rec.test_loss, &rec.test_acc));
        slot->memory = w->arena.stats;
        if (r->comm)
            slot->bytes = step_bytes(r, w->id);
        ST_TRY(st_run_sync(r, w->id));
        if (w->id == 0) {
            rec.epoch = epoch;
            rec.epochs = p->epochs;
            rec.step = step;
            rec.train_loss = loss_sum / (double)n;
            rec.samples_per_s = (double)n * global_batch / epoch_time;
            rec.lr = lr;
            rec.wall_s = st_run_now_s() - r->t0;
            fill_record(r, &rec, n);
            if (r->cb && r->cb->on_epoch)
                r->cb->on_epoch(&rec, r->cb->user);
        }
        /* The slots are read by worker 0 until here. */
        ST_TRY(st_run_sync(r, w->id));
    }
    if (w->id == 0) {
        rec.final = 1;
        rec.samples_per_s = (double)step * global_batch / train_time;
        if (r->cb && r->cb->on_epoch)
            r->cb->on_epoch(&rec, r->cb->user);
        r->final = rec;
        /* subnetworks: the full model the last evaluation loaded from the
         * masters; otherwise worker 0's replica is the full model */
        st_model *m = r->eval_model ? r->eval_model : w->model;
        if (r->cb && r->cb->on_params)
            r->cb->on_params(st_model_params(m), st_model_param_count(m), r->cb->user);
    }
    return ST_OK;
}

/* Worker 0, once every worker has built its memory: what the user should
 * hear about placement. */
static void report_warnings(run_shared *r)
{
    const st_train_callbacks *cb = r->cb;
    if (!cb || !cb->on_warning)
        return;
    if (r->placement.warning[0])
        cb->on_warning(r->placement.warning, cb->user);
    for (int k = 0; k < r->n; k++)
        if (r->slots[k].numa.warned) {
            cb->on_warning(r->slots[k].numa.warning, cb->user);
            break; /* the same refusal for every worker: once is enough */
        }
}

/* Registers w's vectors with the reduction engine: which elements of the
 * full vector it holds, and where they sit in its own.
 *
 * Backward masking has two engines, because there a worker contributes
 * gradients for its blocks only but needs every parameter for its full
 * forward: a reduce-only engine averages over the gradient holders (it
 * keeps no master and never writes the parameter vector it is given: the
 * gradient vector), a gather-only engine, where everyone holds everything,
 * carries the masters and the all-gather. */
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

st_status st_run_attach_worker(run_shared *r, int wid, st_worker *w)
{
    st_range *ranges;
    size_t *local;
    int n;
    ST_TRY(st_run_model_ranges(w, r->params_comm != NULL, &ranges, &local, &n));
    float *grads = st_model_grads(w->model), *params = st_model_params(w->model);
    worker_slot *slot = &r->slots[wid];
    slot->grads = grads;
    slot->ranges = ranges;
    slot->local = local;
    slot->n_ranges = n;
    if (!r->params_comm)
        return st_comm_attach_compact(r->comm, wid, &w->arena, grads, params, ranges, local, n);
    ST_TRY(st_comm_attach_compact(r->comm, wid, &w->arena, grads, grads, ranges, local, n));
    st_range all = { 0, st_model_param_count(w->model) };
    return st_comm_attach(r->params_comm, wid, &w->arena, params, params, &all, 1);
}

static st_status worker_main(run_shared *r, int wid, st_worker *w)
{
    worker_slot *slot = &r->slots[wid];
    const st_placement *pl = &r->placement.workers[wid];
    ST_TRY(st_plan_bind_self(r->topology, &r->placement, wid));
    st_chunk_backend backend = st_numa_backend(&slot->numa, r->topology, pl->numa_os);
    if (r->cfg->strategy == ST_STRATEGY_SYNTH) {
        ST_TRY(st_synth_init_worker(r, wid, w, &backend));
    } else if (r->cfg->strategy == ST_STRATEGY_SDP) {
        ST_TRY(st_sdp_init_worker(r, wid, w, &backend));
    } else if (r->cfg->strategy == ST_STRATEGY_IST) {
        ST_TRY(st_ist_init_worker(r, wid, w, &backend));
    } else if (r->comm) {
        ST_TRY(st_worker_init(w, wid, r->cfg, r->train->count, &backend));
        ST_TRY(st_run_attach_worker(r, wid, w));
        st_range shard = st_comm_shard(r->comm, wid);
        ST_TRY(st_worker_init_optimizer(w, r->cfg, shard.begin, shard.end));
    } else {
        ST_TRY(st_worker_init(w, wid, r->cfg, r->train->count, &backend));
        ST_TRY(st_worker_init_optimizer(w, r->cfg, 0, st_model_param_count(w->model)));
    }
    int subnets = (r->cfg->strategy == ST_STRATEGY_SDP && r->cfg->masking == ST_MASKING_FORWARD) ||
                  r->cfg->strategy == ST_STRATEGY_IST;
    if (wid == 0 && subnets) {
        st_model_config full = r->cfg->model;
        if (r->cfg->strategy == ST_STRATEGY_IST && r->cfg->ist_eval_scale)
            full.branch_scale = 1.0f / (float)r->n; /* ResIST: each block trained by 1 of N */
        st_arena_init(&r->eval_arena, "evaluation", &backend, 0);
        ST_TRY(st_model_create(&full, r->cfg->batch, &r->eval_arena, &r->eval_model));
    }
    ST_TRY(st_run_sync(r, wid)); /* every arena has its chunks */
    if (wid == 0)
        report_warnings(r);
    if (r->cfg->strategy == ST_STRATEGY_SYNTH)
        return st_synth_loop(r, w, &backend);
    return st_run_worker_loop(r, w);
}

/* Keeps the first failure's message; tells the other workers to stop. */
static void record_failure(run_shared *r, st_status s)
{
    if (atomic_exchange(&r->failed, 1) == 0) {
        r->error_status = s;
        snprintf(r->error, sizeof r->error, "%s", st_last_error());
    }
    if (r->comm)
        st_comm_abort(r->comm);
    if (r->params_comm)
        st_comm_abort(r->params_comm);
    for (int i = 0; i < r->n_state; i++)
        st_comm_abort(r->state_comm[i]);
    if (r->synth)
        st_synth_abort(r);
}

/* ------------------------------------------------------------ the run */

static st_status check_data(const st_train_config *cfg, const st_dataset *train,
                            const st_dataset *test)
{
    if (train->dim != (uint32_t)cfg->model.in_dim || test->dim != train->dim)
        return st_fail(ST_ERR_INVALID, "the model takes %d inputs but the data has %u (train) "
                       "and %u (test) features", cfg->model.in_dim, train->dim, test->dim);
    if (train->n_classes != (uint32_t)cfg->model.n_classes)
        return st_fail(ST_ERR_INVALID, "the model has %d classes but the data has %u",
                       cfg->model.n_classes, train->n_classes);
    return ST_OK;
}

/* Topology, placement, the run's plan and (for N > 1) the reduction
 * engine, before the parallel region. */
static st_status prepare(run_shared *r)
{
    const st_train_config *cfg = r->cfg;
    ST_TRY(st_topology_load(cfg->topology, &r->topology));
    if (!st_topology_is_this_machine(r->topology))
        return st_fail(ST_ERR_INVALID, "training runs on this machine, not on %s; use "
                       "'subtrain topo --topology ...' to plan for another machine",
                       st_topology_name(r->topology));
    st_plan_request req = { cfg->workers, cfg->oversubscribe, cfg->cpuset };
    ST_TRY(st_plan_make(r->topology, &req, &r->placement));
    r->n = r->placement.n_workers;
    /* synth: the segment epochs are planned per group and the recovery
     * epochs on their own (st_synth_prepare); a data-parallel plan of all
     * N workers over cfg->epochs would apply checks (warmup, global batch)
     * that are not those of any phase of the run. */
    int synth = cfg->strategy == ST_STRATEGY_SYNTH;
    if (!synth)
        ST_TRY(st_run_make_plan(cfg, r->n, r->train, &r->plan));
    if (cfg->strategy == ST_STRATEGY_SDP || cfg->strategy == ST_STRATEGY_IST) {
        r->assign_k = cfg->strategy == ST_STRATEGY_IST
                    ? 1 : st_subnet_holders_per_unit(r->n, cfg->coverage);
        ST_TRY(st_run_check_units(r));
        ST_TRY(st_run_draw_assignment(r, 0));
    }
    ST_TRY(st_model_config_segments(&cfg->model, &r->full_segs, &r->n_full_segs));
    r->slots = aligned_alloc(64, sizeof(worker_slot) * (size_t)r->n);
    r->memory = calloc((size_t)r->n, sizeof *r->memory);
    if (!r->slots || !r->memory)
        return st_fail(ST_ERR_NOMEM, "out of memory for %d worker slots", r->n);
    memset(r->slots, 0, sizeof(worker_slot) * (size_t)r->n);
    /* synth: the engine of the recovery epochs (and the barrier of all
     * workers); the segments' groups have their own (st_synth_prepare). */
    if (r->n > 1 || (cfg->strategy != ST_STRATEGY_DP && !synth)) {
        int *domain_of = malloc(sizeof(int) * (size_t)r->n);
        if (!domain_of)
            return st_fail(ST_ERR_NOMEM, "out of memory for the reduction plan");
        for (int k = 0; k < r->n; k++)
            domain_of[k] = r->placement.workers[k].domain;
        st_range unheld[ST_MAX_UNHELD_RANGES];
        st_comm_config cc = { .n_workers = r->n,
                              .n_params = st_model_config_param_count(&cfg->model),
                              .domain_of = domain_of,
                              .allow_unheld = st_run_unheld_possible(cfg),
                              .unheld_ranges = unheld,
                              .n_unheld_ranges = st_run_unheld_ranges(r, unheld,
                                                                      ST_MAX_UNHELD_RANGES) };
        int two = cfg->strategy == ST_STRATEGY_SDP && cfg->masking == ST_MASKING_BACKWARD;
        if (two || cfg->strategy == ST_STRATEGY_IST)
            cc.roles = ST_COMM_REDUCE; /* ist: a once-a-round parameter average */
        st_status s = st_comm_create(&cc, &r->comm);
        if (s == ST_OK && two) {
            cc.roles = ST_COMM_GATHER;
            s = st_comm_create(&cc, &r->params_comm);
        }
        if (cfg->strategy == ST_STRATEGY_IST && cfg->ist_keep_state)
            r->n_state = cfg->optim.kind == ST_OPT_ADAMW ? 2 : cfg->optim.momentum > 0.0f;
        for (int i = 0; s == ST_OK && i < r->n_state; i++)
            s = st_comm_create(&cc, &r->state_comm[i]);
        free(domain_of);
        ST_TRY(s);
    }
    return synth ? st_synth_prepare(r) : ST_OK;
}

static void release(run_shared *r)
{
    free(r->full_segs);
    st_synth_release(r);
    st_model_destroy(r->eval_model);
    st_arena_release(&r->eval_arena);
    st_assignment_free(&r->assign);
    st_comm_destroy(r->comm);
    st_comm_destroy(r->params_comm);
    for (int i = 0; i < r->n_state; i++)
        st_comm_destroy(r->state_comm[i]);
    free(r->slots);
    free(r->memory);
    st_plan_free(&r->placement);
    st_topology_destroy(r->topology);
}

st_status st_train_run(const st_train_config *cfg, const st_dataset *train,
                       const st_dataset *test, const st_train_callbacks *cb,
                       st_epoch_record *final_out)
{
    ST_TRY(st_train_config_check(cfg));
    ST_TRY(check_data(cfg, train, test));
    run_shared r;
    memset(&r, 0, sizeof r);
    r.cfg = cfg;
    r.train = train;
    r.test = test;
    r.cb = cb;
    atomic_init(&r.failed, 0);
    st_status s = prepare(&r);
    if (s != ST_OK) {
        release(&r);
        return s;
    }

    r.t0 = st_run_now_s();
    /* One persistent region for the whole run, one thread per worker.
     * The thread's CPU binding is restored at the end: with one worker the
     * only thread is the caller's, and the pool's threads outlive us. */
#pragma omp parallel num_threads(r.n)
    {
        int wid = omp_get_thread_num();
        omp_set_num_threads(1);
        cpu_set_t saved;
        int have_saved = pthread_getaffinity_np(pthread_self(), sizeof saved, &saved) == 0;
        st_worker w;
        memset(&w, 0, sizeof w);
        st_status ws = omp_get_num_threads() == r.n
                     ? worker_main(&r, wid, &w)
                     : st_fail(ST_ERR_INVALID, "OpenMP gave %d threads for %d workers "
                               "(is OMP_THREAD_LIMIT set?)", omp_get_num_threads(), r.n);
        if (ws != ST_OK)
            record_failure(&r, ws);
        /* A worker's arena holds buffers the others read (its ranges in the
         * engines' planning, its gradients): a worker that failed early must
         * not free them while the others are still on their way out of an
         * aborted collective.  Every thread gets here: no early return above. */
#pragma omp barrier
        st_worker_destroy(&w);
        if (have_saved)
            pthread_setaffinity_np(pthread_self(), sizeof saved, &saved);
    }
    if (atomic_load(&r.failed))
        s = st_fail(r.error_status, "%s", r.error);
    else if (final_out)
        *final_out = r.final;
    release(&r);
    return s;
}

/*
 * train/trainer.c — the trainer handle (subtrain/trainer.h): the run of
 * st_train_run driven one call at a time, on the loop's pieces (loop.h)
 * and through the strategy's ops only.
 *
 * The workers live in the handle, indexed by worker id.  Every call that
 * runs them enters a parallel region of N threads; thread k takes worker
 * k for the call (the OpenMP pool need not map threads to workers the same
 * way twice), binds itself to worker k's PU and restores its own binding
 * at the end.  The first region (st_trainer_create) builds every worker
 * on its thread, bound with st_plan_bind_self (which checks the binding);
 * the binding it got is kept and later calls set it again with one
 * pthread_setaffinity_np, which allocates nothing.
 *
 * Where the run is, is the number of steps taken: step s (1-based) is
 * global batch (s - 1) mod S of epoch (s - 1) / S + 1, S steps an epoch,
 * as in the loop; an epoch's sample order is drawn by its first step.
 */
#define _GNU_SOURCE /* pthread_{get,set}affinity_np */
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/trainer.h>

#include <subtrain/world.h>

#include "core/error.h"
#include "train/loop.h"
#include "train/strategy.h"

/* One worker and its binding, a line of its own: written by its thread. */
typedef struct trainer_worker {
    _Alignas(64) st_worker w;
    cpu_set_t cpus;           /* the PU st_plan_bind_self bound it to */
    int built;                /* st_worker state to destroy */
} trainer_worker;

struct st_trainer {
    st_train_config cfg;
    run_shared r;
    st_phase phase;           /* the run's one phase (stepwise strategies only) */
    trainer_worker *workers;  /* n */
    uint64_t steps;           /* taken so far */
    /* worker 0's, over every step so far */
    double loss_sum, train_time;
    float last_loss, last_lr;
    double test_loss, test_acc;   /* of the last st_trainer_evaluate */
};

/* What one region does for worker w (its thread bound). */
typedef enum trainer_job { JOB_INIT, JOB_STEP, JOB_UPDATE, JOB_EVALUATE } trainer_job;

typedef struct job_args {
    trainer_job job;
    uint64_t from, count;     /* JOB_STEP, JOB_UPDATE: steps from + 1 .. from + count */
    float loss, lr;           /* worker 0's */
    double eval_loss, eval_acc;
    double time;              /* worker 0's steps' time */
} job_args;

static st_status refuse_failed(const st_trainer *t)
{
    return st_fail(t->r.error_status, "the trainer stopped at an earlier failure: %s",
                   t->r.error);
}

/* Steps from + 1 .. from + count of the plan for worker w. */
static st_status run_steps(st_trainer *t, st_worker *w, job_args *a)
{
    run_shared *r = &t->r;
    const uint64_t S = r->plan.steps_per_epoch;
    double t0 = st_run_now_s();
    for (uint64_t s = a->from + 1; s <= a->from + a->count; s++) {
        uint64_t i = (s - 1) % S;
        if (i == 0)
            st_loop_epoch_order(r, w, (s - 1) / S + 1);
        float loss = 0.0f, lr = 0.0f;
        if (a->job == JOB_UPDATE) {
            ST_TRY(r->ops->update(r, r->strategy, w, i, s, &loss, &lr));
        } else {
            ST_TRY(st_loop_step(r, &t->phase, w, i, s, &loss, &lr));
        }
        if (w->id == 0) {
            if (a->job == JOB_STEP)
                t->loss_sum += loss;
            a->loss = loss;
            a->lr = lr;
        }
    }
    if (w->id == 0)
        a->time = st_run_now_s() - t0;
    /* for st_trainer_metrics: what an epoch's end would leave in the slot */
    worker_slot *slot = &r->slots[w->id];
    st_run_publish_worker(r, w, a->from + a->count);   /* times: of every step so far */
    if (r->comm)
        slot->bytes = r->ops->bytes(r, r->strategy, w->id);
    return ST_OK;
}

/* Worker wid's part of the job on this thread, whose binding on entry
 * was `entry` (have_entry: known); *moved: the binding was changed (the
 * caller restores it). */
static st_status run_job(st_trainer *t, int wid, job_args *a, const cpu_set_t *entry,
                         int have_entry, int *moved)
{
    run_shared *r = &t->r;
    trainer_worker *tw = &t->workers[wid];
    *moved = 1;
    if (a->job == JOB_INIT) {
        st_chunk_backend backend;
        tw->built = 1;
        ST_TRY(st_loop_init_worker(r, wid, &tw->w, &backend));
        if (pthread_getaffinity_np(pthread_self(), sizeof tw->cpus, &tw->cpus) != 0)
            return st_fail(ST_ERR_TOPOLOGY, "worker %d: cannot read back its binding", wid);
        st_run_worker_memory(r, &tw->w, &r->slots[wid].memory);
        return ST_OK;
    }
    /* a caller bound to the worker's PU already (bench_step) saves two
     * system calls a call */
    *moved = !(have_entry && CPU_EQUAL(entry, &tw->cpus));
    if (*moved && pthread_setaffinity_np(pthread_self(), sizeof tw->cpus, &tw->cpus) != 0)
        return st_fail(ST_ERR_TOPOLOGY, "worker %d: binding the thread to its PU failed", wid);
    if (a->job == JOB_EVALUATE) {
        ST_TRY(st_run_sync_state(r, &tw->w));
        return r->ops->evaluate(r, r->strategy, &tw->w, &a->eval_loss, &a->eval_acc);
    }
    return run_steps(t, &tw->w, a);
}

/* One region of N threads, thread k running worker k's part of the job.
 * OpenMP must give every thread: with fewer, nothing runs (a worker alone
 * would wait for the others forever). */
static st_status region(st_trainer *t, job_args *a)
{
    run_shared *r = &t->r;
    const int n = r->n;
    atomic_int short_team;
    atomic_init(&short_team, 0);
#pragma omp parallel num_threads(n)
    {
        if (omp_get_num_threads() != n) {
            atomic_store(&short_team, omp_get_num_threads());
        } else {
            int wid = omp_get_thread_num();
            omp_set_num_threads(1);
            cpu_set_t saved;
            int have_saved = pthread_getaffinity_np(pthread_self(), sizeof saved, &saved) == 0;
            int moved;
            st_status ws = run_job(t, wid, a, &saved, have_saved, &moved);
            if (ws != ST_OK)
                st_loop_record_failure(r, ws);
            if (have_saved && moved)
                pthread_setaffinity_np(pthread_self(), sizeof saved, &saved);
        }
    }
    int got = atomic_load(&short_team);
    if (got)
        return st_fail(ST_ERR_INVALID, "OpenMP gave %d threads for %d workers (is "
                       "OMP_THREAD_LIMIT set, or is the call inside a parallel region?)", got, n);
    if (atomic_load(&r->failed))
        return st_fail(r->error_status, "%s", r->error);
    return ST_OK;
}

void st_trainer_destroy(st_trainer *t)
{
    if (!t)
        return;
    for (int k = 0; t->workers && k < t->r.n; k++)
        if (t->workers[k].built)
            st_worker_destroy(&t->workers[k].w);
    free(t->workers);
    st_loop_release(&t->r);
    free(t);
}

st_status st_trainer_create(const st_train_config *cfg, const st_dataset *train,
                            const st_dataset *test, st_trainer **out)
{
    *out = NULL;
    ST_TRY(st_train_config_check(cfg));
    ST_TRY(st_loop_check_data(cfg, train, test));
    const st_strategy_ops *ops = st_strategy_ops_of(cfg->strategy);
    if (ops->not_stepwise)
        return st_fail(ST_ERR_INVALID, "a trainer cannot take --strategy %s a step at a time: "
                       "%s; train it with st_train_run", ops->info.name, ops->not_stepwise);
    if (st_world_size() > 1)
        return st_fail(ST_ERR_INVALID, "a trainer runs in one process (this is one of %d MPI "
                       "ranks); train over ranks with st_train_run", st_world_size());
    if (cfg->threads_per_worker > 1)
        return st_fail(ST_ERR_INVALID, "a trainer runs workers of one thread; teams "
                       "(threads_per_worker %d) train with st_train_run",
                       cfg->threads_per_worker);
    st_trainer *t = calloc(1, sizeof *t);
    if (!t)
        return st_fail(ST_ERR_NOMEM, "out of memory for a trainer");
    t->cfg = *cfg;
    run_shared *r = &t->r;
    r->cfg = &t->cfg;
    r->train = train;
    r->test = test;
    atomic_init(&r->failed, 0);
    st_status s = st_loop_prepare(r);
    if (s == ST_OK)
        st_loop_default_phase(r, &t->phase);
    if (s == ST_OK) {
        t->workers = aligned_alloc(64, sizeof(trainer_worker) * (size_t)r->n);
        if (!t->workers)
            s = st_fail(ST_ERR_NOMEM, "out of memory for %d workers", r->n);
        else
            memset(t->workers, 0, sizeof(trainer_worker) * (size_t)r->n);
    }
    if (s == ST_OK) {
        r->t0 = st_run_now_s();
        job_args a = { .job = JOB_INIT };
        s = region(t, &a);
    }
    if (s != ST_OK) {
        st_trainer_destroy(t);
        return s;
    }
    *out = t;
    return ST_OK;
}

/* Steps from + 1 .. from + count, each worker on its thread. */
static st_status take_steps(st_trainer *t, trainer_job job, uint64_t count, float *loss,
                            float *lr)
{
    const run_plan *p = &t->r.plan;
    if (atomic_load(&t->r.failed))
        return refuse_failed(t);
    if (count > p->total_steps - t->steps)
        return st_fail(ST_ERR_INVALID, "%llu more step%s asked for, but the run has %llu and "
                       "%llu are done", (unsigned long long)count, count == 1 ? "" : "s",
                       (unsigned long long)p->total_steps, (unsigned long long)t->steps);
    if (count == 0)
        return ST_OK;
    job_args a = { .job = job, .from = t->steps, .count = count };
    ST_TRY(region(t, &a));
    t->steps += count;
    t->train_time += a.time;
    t->last_loss = a.loss;
    t->last_lr = a.lr;
    if (loss)
        *loss = a.loss;
    if (lr)
        *lr = a.lr;
    return ST_OK;
}

st_status st_trainer_step(st_trainer *t, uint64_t n_steps, float *loss)
{
    return take_steps(t, JOB_STEP, n_steps, loss, NULL);
}

st_status st_trainer_update(st_trainer *t, float *lr)
{
    if (!t->r.ops->update)
        return st_fail(ST_ERR_INVALID, "st_trainer_update runs the optimizer half of a step of "
                       "--strategy dp; a step of %s is more than a gradient and an update",
                       t->r.ops->info.name);
    return take_steps(t, JOB_UPDATE, 1, NULL, lr);
}

st_status st_trainer_evaluate(st_trainer *t, double *loss, double *acc)
{
    if (atomic_load(&t->r.failed))
        return refuse_failed(t);
    job_args a = { .job = JOB_EVALUATE };
    ST_TRY(region(t, &a));
    t->test_loss = a.eval_loss;
    t->test_acc = a.eval_acc;
    if (loss)
        *loss = a.eval_loss;
    if (acc)
        *acc = a.eval_acc;
    return ST_OK;
}

st_status st_trainer_metrics(const st_trainer *t, st_epoch_record *out)
{
    /* The record's worker_memory array is the run's, refreshed here. */
    run_shared *r = (run_shared *)&t->r;
    const run_plan *p = &r->plan;
    if (atomic_load(&r->failed))
        return refuse_failed(t);
    memset(out, 0, sizeof *out);
    out->epoch = t->steps ? (int)((t->steps - 1) / p->steps_per_epoch) + 1 : 0;
    out->epochs = p->epochs;
    out->step = t->steps;
    out->final = t->steps == p->total_steps;
    out->train_loss = t->steps ? t->loss_sum / (double)t->steps : 0.0;
    out->test_loss = t->test_loss;
    out->test_acc = t->test_acc;
    out->samples_per_s = t->train_time > 0.0
                       ? (double)t->steps * (double)st_run_step_rows(r->cfg) * r->n /
                             t->train_time : 0.0;
    out->wall_s = st_run_now_s() - r->t0;
    out->lr = t->last_lr;
    st_run_fill_record(r, out);
    if (r->ops->record)
        r->ops->record(r, r->strategy, out);
    return ST_OK;
}

int st_trainer_workers(const st_trainer *t)
{
    return t->r.n;
}

uint64_t st_trainer_steps(const st_trainer *t, uint64_t *total)
{
    if (total)
        *total = t->r.plan.total_steps;
    return t->steps;
}

st_status st_trainer_params(st_trainer *t, float *out, size_t count)
{
    if (atomic_load(&t->r.failed))
        return refuse_failed(t);
    size_t have;
    const float *p;
    ST_TRY(t->r.ops->full_params(&t->r, t->r.strategy, &t->workers[0].w, &p, &have));
    if (count != have)
        return st_fail(ST_ERR_INVALID, "the model has %zu parameters, not %zu", have, count);
    memcpy(out, p, count * sizeof *out);
    st_run_master_full_done(&t->r);
    return ST_OK;
}

st_model *st_trainer_model(st_trainer *t, int w)
{
    return w >= 0 && w < t->r.n ? t->workers[w].w.model : NULL;
}

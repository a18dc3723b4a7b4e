/*
 * train/train.c — a run's pieces (the data's check, placement, the ranks,
 * the strategy's prepare, a worker's build, the warnings) and
 * st_train_run, which runs the loop (loop.c) over N workers.  It knows the
 * strategies only through their ops (strategy.h: what each hook does, and
 * the dependency direction inside train/).
 *
 * st_train_run runs one persistent OpenMP parallel region for the whole
 * training, one thread per worker; no thread is created per step.  Each
 * thread binds itself to its PU (st_plan_bind_self; subtrain is the
 * binding authority), sets its OpenMP nthreads-var to 1 (oneDNN's OpenMP
 * runtime sizes a primitive's parallelism from the calling thread's, so
 * this keeps a worker on its core), and then creates its arena, model and
 * primitives itself, so that they live on its NUMA node and belong to its
 * thread.  The trainer handle (trainer.c) drives the same pieces one call
 * at a time.
 */
#define _GNU_SOURCE /* pthread_{get,set}affinity_np */
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/comm.h>
#include <subtrain/topo.h>
#include <subtrain/world.h>

#include "comm/sizing_world.h"
#include "core/error.h"
#include "train/loop.h"
#include "train/strategy.h"

/* ------------------------------------------------------------ the run's pieces */

st_status st_loop_check_data(const st_train_config *cfg, const st_dataset *train,
                             const st_dataset *test)
{
    /* The datasets come from the caller, who knows their files (the
     * loaders name them and refuse splits of two shapes); what is known
     * here is which set differs, and its shape. */
    if (test->dim != train->dim || test->channels != train->channels ||
        test->height != train->height || test->width != train->width)
        return st_fail(ST_ERR_INVALID, "the test set's samples are %ux%ux%u (%u features) but "
                       "the training set's are %ux%ux%u (%u): both sets need one shape",
                       test->channels, test->height, test->width, test->dim, train->channels,
                       train->height, train->width, train->dim);
    if (train->dim != (uint32_t)cfg->model.in_dim)
        return st_fail(ST_ERR_INVALID, "the model takes %d inputs but the data's samples are "
                       "%ux%ux%u (%u features)", cfg->model.in_dim, train->channels,
                       train->height, train->width, train->dim);
    if (train->n_classes != (uint32_t)cfg->model.n_classes)
        return st_fail(ST_ERR_INVALID, "the model has %d classes but the data has %u",
                       cfg->model.n_classes, train->n_classes);
    return st_augment_check(&train->augment, train);
}

/* The ranks of an MPI run (world.h): global worker indices and the
 * buffers of the loop's own collectives. */
static st_status prepare_ranks(run_shared *r)
{
    if (!r->sizing) {   /* a sizing run's ranks are described (st_train_size_ranks) */
        r->rank = st_world_rank();
        r->ranks = st_world_size();
    }
    r->first = r->rank * r->n;
    r->n_all = r->ranks * r->n;
    /* fault injection, for the tests of failure handling (doc/reliability.md) */
    const char *fault = getenv("SUBTRAIN_FAULT");
    unsigned long long fstep = 0;
    int frank = -1;
    char what[8] = "";
    if (fault && sscanf(fault, "%d:%llu", &frank, &fstep) == 2 && frank == r->rank)
        r->fault_step = fstep;
    else if (fault && sscanf(fault, "%d:%7s", &frank, what) == 2 && frank == r->rank &&
             strcmp(what, "init") == 0)
        r->fault_init = 1;
    if (r->ranks == 1)
        return ST_OK;
    /* every rank must have the same workers: the engine checks it too, but
     * here the message names the layout (described ranks have cfg's) */
    int *all = r->sizing ? NULL : malloc(sizeof *all * (size_t)r->ranks);
    if (!all && !r->sizing)
        return st_fail(ST_ERR_NOMEM, "out of memory for the ranks");
    st_status s = r->sizing ? ST_OK : st_world_allgather(&r->n, sizeof r->n, all);
    for (int k = 0; k < r->ranks && s == ST_OK && all; k++)
        if (all[k] != r->n)
            s = st_fail(ST_ERR_INVALID, "rank %d plans %d workers and rank %d plans %d: every "
                        "rank needs the same number (give each the same CPUs, or --workers N)",
                        k, all[k], r->rank, r->n);
    free(all);
    ST_TRY(s);
    r->losses_mine = malloc(sizeof(float) * (size_t)r->n);
    r->losses_all = malloc(sizeof(float) * (size_t)r->n_all);
    r->eval_all = malloc(sizeof(double) * 2 * (size_t)r->ranks);
    if (!r->losses_mine || !r->losses_all || !r->eval_all)
        return st_fail(ST_ERR_NOMEM, "out of memory for the ranks");
    return ST_OK;
}

/* The topology the run binds to and where its workers go: *topology is
 * set (to destroy) even when the plan fails. */
static st_status place_workers(const st_train_config *cfg, int sizing, st_topology **topology,
                               st_plan *placement)
{
    ST_TRY(st_topology_load(cfg->topology, topology));
    if (!sizing && !st_topology_is_this_machine(*topology))
        return st_fail(ST_ERR_INVALID, "training runs on this machine, not on %s%s; use "
                       "'subtrain topo --topology ...' to plan for another machine",
                       st_topology_name(*topology), cfg->topology ? ""
                       : " (set in the environment: unset it to train here)");
    st_plan_request req = { .workers = cfg->workers, .oversubscribe = cfg->oversubscribe,
                            .cpuset = cfg->cpuset,
                            .threads_per_worker = cfg->threads_per_worker,
                            .team_spans = cfg->team_spans, .core_limit = cfg->core_limit };
    return st_plan_make(*topology, &req, placement);
}

st_status st_train_placement_check(const st_train_config *cfg)
{
    st_topology *topology = NULL;
    st_plan placement;
    memset(&placement, 0, sizeof placement);
    st_status s = place_workers(cfg, 0, &topology, &placement);
    /* the worker count resolved ("cores"), every rank with as many */
    if (s == ST_OK)
        s = st_strategy_check_layout(cfg, placement.n_workers * st_world_size());
    st_plan_free(&placement);
    st_topology_destroy(topology);
    return s;
}

st_status st_loop_prepare(run_shared *r)
{
    const st_train_config *cfg = r->cfg;
    r->ops = st_strategy_ops_of(cfg->strategy);
    if (!r->ops)
        return st_fail(ST_ERR_INVALID, "unknown strategy %d", (int)cfg->strategy);
    ST_TRY(place_workers(cfg, r->sizing, &r->topology, &r->placement));
    r->n = r->placement.n_workers;
    ST_TRY(prepare_ranks(r));
    ST_TRY(st_strategy_check_layout(cfg, r->n_all));
    ST_TRY(st_split_make(&cfg->split, r->train, r->n_all, cfg->seed, (uint32_t)cfg->batch,
                         &r->split));
    ST_TRY(st_model_config_segments(&cfg->model, &r->full_segs, &r->n_full_segs));
    r->n_params = st_model_config_param_count(&cfg->model);
    st_model_units units;
    ST_TRY(st_model_config_units(&cfg->model, &units));
    if (units.state) {
        r->n_state = (size_t)units.state;
        r->state_full = malloc(r->n_state * sizeof *r->state_full);
        r->state_sum = malloc(r->n_state * sizeof *r->state_sum);
        r->state_count = malloc(r->n_state * sizeof *r->state_count);
        if (!r->state_full || !r->state_sum || !r->state_count)
            return st_fail(ST_ERR_NOMEM, "out of memory for the model's state");
        ST_TRY(st_model_config_state_init(&cfg->model, r->state_full));
    }
    r->slots = aligned_alloc(64, sizeof(worker_slot) * (size_t)r->n);
    r->memory = calloc((size_t)r->n, sizeof *r->memory);
    if (!r->slots || !r->memory)
        return st_fail(ST_ERR_NOMEM, "out of memory for %d worker slots", r->n);
    memset(r->slots, 0, sizeof(worker_slot) * (size_t)r->n);
    ST_TRY(st_run_resume_open(r));
    /* one weight copy per NUMA domain where the strategy's workers can
     * share it: one process (ranks over MPI keep a replica per worker),
     * more than one worker (one alone has nothing to share) */
    const int shared = r->ops->weights && r->ops->weights(cfg) == ST_WEIGHTS_SHARED &&
                       cfg->weights == ST_WEIGHTS_SHARED && r->ranks == 1 && r->n > 1;
    ST_TRY(st_run_weights_prepare(r, shared));
    ST_TRY(r->ops->prepare(r, &r->strategy));
    return st_run_resume_check_position(r);
}

void st_loop_release(run_shared *r)
{
    free(r->full_segs);
    st_run_master_full_done(r);
    st_split_destroy(r->split);
    st_run_resume_close(r);
    if (r->ops && r->ops->release)
        r->ops->release(r, r->strategy);
    r->strategy = NULL;
    st_comm_destroy(r->comm);
    st_run_weights_release(r);   /* before the slots: the backends' state */
    free(r->slots);
    free(r->memory);
    free(r->state_full);
    free(r->state_sum);
    free(r->state_count);
    free(r->losses_mine);
    free(r->losses_all);
    free(r->eval_all);
    st_plan_free(&r->placement);
    st_topology_destroy(r->topology);
}

st_status st_loop_init_worker(run_shared *r, int wid, st_worker *w, st_chunk_backend *backend)
{
    worker_slot *slot = &r->slots[wid];
    const st_placement *pl = &r->placement.workers[wid];
    if (r->sizing) {   /* perhaps another machine's placement: nothing to bind */
        *backend = st_sizing_backend_in(r->sizing_space);
        return r->ops->init_worker(r, r->strategy, wid, w, backend);
    }
    ST_TRY(st_plan_bind_self(r->topology, &r->placement, wid));
    st_numa_ctx_init(&slot->numa, r->topology, pl->numa_os);
    *backend = st_numa_backend(&slot->numa);
    ST_TRY(r->ops->init_worker(r, r->strategy, wid, w, backend));
    st_status s = ST_OK;
    if (r->split) {   /* on the worker's thread, once: the epochs' orders allocate nothing */
        w->split_scratch = malloc((size_t)st_split_largest(r->split) * sizeof *w->split_scratch);
        if (!w->split_scratch)
            s = st_fail(ST_ERR_NOMEM, "worker %d: out of memory for its split's order", wid);
    }
    if (s == ST_OK && r->resume)
        s = r->ops->resume(r, r->strategy, w);
    if (s == ST_OK && r->fault_init && wid == r->n - 1)
        s = st_fail(ST_ERR_INVALID, "the fault SUBTRAIN_FAULT asked for: rank %d's worker %d "
                    "fails once set up", r->rank, wid);
    /* the first phase never begins: what init_worker built for it goes
     * before the worker's arena does (synth's segment) */
    if (s != ST_OK && r->ops->phase_end)
        (void)r->ops->phase_end(r, r->strategy, 0, w);
    return s;
}

/* ------------------------------------------------------------ the run */

/* A run whose loss became NaN or infinite: its final record, after the
 * epochs' records, says so and where worker 0 had got to; nothing after
 * that step was measured, so its losses and rates are NaN. */
static void report_divergence(run_shared *r)
{
    if (!r->cb || !r->cb->on_epoch)
        return;
    st_epoch_record rec;
    memset(&rec, 0, sizeof rec);
    st_run_fill_record(r, &rec);
    rec.epoch = r->at_epoch > 0 ? r->at_epoch : 1;
    rec.epochs = r->at_epochs > 0 ? r->at_epochs : r->plan.epochs;
    rec.step = r->at_step;
    rec.final = 1;
    rec.diverged = 1;
    rec.train_loss = rec.test_loss = rec.test_acc = NAN;
    rec.samples_per_s = NAN;
    rec.step_ms_compute = rec.step_ms_wait = rec.step_ms_reduce = rec.step_ms_optimizer = NAN;
    rec.step_ms_overlapped = NAN;
    rec.lr = r->at_lr;
    rec.wall_s = st_run_now_s() - r->t0;
    if (r->at_label)
        r->at_label(r, r->strategy, &rec);
    r->cb->on_epoch(&rec, r->cb->user);
}


/* Worker wid on its thread of the workers' region: that region must have
 * a thread per worker, and a worker's team `team` threads (OpenMP may give
 * fewer: a team that shrank would sum in another order, silently). */
static st_status init_on_thread(run_shared *r, int wid, int team, st_worker *w,
                                st_chunk_backend *backend)
{
    if (omp_get_num_threads() != r->n)
        return st_fail(ST_ERR_INVALID, "OpenMP gave %d threads for %d workers (is "
                       "OMP_THREAD_LIMIT set?)", omp_get_num_threads(), r->n);
    int got = team;
    if (team > 1) {
#pragma omp parallel num_threads(team)
#pragma omp single
        got = omp_get_num_threads();
    }
    if (got != team)
        return st_fail(ST_ERR_INVALID, "OpenMP gave worker %d a team of %d threads, not %d (is "
                       "OMP_THREAD_LIMIT set?)", r->first + wid, got, team);
    return st_loop_init_worker(r, wid, w, backend);
}

st_status st_train_run(const st_train_config *cfg, const st_dataset *train,
                       const st_dataset *test, const st_train_callbacks *cb,
                       st_epoch_record *final_out)
{
    ST_TRY(st_train_config_check(cfg));
    ST_TRY(st_loop_check_data(cfg, train, test));
    run_shared r;
    memset(&r, 0, sizeof r);
    r.cfg = cfg;
    r.train = train;
    r.test = test;
    r.cb = cb;
    atomic_init(&r.failed, 0);
    st_status s = st_loop_prepare(&r);
    if (s != ST_OK) {
        st_loop_release(&r);
        return s;
    }

    r.t0 = st_run_now_s();
    /* Teams (threads_per_worker T > 1): a worker's oneDNN primitives open
     * OpenMP regions of T threads inside the workers' region, so nesting
     * must be on; the team's threads inherit the worker's binding (its T
     * PUs) when the runtime creates them.  Restored after the run. */
    const int team = r.placement.threads_per_worker > 1 ? r.placement.threads_per_worker : 1;
    const int levels = omp_get_max_active_levels(), dynamic = omp_get_dynamic();
    if (team > 1 && levels < 2)
        omp_set_max_active_levels(2);
    omp_set_dynamic(0);   /* OMP_DYNAMIC=true: teams of the size asked, or the run fails */
    /* One persistent region for the whole run, one thread per worker.
     * The thread's CPU binding is restored at the end: with one worker the
     * only thread is the caller's, and the pool's threads outlive us. */
#pragma omp parallel num_threads(r.n)
    {
        int wid = omp_get_thread_num();
        omp_set_num_threads(team);
        cpu_set_t saved;
        int have_saved = pthread_getaffinity_np(pthread_self(), sizeof saved, &saved) == 0;
        st_worker w;
        memset(&w, 0, sizeof w);
        st_chunk_backend backend;
        st_status ws = init_on_thread(&r, wid, team, &w, &backend);
        if (ws == ST_OK)
            ws = st_loop_run_worker(&r, &w, &backend);
        if (ws != ST_OK)
            st_loop_record_failure(&r, ws);
        /* A worker's arena holds buffers the others read (its ranges in the
         * engines' planning, its gradients): a worker that failed early must
         * not free them while the others are still on their way out of an
         * aborted collective.  Every thread gets here: no early return above. */
#pragma omp barrier
        st_worker_destroy(&w);
        if (have_saved)
            pthread_setaffinity_np(pthread_self(), sizeof saved, &saved);
    }
    if (team > 1 && levels < 2)
        omp_set_max_active_levels(levels);
    omp_set_dynamic(dynamic);
    if (atomic_load(&r.failed)) {
        if (r.error_status == ST_ERR_NUMERIC)
            report_divergence(&r);
        s = st_fail(r.error_status, "%s", r.error);
    }
    else if (final_out)
        *final_out = r.final;
    st_loop_release(&r);
    return s;
}

/* ------------------------------------------------------------ sizing */

/* The phases a sizing run lays out (synth: the segments, then the joined
 * network). */
enum { SIZING_PHASES = 4 };

/* Worker w of a sizing run, built (init_worker), each phase in turn as the
 * loop begins and ends it: the step of its first layout (its engine's
 * bytes, its model's work) into *out; its memory in phase k into
 * held[k], over every later draw of its subnetworks (size_draws); worker
 * 0 keeps each phase's largest total in worst[k], as the phase's records
 * take their worker.  *phases: how many it laid out. */
static st_status size_phases(run_shared *r, st_worker *w, const st_chunk_backend *backend,
                             st_worker_size *out, st_mem_stats *held, size_t *worst,
                             int *phases)
{
    const st_strategy_ops *ops = r->ops;
    st_status s = ST_OK;
    int last = 0;
    *phases = 0;
    for (int k = 0; s == ST_OK && !last; k++) {
        if (k == SIZING_PHASES)
            return st_fail(ST_ERR_INVALID, "a sizing run lays out %d phases at most",
                           SIZING_PHASES);
        st_phase ph;
        st_loop_default_phase(r, &ph);
        if (ops->phase_begin)
            s = ops->phase_begin(r, r->strategy, k, w, backend, &ph);
        last = ph.last;
        /* every worker has begun it: the domains' arenas are complete */
        if (s == ST_OK)
            s = st_run_sync(r, w->id);
        if (s == ST_OK && k == 0) {
            if (r->comm)
                out->comm = ph.bytes(r, r->strategy, w->id);
            if (ph.work) {
                out->n_costs = ph.work(r, r->strategy, w->id, &out->flops, out->costs,
                                       ST_STEP_COSTS_MAX);
            } else {
                out->flops = w->model ? st_model_step_flops(w->model) : 0.0;
                out->n_costs = w->model ? st_model_step_costs(w->model, out->costs,
                                                              ST_STEP_COSTS_MAX) : 0;
            }
            if (ops->size_draws)
                s = ops->size_draws(r, r->strategy, w);
        }
        if (s == ST_OK) {
            st_run_worker_memory(r, w, &held[k]);
            r->slots[w->id].memory = held[k];
            s = st_run_sync(r, w->id);
        }
        if (s == ST_OK && w->id == 0) {
            worst[k] = 0;
            for (int v = 0; v < r->n; v++)
                if (r->slots[v].memory.peak_total > worst[k])
                    worst[k] = r->slots[v].memory.peak_total;
        }
        if (ops->phase_end) {   /* what the phase built goes before its arena does */
            st_status e = ops->phase_end(r, r->strategy, k, w);
            s = s != ST_OK ? s : e;
        }
        if (s == ST_OK)
            *phases = k + 1;
    }
    return s;
}

/* The layouts of `ranks` described ranks (ranks > 1: each rank's
 * engines over the described job, comm/sizing_world.h), rank k's run in
 * r[k], every worker of every rank on a thread of its own. */
static st_status size_ranks(run_shared *r, int ranks, st_worker_size *mem)
{
    /* each worker's memory in each phase, and each rank's phases' busiest */
    const size_t n_held = (size_t)ranks * (size_t)r[0].n * SIZING_PHASES;
    st_mem_stats *held = calloc(n_held, sizeof *held);
    size_t *worst = calloc((size_t)ranks * SIZING_PHASES, sizeof *worst);
    int *phases = calloc((size_t)ranks, sizeof *phases);
    if (!held || !worst || !phases) {
        free(held);
        free(worst);
        free(phases);
        return st_fail(ST_ERR_NOMEM, "out of memory for %d ranks' phases", ranks);
    }
    const int n = r[0].n, all = ranks * n;
    /* A team's nthreads-var is T, as in a run: oneDNN sizes a primitive's
     * scratchpad for the threads that will run it. */
    const int team = r[0].placement.threads_per_worker > 1 ? r[0].placement.threads_per_worker
                                                           : 1;
    atomic_int short_team;
    atomic_init(&short_team, 0);
    /* As in a run, the strategies' builds meet at barriers (the engines'
     * plans, the shared weights; over the described ranks, their gathers). */
#pragma omp parallel num_threads(all)
    {
        const int k = omp_get_thread_num() / n, wid = omp_get_thread_num() % n;
        run_shared *rk = &r[k];
        omp_set_num_threads(team);
        st_worker w;
        memset(&w, 0, sizeof w);
        st_chunk_backend backend;
        st_status ws = ST_OK;
        if (omp_get_num_threads() != all)
            atomic_store(&short_team, omp_get_num_threads());
        else
            ws = st_loop_init_worker(rk, wid, &w, &backend);
        int mine = 0;
        if (ws == ST_OK && omp_get_num_threads() == all)
            ws = size_phases(rk, &w, &backend, &mem[k * n + wid],
                             held + ((size_t)k * n + wid) * SIZING_PHASES,
                             worst + (size_t)k * SIZING_PHASES, &mine);
        if (ws != ST_OK) {
            st_loop_record_failure(rk, ws);
            st_comm_world_abort(rk->sizing_world);   /* the other ranks stop gathering */
        }
        if (wid == 0)
            phases[k] = mine;
#pragma omp barrier
        st_worker_destroy(&w);
    }
    /* a rank's final record reports the phase whose busiest worker holds
     * the most, a tie to the later phase (st_synth_recovery_label): every
     * worker's figures of that phase */
    for (int k = 0; k < ranks; k++) {
        const size_t *wk = worst + (size_t)k * SIZING_PHASES;
        int best = 0;
        for (int j = 1; j < phases[k]; j++)
            if (wk[j] >= wk[best])
                best = j;
        for (int v = 0; v < n; v++)
            mem[k * n + v].memory = held[((size_t)k * n + v) * SIZING_PHASES + best];
    }
    free(held);
    free(worst);
    free(phases);
    if (atomic_load(&short_team))
        return st_fail(ST_ERR_INVALID, "OpenMP gave %d threads for %d workers (is "
                       "OMP_THREAD_LIMIT set?)", atomic_load(&short_team), all);
    for (int k = 0; k < ranks; k++)
        if (atomic_load(&r[k].failed))
            return st_fail(r[k].error_status, "%s", r[k].error);
    return ST_OK;
}

st_status st_train_size_ranks(const st_train_config *cfg, int ranks, const st_dataset *train,
                              const st_dataset *test, st_worker_size **out, int *n_workers)
{
    *out = NULL;
    *n_workers = 0;
    ST_TRY(st_train_config_check(cfg));
    ST_TRY(st_loop_check_data(cfg, train, test));
    if (cfg->resume)
        return st_fail(ST_ERR_INVALID, "a sizing run starts no training: it resumes nothing");
    if (st_world_size() > 1)
        return st_fail(ST_ERR_INVALID, "a sizing run lays out one process's workers (this is "
                       "one of %d MPI ranks)", st_world_size());
    if (ranks < 1 || ranks > 65535)   /* as many as `subtrain topo --ranks` describes */
        return st_fail(ST_ERR_INVALID, "a sizing run of %d ranks: expected 1 to 65535", ranks);
    if (ranks > 1 && !st_world_has_mpi())
        return st_fail(ST_ERR_INVALID, "sizing %d MPI ranks needs the MPI reduction backend, "
                       "which this library was built without (configure --with-mpi)", ranks);
    run_shared *r = calloc((size_t)ranks, sizeof *r);
    st_sizing_space *space = NULL;
    st_comm_world *world = NULL;
    if (!r)
        return st_fail(ST_ERR_NOMEM, "out of memory for %d ranks' layouts", ranks);
    /* address space, far more than any layout takes: 1 TiB */
    st_status s = st_sizing_space_create((size_t)1 << 40, &space);
    if (s == ST_OK && ranks > 1)
        s = st_comm_world_create(ranks, &world);
    int prepared = 0;
    for (int k = 0; k < ranks && s == ST_OK; k++, prepared++) {
        r[k].cfg = cfg;
        r[k].train = train;
        r[k].test = test;
        r[k].sizing = 1;
        r[k].rank = k;
        r[k].ranks = ranks;
        r[k].sizing_world = world;
        r[k].sizing_space = space;
        atomic_init(&r[k].failed, 0);
        s = st_loop_prepare(&r[k]);
    }
    const int all = s == ST_OK ? ranks * r[0].n : 0;
    st_worker_size *mem = s == ST_OK ? calloc((size_t)all, sizeof *mem) : NULL;
    if (s == ST_OK && !mem)
        s = st_fail(ST_ERR_NOMEM, "out of memory for %d workers' sizes", all);
    if (s == ST_OK)
        s = size_ranks(r, ranks, mem);
    if (s == ST_OK) {
        *out = mem;
        *n_workers = all;
    } else {
        free(mem);
    }
    for (int k = 0; k < prepared; k++)
        st_loop_release(&r[k]);
    st_comm_world_destroy(world);
    st_sizing_space_destroy(space);
    free(r);
    return s;
}

st_status st_train_size(const st_train_config *cfg, const st_dataset *train,
                        const st_dataset *test, st_worker_size **out, int *n_workers)
{
    return st_train_size_ranks(cfg, 1, train, test, out, n_workers);
}

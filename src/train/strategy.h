/*
 * train/strategy.h — private: a training strategy behind one interface.
 *
 * A strategy says how N workers train one model: who holds what, what a
 * step does, how the workers meet, how the model is evaluated.  The loop
 * (loop.c, its pieces in loop.h) runs phases of epochs of steps and knows
 * strategies only through this table of operations; each strategy keeps
 * its state in a struct of its own (made by prepare, freed by release),
 * never in run_shared.
 *
 * Dependencies inside train/ (an arrow: "calls"; there is no circle):
 *
 *   train.c (st_train_run)    trainer.c (st_trainer_*)       drivers
 *              \                 /
 *          loop.c (loop.h)              the loop over the ops; names no strategy
 *                 |
 *   config.c -> strategy.c              the table: one entry per st_strategy
 *                 |
 *   dp.c  localsgd.c  sdp.c  ist.c  synth*.c  the strategies (synth: three
 *     |       |          \     /       |       files, synth_run.h)
 *     |       |        subnets.c   synth_plan.c   (units, assignments, saved
 *     |       |          /                         shards; cuts, worker split)
 *   run.c, records.c, worker.c          common run helpers: plan, engines,
 *                                       attach, the sharded step, evaluation,
 *                                       records; a worker's own state
 *
 * Adding a strategy: one file defining st_NAME_ops (its options, their
 * defaults and checks, its description line and its checkpoint state
 * included), its name in strategy.c's table; a strategy with options of
 * its own adds its member to st_train_config (train.h).  Nothing outside
 * the table and the strategy's file names a strategy.
 *
 * A strategy supplies steps and phases, never a loop of its own: the loop
 * runs every phase (st_phase) with the same stop, checkpoint and record
 * handling.
 *
 * Every hook runs on a worker's thread inside the parallel region unless
 * it says otherwise; `state` is what prepare made.
 */
#ifndef SUBTRAIN_TRAIN_STRATEGY_H
#define SUBTRAIN_TRAIN_STRATEGY_H

#include <subtrain/strategy.h>

#include "train/run.h"

/* A phase of a run: epochs of steps, which the loop (loop.c) runs the
 * same way whatever the phase: sample orders, steps, step reports, stops
 * and checkpoints asked for, periodic checkpoints, the evaluation and
 * record of each epoch, the final record.  dp, sdp and ist have one
 * phase, the default: r->plan with the ops' hooks.  synth has its segment
 * epochs, then (--recovery-epochs) the joined network's data-parallel
 * epochs.  Records, step reports and checkpoint names number a phase's
 * epochs and steps after those of the phases before it.
 *
 * A phase is stepwise (every worker takes the phase's steps, in step:
 * a stop or a checkpoint can follow any step after which the state is
 * whole, whole_after) or apart: its workers take different numbers of
 * steps an epoch (synth's groups) and meet only at epoch ends, where the
 * requests are taken.  A checkpoint in an apart phase records the
 * position (1, 0, 0) of r->plan, the start of the run's stepwise epochs,
 * and its name counts epoch_steps an epoch; the strategy's save hook
 * records how far the phase got, and the phase begins from there when
 * resumed.  round_end and whole_after (the ops') apply in stepwise
 * phases. */
typedef struct st_phase {
    run_plan plan;           /* this worker's epochs and steps in the phase */
    uint64_t epoch_steps;    /* apart: an epoch's steps as records, reports and
                              * checkpoint names count them (worker 0's of the
                              * run, every rank alike) */
    run_position from;       /* where this worker begins it: epoch 1, no step;
                              * resumed, where the checkpoint was (default:
                              * r->resume's position) */
    int epochs_before;       /* the phases before it: their epochs and steps */
    uint64_t steps_before;   /* (worker 0's), which records count first */
    int run_epochs;          /* the run's epochs and steps, every phase's */
    uint64_t run_steps;
    uint64_t order_offset;   /* epoch e draws the sample order of epoch
                              * order_offset + e of the run's seed */
    double samples_per_step; /* worker 0's step: samples through the whole
                              * network (throughput) */
    int apart;               /* its workers meet only at epoch ends */
    int last;                /* the run's last phase */

    /* Its step, evaluation, bytes and record (optional) hooks, each with
     * the contract of the ops' hook of its name; the default phase has the
     * ops'. */
    st_status (*step)(run_shared *r, void *state, st_worker *w, uint64_t i, uint64_t step,
                      float *loss, float *lr);
    st_status (*evaluate)(run_shared *r, void *state, st_worker *w, double *loss, double *acc);
    st_comm_bytes (*bytes)(const run_shared *r, const void *state, int wid);
    void (*record)(const run_shared *r, void *state, st_epoch_record *rec);

    /* Optional (NULL: st_run_sync): the barrier of every worker at its
     * epoch ends. */
    st_status (*sync)(run_shared *r, void *state, st_worker *w);
    /* Optional: worker 0 after each step: the report's throughput and time
     * left (info is complete, from the phase's own steps). */
    void (*estimate)(const run_shared *r, void *state, double train_time, st_step_info *info);
    /* Optional: what each record of the phase says of it, after its record
     * hook: the epochs' records, the final record, a diverged run's final
     * record (worker 0, or no thread after the run). */
    void (*label)(const run_shared *r, void *state, st_epoch_record *rec);
    /* Optional (NULL: w->model's): a sizing run's account of a step's work
     * of worker wid in the phase, where its network is not w->model
     * (synth's segments): its FLOPs into *flops, its costs into out (at
     * most cap, st_model_step_costs's), how many returned. */
    int (*work)(const run_shared *r, const void *state, int wid, double *flops,
                st_step_cost *out, int cap);
} st_phase;

typedef struct st_strategy_ops {
    st_strategy_info info;    /* name, help, options (subtrain/strategy.h) */
    const char *not_stepwise; /* why a trainer (trainer.h) cannot take it a
                               * step at a time; NULL: it can */

    /* Optional: its options' defaults into c (st_train_config_default
     * calls every strategy's). */
    void (*defaults)(st_train_config *c);

    /* Every config, whatever its strategy (before anything, no thread):
     * refuses bad values of this strategy's options, and its options
     * given to another strategy (chosen: c's strategy is this one).  Run in
     * table order. */
    st_status (*check)(const st_train_config *c, int chosen);

    /* Optional: what follows the name in the banner, " (50 local steps)"
     * (st_strategy_describe); workers: all ranks', 0 when not known. */
    void (*describe)(const st_train_config *c, int workers, char *out, size_t n);

    /* Optional: the branch scale its evaluation uses (st_strategy_eval_scale;
     * NULL: none). */
    float (*eval_scale)(const st_train_config *c, int workers);

    /* Optional: before the first step, worker 0: a line the user should
     * read about this run's options (its on_warning), into msg; 0: none. */
    int (*warning)(const run_shared *r, char *msg, size_t n);

    /* Optional (NULL: any worker count): a config of this strategy (its
     * check passed), no data: refuses `workers` workers (every rank's)
     * that its units cannot be spread over, in a line naming the options.
     * One answer for the config check, the placement check (the count
     * resolved) and the loop's prepare: st_strategy_check_layout. */
    st_status (*layout)(const st_train_config *c, int workers);

    /* Optional (NULL: ST_WEIGHTS_PRIVATE): what the workers of c's
     * data-parallel steps read their weights from.  SHARED: every worker
     * holds the full model in the full layout and writes its weights
     * only as a shard owner through the engine (run.h, shared_weights.c: one
     * copy per NUMA domain); PRIVATE: each its own (compact subnetworks,
     * local steps between averages). */
    st_weights (*weights)(const st_train_config *c);

    /* Before the parallel region, on the caller's thread; r->n, placement,
     * full_segs and slots are known.  Sets r->plan (the loop's epochs),
     * r->comm (the run's engine and barrier; NULL only with one worker
     * alone), and *state.  On failure, release follows. */
    st_status (*prepare)(run_shared *r, void **state);

    /* Worker wid, on its thread, bound to its PU: its arena (chunks from
     * backend), model, optimizer, attached to the engines. */
    st_status (*init_worker)(run_shared *r, void *state, int wid, st_worker *w,
                             const st_chunk_backend *backend);

    /* One step: global batch i of the epoch (0-based), step number `step`
     * (1-based, over the run).  *loss: the step's loss as worker 0
     * reports it; *lr: the rate used. */
    st_status (*step)(run_shared *r, void *state, st_worker *w, uint64_t i, uint64_t step,
                      float *loss, float *lr);

    /* Optional: after every step; `last`: the epoch's last step (ist: a
     * round ends every R steps and at the end of an epoch). */
    st_status (*round_end)(run_shared *r, void *state, st_worker *w, uint64_t step, int last);

    /* Optional: a sizing run (r->sizing, st_train_size), every worker once
     * built: every later layout the run builds as it trains r->plan
     * (sdp's --resample rounds, ist's rounds), in the run's order and with
     * the run's code, moving no values, so that the arena's peaks are the
     * run's over all of them. */
    st_status (*size_draws)(run_shared *r, void *state, st_worker *w);

    /* Optional: the optimizer half of a step alone, on the gradients the
     * models hold now (the trainer's st_trainer_update; dp only). */
    st_status (*update)(run_shared *r, void *state, st_worker *w, uint64_t i, uint64_t step,
                        float *loss, float *lr);

    /* Every worker: the model's test loss and accuracy (worker 0's are
     * the result).  Changes nothing that training reads. */
    st_status (*evaluate)(run_shared *r, void *state, st_worker *w, double *loss, double *acc);

    /* Worker wid, with an engine (r->comm): what it reads and writes per
     * synchronisation, for the record. */
    st_comm_bytes (*bytes)(const run_shared *r, const void *state, int wid);

    /* Optional: worker 0 completes an epoch record after the common
     * fields (communication per round, the alignment report). */
    void (*record)(const run_shared *r, void *state, st_epoch_record *rec);

    /* Worker 0, after a barrier (over ranks: worker 0 of every rank): the
     * trained model's parameters in the full layout, *count of them at
     * *out (loaded from where the strategy keeps them, if needed; over
     * ranks that gathers the other ranks' shards, which can fail). */
    st_status (*full_params)(run_shared *r, void *state, st_worker *w0, const float **out,
                             size_t *count);

    /* Optional (NULL: after every step): whether the training state is
     * whole after `step` (`last`: the epoch's or the run's last), so that
     * a checkpoint can hold it and a stop can end there (ist: at the end
     * of a round).  The same answer on every worker. */
    int (*whole_after)(const run_shared *r, uint64_t step, int last);

    /* Optional: worker 0 writing a checkpoint, every worker between its
     * steps: the strategy's own tensors and metadata (ist: the kept
     * optimizer state's shards, the round). */
    st_status (*save)(run_shared *r, void *state, run_ckpt *ck);

    /* Resuming (r->resume): every worker after init_worker loads what the
     * checkpoint holds of it (st_run_resume_model: its model's parameters,
     * optimizer vectors and running statistics) and what is the
     * strategy's own (the master shards, ist's rounds).  Its prepare
     * already drew the assignment of the round being resumed.  The loop's
     * first barrier follows.  Required: every strategy resumes. */
    st_status (*resume)(run_shared *r, void *state, st_worker *w);

    /* Optional: a worker failed; any thread: releases everyone waiting in
     * the strategy's own engines or barriers (the run's engine is the
     * loop's to abort). */
    void (*abort)(run_shared *r, void *state);

    /* After the run (or a failed prepare), no thread: frees the state,
     * which may be NULL or half made. */
    void (*release)(run_shared *r, void *state);

    /* Optional (NULL: one phase, the default): every worker, after the
     * previous phase's end: phase k (0-based) of worker w, *ph holding the
     * default phase to change (ph->last: no phase after it).  What the
     * phase needs built is built here, from `backend`; every worker has
     * begun it before any takes a step. */
    st_status (*phase_begin)(run_shared *r, void *state, int k, st_worker *w,
                             const st_chunk_backend *backend, st_phase *ph);
    /* Optional: every worker after phase k's epochs (also a stopped or a
     * failed one: what the phase built goes); phase 0's also when the
     * worker fails after init_worker, before the phase begins. */
    st_status (*phase_end)(run_shared *r, void *state, int k, st_worker *w);
} st_strategy_ops;

/* strategy.c: the ops of strategy s, NULL if there is none. */
const st_strategy_ops *st_strategy_ops_of(st_strategy s);
/* strategy.c: every strategy's defaults into c. */
void st_strategy_defaults_all(st_train_config *c);
/* strategy.c: every strategy's check, in table order. */
st_status st_strategy_check_all(const st_train_config *c);
/* strategy.c: c's strategy's layout check for `workers` workers of every
 * rank (ST_OK when it has none). */
st_status st_strategy_check_layout(const st_train_config *c, int workers);

#endif /* SUBTRAIN_TRAIN_STRATEGY_H */

/*
 * subtrain/trainer.h — a training run as an object: create it, step it,
 * evaluate it, read its metrics, destroy it.
 *
 * st_train_run() (train.h) trains from the first step to the last in one
 * call.  A trainer is the same run (config, workers and their placement,
 * strategy, plan, learning-rate schedule, sample orders) taken a few
 * steps at a time by a program that drives training itself: a benchmark,
 * a test, an outer loop.  Its first N steps are bitwise those of
 * st_train_run with the same config; between steps nothing else happens
 * (no evaluation, no record, no callback) unless asked for.
 *
 * Threads.  Every call that runs the workers (create, step, update,
 * evaluate) enters an OpenMP parallel region of one thread per worker;
 * each thread binds itself to its worker's PU for the call and restores
 * its own binding on return, so the caller's thread is not left pinned.
 * The workers' state (arena on the worker's NUMA node, model instance and
 * primitives, optimizer state, attachment to the reduction engine) is
 * built once, by st_trainer_create, on the workers' threads, and kept in
 * the handle by worker: which pool thread runs which worker may change
 * from call to call.  A step allocates nothing, creates no primitive and
 * takes no lock.  Call from outside any active parallel region (OpenMP
 * must give one thread per worker), one call at a time: a trainer is not
 * thread-safe.
 *
 * Strategies: dp, sdp and ist are stepped one step at a time (ist's
 * rounds end every local_steps steps and at epoch ends, as in
 * st_train_run).  synth is refused: its segment epochs, where groups take
 * different numbers of steps, are no sequence of steps of the run.
 *
 * After a failure inside a call (a diverging loss, say) the workers have
 * stopped mid-step: every later call but st_trainer_destroy returns that
 * failure again.
 */
#ifndef SUBTRAIN_TRAINER_H
#define SUBTRAIN_TRAINER_H

#include <stddef.h>
#include <stdint.h>
#include <subtrain/data.h>
#include <subtrain/model.h>
#include <subtrain/status.h>
#include <subtrain/train.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct st_trainer st_trainer;

/* Checks cfg against the data as st_train_run does, makes the placement
 * and the run's plan (cfg->steps, or cfg->epochs of the training set),
 * and builds every worker.  cfg is copied (its strings, topology and
 * cpuset, are read here only); train and test must outlive the trainer. */
st_status st_trainer_create(const st_train_config *cfg, const st_dataset *train,
                            const st_dataset *test, st_trainer **out);

/* The next n_steps steps of the run (the schedule and the epochs' sample
 * orders continue where the last call stopped).  *loss (may be NULL): the
 * last step's loss as st_train_run reports it (on_step).  Refused,
 * without a step taken, when the run has fewer steps left. */
st_status st_trainer_step(st_trainer *t, uint64_t n_steps, float *loss);

/* The test set's mean loss and accuracy of the model as it is now, as an
 * epoch record computes them (ist: the parameters of the last round's
 * end).  Changes nothing training reads. */
st_status st_trainer_evaluate(st_trainer *t, double *loss, double *acc);

/* What a record would say so far, over every step since st_trainer_create:
 * epoch and step reached (final: the run's last step is done), mean step
 * loss, the last evaluation's test loss and accuracy (0 before any), the
 * learning rate of the last step, training samples per second (steps'
 * time only), wall time since creation, memory (worker_memory valid until
 * the next call on t), communication per worker and step, and the mean
 * step time split into compute, wait, reduce and optimizer. */
st_status st_trainer_metrics(const st_trainer *t, st_epoch_record *out);

/* Workers; steps taken so far and in the whole run (total may be NULL). */
int st_trainer_workers(const st_trainer *t);
uint64_t st_trainer_steps(const st_trainer *t, uint64_t *total);

/* The trained model's parameters in the full layout
 * (st_model_config_segments names them), count of them: the full model's
 * count (st_model_config_param_count), else ST_ERR_INVALID. */
st_status st_trainer_params(st_trainer *t, float *out, size_t count);

/* For timing a step by its parts (bench/bench_step.c) or inspecting a
 * worker: worker w's model instance (its subnetwork under sdp and ist),
 * NULL for no such worker.  Between calls only; its primitives run with
 * the calling thread's OpenMP thread count (set it to 1 to time one
 * worker's core).  A caller that writes its parameters calls
 * st_model_params_changed (bf16: one worker's update writes the weights'
 * bf16 copies for the next forward).  Where the workers share a weight
 * copy per NUMA domain (dp, sdp with backward masking: st_train_config.
 * weights), the models of a domain are built over one vector: writing one
 * writes them all. */
st_model *st_trainer_model(st_trainer *t, int w);

/* The optimizer half of the next step alone, on the gradients the
 * workers' models hold now (the caller ran st_model_forward_backward on
 * them): dp only (N > 1: reduce-scatter, the shards' update, all-gather).
 * Counts as a step (the schedule advances); *lr (may be NULL): the rate
 * used. */
st_status st_trainer_update(st_trainer *t, float *lr);

/* Releases the workers, the engines and the handle.  NULL is allowed. */
void st_trainer_destroy(st_trainer *t);

#ifdef __cplusplus
}
#endif
#endif /* SUBTRAIN_TRAINER_H */

/*
 * train/loop.h — private: the loop's pieces, shared by the two drivers of a
 * run: st_train_run (train.c: one persistent parallel region for the whole
 * run) and the trainer handle (trainer.c: one region per call).  They know
 * strategies only through the ops (strategy.h); loop.c runs the phases.
 */
#ifndef SUBTRAIN_TRAIN_LOOP_H
#define SUBTRAIN_TRAIN_LOOP_H

#include "train/strategy.h"

/* The config and the data agree (dimensions, classes). */
st_status st_loop_check_data(const st_train_config *cfg, const st_dataset *train,
                             const st_dataset *test);

/* Before the parallel region, r->cfg, train, test and cb set, r->failed
 * initialised: topology, placement, the split of the training set over
 * the workers (cfg->split), the slots, then the strategy's prepare (plan,
 * engines, its state).  On failure, st_loop_release. */
st_status st_loop_prepare(run_shared *r);
void st_loop_release(run_shared *r);

/* Worker wid on its thread: binds it to its PU, *backend <- the chunk
 * backend of its NUMA node, then the strategy builds its worker; with a
 * split, the scratch of its epoch orders. */
st_status st_loop_init_worker(run_shared *r, int wid, st_worker *w, st_chunk_backend *backend);

/* Worker 0, once every worker has built its memory: what the user should
 * hear about placement. */
void st_loop_report_warnings(run_shared *r);

/* The phase of a strategy without phases of its own: r->plan (set by the
 * strategy's prepare), from r->resume's position, with the ops' hooks;
 * the one a strategy's phase_begin changes. */
void st_loop_default_phase(const run_shared *r, st_phase *ph);

/* The sample order of epoch `epoch` (1-based, of the seed's) into
 * w->order. */
void st_loop_epoch_order(run_shared *r, st_worker *w, uint64_t epoch);

/* Step `step` (1-based, over the phase) of phase ph: global batch i of its
 * epoch; the phase's step, then in a stepwise phase the strategy's round
 * end (a stop waits for one: whole_after in strategy.h). */
st_status st_loop_step(run_shared *r, const st_phase *ph, st_worker *w, uint64_t i,
                       uint64_t step, float *loss, float *lr);

/* The whole run of worker wid after st_loop_init_worker: each phase of
 * the strategy's (its epochs with their records, stops and checkpoints),
 * the final record, the trained parameters (on_params). */
st_status st_loop_run_worker(run_shared *r, st_worker *w, const st_chunk_backend *backend);

/* Keeps the first failure's message; tells the other workers to stop. */
void st_loop_record_failure(run_shared *r, st_status s);

#endif /* SUBTRAIN_TRAIN_LOOP_H */

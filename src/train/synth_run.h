/*
 * train/synth_run.h — private: the state of a synth run (doc/synth.md,
 * synth.c), shared by its three files: synth.c (the strategy: its
 * groups, phases and the recovery epochs), synth_segment.c (a segment's
 * worker and step: synthetic inputs and targets) and synth_join.c (the
 * segment epochs' ends: the barrier, the join and its evaluation, the
 * records).
 */
#ifndef SUBTRAIN_TRAIN_SYNTH_RUN_H
#define SUBTRAIN_TRAIN_SYNTH_RUN_H

#include <pthread.h>
#include <stddef.h>

#include <subtrain/rng.h>
#include <subtrain/synth.h>

#include "nn/segment.h"
#include "train/strategy.h"

/* One group of workers and its segment.  The fields above `loss_sum` are
 * written before the parallel region and read by every member each step;
 * loss_sum and done are written by the group's first worker every step,
 * so they start a cache line of their own, and the struct is padded to
 * whole lines (it is 64-aligned), so that neither this group's read-only
 * fields nor the next group's share that line. */
typedef struct synth_group {
    int index;                       /* its segment, 0-based */
    int first, count;                /* workers [first, first + count) */
    int layer_first, layer_last;     /* its linear layers (1-based) */
    size_t n_params, full_offset;    /* its parameters, where they sit in the mlp's */
    double flops;                    /* per step and worker */
    st_comm *comm;                   /* NULL for a group of one, or none of it here */
    int rank_first, rank_last;       /* the ranks its workers are on (one process: 0, 0) */
    int local_first, local_count;    /* its workers on this rank (local indices; count 0:
                                      * none) */
    double *losses;                  /* spanning ranks: its members' losses of the epoch's
                                      * steps, (count, steps_per_epoch), this rank's rows
                                      * filled, the others 0 until the join */
    uint64_t steps_per_epoch;
    st_schedule schedule;
    _Alignas(64) double loss_sum;    /* over the epoch: the group's mean loss per step */
    _Atomic uint64_t done;           /* steps taken over the segment epochs (progress
                                      * for worker 0's step reports; relaxed) */
} synth_group;

_Static_assert(offsetof(synth_group, loss_sum) % 64 == 0 && sizeof(synth_group) % 64 == 0,
               "a group's per-step line is its own");

/* What one worker holds besides st_worker (its own lines). */
typedef struct synth_worker {
    _Alignas(64) st_segnet *net;
    const float *labels_in;          /* K x W: s_{g-1}, NULL for segment 1 */
    const float *labels_out;         /* K x W: s_g, NULL for the last segment */
    int32_t *y;                      /* (B) classes of the batch */
    st_rng noise;                    /* the root of its segment's noise streams */
} synth_worker;

/* The barrier of the epoch ends: a blocking one (mutex and condition
 * variable), not the engines' spin barrier.  At an epoch end a group that
 * finished early waits for the slowest group for as long as a whole
 * epoch's imbalance between them (the groups' per-worker loads differ by
 * up to a layer's FLOPs x the steps of an epoch): spinning that long would
 * burn the cores the slower groups need when the run is oversubscribed,
 * and distort the very timings being measured.  A few times an epoch,
 * outside the steps, a lock costs nothing that matters. */
typedef struct epoch_barrier {
    pthread_mutex_t lock;
    pthread_cond_t turn;
    int n, arrived, aborted;
    unsigned generation;
} epoch_barrier;

typedef struct synth_run {
    int segments;
    int cuts[ST_SYNTH_MAX_SEGMENTS - 1];
    synth_group groups[ST_SYNTH_MAX_SEGMENTS];
    int *group_of;                   /* n */
    synth_worker *workers;           /* n */
    epoch_barrier barrier;
    int barrier_ready;
    st_arena eval_arena;             /* worker 0's joined network */
    st_model *joined;
    uint64_t steps1;                 /* group 0's steps over the segment epochs: the
                                      * step numbers of the records and reports */
    double samples_per_epoch;        /* that went through every segment (synth.c) */
    st_mem_stats phase1_worst;       /* the largest worker of the segment epochs */
    int recovering;                  /* the recovery epochs have begun */
    int segment_epochs_done;         /* resumed: segment epochs before the checkpoint */
    int epochs_done;                 /* segment epochs ended (worker 0's) */
} synth_run;

/* ------------------------------------------------------------ synth_segment.c */

/* A strategy init_worker hook: worker wid's segment (that of its group),
 * attached to its group's engine; worker 0 (every rank's) also builds
 * the joined network for evaluation. */
st_status st_synth_init_worker(run_shared *r, void *state, int wid, st_worker *w,
                               const st_chunk_backend *backend);

/* The segment epochs' step (st_phase): worker w's batch of its group's
 * global batch i (of the epoch whose order w holds), forward, backward,
 * then the group's data parallelism (or a local update) at the group's
 * step `step`.  *loss: the group's mean for its first worker (spanning
 * ranks: the worker's own; the group's mean is known at the epoch end). */
st_status st_synth_segment_step(run_shared *r, void *state, st_worker *w, uint64_t i,
                                uint64_t step, float *loss, float *lr);

/* ------------------------------------------------------------ synth_join.c */

void st_synth_barrier_init(epoch_barrier *b, int n);
void st_synth_barrier_destroy(epoch_barrier *b);
/* Releases every worker waiting, now and later. */
void st_synth_barrier_abort(epoch_barrier *b);

/* The segment epochs' hooks (st_phase): the barrier of every worker at
 * their ends; the join and the joined network's evaluation; a worker's
 * bytes in its group's engine; the record (step times per group, the
 * segments and their losses); the step report's estimates. */
st_status st_synth_sync(run_shared *r, void *state, st_worker *w);
st_status st_synth_join_evaluate(run_shared *r, void *state, st_worker *w, double *loss,
                                 double *acc);
st_comm_bytes st_synth_segment_bytes(const run_shared *r, const void *state, int wid);
int st_synth_segment_work(const run_shared *r, const void *state, int wid, double *flops,
                          st_step_cost *out, int cap);
void st_synth_segment_record(const run_shared *r, void *state, st_epoch_record *rec);
void st_synth_segment_estimate(const run_shared *r, void *state, double train_time,
                               st_step_info *info);
/* The recovery epochs' label (st_phase): the phase and the segments; the
 * final record's memory the larger of the two phases' (the run's peak). */
void st_synth_recovery_label(const run_shared *r, void *state, st_epoch_record *rec);

#endif /* SUBTRAIN_TRAIN_SYNTH_RUN_H */

/*
 * train/run.h — private: the state the workers of one training run share,
 * and what the strategy files (train.c: the loop and data parallelism;
 * sdp.c: subnetworks) call in each other.
 *
 * Threading contract: run_shared is written before the parallel region, or
 * by one worker between two barriers; a worker_slot is written by its own
 * worker and read by worker 0 after a barrier.
 */
#ifndef SUBTRAIN_TRAIN_RUN_H
#define SUBTRAIN_TRAIN_RUN_H

#include <stdatomic.h>
#include <time.h>

#include <subtrain/comm.h>
#include <subtrain/subnet.h>
#include <subtrain/topo.h>

#include "train/worker.h"

/* What the loop needs besides the config, fixed before the first step. */
typedef struct run_plan {
    uint64_t steps_per_epoch;
    uint64_t total_steps;
    int epochs;             /* epochs started, the last possibly partial */
    st_schedule schedule;
} run_plan;

/* What one worker leaves for worker 0 to combine.  One cache line (or more)
 * per worker: the slots are written by their workers every step, and
 * neighbours must not invalidate each other's lines. */
typedef struct step_times {
    double compute, wait, reduce, optimizer;   /* seconds, summed over steps */
} step_times;

typedef struct worker_slot {
    _Alignas(64) float loss;          /* this step's mean loss over w's batch */
    double eval_loss;                 /* summed test loss of w's test batches */
    int64_t eval_correct;
    step_times times;                 /* over the current epoch */
    st_mem_stats memory;
    st_comm_bytes bytes;
    st_numa_ctx numa;                 /* the arena backend's state */
    /* Where worker 0 finds this worker's gradient for the alignment report:
     * its vector and which full-layout ranges it holds (from its arena). */
    const float *grads;
    float *saved_state[2];            /* ist keeping optimizer state: its
                                       * shard of the state vectors */
    float *saved_master;              /* sdp rounds: its master shard, kept
                                       * across a rebuild (outside the model's
                                       * part of the arena) */
    const st_range *ranges;
    const size_t *local;
    int n_ranges;
    uint64_t round_step;              /* ist: local steps since the round began */
    size_t load_bytes;                /* ist: what a round's rebuild reads from
                                       * the saved shards and writes into the
                                       * new subnetwork (its "all-gather") */
} worker_slot;

/* Everything the workers of one run share.  Written before the parallel
 * region, or by one worker between two barriers. */
typedef struct run_shared {
    const st_train_config *cfg;
    const st_dataset *train, *test;
    const st_train_callbacks *cb;
    run_plan plan;
    int n;                            /* workers */
    st_topology *topology;
    st_plan placement;
    st_comm *comm;                    /* NULL with one worker; with backward
                                       * masking: the gradients' engine */
    st_comm *params_comm;             /* backward masking: every worker holds
                                       * every parameter; used for its
                                       * all-gather (and masters) only */
    st_comm *state_comm[2];           /* ist --optimizer-state keep: one
                                       * reduce-only engine per state vector
                                       * (Adam: m and v; SGD: momentum) */
    int n_state;                      /* of them in use */
    st_param_segment *full_segs;      /* the full model's segments: shard
                                       * owners update full-layout ranges,
                                       * whatever subnetwork they train */
    int n_full_segs;
    st_assignment assign;             /* sdp: which worker holds which block */
    int assign_k;                     /* sdp: holders per block */
    st_arena eval_arena;              /* sdp: worker 0's full model for evaluation */
    st_model *eval_model;
    st_mem_stats *memory;             /* n: every worker's arena, for the record */
    double align_sum, align_min;      /* worker 0, over the current epoch */
    int align_count;
    worker_slot *slots;               /* n */
    double t0;
    uint64_t order_offset;            /* the loop's epoch e draws the order of
                                       * epoch order_offset + e (synth recovery
                                       * follows the segment epochs' orders) */
    atomic_int failed;                /* the first failure wins the message */
    st_status error_status;
    char error[512];
    st_epoch_record final;
    struct synth_run *synth;          /* synth: groups, engines, joined model */
} run_shared;

static inline double st_run_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A barrier over all workers (nothing to wait for with one). */
static inline st_status st_run_sync(run_shared *r, int w)
{
    return r->comm ? st_comm_barrier(r->comm, w) : ST_OK;
}

/* The engine whose master shards hold the parameters and whose all-gather
 * brings them to the workers (backward masking has a second engine). */
static inline st_comm *st_run_masters(const run_shared *r)
{
    return r->params_comm ? r->params_comm : r->comm;
}

/* train.c: the full-layout ranges of w's parameters (grads: of its
 * gradient vector) and where each starts in w's own vector, in w's arena
 * (rewound with the model). */
st_status st_run_model_ranges(st_worker *w, int grads, st_range **ranges, size_t **local,
                              int *n);
/* train.c: registers w's vectors with the reduction engine(s). */
st_status st_run_attach_worker(run_shared *r, int wid, st_worker *w);

/* train.c: the plan of a run of cfg's epochs (or steps) over `workers`
 * data-parallel workers (not synth's segment epochs: each group plans its
 * own, synth.c). */
st_status st_run_make_plan(const st_train_config *cfg, int workers, const st_dataset *train,
                           run_plan *p);

/* train.c: one model alone on the whole data set d, in its stored order
 * and batches of the model's batch (padding rows zero): the mean loss and
 * the accuracy.  Worker 0's full model (sdp forward masking) and synth's
 * joined network. */
st_status st_run_evaluate_model(st_model *m, const st_dataset *d, double *loss, double *acc);

/* train.c: the epochs of r->plan for worker w (data parallelism unless the
 * strategy says otherwise), records and the final record included. */
st_status st_run_worker_loop(run_shared *r, st_worker *w);

/* ------------------------------------------------------------ subnets.c */

/* A rebuilt subnetwork gets the current values of what it holds from the
 * owners' saved shards: into dst (w's compact vector), from every worker's
 * saved_master (which 0) or saved_state[which - 1]. */
st_status st_run_load_saved(const run_shared *r, st_worker *w, float *dst, int which);

/* Units: neuron groups of every layer (--subnet neuron; ist of mlp), or
 * resmlp blocks. */
int st_run_neuron_units(const st_train_config *c);
/* Whether some element may be held by nobody (neuron units of mlp with
 * forward masking or ist): the engines are told, and masters of such
 * elements are initialised by the strategy. */
int st_run_unheld_possible(const st_train_config *c);
/* Where (full layout) such elements can be: the hidden-to-hidden weight
 * matrices of mlp, at most cap of them; 0 when none can be unheld. */
#define ST_MAX_UNHELD_RANGES 1024
int st_run_unheld_ranges(const run_shared *r, st_range *out, int cap);
/* Refuses an assignment that would leave a worker without a block, or
 * without a neuron in some layer. */
st_status st_run_check_units(const run_shared *r);
/* r->assign <- the assignment of `round` (k = r->assign_k holders). */
st_status st_run_draw_assignment(run_shared *r, uint64_t round);
/* Worker wid's model config in the current assignment; *buf holds its
 * lists until the model is built (the caller frees it). */
st_status st_run_subnet_config(const run_shared *r, int wid, int train_scale,
                               st_train_config *mine, int **buf);

/* ------------------------------------------------------------ sdp.c */

/* The SDP options that exist so far, with messages for the rest. */
st_status st_sdp_check_config(const st_train_config *c);
/* State that outlives rounds, then w's first subnetwork, attached. */
st_status st_sdp_init_worker(run_shared *r, int wid, st_worker *w,
                             const st_chunk_backend *backend);
/* Round `round` of subnetworks (--resample). */
st_status st_sdp_new_round(run_shared *r, st_worker *w, uint64_t round);
/* Evaluation with worker 0's full model (forward masking). */
st_status st_sdp_evaluate_full(run_shared *r, st_worker *w, double *loss, double *acc);
/* The alignment report, worker 0 between the barrier and the reduction. */
st_status st_sdp_measure_alignment(run_shared *r, st_worker *w0, uint64_t i);

/* ------------------------------------------------------------ ist.c */

st_status st_ist_check_config(const st_train_config *c);
st_status st_ist_init_worker(run_shared *r, int wid, st_worker *w,
                             const st_chunk_backend *backend);
/* One local step: compute, then the worker's own optimizer on its
 * subnetwork; no communication. */
st_status st_ist_step(run_shared *r, st_worker *w, uint64_t i, uint64_t step, float *loss,
                      float *lr);
/* End of a round: parameters averaged over their holders (disjoint blocks:
 * copied; shared layers: averaged), a new partition, new subnetworks. */
st_status st_ist_round_end(run_shared *r, st_worker *w, uint64_t round);

/* ------------------------------------------------------------ synth.c */

st_status st_synth_check_config(const st_train_config *c);
/* Before the parallel region: cuts, the split of the workers into groups,
 * each group's reduction engine; r->plan becomes the recovery epochs'. */
st_status st_synth_prepare(run_shared *r);
/* Worker wid's segment (that of its group), attached to its group's
 * engine; worker 0 also builds the joined network for evaluation. */
st_status st_synth_init_worker(run_shared *r, int wid, st_worker *w,
                               const st_chunk_backend *backend);
/* The rest of w's run: its segment's epochs within its group, the joined
 * network's evaluation after each, then the recovery epochs (if any): data
 * parallelism of the joined network on a fresh arena from `backend`. */
st_status st_synth_loop(run_shared *r, st_worker *w, const st_chunk_backend *backend);
/* A worker failed: release everyone waiting in a group's engine. */
void st_synth_abort(run_shared *r);
void st_synth_release(run_shared *r);

#endif /* SUBTRAIN_TRAIN_RUN_H */

/*
 * train/run.h — private: the state the workers of one training run share,
 * whatever the strategy, and the common run helpers the strategies and
 * the loop call (run.c: plan, the run's engine, attaching a worker, the
 * sharded data-parallel step, evaluation; records.c: an epoch record's
 * common fields).
 *
 * These helpers call no strategy and no loop: see strategy.h for the
 * dependency direction inside train/.  A strategy's own state (engines of
 * its own, assignments, saved shards, ...) lives in its own struct, not
 * here.
 *
 * Threading contract: run_shared is written before the parallel region, or
 * by one worker between two barriers; a worker_slot is written by its own
 * worker and read by worker 0 after a barrier.
 */
#ifndef SUBTRAIN_TRAIN_RUN_H
#define SUBTRAIN_TRAIN_RUN_H

#include <stdatomic.h>
#include <time.h>

#include <subtrain/checkpoint.h>
#include <subtrain/comm.h>
#include <subtrain/subnet.h>
#include <subtrain/topo.h>

#include "topo/numa_impl.h"
#include "train/worker.h"

struct st_strategy_ops;

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
    double overlapped;        /* reduction during the backward, not in compute */
} step_times;

typedef struct worker_slot {
    _Alignas(64) float loss;          /* this step's mean loss over w's batch */
    double eval_loss;                 /* summed test loss of w's test batches */
    int64_t eval_correct;
    step_times times;                 /* over the current epoch */
    uint64_t steps;                   /* the steps they are of */
    st_mem_stats memory;
    st_comm_bytes bytes;
    size_t optim_bytes, optim_params; /* the last update's (st_optim) */
    st_numa_ctx numa;                 /* the arena backend's state */
    st_model *model;                  /* published by st_run_sync_state and
                                       * by a checkpoint */
    const st_optim *optim;            /* published by a checkpoint */
} worker_slot;

/* Where a run is between two steps: what a step checkpoint records and a
 * resumed run starts from.  epoch_step steps of `epoch` are done (0: it
 * has not begun), `step` steps of the run; loss_sum and losses: the
 * epoch's step losses so far (its record's mean continues exactly). */
typedef struct run_position {
    int epoch;
    uint64_t epoch_step, step;
    double loss_sum;
    uint64_t losses;
    double train_time;
} run_position;

/* A step checkpoint being resumed (checkpoint.c): the position, the full
 * model's parameters, and the file for the workers' and the strategy's
 * tensors.  Made before the parallel region, read-only after it. */
typedef struct run_resume {
    const st_safetensors *file;
    const char *name;                 /* for messages */
    run_position at;
    float *params;                    /* n_params, the full layout */
} run_resume;

/* A checkpoint being written by worker 0: the tensors and metadata the
 * loop and the strategy add (checkpoint.c keeps the strings). */
typedef struct run_ckpt {
    st_safetensors_tensor *tensors;
    int n, cap;
    st_safetensors_meta_entry *meta;
    int n_meta, cap_meta;
    char *text;                       /* the metadata values, one after another */
    size_t text_used, text_cap;
} run_ckpt;

/* One NUMA domain's copy of the weights, when the run's workers share
 * them (shared_weights.c): from an arena of its own, on the domain's node. */
typedef struct run_domain {
    st_arena arena;                   /* its chunks: its first worker's backend */
    int arena_made;                   /* to release */
    float *params;                    /* n_params, the full layout */
    uint16_t *bf16;                   /* n_params bf16 copies, or NULL */
    st_blocked_store *blocked;        /* --weight-layout blocked's copies, or NULL */
} run_domain;

/* Everything the workers of one run share.  Written before the parallel
 * region, or by one worker between two barriers. */
typedef struct run_shared {
    const st_train_config *cfg;
    const st_dataset *train, *test;
    const st_train_callbacks *cb;
    const struct st_strategy_ops *ops; /* the strategy (strategy.h) */
    void *strategy;                   /* its state, from its prepare */
    run_plan plan;                    /* set by the strategy's prepare */
    int n;                            /* workers of this process (threads) */
    /* The ranks of an MPI run (world.h): this one is `rank` of `ranks`,
     * and its worker w is global worker first + w of n_all = ranks x n.
     * Whatever a worker draws (batch rows, subnetwork, partition) comes
     * from its global index; one process: rank 0 of 1, first 0, n_all n. */
    int rank, ranks, first, n_all;
    float *losses_mine, *losses_all;  /* ranks > 1: a step's losses (n, n_all) */
    st_split *split;                  /* the training set dealt to the n_all
                                       * workers (cfg->split); NULL: iid */
    double *eval_all;                 /* ranks > 1: each rank's test sums (2 x ranks) */
    st_topology *topology;
    st_plan placement;
    int shared_weights;               /* a weight copy per NUMA domain (shared_weights.c) */
    run_domain *domains;              /* placement.n_domains, with shared weights */
    float *widened;                   /* st_run_master_full's, or NULL */
    st_comm *comm;                    /* the run's engine, created by the
                                       * strategy's prepare (NULL: none, one
                                       * worker alone); also the barrier of
                                       * all workers */
    st_param_segment *full_segs;      /* the full model's segments: shard
                                       * owners update full-layout ranges,
                                       * whatever subnetwork they train */
    int n_full_segs;
    size_t n_params;                  /* of the full model (P), counted once:
                                       * the records need it at every epoch
                                       * end, where nothing may allocate */
    size_t ring_params;               /* what a ring all-reduce would carry
                                       * instead of P (random-k: the kept
                                       * coordinates); 0: P */
    st_mem_stats *memory;             /* n: every worker's arena, for the record */
    /* Untrained state (batch norms' running statistics) in the full
     * model's layout: at each sync, the mean over the workers holding each
     * element (st_run_sync_state); what a rebuilt subnetwork and the full
     * evaluation model load.  NULL: the model keeps none. */
    float *state_full;
    double *state_sum;                /* the sync's scratch, made with it */
    uint32_t *state_count;
    size_t n_state;
    worker_slot *slots;               /* n */
    double t0;
    atomic_int failed;                /* the first failure wins the message */
    atomic_ullong stop_step;          /* graceful stop: the last step (0: none yet),
                                       * set once by worker 0 (loop.c) */
    atomic_ullong save_step;          /* a checkpoint asked for (callbacks'
                                       * checkpoint_now) at this step; 0: none */
    run_resume *resume;               /* NULL: a new run (checkpoint.c) */
    uint64_t data_print[2];           /* the training and test sets' fingerprints,
                                       * with checkpoints or a resume (0: none) */
    int sizing;                       /* st_train_size: the workers are laid out,
                                       * not bound, on untouched memory, and
                                       * never step */
    st_sizing_space *sizing_space;    /* sizing: the address space they are
                                       * laid out in */
    struct st_comm_world *sizing_world;   /* sizing ranks > 1: the described job
                                       * whose rank `rank` this is (its engines'
                                       * gathers; comm/sizing_world.h) */
    uint64_t fault_step;              /* SUBTRAIN_FAULT=RANK:STEP names this rank:
                                       * worker 0 fails at that step (tests of
                                       * failure handling; 0: never) */
    int fault_init;                   /* SUBTRAIN_FAULT=RANK:init names this rank:
                                       * its last worker fails once set up */
    /* worker 0's last step that ended, as reported, and its phase's label
     * hook (strategy.h, st_phase; NULL: none): where a diverged run's
     * final record says it got to */
    int at_epoch, at_epochs;
    uint64_t at_step;
    float at_lr;
    void (*at_label)(const struct run_shared *r, void *state, st_epoch_record *rec);
    st_status error_status;
    char error[512];
    st_epoch_record final;
} run_shared;

static inline double st_run_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Worker wid's global index. */
static inline int st_run_global(const run_shared *r, int wid)
{
    return r->first + wid;
}

/* A worker's samples a step: its micro-batches' (batch x accumulate).
 * Worker g's step i reads rows [(i N + g) R, (i N + g + 1) R) of the
 * epoch's order (R these rows, N the workers of all ranks). */
static inline uint64_t st_run_step_rows(const st_train_config *c)
{
    return (uint64_t)c->batch * (uint64_t)(c->accumulate > 1 ? c->accumulate : 1);
}

/* A barrier over all workers (nothing to wait for with one). */
static inline st_status st_run_sync(run_shared *r, int w)
{
    return r->comm ? st_comm_barrier(r->comm, w) : ST_OK;
}

/* ------------------------------------------------------------ run.c */

/* The plan of a run of cfg's epochs (or steps) over `workers`
 * data-parallel workers (not synth's segment epochs: each group plans its
 * own, synth.c). */
st_status st_run_make_plan(const st_train_config *cfg, int workers, const st_dataset *train,
                           run_plan *p);

/* The reduction payload of --comm-precision (for every engine that
 * reduces gradients). */
st_comm_payload st_run_comm_payload(const st_train_config *cfg);

/* An engine over the run's workers (their NUMA domains) and the full
 * model's parameters, with `roles` (comm.h; 0: both); allow_unheld:
 * elements nobody holds may exist, in `unheld` only (subnets.h). */
st_status st_run_create_engine(const run_shared *r, int roles, int allow_unheld,
                               const st_range *unheld, int n_unheld, st_comm **out);

/* The same for compact subnetworks with a bf16 master (sdp with forward
 * masking): the elements of `m16` (the full model's weight copies, sorted)
 * have bf16 master shards (st_comm_config.bf16_master), not copies_master. */
st_status st_run_create_engine16(const run_shared *r, int roles, int allow_unheld,
                                 const st_range *unheld, int n_unheld, const st_range *m16,
                                 int n_m16, st_comm **out);

/* The same over a vector of n floats of the strategy's own, which every
 * worker holds whole (not the parameters: no shared copy). */
st_status st_run_create_vector_engine(const run_shared *r, size_t n, int roles, st_comm **out);

/* The full-layout ranges of w's parameters (grads: of its gradient vector)
 * and where each starts in w's own vector, in w's arena (rewound with the
 * model). */
st_status st_run_model_ranges(st_worker *w, int grads, st_range **ranges, size_t **local,
                              int *n);

/* Which elements of the full vector a worker's gradient vector holds, as
 * registered with the gradients' engine. */
typedef struct run_attachment {
    const float *grads;
    const st_range *ranges;
    const size_t *local;
    int n_ranges;
    /* the ranges lie in the gradient vector in their full order (local
     * grows with them): a tail of it is a tail of the full layout */
    int in_order;
} run_attachment;

/* Before w attaches to engine c: its model's weight copies, which the
 * all-gather then writes as it writes the parameters (plain bf16 ones;
 * blocked ones unless w reads its domain's store, which the updates
 * pack). */
void st_run_set_copies(st_comm *c, int wid, const st_worker *w);
/* The same for a model that reads no domain store (synth's segments). */
void st_run_set_model_copies(st_comm *c, int wid, const st_model *m);
/* Registers w's vectors with the engines: `grads` reduces its gradients;
 * `params` (NULL: the same engine) holds every parameter and carries the
 * masters and the all-gather (backward masking).  *att (may be NULL): what
 * was registered. */
st_status st_run_attach_worker(st_comm *grads, st_comm *params, int wid, st_worker *w,
                               run_attachment *att);

/* The sharded data-parallel step (N > 1, or subnetworks): compute, wait,
 * reduce-scatter, the shard's update, all-gather.  `grads` reduces the
 * gradients, `masters` holds the master shards and gathers them (the same
 * engine unless backward masking); at_barrier (may be NULL) is called by
 * worker 0 between the barrier and the reduction, every worker's gradient
 * complete and in place (sdp's alignment report); the masters are the
 * step's, not updated yet, only in a step without overlap. */
typedef struct run_sharded {
    st_comm *grads, *masters;
    st_status (*at_barrier)(run_shared *r, void *ctx, st_worker *w0, uint64_t i, uint64_t step);
    void *ctx;
    /* 1: the step reduces w's gradients during the backward as its layers
     * complete them (st_comm_reduce_ready) */
    int overlap;
    /* NULL: w's gradient vector is in the full layout; else where its
     * elements are (a compact subnetwork's), the tails its backward makes
     * final said of the full layout through it */
    const run_attachment *att;
    /* NULL: `grads` reduce-scatters.  Else it replaces that (every worker,
     * after the barrier): w's shard of `masters` gets its gradient, left
     * in *out (indexed from the shard's begin); `grads` is then unused
     * (compressed communication, compress.h) */
    st_status (*reduce)(run_shared *r, void *ctx, st_worker *w, float **out);
    /* own_copies 1: the update writes `copies` (full layout, over w's shard:
     * its bf16 master shard, st_comm_shard_params16), not the model's */
    int own_copies;
    const st_param_copy *copies;
    int n_copies;
} run_sharded;

st_status st_run_sharded_step(run_shared *r, const run_sharded *e, st_worker *w, uint64_t i,
                              uint64_t step, float *loss, float *lr);
/* Its second half alone, from the barrier on, on the gradients the models
 * hold now; t: when their compute ended (for the wait time). */
st_status st_run_sharded_update(run_shared *r, const run_sharded *e, st_worker *w, uint64_t i,
                                uint64_t step, double t, float *loss, float *lr);

/* Worker 0, every worker's loss of the step in its slot: the mean over
 * every worker of every rank, summed in global worker order. */
st_status st_run_mean_loss(run_shared *r, float *loss);

/* What worker w reads and writes in a step of the run's engine alone. */
st_comm_bytes st_run_engine_bytes(const run_shared *r, int w);

/* One model alone on the whole data set d, in its stored order and
 * batches of the model's batch (padding rows zero): the mean loss and the
 * accuracy.  Worker 0's full model (subnetworks) and synth's joined
 * network. */
/* The initial values of elements [begin, end) of the full model: the
 * seed's, or those of cfg->init_params (--init). */
st_status st_run_initial_range(const st_train_config *cfg, size_t begin, size_t end, float *out);

st_status st_run_evaluate_model(st_model *m, const st_dataset *d, double *loss, double *acc);

/* The test set split round-robin over the workers' replicas (all identical
 * after the all-gather); worker 0 adds the sums up in worker order. */
st_status st_run_evaluate_replicas(run_shared *r, st_worker *w, double *loss, double *acc);

/* Every worker: the running statistics of each batch norm channel become
 * the mean over the workers that hold it (dp: all of them; subnetworks:
 * the holders of its unit), in r->state_full and in every worker's model.
 * Batch statistics stay each worker's own, as in ordinary data
 * parallelism; the running ones are only read by evaluation, so they meet
 * where the models meet for it: before each evaluation and before a
 * subnetwork is rebuilt.  Two barriers; no-op without state. */
st_status st_run_sync_state(run_shared *r, st_worker *w);
/* A model's state from r->state_full (a rebuilt subnetwork, the full
 * evaluation model); no-op without state. */
void st_run_load_state(const run_shared *r, st_model *m);

/* ------------------------------------------------------------ shared_weights.c */

/* Before the strategy's prepare (which creates engines with it): whether
 * the workers of each NUMA domain share one weight copy (the caller's
 * verdict: the strategy's kind, one process, more than one worker). */
st_status st_run_weights_prepare(run_shared *r, int shared);
/* After the run, no thread: the domains' copies go. */
void st_run_weights_release(run_shared *r);
/* Every worker, with shared weights: w->storage becomes its domain's copy
 * (of cfg's full model: bf16 copies too in bf16, plain or in a store of
 * blocked ones), which the domain's first
 * worker takes from its backend.  One barrier.  One worker alone with a
 * bf16 master in the copies: w->storage is a vector of its own, its matrix
 * elements without memory.  Else nothing. */
st_status st_run_weights_storage(run_shared *r, st_worker *w, const st_train_config *cfg,
                                 const st_chunk_backend *backend);
/* Every worker, its model built: the values of the full vector `full`
 * (NULL: the initial ones, st_run_initial_range) and their bf16 copies
 * (a bf16 master's: the copies only); with shared weights w writes its
 * part of its domain's copy and the workers meet at a barrier; else w's
 * own vector (nothing for NULL, unless a bf16 master's: the build
 * initialised it). */
st_status st_run_weights_load(run_shared *r, st_worker *w, const float *full);
/* Elements [lo, hi) of w's parameters into the blocked copies its model
 * lists (partial rows an element at a time: another thread may write the
 * rest of a row).  With shared weights, what writes the domain's copy
 * packs its part here. */
void st_run_pack_blocked(const st_worker *w, size_t lo, size_t hi);
/* Every worker, after an all-gather into shared weights: the shards it
 * brought from other domains packed into the domain's blocked copies
 * (each domain's updates packed its own), dealt round the domain's
 * workers, then a barrier of the engine.  No-op without a store of
 * blocked copies or on one domain. */
st_status st_run_pack_gathered(run_shared *r, st_comm *masters, st_worker *w);
/* Whether the run has a bf16 master (--master-weights bf16-sr) in the
 * weights' bf16 copies: one worker's, each NUMA domain's with shared
 * weights, each replica's with private ones; its engine gathers them as
 * bf16 (st_comm_config.copies_master). */
int st_run_copies_master(const run_shared *r);
/* w's full vector for its readers (checkpoints, the final parameters):
 * its own; with a bf16 master in the copies alone, r->widened, made from
 * it and the copies, until st_run_master_full_done. */
st_status st_run_master_full(run_shared *r, st_worker *w, const float **out);
/* Elements [begin, end) of that vector written into dst (dst[0]: element
 * begin): the fp32 elements copied, the copies widened (exact). */
void st_run_master_widen(const st_worker *w, size_t begin, size_t end, float *dst);
void st_run_master_full_done(run_shared *r);
/* The full model of cfg for worker w on the run's weights: storage,
 * model, initial values. */
st_status st_run_build_model(run_shared *r, st_worker *w, const st_train_config *cfg,
                             const st_chunk_backend *backend);
/* Its last part, for a strategy that builds w's model itself on
 * st_run_weights_storage's storage (a full model's layout): a sparse
 * vector's memory committed, then the initial values loaded where
 * st_run_weights_load writes them. */
st_status st_run_weights_built(run_shared *r, st_worker *w);
/* The memory of worker w for the records: its arena's, and with shared
 * weights its share of its domain's copy (rounded up). */
void st_run_worker_memory(const run_shared *r, const st_worker *w, st_mem_stats *out);

/* ------------------------------------------------------------ checkpoint.c */

/* Before the strategy's prepare (r->n, n_params and state_full known):
 * the data's fingerprints, when the run writes step checkpoints or
 * resumes; cfg->resume checked against this run (the caller's options,
 * the workers of all ranks, the data) and read into r->resume; the
 * averaged running statistics restored.  No-op without either. */
st_status st_run_resume_open(run_shared *r);
void st_run_resume_close(run_shared *r);
/* After the strategy's prepare: the position is one of r->plan. */
st_status st_run_resume_check_position(const run_shared *r);
/* A strategy's resume hook: worker w's model's parameters (from the full
 * vector), its optimizer vectors and its model's running statistics. */
st_status st_run_resume_model(run_shared *r, st_worker *w);
/* Its optimizer vectors alone (a worker without an st_model: synth's
 * segments). */
st_status st_run_resume_optimizer(run_shared *r, st_worker *w);
/* A metadata entry of the file being resumed, a whole number (a
 * strategy's own counters: ist's rounds). */
st_status st_run_resume_meta_u64(const run_shared *r, const char *key, uint64_t *out);
/* The same, a count of steps: at most the steps the file's run had taken
 * (a strategy's counters of rounds and of steps since its state began). */
st_status st_run_resume_meta_steps(const run_shared *r, const char *key, uint64_t *out);
/* A tensor of the file being resumed into dst, checked: F32, `count`
 * elements. */
st_status st_run_resume_load(const run_shared *r, const char *name, float *dst, size_t count);
/* Worker wid's shard of engine c, of the resumed full parameters, into
 * dst (a master shard, ist's saved master).  With shared weights a master
 * shard is its domain's copy, which st_run_resume_model loads: then
 * nothing. */
void st_run_resume_shard(const run_shared *r, st_comm *c, int wid, float *dst);
/* dp: w's master shard of engine c, as st_run_resume_shard; a bf16
 * master in the copies alone has no element under them there (its
 * copies are loaded by st_run_resume_model). */
void st_run_resume_master(const run_shared *r, st_comm *c, st_worker *w);

/* Worker 0, the others waiting between their steps with their models and
 * optimizers published in their slots: writes DIR/step-NNNNNNNN.safetensors
 * of position `at`, NNNNNNNN the run's step `step` (phases before the
 * position's counted), and prunes the older ones to cfg->checkpoint.keep. */
st_status st_run_checkpoint_write(run_shared *r, st_worker *w0, const run_position *at,
                                  uint64_t step);
/* For a strategy's save hook: a float tensor (borrowed until the write),
 * a metadata entry (copied). */
st_status st_run_ckpt_tensor(run_ckpt *ck, const char *name, const float *data, size_t count);
st_status st_run_ckpt_meta(run_ckpt *ck, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ------------------------------------------------------------ records.c */

/* Worker 0, after a barrier: the slots combined into the epoch record
 * (times per step: each worker's mean over its own steps, then the mean
 * over the workers; memory, communication); the phase's record hook
 * completes it. */
void st_run_fill_record(run_shared *r, st_epoch_record *rec);

/* Worker w's end of an epoch (or of a trainer's call): what its record
 * reads of w besides the times (memory, steps taken, the last update's
 * bytes; the engine's bytes are the caller's). */
static inline void st_run_publish_worker(run_shared *r, const st_worker *w, uint64_t steps)
{
    worker_slot *slot = &r->slots[w->id];
    st_run_worker_memory(r, w, &slot->memory);
    slot->steps = steps;
    slot->optim_bytes = w->optim.update_bytes;
    slot->optim_params = w->optim.updated;
}

/* Worker 0 after each step that ended: where the run has got to
 * (run_shared.at_*, for a diverged run's final record). */
static inline void st_run_note_step(run_shared *r, int epoch, int epochs, uint64_t step,
                                    float lr)
{
    r->at_epoch = epoch;
    r->at_epochs = epochs;
    r->at_step = step;
    r->at_lr = lr;
}

#endif /* SUBTRAIN_TRAIN_RUN_H */

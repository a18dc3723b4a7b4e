/*
 * subtrain/train.h — the training loop, evaluation and metrics records.
 *
 * st_train_run() trains a model on a dataset with the configuration's
 * workers, under its strategy (dp, sdp, ist, synth, localsgd), in this
 * process and, when MPI started it, over every rank.  Each worker is a pinned thread
 * that owns its arena, its model instance (primitives, workspace,
 * activations, parameters, gradients) and its optimizer state, all created
 * on that thread before the first step.  The loop reports through
 * callbacks; it never prints.
 */
#ifndef SUBTRAIN_TRAIN_H
#define SUBTRAIN_TRAIN_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <subtrain/arena.h>
#include <subtrain/comm.h>
#include <subtrain/checkpoint.h>
#include <subtrain/comm.h>
#include <subtrain/data.h>
#include <subtrain/model.h>
#include <subtrain/optim.h>
#include <subtrain/status.h>
#include <subtrain/subnet.h>
#include <subtrain/synth.h>
#include <subtrain/topo.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A strategy is its number in the strategies' table (subtrain/strategy.h,
 * st_strategy_info_of).  The first ones have enumerators; every one is
 * found by its name with st_strategy_parse ("localsgd"). */
typedef enum st_strategy {
    ST_STRATEGY_DP, ST_STRATEGY_SDP, ST_STRATEGY_IST, ST_STRATEGY_SYNTH
} st_strategy;

const char *st_strategy_name(st_strategy s);
st_status st_strategy_parse(const char *name, st_strategy *out);

/* Where the workers of a data-parallel step read their weights
 * (doc/reduction.md, "Weights"): SHARED, one copy per NUMA domain that
 * the shard owners update in place, for the strategies whose workers all
 * hold the full model (dp, sdp with backward masking, synth's recovery
 * epochs; one process: ranks over MPI keep a replica per worker);
 * PRIVATE, a replica per worker, which the all-gather fills. */
typedef enum st_weights { ST_WEIGHTS_SHARED, ST_WEIGHTS_PRIVATE } st_weights;
/* "shared", "private"; parse: ST_ERR_INVALID "unknown weights placement 'x'
 * (allowed: shared, private)". */
const char *st_weights_name(st_weights w);
st_status st_weights_parse(const char *name, st_weights *out);

/* Checkpoints of a run's whole training state (doc/checkpoints.md): every
 * file DIR/step-NNNNNNNN.safetensors holds the full model's weights (as a
 * weights file: any safetensors reader, --init) and, as tensors under
 * "train." and metadata, what continues the run bitwise: each worker's
 * optimizer vectors and running statistics, the strategy's own state, the
 * step, the position in the epoch, the loss summed so far. */
typedef struct st_checkpoint_plan {
    const char *dir;          /* NULL: no checkpoints (created if missing) */
    uint64_t every;           /* after every this many steps (ist,
                               * localsgd: at the next round end); 0: not
                               * by steps */
    int every_epoch;          /* after each epoch's record */
    int keep;                 /* the newest K step files stay; 0: all */
    const st_safetensors_meta_entry *meta;   /* added to every file's metadata */
    int n_meta;
} st_checkpoint_plan;

/* sdp's options (--strategy sdp, doc/sdp.md). */
typedef struct st_sdp_config {
    st_subnet_kind subnet;    /* units: block or neuron (ist refuses neuron
                               * on a model with blocks) */
    st_masking masking;       /* forward (default) or backward */
    double coverage;          /* fraction of workers holding each unit */
    uint64_t resample;        /* redraw the masks every R steps; 0: fixed */
    int scale_branches;       /* forward masking: in training each block's
                               * branch is scaled by 1 / coverage (N / k);
                               * evaluation runs the full model unscaled.
                               * -1 (default): on (measured on resmlp,
                               * doc/sdp.md), except for block units of models
                               * with batch norm (measured on resnet,
                               * doc/cnn.md) */
    uint64_t align_every;     /* every this many steps, measure each worker's
                               * gradient alignment (0: never) */
} st_sdp_config;

/* ist's options (--strategy ist, doc/ist.md). */
typedef struct st_ist_config {
    uint64_t local_steps;     /* steps between two synchronisations (R) */
    int eval_scale;           /* resmlp: scale each block's branch by 1/N at
                               * evaluation (ResIST); default on */
    int train_scale;          /* scale what reads a 1/N part (mlp: the layers
                               * after a hidden layer; resmlp: the branches)
                               * by N in training, like inverted dropout.
                               * -1: on for mlp, off for resmlp */
    int keep_state;           /* the optimizer state of every parameter
                               * survives rounds, averaged over its holders
                               * like the parameters; 0 (default): reset
                               * every round, as ResIST resets momentum */
} st_ist_config;

/* localsgd's options (--strategy localsgd, doc/localsgd.md). */
typedef struct st_localsgd_config {
    uint64_t local_steps;     /* steps between two averages (R), default 50 */
    int keep_state;           /* 1: the optimizer state is averaged with the
                               * parameters; 0 (default): zeroed at every
                               * average */
} st_localsgd_config;

/* dp's options (--strategy dp): how its gradients are reduced
 * (doc/reduction.md, "Compressed communication"). */
typedef enum st_compress_kind {
    ST_COMPRESS_NONE = 0,     /* every coordinate (default) */
    ST_COMPRESS_RANDK,        /* random-k: each step a seeded subset of
                               * a fraction `keep` of every shard's
                               * coordinates, the same for all workers */
} st_compress_kind;

typedef struct st_dp_config {
    st_compress_kind compress;
    float keep;               /* randk: Q, the fraction kept, in (0, 1]; the
                               * kept coordinates are scaled by (coordinates /
                               * kept) of their shard (1 / Q) */
    int error_feedback;       /* randk: each worker adds what it dropped to
                               * its next gradient and sends the kept ones
                               * unscaled (no longer unbiased) */
} st_dp_config;

/* --compress's value, "none" or "randk:Q", into out's compress and keep;
 * ST_ERR_INVALID saying why ("expected none or randk:Q ...", "Q, the
 * fraction of coordinates kept, must be a number in (0, 1]"). */
st_status st_compress_parse(const char *text, st_dp_config *out);

/* What worker w of dp with c's compression reads and writes a step (the
 * records' comm_bytes_per_worker_step), over the engine cfg describes
 * (workers, domains, parameters, payload; shared_params 1 as training
 * runs), by the plans' rules, without running anything (`subtrain
 * topo --compress`).  c none: st_comm_plan_bytes(cfg). */
st_status st_compress_plan_bytes(const st_dp_config *c, const st_comm_config *cfg, int w,
                                 st_comm_bytes *out);

typedef struct st_train_config {
    st_strategy strategy;     /* dp: every worker trains the full model;
                               * sdp: each worker trains its subnetwork;
                               * ist: disjoint subnetworks, local steps;
                               * synth: segments trained apart against
                               * synthetic labels, then joined; localsgd:
                               * full replicas averaged every R steps.
                               * Each strategy's options are its member
                               * below; the others leave them
                               * alone, and refuse those they must not
                               * ignore (st_train_config_check) */
    st_dp_config dp;
    st_sdp_config sdp;
    st_ist_config ist;
    st_synth_config synth;    /* synth: segments, cuts, labels, recovery */
    st_localsgd_config localsgd;
    /* The subnetwork strategies' (sdp, ist) units and evaluation: */
    int neuron_group;         /* neuron units: neurons per group, aligned so
                               * compact matrices keep whole SIMD vectors
                               * (default 16: one AVX-512 register) */
    int bn_calibration;       /* subnetworks evaluated as the full model (sdp
                               * with forward masking, ist): before each
                               * evaluation, the full model re-estimates its
                               * batch norms' running statistics on this many
                               * training batches (st_model_calibrate); 0: it
                               * uses the holders' averaged statistics.
                               * Default 50 (doc/cnn.md) */
    int workers;              /* worker threads; 0: one per physical core */
    const char *topology;     /* NULL: this machine (training binds for real) */
    const char *cpuset;       /* NULL: the process's; else OS PU list "0-3" */
    int oversubscribe;        /* allow more workers than PUs */
    int threads_per_worker;   /* T: a worker is a team of T cores of one NUMA
                               * domain, its primitives running T threads;
                               * 0 or 1: one core (doc/scaling.md) */
    int team_spans;           /* allow a team across NUMA domains */
    int core_limit;           /* workers 0: one per core of the cpuset, but at
                               * most this many cores (SLURM_CPUS_PER_TASK);
                               * 0: no limit */
    /* The gradients the reduction reads (doc/reduction.md, "Comm
     * precision"): FP32 (default) or BF16 (each worker's gradient rounded
     * to bf16 into a buffer, summed in fp32 by the owners; masters,
     * optimizer and all-gather fp32).  dp, sdp, synth, also over MPI
     * ranks (a rank's partial sum is rounded to bf16 again as it is sent);
     * ist and localsgd, which average parameters, refuse BF16. */
    st_precision comm_precision;
    st_weights weights;       /* SHARED (default) where the strategy can,
                               * PRIVATE: a replica per worker regardless */
    int reduce_after_backward; /* 1: no reduction during the backward
                               * (st_comm_reduce_ready): the whole
                               * reduce-scatter after it, as the same bits
                               * later (tests and benchmarks compare the
                               * two); 0 (default): during it where the
                               * strategy reduces gradients */
    int bf16_emulated;        /* model.precision bf16 on a CPU without native
                               * bf16 (st_bf16_probe: EMULATED): 0 refuses
                               * with a message naming the ISA, 1 runs it
                               * with a warning that it is slow */
    st_model_config model;
    st_optim_config optim;
    st_schedule_kind schedule;
    uint64_t warmup_steps;    /* cosine schedule only; ST_WARMUP_AUTO: 5% of the run */
    int batch;                /* samples per micro-batch and worker */
    int accumulate;           /* micro-batches a step: their gradients' mean
                               * is reduced and updated once, as one batch of
                               * accumulate x batch would be (up to the
                               * order of the fp32 sums; batch norm
                               * normalises each micro-batch); 1 (default;
                               * 0 too): none.  Steps, epochs, the schedule
                               * and checkpoints count updates */
    st_split_config split;    /* how the training set is dealt to the
                               * workers (data.h): iid (default) or a
                               * non-iid split of the seed, which every
                               * strategy's workers read their batches
                               * from (synth refuses one) */
    int epochs;               /* used when steps == 0 */
    uint64_t steps;           /* total steps; 0: epochs x steps per epoch */
    uint64_t seed;            /* init, shuffles */
    const float *init_params; /* NULL: initial values from the seed; else the full
                               * model's parameters to start from (--init: a
                               * checkpoint's weights, a fresh optimizer) */
    st_checkpoint_plan checkpoint;
    /* NULL: a new run; else a step checkpoint of this very run (same
     * options, workers and data) to continue from: the rest of the run is
     * bitwise the run that was never stopped.  resume_name names it in
     * messages. */
    const st_safetensors *resume;
    const char *resume_name;
    /* The run's options in its user's words: key, an option's name
     * without its dashes ("lr"); value, as the user gives it ("0.001"),
     * "" for its default.  Every step checkpoint records them
     * ("subtrain.option.KEY") and a resume compares them with the file's
     * both ways: a value that differs, or a key on one side only, refuses
     * the resume in one line ("its run had --precision fp32, this one has
     * --precision bf16").  Give every option that changes what the steps
     * compute, in the same words each time (the CLI gives all of
     * --dump-config's but those that may change on a resume,
     * doc/checkpoints.md).  The library itself checks the rest: the
     * workers over all ranks, and the data (its sample counts and a
     * fingerprint of its content, st_dataset_fingerprint).  Keys unique,
     * valid while the run lasts; NULL with 0: no options compared. */
    const st_safetensors_meta_entry *options;
    int n_options;
} st_train_config;

#define ST_WARMUP_AUTO UINT64_MAX

/* The recipe of the README: resmlp depth 4 width 256, AdamW lr 1e-3 wd 0.01,
 * cosine schedule with automatic warmup, batch 128, 5 epochs, seed 1, one
 * data-parallel worker.
 * Cosine was chosen by measurement: on Fashion-MNIST it ends 1.4 points
 * above a constant rate (0.8946 against 0.8798 test accuracy, seed 1). */
st_train_config st_train_config_default(void);
/* The options' values and combinations, without data; and whether the
 * strategy can spread the workers over its units (blocks, groups of
 * neurons, segments) when their number is known here: workers given (not
 * 0) and, in an MPI job, MPI started (else st_train_placement_check
 * does it). */
st_status st_train_config_check(const st_train_config *cfg);
/* What the weights of c's strategy, with c's options, can be: SHARED
 * where every worker of its data-parallel steps holds the full model,
 * PRIVATE where a worker needs its own (ist, localsgd, sdp with forward
 * masking).  A run uses SHARED only where both this and c->weights say so. */
st_weights st_strategy_weights(const st_train_config *c);
/* Where the run's workers would go, checked without running: the topology
 * loads, is this machine, the placement (--workers, --cpuset, teams) can
 * be made, and the strategy can spread that many workers (of every rank,
 * once MPI has started) over its units.  ST_ERR_INVALID: the configuration
 * asks for what this machine cannot give, or for a layout that cannot
 * work, a usage error; the CLI asks before loading data. */
st_status st_train_placement_check(const st_train_config *cfg);

/* Reported after every step (cheap to produce). */
typedef struct st_step_info {
    uint64_t step, total_steps;
    int epoch;                /* 1-based */
    int epochs;               /* epochs in the run (the last may be partial) */
    float loss;               /* this step's mean loss */
    float lr;
    double samples_per_s;     /* over training time so far, evaluation excluded */
    double elapsed_s;         /* wall time since training started */
    double eta_s;             /* estimated time to the end */
} st_step_info;

/* Reported after every epoch and once at the end (final = 1). */
typedef struct st_epoch_record {
    int epoch;
    int epochs;               /* epochs in the run (the last may be partial) */
    uint64_t step;
    int final;
    int interrupted;          /* final record of a run stopped early (stop) */
    int diverged;             /* final record of a run whose loss became NaN or
                               * infinite: epoch, step and lr of worker 0's last
                               * step that ended, losses and rates NaN; the run
                               * then returns ST_ERR_NUMERIC */
    double train_loss;        /* mean of the epoch's step losses; synth segment
                               * epochs: the last segment's cross-entropy on
                               * synthetic inputs (= segment_loss[S - 1]),
                               * not a loss of the joined network */
    double test_loss;
    double test_acc;
    int tokens_per_sample;    /* a language model's context (its losses are per
                               * token, in nats; records add bits per byte and
                               * tokens/s); 0: not one */
    double samples_per_s;     /* this epoch's training samples / training time;
                               * synth segment epochs: samples through every
                               * segment (each counted once) / the epoch's
                               * wall time up to the slowest group's end */
    double wall_s;            /* since training started, evaluations included */
    double lr;
    int workers;              /* of every rank: ranks x workers_per_rank */
    int ranks;                /* MPI ranks of the run (1: one process) */
    int workers_per_rank;
    int threads_per_worker;   /* a worker's team of threads (1: one core) */
    st_precision precision;   /* of the linear layers' products */
    st_precision comm_precision; /* of the gradients the reduction reads */
    st_mem_stats memory;      /* the arena of the worker with the largest peak */
    /* Communication per worker and step: what the reduction engine reads
     * and writes for the busiest worker, and what a ring all-reduce among
     * N distributed workers would send, 2 (N-1)/N x P x 4 bytes. */
    double comm_bytes_per_worker_step;
    double ring_bytes_per_worker_step;
    /* ist, localsgd: the same per round (one synchronisation every R steps;
     * comm_bytes_per_worker_step is this / local_steps); 0 otherwise */
    double comm_bytes_per_worker_round;
    /* The optimizer's state layout, and what the update of the worker that
     * updates most reads and writes in a step: bytes, and bytes per
     * parameter updated (st_optim_bytes_per_param, the bf16 weight copies
     * it writes included); 0 before any update. */
    st_moments optimizer_moments;
    st_master optimizer_master;       /* the master weights' storage (st_master) */
    double optimizer_bytes_per_worker_step;
    double optimizer_bytes_per_param;
    /* Mean time of a step, over workers and the epoch's steps (ms):
     * forward and backward; waiting for the slowest worker; reduce-scatter
     * and all-gather; the optimizer on the worker's shard.  Overlapped: the
     * reduction done during the backward pass (dp), in none of the four:
     * the step is their sum and it. */
    double step_ms_compute, step_ms_wait, step_ms_reduce, step_ms_optimizer;
    double step_ms_overlapped;
    /* Every worker's arena of this rank (n = workers_per_rank; with ranks,
     * rank 0 reports its own), valid during the callback only. */
    const st_mem_stats *worker_memory;
    /* sdp with align_every: cosine similarity between a worker's subnetwork
     * gradient and the full model's gradient on the same batch, over the
     * worker's coordinates; mean and minimum over workers and the epoch's
     * measurements (measured = 0: none taken). */
    int align_measured;
    double align_mean, align_min;
    /* synth (n_segments > 0): the segments, their cuts (layer numbers) and
     * workers, each segment's mean training loss over the epoch (MSE to
     * its synthetic label, cross-entropy for the last); test_* are the
     * joined network's.  recovery = 1: an end-to-end epoch of the joined
     * network (segment_loss then unset). */
    int n_segments;
    int recovery;
    int cuts[ST_SYNTH_MAX_SEGMENTS - 1];
    int segment_workers[ST_SYNTH_MAX_SEGMENTS];
    double segment_loss[ST_SYNTH_MAX_SEGMENTS];
    /* sdp (coverage_holders > 0): each unit is held by k = coverage_holders
     * = max(1, round(C x workers)) workers, so the coverage that runs is
     * k / workers, which differs from the requested C (`coverage`) when
     * C x workers is not a whole number. */
    int coverage_holders;
    double coverage;
    /* Where this rank's workers run (their PUs and NUMA nodes: the plan
     * they are bound by), valid during the callback only. */
    const st_plan *placement;
} st_epoch_record;

typedef struct st_train_callbacks {
    void (*on_step)(const st_step_info *info, void *user);
    void (*on_epoch)(const st_epoch_record *rec, void *user);
    /* Something the user should know that does not stop the run: workers
     * oversubscribed, the OS refused strict NUMA binding.  May be NULL. */
    void (*on_warning)(const char *message, void *user);
    void *user;
    /* Once, at the end of the run (worker 0): the trained model's
     * parameters in the full layout (st_model_config_segments names them),
     * valid during the call — to save or inspect them.  May be NULL. */
    void (*on_params)(const float *params, size_t count, void *user);
    /* A graceful stop (a signal handler sets *stop non-zero): every worker
     * finishes the step it is in, the run evaluates and writes its final
     * record with `interrupted` set, and returns ST_OK.  The workers agree
     * on the step at a barrier per step (only when stop is given: a few
     * microseconds, nothing numeric changes).  ist and localsgd stop at
     * the end of the round; synth does not stop early.  With checkpoint.dir set, the
     * state at the stop is written first (a step checkpoint).  NULL: no
     * graceful stop. */
    const volatile sig_atomic_t *stop;
    /* Set non-zero (a signal handler: SIGUSR1): a step checkpoint at the
     * next step the state is whole, then the run goes on; worker 0 resets
     * it when it takes the request.  NULL: none. */
    volatile sig_atomic_t *checkpoint_now;
    /* After each checkpoint file is complete (worker 0).  May be NULL. */
    void (*on_checkpoint)(const char *path, uint64_t step, void *user);
} st_train_callbacks;

/* Trains with cfg->workers worker threads, each pinned to its core (the
 * placement of st_plan_make on this machine) with its memory on its NUMA
 * node; with more than one worker, gradients meet in the reduction engine
 * (comm.h).  Callbacks are called by worker 0.  A loss that becomes NaN or
 * infinite ends the run with a final record (`diverged`) and
 * ST_ERR_NUMERIC. */
st_status st_train_run(const st_train_config *cfg, const st_dataset *train,
                       const st_dataset *test, const st_train_callbacks *cb,
                       st_epoch_record *final_out);

/* A worker of a run as st_train_size lays it out. */
typedef struct st_worker_size {
    st_mem_stats memory;      /* its arena (and share of its domain's weight
                               * copy) as the run's final record counts it:
                               * the peaks over every subnetwork the run
                               * draws (sdp --resample, ist); a strategy of
                               * phases (synth), those of the phase the
                               * record reports */
    /* Its first step (the first subnetworks drawn, the first phase): */
    st_comm_bytes comm;       /* its engine's bytes a step, from the plan
                               * (the records' comm_bytes_per_worker_step) */
    double flops;             /* its model's forward and backward of one batch
                               * (0, and no costs: no model, synth's segments) */
    st_step_cost costs[ST_STEP_COSTS_MAX];   /* that step's work (st_model_step_costs) */
    int n_costs;              /* how many; more than ST_STEP_COSTS_MAX: not all kept */
} st_worker_size;

/* Each worker of the run of cfg as it is built: the run's own code lays
 * out every worker (strategy, model, optimizer state, engines, shared
 * weights), every later subnetwork the run draws as it trains cfg's
 * epochs or steps (sdp --resample, ist's rounds), and each phase of a run
 * of phases (synth: its segments, then the joined network), over chunks
 * of address space that nobody touches, binds nothing and takes no
 * step.  cfg->topology may describe another machine.  *out: *n_workers
 * entries (free() them). */
st_status st_train_size(const st_train_config *cfg, const st_dataset *train,
                        const st_dataset *test, st_worker_size **out, int *n_workers);
/* The same for an MPI job of `ranks` ranks (as mpirun -np RANKS), each on
 * a machine like cfg->topology with the workers cfg places there, laid
 * out in this process without MPI: each rank's engines plan the exchange
 * between the ranks as a real rank's do.  *out: every rank's workers,
 * rank by rank (ranks x workers entries).  ranks > 1 needs the library's
 * MPI backend; 1 is st_train_size. */
st_status st_train_size_ranks(const st_train_config *cfg, int ranks, const st_dataset *train,
                              const st_dataset *test, st_worker_size **out, int *n_workers);

/* One JSON object on one line (JSON Lines) for a record. */
int st_metrics_write(FILE *f, const st_epoch_record *rec);
/* The same object without its opening brace: for a caller that writes
 * members of its own first (the command's "run" provenance, written with
 * the first record of a run; doc/provenance.md). */
int st_metrics_write_members(FILE *f, const st_epoch_record *rec);

#ifdef __cplusplus
}
#endif
#endif /* SUBTRAIN_TRAIN_H */

/*
 * train/synth.c — partitioned training with synthetic intermediate labels
 * (doc/synth.md): the mlp is cut into S consecutive segments, each
 * trained at the same time by its own group of workers against synthetic
 * labels, so that no activation or gradient ever crosses a cut.
 *
 *   segment 1:      x                      -> s_1[y]   mean squared error
 *   segment i:      s_{i-1}[y] + noise     -> s_i[y]   mean squared error
 *   segment S:      s_{S-1}[y] + noise     -> y        cross-entropy
 *
 * s_i[c] is a fixed random vector per class at cut i (synth.h: Gaussian or
 * +-scale, dimension = the width), drawn from the seed by every worker
 * that needs it: nothing is shared.  The noise is Gaussian with standard
 * deviation noise x scale, one stream per (epoch, position in the epoch's
 * order), so a sample gets the same noise whatever the group's size.
 *
 * Groups: the workers are split by st_synth_split_workers (FLOPs of each
 * segment), group g being consecutive workers (those of a NUMA domain are
 * consecutive, so a group spreads over as few domains as it can).  Within
 * a group it is data parallelism through the group's own reduction engine
 * (reduce-scatter, shard update, all-gather), or a local update for a
 * group of one.  Each group takes count / (B x its size) steps an epoch
 * with its own schedule; groups meet only at epoch ends, at two blocking
 * barriers of all workers (epoch_sync): before the first, each group's
 * first worker copies its segment's parameters into its range of worker
 * 0's joined network — the join, one parameter copy a segment and epoch,
 * not part of training; between the two, worker 0 evaluates the joined
 * network on the test set and reports while the others wait.
 *
 * Over MPI ranks (R ranks of n workers): the groups split the R n global
 * workers, so a group may start and end inside a rank.  A group within
 * one rank reduces with the shared engine; a group that spans ranks with
 * an MPI engine over just its ranks (comm/mpi.c, its ranks' own worker
 * counts).  The epoch end adds one exchange per epoch, by each rank's
 * worker 0 after the first barrier (join_over_ranks): every segment's
 * parameters are broadcast from the rank of its group's first worker, so
 * that every rank holds the joined network; the loss sums of the groups
 * reach every rank.  A group that spans ranks keeps its members' step
 * losses in a buffer of the epoch and takes their means there, in the
 * order one process takes them at every step: the records are bitwise
 * those of one process with R n workers.  Every rank evaluates the joined
 * network (the same values); a stop or a checkpoint asked of any rank is
 * agreed at the epoch end.
 *
 * The segment epochs are the strategy's pre_loop phase (strategy.h): the
 * loop's epochs of steps do not fit groups that take different numbers of
 * steps.  Recovery (--recovery-epochs E): then every worker drops its
 * segment, builds the whole mlp on a fresh arena with the joined
 * parameters, and the loop runs E epochs of plain data parallelism (the
 * sharded step of run.c, all N workers, the run's engine), with the orders
 * of epochs epochs + 1 .. epochs + E.  The records are renumbered to
 * follow the segment epochs.
 */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/rng.h>
#include <subtrain/world.h>

#include "core/error.h"
#include "core/rng_streams.h"
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
                                      * filled, the others 0 until join_over_ranks */
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
    uint64_t steps;                  /* taken so far */
} synth_worker;

/* The barrier of the epoch ends: a blocking one (mutex and condition
 * variable), not the engines' spin barrier.  At an epoch end a group that
 * finished early waits for the slowest group for as long as a whole
 * epoch's imbalance between them (the groups' per-worker loads differ by
 * up to a layer's FLOPs x the steps of an epoch): spinning that long would
 * burn the cores the slower groups need when the run is oversubscribed,
 * and distort the very timings being measured.  Twice an epoch, outside
 * the steps, a lock costs nothing that matters. */
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
    double samples_per_epoch;        /* that went through every segment (below) */
    st_mem_stats phase1_worst;       /* the largest worker of the segment epochs */
    const st_train_callbacks *user_cb;
    st_train_callbacks wrap_cb;      /* recovery: renumbers, then calls user_cb */
    int recovering;                  /* the recovery epochs have begun */
    int segment_epochs_done;         /* resumed: segment epochs before the checkpoint */
    int stop_now, save_now;          /* worker 0's decision at a segment epoch's end,
                                      * read by all after its second barrier */
    int epochs_done;                 /* segment epochs ended (worker 0's) */
} synth_run;

/* The strategy's state, as the hooks also get it. */
static inline synth_run *synth_of(const run_shared *r)
{
    return r->strategy;
}

/* ------------------------------------------------------------ the epoch-end barrier */

static void epoch_barrier_init(epoch_barrier *b, int n)
{
    pthread_mutex_init(&b->lock, NULL);
    pthread_cond_init(&b->turn, NULL);
    b->n = n;
    b->arrived = 0;
    b->aborted = 0;
    b->generation = 0;
}

static void epoch_barrier_destroy(epoch_barrier *b)
{
    pthread_cond_destroy(&b->turn);
    pthread_mutex_destroy(&b->lock);
}

static void epoch_barrier_abort(epoch_barrier *b)
{
    pthread_mutex_lock(&b->lock);
    b->aborted = 1;
    pthread_cond_broadcast(&b->turn);
    pthread_mutex_unlock(&b->lock);
}

/* Everything a worker wrote before arriving is visible to every worker
 * after it leaves (the mutex orders them). */
static st_status epoch_sync(synth_run *sy)
{
    epoch_barrier *b = &sy->barrier;
    pthread_mutex_lock(&b->lock);
    unsigned gen = b->generation;
    if (!b->aborted && ++b->arrived == b->n) {
        b->arrived = 0;
        b->generation++;
        pthread_cond_broadcast(&b->turn);
    }
    while (!b->aborted && b->generation == gen)
        pthread_cond_wait(&b->turn, &b->lock);
    int aborted = b->aborted && b->generation == gen;
    pthread_mutex_unlock(&b->lock);
    return aborted ? st_fail(ST_ERR_INVALID, "another worker failed") : ST_OK;
}

/* ------------------------------------------------------------ config */

static st_status synth_check(const st_train_config *c)
{
    if (c->strategy != ST_STRATEGY_SYNTH)
        return ST_OK;
    const st_synth_config *s = &c->synth;
    const st_model_kind kind = c->model.kind;
    if (kind == ST_MODEL_RESNET || kind == ST_MODEL_RESNET18)
        return st_fail(ST_ERR_INVALID, "--model %s does not train with --strategy synth (its "
                       "segments would cut batch-normalised residual blocks; see doc/cnn.md)",
                       st_model_kind_name(kind));
    if (kind == ST_MODEL_GPT)
        return st_fail(ST_ERR_INVALID, "--model gpt does not train with --strategy synth (its "
                       "cuts are between the layers of a plain MLP)");
    if (kind != ST_MODEL_MLP)
        return st_fail(ST_ERR_INVALID, "synth cuts an mlp into segments; --model %s is not "
                       "supported (the default for --strategy synth is mlp --depth 5)",
                       st_model_kind_name(kind));
    int layers = c->model.depth + 1;
    int most = layers < ST_SYNTH_MAX_SEGMENTS ? layers : ST_SYNTH_MAX_SEGMENTS;
    if (s->segments < 2 || s->segments > most)
        return st_fail(ST_ERR_INVALID, "--segments must be in [2, %d] for an mlp of depth %d "
                       "(%d linear layers), got %d", most, c->model.depth, layers, s->segments);
    if (s->cuts[0]) {
        int given = 0;
        while (given < ST_SYNTH_MAX_SEGMENTS - 1 && s->cuts[given])
            given++;
        if (given != s->segments - 1)
            return st_fail(ST_ERR_INVALID, "--cuts: %d cut%s for --segments %d (which needs %d)",
                           given, given == 1 ? "" : "s", s->segments, s->segments - 1);
        for (int i = 0; i < s->segments - 1; i++)
            if (s->cuts[i] < 1 || s->cuts[i] > c->model.depth ||
                (i > 0 && s->cuts[i] <= s->cuts[i - 1]))
                return st_fail(ST_ERR_INVALID, "--cuts must be %d increasing layer numbers in "
                               "[1, %d] (a cut after layer c), got %d as cut %d",
                               s->segments - 1, c->model.depth, s->cuts[i], i + 1);
    }
    if (s->labels != ST_SYNTH_GAUSSIAN && s->labels != ST_SYNTH_SIGN)
        return st_fail(ST_ERR_INVALID, "unknown synthetic labels %d (allowed: gaussian, sign)",
                       (int)s->labels);
    if (!(s->scale > 0.0f && s->scale <= 1000.0f))
        return st_fail(ST_ERR_INVALID, "--synth-scale must be in (0, 1000], got %g", s->scale);
    if (!(s->noise >= 0.0f && s->noise <= 1000.0f))
        return st_fail(ST_ERR_INVALID, "--synth-noise must be in [0, 1000], got %g", s->noise);
    if (s->recovery_epochs < 0 || s->recovery_epochs > 100000)
        return st_fail(ST_ERR_INVALID, "--recovery-epochs must be in [0, 100000], got %d",
                       s->recovery_epochs);
    if (c->steps)
        return st_fail(ST_ERR_INVALID, "--strategy synth trains whole epochs (each group takes "
                       "its own number of steps): use --epochs, not --steps");
    return ST_OK;
}

/* ------------------------------------------------------------ prepare */

/* Group g's steps and learning-rate schedule over the segment epochs:
 * the group's own checks (the data-parallel plan of run.c does not apply). */
static st_status group_plan(const st_train_config *cfg, const st_dataset *train, synth_group *G)
{
    uint64_t global_batch = (uint64_t)cfg->batch * (uint64_t)G->count;
    G->steps_per_epoch = train->count / global_batch;
    if (G->steps_per_epoch == 0)
        return st_fail(ST_ERR_INVALID, "segment %d's global batch of %d workers x %d samples is "
                       "larger than the training set (%u samples)", G->index + 1, G->count,
                       cfg->batch, train->count);
    uint64_t total = (uint64_t)cfg->epochs * G->steps_per_epoch;
    uint64_t warmup = cfg->warmup_steps == ST_WARMUP_AUTO ? total / 20 : cfg->warmup_steps;
    if (cfg->schedule == ST_SCHED_WARMUP_COSINE && warmup >= total)
        return st_fail(ST_ERR_INVALID, "warmup (%llu steps) must be shorter than segment %d's "
                       "run (%llu steps of its %d worker%s)", (unsigned long long)warmup,
                       G->index + 1, (unsigned long long)total, G->count,
                       G->count == 1 ? "" : "s");
    G->schedule = (st_schedule){ .kind = cfg->schedule, .peak_lr = cfg->optim.lr,
                                 .warmup_steps = warmup, .total_steps = total };
    return ST_OK;
}

/* The cuts: --cuts, or the ones that balance the segments' FLOPs. */
static st_status segment_cuts(const st_train_config *cfg, int *cuts)
{
    if (!cfg->synth.cuts[0])
        return st_synth_balanced_cuts(&cfg->model, cfg->synth.segments, cuts);
    memcpy(cuts, cfg->synth.cuts, sizeof cfg->synth.cuts);
    return ST_OK;
}

/* Segment g's layers under `cuts`, first to last (1-based). */
static void segment_span(const st_train_config *cfg, const int *cuts, int g, int *first,
                         int *last)
{
    *first = g == 0 ? 1 : cuts[g - 1] + 1;
    *last = g == cfg->synth.segments - 1 ? cfg->model.depth + 1 : cuts[g];
}

/* How many of `workers` (every rank's) train each segment: at least one
 * each, the rest by FLOPs (st_synth_split_workers). */
static st_status segment_workers(const st_train_config *cfg, int workers, const int *cuts,
                                 int *counts)
{
    double flops[ST_SYNTH_MAX_SEGMENTS];
    for (int g = 0, first, last; g < cfg->synth.segments; g++) {
        segment_span(cfg, cuts, g, &first, &last);
        flops[g] = st_segment_flops(&cfg->model, first, last, cfg->batch);
    }
    return st_synth_split_workers(workers, cfg->synth.segments, flops, counts);
}

/* Every segment needs a worker: the split of the run's workers (as
 * prepare makes it) can be made. */
static st_status synth_layout(const st_train_config *c, int workers)
{
    int cuts[ST_SYNTH_MAX_SEGMENTS - 1], counts[ST_SYNTH_MAX_SEGMENTS];
    ST_TRY(segment_cuts(c, cuts));
    return segment_workers(c, workers, cuts, counts);
}

static st_status make_groups(run_shared *r, synth_run *sy)
{
    const st_train_config *cfg = r->cfg;
    const int S = cfg->synth.segments;
    int counts[ST_SYNTH_MAX_SEGMENTS];
    for (int g = 0; g < S; g++) {
        synth_group *G = &sy->groups[g];
        G->index = g;
        segment_span(cfg, sy->cuts, g, &G->layer_first, &G->layer_last);
        G->flops = st_segment_flops(&cfg->model, G->layer_first, G->layer_last, cfg->batch);
        G->n_params = st_segment_params(&cfg->model, G->layer_first, G->layer_last);
        G->full_offset = st_segment_params(&cfg->model, 1, G->layer_first - 1);
    }
    ST_TRY(segment_workers(cfg, r->n_all, sy->cuts, counts));
    int next = 0;
    for (int g = 0; g < S; g++) {
        synth_group *G = &sy->groups[g];
        G->first = next;
        G->count = counts[g];
        G->rank_first = G->first / r->n;
        G->rank_last = (G->first + G->count - 1) / r->n;
        G->local_first = -1;
        for (int k = 0; k < G->count; k++) {
            int wid = next + k - r->first;   /* local index, if on this rank */
            if (wid < 0 || wid >= r->n)
                continue;
            sy->group_of[wid] = g;
            if (G->local_count++ == 0)
                G->local_first = wid;
        }
        next += G->count;
        ST_TRY(group_plan(cfg, r->train, G));
    }
    return ST_OK;
}

static int spans_ranks(const synth_group *G)
{
    return G->rank_first != G->rank_last;
}

/* A reduction engine per group of more than one worker, over the group's
 * workers only (their NUMA domains, in order) and its segment's vector:
 * the shared backend inside a rank, MPI over the ranks a group spans (only
 * they make it, every one in the order of the groups).  A spanning group's
 * loss buffer is on every rank: the epoch end sums it over all of them. */
static st_status make_engines(run_shared *r, synth_run *sy)
{
    for (int g = 0; g < sy->segments; g++) {
        synth_group *G = &sy->groups[g];
        if (spans_ranks(G)) {
            G->losses = calloc((size_t)G->count * G->steps_per_epoch, sizeof *G->losses);
            if (!G->losses)
                return st_fail(ST_ERR_NOMEM, "out of memory for segment %d's losses", g + 1);
        }
        if (G->count == 1 || G->local_count == 0)
            continue;
        int domain_of[G->local_count];
        for (int k = 0; k < G->local_count; k++)
            domain_of[k] = r->placement.workers[G->local_first + k].domain;
        st_comm_config cc = { .n_workers = G->local_count, .n_params = G->n_params,
                              .domain_of = domain_of,
                              .payload = st_run_comm_payload(r->cfg) };
        if (spans_ranks(G)) {
            cc.backend = ST_COMM_BACKEND_MPI;
            cc.rank_first = G->rank_first;
            cc.n_ranks = G->rank_last - G->rank_first + 1;
        }
        ST_TRY(st_comm_create(&cc, &G->comm));
    }
    return ST_OK;
}

/* Throughput counts samples through the whole network: every segment sees
 * every sample, so a sample counts once, not once per segment (as data
 * parallelism counts it once, not once per layer).  Groups drop different
 * remainders of the training set (count / (B x their size) steps), so an
 * epoch's samples are those that went through every segment: the fewest
 * any group took. */
static double samples_per_epoch(const run_shared *r, const synth_run *sy)
{
    double least = INFINITY;
    for (int g = 0; g < sy->segments; g++) {
        const synth_group *G = &sy->groups[g];
        least = fmin(least, (double)G->steps_per_epoch * r->cfg->batch * G->count);
    }
    return least;
}

/* Before the parallel region: the run's engine (that of the recovery
 * epochs, and the barrier of all workers), cuts, the split of the workers
 * into groups, each group's reduction engine; r->plan becomes the recovery
 * epochs' (none without them). */
static st_status synth_prepare(run_shared *r, void **state)
{
    const st_train_config *cfg = r->cfg;
    /* No data-parallel plan of all N workers over cfg->epochs: it would
     * apply checks (warmup, global batch) that are not those of any phase
     * of the run.  The segment epochs are planned per group, the recovery
     * epochs on their own. */
    if (r->n_all > 1)
        ST_TRY(st_run_create_engine(r, 0, 0, NULL, 0, &r->comm));
    size_t size = (sizeof(synth_run) + 63) / 64 * 64;
    synth_run *sy = aligned_alloc(64, size);
    if (!sy)
        return st_fail(ST_ERR_NOMEM, "out of memory for the segments' state");
    memset(sy, 0, size);
    *state = sy;
    sy->segments = cfg->synth.segments;
    epoch_barrier_init(&sy->barrier, r->n);
    sy->barrier_ready = 1;
    sy->group_of = calloc((size_t)r->n, sizeof *sy->group_of);
    sy->workers = aligned_alloc(64, sizeof(synth_worker) * (size_t)r->n);
    if (!sy->group_of || !sy->workers)
        return st_fail(ST_ERR_NOMEM, "out of memory for the segments' state");
    memset(sy->workers, 0, sizeof(synth_worker) * (size_t)r->n);
    ST_TRY(segment_cuts(cfg, sy->cuts));
    ST_TRY(make_groups(r, sy));
    ST_TRY(make_engines(r, sy));
    sy->steps1 = (uint64_t)cfg->epochs * sy->groups[0].steps_per_epoch;
    if (r->resume) {
        const char *done = st_safetensors_meta(r->resume->file, "subtrain.synth.segment_epochs");
        char *end;
        long v = done ? strtol(done, &end, 10) : -1;
        if (!done || *end || v < 1 || v > cfg->epochs)
            return st_fail(ST_ERR_FORMAT, "%s: no valid subtrain.synth.segment_epochs in its "
                           "metadata", r->resume->name);
        sy->segment_epochs_done = (int)v;
        sy->epochs_done = (int)v;
        if (v < cfg->epochs && (r->resume->at.epoch != 1 || r->resume->at.step != 0))
            return st_fail(ST_ERR_FORMAT, "%s: a recovery position before the segment epochs "
                           "ended", r->resume->name);
    }
    sy->samples_per_epoch = samples_per_epoch(r, sy);
    if (cfg->synth.recovery_epochs > 0) {
        st_train_config rc = *cfg;
        rc.epochs = cfg->synth.recovery_epochs;
        rc.steps = 0;
        ST_TRY(st_run_make_plan(&rc, r->n_all, r->train, &r->plan));
        /* Recovery epoch e draws the order of epoch epochs + e, not that of
         * segment epoch e again. */
        r->order_offset = (uint64_t)cfg->epochs;
    }
    return ST_OK;
}

/* A worker failed: release everyone waiting in a group's engine. */
static void synth_abort(run_shared *r, void *state)
{
    (void)r;
    synth_run *sy = state;
    for (int g = 0; g < sy->segments; g++)
        if (sy->groups[g].comm)
            st_comm_abort(sy->groups[g].comm);
    if (sy->barrier_ready)
        epoch_barrier_abort(&sy->barrier);
}

static void synth_release(run_shared *r, void *state)
{
    synth_run *sy = state;
    if (!sy)
        return;
    for (int k = 0; sy->workers && k < r->n; k++)
        st_segnet_destroy(sy->workers[k].net); /* left by a failed run */
    st_model_destroy(sy->joined);
    st_arena_release(&sy->eval_arena);
    for (int g = 0; g < sy->segments; g++) {
        st_comm_destroy(sy->groups[g].comm);
        free(sy->groups[g].losses);
    }
    if (sy->barrier_ready)
        epoch_barrier_destroy(&sy->barrier);
    free(sy->group_of);
    free(sy->workers);
    free(sy);
}

/* ------------------------------------------------------------ a worker */

static st_status alloc_labels(st_worker *w, const st_train_config *cfg, int cut,
                              const float **out)
{
    const int K = cfg->model.n_classes, W = cfg->model.width;
    float *p;
    ST_TRY(st_arena_alloc_floats(&w->arena, ST_MEM_WORKSPACE, (size_t)K * (size_t)W, &p));
    st_synth_make_labels(cfg->synth.labels, cfg->synth.scale, cfg->seed, cut, K, W, p);
    *out = p;
    return ST_OK;
}

/* Worker wid's segment (that of its group), attached to its group's
 * engine; worker 0 (every rank's) also builds the joined network for
 * evaluation. */
static st_status synth_init_worker(run_shared *r, void *state, int wid, st_worker *w,
                                   const st_chunk_backend *backend)
{
    const st_train_config *cfg = r->cfg;
    synth_run *sy = state;
    const int g = sy->group_of[wid];
    synth_group *G = &sy->groups[g];
    synth_worker *me = &sy->workers[wid];
    ST_TRY(st_worker_init_base(w, wid, r->train->count, backend));
    st_segment_config sc = { .model = cfg->model, .first = G->layer_first,
                             .last = G->layer_last };
    ST_TRY(st_segnet_create(&sc, cfg->batch, &w->arena, &me->net));
    st_segnet_init_params(me->net, cfg->seed);
    if (g > 0)
        ST_TRY(alloc_labels(w, cfg, g, &me->labels_in));
    if (g < sy->segments - 1)
        ST_TRY(alloc_labels(w, cfg, g + 1, &me->labels_out));
    void *y;
    ST_TRY(st_arena_alloc(&w->arena, ST_MEM_ACTIVATIONS, (size_t)cfg->batch * sizeof(int32_t), &y));
    me->y = y;
    st_rng root = st_rng_seed(cfg->seed);
    st_rng noise = st_rng_split(&root, ST_RNG_STREAM_SYNTH_NOISE);
    me->noise = st_rng_split(&noise, (uint64_t)g);
    me->steps = 0;

    /* The group's engine and the join were sized from the shapes alone
     * (st_segment_params): the segment built must agree. */
    size_t P = st_segnet_param_count(me->net);
    if (P != G->n_params)
        return st_fail(ST_ERR_INVALID, "segment %d (layers %d-%d) holds %zu parameters, its "
                       "group planned for %zu", g + 1, G->layer_first, G->layer_last, P,
                       G->n_params);
    if (G->comm) {
        st_range all = { 0, P };
        int k = wid - G->local_first;
        ST_TRY(st_comm_attach(G->comm, k, &w->arena, st_segnet_grads(me->net),
                              st_segnet_params(me->net), &all, 1));
        st_range shard = st_comm_shard(G->comm, k);
        ST_TRY(st_worker_init_optimizer(w, cfg, shard.begin, shard.end));
    } else {
        ST_TRY(st_worker_init_optimizer(w, cfg, 0, P));
    }
    if (wid == 0) { /* the joined network, for evaluation: not part of any worker's arena */
        st_arena_init(&sy->eval_arena, "evaluation", backend, 0);
        ST_TRY(st_model_create(&cfg->model, cfg->batch, &sy->eval_arena, &sy->joined));
    }
    return ST_OK;
}

/* Two independent N(0, 1) values from one 64-bit draw (Box-Muller in
 * float, 24-bit uniforms: tails cut at 5.8 sigma).  The noise is B x W
 * values a step: computed in double as st_rng_normal does, it cost as
 * much as a middle segment's GEMMs. */
static inline void normal_pair(st_rng *r, float *a, float *b)
{
    uint64_t u = st_rng_u64(r);
    float u1 = ((float)(u >> 40) + 1.0f) * (1.0f / 16777216.0f);       /* (0, 1] */
    float u2 = (float)((u >> 8) & 0xFFFFFFu) * (1.0f / 16777216.0f);   /* [0, 1) */
    float rad = sqrtf(-2.0f * logf(u1)), th = 6.28318530718f * u2;
    *a = rad * cosf(th);
    *b = rad * sinf(th);
}

/* Samples order[first .. first + B) as segment G sees them: the images
 * (segment 1) or the synthetic label of the previous cut plus noise; the
 * synthetic label of the next cut (MSE) or the class (last segment).
 * x is (B, in), s_in and s_out are (K, W), the target is (B, W). */
static void load_batch(const run_shared *r, synth_worker *me, const synth_group *G, int epoch,
                       const uint32_t *order, uint32_t first)
{
    const st_dataset *d = r->train;
    const int B = r->cfg->batch, W = r->cfg->model.width, S = synth_of(r)->segments;
    const int g = G->index;
    const uint32_t *idx = order + first;
    float *x = st_segnet_input(me->net);
    int32_t *y = g == S - 1 ? st_segnet_labels(me->net) : me->y;
    if (g == 0) {
        st_dataset_gather_train(d, (uint64_t)epoch - 1, idx, (size_t)B, x, y);
    } else {
        const float sigma = r->cfg->synth.noise * r->cfg->synth.scale;
        for (int b = 0; b < B; b++) {
            y[b] = d->y[idx[b]];
            const float *s = me->labels_in + (size_t)y[b] * (size_t)W;
            float *row = x + (size_t)b * (size_t)W;
            if (sigma == 0.0f) {
                memcpy(row, s, (size_t)W * sizeof *row);
                continue;
            }
            st_rng n = st_rng_split(&me->noise, (uint64_t)(epoch - 1) * d->count + first + b);
            for (int j = 0; j < W; j += 2) {
                float z0, z1;
                normal_pair(&n, &z0, &z1);
                row[j] = s[j] + sigma * z0;
                if (j + 1 < W)
                    row[j + 1] = s[j + 1] + sigma * z1;
            }
        }
    }
    if (g < S - 1) {
        float *t = st_segnet_target(me->net);
        for (int b = 0; b < B; b++)
            memcpy(t + (size_t)b * (size_t)W, me->labels_out + (size_t)y[b] * (size_t)W,
                   (size_t)W * sizeof *t);
    }
}

/* A group of one updates locally: no barrier of its own would notice a
 * failure elsewhere, so it looks at the run's flag every step (one relaxed
 * load of a line nobody writes until something fails). */
static st_status local_update(run_shared *r, st_worker *w, synth_group *G, uint64_t step,
                              float *loss, float *lr)
{
    synth_worker *me = &synth_of(r)->workers[w->id];
    worker_slot *slot = &r->slots[w->id];
    if (atomic_load_explicit(&r->failed, memory_order_relaxed))
        return st_fail(ST_ERR_INVALID, "another worker failed");
    double t = st_run_now_s();
    int n_segs;
    const st_param_segment *segs = st_segnet_segments(me->net, &n_segs);
    *loss = slot->loss;
    *lr = st_schedule_lr(&G->schedule, step);
    st_optim_update(&w->optim, st_segnet_params(me->net), st_segnet_grads(me->net), segs,
                    n_segs, 0, st_segnet_param_count(me->net), step, *lr);
    slot->times.optimizer += st_run_now_s() - t;
    return ST_OK;
}

/* One step of worker w, member k of its group G (kl on this rank): its
 * batch of the group's global batch i, forward, backward, then the
 * group's data parallelism (or a local update).  *loss: the group's mean,
 * for k = 0 of a group within one rank; a group spanning ranks keeps each
 * member's loss for the epoch end instead (join_over_ranks). */
static st_status segment_step(run_shared *r, st_worker *w, synth_group *G, int epoch,
                              uint64_t i, float *loss, float *lr)
{
    synth_worker *me = &synth_of(r)->workers[w->id];
    worker_slot *slot = &r->slots[w->id];
    const int k = st_run_global(r, w->id) - G->first, kl = w->id - G->local_first,
              m = G->count;
    double t = st_run_now_s(), t1;
    uint32_t first = (uint32_t)((i * (uint64_t)m + (uint64_t)k) * (uint64_t)r->cfg->batch);
    load_batch(r, me, G, epoch, w->order, first);
    ST_TRY(st_segnet_forward_backward(me->net, &slot->loss));
    t1 = st_run_now_s();
    slot->times.compute += t1 - t;
    t = t1;
    uint64_t step = ++me->steps;
    if (!G->comm)
        return local_update(r, w, G, step, loss, lr);
    if (G->losses)
        G->losses[(size_t)k * G->steps_per_epoch + i] = slot->loss;
    ST_TRY(st_comm_barrier(G->comm, kl));
    t1 = st_run_now_s();
    slot->times.wait += t1 - t;
    t = t1;
    if (k == 0 && !G->losses) { /* stable until the all-gather, which needs every worker */
        double sum = 0.0;
        for (int v = 0; v < m; v++)
            sum += r->slots[G->local_first + v].loss;
        *loss = (float)(sum / m);
    }
    ST_TRY(st_comm_reduce_scatter(G->comm, kl));
    t1 = st_run_now_s();
    slot->times.reduce += t1 - t;
    t = t1;
    int n_segs;
    const st_param_segment *segs = st_segnet_segments(me->net, &n_segs);
    st_range shard = st_comm_shard(G->comm, kl);
    *lr = st_schedule_lr(&G->schedule, step);
    st_optim_update(&w->optim, st_comm_shard_params(G->comm, kl),
                    st_comm_shard_grads(G->comm, kl), segs, n_segs, shard.begin, shard.end, step,
                    *lr);
    t1 = st_run_now_s();
    slot->times.optimizer += t1 - t;
    t = t1;
    ST_TRY(st_comm_all_gather(G->comm, kl));
    slot->times.reduce += st_run_now_s() - t;
    return ST_OK;
}

/* ------------------------------------------------------------ records */

static void describe_segments(const synth_run *sy, st_epoch_record *rec)
{
    rec->n_segments = sy->segments;
    for (int g = 0; g < sy->segments; g++) {
        rec->segment_workers[g] = sy->groups[g].count;
        if (g + 1 < sy->segments)
            rec->cuts[g] = sy->cuts[g];
    }
}

/* How far the segment epochs are, in [0, 1]: the slowest group's share of
 * its steps (the groups meet at every epoch end, so the phase ends when
 * the slowest group does).  Over ranks, of the groups this rank sees. */
static double segment_progress(const synth_run *sy, int epochs)
{
    double least = 1.0;
    for (int g = 0; g < sy->segments; g++) {
        const synth_group *G = &sy->groups[g];
        if (G->local_count == 0)
            continue;
        uint64_t done = atomic_load_explicit(&G->done, memory_order_relaxed);
        least = fmin(least, (double)done / ((double)epochs * (double)G->steps_per_epoch));
    }
    return least;
}

/* Worker 0 after each of its steps.  Steps are numbered by group 0's
 * (worker 0's) steps; throughput and the time left by the slowest group's
 * progress f: samples through the whole network so far are f x the
 * segment epochs' samples, and the segment epochs end after
 * train_time x (1 - f) / f more.  The recovery epochs, not yet measured,
 * are estimated at the mean segment epoch's time each: every segment sees
 * every sample, so an epoch of the segments does about the FLOPs of a
 * data-parallel epoch (a little less).  Once they start, the loop reports
 * on its own measurements. */
static void report_step(run_shared *r, int epoch, uint64_t step, float loss, float lr,
                        double train_time)
{
    const st_train_config *cfg = r->cfg;
    const int recovery = cfg->synth.recovery_epochs;
    st_run_note_step(r, epoch, cfg->epochs + recovery, step, lr);
    const st_train_callbacks *cb = r->cb;
    if (!cb || !cb->on_step)
        return;
    const synth_run *sy = synth_of(r);
    double f = segment_progress(sy, cfg->epochs);
    double phase = f > 0.0 ? train_time / f : 0.0;   /* the segment epochs' estimated time */
    st_step_info info = {
        .step = step,
        .total_steps = sy->steps1 + (recovery ? r->plan.total_steps : 0),
        .epoch = epoch,
        .epochs = cfg->epochs + recovery,
        .loss = loss,
        .lr = lr,
        .samples_per_s = f * cfg->epochs * sy->samples_per_epoch / train_time,
        .elapsed_s = st_run_now_s() - r->t0,
        .eta_s = phase * (1.0 - f) + phase / cfg->epochs * recovery,
    };
    cb->on_step(&info, cb->user);
}

/* Worker 0, between the two barriers of an epoch end.  The step times are
 * each worker's mean over its own group's steps (the groups take different
 * numbers), then the mean over workers; the wait at the epoch end is not a
 * step's and is in the epoch's wall time (samples_per_s) instead. */
static void fill_record(run_shared *r, st_epoch_record *rec)
{
    const synth_run *sy = synth_of(r);
    step_times sum = { 0, 0, 0, 0 };
    size_t worst = 0;
    double bytes = 0.0;
    for (int k = 0; k < r->n; k++) {
        const worker_slot *s = &r->slots[k];
        double steps = (double)sy->groups[sy->group_of[k]].steps_per_epoch;
        sum.compute += s->times.compute / steps;
        sum.wait += s->times.wait / steps;
        sum.reduce += s->times.reduce / steps;
        sum.optimizer += s->times.optimizer / steps;
        if (s->memory.peak_total > r->slots[worst].memory.peak_total)
            worst = (size_t)k;
        double b = (double)(s->bytes.read + s->bytes.written);
        if (b > bytes)
            bytes = b;
        r->memory[k] = s->memory;
    }
    rec->step_ms_compute = sum.compute * 1e3 / r->n;
    rec->step_ms_wait = sum.wait * 1e3 / r->n;
    rec->step_ms_reduce = sum.reduce * 1e3 / r->n;
    rec->step_ms_optimizer = sum.optimizer * 1e3 / r->n;
    rec->memory = r->slots[worst].memory;
    rec->worker_memory = r->memory;
    rec->placement = &r->placement;
    rec->workers = r->n_all;
    rec->ranks = r->ranks;
    rec->workers_per_rank = r->n;
    rec->threads_per_worker = r->placement.threads_per_worker;
    rec->precision = r->cfg->model.precision;
    rec->comm_precision = r->cfg->comm_precision;
    rec->comm_bytes_per_worker_step = bytes;
    rec->ring_bytes_per_worker_step =
        st_comm_ring_bytes(r->n_all, r->n_params);
    describe_segments(sy, rec);
    for (int g = 0; g < sy->segments; g++)
        rec->segment_loss[g] = sy->groups[g].loss_sum / (double)sy->groups[g].steps_per_epoch;
    /* No training loss of the joined network exists in the segment epochs:
     * train_loss is the last segment's cross-entropy on synthetic inputs
     * (documented in train.h; the CLI labels it so). */
    rec->train_loss = rec->segment_loss[sy->segments - 1];
}

/* ------------------------------------------------------------ the segment epochs */

/* Worker 0 at a segment epoch's end, the others waiting at its second
 * barrier with their optimizers published: a stop asked for (the groups
 * meet nowhere else, so a stop waits for the epoch's end), a checkpoint
 * asked for or due (--checkpoint-every counts group 0's steps), written
 * here.  The decisions are read by every worker after the barrier. */
static st_status segment_requests(run_shared *r, synth_run *sy, int epoch, double train_time)
{
    const st_train_config *cfg = r->cfg;
    const st_train_callbacks *cb = r->cb;
    /* group 0's steps (worker 0's, in one process) */
    const uint64_t every = cfg->checkpoint.every, per_epoch = sy->groups[0].steps_per_epoch,
                   steps = (uint64_t)epoch * per_epoch;
    const int last = epoch == cfg->epochs && cfg->synth.recovery_epochs == 0;
    /* over ranks, what any rank was asked (as the loop's requests) */
    int asked[2] = { cb && cb->stop && *cb->stop, cb && cb->checkpoint_now && *cb->checkpoint_now };
    if (asked[1])
        *cb->checkpoint_now = 0;
    if (r->ranks > 1)
        ST_TRY(st_world_max_ints(asked, 2));
    sy->stop_now = asked[0] && !last;
    r->stopped = sy->stop_now;
    if (asked[1])
        sy->save_now = 1;
    const int due = cfg->checkpoint.every_epoch ||
                    (every && steps / every > (steps - per_epoch) / every);
    if (!cfg->checkpoint.dir || last || !(sy->stop_now || sy->save_now || due))
        return ST_OK;
    /* the loop's position is its start: the recovery epochs' */
    const run_position at = { 1, 0, 0, 0.0, 0, train_time };
    r->ckpt_step_offset = steps;
    ST_TRY(st_run_checkpoint_write(r, NULL, &at));
    sy->save_now = 0;
    return ST_OK;
}

/* Worker 0 of every rank, after the first barrier of an epoch end: the
 * groups' parameters and losses from the ranks that have them (one
 * broadcast a segment from the rank of its group's first worker; the
 * spanning groups' step losses summed over ranks, where each member's row
 * is nonzero on one rank only, so the sum is exact whatever its order),
 * and the spanning groups' mean step losses, in one process's order. */
static st_status join_over_ranks(run_shared *r, synth_run *sy)
{
    double sums[ST_SYNTH_MAX_SEGMENTS];
    for (int g = 0; g < sy->segments; g++) {
        synth_group *G = &sy->groups[g];
        ST_TRY(st_world_bcast(st_model_params(sy->joined) + G->full_offset,
                              G->n_params * sizeof(float), G->rank_first));
        sums[g] = r->rank == G->rank_first ? G->loss_sum : 0.0;
        if (!G->losses)
            continue;
        const uint64_t steps = G->steps_per_epoch;
        ST_TRY(st_world_sum_doubles(G->losses, (size_t)G->count * steps));
        double total = 0.0;
        for (uint64_t i = 0; i < steps; i++) {
            double sum = 0.0;
            for (int v = 0; v < G->count; v++)
                sum += G->losses[(size_t)v * steps + i];
            total += (float)(sum / G->count);
        }
        memset(G->losses, 0, sizeof *G->losses * (size_t)G->count * steps);
        sums[g] = r->rank == G->rank_first ? total : 0.0;
    }
    ST_TRY(st_world_sum_doubles(sums, (size_t)sy->segments));
    for (int g = 0; g < sy->segments; g++)
        sy->groups[g].loss_sum = sums[g];
    return ST_OK;
}

/* The end of a segment epoch for worker w: its slot, the join (each group
 * writes its own range of the joined vector; after its all-gather every
 * replica holds the same values), the barrier, then worker 0 evaluates the
 * joined network and reports while the others wait at the second barrier
 * (over ranks, worker 0 of every rank, after join_over_ranks).
 * *train_time (worker 0's) grows by the epoch's wall time up to the end of
 * the first barrier: it includes waiting for the slowest group. */
static st_status epoch_end(run_shared *r, st_worker *w, int epoch, double te, float lr,
                           double *train_time, st_epoch_record *rec)
{
    const st_train_config *cfg = r->cfg;
    synth_run *sy = synth_of(r);
    const int wid = w->id;
    synth_group *G = &sy->groups[sy->group_of[wid]];
    synth_worker *me = &sy->workers[wid];
    worker_slot *slot = &r->slots[wid];
    slot->memory = w->arena.stats;
    memset(&slot->bytes, 0, sizeof slot->bytes);
    if (G->comm)
        slot->bytes = st_comm_bytes_per_step(G->comm, wid - G->first);
    if (st_run_global(r, wid) == G->first)
        memcpy(st_model_params(sy->joined) + G->full_offset, st_segnet_params(me->net),
               G->n_params * sizeof(float));
    slot->model = NULL;   /* a checkpoint's: a segment has no running statistics */
    slot->optim = &w->optim;
    ST_TRY(epoch_sync(sy));
    double epoch_time = st_run_now_s() - te;
    *train_time += epoch_time;
    if (wid == 0) {
        if (r->ranks > 1)
            ST_TRY(join_over_ranks(r, sy));
        sy->epochs_done = epoch;
        ST_TRY(st_run_evaluate_model(sy->joined, r->test, &rec->test_loss, &rec->test_acc));
        rec->epoch = epoch;
        rec->epochs = cfg->epochs + cfg->synth.recovery_epochs;
        rec->step = (uint64_t)epoch * sy->groups[0].steps_per_epoch;   /* group 0's */
        rec->samples_per_s = sy->samples_per_epoch / epoch_time;
        rec->lr = lr;
        rec->wall_s = st_run_now_s() - r->t0;
        fill_record(r, rec);
        if (r->cb && r->cb->on_epoch)
            r->cb->on_epoch(rec, r->cb->user);
        ST_TRY(segment_requests(r, sy, epoch, *train_time));
    }
    return epoch_sync(sy); /* the slots and group sums are read until here */
}

static st_status segment_epochs(run_shared *r, st_worker *w)
{
    const st_train_config *cfg = r->cfg;
    synth_run *sy = synth_of(r);
    const int wid = w->id;
    synth_group *G = &sy->groups[sy->group_of[wid]];
    synth_worker *me = &sy->workers[wid];
    const int leader = st_run_global(r, wid) == G->first;
    st_epoch_record rec;
    memset(&rec, 0, sizeof rec);
    double train_time = r->resume ? r->resume->at.train_time : 0.0;
    float lr = 0.0f;
    int stopped = 0;

    for (int epoch = sy->segment_epochs_done + 1; epoch <= cfg->epochs && !stopped; epoch++) {
        /* Every group draws the same order from the seed: no sharing. */
        st_epoch_order(cfg->seed, (uint64_t)epoch - 1, w->order, r->train->count);
        memset(&r->slots[wid].times, 0, sizeof r->slots[wid].times);
        if (leader)
            G->loss_sum = 0.0;
        double te = st_run_now_s();
        for (uint64_t i = 0; i < G->steps_per_epoch; i++) {
            float loss = 0.0f;
            ST_TRY(segment_step(r, w, G, epoch, i, &loss, &lr));
            if (leader && !G->losses)
                G->loss_sum += loss;
            if (wid == G->local_first)
                atomic_store_explicit(&G->done, me->steps, memory_order_relaxed);
            if (wid == 0)   /* a group spanning ranks: its mean is known at the epoch end */
                report_step(r, epoch, me->steps, G->losses ? r->slots[0].loss : loss, lr,
                            train_time + (st_run_now_s() - te));
        }
        ST_TRY(epoch_end(r, w, epoch, te, lr, &train_time, &rec));
        stopped = sy->stop_now;
    }
    if (wid == 0) {
        sy->phase1_worst = rec.memory;
        r->final = rec;
        if (cfg->synth.recovery_epochs == 0 || stopped) {
            rec.final = 1;
            rec.interrupted = stopped;
            rec.samples_per_s = (double)rec.epoch * sy->samples_per_epoch / train_time;
            if (r->cb && r->cb->on_epoch)
                r->cb->on_epoch(&rec, r->cb->user);
            r->final = rec;
        }
    }
    return ST_OK;
}

/* ------------------------------------------------------------ recovery */

/* A recovery record follows the segment epochs: epochs and steps
 * renumbered, the segments described; the final record's memory is the
 * larger of the two phases' (the run's peak). */
static void renumber(const run_shared *r, st_epoch_record *rec)
{
    const synth_run *sy = synth_of(r);
    rec->epoch += r->cfg->epochs;
    rec->epochs += r->cfg->epochs;
    rec->step += sy->steps1;
    rec->recovery = 1;
    describe_segments(sy, rec);
    if (rec->final && sy->phase1_worst.peak_total > rec->memory.peak_total)
        rec->memory = sy->phase1_worst;
}

static void wrap_on_step(const st_step_info *info, void *user)
{
    const run_shared *r = user;
    const st_train_callbacks *cb = synth_of(r)->user_cb;
    st_step_info i = *info;
    i.step += synth_of(r)->steps1;
    i.total_steps += synth_of(r)->steps1;
    i.epoch += r->cfg->epochs;
    i.epochs += r->cfg->epochs;
    cb->on_step(&i, cb->user);
}

static void wrap_on_checkpoint(const char *path, uint64_t step, void *user)
{
    const run_shared *r = user;
    const st_train_callbacks *cb = synth_of(r)->user_cb;
    cb->on_checkpoint(path, step, cb->user);
}

static void wrap_on_params(const float *params, size_t count, void *user)
{
    const run_shared *r = user;
    const st_train_callbacks *cb = synth_of(r)->user_cb;
    cb->on_params(params, count, cb->user);
}

static void wrap_on_epoch(const st_epoch_record *rec, void *user)
{
    const run_shared *r = user;
    const st_train_callbacks *cb = synth_of(r)->user_cb;
    st_epoch_record c = *rec;
    renumber(r, &c);
    cb->on_epoch(&c, cb->user);
}

/* Worker w drops its segment and holds the whole joined mlp, on a fresh
 * arena (so that the recovery records count what data parallelism holds),
 * attached to the run's engine; the loop's epochs follow. */
static st_status recovery_start(run_shared *r, st_worker *w, const st_chunk_backend *backend)
{
    const int wid = w->id;
    synth_run *sy = synth_of(r);
    st_worker_destroy(w);
    ST_TRY(st_worker_init(w, wid, r->cfg, r->train->count, backend));
    memcpy(st_model_params(w->model), st_model_params(sy->joined),
           st_model_param_count(w->model) * sizeof(float));
    ST_TRY(st_run_attach_worker(r->comm, NULL, wid, w, NULL)); /* R n >= S >= 2: an engine */
    st_range shard = st_comm_shard(r->comm, wid);
    ST_TRY(st_worker_init_optimizer(w, r->cfg, shard.begin, shard.end));
    if (r->resume && r->resume->at.step > 0) {   /* resumed in the recovery epochs */
        ST_TRY(st_run_resume_model(r, w));
        st_run_resume_shard(r, r->comm, wid, st_comm_shard_params(r->comm, wid));
    }
    if (wid == 0) {
        sy->recovering = 1;
        st_run_note_step(r, 0, r->plan.epochs, 0, 0.0f);   /* counted as the loop counts */
        r->ckpt_step_offset = sy->steps1;
        sy->user_cb = r->cb;
        if (r->cb) {
            /* warnings were given before the segment epochs */
            sy->wrap_cb = (st_train_callbacks){
                .on_step = r->cb->on_step ? wrap_on_step : NULL,
                .on_epoch = r->cb->on_epoch ? wrap_on_epoch : NULL,
                .on_warning = NULL,
                .user = r,
                .stop = r->cb->stop,
                .checkpoint_now = r->cb->checkpoint_now,
                .on_checkpoint = r->cb->on_checkpoint ? wrap_on_checkpoint : NULL,
                .on_params = r->cb->on_params ? wrap_on_params : NULL,
            };
            r->cb = &sy->wrap_cb;
        }
    }
    return st_run_sync(r, wid);
}

/* The segment epochs (w's segment within its group, the joined network's
 * evaluation after each), then, with recovery epochs, the switch to data
 * parallelism of the joined network on a fresh arena from `backend`. */
static st_status synth_pre_loop(run_shared *r, void *state, st_worker *w,
                                const st_chunk_backend *backend)
{
    synth_run *sy = state;
    synth_worker *me = &sy->workers[w->id];
    st_status s = sy->segment_epochs_done < r->cfg->epochs ? segment_epochs(r, w) : ST_OK;
    st_segnet_destroy(me->net); /* before its arena goes */
    me->net = NULL;
    if (s != ST_OK || r->cfg->synth.recovery_epochs == 0 || r->stopped)
        return s;
    return recovery_start(r, w, backend);
}

/* The recovery epochs: data parallelism of the joined network. */
static st_status synth_step(run_shared *r, void *state, st_worker *w, uint64_t i, uint64_t step,
                            float *loss, float *lr)
{
    (void)state;
    run_sharded e = { r->comm, r->comm, NULL, NULL };
    return st_run_sharded_step(r, &e, w, i, step, loss, lr);
}

static st_status synth_evaluate(run_shared *r, void *state, st_worker *w, double *loss,
                                double *acc)
{
    (void)state;
    return st_run_evaluate_replicas(r, w, loss, acc);
}

static st_comm_bytes synth_bytes(const run_shared *r, const void *state, int wid)
{
    (void)state;
    return st_run_engine_bytes(r, wid);
}

/* In the recovery epochs: worker 0's replica of the joined mlp; before
 * them (a segment epoch's checkpoint, a run without recovery): the joined
 * network, as the last epoch end joined it. */
static st_status synth_full_params(run_shared *r, void *state, st_worker *w0,
                                   const float **out, size_t *count)
{
    (void)r;
    synth_run *sy = state;
    st_model *m = sy->recovering ? w0->model : sy->joined;
    *count = st_model_param_count(m);
    *out = st_model_params(m);
    return ST_OK;
}

/* A checkpoint's: the segment epochs done (all of them in the recovery
 * epochs). */
static st_status synth_save(run_shared *r, void *state, run_ckpt *ck)
{
    synth_run *sy = state;
    const int done = sy->recovering ? r->cfg->epochs : sy->epochs_done;
    return st_run_ckpt_meta(ck, "subtrain.synth.segment_epochs", "%d", done);
}

/* Resuming in the segment epochs: each worker's segment from the joined
 * parameters, its group's master shard and its optimizer shard, its step
 * count; worker 0's joined network.  Resuming in the recovery epochs:
 * nothing here (recovery_start loads the model it builds). */
static st_status synth_resume(run_shared *r, void *state, st_worker *w)
{
    synth_run *sy = state;
    const int wid = w->id;
    synth_group *G = &sy->groups[sy->group_of[wid]];
    synth_worker *me = &sy->workers[wid];
    const float *full = r->resume->params;
    if (wid == 0)
        memcpy(st_model_params(sy->joined), full, r->n_params * sizeof(float));
    if (sy->segment_epochs_done == r->cfg->epochs)
        return ST_OK;
    float *p = st_segnet_params(me->net);
    memcpy(p, full + G->full_offset, G->n_params * sizeof(float));
    if (G->comm) {
        const int k = wid - G->local_first;
        st_range shard = st_comm_shard(G->comm, k);
        memcpy(st_comm_shard_params(G->comm, k), p + shard.begin,
               (shard.end - shard.begin) * sizeof(float));
    }
    ST_TRY(st_run_resume_optimizer(r, w));
    me->steps = (uint64_t)sy->segment_epochs_done * G->steps_per_epoch;
    atomic_store_explicit(&G->done, me->steps, memory_order_relaxed);
    return ST_OK;
}

/* The final record of the recovery epochs follows the segment epochs. */
static void synth_post_loop(run_shared *r, void *state, st_worker *w)
{
    (void)state;
    if (w->id == 0)
        renumber(r, &r->final);
}

static void synth_defaults(st_train_config *c)
{
    c->synth = st_synth_config_default();
}

static void synth_describe(const st_train_config *c, int workers, char *out, size_t n)
{
    (void)workers;
    const st_synth_config *s = &c->synth;
    snprintf(out, n, " (%d segments, %s labels scale %g noise %g, %d recovery epoch%s)",
             s->segments, st_synth_labels_name(s->labels), s->scale, s->noise,
             s->recovery_epochs, s->recovery_epochs == 1 ? "" : "s");
}

/* ------------------------------------------------------------ options */

static const char *const label_names[] = { "gaussian", "sign", NULL };

static void set_segments(st_train_config *c, const st_option_value *v)
{
    c->synth.segments = (int)v->count;
}

static int get_segments(const st_train_config *c, st_option_value *v)
{
    v->count = (uint64_t)c->synth.segments;
    return 1;
}

static void set_cuts(st_train_config *c, const st_option_value *v)
{
    memset(c->synth.cuts, 0, sizeof c->synth.cuts);
    for (int k = 0; k < v->n_counts && k < ST_SYNTH_MAX_SEGMENTS - 1; k++)
        c->synth.cuts[k] = v->counts[k];
}

/* none of its own: balanced by FLOPs */
static int get_cuts(const st_train_config *c, st_option_value *v)
{
    const st_synth_config *s = &c->synth;
    for (v->n_counts = 0; v->n_counts + 1 < s->segments && s->cuts[v->n_counts]; v->n_counts++)
        v->counts[v->n_counts] = s->cuts[v->n_counts];
    return v->n_counts > 0;
}

static void set_labels(st_train_config *c, const st_option_value *v)
{
    c->synth.labels = (st_synth_labels)v->name;
}

static int get_labels(const st_train_config *c, st_option_value *v)
{
    v->name = (int)c->synth.labels;
    return 1;
}

static void set_scale(st_train_config *c, const st_option_value *v)
{
    c->synth.scale = (float)v->real;
}

static int get_scale(const st_train_config *c, st_option_value *v)
{
    v->real = c->synth.scale;
    return 1;
}

static void set_noise(st_train_config *c, const st_option_value *v)
{
    c->synth.noise = (float)v->real;
}

static int get_noise(const st_train_config *c, st_option_value *v)
{
    v->real = c->synth.noise;
    return 1;
}

static void set_recovery(st_train_config *c, const st_option_value *v)
{
    c->synth.recovery_epochs = (int)v->count;
}

static int get_recovery(const st_train_config *c, st_option_value *v)
{
    v->count = (uint64_t)c->synth.recovery_epochs;
    return 1;
}

static const st_strategy_option synth_options[] = {
    { .name = "segments", .syntax = "S", .help = "synth: segments (default 2)",
      .kind = ST_OPTION_COUNT, .lo = 2, .hi = ST_SYNTH_MAX_SEGMENTS, .only = 1,
      .set = set_segments, .get = get_segments },
    { .name = "cuts", .syntax = "C1,C2,..",
      .help = "synth: cut after these linear layers, S-1 increasing\n"
              "numbers in [1, depth] (default: balanced by FLOPs)",
      .kind = ST_OPTION_COUNTS, .lo = 1, .hi = 1024, .most = ST_SYNTH_MAX_SEGMENTS - 1,
      .expected = "increasing layer numbers such as 2,4", .only = 1, .set = set_cuts,
      .get = get_cuts },
    { .name = "synth-labels", .syntax = "gaussian|sign",
      .help = "synth: labels per class and cut, N(0, scale^2)\n"
              "or +-scale components (default gaussian)",
      .kind = ST_OPTION_NAME, .names = label_names, .only = 1, .set = set_labels,
      .get = get_labels },
    { .name = "synth-scale", .syntax = "X", .help = "synth: label scale (default 1)",
      .kind = ST_OPTION_REAL, .lo_bracket = '(', .real_lo = 0.0, .real_hi = 1000.0,
      .hi_bracket = ']', .only = 1, .set = set_scale, .get = get_scale },
    { .name = "synth-noise", .syntax = "X",
      .help = "synth: noise std added to a segment's input labels,\n"
              "relative to the scale (default 0.5)",
      .kind = ST_OPTION_REAL, .lo_bracket = '[', .real_lo = 0.0, .real_hi = 1000.0,
      .hi_bracket = ']', .only = 1, .set = set_noise, .get = get_noise },
    { .name = "recovery-epochs", .syntax = "E",
      .help = "synth: end-to-end data-parallel epochs of the joined\n"
              "network afterwards (default 0)",
      .kind = ST_OPTION_COUNT, .lo = 0, .hi = 100000, .only = 1, .set = set_recovery,
      .get = get_recovery },
    { .name = NULL },
};

const st_strategy_ops st_synth_ops = {
    .info = {
        .name = "synth",
        .help = "synth: the mlp cut into segments trained apart by\n"
                "groups of workers against synthetic labels, then\n"
                "joined (default model: mlp --depth 5)",
        .options = synth_options,
        .no_init = "its segments start from their own initial values",
        .model = ST_MODEL_MLP,
        .depth = 5,   /* the paper's network of 6 linear layers */
    },
    .defaults = synth_defaults,
    .describe = synth_describe,
    .not_stepwise = "its segment epochs, where each group of workers takes its own number "
                    "of steps, are no sequence of steps of the run",
    .check = synth_check,
    .layout = synth_layout,
    .prepare = synth_prepare,
    .init_worker = synth_init_worker,
    .pre_loop = synth_pre_loop,
    .step = synth_step,
    .evaluate = synth_evaluate,
    .bytes = synth_bytes,
    .full_params = synth_full_params,
    .post_loop = synth_post_loop,
    .save = synth_save,
    .resume = synth_resume,
    .abort = synth_abort,
    .release = synth_release,
};

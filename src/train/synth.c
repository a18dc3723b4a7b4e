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
 * with its own schedule; groups meet only at epoch ends, at blocking
 * barriers of all workers (synth_join.c): each group's first worker
 * copies its segment's parameters into its range of worker 0's joined
 * network — the join, one parameter copy a segment and epoch, not part of
 * training; then worker 0 evaluates the joined network on the test set
 * and reports while the others wait.
 *
 * Over MPI ranks (R ranks of n workers): the groups split the R n global
 * workers, so a group may start and end inside a rank.  A group within
 * one rank reduces with the shared engine; a group that spans ranks with
 * an MPI engine over just its ranks (comm/mpi.c, its ranks' own worker
 * counts).  The epoch end adds one exchange per epoch, by each rank's
 * worker 0 after the join's barrier (join_over_ranks): every segment's
 * parameters are broadcast from the rank of its group's first worker, so
 * that every rank holds the joined network; the loss sums of the groups
 * reach every rank.  A group that spans ranks keeps its members' step
 * losses in a buffer of the epoch and takes their means there, in the
 * order one process takes them at every step: the records are bitwise
 * those of one process with R n workers.  Every rank evaluates the joined
 * network (the same values); a stop or a checkpoint asked of any rank is
 * agreed at the epoch end.
 *
 * The run has two phases (strategy.h, st_phase), which the loop runs.
 * The segment epochs are an apart phase: the groups take different
 * numbers of steps and meet only at epoch ends (synth_join.c), where
 * stops and checkpoints are taken; records and checkpoint names count
 * group 0's steps.  Recovery (--recovery-epochs E): then every worker
 * drops its segment, builds the whole mlp on a fresh arena with the
 * joined parameters, and the loop runs E epochs of plain data parallelism
 * (the sharded step of run.c, all N workers, the run's engine), with the
 * orders of epochs epochs + 1 .. epochs + E, numbered after the segment
 * epochs.
 *
 * Files: synth.c (the strategy: config, groups, phases, recovery, saving
 * and resuming), synth_segment.c (a segment's worker and step),
 * synth_join.c (the epoch ends and the records), synth_run.h (the state
 * they share), synth_plan.c (cuts, the worker split, the labels).
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "train/synth_run.h"

/* ------------------------------------------------------------ config */

static st_status synth_check(const st_train_config *c, int chosen)
{
    if (!chosen)
        return ST_OK;
    const st_synth_config *s = &c->synth;
    const char *model = st_model_kind_name(c->model.kind);
    /* its segment groups step apart, on segment networks of their own */
    if (c->accumulate > 1)
        return st_fail(ST_ERR_INVALID, "--accumulate %d: --strategy synth trains its segments "
                       "one batch a step (use --batch for larger steps)", c->accumulate);
    if (strcmp(model, "resnet") == 0 || strcmp(model, "resnet18") == 0)
        return st_fail(ST_ERR_INVALID, "--model %s does not train with --strategy synth (its "
                       "segments would cut batch-normalised residual blocks; see doc/cnn.md)",
                       model);
    if (strcmp(model, "gpt") == 0)
        return st_fail(ST_ERR_INVALID, "--model gpt does not train with --strategy synth (its "
                       "cuts are between the layers of a plain MLP)");
    /* Its groups train different layers on every sample, not the same
     * model on different data: no worker's data is its own to skew. */
    if (c->split.kind != ST_SPLIT_IID) {
        char name[64];
        st_split_name(&c->split, name, sizeof name);
        return st_fail(ST_ERR_INVALID, "--split %s does not apply to --strategy synth (its "
                       "segment groups train different layers on every sample, not one model "
                       "on data of their own); use --split iid", name);
    }
    if (strcmp(model, "mlp") != 0)
        return st_fail(ST_ERR_INVALID, "synth cuts an mlp into segments; --model %s is not "
                       "supported (the default for --strategy synth is mlp --depth 5)", model);
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
        return st_fail(ST_ERR_INVALID, "segment %d's global batch of %d worker%s x %d samples "
                       "is larger than the training set (%u samples)", G->index + 1, G->count,
                       G->count == 1 ? "" : "s", cfg->batch, train->count);
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
                              .payload = st_run_comm_payload(r->cfg),
                              /* a sizing run's workers only meet (run.c) */
                              .blocking = r->sizing };
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

/* The recovery epochs' data parallelism: every worker holds the joined
 * mlp, whose weights it writes only as a shard owner, one copy per NUMA
 * domain.  (The segment epochs' groups train segment networks of their
 * own, a replica per worker.) */
static st_weights synth_weights(const st_train_config *c)
{
    (void)c;
    return ST_WEIGHTS_SHARED;
}

/* Before the parallel region: the run's engine (that of the recovery
 * epochs, and the barrier of all workers), cuts, the split of the workers
 * into groups, each group's reduction engine; r->plan becomes the recovery
 * epochs' (none without them): the stepwise epochs a checkpoint's position
 * counts (strategy.h). */
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
    st_synth_barrier_init(&sy->barrier, r->n);
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
        st_synth_barrier_abort(&sy->barrier);
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
        st_synth_barrier_destroy(&sy->barrier);
    free(sy->group_of);
    free(sy->workers);
    free(sy);
}

/* ------------------------------------------------------------ the phases */

/* Worker w drops its segment and holds the whole joined mlp, on a fresh
 * arena (so that the recovery records count what data parallelism holds),
 * attached to the run's engine. */
static st_status recovery_start(run_shared *r, synth_run *sy, st_worker *w,
                                const st_chunk_backend *backend)
{
    const int wid = w->id;
    st_worker_destroy(w);
    ST_TRY(st_worker_init_base(w, wid, r->train->count, backend));
    ST_TRY(st_run_weights_storage(r, w, r->cfg, backend));
    ST_TRY(st_worker_build_model(w, r->cfg));
    ST_TRY(st_run_weights_load(r, w, st_model_params(sy->joined)));
    ST_TRY(st_run_attach_worker(r->comm, NULL, wid, w, NULL)); /* R n >= S >= 2: an engine */
    st_range shard = st_comm_shard(r->comm, wid);
    ST_TRY(st_worker_init_optimizer(w, r->cfg, shard.begin, shard.end));
    if (r->resume && r->resume->at.step > 0) {   /* resumed in the recovery epochs */
        ST_TRY(st_run_resume_model(r, w));
        st_run_resume_shard(r, r->comm, wid, st_comm_shard_params(r->comm, wid));
    }
    if (wid == 0)
        sy->recovering = 1;
    return ST_OK;
}

/* Phase 0, the segment epochs: w's group's steps, from the segment epoch
 * after those a resumed checkpoint had done; phase 1, the recovery
 * epochs: r->plan (the default), numbered after the segment epochs, on
 * the joined network. */
static st_status synth_phase_begin(run_shared *r, void *state, int k, st_worker *w,
                                   const st_chunk_backend *backend, st_phase *ph)
{
    const st_train_config *cfg = r->cfg;
    synth_run *sy = state;
    const int recovery = cfg->synth.recovery_epochs;
    ph->run_epochs = cfg->epochs + recovery;
    ph->run_steps = sy->steps1 + r->plan.total_steps;
    if (k == 1) {
        ph->epochs_before = cfg->epochs;
        ph->steps_before = sy->steps1;
        ph->order_offset = (uint64_t)cfg->epochs;   /* not segment epoch e's order again */
        ph->label = st_synth_recovery_label;
        return recovery_start(r, sy, w, backend);
    }
    const synth_group *G = &sy->groups[sy->group_of[w->id]];
    const int done = sy->segment_epochs_done;
    ph->plan = (run_plan){ .steps_per_epoch = G->steps_per_epoch,
                           .total_steps = (uint64_t)cfg->epochs * G->steps_per_epoch,
                           .epochs = cfg->epochs, .schedule = G->schedule };
    ph->epoch_steps = sy->groups[0].steps_per_epoch;
    ph->from = (run_position){ .epoch = done + 1,
                               .step = (uint64_t)done * G->steps_per_epoch,
                               .train_time = r->resume ? r->resume->at.train_time : 0.0 };
    ph->samples_per_step = sy->samples_per_epoch / (double)ph->epoch_steps;
    ph->apart = 1;
    ph->last = recovery == 0;
    ph->step = st_synth_segment_step;
    ph->evaluate = st_synth_join_evaluate;
    ph->bytes = st_synth_segment_bytes;
    ph->work = st_synth_segment_work;
    ph->record = st_synth_segment_record;
    ph->sync = st_synth_sync;
    ph->estimate = st_synth_segment_estimate;
    return ST_OK;
}

/* After the segment epochs (also stopped or failed): the segments go,
 * before their arenas do. */
static st_status synth_phase_end(run_shared *r, void *state, int k, st_worker *w)
{
    (void)r;
    synth_run *sy = state;
    if (k == 0) {
        st_segnet_destroy(sy->workers[w->id].net);
        sy->workers[w->id].net = NULL;
    }
    return ST_OK;
}

/* The recovery epochs (the ops' hooks: the default phase's): data
 * parallelism of the joined network. */
static st_status synth_step(run_shared *r, void *state, st_worker *w, uint64_t i, uint64_t step,
                            float *loss, float *lr)
{
    (void)state;
    run_sharded e = { .grads = r->comm, .masters = r->comm, .overlap = 1 };
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
 * parameters, its group's master shard and its optimizer shard, its
 * group's progress; worker 0's joined network.  Resuming in the recovery
 * epochs: nothing here (recovery_start loads the model it builds). */
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
    atomic_store_explicit(&G->done, (uint64_t)sy->segment_epochs_done * G->steps_per_epoch,
                          memory_order_relaxed);
    return ST_OK;
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
        .model = "mlp",
        .depth = 5,   /* the paper's network of 6 linear layers */
    },
    .defaults = synth_defaults,
    .describe = synth_describe,
    .weights = synth_weights,
    .not_stepwise = "its segment epochs, where each group of workers takes its own number "
                    "of steps, are no sequence of steps of the run",
    .check = synth_check,
    .layout = synth_layout,
    .prepare = synth_prepare,
    .init_worker = st_synth_init_worker,
    .step = synth_step,
    .evaluate = synth_evaluate,
    .bytes = synth_bytes,
    .full_params = synth_full_params,
    .save = synth_save,
    .resume = synth_resume,
    .abort = synth_abort,
    .release = synth_release,
    .phase_begin = synth_phase_begin,
    .phase_end = synth_phase_end,
};

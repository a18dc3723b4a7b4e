/*
 * train/synth.c — partitioned training with synthetic intermediate labels
 * (PAPERS.md section 3): the mlp is cut into S consecutive segments, each
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
 * with its own schedule; groups meet only at epoch ends (one barrier of all
 * workers), where each group's first worker copies its segment's
 * parameters into its range of worker 0's joined network — the join, one
 * parameter copy a segment and epoch, not part of training — and worker 0
 * evaluates the joined network on the test set.
 *
 * Recovery (--recovery-epochs E): every worker drops its segment, builds
 * the whole mlp on a fresh arena with the joined parameters, and the run
 * continues as plain data parallelism (train.c's loop, all N workers, the
 * run's engine) for E epochs.  The records are renumbered to follow the
 * segment epochs.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/rng.h>

#include "core/error.h"
#include "nn/segment.h"
#include "train/run.h"

/* One group of workers and its segment.  A cache line of its own: its
 * first worker adds to loss_sum every step. */
typedef struct synth_group {
    _Alignas(64) double loss_sum;    /* over the epoch: the group's mean loss per step */
    int first, count;                /* workers [first, first + count) */
    int layer_first, layer_last;     /* its linear layers (1-based) */
    size_t n_params, full_offset;    /* its parameters, where they sit in the mlp's */
    double flops;                    /* per step and worker */
    st_comm *comm;                   /* NULL for a group of one */
    uint64_t steps_per_epoch;
    st_schedule schedule;
} synth_group;

/* What one worker holds besides st_worker (its own lines). */
typedef struct synth_worker {
    _Alignas(64) st_segnet *net;
    const float *labels_in;          /* K x W: s_{g-1}, NULL for segment 1 */
    const float *labels_out;         /* K x W: s_g, NULL for the last segment */
    int32_t *y;                      /* (B) classes of the batch */
    st_rng noise;                    /* the root of its segment's noise streams */
    uint64_t steps;                  /* taken so far */
} synth_worker;

typedef struct synth_state {
    int segments;
    int cuts[ST_SYNTH_MAX_SEGMENTS - 1];
    synth_group groups[ST_SYNTH_MAX_SEGMENTS];
    int *group_of;                   /* n */
    synth_worker *workers;           /* n */
    st_arena eval_arena;             /* worker 0's joined network */
    st_model *joined;
    uint64_t steps1;                 /* group 0's steps over the segment epochs */
    st_mem_stats phase1_worst;       /* the largest worker of the segment epochs */
    double train_time1;              /* worker 0's training time, segment epochs */
    const st_train_callbacks *user_cb;
    st_train_callbacks wrap_cb;      /* recovery: renumbers, then calls user_cb */
} synth_state;

/* ------------------------------------------------------------ config */

st_status st_synth_check_config(const st_train_config *c)
{
    if (c->strategy != ST_STRATEGY_SYNTH)
        return ST_OK;
    const st_synth_config *s = &c->synth;
    if (c->model.kind != ST_MODEL_MLP)
        return st_fail(ST_ERR_INVALID, "synth cuts an mlp into segments; --model %s is not "
                       "supported (the default for --strategy synth is mlp --depth 5)",
                       st_model_kind_name(c->model.kind));
    int layers = c->model.depth + 1;
    int most = layers < ST_SYNTH_MAX_SEGMENTS ? layers : ST_SYNTH_MAX_SEGMENTS;
    if (s->segments < 2 || s->segments > most)
        return st_fail(ST_ERR_INVALID, "--segments must be in [2, %d] for an mlp of depth %d "
                       "(%d linear layers), got %d", most, c->model.depth, layers, s->segments);
    if (s->cuts[0]) {
        for (int i = 0; i < s->segments - 1; i++)
            if (s->cuts[i] < 1 || s->cuts[i] > c->model.depth ||
                (i > 0 && s->cuts[i] <= s->cuts[i - 1]))
                return st_fail(ST_ERR_INVALID, "--cuts must be %d increasing layer numbers in "
                               "[1, %d] (a cut after layer c), got %d as cut %d",
                               s->segments - 1, c->model.depth, s->cuts[i], i + 1);
        if (s->segments - 1 < ST_SYNTH_MAX_SEGMENTS - 1 && s->cuts[s->segments - 1])
            return st_fail(ST_ERR_INVALID, "--cuts gives more than the %d cut%s of --segments %d",
                           s->segments - 1, s->segments == 2 ? "" : "s", s->segments);
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

static void layer_shape(const st_model_config *m, int l, size_t *in, size_t *out)
{
    *in = (size_t)(l == 1 ? m->in_dim : m->width);
    *out = (size_t)(l == m->depth + 1 ? m->n_classes : m->width);
}

static size_t layers_params(const st_model_config *m, int first, int last)
{
    size_t n = 0, in, out;
    for (int l = first; l <= last; l++) {
        layer_shape(m, l, &in, &out);
        n += in * out + out;
    }
    return n;
}

/* Group g's steps and learning-rate schedule over the segment epochs. */
static st_status group_plan(const st_train_config *cfg, const st_dataset *train, synth_group *g)
{
    g->steps_per_epoch = train->count / ((uint64_t)cfg->batch * (uint64_t)g->count);
    uint64_t total = (uint64_t)cfg->epochs * g->steps_per_epoch;
    uint64_t warmup = cfg->warmup_steps == ST_WARMUP_AUTO ? total / 20 : cfg->warmup_steps;
    if (cfg->schedule == ST_SCHED_WARMUP_COSINE && warmup >= total)
        return st_fail(ST_ERR_INVALID, "warmup (%llu steps) must be shorter than a group's run "
                       "(%llu steps)", (unsigned long long)warmup, (unsigned long long)total);
    g->schedule = (st_schedule){ cfg->schedule, cfg->optim.lr, warmup, total };
    return ST_OK;
}

static st_status make_groups(run_shared *r, synth_state *st)
{
    const st_train_config *cfg = r->cfg;
    const int S = cfg->synth.segments;
    double flops[ST_SYNTH_MAX_SEGMENTS];
    int counts[ST_SYNTH_MAX_SEGMENTS];
    for (int g = 0; g < S; g++) {
        synth_group *G = &st->groups[g];
        G->layer_first = g == 0 ? 1 : st->cuts[g - 1] + 1;
        G->layer_last = g == S - 1 ? cfg->model.depth + 1 : st->cuts[g];
        G->flops = st_synth_segment_flops(&cfg->model, G->layer_first, G->layer_last, cfg->batch);
        G->n_params = layers_params(&cfg->model, G->layer_first, G->layer_last);
        G->full_offset = layers_params(&cfg->model, 1, G->layer_first - 1);
        flops[g] = G->flops;
    }
    ST_TRY(st_synth_split_workers(r->n, S, flops, counts));
    int next = 0;
    for (int g = 0; g < S; g++) {
        synth_group *G = &st->groups[g];
        G->first = next;
        G->count = counts[g];
        for (int k = 0; k < G->count; k++)
            st->group_of[next + k] = g;
        next += G->count;
        ST_TRY(group_plan(cfg, r->train, G));
    }
    return ST_OK;
}

/* A reduction engine per group of more than one worker, over the group's
 * workers only (their NUMA domains, in order) and its segment's vector. */
static st_status make_engines(run_shared *r, synth_state *st)
{
    for (int g = 0; g < st->segments; g++) {
        synth_group *G = &st->groups[g];
        if (G->count == 1)
            continue;
        int domain_of[G->count];
        for (int k = 0; k < G->count; k++)
            domain_of[k] = r->placement.workers[G->first + k].domain;
        st_comm_config cc = { .n_workers = G->count, .n_params = G->n_params,
                              .domain_of = domain_of };
        ST_TRY(st_comm_create(&cc, &G->comm));
    }
    return ST_OK;
}

st_status st_synth_prepare(run_shared *r)
{
    const st_train_config *cfg = r->cfg;
    synth_state *st = calloc(1, sizeof *st);
    if (!st)
        return st_fail(ST_ERR_NOMEM, "out of memory for the segments' state");
    r->synth = st;
    st->segments = cfg->synth.segments;
    st->group_of = calloc((size_t)r->n, sizeof *st->group_of);
    st->workers = aligned_alloc(64, sizeof(synth_worker) * (size_t)r->n);
    if (!st->group_of || !st->workers)
        return st_fail(ST_ERR_NOMEM, "out of memory for the segments' state");
    memset(st->workers, 0, sizeof(synth_worker) * (size_t)r->n);
    if (cfg->synth.cuts[0])
        memcpy(st->cuts, cfg->synth.cuts, sizeof st->cuts);
    else
        ST_TRY(st_synth_balanced_cuts(&cfg->model, st->segments, st->cuts));
    ST_TRY(make_groups(r, st));
    ST_TRY(make_engines(r, st));
    st->steps1 = (uint64_t)cfg->epochs * st->groups[0].steps_per_epoch;
    if (cfg->synth.recovery_epochs > 0) {
        st_train_config rc = *cfg;
        rc.epochs = cfg->synth.recovery_epochs;
        rc.steps = 0;
        ST_TRY(st_run_make_plan(&rc, r->n, r->train, &r->plan));
    }
    return ST_OK;
}

void st_synth_abort(run_shared *r)
{
    for (int g = 0; g < r->synth->segments; g++)
        if (r->synth->groups[g].comm)
            st_comm_abort(r->synth->groups[g].comm);
}

void st_synth_release(run_shared *r)
{
    synth_state *st = r->synth;
    if (!st)
        return;
    for (int k = 0; st->workers && k < r->n; k++)
        st_segnet_destroy(st->workers[k].net); /* left by a failed run */
    st_model_destroy(st->joined);
    st_arena_release(&st->eval_arena);
    for (int g = 0; g < st->segments; g++)
        st_comm_destroy(st->groups[g].comm);
    free(st->group_of);
    free(st->workers);
    free(st);
    r->synth = NULL;
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

st_status st_synth_init_worker(run_shared *r, int wid, st_worker *w,
                               const st_chunk_backend *backend)
{
    const st_train_config *cfg = r->cfg;
    synth_state *st = r->synth;
    const int g = st->group_of[wid];
    synth_group *G = &st->groups[g];
    synth_worker *me = &st->workers[wid];
    ST_TRY(st_worker_init_base(w, wid, r->train->count, backend));
    st_segment_config sc = { cfg->model, G->layer_first, G->layer_last };
    ST_TRY(st_segnet_create(&sc, cfg->batch, &w->arena, &me->net));
    st_segnet_init_params(me->net, cfg->seed);
    if (g > 0)
        ST_TRY(alloc_labels(w, cfg, g, &me->labels_in));
    if (g < st->segments - 1)
        ST_TRY(alloc_labels(w, cfg, g + 1, &me->labels_out));
    void *y;
    ST_TRY(st_arena_alloc(&w->arena, ST_MEM_ACTIVATIONS, (size_t)cfg->batch * sizeof(int32_t), &y));
    me->y = y;
    st_rng root = st_rng_seed(cfg->seed);
    st_rng noise = st_rng_split(&root, 0x4015E); /* the "noise" namespace */
    me->noise = st_rng_split(&noise, (uint64_t)g);
    me->steps = 0;

    size_t P = st_segnet_param_count(me->net);
    if (G->comm) {
        st_range all = { 0, P };
        int k = wid - G->first;
        ST_TRY(st_comm_attach(G->comm, k, &w->arena, st_segnet_grads(me->net),
                              st_segnet_params(me->net), &all, 1));
        st_range shard = st_comm_shard(G->comm, k);
        ST_TRY(st_worker_init_optimizer(w, cfg, shard.begin, shard.end));
    } else {
        ST_TRY(st_worker_init_optimizer(w, cfg, 0, P));
    }
    if (wid == 0) { /* the joined network, for evaluation: not part of any worker's arena */
        st_arena_init(&st->eval_arena, "evaluation", backend, 0);
        ST_TRY(st_model_create(&cfg->model, cfg->batch, &st->eval_arena, &st->joined));
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

/* Samples order[first .. first + B) as the segment sees them: the images
 * (segment 1) or the synthetic label of the previous cut plus noise; the
 * synthetic label of the next cut (MSE) or the class (last segment).
 * x is (B, in), s_in and s_out are (K, W), the target is (B, W). */
static void load_batch(const run_shared *r, synth_worker *me, int g, int epoch,
                       const uint32_t *order, uint32_t first)
{
    const st_dataset *d = r->train;
    const int B = r->cfg->batch, W = r->cfg->model.width, S = r->synth->segments;
    const uint32_t *idx = order + first;
    float *x = st_segnet_input(me->net);
    int32_t *y = g == S - 1 ? st_segnet_labels(me->net) : me->y;
    if (g == 0) {
        st_dataset_gather(d, idx, (size_t)B, x, y);
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

/* One step of worker w in group G (local index k): its batch of the
 * group's global batch i, forward, backward, then the group's data
 * parallelism (or a local update).  *loss: the group's mean, for k = 0. */
static st_status segment_step(run_shared *r, st_worker *w, synth_group *G, int g, int epoch,
                              uint64_t i, float *loss, float *lr)
{
    synth_worker *me = &r->synth->workers[w->id];
    worker_slot *slot = &r->slots[w->id];
    const int k = w->id - G->first, m = G->count;
    double t = st_run_now_s(), t1;
    uint32_t first = (uint32_t)((i * (uint64_t)m + (uint64_t)k) * (uint64_t)r->cfg->batch);
    load_batch(r, me, g, epoch, w->order, first);
    ST_TRY(st_segnet_forward_backward(me->net, &slot->loss));
    t1 = st_run_now_s();
    slot->times.compute += t1 - t;
    t = t1;
    uint64_t step = ++me->steps;
    int n_segs;
    const st_param_segment *segs = st_segnet_segments(me->net, &n_segs);
    size_t P = st_segnet_param_count(me->net);
    *lr = st_schedule_lr(&G->schedule, step);
    if (!G->comm) {
        *loss = slot->loss;
        st_optim_update(&w->optim, st_segnet_params(me->net), st_segnet_grads(me->net), segs,
                        n_segs, 0, P, step, *lr);
        slot->times.optimizer += st_run_now_s() - t;
        return ST_OK;
    }
    ST_TRY(st_comm_barrier(G->comm, k));
    t1 = st_run_now_s();
    slot->times.wait += t1 - t;
    t = t1;
    if (k == 0) { /* stable until the all-gather, which needs every worker */
        double sum = 0.0;
        for (int v = 0; v < m; v++)
            sum += r->slots[G->first + v].loss;
        *loss = (float)(sum / m);
    }
    ST_TRY(st_comm_reduce_scatter(G->comm, k));
    t1 = st_run_now_s();
    slot->times.reduce += t1 - t;
    t = t1;
    st_range shard = st_comm_shard(G->comm, k);
    st_optim_update(&w->optim, st_comm_shard_params(G->comm, k), st_comm_shard_grads(G->comm, k),
                    segs, n_segs, shard.begin, shard.end, step, *lr);
    t1 = st_run_now_s();
    slot->times.optimizer += t1 - t;
    t = t1;
    ST_TRY(st_comm_all_gather(G->comm, k));
    slot->times.reduce += st_run_now_s() - t;
    return ST_OK;
}

/* ------------------------------------------------------------ records */

static void describe_segments(const synth_state *st, st_epoch_record *rec)
{
    rec->n_segments = st->segments;
    for (int g = 0; g < st->segments; g++) {
        rec->segment_workers[g] = st->groups[g].count;
        if (g + 1 < st->segments)
            rec->cuts[g] = st->cuts[g];
    }
}

static void report_step(run_shared *r, int epoch, uint64_t step, float loss, float lr,
                        double train_time)
{
    const st_train_callbacks *cb = r->cb;
    if (!cb || !cb->on_step)
        return;
    const synth_state *st = r->synth;
    const synth_group *G = &st->groups[0];
    uint64_t total = st->steps1 + (r->cfg->synth.recovery_epochs ? r->plan.total_steps : 0);
    int epochs = r->cfg->epochs + r->cfg->synth.recovery_epochs;
    double samples = (double)step * r->cfg->batch * G->count;
    st_step_info info = {
        step, total, epoch, epochs, loss, lr, samples / train_time,
        st_run_now_s() - r->t0, train_time / (double)step * (double)(st->steps1 - step),
    };
    cb->on_step(&info, cb->user);
}

/* The joined network on the test set (worker 0). */
static st_status evaluate_joined(run_shared *r, double *loss, double *acc)
{
    st_model *m = r->synth->joined;
    const st_dataset *d = r->test;
    const uint32_t B = (uint32_t)st_model_batch(m);
    float *x = st_model_input(m);
    int32_t *y = st_model_labels(m);
    double sum = 0.0;
    int64_t correct = 0;
    for (uint32_t first = 0; first < d->count; first += B) {
        uint32_t rows = d->count - first < B ? d->count - first : B;
        memcpy(x, d->x + (size_t)first * d->dim, (size_t)rows * d->dim * sizeof *x);
        for (uint32_t i = 0; i < rows; i++)
            y[i] = d->y[first + i];
        if (rows < B) {
            memset(x + (size_t)rows * d->dim, 0, (size_t)(B - rows) * d->dim * sizeof *x);
            memset(y + rows, 0, (size_t)(B - rows) * sizeof *y);
        }
        ST_TRY(st_model_evaluate(m, (int)rows, &sum, &correct));
    }
    *loss = sum / d->count;
    *acc = (double)correct / d->count;
    return ST_OK;
}

/* Worker 0, between the two barriers of an epoch end. */
static void fill_record(run_shared *r, st_epoch_record *rec)
{
    const synth_state *st = r->synth;
    step_times sum = { 0, 0, 0, 0 };
    size_t worst = 0;
    double bytes = 0.0;
    for (int k = 0; k < r->n; k++) {
        const worker_slot *s = &r->slots[k];
        double steps = (double)st->groups[st->group_of[k]].steps_per_epoch;
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
    rec->workers = r->n;
    rec->comm_bytes_per_worker_step = bytes;
    rec->ring_bytes_per_worker_step =
        st_comm_ring_bytes(r->n, st_model_config_param_count(&r->cfg->model));
    describe_segments(st, rec);
    for (int g = 0; g < st->segments; g++)
        rec->segment_loss[g] = st->groups[g].loss_sum / (double)st->groups[g].steps_per_epoch;
    rec->train_loss = rec->segment_loss[st->segments - 1];
}

/* ------------------------------------------------------------ the segment epochs */

static st_status segment_epochs(run_shared *r, st_worker *w)
{
    const st_train_config *cfg = r->cfg;
    synth_state *st = r->synth;
    const int wid = w->id, g = st->group_of[wid];
    synth_group *G = &st->groups[g];
    synth_worker *me = &st->workers[wid];
    worker_slot *slot = &r->slots[wid];
    const int leader = wid == G->first;
    st_epoch_record rec;
    memset(&rec, 0, sizeof rec);
    double train_time = 0.0;
    float lr = 0.0f;

    for (int epoch = 1; epoch <= cfg->epochs; epoch++) {
        /* Every group draws the same order from the seed: no sharing. */
        st_epoch_order(cfg->seed, (uint64_t)epoch - 1, w->order, r->train->count);
        memset(&slot->times, 0, sizeof slot->times);
        if (leader)
            G->loss_sum = 0.0;
        double te = st_run_now_s();
        for (uint64_t i = 0; i < G->steps_per_epoch; i++) {
            float loss = 0.0f;
            ST_TRY(segment_step(r, w, G, g, epoch, i, &loss, &lr));
            if (leader)
                G->loss_sum += loss;
            if (wid == 0)
                report_step(r, epoch, me->steps, loss, lr, train_time + (st_run_now_s() - te));
        }
        double epoch_time = st_run_now_s() - te;
        train_time += epoch_time;
        slot->memory = w->arena.stats;
        memset(&slot->bytes, 0, sizeof slot->bytes);
        if (G->comm)
            slot->bytes = st_comm_bytes_per_step(G->comm, wid - G->first);
        /* The join: each group writes its own range of the joined vector
         * (after its all-gather every replica holds the same values). */
        if (leader)
            memcpy(st_model_params(st->joined) + G->full_offset, st_segnet_params(me->net),
                   G->n_params * sizeof(float));
        ST_TRY(st_run_sync(r, wid));
        if (wid == 0) {
            ST_TRY(evaluate_joined(r, &rec.test_loss, &rec.test_acc));
            rec.epoch = epoch;
            rec.epochs = cfg->epochs + cfg->synth.recovery_epochs;
            rec.step = me->steps;
            rec.samples_per_s = (double)G->steps_per_epoch * cfg->batch * G->count / epoch_time;
            rec.lr = lr;
            rec.wall_s = st_run_now_s() - r->t0;
            fill_record(r, &rec);
            if (r->cb && r->cb->on_epoch)
                r->cb->on_epoch(&rec, r->cb->user);
        }
        ST_TRY(st_run_sync(r, wid)); /* the slots and group sums are read until here */
    }
    if (wid == 0) {
        st->phase1_worst = rec.memory;
        st->train_time1 = train_time;
        r->final = rec;
        if (cfg->synth.recovery_epochs == 0) {
            rec.final = 1;
            rec.samples_per_s = (double)me->steps * cfg->batch * G->count / train_time;
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
    const synth_state *st = r->synth;
    rec->epoch += r->cfg->epochs;
    rec->epochs += r->cfg->epochs;
    rec->step += st->steps1;
    rec->recovery = 1;
    describe_segments(st, rec);
    if (rec->final && st->phase1_worst.peak_total > rec->memory.peak_total)
        rec->memory = st->phase1_worst;
}

static void wrap_on_step(const st_step_info *info, void *user)
{
    const run_shared *r = user;
    const st_train_callbacks *cb = r->synth->user_cb;
    st_step_info i = *info;
    i.step += r->synth->steps1;
    i.total_steps += r->synth->steps1;
    i.epoch += r->cfg->epochs;
    i.epochs += r->cfg->epochs;
    cb->on_step(&i, cb->user);
}

static void wrap_on_epoch(const st_epoch_record *rec, void *user)
{
    const run_shared *r = user;
    const st_train_callbacks *cb = r->synth->user_cb;
    st_epoch_record c = *rec;
    renumber(r, &c);
    cb->on_epoch(&c, cb->user);
}

/* Worker w drops its segment and holds the whole joined mlp, on a fresh
 * arena (so that the recovery records count what data parallelism holds),
 * attached to the run's engine; then train.c's loop. */
static st_status recovery_epochs(run_shared *r, st_worker *w, const st_chunk_backend *backend)
{
    const int wid = w->id;
    synth_state *st = r->synth;
    st_worker_destroy(w);
    ST_TRY(st_worker_init(w, wid, r->cfg, r->train->count, backend));
    memcpy(st_model_params(w->model), st_model_params(st->joined),
           st_model_param_count(w->model) * sizeof(float));
    ST_TRY(st_run_attach_worker(r, wid, w)); /* N >= S >= 2: the run has an engine */
    st_range shard = st_comm_shard(r->comm, wid);
    ST_TRY(st_worker_init_optimizer(w, r->cfg, shard.begin, shard.end));
    if (wid == 0) {
        st->user_cb = r->cb;
        if (r->cb) {
            /* warnings were given before the segment epochs */
            st->wrap_cb = (st_train_callbacks){ r->cb->on_step ? wrap_on_step : NULL,
                                                r->cb->on_epoch ? wrap_on_epoch : NULL,
                                                NULL, r };
            r->cb = &st->wrap_cb;
        }
    }
    ST_TRY(st_run_sync(r, wid));
    ST_TRY(st_run_worker_loop(r, w));
    if (wid == 0)
        renumber(r, &r->final);
    return ST_OK;
}

st_status st_synth_loop(run_shared *r, st_worker *w, const st_chunk_backend *backend)
{
    synth_worker *me = &r->synth->workers[w->id];
    st_status s = segment_epochs(r, w);
    st_segnet_destroy(me->net); /* before its arena goes */
    me->net = NULL;
    if (s != ST_OK || r->cfg->synth.recovery_epochs == 0)
        return s;
    return recovery_epochs(r, w, backend);
}

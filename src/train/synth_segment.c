/*
 * train/synth_segment.c — the segment epochs' steps (doc/synth.md): a
 * worker's segment, the synthetic inputs and targets of its batches, and
 * its step, data parallelism within its group (or a local update for a
 * group of one).  The labels s_i[c] are drawn from the seed by every
 * worker that needs them; the noise has one stream per (epoch, position
 * in the epoch's order), so a sample gets the same noise whatever the
 * group's size.
 */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "core/error.h"
#include "core/rng_streams.h"
#include "train/synth_run.h"

/* The strategy's state, as the hooks also get it. */
static inline synth_run *synth_of(const run_shared *r)
{
    return r->strategy;
}

static st_status alloc_labels(st_worker *w, const st_train_config *cfg, int cut,
                              const float **out)
{
    const int K = cfg->model.n_classes, W = cfg->model.width;
    float *p;
    ST_TRY(st_arena_alloc_floats(&w->arena, ST_MEM_WORKSPACE, (size_t)K * (size_t)W, &p));
    if (!st_arena_is_sizing(&w->arena))   /* a sizing run's buffers stay untouched */
        st_synth_make_labels(cfg->synth.labels, cfg->synth.scale, cfg->seed, cut, K, W, p);
    *out = p;
    return ST_OK;
}

static st_status init_worker(run_shared *r, synth_run *sy, int wid, st_worker *w,
                             const st_chunk_backend *backend);

/* A failure after the segment is built drops it: its memory is the
 * worker's arena, which goes before the run's state does. */
st_status st_synth_init_worker(run_shared *r, void *state, int wid, st_worker *w,
                               const st_chunk_backend *backend)
{
    synth_run *sy = state;
    st_status s = init_worker(r, sy, wid, w, backend);
    if (s != ST_OK) {
        st_segnet_destroy(sy->workers[wid].net);
        sy->workers[wid].net = NULL;
    }
    return s;
}

static st_status init_worker(run_shared *r, synth_run *sy, int wid, st_worker *w,
                             const st_chunk_backend *backend)
{
    const st_train_config *cfg = r->cfg;
    const int g = sy->group_of[wid];
    synth_group *G = &sy->groups[g];
    synth_worker *me = &sy->workers[wid];
    ST_TRY(st_worker_init_base(w, wid, r->train->count, backend));
    st_segment_config sc = { .model = cfg->model, .first = G->layer_first,
                             .last = G->layer_last };
    ST_TRY(st_segnet_create(&sc, cfg->batch, &w->arena, &me->net));
    if (!r->sizing)
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
        st_run_set_model_copies(G->comm, k, st_segnet_model(me->net));
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

/* Samples order[first .. first + B) of epoch e + 1 (w's order), as
 * segment G sees them: the images (segment 1) or the synthetic label of
 * the previous cut plus noise; the synthetic label of the next cut (MSE)
 * or the class (last segment).  x is (B, in), s_in and s_out are (K, W),
 * the target is (B, W). */
static void load_batch(const run_shared *r, synth_worker *me, const synth_group *G,
                       const st_worker *w, uint32_t first)
{
    const st_dataset *d = r->train;
    const int B = r->cfg->batch, W = r->cfg->model.width, S = synth_of(r)->segments;
    const int g = G->index;
    const uint64_t e = w->epoch;
    const uint32_t *idx = w->order + first;
    float *x = st_segnet_input(me->net);
    int32_t *y = g == S - 1 ? st_segnet_labels(me->net) : me->y;
    if (g == 0) {
        st_dataset_gather_train(d, e, idx, (size_t)B, x, y);
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
            st_rng n = st_rng_split(&me->noise, e * d->count + first + b);
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
    *loss = slot->loss;
    *lr = st_schedule_lr(&G->schedule, step);
    /* the segment is the worker's own: its update writes the weight
     * copies the next forward reads */
    st_worker_update_model(w, st_segnet_model(me->net), step, *lr);
    slot->times.optimizer += st_run_now_s() - t;
    return ST_OK;
}

/* The group's reduction during the backward (st_comm_reduce_ready): what
 * the calls reduced and updated (the shard from `upto` on; the optimizer's
 * counts of those calls), their time and first failure. */
typedef struct group_overlap {
    synth_group *G;
    st_worker *w;
    int kl;
    const st_param_segment *segs;
    int n_segs;
    uint64_t step;
    float lr;
    size_t upto, updated, bytes;
    double seconds;
    st_status status;
} group_overlap;

/* A tail of w's segment gradient is final: say it, reduce what of the
 * shard every member has said, update that part at once (the group's
 * workers keep replicas: the all-gather brings the masters in after its
 * entry barrier). */
static void group_ready(void *ctx, size_t from)
{
    group_overlap *o = ctx;
    if (o->status != ST_OK)
        return;
    const double t = st_run_now_s();
    st_range done;
    o->status = st_comm_reduce_ready(o->G->comm, o->kl, from, &done);
    if (o->status == ST_OK && done.end > done.begin) {
        st_optim_update(&o->w->optim, st_comm_shard_params(o->G->comm, o->kl),
                        st_comm_shard_grads(o->G->comm, o->kl), o->segs, o->n_segs, done.begin,
                        done.end, o->step, o->lr);
        o->upto = done.begin;
        o->updated += o->w->optim.updated;
        o->bytes += o->w->optim.update_bytes;
    }
    o->seconds += st_run_now_s() - t;
}

/* The group's data parallelism for worker w, member k of its group G (kl
 * on this rank), t: when its compute ended; o: what the backward reduced
 * and updated already.  *loss: the group's mean, for
 * k = 0 of a group within one rank; a group spanning ranks keeps each
 * member's loss for the epoch end instead (the join, synth_join.c). */
static st_status group_update(run_shared *r, st_worker *w, synth_group *G, uint64_t i,
                              uint64_t step, double t, float *loss, float *lr,
                              const group_overlap *o)
{
    synth_worker *me = &synth_of(r)->workers[w->id];
    worker_slot *slot = &r->slots[w->id];
    const int k = st_run_global(r, w->id) - G->first, kl = w->id - G->local_first,
              m = G->count;
    double t1;
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
                    st_comm_shard_grads(G->comm, kl), segs, n_segs, shard.begin, o->upto, step,
                    *lr);
    w->optim.updated += o->updated;
    w->optim.update_bytes += o->bytes;
    t1 = st_run_now_s();
    slot->times.optimizer += t1 - t;
    t = t1;
    ST_TRY(st_comm_all_gather(G->comm, kl));
    /* nothing writes the segment's parameters before its next forward */
    st_model *net = st_segnet_model(me->net);
    if (st_comm_gathers_copies(G->comm, kl))
        st_model_copies_written(net);
    if (st_comm_gathers_blocked(G->comm, kl))
        st_model_blocked_written(net);
    slot->times.reduce += st_run_now_s() - t;
    return ST_OK;
}

st_status st_synth_segment_step(run_shared *r, void *state, st_worker *w, uint64_t i,
                                uint64_t step, float *loss, float *lr)
{
    synth_run *sy = state;
    synth_group *G = &sy->groups[sy->group_of[w->id]];
    synth_worker *me = &sy->workers[w->id];
    worker_slot *slot = &r->slots[w->id];
    const int k = st_run_global(r, w->id) - G->first;
    double t = st_run_now_s();
    uint32_t first = (uint32_t)((i * (uint64_t)G->count + (uint64_t)k) * (uint64_t)r->cfg->batch);
    load_batch(r, me, G, w, first);
    group_overlap o = { G, w, w->id - G->local_first, NULL, 0, step,
                        st_schedule_lr(&G->schedule, step), 0, 0, 0, 0.0, ST_OK };
    if (G->comm) {
        o.segs = st_segnet_segments(me->net, &o.n_segs);
        o.upto = st_comm_shard(G->comm, o.kl).end;
    }
    const int overlap = G->comm && !r->cfg->reduce_after_backward;
    ST_TRY(st_segnet_forward_backward_ready(me->net, &slot->loss, overlap ? group_ready : NULL,
                                            &o));
    ST_TRY(o.status);
    const double t1 = st_run_now_s();
    slot->times.compute += t1 - t - o.seconds;
    slot->times.overlapped += o.seconds;
    ST_TRY(G->comm ? group_update(r, w, G, i, step, t1, loss, lr, &o)
                   : local_update(r, w, G, step, loss, lr));
    if (k == 0) {   /* the group's mean loss over the epoch */
        if (i == 0)
            G->loss_sum = 0.0;
        if (!G->losses)
            G->loss_sum += *loss;
    }
    if (G->losses)   /* its mean is known at the epoch end: the report has the worker's */
        *loss = slot->loss;
    if (w->id == G->local_first)
        atomic_store_explicit(&G->done, step, memory_order_relaxed);
    return ST_OK;
}


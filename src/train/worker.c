/* train/worker.c — a worker's state, batch loading, gradient
 * accumulation and evaluation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/simd.h"
#include "train/worker.h"

st_status st_worker_init_base(st_worker *w, int id, uint32_t n_train,
                              const st_chunk_backend *backend)
{
    char owner[32];
    memset(w, 0, sizeof *w);
    w->id = id;
    snprintf(owner, sizeof owner, "worker %d", id);
    st_arena_init(&w->arena, owner, backend, 0);
    void *order;
    ST_TRY(st_arena_alloc(&w->arena, ST_MEM_WORKSPACE, (size_t)n_train * sizeof(uint32_t), &order));
    w->order = order;
    /* the stored order until the loop draws an epoch's: whatever reads it
     * before a first step (an evaluation's batch norm calibration, through
     * the trainer) reads valid samples; a sizing run's stays untouched */
    if (!st_arena_is_sizing(&w->arena))
        for (uint32_t i = 0; i < n_train; i++)
            w->order[i] = i;
    return ST_OK;
}

/* The model of cfg, on w->storage when it is set. */
static st_status create_model(st_worker *w, const st_train_config *cfg)
{
    if (w->storage.params)
        return st_model_create_on(&cfg->model, cfg->batch, &w->arena, &w->storage, &w->model);
    return st_model_create(&cfg->model, cfg->batch, &w->arena, &w->model);
}

/* The model's companion in the arena: the accumulated gradients' sum. */
static st_status alloc_grad_sum(st_worker *w, const st_train_config *cfg)
{
    w->accumulate = cfg->accumulate;
    w->grad_sum = NULL;
    if (cfg->accumulate <= 1)
        return ST_OK;
    return st_arena_alloc_floats(&w->arena, ST_MEM_GRADIENTS, st_model_grad_count(w->model),
                                 &w->grad_sum);
}

st_status st_worker_build_model(st_worker *w, const st_train_config *cfg)
{
    w->model_mark = st_arena_get_mark(&w->arena);
    ST_TRY(create_model(w, cfg));
    ST_TRY(alloc_grad_sum(w, cfg));
    /* a sizing run's buffers stay untouched: it reads their sizes only */
    if (w->storage.params || st_arena_is_sizing(&w->arena))
        return ST_OK;
    st_model_init_params(w->model, cfg->seed);
    if (cfg->init_params)   /* --init: a checkpoint's weights instead */
        ST_TRY(st_model_load_full_params(w->model, cfg->init_params));
    return ST_OK;
}

/* The caller loads the current values (from the saved masters) next:
 * initial values would only be overwritten. */
st_status st_worker_rebuild_model(st_worker *w, const st_train_config *cfg)
{
    st_model_destroy(w->model);
    w->model = NULL;
    st_arena_rewind(&w->arena, &w->model_mark);
    w->model_mark = st_arena_get_mark(&w->arena);
    ST_TRY(create_model(w, cfg));
    return alloc_grad_sum(w, cfg);
}

st_status st_worker_init(st_worker *w, int id, const st_train_config *cfg, uint32_t n_train,
                         const st_chunk_backend *backend)
{
    ST_TRY(st_worker_init_base(w, id, n_train, backend));
    return st_worker_build_model(w, cfg);
}

st_status st_worker_init_optimizer(st_worker *w, const st_train_config *cfg, size_t begin,
                                   size_t end)
{
    st_optim_config oc = cfg->optim;
    oc.seed = cfg->seed;   /* a bf16-sr state's rounding: the run's seed */
    return st_optim_init_range(&w->optim, &oc, begin, end, &w->arena);
}

void st_worker_destroy(st_worker *w)
{
    st_model_destroy(w->model);
    w->model = NULL;
    free(w->split_scratch);
    w->split_scratch = NULL;
    st_arena_release(&w->arena);
}

void st_worker_load_batch(st_worker *w, const st_dataset *d, const uint32_t *order,
                          uint32_t first, int rows)
{
    const int B = st_model_batch(w->model);
    float *x = st_model_input(w->model);
    int32_t *y = st_model_labels(w->model);
    if (!order) {   /* stored order: the rows, then zero padding to B */
        st_dataset_gather_rows(d, first, rows, B, x, y);
        return;
    }
    st_dataset_gather_train(d, w->epoch, order + first, (size_t)rows, x, y);
    if (rows < B) {
        const size_t L = st_dataset_labels_per_sample(d);
        memset(x + (size_t)rows * d->dim, 0, (size_t)(B - rows) * d->dim * sizeof *x);
        memset(y + (size_t)rows * L, 0, (size_t)(B - rows) * L * sizeof *y);
    }
}

/* sum += g, over n */
ST_VECTOR_CLONES
static void add_into(float *restrict sum, const float *restrict g, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        sum[i] += g[i];
}

/* g = (sum + g) * scale: the last micro-batch's gradient added, the mean */
ST_VECTOR_CLONES
static void add_and_scale(float *restrict g, const float *restrict sum, size_t n, float scale)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        g[i] = (sum[i] + g[i]) * scale;
}

/* The last micro-batch's backward, in parts: each tail its layers make
 * final gets the sum added and the scale at once, then goes to the
 * caller's ready (the reduction during the backward).  Element-wise: the
 * same bits as one pass after the backward. */
typedef struct last_batch {
    float *g;
    const float *sum;
    float scale;
    size_t upto;   /* [upto, n) holds the mean already */
    void (*ready)(void *ctx, size_t from);
    void *ctx;
} last_batch;

static void last_batch_ready(void *ctx, size_t from)
{
    last_batch *lb = ctx;
    if (from < lb->upto) {
        add_and_scale(lb->g + from, lb->sum + from, lb->upto - from, lb->scale);
        lb->upto = from;
    }
    if (lb->ready)
        lb->ready(lb->ctx, from);
}

/* K micro-batches: the first gradient copied, the next added, the last
 * added and the sum scaled by 1/K in one pass, so that the gradient
 * vector holds the mean where the reduction and the update read it; with
 * `ready`, that pass runs on each part of the last backward as it is
 * final, which is then said ready. */
static st_status compute_accumulated(st_worker *w, const st_dataset *d, const uint32_t *order,
                                     uint32_t first, float *loss,
                                     void (*ready)(void *ctx, size_t from), void *ctx)
{
    st_model *m = w->model;
    const int K = w->accumulate, B = st_model_batch(m);
    const size_t n = st_model_grad_count(m);
    float *g = st_model_grads(m);
    double sum = 0.0;
    for (int k = 0; k < K; k++) {
        float l;
        st_worker_load_batch(w, d, order, first + (uint32_t)k * (uint32_t)B, B);
        if (k + 1 == K) {
            last_batch lb = { g, w->grad_sum, 1.0f / (float)K, n, ready, ctx };
            ST_TRY(st_model_forward_backward_ready(m, &l, ready ? last_batch_ready : NULL,
                                                   &lb));
            sum += l;
            if (lb.upto > 0)
                add_and_scale(g, w->grad_sum, lb.upto, lb.scale);
            break;
        }
        ST_TRY(st_model_forward_backward(m, &l));
        sum += l;
        if (k == 0)
            memcpy(w->grad_sum, g, n * sizeof *g);
        else
            add_into(w->grad_sum, g, n);
        /* the weights stay until the update, and the forward just made
         * their bf16 copies: the next micro-batch's need not convert */
        st_model_copies_current(m);
    }
    *loss = (float)(sum / K);
    return ST_OK;
}

st_status st_worker_compute(st_worker *w, const st_dataset *d, const uint32_t *order,
                            uint32_t first, float *loss)
{
    return st_worker_compute_ready(w, d, order, first, loss, NULL, NULL);
}

st_status st_worker_compute_ready(st_worker *w, const st_dataset *d, const uint32_t *order,
                                  uint32_t first, float *loss,
                                  void (*ready)(void *ctx, size_t from), void *ctx)
{
    if (w->accumulate > 1)
        return compute_accumulated(w, d, order, first, loss, ready, ctx);
    st_worker_load_batch(w, d, order, first, st_model_batch(w->model));
    return st_model_forward_backward_ready(w->model, loss, ready, ctx);
}

st_status st_worker_train_step(st_worker *w, const st_dataset *d, const uint32_t *order,
                               uint32_t first, const st_schedule *schedule, uint64_t step,
                               float *loss, float *lr)
{
    ST_TRY(st_worker_compute(w, d, order, first, loss));
    *lr = st_schedule_lr(schedule, step);
    st_worker_update_own(w, step, *lr);
    return ST_OK;
}

void st_worker_update_own(st_worker *w, uint64_t step, float lr)
{
    st_worker_update_model(w, w->model, step, lr);
}

void st_worker_update_model(st_worker *w, st_model *m, uint64_t step, float lr)
{
    int n_segs, n_copies, n_blocked;
    const st_param_segment *segs = st_model_segments(m, &n_segs);
    const st_param_copy *copies = st_model_copies(m, &n_copies);
    const st_param_blocked *blocked = st_model_blocked_copies(m, &n_blocked);
    st_optim_update_blocked(&w->optim, st_model_params(m), st_model_grads(m), segs, n_segs, 0,
                            st_model_param_count(m), step, lr, copies, n_copies, blocked,
                            n_blocked);
    st_model_copies_current(m);
}

st_status st_worker_evaluate(st_worker *w, const st_dataset *d, double *loss, double *acc)
{
    const int B = st_model_batch(w->model);
    double loss_sum = 0.0;
    int64_t correct = 0;
    /* The test set in its stored order, in batches of B, the last one
     * padded: the model was built for B rows and padding rows are ignored. */
    for (uint32_t first = 0; first < d->count; first += (uint32_t)B) {
        int rows = d->count - first < (uint32_t)B ? (int)(d->count - first) : B;
        st_worker_load_batch(w, d, NULL, first, rows);
        ST_TRY(st_model_evaluate(w->model, rows, &loss_sum, &correct));
    }
    /* per label: a text set's are its tokens */
    const double n = (double)d->count * st_dataset_labels_per_sample(d);
    *loss = loss_sum / n;
    *acc = (double)correct / n;
    return ST_OK;
}

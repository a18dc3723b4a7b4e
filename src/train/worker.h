/*
 * train/worker.h — private: everything one worker owns.
 *
 * A worker is one thread.  Its arena, model instance (oneDNN engine,
 * stream, primitives, workspace), parameters, gradients and optimizer state
 * are created by that thread and used only by it, so that a later worker can
 * be pinned to a core and have all of this on its own NUMA node.
 */
#ifndef SUBTRAIN_TRAIN_WORKER_H
#define SUBTRAIN_TRAIN_WORKER_H

#include <subtrain/train.h>

#include "core/arena_impl.h"
#include "optim/optim_impl.h"

typedef struct st_worker {
    int id;
    st_arena arena;
    st_model *model;
    st_optim optim;
    uint32_t *order;      /* this epoch's sample order (shared data, own copy) */
    uint64_t epoch;       /* the epoch order was drawn for (st_epoch_order's):
                           * with the sample, it keys the augmentation */
    uint32_t *split_scratch; /* a non-iid split's permutations (st_split_largest
                              * entries, malloc'd; NULL: iid) */
    st_arena_mark model_mark; /* the arena before the model: a rebuild rewinds here */
    int accumulate;       /* micro-batches a step (cfg->accumulate; <= 1: one) */
    float *grad_sum;      /* accumulate > 1: the sum of a step's first
                           * micro-batches' gradients (the model's gradient
                           * count, after the model in the arena) */
    st_model_storage storage; /* where its model's weights live when they are its
                               * NUMA domain's copy (run.h, shared_weights.c); zero:
                               * its model's own */
} st_worker;

/* Arena (chunks from `backend`, NULL: the C library), model instance and
 * order buffer.  Must be called on the worker's own thread: that thread
 * first-touches every buffer and owns the oneDNN objects. */
st_status st_worker_init(st_worker *w, int id, const st_train_config *cfg,
                         uint32_t n_train, const st_chunk_backend *backend);

/* The two halves of st_worker_init, for callers that allocate something
 * that must outlive a model rebuild (optimizer state, saved master values)
 * in between: the arena and the order buffer; then the model (which marks
 * the arena first), initialised from the seed or cfg->init_params, or, on
 * w->storage when it is set, built over it and not initialised (its
 * values are written once for every worker that reads them). */
st_status st_worker_init_base(st_worker *w, int id, uint32_t n_train,
                              const st_chunk_backend *backend);
st_status st_worker_build_model(st_worker *w, const st_train_config *cfg);

/* Destroys the model and everything allocated after it (a reduction
 * engine's buffers included) and builds the model of `cfg`: a new round of
 * subnetworks.  Creates primitives: between steps, never during one.  The
 * parameters are not initialised: the caller loads their current values. */
st_status st_worker_rebuild_model(st_worker *w, const st_train_config *cfg);

/* Optimizer state for parameters [begin, end): everything for a worker
 * that updates alone, its shard for a shard owner. */
st_status st_worker_init_optimizer(st_worker *w, const st_train_config *cfg, size_t begin,
                                   size_t end);
void st_worker_destroy(st_worker *w);

/* Copies samples order[first .. first + rows) (samples first .. first + rows
 * when order is NULL) into the model's input, and pads the rest of the batch with zeros (label 0) when rows < batch.
 * With an order (training), the data's augmentation of epoch w->epoch is applied. */
void st_worker_load_batch(st_worker *w, const st_dataset *d, const uint32_t *order,
                          uint32_t first, int rows);

/* The compute half of a step: load samples order[first .. first + B),
 * forward, backward; the gradient vector is then complete.  With
 * w->accumulate = K > 1, K micro-batches of B samples from order[first]
 * on: the gradient vector holds the mean of their gradients and *loss
 * the mean of their losses. */
st_status st_worker_compute(st_worker *w, const st_dataset *d, const uint32_t *order,
                            uint32_t first, float *loss);
/* The same, telling ready(ctx, from) as the backward completes the
 * gradient vector's tail [from, ...) (st_model_forward_backward_ready);
 * with micro-batches (accumulate > 1), during the last one's backward,
 * each tail once it holds the mean. */
st_status st_worker_compute_ready(st_worker *w, const st_dataset *d, const uint32_t *order,
                                  uint32_t first, float *loss,
                                  void (*ready)(void *ctx, size_t from), void *ctx);

/* One training step of a worker that updates alone, the hot path: compute,
 * then the optimizer over the whole vector with the schedule's rate for
 * `step` (1-based).  Allocates nothing, creates nothing, takes no lock. */
st_status st_worker_train_step(st_worker *w, const st_dataset *d, const uint32_t *order,
                               uint32_t first, const st_schedule *schedule, uint64_t step,
                               float *loss, float *lr);

/* The update half of that step: the optimizer (whose state covers the
 * whole vector) over the model's own vector, writing its bf16 weight
 * copies as well (bf16), which the next training forward then need not
 * make.  Only for a worker whose vector nothing else writes between this
 * and its next forward (one worker alone: no engine, no write-back). */
void st_worker_update_own(st_worker *w, uint64_t step, float lr);
/* The same over m, a model of w's other than w->model (synth's segment). */
void st_worker_update_model(st_worker *w, st_model *m, uint64_t step, float lr);

/* Mean loss and accuracy of the worker's current parameters on `d`. */
st_status st_worker_evaluate(st_worker *w, const st_dataset *d, double *loss,
                             double *acc);

#endif /* SUBTRAIN_TRAIN_WORKER_H */

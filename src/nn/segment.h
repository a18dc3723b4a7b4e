/*
 * nn/segment.h — private: a segment of an mlp, trained on its own against
 * synthetic intermediate labels (train/synth.c; numbering and cut placement
 * in include/subtrain/synth.h).
 *
 * A segment holds linear layers first .. last of the mlp (1-based; layer
 * depth + 1 is the head) with the activations between them, preceded by
 * the activation of the cut before it when first > 1:
 *
 *   first segment:  x (B, in_dim) -> fc -> act -> ... -> fc -> y (B, W)      MSE to t (B, W)
 *   middle segment: x (B, W) -> act -> fc -> ... -> fc -> y (B, W)            MSE to t (B, W)
 *   last segment:   x (B, W) -> act -> fc -> ... -> head -> logits (B, K)     cross-entropy
 *
 * Its parameters have the full mlp's names ("fc2.weight", "head.bias"),
 * their layout and their initial values, and are one contiguous range of
 * the full mlp's flat vector: joining the segments is one copy each.
 *
 * Like a model instance, a segment is built once (primitives, buffers from
 * the owner's arena); a training step allocates nothing.
 */
#ifndef SUBTRAIN_NN_SEGMENT_H
#define SUBTRAIN_NN_SEGMENT_H

#include <subtrain/arena.h>
#include <subtrain/model.h>
#include <subtrain/params.h>

typedef struct st_segment_config {
    st_model_config model;  /* the whole mlp */
    int first, last;        /* its linear layers, 1-based, inclusive */
} st_segment_config;

typedef struct st_segnet st_segnet;

/* The shapes, before any segment exists: the one place that says what
 * linear layer l (1-based; depth + 1 is the head) of the mlp m takes and
 * gives (in, out), and how many parameters layers first .. last hold
 * (weights and biases; 0 when last < first).  A segment's range of the
 * full mlp's flat vector starts at st_segment_params(m, 1, first - 1).
 * Used by the segments, the cut planner and the synth groups alike. */
void st_segment_layer_shape(const st_model_config *m, int l, int *in, int *out);
size_t st_segment_params(const st_model_config *m, int first, int last);

/* Matrix-multiply FLOPs of one training step of layers first .. last
 * (batch rows), with the counting of st_model_step_flops: 3 products per
 * layer (forward, weight gradient, input gradient), 2 for the first layer
 * (no segment needs its input's gradient), 2 FLOPs per multiply-add.  The
 * cut planner and the worker split (st_synth_segment_flops) use it. */
double st_segment_flops(const st_model_config *m, int first, int last, int batch);

st_status st_segnet_create(const st_segment_config *cfg, int batch, st_arena *arena,
                           st_segnet **out);
void st_segnet_destroy(st_segnet *s);

/* The values st_model_init_params(seed) gives these layers in the full mlp. */
void st_segnet_init_params(st_segnet *s, uint64_t seed);

int st_segnet_batch(const st_segnet *s);
int st_segnet_in_dim(const st_segnet *s);
int st_segnet_out_dim(const st_segnet *s);
int st_segnet_is_last(const st_segnet *s);   /* ends with the head: cross-entropy */

float *st_segnet_input(st_segnet *s);        /* (B, in): fill before a pass */
float *st_segnet_target(st_segnet *s);       /* (B, W): MSE target; NULL for the last */
int32_t *st_segnet_labels(st_segnet *s);     /* (B): classes; NULL unless the last */
const float *st_segnet_output(const st_segnet *s); /* (B, out) after a pass */

float *st_segnet_params(st_segnet *s);
st_model *st_segnet_model(st_segnet *s);    /* its layers: weight copies, their state */
float *st_segnet_grads(st_segnet *s);
size_t st_segnet_param_count(const st_segnet *s);
const st_param_segment *st_segnet_segments(const st_segnet *s, int *count);
/* Where its parameters start in the full mlp's flat vector. */
size_t st_segnet_full_offset(const st_segnet *s);
/* One forward_backward's work: st_model_step_costs of its layers, and
 * its loss's passes. */
int st_segnet_step_costs(const st_segnet *s, st_step_cost *out, int cap);

/* Forward, loss (mean MSE or cross-entropy over the batch) and backward:
 * the gradient vector is overwritten with dloss/dparams. */
st_status st_segnet_forward_backward(st_segnet *s, float *loss);
/* The same, telling ready(ctx, from) as the backward completes the
 * gradient vector's tail [from, ...) (st_model_forward_backward_ready). */
st_status st_segnet_forward_backward_ready(st_segnet *s, float *loss,
                                           void (*ready)(void *ctx, size_t from), void *ctx);
/* Forward only: the output of the input's rows. */
st_status st_segnet_forward(st_segnet *s);

/* Matrix-multiply FLOPs of one forward_backward, the layers' own count
 * (equal to st_segment_flops, tests/test_synth.c). */
double st_segnet_step_flops(const st_segnet *s);

#endif /* SUBTRAIN_NN_SEGMENT_H */

/*
 * subtrain/layer_timing.h — one layer's oneDNN primitives timed on their
 * own, outside a model: what bench/bench_conv measures
 * (doc/benchmarks.md).  Each call builds the layer on its own context and
 * memory, runs it with the calling thread's OpenMP thread count, keeps the
 * best of `reps` calls after a warm-up, and frees everything.
 */
#ifndef SUBTRAIN_LAYER_TIMING_H
#define SUBTRAIN_LAYER_TIMING_H

#include <stdint.h>

#include <subtrain/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A 2-D convolution: x (batch, ic, ih, iw), w (oc, ic, kh, kw), square
 * stride, symmetric padding; OH = (IH + 2 pad - KH) / stride + 1. */
typedef struct st_conv_shape {
    int64_t batch, ic, ih, iw;  /* x */
    int64_t oc, kh, kw;         /* w */
    int64_t stride, pad;
} st_conv_shape;

/* 2 FLOPs a multiply-add; a pass is batch oc oh ow ic kh kw of them. */
typedef struct st_conv_timing {
    double fwd, bwd_data, bwd_weights;   /* the three primitives alone, GFLOP/s */
    double layer_fwd, layer_bwd;         /* the layer's calls, reorders and bf16
                                          * conversions included, GFLOP/s */
    double layer_ms;                     /* the layer's forward + backward, ms */
} st_conv_timing;

/* blocked: the primitives on oneDNN's blocked layouts, with reorders from
 * and to the caller's NCHW at the layer's boundaries (a model's default);
 * 0: on the NCHW buffers.  bf16: the passes read bf16 copies (where
 * st_bf16_probe says oneDNN has bf16 kernels). */
st_status st_time_conv(const st_conv_shape *shape, int blocked, int bf16, int reps,
                       st_conv_timing *out);

/* Batch norm (training forward and backward) followed by a ReLU on
 * (batch, channels, height, width), as two layers or (fused) the ReLU in
 * the batch norm, the batch norm plain or blocked as above: *ms, the
 * forward + backward of both, in ms. */
st_status st_time_batchnorm_relu(int64_t batch, int64_t channels, int64_t height,
                                 int64_t width, int blocked, int fused, int reps, double *ms);

#ifdef __cplusplus
}
#endif

#endif /* SUBTRAIN_LAYER_TIMING_H */

/*
 * nn/layers.h — private: the layers a model is built from.
 *
 * Each layer is built once against buffers its model owns (inputs, outputs
 * and their gradients, views into the flat parameter and gradient vectors)
 * and then only executed.  Shapes are row-major with the batch first:
 *   x is (B, in), y is (B, out), w is (out, in), b is (out).
 * (A weight may instead be stored (in, out), see st_linear_io.in_major.)
 * Weight gradients are written, not accumulated: every parameter is used
 * once per step.  Data gradients are written too; where two paths meet (the
 * residual skip) the model adds them explicitly with st_add.
 */
#ifndef SUBTRAIN_NN_LAYERS_H
#define SUBTRAIN_NN_LAYERS_H

#include <subtrain/layer_timing.h>
#include <subtrain/model.h>
#include "nn/dnnl_util.h"

/* ------------------------------------------------------------ linear */

/* A run of consecutive storage rows of a weight matrix: [begin, begin + count). */
typedef struct st_row_run {
    int64_t begin, count;
} st_row_run;

typedef struct st_linear {
    int64_t batch, in, out;
    float scale;           /* of the product, forward and backward */
    int scale_bias;        /* the scale applies to the bias too */
    int in_major;          /* w stored (in, out): a row per input neuron */
    int has_dx;            /* 0 for the first layer: nobody needs dL/dx */
    int has_dw;            /* 0 under backward masking: no weight gradients */
    st_prim fwd;           /* y = x w^T + b */
    st_prim bwd_data;      /* dx = dy w */
    /* Weight gradients, one product per run of kept storage rows (one run:
     * the whole matrix), and the bias gradient(s): per run when the rows
     * are output neurons (out-major), else one over every output. */
    st_prim *bwd_weights;  /* n_runs: dw[run] = dy^T x restricted to the run */
    st_prim *bwd_bias;     /* n_bias: db = sum over the batch of dy */
    int n_runs, n_bias;
    /* dy_half: the bias gradients are column sums of the bf16 dy, a loop
     * of its own (n_bias of them; bwd_bias unused) */
    struct st_linear_colsum { int64_t o0, n; float *db; } *colsums;
    int64_t dw_rows;       /* storage rows with a weight gradient */
    /* bf16 (st_linear_io.bf16): the three products read bf16 copies of
     * w, x and dy, made by these reorders (round to nearest even), and
     * write fp32.  wb and xb are the layer's own (xb is read again by the
     * backward); dyb lives in the context's shared slot ST_SLOT_IN, within
     * one backward. */
    int bf16;
    st_prim to_bf16_w;     /* w (f32 storage) -> wb, before each forward
                            * unless the update wrote wb (copy w_copy of
                            * the context, st_nn_copy_fresh) */
    int w_copy;
    st_prim to_bf16_x;     /* x -> xb, before each forward */
    st_prim to_bf16_dy;    /* dy -> dyb, before each backward */
    st_bf16 *wb, *xb;
    /* st_linear_io.blocked_weights: no wb; the forward and backward-data
     * products read copies of w in the blocked layouts they picked
     * (format_tag_any), the context's copies w_copy and (with dx) wd_copy,
     * packed before a forward unless the update wrote them */
    int blocked;
    int wd_copy;
    /* st_linear_io.xb, .yb given: x is read where it lies (xb is it, no
     * to_bf16_x), y is written as bf16 */
    int x_half, y_half;
    /* st_linear_io.dyb, .dxb given: dy is read where it lies (no to_bf16_dy;
     * the bias gradient sums it in bf16), dx is written as bf16 */
    int dy_half, dx_half;
    const st_bf16 *dyb;
    /* st_linear_io.unfuse: the bias and the skip added by passes of their
     * own after fwd (for measuring the fusions; NULL handles: fused) */
    st_prim add_bias, add_residual;
    int unfused_bias, unfused_residual;
} st_linear;

typedef struct st_linear_io {
    const float *x; float *y;          /* (B, in), (B, out) */
    const float *residual;             /* NULL, or (B, out) added to y in the same pass */
    float scale;                       /* 0 or 1: none; else y = residual + scale (x w^T + b),
                                        * and the backward scales dy alike */
    int unscaled_bias;                 /* with a scale: y = residual + scale x w^T + b.
                                        * A dropped block loses its bias with its
                                        * product (scale both); dropped neurons
                                        * leave the layer's bias, held by everyone,
                                        * in place (scale the product only) */
    float *dx; const float *dy;        /* dx may be NULL */
    const float *w, *b;                /* (out, in) or, in_major, (in, out); (out) */
    int in_major;                      /* storage of w and dw: a row per input
                                        * neuron, so that a hidden neuron's
                                        * outgoing weights are contiguous */
    float *dw, *db;                    /* both NULL: no weight gradients */
    /* Backward masking of neurons: weight gradients only for these storage
     * rows (sorted, disjoint), stored back to back in dw; for out-major
     * storage db holds the same rows' biases, for in-major all of them.
     * NULL: every row. */
    const st_row_run *dw_runs;
    int n_dw_runs;
    int bf16;                          /* products in bf16 (fp32 accumulation and
                                        * outputs); w, x, y, dx, dy stay fp32
                                        * unless given as bf16 below */
    unsigned unfuse;                   /* ST_UNFUSE_* (subtrain/model.h); only
                                        * without a scale */
    int blocked_weights;               /* bf16: the products read w through
                                        * copies in their kernels' blocked
                                        * layouts (--weight-layout blocked) */
    int relu;                          /* y = max(0, ...): a ReLU post-op, after
                                        * the adds (needs the bias fused) */
    const uint8_t *dx_mask;            /* NULL, or (B, in): dx *= mask, a post-op
                                        * (the folded backward of a ReLU before it) */
    const st_bf16 *dx_deriv;           /* NULL, or (B, in): dx *= it, a post-op
                                        * (the folded backward of a GELU before
                                        * it: its derivative); dx bf16 (dxb) */
    /* bf16 only: x stored as bf16 (the model's tensor, st_tensor.half):
     * the products read it as it is, in place of x's copy; NULL: x (fp32).
     * yb: y written as bf16 (rounded once, after the bias and the ReLU),
     * in place of y; not with a residual or unfused passes. */
    const st_bf16 *xb;
    st_bf16 *yb;
    /* bf16 only: dy stored as bf16, read in place of dy's copy; dx written
     * as bf16 in place of dx (not with a mask post-op: the mask's layer
     * reads fp32).  NULL: fp32. */
    const st_bf16 *dyb;
    st_bf16 *dxb;
} st_linear_io;

st_status st_linear_build(st_nn_ctx *ctx, st_linear *l, int64_t batch, int64_t in,
                          int64_t out, const st_linear_io *io);
st_status st_linear_forward(const st_nn_ctx *ctx, const st_linear *l);
/* The same again in the step whose forward converted the weights (a
 * recomputed forward, bf16): without their conversion. */
st_status st_linear_forward_again(const st_nn_ctx *ctx, const st_linear *l);
/* The forward of an inference pass: as st_linear_forward, but a blocked
 * copy only the backward reads is not brought up to date. */
st_status st_linear_forward_infer(const st_nn_ctx *ctx, const st_linear *l);
st_status st_linear_backward(const st_nn_ctx *ctx, const st_linear *l);

/* ------------------------------------------------------------ activation */

typedef struct st_act {
    st_prim fwd, bwd;
    /* bf16 (with a backward): the input the backward reads is kept as a
     * bf16 copy xb (the layer's own, ST_MEM_ACTIVATIONS), made by `keep`
     * in each training forward, and converted back by `unkeep` into an
     * fp32 scratch in the context's shared slot ST_SLOT_IN (alive within
     * the backward only), which the fp32 backward primitive reads: so x
     * itself is not read after the forward (see activation.c). */
    int bf16;
    st_prim keep, unkeep;
    st_bf16 *xb;
    /* A ReLU its producer ran (a linear layer's post-op): no forward of
     * its own; the backward reads y (bf16: y's kept copy) */
    int fused;
    /* Folded: its backward is the next linear layer's, which multiplies
     * its input gradient by mask = (y > 0) (u8, the layer's own), written
     * by `make_mask` in each training forward; it runs no backward. */
    uint8_t *mask;
    st_prim make_mask;
    /* Built by the _half variants below (--activation-precision bf16): x
     * and y are bf16 tensors; the backward reads x itself (xb is x, no
     * keep), widened by `unkeep` as above. */
    int x_half;
    st_prim bwd_hint;      /* st_act_build_half: the fp32 forward the backward
                            * was created from (never run) */
    /* A folded GELU (st_act_build_folded_gelu): each training forward
     * writes y and, over x, deriv = gelu'(x), which the next linear
     * layer's backward-data product multiplies its input gradient by; it
     * runs no backward and no oneDNN primitive. */
    st_bf16 *deriv, *y;
    int64_t n;
} st_act;

/* y = act(x), dx = act'(x) * dy, all (rows, cols).  bf16: the backward
 * reads x rounded to bf16 (above); y is computed from x, unchanged. */
st_status st_act_build(st_nn_ctx *ctx, st_act *a, st_activation kind, int64_t rows,
                       int64_t cols, const float *x, float *y, float *dx,
                       const float *dy, int bf16);
/* The backward of a ReLU fused into the layer that wrote y = max(0, x):
 * dx = (y > 0) dy, which is (x > 0) dy; the forward only keeps y's bf16
 * copy (bf16, the copy the backward reads). */
st_status st_act_build_fused_relu(st_nn_ctx *ctx, st_act *a, int64_t rows, int64_t cols,
                                  const float *y, float *dx, const float *dy, int bf16);
/* The same, its backward folded into the next layer's (the mask above). */
st_status st_act_build_folded_relu(st_nn_ctx *ctx, st_act *a, int64_t rows, int64_t cols,
                                   const float *y);
/* The same three over bf16 tensors (x and y both stored as bf16,
 * --activation-precision bf16): the forward is oneDNN's bf16 eltwise
 * (fp32 math inside, y rounded once), the backward the fp32 primitive on
 * x widened into the slot, as above; a fused ReLU's y and a folded one's
 * mask read the bf16 y. */
st_status st_act_build_half(st_nn_ctx *ctx, st_act *a, st_activation kind, int64_t rows,
                            int64_t cols, const st_bf16 *x, st_bf16 *y, float *dx,
                            const float *dy);
/* The same with dx and dy bf16 tensors too: the backward is oneDNN's bf16
 * eltwise on x as it lies (fp32 math inside, dx rounded once). */
st_status st_act_build_half_grads(st_nn_ctx *ctx, st_act *a, st_activation kind,
                                  int64_t rows, int64_t cols, const st_bf16 *x, st_bf16 *y,
                                  st_bf16 *dx, const st_bf16 *dy);
st_status st_act_build_fused_relu_half(st_nn_ctx *ctx, st_act *a, int64_t rows, int64_t cols,
                                       const st_bf16 *y, float *dx, const float *dy);
/* GELU over bf16 x and y whose backward the next linear layer runs: the
 * forward writes y = gelu(x) and gelu'(x) over x (nn/gelu.h), the next
 * layer's backward-data product writes dx = gelu'(x) * (its product)
 * rounded once to bf16, where the unfolded layer rounds its product to
 * bf16 dy and then act'(x) dy again. */
void st_act_build_folded_gelu(st_act *a, int64_t rows, int64_t cols, st_bf16 *x, st_bf16 *y);
st_status st_act_build_folded_relu_half(st_nn_ctx *ctx, st_act *a, int64_t rows, int64_t cols,
                                        const st_bf16 *y);
/* A training forward (bf16: keeps x's copy for the backward). */
st_status st_act_forward(const st_nn_ctx *ctx, const st_act *a);
/* An inference forward: y only, nothing kept. */
st_status st_act_infer(const st_nn_ctx *ctx, const st_act *a);
st_status st_act_backward(const st_nn_ctx *ctx, const st_act *a);

/* ------------------------------------------------------------ layer norm */

typedef struct st_layernorm {
    st_prim fwd, bwd;
    /* bf16 (st_layernorm_io.bf16, with a backward): the input the backward
     * reads is kept as xb = bf16(x - mean), the layer's own
     * (ST_MEM_ACTIVATIONS), written after each training forward, and the
     * backward reads mean + xb, rebuilt in fp32 in the context's shared
     * slot ST_SLOT_IN (alive within the backward only); mean and var stay
     * fp32.  So x itself is not read after the forward (layernorm.c). */
    int bf16;
    int64_t rows, cols;
    const float *x;
    float *mean;
    dnnl_memory_t xs_mem;  /* the fp32 scratch in the slot (its handle is
                            * attached by st_nn_ctx_finalize) */
    st_bf16 *xb;
    /* --activation-precision bf16: y is a bf16 tensor, written by a pass of
     * subtrain's own (layernorm.c) with the statistics and xb, not by the
     * forward primitive (oneDNN 2.6's takes one data type) */
    st_bf16 *yb;
    const float *gamma, *beta;
    float *var;
} st_layernorm;

typedef struct st_layernorm_io {
    const float *x; float *y;          /* (B, C) */
    st_bf16 *yb;                       /* or y as bf16, in place of y */
    float *mean, *var;                 /* (B) saved for backward */
    const float *gamma, *beta;         /* (C) */
    float *dx; const float *dy;        /* (B, C) */
    float *dgamma, *dbeta;             /* (C) */
    int bf16;                          /* keep x for the backward in bf16 (above) */
} st_layernorm_io;

#define ST_LAYERNORM_EPS 1e-5f

st_status st_layernorm_build(st_nn_ctx *ctx, st_layernorm *n, int64_t rows,
                             int64_t cols, const st_layernorm_io *io);
/* A training forward (bf16: keeps x's centred copy for the backward). */
st_status st_layernorm_forward(const st_nn_ctx *ctx, const st_layernorm *n);
/* An inference forward: y (and the statistics) only, nothing kept. */
st_status st_layernorm_infer(const st_nn_ctx *ctx, const st_layernorm *n);
st_status st_layernorm_backward(const st_nn_ctx *ctx, const st_layernorm *n);

/* ------------------------------------------------------------ add */

/* out = a + b, (rows, cols); out may alias a (in-place accumulation). */
typedef struct st_add {
    st_prim prim;
} st_add;

st_status st_add_build(st_nn_ctx *ctx, st_add *r, int64_t rows, int64_t cols,
                       const float *a, const float *b, float *out);
st_status st_add_run(const st_nn_ctx *ctx, const st_add *r);

/* ------------------------------------------------------------ attention */

/* Causal multi-head self-attention of B samples of T tokens, H heads of
 * dh (attention.c says how):
 *   x (B T, 3 H dh)  per token q, k, v, each head-major;  y (B T, H dh).
 * bf16: the six products read bf16 copies of their operands (x's, once
 * per forward; P; dy's and dS's in the backward) and accumulate and write
 * fp32; the scores, the softmax and its backward's math stay fp32. */
typedef struct st_attention_io {
    const float *x; float *y;
    float *dx; const float *dy;   /* dx NULL: forward only */
    void *probs;                  /* P, kept for the backward: st_attention_probs_bytes */
    float *scratch;               /* st_attention_scratch_floats, shared with other
                                   * layers' passes (nothing in it outlives one) */
    int bf16;
    int noncausal;                /* 1: every token attends to every token (a ViT's
                                   * encoder); 0: to itself and those before it */
    /* bf16 only: x stored as bf16 (the model's tensor): Q, K, V are read
     * from it, in place of x's copy; NULL: x.  yb: y (P V) written as
     * bf16, in place of y. */
    const st_bf16 *xb;
    st_bf16 *yb;
    /* bf16 only: dy stored as bf16, read in place of dy's copy; dx (dQ, dK,
     * dV) written as bf16 in place of dx.  NULL: fp32. */
    const st_bf16 *dyb;
    st_bf16 *dxb;
} st_attention_io;

typedef struct st_attention {
    int64_t batch, heads, tokens, head_dim;
    float scale;           /* 1 / sqrt(head_dim) */
    st_prim scores, softmax, context;           /* forward */
    st_prim d_v, d_probs, d_softmax, d_q, d_k;  /* backward (d_softmax: fp32 only) */
    int has_dx;
    int noncausal;         /* st_attention_io.noncausal: no mask */
    float *S;              /* the scores the causal mask writes: in P's buffer (fp32),
                            * in the scratch (bf16) */
    /* bf16 (st_attention_io.bf16): xb is the layer's own copy of x (read
     * again by the backward); pb is P, kept in bf16 only, and the backward
     * writes dS over it (pb then holds dS until the next forward); dp is
     * the scratch, where the backward's dP lands; dyb lives in the
     * context's shared slot ST_SLOT_IN, within one backward. */
    int bf16;
    st_prim to_bf16_x;     /* x -> xb, before each forward */
    st_prim to_bf16_p;     /* P (fp32, the scratch) -> pb, after the softmax */
    st_prim to_bf16_dy;    /* dy -> dyb, before each backward */
    st_bf16 *xb, *pb;
    const float *dp;
    int x_half;            /* st_attention_io.xb given: xb is x, no to_bf16_x */
    int dy_half, dx_half;  /* st_attention_io.dyb, .dxb given: no to_bf16_dy; dQ,
                            * dK, dV written as bf16 */
} st_attention;

/* P's bytes (B H T^2 floats, or bf16 values) and the scratch's floats
 * (B H T^2: dP and dS in the backward; in bf16 the scores too). */
size_t st_attention_probs_bytes(int64_t batch, int64_t heads, int64_t tokens, int bf16);
size_t st_attention_scratch_floats(int64_t batch, int64_t heads, int64_t tokens);
/* A backward follows its forward (it reads P, and in bf16 overwrites it). */
st_status st_attention_build(st_nn_ctx *ctx, st_attention *a, int64_t batch, int64_t tokens,
                             int64_t heads, int64_t head_dim, const st_attention_io *io);
st_status st_attention_forward(const st_nn_ctx *ctx, const st_attention *a);
st_status st_attention_backward(const st_nn_ctx *ctx, const st_attention *a);

/* ------------------------------------------------------------ loss */

/* Softmax cross-entropy over (B, K) logits: log-softmax is a oneDNN
 * primitive; the loss and its gradient (softmax - onehot) / B are a short
 * loop over B * K values. */
typedef struct st_xent {
    int64_t batch, classes;
    st_prim logsoftmax;
    const float *logits;
    float *logp;       /* (B, K) */
    float *dlogits;    /* (B, K) */
} st_xent;

st_status st_xent_build(st_nn_ctx *ctx, st_xent *e, int64_t batch, int64_t classes,
                        const float *logits, float *logp, float *dlogits);
/* Summed loss over the first `rows` rows into *loss_sum; when want_grad,
 * also dlogits of the mean loss for them ((softmax - onehot) / rows) and zero
 * for the padding rows.  *correct counts argmax hits when non-NULL. */
st_status st_xent_forward(const st_nn_ctx *ctx, const st_xent *e, const int32_t *labels,
                          int64_t rows, int want_grad, double *loss_sum, int64_t *correct);

/* ------------------------------------------------------------ convolution */

/* 2-D convolution on NCHW activations, in the caller's plain buffers:
 *   x (B, IC, IH, IW), w (OC, IC, KH, KW), b (OC), y (B, OC, OH, OW),
 *   OH = (IH + 2 pad - KH) / stride + 1 (floor, as PyTorch), OW alike.
 * Square stride and symmetric padding (st_conv_shape, public in
 * subtrain/layer_timing.h).  IC and OC are whatever the caller gives: a
 * compact subnetwork builds a smaller convolution over compact buffers
 * (nothing here assumes a full model's sizes). */

static inline int64_t st_conv_out_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad)
{
    return (in + 2 * pad - kernel) / stride + 1;
}

/* layout (dnnl_util.h): PLAIN runs oneDNN's im2col + GEMM kernels on the
 * caller's buffers; BLOCKED its direct kernels on blocked copies (nChw16c
 * activations on AVX-512), with reorders at the layer's boundaries; DEFAULT
 * is BLOCKED, measured faster (doc/benchmarks.md says how much). */
typedef struct st_conv_io {
    const float *x; float *y;   /* (B, IC, IH, IW), (B, OC, OH, OW) */
    const float *w, *b;         /* (OC, IC, KH, KW); (OC), or NULL: no bias */
    float *dx; const float *dy; /* dx NULL: no input gradient (a first layer) */
    float *dw, *db;             /* dw NULL: no weight gradients (db is then unused);
                                 * db is needed iff b is given */
    float scale;                /* 0 or 1: none; else y = scale (conv(x, w) + b),
                                 * and dx, dw, db are scaled alike */
    int unscaled_bias;          /* with a scale: y = scale conv(x, w) + b (db unscaled),
                                 * as st_linear_io's */
    st_layout layout;
    /* The layouts of the caller's x (and dx) and y (and dy) buffers:
     * 0 or dnnl_nchw, or st_blocked_tag() (a model's tensors between
     * blocked layers: no reorder when the primitive runs on it). */
    dnnl_format_tag_t x_tag, y_tag;
    int bf16;                   /* the three passes read bf16 copies of x, w and dy
                                 * (fp32 accumulation, fp32 y, dx, dw, db); the
                                 * caller's buffers stay fp32 */
    /* With bf16: the caller's x, y, dx, dy buffers that hold bf16 values
     * (tensors the graph stores as bf16, --activation-precision bf16): read
     * as they are, or written in bf16 by the pass itself (no reorder when
     * their layout is the primitive's).  y and dx only without a scale. */
    int half_x, half_y, half_dx, half_dy;
    /* y += residual (B, OC, OH, OW), fp32 in y's layout (a skip): a binary
     * post-op of the forward where the kernel takes one, else a pass of
     * its own after it (unfuse_residual: always) */
    const float *residual;
    int unfuse_residual;
} st_conv_io;

typedef struct st_conv {
    st_conv_shape s;
    int64_t oh, ow;
    st_layout layout;           /* the one used: PLAIN or BLOCKED */
    int has_bias, has_dx, has_dw;
    int bf16;                   /* st_conv_io.bf16: the copies of x, w, dy are bf16 */
    float scale;                /* 1: none */
    int64_t y_block;            /* channels per block of y's layout (1: NCHW) */
    int scale_bias;             /* the scale applies to the bias (and db) too */
    int scale_loop;             /* the forward primitive did not take the scale as a
                                 * post-op: a loop scales y */
    float *y, *dx, *dw, *db;    /* the plain buffers the scale loops touch */
    const float *b;             /* an unscaled bias, added by a loop after the scale */
    st_pass fwd;                /* y = conv(x, w) + b [+ residual, fused] */
    int residual_pass;          /* add_residual runs after fwd */
    st_prim add_residual;       /* y += residual, in place */
    st_pass bwd_data;           /* dx = conv^T(dy, w) */
    st_pass bwd_weights;        /* dw = corr(x, dy), db = sum of dy */
} st_conv;

/* The backward reads what the forward left (blocked copies of x and w), so
 * a backward follows its forward, with the same x and w.  In bf16 the
 * backward reads x only through the forward's bf16 copy: x's buffer may
 * be overwritten once the forward has run (graph.c's assign_forward_only). */
st_status st_conv_build(st_nn_ctx *ctx, st_conv *c, const st_conv_shape *shape,
                        const st_conv_io *io);
st_status st_conv_forward(const st_nn_ctx *ctx, const st_conv *c);
/* Input gradient (if built), then weight and bias gradients (if built). */
st_status st_conv_backward(const st_nn_ctx *ctx, const st_conv *c);

/* Multiply-adds of one product (forward = backward-data = backward-weights):
 * B OC OH OW IC KH KW; FLOPs count 2 per multiply-add. */
double st_conv_pass_flops(const st_conv_shape *shape);
/* Forward + backward-data + backward-weights FLOPs of a built layer (the
 * passes it has; the bias is not counted). */
double st_conv_flops(const st_conv *c);

/* A standalone timing (timing.c; public as st_time_conv): builds the
 * convolution on its own context and arena, with the calling thread's
 * OpenMP thread count, and returns each pass's rate, best of `reps` after a
 * warm-up.  fwd, bwd_data, bwd_weights: the primitives alone;
 * layer_*: the layer's calls, reorders included (the same numbers for the
 * plain layout). */
typedef struct st_conv_rates {
    st_layout layout;           /* the one timed */
    double fwd, bwd_data, bwd_weights;       /* GFLOP/s */
    double layer_fwd, layer_bwd;             /* GFLOP/s */
    double layer_ms;                         /* forward + backward, ms */
} st_conv_rates;

st_status st_conv_reference_gflops(const st_conv_shape *shape, st_layout layout,
                                   int reps, st_conv_rates *out);
/* The same with the passes in bf16 (st_conv_io.bf16): the primitives
 * alone on bf16 operands; the layer's calls with the conversions. */
st_status st_conv_reference_gflops_as(const st_conv_shape *shape, st_layout layout, int bf16,
                                      int reps, st_conv_rates *out);

/* ------------------------------------------------------------ pooling */

/* Max pooling (kernel x kernel windows, square stride, symmetric padding;
 * padding never wins the max) and global average pooling, NCHW:
 *   max:    x (B, C, H, W) -> y (B, C, OH, OW), OH = (H + 2 pad - k) / stride + 1
 *   global: x (B, C, H, W) -> y (B, C), the mean over H x W.
 * The max pool's forward keeps oneDNN's workspace (where each maximum came
 * from) for its backward. */
typedef struct st_pool_io {
    const float *x; float *y;
    float *dx; const float *dy;  /* dx NULL: forward only */
    dnnl_format_tag_t x_tag, y_tag; /* of x and dx, y and dy (see st_conv_io) */
    /* Buffers holding bf16 values (see st_conv_io): the primitives run in
     * x's data type, and reorders convert the others' */
    int half_x, half_y, half_dx, half_dy;
} st_pool_io;

typedef struct st_pool {
    int64_t batch, channels, ih, iw, oh, ow, kernel_h, kernel_w, stride, pad;
    int has_dx;
    st_pass fwd, bwd;
    void *workspace;             /* max pooling, from the arena */
} st_pool;

st_status st_maxpool_build(st_nn_ctx *ctx, st_pool *p, int64_t batch, int64_t channels,
                           int64_t height, int64_t width, int64_t kernel, int64_t stride,
                           int64_t pad, const st_pool_io *io);
st_status st_global_avgpool_build(st_nn_ctx *ctx, st_pool *p, int64_t batch,
                                  int64_t channels, int64_t height, int64_t width,
                                  const st_pool_io *io);
st_status st_pool_forward(const st_nn_ctx *ctx, const st_pool *p);
st_status st_pool_backward(const st_nn_ctx *ctx, const st_pool *p);

/* ------------------------------------------------------------ batch norm */

/* Batch normalisation of x (B, C, H, W), NCHW, per channel over B H W:
 *   y = (x - mean) / sqrt(var + eps) * gamma + beta   [then ReLU, fused]
 * Training: mean, var are the batch's (var biased, 1/N), written to the
 * caller's buffers for the backward, and the running statistics are
 * updated as PyTorch does:
 *   running_mean = (1 - m) running_mean + m mean
 *   running_var  = (1 - m) running_var  + m var N / (N - 1)   (unbiased)
 * with m = 0.1, N = B H W.  Inference: the running statistics normalise,
 * nothing is updated.  Backward (of the training forward): dx, dgamma,
 * dbeta, written. */
#define ST_BATCHNORM_EPS 1e-5f
#define ST_BATCHNORM_MOMENTUM 0.1f

typedef struct st_batchnorm_io {
    const float *x; float *y;             /* (B, C, H, W) */
    const float *gamma, *beta;            /* (C) */
    float *mean, *var;                    /* (C) batch statistics, saved for backward */
    float *running_mean, *running_var;    /* (C) */
    float *dx; const float *dy;           /* dy NULL: no backward */
    float *dgamma, *dbeta;                /* (C), needed with dy */
    int fuse_relu;                        /* y = relu(bn(x)), and the backward through both */
    dnnl_format_tag_t tag;                /* of x, y, dx, dy: 0 or dnnl_nchw, or
                                           * st_blocked_tag() (see st_conv_io) */
    int half;                             /* x, y, dx, dy hold bf16 values (see
                                           * st_conv_io): the primitives run in bf16,
                                           * statistics, gamma, beta and their
                                           * gradients staying fp32 */
    st_layout layout;                     /* PLAIN: the primitives on the NCHW buffers;
                                           * BLOCKED: on nChw16c (nChw8c without AVX-512)
                                           * copies, reorders around them; DEFAULT: the
                                           * faster (batchnorm.c) */
} st_batchnorm_io;

typedef struct st_batchnorm {
    int64_t batch, channels, hw;
    int fuse_relu, has_backward;
    st_layout layout;                     /* the one used */
    st_pass fwd_train, fwd_infer, bwd;
    const float *mean, *var;
    float *running_mean, *running_var;
    void *workspace;                      /* fused ReLU: which outputs were cut, from the arena */
} st_batchnorm;

st_status st_batchnorm_build(st_nn_ctx *ctx, st_batchnorm *n, int64_t batch,
                             int64_t channels, int64_t height, int64_t width,
                             const st_batchnorm_io *io);
/* training 1: batch statistics and the running update (needs N = B H W >=
 * 2); 2: the batch statistics only (a recomputed forward); 0: the running
 * statistics. */
st_status st_batchnorm_forward(const st_nn_ctx *ctx, const st_batchnorm *n, int training);
st_status st_batchnorm_backward(const st_nn_ctx *ctx, const st_batchnorm *n);

#endif /* SUBTRAIN_NN_LAYERS_H */

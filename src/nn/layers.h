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
    int64_t dw_rows;       /* storage rows with a weight gradient */
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
} st_linear_io;

st_status st_linear_build(st_nn_ctx *ctx, st_linear *l, int64_t batch, int64_t in,
                          int64_t out, const st_linear_io *io);
st_status st_linear_forward(const st_nn_ctx *ctx, const st_linear *l);
st_status st_linear_backward(const st_nn_ctx *ctx, const st_linear *l);

/* ------------------------------------------------------------ activation */

typedef struct st_act {
    st_prim fwd, bwd;
} st_act;

/* y = act(x), dx = act'(x) * dy, all (rows, cols). */
st_status st_act_build(st_nn_ctx *ctx, st_act *a, st_activation kind, int64_t rows,
                       int64_t cols, const float *x, float *y, float *dx,
                       const float *dy);
st_status st_act_forward(const st_nn_ctx *ctx, const st_act *a);
st_status st_act_backward(const st_nn_ctx *ctx, const st_act *a);

/* ------------------------------------------------------------ layer norm */

typedef struct st_layernorm {
    st_prim fwd, bwd;
} st_layernorm;

typedef struct st_layernorm_io {
    const float *x; float *y;          /* (B, C) */
    float *mean, *var;                 /* (B) saved for backward */
    const float *gamma, *beta;         /* (C) */
    float *dx; const float *dy;        /* (B, C) */
    float *dgamma, *dbeta;             /* (C) */
} st_layernorm_io;

#define ST_LAYERNORM_EPS 1e-5f

st_status st_layernorm_build(st_nn_ctx *ctx, st_layernorm *n, int64_t rows,
                             int64_t cols, const st_layernorm_io *io);
st_status st_layernorm_forward(const st_nn_ctx *ctx, const st_layernorm *n);
st_status st_layernorm_backward(const st_nn_ctx *ctx, const st_layernorm *n);

/* ------------------------------------------------------------ add */

/* out = a + b, (rows, cols); out may alias a (in-place accumulation). */
typedef struct st_add {
    st_prim prim;
} st_add;

st_status st_add_build(st_nn_ctx *ctx, st_add *r, int64_t rows, int64_t cols,
                       const float *a, const float *b, float *out);
st_status st_add_run(const st_nn_ctx *ctx, const st_add *r);

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

#endif /* SUBTRAIN_NN_LAYERS_H */

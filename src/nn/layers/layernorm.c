/* nn/layers/layernorm.c — layer normalisation over the feature axis with a learned
 * scale (gamma) and shift (beta), on oneDNN layer_normalization primitives.
 * Mean and variance of each row are saved by the forward for the backward.
 *
 * In bf16 (--precision bf16) the input the backward reads is kept in
 * bf16, centred on its row's mean: after each training forward
 *   xb[r][c] = bf16(x[r][c] - mean[r])          (round to nearest even)
 * and the backward first rebuilds, in an fp32 scratch in the context's
 * shared slot ST_SLOT_IN (alive within this backward only),
 *   xr[r][c] = mean[r] + fp32(xb[r][c])
 * and runs the same fp32 backward primitive on xr with the fp32 mean and
 * variance the forward saved (the statistics are never rounded).  The
 * forward is unchanged (y from the fp32 x).  Why this is safe: the
 * backward reads x only through x_hat = (x - mean) * rstd, and
 *   xr - mean = bf16(x - mean) (+ an fp32 rounding of 2^-24 |mean|),
 * so x_hat is read with a relative error of 2^-9 per element, whatever
 * the row's offset: dx = rstd (g dy - mean(g dy) - x_hat mean(g dy x_hat))
 * and dgamma = sum dy x_hat move by O(2^-9) relative, the size of the
 * rounding of dy that the linear layer below applies anyway.  (Rounding
 * x itself would cost 2^-9 |x| / std in x_hat: large for a row whose mean
 * is far from 0 in units of its spread; centring first avoids that.)
 * Training stays within tolerance of fp32 (tests/test_cli_precision); the
 * gradients match the fp32 backward of xr (tests/test_layers_rowwise).  What it
 * buys: nobody reads the fp32 x after the forward, so in bf16 the graph
 * lets x's buffer be reused (st_graph_build's pool) and the activations
 * kept for the backward are 2 bytes per element instead of 4. */
#include <math.h>
#include <stdio.h>

#include "core/simd.h"
#include "nn/graph.h"
#include "nn/layers.h"

/* xb[c] = bf16(x[c] - mu), c < n: one row of the centred copy */
ST_VECTOR_CLONES
static void centre_to_bf16(st_bf16 *restrict xb, const float *restrict x, int64_t n, float mu)
{
#pragma omp simd
    for (int64_t c = 0; c < n; c++)
        xb[c] = st_bf16_from_float(x[c] - mu);
}

/* xs[c] = mu + fp32(xb[c]), c < n: one row rebuilt from the copy */
ST_VECTOR_CLONES
static void uncentre_from_bf16(float *restrict xs, const st_bf16 *restrict xb, int64_t n, float mu)
{
#pragma omp simd
    for (int64_t c = 0; c < n; c++)
        xs[c] = mu + st_bf16_to_float(xb[c]);
}

/* The sum of x[c] - mu (squared: the sum of squares), c < n, in 16
 * lanes then across them: the same order in every clone (AVX-512, AVX2,
 * scalar), and a loop GCC vectorises at -O2. */
static inline float lane_sum(const float *restrict x, int64_t n, float mu, int square)
{
    float acc[16] = { 0.0f };
    int64_t c = 0;
    for (; c + 16 <= n; c += 16)
        for (int j = 0; j < 16; j++) {
            const float d = x[c + j] - mu;
            acc[j] += square ? d * d : d;
        }
    for (int j = 0; c < n; c++, j++) {
        const float d = x[c] - mu;
        acc[j] += square ? d * d : d;
    }
    for (int w = 8; w > 0; w /= 2)
        for (int j = 0; j < w; j++)
            acc[j] += acc[j + w];
    return acc[0];
}

/* Rows [0, rows) of x (rows, n): their mean and (biased) variance, y =
 * bf16((x - mean) / sqrt(var + eps) * gamma + beta) and, where xb is not
 * NULL, xb = bf16(x - mean): one pass that reads x once from memory (a
 * row's three loops run on it in L1) and writes 4 bytes an element, where
 * the fp32 primitive, the centred copy and the next product's conversion
 * move 20.  The sums are fp32, in lane_sum's order. */
ST_VECTOR_CLONES_BW
static void norm_rows_bf16(st_bf16 *restrict y, st_bf16 *restrict xb, float *restrict mean,
                           float *restrict var, const float *restrict x,
                           const float *restrict gamma, const float *restrict beta,
                           int64_t rows, int64_t n)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        const float mu = lane_sum(xr, n, 0.0f, 0) / (float)n;
        const float v = lane_sum(xr, n, mu, 1) / (float)n;
        const float rstd = 1.0f / sqrtf(v + ST_LAYERNORM_EPS);
        mean[r] = mu;
        var[r] = v;
        st_bf16 *yr = y + r * n;
        if (xb) {
            st_bf16 *br = xb + r * n;
#pragma omp simd
            for (int64_t c = 0; c < n; c++) {
                const float d = xr[c] - mu;
                yr[c] = st_bf16_from_float(d * rstd * gamma[c] + beta[c]);
                br[c] = st_bf16_from_float(d);
            }
        } else {
#pragma omp simd
            for (int64_t c = 0; c < n; c++)
                yr[c] = st_bf16_from_float((xr[c] - mu) * rstd * gamma[c] + beta[c]);
        }
    }
}

/* y (B, C) = (x - mean) / sqrt(var + eps) * gamma + beta, mean/var (B) */
st_status st_layernorm_build(st_nn_ctx *ctx, st_layernorm *n, int64_t rows, int64_t cols,
                             const st_layernorm_io *io)
{
    memset(n, 0, sizeof *n);
    dnnl_memory_desc_t data_md, stat_md;
    st_md_matrix(&data_md, rows, cols);
    st_md_vector(&stat_md, rows);
    unsigned flags = dnnl_use_scale | dnnl_use_shift;

    dnnl_layer_normalization_desc_t fd, bd;
    ST_DNNL(dnnl_layer_normalization_forward_desc_init(&fd, dnnl_forward_training, &data_md,
                                                       &stat_md, ST_LAYERNORM_EPS, flags),
            "layer norm forward descriptor");
    ST_DNNL(dnnl_layer_normalization_backward_desc_init(&bd, dnnl_backward, &data_md, &data_md,
                                                        &stat_md, ST_LAYERNORM_EPS, flags),
            "layer norm backward descriptor");
    ST_TRY(st_prim_create_pair(ctx, &n->fwd, &fd, &n->bwd, &bd, "layer norm forward",
                               "layer norm backward"));

    dnnl_memory_t x, y, mean, var, gamma, beta, dx, dy, dgamma, dbeta;
    ST_TRY(st_mem_matrix(ctx, &x, rows, cols, io->x));
    dnnl_memory_t src = x;   /* what the backward reads */
    if (io->bf16) {
        void *p;
        ST_TRY(st_arena_alloc(ctx->arena, ST_MEM_ACTIVATIONS,
                              (size_t)(rows * cols) * sizeof(st_bf16), &p));
        n->xb = p;
        n->bf16 = 1;
        ST_TRY(st_mem_slot_md(ctx, &n->xs_mem, &data_md, ST_SLOT_IN, 0,
                              (size_t)(rows * cols) * sizeof(float)));
        src = n->xs_mem;
    }
    n->yb = io->yb;
    n->rows = rows;
    n->cols = cols;
    n->x = io->x;
    n->mean = io->mean;
    n->var = io->var;
    n->gamma = io->gamma;
    n->beta = io->beta;
    if (!n->yb)
        ST_TRY(st_mem_matrix(ctx, &y, rows, cols, io->y));
    ST_TRY(st_mem_vector(ctx, &mean, rows, io->mean));
    ST_TRY(st_mem_vector(ctx, &var, rows, io->var));
    ST_TRY(st_mem_vector(ctx, &gamma, cols, io->gamma));
    ST_TRY(st_mem_vector(ctx, &beta, cols, io->beta));
    ST_TRY(st_mem_matrix(ctx, &dx, rows, cols, io->dx));
    ST_TRY(st_mem_matrix(ctx, &dy, rows, cols, io->dy));
    ST_TRY(st_mem_vector(ctx, &dgamma, cols, io->dgamma));
    ST_TRY(st_mem_vector(ctx, &dbeta, cols, io->dbeta));

    if (!n->yb) {   /* else the forward primitive is the backward's hint, never run */
        st_prim_arg(&n->fwd, DNNL_ARG_SRC, x);
        st_prim_arg(&n->fwd, DNNL_ARG_DST, y);
        st_prim_arg(&n->fwd, DNNL_ARG_MEAN, mean);
        st_prim_arg(&n->fwd, DNNL_ARG_VARIANCE, var);
        st_prim_arg(&n->fwd, DNNL_ARG_SCALE, gamma);
        st_prim_arg(&n->fwd, DNNL_ARG_SHIFT, beta);
    }

    st_prim_arg(&n->bwd, DNNL_ARG_SRC, src);
    st_prim_arg(&n->bwd, DNNL_ARG_MEAN, mean);
    st_prim_arg(&n->bwd, DNNL_ARG_VARIANCE, var);
    st_prim_arg(&n->bwd, DNNL_ARG_SCALE, gamma);
    /* oneDNN 2.6 checks for the shift argument in backward too (it does
     * not read it); without it execution fails with "invalid arguments". */
    st_prim_arg(&n->bwd, DNNL_ARG_SHIFT, beta);
    st_prim_arg(&n->bwd, DNNL_ARG_DIFF_DST, dy);
    st_prim_arg(&n->bwd, DNNL_ARG_DIFF_SRC, dx);
    st_prim_arg(&n->bwd, DNNL_ARG_DIFF_SCALE, dgamma);
    st_prim_arg(&n->bwd, DNNL_ARG_DIFF_SHIFT, dbeta);
    return ST_OK;
}

st_status st_layernorm_infer(const st_nn_ctx *ctx, const st_layernorm *n)
{
    if (n->yb) {
        norm_rows_bf16(n->yb, NULL, n->mean, n->var, n->x, n->gamma, n->beta,
                       n->rows, n->cols);
        return ST_OK;
    }
    return st_prim_run(ctx, &n->fwd);
}

st_status st_layernorm_forward(const st_nn_ctx *ctx, const st_layernorm *n)
{
    if (n->yb) {
        norm_rows_bf16(n->yb, n->xb, n->mean, n->var, n->x, n->gamma, n->beta,
                       n->rows, n->cols);
        return ST_OK;
    }
    ST_TRY(st_prim_run(ctx, &n->fwd));
    if (!n->bf16)
        return ST_OK;
    /* the centred copy (header): rows of x against the mean just saved */
    const int64_t C = n->cols;
    for (int64_t r = 0; r < n->rows; r++)
        centre_to_bf16(n->xb + r * C, n->x + r * C, C, n->mean[r]);
    return ST_OK;
}

st_status st_layernorm_backward(const st_nn_ctx *ctx, const st_layernorm *n)
{
    if (n->bf16) {   /* xr = mean + xb, in the slot (header) */
        void *p = NULL;
        ST_DNNL(dnnl_memory_get_data_handle(n->xs_mem, &p), "layer norm scratch");
        float *xs = p;
        const int64_t C = n->cols;
        for (int64_t r = 0; r < n->rows; r++)
            uncentre_from_bf16(xs + r * C, n->xb + r * C, C, n->mean[r]);
    }
    return st_prim_run(ctx, &n->bwd);
}

/* ------------------------------------------------------------ layer kind */


static st_status norm_layout(st_model *m, st_layer *l)
{
    st_seg_map v = { .full_rows = l->out, .full_cols = 1, .n_rows = l->out, .n_cols = 1,
                     .fan_in = 1 };
    char name[48];
    snprintf(name, sizeof name, "%s.gamma", l->name);
    ST_TRY(st_graph_add_segment(m, name, 0, v, &l->seg[0]));
    snprintf(name, sizeof name, "%s.beta", l->name);
    return st_graph_add_segment(m, name, 0, v, &l->seg[1]);
}

/* Mean and variance per row, saved for the backward. */
static st_status norm_alloc(st_model *m, st_layer *l)
{
    const size_t rows = (size_t)st_graph_rows(m, l->y);
    ST_TRY(st_graph_alloc(m, rows, &l->saved[0]));
    return st_graph_alloc(m, rows, &l->saved[1]);
}

static st_status norm_build(st_model *m, st_layer *l)
{
    st_layernorm_io io = {
        .x = st_graph_data(m, l->x), .y = st_graph_data(m, l->y),
        .yb = st_graph_data_bf16(m, l->y),
        .mean = l->saved[0], .var = l->saved[1],
        .gamma = st_graph_seg_params(m, l->seg[0]), .beta = st_graph_seg_params(m, l->seg[1]),
        .dx = st_graph_data(m, l->dx), .dy = st_graph_data(m, l->dy),
        .dgamma = st_graph_seg_grads(m, l->seg[0]), .dbeta = st_graph_seg_grads(m, l->seg[1]),
        .bf16 = m->cfg.precision == ST_PRECISION_BF16 && l->backward,
    };
    if (!io.dgamma) {   /* backward masking: see st_graph_norm_scratch */
        io.dgamma = st_graph_norm_scratch(m);
        io.dbeta = io.dgamma + l->out;
    }
    return st_layernorm_build(&m->ctx, &l->u.norm, st_graph_rows(m, l->y), l->out, &io);
}

static st_status norm_forward(const st_nn_ctx *ctx, const st_layer *l, st_phase phase)
{
    return phase != ST_PHASE_INFER ? st_layernorm_forward(ctx, &l->u.norm)
                                   : st_layernorm_infer(ctx, &l->u.norm);
}

static st_status norm_backward(const st_nn_ctx *ctx, const st_layer *l)
{
    return st_layernorm_backward(ctx, &l->u.norm);
}

/* fp32: the backward reads x (and the saved statistics); bf16: its own
 * centred copy of x only. */
static unsigned norm_backward_reads(const st_model *m, const st_layer *l)
{
    return m->cfg.precision == ST_PRECISION_BF16 ? 0u : ST_READS_X;
}

/* Its forward (x read, y written) and backward (x, dy read, dx written)
 * as oneDNN's primitives of the kind; a bf16 y: the forward's own pass
 * (x read, y and the centred copy written, 2 bytes each). */
static void norm_costs(const st_model *m, const st_layer *l, int forward_only, st_cost_sink *s)
{
    const double e = (double)st_graph_rows(m, l->y) * (double)l->out;
    const double y = 4.0 * e;   /* the fp32 x's bytes, and the backward's tensors' */
    if (st_graph_is_half(m, l->y))
        st_cost_pass(s, ST_OP_LAYERNORM, 0, e, (forward_only || !l->backward ? 6.0 : 8.0) * e,
                     1.0);
    else
        st_cost_pass(s, ST_OP_LAYERNORM, 0, e, 2.0 * y, 1.0);
    if (!forward_only && l->backward)
        st_cost_pass(s, ST_OP_LAYERNORM, 1, y / 4.0, 3.0 * y, 1.0);
}

/* --activation-precision bf16: y as bf16 (its readers are products,
 * which round it anyway); x, the residual stream, and the gradients stay
 * fp32 (its statistics are fp32 sums over x). */
static unsigned norm_bf16_io(const st_model *m, const st_layer *l)
{
    (void)l;
    return m->cfg.activations == ST_PRECISION_BF16 ? ST_BF16_Y : 0u;
}

const st_layer_kind st_layer_layernorm = {
    .name = "layernorm", .layout = norm_layout, .alloc = norm_alloc, .build = norm_build,
    .forward = norm_forward, .backward = norm_backward, .norm = 1,
    .costs = norm_costs,
    .backward_reads = norm_backward_reads, .bf16_io = norm_bf16_io,
};

/*
 * nn/layers/linear.c — fully connected layer on oneDNN matmul primitives.
 *
 * Why matmul and not inner product: a step is only as fast as its slowest
 * GEMM, and the three products of a linear layer read the weights in two
 * orientations (w^T forward, w backward-data).  Matmul takes any strides, so
 * each product reads the one (out, in) row-major weight buffer in the
 * orientation it needs and oneDNN picks its fastest kernel for that; no
 * transposed copy of the weights is kept.  The same strides let a layer
 * store its weights (in, out) instead (in_major): a residual block's second
 * layer does, so that each hidden neuron's outgoing weights are one
 * contiguous row, like its incoming weights in the first layer, and a
 * neuron subnetwork is a set of whole rows in both.  The three products
 * run at about dnnl_sgemm's rate on the same shape (doc/benchmarks.md).
 *
 * In bf16 (--precision bf16) the same three products read bf16 copies of
 * their operands and accumulate and write fp32: the weights are converted
 * once per forward from the fp32 parameters (the masters every strategy
 * updates and reduces), x once per forward into a copy the weight product
 * reads again, dy once per backward into a shared buffer.  The bias and
 * its gradient, the residual add and the scale stay fp32.  With bf16
 * activations x, y, dx and dy may be bf16 tensors themselves (the graph
 * decides, st_graph_half): the products then read and write them as they
 * lie, and the bias gradient sums the bf16 dy with fp32 accumulation.
 */
#include <stdlib.h>
#include <string.h>

#include <stdio.h>

#include "core/blocked.h"
#include "core/simd.h"
#include "nn/blocked_store.h"
#include "nn/graph.h"
#include "nn/layers.h"

/* Strides of w read as the (in, out) matrix w^T, and as the (out, in)
 * matrix w, for either storage. */
static void wt_strides(const st_linear *l, int64_t *rs, int64_t *cs)
{
    *rs = l->in_major ? l->out : 1;
    *cs = l->in_major ? 1 : l->in;
}

static void w_strides(const st_linear *l, int64_t *rs, int64_t *cs)
{
    *rs = l->in_major ? 1 : l->in;
    *cs = l->in_major ? l->out : 1;
}

/* A product's operand: the f32 buffer, or in bf16 the copy at `half`
 * (the same element offsets). */
static st_status operand(st_nn_ctx *ctx, const st_linear *l, dnnl_memory_t *m, int64_t rows,
                         int64_t cols, int64_t rs, int64_t cs, const float *f32,
                         const st_bf16 *half)
{
    return l->bf16 ? st_mem_strided_bf16(ctx, m, rows, cols, rs, cs, half)
                   : st_mem_strided(ctx, m, rows, cols, rs, cs, f32);
}

static void operand_md(const st_linear *l, dnnl_memory_desc_t *md, int64_t rows, int64_t cols,
                       int64_t rs, int64_t cs)
{
    if (l->bf16)
        st_md_strided_bf16(md, rows, cols, rs, cs);
    else
        st_md_strided(md, rows, cols, rs, cs);
}

/* dy as a backward product reads it, from element `at` on: f32, or in
 * bf16 the converted copy in the shared slot. */
static st_status dy_operand(st_nn_ctx *ctx, const st_linear *l, dnnl_memory_t *m, int64_t rows,
                            int64_t cols, int64_t rs, int64_t cs, const float *dy, int64_t at)
{
    if (!l->bf16)
        return st_mem_strided(ctx, m, rows, cols, rs, cs, dy + at);
    if (l->dy_half)
        return st_mem_strided_bf16(ctx, m, rows, cols, rs, cs, l->dyb + at);
    return st_mem_slot_bf16(ctx, m, rows, cols, rs, cs, ST_SLOT_IN,
                            (size_t)at * sizeof(st_bf16),
                            (size_t)(l->batch * l->out) * sizeof(st_bf16));
}

/* --weight-layout blocked: the copy of w that product pd reads, in the
 * layout it picked for its weights (the storage's rows index its dim
 * row_dim), and its memory object.  The arena's zeros fill the blocks'
 * padding, which no writer touches. */
static st_status blocked_copy(st_nn_ctx *ctx, const st_linear *l, const_dnnl_primitive_desc_t pd,
                              const float *w, int row_dim, int *id, dnnl_memory_t *mem)
{
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    if (!md)
        return st_fail(ST_ERR_INVALID, "linear: a product names no weights layout");
    void *p;
    const int64_t rows = l->in_major ? l->in : l->out, cols = l->in_major ? l->out : l->in;
    const int in_store = ctx->blocked_store && w >= ctx->params &&
                         w + rows * cols <= ctx->params + ctx->params_n;
    if (in_store)
        ST_TRY(st_blocked_store_take(ctx->blocked_store, (size_t)(w - ctx->params), row_dim, md,
                                     &p));
    else
        ST_TRY(st_arena_alloc(ctx->arena, ST_MEM_WEIGHTS, dnnl_memory_desc_get_size(md), &p));
    ST_TRY(st_mem_md(ctx, mem, md, p));
    ST_TRY(st_nn_ctx_add_blocked_copy(ctx, w, p, rows, cols, md, row_dim, id));
    /* the store's: its writers keep it current, this layer never packs it */
    ctx->copies[*id].shared = in_store;
    return ST_OK;
}

/* The weights operand of product pd (destroyed here, NULL without blocked
 * copies), reading w as (k, n): its blocked copy (blocked_copy's
 * arguments), else w or its plain copy through strides. */
static st_status weights_operand(st_nn_ctx *ctx, const st_linear *l,
                                 dnnl_primitive_desc_t pd, const float *w, int64_t k, int64_t n,
                                 int64_t rs, int64_t cs, int row_dim, int *id, dnnl_memory_t *mem)
{
    st_status s = l->blocked ? blocked_copy(ctx, l, pd, w, row_dim, id, mem)
                             : operand(ctx, l, mem, k, n, rs, cs, w, l->wb);
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    return s;
}

/* The weights md of a product reading w as (k, n): bf16 in the layout the
 * kernel picks (format_tag_any) with blocked copies, else w or its copy
 * through strides. */
static void weights_md(const st_linear *l, dnnl_memory_desc_t *md, int64_t k, int64_t n,
                       int64_t rs, int64_t cs)
{
    const int64_t dims[2] = { k, n };
    if (l->blocked)
        st_md_tag_bf16(md, 2, dims, dnnl_format_tag_any);
    else
        operand_md(l, md, k, n, rs, cs);
}

/* y (B, out) = [residual (B, out) +] scale (x (B, in) . w^T (in, out) + b (1, out))
 * or, with an unscaled bias, [residual +] scale x . w^T + b
 * The residual of a skip connection is added by the matmul itself (a binary
 * post-op) while y is still in registers: one pass over y fewer than a
 * separate add, and no buffer for the branch output. */
static st_status build_forward(st_nn_ctx *ctx, st_linear *l, const st_linear_io *io)
{
    int64_t rs, cs;
    wt_strides(l, &rs, &cs);
    dnnl_memory_desc_t x_md, wt_md, b_md, y_md;
    operand_md(l, &x_md, l->batch, l->in, l->in, 1);
    weights_md(l, &wt_md, l->in, l->out, rs, cs);
    st_md_matrix(&b_md, 1, l->out);
    if (l->y_half)
        st_md_strided_bf16(&y_md, l->batch, l->out, l->out, 1);
    else
        st_md_matrix(&y_md, l->batch, l->out);
    /* an unscaled bias is added after the scale, as a post-op; unfused
     * (measuring the fusions) the bias and the skip are passes of their own */
    const int bias_after = !l->scale_bias;
    const dnnl_memory_desc_t *add0 = bias_after ? &b_md : NULL;
    const dnnl_memory_desc_t *add1 = io->residual && !l->unfused_residual ? &y_md : NULL;
    if (!add0) {
        add0 = add1;
        add1 = NULL;
    }
    dnnl_matmul_desc_t d;
    ST_DNNL(dnnl_matmul_desc_init(&d, &x_md, &wt_md, bias_after || l->unfused_bias ? NULL : &b_md,
                                  &y_md),
            "linear forward descriptor");
    dnnl_primitive_desc_t pd = NULL;
    ST_TRY(st_prim_create_fused(ctx, &l->fwd, &d, l->scale, add0, add1, io->relu, NULL,
                                io->relu ? "linear forward with ReLU" : "linear forward",
                                l->blocked ? &pd : NULL));

    dnnl_memory_t x, wt, b, y;
    ST_TRY(weights_operand(ctx, l, pd, io->w, l->in, l->out, rs, cs, l->in_major ? 0 : 1,
                           &l->w_copy, &wt));
    ST_TRY(operand(ctx, l, &x, l->batch, l->in, l->in, 1, io->x, l->xb));
    ST_TRY(st_mem_matrix(ctx, &b, 1, l->out, io->b));
    if (l->y_half)
        ST_TRY(st_mem_strided_bf16(ctx, &y, l->batch, l->out, l->out, 1, io->yb));
    else
        ST_TRY(st_mem_matrix(ctx, &y, l->batch, l->out, io->y));
    int next = 0;   /* the binary adds, in the order they were appended */
    if (bias_after)
        st_prim_arg(&l->fwd, DNNL_ARG_ATTR_MULTIPLE_POST_OP(st_post_op_index(l->scale, add0, next++)) |
                    DNNL_ARG_SRC_1, b);
    else if (!l->unfused_bias)
        st_prim_arg(&l->fwd, DNNL_ARG_BIAS, b);
    if (l->unfused_bias) {   /* y += b, b broadcast over the rows, in place */
        dnnl_binary_desc_t bd;
        ST_DNNL(dnnl_binary_desc_init(&bd, dnnl_binary_add, &y_md, &b_md, &y_md),
                "linear bias add descriptor");
        ST_TRY(st_prim_create(ctx, &l->add_bias, &bd, NULL, "linear bias add (unfused)", NULL));
        st_prim_arg(&l->add_bias, DNNL_ARG_SRC_0, y);
        st_prim_arg(&l->add_bias, DNNL_ARG_SRC_1, b);
        st_prim_arg(&l->add_bias, DNNL_ARG_DST, y);
    }
    if (io->residual && l->unfused_residual) {   /* y += residual, in place */
        dnnl_memory_t res;
        ST_TRY(st_mem_matrix(ctx, &res, l->batch, l->out, io->residual));
        dnnl_binary_desc_t bd;
        ST_DNNL(dnnl_binary_desc_init(&bd, dnnl_binary_add, &y_md, &y_md, &y_md),
                "linear skip add descriptor");
        ST_TRY(st_prim_create(ctx, &l->add_residual, &bd, NULL, "linear skip add (unfused)",
                              NULL));
        st_prim_arg(&l->add_residual, DNNL_ARG_SRC_0, y);
        st_prim_arg(&l->add_residual, DNNL_ARG_SRC_1, res);
        st_prim_arg(&l->add_residual, DNNL_ARG_DST, y);
    } else if (io->residual) {
        dnnl_memory_t res;
        ST_TRY(st_mem_matrix(ctx, &res, l->batch, l->out, io->residual));
        st_prim_arg(&l->fwd, DNNL_ARG_ATTR_MULTIPLE_POST_OP(st_post_op_index(l->scale, add0, next)) |
                    DNNL_ARG_SRC_1, res);
    }
    st_prim_arg(&l->fwd, DNNL_ARG_SRC, x);
    st_prim_arg(&l->fwd, DNNL_ARG_WEIGHTS, wt);
    st_prim_arg(&l->fwd, DNNL_ARG_DST, y);
    return ST_OK;
}

/* dx (B, in) = scale dy (B, out) . w (out, in) */
static st_status build_backward_data(st_nn_ctx *ctx, st_linear *l, const st_linear_io *io)
{
    int64_t rs, cs;
    w_strides(l, &rs, &cs);
    dnnl_memory_desc_t dy_md, w_md, dx_md;
    operand_md(l, &dy_md, l->batch, l->out, l->out, 1);
    weights_md(l, &w_md, l->out, l->in, rs, cs);
    if (l->dx_half)
        st_md_strided_bf16(&dx_md, l->batch, l->in, l->in, 1);
    else
        st_md_matrix(&dx_md, l->batch, l->in);
    dnnl_matmul_desc_t d;
    ST_DNNL(dnnl_matmul_desc_init(&d, &dy_md, &w_md, NULL, &dx_md), "linear backward-data descriptor");
    dnnl_memory_desc_t mask_md = dx_md;
    mask_md.data_type = io->dx_deriv ? dnnl_bf16 : dnnl_u8;
    const int masked = io->dx_mask || io->dx_deriv;
    dnnl_primitive_desc_t pd = NULL;
    ST_TRY(st_prim_create_fused(ctx, &l->bwd_data, &d, l->scale, NULL, NULL, 0,
                                masked ? &mask_md : NULL,
                                io->dx_deriv ? "linear backward data with the GELU's"
                                : io->dx_mask ? "linear backward data with the ReLU's"
                                              : "linear backward data",
                                l->blocked ? &pd : NULL));

    dnnl_memory_t dy, w, dx;
    ST_TRY(weights_operand(ctx, l, pd, io->w, l->out, l->in, rs, cs, l->in_major ? 1 : 0,
                           &l->wd_copy, &w));
    ST_TRY(dy_operand(ctx, l, &dy, l->batch, l->out, l->out, 1, io->dy, 0));
    if (l->dx_half)
        ST_TRY(st_mem_strided_bf16(ctx, &dx, l->batch, l->in, l->in, 1, io->dxb));
    else
        ST_TRY(st_mem_matrix(ctx, &dx, l->batch, l->in, io->dx));
    if (io->dx_mask || io->dx_deriv) {
        dnnl_memory_t mask;
        ST_TRY(st_mem_md(ctx, &mask, &mask_md,
                         io->dx_deriv ? (void *)io->dx_deriv : (void *)io->dx_mask));
        st_prim_arg(&l->bwd_data, DNNL_ARG_ATTR_MULTIPLE_POST_OP(
                        st_post_op_index(l->scale, NULL, 0)) | DNNL_ARG_SRC_1, mask);
    }
    st_prim_arg(&l->bwd_data, DNNL_ARG_SRC, dy);
    st_prim_arg(&l->bwd_data, DNNL_ARG_WEIGHTS, w);
    st_prim_arg(&l->bwd_data, DNNL_ARG_DST, dx);
    return ST_OK;
}

/* Rows [r0, r0 + n) of the weight gradient, written at dw (n rows back to back):
 *   out-major  dw (n, in)  = scale dy[:, r0:r0+n]^T (n, B) . x (B, in)
 *   in-major   dw (n, out) = scale x[:, r0:r0+n]^T (n, B) . dy (B, out)
 * The transposed operand is read through strides, never copied. */
static st_status build_backward_weights(st_nn_ctx *ctx, st_linear *l, st_prim *p,
                                        const st_linear_io *io, int64_t r0, int64_t n, float *dw)
{
    int64_t a_ld = l->in_major ? l->in : l->out, cols = l->in_major ? l->out : l->in;
    dnnl_memory_desc_t at_md, b_md, dw_md;
    operand_md(l, &at_md, n, l->batch, 1, a_ld);
    operand_md(l, &b_md, l->batch, cols, cols, 1);
    st_md_matrix(&dw_md, n, cols);
    dnnl_matmul_desc_t d;
    ST_DNNL(dnnl_matmul_desc_init(&d, &at_md, &b_md, NULL, &dw_md), "linear backward-weights descriptor");
    ST_TRY(st_prim_create_with_post_ops(ctx, p, &d, l->scale, NULL, NULL,
                                        "linear backward weights"));

    dnnl_memory_t at, bmem, dwm;
    if (l->in_major) {   /* x read transposed from row r0 on, dy as it is */
        ST_TRY(operand(ctx, l, &at, n, l->batch, 1, a_ld, io->x + r0, l->xb ? l->xb + r0 : NULL));
        ST_TRY(dy_operand(ctx, l, &bmem, l->batch, cols, cols, 1, io->dy, 0));
    } else {             /* dy read transposed from row r0 on, x as it is */
        ST_TRY(dy_operand(ctx, l, &at, n, l->batch, 1, a_ld, io->dy, r0));
        ST_TRY(operand(ctx, l, &bmem, l->batch, cols, cols, 1, io->x, l->xb));
    }
    ST_TRY(st_mem_matrix(ctx, &dwm, n, cols, dw));
    st_prim_arg(p, DNNL_ARG_SRC, at);
    st_prim_arg(p, DNNL_ARG_WEIGHTS, bmem);
    st_prim_arg(p, DNNL_ARG_DST, dwm);
    return ST_OK;
}

/* db[o0 : o0+n] (1, n) = scale ones (1, B) . dy[:, o0:o0+n] (B, n)  (scale: 1
 * for an unscaled bias)
 * The batch sum as a matrix-vector product: oneDNN 2.6's reduction
 * primitive has only a reference kernel for this shape, slower than the
 * layer's three GEMMs together (doc/benchmarks.md), while matmul runs it
 * at memory speed. */
static st_status build_backward_bias(st_nn_ctx *ctx, st_linear *l, st_prim *p,
                                     const st_linear_io *io, int64_t o0, int64_t n, float *db)
{
    const float *ones;
    ST_TRY(st_nn_ctx_ones(ctx, l->batch, &ones));
    dnnl_memory_desc_t ones_md, dy_md, db_md;
    st_md_matrix(&ones_md, 1, l->batch);
    st_md_strided(&dy_md, l->batch, n, l->out, 1);
    st_md_matrix(&db_md, 1, n);
    dnnl_matmul_desc_t d;
    ST_DNNL(dnnl_matmul_desc_init(&d, &ones_md, &dy_md, NULL, &db_md),
            "linear backward-bias descriptor");
    ST_TRY(st_prim_create_with_post_ops(ctx, p, &d, l->scale_bias ? l->scale : 1.0f, NULL, NULL,
                                        "linear backward bias"));

    dnnl_memory_t mones, dy, dbm;
    ST_TRY(st_mem_matrix(ctx, &mones, 1, l->batch, ones));
    ST_TRY(st_mem_strided(ctx, &dy, l->batch, n, l->out, 1, io->dy + o0));
    ST_TRY(st_mem_matrix(ctx, &dbm, 1, n, db));
    st_prim_arg(p, DNNL_ARG_SRC, mones);
    st_prim_arg(p, DNNL_ARG_WEIGHTS, dy);
    st_prim_arg(p, DNNL_ARG_DST, dbm);
    return ST_OK;
}

/* db (n) = scale * the sum over the rows of dy[:, 0:n] (bf16, row stride
 * ld), accumulated in fp32 row after row: one pass over dy.  Not the
 * ones product above in bf16: oneDNN 2.6's bf16 matmul is slow on a
 * single row (doc/precision.md), and AMX kernels tile 16 rows. */
ST_VECTOR_CLONES_BW
static void colsum_bf16(float *restrict db, const st_bf16 *restrict dy, int64_t rows,
                        int64_t n, int64_t ld, float scale)
{
    for (int64_t c = 0; c < n; c++)
        db[c] = 0.0f;
    for (int64_t r = 0; r < rows; r++) {
        const st_bf16 *row = dy + r * ld;
#pragma omp simd
        for (int64_t c = 0; c < n; c++)
            db[c] += st_bf16_to_float(row[c]);
    }
#pragma omp simd
    for (int64_t c = 0; c < n; c++)
        db[c] *= scale;
}

/* The weight and bias gradients: one product per run of kept rows (their
 * primitive handles live in the arena: the context keeps pointers to them). */
static st_status build_backward_params(st_nn_ctx *ctx, st_linear *l, const st_linear_io *io)
{
    const int64_t rows = l->in_major ? l->in : l->out, cols = l->in_major ? l->out : l->in;
    st_row_run all = { 0, rows };
    const st_row_run *runs = io->dw_runs ? io->dw_runs : &all;
    l->n_runs = io->dw_runs ? io->n_dw_runs : 1;
    l->n_bias = l->in_major ? 1 : l->n_runs;
    for (int i = 0; i < l->n_runs; i++)
        if (runs[i].begin < 0 || runs[i].count < 1 || runs[i].begin + runs[i].count > rows ||
            (i > 0 && runs[i].begin < runs[i - 1].begin + runs[i - 1].count))
            return st_fail(ST_ERR_INVALID, "linear: gradient row run %d [%lld, +%lld) is not "
                           "within %lld rows or not sorted", i, (long long)runs[i].begin,
                           (long long)runs[i].count, (long long)rows);
    void *p;
    ST_TRY(st_arena_alloc(ctx->arena, ST_MEM_WORKSPACE,
                          (size_t)(l->n_runs + l->n_bias) * sizeof(st_prim), &p));
    memset(p, 0, (size_t)(l->n_runs + l->n_bias) * sizeof(st_prim));
    l->bwd_weights = p;
    l->bwd_bias = l->bwd_weights + l->n_runs;
    if (l->dy_half) {
        ST_TRY(st_arena_alloc(ctx->arena, ST_MEM_WORKSPACE,
                              (size_t)l->n_bias * sizeof *l->colsums, &p));
        l->colsums = p;
    }
    int64_t done = 0;
    for (int i = 0; i < l->n_runs; i++) {
        ST_TRY(build_backward_weights(ctx, l, &l->bwd_weights[i], io, runs[i].begin,
                                      runs[i].count, io->dw + done * cols));
        if (!l->in_major && l->dy_half)
            l->colsums[i] = (struct st_linear_colsum){ runs[i].begin, runs[i].count,
                                                       io->db + done };
        else if (!l->in_major)
            ST_TRY(build_backward_bias(ctx, l, &l->bwd_bias[i], io, runs[i].begin,
                                       runs[i].count, io->db + done));
        done += runs[i].count;
    }
    l->dw_rows = done;
    if (l->in_major && l->dy_half)
        l->colsums[0] = (struct st_linear_colsum){ 0, l->out, io->db };
    else if (l->in_major)
        ST_TRY(build_backward_bias(ctx, l, &l->bwd_bias[0], io, 0, l->out, io->db));
    return ST_OK;
}

/* bf16: the copies of w and x (the layer's own: x's is read again by the
 * backward-weights product) and of dy (the shared slot: it lives within
 * one backward), and the reorders that fill them. */
static st_status build_conversions(st_nn_ctx *ctx, st_linear *l, const st_linear_io *io)
{
    const int64_t rows = l->in_major ? l->in : l->out, cols = l->in_major ? l->out : l->in;
    void *p;
    dnnl_memory_t w32, w16, x32, x16;
    if (!l->blocked) {   /* else the products' own copies (blocked_copy) */
        l->wb = st_nn_shared_copy(ctx, io->w, (size_t)(rows * cols));
        if (!l->wb) {
            ST_TRY(st_arena_alloc(ctx->arena, ST_MEM_WEIGHTS,
                                  (size_t)(rows * cols) * sizeof(st_bf16), &p));
            l->wb = p;
        }
        ST_TRY(st_mem_matrix(ctx, &w32, rows, cols, io->w));
        ST_TRY(st_mem_strided_bf16(ctx, &w16, rows, cols, cols, 1, l->wb));
        ST_TRY(st_prim_create_reorder(ctx, &l->to_bf16_w, w32, w16, "linear weights to bf16"));
        ST_TRY(st_nn_ctx_add_copy(ctx, io->w, l->wb, (size_t)(rows * cols), &l->w_copy));
    }
    if (l->x_half) {   /* x is bf16 already: the products read it, nothing to copy */
        l->xb = (st_bf16 *)io->xb;
    } else {
        ST_TRY(st_arena_alloc(ctx->arena, ST_MEM_ACTIVATIONS,
                              (size_t)(l->batch * l->in) * sizeof(st_bf16), &p));
        l->xb = p;
        ST_TRY(st_mem_matrix(ctx, &x32, l->batch, l->in, io->x));
        ST_TRY(st_mem_strided_bf16(ctx, &x16, l->batch, l->in, l->in, 1, l->xb));
        ST_TRY(st_prim_create_reorder(ctx, &l->to_bf16_x, x32, x16, "linear input to bf16"));
    }
    if ((l->has_dx || l->has_dw) && !l->dy_half) {
        dnnl_memory_t dy32, dy16;
        ST_TRY(st_mem_matrix(ctx, &dy32, l->batch, l->out, io->dy));
        ST_TRY(dy_operand(ctx, l, &dy16, l->batch, l->out, l->out, 1, io->dy, 0));
        ST_TRY(st_prim_create_reorder(ctx, &l->to_bf16_dy, dy32, dy16,
                                      "linear output gradient to bf16"));
    }
    return ST_OK;
}

st_status st_linear_build(st_nn_ctx *ctx, st_linear *l, int64_t batch, int64_t in,
                          int64_t out, const st_linear_io *io)
{
    memset(l, 0, sizeof *l);
    l->batch = batch;
    l->in = in;
    l->out = out;
    l->scale = io->scale == 0.0f ? 1.0f : io->scale;
    l->scale_bias = l->scale == 1.0f || !io->unscaled_bias;
    l->in_major = io->in_major != 0;
    l->has_dx = io->dx != NULL;
    l->has_dw = io->dw != NULL;
    l->bf16 = io->bf16 != 0;
    l->blocked = l->bf16 && io->blocked_weights;
    l->unfused_bias = (io->unfuse & ST_UNFUSE_BIAS) && l->scale == 1.0f;
    l->unfused_residual = (io->unfuse & ST_UNFUSE_RESIDUAL) && l->scale == 1.0f && io->residual;
    if (io->relu && (l->unfused_bias || l->unfused_residual))
        return st_fail(ST_ERR_INVALID, "linear: a fused ReLU must follow the fused adds");
    l->x_half = l->bf16 && io->xb;
    l->y_half = l->bf16 && io->yb;
    if (l->y_half && (io->residual || l->unfused_bias))
        return st_fail(ST_ERR_INVALID, "linear: a bf16 output takes no residual nor unfused "
                       "bias");
    l->dy_half = l->bf16 && io->dyb && (l->has_dx || l->has_dw);
    l->dyb = l->dy_half ? io->dyb : NULL;
    l->dx_half = l->bf16 && io->dxb && l->has_dx;
    if (l->dx_half && io->dx_mask)
        return st_fail(ST_ERR_INVALID, "linear: a bf16 input gradient takes no mask");
    if (io->dx_deriv && !l->dx_half)
        return st_fail(ST_ERR_INVALID, "linear: a GELU's derivative takes a bf16 input gradient");
    if (l->bf16)
        ST_TRY(build_conversions(ctx, l, io));
    ST_TRY(build_forward(ctx, l, io));
    if (l->has_dx)
        ST_TRY(build_backward_data(ctx, l, io));
    if (l->has_dw)
        ST_TRY(build_backward_params(ctx, l, io));
    return ST_OK;
}

/* The blocked copy id, packed from the weights (core/blocked.c: bitwise
 * oneDNN's reorder into the layout, at a fraction of its time). */
static void pack_copy(const st_nn_ctx *ctx, int id)
{
    const struct st_weight_copy *c = &ctx->copies[id];
    st_blocked_pack_rows(&c->blk, c->src, 0, c->rows, c->cols);
}

/* convert_w 0: wb holds the weights already (a recomputed forward: this
 * step's training forward converted them, and nothing has written the
 * weights since); 1: converted unless the update wrote the copies;
 * 2 (inference): the same, a blocked backward-data copy left as it is. */
static st_status forward(const st_nn_ctx *ctx, const st_linear *l, int convert_w)
{
    if (l->bf16) {
        if (convert_w && !st_nn_copy_fresh(ctx, l->w_copy)) {
            if (!l->blocked)
                ST_TRY(st_prim_run(ctx, &l->to_bf16_w));
            else
                pack_copy(ctx, l->w_copy);
            if (l->blocked && l->has_dx && convert_w == 1)
                pack_copy(ctx, l->wd_copy);
        }
        if (!l->x_half)
            ST_TRY(st_prim_run(ctx, &l->to_bf16_x));
    }
    ST_TRY(st_prim_run(ctx, &l->fwd));
    if (l->unfused_bias)
        ST_TRY(st_prim_run(ctx, &l->add_bias));
    if (l->unfused_residual)
        ST_TRY(st_prim_run(ctx, &l->add_residual));
    return ST_OK;
}

st_status st_linear_forward(const st_nn_ctx *ctx, const st_linear *l)
{
    return forward(ctx, l, 1);
}

st_status st_linear_forward_again(const st_nn_ctx *ctx, const st_linear *l)
{
    return forward(ctx, l, 0);
}

st_status st_linear_forward_infer(const st_nn_ctx *ctx, const st_linear *l)
{
    return forward(ctx, l, 2);
}

st_status st_linear_backward(const st_nn_ctx *ctx, const st_linear *l)
{
    if (l->bf16 && (l->has_dx || l->has_dw) && !l->dy_half)
        ST_TRY(st_prim_run(ctx, &l->to_bf16_dy));
    if (l->has_dx)
        ST_TRY(st_prim_run(ctx, &l->bwd_data));
    if (!l->has_dw)
        return ST_OK;
    for (int i = 0; i < l->n_runs; i++)
        ST_TRY(st_prim_run(ctx, &l->bwd_weights[i]));
    for (int i = 0; i < l->n_bias; i++) {
        if (l->dy_half)
            colsum_bf16(l->colsums[i].db, l->dyb + l->colsums[i].o0, l->batch, l->colsums[i].n,
                        l->out, l->scale_bias ? l->scale : 1.0f);
        else
            ST_TRY(st_prim_run(ctx, &l->bwd_bias[i]));
    }
    return ST_OK;
}

/* ------------------------------------------------------------ layer kind */


/* The rows of its matrix are neurons of this width layer (ST_W_FULL:
 * none): the outputs, or the inputs of an in-major matrix. */
static int row_unit(const st_layer *l)
{
    return l->in_major ? l->in_unit : l->out_unit;
}

/* Copy c of a selection of width layer neurons: sel's ids + c full,
 * for c < copies, into a malloc'd array (*owned, replacing what it held). */
static int32_t *copy_ids(const st_neuron_sel *sel, int copies, int32_t **owned)
{
    free(*owned);
    *owned = malloc((size_t)(sel->n * copies) * sizeof **owned);
    for (int c = 0; *owned && c < copies; c++)
        for (int64_t j = 0; j < sel->n; j++)
            (*owned)[c * sel->n + j] = sel->ids[j] + (int32_t)(c * sel->full);
    return *owned;
}

/* Its outputs: the kept neurons of its width layer, in each of its copies
 * (the ids laid out by linear_layout). */
static const st_neuron_sel *out_sel(const st_model *m, const st_layer *l, st_neuron_sel *tmp)
{
    const st_neuron_sel *out = st_graph_sel(m, l->out_unit, l->out, tmp);
    if (l->copies == 1)
        return out;
    *tmp = (st_neuron_sel){ out->full * l->copies, out->n * l->copies,
                            out->ids ? l->copy_ids : NULL };
    return tmp;
}

/* A linear layer from the kept `in` neurons to the kept `out` neurons of
 * the full layer: weight (rows: out neurons, or in neurons when in-major)
 * and bias.  Under backward masking, the rows of its row unit's neurons
 * with gradients. */
static st_status linear_layout(st_model *m, st_layer *l)
{
    st_neuron_sel tin, tout, tgrad;
    const st_neuron_sel *in = st_graph_sel(m, l->in_unit, l->in, &tin);
    const st_neuron_sel *out = st_graph_sel(m, l->out_unit, l->out, &tout);
    const st_neuron_sel *grad = st_graph_grad_sel(m, row_unit(l));
    if (l->copies > 1) {   /* a fused projection: every copy keeps the same neurons */
        if (l->in_major || l->out_unit < 0)
            return st_fail(ST_ERR_INVALID, "%s: copies of an output need out-major rows of a "
                           "width layer", l->name);
        if (out->ids && !copy_ids(out, l->copies, &l->copy_ids))
            return st_fail(ST_ERR_NOMEM, "out of memory laying out %s", l->name);
        out = out_sel(m, l, &tout);
        if (grad && grad->ids) {
            const int64_t full = grad->full;
            if (!copy_ids(grad, l->copies, &l->copy_grad_ids))
                return st_fail(ST_ERR_NOMEM, "out of memory laying out %s", l->name);
            tgrad = (st_neuron_sel){ grad->full * l->copies, grad->n * l->copies,
                                     l->copy_grad_ids };
            grad = &tgrad;
            int n;
            const st_row_run *runs = st_graph_grad_runs(m, l->out_unit, &n);
            free(l->copy_runs);
            l->copy_runs = malloc((size_t)(n * l->copies) * sizeof *l->copy_runs);
            if (!l->copy_runs)
                return st_fail(ST_ERR_NOMEM, "out of memory laying out %s", l->name);
            for (int c = 0; c < l->copies; c++)
                for (int i = 0; i < n; i++)
                    l->copy_runs[c * n + i] = (st_row_run){ runs[i].begin + c * full,
                                                            runs[i].count };
        }
    }
    const st_neuron_sel *rows = l->in_major ? in : out, *cols = l->in_major ? out : in;
    st_seg_map w = {
        .full_rows = rows->full, .full_cols = cols->full, .rows = rows->ids, .cols = cols->ids,
        .n_rows = rows->n, .n_cols = cols->n, .in_major = l->in_major, .fan_in = in->full,
    };
    if (grad && grad->ids) {
        w.grad_rows = grad->ids;
        w.n_grad_rows = grad->n;
    }
    st_seg_map b = {
        .full_rows = out->full, .full_cols = 1, .rows = out->ids, .n_rows = out->n, .n_cols = 1,
        .fan_in = in->full,
    };
    if (!l->in_major) {  /* the rows of an out-major matrix are its biases' */
        b.grad_rows = w.grad_rows;
        b.n_grad_rows = w.n_grad_rows;
    }
    char name[48];
    snprintf(name, sizeof name, "%s.weight", l->name);
    ST_TRY(st_graph_add_segment(m, name, 1, w, &l->seg[0]));
    snprintf(name, sizeof name, "%s.bias", l->name);
    return st_graph_add_segment(m, name, 0, b, &l->seg[1]);
}

/* The branch scale multiplies the product of the layer that closes a
 * group's branch (a residual block's last layer: a dropped block takes its
 * bias with it, so its bias is scaled too, unless the model is a neuron
 * subnetwork) and of a layer that reads a subset of a width layer's
 * neurons (forward masking: every worker holds its bias, which is added
 * unscaled). */
static st_status linear_build(st_model *m, st_layer *l)
{
    const st_model_config *c = &m->cfg;
    st_neuron_sel tin, tout;
    const st_neuron_sel *in = st_graph_sel(m, l->in_unit, l->in, &tin);
    const st_neuron_sel *out = out_sel(m, l, &tout);
    st_linear_io io = {
        .x = st_graph_data(m, l->x), .y = st_graph_data(m, l->y),
        .dx = st_graph_data(m, l->dx), .dy = st_graph_data(m, l->dy),
        .residual = st_graph_data(m, l->residual),
        .w = st_graph_seg_params(m, l->seg[0]), .b = st_graph_seg_params(m, l->seg[1]),
        .dw = st_graph_seg_grads(m, l->seg[0]), .db = st_graph_seg_grads(m, l->seg[1]),
        .in_major = l->in_major, .unscaled_bias = 1,
        .bf16 = c->precision == ST_PRECISION_BF16, .unfuse = c->unfuse,
        .blocked_weights = c->weight_layout == ST_WEIGHT_LAYOUT_BLOCKED,
        .relu = l->fuse_relu,
        .xb = st_graph_data_bf16(m, l->x), .yb = st_graph_data_bf16(m, l->y),
        .dyb = st_graph_data_bf16(m, l->dy), .dxb = st_graph_data_bf16(m, l->dx),
    };
    const st_layer *relu = l - 1;   /* folded: the activation declared before it */
    if (l->fold_relu && relu->backward && io.dx) {
        io.dx = st_graph_data(m, relu->dx);
        io.dxb = st_graph_data_bf16(m, relu->dx);
        io.dx_mask = relu->u.act.mask;
    }
    if (l->fold_gelu && relu->u.act.deriv) {   /* the GELU folded (nn/layers/activation.c) */
        io.dxb = st_graph_data_bf16(m, relu->dx);
        io.dx_deriv = relu->u.act.deriv;
    }
    io.dw_runs = st_graph_grad_runs(m, row_unit(l), &io.n_dw_runs);
    if (io.dw_runs && l->copies > 1) {
        io.dw_runs = l->copy_runs;
        io.n_dw_runs *= l->copies;
    }
    if (l->closes_group) {
        io.scale = c->subnet.scale;
        io.unscaled_bias = c->subnet.width_count != NULL;
    } else if (in->ids) {
        io.scale = c->subnet.scale;
    }
    return st_linear_build(&m->ctx, &l->u.linear, st_graph_rows(m, l->y), in->n, out->n, &io);
}

static st_status linear_forward(const st_nn_ctx *ctx, const st_layer *l, st_phase phase)
{
    return phase == ST_PHASE_RECOMPUTE ? st_linear_forward_again(ctx, &l->u.linear)
           : phase == ST_PHASE_INFER       ? st_linear_forward_infer(ctx, &l->u.linear)
                                           : st_linear_forward(ctx, &l->u.linear);
}

static st_status linear_backward(const st_nn_ctx *ctx, const st_layer *l)
{
    return st_linear_backward(ctx, &l->u.linear);
}

/* The three products (two for a layer that needs no input gradient);
 * under backward masking the weight product covers the kept rows only.
 * The bias gradient, a B x out matrix-vector product, is not counted: it
 * is O(1/in) of the layer's work. */
static double linear_flops(const st_layer *layer)
{
    const st_linear *l = &layer->u.linear;
    double one = 2.0 * (double)l->batch * (double)l->in * (double)l->out;
    double rows = (double)(l->in_major ? l->in : l->out);
    return one * (1.0 + (l->has_dx ? 1.0 : 0.0)) + (l->has_dw ? one * (double)l->dw_rows / rows : 0.0);
}

/* The products of linear_flops with their shapes; the bias gradient (a
 * pass over dy) and in bf16 the copies of x, w and dy (4 bytes read, 2
 * written an element; none of a tensor stored as bf16).  Weight rows are
 * `in` or `out` as stored. */
static void linear_costs(const st_model *m, const st_layer *layer, int forward_only,
                         st_cost_sink *s)
{
    (void)m;
    const st_linear *l = &layer->u.linear;
    const int b = l->bf16;
    /* w stored (out, in): the forward reads it transposed, the backward
     * data product as stored; (in, out): the other way round */
    const st_cost_operands fwd = l->in_major ? ST_OPERANDS_NN : ST_OPERANDS_NT;
    const st_cost_operands bwd = l->in_major ? ST_OPERANDS_NT : ST_OPERANDS_NN;
    st_cost_matmul(s, b, fwd, l->batch, l->out, l->in, 1.0, 1.0);
    /* w's copies: one, or two blocked ones; none in a recomputed forward
     * (forward_only), which reads those its step's forward made */
    const int w_copies = forward_only ? 0 : l->blocked && l->has_dx ? 2 : 1;
    if (b && (w_copies || !l->x_half))   /* x's copy: none where x is stored as bf16 */
        st_cost_move(s, 6.0 * (double)((l->x_half ? 0 : l->batch * l->in) +
                                       l->in * l->out * w_copies),
                     (l->x_half ? 0.0 : 1.0) + w_copies);
    if (forward_only)
        return;
    if (l->has_dx)
        st_cost_matmul(s, b, bwd, l->batch, l->in, l->out, 1.0, 1.0);
    if (l->has_dw && l->n_runs > 0) {
        const int64_t other = l->in_major ? l->out : l->in;
        st_step_cost c = { .kind = ST_COST_MATMUL, .bf16 = b, .operands = ST_OPERANDS_TN,
                           .m = l->dw_rows / l->n_runs,
                           .n = other, .k = l->batch, .count = (double)l->n_runs,
                           .calls = (double)l->n_runs };
        c.flops = 2.0 * (double)l->dw_rows * (double)other * (double)l->batch;
        st_cost_add(s, c);
    }
    if (l->n_bias > 0)
        st_cost_move(s, (l->dy_half ? 2.0 : 4.0) * (double)(l->batch * l->out),
                     (double)l->n_bias);
    if (b && !l->dy_half)   /* dy's copy */
        st_cost_move(s, 6.0 * (double)(l->batch * l->out), 1.0);
}

/* fp32: the backward-weights product reads x; bf16: its copy xb (and dy,
 * w's copy), so not x, unless x is stored as bf16 (then xb is x).
 * Neither reads y or the residual (the skip's gradient is dy itself). */
static unsigned linear_backward_reads(const st_model *m, const st_layer *l)
{
    return m->cfg.precision != ST_PRECISION_BF16 || st_graph_is_half(m, l->x) ? ST_READS_X
                                                                             : 0u;
}

/* bf16: its products read x through a bf16 copy, so x stored as bf16 is
 * the same operand (rounded to nearest even where it was written, as the
 * copy would be).  It writes y as bf16 unless a residual is added (the
 * stream stays fp32) or the bias is a pass of its own over y.  With bf16
 * activations dy is read as bf16 anyway (its copy), and dx may be written
 * as bf16: the layer before then reads it without a conversion. */
static unsigned linear_bf16_io(const st_model *m, const st_layer *l)
{
    const int unfused = (m->cfg.unfuse & ST_UNFUSE_BIAS) != 0;
    const unsigned grads = m->cfg.activations == ST_PRECISION_BF16 ? ST_BF16_DX | ST_BF16_DY
                                                                   : 0u;
    return ST_BF16_X | (l->residual < 0 && !unfused ? ST_BF16_Y : 0u) | grads;
}

const st_layer_kind st_layer_linear = {
    .name = "linear", .layout = linear_layout, .build = linear_build,
    .forward = linear_forward, .backward = linear_backward, .flops = linear_flops,
    .costs = linear_costs,
    .backward_reads = linear_backward_reads, .bf16_io = linear_bf16_io,
};

/* Not under --unfuse relu or bias (the ReLU must follow the bias), nor in
 * a range of layers (a segment may be cut between the two). */
int st_graph_fuses_relu(const st_model *m, st_activation act)
{
    return act == ST_ACT_RELU && !m->range &&
           !(m->cfg.unfuse & (ST_UNFUSE_RELU | ST_UNFUSE_BIAS));
}

st_layer *st_graph_linear_act(st_model *m, const char *name, int x, int dx, int da, int dz,
                              int64_t in, int64_t out, int unit, st_activation act)
{
    const int fuse = st_graph_fuses_relu(m, act);
    const int a = fuse ? ST_T_NONE : st_graph_tensor(m, out, unit);
    const int z = st_graph_tensor(m, out, unit);
    st_layer *l = z >= 0 && (fuse || a >= 0)
                  ? st_graph_linear(m, name, x, fuse ? z : a, dx, da, in, out) : NULL;
    if (!l)
        return NULL;
    l->out_unit = unit;
    l->fuse_relu = fuse;
    st_layer *r = st_graph_add(m, &st_layer_activation, "act", fuse ? z : a, z, da, dz);
    if (!r)
        return NULL;
    r->in_unit = r->out_unit = unit;
    r->activation = act;
    r->fuse_relu = fuse;
    return r;
}

/* The kind's own declaring call, here so that the graph names no kind. */
st_layer *st_graph_linear(st_model *m, const char *name, int x, int y, int dx, int dy,
                          int64_t in, int64_t out)
{
    st_layer *l = st_graph_add(m, &st_layer_linear, name, x, y, dx, dy);
    if (l) {
        l->in = in;
        l->out = out;
    }
    return l;
}

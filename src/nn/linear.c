/*
 * nn/linear.c — fully connected layer on oneDNN matmul primitives.
 *
 * Why matmul and not inner product: a step is only as fast as its slowest
 * GEMM, and the three products of a linear layer read the weights in two
 * orientations (w^T forward, w backward-data).  Matmul takes any strides, so
 * each product reads the one (out, in) row-major weight buffer in the
 * orientation it needs and oneDNN picks its fastest kernel for that; no
 * transposed copy of the weights is kept.  Measured single-thread on this
 * project's 2-core AVX-512 machine, B = 256, 1024 x 1024: forward 177,
 * backward-data 185, backward-weights 188 GFLOP/s (dnnl_sgemm: 176).
 */
#include "nn/layers.h"

/* y (B, out) = [residual (B, out) +] scale (x (B, in) . w^T (in, out) + b (1, out))
 * The residual of a skip connection is added by the matmul itself (a binary
 * post-op) while y is still in registers: one pass over y fewer than a
 * separate add, and no buffer for the branch output. */
static st_status build_forward(st_nn_ctx *ctx, st_linear *l, const st_linear_io *io)
{
    dnnl_memory_desc_t x_md, wt_md, b_md, y_md;
    st_md_matrix(&x_md, l->batch, l->in);
    st_md_strided(&wt_md, l->in, l->out, 1, l->in); /* w read as its transpose */
    st_md_matrix(&b_md, 1, l->out);
    st_md_matrix(&y_md, l->batch, l->out);
    dnnl_matmul_desc_t d;
    ST_DNNL(dnnl_matmul_desc_init(&d, &x_md, &wt_md, &b_md, &y_md), "linear forward descriptor");
    ST_TRY(st_prim_create_with_post_ops(ctx, &l->fwd, &d, l->scale,
                                        io->residual ? &y_md : NULL, "linear forward"));
    if (io->residual) {
        dnnl_memory_t res;
        ST_TRY(st_mem_matrix(ctx, &res, l->batch, l->out, io->residual));
        int at = l->scale != 1.0f; /* the add follows the scale, if any */
        st_prim_arg(&l->fwd, DNNL_ARG_ATTR_MULTIPLE_POST_OP(at) | DNNL_ARG_SRC_1, res);
    }

    dnnl_memory_t x, wt, b, y;
    ST_TRY(st_mem_matrix(ctx, &x, l->batch, l->in, io->x));
    ST_TRY(st_mem_strided(ctx, &wt, l->in, l->out, 1, l->in, io->w));
    ST_TRY(st_mem_matrix(ctx, &b, 1, l->out, io->b));
    ST_TRY(st_mem_matrix(ctx, &y, l->batch, l->out, io->y));
    st_prim_arg(&l->fwd, DNNL_ARG_SRC, x);
    st_prim_arg(&l->fwd, DNNL_ARG_WEIGHTS, wt);
    st_prim_arg(&l->fwd, DNNL_ARG_BIAS, b);
    st_prim_arg(&l->fwd, DNNL_ARG_DST, y);
    return ST_OK;
}

/* dx (B, in) = scale dy (B, out) . w (out, in) */
static st_status build_backward_data(st_nn_ctx *ctx, st_linear *l, const st_linear_io *io)
{
    dnnl_memory_desc_t dy_md, w_md, dx_md;
    st_md_matrix(&dy_md, l->batch, l->out);
    st_md_matrix(&w_md, l->out, l->in);
    st_md_matrix(&dx_md, l->batch, l->in);
    dnnl_matmul_desc_t d;
    ST_DNNL(dnnl_matmul_desc_init(&d, &dy_md, &w_md, NULL, &dx_md), "linear backward-data descriptor");
    ST_TRY(st_prim_create_with_post_ops(ctx, &l->bwd_data, &d, l->scale, NULL,
                                        "linear backward data"));

    dnnl_memory_t dy, w, dx;
    ST_TRY(st_mem_matrix(ctx, &dy, l->batch, l->out, io->dy));
    ST_TRY(st_mem_matrix(ctx, &w, l->out, l->in, io->w));
    ST_TRY(st_mem_matrix(ctx, &dx, l->batch, l->in, io->dx));
    st_prim_arg(&l->bwd_data, DNNL_ARG_SRC, dy);
    st_prim_arg(&l->bwd_data, DNNL_ARG_WEIGHTS, w);
    st_prim_arg(&l->bwd_data, DNNL_ARG_DST, dx);
    return ST_OK;
}

/* dw (out, in) = scale dy^T (out, B) . x (B, in) */
static st_status build_backward_weights(st_nn_ctx *ctx, st_linear *l, const st_linear_io *io)
{
    dnnl_memory_desc_t dyt_md, x_md, dw_md;
    st_md_strided(&dyt_md, l->out, l->batch, 1, l->out); /* dy read as its transpose */
    st_md_matrix(&x_md, l->batch, l->in);
    st_md_matrix(&dw_md, l->out, l->in);
    dnnl_matmul_desc_t d;
    ST_DNNL(dnnl_matmul_desc_init(&d, &dyt_md, &x_md, NULL, &dw_md), "linear backward-weights descriptor");
    ST_TRY(st_prim_create_with_post_ops(ctx, &l->bwd_weights, &d, l->scale, NULL,
                                        "linear backward weights"));

    dnnl_memory_t dyt, x, dw;
    ST_TRY(st_mem_strided(ctx, &dyt, l->out, l->batch, 1, l->out, io->dy));
    ST_TRY(st_mem_matrix(ctx, &x, l->batch, l->in, io->x));
    ST_TRY(st_mem_matrix(ctx, &dw, l->out, l->in, io->dw));
    st_prim_arg(&l->bwd_weights, DNNL_ARG_SRC, dyt);
    st_prim_arg(&l->bwd_weights, DNNL_ARG_WEIGHTS, x);
    st_prim_arg(&l->bwd_weights, DNNL_ARG_DST, dw);
    return ST_OK;
}

/* db (1, out) = scale ones (1, B) . dy (B, out)
 * The batch sum as a matrix-vector product: oneDNN 2.6's reduction
 * primitive has only a reference kernel for this shape (2.3 ms per call at
 * B = 256, out = 1024, more than the layer's three GEMMs together), while
 * matmul runs it at memory speed. */
static st_status build_backward_bias(st_nn_ctx *ctx, st_linear *l, const st_linear_io *io)
{
    const float *ones;
    ST_TRY(st_nn_ctx_ones(ctx, l->batch, &ones));
    dnnl_memory_desc_t ones_md, dy_md, db_md;
    st_md_matrix(&ones_md, 1, l->batch);
    st_md_matrix(&dy_md, l->batch, l->out);
    st_md_matrix(&db_md, 1, l->out);
    dnnl_matmul_desc_t d;
    ST_DNNL(dnnl_matmul_desc_init(&d, &ones_md, &dy_md, NULL, &db_md),
            "linear backward-bias descriptor");
    ST_TRY(st_prim_create_with_post_ops(ctx, &l->bwd_bias, &d, l->scale, NULL,
                                        "linear backward bias"));

    dnnl_memory_t mones, dy, db;
    ST_TRY(st_mem_matrix(ctx, &mones, 1, l->batch, ones));
    ST_TRY(st_mem_matrix(ctx, &dy, l->batch, l->out, io->dy));
    ST_TRY(st_mem_matrix(ctx, &db, 1, l->out, io->db));
    st_prim_arg(&l->bwd_bias, DNNL_ARG_SRC, mones);
    st_prim_arg(&l->bwd_bias, DNNL_ARG_WEIGHTS, dy);
    st_prim_arg(&l->bwd_bias, DNNL_ARG_DST, db);
    return ST_OK;
}

st_status st_linear_build(st_nn_ctx *ctx, st_linear *l, int64_t batch, int64_t in,
                          int64_t out, const st_linear_io *io)
{
    l->batch = batch;
    l->in = in;
    l->out = out;
    l->scale = io->scale == 0.0f ? 1.0f : io->scale;
    l->has_dx = io->dx != NULL;
    l->has_dw = io->dw != NULL;
    ST_TRY(build_forward(ctx, l, io));
    if (l->has_dx)
        ST_TRY(build_backward_data(ctx, l, io));
    if (l->has_dw) {
        ST_TRY(build_backward_weights(ctx, l, io));
        ST_TRY(build_backward_bias(ctx, l, io));
    }
    return ST_OK;
}

st_status st_linear_forward(const st_nn_ctx *ctx, const st_linear *l)
{
    return st_prim_run(ctx, &l->fwd);
}

st_status st_linear_backward(const st_nn_ctx *ctx, const st_linear *l)
{
    if (l->has_dx)
        ST_TRY(st_prim_run(ctx, &l->bwd_data));
    if (!l->has_dw)
        return ST_OK;
    ST_TRY(st_prim_run(ctx, &l->bwd_weights));
    return st_prim_run(ctx, &l->bwd_bias);
}

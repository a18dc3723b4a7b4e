/* nn/layernorm.c — layer normalisation over the feature axis with a learned
 * scale (gamma) and shift (beta), on oneDNN layer_normalization primitives.
 * Mean and variance of each row are saved by the forward for the backward. */
#include "nn/layers.h"

/* y (B, C) = (x - mean) / sqrt(var + eps) * gamma + beta, mean/var (B) */
st_status st_layernorm_build(st_nn_ctx *ctx, st_layernorm *n, int64_t rows, int64_t cols,
                             const st_layernorm_io *io)
{
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
    ST_TRY(st_mem_matrix(ctx, &y, rows, cols, io->y));
    ST_TRY(st_mem_vector(ctx, &mean, rows, io->mean));
    ST_TRY(st_mem_vector(ctx, &var, rows, io->var));
    ST_TRY(st_mem_vector(ctx, &gamma, cols, io->gamma));
    ST_TRY(st_mem_vector(ctx, &beta, cols, io->beta));
    ST_TRY(st_mem_matrix(ctx, &dx, rows, cols, io->dx));
    ST_TRY(st_mem_matrix(ctx, &dy, rows, cols, io->dy));
    ST_TRY(st_mem_vector(ctx, &dgamma, cols, io->dgamma));
    ST_TRY(st_mem_vector(ctx, &dbeta, cols, io->dbeta));

    st_prim_arg(&n->fwd, DNNL_ARG_SRC, x);
    st_prim_arg(&n->fwd, DNNL_ARG_DST, y);
    st_prim_arg(&n->fwd, DNNL_ARG_MEAN, mean);
    st_prim_arg(&n->fwd, DNNL_ARG_VARIANCE, var);
    st_prim_arg(&n->fwd, DNNL_ARG_SCALE, gamma);
    st_prim_arg(&n->fwd, DNNL_ARG_SHIFT, beta);

    st_prim_arg(&n->bwd, DNNL_ARG_SRC, x);
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

st_status st_layernorm_forward(const st_nn_ctx *ctx, const st_layernorm *n)
{
    return st_prim_run(ctx, &n->fwd);
}

st_status st_layernorm_backward(const st_nn_ctx *ctx, const st_layernorm *n)
{
    return st_prim_run(ctx, &n->bwd);
}

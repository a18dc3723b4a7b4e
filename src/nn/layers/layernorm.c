/* nn/layers/layernorm.c — layer normalisation over the feature axis with a learned
 * scale (gamma) and shift (beta), on oneDNN layer_normalization primitives.
 * Mean and variance of each row are saved by the forward for the backward. */
#include <stdio.h>

#include "nn/graph.h"
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
    ST_TRY(st_graph_alloc(m, (size_t)m->rows, &l->saved[0]));
    return st_graph_alloc(m, (size_t)m->rows, &l->saved[1]);
}

static st_status norm_build(st_model *m, st_layer *l)
{
    st_layernorm_io io = {
        .x = st_graph_data(m, l->x), .y = st_graph_data(m, l->y),
        .mean = l->saved[0], .var = l->saved[1],
        .gamma = st_graph_seg_params(m, l->seg[0]), .beta = st_graph_seg_params(m, l->seg[1]),
        .dx = st_graph_data(m, l->dx), .dy = st_graph_data(m, l->dy),
        .dgamma = st_graph_seg_grads(m, l->seg[0]), .dbeta = st_graph_seg_grads(m, l->seg[1]),
    };
    if (!io.dgamma) {   /* backward masking: see st_graph_norm_scratch */
        io.dgamma = st_graph_norm_scratch(m);
        io.dbeta = io.dgamma + l->out;
    }
    return st_layernorm_build(&m->ctx, &l->u.norm, m->rows, l->out, &io);
}

static st_status norm_forward(const st_nn_ctx *ctx, const st_layer *l, st_phase phase)
{
    return st_layernorm_forward(ctx, &l->u.norm);
}

static st_status norm_backward(const st_nn_ctx *ctx, const st_layer *l)
{
    return st_layernorm_backward(ctx, &l->u.norm);
}

const st_layer_kind st_layer_layernorm = {
    .name = "layernorm", .layout = norm_layout, .alloc = norm_alloc, .build = norm_build,
    .forward = norm_forward, .backward = norm_backward, .norm = 1,
};

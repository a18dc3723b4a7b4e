/* nn/layers/activation.c — ReLU and GELU (erf form, as in the common frameworks)
 * on oneDNN eltwise primitives.  Backward reads the saved input x. */
#include <stdio.h>

#include "nn/graph.h"
#include "nn/layers.h"

static dnnl_alg_kind_t eltwise_alg(st_activation kind)
{
    return kind == ST_ACT_GELU ? dnnl_eltwise_gelu_erf : dnnl_eltwise_relu;
}

/* y (rows, cols) = act(x); dx = act'(x) * dy */
st_status st_act_build(st_nn_ctx *ctx, st_act *a, st_activation kind, int64_t rows,
                       int64_t cols, const float *x, float *y, float *dx, const float *dy)
{
    dnnl_memory_desc_t md;
    st_md_matrix(&md, rows, cols);
    dnnl_eltwise_desc_t fd, bd;
    ST_DNNL(dnnl_eltwise_forward_desc_init(&fd, dnnl_forward_training, eltwise_alg(kind),
                                           &md, 0.f, 0.f), "activation forward descriptor");
    ST_DNNL(dnnl_eltwise_backward_desc_init(&bd, eltwise_alg(kind), &md, &md, 0.f, 0.f),
            "activation backward descriptor");
    ST_TRY(st_prim_create_pair(ctx, &a->fwd, &fd, &a->bwd, &bd, "activation forward",
                               "activation backward"));

    dnnl_memory_t mx, my, mdx, mdy;
    ST_TRY(st_mem_matrix(ctx, &mx, rows, cols, x));
    ST_TRY(st_mem_matrix(ctx, &my, rows, cols, y));
    st_prim_arg(&a->fwd, DNNL_ARG_SRC, mx);
    st_prim_arg(&a->fwd, DNNL_ARG_DST, my);
    if (dx) {
        ST_TRY(st_mem_matrix(ctx, &mdx, rows, cols, dx));
        ST_TRY(st_mem_matrix(ctx, &mdy, rows, cols, dy));
        st_prim_arg(&a->bwd, DNNL_ARG_SRC, mx);
        st_prim_arg(&a->bwd, DNNL_ARG_DIFF_DST, mdy);
        st_prim_arg(&a->bwd, DNNL_ARG_DIFF_SRC, mdx);
    }
    return ST_OK;
}

st_status st_act_forward(const st_nn_ctx *ctx, const st_act *a)
{
    return st_prim_run(ctx, &a->fwd);
}

st_status st_act_backward(const st_nn_ctx *ctx, const st_act *a)
{
    return st_prim_run(ctx, &a->bwd);
}

/* ------------------------------------------------------------ layer kind */


/* Elementwise over every float of a sample (an image's too). */
static st_status act_build(st_model *m, st_layer *l)
{
    return st_act_build(&m->ctx, &l->u.act, l->activation, m->rows, st_graph_cols(m, l->y),
                        st_graph_data(m, l->x), st_graph_data(m, l->y), st_graph_data(m, l->dx),
                        st_graph_data(m, l->dy));
}

static st_status act_forward(const st_nn_ctx *ctx, const st_layer *l, st_phase phase)
{
    return st_act_forward(ctx, &l->u.act);
}

static st_status act_backward(const st_nn_ctx *ctx, const st_layer *l)
{
    return st_act_backward(ctx, &l->u.act);
}

const st_layer_kind st_layer_activation = {
    .name = "activation", .build = act_build, .forward = act_forward, .backward = act_backward,
};

/* nn/layers/residual.c — elementwise add on a oneDNN binary primitive: the skip
 * connection forward (h' = h + branch) and the meeting of the two gradient
 * paths backward (dh += d_branch, in place). */
#include <stdio.h>

#include "nn/graph.h"
#include "nn/layers.h"

/* out (rows, cols) = a + b */
st_status st_add_build(st_nn_ctx *ctx, st_add *r, int64_t rows, int64_t cols,
                       const float *a, const float *b, float *out)
{
    dnnl_memory_desc_t md;
    st_md_matrix(&md, rows, cols);
    dnnl_binary_desc_t d;
    ST_DNNL(dnnl_binary_desc_init(&d, dnnl_binary_add, &md, &md, &md), "add descriptor");
    ST_TRY(st_prim_create(ctx, &r->prim, &d, NULL, "residual add", NULL));
    dnnl_memory_t ma, mb, mo;
    ST_TRY(st_mem_matrix(ctx, &ma, rows, cols, a));
    ST_TRY(st_mem_matrix(ctx, &mb, rows, cols, b));
    if (out == a)
        mo = ma; /* in place: oneDNN wants the very same memory object */
    else
        ST_TRY(st_mem_matrix(ctx, &mo, rows, cols, out));
    st_prim_arg(&r->prim, DNNL_ARG_SRC_0, ma);
    st_prim_arg(&r->prim, DNNL_ARG_SRC_1, mb);
    st_prim_arg(&r->prim, DNNL_ARG_DST, mo);
    return ST_OK;
}

st_status st_add_run(const st_nn_ctx *ctx, const st_add *r)
{
    return st_prim_run(ctx, &r->prim);
}

/* ------------------------------------------------------------ layer kind */


/* The fork of a skip edge, first layer of a residual group.  Forward it
 * computes nothing: the group's closing linear layer adds the skip in its
 * epilogue (a post-op, one pass over the output fewer).  Backward, where
 * it runs after the whole branch, the two gradient paths meet:
 * dx += dy, with dx the stream's gradient and dy the branch input's. */
static st_status residual_build(st_model *m, st_layer *l)
{
    float *dx = st_graph_data(m, l->dx);
    return st_add_build(&m->ctx, &l->u.add, st_graph_rows(m, l->x), st_graph_cols(m, l->x), dx,
                        st_graph_data(m, l->dy), dx);
}

static st_status residual_backward(const st_nn_ctx *ctx, const st_layer *l)
{
    return st_add_run(ctx, &l->u.add);
}

/* Its backward adds gradients only (dx += dy): it reads no forward tensor. */
static unsigned add_backward_reads(const st_model *m, const st_layer *l)
{
    return 0u;
}

const st_layer_kind st_layer_residual = {
    .name = "residual", .build = residual_build, .backward = residual_backward,
    .backward_reads = add_backward_reads,
};

/* The join of a skip edge where it cannot be fused into the branch's last
 * layer (a convolution, or a shortcut with its own layers): forward
 * y = x + residual (the skip x, the branch's output `residual`).  It has
 * no backward: both inputs' gradient is dy itself, so the builder wires
 * the branch's last layer and the shortcut to read the join's dy. */
static st_status join_build(st_model *m, st_layer *l)
{
    return st_add_build(&m->ctx, &l->u.add, st_graph_rows(m, l->y), st_graph_cols(m, l->y),
                        st_graph_data(m, l->x),
                        st_graph_data(m, l->residual), st_graph_data(m, l->y));
}

static st_status join_forward(const st_nn_ctx *ctx, const st_layer *l, st_phase phase)
{
    return st_add_run(ctx, &l->u.add);
}

const st_layer_kind st_layer_join = {
    .name = "join", .build = join_build, .forward = join_forward, .transparent = 1,
    .backward_reads = add_backward_reads,
};

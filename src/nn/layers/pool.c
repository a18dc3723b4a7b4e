/*
 * nn/layers/pool.c — max pooling and global average pooling on oneDNN
 * pooling primitives, NCHW.
 *
 * Max pooling (PyTorch's MaxPool2d, floor mode): padding is never a
 * maximum (oneDNN treats it as -infinity); the training forward writes
 * oneDNN's workspace, where each window's maximum was, which the backward
 * reads to route dy to it.  Global average pooling is an average pooling
 * whose window is the whole H x W plane: y (B, C, 1, 1) is the (B, C)
 * matrix a linear layer reads, and the backward spreads dy / (H W) over
 * the plane.
 *
 * bf16 activations (st_pool_io.half_*): the primitives run in x's data
 * type; a y, dx or dy of the other is converted by a reorder around the
 * pass (a global average pool's (B, C) output when the head reads fp32).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/graph.h"
#include "nn/layers.h"

/* Forward and (with dx) backward pooling over x (B, C, IH, IW) -> y (B, C,
 * OH, OW), max or average.  The primitives run in x's data type (oneDNN
 * 2.6's pooling reads and writes one): a y, dx or dy of the other type is
 * converted by a reorder around the pass (st_view). */
static st_status pool_build(st_nn_ctx *ctx, st_pool *p, dnnl_alg_kind_t alg,
                            const st_pool_io *io, const char *fwd_what, const char *bwd_what)
{
    const int64_t xd[4] = { p->batch, p->channels, p->ih, p->iw };
    const int64_t yd[4] = { p->batch, p->channels, p->oh, p->ow };
    const dnnl_format_tag_t xt = io->x_tag ? io->x_tag : dnnl_nchw;
    const dnnl_format_tag_t yt = io->y_tag ? io->y_tag : dnnl_nchw;
    dnnl_memory_desc_t x_md, y_md;
    if (io->half_x) {
        st_md_tag_bf16(&x_md, 4, xd, xt);
        st_md_tag_bf16(&y_md, 4, yd, yt);
    } else {
        st_md_tag(&x_md, 4, xd, xt);
        st_md_tag(&y_md, 4, yd, yt);
    }
    st_view xv, yv, dxv, dyv;
    ST_TRY(st_view_init_as(ctx, &xv, 4, xd, xt, io->half_x, io->x, ST_MEM_ACTIVATIONS,
                           ST_SLOT_KEEP, "pool reorder x", NULL));
    ST_TRY(st_view_init_as(ctx, &yv, 4, yd, yt, io->half_y, io->y, ST_MEM_ACTIVATIONS,
                           ST_SLOT_OUT, NULL, "pool reorder y"));
    ST_TRY(st_view_init_as(ctx, &dxv, 4, xd, xt, io->half_dx, io->dx, ST_MEM_ACTIVATIONS,
                           ST_SLOT_OUT, NULL, "pool reorder dx"));
    ST_TRY(st_view_init_as(ctx, &dyv, 4, yd, yt, io->half_dy, io->dy, ST_MEM_ACTIVATIONS,
                           ST_SLOT_IN, "pool reorder dy", NULL));
    const dnnl_dims_t strides = { p->stride, p->stride };
    const dnnl_dims_t kernel = { p->kernel_h, p->kernel_w };
    const dnnl_dims_t dilation = { 0, 0 };
    const dnnl_dims_t pad_l = { p->pad, p->pad };
    /* Symmetric padding: oneDNN's output size is floor((IH + pad_l + pad_r
     * - KH) / stride) + 1, PyTorch's floor mode. */
    const dnnl_dims_t pad_r = { p->pad, p->pad };
    const dnnl_prop_kind_t prop = p->has_dx ? dnnl_forward_training : dnnl_forward_inference;
    dnnl_pooling_v2_desc_t fd;
    ST_DNNL(dnnl_pooling_v2_forward_desc_init(&fd, prop, alg, &x_md, &y_md, strides, kernel,
                                              dilation, pad_l, pad_r),
            fwd_what);
    dnnl_primitive_desc_t fpd;
    ST_TRY(st_prim_create(ctx, &p->fwd.prim, &fd, NULL, fwd_what, &fpd));

    st_status s = ST_OK;
    dnnl_memory_t ws = NULL;
    const dnnl_memory_desc_t *ws_md = dnnl_primitive_desc_query_md(fpd, dnnl_query_workspace_md, 0);
    size_t ws_bytes = ws_md ? dnnl_memory_desc_get_size(ws_md) : 0;
    if (ws_bytes > 0) {
        s = st_arena_alloc(ctx->arena, ST_MEM_ACTIVATIONS, ws_bytes, &p->workspace);
        if (s == ST_OK)
            s = st_mem_md(ctx, &ws, ws_md, p->workspace);
    }
    if (s == ST_OK)
        s = st_view_input(ctx, &p->fwd, &xv, DNNL_ARG_SRC, &x_md, 0);
    if (s == ST_OK)
        s = st_view_output(ctx, &p->fwd, &yv, DNNL_ARG_DST, &y_md);
    if (s == ST_OK && ws)
        st_prim_arg(&p->fwd.prim, DNNL_ARG_WORKSPACE, ws);
    if (s == ST_OK && p->has_dx) {
        dnnl_pooling_v2_desc_t bd;
        dnnl_status_t ds = dnnl_pooling_v2_backward_desc_init(&bd, alg, &x_md, &y_md, strides,
                                                              kernel, dilation, pad_l, pad_r);
        s = ds == dnnl_success ? st_prim_create(ctx, &p->bwd.prim, &bd, fpd, bwd_what, NULL)
                               : st_dnnl_fail(ds, bwd_what, __FILE__, __LINE__);
        if (s == ST_OK)
            s = st_view_input(ctx, &p->bwd, &dyv, DNNL_ARG_DIFF_DST, &y_md, 0);
        if (s == ST_OK)
            s = st_view_output(ctx, &p->bwd, &dxv, DNNL_ARG_DIFF_SRC, &x_md);
        if (s == ST_OK && ws)
            st_prim_arg(&p->bwd.prim, DNNL_ARG_WORKSPACE, ws);
    }
    dnnl_primitive_desc_destroy(fpd);
    return s;
}

static st_status check_io(const st_pool_io *io, const char *what)
{
    if (!io->x || !io->y || (io->dx && !io->dy))
        return st_fail(ST_ERR_INVALID, "%s: missing buffer (x and y are needed, dy with dx)",
                       what);
    return ST_OK;
}

st_status st_maxpool_build(st_nn_ctx *ctx, st_pool *p, int64_t batch, int64_t channels,
                           int64_t height, int64_t width, int64_t kernel, int64_t stride,
                           int64_t pad, const st_pool_io *io)
{
    memset(p, 0, sizeof *p);
    ST_TRY(check_io(io, "max pool"));
    /* PyTorch's rule: padding at most half the kernel, so that every
     * window holds at least one real input. */
    if (batch < 1 || channels < 1 || kernel < 1 || stride < 1 || pad < 0 || 2 * pad > kernel ||
        height + 2 * pad < kernel || width + 2 * pad < kernel)
        return st_fail(ST_ERR_INVALID, "max pool: bad shape: %lldx%lld input, %lldx%lld "
                       "kernel, stride %lld, padding %lld (at most half the kernel)",
                       (long long)height, (long long)width, (long long)kernel,
                       (long long)kernel, (long long)stride, (long long)pad);
    p->batch = batch;
    p->channels = channels;
    p->ih = height;
    p->iw = width;
    p->kernel_h = p->kernel_w = kernel;
    p->stride = stride;
    p->pad = pad;
    p->oh = (height + 2 * pad - kernel) / stride + 1;
    p->ow = (width + 2 * pad - kernel) / stride + 1;
    p->has_dx = io->dx != NULL;
    return pool_build(ctx, p, dnnl_pooling_max, io, "max pool forward", "max pool backward");
}

st_status st_global_avgpool_build(st_nn_ctx *ctx, st_pool *p, int64_t batch,
                                  int64_t channels, int64_t height, int64_t width,
                                  const st_pool_io *io)
{
    memset(p, 0, sizeof *p);
    ST_TRY(check_io(io, "global average pool"));
    if (batch < 1 || channels < 1 || height < 1 || width < 1)
        return st_fail(ST_ERR_INVALID, "global average pool: bad shape %lldx%lldx%lldx%lld",
                       (long long)batch, (long long)channels, (long long)height,
                       (long long)width);
    p->batch = batch;
    p->channels = channels;
    p->ih = height;
    p->iw = width;
    p->kernel_h = height;
    p->kernel_w = width;
    p->stride = 1;
    p->oh = p->ow = 1;
    p->has_dx = io->dx != NULL;
    return pool_build(ctx, p, dnnl_pooling_avg_exclude_padding, io,
                      "global average pool forward", "global average pool backward");
}

st_status st_pool_forward(const st_nn_ctx *ctx, const st_pool *p)
{
    return st_pass_run(ctx, &p->fwd);
}

st_status st_pool_backward(const st_nn_ctx *ctx, const st_pool *p)
{
    return p->has_dx ? st_pass_run(ctx, &p->bwd) : ST_OK;
}

/* ------------------------------------------------------------ layer kinds */


/* Which of its buffers the graph stores as bf16. */
static void pool_halves(const st_model *m, const st_layer *l, st_pool_io *io)
{
    io->half_x = st_graph_is_half(m, l->x);
    io->half_y = st_graph_is_half(m, l->y);
    io->half_dx = st_graph_is_half(m, l->dx);
    io->half_dy = st_graph_is_half(m, l->dy);
}

static st_status avgpool_build(st_model *m, st_layer *l)
{
    st_neuron_sel t;
    const st_tensor *x = st_graph_tensor_info(m, l->x);
    const int64_t c = st_graph_sel(m, l->in_unit, l->in, &t)->n;
    /* y (B, C, 1, 1) in x's layout: with H = W = 1 a blocked layout of
     * whole channel blocks is the plain (B, C) matrix the head reads */
    const dnnl_format_tag_t tag = st_graph_tag(m, l->x, c);
    st_pool_io io = { .x = st_graph_data(m, l->x), .y = st_graph_data(m, l->y),
                      .dx = st_graph_data(m, l->dx), .dy = st_graph_data(m, l->dy),
                      .x_tag = tag, .y_tag = tag };
    pool_halves(m, l, &io);
    return st_global_avgpool_build(&m->ctx, &l->u.pool, m->batch, c, x->h, x->w, &io);
}

static st_status maxpool_build(st_model *m, st_layer *l)
{
    st_neuron_sel t;
    const st_tensor *x = st_graph_tensor_info(m, l->x);
    const int64_t c = st_graph_sel(m, l->in_unit, l->in, &t)->n;
    st_pool_io io = { .x = st_graph_data(m, l->x), .y = st_graph_data(m, l->y),
                      .dx = st_graph_data(m, l->dx), .dy = st_graph_data(m, l->dy),
                      .x_tag = st_graph_tag(m, l->x, c), .y_tag = st_graph_tag(m, l->y, c) };
    pool_halves(m, l, &io);
    return st_maxpool_build(&m->ctx, &l->u.pool, m->batch, c, x->h, x->w, l->kernel,
                            l->stride, l->pad, &io);
}

static st_status pool_forward(const st_nn_ctx *ctx, const st_layer *l, st_phase phase)
{
    return st_pool_forward(ctx, &l->u.pool);
}

static st_status pool_backward(const st_nn_ctx *ctx, const st_layer *l)
{
    return st_pool_backward(ctx, &l->u.pool);
}

/* oneDNN's pooling backward takes dy and, for max pooling, its own
 * workspace (where each maximum was): neither x nor y. */
static unsigned pool_backward_reads(const st_model *m, const st_layer *l)
{
    (void)m;
    (void)l;
    return 0u;
}

/* bf16 activations: all four bf16 or none, as the primitives run in x's
 * type.  Max pooling lies between convolutions and batch norms (no
 * reorder inside a stage).  The global average pool ends the image part:
 * after a bf16 stage its (B, C) output and gradient are bf16 too (the
 * head's product reads y and writes dy as bf16); after an fp32 one
 * (a ResNet's final batch norm) the head converts y once. */
static unsigned pool_bf16_io(const st_model *m, const st_layer *l)
{
    (void)l;
    return m->cfg.activations == ST_PRECISION_BF16 ? ST_BF16_ALL_TIED : 0u;
}

const st_layer_kind st_layer_avgpool = {
    .name = "avgpool", .build = avgpool_build, .forward = pool_forward,
    .backward = pool_backward, .backward_reads = pool_backward_reads,
    .bf16_io = pool_bf16_io,
};

const st_layer_kind st_layer_maxpool = {
    .name = "maxpool", .build = maxpool_build, .forward = pool_forward,
    .backward = pool_backward, .backward_reads = pool_backward_reads,
    .bf16_io = pool_bf16_io,
};

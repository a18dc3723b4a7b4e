/*
 * nn/layers/conv.c — 2-D convolution on oneDNN convolution primitives:
 * forward, backward-data, backward-weights (with the bias gradient).
 *
 * The caller's weights are plain OIHW; its activations plain NCHW or, for a
 * model's tensors whose channels are whole blocks, already in the blocked
 * layout (st_conv_io.x_tag / y_tag, graph.h's st_graph_tag), in which case
 * the views below find nothing to reorder.  Two ways to run:
 *   PLAIN    the primitives read and write those buffers directly (oneDNN
 *            then runs its im2col + GEMM kernels, "gemm:jit");
 *   BLOCKED  the primitives are created with format_tag_any and choose
 *            their layouts (nChw16c activations, OIhw16i16o-like weights on
 *            AVX-512, direct JIT kernels); reorder primitives copy the inputs
 *            into blocked buffers before a pass and the outputs back after
 *            it.  The blocked buffers and the reorders are made at build
 *            time, so a step only executes; a copy is shared by every pass
 *            that wants the same layout (x's copy made by the forward is
 *            read by backward-weights; dy's by both backward passes).  The
 *            copies of x and w are the layer's own (arena); those of y, dy
 *            and dx live within a pass or the backward, and every layer of
 *            the context shares two buffers for them (st_view's slots).
 *
 * oneDNN runs "gemm:jit" on the plain layouts and "jit:avx512_core" (1x1:
 * "jit_1x1:avx512_core") on nChw16c / OIhw16i16o.  BLOCKED is the default,
 * the faster on every shape bench/bench_conv times (doc/benchmarks.md);
 * PLAIN stays for comparison and tests.  The reorders are a large share of
 * a blocked layer's time (most for 1x1, least compute per byte), which is
 * why a model keeps its tensors blocked between layers (doc/cnn.md).
 *
 * bf16 (st_conv_io.bf16, --precision bf16): the three passes read bf16
 * copies of what they read and write fp32, as linear.c's products do:
 *   forward           x, w bf16 -> y f32 (bias f32)
 *   backward-data     dy, w bf16 -> dx f32
 *   backward-weights  x, dy bf16 -> dw, db f32 (db summed from the bf16 dy)
 * oneDNN 2.6 creates all three with these types, on both layouts
 * (verified with DNNL_VERBOSE: "jit_bf16:avx512_core_bf16" and
 * "jit_bf16_1x1" blocked, nChw16c activations and OIhw8i16o2i-like
 * weights; "gemm:jit" plain); with f32 src and bf16 weights it has no
 * forward at all, so both operands are converted.  The copies are the
 * views' copies above, of another data type: the descriptors ask for bf16
 * (and "any" layout when blocked), the views see a type the caller's
 * buffer is not and make the copy and its reorder (round to nearest even)
 * at build time, so a step still only executes; the reorders run in the
 * pass before the primitive, as the layout ones do.  x's copy (arena,
 * activations) is the forward's, in the forward's layout, and the one
 * backward-weights reads: the activation kept for the backward is bf16,
 * half the fp32 one, and the fp32 x is not read after the forward (graph.c
 * may then reuse its buffer: assign_forward_only).  w's copy is counted with
 * the weights (linear.c's wb); fp32's blocked w copy stays workspace.  dy's
 * copy lives in the shared slot (ST_SLOT_IN) within one backward.  Masters,
 * optimizer, batch norm, pooling and the loss stay fp32.
 *
 * bf16 activations (st_conv_io.half_*, --activation-precision bf16): a
 * caller's x or dy that already holds bf16 in the blocked layout the pass
 * chose is read as it is (no copy, no reorder; backward-weights reads x
 * itself), and a y or dx stored bf16 is written in bf16 by the pass (its
 * descriptor asks for bf16): between convolutions, batch norms and pools
 * that all store bf16 nothing is converted.
 *
 * Branch scale (st_conv_io.scale, 0 or 1: none): y = scale conv(x) [+ b,
 * scaled too unless unscaled_bias].  The forward takes it as an
 * eltwise_linear post-op (alpha = scale, beta = 0) while y is in registers
 * (a loop over y if a kernel refused it); an unscaled bias is then not the
 * primitive's but added by a loop.  oneDNN's backward convolutions take no
 * post-ops, so dx and dw (and a scaled bias's db) are scaled by a loop
 * over the plain buffers after their pass.  Without a scale nothing of
 * this exists: the primitives and results are those of an unscaled layer.
 * As a layer kind (below), the convolution that closes a group's branch
 * and one reading a subset of a width unit's channels get the subnetwork's
 * branch scale, by linear.c's rule.
 *
 * Subnetworks of channel units (a width unit's channels are the output
 * channels of one convolution and the input channels of the next):
 *   forward masking   the layer is built compact: the kept output channels
 *                     are the rows of its OIHW weight, the kept input
 *                     channels its columns (kernel^2 per channel, col_ids);
 *   backward masking  the model and every pass are the full model's; only
 *                     the kept rows / columns get a gradient (the seg map's
 *                     grad_rows, grad_cols).  The weight stays stored OIHW
 *                     (its initial values and existing runs do not change).
 *                     oneDNN's backward-weights has no variant for a subset
 *                     of channels: it writes the full dW (and db) into one
 *                     scratch that all such convolutions of a model share
 *                     (arena, sized for the largest, st_graph_grad_scratch),
 *                     and the kept runs are copied out (st_graph_gather).
 *                     The weight pass is full, and counted so in the FLOPs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/graph.h"
#include "nn/layers.h"

/* the faster layout (bench/bench_conv, doc/benchmarks.md) */
#define ST_CONV_MEASURED_DEFAULT ST_LAYOUT_BLOCKED

double st_conv_pass_flops(const st_conv_shape *s)
{
    const int64_t oh = st_conv_out_size(s->ih, s->kh, s->stride, s->pad);
    const int64_t ow = st_conv_out_size(s->iw, s->kw, s->stride, s->pad);
    return 2.0 * (double)s->batch * (double)s->oc * (double)oh * (double)ow * (double)s->ic *
           (double)s->kh * (double)s->kw;
}

double st_conv_flops(const st_conv *c)
{
    const double one = st_conv_pass_flops(&c->s);
    return one * (1.0 + (c->has_dx ? 1.0 : 0.0) + (c->has_dw ? 1.0 : 0.0));
}

static const dnnl_memory_desc_t *query(const_dnnl_primitive_desc_t pd, dnnl_query_t what)
{
    return dnnl_primitive_desc_query_md(pd, what, 0);
}

/* ------------------------------------------------------------ build */

/* The descriptor a pass is created with for a tensor of `dims`: its plain
 * layout `tag`, or "any" when blocked (the primitive chooses); bf16 for an
 * operand the pass reads in bf16, else f32. */
static void pass_md(dnnl_memory_desc_t *md, const int64_t *dims, dnnl_format_tag_t tag,
                    int blocked, int bf16)
{
    if (blocked)
        tag = dnnl_format_tag_any;
    if (bf16)
        st_md_tag_bf16(md, 4, dims, tag);
    else
        st_md_tag(md, 4, dims, tag);
}

static st_status check_shape(const st_conv_shape *s, const st_conv_io *io)
{
    if (s->batch < 1 || s->ic < 1 || s->ih < 1 || s->iw < 1 || s->oc < 1 || s->kh < 1 ||
        s->kw < 1 || s->stride < 1 || s->pad < 0 || s->pad >= s->kh || s->pad >= s->kw ||
        s->ih + 2 * s->pad < s->kh || s->iw + 2 * s->pad < s->kw)
        return st_fail(ST_ERR_INVALID, "conv: bad shape: batch %lld, %lld -> %lld channels, "
                       "%lldx%lld input, %lldx%lld kernel, stride %lld, padding %lld",
                       (long long)s->batch, (long long)s->ic, (long long)s->oc,
                       (long long)s->ih, (long long)s->iw, (long long)s->kh, (long long)s->kw,
                       (long long)s->stride, (long long)s->pad);
    if (!io->x || !io->y || !io->w || (io->dx && !io->dy) || (io->dw && !io->dy) ||
        (io->dw && io->b && !io->db))
        return st_fail(ST_ERR_INVALID, "conv: missing buffer (x, y and w are needed; dy with "
                       "dx or dw; db with dw and a bias)");
    /* a scale or an unscaled bias is a loop over fp32 y and dx */
    const int scaled = io->scale != 0.0f && io->scale != 1.0f;
    if ((io->half_x || io->half_y || io->half_dx || io->half_dy) && !io->bf16)
        return st_fail(ST_ERR_INVALID, "conv: bf16 buffers need the bf16 passes");
    if ((io->half_y || io->half_dx) && scaled)
        return st_fail(ST_ERR_INVALID, "conv: a scaled convolution writes fp32 y and dx");
    if (io->residual && io->half_y)
        return st_fail(ST_ERR_INVALID, "conv: a residual is added to an fp32 y");
    return ST_OK;
}

st_status st_conv_build(st_nn_ctx *ctx, st_conv *c, const st_conv_shape *shape,
                        const st_conv_io *io)
{
    memset(c, 0, sizeof *c);
    ST_TRY(check_shape(shape, io));
    c->s = *shape;
    c->oh = st_conv_out_size(shape->ih, shape->kh, shape->stride, shape->pad);
    c->ow = st_conv_out_size(shape->iw, shape->kw, shape->stride, shape->pad);
    c->layout = io->layout == ST_LAYOUT_DEFAULT ? ST_CONV_MEASURED_DEFAULT : io->layout;
    c->has_bias = io->b != NULL;
    c->has_dx = io->dx != NULL;
    c->has_dw = io->dw != NULL;
    c->bf16 = io->bf16 != 0;
    c->scale = io->scale == 0.0f ? 1.0f : io->scale;
    c->scale_bias = c->scale == 1.0f || !io->unscaled_bias;
    c->y = io->y;
    c->dx = io->dx;
    c->dw = io->dw;
    c->db = io->db;
    /* An unscaled bias is not the primitive's (its scale post-op would
     * scale it): a loop adds it after the scale.  Its gradient is the
     * plain sum of dy, which backward-weights computes as usual. */
    if (c->has_bias && !c->scale_bias)
        c->b = io->b;

    const int64_t xd[4] = { shape->batch, shape->ic, shape->ih, shape->iw };
    const int64_t yd[4] = { shape->batch, shape->oc, c->oh, c->ow };
    const int64_t wd[4] = { shape->oc, shape->ic, shape->kh, shape->kw };
    st_view x, y, w, dx, dy, dw;
    const dnnl_format_tag_t xt = io->x_tag ? io->x_tag : dnnl_nchw;
    const dnnl_format_tag_t yt = io->y_tag ? io->y_tag : dnnl_nchw;
    /* channels last is one block of all the channels */
    c->y_block = yt == dnnl_nchw ? 1 : yt == dnnl_nhwc ? shape->oc : st_blocked_channels();
    /* In bf16 the weights' copy is a rounded second instance of the
     * parameters, counted with them as linear.c counts its wb; fp32's
     * blocked copy stays where it was (workspace). */
    const st_mem_kind w_kind = c->bf16 ? ST_MEM_WEIGHTS : ST_MEM_WORKSPACE;
    ST_TRY(st_view_init_as(ctx, &x, 4, xd, xt, io->half_x, io->x, ST_MEM_ACTIVATIONS,
                           ST_SLOT_KEEP, c->bf16 ? "conv input to bf16" : "conv reorder x",
                           NULL));
    ST_TRY(st_view_init_as(ctx, &y, 4, yd, yt, io->half_y, io->y, ST_MEM_ACTIVATIONS,
                           ST_SLOT_OUT, NULL, "conv reorder y"));
    ST_TRY(st_view_init(ctx, &w, 4, wd, dnnl_oihw, io->w, w_kind, ST_SLOT_KEEP,
                        c->bf16 ? "conv weights to bf16" : "conv reorder w", NULL));
    ST_TRY(st_view_init_as(ctx, &dx, 4, xd, xt, io->half_dx, io->dx, ST_MEM_ACTIVATIONS,
                           ST_SLOT_OUT, NULL, "conv reorder dx"));
    ST_TRY(st_view_init_as(ctx, &dy, 4, yd, yt, io->half_dy, io->dy, ST_MEM_ACTIVATIONS,
                           ST_SLOT_IN,
                           c->bf16 ? "conv output gradient to bf16" : "conv reorder dy", NULL));
    ST_TRY(st_view_init(ctx, &dw, 4, wd, dnnl_oihw, io->dw, ST_MEM_WORKSPACE, ST_SLOT_KEEP,
                        NULL, "conv reorder dw"));

    /* The primitives' view: the plain layouts, or "any".  In bf16 what a
     * pass reads (x, w, dy) is bf16 and what it writes (y, dx, dw, db)
     * f32: the views see a data type other than the caller's and make
     * bf16 copies with reorders that round (to nearest even), at build
     * time, as they make the blocked copies.  In fp32, x_md = dx_md,
     * y_md = dy_md, w_md = dw_md: the descriptors of before bf16.  A y or
     * dx stored as bf16 is written in bf16 by the pass itself (oneDNN's
     * bf16 kernels take a bf16 dst and diff_src). */
    const int blocked = c->layout == ST_LAYOUT_BLOCKED;
    dnnl_memory_desc_t x_md, dx_md, y_md, dy_md, w_md, dw_md, b_md;
    pass_md(&x_md, xd, xt, blocked, c->bf16);
    pass_md(&dx_md, xd, xt, blocked, io->half_dx);
    pass_md(&y_md, yd, yt, blocked, io->half_y);
    pass_md(&dy_md, yd, yt, blocked, c->bf16);
    pass_md(&w_md, wd, dnnl_oihw, blocked, c->bf16);
    pass_md(&dw_md, wd, dnnl_oihw, blocked, 0);
    st_md_vector(&b_md, shape->oc);
    const dnnl_dims_t strides = { shape->stride, shape->stride };
    const dnnl_dims_t pad_l = { shape->pad, shape->pad };
    /* Symmetric padding: oneDNN's output size is floor((IH + pad_l + pad_r
     * - KH) / stride) + 1, PyTorch's; rows no window reaches are ignored. */
    const dnnl_dims_t pad_r = { shape->pad, shape->pad };

    const int fwd_bias = c->has_bias && !c->b;
    dnnl_convolution_desc_t fd;
    ST_DNNL(dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct,
                                               &x_md, &w_md, fwd_bias ? &b_md : NULL, &y_md,
                                               strides, pad_l, pad_r),
            "conv forward descriptor");
    /* The scale as the forward's eltwise_linear post-op, applied while y
     * is in registers; a kernel that refuses it gets a loop instead.  The
     * residual as a binary add after it, where the kernel that takes it is
     * the one without it writing y's layout: else a pass of its own (the
     * same fp32 operations either way: the scaled sum, then + residual). */
    dnnl_memory_desc_t res_md;
    st_md_tag(&res_md, 4, yd, yt);
    int fuse_res = io->residual && !io->unfuse_residual && !c->b;
    if (fuse_res) {
        char plain[128], fused[128];
        dnnl_memory_desc_t dst_plain, dst_fused;
        fuse_res = st_prim_impl(ctx, &fd, c->scale, NULL, plain, sizeof plain, &dst_plain) ==
                       ST_OK &&
                   st_prim_impl(ctx, &fd, c->scale, &res_md, fused, sizeof fused, &dst_fused) ==
                       ST_OK &&
                   strcmp(plain, fused) == 0 && dnnl_memory_desc_equal(&dst_fused, &res_md);
    }
    dnnl_primitive_desc_t fpd;
    st_status s = st_prim_create_fused(ctx, &c->fwd.prim, &fd, c->scale,
                                       fuse_res ? &res_md : NULL, NULL, 0, NULL,
                                       fuse_res ? "conv forward with residual" : "conv forward",
                                       &fpd);
    if (s != ST_OK && c->scale != 1.0f && !io->half_y) {
        c->scale_loop = 1;
        fuse_res = 0;
        s = st_prim_create(ctx, &c->fwd.prim, &fd, NULL, "conv forward", &fpd);
    }
    ST_TRY(s);
    if (io->residual) {
        dnnl_memory_t res;
        s = st_mem_md(ctx, &res, &res_md, io->residual);
        if (s == ST_OK && fuse_res)
            st_prim_arg(&c->fwd.prim, DNNL_ARG_ATTR_MULTIPLE_POST_OP(
                                          st_post_op_index(c->scale, &res_md, 0)) |
                                          DNNL_ARG_SRC_1, res);
        if (s == ST_OK && !fuse_res) {   /* y += residual, in place, y's layout */
            dnnl_memory_t ym;
            dnnl_binary_desc_t bd;
            s = st_mem_md(ctx, &ym, &res_md, io->y);
            if (s == ST_OK && dnnl_binary_desc_init(&bd, dnnl_binary_add, &res_md, &res_md,
                                                    &res_md) != dnnl_success)
                s = st_fail(ST_ERR_INVALID, "conv residual add descriptor");
            if (s == ST_OK)
                s = st_prim_create(ctx, &c->add_residual, &bd, NULL,
                                   "conv residual add (unfused)", NULL);
            if (s == ST_OK) {
                st_prim_arg(&c->add_residual, DNNL_ARG_SRC_0, ym);
                st_prim_arg(&c->add_residual, DNNL_ARG_SRC_1, res);
                st_prim_arg(&c->add_residual, DNNL_ARG_DST, ym);
                c->residual_pass = 1;
            }
        }
        if (s != ST_OK) {
            dnnl_primitive_desc_destroy(fpd);
            return s;
        }
    }
    dnnl_memory_t b = NULL, db = NULL;
    if (fwd_bias)
        s = st_mem_vector(ctx, &b, shape->oc, io->b);
    if (s == ST_OK)
        s = st_view_input(ctx, &c->fwd, &x, DNNL_ARG_SRC, query(fpd, dnnl_query_src_md), 1);
    if (s == ST_OK)
        s = st_view_input(ctx, &c->fwd, &w, DNNL_ARG_WEIGHTS, query(fpd, dnnl_query_weights_md), 1);
    if (s == ST_OK)
        s = st_view_output(ctx, &c->fwd, &y, DNNL_ARG_DST, query(fpd, dnnl_query_dst_md));
    if (s == ST_OK && fwd_bias)
        st_prim_arg(&c->fwd.prim, DNNL_ARG_BIAS, b);

    if (s == ST_OK && c->has_dx) {
        dnnl_convolution_desc_t bd;
        dnnl_primitive_desc_t bpd = NULL;
        dnnl_status_t ds = dnnl_convolution_backward_data_desc_init(
            &bd, dnnl_convolution_direct, &dx_md, &w_md, &dy_md, strides, pad_l, pad_r);
        s = ds == dnnl_success ? st_prim_create(ctx, &c->bwd_data.prim, &bd, fpd,
                                                "conv backward data", &bpd)
                               : st_dnnl_fail(ds, "conv backward-data descriptor", __FILE__,
                                              __LINE__);
        if (s == ST_OK)
            s = st_view_input(ctx, &c->bwd_data, &dy, DNNL_ARG_DIFF_DST,
                              query(bpd, dnnl_query_diff_dst_md), 1);
        if (s == ST_OK)
            s = st_view_input(ctx, &c->bwd_data, &w, DNNL_ARG_WEIGHTS,
                              query(bpd, dnnl_query_weights_md), 1);
        if (s == ST_OK)
            s = st_view_output(ctx, &c->bwd_data, &dx, DNNL_ARG_DIFF_SRC,
                              query(bpd, dnnl_query_diff_src_md));
        if (bpd)
            dnnl_primitive_desc_destroy(bpd);
    }

    if (s == ST_OK && c->has_dw) {
        dnnl_convolution_desc_t wdsc;
        dnnl_primitive_desc_t wpd = NULL;
        /* In bf16 the forward's copy of x, in the layout the forward chose,
         * is the one the backward reads: the kept activation is bf16, and
         * x's own buffer may be reused once the forward has run
         * (graph.c's assign_forward_only).  A kernel refusing that layout fails
         * the build here rather than reorder a stale x later. */
        const dnnl_memory_desc_t *xw_md = c->bf16 ? query(fpd, dnnl_query_src_md) : &x_md;
        dnnl_status_t ds = dnnl_convolution_backward_weights_desc_init(
            &wdsc, dnnl_convolution_direct, xw_md, &dw_md, c->has_bias ? &b_md : NULL, &dy_md,
            strides, pad_l, pad_r);
        s = ds == dnnl_success ? st_prim_create(ctx, &c->bwd_weights.prim, &wdsc, fpd,
                                                "conv backward weights", &wpd)
                               : st_dnnl_fail(ds, "conv backward-weights descriptor", __FILE__,
                                              __LINE__);
        if (s == ST_OK)
            s = st_view_input(ctx, &c->bwd_weights, &x, DNNL_ARG_SRC,
                              query(wpd, dnnl_query_src_md), 1);
        if (s == ST_OK && c->bf16 && c->bwd_weights.n_pre > 0)
            s = st_fail(ST_ERR_INVALID, "conv backward weights: bf16 x not in the forward's "
                        "layout (it would reorder x again, after its buffer may be reused)");
        if (s == ST_OK)
            s = st_view_input(ctx, &c->bwd_weights, &dy, DNNL_ARG_DIFF_DST,
                              query(wpd, dnnl_query_diff_dst_md), 1);
        if (s == ST_OK)
            s = st_view_output(ctx, &c->bwd_weights, &dw, DNNL_ARG_DIFF_WEIGHTS,
                              query(wpd, dnnl_query_diff_weights_md));
        if (s == ST_OK && c->has_bias) {
            s = st_mem_vector(ctx, &db, shape->oc, io->db);
            if (s == ST_OK)
                st_prim_arg(&c->bwd_weights.prim, DNNL_ARG_DIFF_BIAS, db);
        }
        if (wpd)
            dnnl_primitive_desc_destroy(wpd);
    }
    dnnl_primitive_desc_destroy(fpd);
    return s;
}

/* ------------------------------------------------------------ run */

static void scale_floats(float *v, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        v[i] *= scale;
}

/* y = scale y (when the primitive did not) + b (an unscaled bias), per
 * channel over the output in its layout: NCHW (a block of 1 channel),
 * nChw16c, where channel o of position i sits at
 * (o / 16) HW 16 + i 16 + o % 16 within a sample, or NHWC (one block of
 * all C channels: i C + o). */
static void finish_output(const st_conv *c)
{
    const float scale = c->scale_loop ? c->scale : 1.0f;
    const int64_t hw = c->oh * c->ow, cb = c->y_block;
    for (int64_t n = 0; n < c->s.batch; n++) {
        float *y = c->y + n * c->s.oc * hw;
        for (int64_t o = 0; o < c->s.oc; o++) {
            const float b = c->b ? c->b[o] : 0.0f;
            float *p = y + (o / cb) * hw * cb + o % cb;
            for (int64_t i = 0; i < hw; i++)
                p[i * cb] = scale * p[i * cb] + b;
        }
    }
}

st_status st_conv_forward(const st_nn_ctx *ctx, const st_conv *c)
{
    ST_TRY(st_pass_run(ctx, &c->fwd));
    if (c->scale_loop || c->b)
        finish_output(c);
    if (c->residual_pass)
        ST_TRY(st_prim_run(ctx, &c->add_residual));
    return ST_OK;
}

/* With a scale, dx and dw (and a scaled bias's db) are the unscaled
 * convolution's times the scale: a loop over the plain buffers after each
 * pass (oneDNN 2.6's backward convolutions take no post-ops). */
st_status st_conv_backward(const st_nn_ctx *ctx, const st_conv *c)
{
    /* The order st_view_input(..., shared) was told: a copy of dy made
     * for backward-data serves backward-weights too. */
    if (c->has_dx) {
        ST_TRY(st_pass_run(ctx, &c->bwd_data));
        if (c->scale != 1.0f)
            scale_floats(c->dx, (size_t)(c->s.batch * c->s.ic * c->s.ih * c->s.iw), c->scale);
    }
    if (c->has_dw) {
        ST_TRY(st_pass_run(ctx, &c->bwd_weights));
        if (c->scale != 1.0f) {
            scale_floats(c->dw, (size_t)(c->s.oc * c->s.ic * c->s.kh * c->s.kw), c->scale);
            if (c->has_bias && c->scale_bias)
                scale_floats(c->db, (size_t)c->s.oc, c->scale);
        }
    }
    return ST_OK;
}

/* ------------------------------------------------------------ layer kind */


/* The kept channels' columns of the weight matrix, kernel^2 per channel. */
static int32_t *channel_columns(const st_neuron_sel *sel, int64_t K2)
{
    int32_t *ids = malloc((size_t)(sel->n * K2) * sizeof *ids);
    for (int64_t c = 0; ids && c < sel->n; c++)
        for (int64_t k = 0; k < K2; k++)
            ids[c * K2 + k] = (int32_t)(sel->ids[c] * K2 + k);
    return ids;
}

/* Backward masking: the input unit whose kept channels' columns get a
 * gradient, when the output unit does not decide (a convolution from one
 * width layer to another keeps whole rows, as a linear layer does, so
 * that every element has a holder). */
static int grad_col_unit(const st_layer *l)
{
    return l->out_unit >= 0 ? ST_W_FULL : l->in_unit;
}

/* The weight (OC, IC KH KW) as a matrix whose rows are output channels
 * (a kept output channel: its row) and whose columns come kernel^2 per
 * input channel (a kept input channel: its kernel^2 columns).  Backward
 * masking: the same rows (output unit), or columns (input unit, without
 * an output unit), are the ones with a gradient; the weight stays whole
 * and stored OIHW. */
static st_status conv_layout(st_model *m, st_layer *l)
{
    const int64_t K2 = (int64_t)l->kernel * l->kernel;
    st_neuron_sel tin, tout;
    const st_neuron_sel *in = st_graph_sel(m, l->in_unit, l->in, &tin);
    const st_neuron_sel *out = st_graph_sel(m, l->out_unit, l->out, &tout);
    const st_neuron_sel *grad_out = st_graph_grad_sel(m, l->out_unit);
    const st_neuron_sel *grad_in = st_graph_grad_sel(m, grad_col_unit(l));
    if (in->ids && !m->layout_skip && !l->col_ids && !(l->col_ids = channel_columns(in, K2)))
        return st_fail(ST_ERR_NOMEM, "out of memory laying out %s", l->name);
    if (grad_in && grad_in->ids && !m->layout_skip && !l->grad_col_ids &&
        !(l->grad_col_ids = channel_columns(grad_in, K2)))
        return st_fail(ST_ERR_NOMEM, "out of memory laying out %s", l->name);
    st_seg_map w = {
        .full_rows = out->full, .full_cols = in->full * K2, .rows = out->ids,
        .cols = in->ids ? l->col_ids : NULL, .n_rows = out->n, .n_cols = in->n * K2,
        .fan_in = in->full * K2,
    };
    if (grad_out && grad_out->ids) {
        w.grad_rows = grad_out->ids;
        w.n_grad_rows = grad_out->n;
    }
    if (grad_in && grad_in->ids) {
        w.grad_cols = l->grad_col_ids;
        w.n_grad_cols = grad_in->n * K2;
    }
    char name[48];
    snprintf(name, sizeof name, "%s.weight", l->name);
    ST_TRY(st_graph_add_segment(m, name, 1, w, &l->seg[0]));
    if (!l->has_bias)
        return ST_OK;
    st_seg_map b = {
        .full_rows = out->full, .full_cols = 1, .rows = out->ids, .n_rows = out->n, .n_cols = 1,
        .grad_rows = w.grad_rows, .n_grad_rows = w.n_grad_rows, .fan_in = in->full * K2,
    };
    snprintf(name, sizeof name, "%s.bias", l->name);
    return st_graph_add_segment(m, name, 0, b, &l->seg[1]);
}

/* Under backward masking of its channels, a gradient for part of the
 * weight only (st_layer's gather_*). */
static int masked_grads(const st_model *m, const st_layer *l)
{
    const st_seg_map *w = &m->maps[l->seg[0]];
    return st_graph_seg_grads(m, l->seg[0]) && (w->grad_rows || w->grad_cols);
}

/* oneDNN's backward-weights has no variant for a subset of the output or
 * input channels: it writes the whole dW (and db) here, and the kept part
 * is copied out (cheaper than a product per run of channels, for these
 * small kernels, and no second weight layout). */
static size_t conv_grad_scratch(const st_model *m, const st_layer *l)
{
    const st_seg_map *w = &m->maps[l->seg[0]];
    return masked_grads(m, l) ? (size_t)(w->full_rows * w->full_cols) +
                                (l->has_bias ? (size_t)w->full_rows : 0)
                              : 0;
}

/* The branch scale multiplies the convolution that closes a group's
 * branch (a residual block's second: a dropped block takes its bias with
 * it, so a bias is scaled too, unless the model is a neuron subnetwork)
 * and one that reads a subset of a width unit's channels (every worker
 * holds its bias, added unscaled): linear_build's rule. */
static st_status conv_build(st_model *m, st_layer *l)
{
    const st_model_config *cf = &m->cfg;
    st_neuron_sel tin, tout;
    const st_neuron_sel *in = st_graph_sel(m, l->in_unit, l->in, &tin);
    const st_tensor *x = st_graph_tensor_info(m, l->x);
    st_conv_shape sh = {
        .batch = m->batch, .ic = in->n,
        .ih = x->h, .iw = x->w, .oc = st_graph_sel(m, l->out_unit, l->out, &tout)->n,
        .kh = l->kernel, .kw = l->kernel, .stride = l->stride, .pad = l->pad,
    };
    st_conv_io io = {
        .x = st_graph_data(m, l->x), .y = st_graph_data(m, l->y),
        .w = st_graph_seg_params(m, l->seg[0]),
        .b = l->has_bias ? st_graph_seg_params(m, l->seg[1]) : NULL,
        .dx = st_graph_data(m, l->dx), .dy = st_graph_data(m, l->dy),
        .dw = st_graph_seg_grads(m, l->seg[0]),
        .db = l->has_bias ? st_graph_seg_grads(m, l->seg[1]) : NULL,
        .x_tag = st_graph_tag(m, l->x, sh.ic), .y_tag = st_graph_tag(m, l->y, sh.oc),
        .bf16 = cf->precision == ST_PRECISION_BF16,
        .half_x = st_graph_is_half(m, l->x), .half_y = st_graph_is_half(m, l->y),
        .half_dx = st_graph_is_half(m, l->dx), .half_dy = st_graph_is_half(m, l->dy),
        .residual = st_graph_data(m, l->residual),
        .unfuse_residual = (cf->unfuse & ST_UNFUSE_RESIDUAL) != 0,
    };
    if (l->closes_group) {
        io.scale = cf->subnet.scale;
        io.unscaled_bias = cf->subnet.width_count != NULL;
    } else if (in->ids) {
        io.scale = cf->subnet.scale;
        io.unscaled_bias = 1;
    }
    if (masked_grads(m, l)) {
        const st_seg_map *w = &m->maps[l->seg[0]];
        l->gather_dst[0] = io.dw;
        l->gather_dst[1] = io.db;
        io.dw = st_graph_grad_scratch(m);
        io.db = l->has_bias ? io.dw + w->full_rows * w->full_cols : NULL;
        l->gather_src[0] = io.dw;
        l->gather_src[1] = io.db;
        l->gather_rows = st_graph_grad_runs(m, l->out_unit, &l->n_gather_rows);
        l->gather_cols = st_graph_grad_runs(m, grad_col_unit(l), &l->n_gather_cols);
    }
    return st_conv_build(&m->ctx, &l->u.conv, &sh, &io);
}

static st_status conv_forward(const st_nn_ctx *ctx, const st_layer *l, st_phase phase)
{
    return st_conv_forward(ctx, &l->u.conv);
}

static st_status conv_backward(const st_nn_ctx *ctx, const st_layer *l)
{
    ST_TRY(st_conv_backward(ctx, &l->u.conv));
    const st_conv *c = &l->u.conv;
    if (c->has_dw && l->gather_dst[0]) {
        const int64_t K2 = c->s.kh * c->s.kw;
        st_graph_gather(l->gather_dst[0], l->gather_src[0], c->s.oc, c->s.ic * K2,
                        l->gather_rows, l->n_gather_rows, l->gather_cols, l->n_gather_cols, K2);
        if (l->gather_dst[1])
            st_graph_gather(l->gather_dst[1], l->gather_src[1], c->s.oc, 1, l->gather_rows,
                            l->n_gather_rows, NULL, 0, 1);
    }
    return ST_OK;
}

/* What is computed: under backward masking too, the whole weight pass. */
/* Its passes (forward, backward data, backward weights) as convolutions
 * of its shape, as the product they amount to (im2col: batch x pixels
 * rows, ic kh kw deep, oc columns); the bias gradient a pass over dy; in bf16 the copies of
 * x and dy (4 bytes read, 2 written an element). */
static void conv_costs(const st_model *m, const st_layer *l, int forward_only, st_cost_sink *s)
{
    const st_conv *c = &l->u.conv;
    const double passes = forward_only ? 1.0 : 1.0 + (c->has_dx ? 1.0 : 0.0) +
                                               (c->has_dw ? 1.0 : 0.0);
    st_cost_add(s, (st_step_cost){ .kind = ST_COST_CONV, .bf16 = c->bf16,
                                   .m = c->s.batch * c->oh * c->ow, .n = c->s.oc,
                                   .k = c->s.ic * c->s.kh * c->s.kw,
                                   .count = passes, .calls = passes,
                                   .flops = passes * st_conv_pass_flops(&c->s) });
    const double x = (double)(c->s.batch * c->s.ic * c->s.ih * c->s.iw);
    const double y = (double)(c->s.batch * c->s.oc * c->oh * c->ow);
    if (c->bf16 && !st_graph_is_half(m, l->x))
        st_cost_move(s, 6.0 * x, 1.0);
    if (forward_only)
        return;
    if (c->has_bias)
        st_cost_move(s, (st_graph_is_half(m, l->dy) ? 2.0 : 4.0) * y, 1.0);
    if (c->bf16 && !st_graph_is_half(m, l->dy))
        st_cost_move(s, 6.0 * y, 1.0);
}

static double conv_layer_flops(const st_layer *l)
{
    return st_conv_flops(&l->u.conv);
}

/* fp32: the backward-weights pass reads x (or the forward's blocked copy
 * of it); bf16: only the forward's bf16 copy of x (the build makes sure of
 * it), so not x, unless x is stored as bf16: then x is that copy.
 * Neither reads y or a residual. */
static unsigned conv_backward_reads(const st_model *m, const st_layer *l)
{
    return m->cfg.precision != ST_PRECISION_BF16 || st_graph_is_half(m, l->x) ? ST_READS_X
                                                                               : 0u;
}

/* The scale conv_build gives it (1: none). */
static float conv_scale(const st_model *m, const st_layer *l)
{
    st_neuron_sel t;
    const float sc = m->cfg.subnet.scale;
    const int scaled = l->closes_group || st_graph_sel(m, l->in_unit, l->in, &t)->ids;
    return scaled && sc != 0.0f ? sc : 1.0f;
}

/* bf16 activations: x and dy are read as bf16 anyway; y and dx are
 * written in bf16 by the passes unless a loop scales them (fp32). */
static unsigned conv_bf16_io(const st_model *m, const st_layer *l)
{
    if (m->cfg.activations != ST_PRECISION_BF16)
        return 0u;
    return ST_BF16_X | ST_BF16_DY | (conv_scale(m, l) == 1.0f ? ST_BF16_Y | ST_BF16_DX : 0u);
}

const st_layer_kind st_layer_conv = {
    .name = "conv", .layout = conv_layout, .build = conv_build, .forward = conv_forward,
    .backward = conv_backward, .flops = conv_layer_flops,
    .costs = conv_costs, .grad_scratch = conv_grad_scratch,
    .backward_reads = conv_backward_reads, .bf16_io = conv_bf16_io,
};

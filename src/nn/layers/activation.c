/* nn/layers/activation.c — ReLU and GELU (erf form, as in the common frameworks)
 * on oneDNN eltwise primitives.  Backward reads the saved input x (a ReLU
 * fused into the linear layer before it: the output y, or its backward is
 * the next linear layer's, through a mask: below).
 *
 * In bf16 (--precision bf16) the input kept for the backward is a bf16
 * copy xb = bf16(x) (round to nearest even, a reorder before the forward's
 * primitive, training forwards only), and the backward reorders it back
 * into an fp32 scratch in the context's shared slot ST_SLOT_IN, from which
 * the same fp32 backward primitive computes dx = act'(xr) dy, xr = fp32(xb).
 * The forward is unchanged (y from the fp32 x), so is dy's path; only
 * act'(x) becomes act'(xr), |xr - x| <= 2^-9 |x|:
 *   ReLU: act' is a step at 0 and rounding keeps the sign (bf16 has fp32's
 *         exponent range: only values below bf16's smallest subnormal,
 *         ~9e-41, become 0), so dx is exactly fp32's;
 *   GELU: act'(x) = Phi(x) + x phi(x), act''(x) = phi(x) (2 - x^2), so
 *         |act''| <= 0.8 and |act'(xr) - act'(x)| <= 0.8 * 2^-9 |x|:
 *         at most ~1.6e-3 |x| absolute where |x| < 3 (act' in [-0.13,
 *         1.13]), and where |x| is larger act'' ~ 0 (act' within 4e-3 of
 *         0 or 1): an error of the order of 2^-9, the size of the
 *         rounding the products already apply to dy (the linear layer
 *         below reads dy in bf16 anyway).
 * Training stays within tolerance of fp32 (tests/test_cli_precision).  What it
 * buys: nobody reads the fp32 x after the forward, so in bf16 the graph
 * lets x's buffer be reused (st_graph_build's pool) and the activations
 * kept for the backward are 2 bytes per element instead of 4.
 *
 * With --activation-precision bf16 GELU takes x, y, dx and dy as bf16
 * tensors: its backward is the bf16 eltwise on x as it lies, and the
 * products on both sides read and write the bf16 gradients without a
 * conversion (a ReLU keeps fp32 gradients: act_bf16_io). */
#include <stdio.h>

#include "nn/gelu.h"
#include "nn/graph.h"
#include "nn/layers.h"

static dnnl_alg_kind_t eltwise_alg(st_activation kind)
{
    return kind == ST_ACT_GELU ? dnnl_eltwise_gelu_erf : dnnl_eltwise_relu;
}


/* What the backward reads of `from` (rows x cols fp32), kept as bf16 in
 * the activations arena: `keep` writes the copy in the forward, `unkeep`
 * widens it into *slot, fp32 scratch, before the backward (to, back: the
 * reorders' names, kept by them: literals). */
static st_status keep_bf16(st_nn_ctx *ctx, st_act *a, const dnnl_memory_desc_t *md,
                           int64_t rows, int64_t cols, dnnl_memory_t from,
                           dnnl_memory_t *slot, const char *to, const char *back)
{
    void *p;
    dnnl_memory_t mb;
    ST_TRY(st_arena_alloc(ctx->arena, ST_MEM_ACTIVATIONS,
                          (size_t)(rows * cols) * sizeof(st_bf16), &p));
    a->xb = p;
    a->bf16 = 1;
    ST_TRY(st_mem_strided_bf16(ctx, &mb, rows, cols, cols, 1, a->xb));
    ST_TRY(st_mem_slot_md(ctx, slot, md, ST_SLOT_IN, 0, (size_t)(rows * cols) * sizeof(float)));
    ST_TRY(st_prim_create_reorder(ctx, &a->keep, from, mb, to));
    return st_prim_create_reorder(ctx, &a->unkeep, mb, *slot, back);
}

/* y (rows, cols) = act(x); dx = act'(x) * dy */
st_status st_act_build(st_nn_ctx *ctx, st_act *a, st_activation kind, int64_t rows,
                       int64_t cols, const float *x, float *y, float *dx, const float *dy,
                       int bf16)
{
    memset(a, 0, sizeof *a);
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
        dnnl_memory_t src = mx;
        if (bf16)
            ST_TRY(keep_bf16(ctx, a, &md, rows, cols, mx, &src, "activation input to bf16",
                             "activation input from bf16"));
        st_prim_arg(&a->bwd, DNNL_ARG_SRC, src);
        st_prim_arg(&a->bwd, DNNL_ARG_DIFF_DST, mdy);
        st_prim_arg(&a->bwd, DNNL_ARG_DIFF_SRC, mdx);
    }
    return ST_OK;
}

/* The fused ReLU's backward from its output (md: its rows x cols); the
 * forward primitive is the backward's hint only: never run. */
static st_status fused_relu_backward(st_nn_ctx *ctx, st_act *a, dnnl_memory_desc_t *md,
                                     int64_t rows, int64_t cols)
{
    st_md_matrix(md, rows, cols);
    dnnl_eltwise_desc_t fd, bd;
    ST_DNNL(dnnl_eltwise_forward_desc_init(&fd, dnnl_forward_training,
                                           dnnl_eltwise_relu_use_dst_for_bwd, md, 0.f, 0.f),
            "fused ReLU forward descriptor");
    ST_DNNL(dnnl_eltwise_backward_desc_init(&bd, dnnl_eltwise_relu_use_dst_for_bwd, md, md,
                                            0.f, 0.f), "fused ReLU backward descriptor");
    return st_prim_create_pair(ctx, &a->fwd, &fd, &a->bwd, &bd, "fused ReLU (unused)",
                               "fused ReLU backward");
}

/* ReLU's derivative is a step at 0 and y = max(0, x) is positive exactly
 * where x is, so oneDNN's use_dst_for_bwd variant, reading y, computes
 * the same dx as the backward from x (both select dy or 0 * dy by a
 * compare with 0).  In bf16 y's copy bf16(y) is positive where bf16(x)
 * is (the same rounding of the same positive values), the sign the
 * unfused layer's backward reads. */
st_status st_act_build_fused_relu(st_nn_ctx *ctx, st_act *a, int64_t rows, int64_t cols,
                                  const float *y, float *dx, const float *dy, int bf16)
{
    memset(a, 0, sizeof *a);
    a->fused = 1;
    if (!dx)
        return ST_OK;
    dnnl_memory_desc_t md;
    ST_TRY(fused_relu_backward(ctx, a, &md, rows, cols));
    dnnl_memory_t my, mdx, mdy;
    ST_TRY(st_mem_matrix(ctx, &my, rows, cols, y));
    ST_TRY(st_mem_matrix(ctx, &mdx, rows, cols, dx));
    ST_TRY(st_mem_matrix(ctx, &mdy, rows, cols, dy));
    dnnl_memory_t dst = my;
    if (bf16)
        ST_TRY(keep_bf16(ctx, a, &md, rows, cols, my, &dst, "fused ReLU output to bf16",
                             "fused ReLU output from bf16"));
    st_prim_arg(&a->bwd, DNNL_ARG_DST, dst);
    st_prim_arg(&a->bwd, DNNL_ARG_DIFF_DST, mdy);
    st_prim_arg(&a->bwd, DNNL_ARG_DIFF_SRC, mdx);
    return ST_OK;
}

/* mask = (y > 0) as 0 or 1 bytes: the next layer's backward-data product
 * multiplies its dx by it, which is relu_use_dst_for_bwd's dx = dy * (y > 0
 * ? 1 : 0) on the same values.  In bf16 the mask is from the fp32 y, where
 * the unfolded layer reads bf16(y): they differ only where 0 < y < 2^-133
 * (below bf16's smallest subnormal, rounded to 0). */
st_status st_act_build_folded_relu(st_nn_ctx *ctx, st_act *a, int64_t rows, int64_t cols,
                                   const float *y)
{
    memset(a, 0, sizeof *a);
    a->fused = 1;
    void *p;
    ST_TRY(st_arena_alloc(ctx->arena, ST_MEM_ACTIVATIONS, (size_t)(rows * cols), &p));
    a->mask = p;
    float *zero;   /* the compare's other operand, broadcast */
    ST_TRY(st_arena_alloc_floats(ctx->arena, ST_MEM_WORKSPACE, 1, &zero));
    zero[0] = 0.0f;
    dnnl_memory_desc_t y_md, zero_md, mask_md;
    st_md_matrix(&y_md, rows, cols);
    st_md_matrix(&zero_md, 1, 1);
    st_md_matrix(&mask_md, rows, cols);
    mask_md.data_type = dnnl_u8;
    dnnl_binary_desc_t d;
    ST_DNNL(dnnl_binary_desc_init(&d, dnnl_binary_gt, &y_md, &zero_md, &mask_md),
            "ReLU mask descriptor");
    ST_TRY(st_prim_create(ctx, &a->make_mask, &d, NULL, "ReLU mask", NULL));
    dnnl_memory_t my, mz, mm;
    ST_TRY(st_mem_matrix(ctx, &my, rows, cols, y));
    ST_TRY(st_mem_matrix(ctx, &mz, 1, 1, zero));
    ST_TRY(st_mem_md(ctx, &mm, &mask_md, a->mask));
    st_prim_arg(&a->make_mask, DNNL_ARG_SRC_0, my);
    st_prim_arg(&a->make_mask, DNNL_ARG_SRC_1, mz);
    st_prim_arg(&a->make_mask, DNNL_ARG_DST, mm);
    return ST_OK;
}

/* --activation-precision bf16: x is kept by being a bf16 tensor itself;
 * the backward widens it into the slot (a->xb is x). */
static st_status unkeep_half(st_nn_ctx *ctx, st_act *a, const dnnl_memory_desc_t *md,
                             int64_t rows, int64_t cols, const st_bf16 *x, dnnl_memory_t *slot,
                             const char *back)
{
    dnnl_memory_t mb;
    a->xb = (st_bf16 *)x;
    a->bf16 = 1;
    a->x_half = 1;
    ST_TRY(st_mem_strided_bf16(ctx, &mb, rows, cols, cols, 1, a->xb));
    ST_TRY(st_mem_slot_md(ctx, slot, md, ST_SLOT_IN, 0, (size_t)(rows * cols) * sizeof(float)));
    return st_prim_create_reorder(ctx, &a->unkeep, mb, *slot, back);
}

/* The fp32 backward's arguments: the kept bf16 tensor widened into the slot
 * as its kept_arg (x for an activation, y for a fused ReLU), dx and dy. */
static st_status bind_backward_half(st_nn_ctx *ctx, st_act *a, const dnnl_memory_desc_t *md,
                                    int64_t rows, int64_t cols, const st_bf16 *kept,
                                    int kept_arg, float *dx, const float *dy, const char *back)
{
    dnnl_memory_t mk, mdx, mdy;
    ST_TRY(unkeep_half(ctx, a, md, rows, cols, kept, &mk, back));
    ST_TRY(st_mem_matrix(ctx, &mdx, rows, cols, dx));
    ST_TRY(st_mem_matrix(ctx, &mdy, rows, cols, dy));
    st_prim_arg(&a->bwd, kept_arg, mk);
    st_prim_arg(&a->bwd, DNNL_ARG_DIFF_DST, mdy);
    st_prim_arg(&a->bwd, DNNL_ARG_DIFF_SRC, mdx);
    return ST_OK;
}

/* y = act(x) on bf16 x and y; dx = act'(fp32(x)) dy in fp32 (the backward
 * of st_act_build on its kept copy, the same numbers from the same bf16 x) */
st_status st_act_build_half(st_nn_ctx *ctx, st_act *a, st_activation kind, int64_t rows,
                            int64_t cols, const st_bf16 *x, st_bf16 *y, float *dx,
                            const float *dy)
{
    memset(a, 0, sizeof *a);
    dnnl_memory_desc_t md, md16;
    st_md_matrix(&md, rows, cols);
    st_md_strided_bf16(&md16, rows, cols, cols, 1);
    dnnl_eltwise_desc_t fd, bd;
    ST_DNNL(dnnl_eltwise_forward_desc_init(&fd, dnnl_forward_inference, eltwise_alg(kind),
                                           &md16, 0.f, 0.f), "bf16 activation forward descriptor");
    ST_TRY(st_prim_create(ctx, &a->fwd, &fd, NULL, "activation forward (bf16)", NULL));
    dnnl_memory_t mx, my;
    ST_TRY(st_mem_strided_bf16(ctx, &mx, rows, cols, cols, 1, x));
    ST_TRY(st_mem_strided_bf16(ctx, &my, rows, cols, cols, 1, y));
    st_prim_arg(&a->fwd, DNNL_ARG_SRC, mx);
    st_prim_arg(&a->fwd, DNNL_ARG_DST, my);
    if (!dx)
        return ST_OK;
    /* the fp32 backward, its forward a hint only (never run) */
    dnnl_eltwise_desc_t hd;
    ST_DNNL(dnnl_eltwise_forward_desc_init(&hd, dnnl_forward_training, eltwise_alg(kind),
                                           &md, 0.f, 0.f), "activation forward descriptor");
    ST_DNNL(dnnl_eltwise_backward_desc_init(&bd, eltwise_alg(kind), &md, &md, 0.f, 0.f),
            "activation backward descriptor");
    ST_TRY(st_prim_create_pair(ctx, &a->bwd_hint, &hd, &a->bwd, &bd, "activation forward (unused)",
                               "activation backward"));
    return bind_backward_half(ctx, a, &md, rows, cols, x, DNNL_ARG_SRC, dx, dy,
                              "bf16 activation input to fp32");
}

/* dx = act'(x) dy on bf16 x, dy and dx: one bf16 eltwise backward, nothing
 * widened.  Against st_act_build_half, dy arrives rounded to bf16 (its
 * producer, a product, rounds it once) and dx is rounded once more before
 * the next product, which read it rounded anyway. */
st_status st_act_build_half_grads(st_nn_ctx *ctx, st_act *a, st_activation kind,
                                  int64_t rows, int64_t cols, const st_bf16 *x, st_bf16 *y,
                                  st_bf16 *dx, const st_bf16 *dy)
{
    memset(a, 0, sizeof *a);
    a->x_half = 1;
    a->xb = (st_bf16 *)x;
    dnnl_memory_desc_t md16;
    st_md_strided_bf16(&md16, rows, cols, cols, 1);
    dnnl_eltwise_desc_t fd, bd;
    ST_DNNL(dnnl_eltwise_forward_desc_init(&fd, dnnl_forward_training, eltwise_alg(kind),
                                           &md16, 0.f, 0.f), "bf16 activation forward descriptor");
    ST_DNNL(dnnl_eltwise_backward_desc_init(&bd, eltwise_alg(kind), &md16, &md16, 0.f, 0.f),
            "bf16 activation backward descriptor");
    ST_TRY(st_prim_create_pair(ctx, &a->fwd, &fd, &a->bwd, &bd, "activation forward (bf16)",
                               "activation backward (bf16)"));
    dnnl_memory_t mx, my, mdx, mdy;
    ST_TRY(st_mem_strided_bf16(ctx, &mx, rows, cols, cols, 1, x));
    ST_TRY(st_mem_strided_bf16(ctx, &my, rows, cols, cols, 1, y));
    ST_TRY(st_mem_strided_bf16(ctx, &mdx, rows, cols, cols, 1, dx));
    ST_TRY(st_mem_strided_bf16(ctx, &mdy, rows, cols, cols, 1, dy));
    st_prim_arg(&a->fwd, DNNL_ARG_SRC, mx);
    st_prim_arg(&a->fwd, DNNL_ARG_DST, my);
    st_prim_arg(&a->bwd, DNNL_ARG_SRC, mx);
    st_prim_arg(&a->bwd, DNNL_ARG_DIFF_DST, mdy);
    st_prim_arg(&a->bwd, DNNL_ARG_DIFF_SRC, mdx);
    return ST_OK;
}

/* The linear layer before wrote y = bf16(max(0, ...)); its backward
 * reads that y as st_act_build_fused_relu reads its copy. */
st_status st_act_build_fused_relu_half(st_nn_ctx *ctx, st_act *a, int64_t rows, int64_t cols,
                                       const st_bf16 *y, float *dx, const float *dy)
{
    memset(a, 0, sizeof *a);
    a->fused = 1;
    if (!dx)
        return ST_OK;
    dnnl_memory_desc_t md;
    ST_TRY(fused_relu_backward(ctx, a, &md, rows, cols));
    return bind_backward_half(ctx, a, &md, rows, cols, y, DNNL_ARG_DST, dx, dy,
                              "bf16 fused ReLU output to fp32");
}

/* mask = (y > 0) from the bf16 y (the sign of the value the next layer's
 * product reads). */
st_status st_act_build_folded_relu_half(st_nn_ctx *ctx, st_act *a, int64_t rows, int64_t cols,
                                        const st_bf16 *y)
{
    memset(a, 0, sizeof *a);
    a->fused = 1;
    a->x_half = 1;
    void *p;
    ST_TRY(st_arena_alloc(ctx->arena, ST_MEM_ACTIVATIONS, (size_t)(rows * cols), &p));
    a->mask = p;
    float *zero;   /* the compare's other operand, broadcast: bf16 0 (its first half) */
    ST_TRY(st_arena_alloc_floats(ctx->arena, ST_MEM_WORKSPACE, 1, &zero));
    zero[0] = 0.0f;
    dnnl_memory_desc_t y_md, zero_md, mask_md;
    st_md_strided_bf16(&y_md, rows, cols, cols, 1);
    st_md_strided_bf16(&zero_md, 1, 1, 1, 1);
    st_md_matrix(&mask_md, rows, cols);
    mask_md.data_type = dnnl_u8;
    dnnl_binary_desc_t d;
    ST_DNNL(dnnl_binary_desc_init(&d, dnnl_binary_gt, &y_md, &zero_md, &mask_md),
            "bf16 ReLU mask descriptor");
    ST_TRY(st_prim_create(ctx, &a->make_mask, &d, NULL, "ReLU mask (bf16)", NULL));
    dnnl_memory_t my, mz, mm;
    ST_TRY(st_mem_strided_bf16(ctx, &my, rows, cols, cols, 1, y));
    ST_TRY(st_mem_strided_bf16(ctx, &mz, 1, 1, 1, 1, (const st_bf16 *)zero));
    ST_TRY(st_mem_md(ctx, &mm, &mask_md, a->mask));
    st_prim_arg(&a->make_mask, DNNL_ARG_SRC_0, my);
    st_prim_arg(&a->make_mask, DNNL_ARG_SRC_1, mz);
    st_prim_arg(&a->make_mask, DNNL_ARG_DST, mm);
    return ST_OK;
}

void st_act_build_folded_gelu(st_act *a, int64_t rows, int64_t cols, st_bf16 *x, st_bf16 *y)
{
    memset(a, 0, sizeof *a);
    a->deriv = x;
    a->y = y;
    a->n = rows * cols;
}

st_status st_act_infer(const st_nn_ctx *ctx, const st_act *a)
{
    if (a->deriv) {   /* x is x here: an inference forward's product just wrote it */
        st_gelu_bf16(a->y, a->deriv, (size_t)a->n);
        return ST_OK;
    }
    return a->fused ? ST_OK : st_prim_run(ctx, &a->fwd);
}

st_status st_act_forward(const st_nn_ctx *ctx, const st_act *a)
{
    if (a->deriv) {
        st_gelu_deriv_bf16(a->y, a->deriv, (size_t)a->n);
        return ST_OK;
    }
    if (a->mask)
        return st_prim_run(ctx, &a->make_mask);
    if (a->bf16 && !a->x_half)   /* first: correct even were y to overwrite x */
        ST_TRY(st_prim_run(ctx, &a->keep));
    return a->fused ? ST_OK : st_prim_run(ctx, &a->fwd);
}

st_status st_act_backward(const st_nn_ctx *ctx, const st_act *a)
{
    if (a->mask || a->deriv)   /* folded into the next layer's backward */
        return ST_OK;
    if (a->bf16)   /* (not with bf16 gradients: the backward reads x as it lies) */
        ST_TRY(st_prim_run(ctx, &a->unkeep));
    return st_prim_run(ctx, &a->bwd);
}

/* ------------------------------------------------------------ layer kind */


/* Elementwise over every float of a sample (an image's too). */
static st_status act_build(st_model *m, st_layer *l)
{
    const int64_t rows = st_graph_rows(m, l->y), cols = st_graph_cols(m, l->y);
    st_bf16 *yb = st_graph_data_bf16(m, l->y);
    if (yb) {   /* x too (ST_BF16_TIED): --activation-precision bf16 */
        if (l->fold_relu && l->backward)
            return st_act_build_folded_relu_half(&m->ctx, &l->u.act, rows, cols, yb);
        if (l->fuse_relu)
            return st_act_build_fused_relu_half(&m->ctx, &l->u.act, rows, cols, yb,
                                                l->backward ? st_graph_data(m, l->dx) : NULL,
                                                st_graph_data(m, l->dy));
        if (l->fold_gelu && l->backward && st_graph_is_half(m, l->dx)) {
            st_act_build_folded_gelu(&l->u.act, rows, cols, st_graph_data_bf16(m, l->x), yb);
            return ST_OK;
        }
        if (l->backward && st_graph_is_half(m, l->dx))   /* dy too (TIED_GRADS) */
            return st_act_build_half_grads(&m->ctx, &l->u.act, l->activation, rows, cols,
                                           st_graph_data_bf16(m, l->x), yb,
                                           st_graph_data_bf16(m, l->dx),
                                           st_graph_data_bf16(m, l->dy));
        return st_act_build_half(&m->ctx, &l->u.act, l->activation, rows, cols,
                                 st_graph_data_bf16(m, l->x), yb,
                                 l->backward ? st_graph_data(m, l->dx) : NULL,
                                 st_graph_data(m, l->dy));
    }
    if (l->fold_relu && l->backward)
        return st_act_build_folded_relu(&m->ctx, &l->u.act, st_graph_rows(m, l->y),
                                        st_graph_cols(m, l->y), st_graph_data(m, l->y));
    if (l->fuse_relu)
        return st_act_build_fused_relu(&m->ctx, &l->u.act, st_graph_rows(m, l->y),
                                       st_graph_cols(m, l->y), st_graph_data(m, l->y),
                                       st_graph_data(m, l->dx),
                                       st_graph_data(m, l->dy),
                                       m->cfg.precision == ST_PRECISION_BF16 && l->backward);
    return st_act_build(&m->ctx, &l->u.act, l->activation, st_graph_rows(m, l->y),
                        st_graph_cols(m, l->y),
                        st_graph_data(m, l->x), st_graph_data(m, l->y), st_graph_data(m, l->dx),
                        st_graph_data(m, l->dy),
                        m->cfg.precision == ST_PRECISION_BF16 && l->backward);
}

static st_status act_forward(const st_nn_ctx *ctx, const st_layer *l, st_phase phase)
{
    return phase != ST_PHASE_INFER ? st_act_forward(ctx, &l->u.act)
                                   : st_act_infer(ctx, &l->u.act);
}

static st_status act_backward(const st_nn_ctx *ctx, const st_layer *l)
{
    return st_act_backward(ctx, &l->u.act);
}

/* Its passes: the activation's forward and backward (a fused ReLU: the
 * backward only; a folded one: the mask only; a folded GELU: its one
 * pass), in bf16 the input's copy
 * kept (4 bytes read, 2 written an element) and restored (2 read, 4
 * written); x, y, dx and dy at their stored widths. */
static void act_costs(const st_model *m, const st_layer *l, int forward_only, st_cost_sink *s)
{
    const st_act *a = &l->u.act;
    const double n = (double)st_graph_rows(m, l->y) * (double)st_graph_cols(m, l->y);
    const double v = st_graph_is_half(m, l->y) ? 2.0 : 4.0;   /* x's and y's bytes */
    const double g = st_graph_is_half(m, l->dx) ? 2.0 : 4.0;   /* dx's, dy's, x's read */
    const st_cost_op op = l->activation == ST_ACT_GELU && !l->fuse_relu && !l->fold_relu
                              ? ST_OP_GELU : ST_OP_RELU;
    if (a->mask) {
        st_cost_move(s, (v + 1.0) * n, 1.0);
        return;
    }
    if (a->deriv) {   /* training: x read, y and act'(x) written, a backward's math */
        if (forward_only)
            st_cost_pass(s, ST_OP_GELU, 0, n, 4.0 * n, 1.0);
        else
            st_cost_pass(s, ST_OP_GELU, 1, n, 6.0 * n, 1.0);
        return;
    }
    if (a->bf16 && !a->x_half)
        st_cost_move(s, 6.0 * n, 1.0);
    if (!a->fused)
        st_cost_pass(s, op, 0, n, 2.0 * v * n, 1.0);
    if (forward_only || !l->backward)
        return;
    if (a->bf16)   /* bf16 x widened into fp32 scratch */
        st_cost_move(s, 6.0 * n, 1.0);
    /* reads x (or y) and dy, writes dx: x fp32 (widened) unless all are bf16 */
    st_cost_pass(s, op, 1, n, 3.0 * g * n, 1.0);
}

/* fp32: the backward reads x (a fused ReLU: y, the same tensor); bf16:
 * its own copy only. */
static unsigned act_backward_reads(const st_model *m, const st_layer *l)
{
    if (l->fold_relu)   /* its own mask */
        return 0u;
    if (m->cfg.precision == ST_PRECISION_BF16 && !st_graph_is_half(m, l->x))
        return 0u;
    return l->fuse_relu ? ST_READS_Y : ST_READS_X;   /* bf16 x: its kept copy is x */
}

/* --activation-precision bf16: x and y bf16 together (one eltwise on
 * bf16); the graph marks them so where what reads y can take it (a
 * product: the next linear layer), and what writes x can write it. */
static unsigned act_bf16_io(const st_model *m, const st_layer *l)
{
    if (m->cfg.activations != ST_PRECISION_BF16)
        return 0u;
    /* GELU (not a ReLU: fused and folded ones keep fp32 gradients, and
     * --unfuse relu must compute what they do) takes dy and writes dx as
     * bf16 with x and y: one data type for its bf16 backward */
    const unsigned grads = l->activation == ST_ACT_GELU && !l->fuse_relu && !l->fold_relu
                               ? ST_BF16_DX | ST_BF16_DY | ST_BF16_TIED_GRADS : 0u;
    return ST_BF16_X | ST_BF16_Y | ST_BF16_TIED | grads;
}

const st_layer_kind st_layer_activation = {
    .name = "activation", .build = act_build, .forward = act_forward, .backward = act_backward,
    .costs = act_costs,
    .backward_reads = act_backward_reads, .bf16_io = act_bf16_io,
};

/*
 * nn/layers/attention.c — causal multi-head self-attention, the part
 * between the Q, K, V projection and the output projection (both linear
 * layers of their own, so that heads are width units like any neurons).
 *
 * Shapes, B samples of T tokens, Hk heads of size dh kept (Dk = Hk dh):
 *   x     (B x T, 3 Dk)   per token: q (Dk), k (Dk), v (Dk), each head-major
 *   P     (B, Hk, T, T)   probabilities, saved for the backward  [attention]
 *                         (fp32; in bf16, bf16: half the bytes)
 *   y     (B x T, Dk)     per token: the heads' outputs, head-major
 *
 *   S = (Q K^T) / sqrt(dh), S[i, j > i] = -inf    scores (in P's buffer)
 *   P = softmax(S) over j                         in place
 *   Y = P V
 * backward, dY given (dP and dS share one scratch of the model's):
 *   dV = P^T dY     dP = dY V^T     dS = softmax_backward(P, dP)
 *   dQ = dS K / sqrt(dh)            dK = dS^T Q / sqrt(dh)
 *
 * Every product is one oneDNN matmul batched over (B, Hk): the heads are
 * read where the projections wrote them, through strides (a head's Q is
 * the (T, dh) matrix at column h dh of x's q part, row stride 3 Dk), and
 * transposes are strides too, so nothing is copied.  The 1/sqrt(dh) is a
 * post-op of the products it scales.  The causal mask is a loop writing
 * -inf above the diagonal (T^2 / 2 stores per head, no read): a binary
 * post-op would need a (1, 1, T, T) operand broadcast over batch and heads,
 * which oneDNN 2.6's matmul does not fuse.  Masked probabilities are then
 * exactly 0, and so are their gradients.  A non-causal layer (a ViT's
 * encoder, st_attention_io.noncausal) has no mask: every token attends to
 * every token of its sample, and the rest is the same.
 *
 * In bf16 (--precision bf16) the six products read bf16 operands and
 * accumulate and write fp32, as linear layers do (oneDNN 2.6 creates each
 * as a bf16 x bf16 -> f32 matmul over the same strided 4-d views, the
 * scale post-op included: gemm:jit with avx512_core_bf16):
 *   xb = bf16(x)                 once per forward (a reorder); Q, K, V are
 *                                read from it through the same strides, by
 *                                the forward and again by the backward
 *   S = (Qb Kb^T) / sqrt(dh)     fp32, in the model's scratch, masked
 *   Pb = bf16(softmax(S))        softmax in fp32 in place, then a reorder
 *   Y = Pb Vb
 * backward:
 *   dYb = bf16(dY)               a reorder into the context's shared slot
 *   dV = Pb^T dYb    dP = dYb Vb^T (fp32, in the scratch)
 *   dSb = bf16(Pb (dP - sum_j Pb dP))   fp32 math, a loop, over Pb's buffer
 *   dQ = dSb Kb / sqrt(dh)       dK = dSb^T Qb / sqrt(dh)
 * The scores and the softmax stay fp32: the softmax subtracts the row's
 * maximum and exponentiates, and a bf16 score (8 significant bits) is off
 * by up to 2^-9 of its magnitude, a score of 20 by 0.04: every probability
 * would be off by 4% before any product; the sum over T keys normalising
 * them would lose as much again.  Rounded once at the end, P is off by
 * at most half a bf16 ulp (2^-9 .. 2^-8 relative), as any product's
 * operand.
 * Only Pb is kept for the backward (half the fp32 P, the largest
 * activation at a long context), so the softmax backward reads the
 * rounded P: its sum_j P dP and the products are fp32 (the terms P dP
 * nearly cancel against the sum), so dS is off by about as much as P,
 * what rounding dS for its products costs anyway (tests/test_layers_attention.c,
 * attention/bf16_*: y and dx within 0.3% rms of unrounded fp32 math;
 * tests/test_cli_precision.c: a gpt run within 0.01% of fp32's loss).  oneDNN 2.6's
 * softmax backward takes no bf16 P with an fp32 dP (unimplemented; only
 * all bf16, which would round dP before that cancellation), hence the
 * loop; it writes dS in bf16 over Pb, which the backward no longer needs
 * (dV has read it), so dS costs no buffer: after a backward, the saved
 * buffer holds dS, and the next forward writes P again.
 *
 * A subnetwork of heads keeps whole heads: its width layer's kept neurons
 * must be runs of dh (the projections' rows move with their head).  The
 * scale 1/sqrt(dh) is the head's, whatever is kept.
 */
#include <math.h>
#include <stdio.h>

#include "core/simd.h"
#include "nn/graph.h"

/* A (B, H, rows, cols) view of a buffer of dt values: row stride rs,
 * column stride cs, a sample every bs values, a head every hs. */
static void md4(dnnl_memory_desc_t *md, dnnl_data_type_t dt, int64_t B, int64_t H, int64_t rows,
                int64_t cols, int64_t bs, int64_t hs, int64_t rs, int64_t cs)
{
    dnnl_dims_t dims = { B, H, rows, cols }, strides = { bs, hs, rs, cs };
    dnnl_memory_desc_init_by_strides(md, 4, dims, dt, strides);
}

/* dst = scale (src x w), batched, over the views given; binds the three
 * arguments. */
static st_status matmul(st_nn_ctx *ctx, st_prim *p, dnnl_memory_t src, dnnl_memory_t w,
                        dnnl_memory_t dst, float scale, const char *what)
{
    const dnnl_memory_desc_t *src_md, *w_md, *dst_md;
    ST_DNNL(dnnl_memory_get_memory_desc(src, &src_md), what);
    ST_DNNL(dnnl_memory_get_memory_desc(w, &w_md), what);
    ST_DNNL(dnnl_memory_get_memory_desc(dst, &dst_md), what);
    dnnl_matmul_desc_t d;
    ST_DNNL(dnnl_matmul_desc_init(&d, src_md, w_md, NULL, dst_md), what);
    ST_TRY(st_prim_create_scaled(ctx, p, &d, NULL, scale, what, NULL));
    st_prim_arg(p, DNNL_ARG_SRC, src);
    st_prim_arg(p, DNNL_ARG_WEIGHTS, w);
    st_prim_arg(p, DNNL_ARG_DST, dst);
    return ST_OK;
}

size_t st_attention_probs_bytes(int64_t batch, int64_t heads, int64_t tokens, int bf16)
{
    return (size_t)(batch * heads * tokens * tokens) * (bf16 ? sizeof(st_bf16) : sizeof(float));
}

size_t st_attention_scratch_floats(int64_t batch, int64_t heads, int64_t tokens)
{
    return (size_t)(batch * heads * tokens * tokens);
}

/* bf16: the copy of x (the layer's own: the backward reads it again) and
 * the reorder that fills it; dy's copy (the shared slot ST_SLOT_IN: it
 * lives within one backward) and its reorder; dyb: its (B, H, T, dh) view. */
static st_status build_conversions(st_nn_ctx *ctx, st_attention *a, const st_attention_io *io,
                                   const dnnl_memory_desc_t *y_md, dnnl_memory_t *dyb)
{
    const int64_t BT = a->batch * a->tokens, Dk = a->heads * a->head_dim, X = 3 * Dk;
    if (a->x_half) {   /* x is bf16 already: Q, K, V are read from it */
        a->xb = (st_bf16 *)io->xb;
    } else {
        void *p;
        ST_TRY(st_arena_alloc(ctx->arena, ST_MEM_ACTIVATIONS,
                              (size_t)(BT * X) * sizeof(st_bf16), &p));
        a->xb = p;
        dnnl_memory_t x32, x16;
        ST_TRY(st_mem_matrix(ctx, &x32, BT, X, io->x));
        ST_TRY(st_mem_strided_bf16(ctx, &x16, BT, X, X, 1, a->xb));
        ST_TRY(st_prim_create_reorder(ctx, &a->to_bf16_x, x32, x16, "attention input to bf16"));
    }
    if (!a->has_dx)
        return ST_OK;
    if (a->dy_half)   /* dy is bf16 already: read where it lies */
        return st_mem_md(ctx, dyb, y_md, io->dyb);
    const size_t bytes = (size_t)(BT * Dk) * sizeof(st_bf16);
    dnnl_memory_t dy32, dy16;
    ST_TRY(st_mem_matrix(ctx, &dy32, BT, Dk, io->dy));
    ST_TRY(st_mem_slot_bf16(ctx, &dy16, BT, Dk, Dk, 1, ST_SLOT_IN, 0, bytes));
    ST_TRY(st_prim_create_reorder(ctx, &a->to_bf16_dy, dy32, dy16,
                                  "attention output gradient to bf16"));
    return st_mem_slot_md(ctx, dyb, y_md, ST_SLOT_IN, 0, bytes);
}

st_status st_attention_build(st_nn_ctx *ctx, st_attention *a, int64_t batch, int64_t tokens,
                             int64_t heads, int64_t head_dim, const st_attention_io *io)
{
    const int64_t B = batch, T = tokens, H = heads, dh = head_dim;
    *a = (st_attention){ .batch = B, .heads = H, .tokens = T, .head_dim = dh,
                         .scale = 1.0f / sqrtf((float)dh), .has_dx = io->dx != NULL,
                         .bf16 = io->bf16 != 0, .noncausal = io->noncausal != 0,
                         .x_half = io->bf16 && io->xb };
    a->dy_half = a->bf16 && a->has_dx && io->dyb;
    a->dx_half = a->bf16 && a->has_dx && io->dxb;
    if ((io->yb || io->dyb || io->dxb) && !io->bf16)
        return st_fail(ST_ERR_INVALID, "attention: a bf16 output needs bf16 products");
    const int64_t Dk = H * dh, X = 3 * Dk;   /* a token's row of x */
    /* Views, (B, H, rows, cols), of the products' operands (dnnl_bf16 in
     * bf16) and of their fp32 outputs.  part: one of x's (and dx's) three
     * parts, Q, K or V, at its offset; part_t its transpose; y: y's and
     * dy's heads; p, p_t: the scores, probabilities and their gradients,
     * dense. */
    const dnnl_data_type_t op = a->bf16 ? dnnl_bf16 : dnnl_f32;
    dnnl_memory_desc_t part_md, part_t_md, y_md, p_md, p_t_md, part32_md, y32_md, p32_md;
    md4(&part_md, op, B, H, T, dh, T * X, dh, X, 1);
    md4(&part_t_md, op, B, H, dh, T, T * X, dh, 1, X);
    md4(&y_md, op, B, H, T, dh, T * Dk, dh, Dk, 1);
    md4(&p_md, op, B, H, T, T, H * T * T, T * T, T, 1);
    md4(&p_t_md, op, B, H, T, T, H * T * T, T * T, 1, T);
    md4(&part32_md, dnnl_f32, B, H, T, dh, T * X, dh, X, 1);
    md4(&y32_md, dnnl_f32, B, H, T, dh, T * Dk, dh, Dk, 1);
    md4(&p32_md, dnnl_f32, B, H, T, T, H * T * T, T * T, T, 1);

    /* The operands: x's parts (fp32, or the bf16 copy), P (and in bf16
     * dS, over it), dy (fp32, or its bf16 copy in the shared slot). */
    dnnl_memory_t mdyb = NULL;
    if (a->bf16)
        ST_TRY(build_conversions(ctx, a, io, &y_md, &mdyb));
    const size_t es = a->bf16 ? sizeof(st_bf16) : sizeof(float);
    const char *xo = a->bf16 ? (const char *)a->xb : (const char *)io->x;
    dnnl_memory_t q, k, v, k_t, v_t, P, P_t, y;
    ST_TRY(st_mem_md(ctx, &q, &part_md, xo));
    ST_TRY(st_mem_md(ctx, &k, &part_md, xo + Dk * es));
    ST_TRY(st_mem_md(ctx, &v, &part_md, xo + 2 * Dk * es));
    ST_TRY(st_mem_md(ctx, &k_t, &part_t_md, xo + Dk * es));
    ST_TRY(st_mem_md(ctx, &v_t, &part_t_md, xo + 2 * Dk * es));
    ST_TRY(st_mem_md(ctx, &P, &p_md, io->probs));
    ST_TRY(st_mem_md(ctx, &P_t, &p_t_md, io->probs));
    if (io->yb)   /* P V rounded once as it is written */
        ST_TRY(st_mem_md(ctx, &y, &y_md, io->yb));
    else
        ST_TRY(st_mem_md(ctx, &y, &y32_md, io->y));
    /* the scores: in P's buffer, where the softmax turns them into P in
     * place; in bf16 in the scratch (fp32), P too, then rounded into Pb */
    a->S = a->bf16 ? io->scratch : io->probs;
    dnnl_memory_t S;
    ST_TRY(st_mem_md(ctx, &S, &p32_md, a->S));
    ST_TRY(matmul(ctx, &a->scores, q, k_t, S, a->scale, "attention scores"));

    dnnl_memory_desc_t rows_md;
    st_md_matrix(&rows_md, B * H * T, T);
    dnnl_memory_t mrows;
    ST_TRY(st_mem_matrix(ctx, &mrows, B * H * T, T, a->S));
    dnnl_softmax_desc_t sf, sb;
    ST_DNNL(dnnl_softmax_forward_desc_init(&sf, dnnl_forward_training, &rows_md, 1),
            "attention softmax descriptor");
    ST_DNNL(dnnl_softmax_backward_desc_init(&sb, &rows_md, &rows_md, 1),
            "attention softmax backward descriptor");
    if (a->has_dx && !a->bf16) {
        ST_TRY(st_prim_create_pair(ctx, &a->softmax, &sf, &a->d_softmax, &sb,
                                   "attention softmax", "attention softmax backward"));
        dnnl_memory_t mds;
        ST_TRY(st_mem_matrix(ctx, &mds, B * H * T, T, io->scratch));
        st_prim_arg(&a->d_softmax, DNNL_ARG_DST, mrows);
        st_prim_arg(&a->d_softmax, DNNL_ARG_DIFF_DST, mds);
        st_prim_arg(&a->d_softmax, DNNL_ARG_DIFF_SRC, mds);   /* in place */
    } else {   /* bf16: the backward is the loop below */
        ST_TRY(st_prim_create(ctx, &a->softmax, &sf, NULL, "attention softmax", NULL));
    }
    st_prim_arg(&a->softmax, DNNL_ARG_SRC, mrows);
    st_prim_arg(&a->softmax, DNNL_ARG_DST, mrows);               /* in place */
    if (a->bf16) {
        /* P in fp32 in the scratch, then rounded once into Pb.  (softmax
         * v2 writes bf16 itself, but oneDNN 2.6's rounds twice, its
         * exponentials and then their quotients: a quarter of the values
         * one bf16 ulp off the nearest, measured over random rows.) */
        dnnl_memory_t mpb;
        ST_TRY(st_mem_strided_bf16(ctx, &mpb, B * H * T, T, T, 1, io->probs));
        ST_TRY(st_prim_create_reorder(ctx, &a->to_bf16_p, mrows, mpb,
                                      "attention probabilities to bf16"));
        a->pb = io->probs;
        a->dp = io->scratch;
    }
    ST_TRY(matmul(ctx, &a->context, P, v, y, 1.0f, "attention context"));
    if (!a->has_dx)
        return ST_OK;

    /* backward: dP in the scratch; dS there too, in place (fp32), or in
     * bf16 over Pb (the loop) */
    /* dx's parts: fp32, or bf16 rounded once as the products write them */
    const char *dxo = a->dx_half ? (const char *)io->dxb : (const char *)io->dx;
    const dnnl_memory_desc_t *dpart_md = a->dx_half ? &part_md : &part32_md;
    const size_t des = a->dx_half ? sizeof(st_bf16) : sizeof(float);
    dnnl_memory_t dy, dq, dk, dv, dP, dS, dS_t;
    if (a->bf16)
        dy = mdyb;
    else
        ST_TRY(st_mem_md(ctx, &dy, &y_md, io->dy));
    ST_TRY(st_mem_md(ctx, &dq, dpart_md, dxo));
    ST_TRY(st_mem_md(ctx, &dk, dpart_md, dxo + Dk * des));
    ST_TRY(st_mem_md(ctx, &dv, dpart_md, dxo + 2 * Dk * des));
    ST_TRY(st_mem_md(ctx, &dP, &p32_md, io->scratch));
    if (a->bf16) {
        dS = P;
        dS_t = P_t;
    } else {
        dS = dP;
        ST_TRY(st_mem_md(ctx, &dS_t, &p_t_md, io->scratch));
    }
    /* dx's parts go where the projection's backward reads them */
    ST_TRY(matmul(ctx, &a->d_v, P_t, dy, dv, 1.0f, "attention backward dV"));
    ST_TRY(matmul(ctx, &a->d_probs, dy, v_t, dP, 1.0f, "attention backward dP"));
    ST_TRY(matmul(ctx, &a->d_q, dS, k, dq, a->scale, "attention backward dQ"));
    return matmul(ctx, &a->d_k, dS_t, q, dk, a->scale, "attention backward dK");
}

/* -inf above the diagonal of every (T, T) block of scores. */
static void causal_mask(const st_attention *a, float *S)
{
    const int64_t T = a->tokens;
    for (int64_t blk = 0; blk < a->batch * a->heads; blk++, S += T * T)
        for (int64_t i = 0; i + 1 < T; i++)
            for (int64_t j = i + 1; j < T; j++)
                S[i * T + j] = -INFINITY;
}

/* p[j] = bf16(fp32(p[j]) (dp[j] - sum)), j < n: one row of dS over P */
ST_VECTOR_CLONES
static void dsoftmax_row_bf16(st_bf16 *restrict p, const float *restrict dp, int64_t n, float sum)
{
#pragma omp simd
    for (int64_t j = 0; j < n; j++)
        p[j] = st_bf16_from_float(st_bf16_to_float(p[j]) * (dp[j] - sum));
}

/* bf16: dS = P (dP - sum_j P dP) per row of every (T, T) block, P read
 * from pb and dS written over it, in bf16; fp32 math (header).  A causal
 * row i has keys j <= i only (P is exactly 0 beyond: so is dS). */
static void softmax_backward_bf16(const st_attention *a)
{
    const int64_t T = a->tokens;
    st_bf16 *p = a->pb;
    const float *dp = a->dp;
    for (int64_t r = 0; r < a->batch * a->heads * T; r++, p += T, dp += T) {
        const int64_t n = a->noncausal ? T : r % T + 1;
        float sum = 0.0f;
        for (int64_t j = 0; j < n; j++)
            sum += st_bf16_to_float(p[j]) * dp[j];
        dsoftmax_row_bf16(p, dp, n, sum);   /* the sum above stays in order: a
                                             * vector sum would change its bits */
        for (int64_t j = n; j < T; j++)
            p[j] = 0;
    }
}

st_status st_attention_forward(const st_nn_ctx *ctx, const st_attention *a)
{
    if (a->bf16 && !a->x_half)
        ST_TRY(st_prim_run(ctx, &a->to_bf16_x));
    ST_TRY(st_prim_run(ctx, &a->scores));
    if (!a->noncausal)
        causal_mask(a, a->S);
    ST_TRY(st_prim_run(ctx, &a->softmax));
    if (a->bf16)
        ST_TRY(st_prim_run(ctx, &a->to_bf16_p));
    return st_prim_run(ctx, &a->context);
}

st_status st_attention_backward(const st_nn_ctx *ctx, const st_attention *a)
{
    if (!a->has_dx)
        return ST_OK;
    if (a->bf16 && !a->dy_half)
        ST_TRY(st_prim_run(ctx, &a->to_bf16_dy));
    ST_TRY(st_prim_run(ctx, &a->d_v));
    ST_TRY(st_prim_run(ctx, &a->d_probs));
    if (a->bf16)
        softmax_backward_bf16(a);
    else
        ST_TRY(st_prim_run(ctx, &a->d_softmax));
    ST_TRY(st_prim_run(ctx, &a->d_q));
    return st_prim_run(ctx, &a->d_k);
}

/* ------------------------------------------------------------ the layer kind */

static int precision_bf16(const st_model *m)
{
    return m->cfg.precision == ST_PRECISION_BF16;
}

/* Heads kept by this instance. */
static int64_t kept_heads(const st_model *m, const st_layer *l)
{
    const int64_t dh = l->out / l->heads;
    return st_graph_cols(m, l->y) / dh;
}

/* Tokens per sample: the rows of its input per sample. */
static int64_t tokens(const st_model *m, const st_layer *l)
{
    return st_graph_rows(m, l->x) / m->batch;
}

/* The probabilities, kept for the backward (bf16: half the bytes). */
static st_status attn_alloc(st_model *m, st_layer *l)
{
    void *p;
    ST_TRY(st_arena_alloc(m->arena, ST_MEM_ATTENTION,
                          st_attention_probs_bytes(m->batch, kept_heads(m, l), tokens(m, l),
                                                   precision_bf16(m)), &p));
    l->saved[0] = p;
    return ST_OK;
}

/* dP, then dS in place (bf16: the scores in the forward, dP in the
 * backward): one scratch shared with the other layers' (one pass at a
 * time, nothing kept from one to the next). */
static size_t attn_scratch(const st_model *m, const st_layer *l)
{
    return st_attention_scratch_floats(m->batch, kept_heads(m, l), tokens(m, l));
}

static st_status attn_build(st_model *m, st_layer *l)
{
    const int64_t B = m->batch, T = tokens(m, l), dh = l->out / l->heads;
    const int64_t Dk = st_graph_cols(m, l->y);
    if (T < 1 || l->heads < 1 || l->out % l->heads != 0)
        return st_fail(ST_ERR_INVALID, "%s: attention needs a context and heads dividing the "
                       "width", l->name);
    if (Dk % dh != 0 || st_graph_cols(m, l->x) != 3 * Dk)
        return st_fail(ST_ERR_INVALID, "%s: a subnetwork keeps whole heads: %lld of %lld "
                       "features is not a multiple of the head size %lld (the neuron group "
                       "must be)", l->name, (long long)Dk, (long long)l->out, (long long)dh);
    st_neuron_sel tmp;
    const st_neuron_sel *kept = st_graph_sel(m, l->out_unit, l->out, &tmp);
    for (int64_t i = 0; kept->ids && i < kept->n; i++)
        if (kept->ids[i] % dh != i % dh)   /* a head starts at a multiple of dh, whole */
            return st_fail(ST_ERR_INVALID, "%s: a subnetwork keeps whole heads: its neuron %lld "
                           "is neuron %d of the layer, not of a whole head of %lld (the neuron "
                           "group must be a multiple of the head size)", l->name, (long long)i,
                           (int)kept->ids[i], (long long)dh);
    const st_attention_io io = {
        .x = st_graph_data(m, l->x), .y = st_graph_data(m, l->y),
        .dx = st_graph_data(m, l->dx), .dy = st_graph_data(m, l->dy),
        .probs = l->saved[0], .scratch = st_graph_grad_scratch(m), .bf16 = precision_bf16(m),
        .noncausal = l->noncausal,
        .xb = st_graph_data_bf16(m, l->x), .yb = st_graph_data_bf16(m, l->y),
        .dyb = st_graph_data_bf16(m, l->dy), .dxb = st_graph_data_bf16(m, l->dx),
    };
    return st_attention_build(&m->ctx, &l->u.attn, B, T, Dk / dh, dh, &io);
}

static st_status attn_forward(const st_nn_ctx *ctx, const st_layer *l, st_phase phase)
{
    (void)phase;
    return st_attention_forward(ctx, &l->u.attn);
}

static st_status attn_backward(const st_nn_ctx *ctx, const st_layer *l)
{
    return st_attention_backward(ctx, &l->u.attn);
}

/* Two batched products forward (scores, context), four backward, each
 * B Hk T^2 dh multiply-adds (the masked half included: the products
 * compute it). */
static double attn_flops(const st_layer *l)
{
    const st_attention *a = &l->u.attn;
    const double one = 2.0 * (double)(a->batch * a->heads) * (double)(a->tokens * a->tokens) *
                       (double)a->head_dim;
    return one * (a->has_dx ? 6.0 : 2.0);
}

/* attn_flops's batched products, each one execution over every sample
 * and head (priced as the product of their rows stacked, B Hk T), and the softmax's passes over
 * the (B Hk T T) probabilities (forward: read and write; backward: P, dP
 * read, dS written); in bf16 the copies of x, P and dy. */
static void attn_costs(const st_model *m, const st_layer *l, int forward_only, st_cost_sink *s)
{
    (void)m;
    const st_attention *a = &l->u.attn;
    const int b = a->bf16;
    const int64_t rows = a->batch * a->heads * a->tokens, T = a->tokens, dh = a->head_dim;
    const double probs = (double)rows * (double)T, x = 3.0 * (double)(rows * dh);
    st_cost_heads(s, b, ST_OPERANDS_NT, rows, T, dh, 1.0);    /* S = Q K^T */
    st_cost_heads(s, b, ST_OPERANDS_NN, rows, dh, T, 1.0);    /* O = P V */
    st_cost_pass(s, ST_OP_SOFTMAX, 0, probs, 8.0 * probs, 1.0);
    if (b)   /* x's copy (none where x is stored as bf16) and P's */
        st_cost_move(s, 6.0 * ((a->x_half ? 0.0 : x) + probs), a->x_half ? 1.0 : 2.0);
    if (forward_only || !a->has_dx)
        return;
    st_cost_heads(s, b, ST_OPERANDS_NT, rows, T, dh, 1.0);    /* dP = dO V^T */
    st_cost_heads(s, b, ST_OPERANDS_NN, rows, dh, T, 1.0);    /* dQ = dS K */
    st_cost_heads(s, b, ST_OPERANDS_TN, rows, dh, T, 2.0);    /* dV = P^T dO, dK */
    st_cost_pass(s, ST_OP_SOFTMAX, 1, probs, 12.0 * probs, 1.0);
    if (b && !a->dy_half)   /* dy's copy */
        st_cost_move(s, 6.0 * (double)(rows * dh), 1.0);
}

/* fp32: the backward reads Q, K, V in x (and P, its own); bf16: x's
 * copy xb and Pb only (x itself where it is stored as bf16: xb is x).
 * Never y. */
static unsigned attn_backward_reads(const st_model *m, const st_layer *l)
{
    return m->cfg.precision != ST_PRECISION_BF16 || st_graph_is_half(m, l->x) ? ST_READS_X
                                                                             : 0u;
}

/* bf16: its products read x through a bf16 copy (x stored as bf16 is
 * that operand), and what reads y is the output projection's product,
 * which rounds it to bf16 anyway: both may be bf16 at no change.  With
 * bf16 activations dy is read as bf16 (its copy) and dx may be written
 * as bf16: the projection's products read it rounded anyway, its bias
 * gradient then sums the rounded values. */
static unsigned attn_bf16_io(const st_model *m, const st_layer *l)
{
    (void)l;
    const unsigned grads = m->cfg.activations == ST_PRECISION_BF16 ? ST_BF16_DX | ST_BF16_DY
                                                                   : 0u;
    return ST_BF16_X | ST_BF16_Y | grads;
}

const st_layer_kind st_layer_attention = {
    .name = "attention", .alloc = attn_alloc, .build = attn_build,
    .forward = attn_forward, .backward = attn_backward, .flops = attn_flops,
    .costs = attn_costs,
    .grad_scratch = attn_scratch, .backward_reads = attn_backward_reads,
    .bf16_io = attn_bf16_io,
};

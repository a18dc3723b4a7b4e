/*
 * nn/layers/attention.c — causal multi-head self-attention, the part
 * between the Q, K, V projection and the output projection (both linear
 * layers of their own, so that heads are width units like any neurons).
 *
 * Shapes, B samples of T tokens, Hk heads of size dh kept (Dk = Hk dh):
 *   x     (B x T, 3 Dk)   per token: q (Dk), k (Dk), v (Dk), each head-major
 *   P     (B, Hk, T, T)   probabilities, saved for the backward  [attention]
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
 * exactly 0, and so are their gradients.
 *
 * A subnetwork of heads keeps whole heads: its width layer's kept neurons
 * must be runs of dh (the projections' rows move with their head).  The
 * scale 1/sqrt(dh) is the head's, whatever is kept.
 */
#include <math.h>
#include <stdio.h>

#include "nn/graph.h"

/* A (B, H, rows, cols) view of a buffer: row stride rs, column stride cs,
 * a sample every bs floats, a head every hs. */
static void md4(dnnl_memory_desc_t *md, int64_t B, int64_t H, int64_t rows, int64_t cols,
                int64_t bs, int64_t hs, int64_t rs, int64_t cs)
{
    dnnl_dims_t dims = { B, H, rows, cols }, strides = { bs, hs, rs, cs };
    dnnl_memory_desc_init_by_strides(md, 4, dims, dnnl_f32, strides);
}

/* dst = scale (src x w), batched; binds the three arguments. */
static st_status matmul(st_nn_ctx *ctx, st_prim *p, const dnnl_memory_desc_t *src_md,
                        const float *src, const dnnl_memory_desc_t *w_md, const float *w,
                        const dnnl_memory_desc_t *dst_md, float *dst, float scale,
                        const char *what)
{
    dnnl_matmul_desc_t d;
    ST_DNNL(dnnl_matmul_desc_init(&d, src_md, w_md, NULL, dst_md), what);
    ST_TRY(st_prim_create_scaled(ctx, p, &d, NULL, scale, what, NULL));
    dnnl_memory_t ms, mw, md;
    ST_TRY(st_mem_md(ctx, &ms, src_md, src));
    ST_TRY(st_mem_md(ctx, &mw, w_md, w));
    ST_TRY(st_mem_md(ctx, &md, dst_md, dst));
    st_prim_arg(p, DNNL_ARG_SRC, ms);
    st_prim_arg(p, DNNL_ARG_WEIGHTS, mw);
    st_prim_arg(p, DNNL_ARG_DST, md);
    return ST_OK;
}

/* Floats of a (B, Hk, T, T) tensor of the kept heads' scores. */
static size_t scores_floats(const st_model *m, const st_layer *l)
{
    const int64_t dh = l->out / l->heads, Hk = st_graph_cols(m, l->y) / dh;
    return (size_t)(m->batch * Hk * m->cfg.context * m->cfg.context);
}

/* The probabilities, kept for the backward. */
static st_status attn_alloc(st_model *m, st_layer *l)
{
    return st_arena_alloc_floats(m->arena, ST_MEM_ATTENTION, scores_floats(m, l), &l->saved[0]);
}

/* dP, then dS in place: one scratch shared with the other layers'
 * backward scratch (one backward at a time). */
static size_t attn_scratch(const st_model *m, const st_layer *l)
{
    return scores_floats(m, l);
}

static st_status attn_build(st_model *m, st_layer *l)
{
    struct st_attention *a = &l->u.attn;
    const int64_t B = m->batch, T = m->cfg.context, dh = l->out / l->heads;
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
    *a = (struct st_attention){ .batch = B, .heads = Dk / dh, .tokens = T, .head_dim = dh,
                                .scale = 1.0f / sqrtf((float)dh) };
    const int64_t H = a->heads, X = 3 * Dk;   /* a token's row of x */
    const float *x = st_graph_data(m, l->x);
    float *y = st_graph_data(m, l->y), *P = l->saved[0];
    /* Views, (B, H, rows, cols).  part: one of x's (and dx's) three parts,
     * Q, K or V, at its offset; part_t its transpose; y: y's and dy's heads;
     * p, p_t: the scores, probabilities and their gradients, dense. */
    dnnl_memory_desc_t part_md, part_t_md, y_md, p_md, p_t_md;
    md4(&part_md, B, H, T, dh, T * X, dh, X, 1);
    md4(&part_t_md, B, H, dh, T, T * X, dh, 1, X);
    md4(&y_md, B, H, T, dh, T * Dk, dh, Dk, 1);
    md4(&p_md, B, H, T, T, H * T * T, T * T, T, 1);
    md4(&p_t_md, B, H, T, T, H * T * T, T * T, 1, T);
    ST_TRY(matmul(&m->ctx, &a->scores, &part_md, x, &part_t_md, x + Dk, &p_md, P, a->scale,
                  "attention scores"));
    dnnl_memory_desc_t rows_md;
    st_md_matrix(&rows_md, B * H * T, T);
    dnnl_softmax_desc_t sf, sb;
    ST_DNNL(dnnl_softmax_forward_desc_init(&sf, dnnl_forward_training, &rows_md, 1),
            "attention softmax descriptor");
    ST_DNNL(dnnl_softmax_backward_desc_init(&sb, &rows_md, &rows_md, 1),
            "attention softmax backward descriptor");
    float *dx = st_graph_data(m, l->dx), *dS = st_graph_grad_scratch(m);
    const float *dy = st_graph_data(m, l->dy);
    a->has_dx = dx != NULL;
    dnnl_memory_t mp, mds;
    ST_TRY(st_mem_matrix(&m->ctx, &mp, B * H * T, T, P));
    if (a->has_dx) {
        ST_TRY(st_prim_create_pair(&m->ctx, &a->softmax, &sf, &a->d_softmax, &sb,
                                   "attention softmax", "attention softmax backward"));
        ST_TRY(st_mem_matrix(&m->ctx, &mds, B * H * T, T, dS));
        st_prim_arg(&a->d_softmax, DNNL_ARG_DST, mp);
        st_prim_arg(&a->d_softmax, DNNL_ARG_DIFF_DST, mds);
        st_prim_arg(&a->d_softmax, DNNL_ARG_DIFF_SRC, mds);   /* in place */
    } else {
        ST_TRY(st_prim_create(&m->ctx, &a->softmax, &sf, NULL, "attention softmax", NULL));
    }
    st_prim_arg(&a->softmax, DNNL_ARG_SRC, mp);
    st_prim_arg(&a->softmax, DNNL_ARG_DST, mp);               /* in place */
    ST_TRY(matmul(&m->ctx, &a->context, &p_md, P, &part_md, x + 2 * Dk, &y_md, y, 1.0f,
                  "attention context"));
    if (!a->has_dx)
        return ST_OK;
    /* dx's parts go where the projection's backward reads them */
    ST_TRY(matmul(&m->ctx, &a->d_v, &p_t_md, P, &y_md, dy, &part_md, dx + 2 * Dk, 1.0f,
                  "attention backward dV"));
    ST_TRY(matmul(&m->ctx, &a->d_probs, &y_md, dy, &part_t_md, x + 2 * Dk, &p_md, dS, 1.0f,
                  "attention backward dP"));
    ST_TRY(matmul(&m->ctx, &a->d_q, &p_md, dS, &part_md, x + Dk, &part_md, dx, a->scale,
                  "attention backward dQ"));
    ST_TRY(matmul(&m->ctx, &a->d_k, &p_t_md, dS, &part_md, x, &part_md, dx + Dk, a->scale,
                  "attention backward dK"));
    return ST_OK;
}

/* -inf above the diagonal of every (T, T) block of scores. */
static void causal_mask(const struct st_attention *a, float *S)
{
    const int64_t T = a->tokens;
    for (int64_t blk = 0; blk < a->batch * a->heads; blk++, S += T * T)
        for (int64_t i = 0; i + 1 < T; i++)
            for (int64_t j = i + 1; j < T; j++)
                S[i * T + j] = -INFINITY;
}

static st_status attn_forward(const st_nn_ctx *ctx, const st_layer *l, st_phase phase)
{
    const struct st_attention *a = &l->u.attn;
    ST_TRY(st_prim_run(ctx, &a->scores));
    causal_mask(a, l->saved[0]);
    ST_TRY(st_prim_run(ctx, &a->softmax));
    return st_prim_run(ctx, &a->context);
}

static st_status attn_backward(const st_nn_ctx *ctx, const st_layer *l)
{
    const struct st_attention *a = &l->u.attn;
    ST_TRY(st_prim_run(ctx, &a->d_v));
    ST_TRY(st_prim_run(ctx, &a->d_probs));
    ST_TRY(st_prim_run(ctx, &a->d_softmax));
    ST_TRY(st_prim_run(ctx, &a->d_q));
    return st_prim_run(ctx, &a->d_k);
}

/* Two batched products forward (scores, context), four backward, each
 * B Hk T^2 dh multiply-adds (the masked half included: the products
 * compute it). */
static double attn_flops(const st_layer *l)
{
    const struct st_attention *a = &l->u.attn;
    const double one = 2.0 * (double)(a->batch * a->heads) * (double)(a->tokens * a->tokens) *
                       (double)a->head_dim;
    return one * (a->has_dx ? 6.0 : 2.0);
}

const st_layer_kind st_layer_attention = {
    .name = "attention", .alloc = attn_alloc, .build = attn_build,
    .forward = attn_forward, .backward = attn_backward, .flops = attn_flops,
    .grad_scratch = attn_scratch,
};

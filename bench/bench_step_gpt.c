/*
 * bench/bench_step_gpt.c — what bench_step's gpt configuration needs
 * besides the step (bench_step.c says how it is measured): the FLOPs its
 * architecture should count, generated text to train on, and a copy of
 * one attention layer built with oneDNN's public API whose parts are
 * timed.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "bench_step.h"

const char *const ATTN_PART_NAMES[A_PARTS] = {
    "scores", "mask", "softmax", "context", "dV", "dP", "softmax-bwd", "dQ", "dK",
};

/* The FLOPs st_model_step_flops should count for the gpt config, from
 * the architecture of subtrain/model.h: per block the linear layers qkv
 * (D -> 3 D), proj (D -> D), fc1 (D -> F), fc2 (F -> D), three products
 * each over R = B T rows, and attention's six batched products (scores,
 * context; dV, dP, dQ, dK) of B H T^2 dh multiply-adds each, the masked
 * half included; then the head (D -> 256, three products: the final layer
 * norm needs its input gradient).  The embedding is a lookup, no FLOPs. */
void gpt_flops(const bench_config *bc, double *linear, double *attention)
{
    const double R = (double)bc->batch * bc->context, D = bc->width, F = 4.0 * D;
    const double T = bc->context, dh = D / bc->heads;
    const double block = 3.0 * 2.0 * R * (D * 3.0 * D + D * D + 2.0 * D * F);
    *linear = bc->depth * block + 3.0 * 2.0 * R * D * 256.0;
    *attention = bc->depth * 6.0 * 2.0 * (double)bc->batch * bc->heads * T * T * dh;
}

/* Pseudo-English for the gpt config: words of a small vocabulary, the
 * frequent ones drawn more often, in sentences of 4 to 15 words with
 * commas, full stops and line breaks.  What the bytes are does not change
 * the cost of a step (the embedding is a lookup, the loss reads one label
 * a token); generating them keeps the bench free of files. */
int make_text(size_t n, uint64_t seed, st_text *out)
{
    static const char *const words[] = {
        "the", "of", "and", "a", "to", "in", "is", "it", "that", "was", "for", "on", "as",
        "with", "he", "be", "at", "by", "this", "had", "not", "are", "but", "from", "or",
        "have", "an", "they", "which", "one", "you", "were", "her", "all", "she", "there",
        "would", "their", "we", "him", "been", "has", "when", "who", "will", "more", "no",
        "if", "out", "so", "said", "what", "up", "its", "about", "into", "than", "them",
        "can", "only", "other", "new", "some", "could", "time", "these", "two", "may",
        "then", "do", "first", "any", "my", "now", "such", "like", "our", "over", "man",
        "me", "even", "most", "made", "after", "also", "did", "many", "before", "must",
        "through", "years", "where", "much", "your", "way", "well", "down", "should",
        "because", "each", "just", "those", "people", "water", "light", "word", "number",
    };
    const uint32_t n_words = (uint32_t)(sizeof words / sizeof words[0]);
    uint8_t *b = malloc(n);
    if (!b)
        return -1;
    st_rng rng = st_rng_seed(seed);
    size_t at = 0;
    while (at < n) {
        const uint32_t len = 4 + st_rng_below(&rng, 12);
        for (uint32_t w = 0; w < len && at < n; w++) {
            /* the minimum of two draws: low indices (the frequent words) win */
            const char *word = words[st_rng_below(&rng, 1 + st_rng_below(&rng, n_words))];
            for (size_t c = 0; word[c] && at < n; c++)
                b[at++] = (uint8_t)(w == 0 && c == 0 ? word[c] - 'a' + 'A' : word[c]);
            if (w + 1 < len && at < n && st_rng_below(&rng, 8) == 0)
                b[at++] = ',';
            if (w + 1 < len && at < n)
                b[at++] = ' ';
        }
        if (at < n)
            b[at++] = '.';
        if (at < n)
            b[at++] = st_rng_below(&rng, 6) == 0 ? '\n' : ' ';
    }
    *out = (st_text){ b, n, n - n / 16 };
    return 0;
}

#define ATTN_TRY(call, what)                                                           \
    do {                                                                               \
        dnnl_status_t dnnl_s_ = (call);                                                \
        if (dnnl_s_ != dnnl_success) {                                                 \
            fprintf(stderr, "bench_step: attention: %s failed (oneDNN status %d)\n", what, \
                    (int)dnnl_s_);                                                     \
            return -1;                                                                 \
        }                                                                              \
    } while (0)

/* A (B, H, rows, cols) view, as attention.c's md4. */
static void attn_md4(dnnl_memory_desc_t *md, int64_t B, int64_t H, int64_t rows, int64_t cols,
                     int64_t bs, int64_t hs, int64_t rs, int64_t cs)
{
    dnnl_dims_t dims = { B, H, rows, cols }, strides = { bs, hs, rs, cs };
    dnnl_memory_desc_init_by_strides(md, 4, dims, dnnl_f32, strides);
}

static int attn_mem(attn_ref *a, const dnnl_memory_desc_t *md, float *data, dnnl_memory_t *out)
{
    if (a->n_mem >= ATTN_MAX_MEM)
        return -1;
    ATTN_TRY(dnnl_memory_create(out, md, a->engine, data), "memory");
    a->mem[a->n_mem++] = *out;
    return 0;
}

/* Creates prim[part] from an operation descriptor, with scale as an
 * eltwise_linear post-op unless it is 1 (as st_prim_create_scaled). */
static int attn_prim(attn_ref *a, int part, const void *desc, const_dnnl_primitive_desc_t hint,
                     float scale, dnnl_primitive_desc_t *pd_out)
{
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t ops = NULL;
    dnnl_primitive_desc_t pd = NULL;
    int rc = -1;
    if (scale != 1.0f) {
        if (dnnl_primitive_attr_create(&attr) != dnnl_success ||
            dnnl_post_ops_create(&ops) != dnnl_success ||
            dnnl_post_ops_append_eltwise(ops, 1.0f, dnnl_eltwise_linear, scale, 0.0f) !=
                dnnl_success ||
            dnnl_primitive_attr_set_post_ops(attr, ops) != dnnl_success)
            goto out;
    }
    if (dnnl_primitive_desc_create(&pd, desc, attr, a->engine, hint) != dnnl_success ||
        dnnl_primitive_create(&a->prim[part], pd) != dnnl_success)
        goto out;
    if (part == A_SCORES)
        conv_impl_name(pd, a->impl, sizeof a->impl);
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "bench_step: attention: no primitive for %s\n", ATTN_PART_NAMES[part]);
    if (ops)
        dnnl_post_ops_destroy(ops);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    if (pd && (rc || !pd_out))
        dnnl_primitive_desc_destroy(pd);
    else if (pd_out)
        *pd_out = pd;
    return rc;
}

/* dst = scale (src x w), batched over (B, H): prim[part] and its arguments. */
static int attn_matmul(attn_ref *a, int part, const dnnl_memory_desc_t *src_md, float *src,
                       const dnnl_memory_desc_t *w_md, float *w, const dnnl_memory_desc_t *dst_md,
                       float *dst, float scale)
{
    dnnl_matmul_desc_t d;
    ATTN_TRY(dnnl_matmul_desc_init(&d, src_md, w_md, NULL, dst_md), ATTN_PART_NAMES[part]);
    if (attn_prim(a, part, &d, NULL, scale, NULL))
        return -1;
    dnnl_memory_t ms, mw, md;
    if (attn_mem(a, src_md, src, &ms) || attn_mem(a, w_md, w, &mw) || attn_mem(a, dst_md, dst, &md))
        return -1;
    const dnnl_exec_arg_t args[3] = {
        { DNNL_ARG_SRC, ms }, { DNNL_ARG_WEIGHTS, mw }, { DNNL_ARG_DST, md },
    };
    memcpy(a->args[part], args, sizeof args);
    a->nargs[part] = 3;
    return 0;
}

void attn_ref_free(attn_ref *a)
{
    for (int i = 0; i < A_PARTS; i++)
        if (a->prim[i])
            dnnl_primitive_destroy(a->prim[i]);
    for (int i = 0; i < a->n_mem; i++)
        dnnl_memory_destroy(a->mem[i]);
    if (a->stream)
        dnnl_stream_destroy(a->stream);
    if (a->engine)
        dnnl_engine_destroy(a->engine);
    free(a->x);
    free(a->y);
    free(a->P);
    free(a->dS);
    free(a->dy);
    free(a->dx);
    memset(a, 0, sizeof *a);
}

/* Built on this thread (one OpenMP thread, the worker's PU), as the
 * model's primitives are built on the worker's. */
int attn_ref_init(attn_ref *a, const bench_config *bc)
{
    memset(a, 0, sizeof *a);
    const int64_t B = bc->batch, T = bc->context, Dk = bc->width, H = bc->heads;
    const int64_t dh = Dk / H, X = 3 * Dk;
    a->batch = B, a->heads = H, a->tokens = T, a->head_dim = dh;
    a->product_flops = 2.0 * (double)(B * H) * (double)(T * T) * (double)dh;
    const float scale = 1.0f / sqrtf((float)dh);
    a->x = alloc_floats((size_t)(B * T * X));
    a->dx = alloc_floats((size_t)(B * T * X));
    a->y = alloc_floats((size_t)(B * T * Dk));
    a->dy = alloc_floats((size_t)(B * T * Dk));
    a->P = alloc_floats((size_t)(B * H * T * T));
    a->dS = alloc_floats((size_t)(B * H * T * T));
    if (!a->x || !a->dx || !a->y || !a->dy || !a->P || !a->dS) {
        fprintf(stderr, "bench_step: out of memory for the attention buffers\n");
        return -1;
    }
    /* ordinary values in x (Q, K, V) and dy; the rest is written before read */
    st_rng rng = st_rng_seed(12);
    for (int64_t i = 0; i < B * T * X; i++)
        a->x[i] = st_rng_uniform(&rng) - 0.5f;
    for (int64_t i = 0; i < B * T * Dk; i++)
        a->dy[i] = st_rng_uniform(&rng) - 0.5f;
    ATTN_TRY(dnnl_engine_create(&a->engine, dnnl_cpu, 0), "engine");
    ATTN_TRY(dnnl_stream_create(&a->stream, a->engine, dnnl_stream_default_flags), "stream");

    float *x = a->x, *dx = a->dx, *P = a->P, *dS = a->dS;
    dnnl_memory_desc_t q_md, kt_md, k_md, v_md, vt_md, y_md, p_md, pt_md;
    attn_md4(&q_md, B, H, T, dh, T * X, dh, X, 1);
    attn_md4(&k_md, B, H, T, dh, T * X, dh, X, 1);
    attn_md4(&kt_md, B, H, dh, T, T * X, dh, 1, X);
    attn_md4(&v_md, B, H, T, dh, T * X, dh, X, 1);
    attn_md4(&vt_md, B, H, dh, T, T * X, dh, 1, X);
    attn_md4(&y_md, B, H, T, dh, T * Dk, dh, Dk, 1);
    attn_md4(&p_md, B, H, T, T, H * T * T, T * T, T, 1);
    attn_md4(&pt_md, B, H, T, T, H * T * T, T * T, 1, T);
    if (attn_matmul(a, A_SCORES, &q_md, x, &kt_md, x + Dk, &p_md, P, scale) ||
        attn_matmul(a, A_CONTEXT, &p_md, P, &v_md, x + 2 * Dk, &y_md, a->y, 1.0f) ||
        attn_matmul(a, A_DV, &pt_md, P, &y_md, a->dy, &q_md, dx + 2 * Dk, 1.0f) ||
        attn_matmul(a, A_DP, &y_md, a->dy, &vt_md, x + 2 * Dk, &p_md, dS, 1.0f) ||
        attn_matmul(a, A_DQ, &p_md, dS, &k_md, x + Dk, &q_md, dx, scale) ||
        attn_matmul(a, A_DK, &pt_md, dS, &q_md, x, &q_md, dx + Dk, scale))
        return -1;

    /* the softmax over each row of (B H T, T), in place, and its backward */
    dnnl_memory_desc_t rows_md;
    const dnnl_dims_t rows_dims = { B * H * T, T };
    ATTN_TRY(dnnl_memory_desc_init_by_tag(&rows_md, 2, rows_dims, dnnl_f32, dnnl_ab), "rows md");
    dnnl_softmax_desc_t sf, sb;
    ATTN_TRY(dnnl_softmax_forward_desc_init(&sf, dnnl_forward_training, &rows_md, 1),
             "softmax descriptor");
    ATTN_TRY(dnnl_softmax_backward_desc_init(&sb, &rows_md, &rows_md, 1),
             "softmax backward descriptor");
    dnnl_primitive_desc_t fwd_pd = NULL;
    if (attn_prim(a, A_SOFTMAX, &sf, NULL, 1.0f, &fwd_pd))
        return -1;
    const int rc = attn_prim(a, A_DSOFTMAX, &sb, fwd_pd, 1.0f, NULL);
    dnnl_primitive_desc_destroy(fwd_pd);
    dnnl_memory_t mp, mds;
    if (rc || attn_mem(a, &rows_md, P, &mp) || attn_mem(a, &rows_md, dS, &mds))
        return -1;
    const dnnl_exec_arg_t fwd[2] = { { DNNL_ARG_SRC, mp }, { DNNL_ARG_DST, mp } };
    const dnnl_exec_arg_t bwd[3] = {
        { DNNL_ARG_DST, mp }, { DNNL_ARG_DIFF_DST, mds }, { DNNL_ARG_DIFF_SRC, mds },
    };
    memcpy(a->args[A_SOFTMAX], fwd, sizeof fwd);
    a->nargs[A_SOFTMAX] = 2;
    memcpy(a->args[A_DSOFTMAX], bwd, sizeof bwd);
    a->nargs[A_DSOFTMAX] = 3;
    return 0;
}

/* -inf above the diagonal of every (T, T) block: attention.c's loop. */
static void attn_mask(const attn_ref *a)
{
    const int64_t T = a->tokens;
    float *S = a->P;
    for (int64_t blk = 0; blk < a->batch * a->heads; blk++, S += T * T)
        for (int64_t i = 0; i + 1 < T; i++)
            for (int64_t j = i + 1; j < T; j++)
                S[i * T + j] = -INFINITY;
}

static int attn_run(const attn_ref *a, int part)
{
    if (part == A_MASK) {
        attn_mask(a);
        return 0;
    }
    return dnnl_primitive_execute(a->prim[part], a->stream, a->nargs[part], a->args[part]) ==
                   dnnl_success &&
                   dnnl_stream_wait(a->stream) == dnnl_success ? 0 : -1;
}

/* Mean seconds of each part of one layer's forward and backward, in the
 * order the model runs them, over a window of at least min_s (one
 * untimed round first); -1 on failure, else the mean per round. */
double attn_window(const attn_ref *a, double min_s, double part_s[A_PARTS])
{
    for (int i = 0; i < A_PARTS; i++)
        if (attn_run(a, i))
            return -1.0;
    double sum[A_PARTS] = { 0.0 };
    uint64_t n = 0;
    double t0 = now_s(), t = t0;
    do {
        for (int i = 0; i < A_PARTS; i++) {
            const double ta = t;
            if (attn_run(a, i))
                return -1.0;
            t = now_s();
            sum[i] += t - ta;
        }
        n++;
    } while (t - t0 < min_s);
    for (int i = 0; i < A_PARTS; i++)
        part_s[i] = sum[i] / (double)n;
    return (t - t0) / (double)n;
}

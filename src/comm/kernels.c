/*
 * comm/kernels.c — the loops of a step of the shared-buffer backend: sum,
 * sum-and-divide-by-holders and copy, over the work items of kernels.h.
 *
 * Every loop is element-wise (no reduction across lanes) and each output
 * element is written by one thread with one sequence of IEEE operations,
 * in the order of the item's ops, which the plan fixes (worker 0, 1, ...
 * within a domain, then the domains in order, then one division).  So the
 * vector width of the clone the CPU picks does not change a bit of the
 * result; the build also has -ffp-contract=off (no fused multiply-adds).
 */
#include <string.h>

#include "comm/kernels.h"
#include "core/blocked.h"
#include "core/bf16.h"
#include "core/simd.h"


static size_t min_size(size_t a, size_t b)
{
    return a < b ? a : b;
}

ST_VECTOR_CLONES
static void k_copy_div(float *restrict o, const float *restrict a, size_t n, float d)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        o[i] = a[i] / d;
}

ST_VECTOR_CLONES
static void k_sum2(float *restrict o, const float *restrict a, const float *restrict b, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        o[i] = a[i] + b[i];
}

ST_VECTOR_CLONES
static void k_sum2_div(float *restrict o, const float *restrict a, const float *restrict b,
                       size_t n, float d)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        o[i] = (a[i] + b[i]) / d;
}

ST_VECTOR_CLONES
static void k_acc(float *restrict o, const float *restrict a, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        o[i] += a[i];
}

ST_VECTOR_CLONES
static void k_acc_div(float *restrict o, const float *restrict a, size_t n, float d)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        o[i] = (o[i] + a[i]) / d;
}

/* bf16 -> fp32 (exact: the bf16 is the upper half). */
ST_VECTOR_CLONES
static void k_widen(float *restrict o, const uint16_t *restrict a, size_t n)
{
    uint32_t *u = (uint32_t *)(void *)o;
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        u[i] = (uint32_t)a[i] << 16;
}

/* fp32 -> bf16 -> fp32 in one pass: the value a bf16 payload would carry. */
ST_VECTOR_CLONES
static void k_round(float *restrict o, const float *restrict a, size_t n)
{
    const uint32_t *in = (const uint32_t *)(const void *)a;
    uint32_t *u = (uint32_t *)(void *)o;
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        u[i] = st_bf16_rne_bits(in[i]);
}

/* Source p of kind src at element off, as fp32: in place, or widened into
 * the L1 chunk buf (n elements). */
static const float *source(const void *p, int src, size_t off, size_t n, float *buf)
{
    switch (src) {
    case SRC_BF16:
        k_widen(buf, (const uint16_t *)p + off, n);
        return buf;
    case SRC_F32_RNE:
        k_round(buf, (const float *)p + off, n);
        return buf;
    default:
        return (const float *)p + off;
    }
}

/* Fused loops for the usual bf16 ops (every source of the op of one
 * non-fp32 kind): the source is widened in the register, not through the
 * L1 chunk; the same IEEE operations in the same order as the generic
 * path (widen, then the fp32 loop), so the same bits. */
static inline float ld_bf16(const void *p, size_t i)
{
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float ld_rne(const void *p, size_t i)
{
    uint32_t x;
    memcpy(&x, (const float *)p + i, sizeof x);
    const uint32_t r = st_bf16_rne_bits(x);
    float f;
    memcpy(&f, &r, sizeof f);
    return f;
}

#define FUSED_KERNELS(SFX, LD)                                                                  \
    ST_VECTOR_CLONES static void k_copy_##SFX(float *restrict o, const void *restrict a,       \
                                              size_t n)                                        \
    {                                                                                           \
        _Pragma("omp simd") for (size_t i = 0; i < n; i++) o[i] = LD(a, i);                    \
    }                                                                                           \
    ST_VECTOR_CLONES static void k_copy_div_##SFX(float *restrict o, const void *restrict a,   \
                                                  size_t n, float d)                           \
    {                                                                                           \
        _Pragma("omp simd") for (size_t i = 0; i < n; i++) o[i] = LD(a, i) / d;                \
    }                                                                                           \
    ST_VECTOR_CLONES static void k_sum2_##SFX(float *restrict o, const void *restrict a,       \
                                              const void *restrict b, size_t n)                \
    {                                                                                           \
        _Pragma("omp simd") for (size_t i = 0; i < n; i++) o[i] = LD(a, i) + LD(b, i);         \
    }                                                                                           \
    ST_VECTOR_CLONES static void k_sum2_div_##SFX(float *restrict o, const void *restrict a,   \
                                                  const void *restrict b, size_t n, float d)   \
    {                                                                                           \
        _Pragma("omp simd") for (size_t i = 0; i < n; i++) o[i] = (LD(a, i) + LD(b, i)) / d;   \
    }                                                                                           \
    ST_VECTOR_CLONES static void k_acc_##SFX(float *restrict o, const void *restrict a,        \
                                             size_t n)                                         \
    {                                                                                           \
        _Pragma("omp simd") for (size_t i = 0; i < n; i++) o[i] += LD(a, i);                   \
    }                                                                                           \
    ST_VECTOR_CLONES static void k_acc_div_##SFX(float *restrict o, const void *restrict a,    \
                                                 size_t n, float d)                            \
    {                                                                                           \
        _Pragma("omp simd") for (size_t i = 0; i < n; i++) o[i] = (o[i] + LD(a, i)) / d;       \
    }                                                                                           \
    static void run_op_##SFX(const rs_op *op, float *o, size_t off, size_t n, float d)         \
    {                                                                                           \
        const size_t e = op->a_src == SRC_BF16 ? sizeof(uint16_t) : sizeof(float);            \
        const char *a = (const char *)op->a + off * e;                                         \
        switch (op->kind) {                                                                     \
        case OP_COPY:                                                                           \
            if (op->divide)                                                                     \
                k_copy_div_##SFX(o, a, n, d);                                                   \
            else                                                                                \
                k_copy_##SFX(o, a, n);                                                          \
            break;                                                                              \
        case OP_SUM2:                                                                           \
            if (op->divide)                                                                     \
                k_sum2_div_##SFX(o, a, (const char *)op->b + off * e, n, d);                   \
            else                                                                                \
                k_sum2_##SFX(o, a, (const char *)op->b + off * e, n);                          \
            break;                                                                              \
        default:                                                                                \
            if (op->divide)                                                                     \
                k_acc_div_##SFX(o, a, n, d);                                                    \
            else                                                                                \
                k_acc_##SFX(o, a, n);                                                           \
            break;                                                                              \
        }                                                                                       \
    }

FUSED_KERNELS(bf16, ld_bf16)
FUSED_KERNELS(rne, ld_rne)

/* Whether op can run fused: a non-fp32 a (not the scratch chunk) and, for
 * a sum of two, b of the same kind. */
static int fusable(const rs_op *op)
{
    return op->a && op->a_src != SRC_F32 && (op->kind != OP_SUM2 || op->b_src == op->a_src);
}

void st_comm_run_rs(const rs_item *items, size_t n_items, const rs_op *ops, float *tmp,
                    float *wide)
{
    for (size_t t = 0; t < n_items; t++)
        st_comm_run_rs_part(&items[t], ops, 0, items[t].n, tmp, wide);
}

void st_comm_run_rs_part(const rs_item *it, const rs_op *ops, size_t lo, size_t hi, float *tmp,
                         float *wide)
{
    const rs_op *first = ops + it->op_first, *last = first + it->n_ops;
    for (size_t off = lo; off < hi; off += ST_CHUNK) {
        size_t n = min_size(ST_CHUNK, hi - off);
        for (const rs_op *op = first; op < last; op++) {
            float *o = op->to_tmp ? tmp : it->out + off;
            if (fusable(op)) {
                if (op->a_src == SRC_BF16)
                    run_op_bf16(op, o, off, n, it->count);
                else
                    run_op_rne(op, o, off, n, it->count);
                continue;
            }
            const float *a = op->a ? source(op->a, op->a_src, off, n, wide) : tmp;
            const float *b = op->b ? source(op->b, op->b_src, off, n, wide + ST_CHUNK) : NULL;
            switch (op->kind) {
            case OP_COPY:
                if (op->divide)
                    k_copy_div(o, a, n, it->count);
                else
                    memcpy(o, a, n * sizeof *o);
                break;
            case OP_SUM2:
                if (op->divide)
                    k_sum2_div(o, a, b, n, it->count);
                else
                    k_sum2(o, a, b, n);
                break;
            default:
                if (op->divide)
                    k_acc_div(o, a, n, it->count);
                else
                    k_acc(o, a, n);
                break;
            }
        }
    }
}

/* o[i] = a[i] and h[i] = bf16(a[i]): a weight and the copy its products read */
ST_VECTOR_CLONES
static void k_copy_h(float *restrict o, uint16_t *restrict h, const float *restrict a, size_t n)
{
    const uint32_t *u = (const uint32_t *)(const void *)a;
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        o[i] = a[i];
        h[i] = (uint16_t)(st_bf16_rne_bits(u[i]) >> 16);
    }
}

static void copy_packed(const ag_item *it)
{
    for (size_t x = 0; x < it->n;) {
        size_t y = st_blocked_slab_end(it->blk, it->at + x) - it->at;
        if (y > it->n)
            y = it->n;
        memcpy(it->dst + x, it->src + x, (y - x) * sizeof(float));
        st_blocked_pack(it->blk, it->dst + x, it->at + x, it->at + y);
        x = y;
    }
}

void st_comm_run_ag(const ag_item *items, size_t n_items)
{
    for (size_t t = 0; t < n_items; t++) {
        const ag_item *it = &items[t];
        if (it->blk)
            copy_packed(it);
        else if (!it->dst)
            memcpy(it->half, it->src, it->n * sizeof *it->half);
        else if (it->half)
            k_copy_h(it->dst, it->half, it->src, it->n);
        else
            memcpy(it->dst, it->src, it->n * sizeof(float));
    }
}

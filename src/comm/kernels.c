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

/* Clones of the hot loops for wider vector units, picked at load time (as
 * in optim/optim.c).  Not under ThreadSanitizer: the clones' ifunc
 * resolvers run before its runtime is up and crash the loader. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(__SANITIZE_THREAD__)
#define ST_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ST_VECTOR_CLONES
#endif

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

void st_comm_run_rs(const rs_item *items, size_t n_items, const rs_op *ops, float *tmp)
{
    for (size_t t = 0; t < n_items; t++) {
        const rs_item *it = &items[t];
        const rs_op *first = ops + it->op_first, *last = first + it->n_ops;
        for (size_t off = 0; off < it->n; off += ST_CHUNK) {
            size_t n = min_size(ST_CHUNK, it->n - off);
            for (const rs_op *op = first; op < last; op++) {
                float *o = op->to_tmp ? tmp : it->out + off;
                const float *a = op->a ? op->a + off : tmp;
                switch (op->kind) {
                case OP_COPY:
                    if (op->divide)
                        k_copy_div(o, a, n, it->count);
                    else
                        memcpy(o, a, n * sizeof *o);
                    break;
                case OP_SUM2:
                    if (op->divide)
                        k_sum2_div(o, a, op->b + off, n, it->count);
                    else
                        k_sum2(o, a, op->b + off, n);
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
}

void st_comm_run_ag(const ag_item *items, size_t n_items)
{
    for (size_t t = 0; t < n_items; t++)
        memcpy(items[t].dst, items[t].src, items[t].n * sizeof(float));
}

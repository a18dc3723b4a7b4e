/*
 * core/bf16.c — the vector loop of bf16.h's rounding, for a writer that
 * rounds a whole array on its own: the reduction's gradient payloads (a
 * worker's buffer, the MPI pack).  The loops that round as they compute
 * (the optimizer's weight copies, the all-gather's, a layer's kept
 * inputs) call st_bf16_rne_bits in their own loop instead.  The widening
 * back: a bf16 master into the fp32 vector that checkpoints read.
 */
#include "core/bf16.h"
#include "core/simd.h"

ST_VECTOR_CLONES
void st_bf16_round_n(uint16_t *restrict dst, const float *restrict src, size_t n)
{
    const uint32_t *u = (const uint32_t *)(const void *)src;
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        dst[i] = (uint16_t)(st_bf16_rne_bits(u[i]) >> 16);
}

void st_bf16_widen_n(float *restrict dst, const uint16_t *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = st_bf16_to_float(src[i]);
}

/*
 * core/bf16.h — bf16 values, and the one rounding every writer of them uses.
 *
 * bf16 is the upper 16 bits of an fp32.  oneDNN's reorders round to nearest,
 * ties to even, and keep a NaN a (quiet) NaN; loops that write bf16
 * themselves (the reduction's payloads, the optimizer's weight copies, the
 * layers' kept inputs) use the same rounding, so that a value converted by
 * either is the same bits.  Integer only, branch-free: the loops that call
 * it vectorise.
 */
#ifndef ST_CORE_BF16_H
#define ST_CORE_BF16_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef uint16_t st_bf16;

/* The bits of fp32 x rounded to bf16, in the upper half, the lower half
 * zero; a NaN stays a (quiet) NaN. */
static inline uint32_t st_bf16_rne_bits(uint32_t x)
{
    uint32_t r = (x + 0x7fffu + ((x >> 16) & 1u)) & 0xffff0000u;
    return (x & 0x7fffffffu) > 0x7f800000u ? (x & 0xffff0000u) | 0x400000u : r;
}

/* The bits of fp32 x rounded to bf16 stochastically: away from zero with
 * probability (the dropped lower half) / 2^16, from the 16 random bits in
 * the lower half of r, so that the rounding is unbiased on average (a
 * value whose small changes round to nothing under rne: an optimizer's
 * slowly decaying moment).  A value with a zero lower half is kept; a
 * NaN stays a (quiet) NaN. */
static inline uint32_t st_bf16_sr_bits(uint32_t x, uint32_t r)
{
    uint32_t s = (x + (r & 0xffffu)) & 0xffff0000u;
    return (x & 0x7fffffffu) > 0x7f800000u ? (x & 0xffff0000u) | 0x400000u : s;
}

static inline st_bf16 st_bf16_from_float(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (st_bf16)(st_bf16_rne_bits(u) >> 16);
}

/* Exact: the bf16 is the upper half. */
static inline float st_bf16_to_float(st_bf16 h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* dst[i] = bf16 bits of src[i], i < n, the rounding above (bf16.c: a
 * vectorised loop). */
void st_bf16_round_n(uint16_t *restrict dst, const float *restrict src, size_t n);

/* dst[i] = src[i] widened (exact), i < n. */
void st_bf16_widen_n(float *restrict dst, const uint16_t *restrict src, size_t n);

#endif /* ST_CORE_BF16_H */

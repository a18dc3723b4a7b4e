/*
 * nn/gelu.c — the bf16 GELU and its derivative in one pass (gelu.h).
 *
 *   Phi(x) = 1/2 (1 + erf(x / sqrt 2)),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
 *   y = x Phi(x),  y' = Phi(x) + x phi(x)
 *
 * With z = |x| / sqrt 2 and t = 1 / (1 + p z), A&S 7.1.26 gives
 * 1 - erf(z) = t q(t) exp(-z^2), and exp(-z^2) = exp(-x^2 / 2) is phi's
 * exponential.  Phi(-|x|) = t q(t) exp(-x^2 / 2) / 2 is kept as it is
 * for negative x rather than as 1 - Phi(|x|), which would cancel.
 *
 * Every branch is a select on integers: a select between two computed
 * floats is not if-converted under the default -ftrapping-math, and the
 * loop would not vectorise.
 */
#include <math.h>
#include <string.h>

#include "core/simd.h"
#include "nn/gelu.h"

/* exp(v) for v <= 0 (v below -87 taken as -87: a result under 2^-125,
 * where the products it enters are below bf16's half ulp of y and y'):
 * 2^n e^r with n = round(v / ln 2) by the 1.5 * 2^23 trick and r
 * in [-ln2 / 2, ln2 / 2] (ln 2 in two parts), e^r by its Taylor
 * polynomial of degree 6 (relative error < 3e-8). */
static inline float exp_nonpositive(float v)
{
    v = v < -87.0f ? -87.0f : v;
    const float n = (v * 1.44269504f + 12582912.0f) - 12582912.0f;
    const float r = (v - n * 0.693145752f) - n * 1.42860677e-6f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* Phi(x) and, in *e, exp(-x^2 / 2). */
static inline float normal_cdf(float x, float *e)
{
    const float t = 1.0f / (1.0f + 0.3275911f * 0.707106781f * fabsf(x));
    float q = 1.061405429f;
    q = q * t - 1.453152027f;
    q = q * t + 1.421413741f;
    q = q * t - 0.284496736f;
    q = q * t + 0.254829592f;
    *e = exp_nonpositive(-0.5f * x * x);
    const float low = 0.5f * q * t * *e, high = 1.0f - low;   /* Phi(-|x|), Phi(|x|) */
    uint32_t ux, ul, uh;
    memcpy(&ux, &x, sizeof ux);
    memcpy(&ul, &low, sizeof ul);
    memcpy(&uh, &high, sizeof uh);
    const uint32_t up = ux >> 31 ? ul : uh;
    float phi;
    memcpy(&phi, &up, sizeof phi);
    return phi;
}

ST_VECTOR_CLONES_BW
void st_gelu_deriv_bf16(st_bf16 *restrict y, st_bf16 *xd, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        const float x = st_bf16_to_float(xd[i]);
        float e;
        const float cdf = normal_cdf(x, &e);
        y[i] = st_bf16_from_float(x * cdf);
        xd[i] = st_bf16_from_float(cdf + x * (e * 0.398942280f));
    }
}

ST_VECTOR_CLONES_BW
void st_gelu_bf16(st_bf16 *restrict y, const st_bf16 *restrict x, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        const float v = st_bf16_to_float(x[i]);
        float e;
        y[i] = st_bf16_from_float(v * normal_cdf(v, &e));
    }
}

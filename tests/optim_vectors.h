/*
 * tests/optim_vectors.h — what the optimizer suites share: a 300-element
 * parameter vector of a decayed matrix and an undecayed bias, seeded
 * normal fills, and a float's bits.
 */
#ifndef SUBTRAIN_TESTS_OPTIM_VECTORS_H
#define SUBTRAIN_TESTS_OPTIM_VECTORS_H

#include <stdint.h>
#include <string.h>

#include <subtrain/rng.h>

#include "optim/optim_impl.h"

enum { N = 300 };

static const st_param_segment segs[2] = {
    { .name = "w", .offset = 0, .count = 200, .decay = 1 },
    { .name = "b", .offset = 200, .count = 100, .decay = 0 },
};

static inline void random_fill(float *x, size_t n, uint64_t stream, float scale)
{
    st_rng r = st_rng_seed(stream);
    for (size_t i = 0; i < n; i++)
        x[i] = scale * st_rng_normal(&r);
}

static inline uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

#endif /* SUBTRAIN_TESTS_OPTIM_VECTORS_H */

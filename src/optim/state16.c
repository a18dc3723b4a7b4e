/*
 * optim/state16.c — AdamW and SGD with momentum over a bf16 state: the
 * same arithmetic as optim.c's fp32 loops, in fp32, with the state read
 * from bf16 and stored back rounded, in the same single pass over the
 * gradient, the master weights, the state and the weights' bf16 copy.
 *
 * Each loop is instantiated for rne or stochastic rounding and with or
 * without the copy (constant arguments of an always-inlined body), so
 * that no variant pays for another's work, and cloned for wider vector
 * units with 16-bit lanes (core/simd.h, ST_VECTOR_CLONES_BW).  Stochastic
 * rounding draws 16 bits an element and moment from a hash of the
 * update's key and the element's index in the vector: a function of
 * seed, step and position, the same however the vector is cut into
 * shards.  A bf16 master (st_adamw_master16) is rounded the same way,
 * from a key of its own.
 */
#include <math.h>

#include <subtrain/rng.h>

#include "core/bf16.h"
#include "core/simd.h"
#include "optim/state16.h"

/* Stochastic rounding of the optimizer state and of a bf16 master
 * (rng_streams.h). */
#define STREAM_STATE_ROUNDING 0x057A7Eull
#define STREAM_MASTER_ROUNDING 0x3A57E4ull
#define STREAM_MASTER_AVERAGE 0x3A57A7ull

uint32_t st_state_rounding_key(uint64_t seed, uint64_t t)
{
    st_rng root = st_rng_seed(seed);
    st_rng mine = st_rng_split(&root, STREAM_STATE_ROUNDING);
    st_rng step = st_rng_split(&mine, t);
    return (uint32_t)st_rng_u64(&step);
}

uint32_t st_master_rounding_key(uint64_t seed, uint64_t t)
{
    st_rng root = st_rng_seed(seed);
    st_rng mine = st_rng_split(&root, STREAM_MASTER_ROUNDING);
    st_rng step = st_rng_split(&mine, t);
    return (uint32_t)st_rng_u64(&step);
}

uint32_t st_master_replica_key(uint64_t seed, uint64_t t, uint64_t worker)
{
    st_rng root = st_rng_seed(seed);
    st_rng mine = st_rng_split(&root, STREAM_MASTER_ROUNDING);
    st_rng step = st_rng_split(&mine, t);
    st_rng own = st_rng_split(&step, worker);
    return (uint32_t)st_rng_u64(&own);
}

uint32_t st_master_average_key(uint64_t seed, uint64_t t)
{
    st_rng root = st_rng_seed(seed);
    st_rng mine = st_rng_split(&root, STREAM_MASTER_AVERAGE);
    st_rng step = st_rng_split(&mine, t);
    return (uint32_t)st_rng_u64(&step);
}

/* An integer hash with full avalanche (Wellons' lowbias32): vectorises,
 * 32-bit multiplies only. */
static inline uint32_t mix32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

static inline uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* x stored as bf16: rne, or stochastic from the random bits r */
static inline uint16_t to16(float x, int sr, uint32_t r)
{
    const uint32_t u = bits_of(x);
    return (uint16_t)((sr ? st_bf16_sr_bits(u, r) : st_bf16_rne_bits(u)) >> 16);
}

static inline __attribute__((always_inline)) void
adamw16_body(float *restrict p, const float *restrict g, uint16_t *restrict m,
             uint16_t *restrict v, uint16_t *restrict h, size_t n, const st_adam_step *a,
             float shrink, int sr, int with_h, uint32_t key, uint32_t first)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        const float mi = a->b1 * st_bf16_to_float(m[i]) + (1.0f - a->b1) * g[i];
        const float vi = a->b2 * st_bf16_to_float(v[i]) + (1.0f - a->b2) * g[i] * g[i];
        const uint32_t r = sr ? mix32((first + (uint32_t)i) ^ key) : 0u;
        m[i] = to16(mi, sr, r);
        v[i] = to16(vi, sr, r >> 16);
        const float pi = p[i] * shrink - a->lr * (mi * a->c1) / (sqrtf(vi * a->c2) + a->eps);
        p[i] = pi;
        if (with_h)
            h[i] = (uint16_t)(st_bf16_rne_bits(bits_of(pi)) >> 16);
    }
}

static inline __attribute__((always_inline)) void
sgd16_body(float *restrict p, const float *restrict g, uint16_t *restrict buf,
           uint16_t *restrict h, size_t n, float lr, float momentum, float wd, int sr,
           int with_h, uint32_t key, uint32_t first)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        const float b = momentum * st_bf16_to_float(buf[i]) + g[i] + wd * p[i];
        buf[i] = to16(b, sr, sr ? mix32((first + (uint32_t)i) ^ key) : 0u);
        const float pi = p[i] - lr * b;
        p[i] = pi;
        if (with_h)
            h[i] = (uint16_t)(st_bf16_rne_bits(bits_of(pi)) >> 16);
    }
}

/* AdamW with a bf16 master (state16.h): state 0 fp32, 1 bf16; sr: the
 * state's rounding. */
static inline __attribute__((always_inline)) void
master16_body(const float *restrict g, float *restrict m32, float *restrict v32,
              uint16_t *restrict m, uint16_t *restrict v, uint16_t *restrict h, size_t n,
              const st_adam_step *a, float shrink, int state, int sr, uint32_t key,
              uint32_t mkey, uint32_t first)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        const float mo = state ? st_bf16_to_float(m[i]) : m32[i];
        const float vo = state ? st_bf16_to_float(v[i]) : v32[i];
        const float mi = a->b1 * mo + (1.0f - a->b1) * g[i];
        const float vi = a->b2 * vo + (1.0f - a->b2) * g[i] * g[i];
        if (state) {
            const uint32_t r = sr ? mix32((first + (uint32_t)i) ^ key) : 0u;
            m[i] = to16(mi, sr, r);
            v[i] = to16(vi, sr, r >> 16);
        } else {
            m32[i] = mi;
            v32[i] = vi;
        }
        const float w = st_bf16_to_float(h[i]);
        const float pi = w * shrink - a->lr * (mi * a->c1) / (sqrtf(vi * a->c2) + a->eps);
        h[i] = to16(pi, 1, mix32((first + (uint32_t)i) ^ mkey));
    }
}

#define MASTER16(NAME, STATE, SR)                                                            \
    ST_VECTOR_CLONES_BW static void NAME(const float *restrict g, float *restrict m32,       \
                                         float *restrict v32, uint16_t *restrict m,          \
                                         uint16_t *restrict v, uint16_t *restrict h,         \
                                         size_t n, const st_adam_step *a, float shrink,      \
                                         uint32_t key, uint32_t mkey, uint32_t first)        \
    {                                                                                        \
        master16_body(g, m32, v32, m, v, h, n, a, shrink, STATE, SR, key, mkey, first);      \
    }
MASTER16(master16_f32, 0, 0)
MASTER16(master16_rne, 1, 0)
MASTER16(master16_sr, 1, 1)

/* The instances: (rne | sr) x (no copy | copy). */
#define ADAMW16(NAME, SR, H)                                                                 \
    ST_VECTOR_CLONES_BW static void NAME(float *restrict p, const float *restrict g,            \
                                      uint16_t *restrict m, uint16_t *restrict v,            \
                                      uint16_t *restrict h, size_t n, const st_adam_step *a, \
                                      float shrink, uint32_t key, uint32_t first)            \
    {                                                                                        \
        adamw16_body(p, g, m, v, h, n, a, shrink, SR, H, key, first);                           \
    }
ADAMW16(adamw16_rne, 0, 0)
ADAMW16(adamw16_rne_h, 0, 1)
ADAMW16(adamw16_sr, 1, 0)
ADAMW16(adamw16_sr_h, 1, 1)

#define SGD16(NAME, SR, H)                                                                   \
    ST_VECTOR_CLONES_BW static void NAME(float *restrict p, const float *restrict g,            \
                                      uint16_t *restrict buf, uint16_t *restrict h,          \
                                      size_t n, float lr, float momentum, float wd,          \
                                      uint32_t key, uint32_t first)                          \
    {                                                                                        \
        sgd16_body(p, g, buf, h, n, lr, momentum, wd, SR, H, key, first);                     \
    }
SGD16(sgd16_rne, 0, 0)
SGD16(sgd16_rne_h, 0, 1)
SGD16(sgd16_sr, 1, 0)
SGD16(sgd16_sr_h, 1, 1)

void st_adamw16(float *p, const float *g, uint16_t *m, uint16_t *v, uint16_t *h, size_t n,
                const st_adam_step *a, float shrink, const st_state_rounding *r)
{
    const uint32_t first = (uint32_t)r->first;   /* indices modulo 2^32: hashed anyway */
    if (r->sr)
        (h ? adamw16_sr_h : adamw16_sr)(p, g, m, v, h, n, a, shrink, r->key, first);
    else
        (h ? adamw16_rne_h : adamw16_rne)(p, g, m, v, h, n, a, shrink, r->key, first);
}

void st_sgd16(float *p, const float *g, uint16_t *buf, uint16_t *h, size_t n, float lr,
              float momentum, float wd, const st_state_rounding *r)
{
    const uint32_t first = (uint32_t)r->first;
    if (r->sr)
        (h ? sgd16_sr_h : sgd16_sr)(p, g, buf, h, n, lr, momentum, wd, r->key, first);
    else
        (h ? sgd16_rne_h : sgd16_rne)(p, g, buf, h, n, lr, momentum, wd, r->key, first);
}

typedef void master16_fn(const float *restrict, float *restrict, float *restrict,
                         uint16_t *restrict, uint16_t *restrict, uint16_t *restrict, size_t,
                         const st_adam_step *, float, uint32_t, uint32_t, uint32_t);

void st_adamw_master16(const float *g, float *m, float *v, uint16_t *m16, uint16_t *v16,
                       uint16_t *h, size_t n, const st_adam_step *a, float shrink,
                       const st_state_rounding *r)
{
    static master16_fn *const fns[3] = { master16_f32, master16_rne, master16_sr };
    const int state = !m16 ? 0 : r->sr ? 2 : 1;
    fns[state](g, m, v, m16, v16, h, n, a, shrink, r->key, r->master_key, (uint32_t)r->first);
}

void st_master_round_sr(uint16_t *h, const float *x, size_t n, uint32_t key, size_t first)
{
    const uint32_t f = (uint32_t)first;
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        h[i] = to16(x[i], 1, mix32((f + (uint32_t)i) ^ key));
}

/* core/rng.c — counter-based RNG: value n of a stream = mix(key, n). */
#include <math.h>
#include <string.h>

#include <subtrain/rng.h>

#define GOLDEN_GAMMA 0x9E3779B97F4A7C15ull

/* splitmix64's finaliser (Stafford's mix13): a bijection with full
 * avalanche, so consecutive counters give unrelated outputs. */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

st_rng st_rng_seed(uint64_t seed)
{
    st_rng r = { mix64(seed ^ 0x5EEDF00DCAFEBABEull), 0 };
    return r;
}

st_rng st_rng_split(const st_rng *parent, uint64_t stream_id)
{
    /* Two mixing rounds so that (key, id) and (key', id') with key ^ id ==
     * key' ^ id' still give unrelated children. */
    st_rng r = { mix64(mix64(parent->key + GOLDEN_GAMMA) ^ mix64(stream_id + 1)), 0 };
    return r;
}

uint64_t st_rng_u64(st_rng *rng)
{
    uint64_t n = rng->counter++;
    return mix64(rng->key ^ mix64(n * GOLDEN_GAMMA + GOLDEN_GAMMA));
}

uint32_t st_rng_below(st_rng *rng, uint32_t bound)
{
    /* Lemire's multiply-shift with rejection: unbiased for any bound. */
    uint64_t m = (uint64_t)(uint32_t)st_rng_u64(rng) * bound;
    uint32_t low = (uint32_t)m;
    if (low < bound) {
        uint32_t threshold = (uint32_t)(-bound) % bound;
        while (low < threshold) {
            m = (uint64_t)(uint32_t)st_rng_u64(rng) * bound;
            low = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

float st_rng_uniform(st_rng *rng)
{
    return (float)(st_rng_u64(rng) >> 40) * (1.0f / 16777216.0f);
}

float st_rng_normal(st_rng *rng)
{
    /* u1 in (0, 1] so that log() is finite. */
    double u1 = ((double)(st_rng_u64(rng) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = (double)(st_rng_u64(rng) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* Uniform in (0, 1], 53 bits: a logarithm of it is finite. */
static double open_unit(st_rng *rng)
{
    return ((double)(st_rng_u64(rng) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

double st_rng_gamma_log(st_rng *rng, double alpha)
{
    /* below 1: Gamma(alpha) = Gamma(alpha + 1) U^(1/alpha), in logarithms */
    const double boost = alpha < 1.0 ? log(open_unit(rng)) / alpha : 0.0;
    const double a = alpha < 1.0 ? alpha + 1.0 : alpha;
    const double d = a - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x, v;
        do {
            x = sqrt(-2.0 * log(open_unit(rng))) * cos(6.283185307179586 * open_unit(rng));
            v = 1.0 + c * x;
        } while (v <= 0.0);
        v = v * v * v;
        const double u = open_unit(rng);
        if (log(u) < 0.5 * x * x + d - d * v + d * log(v))
            return log(d) + log(v) + boost;
    }
}

void st_rng_shuffle_u32(st_rng *rng, uint32_t *a, size_t n)
{
    for (size_t i = n; i > 1; i--) {
        uint32_t j = st_rng_below(rng, (uint32_t)i);
        uint32_t t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

/* xxHash64's lane round: four independent lanes per 32 bytes, so that
 * their multiplies overlap. */
static uint64_t hash_round(uint64_t acc, uint64_t word)
{
    acc += word * 0xC2B2AE3D27D4EB4Full;
    acc = (acc << 31) | (acc >> 33);
    return acc * 0x9E3779B185EBCA87ull;
}

uint64_t st_hash_bytes(const void *data, size_t n, uint64_t seed)
{
    const unsigned char *p = data;
    uint64_t lane[4] = { mix64(seed + 1), mix64(seed + 2), mix64(seed + 3), mix64(seed + 4) };
    uint64_t word;
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++) {
            memcpy(&word, p + i + 8 * (size_t)k, sizeof word);
            lane[k] = hash_round(lane[k], word);
        }
    uint64_t h = mix64(seed ^ (uint64_t)n);
    for (int k = 0; k < 4; k++)
        h = mix64(h ^ lane[k]);
    for (; i + 8 <= n; i += 8) {
        memcpy(&word, p + i, sizeof word);
        h = mix64(h ^ word);
    }
    if (i < n) {
        word = 0;
        memcpy(&word, p + i, n - i);
        h = mix64(h ^ word ^ GOLDEN_GAMMA);
    }
    return h;
}

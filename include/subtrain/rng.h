/*
 * subtrain/rng.h — deterministic, seedable, splittable random numbers.
 *
 * A counter-based generator: the n-th number of a stream is a strong 64-bit
 * hash of (key, n).  Splitting derives a child key from the parent key and a
 * stream id, so each tensor, epoch or worker gets its own stream whose values
 * do not depend on which thread draws them or in which order streams are
 * used.  That is what makes a run with a given seed identical whatever the
 * thread count.  Not for cryptography.
 *
 * The same mixer hashes bytes: st_hash_bytes, a fingerprint of content.
 */
#ifndef SUBTRAIN_RNG_H
#define SUBTRAIN_RNG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct st_rng {
    uint64_t key;
    uint64_t counter;
} st_rng;

/* The root stream of a seed. */
st_rng st_rng_seed(uint64_t seed);

/* An independent child stream, a pure function of (parent key, stream id);
 * the parent's counter is neither used nor advanced. */
st_rng st_rng_split(const st_rng *parent, uint64_t stream_id);

uint64_t st_rng_u64(st_rng *rng);
/* Uniform in [0, bound), bound > 0, without modulo bias. */
uint32_t st_rng_below(st_rng *rng, uint32_t bound);
/* Uniform in [0, 1) with 24 random bits. */
float st_rng_uniform(st_rng *rng);
/* Standard normal (Box-Muller, computed in double). */
float st_rng_normal(st_rng *rng);

/* The natural logarithm of a Gamma(alpha, 1) draw, alpha > 0 (Marsaglia
 * and Tsang's method, computed in double; alpha < 1 through Gamma(alpha +
 * 1) U^(1/alpha)).  As a logarithm it stays finite where the draw itself
 * underflows to 0 (alpha of 0.01 gives draws below 1e-300): normalised
 * draws over k streams are a Dirichlet(alpha) sample. */
double st_rng_gamma_log(st_rng *rng, double alpha);

/* Fisher-Yates shuffle of a[0..n). */
void st_rng_shuffle_u32(st_rng *rng, uint32_t *a, size_t n);

/* A 64-bit hash of data[0..n), chained from `seed` (a previous hash, to
 * hash several buffers as one): a fingerprint of content, such as a data
 * set's (st_dataset_fingerprint).  Reads each byte once, several GB/s;
 * not for cryptography, and of the machine's byte order. */
uint64_t st_hash_bytes(const void *data, size_t n, uint64_t seed);

#ifdef __cplusplus
}
#endif
#endif /* SUBTRAIN_RNG_H */

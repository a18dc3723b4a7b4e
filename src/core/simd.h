/*
 * core/simd.h — clones of a hot loop for wider vector units.
 *
 * The build is generic x86-64 (it runs on any machine its packages run
 * on); GCC's target_clones compiles a function again for AVX-512 and AVX2
 * and picks the clone at load time from the CPU.  A loop marked
 * `#pragma omp simd` inside it is vectorised at that width (-fopenmp
 * makes the pragma count).  Element-wise loops only: a clone does the
 * same IEEE operations on each element in the same order, so the vector
 * width changes no bit of a result (the build also has
 * -ffp-contract=off: no fused multiply-adds).
 *
 * Not under ThreadSanitizer: the clones' ifunc resolvers run before its
 * runtime is up and crash the loader.
 */
#ifndef ST_CORE_SIMD_H
#define ST_CORE_SIMD_H

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(__SANITIZE_THREAD__)
#define ST_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
/* For loops that convert between 32- and 16-bit lanes (bf16 values):
 * AVX-512F alone has no 16-bit operations and no masked compares on
 * 256-bit vectors, and GCC compiles such a loop's avx512f clone as 256-bit
 * AVX2 code; x86-64-v4 (F, BW, DQ, VL) gives it 512-bit vectors and mask
 * registers. */
#define ST_VECTOR_CLONES_BW \
    __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define ST_VECTOR_CLONES
#define ST_VECTOR_CLONES_BW
#endif

#endif /* ST_CORE_SIMD_H */

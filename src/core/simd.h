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
#else
#define ST_VECTOR_CLONES
#endif

#endif /* ST_CORE_SIMD_H */

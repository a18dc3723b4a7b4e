/*
 * tests/layer_check.h — what the suites of the layers in src/nn share
 * (tests/test_layers_*.c, through the layers' private API, nn/layers.h):
 * buffers and a context per test, random inputs, finite-difference checks
 * of a parameter's gradient, comparisons with a double reference, bf16
 * rounding.  Header-only, every function static inline.
 *
 * Every test follows one pattern:
 *   1. buffers from an st_arena, a context, the layer built against them,
 *      st_nn_ctx_finalize, forward;
 *   2. the forward output is checked against an independent double
 *      computation (a gradient check alone would accept a wrong forward whose
 *      backward is consistently wrong too);
 *   3. a scalar L = sum(y * R) with a fixed random R; dy = R; backward;
 *   4. every analytic gradient is compared with central differences
 *      (L(p + h) - L(p - h)) / (2h), L computed in double from the float
 *      forward outputs, with |fd - analytic| <= atol + rtol * |analytic|;
 *   5. the same comparison is run on a deliberately wrong gradient (scaled by
 *      1.1, and with the sign of its largest entry flipped) and must FAIL:
 *      a tolerance too loose to see a 10% error would make step 4 vacuous.
 *
 * Shapes: small ones with every coordinate checked (non-multiples of 8 and 16,
 * to run oneDNN's tail code), and one larger shape per layer checked on a
 * random subset of coordinates.  oneDNN runs single-threaded (deterministic:
 * an unperturbed output entry is bitwise the same from one forward to the
 * next, so only the entries a perturbation reaches contribute rounding noise).
 *
 * Each comparison prints one line to stderr: the largest |fd - analytic| and
 * the worst ratio |fd - analytic| / (atol + rtol |analytic|) (must be <= 1).
 */
#ifndef SUBTRAIN_TESTS_LAYER_CHECK_H
#define SUBTRAIN_TESTS_LAYER_CHECK_H

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "gradcheck.h"

#include <subtrain/arena.h>
#include <subtrain/rng.h>
#include <subtrain/status.h>

#include "core/arena_impl.h"
#include "nn/layers.h"

/* ------------------------------------------------------------ tolerances */

/* Linear and ReLU: L is linear (linear layer, in each of x, w, b) or
 * piecewise linear (ReLU, with every input at least 0.05 from the kink and
 * h = 1e-2 < 0.05, so no kink is crossed), hence the central difference has
 * no truncation error at all.  What is left is float32 rounding of the
 * perturbed outputs: an output entry is a sum of `in` products of O(1)
 * values, rounded with error ~ sqrt(in) * 6e-8 * O(1); a perturbation reaches
 * at most max(B, out) entries, so L moves by rounding ~ 1e-5 at the largest
 * shape, and dividing by 2h = 0.02 leaves ~ 5e-4 in the worst case, ~ 1e-5
 * typically.  atol 1e-3 covers the worst case; rtol 1e-2 is for large
 * gradients (|db| sums B values of R).  Gradients here are O(0.1 .. 10), so a
 * 10% error is 5x or more above this bound (the teeth check proves it). */
static const tol TOL_LINEAR = { 1e-2, 1e-3, 1e-2 };

/* Forward outputs and backward results against a double reference:
 * |got - ref| <= REF_RTOL * mag, where mag is the sum of the magnitudes of
 * the terms that make up the entry (a float32 sum of n terms is off by at
 * most ~ n * 6e-8 * mag, typically sqrt(n) * 6e-8 * mag: 1e-5 allows n = 160
 * worst case and any n here typically).  GELU adds an absolute floor for its
 * erf approximation: see check_act. */
#define REF_RTOL 1e-5

/* How many coordinates of a large tensor are checked (a random subset). */
#define LARGE_SUBSET 200

/* ------------------------------------------------------------ helpers */

/* Buffers, a oneDNN context and a random stream for one test. */
typedef struct env {
    st_arena arena;
    st_nn_ctx ctx;
    st_rng rng;
} env;

static inline void env_init(env *e, uint64_t seed)
{
    st_arena_init(&e->arena, "test_layers", NULL, 0);
    OK(st_nn_ctx_init(&e->ctx, &e->arena));
    e->rng = st_rng_seed(seed);
}

static inline void env_destroy(env *e)
{
    st_nn_ctx_destroy(&e->ctx);
    st_arena_release(&e->arena);
}

/* n zeroed floats from the arena. */
static inline float *env_floats(env *e, size_t n)
{
    float *p;
    OK(st_arena_alloc_floats(&e->arena, ST_MEM_ACTIVATIONS, n, &p));
    return p;
}

/* x[i] ~ U(lo, hi) */
static inline void fill_uniform(st_rng *r, float *x, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * st_rng_uniform(r);
}

/* |x[i]| ~ U(margin, 1) with a random sign: away from ReLU's kink at 0. */
static inline void fill_away_from_zero(st_rng *r, float *x, size_t n, float margin)
{
    for (size_t i = 0; i < n; i++) {
        float mag = margin + (1.0f - margin) * st_rng_uniform(r);
        x[i] = st_rng_uniform(r) < 0.5f ? -mag : mag;
    }
}

/* L = sum(y * R) in double. */
static inline double dot_yr(const float *y, const float *R, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)y[i] * (double)R[i];
    return s;
}

/* Coordinates to check: all of [0, n) if n <= max, else a random subset of
 * max of them.  *count receives how many; the caller frees the array. */
static inline size_t *pick_coords(st_rng *r, size_t n, size_t max, size_t *count)
{
    uint32_t *perm = malloc(n * sizeof *perm);
    size_t k = n <= max ? n : max;
    size_t *idx = malloc((k ? k : 1) * sizeof *idx);
    cr_assert(perm && idx);
    for (size_t i = 0; i < n; i++)
        perm[i] = (uint32_t)i;
    if (n > max)
        st_rng_shuffle_u32(r, perm, n);
    for (size_t i = 0; i < k; i++)
        idx[i] = perm[i];
    free(perm);
    *count = k;
    return idx;
}

/* The scalar a finite difference differentiates: runs a forward, returns L. */
typedef double (*objective_fn)(void *arg);

/* fd[k] = dL/dp[idx[k]] by central differences.  The step actually taken is
 * the float-rounded one, (float)(v + h) - (float)(v - h), so the rounding of
 * p itself is no error source. */
static inline void central_diff(objective_fn L, void *arg, float *p, const size_t *idx, size_t n,
                                double h, double *fd)
{
    for (size_t k = 0; k < n; k++) {
        float v = p[idx[k]];
        float vp = (float)((double)v + h), vm = (float)((double)v - h);
        p[idx[k]] = vp;
        double lp = L(arg);
        p[idx[k]] = vm;
        double lm = L(arg);
        p[idx[k]] = v;
        fd[k] = (lp - lm) / ((double)vp - (double)vm);
    }
}

/* Finite-difference check of grad = dL/dp on up to max_coords coordinates
 * of p (count floats).  grad must hold the analytic gradient already; it is
 * read before any forward runs. */
static inline void check_param(const char *what, objective_fn L, void *arg, float *p,
                               const float *grad, size_t count, size_t max_coords, tol t, st_rng *r)
{
    size_t n;
    size_t *idx = pick_coords(r, count, max_coords, &n);
    double *an = malloc(n * sizeof *an), *fd = malloc(n * sizeof *fd);
    cr_assert(an && fd);
    for (size_t k = 0; k < n; k++)
        an[k] = grad[idx[k]];
    central_diff(L, arg, p, idx, n, t.h, fd);
    compare_grads(what, fd, an, n, 0, t);
    free(an);
    free(fd);
    free(idx);
}

/* got[i] against a double reference: |got - ref| <= rtol * mag[i] (mag: the
 * sum of the magnitudes of the terms; the 1e-30 only keeps 0 / 0 out). */
static inline void compare_ref(const char *what, const float *got, const double *ref,
                               const double *mag, size_t n, double rtol)
{
    double worst = 0.0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        double ratio = fabs((double)got[i] - ref[i]) / (rtol * mag[i] + 1e-30);
        if (!(ratio <= worst)) {
            worst = ratio;
            at = i;
        }
    }
    fprintf(stderr, "[ref] %-33s n=%5zu worst |got-ref|/(rtol*mag) %.3f (rtol %.0e)\n",
            what, n, worst, rtol);
    cr_expect(worst <= 1.0, "%s: entry %zu is %.9g, the double reference %.9g (mag %.3g)",
              what, at, (double)got[at], ref[at], mag[at]);
}

static inline double *dalloc(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof *p);
    cr_assert(p);
    return p;
}

/* Two float results of the same computation: compare_ref with b as the
 * reference. */
static inline void compare_floats(const char *what, const float *a, const float *b,
                                  const double *mag, size_t n, double rtol)
{
    double *bd = dalloc(n);
    for (size_t i = 0; i < n; i++)
        bd[i] = b[i];
    compare_ref(what, a, bd, mag, n, rtol);
    free(bd);
}

/* x rounded to bf16 as oneDNN's reorder rounds it (to nearest, ties to
 * even), back in float; identity when !bf16. */
static inline float bf16_round(float x, int bf16)
{
    if (!bf16)
        return x;
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

static inline const char *layout_name(st_layout l)
{
    return l == ST_LAYOUT_PLAIN ? "plain" : l == ST_LAYOUT_BLOCKED ? "blocked" : "default";
}

#endif /* SUBTRAIN_TESTS_LAYER_CHECK_H */

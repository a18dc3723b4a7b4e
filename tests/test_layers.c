/*
 * tests/test_layers.c — gradient checks of the layers in src/nn, through
 * their private API (nn/layers.h).
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
#define _GNU_SOURCE /* RTLD_NEXT, for heapwatch.h */
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

/* GELU: smooth, |gelu'''| <= 0.8, so the truncation error of a central
 * difference is h^2 / 6 * 0.8 * |R| <= 2e-5 at h = 1e-2; a perturbation
 * moves one output, whose float32 rounding (plus oneDNN's erf approximation,
 * ~ 1e-7 absolute) divided by 2h is ~ 1e-5.  Same bound as linear. */
static const tol TOL_GELU = { 1e-2, 1e-3, 1e-2 };

/* Layer norm: smooth; the third derivative of an output with respect to one
 * input is O(gamma / sigma^3) (sigma: the row's standard deviation, >= 0.3
 * by construction of the inputs below), so truncation at h = 1e-2 is
 * <= 1e-4.  A perturbation of x moves a whole row of C outputs, each rounded
 * to ~ 1e-7 |y|, so rounding / 2h is ~ sqrt(C) 1e-7 / 0.02 ~ 1e-4 at C = 256.
 * Rounding dominates (measured: the error shrinks 5-10x going from h = 1e-3
 * to h = 1e-2), hence the larger h.  Gradients are O(0.1 .. 10). */
static const tol TOL_LAYERNORM = { 1e-2, 1e-3, 1e-2 };

/* Softmax cross-entropy: L = mean over rows of -logp[label], logp float32
 * from oneDNN's log-softmax, good to ~ 1e-6 absolute per row (measured: ~ 4
 * ulps).  Log-sum-exp's third derivative is <= 0.1, so truncation at h = 1e-2
 * is ~ 2e-6; rounding / 2h is ~ 1e-6 / 0.02 / rows ~ 2e-5 (measured: <= 5e-5).
 * dlogits are O(0.01 .. 0.3) (a mean over 3 .. 8 rows), so atol is 1e-4: a
 * 10% error of a 0.1 gradient is 1e-2, 50x above it. */
static const tol TOL_XENT = { 1e-2, 1e-4, 1e-2 };

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

static void env_init(env *e, uint64_t seed)
{
    st_arena_init(&e->arena, "test_layers", NULL, 0);
    OK(st_nn_ctx_init(&e->ctx, &e->arena));
    e->rng = st_rng_seed(seed);
}

static void env_destroy(env *e)
{
    st_nn_ctx_destroy(&e->ctx);
    st_arena_release(&e->arena);
}

/* n zeroed floats from the arena. */
static float *env_floats(env *e, size_t n)
{
    float *p;
    OK(st_arena_alloc_floats(&e->arena, ST_MEM_ACTIVATIONS, n, &p));
    return p;
}

/* x[i] ~ U(lo, hi) */
static void fill_uniform(st_rng *r, float *x, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * st_rng_uniform(r);
}

/* |x[i]| ~ U(margin, 1) with a random sign: away from ReLU's kink at 0. */
static void fill_away_from_zero(st_rng *r, float *x, size_t n, float margin)
{
    for (size_t i = 0; i < n; i++) {
        float mag = margin + (1.0f - margin) * st_rng_uniform(r);
        x[i] = st_rng_uniform(r) < 0.5f ? -mag : mag;
    }
}

/* L = sum(y * R) in double. */
static double dot_yr(const float *y, const float *R, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)y[i] * (double)R[i];
    return s;
}

/* Coordinates to check: all of [0, n) if n <= max, else a random subset of
 * max of them.  *count receives how many; the caller frees the array. */
static size_t *pick_coords(st_rng *r, size_t n, size_t max, size_t *count)
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
static void central_diff(objective_fn L, void *arg, float *p, const size_t *idx, size_t n,
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
static void check_param(const char *what, objective_fn L, void *arg, float *p,
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
static void compare_ref(const char *what, const float *got, const double *ref,
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

static double *dalloc(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof *p);
    cr_assert(p);
    return p;
}

/* Two float results of the same computation: compare_ref with b as the
 * reference. */
static void compare_floats(const char *what, const float *a, const float *b, const double *mag,
                           size_t n, double rtol)
{
    double *bd = dalloc(n);
    for (size_t i = 0; i < n; i++)
        bd[i] = b[i];
    compare_ref(what, a, bd, mag, n, rtol);
    free(bd);
}

/* ------------------------------------------------------------ linear */

/* One linear layer and its objective. */
typedef struct linear_case {
    env e;
    st_linear l;
    int64_t B, in, out;
    float *x, *y, *w, *b, *dx, *dy, *dw, *db, *R;
} linear_case;

static double linear_objective(void *arg)
{
    linear_case *c = arg;
    OK(st_linear_forward(&c->e.ctx, &c->l));
    return dot_yr(c->y, c->R, (size_t)(c->B * c->out));
}

/* y (B, out) = x (B, in) w^T + b against a double matmul; dx = dy w,
 * dw = dy^T x, db = sum_b dy against double too. */
static void linear_reference(const linear_case *c, const char *tag)
{
    const int64_t B = c->B, I = c->in, O = c->out;
    double *ref = dalloc((size_t)(B * O)), *mag = dalloc((size_t)(B * O));
    char what[64];
    for (int64_t b = 0; b < B; b++)
        for (int64_t o = 0; o < O; o++) {
            double s = c->b[o], m = fabs(c->b[o]);
            for (int64_t i = 0; i < I; i++) {
                s += (double)c->x[b * I + i] * c->w[o * I + i];
                m += fabs((double)c->x[b * I + i] * c->w[o * I + i]);
            }
            ref[b * O + o] = s;
            mag[b * O + o] = m;
        }
    snprintf(what, sizeof what, "linear %s y", tag);
    compare_ref(what, c->y, ref, mag, (size_t)(B * O), REF_RTOL);
    free(ref);
    free(mag);

    ref = dalloc((size_t)(B * I));
    mag = dalloc((size_t)(B * I));
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < I; i++)
            for (int64_t o = 0; o < O; o++) {
                double t = (double)c->dy[b * O + o] * c->w[o * I + i];
                ref[b * I + i] += t;
                mag[b * I + i] += fabs(t);
            }
    snprintf(what, sizeof what, "linear %s dx", tag);
    compare_ref(what, c->dx, ref, mag, (size_t)(B * I), REF_RTOL);
    free(ref);
    free(mag);

    ref = dalloc((size_t)(O * I));
    mag = dalloc((size_t)(O * I));
    for (int64_t o = 0; o < O; o++)
        for (int64_t i = 0; i < I; i++)
            for (int64_t b = 0; b < B; b++) {
                double t = (double)c->dy[b * O + o] * c->x[b * I + i];
                ref[o * I + i] += t;
                mag[o * I + i] += fabs(t);
            }
    snprintf(what, sizeof what, "linear %s dw", tag);
    compare_ref(what, c->dw, ref, mag, (size_t)(O * I), REF_RTOL);
    free(ref);
    free(mag);

    ref = dalloc((size_t)O);
    mag = dalloc((size_t)O);
    for (int64_t o = 0; o < O; o++)
        for (int64_t b = 0; b < B; b++) {
            ref[o] += c->dy[b * O + o];
            mag[o] += fabs(c->dy[b * O + o]);
        }
    snprintf(what, sizeof what, "linear %s db", tag);
    compare_ref(what, c->db, ref, mag, (size_t)O, REF_RTOL);
    free(ref);
    free(mag);
}

/* Builds, runs and checks a linear layer of the given shape; every
 * coordinate of dx, dw, db is checked up to max_coords each. */
static void check_linear(int64_t B, int64_t in, int64_t out, size_t max_coords, uint64_t seed)
{
    linear_case c = { .B = B, .in = in, .out = out };
    env_init(&c.e, seed);
    env *e = &c.e;
    c.x = env_floats(e, (size_t)(B * in));   // x is (B, in)
    c.y = env_floats(e, (size_t)(B * out));  // y is (B, out)
    c.w = env_floats(e, (size_t)(out * in)); // w is (out, in)
    c.b = env_floats(e, (size_t)out);
    c.dx = env_floats(e, (size_t)(B * in));
    c.dy = env_floats(e, (size_t)(B * out));
    c.dw = env_floats(e, (size_t)(out * in));
    c.db = env_floats(e, (size_t)out);
    c.R = env_floats(e, (size_t)(B * out));
    fill_uniform(&e->rng, c.x, (size_t)(B * in), -1.0f, 1.0f);
    /* Weights at the model's init scale, U(-1/sqrt(in), 1/sqrt(in)), so that
     * y stays O(1) at every shape. */
    float bound = 1.0f / sqrtf((float)in);
    fill_uniform(&e->rng, c.w, (size_t)(out * in), -bound, bound);
    fill_uniform(&e->rng, c.b, (size_t)out, -bound, bound);
    fill_uniform(&e->rng, c.R, (size_t)(B * out), -1.0f, 1.0f);

    st_linear_io io = { .x = c.x, .y = c.y, .dx = c.dx, .dy = c.dy,
                        .w = c.w, .b = c.b, .dw = c.dw, .db = c.db };
    OK(st_linear_build(&e->ctx, &c.l, B, in, out, &io));
    OK(st_nn_ctx_finalize(&e->ctx));
    OK(st_linear_forward(&e->ctx, &c.l));
    memcpy(c.dy, c.R, (size_t)(B * out) * sizeof *c.dy); /* dL/dy = R */
    OK(st_linear_backward(&e->ctx, &c.l));

    char tag[32], what[64];
    snprintf(tag, sizeof tag, "%lldx%lld->%lld", (long long)B, (long long)in, (long long)out);
    linear_reference(&c, tag);

    snprintf(what, sizeof what, "linear %s dx", tag);
    check_param(what, linear_objective, &c, c.x, c.dx, (size_t)(B * in), max_coords, TOL_LINEAR, &e->rng);
    snprintf(what, sizeof what, "linear %s dw", tag);
    check_param(what, linear_objective, &c, c.w, c.dw, (size_t)(out * in), max_coords, TOL_LINEAR, &e->rng);
    snprintf(what, sizeof what, "linear %s db", tag);
    check_param(what, linear_objective, &c, c.b, c.db, (size_t)out, max_coords, TOL_LINEAR, &e->rng);
    env_destroy(e);
}

Test(linear, small_shapes_every_coordinate)
{
    omp_set_num_threads(1);
    check_linear(4, 5, 3, SIZE_MAX, 11);
    check_linear(7, 13, 11, SIZE_MAX, 12);
    check_linear(8, 17, 9, SIZE_MAX, 13);
}

Test(linear, large_shape_random_subset)
{
    omp_set_num_threads(1);
    check_linear(64, 256, 128, LARGE_SUBSET, 14);
}

/* The first layer of a model has no dx (nobody needs it): backward must
 * still produce dw and db, and must not write a dx it was not given. */
Test(linear, without_dx)
{
    omp_set_num_threads(1);
    env e;
    env_init(&e, 15);
    const int64_t B = 6, I = 7, O = 5;
    float *x = env_floats(&e, B * I), *y = env_floats(&e, B * O);
    float *w = env_floats(&e, O * I), *b = env_floats(&e, O);
    float *dy = env_floats(&e, B * O), *dw = env_floats(&e, O * I), *db = env_floats(&e, O);
    fill_uniform(&e.rng, x, B * I, -1, 1);
    fill_uniform(&e.rng, w, O * I, -1, 1);
    fill_uniform(&e.rng, dy, B * O, -1, 1);
    st_linear l;
    st_linear_io io = { .x = x, .y = y, .dx = NULL, .dy = dy, .w = w, .b = b, .dw = dw, .db = db };
    OK(st_linear_build(&e.ctx, &l, B, I, O, &io));
    OK(st_nn_ctx_finalize(&e.ctx));
    cr_expect_eq(l.has_dx, 0);
    OK(st_linear_forward(&e.ctx, &l));
    OK(st_linear_backward(&e.ctx, &l));
    for (int64_t o = 0; o < O; o++) {
        double s = 0;
        for (int64_t r = 0; r < B; r++)
            s += dy[r * O + o];
        cr_expect(fabs(db[o] - s) <= 1e-5 * (1 + fabs(s)), "db[%lld] = %g, want %g",
                  (long long)o, db[o], s);
        for (int64_t i = 0; i < I; i++) {
            double t = 0;
            for (int64_t r = 0; r < B; r++)
                t += (double)dy[r * O + o] * x[r * I + i];
            cr_expect(fabs(dw[o * I + i] - t) <= 1e-5 * (1 + fabs(t)));
        }
    }
    env_destroy(&e);
}

/* The variants the subnetworks use, against a direct double reference:
 * weights stored (in, out) (in_major), a scale with the bias scaled too
 * (a dropped block) or not (dropped neurons), a fused residual, and weight
 * gradients for some runs of rows only (backward masking). */
/* x rounded to bf16 as oneDNN's reorder rounds it (to nearest, ties to
 * even), back in float; identity when !bf16. */
static float bf16_round(float x, int bf16)
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

/* bf16: the three products read w, x and dy rounded to bf16 (products of
 * two bf16 values are exact in fp32, and the sums are fp32); the bias, its
 * gradient (a sum of the fp32 dy), the residual and the scale are fp32.
 * The reference rounds its operands alike, so the tolerance stays fp32's,
 * and it also checks that the rounding happened: the largest difference
 * from the unrounded products is far above it. */
static void check_linear_variant(int in_major, int unscaled_bias, int runs, int bf16)
{
    env e;
    env_init(&e, 31 + (uint64_t)(4 * in_major + 2 * unscaled_bias + runs));
    const int64_t B = 5, I = 8, O = 6, R = in_major ? I : O, C = in_major ? O : I;
    const float scale = 2.5f;
    float *x = env_floats(&e, B * I), *y = env_floats(&e, B * O), *res = env_floats(&e, B * O);
    float *w = env_floats(&e, O * I), *b = env_floats(&e, O), *dx = env_floats(&e, B * I);
    float *dy = env_floats(&e, B * O), *dw = env_floats(&e, O * I), *db = env_floats(&e, O);
    fill_uniform(&e.rng, x, B * I, -1, 1);
    fill_uniform(&e.rng, w, O * I, -1, 1);
    fill_uniform(&e.rng, b, O, -1, 1);
    fill_uniform(&e.rng, res, B * O, -1, 1);
    fill_uniform(&e.rng, dy, B * O, -1, 1);
    /* storage rows kept for gradients: {1, 2} and {4} (or all) */
    const st_row_run kept[2] = { { 1, 2 }, { 4, 1 } };
    st_linear l;
    st_linear_io io = { .x = x, .y = y, .residual = res, .scale = scale, .dx = dx, .dy = dy,
                        .w = w, .b = b, .dw = dw, .db = db, .in_major = in_major,
                        .unscaled_bias = unscaled_bias, .dw_runs = runs ? kept : NULL,
                        .n_dw_runs = runs ? 2 : 0, .bf16 = bf16 };
    OK(st_linear_build(&e.ctx, &l, B, I, O, &io));
    OK(st_nn_ctx_finalize(&e.ctx));
    OK(st_linear_forward(&e.ctx, &l));
    OK(st_linear_backward(&e.ctx, &l));
#define W(o, i) ((double)bf16_round(w[in_major ? (i) * O + (o) : (o) * I + (i)], bf16))
#define X(r, i) ((double)bf16_round(x[(r) * I + (i)], bf16))
#define DY(r, o) ((double)bf16_round(dy[(r) * O + (o)], bf16))
    const double bs = unscaled_bias ? 1.0 : scale;
    double off = 0;   /* largest |y - the unrounded product| */
    for (int64_t r = 0; r < B; r++)
        for (int64_t o = 0; o < O; o++) {
            double t = 0, t32 = 0;
            for (int64_t i = 0; i < I; i++) {
                t += X(r, i) * W(o, i);
                t32 += (double)x[r * I + i] * w[in_major ? i * O + o : o * I + i];
            }
            double want = res[r * O + o] + scale * t + bs * b[o];
            cr_expect(fabs(y[r * O + o] - want) <= 1e-5 * (1 + fabs(want)), "y[%lld,%lld] = %g, "
                      "want %g", (long long)r, (long long)o, y[r * O + o], want);
            off = fmax(off, fabs(y[r * O + o] - (res[r * O + o] + scale * t32 + bs * b[o])));
        }
    if (bf16)
        cr_expect(off > 1e-3, "bf16 products differ from fp32 by %g only: not rounded?", off);
    for (int64_t r = 0; r < B; r++)
        for (int64_t i = 0; i < I; i++) {
            double t = 0;
            for (int64_t o = 0; o < O; o++)
                t += DY(r, o) * W(o, i);
            cr_expect(fabs(dx[r * I + i] - scale * t) <= 1e-5 * (1 + fabs(t)));
        }
#undef W
    /* dw: the kept storage rows, back to back */
    int64_t row = 0;
    for (int64_t sr = 0; sr < R; sr++) {
        if (runs && !(sr == 1 || sr == 2 || sr == 4))
            continue;
        for (int64_t sc = 0; sc < C; sc++) {
            int64_t o = in_major ? sc : sr, i = in_major ? sr : sc;
            double t = 0;
            for (int64_t r = 0; r < B; r++)
                t += DY(r, o) * X(r, i);
            cr_expect(fabs(dw[row * C + sc] - scale * t) <= 1e-5 * (1 + fabs(t)),
                      "dw row %lld (storage row %lld), col %lld", (long long)row, (long long)sr,
                      (long long)sc);
        }
        row++;
    }
#undef X
#undef DY
    /* db: the kept rows' biases (out-major), or every bias (in-major) */
    int64_t k = 0;
    for (int64_t o = 0; o < O; o++) {
        if (runs && !in_major && !(o == 1 || o == 2 || o == 4))
            continue;
        double t = 0;
        for (int64_t r = 0; r < B; r++)
            t += dy[r * O + o];
        cr_expect(fabs(db[k] - bs * t) <= 1e-5 * (1 + fabs(t)), "db[%lld]", (long long)o);
        k++;
    }
    env_destroy(&e);
}

Test(linear, storage_scale_bias_and_row_runs)
{
    omp_set_num_threads(1);
    for (int in_major = 0; in_major < 2; in_major++)
        for (int unscaled = 0; unscaled < 2; unscaled++)
            for (int runs = 0; runs < 2; runs++)
                check_linear_variant(in_major, unscaled, runs, 0);
}

/* The fusions turned off one at a time (bench_step --unfuse measures
 * them): the bias and the skip added by passes of their own give what the
 * fused matmul gives, in either weight storage and precision; a layer with
 * a branch scale keeps its fusions. */
Test(linear, unfused_bias_and_skip_match_the_fused_layer)
{
    omp_set_num_threads(1);
    const int bf16_ok = st_bf16_probe(NULL) != ST_BF16_UNAVAILABLE;
    for (int bf16 = 0; bf16 <= bf16_ok; bf16++)
        for (int in_major = 0; in_major < 2; in_major++)
            for (unsigned unfuse = 1; unfuse <= 3; unfuse++) {
                env e;
                env_init(&e, 77 + unfuse);
                const int64_t B = 9, I = 33, O = 17;
                float *x = env_floats(&e, B * I), *res = env_floats(&e, B * O);
                float *w = env_floats(&e, O * I), *b = env_floats(&e, O);
                float *y[2] = { env_floats(&e, B * O), env_floats(&e, B * O) };
                fill_uniform(&e.rng, x, B * I, -1, 1);
                fill_uniform(&e.rng, w, O * I, -1, 1);
                fill_uniform(&e.rng, b, O, -1, 1);
                fill_uniform(&e.rng, res, B * O, -1, 1);
                st_linear l[2];
                for (int k = 0; k < 2; k++) {
                    st_linear_io io = { .x = x, .y = y[k], .residual = res, .w = w, .b = b,
                                        .in_major = in_major, .bf16 = bf16,
                                        .unfuse = k ? unfuse : 0 };
                    OK(st_linear_build(&e.ctx, &l[k], B, I, O, &io));
                }
                cr_expect_eq(l[1].unfused_bias, (unfuse & ST_UNFUSE_BIAS) != 0);
                cr_expect_eq(l[1].unfused_residual, (unfuse & ST_UNFUSE_RESIDUAL) != 0);
                OK(st_nn_ctx_finalize(&e.ctx));
                for (int k = 0; k < 2; k++)
                    OK(st_linear_forward(&e.ctx, &l[k]));
                for (int64_t i = 0; i < B * O; i++)
                    cr_expect(fabsf(y[1][i] - y[0][i]) <= 1e-6f * (1 + fabsf(y[0][i])),
                              "bf16 %d in_major %d unfuse %u: y[%lld] = %g, fused %g", bf16,
                              in_major, unfuse, (long long)i, y[1][i], y[0][i]);
                st_linear scaled;
                st_linear_io io = { .x = x, .y = y[1], .residual = res, .scale = 0.5f, .w = w,
                                    .b = b, .unfuse = unfuse };
                OK(st_linear_build(&e.ctx, &scaled, B, I, O, &io));
                cr_expect(!scaled.unfused_bias && !scaled.unfused_residual);
                env_destroy(&e);
            }
}

/* The same variants with bf16 products, on any CPU whose oneDNN has bf16
 * kernels (native or emulated: the arithmetic is the same). */
Test(linear, bf16_products_of_rounded_operands)
{
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 matmul on this CPU");
    omp_set_num_threads(1);
    for (int in_major = 0; in_major < 2; in_major++)
        for (int unscaled = 0; unscaled < 2; unscaled++)
            for (int runs = 0; runs < 2; runs++)
                check_linear_variant(in_major, unscaled, runs, 1);
}

/* ------------------------------------------------------------ attention */

/* Causal self-attention: L is smooth in x (through the scores' softmax
 * and the products); the third derivative of an output in one input is
 * O(scale^2 |K| |V|) = O(1) here (|x| <= 1.5, scale 1/2), so truncation at
 * h = 1e-2 is ~ 2e-5.  A perturbation of one x moves a column of scores
 * and up to T rows of y, each rounded to ~ 1e-7, which / 2h is ~ 1e-5.
 * Gradients are O(0.01 .. 3): the atol of 1e-3 leaves a 10% error of the
 * typical one visible (the teeth check). */
static const tol TOL_ATTENTION = { 1e-2, 1e-3, 1e-2 };

/* One attention layer over B samples of T tokens, H heads of dh, its
 * buffers, and the objective L = sum(y * R) (dy = R). */
typedef struct attn_case {
    env e;
    st_attention a;
    int64_t B, T, H, dh;
    int bf16;
    float *x, *y, *dx, *dy, *scratch;
    void *probs;
} attn_case;

static void attn_setup(attn_case *c, int64_t B, int64_t T, int64_t H, int64_t dh, int bf16,
                       uint64_t seed)
{
    env_init(&c->e, seed);
    c->B = B, c->T = T, c->H = H, c->dh = dh, c->bf16 = bf16;
    const size_t X = (size_t)(B * T * 3 * H * dh), Y = (size_t)(B * T * H * dh);
    c->x = env_floats(&c->e, X);
    c->dx = env_floats(&c->e, X);
    c->y = env_floats(&c->e, Y);
    c->dy = env_floats(&c->e, Y);
    c->scratch = env_floats(&c->e, st_attention_scratch_floats(B, H, T));
    OK(st_arena_alloc(&c->e.arena, ST_MEM_ATTENTION, st_attention_probs_bytes(B, H, T, bf16),
                      &c->probs));
    fill_uniform(&c->e.rng, c->x, X, -1.5f, 1.5f);
    fill_uniform(&c->e.rng, c->dy, Y, -1, 1);
    const st_attention_io io = { .x = c->x, .y = c->y, .dx = c->dx, .dy = c->dy,
                                 .probs = c->probs, .scratch = c->scratch, .bf16 = bf16 };
    OK(st_attention_build(&c->e.ctx, &c->a, B, T, H, dh, &io));
    OK(st_nn_ctx_finalize(&c->e.ctx));
}

static double attn_objective(void *arg)
{
    attn_case *c = arg;
    OK(st_attention_forward(&c->e.ctx, &c->a));
    return dot_yr(c->y, c->dy, (size_t)(c->B * c->T * c->H * c->dh));
}

/* Entry p (fp32 or bf16) of the layer's P-sized buffer, as a double. */
static double attn_probs_at(const attn_case *c, const void *buf, size_t p)
{
    return c->bf16 ? (double)st_bf16_to_float(((const st_bf16 *)buf)[p])
                   : (double)((const float *)buf)[p];
}

/* The reference, in double, of the layer on x and dy as its products read
 * them (rounded to bf16 when `round`), and the magnitudes that bound each
 * entry's fp32 error.  Pu and dSu (NULL: the reference's own P and dS)
 * are the probabilities and score gradients the layer multiplied: y and
 * dV are computed from Pu, dQ and dK from dSu, so that every product is
 * checked to fp32 precision whatever rounding its operands went through;
 * P and dS themselves are checked on their own. */
typedef struct attn_ref {
    double *P, *y, *ymag, *dP, *dPmag, *dS, *dSmag, *dx, *dxmag;
} attn_ref;

static void attn_reference(const attn_case *c, int round, const double *Pu, const double *dSu,
                           attn_ref *r)
{
    const int64_t B = c->B, T = c->T, H = c->H, dh = c->dh, Dk = H * dh, X = 3 * Dk;
    const double scale = 1.0 / sqrt((double)dh);
    const size_t np = (size_t)(B * H * T * T), ny = (size_t)(B * T * Dk), nx = (size_t)(B * T * X);
    *r = (attn_ref){ dalloc(np), dalloc(ny), dalloc(ny), dalloc(np), dalloc(np), dalloc(np),
                     dalloc(np), dalloc(nx), dalloc(nx) };
#define XR(b, i, part, h, d) \
    ((double)bf16_round(c->x[((b) * T + (i)) * X + (part) * Dk + (h) * dh + (d)], round))
#define DYR(b, i, h, d) ((double)bf16_round(c->dy[((b) * T + (i)) * Dk + (h) * dh + (d)], round))
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const size_t blk = (size_t)((b * H + h) * T * T);
            double *P = r->P + blk, *dP = r->dP + blk, *dPm = r->dPmag + blk;
            double *dS = r->dS + blk, *dSm = r->dSmag + blk;
            const double *pu = (Pu ? Pu : r->P) + blk;
            for (int64_t i = 0; i < T; i++) {   /* P: softmax over the keys j <= i */
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j <= i; j++) {
                    double s = 0;
                    for (int64_t d = 0; d < dh; d++)
                        s += XR(b, i, 0, h, d) * XR(b, j, 1, h, d);
                    P[i * T + j] = scale * s;
                    mx = fmax(mx, scale * s);
                }
                for (int64_t j = 0; j <= i; j++)
                    sum += P[i * T + j] = exp(P[i * T + j] - mx);
                for (int64_t j = 0; j < T; j++)
                    P[i * T + j] = j <= i ? P[i * T + j] / sum : 0.0;
            }
            for (int64_t i = 0; i < T; i++)
                for (int64_t d = 0; d < dh; d++) {
                    double t = 0, m = 0, tv = 0, mv = 0;
                    for (int64_t j = 0; j < T; j++) {
                        t += pu[i * T + j] * XR(b, j, 2, h, d);         /* y = P V */
                        m += fabs(pu[i * T + j] * XR(b, j, 2, h, d));
                        tv += pu[j * T + i] * DYR(b, j, h, d);          /* dV = P^T dY */
                        mv += fabs(pu[j * T + i] * DYR(b, j, h, d));
                    }
                    const size_t at = (size_t)((b * T + i) * Dk + h * dh + d);
                    r->y[at] = t;
                    r->ymag[at] = m;
                    const size_t v = (size_t)((b * T + i) * X + 2 * Dk + h * dh + d);
                    r->dx[v] = tv;
                    r->dxmag[v] = mv;
                }
            for (int64_t i = 0; i < T; i++) {
                double s = 0, sm = 0;
                for (int64_t j = 0; j < T; j++) {   /* dP = dY V^T */
                    double t = 0, m = 0;
                    for (int64_t d = 0; d < dh; d++) {
                        t += DYR(b, i, h, d) * XR(b, j, 2, h, d);
                        m += fabs(DYR(b, i, h, d) * XR(b, j, 2, h, d));
                    }
                    dP[i * T + j] = t;
                    dPm[i * T + j] = m;
                    s += pu[i * T + j] * t;
                    sm += fabs(pu[i * T + j]) * m;
                }
                for (int64_t j = 0; j < T; j++) {   /* dS = P (dP - sum P dP) */
                    dS[i * T + j] = pu[i * T + j] * (dP[i * T + j] - s);
                    dSm[i * T + j] = fabs(pu[i * T + j]) * (dPm[i * T + j] + sm);
                }
            }
            const double *dsu = (dSu ? dSu : r->dS) + blk;
            for (int64_t i = 0; i < T; i++)
                for (int64_t d = 0; d < dh; d++) {
                    double tq = 0, mq = 0, tk = 0, mk = 0;
                    for (int64_t j = 0; j < T; j++) {
                        tq += dsu[i * T + j] * XR(b, j, 1, h, d);      /* dQ = dS K */
                        mq += fabs(dsu[i * T + j] * XR(b, j, 1, h, d));
                        tk += dsu[j * T + i] * XR(b, j, 0, h, d);      /* dK = dS^T Q */
                        mk += fabs(dsu[j * T + i] * XR(b, j, 0, h, d));
                    }
                    const size_t q = (size_t)((b * T + i) * X + h * dh + d);
                    r->dx[q] = scale * tq;
                    r->dxmag[q] = scale * mq;
                    r->dx[q + (size_t)Dk] = scale * tk;
                    r->dxmag[q + (size_t)Dk] = scale * mk;
                }
        }
#undef XR
#undef DYR
}

static void attn_ref_free(attn_ref *r)
{
    double *all[] = { r->P, r->y, r->ymag, r->dP, r->dPmag, r->dS, r->dSmag, r->dx, r->dxmag };
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        free(all[i]);
}

/* sqrt(sum (got - ref)^2 / sum ref^2) */
static double rel_rms(const float *got, const double *ref, size_t n)
{
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        e += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        s += ref[i] * ref[i];
    }
    return sqrt(e / (s + 1e-300));
}

/* Forward, then backward, checked stage by stage against the reference:
 * P (the saved buffer after the forward), y from that P, dP (bf16: the
 * scratch; fp32 computes dS over it), dS (bf16: over P's buffer; fp32: the
 * scratch) from that P and the reference dP, dV from P, dQ and dK from
 * that dS.  In bf16, P and dS are fp32 values rounded to bf16 once (to
 * nearest: half an ulp, at most 2^-8 relative; the fp32 value is a few
 * fp32 ulps off the double one, so a near-tie may round the other way,
 * hence the fp32 bound on top); everything else is an fp32 sum. */
static void check_attention(int64_t B, int64_t T, int64_t H, int64_t dh, int bf16,
                            uint64_t seed)
{
    attn_case c;
    attn_setup(&c, B, T, H, dh, bf16, seed);
    const int64_t Dk = H * dh;
    const size_t np = (size_t)(B * H * T * T), ny = (size_t)(B * T * Dk), nx = 3 * ny;
    char what[96];
    const char *tag = bf16 ? "bf16" : "fp32";
    OK(st_attention_forward(&c.e.ctx, &c.a));
    double *Pu = dalloc(np), *dSu = dalloc(np);
    for (size_t p = 0; p < np; p++)
        Pu[p] = attn_probs_at(&c, c.probs, p);
    OK(st_attention_backward(&c.e.ctx, &c.a));
    for (size_t p = 0; p < np; p++)
        dSu[p] = bf16 ? attn_probs_at(&c, c.probs, p) : (double)c.scratch[p];
    attn_ref r;
    attn_reference(&c, bf16, Pu, dSu, &r);

    /* P: exactly 0 above the diagonal, else the softmax, rounded in bf16 */
    const double round_rtol = bf16 ? 1.0 / 256 : 0.0;
    float *got = malloc(np * sizeof *got);
    double *mag = dalloc(np);
    cr_assert(got);
    int64_t above = 0;
    for (size_t p = 0; p < np; p++) {
        const int64_t i = (int64_t)(p / (size_t)T) % T, j = (int64_t)(p % (size_t)T);
        above += j > i && Pu[p] != 0.0;
        got[p] = (float)Pu[p];
        mag[p] = (round_rtol + 1e-5) * r.P[p] + 1e-7;   /* relative, with a floor for exp */
    }
    cr_expect_eq(above, 0, "%s: %lld masked probabilities are not 0", tag, (long long)above);
    snprintf(what, sizeof what, "attention %s P", tag);
    compare_ref(what, got, r.P, mag, np, 1.0);
    snprintf(what, sizeof what, "attention %s y = P V", tag);
    compare_ref(what, c.y, r.y, r.ymag, ny, REF_RTOL);
    if (bf16) {
        snprintf(what, sizeof what, "attention %s dP = dY V^T", tag);
        compare_ref(what, c.scratch, r.dP, r.dPmag, np, REF_RTOL);
    }
    for (size_t p = 0; p < np; p++) {
        got[p] = (float)dSu[p];
        mag[p] = round_rtol * fabs(r.dS[p]) + REF_RTOL * r.dSmag[p];
    }
    snprintf(what, sizeof what, "attention %s dS = P (dP - sum P dP)", tag);
    compare_ref(what, got, r.dS, mag, np, 1.0);
    snprintf(what, sizeof what, "attention %s dx = (dS K, dS^T Q, P^T dY)", tag);
    compare_ref(what, c.dx, r.dx, r.dxmag, nx, REF_RTOL);

    /* bf16 against the unrounded reference: rounded it is (far from it at
     * fp32's tolerance), and close (the kept P in bf16 costs the gradient
     * what the products' own rounding does) */
    attn_ref full;
    attn_reference(&c, 0, NULL, NULL, &full);
    const double ey = rel_rms(c.y, full.y, ny), edx = rel_rms(c.dx, full.dx, nx);
    fprintf(stderr, "[ref] attention %s against unrounded fp32 math: y %.2e, dx %.2e "
            "(relative rms)\n", tag, ey, edx);
    if (bf16) {
        cr_expect(ey > 1e-4 && edx > 1e-4, "bf16 y, dx within %.1e, %.1e of fp32: not rounded?",
                  ey, edx);
        cr_expect(ey < 1e-2 && edx < 1e-2, "bf16 y, dx off fp32 by %.1e, %.1e", ey, edx);
    } else {
        cr_expect(ey < 1e-6 && edx < 1e-6, "fp32 y, dx off by %.1e, %.1e", ey, edx);
    }
    attn_ref_free(&full);
    attn_ref_free(&r);
    free(got);
    free(mag);
    free(Pu);
    free(dSu);
    env_destroy(&c.e);
}

/* fp32: the reference (stage by stage, T not a multiple of anything, 2
 * samples, 2 heads) and central differences of L in every x. */
Test(attention, fp32_reference_and_every_input_coordinate)
{
    omp_set_num_threads(1);
    check_attention(2, 7, 2, 4, 0, 41);
    attn_case c;
    attn_setup(&c, 2, 7, 2, 4, 0, 43);
    OK(st_attention_forward(&c.e.ctx, &c.a));
    OK(st_attention_backward(&c.e.ctx, &c.a));
    const size_t nx = (size_t)(2 * 7 * 3 * 8);
    float *an = malloc(nx * sizeof *an);
    cr_assert(an);
    memcpy(an, c.dx, nx * sizeof *an);
    check_param("attention fp32 dx", attn_objective, &c, c.x, an, nx, nx, TOL_ATTENTION,
                &c.e.rng);
    free(an);
    env_destroy(&c.e);
}

/* bf16: the products of rounded operands (x's copy through every stride
 * and offset, P, dY and dS rounded), scores, softmax and its backward in
 * fp32 math, on any CPU whose oneDNN has bf16 kernels; and a larger shape
 * (dh 16, T 33: past oneDNN's blocks). */
Test(attention, bf16_products_of_rounded_operands)
{
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 matmul on this CPU");
    omp_set_num_threads(1);
    check_attention(2, 7, 2, 4, 1, 41);
    check_attention(3, 33, 3, 16, 1, 47);
}

/* ------------------------------------------------------------ activations */

typedef struct act_case {
    env e;
    st_act a;
    size_t n;
    float *x, *y, *dx, *dy, *R;
} act_case;

static double act_objective(void *arg)
{
    act_case *c = arg;
    OK(st_act_forward(&c->e.ctx, &c->a));
    return dot_yr(c->y, c->R, c->n);
}

/* gelu(x) = x Phi(x) (erf form), gelu'(x) = Phi(x) + x phi(x). */
static double gelu_ref(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }
static double gelu_grad_ref(double x)
{
    const double inv_sqrt_2pi = 0.3989422804014327;
    return 0.5 * (1.0 + erf(x / sqrt(2.0))) + x * inv_sqrt_2pi * exp(-0.5 * x * x);
}

/* y = act(x), dx = act'(x) dy on a (rows, cols) matrix. */
static void check_act(st_activation kind, int64_t rows, int64_t cols, size_t max_coords,
                      uint64_t seed)
{
    act_case c = { .n = (size_t)(rows * cols) };
    env_init(&c.e, seed);
    env *e = &c.e;
    c.x = env_floats(e, c.n); // all (rows, cols)
    c.y = env_floats(e, c.n);
    c.dx = env_floats(e, c.n);
    c.dy = env_floats(e, c.n);
    c.R = env_floats(e, c.n);
    if (kind == ST_ACT_RELU)
        fill_away_from_zero(&e->rng, c.x, c.n, 0.05f); /* h = 1e-2 never crosses 0 */
    else
        fill_uniform(&e->rng, c.x, c.n, -3.0f, 3.0f); /* GELU's whole curved range */
    fill_uniform(&e->rng, c.R, c.n, -1.0f, 1.0f);

    OK(st_act_build(&e->ctx, &c.a, kind, rows, cols, c.x, c.y, c.dx, c.dy, 0));
    OK(st_nn_ctx_finalize(&e->ctx));
    OK(st_act_forward(&e->ctx, &c.a));
    memcpy(c.dy, c.R, c.n * sizeof *c.dy);
    OK(st_act_backward(&e->ctx, &c.a));

    char what[64];
    const char *name = kind == ST_ACT_RELU ? "relu" : "gelu";
    if (kind == ST_ACT_RELU) {
        /* ReLU is exact in float: y = max(x, 0), dx = x > 0 ? dy : 0. */
        for (size_t i = 0; i < c.n; i++) {
            cr_expect_eq(c.y[i], c.x[i] > 0 ? c.x[i] : 0.0f, "relu y[%zu]", i);
            cr_expect_eq(c.dx[i], c.x[i] > 0 ? c.dy[i] : 0.0f, "relu dx[%zu]", i);
        }
    } else {
        double *ref = dalloc(c.n), *mag = dalloc(c.n), *dref = dalloc(c.n), *dmag = dalloc(c.n);
        for (size_t i = 0; i < c.n; i++) {
            /* oneDNN evaluates 0.5 x (1 + erf(x / sqrt 2)) with an erf good to
             * ~1e-7 ABSOLUTE: where 1 + erf cancels (x < -2) the error of y
             * is ~ 0.5 |x| 1e-7, not relative to y.  The floor 0.05 |x| in
             * mag allows 5e-7 |x| absolute: 10x that. */
            ref[i] = gelu_ref(c.x[i]);
            mag[i] = fabs(ref[i]) + 0.05 * fabs(c.x[i]);
            dref[i] = gelu_grad_ref(c.x[i]) * c.dy[i];
            dmag[i] = fabs(dref[i]) + 0.05 * fabs(c.dy[i]);
        }
        snprintf(what, sizeof what, "gelu %lldx%lld y", (long long)rows, (long long)cols);
        compare_ref(what, c.y, ref, mag, c.n, REF_RTOL);
        snprintf(what, sizeof what, "gelu %lldx%lld dx", (long long)rows, (long long)cols);
        compare_ref(what, c.dx, dref, dmag, c.n, REF_RTOL);
        free(ref);
        free(mag);
        free(dref);
        free(dmag);
    }
    snprintf(what, sizeof what, "%s %lldx%lld dx", name, (long long)rows, (long long)cols);
    check_param(what, act_objective, &c, c.x, c.dx, c.n, max_coords,
                kind == ST_ACT_RELU ? TOL_LINEAR : TOL_GELU, &e->rng);
    env_destroy(e);
}

Test(activation, relu_small)
{
    omp_set_num_threads(1);
    check_act(ST_ACT_RELU, 6, 13, SIZE_MAX, 21);
    check_act(ST_ACT_RELU, 3, 5, SIZE_MAX, 22);
}

Test(activation, gelu_small)
{
    omp_set_num_threads(1);
    check_act(ST_ACT_GELU, 6, 13, SIZE_MAX, 23);
    check_act(ST_ACT_GELU, 3, 5, SIZE_MAX, 24);
}

Test(activation, large_random_subset)
{
    omp_set_num_threads(1);
    check_act(ST_ACT_RELU, 64, 257, LARGE_SUBSET, 25);
    check_act(ST_ACT_GELU, 64, 257, LARGE_SUBSET, 26);
}

/* ------------------------------------------------------------ layer norm */

typedef struct ln_case {
    env e;
    st_layernorm ln;
    int64_t B, C;
    float *x, *y, *mean, *var, *gamma, *beta, *dx, *dy, *dgamma, *dbeta, *R;
} ln_case;

static double ln_objective(void *arg)
{
    ln_case *c = arg;
    OK(st_layernorm_forward(&c->e.ctx, &c->ln));
    return dot_yr(c->y, c->R, (size_t)(c->B * c->C));
}

/* Forward (y, mean, var) and backward (dx, dgamma, dbeta) in double:
 *   xhat = (x - mu) / s, s = sqrt(var + eps), y = xhat gamma + beta
 *   g = gamma dy; dx = (g - mean(g) - xhat mean(g xhat)) / s
 *   dgamma = sum_b dy xhat, dbeta = sum_b dy */
static void ln_reference(const ln_case *c, const char *tag)
{
    const int64_t B = c->B, C = c->C;
    size_t n = (size_t)(B * C);
    double *y = dalloc(n), *ymag = dalloc(n), *dx = dalloc(n), *dxmag = dalloc(n);
    double *mu = dalloc((size_t)B), *var = dalloc((size_t)B), *smag = dalloc((size_t)B);
    double *dg = dalloc((size_t)C), *dgmag = dalloc((size_t)C);
    double *db = dalloc((size_t)C), *dbmag = dalloc((size_t)C);
    double *xhat = dalloc((size_t)C);
    char what[64];
    for (int64_t b = 0; b < B; b++) {
        const float *xr = c->x + b * C, *dyr = c->dy + b * C;
        double m = 0, v = 0, sabs = 0;
        for (int64_t j = 0; j < C; j++)
            m += xr[j];
        m /= (double)C;
        for (int64_t j = 0; j < C; j++) {
            v += (xr[j] - m) * (xr[j] - m);
            sabs += fabs(xr[j]);
        }
        v /= (double)C;
        mu[b] = m;
        var[b] = v;
        smag[b] = sabs / (double)C; /* mean and variance round at this scale */
        double s = sqrt(v + (double)ST_LAYERNORM_EPS);
        double mg = 0, mgx = 0, gmag = 0;
        for (int64_t j = 0; j < C; j++) {
            xhat[j] = (xr[j] - m) / s;
            y[b * C + j] = xhat[j] * c->gamma[j] + c->beta[j];
            /* x - mean loses the bits of |x| above the row's spread. */
            ymag[b * C + j] = (fabs(xr[j]) + smag[b]) / s * fabs(c->gamma[j]) + fabs(c->beta[j]);
            double g = (double)c->gamma[j] * dyr[j];
            mg += g;
            mgx += g * xhat[j];
            gmag += fabs(g) * (1 + fabs(xhat[j]));
            dg[j] += dyr[j] * xhat[j];
            dgmag[j] += fabs(dyr[j] * xhat[j]) + fabs(dyr[j]) * smag[b] / s;
            db[j] += dyr[j];
            dbmag[j] += fabs(dyr[j]);
        }
        mg /= (double)C;
        mgx /= (double)C;
        gmag /= (double)C;
        for (int64_t j = 0; j < C; j++) {
            double g = (double)c->gamma[j] * dyr[j];
            dx[b * C + j] = (g - mg - xhat[j] * mgx) / s;
            dxmag[b * C + j] = (fabs(g) + gmag * (1 + fabs(xhat[j])) + fabs(g) * smag[b] / s) / s;
        }
    }
    snprintf(what, sizeof what, "layernorm %s y", tag);
    compare_ref(what, c->y, y, ymag, n, REF_RTOL);
    snprintf(what, sizeof what, "layernorm %s mean", tag);
    compare_ref(what, c->mean, mu, smag, (size_t)B, REF_RTOL);
    for (int64_t b = 0; b < B; b++)
        smag[b] = var[b] + smag[b] * smag[b] * 1e-1; /* var's own rounding + mean's */
    snprintf(what, sizeof what, "layernorm %s var", tag);
    compare_ref(what, c->var, var, smag, (size_t)B, REF_RTOL);
    snprintf(what, sizeof what, "layernorm %s dx", tag);
    compare_ref(what, c->dx, dx, dxmag, n, REF_RTOL);
    snprintf(what, sizeof what, "layernorm %s dgamma", tag);
    compare_ref(what, c->dgamma, dg, dgmag, (size_t)C, REF_RTOL);
    snprintf(what, sizeof what, "layernorm %s dbeta", tag);
    compare_ref(what, c->dbeta, db, dbmag, (size_t)C, REF_RTOL);
    free(y); free(ymag); free(dx); free(dxmag); free(mu); free(var); free(smag);
    free(dg); free(dgmag); free(db); free(dbmag); free(xhat);
}

static void check_layernorm(int64_t B, int64_t C, size_t max_coords, uint64_t seed)
{
    ln_case c = { .B = B, .C = C };
    env_init(&c.e, seed);
    env *e = &c.e;
    size_t n = (size_t)(B * C);
    c.x = env_floats(e, n); // x, y, dx, dy are (B, C)
    c.y = env_floats(e, n);
    c.dx = env_floats(e, n);
    c.dy = env_floats(e, n);
    c.R = env_floats(e, n);
    c.mean = env_floats(e, (size_t)B); // mean, var are (B)
    c.var = env_floats(e, (size_t)B);
    c.gamma = env_floats(e, (size_t)C); // gamma, beta, dgamma, dbeta are (C)
    c.beta = env_floats(e, (size_t)C);
    c.dgamma = env_floats(e, (size_t)C);
    c.dbeta = env_floats(e, (size_t)C);
    /* Row b is offset_b + scale_b * u, u ~ U(-1, 1): a nonzero mean for the
     * norm to remove, and a spread sigma >= 0.3 so that the curvature (and the
     * truncation error of the finite differences) stays bounded.  The first
     * two entries are pinned at -1 and +1 so that even C = 5 rows spread. */
    for (int64_t b = 0; b < B; b++) {
        float off = -2.0f + 4.0f * st_rng_uniform(&e->rng);
        float scale = 0.5f + 1.5f * st_rng_uniform(&e->rng);
        fill_uniform(&e->rng, c.x + b * C, (size_t)C, -1.0f, 1.0f);
        c.x[b * C] = -1.0f;
        c.x[b * C + 1] = 1.0f;
        for (int64_t j = 0; j < C; j++)
            c.x[b * C + j] = off + scale * c.x[b * C + j];
    }
    /* gamma, beta away from their init (1, 0) so a swapped or ignored
     * parameter shows. */
    fill_uniform(&e->rng, c.gamma, (size_t)C, 0.5f, 1.5f);
    fill_uniform(&e->rng, c.beta, (size_t)C, -0.5f, 0.5f);
    fill_uniform(&e->rng, c.R, n, -1.0f, 1.0f);

    st_layernorm_io io = {
        .x = c.x, .y = c.y, .mean = c.mean, .var = c.var, .gamma = c.gamma, .beta = c.beta,
        .dx = c.dx, .dy = c.dy, .dgamma = c.dgamma, .dbeta = c.dbeta,
    };
    OK(st_layernorm_build(&e->ctx, &c.ln, B, C, &io));
    OK(st_nn_ctx_finalize(&e->ctx));
    OK(st_layernorm_forward(&e->ctx, &c.ln));
    memcpy(c.dy, c.R, n * sizeof *c.dy);
    OK(st_layernorm_backward(&e->ctx, &c.ln));

    char tag[32], what[64];
    snprintf(tag, sizeof tag, "%lldx%lld", (long long)B, (long long)C);
    ln_reference(&c, tag);

    snprintf(what, sizeof what, "layernorm %s dx", tag);
    check_param(what, ln_objective, &c, c.x, c.dx, n, max_coords, TOL_LAYERNORM, &e->rng);
    snprintf(what, sizeof what, "layernorm %s dgamma", tag);
    check_param(what, ln_objective, &c, c.gamma, c.dgamma, (size_t)C, max_coords, TOL_LAYERNORM, &e->rng);
    snprintf(what, sizeof what, "layernorm %s dbeta", tag);
    check_param(what, ln_objective, &c, c.beta, c.dbeta, (size_t)C, max_coords, TOL_LAYERNORM, &e->rng);
    env_destroy(e);
}

Test(layernorm, small_shapes_every_coordinate)
{
    omp_set_num_threads(1);
    check_layernorm(6, 13, SIZE_MAX, 31);
    check_layernorm(4, 5, SIZE_MAX, 32);
    check_layernorm(5, 24, SIZE_MAX, 33);
}

Test(layernorm, large_shape_random_subset)
{
    omp_set_num_threads(1);
    check_layernorm(64, 256, LARGE_SUBSET, 34);
}

/* ------------------------------------------------------------ bf16 keep */

/* Largest |a - b| / (|b| + floor) over n floats, and whether any differs. */
static double max_rel(const float *a, const float *b, size_t n, double floor_, int *differs)
{
    double worst = 0;
    *differs = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - b[i]) / (fabs((double)b[i]) + floor_);
        if (d > worst || d != d)
            worst = d != d ? INFINITY : d;
        if (a[i] != b[i])
            *differs = 1;
    }
    return worst;
}

/* sqrt(sum (a - b)^2 / sum b^2) over n floats. */
static double rms_rel(const float *a, const float *b, size_t n)
{
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return sqrt(d / r);
}

static float *poison(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = NAN;
    return x;
}

/* bf16 activation: the forward is fp32's (y bitwise); the backward reads
 * the kept copy of x only (x is poisoned with NaN after the forward) and
 * gives what the fp32 backward gives on x rounded to bf16 (xr), and (GELU)
 * not what it gives on x itself, but close to it. */
static void check_act_bf16(st_activation kind, int64_t rows, int64_t cols, uint64_t seed)
{
    env e;
    env_init(&e, seed);
    const size_t n = (size_t)(rows * cols);
    float *x = env_floats(&e, n), *x32 = env_floats(&e, n), *xr = env_floats(&e, n);
    float *y = env_floats(&e, n), *y32 = env_floats(&e, n), *yr = env_floats(&e, n);
    float *dx = env_floats(&e, n), *dx32 = env_floats(&e, n), *dxr = env_floats(&e, n);
    float *dy = env_floats(&e, n);
    fill_uniform(&e.rng, x, n, -4.0f, 4.0f);
    fill_uniform(&e.rng, dy, n, -1.0f, 1.0f);
    for (size_t i = 0; i < n; i++) {
        x32[i] = x[i];
        xr[i] = bf16_round(x[i], 1);
    }
    st_act a, a32, ar;
    OK(st_act_build(&e.ctx, &a, kind, rows, cols, x, y, dx, dy, 1));
    OK(st_act_build(&e.ctx, &a32, kind, rows, cols, x32, y32, dx32, dy, 0));
    OK(st_act_build(&e.ctx, &ar, kind, rows, cols, xr, yr, dxr, dy, 0));
    OK(st_nn_ctx_finalize(&e.ctx));
    cr_assert(a.bf16 && a.xb && !a32.bf16, "bf16 keeps a copy, fp32 does not");
    OK(st_act_forward(&e.ctx, &a));
    OK(st_act_forward(&e.ctx, &a32));
    OK(st_act_forward(&e.ctx, &ar));
    const char *name = kind == ST_ACT_RELU ? "relu" : "gelu";
    cr_assert(memcmp(y, y32, n * sizeof *y) == 0, "bf16 %s forward differs from fp32's", name);
    poison(x, n);   /* nobody may read x after the forward */
    OK(st_act_backward(&e.ctx, &a));
    OK(st_act_backward(&e.ctx, &a32));
    OK(st_act_backward(&e.ctx, &ar));
    int differs;
    const double to_rounded = max_rel(dx, dxr, n, 1e-6, &differs);
    cr_assert(to_rounded <= 1e-6, "bf16 %s dx off the fp32 backward of bf16(x) by %g", name,
              to_rounded);
    (void)max_rel(dx, dx32, n, 1.0, &differs);
    const double to_fp32 = rms_rel(dx, dx32, n);
    if (kind == ST_ACT_RELU)
        cr_assert(!differs, "bf16 relu dx differs from fp32's (rounding keeps the sign)");
    else   /* |gelu''| <= 0.8: |error| <= 0.8 2^-9 |x dy| */
        cr_assert(differs && to_fp32 < 4e-3, "bf16 gelu dx against fp32: %s, rms rel %g",
                  differs ? "differs" : "bitwise equal (x not rounded?)", to_fp32);
    env_destroy(&e);
}

Test(activation, bf16_backward_reads_the_kept_rounded_input)
{
    omp_set_num_threads(1);
    check_act_bf16(ST_ACT_GELU, 7, 33, 61);
    check_act_bf16(ST_ACT_RELU, 7, 33, 62);
    check_act_bf16(ST_ACT_GELU, 64, 257, 63);
}

/* bf16 layer norm: the forward is fp32's (y, mean, var bitwise); the
 * backward reads the kept centred copy only (x poisoned after the
 * forward) and gives what the fp32 backward gives on
 * xr = mean + bf16(x - mean) with the fp32 statistics, close to fp32's
 * on x even for rows far from 0 (offset 1000, spread 1: rounding x itself
 * would move x_hat by ~2, centring keeps it within 2^-9). */
static void check_layernorm_bf16(int64_t B, int64_t C, float offset, uint64_t seed)
{
    env e;
    env_init(&e, seed);
    const size_t n = (size_t)(B * C);
    float *x = env_floats(&e, n), *x32 = env_floats(&e, n), *xr = env_floats(&e, n);
    float *y = env_floats(&e, n), *y32 = env_floats(&e, n), *yr = env_floats(&e, n);
    float *dx = env_floats(&e, n), *dx32 = env_floats(&e, n), *dxr = env_floats(&e, n);
    float *dy = env_floats(&e, n);
    float *mean = env_floats(&e, (size_t)B), *var = env_floats(&e, (size_t)B);
    float *mean32 = env_floats(&e, (size_t)B), *var32 = env_floats(&e, (size_t)B);
    float *meanr = env_floats(&e, (size_t)B), *varr = env_floats(&e, (size_t)B);
    float *gamma = env_floats(&e, (size_t)C), *beta = env_floats(&e, (size_t)C);
    float *dg = env_floats(&e, (size_t)C), *db = env_floats(&e, (size_t)C);
    float *dg32 = env_floats(&e, (size_t)C), *db32 = env_floats(&e, (size_t)C);
    float *dgr = env_floats(&e, (size_t)C), *dbr = env_floats(&e, (size_t)C);
    for (int64_t b = 0; b < B; b++) {
        const float off = offset * (b % 2 ? 1.0f : -1.0f) + 0.5f * st_rng_uniform(&e.rng);
        fill_uniform(&e.rng, x + b * C, (size_t)C, -1.5f, 1.5f);
        for (int64_t j = 0; j < C; j++)
            x[b * C + j] += off;
    }
    fill_uniform(&e.rng, dy, n, -1.0f, 1.0f);
    fill_uniform(&e.rng, gamma, (size_t)C, 0.5f, 1.5f);
    fill_uniform(&e.rng, beta, (size_t)C, -0.5f, 0.5f);
    memcpy(x32, x, n * sizeof *x);
    st_layernorm ln, ln32, lnr;
    st_layernorm_io io = { .x = x, .y = y, .mean = mean, .var = var, .gamma = gamma,
                           .beta = beta, .dx = dx, .dy = dy, .dgamma = dg, .dbeta = db,
                           .bf16 = 1 };
    st_layernorm_io io32 = io, ior = io;
    io32.x = x32, io32.y = y32, io32.mean = mean32, io32.var = var32, io32.dx = dx32;
    io32.dgamma = dg32, io32.dbeta = db32, io32.bf16 = 0;
    ior.x = xr, ior.y = yr, ior.mean = meanr, ior.var = varr, ior.dx = dxr;
    ior.dgamma = dgr, ior.dbeta = dbr, ior.bf16 = 0;
    OK(st_layernorm_build(&e.ctx, &ln, B, C, &io));
    OK(st_layernorm_build(&e.ctx, &ln32, B, C, &io32));
    OK(st_layernorm_build(&e.ctx, &lnr, B, C, &ior));
    OK(st_nn_ctx_finalize(&e.ctx));
    cr_assert(ln.bf16 && ln.xb && !ln32.bf16, "bf16 keeps a copy, fp32 does not");
    OK(st_layernorm_forward(&e.ctx, &ln));
    OK(st_layernorm_forward(&e.ctx, &ln32));
    cr_assert(memcmp(y, y32, n * sizeof *y) == 0, "bf16 layer norm y differs from fp32's");
    cr_assert(memcmp(mean, mean32, (size_t)B * sizeof *mean) == 0 &&
              memcmp(var, var32, (size_t)B * sizeof *var) == 0,
              "bf16 layer norm statistics differ from fp32's");
    /* the reference's input: mean + bf16(x - mean), the fp32 statistics */
    for (int64_t b = 0; b < B; b++) {
        meanr[b] = mean[b];
        varr[b] = var[b];
        for (int64_t j = 0; j < C; j++)
            xr[b * C + j] = mean[b] + bf16_round(x[b * C + j] - mean[b], 1);
    }
    poison(x, n);   /* nobody may read x after the forward */
    OK(st_layernorm_backward(&e.ctx, &ln));
    OK(st_layernorm_backward(&e.ctx, &ln32));
    OK(st_layernorm_backward(&e.ctx, &lnr));   /* its forward never ran: statistics as set */
    int differs;
    double w = max_rel(dx, dxr, n, 1e-6, &differs);
    cr_assert(w <= 1e-6, "bf16 layer norm dx off the reference by %g (offset %g)", w, offset);
    w = max_rel(dg, dgr, (size_t)C, 1e-6, &differs);
    cr_assert(w <= 1e-6, "bf16 layer norm dgamma off the reference by %g", w);
    w = max_rel(db, dbr, (size_t)C, 1e-6, &differs);
    cr_assert(w <= 1e-6 && !differs, "bf16 layer norm dbeta (sum of dy) off by %g", w);
    /* against fp32 on x: rounded, and close (2^-9 per element of x_hat) */
    const double rms = rms_rel(dx, dx32, n);
    (void)max_rel(dg, dg32, (size_t)C, 1.0, &differs);
    w = rms_rel(dg, dg32, (size_t)C);
    fprintf(stderr, "bf16 layer norm %lldx%lld offset %g: dx %.2e, dgamma %.2e rms off fp32\n",
            (long long)B, (long long)C, offset, rms, w);
    cr_assert(rms > 1e-5 && rms < 1e-2, "bf16 layer norm dx off fp32's by %g rms (offset %g)",
              rms, offset);
    cr_assert(differs && w < 1e-2, "bf16 layer norm dgamma off fp32's by %g rms", w);
    env_destroy(&e);
}

Test(layernorm, bf16_backward_reads_the_kept_centred_input)
{
    omp_set_num_threads(1);
    check_layernorm_bf16(6, 13, 2.0f, 71);
    check_layernorm_bf16(64, 256, 0.0f, 72);
    check_layernorm_bf16(16, 64, 1000.0f, 73);   /* far from 0: centring matters */
}

/* ------------------------------------------------------------ add */

/* out = a + b, and the in-place form out == a (the backward's gradient
 * accumulation).  Float addition is correctly rounded, so oneDNN must match
 * the C sum bitwise. */
static void check_add(int64_t rows, int64_t cols, uint64_t seed)
{
    env e;
    env_init(&e, seed);
    size_t n = (size_t)(rows * cols);
    float *a = env_floats(&e, n), *b = env_floats(&e, n), *out = env_floats(&e, n);
    float *acc = env_floats(&e, n), *a0 = env_floats(&e, n);
    fill_uniform(&e.rng, a, n, -1, 1);
    fill_uniform(&e.rng, b, n, -1, 1);
    memcpy(acc, a, n * sizeof *acc);
    memcpy(a0, a, n * sizeof *a0);
    st_add r, racc;
    OK(st_add_build(&e.ctx, &r, rows, cols, a, b, out));
    OK(st_add_build(&e.ctx, &racc, rows, cols, acc, b, acc)); /* acc += b */
    OK(st_nn_ctx_finalize(&e.ctx));

    OK(st_add_run(&e.ctx, &r));
    for (size_t i = 0; i < n; i++)
        cr_expect_eq(out[i], a[i] + b[i], "add %lldx%lld out[%zu] = %.9g, want %.9g",
                     (long long)rows, (long long)cols, i, out[i], a[i] + b[i]);
    for (size_t i = 0; i < n; i++)
        cr_expect_eq(a[i], a0[i], "add wrote its input a[%zu]", i);

    /* In place, twice: acc = (a + b) + b, each step rounded like C's. */
    OK(st_add_run(&e.ctx, &racc));
    OK(st_add_run(&e.ctx, &racc));
    for (size_t i = 0; i < n; i++) {
        float want = (a0[i] + b[i]) + b[i];
        cr_expect_eq(acc[i], want, "in-place add %lldx%lld acc[%zu] = %.9g, want %.9g",
                     (long long)rows, (long long)cols, i, acc[i], want);
    }
    fprintf(stderr, "[add] %lldx%lld out-of-place and in-place: checked bitwise\n",
            (long long)rows, (long long)cols);
    env_destroy(&e);
}

Test(add, out_of_place_and_in_place)
{
    omp_set_num_threads(1);
    check_add(5, 13, 41);
    check_add(3, 1, 42);
    check_add(64, 256, 43);
}

/* ------------------------------------------------------------ softmax cross-entropy */

typedef struct xent_case {
    env e;
    st_xent x;
    int64_t B, K, rows;
    float *logits, *logp, *dlogits;
    int32_t *labels;
} xent_case;

/* L = mean loss over the first `rows` rows (what dlogits is the gradient of). */
static double xent_objective(void *arg)
{
    xent_case *c = arg;
    double sum;
    OK(st_xent_forward(&c->e.ctx, &c->x, c->labels, c->rows, 0, &sum, NULL));
    return sum / (double)c->rows;
}

/* sum over rows of -log softmax(logits)[label], and the argmax hits, in
 * double from the float logits. */
static double xent_reference(const float *logits, const int32_t *labels, int64_t rows,
                             int64_t K, int64_t *hits)
{
    double sum = 0.0;
    *hits = 0;
    for (int64_t b = 0; b < rows; b++) {
        const float *l = logits + b * K;
        int64_t best = 0;
        for (int64_t k = 1; k < K; k++)
            if (l[k] > l[best])
                best = k;
        double se = 0.0;
        for (int64_t k = 0; k < K; k++)
            se += exp((double)l[k] - l[best]);
        sum += log(se) + l[best] - l[labels[b]];
        *hits += best == labels[b];
    }
    return sum;
}

/* Loss value, correct count, dlogits by finite differences, and padding:
 * rows [rows, B) must get a zero gradient and must not change the loss,
 * whatever their logits. */
static void check_xent(int64_t B, int64_t K, int64_t rows, uint64_t seed)
{
    xent_case c = { .B = B, .K = K, .rows = rows };
    env_init(&c.e, seed);
    env *e = &c.e;
    size_t n = (size_t)(B * K);
    c.logits = env_floats(e, n); // all (B, K)
    c.logp = env_floats(e, n);
    c.dlogits = env_floats(e, n);
    OK(st_arena_alloc(&e->arena, ST_MEM_ACTIVATIONS, (size_t)B * sizeof(int32_t),
                      (void **)&c.labels));
    fill_uniform(&e->rng, c.logits, n, -3.0f, 3.0f);
    for (int64_t b = 0; b < B; b++)
        c.labels[b] = (int32_t)st_rng_below(&e->rng, (uint32_t)K);
    /* Padding rows hold garbage: large logits that would dominate the loss
     * if they were counted. */
    for (size_t i = (size_t)(rows * K); i < n; i++)
        c.logits[i] = 40.0f * (2.0f * st_rng_uniform(&e->rng) - 1.0f);
    /* And dlogits holds garbage before the call: padding rows must be
     * written with zeros, not left as they were. */
    for (size_t i = 0; i < n; i++)
        c.dlogits[i] = 123.0f;

    OK(st_xent_build(&e->ctx, &c.x, B, K, c.logits, c.logp, c.dlogits));
    OK(st_nn_ctx_finalize(&e->ctx));
    double sum;
    int64_t hits;
    OK(st_xent_forward(&e->ctx, &c.x, c.labels, rows, 1, &sum, &hits));

    char tag[48], what[64];
    snprintf(tag, sizeof tag, "%lldx%lld rows %lld", (long long)B, (long long)K, (long long)rows);
    int64_t ref_hits;
    double ref = xent_reference(c.logits, c.labels, rows, K, &ref_hits);
    /* logp is float32 from oneDNN's log-softmax (polynomial exp and log):
     * a row's -logp[label] (~ 1 .. 5) came out within ~ 1e-6 of the double
     * value here, i.e. ~ 4 float ulps; the bound allows 1e-6 (1 + value)
     * per row, summed. */
    double loss_tol = 1e-6 * ((double)rows + ref);
    fprintf(stderr, "[ref] xent %-28s loss sum %.9f, reference %.9f, |diff| %.2e (tol %.0e)\n",
            tag, sum, ref, fabs(sum - ref), loss_tol);
    cr_expect(fabs(sum - ref) <= loss_tol, "xent %s: loss sum %.9f, reference %.9f", tag, sum, ref);
    cr_expect_eq(hits, ref_hits, "xent %s: %lld correct, reference %lld", tag,
                 (long long)hits, (long long)ref_hits);
    for (size_t i = (size_t)(rows * K); i < n; i++)
        cr_expect_eq(c.dlogits[i], 0.0f, "xent %s: padding dlogits[%zu] = %g", tag, i, c.dlogits[i]);
    /* Each real row of dlogits sums to 0 (softmax sums to 1, minus one-hot). */
    for (int64_t b = 0; b < rows; b++) {
        double s = 0;
        for (int64_t k = 0; k < K; k++)
            s += c.dlogits[b * K + k];
        cr_expect(fabs(s) <= 1e-6, "xent %s: dlogits row %lld sums to %g", tag, (long long)b, s);
    }

    /* Every logit, padding included: there fd must come out exactly 0. */
    float *grad = malloc(n * sizeof *grad);
    cr_assert(grad);
    memcpy(grad, c.dlogits, n * sizeof *grad);
    snprintf(what, sizeof what, "xent %s dlogits", tag);
    check_param(what, xent_objective, &c, c.logits, grad, n, SIZE_MAX, TOL_XENT, &e->rng);
    free(grad);

    /* Other garbage in the padding: the loss is bitwise the same. */
    for (size_t i = (size_t)(rows * K); i < n; i++)
        c.logits[i] = -c.logits[i] * 1.5f;
    for (int64_t b = rows; b < B; b++)
        c.labels[b] = (int32_t)((c.labels[b] + 1) % K);
    double sum2;
    int64_t hits2;
    OK(st_xent_forward(&e->ctx, &c.x, c.labels, rows, 1, &sum2, &hits2));
    cr_expect_eq(sum2, sum, "xent %s: padding changed the loss: %.17g vs %.17g", tag, sum2, sum);
    cr_expect_eq(hits2, hits);

    /* The same real rows alone in a batch of exactly `rows`: same loss (up to
     * the rounding of a possibly different kernel) and same hits. */
    if (rows < B) {
        xent_case d = { .B = rows, .K = K, .rows = rows };
        env_init(&d.e, seed);
        size_t m = (size_t)(rows * K);
        d.logits = env_floats(&d.e, m);
        d.logp = env_floats(&d.e, m);
        d.dlogits = env_floats(&d.e, m);
        memcpy(d.logits, c.logits, m * sizeof *d.logits);
        OK(st_xent_build(&d.e.ctx, &d.x, rows, K, d.logits, d.logp, d.dlogits));
        OK(st_nn_ctx_finalize(&d.e.ctx));
        double sum3;
        int64_t hits3;
        OK(st_xent_forward(&d.e.ctx, &d.x, c.labels, rows, 1, &sum3, &hits3));
        cr_expect(fabs(sum3 - sum) <= loss_tol, "xent %s: alone the rows give %.9f, padded %.9f",
                  tag, sum3, sum);
        cr_expect_eq(hits3, hits);
        for (size_t i = 0; i < m; i++)
            cr_expect(fabs(d.dlogits[i] - c.dlogits[i]) <= 1e-7, "xent %s: dlogits[%zu] %g vs %g",
                      tag, i, d.dlogits[i], c.dlogits[i]);
        env_destroy(&d.e);
    }
    env_destroy(e);
}

Test(xent, full_batch)
{
    omp_set_num_threads(1);
    check_xent(6, 5, 6, 51);
    check_xent(8, 11, 8, 52);
}

Test(xent, padded_batch)
{
    omp_set_num_threads(1);
    check_xent(7, 5, 5, 53);
    check_xent(16, 10, 3, 54);
}

Test(xent, rejects_bad_label)
{
    omp_set_num_threads(1);
    env e;
    env_init(&e, 55);
    float *logits = env_floats(&e, 3 * 4), *logp = env_floats(&e, 3 * 4), *dl = env_floats(&e, 3 * 4);
    int32_t labels[3] = { 0, 4, 1 }; /* 4 is outside [0, 4) */
    st_xent x;
    OK(st_xent_build(&e.ctx, &x, 3, 4, logits, logp, dl));
    OK(st_nn_ctx_finalize(&e.ctx));
    double sum;
    st_clear_error();
    cr_expect_eq(st_xent_forward(&e.ctx, &x, labels, 3, 1, &sum, NULL), ST_ERR_INVALID);
    cr_expect_neq(st_last_error()[0], '\0');
    /* The bad label sits in a padding row when rows = 1: it is not read. */
    OK(st_xent_forward(&e.ctx, &x, labels, 1, 1, &sum, NULL));
    env_destroy(&e);
}

/* ------------------------------------------------------------ convolution */

/* L = sum(y R) is linear in each of x, w and b, so, as for the linear
 * layer, the central difference has no truncation error and what is left is
 * float32 rounding of the outputs a perturbation reaches: at most OC KH KW
 * of them for an input, B OH OW for a weight (<= 200 here on the shapes
 * checked at every coordinate, <= 800 on the larger ones), each a sum of
 * IC KH KW <= 300 products of O(1) values rounded to ~ 1e-6, so L moves by
 * ~ 1e-5 by rounding in the worst case and ~ 1e-6 typically; / 2h = 0.02
 * that is <= 5e-4, under atol 1e-3.  rtol 1e-2 is for the large weight and
 * bias gradients (sums of B OH OW terms of R). */
static const tol TOL_CONV = { 1e-2, 1e-3, 1e-2 };

typedef struct conv_case {
    env e;
    st_conv c;
    st_conv_shape s;
    int64_t oh, ow;
    size_t nx, ny, nw;
    int bias, with_dx;
    int bf16;        /* the passes read bf16 copies of x, w and dy */
    float scale;     /* 1: none; else y = scale (conv(x) + b), gradients scaled alike */
    float *x, *y, *w, *b, *dx, *dy, *dw, *db, *R;
} conv_case;

static double conv_objective(void *arg)
{
    conv_case *c = arg;
    OK(st_conv_forward(&c->e.ctx, &c->c));
    return dot_yr(c->y, c->R, c->ny);
}

static const char *layout_name(st_layout l)
{
    return l == ST_LAYOUT_PLAIN ? "plain" : l == ST_LAYOUT_BLOCKED ? "blocked" : "default";
}

/* Buffers with random x, w (init scale 1/sqrt(fan in)), b and R, the
 * layer built (products in bf16, a branch scale), forward run, dy = R,
 * backward run. */
static void conv_setup_as(conv_case *c, const st_conv_shape *s, st_layout layout, int bias,
                          int with_dx, int bf16, float scale, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    c->s = *s;
    c->bias = bias;
    c->with_dx = with_dx;
    c->bf16 = bf16;
    c->scale = scale;
    c->oh = st_conv_out_size(s->ih, s->kh, s->stride, s->pad);
    c->ow = st_conv_out_size(s->iw, s->kw, s->stride, s->pad);
    c->nx = (size_t)(s->batch * s->ic * s->ih * s->iw);
    c->ny = (size_t)(s->batch * s->oc * c->oh * c->ow);
    c->nw = (size_t)(s->oc * s->ic * s->kh * s->kw);
    env_init(&c->e, seed);
    env *e = &c->e;
    c->x = env_floats(e, c->nx);   // x, dx are (B, IC, IH, IW)
    c->dx = env_floats(e, c->nx);
    c->y = env_floats(e, c->ny);   // y, dy, R are (B, OC, OH, OW)
    c->dy = env_floats(e, c->ny);
    c->R = env_floats(e, c->ny);
    c->w = env_floats(e, c->nw);   // w, dw are (OC, IC, KH, KW)
    c->dw = env_floats(e, c->nw);
    c->b = env_floats(e, (size_t)s->oc);  // b, db are (OC)
    c->db = env_floats(e, (size_t)s->oc);
    fill_uniform(&e->rng, c->x, c->nx, -1.0f, 1.0f);
    float bound = 1.0f / sqrtf((float)(s->ic * s->kh * s->kw));
    fill_uniform(&e->rng, c->w, c->nw, -bound, bound);
    if (bias)
        fill_uniform(&e->rng, c->b, (size_t)s->oc, -bound, bound);
    fill_uniform(&e->rng, c->R, c->ny, -1.0f, 1.0f);
    st_conv_io io = { .x = c->x, .y = c->y, .w = c->w, .b = bias ? c->b : NULL,
                      .dx = with_dx ? c->dx : NULL, .dy = c->dy, .dw = c->dw,
                      .db = bias ? c->db : NULL, .layout = layout, .bf16 = bf16,
                      .scale = scale == 1.0f ? 0.0f : scale };
    OK(st_conv_build(&e->ctx, &c->c, s, &io));
    OK(st_nn_ctx_finalize(&e->ctx));
    OK(st_conv_forward(&e->ctx, &c->c));
    memcpy(c->dy, c->R, c->ny * sizeof *c->dy);
    OK(st_conv_backward(&e->ctx, &c->c));
}

static void conv_setup(conv_case *c, const st_conv_shape *s, st_layout layout, int bias,
                       int with_dx, uint64_t seed)
{
    conv_setup_as(c, s, layout, bias, with_dx, 0, 1.0f, seed);
}

/* y, dx, dw, db in double by direct loops over every (output, input,
 * kernel tap) triple, with the magnitudes of the terms (the rounding scale).
 * With `rounded`, x, w and dy as a bf16 pass reads them (bf16_round, below):
 * db too, which oneDNN's backward-weights sums from its bf16 dy. */
typedef struct conv_ref {
    double *y, *ym, *dx, *dxm, *dw, *dwm, *db, *dbm;
} conv_ref;

static void conv_reference_of(const conv_case *c, conv_ref *r, int rounded)
{
    const st_conv_shape *s = &c->s;
    const int64_t IC = s->ic, OC = s->oc, IH = s->ih, IW = s->iw, OH = c->oh, OW = c->ow;
    r->y = dalloc(c->ny); r->ym = dalloc(c->ny);
    r->dx = dalloc(c->nx); r->dxm = dalloc(c->nx);
    r->dw = dalloc(c->nw); r->dwm = dalloc(c->nw);
    r->db = dalloc((size_t)OC); r->dbm = dalloc((size_t)OC);
    for (int64_t n = 0; n < s->batch; n++)
        for (int64_t o = 0; o < OC; o++)
            for (int64_t i = 0; i < OH; i++)
                for (int64_t j = 0; j < OW; j++) {
                    const size_t yi = (size_t)(((n * OC + o) * OH + i) * OW + j);
                    const double g = bf16_round(c->dy[yi], rounded);
                    double sum = c->bias ? c->b[o] : 0.0, mag = fabs(sum);
                    for (int64_t ci = 0; ci < IC; ci++)
                        for (int64_t p = 0; p < s->kh; p++)
                            for (int64_t q = 0; q < s->kw; q++) {
                                const int64_t h = i * s->stride - s->pad + p;
                                const int64_t wq = j * s->stride - s->pad + q;
                                if (h < 0 || h >= IH || wq < 0 || wq >= IW)
                                    continue;
                                const size_t xi = (size_t)(((n * IC + ci) * IH + h) * IW + wq);
                                const size_t wi = (size_t)(((o * IC + ci) * s->kh + p) * s->kw + q);
                                const double xv = bf16_round(c->x[xi], rounded);
                                const double wv = bf16_round(c->w[wi], rounded);
                                const double t = xv * wv;
                                sum += t;
                                mag += fabs(t);
                                r->dx[xi] += g * wv;
                                r->dxm[xi] += fabs(g * wv);
                                r->dw[wi] += g * xv;
                                r->dwm[wi] += fabs(g * xv);
                            }
                    r->y[yi] = sum;
                    r->ym[yi] = mag;
                    r->db[o] += g;
                    r->dbm[o] += fabs(g);
                }
    /* a branch scale (the bias scaled too): every result times it */
    const double k = c->scale == 0.0f ? 1.0 : c->scale;
    double *all[8] = { r->y, r->ym, r->dx, r->dxm, r->dw, r->dwm, r->db, r->dbm };
    const size_t len[8] = { c->ny, c->ny, c->nx, c->nx, c->nw, c->nw, (size_t)OC, (size_t)OC };
    for (int v = 0; v < 8 && k != 1.0; v++)
        for (size_t i = 0; i < len[v]; i++)
            all[v][i] *= v % 2 ? fabs(k) : k;   /* a magnitude: |k| */
}

static void conv_reference(const conv_case *c, conv_ref *r)
{
    conv_reference_of(c, r, c->bf16);
}

static void conv_ref_free(conv_ref *r)
{
    free(r->y); free(r->ym); free(r->dx); free(r->dxm);
    free(r->dw); free(r->dwm); free(r->db); free(r->dbm);
}

static void conv_tag(char *tag, size_t n, const conv_case *c)
{
    const st_conv_shape *s = &c->s;
    snprintf(tag, n, "%lldx%lldx%lldx%lld->%lld k%lldx%lld s%lld p%lld %s%s%s%s%s",
             (long long)s->batch, (long long)s->ic, (long long)s->ih, (long long)s->iw,
             (long long)s->oc, (long long)s->kh, (long long)s->kw, (long long)s->stride,
             (long long)s->pad, layout_name(c->c.layout), c->bias ? "" : " nobias",
             c->with_dx ? "" : " nodx", c->bf16 ? " bf16" : "",
             c->scale != 1.0f ? " scaled" : "");
}

/* Forward and backward against the double reference; then, when
 * max_coords > 0, finite differences w.r.t. x, w and b. */
static void check_conv(const st_conv_shape *s, st_layout layout, int bias, int with_dx,
                       size_t max_coords, uint64_t seed)
{
    conv_case c;
    conv_setup(&c, s, layout, bias, with_dx, seed);
    cr_expect(c.c.layout == ST_LAYOUT_PLAIN || c.c.layout == ST_LAYOUT_BLOCKED);
    if (layout != ST_LAYOUT_DEFAULT)
        cr_expect_eq(c.c.layout, layout);
    char tag[96], what[128];
    conv_tag(tag, sizeof tag, &c);
    conv_ref r;
    conv_reference(&c, &r);
    snprintf(what, sizeof what, "conv %s y", tag);
    compare_ref(what, c.y, r.y, r.ym, c.ny, REF_RTOL);
    if (with_dx) {
        snprintf(what, sizeof what, "conv %s dx", tag);
        compare_ref(what, c.dx, r.dx, r.dxm, c.nx, REF_RTOL);
    } else {
        for (size_t i = 0; i < c.nx; i++)
            cr_expect_eq(c.dx[i], 0.0f, "conv %s: dx[%zu] written without dx", tag, i);
    }
    snprintf(what, sizeof what, "conv %s dw", tag);
    compare_ref(what, c.dw, r.dw, r.dwm, c.nw, REF_RTOL);
    if (bias) {
        snprintf(what, sizeof what, "conv %s db", tag);
        compare_ref(what, c.db, r.db, r.dbm, (size_t)s->oc, REF_RTOL);
    }
    conv_ref_free(&r);
    if (max_coords > 0) {
        /* the objective does not touch the gradients: copies are taken */
        if (with_dx) {
            snprintf(what, sizeof what, "conv %s dx", tag);
            check_param(what, conv_objective, &c, c.x, c.dx, c.nx, max_coords, TOL_CONV, &c.e.rng);
        }
        snprintf(what, sizeof what, "conv %s dw", tag);
        check_param(what, conv_objective, &c, c.w, c.dw, c.nw, max_coords, TOL_CONV, &c.e.rng);
        if (bias) {
            snprintf(what, sizeof what, "conv %s db", tag);
            check_param(what, conv_objective, &c, c.b, c.db, (size_t)s->oc, max_coords,
                        TOL_CONV, &c.e.rng);
        }
    }
    env_destroy(&c.e);
}

/* shapes: { batch, ic, ih, iw, oc, kh, kw, stride, pad } */
static const st_conv_shape CONV_3X3_S1 = { 2, 3, 6, 7, 5, 3, 3, 1, 1 };
static const st_conv_shape CONV_3X3_S2 = { 2, 4, 7, 8, 6, 3, 3, 2, 1 };  /* 7x8 -> 4x4 */
static const st_conv_shape CONV_1X1_S2 = { 3, 5, 6, 5, 7, 1, 1, 2, 0 };  /* 6x5 -> 3x3 */

Test(conv, k3_s1_p1_bias_every_coordinate)
{
    omp_set_num_threads(1);
    check_conv(&CONV_3X3_S1, ST_LAYOUT_BLOCKED, 1, 1, SIZE_MAX, 61);
    check_conv(&CONV_3X3_S1, ST_LAYOUT_PLAIN, 1, 1, SIZE_MAX, 62);
}

Test(conv, k3_s2_p1_every_coordinate)
{
    omp_set_num_threads(1);
    check_conv(&CONV_3X3_S2, ST_LAYOUT_BLOCKED, 1, 1, SIZE_MAX, 63);
    check_conv(&CONV_3X3_S2, ST_LAYOUT_PLAIN, 1, 1, SIZE_MAX, 64);
}

Test(conv, k1_s2_projection_every_coordinate)
{
    omp_set_num_threads(1);
    check_conv(&CONV_1X1_S2, ST_LAYOUT_BLOCKED, 1, 1, SIZE_MAX, 65);
    check_conv(&CONV_1X1_S2, ST_LAYOUT_PLAIN, 1, 1, SIZE_MAX, 66);
}

/* Channel counts at and around oneDNN's block of 16 (its tail code), an
 * even input with stride 2 (the last row and column in no window of a 1x1
 * kernel), no padding, and the default layout; forward and backward
 * against the reference, finite differences on a random subset. */
Test(conv, larger_shapes_reference_and_random_subset)
{
    omp_set_num_threads(1);
    const st_conv_shape shapes[] = {
        { 4, 16, 10, 10, 16, 3, 3, 1, 1 },
        { 2, 17, 9, 9, 33, 3, 3, 2, 1 },
        { 2, 32, 8, 8, 64, 1, 1, 2, 0 },
        { 2, 3, 5, 6, 4, 3, 3, 1, 0 },
        { 2, 16, 8, 8, 32, 3, 3, 2, 1 },
    };
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        check_conv(&shapes[k], ST_LAYOUT_DEFAULT, 1, 1, LARGE_SUBSET, 70 + k);
        check_conv(&shapes[k], ST_LAYOUT_PLAIN, 1, 1, 0, 80 + k);
    }
}

/* A first layer (no dx: dx is left alone) and a convolution without bias
 * (ResNet's, followed by batch norm), in both layouts. */
Test(conv, without_dx_and_without_bias)
{
    omp_set_num_threads(1);
    for (int l = 0; l < 2; l++) {
        st_layout layout = l ? ST_LAYOUT_BLOCKED : ST_LAYOUT_PLAIN;
        check_conv(&CONV_3X3_S1, layout, 1, 0, SIZE_MAX, 91);
        check_conv(&CONV_3X3_S2, layout, 0, 1, SIZE_MAX, 92);
        const st_conv_shape stem = { 3, 1, 8, 8, 16, 3, 3, 1, 1 };
        check_conv(&stem, layout, 0, 0, 0, 93);
    }
}

/* The blocked path computes what the plain path computes, up to float
 * rounding (the kernels sum in different orders): |blocked - plain| <=
 * 2 REF_RTOL x the magnitude of the terms, on shapes where the blocked
 * path really reorders (checked: reorders were made). */
Test(conv, blocked_equals_plain)
{
    omp_set_num_threads(1);
    const st_conv_shape shapes[] = {
        { 4, 16, 10, 10, 16, 3, 3, 1, 1 },
        { 2, 17, 9, 9, 33, 3, 3, 2, 1 },
        { 2, 32, 8, 8, 64, 1, 1, 2, 0 },
        CONV_3X3_S2,
    };
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        conv_case p, b;
        conv_setup(&p, &shapes[k], ST_LAYOUT_PLAIN, 1, 1, 100 + k);
        conv_setup(&b, &shapes[k], ST_LAYOUT_BLOCKED, 1, 1, 100 + k);
        cr_assert_eq(st_pass_reorders(&p.c.fwd) + st_pass_reorders(&p.c.bwd_data) +
                     st_pass_reorders(&p.c.bwd_weights), 0, "the plain path reorders");
        cr_assert(b.c.fwd.n_pre > 0 && b.c.fwd.has_post && b.c.bwd_weights.has_post,
                  "shape %zu: the blocked path made no reorders: nothing is compared", k);
        char tag[96], what[128];
        conv_tag(tag, sizeof tag, &p);
        conv_ref r;
        conv_reference(&p, &r);   /* for the magnitudes */
        snprintf(what, sizeof what, "conv blocked vs %s y", tag);
        compare_floats(what, b.y, p.y, r.ym, p.ny, 2 * REF_RTOL);
        snprintf(what, sizeof what, "conv blocked vs %s dx", tag);
        compare_floats(what, b.dx, p.dx, r.dxm, p.nx, 2 * REF_RTOL);
        snprintf(what, sizeof what, "conv blocked vs %s dw", tag);
        compare_floats(what, b.dw, p.dw, r.dwm, p.nw, 2 * REF_RTOL);
        snprintf(what, sizeof what, "conv blocked vs %s db", tag);
        compare_floats(what, b.db, p.db, r.dbm, (size_t)p.s.oc, 2 * REF_RTOL);
        conv_ref_free(&r);
        env_destroy(&p.e);
        env_destroy(&b.e);
    }
}

/* The data type of the memory a primitive reads or writes as `arg`, and
 * that memory object. */
static dnnl_data_type_t arg_type(const st_prim *p, int arg, dnnl_memory_t *mem)
{
    for (int i = 0; i < p->nargs; i++)
        if (p->args[i].arg == arg) {
            const dnnl_memory_desc_t *md;
            cr_assert_eq(dnnl_memory_get_memory_desc(p->args[i].memory, &md), dnnl_success);
            if (mem)
                *mem = p->args[i].memory;
            return md->data_type;
        }
    cr_assert_fail("%s: argument %d not bound", p->what, arg);
    return dnnl_data_type_undef;
}

/* The largest |got - unrounded| / (REF_RTOL mag): how far the fp32
 * results lie outside the tolerance the bf16 ones are held to. */
static double off_fp32(const float *got, const double *ref32, const double *mag, size_t n)
{
    double worst = 0.0;
    for (size_t i = 0; i < n; i++)
        worst = fmax(worst, fabs((double)got[i] - ref32[i]) / (REF_RTOL * mag[i] + 1e-30));
    return worst;
}

/* bf16: the three passes read x, w and dy rounded to bf16 (a product of
 * two bf16 values is exact in fp32, the sums are fp32), so against a
 * reference of rounded operands the tolerance stays fp32's; db is summed
 * by backward-weights from its bf16 dy.  Checked besides: the primitives
 * were created with bf16 operands and f32 results (oneDNN 2.6 takes
 * f32 dst, diff_src, diff_weights and diff_bias with bf16 inputs), the
 * rounding happened (the unrounded reference is far outside the
 * tolerance), and the backward reads x only through the forward's bf16
 * copy: x is overwritten with NaN between forward and backward (a model
 * reuses the buffer of a forward-only tensor, graph.c's assign_forward_only). */
static void check_conv_bf16(const st_conv_shape *s, st_layout layout, int bias, int with_dx,
                            float scale, uint64_t seed)
{
    conv_case c;
    conv_setup_as(&c, s, layout, bias, with_dx, 1, scale, seed);
    char tag[96], what[128];
    conv_tag(tag, sizeof tag, &c);
    const st_conv *v = &c.c;
    dnnl_memory_t x_fwd, x_bwd;
    cr_expect_eq(arg_type(&v->fwd.prim, DNNL_ARG_SRC, &x_fwd), dnnl_bf16, "%s fwd src", tag);
    cr_expect_eq(arg_type(&v->fwd.prim, DNNL_ARG_WEIGHTS, NULL), dnnl_bf16, "%s fwd wei", tag);
    cr_expect_eq(arg_type(&v->fwd.prim, DNNL_ARG_DST, NULL), dnnl_f32, "%s fwd dst", tag);
    if (bias)
        cr_expect_eq(arg_type(&v->fwd.prim, DNNL_ARG_BIAS, NULL), dnnl_f32, "%s bias", tag);
    if (with_dx) {
        cr_expect_eq(arg_type(&v->bwd_data.prim, DNNL_ARG_DIFF_DST, NULL), dnnl_bf16,
                     "%s bwd-data diff_dst", tag);
        cr_expect_eq(arg_type(&v->bwd_data.prim, DNNL_ARG_WEIGHTS, NULL), dnnl_bf16,
                     "%s bwd-data wei", tag);
        cr_expect_eq(arg_type(&v->bwd_data.prim, DNNL_ARG_DIFF_SRC, NULL), dnnl_f32,
                     "%s bwd-data diff_src", tag);
    }
    cr_expect_eq(arg_type(&v->bwd_weights.prim, DNNL_ARG_SRC, &x_bwd), dnnl_bf16,
                 "%s bwd-weights src", tag);
    cr_expect(x_bwd == x_fwd, "%s: backward-weights does not read the forward's bf16 x", tag);
    cr_expect_eq(arg_type(&v->bwd_weights.prim, DNNL_ARG_DIFF_DST, NULL), dnnl_bf16,
                 "%s bwd-weights diff_dst", tag);
    cr_expect_eq(arg_type(&v->bwd_weights.prim, DNNL_ARG_DIFF_WEIGHTS, NULL), dnnl_f32,
                 "%s bwd-weights diff_weights", tag);
    if (bias)
        cr_expect_eq(arg_type(&v->bwd_weights.prim, DNNL_ARG_DIFF_BIAS, NULL), dnnl_f32,
                     "%s bwd-weights diff_bias", tag);

    /* again, x poisoned once the forward has run */
    float *keep = malloc(c.nx * sizeof *keep);
    cr_assert(keep);
    memcpy(keep, c.x, c.nx * sizeof *keep);
    OK(st_conv_forward(&c.e.ctx, v));
    for (size_t i = 0; i < c.nx; i++)
        c.x[i] = NAN;
    OK(st_conv_backward(&c.e.ctx, v));
    memcpy(c.x, keep, c.nx * sizeof *keep);
    free(keep);

    conv_ref r, r32;
    conv_reference(&c, &r);
    conv_reference_of(&c, &r32, 0);
    snprintf(what, sizeof what, "conv %s y", tag);
    compare_ref(what, c.y, r.y, r.ym, c.ny, REF_RTOL);
    double off = off_fp32(c.y, r32.y, r.ym, c.ny);
    if (with_dx) {
        snprintf(what, sizeof what, "conv %s dx", tag);
        compare_ref(what, c.dx, r.dx, r.dxm, c.nx, REF_RTOL);
        off = fmin(off, off_fp32(c.dx, r32.dx, r.dxm, c.nx));
    }
    snprintf(what, sizeof what, "conv %s dw", tag);
    compare_ref(what, c.dw, r.dw, r.dwm, c.nw, REF_RTOL);
    off = fmin(off, off_fp32(c.dw, r32.dw, r.dwm, c.nw));
    if (bias) {
        snprintf(what, sizeof what, "conv %s db", tag);
        compare_ref(what, c.db, r.db, r.dbm, (size_t)s->oc, REF_RTOL);
    }
    /* every result is off fp32's by 10x the tolerance somewhere */
    fprintf(stderr, "[bf16] conv %s: the unrounded reference is off by >= %.0f tolerances\n",
            tag, off);
    cr_expect_gt(off, 10.0, "conv %s: bf16 results within %.3g tolerances of fp32: not "
                 "rounded?", tag, off);
    conv_ref_free(&r);
    conv_ref_free(&r32);
    env_destroy(&c.e);
}

/* Every stride, padding, kernel and channel count the fp32 tests take
 * (oneDNN's bf16 kernels block channels by 16 and pairs of 2: tails on
 * both), both layouts, with and without bias, dx and a branch scale. */
Test(conv, bf16_products_of_rounded_operands)
{
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 kernels on this CPU");
    omp_set_num_threads(1);
    const st_conv_shape stem = { 3, 1, 8, 8, 16, 3, 3, 1, 1 };
    const st_conv_shape shapes[] = {
        CONV_3X3_S1, CONV_3X3_S2, CONV_1X1_S2,
        { 2, 3, 5, 6, 4, 3, 3, 1, 0 },
        { 4, 16, 10, 10, 16, 3, 3, 1, 1 },
        { 2, 17, 9, 9, 33, 3, 3, 2, 1 },
        { 2, 32, 8, 8, 64, 1, 1, 2, 0 },
        { 2, 16, 8, 8, 32, 3, 3, 2, 1 },
    };
    for (int l = 0; l < 2; l++) {
        const st_layout layout = l ? ST_LAYOUT_BLOCKED : ST_LAYOUT_PLAIN;
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
            check_conv_bf16(&shapes[k], layout, k % 2 == 0, 1, 1.0f, 200 + k);
        check_conv_bf16(&stem, layout, 0, 0, 1.0f, 210);
        check_conv_bf16(&CONV_3X3_S2, layout, 1, 1, 2.0f, 211);
        check_conv_bf16(&shapes[5], layout, 1, 1, 0.5f, 212);
    }
}

/* Sizes and FLOPs: 2 per multiply-add, B OC OH OW IC KH KW per pass; the
 * passes a layer has (no dx: two). */
/* The branch scale of a convolution: y = s (conv(x) + b) with dx, dw, db
 * scaled, or with an unscaled bias y = s conv(x) + b and db the plain
 * sum; both layouts, against the same convolution unscaled (scaling by 2
 * is exact, so only the order of the bias addition may round). */
Test(conv, branch_scale_with_scaled_and_unscaled_bias)
{
    omp_set_num_threads(1);
    env e;
    env_init(&e, 171);
    const st_conv_shape s = { 2, 3, 5, 5, 4, 3, 3, 1, 1 };
    const size_t nx = 2 * 3 * 5 * 5, ny = 2 * 4 * 5 * 5, nw = 4 * 3 * 9, hw = 25;
    float *x = env_floats(&e, nx), *dy = env_floats(&e, ny), *w = env_floats(&e, nw);
    float *b = env_floats(&e, 4);
    fill_uniform(&e.rng, x, nx, -1, 1);
    fill_uniform(&e.rng, dy, ny, -1, 1);
    fill_uniform(&e.rng, w, nw, -0.3f, 0.3f);
    fill_uniform(&e.rng, b, 4, -1, 1);
    float *out[3][4];   /* plain, scaled bias, unscaled bias: y, dx, dw, db */
    st_conv c[3][2];
    for (int k = 0; k < 3; k++)
        for (int layout = 0; layout < 2; layout++) {
            float *y = env_floats(&e, ny), *dx = env_floats(&e, nx);
            float *dw = env_floats(&e, nw), *db = env_floats(&e, 4);
            st_conv_io io = { .x = x, .y = y, .w = w, .b = b, .dx = dx, .dy = dy, .dw = dw,
                              .db = db, .scale = k ? 2.0f : 0.0f, .unscaled_bias = k == 2,
                              .layout = layout ? ST_LAYOUT_BLOCKED : ST_LAYOUT_PLAIN };
            OK(st_conv_build(&e.ctx, &c[k][layout], &s, &io));
            if (layout == 0) {
                out[k][0] = y;
                out[k][1] = dx;
                out[k][2] = dw;
                out[k][3] = db;
            }
        }
    OK(st_nn_ctx_finalize(&e.ctx));
    for (int layout = 0; layout < 2; layout++) {
        for (int k = 0; k < 3; k++) {
            OK(st_conv_forward(&e.ctx, &c[k][layout]));
            OK(st_conv_backward(&e.ctx, &c[k][layout]));
        }
        double worst = 0.0;
        const size_t n[4] = { ny, nx, nw, 4 };
        for (int k = 1; k < 3; k++)
            for (int t = 0; t < 4; t++)
                for (size_t i = 0; i < n[t]; i++) {
                    double plain = out[0][t][i], want = 2.0 * plain;
                    if (k == 2 && t == 0)   /* 2 (conv + b) - b */
                        want -= b[(i / hw) % 4];
                    if (k == 2 && t == 3)
                        want = plain;
                    double d = fabs(out[k][t][i] - want) / (1.0 + fabs(want));
                    worst = d > worst ? d : worst;
                }
        fprintf(stderr, "[scale] conv x2 (%s), scaled and unscaled bias: max rel diff %.3g\n",
                layout ? "blocked" : "plain", worst);
        cr_expect_lt(worst, 1e-6, "scaled convolution (%s layout): %g",
                     layout ? "blocked" : "plain", worst);
        /* the blocked run writes its own buffers: compare it next round */
        for (int k = 0; k < 3 && layout == 0; k++) {
            out[k][0] = c[k][1].y;
            out[k][1] = c[k][1].dx;
            out[k][2] = c[k][1].dw;
            out[k][3] = c[k][1].db;
        }
    }
    cr_expect_eq(c[1][0].scale_loop + c[1][1].scale_loop + c[2][0].scale_loop +
                 c[2][1].scale_loop, 0,
                 "the scale is a post-op of both layouts' forward");
    env_destroy(&e);
}

Test(conv, flops_and_reference_timing)
{
    omp_set_num_threads(1);
    const st_conv_shape s = { 4, 6, 9, 8, 5, 3, 3, 2, 1 }; /* -> 5x4 */
    cr_expect_eq(st_conv_out_size(9, 3, 2, 1), 5);
    cr_expect_eq(st_conv_out_size(8, 3, 2, 1), 4);
    cr_expect_eq(st_conv_out_size(8, 1, 2, 0), 4);
    const double one = 2.0 * 4 * 5 * 5 * 4 * 6 * 3 * 3;
    cr_expect_eq(st_conv_pass_flops(&s), one);
    for (int with_dx = 0; with_dx < 2; with_dx++) {
        conv_case c;
        conv_setup(&c, &s, ST_LAYOUT_DEFAULT, 1, with_dx, 111);
        cr_expect_eq(c.c.oh, 5);
        cr_expect_eq(c.c.ow, 4);
        cr_expect_eq(st_conv_flops(&c.c), (with_dx ? 3.0 : 2.0) * one);
        env_destroy(&c.e);
    }
    /* The standalone timing runs (its numbers are not asserted). */
    st_conv_rates r;
    OK(st_conv_reference_gflops(&s, ST_LAYOUT_DEFAULT, 2, &r));
    cr_expect(r.layout == ST_LAYOUT_PLAIN || r.layout == ST_LAYOUT_BLOCKED);
    cr_expect(r.fwd > 0 && r.bwd_data > 0 && r.bwd_weights > 0 && r.layer_fwd > 0 &&
              r.layer_bwd > 0 && r.layer_ms > 0);
}

Test(conv, rejects_bad_shapes)
{
    omp_set_num_threads(1);
    env e;
    env_init(&e, 112);
    float *buf = env_floats(&e, 4096);
    st_conv c;
    st_conv_io io = { .x = buf, .y = buf, .w = buf };
    const st_conv_shape bad[] = {
        { 0, 3, 8, 8, 4, 3, 3, 1, 1 },  /* no batch */
        { 2, 3, 8, 8, 4, 3, 3, 0, 1 },  /* stride 0 */
        { 2, 3, 8, 8, 4, 3, 3, 1, 3 },  /* padding >= kernel */
        { 2, 3, 1, 1, 4, 5, 5, 1, 1 },  /* kernel larger than the padded input */
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        st_clear_error();
        cr_expect_eq(st_conv_build(&e.ctx, &c, &bad[k], &io), ST_ERR_INVALID, "shape %zu", k);
        cr_expect_neq(st_last_error()[0], '\0');
    }
    io.dw = buf; /* dw without dy */
    cr_expect_eq(st_conv_build(&e.ctx, &c, &CONV_3X3_S1, &io), ST_ERR_INVALID);
    env_destroy(&e);
}

/* ------------------------------------------------------------ pooling */

/* Max pooling: L = sum(y R) is piecewise linear in x.  The inputs are a
 * random permutation of distinct values 0.05 apart, so a perturbation of
 * h = 1e-2 never changes which input is a window's maximum: the central
 * difference is exact up to the rounding of L (y is x, exactly).  Global
 * average pooling is linear.  Same bounds as linear layers. */
static const tol TOL_POOL = { 1e-2, 1e-3, 1e-2 };

/* Global average pooling, x ~ U(-1, 1): dx = dy / (H W) is small (0.02 at
 * 7 x 7), so atol is 1e-4, still ~ 10x what rounding leaves: a
 * perturbation moves one output, a mean of H W values rounded to ~ 6e-8,
 * ~ 3e-6 after / 2h. */
static const tol TOL_GAP = { 1e-2, 1e-4, 1e-2 };

typedef struct pool_case {
    env e;
    st_pool p;
    int64_t B, C, H, W, k, stride, pad; /* k = 0: global average */
    size_t nx, ny;
    float *x, *y, *dx, *dy, *R;
} pool_case;

static double pool_objective(void *arg)
{
    pool_case *c = arg;
    OK(st_pool_forward(&c->e.ctx, &c->p));
    return dot_yr(c->y, c->R, c->ny);
}

static void pool_setup(pool_case *c, int64_t B, int64_t C, int64_t H, int64_t W, int64_t k,
                       int64_t stride, int64_t pad, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    c->B = B; c->C = C; c->H = H; c->W = W; c->k = k; c->stride = stride; c->pad = pad;
    env_init(&c->e, seed);
    env *e = &c->e;
    int64_t oh = k ? (H + 2 * pad - k) / stride + 1 : 1;
    int64_t ow = k ? (W + 2 * pad - k) / stride + 1 : 1;
    c->nx = (size_t)(B * C * H * W);
    c->ny = (size_t)(B * C * oh * ow);
    c->x = env_floats(e, c->nx);   // x, dx are (B, C, H, W)
    c->dx = env_floats(e, c->nx);
    c->y = env_floats(e, c->ny);   // y, dy, R are (B, C, OH, OW) or (B, C)
    c->dy = env_floats(e, c->ny);
    c->R = env_floats(e, c->ny);
    if (k) {
        uint32_t *perm = malloc(c->nx * sizeof *perm);
        cr_assert(perm);
        for (size_t i = 0; i < c->nx; i++)
            perm[i] = (uint32_t)i;
        st_rng_shuffle_u32(&e->rng, perm, c->nx);
        for (size_t i = 0; i < c->nx; i++)  /* distinct, 0.05 apart, around 0 */
            c->x[i] = 0.05f * ((float)perm[i] - 0.5f * (float)c->nx);
        free(perm);
    } else {
        fill_uniform(&e->rng, c->x, c->nx, -1.0f, 1.0f);
    }
    fill_uniform(&e->rng, c->R, c->ny, -1.0f, 1.0f);
    st_pool_io io = { .x = c->x, .y = c->y, .dx = c->dx, .dy = c->dy };
    if (k)
        OK(st_maxpool_build(&e->ctx, &c->p, B, C, H, W, k, stride, pad, &io));
    else
        OK(st_global_avgpool_build(&e->ctx, &c->p, B, C, H, W, &io));
    OK(st_nn_ctx_finalize(&e->ctx));
    cr_assert_eq(c->p.oh, oh);
    cr_assert_eq(c->p.ow, ow);
    OK(st_pool_forward(&e->ctx, &c->p));
    memcpy(c->dy, c->R, c->ny * sizeof *c->dy);
    OK(st_pool_backward(&e->ctx, &c->p));
}

/* Max pooling against direct loops: y is the window's maximum over real
 * inputs (exact), dx gets each window's dy at its maximum (a sum where
 * windows overlap). */
static void check_maxpool(int64_t B, int64_t C, int64_t H, int64_t W, int64_t k, int64_t stride,
                          int64_t pad, uint64_t seed)
{
    pool_case c;
    pool_setup(&c, B, C, H, W, k, stride, pad, seed);
    const int64_t OH = c.p.oh, OW = c.p.ow;
    double *dx = dalloc(c.nx), *dxm = dalloc(c.nx);
    for (int64_t n = 0; n < B * C; n++)
        for (int64_t i = 0; i < OH; i++)
            for (int64_t j = 0; j < OW; j++) {
                float best = -INFINITY;
                size_t at = 0;
                for (int64_t p = 0; p < k; p++)
                    for (int64_t q = 0; q < k; q++) {
                        int64_t h = i * stride - pad + p, w = j * stride - pad + q;
                        if (h < 0 || h >= H || w < 0 || w >= W)
                            continue;
                        size_t xi = (size_t)((n * H + h) * W + w);
                        if (c.x[xi] > best) {
                            best = c.x[xi];
                            at = xi;
                        }
                    }
                size_t yi = (size_t)((n * OH + i) * OW + j);
                cr_expect_eq(c.y[yi], best, "max pool y[%zu] = %g, want %g", yi, c.y[yi], best);
                dx[at] += c.dy[yi];
                dxm[at] += fabs(c.dy[yi]);
            }
    for (size_t i = 0; i < c.nx; i++)
        dxm[i] += 1e-30;
    char tag[64], what[96];
    snprintf(tag, sizeof tag, "%lldx%lldx%lldx%lld k%lld s%lld p%lld", (long long)B,
             (long long)C, (long long)H, (long long)W, (long long)k, (long long)stride,
             (long long)pad);
    fprintf(stderr, "[ref] max pool %s y: checked exactly\n", tag);
    snprintf(what, sizeof what, "max pool %s dx", tag);
    compare_ref(what, c.dx, dx, dxm, c.nx, REF_RTOL);
    free(dx);
    free(dxm);
    check_param(what, pool_objective, &c, c.x, c.dx, c.nx, SIZE_MAX, TOL_POOL, &c.e.rng);
    env_destroy(&c.e);
}

Test(pool, max_3x3_s2_p1)
{
    omp_set_num_threads(1);
    check_maxpool(2, 3, 7, 7, 3, 2, 1, 121);   /* 7x7 -> 4x4 */
    check_maxpool(2, 3, 8, 6, 3, 2, 1, 122);   /* 8x6 -> 4x3: the last row in one window */
    check_maxpool(2, 17, 9, 9, 3, 2, 1, 123);  /* a channel tail past 16 */
}

Test(pool, max_2x2_s2)
{
    omp_set_num_threads(1);
    check_maxpool(2, 3, 6, 6, 2, 2, 0, 124);   /* 6x6 -> 3x3 */
    check_maxpool(3, 2, 7, 5, 2, 2, 0, 125);   /* 7x5 -> 3x2: the last row and column in none */
}

/* Global average: y[n, c] = mean over the plane, dx = dy[n, c] / (H W). */
static void check_global_avgpool(int64_t B, int64_t C, int64_t H, int64_t W, uint64_t seed)
{
    pool_case c;
    pool_setup(&c, B, C, H, W, 0, 1, 0, seed);
    double *y = dalloc(c.ny), *ym = dalloc(c.ny), *dx = dalloc(c.nx), *dxm = dalloc(c.nx);
    const int64_t P = H * W;
    for (int64_t n = 0; n < B * C; n++) {
        for (int64_t i = 0; i < P; i++) {
            y[n] += c.x[n * P + i] / (double)P;
            ym[n] += fabs(c.x[n * P + i]) / (double)P;
            dx[n * P + i] = c.dy[n] / (double)P;
            dxm[n * P + i] = fabs(c.dy[n]) / (double)P;
        }
    }
    char tag[64], what[96];
    snprintf(tag, sizeof tag, "%lldx%lldx%lldx%lld", (long long)B, (long long)C, (long long)H,
             (long long)W);
    snprintf(what, sizeof what, "global avg pool %s y", tag);
    compare_ref(what, c.y, y, ym, c.ny, REF_RTOL);
    snprintf(what, sizeof what, "global avg pool %s dx", tag);
    compare_ref(what, c.dx, dx, dxm, c.nx, REF_RTOL);
    check_param(what, pool_objective, &c, c.x, c.dx, c.nx, LARGE_SUBSET, TOL_GAP, &c.e.rng);
    free(y); free(ym); free(dx); free(dxm);
    env_destroy(&c.e);
}

Test(pool, global_average)
{
    omp_set_num_threads(1);
    check_global_avgpool(3, 5, 4, 6, 131);
    check_global_avgpool(2, 16, 7, 7, 132);
    check_global_avgpool(4, 3, 1, 1, 133);
}

/* Forward only (no dx): no workspace kept for a backward, and the
 * backward does nothing. */
Test(pool, forward_only)
{
    omp_set_num_threads(1);
    env e;
    env_init(&e, 134);
    float *x = env_floats(&e, 2 * 3 * 6 * 6), *y = env_floats(&e, 2 * 3 * 3 * 3);
    fill_uniform(&e.rng, x, 2 * 3 * 6 * 6, -1, 1);
    st_pool p;
    st_pool_io io = { .x = x, .y = y };
    OK(st_maxpool_build(&e.ctx, &p, 2, 3, 6, 6, 2, 2, 0, &io));
    OK(st_nn_ctx_finalize(&e.ctx));
    OK(st_pool_forward(&e.ctx, &p));
    OK(st_pool_backward(&e.ctx, &p));
    for (int64_t n = 0; n < 6; n++)
        for (int64_t i = 0; i < 3; i++)
            for (int64_t j = 0; j < 3; j++) {
                const float *w = x + n * 36 + 2 * i * 6 + 2 * j;
                float m = fmaxf(fmaxf(w[0], w[1]), fmaxf(w[6], w[7]));
                cr_expect_eq(y[n * 9 + i * 3 + j], m);
            }
    st_clear_error();
    cr_expect_eq(st_maxpool_build(&e.ctx, &p, 2, 3, 6, 6, 2, 2, 2, &io), ST_ERR_INVALID,
                 "padding above half the kernel is refused");
    env_destroy(&e);
}

/* ------------------------------------------------------------ batch norm */

/* Batch norm (training): smooth, like layer norm, with the statistics over
 * a channel's N = B H W values instead of a row's C.  Truncation is
 * O(h^2 gamma / sigma^3) with sigma >= 0.3 by construction, <= 1e-4 at
 * h = 1e-2.  Rounding dominates: a perturbation of x moves all N outputs of
 * its channel, and the float mean and variance (offsets up to 2) shift
 * them coherently by ~ 1e-7, so L moves by ~ 1e-7 |sum of the channel's R|
 * ~ 1e-7 sqrt(N); / 2h that is ~ 1e-4 at N = 392, and the worst of 200
 * coordinates measured 5.3e-4 there (<= 1.7e-4 at N <= 150).  atol 2e-3
 * keeps a 4x margin; gradients are O(0.1 .. 20), so a 10% error is still
 * 5x or more above the bound (the teeth check proves it). */
static const tol TOL_BATCHNORM = { 1e-2, 2e-3, 1e-2 };

typedef struct bn_case {
    env e;
    st_batchnorm bn;
    int64_t B, C, H, W;
    int fuse;
    st_layout layout;
    size_t n;
    float *x, *y, *gamma, *beta, *mean, *var, *rmean, *rvar, *dx, *dy, *dgamma, *dbeta, *R;
} bn_case;

static double bn_objective(void *arg)
{
    bn_case *c = arg;
    OK(st_batchnorm_forward(&c->e.ctx, &c->bn, 1));
    return dot_yr(c->y, c->R, c->n);
}

/* Channel c of x is offset_c + scale_c u, u ~ U(-1, 1) with two entries
 * pinned at -1 and +1: a mean to remove and a spread sigma >= 0.3. */
static void bn_fill_x(st_rng *r, float *x, int64_t B, int64_t C, int64_t P)
{
    for (int64_t ch = 0; ch < C; ch++) {
        float off = -2.0f + 4.0f * st_rng_uniform(r);
        float scale = 0.5f + 1.5f * st_rng_uniform(r);
        for (int64_t b = 0; b < B; b++) {
            float *xc = x + (b * C + ch) * P;
            fill_uniform(r, xc, (size_t)P, -1.0f, 1.0f);
            if (b == 0) {
                xc[0] = -1.0f;
                xc[P > 1 ? 1 : 0] = 1.0f;
            }
            for (int64_t i = 0; i < P; i++)
                xc[i] = off + scale * xc[i];
        }
    }
}

static void bn_setup(bn_case *c, int64_t B, int64_t C, int64_t H, int64_t W, int fuse,
                     st_layout layout, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    c->B = B; c->C = C; c->H = H; c->W = W; c->fuse = fuse; c->layout = layout;
    c->n = (size_t)(B * C * H * W);
    env_init(&c->e, seed);
    env *e = &c->e;
    c->x = env_floats(e, c->n);  // x, y, dx, dy, R are (B, C, H, W)
    c->y = env_floats(e, c->n);
    c->dx = env_floats(e, c->n);
    c->dy = env_floats(e, c->n);
    c->R = env_floats(e, c->n);
    c->gamma = env_floats(e, (size_t)C);  // the rest are (C)
    c->beta = env_floats(e, (size_t)C);
    c->mean = env_floats(e, (size_t)C);
    c->var = env_floats(e, (size_t)C);
    c->rmean = env_floats(e, (size_t)C);
    c->rvar = env_floats(e, (size_t)C);
    c->dgamma = env_floats(e, (size_t)C);
    c->dbeta = env_floats(e, (size_t)C);
    bn_fill_x(&e->rng, c->x, B, C, H * W);
    fill_uniform(&e->rng, c->gamma, (size_t)C, 0.5f, 1.5f);
    fill_uniform(&e->rng, c->beta, (size_t)C, -0.5f, 0.5f);
    fill_uniform(&e->rng, c->rmean, (size_t)C, -1.0f, 1.0f);
    fill_uniform(&e->rng, c->rvar, (size_t)C, 0.5f, 2.0f);
    fill_uniform(&e->rng, c->R, c->n, -1.0f, 1.0f);
    st_batchnorm_io io = {
        .x = c->x, .y = c->y, .gamma = c->gamma, .beta = c->beta, .mean = c->mean,
        .var = c->var, .running_mean = c->rmean, .running_var = c->rvar, .dx = c->dx,
        .dy = c->dy, .dgamma = c->dgamma, .dbeta = c->dbeta, .fuse_relu = fuse,
        .layout = layout,
    };
    OK(st_batchnorm_build(&e->ctx, &c->bn, B, C, H, W, &io));
    OK(st_nn_ctx_finalize(&e->ctx));
    cr_assert(c->bn.layout == ST_LAYOUT_PLAIN || c->bn.layout == ST_LAYOUT_BLOCKED);
    if (layout != ST_LAYOUT_DEFAULT)
        cr_assert_eq(c->bn.layout, layout);
    /* the blocked path really reorders (the plain one does not) */
    cr_assert_eq(st_pass_reorders(&c->bn.fwd_train) > 0, c->bn.layout == ST_LAYOUT_BLOCKED);
}

static void bn_tag(char *tag, size_t n, const bn_case *c)
{
    snprintf(tag, n, "%lldx%lldx%lldx%lld %s%s", (long long)c->B, (long long)c->C,
             (long long)c->H, (long long)c->W, layout_name(c->bn.layout),
             c->fuse ? " +relu" : "");
}

/* Training forward (y, mean, var) and backward (dx, dgamma, dbeta) in
 * double, per channel over its N = B H W values:
 *   xhat = (x - mu) / s, s = sqrt(var + eps), z = gamma xhat + beta,
 *   y = z (fused: max(z, 0), and dy is cut where z <= 0: g = dy [z > 0]);
 *   dbeta = sum g, dgamma = sum g xhat,
 *   dx = gamma / s (g - dbeta / N - xhat dgamma / N).
 * Also the running update the forward made from rm0, rv0 (momentum 0.1,
 * unbiased variance). */
static void bn_reference(const bn_case *c, const float *rm0, const float *rv0)
{
    const int64_t B = c->B, C = c->C, P = c->H * c->W;
    const double N = (double)(B * P), eps = ST_BATCHNORM_EPS;
    double *y = dalloc(c->n), *ym = dalloc(c->n), *dx = dalloc(c->n), *dxm = dalloc(c->n);
    double *mu = dalloc((size_t)C), *var = dalloc((size_t)C), *sm = dalloc((size_t)C);
    double *vm = dalloc((size_t)C), *dg = dalloc((size_t)C), *dgm = dalloc((size_t)C);
    double *db = dalloc((size_t)C), *dbm = dalloc((size_t)C);
    double *rm = dalloc((size_t)C), *rmm = dalloc((size_t)C), *rv = dalloc((size_t)C);
    double *rvm = dalloc((size_t)C);
#define XAT(b, ch, i) ((b) * C * P + (ch) * P + (i))
    for (int64_t ch = 0; ch < C; ch++) {
        double m = 0, v = 0, sabs = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < P; i++) {
                m += c->x[XAT(b, ch, i)];
                sabs += fabs(c->x[XAT(b, ch, i)]);
            }
        m /= N;
        sabs /= N;
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < P; i++)
                v += (c->x[XAT(b, ch, i)] - m) * (c->x[XAT(b, ch, i)] - m);
        v /= N;
        mu[ch] = m;
        var[ch] = v;
        sm[ch] = sabs;
        vm[ch] = v + 0.1 * sabs * sabs; /* var's own rounding + the mean's */
        const double s = sqrt(v + eps), gam = c->gamma[ch];
        double sg = 0, sgx = 0, sgm = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < P; i++) {
                size_t k = (size_t)XAT(b, ch, i);
                double xh = (c->x[k] - m) / s, z = gam * xh + c->beta[ch];
                int on = !c->fuse || z > 0;
                y[k] = on ? z : 0.0;
                ym[k] = (fabs(c->x[k]) + sabs) / s * fabs(gam) + fabs(c->beta[ch]);
                double g = on ? c->dy[k] : 0.0;
                sg += g;
                sgx += g * xh;
                sgm += fabs(g) * (1 + fabs(xh));
                dgm[ch] += fabs(g * xh) + fabs(g) * sabs / s;
                dbm[ch] += fabs(g);
            }
        db[ch] = sg;
        dg[ch] = sgx;
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < P; i++) {
                size_t k = (size_t)XAT(b, ch, i);
                double xh = (c->x[k] - m) / s, z = gam * xh + c->beta[ch];
                double g = (!c->fuse || z > 0) ? c->dy[k] : 0.0;
                dx[k] = gam / s * (g - sg / N - xh * sgx / N);
                dxm[k] = fabs(gam) / s * (fabs(g) + sgm / N + fabs(g) * sabs / s);
            }
        rm[ch] = 0.9 * rm0[ch] + 0.1 * m;
        rmm[ch] = 0.9 * fabs(rm0[ch]) + 0.1 * sabs;
        rv[ch] = 0.9 * rv0[ch] + 0.1 * v * N / (N - 1);
        rvm[ch] = 0.9 * fabs(rv0[ch]) + 0.1 * vm[ch] * N / (N - 1);
    }
#undef XAT
    char tag[64], what[96];
    bn_tag(tag, sizeof tag, c);
    snprintf(what, sizeof what, "batchnorm %s y", tag);
    compare_ref(what, c->y, y, ym, c->n, REF_RTOL);
    snprintf(what, sizeof what, "batchnorm %s mean", tag);
    compare_ref(what, c->mean, mu, sm, (size_t)C, REF_RTOL);
    snprintf(what, sizeof what, "batchnorm %s var", tag);
    compare_ref(what, c->var, var, vm, (size_t)C, REF_RTOL);
    snprintf(what, sizeof what, "batchnorm %s running mean", tag);
    compare_ref(what, c->rmean, rm, rmm, (size_t)C, REF_RTOL);
    snprintf(what, sizeof what, "batchnorm %s running var", tag);
    compare_ref(what, c->rvar, rv, rvm, (size_t)C, REF_RTOL);
    snprintf(what, sizeof what, "batchnorm %s dx", tag);
    compare_ref(what, c->dx, dx, dxm, c->n, REF_RTOL);
    snprintf(what, sizeof what, "batchnorm %s dgamma", tag);
    compare_ref(what, c->dgamma, dg, dgm, (size_t)C, REF_RTOL);
    snprintf(what, sizeof what, "batchnorm %s dbeta", tag);
    compare_ref(what, c->dbeta, db, dbm, (size_t)C, REF_RTOL);
    free(y); free(ym); free(dx); free(dxm); free(mu); free(var); free(sm); free(vm);
    free(dg); free(dgm); free(db); free(dbm); free(rm); free(rmm); free(rv); free(rvm);
}

/* One training step against the reference (the running update included),
 * then, unfused, finite differences w.r.t. x, gamma and beta. */
static void check_batchnorm(int64_t B, int64_t C, int64_t H, int64_t W, int fuse,
                            st_layout layout, size_t max_coords, uint64_t seed)
{
    bn_case c;
    bn_setup(&c, B, C, H, W, fuse, layout, seed);
    float *rm0 = malloc((size_t)C * sizeof *rm0), *rv0 = malloc((size_t)C * sizeof *rv0);
    cr_assert(rm0 && rv0);
    memcpy(rm0, c.rmean, (size_t)C * sizeof *rm0);
    memcpy(rv0, c.rvar, (size_t)C * sizeof *rv0);
    OK(st_batchnorm_forward(&c.e.ctx, &c.bn, 1));
    memcpy(c.dy, c.R, c.n * sizeof *c.dy);
    OK(st_batchnorm_backward(&c.e.ctx, &c.bn));
    bn_reference(&c, rm0, rv0);
    free(rm0);
    free(rv0);
    if (!fuse && max_coords > 0) {
        char tag[64], what[96];
        bn_tag(tag, sizeof tag, &c);
        snprintf(what, sizeof what, "batchnorm %s dx", tag);
        check_param(what, bn_objective, &c, c.x, c.dx, c.n, max_coords, TOL_BATCHNORM, &c.e.rng);
        snprintf(what, sizeof what, "batchnorm %s dgamma", tag);
        check_param(what, bn_objective, &c, c.gamma, c.dgamma, (size_t)C, max_coords,
                    TOL_BATCHNORM, &c.e.rng);
        snprintf(what, sizeof what, "batchnorm %s dbeta", tag);
        check_param(what, bn_objective, &c, c.beta, c.dbeta, (size_t)C, max_coords,
                    TOL_BATCHNORM, &c.e.rng);
    }
    env_destroy(&c.e);
}

Test(batchnorm, training_small_every_coordinate)
{
    omp_set_num_threads(1);
    for (int l = 0; l < 2; l++) {
        st_layout layout = l ? ST_LAYOUT_BLOCKED : ST_LAYOUT_PLAIN;
        check_batchnorm(3, 4, 5, 5, 0, layout, SIZE_MAX, 141);
        check_batchnorm(2, 5, 3, 7, 0, layout, SIZE_MAX, 142);
        check_batchnorm(4, 3, 1, 1, 0, layout, SIZE_MAX, 143); /* after global pooling: N = B */
    }
}

Test(batchnorm, training_larger_random_subset)
{
    omp_set_num_threads(1);
    check_batchnorm(8, 16, 7, 7, 0, ST_LAYOUT_DEFAULT, LARGE_SUBSET, 144);
    check_batchnorm(4, 17, 6, 6, 0, ST_LAYOUT_DEFAULT, LARGE_SUBSET, 145);
    check_batchnorm(4, 17, 6, 6, 0, ST_LAYOUT_PLAIN, 0, 145);
    check_batchnorm(8, 16, 7, 7, 0, ST_LAYOUT_PLAIN, 0, 144);
}

/* With the ReLU fused: y = max(bn(x), 0), and dy cut where it was. */
Test(batchnorm, fused_relu_reference)
{
    omp_set_num_threads(1);
    for (int l = 0; l < 2; l++) {
        st_layout layout = l ? ST_LAYOUT_BLOCKED : ST_LAYOUT_PLAIN;
        check_batchnorm(3, 4, 5, 5, 1, layout, 0, 146);
        check_batchnorm(8, 17, 7, 7, 1, layout, 0, 147);
    }
}

/* Inference: y from the running statistics, which are left bitwise as
 * they were; then two training steps on different batches, the running
 * statistics following PyTorch's recurrence (checked step by step in
 * bn_reference), and inference again with the updated ones. */
static void check_bn_inference(const bn_case *c, const char *when)
{
    const int64_t C = c->C, P = c->H * c->W;
    double *y = dalloc(c->n), *ym = dalloc(c->n);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t ch = 0; ch < C; ch++) {
            double s = sqrt((double)c->rvar[ch] + ST_BATCHNORM_EPS);
            for (int64_t i = 0; i < P; i++) {
                size_t k = (size_t)((b * C + ch) * P + i);
                double z = c->gamma[ch] * ((double)c->x[k] - c->rmean[ch]) / s + c->beta[ch];
                y[k] = c->fuse && z < 0 ? 0.0 : z;
                ym[k] = fabs(c->gamma[ch]) * (fabs(c->x[k]) + fabs(c->rmean[ch])) / s +
                        fabs(c->beta[ch]);
            }
        }
    char tag[64], what[128];
    bn_tag(tag, sizeof tag, c);
    snprintf(what, sizeof what, "batchnorm %s inference %s", tag, when);
    compare_ref(what, c->y, y, ym, c->n, REF_RTOL);
    free(y);
    free(ym);
}

static void check_bn_modes(int64_t B, int64_t C, int64_t H, int64_t W, int fuse,
                           st_layout layout, uint64_t seed)
{
    bn_case c;
    bn_setup(&c, B, C, H, W, fuse, layout, seed);
    const size_t cb = (size_t)C * sizeof(float);
    float *rm0 = malloc(cb), *rv0 = malloc(cb);
    cr_assert(rm0 && rv0);
    memcpy(rm0, c.rmean, cb);
    memcpy(rv0, c.rvar, cb);
    OK(st_batchnorm_forward(&c.e.ctx, &c.bn, 0));
    cr_expect(!memcmp(rm0, c.rmean, cb) && !memcmp(rv0, c.rvar, cb),
              "an inference forward changed the running statistics");
    check_bn_inference(&c, "(initial statistics)");
    for (int step = 0; step < 2; step++) {
        if (step)
            bn_fill_x(&c.e.rng, c.x, B, C, H * W);  /* another batch */
        memcpy(rm0, c.rmean, cb);
        memcpy(rv0, c.rvar, cb);
        OK(st_batchnorm_forward(&c.e.ctx, &c.bn, 1));
        memcpy(c.dy, c.R, c.n * sizeof *c.dy);
        OK(st_batchnorm_backward(&c.e.ctx, &c.bn));
        bn_reference(&c, rm0, rv0);
    }
    memcpy(rm0, c.rmean, cb);
    memcpy(rv0, c.rvar, cb);
    OK(st_batchnorm_forward(&c.e.ctx, &c.bn, 0));
    cr_expect(!memcmp(rm0, c.rmean, cb) && !memcmp(rv0, c.rvar, cb));
    check_bn_inference(&c, "(after two steps)");
    free(rm0);
    free(rv0);
    env_destroy(&c.e);
}

Test(batchnorm, inference_and_running_statistics)
{
    omp_set_num_threads(1);
    for (int l = 0; l < 2; l++) {
        st_layout layout = l ? ST_LAYOUT_BLOCKED : ST_LAYOUT_PLAIN;
        check_bn_modes(3, 4, 5, 5, 0, layout, 151);
        check_bn_modes(2, 17, 6, 6, 1, layout, 152);
    }
}

Test(batchnorm, rejects_single_value_training)
{
    omp_set_num_threads(1);
    bn_case c;
    bn_setup(&c, 1, 3, 1, 1, 0, ST_LAYOUT_DEFAULT, 153);
    OK(st_batchnorm_forward(&c.e.ctx, &c.bn, 0));   /* inference is fine */
    st_clear_error();
    cr_expect_eq(st_batchnorm_forward(&c.e.ctx, &c.bn, 1), ST_ERR_INVALID);
    cr_expect_neq(st_last_error()[0], '\0');
    env_destroy(&c.e);
}

/* The blocked path (reorders around oneDNN's JIT kernels) computes what
 * the plain one does, up to rounding: training forward, backward, running
 * statistics and inference, fused or not. */
Test(batchnorm, blocked_equals_plain)
{
    omp_set_num_threads(1);
    const int64_t shapes[][4] = { { 4, 16, 7, 7 }, { 3, 17, 5, 6 }, { 2, 5, 3, 3 } };
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        for (int fuse = 0; fuse < 2; fuse++) {
            const int64_t *d = shapes[k];
            bn_case p, b;
            bn_setup(&p, d[0], d[1], d[2], d[3], fuse, ST_LAYOUT_PLAIN, 160 + k);
            bn_setup(&b, d[0], d[1], d[2], d[3], fuse, ST_LAYOUT_BLOCKED, 160 + k);
            const size_t C = (size_t)d[1];
            double *mag = dalloc(p.n), *cmag = dalloc(C), *nmag = dalloc(p.n);
            for (int mode = 0; mode < 2; mode++) {
                bn_case *cs[2] = { &p, &b };
                for (int i = 0; i < 2; i++) {
                    OK(st_batchnorm_forward(&cs[i]->e.ctx, &cs[i]->bn, mode == 0));
                    memcpy(cs[i]->dy, cs[i]->R, p.n * sizeof(float));
                    if (mode == 0)
                        OK(st_batchnorm_backward(&cs[i]->e.ctx, &cs[i]->bn));
                }
                /* |blocked - plain| <= 2e-5 (1 + |plain|): the outputs and
                 * statistics are O(1) here, rounded at ~ 1e-7 */
                for (size_t i = 0; i < p.n; i++) {
                    mag[i] = 1.0 + fabs(p.y[i]);
                    nmag[i] = 1.0 + fabs(p.dx[i]);
                }
                char tag[64], what[128];
                bn_tag(tag, sizeof tag, &p);
                snprintf(what, sizeof what, "batchnorm blocked vs %s %s y", tag,
                         mode ? "inference" : "training");
                compare_floats(what, b.y, p.y, mag, p.n, 2 * REF_RTOL);
                if (mode == 0) {
                    snprintf(what, sizeof what, "batchnorm blocked vs %s dx", tag);
                    compare_floats(what, b.dx, p.dx, nmag, p.n, 2 * REF_RTOL);
                    snprintf(what, sizeof what, "batchnorm blocked vs %s mean", tag);
                    for (size_t ch = 0; ch < C; ch++)
                        cmag[ch] = 1.0 + fabs(p.mean[ch]);
                    compare_floats(what, b.mean, p.mean, cmag, C, 2 * REF_RTOL);
                    snprintf(what, sizeof what, "batchnorm blocked vs %s var", tag);
                    for (size_t ch = 0; ch < C; ch++)
                        cmag[ch] = 1.0 + fabs(p.var[ch]);
                    compare_floats(what, b.var, p.var, cmag, C, 2 * REF_RTOL);
                    snprintf(what, sizeof what, "batchnorm blocked vs %s dgamma", tag);
                    for (size_t ch = 0; ch < C; ch++)
                        cmag[ch] = 1.0 + fabs(p.dgamma[ch]);
                    compare_floats(what, b.dgamma, p.dgamma, cmag, C, 2 * REF_RTOL);
                    snprintf(what, sizeof what, "batchnorm blocked vs %s dbeta", tag);
                    for (size_t ch = 0; ch < C; ch++)
                        cmag[ch] = 1.0 + fabs(p.dbeta[ch]);
                    compare_floats(what, b.dbeta, p.dbeta, cmag, C, 2 * REF_RTOL);
                    snprintf(what, sizeof what, "batchnorm blocked vs %s running var", tag);
                    for (size_t ch = 0; ch < C; ch++)
                        cmag[ch] = 1.0 + fabs(p.rvar[ch]);
                    compare_floats(what, b.rvar, p.rvar, cmag, C, 2 * REF_RTOL);
                }
            }
            free(mag);
            free(cmag);
            free(nmag);
            env_destroy(&p.e);
            env_destroy(&b.e);
        }
}

/* ------------------------------------------------------------ layers sharing a context */

/* A conv -> batch norm -> conv chain built in one context shares the
 * context's buffers for blocked copies that live within a pass (st_view's
 * slots); run forward through the chain and backward through it reversed,
 * every output must be bitwise what the same layer computes alone, in a
 * context of its own, from the same inputs (single-threaded oneDNN is
 * deterministic). */
typedef struct chain_bufs {
    float *x0, *y1, *y2, *y3, *dx0, *dy1, *dy2, *dy3;
    float *w1, *b1, *dw1, *db1, *w3, *dw3;
    float *gamma, *beta, *mean, *var, *rm, *rv, *dgamma, *dbeta;
} chain_bufs;

Test(cnn_layers, layers_sharing_a_context_equal_layers_alone)
{
    omp_set_num_threads(1);
    /* conv3 (s2 -> 5x5) has the largest blocked copies, built last: the
     * shared buffers must grow to them */
    const int64_t B = 3, C0 = 5, C1 = 16, C3 = 64, H = 9;
    const st_conv_shape s1 = { B, C0, H, H, C1, 3, 3, 1, 1 };
    const st_conv_shape s3 = { B, C1, H, H, C3, 3, 3, 2, 1 };
    const size_t n0 = (size_t)(B * C0 * H * H), n1 = (size_t)(B * C1 * H * H);
    const size_t n3 = (size_t)(B * C3 * 5 * 5), nw1 = (size_t)(C1 * C0 * 9);
    const size_t nw3 = (size_t)(C3 * C1 * 9);
    env e;
    env_init(&e, 171);
    chain_bufs c;
    float **all[] = { &c.x0, &c.y1, &c.y2, &c.y3, &c.dx0, &c.dy1, &c.dy2, &c.dy3, &c.w1,
                      &c.b1, &c.dw1, &c.db1, &c.w3, &c.dw3, &c.gamma, &c.beta, &c.mean,
                      &c.var, &c.rm, &c.rv, &c.dgamma, &c.dbeta };
    const size_t size[] = { n0, n1, n1, n3, n0, n1, n1, n3, nw1, (size_t)C1, nw1, (size_t)C1,
                            nw3, nw3, 16, 16, 16, 16, 16, 16, 16, 16 };
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
        *all[k] = env_floats(&e, size[k]);
    fill_uniform(&e.rng, c.x0, n0, -1, 1);
    fill_uniform(&e.rng, c.dy3, n3, -1, 1);
    fill_uniform(&e.rng, c.w1, nw1, -0.3f, 0.3f);
    fill_uniform(&e.rng, c.b1, (size_t)C1, -0.3f, 0.3f);
    fill_uniform(&e.rng, c.w3, nw3, -0.1f, 0.1f);
    fill_uniform(&e.rng, c.gamma, 16, 0.5f, 1.5f);
    fill_uniform(&e.rng, c.beta, 16, -0.5f, 0.5f);
    fill_uniform(&e.rng, c.rv, 16, 0.5f, 1.5f);

    st_conv conv1, conv3;
    st_batchnorm bn;
    st_conv_io io1 = { .x = c.x0, .y = c.y1, .w = c.w1, .b = c.b1, .dx = c.dx0, .dy = c.dy1,
                       .dw = c.dw1, .db = c.db1, .layout = ST_LAYOUT_BLOCKED };
    st_batchnorm_io bio = { .x = c.y1, .y = c.y2, .gamma = c.gamma, .beta = c.beta,
                            .mean = c.mean, .var = c.var, .running_mean = c.rm,
                            .running_var = c.rv, .dx = c.dy1, .dy = c.dy2, .dgamma = c.dgamma,
                            .dbeta = c.dbeta, .fuse_relu = 1, .layout = ST_LAYOUT_BLOCKED };
    st_conv_io io3 = { .x = c.y2, .y = c.y3, .w = c.w3, .dx = c.dy2, .dy = c.dy3, .dw = c.dw3,
                       .layout = ST_LAYOUT_BLOCKED };
    OK(st_conv_build(&e.ctx, &conv1, &s1, &io1));
    OK(st_batchnorm_build(&e.ctx, &bn, B, C1, H, H, &bio));
    OK(st_conv_build(&e.ctx, &conv3, &s3, &io3));
    OK(st_nn_ctx_finalize(&e.ctx));
    cr_assert(e.ctx.slot_bytes[ST_SLOT_OUT] > 0 && e.ctx.slot_bytes[ST_SLOT_IN] > 0,
              "the chain shares no slot: nothing is tested");
    /* every copy fits its slot, and has it as its buffer */
    for (int i = 0; i < e.ctx.n_slot_mems; i++) {
        const dnnl_memory_desc_t *md;
        void *h;
        const int k = e.ctx.slot_mems[i].slot;
        cr_assert_eq(dnnl_memory_get_memory_desc(e.ctx.slot_mems[i].mem, &md), dnnl_success);
        cr_assert_eq(dnnl_memory_get_data_handle(e.ctx.slot_mems[i].mem, &h), dnnl_success);
        cr_expect(dnnl_memory_desc_get_size(md) <= e.ctx.slot_have[k],
                  "copy %d (%zu bytes) does not fit slot %d (%zu bytes)", i,
                  dnnl_memory_desc_get_size(md), k, e.ctx.slot_have[k]);
        cr_expect(h == e.ctx.slot[k] && h != NULL, "copy %d is not in slot %d", i, k);
    }
    OK(st_conv_forward(&e.ctx, &conv1));
    OK(st_batchnorm_forward(&e.ctx, &bn, 1));
    OK(st_conv_forward(&e.ctx, &conv3));
    OK(st_conv_backward(&e.ctx, &conv3));
    OK(st_batchnorm_backward(&e.ctx, &bn));
    OK(st_conv_backward(&e.ctx, &conv1));

    /* Each layer alone, from copies of its inputs in the chain. */
    for (int layer = 0; layer < 3; layer++) {
        env a;
        env_init(&a, 172);
        chain_bufs d;
        for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) {
            float **dk = (float **)((char *)&d + ((char *)all[k] - (char *)&c));
            *dk = env_floats(&a, size[k]);
            memcpy(*dk, *all[k], size[k] * sizeof(float));
        }
        /* the alone layer's outputs start from garbage, not the chain's */
        float *outs[3][4] = { { d.y1, d.dx0, d.dw1, d.db1 }, { d.y2, d.dy1, d.dgamma, d.dbeta },
                              { d.y3, d.dy2, d.dw3, NULL } };
        const size_t on[3][4] = { { n1, n0, nw1, (size_t)C1 }, { n1, n1, 16, 16 },
                                  { n3, n1, nw3, 0 } };
        for (int k = 0; k < 4; k++)
            for (size_t i = 0; i < on[layer][k]; i++)
                outs[layer][k][i] = 7.0f;
        st_conv one;
        st_batchnorm bone;
        if (layer == 1) {   /* (its running statistics are not compared) */
            st_batchnorm_io b2 = bio;
            b2.x = d.y1; b2.y = d.y2; b2.gamma = d.gamma; b2.beta = d.beta; b2.mean = d.mean;
            b2.var = d.var; b2.running_mean = d.rm; b2.running_var = d.rv; b2.dx = d.dy1;
            b2.dy = d.dy2; b2.dgamma = d.dgamma; b2.dbeta = d.dbeta;
            OK(st_batchnorm_build(&a.ctx, &bone, B, C1, H, H, &b2));
        } else if (layer == 0) {
            st_conv_io i1 = { .x = d.x0, .y = d.y1, .w = d.w1, .b = d.b1, .dx = d.dx0,
                              .dy = d.dy1, .dw = d.dw1, .db = d.db1, .layout = ST_LAYOUT_BLOCKED };
            OK(st_conv_build(&a.ctx, &one, &s1, &i1));
        } else {
            st_conv_io i3 = { .x = d.y2, .y = d.y3, .w = d.w3, .dx = d.dy2, .dy = d.dy3,
                              .dw = d.dw3, .layout = ST_LAYOUT_BLOCKED };
            OK(st_conv_build(&a.ctx, &one, &s3, &i3));
        }
        OK(st_nn_ctx_finalize(&a.ctx));
        if (layer == 1) {
            OK(st_batchnorm_forward(&a.ctx, &bone, 1));
            OK(st_batchnorm_backward(&a.ctx, &bone));
        } else {
            OK(st_conv_forward(&a.ctx, &one));
            OK(st_conv_backward(&a.ctx, &one));
        }
        const float *chain[3][4] = { { c.y1, c.dx0, c.dw1, c.db1 },
                                     { c.y2, c.dy1, c.dgamma, c.dbeta },
                                     { c.y3, c.dy2, c.dw3, NULL } };
        static const char *names[3][4] = { { "conv1 y", "conv1 dx", "conv1 dw", "conv1 db" },
                                           { "bn y", "bn dx", "bn dgamma", "bn dbeta" },
                                           { "conv2 y", "conv2 dx", "conv2 dw", "" } };
        for (int k = 0; k < 4; k++) {
            if (!on[layer][k])
                continue;
            size_t bad = 0;
            for (size_t i = 0; i < on[layer][k]; i++)
                bad += memcmp(&chain[layer][k][i], &outs[layer][k][i], sizeof(float)) != 0;
            cr_expect_eq(bad, 0, "%s: %zu of %zu entries differ from the layer alone",
                         names[layer][k], bad, on[layer][k]);
            fprintf(stderr, "[chain] %-10s in a shared context vs alone: %zu of %zu differ\n",
                    names[layer][k], bad, on[layer][k]);
        }
        env_destroy(&a);
    }
    env_destroy(&e);
}

/* ------------------------------------------------------------ ReLU on activations */

/* The activation layer reads a (B, C, H, W) tensor as the (B, C H W)
 * matrix it is in memory: ReLU is elementwise, so that is all a CNN needs. */
Test(activation, relu_on_an_nchw_tensor)
{
    omp_set_num_threads(1);
    check_act(ST_ACT_RELU, 4, 16 * 7 * 7, LARGE_SUBSET, 27);
    check_act(ST_ACT_RELU, 3, 5 * 3 * 3, SIZE_MAX, 28);
}

/* ------------------------------------------------------------ hot path */

/* Counts heap calls on the armed thread (heapwatch.h interposes the malloc
 * family for the whole test program and forwards to the C library's);
 * calls made while oneDNN executes a primitive are counted apart: its C API
 * builds an argument map per execution, outside subtrain's control. */
#define HEAPWATCH_PER_THREAD
#include "heapwatch.h"

/* Every CNN layer, every pass, both layouts (convolutions in bf16 too,
 * where oneDNN has bf16 kernels): once built, a forward or
 * backward is primitive executions (and batch norm's running update) and
 * no heap call of subtrain's.  No Criterion call while armed (its
 * assertions may allocate). */
Test(cnn_layers, forward_and_backward_make_no_heap_call)
{
    HEAPWATCH_SKIP_IF_OFF();
    omp_set_num_threads(1);
    env e;
    env_init(&e, 161);
    const int64_t B = 4, C = 16, H = 8, W = 8;
    const size_t n = (size_t)(B * C * H * W);
    float *x = env_floats(&e, n), *y = env_floats(&e, n), *y2 = env_floats(&e, n);
    float *dx = env_floats(&e, n), *dy = env_floats(&e, n), *w = env_floats(&e, 16 * 16 * 9);
    float *b = env_floats(&e, 16), *dw = env_floats(&e, 16 * 16 * 9), *db = env_floats(&e, 16);
    float *pooled = env_floats(&e, n / 4), *dpooled = env_floats(&e, n / 4);
    float *g = env_floats(&e, (size_t)(B * C)), *dg = env_floats(&e, (size_t)(B * C));
    float *gamma = env_floats(&e, 16), *beta = env_floats(&e, 16), *mean = env_floats(&e, 16);
    float *var = env_floats(&e, 16), *rm = env_floats(&e, 16), *rv = env_floats(&e, 16);
    float *dgamma = env_floats(&e, 16), *dbeta = env_floats(&e, 16);
    fill_uniform(&e.rng, x, n, -1, 1);
    fill_uniform(&e.rng, dy, n, -1, 1);
    fill_uniform(&e.rng, w, 16 * 16 * 9, -0.1f, 0.1f);
    fill_uniform(&e.rng, gamma, 16, 0.5f, 1.5f);
    fill_uniform(&e.rng, rv, 16, 0.5f, 1.5f);
    fill_uniform(&e.rng, dpooled, n / 4, -1, 1);
    fill_uniform(&e.rng, dg, (size_t)(B * C), -1, 1);

    const st_conv_shape s = { B, C, H, W, C, 3, 3, 1, 1 };
    st_conv cb, cp, cfirst, cb16, cp16;
    st_conv_io io = { .x = x, .y = y, .w = w, .b = b, .dx = dx, .dy = dy, .dw = dw, .db = db,
                      .layout = ST_LAYOUT_BLOCKED };
    OK(st_conv_build(&e.ctx, &cb, &s, &io));
    io.layout = ST_LAYOUT_PLAIN;
    OK(st_conv_build(&e.ctx, &cp, &s, &io));
    /* bf16: the conversions are reorders made here too */
    const int bf16 = st_bf16_probe(NULL) != ST_BF16_UNAVAILABLE;
    io.bf16 = 1;
    if (bf16)
        OK(st_conv_build(&e.ctx, &cp16, &s, &io));
    io.layout = ST_LAYOUT_BLOCKED;
    if (bf16)
        OK(st_conv_build(&e.ctx, &cb16, &s, &io));
    io.bf16 = 0;
    io.layout = ST_LAYOUT_DEFAULT;
    io.dx = NULL;
    io.b = io.db = NULL;
    OK(st_conv_build(&e.ctx, &cfirst, &s, &io));
    st_pool mp, gap;
    st_pool_io pio = { .x = x, .y = pooled, .dx = dx, .dy = dpooled };
    OK(st_maxpool_build(&e.ctx, &mp, B, C, H, W, 3, 2, 1, &pio));
    st_pool_io gio = { .x = x, .y = g, .dx = dx, .dy = dg };
    OK(st_global_avgpool_build(&e.ctx, &gap, B, C, H, W, &gio));
    st_batchnorm bn, bnr, bnp;
    st_batchnorm_io bio = { .x = x, .y = y2, .gamma = gamma, .beta = beta, .mean = mean,
                            .var = var, .running_mean = rm, .running_var = rv, .dx = dx,
                            .dy = dy, .dgamma = dgamma, .dbeta = dbeta };
    OK(st_batchnorm_build(&e.ctx, &bn, B, C, H, W, &bio));
    bio.fuse_relu = 1;
    OK(st_batchnorm_build(&e.ctx, &bnr, B, C, H, W, &bio));
    bio.layout = ST_LAYOUT_PLAIN;
    OK(st_batchnorm_build(&e.ctx, &bnp, B, C, H, W, &bio));
    OK(st_nn_ctx_finalize(&e.ctx));

    st_status st = ST_OK;
    for (int round = 0; round < 4; round++) {
        armed = round >= 1; /* the first round lets oneDNN set up its per-thread state */
        const st_conv *convs[5] = { &cb, &cp, &cfirst, &cb16, &cp16 };
        for (int k = 0; k < (bf16 ? 5 : 3) && st == ST_OK; k++) {
            st = st_conv_forward(&e.ctx, convs[k]);
            if (st == ST_OK)
                st = st_conv_backward(&e.ctx, convs[k]);
        }
        const st_pool *pools[2] = { &mp, &gap };
        for (int k = 0; k < 2 && st == ST_OK; k++) {
            st = st_pool_forward(&e.ctx, pools[k]);
            if (st == ST_OK)
                st = st_pool_backward(&e.ctx, pools[k]);
        }
        const st_batchnorm *bns[3] = { &bn, &bnr, &bnp };
        for (int k = 0; k < 3 && st == ST_OK; k++) {
            st = st_batchnorm_forward(&e.ctx, bns[k], 1);
            if (st == ST_OK)
                st = st_batchnorm_backward(&e.ctx, bns[k]);
            if (st == ST_OK)
                st = st_batchnorm_forward(&e.ctx, bns[k], 0);
        }
        armed = 0;
    }
    cr_assert_eq(st, ST_OK, "%s", st_last_error());
    cr_assert_gt(executes, 0, "the interposer saw the primitives run");
    cr_expect_eq(own_calls, 0, "3 rounds of every CNN layer: subtrain called the heap %ld times",
                 own_calls);
    cr_log_info("oneDNN: %ld heap calls in %ld primitive executions", dnnl_calls, executes);
    cr_expect_leq(dnnl_calls, executes * (ST_PRIM_MAX_ARGS + 2),
                  "oneDNN allocated more than its argument maps explain");
    fprintf(stderr, "[heap] CNN layers, 3 rounds: subtrain %ld heap calls; oneDNN %ld in %ld "
            "executions\n", own_calls, dnnl_calls, executes);
    env_destroy(&e);
}

/* Attention, fp32 and bf16 (its reorders and the softmax backward loop):
 * once built, a forward and a backward make no heap call of subtrain's. */
Test(attention, forward_and_backward_make_no_heap_call)
{
    HEAPWATCH_SKIP_IF_OFF();
    omp_set_num_threads(1);
    const int with_bf16 = st_bf16_probe(NULL) != ST_BF16_UNAVAILABLE;
    attn_case c[2];
    for (int k = 0; k <= with_bf16; k++)
        attn_setup(&c[k], 2, 9, 2, 8, k, 171 + (uint64_t)k);
    st_status st = ST_OK;
    for (int round = 0; round < 4; round++) {
        armed = round >= 1; /* the first round lets oneDNN set up its per-thread state */
        for (int k = 0; k <= with_bf16 && st == ST_OK; k++) {
            st = st_attention_forward(&c[k].e.ctx, &c[k].a);
            if (st == ST_OK)
                st = st_attention_backward(&c[k].e.ctx, &c[k].a);
        }
        armed = 0;
    }
    cr_assert_eq(st, ST_OK, "%s", st_last_error());
    cr_assert_gt(executes, 0, "the interposer saw the primitives run");
    cr_expect_eq(own_calls, 0, "3 rounds of attention: subtrain called the heap %ld times",
                 own_calls);
    fprintf(stderr, "[heap] attention fp32%s, 3 rounds: subtrain %ld heap calls; oneDNN %ld in "
            "%ld executions\n", with_bf16 ? " and bf16" : "", own_calls, dnnl_calls, executes);
    for (int k = 0; k <= with_bf16; k++)
        env_destroy(&c[k].e);
}

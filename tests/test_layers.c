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
static void check_linear_variant(int in_major, int unscaled_bias, int runs)
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
                        .n_dw_runs = runs ? 2 : 0 };
    OK(st_linear_build(&e.ctx, &l, B, I, O, &io));
    OK(st_nn_ctx_finalize(&e.ctx));
    OK(st_linear_forward(&e.ctx, &l));
    OK(st_linear_backward(&e.ctx, &l));
#define W(o, i) ((double)w[in_major ? (i) * O + (o) : (o) * I + (i)])
    const double bs = unscaled_bias ? 1.0 : scale;
    for (int64_t r = 0; r < B; r++)
        for (int64_t o = 0; o < O; o++) {
            double t = 0;
            for (int64_t i = 0; i < I; i++)
                t += (double)x[r * I + i] * W(o, i);
            double want = res[r * O + o] + scale * t + bs * b[o];
            cr_expect(fabs(y[r * O + o] - want) <= 1e-5 * (1 + fabs(want)), "y[%lld,%lld] = %g, "
                      "want %g", (long long)r, (long long)o, y[r * O + o], want);
        }
    for (int64_t r = 0; r < B; r++)
        for (int64_t i = 0; i < I; i++) {
            double t = 0;
            for (int64_t o = 0; o < O; o++)
                t += (double)dy[r * O + o] * W(o, i);
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
                t += (double)dy[r * O + o] * x[r * I + i];
            cr_expect(fabs(dw[row * C + sc] - scale * t) <= 1e-5 * (1 + fabs(t)),
                      "dw row %lld (storage row %lld), col %lld", (long long)row, (long long)sr,
                      (long long)sc);
        }
        row++;
    }
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
                check_linear_variant(in_major, unscaled, runs);
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

    OK(st_act_build(&e->ctx, &c.a, kind, rows, cols, c.x, c.y, c.dx, c.dy));
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

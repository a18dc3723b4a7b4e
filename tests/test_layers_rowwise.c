/*
 * tests/test_layers_rowwise.c — gradient checks of the row-wise layers: the
 * activations (ReLU, GELU, on an NCHW tensor too) and layer norm, and in
 * bf16 what their backward reads (the kept rounded input).
 *
 * The pattern every test follows, and the helpers: tests/layer_check.h.
 */
#include "layer_check.h"

#include <subtrain/model.h>

#include "nn/gelu.h"

/* ------------------------------------------------------------ tolerances */

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

/* How many bf16 values lie between a and b (0: the same; +0 and -0 are 1
 * apart). */
static int bf16_ulps(st_bf16 a, st_bf16 b)
{
    const int ia = a & 0x8000 ? -(a & 0x7fff) - 1 : a, ib = b & 0x8000 ? -(b & 0x7fff) - 1 : b;
    return abs(ia - ib);
}

/* The folded GELU's pass (nn/gelu.h) on every bf16 value in [-16, 16]
 * and a few beyond: y and y' within bf16's rounding (half an ulp, 2^-8
 * relative) of the exact functions, plus A&S's erf error (1.5e-7
 * absolute, times |x| in y); st_gelu_bf16's y bitwise the same; and
 * within one ulp of what oneDNN's bf16 gelu_erf forward and backward (dy
 * = 1) give where both are accurate, on a CPU that runs bf16. */
Test(activation, folded_gelu_pass_is_gelu_and_its_derivative)
{
    omp_set_num_threads(1);
    const size_t cap = 70000;
    st_bf16 *x = malloc(cap * sizeof *x), *xd = malloc(cap * sizeof *xd);
    st_bf16 *y = malloc(cap * sizeof *y), *y2 = malloc(cap * sizeof *y2);
    cr_assert(x && xd && y && y2);
    size_t n = 0;
    for (uint32_t b = 0; b < 0x10000u; b++) {
        const float v = st_bf16_to_float((st_bf16)b);
        if (isfinite(v) && fabsf(v) <= 16.0f)
            x[n++] = (st_bf16)b;
    }
    const float far[] = { -1e30f, -200.0f, -87.5f, -40.0f, 40.0f, 1e30f };
    for (size_t k = 0; k < sizeof far / sizeof *far; k++)
        x[n++] = st_bf16_from_float(far[k]);
    memcpy(xd, x, n * sizeof *x);
    st_gelu_deriv_bf16(y, xd, n);
    st_gelu_bf16(y2, x, n);
    cr_assert(memcmp(y, y2, n * sizeof *y) == 0, "st_gelu_bf16's y differs from the folded pass's");
    double worst_y = 0, worst_d = 0;
    for (size_t i = 0; i < n; i++) {
        const double v = st_bf16_to_float(x[i]);
        const double Y = gelu_ref(v), D = gelu_grad_ref(v);
        const double gy = st_bf16_to_float(y[i]), gd = st_bf16_to_float(xd[i]);
        const double ey = fabs(gy - Y) / (ldexp(fabs(Y), -8) + 1.5e-7 * fabs(v) + 1e-37);
        const double ed = fabs(gd - D) / (ldexp(fabs(D), -8) + 1e-6);
        cr_expect(ey <= 1.0 && ed <= 1.0, "gelu(%.9g): y %.9g (exact %.9g), y' %.9g (exact %.9g)",
                  v, gy, Y, gd, D);
        worst_y = ey > worst_y ? ey : worst_y;
        worst_d = ed > worst_d ? ed : worst_d;
    }
    if (st_bf16_probe(NULL) == ST_BF16_NATIVE) {
        env e;
        env_init(&e, 64);
        st_bf16 *ox = malloc(n * sizeof *ox), *oy = malloc(n * sizeof *oy);
        st_bf16 *odx = malloc(n * sizeof *odx), *ones = malloc(n * sizeof *ones);
        cr_assert(ox && oy && odx && ones);
        memcpy(ox, x, n * sizeof *x);
        for (size_t i = 0; i < n; i++)
            ones[i] = st_bf16_from_float(1.0f);
        st_act a;
        OK(st_act_build_half_grads(&e.ctx, &a, ST_ACT_GELU, 1, (int64_t)n, ox, oy, odx, ones));
        OK(st_nn_ctx_finalize(&e.ctx));
        OK(st_act_forward(&e.ctx, &a));
        OK(st_act_backward(&e.ctx, &a));
        size_t same_y = 0, same_d = 0, normal = 0;
        for (size_t i = 0; i < n; i++) {
            /* oneDNN flushes subnormals, and below -4 its 1 + erf(x / sqrt 2)
             * cancels (y off the exact by 1% at -4.7, where ours is within
             * the bound above) */
            const float v = st_bf16_to_float(x[i]);
            if (fabsf(v) < 0x1p-125f || v < -4.0f)
                continue;
            normal++;
            same_y += y[i] == oy[i];
            same_d += xd[i] == odx[i];
            cr_expect(bf16_ulps(y[i], oy[i]) <= 1 && bf16_ulps(xd[i], odx[i]) <= 1,
                      "gelu(%.9g): y %.9g y' %.9g, oneDNN's %.9g %.9g",
                      (double)st_bf16_to_float(x[i]), (double)st_bf16_to_float(y[i]),
                      (double)st_bf16_to_float(xd[i]), (double)st_bf16_to_float(oy[i]),
                      (double)st_bf16_to_float(odx[i]));
        }
        fprintf(stderr, "[folded gelu] %zu normal values: bitwise oneDNN's y %.4f, y' %.4f\n",
                normal, (double)same_y / (double)normal, (double)same_d / (double)normal);
        free(ox), free(oy), free(odx), free(ones);
        env_destroy(&e);
    }
    fprintf(stderr, "[folded gelu] worst error over its bound: y %.3f, y' %.3f\n", worst_y,
            worst_d);
    free(x), free(xd), free(y), free(y2);
}

/* A layer norm's x (B, C): rows of U(-1.5, 1.5) shifted by about
 * +-offset, alternately; dy, gamma and beta around their usual sizes. */
static void fill_layernorm_inputs(st_rng *r, float *x, float *dy, float *gamma, float *beta,
                                  int64_t B, int64_t C, float offset)
{
    for (int64_t b = 0; b < B; b++) {
        const float off = offset * (b % 2 ? 1.0f : -1.0f) + 0.5f * st_rng_uniform(r);
        fill_uniform(r, x + b * C, (size_t)C, -1.5f, 1.5f);
        for (int64_t j = 0; j < C; j++)
            x[b * C + j] += off;
    }
    fill_uniform(r, dy, (size_t)(B * C), -1.0f, 1.0f);
    fill_uniform(r, gamma, (size_t)C, 0.5f, 1.5f);
    fill_uniform(r, beta, (size_t)C, -0.5f, 0.5f);
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
    fill_layernorm_inputs(&e.rng, x, dy, gamma, beta, B, C, offset);
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

/* --activation-precision bf16: the layer norm writes y as bf16 in a pass
 * of its own with the statistics and the centred copy.  Against oneDNN's
 * fp32 forward: the mean and variance within fp32 summation error, y
 * within bf16's rounding of fp32 y (plus fp32's of x - mean, which a
 * row far from 0 shows); the backward (the same primitive,
 * on the pass's statistics and copy) within 1e-3 rms of the bf16 layer's
 * that keeps fp32 y.  Inference writes the same y and statistics. */
static void check_layernorm_bf16_y(int64_t B, int64_t C, float offset, uint64_t seed)
{
    env e;
    env_init(&e, seed);
    const size_t n = (size_t)(B * C);
    float *x = env_floats(&e, n), *xh = env_floats(&e, n), *y = env_floats(&e, n);
    float *dx = env_floats(&e, n), *dxh = env_floats(&e, n), *dy = env_floats(&e, n);
    float *mean = env_floats(&e, (size_t)B), *var = env_floats(&e, (size_t)B);
    float *meanh = env_floats(&e, (size_t)B), *varh = env_floats(&e, (size_t)B);
    float *gamma = env_floats(&e, (size_t)C), *beta = env_floats(&e, (size_t)C);
    float *dg = env_floats(&e, (size_t)C), *db = env_floats(&e, (size_t)C);
    float *dgh = env_floats(&e, (size_t)C), *dbh = env_floats(&e, (size_t)C);
    st_bf16 *yh = malloc(n * sizeof *yh), *yi = malloc(n * sizeof *yi);
    cr_assert(yh && yi);
    fill_layernorm_inputs(&e.rng, x, dy, gamma, beta, B, C, offset);
    memcpy(xh, x, n * sizeof *x);
    st_layernorm ln, lnh;
    st_layernorm_io io = { .x = x, .y = y, .mean = mean, .var = var, .gamma = gamma,
                           .beta = beta, .dx = dx, .dy = dy, .dgamma = dg, .dbeta = db,
                           .bf16 = 1 };
    st_layernorm_io ioh = io;
    ioh.x = xh, ioh.y = NULL, ioh.yb = yh, ioh.mean = meanh, ioh.var = varh, ioh.dx = dxh;
    ioh.dgamma = dgh, ioh.dbeta = dbh;
    OK(st_layernorm_build(&e.ctx, &ln, B, C, &io));
    OK(st_layernorm_build(&e.ctx, &lnh, B, C, &ioh));
    OK(st_nn_ctx_finalize(&e.ctx));
    OK(st_layernorm_forward(&e.ctx, &ln));
    OK(st_layernorm_forward(&e.ctx, &lnh));
    for (int64_t b = 0; b < B; b++) {
        const float m = mean[b], v = var[b];
        cr_expect(fabsf(meanh[b] - m) <= 1e-6f * (fabsf(m) + 1.5f) &&
                  fabsf(varh[b] - v) <= 1e-5f * v,
                  "row %lld: mean %.9g var %.9g, oneDNN's %.9g %.9g", (long long)b,
                  (double)meanh[b], (double)varh[b], (double)m, (double)v);
    }
    /* bf16's rounding of y, and fp32's of x - mean (x ~ |mean|) scaled */
    int off_by_more = 0;
    size_t same = 0;
    for (size_t i = 0; i < n; i++) {
        const int64_t b = (int64_t)i / C;
        const double scale = 1.5 / sqrt(var[b] + ST_LAYERNORM_EPS);
        const double err = fabs((double)st_bf16_to_float(yh[i]) - y[i]);
        off_by_more += err > ldexp(fabs(y[i]), -8) + 4.0 * ldexp(fabs(mean[b]) + 1.5, -24) * scale;
        same += yh[i] == st_bf16_from_float(y[i]);
    }
    cr_expect_eq(off_by_more, 0, "%d of y off fp32 y by more than bf16's rounding and x - "
                 "mean's (offset %g)", off_by_more, offset);
    /* inference: the same pass without the copy */
    const float m0 = meanh[0];
    memcpy(yi, yh, n * sizeof *yh);
    memset(yh, 0, n * sizeof *yh);
    meanh[0] = -1.0f;
    OK(st_layernorm_infer(&e.ctx, &lnh));
    cr_expect(meanh[0] == m0, "inference's mean %g, training's %g", (double)meanh[0], (double)m0);
    cr_expect(memcmp(yi, yh, n * sizeof *yh) == 0, "inference's y differs from training's");
    poison(x, n);
    poison(xh, n);
    OK(st_layernorm_backward(&e.ctx, &ln));
    OK(st_layernorm_backward(&e.ctx, &lnh));
    const double rx = rms_rel(dxh, dx, n), rg = rms_rel(dgh, dg, (size_t)C);
    fprintf(stderr, "bf16-y layer norm %lldx%lld offset %g: y bitwise bf16(fp32 y) %.4f, dx "
            "%.2e, dgamma %.2e rms off the fp32-y layer's\n", (long long)B, (long long)C,
            offset, (double)same / (double)n, rx, rg);
    cr_expect(rx < 1e-3 && rg < 1e-3, "dx %g, dgamma %g rms off the fp32-y layer's", rx, rg);
    free(yh);
    free(yi);
    env_destroy(&e);
}

Test(layernorm, bf16_y_written_by_its_own_pass)
{
    omp_set_num_threads(1);
    check_layernorm_bf16_y(6, 13, 2.0f, 74);
    check_layernorm_bf16_y(64, 256, 0.0f, 75);
    check_layernorm_bf16_y(16, 64, 1000.0f, 76);
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

/*
 * quad/cases.c — the five exact checks of IST on quadratics (doc/quad.md),
 * the convergence trace and its CSV.
 *
 * Every random quantity has its own stream under the seed (problems, x0,
 * each case's sketches, each Monte Carlo run), so a case's numbers do not
 * depend on which other cases ran or in which order.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/quad.h>

#include "core/error.h"

enum {
    STREAM_X0 = 100,       /* starting points */
    STREAM_CASE1 = 101,
    STREAM_CASE2 = 102,    /* run r: split(STREAM_CASE2, r); the trace's IST is run 0 */
    STREAM_CASE3 = 103,    /* also the trace's b = 0 IST run */
    STREAM_CASE5 = 105,
    STREAM_CASE6 = 106,    /* 0: the unbiasedness draws; 1: shared; 2: error
                            * feedback; 3 + r: run r of independent subsets */
};

#define DEFAULT_WORKERS 8
#define DEFAULT_Q 4
#define CASE1_DRAWS 16
#define CASE2_DELTA 1e-3     /* Chebyshev failure probability per iteration */
#define CASE3_REACH 1e-10    /* relative error that counts as "converged" */
#define CASE4_DIRS 3600
#define CASE5_DELTA 1e-6     /* Bernstein failure probability, all entries together */
#define CASE6_DELTA 1e-6     /* the same for case 6's mean of compressed vectors */
#define CASE6_DRAWS_PER_RUN 10
#define MAX_ITERS 10000000
#define MAX_RUNS 10000000

/* ------------------------------------------------------------ config */

st_quad_config st_quad_defaults(void)
{
    st_quad_config c = { 0 };
    c.gamma = 0.5;
    c.keep = 0.25;
    c.iters = 500;
    c.runs = 10000;
    c.seed = 1;
    return c;
}

static st_status resolve_shape(st_quad_config *c)
{
    if (c->dim < 0 || c->workers < 0 || c->q < 0)
        return st_fail(ST_ERR_INVALID, "dim, workers and q must be positive");
    int given = (c->dim > 0) + (c->workers > 0) + (c->q > 0);
    if (given == 3) {
        if ((long long)c->workers * c->q != c->dim)
            return st_fail(ST_ERR_INVALID,
                           "dim must equal q x workers: %d != %d x %d", c->dim, c->q,
                           c->workers);
        return ST_OK;
    }
    if (c->dim > 0 && c->workers == 0 && c->q == 0) {
        if (c->dim % DEFAULT_WORKERS != 0)
            return st_fail(ST_ERR_INVALID,
                           "dim %d is not a multiple of the default %d workers (give workers "
                           "or q)", c->dim, DEFAULT_WORKERS);
        c->workers = DEFAULT_WORKERS;
    }
    if (c->dim == 0 && c->workers == 0)
        c->workers = DEFAULT_WORKERS;
    if (c->dim == 0 && c->q == 0)
        c->q = DEFAULT_Q;
    if (c->dim == 0) {
        if ((long long)c->workers * c->q > ST_QUAD_MAX_DIM)
            return st_fail(ST_ERR_INVALID, "dim = q x workers = %d x %d exceeds %d", c->q,
                           c->workers, ST_QUAD_MAX_DIM);
        c->dim = c->workers * c->q;
    } else if (c->workers > 0) {
        if (c->dim % c->workers != 0)
            return st_fail(ST_ERR_INVALID,
                           "workers must divide dim for Perm-q sketches: %d does not divide %d",
                           c->workers, c->dim);
        c->q = c->dim / c->workers;
    } else {
        if (c->dim % c->q != 0)
            return st_fail(ST_ERR_INVALID, "q must divide dim: %d does not divide %d", c->q,
                           c->dim);
        c->workers = c->dim / c->q;
    }
    return ST_OK;
}

st_status st_quad_config_resolve(st_quad_config *c)
{
    ST_TRY(resolve_shape(c));
    if (c->dim > ST_QUAD_MAX_DIM)
        return st_fail(ST_ERR_INVALID, "dim must be at most %d, got %d", ST_QUAD_MAX_DIM,
                       c->dim);
    unsigned long long n = (unsigned long long)c->workers, d = (unsigned long long)c->dim;
    if (n * d * d > ST_QUAD_MAX_ELEMS || n * n * n > ST_QUAD_MAX_ELEMS)
        return st_fail(ST_ERR_INVALID,
                       "%d workers with dim %d need more than %llu doubles of Hessians",
                       c->workers, c->dim, (unsigned long long)ST_QUAD_MAX_ELEMS);
    if (!(c->gamma > 0.0 && c->gamma < 2.0))
        return st_fail(ST_ERR_INVALID,
                       "gamma must be in (0, 2) (a step relative to the curvature), got %g",
                       c->gamma);
    if (!(c->keep > 0.0 && c->keep <= 1.0))
        return st_fail(ST_ERR_INVALID, "keep (random-k's fraction of coordinates) must be in "
                       "(0, 1], got %g", c->keep);
    if (c->iters < 1 || c->iters > MAX_ITERS)
        return st_fail(ST_ERR_INVALID, "iters must be in [1, %d], got %d", MAX_ITERS, c->iters);
    if (c->runs < 2 || c->runs > MAX_RUNS)
        return st_fail(ST_ERR_INVALID, "runs must be in [2, %d], got %d", MAX_RUNS, c->runs);
    return ST_OK;
}

/* The cases accept only resolved configs: a half-filled one is a caller's
 * mistake, reported rather than silently completed. */
static st_status check_resolved(const st_quad_config *c)
{
    st_quad_config r = *c;
    ST_TRY(st_quad_config_resolve(&r));
    if (r.dim != c->dim || r.workers != c->workers || r.q != c->q)
        return st_fail(ST_ERR_INVALID, "config not resolved (call st_quad_config_resolve)");
    return ST_OK;
}

/* ------------------------------------------------------------ helpers */

static double norm2(int d, const double *x)
{
    double s = 0.0;
    for (int j = 0; j < d; j++)
        s += x[j] * x[j];
    return sqrt(s);
}

static double dist2(int d, const double *x, const double *y)
{
    double s = 0.0;
    for (int j = 0; j < d; j++)
        s += (x[j] - y[j]) * (x[j] - y[j]);
    return sqrt(s);
}

/* x0 (d): standard normal, from the seed's STREAM_X0 and d (so the cases
 * that share a problem share their start). */
static void start_point(uint64_t seed, int d, double *x0)
{
    st_rng root = st_rng_seed(seed);
    st_rng r = st_rng_split(&root, STREAM_X0);
    r = st_rng_split(&r, (uint64_t)d);
    for (int j = 0; j < d; j++)
        x0[j] = (double)st_rng_normal(&r);
}

static st_rng case_stream(uint64_t seed, uint64_t id)
{
    st_rng root = st_rng_seed(seed);
    return st_rng_split(&root, id);
}

/* err[k] = ||x^k - x*||, k = 0..K, for IST with a fresh sketch from rng
 * each step; x (d) holds x^K at the end; y (d) is scratch. */
static st_status ist_run(const st_quad_problem *p, st_quad_sketch *s, st_quad_sketch_kind kind,
                         double gamma, int K, st_rng *rng, double *x, double *y, double *err)
{
    int d = p->d;
    if (err)
        err[0] = dist2(d, x, p->x_star);
    for (int k = 1; k <= K; k++) {
        ST_TRY(st_quad_sketch_perm(s, kind, p, rng));
        ST_TRY(st_quad_ist_step(p, s, gamma, x, y));
        memcpy(x, y, (size_t)d * sizeof *x);
        if (err)
            err[k] = dist2(d, x, p->x_star);
    }
    return ST_OK;
}

/* The same for gradient descent. */
static st_status gd_run(const st_quad_problem *p, double gamma, int K, double *x, double *y,
                        double *err)
{
    int d = p->d;
    err[0] = dist2(d, x, p->x_star);
    for (int k = 1; k <= K; k++) {
        ST_TRY(st_quad_gd_step(p, gamma, x, y));
        memcpy(x, y, (size_t)d * sizeof *x);
        err[k] = dist2(d, x, p->x_star);
    }
    return ST_OK;
}

static int first_below(int K, const double *err, double level)
{
    for (int k = 0; k <= K; k++)
        if (err[k] <= level)
            return k;
    return -1;
}

/* ------------------------------------------------------------ case 1 */

/* Case 1 on problem p (d = n, b = 0) for one drawn sketch: the largest
 * entry of (1/n) sum C_i L_i C_i - I, column by column through the IST
 * kernel itself (M e_k = g(e_k) when b = 0); e, g are (d). */
static st_status identity_error(const st_quad_problem *p, const st_quad_sketch *s, double *e,
                                double *g, double *err)
{
    int d = p->d;
    *err = 0.0;
    memset(e, 0, (size_t)d * sizeof *e);
    for (int k = 0; k < d; k++) {
        e[k] = 1.0;
        ST_TRY(st_quad_ist_direction(p, s, e, g));
        e[k] = 0.0;
        for (int j = 0; j < d; j++)
            *err = fmax(*err, fabs(g[j] - (j == k ? 1.0 : 0.0)));
    }
    return ST_OK;
}

/* Plain Perm-1 with b = 0 is x+ = (I - gamma n Diag(l)) x with l_j the
 * (j, j) entry of its holder's L_i: no scalar gamma zeroes all of it; the
 * best one, 2 / (n (l_min + l_max)), leaves (l_max - l_min) / (l_max +
 * l_min).  Returns that step for the sketch s. */
static double plain_best_step(const st_quad_problem *p, const st_quad_sketch *s)
{
    int d = p->d;
    double lo = INFINITY, hi = 0.0;
    for (int i = 0; i < s->n; i++) {
        uint32_t j = s->coord[i];
        double l = p->L[(size_t)i * d * d + (size_t)j * d + j];
        lo = fmin(lo, l);
        hi = fmax(hi, l);
    }
    return 2.0 / (s->n * (lo + hi));
}

st_status st_quad_case_1(const st_quad_config *c, st_quad_case1 *out)
{
    memset(out, 0, sizeof *out);
    ST_TRY(check_resolved(c));
    int n = c->workers, d = n;
    st_quad_problem *p;
    ST_TRY(st_quad_problem_random(d, n, c->seed, 0, &p));
    st_quad_sketch s;
    st_status st = st_quad_sketch_init(&s, d, n);
    double *buf = malloc(4 * (size_t)d * sizeof *buf);
    if (st == ST_OK && !buf)
        st = st_fail(ST_ERR_NOMEM, "case 1: no memory for d = %d", d);
    if (st != ST_OK)
        goto done;
    double *x0 = buf, *x1 = x0 + d, *e = x1 + d, *g = e + d;
    start_point(c->seed, d, x0);
    double n0 = norm2(d, x0);
    st_rng rng = case_stream(c->seed, STREAM_CASE1);
    out->d = d;
    out->n = n;
    out->draws = CASE1_DRAWS;
    for (int t = 0; t < CASE1_DRAWS; t++) {
        double ierr;
        ST_TRY_GOTO(st, st_quad_sketch_perm(&s, ST_QUAD_PRECONDITIONED, p, &rng), done);
        ST_TRY_GOTO(st, identity_error(p, &s, e, g, &ierr), done);
        out->identity_err = fmax(out->identity_err, ierr);
        ST_TRY_GOTO(st, st_quad_ist_step(p, &s, 1.0, x0, x1), done);
        out->step_rel = fmax(out->step_rel, norm2(d, x1) / n0);
        /* Same permutation, plain scales: the contrast. */
        s.kind = ST_QUAD_PLAIN;
        for (int k = 0; k < d; k++)
            s.scale[k] = (double)n;
        ST_TRY_GOTO(st, st_quad_ist_step(p, &s, plain_best_step(p, &s), x0, x1), done);
        out->plain_rel = fmax(out->plain_rel, norm2(d, x1) / n0);
    }
done:
    free(buf);
    st_quad_sketch_free(&s);
    st_quad_problem_free(p);
    return st;
}

/* ------------------------------------------------------------ case 2 */

/* m (K + 1, d): the exact E[x^k] of IST, m_{k+1} = m_k - gamma (A m_k - c):
 * exact because the step is affine in x and each step's permutation is
 * independent of x^k. */
static void expected_iterates(int d, const double *A, const double *c, double gamma, int K,
                              const double *x0, double *m)
{
    memcpy(m, x0, (size_t)d * sizeof *m);
    for (int k = 0; k < K; k++) {
        const double *cur = m + (size_t)k * d;
        double *next = m + (size_t)(k + 1) * d;
        for (int i = 0; i < d; i++) {
            double s = -c[i];
            for (int j = 0; j < d; j++)
                s += A[(size_t)i * d + j] * cur[j];
            next[i] = cur[i] - gamma * s;
        }
    }
}

/* formula (d) = (1-gamma)^k x0 + (1 - (1-gamma)^k) x_inf. */
static void paper_formula(int d, double gamma, int k, const double *x0, const double *x_inf,
                          double *formula)
{
    double a = pow(1.0 - gamma, k);
    for (int j = 0; j < d; j++)
        formula[j] = a * x0[j] + (1.0 - a) * x_inf[j];
}

typedef struct case2_buffers {
    double *A, *c, *x0, *x_inf, *x_plain, *m, *sum, *sumsq, *x, *y, *f, *tail;
} case2_buffers;

static st_status case2_alloc(int d, int K, case2_buffers *b)
{
    size_t dd = (size_t)d * (size_t)d, kd = (size_t)(K + 1) * (size_t)d;
    size_t total = dd + 8 * (size_t)d + 2 * kd + (size_t)(K + 1);
    double *all = calloc(total, sizeof *all);
    if (!all)
        return st_fail(ST_ERR_NOMEM, "case 2: no memory for %d iterations of dimension %d", K,
                       d);
    b->A = all;
    b->c = b->A + dd;
    b->x0 = b->c + d;
    b->x_inf = b->x0 + d;
    b->x_plain = b->x_inf + d;
    b->x = b->x_plain + d;
    b->y = b->x + d;
    b->f = b->y + d;
    b->tail = b->f + d;
    b->m = b->tail + d;
    b->sum = b->m + kd;
    b->sumsq = b->sum + kd;
    return ST_OK;
}

/* The caller's progress display, if any (st_quad_config.progress). */
static void progress(const st_quad_config *c, int case_no, const char *what, long done,
                     long total)
{
    if (c->progress)
        c->progress(case_no, what, done, total, c->progress_user);
}

/* The Monte Carlo part: R runs of K steps from x0; sum (K+1, d) and
 * sumsq (K+1) collect sum_r x^k and sum_r ||x^k||^2; tail gets run 0's
 * average of x^k over k in [K/2, K). */
static st_status case2_runs(const st_quad_problem *p, const st_quad_config *c,
                            st_quad_sketch *s, case2_buffers *b)
{
    int d = p->d, K = c->iters;
    st_rng base = case_stream(c->seed, STREAM_CASE2);
    for (int r = 0; r < c->runs; r++) {
        st_rng rng = st_rng_split(&base, (uint64_t)r);
        memcpy(b->x, b->x0, (size_t)d * sizeof *b->x);
        for (int k = 0; k <= K; k++) {
            if (k > 0) {
                ST_TRY(st_quad_sketch_perm(s, ST_QUAD_PRECONDITIONED, p, &rng));
                ST_TRY(st_quad_ist_step(p, s, c->gamma, b->x, b->y));
                memcpy(b->x, b->y, (size_t)d * sizeof *b->x);
            }
            double *acc = b->sum + (size_t)k * d;
            double sq = 0.0;
            for (int j = 0; j < d; j++) {
                acc[j] += b->x[j];
                sq += b->x[j] * b->x[j];
            }
            b->sumsq[k] += sq;
            if (r == 0 && k >= K / 2 && k < K)
                for (int j = 0; j < d; j++)
                    b->tail[j] += b->x[j] / (K - K / 2);
        }
        progress(c, 2, "runs", r + 1L, c->runs);
    }
    return ST_OK;
}

/* Compares the runs' mean with the formula at every k >= 1 against a
 * Chebyshev bound: E||mean - E x^k||^2 = tr Cov(x^k) / R, so
 * P(||mean - E x^k|| >= sqrt(tr Cov / (R delta))) <= delta. */
static void case2_compare(const st_quad_problem *p, const st_quad_config *c, case2_buffers *b,
                          st_quad_case2 *out)
{
    int d = p->d, K = c->iters;
    double R = (double)c->runs;
    for (int k = 1; k <= K; k++) {
        double *mean = b->sum + (size_t)k * d;
        for (int j = 0; j < d; j++)
            mean[j] /= R;
        double mn = norm2(d, mean);
        double trcov = fmax(0.0, (b->sumsq[k] - R * mn * mn) / (R - 1.0));
        double bound = sqrt(trcov / (R * CASE2_DELTA));
        paper_formula(d, c->gamma, k, b->x0, b->x_inf, b->f);
        double err = dist2(d, mean, b->f);
        double ratio = bound > 0.0 ? err / bound : (err > 0.0 ? INFINITY : 0.0);
        out->mc_err = fmax(out->mc_err, ratio);
        if (k == K) {
            out->mc_err_final = err;
            out->mc_bound_final = bound;
            out->mean_to_x_inf = dist2(d, mean, b->x_inf);
            out->mean_to_x_star = dist2(d, mean, p->x_star);
        }
    }
}

st_status st_quad_case_2(const st_quad_config *c, st_quad_case2 *out)
{
    memset(out, 0, sizeof *out);
    ST_TRY(check_resolved(c));
    int n = c->workers, d = n, K = c->iters;
    st_quad_problem *p;
    ST_TRY(st_quad_problem_random(d, n, c->seed, 1, &p));
    case2_buffers b = { 0 };
    st_quad_sketch s = { 0 };
    st_status st;
    ST_TRY_GOTO(st, case2_alloc(d, K, &b), done);
    ST_TRY_GOTO(st, st_quad_sketch_init(&s, d, n), done);
    start_point(c->seed, d, b.x0);
    ST_TRY_GOTO(st, st_quad_expected_system(p, ST_QUAD_PRECONDITIONED, b.A, b.c), done);
    ST_TRY_GOTO(st, st_quad_solve(d, b.A, b.c, b.x_inf), done);
    ST_TRY_GOTO(st, st_quad_biased_point(p, ST_QUAD_PLAIN, b.x_plain), done);

    out->d = d;
    out->n = n;
    out->iters = K;
    out->runs = c->runs;
    out->gamma = c->gamma;
    out->norm_x_star = norm2(d, p->x_star);
    out->norm_x_inf = norm2(d, b.x_inf);
    out->bias = dist2(d, b.x_inf, p->x_star);
    out->bias_plain = dist2(d, b.x_plain, p->x_star);
    for (int j = 0; j < d; j++)
        for (int k = 0; k < d; k++)
            out->A_err = fmax(out->A_err, fabs(b.A[(size_t)j * d + k] - (j == k ? 1.0 : 0.0)));

    expected_iterates(d, b.A, b.c, c->gamma, K, b.x0, b.m);
    for (int k = 0; k <= K; k++) {
        paper_formula(d, c->gamma, k, b.x0, b.x_inf, b.f);
        out->formula_err = fmax(out->formula_err, dist2(d, b.m + (size_t)k * d, b.f));
    }
    ST_TRY_GOTO(st, case2_runs(p, c, &s, &b), done);
    case2_compare(p, c, &b, out);
    out->tail_to_x_inf = dist2(d, b.tail, b.x_inf);
    out->tail_to_x_star = dist2(d, b.tail, p->x_star);
done:
    st_quad_sketch_free(&s);
    free(b.A);
    st_quad_problem_free(p);
    return st;
}

/* ------------------------------------------------------------ case 3 */

st_status st_quad_case_3(const st_quad_config *c, st_quad_case3 *out)
{
    memset(out, 0, sizeof *out);
    ST_TRY(check_resolved(c));
    int d = c->dim, n = c->workers, K = c->iters;
    st_quad_problem *p;
    ST_TRY(st_quad_problem_random(d, n, c->seed, 0, &p));
    st_quad_sketch s = { 0 };
    double *buf = malloc((3 * (size_t)d + 2 * (size_t)(K + 1)) * sizeof *buf);
    st_status st = buf ? ST_OK : st_fail(ST_ERR_NOMEM, "case 3: no memory");
    if (st != ST_OK)
        goto done;
    double *x = buf, *y = x + d, *x0 = y + d, *err = x0 + d, *gd_err = err + K + 1;
    ST_TRY_GOTO(st, st_quad_sketch_init(&s, d, n), done);
    out->d = d;
    out->n = n;
    out->q = s.q;
    out->iters = K;
    out->gamma = c->gamma;
    ST_TRY_GOTO(st, st_quad_ist_curvature(p, ST_QUAD_PLAIN, &out->curvature), done);
    out->step = c->gamma / out->curvature;

    /* x* = 0 is a fixed point of every draw: C_i 0 = 0 and grad f_i(0) = -b_i = 0. */
    st_rng rng = case_stream(c->seed, STREAM_CASE3);
    st_rng probe = st_rng_split(&rng, 1u << 20);
    ST_TRY_GOTO(st, st_quad_sketch_perm(&s, ST_QUAD_PLAIN, p, &probe), done);
    ST_TRY_GOTO(st, st_quad_ist_step(p, &s, out->step, p->x_star, y), done);
    out->fixed_point_err = dist2(d, y, p->x_star);

    start_point(c->seed, d, x0);
    memcpy(x, x0, (size_t)d * sizeof *x);
    ST_TRY_GOTO(st, ist_run(p, &s, ST_QUAD_PLAIN, out->step, K, &rng, x, y, err), done);
    out->err0 = err[0];
    out->err_final = err[K];
    out->reach = first_below(K, err, CASE3_REACH * err[0]);

    double lmax;
    ST_TRY_GOTO(st, st_quad_lambda_max(d, p->L_mean, &lmax), done);
    out->gd_step = c->gamma / lmax;
    memcpy(x, x0, (size_t)d * sizeof *x);
    ST_TRY_GOTO(st, gd_run(p, out->gd_step, K, x, y, gd_err), done);
    out->gd_err_final = gd_err[K];
    out->gd_reach = first_below(K, gd_err, CASE3_REACH * gd_err[0]);
done:
    free(buf);
    st_quad_sketch_free(&s);
    st_quad_problem_free(p);
    return st;
}

/* ------------------------------------------------------------ case 4 */

st_status st_quad_case_4(const st_quad_config *c, st_quad_case4 *out)
{
    memset(out, 0, sizeof *out);
    (void)c; /* the 2x2 counterexample is fixed; the signature matches the others */
    // L is (2, 2) row-major, the same for both workers: L_1 = L_2 = L
    static const double L2[2][4] = { { 1, 5, 5, 100 }, { 1, 5, 5, 100 } };
    st_quad_problem *p;
    ST_TRY(st_quad_problem_create(2, 2, &L2[0][0], NULL, &p));
    st_quad_sketch s[2] = { { 0 }, { 0 } }, pre = { 0 };
    st_status st;
    ST_TRY_GOTO(st, st_quad_sketch_init(&s[0], 2, 2), done);
    ST_TRY_GOTO(st, st_quad_sketch_init(&s[1], 2, 2), done);
    ST_TRY_GOTO(st, st_quad_sketch_init(&pre, 2, 2), done);
    /* Perm-1 with n = 2 has two draws: the identity and the swap; both
     * give g = (1/2) sum_j 4 L_jj x_j e_j = 2 diag(L) x. */
    for (int t = 0; t < 2; t++) {
        s[t].coord[0] = (uint32_t)t;
        s[t].coord[1] = (uint32_t)(1 - t);
        s[t].scale[0] = s[t].scale[1] = 2.0;
    }
    st_rng rng = st_rng_seed(0);
    ST_TRY_GOTO(st, st_quad_sketch_perm(&pre, ST_QUAD_PRECONDITIONED, p, &rng), done);

    const double *L = p->L;
    out->dirs = CASE4_DIRS;
    out->cosine = INFINITY;
    for (int k = 0; k < CASE4_DIRS; k++) {
        /* x and -x give the same sign (the form is quadratic): half a turn. */
        double th = 3.141592653589793 * k / CASE4_DIRS;
        double x[2] = { cos(th), sin(th) }, grad[2], g[2];
        st_quad_f(p, x, grad);
        for (int t = 0; t < 2; t++) {
            ST_TRY_GOTO(st, st_quad_ist_direction(p, &s[t], x, g), done);
            out->g_err = fmax(out->g_err, fabs(g[0] - 2.0 * L[0] * x[0]));
            out->g_err = fmax(out->g_err, fabs(g[1] - 2.0 * L[3] * x[1]));
        }
        double dot = grad[0] * g[0] + grad[1] * g[1];
        double cs = dot / (sqrt(grad[0] * grad[0] + grad[1] * grad[1]) *
                           sqrt(g[0] * g[0] + g[1] * g[1]));
        out->negative += dot < 0.0;
        if (cs < out->cosine) {
            out->cosine = cs;
            out->dot = dot;
            out->x[0] = x[0];
            out->x[1] = x[1];
        }
    }
    /* <L x, 2 D x> = x^T (L D + D L) x: negative somewhere iff the
     * symmetric matrix S = L D + D L has a negative eigenvalue. */
    double s00 = 2 * L[0] * L[0], s11 = 2 * L[3] * L[3], s01 = L[1] * (L[0] + L[3]);
    out->lambda_min = 0.5 * (s00 + s11 - sqrt((s00 - s11) * (s00 - s11) + 4 * s01 * s01));

    double g[2], xt[2], grad[2], t = 1e-4;
    ST_TRY_GOTO(st, st_quad_ist_direction(p, &s[0], out->x, g), done);
    xt[0] = out->x[0] - t * g[0];
    xt[1] = out->x[1] - t * g[1];
    out->f_rise = st_quad_f(p, xt, NULL) - st_quad_f(p, out->x, NULL);
    st_quad_f(p, out->x, grad);
    ST_TRY_GOTO(st, st_quad_ist_direction(p, &pre, out->x, g), done);
    out->dot_precond = grad[0] * g[0] + grad[1] * g[1];
done:
    st_quad_sketch_free(&s[0]);
    st_quad_sketch_free(&s[1]);
    st_quad_sketch_free(&pre);
    st_quad_problem_free(p);
    return st;
}

/* ------------------------------------------------------------ case 5 */

/* Bernstein: X = (C_i)_jj is n with probability 1/n, else 0: mean 1,
 * variance n - 1, |X - 1| <= max(1, n - 1).  For the mean of S draws,
 * P(|mean - 1| >= t) <= 2 exp(-S t^2 / (2 var + 2 M t / 3)); a union bound
 * over the n d entries at total probability delta gives t below. */
static double bernstein(double scale, double entries, long S, double delta)
{
    double var = scale - 1.0, M = fmax(1.0, scale - 1.0);
    double l = log(2.0 * entries / delta);
    double a = 2.0 * M * l / 3.0;
    return (a + sqrt(a * a + 8.0 * S * var * l)) / (2.0 * S);
}

static double bernstein_bound(int n, int d, long S, double delta)
{
    return bernstein(n, (double)n * d, S, delta);
}

st_status st_quad_case_5(const st_quad_config *c, st_quad_case5 *out)
{
    memset(out, 0, sizeof *out);
    ST_TRY(check_resolved(c));
    int d = c->dim, n = c->workers;
    st_quad_sketch s;
    ST_TRY(st_quad_sketch_init(&s, d, n));
    // sum (n, d): sum over draws of diag(C_i); col (d): one draw's sum_i diag(C_i)
    double *sum = calloc((size_t)n * (size_t)d + (size_t)d, sizeof *sum);
    if (!sum) {
        st_quad_sketch_free(&s);
        return st_fail(ST_ERR_NOMEM, "case 5: no memory for %dx%d sums", n, d);
    }
    double *col = sum + (size_t)n * d;
    out->d = d;
    out->n = n;
    out->q = s.q;
    out->levels = ST_QUAD_CASE5_LEVELS;
    st_rng rng = case_stream(c->seed, STREAM_CASE5);
    long next = 10, drawn = 0;
    st_status st = ST_OK;
    for (int level = 0; level < ST_QUAD_CASE5_LEVELS; level++, next *= 10) {
        for (; drawn < next; drawn++) {
            ST_TRY_GOTO(st, st_quad_sketch_perm(&s, ST_QUAD_PLAIN, NULL, &rng), done);
            memset(col, 0, (size_t)d * sizeof *col);
            for (int k = 0; k < d; k++) {
                int i = k / s.q;
                sum[(size_t)i * d + s.coord[k]] += s.scale[k];
                col[s.coord[k]] += s.scale[k];
            }
            for (int j = 0; j < d; j++)
                out->sum_err = fmax(out->sum_err, fabs(col[j] - n));
        }
        double dev = 0.0;
        for (size_t k = 0; k < (size_t)n * d; k++)
            dev = fmax(dev, fabs(sum[k] / (double)drawn - 1.0));
        out->samples[level] = drawn;
        out->max_dev[level] = dev;
        out->bound[level] = bernstein_bound(n, d, drawn, CASE5_DELTA);
    }
done:
    free(sum);
    st_quad_sketch_free(&s);
    return st;
}

/* ------------------------------------------------------------ case 6 */

/* The mean of S random-k compressions of x0 against x0: per coordinate
 * X / v_j is d/k with probability k/d, else 0 (mean 1, variance d/k - 1),
 * so case 5's Bernstein bound applies with d/k for n, over the d
 * entries; the same draws unscaled have mean k/d, not 1. */
static st_status case6_mean(const st_quad_config *c, int d, int k, const double *v,
                            double *work, st_quad_case6 *out)
{
    double *sum = work, *y = work + d;
    const double scale = (double)d / (double)k;
    st_rng rng = case_stream(c->seed, STREAM_CASE6);
    rng = st_rng_split(&rng, 0);
    const long S = (long)c->runs * CASE6_DRAWS_PER_RUN;
    memset(sum, 0, (size_t)d * sizeof *sum);
    for (long t = 0; t < S; t++) {
        ST_TRY(st_quad_randk(d, k, scale, &rng, v, y));
        for (int j = 0; j < d; j++)
            sum[j] += y[j];
        if ((t + 1) % 4096 == 0 || t + 1 == S)
            progress(c, 6, "vectors", t + 1, S);
    }
    out->samples = S;
    for (int j = 0; j < d; j++) {
        const double m = sum[j] / (double)S / v[j];
        out->mean_dev = fmax(out->mean_dev, fabs(m - 1.0));
        out->unscaled_dev = fmax(out->unscaled_dev, fabs(m / scale - 1.0));
    }
    out->mean_bound = bernstein(scale, d, S, CASE6_DELTA);
    return ST_OK;
}

/* K steps of random-k gradient descent from x0: ||x^K - x*|| (x: x^K). */
static st_status randk_run(const st_quad_problem *p, int k, int shared, double eta, int K,
                           st_rng *rng, double *x, double *e, double *y, double *scratch)
{
    for (int t = 0; t < K; t++) {
        ST_TRY(st_quad_randk_step(p, k, shared, eta, rng, x, e, y, scratch));
        memcpy(x, y, (size_t)p->d * sizeof *x);
    }
    return ST_OK;
}

st_status st_quad_case_6(const st_quad_config *c, st_quad_case6 *out)
{
    memset(out, 0, sizeof *out);
    ST_TRY(check_resolved(c));
    const int n = c->workers, d = n, K = c->iters, R = c->runs;
    int k = (int)ceil(c->keep * d);
    k = k < 1 ? 1 : k > d ? d : k;
    st_quad_problem *p;
    ST_TRY(st_quad_problem_random(d, n, c->seed, 1, &p));
    double *buf = calloc((size_t)d * (7 + (size_t)n), sizeof *buf);
    st_status st = buf ? ST_OK : st_fail(ST_ERR_NOMEM, "case 6: no memory");
    if (st != ST_OK)
        goto done;
    double *x0 = buf, *x = x0 + d, *y = x + d, *scratch = y + d, *mean = scratch + 2 * d,
           *sq = mean + d, *e = sq + d;
    start_point(c->seed, d, x0);
    out->d = d;
    out->n = n;
    out->k = k;
    out->keep = c->keep;
    out->iters = K;
    out->runs = R;
    out->gamma = c->gamma;
    ST_TRY_GOTO(st, case6_mean(c, d, k, x0, mean, out), done);

    /* IST's bias (case 2's point) and the compressed runs' step: the
     * expected iteration matrix of a shared subset is I - eta L, so eta =
     * gamma k / (d lambda_max) keeps every draw's (d/k) P L P within 2 */
    double lmax;
    ST_TRY_GOTO(st, st_quad_lambda_max(d, p->L_mean, &lmax), done);
    out->step = c->gamma * (double)k / ((double)d * lmax);
    ST_TRY_GOTO(st, st_quad_biased_point(p, ST_QUAD_PRECONDITIONED, y), done);
    out->ist_bias = dist2(d, y, p->x_star);
    out->err0 = dist2(d, x0, p->x_star);

    st_rng root = case_stream(c->seed, STREAM_CASE6);
    st_rng rng = st_rng_split(&root, 1);
    memcpy(x, x0, (size_t)d * sizeof *x);
    ST_TRY_GOTO(st, randk_run(p, k, 1, out->step, K, &rng, x, NULL, y, scratch), done);
    out->shared_final = dist2(d, x, p->x_star);
    rng = st_rng_split(&root, 2);
    memcpy(x, x0, (size_t)d * sizeof *x);
    ST_TRY_GOTO(st, randk_run(p, k, 1, out->step, K, &rng, x, e, y, scratch), done);
    out->ef_final = dist2(d, x, p->x_star);

    /* independent subsets: x* is no fixed point of a draw (the workers'
     * gradients there do not cancel once compressed apart), but E x^k is
     * gradient descent's at the same step (affine steps, draws independent
     * of x); the mean of R runs is within Chebyshev's bound of it */
    memset(mean, 0, (size_t)d * sizeof *mean);
    double sumsq = 0.0;
    for (int r = 0; r < R; r++) {
        rng = st_rng_split(&root, 3 + (uint64_t)r);
        memcpy(x, x0, (size_t)d * sizeof *x);
        ST_TRY_GOTO(st, randk_run(p, k, 0, out->step, K, &rng, x, NULL, y, scratch), done);
        if (r == 0)
            out->indep_final = dist2(d, x, p->x_star);
        for (int j = 0; j < d; j++)
            mean[j] += x[j];
        sumsq += norm2(d, x) * norm2(d, x);
        progress(c, 6, "runs", r + 1L, R);
    }
    for (int j = 0; j < d; j++)
        mean[j] /= (double)R;
    const double mn = norm2(d, mean);
    const double trcov = fmax(0.0, (sumsq - R * mn * mn) / (R - 1.0));
    out->indep_bound = sqrt(trcov / (R * CASE2_DELTA));
    out->indep_mean = dist2(d, mean, p->x_star);
    memcpy(x, x0, (size_t)d * sizeof *x);
    for (int t = 0; t < K; t++) {
        ST_TRY_GOTO(st, st_quad_gd_step(p, out->step, x, y), done);
        memcpy(x, y, (size_t)d * sizeof *x);
    }
    out->gd_final = dist2(d, x, p->x_star);
done:
    free(buf);
    st_quad_problem_free(p);
    return st;
}

/* ------------------------------------------------------------ trace / CSV */

void st_quad_trace_free(st_quad_trace *t)
{
    free(t->ist);
    memset(t, 0, sizeof *t);
}

/* The trace on one problem: gd (and, when ist is not NULL, one IST run
 * from stream `stream`, run 0 of it) from the seed's start point. */
static st_status trace_problem(const st_quad_config *c, st_quad_problem *p,
                               st_quad_sketch_kind kind, double ist_gamma, uint64_t stream,
                               int split_run, double *ist, double *gd)
{
    int d = p->d, K = c->iters;
    st_quad_sketch s = { 0 };
    double *buf = malloc(3 * (size_t)d * sizeof *buf);
    if (!buf)
        return st_fail(ST_ERR_NOMEM, "trace: no memory");
    double *x = buf, *y = x + d, *x0 = y + d;
    st_status st;
    ST_TRY_GOTO(st, st_quad_sketch_init(&s, d, p->n), done);
    start_point(c->seed, d, x0);
    st_rng rng = case_stream(c->seed, stream);
    if (split_run)
        rng = st_rng_split(&rng, 0);
    memcpy(x, x0, (size_t)d * sizeof *x);
    ST_TRY_GOTO(st, ist_run(p, &s, kind, ist_gamma, K, &rng, x, y, ist), done);
    double lmax;
    ST_TRY_GOTO(st, st_quad_lambda_max(d, p->L_mean, &lmax), done);
    memcpy(x, x0, (size_t)d * sizeof *x);
    ST_TRY_GOTO(st, gd_run(p, c->gamma / lmax, K, x, y, gd), done);
done:
    st_quad_sketch_free(&s);
    free(buf);
    return st;
}

/* ist_mean[k] = ||E x^k - x*|| of case 2's problem, exactly. */
static st_status trace_mean(const st_quad_config *c, const st_quad_problem *p, double *out)
{
    int d = p->d, K = c->iters;
    size_t dd = (size_t)d * (size_t)d;
    double *A = malloc((dd + 2 * (size_t)d + (size_t)(K + 1) * d) * sizeof *A);
    if (!A)
        return st_fail(ST_ERR_NOMEM, "trace: no memory for the expected iterates");
    double *cv = A + dd, *x0 = cv + d, *m = x0 + d;
    st_status st = st_quad_expected_system(p, ST_QUAD_PRECONDITIONED, A, cv);
    if (st == ST_OK) {
        start_point(c->seed, d, x0);
        expected_iterates(d, A, cv, c->gamma, K, x0, m);
        for (int k = 0; k <= K; k++)
            out[k] = dist2(d, m + (size_t)k * d, p->x_star);
    }
    free(A);
    return st;
}

st_status st_quad_trace_run(const st_quad_config *c, st_quad_trace *out)
{
    memset(out, 0, sizeof *out);
    ST_TRY(check_resolved(c));
    int K = c->iters;
    size_t len = (size_t)K + 1;
    double *all = malloc(5 * len * sizeof *all);
    if (!all)
        return st_fail(ST_ERR_NOMEM, "trace: no memory for %d iterations", K);
    out->iters = K;
    out->ist = all;
    out->ist_mean = all + len;
    out->gd = all + 2 * len;
    out->ist_b0 = all + 3 * len;
    out->gd_b0 = all + 4 * len;

    st_quad_problem *p = NULL;
    st_status st;
    /* Case 2's problem and run 0 of its Monte Carlo runs. */
    ST_TRY_GOTO(st, st_quad_problem_random(c->workers, c->workers, c->seed, 1, &p), fail);
    ST_TRY_GOTO(st, trace_problem(c, p, ST_QUAD_PRECONDITIONED, c->gamma, STREAM_CASE2, 1,
                                  out->ist, out->gd), fail);
    ST_TRY_GOTO(st, trace_mean(c, p, out->ist_mean), fail);
    st_quad_problem_free(p);
    p = NULL;
    /* Case 3's problem and run. */
    ST_TRY_GOTO(st, st_quad_problem_random(c->dim, c->workers, c->seed, 0, &p), fail);
    double lambda;
    ST_TRY_GOTO(st, st_quad_ist_curvature(p, ST_QUAD_PLAIN, &lambda), fail);
    ST_TRY_GOTO(st, trace_problem(c, p, ST_QUAD_PLAIN, c->gamma / lambda, STREAM_CASE3, 0,
                                  out->ist_b0, out->gd_b0), fail);
    st_quad_problem_free(p);
    return ST_OK;
fail:
    st_quad_problem_free(p);
    st_quad_trace_free(out);
    return st;
}

void st_quad_print_csv(FILE *f, const st_quad_trace *t)
{
    fputs("iter,ist,ist_mean,gd,ist_b0,gd_b0\n", f);
    for (int k = 0; k <= t->iters; k++)
        fprintf(f, "%d,%.17g,%.17g,%.17g,%.17g,%.17g\n", k, t->ist[k], t->ist_mean[k], t->gd[k],
                t->ist_b0[k], t->gd_b0[k]);
}

st_status st_quad_write_csv(const char *path, const st_quad_trace *t)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return st_fail(ST_ERR_IO, "cannot open %s for writing: %s", path, strerror(errno));
    st_quad_print_csv(f, t);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad)
        return st_fail(ST_ERR_IO, "writing %s failed: %s", path, strerror(errno));
    return ST_OK;
}

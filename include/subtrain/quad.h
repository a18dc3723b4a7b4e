/*
 * subtrain/quad.h — independent subnetwork training (IST) on quadratics:
 * the exact checks that follow from Shulgin & Richtarik's analysis of IST.
 *
 * One round of IST with one local step is
 *
 *     x+ = x - gamma * (1/n) * sum_i C_i grad f_i(C_i x)
 *
 * with f_i(x) = 1/2 x^T L_i x - b_i^T x and Perm-q sketches: d = q n, a
 * uniform permutation pi of the d coordinates, worker i holds the q
 * coordinates of block i of pi and C_i = n * (projector on them), so that
 * E[C_i] = I.  Preconditioned Perm-1 sketches (q = 1) replace the factor n
 * by sqrt(n) (L_i)_jj^(-1/2) for the coordinate j that worker i holds.
 *
 * Everything is float64 and a pure function of the seed.  Dense algebra is
 * done here, directly (d up to a few hundred): Cholesky for symmetric
 * positive-definite systems, Gaussian elimination with partial pivoting for
 * the rest.  See doc/quad.md for the derivations and the numbers.
 */
#ifndef SUBTRAIN_QUAD_H
#define SUBTRAIN_QUAD_H

#include <stdint.h>
#include <stdio.h>

#include <subtrain/rng.h>
#include <subtrain/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Limits of the problems built here: d, n <= ST_QUAD_MAX_DIM and the n
 * Hessians together at most ST_QUAD_MAX_ELEMS doubles (1 GiB). */
#define ST_QUAD_MAX_DIM 1024
#define ST_QUAD_MAX_ELEMS (1ull << 27)

/* ------------------------------------------------------------ problems */

/* f(x) = (1/n) sum_i f_i(x), f_i(x) = 1/2 x^T L_i x - b_i^T x. */
typedef struct st_quad_problem {
    int d;            /* dimension */
    int n;            /* workers: one f_i each */
    double *L;        /* (n, d, d) row-major: L_i at L + i d d, symmetric PD */
    double *b;        /* (n, d): b_i at b + i d */
    double *L_mean;   /* (d, d) (1/n) sum_i L_i, the Hessian of f */
    double *b_mean;   /* (d) (1/n) sum_i b_i */
    double *x_star;   /* (d) argmin f: L_mean x* = b_mean */
} st_quad_problem;

/* Copies L (n, d, d) and b (n, d; NULL: all zero) into a new problem.
 * Each L_i must be symmetric positive definite (checked by Cholesky). */
st_status st_quad_problem_create(int d, int n, const double *L, const double *b,
                                 st_quad_problem **out);

/* A random heterogeneous problem, a pure function of (d, n, seed):
 * L_i = G_i G_i^T / d + 1/2 I with G_i (d, d) standard normal, and, if
 * with_b, b_i standard normal (else b_i = 0).  L_i does not depend on
 * with_b, so a problem with and one without b share their Hessians. */
st_status st_quad_problem_random(int d, int n, uint64_t seed, int with_b,
                                 st_quad_problem **out);

void st_quad_problem_free(st_quad_problem *p);

/* f(x) and grad f(x) = L_mean x - b_mean (grad may be NULL). */
double st_quad_f(const st_quad_problem *p, const double *x, double *grad);

/* ------------------------------------------------------------ sketches */

typedef enum st_quad_sketch_kind {
    ST_QUAD_PLAIN,            /* C_i = n P_i */
    ST_QUAD_PRECONDITIONED,   /* C_i = sqrt(n) P_i diag(L_i)^(-1/2) */
} st_quad_sketch_kind;

const char *st_quad_sketch_kind_name(st_quad_sketch_kind k);

/* One draw of the n sketches.  C_i is diagonal, nonzero on block i only:
 *     C_i = sum_{p in [i q, (i+1) q)} scale[p] e_coord[p] e_coord[p]^T
 * coord is a permutation of 0..d-1, so every coordinate is held by exactly
 * one worker and sum_i P_i = I. */
typedef struct st_quad_sketch {
    int d, n, q;
    st_quad_sketch_kind kind;
    uint32_t *coord;   /* (d) */
    double *scale;     /* (d) */
} st_quad_sketch;

/* Allocates a sketch for d = q n coordinates; n must divide d. */
st_status st_quad_sketch_init(st_quad_sketch *s, int d, int n);
void st_quad_sketch_free(st_quad_sketch *s);

/* Draws a Perm-q sketch from rng (one uniform permutation).  Preconditioned
 * sketches need the problem (p may be NULL for plain ones) and q = 1. */
st_status st_quad_sketch_perm(st_quad_sketch *s, st_quad_sketch_kind kind,
                              const st_quad_problem *p, st_rng *rng);

/* diag_out (d) = the diagonal of C_i. */
void st_quad_sketch_diag(const st_quad_sketch *s, int worker, double *diag_out);

/* ------------------------------------------------------------ steps */

/* x_next = x - gamma (1/n) sum_i C_i (L_i C_i x - b_i): each worker touches
 * only its q coordinates, O(d q) in all.  x and x_next must not overlap. */
st_status st_quad_ist_step(const st_quad_problem *p, const st_quad_sketch *s, double gamma,
                           const double *x, double *x_next);

/* The sketched direction g = (1/n) sum_i C_i grad f_i(C_i x) alone. */
st_status st_quad_ist_direction(const st_quad_problem *p, const st_quad_sketch *s,
                                const double *x, double *g);

/* x_next = x - gamma (L_mean x - b_mean); x and x_next must not overlap. */
st_status st_quad_gd_step(const st_quad_problem *p, double gamma, const double *x,
                          double *x_next);

/* Random-k, the compressed communication IST is compared with: out =
 * scale * v on k of the d coordinates drawn uniformly without
 * replacement from rng, 0 elsewhere.  With scale d / k, E[out] = v
 * (unbiased; case 6 checks it). */
st_status st_quad_randk(int d, int k, double scale, st_rng *rng, const double *v, double *out);

/* One step of gradient descent with random-k compressed gradients:
 *     x_next = x - eta (1/n) sum_i C_i(grad f_i(x) [+ e_i])
 * C_i random-k of k coordinates; shared: one subset a step for all
 * workers (the trainer's --compress randk), else each worker its own.
 * e NULL: scale d / k (unbiased).  e (n, d): error feedback, scale 1 and
 * e_i keeps what C_i dropped (biased).  scratch: 2 d doubles; x and
 * x_next must not overlap. */
st_status st_quad_randk_step(const st_quad_problem *p, int k, int shared, double eta,
                             st_rng *rng, const double *x, double *e, double *x_next,
                             double *scratch);

/* The expected update over the permutation, exactly:
 *     E[x+] = x - gamma (A x - c),  A = E[(1/n) sum_i C_i L_i C_i],
 *                                   c = E[(1/n) sum_i C_i b_i],
 * A (d, d), c (d), for Perm-q sketches with q = d / n (n must divide d;
 * preconditioned: q = 1).  IST's fixed point in expectation is
 * x_inf = A^-1 c. */
st_status st_quad_expected_system(const st_quad_problem *p, st_quad_sketch_kind kind,
                                  double *A, double *c);

/* x_inf (d) = A^-1 c of st_quad_expected_system. */
st_status st_quad_biased_point(const st_quad_problem *p, st_quad_sketch_kind kind,
                               double *x_inf);

/* A certified bound Lambda on the largest eigenvalue of IST's per-draw
 * Hessian M = (1/n) sum_i C_i L_i C_i over every permutation.  Plain
 * sketches: M is block diagonal with blocks n (L_i) restricted to block i,
 * so Lambda = n max_i min(lambda_max(L_i), max_j (L_i)_jj + the q - 1
 * largest |(L_i)_jk|, k != j) (interlacing; Gershgorin on any q rows), which
 * is exact for q = 1.  Preconditioned Perm-1: M = I, Lambda = 1. */
st_status st_quad_ist_curvature(const st_quad_problem *p, st_quad_sketch_kind kind,
                                double *lambda);

/* ------------------------------------------------------------ dense algebra */

/* Lower Cholesky factor: A = R R^T, R (d, d) row-major lower (upper part
 * zeroed).  ST_ERR_NUMERIC if A is not positive definite. */
st_status st_quad_cholesky(int d, const double *A, double *R);

/* x (d) = A^-1 b by Gaussian elimination with partial pivoting; A is not
 * modified.  ST_ERR_NUMERIC if A is singular to working precision. */
st_status st_quad_solve(int d, const double *A, const double *b, double *x);

/* An upper bound on lambda_max of symmetric A, within about 1e-9 of it:
 * power iteration, then certified by a Cholesky factorisation of tI - A. */
st_status st_quad_lambda_max(int d, const double *A, double *lambda);

/* ------------------------------------------------------------ the cases */

typedef struct st_quad_config {
    int dim;          /* d of cases 3 and 5 and of the b = 0 trace: d = q n */
    int workers;      /* n; cases 1 and 2 use d = n (Perm-1) */
    int q;            /* coordinates per worker in cases 3 and 5 */
                      /* (0: derive from the other two, see resolve) */
    double gamma;     /* relative step in (0, 2), see st_quad_case_2/3 */
    int iters;        /* K */
    int runs;         /* independent sketch sequences averaged in case 2
                       * (and case 6's runs; its mean takes 10 x runs
                       * compressed vectors) */
    double keep;      /* case 6: random-k's fraction of coordinates, (0, 1] */
    uint64_t seed;
    /* Optional, for a progress display: called in cases 2 and 6 after each
     * run (and every 4096 of case 6's compressed vectors) with the count
     * done of the loop's total, the loop named by `what` ("runs",
     * "vectors").  It changes no result.  NULL: not called. */
    void (*progress)(int case_no, const char *what, long done, long total, void *user);
    void *progress_user;
} st_quad_config;

/* dim, workers, q 0 (resolved to 32, 8, 4), gamma 0.5, keep 0.25,
 * iters 500, runs 10000, seed 1. */
st_quad_config st_quad_defaults(void);

/* Completes dim, workers and q (0: not given) so that dim = q workers —
 * from the ones given, the rest from the defaults workers 8, q 4 — and
 * checks everything; ST_ERR_INVALID with a message naming the option
 * otherwise (e.g. workers that do not divide dim). */
st_status st_quad_config_resolve(st_quad_config *c);

/* Each case takes a resolved config (ST_ERR_INVALID otherwise), fills its
 * result struct and touches nothing else; the results are a function of
 * the config alone. */

/* Case 1: preconditioned Perm-1, b_i = 0, gamma = 1, heterogeneous L_i,
 * d = n: one step maps any x to 0. */
typedef struct st_quad_case1 {
    int d, n, draws;
    double identity_err;   /* max over draws of max |(1/n) sum C~_i L_i C~_i - I| */
    double step_rel;       /* max over draws of ||x1|| / ||x0|| */
    double plain_rel;      /* the same with plain Perm-1 at its best scalar step */
} st_quad_case1;
st_status st_quad_case_1(const st_quad_config *c, st_quad_case1 *out);

/* Case 2: preconditioned Perm-1, b_i != 0, d = n, step gamma: IST's
 * expected iterate follows (1-gamma)^k x0 + (1 - (1-gamma)^k) x_inf and
 * x_inf != x*. */
typedef struct st_quad_case2 {
    int d, n, iters, runs;
    double gamma;
    double norm_x_star, norm_x_inf;
    double bias;            /* ||x_inf - x*|| */
    double bias_plain;      /* ||x_inf - x*|| of plain Perm-1 sketches */
    double A_err;           /* max |A - I|: the expected Hessian is I */
    double formula_err;     /* max_k ||E[x^k] - formula_k||, E exact */
    double mc_err;          /* max_k ||mean of runs x^k - formula_k|| / bound_k,
                               bound_k the same bound at iteration k */
    double mc_err_final;    /* ||mean x^K - formula_K|| */
    double mc_bound_final;  /* its bound: Chebyshev, probability 1e-3 */
    double mean_to_x_inf;   /* ||mean x^K - x_inf|| */
    double mean_to_x_star;  /* ||mean x^K - x*|| */
    double tail_to_x_inf;   /* one run, ||average of x^k, k in [K/2, K) - x_inf|| */
    double tail_to_x_star;  /* the same to x* */
} st_quad_case2;
st_status st_quad_case_2(const st_quad_config *c, st_quad_case2 *out);

/* Case 3: b_i = 0 (x* = 0, a fixed point of every draw), heterogeneous L_i,
 * plain Perm-q sketches, step gamma / Lambda with Lambda the bound of
 * st_quad_ist_curvature: converges to x* exactly (linearly). */
typedef struct st_quad_case3 {
    int d, n, q, iters;
    double gamma, step, curvature;
    double fixed_point_err;   /* ||IST step(x*) - x*|| for one draw */
    double err0, err_final;   /* ||x^0 - x*||, ||x^K - x*|| */
    int reach;                /* first k with ||x^k - x*|| <= 1e-10 ||x^0 - x*|| (-1: none) */
    double gd_step, gd_err_final;
    int gd_reach;
} st_quad_case3;
st_status st_quad_case_3(const st_quad_config *c, st_quad_case3 *out);

/* Case 4: L = [[1,5],[5,100]], n = 2, b = 0, plain Perm-1: the sketched
 * direction g = 2 diag(L) x is not always a descent direction. */
typedef struct st_quad_case4 {
    double g_err;          /* max |g - 2 diag(L) x| over both permutations */
    int dirs, negative;    /* unit directions searched, those with <grad f, g> < 0 */
    double x[2];           /* the direction with the most negative cosine */
    double dot;            /* <grad f(x), g(x)> there */
    double cosine;         /* its cosine */
    double lambda_min;     /* of L D + D L: < 0 iff some x has <grad f, g> < 0 */
    double f_rise;         /* f(x - t g) - f(x) for t = 1e-4: f goes up */
    double dot_precond;    /* <grad f(x), g~(x)> with preconditioned sketches: > 0 */
} st_quad_case4;
st_status st_quad_case_4(const st_quad_config *c, st_quad_case4 *out);

/* Case 5: E[C_i] = I: max |mean of C_i over S draws - I| for S = 10^1..
 * against a Bernstein bound holding with probability 1 - 1e-6. */
#define ST_QUAD_CASE5_LEVELS 5
typedef struct st_quad_case5 {
    int d, n, q, levels;
    long samples[ST_QUAD_CASE5_LEVELS];
    double max_dev[ST_QUAD_CASE5_LEVELS];
    double bound[ST_QUAD_CASE5_LEVELS];
    double sum_err;      /* max |sum_i C_i - n I| over all draws: 0 */
} st_quad_case5;
st_status st_quad_case_5(const st_quad_config *c, st_quad_case5 *out);

/* Case 6: IST against compressed communication, on case 2's problem (d =
 * n, b_i != 0, heterogeneous L_i): random-k of k = ceil(keep d)
 * coordinates scaled by d / k is unbiased (the mean of 10 x runs
 * compressions of x0 within a Bernstein bound of x0, probability 1 -
 * 1e-6; unscaled it is off by 1 - k/d), and gradient descent with it at
 * step gamma k / (d lambda_max) converges to x* where IST converges to
 * its biased point: a subset shared by the workers keeps x* a fixed point
 * of every draw; independent subsets converge in expectation (the mean of
 * the runs); error feedback (unscaled, residuals) converges too. */
typedef struct st_quad_case6 {
    int d, n, k, iters, runs;
    double keep, gamma, step;
    long samples;          /* compressions averaged */
    double mean_dev;       /* max_j |mean_j / x0_j - 1| */
    double mean_bound;     /* its Bernstein bound */
    double unscaled_dev;   /* the same draws without the d / k scale */
    double ist_bias;       /* ||x_inf - x*|| of case 2's IST */
    double err0;           /* ||x0 - x*|| */
    double shared_final;   /* one run, a subset shared by the workers: ||x^K - x*|| */
    double ef_final;       /* the same with error feedback */
    double indep_final;    /* one run, a subset per worker */
    double indep_mean;     /* ||mean over the runs of x^K - x*|| */
    double indep_bound;    /* Chebyshev bound of the mean's distance to E x^K, probability
                            * 1 - 1e-3 */
    double gd_final;       /* ||E x^K - x*||: gradient descent at the same step */
} st_quad_case6;
st_status st_quad_case_6(const st_quad_config *c, st_quad_case6 *out);

/* ------------------------------------------------------------ trace / CSV */

/* ||x^k - x*|| for k = 0..K:
 *   ist, ist_mean, gd:   case 2's problem (d = n, b_i != 0); ist is one run
 *                        with preconditioned Perm-1 at step gamma (case 2's
 *                        run 0), ist_mean is ||E x^k - x*|| with E exact,
 *                        gd plain gradient descent at
 *                        its own step gamma / lambda_max(L_mean);
 *   ist_b0, gd_b0:       case 3's problem (b_i = 0), plain Perm-q at
 *                        gamma / Lambda, gradient descent as above. */
typedef struct st_quad_trace {
    int iters;
    double *ist, *ist_mean, *gd, *ist_b0, *gd_b0;   /* (iters + 1) each */
} st_quad_trace;
st_status st_quad_trace_run(const st_quad_config *c, st_quad_trace *out);
void st_quad_trace_free(st_quad_trace *t);

/* Writes the trace as CSV: a header line, then one row per iteration. */
st_status st_quad_write_csv(const char *path, const st_quad_trace *t);
/* The same into an open stream (the caller checks ferror and closes it). */
void st_quad_print_csv(FILE *f, const st_quad_trace *t);

#ifdef __cplusplus
}
#endif
#endif /* SUBTRAIN_QUAD_H */

/*
 * tests/test_quad.c — IST on quadratics (doc/quad.md): the Perm-q
 * sketches, the IST kernel against a dense reference, the exact
 * expectations against enumeration of every permutation, the five cases,
 * determinism from the seed, and the configuration's checks.
 *
 * The command's answers to bad options: tests/test_quad_cmd.c.
 */
#if !defined(_POSIX_C_SOURCE) && !defined(_GNU_SOURCE) && !defined(_DEFAULT_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include <subtrain/quad.h>

/* ------------------------------------------------------------ helpers */

static st_quad_config resolved(int dim, int workers, int q)
{
    st_quad_config c = st_quad_defaults();
    c.dim = dim;
    c.workers = workers;
    c.q = q;
    cr_assert_eq(st_quad_config_resolve(&c), ST_OK, "%s", st_last_error());
    return c;
}

static double max_abs_diff(size_t m, const double *a, const double *b)
{
    double e = 0.0;
    for (size_t k = 0; k < m; k++)
        e = fmax(e, fabs(a[k] - b[k]));
    return e;
}

/* Calls the next permutation of a[0..m) in lexicographic order; 0 after
 * the last. */
static int next_perm(uint32_t *a, int m)
{
    int i = m - 2;
    while (i >= 0 && a[i] >= a[i + 1])
        i--;
    if (i < 0)
        return 0;
    int j = m - 1;
    while (a[j] <= a[i])
        j--;
    uint32_t t = a[i];
    a[i] = a[j];
    a[j] = t;
    for (int l = i + 1, r = m - 1; l < r; l++, r--) {
        t = a[l];
        a[l] = a[r];
        a[r] = t;
    }
    return 1;
}

/* Sets s to permutation `perm` with the scales of `kind`. */
static void set_sketch(st_quad_sketch *s, const uint32_t *perm, st_quad_sketch_kind kind,
                       const st_quad_problem *p)
{
    for (int k = 0; k < s->d; k++) {
        s->coord[k] = perm[k];
        if (kind == ST_QUAD_PLAIN) {
            s->scale[k] = s->n;
        } else {
            double ljj = p->L[(size_t)k * s->d * s->d + (size_t)perm[k] * s->d + perm[k]];
            s->scale[k] = sqrt(s->n / ljj);
        }
    }
    s->kind = kind;
}

/* Dense reference: x - gamma (1/n) sum_i C_i (L_i C_i x - b_i), with every
 * C_i built as a full (d, d) diagonal matrix. */
static void dense_ist_step(const st_quad_problem *p, const st_quad_sketch *s, double gamma,
                           const double *x, double *out)
{
    int d = p->d;
    double *C = malloc((size_t)d * sizeof *C), *y = malloc((size_t)d * sizeof *y);
    double *acc = calloc((size_t)d, sizeof *acc);
    cr_assert(C && y && acc);
    for (int i = 0; i < p->n; i++) {
        st_quad_sketch_diag(s, i, C);
        const double *Li = p->L + (size_t)i * d * d, *bi = p->b + (size_t)i * d;
        for (int j = 0; j < d; j++)
            y[j] = C[j] * x[j];
        for (int j = 0; j < d; j++) {
            double g = -bi[j];
            for (int k = 0; k < d; k++)
                g += Li[(size_t)j * d + k] * y[k];
            acc[j] += C[j] * g / p->n;
        }
    }
    for (int j = 0; j < d; j++)
        out[j] = x[j] - gamma * acc[j];
    free(C);
    free(y);
    free(acc);
}

/* ------------------------------------------------------------ sketches */

Test(quad, perm_sketch_covers_each_coordinate_once_and_is_n_times_a_projector)
{
    const int shapes[][2] = { { 1, 1 }, { 4, 4 }, { 8, 2 }, { 12, 3 }, { 32, 8 }, { 30, 5 } };
    for (size_t t = 0; t < sizeof shapes / sizeof *shapes; t++) {
        int d = shapes[t][0], n = shapes[t][1], q = d / n;
        st_quad_sketch s;
        cr_assert_eq(st_quad_sketch_init(&s, d, n), ST_OK);
        cr_assert_eq(s.q, q);
        st_rng rng = st_rng_seed(7 + t);
        double *diag = malloc((size_t)d * sizeof *diag), *sum = malloc((size_t)d * sizeof *sum);
        int *holders = malloc((size_t)d * sizeof *holders);
        for (int draw = 0; draw < 50; draw++) {
            cr_assert_eq(st_quad_sketch_perm(&s, ST_QUAD_PLAIN, NULL, &rng), ST_OK);
            memset(holders, 0, (size_t)d * sizeof *holders);
            memset(sum, 0, (size_t)d * sizeof *sum);
            for (int i = 0; i < n; i++) {
                st_quad_sketch_diag(&s, i, diag);
                int nonzero = 0;
                for (int j = 0; j < d; j++) {
                    /* C_i = n P_i: entries 0 or n, and (C_i / n)^2 = C_i / n. */
                    cr_assert(diag[j] == 0.0 || diag[j] == n, "entry %g", diag[j]);
                    cr_assert_eq((diag[j] / n) * (diag[j] / n), diag[j] / n);
                    if (diag[j] != 0.0) {
                        nonzero++;
                        holders[j]++;
                    }
                    sum[j] += diag[j];
                }
                cr_assert_eq(nonzero, q, "worker %d holds %d coordinates, want %d", i, nonzero,
                             q);
            }
            for (int j = 0; j < d; j++) {
                cr_assert_eq(holders[j], 1, "coordinate %d held by %d workers", j, holders[j]);
                cr_assert_eq(sum[j], (double)n, "sum_i C_i != n I at %d", j);
            }
        }
        free(diag);
        free(sum);
        free(holders);
        st_quad_sketch_free(&s);
    }
}

Test(quad, every_permutation_is_drawn_and_uniformly)
{
    /* d = 3: 6 permutations; 60000 draws, each count within 6 sigma of
     * 10000 (sigma = sqrt(60000 (1/6)(5/6)) = 91.3). */
    st_quad_sketch s;
    cr_assert_eq(st_quad_sketch_init(&s, 3, 3), ST_OK);
    st_rng rng = st_rng_seed(3);
    int count[6] = { 0 };
    for (int draw = 0; draw < 60000; draw++) {
        cr_assert_eq(st_quad_sketch_perm(&s, ST_QUAD_PLAIN, NULL, &rng), ST_OK);
        int a = (int)s.coord[0], b = (int)s.coord[1];
        count[a * 2 + (b > a ? b - 1 : b)]++;
    }
    for (int k = 0; k < 6; k++)
        cr_assert(fabs(count[k] - 10000.0) < 6 * 91.3, "permutation %d drawn %d times", k,
                  count[k]);
    st_quad_sketch_free(&s);
}

Test(quad, sketch_rejects_bad_shapes_with_messages)
{
    st_quad_sketch s;
    st_clear_error();
    cr_assert_eq(st_quad_sketch_init(&s, 10, 4), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "4 does not divide 10"), "%s", st_last_error());
    cr_assert_eq(st_quad_sketch_init(&s, 0, 1), ST_ERR_INVALID);
    cr_assert_eq(st_quad_sketch_init(&s, 4, 0), ST_ERR_INVALID);

    /* Preconditioned sketches: Perm-1 only, and only for their problem. */
    st_quad_problem *p;
    cr_assert_eq(st_quad_problem_random(8, 4, 1, 0, &p), ST_OK);
    cr_assert_eq(st_quad_sketch_init(&s, 8, 4), ST_OK);
    st_rng rng = st_rng_seed(1);
    cr_assert_eq(st_quad_sketch_perm(&s, ST_QUAD_PRECONDITIONED, p, &rng), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "Perm-1"), "%s", st_last_error());
    cr_assert_eq(st_quad_sketch_perm(&s, ST_QUAD_PRECONDITIONED, NULL, &rng), ST_ERR_INVALID);
    st_quad_sketch_free(&s);
    cr_assert_eq(st_quad_sketch_init(&s, 4, 4), ST_OK);
    cr_assert_eq(st_quad_sketch_perm(&s, ST_QUAD_PLAIN, NULL, &rng), ST_OK);
    double x[8] = { 0 }, y[8];
    cr_assert_eq(st_quad_ist_step(p, &s, 0.5, x, y), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "does not match"), "%s", st_last_error());
    st_quad_sketch_free(&s);
    st_quad_problem_free(p);
}

/* ------------------------------------------------------------ problems, algebra */

Test(quad, problem_create_checks_the_hessians)
{
    st_quad_problem *p = NULL;
    const double nonsym[4] = { 2, 1, 0, 2 }, indefinite[4] = { 1, 2, 2, 1 };
    cr_assert_eq(st_quad_problem_create(2, 1, nonsym, NULL, &p), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "not symmetric"), "%s", st_last_error());
    cr_assert_null(p);
    cr_assert_eq(st_quad_problem_create(2, 1, indefinite, NULL, &p), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "not positive definite"), "%s", st_last_error());
    cr_assert_eq(st_quad_problem_create(0, 1, indefinite, NULL, &p), ST_ERR_INVALID);
    cr_assert_eq(st_quad_problem_random(ST_QUAD_MAX_DIM, ST_QUAD_MAX_DIM, 1, 0, &p),
                 ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "exceed"), "%s", st_last_error());

    /* x* solves L_mean x = b_mean. */
    cr_assert_eq(st_quad_problem_random(12, 3, 5, 1, &p), ST_OK);
    double r[12];
    st_quad_f(p, p->x_star, r);
    for (int j = 0; j < 12; j++)
        cr_assert(fabs(r[j]) < 1e-13, "grad f(x*)_%d = %g", j, r[j]);
    st_quad_problem_free(p);
}

Test(quad, dense_solvers_and_certified_lambda_max)
{
    // A is (3, 3) symmetric positive definite
    const double A[9] = { 2.5, -0.5, 0.0, -0.5, 2.5, 1.0, 0.0, 1.0, 2.0 };
    double R[9], x[3], b[3] = { 1, 2, 3 }, ax[3];
    cr_assert_eq(st_quad_cholesky(3, A, R), ST_OK);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
            double s = 0;
            for (int k = 0; k < 3; k++)
                s += R[i * 3 + k] * R[j * 3 + k];
            cr_assert(fabs(s - A[i * 3 + j]) < 1e-14);
        }
    cr_assert_eq(st_quad_solve(3, A, b, x), ST_OK);
    for (int i = 0; i < 3; i++) {
        ax[i] = 0;
        for (int j = 0; j < 3; j++)
            ax[i] += A[i * 3 + j] * x[j];
    }
    cr_assert(max_abs_diff(3, ax, b) < 1e-14);
    /* Needs a row swap: a zero leading pivot. */
    const double P[4] = { 0, 1, 1, 0 };
    double pb[2] = { 3, 4 }, px[2];
    cr_assert_eq(st_quad_solve(2, P, pb, px), ST_OK);
    cr_assert(px[0] == 4 && px[1] == 3);
    const double S[4] = { 1, 2, 2, 4 };
    cr_assert_eq(st_quad_solve(2, S, pb, px), ST_ERR_NUMERIC);
    cr_assert_eq(st_quad_cholesky(2, S, R), ST_ERR_NUMERIC);

    double lambda;
    cr_assert_eq(st_quad_lambda_max(3, A, &lambda), ST_OK);
    /* By the definition: lambda I - A is positive definite (an upper
     * bound) and (lambda - 1e-7) I - A is not (a tight one). */
    double T[9];
    for (int k = 0; k < 9; k++)
        T[k] = -A[k];
    for (int i = 0; i < 3; i++)
        T[i * 4] += lambda * (1 + 1e-12);
    cr_assert_eq(st_quad_cholesky(3, T, R), ST_OK, "lambda %.17g is not an upper bound", lambda);
    for (int i = 0; i < 3; i++)
        T[i * 4] -= lambda * (1 + 1e-12) - (lambda - 1e-7);
    cr_assert_eq(st_quad_cholesky(3, T, R), ST_ERR_NUMERIC, "lambda %.17g is not tight", lambda);
    const double D[4] = { 3, 0, 0, 7 };
    cr_assert_eq(st_quad_lambda_max(2, D, &lambda), ST_OK);
    cr_assert(lambda >= 7 && lambda < 7 * (1 + 1e-8), "%.17g", lambda);
}

/* ------------------------------------------------------------ IST kernel */

Test(quad, ist_step_matches_the_dense_formula)
{
    const int shapes[][2] = { { 6, 3 }, { 8, 8 }, { 12, 2 }, { 9, 1 } };
    for (size_t t = 0; t < sizeof shapes / sizeof *shapes; t++) {
        int d = shapes[t][0], n = shapes[t][1];
        st_quad_problem *p;
        cr_assert_eq(st_quad_problem_random(d, n, 11 + t, 1, &p), ST_OK);
        st_quad_sketch s;
        cr_assert_eq(st_quad_sketch_init(&s, d, n), ST_OK);
        st_rng rng = st_rng_seed(99);
        double x[12], y[12], ref[12];
        for (int j = 0; j < d; j++)
            x[j] = (double)st_rng_normal(&rng);
        for (int kind = 0; kind < 2; kind++) {
            if (kind == ST_QUAD_PRECONDITIONED && d != n)
                continue;
            for (int draw = 0; draw < 20; draw++) {
                cr_assert_eq(st_quad_sketch_perm(&s, (st_quad_sketch_kind)kind, p, &rng), ST_OK);
                cr_assert_eq(st_quad_ist_step(p, &s, 0.3, x, y), ST_OK);
                dense_ist_step(p, &s, 0.3, x, ref);
                cr_assert(max_abs_diff((size_t)d, y, ref) < 1e-12, "d %d n %d kind %d", d, n,
                          kind);
            }
        }
        cr_assert_eq(st_quad_ist_step(p, &s, 0.3, x, x), ST_ERR_INVALID);
        st_quad_sketch_free(&s);
        st_quad_problem_free(p);
    }
}

Test(quad, gd_step_is_ist_with_one_worker)
{
    st_quad_problem *p;
    cr_assert_eq(st_quad_problem_random(7, 1, 4, 1, &p), ST_OK);
    st_quad_sketch s;
    cr_assert_eq(st_quad_sketch_init(&s, 7, 1), ST_OK);
    st_rng rng = st_rng_seed(4);
    cr_assert_eq(st_quad_sketch_perm(&s, ST_QUAD_PLAIN, NULL, &rng), ST_OK);
    double x[7], a[7], b[7];
    for (int j = 0; j < 7; j++)
        x[j] = j - 3.0;
    cr_assert_eq(st_quad_ist_step(p, &s, 0.2, x, a), ST_OK);
    cr_assert_eq(st_quad_gd_step(p, 0.2, x, b), ST_OK);
    cr_assert(max_abs_diff(7, a, b) < 1e-13);
    st_quad_sketch_free(&s);
    st_quad_problem_free(p);
}

/* ------------------------------------------------------------ expectations */

/* A and c of st_quad_expected_system against the average over all d!
 * permutations. */
static void check_expectation_by_enumeration(int d, int n, st_quad_sketch_kind kind)
{
    st_quad_problem *p;
    cr_assert_eq(st_quad_problem_random(d, n, 21, 1, &p), ST_OK);
    size_t dd = (size_t)d * d;
    double *A = malloc(dd * sizeof *A), *c = malloc((size_t)d * sizeof *c);
    double *EA = calloc(dd, sizeof *EA), *Ec = calloc((size_t)d, sizeof *Ec);
    double *e = calloc((size_t)d, sizeof *e), *g = malloc((size_t)d * sizeof *g);
    double *zero = calloc((size_t)d, sizeof *zero), *EC = calloc(dd, sizeof *EC);
    double *diag = malloc((size_t)d * sizeof *diag);
    cr_assert_eq(st_quad_expected_system(p, kind, A, c), ST_OK);
    st_quad_sketch s;
    cr_assert_eq(st_quad_sketch_init(&s, d, n), ST_OK);
    uint32_t perm[8];
    for (int k = 0; k < d; k++)
        perm[k] = (uint32_t)k;
    long count = 0;
    do {
        set_sketch(&s, perm, kind, p);
        /* g(x) = M x - c(pi): c(pi) = -g(0), column k of M = g(e_k) + c(pi). */
        cr_assert_eq(st_quad_ist_direction(p, &s, zero, g), ST_OK);
        for (int j = 0; j < d; j++)
            Ec[j] -= g[j];
        for (int k = 0; k < d; k++) {
            e[k] = 1.0;
            double *col = malloc((size_t)d * sizeof *col);
            cr_assert_eq(st_quad_ist_direction(p, &s, e, col), ST_OK);
            for (int j = 0; j < d; j++)
                EA[(size_t)j * d + k] += col[j] - g[j];
            free(col);
            e[k] = 0.0;
        }
        for (int i = 0; i < n; i++) {
            st_quad_sketch_diag(&s, i, diag);
            for (int j = 0; j < d; j++)
                EC[(size_t)i * d + j] += diag[j];
        }
        count++;
    } while (next_perm(perm, d));
    for (size_t k = 0; k < dd; k++)
        EA[k] /= count;
    for (int j = 0; j < d; j++)
        Ec[j] /= count;
    /* Rounding of the d! terms: relative to the entries' size. */
    double big = 1.0;
    for (size_t k = 0; k < dd; k++)
        big = fmax(big, fabs(A[k]));
    cr_assert(max_abs_diff(dd, A, EA) < 1e-13 * big, "A differs by %g (d %d n %d kind %d)",
              max_abs_diff(dd, A, EA), d, n, kind);
    cr_assert(max_abs_diff((size_t)d, c, Ec) < 1e-13 * big, "c differs (d %d n %d kind %d)", d,
              n, kind);
    if (kind == ST_QUAD_PLAIN)
        /* Exact unbiasedness: the average of C_i over all permutations is I. */
        for (int i = 0; i < n; i++)
            for (int j = 0; j < d; j++)
                cr_assert(fabs(EC[(size_t)i * d + j] / count - 1.0) < 1e-14);
    st_quad_sketch_free(&s);
    free(A), free(c), free(EA), free(Ec), free(e), free(g), free(zero), free(EC), free(diag);
    st_quad_problem_free(p);
}

Test(quad, expected_system_equals_the_average_over_all_permutations)
{
    check_expectation_by_enumeration(6, 3, ST_QUAD_PLAIN);
    check_expectation_by_enumeration(6, 2, ST_QUAD_PLAIN);
    check_expectation_by_enumeration(6, 6, ST_QUAD_PLAIN);
    check_expectation_by_enumeration(7, 1, ST_QUAD_PLAIN);
    check_expectation_by_enumeration(5, 5, ST_QUAD_PRECONDITIONED);
    check_expectation_by_enumeration(8, 8, ST_QUAD_PRECONDITIONED);
}

Test(quad, identical_l_and_b_with_preconditioning_is_still_biased)
{
    /* doc/quad.md: with L_i = L, b_i = b, preconditioned Perm-1 gives
     * x+ = (1 - gamma) x + gamma n^-1/2 D^-1/2 b, whose fixed point is not
     * L^-1 b unless L is diagonal. */
    int n = 6;
    st_quad_problem *one;
    cr_assert_eq(st_quad_problem_random(n, 1, 8, 1, &one), ST_OK);
    double *L = malloc((size_t)n * n * n * sizeof *L), *b = malloc((size_t)n * n * sizeof *b);
    for (int i = 0; i < n; i++) {
        memcpy(L + (size_t)i * n * n, one->L, (size_t)n * n * sizeof *L);
        memcpy(b + (size_t)i * n, one->b, (size_t)n * sizeof *b);
    }
    st_quad_problem *p;
    cr_assert_eq(st_quad_problem_create(n, n, L, b, &p), ST_OK);
    double x_inf[6];
    cr_assert_eq(st_quad_biased_point(p, ST_QUAD_PRECONDITIONED, x_inf), ST_OK);
    double gap = 0.0;
    for (int j = 0; j < n; j++) {
        double want = b[j] / sqrt(n * L[(size_t)j * n + j]);
        cr_assert(fabs(x_inf[j] - want) < 1e-14, "x_inf_%d %g want %g", j, x_inf[j], want);
        gap += (x_inf[j] - p->x_star[j]) * (x_inf[j] - p->x_star[j]);
    }
    cr_assert(sqrt(gap) > 0.1, "||x_inf - x*|| = %g", sqrt(gap));
    free(L);
    free(b);
    st_quad_problem_free(one);
    st_quad_problem_free(p);
}

/* ------------------------------------------------------------ the cases */

Test(quad, case1_preconditioned_perm1_reaches_zero_in_one_step)
{
    const int workers[] = { 1, 2, 3, 8, 33 };
    for (size_t t = 0; t < sizeof workers / sizeof *workers; t++) {
        st_quad_config c = resolved(0, workers[t], 1);
        st_quad_case1 r;
        cr_assert_eq(st_quad_case_1(&c, &r), ST_OK, "%s", st_last_error());
        cr_assert_eq(r.d, workers[t]);
        cr_assert(r.identity_err < 1e-12, "n %d: |M - I| = %g", workers[t], r.identity_err);
        cr_assert(r.step_rel < 1e-12, "n %d: ||x1||/||x0|| = %g", workers[t], r.step_rel);
        /* Without the preconditioner no step does it (n > 1: the L_ii differ). */
        if (workers[t] > 1)
            cr_assert(r.plain_rel > 1e-3, "n %d: plain %g", workers[t], r.plain_rel);
    }
}

/* The contrast of case 1, by value.  Plain Perm-1 (C_i = n P_i) with b = 0
 * is x+_j = (1 - gamma n l_j) x_j, l_j the (j, j) entry of its holder's
 * L_i; at the case's step 2 / (n (l_min + l_max)) the factors are
 * 1 - 2 l_j / (l_min + l_max).  With n = 2 both have the magnitude
 * (l_max - l_min) / (l_max + l_min), whatever x0: each of the two
 * permutations has its value, computed here from the problem, and
 * plain_rel (the largest over the draws) must be one of them.  For
 * larger n that is the most any draw can leave: every factor lies within
 * it, so plain_rel cannot exceed it over all the (j, j) entries. */
static double plain_factor(double a, double b)
{
    return fabs(a - b) / (a + b);
}

Test(quad, case1_plain_perm1_leaves_what_its_best_step_leaves)
{
    for (uint64_t seed = 1; seed <= 5; seed++) {
        st_quad_config c = resolved(0, 2, 1);
        c.seed = seed;
        st_quad_case1 r;
        cr_assert_eq(st_quad_case_1(&c, &r), ST_OK, "%s", st_last_error());
        st_quad_problem *p;
        cr_assert_eq(st_quad_problem_random(2, 2, seed, 0, &p), ST_OK, "%s", st_last_error());
        /* L_i at L + 4 i; worker i holds coordinate perm[i] */
        double id = plain_factor(p->L[0 + 0], p->L[4 + 3]);    /* L_0[0,0], L_1[1,1] */
        double swap = plain_factor(p->L[0 + 3], p->L[4 + 0]);  /* L_0[1,1], L_1[0,0] */
        st_quad_problem_free(p);
        cr_assert(fabs(r.plain_rel - id) < 1e-12 * id || fabs(r.plain_rel - swap) < 1e-12 * swap,
                  "seed %llu: plain %.15g, but the permutations leave %.15g and %.15g",
                  (unsigned long long)seed, r.plain_rel, id, swap);
    }
    const int workers[] = { 3, 8 };
    for (size_t t = 0; t < sizeof workers / sizeof *workers; t++) {
        int n = workers[t];
        st_quad_config c = resolved(0, n, 1);
        st_quad_case1 r;
        cr_assert_eq(st_quad_case_1(&c, &r), ST_OK, "%s", st_last_error());
        st_quad_problem *p;
        cr_assert_eq(st_quad_problem_random(n, n, c.seed, 0, &p), ST_OK, "%s", st_last_error());
        double lo = INFINITY, hi = 0.0;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) {
                double l = p->L[(size_t)i * n * n + (size_t)j * n + j];
                lo = fmin(lo, l);
                hi = fmax(hi, l);
            }
        st_quad_problem_free(p);
        cr_assert(r.plain_rel <= plain_factor(lo, hi) * (1 + 1e-12),
                  "n %d: plain %.15g exceeds %.15g", n, r.plain_rel, plain_factor(lo, hi));
    }
}

Test(quad, case2_heterogeneous_b_converges_to_a_biased_point)
{
    st_quad_config c = resolved(0, 8, 1);
    c.iters = 60;
    c.runs = 20000;
    st_quad_case2 r;
    cr_assert_eq(st_quad_case_2(&c, &r), ST_OK, "%s", st_last_error());
    /* The expected Hessian is exactly I, and the paper's formula is the
     * exact expectation. */
    cr_assert(r.A_err < 1e-12, "%g", r.A_err);
    cr_assert(r.formula_err < 1e-12, "%g", r.formula_err);
    /* The bias is real: a sizeable fraction of ||x*||, and more than twice
     * the Monte Carlo bound, so that a mean within the bound of x_inf is
     * farther than the bound from x*. */
    cr_assert(r.bias > 0.1 * r.norm_x_star, "bias %g, ||x*|| %g", r.bias, r.norm_x_star);
    cr_assert(r.bias > 2 * r.mc_bound_final, "bias %g, bound %g", r.bias, r.mc_bound_final);
    cr_assert(r.bias_plain > 0.1 * r.norm_x_star, "plain bias %g", r.bias_plain);
    /* The average of the runs follows the formula within its bound (at K,
     * and at every k, a per-iteration bound)... */
    cr_assert(r.mc_err_final <= r.mc_bound_final, "%g > %g", r.mc_err_final, r.mc_bound_final);
    cr_assert(r.mc_err <= 1.0, "error / bound reaches %g", r.mc_err);
    /* ...so it approaches x_inf, not x*. */
    cr_assert(r.mean_to_x_inf <= r.mc_bound_final);
    cr_assert(r.mean_to_x_star > r.mc_bound_final, "%g", r.mean_to_x_star);
    /* (One run's tail average, r.tail_to_*, is printed but not asserted:
     * over 30 correlated iterates it is too noisy for a bound.) */
}

Test(quad, case2_holds_for_other_seeds_and_steps)
{
    const double gammas[] = { 0.1, 1.0, 1.5 };
    for (int t = 0; t < 3; t++) {
        st_quad_config c = resolved(0, 5, 1);
        c.gamma = gammas[t];
        c.iters = 40;
        c.runs = 20000;
        c.seed = 1000 + (uint64_t)t;
        st_quad_case2 r;
        cr_assert_eq(st_quad_case_2(&c, &r), ST_OK, "%s", st_last_error());
        cr_assert(r.formula_err < 1e-12);
        cr_assert(r.mc_err_final <= r.mc_bound_final, "gamma %g", gammas[t]);
        cr_assert(r.mc_err <= 1.0, "gamma %g: error / bound reaches %g", gammas[t], r.mc_err);
        cr_assert(r.bias > 0.1 * r.norm_x_star, "gamma %g: bias %g", gammas[t], r.bias);
    }
}

Test(quad, case3_zero_b_converges_to_x_star_exactly)
{
    const int shapes[][2] = { { 8, 8 }, { 16, 4 }, { 32, 8 }, { 24, 3 } };
    for (size_t t = 0; t < sizeof shapes / sizeof *shapes; t++) {
        st_quad_config c = resolved(shapes[t][0], shapes[t][1], 0);
        c.iters = 600;
        st_quad_case3 r;
        cr_assert_eq(st_quad_case_3(&c, &r), ST_OK, "%s", st_last_error());
        cr_assert_eq(r.fixed_point_err, 0.0);
        cr_assert(r.err_final <= 1e-10, "d %d n %d: ||x^K - x*|| = %g", r.d, r.n, r.err_final);
        cr_assert(r.err_final <= 1e-10 * r.err0);
        cr_assert(r.reach > 0 && r.reach <= c.iters);
        cr_assert(r.gd_err_final <= 1e-10);
    }
}

Test(quad, case4_sketched_direction_is_not_a_descent_direction)
{
    st_quad_config c = resolved(0, 0, 0);
    st_quad_case4 r;
    cr_assert_eq(st_quad_case_4(&c, &r), ST_OK, "%s", st_last_error());
    cr_assert(r.g_err < 1e-12, "g != 2 diag(L) x by %g", r.g_err);
    cr_assert_gt(r.negative, 0);
    cr_assert_lt(r.dot, 0.0);
    cr_assert_lt(r.cosine, 0.0);
    /* The grid minimum of x^T (LD + DL) x over unit x is at least lambda_min
     * and close to it; lambda_min = 10101 - sqrt(9999^2 + 505^2). */
    double lmin = 10001.0 - sqrt(9999.0 * 9999.0 + 505.0 * 505.0);
    cr_assert(fabs(r.lambda_min - lmin) < 1e-9, "%.12g vs %.12g", r.lambda_min, lmin);
    cr_assert(r.dot >= r.lambda_min - 1e-9 && r.dot <= 0.95 * r.lambda_min, "%g", r.dot);
    /* The inner product at the point found, recomputed from scratch. */
    double x0 = r.x[0], x1 = r.x[1];
    double dot = (x0 + 5 * x1) * 2 * x0 + (5 * x0 + 100 * x1) * 200 * x1;
    cr_assert(fabs(dot - r.dot) < 1e-9);
    cr_assert_gt(r.f_rise, 0.0);
    cr_assert_gt(r.dot_precond, 0.0);
}

Test(quad, case5_perm_sketches_are_unbiased_within_a_bernstein_bound)
{
    const int shapes[][2] = { { 32, 8 }, { 12, 12 }, { 10, 2 } };
    for (size_t t = 0; t < sizeof shapes / sizeof *shapes; t++) {
        st_quad_config c = resolved(shapes[t][0], shapes[t][1], 0);
        c.seed = 77 + t;
        st_quad_case5 r;
        cr_assert_eq(st_quad_case_5(&c, &r), ST_OK, "%s", st_last_error());
        cr_assert_eq(r.sum_err, 0.0);
        for (int l = 0; l < r.levels; l++) {
            cr_assert(r.max_dev[l] <= r.bound[l], "S = %ld: %g > bound %g", r.samples[l],
                      r.max_dev[l], r.bound[l]);
            if (l > 0)
                cr_assert_lt(r.bound[l], r.bound[l - 1]);
        }
        /* 10^5 draws: the deviation shrank like 1/sqrt(S). */
        cr_assert(r.max_dev[r.levels - 1] < 0.1 * r.max_dev[0], "%g vs %g",
                  r.max_dev[r.levels - 1], r.max_dev[0]);
    }
}

/* ------------------------------------------------------------ case 6 */

/* One compression keeps exactly k coordinates, each scale times its
 * value, the others 0; k = d keeps v scaled. */
Test(quad, randk_keeps_k_coordinates_scaled)
{
    double v[10], out[10];
    for (int j = 0; j < 10; j++)
        v[j] = j + 1.0;
    st_rng rng = st_rng_seed(5);
    for (int k = 1; k <= 10; k++)
        for (int t = 0; t < 50; t++) {
            cr_assert_eq(st_quad_randk(10, k, 10.0 / k, &rng, v, out), ST_OK);
            int kept = 0;
            for (int j = 0; j < 10; j++) {
                kept += out[j] != 0.0;
                cr_assert(out[j] == 0.0 || out[j] == v[j] * (10.0 / k), "%g", out[j]);
            }
            cr_assert_eq(kept, k);
        }
    cr_assert_eq(st_quad_randk(10, 11, 1.0, &rng, v, out), ST_ERR_INVALID);
    cr_assert_eq(st_quad_randk(10, 0, 1.0, &rng, v, out), ST_ERR_INVALID);
}

/* E[C(v)] = v: the mean of 10 x runs compressions of x0 (fixed seed)
 * is within Bernstein's bound (probability 1 - 1e-6) of x0 for every
 * coordinate, at Q = 1/4, 1/2, 1/3 (k not dividing d) and 1; the same
 * draws without the d / k scale miss it by 1 - k / d, far outside. */
Test(quad, case6_randk_is_unbiased_within_a_bernstein_bound, .timeout = 60)
{
    const double keeps[] = { 0.25, 0.5, 1.0 / 3.0, 1.0 };
    for (size_t t = 0; t < sizeof keeps / sizeof *keeps; t++) {
        st_quad_config c = resolved(0, 12, 1);
        c.keep = keeps[t];
        c.runs = 4000;
        c.iters = 5;
        st_quad_case6 r;
        cr_assert_eq(st_quad_case_6(&c, &r), ST_OK, "%s", st_last_error());
        cr_assert_eq(r.samples, 40000);
        cr_log_info("keep %.3f (k = %d of %d): mean off by %.5f, bound %.5f, unscaled %.5f",
                    c.keep, r.k, r.d, r.mean_dev, r.mean_bound, r.unscaled_dev);
        cr_assert_leq(r.mean_dev, r.mean_bound, "keep %g: the mean is %g from x0 (relative), "
                      "beyond the bound %g", c.keep, r.mean_dev, r.mean_bound);
        if (r.k < r.d) {
            cr_assert_gt(r.unscaled_dev, 4 * r.mean_bound, "keep %g", c.keep);
            cr_assert_leq(fabs(r.unscaled_dev - (1.0 - (double)r.k / r.d)), r.mean_bound);
        } else {
            cr_assert_eq(r.mean_dev, 0.0);
        }
    }
}

/* On case 2's problem IST converges to x_inf, 0.38 from x*; random-k
 * gradient descent reaches x* (a shared subset: every run, x* a fixed
 * point of every draw; with error feedback too); with a subset per worker
 * one run keeps a spread at x* but the mean of the runs is within
 * Chebyshev's bound of gradient descent's iterate, itself at x*. */
Test(quad, case6_randk_descent_reaches_x_star_where_ist_is_biased, .timeout = 60)
{
    st_quad_config c = resolved(0, 8, 1);
    c.runs = 2000;
    c.iters = 400;
    st_quad_case6 r;
    cr_assert_eq(st_quad_case_6(&c, &r), ST_OK, "%s", st_last_error());
    cr_assert_gt(r.ist_bias, 0.1, "%g", r.ist_bias);
    cr_assert_leq(r.shared_final, 1e-9 * r.err0, "%g of %g", r.shared_final, r.err0);
    cr_assert_leq(r.ef_final, 1e-9 * r.err0, "%g of %g", r.ef_final, r.err0);
    cr_assert_leq(r.gd_final, 1e-9 * r.err0, "%g", r.gd_final);
    cr_assert_gt(r.indep_final, 10 * r.shared_final, "a subset per worker converged exactly?");
    cr_assert_leq(r.indep_mean, r.gd_final + r.indep_bound, "%g > %g + %g", r.indep_mean,
                  r.gd_final, r.indep_bound);
    cr_assert_lt(r.indep_bound, r.ist_bias / 2, "%g", r.indep_bound);
    c.keep = 0.0;
    cr_assert_eq(st_quad_config_resolve(&c), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "keep"), "%s", st_last_error());
}

/* ------------------------------------------------------------ determinism */

Test(quad, results_are_a_function_of_the_seed)
{
    st_quad_problem *a, *b, *other;
    cr_assert_eq(st_quad_problem_random(9, 3, 42, 1, &a), ST_OK);
    cr_assert_eq(st_quad_problem_random(9, 3, 42, 1, &b), ST_OK);
    cr_assert_eq(st_quad_problem_random(9, 3, 43, 1, &other), ST_OK);
    cr_assert_eq(memcmp(a->L, b->L, 3 * 81 * sizeof *a->L), 0);
    cr_assert_eq(memcmp(a->b, b->b, 27 * sizeof *a->b), 0);
    cr_assert_neq(memcmp(a->L, other->L, 3 * 81 * sizeof *a->L), 0);
    st_quad_problem_free(a);
    st_quad_problem_free(b);
    st_quad_problem_free(other);
    /* Adding b_i does not change L_i. */
    cr_assert_eq(st_quad_problem_random(9, 3, 42, 0, &a), ST_OK);
    cr_assert_eq(st_quad_problem_random(9, 3, 42, 1, &b), ST_OK);
    cr_assert_eq(memcmp(a->L, b->L, 3 * 81 * sizeof *a->L), 0);
    st_quad_problem_free(a);
    st_quad_problem_free(b);

    st_quad_config c = resolved(0, 6, 2);
    c.iters = 50;
    c.runs = 200;
    st_quad_case2 r1, r2, r3;
    cr_assert_eq(st_quad_case_2(&c, &r1), ST_OK);
    cr_assert_eq(st_quad_case_2(&c, &r2), ST_OK);
    cr_assert_eq(memcmp(&r1, &r2, sizeof r1), 0, "case 2 is not reproducible");
    c.seed = 2;
    cr_assert_eq(st_quad_case_2(&c, &r3), ST_OK);
    cr_assert_neq(r1.bias, r3.bias);

    c.seed = 1;
    st_quad_trace t1, t2;
    cr_assert_eq(st_quad_trace_run(&c, &t1), ST_OK);
    cr_assert_eq(st_quad_trace_run(&c, &t2), ST_OK);
    cr_assert_eq(memcmp(t1.ist, t2.ist, (size_t)(c.iters + 1) * sizeof *t1.ist), 0);
    cr_assert_eq(memcmp(t1.ist_b0, t2.ist_b0, (size_t)(c.iters + 1) * sizeof *t1.ist), 0);
    st_quad_trace_free(&t1);
    st_quad_trace_free(&t2);
}

Test(quad, trace_shows_ist_stalling_at_its_bias_and_gd_converging)
{
    st_quad_config c = resolved(0, 0, 0);
    c.iters = 300;
    st_quad_trace t;
    cr_assert_eq(st_quad_trace_run(&c, &t), ST_OK, "%s", st_last_error());
    st_quad_case2 r;
    c.runs = 2;
    cr_assert_eq(st_quad_case_2(&c, &r), ST_OK);
    int K = t.iters;
    cr_assert(fabs(t.ist_mean[K] - r.bias) < 1e-12, "%g vs %g", t.ist_mean[K], r.bias);
    cr_assert(t.gd[K] < 1e-10, "%g", t.gd[K]);
    cr_assert(t.ist[K] > 0.1 * r.bias, "%g", t.ist[K]);
    cr_assert(t.ist_b0[K] < 1e-10 && t.gd_b0[K] < 1e-10);

    char path[] = "/tmp/subtrain-quad-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    cr_assert_eq(st_quad_write_csv(path, &t), ST_OK);
    FILE *f = fopen(path, "r");
    char line[512];
    cr_assert(fgets(line, sizeof line, f));
    cr_assert_str_eq(line, "iter,ist,ist_mean,gd,ist_b0,gd_b0\n");
    int rows = 0;
    while (fgets(line, sizeof line, f))
        rows++;
    fclose(f);
    unlink(path);
    cr_assert_eq(rows, K + 1);
    st_quad_trace_free(&t);
    cr_assert_eq(st_quad_write_csv("/nonexistent-dir/x.csv", &t), ST_ERR_IO);
}

/* ------------------------------------------------------------ options */

Test(quad, config_resolution_and_rejections)
{
    st_quad_config c = resolved(0, 0, 0);
    cr_assert(c.dim == 32 && c.workers == 8 && c.q == 4);
    c = resolved(12, 3, 0);
    cr_assert_eq(c.q, 4);
    c = resolved(12, 0, 6);
    cr_assert_eq(c.workers, 2);
    c = resolved(0, 5, 3);
    cr_assert_eq(c.dim, 15);

    struct { int dim, workers, q; double gamma; int iters, runs; const char *msg; } bad[] = {
        { 10, 4, 0, 0.5, 10, 10, "4 does not divide 10" },
        { 10, 0, 0, 0.5, 10, 10, "not a multiple" },
        { 10, 0, 3, 0.5, 10, 10, "3 does not divide 10" },
        { 12, 4, 2, 0.5, 10, 10, "12 != 2 x 4" },
        { 0, 4, 0, 0.0, 10, 10, "gamma" },
        { 0, 4, 0, 2.0, 10, 10, "gamma" },
        { 0, 4, 0, NAN, 10, 10, "gamma" },
        { 0, 4, 0, 0.5, 0, 10, "iters" },
        { 0, 4, 0, 0.5, 10, 1, "runs" },
        { 0, 600, 1, 0.5, 10, 10, "doubles" },
        { 0, 512, 4, 0.5, 10, 10, "exceeds" },
    };
    for (size_t t = 0; t < sizeof bad / sizeof *bad; t++) {
        c = st_quad_defaults();
        c.dim = bad[t].dim;
        c.workers = bad[t].workers;
        c.q = bad[t].q;
        c.gamma = bad[t].gamma;
        c.iters = bad[t].iters;
        c.runs = bad[t].runs;
        st_clear_error();
        cr_assert_eq(st_quad_config_resolve(&c), ST_ERR_INVALID, "case %zu accepted", t);
        cr_assert(strstr(st_last_error(), bad[t].msg), "case %zu: '%s' lacks '%s'", t,
                  st_last_error(), bad[t].msg);
    }
    /* An unresolved config is refused by the cases. */
    c = st_quad_defaults();
    st_quad_case1 r;
    cr_assert_eq(st_quad_case_1(&c, &r), ST_ERR_INVALID);
}

/*
 * quad/linalg.c — the small dense algebra of the quadratic experiments.
 *
 * d is at most a few hundred, so plain O(d^3) loops in float64 are enough;
 * what matters is that each result is exact to working precision and that a
 * failure (not positive definite, singular) is reported, never hidden.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/quad.h>

#include "core/error.h"

st_status st_quad_cholesky(int d, const double *A, double *R)
{
    // A, R are (d, d) row-major; R lower triangular with A = R R^T
    if (d <= 0)
        return st_fail(ST_ERR_INVALID, "cholesky: dimension must be > 0, got %d", d);
    memset(R, 0, (size_t)d * (size_t)d * sizeof *R);
    for (int j = 0; j < d; j++) {
        double s = A[(size_t)j * d + j];
        for (int k = 0; k < j; k++)
            s -= R[(size_t)j * d + k] * R[(size_t)j * d + k];
        /* `!(s > 0)` also catches NaN: a NaN pivot is no more definite. */
        if (!(s > 0.0))
            return st_fail(ST_ERR_NUMERIC,
                           "matrix is not positive definite (pivot %d is %g)", j, s);
        double rjj = sqrt(s);
        R[(size_t)j * d + j] = rjj;
        for (int i = j + 1; i < d; i++) {
            double t = A[(size_t)i * d + j];
            for (int k = 0; k < j; k++)
                t -= R[(size_t)i * d + k] * R[(size_t)j * d + k];
            R[(size_t)i * d + j] = t / rjj;
        }
    }
    return ST_OK;
}

st_status st_quad_solve(int d, const double *A, const double *b, double *x)
{
    // A (d, d) row-major, b (d), x (d); works on a copy [A | b] of (d, d + 1)
    if (d <= 0)
        return st_fail(ST_ERR_INVALID, "solve: dimension must be > 0, got %d", d);
    size_t w = (size_t)d + 1;
    double *M = malloc((size_t)d * w * sizeof *M);
    if (!M)
        return st_fail(ST_ERR_NOMEM, "solve: no memory for a %dx%d system", d, d);
    double scale = 0.0;
    for (int i = 0; i < d; i++) {
        memcpy(M + i * w, A + (size_t)i * d, (size_t)d * sizeof *M);
        M[i * w + (size_t)d] = b[i];
        for (int j = 0; j < d; j++)
            scale = fmax(scale, fabs(A[(size_t)i * d + j]));
    }
    /* A pivot below d eps max|A| means the matrix is singular to working
     * precision: the answer would be noise, so refuse it. */
    double tiny = (double)d * 2.220446049250313e-16 * scale;
    for (int k = 0; k < d; k++) {
        int piv = k;
        for (int i = k + 1; i < d; i++)
            if (fabs(M[i * w + k]) > fabs(M[piv * w + k]))
                piv = i;
        if (!(fabs(M[piv * w + k]) > tiny)) {
            free(M);
            return st_fail(ST_ERR_NUMERIC, "solve: matrix is singular (column %d)", k);
        }
        if (piv != k)
            for (size_t j = 0; j < w; j++) {
                double t = M[k * w + j];
                M[k * w + j] = M[piv * w + j];
                M[piv * w + j] = t;
            }
        for (int i = k + 1; i < d; i++) {
            double f = M[i * w + k] / M[k * w + k];
            if (f == 0.0)
                continue;
            for (size_t j = (size_t)k; j < w; j++)
                M[i * w + j] -= f * M[k * w + j];
        }
    }
    for (int i = d - 1; i >= 0; i--) {
        double s = M[i * w + (size_t)d];
        for (int j = i + 1; j < d; j++)
            s -= M[i * w + j] * x[j];
        x[i] = s / M[i * w + i];
    }
    free(M);
    return ST_OK;
}

/* Largest absolute row sum: Gershgorin's bound, tI - A is positive definite
 * for any t above it (strict diagonal dominance). */
static double gershgorin(int d, const double *A)
{
    double g = 0.0;
    for (int i = 0; i < d; i++) {
        double s = 0.0;
        for (int j = 0; j < d; j++)
            s += fabs(A[(size_t)i * d + j]);
        g = fmax(g, s);
    }
    return g;
}

/* Power iteration from a fixed start vector: a lower estimate of
 * lambda_max of symmetric PSD A (Rayleigh quotient).  v, w are (d). */
static double power_estimate(int d, const double *A, double *v, double *w)
{
    /* Not all ones: a start orthogonal to the top eigenvector would stall;
     * the certification below makes the result safe either way. */
    for (int i = 0; i < d; i++)
        v[i] = 1.0 + (double)i / (double)d;
    double lambda = 0.0;
    for (int it = 0; it < 2000; it++) {
        double nv = 0.0;
        for (int i = 0; i < d; i++)
            nv += v[i] * v[i];
        nv = sqrt(nv);
        if (nv == 0.0)
            return 0.0;
        for (int i = 0; i < d; i++)
            v[i] /= nv;
        double rq = 0.0;
        for (int i = 0; i < d; i++) {
            double s = 0.0;
            for (int j = 0; j < d; j++)
                s += A[(size_t)i * d + j] * v[j];
            w[i] = s;
            rq += v[i] * s;
        }
        memcpy(v, w, (size_t)d * sizeof *v);
        if (it > 10 && fabs(rq - lambda) <= 1e-14 * fabs(rq)) {
            lambda = rq;
            break;
        }
        lambda = rq;
    }
    return lambda;
}

st_status st_quad_lambda_max(int d, const double *A, double *lambda)
{
    if (d <= 0)
        return st_fail(ST_ERR_INVALID, "lambda_max: dimension must be > 0, got %d", d);
    size_t dd = (size_t)d * (size_t)d;
    double *v = malloc((2 * (size_t)d + 2 * dd) * sizeof *v);
    if (!v)
        return st_fail(ST_ERR_NOMEM, "lambda_max: no memory for d = %d", d);
    double *w = v + d, *T = w + d, *R = T + dd;
    double cap = gershgorin(d, A);
    double est = power_estimate(d, A, v, w);
    /* Certify: t is an upper bound iff tI - A is positive definite.  Widen
     * the margin geometrically; Gershgorin's bound ends the search. */
    double margin = 1e-9;
    double t = fmax(est, 0.0) * (1.0 + margin) + 1e-300;
    for (;;) {
        if (t >= cap) {
            t = cap * (1.0 + 1e-15) + 1e-300;
            break;
        }
        memset(T, 0, dd * sizeof *T);
        for (size_t k = 0; k < dd; k++)
            T[k] = -A[k];
        for (int i = 0; i < d; i++)
            T[(size_t)i * d + i] += t;
        if (st_quad_cholesky(d, T, R) == ST_OK)
            break;
        margin *= 16.0;
        t = fmax(est, 0.0) * (1.0 + margin) + 1e-300;
    }
    st_clear_error(); /* the failed trials above are not failures */
    free(v);
    *lambda = t;
    return ST_OK;
}

/*
 * quad/quad.c — quadratic problems, Perm-q sketches and the IST and GD
 * steps on them, for the exact checks of doc/quad.md.
 *
 * A sketch is stored as what each worker actually holds: its q coordinates
 * and their scales.  The IST step then costs what IST costs — worker i
 * reads and writes only its own coordinates, O(q^2) each — and the
 * "(1/n) sum_i" is a disjoint write-back, not a reduction, exactly as the
 * IST papers describe the round.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/quad.h>

#include "core/enum_table.h"
#include "core/error.h"

/* Stream ids under the problem's root: each quantity has its own stream,
 * so adding b_i does not change L_i. */
enum { STREAM_L = 1, STREAM_B = 2 };

/* Diagonal shift of the random Hessians: L_i = G G^T / d + SHIFT I keeps
 * every L_i's smallest eigenvalue at least SHIFT (condition numbers stay
 * near 10), so the experiments test the method, not the conditioning. */
#define SHIFT 0.5

/* ------------------------------------------------------------ problems */

static st_status check_sizes(int d, int n)
{
    if (d < 1 || d > ST_QUAD_MAX_DIM)
        return st_fail(ST_ERR_INVALID, "dimension must be in [1, %d], got %d", ST_QUAD_MAX_DIM,
                       d);
    if (n < 1 || n > ST_QUAD_MAX_DIM)
        return st_fail(ST_ERR_INVALID, "workers must be in [1, %d], got %d", ST_QUAD_MAX_DIM,
                       n);
    if ((unsigned long long)n * (unsigned long long)d * (unsigned long long)d >
        ST_QUAD_MAX_ELEMS)
        return st_fail(ST_ERR_INVALID,
                       "%d Hessians of size %dx%d exceed the limit of %llu doubles", n, d, d,
                       (unsigned long long)ST_QUAD_MAX_ELEMS);
    return ST_OK;
}

static st_status problem_alloc(int d, int n, st_quad_problem **out)
{
    *out = NULL;
    st_quad_problem *p = calloc(1, sizeof *p);
    if (!p)
        return st_fail(ST_ERR_NOMEM, "no memory for a quadratic problem");
    size_t dd = (size_t)d * (size_t)d;
    p->d = d;
    p->n = n;
    p->L = malloc((size_t)n * dd * sizeof *p->L);
    p->b = calloc((size_t)n * (size_t)d, sizeof *p->b);
    p->L_mean = malloc(dd * sizeof *p->L_mean);
    p->b_mean = malloc((size_t)d * sizeof *p->b_mean);
    p->x_star = malloc((size_t)d * sizeof *p->x_star);
    if (!p->L || !p->b || !p->L_mean || !p->b_mean || !p->x_star) {
        st_quad_problem_free(p);
        return st_fail(ST_ERR_NOMEM, "no memory for %d Hessians of size %dx%d", n, d, d);
    }
    *out = p;
    return ST_OK;
}

void st_quad_problem_free(st_quad_problem *p)
{
    if (!p)
        return;
    free(p->L);
    free(p->b);
    free(p->L_mean);
    free(p->b_mean);
    free(p->x_star);
    free(p);
}

/* x = A^-1 b for symmetric PD A via its Cholesky factor; R is (d, d). */
static st_status spd_solve(int d, const double *A, const double *b, double *x, double *R)
{
    ST_TRY(st_quad_cholesky(d, A, R));
    // forward: R y = b (y in x), then backward: R^T x = y
    for (int i = 0; i < d; i++) {
        double s = b[i];
        for (int k = 0; k < i; k++)
            s -= R[(size_t)i * d + k] * x[k];
        x[i] = s / R[(size_t)i * d + i];
    }
    for (int i = d - 1; i >= 0; i--) {
        double s = x[i];
        for (int k = i + 1; k < d; k++)
            s -= R[(size_t)k * d + i] * x[k];
        x[i] = s / R[(size_t)i * d + i];
    }
    return ST_OK;
}

/* Checks every L_i, then fills L_mean, b_mean and x*. */
static st_status problem_finish(st_quad_problem *p)
{
    int d = p->d, n = p->n;
    size_t dd = (size_t)d * (size_t)d;
    double *R = malloc(dd * sizeof *R);
    if (!R)
        return st_fail(ST_ERR_NOMEM, "no memory for a %dx%d factor", d, d);
    st_status s = ST_OK;
    for (int i = 0; i < n && s == ST_OK; i++) {
        const double *Li = p->L + (size_t)i * dd;
        double big = 0.0;
        for (size_t k = 0; k < dd; k++)
            big = fmax(big, fabs(Li[k]));
        for (int r = 0; r < d && s == ST_OK; r++)
            for (int c = r + 1; c < d; c++)
                if (fabs(Li[(size_t)r * d + c] - Li[(size_t)c * d + r]) > 1e-12 * big) {
                    s = st_fail(ST_ERR_INVALID, "L_%d is not symmetric (entries %d,%d and %d,%d)",
                                i, r, c, c, r);
                    break;
                }
        if (s == ST_OK && st_quad_cholesky(d, Li, R) != ST_OK)
            s = st_fail(ST_ERR_INVALID, "L_%d is not positive definite", i);
    }
    if (s == ST_OK) {
        // L_mean (d, d) = (1/n) sum_i L_i; b_mean (d) = (1/n) sum_i b_i
        memset(p->L_mean, 0, dd * sizeof *p->L_mean);
        memset(p->b_mean, 0, (size_t)d * sizeof *p->b_mean);
        for (int i = 0; i < n; i++) {
            for (size_t k = 0; k < dd; k++)
                p->L_mean[k] += p->L[(size_t)i * dd + k];
            for (int j = 0; j < d; j++)
                p->b_mean[j] += p->b[(size_t)i * d + j];
        }
        for (size_t k = 0; k < dd; k++)
            p->L_mean[k] /= n;
        for (int j = 0; j < d; j++)
            p->b_mean[j] /= n;
        s = spd_solve(d, p->L_mean, p->b_mean, p->x_star, R);
    }
    free(R);
    return s;
}

st_status st_quad_problem_create(int d, int n, const double *L, const double *b,
                                 st_quad_problem **out)
{
    *out = NULL;
    ST_TRY(check_sizes(d, n));
    if (!L)
        return st_fail(ST_ERR_INVALID, "the Hessians L_i are missing");
    st_quad_problem *p;
    ST_TRY(problem_alloc(d, n, &p));
    memcpy(p->L, L, (size_t)n * (size_t)d * (size_t)d * sizeof *p->L);
    if (b)
        memcpy(p->b, b, (size_t)n * (size_t)d * sizeof *p->b);
    st_status s = problem_finish(p);
    if (s != ST_OK) {
        st_quad_problem_free(p);
        return s;
    }
    *out = p;
    return ST_OK;
}

/* L_i (d, d) = G G^T / d + SHIFT I, G (d, d) standard normal from rng;
 * G is (d, d) scratch. */
static void random_spd(int d, st_rng *rng, double *G, double *Li)
{
    size_t dd = (size_t)d * (size_t)d;
    for (size_t k = 0; k < dd; k++)
        G[k] = (double)st_rng_normal(rng);
    for (int r = 0; r < d; r++)
        for (int c = r; c < d; c++) {
            // rows r and c of G, dotted: (G G^T)_rc; fill both triangles
            // from one sum so that L_i is exactly symmetric
            const double *gr = G + (size_t)r * d, *gc = G + (size_t)c * d;
            double s = 0.0;
            for (int k = 0; k < d; k++)
                s += gr[k] * gc[k];
            s /= d;
            if (r == c)
                s += SHIFT;
            Li[(size_t)r * d + c] = s;
            Li[(size_t)c * d + r] = s;
        }
}

st_status st_quad_problem_random(int d, int n, uint64_t seed, int with_b,
                                 st_quad_problem **out)
{
    *out = NULL;
    ST_TRY(check_sizes(d, n));
    st_quad_problem *p;
    ST_TRY(problem_alloc(d, n, &p));
    size_t dd = (size_t)d * (size_t)d;
    double *G = malloc(dd * sizeof *G);
    if (!G) {
        st_quad_problem_free(p);
        return st_fail(ST_ERR_NOMEM, "no memory for a %dx%d random matrix", d, d);
    }
    st_rng root = st_rng_seed(seed);
    st_rng lroot = st_rng_split(&root, STREAM_L), broot = st_rng_split(&root, STREAM_B);
    for (int i = 0; i < n; i++) {
        st_rng r = st_rng_split(&lroot, (uint64_t)i);
        random_spd(d, &r, G, p->L + (size_t)i * dd);
        if (with_b) {
            st_rng rb = st_rng_split(&broot, (uint64_t)i);
            for (int j = 0; j < d; j++)
                p->b[(size_t)i * d + j] = (double)st_rng_normal(&rb);
        }
    }
    free(G);
    st_status s = problem_finish(p);
    if (s != ST_OK) {
        st_quad_problem_free(p);
        return s;
    }
    *out = p;
    return ST_OK;
}

double st_quad_f(const st_quad_problem *p, const double *x, double *grad)
{
    // f(x) = 1/2 x^T L_mean x - b_mean^T x; L_mean (d, d)
    int d = p->d;
    double f = 0.0;
    for (int i = 0; i < d; i++) {
        double s = 0.0;
        for (int j = 0; j < d; j++)
            s += p->L_mean[(size_t)i * d + j] * x[j];
        f += 0.5 * x[i] * s - p->b_mean[i] * x[i];
        if (grad)
            grad[i] = s - p->b_mean[i];
    }
    return f;
}

/* ------------------------------------------------------------ sketches */

static const st_enum_entry sketch_kind_entries[] = {
    { "plain", ST_QUAD_PLAIN },
    { "preconditioned", ST_QUAD_PRECONDITIONED },
};
static const st_enum_table sketch_kinds = ST_ENUM_TABLE("sketch kind", sketch_kind_entries);

const char *st_quad_sketch_kind_name(st_quad_sketch_kind k)
{
    return st_enum_name(&sketch_kinds, (int)k);
}

st_status st_quad_sketch_init(st_quad_sketch *s, int d, int n)
{
    memset(s, 0, sizeof *s);
    ST_TRY(check_sizes(d, n));
    if (d % n != 0)
        return st_fail(ST_ERR_INVALID,
                       "Perm-q sketches need the workers to divide the dimension: %d does not "
                       "divide %d",
                       n, d);
    s->coord = malloc((size_t)d * sizeof *s->coord);
    s->scale = malloc((size_t)d * sizeof *s->scale);
    if (!s->coord || !s->scale) {
        st_quad_sketch_free(s);
        return st_fail(ST_ERR_NOMEM, "no memory for a sketch of dimension %d", d);
    }
    s->d = d;
    s->n = n;
    s->q = d / n;
    s->kind = ST_QUAD_PLAIN;
    return ST_OK;
}

void st_quad_sketch_free(st_quad_sketch *s)
{
    free(s->coord);
    free(s->scale);
    memset(s, 0, sizeof *s);
}

static st_status check_match(const st_quad_problem *p, const st_quad_sketch *s)
{
    if (!p || p->d != s->d || p->n != s->n)
        return st_fail(ST_ERR_INVALID,
                       "the sketch (d = %d, n = %d) does not match the problem (d = %d, n = %d)",
                       s->d, s->n, p ? p->d : 0, p ? p->n : 0);
    return ST_OK;
}

st_status st_quad_sketch_perm(st_quad_sketch *s, st_quad_sketch_kind kind,
                              const st_quad_problem *p, st_rng *rng)
{
    if (kind != ST_QUAD_PLAIN && kind != ST_QUAD_PRECONDITIONED)
        return st_fail(ST_ERR_INVALID, "unknown sketch kind %d", (int)kind);
    if (kind == ST_QUAD_PRECONDITIONED) {
        ST_TRY(check_match(p, s));
        /* With q > 1 the preconditioned sketched Hessian keeps the
         * off-diagonal entries inside each block, so it is not I. */
        if (s->q != 1)
            return st_fail(ST_ERR_INVALID,
                           "preconditioned sketches are Perm-1 (d = n), got q = %d", s->q);
    }
    for (int k = 0; k < s->d; k++)
        s->coord[k] = (uint32_t)k;
    st_rng_shuffle_u32(rng, s->coord, (size_t)s->d);
    s->kind = kind;
    size_t dd = (size_t)s->d * (size_t)s->d;
    for (int k = 0; k < s->d; k++) {
        if (kind == ST_QUAD_PLAIN) {
            s->scale[k] = (double)s->n;
        } else {
            // worker i = k (q = 1) holds coordinate j: sqrt(n) (L_i)_jj^(-1/2)
            uint32_t j = s->coord[k];
            double ljj = p->L[(size_t)k * dd + (size_t)j * s->d + j];
            s->scale[k] = sqrt((double)s->n / ljj);
        }
    }
    return ST_OK;
}

void st_quad_sketch_diag(const st_quad_sketch *s, int worker, double *diag_out)
{
    memset(diag_out, 0, (size_t)s->d * sizeof *diag_out);
    for (int k = worker * s->q; k < (worker + 1) * s->q; k++)
        diag_out[s->coord[k]] = s->scale[k];
}

/* ------------------------------------------------------------ steps */

/* g[j] = (1/n) (C_i (L_i C_i x - b_i))_j for every coordinate j, where i is
 * j's only holder.  Worker i's work: its q rows and columns of L_i. */
static void ist_direction(const st_quad_problem *p, const st_quad_sketch *s, const double *x,
                          double *g)
{
    int d = s->d, q = s->q;
    size_t dd = (size_t)d * (size_t)d;
    double inv_n = 1.0 / s->n;
    for (int i = 0; i < s->n; i++) {
        const double *Li = p->L + (size_t)i * dd;   // (d, d)
        const double *bi = p->b + (size_t)i * d;    // (d)
        const uint32_t *J = s->coord + (size_t)i * q;  // (q) coordinates of worker i
        const double *sc = s->scale + (size_t)i * q;   // (q) their scales
        for (int a = 0; a < q; a++) {
            const double *row = Li + (size_t)J[a] * d;
            double acc = -bi[J[a]];
            for (int r = 0; r < q; r++)
                acc += row[J[r]] * (sc[r] * x[J[r]]);
            g[J[a]] = inv_n * (sc[a] * acc);
        }
    }
}

st_status st_quad_ist_direction(const st_quad_problem *p, const st_quad_sketch *s,
                                const double *x, double *g)
{
    ST_TRY(check_match(p, s));
    if (x == g)
        return st_fail(ST_ERR_INVALID, "IST direction: x and g must not overlap");
    ist_direction(p, s, x, g);
    return ST_OK;
}

st_status st_quad_ist_step(const st_quad_problem *p, const st_quad_sketch *s, double gamma,
                           const double *x, double *x_next)
{
    ST_TRY(check_match(p, s));
    if (x == x_next)
        return st_fail(ST_ERR_INVALID, "IST step: x and x_next must not overlap");
    /* g lands in x_next, then x_next = x - gamma g in place: no scratch. */
    ist_direction(p, s, x, x_next);
    for (int j = 0; j < s->d; j++)
        x_next[j] = x[j] - gamma * x_next[j];
    return ST_OK;
}

st_status st_quad_gd_step(const st_quad_problem *p, double gamma, const double *x,
                          double *x_next)
{
    if (x == x_next)
        return st_fail(ST_ERR_INVALID, "GD step: x and x_next must not overlap");
    // L_mean (d, d) row-major
    int d = p->d;
    for (int i = 0; i < d; i++) {
        const double *row = p->L_mean + (size_t)i * d;
        double s = -p->b_mean[i];
        for (int j = 0; j < d; j++)
            s += row[j] * x[j];
        x_next[i] = x[i] - gamma * s;
    }
    return ST_OK;
}

/* ------------------------------------------------------------ random-k */

/* Selection sampling: coordinate j is kept with probability (still to
 * keep) / (d - j), so exactly k are, each with probability k / d. */
st_status st_quad_randk(int d, int k, double scale, st_rng *rng, const double *v, double *out)
{
    if (d < 1 || k < 1 || k > d)
        return st_fail(ST_ERR_INVALID, "random-k: k must be in [1, d], got k = %d of d = %d",
                       k, d);
    int need = k;
    for (int j = 0; j < d; j++) {
        const double u = (double)(st_rng_u64(rng) >> 11) * 0x1p-53;
        const int keep = u * (double)(d - j) < (double)need;
        need -= keep;
        out[j] = keep ? scale * v[j] : 0.0;
    }
    return ST_OK;
}

st_status st_quad_randk_step(const st_quad_problem *p, int k, int shared, double eta,
                             st_rng *rng, const double *x, double *e, double *x_next,
                             double *scratch)
{
    const int d = p->d, n = p->n;
    if (x == x_next)
        return st_fail(ST_ERR_INVALID, "random-k step: x and x_next must not overlap");
    if (k < 1 || k > d)
        return st_fail(ST_ERR_INVALID, "random-k: k must be in [1, d], got k = %d of d = %d",
                       k, d);
    /* the kept coordinates' pattern, once for all workers when shared:
     * a mask of ones compressed with scale 1 */
    double *a = scratch, *mask = scratch + d;
    const double scale = e ? 1.0 : (double)d / (double)k;
    for (int j = 0; j < d; j++)
        x_next[j] = 0.0;
    for (int i = 0; i < n; i++) {
        if (i == 0 || !shared) {
            for (int j = 0; j < d; j++)
                a[j] = 1.0;
            ST_TRY(st_quad_randk(d, k, 1.0, rng, a, mask));
        }
        /* a = grad f_i(x) (+ e_i) */
        const double *L = p->L + (size_t)i * d * d, *b = p->b + (size_t)i * d;
        for (int r = 0; r < d; r++) {
            double g = -b[r];
            for (int c = 0; c < d; c++)
                g += L[(size_t)r * d + c] * x[c];
            a[r] = e ? g + e[(size_t)i * d + r] : g;
        }
        for (int j = 0; j < d; j++) {
            x_next[j] += scale * mask[j] * a[j];
            if (e)
                e[(size_t)i * d + j] = mask[j] != 0.0 ? 0.0 : a[j];
        }
    }
    for (int j = 0; j < d; j++)
        x_next[j] = x[j] - eta * x_next[j] / (double)n;
    return ST_OK;
}

/* ------------------------------------------------------------ expectations */

st_status st_quad_expected_system(const st_quad_problem *p, st_quad_sketch_kind kind,
                                  double *A, double *c)
{
    int d = p->d, n = p->n;
    if (d % n != 0)
        return st_fail(ST_ERR_INVALID, "Perm-q sketches need the workers to divide the "
                       "dimension: %d does not divide %d", n, d);
    int q = d / n;
    if (kind == ST_QUAD_PRECONDITIONED && q != 1)
        return st_fail(ST_ERR_INVALID, "preconditioned sketches are Perm-1 (d = n), got q = %d",
                       q);
    /* C_i = sigma P_i S_i with S_i diagonal (I, or diag(L_i)^(-1/2)).  Over
     * a uniform permutation, P(j in block i) = q/d = 1/n and, for j != k,
     * P(j and k both in block i) = q(q-1) / (d(d-1)).  Hence
     *   E[C_i L_i C_i] = sigma^2 (p1 diag(S L_i S) + p2 offdiag(S L_i S)),
     *   E[C_i b_i]     = sigma p1 S_i b_i. */
    double sigma = kind == ST_QUAD_PLAIN ? (double)n : sqrt((double)n);
    double p1 = 1.0 / n;
    double p2 = d > 1 ? (double)q * (q - 1) / ((double)d * (d - 1)) : 0.0;
    size_t dd = (size_t)d * (size_t)d;
    memset(A, 0, dd * sizeof *A);
    memset(c, 0, (size_t)d * sizeof *c);
    for (int i = 0; i < n; i++) {
        const double *Li = p->L + (size_t)i * dd;   // (d, d)
        const double *bi = p->b + (size_t)i * d;
        for (int j = 0; j < d; j++) {
            double sj = kind == ST_QUAD_PLAIN ? 1.0 : 1.0 / sqrt(Li[(size_t)j * d + j]);
            c[j] += sigma * p1 * sj * bi[j] / n;
            for (int k = 0; k < d; k++) {
                double sk = kind == ST_QUAD_PLAIN ? 1.0 : 1.0 / sqrt(Li[(size_t)k * d + k]);
                double pr = j == k ? p1 : p2;
                A[(size_t)j * d + k] += sigma * sigma * pr * sj * Li[(size_t)j * d + k] * sk / n;
            }
        }
    }
    return ST_OK;
}

st_status st_quad_biased_point(const st_quad_problem *p, st_quad_sketch_kind kind,
                               double *x_inf)
{
    int d = p->d;
    double *A = malloc(((size_t)d * (size_t)d + (size_t)d) * sizeof *A);
    if (!A)
        return st_fail(ST_ERR_NOMEM, "no memory for the expected %dx%d system", d, d);
    double *c = A + (size_t)d * d;
    st_status s = st_quad_expected_system(p, kind, A, c);
    if (s == ST_OK)
        s = st_quad_solve(d, A, c, x_inf);
    free(A);
    return s;
}

/* Descending order, for qsort. */
static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

st_status st_quad_ist_curvature(const st_quad_problem *p, st_quad_sketch_kind kind,
                                double *lambda)
{
    int d = p->d, n = p->n;
    if (d % n != 0)
        return st_fail(ST_ERR_INVALID, "Perm-q sketches need the workers to divide the "
                       "dimension: %d does not divide %d", n, d);
    int q = d / n;
    if (kind == ST_QUAD_PRECONDITIONED) {
        if (q != 1)
            return st_fail(ST_ERR_INVALID,
                           "preconditioned sketches are Perm-1 (d = n), got q = %d", q);
        *lambda = 1.0;
        return ST_OK;
    }
    size_t dd = (size_t)d * (size_t)d;
    double *row = malloc((size_t)d * sizeof *row);
    if (!row)
        return st_fail(ST_ERR_NOMEM, "no memory for a row of %d", d);
    double worst = 0.0;
    for (int i = 0; i < n; i++) {
        const double *Li = p->L + (size_t)i * dd;
        /* Gershgorin on any q of the rows: the q x q principal submatrix on
         * J has lambda_max <= max_{j in J} L_jj + sum_{k in J, k != j}
         * |L_jk|, at most L_jj + the q - 1 largest |L_jk|. */
        double gq = 0.0;
        for (int j = 0; j < d; j++) {
            int m = 0;
            for (int k = 0; k < d; k++)
                if (k != j)
                    row[m++] = fabs(Li[(size_t)j * d + k]);
            qsort(row, (size_t)m, sizeof *row, cmp_desc);
            double s = Li[(size_t)j * d + j];
            for (int k = 0; k < q - 1 && k < m; k++)
                s += row[k];
            gq = fmax(gq, s);
        }
        double bound = gq;
        if (q > 1) {
            double lm;
            st_status s = st_quad_lambda_max(d, Li, &lm);
            if (s != ST_OK) {
                free(row);
                return s;
            }
            bound = fmin(bound, lm);
        }
        worst = fmax(worst, bound);
    }
    free(row);
    *lambda = n * worst;
    return ST_OK;
}

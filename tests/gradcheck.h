/*
 * tests/gradcheck.h — what the gradient-check suites share: tolerances, the
 * comparison of finite differences with analytic gradients, and a check
 * macro.  Header-only, every function static; include after Criterion.
 */
#ifndef SUBTRAIN_TESTS_GRADCHECK_H
#define SUBTRAIN_TESTS_GRADCHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include <subtrain/status.h>

/* A finite-difference step and the bound |fd - an| <= atol + rtol * |an|. */
typedef struct tol {
    double h, atol, rtol;
} tol;

/* A library call that must succeed; on failure the message says why. */
#define OK(call)                                                              \
    do {                                                                      \
        st_status ok_status_ = (call);                                        \
        cr_assert_eq(ok_status_, ST_OK, "%s failed: %s", #call, st_last_error()); \
    } while (0)

/* max over k of |fd - an| / (atol + rtol |an|); *max_abs gets max |fd - an|. */
static double worst_ratio(const double *fd, const double *an, size_t n, tol t, double *max_abs)
{
    double worst = 0.0, big = 0.0;
    for (size_t k = 0; k < n; k++) {
        double err = fabs(fd[k] - an[k]);
        double ratio = err / (t.atol + t.rtol * fabs(an[k]));
        if (!(ratio <= worst)) /* NaN-safe: a NaN becomes the worst */
            worst = ratio;
        if (!(err <= big))
            big = err;
    }
    if (max_abs)
        *max_abs = big;
    return worst;
}

/* Compares analytic gradients with finite differences (`skipped`: how many
 * coordinates the caller left out, for the record), and checks that the
 * comparison has teeth: a gradient 10% too large, or with the sign of its
 * largest entry flipped, must fail it. */
static void compare_grads(const char *what, const double *fd, const double *an, size_t n,
                          size_t skipped, tol t)
{
    double max_abs, max_an = 0.0;
    size_t big = 0;
    double worst = worst_ratio(fd, an, n, t, &max_abs);
    for (size_t k = 0; k < n; k++)
        if (fabs(an[k]) > max_an) {
            max_an = fabs(an[k]);
            big = k;
        }
    fprintf(stderr, "[fd] %-40s n=%5zu skipped=%2zu max|an|=%8.2e max|fd-an|=%8.2e "
            "worst ratio %.3f (h %.0e atol %.0e rtol %.0e)\n", what, n, skipped, max_an,
            max_abs, worst, t.h, t.atol, t.rtol);
    cr_expect(worst <= 1.0, "%s: finite differences disagree with the analytic gradient: "
              "max |fd - an| = %.3e, worst ratio %.3f > 1", what, max_abs, worst);
    cr_expect(n > 0, "%s: no coordinate left to check", what);
    if (n == 0)
        return;
    double *wrong = malloc(n * sizeof *wrong);
    cr_assert(wrong);
    for (size_t k = 0; k < n; k++)
        wrong[k] = 1.1 * an[k];
    cr_expect(worst_ratio(fd, wrong, n, t, NULL) > 1.0,
              "%s: a gradient scaled by 1.1 passes the check: the tolerance has no teeth "
              "(largest |gradient| %.3e)", what, max_an);
    memcpy(wrong, an, n * sizeof *wrong);
    wrong[big] = -wrong[big];
    cr_expect(worst_ratio(fd, wrong, n, t, NULL) > 1.0,
              "%s: a gradient with one sign flipped passes the check", what);
    free(wrong);
}

#endif /* SUBTRAIN_TESTS_GRADCHECK_H */

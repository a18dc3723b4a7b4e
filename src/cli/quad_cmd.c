/*
 * cli/quad_cmd.c — `subtrain quad`: one-step IST on quadratics.
 *
 * Runs the six checks of doc/quad.md (st_quad_case_1..6) and
 * prints one titled block of numbers per case; --csv also writes the
 * convergence trace (||x^k - x*|| for IST and gradient descent) that
 * scripts/plot_quad.gp draws.  The library does the work; this file parses,
 * prints and maps statuses to exit codes.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <subtrain/quad.h>

#include "cli/cli_util.h"
#include "cli/out_file.h"
#include "cli/quad_cmd.h"

#define EXIT_USAGE 2
#define ALL_CASES 0x7e   /* bits 1..6 */
#define LAST_CASE 6

enum { OPT_CASE = 256, OPT_DIM, OPT_WORKERS, OPT_Q, OPT_GAMMA, OPT_KEEP, OPT_ITERS, OPT_RUNS,
       OPT_SEED, OPT_CSV, OPT_PROGRESS };

static const struct option long_options[] = {
    { "case", required_argument, NULL, OPT_CASE },
    { "dim", required_argument, NULL, OPT_DIM },
    { "workers", required_argument, NULL, OPT_WORKERS },
    { "q", required_argument, NULL, OPT_Q },
    { "gamma", required_argument, NULL, OPT_GAMMA },
    { "keep", required_argument, NULL, OPT_KEEP },
    { "iters", required_argument, NULL, OPT_ITERS },
    { "runs", required_argument, NULL, OPT_RUNS },
    { "seed", required_argument, NULL, OPT_SEED },
    { "csv", required_argument, NULL, OPT_CSV },
    { "progress", required_argument, NULL, OPT_PROGRESS },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
};

typedef struct quad_options {
    st_quad_config cfg;
    unsigned cases;      /* bit k: run case k */
    const char *csv;     /* NULL: no CSV */
    int bar;             /* --progress: -1 auto, 0 none, 1 bar */
    int help;
} quad_options;

static void print_help(FILE *f)
{
    fputs(
"Usage: subtrain quad [OPTION]...\n"
"One-step independent subnetwork training (IST) on quadratics,\n"
"  x+ = x - gamma (1/n) sum_i C_i grad f_i(C_i x),  f_i(x) = 1/2 x'L_i x - b_i'x,\n"
"with Perm-q sketches (d = q n; worker i holds q coordinates of a random\n"
"permutation, C_i = n x their projector): five exact checks, and IST against\n"
"compressed communication (random-k) (doc/quad.md).\n"
"\n"
"  --case all|1|2|3|4|5|6  which check to run (default all):\n"
"                    1 preconditioned Perm-1, b = 0, gamma = 1: x+ = 0;\n"
"                    2 preconditioned Perm-1, b_i != 0: E x^k = (1-gamma)^k x0\n"
"                      + (1 - (1-gamma)^k) x_inf, and x_inf != x*;\n"
"                    3 b_i = 0, plain Perm-q: converges to x* exactly;\n"
"                    4 L = [[1,5],[5,100]], n = 2, plain Perm-1: the sketched\n"
"                      direction 2 diag(L) x is not always a descent direction;\n"
"                    5 E[C_i] = I: mean of C_i over 10..10^5 draws;\n"
"                    6 random-k (Q d coordinates, scaled by d / k) on case\n"
"                      2's problem: unbiased, and its gradient descent reaches\n"
"                      x* where IST stops at x_inf\n"
"  --dim D           dimension of cases 3 and 5 (default q x workers)\n"
"  --workers N       workers n (default 8, or D / q); cases 1 and 2 use d = n\n"
"  --q Q             coordinates per worker (default 4, or D / n); n q = D\n"
"  --gamma G         relative step in (0, 2) (default 0.5): the step is G for\n"
"                    preconditioned sketches (their expected Hessian is I),\n"
"                    G / Lambda for plain ones (Lambda bounds every draw's\n"
"                    Hessian), G / lambda_max for gradient descent\n"
"  --keep Q          random-k's fraction of coordinates in case 6, in (0, 1]\n"
"                    (default 0.25)\n"
"  --iters K         iterations of cases 2, 3 and 6 and of the trace (default 500)\n"
"  --runs R          sketch sequences averaged in cases 2 and 6 (default 10000)\n"
"  --seed S          seed of the problems, start points and sketches (default 1)\n"
"  --csv FILE        write ||x^k - x*|| per iteration for IST and gradient\n"
"                    descent (scripts/plot_quad.gp plots it)\n"
"  --progress auto|bar|none  a live line on stderr with the runs of cases 2\n"
"                    and 6 done and the time left (auto: bar when stderr\n"
"                    is a terminal)\n"
"  -h, --help        this text\n"
"\n"
"Random problems: L_i = G_i G_i'/d + I/2 (G_i standard normal), b_i standard\n"
"normal.  Everything is float64 and a function of the seed.  doc/quad.md has\n"
"the derivations.  Exit status: 0 success, 1 runtime failure, 2 bad usage.\n", f);
}

/* One-line errors and counts, prefixed with the command. */
#define CMD "subtrain quad"
#define cmd_error(...) st_cli_error(CMD, __VA_ARGS__)
#define parse_count(opt, s, lo, hi, out) st_cli_count_arg(CMD, opt, s, lo, hi, out)

static int parse_int(const char *opt, const char *s, int lo, int hi, int *out)
{
    unsigned long long v;
    if (parse_count(opt, s, (unsigned long long)lo, (unsigned long long)hi, &v))
        return -1;
    *out = (int)v;
    return 0;
}

static int parse_gamma(const char *s, double *out)
{
    char err[512];
    if (st_cli_parse_real("--gamma", s, '(', 0.0, 2.0, ')', 0, out, err, sizeof err) == 0)
        return 0;
    cmd_error("%s", err);
    return -1;
}

static int parse_keep(const char *s, double *out)
{
    char err[512];
    if (st_cli_parse_real("--keep", s, '(', 0.0, 1.0, ']', 0, out, err, sizeof err) == 0)
        return 0;
    cmd_error("%s", err);
    return -1;
}

static int parse_case(const char *s, unsigned *out)
{
    if (strcmp(s, "all") == 0) {
        *out = ALL_CASES;
        return 0;
    }
    if (s[0] >= '1' && s[0] <= '0' + LAST_CASE && s[1] == '\0') {
        *out = 1u << (s[0] - '0');
        return 0;
    }
    cmd_error("--case: expected all, 1, 2, 3, 4, 5 or 6, got '%s'", ST_CLI_SHOW(s));
    return -1;
}

static int apply_option(int c, const char *arg, void *ctx)
{
    quad_options *o = ctx;
    unsigned long long v;
    switch (c) {
    case OPT_CASE: return parse_case(arg, &o->cases);
    case OPT_DIM: return parse_int("--dim", arg, 1, ST_QUAD_MAX_DIM, &o->cfg.dim);
    case OPT_WORKERS: return parse_int("--workers", arg, 1, ST_QUAD_MAX_DIM, &o->cfg.workers);
    case OPT_Q: return parse_int("--q", arg, 1, ST_QUAD_MAX_DIM, &o->cfg.q);
    case OPT_GAMMA: return parse_gamma(arg, &o->cfg.gamma);
    case OPT_KEEP: return parse_keep(arg, &o->cfg.keep);
    case OPT_ITERS: return parse_int("--iters", arg, 1, 10000000, &o->cfg.iters);
    case OPT_RUNS: return parse_int("--runs", arg, 2, 10000000, &o->cfg.runs);
    case OPT_SEED:
        if (parse_count("--seed", arg, 0, UINT64_MAX, &v))
            return -1;
        o->cfg.seed = v;
        return 0;
    case OPT_CSV:
        if (*arg == '\0') {
            cmd_error("--csv: expected a file name, got ''");
            return -1;
        }
        o->csv = arg;
        return 0;
    case OPT_PROGRESS:
        if (strcmp(arg, "auto") == 0 || strcmp(arg, "bar") == 0 || strcmp(arg, "none") == 0) {
            o->bar = arg[0] == 'a' ? -1 : arg[0] == 'b';
            return 0;
        }
        cmd_error("--progress: expected auto, bar or none, got '%s'", ST_CLI_SHOW(arg));
        return -1;
    case 'h': o->help = 1; return 0;
    }
    cmd_error("internal: unhandled option %d", c);
    return -1;
}

/* Returns -1 (and has printed why) on bad usage. */
static int parse(int argc, char **argv, quad_options *o)
{
    memset(o, 0, sizeof *o);
    o->cfg = st_quad_defaults();
    o->cases = ALL_CASES;
    o->bar = -1;
    if (st_cli_parse_args(argc, argv, ":h", long_options, CMD, apply_option, o))
        return -1;
    if (o->help)
        return 0;
    if (st_quad_config_resolve(&o->cfg) != ST_OK) {
        cmd_error("%s", st_last_error());
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------ printing */

/* One line of a block: the label in a fixed column, then the values. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void row(const char *label, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("  %-46s ", label);
    vprintf(fmt, ap);
    putchar('\n');
    va_end(ap);
}

static void print_case1(const st_quad_case1 *r)
{
    printf("Case 1: preconditioned Perm-1, b_i = 0, gamma = 1 (d = n = %d, heterogeneous L_i, "
           "%d draws)\n", r->n, r->draws);
    row("max |(1/n) sum C~_i L_i C~_i - I|", "%.3e", r->identity_err);
    row("max ||x^1|| / ||x^0||", "%.3e   (%s)", r->step_rel,
        r->step_rel < 1e-12 ? "x^1 = 0 to rounding" : "NOT zero");
    row("plain Perm-1, best step: ||x^1|| / ||x^0||", "%.3f", r->plain_rel);
}

static void print_case2(const st_quad_case2 *r)
{
    printf("Case 2: preconditioned Perm-1, b_i != 0, gamma = %g (d = n = %d, %d iterations, "
           "%d runs)\n", r->gamma, r->n, r->iters, r->runs);
    row("||x*||, ||x_inf|| (x_inf = A^-1 c)", "%.6f  %.6f", r->norm_x_star, r->norm_x_inf);
    row("||x_inf - x*||", "%.6f   (the bias of IST)", r->bias);
    row("||x_inf - x*||, plain Perm-1", "%.6f", r->bias_plain);
    row("max |A - I|", "%.3e", r->A_err);
    row("max_k ||E x^k - formula_k||, E exact", "%.3e", r->formula_err);
    row("||mean of runs x^K - formula_K||", "%.3e   (Chebyshev bound %.3e, p = 1e-3)",
        r->mc_err_final, r->mc_bound_final);
    row("max_k error_k / bound_k", "%.3f", r->mc_err);
    row("||mean x^K - x_inf||, ||mean x^K - x*||", "%.3e  %.6f", r->mean_to_x_inf,
        r->mean_to_x_star);
    row("one run, tail average of x^k: to x_inf, x*", "%.3e  %.6f", r->tail_to_x_inf,
        r->tail_to_x_star);
}

static void print_reach(const char *label, int k)
{
    if (k < 0)
        row(label, "not reached");
    else
        row(label, "k = %d", k);
}

static void print_case3(const st_quad_case3 *r)
{
    printf("Case 3: b_i = 0 (x* = 0), heterogeneous L_i, plain Perm-%d (d = %d, n = %d, "
           "%d iterations)\n", r->q, r->d, r->n, r->iters);
    row("Lambda, IST step gamma / Lambda", "%.6f  %.6f", r->curvature, r->step);
    row("||step(x*) - x*|| for a draw", "%.3e", r->fixed_point_err);
    row("IST ||x^0 - x*||, ||x^K - x*||", "%.6f  %.3e", r->err0, r->err_final);
    print_reach("IST first k with 1e-10 relative error", r->reach);
    row("GD step gamma / lambda_max, ||x^K - x*||", "%.6f  %.3e", r->gd_step, r->gd_err_final);
    print_reach("GD first k with 1e-10 relative error", r->gd_reach);
}

static void print_case4(const st_quad_case4 *r)
{
    printf("Case 4: L = [[1,5],[5,100]], n = 2, b = 0, plain Perm-1: g = 2 diag(L) x\n");
    row("max |g - 2 diag(L) x|, both permutations", "%.3e", r->g_err);
    row("directions with <grad f, g> < 0", "%d of %d", r->negative, r->dirs);
    row("most negative cosine at x", "(%.6f, %.6f)", r->x[0], r->x[1]);
    row("<grad f(x), g(x)>, cosine", "%.6f  %.6f", r->dot, r->cosine);
    row("lambda_min(L D + D L)", "%.6f   (< 0 iff some x has <grad f, g> < 0)", r->lambda_min);
    row("f(x - 1e-4 g) - f(x)", "%+.6e   (%s)", r->f_rise,
        r->f_rise > 0 ? "f goes up" : "f goes down");
    row("preconditioned: <grad f(x), g~(x)> = x'Lx", "%.6f", r->dot_precond);
}

static void print_case5(const st_quad_case5 *r)
{
    printf("Case 5: E[C_i] = I for Perm-%d sketches (d = %d, n = %d)\n", r->q, r->d, r->n);
    row("max |sum_i C_i - n I| over all draws", "%.3e", r->sum_err);
    printf("  %10s  %14s  %14s  %12s\n", "draws S", "max|mean C-I|", "Bernstein 1e-6",
           "dev sqrt(S)");
    for (int l = 0; l < r->levels; l++)
        printf("  %10ld  %14.6f  %14.6f  %12.4f\n", r->samples[l], r->max_dev[l], r->bound[l],
               r->max_dev[l] * sqrt((double)r->samples[l]));
}

static void print_case6(const st_quad_case6 *r)
{
    printf("Case 6: IST against random-k (k = %d of d = %d, scaled by d/k; n = %d)\n", r->k,
           r->d, r->n);
    row("mean of compressions / x0 - 1, max", "%.6f   (%ld draws; Bernstein 1e-6: %.6f)",
        r->mean_dev, r->samples, r->mean_bound);
    row("  the same unscaled", "%.6f   (1 - k/d = %.6f)", r->unscaled_dev,
        1.0 - (double)r->k / r->d);
    row("IST (case 2): ||x_inf - x*||", "%.6f", r->ist_bias);
    printf("  random-k gradient descent, step %.6f, %d iterations, ||x0 - x*|| = %.6f:\n",
           r->step, r->iters, r->err0);
    row("  subset shared by the workers, ||x^K - x*||", "%.3e", r->shared_final);
    row("  the same with error feedback", "%.3e", r->ef_final);
    row("  a subset per worker, one run", "%.3e", r->indep_final);
    row("  a subset per worker, mean of runs", "%.3e   (%d runs; Chebyshev 1e-3: %.3e)",
        r->indep_mean, r->runs, r->indep_bound);
    row("  gradient descent at the same step", "%.3e", r->gd_final);
}

/* ------------------------------------------------------------ running */

/* Bad combinations are the user's to fix (exit 2); anything else that
 * fails (memory, numerics, the CSV file) is a runtime failure (exit 1). */
static int fail_status(st_status s, const char *what)
{
    cmd_error("%s: %s", what, st_last_error());
    return s == ST_ERR_INVALID ? EXIT_USAGE : EXIT_FAILURE;
}

/* --progress bar: the loop's line on stderr, redrawn at most every 0.2 s. */
typedef struct bar_state {
    double start, last;   /* of the loop drawn, seconds */
    const char *what;
    int case_no, visible;
} bar_state;

static void draw_bar(int case_no, const char *what, long done, long total, void *user)
{
    bar_state *b = user;
    const double t = st_cli_now_s();
    if (b->case_no != case_no || b->what != what) {   /* a new loop */
        b->case_no = case_no;
        b->what = what;
        b->start = t;
        b->last = 0.0;
    }
    if (t - b->last < 0.2 && done != total)
        return;
    b->last = t;
    const double rate = (double)done / fmax(t - b->start, 1e-9);
    char eta[32];
    st_cli_format_duration(eta, sizeof eta, (double)(total - done) / rate);
    fprintf(stderr, "\r\033[Kcase %d: %ld/%ld %s (%.0f%%)  ETA %s", case_no, done, total, what,
            100.0 * (double)done / (double)total, eta);
    fflush(stderr);
    b->visible = 1;
}

/* Before a case's results: the bar's line emptied (b: NULL without one). */
static void clear_bar(bar_state *b)
{
    if (b && b->visible)
        fputs("\r\033[K", stderr);
    if (b)
        memset(b, 0, sizeof *b);
}

static int run_case(int k, const st_quad_config *c)
{
    union {
        st_quad_case1 c1;
        st_quad_case2 c2;
        st_quad_case3 c3;
        st_quad_case4 c4;
        st_quad_case5 c5;
        st_quad_case6 c6;
    } r;
    st_status s = ST_OK;
    switch (k) {
    case 1: s = st_quad_case_1(c, &r.c1); break;
    case 2: s = st_quad_case_2(c, &r.c2); break;
    case 3: s = st_quad_case_3(c, &r.c3); break;
    case 4: s = st_quad_case_4(c, &r.c4); break;
    case 5: s = st_quad_case_5(c, &r.c5); break;
    case 6: s = st_quad_case_6(c, &r.c6); break;
    }
    clear_bar(c->progress_user);
    if (s != ST_OK) {
        char what[16];
        snprintf(what, sizeof what, "case %d", k);
        return fail_status(s, what);
    }
    switch (k) {
    case 1: print_case1(&r.c1); break;
    case 2: print_case2(&r.c2); break;
    case 3: print_case3(&r.c3); break;
    case 4: print_case4(&r.c4); break;
    case 5: print_case5(&r.c5); break;
    case 6: print_case6(&r.c6); break;
    }
    return 0;
}

/* The trace into the output opened by st_cli_out_open. */
static int write_trace(const st_quad_config *c, st_cli_out *out)
{
    st_quad_trace t;
    st_status s = st_quad_trace_run(c, &t);
    if (s != ST_OK) {
        st_cli_out_abandon(out);
        return fail_status(s, "trace");
    }
    FILE *f = st_cli_out_begin(out);
    int rc = EXIT_FAILURE;
    if (f) {
        st_quad_print_csv(f, &t);
        rc = st_cli_out_commit(out, f) == 0 ? 0 : EXIT_FAILURE;
    }
    if (rc == 0) {
        int K = t.iters;
        printf("Trace written to %s: ||x^k - x*|| for k = 0..%d\n", out->path, K);
        printf("  case 2's problem at k = %d: IST one run %.3e, IST exact mean %.3e, GD %.3e\n",
               K, t.ist[K], t.ist_mean[K], t.gd[K]);
        printf("  case 3's problem at k = %d: IST %.3e, GD %.3e\n", K, t.ist_b0[K], t.gd_b0[K]);
    }
    st_quad_trace_free(&t);
    return rc;
}

int st_cli_quad_main(int argc, char **argv)
{
    quad_options o;
    if (parse(argc, argv, &o) != 0)
        return EXIT_USAGE;
    if (o.help) {
        print_help(stdout);
        return EXIT_SUCCESS;
    }
    bar_state bar;
    memset(&bar, 0, sizeof bar);
    if (o.bar == 1 || (o.bar == -1 && isatty(STDERR_FILENO))) {
        o.cfg.progress = draw_bar;
        o.cfg.progress_user = &bar;
    }
    const st_quad_config *c = &o.cfg;
    /* an unwritable CSV path said before the cases run, not after */
    st_cli_out out;
    if (o.csv && st_cli_out_open(&out, CMD, "--csv", o.csv) != 0)
        return EXIT_FAILURE;
    printf("subtrain quad: n = %d workers, d = %d (Perm-%d), gamma %g, %d iterations, "
           "%d runs, seed %llu\n", c->workers, c->dim, c->q, c->gamma, c->iters, c->runs,
           (unsigned long long)c->seed);
    for (int k = 1; k <= LAST_CASE; k++) {
        if (!(o.cases & (1u << k)))
            continue;
        printf("\n");
        fflush(stdout);
        int rc = run_case(k, c);
        if (rc != 0) {
            if (o.csv)
                st_cli_out_abandon(&out);
            return rc;
        }
    }
    if (o.csv) {
        printf("\n");
        int rc = write_trace(c, &out);
        if (rc != 0)
            return rc;
    }
    if (fflush(stdout) != 0) {
        fprintf(stderr, "subtrain quad: writing the output failed: %s\n", strerror(errno));
        return EXIT_FAILURE;
    }
    return EXIT_SUCCESS;
}

/*
 * tests/model_check.h — what the suites of whole models share
 * (tests/test_model_*.c, through the public API, subtrain/model.h, and
 * the graph's private one, nn/graph.h): the small models, their inputs,
 * and the finite-difference check of every parameter segment.
 * Header-only, every function static inline.
 *
 * Gradient check: L = mean cross-entropy over the batch; the analytic
 * gradient is what st_model_forward_backward writes to st_model_grads; the
 * finite differences perturb st_model_params in place, re-run the forward
 * (st_model_evaluate over all rows) and compute L in double from the float
 * logits (st_model_logits).  Why not the loss the library returns: it comes
 * from oneDNN's float log-softmax, good to ~ 1e-6 per row, and that noise
 * divided by 2h would be ~ 5e-5, as large as the smaller gradients; from the
 * logits it is ~ 2e-8 (measured).  The test asserts that the library's loss
 * agrees with the one computed here.
 *
 * Each comparison prints one line to stderr: the largest |fd - analytic| and
 * the worst ratio |fd - analytic| / (atol + rtol |analytic|) (must be <= 1).
 */
#ifndef SUBTRAIN_TESTS_MODEL_CHECK_H
#define SUBTRAIN_TESTS_MODEL_CHECK_H

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "gradcheck.h"

#include <subtrain/arena.h>
#include <subtrain/model.h>
#include <subtrain/optim.h>
#include <subtrain/rng.h>
#include <subtrain/status.h>

#include "core/arena_impl.h"
#include "nn/graph.h"
#include "optim/optim_impl.h"

/* ------------------------------------------------------------ tolerances */

/* GELU networks are smooth.  Noise: L from the float logits moves by ~ 2e-8
 * of rounding between two forwards (every logit is recomputed), so
 * ~ 2e-8 / 2h = 1e-6 at h = 1e-2.  Truncation: h^2 / 6 times the third
 * derivative of L along one parameter, O(0.1) at this init scale: ~ 2e-6.
 * Measured max |fd - an|: ~ 1e-5.  Gradients are O(1e-3 .. 0.3) (a mean over
 * 8 rows): a 10% error of a 1e-3 gradient is 1e-4, twice the bound, and
 * every segment has entries larger than that (the teeth check asserts it
 * for each segment). */
static const tol TOL_GELU = { 1e-2, 5e-5, 1e-2 };

/* ReLU networks are piecewise smooth: a perturbation of +-h can move a
 * pre-activation across 0 (the expected number of crossings per coordinate
 * is ~ 300 h for the resmlp here: ~ 3 at h = 1e-2, ~ 0.3 at h = 1e-3), and
 * the central difference then averages two slopes.  Hence h = 1e-3, where
 * rounding noise is ~ 2e-8 / 2e-3 = 1e-5 (measured up to 6e-5 with layer
 * norms), plus a kink guard (KINK_JUMP) for the crossings left.  atol covers
 * that noise plus the kink error the guard lets through (KINK_JUMP / 2). */
static const tol TOL_RELU = { 1e-3, 2e-4, 1e-2 };

/* The public API does not expose pre-activations, so the guard looks at L:
 * the one-sided slopes s+ = (L(p+h) - L(p)) / h and s- = (L(p) - L(p-h)) / h
 * differ by h L'' + noise on a smooth stretch (measured at h = 1e-3: 99th
 * percentile 1.4e-4, max 2e-4 for resmlp; mlp 10x less).  A single kink at
 * distance t < h on one side of p adds (h - t) / h * D to |s+ - s-| (D: the
 * change of slope) and (h - t) / 2h * D to the central difference's error:
 * exactly half.  A coordinate with |s+ - s-| > KINK_JUMP is skipped, so an
 * accepted one carries at most KINK_JUMP / 2 of kink error.  Skips must stay
 * rare (<= MAX_KINK_SKIP of the coordinates) so that the guard cannot hollow
 * the check out.  GELU networks get no guard: every coordinate is checked. */
#define KINK_JUMP 2e-4
#define MAX_KINK_SKIP 0.2

/* Coordinates checked per parameter segment (all of them if fewer). */
#define COORDS_PER_SEGMENT 30

/* ------------------------------------------------------------ helpers */

/* The small models of these tests: 12 features, 5 classes.  resmlp's hidden
 * width differs from its width, so a (W, H) / (H, W) mix-up shows. */
static inline st_model_config mlp_config(int depth, int width, st_activation act)
{
    st_model_config c = { .kind = st_model_kind_named("mlp"), .depth = depth, .width = width,
                          .hidden = 0, .activation = act, .in_dim = 12, .n_classes = 5 };
    return c;
}

static inline st_model_config resmlp_config(int depth, int width, int hidden, st_activation act)
{
    st_model_config c = { .kind = st_model_kind_named("resmlp"), .depth = depth, .width = width,
                          .hidden = hidden, .activation = act, .in_dim = 12, .n_classes = 5 };
    return c;
}

static inline st_model *make_model(const st_model_config *cfg, int batch, st_arena *arena)
{
    st_model *m = NULL;
    OK(st_model_create(cfg, batch, arena, &m));
    cr_assert_not_null(m);
    return m;
}

/* Rows of the logits and labels: a row per token of a sequence model. */
static inline int rows_of(const st_model *m)
{
    return st_model_batch(m) * st_model_tokens(m);
}

/* Rows [first, last) of the input ~ U(-1.5, 1.5), labels uniform in [0, K);
 * a sequence model's: token ids and next tokens uniform in [0, K). */
static inline void fill_rows(st_model *m, int first, int last, st_rng *r)
{
    const st_model_config *c = st_model_get_config(m);
    const int T = st_model_tokens(m);
    float *x = st_model_input(m); // x is (B, in_dim)
    int32_t *y = st_model_labels(m); // y is (B x T)
    for (int b = first; b < last; b++) {
        for (int i = 0; i < c->in_dim; i++)
            x[(size_t)b * (size_t)c->in_dim + (size_t)i] =
                c->context ? (float)st_rng_below(r, (uint32_t)c->n_classes)
                           : 3.0f * st_rng_uniform(r) - 1.5f;
        for (int t = 0; t < T; t++)
            y[b * T + t] = (int32_t)st_rng_below(r, (uint32_t)c->n_classes);
    }
}

static inline int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Layer norm parameters away from their init (1, 0): a gradient check at
 * gamma = 1, beta = 0 would not see gamma and beta swapped in the backward. */
static inline void jitter_norms(st_model *m, st_rng *r)
{
    int ns;
    const st_param_segment *s = st_model_segments(m, &ns);
    float *p = st_model_params(m);
    for (int i = 0; i < ns; i++) {
        int gamma = ends_with(s[i].name, ".gamma"), beta = ends_with(s[i].name, ".beta");
        for (size_t j = 0; (gamma || beta) && j < s[i].count; j++)
            p[s[i].offset + j] = (gamma ? 1.0f : 0.0f) + 0.6f * st_rng_uniform(r) - 0.3f;
    }
}

/* The forward over all rows; returns the library's loss sum (its float
 * log-probabilities summed in double). */
/* 1: the objective is the training forward's (models with batch norm,
 * whose inference forward uses running statistics instead). */
static int objective_train;

/* > 0: the finite-difference step instead of the tolerance's (a deeper
 * net with batch norms, whose truncation error at the GELU step would
 * exceed the tolerance, see the resnet subnetwork checks). */
static double fd_step;

/* 1: a kink guard for max pooling, whatever the activation.  A pooled
 * network is piecewise smooth: a perturbation that moves a window's
 * maximum to another element changes the slope (a first layer's weight
 * moves every window of its channel, so some pair of a window's elements
 * is often within h of a tie).  With batch norms the one-sided slopes of
 * a smooth stretch differ by h L'' (more than KINK_JUMP), so this guard
 * compares central differences at h and h / 4 instead: a smooth stretch's
 * differ by O(h^2 L'''), a kink between h / 4 and h away moves the first
 * by up to half the change of slope and not the second.  A coordinate
 * whose two differ by more than KINK_JUMP is skipped (MAX_KINK_SKIP still
 * bounds how many); a wrong analytic gradient moves neither, so it is not
 * skipped. */
static int kink_guard;

static inline double forward_loss_sum(st_model *m)
{
    double sum = 0.0;
    int64_t correct = 0;
    if (objective_train) {
        float loss;
        OK(st_model_forward_backward(m, &loss));
        return (double)loss * rows_of(m);
    }
    OK(st_model_evaluate(m, st_model_batch(m), &sum, &correct));
    return sum;
}

/* Mean cross-entropy of the current logits, in double:
 * mean over b of (log sum_k exp(l[b,k]) - l[b,y_b]). */
static inline double logits_mean_ce(st_model *m)
{
    const int B = rows_of(m), K = st_model_get_config(m)->n_classes;
    const float *l = st_model_logits(m); // l is (B x T, K)
    const int32_t *y = st_model_labels(m);
    double sum = 0.0;
    for (int b = 0; b < B; b++) {
        const float *row = l + (size_t)b * (size_t)K;
        double mx = row[0], se = 0.0;
        for (int k = 1; k < K; k++)
            mx = fmax(mx, row[k]);
        for (int k = 0; k < K; k++)
            se += exp((double)row[k] - mx);
        sum += log(se) + mx - row[y[b]];
    }
    return sum / B;
}

/* The finite differences' objective: a forward, then L from the logits. */
static inline double model_objective(st_model *m)
{
    forward_loss_sum(m);
    return logits_mean_ce(m);
}

/* Finite-difference check of every segment of a model on up to
 * COORDS_PER_SEGMENT coordinates each.  The input and labels must be set. */
static inline void check_model_grads(st_model *m, const char *tag, uint64_t seed)
{
    const st_model_config *cfg = st_model_get_config(m);
    const int guard = cfg->activation == ST_ACT_RELU;
    tol t = guard ? TOL_RELU : TOL_GELU;
    if (fd_step > 0.0)
        t.h = fd_step;
    const int B = rows_of(m);
    size_t np = st_model_param_count(m);
    float *p = st_model_params(m);

    float loss;
    OK(st_model_forward_backward(m, &loss));
    float *grad = malloc(np * sizeof *grad); // the analytic gradient, saved
    cr_assert(grad);
    memcpy(grad, st_model_grads(m), np * sizeof *grad);

    /* The library's loss: forward_backward's float mean is evaluate's double
     * sum over B, rounded; both agree with the double CE of the logits to
     * oneDNN's log-softmax accuracy (~ 1e-6 per row, see test_layers_xent). */
    double lib_sum = forward_loss_sum(m), L0 = logits_mean_ce(m);
    cr_expect_eq(loss, (float)(lib_sum / B), "%s: forward_backward's loss %.9g, evaluate's %.9g",
                 tag, (double)loss, lib_sum / B);
    cr_expect(fabs(lib_sum / B - L0) <= 2e-6 * (1 + L0), "%s: library loss %.9f, from logits %.9f",
              tag, lib_sum / B, L0);

    st_rng r = st_rng_seed(seed);
    int ns;
    const st_param_segment *segs = st_model_segments(m, &ns);
    size_t checked = 0, skipped = 0;
    for (int s = 0; s < ns; s++) {
        size_t count = segs[s].count, k = count < COORDS_PER_SEGMENT ? count : COORDS_PER_SEGMENT;
        uint32_t *perm = malloc(count * sizeof *perm);
        double *fd = malloc(k * sizeof *fd), *an = malloc(k * sizeof *an);
        cr_assert(perm && fd && an);
        for (size_t j = 0; j < count; j++)
            perm[j] = (uint32_t)j;
        st_rng_shuffle_u32(&r, perm, count);
        size_t n = 0, seg_skipped = 0;
        for (size_t j = 0; j < k; j++) {
            size_t i = segs[s].offset + perm[j];
            /* The step actually taken is the float-rounded one. */
            float v = p[i];
            float vp = (float)((double)v + t.h), vm = (float)((double)v - t.h);
            p[i] = vp;
            double lp = model_objective(m);
            p[i] = vm;
            double lm = model_objective(m);
            p[i] = v;
            if (guard) {
                double right = (lp - L0) / ((double)vp - v), left = (L0 - lm) / ((double)v - vm);
                if (fabs(right - left) > KINK_JUMP) {
                    seg_skipped++;
                    continue;
                }
            }
            fd[n] = (lp - lm) / ((double)vp - (double)vm);
            if (kink_guard) {
                float vq = (float)((double)v + t.h / 4), vr = (float)((double)v - t.h / 4);
                p[i] = vq;
                double lq = model_objective(m);
                p[i] = vr;
                double lr = model_objective(m);
                p[i] = v;
                if (fabs(fd[n] - (lq - lr) / ((double)vq - (double)vr)) > KINK_JUMP) {
                    seg_skipped++;
                    continue;
                }
            }
            an[n] = grad[i];
            n++;
        }
        char what[96];
        snprintf(what, sizeof what, "%s %s", tag, segs[s].name);
        compare_grads(what, fd, an, n, seg_skipped, t);
        checked += n;
        skipped += seg_skipped;
        free(perm);
        free(fd);
        free(an);
    }
    /* The perturbations were undone exactly: the loss is bitwise the same. */
    cr_expect_eq(model_objective(m), L0, "%s: parameters not restored", tag);
    fprintf(stderr, "[fd] %s: %zu coordinates checked, %zu skipped by the kink guard "
            "(h %.0e, atol %.0e, rtol %.0e)\n", tag, checked, skipped, t.h, t.atol, t.rtol);
    cr_expect((double)skipped <= MAX_KINK_SKIP * (double)(checked + skipped),
              "%s: the kink guard skipped %zu of %zu coordinates", tag, skipped, checked + skipped);
    free(grad);
}

/* A model of `cfg`, initialised, norms jittered, a random batch, checked. */
static inline void gradcheck(const st_model_config *cfg, const char *tag, uint64_t seed)
{
    st_arena arena;
    st_arena_init(&arena, "test_model", NULL, 0);
    st_model *m = make_model(cfg, 8, &arena);
    st_rng r = st_rng_seed(seed);
    st_model_init_params(m, seed);
    jitter_norms(m, &r);
    fill_rows(m, 0, 8, &r);
    check_model_grads(m, tag, seed + 1);
    st_model_destroy(m);
    st_arena_release(&arena);
}

/* ------------------------------------------------------------ models */

/* Scaling by 1 is no scaling, to the bit. */
static inline void check_scale_one_is_plain(st_model_config c)
{
    omp_set_num_threads(1);
    st_arena a;
    st_arena_init(&a, "scale", NULL, 0);
    st_model_config c1 = c;
    c1.subnet.scale = 1.0f;
    st_model *m = make_model(&c, 8, &a), *m1 = make_model(&c1, 8, &a);
    st_model_init_params(m, 3);
    st_model_init_params(m1, 3);
    st_rng r = st_rng_seed(4);
    fill_rows(m, 0, 8, &r);
    r = st_rng_seed(4);
    fill_rows(m1, 0, 8, &r);
    float l, l1;
    OK(st_model_forward_backward(m, &l));
    OK(st_model_forward_backward(m1, &l1));
    cr_assert_eq(l, l1);
    cr_assert_eq(memcmp(st_model_grads(m), st_model_grads(m1),
                        st_model_param_count(m) * sizeof(float)), 0);
    st_model_destroy(m);
    st_model_destroy(m1);
    st_arena_release(&a);
}

/* A small byte-level transformer: 13 token ids, 6 tokens, 2 heads of 8,
 * hidden 24 (not 4 x 16, so that a D / F mix-up shows). */
static inline st_model_config gpt_config(int depth, int width, int heads, int context)
{
    st_model_config c = { .kind = st_model_kind_named("gpt"), .depth = depth, .width = width,
                          .hidden = 24, .activation = ST_ACT_GELU, .in_dim = context,
                          .n_classes = 13, .context = context, .heads = heads };
    return c;
}

/* A small vision transformer on C x H x W images of 5 classes: 2 heads
 * of 8, hidden 24 (not 4 x 16, so that a D / F mix-up shows). */
static inline st_model_config vit_config(int depth, int c, int h, int w, int patch,
                                         st_token_pool pool)
{
    st_model_config m = { .kind = st_model_kind_named("vit"), .depth = depth, .width = 16,
                          .hidden = 24, .activation = ST_ACT_GELU, .in_dim = c * h * w,
                          .in_channels = c, .in_height = h, .in_width = w, .n_classes = 5,
                          .heads = 2, .patch = patch, .pool = pool };
    return m;
}

/* resmlp d3, width 16, hidden 24 in groups of 4 (6 groups); mlp d3 width 20
 * in groups of 4 (5 groups).  Each layer keeps its own groups: scattered,
 * adjacent (to test merging) and the last one. */
static const int NEURON_COUNT[] = { 3, 1, 2 };
static const int NEURON_GROUPS_RES[] = { 0, 2, 3, 5, 1, 4 };
static const int NEURON_GROUPS_MLP[] = { 0, 2, 3, 4, 1, 4 };

static inline st_model_config neuron_config(st_model_kind kind, int grads_only)
{
    const int res = kind == st_model_kind_named("resmlp");
    st_model_config c = res ? resmlp_config(3, 16, 24, ST_ACT_GELU)
                            : mlp_config(3, 20, ST_ACT_GELU);
    c.subnet.unit_size = 4;
    c.subnet.width_count = NEURON_COUNT;
    c.subnet.width_kept = res ? NEURON_GROUPS_RES : NEURON_GROUPS_MLP;
    c.subnet.width_grads_only = grads_only;
    return c;
}

/* The full-layout ranges of a model's parameters (or gradients), sized by
 * a counting call first. */
static inline int ranges_of(const st_model *m, int grads, st_range **r, size_t **local)
{
    int n = grads ? st_model_full_grad_ranges(m, NULL, NULL, 0)
                  : st_model_full_ranges(m, NULL, NULL, 0);
    cr_assert_gt(n, 0);
    *r = malloc((size_t)n * sizeof **r);
    *local = malloc((size_t)n * sizeof **local);
    int got = grads ? st_model_full_grad_ranges(m, *r, *local, n)
                    : st_model_full_ranges(m, *r, *local, n);
    cr_assert_eq(got, n, "the counting call and the filling call agree");
    cr_assert_eq(grads ? st_model_full_grad_ranges(m, *r, *local, n - 1)
                       : st_model_full_ranges(m, *r, *local, n - 1), -1, "too small a cap: -1");
    return n;
}

/* The largest relative difference between a backward-masked model's
 * gradients and the full model's at the same full-layout places;
 * *covered: how many it holds, *n_ranges: in how many ranges. */
static inline double kept_grad_diff(st_model *m, st_model *full, size_t *covered,
                                    int *n_ranges)
{
    st_range *rg;
    size_t *local;
    const int n = ranges_of(m, 1, &rg, &local);
    double worst = 0.0;
    *covered = 0;
    for (int i = 0; i < n; i++)
        for (size_t k = 0; k < rg[i].end - rg[i].begin; k++, (*covered)++) {
            double g = st_model_grads(m)[local[i] + k], f = st_model_grads(full)[rg[i].begin + k];
            double d = fabs(g - f) / (1e-6 + fabs(f));
            worst = d > worst ? d : worst;
        }
    free(rg);
    free(local);
    *n_ranges = n;
    return worst;
}

static inline st_model_config resnet_config(st_model_kind kind, int depth, int width, int c, int h,
                                            int w)
{
    st_model_config m = { .kind = kind, .depth = depth, .width = width,
                          .activation = ST_ACT_RELU, .in_dim = c * h * w, .in_channels = c,
                          .in_height = h, .in_width = w, .n_classes = 5 };
    return m;
}

#endif /* SUBTRAIN_TESTS_MODEL_CHECK_H */

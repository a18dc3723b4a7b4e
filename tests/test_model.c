/*
 * tests/test_model.c — whole models through the public API (subtrain/model.h):
 * finite-difference gradient checks of every parameter segment, padded
 * evaluation, the parameter layout and count, initialisation, configuration
 * checks and the FLOP count.
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
#define _GNU_SOURCE /* RTLD_NEXT, for heapwatch.h */
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

#include "nn/graph.h"

/* Heap calls of the armed thread (see the resnet tests at the end). */
#define HEAPWATCH_PER_THREAD
#include "heapwatch.h"

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
static st_model_config mlp_config(int depth, int width, st_activation act)
{
    st_model_config c = { .kind = ST_MODEL_MLP, .depth = depth, .width = width, .hidden = 0,
                          .activation = act, .in_dim = 12, .n_classes = 5 };
    return c;
}

static st_model_config resmlp_config(int depth, int width, int hidden, st_activation act)
{
    st_model_config c = { .kind = ST_MODEL_RESMLP, .depth = depth, .width = width,
                          .hidden = hidden, .activation = act, .in_dim = 12, .n_classes = 5 };
    return c;
}

static st_model *make_model(const st_model_config *cfg, int batch, st_arena *arena)
{
    st_model *m = NULL;
    OK(st_model_create(cfg, batch, arena, &m));
    cr_assert_not_null(m);
    return m;
}

/* Rows of the logits and labels: a row per token of a sequence model. */
static int rows_of(const st_model *m)
{
    return st_model_batch(m) * st_model_tokens(m);
}

/* Rows [first, last) of the input ~ U(-1.5, 1.5), labels uniform in [0, K);
 * a sequence model's: token ids and next tokens uniform in [0, K). */
static void fill_rows(st_model *m, int first, int last, st_rng *r)
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

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Layer norm parameters away from their init (1, 0): a gradient check at
 * gamma = 1, beta = 0 would not see gamma and beta swapped in the backward. */
static void jitter_norms(st_model *m, st_rng *r)
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

static double forward_loss_sum(st_model *m)
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
static double logits_mean_ce(st_model *m)
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
static double model_objective(st_model *m)
{
    forward_loss_sum(m);
    return logits_mean_ce(m);
}

/* Finite-difference check of every segment of a model on up to
 * COORDS_PER_SEGMENT coordinates each.  The input and labels must be set. */
static void check_model_grads(st_model *m, const char *tag, uint64_t seed)
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
static void gradcheck(const st_model_config *cfg, const char *tag, uint64_t seed)
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

/* ------------------------------------------------------------ gradient checks */

Test(gradcheck, mlp_gelu)
{
    omp_set_num_threads(1);
    st_model_config c = mlp_config(3, 20, ST_ACT_GELU);
    gradcheck(&c, "mlp d3 w20 gelu", 101);
}

Test(gradcheck, mlp_relu)
{
    omp_set_num_threads(1);
    st_model_config c = mlp_config(3, 20, ST_ACT_RELU);
    gradcheck(&c, "mlp d3 w20 relu", 102);
}

Test(gradcheck, mlp_depth2_gelu)
{
    omp_set_num_threads(1);
    st_model_config c = mlp_config(2, 13, ST_ACT_GELU);
    gradcheck(&c, "mlp d2 w13 gelu", 103);
}

Test(gradcheck, resmlp_gelu)
{
    omp_set_num_threads(1);
    st_model_config c = resmlp_config(2, 16, 24, ST_ACT_GELU);
    gradcheck(&c, "resmlp d2 w16 h24 gelu", 104);
}

/* A scaled branch (subnetworks train with 1 / coverage): the scale is a
 * post-op of the forward matmul and of the three backward products. */
Test(gradcheck, resmlp_scaled_branch_gelu)
{
    omp_set_num_threads(1);
    st_model_config c = resmlp_config(2, 16, 24, ST_ACT_GELU);
    c.subnet.scale = 2.0f;
    gradcheck(&c, "resmlp d2 w16 h24 gelu branch x2", 105);
}

/* Scaling by 1 is no scaling, to the bit. */
static void check_scale_one_is_plain(st_model_config c)
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

Test(model, branch_scale_one_is_plain)
{
    check_scale_one_is_plain(resmlp_config(2, 16, 24, ST_ACT_GELU));
}

Test(gradcheck, resmlp_relu)
{
    omp_set_num_threads(1);
    st_model_config c = resmlp_config(2, 16, 24, ST_ACT_RELU);
    gradcheck(&c, "resmlp d2 w16 h24 relu", 105);
}

/* A small byte-level transformer: 13 token ids, 6 tokens, 2 heads of 8,
 * hidden 24 (not 4 x 16, so that a D / F mix-up shows). */
static st_model_config gpt_config(int depth, int width, int heads, int context)
{
    st_model_config c = { .kind = ST_MODEL_GPT, .depth = depth, .width = width, .hidden = 24,
                          .activation = ST_ACT_GELU, .in_dim = context, .n_classes = 13,
                          .context = context, .heads = heads };
    return c;
}

/* Every segment of the transformer: embeddings (their scatter-add),
 * layer norms, the fused Q K V projection, attention (scores, causal
 * mask, softmax and context, through the input gradient they pass on),
 * the output projection, the GELU MLP and the head. */
Test(gradcheck, gpt)
{
    omp_set_num_threads(1);
    st_model_config c = gpt_config(2, 16, 2, 6);
    gradcheck(&c, "gpt d2 w16 h2 T6", 107);
}

/* Causality: the logits of token t do not move when a later token does. */
Test(model, gpt_is_causal)
{
    omp_set_num_threads(1);
    st_model_config c = gpt_config(2, 16, 2, 6);
    st_arena arena;
    st_arena_init(&arena, "test_model", NULL, 0);
    st_model *m = make_model(&c, 2, &arena);
    st_model_init_params(m, 5);
    st_rng r = st_rng_seed(6);
    fill_rows(m, 0, 2, &r);
    double sum = 0.0;
    int64_t hits = 0;
    OK(st_model_evaluate(m, 2, &sum, &hits));
    const size_t n = (size_t)rows_of(m) * 13;
    float *before = malloc(n * sizeof *before);
    cr_assert(before);
    memcpy(before, st_model_logits(m), n * sizeof *before);
    float *x = st_model_input(m);
    x[4] = (float)(((int)x[4] + 1) % 13);   /* sample 0, token 4 */
    OK(st_model_evaluate(m, 2, &sum, &hits));
    const float *after = st_model_logits(m);
    for (size_t i = 0; i < n; i++) {
        const size_t row = i / 13;   /* sample row / 6, token row % 6 */
        if (row < 4 || row >= 6)
            cr_assert_eq(after[i], before[i], "logit %zu (row %zu) moved", i, row);
    }
    int moved = 0;
    for (size_t i = 4 * 13; i < 6 * 13; i++)
        moved += after[i] != before[i];
    cr_assert(moved > 0, "the changed token changed nothing at or after it");
    free(before);
    st_model_destroy(m);
    st_arena_release(&arena);
}

/* The k largest logits of a row of 256 (ties: the lower byte), as a mask. */
static void top_bytes(const float *row, int k, uint8_t *in_top)
{
    memset(in_top, 0, 256);
    for (int n = 0; n < k; n++) {
        int best = -1;
        for (int j = 0; j < 256; j++)
            if (!in_top[j] && (best < 0 || row[j] > row[best]))
                best = j;
        in_top[best] = 1;
    }
}

/* Sampling (st_model_generate): a pure function of the seed, a shorter
 * request a prefix of a longer one, top-k 1 the greedy choice whatever
 * the temperature, draws within the top k, the greedy byte the argmax of
 * an ordinary evaluation of the prompt padded with zeros, and clear
 * refusals of what it cannot do. */
Test(model, gpt_generate)
{
    omp_set_num_threads(1);
    st_model_config c = gpt_config(2, 16, 2, 6);
    c.n_classes = 256;   /* a byte-level model */
    st_arena arena;
    st_arena_init(&arena, "test_model", NULL, 0);
    st_model *m = make_model(&c, 1, &arena);
    st_model_init_params(m, 5);
    const uint8_t prompt[] = "ab", longer[] = "a prompt longer than the context";
    uint8_t a[24], b[24], g[24];
    OK(st_model_generate(m, prompt, 2, 24, 1.0f, 0, 3, a));
    OK(st_model_generate(m, prompt, 2, 24, 1.0f, 0, 3, b));
    cr_assert_eq(memcmp(a, b, sizeof a), 0, "the same seed gave other bytes");
    OK(st_model_generate(m, prompt, 2, 7, 1.0f, 0, 3, b));
    cr_assert_eq(memcmp(a, b, 7), 0, "7 bytes are not the prefix of 24");
    OK(st_model_generate(m, prompt, 2, 24, 1.0f, 0, 4, b));
    cr_assert_neq(memcmp(a, b, sizeof a), 0, "seeds 3 and 4 gave the same 24 bytes");
    /* no heap call of subtrain's own per byte (oneDNN's are its own; see
     * heapwatch.h), once oneDNN has set up its thread */
    own_calls = 0;
    armed = 1;
    OK(st_model_generate(m, prompt, 2, 24, 1.0f, 40, 4, b));
    armed = 0;
    if (HEAPWATCH_ACTIVE)   /* (under AddressSanitizer nothing is counted) */
        cr_expect_eq(own_calls, 0, "generating 24 bytes called the heap %ld times", own_calls);

    /* greedy: temperature 0, or top-k 1 at any temperature and seed */
    OK(st_model_generate(m, prompt, 2, 24, 0.0f, 40, 3, g));
    const float temps[] = { 0.5f, 1.0f, 7.0f };
    for (int i = 0; i < 3; i++) {
        OK(st_model_generate(m, prompt, 2, 24, temps[i], 1, 10 + (uint64_t)i, b));
        cr_assert_eq(memcmp(g, b, sizeof g), 0, "top-k 1 at temperature %g is not greedy",
                     (double)temps[i]);
    }
    /* the greedy first byte is the argmax at position 1 of an evaluation
     * of "ab" followed by zeros */
    float *x = st_model_input(m);
    int32_t *y = st_model_labels(m);
    for (int t = 0; t < 6; t++) {
        x[t] = t < 2 ? (float)prompt[t] : 0.0f;
        y[t] = 0;
    }
    double sum = 0.0;
    int64_t hits = 0;
    OK(st_model_evaluate(m, 1, &sum, &hits));
    uint8_t top[256];
    top_bytes(st_model_logits(m) + 256, 1, top);
    cr_assert(top[g[0]], "greedy byte %d is not the argmax of the evaluation", g[0]);

    /* each draw is among the 3 likeliest bytes: the logits the generator
     * last read (byte 0 of a 1-byte request) say which */
    for (uint64_t seed = 0; seed < 20; seed++) {
        OK(st_model_generate(m, prompt, 2, 1, 2.0f, 3, seed, b));
        top_bytes(st_model_logits(m) + 256, 3, top);
        cr_assert(top[b[0]], "seed %llu drew byte %d, not in the top 3",
                  (unsigned long long)seed, b[0]);
    }
    /* a prompt longer than the context (its last 6 bytes are read, the
     * window slides) and none (a newline) */
    OK(st_model_generate(m, longer, sizeof longer - 1, 24, 0.8f, 40, 1, a));
    OK(st_model_generate(m, longer + sizeof longer - 1 - 6, 6, 24, 0.8f, 40, 1, b));
    cr_assert_eq(memcmp(a, b, sizeof a), 0, "bytes before the last context changed the text");
    const uint8_t newline = '\n';
    OK(st_model_generate(m, NULL, 0, 24, 0.8f, 40, 1, a));
    OK(st_model_generate(m, &newline, 1, 24, 0.8f, 40, 1, b));
    cr_assert_eq(memcmp(a, b, sizeof a), 0, "an empty prompt is not a newline");

    /* refused: bad temperature or top-k, a batch other than 1, not a gpt */
    cr_assert_eq(st_model_generate(m, prompt, 2, 4, -1.0f, 40, 1, a), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "temperature"), "%s", st_last_error());
    cr_assert_eq(st_model_generate(m, prompt, 2, 4, 0.8f, 257, 1, a), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "top-k"), "%s", st_last_error());
    st_model *m2 = make_model(&c, 2, &arena);
    cr_assert_eq(st_model_generate(m2, prompt, 2, 4, 0.8f, 40, 1, a), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "batch 1"), "%s", st_last_error());
    st_model_config mc = mlp_config(1, 8, ST_ACT_GELU);
    st_model *m3 = make_model(&mc, 1, &arena);
    cr_assert_eq(st_model_generate(m3, prompt, 2, 4, 0.8f, 40, 1, a), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "gpt"), "%s", st_last_error());
    st_model_destroy(m3);
    st_model_destroy(m2);
    st_model_destroy(m);
    st_arena_release(&arena);
}

/* forward_backward overwrites the gradient (it does not accumulate, and
 * reads nothing that was in the gradient vector) and is deterministic. */
Test(model, gradients_overwritten_and_deterministic)
{
    omp_set_num_threads(1);
    st_model_config cfgs[2] = { mlp_config(2, 20, ST_ACT_GELU),
                                resmlp_config(2, 16, 24, ST_ACT_GELU) };
    for (int t = 0; t < 2; t++) {
        st_arena arena;
        st_arena_init(&arena, "test_model", NULL, 0);
        st_model *m = make_model(&cfgs[t], 8, &arena);
        st_rng r = st_rng_seed(7);
        st_model_init_params(m, 7);
        fill_rows(m, 0, 8, &r);
        size_t np = st_model_param_count(m);
        float *g = st_model_grads(m), *first = malloc(np * sizeof *first);
        cr_assert(first);
        float l1, l2;
        OK(st_model_forward_backward(m, &l1));
        memcpy(first, g, np * sizeof *first);
        for (size_t i = 0; i < np; i++)
            g[i] = NAN; /* garbage that any accumulation would propagate */
        OK(st_model_forward_backward(m, &l2));
        cr_expect_eq(l1, l2);
        cr_expect_eq(memcmp(first, g, np * sizeof *g), 0,
                     "%s: a second forward_backward gave other gradients",
                     st_model_kind_name(cfgs[t].kind));
        free(first);
        st_model_destroy(m);
        st_arena_release(&arena);
    }
}

/* ------------------------------------------------------------ padded evaluation */

/* Evaluating the first `rows` rows of a padded batch gives what a model
 * built for exactly `rows` rows gives, with the same parameters: padding
 * rows (garbage input and labels) count in neither the loss nor the hits. */
static void check_padded_evaluate(const st_model_config *cfg, int batch, int rows, uint64_t seed)
{
    st_arena arena;
    st_arena_init(&arena, "test_model", NULL, 0);
    st_model *big = make_model(cfg, batch, &arena);
    st_model *small = make_model(cfg, rows, &arena);
    cr_assert_eq(st_model_param_count(big), st_model_param_count(small));
    st_model_init_params(big, seed);
    /* The layout does not depend on the batch: copy the vector as is. */
    memcpy(st_model_params(small), st_model_params(big),
           st_model_param_count(big) * sizeof(float));

    st_rng r = st_rng_seed(seed + 1);
    fill_rows(small, 0, rows, &r);
    /* An untrained model gets ~ 1 in K right: relabel even rows with the
     * model's own prediction so that the hit count is not trivially 0. */
    double unused = 0.0;
    int64_t unused_hits = 0;
    OK(st_model_evaluate(small, rows, &unused, &unused_hits));
    const int K = cfg->n_classes;
    for (int b = 0; b < rows; b += 2) {
        const float *l = st_model_logits(small) + (size_t)b * (size_t)K;
        int best = 0;
        for (int k = 1; k < K; k++)
            if (l[k] > l[best])
                best = k;
        st_model_labels(small)[b] = best;
    }
    memcpy(st_model_input(big), st_model_input(small),
           (size_t)rows * (size_t)cfg->in_dim * sizeof(float));
    memcpy(st_model_labels(big), st_model_labels(small), (size_t)rows * sizeof(int32_t));
    /* Garbage padding: large inputs, labels from a different stream. */
    float *x = st_model_input(big);
    for (size_t i = (size_t)rows * (size_t)cfg->in_dim; i < (size_t)batch * (size_t)cfg->in_dim; i++)
        x[i] = 50.0f * (2.0f * st_rng_uniform(&r) - 1.0f);
    for (int b = rows; b < batch; b++)
        st_model_labels(big)[b] = (int32_t)st_rng_below(&r, (uint32_t)cfg->n_classes);

    /* evaluate adds to what is there. */
    double sum_big = 1.5, sum_small = 0.0;
    int64_t hits_big = 2, hits_small = 0;
    OK(st_model_evaluate(big, rows, &sum_big, &hits_big));
    OK(st_model_evaluate(small, rows, &sum_small, &hits_small));
    sum_big -= 1.5;
    hits_big -= 2;
    /* Different batch sizes may take different GEMM kernels: the loss may
     * differ by float rounding of the logits (~ 1e-6 per row), not more. */
    fprintf(stderr, "[eval] %s batch %d rows %d: loss sum %.9f, alone %.9f; hits %lld, alone %lld\n",
            st_model_kind_name(cfg->kind), batch, rows, sum_big, sum_small,
            (long long)hits_big, (long long)hits_small);
    cr_expect(fabs(sum_big - sum_small) <= 1e-5 * rows, "padded loss sum %.9f, alone %.9f",
              sum_big, sum_small);
    cr_expect_eq(hits_big, hits_small);
    cr_expect(hits_small >= (rows + 1) / 2 && hits_small <= rows, "%lld hits of %d rows",
              (long long)hits_small, rows);

    /* Other garbage in the padding: bitwise the same loss. */
    for (size_t i = (size_t)rows * (size_t)cfg->in_dim; i < (size_t)batch * (size_t)cfg->in_dim; i++)
        x[i] = -x[i] * 0.5f;
    double sum2 = 0.0;
    int64_t hits2 = 0;
    OK(st_model_evaluate(big, rows, &sum2, &hits2));
    cr_expect_eq(sum2, sum_big, "padding changed the loss: %.17g vs %.17g", sum2, sum_big);
    cr_expect_eq(hits2, hits_big);

    /* rows outside [1, batch] are refused. */
    st_clear_error();
    cr_expect_eq(st_model_evaluate(big, 0, &sum2, &hits2), ST_ERR_INVALID);
    cr_expect_eq(st_model_evaluate(big, batch + 1, &sum2, &hits2), ST_ERR_INVALID);
    cr_expect_neq(st_last_error()[0], '\0');

    st_model_destroy(small);
    st_model_destroy(big);
    st_arena_release(&arena);
}

Test(evaluate, padded_batch_mlp)
{
    omp_set_num_threads(1);
    st_model_config c = mlp_config(3, 20, ST_ACT_RELU);
    check_padded_evaluate(&c, 8, 5, 201);
    check_padded_evaluate(&c, 8, 1, 202);
}

Test(evaluate, padded_batch_resmlp)
{
    omp_set_num_threads(1);
    st_model_config c = resmlp_config(2, 16, 24, ST_ACT_GELU);
    check_padded_evaluate(&c, 8, 5, 203);
    check_padded_evaluate(&c, 8, 3, 204);
}

/* ------------------------------------------------------------ layout and count */

/* One expected segment: name, element count, fan-in of its linear layer
 * (0 for norm parameters). */
typedef struct seg_spec {
    char name[40];
    size_t count, fan_in;
} seg_spec;

static void spec(seg_spec *s, int *n, const char *name, size_t count, size_t fan_in)
{
    snprintf(s[*n].name, sizeof s[*n].name, "%s", name);
    s[*n].count = count;
    s[*n].fan_in = fan_in;
    (*n)++;
}

static void spec_linear(seg_spec *s, int *n, const char *prefix, size_t in, size_t out)
{
    char name[40];
    snprintf(name, sizeof name, "%s.weight", prefix);
    spec(s, n, name, in * out, in);
    snprintf(name, sizeof name, "%s.bias", prefix);
    spec(s, n, name, out, in);
}

static void spec_norm(seg_spec *s, int *n, const char *prefix, size_t c)
{
    char name[40];
    snprintf(name, sizeof name, "%s.gamma", prefix);
    spec(s, n, name, c, 0);
    snprintf(name, sizeof name, "%s.beta", prefix);
    spec(s, n, name, c, 0);
}

/* The segments a config should have, in order, written out by hand from the
 * model descriptions in model.h. */
static int expected_segments(const st_model_config *c, seg_spec *s)
{
    int n = 0;
    char name[40];
    size_t W = (size_t)c->width, H = (size_t)(c->hidden ? c->hidden : c->width);
    size_t I = (size_t)c->in_dim, K = (size_t)c->n_classes;
    if (c->kind == ST_MODEL_MLP) {
        for (int i = 0; i < c->depth; i++) {
            snprintf(name, sizeof name, "fc%d", i);
            spec_linear(s, &n, name, i == 0 ? I : W, W);
        }
    } else {
        spec_linear(s, &n, "stem", I, W);
        for (int l = 0; l < c->depth; l++) {
            snprintf(name, sizeof name, "block%d.ln", l);
            spec_norm(s, &n, name, W);
            snprintf(name, sizeof name, "block%d.fc1", l);
            spec_linear(s, &n, name, W, H);
            snprintf(name, sizeof name, "block%d.fc2", l);
            spec_linear(s, &n, name, H, W);
        }
        spec_norm(s, &n, "final_ln", W);
    }
    spec_linear(s, &n, "head", W, K);
    return n;
}

/* Parameter count, by the closed-form formulas:
 *   mlp:    I W + W + (L - 1)(W^2 + W) + W K + K
 *   resmlp: I W + W + L (2W + W H + H + H W + W) + 2W + W K + K */
static size_t param_formula(const st_model_config *c)
{
    size_t W = (size_t)c->width, H = (size_t)(c->hidden ? c->hidden : c->width);
    size_t I = (size_t)c->in_dim, K = (size_t)c->n_classes, L = (size_t)c->depth;
    if (c->kind == ST_MODEL_MLP)
        return I * W + W + (L - 1) * (W * W + W) + W * K + K;
    return I * W + W + L * (2 * W + W * H + H + H * W + W) + 2 * W + W * K + K;
}

static void check_layout(const st_model_config *c, size_t want_count)
{
    st_arena arena;
    st_arena_init(&arena, "test_model", NULL, 0);
    st_model *m = make_model(c, 8, &arena);
    st_model *m3 = make_model(c, 3, &arena);
    cr_expect_eq(st_model_param_count(m), param_formula(c), "%s: %zu parameters, formula %zu",
                 st_model_kind_name(c->kind), st_model_param_count(m), param_formula(c));
    cr_expect_eq(st_model_param_count(m), want_count, "%s: %zu parameters, by hand %zu",
                 st_model_kind_name(c->kind), st_model_param_count(m), want_count);

    seg_spec want[64];
    int nw = expected_segments(c, want), ns, ns3;
    const st_param_segment *s = st_model_segments(m, &ns);
    const st_param_segment *s3 = st_model_segments(m3, &ns3);
    cr_assert_eq(ns, nw, "%d segments, expected %d", ns, nw);
    cr_assert_eq(ns3, ns, "the layout depends on the batch");
    size_t offset = 0;
    for (int i = 0; i < ns; i++) {
        cr_expect_str_eq(s[i].name, want[i].name);
        cr_expect_eq(s[i].count, want[i].count, "%s: %zu elements, expected %zu", s[i].name,
                     s[i].count, want[i].count);
        cr_expect_eq(s[i].offset, offset, "%s at %zu, expected %zu (contiguous)", s[i].name,
                     s[i].offset, offset);
        cr_expect_eq(s[i].decay, ends_with(want[i].name, ".weight"),
                     "%s: decay %d (only weight matrices decay)", s[i].name, s[i].decay);
        cr_expect_str_eq(s3[i].name, s[i].name);
        cr_expect_eq(s3[i].offset, s[i].offset);
        cr_expect_eq(s3[i].count, s[i].count);
        offset += want[i].count;
    }
    cr_expect_eq(offset, st_model_param_count(m));
    st_model_destroy(m3);
    st_model_destroy(m);
    st_arena_release(&arena);
}

Test(layout, mlp_parameter_count_and_segments)
{
    omp_set_num_threads(1);
    st_model_config c = mlp_config(3, 20, ST_ACT_RELU);
    /* 12*20+20 + 2*(20*20+20) + 20*5+5 = 260 + 840 + 105 */
    check_layout(&c, 1205);
    st_model_config c1 = mlp_config(1, 7, ST_ACT_GELU);
    /* 12*7+7 + 7*5+5 = 91 + 40 */
    check_layout(&c1, 131);
}

Test(layout, resmlp_parameter_count_and_segments)
{
    omp_set_num_threads(1);
    st_model_config c = resmlp_config(2, 16, 24, ST_ACT_GELU);
    /* stem 12*16+16 = 208; block: ln 32 + fc1 16*24+24 = 408 + fc2 24*16+16
     * = 400, = 840, twice 1680; final_ln 32; head 16*5+5 = 85 */
    check_layout(&c, 208 + 1680 + 32 + 85);
    st_model_config c0 = resmlp_config(1, 9, 0, ST_ACT_RELU); /* hidden 0 = width */
    /* stem 12*9+9 = 117; block 18 + 90 + 90 = 198; final_ln 18; head 50 */
    check_layout(&c0, 117 + 198 + 18 + 50);
}

/* ------------------------------------------------------------ initialisation */

/* Same seed: bitwise the same vector, whatever the batch; another seed:
 * different in every linear segment; linear weights and biases within
 * +-1/sqrt(fan_in) and spread over that range; gamma 1, beta 0. */
static void check_init(const st_model_config *c)
{
    st_arena arena;
    st_arena_init(&arena, "test_model", NULL, 0);
    st_model *a = make_model(c, 8, &arena), *b = make_model(c, 3, &arena);
    size_t np = st_model_param_count(a);
    float *pa = st_model_params(a), *pb = st_model_params(b);
    st_model_init_params(a, 42);
    st_model_init_params(b, 42);
    cr_expect_eq(memcmp(pa, pb, np * sizeof *pa), 0, "%s: same seed, different parameters",
                 st_model_kind_name(c->kind));
    st_model_init_params(b, 43);

    seg_spec want[64];
    expected_segments(c, want);
    int ns;
    const st_param_segment *s = st_model_segments(a, &ns);
    for (int i = 0; i < ns; i++) {
        const float *p = pa + s[i].offset, *q = pb + s[i].offset;
        size_t n = s[i].count;
        if (want[i].fan_in == 0) {
            float v = ends_with(s[i].name, ".gamma") ? 1.0f : 0.0f;
            for (size_t j = 0; j < n; j++) {
                cr_expect_eq(p[j], v, "%s[%zu] = %g, want %g", s[i].name, j, p[j], v);
                cr_expect_eq(q[j], v);
            }
            continue;
        }
        double bound = 1.0 / sqrt((double)want[i].fan_in), maxabs = 0.0, mean = 0.0;
        size_t same = 0;
        for (size_t j = 0; j < n; j++) {
            /* float bound: 1/sqrtf(fan_in) may round up by an ulp */
            cr_expect(fabs(p[j]) <= bound * (1 + 1e-6), "%s[%zu] = %g outside +-%g", s[i].name,
                      j, p[j], bound);
            maxabs = fmax(maxabs, fabs(p[j]));
            mean += p[j];
            same += p[j] == q[j];
        }
        mean /= (double)n;
        /* Spread: with n >= 60 draws from U(-b, b), max |p| < 0.8 b has
         * probability 0.8^60 ~ 1e-6; the mean is within 4 standard errors
         * (b / sqrt(3n)) of 0. */
        if (n >= 60)
            cr_expect(maxabs >= 0.8 * bound, "%s: max |p| = %g, bound %g: not U(-b, b)",
                      s[i].name, maxabs, bound);
        cr_expect(fabs(mean) <= 4.0 * bound / sqrt(3.0 * (double)n), "%s: mean %g, bound %g",
                  s[i].name, mean, bound);
        cr_expect(same < n, "%s: seeds 42 and 43 gave the same values", s[i].name);
    }
    st_model_destroy(b);
    st_model_destroy(a);
    st_arena_release(&arena);
}

Test(init, mlp)
{
    omp_set_num_threads(1);
    st_model_config c = mlp_config(3, 20, ST_ACT_RELU);
    check_init(&c);
}

Test(init, resmlp)
{
    omp_set_num_threads(1);
    st_model_config c = resmlp_config(2, 16, 24, ST_ACT_GELU);
    check_init(&c);
}

/* ------------------------------------------------------------ config checks */

/* A bad config is refused with ST_ERR_INVALID and a message that names the
 * field; st_model_create refuses it too and returns no model. */
static void expect_rejected(st_model_config c, const char *field)
{
    st_clear_error();
    cr_expect_eq(st_model_config_check(&c), ST_ERR_INVALID, "config with bad %s accepted", field);
    const char *msg = st_last_error();
    cr_expect_neq(msg[0], '\0', "no message for a bad %s", field);
    cr_expect_not_null(strstr(msg, field), "message \"%s\" does not name %s", msg, field);

    st_arena arena;
    st_arena_init(&arena, "test_model", NULL, 0);
    /* Any non-NULL value: create must reset it to NULL on failure (it is
     * never dereferenced). */
    static char sentinel;
    st_model *m = (st_model *)(void *)&sentinel;
    st_clear_error();
    cr_expect_eq(st_model_create(&c, 8, &arena, &m), ST_ERR_INVALID);
    cr_expect_null(m);
    cr_expect_neq(st_last_error()[0], '\0');
    st_arena_release(&arena);
}

Test(config, rejects_bad_configs)
{
    omp_set_num_threads(1);
    st_model_config good = resmlp_config(2, 16, 24, ST_ACT_GELU);
    OK(st_model_config_check(&good));
    st_model_config d = st_model_config_default();
    OK(st_model_config_check(&d));

    st_model_config c = good;
    c.depth = 0;
    expect_rejected(c, "depth");
    c = good;
    c.width = 0;
    expect_rejected(c, "width");
    c = good;
    c.n_classes = 1;
    expect_rejected(c, "classes");
    c = mlp_config(2, 8, ST_ACT_RELU);
    c.depth = 0;
    expect_rejected(c, "depth");
    c = good;
    c.hidden = -1;
    expect_rejected(c, "hidden");
    c = good;
    c.in_dim = 0;
    expect_rejected(c, "input");

    /* batch outside [1, 2^20] */
    st_arena arena;
    st_arena_init(&arena, "test_model", NULL, 0);
    st_model *m = NULL;
    st_clear_error();
    cr_expect_eq(st_model_create(&good, 0, &arena, &m), ST_ERR_INVALID);
    cr_expect_null(m);
    cr_expect_neq(st_last_error()[0], '\0');
    st_arena_release(&arena);
}

/* ------------------------------------------------------------ FLOPs */

/* Matrix-multiply FLOPs of one step, 2 per multiply-add: a linear layer
 * (B, in) -> (B, out) costs 2 B in out forward, the same for dw, and the
 * same again for dx except for the first layer, whose dx nobody needs. */
static double flops_formula(const st_model_config *c, int batch)
{
    double B = batch, W = c->width, H = c->hidden ? c->hidden : c->width;
    double I = c->in_dim, K = c->n_classes, L = c->depth;
    if (c->kind == ST_MODEL_MLP)
        return 2 * B * (2 * I * W + 3 * (L - 1) * W * W + 3 * W * K);
    return 2 * B * (2 * I * W + L * (3 * W * H + 3 * H * W) + 3 * W * K);
}

Test(flops, match_formula)
{
    omp_set_num_threads(1);
    st_model_config cfgs[4] = { mlp_config(3, 20, ST_ACT_RELU), mlp_config(1, 7, ST_ACT_GELU),
                                resmlp_config(2, 16, 24, ST_ACT_GELU),
                                resmlp_config(1, 9, 0, ST_ACT_RELU) };
    for (int t = 0; t < 4; t++) {
        st_arena arena;
        st_arena_init(&arena, "test_model", NULL, 0);
        st_model *m = make_model(&cfgs[t], 8, &arena);
        double got = st_model_step_flops(m), want = flops_formula(&cfgs[t], 8);
        cr_expect_eq(got, want, "%s: %.0f FLOPs, formula %.0f", st_model_kind_name(cfgs[t].kind),
                     got, want);
        st_model_destroy(m);
        st_arena_release(&arena);
    }
    /* By hand, mlp d3 w20, B 8: 2*8*(2*12*20 + 3*2*400 + 3*100) = 16*3180 */
    cr_expect_eq(flops_formula(&cfgs[0], 8), 16.0 * 3180.0);
}

/* ------------------------------------------------------------ subnetworks */

/* A block subnetwork is the full model with some blocks left out: its
 * parameters start as the full model's (same names, same values) and its
 * full-layout ranges say exactly where each of them lives. */
Test(subnetwork, blocks_keep_their_full_names_values_and_places)
{
    st_arena a;
    st_arena_init(&a, "sub", NULL, 0);
    st_model_config full_cfg = resmlp_config(5, 16, 24, ST_ACT_GELU);
    const int ids[] = { 1, 3, 4 };
    st_model_config sub_cfg = full_cfg;
    sub_cfg.subnet.groups = ids;
    sub_cfg.subnet.n_groups = 3;
    st_model *full = make_model(&full_cfg, 4, &a), *sub = make_model(&sub_cfg, 4, &a);
    st_model_init_params(full, 9);
    st_model_init_params(sub, 9);
    cr_assert_eq(st_model_full_param_count(sub), st_model_param_count(full));
    cr_assert_lt(st_model_param_count(sub), st_model_param_count(full));

    st_range r[16];
    size_t local[16];
    int n = st_model_full_ranges(sub, r, local, 16);
    /* stem | block 1 | block 3 + block 4 + final norm + head */
    cr_assert_eq(n, 3, "adjacent pieces merge: got %d ranges", n);
    size_t covered = 0;
    for (int i = 0; i < n; i++) {
        size_t len = r[i].end - r[i].begin;
        cr_assert_eq(memcmp(st_model_params(sub) + local[i], st_model_params(full) + r[i].begin,
                            len * sizeof(float)), 0, "range %d holds the full model's values", i);
        covered += len;
    }
    cr_assert_eq(covered, st_model_param_count(sub));

    int ns, nf;
    const st_param_segment *ss = st_model_segments(sub, &ns), *fs = st_model_segments(full, &nf);
    cr_assert_str_eq(ss[2].name, "block1.ln.gamma");
    cr_assert_str_eq(ss[8].name, "block3.ln.gamma");
    cr_assert_str_eq(ss[ns - 1].name, fs[nf - 1].name);

    st_model *whole = make_model(&full_cfg, 4, &a);
    cr_assert_eq(st_model_full_ranges(whole, r, local, 16), 1);
    cr_assert_eq(r[0].begin, 0);
    cr_assert_eq(r[0].end, st_model_param_count(whole));
    st_model_destroy(whole);
    st_model_destroy(sub);
    st_model_destroy(full);
    st_arena_release(&a);
}

Test(subnetwork, bad_block_ids_are_refused)
{
    st_model_config c = resmlp_config(2, 16, 24, ST_ACT_GELU);
    const int unsorted[] = { 3, 1 }, outside[] = { 0, 5 };
    c.depth = 4;
    c.subnet.n_groups = 2;
    c.subnet.groups = unsorted;
    cr_assert_eq(st_model_config_check(&c), ST_ERR_INVALID);
    c.subnet.groups = outside;
    cr_assert_eq(st_model_config_check(&c), ST_ERR_INVALID);
    c.subnet.groups = NULL;
    cr_assert_eq(st_model_config_check(&c), ST_ERR_INVALID, "a count without ids");
    const int ok[] = { 0, 3 };
    c.subnet.groups = ok;
    cr_assert_eq(st_model_config_check(&c), ST_OK);
    c.subnet.n_groups = 5;
    cr_assert_eq(st_model_config_check(&c), ST_ERR_INVALID, "more groups than the model has");
    /* an mlp declares no layer groups */
    st_model_config m = mlp_config(3, 8, ST_ACT_GELU);
    const int ids[] = { 0, 1 };
    m.subnet.groups = ids;
    m.subnet.n_groups = 2;
    cr_assert_eq(st_model_config_check(&m), ST_ERR_INVALID);
    const uint8_t grads[] = { 1, 0, 1 };
    m.subnet.groups = NULL;
    m.subnet.n_groups = 0;
    m.subnet.group_grads = grads;
    cr_assert_eq(st_model_config_check(&m), ST_ERR_INVALID);
}

/* Backward masking: the forward and every data gradient are the full
 * model's; weight gradients exist only for the kept blocks, and equal the
 * full model's there, to the bit. */
Test(subnetwork, backward_masking_keeps_the_full_gradient_of_held_blocks)
{
    omp_set_num_threads(1);
    st_arena a;
    st_arena_init(&a, "bwd", NULL, 0);
    st_model_config full_cfg = resmlp_config(3, 16, 24, ST_ACT_GELU), cfg = full_cfg;
    const uint8_t keep[] = { 1, 0, 1 };
    cfg.subnet.group_grads = keep;
    st_model *full = make_model(&full_cfg, 8, &a), *m = make_model(&cfg, 8, &a);
    st_model_init_params(full, 5);
    st_model_init_params(m, 5);
    st_rng r = st_rng_seed(6);
    fill_rows(full, 0, 8, &r);
    r = st_rng_seed(6);
    fill_rows(m, 0, 8, &r);
    float lf, lm;
    OK(st_model_forward_backward(full, &lf));
    OK(st_model_forward_backward(m, &lm));
    cr_assert_eq(lf, lm, "the forward is the full model's");
    size_t block = 2 * 16 + (16 * 24 + 24) + (24 * 16 + 16);
    cr_assert_eq(st_model_grad_count(m), st_model_param_count(m) - block);

    st_range rg[8];
    size_t local[8];
    int n = st_model_full_grad_ranges(m, rg, local, 8);
    cr_assert_eq(n, 2, "everything but block 1: two ranges, got %d", n);
    size_t covered = 0;
    for (int i = 0; i < n; i++) {
        size_t len = rg[i].end - rg[i].begin;
        cr_assert_eq(memcmp(st_model_grads(m) + local[i], st_model_grads(full) + rg[i].begin,
                            len * sizeof(float)), 0, "range %d: the full model's gradient", i);
        covered += len;
    }
    cr_assert_eq(covered, st_model_grad_count(m));
    int ns;
    const st_param_segment *s = st_model_segments(m, &ns);
    for (int i = 0; i < ns; i++)
        cr_assert_eq(s[i].grad_offset == ST_NO_GRAD, strncmp(s[i].name, "block1.", 7) == 0,
                     "%s", s[i].name);
    cr_assert_lt(st_model_step_flops(m), st_model_step_flops(full),
                 "no weight-gradient products for the dropped block");
    st_model_destroy(m);
    st_model_destroy(full);
    st_arena_release(&a);
}

/* ------------------------------------------------------------ neuron subnetworks */

/* resmlp d3, width 16, hidden 24 in groups of 4 (6 groups); mlp d3 width 20
 * in groups of 4 (5 groups).  Each layer keeps its own groups: scattered,
 * adjacent (to test merging) and the last one. */
static const int NEURON_COUNT[] = { 3, 1, 2 };
static const int NEURON_GROUPS_RES[] = { 0, 2, 3, 5, 1, 4 };
static const int NEURON_GROUPS_MLP[] = { 0, 2, 3, 4, 1, 4 };

static st_model_config neuron_config(st_model_kind kind, int grads_only)
{
    st_model_config c = kind == ST_MODEL_RESMLP ? resmlp_config(3, 16, 24, ST_ACT_GELU)
                                                : mlp_config(3, 20, ST_ACT_GELU);
    c.subnet.unit_size = 4;
    c.subnet.width_count = NEURON_COUNT;
    c.subnet.width_kept = kind == ST_MODEL_RESMLP ? NEURON_GROUPS_RES : NEURON_GROUPS_MLP;
    c.subnet.width_grads_only = grads_only;
    return c;
}

/* The full-layout ranges of a model's parameters (or gradients), sized by
 * a counting call first. */
static int ranges_of(const st_model *m, int grads, st_range **r, size_t **local)
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
static double kept_grad_diff(st_model *m, st_model *full, size_t *covered,
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

/* A compact neuron subnetwork starts with exactly the full model's values
 * at the places its ranges name; scattering it into a full-size vector and
 * gathering it back round-trips to the bit; ranges are sorted and disjoint
 * and cover the compact vector once. */
static void check_neuron_places(st_model_kind kind)
{
    st_arena a;
    st_arena_init(&a, "neurons", NULL, 0);
    st_model_config sub_cfg = neuron_config(kind, 0), full_cfg = sub_cfg;
    full_cfg.subnet.width_count = NULL;
    full_cfg.subnet.width_kept = NULL;
    st_model *full = make_model(&full_cfg, 4, &a), *sub = make_model(&sub_cfg, 4, &a);
    st_model_init_params(full, 9);
    st_model_init_params(sub, 9);
    cr_assert_lt(st_model_param_count(sub), st_model_param_count(full));
    cr_assert_eq(st_model_full_param_count(sub), st_model_param_count(full));
    st_range *r;
    size_t *local;
    int n = ranges_of(sub, 0, &r, &local);
    size_t P = st_model_param_count(full), covered = 0;
    float *scattered = calloc(P, sizeof *scattered), *back = calloc(st_model_param_count(sub), 4);
    for (int i = 0; i < n; i++) {
        size_t len = r[i].end - r[i].begin;
        cr_assert(i == 0 || r[i].begin > r[i - 1].end || (r[i].begin == r[i - 1].end &&
                  local[i] != local[i - 1] + (r[i - 1].end - r[i - 1].begin)),
                  "range %d sorted, disjoint, not mergeable", i);
        cr_assert_eq(memcmp(st_model_params(sub) + local[i], st_model_params(full) + r[i].begin,
                            len * sizeof(float)), 0, "%s range %d: the full model's values",
                     st_model_kind_name(kind), i);
        memcpy(scattered + r[i].begin, st_model_params(sub) + local[i], len * sizeof(float));
        covered += len;
    }
    for (int i = 0; i < n; i++)
        memcpy(back + local[i], scattered + r[i].begin, (r[i].end - r[i].begin) * sizeof(float));
    cr_assert_eq(covered, st_model_param_count(sub));
    cr_assert_eq(memcmp(back, st_model_params(sub), covered * sizeof(float)), 0, "round trip");
    fprintf(stderr, "neuron subnetwork of %s: %zu of %zu parameters in %d ranges\n",
            st_model_kind_name(kind), covered, P, n);
    free(scattered);
    free(back);
    free(r);
    free(local);
    st_model_destroy(sub);
    st_model_destroy(full);
    st_arena_release(&a);
}

Test(subnetwork, neurons_keep_their_full_values_and_places_resmlp) { check_neuron_places(ST_MODEL_RESMLP); }
Test(subnetwork, neurons_keep_their_full_values_and_places_mlp) { check_neuron_places(ST_MODEL_MLP); }

/* Is neuron j of neuron layer l kept by neuron_config? */
static int neuron_kept(const st_model_config *c, int l, int j)
{
    const int *g = c->subnet.width_kept;
    for (int k = 0; k < l; k++)
        g += c->subnet.width_count[k];
    for (int k = 0; k < c->subnet.width_count[l]; k++)
        if (g[k] == j / c->subnet.unit_size)
            return 1;
    return 0;
}

static float *segment_named(st_model *m, const char *name, size_t *count)
{
    int n;
    const st_param_segment *s = st_model_segments(m, &n);
    for (int i = 0; i < n; i++)
        if (strcmp(s[i].name, name) == 0) {
            *count = s[i].count;
            return st_model_params(m) + s[i].offset;
        }
    cr_assert_fail("no segment %s", name);
    return NULL;
}

/* What a compact subnetwork computes is the full model with the dropped
 * neurons silenced: their outgoing weights zeroed. */
static void check_neuron_forward(st_model_kind kind)
{
    omp_set_num_threads(1);
    st_arena a;
    st_arena_init(&a, "neurons", NULL, 0);
    st_model_config sub_cfg = neuron_config(kind, 0), full_cfg = sub_cfg;
    full_cfg.subnet.width_count = NULL;
    full_cfg.subnet.width_kept = NULL;
    st_model *full = make_model(&full_cfg, 8, &a), *sub = make_model(&sub_cfg, 8, &a);
    st_model_init_params(full, 3);
    st_model_init_params(sub, 3);
    for (int l = 0; l < 3; l++) {
        char name[32];
        size_t count;
        if (kind == ST_MODEL_RESMLP) {   /* fc2 stored (hidden, width): a row per neuron */
            snprintf(name, sizeof name, "block%d.fc2.weight", l);
            float *w = segment_named(full, name, &count);
            for (int j = 0; j < 24; j++)
                if (!neuron_kept(&sub_cfg, l, j))
                    memset(w + (size_t)j * 16, 0, 16 * sizeof *w);
        } else {                         /* the next layer's (out, 20): a column */
            snprintf(name, sizeof name, l == 2 ? "head.weight" : "fc%d.weight", l + 1);
            float *w = segment_named(full, name, &count);
            for (size_t row = 0; row < count / 20; row++)
                for (int j = 0; j < 20; j++)
                    if (!neuron_kept(&sub_cfg, l, j))
                        w[row * 20 + (size_t)j] = 0.0f;
        }
    }
    st_rng r = st_rng_seed(4);
    fill_rows(full, 0, 8, &r);
    r = st_rng_seed(4);
    fill_rows(sub, 0, 8, &r);
    double ls = 0.0, lf = 0.0;
    int64_t cs = 0, cf = 0;
    OK(st_model_evaluate(sub, 8, &ls, &cs));
    OK(st_model_evaluate(full, 8, &lf, &cf));
    double worst = 0.0;
    for (int i = 0; i < 8 * 5; i++) {
        double d = fabs((double)st_model_logits(sub)[i] - st_model_logits(full)[i]);
        worst = d > worst ? d : worst;
    }
    fprintf(stderr, "%s neuron subnetwork vs masked full model: max |logit diff| %.3g\n",
            st_model_kind_name(kind), worst);
    /* the same sums with zeros left out: rounding only, ~ 1e-7 of O(1) logits */
    cr_assert_lt(worst, 1e-5, "compact = masked full model (max diff %g)", worst);
    st_model_destroy(sub);
    st_model_destroy(full);
    st_arena_release(&a);
}

Test(subnetwork, neuron_subnetwork_is_the_masked_full_model_resmlp) { check_neuron_forward(ST_MODEL_RESMLP); }
Test(subnetwork, neuron_subnetwork_is_the_masked_full_model_mlp) { check_neuron_forward(ST_MODEL_MLP); }

Test(gradcheck, resmlp_neuron_subnetwork)
{
    st_model_config c = neuron_config(ST_MODEL_RESMLP, 0);
    c.subnet.scale = 2.0f;
    gradcheck(&c, "resmlp neuron subnetwork (branch x2)", 41);
}

Test(gradcheck, mlp_neuron_subnetwork)
{
    st_model_config c = neuron_config(ST_MODEL_MLP, 0);
    c.subnet.scale = 2.0f;
    gradcheck(&c, "mlp neuron subnetwork (inputs x2)", 43);
}

/* Backward masking of neurons: the full model's forward; weight gradients
 * for the kept neurons' rows only, equal to the full model's there. */
static void check_neuron_backward(st_model_kind kind)
{
    omp_set_num_threads(1);
    st_arena a;
    st_arena_init(&a, "neurons", NULL, 0);
    st_model_config cfg = neuron_config(kind, 1), full_cfg = cfg;
    full_cfg.subnet.width_count = NULL;
    full_cfg.subnet.width_kept = NULL;
    st_model *full = make_model(&full_cfg, 8, &a), *m = make_model(&cfg, 8, &a);
    cr_assert_eq(st_model_param_count(m), st_model_param_count(full));
    cr_assert_lt(st_model_grad_count(m), st_model_param_count(m));
    st_model_init_params(full, 5);
    st_model_init_params(m, 5);
    cr_assert_eq(memcmp(st_model_params(m), st_model_params(full),
                        st_model_param_count(m) * sizeof(float)), 0);
    st_rng r = st_rng_seed(6);
    fill_rows(full, 0, 8, &r);
    r = st_rng_seed(6);
    fill_rows(m, 0, 8, &r);
    float lf, lm;
    OK(st_model_forward_backward(full, &lf));
    OK(st_model_forward_backward(m, &lm));
    cr_assert_eq(lf, lm, "the forward is the full model's");
    size_t covered;
    int n;
    double worst = kept_grad_diff(m, full, &covered, &n);
    cr_assert_eq(covered, st_model_grad_count(m));
    fprintf(stderr, "%s neuron backward masking: %zu of %zu gradients, max rel diff %.3g\n",
            st_model_kind_name(kind), covered, st_model_param_count(m), worst);
    /* the same dot products over the batch, maybe blocked differently */
    cr_assert_lt(worst, 1e-5, "kept rows carry the full model's gradient (%g)", worst);
    cr_assert_lt(st_model_step_flops(m), st_model_step_flops(full));
    st_model_destroy(m);
    st_model_destroy(full);
    st_arena_release(&a);
}

Test(subnetwork, neuron_backward_masking_resmlp) { check_neuron_backward(ST_MODEL_RESMLP); }
Test(subnetwork, neuron_backward_masking_mlp) { check_neuron_backward(ST_MODEL_MLP); }

Test(subnetwork, bad_neuron_selections_are_refused)
{
    st_model_config c = neuron_config(ST_MODEL_RESMLP, 0);
    cr_assert_eq(st_model_config_check(&c), ST_OK);
    cr_assert_eq(st_model_neuron_groups(&c, c.subnet.unit_size), 6);
    const int none[] = { 3, 0, 2 }, unsorted[] = { 0, 3, 2, 5, 1, 4 }, outside[] = { 0, 2, 6, 5, 1, 4 };
    c.subnet.width_count = none;
    cr_assert_eq(st_model_config_check(&c), ST_ERR_INVALID, "a layer with no neuron");
    c.subnet.width_count = NEURON_COUNT;
    c.subnet.width_kept = unsorted;
    cr_assert_eq(st_model_config_check(&c), ST_ERR_INVALID);
    c.subnet.width_kept = outside;
    cr_assert_eq(st_model_config_check(&c), ST_ERR_INVALID);
    c.subnet.width_kept = NULL;
    cr_assert_eq(st_model_config_check(&c), ST_ERR_INVALID, "counts without groups");
    c = neuron_config(ST_MODEL_RESMLP, 0);
    const int ids[] = { 0, 1, 2 };
    c.subnet.groups = ids;
    c.subnet.n_groups = 3;
    cr_assert_eq(st_model_config_check(&c), ST_ERR_INVALID, "block and neuron at once");
}

/* st_model_init_full_range gives, for any range, the values
 * st_model_init_params puts there in a built full model (mlp; resmlp with
 * its neuron-major second layers). */
Test(init, full_range_without_a_model_matches_a_built_one)
{
    st_model_config cfgs[2] = { mlp_config(3, 20, ST_ACT_GELU),
                                resmlp_config(3, 16, 24, ST_ACT_GELU) };
    for (int t = 0; t < 2; t++) {
        st_arena a;
        st_arena_init(&a, "init", NULL, 0);
        st_model *m = make_model(&cfgs[t], 2, &a);
        st_model_init_params(m, 77);
        const size_t P = st_model_param_count(m);
        float *out = malloc(P * sizeof *out);
        st_rng r = st_rng_seed(5);
        for (int k = 0; k < 40; k++) {
            size_t lo = st_rng_below(&r, (uint32_t)P), hi = lo + 1 + st_rng_below(&r, (uint32_t)(P - lo));
            if (k == 0) {
                lo = 0;
                hi = P;
            }
            cr_assert_eq(st_model_init_full_range(&cfgs[t], 77, lo, hi, out), ST_OK);
            cr_assert_eq(memcmp(out, st_model_params(m) + lo, (hi - lo) * sizeof *out), 0,
                         "%s: range [%zu, %zu)", st_model_kind_name(cfgs[t].kind), lo, hi);
        }
        free(out);
        st_model_destroy(m);
        st_arena_release(&a);
    }
}

/* ------------------------------------------------------------ declared units */

/* The units come from the layers' declarations: mlp has one width layer
 * per hidden layer, chained (hidden-to-hidden matrices), no groups;
 * resmlp one group and one width layer (the inner layer) per block. */
Test(units, declared_by_layers)
{
    st_model_units u;
    st_model_config c = mlp_config(3, 48, ST_ACT_RELU);
    cr_assert_eq(st_model_config_units(&c, &u), ST_OK);
    cr_assert_eq(u.groups, 0);
    cr_assert_eq(u.width_layers, 3);
    cr_assert_eq(u.width, 48);
    cr_assert_eq(u.chained, 1);
    c = resmlp_config(5, 32, 80, ST_ACT_GELU);
    cr_assert_eq(st_model_config_units(&c, &u), ST_OK);
    cr_assert_eq(u.groups, 5);
    cr_assert_eq(u.width_layers, 5);
    cr_assert_eq(u.width, 80, "the inner width, not the stream's");
    cr_assert_eq(u.chained, 0);
    c.kind = (st_model_kind)77;
    cr_assert_eq(st_model_config_units(&c, &u), ST_ERR_INVALID);
}

/* Chained ranges are exactly the weights of fc1 .. fc{L-1} of an mlp (the
 * layers whose both sides are hidden layers), found from the segments. */
Test(units, chained_ranges_are_hidden_to_hidden_weights)
{
    st_model_config c = mlp_config(4, 24, ST_ACT_RELU);
    st_param_segment *segs;
    int n_segs;
    cr_assert_eq(st_model_config_segments(&c, &segs, &n_segs), ST_OK);
    st_range r[16];
    int n = st_model_config_chained_ranges(&c, r, 16);
    cr_assert_eq(n, 3);
    int k = 0;
    for (int i = 0; i < n_segs; i++) {
        const char *s = segs[i].name;
        if (strncmp(s, "fc", 2) == 0 && strcmp(s, "fc0.weight") != 0 && ends_with(s, ".weight")) {
            cr_assert_lt(k, n);
            cr_assert_eq(r[k].begin, segs[i].offset, "%s", s);
            cr_assert_eq(r[k].end, segs[i].offset + segs[i].count, "%s", s);
            k++;
        }
    }
    cr_assert_eq(k, n);
    free(segs);
    st_model_config rc = resmlp_config(3, 16, 0, ST_ACT_GELU);
    cr_assert_eq(st_model_config_chained_ranges(&rc, r, 16), 0);
}

/* ------------------------------------------------------------ a new layer kind */

/* What adding a layer kind takes, shown with one the library does not
 * have: y = x / 2, its own loop, no parameters.  Its table entry is all
 * the graph needs; a model declared with it (below) gets layout, memory,
 * the forward and backward loops, layer groups and width units without a
 * line changed elsewhere. */
static st_status half_build(st_model *m, st_layer *l)
{
    st_neuron_sel t;
    l->u.loop.x = st_graph_data(m, l->x);
    l->u.loop.y = st_graph_data(m, l->y);
    l->u.loop.dx = st_graph_data(m, l->dx);
    l->u.loop.dy = st_graph_data(m, l->dy);
    l->u.loop.rows = st_model_batch(m);
    l->u.loop.cols = st_graph_sel(m, l->out_unit, l->out, &t)->n;
    return ST_OK;
}

static st_status half_forward(const st_nn_ctx *ctx, const st_layer *l, st_phase phase)
{
    (void)ctx;
    for (int64_t i = 0; i < l->u.loop.rows * l->u.loop.cols; i++)
        l->u.loop.y[i] = 0.5f * l->u.loop.x[i];
    return ST_OK;
}

static st_status half_backward(const st_nn_ctx *ctx, const st_layer *l)
{
    (void)ctx;
    for (int64_t i = 0; i < l->u.loop.rows * l->u.loop.cols; i++)
        l->u.loop.dx[i] = 0.5f * l->u.loop.dy[i];
    return ST_OK;
}

static const st_layer_kind half_kind = {
    .name = "half", .build = half_build, .forward = half_forward, .backward = half_backward,
};

/* stem -> depth x group { skip; fc1 (width unit g) -> half -> fc2 (+ skip) } -> head */
static st_status declare_half_net(st_model *m)
{
    const st_model_config *c = st_model_get_config(m);
    const int64_t W = c->width, H = c->hidden;
    const int h0 = st_graph_tensor(m, W, ST_W_FULL), dh = st_graph_tensor(m, W, ST_W_FULL);
    const int dtmp = st_graph_tensor(m, W, ST_W_FULL);
    const int dz = st_graph_tensor(m, H, ST_W_WIDEST), da = st_graph_tensor(m, H, ST_W_WIDEST);
    cr_assert(st_graph_linear(m, "stem", ST_T_INPUT, h0, ST_T_NONE, dh, c->in_dim, W));
    int h = h0;
    char name[32];
    for (int g = 0; g < c->depth; g++) {
        st_graph_group_begin(m, g);
        const int a = st_graph_tensor(m, H, g), z = st_graph_tensor(m, H, g);
        const int out = st_graph_tensor(m, W, ST_W_FULL);
        cr_assert(st_graph_add(m, &st_layer_residual, "skip", h, h, dh, dtmp));
        snprintf(name, sizeof name, "block%d.fc1", g);
        st_layer *l = st_graph_linear(m, name, h, a, dtmp, da, W, H);
        l->out_unit = g;
        l = st_graph_add(m, &half_kind, "half", a, z, da, dz);
        l->in_unit = l->out_unit = g;
        snprintf(name, sizeof name, "block%d.fc2", g);
        l = st_graph_linear(m, name, z, out, dz, dh, H, W);
        l->in_unit = g;
        l->in_major = 1;
        l->residual = h;
        l->closes_group = 1;
        st_graph_group_end(m, h, out);
        h = out;
    }
    cr_assert(st_graph_linear(m, "head", h, ST_T_LOGITS, dh, ST_T_DLOGITS, W, c->n_classes));
    return ST_OK;
}

static st_model *make_half_net(const st_model_config *c, st_arena *a, uint64_t seed)
{
    st_model *m;
    cr_assert_eq(st_model_create_declared(c, declare_half_net, 8, a, &m), ST_OK, "%s",
                 st_last_error());
    st_model_init_params(m, seed);
    st_rng r = st_rng_seed(seed + 1);
    fill_rows(m, 0, 8, &r);
    return m;
}

Test(new_kind, trains_through_the_generic_graph)
{
    omp_set_num_threads(1);
    st_arena a;
    st_arena_init(&a, "half", NULL, 0);
    st_model_config c = resmlp_config(3, 16, 24, ST_ACT_GELU);
    st_model *m = make_half_net(&c, &a, 21);
    int n;
    const st_param_segment *segs = st_model_segments(m, &n);
    cr_assert_eq(n, 2 + 3 * 4 + 2, "stem, 3 groups of two linear layers, head: %d", n);
    cr_assert_str_eq(segs[2].name, "block0.fc1.weight");
    check_model_grads(m, "new kind", 22);
    st_model_destroy(m);
    st_arena_release(&a);
}

/* A group left out is the identity: the subnetwork of groups {0, 2}
 * computes what the full model computes when group 1's branch is zero. */
Test(new_kind, a_dropped_group_is_the_identity)
{
    omp_set_num_threads(1);
    st_arena a;
    st_arena_init(&a, "half", NULL, 0);
    st_model_config c = resmlp_config(3, 16, 24, ST_ACT_GELU), sc = c;
    const int held[] = { 0, 2 };
    sc.subnet.groups = held;
    sc.subnet.n_groups = 2;
    st_model *full = make_half_net(&c, &a, 31), *sub = make_half_net(&sc, &a, 31);
    cr_assert_lt(st_model_param_count(sub), st_model_param_count(full));
    cr_assert_eq(st_model_full_param_count(sub), st_model_param_count(full));
    int n;
    const st_param_segment *segs = st_model_segments(full, &n);
    for (int i = 0; i < n; i++)
        if (strncmp(segs[i].name, "block1.fc2.", 11) == 0)
            memset(st_model_params(full) + segs[i].offset, 0, segs[i].count * sizeof(float));
    float lf, ls;
    OK(st_model_forward_backward(full, &lf));
    OK(st_model_forward_backward(sub, &ls));
    cr_assert_eq(lf, ls, "full with a zero branch %.9g, subnetwork %.9g", (double)lf, (double)ls);
    cr_assert_eq(memcmp(st_model_logits(full), st_model_logits(sub), 8 * 5 * sizeof(float)), 0);
    /* and its parameters sit where the full model keeps them */
    st_range r[8];
    size_t local[8];
    int k = st_model_full_ranges(sub, r, local, 8);
    cr_assert_eq(k, 2, "stem + group 0 | group 2 + head: %d ranges", k);
    st_model_destroy(sub);
    st_model_destroy(full);
    st_arena_release(&a);
}

/* Width units declared by the new kind's neighbours: a compact subnetwork
 * of some neurons of every group trains through the new kind too. */
Test(new_kind, width_subnetwork_gradients)
{
    omp_set_num_threads(1);
    st_arena a;
    st_arena_init(&a, "half", NULL, 0);
    st_model_config c = resmlp_config(2, 16, 24, ST_ACT_GELU);
    const int count[] = { 2, 1 }, kept[] = { 0, 5, 3 };
    c.subnet.unit_size = 4;
    c.subnet.width_count = count;
    c.subnet.width_kept = kept;
    c.subnet.scale = 2.0f;
    st_model *m = make_half_net(&c, &a, 41);
    int n;
    const st_param_segment *segs = st_model_segments(m, &n);
    cr_assert_eq(segs[2].count, 8 * 16, "block0.fc1: 8 kept neurons x 16 inputs");
    check_model_grads(m, "new kind, width subnetwork", 42);
    const int bad[] = { 0, 6, 3 };   /* 24 / 4 = 6 units: id 6 is outside */
    c.subnet.width_kept = bad;
    st_model *x;
    cr_assert_eq(st_model_create_declared(&c, declare_half_net, 8, &a, &x), ST_ERR_INVALID,
                 "checked against the declared units");
    st_model_destroy(m);
    st_arena_release(&a);
}

/* ------------------------------------------------------------ resnet */

static st_model_config resnet_config(st_model_kind kind, int depth, int width, int c, int h,
                                     int w)
{
    st_model_config m = { .kind = kind, .depth = depth, .width = width,
                          .activation = ST_ACT_RELU, .in_dim = c * h * w, .in_channels = c,
                          .in_height = h, .in_width = w, .n_classes = 5 };
    return m;
}

/* The CIFAR-family ResNet as a layer table: convolutions, batch norms
 * (training forward: batch statistics), activations, skips, a projection
 * block per stage after the first, global average pooling and the head,
 * checked against finite differences of the training loss.  GELU: with
 * ReLU after a batch norm, perturbing an early weight moves many
 * pre-activations across the kink and the guard would skip most of them
 * (the layers' own checks in test_layers_rowwise cover ReLU's backward). */
Test(gradcheck, resnet_training_forward)
{
    omp_set_num_threads(1);
    st_model_config c = resnet_config(ST_MODEL_RESNET, 1, 4, 2, 6, 6);
    c.activation = ST_ACT_GELU;
    objective_train = 1;
    st_arena a;
    st_arena_init(&a, "resnet", NULL, 0);
    st_model *m = make_model(&c, 8, &a);
    st_rng r = st_rng_seed(71);
    st_model_init_params(m, 71);
    jitter_norms(m, &r);
    fill_rows(m, 0, 8, &r);
    int n;
    const st_param_segment *segs = st_model_segments(m, &n);
    cr_assert_str_eq(segs[0].name, "stem.weight");
    cr_assert_str_eq(segs[n - 1].name, "head.bias");
    size_t ns;
    cr_assert_not_null(st_model_state(m, &ns));
    cr_assert_gt(ns, 0, "batch norms keep running statistics");
    check_model_grads(m, "resnet d1 w4 2x6x6", 72);
    st_model_destroy(m);
    st_arena_release(&a);
    objective_train = 0;
}

/* Batch norms' running statistics in the full layout: the full model's
 * initial state, and subnetworks' pieces accumulated where they belong:
 * two block subnetworks (distinct values per model) average to their
 * common value where both hold a block and keep their own elsewhere; a
 * neuron subnetwork's compact channels load from and add back to the
 * same full positions. */
Test(state, subnetworks_state_sits_in_the_full_layout)
{
    omp_set_num_threads(1);
    st_model_config c = resnet_config(ST_MODEL_RESNET, 2, 4, 2, 6, 6);
    st_model_units u;
    OK(st_model_config_units(&c, &u));
    cr_assert_gt(u.state, 0);
    cr_assert_eq(u.sections, 3, "stage 0: 2 blocks, stages 1, 2: 1 each");
    int sizes[4];
    cr_assert_eq(st_model_config_sections(&c, sizes, 4), 3);
    cr_assert(sizes[0] == 2 && sizes[1] == 1 && sizes[2] == 1);
    const size_t S = (size_t)u.state;
    float *init = malloc(S * sizeof *init), *full = malloc(S * sizeof *full);
    double *sum = calloc(S, sizeof *sum);
    uint32_t *count = calloc(S, sizeof *count);
    OK(st_model_config_state_init(&c, init));
    size_t ones = 0;
    for (size_t f = 0; f < S; f++) {
        cr_assert(init[f] == 0.0f || init[f] == 1.0f);
        ones += init[f] == 1.0f;
    }
    cr_assert_eq(2 * ones, S, "a mean (0) and a variance (1) per channel");

    st_arena a;
    st_arena_init(&a, "state", NULL, 0);
    st_model_config ca = c, cb = c;
    const int ga[] = { 0, 2 }, gb[] = { 1, 2, 3 };
    ca.subnet.groups = ga;
    ca.subnet.n_groups = 2;
    cb.subnet.groups = gb;
    cb.subnet.n_groups = 3;
    st_model *ma = make_model(&ca, 4, &a), *mb = make_model(&cb, 4, &a);
    size_t na, nb;
    float *sa = st_model_state(ma, &na), *sb = st_model_state(mb, &nb);
    cr_assert_lt(na, S);
    cr_assert_lt(nb, S);
    for (size_t j = 0; j < na; j++)
        sa[j] = 10.0f;
    for (size_t j = 0; j < nb; j++)
        sb[j] = 20.0f;
    st_model_state_accumulate(ma, sum, count);
    st_model_state_accumulate(mb, sum, count);
    size_t both = 0, total = 0;
    for (size_t f = 0; f < S; f++) {
        cr_assert(count[f] >= 1 && count[f] <= 2, "every block is held by a or b");
        double mean = sum[f] / count[f];
        cr_assert(count[f] == 2 ? mean == 15.0 : (mean == 10.0 || mean == 20.0));
        both += count[f] == 2;
        total += count[f];
        full[f] = (float)mean;
    }
    cr_assert_eq(total, na + nb);
    cr_assert_gt(both, 0, "the stem's, projections' and block 2's statistics are shared");
    st_model *m = make_model(&c, 4, &a);
    size_t nm;
    float *sm = st_model_state(m, &nm);
    cr_assert_eq(nm, S);
    st_model_state_load(m, full);
    cr_assert_eq(memcmp(sm, full, S * sizeof *full), 0, "the full model's state is the layout");

    /* neurons: 1 of 2 groups of 2 channels in each block */
    st_model_config cn = c;
    const int wc[] = { 1, 1, 1, 1 }, wk[] = { 1, 0, 1, 1 };
    cn.subnet.unit_size = 2;
    cn.subnet.width_count = wc;
    cn.subnet.width_kept = wk;
    st_model *mn = make_model(&cn, 4, &a);
    size_t nn;
    float *sn = st_model_state(mn, &nn);
    cr_assert_lt(nn, S);
    for (size_t f = 0; f < S; f++)
        full[f] = (float)f;
    st_model_state_load(mn, full);
    memset(sum, 0, S * sizeof *sum);
    memset(count, 0, S * sizeof *count);
    st_model_state_accumulate(mn, sum, count);
    size_t held = 0;
    for (size_t f = 0; f < S; f++)
        if (count[f]) {
            cr_assert_eq(count[f], 1);
            cr_assert_eq(sum[f], (double)f, "element %zu came back to its place", f);
            held++;
        }
    cr_assert_eq(held, nn);
    cr_assert_eq(sn[0], 0.0f, "the stem's first running mean comes first");
    st_model_destroy(mn);
    st_model_destroy(m);
    st_model_destroy(mb);
    st_model_destroy(ma);
    st_arena_release(&a);
    free(init);
    free(full);
    free(sum);
    free(count);
}

/* Image tensors kept in the blocked layout between layers (the default)
 * compute what plain NCHW tensors with reorders around every layer do:
 * the whole model, a neuron subnetwork whose kept channels are whole
 * blocks (blocked) in some stages and not in others (plain), its backward
 * masking, and a block subnetwork; training and inference forwards.  And
 * the blocked model keeps less activation memory (no blocked copies). */
static void check_blocked_equals_plain(st_model_config c, const char *what)
{
    omp_set_num_threads(1);
    st_arena a, b;
    st_arena_init(&a, "blocked", NULL, 0);
    st_arena_init(&b, "plain", NULL, 0);
    st_model_config cp = c;
    cp.plain_tensors = 1;
    st_model *mb = make_model(&c, 8, &a), *mp = make_model(&cp, 8, &b);
    cr_assert_eq(st_model_param_count(mb), st_model_param_count(mp));
    st_model_init_params(mb, 17);
    st_model_init_params(mp, 17);
    st_rng r = st_rng_seed(18);
    fill_rows(mb, 0, 8, &r);
    r = st_rng_seed(18);
    fill_rows(mp, 0, 8, &r);
    float lb, lp;
    OK(st_model_forward_backward(mb, &lb));
    OK(st_model_forward_backward(mp, &lp));
    cr_assert_lt(fabsf(lb - lp), 1e-5f * fabsf(lp), "%s: loss %.9g blocked, %.9g plain", what,
                 lb, lp);
    const float *gb = st_model_grads(mb), *gp = st_model_grads(mp);
    double worst = 0.0, scale = 0.0;
    for (size_t i = 0; i < st_model_grad_count(mp); i++)
        scale = fmax(scale, fabs(gp[i]));
    for (size_t i = 0; i < st_model_grad_count(mp); i++)
        worst = fmax(worst, fabs(gb[i] - gp[i]) / scale);
    cr_assert_lt(worst, 1e-5, "%s: gradients differ by %g of the largest", what, worst);
    double sb = 0.0, sp = 0.0;
    int64_t hb = 0, hp = 0;
    OK(st_model_evaluate(mb, 8, &sb, &hb));
    OK(st_model_evaluate(mp, 8, &sp, &hp));
    cr_assert_lt(fabs(sb - sp), 1e-5 * fabs(sp), "%s: inference loss", what);
    const size_t act_b = a.stats.peak[ST_MEM_ACTIVATIONS], act_p = b.stats.peak[ST_MEM_ACTIVATIONS];
    cr_log_info("%s: max gradient diff %.3g of the largest; activations %zu B blocked, %zu B plain",
                what, worst, act_b, act_p);
    cr_assert_lt(act_b, act_p, "%s: no blocked copies of the tensors", what);
    st_model_destroy(mb);
    st_model_destroy(mp);
    st_arena_release(&a);
    st_arena_release(&b);
}

/* bf16 ResNet: the convolutions' inputs in passing (a block's BN -> ReLU
 * outputs, or the GELU after it, read by convolutions only) share
 * buffers (graph.c's assign_forward_only), and nothing reads it once its conv's forward has made the bf16
 * copy: with the buffer filled with NaN between the forward and the
 * backward, the loss and every gradient are bitwise those of the step
 * left alone; and they are close to fp32's, not equal.  The gradients
 * are compared with GELU only: with ReLU after batch norms over 16 values
 * (batch 4, 2 x 2 at stage 2) this model is chaotic in fp32 itself (inputs
 * moved by 0.2%, as bf16 moves them, move its conv weights' gradients by
 * 15%, measured; GELU's by 0.4%). */
static void check_resnet_bf16_passing(st_model_config c, const char *what)
{
    const int smooth = c.activation == ST_ACT_GELU;
    omp_set_num_threads(1);
    c.precision = ST_PRECISION_BF16;
    st_arena a;
    st_arena_init(&a, "resnet bf16", NULL, 0);
    st_model *m = make_model(&c, 4, &a);
    st_model_init_params(m, 91);
    st_rng r = st_rng_seed(92);
    fill_rows(m, 0, 4, &r);
    /* the buffer two or more convolutions read x from */
    float *passing = NULL;
    size_t floats = 0;
    int n_convs = 0, sharing = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const st_layer *l = &m->layers[i];
        if (l->dropped || l->kind != &st_layer_conv)
            continue;
        n_convs++;
        cr_expect(l->u.conv.bf16, "%s: %s is not bf16", what, l->name);
        for (int j = i + 1; j < m->n_layers && !passing; j++)
            if (!m->layers[j].dropped && m->layers[j].kind == &st_layer_conv &&
                st_graph_data(m, m->layers[j].x) == st_graph_data(m, l->x))
                passing = st_graph_data(m, l->x);
    }
    cr_assert_not_null(passing, "%s: no two convolutions share an input buffer", what);
    for (int i = 0; i < m->n_layers; i++) {
        const st_layer *l = &m->layers[i];
        if (l->dropped || l->kind != &st_layer_conv || st_graph_data(m, l->x) != passing)
            continue;
        sharing++;
        const size_t n = (size_t)m->rows * (size_t)st_graph_cols(m, l->x);
        floats = n > floats ? n : floats;
    }
    const size_t G = m->n_grads;
    float *g0 = malloc(G * sizeof *g0), loss0, loss1;
    OK(st_model_forward_backward(m, &loss0));
    memcpy(g0, st_model_grads(m), G * sizeof *g0);
    double sum;
    OK(st_graph_forward(m, ST_PHASE_TRAIN));
    OK(st_xent_forward(&m->ctx, &m->xent, m->labels, m->rows, 1, &sum, NULL));
    loss1 = (float)(sum / (double)m->rows);
    for (size_t i = 0; i < floats; i++)
        passing[i] = NAN;
    OK(st_graph_backward(m));
    cr_expect(memcmp(&loss0, &loss1, sizeof loss0) == 0, "%s: loss %.9g, again %.9g", what,
              loss0, loss1);
    size_t bad = 0;
    for (size_t i = 0; i < G; i++)
        bad += memcmp(&g0[i], &st_model_grads(m)[i], sizeof *g0) != 0;
    cr_expect_eq(bad, 0, "%s: %zu of %zu gradients change when the buffer in passing is "
                 "overwritten after the forward", what, bad, G);
    /* fp32: the same step */
    c.precision = ST_PRECISION_FP32;
    st_arena b;
    st_arena_init(&b, "resnet fp32", NULL, 0);
    st_model *m32 = make_model(&c, 4, &b);
    st_model_init_params(m32, 91);
    r = st_rng_seed(92);
    fill_rows(m32, 0, 4, &r);
    float loss32;
    OK(st_model_forward_backward(m32, &loss32));
    double dot = 0, n16 = 0, n32 = 0;
    for (size_t i = 0; i < G; i++) {
        dot += (double)g0[i] * st_model_grads(m32)[i];
        n16 += (double)g0[i] * g0[i];
        n32 += (double)st_model_grads(m32)[i] * st_model_grads(m32)[i];
    }
    const double cosine = dot / sqrt(n16 * n32);
    fprintf(stderr, "[bf16] %s: %d of %d convs read the buffer in passing; loss %.6f (fp32 "
            "%.6f), gradient cosine to fp32 %.6f\n", what, sharing, n_convs, loss0, loss32,
            cosine);
    cr_expect_gt(sharing, 1, "%s", what);
    cr_expect(fabsf(loss0 - loss32) <= 1e-2f * fabsf(loss32), "%s: loss %g, fp32 %g", what,
              loss0, loss32);
    cr_expect(loss0 != loss32, "%s: bf16 loss bitwise fp32's: not rounded?", what);
    if (smooth)
        cr_expect_gt(cosine, 0.999, "%s: gradients far from fp32's", what);
    free(g0);
    st_model_destroy(m);
    st_model_destroy(m32);
    st_arena_release(&a);
    st_arena_release(&b);
}

Test(layout, bf16_resnet_inputs_in_passing_are_not_read_by_the_backward)
{
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 kernels on this CPU");
    st_model_config c = resnet_config(ST_MODEL_RESNET, 2, 16, 3, 8, 8);
    check_resnet_bf16_passing(c, "resnet d2 w16 relu");
    c.activation = ST_ACT_GELU;
    check_resnet_bf16_passing(c, "resnet d2 w16 gelu");
    /* a neuron subnetwork: compact widths, the branch scale */
    st_model_config n = resnet_config(ST_MODEL_RESNET, 2, 16, 3, 8, 8);
    n.activation = ST_ACT_GELU;
    const int wc[] = { 1, 1, 1, 2 }, wk[] = { 0, 0, 1, 0, 3 };
    n.subnet.unit_size = 16;
    n.subnet.width_count = wc;
    n.subnet.width_kept = wk;
    n.subnet.scale = 2.0f;
    check_resnet_bf16_passing(n, "resnet d2 w16 neuron subnetwork");
}

Test(layout, blocked_tensors_compute_what_plain_ones_do)
{
    /* stages of 16, 32 and 64 channels: whole blocks of 16 (or 8) */
    st_model_config c = resnet_config(ST_MODEL_RESNET, 2, 16, 3, 8, 8);
    check_blocked_equals_plain(c, "resnet d2 w16");
    st_model_config n = c;
    /* width layers: the 2 blocks of stage 0 (16 channels), 1 of stage 1
     * (32), 1 of stage 2 (64) */
    const int wc[] = { 1, 1, 1, 2 }, wk[] = { 0, 0, 1, 0, 3 };
    n.subnet.unit_size = 16;   /* 16 of 16, 16 of 16, 16 of 32, 32 of 64: blocked */
    n.subnet.width_count = wc;
    n.subnet.width_kept = wk;
    n.subnet.scale = 2.0f;
    cr_assert_eq(st_model_config_check(&n), ST_OK, "%s", st_last_error());
    check_blocked_equals_plain(n, "neuron subnetwork");
    const int wc8[] = { 2, 1, 2, 2 }, wk8[] = { 0, 1, 1, 1, 2, 0, 5 };
    n.subnet.scale = 0.0f;
    n.subnet.unit_size = 8;    /* 16, 8 (plain with AVX-512), 16, 16 channels */
    n.subnet.width_count = wc8;
    n.subnet.width_kept = wk8;
    n.subnet.width_grads_only = 1;
    check_blocked_equals_plain(n, "neuron backward masking, groups of 8");
    n.subnet.width_grads_only = 0;
    check_blocked_equals_plain(n, "neuron subnetwork, groups of 8");
    st_model_config g = c;
    const int held[] = { 1, 2, 3 };
    g.subnet.groups = held;
    g.subnet.n_groups = 3;
    g.subnet.scale = 1.5f;
    check_blocked_equals_plain(g, "block subnetwork");
}

/* Recalibration: the first batch (k = 0) replaces whatever running
 * statistics the model had, and K batches give the mean of their
 * statistics (the same batch twice: the same state as once). */
Test(state, calibration_replaces_the_running_statistics)
{
    omp_set_num_threads(1);
    st_model_config c = resnet_config(ST_MODEL_RESNET, 1, 4, 2, 6, 6);
    st_arena a;
    st_arena_init(&a, "calibrate", NULL, 0);
    st_model *m1 = make_model(&c, 8, &a), *m2 = make_model(&c, 8, &a);
    st_model_init_params(m1, 5);
    st_model_init_params(m2, 5);
    size_t n;
    float *s1 = st_model_state(m1, &n), *s2 = st_model_state(m2, &n);
    for (size_t i = 0; i < n; i++)
        s2[i] = 7.0f + (float)i;   /* m1 has its initial state, m2 another */
    st_rng r = st_rng_seed(6);
    fill_rows(m1, 0, 8, &r);
    memcpy(st_model_input(m2), st_model_input(m1), 8 * (size_t)c.in_dim * sizeof(float));
    OK(st_model_calibrate(m1, 0));
    OK(st_model_calibrate(m2, 0));
    cr_assert_eq(memcmp(s1, s2, n * sizeof *s1), 0, "k = 0 keeps nothing of the old state");
    float *once = malloc(n * sizeof *once);
    memcpy(once, s1, n * sizeof *once);
    OK(st_model_calibrate(m1, 1));
    for (size_t i = 0; i < n; i++)
        cr_assert_float_eq(s1[i], once[i], 1e-6f * (1.0f + fabsf(once[i])),
                           "the mean of one batch's statistics twice");
    cr_assert_eq(st_model_calibrate(m1, -1), ST_ERR_INVALID);
    free(once);
    st_model_destroy(m1);
    st_model_destroy(m2);
    st_arena_release(&a);
}

/* Units: one layer group per identity block (stage 1: depth blocks; later
 * stages: depth - 1, after their projection block); each group's inner
 * channels are a width layer. */
Test(units, resnet_declares_identity_blocks)
{
    st_model_units u;
    st_model_config c = resnet_config(ST_MODEL_RESNET, 3, 8, 3, 32, 32);
    OK(st_model_config_units(&c, &u));
    cr_assert_eq(u.groups, 3 + 2 + 2);
    cr_assert_eq(u.width_layers, 7);
    cr_assert_eq(u.width, 8);
    c = resnet_config(ST_MODEL_RESNET18, 1, 8, 1, 28, 28);
    OK(st_model_config_units(&c, &u));
    cr_assert_eq(u.groups, 2 + 1 + 1 + 1);
    st_model_config v = c;
    v.in_channels = v.in_height = v.in_width = 0;
    cr_assert_eq(st_model_config_units(&v, &u), ST_ERR_INVALID, "a resnet needs images");
}

/* ------------------------------------------------------------ resnet subnetworks */

/* resnet d2 w4 on 2x6x6: four identity blocks (groups 0, 1 in stage 0, 2
 * and 3 after the projections of stages 1 and 2), whose width units have
 * 4, 4, 8 and 16 channels: 2, 2, 4 and 8 units of 2 channels.  Kept: the
 * first, the last, a scattered set with an adjacent pair, and four
 * scattered units. */
static const int RESNET_COUNT[] = { 1, 1, 3, 4 };
static const int RESNET_KEPT[] = { 0, 1, 0, 2, 3, 1, 2, 5, 7 };

static st_model_config resnet_small(void)
{
    st_model_config c = resnet_config(ST_MODEL_RESNET, 2, 4, 2, 6, 6);
    c.activation = ST_ACT_GELU;
    return c;
}

static st_model_config resnet_neuron_config(int grads_only)
{
    st_model_config c = resnet_small();
    c.subnet.unit_size = 2;
    c.subnet.width_count = RESNET_COUNT;
    c.subnet.width_kept = RESNET_KEPT;
    c.subnet.width_grads_only = grads_only;
    return c;
}

/* The training loss (batch norm: batch statistics), as the resnet check
 * above, at a smaller step. */
/* The finite-difference step of these checks.  Depth 2 with batch norms
 * is less smooth than the d1 check above: at the GELU step (1e-2) even
 * the full model's truncation error exceeds the tolerance (measured up to
 * 2x), at 3e-3 still for a scaled neuron subnetwork (4.7x); at 1e-3 every
 * segment passes with the worst ratio <= 0.8, and the rounding noise,
 * ~ 2e-8 / 2h = 1e-5, stays below atol. */
#define FD_STEP_RESNET 1e-3

static void resnet_gradcheck(const st_model_config *c, const char *tag, uint64_t seed)
{
    omp_set_num_threads(1);
    objective_train = 1;
    fd_step = FD_STEP_RESNET;
    gradcheck(c, tag, seed);
    fd_step = 0.0;
    objective_train = 0;
}

/* Forward masking of channel units: conv1 holds the kept output channels
 * (rows), bn1 their gamma and beta, conv2 the kept input channels
 * (columns); conv2 reads a subset of a width unit and closes its block,
 * so the branch scale multiplies it, forward and backward. */
Test(gradcheck, resnet_neuron_subnetwork_scaled)
{
    st_model_config c = resnet_neuron_config(0);
    c.subnet.scale = 2.0f;
    resnet_gradcheck(&c, "resnet d2 w4 neuron subnetwork (branch x2)", 81);
}

/* A block subnetwork: blocks 1 and 3 are the identity, the kept blocks'
 * conv2 is scaled. */
Test(gradcheck, resnet_block_subnetwork_scaled)
{
    st_model_config c = resnet_small();
    const int ids[] = { 0, 2 };
    c.subnet.groups = ids;
    c.subnet.n_groups = 2;
    c.subnet.scale = 2.0f;
    resnet_gradcheck(&c, "resnet d2 w4 blocks {0, 2} (branch x2)", 83);
}

/* Scale 0 (none) and 1 are the same model, to the bit: no post-op and no
 * loop. */
Test(model, resnet_branch_scale_one_is_plain)
{
    check_scale_one_is_plain(resnet_small());
}

/* Backward masking (cfg: of channel units or of blocks): the full model's
 * forward (the same loss, to the bit), and where the ranges say a
 * gradient lives, the full model's gradient.  Returns the worst relative
 * difference. */
static double check_resnet_backward(const st_model_config *cfg, const char *tag)
{
    omp_set_num_threads(1);
    st_arena a;
    st_arena_init(&a, "resnet bwd", NULL, 0);
    st_model_config full_cfg = *cfg;
    memset(&full_cfg.subnet, 0, sizeof full_cfg.subnet);
    st_model *full = make_model(&full_cfg, 8, &a), *m = make_model(cfg, 8, &a);
    cr_assert_eq(st_model_param_count(m), st_model_param_count(full));
    cr_assert_lt(st_model_grad_count(m), st_model_param_count(m));
    st_model_init_params(full, 5);
    st_model_init_params(m, 5);
    st_rng r = st_rng_seed(6);
    jitter_norms(full, &r);
    fill_rows(full, 0, 8, &r);
    r = st_rng_seed(6);
    jitter_norms(m, &r);
    fill_rows(m, 0, 8, &r);
    float lf, lm;
    OK(st_model_forward_backward(full, &lf));
    OK(st_model_forward_backward(m, &lm));
    cr_assert_eq(lf, lm, "%s: the forward is the full model's", tag);
    size_t covered;
    int n;
    double worst = kept_grad_diff(m, full, &covered, &n);
    cr_assert_eq(covered, st_model_grad_count(m));
    fprintf(stderr, "%s: %zu of %zu gradients in %d ranges, max rel diff %.3g\n", tag, covered,
            st_model_param_count(m), n, worst);
    cr_assert_lt(worst, 1e-5, "%s: the kept gradients are the full model's (%g)", tag, worst);
    st_model_destroy(m);
    st_model_destroy(full);
    st_arena_release(&a);
    return worst;
}

/* Channel units: conv1's kept rows, bn1's kept channels, conv2's kept
 * columns (9 per channel) get gradients; everything outside the blocks'
 * units gets all of them.  The weight passes stay whole (oneDNN computes
 * the full dW, the kept part is copied out): the FLOPs are the full
 * model's. */
Test(subnetwork, neuron_backward_masking_resnet)
{
    st_model_config c = resnet_neuron_config(1);
    check_resnet_backward(&c, "resnet neuron backward masking");
    st_model_config full_cfg = resnet_small();
    st_arena a;
    st_arena_init(&a, "resnet flops", NULL, 0);
    st_model *m = make_model(&c, 8, &a), *full = make_model(&full_cfg, 8, &a);
    cr_assert_eq(st_model_step_flops(m), st_model_step_flops(full));
    /* conv2 of block 2 (8 channels, 3 kept units of 2): 8 x 6 x 9 */
    int ns;
    const st_param_segment *s = st_model_segments(m, &ns);
    int seen = 0;
    for (int i = 0; i < ns; i++)
        if (strcmp(s[i].name, "stage1.block1.conv2.weight") == 0) {
            cr_assert_eq(s[i].grad_count, 8 * 6 * 9);
            cr_assert_eq(s[i].count, 8 * 8 * 9);
            seen++;
        } else if (strcmp(s[i].name, "stage1.block1.conv1.weight") == 0) {
            cr_assert_eq(s[i].grad_count, 6 * 8 * 9);
            seen++;
        } else if (strcmp(s[i].name, "stage1.block1.bn1.gamma") == 0) {
            cr_assert_eq(s[i].grad_count, 6);
            seen++;
        }
    cr_assert_eq(seen, 3);
    st_model_destroy(m);
    st_model_destroy(full);
    st_arena_release(&a);
}

/* Blocks: the kept blocks' gradients are the full model's. */
Test(subnetwork, block_backward_masking_resnet)
{
    st_model_config c = resnet_small();
    const uint8_t keep[] = { 1, 0, 0, 1 };
    c.subnet.group_grads = keep;
    check_resnet_backward(&c, "resnet block backward masking");
}

/* A masked resnet's step (forward masking, backward masking of channels
 * and of blocks, each with a branch scale: post-ops, the scale loops and
 * the gathers), and a bf16 one's, makes no heap call of subtrain's.  No Criterion call
 * while armed. */
Test(subnetwork, masked_resnet_forward_and_backward_make_no_heap_call)
{
    HEAPWATCH_SKIP_IF_OFF();
    omp_set_num_threads(1);
    const uint8_t keep[] = { 1, 0, 0, 1 };
    st_model_config cfgs[4] = { resnet_neuron_config(0), resnet_neuron_config(1), resnet_small(),
                                resnet_config(ST_MODEL_RESNET, 1, 16, 3, 8, 8) };
    cfgs[2].subnet.group_grads = keep;
    /* and a bf16 resnet (its conversions, the buffer in passing) */
    cfgs[3].precision = ST_PRECISION_BF16;
    const int n = st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE ? 3 : 4;
    for (int k = 0; k < n; k++) {
        if (k < 3)
            cfgs[k].subnet.scale = 2.0f;
        st_arena a;
        st_arena_init(&a, "resnet heap", NULL, 0);
        st_model *m = make_model(&cfgs[k], 8, &a);
        st_model_init_params(m, 7);
        st_rng r = st_rng_seed(8);
        fill_rows(m, 0, 8, &r);
        st_status st = ST_OK;
        own_calls = dnnl_calls = executes = 0;
        for (int round = 0; round < 4 && st == ST_OK; round++) {
            float loss;
            armed = round >= 1; /* the first round lets oneDNN set up its per-thread state */
            st = st_model_forward_backward(m, &loss);
            armed = 0;
        }
        cr_assert_eq(st, ST_OK, "%s", st_last_error());
        cr_assert_gt(executes, 0, "the interposer saw the primitives run");
        cr_expect_eq(own_calls, 0, "masked resnet %d: subtrain called the heap %ld times in 3 "
                     "steps", k, own_calls);
        fprintf(stderr, "[heap] masked resnet %d, 3 steps: subtrain %ld heap calls; oneDNN %ld "
                "in %ld executions\n", k, own_calls, dnnl_calls, executes);
        st_model_destroy(m);
        st_arena_release(&a);
    }
}


/* --precision bf16 keeps 2-byte copies for the backward and lets the fp32
 * tensors that no backward reads, and the data gradients, share buffers
 * (graph.c).  A resmlp (GELU), the same with backward masking of neurons,
 * and a gpt: some tensors do share a buffer; a training step makes no heap
 * call of subtrain's; two models of the same seed give bitwise the same
 * losses and gradients over 3 steps with an evaluation between steps. */
Test(bf16, shared_buffers_no_heap_call_same_seed_same_steps)
{
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 matmul on this CPU");
    omp_set_num_threads(1);
    st_model_config cfgs[3] = { resmlp_config(3, 16, 24, ST_ACT_GELU),
                                neuron_config(ST_MODEL_RESMLP, 1), gpt_config(2, 8, 2, 6) };
    for (int k = 0; k < 3; k++) {
        cfgs[k].precision = ST_PRECISION_BF16;
        st_arena a[2];
        st_model *m[2];
        float loss[2][3];
        for (int j = 0; j < 2; j++) {
            st_arena_init(&a[j], "bf16 keep", NULL, 0);
            m[j] = make_model(&cfgs[k], 4, &a[j]);
            st_model_init_params(m[j], 11);
        }
        int shared = 0;
        for (int t = ST_T_FIRST_FREE; t < m[0]->n_tensors; t++)
            for (int u = t + 1; u < m[0]->n_tensors; u++)
                shared += m[0]->tensors[t].data && m[0]->tensors[t].data == m[0]->tensors[u].data;
        cr_assert_gt(shared, 0, "config %d: no two tensors share a buffer in bf16", k);
        for (int j = 0; j < 2; j++) {
            st_rng r = st_rng_seed(5);
            for (int step = 0; step < 3; step++) {
                fill_rows(m[j], 0, 4, &r);
                own_calls = 0;
                armed = step >= 1;   /* the first lets oneDNN set up its thread */
                st_status st = st_model_forward_backward(m[j], &loss[j][step]);
                armed = 0;
                cr_assert_eq(st, ST_OK, "%s", st_last_error());
                if (HEAPWATCH_ACTIVE && step >= 1)
                    cr_expect_eq(own_calls, 0, "config %d: a bf16 step called the heap %ld "
                                 "times", k, own_calls);
                double sum = 0;
                int64_t hits = 0;
                OK(st_model_evaluate(m[j], 4, &sum, &hits));
            }
        }
        cr_assert_eq(memcmp(loss[0], loss[1], sizeof loss[0]), 0,
                     "config %d: the same seed gave other bf16 losses", k);
        cr_assert_eq(memcmp(st_model_grads(m[0]), st_model_grads(m[1]),
                            m[0]->n_grads * sizeof(float)), 0,
                     "config %d: the same seed gave other bf16 gradients", k);
        for (int j = 0; j < 2; j++) {
            st_model_destroy(m[j]);
            st_arena_release(&a[j]);
        }
    }
}

/* The update writes the bf16 weight copies (st_optim_update_copies), and
 * the forward after it skips their conversion (st_model_copies_written):
 * 4 steps with an evaluation between each, bitwise the same losses and
 * parameters as a model that converts its weights in every forward
 * (ST_UNFUSE_WEIGHT_COPY).  Every linear weight is listed: the copies add
 * up to the decayed matrices of a resmlp. */
Test(bf16, update_written_weight_copies_change_nothing)
{
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 matmul on this CPU");
    omp_set_num_threads(1);
    st_model_config cfgs[2] = { resmlp_config(3, 16, 24, ST_ACT_GELU), gpt_config(2, 8, 2, 6) };
    for (int k = 0; k < 2; k++) {
        st_arena a[2];
        st_model *m[2];
        st_optim o[2];
        float loss[2][4];
        st_optim_config oc = st_optim_config_default();
        for (int j = 0; j < 2; j++) {
            st_model_config c = cfgs[k];
            c.precision = ST_PRECISION_BF16;
            c.unfuse = j == 0 ? ST_UNFUSE_WEIGHT_COPY : 0;
            st_arena_init(&a[j], "bf16 copies", NULL, 0);
            m[j] = make_model(&c, 4, &a[j]);
            st_model_init_params(m[j], 13);
            OK(st_optim_init(&o[j], &oc, st_model_param_count(m[j]), &a[j]));
        }
        int n0, n1, n_segs;
        st_model_copies(m[0], &n0);
        const st_param_copy *copies = st_model_copies(m[1], &n1);
        const st_param_segment *segs = st_model_segments(m[1], &n_segs);
        cr_assert_eq(n0, 0, "config %d: unfused, yet copies are listed", k);
        cr_assert_gt(n1, 0, "config %d: no weight copy listed", k);
        if (k == 0) {
            size_t listed = 0, matrices = 0;
            for (int i = 0; i < n1; i++)
                listed += copies[i].count;
            for (int i = 0; i < n_segs; i++)
                matrices += segs[i].decay ? segs[i].count : 0;
            cr_assert_eq(listed, matrices, "resmlp: %zu weights in copies, %zu in matrices",
                         listed, matrices);
        }
        for (int j = 0; j < 2; j++) {
            st_rng r = st_rng_seed(6);
            for (int step = 0; step < 4; step++) {
                fill_rows(m[j], 0, 4, &r);
                OK(st_model_forward_backward(m[j], &loss[j][step]));
                int n, ns;
                const st_param_copy *cp = st_model_copies(m[j], &n);
                const st_param_segment *sg = st_model_segments(m[j], &ns);
                st_optim_update_copies(&o[j], st_model_params(m[j]), st_model_grads(m[j]), sg,
                                       ns, 0, st_model_param_count(m[j]),
                                       (uint64_t)step + 1, 1e-2f, cp, n);
                st_model_copies_written(m[j]);
                double sum = 0;
                int64_t hits = 0;
                OK(st_model_evaluate(m[j], 4, &sum, &hits));
            }
        }
        cr_assert_eq(memcmp(loss[0], loss[1], sizeof loss[0]), 0,
                     "config %d: losses differ with the update writing the copies (step 4: "
                     "%.9g vs %.9g)", k, loss[0][3], loss[1][3]);
        cr_assert_eq(memcmp(st_model_params(m[0]), st_model_params(m[1]),
                            st_model_param_count(m[0]) * sizeof(float)), 0,
                     "config %d: parameters differ with the update writing the copies", k);
        /* the parameters written by hand after an update that wrote the
         * copies: st_model_params_changed makes the next forward convert */
        float after[2];
        for (int j = 0; j < 2; j++) {
            st_model_copies_written(m[j]);
            float *p = st_model_params(m[j]);
            for (size_t i = 0; i < st_model_param_count(m[j]); i++)
                p[i] *= 0.5f;
            st_model_params_changed(m[j]);
            st_rng r = st_rng_seed(7);
            fill_rows(m[j], 0, 4, &r);
            OK(st_model_forward_backward(m[j], &after[j]));
        }
        cr_assert_eq(memcmp(&after[0], &after[1], sizeof after[0]), 0,
                     "config %d: a forward after st_model_params_changed used stale copies "
                     "(%.9g vs %.9g)", k, after[1], after[0]);
        for (int j = 0; j < 2; j++) {
            st_model_destroy(m[j]);
            st_arena_release(&a[j]);
        }
    }
}

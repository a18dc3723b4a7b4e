/*
 * tests/test_layers_xent.c — gradient checks of the softmax cross-entropy loss
 * (full and padded batches, a bad label).
 *
 * The pattern every test follows, and the helpers: tests/layer_check.h.
 */
#include "layer_check.h"

/* ------------------------------------------------------------ tolerances */

/* Softmax cross-entropy: L = mean over rows of -logp[label], logp float32
 * from oneDNN's log-softmax, good to ~ 1e-6 absolute per row (measured: ~ 4
 * ulps).  Log-sum-exp's third derivative is <= 0.1, so truncation at h = 1e-2
 * is ~ 2e-6; rounding / 2h is ~ 1e-6 / 0.02 / rows ~ 2e-5 (measured: <= 5e-5).
 * dlogits are O(0.01 .. 0.3) (a mean over 3 .. 8 rows), so atol is 1e-4: a
 * 10% error of a 0.1 gradient is 1e-2, 50x above it. */
static const tol TOL_XENT = { 1e-2, 1e-4, 1e-2 };

/* ------------------------------------------------------------ softmax cross-entropy */

typedef struct xent_case {
    env e;
    st_xent x;
    int64_t B, K, rows;
    float *logits, *logp, *dlogits;
    int32_t *labels;
} xent_case;

/* L = mean loss over the first `rows` rows (what dlogits is the gradient of). */
static double xent_objective(void *arg)
{
    xent_case *c = arg;
    double sum;
    OK(st_xent_forward(&c->e.ctx, &c->x, c->labels, c->rows, 0, &sum, NULL));
    return sum / (double)c->rows;
}

/* sum over rows of -log softmax(logits)[label], and the argmax hits, in
 * double from the float logits. */
static double xent_reference(const float *logits, const int32_t *labels, int64_t rows,
                             int64_t K, int64_t *hits)
{
    double sum = 0.0;
    *hits = 0;
    for (int64_t b = 0; b < rows; b++) {
        const float *l = logits + b * K;
        int64_t best = 0;
        for (int64_t k = 1; k < K; k++)
            if (l[k] > l[best])
                best = k;
        double se = 0.0;
        for (int64_t k = 0; k < K; k++)
            se += exp((double)l[k] - l[best]);
        sum += log(se) + l[best] - l[labels[b]];
        *hits += best == labels[b];
    }
    return sum;
}

/* Loss value, correct count, dlogits by finite differences, and padding:
 * rows [rows, B) must get a zero gradient and must not change the loss,
 * whatever their logits. */
static void check_xent(int64_t B, int64_t K, int64_t rows, uint64_t seed)
{
    xent_case c = { .B = B, .K = K, .rows = rows };
    env_init(&c.e, seed);
    env *e = &c.e;
    size_t n = (size_t)(B * K);
    c.logits = env_floats(e, n); // all (B, K)
    c.logp = env_floats(e, n);
    c.dlogits = env_floats(e, n);
    OK(st_arena_alloc(&e->arena, ST_MEM_ACTIVATIONS, (size_t)B * sizeof(int32_t),
                      (void **)&c.labels));
    fill_uniform(&e->rng, c.logits, n, -3.0f, 3.0f);
    for (int64_t b = 0; b < B; b++)
        c.labels[b] = (int32_t)st_rng_below(&e->rng, (uint32_t)K);
    /* Padding rows hold garbage: large logits that would dominate the loss
     * if they were counted. */
    for (size_t i = (size_t)(rows * K); i < n; i++)
        c.logits[i] = 40.0f * (2.0f * st_rng_uniform(&e->rng) - 1.0f);
    /* And dlogits holds garbage before the call: padding rows must be
     * written with zeros, not left as they were. */
    for (size_t i = 0; i < n; i++)
        c.dlogits[i] = 123.0f;

    OK(st_xent_build(&e->ctx, &c.x, B, K, c.logits, c.logp, c.dlogits));
    OK(st_nn_ctx_finalize(&e->ctx));
    double sum;
    int64_t hits;
    OK(st_xent_forward(&e->ctx, &c.x, c.labels, rows, 1, &sum, &hits));

    char tag[48], what[64];
    snprintf(tag, sizeof tag, "%lldx%lld rows %lld", (long long)B, (long long)K, (long long)rows);
    int64_t ref_hits;
    double ref = xent_reference(c.logits, c.labels, rows, K, &ref_hits);
    /* logp is float32 from oneDNN's log-softmax (polynomial exp and log):
     * a row's -logp[label] (~ 1 .. 5) came out within ~ 1e-6 of the double
     * value here, i.e. ~ 4 float ulps; the bound allows 1e-6 (1 + value)
     * per row, summed. */
    double loss_tol = 1e-6 * ((double)rows + ref);
    fprintf(stderr, "[ref] xent %-28s loss sum %.9f, reference %.9f, |diff| %.2e (tol %.0e)\n",
            tag, sum, ref, fabs(sum - ref), loss_tol);
    cr_expect(fabs(sum - ref) <= loss_tol, "xent %s: loss sum %.9f, reference %.9f", tag, sum, ref);
    cr_expect_eq(hits, ref_hits, "xent %s: %lld correct, reference %lld", tag,
                 (long long)hits, (long long)ref_hits);
    for (size_t i = (size_t)(rows * K); i < n; i++)
        cr_expect_eq(c.dlogits[i], 0.0f, "xent %s: padding dlogits[%zu] = %g", tag, i, c.dlogits[i]);
    /* Each real row of dlogits sums to 0 (softmax sums to 1, minus one-hot). */
    for (int64_t b = 0; b < rows; b++) {
        double s = 0;
        for (int64_t k = 0; k < K; k++)
            s += c.dlogits[b * K + k];
        cr_expect(fabs(s) <= 1e-6, "xent %s: dlogits row %lld sums to %g", tag, (long long)b, s);
    }

    /* Every logit, padding included: there fd must come out exactly 0. */
    float *grad = malloc(n * sizeof *grad);
    cr_assert(grad);
    memcpy(grad, c.dlogits, n * sizeof *grad);
    snprintf(what, sizeof what, "xent %s dlogits", tag);
    check_param(what, xent_objective, &c, c.logits, grad, n, SIZE_MAX, TOL_XENT, &e->rng);
    free(grad);

    /* Other garbage in the padding: the loss is bitwise the same. */
    for (size_t i = (size_t)(rows * K); i < n; i++)
        c.logits[i] = -c.logits[i] * 1.5f;
    for (int64_t b = rows; b < B; b++)
        c.labels[b] = (int32_t)((c.labels[b] + 1) % K);
    double sum2;
    int64_t hits2;
    OK(st_xent_forward(&e->ctx, &c.x, c.labels, rows, 1, &sum2, &hits2));
    cr_expect_eq(sum2, sum, "xent %s: padding changed the loss: %.17g vs %.17g", tag, sum2, sum);
    cr_expect_eq(hits2, hits);

    /* The same real rows alone in a batch of exactly `rows`: same loss (up to
     * the rounding of a possibly different kernel) and same hits. */
    if (rows < B) {
        xent_case d = { .B = rows, .K = K, .rows = rows };
        env_init(&d.e, seed);
        size_t m = (size_t)(rows * K);
        d.logits = env_floats(&d.e, m);
        d.logp = env_floats(&d.e, m);
        d.dlogits = env_floats(&d.e, m);
        memcpy(d.logits, c.logits, m * sizeof *d.logits);
        OK(st_xent_build(&d.e.ctx, &d.x, rows, K, d.logits, d.logp, d.dlogits));
        OK(st_nn_ctx_finalize(&d.e.ctx));
        double sum3;
        int64_t hits3;
        OK(st_xent_forward(&d.e.ctx, &d.x, c.labels, rows, 1, &sum3, &hits3));
        cr_expect(fabs(sum3 - sum) <= loss_tol, "xent %s: alone the rows give %.9f, padded %.9f",
                  tag, sum3, sum);
        cr_expect_eq(hits3, hits);
        for (size_t i = 0; i < m; i++)
            cr_expect(fabs(d.dlogits[i] - c.dlogits[i]) <= 1e-7, "xent %s: dlogits[%zu] %g vs %g",
                      tag, i, d.dlogits[i], c.dlogits[i]);
        env_destroy(&d.e);
    }
    env_destroy(e);
}

Test(xent, full_batch)
{
    omp_set_num_threads(1);
    check_xent(6, 5, 6, 51);
    check_xent(8, 11, 8, 52);
}

Test(xent, padded_batch)
{
    omp_set_num_threads(1);
    check_xent(7, 5, 5, 53);
    check_xent(16, 10, 3, 54);
}

Test(xent, rejects_bad_label)
{
    omp_set_num_threads(1);
    env e;
    env_init(&e, 55);
    float *logits = env_floats(&e, 3 * 4), *logp = env_floats(&e, 3 * 4), *dl = env_floats(&e, 3 * 4);
    int32_t labels[3] = { 0, 4, 1 }; /* 4 is outside [0, 4) */
    st_xent x;
    OK(st_xent_build(&e.ctx, &x, 3, 4, logits, logp, dl));
    OK(st_nn_ctx_finalize(&e.ctx));
    double sum;
    st_clear_error();
    cr_expect_eq(st_xent_forward(&e.ctx, &x, labels, 3, 1, &sum, NULL), ST_ERR_INVALID);
    cr_expect_neq(st_last_error()[0], '\0');
    /* The bad label sits in a padding row when rows = 1: it is not read. */
    OK(st_xent_forward(&e.ctx, &x, labels, 1, 1, &sum, NULL));
    env_destroy(&e);
}

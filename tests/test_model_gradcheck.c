/*
 * tests/test_model_gradcheck.c — finite-difference gradient checks of the mlp,
 * resmlp, gpt and vit models, the gpt's causality and generation, the vit's
 * lack of causality, and padded evaluation.
 *
 * The small models and the gradient check: tests/model_check.h.
 */
#define _GNU_SOURCE /* RTLD_NEXT, for heapwatch.h */
#include "model_check.h"

/* Heap calls of the armed thread. */
#define HEAPWATCH_PER_THREAD
#include "heapwatch.h"

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

/* Every segment of the vision transformer: the patch map (through the
 * patches it reads, 2 channels of 2 x 2 on a 4 x 6 image: 6 patches),
 * the positions, the non-causal attention, the MLP, the final norm and
 * the mean over tokens; then the class token and what reads it. */
Test(gradcheck, vit_mean)
{
    omp_set_num_threads(1);
    st_model_config c = vit_config(2, 2, 4, 6, 2, ST_POOL_MEAN);
    gradcheck(&c, "vit d2 w16 h2 2x4x6 patch 2 mean", 109);
}

Test(gradcheck, vit_cls)
{
    omp_set_num_threads(1);
    st_model_config c = vit_config(1, 1, 8, 8, 4, ST_POOL_CLS);
    gradcheck(&c, "vit d1 w16 h2 1x8x8 patch 4 cls", 110);
}

/* The ViT's own layer kinds alone, with no block between them: the
 * patches, their linear map, the positions and the mean pooling, then
 * the head; every parameter against central differences.
 * Each gradient below the pooling passes through the pooling's and the
 * positions' backward. */
static st_status declare_token_layers(st_model *m)
{
    const st_model_config *c = &m->cfg;
    const int64_t P = c->patch, D = c->width, K = (int64_t)c->in_channels * P * P;
    const int64_t N = (c->in_height / P) * (c->in_width / P), T = N + (c->pool == ST_POOL_CLS);
    st_graph_tokens(m, N);
    const int pt = st_graph_tensor(m, K, ST_W_FULL), e = st_graph_tensor(m, D, ST_W_FULL);
    const int de = st_graph_tensor(m, D, ST_W_FULL);
    st_graph_tokens(m, T);
    const int h = st_graph_tensor(m, D, ST_W_FULL), dh = st_graph_tensor(m, D, ST_W_FULL);
    st_graph_tokens(m, 0);
    const int z = st_graph_tensor(m, D, ST_W_FULL), dz = st_graph_tensor(m, D, ST_W_FULL);
    st_layer *l = st_graph_add(m, &st_layer_patches, "patches", ST_T_INPUT, pt, ST_T_NONE,
                               ST_T_NONE);
    cr_assert_not_null(l);
    l->kernel = (int)P;
    cr_assert_not_null(st_graph_linear(m, "patch", pt, e, ST_T_NONE, de, K, D));
    const st_layer_kind *kinds[2] = { &st_layer_positions, &st_layer_token_pool };
    const int io[2][4] = { { e, h, de, dh }, { h, z, dh, dz } };
    for (int k = 0; k < 2; k++) {
        l = st_graph_add(m, kinds[k], k ? "pool" : "tokens", io[k][0], io[k][1], io[k][2],
                         io[k][3]);
        cr_assert_not_null(l);
        l->in = l->out = D;
        l->tokens = T;
        l->class_token = c->pool == ST_POOL_CLS;
    }
    cr_assert_not_null(st_graph_linear(m, "head", z, ST_T_LOGITS, dz, ST_T_DLOGITS, D,
                                       c->n_classes));
    return ST_OK;
}

static void check_token_layers(st_token_pool pool, const char *tag, uint64_t seed)
{
    omp_set_num_threads(1);
    st_model_config c = vit_config(1, 2, 4, 6, 2, pool);
    st_arena arena;
    st_arena_init(&arena, "test_model", NULL, 0);
    st_model *m = NULL;
    OK(st_model_create_declared(&c, declare_token_layers, 8, &arena, &m));
    st_rng r = st_rng_seed(seed);
    st_model_init_params(m, seed);
    fill_rows(m, 0, 8, &r);
    check_model_grads(m, tag, seed + 1);
    st_model_destroy(m);
    st_arena_release(&arena);
}

/* (Mean pooling: with a class token and no attention, nothing reads the
 * patches; gradcheck/vit_cls checks the class token.) */
Test(gradcheck, vit_token_layers_alone)
{
    check_token_layers(ST_POOL_MEAN, "vit layers alone, 2x4x6 patch 2 mean", 111);
}

/* Not causal: the class token, first of the tokens, sees the last patch
 * (a causal mask would hide every patch from it); a pixel changed there
 * moves that sample's logits only. */
Test(model, vit_class_token_sees_every_patch)
{
    omp_set_num_threads(1);
    st_model_config c = vit_config(1, 1, 8, 8, 4, ST_POOL_CLS);
    st_arena arena;
    st_arena_init(&arena, "test_model", NULL, 0);
    st_model *m = make_model(&c, 2, &arena);
    st_model_init_params(m, 5);
    st_rng r = st_rng_seed(6);
    fill_rows(m, 0, 2, &r);
    double sum = 0.0;
    int64_t hits = 0;
    OK(st_model_evaluate(m, 2, &sum, &hits));
    float before[2 * 5];
    memcpy(before, st_model_logits(m), sizeof before);
    st_model_input(m)[63] += 1.0f;   /* sample 0, the last pixel of the last patch */
    OK(st_model_evaluate(m, 2, &sum, &hits));
    const float *after = st_model_logits(m);
    int moved = 0;
    for (int k = 0; k < 5; k++) {
        moved += after[k] != before[k];
        cr_assert_eq(after[5 + k], before[5 + k], "sample 1's logit %d moved", k);
    }
    cr_assert(moved > 0, "the class token did not see the last patch");
    st_model_destroy(m);
    st_arena_release(&arena);
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

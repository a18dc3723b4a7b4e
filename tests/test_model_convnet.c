/*
 * tests/test_model_convnet.c — the plain convolutional network: what every
 * model passes (its layout and parameter count by hand, the gradient
 * check, its weights saved and read back) and what its units are for
 * (channel subnetworks forward and backward, their heap calls), and the
 * sizes its entry refuses.
 *
 * The small models and the gradient check: tests/model_check.h.
 */
#define _GNU_SOURCE /* RTLD_NEXT, for heapwatch.h */
#include "testutil.h"

#include "model_check.h"

#include <subtrain/checkpoint.h>

/* Heap calls of the armed thread. */
#define HEAPWATCH_PER_THREAD
#include "heapwatch.h"
#include "model_heapwatch.h"

/* convnet d2 w4 on 2x6x6, 5 classes: stage 0 of 4 channels (6x6, pooled
 * to 3x3), stage 1 of 8 (3x3, pooled to 1x1).  GELU: a smooth objective
 * for the finite differences (ReLU after a batch norm would put many
 * pre-activations on the kink). */
static st_model_config convnet_small(void)
{
    st_model_config c = resnet_config(st_model_kind_named("convnet"), 2, 4, 2, 6, 6);
    c.activation = ST_ACT_GELU;
    return c;
}

/* The segments, in order: conv weights (out, in x 9), batch norms' gamma
 * and beta, the head. */
Test(layout, convnet_parameter_count_and_segments)
{
    omp_set_num_threads(1);
    const st_model_config c = convnet_small();
    static const struct { const char *name; size_t count; } want[] = {
        { "stage0.conv.weight", 4 * 2 * 9 }, { "stage0.bn.gamma", 4 }, { "stage0.bn.beta", 4 },
        { "stage1.conv.weight", 8 * 4 * 9 }, { "stage1.bn.gamma", 8 }, { "stage1.bn.beta", 8 },
        { "head.weight", 8 * 5 }, { "head.bias", 5 },
    };
    const int nw = (int)(sizeof want / sizeof want[0]);
    st_arena a;
    st_arena_init(&a, "convnet", NULL, 0);
    st_model *m = make_model(&c, 8, &a);
    int n;
    const st_param_segment *s = st_model_segments(m, &n);
    cr_assert_eq(n, nw, "%d segments, expected %d", n, nw);
    size_t offset = 0;
    for (int i = 0; i < n; i++) {
        cr_expect_str_eq(s[i].name, want[i].name);
        cr_expect_eq(s[i].count, want[i].count, "%s: %zu elements, expected %zu", s[i].name,
                     s[i].count, want[i].count);
        cr_expect_eq(s[i].offset, offset, "%s at %zu, expected %zu", s[i].name, s[i].offset,
                     offset);
        cr_expect_eq(s[i].decay, ends_with(want[i].name, ".weight"), "%s: decay %d", s[i].name,
                     s[i].decay);
        offset += want[i].count;
    }
    /* 72 + 8 + 288 + 16 + 45 */
    cr_expect_eq(st_model_param_count(m), 429);
    cr_expect_eq(st_model_config_param_count(&c), 429);
    size_t ns;
    st_model_state(m, &ns);
    cr_expect_eq(ns, 2 * (4 + 8), "running mean and variance of every channel: %zu", ns);
    st_model_destroy(m);
    st_arena_release(&a);
}

/* Its stages' channels are width layers, chained like an mlp's; no groups. */
Test(units, convnet_declares_a_width_layer_per_stage)
{
    const st_model_config c = convnet_small();
    st_model_units u;
    OK(st_model_config_units(&c, &u));
    cr_expect_eq(u.groups, 0);
    cr_expect_eq(u.width_layers, 2);
    cr_expect_eq(u.width, 4);
    cr_expect_eq(u.chained, 1, "stage 1's convolution reads stage 0's units");
    cr_expect_eq(u.state, 24);
    int groups[4];
    cr_assert_eq(st_model_config_width_groups(&c, 2, groups, 4), 2);
    cr_expect(groups[0] == 2 && groups[1] == 4, "%d, %d units of 2 channels", groups[0],
              groups[1]);
}

/* The finite differences of a pooled network with batch norms: the
 * training objective (batch statistics), a step of 1e-3 (as the resnet's
 * subnetworks: at the GELU step the batch norms' truncation error exceeds
 * the tolerance) and the max-pooling kink guard (model_check.h). */
static void convnet_gradcheck(const st_model_config *c, const char *tag, uint64_t seed)
{
    omp_set_num_threads(1);
    objective_train = 1;
    kink_guard = 1;
    fd_step = 1e-3;
    gradcheck(c, tag, seed);
    fd_step = 0.0;
    kink_guard = 0;
    objective_train = 0;
}

/* Every segment of the full model. */
Test(gradcheck, convnet_training_forward)
{
    const st_model_config c = convnet_small();
    convnet_gradcheck(&c, "convnet d2 w4 2x6x6", 91);
}

/* stage 0: units 0 and 1 of 2 channels, stage 1: 4 units of 2. */
static const int CONVNET_COUNT[] = { 1, 3 };
static const int CONVNET_KEPT[] = { 1, 0, 2, 3 };

static st_model_config convnet_neuron_config(int grads_only)
{
    st_model_config c = convnet_small();
    c.subnet.unit_size = 2;
    c.subnet.width_count = CONVNET_COUNT;
    c.subnet.width_kept = CONVNET_KEPT;
    c.subnet.width_grads_only = grads_only;
    return c;
}

/* Forward masking of channel units: stage 0's convolution and norm hold
 * the kept channels of unit 1, stage 1's convolution their columns and
 * its kept rows, the head the kept inputs; what reads a subset is scaled. */
Test(gradcheck, convnet_neuron_subnetwork_scaled)
{
    st_model_config c = convnet_neuron_config(0);
    c.subnet.scale = 2.0f;
    convnet_gradcheck(&c, "convnet d2 w4 neuron subnetwork (x2)", 93);
}

/* Backward masking: the full model's loss to the bit, and where the
 * ranges say a gradient lives, the full model's gradient. */
Test(subnetwork, convnet_backward_masking_keeps_the_full_gradients)
{
    omp_set_num_threads(1);
    st_arena a;
    st_arena_init(&a, "convnet bwd", NULL, 0);
    const st_model_config full_cfg = convnet_small(), cfg = convnet_neuron_config(1);
    st_model *full = make_model(&full_cfg, 8, &a), *m = make_model(&cfg, 8, &a);
    cr_assert_eq(st_model_param_count(m), st_model_param_count(full));
    cr_assert_lt(st_model_grad_count(m), st_model_param_count(m));
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
    size_t covered;
    int n;
    const double worst = kept_grad_diff(m, full, &covered, &n);
    cr_assert_eq(covered, st_model_grad_count(m));
    cr_assert_lt(worst, 1e-5, "the kept gradients are the full model's (%g)", worst);
    st_model_destroy(m);
    st_model_destroy(full);
    st_arena_release(&a);
}

/* Two backward-masked subnetworks with complementary units (what sdp
 * deals to two workers at coverage 1/2) hold between them a gradient of
 * every parameter: stage 1's convolution, from one width layer to
 * another, keeps whole rows of its output units. */
Test(subnetwork, convnet_complementary_backward_masks_cover_every_parameter)
{
    omp_set_num_threads(1);
    static const int count_a[] = { 1, 2 }, kept_a[] = { 0, 0, 2 };
    static const int count_b[] = { 1, 2 }, kept_b[] = { 1, 1, 3 };
    st_model_config ca = convnet_neuron_config(1), cb = ca;
    ca.subnet.width_count = count_a;
    ca.subnet.width_kept = kept_a;
    cb.subnet.width_count = count_b;
    cb.subnet.width_kept = kept_b;
    st_arena a;
    st_arena_init(&a, "convnet cover", NULL, 0);
    st_model *ma = make_model(&ca, 4, &a), *mb = make_model(&cb, 4, &a);
    const size_t P = st_model_param_count(ma);
    uint8_t *held = calloc(P, 1);
    cr_assert(held);
    st_model *both[2] = { ma, mb };
    for (int k = 0; k < 2; k++) {
        st_range *rg;
        size_t *local;
        const int n = ranges_of(both[k], 1, &rg, &local);
        for (int i = 0; i < n; i++)
            for (size_t e = rg[i].begin; e < rg[i].end; e++)
                held[e] = 1;
        free(rg);
        free(local);
    }
    size_t nobody = 0, first = P;
    for (size_t e = 0; e < P; e++)
        if (!held[e]) {
            nobody++;
            first = first < e ? first : e;
        }
    cr_expect_eq(nobody, 0, "%zu of %zu parameters have no gradient in either subnetwork, the "
                 "first %zu", nobody, P, first);
    free(held);
    st_model_destroy(mb);
    st_model_destroy(ma);
    st_arena_release(&a);
}

/* Saved and read back through a weights file; another model's refused. */
Test(weights, convnet_round_trip)
{
    char dir[ST_TEST_PATH_MAX], path[ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(path, dir, "w.safetensors");
    const st_model_config c = convnet_small();
    const size_t n = st_model_config_param_count(&c);
    float *p = malloc(n * sizeof *p), *q = calloc(n, sizeof *q);
    cr_assert(p && q);
    OK(st_model_init_full_range(&c, 3, 0, n, p));
    OK(st_checkpoint_write_weights(path, &c, p, NULL, 0));
    OK(st_checkpoint_read_weights(path, &c, q));
    cr_assert_eq(memcmp(p, q, n * sizeof *p), 0);
    st_model_config other = resnet_config(st_model_kind_named("resnet"), 1, 4, 2, 6, 6);
    float *r = malloc(st_model_config_param_count(&other) * sizeof *r);
    cr_assert_eq(st_checkpoint_read_weights(path, &other, r), ST_ERR_FORMAT);
    cr_assert(strstr(st_last_error(), "a convnet model, not of resnet"), "%s", st_last_error());
    free(p);
    free(q);
    free(r);
    st_test_rmdir(dir);
}

/* Its entry: the defaults a front end gets, the option it does not take,
 * the stages an image can take, the channels a layer can have, images. */
Test(config, convnet_defaults_and_refusals)
{
    st_model_config c = st_model_config_default();
    c.kind = st_model_kind_named("convnet");
    OK(st_model_config_resolve(&c, 0));
    cr_expect(c.depth == 3 && c.width == 32 && c.activation == ST_ACT_RELU);
    c.hidden = 8;
    cr_expect_eq(st_model_config_resolve(&c, ST_MODEL_OPT_HIDDEN), ST_ERR_INVALID);
    cr_expect_str_eq(st_last_error(), "--hidden applies to --model resmlp, gpt, vit only");

    c = convnet_small();
    c.depth = 3;   /* 6 -> 3 -> 1 -> 0 */
    cr_expect_eq(st_model_config_check(&c), ST_ERR_INVALID);
    cr_expect_str_eq(st_last_error(), "--model convnet --depth 3: each stage halves the image, "
                                      "and 6x6 images take at most 2 stages");
    c = convnet_small();
    c.depth = 12;
    c.width = 64;
    cr_expect_eq(st_model_config_check(&c), ST_ERR_INVALID);
    cr_expect(strstr(st_last_error(), "more than 65536 channels"), "%s", st_last_error());
    c.depth = 11;   /* 64 x 2^10 = 65536: the most */
    c.in_channels = c.in_height = c.in_width = 0;
    c.in_dim = 12;
    OK(st_model_config_check(&c));
    st_arena a;
    st_arena_init(&a, "convnet", NULL, 0);
    st_model *m = NULL;
    c.depth = 1;
    cr_expect_eq(st_model_create(&c, 4, &a, &m), ST_ERR_INVALID);
    cr_expect_null(m);
    cr_expect_str_eq(st_last_error(), "--model convnet takes images (C x H x W data), not 12 "
                                      "features");
    st_arena_release(&a);
}

/* A step of the full model, of a forward-masked and of a backward-masked
 * subnetwork makes no heap call of subtrain's.  No Criterion call while
 * armed. */
Test(subnetwork, convnet_steps_make_no_heap_call)
{
    HEAPWATCH_SKIP_IF_OFF();
    omp_set_num_threads(1);
    st_model_config cfgs[3] = { convnet_small(), convnet_neuron_config(0),
                                convnet_neuron_config(1) };
    cfgs[1].subnet.scale = 2.0f;
    for (int k = 0; k < 3; k++) {
        watch_model_steps(&cfgs[k], "convnet heap");
        cr_expect_eq(own_calls, 0, "convnet %d: subtrain called the heap %ld times in 3 steps", k,
                     own_calls);
    }
}

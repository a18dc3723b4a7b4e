/*
 * tests/test_train_models.c — the strategies training a ResNet (batch
 * norms, an uneven last batch), a transformer on text and a vision
 * transformer.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include <subtrain/subtrain.h>
#include "train_check.h"

/* Runs c, *f its final record: every parameter of the full model moved
 * from its initial value (variant k of a test's list, for the message). */
static void expect_every_parameter_moves(const st_train_config *c, const st_dataset *train,
                                         const st_dataset *test, size_t k, st_epoch_record *f)
{
    params_out o = { 0 };
    st_train_callbacks cb = { .on_params = keep_params, .user = &o };
    cr_assert_eq(st_train_run(c, train, test, &cb, f), ST_OK, "variant %zu: %s", k,
                 st_last_error());
    cr_assert_eq(o.n, st_model_config_param_count(&c->model));
    float *init = malloc(o.n * sizeof *init);
    cr_assert_not_null(init);
    cr_assert_eq(st_model_init_full_range(&c->model, c->seed, 0, o.n, init), ST_OK);
    size_t same = 0;
    for (size_t i = 0; i < o.n; i++)
        same += o.p[i] == init[i];
    cr_assert_eq(same, 0, "variant %zu: %zu parameters never moved", k, same);
    free(init);
    free(o.p);
}

/* ------------------------------------------------------------ resnet */

/* A ResNet (convolutions, batch norms: batch statistics each worker's
 * own, running statistics averaged over their holders before each
 * evaluation and each rebuild) with several workers under each strategy
 * that trains it: the run ends (an uneven last test batch for one worker
 * included), learns, and is bitwise reproducible. */
static st_train_config resnet_train_config(int workers)
{
    st_train_config c = st_train_config_default();
    c.model.kind = st_model_kind_named("resnet");
    c.model.depth = 1;
    c.model.width = 4;
    c.model.activation = ST_ACT_RELU;
    c.model.in_dim = 32;          /* make_data's 32 features as 2 x 4 x 4 images */
    c.model.in_channels = 2;
    c.model.in_height = 4;
    c.model.in_width = 4;
    c.model.n_classes = 4;
    c.workers = workers;
    c.oversubscribe = 1;
    c.batch = 24;
    c.steps = 6;
    return c;
}

Test(resnet, two_workers_dp_is_reproducible, .timeout = 120)
{
    st_dataset train, test;
    make_data(11, &train, &test);
    st_train_config c = resnet_train_config(2);
    st_epoch_record a, b;
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, &a), ST_OK, "%s", st_last_error());
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, &b), ST_OK, "%s", st_last_error());
    cr_assert_eq(a.train_loss, b.train_loss);
    cr_assert_eq(a.test_loss, b.test_loss);
    cr_assert_eq(a.test_acc, b.test_acc);
    cr_assert(isfinite(a.test_loss) && a.test_acc > 0.0);
    c.strategy = ST_STRATEGY_SYNTH;
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, &a), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "synth") != NULL, "%s", st_last_error());
    st_dataset_free(&train);
    st_dataset_free(&test);
}

static void check_resnet_reproducible(const st_train_config *c, const char *what)
{
    st_dataset train, test;
    make_data(11, &train, &test);
    st_epoch_record a, b;
    cr_assert_eq(st_train_run(c, &train, &test, NULL, &a), ST_OK, "%s: %s", what, st_last_error());
    cr_assert_eq(st_train_run(c, &train, &test, NULL, &b), ST_OK, "%s: %s", what, st_last_error());
    cr_log_info("resnet %s: test_acc %.4f, %.0f B/worker-step", what, a.test_acc,
                a.comm_bytes_per_worker_step);
    cr_assert_eq(a.train_loss, b.train_loss, "%s", what);
    cr_assert_eq(a.test_loss, b.test_loss, "%s", what);
    cr_assert_eq(a.test_acc, b.test_acc, "%s", what);
    cr_assert(isfinite(a.test_loss) && a.test_acc > 0.35, "%s: test_acc %.4f (4 classes: chance is 0.25)", what,
              a.test_acc);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* A ResNet with blocks to share (depth 2: two stage-0 blocks, one in each
 * later stage; 8, 16, 32 channels) that learns in 24 steps. */
static st_train_config subnet_resnet_config(int workers, st_strategy strategy)
{
    st_train_config c = resnet_train_config(workers);
    c.model.depth = 2;
    c.model.width = 8;
    c.optim.lr = 0.01f;
    c.steps = 24;
    c.strategy = strategy;
    c.sdp.coverage = 0.5;
    return c;
}

/* SDP with blocks held by 2 of 4 workers, forward and backward masking. */
Test(resnet, sdp_blocks_are_reproducible, .timeout = 180)
{
    st_train_config c = subnet_resnet_config(4, ST_STRATEGY_SDP);
    c.sdp.subnet = ST_SUBNET_BLOCK;
    check_resnet_reproducible(&c, "sdp block forward");
    /* the full model's recalibrated statistics change its evaluation,
     * never the training */
    st_train_config raw = c;
    raw.bn_calibration = 0;
    st_dataset train, test;
    make_data(11, &train, &test);
    st_epoch_record a, b;
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, &a), ST_OK, "%s", st_last_error());
    cr_assert_eq(st_train_run(&raw, &train, &test, NULL, &b), ST_OK, "%s", st_last_error());
    cr_assert_eq(a.train_loss, b.train_loss);
    cr_assert_neq(a.test_loss, b.test_loss);
    st_dataset_free(&train);
    st_dataset_free(&test);
    st_train_config redrawn = c;   /* running statistics meet at each rebuild */
    redrawn.sdp.resample = 8;
    check_resnet_reproducible(&redrawn, "sdp block forward, masks redrawn every 8 steps");
    c.sdp.masking = ST_MASKING_BACKWARD;
    check_resnet_reproducible(&c, "sdp block backward");
}

/* SDP with channel groups of 4 (stages of 8, 16 and 32 channels: 2, 4
 * and 8 units, each dealt evenly), each held by 2 of 4 workers. */
Test(resnet, sdp_channel_groups_are_reproducible, .timeout = 180)
{
    st_train_config c = subnet_resnet_config(4, ST_STRATEGY_SDP);
    c.sdp.subnet = ST_SUBNET_NEURON;
    c.neuron_group = 4;
    check_resnet_reproducible(&c, "sdp neuron forward");
    c.sdp.masking = ST_MASKING_BACKWARD;
    check_resnet_reproducible(&c, "sdp neuron backward");
}

/* ResIST: each stage's blocks partitioned over 2 workers, rounds of 3
 * steps. */
Test(resnet, ist_blocks_are_reproducible, .timeout = 180)
{
    st_train_config c = subnet_resnet_config(2, ST_STRATEGY_IST);
    c.ist.local_steps = 3;
    check_resnet_reproducible(&c, "ist blocks");
}

/* ------------------------------------------------------------ transformers */

/* dp on text: below the unigram baseline by a clear margin, per-token
 * losses, and bitwise reproducible. */
Test(gpt, learns_text_below_the_unigram_baseline_reproducibly, .timeout = 120)
{
    st_text t = gpt_text(60000);
    st_dataset train, test;
    cr_assert_eq(st_text_dataset(&t, 16, 1, 0, 4096, &train, &test), ST_OK, "%s",
                 st_last_error());
    st_train_config c = gpt_train_config(2, 150);
    recorder *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    st_epoch_record fa = train_recorded(&c, &train, &test, a);
    st_epoch_record fb = train_recorded(&c, &train, &test, b);
    const double unigram = st_text_unigram_bpb(&t), bpb = fa.test_loss / M_LN2;
    cr_log_info("gpt d2 w32 T16, 150 steps: %.3f bits per byte, unigram %.3f", bpb, unigram);
    cr_assert_lt(bpb, unigram - 0.5, "%.3f bits per byte against the unigram's %.3f", bpb,
                 unigram);
    cr_assert_eq(fa.tokens_per_sample, 16);
    cr_assert_eq(a->steps, b->steps);
    cr_assert_eq(memcmp(a->losses, b->losses, a->steps * sizeof(float)), 0);
    cr_assert_eq(fa.test_loss, fb.test_loss);
    free(a);
    free(b);
    st_dataset_free(&train);
    st_dataset_free(&test);
    free(t.bytes);
}

/* Every strategy trains a transformer: blocks and heads (forward and
 * backward masking), ResIST over blocks; each run is reproducible and
 * learns, and every parameter of the full model is trained. */
Test(gpt, every_strategy_trains_every_parameter, .timeout = 240)
{
    st_text t = gpt_text(60000);
    st_dataset train, test;
    cr_assert_eq(st_text_dataset(&t, 16, 1, 0, 2048, &train, &test), ST_OK);
    const struct { st_strategy strategy; st_subnet_kind subnet; st_masking masking; } v[] = {
        { ST_STRATEGY_SDP, ST_SUBNET_BLOCK, ST_MASKING_FORWARD },
        { ST_STRATEGY_SDP, ST_SUBNET_BLOCK, ST_MASKING_BACKWARD },
        { ST_STRATEGY_SDP, ST_SUBNET_NEURON, ST_MASKING_FORWARD },
        { ST_STRATEGY_SDP, ST_SUBNET_NEURON, ST_MASKING_BACKWARD },
        { ST_STRATEGY_IST, ST_SUBNET_BLOCK, ST_MASKING_FORWARD },
    };
    const double unigram = st_text_unigram_bpb(&t);
    for (size_t k = 0; k < sizeof v / sizeof *v; k++) {
        st_train_config c = gpt_train_config(2, 60);
        c.strategy = v[k].strategy;
        c.sdp.subnet = v[k].subnet;
        c.sdp.masking = v[k].masking;
        c.ist.local_steps = 10;
        st_epoch_record f;
        expect_every_parameter_moves(&c, &train, &test, k, &f);
        cr_assert_lt(f.test_loss / M_LN2, unigram, "variant %zu: %.3f bits per byte", k,
                     f.test_loss / M_LN2);
        st_epoch_record g;
        cr_assert_eq(st_train_run(&c, &train, &test, NULL, &g), ST_OK);
        cr_assert_eq(f.test_loss, g.test_loss, "variant %zu is reproducible", k);
    }
    st_dataset_free(&train);
    st_dataset_free(&test);
    free(t.bytes);
}

/* ------------------------------------------------------------ vit */

/* A vision transformer (make_data's 32 features as 2 x 4 x 4 images,
 * patches of 2, a class token) under dp, sdp over blocks and over heads
 * with forward and backward masking, and ist: every parameter of the full
 * model moves, the run learns something, and it is bitwise reproducible. */
Test(vit, every_strategy_trains_every_parameter_reproducibly, .timeout = 240)
{
    st_dataset train, test;
    make_data(13, &train, &test);
    const struct { st_strategy strategy; st_subnet_kind subnet; st_masking masking; } v[] = {
        { ST_STRATEGY_DP, ST_SUBNET_BLOCK, ST_MASKING_FORWARD },
        { ST_STRATEGY_SDP, ST_SUBNET_BLOCK, ST_MASKING_FORWARD },
        { ST_STRATEGY_SDP, ST_SUBNET_BLOCK, ST_MASKING_BACKWARD },
        { ST_STRATEGY_SDP, ST_SUBNET_NEURON, ST_MASKING_FORWARD },
        { ST_STRATEGY_SDP, ST_SUBNET_NEURON, ST_MASKING_BACKWARD },
        { ST_STRATEGY_IST, ST_SUBNET_BLOCK, ST_MASKING_FORWARD },
    };
    for (size_t k = 0; k < sizeof v / sizeof *v; k++) {
        st_train_config c = st_train_config_default();
        c.model = (st_model_config){ .kind = st_model_kind_named("vit"), .depth = 2,
                                     .width = 16, .heads = 2, .patch = 2, .pool = ST_POOL_CLS,
                                     .activation = ST_ACT_GELU, .in_dim = 32, .in_channels = 2,
                                     .in_height = 4, .in_width = 4, .n_classes = 4 };
        c.workers = 2;
        c.oversubscribe = 1;
        c.batch = 16;
        c.steps = 20;
        c.epochs = 0;
        c.optim.lr = 0.003f;
        c.neuron_group = 8;   /* one head */
        c.strategy = v[k].strategy;
        c.sdp.subnet = v[k].subnet;
        c.sdp.masking = v[k].masking;
        c.ist.local_steps = 5;
        st_epoch_record f;
        expect_every_parameter_moves(&c, &train, &test, k, &f);
        cr_assert(isfinite(f.test_loss) && f.test_acc > 0.25, "variant %zu: test_acc %.3f", k,
                  f.test_acc);
        st_epoch_record g;
        cr_assert_eq(st_train_run(&c, &train, &test, NULL, &g), ST_OK);
        cr_assert_eq(f.test_loss, g.test_loss, "variant %zu is reproducible", k);
    }
    st_dataset_free(&train);
    st_dataset_free(&test);
}

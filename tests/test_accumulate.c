/*
 * tests/test_accumulate.c — --accumulate K (st_train_config.accumulate):
 * K micro-batches of B samples make the step one batch of K x B makes, up
 * to the order of the fp32 sums (dp with one and two workers, sdp, ist,
 * localsgd); a step counts one update (the plan, the schedule); the
 * combinations that cannot accumulate are refused with a message.
 * Public headers only.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include <subtrain/subtrain.h>

/* 1024 training samples of 32 features, 4 classes. */
static void make_data(st_dataset *train, st_dataset *test)
{
    st_synthetic_config sc = st_synthetic_defaults(5);
    sc.train_count = 1024;
    sc.test_count = 256;
    sc.dim = 32;
    sc.n_classes = 4;
    cr_assert_eq(st_synthetic_make(&sc, train, test), ST_OK, "%s", st_last_error());
    st_dataset_normalize(train, test, NULL, NULL);
}

/* resmlp (layer norm only: no batch statistics, so that a micro-batch's
 * gradient is the batch's restricted to its rows) */
static st_train_config config(st_strategy strategy, int workers, int batch, int accumulate)
{
    st_train_config c = st_train_config_default();
    c.strategy = strategy;
    c.model.kind = st_model_kind_named("resmlp");
    c.model.depth = 2;
    c.model.width = 64;
    c.model.in_dim = 32;
    c.model.n_classes = 4;
    c.batch = batch;
    c.accumulate = accumulate;
    c.workers = workers;
    c.steps = 24;
    c.epochs = 0;
    c.oversubscribe = 1;
    return c;
}

typedef struct trained {
    float *params;
    size_t n;
    float last_loss;
    uint64_t total;
} trained;

static trained train_it(const st_train_config *c, const st_dataset *train,
                        const st_dataset *test)
{
    trained t = { 0 };
    st_trainer *tr;
    cr_assert_eq(st_trainer_create(c, train, test, &tr), ST_OK, "%s", st_last_error());
    st_trainer_steps(tr, &t.total);
    cr_assert_eq(st_trainer_step(tr, t.total, &t.last_loss), ST_OK, "%s", st_last_error());
    t.n = st_model_config_param_count(&c->model);
    t.params = malloc(t.n * sizeof *t.params);
    cr_assert_not_null(t.params);
    cr_assert_eq(st_trainer_params(tr, t.params, t.n), ST_OK, "%s", st_last_error());
    st_trainer_destroy(tr);
    return t;
}

/* The run of c with K micro-batches of B against the same run with one
 * batch of K x B: every parameter within `bound` after 24 AdamW steps
 * (the sums' order moves the last bits of a gradient; an update is at
 * most lr = 1e-3 a step), the last step's loss (a mean of the K
 * micro-batches' means) within float rounding. */
static double max_difference(st_train_config c, int K)
{
    st_dataset train, test;
    make_data(&train, &test);
    st_train_config whole = c;
    whole.batch = c.batch * K;
    whole.accumulate = 1;
    c.accumulate = K;
    trained a = train_it(&c, &train, &test), b = train_it(&whole, &train, &test);
    cr_assert_eq(a.total, b.total, "the same plan: %llu and %llu steps",
                 (unsigned long long)a.total, (unsigned long long)b.total);
    cr_assert_eq(a.n, b.n);
    double worst = 0.0;
    for (size_t i = 0; i < a.n; i++)
        worst = fmax(worst, fabs((double)a.params[i] - (double)b.params[i]));
    cr_assert_lt(fabs(a.last_loss - b.last_loss), 1e-5 * fabs(b.last_loss),
                 "the step's loss: %.9g with K = %d, %.9g in one batch", a.last_loss, K,
                 b.last_loss);
    free(a.params);
    free(b.params);
    st_dataset_free(&train);
    st_dataset_free(&test);
    return worst;
}

#define BOUND 2e-6

Test(accumulate, one_worker_k_micro_batches_are_one_batch_k_times_larger, .timeout = 120)
{
    const double d = max_difference(config(ST_STRATEGY_DP, 1, 8, 4), 4);
    cr_log_info("dp, 1 worker, 4 x 8 against 32: largest difference %.3g", d);
    cr_assert_lt(d, BOUND, "largest parameter difference %.3g", d);
    const double odd = max_difference(config(ST_STRATEGY_DP, 1, 8, 3), 3);
    cr_log_info("dp, 1 worker, 3 x 8 against 24: largest difference %.3g", odd);
    cr_assert_lt(odd, BOUND, "K = 3 (1/K not exact): largest difference %.3g", odd);
}

Test(accumulate, two_workers_k_micro_batches_are_one_batch_k_times_larger, .timeout = 120)
{
    const double d = max_difference(config(ST_STRATEGY_DP, 2, 8, 2), 2);
    cr_log_info("dp, 2 workers, 2 x 8 against 16: largest difference %.3g", d);
    cr_assert_lt(d, BOUND, "largest parameter difference %.3g", d);
}

/* SGD here: ist and localsgd reset AdamW's state every round, and Adam's
 * first step divides each gradient by its own magnitude, so an element
 * whose gradient is a cancellation's residue (0 summed one way, 1e-9
 * the other) moves by up to lr; SGD's update is linear in the gradient. */
Test(accumulate, subnetwork_and_local_step_strategies_accumulate_too, .timeout = 120)
{
    st_train_config sdp = config(ST_STRATEGY_SDP, 2, 8, 2);
    sdp.model.depth = 4;
    sdp.sdp.coverage = 0.5;
    st_train_config ist = config(ST_STRATEGY_IST, 2, 8, 2);
    ist.model.depth = 4;
    ist.ist.local_steps = 5;
    st_train_config lsgd = config(ST_STRATEGY_DP, 2, 8, 2);
    cr_assert_eq(st_strategy_parse("localsgd", &lsgd.strategy), ST_OK);
    lsgd.localsgd.local_steps = 5;
    st_train_config *cs[3] = { &sdp, &ist, &lsgd };
    for (int k = 0; k < 3; k++) {
        cs[k]->optim.kind = ST_OPT_SGD;
        cs[k]->optim.lr = 0.05f;
        const double d = max_difference(*cs[k], 2);
        cr_log_info("%s, 2 workers, 2 x 8 against 16: largest difference %.3g",
                    st_strategy_name(cs[k]->strategy), d);
        cr_assert_lt(d, BOUND, "%s: largest parameter difference %.3g",
                     st_strategy_name(cs[k]->strategy), d);
    }
}

/* A step is an update: an epoch of 1024 samples is 1024 / (8 x 4) = 32
 * of them for one worker, 16 for two. */
Test(accumulate, a_step_is_one_update_of_k_micro_batches, .timeout = 120)
{
    st_dataset train, test;
    make_data(&train, &test);
    const int workers[2] = { 1, 2 };
    for (int k = 0; k < 2; k++) {
        st_train_config c = config(ST_STRATEGY_DP, workers[k], 8, 4);
        c.steps = 0;
        c.epochs = 2;
        st_trainer *t;
        cr_assert_eq(st_trainer_create(&c, &train, &test, &t), ST_OK, "%s", st_last_error());
        uint64_t total;
        st_trainer_steps(t, &total);
        cr_assert_eq(total, 2 * 1024 / (8 * 4 * workers[k]), "%d worker(s): %llu steps",
                     workers[k], (unsigned long long)total);
        cr_assert_eq(st_trainer_step(t, total, NULL), ST_OK, "%s", st_last_error());
        st_epoch_record m;
        cr_assert_eq(st_trainer_metrics(t, &m), ST_OK);
        cr_assert_eq(m.epoch, 2);
        cr_assert(m.final);
        st_trainer_destroy(t);
    }
    st_dataset_free(&train);
    st_dataset_free(&test);
}

static void assert_refused(const st_train_config *c, const char *needle)
{
    cr_assert_eq(st_train_config_check(c), ST_ERR_INVALID, "%s is refused", needle);
    cr_assert(strstr(st_last_error(), needle), "the message names it: %s", st_last_error());
}

Test(accumulate, combinations_that_cannot_accumulate_are_refused)
{
    st_train_config c = config(ST_STRATEGY_SYNTH, 2, 8, 2);
    c.model.kind = st_model_kind_named("mlp");
    c.model.depth = 5;
    assert_refused(&c, "--accumulate 2: --strategy synth");
    c = config(ST_STRATEGY_SDP, 2, 8, 2);
    c.model.depth = 4;
    c.sdp.align_every = 10;
    assert_refused(&c, "--report align");
    c = config(ST_STRATEGY_DP, 1, 8, -1);
    assert_refused(&c, "--accumulate must be in [1, 65536]");
    c = config(ST_STRATEGY_DP, 1, 8, 70000);
    assert_refused(&c, "--accumulate must be in [1, 65536]");
    /* the steps' samples must fit in the training set */
    st_dataset train, test;
    make_data(&train, &test);
    c = config(ST_STRATEGY_DP, 2, 64, 16);
    st_trainer *t;
    cr_assert_eq(st_trainer_create(&c, &train, &test, &t), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "2 workers x 16 micro-batches x 64 samples"), "%s",
              st_last_error());
    st_dataset_free(&train);
    st_dataset_free(&test);
}

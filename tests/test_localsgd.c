/*
 * tests/test_localsgd.c — local SGD (--strategy localsgd, doc/localsgd.md):
 * one average per step of plain SGD is data parallelism bitwise, and so is
 * one average of momentum SGD with its state kept (both linear in what is
 * averaged); with it reset (its momentum then never outlives a step) plain
 * SGD's data parallelism up to the order of the sums; not AdamW's; runs are
 * deterministic; a run resumed at an averaging boundary is bitwise the
 * run never stopped; bad options are refused.
 */
#include "testutil.h"

#include <math.h>

#include <criterion/criterion.h>

#include <subtrain/subtrain.h>

#include "run_params.h"

static void make_data(st_dataset *train, st_dataset *test)
{
    st_synthetic_config sc = st_synthetic_defaults(3);
    sc.train_count = 4096;
    sc.test_count = 512;
    sc.dim = 32;
    sc.n_classes = 4;
    cr_assert_eq(st_synthetic_make(&sc, train, test), ST_OK, "%s", st_last_error());
    st_dataset_normalize(train, test, NULL, NULL);
}

static st_strategy localsgd(void)
{
    st_strategy s;
    cr_assert_eq(st_strategy_parse("localsgd", &s), ST_OK, "%s", st_last_error());
    return s;
}

/* A small resmlp, `workers` x 16 samples, SGD without momentum or decay. */
static st_train_config config(int workers, uint64_t steps)
{
    st_train_config c = st_train_config_default();
    c.model.kind = st_model_kind_named("resmlp");
    c.model.depth = 2;
    c.model.width = 32;
    c.model.in_dim = 32;
    c.model.n_classes = 4;
    c.optim.kind = ST_OPT_SGD;
    c.optim.lr = 0.05f;
    c.optim.momentum = 0.0f;
    c.optim.weight_decay = 0.0f;
    c.batch = 16;
    c.steps = steps;
    c.workers = workers;
    c.oversubscribe = 1;
    return c;
}

/* The largest |a - b| over the parameters, relative to the largest |a|. */
static double params_distance(const run_out *a, const run_out *b)
{
    cr_assert_eq(a->n, b->n);
    double diff = 0.0, scale = 0.0;
    for (size_t i = 0; i < a->n; i++) {
        diff = fmax(diff, fabs((double)a->params[i] - b->params[i]));
        scale = fmax(scale, fabs((double)a->params[i]));
    }
    return diff / scale;
}

/* Averaging the parameters each step after each worker's own SGD update
 * is data parallelism's update by the averaged gradient, in exact
 * arithmetic: mean_k(p - lr g_k) = p - lr mean_k(g_k).  Where that holds
 * for the configured optimizer (plain SGD; momentum SGD with its state
 * kept, averaged like the parameters) localsgd at R = 1 runs dp's sums in
 * dp's order: every step loss, the records (bytes included) and the final
 * parameters are dp's to the bit.  Momentum reset at every average never
 * outlives a step: plain SGD's data parallelism in exact arithmetic, run
 * by localsgd's own averaging of the parameters, whose float sums run in
 * another order (dp sums the gradients, then scales and subtracts;
 * localsgd subtracts each scaled gradient, then sums the parameters), so
 * each step differs by a few units in the last place, and 60 steps stay
 * within 1e-5 of the parameters' size (measured: 1.3e-6).  Five steps
 * between averages are another algorithm: far above that bound, so the
 * bound can fail. */
#define SAME_AS_DP 1e-5

static void expect_bitwise(const run_out *a, const run_out *b, const char *what)
{
    cr_assert_eq(a->steps, b->steps, "%s", what);
    cr_assert_eq(memcmp(a->losses, b->losses, a->steps * sizeof(float)), 0,
                 "%s: the step losses differ from dp's", what);
    size_t differ = 0;
    for (size_t i = 0; i < a->n; i++)
        differ += memcmp(&a->params[i], &b->params[i], sizeof(float)) != 0;
    cr_assert_eq(differ, 0, "%s: %zu of %zu parameters differ from dp's (largest relative "
                 "difference %.2e)", what, differ, a->n, params_distance(a, b));
    cr_assert_eq(memcmp(&a->final.test_loss, &b->final.test_loss, sizeof(double)), 0, "%s",
                 what);
    cr_assert_eq(memcmp(&a->final.train_loss, &b->final.train_loss, sizeof(double)), 0, "%s",
                 what);
    cr_assert_eq(a->final.test_acc, b->final.test_acc, "%s", what);
    cr_assert_eq(a->final.comm_bytes_per_worker_step, b->final.comm_bytes_per_worker_step,
                 "%s", what);
}

static void expect_dp(st_train_config lsgd, st_train_config dp, int bitwise, const char *what)
{
    st_dataset tr, te;
    make_data(&tr, &te);
    run_out *a = run_train(&dp, &tr, &te), *b = run_train(&lsgd, &tr, &te);
    const double d = params_distance(a, b);
    cr_log_info("%s: parameters %.2e from data parallelism's", what, d);
    if (bitwise)
        expect_bitwise(a, b, what);
    cr_assert_leq(d, SAME_AS_DP, "%s: %.3e from data parallelism", what, d);
    cr_assert_leq(fabs(a->final.test_loss - b->final.test_loss), 1e-4, "%s: test loss %.6f, "
                  "dp's %.6f", what, b->final.test_loss, a->final.test_loss);
    lsgd.localsgd.local_steps = 5;   /* another algorithm: the bound tells them apart */
    run_out *c = run_train(&lsgd, &tr, &te);
    const double far = params_distance(a, c);
    cr_log_info("%s, R = 5: %.2e", what, far);
    cr_assert_gt(far, 10 * SAME_AS_DP, "%s: R = 5 is data parallelism too?", what);
    run_free(a);
    run_free(b);
    run_free(c);
    st_dataset_free(&tr);
    st_dataset_free(&te);
}

Test(localsgd, one_step_rounds_of_sgd_are_data_parallelism_bitwise, .timeout = 120)
{
    st_train_config dp = config(2, 60), l = config(2, 60);
    l.strategy = localsgd();
    l.localsgd.local_steps = 1;
    expect_dp(l, dp, 1, "2 workers, sgd");
    dp = config(3, 60);
    l = config(3, 60);
    l.strategy = localsgd();
    l.localsgd.local_steps = 1;
    dp.optim.weight_decay = l.optim.weight_decay = 0.01f;
    expect_dp(l, dp, 1, "3 workers, sgd, decay");
}

/* Momentum SGD with L2 decay is linear in (parameters, momentum,
 * gradient): averaging both every step (keep) is data parallelism's
 * momentum SGD, bitwise.  Reset zeroes the momentum at every average, so
 * with one step a round it never carries over: plain SGD's data
 * parallelism, up to the order of the sums. */
Test(localsgd, one_step_rounds_of_momentum_sgd_keep_or_reset_their_state, .timeout = 120)
{
    st_train_config dp = config(2, 60), l = config(2, 60);
    dp.optim.momentum = l.optim.momentum = 0.9f;
    dp.optim.weight_decay = l.optim.weight_decay = 0.01f;
    l.strategy = localsgd();
    l.localsgd.local_steps = 1;
    l.localsgd.keep_state = 1;
    expect_dp(l, dp, 1, "momentum kept");
    l.localsgd.keep_state = 0;
    dp.optim.momentum = 0.0f;
    expect_dp(l, dp, 0, "momentum reset");
}

/* AdamW divides each worker's step by its own moments: the mean of the
 * workers' updates is not the update by the mean gradient, with the
 * state reset or kept, so R = 1 is another run than dp's. */
Test(localsgd, one_step_rounds_of_adamw_are_not_data_parallelism, .timeout = 120)
{
    st_dataset tr, te;
    make_data(&tr, &te);
    st_train_config dp = config(2, 30), l = config(2, 30);
    dp.optim = l.optim = st_optim_config_default();
    l.strategy = localsgd();
    l.localsgd.local_steps = 1;
    run_out *a = run_train(&dp, &tr, &te);
    for (int keep = 0; keep < 2; keep++) {
        l.localsgd.keep_state = keep;
        run_out *b = run_train(&l, &tr, &te);
        const double d = params_distance(a, b);
        cr_log_info("adamw, keep %d: parameters %.2e from data parallelism's", keep, d);
        cr_assert_gt(d, 10 * SAME_AS_DP, "adamw, keep %d: %.3e from dp", keep, d);
        run_free(b);
    }
    run_free(a);
    st_dataset_free(&tr);
    st_dataset_free(&te);
}

/* bf16 products read bf16 copies of the weights: one average a step of
 * plain SGD is dp's run there too, to the bit. */
Test(localsgd, bf16_one_step_rounds_are_data_parallelism, .timeout = 120)
{
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 kernels on this CPU");
    st_dataset tr, te;
    make_data(&tr, &te);
    st_train_config dp = config(2, 60), l = config(2, 60);
    dp.model.precision = l.model.precision = ST_PRECISION_BF16;
    dp.bf16_emulated = l.bf16_emulated = 1;
    l.strategy = localsgd();
    l.localsgd.local_steps = 1;
    run_out *a = run_train(&dp, &tr, &te), *b = run_train(&l, &tr, &te);
    expect_bitwise(a, b, "bf16");
    run_free(a);
    run_free(b);
    st_dataset_free(&tr);
    st_dataset_free(&te);
}

/* Same seed and workers: every step's loss, every record and the final
 * parameters bitwise the same; kept state and AdamW included. */
Test(localsgd, runs_are_deterministic, .timeout = 120)
{
    st_dataset tr, te;
    make_data(&tr, &te);
    st_train_config c = config(2, 70);
    c.strategy = localsgd();
    c.optim = st_optim_config_default();   /* AdamW */
    c.localsgd.local_steps = 4;
    for (int keep = 0; keep < 2; keep++) {
        c.localsgd.keep_state = keep;
        run_out *a = run_train(&c, &tr, &te), *b = run_train(&c, &tr, &te);
        cr_assert_eq(a->steps, 70);
        cr_assert_eq(memcmp(a->losses, b->losses, 70 * sizeof(float)), 0, "keep %d", keep);
        cr_assert_eq(memcmp(a->params, b->params, a->n * sizeof(float)), 0, "keep %d", keep);
        cr_assert_eq(memcmp(&a->final.test_loss, &b->final.test_loss, sizeof(double)), 0);
        /* a round's bytes, once every R steps */
        cr_assert_gt(a->final.comm_bytes_per_worker_round, 0.0);
        cr_assert_leq(fabs(a->final.comm_bytes_per_worker_round -
                           4 * a->final.comm_bytes_per_worker_step), 1e-6 *
                      a->final.comm_bytes_per_worker_round);
        run_free(a);
        run_free(b);
    }
    st_dataset_free(&tr);
    st_dataset_free(&te);
}

/* At a round end every worker's optimizer state is the same: averaged
 * (kept, not zero) or zeroed (reset). */
static void expect_state(const st_safetensors *f, int keep)
{
    static const char *const names[2][2] = {
        { "train.optimizer.m.worker0", "train.optimizer.m.worker1" },
        { "train.optimizer.v.worker0", "train.optimizer.v.worker1" },
    };
    for (int k = 0; k < 2; k++) {
        const st_safetensors_tensor *a = st_safetensors_find(f, names[k][0]),
                                    *b = st_safetensors_find(f, names[k][1]);
        cr_assert(a && b && a->bytes == b->bytes && a->bytes > 0, "%s", names[k][0]);
        cr_assert_eq(memcmp(a->data, b->data, a->bytes), 0, "keep %d: %s and %s differ", keep,
                     names[k][0], names[k][1]);
        int zero = 1;
        for (size_t i = 0; i < a->bytes; i++)
            zero &= ((const unsigned char *)a->data)[i] == 0;
        cr_assert_eq(zero, !keep, "keep %d: %s is %szero", keep, names[k][0], zero ? "" : "not ");
    }
}

/* A run with a step checkpoint at an averaging boundary (step 12 of
 * R = 4, inside the first epoch of 128 steps), resumed from it: bitwise
 * the run never stopped, AdamW's state reset or kept. */
Test(localsgd, resumed_at_an_average_is_bitwise, .timeout = 180)
{
    st_dataset tr, te;
    make_data(&tr, &te);
    char dir[ST_TEST_PATH_MAX], path[ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_train_config c = config(2, 40);
    c.strategy = localsgd();
    c.optim = st_optim_config_default();
    c.localsgd.local_steps = 4;
    for (int keep = 0; keep < 2; keep++) {
        c.localsgd.keep_state = keep;
        c.checkpoint.dir = NULL;
        run_out *straight = run_train(&c, &tr, &te);
        st_train_config ck = c;
        ck.checkpoint.dir = dir;
        ck.checkpoint.every = 12;
        run_out *with = run_train(&ck, &tr, &te);
        cr_assert_eq(memcmp(straight->params, with->params, with->n * sizeof(float)), 0,
                     "writing checkpoints changed the run");
        st_safetensors f;
        st_test_path(path, dir, "step-00000012.safetensors");
        cr_assert_eq(st_safetensors_read(path, &f), ST_OK, "%s", st_last_error());
        cr_assert_str_eq(st_safetensors_meta(&f, "subtrain.localsgd.round_step"),
                         keep ? "12" : "0");
        expect_state(&f, keep);
        st_train_config rs = c;
        rs.resume = &f;
        rs.resume_name = path;
        run_out *resumed = run_train(&rs, &tr, &te);
        cr_assert_eq(resumed->steps, 40 - 12);
        cr_assert_eq(memcmp(straight->params, resumed->params, resumed->n * sizeof(float)), 0,
                     "keep %d: resumed at step 12, the parameters differ", keep);
        cr_assert_eq(memcmp(&straight->final.test_loss, &resumed->final.test_loss,
                            sizeof(double)), 0);
        cr_assert_eq(memcmp(&straight->final.train_loss, &resumed->final.train_loss,
                            sizeof(double)), 0);
        st_safetensors_free(&f);
        run_free(straight);
        run_free(with);
        run_free(resumed);
    }
    st_test_rmdir(dir);
    st_dataset_free(&tr);
    st_dataset_free(&te);
}

/* Only round ends are checkpoints: --checkpoint-every 10 of R = 4 writes
 * at steps 12, 20, ...: the first round end at or after each due step. */
Test(localsgd, checkpoints_wait_for_a_round_end, .timeout = 120)
{
    st_dataset tr, te;
    make_data(&tr, &te);
    char dir[ST_TEST_PATH_MAX], path[ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_train_config c = config(2, 24);
    c.strategy = localsgd();
    c.localsgd.local_steps = 4;
    c.checkpoint.dir = dir;
    c.checkpoint.every = 10;
    run_free(run_train(&c, &tr, &te));
    cr_assert_eq(access(st_test_path(path, dir, "step-00000012.safetensors"), R_OK), 0);
    cr_assert_eq(access(st_test_path(path, dir, "step-00000020.safetensors"), R_OK), 0);
    cr_assert_neq(access(st_test_path(path, dir, "step-00000010.safetensors"), F_OK), 0);
    st_test_rmdir(dir);
    st_dataset_free(&tr);
    st_dataset_free(&te);
}

Test(localsgd, bad_options_are_refused)
{
    st_train_config c = config(2, 10);
    c.strategy = localsgd();
    cr_assert_eq(st_train_config_check(&c), ST_OK, "%s", st_last_error());
    c.localsgd.local_steps = 0;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "--local-steps must be >= 1"), "%s", st_last_error());
    c.localsgd.local_steps = 3;
    c.comm_precision = ST_PRECISION_BF16;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "--strategy localsgd averages parameters"), "%s",
              st_last_error());
    c.comm_precision = ST_PRECISION_FP32;
    c.localsgd.keep_state = 1;   /* SGD without momentum */
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "SGD without momentum keeps no state"), "%s",
              st_last_error());
    c.optim.momentum = 0.5f;
    cr_assert_eq(st_train_config_check(&c), ST_OK, "%s", st_last_error());
    char line[128];
    st_strategy_describe(&c, 2, line, sizeof line);
    cr_assert_str_eq(line, "localsgd (3 local steps, optimizer state averaged)");
}

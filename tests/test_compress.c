/*
 * tests/test_compress.c — compressed communication (--compress randk:Q,
 * doc/reduction.md "Compressed communication"): Q = 1 is data parallelism
 * to the bit; one step of plain SGD keeps ceil(Q S) coordinates of every
 * shard, scaled by S / k, the rest untouched; runs are deterministic; a
 * run with error feedback resumed from a step checkpoint is bitwise the
 * run never stopped; bad options are refused.
 */
#include "testutil.h"

#include <math.h>

#include <criterion/criterion.h>

#include <subtrain/subtrain.h>

#include "run_params.h"

static void make_data(st_dataset *train, st_dataset *test)
{
    st_synthetic_config sc = st_synthetic_defaults(5);
    sc.train_count = 2048;
    sc.test_count = 256;
    sc.dim = 32;
    sc.n_classes = 4;
    cr_assert_eq(st_synthetic_make(&sc, train, test), ST_OK, "%s", st_last_error());
    st_dataset_normalize(train, test, NULL, NULL);
}

/* A small mlp (gelu: no gradient is exactly zero), AdamW, `workers` x 16
 * samples. */
static st_train_config config(int workers, uint64_t steps)
{
    st_train_config c = st_train_config_default();
    c.model.kind = st_model_kind_named("mlp");
    c.model.depth = 2;
    c.model.width = 24;
    c.model.in_dim = 32;
    c.model.n_classes = 4;
    c.batch = 16;
    c.steps = steps;
    c.workers = workers;
    c.oversubscribe = 1;
    return c;
}

static void expect_bitwise(const run_out *a, const run_out *b, const char *what)
{
    cr_assert_eq(a->steps, b->steps, "%s", what);
    cr_assert_eq(memcmp(a->losses, b->losses, sizeof(float) * (a->steps < RUN_MAX_STEPS
                                                                ? a->steps : RUN_MAX_STEPS)), 0,
                 "%s: the step losses differ", what);
    cr_assert_eq(a->n, b->n);
    size_t differ = 0;
    for (size_t i = 0; i < a->n; i++)
        differ += memcmp(&a->params[i], &b->params[i], sizeof(float)) != 0;
    cr_assert_eq(differ, 0, "%s: %zu of %zu parameters differ", what, differ, a->n);
    cr_assert_eq(memcmp(&a->final.test_loss, &b->final.test_loss, sizeof(double)), 0,
                 "%s: test loss %.9g against %.9g", what, a->final.test_loss,
                 b->final.test_loss);
    cr_assert_eq(memcmp(&a->final.train_loss, &b->final.train_loss, sizeof(double)), 0, "%s",
                 what);
    cr_assert_eq(a->final.test_acc, b->final.test_acc, "%s", what);
}

/* Keeping every coordinate (k = S, scale S / S = 1) packs the gradient
 * as it is, and the packed engine sums it in dp's order: every step loss,
 * the records and the final weights are dp's to the bit, with 1, 2 and 3
 * workers (uneven shards), error feedback (its residual stays zero),
 * momentum SGD and bf16 products. */
Test(compress, randk_1_is_data_parallelism_bitwise, .timeout = 180)
{
    st_dataset tr, te;
    make_data(&tr, &te);
    const int workers[] = { 1, 2, 3 };
    for (int k = 0; k < 3; k++) {
        st_train_config dp = config(workers[k], 30), rk = dp;
        rk.dp.compress = ST_COMPRESS_RANDK;
        rk.dp.keep = 1.0f;
        run_out *a = run_train(&dp, &tr, &te), *b = run_train(&rk, &tr, &te);
        char what[64];
        snprintf(what, sizeof what, "%d workers", workers[k]);
        expect_bitwise(a, b, what);
        rk.dp.error_feedback = 1;
        run_out *c = run_train(&rk, &tr, &te);
        expect_bitwise(a, c, "error feedback");
        run_free(a);
        run_free(b);
        run_free(c);
    }
    st_train_config dp = config(2, 30);
    dp.optim.kind = ST_OPT_SGD;
    dp.optim.lr = 0.05f;
    dp.optim.momentum = 0.9f;
    st_train_config rk = dp;
    rk.dp.compress = ST_COMPRESS_RANDK;
    rk.dp.keep = 1.0f;
    run_out *a = run_train(&dp, &tr, &te), *b = run_train(&rk, &tr, &te);
    expect_bitwise(a, b, "momentum sgd");
    run_free(a);
    run_free(b);
    if (st_bf16_probe(NULL) != ST_BF16_UNAVAILABLE) {
        dp = config(2, 20);
        dp.model.precision = ST_PRECISION_BF16;
        dp.bf16_emulated = 1;
        rk = dp;
        rk.dp.compress = ST_COMPRESS_RANDK;
        rk.dp.keep = 1.0f;
        a = run_train(&dp, &tr, &te);
        b = run_train(&rk, &tr, &te);
        expect_bitwise(a, b, "bf16");
        run_free(a);
        run_free(b);
    }
    st_dataset_free(&tr);
    st_dataset_free(&te);
}

/* The masters' shards: ceil(P / 16) lines of 16 floats dealt evenly, the
 * first (lines mod N) shards one more (doc/reduction.md, "Shards"). */
static void shards(size_t P, int N, size_t *begin)
{
    const size_t lines = (P + 15) / 16;
    begin[0] = 0;
    for (int v = 0; v < N; v++) {
        size_t own = lines / (size_t)N + ((size_t)v < lines % (size_t)N);
        begin[v + 1] = begin[v] + own * 16;
        if (begin[v + 1] > P)
            begin[v + 1] = P;
    }
}

/* One step of plain SGD (lr 1, no decay) from the same start: dp moves
 * each parameter by the mean gradient, randk:Q by (S / k) times it for
 * k = ceil(Q S) coordinates of each shard, and leaves the others where
 * they were.  So per shard exactly k parameters move, each by S / k times
 * dp's move (to float rounding), and over 8 steps every coordinate's
 * share of the moves is near Q. */
static void expect_mask(int N, float Q)
{
    st_dataset tr, te;
    make_data(&tr, &te);
    st_train_config c = config(N, 1);
    c.optim.kind = ST_OPT_SGD;
    c.optim.lr = 1.0f;
    c.optim.momentum = 0.0f;
    c.optim.weight_decay = 0.0f;
    c.schedule = ST_SCHED_CONSTANT;
    st_train_config rk = c;
    rk.dp.compress = ST_COMPRESS_RANDK;
    rk.dp.keep = Q;
    run_out *dp = run_train(&c, &tr, &te), *r = run_train(&rk, &tr, &te);
    const size_t P = dp->n;
    run_out *p0 = calloc(1, sizeof *p0);   /* the start: the seed's initial values */
    cr_assert_not_null(p0);
    p0->params = malloc(P * sizeof(float));
    cr_assert_not_null(p0->params);
    cr_assert_eq(st_model_init_full_range(&c.model, c.seed, 0, P, p0->params), ST_OK, "%s",
                 st_last_error());
    size_t begin[9];
    cr_assert_leq(N, 8);
    shards(P, N, begin);
    for (int v = 0; v < N; v++) {
        const size_t S = begin[v + 1] - begin[v];
        const size_t k = (size_t)ceil((double)Q * (double)S);
        const double scale = (double)S / (double)k;
        size_t moved = 0;
        for (size_t i = begin[v]; i < begin[v + 1]; i++) {
            const double d = (double)p0->params[i] - r->params[i];
            const double m = (double)p0->params[i] - dp->params[i];
            cr_assert_neq(m, 0.0, "parameter %zu: dp's step did not move it", i);
            if (d == 0.0)
                continue;
            moved++;
            /* both moves are differences of floats near p0: relative
             * error up to 2^-24 |p0| / |m| each */
            const double tol = 4e-7 * (fabs(p0->params[i]) + fabs(d)) / fabs(m) + 1e-6;
            cr_assert_leq(fabs(d / m - scale), tol * scale, "N %d, Q %g, shard %d, parameter "
                          "%zu: moved %.6g times dp's move, not %.6g", N, (double)Q, v, i, d / m,
                          scale);
        }
        cr_assert_eq(moved, k, "N %d, Q %g: shard %d of %zu moved %zu parameters, not "
                     "ceil(Q S) = %zu", N, (double)Q, v, S, moved, k);
    }
    run_free(p0);
    run_free(dp);
    run_free(r);
    st_dataset_free(&tr);
    st_dataset_free(&te);
}

Test(compress, randk_keeps_ceil_q_s_of_each_shard_scaled_by_s_over_k, .timeout = 120)
{
    expect_mask(2, 0.5f);
    expect_mask(3, 0.25f);
    expect_mask(1, 0.1f);
}

/* Every coordinate is kept with probability k / S, drawn again every
 * step: runs of 1 .. T + 1 steps of plain SGD, each the next's start, so
 * run t + 1 differs from run t where step t + 1 kept a coordinate.  Over
 * T = 8 steps the times a coordinate moved is Binomial(8, 1/2); its mean
 * over the P coordinates is within 4 standard errors of 4, and about P /
 * 256 never moved (a mask drawn once, not per step, fails both). */
Test(compress, randk_draws_a_new_subset_every_step, .timeout = 120)
{
    st_dataset tr, te;
    make_data(&tr, &te);
    st_train_config c = config(2, 64);
    c.optim.kind = ST_OPT_SGD;
    c.optim.lr = 0.01f;
    c.optim.momentum = 0.0f;
    c.optim.weight_decay = 0.0f;
    c.schedule = ST_SCHED_CONSTANT;
    c.dp.compress = ST_COMPRESS_RANDK;
    c.dp.keep = 0.5f;
    const int T = 8;
    run_out *prev = NULL;
    size_t *moves = NULL, P = 0;
    for (int t = 0; t <= T; t++) {
        st_train_config ct = c;
        ct.steps = (uint64_t)t + 1;
        run_out *o = run_train(&ct, &tr, &te);
        if (!moves) {
            P = o->n;
            moves = calloc(P, sizeof *moves);
            cr_assert_not_null(moves);
        }
        if (prev) {
            for (size_t i = 0; i < P; i++)
                moves[i] += prev->params[i] != o->params[i];
            run_free(prev);
        }
        prev = o;
    }
    run_free(prev);
    double mean = 0.0;
    size_t never = 0;
    for (size_t i = 0; i < P; i++) {
        mean += (double)moves[i];
        never += moves[i] == 0;
    }
    mean /= (double)P;
    const double expect = T * 0.5, se = sqrt(T * 0.25 / (double)P);
    cr_log_info("randk 0.5: a coordinate moved in %.4f of %d steps on average (expected %.1f), "
                "%zu of %zu never", mean, T, expect, never, P);
    cr_assert_leq(fabs(mean - expect), 4 * se + 1.0 / (double)P, "moved %.4f times on average, "
                  "expected %.1f", mean, expect);
    /* P(never in 8) = 2^-8: about P / 256 coordinates, far from P / 2 */
    cr_assert_lt((double)never, (double)P / 256.0 + 6.0 * sqrt((double)P / 256.0),
                 "%zu of %zu coordinates never moved", never, P);
    free(moves);
    st_dataset_free(&tr);
    st_dataset_free(&te);
}

/* Same seed: every step loss and the final parameters bitwise the same;
 * another Q or error feedback is another run. */
Test(compress, randk_runs_are_deterministic, .timeout = 120)
{
    st_dataset tr, te;
    make_data(&tr, &te);
    st_train_config c = config(2, 40);
    c.dp.compress = ST_COMPRESS_RANDK;
    c.dp.keep = 0.25f;
    for (int ef = 0; ef < 2; ef++) {
        c.dp.error_feedback = ef;
        run_out *a = run_train(&c, &tr, &te), *b = run_train(&c, &tr, &te);
        expect_bitwise(a, b, ef ? "error feedback" : "randk");
        run_free(a);
        run_free(b);
    }
    st_train_config d = c;
    d.dp.error_feedback = 0;
    c.dp.error_feedback = 1;
    run_out *a = run_train(&c, &tr, &te), *b = run_train(&d, &tr, &te);
    cr_assert_neq(memcmp(a->params, b->params, a->n * sizeof(float)), 0,
                  "error feedback changed nothing");
    run_free(a);
    run_free(b);
    st_dataset_free(&tr);
    st_dataset_free(&te);
}

/* A step checkpoint at step 12 holds every worker's residual; a run
 * resumed from it is bitwise the run never stopped. */
Test(compress, error_feedback_resumed_is_bitwise, .timeout = 120)
{
    st_dataset tr, te;
    make_data(&tr, &te);
    char dir[ST_TEST_PATH_MAX], path[ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_train_config c = config(2, 30);
    c.dp.compress = ST_COMPRESS_RANDK;
    c.dp.keep = 0.25f;
    c.dp.error_feedback = 1;
    run_out *straight = run_train(&c, &tr, &te);
    st_train_config ck = c;
    ck.checkpoint.dir = dir;
    ck.checkpoint.every = 12;
    run_out *with = run_train(&ck, &tr, &te);
    expect_bitwise(straight, with, "writing checkpoints");
    st_safetensors f;
    st_test_path(path, dir, "step-00000012.safetensors");
    cr_assert_eq(st_safetensors_read(path, &f), ST_OK, "%s", st_last_error());
    const st_safetensors_tensor *e0 = st_safetensors_find(&f, "train.randk.residual.worker0"),
                                *e1 = st_safetensors_find(&f, "train.randk.residual.worker1");
    cr_assert(e0 && e1 && e0->bytes == straight->n * sizeof(float), "the residuals are saved");
    size_t nonzero = 0;
    for (size_t i = 0; i < straight->n; i++)
        nonzero += ((const float *)e0->data)[i] != 0.0f;
    cr_assert_gt(nonzero, straight->n / 2, "worker 0's residual holds what it dropped");
    st_train_config rs = c;
    rs.resume = &f;
    rs.resume_name = path;
    run_out *resumed = run_train(&rs, &tr, &te);
    cr_assert_eq(resumed->steps, 30 - 12);
    cr_assert_eq(memcmp(straight->params, resumed->params, resumed->n * sizeof(float)), 0,
                 "resumed at step 12, the parameters differ");
    cr_assert_eq(memcmp(&straight->final.test_loss, &resumed->final.test_loss, sizeof(double)),
                 0);
    st_safetensors_free(&f);
    run_free(straight);
    run_free(with);
    run_free(resumed);
    st_test_rmdir(dir);
    st_dataset_free(&tr);
    st_dataset_free(&te);
}

/* The records' bytes a step are the busiest worker's; `subtrain topo
 * --compress` computes every worker's from the plans' rules alone
 * (st_compress_plan_bytes): the two agree to the byte, for 2 and 3
 * workers, three values of Q, with and without error feedback.  The ring
 * all-reduce a distributed run would need carries the kept coordinates
 * only: K = sum of ceil(Q S_w), between Q P and Q P + N. */
Test(compress, planned_bytes_are_the_recorded_ones, .timeout = 120)
{
    st_dataset tr, te;
    make_data(&tr, &te);
    const float keeps[] = { 1.0f, 0.5f, 0.25f };
    for (int N = 2; N <= 3; N++)
        for (int q = 0; q < 3; q++)
            for (int ef = 0; ef < 2; ef++) {
                st_train_config c = config(N, 4);
                c.dp.compress = ST_COMPRESS_RANDK;
                c.dp.keep = keeps[q];
                c.dp.error_feedback = ef;
                run_out *o = run_train(&c, &tr, &te);
                st_comm_config cc = { .n_workers = N, .n_params = o->n, .shared_params = 1 };
                double busiest = 0.0;
                for (int w = 0; w < N; w++) {
                    st_comm_bytes b;
                    cr_assert_eq(st_compress_plan_bytes(&c.dp, &cc, w, &b), ST_OK, "%s",
                                 st_last_error());
                    busiest = fmax(busiest, (double)(b.read + b.written));
                }
                cr_assert_eq(o->final.comm_bytes_per_worker_step, busiest,
                             "N %d, Q %g, error feedback %d: recorded %.0f, planned %.0f", N,
                             (double)keeps[q], ef, o->final.comm_bytes_per_worker_step,
                             busiest);
                const double per = 2.0 * (N - 1) / N * sizeof(float);
                const double K = o->final.ring_bytes_per_worker_step / per;
                cr_assert(K == floor(K) && K >= keeps[q] * (double)o->n &&
                          K <= keeps[q] * (double)o->n + N,
                          "N %d, Q %g: the ring carries %.2f coordinates of %zu", N,
                          (double)keeps[q], K, o->n);
                run_free(o);
            }
    st_dataset_free(&tr);
    st_dataset_free(&te);
}

Test(compress, bad_options_are_refused)
{
    st_train_config c = config(2, 10);
    c.dp.compress = ST_COMPRESS_RANDK;
    c.dp.keep = 0.5f;
    cr_assert_eq(st_train_config_check(&c), ST_OK, "%s", st_last_error());
    char line[128];
    st_strategy_describe(&c, 2, line, sizeof line);
    cr_assert_str_eq(line, "dp (randk 0.5)");
    c.dp.keep = 0.0f;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "must be a number in (0, 1]"), "%s", st_last_error());
    c.dp.keep = 1.5f;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
    c.dp.compress = ST_COMPRESS_NONE;
    c.dp.keep = 1.0f;
    c.dp.error_feedback = 1;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "--error-feedback"), "%s", st_last_error());
}

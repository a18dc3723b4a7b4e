/*
 * tests/test_trainer.c — the trainer handle (subtrain/trainer.h): its
 * steps are st_train_run's, bit for bit (one and two workers; dp, sdp,
 * ist), in whatever chunks they are taken; its evaluation is the epoch
 * record's; its update alone is a step's second half; bad configurations
 * and calls are refused with a message; and a step makes no heap call of
 * subtrain's.  Public headers only (and oneDNN's, for the heap watch).
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <oneapi/dnnl/dnnl.h>

#include <subtrain/subtrain.h>

/* 1024 training samples: at batch 32 an epoch is 32 steps for one worker
 * and 16 for two, so that the runs below cross epoch ends. */
static void make_data(uint64_t seed, st_dataset *train, st_dataset *test)
{
    st_synthetic_config sc = st_synthetic_defaults(seed);
    sc.train_count = 1024;
    sc.test_count = 300;   /* the last evaluation batch is partial */
    sc.dim = 32;
    sc.n_classes = 4;
    cr_assert_eq(st_synthetic_make(&sc, train, test), ST_OK, "%s", st_last_error());
    st_dataset_normalize(train, test, NULL, NULL);
}

static st_train_config config(st_strategy strategy, int workers, uint64_t steps)
{
    st_train_config c = st_train_config_default();
    c.strategy = strategy;
    c.model.kind = st_model_kind_named("resmlp");
    c.model.depth = 2;
    c.model.width = 64;
    c.model.in_dim = 32;
    c.model.n_classes = 4;
    c.batch = 32;
    c.workers = workers;
    c.steps = steps;
    c.epochs = 0;
    c.oversubscribe = 1; /* this machine may have fewer cores than workers */
    return c;
}

/* ------------------------------------------------------------ st_train_run's view */

#define MAX_STEPS 512

typedef struct reference {
    float losses[MAX_STEPS];
    uint64_t steps;
    float *params;
    size_t n_params;
    st_epoch_record final;
} reference;

static void ref_step(const st_step_info *info, void *user)
{
    reference *r = user;
    if (r->steps < MAX_STEPS)
        r->losses[r->steps] = info->loss;
    r->steps++;
}

static void ref_params(const float *params, size_t count, void *user)
{
    reference *r = user;
    r->params = malloc(count * sizeof *r->params);
    cr_assert_not_null(r->params);
    memcpy(r->params, params, count * sizeof *r->params);
    r->n_params = count;
}

static reference *run_reference(const st_train_config *c, const st_dataset *train,
                                const st_dataset *test)
{
    reference *r = calloc(1, sizeof *r);
    cr_assert_not_null(r);
    st_train_callbacks cb = { .on_step = ref_step, .on_params = ref_params, .user = r };
    cr_assert_eq(st_train_run(c, train, test, &cb, &r->final), ST_OK, "%s", st_last_error());
    cr_assert_eq(r->steps, c->steps);
    return r;
}

static void free_reference(reference *r)
{
    free(r->params);
    free(r);
}

/* ------------------------------------------------------------ the trainer's view */

/* The whole run of c with a trainer, its steps taken in chunks of the
 * sizes given (cycled; chunk 1: every loss is seen), compared with
 * st_train_run: every loss seen, the parameters and the evaluation, to
 * the bit. */
static void assert_trainer_is_the_run(const st_train_config *c, const int *chunks, int n_chunks,
                                      const char *what)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    reference *ref = run_reference(c, &train, &test);

    st_trainer *t;
    cr_assert_eq(st_trainer_create(c, &train, &test, &t), ST_OK, "%s: %s", what, st_last_error());
    cr_assert_eq(st_trainer_workers(t), c->workers);
    uint64_t total;
    cr_assert_eq(st_trainer_steps(t, &total), 0);
    cr_assert_eq(total, c->steps);
    for (int k = 0; st_trainer_steps(t, NULL) < total; k++) {
        uint64_t done = st_trainer_steps(t, NULL);
        uint64_t n = (uint64_t)chunks[k % n_chunks];
        if (n > total - done)
            n = total - done;
        float loss;
        cr_assert_eq(st_trainer_step(t, n, &loss), ST_OK, "%s: %s", what, st_last_error());
        cr_assert_eq(memcmp(&loss, &ref->losses[done + n - 1], sizeof loss), 0,
                     "%s: step %llu's loss %.9g, st_train_run's %.9g", what,
                     (unsigned long long)(done + n), (double)loss,
                     (double)ref->losses[done + n - 1]);
    }
    size_t P = st_model_config_param_count(&c->model);
    cr_assert_eq(ref->n_params, P);
    float *p = malloc(P * sizeof *p);
    cr_assert_eq(st_trainer_params(t, p, P), ST_OK, "%s", st_last_error());
    cr_assert_eq(memcmp(p, ref->params, P * sizeof *p), 0, "%s: the parameters are bitwise "
                 "st_train_run's", what);
    double loss, acc;
    cr_assert_eq(st_trainer_evaluate(t, &loss, &acc), ST_OK, "%s", st_last_error());
    cr_assert_eq(memcmp(&loss, &ref->final.test_loss, sizeof loss), 0,
                 "%s: test loss %.17g, st_train_run's %.17g", what, loss, ref->final.test_loss);
    cr_assert_eq(acc, ref->final.test_acc);
    st_epoch_record m;
    cr_assert_eq(st_trainer_metrics(t, &m), ST_OK);
    cr_assert_eq(m.step, total);
    cr_assert(m.final);
    cr_assert_eq(m.epoch, ref->final.epoch);
    cr_assert_eq(m.epochs, ref->final.epochs);
    cr_assert_eq(m.test_acc, acc);
    cr_assert_eq(m.workers, c->workers);
    cr_assert_eq(m.memory.peak_total, ref->final.memory.peak_total,
                 "%s: the same arenas as st_train_run's", what);
    cr_assert_eq(m.comm_bytes_per_worker_step, ref->final.comm_bytes_per_worker_step);
    cr_assert_eq(m.comm_bytes_per_worker_round, ref->final.comm_bytes_per_worker_round);
    free(p);
    st_trainer_destroy(t);
    free_reference(ref);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

static const int ONE[] = { 1 };
static const int UNEVEN[] = { 3, 1, 17, 5 };

Test(trainer, one_worker_dp_step_by_step_is_st_train_run, .timeout = 120)
{
    st_train_config c = config(ST_STRATEGY_DP, 1, 70);
    assert_trainer_is_the_run(&c, ONE, 1, "dp, 1 worker");
}

Test(trainer, two_workers_dp_step_by_step_is_st_train_run, .timeout = 120)
{
    st_train_config c = config(ST_STRATEGY_DP, 2, 40);
    assert_trainer_is_the_run(&c, ONE, 1, "dp, 2 workers");
}

Test(trainer, steps_in_uneven_chunks_are_the_same_steps, .timeout = 120)
{
    st_train_config c = config(ST_STRATEGY_DP, 2, 40);
    c.optim.kind = ST_OPT_SGD;   /* another optimizer, a constant rate */
    c.optim.momentum = 0.9f;
    c.optim.lr = 0.05f;
    c.schedule = ST_SCHED_CONSTANT;
    assert_trainer_is_the_run(&c, UNEVEN, 4, "dp SGD, 2 workers, chunks");
}

Test(trainer, sdp_with_resampled_masks_is_st_train_run, .timeout = 120)
{
    st_train_config c = config(ST_STRATEGY_SDP, 2, 40);
    c.model.depth = 4;
    c.sdp.coverage = 0.5;
    c.sdp.resample = 6;
    c.sdp.align_every = 5;
    assert_trainer_is_the_run(&c, UNEVEN, 4, "sdp block forward C=0.5 resample 6, 2 workers");
}

Test(trainer, sdp_backward_masking_is_st_train_run, .timeout = 120)
{
    st_train_config c = config(ST_STRATEGY_SDP, 2, 40);
    c.model.depth = 4;
    c.sdp.coverage = 0.5;
    c.sdp.masking = ST_MASKING_BACKWARD;
    assert_trainer_is_the_run(&c, ONE, 1, "sdp block backward C=0.5, 2 workers");
}

Test(trainer, ist_rounds_end_where_st_train_run_ends_them, .timeout = 120)
{
    /* rounds of 5 steps, and one at each epoch end (16 steps an epoch) */
    st_train_config c = config(ST_STRATEGY_IST, 2, 40);
    c.model.depth = 4;
    c.ist.local_steps = 5;
    assert_trainer_is_the_run(&c, UNEVEN, 4, "ist R=5, 2 workers");
}

Test(trainer, localsgd_averages_where_st_train_run_averages, .timeout = 120)
{
    st_train_config c = config(ST_STRATEGY_DP, 2, 40);
    cr_assert_eq(st_strategy_parse("localsgd", &c.strategy), ST_OK);
    c.localsgd.local_steps = 5;
    c.localsgd.keep_state = 1;
    assert_trainer_is_the_run(&c, UNEVEN, 4, "localsgd R=5 kept state, 2 workers");
}

/* dp with random-k and error feedback: the step's subset drawn from the
 * step's number, the residuals kept between the caller's calls. */
Test(trainer, randk_step_by_step_is_st_train_run, .timeout = 120)
{
    st_train_config c = config(ST_STRATEGY_DP, 2, 40);
    c.dp.compress = ST_COMPRESS_RANDK;
    c.dp.keep = 0.25f;
    c.dp.error_feedback = 1;
    assert_trainer_is_the_run(&c, UNEVEN, 4, "dp randk 0.25 error feedback, 2 workers");
}

/* The bench's breakdown: its own gather and forward-backward on worker
 * 0's model, then st_trainer_update, is a step. */
/* A ResNet under block sdp: batch norms' running statistics meet at each
 * evaluation and the full model recalibrates them, through the trainer as
 * in st_train_run, to the bit; and an evaluation before any step (the
 * calibration reads the stored order) works. */
Test(trainer, resnet_sdp_is_st_train_run, .timeout = 180)
{
    st_train_config c = config(ST_STRATEGY_SDP, 4, 20);
    c.model.kind = st_model_kind_named("resnet");
    c.model.depth = 2;
    c.model.width = 8;
    c.model.activation = ST_ACT_RELU;
    c.model.in_channels = 2;      /* make_data's 32 features as 2 x 4 x 4 images */
    c.model.in_height = 4;
    c.model.in_width = 4;
    c.sdp.subnet = ST_SUBNET_BLOCK;
    c.sdp.coverage = 0.5;
    c.bn_calibration = 4;
    assert_trainer_is_the_run(&c, UNEVEN, 4, "resnet sdp");
    st_dataset train, test;
    make_data(5, &train, &test);
    st_trainer *t;
    cr_assert_eq(st_trainer_create(&c, &train, &test, &t), ST_OK, "%s", st_last_error());
    double loss, acc;
    cr_assert_eq(st_trainer_evaluate(t, &loss, &acc), ST_OK, "%s", st_last_error());
    cr_assert(isfinite(loss) && acc >= 0.0 && acc <= 1.0);
    st_trainer_destroy(t);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

static void expect_update_is_a_step(const st_train_config *cfg)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    const st_train_config c = *cfg;
    st_trainer *a, *b;
    cr_assert_eq(st_trainer_create(&c, &train, &test, &a), ST_OK, "%s", st_last_error());
    cr_assert_eq(st_trainer_create(&c, &train, &test, &b), ST_OK, "%s", st_last_error());
    st_model *m = st_trainer_model(b, 0);
    cr_assert_not_null(m);
    cr_assert_null(st_trainer_model(b, 1));
    uint32_t *order = malloc(train.count * sizeof *order);
    const uint64_t S = train.count / (uint32_t)c.batch;
    for (uint64_t s = 1; s <= 40; s++) {
        float la, lb, lr;
        cr_assert_eq(st_trainer_step(a, 1, &la), ST_OK, "%s", st_last_error());
        if ((s - 1) % S == 0)
            st_epoch_order(c.seed, (s - 1) / S, order, train.count);
        uint32_t first = (uint32_t)((s - 1) % S) * (uint32_t)c.batch;
        st_dataset_gather(&train, order + first, (size_t)c.batch, st_model_input(m),
                          st_model_labels(m));
        cr_assert_eq(st_model_forward_backward(m, &lb), ST_OK, "%s", st_last_error());
        cr_assert_eq(st_trainer_update(b, &lr), ST_OK, "%s", st_last_error());
        cr_assert_eq(memcmp(&la, &lb, sizeof la), 0, "step %llu", (unsigned long long)s);
    }
    size_t P = st_model_config_param_count(&c.model);
    float *pa = malloc(P * sizeof *pa), *pb = malloc(P * sizeof *pb);
    cr_assert_eq(st_trainer_params(a, pa, P), ST_OK);
    cr_assert_eq(st_trainer_params(b, pb, P), ST_OK);
    cr_assert_eq(memcmp(pa, pb, P * sizeof *pa), 0, "the same parameters");
    free(pa);
    free(pb);
    free(order);
    st_trainer_destroy(a);
    st_trainer_destroy(b);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(trainer, update_after_the_callers_forward_backward_is_a_step, .timeout = 120)
{
    st_train_config c = config(ST_STRATEGY_DP, 1, 40);
    expect_update_is_a_step(&c);
    c.dp.compress = ST_COMPRESS_RANDK;   /* the update draws the step's subset */
    c.dp.keep = 0.5f;
    expect_update_is_a_step(&c);
}

Test(trainer, metrics_so_far_carry_memory_communication_and_times, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = config(ST_STRATEGY_DP, 2, 40);
    st_trainer *t;
    cr_assert_eq(st_trainer_create(&c, &train, &test, &t), ST_OK, "%s", st_last_error());
    st_epoch_record m;
    cr_assert_eq(st_trainer_metrics(t, &m), ST_OK);
    cr_assert_eq(m.step, 0);
    cr_assert_eq(m.epoch, 0);
    cr_assert_gt(m.memory.peak_total, 0, "the workers are built");
    cr_assert_eq(st_trainer_step(t, 20, NULL), ST_OK, "%s", st_last_error());
    cr_assert_eq(st_trainer_metrics(t, &m), ST_OK);
    size_t P = st_model_config_param_count(&c.model);
    cr_assert_eq(m.step, 20);
    cr_assert_eq(m.epoch, 2, "16 steps an epoch");
    cr_assert_eq(m.epochs, 3);
    cr_assert(!m.final);
    cr_assert_eq(m.workers, 2);
    cr_assert_not_null(m.worker_memory);
    cr_assert_gt(m.worker_memory[1].peak_total, 0);
    cr_assert_gt(m.train_loss, 0.0);
    cr_assert_gt(m.lr, 0.0);
    cr_assert_gt(m.samples_per_s, 0.0);
    cr_assert_gt(m.step_ms_compute, 0.0);
    cr_assert_gt(m.step_ms_reduce, 0.0);
    cr_assert_gt(m.step_ms_optimizer, 0.0);
    cr_assert_gt(m.comm_bytes_per_worker_step, 0.0);
    cr_assert_float_eq(m.ring_bytes_per_worker_step, 2.0 * 1 / 2 * (double)P * 4, 1.0);
    cr_assert_eq(m.test_acc, 0.0, "no evaluation yet");
    double loss, acc;
    cr_assert_eq(st_trainer_evaluate(t, &loss, &acc), ST_OK);
    cr_assert_eq(st_trainer_metrics(t, &m), ST_OK);
    cr_assert_eq(m.test_loss, loss);
    cr_assert_eq(m.test_acc, acc);
    st_trainer_destroy(t);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* ------------------------------------------------------------ refusals */

static void assert_refused(st_status s, const char *needle, const char *what)
{
    cr_assert_neq(s, ST_OK, "%s was accepted", what);
    cr_assert(strstr(st_last_error(), needle), "%s: the message says why: '%s'", what,
              st_last_error());
}

Test(trainer, bad_configurations_and_calls_are_refused_with_a_message, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_trainer *t = (st_trainer *)&t;

    st_train_config c = config(ST_STRATEGY_DP, 1, 10);
    c.batch = 0;
    assert_refused(st_trainer_create(&c, &train, &test, &t), "batch", "batch 0");
    cr_assert_null(t, "no trainer on failure");

    c = config(ST_STRATEGY_DP, 1, 10);
    c.model.in_dim = 31;
    assert_refused(st_trainer_create(&c, &train, &test, &t), "inputs", "data of another width");

    c = config(ST_STRATEGY_DP, 1, 10);
    c.batch = 2048;
    assert_refused(st_trainer_create(&c, &train, &test, &t), "larger than the training set",
                   "a global batch larger than the data");

    c = config(ST_STRATEGY_SYNTH, 2, 0);
    c.model.kind = st_model_kind_named("mlp");
    c.model.depth = 3;
    c.epochs = 1;
    assert_refused(st_trainer_create(&c, &train, &test, &t), "synth", "synth");
    assert_refused(st_trainer_create(&c, &train, &test, &t), "st_train_run", "synth");

    c = config(ST_STRATEGY_SDP, 2, 10);
    c.sdp.coverage = 0.5;
    cr_assert_eq(st_trainer_create(&c, &train, &test, &t), ST_OK, "%s", st_last_error());
    assert_refused(st_trainer_update(t, NULL), "dp", "an update alone under sdp");
    assert_refused(st_trainer_step(t, 11, NULL), "10", "more steps than the run has");
    cr_assert_eq(st_trainer_steps(t, NULL), 0, "nothing was taken");
    cr_assert_eq(st_trainer_step(t, 10, NULL), ST_OK, "%s", st_last_error());
    assert_refused(st_trainer_step(t, 1, NULL), "are done", "a step past the end");
    float small[4];
    assert_refused(st_trainer_params(t, small, 4), "parameters", "a short parameter buffer");
    st_trainer_destroy(t);
    st_trainer_destroy(NULL);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* A diverging run fails its step; the trainer then refuses to go on. */
Test(trainer, a_failed_step_stops_the_trainer, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = config(ST_STRATEGY_DP, 2, 100);
    c.model.kind = st_model_kind_named("mlp");
    c.optim.kind = ST_OPT_SGD;
    c.optim.lr = 100.0f;
    c.schedule = ST_SCHED_CONSTANT;
    st_trainer *t;
    cr_assert_eq(st_trainer_create(&c, &train, &test, &t), ST_OK, "%s", st_last_error());
    st_status s = st_trainer_step(t, 100, NULL);
    cr_assert_eq(s, ST_ERR_NUMERIC, "a rate of 100 diverges: %s", st_last_error());
    char first[256];
    snprintf(first, sizeof first, "%s", st_last_error());
    assert_refused(st_trainer_step(t, 1, NULL), "earlier failure", "a step after a failure");
    cr_assert(strstr(st_last_error(), first), "'%s' repeats '%s'", st_last_error(), first);
    double loss, acc;
    assert_refused(st_trainer_evaluate(t, &loss, &acc), "earlier failure", "evaluation");
    st_trainer_destroy(t);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* ------------------------------------------------------------ no heap calls */

/* Every thread's heap calls while armed: the trainer's steps run on the
 * OpenMP pool's threads, not only the caller's.  Calls made while oneDNN
 * executes a primitive are its own (heapwatch.h) and counted apart. */
static atomic_int armed;
static atomic_long own_calls, dnnl_calls, executes;

static void heapwatch_heap_call(int inside_onednn)
{
    if (atomic_load_explicit(&armed, memory_order_relaxed))
        atomic_fetch_add(inside_onednn ? &dnnl_calls : &own_calls, 1);
}

static void heapwatch_execute(void)
{
    if (atomic_load_explicit(&armed, memory_order_relaxed))
        atomic_fetch_add(&executes, 1);
}

#include "heapwatch.h"

static void assert_steps_make_no_heap_call(const st_train_config *c, const char *what)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_trainer *t;
    cr_assert_eq(st_trainer_create(c, &train, &test, &t), ST_OK, "%s", st_last_error());
    /* The first steps may let oneDNN and the OpenMP pool set up. */
    cr_assert_eq(st_trainer_step(t, 3, NULL), ST_OK, "%s", st_last_error());
    atomic_store(&own_calls, 0);
    atomic_store(&dnnl_calls, 0);
    atomic_store(&executes, 0);
    st_status s = ST_OK;
    atomic_store(&armed, 1);
    /* one call a step, and a longer call across an epoch end */
    for (int k = 0; k < 10 && s == ST_OK; k++)
        s = st_trainer_step(t, 1, NULL);
    if (s == ST_OK)
        s = st_trainer_step(t, 27, NULL);
    atomic_store(&armed, 0);
    cr_assert_eq(s, ST_OK, "%s", st_last_error());
    long own = atomic_load(&own_calls), onednn = atomic_load(&dnnl_calls);
    long execs = atomic_load(&executes);
    cr_log_info("%s: 37 trainer steps in 11 calls: subtrain %ld heap calls, oneDNN %ld in %ld "
                "executions", what, own, onednn, execs);
    cr_assert_gt(execs, 0, "the interposer saw the primitives run");
    cr_assert_eq(own, 0, "%s: 37 steps called the heap %ld times", what, own);
    st_trainer_destroy(t);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(trainer_heap, a_one_worker_step_makes_no_heap_call, .timeout = 120)
{
    HEAPWATCH_SKIP_IF_OFF();
    st_train_config c = config(ST_STRATEGY_DP, 1, 40);
    assert_steps_make_no_heap_call(&c, "dp, 1 worker");
}

Test(trainer_heap, a_two_worker_step_makes_no_heap_call, .timeout = 120)
{
    HEAPWATCH_SKIP_IF_OFF();
    st_train_config c = config(ST_STRATEGY_DP, 2, 40);
    assert_steps_make_no_heap_call(&c, "dp, 2 workers");
}

Test(trainer_heap, an_sdp_step_makes_no_heap_call, .timeout = 120)
{
    HEAPWATCH_SKIP_IF_OFF();
    st_train_config c = config(ST_STRATEGY_SDP, 2, 40);
    c.model.depth = 4;
    c.sdp.coverage = 0.5;
    assert_steps_make_no_heap_call(&c, "sdp block forward C=0.5, 2 workers");
}

/* --accumulate: the micro-batches' sum lives in the arena, made with the
 * model; the steps add into it and call nothing else (a bf16 optimizer
 * state neither). */
Test(trainer_heap, an_accumulating_step_makes_no_heap_call, .timeout = 120)
{
    HEAPWATCH_SKIP_IF_OFF();
    st_train_config c = config(ST_STRATEGY_DP, 1, 40);
    c.batch = 8;
    c.accumulate = 3;
    c.optim.moments = ST_MOMENTS_BF16_SR;
    assert_steps_make_no_heap_call(&c, "dp, 1 worker, 3 micro-batches, bf16-sr moments");
    c = config(ST_STRATEGY_DP, 2, 40);
    c.batch = 8;
    c.accumulate = 2;
    assert_steps_make_no_heap_call(&c, "dp, 2 workers, 2 micro-batches");
}

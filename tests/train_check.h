/*
 * tests/train_check.h — what the training suites share (tests/test_train*.c):
 * the small synthetic task, the configurations of each strategy on it, a
 * bitwise comparison of two runs, the full model's trained parameters,
 * the text of the gpt runs, and the layout facts the byte counts need.
 * Header-only, every function static inline; include it after
 * <criterion/criterion.h>.
 */
#ifndef SUBTRAIN_TESTS_TRAIN_CHECK_H
#define SUBTRAIN_TESTS_TRAIN_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include <subtrain/subtrain.h>
#include "recorder.h"

/* A small synthetic task so that each test runs in seconds. */
static inline void make_data(uint64_t seed, st_dataset *train, st_dataset *test)
{
    st_synthetic_config sc = st_synthetic_defaults(seed);
    sc.train_count = 8192;
    sc.test_count = 1024;
    sc.dim = 32;
    sc.n_classes = 4;
    cr_assert_eq(st_synthetic_make(&sc, train, test), ST_OK, "%s", st_last_error());
    st_dataset_normalize(train, test, NULL, NULL);
}

static inline st_train_config small_config(st_model_kind kind)
{
    st_train_config c = st_train_config_default();
    c.model.kind = kind;
    c.model.depth = 2;
    c.model.width = 64;
    c.model.in_dim = 32;
    c.model.n_classes = 4;
    c.batch = 32;
    c.epochs = 2;
    return c;
}

/* The stated bar: the synthetic task's teacher is a 32-unit tanh network.
 * After 8 epochs each student must classify the test set with >= 0.85
 * accuracy.  Chance is 0.25; measured with this seed: mlp 0.879, resmlp
 * 0.873, and a width-1 mlp (a bottleneck that cannot represent the teacher)
 * 0.43, so a trainer with a wrong gradient or update does not pass. */
#define SYNTH_MIN_ACCURACY 0.85

static inline st_train_config dp_config(int workers, int batch, uint64_t steps)
{
    st_train_config c = small_config(st_model_kind_named("resmlp"));
    c.workers = workers;
    c.batch = batch;
    c.steps = steps;
    c.epochs = 0;
    c.oversubscribe = 1; /* this machine may have fewer cores than workers */
    return c;
}

static inline st_train_config sdp_config(int workers, double coverage, uint64_t steps)
{
    st_train_config c = dp_config(workers, 16, steps);
    c.strategy = ST_STRATEGY_SDP;
    c.sdp.subnet = ST_SUBNET_BLOCK;
    c.sdp.masking = ST_MASKING_FORWARD;
    c.sdp.coverage = coverage;
    c.model.depth = 4;
    return c;
}

static inline st_train_config ist_config(int workers, uint64_t local_steps, uint64_t steps)
{
    st_train_config c = dp_config(workers, 32, steps);
    c.strategy = ST_STRATEGY_IST;
    c.ist.local_steps = local_steps;
    c.model.depth = 4;
    return c;
}

static inline st_train_config neuron_sdp_config(st_model_kind kind, int workers, double coverage,
                                                uint64_t steps)
{
    st_train_config c = sdp_config(workers, coverage, steps);
    c.sdp.subnet = ST_SUBNET_NEURON;
    c.neuron_group = 4;
    c.model.kind = kind;
    c.model.depth = 2;
    return c;
}

/* Trains both configurations on the same data and asserts that every
 * step's loss is bitwise the same; returns both final records. */
static inline void assert_bitwise_same_run(const st_train_config *a, const st_train_config *b,
                                           st_epoch_record *fa, st_epoch_record *fb)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    recorder *ra = calloc(1, sizeof *ra), *rb = calloc(1, sizeof *rb);
    *fa = train_recorded(a, &train, &test, ra);
    *fb = train_recorded(b, &train, &test, rb);
    cr_assert_eq(ra->steps, rb->steps);
    cr_assert_eq(memcmp(ra->losses, rb->losses, ra->steps * sizeof(float)), 0,
                 "every step's loss is bitwise the same");
    cr_assert_eq(fa->test_acc, fb->test_acc);
    free(ra);
    free(rb);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* The OS index of the PU a one-worker plan takes on this machine: a
 * cpuset of it alone puts every worker there (oversubscribed), in one
 * NUMA domain whatever the machine, so the reduction has one level and
 * its byte counts follow the formulas of the tests that count them. */
static inline void one_pu_cpuset(char *buf, size_t size)
{
    st_topology *t;
    cr_assert_eq(st_topology_load(NULL, &t), ST_OK, "%s", st_last_error());
    st_plan_request req = { .workers = 1 };
    st_plan p;
    cr_assert_eq(st_plan_make(t, &req, &p), ST_OK, "%s", st_last_error());
    snprintf(buf, size, "%d", p.workers[0].pu_os);
    st_plan_free(&p);
    st_topology_destroy(t);
}

/* Shard w of P elements over N owners (doc/reduction.md): ceil(P / 16)
 * lines of 16 floats dealt out evenly, the first (lines mod N) shards one
 * line more, the last line possibly partial. */
static inline st_range shard_of(size_t P, int N, int w)
{
    size_t lines = (P + 15) / 16, q = lines / (size_t)N, rem = lines % (size_t)N;
    size_t first = (size_t)w * q + ((size_t)w < rem ? (size_t)w : rem);
    size_t last = first + q + ((size_t)w < rem);
    st_range r = { 16 * first < P ? 16 * first : P, 16 * last < P ? 16 * last : P };
    return r;
}

/* The trained full model, as on_params hands it over. */
typedef struct params_out {
    float *p;
    size_t n;
} params_out;

static inline void keep_params(const float *params, size_t count, void *user)
{
    params_out *o = user;
    o->p = malloc(count * sizeof *o->p);
    cr_assert_not_null(o->p);
    memcpy(o->p, params, count * sizeof *o->p);
    o->n = count;
}

/* Word-like text (a skewed, repetitive byte stream: learnable in a few
 * hundred steps) as a text set of windows of `context` bytes. */
static inline st_text gpt_text(size_t n)
{
    static const char *w[] = { "the ", "of ", "and ", "a ", "to ", "in ", "is ", "word ",
                               "dictionary ", "noun. ", "verb; ", "\n" };
    uint8_t *p = malloc(n);
    cr_assert_not_null(p);
    uint32_t s = 12345;
    for (size_t i = 0; i < n;) {
        s = s * 1664525u + 1013904223u;
        const char *x = w[(s >> 24) % 12];
        for (size_t k = 0; x[k] && i < n; k++)
            p[i++] = (uint8_t)x[k];
    }
    return (st_text){ p, n, n - n / 10 };
}

static inline st_train_config gpt_train_config(int workers, uint64_t steps)
{
    st_train_config c = st_train_config_default();
    c.model = (st_model_config){ .kind = st_model_kind_named("gpt"), .depth = 2, .width = 32,
                                 .heads = 2, .context = 16, .in_dim = 16, .n_classes = 256,
                                 .activation = ST_ACT_GELU };
    c.workers = workers;
    c.batch = 8;
    c.steps = steps;
    c.epochs = 0;
    c.optim.lr = 0.003f;
    c.neuron_group = 16;   /* one head */
    return c;
}

#endif /* SUBTRAIN_TESTS_TRAIN_CHECK_H */

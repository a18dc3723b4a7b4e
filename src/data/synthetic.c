/*
 * data/synthetic.c — a seeded, learnable stand-in for Fashion-MNIST.
 *
 * x ~ N(0, I) and the label is what a random "teacher" network says:
 *
 *   label = argmax_c ( T2 tanh(T1 x) + b )_c
 *
 * T1 is (32, dim) Gaussian scaled by 1/sqrt(dim), so every hidden unit sees
 * a unit-variance input and tanh neither saturates nor stays linear; T2 is
 * (n_classes, 32) Gaussian.  A student with a hidden layer can learn the
 * task well, a linear one only partly: enough to tell a working trainer
 * from a broken one.
 *
 * b balances the classes.  A plain argmax favours the classes whose T2 rows
 * happen to be long, and some classes would be rare; b is fitted on a
 * calibration sample so that each class gets about 1/n_classes of it.
 *
 * Randomness: every piece has its own stream under the seed (teacher, the
 * calibration set, train and test), and every sample its own stream under
 * its set's, keyed by its index.  So a sample does not depend on the order of
 * generation or on how many samples are drawn, train and test never share a
 * sample, and the teacher depends only on (seed, dim, n_classes).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/data.h>
#include <subtrain/rng.h>

#include "core/error.h"

#define SYNTH_STREAM 0x5E7A7ull   /* namespace under the seed's root */
#define HIDDEN 32
#define CALIB_PER_CLASS 64
#define CALIB_MIN 4096
#define BALANCE_ROUNDS 100
#define BALANCE_TOLERANCE 0.05    /* each class within 5% of its share */

enum { STREAM_T1, STREAM_T2, STREAM_CALIB, STREAM_TRAIN, STREAM_TEST };

typedef struct teacher {
    uint32_t dim, n_classes;
    float *t1;       /* (dim, HIDDEN): T1 transposed, scaled by 1/sqrt(dim) */
    float *t2;       /* (n_classes, HIDDEN) */
    double *bias;    /* (n_classes) balancing offsets */
} teacher;

st_synthetic_config st_synthetic_defaults(uint64_t seed)
{
    st_synthetic_config cfg = {
        .seed = seed, .train_count = 16384, .test_count = 4096,
        .dim = 784, .n_classes = 10,
    };
    return cfg;
}

static void teacher_free(teacher *t)
{
    free(t->t1);
    free(t->t2);
    free(t->bias);
    memset(t, 0, sizeof *t);
}

/* Sample `index` of the set whose stream is `set`: dim N(0, 1) features. */
static void draw_x(const st_rng *set, uint64_t index, uint32_t dim, float *x)
{
    st_rng rng = st_rng_split(set, index);
    for (uint32_t j = 0; j < dim; j++)
        x[j] = st_rng_normal(&rng);
}

/* h = tanh(T1 x).  T1 is stored transposed so that the inner loop runs
 * over the 32 hidden units, which the compiler vectorises without
 * reordering any sum: each h[k] still adds its terms in order of j. */
static void hidden(const teacher *t, const float *x, double *h)
{
    double acc[HIDDEN] = { 0 };
    for (uint32_t j = 0; j < t->dim; j++) {
        const float *col = t->t1 + (size_t)j * HIDDEN;
        double xj = x[j];
        for (int k = 0; k < HIDDEN; k++)
            acc[k] += col[k] * xj;
    }
    for (int k = 0; k < HIDDEN; k++)
        h[k] = tanh(acc[k]);
}

// scores is (n_classes), without the bias
static void raw_scores(const teacher *t, const double *h, double *scores)
{
    for (uint32_t c = 0; c < t->n_classes; c++) {
        const float *row = t->t2 + (size_t)c * HIDDEN;
        double acc = 0.0;
        for (int k = 0; k < HIDDEN; k++)
            acc += row[k] * h[k];
        scores[c] = acc;
    }
}

/* First maximum, so ties break the same way everywhere. */
static uint32_t argmax_biased(const double *scores, const double *bias, uint32_t n)
{
    uint32_t best = 0;
    double best_v = scores[0] + bias[0];
    for (uint32_t c = 1; c < n; c++) {
        double v = scores[c] + bias[c];
        if (v > best_v) {
            best_v = v;
            best = c;
        }
    }
    return best;
}

/* Fits t->bias so that the calibration set's classes are balanced: each
 * round moves a class's offset by the log of how far its share is from
 * 1/n_classes (damped), which converges in a few dozen rounds.  Everything
 * is in double and in a fixed order, so the offsets are deterministic.
 * scores is (n, n_classes); counts is (n_classes) scratch. */
static void fit_bias(teacher *t, const double *scores, uint32_t n, uint32_t *counts)
{
    uint32_t k = t->n_classes;
    double target = (double)n / k;
    for (int round = 0; round < BALANCE_ROUNDS; round++) {
        memset(counts, 0, k * sizeof *counts);
        for (uint32_t i = 0; i < n; i++)
            counts[argmax_biased(scores + (size_t)i * k, t->bias, k)]++;
        double worst = 0.0;
        for (uint32_t c = 0; c < k; c++) {
            double dev = fabs(counts[c] - target) / target;
            worst = dev > worst ? dev : worst;
        }
        if (worst <= BALANCE_TOLERANCE)
            break;
        for (uint32_t c = 0; c < k; c++)   // +0.5: an empty class still moves
            t->bias[c] -= 0.5 * log((counts[c] + 0.5) / target);
    }
}

static st_status balance(teacher *t, const st_rng *synth)
{
    uint32_t k = t->n_classes;
    uint32_t n = k * CALIB_PER_CLASS > CALIB_MIN ? k * CALIB_PER_CLASS : CALIB_MIN;
    st_rng calib = st_rng_split(synth, STREAM_CALIB);
    float *x = malloc((size_t)t->dim * sizeof *x);
    double *scores = malloc((size_t)n * k * sizeof *scores);   // (n, k)
    uint32_t *counts = malloc(k * sizeof *counts);
    if (!x || !scores || !counts) {
        free(x);
        free(scores);
        free(counts);
        return st_fail(ST_ERR_NOMEM, "synthetic data: out of memory calibrating "
                       "the class balance");
    }
    double h[HIDDEN];
    for (uint32_t i = 0; i < n; i++) {
        draw_x(&calib, i, t->dim, x);
        hidden(t, x, h);
        raw_scores(t, h, scores + (size_t)i * k);
    }
    fit_bias(t, scores, n, counts);
    free(x);
    free(scores);
    free(counts);
    return ST_OK;
}

static st_status teacher_init(teacher *t, const st_rng *synth, uint32_t dim,
                              uint32_t n_classes)
{
    memset(t, 0, sizeof *t);
    t->dim = dim;
    t->n_classes = n_classes;
    t->t1 = malloc((size_t)HIDDEN * dim * sizeof *t->t1);
    t->t2 = malloc((size_t)n_classes * HIDDEN * sizeof *t->t2);
    t->bias = calloc(n_classes, sizeof *t->bias);
    if (!t->t1 || !t->t2 || !t->bias) {
        teacher_free(t);
        return st_fail(ST_ERR_NOMEM, "synthetic data: out of memory for the teacher");
    }

    /* Drawn row by row of T1 (hidden unit k, then feature j) and stored
     * transposed. */
    st_rng r1 = st_rng_split(synth, STREAM_T1);
    float scale = (float)(1.0 / sqrt((double)dim));
    for (int k = 0; k < HIDDEN; k++)
        for (uint32_t j = 0; j < dim; j++)
            t->t1[(size_t)j * HIDDEN + k] = st_rng_normal(&r1) * scale;
    st_rng r2 = st_rng_split(synth, STREAM_T2);
    for (size_t i = 0; i < (size_t)n_classes * HIDDEN; i++)
        t->t2[i] = st_rng_normal(&r2);

    st_status s = balance(t, synth);
    if (s != ST_OK)
        teacher_free(t);
    return s;
}

/* A set's count and shape, no samples. */
static void shape(uint32_t count, uint32_t dim, uint32_t n_classes, st_dataset *out)
{
    out->count = count;
    out->dim = dim;
    out->n_classes = n_classes;
    out->channels = dim;   // no image shape: dim x 1 x 1
    out->height = 1;
    out->width = 1;
}

/* count samples from stream `which` of synth, labelled by the teacher. */
static st_status make_set(const teacher *t, const st_rng *synth, uint64_t which,
                          uint32_t count, st_dataset *out)
{
    st_rng set = st_rng_split(synth, which);
    uint32_t k = t->n_classes;
    // x is (count, dim)
    float *x = malloc((size_t)count * t->dim * sizeof *x);
    uint8_t *y = malloc(count);
    double *scores = malloc(k * sizeof *scores);
    if (!x || !y || !scores) {
        free(x);
        free(y);
        free(scores);
        return st_fail(ST_ERR_NOMEM, "synthetic data: out of memory for %lu samples "
                       "of %lu features", (unsigned long)count, (unsigned long)t->dim);
    }
    double h[HIDDEN];
    for (uint32_t i = 0; i < count; i++) {
        float *row = x + (size_t)i * t->dim;
        draw_x(&set, i, t->dim, row);
        hidden(t, row, h);
        raw_scores(t, h, scores);
        y[i] = (uint8_t)argmax_biased(scores, t->bias, k);
    }
    free(scores);
    shape(count, t->dim, k, out);
    out->x = x;
    out->y = y;
    return ST_OK;
}

static st_status check_config(const st_synthetic_config *cfg)
{
    if (cfg->train_count == 0 || cfg->test_count == 0)
        return st_fail(ST_ERR_INVALID, "synthetic data: train and test counts must be "
                       "> 0, got %lu and %lu", (unsigned long)cfg->train_count,
                       (unsigned long)cfg->test_count);
    if (cfg->dim == 0)
        return st_fail(ST_ERR_INVALID, "synthetic data: dim must be > 0");
    if (cfg->n_classes < 2 || cfg->n_classes > 255)
        return st_fail(ST_ERR_INVALID, "synthetic data: n_classes must be in 2..255, "
                       "got %lu", (unsigned long)cfg->n_classes);
    uint32_t larger = cfg->train_count > cfg->test_count ? cfg->train_count
                                                         : cfg->test_count;
    if ((uint64_t)larger * cfg->dim > SIZE_MAX / sizeof(float))
        return st_fail(ST_ERR_INVALID, "synthetic data: %lu x %lu features do not fit "
                       "in memory", (unsigned long)larger, (unsigned long)cfg->dim);
    return ST_OK;
}

st_status st_synthetic_make(const st_synthetic_config *cfg,
                            st_dataset *train, st_dataset *test)
{
    if (!cfg || !train || !test)
        return st_fail(ST_ERR_INVALID, "st_synthetic_make: missing argument");
    memset(train, 0, sizeof *train);
    memset(test, 0, sizeof *test);
    ST_TRY(check_config(cfg));

    st_rng root = st_rng_seed(cfg->seed);
    st_rng synth = st_rng_split(&root, SYNTH_STREAM);
    teacher t;
    ST_TRY(teacher_init(&t, &synth, cfg->dim, cfg->n_classes));
    st_status s = make_set(&t, &synth, STREAM_TRAIN, cfg->train_count, train);
    if (s == ST_OK)
        s = make_set(&t, &synth, STREAM_TEST, cfg->test_count, test);
    if (s != ST_OK)
        st_dataset_free(train);
    teacher_free(&t);
    return s;
}

st_status st_synthetic_shapes(const st_synthetic_config *cfg, st_dataset *train,
                              st_dataset *test)
{
    if (!cfg || !train || !test)
        return st_fail(ST_ERR_INVALID, "st_synthetic_shapes: missing argument");
    memset(train, 0, sizeof *train);
    memset(test, 0, sizeof *test);
    ST_TRY(check_config(cfg));
    shape(cfg->train_count, cfg->dim, cfg->n_classes, train);
    shape(cfg->test_count, cfg->dim, cfg->n_classes, test);
    return ST_OK;
}

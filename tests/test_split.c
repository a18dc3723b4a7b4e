/*
 * tests/test_split.c — non-iid splits (data.h, doc/noniid.md): the
 * spec's syntax, how classes:K and dirichlet:ALPHA deal a synthetic
 * training set (the class histogram per worker), the epoch orders that
 * read each worker's batches from its split, and training: every
 * stepwise strategy's workers compute on their own split's samples, a
 * split run is reproducible, and what cannot be split is refused.
 */
#define _GNU_SOURCE   /* heapwatch.h: RTLD_NEXT */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <oneapi/dnnl/dnnl.h>

#include <subtrain/subtrain.h>

#include "recorder.h"

TestSuite(split);
TestSuite(split_order);
TestSuite(split_train);

/* A synthetic set of n samples in C classes (the teacher's labels: the
 * classes are not of equal size). */
static void make_data(uint32_t n, uint32_t C, st_dataset *train, st_dataset *test)
{
    st_synthetic_config sc = st_synthetic_defaults(3);
    sc.train_count = n;
    sc.test_count = 256;
    sc.dim = 16;
    sc.n_classes = C;
    cr_assert_eq(st_synthetic_make(&sc, train, test), ST_OK, "%s", st_last_error());
    st_dataset_normalize(train, test, NULL, NULL);
}

static st_split_config spec(const char *text)
{
    st_split_config c;
    cr_assert_eq(st_split_parse(text, &c), ST_OK, "%s: %s", text, st_last_error());
    return c;
}

/* Every sample in exactly one worker's split, and the histogram counts
 * what the splits hold. */
static void assert_partition(const st_split *s, const st_dataset *d)
{
    const int W = st_split_workers(s);
    const uint32_t C = st_split_classes(s);
    const uint32_t *h = st_split_histogram(s);
    unsigned char *seen = calloc(d->count, 1);
    uint32_t *count = calloc(C, sizeof *count);
    uint64_t total = 0, largest = 0;
    for (int g = 0; g < W; g++) {
        uint32_t n;
        const uint32_t *own = st_split_samples(s, g, &n);
        memset(count, 0, C * sizeof *count);
        for (uint32_t k = 0; k < n; k++) {
            cr_assert_lt(own[k], d->count);
            cr_assert_eq(seen[own[k]], 0, "sample %u dealt twice", own[k]);
            seen[own[k]] = 1;
            count[d->y[own[k]]]++;
        }
        for (uint32_t c = 0; c < C; c++)
            cr_assert_eq(count[c], h[(size_t)g * C + c], "worker %d class %u: %u held, "
                         "histogram %u", g, c, count[c], h[(size_t)g * C + c]);
        total += n;
        largest = n > largest ? n : largest;
    }
    cr_assert_eq(total, d->count, "every sample dealt");
    cr_assert_eq(st_split_largest(s), largest);
    free(seen);
    free(count);
}

/* The histogram, one worker a line, for the log. */
static void log_histogram(const char *what, const st_split *s)
{
    char line[1024];
    for (int g = 0; g < st_split_workers(s); g++) {
        size_t len = (size_t)snprintf(line, sizeof line, "%s worker %d:", what, g);
        for (uint32_t c = 0; c < st_split_classes(s) && len < sizeof line; c++)
            len += (size_t)snprintf(line + len, sizeof line - len, " %u",
                                    st_split_histogram(s)[(size_t)g * st_split_classes(s) + c]);
        cr_log_info("%s", line);
    }
}

/* ------------------------------------------------------------ the spec */

Test(split, specs_parse_and_read_back)
{
    const char *good[] = { "iid", "classes:1", "classes:2", "classes:256", "dirichlet:0.1",
                           "dirichlet:1e-2", "dirichlet:100", "dirichlet:0.30000000000000004" };
    const char *canonical[] = { "iid", "classes:1", "classes:2", "classes:256",
                                "dirichlet:0.1", "dirichlet:0.01", "dirichlet:100",
                                "dirichlet:0.30000000000000004" };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        st_split_config c = spec(good[i]), back;
        char name[64];
        st_split_name(&c, name, sizeof name);
        cr_assert_str_eq(name, canonical[i]);
        cr_assert_eq(st_split_parse(name, &back), ST_OK);
        cr_assert_eq(memcmp(&c, &back, sizeof c), 0, "%s reads back as itself", name);
        cr_assert_eq(st_split_config_check(&c), ST_OK);
    }
    cr_assert_eq(spec("classes:3").classes, 3);
    cr_assert_eq(spec("dirichlet:0.5").alpha, 0.5);
    cr_assert_eq(spec("iid").kind, ST_SPLIT_IID);
    st_train_config t = st_train_config_default();
    cr_assert_eq(t.split.kind, ST_SPLIT_IID, "the default is iid");
}

Test(split, bad_specs_are_refused_with_a_line_naming_them)
{
    const char *bad[] = { "classes:0", "classes:x", "classes:", "classes:257", "classes:-1",
                          "dirichlet:-1", "dirichlet:0", "dirichlet:nan", "dirichlet:inf",
                          "dirichlet:", "dirichlet:0x1p-3", "dirichlet:1e999", "foo", "",
                          "IID", "classes:2 ", " iid" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        st_split_config c = { ST_SPLIT_DIRICHLET, 7, 3.0 }, before = c;
        cr_assert_eq(st_split_parse(bad[i], &c), ST_ERR_INVALID, "'%s' accepted", bad[i]);
        cr_assert_eq(memcmp(&c, &before, sizeof c), 0, "'%s': the output is left alone",
                     bad[i]);
        char want[64];
        snprintf(want, sizeof want, "--split %s:", bad[i]);
        cr_assert(strncmp(st_last_error(), want, strlen(want)) == 0 &&
                  !strchr(st_last_error(), '\n'), "'%s': %s", bad[i], st_last_error());
    }
    st_split_config c = { ST_SPLIT_CLASSES, 0, 0.0 };
    cr_assert_eq(st_split_config_check(&c), ST_ERR_INVALID);
    c = (st_split_config){ ST_SPLIT_DIRICHLET, 0, NAN };
    cr_assert_eq(st_split_config_check(&c), ST_ERR_INVALID);
    st_train_config t = st_train_config_default();
    t.split = c;
    cr_assert_eq(st_train_config_check(&t), ST_ERR_INVALID, "the training config checks it");
}

/* ------------------------------------------------------------ classes:K */

Test(split, classes_two_gives_each_worker_exactly_its_two_classes)
{
    st_dataset train, test;
    make_data(3000, 10, &train, &test);
    st_split *s;
    st_split_config c = spec("classes:2");
    cr_assert_eq(st_split_make(&c, &train, 5, 1, 32, &s), ST_OK, "%s", st_last_error());
    log_histogram("classes:2", s);
    assert_partition(s, &train);
    const uint32_t *h = st_split_histogram(s);
    for (int g = 0; g < 5; g++)
        for (uint32_t k = 0; k < 10; k++) {
            const int mine = k == 2u * (uint32_t)g || k == 2u * (uint32_t)g + 1;
            /* one holder per class: all of it */
            uint32_t in_class = 0;
            for (uint32_t i = 0; i < train.count; i++)
                in_class += train.y[i] == k;
            cr_assert_eq(h[g * 10 + k], mine ? in_class : 0, "worker %d class %u: %u", g, k,
                         h[g * 10 + k]);
        }
    st_split_destroy(s);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* Fashion-MNIST's 60000 training images are 6000 of each class: over 5
 * workers, classes:2 gives worker g classes 2g and 2g + 1, 6000 each. */
Test(split, fashion_mnist_classes_two_over_five_workers, .timeout = 60)
{
    const char *dir = getenv("SUBTRAIN_DATA") ? getenv("SUBTRAIN_DATA") : ST_FASHION_MNIST_DIR;
    st_dataset train, test;
    if (st_fashion_mnist_load(dir, &train, &test) != ST_OK)
        cr_skip_test("no Fashion-MNIST: %s", st_last_error());
    st_split *s;
    st_split_config c = spec("classes:2");
    cr_assert_eq(st_split_make(&c, &train, 5, 1, 128, &s), ST_OK, "%s", st_last_error());
    log_histogram("Fashion-MNIST classes:2", s);
    assert_partition(s, &train);
    for (int g = 0; g < 5; g++)
        for (uint32_t k = 0; k < 10; k++)
            cr_assert_eq(st_split_histogram(s)[g * 10 + k], k / 2 == (uint32_t)g ? 6000 : 0,
                         "worker %d class %u", g, k);
    st_split_destroy(s);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(split, classes_wrap_and_shared_classes_are_dealt_evenly)
{
    st_dataset train, test;
    make_data(3000, 10, &train, &test);
    st_split *s;
    st_split_config c = spec("classes:3");
    /* 4 workers x 3 = 12 holdings of 10 classes: worker 3 holds 9, 0, 1 */
    cr_assert_eq(st_split_make(&c, &train, 4, 1, 32, &s), ST_OK, "%s", st_last_error());
    log_histogram("classes:3", s);
    assert_partition(s, &train);
    const uint32_t *h = st_split_histogram(s);
    static const int holds[4][10] = { { 1, 1, 1, 0, 0, 0, 0, 0, 0, 0 },
                                      { 0, 0, 0, 1, 1, 1, 0, 0, 0, 0 },
                                      { 0, 0, 0, 0, 0, 0, 1, 1, 1, 0 },
                                      { 1, 1, 0, 0, 0, 0, 0, 0, 0, 1 } };
    for (int g = 0; g < 4; g++)
        for (int k = 0; k < 10; k++)
            cr_assert_eq(h[g * 10 + k] > 0, holds[g][k], "worker %d class %d: %u", g, k,
                         h[g * 10 + k]);
    for (int k = 0; k < 2; k++) {   /* classes 0 and 1: workers 0 and 3, half each */
        const int d = (int)h[0 * 10 + k] - (int)h[3 * 10 + k];
        cr_assert(d == 0 || d == -1, "class %d: %u and %u", k, h[k], h[30 + k]);
    }
    st_split_destroy(s);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(split, classes_nobody_holds_and_short_workers_are_refused)
{
    st_dataset train, test;
    make_data(3000, 10, &train, &test);
    st_split *s = (st_split *)&s;
    st_split_config c = spec("classes:2");
    cr_assert_eq(st_split_make(&c, &train, 4, 1, 32, &s), ST_ERR_INVALID);
    cr_assert_null(s);
    cr_assert_str_eq(st_last_error(), "--split classes:2 with 4 workers holds 8 of the data's 10 "
                     "classes: workers x K must be at least 10, or classes go untrained");
    c = spec("classes:11");
    cr_assert_eq(st_split_make(&c, &train, 4, 1, 32, &s), ST_ERR_INVALID);
    cr_assert_str_eq(st_last_error(), "--split classes:11: the data has 10 classes, fewer than "
                     "K = 11");
    /* 10 holders of each class: about 300 samples a worker, under a batch of 512 */
    c = spec("classes:10");
    cr_assert_eq(st_split_make(&c, &train, 10, 1, 512, &s), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "fewer than a batch (512)"), "%s", st_last_error());
    cr_assert_eq(st_split_make(&c, &train, 10, 1, 256, &s), ST_OK, "%s", st_last_error());
    st_split_destroy(s);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(split, text_data_has_no_classes_to_split)
{
    st_text t;
    char path[] = "/tmp/split-text-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    char bytes[4096];
    for (size_t i = 0; i < sizeof bytes; i++)
        bytes[i] = (char)('a' + i % 26);
    cr_assert_eq(write(fd, bytes, sizeof bytes), (ssize_t)sizeof bytes);
    close(fd);
    cr_assert_eq(st_text_load(path, 0.1, &t), ST_OK, "%s", st_last_error());
    unlink(path);
    st_dataset train, test;
    cr_assert_eq(st_text_dataset(&t, 16, 1, 0, 0, &train, &test), ST_OK, "%s", st_last_error());
    st_split *s;
    st_split_config c = spec("dirichlet:0.5");
    cr_assert_eq(st_split_make(&c, &train, 2, 1, 4, &s), ST_ERR_INVALID);
    cr_assert_str_eq(st_last_error(), "--split dirichlet:0.5: text data has no classes to split "
                     "by (it takes --split iid only)");
    c = spec("iid");
    cr_assert_eq(st_split_make(&c, &train, 2, 1, 4, &s), ST_OK);
    cr_assert_null(s, "iid: no split");
    st_text_free(&t);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* ------------------------------------------------------------ dirichlet:ALPHA */

static st_split *dirichlet(const st_dataset *d, const char *text, int W, uint64_t seed)
{
    st_split *s;
    st_split_config c = spec(text);
    cr_assert_eq(st_split_make(&c, d, W, seed, 16, &s), ST_OK, "%s", st_last_error());
    assert_partition(s, d);
    return s;
}

Test(split, dirichlet_histograms_follow_the_seed)
{
    st_dataset train, test;
    make_data(3000, 10, &train, &test);
    st_split *a = dirichlet(&train, "dirichlet:0.5", 4, 1),
             *b = dirichlet(&train, "dirichlet:0.5", 4, 1),
             *d = dirichlet(&train, "dirichlet:0.5", 4, 2);
    log_histogram("dirichlet:0.5 seed 1", a);
    log_histogram("dirichlet:0.5 seed 2", d);
    const size_t bytes = 4 * 10 * sizeof(uint32_t);
    cr_assert_eq(memcmp(st_split_histogram(a), st_split_histogram(b), bytes), 0,
                 "the same seed, the same histogram");
    for (int g = 0; g < 4; g++) {
        uint32_t na, nb;
        const uint32_t *sa = st_split_samples(a, g, &na), *sb = st_split_samples(b, g, &nb);
        cr_assert(na == nb && memcmp(sa, sb, na * sizeof *sa) == 0, "and the same samples");
    }
    cr_assert_neq(memcmp(st_split_histogram(a), st_split_histogram(d), bytes), 0,
                  "another seed, another histogram");
    st_split_destroy(a);
    st_split_destroy(b);
    st_split_destroy(d);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* The largest share of each class a worker holds, averaged over classes:
 * 1 / W for an even deal, 1 for one holder per class. */
static double mean_top_share(const st_split *s)
{
    const int W = st_split_workers(s);
    const uint32_t C = st_split_classes(s);
    const uint32_t *h = st_split_histogram(s);
    double sum = 0.0;
    for (uint32_t c = 0; c < C; c++) {
        uint32_t top = 0, all = 0;
        for (int g = 0; g < W; g++) {
            top = h[g * C + c] > top ? h[g * C + c] : top;
            all += h[g * C + c];
        }
        sum += all ? (double)top / all : 0.0;
    }
    return sum / C;
}

Test(split, small_alpha_skews_and_large_alpha_does_not)
{
    st_dataset train, test;
    make_data(6000, 10, &train, &test);
    st_split *skew = dirichlet(&train, "dirichlet:0.05", 4, 1),
             *even = dirichlet(&train, "dirichlet:1000", 4, 1);
    log_histogram("dirichlet:0.05", skew);
    log_histogram("dirichlet:1000", even);
    const double ts = mean_top_share(skew), te = mean_top_share(even);
    cr_log_info("mean largest share of a class: %.3f at 0.05, %.3f at 1000", ts, te);
    /* Dir(0.05) over 4: the largest share is above 0.9 most of the time;
     * Dir(1000): each share within a few percent of 1/4 */
    cr_assert_gt(ts, 0.8, "dirichlet:0.05 mean top share %.3f", ts);
    cr_assert_lt(te, 0.30, "dirichlet:1000 mean top share %.3f", te);
    st_split_destroy(skew);
    st_split_destroy(even);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(split, every_worker_gets_a_batch_or_the_split_is_refused)
{
    st_dataset train, test;
    make_data(3000, 10, &train, &test);
    /* at 0.05 over 6 workers a draw often leaves one nearly empty: the
     * draws go on until none holds under a batch */
    for (uint64_t seed = 1; seed <= 4; seed++) {
        st_split *s = dirichlet(&train, "dirichlet:0.05", 6, seed);
        for (int g = 0; g < 6; g++) {
            uint32_t n;
            st_split_samples(s, g, &n);
            cr_assert_geq(n, 16, "seed %llu worker %d holds %u", (unsigned long long)seed, g, n);
        }
        st_split_destroy(s);
    }
    /* 10 classes each nearly whole to one of 40 workers: never */
    st_split *s;
    st_split_config c = spec("dirichlet:0.001");
    cr_assert_eq(st_split_make(&c, &train, 40, 1, 16, &s), ST_ERR_INVALID);
    cr_assert_str_eq(st_last_error(), "--split dirichlet:0.001 with 40 workers: in 100 draws "
                     "some worker always held fewer samples than a batch (16): raise ALPHA, or "
                     "use fewer workers or a smaller batch");
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(split, gamma_draws_have_the_gamma_mean)
{
    const double alphas[] = { 0.05, 0.3, 1.0, 2.5, 20.0 };
    for (size_t i = 0; i < sizeof alphas / sizeof *alphas; i++) {
        const double a = alphas[i];
        st_rng root = st_rng_seed(9), r = st_rng_split(&root, i);
        double sum = 0.0;
        const int n = 40000;
        for (int k = 0; k < n; k++) {
            const double l = st_rng_gamma_log(&r, a);
            cr_assert(isfinite(l), "alpha %g: log draw %g", a, l);
            sum += exp(l);
        }
        /* mean alpha, variance alpha: 5 standard errors */
        const double mean = sum / n, tol = 5.0 * sqrt(a / n);
        cr_assert(fabs(mean - a) < tol, "alpha %g: mean %g (tolerance %g)", a, mean, tol);
    }
}

/* ------------------------------------------------------------ epoch orders */

/* Counts heap calls on the armed thread (heapwatch.h interposes the C
 * library's malloc family for the whole test program). */
static _Thread_local int armed;
static _Thread_local long heap_calls;

static void heapwatch_heap_call(int inside_onednn)
{
    (void)inside_onednn;
    heap_calls += armed;
}

static void heapwatch_execute(void)
{
}

#include "heapwatch.h"

/* Worker g's sample at each position of order, checked: positions
 * (i W + g) B .. + B are g's; its first |split| positions are its split
 * once each (a pass), and so are the next. */
static void assert_order(const st_split *s, const uint32_t *order, uint32_t n, uint32_t B,
                         unsigned char *mine)
{
    const int W = st_split_workers(s);
    for (int g = 0; g < W; g++) {
        uint32_t len;
        const uint32_t *own = st_split_samples(s, g, &len);
        memset(mine, 0, n);
        for (uint32_t k = 0; k < len; k++)
            mine[own[k]] = 1;
        uint32_t seen = 0;
        for (uint64_t p = (uint64_t)g * B; p < n; p += (uint64_t)W * B)
            for (uint64_t b = 0; b < B && p + b < n; b++, seen++) {
                const uint32_t x = order[p + b];
                cr_assert(x < n && (mine[x] & 1), "position %llu (worker %d) holds %u, not its "
                          "own", (unsigned long long)(p + b), g, x);
                if (seen % len == 0)   /* a pass begins */
                    for (uint32_t k = 0; k < len; k++)
                        mine[own[k]] = 1;
                cr_assert_eq(mine[x], 1, "worker %d: sample %u twice in one pass", g, x);
                mine[x] = 3;
            }
    }
}

Test(split_order, batches_of_worker_g_come_from_its_split)
{
    st_dataset train, test;
    make_data(3000, 10, &train, &test);
    unsigned char *mine = malloc(train.count);
    uint32_t *a = malloc(train.count * sizeof *a), *b = malloc(train.count * sizeof *b);
    const char *specs[] = { "classes:2", "classes:4", "dirichlet:0.1", "dirichlet:5" };
    const int workers[] = { 5, 3, 4, 2 };
    const uint32_t batches[] = { 32, 50, 16, 64 };
    for (int i = 0; i < 4; i++) {
        st_split *s;
        st_split_config c = spec(specs[i]);
        cr_assert_eq(st_split_make(&c, &train, workers[i], 7, batches[i], &s), ST_OK, "%s",
                     st_last_error());
        uint32_t *scratch = malloc(st_split_largest(s) * sizeof *scratch);
        st_split_epoch_order(s, 7, 0, batches[i], scratch, a);
        assert_order(s, a, train.count, batches[i], mine);
        st_split_epoch_order(s, 7, 0, batches[i], scratch, b);
        cr_assert_eq(memcmp(a, b, train.count * sizeof *a), 0, "%s: the same epoch again",
                     specs[i]);
        st_split_epoch_order(s, 7, 1, batches[i], scratch, b);
        assert_order(s, b, train.count, batches[i], mine);
        cr_assert_neq(memcmp(a, b, train.count * sizeof *a), 0, "%s: another epoch", specs[i]);
        st_split_epoch_order(s, 8, 0, batches[i], scratch, b);
        cr_assert_neq(memcmp(a, b, train.count * sizeof *a), 0, "%s: another seed", specs[i]);
        free(scratch);
        st_split_destroy(s);
    }
    free(mine);
    free(a);
    free(b);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(split_order, an_epoch_order_makes_no_heap_call)
{
    HEAPWATCH_SKIP_IF_OFF();
    st_dataset train, test;
    make_data(3000, 10, &train, &test);
    st_split *s;
    st_split_config c = spec("dirichlet:0.3");
    cr_assert_eq(st_split_make(&c, &train, 4, 1, 32, &s), ST_OK, "%s", st_last_error());
    uint32_t *scratch = malloc(st_split_largest(s) * sizeof *scratch);
    uint32_t *order = malloc(train.count * sizeof *order);
    void *(*volatile alloc)(size_t) = malloc;
    armed = 1;
    void *probe = alloc(16);
    armed = 0;
    free(probe);
    cr_assert_eq(heap_calls, 1, "the interposer counts");
    heap_calls = 0;
    armed = 1;
    for (uint64_t epoch = 0; epoch < 3; epoch++)
        st_split_epoch_order(s, 1, epoch, 32, scratch, order);
    armed = 0;
    cr_assert_eq(heap_calls, 0, "3 epoch orders called the heap %ld times", heap_calls);
    free(scratch);
    free(order);
    st_split_destroy(s);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* ------------------------------------------------------------ training */

static st_train_config train_config(st_strategy strategy, int workers, const char *split)
{
    st_train_config c = st_train_config_default();
    c.strategy = strategy;
    c.model.kind = st_model_kind_named("resmlp");
    c.model.depth = 4;
    c.model.width = 32;
    c.model.in_dim = 16;
    c.model.n_classes = 4;
    c.batch = 16;
    c.workers = workers;
    c.oversubscribe = 1;
    c.epochs = 1;
    c.ist.local_steps = 5;
    c.localsgd.local_steps = 5;
    c.split = spec(split);
    return c;
}

/* Worker w's batch after each step of a trainer: every label one its
 * split holds (classes:1: worker g's are all class g).  rebuilt: the
 * strategy builds new models after every `rebuilt` steps and at epoch
 * ends (ist's rounds), whose labels are not the last batch's; 0: never. */
static void assert_batches_from_splits(st_strategy strategy, const char *text, int rebuilt)
{
    st_dataset train, test;
    make_data(2048, 4, &train, &test);
    st_train_config c = train_config(strategy, 4, text);
    st_split *s;
    cr_assert_eq(st_split_make(&c.split, &train, 4, c.seed, (uint32_t)c.batch, &s), ST_OK,
                 "%s", st_last_error());
    st_trainer *t;
    cr_assert_eq(st_trainer_create(&c, &train, &test, &t), ST_OK, "%s: %s",
                 st_strategy_name(strategy), st_last_error());
    uint64_t total;
    st_trainer_steps(t, &total);
    const uint64_t steps = total < 40 ? total : 40;   /* past an epoch end: 32 steps */
    for (uint64_t k = 0; k < steps; k++) {
        cr_assert_eq(st_trainer_step(t, 1, NULL), ST_OK, "%s", st_last_error());
        if (rebuilt && ((k + 1) % (uint64_t)rebuilt == 0 || (k + 1) % 32 == 0))
            continue;
        for (int w = 0; w < 4; w++) {
            const int32_t *y = st_model_labels(st_trainer_model(t, w));
            for (int b = 0; b < c.batch; b++)
                cr_assert_gt(st_split_histogram(s)[w * 4 + y[b]], 0, "%s %s step %llu: worker "
                             "%d computed on class %d, which its split lacks",
                             st_strategy_name(strategy), text, (unsigned long long)k + 1, w,
                             y[b]);
        }
    }
    st_trainer_destroy(t);
    st_split_destroy(s);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(split_train, dp_workers_compute_on_their_own_split, .timeout = 120)
{
    assert_batches_from_splits(ST_STRATEGY_DP, "classes:1", 0);
    assert_batches_from_splits(ST_STRATEGY_DP, "dirichlet:0.1", 0);
}

Test(split_train, sdp_workers_compute_on_their_own_split, .timeout = 120)
{
    assert_batches_from_splits(ST_STRATEGY_SDP, "classes:1", 0);
}

Test(split_train, ist_workers_compute_on_their_own_split, .timeout = 120)
{
    assert_batches_from_splits(ST_STRATEGY_IST, "classes:1", 5);
}

Test(split_train, localsgd_workers_compute_on_their_own_split, .timeout = 120)
{
    st_strategy localsgd;
    cr_assert_eq(st_strategy_parse("localsgd", &localsgd), ST_OK);
    assert_batches_from_splits(localsgd, "classes:1", 0);
}

Test(split_train, a_split_run_is_reproducible_and_not_the_iid_run, .timeout = 120)
{
    st_dataset train, test;
    make_data(2048, 4, &train, &test);
    recorder *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b), *d = calloc(1, sizeof *d);
    st_train_config c = train_config(ST_STRATEGY_DP, 2, "dirichlet:0.3"), iid = c;
    iid.split = spec("iid");
    train_recorded(&c, &train, &test, a);
    train_recorded(&c, &train, &test, b);
    train_recorded(&iid, &train, &test, d);
    cr_assert_eq(a->steps, d->steps, "an epoch is as many steps as iid's");
    cr_assert_eq(memcmp(a->losses, b->losses, a->steps * sizeof(float)), 0, "reproducible");
    cr_assert_neq(memcmp(a->losses, d->losses, a->steps * sizeof(float)), 0,
                  "the split changes the batches");
    free(a);
    free(b);
    free(d);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(split_train, synth_and_unsplittable_layouts_are_refused)
{
    st_dataset train, test;
    make_data(2048, 4, &train, &test);
    st_train_config c = train_config(ST_STRATEGY_SYNTH, 2, "classes:2");
    c.model.kind = st_model_kind_named("mlp");
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
    cr_assert_str_eq(st_last_error(), "--split classes:2 does not apply to --strategy synth (its "
                     "segment groups train different layers on every sample, not one model on "
                     "data of their own); use --split iid");
    /* 2 workers x 1 class of 4: refused when the run is prepared */
    c = train_config(ST_STRATEGY_DP, 2, "classes:1");
    st_epoch_record final;
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, &final), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "holds 2 of the data's 4 classes"), "%s", st_last_error());
    st_trainer *t;
    cr_assert_eq(st_trainer_create(&c, &train, &test, &t), ST_ERR_INVALID);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

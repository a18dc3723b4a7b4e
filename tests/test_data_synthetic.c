/*
 * tests/test_data_synthetic.c — synthetic data, normalisation, epoch
 * orders and batch gathering.  Nothing here reads a file.
 *
 * The check of a dataset left empty: tests/data_check.h.
 */
#include "data_check.h"

#include <math.h>

TestSuite(synthetic);
TestSuite(epoch);

/* ------------------------------------------------------------ synthetic */

static st_synthetic_config small_config(uint64_t seed)
{
    st_synthetic_config c = { .seed = seed, .train_count = 600, .test_count = 200,
                              .dim = 40, .n_classes = 5 };
    return c;
}

Test(synthetic, defaults)
{
    st_synthetic_config c = st_synthetic_defaults(42);
    cr_assert_eq(c.seed, 42);
    cr_assert_eq(c.train_count, 16384);
    cr_assert_eq(c.test_count, 4096);
    cr_assert_eq(c.dim, 784);
    cr_assert_eq(c.n_classes, 10);
}

Test(synthetic, same_seed_same_bytes)
{
    st_synthetic_config c = small_config(1234);
    st_dataset a, b, at, bt;
    cr_assert_eq(st_synthetic_make(&c, &a, &at), ST_OK, "%s", st_last_error());
    cr_assert_eq(st_synthetic_make(&c, &b, &bt), ST_OK, "%s", st_last_error());
    cr_assert_eq(a.count, 600);
    cr_assert_eq(at.count, 200);
    cr_assert_eq(a.dim, 40);
    cr_assert_eq(a.n_classes, 5);
    /* no image shape: every feature a channel of one pixel */
    cr_assert(a.channels == 40 && a.height == 1 && a.width == 1, "%ux%ux%u", a.channels,
              a.height, a.width);
    cr_assert(at.channels == 40 && at.height == 1 && at.width == 1);
    cr_assert(memcmp(a.x, b.x, 600 * 40 * sizeof(float)) == 0);
    cr_assert(memcmp(a.y, b.y, 600) == 0);
    cr_assert(memcmp(at.x, bt.x, 200 * 40 * sizeof(float)) == 0);
    cr_assert(memcmp(at.y, bt.y, 200) == 0);
    st_dataset_free(&a);
    st_dataset_free(&b);
    st_dataset_free(&at);
    st_dataset_free(&bt);
}

Test(synthetic, different_seed_different_data)
{
    st_synthetic_config c1 = small_config(1), c2 = small_config(2);
    st_dataset a, b, at, bt;
    cr_assert_eq(st_synthetic_make(&c1, &a, &at), ST_OK, "%s", st_last_error());
    cr_assert_eq(st_synthetic_make(&c2, &b, &bt), ST_OK, "%s", st_last_error());
    cr_assert(memcmp(a.x, b.x, 600 * 40 * sizeof(float)) != 0);
    cr_assert(memcmp(a.y, b.y, 600) != 0);
    st_dataset_free(&a);
    st_dataset_free(&b);
    st_dataset_free(&at);
    st_dataset_free(&bt);
}

/* Sample i depends on (seed, i) only: a smaller set is a prefix of a
 * larger one, and train and test share no sample. */
Test(synthetic, samples_are_independent_of_count_and_disjoint)
{
    st_synthetic_config big = small_config(9), little = small_config(9);
    little.train_count = 100;
    little.test_count = 50;
    st_dataset a, at, b, bt;
    cr_assert_eq(st_synthetic_make(&big, &a, &at), ST_OK, "%s", st_last_error());
    cr_assert_eq(st_synthetic_make(&little, &b, &bt), ST_OK, "%s", st_last_error());
    cr_assert(memcmp(a.x, b.x, 100 * 40 * sizeof(float)) == 0);
    cr_assert(memcmp(a.y, b.y, 100) == 0);
    cr_assert(memcmp(at.x, bt.x, 50 * 40 * sizeof(float)) == 0);
    for (uint32_t i = 0; i < at.count; i++)
        for (uint32_t j = 0; j < a.count; j++)
            cr_assert(memcmp(at.x + (size_t)i * 40, a.x + (size_t)j * 40,
                             40 * sizeof(float)) != 0, "test %u equals train %u", i, j);
    st_dataset_free(&a);
    st_dataset_free(&at);
    st_dataset_free(&b);
    st_dataset_free(&bt);
}

static void check_balance(uint64_t seed, uint32_t dim, uint32_t n_classes, uint32_t count)
{
    st_synthetic_config c = { .seed = seed, .train_count = count, .test_count = count / 4,
                              .dim = dim, .n_classes = n_classes };
    st_dataset tr, te;
    cr_assert_eq(st_synthetic_make(&c, &tr, &te), ST_OK, "%s", st_last_error());
    uint32_t *per_class = calloc(n_classes, sizeof *per_class);
    cr_assert_not_null(per_class);
    for (uint32_t i = 0; i < tr.count; i++) {
        cr_assert_lt(tr.y[i], n_classes);
        per_class[tr.y[i]]++;
    }
    for (uint32_t k = 0; k < n_classes; k++)
        cr_assert_geq(per_class[k] * 4 * n_classes, count,
                      "seed %llu, %u classes: class %u has %u of %u samples",
                      (unsigned long long)seed, n_classes, k, per_class[k], count);
    for (uint32_t i = 0; i < (size_t)tr.count * tr.dim; i++)
        cr_assert(isfinite(tr.x[i]));
    free(per_class);
    st_dataset_free(&tr);
    st_dataset_free(&te);
}

Test(synthetic, classes_are_balanced)
{
    for (uint64_t seed = 1; seed <= 4; seed++)
        check_balance(seed, 784, 10, 4096);
    check_balance(5, 16, 2, 2000);
    check_balance(6, 100, 40, 8000);
}

Test(synthetic, invalid_config)
{
    st_dataset tr, te;
    st_synthetic_config c = small_config(1);
    c.train_count = 0;
    cr_assert_eq(st_synthetic_make(&c, &tr, &te), ST_ERR_INVALID);
    expect_dataset_empty(&tr);
    expect_dataset_empty(&te);
    c = small_config(1);
    c.test_count = 0;
    cr_assert_eq(st_synthetic_make(&c, &tr, &te), ST_ERR_INVALID);
    c = small_config(1);
    c.dim = 0;
    cr_assert_eq(st_synthetic_make(&c, &tr, &te), ST_ERR_INVALID);
    c = small_config(1);
    c.n_classes = 1;
    cr_assert_eq(st_synthetic_make(&c, &tr, &te), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "n_classes"), "%s", st_last_error());
    c.n_classes = 256;
    cr_assert_eq(st_synthetic_make(&c, &tr, &te), ST_ERR_INVALID);
    cr_assert_eq(st_synthetic_make(NULL, &tr, &te), ST_ERR_INVALID);
}

/* ---------------------------------------------------------- normalising */

static void moments(const st_dataset *d, double *mean, double *std)
{
    size_t n = (size_t)d->count * d->dim;
    double s = 0.0, q = 0.0;
    for (size_t i = 0; i < n; i++)
        s += d->x[i];
    *mean = s / (double)n;
    for (size_t i = 0; i < n; i++)
        q += (d->x[i] - *mean) * (d->x[i] - *mean);
    *std = sqrt(q / (double)n);
}

Test(synthetic, normalize)
{
    st_synthetic_config c = small_config(77);
    st_dataset tr, te;
    cr_assert_eq(st_synthetic_make(&c, &tr, &te), ST_OK, "%s", st_last_error());
    /* Shift and scale, so that normalising has something to undo. */
    for (size_t i = 0; i < (size_t)tr.count * tr.dim; i++)
        tr.x[i] = 5.0f * tr.x[i] + 3.0f;
    for (size_t i = 0; i < (size_t)te.count * te.dim; i++)
        te.x[i] = 5.0f * te.x[i] + 3.0f;
    float test0 = te.x[0];

    float mean, std;
    st_dataset_normalize(&tr, &te, &mean, &std);
    cr_assert_float_eq(mean, 3.0f, 0.1f, "mean %g", mean);
    cr_assert_float_eq(std, 5.0f, 0.2f, "std %g", std);
    double m, s;
    moments(&tr, &m, &s);
    cr_assert(fabs(m) < 1e-3, "train mean after normalising: %g", m);
    cr_assert(fabs(s - 1.0) < 1e-3, "train std after normalising: %g", s);
    /* The test set uses the training set's statistics. */
    cr_assert_float_eq(te.x[0], (test0 - mean) / std, 1e-5f);
    st_dataset_free(&tr);
    st_dataset_free(&te);
}

Test(synthetic, normalize_constant_data)
{
    float x[6] = { 2, 2, 2, 2, 2, 2 };
    uint8_t y[3] = { 0, 1, 0 };
    st_dataset d = { .count = 3, .dim = 2, .n_classes = 2, .x = x, .y = y };
    float mean, std;
    st_dataset_normalize(&d, NULL, &mean, &std);
    cr_assert_float_eq(mean, 2.0f, 1e-6f);
    cr_assert(std > 0.0f && isfinite(std), "std %g", std);
    for (int i = 0; i < 6; i++)
        cr_assert_float_eq(x[i], 0.0f, 1e-6f);
}

/* ------------------------------------------------------ epochs, batches */

static int is_permutation(const uint32_t *order, uint32_t n)
{
    unsigned char *seen = calloc(n ? n : 1, 1);
    int ok = seen != NULL;
    for (uint32_t i = 0; ok && i < n; i++) {
        ok = order[i] < n && !seen[order[i]];
        if (ok)
            seen[order[i]] = 1;
    }
    free(seen);
    return ok;
}

Test(epoch, order_is_a_seeded_permutation)
{
    enum { N = 1000 };
    static uint32_t a[N], b[N], c[N], d[N];
    st_epoch_order(5, 0, a, N);
    st_epoch_order(5, 0, b, N);
    st_epoch_order(5, 1, c, N);
    st_epoch_order(6, 0, d, N);
    cr_assert(is_permutation(a, N));
    cr_assert(is_permutation(c, N));
    cr_assert(memcmp(a, b, sizeof a) == 0, "same (seed, epoch), same order");
    cr_assert(memcmp(a, c, sizeof a) != 0, "another epoch, another order");
    cr_assert(memcmp(a, d, sizeof a) != 0, "another seed, another order");
    uint32_t identity = 0;
    for (uint32_t i = 0; i < N; i++)
        identity += a[i] == i;
    cr_assert_lt(identity, 20, "%u of %u left in place: not shuffled", identity, N);
}

Test(epoch, tiny_orders)
{
    uint32_t one = 77;
    st_epoch_order(1, 2, &one, 1);
    cr_assert_eq(one, 0);
    st_epoch_order(1, 2, NULL, 0);
}

Test(epoch, gather_copies_rows)
{
    // x is (4, 3): row i holds 10 i, 10 i + 1, 10 i + 2
    float x[12];
    uint8_t y[4] = { 7, 8, 9, 6 };
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            x[i * 3 + j] = (float)(10 * i + j);
    st_dataset d = { .count = 4, .dim = 3, .n_classes = 10, .x = x, .y = y };
    uint32_t idx[3] = { 3, 0, 3 };
    float out[9];
    int32_t labels[3];
    st_dataset_gather(&d, idx, 3, out, labels);
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 3; j++)
            cr_assert_eq(out[i * 3 + j], (float)(10 * idx[i] + j), "row %d col %d", i, j);
        cr_assert_eq(labels[i], y[idx[i]]);
    }
}

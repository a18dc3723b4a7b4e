/*
 * tests/test_data_cifar.c — CIFAR-10 and CIFAR-100 binaries: shape, values,
 * channel order and labels, files that are missing or wrong, and
 * normalisation per channel.
 *
 * The scratch directory and the IDX writers: tests/data_check.h.
 */
#include "data_check.h"

#include <math.h>
#include <sys/stat.h>

TestSuite(cifar, .init = setup, .fini = teardown);

/* ------------------------------------------------------------ CIFAR */

#define CIFAR_PLANE 1024

/* Pixel (c, y, x) of record r: distinct per channel, row and record. */
static unsigned char cifar_pixel(uint32_t r, int c, int y, int x)
{
    return (unsigned char)(r * 31 + c * 80 + y * 3 + x);
}

/* n records of `kind` into dir/name; record r has label labels[r] (CIFAR-100:
 * fine labels[r], coarse labels[r] / 5).  Returns the path. */
static char *write_cifar(char *path, const char *name, st_cifar_kind kind, uint32_t n,
                         const unsigned char *labels, uint32_t first_record)
{
    size_t lb = kind == ST_CIFAR10 ? 1 : 2, rec = lb + ST_CIFAR_PIXELS;
    unsigned char *buf = malloc(n * rec + 1);
    cr_assert_not_null(buf);
    for (uint32_t r = 0; r < n; r++) {
        unsigned char *p = buf + r * rec;
        if (kind == ST_CIFAR100)
            *p++ = (unsigned char)(labels[r] / 5);
        *p++ = labels[r];
        for (int c = 0; c < 3; c++)
            for (int y = 0; y < 32; y++)
                for (int x = 0; x < 32; x++)
                    *p++ = cifar_pixel(first_record + r, c, y, x);
    }
    st_test_path(path, tmpdir, name);
    cr_assert_eq(st_test_write_file(path, buf, n * rec), 0);
    free(buf);
    return path;
}

static void check_cifar_record(const st_dataset *d, uint32_t i, uint32_t record)
{
    for (int c = 0; c < 3; c++)
        for (int y = 0; y < 32; y++)
            for (int x = 0; x < 32; x++) {
                float v = d->x[(size_t)i * 3072 + (size_t)c * CIFAR_PLANE + y * 32 + x];
                float want = cifar_pixel(record, c, y, x) * (1.0f / 255.0f);
                cr_assert_eq(v, want, "sample %u channel %d (%d, %d): %g, expected %g", i, c,
                             y, x, v, want);
            }
}

static void write_cifar10_dir(const unsigned char *test_labels)
{
    char path[ST_TEST_PATH_MAX], name[64];
    const uint32_t per_file[5] = { 2, 1, 3, 1, 2 };
    unsigned char labels[3];
    uint32_t record = 0;
    for (int f = 0; f < 5; f++) {
        for (uint32_t r = 0; r < per_file[f]; r++)
            labels[r] = (unsigned char)((record + r) % 10);
        snprintf(name, sizeof name, "data_batch_%d.bin", f + 1);
        write_cifar(path, name, ST_CIFAR10, per_file[f], labels, record);
        record += per_file[f];
    }
    if (test_labels)
        write_cifar(path, "test_batch.bin", ST_CIFAR10, 3, test_labels, 100);
}

Test(cifar, cifar10_shape_values_channel_order_labels)
{
    const unsigned char test_labels[3] = { 9, 0, 5 };
    write_cifar10_dir(test_labels);
    st_dataset train, test;
    cr_assert_eq(st_cifar10_load(tmpdir, &train, &test), ST_OK, "%s", st_last_error());
    cr_assert_eq(train.count, 9, "the five batches in order");
    cr_assert_eq(test.count, 3);
    cr_assert_eq(train.dim, 3072);
    cr_assert(train.channels == 3 && train.height == 32 && train.width == 32);
    cr_assert(test.channels == 3 && test.height == 32 && test.width == 32);
    cr_assert_eq(train.n_classes, 10);
    cr_assert_eq(test.n_classes, 10);
    for (uint32_t i = 0; i < 9; i++) {
        cr_assert_eq(train.y[i], i % 10);
        check_cifar_record(&train, i, i);
    }
    for (uint32_t i = 0; i < 3; i++) {
        cr_assert_eq(test.y[i], test_labels[i]);
        check_cifar_record(&test, i, 100 + i);
    }
    /* the red plane first: pixel (0, 0) of the three channels of sample 1 */
    cr_assert_eq(train.x[3072 + 0], cifar_pixel(1, 0, 0, 0) * (1.0f / 255.0f));
    cr_assert_eq(train.x[3072 + 1024], cifar_pixel(1, 1, 0, 0) * (1.0f / 255.0f));
    cr_assert_eq(train.x[3072 + 2048], cifar_pixel(1, 2, 0, 0) * (1.0f / 255.0f));
    /* ... and row-major: (y, x) = (1, 0) is 32 values on */
    cr_assert_eq(train.x[3072 + 32], cifar_pixel(1, 0, 1, 0) * (1.0f / 255.0f));
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(cifar, cifar100_keeps_the_fine_label)
{
    char path[ST_TEST_PATH_MAX];
    const unsigned char train_labels[4] = { 99, 0, 57, 13 }, test_labels[2] = { 42, 98 };
    write_cifar(path, "train.bin", ST_CIFAR100, 4, train_labels, 0);
    write_cifar(path, "test.bin", ST_CIFAR100, 2, test_labels, 10);
    st_dataset train, test;
    cr_assert_eq(st_cifar100_load(tmpdir, &train, &test), ST_OK, "%s", st_last_error());
    cr_assert_eq(train.count, 4);
    cr_assert_eq(test.count, 2);
    cr_assert_eq(train.n_classes, 100);
    cr_assert(train.channels == 3 && train.height == 32 && train.width == 32);
    for (uint32_t i = 0; i < 4; i++) {
        cr_assert_eq(train.y[i], train_labels[i], "fine, not coarse (%u)", train_labels[i] / 5);
        check_cifar_record(&train, i, i);
    }
    for (uint32_t i = 0; i < 2; i++) {
        cr_assert_eq(test.y[i], test_labels[i]);
        check_cifar_record(&test, i, 10 + i);
    }
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* The failure contract: the status, a message naming the file (and holding
 * `needle`), nothing left behind. */
static void expect_cifar_fail(st_cifar_kind kind, const char *path, st_status want,
                              const char *needle)
{
    st_dataset d;
    memset(&d, 0xAB, sizeof d);
    st_clear_error();
    const char *paths[1] = { path };
    st_status s = st_cifar_load_files(kind, paths, 1, &d);
    const char *msg = st_last_error();
    cr_assert_eq(s, want, "%s: status %s, expected %s (message: %s)", path,
                 st_status_name(s), st_status_name(want), msg);
    cr_assert(strstr(msg, path), "message does not name the file: %s", msg);
    cr_assert_null(strchr(msg, '\n'), "one line: %s", msg);
    if (needle)
        cr_assert(strstr(msg, needle), "message lacks \"%s\": %s", needle, msg);
    expect_dataset_empty(&d);
}

Test(cifar, missing_files_say_where_to_get_cifar)
{
    st_dataset train, test;
    cr_assert_eq(st_cifar10_load(tmpdir, &train, &test), ST_ERR_IO);
    const char *msg = st_last_error();
    cr_assert(strstr(msg, tmpdir) && strstr(msg, "data_batch_1.bin"), "%s", msg);
    cr_assert(strstr(msg, "not packaged on Debian"), "%s", msg);
    cr_assert(strstr(msg, "cifar-10-batches-bin") && strstr(msg, "cifar10:"), "%s", msg);
    expect_dataset_empty(&train);
    expect_dataset_empty(&test);

    cr_assert_eq(st_cifar100_load(tmpdir, &train, &test), ST_ERR_IO);
    msg = st_last_error();
    cr_assert(strstr(msg, "train.bin") && strstr(msg, "cifar-100-binary") &&
              strstr(msg, "not packaged on Debian"), "%s", msg);

    /* the training batches present, the test batch missing: nothing kept */
    write_cifar10_dir(NULL);
    cr_assert_eq(st_cifar10_load(tmpdir, &train, &test), ST_ERR_IO);
    cr_assert(strstr(st_last_error(), "test_batch.bin"), "%s", st_last_error());
    expect_dataset_empty(&train);
    expect_dataset_empty(&test);

    /* one batch of five missing */
    char path[ST_TEST_PATH_MAX];
    const unsigned char tl[3] = { 1, 2, 3 };
    write_cifar(path, "test_batch.bin", ST_CIFAR10, 3, tl, 0);
    cr_assert_eq(unlink(st_test_path(path, tmpdir, "data_batch_4.bin")), 0);
    cr_assert_eq(st_cifar10_load(tmpdir, &train, &test), ST_ERR_IO);
    cr_assert(strstr(st_last_error(), "data_batch_4.bin"), "%s", st_last_error());
    expect_dataset_empty(&train);
}

Test(cifar, sizes_that_are_not_whole_records)
{
    char path[ST_TEST_PATH_MAX];
    const unsigned char labels[2] = { 1, 2 };
    write_cifar(path, "two.bin", ST_CIFAR10, 2, labels, 0);
    size_t len;
    unsigned char *bytes = st_test_read_file(path, &len);
    cr_assert_eq(len, 2 * 3073);
    /* truncated inside the second record */
    write_raw(path, "short.bin", bytes, 3073 + 100, 0);
    expect_cifar_fail(ST_CIFAR10, path, ST_ERR_FORMAT, "not a whole number of 3073-byte");
    /* an extra byte */
    write_raw(path, "long.bin", bytes, 2 * 3073 + 1, 0);
    expect_cifar_fail(ST_CIFAR10, path, ST_ERR_FORMAT, "1 bytes over");
    /* CIFAR-10 records read as CIFAR-100 (3074 bytes each) */
    write_raw(path, "ten-as-hundred.bin", bytes, 2 * 3073, 0);
    expect_cifar_fail(ST_CIFAR100, path, ST_ERR_FORMAT, "3074-byte CIFAR-100");
    /* empty, shorter than a record */
    write_raw(path, "empty.bin", bytes, 0, 0);
    expect_cifar_fail(ST_CIFAR10, path, ST_ERR_FORMAT, "empty");
    write_raw(path, "tiny.bin", "garbage!", 8, 0);
    expect_cifar_fail(ST_CIFAR10, path, ST_ERR_FORMAT, "0 records and 8 bytes over");
    free(bytes);
}

Test(cifar, labels_out_of_range)
{
    char path[ST_TEST_PATH_MAX];
    const unsigned char labels[3] = { 1, 10, 2 };
    write_cifar(path, "ten.bin", ST_CIFAR10, 3, labels, 0);
    expect_cifar_fail(ST_CIFAR10, path, ST_ERR_FORMAT, "record 1 has label 10, outside 0..9");
    const unsigned char fine[2] = { 5, 100 };   /* coarse 20: the coarse check first */
    write_cifar(path, "hundred.bin", ST_CIFAR100, 2, fine, 0);
    expect_cifar_fail(ST_CIFAR100, path, ST_ERR_FORMAT, "record 1 has coarse label 20");
    /* fine out of range with a valid coarse label */
    size_t len;
    unsigned char *bytes = st_test_read_file(path, &len);
    bytes[3074] = 3;     /* record 1: coarse 3, fine 100 */
    write_raw(path, "fine.bin", bytes, len, 0);
    expect_cifar_fail(ST_CIFAR100, path, ST_ERR_FORMAT, "record 1 has fine label 100, "
                      "outside 0..99");
    free(bytes);
}

Test(cifar, garbage_and_odd_files_fail_cleanly)
{
    char path[ST_TEST_PATH_MAX];
    /* a whole number of records of noise: labels out of range */
    unsigned char *noise = pixels(4 * 3073, 77);
    noise[0] = 200;
    write_raw(path, "noise.bin", noise, 4 * 3073, 0);
    expect_cifar_fail(ST_CIFAR10, path, ST_ERR_FORMAT, "record 0 has label 200");
    free(noise);
    /* a directory where a file should be */
    st_test_path(path, tmpdir, "adir.bin");
    cr_assert_eq(mkdir(path, 0700), 0);
    expect_cifar_fail(ST_CIFAR10, path, ST_ERR_IO, "not a regular file");
    /* a path through a file */
    const unsigned char one[1] = { 0 };
    write_cifar(path, "file.bin", ST_CIFAR10, 1, one, 0);
    char below[ST_TEST_PATH_MAX];
    st_test_path(below, path, "x.bin");
    expect_cifar_fail(ST_CIFAR10, below, ST_ERR_IO, "no such file");
    /* several files, one bad: the bad one is named */
    char good[ST_TEST_PATH_MAX], bad[ST_TEST_PATH_MAX];
    write_cifar(good, "good.bin", ST_CIFAR10, 1, one, 0);
    write_raw(bad, "bad.bin", "xyz", 3, 0);
    const char *paths[2] = { good, bad };
    st_dataset d;
    cr_assert_eq(st_cifar_load_files(ST_CIFAR10, paths, 2, &d), ST_ERR_FORMAT);
    cr_assert(strstr(st_last_error(), bad), "%s", st_last_error());
    expect_dataset_empty(&d);
    /* bad arguments */
    cr_assert_eq(st_cifar_load_files(ST_CIFAR10, paths, 0, &d), ST_ERR_INVALID);
    cr_assert_eq(st_cifar_load_files(ST_CIFAR10, NULL, 1, &d), ST_ERR_INVALID);
    cr_assert_eq(st_cifar_load_files((st_cifar_kind)7, paths, 1, &d), ST_ERR_INVALID);
    cr_assert_eq(st_cifar_load_files(ST_CIFAR10, paths, 1, NULL), ST_ERR_INVALID);
}

Test(cifar, normalised_per_channel)
{
    const unsigned char test_labels[3] = { 9, 0, 5 };
    write_cifar10_dir(test_labels);
    st_dataset train, test;
    cr_assert_eq(st_cifar10_load(tmpdir, &train, &test), ST_OK, "%s", st_last_error());
    float mean[3], std[3];
    st_dataset_normalize_channels(&train, &test, mean, std, 3);
    for (int c = 0; c < 3; c++) {
        double s = 0.0, sq = 0.0;
        size_t n = 0;
        for (uint32_t i = 0; i < train.count; i++)
            for (int p = 0; p < CIFAR_PLANE; p++) {
                double v = train.x[(size_t)i * 3072 + (size_t)c * CIFAR_PLANE + p];
                s += v;
                sq += v * v;
                n++;
            }
        cr_assert_float_eq(s / n, 0.0, 1e-5, "channel %d mean %g", c, s / n);
        cr_assert_float_eq(sqrt(sq / n), 1.0, 1e-4, "channel %d std", c);
    }
    for (int c = 0; c < 3; c++) {   /* each channel's own mean, in [0, 1] */
        double s = 0.0;
        for (uint32_t r = 0; r < 9; r++)
            for (int y = 0; y < 32; y++)
                for (int x = 0; x < 32; x++)
                    s += cifar_pixel(r, c, y, x) / 255.0f;
        cr_assert_float_eq(mean[c], s / (9 * CIFAR_PLANE), 1e-6, "channel %d", c);
    }
    cr_assert(mean[0] != mean[1] && mean[1] != mean[2]);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

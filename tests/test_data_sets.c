/*
 * tests/test_data_sets.c — datasets read from IDX files: images and their
 * labels, Fashion-MNIST's files found and refused, FIFOs and devices
 * refused by every reader, IDX sets of any class count, and the
 * fingerprint of a set's content.
 *
 * The scratch directory and the IDX writers: tests/data_check.h.
 */
#include "data_check.h"

#include <errno.h>
#include <math.h>
#include <sys/stat.h>

TestSuite(dataset, .init = setup, .fini = teardown);
TestSuite(fashion, .init = setup, .fini = teardown);
TestSuite(idxset, .init = setup, .fini = teardown);

/* ------------------------------------------------------------ datasets */

/* count images of rows x cols and their labels, into name-images(.gz) and
 * name-labels(.gz). */
static void write_pair(char *img_path, char *lab_path, const char *name, uint32_t count,
                       uint32_t rows, uint32_t cols, const unsigned char *labels, int gz)
{
    char file[256];
    uint32_t di[3] = { count, rows, cols };
    size_t n = (size_t)count * rows * cols;
    unsigned char *p = pixels(n, count);
    snprintf(file, sizeof file, "%s-images%s", name, gz ? ".gz" : "");
    write_idx(img_path, file, 3, di, p, n, gz);
    uint32_t dl[1] = { count };
    snprintf(file, sizeof file, "%s-labels%s", name, gz ? ".gz" : "");
    write_idx(lab_path, file, 1, dl, labels, count, gz);
    free(p);
}

Test(dataset, load_idx)
{
    char ip[ST_TEST_PATH_MAX], lp[ST_TEST_PATH_MAX];
    unsigned char labels[5] = { 0, 4, 2, 2, 1 };
    write_pair(ip, lp, "tiny", 5, 2, 3, labels, 1);
    st_dataset d;
    cr_assert_eq(st_dataset_load_idx(ip, lp, 5, &d), ST_OK, "%s", st_last_error());
    cr_assert_eq(d.count, 5);
    cr_assert_eq(d.dim, 6);
    cr_assert_eq(d.n_classes, 5);
    unsigned char *p = pixels(30, 5);
    for (int i = 0; i < 30; i++)
        cr_assert_float_eq(d.x[i], p[i] / 255.0f, 1e-7f, "pixel %d", i);
    cr_assert(memcmp(d.y, labels, 5) == 0);
    free(p);
    st_dataset_free(&d);
    expect_dataset_empty(&d);
    st_dataset_free(NULL);
}

Test(dataset, count_mismatch)
{
    char ip[ST_TEST_PATH_MAX], lp[ST_TEST_PATH_MAX], lp2[ST_TEST_PATH_MAX];
    unsigned char labels[6] = { 0, 1, 2, 3, 4, 5 };
    write_pair(ip, lp, "a", 5, 2, 2, labels, 0);
    uint32_t dl[1] = { 6 };
    write_idx(lp2, "six-labels", 1, dl, labels, 6, 0);
    st_dataset d;
    memset(&d, 0xCD, sizeof d);
    cr_assert_eq(st_dataset_load_idx(ip, lp2, 10, &d), ST_ERR_FORMAT);
    const char *msg = st_last_error();
    cr_assert(strstr(msg, ip) && strstr(msg, lp2), "both files named: %s", msg);
    cr_assert(strstr(msg, "5 images") && strstr(msg, "6 labels"), "both counts: %s", msg);
    expect_dataset_empty(&d);
}

Test(dataset, label_out_of_range)
{
    char ip[ST_TEST_PATH_MAX], lp[ST_TEST_PATH_MAX];
    unsigned char labels[4] = { 0, 1, 10, 2 };
    write_pair(ip, lp, "b", 4, 2, 2, labels, 0);
    st_dataset d;
    cr_assert_eq(st_dataset_load_idx(ip, lp, 10, &d), ST_ERR_FORMAT);
    const char *msg = st_last_error();
    cr_assert(strstr(msg, lp), "%s", msg);
    cr_assert(strstr(msg, "label 2 is 10"), "index and value: %s", msg);
    expect_dataset_empty(&d);
}

Test(dataset, images_need_rank_two)
{
    char ip[ST_TEST_PATH_MAX], lp[ST_TEST_PATH_MAX];
    unsigned char bytes[3] = { 1, 2, 3 };
    uint32_t d1[1] = { 3 };
    write_idx(ip, "flat", 1, d1, bytes, 3, 0);
    write_idx(lp, "flat-labels", 1, d1, bytes, 3, 0);
    st_dataset d;
    cr_assert_eq(st_dataset_load_idx(ip, lp, 10, &d), ST_ERR_FORMAT);
    cr_assert(strstr(st_last_error(), "rank"), "%s", st_last_error());
    expect_dataset_empty(&d);
    /* Labels of rank 2 are wrong too. */
    uint32_t d2[2] = { 3, 1 };
    write_idx(ip, "img2", 2, d2, bytes, 3, 0);
    write_idx(lp, "lab2", 2, d2, bytes, 3, 0);
    cr_assert_eq(st_dataset_load_idx(ip, lp, 10, &d), ST_ERR_FORMAT);
    cr_assert(strstr(st_last_error(), lp), "%s", st_last_error());
    expect_dataset_empty(&d);
}

Test(dataset, bad_label_file_propagates)
{
    char ip[ST_TEST_PATH_MAX], lp[ST_TEST_PATH_MAX];
    unsigned char labels[4] = { 0, 1, 2, 3 };
    write_pair(ip, lp, "c", 4, 2, 2, labels, 0);
    st_test_path(lp, tmpdir, "missing-labels");
    st_dataset d;
    cr_assert_eq(st_dataset_load_idx(ip, lp, 10, &d), ST_ERR_IO);
    cr_assert(strstr(st_last_error(), "missing-labels"), "%s", st_last_error());
    expect_dataset_empty(&d);
}

/* ------------------------------------------------------- Fashion-MNIST */

Test(fashion, missing_directory_says_how_to_get_it)
{
    char dir[ST_TEST_PATH_MAX];
    st_test_path(dir, tmpdir, "nowhere");
    st_dataset train, test;
    cr_assert_eq(st_fashion_mnist_load(dir, &train, &test), ST_ERR_IO);
    const char *msg = st_last_error();
    cr_assert(strstr(msg, dir), "names the directory: %s", msg);
    cr_assert(strstr(msg, "train-images-idx3-ubyte"), "names the file: %s", msg);
    cr_assert(strstr(msg, "dataset-fashion-mnist"), "names the package: %s", msg);
    cr_assert(strstr(msg, "synthetic"), "offers synthetic data: %s", msg);
    expect_dataset_empty(&train);
    expect_dataset_empty(&test);
}

/* Train as .gz, test as plain files: both spellings are found. */
static void write_fake_fashion(uint32_t n_train, uint32_t n_test)
{
    char ip[ST_TEST_PATH_MAX], lp[ST_TEST_PATH_MAX];
    unsigned char labels[16];
    for (int i = 0; i < 16; i++)
        labels[i] = (unsigned char)(i % 10);
    write_pair(ip, lp, "train", n_train, 28, 28, labels, 1);
    cr_assert_eq(rename(ip, st_test_path(lp, tmpdir, "train-images-idx3-ubyte.gz")), 0);
    cr_assert_eq(rename(st_test_path(ip, tmpdir, "train-labels.gz"),
                        st_test_path(lp, tmpdir, "train-labels-idx1-ubyte.gz")), 0);
    if (n_test == 0)
        return;
    write_pair(ip, lp, "t10k", n_test, 28, 28, labels, 0);
    cr_assert_eq(rename(ip, st_test_path(lp, tmpdir, "t10k-images-idx3-ubyte")), 0);
    cr_assert_eq(rename(st_test_path(ip, tmpdir, "t10k-labels"),
                        st_test_path(lp, tmpdir, "t10k-labels-idx1-ubyte")), 0);
}

Test(fashion, finds_gzip_and_plain_files)
{
    write_fake_fashion(12, 7);
    st_dataset train, test;
    cr_assert_eq(st_fashion_mnist_load(tmpdir, &train, &test), ST_OK, "%s", st_last_error());
    cr_assert_eq(train.count, 12);
    cr_assert_eq(test.count, 7);
    cr_assert_eq(train.dim, 784);
    cr_assert_eq(test.dim, 784);
    cr_assert_eq(train.n_classes, 10);
    cr_assert(train.channels == 1 && train.height == 28 && train.width == 28,
              "Fashion-MNIST is 1x28x28, got %ux%ux%u", train.channels, train.height,
              train.width);
    cr_assert(test.channels == 1 && test.height == 28 && test.width == 28);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(fashion, missing_test_files_free_the_train_set)
{
    write_fake_fashion(12, 0);
    st_dataset train, test;
    cr_assert_eq(st_fashion_mnist_load(tmpdir, &train, &test), ST_ERR_IO);
    cr_assert(strstr(st_last_error(), "t10k-images-idx3-ubyte"), "%s", st_last_error());
    expect_dataset_empty(&train);
    expect_dataset_empty(&test);
}

/* A file that is there but cannot be opened is named, .gz or not, with
 * the reason; only a missing one gets the "install it" advice. */
Test(fashion, unopenable_files_are_named_with_the_reason)
{
    char a[ST_TEST_PATH_MAX], b[2 * ST_TEST_PATH_MAX];
    write_fake_fashion(12, 7);
    /* a symlink loop in place of the plain labels (no .gz of them) */
    st_test_path(a, tmpdir, "t10k-labels-idx1-ubyte");
    cr_assert_eq(unlink(a), 0);
    cr_assert_eq(symlink("t10k-labels-idx1-ubyte", a), 0);
    st_dataset train, test;
    cr_assert_eq(st_fashion_mnist_load(tmpdir, &train, &test), ST_ERR_IO);
    snprintf(b, sizeof b, "%s: cannot open: %s", a, strerror(ELOOP));
    cr_assert_str_eq(st_last_error(), b);
    /* a symbolic link to nothing */
    cr_assert_eq(unlink(a), 0);
    cr_assert_eq(symlink("gone", a), 0);
    cr_assert_eq(st_fashion_mnist_load(tmpdir, &train, &test), ST_ERR_IO);
    snprintf(b, sizeof b, "%s: cannot open: it is a symbolic link to 'gone', which does not "
             "exist", a);
    cr_assert_str_eq(st_last_error(), b);
    /* --data through a regular file */
    st_test_path(a, tmpdir, "t10k-images-idx3-ubyte");
    cr_assert_eq(st_fashion_mnist_load(a, &train, &test), ST_ERR_IO);
    snprintf(b, sizeof b, "%s: not a directory", a);
    cr_assert_eq(strncmp(st_last_error(), b, strlen(b)), 0, "%s", st_last_error());
    cr_assert_null(strstr(st_last_error(), "apt-get"), "%s", st_last_error());
    expect_dataset_empty(&train);
    expect_dataset_empty(&test);
}

/* Every data reader refuses a FIFO at once (nothing writes to it: a
 * reader that opened it would wait forever), and a device; a FIFO where a
 * Fashion-MNIST file's .gz would be is passed over for the plain file, as
 * a .gz that cannot be opened is. */
Test(dataset, fifos_and_devices_are_refused_by_every_reader, .timeout = 30)
{
    char fifo[ST_TEST_PATH_MAX];
    st_test_path(fifo, tmpdir, "fifo");
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    expect_idx_fail(fifo, ST_ERR_IO, "fifo: not a regular file (a FIFO)");
    expect_idx_fail("/dev/zero", ST_ERR_IO, "not a regular file (a character device)");
    st_text t;
    cr_assert_eq(st_text_load(fifo, 0.1, &t), ST_ERR_IO);
    cr_assert(strstr(st_last_error(), "fifo: not a regular file (a FIFO)"), "%s",
              st_last_error());
    const char *paths[1] = { fifo };
    st_dataset d;
    cr_assert_eq(st_cifar_load_files(ST_CIFAR10, paths, 1, &d), ST_ERR_IO);
    cr_assert(strstr(st_last_error(), "fifo: not a regular file (a FIFO)"), "%s",
              st_last_error());
    write_fake_fashion(12, 7);
    char plain[ST_TEST_PATH_MAX], gz[ST_TEST_PATH_MAX];
    st_test_path(plain, tmpdir, "t10k-images-idx3-ubyte");
    st_test_path(gz, tmpdir, "t10k-images-idx3-ubyte.gz");
    cr_assert_eq(mkfifo(gz, 0600), 0);
    st_dataset train, test;
    cr_assert_eq(st_fashion_mnist_load(tmpdir, &train, &test), ST_OK, "%s", st_last_error());
    cr_assert_eq(test.count, 7);
    st_dataset_free(&train);
    st_dataset_free(&test);
    cr_assert_eq(unlink(plain), 0);
    cr_assert_eq(st_fashion_mnist_load(tmpdir, &train, &test), ST_ERR_IO);
    cr_assert(strstr(st_last_error(), "t10k-images-idx3-ubyte.gz: not a regular file (a FIFO)"),
              "%s", st_last_error());
}

Test(fashion, real_dataset)
{
    char probe[ST_TEST_PATH_MAX];
    FILE *f = fopen(st_test_path(probe, ST_FASHION_MNIST_DIR, "train-labels-idx1-ubyte.gz"), "rb");
    if (!f)
        cr_skip_test("Fashion-MNIST is not installed in " ST_FASHION_MNIST_DIR
                     " (apt-get install dataset-fashion-mnist)");
    fclose(f);

    st_dataset train, test;
    cr_assert_eq(st_fashion_mnist_load(ST_FASHION_MNIST_DIR, &train, &test), ST_OK,
                 "%s", st_last_error());
    cr_assert_eq(train.count, 60000);
    cr_assert_eq(test.count, 10000);
    cr_assert_eq(train.dim, 784);
    cr_assert_eq(test.dim, 784);
    cr_assert_eq(train.n_classes, 10);
    uint32_t per_class[10] = { 0 }, per_class_test[10] = { 0 };
    for (uint32_t i = 0; i < train.count; i++)
        per_class[train.y[i]]++;
    for (uint32_t i = 0; i < test.count; i++)
        per_class_test[test.y[i]]++;
    for (int c = 0; c < 10; c++) {
        cr_assert_eq(per_class[c], 6000, "class %d: %u train samples", c, per_class[c]);
        cr_assert_eq(per_class_test[c], 1000, "class %d: %u test samples", c,
                     per_class_test[c]);
    }
    float lo = 1.0f, hi = 0.0f;
    for (size_t i = 0; i < (size_t)train.count * train.dim; i++) {
        lo = fminf(lo, train.x[i]);
        hi = fmaxf(hi, train.x[i]);
    }
    cr_assert(lo == 0.0f && hi == 1.0f, "pixels span [%g, %g]", lo, hi);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* ------------------------------------------------------------ IDX sets */

/* count images of rows x cols (pixels(n, seed)) and labels into dir/images
 * and dir/labels (gzip when the name ends in .gz). */
static void write_set_files(const char *images, const char *labels, uint32_t count,
                            uint32_t rows, uint32_t cols, const unsigned char *lab,
                            uint32_t seed)
{
    char path[ST_TEST_PATH_MAX];
    uint32_t di[3] = { count, rows, cols }, dl[1] = { count };
    size_t n = (size_t)count * rows * cols;
    unsigned char *p = pixels(n, seed);
    size_t li = strlen(images), ll = strlen(labels);
    write_idx(path, images, 3, di, p, n, li > 3 && strcmp(images + li - 3, ".gz") == 0);
    write_idx(path, labels, 1, dl, lab, count, ll > 3 && strcmp(labels + ll - 3, ".gz") == 0);
    free(p);
}

/* An EMNIST-like set: train labels cycle through 0 .. train_top - 1, the
 * test labels through 0 .. test_top - 1. */
static void write_set(const st_idx_files *f, uint32_t n_train, uint32_t n_test,
                      uint32_t train_top, uint32_t test_top, uint32_t rows, uint32_t cols)
{
    unsigned char lab[256];
    for (uint32_t i = 0; i < n_train; i++)
        lab[i] = (unsigned char)(i % train_top);
    write_set_files(f->train_images, f->train_labels, n_train, rows, cols, lab, 1);
    for (uint32_t i = 0; i < n_test; i++)
        lab[i] = (unsigned char)(i % test_top);
    write_set_files(f->test_images, f->test_labels, n_test, rows, cols, lab, 2);
}

static const st_idx_files letters = {
    "emnist-letters-train-images-idx3-ubyte.gz", "emnist-letters-train-labels-idx1-ubyte.gz",
    "emnist-letters-test-images-idx3-ubyte", "emnist-letters-test-labels-idx1-ubyte",
};

Test(idxset, class_count_is_read_from_the_labels_26)
{
    /* The largest label (25) is only in the test set: max over both + 1. */
    write_set(&letters, 50, 30, 25, 26, 28, 28);
    st_dataset train, test;
    cr_assert_eq(st_idx_set_load(tmpdir, &letters, &train, &test), ST_OK, "%s",
                 st_last_error());
    cr_assert_eq(train.n_classes, 26);
    cr_assert_eq(test.n_classes, 26);
    cr_assert_eq(train.count, 50);
    cr_assert_eq(test.count, 30);
    cr_assert(train.channels == 1 && train.height == 28 && train.width == 28);
    cr_assert_eq(train.dim, 784);
    cr_assert_eq(test.y[25], 25);
    unsigned char *p = pixels(50 * 784, 1);
    for (size_t i = 0; i < 50 * 784; i++)
        cr_assert_eq(train.x[i], p[i] * (1.0f / 255.0f), "pixel %zu", i);
    free(p);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(idxset, class_count_is_read_from_the_labels_47)
{
    /* EMNIST balanced: 47 classes; images 4 rows x 5 columns. */
    static const st_idx_files balanced = { "bal-train-img", "bal-train-lab.gz",
                                           "bal-test-img.gz", "bal-test-lab" };
    write_set(&balanced, 94, 47, 47, 40, 4, 5);
    st_dataset train, test;
    cr_assert_eq(st_idx_set_load(tmpdir, &balanced, &train, &test), ST_OK, "%s",
                 st_last_error());
    cr_assert_eq(train.n_classes, 47);
    cr_assert_eq(test.n_classes, 47);
    cr_assert(train.channels == 1 && train.height == 4 && train.width == 5,
              "rows are the height: %ux%ux%u", train.channels, train.height, train.width);
    cr_assert_eq(train.dim, 20);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(idxset, default_names_are_fashion_mnists)
{
    static const st_idx_files fashion = { "train-images-idx3-ubyte.gz",
                                          "train-labels-idx1-ubyte",
                                          "t10k-images-idx3-ubyte",
                                          "t10k-labels-idx1-ubyte.gz" };
    write_set(&fashion, 12, 6, 3, 3, 28, 28);
    st_dataset train, test;
    /* found as NAME.gz or NAME; the class count is the labels' (3), where
     * st_fashion_mnist_load says 10 */
    cr_assert_eq(st_idx_set_load(tmpdir, NULL, &train, &test), ST_OK, "%s", st_last_error());
    cr_assert_eq(train.n_classes, 3);
    st_dataset_free(&train);
    st_dataset_free(&test);
    st_idx_files some = { NULL, NULL, NULL, NULL };
    cr_assert_eq(st_idx_set_load(tmpdir, &some, &train, &test), ST_OK, "%s", st_last_error());
    cr_assert_eq(test.count, 6);
    st_dataset_free(&train);
    st_dataset_free(&test);
    cr_assert_eq(st_fashion_mnist_load(tmpdir, &train, &test), ST_OK, "%s", st_last_error());
    cr_assert_eq(train.n_classes, 10);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* A plain Fashion-MNIST directory is 10 classes: a set of more is refused
 * with the way that reads the class count from the labels; read as an IDX
 * set (the same files) it loads, and the library's IDX pair reader says
 * nothing of options. */
Test(idxset, more_classes_than_fashion_mnists_name_the_idx_set)
{
    static const st_idx_files fashion = { "train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                          "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte" };
    write_set(&fashion, 52, 26, 26, 26, 4, 4);
    st_dataset train, test;
    cr_assert_eq(st_fashion_mnist_load(tmpdir, &train, &test), ST_ERR_FORMAT);
    cr_assert(strstr(st_last_error(), "train-labels-idx1-ubyte: label 10 is 10, outside 0..9: "
                     "--data DIR takes Fashion-MNIST's 10 classes; --data idx:DIR reads the "
                     "class count from the labels"), "%s", st_last_error());
    expect_dataset_empty(&train);
    expect_dataset_empty(&test);
    cr_assert_eq(st_idx_set_load(tmpdir, NULL, &train, &test), ST_OK, "%s", st_last_error());
    cr_assert_eq(train.n_classes, 26);
    st_dataset_free(&train);
    st_dataset_free(&test);
    char img[ST_TEST_PATH_MAX], lab[ST_TEST_PATH_MAX];
    st_test_path(img, tmpdir, fashion.train_images);
    st_test_path(lab, tmpdir, fashion.train_labels);
    cr_assert_eq(st_dataset_load_idx(img, lab, 10, &train), ST_ERR_FORMAT);
    cr_assert(strstr(st_last_error(), "outside 0..9") && !strstr(st_last_error(), "--data"),
              "%s", st_last_error());
}

Test(idxset, missing_file_is_named_and_frees_everything)
{
    write_set(&letters, 10, 10, 5, 5, 28, 28);
    st_idx_files f = letters;
    f.test_labels = "no-such-labels";
    st_dataset train, test;
    cr_assert_eq(st_idx_set_load(tmpdir, &f, &train, &test), ST_ERR_IO);
    const char *msg = st_last_error();
    cr_assert(strstr(msg, tmpdir) && strstr(msg, "no-such-labels"), "%s", msg);
    cr_assert(strstr(msg, "idx:DIR"), "says how to name the files: %s", msg);
    cr_assert_null(strstr(msg, "Fashion-MNIST"), "%s", msg);
    expect_dataset_empty(&train);
    expect_dataset_empty(&test);
}

Test(idxset, train_and_test_shapes_must_agree)
{
    unsigned char lab[8] = { 0, 1, 2, 3, 0, 1, 2, 3 };
    write_set_files("a-img", "a-lab", 8, 28, 28, lab, 1);
    write_set_files("b-img", "b-lab", 8, 14, 56, lab, 2);
    st_idx_files f = { "a-img", "a-lab", "b-img", "b-lab" };
    st_dataset train, test;
    cr_assert_eq(st_idx_set_load(tmpdir, &f, &train, &test), ST_ERR_FORMAT);
    const char *msg = st_last_error();
    cr_assert(strstr(msg, "b-img") && strstr(msg, "1x14x56") && strstr(msg, "1x28x28"), "%s",
              msg);
    expect_dataset_empty(&train);
    expect_dataset_empty(&test);
}

Test(idxset, corrupt_file_is_named)
{
    write_set(&letters, 10, 10, 5, 5, 28, 28);
    char path[ST_TEST_PATH_MAX];
    write_raw(path, letters.test_images, "garbage!", 8, 0);
    st_dataset train, test;
    cr_assert_eq(st_idx_set_load(tmpdir, &letters, &train, &test), ST_ERR_FORMAT);
    cr_assert(strstr(st_last_error(), letters.test_images), "%s", st_last_error());
    expect_dataset_empty(&train);
    expect_dataset_empty(&test);
}

/* Without the samples' values (what a plan reads): the same counts, shapes,
 * class counts and labels as the full load, x NULL; a damaged file is
 * refused with the same message. */
Test(idxset, labels_only_load_is_the_full_load_without_values)
{
    write_set(&letters, 50, 30, 25, 26, 28, 28);
    st_dataset a, at, b, bt;
    cr_assert_eq(st_idx_set_load(tmpdir, &letters, &a, &at), ST_OK, "%s", st_last_error());
    cr_assert_eq(st_idx_set_load_labels(tmpdir, &letters, &b, &bt), ST_OK, "%s",
                 st_last_error());
    const st_dataset *full[2] = { &a, &at }, *lab[2] = { &b, &bt };
    for (int k = 0; k < 2; k++) {
        cr_expect_null(lab[k]->x, "set %d: the labels-only load made values", k);
        cr_assert_not_null(lab[k]->y);
        cr_expect(lab[k]->count == full[k]->count && lab[k]->dim == full[k]->dim &&
                  lab[k]->n_classes == full[k]->n_classes &&
                  lab[k]->channels == full[k]->channels &&
                  lab[k]->height == full[k]->height && lab[k]->width == full[k]->width,
                  "set %d: %u samples of %u (%ux%ux%u), %u classes against the full load's "
                  "%u of %u (%ux%ux%u), %u", k, lab[k]->count, lab[k]->dim, lab[k]->channels,
                  lab[k]->height, lab[k]->width, lab[k]->n_classes, full[k]->count,
                  full[k]->dim, full[k]->channels, full[k]->height, full[k]->width,
                  full[k]->n_classes);
        cr_expect_eq(memcmp(lab[k]->y, full[k]->y, full[k]->count), 0, "set %d: labels", k);
    }
    st_dataset_free(&a);
    st_dataset_free(&at);
    st_dataset_free(&b);
    st_dataset_free(&bt);
    char path[ST_TEST_PATH_MAX], want[1024];
    write_raw(path, letters.test_images, "garbage!", 8, 0);
    cr_assert_eq(st_idx_set_load(tmpdir, &letters, &a, &at), ST_ERR_FORMAT);
    snprintf(want, sizeof want, "%s", st_last_error());
    cr_assert_eq(st_idx_set_load_labels(tmpdir, &letters, &b, &bt), ST_ERR_FORMAT);
    cr_expect_str_eq(st_last_error(), want);
    expect_dataset_empty(&b);
    expect_dataset_empty(&bt);
}

Test(fashion, labels_only_load_is_the_full_load_without_values)
{
    write_fake_fashion(12, 7);
    st_dataset a, at, b, bt;
    cr_assert_eq(st_fashion_mnist_load(tmpdir, &a, &at), ST_OK, "%s", st_last_error());
    cr_assert_eq(st_fashion_mnist_load_labels(tmpdir, &b, &bt), ST_OK, "%s", st_last_error());
    cr_expect_null(b.x);
    cr_expect_null(bt.x);
    cr_expect(b.count == 12 && bt.count == 7 && b.dim == 784 && b.n_classes == 10 &&
              b.channels == 1 && b.height == 28 && b.width == 28);
    cr_expect_eq(memcmp(b.y, a.y, 12), 0);
    cr_expect_eq(memcmp(bt.y, at.y, 7), 0);
    st_dataset_free(&a);
    st_dataset_free(&at);
    st_dataset_free(&b);
    st_dataset_free(&bt);
}

Test(idxset, rank_two_vectors_have_no_image_shape)
{
    char ip[ST_TEST_PATH_MAX], lp[ST_TEST_PATH_MAX];
    unsigned char bytes[12] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 }, lab[3] = { 0, 1, 0 };
    uint32_t d2[2] = { 3, 4 }, d1[1] = { 3 };
    write_idx(ip, "vec", 2, d2, bytes, 12, 0);
    write_idx(lp, "vec-labels", 1, d1, lab, 3, 0);
    st_dataset d;
    cr_assert_eq(st_dataset_load_idx(ip, lp, 2, &d), ST_OK, "%s", st_last_error());
    cr_assert(d.channels == 4 && d.height == 1 && d.width == 1);
    st_dataset_free(&d);
    /* rank 4 is count x C x H x W */
    uint32_t d4[4] = { 1, 3, 2, 2 }, d1b[1] = { 1 };
    write_idx(ip, "img4", 4, d4, bytes, 12, 0);
    write_idx(lp, "img4-labels", 1, d1b, lab, 1, 0);
    cr_assert_eq(st_dataset_load_idx(ip, lp, 2, &d), ST_OK, "%s", st_last_error());
    cr_assert(d.channels == 3 && d.height == 2 && d.width == 2);
    st_dataset_free(&d);
}

Test(idxset, per_channel_normalisation_of_one_channel_is_the_global_one_to_the_bit)
{
    write_set(&letters, 64, 16, 10, 10, 28, 28);
    st_dataset a, at, b, bt;
    cr_assert_eq(st_idx_set_load(tmpdir, &letters, &a, &at), ST_OK, "%s", st_last_error());
    cr_assert_eq(st_idx_set_load(tmpdir, &letters, &b, &bt), ST_OK, "%s", st_last_error());
    float ma, sa, mb[2] = { 0, 0 }, sb[2] = { 0, 0 };
    st_dataset_normalize(&a, &at, &ma, &sa);
    st_dataset_normalize_channels(&b, &bt, mb, sb, 2);
    cr_assert(memcmp(a.x, b.x, (size_t)a.count * a.dim * sizeof(float)) == 0);
    cr_assert(memcmp(at.x, bt.x, (size_t)at.count * at.dim * sizeof(float)) == 0);
    cr_assert(ma == mb[0] && sa == sb[0]);
    cr_assert(mb[1] == 0 && sb[1] == 0, "one channel written");
    st_dataset_free(&a);
    st_dataset_free(&at);
    st_dataset_free(&b);
    st_dataset_free(&bt);
}

/* st_dataset_fingerprint is of the content, not of where it was read
 * from: a set of gzip files and the same set of plain files under other
 * names agree; one pixel or one label more or less changes it. */
Test(idxset, fingerprint_is_of_the_content)
{
    static const st_idx_files plain = { "p-train-img", "p-train-lab", "p-test-img",
                                        "p-test-lab" };
    write_set(&letters, 50, 30, 25, 26, 28, 28);
    write_set(&plain, 50, 30, 25, 26, 28, 28);
    st_dataset a[2], b[2];
    cr_assert_eq(st_idx_set_load(tmpdir, &letters, &a[0], &a[1]), ST_OK, "%s", st_last_error());
    cr_assert_eq(st_idx_set_load(tmpdir, &plain, &b[0], &b[1]), ST_OK, "%s", st_last_error());
    const uint64_t train = st_dataset_fingerprint(&a[0]), test = st_dataset_fingerprint(&a[1]);
    cr_assert_eq(st_dataset_fingerprint(&b[0]), train);
    cr_assert_eq(st_dataset_fingerprint(&b[1]), test);
    cr_assert_neq(train, test);
    b[0].x[1234] += 1.0f / 255.0f;
    cr_assert_neq(st_dataset_fingerprint(&b[0]), train, "a pixel");
    b[0].x[1234] = a[0].x[1234];
    cr_assert_eq(st_dataset_fingerprint(&b[0]), train);
    b[0].y[7] ^= 1;
    cr_assert_neq(st_dataset_fingerprint(&b[0]), train, "a label");
    b[0].y[7] ^= 1;
    b[0].count--;   /* the same bytes, one sample fewer */
    cr_assert_neq(st_dataset_fingerprint(&b[0]), train, "the count");
    b[0].count++;
    for (int k = 0; k < 2; k++) {
        st_dataset_free(&a[k]);
        st_dataset_free(&b[k]);
    }
}

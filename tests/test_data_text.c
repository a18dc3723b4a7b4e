/*
 * tests/test_data_text.c — text corpora: plain and gzip files, the held-out
 * tail, seeded windows, the unigram baseline, bad corpora, and datasets of
 * windows.
 *
 * The scratch directory and the IDX writers: tests/data_check.h.
 */
#include "data_check.h"

TestSuite(text, .init = setup, .fini = teardown);

/* ------------------------------------------------------------ text */

/* English-like text with a skewed byte distribution, n bytes. */
static unsigned char *words(size_t n, uint32_t seed)
{
    static const char *w[] = { "the ", "of ", "and ", "a ", "to ", "in ", "is ", "word ",
                               "dictionary ", "noun. ", "verb; ", "\n" };
    unsigned char *p = malloc(n);
    cr_assert_not_null(p);
    uint32_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n;) {
        s = s * 1664525u + 1013904223u;
        const char *x = w[(s >> 24) % 12];
        for (size_t k = 0; x[k] && i < n; k++)
            p[i++] = (unsigned char)x[k];
    }
    return p;
}

/* Plain and gzip read to the same bytes; the tail is held out. */
Test(text, plain_and_gzip_read_the_same_bytes_and_hold_out_the_tail)
{
    const size_t n = 3 * 1024 * 1024 + 17;   /* past the first buffer: it grows */
    unsigned char *p = words(n, 3);
    char path[ST_TEST_PATH_MAX], gzpath[ST_TEST_PATH_MAX];
    st_test_path(path, tmpdir, "corpus.txt");
    st_test_path(gzpath, tmpdir, "corpus.txt.gz");
    write_bytes(path, p, n, 0);
    write_bytes(gzpath, p, n, 1);
    st_text a, b;
    cr_assert_eq(st_text_load(path, 0.1, &a), ST_OK, "%s", st_last_error());
    cr_assert_eq(st_text_load(gzpath, 0.1, &b), ST_OK, "%s", st_last_error());
    cr_assert_eq(a.count, n);
    cr_assert_eq(b.count, n);
    cr_assert_eq(memcmp(a.bytes, p, n), 0);
    cr_assert_eq(memcmp(b.bytes, p, n), 0);
    cr_assert_eq(a.train_count, n - (size_t)((double)n * 0.1));
    cr_assert_eq(a.train_count, b.train_count);
    st_text_free(&a);
    st_text_free(&b);
    st_text_free(&a);   /* twice: safe */
    free(p);
}

/* Windows start where T + 1 bytes fit in the training part, depend on
 * (seed, epoch, k) only, and cover the part. */
Test(text, windows_are_seeded_and_inside_the_training_part)
{
    const size_t n = 5000;
    unsigned char *p = words(n, 4);
    char path[ST_TEST_PATH_MAX];
    st_test_path(path, tmpdir, "small.txt");
    write_bytes(path, p, n, 0);
    st_text t;
    cr_assert_eq(st_text_load(path, 0.2, &t), ST_OK, "%s", st_last_error());
    const int T = 64;
    size_t lo = t.count, hi = 0;
    for (uint64_t k = 0; k < 20000; k++) {
        size_t w = st_text_window(&t, T, 7, 1, k);
        cr_assert_leq(w + (size_t)T + 1, t.train_count, "window %llu at %zu", (unsigned long long)k, w);
        cr_assert_eq(w, st_text_window(&t, T, 7, 1, k), "a pure function");
        lo = w < lo ? w : lo;
        hi = w > hi ? w : hi;
    }
    cr_assert_eq(lo, 0);
    cr_assert_eq(hi, t.train_count - (size_t)T - 1, "the last start is reached");
    int moved = 0;
    for (uint64_t k = 0; k < 16; k++)
        moved += st_text_window(&t, T, 7, 1, k) != st_text_window(&t, T, 7, 2, k);
    cr_assert_geq(moved, 14, "another epoch, other windows");
    st_text_free(&t);
    free(p);
}

/* The unigram baseline: uniform random bytes cost about 8 bits, skewed
 * text much less, a text of one repeated byte almost nothing. */
Test(text, unigram_baseline_follows_the_byte_distribution)
{
    const size_t n = 200000;
    unsigned char *u = malloc(n), *c = malloc(n), *e = words(n, 5);
    uint32_t s = 9;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        u[i] = (unsigned char)(s >> 24);
        c[i] = 'x';
    }
    const unsigned char *data[3] = { u, c, e };
    double bpb[3];
    for (int k = 0; k < 3; k++) {
        char path[ST_TEST_PATH_MAX], name[16];
        snprintf(name, sizeof name, "u%d.txt", k);
        st_test_path(path, tmpdir, name);
        write_bytes(path, data[k], n, 0);
        st_text t;
        cr_assert_eq(st_text_load(path, 0.1, &t), ST_OK, "%s", st_last_error());
        bpb[k] = st_text_unigram_bpb(&t);
        st_text_free(&t);
    }
    cr_log_info("unigram bpb: uniform %.4f, constant %.6f, words %.4f", bpb[0], bpb[1], bpb[2]);
    cr_assert(bpb[0] > 7.95 && bpb[0] < 8.05, "uniform bytes: %g", bpb[0]);
    cr_assert_lt(bpb[1], 0.01, "one byte value: %g", bpb[1]);
    cr_assert(bpb[2] > 2.0 && bpb[2] < 5.0, "words: %g", bpb[2]);
    free(u);
    free(c);
    free(e);
}

/* Bad corpora get one line naming the file and the problem. */
Test(text, bad_corpora_are_refused_with_the_file_named)
{
    char path[ST_TEST_PATH_MAX];
    st_text t;
    st_test_path(path, tmpdir, "missing.txt");
    cr_assert_eq(st_text_load(path, 0.1, &t), ST_ERR_IO);
    cr_assert(strstr(st_last_error(), "missing.txt"), "%s", st_last_error());
    cr_assert_null(t.bytes);
    st_test_path(path, tmpdir, "empty.txt");
    write_bytes(path, "", 0, 0);
    cr_assert_eq(st_text_load(path, 0.1, &t), ST_ERR_FORMAT);
    cr_assert(strstr(st_last_error(), "empty.txt"), "%s", st_last_error());
    st_test_path(path, tmpdir, "tiny.txt");
    write_bytes(path, "abc", 3, 0);
    cr_assert_eq(st_text_load(path, 0.5, &t), ST_ERR_FORMAT, "3 bytes cannot split 2 + 2");
    /* a damaged gzip stream: corrupt, not silently short */
    const size_t n = 100000;
    unsigned char *p = pixels(n, 6);
    st_test_path(path, tmpdir, "bad.txt.gz");
    write_bytes(path, p, n, 1);
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f);
    fseek(f, 200, SEEK_SET);
    fputc(0x55, f);
    fputc(0xAA, f);
    fclose(f);
    cr_assert_neq(st_text_load(path, 0.1, &t), ST_OK);
    cr_assert(strstr(st_last_error(), "bad.txt.gz") && strstr(st_last_error(), "gzip"), "%s",
              st_last_error());
    cr_assert_eq(st_text_load(path, 1.0, &t), ST_ERR_INVALID, "holdout 1");
    cr_assert_eq(st_text_load(path, 0.0, &t), ST_ERR_INVALID, "holdout 0");
    free(p);
}

/* A text set: training windows are the epoch's seeded windows of the
 * training part, inputs their first T bytes and labels their last T (the
 * next byte of each); the test set reads consecutive windows of the
 * held-out tail's first val_bytes; gathers of rows pad with zeros. */
Test(text, datasets_of_windows_gather_inputs_and_next_bytes)
{
    const size_t n = 20000;
    unsigned char *p = words(n, 6);
    st_text t = { p, n, n - 4000 };
    st_dataset train, test;
    const int T = 16;
    cr_assert_eq(st_text_dataset(&t, T, 9, 0, 1000, &train, &test), ST_OK, "%s",
                 st_last_error());
    cr_assert_eq(train.count, (uint32_t)((n - 4000) / T), "a pass of windows by default");
    cr_assert_eq(train.dim, (uint32_t)T);
    cr_assert_eq(train.n_classes, 256u);
    cr_assert_eq(st_dataset_labels_per_sample(&train), (uint32_t)T);
    cr_assert_eq(test.n_bytes, 1000u, "the first val_bytes of the tail");
    cr_assert_eq(test.count, (uint32_t)((1000 - 1) / T));
    float x[3 * 16];
    int32_t y[3 * 16];
    const uint32_t idx[3] = { 5, 0, 5 };
    st_dataset_gather_train(&train, 2, idx, 3, x, y);
    const size_t w5 = st_text_window(&t, T, 9, 2, 5);
    for (int k = 0; k < T; k++) {
        cr_assert_eq(x[k], (float)p[w5 + (size_t)k]);
        cr_assert_eq(y[k], (int32_t)p[w5 + (size_t)k + 1], "labels: the next bytes");
        cr_assert_eq(x[2 * T + k], x[k], "the same window, the same sample");
    }
    st_dataset_gather_rows(&test, 3, 2, 3, x, y);
    for (int k = 0; k < T; k++) {
        cr_assert_eq(x[k], (float)p[t.train_count + 3 * (size_t)T + (size_t)k]);
        cr_assert_eq(y[T + k], (int32_t)p[t.train_count + 4 * (size_t)T + (size_t)k + 1]);
        cr_assert_eq(x[2 * T + k], 0.0f, "padding");
        cr_assert_eq(y[2 * T + k], 0);
    }
    st_dataset_free(&train);
    st_dataset_free(&test);
    cr_assert_eq(st_text_dataset(&t, T, 9, 77, 0, &train, &test), ST_OK);
    cr_assert_eq(train.count, 77u, "--epoch-windows");
    cr_assert_eq(test.n_bytes, 4000u, "0: the whole tail");
    st_dataset_free(&train);
    st_dataset_free(&test);
    st_text tiny = { p, 40, 30 };
    cr_assert_eq(st_text_dataset(&tiny, T, 9, 0, 0, &train, &test), ST_ERR_FORMAT);
    cr_assert(strstr(st_last_error(), "validation text has 10 bytes"), "%s", st_last_error());
    free(p);
}

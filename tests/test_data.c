/*
 * tests/test_data.c — IDX reading (plain, gzip, and every way a file can be
 * wrong), datasets, Fashion-MNIST discovery, synthetic data, normalisation,
 * epoch orders and batch gathering.
 *
 * Each test gets a fresh scratch directory under /tmp (removed afterwards)
 * and writes its IDX files there.
 */
#include "testutil.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>

#include <criterion/criterion.h>
#include <zlib.h>

#include <subtrain/data.h>

static char tmpdir[ST_TEST_PATH_MAX];

static void setup(void)
{
    cr_assert_eq(st_test_mkdtemp(tmpdir), 0, "cannot create a scratch directory");
    st_clear_error();
}

static void teardown(void)
{
    st_test_rmdir(tmpdir);
}

TestSuite(idx, .init = setup, .fini = teardown);
TestSuite(dataset, .init = setup, .fini = teardown);
TestSuite(fashion, .init = setup, .fini = teardown);
TestSuite(synthetic);
TestSuite(epoch);

/* ------------------------------------------------------------ helpers */

/* A file image: header (magic, type, rank, big-endian dims) then payload.
 * The caller frees it; *len is its size. */
static unsigned char *idx_image(int type, int rank, const uint32_t *dims,
                                const void *payload, size_t payload_len, size_t *len)
{
    size_t head = 4 + 4 * (size_t)rank;
    unsigned char *buf = malloc(head + payload_len + 1);
    cr_assert_not_null(buf);
    buf[0] = 0;
    buf[1] = 0;
    buf[2] = (unsigned char)type;
    buf[3] = (unsigned char)rank;
    for (int i = 0; i < rank; i++) {
        buf[4 + 4 * i] = (unsigned char)(dims[i] >> 24);
        buf[5 + 4 * i] = (unsigned char)(dims[i] >> 16);
        buf[6 + 4 * i] = (unsigned char)(dims[i] >> 8);
        buf[7 + 4 * i] = (unsigned char)dims[i];
    }
    if (payload_len)
        memcpy(buf + head, payload, payload_len);
    *len = head + payload_len;
    return buf;
}

static void write_gz(const char *path, const void *data, size_t len)
{
    gzFile gz = gzopen(path, "wb");
    cr_assert_not_null(gz, "gzopen(%s) failed", path);
    if (len)
        cr_assert_eq(gzwrite(gz, data, (unsigned)len), (int)len);
    cr_assert_eq(gzclose(gz), Z_OK);
}

static void write_bytes(const char *path, const void *data, size_t len, int gz)
{
    if (gz)
        write_gz(path, data, len);
    else
        cr_assert_eq(st_test_write_file(path, data, len), 0, "cannot write %s", path);
}

/* Writes an unsigned-byte IDX file into the scratch directory; returns its
 * path in `path` (ST_TEST_PATH_MAX bytes). */
static char *write_idx(char *path, const char *name, int rank, const uint32_t *dims,
                       const void *payload, size_t payload_len, int gz)
{
    size_t len;
    unsigned char *img = idx_image(0x08, rank, dims, payload, payload_len, &len);
    st_test_path(path, tmpdir, name);
    write_bytes(path, img, len, gz);
    free(img);
    return path;
}

/* n bytes that look like pixels but do not compress to nothing, so that a
 * gzip of them has a real deflate stream to damage. */
static unsigned char *pixels(size_t n, uint32_t seed)
{
    unsigned char *p = malloc(n ? n : 1);
    cr_assert_not_null(p);
    uint32_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        p[i] = (unsigned char)((i % 28) * 9 + (s >> 28));
    }
    return p;
}

/* The failure contract of st_idx_read: the given status, a message naming
 * the file (and containing `needle` when given), and an empty array. */
static void expect_idx_fail(const char *path, st_status want, const char *needle)
{
    st_idx_array a;
    memset(&a, 0xAB, sizeof a);   // garbage in: the reader must clear it
    st_clear_error();
    st_status s = st_idx_read(path, &a);
    const char *msg = st_last_error();
    cr_assert_eq(s, want, "%s: status %s, expected %s (message: %s)", path,
                 st_status_name(s), st_status_name(want), msg);
    cr_assert(msg[0] != '\0', "no error message");
    cr_assert(strstr(msg, path), "message does not name the file: %s", msg);
    if (needle)
        cr_assert(strstr(msg, needle), "message lacks \"%s\": %s", needle, msg);
    cr_assert_null(a.data, "data left behind on failure");
    cr_assert_eq(a.count, 0);
    cr_assert_eq(a.rank, 0);
}

/* Writes raw bytes (a hand-made file) into the scratch directory. */
static char *write_raw(char *path, const char *name, const void *data, size_t len, int gz)
{
    st_test_path(path, tmpdir, name);
    write_bytes(path, data, len, gz);
    return path;
}

/* ------------------------------------------------------------ IDX: valid */

static void round_trip(int gz, size_t rows, size_t cols, size_t count)
{
    uint32_t dims[3] = { (uint32_t)count, (uint32_t)rows, (uint32_t)cols };
    size_t n = count * rows * cols;
    unsigned char *payload = pixels(n, 7);
    char path[ST_TEST_PATH_MAX];
    write_idx(path, gz ? "images.gz" : "images", 3, dims, payload, n, gz);

    st_idx_array a;
    cr_assert_eq(st_idx_read(path, &a), ST_OK, "%s", st_last_error());
    cr_assert_eq(a.rank, 3);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(a.dims[i], dims[i]);
    cr_assert_eq(a.count, n);
    cr_assert_not_null(a.data);
    cr_assert(memcmp(a.data, payload, n) == 0, "payload differs");
    st_idx_free(&a);
    cr_assert_null(a.data);
    cr_assert_eq(a.count, 0);
    free(payload);
}

Test(idx, plain_round_trip) { round_trip(0, 28, 28, 10); }
Test(idx, gzip_round_trip) { round_trip(1, 28, 28, 10); }

/* Over the 1 MiB first allocation: the buffer has to grow, twice. */
Test(idx, large_payload_grows_the_buffer)
{
    round_trip(1, 28, 28, 4000);   // 3136000 bytes
    round_trip(0, 28, 28, 4000);
}

Test(idx, rank_one_and_rank_four)
{
    char path[ST_TEST_PATH_MAX];
    unsigned char labels[5] = { 0, 9, 3, 3, 1 };
    uint32_t d1[1] = { 5 };
    write_idx(path, "labels", 1, d1, labels, 5, 0);
    st_idx_array a;
    cr_assert_eq(st_idx_read(path, &a), ST_OK, "%s", st_last_error());
    cr_assert_eq(a.rank, 1);
    cr_assert_eq(a.count, 5);
    cr_assert(memcmp(a.data, labels, 5) == 0);
    st_idx_free(&a);

    uint32_t d4[4] = { 2, 3, 4, 5 };
    unsigned char *p = pixels(120, 3);
    write_idx(path, "rank4", 4, d4, p, 120, 1);
    cr_assert_eq(st_idx_read(path, &a), ST_OK, "%s", st_last_error());
    cr_assert_eq(a.rank, 4);
    cr_assert_eq(a.count, 120);
    cr_assert(memcmp(a.data, p, 120) == 0);
    st_idx_free(&a);
    free(p);
}

Test(idx, free_is_safe_on_empty_and_null)
{
    st_idx_array a;
    memset(&a, 0, sizeof a);
    st_idx_free(&a);
    st_idx_free(NULL);
}

/* ------------------------------------------------------ IDX: bad header */

Test(idx, bad_magic)
{
    char path[ST_TEST_PATH_MAX];
    unsigned char bytes[] = { 0x1F, 0x00, 0x08, 0x01, 0, 0, 0, 1, 42 };
    write_raw(path, "magic", bytes, sizeof bytes, 0);
    expect_idx_fail(path, ST_ERR_FORMAT, "magic");
    write_raw(path, "magic.gz", bytes, sizeof bytes, 1);
    expect_idx_fail(path, ST_ERR_FORMAT, "magic");
}

Test(idx, unsupported_type)
{
    char path[ST_TEST_PATH_MAX];
    uint32_t dims[1] = { 1 };
    float f = 1.0f;
    size_t len;
    unsigned char *img = idx_image(0x0D, 1, dims, &f, sizeof f, &len);
    write_raw(path, "floats", img, len, 0);
    expect_idx_fail(path, ST_ERR_FORMAT, "0x0D (float)");
    free(img);

    img = idx_image(0x42, 1, dims, &f, 1, &len);
    write_raw(path, "weird", img, len, 0);
    expect_idx_fail(path, ST_ERR_FORMAT, "0x42");
    free(img);
}

Test(idx, rank_zero)
{
    char path[ST_TEST_PATH_MAX];
    unsigned char bytes[] = { 0, 0, 0x08, 0, 7 };
    write_raw(path, "rank0", bytes, sizeof bytes, 0);
    expect_idx_fail(path, ST_ERR_FORMAT, "rank 0");
}

Test(idx, rank_five)
{
    char path[ST_TEST_PATH_MAX];
    uint32_t dims[5] = { 1, 1, 1, 1, 1 };
    unsigned char px = 0;
    write_idx(path, "rank5", 5, dims, &px, 1, 0);
    expect_idx_fail(path, ST_ERR_FORMAT, "rank 5");
}

Test(idx, zero_dimension)
{
    char path[ST_TEST_PATH_MAX];
    uint32_t dims[3] = { 4, 0, 28 };
    write_idx(path, "zero", 3, dims, NULL, 0, 0);
    expect_idx_fail(path, ST_ERR_FORMAT, "is 0");
}

Test(idx, truncated_header)
{
    char path[ST_TEST_PATH_MAX];
    unsigned char two[] = { 0, 0 };
    write_raw(path, "two-bytes", two, sizeof two, 0);
    expect_idx_fail(path, ST_ERR_FORMAT, "header is truncated");

    /* Rank 3 promises 12 dimension bytes; give 6. */
    unsigned char partial[] = { 0, 0, 0x08, 3, 0, 0, 0, 10, 0, 0 };
    write_raw(path, "partial-dims", partial, sizeof partial, 0);
    expect_idx_fail(path, ST_ERR_FORMAT, "header is truncated");
    write_raw(path, "partial-dims.gz", partial, sizeof partial, 1);
    expect_idx_fail(path, ST_ERR_FORMAT, "header is truncated");
}

Test(idx, empty_file)
{
    char path[ST_TEST_PATH_MAX];
    write_raw(path, "empty", "", 0, 0);
    expect_idx_fail(path, ST_ERR_FORMAT, "empty");
    write_raw(path, "empty.gz", "", 0, 1);   // a valid gzip of nothing
    expect_idx_fail(path, ST_ERR_FORMAT, "empty");
}

Test(idx, nonexistent_file)
{
    char path[ST_TEST_PATH_MAX];
    st_test_path(path, tmpdir, "no-such-file.gz");
    expect_idx_fail(path, ST_ERR_IO, "No such file");
}

Test(idx, directory_is_an_io_error)
{
    expect_idx_fail(tmpdir, ST_ERR_IO, NULL);
}

Test(idx, null_arguments)
{
    st_idx_array a;
    cr_assert_eq(st_idx_read(NULL, &a), ST_ERR_INVALID);
    cr_assert_null(a.data);
    cr_assert_eq(st_idx_read("x", NULL), ST_ERR_INVALID);
}

/* ----------------------------------------------------- IDX: bad payload */

Test(idx, truncated_payload)
{
    char path[ST_TEST_PATH_MAX];
    uint32_t dims[2] = { 10, 4 };
    unsigned char *p = pixels(40, 1);
    write_idx(path, "short", 2, dims, p, 30, 0);
    expect_idx_fail(path, ST_ERR_FORMAT, "declares 10 x 4 = 40 bytes but holds only 30");
    write_idx(path, "short.gz", 2, dims, p, 30, 1);
    expect_idx_fail(path, ST_ERR_FORMAT, "holds only 30");
    free(p);
}

Test(idx, trailing_bytes)
{
    char path[ST_TEST_PATH_MAX];
    uint32_t dims[2] = { 10, 4 };
    unsigned char *p = pixels(41, 1);
    write_idx(path, "long", 2, dims, p, 41, 0);
    expect_idx_fail(path, ST_ERR_FORMAT, "1 trailing bytes");
    write_idx(path, "long.gz", 2, dims, p, 41, 1);
    expect_idx_fail(path, ST_ERR_FORMAT, "trailing");
    free(p);
}

/* ------------------------------------------------------- IDX: bad gzip */

/* A valid gzip IDX file of a few tens of KiB; returns its bytes. */
static unsigned char *gz_idx_bytes(size_t *len)
{
    uint32_t dims[3] = { 64, 28, 28 };
    size_t n = 64 * 28 * 28;
    unsigned char *p = pixels(n, 11);
    char tmp[ST_TEST_PATH_MAX];
    write_idx(tmp, "source.gz", 3, dims, p, n, 1);
    free(p);
    unsigned char *bytes = st_test_read_file(tmp, len);
    cr_assert_not_null(bytes);
    cr_assert_gt(*len, 1000, "the gzip file is too small to damage meaningfully");
    return bytes;
}

Test(idx, corrupt_gzip)
{
    size_t len;
    unsigned char *good = gz_idx_bytes(&len);
    unsigned char *bad = malloc(len);
    cr_assert_not_null(bad);
    char path[ST_TEST_PATH_MAX];
    /* Several places in the deflate stream: each damage must be caught,
     * by a bad code or, failing that, by the CRC check at the end. */
    size_t where[] = { len / 3, len / 2, 2 * len / 3 };
    for (size_t w = 0; w < sizeof where / sizeof where[0]; w++) {
        memcpy(bad, good, len);
        for (size_t i = 0; i < 16; i++)
            bad[where[w] + i] ^= 0x5A;
        write_raw(path, "corrupt.gz", bad, len, 0);
        expect_idx_fail(path, ST_ERR_FORMAT, "gzip stream is corrupt");
    }
    free(bad);
    free(good);
}

Test(idx, crc_mismatch)
{
    size_t len;
    unsigned char *bytes = gz_idx_bytes(&len);
    bytes[len - 8] ^= 0x01;   // the stored CRC-32, first of the 8 trailer bytes
    char path[ST_TEST_PATH_MAX];
    write_raw(path, "crc.gz", bytes, len, 0);
    expect_idx_fail(path, ST_ERR_FORMAT, "gzip stream is corrupt");
    free(bytes);
}

Test(idx, truncated_gzip)
{
    size_t len;
    unsigned char *bytes = gz_idx_bytes(&len);
    char path[ST_TEST_PATH_MAX];
    write_raw(path, "half.gz", bytes, len / 2, 0);
    expect_idx_fail(path, ST_ERR_FORMAT, "gzip stream is truncated");
    /* All the data but not the trailer: the payload is complete, the
     * stream is not. */
    write_raw(path, "no-trailer.gz", bytes, len - 4, 0);
    expect_idx_fail(path, ST_ERR_FORMAT, "gzip stream is truncated");
    /* Inside the gzip header itself. */
    write_raw(path, "stub.gz", bytes, 6, 0);
    expect_idx_fail(path, ST_ERR_FORMAT, "truncated");
    free(bytes);
}

/* ----------------------------------------------------- IDX: absurd sizes */

Test(idx, overflowing_dimensions)
{
    char path[ST_TEST_PATH_MAX];
    uint32_t dims[4] = { 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu };
    unsigned char px[16] = { 0 };
    write_idx(path, "overflow", 4, dims, px, sizeof px, 0);
    expect_idx_fail(path, ST_ERR_FORMAT, "limit");
}

Test(idx, two_gib_declared)
{
    char path[ST_TEST_PATH_MAX];
    uint32_t dims[2] = { 0x8000u, 0x10000u };   // 2^31 bytes
    unsigned char px[16] = { 0 };
    write_idx(path, "huge", 2, dims, px, sizeof px, 0);
    expect_idx_fail(path, ST_ERR_FORMAT, "limit");
    write_idx(path, "huge.gz", 2, dims, px, sizeof px, 1);
    expect_idx_fail(path, ST_ERR_FORMAT, "limit");
}

/* AddressSanitizer maps terabytes of shadow memory and cannot live under a
 * data-size limit. */
#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif

/* Under the limit but far more than the file holds: must fail on the data,
 * not by allocating the declared gigabyte.  The data-size limit makes a
 * blind 1e9-byte malloc fail, which would show as ST_ERR_NOMEM. */
Test(idx, large_declaration_small_file_does_not_allocate_it)
{
#ifndef UNDER_ASAN
    struct rlimit lim = { (rlim_t)512 << 20, (rlim_t)512 << 20 };
    cr_assert_eq(setrlimit(RLIMIT_DATA, &lim), 0);
#endif
    char path[ST_TEST_PATH_MAX];
    uint32_t dims[3] = { 1000, 1000, 1000 };   // 10^9 bytes < 1 GiB
    unsigned char *p = pixels(3000, 5);
    write_idx(path, "liar", 3, dims, p, 3000, 0);
    expect_idx_fail(path, ST_ERR_FORMAT, "holds only 3000");
    write_idx(path, "liar.gz", 3, dims, p, 3000, 1);
    expect_idx_fail(path, ST_ERR_FORMAT, "holds only 3000");
    free(p);
}

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

static void expect_dataset_empty(const st_dataset *d)
{
    cr_assert_null(d->x);
    cr_assert_null(d->y);
    cr_assert_eq(d->count, 0);
    cr_assert_eq(d->dim, 0);
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

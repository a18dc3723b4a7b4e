/*
 * tests/test_data.c — IDX reading (plain, gzip, and every way a file can be
 * wrong), datasets, Fashion-MNIST discovery, IDX sets of any class count,
 * CIFAR-10 and CIFAR-100 binaries, synthetic data, normalisation, epoch
 * orders, batch gathering and augmentation.
 *
 * Each test gets a fresh scratch directory under /tmp (removed afterwards)
 * and writes its IDX and CIFAR files there.
 */
#define _GNU_SOURCE   /* heapwatch.h: RTLD_NEXT */
#include "testutil.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <criterion/criterion.h>
#include <oneapi/dnnl/dnnl.h>
#include <zlib.h>

#include <subtrain/subtrain.h>

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
TestSuite(idxset, .init = setup, .fini = teardown);
TestSuite(cifar, .init = setup, .fini = teardown);
TestSuite(augment, .init = setup, .fini = teardown);
TestSuite(text, .init = setup, .fini = teardown);

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

/* Garbage after a gzip stream is refused as it is after a plain file;
 * concatenated gzip members are one stream, as gzip -d reads them. */
Test(idx, gzip_trailing_garbage_and_concatenated_members)
{
    uint32_t dims[2] = { 10, 40 };
    unsigned char *p = pixels(400, 3);
    size_t hlen, glen;
    unsigned char *head = idx_image(0x08, 2, dims, p, 400, &hlen);
    char path[ST_TEST_PATH_MAX], g1[ST_TEST_PATH_MAX], g2[ST_TEST_PATH_MAX];
    /* the IDX bytes as two gzip members: header and 150 bytes, the rest */
    write_raw(g1, "part1.gz", head, hlen - 250, 1);
    write_raw(g2, "part2.gz", head + hlen - 250, 250, 1);
    size_t l1 = 0, l2 = 0;
    unsigned char *m1 = st_test_read_file(g1, &l1), *m2 = st_test_read_file(g2, &l2);
    cr_assert(m1 && m2);
    unsigned char *cat = malloc(l1 + l2 + hlen + 100);
    cr_assert_not_null(cat);
    memcpy(cat, m1, l1);
    memcpy(cat + l1, m2, l2);
    write_raw(path, "two-members.gz", cat, l1 + l2, 0);
    st_idx_array a;
    cr_assert_eq(st_idx_read(path, &a), ST_OK, "%s", st_last_error());
    cr_assert_eq(a.count, 400);
    cr_assert_eq(memcmp(a.data, p, 400), 0, "the members' bytes in order");
    st_idx_free(&a);
    /* one member and 100 bytes of garbage: refused like the plain file */
    for (size_t i = 0; i < 100; i++)
        cat[l1 + i] = (unsigned char)(i * 37 + 5);
    write_raw(path, "garbage.gz", cat, l1 + 100, 0);
    expect_idx_fail(path, ST_ERR_FORMAT, "100 trailing bytes after the gzip stream");
    /* a whole file and garbage, one byte of it */
    unsigned char *whole = st_test_read_file(write_idx(g1, "whole.gz", 2, dims, p, 400, 1),
                                             &glen);
    cr_assert_not_null(whole);
    unsigned char *more = realloc(whole, glen + 1);
    cr_assert_not_null(more);
    more[glen] = 0;
    write_raw(path, "garbage1.gz", more, glen + 1, 0);
    expect_idx_fail(path, ST_ERR_FORMAT, "1 trailing bytes after the gzip stream");
    /* the plain reader's wording for the same 100 bytes */
    memcpy(cat, head, hlen);
    memset(cat + hlen, 0x55, 100);
    write_raw(path, "garbage", cat, hlen + 100, 0);
    expect_idx_fail(path, ST_ERR_FORMAT, "100 trailing bytes");
    free(more);
    free(cat);
    free(m1);
    free(m2);
    free(head);
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

/* ------------------------------------------------------------ augmentation */

/* The 3 x 3 image 1..9 padded by one zero pixel, every crop window of the
 * 5 x 5 padded image, written out by hand for three of them. */
Test(augment, crop_and_flip_of_a_known_image)
{
    const float img[9] = { 1, 2, 3, 4, 5, 6, 7, 8, 9 };
    float out[9];
    st_augment_choice c = { 0, 0, 0 };   /* the window's corner at the padding's */
    st_augment_apply(&c, 1, 1, 3, 3, img, out);
    const float down_right[9] = { 0, 0, 0, 0, 1, 2, 0, 4, 5 };
    cr_assert(memcmp(out, down_right, sizeof out) == 0);
    c.flip = 1;
    st_augment_apply(&c, 1, 1, 3, 3, img, out);
    const float down_right_flipped[9] = { 0, 0, 0, 2, 1, 0, 5, 4, 0 };
    cr_assert(memcmp(out, down_right_flipped, sizeof out) == 0);
    c = (st_augment_choice){ 2, 1, 0 };   /* one row up, columns as they are */
    st_augment_apply(&c, 1, 1, 3, 3, img, out);
    const float up[9] = { 4, 5, 6, 7, 8, 9, 0, 0, 0 };
    cr_assert(memcmp(out, up, sizeof out) == 0);
    c = (st_augment_choice){ 1, 1, 1 };   /* no shift, mirrored */
    st_augment_apply(&c, 1, 1, 3, 3, img, out);
    const float mirrored[9] = { 3, 2, 1, 6, 5, 4, 9, 8, 7 };
    cr_assert(memcmp(out, mirrored, sizeof out) == 0);
    c = (st_augment_choice){ 1, 2, 0 };   /* one column left */
    st_augment_apply(&c, 1, 1, 3, 3, img, out);
    const float left[9] = { 2, 3, 0, 5, 6, 0, 8, 9, 0 };
    cr_assert(memcmp(out, left, sizeof out) == 0);
}

/* Every window and flip of a 2 x 4 x 5 image against the definition:
 * out(c, y, x) = padded(c, y + top, x' + left), x' = x or W-1-x. */
Test(augment, every_window_matches_the_definition)
{
    enum { C = 2, H = 4, W = 5, P = 3 };
    float img[C * H * W], out[C * H * W];
    for (int i = 0; i < C * H * W; i++)
        img[i] = (float)(i + 1);   /* no pixel is 0: a 0 is padding */
    for (uint32_t top = 0; top <= 2 * P; top++)
        for (uint32_t left = 0; left <= 2 * P; left++)
            for (int flip = 0; flip < 2; flip++) {
                st_augment_choice c = { top, left, flip };
                memset(out, 0xFF, sizeof out);
                st_augment_apply(&c, P, C, H, W, img, out);
                for (int ch = 0; ch < C; ch++)
                    for (int y = 0; y < H; y++)
                        for (int x = 0; x < W; x++) {
                            int xw = flip ? W - 1 - x : x;
                            int sy = y + (int)top - P, sx = xw + (int)left - P;
                            float want = sy >= 0 && sy < H && sx >= 0 && sx < W
                                             ? img[(ch * H + sy) * W + sx] : 0.0f;
                            cr_assert_eq(out[(ch * H + y) * W + x], want,
                                         "top %u left %u flip %d: (%d, %d, %d)", top, left,
                                         flip, ch, y, x);
                        }
            }
}

Test(augment, padding_is_zeros_and_flip_twice_is_identity)
{
    enum { C = 3, H = 6, W = 7, P = 2 };
    float img[C * H * W], a[C * H * W], b[C * H * W];
    for (int i = 0; i < C * H * W; i++)
        img[i] = 0.5f + (float)i;
    /* the window at the padded image's corner: P rows and P columns of 0 */
    st_augment_choice c = { 0, 0, 0 };
    st_augment_apply(&c, P, C, H, W, img, a);
    for (int ch = 0; ch < C; ch++)
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++) {
                float v = a[(ch * H + y) * W + x];
                if (y < P || x < P)
                    cr_assert_eq(v, 0.0f, "padding (%d, %d, %d) is %g", ch, y, x, v);
                else
                    cr_assert_eq(v, img[(ch * H + y - P) * W + x - P]);
            }
    /* the centre window, flipped twice, is the image */
    c = (st_augment_choice){ P, P, 1 };
    st_augment_apply(&c, P, C, H, W, img, a);
    cr_assert(memcmp(a, img, sizeof img) != 0);
    st_augment_apply(&c, P, C, H, W, a, b);
    cr_assert(memcmp(b, img, sizeof img) == 0);
    c.flip = 0;
    st_augment_apply(&c, P, C, H, W, img, a);
    cr_assert(memcmp(a, img, sizeof img) == 0, "the centre window unflipped: the image");
}

Test(augment, draws_depend_on_seed_epoch_and_index_only)
{
    st_augment a = { .crop = 4, .flip = 1, .seed = 7 };
    uint32_t seen_top[9] = { 0 }, seen_left[9] = { 0 }, flips = 0, differ_epoch = 0;
    const uint32_t N = 4000;
    for (uint32_t i = 0; i < N; i++) {
        st_augment_choice c = st_augment_draw(&a, 3, i), d = st_augment_draw(&a, 3, i);
        cr_assert(c.top == d.top && c.left == d.left && c.flip == d.flip, "a pure function");
        cr_assert(c.top <= 8 && c.left <= 8 && (c.flip == 0 || c.flip == 1));
        seen_top[c.top]++;
        seen_left[c.left]++;
        flips += (uint32_t)c.flip;
        st_augment_choice e = st_augment_draw(&a, 4, i);
        differ_epoch += c.top != e.top || c.left != e.left || c.flip != e.flip;
    }
    for (int k = 0; k <= 8; k++)
        cr_assert(seen_top[k] > N / 9 / 2 && seen_left[k] > N / 9 / 2,
                  "offset %d: %u, %u of %u", k, seen_top[k], seen_left[k], N);
    cr_assert(flips > N / 2 - N / 10 && flips < N / 2 + N / 10, "p = 1/2: %u of %u", flips, N);
    cr_assert_gt(differ_epoch, N * 9 / 10, "another epoch, other draws: %u of %u differ",
                 differ_epoch, N);
    /* another seed, other draws */
    st_augment b = a;
    b.seed = 8;
    uint32_t differ_seed = 0;
    for (uint32_t i = 0; i < 100; i++) {
        st_augment_choice c = st_augment_draw(&a, 3, i), e = st_augment_draw(&b, 3, i);
        differ_seed += c.top != e.top || c.left != e.left || c.flip != e.flip;
    }
    cr_assert_gt(differ_seed, 80);
    /* a flip alone leaves the window centred; a crop alone never flips */
    st_augment f = { .flip = 1, .seed = 7 }, k = { .crop = 2, .seed = 7 };
    for (uint32_t i = 0; i < 100; i++) {
        st_augment_choice c = st_augment_draw(&f, 0, i), e = st_augment_draw(&k, 0, i);
        cr_assert(c.top == 0 && c.left == 0);
        cr_assert_eq(e.flip, 0);
    }
}

/* n images 3 x 8 x 8 with pixel values that say where they come from. */
static void image_set(st_dataset *d, uint32_t n)
{
    memset(d, 0, sizeof *d);
    d->count = n;
    d->channels = 3;
    d->height = 8;
    d->width = 8;
    d->dim = 192;
    d->n_classes = 5;
    d->x = malloc((size_t)n * 192 * sizeof(float));
    d->y = malloc(n);
    cr_assert(d->x && d->y);
    for (uint32_t i = 0; i < n; i++) {
        d->y[i] = (uint8_t)(i % 5);
        for (int j = 0; j < 192; j++)
            d->x[(size_t)i * 192 + j] = (float)(i * 1000 + j + 1);
    }
}

Test(augment, the_training_gather)
{
    st_dataset d;
    image_set(&d, 64);
    uint32_t idx[64], rev[64];
    for (uint32_t i = 0; i < 64; i++) {
        idx[i] = i;
        rev[i] = 63 - i;
    }
    float *plain = malloc(64 * 192 * sizeof(float)), *a = malloc(64 * 192 * sizeof(float)),
          *b = malloc(64 * 192 * sizeof(float)), *e = malloc(64 * 192 * sizeof(float));
    int32_t ya[64], yb[64];
    st_dataset_gather(&d, idx, 64, plain, ya);

    /* no augmentation: the plain gather, to the bit */
    st_dataset_gather_train(&d, 5, idx, 64, a, yb);
    cr_assert(memcmp(a, plain, 64 * 192 * sizeof(float)) == 0);
    cr_assert(memcmp(ya, yb, sizeof ya) == 0);

    d.augment = (st_augment){ .crop = 2, .flip = 1, .seed = 3 };
    cr_assert_eq(st_augment_check(&d.augment, &d), ST_OK, "%s", st_last_error());
    st_dataset_gather_train(&d, 5, idx, 64, a, ya);
    st_dataset_gather_train(&d, 5, idx, 64, b, yb);
    cr_assert(memcmp(a, b, 64 * 192 * sizeof(float)) == 0, "same (seed, epoch, index)");
    cr_assert(memcmp(ya, yb, sizeof ya) == 0);
    for (uint32_t i = 0; i < 64; i++)
        cr_assert_eq(ya[i], d.y[i], "labels as stored");
    cr_assert(memcmp(a, plain, 64 * 192 * sizeof(float)) != 0, "augmented");
    /* each sample is what st_augment_draw and st_augment_apply make of it */
    for (uint32_t i = 0; i < 64; i++) {
        st_augment_choice c = st_augment_draw(&d.augment, 5, i);
        float one[192];
        st_augment_apply(&c, 2, 3, 8, 8, d.x + (size_t)i * 192, one);
        cr_assert(memcmp(one, a + (size_t)i * 192, sizeof one) == 0, "sample %u", i);
    }
    /* the batch position does not matter, the sample does */
    st_dataset_gather_train(&d, 5, rev, 64, b, yb);
    for (uint32_t i = 0; i < 64; i++)
        cr_assert(memcmp(b + (size_t)i * 192, a + (size_t)(63 - i) * 192,
                         192 * sizeof(float)) == 0, "sample %u", 63 - i);
    /* another epoch, another augmentation */
    st_dataset_gather_train(&d, 6, idx, 64, e, yb);
    int differ = 0;
    for (uint32_t i = 0; i < 64; i++)
        differ += memcmp(e + (size_t)i * 192, a + (size_t)i * 192, 192 * sizeof(float)) != 0;
    cr_assert_gt(differ, 48, "epochs 5 and 6: only %d of 64 samples differ", differ);
    free(plain);
    free(a);
    free(b);
    free(e);
    st_dataset_free(&d);
}

Test(augment, check_refuses_what_does_not_fit)
{
    st_dataset d;
    image_set(&d, 2);
    st_augment a = { .crop = 7, .flip = 1 };
    cr_assert_eq(st_augment_check(&a, &d), ST_OK, "%s", st_last_error());
    a.crop = 8;
    cr_assert_eq(st_augment_check(&a, &d), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "--augment-crop") && strstr(st_last_error(), "8x8"),
              "%s", st_last_error());
    st_augment none = { 0 };
    cr_assert_eq(st_augment_check(&none, &d), ST_OK);
    /* no image shape: the synthetic task */
    d.channels = 192;
    d.height = d.width = 1;
    st_augment flip = { .flip = 1 };
    cr_assert_eq(st_augment_check(&flip, &d), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "--augment-flip") && strstr(st_last_error(), "192x1x1"),
              "%s", st_last_error());
    cr_assert_eq(st_augment_check(&none, &d), ST_OK, "nothing asked, nothing to refuse");
    /* a shape that does not multiply to dim, or none at all */
    d.channels = 0;
    cr_assert_eq(st_augment_check(&flip, &d), ST_ERR_INVALID);
    d.channels = 2;
    d.height = d.width = 8;
    cr_assert_eq(st_augment_check(&flip, &d), ST_ERR_INVALID);
    st_dataset_free(&d);
}

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

Test(augment, an_augmented_gather_makes_no_heap_call)
{
    HEAPWATCH_SKIP_IF_OFF();
    st_dataset d;
    image_set(&d, 256);
    d.augment = (st_augment){ .crop = 3, .flip = 1, .seed = 11 };
    uint32_t *order = malloc(256 * sizeof *order);
    float *x = malloc(128 * 192 * sizeof *x);
    int32_t *y = malloc(128 * sizeof *y);
    st_epoch_order(1, 0, order, 256);
    /* the interposer sees calls: one here (through a volatile pointer, so
     * that the compiler cannot drop the malloc/free pair) */
    void *(*volatile alloc)(size_t) = malloc;
    armed = 1;
    void *probe = alloc(16);
    armed = 0;
    free(probe);
    cr_assert_eq(heap_calls, 1, "the interposer counts");
    heap_calls = 0;
    armed = 1;
    for (uint64_t epoch = 0; epoch < 4; epoch++) {
        st_dataset_gather_train(&d, epoch, order, 128, x, y);
        st_dataset_gather_train(&d, epoch, order + 128, 128, x, y);
    }
    armed = 0;
    cr_assert_eq(heap_calls, 0, "8 augmented gathers called the heap %ld times", heap_calls);
    free(order);
    free(x);
    free(y);
    st_dataset_free(&d);
}

/* A learnable 1 x 8 x 8 task: the class is the bright quadrant. */
static void quadrant_set(st_dataset *d, uint32_t n, uint32_t seed)
{
    memset(d, 0, sizeof *d);
    d->count = n;
    d->channels = 1;
    d->height = d->width = 8;
    d->dim = 64;
    d->n_classes = 4;
    d->x = malloc((size_t)n * 64 * sizeof(float));
    d->y = malloc(n);
    cr_assert(d->x && d->y);
    uint32_t s = seed * 2654435761u + 7;
    for (uint32_t i = 0; i < n; i++) {
        int q = (int)(i % 4);
        d->y[i] = (uint8_t)q;
        for (int yy = 0; yy < 8; yy++)
            for (int xx = 0; xx < 8; xx++) {
                s = s * 1664525u + 1013904223u;
                float v = (float)(s >> 8) / 16777216.0f;
                if ((yy / 4) * 2 + xx / 4 == q)
                    v += 1.5f;
                d->x[(size_t)i * 64 + yy * 8 + xx] = v;
            }
    }
}

static st_epoch_record augmented_run(int crop, int flip, int workers)
{
    st_dataset train, test;
    quadrant_set(&train, 512, 1);
    quadrant_set(&test, 128, 2);
    st_dataset_normalize_channels(&train, &test, NULL, NULL, 0);
    train.augment = (st_augment){ .crop = (uint32_t)crop, .flip = flip, .seed = 9 };
    st_train_config c = st_train_config_default();
    c.model.kind = ST_MODEL_MLP;
    c.model.depth = 1;
    c.model.width = 32;
    c.model.in_dim = 64;
    c.model.n_classes = 4;
    c.batch = 32 / workers;
    c.epochs = 2;
    c.seed = 9;
    c.workers = workers;
    c.oversubscribe = 1;
    st_epoch_record final;
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, &final), ST_OK, "%s", st_last_error());
    st_dataset_free(&train);
    st_dataset_free(&test);
    return final;
}

Test(augment, augmented_training_is_reproducible, .timeout = 120)
{
    st_epoch_record a = augmented_run(2, 1, 1), b = augmented_run(2, 1, 1);
    st_epoch_record plain = augmented_run(0, 0, 1);
    cr_assert(a.train_loss == b.train_loss && a.test_loss == b.test_loss,
              "same seed, same run: %.9g %.9g", a.train_loss, b.train_loss);
    cr_assert(a.train_loss != plain.train_loss, "the workers apply the augmentation");
    /* two workers: the same global batches, whichever thread loads them */
    st_epoch_record c = augmented_run(2, 1, 2), d = augmented_run(2, 1, 2);
    cr_assert(c.train_loss == d.train_loss && c.test_loss == d.test_loss,
              "two workers, same seed: %.9g %.9g", c.train_loss, d.train_loss);
    cr_assert(c.train_loss != augmented_run(0, 0, 2).train_loss);
    /* a crop the images cannot take is refused before training */
    st_dataset train, test;
    quadrant_set(&train, 64, 1);
    quadrant_set(&test, 32, 2);
    train.augment.crop = 8;
    st_train_config cfg = st_train_config_default();
    cfg.model.in_dim = 64;
    cfg.model.n_classes = 4;
    cfg.batch = 16;
    cr_assert_eq(st_train_run(&cfg, &train, &test, NULL, NULL), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "--augment-crop"), "%s", st_last_error());
    st_dataset_free(&train);
    st_dataset_free(&test);
}

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

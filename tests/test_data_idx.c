/*
 * tests/test_data_idx.c — IDX reading: plain and gzip files, and every way
 * a file can be wrong (header, payload, gzip stream, absurd sizes).
 *
 * The scratch directory and the IDX writers: tests/data_check.h.
 */
#include "data_check.h"

#include <sys/resource.h>

TestSuite(idx, .init = setup, .fini = teardown);

/* ------------------------------------------------------------ IDX: valid */

/* st_idx_read_shape gives st_idx_read's verdict: the same status and
 * message, and on success the same header, without the payload. */
static void expect_shape_as_read(const char *path)
{
    st_idx_array a, h;
    st_clear_error();
    st_status want = st_idx_read(path, &a);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", st_last_error());
    memset(&h, 0xAB, sizeof h);
    st_clear_error();
    st_status got = st_idx_read_shape(path, &h);
    cr_assert_eq(got, want, "%s: the shape read says %s, the read %s (%s / %s)", path,
                 st_status_name(got), st_status_name(want), st_last_error(), msg);
    cr_assert_str_eq(st_last_error(), msg, "%s: the two reads' messages", path);
    cr_assert_null(h.data, "%s: the shape read holds a payload", path);
    cr_assert(h.rank == a.rank && h.count == a.count, "%s: rank %d, %zu bytes against %d, %zu",
              path, h.rank, h.count, a.rank, a.count);
    for (int i = 0; i < a.rank; i++)
        cr_assert_eq(h.dims[i], a.dims[i], "%s: dimension %d", path, i);
    st_idx_free(&a);
}

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
    expect_shape_as_read(path);
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
    expect_shape_as_read(path);
    write_idx(path, "short.gz", 2, dims, p, 30, 1);
    expect_idx_fail(path, ST_ERR_FORMAT, "holds only 30");
    expect_shape_as_read(path);
    free(p);
}

Test(idx, trailing_bytes)
{
    char path[ST_TEST_PATH_MAX];
    uint32_t dims[2] = { 10, 4 };
    unsigned char *p = pixels(41, 1);
    write_idx(path, "long", 2, dims, p, 41, 0);
    expect_idx_fail(path, ST_ERR_FORMAT, "1 trailing bytes");
    expect_shape_as_read(path);
    write_idx(path, "long.gz", 2, dims, p, 41, 1);
    expect_idx_fail(path, ST_ERR_FORMAT, "trailing");
    expect_shape_as_read(path);
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
    expect_shape_as_read(path);   /* the last member records 250 bytes: read through */
    /* one member and 100 bytes of garbage: refused like the plain file */
    for (size_t i = 0; i < 100; i++)
        cat[l1 + i] = (unsigned char)(i * 37 + 5);
    write_raw(path, "garbage.gz", cat, l1 + 100, 0);
    expect_idx_fail(path, ST_ERR_FORMAT, "100 trailing bytes after the gzip stream");
    expect_shape_as_read(path);
    /* a whole file and garbage, one byte of it */
    unsigned char *whole = st_test_read_file(write_idx(g1, "whole.gz", 2, dims, p, 400, 1),
                                             &glen);
    cr_assert_not_null(whole);
    unsigned char *more = realloc(whole, glen + 1);
    cr_assert_not_null(more);
    more[glen] = 0;
    write_raw(path, "garbage1.gz", more, glen + 1, 0);
    expect_idx_fail(path, ST_ERR_FORMAT, "1 trailing bytes after the gzip stream");
    expect_shape_as_read(path);
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
    /* the shape read decompresses nothing: a stream of the recorded
     * length is taken as it is (the run's read reports the damage) */
    st_idx_array h;
    cr_assert_eq(st_idx_read_shape(path, &h), ST_OK, "%s", st_last_error());
    cr_assert(h.count == 64 * 28 * 28 && h.data == NULL);
    free(bytes);
}

Test(idx, truncated_gzip)
{
    size_t len;
    unsigned char *bytes = gz_idx_bytes(&len);
    char path[ST_TEST_PATH_MAX];
    write_raw(path, "half.gz", bytes, len / 2, 0);
    expect_idx_fail(path, ST_ERR_FORMAT, "gzip stream is truncated");
    expect_shape_as_read(path);
    /* All the data but not the trailer: the payload is complete, the
     * stream is not. */
    write_raw(path, "no-trailer.gz", bytes, len - 4, 0);
    expect_idx_fail(path, ST_ERR_FORMAT, "gzip stream is truncated");
    expect_shape_as_read(path);
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

/*
 * tests/data_check.h — what the suites of the data readers share
 * (tests/test_data_*.c): a scratch directory per test, IDX files written by
 * hand (plain or gzip, valid or not), the failure contract of st_idx_read,
 * and the check of a dataset left empty.  Header-only, every function
 * static inline.
 *
 * Each test of a suite with setup and teardown gets a fresh scratch
 * directory under /tmp (removed afterwards) and writes its IDX and CIFAR
 * files there.
 */
#ifndef SUBTRAIN_TESTS_DATA_CHECK_H
#define SUBTRAIN_TESTS_DATA_CHECK_H

#include "testutil.h"

#include <stdint.h>
#include <string.h>

#include <criterion/criterion.h>
#include <zlib.h>

#include <subtrain/subtrain.h>

static char tmpdir[ST_TEST_PATH_MAX];

static inline void setup(void)
{
    cr_assert_eq(st_test_mkdtemp(tmpdir), 0, "cannot create a scratch directory");
    st_clear_error();
}

static inline void teardown(void)
{
    st_test_rmdir(tmpdir);
}

/* ------------------------------------------------------------ helpers */

/* A file image: header (magic, type, rank, big-endian dims) then payload.
 * The caller frees it; *len is its size. */
static inline unsigned char *idx_image(int type, int rank, const uint32_t *dims,
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

static inline void write_gz(const char *path, const void *data, size_t len)
{
    gzFile gz = gzopen(path, "wb");
    cr_assert_not_null(gz, "gzopen(%s) failed", path);
    if (len)
        cr_assert_eq(gzwrite(gz, data, (unsigned)len), (int)len);
    cr_assert_eq(gzclose(gz), Z_OK);
}

static inline void write_bytes(const char *path, const void *data, size_t len, int gz)
{
    if (gz)
        write_gz(path, data, len);
    else
        cr_assert_eq(st_test_write_file(path, data, len), 0, "cannot write %s", path);
}

/* Writes an unsigned-byte IDX file into the scratch directory; returns its
 * path in `path` (ST_TEST_PATH_MAX bytes). */
static inline char *write_idx(char *path, const char *name, int rank, const uint32_t *dims,
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
static inline unsigned char *pixels(size_t n, uint32_t seed)
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
static inline void expect_idx_fail(const char *path, st_status want, const char *needle)
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
static inline char *write_raw(char *path, const char *name, const void *data, size_t len, int gz)
{
    st_test_path(path, tmpdir, name);
    write_bytes(path, data, len, gz);
    return path;
}

/* ------------------------------------------------------------ datasets */

static inline void expect_dataset_empty(const st_dataset *d)
{
    cr_assert_null(d->x);
    cr_assert_null(d->y);
    cr_assert_eq(d->count, 0);
    cr_assert_eq(d->dim, 0);
}

#endif /* SUBTRAIN_TESTS_DATA_CHECK_H */

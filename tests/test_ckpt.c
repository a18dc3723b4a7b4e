/*
 * tests/test_ckpt.c — safetensors files: the writer's bytes against the
 * format as its specification writes it, a file written by hand (as
 * another writer would) read back, every way a file can be wrong refused
 * with its name, atomic replacement under kill -9, and a model's weights
 * round-tripped and refused for another model.
 */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include <subtrain/subtrain.h>

#include "testutil.h"

static char tmpdir[ST_TEST_PATH_MAX];

static void setup(void) { cr_assert_eq(st_test_mkdtemp(tmpdir), 0); }
static void teardown(void) { st_test_rmdir(tmpdir); }

TestSuite(safetensors, .init = setup, .fini = teardown);
TestSuite(weights, .init = setup, .fini = teardown);

static void write_raw(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(p, 1, n, f), n);
    fclose(f);
}

/* header bytes + data into a file, as the format lays them out */
static void write_file(const char *path, const char *header, const void *data, size_t n)
{
    const size_t h = strlen(header);
    unsigned char *b = malloc(8 + h + n);
    cr_assert_not_null(b);
    for (int k = 0; k < 8; k++)
        b[k] = (unsigned char)((uint64_t)h >> (8 * k));
    memcpy(b + 8, header, h);
    memcpy(b + 8 + h, data, n);
    write_raw(path, b, 8 + h + n);
    free(b);
}

/* The writer's bytes are the format's: the length, the JSON (metadata
 * first, tensors in order, offsets back to back, escapes), spaces to an
 * 8-byte boundary, then the data. */
Test(safetensors, the_writer_writes_the_format)
{
    char path[ST_TEST_PATH_MAX];
    st_test_path(path, tmpdir, "a.safetensors");
    const float w[6] = { 1, 2, 3, 4, 5, 6 };
    const uint8_t u[3] = { 7, 8, 9 };
    const uint64_t step = 12345678901ull;
    st_safetensors_tensor t[3] = {
        { .name = "w", .dtype = ST_DTYPE_F32, .ndims = 2, .shape = { 2, 3 }, .data = w },
        { .name = "bytes", .dtype = ST_DTYPE_U8, .ndims = 1, .shape = { 3 }, .data = u },
        { .name = "step", .dtype = ST_DTYPE_U64, .ndims = 0, .data = &step },
    };
    const st_safetensors_meta_entry meta[1] = { { "note", "a \"quoted\"\n value" } };
    cr_assert_eq(st_safetensors_write(path, t, 3, meta, 1), ST_OK, "%s", st_last_error());
    size_t n = 0;
    unsigned char *b = st_test_read_file(path, &n);
    cr_assert_not_null(b);
    /* the data's CRC-32 last in the metadata (zlib's, of the 35 bytes) */
    unsigned char data[35];
    memcpy(data, w, 24);
    memcpy(data + 24, u, 3);
    memcpy(data + 27, &step, 8);
    char json[1024];
    snprintf(json, sizeof json,
             "{\"__metadata__\":{\"note\":\"a \\\"quoted\\\"\\u000a value\","
             "\"subtrain.crc32\":\"%08lx\"},"
             "\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
             "\"bytes\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[24,27]},"
             "\"step\":{\"dtype\":\"U64\",\"shape\":[],\"data_offsets\":[27,35]}}",
             (unsigned long)crc32(0L, data, 35));
    size_t h = 0;
    for (int k = 7; k >= 0; k--)
        h = h << 8 | b[k];
    cr_assert_eq(h % 8, 0, "the data starts aligned");
    cr_assert_geq(h, strlen(json));
    cr_assert_eq(memcmp(b + 8, json, strlen(json)), 0, "header: %.*s", (int)h, (char *)b + 8);
    for (size_t k = strlen(json); k < h; k++)
        cr_assert_eq(b[8 + k], ' ', "padded with spaces");
    cr_assert_eq(n, 8 + h + 35);
    cr_assert_eq(memcmp(b + 8 + h, w, 24), 0);
    cr_assert_eq(memcmp(b + 8 + h + 24, u, 3), 0);
    cr_assert_eq(memcmp(b + 8 + h + 27, &step, 8), 0);
    free(b);
    /* and it reads back */
    st_safetensors f;
    cr_assert_eq(st_safetensors_read(path, &f), ST_OK, "%s", st_last_error());
    cr_assert_eq(f.n, 3);
    cr_assert_str_eq(st_safetensors_meta(&f, "note"), "a \"quoted\"\n value");
    const st_safetensors_tensor *r = st_safetensors_find(&f, "w");
    cr_assert(r && r->ndims == 2 && r->shape[0] == 2 && r->shape[1] == 3 && r->bytes == 24);
    cr_assert_eq(memcmp(r->data, w, 24), 0);
    r = st_safetensors_find(&f, "step");
    cr_assert(r && r->ndims == 0 && r->dtype == ST_DTYPE_U64 && r->bytes == 8);
    cr_assert_null(st_safetensors_find(&f, "nothing"));
    st_safetensors_free(&f);
    /* no temporary file is left next to it */
    char tmp[ST_TEST_PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    cr_assert_neq(access(tmp, F_OK), 0);
}

/* Another writer's file: other key order, whitespace, no metadata, tensors
 * listed out of data order. */
Test(safetensors, a_file_written_by_hand_reads_back)
{
    char path[ST_TEST_PATH_MAX];
    st_test_path(path, tmpdir, "hand.safetensors");
    const float data[5] = { 0.5f, -1, 2, 3, 4 };
    write_file(path, "{ \"b\" : {\"data_offsets\":[8, 20], \"shape\": [3], \"dtype\": \"F32\"},\n"
                     "  \"a\": {\"dtype\":\"F32\",\"shape\":[1,2],\"data_offsets\":[0,8]} }",
               data, sizeof data);
    st_safetensors f;
    cr_assert_eq(st_safetensors_read(path, &f), ST_OK, "%s", st_last_error());
    cr_assert_eq(f.n, 2);
    cr_assert_str_eq(f.tensors[0].name, "b", "the header's order");
    const st_safetensors_tensor *a = st_safetensors_find(&f, "a");
    const st_safetensors_tensor *b = st_safetensors_find(&f, "b");
    cr_assert(a && b);
    float v[3];
    memcpy(v, a->data, 8);
    cr_assert(v[0] == 0.5f && v[1] == -1.0f);
    memcpy(v, b->data, 12);
    cr_assert(v[0] == 2.0f && v[2] == 4.0f);
    st_safetensors_free(&f);
}

static void expect_refused(const char *header, size_t data_bytes, const char *needle)
{
    char path[ST_TEST_PATH_MAX];
    st_test_path(path, tmpdir, "bad.safetensors");
    unsigned char data[64] = { 0 };
    write_file(path, header, data, data_bytes);
    st_safetensors f;
    st_status s = st_safetensors_read(path, &f);
    cr_assert_neq(s, ST_OK, "accepted: %s", header);
    cr_assert(strstr(st_last_error(), path), "the file is named: %s", st_last_error());
    cr_assert(strstr(st_last_error(), needle), "'%s': expected '%s' in: %s", header, needle,
              st_last_error());
    cr_assert_null(strchr(st_last_error(), '\n'), "one line");
    cr_assert_null(f.buf, "nothing is kept");
}

Test(safetensors, bad_headers_are_refused_naming_the_file)
{
    expect_refused("", 0, "expected '{'");
    expect_refused("[1,2]", 0, "expected '{'");
    expect_refused("{\"a\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,2]}}", 2, "F16");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
                   "needs 8 bytes");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 12,
                   "8 bytes after the last tensor");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "hole");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "overlap");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                   "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "twice");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "lacks");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4,
                   "unknown or repeated key");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
                   "non-negative integer");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} x", 4,
                   "trailing bytes");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4,
                   "expected '}'");
    expect_refused("{\"__metadata__\":{\"k\":1}}", 0, "expected a string");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],"
                   "\"data_offsets\":[0,4]}}", 4, "too large");
    /* jansson reads the header: a key twice anywhere, an offset past
     * 2^63 - 1 (no file is that large), a number that is not an integer */
    expect_refused("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0,
                   "at byte 36: a key twice in one object near '\"k\"'");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
                   "\"data_offsets\":[0,9223372036854775808]}}", 4, "an integer too large");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4,
                   "bad safetensors header, tensor 'a': expected a non-negative integer");
}

/* Dimensions of up to 2^40 make a byte count that wraps, here to 0 bytes,
 * which empty offsets would match: a shape of 2^80 elements must be
 * refused (fuzz/fuzz_safetensors.c checks a tensor's bytes against its
 * shape). */
Test(safetensors, a_shape_whose_size_wraps_is_refused)
{
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],"
                   "\"data_offsets\":[0,0]}}", 0, "2^64 bytes or more");
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,1],"
                   "\"data_offsets\":[0,0]}}", 0, "2^64 bytes or more");
    /* a zero dimension is no element, however large the others */
    char path[ST_TEST_PATH_MAX];
    st_test_path(path, tmpdir, "zero.safetensors");
    write_file(path, "{\"a\":{\"dtype\":\"U64\",\"shape\":[1099511627776,1099511627776,0],"
               "\"data_offsets\":[0,0]}}", "", 0);
    st_safetensors f;
    cr_assert_eq(st_safetensors_read(path, &f), ST_OK, "%s", st_last_error());
    cr_assert_eq(f.n, 1);
    cr_assert_eq(f.tensors[0].bytes, 0);
    st_safetensors_free(&f);
}

/* A flipped bit in the data (a finite value still, which nothing else
 * would catch) is found by the CRC-32 the writer records; a file without
 * one (another writer's) reads as it is; a caller's CRC-32 (of a file it
 * read) is replaced by the data's. */
Test(safetensors, a_flipped_bit_is_found_by_the_checksum)
{
    char path[ST_TEST_PATH_MAX];
    st_test_path(path, tmpdir, "crc.safetensors");
    const float w[4] = { 1, 2, 3, 4 };
    st_safetensors_tensor t = { .name = "w", .dtype = ST_DTYPE_F32, .ndims = 1, .shape = { 4 },
                                .data = w };
    cr_assert_eq(st_safetensors_write(path, &t, 1, NULL, 0), ST_OK, "%s", st_last_error());
    size_t n = 0;
    unsigned char *b = st_test_read_file(path, &n);
    cr_assert_not_null(b);
    b[n - 16] ^= 1;   /* the lowest mantissa bit of w[0]: 1 + 2^-23 */
    cr_assert_eq(st_test_write_file(path, (const char *)b, n), 0);
    st_safetensors f;
    cr_assert_eq(st_safetensors_read(path, &f), ST_ERR_FORMAT);
    cr_assert(strstr(st_last_error(), "crc.safetensors: the data's CRC-32 is ") &&
              strstr(st_last_error(), "the file is damaged"), "%s", st_last_error());
    /* without the key: what the file holds, the flipped bit too */
    size_t at = 0;
    while (at + 16 <= n && memcmp(b + at, "\"subtrain.crc32\"", 16) != 0)
        at++;
    cr_assert_lt(at + 16, n, "no CRC-32 in the header");
    memcpy(b + at, "\"subtrain.xrc32\"", 16);
    cr_assert_eq(st_test_write_file(path, (const char *)b, n), 0);
    cr_assert_eq(st_safetensors_read(path, &f), ST_OK, "%s", st_last_error());
    const st_safetensors_tensor *r = st_safetensors_find(&f, "w");
    cr_assert(r && ((const float *)r->data)[0] != 1.0f);
    st_safetensors_free(&f);
    free(b);
    /* a file's metadata written back with new data: its CRC-32 replaced */
    const st_safetensors_meta_entry mine[2] = { { "subtrain.crc32", "00000000" },
                                                { "note", "kept" } };
    cr_assert_eq(st_safetensors_write(path, &t, 1, mine, 2), ST_OK, "%s", st_last_error());
    cr_assert_eq(st_safetensors_read(path, &f), ST_OK, "%s", st_last_error());
    cr_assert_eq(f.n_meta, 2);
    cr_assert_str_eq(st_safetensors_meta(&f, "note"), "kept");
    cr_assert_str_neq(st_safetensors_meta(&f, "subtrain.crc32"), "00000000");
    st_safetensors_free(&f);
}

/* Found by fuzz/fuzz_safetensors.c on its first input: a file with no
 * tensor (metadata only, or nothing, as the writer writes them) passed a
 * NULL array to memcpy, undefined behaviour that the sanitizer build
 * reports. */
Test(safetensors, a_file_without_tensors_reads_back)
{
    char path[ST_TEST_PATH_MAX];
    st_test_path(path, tmpdir, "empty.safetensors");
    const st_safetensors_meta_entry meta[1] = { { "subtrain.model", "mlp" } };
    for (int n_meta = 0; n_meta <= 1; n_meta++) {
        cr_assert_eq(st_safetensors_write(path, NULL, 0, meta, n_meta), ST_OK);
        st_safetensors f;
        cr_assert_eq(st_safetensors_read(path, &f), ST_OK, "%s", st_last_error());
        cr_assert_eq(f.n, 0);
        cr_assert_eq(f.n_meta, n_meta + 1, "the caller's metadata and the CRC-32");
        cr_assert_null(st_safetensors_find(&f, "w"));
        if (n_meta)
            cr_assert_str_eq(st_safetensors_meta(&f, "subtrain.model"), "mlp");
        st_safetensors_free(&f);
    }
}

/* Every truncation of a good file, and a header length past the end, is
 * refused, never read out of bounds (the sanitizer build checks that). */
Test(safetensors, truncated_files_are_refused)
{
    char path[ST_TEST_PATH_MAX], cut[ST_TEST_PATH_MAX];
    st_test_path(path, tmpdir, "good.safetensors");
    st_test_path(cut, tmpdir, "cut.safetensors");
    const float w[4] = { 1, 2, 3, 4 };
    st_safetensors_tensor t = { .name = "w", .dtype = ST_DTYPE_F32, .ndims = 1, .shape = { 4 },
                                .data = w };
    cr_assert_eq(st_safetensors_write(path, &t, 1, NULL, 0), ST_OK);
    size_t n = 0;
    unsigned char *b = st_test_read_file(path, &n);
    for (size_t k = 0; k < n; k++) {
        write_raw(cut, b, k);
        st_safetensors f;
        cr_assert_neq(st_safetensors_read(cut, &f), ST_OK, "a file cut at %zu of %zu", k, n);
    }
    b[7] = 0x7f;   /* a header length of ~2^63 */
    write_raw(cut, b, n);
    st_safetensors f;
    cr_assert_eq(st_safetensors_read(cut, &f), ST_ERR_FORMAT);
    cr_assert(strstr(st_last_error(), "the header claims"), "%s", st_last_error());
    free(b);
    st_test_path(cut, tmpdir, "missing.safetensors");
    cr_assert_eq(st_safetensors_read(cut, &f), ST_ERR_IO);
    cr_assert(strstr(st_last_error(), "missing.safetensors"), "%s", st_last_error());
}

/* Every F32 value is checked as the file is read: a NaN or an infinity is
 * refused naming the tensor and the element, wherever it is (first,
 * past the first block of the scan, last); U8 and U64 data are bytes and
 * integers, not floats, and pass whatever they hold. */
Test(safetensors, floats_that_are_not_finite_are_refused)
{
    char path[ST_TEST_PATH_MAX];
    st_test_path(path, tmpdir, "w.safetensors");
    enum { N = 10000 };
    static float w[N];
    const uint8_t u[4] = { 0xff, 0xff, 0x80, 0x7f };   /* a NaN's bytes, as U8 */
    const uint64_t big = 0x7ff8000000000000ull;         /* a double NaN's bits, as U64 */
    const struct {
        size_t at;
        float v;
        const char *said;
    } cases[] = { { 0, NAN, "holds a NaN at element 0 of 10000" },
                  { 5000, INFINITY, "holds +infinity at element 5000 of 10000" },
                  { N - 1, -INFINITY, "holds -infinity at element 9999 of 10000" } };
    for (size_t c = 0; c <= sizeof cases / sizeof *cases; c++) {
        for (size_t i = 0; i < N; i++)
            w[i] = (float)i * 0.5f - 7.0f;
        if (c < sizeof cases / sizeof *cases)
            w[cases[c].at] = cases[c].v;
        st_safetensors_tensor t[3] = {
            { .name = "bytes", .dtype = ST_DTYPE_U8, .ndims = 1, .shape = { 4 }, .data = u },
            { .name = "count", .dtype = ST_DTYPE_U64, .ndims = 0, .data = &big },
            { .name = "w", .dtype = ST_DTYPE_F32, .ndims = 2, .shape = { 100, 100 }, .data = w },
        };
        cr_assert_eq(st_safetensors_write(path, t, 3, NULL, 0), ST_OK, "%s", st_last_error());
        st_safetensors f;
        st_status s = st_safetensors_read(path, &f);
        if (c == sizeof cases / sizeof *cases) {   /* every value finite */
            cr_assert_eq(s, ST_OK, "%s", st_last_error());
            st_safetensors_free(&f);
            continue;
        }
        cr_assert_eq(s, ST_ERR_FORMAT, "a %g at %zu was read", (double)cases[c].v, cases[c].at);
        cr_assert(strstr(st_last_error(), "w.safetensors: tensor 'w' ") &&
                  strstr(st_last_error(), cases[c].said), "%s", st_last_error());
        cr_assert_null(f.buf, "nothing is kept");
    }
}

/* A FIFO (nothing writes to it) is refused at once, not waited on. */
Test(safetensors, a_fifo_is_refused_not_waited_for, .timeout = 30)
{
    char path[ST_TEST_PATH_MAX];
    st_test_path(path, tmpdir, "fifo.safetensors");
    cr_assert_eq(mkfifo(path, 0600), 0);
    st_safetensors f;
    cr_assert_eq(st_safetensors_read(path, &f), ST_ERR_IO);
    cr_assert(strstr(st_last_error(), "fifo.safetensors: not a regular file (a FIFO)"), "%s",
              st_last_error());
}

/* kill -9 at random moments of a writer that replaces one file over and
 * over with one of two contents: the file is always one of them, whole. */
Test(safetensors, a_killed_writer_leaves_the_previous_file_whole, .timeout = 120)
{
    char path[ST_TEST_PATH_MAX];
    st_test_path(path, tmpdir, "ckpt.safetensors");
    const size_t n = 1 << 18;   /* 1 MiB of floats */
    float *v[2];
    for (int c = 0; c < 2; c++) {
        v[c] = malloc(n * sizeof(float));
        cr_assert_not_null(v[c]);
        for (size_t i = 0; i < n; i++)
            v[c][i] = (float)(c + 1) * (float)i;
    }
    st_safetensors_tensor t = { .name = "w", .dtype = ST_DTYPE_F32, .ndims = 1,
                                .shape = { (int64_t)n } };
    t.data = v[0];
    cr_assert_eq(st_safetensors_write(path, &t, 1, NULL, 0), ST_OK);
    srand(7);
    const int kills = 40;
    int seen[2] = { 0, 0 };
    for (int k = 0; k < kills; k++) {
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
            for (int i = 0;; i++) {
                t.data = v[(i + 1) % 2];
                if (st_safetensors_write(path, &t, 1, NULL, 0) != ST_OK)
                    _exit(3);
            }
        }
        struct timespec d = { 0, (long)(rand() % 20000) * 1000L };   /* 0-20 ms */
        nanosleep(&d, NULL);
        kill(pid, SIGKILL);
        int st;
        waitpid(pid, &st, 0);
        cr_assert(WIFSIGNALED(st), "the writer failed instead of being killed");
        st_safetensors f;
        cr_assert_eq(st_safetensors_read(path, &f), ST_OK, "kill %d: %s", k, st_last_error());
        const st_safetensors_tensor *r = st_safetensors_find(&f, "w");
        cr_assert(r && r->bytes == n * sizeof(float));
        const int which = memcmp(r->data, v[0], r->bytes) == 0   ? 0
                        : memcmp(r->data, v[1], r->bytes) == 0 ? 1 : -1;
        cr_assert_geq(which, 0, "kill %d: the file is neither content", k);
        seen[which]++;
        st_safetensors_free(&f);
    }
    cr_log_info("%d kills: the old content %d times, the new %d times", kills, seen[0], seen[1]);
    cr_assert_eq(seen[0] + seen[1], kills);
    free(v[0]);
    free(v[1]);
}

/* What writers killed mid-write left: a write of NAME removes the
 * NAME.tmp.PID of a process that is gone, whatever NAME's extension, and
 * keeps a live process's, another name's and a name that is not a PID. */
Test(safetensors, a_write_removes_what_dead_writers_of_its_name_left)
{
    pid_t child = fork();
    cr_assert_neq(child, -1);
    if (child == 0)
        _exit(0);
    cr_assert_eq(waitpid(child, NULL, 0), child);   /* a PID that is gone */
    char path[ST_TEST_PATH_MAX], name[96], file[ST_TEST_PATH_MAX];
    st_test_path(path, tmpdir, "out.bin");
    const long dead = (long)child, live = (long)getppid();
    const struct { const char *fmt; long pid; int removed; } left[] = {
        { "out.bin.tmp.%ld", dead, 1 },
        { "out.bin.tmp.%ld", live, 0 },
        { "out.bin2.tmp.%ld", dead, 0 },
        { "out.bin.tmp.%ldx", dead, 0 },
        { "out.bin.tmp.+%ld", dead, 0 },
        { "other.safetensors.tmp.%ld", dead, 0 },
    };
    for (size_t k = 0; k < sizeof left / sizeof *left; k++) {
        snprintf(name, sizeof name, left[k].fmt, left[k].pid);
        write_raw(st_test_path(file, tmpdir, name), "x", 1);
    }
    snprintf(name, sizeof name, "other.safetensors.tmp.%ld", dead);
    cr_assert(st_safetensors_dead_tmp(name, NULL), "%s: any .safetensors name", name);
    const float w[2] = { 1, 2 };
    st_safetensors_tensor t = { .name = "w", .dtype = ST_DTYPE_F32, .ndims = 1, .shape = { 2 },
                                .data = w };
    cr_assert_eq(st_safetensors_write(path, &t, 1, NULL, 0), ST_OK, "%s", st_last_error());
    for (size_t k = 0; k < sizeof left / sizeof *left; k++) {
        snprintf(name, sizeof name, left[k].fmt, left[k].pid);
        const int gone = access(st_test_path(file, tmpdir, name), F_OK) != 0;
        cr_assert_eq(gone, left[k].removed, "%s: %s", name, gone ? "removed" : "kept");
    }
}

/* ------------------------------------------------------------ weights */

static st_model_config gpt_cfg(int width)
{
    st_model_config c = { .kind = st_model_kind_named("gpt"), .depth = 2, .width = width,
                          .heads = 2, .context = 8, .in_dim = 8, .n_classes = 256,
                          .activation = ST_ACT_GELU };
    return c;
}

Test(weights, round_trip_and_refused_for_another_model)
{
    char path[ST_TEST_PATH_MAX];
    st_test_path(path, tmpdir, "w.safetensors");
    st_model_config c = gpt_cfg(16);
    const size_t n = st_model_config_param_count(&c);
    float *p = malloc(n * sizeof *p), *q = calloc(n, sizeof *q);
    cr_assert(p && q);
    cr_assert_eq(st_model_init_full_range(&c, 3, 0, n, p), ST_OK);
    const st_safetensors_meta_entry meta[1] = { { "subtrain.config", "width = 16" } };
    cr_assert_eq(st_checkpoint_write_weights(path, &c, p, meta, 1), ST_OK, "%s", st_last_error());
    cr_assert_eq(st_checkpoint_read_weights(path, &c, q), ST_OK, "%s", st_last_error());
    cr_assert_eq(memcmp(p, q, n * sizeof *p), 0);
    st_safetensors f;
    cr_assert_eq(st_safetensors_read(path, &f), ST_OK);
    cr_assert_str_eq(st_safetensors_meta(&f, "subtrain.model"), "gpt");
    cr_assert_str_eq(st_safetensors_meta(&f, "subtrain.config"), "width = 16");
    cr_assert(strstr(st_safetensors_meta(&f, "subtrain.in_major"), "block0.proj.weight"));
    const st_safetensors_tensor *t = st_safetensors_find(&f, "block1.qkv.weight");
    cr_assert(t && t->ndims == 2 && t->shape[0] == 48 && t->shape[1] == 16);
    st_safetensors_free(&f);
    st_model_config wider = gpt_cfg(32);
    float *r = malloc(st_model_config_param_count(&wider) * sizeof *r);
    cr_assert_eq(st_checkpoint_read_weights(path, &wider, r), ST_ERR_FORMAT);
    cr_assert(strstr(st_last_error(), "embed.token") && strstr(st_last_error(), "another model"),
              "%s", st_last_error());
    st_model_config res = { .kind = st_model_kind_named("resmlp"), .depth = 2, .width = 16,
                            .in_dim = 8, .n_classes = 4, .activation = ST_ACT_GELU };
    cr_assert_eq(st_checkpoint_read_weights(path, &res, r), ST_ERR_FORMAT);
    cr_assert(strstr(st_last_error(), "a gpt model, not of resmlp"), "%s", st_last_error());
    st_model_config deeper = gpt_cfg(16);
    deeper.depth = 1;   /* a subset of the names: the file has tensors the model lacks */
    cr_assert_eq(st_checkpoint_read_weights(path, &deeper, r), ST_ERR_FORMAT);
    cr_assert(strstr(st_last_error(), "block1") && strstr(st_last_error(), "not in the model"),
              "%s", st_last_error());
    free(p);
    free(q);
    free(r);
}

/* A step checkpoint is a weights file with tensors under "train." after
 * the weights: a weights reader takes it and skips them; a tensor of the
 * model in another dtype is still refused. */
Test(weights, a_training_state_loads_as_weights)
{
    char path[ST_TEST_PATH_MAX];
    st_test_path(path, tmpdir, "s.safetensors");
    st_model_config c = gpt_cfg(16);
    const size_t n = st_model_config_param_count(&c);
    float *p = malloc(n * sizeof *p), *q = calloc(n, sizeof *q);
    cr_assert(p && q);
    cr_assert_eq(st_model_init_full_range(&c, 5, 0, n, p), ST_OK);
    const float m[4] = { 1, 2, 3, 4 };
    st_safetensors_tensor extra[1] = {
        { .name = ST_CHECKPOINT_STATE_PREFIX "optimizer.m.worker0", .dtype = ST_DTYPE_F32,
          .ndims = 1, .shape = { 4 }, .data = m } };
    cr_assert_eq(st_checkpoint_write(path, &c, p, extra, 1, NULL, 0), ST_OK, "%s",
                 st_last_error());
    cr_assert_eq(st_checkpoint_read_weights(path, &c, q), ST_OK, "%s", st_last_error());
    cr_assert_eq(memcmp(p, q, n * sizeof *p), 0);
    st_safetensors f;
    cr_assert_eq(st_safetensors_read(path, &f), ST_OK);
    const st_safetensors_tensor *t = st_safetensors_find(&f, "train.optimizer.m.worker0");
    cr_assert(t && t->bytes == sizeof m && memcmp(t->data, m, sizeof m) == 0);
    st_safetensors_free(&f);
    /* every weight, one of them as bytes: refused, named */
    st_param_segment *segs;
    int ns;
    cr_assert_eq(st_model_config_segments(&c, &segs, &ns), ST_OK);
    st_safetensors_tensor *all = calloc((size_t)ns, sizeof *all);
    cr_assert_not_null(all);
    for (int i = 0; i < ns; i++) {
        snprintf(all[i].name, sizeof all[i].name, "%s", segs[i].name);
        all[i].dtype = i == 1 ? ST_DTYPE_U8 : ST_DTYPE_F32;
        all[i].ndims = segs[i].cols == 1 ? 1 : 2;
        all[i].shape[0] = segs[i].rows;
        all[i].shape[1] = segs[i].cols;
        all[i].data = p + segs[i].offset;
    }
    st_test_path(path, tmpdir, "u8.safetensors");
    cr_assert_eq(st_safetensors_write(path, all, ns, NULL, 0), ST_OK, "%s", st_last_error());
    cr_assert_eq(st_checkpoint_read_weights(path, &c, q), ST_ERR_FORMAT);
    cr_assert(strstr(st_last_error(), segs[1].name) && strstr(st_last_error(), "is not F32"), "%s",
              st_last_error());
    free(all);
    free(segs);
    free(p);
    free(q);
}

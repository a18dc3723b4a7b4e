/*
 * data/idx.c — reading IDX files (the MNIST container), plain or gzip.
 *
 * Layout, all big-endian:
 *   byte 0, 1   zero (the magic)
 *   byte 2      element type (0x08 = unsigned byte, the only one accepted)
 *   byte 3      rank
 *   rank x u32  dimensions, dims[0] being the item count
 *   payload     product of dims elements, row-major
 *
 * data/gzio.c reads plain and gzip files alike, so one code path serves
 * both.  Files come from outside, so nothing in the header is trusted: the
 * payload buffer grows as bytes really arrive instead of being allocated at
 * the declared size, which keeps a 20-byte file that declares 1 GiB from
 * costing 1 GiB.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#include <subtrain/data.h>

#include "core/error.h"
#include "data/gzio.h"

#define IDX_TYPE_UBYTE 0x08
#define IDX_FIRST_ALLOC ((size_t)1 << 20)   /* payload buffer starts at 1 MiB */
#define IDX_GZ_BUFFER (128u << 10)          /* the reader's input buffer */
#define IDX_TRAILING_SCAN ((size_t)1 << 20) /* extra bytes read before giving up */

static const char *type_name(int code)
{
    switch (code) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "short";
    case 0x0C: return "int";
    case 0x0D: return "float";
    case 0x0E: return "double";
    }
    return "unknown";
}

static uint32_t be32(const unsigned char *b)
{
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

/* "60000 x 28 x 28" for messages. */
static void format_dims(const st_idx_array *a, char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < a->rank && used < size; i++) {
        int n = snprintf(buf + used, size - used, "%s%lu", i ? " x " : "",
                         (unsigned long)a->dims[i]);
        if (n < 0)
            break;
        used += (size_t)n;
    }
}

/* Magic, type, rank and dimensions; fills a->rank, a->dims, a->count. */
static st_status read_header(st_gz *gz, const char *path, st_idx_array *a)
{
    unsigned char head[4];
    size_t got;
    ST_TRY(st_gz_read_upto(gz, path, head, sizeof head, &got));
    if (got == 0)
        return st_fail(ST_ERR_FORMAT, "%s: file is empty", path);
    if (got < sizeof head)
        return st_fail(ST_ERR_FORMAT, "%s: header is truncated (%zu of 4 bytes)", path, got);
    if (head[0] != 0 || head[1] != 0)
        return st_fail(ST_ERR_FORMAT, "%s: bad magic 0x%02X%02X (an IDX file starts with "
                       "two zero bytes); not an IDX file", path, head[0], head[1]);
    if (head[2] != IDX_TYPE_UBYTE)
        return st_fail(ST_ERR_FORMAT, "%s: type 0x%02X (%s) is not supported; subtrain "
                       "reads unsigned-byte IDX files", path, head[2], type_name(head[2]));
    int rank = head[3];
    if (rank < 1 || rank > ST_IDX_MAX_RANK)
        return st_fail(ST_ERR_FORMAT, "%s: rank %d is out of range (1..%d)",
                       path, rank, ST_IDX_MAX_RANK);

    unsigned char raw[4 * ST_IDX_MAX_RANK];
    size_t need = 4 * (size_t)rank;
    ST_TRY(st_gz_read_upto(gz, path, raw, need, &got));
    if (got < need)
        return st_fail(ST_ERR_FORMAT, "%s: header is truncated (rank %d needs %zu "
                       "dimension bytes, the file holds %zu)", path, rank, need, got);

    a->rank = rank;
    for (int i = 0; i < rank; i++) {
        a->dims[i] = be32(raw + 4 * i);
        if (a->dims[i] == 0)
            return st_fail(ST_ERR_FORMAT, "%s: dimension %d of %d is 0 (an IDX array "
                           "cannot be empty)", path, i, rank);
    }

    /* Each factor is < 2^32 and the running product stays <= 2^30, so the
     * 64-bit product cannot overflow before the limit check catches it. */
    uint64_t count = 1;
    for (int i = 0; i < rank; i++) {
        count *= a->dims[i];
        if (count > (uint64_t)ST_IDX_MAX_BYTES) {
            char dims[128];
            format_dims(a, dims, sizeof dims);
            return st_fail(ST_ERR_FORMAT, "%s: declares %s bytes, more than the %zu-byte "
                           "limit for one IDX file", path, dims, ST_IDX_MAX_BYTES);
        }
    }
    a->count = (size_t)count;
    return ST_OK;
}

static st_status short_payload(const char *path, const st_idx_array *a, size_t have)
{
    char dims[128];
    format_dims(a, dims, sizeof dims);
    return st_fail(ST_ERR_FORMAT, "%s: declares %s = %zu bytes but holds only %zu", path, dims,
                   a->count, have);
}

/* The payload, a->count bytes, into a fresh a->data.  The buffer starts at
 * min(count, 1 MiB) and doubles only when it is full, so memory follows
 * what the file really holds. */
static st_status read_payload(st_gz *gz, const char *path, st_idx_array *a)
{
    size_t cap = a->count < IDX_FIRST_ALLOC ? a->count : IDX_FIRST_ALLOC;
    size_t have = 0;
    uint8_t *buf = malloc(cap);
    if (!buf)
        return st_fail(ST_ERR_NOMEM, "%s: out of memory allocating %zu bytes", path, cap);

    for (;;) {
        size_t got;
        st_status s = st_gz_read_upto(gz, path, buf + have, cap - have, &got);
        if (s != ST_OK) {
            free(buf);
            return s;
        }
        have += got;
        if (have < cap || cap == a->count)
            break;   // end of file, or all declared bytes are in
        size_t grown = cap > a->count / 2 ? a->count : 2 * cap;
        uint8_t *p = realloc(buf, grown);
        if (!p) {
            free(buf);
            return st_fail(ST_ERR_NOMEM, "%s: out of memory growing the payload buffer "
                           "to %zu bytes", path, grown);
        }
        buf = p;
        cap = grown;
    }

    if (have < a->count) {
        free(buf);
        return short_payload(path, a, have);
    }
    a->data = buf;
    return ST_OK;
}

/* The payload read through a small buffer and dropped: what read_payload
 * checks, without holding it. */
static st_status read_through(st_gz *gz, const char *path, const st_idx_array *a)
{
    unsigned char buf[64 << 10];
    size_t have = 0, got;
    do {
        size_t want = a->count - have < sizeof buf ? a->count - have : sizeof buf;
        ST_TRY(st_gz_read_upto(gz, path, buf, want, &got));
        have += got;
    } while (got > 0 && have < a->count);
    return have < a->count ? short_payload(path, a, have) : ST_OK;
}

/* After the payload the file must end.  Reading on also makes zlib check
 * the gzip trailer (CRC and length), which it only does at the very end.
 * Extra bytes are read on (up to a bound) before they are reported: in a
 * damaged gzip stream they are a symptom, and the CRC error that follows
 * is the better message. */
static st_status expect_end(st_gz *gz, const char *path, size_t payload)
{
    unsigned char extra[4096];
    size_t total = 0, got;
    do {
        ST_TRY(st_gz_read_upto(gz, path, extra, sizeof extra, &got));
        total += got;
    } while (got == sizeof extra && total < IDX_TRAILING_SCAN);
    if (total > 0)
        return st_fail(ST_ERR_FORMAT, "%s: %s%zu trailing bytes after the %zu-byte payload",
                       path, got == sizeof extra ? "at least " : "", total, payload);
    return ST_OK;
}

/* Whether the file is as long as its header says, from its size (plain)
 * or gzip's recorded length, without reading the payload.  A gzip file of
 * several members records its last one's only: it is read through. */
static st_status length_matches(st_gz *gz, const char *path, const st_idx_array *a,
                                int *yes)
{
    const unsigned long long total = 4ull + 4ull * (unsigned)a->rank + a->count;
    *yes = 0;
    if (!st_gz_compressed(gz)) {
        *yes = st_gz_file_bytes(gz) == total;
        return ST_OK;
    }
    unsigned long recorded;
    int ok;
    ST_TRY(st_gz_recorded_length(gz, path, &recorded, &ok));
    *yes = ok && recorded == (unsigned long)(total & 0xffffffffull);
    return ST_OK;
}

/* st_idx_read (values) or st_idx_read_shape: the header, then the payload
 * held, or only its length checked (read through, for the same message,
 * when the length differs), then the end of the file. */
static st_status read_idx(const char *path, int values, const char *who, st_idx_array *out)
{
    if (!out)
        return st_fail(ST_ERR_INVALID, "%s: no output array", who);
    memset(out, 0, sizeof *out);
    if (!path)
        return st_fail(ST_ERR_INVALID, "%s: no path", who);

    st_gz *gz;
    ST_TRY(st_gz_open(path, IDX_GZ_BUFFER, &gz));

    st_idx_array a;
    memset(&a, 0, sizeof a);
    int known = 0;   /* the payload's length checked without reading it */
    st_status s = read_header(gz, path, &a);
    if (s == ST_OK && values)
        s = read_payload(gz, path, &a);
    else if (s == ST_OK && (s = length_matches(gz, path, &a, &known)) == ST_OK && !known)
        s = read_through(gz, path, &a);
    if (s == ST_OK && !known)
        s = expect_end(gz, path, a.count);
    st_gz_close(gz);   // read-only: every stream problem was reported above

    if (s != ST_OK) {
        free(a.data);
        return s;
    }
    *out = a;
    return ST_OK;
}

st_status st_idx_read(const char *path, st_idx_array *out)
{
    return read_idx(path, 1, "st_idx_read", out);
}

st_status st_idx_read_shape(const char *path, st_idx_array *out)
{
    return read_idx(path, 0, "st_idx_read_shape", out);
}

void st_idx_free(st_idx_array *a)
{
    if (!a)
        return;
    free(a->data);
    memset(a, 0, sizeof *a);
}

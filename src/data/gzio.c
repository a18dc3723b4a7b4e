/*
 * data/gzio.c — reading files that may be gzip-compressed, for the data
 * readers (idx.c, text.c): zlib's gzread reads plain files transparently,
 * and its sticky error state becomes a status with a one-line message.
 */
#include <errno.h>
#include <limits.h>
#include <string.h>

#include "core/error.h"
#include "data/gzio.h"

st_status st_gz_open(const char *path, unsigned buffer, gzFile *out)
{
    errno = 0;
    gzFile gz = gzopen(path, "rb");
    if (!gz) {
        if (errno)
            return st_fail(ST_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return st_fail(ST_ERR_NOMEM, "%s: out of memory opening the file", path);
    }
    if (buffer)
        gzbuffer(gz, buffer);
    *out = gz;
    return ST_OK;
}

/* gzerror's message starts with "path: "; our messages already name the
 * file, so drop that prefix. */
static const char *gz_message(gzFile gz, const char *path, int *errnum)
{
    const char *msg = gzerror(gz, errnum);
    size_t n = strlen(path);
    if (msg && strncmp(msg, path, n) == 0 && msg[n] == ':' && msg[n + 1] == ' ')
        msg += n + 2;
    return msg ? msg : "";
}

/* Turns zlib's sticky error state into a status: ST_OK when the stream is
 * healthy.  A gzip stream that ends early reads as Z_BUF_ERROR, a damaged
 * one as Z_DATA_ERROR (bad code or CRC mismatch). */
st_status st_gz_check(gzFile gz, const char *path, int saved_errno)
{
    int err = Z_OK;
    const char *msg = gz_message(gz, path, &err);
    switch (err) {
    case Z_OK:
    case Z_STREAM_END:
        return ST_OK;
    case Z_ERRNO:
        return st_fail(ST_ERR_IO, "%s: read failed: %s", path, strerror(saved_errno));
    case Z_BUF_ERROR:
        return st_fail(ST_ERR_FORMAT, "%s: gzip stream is truncated (%s)", path, msg);
    case Z_DATA_ERROR:
        return st_fail(ST_ERR_FORMAT, "%s: gzip stream is corrupt (%s)", path, msg);
    case Z_MEM_ERROR:
        return st_fail(ST_ERR_NOMEM, "%s: out of memory while decompressing", path);
    }
    return st_fail(ST_ERR_IO, "%s: zlib error %d (%s)", path, err, msg);
}

/* Reads up to `len` bytes into buf; *got is how many arrived.  A short count
 * with ST_OK means end of file; stream errors are reported here so callers
 * only have to compare counts. */
st_status st_gz_read_upto(gzFile gz, const char *path, void *buf, size_t len, size_t *got)
{
    unsigned char *p = buf;
    *got = 0;
    while (*got < len) {
        size_t want = len - *got;
        if (want > (size_t)INT_MAX)   // gzread takes an unsigned, returns an int
            want = (size_t)INT_MAX;
        errno = 0;
        int n = gzread(gz, p + *got, (unsigned)want);
        if (n <= 0) {
            int saved_errno = errno;
            ST_TRY(st_gz_check(gz, path, saved_errno));
            if (n < 0)   // an error zlib did not describe; should not happen
                return st_fail(ST_ERR_IO, "%s: read failed", path);
            break;
        }
        *got += (size_t)n;
    }
    return ST_OK;
}


/*
 * data/gzio.c — reading files that may be gzip-compressed, for the data
 * readers (idx.c, text.c): a file that starts with the gzip magic is
 * inflated, any other is read as it is, and every problem becomes a status
 * with a one-line message naming the file.
 *
 * Why not zlib's gzread: it ignores whatever follows a gzip stream when
 * that is not another gzip member, so garbage after a compressed file read
 * as a clean end, while the same garbage after a plain file is refused
 * (idx.c: "N trailing bytes").  Here the two agree.  Concatenated members
 * are one stream, as gzip -d reads them; anything else after the last
 * member is refused, counted like the plain readers count theirs.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/file.h"
#include "data/gzio.h"

#define GZ_DEFAULT_BUFFER (64u << 10)

struct st_gz {
    FILE *f;
    unsigned char *in;    /* input buffer: z.next_in points into it */
    size_t cap;
    int eof;              /* the file has no more bytes to give */
    int gzip;             /* 1: gzip members are inflated; 0: plain bytes */
    int member_end;       /* a member ended: what follows decides */
    unsigned long long file_bytes;   /* its size when it was opened */
    z_stream z;
};

/* Tops the input buffer up (what is left of it moved to the front). */
static st_status fill(st_gz *g, const char *path)
{
    if (g->eof)
        return ST_OK;
    if (g->z.avail_in && g->z.next_in != g->in)
        memmove(g->in, g->z.next_in, g->z.avail_in);
    g->z.next_in = g->in;
    const size_t want = g->cap - g->z.avail_in;
    errno = 0;
    size_t n = fread(g->in + g->z.avail_in, 1, want, g->f);
    g->z.avail_in += (uInt)n;
    if (n < want) {
        if (ferror(g->f))
            return st_fail(ST_ERR_IO, "%s: read failed: %s", path,
                           strerror(errno ? errno : EIO));
        g->eof = 1;
    }
    return ST_OK;
}

void st_gz_close(st_gz *g)
{
    if (!g)
        return;
    if (g->gzip)
        inflateEnd(&g->z);
    if (g->f)
        fclose(g->f);
    free(g->in);
    free(g);
}

st_status st_gz_open(const char *path, unsigned buffer, st_gz **out)
{
    *out = NULL;
    st_gz *g = calloc(1, sizeof *g);
    if (g)
        g->cap = buffer >= 2 ? buffer : GZ_DEFAULT_BUFFER;
    if (!g || !(g->in = malloc(g->cap))) {
        free(g);
        return st_fail(ST_ERR_NOMEM, "%s: out of memory opening the file", path);
    }
    st_status s = st_file_open_read(path, &g->f);
    struct stat sb;
    if (s == ST_OK && fstat(fileno(g->f), &sb) != 0)
        s = st_fail(ST_ERR_IO, "%s: cannot read its size: %s", path, strerror(errno));
    if (s != ST_OK) {
        st_gz_close(g);
        return s;
    }
    g->file_bytes = (unsigned long long)sb.st_size;
    g->z.next_in = g->in;
    s = fill(g, path);
    if (s == ST_OK && g->z.avail_in >= 2 && g->in[0] == 0x1f && g->in[1] == 0x8b) {
        if (inflateInit2(&g->z, 16 + MAX_WBITS) != Z_OK)   /* gzip framing only */
            s = st_fail(ST_ERR_NOMEM, "%s: out of memory for the gzip decoder", path);
        else
            g->gzip = 1;
    }
    if (s != ST_OK) {
        st_gz_close(g);
        return s;
    }
    *out = g;
    return ST_OK;
}

int st_gz_compressed(const st_gz *g)
{
    return g->gzip;
}

unsigned long long st_gz_file_bytes(const st_gz *g)
{
    return g->file_bytes;
}

st_status st_gz_recorded_length(const st_gz *g, const char *path, unsigned long *length,
                                int *ok)
{
    *length = 0;
    *ok = 0;
    if (!g->gzip || g->file_bytes < 18)   /* a member's header and trailer */
        return ST_OK;
    unsigned char b[4];
    /* pread: the stream's position and buffer stay as they are */
    ssize_t got = pread(fileno(g->f), b, sizeof b, (off_t)(g->file_bytes - sizeof b));
    if (got < 0)
        return st_fail(ST_ERR_IO, "%s: cannot read its end: %s", path, strerror(errno));
    if (got != (ssize_t)sizeof b)
        return ST_OK;
    *length = (unsigned long)b[0] | (unsigned long)b[1] << 8 | (unsigned long)b[2] << 16 |
              (unsigned long)b[3] << 24;
    *ok = 1;
    return ST_OK;
}

/* After the end of a member: another member starts, or the file ends, or
 * there is garbage, which is counted (all of a regular file's; of other
 * files what one more buffer holds) and refused. */
static st_status after_member(st_gz *g, const char *path, int *more)
{
    *more = 0;
    if (g->z.avail_in < 2)
        ST_TRY(fill(g, path));
    if (g->z.avail_in == 0)
        return ST_OK;   /* the end */
    if (g->z.avail_in >= 2 && g->z.next_in[0] == 0x1f && g->z.next_in[1] == 0x8b) {
        inflateReset(&g->z);
        g->member_end = 0;
        *more = 1;
        return ST_OK;
    }
    size_t trailing = g->z.avail_in;
    struct stat sb;
    long pos = ftell(g->f);
    int exact = fstat(fileno(g->f), &sb) == 0 && S_ISREG(sb.st_mode) && pos >= 0;
    if (exact)
        trailing += (size_t)(sb.st_size - pos);
    return st_fail(ST_ERR_FORMAT, "%s: %s%zu trailing bytes after the gzip stream (neither "
                   "the end of the file nor another gzip member)", path,
                   exact || g->eof ? "" : "at least ", trailing);
}

static st_status inflate_upto(st_gz *g, const char *path, unsigned char *buf, size_t len,
                              size_t *got)
{
    while (*got < len) {
        if (g->member_end) {
            int more;
            ST_TRY(after_member(g, path, &more));
            if (!more)
                break;
        }
        if (g->z.avail_in == 0)
            ST_TRY(fill(g, path));
        if (g->z.avail_in == 0)   /* the file ended inside a member */
            return st_fail(ST_ERR_FORMAT, "%s: gzip stream is truncated (unexpected end of "
                           "file)", path);
        size_t want = len - *got;
        g->z.next_out = buf + *got;
        g->z.avail_out = want > UINT_MAX ? UINT_MAX : (uInt)want;
        uInt before = g->z.avail_out;
        int r = inflate(&g->z, Z_NO_FLUSH);
        *got += before - g->z.avail_out;
        switch (r) {
        case Z_STREAM_END:
            g->member_end = 1;
            break;
        case Z_OK:
        case Z_BUF_ERROR:   /* no progress possible: more input comes next round */
            break;
        case Z_MEM_ERROR:
            return st_fail(ST_ERR_NOMEM, "%s: out of memory while decompressing", path);
        case Z_DATA_ERROR:
        case Z_NEED_DICT:
            return st_fail(ST_ERR_FORMAT, "%s: gzip stream is corrupt (%s)", path,
                           g->z.msg ? g->z.msg : "invalid data");
        default:
            return st_fail(ST_ERR_IO, "%s: zlib error %d (%s)", path, r,
                           g->z.msg ? g->z.msg : "no message");
        }
    }
    return ST_OK;
}

/* Reads up to `len` bytes into buf; *got is how many arrived.  A short count
 * with ST_OK means end of file; stream errors are reported here so callers
 * only have to compare counts. */
st_status st_gz_read_upto(st_gz *g, const char *path, void *buf, size_t len, size_t *got)
{
    unsigned char *p = buf;
    *got = 0;
    if (g->gzip)
        return inflate_upto(g, path, p, len, got);
    while (*got < len) {
        if (g->z.avail_in == 0)
            ST_TRY(fill(g, path));
        if (g->z.avail_in == 0)
            break;
        size_t n = len - *got < g->z.avail_in ? len - *got : g->z.avail_in;
        memcpy(p + *got, g->z.next_in, n);
        g->z.next_in += n;
        g->z.avail_in -= (uInt)n;
        *got += n;
    }
    return ST_OK;
}

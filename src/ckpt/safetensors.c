/*
 * ckpt/safetensors.c — the safetensors format: an atomic writer and a
 * reader that trusts nothing in the file (subtrain/checkpoint.h).
 *
 * The reader's JSON parser knows exactly the shape of a safetensors
 * header (an object of objects of strings and integer arrays, and one
 * object of strings), not JSON in general: anything else is an error
 * naming the byte where it went wrong.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <subtrain/checkpoint.h>

#include "core/error.h"
#include "core/file.h"

static const struct {
    const char *name;
    size_t size;
} dtypes[] = { [ST_DTYPE_F32] = { "F32", 4 }, [ST_DTYPE_U8] = { "U8", 1 },
               [ST_DTYPE_U64] = { "U64", 8 }, [ST_DTYPE_BF16] = { "BF16", 2 } };
#define N_DTYPES ((int)(sizeof dtypes / sizeof *dtypes))

/* ------------------------------------------------------------ writing */

/* A growing string for the header. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void put(sbuf *b, const char *s, size_t len)
{
    if (b->oom)
        return;
    if (b->n + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + len + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, len);
    b->n += len;
    b->p[b->n] = '\0';
}

static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

/* A JSON string: quotes, backslashes and control bytes escaped. */
static void put_string(sbuf *b, const char *s)
{
    puts_(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char e[8];
        if (c == '"' || c == '\\') {
            e[0] = '\\';
            e[1] = (char)c;
            put(b, e, 2);
        } else if (c < 0x20) {
            snprintf(e, sizeof e, "\\u%04x", c);
            puts_(b, e);
        } else {
            put(b, (const char *)&c, 1);
        }
    }
    puts_(b, "\"");
}

static size_t elements(const st_safetensors_tensor *t)
{
    size_t n = 1;
    for (int d = 0; d < t->ndims; d++)
        n *= (size_t)t->shape[d];
    return n;
}

static st_status check_tensors(const char *path, const st_safetensors_tensor *t, int n)
{
    for (int i = 0; i < n; i++) {
        if (!t[i].name[0] || t[i].dtype < 0 || t[i].dtype >= N_DTYPES || t[i].ndims < 0 ||
            t[i].ndims > ST_SAFETENSORS_MAX_DIMS || (!t[i].data && elements(&t[i])))
            return st_fail(ST_ERR_INVALID, "%s: tensor %d ('%s') has no name, an unknown dtype, "
                           "a bad rank or no data", path, i, t[i].name);
        for (int d = 0; d < t[i].ndims; d++)
            if (t[i].shape[d] < 0)
                return st_fail(ST_ERR_INVALID, "%s: tensor '%s' has a negative dimension", path,
                               t[i].name);
        for (int j = 0; j < i; j++)
            if (strcmp(t[i].name, t[j].name) == 0)
                return st_fail(ST_ERR_INVALID, "%s: tensor '%s' twice", path, t[i].name);
    }
    return ST_OK;
}

static st_status header(const st_safetensors_tensor *t, int n,
                        const st_safetensors_meta_entry *meta, int n_meta, sbuf *b)
{
    char num[64];
    size_t at = 0;
    puts_(b, "{");
    if (n_meta) {
        puts_(b, "\"__metadata__\":{");
        for (int k = 0; k < n_meta; k++) {
            put_string(b, meta[k].key);
            puts_(b, ":");
            put_string(b, meta[k].value);
            puts_(b, k + 1 < n_meta ? "," : "}");
        }
        puts_(b, n ? "," : "");
    }
    for (int i = 0; i < n; i++) {
        const size_t bytes = elements(&t[i]) * dtypes[t[i].dtype].size;
        put_string(b, t[i].name);
        puts_(b, ":{\"dtype\":\"");
        puts_(b, dtypes[t[i].dtype].name);
        puts_(b, "\",\"shape\":[");
        for (int d = 0; d < t[i].ndims; d++) {
            snprintf(num, sizeof num, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
            puts_(b, num);
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%zu,%zu]}", at, at + bytes);
        puts_(b, num);
        puts_(b, i + 1 < n ? "," : "");
        at += bytes;
    }
    puts_(b, "}");
    while (b->n % 8)   /* the data starts 8-byte aligned */
        puts_(b, " ");
    return b->oom ? st_fail(ST_ERR_NOMEM, "out of memory writing a safetensors header") : ST_OK;
}

static int write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

/* The directory of path, for its fsync after the rename. */
static void dir_of(const char *path, char *dir, size_t n)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, n, ".");
    else if (slash == path)
        snprintf(dir, n, "/");
    else
        snprintf(dir, n, "%.*s", (int)(slash - path), path);
}

st_status st_safetensors_write(const char *path, const st_safetensors_tensor *tensors, int n,
                               const st_safetensors_meta_entry *meta, int n_meta)
{
    if (!path || !*path || n < 0 || n_meta < 0)
        return st_fail(ST_ERR_INVALID, "safetensors: no file name");
    ST_TRY(check_tensors(path, tensors, n));
    sbuf b = { 0 };
    st_status s = header(tensors, n, meta, n_meta, &b);
    if (s != ST_OK) {
        free(b.p);
        return s;
    }
    char tmp[PATH_MAX], dir[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp) {
        free(b.p);
        return st_fail(ST_ERR_INVALID, "%s: the name is too long", path);
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        free(b.p);
        return st_fail(ST_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    }
    unsigned char len[8];
    for (int k = 0; k < 8; k++)   /* little-endian, whatever the host */
        len[k] = (unsigned char)((uint64_t)b.n >> (8 * k));
    int bad = write_all(fd, len, 8) || write_all(fd, b.p, b.n);
    for (int i = 0; !bad && i < n; i++)
        bad = write_all(fd, tensors[i].data, elements(&tensors[i]) * dtypes[tensors[i].dtype].size);
    free(b.p);
    /* the data is on the disk before the name points at it */
    if (bad || fsync(fd) != 0) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return st_fail(ST_ERR_IO, "%s: cannot write: %s", tmp, strerror(e));
    }
    if (close(fd) != 0 || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return st_fail(ST_ERR_IO, "%s: cannot write: %s", path, strerror(e));
    }
    /* and the rename is on the disk before we say it is done */
    dir_of(path, dir, sizeof dir);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        int r = fsync(dfd);
        close(dfd);
        if (r != 0)
            return st_fail(ST_ERR_IO, "%s: cannot sync its directory: %s", path, strerror(errno));
    }
    return ST_OK;
}

/* ------------------------------------------------------------ reading */

typedef struct parser {
    const char *path;
    const char *p, *end, *start;
} parser;

static st_status perr(const parser *ps, const char *what)
{
    return st_fail(ST_ERR_FORMAT, "%s: bad safetensors header at byte %zu: %s", ps->path,
                   (size_t)(ps->p - ps->start) + 8, what);
}

static void ws(parser *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' ||
                               *ps->p == '\r'))
        ps->p++;
}

static int eat(parser *ps, char c)
{
    ws(ps);
    if (ps->p < ps->end && *ps->p == c) {
        ps->p++;
        return 1;
    }
    return 0;
}

/* A string into out (at most cap - 1 bytes, NUL-terminated). */
static st_status string(parser *ps, char *out, size_t cap)
{
    if (!eat(ps, '"'))
        return perr(ps, "expected a string");
    size_t n = 0;
    while (ps->p < ps->end && *ps->p != '"') {
        unsigned c = (unsigned char)*ps->p++;
        if (c < 0x20)
            return perr(ps, "a control byte in a string");
        if (c == '\\') {
            if (ps->p >= ps->end)
                return perr(ps, "an unterminated escape");
            const char e = *ps->p++;
            const char *simple = strchr("\"\\/bfnrt", e);
            if (e && simple) {
                static const char to[] = "\"\\/\b\f\n\r\t";
                c = (unsigned char)to[simple - "\"\\/bfnrt"];
            } else if (e == 'u') {
                unsigned v = 0;
                for (int k = 0; k < 4; k++) {
                    if (ps->p >= ps->end)
                        return perr(ps, "a short \\u escape");
                    char h = *ps->p++;
                    v = v * 16 + (unsigned)(h >= '0' && h <= '9' ? h - '0'
                                            : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                            : h >= 'A' && h <= 'F' ? h - 'A' + 10 : 99);
                    if (v > 0xffff)
                        return perr(ps, "a bad \\u escape");
                }
                if (v == 0 || v > 0x7f)
                    return perr(ps, "a \\u escape outside ASCII");
                c = v;
            } else {
                return perr(ps, "an unknown escape");
            }
        }
        if (n + 1 >= cap)
            return perr(ps, "a string too long");
        out[n++] = (char)c;
    }
    if (ps->p >= ps->end)
        return perr(ps, "an unterminated string");
    ps->p++;
    out[n] = '\0';
    return ST_OK;
}

static st_status integer(parser *ps, uint64_t *out)
{
    ws(ps);
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
        return perr(ps, "expected a non-negative integer");
    uint64_t v = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        if (v > (UINT64_MAX - 9) / 10)
            return perr(ps, "an integer too large");
        v = v * 10 + (uint64_t)(*ps->p++ - '0');
    }
    *out = v;
    return ST_OK;
}

/* [a, b, ...] of at most cap integers. */
static st_status int_array(parser *ps, uint64_t *v, int cap, int *n)
{
    if (!eat(ps, '['))
        return perr(ps, "expected an array");
    *n = 0;
    if (eat(ps, ']'))
        return ST_OK;
    do {
        if (*n >= cap)
            return perr(ps, "an array too long");
        ST_TRY(integer(ps, &v[(*n)++]));
    } while (eat(ps, ','));
    return eat(ps, ']') ? ST_OK : perr(ps, "expected ']'");
}

static st_status tensor_entry(parser *ps, st_safetensors_tensor *t, uint64_t off[2])
{
    int have_dtype = 0, have_shape = 0, have_off = 0;
    char key[32], val[16];
    if (!eat(ps, '{'))
        return perr(ps, "expected a tensor's object");
    do {
        ST_TRY(string(ps, key, sizeof key));
        if (!eat(ps, ':'))
            return perr(ps, "expected ':'");
        if (strcmp(key, "dtype") == 0 && !have_dtype) {
            ST_TRY(string(ps, val, sizeof val));
            int d = 0;
            while (d < N_DTYPES && strcmp(dtypes[d].name, val) != 0)
                d++;
            if (d == N_DTYPES)
                return st_fail(ST_ERR_FORMAT, "%s: tensor '%s' has dtype %s (subtrain reads "
                               "F32, U8, U64)", ps->path, t->name, val);
            t->dtype = (st_dtype)d;
            have_dtype = 1;
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            uint64_t v[ST_SAFETENSORS_MAX_DIMS];
            ST_TRY(int_array(ps, v, ST_SAFETENSORS_MAX_DIMS, &t->ndims));
            for (int d = 0; d < t->ndims; d++) {
                if (v[d] > (uint64_t)1 << 40)
                    return perr(ps, "a dimension too large");
                t->shape[d] = (int64_t)v[d];
            }
            have_shape = 1;
        } else if (strcmp(key, "data_offsets") == 0 && !have_off) {
            int n;
            ST_TRY(int_array(ps, off, 2, &n));
            if (n != 2)
                return perr(ps, "data_offsets needs two integers");
            have_off = 1;
        } else {
            return perr(ps, "an unknown or repeated key in a tensor's object");
        }
    } while (eat(ps, ','));
    if (!eat(ps, '}'))
        return perr(ps, "expected '}'");
    if (!have_dtype || !have_shape || !have_off)
        return st_fail(ST_ERR_FORMAT, "%s: tensor '%s' lacks its dtype, shape or data_offsets",
                       ps->path, t->name);
    return ST_OK;
}

static st_status meta_entry(parser *ps, st_safetensors *f)
{
    if (!eat(ps, '{'))
        return perr(ps, "expected the metadata object");
    if (eat(ps, '}'))
        return ST_OK;
    /* keys and values are copied into one text buffer as they come */
    size_t cap = (size_t)(ps->end - ps->p) + 1, used = 0;
    int n_cap = 0;
    f->meta_text = malloc(cap);
    if (!f->meta_text)
        return st_fail(ST_ERR_NOMEM, "out of memory reading %s", ps->path);
    do {
        if (f->n_meta == n_cap) {
            n_cap = n_cap ? 2 * n_cap : 16;
            st_safetensors_meta_entry *m = realloc(f->meta, (size_t)n_cap * sizeof *m);
            if (!m)
                return st_fail(ST_ERR_NOMEM, "out of memory reading %s", ps->path);
            f->meta = m;
        }
        char *k = f->meta_text + used;
        ST_TRY(string(ps, k, cap - used));
        used += strlen(k) + 1;
        if (!eat(ps, ':'))
            return perr(ps, "expected ':'");
        char *v = f->meta_text + used;
        ST_TRY(string(ps, v, cap - used));
        used += strlen(v) + 1;
        f->meta[f->n_meta++] = (st_safetensors_meta_entry){ k, v };
    } while (eat(ps, ','));
    return eat(ps, '}') ? ST_OK : perr(ps, "expected '}'");
}

/* Offsets in the data region, pairs for the coverage check. */
typedef struct span {
    uint64_t begin, end;
} span;

static int by_begin(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static st_status parse_header(parser *ps, st_safetensors *f, uint64_t data_bytes)
{
    int cap = 0;
    span *spans = NULL;
    st_status s = ST_OK;
    if (!eat(ps, '{'))
        return perr(ps, "expected '{'");
    if (!eat(ps, '}')) {
        do {
            char name[ST_SAFETENSORS_MAX_NAME];
            if ((s = string(ps, name, sizeof name)) != ST_OK)
                break;
            if (!eat(ps, ':')) {
                s = perr(ps, "expected ':'");
                break;
            }
            if (strcmp(name, "__metadata__") == 0) {
                if (f->meta_text) {
                    s = perr(ps, "__metadata__ twice");
                    break;
                }
                if ((s = meta_entry(ps, f)) != ST_OK)
                    break;
                continue;
            }
            if (f->n == cap) {
                cap = cap ? 2 * cap : 64;
                st_safetensors_tensor *t = realloc(f->tensors, (size_t)cap * sizeof *t);
                span *sp = t ? realloc(spans, (size_t)cap * sizeof *sp) : NULL;
                if (t)
                    f->tensors = t;
                if (!sp) {
                    s = st_fail(ST_ERR_NOMEM, "out of memory reading %s", ps->path);
                    break;
                }
                spans = sp;
            }
            st_safetensors_tensor *t = &f->tensors[f->n];
            memset(t, 0, sizeof *t);
            memcpy(t->name, name, sizeof t->name);
            uint64_t off[2];
            if ((s = tensor_entry(ps, t, off)) != ST_OK)
                break;
            for (int j = 0; j < f->n; j++)
                if (strcmp(f->tensors[j].name, name) == 0) {
                    s = st_fail(ST_ERR_FORMAT, "%s: tensor '%s' twice", ps->path, name);
                    break;
                }
            if (s != ST_OK)
                break;
            /* each dimension is <= 2^40, so four of them can wrap: the
             * product saturates (a zero dimension still makes it 0) */
            uint64_t want = dtypes[t->dtype].size;
            for (int d = 0; d < t->ndims; d++) {
                const uint64_t dim = (uint64_t)t->shape[d];
                want = dim && want > UINT64_MAX / dim ? UINT64_MAX : want * dim;
            }
            if (want == UINT64_MAX) {
                s = st_fail(ST_ERR_FORMAT, "%s: tensor '%s' has a shape of 2^64 bytes or more",
                            ps->path, name);
                break;
            }
            if (off[0] > off[1] || off[1] > data_bytes || off[1] - off[0] != want) {
                s = st_fail(ST_ERR_FORMAT, "%s: tensor '%s' has data_offsets [%llu, %llu]: its "
                            "%s shape needs %llu bytes of the %llu the file holds", ps->path,
                            name, (unsigned long long)off[0], (unsigned long long)off[1],
                            dtypes[t->dtype].name, (unsigned long long)want,
                            (unsigned long long)data_bytes);
                break;
            }
            t->bytes = (size_t)want;
            spans[f->n] = (span){ off[0], off[1] };
            f->n++;
        } while (eat(ps, ','));
        if (s == ST_OK && !eat(ps, '}'))
            s = perr(ps, "expected '}'");
    }
    ws(ps);
    if (s == ST_OK && ps->p != ps->end)
        s = perr(ps, "trailing bytes after the header's object");
    if (s == ST_OK) {
        /* the tensors cover the data exactly: sorted, each starts where
         * the previous ended, the last ends at the end */
        span *sorted = malloc((size_t)(f->n ? f->n : 1) * sizeof *sorted);
        if (!sorted) {
            s = st_fail(ST_ERR_NOMEM, "out of memory reading %s", ps->path);
        } else {
            if (f->n)   /* no tensor: spans is NULL, which memcpy may not take */
                memcpy(sorted, spans, (size_t)f->n * sizeof *sorted);
            qsort(sorted, (size_t)f->n, sizeof *sorted, by_begin);
            uint64_t at = 0;
            for (int i = 0; i < f->n && s == ST_OK; i++) {
                if (sorted[i].begin != at)
                    s = st_fail(ST_ERR_FORMAT, "%s: the tensors' data overlap or leave a hole "
                                "at byte %llu of the data", ps->path, (unsigned long long)at);
                at = sorted[i].end;
            }
            if (s == ST_OK && at != data_bytes)
                s = st_fail(ST_ERR_FORMAT, "%s: %llu bytes after the last tensor's data "
                            "(truncated header or trailing data)", ps->path,
                            (unsigned long long)(data_bytes - at));
            free(sorted);
        }
    }
    for (int i = 0; s == ST_OK && i < f->n; i++)
        f->tensors[i].data = ps->end + spans[i].begin;
    free(spans);
    return s;
}

/* The index of the first float of p[0..n) that is a NaN or an infinity
 * (all exponent bits set), n if none.  Blocks are scanned without a branch
 * per value, so the pass runs at memory speed; only a block with a bad
 * value is searched again for it. */
static size_t first_not_finite(const unsigned char *p, size_t n)
{
    enum { BLOCK = 4096 };
    for (size_t at = 0; at < n; at += BLOCK) {
        const size_t end = n - at < BLOCK ? n : at + BLOCK;
        unsigned bad = 0;
        for (size_t k = at; k < end; k++) {
            uint32_t u;
            memcpy(&u, p + 4 * k, 4);   /* the data may be unaligned */
            bad |= (u & 0x7f800000u) == 0x7f800000u;
        }
        for (size_t k = at; bad && k < end; k++) {
            uint32_t u;
            memcpy(&u, p + 4 * k, 4);
            if ((u & 0x7f800000u) == 0x7f800000u)
                return k;
        }
    }
    return n;
}

/* The same for bf16 values (an optimizer's bf16 state: small, one pass). */
static size_t first_not_finite16(const unsigned char *p, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        uint16_t u;
        memcpy(&u, p + 2 * k, 2);
        if ((u & 0x7f80u) == 0x7f80u)
            return k;
    }
    return n;
}

/* Every F32 and BF16 value is finite: subtrain writes weights, optimizer
 * moments and running statistics of runs that were going well, and a NaN
 * or an infinity taken in would surface steps later as a loss that
 * "diverged". */
static st_status check_finite(const char *path, const st_safetensors *f)
{
    for (int i = 0; i < f->n; i++) {
        const st_safetensors_tensor *t = &f->tensors[i];
        if (t->dtype != ST_DTYPE_F32 && t->dtype != ST_DTYPE_BF16)
            continue;
        const int half = t->dtype == ST_DTYPE_BF16;
        const size_t n = t->bytes / (half ? 2 : 4);
        const size_t k = half ? first_not_finite16(t->data, n) : first_not_finite(t->data, n);
        if (k == n)
            continue;
        uint32_t u = 0;
        if (half) {
            uint16_t h;
            memcpy(&h, (const unsigned char *)t->data + 2 * k, 2);
            u = (uint32_t)h << 16;
        } else {
            memcpy(&u, (const unsigned char *)t->data + 4 * k, 4);
        }
        return st_fail(ST_ERR_FORMAT, "%s: tensor '%s' holds %s at element %zu of %zu: "
                       "weights and training state must be finite", path, t->name,
                       u & 0x007fffffu ? "a NaN" : u >> 31 ? "-infinity" : "+infinity", k, n);
    }
    return ST_OK;
}

st_status st_safetensors_read(const char *path, st_safetensors *out)
{
    memset(out, 0, sizeof *out);
    FILE *fp;
    ST_TRY(st_file_open_read(path, &fp));
    struct stat sb;
    if (fstat(fileno(fp), &sb) != 0) {
        const int e = errno;
        fclose(fp);
        return st_fail(ST_ERR_IO, "%s: cannot read its size: %s", path, strerror(e));
    }
    const size_t size = (size_t)sb.st_size;
    if (size < 8) {
        fclose(fp);
        return st_fail(ST_ERR_FORMAT, "%s: %zu bytes is too short for a safetensors file "
                       "(an 8-byte header length first)", path, size);
    }
    uint8_t *buf = malloc(size);
    if (!buf) {
        fclose(fp);
        return st_fail(ST_ERR_NOMEM, "out of memory reading %s (%zu bytes)", path, size);
    }
    const size_t got = fread(buf, 1, size, fp);
    const int e = ferror(fp) ? errno : 0;
    fclose(fp);
    if (got != size) {
        free(buf);
        return st_fail(ST_ERR_IO, "%s: read %zu of %zu bytes%s%s", path, got, size,
                       e ? ": " : "", e ? strerror(e) : "");
    }
    uint64_t n = 0;
    for (int k = 7; k >= 0; k--)
        n = n << 8 | buf[k];
    if (n > ST_SAFETENSORS_MAX_HEADER || n > size - 8) {
        free(buf);
        return st_fail(ST_ERR_FORMAT, "%s: the header claims %llu bytes; the file has %zu after "
                       "the length (limit %llu)", path, (unsigned long long)n, size - 8,
                       (unsigned long long)ST_SAFETENSORS_MAX_HEADER);
    }
    out->buf = buf;
    out->size = size;
    parser ps = { path, (const char *)buf + 8, (const char *)buf + 8 + n, (const char *)buf + 8 };
    st_status s = parse_header(&ps, out, size - 8 - n);
    if (s == ST_OK)
        s = check_finite(path, out);
    if (s != ST_OK)
        st_safetensors_free(out);
    return s;
}

const st_safetensors_tensor *st_safetensors_find(const st_safetensors *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->tensors[i].name, name) == 0)
            return &f->tensors[i];
    return NULL;
}

const char *st_safetensors_meta(const st_safetensors *f, const char *key)
{
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta[i].key, key) == 0)
            return f->meta[i].value;
    return NULL;
}

void st_safetensors_free(st_safetensors *f)
{
    if (!f)
        return;
    free(f->buf);
    free(f->tensors);
    free(f->meta);
    free(f->meta_text);
    memset(f, 0, sizeof *f);
}

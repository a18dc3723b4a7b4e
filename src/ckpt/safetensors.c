/*
 * ckpt/safetensors.c — the safetensors format: an atomic writer and a
 * reader that trusts nothing in the file (subtrain/checkpoint.h).
 *
 * The reader parses the header with jansson and accepts exactly the
 * shape of a safetensors header (an object of objects of strings and
 * integer arrays, and one object of strings): anything else is an error
 * naming the byte, or the member, where it went wrong.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <zlib.h>

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

int st_safetensors_tmp_name(const char *path, char *buf, size_t len)
{
    const int w = snprintf(buf, len, "%s.tmp.%ld", path, (long)getpid());
    return w >= 0 && (size_t)w < len ? 0 : -1;
}

int st_safetensors_dead_tmp(const char *name, const char *target)
{
    static const char mark[] = ".tmp.", any[] = ".safetensors.tmp.";
    const char *digits;
    if (target) {
        const size_t n = strlen(target);
        if (strncmp(name, target, n) != 0 || strncmp(name + n, mark, sizeof mark - 1) != 0)
            return 0;
        digits = name + n + sizeof mark - 1;
    } else {
        const char *t = strstr(name, any);
        if (!t)
            return 0;
        digits = t + sizeof any - 1;
    }
    if (*digits < '0' || *digits > '9')
        return 0;
    char *end;
    errno = 0;
    const long pid = strtol(digits, &end, 10);
    if (end == digits || *end || errno || pid <= 0 || pid == (long)getpid())
        return 0;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* After a write of path: what writers of the same name killed mid-write
 * left beside it goes. */
static void remove_dead_tmps(const char *path, const char *dir)
{
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    DIR *d = opendir(dir);
    if (!d)
        return;
    char stale[PATH_MAX];
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (st_safetensors_dead_tmp(e->d_name, base) &&
            (size_t)snprintf(stale, sizeof stale, "%s/%s", dir, e->d_name) < sizeof stale)
            unlink(stale);
    closedir(d);
}

st_status st_safetensors_write(const char *path, const st_safetensors_tensor *tensors, int n,
                               const st_safetensors_meta_entry *meta, int n_meta)
{
    if (!path || !*path || n < 0 || n_meta < 0)
        return st_fail(ST_ERR_INVALID, "safetensors: no file name");
    /* the file is renamed into place: over a device, a FIFO or a link
     * that would replace the node itself, not write to it */
    struct stat sb;
    if (lstat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
        return st_fail(ST_ERR_INVALID, "%s: not a regular file (%s): a safetensors file is "
                       "written beside it and renamed over it; name a file", path,
                       S_ISLNK(sb.st_mode) ? "a symbolic link" : S_ISDIR(sb.st_mode) ? "a directory"
                       : S_ISFIFO(sb.st_mode) ? "a FIFO" : "a device or socket");
    ST_TRY(check_tensors(path, tensors, n));
    /* the data's CRC-32, which the reader checks: a flipped bit would
     * otherwise be a finite value like any other */
    uLong crc = crc32_z(0L, Z_NULL, 0);
    for (int i = 0; i < n; i++)
        crc = crc32_z(crc, tensors[i].data, elements(&tensors[i]) * dtypes[tensors[i].dtype].size);
    char crc_text[16];
    snprintf(crc_text, sizeof crc_text, "%08lx", (unsigned long)crc);
    st_safetensors_meta_entry *all = malloc((size_t)(n_meta + 1) * sizeof *all);
    if (!all)
        return st_fail(ST_ERR_NOMEM, "out of memory writing a safetensors header");
    int n_all = 0;   /* the caller's, less a CRC-32 of a file it read */
    for (int k = 0; k < n_meta; k++)
        if (!meta[k].key || strcmp(meta[k].key, ST_SAFETENSORS_CRC_KEY) != 0)
            all[n_all++] = meta[k];
    all[n_all++] = (st_safetensors_meta_entry){ ST_SAFETENSORS_CRC_KEY, crc_text };
    sbuf b = { 0 };
    st_status s = header(tensors, n, all, n_all, &b);
    free(all);
    if (s != ST_OK) {
        free(b.p);
        return s;
    }
    char tmp[PATH_MAX], dir[PATH_MAX];
    if (st_safetensors_tmp_name(path, tmp, sizeof tmp) != 0) {
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
    st_file_fault_in_write(path);
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
    remove_dead_tmps(path, dir);
    return ST_OK;
}

/* ------------------------------------------------------------ reading */

/* The header is parsed by jansson (doc/building.md says why), then its
 * tree is checked against the shape of a safetensors header: an object of
 * tensor objects (dtype, shape, data_offsets) and one object of strings. */

typedef struct reader {
    const char *path;
    const char *where;   /* "tensor 'a'" or "__metadata__": names the member in a message */
} reader;

static st_status perr(const reader *r, const char *what)
{
    return st_fail(ST_ERR_FORMAT, "%s: bad safetensors header, %s: %s", r->path, r->where, what);
}

/* jansson's error in the project's words ("expected X" first), control
 * bytes of the text it quotes replaced, so that it stays one line. */
static st_status library_error(const char *path, const json_error_t *e)
{
    static const struct {
        const char *library, *ours;
    } phrases[] = { { "'[' or '{' expected", "expected '{'" },
                    { "string or '}' expected", "expected a string or '}'" },
                    { "'}' expected", "expected '}'" }, { "']' expected", "expected ']'" },
                    { "':' expected", "expected ':'" } };
    char text[JSON_ERROR_TEXT_LENGTH + 32];
    snprintf(text, sizeof text, "%s", e->text);
    switch (json_error_code(e)) {
    case json_error_numeric_overflow:
        snprintf(text, sizeof text, "an integer too large (subtrain reads up to 2^63 - 1)");
        break;
    case json_error_end_of_input_expected:
        snprintf(text, sizeof text, "trailing bytes after the header's object");
        break;
    case json_error_duplicate_key:   /* the text ends with " near '<the key>'" */
        snprintf(text, sizeof text, "a key twice in one object%s",
                 strstr(e->text, " near ") ? strstr(e->text, " near ") : "");
        break;
    case json_error_out_of_memory:
        return st_fail(ST_ERR_NOMEM, "out of memory reading %s", path);
    default:
        for (size_t k = 0; k < sizeof phrases / sizeof *phrases; k++) {
            const size_t n = strlen(phrases[k].library);
            if (strncmp(e->text, phrases[k].library, n) == 0) {
                snprintf(text, sizeof text, "%s%s", phrases[k].ours, e->text + n);
                break;
            }
        }
    }
    for (char *c = text; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            *c = '?';
    return st_fail(ST_ERR_FORMAT, "%s: bad safetensors header at byte %d: %s", path,
                   e->position + 8, text);
}

/* [a, b, ...] of at most cap integers >= 0 and <= max. */
static st_status int_array(const reader *r, const json_t *a, uint64_t max, uint64_t *v, int cap,
                           int *n)
{
    if (!json_is_array(a))
        return perr(r, "expected an array");
    if (json_array_size(a) > (size_t)cap)
        return perr(r, "an array too long");
    *n = (int)json_array_size(a);
    for (int k = 0; k < *n; k++) {
        const json_t *x = json_array_get(a, (size_t)k);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return perr(r, "expected a non-negative integer");
        v[k] = (uint64_t)json_integer_value(x);
        if (v[k] > max)
            return perr(r, max == UINT64_MAX ? "an integer too large" : "a dimension too large");
    }
    return ST_OK;
}

static st_status tensor_entry(const reader *r, const json_t *obj, st_safetensors_tensor *t,
                              uint64_t off[2])
{
    int have_dtype = 0, have_shape = 0, have_off = 0;
    if (!json_is_object(obj))
        return perr(r, "expected a tensor's object");
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)obj, key, val) {
        if (strcmp(key, "dtype") == 0) {
            if (!json_is_string(val))
                return perr(r, "expected a string");
            const char *name = json_string_value(val);
            if (json_string_length(val) >= 16)
                return perr(r, "a string too long");
            int d = 0;
            while (d < N_DTYPES && strcmp(dtypes[d].name, name) != 0)
                d++;
            if (d == N_DTYPES)
                return st_fail(ST_ERR_FORMAT, "%s: tensor '%s' has dtype %s (subtrain reads "
                               "F32, U8, U64)", r->path, t->name, name);
            t->dtype = (st_dtype)d;
            have_dtype = 1;
        } else if (strcmp(key, "shape") == 0) {
            uint64_t v[ST_SAFETENSORS_MAX_DIMS];
            ST_TRY(int_array(r, val, (uint64_t)1 << 40, v, ST_SAFETENSORS_MAX_DIMS, &t->ndims));
            for (int d = 0; d < t->ndims; d++)
                t->shape[d] = (int64_t)v[d];
            have_shape = 1;
        } else if (strcmp(key, "data_offsets") == 0) {
            int n;
            ST_TRY(int_array(r, val, UINT64_MAX, off, 2, &n));
            if (n != 2)
                return perr(r, "data_offsets needs two integers");
            have_off = 1;
        } else {
            return perr(r, "an unknown or repeated key in a tensor's object");
        }
    }
    if (!have_dtype || !have_shape || !have_off)
        return st_fail(ST_ERR_FORMAT, "%s: tensor '%s' lacks its dtype, shape or data_offsets",
                       r->path, t->name);
    return ST_OK;
}

static st_status meta_entry(const reader *r, const json_t *obj, st_safetensors *f)
{
    if (!json_is_object(obj))
        return perr(r, "expected the metadata object");
    const size_t n = json_object_size(obj);
    if (!n)
        return ST_OK;
    /* keys and values are copied into one text buffer */
    size_t cap = 0;
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)obj, key, val) {
        if (!json_is_string(val))
            return perr(r, "expected a string");
        cap += strlen(key) + json_string_length(val) + 2;
    }
    f->meta_text = malloc(cap);
    f->meta = malloc(n * sizeof *f->meta);
    if (!f->meta_text || !f->meta)
        return st_fail(ST_ERR_NOMEM, "out of memory reading %s", r->path);
    size_t used = 0;
    json_object_foreach((json_t *)obj, key, val) {
        char *k = f->meta_text + used;
        used += (size_t)sprintf(k, "%s", key) + 1;
        char *v = f->meta_text + used;
        /* a value with \u0000 is refused by the parser: strlen is its length */
        used += (size_t)sprintf(v, "%s", json_string_value(val)) + 1;
        f->meta[f->n_meta++] = (st_safetensors_meta_entry){ k, v };
    }
    return ST_OK;
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

/* The tensors of the header's object, checked against data_bytes. */
static st_status read_tensors(const char *path, const json_t *root, st_safetensors *f,
                              const uint8_t *data, uint64_t data_bytes)
{
    const size_t cap = json_object_size(root);
    span *spans = malloc((cap ? cap : 1) * sizeof *spans);
    f->tensors = malloc((cap ? cap : 1) * sizeof *f->tensors);
    if (!spans || !f->tensors) {
        free(spans);
        return st_fail(ST_ERR_NOMEM, "out of memory reading %s", path);
    }
    st_status s = ST_OK;
    char where[ST_SAFETENSORS_MAX_NAME + 16];
    const char *name;
    const json_t *val;
    json_object_foreach((json_t *)root, name, val) {
        reader r = { path, where };
        if (strcmp(name, "__metadata__") == 0) {
            r.where = "__metadata__";
            if ((s = meta_entry(&r, val, f)) != ST_OK)
                break;
            continue;
        }
        if (strlen(name) >= ST_SAFETENSORS_MAX_NAME) {
            s = st_fail(ST_ERR_FORMAT, "%s: bad safetensors header: a tensor's name of %zu bytes "
                        "(a string too long: the limit is %d)", path, strlen(name),
                        ST_SAFETENSORS_MAX_NAME - 1);
            break;
        }
        snprintf(where, sizeof where, "tensor '%s'", name);
        st_safetensors_tensor *t = &f->tensors[f->n];
        memset(t, 0, sizeof *t);
        memcpy(t->name, name, strlen(name) + 1);
        uint64_t off[2];
        if ((s = tensor_entry(&r, val, t, off)) != ST_OK)
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
                        path, name);
            break;
        }
        if (off[0] > off[1] || off[1] > data_bytes || off[1] - off[0] != want) {
            s = st_fail(ST_ERR_FORMAT, "%s: tensor '%s' has data_offsets [%llu, %llu]: its "
                        "%s shape needs %llu bytes of the %llu the file holds", path,
                        name, (unsigned long long)off[0], (unsigned long long)off[1],
                        dtypes[t->dtype].name, (unsigned long long)want,
                        (unsigned long long)data_bytes);
            break;
        }
        t->bytes = (size_t)want;
        spans[f->n] = (span){ off[0], off[1] };
        f->n++;
    }
    if (s == ST_OK) {
        /* the tensors cover the data exactly: sorted, each starts where
         * the previous ended, the last ends at the end */
        span *sorted = malloc((size_t)(f->n ? f->n : 1) * sizeof *sorted);
        if (!sorted) {
            s = st_fail(ST_ERR_NOMEM, "out of memory reading %s", path);
        } else {
            if (f->n)
                memcpy(sorted, spans, (size_t)f->n * sizeof *sorted);
            qsort(sorted, (size_t)f->n, sizeof *sorted, by_begin);
            uint64_t at = 0;
            for (int i = 0; i < f->n && s == ST_OK; i++) {
                if (sorted[i].begin != at)
                    s = st_fail(ST_ERR_FORMAT, "%s: the tensors' data overlap or leave a hole "
                                "at byte %llu of the data", path, (unsigned long long)at);
                at = sorted[i].end;
            }
            if (s == ST_OK && at != data_bytes)
                s = st_fail(ST_ERR_FORMAT, "%s: %llu bytes after the last tensor's data "
                            "(truncated header or trailing data)", path,
                            (unsigned long long)(data_bytes - at));
            free(sorted);
        }
    }
    for (int i = 0; s == ST_OK && i < f->n; i++)
        f->tensors[i].data = data + spans[i].begin;
    free(spans);
    return s;
}

static st_status parse_header(const char *path, const char *text, size_t n, st_safetensors *f,
                              uint64_t data_bytes)
{
    /* duplicate keys are refused: a tensor or __metadata__ given twice,
     * a tensor's key twice, a metadata key twice */
    json_error_t e;
    json_t *root = json_loadb(text, n, JSON_REJECT_DUPLICATES, &e);
    if (!root)
        return library_error(path, &e);
    st_status s;
    if (!json_is_object(root)) {
        size_t at = 0;   /* the root's first byte */
        while (at < n && strchr(" \t\n\r", text[at]))
            at++;
        s = st_fail(ST_ERR_FORMAT, "%s: bad safetensors header at byte %zu: expected '{'", path,
                    at + 8);
    } else {
        s = read_tensors(path, root, f, (const uint8_t *)text + n, data_bytes);
    }
    json_decref(root);
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

int st_safetensors_first_not_finite(const st_safetensors_tensor *tensors, int n, size_t *at,
                                    const char **what)
{
    for (int i = 0; i < n; i++) {
        const st_safetensors_tensor *t = &tensors[i];
        if (t->dtype != ST_DTYPE_F32 && t->dtype != ST_DTYPE_BF16)
            continue;
        const int half = t->dtype == ST_DTYPE_BF16;
        const size_t count = elements(t);
        const size_t k = half ? first_not_finite16(t->data, count)
                              : first_not_finite(t->data, count);
        if (k == count)
            continue;
        uint32_t u = 0;
        if (half) {
            uint16_t h;
            memcpy(&h, (const unsigned char *)t->data + 2 * k, 2);
            u = (uint32_t)h << 16;
        } else {
            memcpy(&u, (const unsigned char *)t->data + 4 * k, 4);
        }
        *at = k;
        *what = u & 0x007fffffu ? "a NaN" : u >> 31 ? "-infinity" : "+infinity";
        return i;
    }
    return n;
}

/* Every F32 and BF16 value is finite: subtrain writes weights, optimizer
 * moments and running statistics of runs that were going well, and a NaN
 * or an infinity taken in would surface steps later as a loss that
 * "diverged". */
static st_status check_finite(const char *path, const st_safetensors *f)
{
    size_t k;
    const char *what;
    const int i = st_safetensors_first_not_finite(f->tensors, f->n, &k, &what);
    if (i == f->n)
        return ST_OK;
    return st_fail(ST_ERR_FORMAT, "%s: tensor '%s' holds %s at element %zu of %zu: "
                   "weights and training state must be finite", path, f->tensors[i].name, what,
                   k, elements(&f->tensors[i]));
}

/* The data against the CRC-32 the writer recorded (a file without one,
 * another writer's, is taken as it is). */
static st_status check_crc(const char *path, const st_safetensors *f, const uint8_t *data,
                           size_t n)
{
    const char *want = st_safetensors_meta(f, ST_SAFETENSORS_CRC_KEY);
    if (!want)
        return ST_OK;
    char *end;
    errno = 0;
    const unsigned long w = strtoul(want, &end, 16);
    if (strlen(want) != 8 || *end || errno)
        return st_fail(ST_ERR_FORMAT, "%s: the metadata's %s is '%s', not 8 hex digits", path,
                       ST_SAFETENSORS_CRC_KEY, want);
    uLong crc = crc32_z(0L, Z_NULL, 0);
    crc = crc32_z(crc, data, n);
    if ((unsigned long)crc != w)
        return st_fail(ST_ERR_FORMAT, "%s: the data's CRC-32 is %08lx, the header records %s: "
                       "the file is damaged", path, (unsigned long)crc, want);
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
    st_status s = parse_header(path, (const char *)buf + 8, (size_t)n, out, size - 8 - n);
    if (s == ST_OK)
        s = check_crc(path, out, buf + 8 + n, size - 8 - n);
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

/*
 * data/text.c — byte corpora for language models: a file read whole as
 * bytes (gzip-compressed or not, through zlib), split into a training
 * part and a held-out tail, seeded training windows, and the unigram
 * baseline a model's validation bits per byte must beat.
 *
 * The file comes from outside: its size is not trusted either, the buffer
 * grows as bytes arrive (a gzip member can claim anything).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/data.h>
#include <subtrain/rng.h>

#include "core/error.h"
#include "data/gzio.h"
#include "data/gather.h"

/* The buffer starts at 64 KiB and doubles: a small file costs no 1 MiB
 * (under AddressSanitizer such a block is an mmap and a TLB shootdown per
 * read, which held fuzz_text to 180 inputs a second), a large one a few
 * more reallocs. */
#define TEXT_FIRST_ALLOC ((size_t)1 << 16)
#define TEXT_MAX_BYTES ((size_t)1 << 32)   /* a corpus's bytes at most (doc/cli.md) */
#define TEXT_WINDOW_STREAM 0x7E47ull   /* namespace under the seed */

/* The bytes of the file, at most TEXT_MAX_BYTES of them: a plain file
 * larger than that is refused before a byte is read, a gzip stream once
 * it has inflated past it. */
static st_status read_all(st_gz *gz, const char *path, uint8_t **out, size_t *count)
{
    if (!st_gz_compressed(gz) && st_gz_file_bytes(gz) > TEXT_MAX_BYTES)
        return st_fail(ST_ERR_FORMAT, "%s: %llu bytes, more than a text corpus may hold "
                       "(%llu bytes, 4 GiB)", path, st_gz_file_bytes(gz),
                       (unsigned long long)TEXT_MAX_BYTES);
    size_t cap = TEXT_FIRST_ALLOC, n = 0;
    uint8_t *buf = malloc(cap);
    if (!buf)
        return st_fail(ST_ERR_NOMEM, "%s: out of memory reading the text", path);
    for (;;) {
        size_t got;
        st_status s = st_gz_read_upto(gz, path, buf + n, cap - n, &got);
        if (s != ST_OK) {
            free(buf);
            return s;
        }
        n += got;
        if (n < cap)
            break;   /* a short read: the end */
        if (n > TEXT_MAX_BYTES) {
            free(buf);
            return st_fail(ST_ERR_FORMAT, "%s: more than %llu bytes (4 GiB) once "
                           "decompressed, more than a text corpus may hold", path,
                           (unsigned long long)TEXT_MAX_BYTES);
        }
        /* one byte past the limit tells a corpus of exactly the limit from a larger one */
        const size_t grown = 2 * cap > TEXT_MAX_BYTES ? TEXT_MAX_BYTES + 1 : 2 * cap;
        uint8_t *b = realloc(buf, grown);
        if (!b) {
            free(buf);
            return st_fail(ST_ERR_NOMEM, "%s: out of memory reading the text", path);
        }
        buf = b;
        cap = grown;
    }
    *out = buf;
    *count = n;
    return ST_OK;
}

st_status st_text_load(const char *path, double holdout, st_text *out)
{
    if (!out)
        return st_fail(ST_ERR_INVALID, "st_text_load: no output");
    memset(out, 0, sizeof *out);
    if (!path)
        return st_fail(ST_ERR_INVALID, "st_text_load: no path");
    if (!(holdout > 0.0 && holdout < 1.0))
        return st_fail(ST_ERR_INVALID, "the held-out fraction must be in (0, 1), got %g",
                       holdout);
    st_gz *gz;
    ST_TRY(st_gz_open(path, 1u << 16, &gz));
    uint8_t *bytes = NULL;
    size_t n = 0;
    st_status s = read_all(gz, path, &bytes, &n);
    st_gz_close(gz);   /* read-only: every stream problem was reported above */
    ST_TRY(s);
    const size_t valid = (size_t)((double)n * holdout);
    if (n - valid < 2 || valid < 2) {
        free(bytes);
        return st_fail(ST_ERR_FORMAT, "%s: %zu bytes of text leave %zu for training and %zu "
                       "for validation (each needs at least 2)", path, n, n - valid, valid);
    }
    out->bytes = bytes;
    out->count = n;
    out->train_count = n - valid;
    return ST_OK;
}

void st_text_free(st_text *t)
{
    if (!t)
        return;
    free(t->bytes);
    memset(t, 0, sizeof *t);
}

size_t st_text_window(const st_text *t, int context, uint64_t seed, uint64_t epoch, uint64_t k)
{
    if (context < 1 || t->train_count <= (size_t)context)
        return 0;   /* no window fits: the caller checks first (documented) */
    const size_t starts = t->train_count - (size_t)context;   /* T + 1 bytes fit */
    st_rng root = st_rng_seed(seed);
    st_rng space = st_rng_split(&root, TEXT_WINDOW_STREAM);
    st_rng e = st_rng_split(&space, epoch);
    st_rng w = st_rng_split(&e, k);
    return (size_t)(st_rng_u64(&w) % (uint64_t)starts);
}

double st_text_unigram_bpb(const st_text *t)
{
    double count[256];
    for (int b = 0; b < 256; b++)
        count[b] = 1.0;   /* add-one: a byte the training part lacks costs log2(N + 256) */
    for (size_t i = 0; i < t->train_count; i++)
        count[t->bytes[i]] += 1.0;
    const double total = (double)t->train_count + 256.0;
    double bits = 0.0;
    for (size_t i = t->train_count; i < t->count; i++)
        bits -= log2(count[t->bytes[i]] / total);
    return bits / (double)(t->count - t->train_count);
}

/* ------------------------------------------------------------ as a dataset */

static st_status text_part(const uint8_t *bytes, size_t n, int context, const char *what,
                           st_dataset *d)
{
    if (n < (size_t)context + 1)
        return st_fail(ST_ERR_FORMAT, "the %s text has %zu bytes: too few for one window of "
                       "%d + 1", what, n, context);
    d->bytes = malloc(n);
    if (!d->bytes)
        return st_fail(ST_ERR_NOMEM, "out of memory copying %zu bytes of %s text", n, what);
    memcpy(d->bytes, bytes, n);
    d->n_bytes = n;
    d->context = (uint32_t)context;
    d->dim = d->channels = (uint32_t)context;
    d->height = d->width = 1;
    d->n_classes = 256;
    return ST_OK;
}

st_status st_text_dataset(const st_text *t, int context, uint64_t seed, uint32_t train_windows,
                          size_t val_bytes, st_dataset *train, st_dataset *test)
{
    memset(train, 0, sizeof *train);
    memset(test, 0, sizeof *test);
    if (context < 1 || context > (1 << 16))
        return st_fail(ST_ERR_INVALID, "context must be in [1, 65536], got %d", context);
    const size_t valid = t->count - t->train_count;
    const size_t nv = val_bytes && val_bytes < valid ? val_bytes : valid;
    st_status s = text_part(t->bytes, t->train_count, context, "training", train);
    if (s == ST_OK)
        s = text_part(t->bytes + t->train_count, nv, context, "validation", test);
    if (s != ST_OK) {   /* the parts hold their bytes alone */
        free(train->bytes);
        free(test->bytes);
        memset(train, 0, sizeof *train);
        memset(test, 0, sizeof *test);
        return s;
    }
    const size_t per_epoch = train_windows ? train_windows : t->train_count / (size_t)context;
    train->count = per_epoch > UINT32_MAX ? UINT32_MAX : (uint32_t)per_epoch;
    train->window_seed = seed;
    test->count = (uint32_t)((nv - 1) / (size_t)context);
    test->sequential = 1;
    return ST_OK;
}

/* Window k of a text set: its first byte. */
static size_t window_start(const st_dataset *d, uint64_t epoch, uint64_t k)
{
    if (d->sequential)
        return (size_t)k * d->context;
    const st_text part = { d->bytes, d->n_bytes, d->n_bytes };
    return st_text_window(&part, (int)d->context, d->window_seed, epoch, k);
}

void st_text_gather(const st_dataset *d, uint64_t epoch, const uint32_t *idx, uint32_t first,
                    size_t n, float *x_out, int32_t *y_out)
{
    const size_t T = d->context;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *w = d->bytes + window_start(d, epoch, idx ? idx[i] : first + i);
        for (size_t t = 0; t < T; t++) {
            x_out[i * T + t] = (float)w[t];
            y_out[i * T + t] = w[t + 1];
        }
    }
}

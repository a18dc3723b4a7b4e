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

#define TEXT_FIRST_ALLOC ((size_t)1 << 20)
#define TEXT_MAX_BYTES ((size_t)1 << 32)
#define TEXT_WINDOW_STREAM 0x7E47ull   /* namespace under the seed */

static st_status read_all(gzFile gz, const char *path, uint8_t **out, size_t *count)
{
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
        if (cap >= TEXT_MAX_BYTES) {
            free(buf);
            return st_fail(ST_ERR_FORMAT, "%s: more than %zu bytes of text", path,
                           (size_t)TEXT_MAX_BYTES);
        }
        uint8_t *b = realloc(buf, 2 * cap);
        if (!b) {
            free(buf);
            return st_fail(ST_ERR_NOMEM, "%s: out of memory reading the text", path);
        }
        buf = b;
        cap *= 2;
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
    gzFile gz;
    ST_TRY(st_gz_open(path, 1u << 16, &gz));
    uint8_t *bytes = NULL;
    size_t n = 0;
    st_status s = read_all(gz, path, &bytes, &n);
    gzclose(gz);   /* read-only: every stream problem was reported above */
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

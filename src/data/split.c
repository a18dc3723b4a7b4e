/*
 * data/split.c — non-iid splits of a training set over data-parallel
 * workers (doc/noniid.md): K classes per worker or a Dirichlet label
 * skew, and the epoch orders that read each worker's batches from its own
 * split.
 *
 * Dealing: the samples of each class, in stored order, are shuffled from
 * (seed, class), then cut into consecutive runs, one per worker that gets
 * some.  A worker's samples are its runs, class by class.  Every random
 * draw comes from the seed's ST_RNG_STREAM_SPLIT namespace, so the split
 * is the same wherever it is made (every rank of an MPI run makes it).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/data.h>
#include <subtrain/rng.h>

#include "core/error.h"
#include "core/rng_streams.h"

#define DEAL 0         /* ST_RNG_STREAM_SPLIT's stream of the dealing */
#define ORDERS 1       /* ... and of the epochs' orders */
#define CLASS_SHUFFLE 0   /* below DEAL: a class's shuffle, then its index */
#define PROPORTIONS 1     /* ... a Dirichlet draw, then its number, then the class */
#define DIRICHLET_DRAWS 100

struct st_split {
    int workers;
    uint32_t classes;
    uint32_t count;       /* the training set's samples */
    uint32_t *offsets;    /* workers + 1: worker g's samples are
                           * samples[offsets[g] .. offsets[g + 1]) */
    uint32_t *samples;    /* count: every sample once */
    uint32_t *histogram;  /* workers x classes */
    uint32_t largest;
};

/* ------------------------------------------------------------ the config */

/* A decimal number, the whole of s: digits, a point, an exponent; no
 * blanks, no inf, nan or hex. */
static int parse_decimal(const char *s, double *out)
{
    if (!*s || strspn(s, "0123456789.eE+-") != strlen(s))
        return -1;
    char *end;
    *out = strtod(s, &end);
    return *end == '\0' ? 0 : -1;
}

#define SPLIT_TEXT_(x) #x
#define SPLIT_TEXT(x) SPLIT_TEXT_(x)

/* Why text is not a split, or NULL when it is one (then *out holds it). */
static const char *split_reason(const char *text, st_split_config *out)
{
    st_split_config c = { ST_SPLIT_IID, 0, 0.0 };
    if (strcmp(text, "iid") == 0) {
        *out = c;
        return NULL;
    }
    if (strncmp(text, "classes:", 8) == 0) {
        const char *k = text + 8;
        unsigned long v = 0;
        int ok = *k && strspn(k, "0123456789") == strlen(k) && strlen(k) <= 3;
        if (ok)
            v = strtoul(k, NULL, 10);
        if (!ok || v < 1 || v > ST_SPLIT_MAX_CLASSES)
            return "K, the classes per worker, must be a whole number in [1, "
                   SPLIT_TEXT(ST_SPLIT_MAX_CLASSES) "]";
        c.kind = ST_SPLIT_CLASSES;
        c.classes = (uint32_t)v;
        *out = c;
        return NULL;
    }
    if (strncmp(text, "dirichlet:", 10) == 0) {
        double a;
        if (parse_decimal(text + 10, &a) != 0 || !isfinite(a) || !(a > 0.0))
            return "ALPHA, the Dirichlet concentration, must be a finite number > 0 "
                   "(0.1: a strong skew)";
        c.kind = ST_SPLIT_DIRICHLET;
        c.alpha = a;
        *out = c;
        return NULL;
    }
    return "expected iid, classes:K or dirichlet:ALPHA";
}

st_status st_split_parse_why(const char *text, st_split_config *out, const char **why)
{
    if (!text || !out)
        return st_fail(ST_ERR_INVALID, "st_split_parse: no text or no output");
    const char *r = split_reason(text, out);
    if (why)
        *why = r;
    if (r)
        return st_fail(ST_ERR_INVALID, "--split %.64s: %s", text, r);
    return ST_OK;
}

st_status st_split_parse(const char *text, st_split_config *out)
{
    return st_split_parse_why(text, out, NULL);
}

void st_split_name(const st_split_config *c, char *out, size_t n)
{
    if (n == 0)
        return;
    switch (c->kind) {
    case ST_SPLIT_CLASSES:
        snprintf(out, n, "classes:%lu", (unsigned long)c->classes);
        return;
    case ST_SPLIT_DIRICHLET:
        /* 6 digits, or as many more as read back as the same double */
        for (int digits = 6; digits <= 17; digits++) {
            snprintf(out, n, "dirichlet:%.*g", digits, c->alpha);
            if (strlen(out) < 10 || strtod(out + 10, NULL) == c->alpha)
                return;
        }
        return;
    case ST_SPLIT_IID:
        break;
    }
    snprintf(out, n, "iid");
}

st_status st_split_config_check(const st_split_config *c)
{
    char name[64];
    switch (c->kind) {
    case ST_SPLIT_IID:
        return ST_OK;
    case ST_SPLIT_CLASSES:
        if (c->classes < 1 || c->classes > ST_SPLIT_MAX_CLASSES)
            return st_fail(ST_ERR_INVALID, "--split classes:K: K must be in [1, %d], got %lu",
                           ST_SPLIT_MAX_CLASSES, (unsigned long)c->classes);
        return ST_OK;
    case ST_SPLIT_DIRICHLET:
        st_split_name(c, name, sizeof name);
        if (!isfinite(c->alpha) || !(c->alpha > 0.0))
            return st_fail(ST_ERR_INVALID, "--split %s: ALPHA must be a finite number > 0",
                           name);
        return ST_OK;
    }
    return st_fail(ST_ERR_INVALID, "unknown split kind %d (iid, classes:K or dirichlet:ALPHA)",
                   (int)c->kind);
}

/* ------------------------------------------------------------ dealing */

/* by_class[start[c] .. start[c + 1]): class c's samples, shuffled from
 * (seed, c). */
static void group_by_class(const st_dataset *d, const st_rng *deal, uint32_t *start,
                           uint32_t *by_class)
{
    const uint32_t C = d->n_classes;
    memset(start, 0, (C + 1) * sizeof *start);
    for (uint32_t i = 0; i < d->count; i++)
        start[d->y[i] + 1]++;
    for (uint32_t c = 0; c < C; c++)
        start[c + 1] += start[c];
    uint32_t *next = start + C + 1;   /* C more entries: the fill's positions */
    memcpy(next, start, C * sizeof *next);
    for (uint32_t i = 0; i < d->count; i++)
        by_class[next[d->y[i]]++] = i;
    const st_rng shuffles = st_rng_split(deal, CLASS_SHUFFLE);
    for (uint32_t c = 0; c < C; c++) {
        st_rng r = st_rng_split(&shuffles, c);
        st_rng_shuffle_u32(&r, by_class + start[c], start[c + 1] - start[c]);
    }
}

/* classes:K: class c's run for worker g is cut[c (W + 1) + g] ..
 * cut[c (W + 1) + g + 1] of its shuffled samples: its holders (the
 * workers g with c = (g K + j) mod C, j < K), in worker order, get even
 * shares; the others none. */
static void cut_classes(uint32_t K, int W, uint32_t C, const uint32_t *start, uint32_t *cut,
                        int *holders)
{
    for (uint32_t c = 0; c < C; c++) {
        const uint32_t n = start[c + 1] - start[c];
        int H = 0;
        for (int g = 0; g < W; g++) {
            int holds = 0;
            for (uint32_t j = 0; j < K; j++)
                holds |= ((uint64_t)g * K + j) % C == c;
            holders[g] = holds;
            H += holds;
        }
        uint32_t *run = cut + (size_t)c * ((size_t)W + 1);
        run[0] = 0;
        for (int g = 0, h = 0; g < W; g++) {
            h += holders[g];
            run[g + 1] = H ? (uint32_t)((uint64_t)n * (uint64_t)h / (uint64_t)H) : 0;
        }
    }
}

/* dirichlet:ALPHA, draw `draw`: class c's shares are proportions drawn
 * from Dir(ALPHA) over the W workers (normalised gamma draws, in
 * logarithms: small ALPHA underflows the draws themselves), its runs the
 * rounded running sums. */
static void cut_dirichlet(double alpha, int W, uint32_t C, const uint32_t *start,
                          const st_rng *deal, uint32_t draw, uint32_t *cut, double *w)
{
    const st_rng draws = st_rng_split(deal, PROPORTIONS);
    const st_rng this_draw = st_rng_split(&draws, draw);
    for (uint32_t c = 0; c < C; c++) {
        st_rng r = st_rng_split(&this_draw, c);
        double top = -INFINITY, sum = 0.0;
        for (int g = 0; g < W; g++) {
            w[g] = st_rng_gamma_log(&r, alpha);
            top = w[g] > top ? w[g] : top;
        }
        for (int g = 0; g < W; g++)
            sum += w[g] = exp(w[g] - top);
        const uint32_t n = start[c + 1] - start[c];
        uint32_t *run = cut + (size_t)c * ((size_t)W + 1);
        double acc = 0.0;
        run[0] = 0;
        for (int g = 0; g < W; g++) {
            acc += w[g];
            const double at = g + 1 == W ? (double)n : floor((double)n * (acc / sum) + 0.5);
            run[g + 1] = at > (double)n ? n : (uint32_t)at;
            if (run[g + 1] < run[g])
                run[g + 1] = run[g];
        }
    }
}

/* The samples each worker gets by the cuts, into the histogram; the
 * worker with the fewest (its index). */
static int tally(const uint32_t *cut, int W, uint32_t C, uint32_t *histogram, uint32_t *fewest)
{
    int worst = 0;
    *fewest = UINT32_MAX;
    for (int g = 0; g < W; g++) {
        uint32_t total = 0;
        for (uint32_t c = 0; c < C; c++) {
            const uint32_t *run = cut + (size_t)c * ((size_t)W + 1);
            total += histogram[(size_t)g * C + c] = run[g + 1] - run[g];
        }
        if (total < *fewest) {
            *fewest = total;
            worst = g;
        }
    }
    return worst;
}

/* The checks that need the data and the worker count, before dealing. */
static st_status check_data(const st_split_config *c, const char *name, const st_dataset *d,
                            int W)
{
    if (d->bytes || !d->y)
        return st_fail(ST_ERR_INVALID, "--split %s: text data has no classes to split by "
                       "(it takes --split iid only)", name);
    if (W < 1)
        return st_fail(ST_ERR_INVALID, "--split %s: %d workers", name, W);
    const uint32_t C = d->n_classes;
    if (c->kind != ST_SPLIT_CLASSES)
        return ST_OK;
    if (c->classes > C)
        return st_fail(ST_ERR_INVALID, "--split %s: the data has %lu classes, fewer than K = %lu",
                       name, (unsigned long)C, (unsigned long)c->classes);
    if ((uint64_t)W * c->classes < C)
        return st_fail(ST_ERR_INVALID, "--split %s with %d worker%s holds %llu of the data's %lu "
                       "classes: workers x K must be at least %lu, or classes go untrained",
                       name, W, W == 1 ? "" : "s", (unsigned long long)W * c->classes,
                       (unsigned long)C, (unsigned long)C);
    return ST_OK;
}

static st_status make(const st_split_config *c, const char *name, const st_dataset *d, int W,
                      uint64_t seed, uint32_t batch, st_split *s, uint32_t *work)
{
    const uint32_t C = d->n_classes;
    uint32_t *start = work, *by_class = work + 2 * (size_t)C + 1,
             *cut = by_class + d->count;
    const st_rng root = st_rng_seed(seed), split = st_rng_split(&root, ST_RNG_STREAM_SPLIT),
                 deal = st_rng_split(&split, DEAL);
    group_by_class(d, &deal, start, by_class);

    uint32_t fewest;
    if (c->kind == ST_SPLIT_CLASSES) {
        int *holders = malloc((size_t)W * sizeof *holders);
        if (!holders)
            return st_fail(ST_ERR_NOMEM, "--split %s: out of memory", name);
        cut_classes(c->classes, W, C, start, cut, holders);
        free(holders);
        const int worst = tally(cut, W, C, s->histogram, &fewest);
        if (fewest < batch)
            return st_fail(ST_ERR_INVALID, "--split %s with %d workers: worker %d would hold %lu "
                           "samples, fewer than a batch (%lu)", name, W, worst,
                           (unsigned long)fewest, (unsigned long)batch);
    } else {
        double *w = malloc((size_t)W * sizeof *w);
        if (!w)
            return st_fail(ST_ERR_NOMEM, "--split %s: out of memory", name);
        uint32_t draw = 0;
        do {
            cut_dirichlet(c->alpha, W, C, start, &deal, draw, cut, w);
            tally(cut, W, C, s->histogram, &fewest);
        } while (fewest < batch && ++draw < DIRICHLET_DRAWS);
        free(w);
        if (fewest < batch)
            return st_fail(ST_ERR_INVALID, "--split %s with %d workers: in %d draws some worker "
                           "always held fewer samples than a batch (%lu): raise ALPHA, or use "
                           "fewer workers or a smaller batch", name, W, DIRICHLET_DRAWS,
                           (unsigned long)batch);
    }
    /* the runs, worker by worker, class by class */
    s->offsets[0] = 0;
    s->largest = 0;
    for (int g = 0; g < W; g++) {
        uint32_t at = s->offsets[g];
        for (uint32_t k = 0; k < C; k++) {
            const uint32_t *run = cut + (size_t)k * ((size_t)W + 1);
            memcpy(s->samples + at, by_class + start[k] + run[g],
                   (size_t)(run[g + 1] - run[g]) * sizeof *s->samples);
            at += run[g + 1] - run[g];
        }
        s->offsets[g + 1] = at;
        if (at - s->offsets[g] > s->largest)
            s->largest = at - s->offsets[g];
    }
    return ST_OK;
}

st_status st_split_make(const st_split_config *c, const st_dataset *train, int workers,
                        uint64_t seed, uint32_t batch, st_split **out)
{
    if (!c || !train || !out)
        return st_fail(ST_ERR_INVALID, "st_split_make: no config, data or output");
    *out = NULL;
    ST_TRY(st_split_config_check(c));
    if (c->kind == ST_SPLIT_IID)
        return ST_OK;
    char name[64];
    st_split_name(c, name, sizeof name);
    ST_TRY(check_data(c, name, train, workers));
    if (batch < 1)
        return st_fail(ST_ERR_INVALID, "--split %s: a batch of 0 samples", name);
    const uint32_t C = train->n_classes;
    const size_t W = (size_t)workers;
    st_split *s = calloc(1, sizeof *s);
    /* the dealing's scratch: class starts and fill positions, samples by
     * class, every class's cuts */
    uint32_t *work = malloc(((2 * (size_t)C + 1) + train->count + C * (W + 1)) * sizeof *work);
    if (s) {
        s->offsets = malloc((W + 1) * sizeof *s->offsets);
        s->samples = malloc(((size_t)train->count + 1) * sizeof *s->samples);
        s->histogram = calloc(W * C, sizeof *s->histogram);
    }
    st_status st = !s || !work || !s->offsets || !s->samples || !s->histogram
                 ? st_fail(ST_ERR_NOMEM, "--split %s: out of memory for %zu workers' splits",
                           name, W)
                 : make(c, name, train, workers, seed, batch, s, work);
    free(work);
    if (st != ST_OK) {
        st_split_destroy(s);
        return st;
    }
    s->workers = workers;
    s->classes = C;
    s->count = train->count;
    *out = s;
    return ST_OK;
}

void st_split_destroy(st_split *s)
{
    if (!s)
        return;
    free(s->offsets);
    free(s->samples);
    free(s->histogram);
    free(s);
}

int st_split_workers(const st_split *s)
{
    return s->workers;
}

uint32_t st_split_classes(const st_split *s)
{
    return s->classes;
}

const uint32_t *st_split_samples(const st_split *s, int g, uint32_t *count)
{
    *count = s->offsets[g + 1] - s->offsets[g];
    return s->samples + s->offsets[g];
}

const uint32_t *st_split_histogram(const st_split *s)
{
    return s->histogram;
}

uint32_t st_split_largest(const st_split *s)
{
    return s->largest;
}

/* ------------------------------------------------------------ epochs */

void st_split_epoch_order(const st_split *s, uint64_t seed, uint64_t epoch, uint32_t batch,
                          uint32_t *scratch, uint32_t *order)
{
    const st_rng root = st_rng_seed(seed), split = st_rng_split(&root, ST_RNG_STREAM_SPLIT),
                 orders = st_rng_split(&split, ORDERS), this_epoch = st_rng_split(&orders, epoch);
    const uint64_t n = s->count, B = batch, stride = (uint64_t)s->workers * B;
    for (int g = 0; g < s->workers; g++) {
        const st_rng mine = st_rng_split(&this_epoch, (uint64_t)g);
        uint32_t len;
        const uint32_t *own = st_split_samples(s, g, &len);
        uint32_t used = len;   /* the pass is spent: the first position draws one */
        uint64_t pass = 0;
        for (uint64_t at = (uint64_t)g * B; at < n; at += stride)
            for (uint64_t b = 0; b < B && at + b < n; b++) {
                if (used == len) {
                    st_rng r = st_rng_split(&mine, pass++);
                    memcpy(scratch, own, (size_t)len * sizeof *scratch);
                    st_rng_shuffle_u32(&r, scratch, len);
                    used = 0;
                }
                order[at + b] = scratch[used++];
            }
    }
}

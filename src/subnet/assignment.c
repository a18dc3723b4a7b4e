/*
 * subnet/assignment.c — exactly-k, balanced, seeded assignments of units to
 * workers.
 *
 * The construction: lay the n_units x k holder slots out in a row, unit
 * after unit (each unit's k slots consecutive), and deal them to the
 * workers cyclically in the order of a random permutation of the workers.
 * Because k <= N, the k consecutive slots of a unit go to k different
 * workers; because the dealing is cyclic, the workers' counts differ by at
 * most one.  Shuffling the units first makes which unit lands with whom
 * random, and the worker permutation makes who gets the extra unit random.
 *
 * Layered units (neurons of several layers) are shuffled within their layer
 * only, so each layer's slots are one consecutive stretch of the dealing:
 * per-layer counts then differ by at most one too, as do the totals.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/rng.h>
#include <subtrain/subnet.h>

#include "core/enum_table.h"
#include "core/error.h"

#define ASSIGN_STREAM 0xA551ull   /* namespace under the seed */

static const st_enum_entry subnet_kind_entries[] = {
    { "block", ST_SUBNET_BLOCK },
    { "neuron", ST_SUBNET_NEURON },
};
static const st_enum_table subnet_kinds = ST_ENUM_TABLE("subnetwork unit", subnet_kind_entries);

static const st_enum_entry masking_entries[] = {
    { "forward", ST_MASKING_FORWARD },
    { "backward", ST_MASKING_BACKWARD },
};
static const st_enum_table maskings = ST_ENUM_TABLE("masking", masking_entries);

const char *st_subnet_kind_name(st_subnet_kind k)
{
    return st_enum_name(&subnet_kinds, (int)k);
}

st_status st_subnet_kind_parse(const char *name, st_subnet_kind *out)
{
    int v;
    ST_TRY(st_enum_parse(&subnet_kinds, name, &v));
    *out = (st_subnet_kind)v;
    return ST_OK;
}

const char *st_masking_name(st_masking m)
{
    return st_enum_name(&maskings, (int)m);
}

st_status st_masking_parse(const char *name, st_masking *out)
{
    int v;
    ST_TRY(st_enum_parse(&maskings, name, &v));
    *out = (st_masking)v;
    return ST_OK;
}

int st_subnet_holders_per_unit(int workers, double coverage)
{
    long k = lround(coverage * workers);
    if (k < 1)
        k = 1;
    if (k > workers)
        k = workers;
    return (int)k;
}

void st_assignment_free(st_assignment *a)
{
    free(a->held);
    free(a->count);
    memset(a, 0, sizeof *a);
}

/* The construction for units in consecutive sections of sizes[l] units
 * (size: all of them that size): shuffled within their section, dealt
 * cyclically in section order. */
static st_status make_sections(int n_workers, int n_sections, const int *sizes, int size, int k,
                               uint64_t seed, uint64_t round, st_assignment *out)
{
    memset(out, 0, sizeof *out);
    long n_units = 0;
    int ok = n_workers >= 1 && n_sections >= 1 && k >= 1 && k <= n_workers;
    for (int l = 0; l < n_sections && ok; l++) {
        const int u = sizes ? sizes[l] : size;
        ok = u >= 1 && u <= (1 << 30);
        n_units += u;
    }
    if (!ok || n_units > (1L << 30))
        return st_fail(ST_ERR_INVALID, "assignment: %d sections of units, each held by %d of %d "
                       "workers: need 1 <= k <= workers and at least one unit in each", n_sections,
                       k, n_workers);
    out->n_workers = n_workers;
    out->n_units = (int)n_units;
    out->k = k;
    out->held = calloc((size_t)n_workers * (size_t)n_units, 1);
    out->count = calloc((size_t)n_workers, sizeof *out->count);
    uint32_t *units = malloc((size_t)n_units * sizeof *units);
    uint32_t *workers = malloc((size_t)n_workers * sizeof *workers);
    if (!out->held || !out->count || !units || !workers) {
        free(units);
        free(workers);
        st_assignment_free(out);
        return st_fail(ST_ERR_NOMEM, "out of memory assigning %ld units to %d workers",
                       n_units, n_workers);
    }
    st_rng root = st_rng_seed(seed);
    st_rng space = st_rng_split(&root, ASSIGN_STREAM);
    st_rng r = st_rng_split(&space, round);
    for (long u = 0; u < n_units; u++)
        units[u] = (uint32_t)u;
    for (int w = 0; w < n_workers; w++)
        workers[w] = (uint32_t)w;
    /* units shuffled within their section only: a section's slots stay one
     * consecutive stretch of the cyclic dealing */
    size_t first = 0;
    for (int l = 0; l < n_sections; l++) {
        const size_t u = (size_t)(sizes ? sizes[l] : size);
        st_rng_shuffle_u32(&r, units + first, u);
        first += u;
    }
    st_rng_shuffle_u32(&r, workers, (size_t)n_workers);
    size_t slot = 0;
    for (long i = 0; i < n_units; i++)
        for (int j = 0; j < k; j++, slot++) {
            int w = (int)workers[slot % (size_t)n_workers];
            out->held[(size_t)w * (size_t)n_units + units[i]] = 1;
            out->count[w]++;
        }
    free(units);
    free(workers);
    return ST_OK;
}

st_status st_assignment_make(int n_workers, int n_units, int k, uint64_t seed, uint64_t round,
                             st_assignment *out)
{
    return make_sections(n_workers, 1, NULL, n_units, k, seed, round, out);
}

st_status st_assignment_make_layered(int n_workers, int n_layers, int units_per_layer, int k,
                                     uint64_t seed, uint64_t round, st_assignment *out)
{
    if ((long)n_layers * (long)units_per_layer > (1L << 30))
        return st_fail(ST_ERR_INVALID, "assignment: %d layers of %d units: too many units",
                       n_layers, units_per_layer);
    return make_sections(n_workers, n_layers, NULL, units_per_layer, k, seed, round, out);
}

st_status st_assignment_make_sections(int n_workers, int n_sections, const int *sizes, int k,
                                      uint64_t seed, uint64_t round, st_assignment *out)
{
    if (!sizes)
        return st_fail(ST_ERR_INVALID, "assignment: no section sizes");
    return make_sections(n_workers, n_sections, sizes, 0, k, seed, round, out);
}

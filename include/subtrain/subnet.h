/*
 * subtrain/subnet.h — subnetworks: which units of the model each worker
 * holds.
 *
 * A unit is a residual block (block level) or an aligned group of hidden
 * neurons of a block's inner layer (neuron level).  Coverage C in (0, 1]
 * sets how many workers hold each unit: k = max(1, round(C N)).  Every unit
 * is held by exactly k workers, per-worker unit counts differ by at most
 * one, and the assignment is random from (seed, round), so it can be redrawn
 * every R steps and stay reproducible.
 */
#ifndef SUBTRAIN_SUBNET_H
#define SUBTRAIN_SUBNET_H

#include <stdint.h>
#include <subtrain/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum st_subnet_kind { ST_SUBNET_BLOCK, ST_SUBNET_NEURON } st_subnet_kind;
typedef enum st_masking { ST_MASKING_FORWARD, ST_MASKING_BACKWARD } st_masking;

const char *st_subnet_kind_name(st_subnet_kind k);
st_status st_subnet_kind_parse(const char *name, st_subnet_kind *out);
const char *st_masking_name(st_masking m);
st_status st_masking_parse(const char *name, st_masking *out);

/* k = max(1, round(coverage x workers)), never more than workers. */
int st_subnet_holders_per_unit(int workers, double coverage);

/* Which worker holds which unit. */
typedef struct st_assignment {
    int n_workers, n_units, k;
    uint8_t *held;      /* n_workers x n_units, row-major: 1 if held */
    int *count;         /* n_workers: units held by each worker */
} st_assignment;

/* Draws the assignment of `round` (0 for a fixed one) from the seed.
 * 1 <= k <= n_workers, n_units >= 1. */
st_status st_assignment_make(int n_workers, int n_units, int k, uint64_t seed, uint64_t round,
                             st_assignment *out);
/* The same for units in layers (neuron groups of every neuron layer):
 * unit l x units_per_layer + j is group j of layer l.  Within every layer,
 * too, each unit has exactly k holders and workers' counts differ by at
 * most one — so every layer of a worker's subnetwork keeps
 * floor(units_per_layer k / n_workers) units or one more. */
st_status st_assignment_make_layered(int n_workers, int n_layers, int units_per_layer, int k,
                                     uint64_t seed, uint64_t round, st_assignment *out);
/* The same for units in consecutive sections of different sizes (a
 * ResNet's blocks, stage by stage: unit numbers run through the sections
 * in order).  Within every section each unit has exactly k holders and the
 * dealing continues from one section into the next, so a worker's units
 * of each section differ from another's by at most one, and its total
 * too: with k = 1, a partition of every section (ResIST's blocks per
 * stage).  One section of n units is st_assignment_make. */
st_status st_assignment_make_sections(int n_workers, int n_sections, const int *sizes, int k,
                                      uint64_t seed, uint64_t round, st_assignment *out);
void st_assignment_free(st_assignment *a);

static inline int st_assignment_holds(const st_assignment *a, int worker, int unit)
{
    return a->held[(size_t)worker * (size_t)a->n_units + (size_t)unit];
}

#ifdef __cplusplus
}
#endif
#endif /* SUBTRAIN_SUBNET_H */

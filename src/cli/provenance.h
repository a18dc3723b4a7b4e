/*
 * cli/provenance.h — what made a run, written as "run" with the first
 * record of its metrics file (doc/provenance.md): the resolved
 * configuration, the versions of subtrain (and its git description),
 * oneDNN (and its effective ISA) and hwloc, the machine, where each worker
 * runs, the seed, the start time and a non-iid split's class histogram
 * per worker.
 */
#ifndef SUBTRAIN_CLI_PROVENANCE_H
#define SUBTRAIN_CLI_PROVENANCE_H

#include <stdio.h>
#include <subtrain/train.h>

#include "cli/options.h"

typedef struct st_cli_provenance {
    char *config;          /* the configuration as a JSON object (malloc'd) */
    char cpu[256];         /* "" when nobody says */
    int cores, pus, numa;  /* of the whole machine (0: its topology failed) */
    int workers;           /* the run's workers, all ranks, as planned here
                            * (0: the plan failed; the run will say why) */
    int rank;
    uint64_t seed;
    char start_time[32];   /* UTC, ISO 8601 */
    st_split *split;       /* the training set over the workers; NULL: iid */
    char split_name[64];   /* its --split */
} st_cli_provenance;

/* Before the run: everything but the placement, which the first record
 * brings (the plan the workers are bound by).  0, or -1 when out of
 * memory (said on stderr). */
int st_cli_provenance_make(const st_cli_options *o, st_cli_provenance *p);
/* Once the data is loaded: the split of the training set over the run's
 * workers (o->train.split, as the run deals it).  0, or -1 when it is
 * refused, a usage error (said on stderr). */
int st_cli_provenance_split(st_cli_provenance *p, const st_cli_options *o,
                            const st_dataset *train);
/* "run":{...} (no comma after it). */
void st_cli_provenance_write(FILE *f, const st_cli_provenance *p, const st_epoch_record *rec);
void st_cli_provenance_free(st_cli_provenance *p);

#endif /* SUBTRAIN_CLI_PROVENANCE_H */

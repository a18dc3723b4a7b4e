/*
 * cli/export_cmd.h — the model that `subtrain eval` evaluates and
 * `subtrain export` writes: --init's weights, with a batch norm's running
 * statistics; and `subtrain export` itself (doc/interop.md).
 */
#ifndef SUBTRAIN_CLI_EXPORT_CMD_H
#define SUBTRAIN_CLI_EXPORT_CMD_H

#include <subtrain/subtrain.h>

#include "cli/options.h"

/* Where a model's batch norms' running statistics came from. */
typedef enum st_cli_stats {
    ST_CLI_STATS_NONE,         /* the model has no batch norm */
    ST_CLI_STATS_FILE,         /* --init's file held them (a torch-layout file) */
    ST_CLI_STATS_CALIBRATED,   /* re-estimated on training batches */
    ST_CLI_STATS_INITIAL,      /* mean 0, variance 1: no batch to estimate them on */
} st_cli_stats;

/* The full model of o's options, built for o's batch on `arena`, with the
 * weights of --init's file f (read by the caller; either layout) and the branch scale the run
 * that wrote it evaluated with; a batch norm's running statistics are the
 * file's when it holds them, else re-estimated as the mean of the batch
 * statistics of the first --bn-calibration batches of `train`, in order
 * (st_model_calibrate).  *stats says which, *batches how many were used.
 * Returns the exit status: 0, or 1 after printing one line. */
int st_cli_init_model(const st_cli_options *o, const st_safetensors *f, const st_dataset *train,
                      st_arena *arena, st_model **out, st_cli_stats *stats, int *batches);

/* subtrain export: --init's weights (and running statistics) written to
 * -o in the layout of --format.  Returns the exit status (0, or 1 after
 * printing one line). */
int st_cli_export(const st_cli_options *o, const st_dataset *train);

#endif /* SUBTRAIN_CLI_EXPORT_CMD_H */

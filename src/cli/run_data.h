/*
 * cli/run_data.h — the data of a run's options (--data and its companions).
 */
#ifndef SUBTRAIN_CLI_RUN_DATA_H
#define SUBTRAIN_CLI_RUN_DATA_H

#include "cli/options.h"

/* The data --data names, normalised (per channel for images of several
 * channels, else over all features; text is left as bytes), and the
 * model's input and classes (and image shape) from it.  Text data says
 * what it loaded unless o->quiet. */
st_status st_cli_load_run_data(st_cli_options *o, st_dataset *train, st_dataset *test);

/* st_cli_load_run_data for what reads the data's shapes only (a plan):
 * synthetic data without --split draws no sample (x and y NULL); other
 * data is loaded, not normalised, an IDX set's (Fashion-MNIST's) without
 * its values (x NULL): nothing reads them. */
st_status st_cli_load_run_shapes(st_cli_options *o, st_dataset *train, st_dataset *test);

#endif /* SUBTRAIN_CLI_RUN_DATA_H */

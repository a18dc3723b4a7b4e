/*
 * cli/options.h — the command line of `subtrain train`.
 *
 * Parsing never exits: it fills st_cli_options or returns a one-line message
 * naming the option and what is allowed; main() prints it and exits 2.
 */
#ifndef SUBTRAIN_CLI_OPTIONS_H
#define SUBTRAIN_CLI_OPTIONS_H

#include <subtrain/train.h>

typedef enum st_progress_mode {
    ST_PROGRESS_AUTO, ST_PROGRESS_BAR, ST_PROGRESS_PLAIN, ST_PROGRESS_NONE
} st_progress_mode;

typedef enum st_cli_action { ST_CLI_RUN, ST_CLI_HELP, ST_CLI_VERSION } st_cli_action;

typedef struct st_cli_options {
    st_cli_action action;
    st_train_config train;
    const char *data;          /* directory, or "synthetic" */
    const char *metrics_path;  /* NULL: no metrics file */
    st_progress_mode progress;
    int quiet;
    int report_memory;         /* --report memory: every worker's breakdown */
} st_cli_options;

/* Returns 0, or -1 with a message (without the program name) in err. */
int st_cli_parse(int argc, char **argv, st_cli_options *o, char *err, size_t err_len);

void st_cli_print_help(FILE *f);

#endif /* SUBTRAIN_CLI_OPTIONS_H */

/*
 * cli/options.h — the command line of `subtrain train`.
 *
 * Parsing never exits: it fills st_cli_options or returns a one-line message
 * naming the option and what is allowed; main() prints it and exits 2.
 */
#ifndef SUBTRAIN_CLI_OPTIONS_H
#define SUBTRAIN_CLI_OPTIONS_H

#include <subtrain/strategy.h>
#include <subtrain/train.h>

#include "cli/config_file.h"

typedef enum st_progress_mode {
    ST_PROGRESS_AUTO, ST_PROGRESS_BAR, ST_PROGRESS_PLAIN, ST_PROGRESS_NONE
} st_progress_mode;

typedef enum st_cli_action {
    ST_CLI_RUN, ST_CLI_EVAL, ST_CLI_EXPORT, ST_CLI_HELP, ST_CLI_VERSION
} st_cli_action;

/* subtrain export --format: the layout it writes (doc/interop.md). */
typedef enum st_cli_format { ST_CLI_FORMAT_TORCH, ST_CLI_FORMAT_SUBTRAIN } st_cli_format;

/* What --data names (doc/cli.md). */
typedef enum st_cli_data_kind {
    ST_CLI_DATA_FASHION,     /* DIR: Fashion-MNIST's four IDX files, 10 classes */
    ST_CLI_DATA_SYNTHETIC,   /* synthetic */
    ST_CLI_DATA_CIFAR10,     /* cifar10:DIR */
    ST_CLI_DATA_CIFAR100,    /* cifar100:DIR */
    ST_CLI_DATA_IDX,         /* idx:DIR[:TRAIN_IMAGES,TRAIN_LABELS,TEST_IMAGES,TEST_LABELS] */
    ST_CLI_DATA_TEXT,        /* text:FILE: bytes for a language model (dir holds FILE) */
} st_cli_data_kind;

#define ST_CLI_DATA_PATH_MAX 4096

typedef struct st_cli_data {
    st_cli_data_kind kind;
    char dir[ST_CLI_DATA_PATH_MAX];          /* every kind but synthetic */
    int has_names;                           /* idx: the four names were given */
    char names[4][ST_CLI_DATA_PATH_MAX];     /* idx: relative to dir */
} st_cli_data;

typedef struct st_cli_options {
    st_cli_action action;
    st_train_config train;
    const char *data;          /* --data as given (or its default) */
    st_cli_data data_spec;     /* what it names */
    st_augment augment;        /* --augment-crop, --augment-flip (seed: at load) */
    const char *metrics_path;  /* NULL: no metrics file */
    st_progress_mode progress;
    int quiet;
    int report_memory;         /* --report memory: every worker's breakdown */
    /* text data (--data text:FILE) */
    float holdout;             /* --holdout: the validation tail's fraction */
    uint64_t val_bytes;        /* --val-bytes: of it evaluated (0: all) */
    uint64_t epoch_windows;    /* --epoch-windows: windows an epoch (0: a pass) */
    /* sampling after training (--model gpt) */
    uint64_t sample;           /* --sample: bytes to generate (0: none) */
    const char *checkpoint_dir; /* --checkpoint: the final weights go there */
    const char *init_path;     /* --init: weights to start from (eval: to evaluate;
                                * export: to convert) */
    const char *output_path;   /* export -o: the file written */
    st_cli_format format;      /* export --format */
    const char *resume_path;   /* --resume: a step checkpoint, or a directory of them */
    int usr1_checkpoint;       /* --usr1 checkpoint: SIGUSR1 checkpoints and goes on */
    int slurm_cpus;            /* --workers cores capped by SLURM_CPUS_PER_TASK (0: not) */
    const char *prompt;        /* --prompt: what they continue ("": a newline) */
    float temperature;         /* --temperature: 0 is greedy */
    int top_k;                 /* --top-k: 0 keeps all 256 bytes */
    const char *config_path;   /* --config: options read from it first */
    st_cli_config_file config; /* its entries (o's strings may point into it) */
    int dump_config;           /* --dump-config: print the configuration, exit */
} st_cli_options;

/* Returns 0, or -1 with a message (without the program name) in err.
 * With --config FILE the file's options are applied first, then the
 * command line's, whatever their order: the command line wins. */
int st_cli_parse(int argc, char **argv, st_cli_options *o, char *err, size_t err_len);
/* Which input of the run's options the existing file `path` is ("the
 * file --config reads", "the weights --init reads", "the checkpoint
 * --resume reads", "the text --data reads"), or NULL: an output that names
 * one would destroy it. */
const char *st_cli_input_named(const st_cli_options *o, const char *path);
/* Whether paths a and b (either may be NULL) name one existing file. */
int st_cli_same_file(const char *a, const char *b);
/* What st_cli_parse allocated (the configuration file). */
void st_cli_options_free(st_cli_options *o);

/* The resolved configuration, every option of `subtrain train` but the
 * actions (--help, --version, --config, --dump-config), in the option
 * table's order: calls emit(key, value) with the value as a configuration
 * line carries it (st_cli_config_quote; "": the option's default, which
 * depends on the others or on the data, or the option does not apply). */
void st_cli_config_each(const st_cli_options *o,
                        void (*emit)(const char *key, const char *value, void *user),
                        void *user);
/* --dump-config: the same as `key = value` lines, a comment first. */
void st_cli_config_dump(FILE *f, const st_cli_options *o);

void st_cli_print_help(FILE *f);

#endif /* SUBTRAIN_CLI_OPTIONS_H */

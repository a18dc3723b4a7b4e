/*
 * cli/option_table.h — the options of `subtrain train`: their numbers and
 * getopt_long's table, the command's own options with the strategies'
 * (their descriptors, subtrain/strategy.h) after --report.  Read by the
 * parser (options.c) and by --dump-config (config_dump.c).
 */
#ifndef SUBTRAIN_CLI_OPTION_TABLE_H
#define SUBTRAIN_CLI_OPTION_TABLE_H

#include <getopt.h>

#include <subtrain/strategy.h>

enum {
    OPT_DATA = 256, OPT_MODEL, OPT_DEPTH, OPT_WIDTH, OPT_HIDDEN, OPT_ACTIVATION,
    OPT_EPOCHS, OPT_STEPS, OPT_BATCH, OPT_OPTIMIZER, OPT_LR, OPT_MOMENTUM,
    OPT_WEIGHT_DECAY, OPT_SCHEDULE, OPT_WARMUP, OPT_SEED, OPT_METRICS, OPT_PROGRESS,
    OPT_STRATEGY, OPT_WORKERS, OPT_TOPOLOGY, OPT_CPUSET, OPT_OVERSUBSCRIBE,
    OPT_NEURON_GROUP, OPT_BN_CALIBRATION, OPT_REPORT,
    OPT_AUGMENT_CROP, OPT_AUGMENT_FLIP, OPT_SPLIT,
    OPT_CONTEXT, OPT_HEADS, OPT_HOLDOUT, OPT_VAL_BYTES, OPT_EPOCH_WINDOWS,
    OPT_SAMPLE, OPT_PROMPT, OPT_TEMPERATURE, OPT_TOP_K, OPT_CHECKPOINT, OPT_INIT,
    OPT_CHECKPOINT_EVERY, OPT_KEEP, OPT_RESUME, OPT_USR1, OPT_THREADS, OPT_TEAM_SPANS,
    OPT_PRECISION, OPT_BF16_EMULATED, OPT_COMM_PRECISION, OPT_CONFIG, OPT_DUMP_CONFIG,
    OPT_FORMAT,
    OPT_ACCUMULATE, OPT_OPTIMIZER_MOMENTS, OPT_PATCH, OPT_POOL, OPT_WEIGHTS, OPT_UNFUSE,
    OPT_RECOMPUTE, OPT_MASTER_WEIGHTS, OPT_ACTIVATION_PRECISION, OPT_TENSOR_LAYOUT,
    OPT_WEIGHT_LAYOUT,
    /* the strategies' options: OPT_STRATEGY_OPTION + their index in the
     * table st_cli_option_table() makes */
    OPT_STRATEGY_OPTION = 1024,
};

/* The most names the strategies' options have together. */
#define MAX_STRATEGY_OPTIONS 64

/* The options' table, ended by a NULL name.  Made at the first call. */
const struct option *st_cli_option_table(void);
/* The strategies' option names, each once: k in [0, count), with the first
 * strategy's descriptor of it; its option's number OPT_STRATEGY_OPTION + k. */
int st_cli_strategy_option_count(void);
const st_strategy_option *st_cli_strategy_option(int k);
/* Strategy s's descriptor of option `name`, NULL if it has none. */
const st_strategy_option *st_cli_strategy_descriptor(st_strategy s, const char *name);
/* The option of that long name, NULL if none. */
const struct option *st_cli_option_named(const char *key);
/* The options that do something rather than configure the run. */
int st_cli_option_is_action(int c);

#endif /* SUBTRAIN_CLI_OPTION_TABLE_H */

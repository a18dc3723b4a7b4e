/* cli/option_table.c — getopt_long's table of `subtrain train`: the
 * command's own options, and each name of the strategies' options once. */
#include <string.h>

#include "cli/option_table.h"

/* The command's own options; the strategies' follow --report (the
 * options' table, st_cli_option_table()). */
static const struct option own_options[] = {
    { "data", required_argument, NULL, OPT_DATA },
    { "augment-crop", required_argument, NULL, OPT_AUGMENT_CROP },
    { "augment-flip", no_argument, NULL, OPT_AUGMENT_FLIP },
    { "split", required_argument, NULL, OPT_SPLIT },
    { "context", required_argument, NULL, OPT_CONTEXT },
    { "heads", required_argument, NULL, OPT_HEADS },
    { "patch", required_argument, NULL, OPT_PATCH },
    { "pool", required_argument, NULL, OPT_POOL },
    { "holdout", required_argument, NULL, OPT_HOLDOUT },
    { "val-bytes", required_argument, NULL, OPT_VAL_BYTES },
    { "epoch-windows", required_argument, NULL, OPT_EPOCH_WINDOWS },
    { "sample", required_argument, NULL, OPT_SAMPLE },
    { "checkpoint", required_argument, NULL, OPT_CHECKPOINT },
    { "init", required_argument, NULL, OPT_INIT },
    { "format", required_argument, NULL, OPT_FORMAT },
    { "output", required_argument, NULL, 'o' },
    { "checkpoint-every", required_argument, NULL, OPT_CHECKPOINT_EVERY },
    { "keep", required_argument, NULL, OPT_KEEP },
    { "resume", required_argument, NULL, OPT_RESUME },
    { "usr1", required_argument, NULL, OPT_USR1 },
    { "prompt", required_argument, NULL, OPT_PROMPT },
    { "temperature", required_argument, NULL, OPT_TEMPERATURE },
    { "top-k", required_argument, NULL, OPT_TOP_K },
    { "model", required_argument, NULL, OPT_MODEL },
    { "depth", required_argument, NULL, OPT_DEPTH },
    { "width", required_argument, NULL, OPT_WIDTH },
    { "hidden", required_argument, NULL, OPT_HIDDEN },
    { "activation", required_argument, NULL, OPT_ACTIVATION },
    { "precision", required_argument, NULL, OPT_PRECISION },
    { "bf16-emulated", no_argument, NULL, OPT_BF16_EMULATED },
    { "unfuse", required_argument, NULL, OPT_UNFUSE },
    { "recompute", required_argument, NULL, OPT_RECOMPUTE },
    { "activation-precision", required_argument, NULL, OPT_ACTIVATION_PRECISION },
    { "tensor-layout", required_argument, NULL, OPT_TENSOR_LAYOUT },
    { "weight-layout", required_argument, NULL, OPT_WEIGHT_LAYOUT },
    { "epochs", required_argument, NULL, OPT_EPOCHS },
    { "steps", required_argument, NULL, OPT_STEPS },
    { "batch", required_argument, NULL, OPT_BATCH },
    { "accumulate", required_argument, NULL, OPT_ACCUMULATE },
    { "optimizer", required_argument, NULL, OPT_OPTIMIZER },
    { "lr", required_argument, NULL, OPT_LR },
    { "momentum", required_argument, NULL, OPT_MOMENTUM },
    { "weight-decay", required_argument, NULL, OPT_WEIGHT_DECAY },
    { "optimizer-moments", required_argument, NULL, OPT_OPTIMIZER_MOMENTS },
    { "master-weights", required_argument, NULL, OPT_MASTER_WEIGHTS },
    { "schedule", required_argument, NULL, OPT_SCHEDULE },
    { "warmup", required_argument, NULL, OPT_WARMUP },
    { "seed", required_argument, NULL, OPT_SEED },
    { "metrics", required_argument, NULL, OPT_METRICS },
    { "progress", required_argument, NULL, OPT_PROGRESS },
    { "strategy", required_argument, NULL, OPT_STRATEGY },
    { "workers", required_argument, NULL, OPT_WORKERS },
    { "topology", required_argument, NULL, OPT_TOPOLOGY },
    { "cpuset", required_argument, NULL, OPT_CPUSET },
    { "oversubscribe", no_argument, NULL, OPT_OVERSUBSCRIBE },
    { "threads-per-worker", required_argument, NULL, OPT_THREADS },
    { "team-spans-domains", no_argument, NULL, OPT_TEAM_SPANS },
    { "comm-precision", required_argument, NULL, OPT_COMM_PRECISION },
    { "weights", required_argument, NULL, OPT_WEIGHTS },
    { "neuron-group", required_argument, NULL, OPT_NEURON_GROUP },
    { "bn-calibration", required_argument, NULL, OPT_BN_CALIBRATION },
    { "report", required_argument, NULL, OPT_REPORT },
    /* the strategies' options here */
    { "quiet", no_argument, NULL, 'q' },
    { "config", required_argument, NULL, OPT_CONFIG },
    { "dump-config", no_argument, NULL, OPT_DUMP_CONFIG },
    { "help", no_argument, NULL, 'h' },
    { "version", no_argument, NULL, 'V' },
    { NULL, 0, NULL, 0 },
};
#define N_OWN_OPTIONS ((int)(sizeof own_options / sizeof *own_options) - 1)

/* Each name of the strategies' options once, with the first strategy's
 * descriptor of it (strategies that share a name share its value's
 * syntax: test_train's strategy/names_options_and_shared_syntax_agree). */
static const st_strategy_option *strategy_option[MAX_STRATEGY_OPTIONS];
static int n_strategy_options;
static struct option table[N_OWN_OPTIONS + MAX_STRATEGY_OPTIONS + 1];

const st_strategy_option *st_cli_strategy_descriptor(st_strategy s, const char *name)
{
    const st_strategy_info *info = st_strategy_info_of(s);
    for (const st_strategy_option *d = info ? info->options : NULL; d && d->name; d++)
        if (strcmp(d->name, name) == 0)
            return d;
    return NULL;
}

static void add_strategy_options(int *n)
{
    for (int s = 0; st_strategy_info_of((st_strategy)s); s++)
        for (const st_strategy_option *d = st_strategy_info_of((st_strategy)s)->options;
             d && d->name; d++) {
            int k = 0;
            while (k < n_strategy_options && strcmp(strategy_option[k]->name, d->name) != 0)
                k++;
            if (k < n_strategy_options || k == MAX_STRATEGY_OPTIONS)
                continue;   /* (the cap is far above what the strategies have) */
            strategy_option[n_strategy_options++] = d;
            table[(*n)++] = (struct option){ d->name, d->kind == ST_OPTION_FLAG
                                                          ? no_argument : required_argument,
                                             NULL, OPT_STRATEGY_OPTION + k };
        }
}

const struct option *st_cli_option_table(void)
{
    if (table[0].name)
        return table;
    int n = 0;
    for (const struct option *p = own_options; p->name; p++) {
        table[n++] = *p;
        if (p->val == OPT_REPORT)
            add_strategy_options(&n);
    }
    return table;
}

int st_cli_strategy_option_count(void)
{
    st_cli_option_table();
    return n_strategy_options;
}

const st_strategy_option *st_cli_strategy_option(int k)
{
    st_cli_option_table();
    return strategy_option[k];
}

const struct option *st_cli_option_named(const char *key)
{
    for (const struct option *p = st_cli_option_table(); p->name; p++)
        if (strcmp(p->name, key) == 0)
            return p;
    return NULL;
}

int st_cli_option_is_action(int c)
{
    return c == 'h' || c == 'V' || c == OPT_CONFIG || c == OPT_DUMP_CONFIG || c == OPT_FORMAT ||
           c == 'o';
}

/* cli/options.c — getopt_long parsing with strict value checks, and the
 * same checks for the options of a configuration file (--config).  The
 * options' table is option_table.c; --help, help.c; the values printed
 * back (--dump-config), config_dump.c.  The strategies' options are their
 * descriptors (subtrain/strategy.h): their names, value syntax and values
 * come from there. */
#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli_util.h"
#include "cli/option_table.h"
#include "cli/option_values.h"
#include "cli/options.h"

/* The options' numbers, each named as typed ("--depth"): one syntax for
 * all of them (cli_util.h), the range the message states the one enforced,
 * so a count that must be >= 1 says [1, ...] for any bad value, 0 included. */
static int parse_int(const char *opt, const char *s, int lo, int hi, int *out, char *err,
                     size_t n)
{
    unsigned long long v;
    if (st_cli_parse_count(opt, s, (unsigned long long)lo, (unsigned long long)hi, &v, err, n))
        return -1;
    *out = (int)v;
    return 0;
}

static int parse_u64(const char *opt, const char *s, unsigned long long lo,
                     unsigned long long hi, uint64_t *out, char *err, size_t n)
{
    unsigned long long v;
    if (st_cli_parse_count(opt, s, lo, hi, &v, err, n))
        return -1;
    *out = v;
    return 0;
}

/* A float in the range as typed and as the float kept: 1e-300 is no
 * learning rate, it would be 0. */
static int parse_float(const char *opt, const char *s, char lo_bracket, double lo, double hi,
                       char hi_bracket, float *out, char *err, size_t n)
{
    double v;
    if (st_cli_parse_real(opt, s, lo_bracket, lo, hi, hi_bracket, 1, &v, err, n))
        return -1;
    *out = (float)v;
    return 0;
}

/* A name the library parses.  Its message ends with the allowed names,
 * "unknown model 'x' (allowed: mlp, resmlp, ...)" (status.h); the line printed
 * keeps the command's form, "--model: unknown value 'x' (allowed: ...)". */
static int parse_choice(const char *opt, const char *s, st_status (*parse)(const char *, void *),
                        void *out, char *err, size_t n)
{
    if (parse(s, out) == ST_OK)
        return 0;
    const char *msg = st_last_error(), *allowed = NULL;
    for (const char *p = msg; (p = strstr(p, "(allowed: ")) != NULL; p++)
        allowed = p;   /* the last one: the name itself may contain the words */
    if (!allowed)
        return st_cli_fail(err, n, "--%s: %s", opt, msg);
    return st_cli_fail(err, n, "--%s: unknown value '%s' %s", opt, ST_CLI_SHOW(s), allowed);
}

static int parse_progress(const char *s, st_progress_mode *out, char *err, size_t n)
{
    static const char *const names[] = { "auto", "bar", "plain", "none" };
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = (st_progress_mode)i;
            return 0;
        }
    return st_cli_fail(err, n, "--progress: unknown value '%s' (allowed: auto, bar, plain, "
                       "none)", ST_CLI_SHOW(s));
}

/* Adapters: the library's parsers take typed pointers. */
static st_status parse_model(const char *s, void *o) { return st_model_kind_parse(s, o); }
static st_status parse_act(const char *s, void *o) { return st_activation_parse(s, o); }
static st_status parse_precision(const char *s, void *o) { return st_precision_parse(s, o); }
static st_status parse_layout(const char *s, void *o) { return st_tensor_layout_parse(s, o); }
static st_status parse_weight_layout(const char *s, void *o)
{
    return st_weight_layout_parse(s, o);
}
static st_status parse_pool(const char *s, void *o) { return st_token_pool_parse(s, o); }
static st_status parse_recompute(const char *s, void *o) { return st_recompute_parse(s, o); }
static st_status parse_opt(const char *s, void *o) { return st_optimizer_parse(s, o); }
static st_status parse_moments(const char *s, void *o) { return st_moments_parse(s, o); }
static st_status parse_master(const char *s, void *o) { return st_master_parse(s, o); }
static st_status parse_sched(const char *s, void *o) { return st_schedule_parse(s, o); }
static st_status parse_strategy(const char *s, void *o) { return st_strategy_parse(s, o); }
static st_status parse_weights(const char *s, void *o) { return st_weights_parse(s, o); }

/* What was given explicitly, for the checks after parsing. */
typedef struct seen {
    int epochs, steps, model, depth, width, activation, context, heads, patch, pool;
    int neuron_group, format;
    int weights;                /* --weights given */
    const char *text_option;    /* the first text-only option given */
    const char *sample_option;  /* the last of --prompt, --temperature, --top-k */
    /* the strategies' options given (st_cli_option_table(): OPT_STRATEGY_OPTION + k),
     * the last value of each and when it came: applied once the strategy
     * is known (apply_strategy_options) */
    const char *strategy_arg[MAX_STRATEGY_OPTIONS];
    int strategy_seq[MAX_STRATEGY_OPTIONS], seq;
} seen;

/* A strategy's option as given: its value checked now, kept until the
 * strategy is known. */
static int take_strategy_option(int k, const char *arg, seen *saw, char *err, size_t n)
{
    st_option_value v;
    if (st_cli_parse_strategy_value(st_cli_strategy_option(k), arg, &v, err, n))
        return -1;
    saw->strategy_arg[k] = arg ? arg : "";   /* a flag's: given */
    saw->strategy_seq[k] = ++saw->seq;
    return 0;
}

/* "synth", "ist or localsgd": the strategies that take option `name`. */
static void strategies_taking(const char *name, char *out, size_t size)
{
    int found = 0;
    out[0] = '\0';
    for (int s = 0; st_strategy_info_of((st_strategy)s); s++)
        if (st_cli_strategy_descriptor((st_strategy)s, name))
            snprintf(out + strlen(out), size - strlen(out), "%s%s", found++ ? " or " : "",
                     st_strategy_name((st_strategy)s));
}

/* The strategies' options given, into the chosen strategy's config; one
 * it does not take goes to the first strategy that does (which keeps it
 * unused), unless that strategy refuses it elsewhere (the last such option
 * given is named). */
static int apply_strategy_options(st_cli_options *o, const seen *saw, char *err, size_t n)
{
    int refused = -1;
    for (int k = 0; k < st_cli_strategy_option_count(); k++) {
        if (!saw->strategy_arg[k])
            continue;
        const st_strategy_option *d = st_cli_strategy_descriptor(o->train.strategy,
                                                                  st_cli_strategy_option(k)->name);
        if (!d && st_cli_strategy_option(k)->only) {
            if (refused < 0 || saw->strategy_seq[k] > saw->strategy_seq[refused])
                refused = k;
            continue;
        }
        if (!d)
            d = st_cli_strategy_option(k);
        st_option_value v;
        if (st_cli_parse_strategy_value(d, saw->strategy_arg[k], &v, err, n))
            return -1;
        d->set(&o->train, &v);
    }
    if (refused < 0)
        return 0;
    char which[256];
    strategies_taking(st_cli_strategy_option(refused)->name, which, sizeof which);
    return st_cli_fail(err, n, "--%s applies to --strategy %s only",
                       st_cli_strategy_option(refused)->name, which);
}

/* One report of --report, or a comma-separated list of them (as
 * --dump-config prints both: "memory,align=50"). */
static int parse_report_one(const char *arg, st_cli_options *o, char *err, size_t n)
{
    st_train_config *t = &o->train;
    if (strcmp(arg, "memory") == 0) {
        o->report_memory = 1;
        return 0;
    }
    if (strcmp(arg, "align") == 0) {
        t->sdp.align_every = 50;
        return 0;
    }
    if (strncmp(arg, "align=", 6) == 0) {
        return parse_u64("--report align=N", arg + 6, 1, 1000000000ull, &t->sdp.align_every, err,
                         n);
    }
    return st_cli_fail(err, n, "--report: unknown value '%s' (allowed: memory, align, align=N)",
                       ST_CLI_SHOW(arg));
}

static int parse_report(const char *arg, st_cli_options *o, char *err, size_t n)
{
    char *list = malloc(strlen(arg) + 1);   /* cut at its commas */
    if (!list)
        return st_cli_fail(err, n, "--report: out of memory");
    strcpy(list, arg);
    int rc = 0;
    for (char *p = list; rc == 0;) {
        char *comma = strchr(p, ',');
        if (comma)
            *comma = '\0';
        rc = parse_report_one(p, o, err, n);
        if (!comma)
            break;
        p = comma + 1;
    }
    free(list);
    return rc;
}

static int apply_option(int c, const char *arg, st_cli_options *o, int *saw_epochs,
                        int *saw_steps, char *err, size_t n)
{
    st_train_config *t = &o->train;
    switch (c) {
    case OPT_DATA:
        o->data = arg;
        return st_cli_parse_data("--data", arg, &o->data_spec, err, n);
    case OPT_AUGMENT_CROP: {
        int crop;
        if (parse_int("--augment-crop", arg, 0, 1024, &crop, err, n))
            return -1;
        o->augment.crop = (uint32_t)crop;
        return 0;
    }
    case OPT_AUGMENT_FLIP: o->augment.flip = 1; return 0;
    case OPT_SPLIT: {
        const char *why;
        if (st_split_parse_why(arg, &t->split, &why) == ST_OK)
            return 0;
        return st_cli_fail(err, n, "--split %s: %s", ST_CLI_SHOW(arg), why);
    }
    case OPT_CONTEXT: return parse_int("--context", arg, 1, 4096, &t->model.context, err, n);
    case OPT_HEADS: return parse_int("--heads", arg, 1, 65536, &t->model.heads, err, n);
    case OPT_PATCH: return parse_int("--patch", arg, 1, 4096, &t->model.patch, err, n);
    case OPT_POOL: return parse_choice("pool", arg, parse_pool, &t->model.pool, err, n);
    case OPT_HOLDOUT:
        if (parse_float("--holdout", arg, '(', 0.0, 1.0, ')', &o->holdout, err, n))
            return st_cli_fail(err, n, "--holdout: expected a fraction in (0, 1), got '%s'",
                               ST_CLI_SHOW(arg));
        return 0;
    case OPT_VAL_BYTES: return parse_u64("--val-bytes", arg, 0, 1ull << 40, &o->val_bytes, err, n);
    case OPT_EPOCH_WINDOWS:
        return parse_u64("--epoch-windows", arg, 1, 4294967295ull, &o->epoch_windows, err, n);
    case OPT_SAMPLE: return parse_u64("--sample", arg, 0, 1000000ull, &o->sample, err, n);
    case OPT_CHECKPOINT:
        if (*arg == '\0')
            return st_cli_fail(err, n, "--checkpoint: expected a directory, got ''");
        o->checkpoint_dir = arg;
        return 0;
    case OPT_CHECKPOINT_EVERY:
        if (strcmp(arg, "epoch") == 0) {
            t->checkpoint.every_epoch = 1;
            return 0;
        }
        if (parse_u64("--checkpoint-every", arg, 1, 1ull << 40, &t->checkpoint.every, err, n))
            return st_cli_fail(err, n, "--checkpoint-every: expected a number of steps in [1, %llu] "
                        "or 'epoch', got '%s'", 1ull << 40, ST_CLI_SHOW(arg));
        return 0;
    case OPT_KEEP: return parse_int("--keep", arg, 0, 1000000, &t->checkpoint.keep, err, n);
    case OPT_RESUME:
        if (*arg == '\0')
            return st_cli_fail(err, n, "--resume: expected a checkpoint directory or file, got ''");
        o->resume_path = arg;
        return 0;
    case OPT_USR1:
        if (strcmp(arg, "stop") != 0 && strcmp(arg, "checkpoint") != 0)
            return st_cli_fail(err, n, "--usr1: expected 'stop' or 'checkpoint', got '%s'",
                               ST_CLI_SHOW(arg));
        o->usr1_checkpoint = strcmp(arg, "checkpoint") == 0;
        return 0;
    case OPT_INIT:
        if (*arg == '\0')
            return st_cli_fail(err, n, "--init: expected a safetensors file, got ''");
        o->init_path = arg;
        return 0;
    case OPT_FORMAT:
        if (strcmp(arg, "torch") != 0 && strcmp(arg, "subtrain") != 0)
            return st_cli_fail(err, n, "--format: unknown value '%s' (allowed: torch, subtrain)",
                               ST_CLI_SHOW(arg));
        o->format = strcmp(arg, "torch") == 0 ? ST_CLI_FORMAT_TORCH : ST_CLI_FORMAT_SUBTRAIN;
        return 0;
    case 'o':
        if (*arg == '\0')
            return st_cli_fail(err, n, "--output: expected a file name, got ''");
        o->output_path = arg;
        return 0;
    case OPT_PROMPT: o->prompt = arg; return 0;
    case OPT_TEMPERATURE:
        return parse_float("--temperature", arg, '[', 0.0, 1000.0, ']', &o->temperature, err,
                           n);
    case OPT_TOP_K: return parse_int("--top-k", arg, 0, 256, &o->top_k, err, n);
    case OPT_MODEL: return parse_choice("model", arg, parse_model, &t->model.kind, err, n);
    case OPT_DEPTH: return parse_int("--depth", arg, 1, 1024, &t->model.depth, err, n);
    case OPT_WIDTH: return parse_int("--width", arg, 1, 65536, &t->model.width, err, n);
    case OPT_HIDDEN: return parse_int("--hidden", arg, 1, 65536, &t->model.hidden, err, n);
    case OPT_ACTIVATION: return parse_choice("activation", arg, parse_act, &t->model.activation, err, n);
    case OPT_EPOCHS:
        *saw_epochs = 1;
        return parse_int("--epochs", arg, 1, 100000, &t->epochs, err, n);
    case OPT_STEPS:
        *saw_steps = 1;
        return parse_u64("--steps", arg, 1, 1000000000ull, &t->steps, err, n);
    case OPT_BATCH: return parse_int("--batch", arg, 1, 65536, &t->batch, err, n);
    case OPT_ACCUMULATE: return parse_int("--accumulate", arg, 1, 65536, &t->accumulate, err, n);
    case OPT_OPTIMIZER_MOMENTS:
        return parse_choice("optimizer-moments", arg, parse_moments, &t->optim.moments, err, n);
    case OPT_MASTER_WEIGHTS:
        return parse_choice("master-weights", arg, parse_master, &t->optim.master, err, n);
    case OPT_OPTIMIZER: return parse_choice("optimizer", arg, parse_opt, &t->optim.kind, err, n);
    case OPT_LR: return parse_float("--lr", arg, '(', 0.0, 100.0, ']', &t->optim.lr, err, n);
    case OPT_MOMENTUM:
        return parse_float("--momentum", arg, '[', 0.0, 1.0, ')', &t->optim.momentum, err, n);
    case OPT_WEIGHT_DECAY:
        return parse_float("--weight-decay", arg, '[', 0.0, 10.0, ']', &t->optim.weight_decay,
                           err, n);
    case OPT_SCHEDULE: return parse_choice("schedule", arg, parse_sched, &t->schedule, err, n);
    case OPT_WARMUP: return parse_u64("--warmup", arg, 0, 1000000000ull, &t->warmup_steps, err, n);
    case OPT_SEED: return parse_u64("--seed", arg, 0, ULLONG_MAX, &t->seed, err, n);
    case OPT_METRICS:
        if (*arg == '\0')
            return st_cli_fail(err, n, "--metrics: expected a file name, got ''");
        o->metrics_path = arg;
        return 0;
    case OPT_PROGRESS: return parse_progress(arg, &o->progress, err, n);
    case OPT_STRATEGY: return parse_choice("strategy", arg, parse_strategy, &t->strategy, err, n);
    case OPT_WORKERS:
        if (strcmp(arg, "cores") == 0) {
            t->workers = 0;
            return 0;
        }
        if (parse_int("--workers", arg, 1, 4096, &t->workers, err, n))
            return st_cli_fail(err, n, "--workers: expected an integer in [1, 4096] or 'cores', "
                               "got '%s'", ST_CLI_SHOW(arg));
        return 0;
    case OPT_TOPOLOGY:
        if (*arg == '\0')
            return st_cli_fail(err, n, "--topology: expected synthetic:DESC or xml:FILE, got ''");
        t->topology = arg;
        return 0;
    case OPT_CPUSET:
        if (*arg == '\0')
            return st_cli_fail(err, n, "--cpuset: expected a CPU list such as 0-3,8, got ''");
        t->cpuset = arg;
        return 0;
    case OPT_OVERSUBSCRIBE: t->oversubscribe = 1; return 0;
    case OPT_THREADS: return parse_int("--threads-per-worker", arg, 1, 1024, &t->threads_per_worker,
                                       err, n);
    case OPT_TEAM_SPANS: t->team_spans = 1; return 0;
    case OPT_PRECISION: return parse_choice("precision", arg, parse_precision, &t->model.precision, err, n);
    case OPT_BF16_EMULATED: t->bf16_emulated = 1; return 0;
    case OPT_UNFUSE:
        if (st_unfuse_parse(arg, &t->model.unfuse) != ST_OK)
            return st_cli_fail(err, n, "--unfuse: %s", st_last_error());
        return 0;
    case OPT_RECOMPUTE:
        return parse_choice("recompute", arg, parse_recompute, &t->model.recompute, err, n);
    case OPT_COMM_PRECISION:
        return parse_choice("comm-precision", arg, parse_precision, &t->comm_precision, err, n);
    case OPT_ACTIVATION_PRECISION:
        return parse_choice("activation-precision", arg, parse_precision, &t->model.activations,
                            err, n);
    case OPT_TENSOR_LAYOUT:
        return parse_choice("tensor-layout", arg, parse_layout, &t->model.tensor_layout, err, n);
    case OPT_WEIGHT_LAYOUT:
        return parse_choice("weight-layout", arg, parse_weight_layout, &t->model.weight_layout,
                            err, n);
    case OPT_WEIGHTS: return parse_choice("weights", arg, parse_weights, &t->weights, err, n);
    case OPT_NEURON_GROUP:
        return parse_int("--neuron-group", arg, 1, 65536, &t->neuron_group, err, n);
    case OPT_BN_CALIBRATION:
        return parse_int("--bn-calibration", arg, 0, 100000, &t->bn_calibration, err, n);
    case OPT_REPORT: return parse_report(arg, o, err, n);
    case 'q': o->quiet = 1; return 0;
    case OPT_CONFIG:
        if (*arg == '\0')
            return st_cli_fail(err, n, "--config: expected a file name, got ''");
        /* the second file's options would silently replace the first's */
        if (o->config_path)
            return st_cli_fail(err, n, "--config given twice ('%s', then '%s'): a run reads "
                               "one configuration file", ST_CLI_SHOW(o->config_path),
                               ST_CLI_SHOW(arg));
        o->config_path = arg;
        return 0;
    case OPT_DUMP_CONFIG: o->dump_config = 1; return 0;
    case 'h': o->action = ST_CLI_HELP; return 0;
    case 'V': o->action = ST_CLI_VERSION; return 0;
    }
    return st_cli_fail(err, n, "internal: unhandled option %d", c);
}

/* One option, from the command line or a configuration file: what was
 * given explicitly (for the checks after parsing), then its value. */
static int apply_one(int c, const char *arg, st_cli_options *o, seen *saw, int *data_given,
                     char *err, size_t n)
{
    saw->model |= c == OPT_MODEL;
    *data_given |= c == OPT_DATA;
    saw->depth |= c == OPT_DEPTH;
    saw->width |= c == OPT_WIDTH;
    saw->activation |= c == OPT_ACTIVATION;
    saw->context |= c == OPT_CONTEXT;
    saw->heads |= c == OPT_HEADS;
    saw->patch |= c == OPT_PATCH;
    saw->pool |= c == OPT_POOL;
    saw->neuron_group |= c == OPT_NEURON_GROUP;
    saw->format |= c == OPT_FORMAT;
    saw->weights |= c == OPT_WEIGHTS;
    if (c == OPT_HOLDOUT || c == OPT_VAL_BYTES || c == OPT_EPOCH_WINDOWS)
        saw->text_option = c == OPT_HOLDOUT ? "--holdout"
                         : c == OPT_VAL_BYTES ? "--val-bytes" : "--epoch-windows";
    if (c == OPT_PROMPT || c == OPT_TEMPERATURE || c == OPT_TOP_K)
        saw->sample_option = c == OPT_PROMPT ? "--prompt"
                           : c == OPT_TEMPERATURE ? "--temperature" : "--top-k";
    if (c >= OPT_STRATEGY_OPTION)
        return take_strategy_option(c - OPT_STRATEGY_OPTION, arg, saw, err, n);
    return apply_option(c, arg, o, &saw->epochs, &saw->steps, err, n);
}

/* An option of the command line, kept for after the configuration file. */
typedef struct given {
    int c;
    const char *arg;
} given;

/* The configuration file's entries, each with the checks of its option on
 * the command line and the message prefixed with FILE:LINE. */
static int apply_config(st_cli_options *o, seen *saw, int *data_given, char *err, size_t n)
{
    const st_cli_config_file *cf = &o->config;
    const char *path = ST_CLI_SHOW(cf->path);
    for (int k = 0; k < cf->n; k++) {
        const st_cli_config_entry *e = &cf->entries[k];
        const struct option *opt = st_cli_option_named(e->key);
        if (!opt)
            return st_cli_fail(err, n, "%s:%d: unknown key '%s' (keys are the long options of "
                        "subtrain train without their dashes; see subtrain --help)", path,
                        e->line, ST_CLI_SHOW(e->key));
        if (st_cli_option_is_action(opt->val))
            return st_cli_fail(err, n, "%s:%d: '%s' is not a configuration key: give --%s on the "
                        "command line", path, e->line, e->key, e->key);
        if (*e->value == '\0')   /* the default */
            continue;
        const char *arg = e->value;
        if (opt->has_arg == no_argument) {
            if (strcmp(e->value, "false") == 0)
                continue;
            if (strcmp(e->value, "true") != 0)
                return st_cli_fail(err, n, "%s:%d: --%s: expected true or false, got '%s'", path,
                            e->line, e->key, ST_CLI_SHOW(e->value));
            arg = NULL;
        }
        char msg[1024];
        if (apply_one(opt->val, arg, o, saw, data_given, msg, sizeof msg))
            return st_cli_fail(err, n, "%s:%d: %s", path, e->line, msg);
    }
    return 0;
}

void st_cli_options_free(st_cli_options *o)
{
    st_cli_config_free(&o->config);
}

static int same_file(const char *a, const struct stat *b)
{
    struct stat sa;
    return a && stat(a, &sa) == 0 && sa.st_dev == b->st_dev && sa.st_ino == b->st_ino;
}

static int ends_with(const char *s, const char *tail)
{
    const size_t a = strlen(s), b = strlen(tail);
    return a >= b && strcmp(s + a - b, tail) == 0;
}

int st_cli_same_file(const char *a, const char *b)
{
    struct stat sb;
    return b && stat(b, &sb) == 0 && same_file(a, &sb);
}

const char *st_cli_input_named(const st_cli_options *o, const char *path)
{
    struct stat m;
    if (!path || stat(path, &m) != 0)
        return NULL;   /* a new file reads nothing */
    return same_file(o->config_path, &m)   ? "the file --config reads"
           : same_file(o->init_path, &m)   ? "the weights --init reads"
           : same_file(o->resume_path, &m) ? "the checkpoint --resume reads"
           : o->data_spec.kind == ST_CLI_DATA_TEXT && same_file(o->data_spec.dir, &m)
               ? "the text --data reads"
               : NULL;
}

/* --metrics naming a file the run reads (--config, --init, --resume's
 * checkpoint, the data) would destroy it: opened for writing, it is
 * emptied before it is read.  An existing file in the data's directory
 * is taken for data unless it is JSON Lines (.jsonl), one in --resume's
 * for a checkpoint if it is a .safetensors file. */
static int metrics_reads_input(const st_cli_options *o, char *err, size_t n)
{
    struct stat m, d;
    if (stat(o->metrics_path, &m) != 0)
        return 0;   /* a new file reads nothing */
    const char *what = st_cli_input_named(o, o->metrics_path);
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", o->metrics_path);
    if (!what && stat(dirname(parent), &d) == 0 && S_ISREG(m.st_mode)) {
        if (o->data_spec.kind != ST_CLI_DATA_SYNTHETIC && o->data_spec.kind != ST_CLI_DATA_TEXT &&
            same_file(o->data_spec.dir, &d) && !ends_with(o->metrics_path, ".jsonl"))
            what = "a file in the directory --data reads";
        else if (same_file(o->resume_path, &d) && ends_with(o->metrics_path, ".safetensors"))
            what = "a checkpoint in the directory --resume reads";
    }
    if (!what)
        return 0;
    return st_cli_fail(err, n, "--metrics %s is %s: name another metrics file (this run "
                       "would overwrite it)", ST_CLI_SHOW(o->metrics_path), what) != 0;
}

int st_cli_parse(int argc, char **argv, st_cli_options *o, char *err, size_t n)
{
    memset(o, 0, sizeof *o);
    o->action = ST_CLI_RUN;
    o->train = st_train_config_default();
    o->progress = ST_PROGRESS_AUTO;
    o->holdout = 0.1f;
    o->val_bytes = 1048576;
    o->prompt = "";
    o->temperature = 0.8f;
    o->top_k = 40;
    const char *env = getenv("SUBTRAIN_DATA");
    o->data = env && *env ? env : ST_FASHION_MNIST_DIR;
    int data_given = 0;

    if (argc > 1 && strcmp(argv[1], "train") == 0) { /* "train" stands for argv[0] */
        argc--;
        argv++;
    } else if (argc > 1 && strcmp(argv[1], "eval") == 0) {
        o->action = ST_CLI_EVAL;
        argc--;
        argv++;
    } else if (argc > 1 && strcmp(argv[1], "export") == 0) {
        o->action = ST_CLI_EXPORT;
        argc--;
        argv++;
    }
    seen saw = { 0 };
    /* The command line first read whole (getopt's checks: unknown options,
     * missing values), applied after the file's options so that it wins
     * wherever --config stands. */
    /* One word gives at most one option per character: "-qhh" is three. */
    size_t max_cmd = 1;
    for (int k = 1; k < argc; k++)
        max_cmd += strlen(argv[k]);
    given *cmd = malloc(sizeof *cmd * max_cmd);
    if (!cmd)
        return st_cli_fail(err, n, "out of memory for the command line");
    int n_cmd = 0;
    st_cli_getopt_start();
    for (;;) {
        int c = st_cli_next_option(argc, argv, ":qhVo:", st_cli_option_table(), "subtrain", err,
                                      n);
        if (c == -1)
            break;
        if (c == ST_CLI_REJECTED) {
            free(cmd);
            return -1;
        }
        cmd[n_cmd++] = (given){ c, optarg };
        if (c == OPT_CONFIG && apply_one(c, optarg, o, &saw, &data_given, err, n)) {
            free(cmd);
            return -1;
        }
    }
    /* --help and --version answer whatever else the line holds, as topo's
     * and quad's do: `subtrain --model gpt --help` shows the options rather
     * than that gpt needs text.  A malformed option was refused above. */
    for (int k = 0; k < n_cmd; k++)
        if (cmd[k].c == 'h' || cmd[k].c == 'V') {
            /* every value still has to parse: a malformed one is refused */
            for (int j = 0; j < n_cmd; j++)
                if (cmd[j].c != OPT_CONFIG && apply_one(cmd[j].c, cmd[j].arg, o, &saw,
                                                        &data_given, err, n)) {
                    free(cmd);
                    return -1;
                }
            o->action = cmd[k].c == 'h' ? ST_CLI_HELP : ST_CLI_VERSION;
            free(cmd);
            return 0;
        }
    if (optind < argc) {
        free(cmd);
        return st_cli_fail(err, n, "unexpected argument '%s' (usage: subtrain [train] "
                           "[OPTION]...)", ST_CLI_SHOW(argv[optind]));
    }
    int file_epochs = 0, file_steps = 0;
    if (o->config_path) {
        if (st_cli_config_read(o->config_path, &o->config, err, n) ||
            apply_config(o, &saw, &data_given, err, n)) {
            free(cmd);
            return -1;
        }
        file_epochs = saw.epochs;
        file_steps = saw.steps;
        saw.epochs = saw.steps = 0;
    }
    for (int k = 0; k < n_cmd; k++)
        if (cmd[k].c != OPT_CONFIG && apply_one(cmd[k].c, cmd[k].arg, o, &saw, &data_given,
                                                err, n)) {
            free(cmd);
            return -1;
        }
    free(cmd);
    /* --epochs and --steps say the same thing two ways: the command line's
     * replaces the file's, whichever it is */
    if (saw.epochs && !saw.steps && file_steps)
        o->train.steps = 0;
    else if (!(saw.steps && !saw.epochs && file_epochs)) {
        saw.epochs |= file_epochs;
        saw.steps |= file_steps;
    }
    if (!data_given && st_cli_parse_data("SUBTRAIN_DATA", o->data, &o->data_spec, err, n))
        return -1;
    if (o->metrics_path && metrics_reads_input(o, err, n))
        return -1;
    if (saw.epochs && saw.steps)
        return st_cli_fail(err, n, "--epochs and --steps cannot be used together: give one");
    if (saw.steps)
        o->train.epochs = 0;
    if (apply_strategy_options(o, &saw, err, n))
        return -1;
    if (saw.weights && o->train.weights == ST_WEIGHTS_SHARED &&
        st_strategy_weights(&o->train) != ST_WEIGHTS_SHARED)
        return st_cli_fail(err, n, "--weights shared: --strategy %s%s keeps a private weight "
                           "copy in each worker (give --weights private, or leave --weights out)",
                           st_strategy_name(o->train.strategy),
                           o->train.strategy == ST_STRATEGY_SDP ? " --masking forward" : "");
    const st_strategy_info *strategy = st_strategy_info_of(o->train.strategy);
    if (strategy->depth > 0) {   /* the model the strategy trains unless told */
        if (!saw.model)
            o->train.model.kind = st_model_kind_named(strategy->model);
        if (!saw.depth)
            o->train.model.depth = strategy->depth;
    }
    if (o->train.topology)
        return st_cli_fail(err, n, "--topology describes another machine and is for 'subtrain topo'; "
                    "training runs on this machine");
    /* what the model reads: a language model text, the others anything else */
    st_model_config *mc = &o->train.model;
    const char *model = st_model_kind_name(mc->kind);
    const int text = o->data_spec.kind == ST_CLI_DATA_TEXT;
    const int reads_text = st_model_kind_reads(mc->kind) == ST_MODEL_READS_TEXT;
    char lm[128];
    st_model_kind_list(lm, sizeof lm, ", ", ST_MODEL_READS_TEXT);
    if (reads_text != text)
        return st_cli_fail(err, n, reads_text ? "--model %s is a language model: it needs --data "
                                                "text:FILE"
                                              : "--data text:FILE is for --model %s (a language "
                                                "model)", reads_text ? model : lm);
    if (text && o->train.split.kind != ST_SPLIT_IID) {
        char split[64];
        st_split_name(&o->train.split, split, sizeof split);
        return st_cli_fail(err, n, "--split %s: text data has no classes to split by (it "
                           "takes --split iid only)", split);
    }
    if (saw.text_option && !text)
        return st_cli_fail(err, n, "%s applies to --data text:FILE only", saw.text_option);
    if (o->sample && !reads_text)
        return st_cli_fail(err, n, "--sample applies to --model %s only", lm);
    if (saw.sample_option && !o->sample)
        return st_cli_fail(err, n, "%s applies to --sample N only (N >= 1 bytes to generate)",
                    saw.sample_option);
    /* the kind's defaults of the options not given and its checks of those
     * given: its entry in the library's table of models */
    const unsigned opts = (saw.depth ? ST_MODEL_OPT_DEPTH : 0u) |
                          (saw.width ? ST_MODEL_OPT_WIDTH : 0u) |
                          (mc->hidden ? ST_MODEL_OPT_HIDDEN : 0u) |
                          (saw.activation ? ST_MODEL_OPT_ACTIVATION : 0u) |
                          (saw.context ? ST_MODEL_OPT_CONTEXT : 0u) |
                          (saw.heads ? ST_MODEL_OPT_HEADS : 0u) |
                          (saw.patch ? ST_MODEL_OPT_PATCH : 0u) |
                          (saw.pool ? ST_MODEL_OPT_POOL : 0u);
    if (st_model_config_resolve(mc, opts) != ST_OK)
        return st_cli_fail(err, n, "%s", st_last_error());
    if (mc->heads > 0) {   /* attention: a unit is one head (and that many MLP neurons) */
        const int head = mc->width / mc->heads;
        if (!saw.neuron_group)
            o->train.neuron_group = head;
    }
    if (o->action == ST_CLI_EVAL && !o->init_path)
        return st_cli_fail(err, n, "eval needs --init FILE: the weights to evaluate");
    if (o->action == ST_CLI_EVAL && (o->checkpoint_dir || o->metrics_path))
        return st_cli_fail(err, n, "eval writes no %s", o->checkpoint_dir ? "checkpoint" : "metrics");
    if (o->action != ST_CLI_EXPORT && (saw.format || o->output_path))
        return st_cli_fail(err, n, "%s applies to subtrain export only",
                           o->output_path ? "--output" : "--format");
    if (o->action == ST_CLI_EXPORT && !o->init_path)
        return st_cli_fail(err, n, "export needs --init FILE: the weights to convert");
    if (o->action == ST_CLI_EXPORT && !o->output_path)
        return st_cli_fail(err, n, "export needs -o FILE: the file to write");
    const char *read = o->action == ST_CLI_EXPORT ? st_cli_input_named(o, o->output_path) : NULL;
    if (read)
        return st_cli_fail(err, n, "-o %s is %s: name another output file (the export would "
                           "overwrite it)", ST_CLI_SHOW(o->output_path), read);
    if (o->action == ST_CLI_EXPORT && (o->checkpoint_dir || o->metrics_path || o->resume_path))
        return st_cli_fail(err, n, "export takes weights with --init and writes -o FILE only, "
                           "not %s", o->checkpoint_dir ? "--checkpoint"
                                     : o->metrics_path ? "--metrics" : "--resume");
    if (o->init_path && strategy->no_init)
        return st_cli_fail(err, n, "--init does not apply to --strategy %s (%s)", strategy->name,
                           strategy->no_init);
    if ((o->train.checkpoint.every || o->train.checkpoint.every_epoch || o->train.checkpoint.keep ||
         o->usr1_checkpoint) && !o->checkpoint_dir)
        return st_cli_fail(err, n, "%s needs --checkpoint DIR: where the checkpoints go",
                    o->train.checkpoint.keep ? "--keep" : o->usr1_checkpoint
                    ? "--usr1 checkpoint" : "--checkpoint-every");
    if (o->action == ST_CLI_EVAL && o->resume_path)
        return st_cli_fail(err, n, "eval takes weights with --init, not --resume");
    if (o->init_path && o->resume_path)
        return st_cli_fail(err, n, "--init and --resume: a resumed run continues from its "
                    "checkpoint's weights; give one of them");
    o->train.checkpoint.dir = o->checkpoint_dir;
    /* --workers cores under SLURM: one per core of the task's cpuset, at
     * most the CPUs the task was given.  With task affinity the cpuset says
     * so already; without it the cpuset is the whole node and the count
     * caps it; where SLURM counts hardware threads as CPUs, the cpuset's
     * cores are fewer and win (one worker per physical core). */
    if (o->train.workers == 0) {
        if (st_cli_slurm_cpus(&o->train.core_limit, err, n))
            return -1;
        o->slurm_cpus = o->train.core_limit;
    }
    return 0;
}

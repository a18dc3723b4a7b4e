/* cli/options.c — getopt_long parsing with strict value checks; the same
 * checks for the options of a configuration file (--config), and each
 * option's value printed back as the file would give it (--dump-config).
 * The strategies' options are their descriptors (subtrain/strategy.h):
 * their names, --help lines, value syntax and values come from there. */
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <subtrain/version.h>

#include "cli/cli_util.h"
#include "cli/options.h"

enum {
    OPT_DATA = 256, OPT_MODEL, OPT_DEPTH, OPT_WIDTH, OPT_HIDDEN, OPT_ACTIVATION,
    OPT_EPOCHS, OPT_STEPS, OPT_BATCH, OPT_OPTIMIZER, OPT_LR, OPT_MOMENTUM,
    OPT_WEIGHT_DECAY, OPT_SCHEDULE, OPT_WARMUP, OPT_SEED, OPT_METRICS, OPT_PROGRESS,
    OPT_STRATEGY, OPT_WORKERS, OPT_TOPOLOGY, OPT_CPUSET, OPT_OVERSUBSCRIBE,
    OPT_NEURON_GROUP, OPT_BN_CALIBRATION, OPT_REPORT,
    OPT_AUGMENT_CROP, OPT_AUGMENT_FLIP,
    OPT_CONTEXT, OPT_HEADS, OPT_HOLDOUT, OPT_VAL_BYTES, OPT_EPOCH_WINDOWS,
    OPT_SAMPLE, OPT_PROMPT, OPT_TEMPERATURE, OPT_TOP_K, OPT_CHECKPOINT, OPT_INIT,
    OPT_CHECKPOINT_EVERY, OPT_KEEP, OPT_RESUME, OPT_USR1, OPT_THREADS, OPT_TEAM_SPANS,
    OPT_PRECISION, OPT_BF16_EMULATED, OPT_COMM_PRECISION, OPT_CONFIG, OPT_DUMP_CONFIG,
    OPT_ACCUMULATE, OPT_OPTIMIZER_MOMENTS,
    /* the strategies' options: OPT_STRATEGY_OPTION + their index in the
     * table options() makes */
    OPT_STRATEGY_OPTION = 1024,
};

/* The command's own options; the strategies' follow --report (the
 * options' table, options()). */
static const struct option own_options[] = {
    { "data", required_argument, NULL, OPT_DATA },
    { "augment-crop", required_argument, NULL, OPT_AUGMENT_CROP },
    { "augment-flip", no_argument, NULL, OPT_AUGMENT_FLIP },
    { "context", required_argument, NULL, OPT_CONTEXT },
    { "heads", required_argument, NULL, OPT_HEADS },
    { "holdout", required_argument, NULL, OPT_HOLDOUT },
    { "val-bytes", required_argument, NULL, OPT_VAL_BYTES },
    { "epoch-windows", required_argument, NULL, OPT_EPOCH_WINDOWS },
    { "sample", required_argument, NULL, OPT_SAMPLE },
    { "checkpoint", required_argument, NULL, OPT_CHECKPOINT },
    { "init", required_argument, NULL, OPT_INIT },
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
    { "epochs", required_argument, NULL, OPT_EPOCHS },
    { "steps", required_argument, NULL, OPT_STEPS },
    { "batch", required_argument, NULL, OPT_BATCH },
    { "accumulate", required_argument, NULL, OPT_ACCUMULATE },
    { "optimizer", required_argument, NULL, OPT_OPTIMIZER },
    { "lr", required_argument, NULL, OPT_LR },
    { "momentum", required_argument, NULL, OPT_MOMENTUM },
    { "weight-decay", required_argument, NULL, OPT_WEIGHT_DECAY },
    { "optimizer-moments", required_argument, NULL, OPT_OPTIMIZER_MOMENTS },
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
#define MAX_STRATEGY_OPTIONS 64
static const st_strategy_option *strategy_option[MAX_STRATEGY_OPTIONS];
static int n_strategy_options;
static struct option table[N_OWN_OPTIONS + MAX_STRATEGY_OPTIONS + 1];

/* Strategy s's descriptor of option `name`, NULL if it has none. */
static const st_strategy_option *descriptor_of(st_strategy s, const char *name)
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
            table[(*n)++] = (struct option){ d->name, required_argument, NULL,
                                             OPT_STRATEGY_OPTION + k };
        }
}

/* The options' table: the command's own, with the strategies' after
 * --report.  Made at the first call. */
static const struct option *options(void)
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

/* An option's lines of --help: its text from column 25, after the
 * option where it leaves room (three spaces at least), else below it;
 * the text's lines joined by '\n'. */
static void print_option(FILE *f, const char *head, const char *text)
{
    const size_t len = strlen(head), first = strcspn(text, "\n");
    if (len < 25)
        fprintf(f, "%-25s", head);
    else if (len + 3 + first <= 80)
        fprintf(f, "%s   ", head);
    else
        fprintf(f, "%s\n%25s", head, "");
    for (const char *p = text; *p; p++)
        if (*p == '\n')
            fprintf(f, "\n%25s", "");
        else
            fputc(*p, f);
    fputc('\n', f);
}

/* --strategy, every strategy's part of its text, then every strategy's
 * options in the table's order (an option two strategies take shows under
 * each, with what it does there). */
static void print_strategies(FILE *f)
{
    char head[256] = "  --strategy ", text[4096] = "";
    for (int s = 0; st_strategy_info_of((st_strategy)s); s++) {
        const st_strategy_info *info = st_strategy_info_of((st_strategy)s);
        snprintf(head + strlen(head), sizeof head - strlen(head), "%s%s", s ? "|" : "",
                 info->name);
        snprintf(text + strlen(text), sizeof text - strlen(text), "%s%s", s ? "\n" : "",
                 info->help);
    }
    print_option(f, head, text);
    for (int s = 0; st_strategy_info_of((st_strategy)s); s++)
        for (const st_strategy_option *d = st_strategy_info_of((st_strategy)s)->options;
             d && d->name; d++) {
            snprintf(head, sizeof head, "  --%s %s", d->name, d->syntax);
            print_option(f, head, d->help);
        }
}

/* One paragraph of --help's option text: from column 25, words moved to
 * the next line past column 79. */
static void print_wrapped(FILE *f, const char *text)
{
    const int indent = 25, last = 79;
    int col = 0;
    for (const char *p = text; *p;) {
        const size_t len = strcspn(p, " ");
        if (col > indent && col + 1 + (int)len > last) {
            fputc('\n', f);
            col = 0;
        }
        if (col == 0)
            col = fprintf(f, "%*s", indent, "");
        else
            col += fprintf(f, " ");
        col += fprintf(f, "%.*s", (int)len, p);
        p += len;
        p += strspn(p, " ");
    }
    fputc('\n', f);
}

/* --model: the names and what each kind says of itself, from the library's
 * table of model kinds. */
static void print_model_help(FILE *f)
{
    char names[256], text[2048];
    st_model_kind_list(names, sizeof names, "|", -1);
    fprintf(f, "  --model %s\n", names);
    size_t len = (size_t)snprintf(text, sizeof text, "architecture (default %s)",
                                  st_model_kind_name(st_model_config_default().kind));
    for (int i = 0; i < st_model_kind_count() && len < sizeof text; i++) {
        const char *help = st_model_kind_help(st_model_kind_at(i));
        if (help)
            len += (size_t)snprintf(text + len, sizeof text - len, "; %s", help);
    }
    print_wrapped(f, text);
}

void st_cli_print_help(FILE *f)
{
    fputs(
"Usage: subtrain [train] [OPTION]...\n"
"       subtrain topo [--topology SPEC] [--workers N] [--oversubscribe] [--cpuset LIST]\n"
"       subtrain quad [--case all|1|2|3|4|5] [OPTION]...   (IST theory on quadratics)\n"
"Train a neural network on one CPU server with oneDNN; `subtrain topo --help`\n"
"prints where the workers would run.\n"
"\n"
"Workers:\n", f);
    print_strategies(f);
    fputs(
"  --neuron-group G       neurons per neuron unit (default 16; gpt: the head size,\n"
"                         a multiple of which it must be)\n"
"  --bn-calibration N     sdp (forward masking), ist: before each evaluation the\n"
"                         full model re-estimates its batch norm statistics on N\n"
"                         training batches (default 50; 0: the subnetworks'\n"
"                         averaged statistics)\n"
"  --workers N|cores      worker threads, each pinned to a core, its memory on its\n"
"                         NUMA node (default 1; cores: one per physical core)\n"
"  --oversubscribe        allow more workers than allowed PUs (with a warning)\n"
"  --threads-per-worker T each worker a team of T cores in one NUMA domain, its\n"
"                         oneDNN primitives running T threads (default 1)\n"
"  --team-spans-domains   allow a team across NUMA domains (refused otherwise)\n"
"  --comm-precision fp32|bf16   the gradients the reduction reads: bf16 halves\n"
"                         the bytes workers read of each other's gradients (sums,\n"
"                         masters, optimizer and all-gather fp32; dp, sdp, synth;\n"
"                         default fp32; doc/reduction.md)\n"
"  --cpuset LIST          run on these OS CPU numbers only, e.g. 0-7,16 (default:\n"
"                         the process's allowed CPUs)\n"
"\n"
"Data:\n"
"  --data DIR|synthetic|cifar10:DIR|cifar100:DIR|idx:DIR[:TRI,TRL,TEI,TEL]|text:FILE\n"
"                         Fashion-MNIST IDX files in DIR (default: $SUBTRAIN_DATA,\n"
"                         else " ST_FASHION_MNIST_DIR "); a seeded\n"
"                         synthetic task generated in memory; CIFAR-10 or\n"
"                         CIFAR-100 binaries (the extracted cifar-10-batches-bin\n"
"                         or cifar-100-binary directory); or any IDX image set\n"
"                         (EMNIST, MNIST), its files named relative to DIR\n"
"                         (default: Fashion-MNIST's), classes from its labels; or\n"
"                         any file as bytes (gzip too) for --model gpt: training\n"
"                         reads seeded random windows of context + 1 bytes\n"
"  --augment-crop P       training images: pad P zero pixels on each side, crop\n"
"                         back at a random offset (default 0: off)\n"
"  --augment-flip         training images: mirror left-right with p = 0.5\n"
"  --holdout F            text: the held-out fraction, the file's tail (default 0.1)\n"
"  --val-bytes N          text: evaluate on the first N held-out bytes (default\n"
"                         1048576; 0: all of them)\n"
"  --epoch-windows N      text: training windows per epoch (default: the training\n"
"                         bytes / context, about one pass)\n"
"Model:\n", f);
    print_model_help(f);
    fputs(
"  --depth N              hidden layers (mlp), residual blocks (resmlp) or blocks\n"
"                         per stage (resnet) (default 4; resnet 3)\n"
"  --width N              hidden / residual width, channels of a resnet's first\n"
"                         stage (default 256; resnet 16)\n"
"  --hidden N             inner width of a residual block (default: the width)\n"
"  --activation relu|gelu (default gelu; resnet relu)\n"
"  --precision fp32|bf16  linear, conv and attention products in bf16 with fp32\n"
"                         accumulation; weights, optimizer and the rest fp32\n"
"                         (default fp32; doc/precision.md)\n"
"  --bf16-emulated        run bf16 on a CPU without native bf16 (slow; refused\n"
"                         otherwise)\n"
"  --context T            gpt: tokens (bytes) per sample (default 128)\n"
"  --heads H              gpt: attention heads, dividing the width (default 4)\n"
"Training:\n"
"  --epochs N             passes over the training set (default 5)\n"
"  --steps N              train for exactly N steps instead of whole epochs\n"
"  --batch N              samples per step and worker (default 128)\n"
"  --accumulate K         K micro-batches of --batch samples a step: their\n"
"                         gradients add up before one reduction and one update\n"
"                         (default 1; not synth; doc/cli.md)\n"
"  --optimizer sgd|adamw  (default adamw)\n"
"  --lr X                 peak learning rate (default 0.001)\n"
"  --momentum X           SGD momentum (default 0.9)\n"
"  --weight-decay X       decoupled for AdamW, L2 for SGD; matrices only (default 0.01)\n"
"  --optimizer-moments fp32|bf16|bf16-sr   the optimizer's state (moments,\n"
"                         momentum) in bf16, rounded to nearest or stochastically;\n"
"                         weights fp32 (default fp32; doc/precision.md)\n"
"  --schedule constant|cosine   learning-rate schedule (default cosine: linear\n"
"                         warmup, then cosine decay to 0 at the last step)\n"
"  --warmup N             warmup steps of the cosine schedule (default: 5% of the run)\n"
"  --seed N               seed of initialisation, shuffles and synthetic data (default 1)\n"
"Checkpoints:\n"
"  --checkpoint DIR       write the trained weights to DIR/final.safetensors, and\n"
"                         the whole training state to DIR/step-N.safetensors when\n"
"                         a signal stops the run and as --checkpoint-every says\n"
"  --checkpoint-every N|epoch   a step checkpoint every N steps (a strategy with\n"
"                         rounds: at the next round end), or after every epoch\n"
"                         (default: none)\n"
"  --keep K               keep the newest K step checkpoints (default 0: all)\n"
"  --resume DIR|FILE      continue a run from its newest step checkpoint in DIR\n"
"                         (or FILE), with the same options: bitwise the same run\n"
"  --usr1 stop|checkpoint on SIGUSR1 (sbatch --signal=USR1@T): stop like SIGTERM,\n"
"                         or write a step checkpoint and go on (default stop)\n"
"  --init FILE            start from a safetensors file's weights (a fresh\n"
"                         optimizer: fine-tuning); with 'subtrain eval': the\n"
"                         weights to evaluate on the test set\n"
"  subtrain eval --init FILE [data and model options]\n"
"                         evaluate saved weights on the test set\n"
"Output:\n"
"  --metrics FILE         JSON Lines: one record per epoch and a final one\n"
"  --report memory        every worker's peak memory by kind at the end\n"
"  --report align[=N]     sdp: every N steps (default 50), the cosine between each\n"
"                         worker's subnetwork gradient and the full model's on the\n"
"                         same batch (in the epoch lines and --metrics); both:\n"
"                         --report memory,align\n"
"  --progress auto|bar|plain|none   live bar on a terminal, one line per epoch\n"
"                         otherwise (default auto)\n"
"  --sample N             --model gpt: after training, print N bytes the trained\n"
"                         model generates after --prompt, seeded by --seed\n"
"                         (default 0: none)\n"
"  --prompt TEXT          the text the sample continues (default: a newline)\n"
"  --temperature X        sampling temperature, >= 0 (default 0.8; 0: greedy)\n"
"  --top-k K              draw among the K likeliest bytes (default 40; 0: all)\n"
"  -q, --quiet            print nothing but errors (and a --sample's text)\n"
"Configuration:\n"
"  --config FILE          read options from FILE first, one 'key = value' a line\n"
"                         (key: a long option without its dashes; flags: true or\n"
"                         false; '#' comments); the command line overrides it.\n"
"                         FILE may be a metrics file: its first record's run\n"
"                         configuration (doc/provenance.md)\n"
"  --dump-config          print the resolved configuration in that form, every\n"
"                         option, and exit without training\n"
"  -h, --help             this text\n"
"  -V, --version          version and library versions\n"
"\n"
"Exit status: 0 success, 1 runtime failure (data, memory, numerics), 2 bad usage,\n"
"130/143/138 stopped by SIGINT/SIGTERM/SIGUSR1 after the current step (or before\n"
"training, when the signal comes while the run starts).\n"
"Documentation: doc/cli.md in the source tree.\n", f);
}


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
static st_status parse_opt(const char *s, void *o) { return st_optimizer_parse(s, o); }
static st_status parse_moments(const char *s, void *o) { return st_moments_parse(s, o); }
static st_status parse_sched(const char *s, void *o) { return st_schedule_parse(s, o); }
static st_status parse_strategy(const char *s, void *o) { return st_strategy_parse(s, o); }

/* Copies s[0 .. len) into dst (ST_CLI_DATA_PATH_MAX bytes). */
static int copy_part(const char *what, const char *s, size_t len, char *dst, char *err, size_t n)
{
    if (len >= ST_CLI_DATA_PATH_MAX)
        return st_cli_fail(err, n, "%s: the name is too long (%zu bytes)", what, len);
    memcpy(dst, s, len);
    dst[len] = '\0';
    return 0;
}

/* idx:DIR[:TRAIN_IMAGES,TRAIN_LABELS,TEST_IMAGES,TEST_LABELS]: the names
 * follow the last ':' when what follows it has a comma (so a directory
 * may contain ':'). */
static int parse_idx_spec(const char *what, const char *spec, st_cli_data *d, char *err,
                          size_t n)
{
    const char *colon = strrchr(spec, ':');
    size_t dir_len = strlen(spec);
    d->has_names = colon && strchr(colon + 1, ',') != NULL;
    if (d->has_names) {
        dir_len = (size_t)(colon - spec);
        const char *p = colon + 1;
        for (int k = 0; k < 4; k++) {
            const char *end = strchr(p, ',');
            size_t len = end ? (size_t)(end - p) : strlen(p);
            if (len == 0 || (k == 3) != (end == NULL))
                return st_cli_fail(err, n, "%s idx:%s: expected four file names "
                            "TRAIN_IMAGES,TRAIN_LABELS,TEST_IMAGES,TEST_LABELS after the "
                            "directory, got '%s'", what, ST_CLI_SHOW(spec),
                            ST_CLI_SHOW(colon + 1));
            if (copy_part(what, p, len, d->names[k], err, n))
                return -1;
            p = end ? end + 1 : p + len;
        }
    }
    if (dir_len == 0)
        return st_cli_fail(err, n, "%s idx:%s: the directory is missing (idx:DIR[:TRAIN_IMAGES,"
                    "TRAIN_LABELS,TEST_IMAGES,TEST_LABELS])", what, ST_CLI_SHOW(spec));
    return copy_part(what, spec, dir_len, d->dir, err, n);
}

/* --data (or $SUBTRAIN_DATA, named by `what`). */
static int parse_data(const char *what, const char *s, st_cli_data *d, char *err, size_t n)
{
    static const struct { const char *prefix; st_cli_data_kind kind; } kinds[] = {
        { "cifar10", ST_CLI_DATA_CIFAR10 },
        { "cifar100", ST_CLI_DATA_CIFAR100 },
        { "idx", ST_CLI_DATA_IDX },
    };
    memset(d, 0, sizeof *d);
    if (*s == '\0')
        return st_cli_fail(err, n, "%s: expected a directory, 'synthetic', cifar10:DIR, "
                    "cifar100:DIR, idx:DIR or text:FILE, got ''", what);
    if (strcmp(s, "synthetic") == 0) {
        d->kind = ST_CLI_DATA_SYNTHETIC;
        return 0;
    }
    if (strncmp(s, "text:", 5) == 0 || strcmp(s, "text") == 0) {
        d->kind = ST_CLI_DATA_TEXT;
        if (s[4] == '\0' || s[5] == '\0')
            return st_cli_fail(err, n, "%s %s: the file is missing (text:FILE, e.g. "
                        "text:/usr/share/dictd/gcide.dict.dz)", what, ST_CLI_SHOW(s));
        return copy_part(what, s + 5, strlen(s + 5), d->dir, err, n);
    }
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        size_t len = strlen(kinds[k].prefix);
        if (strncmp(s, kinds[k].prefix, len) != 0 || (s[len] != ':' && s[len] != '\0'))
            continue;
        d->kind = kinds[k].kind;
        const char *rest = s[len] ? s + len + 1 : s + len;
        if (d->kind == ST_CLI_DATA_IDX)
            return parse_idx_spec(what, rest, d, err, n);
        if (*rest == '\0')
            return st_cli_fail(err, n, "%s %s: the directory is missing (%s:DIR, DIR the extracted "
                        "%s directory)", what, ST_CLI_SHOW(s), kinds[k].prefix,
                        d->kind == ST_CLI_DATA_CIFAR10 ? "cifar-10-batches-bin"
                                                       : "cifar-100-binary");
        return copy_part(what, rest, strlen(rest), d->dir, err, n);
    }
    d->kind = ST_CLI_DATA_FASHION;
    return copy_part(what, s, strlen(s), d->dir, err, n);
}

/* What was given explicitly, for the checks after parsing. */
typedef struct seen {
    int epochs, steps, model, depth, width, activation, context, heads, neuron_group;
    const char *text_option;    /* the first text-only option given */
    const char *sample_option;  /* the last of --prompt, --temperature, --top-k */
    /* the strategies' options given (options(): OPT_STRATEGY_OPTION + k),
     * the last value of each and when it came: applied once the strategy
     * is known (apply_strategy_options) */
    const char *strategy_arg[MAX_STRATEGY_OPTIONS];
    int strategy_seq[MAX_STRATEGY_OPTIONS], seq;
} seen;

/* --cuts 2,4: at most d->most increasing integers in [lo, hi] (digits
 * only, as every count). */
static int parse_counts(const st_strategy_option *d, const char *s, st_option_value *v,
                        char *err, size_t n)
{
    int k = 0;
    for (const char *p = s;; k++) {
        size_t len = strcspn(p, ",");
        char part[24], what[64], msg[128];
        unsigned long long x = 0;
        if (k == d->most || k == ST_OPTION_MAX_COUNTS)
            return st_cli_fail(err, n, "--%s: at most %d %s, got '%s'", d->name, k, d->name,
                               ST_CLI_SHOW(s));
        if (len < sizeof part) {
            memcpy(part, p, len);
            part[len] = '\0';
        }
        snprintf(what, sizeof what, "--%s", d->name);
        if (len >= sizeof part ||
            st_cli_parse_count(what, part, d->lo, d->hi, &x, msg, sizeof msg) ||
            (k > 0 && (int)x <= v->counts[k - 1]))
            return st_cli_fail(err, n, "--%s: expected %s, got '%s'", d->name, d->expected,
                               ST_CLI_SHOW(s));
        v->counts[k] = (int)x;
        if (p[len] == '\0')
            break;
        p += len + 1;
    }
    v->n_counts = k + 1;
    return 0;
}

/* A strategy option's value as typed, by its descriptor's syntax, with
 * the messages of the command's own options. */
static int parse_strategy_value(const st_strategy_option *d, const char *arg, st_option_value *v,
                                char *err, size_t n)
{
    char what[64];
    unsigned long long x;
    memset(v, 0, sizeof *v);
    snprintf(what, sizeof what, "--%s", d->name);
    switch (d->kind) {
    case ST_OPTION_COUNT:
        if (st_cli_parse_count(what, arg, d->lo, d->hi, &x, err, n))
            return -1;
        v->count = x;
        return 0;
    case ST_OPTION_REAL:
        return st_cli_parse_real(what, arg, d->lo_bracket, d->real_lo, d->real_hi,
                                 d->hi_bracket, 1, &v->real, err, n);
    case ST_OPTION_NAME: {
        char allowed[256] = "";
        for (int k = 0; d->names[k]; k++) {
            if (strcmp(arg, d->names[k]) == 0) {
                v->name = k;
                return 0;
            }
            snprintf(allowed + strlen(allowed), sizeof allowed - strlen(allowed), "%s%s",
                     k ? ", " : "", d->names[k]);
        }
        return st_cli_fail(err, n, "%s: unknown value '%s' (allowed: %s)", what, ST_CLI_SHOW(arg),
                           allowed);
    }
    case ST_OPTION_COUNTS:
        return parse_counts(d, arg, v, err, n);
    }
    return st_cli_fail(err, n, "internal: %s has no value syntax", what);
}

/* A strategy's option as given: its value checked now, kept until the
 * strategy is known. */
static int take_strategy_option(int k, const char *arg, seen *saw, char *err, size_t n)
{
    st_option_value v;
    if (parse_strategy_value(strategy_option[k], arg, &v, err, n))
        return -1;
    saw->strategy_arg[k] = arg;
    saw->strategy_seq[k] = ++saw->seq;
    return 0;
}

/* "synth", "ist or localsgd": the strategies that take option `name`. */
static void strategies_taking(const char *name, char *out, size_t size)
{
    int found = 0;
    out[0] = '\0';
    for (int s = 0; st_strategy_info_of((st_strategy)s); s++)
        if (descriptor_of((st_strategy)s, name))
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
    for (int k = 0; k < n_strategy_options; k++) {
        if (!saw->strategy_arg[k])
            continue;
        const st_strategy_option *d = descriptor_of(o->train.strategy, strategy_option[k]->name);
        if (!d && strategy_option[k]->only) {
            if (refused < 0 || saw->strategy_seq[k] > saw->strategy_seq[refused])
                refused = k;
            continue;
        }
        if (!d)
            d = strategy_option[k];
        st_option_value v;
        if (parse_strategy_value(d, saw->strategy_arg[k], &v, err, n))
            return -1;
        d->set(&o->train, &v);
    }
    if (refused < 0)
        return 0;
    char which[256];
    strategies_taking(strategy_option[refused]->name, which, sizeof which);
    return st_cli_fail(err, n, "--%s applies to --strategy %s only",
                       strategy_option[refused]->name, which);
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
        return parse_data("--data", arg, &o->data_spec, err, n);
    case OPT_AUGMENT_CROP: {
        int crop;
        if (parse_int("--augment-crop", arg, 0, 1024, &crop, err, n))
            return -1;
        o->augment.crop = (uint32_t)crop;
        return 0;
    }
    case OPT_AUGMENT_FLIP: o->augment.flip = 1; return 0;
    case OPT_CONTEXT: return parse_int("--context", arg, 1, 4096, &t->model.context, err, n);
    case OPT_HEADS: return parse_int("--heads", arg, 1, 65536, &t->model.heads, err, n);
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
    case OPT_COMM_PRECISION:
        return parse_choice("comm-precision", arg, parse_precision, &t->comm_precision, err, n);
    case OPT_NEURON_GROUP:
        return parse_int("--neuron-group", arg, 1, 65536, &t->neuron_group, err, n);
    case OPT_BN_CALIBRATION:
        return parse_int("--bn-calibration", arg, 0, 100000, &t->bn_calibration, err, n);
    case OPT_REPORT: return parse_report(arg, o, err, n);
    case 'q': o->quiet = 1; return 0;
    case OPT_CONFIG:
        if (*arg == '\0')
            return st_cli_fail(err, n, "--config: expected a file name, got ''");
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
    saw->neuron_group |= c == OPT_NEURON_GROUP;
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

static const struct option *option_named(const char *key)
{
    for (const struct option *p = options(); p->name; p++)
        if (strcmp(p->name, key) == 0)
            return p;
    return NULL;
}

/* The options that do something rather than configure the run. */
static int is_action(int c)
{
    return c == 'h' || c == 'V' || c == OPT_CONFIG || c == OPT_DUMP_CONFIG;
}

/* The configuration file's entries, each with the checks of its option on
 * the command line and the message prefixed with FILE:LINE. */
static int apply_config(st_cli_options *o, seen *saw, int *data_given, char *err, size_t n)
{
    const st_cli_config_file *cf = &o->config;
    const char *path = ST_CLI_SHOW(cf->path);
    for (int k = 0; k < cf->n; k++) {
        const st_cli_config_entry *e = &cf->entries[k];
        const struct option *opt = option_named(e->key);
        if (!opt)
            return st_cli_fail(err, n, "%s:%d: unknown key '%s' (keys are the long options of "
                        "subtrain train without their dashes; see subtrain --help)", path,
                        e->line, ST_CLI_SHOW(e->key));
        if (is_action(opt->val))
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
        int c = st_cli_next_option(argc, argv, ":qhV", options(), "subtrain", err, n);
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
    if (!data_given && parse_data("SUBTRAIN_DATA", o->data, &o->data_spec, err, n))
        return -1;
    if (o->config_path && o->metrics_path) {
        struct stat a, b;
        if (stat(o->config_path, &a) == 0 && stat(o->metrics_path, &b) == 0 &&
            a.st_dev == b.st_dev && a.st_ino == b.st_ino)
            return st_cli_fail(err, n, "--metrics %s is the file --config reads: name another "
                               "metrics file (this run would overwrite the record it repeats)",
                               ST_CLI_SHOW(o->metrics_path));
    }
    if (saw.epochs && saw.steps)
        return st_cli_fail(err, n, "--epochs and --steps cannot be used together: give one");
    if (saw.steps)
        o->train.epochs = 0;
    if (apply_strategy_options(o, &saw, err, n))
        return -1;
    const st_strategy_info *strategy = st_strategy_info_of(o->train.strategy);
    if (strategy->depth > 0) {   /* the model the strategy trains unless told */
        if (!saw.model)
            o->train.model.kind = strategy->model;
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
                          (saw.heads ? ST_MODEL_OPT_HEADS : 0u);
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

/* ------------------------------------------------------------ printing back */

/* The shortest of %.6g .. %.9g that reads back (strtod, then float, as
 * parse_float does) as the same float: "0.001", not "0.00100000005". */
static void float_text(float x, char *v, size_t n)
{
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(v, n, "%.*g", digits, (double)x);
        if ((float)strtod(v, NULL) == x)
            return;
    }
}

static void flag_text(int on, char *v, size_t n)
{
    snprintf(v, n, "%s", on ? "true" : "false");
}

/* A strategy option's value, from the chosen strategy's config, else
 * from the first strategy's that takes it (`first`): "" where that one's
 * option applies to it only, or where it has no value of its own. */
static void strategy_value(const st_strategy_option *first, const st_train_config *t, char *v,
                           size_t n)
{
    const st_strategy_option *d = descriptor_of(t->strategy, first->name);
    st_option_value x;
    memset(&x, 0, sizeof x);
    if (!d && first->only)
        return;
    if (!d)
        d = first;
    if (!d->get(t, &x))
        return;
    switch (d->kind) {
    case ST_OPTION_COUNT: snprintf(v, n, "%llu", (unsigned long long)x.count); break;
    case ST_OPTION_REAL: float_text((float)x.real, v, n); break;
    case ST_OPTION_NAME: snprintf(v, n, "%s", d->names[x.name]); break;
    case ST_OPTION_COUNTS:
        for (int k = 0; k < x.n_counts; k++)
            snprintf(v + strlen(v), n - strlen(v), "%s%d", k ? "," : "", x.counts[k]);
        break;
    }
}

/* The option's value as the command line would give it, or "" for its
 * default where that is not a value of its own (derived from other
 * options or from the data: --hidden, --warmup, --branch-scale, ...), for
 * nothing given (--metrics, --checkpoint, ...), or where the option does
 * not apply (--context of a model that takes none, synth's options
 * without synth): giving them there is an error. */
static void option_value(int c, const st_cli_options *o, char *v, size_t n)
{
    const st_train_config *t = &o->train;
    const st_model_config *m = &t->model;
    const int text = o->data_spec.kind == ST_CLI_DATA_TEXT, sample = o->sample > 0;
    static const char *const progress[] = { "auto", "bar", "plain", "none" };
    v[0] = '\0';
    if (c >= OPT_STRATEGY_OPTION) {
        strategy_value(strategy_option[c - OPT_STRATEGY_OPTION], t, v, n);
        return;
    }
    switch (c) {
    case OPT_DATA: snprintf(v, n, "%s", o->data); break;
    case OPT_AUGMENT_CROP: snprintf(v, n, "%u", o->augment.crop); break;
    case OPT_AUGMENT_FLIP: flag_text(o->augment.flip, v, n); break;
    case OPT_CONTEXT: if (m->context) snprintf(v, n, "%d", m->context); break;
    case OPT_HEADS: if (m->heads) snprintf(v, n, "%d", m->heads); break;
    case OPT_HOLDOUT: if (text) float_text(o->holdout, v, n); break;
    case OPT_VAL_BYTES: if (text) snprintf(v, n, "%llu", (unsigned long long)o->val_bytes); break;
    case OPT_EPOCH_WINDOWS:
        if (text && o->epoch_windows)
            snprintf(v, n, "%llu", (unsigned long long)o->epoch_windows);
        break;
    case OPT_SAMPLE: snprintf(v, n, "%llu", (unsigned long long)o->sample); break;
    case OPT_CHECKPOINT: snprintf(v, n, "%s", o->checkpoint_dir ? o->checkpoint_dir : ""); break;
    case OPT_INIT: snprintf(v, n, "%s", o->init_path ? o->init_path : ""); break;
    case OPT_CHECKPOINT_EVERY:
        if (t->checkpoint.every_epoch)
            snprintf(v, n, "epoch");
        else if (t->checkpoint.every)
            snprintf(v, n, "%llu", (unsigned long long)t->checkpoint.every);
        break;
    case OPT_KEEP: snprintf(v, n, "%d", t->checkpoint.keep); break;
    case OPT_RESUME: snprintf(v, n, "%s", o->resume_path ? o->resume_path : ""); break;
    case OPT_USR1: snprintf(v, n, "%s", o->usr1_checkpoint ? "checkpoint" : "stop"); break;
    case OPT_PROMPT: if (sample) snprintf(v, n, "%s", o->prompt); break;
    case OPT_TEMPERATURE: if (sample) float_text(o->temperature, v, n); break;
    case OPT_TOP_K: if (sample) snprintf(v, n, "%d", o->top_k); break;
    case OPT_MODEL: snprintf(v, n, "%s", st_model_kind_name(m->kind)); break;
    case OPT_DEPTH: snprintf(v, n, "%d", m->depth); break;
    case OPT_WIDTH: snprintf(v, n, "%d", m->width); break;
    case OPT_HIDDEN: if (m->hidden) snprintf(v, n, "%d", m->hidden); break;
    case OPT_ACTIVATION: snprintf(v, n, "%s", st_activation_name(m->activation)); break;
    case OPT_PRECISION: snprintf(v, n, "%s", st_precision_name(m->precision)); break;
    case OPT_BF16_EMULATED: flag_text(t->bf16_emulated, v, n); break;
    case OPT_EPOCHS: if (!t->steps) snprintf(v, n, "%d", t->epochs); break;
    case OPT_STEPS: if (t->steps) snprintf(v, n, "%llu", (unsigned long long)t->steps); break;
    case OPT_BATCH: snprintf(v, n, "%d", t->batch); break;
    case OPT_ACCUMULATE: snprintf(v, n, "%d", t->accumulate); break;
    case OPT_OPTIMIZER_MOMENTS: snprintf(v, n, "%s", st_moments_name(t->optim.moments)); break;
    case OPT_OPTIMIZER: snprintf(v, n, "%s", st_optimizer_name(t->optim.kind)); break;
    case OPT_LR: float_text(t->optim.lr, v, n); break;
    case OPT_MOMENTUM: float_text(t->optim.momentum, v, n); break;
    case OPT_WEIGHT_DECAY: float_text(t->optim.weight_decay, v, n); break;
    case OPT_SCHEDULE: snprintf(v, n, "%s", st_schedule_name(t->schedule)); break;
    case OPT_WARMUP:
        if (t->warmup_steps != ST_WARMUP_AUTO)
            snprintf(v, n, "%llu", (unsigned long long)t->warmup_steps);
        break;
    case OPT_SEED: snprintf(v, n, "%llu", (unsigned long long)t->seed); break;
    case OPT_METRICS: snprintf(v, n, "%s", o->metrics_path ? o->metrics_path : ""); break;
    case OPT_PROGRESS: snprintf(v, n, "%s", progress[o->progress]); break;
    case OPT_STRATEGY: snprintf(v, n, "%s", st_strategy_name(t->strategy)); break;
    case OPT_WORKERS:
        if (t->workers)
            snprintf(v, n, "%d", t->workers);
        else
            snprintf(v, n, "cores");
        break;
    case OPT_TOPOLOGY: break;   /* training refuses it: 'subtrain topo' takes it */
    case OPT_CPUSET: snprintf(v, n, "%s", t->cpuset ? t->cpuset : ""); break;
    case OPT_OVERSUBSCRIBE: flag_text(t->oversubscribe, v, n); break;
    case OPT_THREADS:
        snprintf(v, n, "%d", t->threads_per_worker > 1 ? t->threads_per_worker : 1);
        break;
    case OPT_TEAM_SPANS: flag_text(t->team_spans, v, n); break;
    case OPT_COMM_PRECISION: snprintf(v, n, "%s", st_precision_name(t->comm_precision)); break;
    case OPT_NEURON_GROUP: snprintf(v, n, "%d", t->neuron_group); break;
    case OPT_BN_CALIBRATION: snprintf(v, n, "%d", t->bn_calibration); break;
    case OPT_REPORT:
        if (o->report_memory && t->sdp.align_every)
            snprintf(v, n, "memory,align=%llu", (unsigned long long)t->sdp.align_every);
        else if (o->report_memory)
            snprintf(v, n, "memory");
        else if (t->sdp.align_every)
            snprintf(v, n, "align=%llu", (unsigned long long)t->sdp.align_every);
        break;
    case 'q': flag_text(o->quiet, v, n); break;
    }
}

void st_cli_config_each(const st_cli_options *o,
                        void (*emit)(const char *key, const char *value, void *user), void *user)
{
    char value[2 * ST_CLI_DATA_PATH_MAX], quoted[4 * ST_CLI_DATA_PATH_MAX + 8];
    for (const struct option *p = options(); p->name; p++) {
        if (is_action(p->val))
            continue;
        option_value(p->val, o, value, sizeof value);
        st_cli_config_quote(value, quoted, sizeof quoted);
        emit(p->name, quoted, user);
    }
}

static void dump_line(const char *key, const char *value, void *user)
{
    fprintf((FILE *)user, *value ? "%s = %s\n" : "%s =\n", key, value);
}

void st_cli_config_dump(FILE *f, const st_cli_options *o)
{
    fprintf(f, "# subtrain %s: the resolved configuration; 'subtrain --config FILE' repeats "
            "the run.\n# An empty value: the option's default (derived from the others or the "
            "data), or it does not apply.\n", SUBTRAIN_VERSION);
    st_cli_config_each(o, dump_line, f);
}

/* cli/config_dump.c — each option's value printed back as the command
 * line or a configuration file would give it: --dump-config, and the run
 * configuration of the provenance record (st_cli_config_each). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/version.h>

#include "cli/cli_util.h"
#include "cli/option_table.h"
#include "cli/options.h"

/* The shortest of %.6g .. %.9g that reads back (strtod, then float, as
 * the option parser does) as the same float: "0.001", not "0.00100000005". */
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
    const st_strategy_option *d = st_cli_strategy_descriptor(t->strategy, first->name);
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
    case ST_OPTION_TEXT: d->print(&x, v, n); break;
    case ST_OPTION_FLAG: flag_text(x.name, v, n); break;
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
        strategy_value(st_cli_strategy_option(c - OPT_STRATEGY_OPTION), t, v, n);
        return;
    }
    switch (c) {
    case OPT_DATA: snprintf(v, n, "%s", o->data); break;
    case OPT_AUGMENT_CROP: snprintf(v, n, "%u", o->augment.crop); break;
    case OPT_AUGMENT_FLIP: flag_text(o->augment.flip, v, n); break;
    case OPT_SPLIT: st_split_name(&t->split, v, n); break;
    case OPT_CONTEXT: if (m->context) snprintf(v, n, "%d", m->context); break;
    case OPT_HEADS: if (m->heads) snprintf(v, n, "%d", m->heads); break;
    case OPT_PATCH: if (m->patch) snprintf(v, n, "%d", m->patch); break;
    case OPT_POOL:
        if (st_model_kind_takes(m->kind, ST_MODEL_OPT_POOL))
            snprintf(v, n, "%s", st_token_pool_name(m->pool));
        break;
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
    case OPT_UNFUSE: st_unfuse_describe(m->unfuse, v, n); break;
    case OPT_RECOMPUTE: snprintf(v, n, "%s", st_recompute_name(m->recompute)); break;
    /* written in fp32 too, where they can only be their defaults: the
     * default a resume assumes for a file without them is an fp32 run's */
    case OPT_ACTIVATION_PRECISION: snprintf(v, n, "%s", st_precision_name(m->activations)); break;
    case OPT_TENSOR_LAYOUT: snprintf(v, n, "%s", st_tensor_layout_name(m->tensor_layout)); break;
    case OPT_WEIGHT_LAYOUT: snprintf(v, n, "%s", st_weight_layout_name(m->weight_layout)); break;
    case OPT_EPOCHS: if (!t->steps) snprintf(v, n, "%d", t->epochs); break;
    case OPT_STEPS: if (t->steps) snprintf(v, n, "%llu", (unsigned long long)t->steps); break;
    case OPT_BATCH: snprintf(v, n, "%d", t->batch); break;
    case OPT_ACCUMULATE: snprintf(v, n, "%d", t->accumulate); break;
    case OPT_OPTIMIZER_MOMENTS: snprintf(v, n, "%s", st_moments_name(t->optim.moments)); break;
    case OPT_MASTER_WEIGHTS: snprintf(v, n, "%s", st_master_name(t->optim.master)); break;
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
    case OPT_WEIGHTS:   /* what the run has: shared only where its strategy can */
        snprintf(v, n, "%s", st_weights_name(st_strategy_weights(t) == ST_WEIGHTS_SHARED
                                              ? t->weights : ST_WEIGHTS_PRIVATE));
        break;
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
    for (const struct option *p = st_cli_option_table(); p->name; p++) {
        if (st_cli_option_is_action(p->val))
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

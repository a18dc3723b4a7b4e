/*
 * train/config.c — the training config: its defaults and its checks (each
 * strategy checks its own options, strategy.c).
 */
#include <stdio.h>
#include <string.h>

#include <subtrain/world.h>

#include "core/error.h"
#include "train/strategy.h"

st_train_config st_train_config_default(void)
{
    st_train_config c = {
        .strategy = 0,   /* the table's first: data parallelism */
        .bn_calibration = 50,
        .neuron_group = 16,
        .workers = 1,
        .model = st_model_config_default(),
        .optim = st_optim_config_default(),
        .schedule = ST_SCHED_WARMUP_COSINE,
        .warmup_steps = ST_WARMUP_AUTO,
        .batch = 128,
        .accumulate = 1,
        .epochs = 5,
        .steps = 0,
        .seed = 1,
    };
    st_strategy_defaults_all(&c);
    return c;
}

/* "dp, sdp, ist, ...": the table's names. */
static void strategy_names(char *out, size_t size)
{
    size_t used = 0;
    out[0] = '\0';
    for (int k = 0; st_strategy_ops_of((st_strategy)k) && used < size; k++)
        used += (size_t)snprintf(out + used, size - used, "%s%s", k ? ", " : "",
                                 st_strategy_name((st_strategy)k));
}

/* A bf16 master lives in the weights' bf16 copies, which a bf16 model
 * makes and the update writes (doc/precision.md): dp's, localsgd's and
 * sdp's (forward-masked subnetworks: in bf16 master shards of the full
 * layout); ist and synth move fp32 masters between models of other
 * layouts (saved masters, segments). */
static st_status master_check(const st_train_config *c)
{
    if (c->optim.master != ST_MASTER_BF16_SR)
        return ST_OK;
    if (c->model.precision != ST_PRECISION_BF16)
        return st_fail(ST_ERR_INVALID, "--master-weights bf16-sr keeps the master weights in "
                       "the bf16 copies of --precision bf16; this run has --precision %s",
                       st_precision_name(c->model.precision));
    if (c->model.unfuse & ST_UNFUSE_WEIGHT_COPY)
        return st_fail(ST_ERR_INVALID, "--master-weights bf16-sr keeps the master weights in "
                       "the update's bf16 copies, which --unfuse weight-copy does not make");
    if (c->model.weight_layout == ST_WEIGHT_LAYOUT_BLOCKED)
        return st_fail(ST_ERR_INVALID, "--master-weights bf16-sr keeps the master weights in "
                       "bf16 copies in the parameters' order, which --weight-layout blocked "
                       "does not make (use --weight-layout plain)");
    if (c->strategy != ST_STRATEGY_DP && c->strategy != ST_STRATEGY_SDP &&
        strcmp(st_strategy_name(c->strategy), "localsgd") != 0)   /* (no enumerator) */
        return st_fail(ST_ERR_INVALID, "--master-weights bf16-sr applies to --strategy dp, "
                       "localsgd and sdp, not to --strategy %s", st_strategy_name(c->strategy));
    return ST_OK;
}

st_status st_train_config_check(const st_train_config *c)
{
    ST_TRY(st_model_config_check(&c->model));
    ST_TRY(st_optim_config_check(&c->optim));
    if (!st_strategy_ops_of(c->strategy)) {
        char names[128];
        strategy_names(names, sizeof names);
        return st_fail(ST_ERR_INVALID, "unknown strategy %d (allowed: %s)", (int)c->strategy,
                       names);
    }
    if (c->neuron_group < 1 || c->neuron_group > 65536)
        return st_fail(ST_ERR_INVALID, "--neuron-group must be in [1, 65536], got %d",
                       c->neuron_group);
    ST_TRY(st_strategy_check_all(c));
    if (c->workers < 0 || c->workers > 4096)
        return st_fail(ST_ERR_INVALID, "workers must be in [1, 4096] (or 0: one per core), got %d",
                       c->workers);
    if (c->batch < 1 || c->batch > 65536)
        return st_fail(ST_ERR_INVALID, "batch must be in [1, 65536], got %d", c->batch);
    ST_TRY(st_split_config_check(&c->split));
    if (c->accumulate < 0 || c->accumulate > 65536)
        return st_fail(ST_ERR_INVALID, "--accumulate must be in [1, 65536], got %d",
                       c->accumulate);
    if (c->model.precision == ST_PRECISION_BF16) {
        const char *isa;
        switch (st_bf16_probe(&isa)) {
        case ST_BF16_NATIVE:
            break;
        case ST_BF16_EMULATED:
            if (!c->bf16_emulated)
                return st_fail(ST_ERR_INVALID, "--precision bf16: oneDNN's ISA here is %s, "
                               "without native bf16, so bf16 would run emulated at about a "
                               "third of fp32 speed (--bf16-emulated runs it anyway)", isa);
            break;
        case ST_BF16_UNAVAILABLE:
            return st_fail(ST_ERR_INVALID, "--precision bf16: oneDNN has no bf16 matrix "
                           "product for ISA %s (use --precision fp32)", isa);
        }
    }
    ST_TRY(master_check(c));
    if (c->comm_precision != ST_PRECISION_FP32 && c->comm_precision != ST_PRECISION_BF16)
        return st_fail(ST_ERR_INVALID, "unknown --comm-precision %d (fp32 or bf16)",
                       (int)c->comm_precision);
    if (c->weights != ST_WEIGHTS_SHARED && c->weights != ST_WEIGHTS_PRIVATE)
        return st_fail(ST_ERR_INVALID, "unknown weights placement %d (shared or private)",
                       (int)c->weights);
    const st_strategy_info *info = st_strategy_info_of(c->strategy);
    if (c->init_params && info->no_init)
        return st_fail(ST_ERR_INVALID, "--init does not apply to --strategy %s (%s)", info->name,
                       info->no_init);
    if (c->checkpoint.keep < 0)
        return st_fail(ST_ERR_INVALID, "--keep must be >= 0 (0: every checkpoint), got %d",
                       c->checkpoint.keep);
    if (c->init_params && c->resume)
        return st_fail(ST_ERR_INVALID, "--init and --resume: a resumed run continues from its "
                       "checkpoint's weights; give one of them");
    if (c->n_options < 0 || (c->n_options > 0 && !c->options))
        return st_fail(ST_ERR_INVALID, "n_options %d: expected >= 0, with that many in "
                       "options", c->n_options);
    for (int i = 0; i < c->n_options; i++) {
        const st_safetensors_meta_entry *o = &c->options[i];
        if (!o->key || !*o->key || strlen(o->key) > 200 || !o->value)
            return st_fail(ST_ERR_INVALID, "options[%d]: a key of 1 to 200 bytes and a value "
                           "(\"\": the default) are needed", i);
        for (int j = 0; j < i; j++)
            if (strcmp(c->options[j].key, o->key) == 0)
                return st_fail(ST_ERR_INVALID, "options: '%s' given twice", o->key);
    }
    if (c->bn_calibration < 0 || c->bn_calibration > 100000)
        return st_fail(ST_ERR_INVALID, "--bn-calibration must be in [0, 100000] batches, got %d",
                       c->bn_calibration);
    if (c->steps == 0 && (c->epochs < 1 || c->epochs > 100000))
        return st_fail(ST_ERR_INVALID, "epochs must be in [1, 100000], got %d", c->epochs);
    if (c->schedule == ST_SCHED_WARMUP_COSINE && c->warmup_steps != ST_WARMUP_AUTO &&
        c->steps && c->warmup_steps >= c->steps)
        return st_fail(ST_ERR_INVALID, "warmup (%llu steps) must be shorter than the run (%llu steps)",
                       (unsigned long long)c->warmup_steps, (unsigned long long)c->steps);
    /* The layout, when the worker count is known here: given (not "cores",
     * which st_train_placement_check resolves) and not a rank of an MPI job
     * whose ranks are not counted yet (before st_world_init) */
    if (c->workers > 0 && (st_world_size() > 1 || !st_world_launched()))
        ST_TRY(st_strategy_check_layout(c, c->workers * st_world_size()));
    return ST_OK;
}

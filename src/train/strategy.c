/*
 * train/strategy.c — the table of strategies, and what reads it whole:
 * their names (st_strategy_name, st_strategy_parse), every strategy's
 * defaults and checks, the public st_strategy_* calls (subtrain/strategy.h).
 *
 * A strategy is a file defining st_NAME_ops and its name in STRATEGIES
 * below, in the order of st_strategy (train.h): its number is its place.
 */
#include <stdio.h>
#include <string.h>

#include "core/enum_table.h"
#include "core/error.h"
#include "train/strategy.h"

#define STRATEGIES(X) X(dp) X(sdp) X(ist) X(synth) X(localsgd)

#define DECLARE(name) extern const st_strategy_ops st_##name##_ops;
STRATEGIES(DECLARE)
#define ENTRY(name) &st_##name##_ops,
static const st_strategy_ops *const TABLE[] = { STRATEGIES(ENTRY) };
#define N_STRATEGIES ((int)(sizeof TABLE / sizeof TABLE[0]))

const st_strategy_ops *st_strategy_ops_of(st_strategy s)
{
    return (int)s >= 0 && (int)s < N_STRATEGIES ? TABLE[s] : NULL;
}

const st_strategy_info *st_strategy_info_of(st_strategy s)
{
    const st_strategy_ops *ops = st_strategy_ops_of(s);
    return ops ? &ops->info : NULL;
}

st_weights st_strategy_weights(const st_train_config *c)
{
    const st_strategy_ops *ops = st_strategy_ops_of(c->strategy);
    return ops && ops->weights ? ops->weights(c) : ST_WEIGHTS_PRIVATE;
}

const char *st_strategy_name(st_strategy s)
{
    const st_strategy_ops *ops = st_strategy_ops_of(s);
    return ops ? ops->info.name : "unknown";
}

st_status st_strategy_parse(const char *name, st_strategy *out)
{
    /* the table's names as an enum table: its message lists them */
    st_enum_entry entries[N_STRATEGIES];
    for (int k = 0; k < N_STRATEGIES; k++)
        entries[k] = (st_enum_entry){ TABLE[k]->info.name, k };
    const st_enum_table names = ST_ENUM_TABLE("strategy", entries);
    int v;
    ST_TRY(st_enum_parse(&names, name, &v));
    *out = (st_strategy)v;
    return ST_OK;
}

void st_strategy_defaults_all(st_train_config *c)
{
    for (int k = 0; k < N_STRATEGIES; k++)
        if (TABLE[k]->defaults)
            TABLE[k]->defaults(c);
}

st_status st_strategy_check_all(const st_train_config *c)
{
    for (int k = 0; k < N_STRATEGIES; k++)
        ST_TRY(TABLE[k]->check(c, k == (int)c->strategy));
    return ST_OK;
}

st_status st_strategy_check_layout(const st_train_config *c, int workers)
{
    const st_strategy_ops *ops = st_strategy_ops_of(c->strategy);
    return ops && ops->layout ? ops->layout(c, workers) : ST_OK;
}

void st_strategy_describe(const st_train_config *c, int workers, char *out, size_t n)
{
    const st_strategy_ops *ops = st_strategy_ops_of(c->strategy);
    if (n == 0)
        return;
    int len = snprintf(out, n, "%s", st_strategy_name(c->strategy));
    if (ops && ops->describe && len >= 0 && (size_t)len < n)
        ops->describe(c, workers, out + len, n - (size_t)len);
}

float st_strategy_eval_scale(const st_train_config *c, int workers)
{
    const st_strategy_ops *ops = st_strategy_ops_of(c->strategy);
    return ops && ops->eval_scale ? ops->eval_scale(c, workers) : 0.0f;
}

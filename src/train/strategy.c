/*
 * train/strategy.c — the table of strategies: one entry per st_strategy.
 * Adding a strategy is an enumerator in train.h, its name in
 * train_enums.c, a file with its ops and one line here (strategy.h).
 */
#include "core/error.h"
#include "train/strategy.h"

static const st_strategy_ops *const TABLE[] = {
    [ST_STRATEGY_DP] = &st_dp_ops,
    [ST_STRATEGY_SDP] = &st_sdp_ops,
    [ST_STRATEGY_IST] = &st_ist_ops,
    [ST_STRATEGY_SYNTH] = &st_synth_ops,
};
#define N_STRATEGIES ((int)(sizeof TABLE / sizeof TABLE[0]))

const st_strategy_ops *st_strategy_ops_of(st_strategy s)
{
    return (int)s >= 0 && (int)s < N_STRATEGIES ? TABLE[s] : NULL;
}

st_status st_strategy_check_all(const st_train_config *c)
{
    for (int k = 0; k < N_STRATEGIES; k++)
        ST_TRY(TABLE[k]->check(c));
    return ST_OK;
}

st_status st_strategy_check_layout(const st_train_config *c, int workers)
{
    const st_strategy_ops *ops = st_strategy_ops_of(c->strategy);
    return ops && ops->layout ? ops->layout(c, workers) : ST_OK;
}

/* train/train_enums.c — names of the training strategies and of the kinds
 * of synthetic labels. */
#include <subtrain/synth.h>
#include <subtrain/train.h>

#include "core/enum_table.h"
#include "core/error.h"

static const st_enum_entry strategy_entries[] = {
    { "dp", ST_STRATEGY_DP },
    { "sdp", ST_STRATEGY_SDP },
    { "ist", ST_STRATEGY_IST },
    { "synth", ST_STRATEGY_SYNTH },
};
static const st_enum_table strategies = ST_ENUM_TABLE("strategy", strategy_entries);

static const st_enum_entry synth_labels_entries[] = {
    { "gaussian", ST_SYNTH_GAUSSIAN },
    { "sign", ST_SYNTH_SIGN },
};
static const st_enum_table synth_labels =
    ST_ENUM_TABLE("synthetic-label kind", synth_labels_entries);

const char *st_strategy_name(st_strategy s)
{
    return st_enum_name(&strategies, (int)s);
}

st_status st_strategy_parse(const char *name, st_strategy *out)
{
    int v;
    ST_TRY(st_enum_parse(&strategies, name, &v));
    *out = (st_strategy)v;
    return ST_OK;
}

const char *st_synth_labels_name(st_synth_labels kind)
{
    return st_enum_name(&synth_labels, (int)kind);
}

st_status st_synth_labels_parse(const char *name, st_synth_labels *out)
{
    int v;
    ST_TRY(st_enum_parse(&synth_labels, name, &v));
    *out = (st_synth_labels)v;
    return ST_OK;
}

/* train/train_enums.c — names of the kinds of synthetic labels and of
 * the weights' placements (the strategies' names are their table's,
 * strategy.c). */
#include <subtrain/synth.h>
#include <subtrain/train.h>

#include "core/enum_table.h"
#include "core/error.h"

static const st_enum_entry synth_labels_entries[] = {
    { "gaussian", ST_SYNTH_GAUSSIAN },
    { "sign", ST_SYNTH_SIGN },
};
static const st_enum_table synth_labels =
    ST_ENUM_TABLE("synthetic-label kind", synth_labels_entries);

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

static const st_enum_entry weights_entries[] = {
    { "shared", ST_WEIGHTS_SHARED },
    { "private", ST_WEIGHTS_PRIVATE },
};
static const st_enum_table weights =
    ST_ENUM_TABLE("weights placement", weights_entries);

const char *st_weights_name(st_weights w)
{
    return st_enum_name(&weights, (int)w);
}

st_status st_weights_parse(const char *name, st_weights *out)
{
    int v;
    ST_TRY(st_enum_parse(&weights, name, &v));
    *out = (st_weights)v;
    return ST_OK;
}

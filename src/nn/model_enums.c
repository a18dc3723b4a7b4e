/* nn/model_enums.c — names of the activations, precisions and recompute
 * modes (the model kinds' are their entries', nn/model.c). */
#include <subtrain/model.h>

#include "core/enum_table.h"
#include "core/error.h"

static const st_enum_entry activation_entries[] = {
    { "relu", ST_ACT_RELU },
    { "gelu", ST_ACT_GELU },
};
static const st_enum_table activations = ST_ENUM_TABLE("activation", activation_entries);

static const st_enum_entry precision_entries[] = {
    { "fp32", ST_PRECISION_FP32 },
    { "bf16", ST_PRECISION_BF16 },
};
static const st_enum_table precisions = ST_ENUM_TABLE("precision", precision_entries);

static const st_enum_entry recompute_entries[] = {
    { "none", ST_RECOMPUTE_NONE },
    { "blocks", ST_RECOMPUTE_BLOCKS },
    { "all", ST_RECOMPUTE_ALL },
};
static const st_enum_table recomputes = ST_ENUM_TABLE("recompute", recompute_entries);

const char *st_activation_name(st_activation act)
{
    return st_enum_name(&activations, (int)act);
}

st_status st_activation_parse(const char *name, st_activation *out)
{
    int v;
    ST_TRY(st_enum_parse(&activations, name, &v));
    *out = (st_activation)v;
    return ST_OK;
}

const char *st_precision_name(st_precision p)
{
    return st_enum_name(&precisions, (int)p);
}

st_status st_precision_parse(const char *name, st_precision *out)
{
    int v;
    ST_TRY(st_enum_parse(&precisions, name, &v));
    *out = (st_precision)v;
    return ST_OK;
}

const char *st_recompute_name(st_recompute r)
{
    return st_enum_name(&recomputes, (int)r);
}

st_status st_recompute_parse(const char *name, st_recompute *out)
{
    int v;
    ST_TRY(st_enum_parse(&recomputes, name, &v));
    *out = (st_recompute)v;
    return ST_OK;
}

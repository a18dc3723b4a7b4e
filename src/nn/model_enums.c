/* nn/model_enums.c — names of the activations, precisions, tensor layouts, poolings,
 * fusions and recompute modes (the model kinds' are their entries', nn/model.c). */
#include <stdio.h>
#include <string.h>

#include <subtrain/model.h>

#include "core/enum_table.h"
#include "core/error.h"
#include "nn/dnnl_util.h"

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

static const st_enum_entry layout_entries[] = {
    { "auto", ST_TENSOR_LAYOUT_AUTO },
    { "blocked", ST_TENSOR_LAYOUT_BLOCKED },
    { "nhwc", ST_TENSOR_LAYOUT_NHWC },
};
static const st_enum_table layouts = ST_ENUM_TABLE("tensor layout", layout_entries);

static const st_enum_entry weight_layout_entries[] = {
    { "plain", ST_WEIGHT_LAYOUT_PLAIN },
    { "blocked", ST_WEIGHT_LAYOUT_BLOCKED },
};
static const st_enum_table weight_layouts = ST_ENUM_TABLE("weight layout", weight_layout_entries);

static const st_enum_entry pool_entries[] = {
    { "mean", ST_POOL_MEAN },
    { "cls", ST_POOL_CLS },
};
static const st_enum_table pools = ST_ENUM_TABLE("pool", pool_entries);

/* In ST_UNFUSE_* bit order (st_unfuse_describe lists them so) */
static const st_enum_entry unfuse_entries[] = {
    { "none", 0 },
    { "bias", ST_UNFUSE_BIAS },
    { "residual", ST_UNFUSE_RESIDUAL },
    { "weight-copy", ST_UNFUSE_WEIGHT_COPY },
    { "relu", ST_UNFUSE_RELU },
    { "bn-relu", ST_UNFUSE_BN_RELU },
    { "relu-backward", ST_UNFUSE_RELU_BACKWARD },
    { "gelu-backward", ST_UNFUSE_GELU_BACKWARD },
};
static const st_enum_table fusions = ST_ENUM_TABLE("fusion", unfuse_entries);
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

const char *st_tensor_layout_name(st_tensor_layout l)
{
    return st_enum_name(&layouts, (int)l);
}

st_status st_tensor_layout_parse(const char *name, st_tensor_layout *out)
{
    int v;
    ST_TRY(st_enum_parse(&layouts, name, &v));
    *out = (st_tensor_layout)v;
    return ST_OK;
}

const char *st_weight_layout_name(st_weight_layout l)
{
    return st_enum_name(&weight_layouts, (int)l);
}

st_status st_weight_layout_parse(const char *name, st_weight_layout *out)
{
    int v;
    ST_TRY(st_enum_parse(&weight_layouts, name, &v));
    *out = (st_weight_layout)v;
    return ST_OK;
}

st_tensor_layout st_tensor_layout_resolve(st_tensor_layout l, st_precision p)
{
    if (l != ST_TENSOR_LAYOUT_AUTO)
        return l;
    return st_conv_takes_nhwc(p == ST_PRECISION_BF16) ? ST_TENSOR_LAYOUT_NHWC
                                                      : ST_TENSOR_LAYOUT_BLOCKED;
}

const char *st_token_pool_name(st_token_pool p)
{
    return st_enum_name(&pools, (int)p);
}

st_status st_token_pool_parse(const char *name, st_token_pool *out)
{
    int v;
    ST_TRY(st_enum_parse(&pools, name, &v));
    *out = (st_token_pool)v;
    return ST_OK;
}

st_status st_unfuse_parse(const char *list, unsigned *out)
{
    unsigned bits = 0;
    for (const char *p = list;; p++) {
        const size_t len = strcspn(p, ",");
        char name[32];
        int v = -1;
        if (len < sizeof name) {
            memcpy(name, p, len);
            name[len] = '\0';
            ST_TRY(st_enum_parse(&fusions, name, &v));
        } else {
            char allowed[128];
            st_enum_allowed(&fusions, allowed, sizeof allowed);
            return st_fail(ST_ERR_INVALID, "unknown fusion '%.*s' (allowed: %s)", (int)len, p,
                           allowed);
        }
        if (v == 0 && (p != list || p[len] != '\0'))
            return st_fail(ST_ERR_INVALID, "'none' cannot be listed with other fusions");
        bits |= (unsigned)v;
        p += len;
        if (*p == '\0')
            break;
    }
    *out = bits;
    return ST_OK;
}

size_t st_unfuse_describe(unsigned bits, char *buf, size_t n)
{
    size_t len = 0;
    for (size_t i = 1; i < sizeof unfuse_entries / sizeof *unfuse_entries; i++)
        if (bits & (unsigned)unfuse_entries[i].value) {
            const int w = snprintf(buf + (len < n ? len : n), len < n ? n - len : 0, "%s%s",
                                   len ? "," : "", unfuse_entries[i].name);
            len += (size_t)w;
        }
    if (len == 0)
        len = (size_t)snprintf(buf, n, "none");
    return len;
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

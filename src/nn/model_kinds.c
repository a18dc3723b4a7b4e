/*
 * nn/model_kinds.c — the table of model kinds: each is the entry
 * st_model_NAME that src/nn/models/NAME.c defines, and its place in
 * MODEL_KINDS is its st_model_kind.  Names, --help words, what a kind
 * reads and takes, defaults, checks and banner words come from the
 * entries.
 */
#include <stdio.h>
#include <string.h>

#include "core/enum_table.h"
#include "nn/graph.h"
#include "nn/model_kinds.h"

/* The model kinds, in the order --help and messages list them: each is
 * the entry st_model_NAME that src/nn/models/NAME.c defines, and its
 * place here is its st_model_kind. */
#define MODEL_KINDS(X) X(mlp) X(resmlp) X(resnet) X(resnet18) X(gpt) X(convnet) X(vit)

#define DECLARE(name) extern const st_model_builder st_model_##name;
MODEL_KINDS(DECLARE)
#define ENTRY(name) &st_model_##name,
static const st_model_builder *const model_kinds[] = { MODEL_KINDS(ENTRY) };
#define N_KINDS ((int)(sizeof model_kinds / sizeof model_kinds[0]))

const st_model_builder *st_model_builder_of(st_model_kind kind)
{
    return kind >= 0 && kind < N_KINDS ? model_kinds[kind] : NULL;
}

st_status st_model_declare_kind(st_model *m)
{
    const st_model_config *c = &m->cfg;
    const st_model_builder *b = st_model_builder_of(c->kind);
    if (b->reads == ST_MODEL_READS_IMAGES && !c->in_channels)
        return st_fail(ST_ERR_INVALID, "--model %s takes images (C x H x W data), not %d "
                       "features", b->name, c->in_dim);
    return b->declare(m);
}

int st_model_kind_count(void) { return N_KINDS; }

st_model_kind st_model_kind_at(int i)
{
    return i >= 0 && i < N_KINDS ? i : -1;
}

st_model_kind st_model_kind_named(const char *name)
{
    for (int i = 0; name && i < N_KINDS; i++)
        if (strcmp(model_kinds[i]->name, name) == 0)
            return i;
    return -1;
}

const char *st_model_kind_name(st_model_kind kind)
{
    const st_model_builder *b = st_model_builder_of(kind);
    return b ? b->name : "unknown";
}

const char *st_model_kind_help(st_model_kind kind)
{
    const st_model_builder *b = st_model_builder_of(kind);
    return b ? b->help : NULL;
}

st_model_reads st_model_kind_reads(st_model_kind kind)
{
    const st_model_builder *b = st_model_builder_of(kind);
    return b ? b->reads : ST_MODEL_READS_FEATURES;
}

int st_model_kind_takes(st_model_kind kind, unsigned option)
{
    const st_model_builder *b = st_model_builder_of(kind);
    return b && (b->options & option) == option;
}

/* The names as an enum table: parsing and its message are every enum's
 * (core/enum_table.h). */
static st_enum_table kind_names(st_enum_entry *entries)
{
    for (int i = 0; i < N_KINDS; i++)
        entries[i] = (st_enum_entry){ model_kinds[i]->name, i };
    return (st_enum_table){ "model", entries, (size_t)N_KINDS };
}

st_status st_model_kind_parse(const char *name, st_model_kind *out)
{
    st_enum_entry entries[N_KINDS];
    const st_enum_table t = kind_names(entries);
    int v;
    ST_TRY(st_enum_parse(&t, name, &v));
    *out = v;
    return ST_OK;
}

size_t st_model_kind_list(char *buf, size_t n, const char *sep, int reads)
{
    size_t len = 0;
    if (n > 0)
        buf[0] = '\0';
    for (int i = 0; i < N_KINDS; i++) {
        if (reads >= 0 && model_kinds[i]->reads != (st_model_reads)reads)
            continue;
        const int k = snprintf(len < n ? buf + len : NULL, len < n ? n - len : 0, "%s%s",
                               len ? sep : "", model_kinds[i]->name);
        len += k > 0 ? (size_t)k : 0;
    }
    return len;
}

/* The options some kinds do not take, as a front end names them (every
 * kind accepts --depth, --width and --activation). */
static const struct { unsigned bit; const char *option; } optional[] = {
    { ST_MODEL_OPT_HIDDEN, "--hidden" },
    { ST_MODEL_OPT_CONTEXT, "--context" },
    { ST_MODEL_OPT_HEADS, "--heads" },
    { ST_MODEL_OPT_PATCH, "--patch" },
    { ST_MODEL_OPT_POOL, "--pool" },
};

void st_model_kinds_taking(unsigned option, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < N_KINDS && len < n; i++)
        if (model_kinds[i]->options & option)
            len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? ", " : "",
                                    model_kinds[i]->name);
}

st_status st_model_config_resolve(st_model_config *c, unsigned given)
{
    const st_model_builder *b = st_model_builder_of(c->kind);
    if (!b)
        return st_fail(ST_ERR_INVALID, "model: unknown kind %d", (int)c->kind);
    if (b->defaults)
        b->defaults(c, given);
    if (b->check_options)
        ST_TRY(b->check_options(c, given));
    for (size_t k = 0; k < sizeof optional / sizeof optional[0]; k++)
        if ((given & optional[k].bit) && !(b->options & optional[k].bit)) {
            char names[128];
            st_model_kinds_taking(optional[k].bit, names, sizeof names);
            return st_fail(ST_ERR_INVALID, "%s applies to --model %s only", optional[k].option,
                           names);
        }
    return ST_OK;
}

size_t st_model_config_describe(const st_model_config *c, char *buf, size_t n)
{
    const st_model_builder *b = st_model_builder_of(c->kind);
    char own[128] = "";
    if (b && b->describe)
        b->describe(c, own, sizeof own);
    const int k = snprintf(buf, n, "%s depth %d width %d%s", st_model_kind_name(c->kind),
                           c->depth, c->width, own);
    return k > 0 ? (size_t)k : 0;
}


/*
 * nn/model.c — model instances: configurations and their checks,
 * creation, initial values, the public accessors, and how a subnetwork's
 * vectors map onto the full model's.  The kinds' table is model_kinds.c.
 *
 * Build order: (1) the kind's builder declares the full model's layers and
 * tensors, and the config's units say which of them this instance holds
 * (graph_declare.c); (2) one walk lays out the flat parameter vector (segments) so
 * its size is known; (3) params, grads and every activation buffer come
 * from the arena; (4) each layer creates its primitives against those
 * buffers; (5) the shared workspace goes to every primitive.  The per-step
 * functions then only execute primitives, in one loop over the layers.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/rng.h>

#include "core/arena_impl.h"
#include "core/blocked.h"
#include "core/enum_table.h"
#include "core/rng_streams.h"
#include "nn/graph.h"
#include "nn/model_kinds.h"
#include "nn/model_memo.h"
#include "nn/recompute.h"

/* ------------------------------------------------------------ config */

st_model_config st_model_config_default(void)
{
    st_model_config c = {
        .kind = st_model_kind_named("resmlp"), .depth = 4, .width = 256, .hidden = 0,
        .activation = ST_ACT_GELU, .in_dim = 784, .n_classes = 10,
    };
    return c;
}

#define ST_MAX_DEPTH 1024
#define ST_MAX_WIDTH (1 << 16)
#define ST_MAX_CONTEXT 4096

static st_status check_subnet(const st_model_config *c, st_model_declare_fn declare);
static st_status layout_with(st_model *m, const st_model_config *cfg, st_model_declare_fn declare);
static st_status layout_full(st_model *m, const st_model_config *cfg);
static void destroy_layout(st_model *m);

/* A model with attention heads: a sequence model, or a kind that takes
 * --heads (the ViT, whose tokens are its patches). */
static int attends(const st_model_config *c)
{
    return c->context || st_model_kind_takes(c->kind, ST_MODEL_OPT_HEADS);
}

/* The sizes and options, whoever declares the model. */
static st_status check_fields(const st_model_config *c)
{
    if (c->depth < 1 || c->depth > ST_MAX_DEPTH)
        return st_fail(ST_ERR_INVALID, "depth must be in [1, %d], got %d", ST_MAX_DEPTH, c->depth);
    if (c->width < 1 || c->width > ST_MAX_WIDTH)
        return st_fail(ST_ERR_INVALID, "width must be in [1, %d], got %d", ST_MAX_WIDTH, c->width);
    if (c->hidden < 0 || c->hidden > ST_MAX_WIDTH)
        return st_fail(ST_ERR_INVALID, "hidden must be in [1, %d] (or 0 for the width), got %d",
                       ST_MAX_WIDTH, c->hidden);
    if (c->precision != ST_PRECISION_FP32 && c->precision != ST_PRECISION_BF16)
        return st_fail(ST_ERR_INVALID, "unknown precision %d (allowed: fp32, bf16)",
                       (int)c->precision);
    if (c->activations != ST_PRECISION_FP32 && c->activations != ST_PRECISION_BF16)
        return st_fail(ST_ERR_INVALID, "unknown activation precision %d (allowed: fp32, bf16)",
                       (int)c->activations);
    if (c->activations == ST_PRECISION_BF16 && c->precision != ST_PRECISION_BF16)
        return st_fail(ST_ERR_INVALID, "--activation-precision bf16 needs --precision bf16 "
                       "(the products that read the bf16 activations)");
    if (c->weight_layout != ST_WEIGHT_LAYOUT_PLAIN && c->weight_layout != ST_WEIGHT_LAYOUT_BLOCKED)
        return st_fail(ST_ERR_INVALID, "unknown weight layout %d (allowed: plain, blocked)",
                       (int)c->weight_layout);
    if (c->weight_layout == ST_WEIGHT_LAYOUT_BLOCKED && c->precision != ST_PRECISION_BF16)
        return st_fail(ST_ERR_INVALID, "--weight-layout blocked needs --precision bf16 (the "
                       "blocked copies are bf16; fp32 products read the weights as they lie)");
    if (c->activation != ST_ACT_RELU && c->activation != ST_ACT_GELU)
        return st_fail(ST_ERR_INVALID, "unknown activation %d (allowed: relu, gelu)", (int)c->activation);
    if (c->tensor_layout != ST_TENSOR_LAYOUT_AUTO && c->tensor_layout != ST_TENSOR_LAYOUT_BLOCKED &&
        c->tensor_layout != ST_TENSOR_LAYOUT_NHWC)
        return st_fail(ST_ERR_INVALID, "unknown tensor layout %d (allowed: auto, blocked, nhwc)",
                       (int)c->tensor_layout);
    if (c->recompute != ST_RECOMPUTE_NONE && c->recompute != ST_RECOMPUTE_BLOCKS &&
        c->recompute != ST_RECOMPUTE_ALL)
        return st_fail(ST_ERR_INVALID, "unknown recompute mode %d (allowed: none, blocks, all)",
                       (int)c->recompute);
    if (c->in_dim < 1 || c->in_dim > (1 << 24))
        return st_fail(ST_ERR_INVALID, "input dimension must be in [1, 2^24], got %d", c->in_dim);
    if (c->in_channels || c->in_height || c->in_width) {
        if (c->in_channels < 1 || c->in_height < 1 || c->in_width < 1 ||
            (int64_t)c->in_channels * c->in_height * c->in_width != c->in_dim)
            return st_fail(ST_ERR_INVALID, "an image input of %d x %d x %d does not make %d "
                           "features", c->in_channels, c->in_height, c->in_width, c->in_dim);
    }
    if (c->n_classes < 2 || c->n_classes > 256)
        return st_fail(ST_ERR_INVALID, "number of classes must be in [2, 256], got %d", c->n_classes);
    if (c->context < 0 || c->context > ST_MAX_CONTEXT)
        return st_fail(ST_ERR_INVALID, "context must be in [1, %d] tokens, got %d",
                       ST_MAX_CONTEXT, c->context);
    if (c->context && c->in_dim != c->context)
        return st_fail(ST_ERR_INVALID, "a sequence model of context %d reads %d byte ids per "
                       "sample, not %d features", c->context, c->context, c->in_dim);
    if (attends(c) && (c->heads < 1 || c->width % c->heads != 0))
        return st_fail(ST_ERR_INVALID, "heads must be >= 1 and divide the width %d, got %d",
                       c->width, c->heads);
    return ST_OK;
}

st_status st_model_config_check(const st_model_config *c)
{
    const st_model_builder *b = st_model_builder_of(c->kind);
    if (!b) {
        char names[256];
        st_model_kind_list(names, sizeof names, ", ", -1);
        return st_fail(ST_ERR_INVALID, "model: unknown kind %d (allowed: %s)", (int)c->kind,
                       names);
    }
    ST_TRY(check_fields(c));
    /* a sequence model is one that takes a context, and it needs one */
    if (!(b->options & ST_MODEL_OPT_CONTEXT) && c->context > 0) {
        char names[128];
        st_model_kinds_taking(ST_MODEL_OPT_CONTEXT, names, sizeof names);
        return st_fail(ST_ERR_INVALID, "a context of %d tokens is for the %s model", c->context,
                       names);
    }
    if ((b->options & ST_MODEL_OPT_CONTEXT) && c->context < 1)
        return st_fail(ST_ERR_INVALID, "the %s model needs a context (tokens per sample), got %d",
                       b->name, c->context);
    if (b->check)
        ST_TRY(b->check(c));
    return check_subnet(c, st_model_declare_kind);
}

/* The subnetwork against the units the full model's layers declare. */
static st_status check_subnet(const st_model_config *c, st_model_declare_fn declare)
{
    const st_model_subnet *u = &c->subnet;
    if (!(u->scale >= 0.0f && u->scale <= 1000.0f))
        return st_fail(ST_ERR_INVALID, "branch scale must be in [0, 1000] (0: none), got %g",
                       u->scale);
    const int by_group = u->groups || u->group_grads || u->n_groups;
    const int by_width = u->width_count || u->width_kept;
    if (!by_group && !by_width)
        return ST_OK;
    if (by_group && by_width)
        return st_fail(ST_ERR_INVALID, "a model is a group or a width subnetwork, not both");
    st_model m;
    st_status s = layout_with(&m, c, declare);
    const int G = m.n_groups, U = m.n_width;
    if (s == ST_OK && by_group && G == 0)
        s = st_fail(ST_ERR_INVALID, "block subnetworks are made of layer groups (residual "
                    "blocks); %s has none", st_model_kind_name(c->kind));
    if (s == ST_OK && u->groups && (u->n_groups < 1 || u->n_groups > G))
        s = st_fail(ST_ERR_INVALID, "a subnetwork of %d blocks in a model of %d", u->n_groups, G);
    for (int l = 0; s == ST_OK && u->groups && l < u->n_groups; l++)
        if (u->groups[l] < 0 || u->groups[l] >= G || (l > 0 && u->groups[l] <= u->groups[l - 1]))
            s = st_fail(ST_ERR_INVALID, "subnetwork block ids must increase within [0, %d); "
                        "id %d is %d", G, l, u->groups[l]);
    if (s == ST_OK && by_group && !u->groups && u->n_groups)
        s = st_fail(ST_ERR_INVALID, "a subnetwork of %d blocks needs their ids", u->n_groups);
    if (s == ST_OK && by_width && (!u->width_count || !u->width_kept || u->unit_size < 1 || U == 0))
        s = st_fail(ST_ERR_INVALID, "neuron subnetworks need a group size >= 1, a model with "
                    "width layers and the kept groups of every layer");
    if (s == ST_OK && by_width && attends(c) && c->heads > 0 &&
        u->unit_size % (c->width / c->heads) != 0)
        s = st_fail(ST_ERR_INVALID, "neuron units of %s are whole attention heads: the neuron "
                    "group %d is not a multiple of the head size %d (width %d / %d heads)",
                    st_model_kind_name(c->kind), u->unit_size, c->width / c->heads, c->width,
                    c->heads);
    const int *g = u->width_kept;
    for (int l = 0; s == ST_OK && by_width && l < U; l++) {
        const int groups = (int)((m.keep[l].full + u->unit_size - 1) / u->unit_size);
        if (u->width_count[l] < 1 || u->width_count[l] > groups) {
            s = st_fail(ST_ERR_INVALID, "neuron layer %d keeps %d groups; it has %d and "
                        "needs at least one", l, u->width_count[l], groups);
            break;
        }
        for (int j = 0; j < u->width_count[l]; j++, g++)
            if (*g < 0 || *g >= groups || (j > 0 && *g <= g[-1])) {
                s = st_fail(ST_ERR_INVALID, "kept groups of neuron layer %d must increase "
                            "within [0, %d); group %d is %d", l, groups, j, *g);
                break;
            }
    }
    destroy_layout(&m);
    return s;
}


/* Both from the full model's declaration: its first width layer's groups,
 * its parameter count (0 if it cannot be declared). */
int st_model_neuron_groups(const st_model_config *c, int unit_size)
{
    st_model m;
    int groups = 0;
    if (layout_full(&m, c) == ST_OK && m.n_width > 0) {
        int64_t g = unit_size > 0 ? unit_size : 1;
        groups = (int)((m.keep[0].full + g - 1) / g);
    }
    destroy_layout(&m);
    return groups;
}

/* A layer with parameters from one width layer to another. */
static int chains(const st_layer *l)
{
    return l->kind->layout && l->in_unit >= 0 && l->out_unit >= 0 && l->in_unit != l->out_unit;
}

/* Layer groups per section, in order (sizes: at most cap; NULL: count
 * only): a group is in its layers' section, and a group's layers, like a
 * section's groups, are declared one after another. */
static int sections_of(const st_model *m, int *sizes, int cap)
{
    int n = 0, last_group = -1, last_section = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const st_layer *l = &m->layers[i];
        if (l->group < 0 || l->group == last_group)
            continue;
        last_group = l->group;
        if (n == 0 || l->section != last_section) {
            last_section = l->section;
            if (sizes && n < cap)
                sizes[n] = 0;
            n++;
        }
        if (sizes && n <= cap)
            sizes[n - 1]++;
    }
    return n;
}

st_status st_model_config_units(const st_model_config *c, st_model_units *out)
{
    memset(out, 0, sizeof *out);
    st_model m;
    st_status s = layout_full(&m, c);
    if (s == ST_OK) {
        out->groups = m.n_groups;
        out->width_layers = m.n_width;
        out->width = m.n_width > 0 ? (int)m.keep[0].full : 0;
        for (int i = 0; i < m.n_layers; i++)
            out->chained |= chains(&m.layers[i]);
        out->state = (int)m.n_state_full;
        out->sections = sections_of(&m, NULL, 0);
    }
    destroy_layout(&m);
    return s;
}

int st_model_config_width_groups(const st_model_config *c, int unit_size, int *groups, int cap)
{
    st_model m;
    int n = 0;
    const int64_t g = unit_size > 0 ? unit_size : 1;
    if (layout_full(&m, c) == ST_OK)
        for (; n < m.n_width; n++)
            if (n < cap)
                groups[n] = (int)((m.keep[n].full + g - 1) / g);
    destroy_layout(&m);
    return n;
}

int st_model_config_sections(const st_model_config *c, int *sizes, int cap)
{
    st_model m;
    const int n = layout_full(&m, c) == ST_OK ? sections_of(&m, sizes, cap) : 0;
    destroy_layout(&m);
    return n;
}

int st_model_config_chained_ranges(const st_model_config *c, st_range *out, int cap)
{
    st_model m;
    int n = 0;
    if (layout_full(&m, c) == ST_OK)
        for (int i = 0; i < m.n_layers && n < cap; i++) {
            const st_layer *l = &m.layers[i];
            if (chains(l) && !l->dropped) {
                const st_param_segment *w = &m.segs[l->seg[0]];
                out[n++] = (st_range){ w->offset, w->offset + w->count };
            }
        }
    destroy_layout(&m);
    return n;
}

size_t st_model_config_param_count(const st_model_config *c)
{
    st_model m;
    size_t n = layout_full(&m, c) == ST_OK ? m.n_params : 0;
    destroy_layout(&m);
    return n;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Norm parameters are recognised by name: gamma = 1, beta = 0. */
static int is_norm(const st_param_segment *s, float *value)
{
    if (ends_with(s->name, ".gamma") || ends_with(s->name, ".beta")) {
        *value = ends_with(s->name, ".gamma") ? 1.0f : 0.0f;
        return 1;
    }
    return 0;
}

/* Every element's value is a function of the seed and its place in the
 * full model only — the stream of its full tensor, drawn at the element's
 * logical (out, in) position — so a subnetwork starts with exactly the
 * values its part has in the full model, whatever it keeps and however a
 * tensor is stored.  This is compact element (a, b) of a linear segment
 * mapped by mp, r its stream (st_rng_split(init root, mp->stream)). */
static float init_value(const st_seg_map *mp, st_rng *r, int64_t a, int64_t b)
{
    const float bound = 1.0f / sqrtf((float)mp->fan_in);
    const uint64_t full_in = (uint64_t)(mp->in_major ? mp->full_rows : mp->full_cols);
    uint64_t row = (uint64_t)(mp->rows ? mp->rows[a] : a);
    uint64_t col = (uint64_t)(mp->cols ? mp->cols[b] : b);
    r->counter = mp->in_major ? col * full_in + row : row * full_in + col;
    return (2.0f * st_rng_uniform(r) - 1.0f) * bound;
}

static void init_segment(const st_model *m, int i, const st_rng *init_root)
{
    const st_param_segment *s = &m->segs[i];
    const st_seg_map *mp = &m->maps[i];
    float *p = m->params + s->offset, v;
    if (is_norm(s, &v)) {
        for (size_t j = 0; j < s->count; j++)
            p[j] = v;
        return;
    }
    st_rng r = st_rng_split(init_root, mp->stream);
    for (int64_t a = 0; a < mp->n_rows; a++)
        for (int64_t b = 0; b < mp->n_cols; b++)
            *p++ = init_value(mp, &r, a, b);
}

void st_model_init_params(st_model *m, uint64_t seed)
{
    st_rng root = st_rng_seed(seed);
    st_rng init_root = st_rng_split(&root, ST_RNG_STREAM_INIT);
    for (int i = 0; i < m->n_segs; i++)
        init_segment(m, i, &init_root);
}

/* The full model's declaration and layout without its memory: for
 * initial values, segments and counts of a model not built. */
static st_status layout_with(st_model *m, const st_model_config *cfg, st_model_declare_fn declare)
{
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    memset(&m->cfg.subnet, 0, sizeof m->cfg.subnet);
    if (!declare)
        return st_fail(ST_ERR_INVALID, "model: unknown kind %d", (int)cfg->kind);
    ST_TRY(st_graph_declare(m, declare));
    return st_graph_layout(m);
}

static st_status layout_full(st_model *m, const st_model_config *cfg)
{
    const st_model_builder *b = st_model_builder_of(cfg->kind);
    return layout_with(m, cfg, b ? st_model_declare_kind : NULL);
}

st_status st_model_init_full_range(const st_model_config *cfg, uint64_t seed, size_t begin,
                                   size_t end, float *out)
{
    ST_TRY(st_model_config_check(cfg));
    st_model m;
    st_status s = layout_full(&m, cfg);
    st_rng root = st_rng_seed(seed);
    st_rng init_root = st_rng_split(&root, ST_RNG_STREAM_INIT); /* as st_model_init_params */
    for (int i = 0; s == ST_OK && i < m.n_segs; i++) {
        const st_param_segment *g = &m.segs[i];
        const st_seg_map *mp = &m.maps[i];
        size_t lo = g->offset > begin ? g->offset : begin;
        size_t hi = g->offset + g->count < end ? g->offset + g->count : end;
        if (lo >= hi)
            continue;
        float v;
        int norm = is_norm(g, &v);
        st_rng r = st_rng_split(&init_root, mp->stream);
        for (size_t j = lo; j < hi; j++) {
            size_t k = j - g->offset;
            out[j - begin] = norm ? v : init_value(mp, &r, (int64_t)(k / (size_t)mp->n_cols),
                                                   (int64_t)(k % (size_t)mp->n_cols));
        }
    }
    destroy_layout(&m);
    return s;
}

st_status st_model_config_segments(const st_model_config *cfg, st_param_segment **out,
                                   int *count)
{
    *out = NULL;
    *count = 0;
    ST_TRY(st_model_config_check(cfg));
    st_model m;
    st_status s = layout_full(&m, cfg);
    if (s == ST_OK) {
        *out = malloc((size_t)m.n_segs * sizeof **out);
        if (*out) {
            memcpy(*out, m.segs, (size_t)m.n_segs * sizeof **out);
            *count = m.n_segs;
        } else {
            s = st_fail(ST_ERR_NOMEM, "out of memory listing a model's segments");
        }
    }
    destroy_layout(&m);
    return s;
}

st_status st_model_config_state_segments(const st_model_config *cfg, st_param_segment **out,
                                         int *count)
{
    *out = NULL;
    *count = 0;
    ST_TRY(st_model_config_check(cfg));
    st_model m;
    st_status s = layout_full(&m, cfg);
    if (s == ST_OK && m.n_state_segs) {
        *out = calloc((size_t)m.n_state_segs, sizeof **out);
        if (!*out)
            s = st_fail(ST_ERR_NOMEM, "out of memory listing a model's state");
        for (int i = 0; *out && i < m.n_state_segs; i++) {
            st_param_segment *g = &(*out)[i];
            memcpy(g->name, m.state_segs[i].name, sizeof g->name);
            g->offset = m.state_full[i];
            g->count = (size_t)m.state_sel[i].full;
            g->rows = m.state_sel[i].full;
            g->cols = 1;
            g->grad_offset = ST_NO_GRAD;
        }
        *count = *out ? m.n_state_segs : 0;
    }
    destroy_layout(&m);
    return s;
}

static void destroy_layout(st_model *m)
{
    st_recompute_free(m);
    st_graph_free(m);
}

/* ------------------------------------------------------------ instances */

/* A whole model (hi < 0), or only its layers lo .. hi with no loss and no
 * workspace yet (st_model_create_range). */
/* st_param_copy and st_param_blocked alike: both begin with their offset */
static int by_offset(const void *a, const void *b)
{
    const size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return (x > y) - (x < y);
}

/* A blocked copy into the model's list: beside the other copy of the same
 * weights, or as a new entry. */
static st_status list_blocked(st_model *m, const struct st_weight_copy *c)
{
    const size_t at = (size_t)(c->src - m->params);
    st_param_blocked *b = NULL;
    for (int i = 0; i < m->n_blocked && !b; i++)
        if (m->blocked[i].offset == at)
            b = &m->blocked[i];
    if (!b) {
        b = &m->blocked[m->n_blocked++];
        *b = (st_param_blocked){ .offset = at, .rows = c->rows, .cols = c->cols };
    }
    if (b->rows != c->rows || b->cols != c->cols || b->n == ST_BLOCKED_COPIES)
        return st_fail(ST_ERR_INVALID, "blocked weight copies at parameter %zu disagree", at);
    b->copy[b->n++] = c->blk;
    return ST_OK;
}

/* The context's weight copies that lie in params, as st_param_copy and
 * st_param_blocked. */
static st_status list_copies(st_model *m)
{
    if (m->cfg.unfuse & ST_UNFUSE_WEIGHT_COPY || m->ctx.n_copies == 0)
        return ST_OK;
    m->copies = calloc((size_t)m->ctx.n_copies, sizeof *m->copies);
    m->blocked = calloc((size_t)m->ctx.n_copies, sizeof *m->blocked);
    if (!m->copies || !m->blocked)
        return st_fail(ST_ERR_NOMEM, "out of memory listing the weight copies");
    for (int i = 0; i < m->ctx.n_copies; i++) {
        struct st_weight_copy *c = &m->ctx.copies[i];
        if (c->src < m->params || c->src + c->n > m->params + m->n_params)
            continue;   /* not a parameter (none today): its layer converts */
        c->listed = 1;
        if (c->blk.row_at) {
            ST_TRY(list_blocked(m, c));
            continue;
        }
        c->shared |= m->storage.copies_master;   /* the weights: never converted */
        m->copies[m->n_copies++] = (st_param_copy){ (size_t)(c->src - m->params), c->n,
                                                    c->dst };
    }
    qsort(m->copies, (size_t)m->n_copies, sizeof *m->copies, by_offset);
    for (int i = 1; i < m->n_copies; i++)
        if (m->copies[i].offset < m->copies[i - 1].offset + m->copies[i - 1].count)
            return st_fail(ST_ERR_INVALID, "two weight copies overlap at parameter %zu",
                           m->copies[i].offset);
    qsort(m->blocked, (size_t)m->n_blocked, sizeof *m->blocked, by_offset);
    for (int i = 1; i < m->n_blocked; i++)
        if (m->blocked[i].offset < st_blocked_end(&m->blocked[i - 1]))
            return st_fail(ST_ERR_INVALID, "two blocked weight copies overlap at parameter %zu",
                           m->blocked[i].offset);
    return ST_OK;
}

/* regions: the recomputation lanes' regions to allocate (NULL: the lanes
 * count, as st_model_activation_layout builds). */
static st_status create_with(const st_model_config *cfg, st_model_declare_fn declare, int lo,
                             int hi, int batch, st_arena *arena, const st_model_storage *storage,
                             const st_activation_layout *regions, st_model **out)
{
    *out = NULL;
    if (!declare) {
        ST_TRY(st_model_config_check(cfg));
        declare = st_model_declare_kind;
    } else {
        ST_TRY(check_fields(cfg));
        ST_TRY(check_subnet(cfg, declare));
    }
    if (batch < 1 || batch > (1 << 20))
        return st_fail(ST_ERR_INVALID, "batch must be in [1, 2^20], got %d", batch);
    st_model *m = calloc(1, sizeof *m);
    if (!m)
        return st_fail(ST_ERR_NOMEM, "out of memory creating a model");
    m->cfg = *cfg;
    m->declare = declare;
    /* the model's own copies of the config's lists, so that the config it
     * returns stays valid: the held groups here, the groups' gradient
     * flags and the width lists once their sizes are known (graph_declare.c) */
    const st_model_subnet *u = &cfg->subnet;
    if (u->groups) {
        m->group_ids = malloc((size_t)u->n_groups * sizeof *m->group_ids);
        if (!m->group_ids) {
            st_model_destroy(m);
            return st_fail(ST_ERR_NOMEM, "out of memory creating a model");
        }
        memcpy(m->group_ids, u->groups, (size_t)u->n_groups * sizeof *m->group_ids);
        m->cfg.subnet.groups = m->group_ids;
    }
    m->batch = batch;
    m->rows = (int64_t)batch * (cfg->context ? cfg->context : 1);
    m->arena = arena;
    m->range = hi >= 0;
    if (regions) {
        m->regions_known = 1;
        memcpy(m->region_size, regions->region, sizeof m->region_size);
    }
    st_status s;
    ST_TRY_GOTO(s, st_graph_declare(m, declare), fail);
    if (storage) {
        if (!storage->params) {
            s = st_fail(ST_ERR_INVALID, "st_model_create_on: storage without parameters");
            goto fail;
        }
        m->storage = *storage;   /* checked against the layout by st_graph_build */
    }
    if (hi >= 0) {
        if (m->n_groups > 0 || lo < 0 || hi < lo || hi >= m->n_layers) {
            s = st_fail(ST_ERR_INVALID, "layers %d .. %d of a model of %d layers%s", lo, hi,
                        m->n_layers, m->n_groups ? " with layer groups" : "");
            goto fail;
        }
        for (int i = 0; i < m->n_layers; i++)   /* outside: laid out as dropped */
            m->layers[i].dropped = i < lo || i > hi;
    }
    ST_TRY_GOTO(s, st_nn_ctx_init(&m->ctx, arena), fail);
    /* R rows: a sample's, or a sequence model's tokens' */
    const size_t B = (size_t)batch, R = (size_t)m->rows, K = (size_t)cfg->n_classes;
    if (hi < 0) {
        ST_TRY_GOTO(s, st_graph_alloc(m, B * (size_t)cfg->in_dim, &m->tensors[ST_T_INPUT].data),
                    fail);
        ST_TRY_GOTO(s, st_arena_alloc(arena, ST_MEM_ACTIVATIONS, R * sizeof(int32_t),
                                      (void **)&m->labels), fail);
        ST_TRY_GOTO(s, st_graph_alloc(m, R * K, &m->tensors[ST_T_LOGITS].data), fail);
        ST_TRY_GOTO(s, st_graph_alloc(m, R * K, &m->logp), fail);
        ST_TRY_GOTO(s, st_graph_alloc(m, R * K, &m->tensors[ST_T_DLOGITS].data), fail);
    }
    ST_TRY_GOTO(s, st_graph_layout(m), fail);
    ST_TRY_GOTO(s, st_graph_build(m), fail);
    ST_TRY_GOTO(s, list_copies(m), fail);
    if (hi < 0) {
        ST_TRY_GOTO(s, st_xent_build(&m->ctx, &m->xent, (int64_t)R, (int64_t)K,
                                     m->tensors[ST_T_LOGITS].data, m->logp,
                                     m->tensors[ST_T_DLOGITS].data), fail);
        ST_TRY_GOTO(s, st_nn_ctx_finalize(&m->ctx), fail);
    }
    *out = m;
    return ST_OK;
fail:
    st_model_destroy(m);
    return s;
}

/* Builds the model in a scratch arena with the lanes counting: what it
 * took of each kind, less the lanes' bytes, plus the largest lane of
 * each region. */
static st_status measure(const st_model_config *cfg, st_model_declare_fn declare, int lo, int hi,
                         int batch, const st_arena *arena, st_activation_layout *out)
{
    memset(out, 0, sizeof *out);
    /* address space only: the layout is counted, never written (a sizing
     * run's: in its space) */
    st_arena scratch;
    const st_chunk_backend untouched =
        st_sizing_backend_in(arena ? st_arena_sizing_space(arena) : NULL);
    st_arena_init(&scratch, "activation layout", &untouched, 0);
    st_model *m = NULL;
    st_status s = create_with(cfg, declare, lo, hi, batch, &scratch, NULL, NULL, &m);
    if (s == ST_OK) {
        const st_mem_stats st = st_arena_stats(&scratch);
        for (int k = 0; k < ST_MEM_KIND_COUNT; k++)
            out->bytes[k] = st.current[k];
        for (int lane = 0; m->n_blocks && lane < m->lanes.n; lane++)
            for (int k = 0; k < ST_MEM_KIND_COUNT; k++) {
                const size_t used = m->lane_used[(size_t)lane * ST_MEM_KIND_COUNT + (size_t)k];
                size_t *region = &out->region[m->lane_region[lane]][k];
                out->bytes[k] -= used;
                if (used > *region)
                    *region = used;
            }
        for (int r = 0; r < ST_ARENA_REGIONS; r++)
            for (int k = 0; k < ST_MEM_KIND_COUNT; k++)
                out->bytes[k] += out->region[r][k];
        out->blocks = m->n_blocks;
    }
    st_model_destroy(m);
    st_arena_release(&scratch);
    return s;
}

/* A sizing run's measurements (its space's memo): the layout of a model
 * without subnetwork arrays is a function of its config, kind, layers and
 * batch, which every worker of a dp or local SGD run shares. */
typedef struct measured {
    st_model_config cfg;
    st_model_declare_fn declare;
    int lo, hi, batch;
} measured;

typedef struct measure_memo {
    pthread_mutex_t lock;
    measured *key;
    st_activation_layout *layout;
    int n, cap;
} measure_memo;

static void *measure_memo_make(void)
{
    measure_memo *m = calloc(1, sizeof *m);
    if (m)
        pthread_mutex_init(&m->lock, NULL);
    return m;
}

static void measure_memo_drop(void *p)
{
    measure_memo *m = p;
    free(m->key);
    free(m->layout);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

/* measure, once per key over a sizing arena's space: the first worker
 * measures, the others wait for its answer. */
static st_status measure_once(const st_model_config *cfg, st_model_declare_fn declare, int lo,
                              int hi, int batch, const st_arena *arena, st_activation_layout *out)
{
    const st_model_subnet *sn = &cfg->subnet;
    st_sizing_space *sp = arena ? st_arena_sizing_space(arena) : NULL;
    measure_memo *m = sp && !sn->groups && !sn->group_grads && !sn->width_count &&
                      !sn->width_kept
                    ? st_sizing_space_memo(sp, measure_memo_make, measure_memo_drop) : NULL;
    if (!m)
        return measure(cfg, declare, lo, hi, batch, arena, out);
    measured k;   /* over zeros: its bytes are compared */
    memset(&k, 0, sizeof k);
    k.cfg = *cfg;
    k.declare = declare;
    k.lo = lo;
    k.hi = hi;
    k.batch = batch;
    pthread_mutex_lock(&m->lock);
    for (int i = 0; i < m->n; i++)
        if (memcmp(&m->key[i], &k, sizeof k) == 0) {
            *out = m->layout[i];
            pthread_mutex_unlock(&m->lock);
            return ST_OK;
        }
    st_status s = measure(cfg, declare, lo, hi, batch, arena, out);
    if (s == ST_OK && m->n == m->cap) {
        const int cap = m->cap ? 2 * m->cap : 8;
        measured *nk = realloc(m->key, (size_t)cap * sizeof *nk);
        if (nk)
            m->key = nk;
        st_activation_layout *nl = nk ? realloc(m->layout, (size_t)cap * sizeof *nl) : NULL;
        if (nl) {
            m->layout = nl;
            m->cap = cap;
        }
    }
    if (s == ST_OK && m->n < m->cap) {
        m->key[m->n] = k;
        m->layout[m->n++] = *out;
    }
    pthread_mutex_unlock(&m->lock);
    return s;
}

static st_status build(const st_model_config *cfg, st_model_declare_fn declare, int lo, int hi,
                       int batch, st_arena *arena, const st_model_storage *storage,
                       st_model **out)
{
    *out = NULL;
    if (cfg->recompute == ST_RECOMPUTE_NONE || !arena)
        return create_with(cfg, declare, lo, hi, batch, arena, storage, NULL, out);
    st_activation_layout regions;
    ST_TRY(measure_once(cfg, declare, lo, hi, batch, arena, &regions));
    return create_with(cfg, declare, lo, hi, batch, arena, storage, &regions, out);
}

static st_status create(const st_model_config *cfg, st_model_declare_fn declare, int lo, int hi,
                        int batch, st_arena *arena, const st_model_storage *storage,
                        st_model **out)
{
    return st_model_memo_build(build, cfg, declare, lo, hi, batch, arena, storage, out);
}

st_status st_model_activation_layout(const st_model_config *cfg, int batch,
                                     st_activation_layout *out)
{
    return measure(cfg, NULL, 0, -1, batch, NULL, out);
}

st_status st_model_create(const st_model_config *cfg, int batch, st_arena *arena, st_model **out)
{
    return create(cfg, NULL, 0, -1, batch, arena, NULL, out);
}

st_status st_model_create_on(const st_model_config *cfg, int batch, st_arena *arena,
                             const st_model_storage *storage, st_model **out)
{
    *out = NULL;
    if (!storage)
        return st_fail(ST_ERR_INVALID, "st_model_create_on: no storage");
    return create(cfg, NULL, 0, -1, batch, arena, storage, out);
}

st_status st_model_create_range(const st_model_config *cfg, int lo, int hi, int batch,
                                st_arena *arena, st_model **out)
{
    return create(cfg, NULL, lo, hi, batch, arena, NULL, out);
}

st_status st_model_create_declared(const st_model_config *cfg, st_model_declare_fn declare,
                                   int batch, st_arena *arena, st_model **out)
{
    if (!declare)
        return st_fail(ST_ERR_INVALID, "a declared model needs its declaration");
    return create(cfg, declare, 0, -1, batch, arena, NULL, out);
}

int st_model_layer_index(const st_model_config *cfg, const st_layer_kind *kind, int n)
{
    st_model m;
    int found = -1;
    if (layout_full(&m, cfg) == ST_OK)
        for (int i = 0, k = 0; i < m.n_layers && found < 0; i++)
            if (m.layers[i].kind == kind && k++ == n)
                found = i;
    destroy_layout(&m);
    return found;
}

void st_model_destroy(st_model *m)
{
    if (!m)
        return;
    if (m->proto) {
        st_model_memo_free_shell(m);
        return;
    }
    free(m->copies);
    free(m->blocked);
    if (m->arena)
        st_nn_ctx_destroy(&m->ctx);
    destroy_layout(m);
    free(m);
}

const st_model_config *st_model_get_config(const st_model *m) { return &m->cfg; }
int st_model_batch(const st_model *m) { return m->batch; }
int st_model_tokens(const st_model *m) { return (int)(m->rows / m->batch); }
float *st_model_input(st_model *m) { return m->tensors[ST_T_INPUT].data; }
int32_t *st_model_labels(st_model *m) { return m->labels; }
const float *st_model_logits(const st_model *m) { return m->tensors[ST_T_LOGITS].data; }
float *st_model_params(st_model *m) { return m->params; }

float *st_model_state(st_model *m, size_t *count)
{
    *count = m->n_state;
    return m->state;
}
float *st_model_grads(st_model *m) { return m->grads; }

/* The state in the full layout: piece i's kept element j is full element
 * state_full[i] + (ids ? ids[j] : j). */
static size_t state_full_index(const st_model *m, int i, int64_t j)
{
    const st_neuron_sel *e = &m->state_sel[i];
    return m->state_full[i] + (size_t)(e->ids ? e->ids[j] : j);
}

st_status st_model_config_state_init(const st_model_config *c, float *out)
{
    st_model m;
    st_status s = layout_full(&m, c);
    for (int i = 0; s == ST_OK && i < m.n_state_segs; i++)
        for (int64_t j = 0; j < m.state_sel[i].n; j++)
            out[state_full_index(&m, i, j)] = m.state_init[i];
    destroy_layout(&m);
    return s;
}

void st_model_state_accumulate(const st_model *m, double *sum, uint32_t *count)
{
    for (int i = 0; i < m->n_state_segs; i++) {
        const float *v = m->state + m->state_segs[i].offset;
        for (int64_t j = 0; j < m->state_sel[i].n; j++) {
            const size_t f = state_full_index(m, i, j);
            sum[f] += (double)v[j];
            count[f]++;
        }
    }
}

void st_model_state_load(st_model *m, const float *full)
{
    for (int i = 0; i < m->n_state_segs; i++) {
        float *v = m->state + m->state_segs[i].offset;
        for (int64_t j = 0; j < m->state_sel[i].n; j++)
            v[j] = full[state_full_index(m, i, j)];
    }
}
size_t st_model_param_count(const st_model *m) { return m->n_params; }
size_t st_model_grad_count(const st_model *m) { return m->n_grads; }

const st_param_segment *st_model_segments(const st_model *m, int *count)
{
    *count = m->n_segs;
    return m->segs;
}


const st_param_copy *st_model_copies(const st_model *m, int *count)
{
    *count = m->n_copies;
    return m->copies;
}

void st_model_copies_written(st_model *m)
{
    m->ctx.copies_current = m->n_copies > 0;
    m->ctx.blocked_current = 0;   /* the parameters changed, these copies did not */
}

const st_param_blocked *st_model_blocked_copies(const st_model *m, int *count)
{
    *count = m->n_blocked;
    return m->blocked;
}

void st_model_blocked_written(st_model *m)
{
    m->ctx.blocked_current = m->n_blocked > 0;
}

void st_model_copies_current(st_model *m)
{
    m->ctx.copies_current = m->n_copies > 0;
    m->ctx.blocked_current = m->n_blocked > 0;
}

void st_model_params_changed(st_model *m)
{
    m->ctx.copies_current = 0;
    m->ctx.blocked_current = 0;
    /* shared copies are never converted by a forward (several instances
     * would write them at once): the caller's thread does it now */
    for (int i = 0; i < m->n_copies && m->ctx.copy_store && !m->storage.copies_master; i++)
        st_bf16_round_n(m->copies[i].bf16, m->params + m->copies[i].offset, m->copies[i].count);
    for (int i = 0; i < m->n_blocked && m->ctx.blocked_store; i++) {
        const st_param_blocked *b = &m->blocked[i];
        st_blocked_pack(b, m->params + b->offset, b->offset, st_blocked_end(b));
    }
}

st_status st_model_forward_backward(st_model *m, float *loss)
{
    return st_model_forward_backward_ready(m, loss, NULL, NULL);
}

st_status st_model_train_forward(st_model *m)
{
    st_status s = st_graph_forward(m, ST_PHASE_TRAIN);
    m->ctx.copies_current = 0;   /* used: the next update writes them again */
    m->ctx.blocked_current = 0;
    return s;
}

st_status st_model_forward_backward_ready(st_model *m, float *loss,
                                          void (*ready)(void *ctx, size_t from), void *ctx)
{
    double sum;
    ST_TRY(st_model_train_forward(m));
    ST_TRY(st_xent_forward(&m->ctx, &m->xent, m->labels, m->rows, 1, &sum, NULL));
    *loss = (float)(sum / (double)m->rows);
    return st_graph_backward_ready(m, ready, ctx);
}

st_status st_model_calibrate(st_model *m, int k)
{
    if (k < 0)
        return st_fail(ST_ERR_INVALID, "calibration batch %d: counted from 0", k);
    m->ctx.bn_momentum = 1.0f / (float)(k + 1);
    st_status s = st_graph_forward(m, ST_PHASE_TRAIN);
    m->ctx.bn_momentum = 0.0f;
    return s;
}

st_status st_model_evaluate(st_model *m, int rows, double *loss_sum, int64_t *correct)
{
    if (rows < 1 || rows > m->batch)
        return st_fail(ST_ERR_INVALID, "evaluate: %d rows for a batch of %d", rows, m->batch);
    double sum;
    int64_t hits;
    ST_TRY(st_graph_forward(m, ST_PHASE_INFER));
    ST_TRY(st_xent_forward(&m->ctx, &m->xent, m->labels, rows * (m->rows / m->batch), 0, &sum,
                           &hits));
    *loss_sum += sum;
    *correct += hits;
    return ST_OK;
}

st_status st_model_load_full_params(st_model *m, const float *full)
{
    const int n = st_model_full_ranges(m, NULL, NULL, 0);
    st_range *r = malloc((size_t)(n > 0 ? n : 1) * sizeof *r);
    size_t *local = malloc((size_t)(n > 0 ? n : 1) * sizeof *local);
    if (!r || !local) {
        free(r);
        free(local);
        return st_fail(ST_ERR_NOMEM, "out of memory loading a model's parameters");
    }
    st_model_full_ranges(m, r, local, n);
    for (int k = 0; k < n; k++)
        memcpy(m->params + local[k], full + r[k].begin, (r[k].end - r[k].begin) * sizeof *full);
    free(r);
    free(local);
    return ST_OK;
}

size_t st_model_full_param_count(const st_model *m)
{
    st_model full;
    size_t n = layout_with(&full, &m->cfg, m->declare) == ST_OK ? full.n_params : 0;
    destroy_layout(&full);
    return n;
}

/* One segment's elements (grads: its gradient's rows and columns) as
 * full-layout ranges: per stored row, each run of consecutive full columns. */
static int segment_ranges(const st_model *m, int i, int grads, st_range *ranges, size_t *local,
                          int n, int cap, size_t *last_end, size_t *last_pos)
{
    const st_param_segment *s = &m->segs[i];
    const st_seg_map *mp = &m->maps[i];
    size_t pos = grads ? s->grad_offset : s->offset;
    const int32_t *rows = grads && mp->grad_rows ? mp->grad_rows : mp->rows;
    int64_t n_rows = grads && mp->grad_rows ? mp->n_grad_rows : mp->n_rows;
    const int32_t *cols = grads && mp->grad_cols ? mp->grad_cols : mp->cols;
    int64_t n_cols = grads && mp->grad_cols ? mp->n_grad_cols : mp->n_cols;
    if (!rows && !cols && n_cols == mp->full_cols) {   /* whole rows in order: one run */
        n_cols *= n_rows;
        n_rows = n_rows > 0;
    }
    for (int64_t a = 0; a < n_rows && n >= 0; a++) {
        size_t row = mp->full_offset + (size_t)(rows ? rows[a] : a) * (size_t)mp->full_cols;
        for (int64_t b = 0; b < n_cols && n >= 0;) {
            /* without a column map the rest of the row is one run */
            int64_t c0 = cols ? cols[b] : b, len = cols ? 1 : n_cols - b;
            while (cols && b + len < n_cols && cols[b + len] == c0 + len)
                len++;
            size_t full = row + (size_t)c0;
            if (n > 0 && *last_end == full && *last_pos == pos) { /* continues the last */
                if (ranges)
                    ranges[n - 1].end += (size_t)len;
            } else {
                if (ranges && n == cap)
                    return -1;
                if (ranges) {
                    ranges[n] = (st_range){ full, full + (size_t)len };
                    local[n] = pos;
                }
                n++;
            }
            *last_end = full + (size_t)len;
            pos += (size_t)len;
            *last_pos = pos;
            b += len;
        }
    }
    return n;
}

/* The segments of one vector (parameters, or gradients: grads) as sorted
 * full-layout ranges, consecutive pieces merged. */
static int full_ranges(const st_model *m, int grads, st_range *ranges, size_t *local, int cap)
{
    int n = 0;
    size_t last_end = 0, last_pos = 0;
    for (int i = 0; i < m->n_segs && n >= 0; i++)
        if (!grads || m->segs[i].grad_offset != ST_NO_GRAD)
            n = segment_ranges(m, i, grads, ranges, local, n, cap, &last_end, &last_pos);
    return n;
}

int st_model_full_ranges(const st_model *m, st_range *ranges, size_t *local, int cap)
{
    return full_ranges(m, 0, ranges, local, cap);
}

int st_model_full_grad_ranges(const st_model *m, st_range *ranges, size_t *local, int cap)
{
    return full_ranges(m, 1, ranges, local, cap);
}

double st_model_step_flops(const st_model *m)
{
    return st_graph_flops(m) + st_recompute_flops(m);
}

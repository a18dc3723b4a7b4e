/*
 * nn/graph.c — the generic half of every model: units, layout, memory,
 * primitives, and the forward and backward loops over the layer table.
 * What a model looks like is its builder's business (src/nn/models/); what
 * a layer computes is its kind's (src/nn/layers/).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/graph.h"

static int64_t tensor_width(const st_model *m, const st_tensor *t);

/* ------------------------------------------------------------ declaring */

static int grow(void **p, int *cap, int n, size_t size)
{
    if (n < *cap)
        return 1;
    int c = *cap ? 2 * *cap : 32;
    void *q = realloc(*p, (size_t)c * size);
    if (!q)
        return 0;
    *p = q;
    *cap = c;
    return 1;
}

int st_graph_image(st_model *m, int64_t channels, int64_t h, int64_t w, int width)
{
    if (!grow((void **)&m->tensors, &m->cap_tensors, m->n_tensors, sizeof *m->tensors))
        return ST_T_NONE;
    m->tensors[m->n_tensors] = (st_tensor){
        .cols = channels * h * w, .channels = channels, .h = h, .w = w,
        .width_unit = width, .group = m->open_group, .alias = ST_T_NONE, .copies = 1,
    };
    if (width >= m->n_width)
        m->n_width = width + 1;
    return m->n_tensors++;
}

int st_graph_tensor(st_model *m, int64_t cols, int width)
{
    return st_graph_image(m, cols, 1, 1, width);
}

int st_graph_tensor_widest_of(st_model *m, int64_t cols, int copies)
{
    const int t = st_graph_tensor_copies(m, cols, copies, ST_W_WIDEST);
    if (t >= 0)
        m->tensors[t].widest_of = cols;
    return t;
}

int st_graph_tensor_copies(st_model *m, int64_t cols, int copies, int width)
{
    const int t = st_graph_image(m, cols, 1, 1, width);
    if (t >= 0) {
        m->tensors[t].copies = copies;
        m->tensors[t].cols = cols * copies;
    }
    return t;
}

st_layer *st_graph_add(st_model *m, const st_layer_kind *kind, const char *name, int x,
                       int y, int dx, int dy)
{
    if (!grow((void **)&m->layers, &m->cap_layers, m->n_layers, sizeof *m->layers))
        return NULL;
    st_layer *l = &m->layers[m->n_layers++];
    memset(l, 0, sizeof *l);
    l->kind = kind;
    snprintf(l->name, sizeof l->name, "%s", name ? name : kind->name);
    l->group = m->open_group;
    l->section = m->open_section;
    l->x = x;
    l->y = y;
    l->dx = dx;
    l->dy = dy;
    l->residual = ST_T_NONE;
    l->copies = 1;
    l->in_unit = l->out_unit = ST_W_FULL;
    l->seg[0] = l->seg[1] = (size_t)-1;
    /* features, or an image's channels (what a width unit counts) */
    if (x >= 0)
        l->in = m->tensors[x].channels;
    if (y >= 0)
        l->out = m->tensors[y].channels;
    return l;
}

st_layer *st_graph_linear(st_model *m, const char *name, int x, int y, int dx, int dy,
                          int64_t in, int64_t out)
{
    st_layer *l = st_graph_add(m, &st_layer_linear, name, x, y, dx, dy);
    if (l) {
        l->in = in;
        l->out = out;
    }
    return l;
}

void st_graph_group_begin(st_model *m, int g)
{
    m->open_group = g;
    if (g >= m->n_groups)
        m->n_groups = g + 1;
}

void st_graph_section(st_model *m, int s)
{
    m->open_section = s;
}

void st_graph_group_end(st_model *m, int in, int out)
{
    /* the output stands for the input when the group is dropped */
    if (out >= 0)
        m->tensors[out].alias = in;
    m->open_group = -1;
}

/* ------------------------------------------------------------ units */

/* Layer groups held (the config's subnet.groups, increasing; NULL: all)
 * and those with weight gradients (subnet.group_grads, per group). */
static st_status setup_groups(st_model *m)
{
    const int G = m->n_groups;
    m->group_held = calloc((size_t)(G ? G : 1), sizeof *m->group_held);
    m->group_grad = calloc((size_t)(G ? G : 1), 1);
    if (!m->group_held || !m->group_grad)
        return st_fail(ST_ERR_NOMEM, "out of memory creating a model");
    const st_model_subnet *u = &m->cfg.subnet;
    for (int l = 0; l < (u->groups ? u->n_groups : G); l++) {
        int g = u->groups ? u->groups[l] : l;
        if (g < 0 || g >= G)
            return st_fail(ST_ERR_INVALID, "subnetwork group %d: the model has %d", g, G);
        m->group_held[g] = l + 1;
    }
    for (int g = 0; g < G; g++)
        m->group_grad[g] = u->group_grads ? u->group_grads[g] != 0 : 1;
    if (u->group_grads)
        m->cfg.subnet.group_grads = m->group_grad;
    for (int i = 0; i < m->n_layers; i++)
        m->layers[i].dropped = m->layers[i].group >= 0 && !m->group_held[m->layers[i].group];
    return ST_OK;
}

/* Expands the config's kept groups into neuron ids (forward masking: the
 * compact layers; backward masking: the rows with gradients), and the
 * latter into runs of consecutive rows for the linear layers.  A width
 * layer's full width is that of the layer whose outputs it is. */
static st_status setup_neurons(st_model *m)
{
    const st_model_subnet *c = &m->cfg.subnet;
    const int U = m->n_width;
    m->keep = calloc((size_t)(U ? U : 1), sizeof *m->keep);
    m->grad_keep = calloc((size_t)(U ? U : 1), sizeof *m->grad_keep);
    if (!m->keep || !m->grad_keep)
        return st_fail(ST_ERR_NOMEM, "out of memory creating a model");
    for (int i = 0; i < m->n_layers; i++) {
        const st_layer *l = &m->layers[i];
        if (l->out_unit >= 0)
            m->keep[l->out_unit].full = l->out / l->copies;
    }
    m->widest = 0;
    for (int u = 0; u < U; u++) {
        m->keep[u].n = m->keep[u].full;
        m->grad_keep[u] = m->keep[u];
        if (m->keep[u].n > m->widest)
            m->widest = m->keep[u].n;
    }
    if (!c->width_count)
        return ST_OK;
    const int64_t G = c->unit_size;
    size_t groups = 0;
    for (int u = 0; u < U; u++)
        groups += (size_t)c->width_count[u];
    /* the config keeps pointing at the model's own copy */
    m->kept = malloc(((size_t)U + groups) * sizeof *m->kept);
    m->ids = malloc(groups * (size_t)G * sizeof *m->ids);
    if (!m->kept || !m->ids)
        return st_fail(ST_ERR_NOMEM, "out of memory creating a model");
    memcpy(m->kept, c->width_count, (size_t)U * sizeof *m->kept);
    memcpy(m->kept + U, c->width_kept, groups * sizeof *m->kept);
    m->cfg.subnet.width_count = m->kept;
    m->cfg.subnet.width_kept = m->kept + U;
    /* runs of gradient rows: backward masking only (see st_graph_grad_runs) */
    st_row_run *runs = NULL;
    if (c->width_grads_only) {
        m->runs = malloc(groups * sizeof *m->runs);
        m->run_first = calloc((size_t)U, sizeof *m->run_first);
        m->run_count = calloc((size_t)U, sizeof *m->run_count);
        if (!m->runs || !m->run_first || !m->run_count)
            return st_fail(ST_ERR_NOMEM, "out of memory creating a model");
        runs = m->runs;
    }
    int32_t *id = m->ids;
    const int *g = m->cfg.subnet.width_kept;
    int n_runs = 0;
    m->widest = 0;
    for (int u = 0; u < U; u++) {
        const int64_t full = m->keep[u].full;
        st_neuron_sel sel = { full, 0, id };
        if (runs)
            m->run_first[u] = n_runs;
        for (int j = 0; j < c->width_count[u]; j++, g++) {
            int64_t lo = *g * G, hi = lo + G < full ? lo + G : full;
            if (runs && j > 0 && g[-1] + 1 == *g)
                runs[n_runs - 1].count += hi - lo;
            else if (runs)
                runs[n_runs++] = (st_row_run){ lo, hi - lo };
            for (int64_t k = lo; k < hi; k++)
                *id++ = (int32_t)k;
            sel.n += hi - lo;
        }
        if (runs)
            m->run_count[u] = n_runs - m->run_first[u];
        if (c->width_grads_only)
            m->grad_keep[u] = sel;
        else
            m->keep[u] = sel;
        if (m->keep[u].n > m->widest)
            m->widest = m->keep[u].n;
    }
    return ST_OK;
}

st_status st_graph_declare(st_model *m, st_model_declare_fn declare)
{
    const st_model_config *c = &m->cfg;
    m->open_group = -1;
    /* the predeclared tensors (their memory is the model's, see model.c) */
    /* a sequence model's input: a row per token, its byte id */
    const int input = c->in_channels
                    ? st_graph_image(m, c->in_channels, c->in_height, c->in_width, ST_W_FULL)
                    : st_graph_tensor(m, c->context ? 1 : c->in_dim, ST_W_FULL);
    if (input != ST_T_INPUT ||
        st_graph_tensor(m, c->n_classes, ST_W_FULL) != ST_T_LOGITS ||
        st_graph_tensor(m, c->n_classes, ST_W_FULL) != ST_T_DLOGITS)
        return st_fail(ST_ERR_NOMEM, "out of memory declaring a model");
    m->n_width = 0;   /* ST_W_FULL is not a width layer */
    ST_TRY(declare(m));
    for (int i = 0; i < m->n_layers; i++) {
        const st_layer *l = &m->layers[i];
        if (l->out_unit >= m->n_width)
            m->n_width = l->out_unit + 1;
    }
    ST_TRY(setup_groups(m));
    return setup_neurons(m);
}

/* ------------------------------------------------------------ layout */

st_status st_graph_add_segment(st_model *m, const char *name, int decay, st_seg_map map,
                               size_t *index)
{
    map.full_offset = m->full_at;
    map.stream = m->full_seg;
    m->full_at += (size_t)(map.full_rows * map.full_cols);
    m->full_seg++;
    if (m->layout_skip) {   /* a dropped group: its place in the full model only */
        *index = (size_t)-1;
        return ST_OK;
    }
    if (m->n_segs == m->cap_segs) {
        int cap = m->cap_segs ? 2 * m->cap_segs : 16;
        st_param_segment *s = realloc(m->segs, (size_t)cap * sizeof *s);
        if (s)
            m->segs = s;
        st_seg_map *mp = s ? realloc(m->maps, (size_t)cap * sizeof *mp) : NULL;
        if (!s || !mp)
            return st_fail(ST_ERR_NOMEM, "out of memory laying out parameters");
        m->maps = mp;
        m->cap_segs = cap;
    }
    const int64_t grad_rows = map.grad_rows ? map.n_grad_rows : map.n_rows;
    const int64_t grad_cols = map.grad_cols ? map.n_grad_cols : map.n_cols;
    st_param_segment *s = &m->segs[m->n_segs];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->offset = m->n_params;
    s->count = (size_t)(map.n_rows * map.n_cols);
    s->rows = map.n_rows;
    s->cols = map.n_cols;
    s->in_major = map.in_major;
    s->decay = decay;
    s->grad_count = (size_t)(grad_rows * grad_cols);
    s->grad_offset = m->layout_grads ? m->n_grads : ST_NO_GRAD;
    m->maps[m->n_segs] = map;
    *index = (size_t)m->n_segs++;
    m->n_params += s->count;
    if (m->layout_grads)
        m->n_grads += s->grad_count;
    return ST_OK;
}

st_status st_graph_add_state(st_model *m, const char *name, const st_neuron_sel *sel,
                             float init, size_t *offset)
{
    const size_t full_at = m->n_state_full;
    m->n_state_full += (size_t)sel->full;
    *offset = (size_t)-1;
    if (m->layout_skip)
        return ST_OK;
    if (m->n_state_segs == m->cap_state_segs) {
        int cap = m->cap_state_segs ? 2 * m->cap_state_segs : 8;
        st_param_segment *g = realloc(m->state_segs, (size_t)cap * sizeof *g);
        if (g)
            m->state_segs = g;
        float *v = g ? realloc(m->state_init, (size_t)cap * sizeof *v) : NULL;
        if (v)
            m->state_init = v;
        st_neuron_sel *e = v ? realloc(m->state_sel, (size_t)cap * sizeof *e) : NULL;
        if (e)
            m->state_sel = e;
        size_t *f = e ? realloc(m->state_full, (size_t)cap * sizeof *f) : NULL;
        if (!f)
            return st_fail(ST_ERR_NOMEM, "out of memory laying out a model's state");
        m->state_full = f;
        m->cap_state_segs = cap;
    }
    st_param_segment *g = &m->state_segs[m->n_state_segs];
    memset(g, 0, sizeof *g);
    snprintf(g->name, sizeof g->name, "%s", name);
    g->offset = m->n_state;
    g->count = (size_t)sel->n;
    g->grad_offset = ST_NO_GRAD;
    m->state_init[m->n_state_segs] = init;
    m->state_sel[m->n_state_segs] = *sel;
    m->state_full[m->n_state_segs++] = full_at;
    *offset = m->n_state;
    m->n_state += (size_t)sel->n;
    return ST_OK;
}

float *st_graph_state(const st_model *m, size_t offset)
{
    return m->state + offset;
}

/* One walk over the full model's layers: a segment's full offset and RNG
 * stream are where the walk meets it, kept or not. */
st_status st_graph_layout(st_model *m)
{
    for (int i = 0; i < m->n_layers; i++) {
        st_layer *l = &m->layers[i];
        if (!l->kind->layout)
            continue;
        m->layout_skip = l->dropped;
        m->layout_grads = l->group < 0 || m->group_grad[l->group];
        ST_TRY(l->kind->layout(m, l));
    }
    m->layout_skip = 0;
    m->layout_grads = 1;
    return ST_OK;
}

/* ------------------------------------------------------------ access */

static int resolve(const st_model *m, int t)
{
    while (t >= 0 && m->tensors[t].group >= 0 && !m->group_held[m->tensors[t].group] &&
           m->tensors[t].alias >= 0)
        t = m->tensors[t].alias;
    return t;
}

const st_tensor *st_graph_tensor_info(const st_model *m, int tensor)
{
    return tensor < 0 ? NULL : &m->tensors[resolve(m, tensor)];
}

int64_t st_graph_cols(const st_model *m, int tensor)
{
    return tensor_width(m, &m->tensors[resolve(m, tensor)]);
}

dnnl_format_tag_t st_graph_tag(const st_model *m, int tensor, int64_t channels)
{
    const st_tensor *t = st_graph_tensor_info(m, tensor);
    if (!t || resolve(m, tensor) == ST_T_INPUT || t->h * t->w == 1 || m->cfg.plain_tensors)
        return dnnl_nchw;
    return channels % st_blocked_channels() == 0 ? st_blocked_tag() : dnnl_nchw;
}

float *st_graph_data(const st_model *m, int tensor)
{
    return tensor < 0 ? NULL : m->tensors[resolve(m, tensor)].data;
}

int64_t st_graph_width(const st_model *m, int width)
{
    return width == ST_W_WIDEST ? m->widest : m->keep[width].n;
}

const st_neuron_sel *st_graph_sel(const st_model *m, int width, int64_t n, st_neuron_sel *tmp)
{
    if (width >= 0)
        return &m->keep[width];
    *tmp = (st_neuron_sel){ n, n, NULL };
    return tmp;
}

const st_neuron_sel *st_graph_grad_sel(const st_model *m, int width)
{
    return width >= 0 ? &m->grad_keep[width] : NULL;
}

const st_row_run *st_graph_grad_runs(const st_model *m, int u, int *n)
{
    if (u < 0 || !m->runs || !m->grad_keep[u].ids) {
        *n = 0;
        return NULL;
    }
    *n = m->run_count[u];
    return m->runs + m->run_first[u];
}

float *st_graph_seg_params(const st_model *m, size_t seg)
{
    return m->params + m->segs[seg].offset;
}

float *st_graph_seg_grads(const st_model *m, size_t seg)
{
    size_t g = m->segs[seg].grad_offset;
    return g == ST_NO_GRAD ? NULL : m->grads + g;
}

st_status st_graph_alloc(st_model *m, size_t count, float **out)
{
    return st_arena_alloc_floats(m->arena, ST_MEM_ACTIVATIONS, count, out);
}

float *st_graph_norm_scratch(const st_model *m)
{
    return m->norm_scratch;
}

float *st_graph_grad_scratch(const st_model *m)
{
    return m->grad_scratch;
}

void st_graph_gather(float *dst, const float *src, int64_t n_all, int64_t full_cols,
                     const st_row_run *rows, int n_rows, const st_row_run *cols, int n_cols,
                     int64_t col_unit)
{
    const st_row_run all_rows = { 0, n_all }, all_cols = { 0, full_cols / col_unit };
    if (!rows) {
        rows = &all_rows;
        n_rows = 1;
    }
    if (!cols) {
        cols = &all_cols;
        n_cols = 1;
    }
    for (int i = 0; i < n_rows; i++)
        for (int64_t r = rows[i].begin; r < rows[i].begin + rows[i].count; r++)
            for (int j = 0; j < n_cols; j++) {
                const size_t n = (size_t)(cols[j].count * col_unit);
                memcpy(dst, src + r * full_cols + cols[j].begin * col_unit, n * sizeof *dst);
                dst += n;
            }
}

/* ------------------------------------------------------------ build */

/* Floats per row: a width layer's kept units (or the widest) times the
 * elements of one channel, times the copies. */
static int64_t tensor_width(const st_model *m, const st_tensor *t)
{
    if (t->width_unit == ST_W_FULL)
        return t->cols;
    int64_t n = st_graph_width(m, t->width_unit);
    if (t->width_unit == ST_W_WIDEST && t->widest_of) {
        n = 0;
        for (int u = 0; u < m->n_width; u++)
            if (m->keep[u].full == t->widest_of && m->keep[u].n > n)
                n = m->keep[u].n;
    }
    return n * t->h * t->w * t->copies;
}

/* The last layer before i that writes tensor t (resolved), -1: none. */
static int producer(const st_model *m, int i, int t)
{
    const int x = resolve(m, t);
    int j = i - 1;
    while (j >= 0 && (m->layers[j].dropped || resolve(m, m->layers[j].y) != x))
        j--;
    return j;
}

static int produced_with_backward(const st_model *m, int i, int t)
{
    const int j = t >= 0 ? producer(m, i, t) : -1;
    return j >= 0 && m->layers[j].backward;
}

/* Whether each layer's backward does anything, and which input gradients
 * are needed, decided once, in forward order so that a producer's answer
 * is known before its consumers ask.  An input gradient is needed only if
 * the layer that produced the input runs its backward: not for the first
 * layer of a model, nor for the layers at the start of a segment (a run
 * of layers trained alone, nn/segment.c), whose input comes from outside.
 * A layer runs its backward if it has parameters with a gradient or its
 * input gradient is needed; a transparent one (a join: its inputs'
 * gradient is its own) if what produced either input runs its backward. */
static void prune_input_gradients(st_model *m)
{
    for (int i = 0; i < m->n_layers; i++) {
        st_layer *l = &m->layers[i];
        l->backward = 0;
        if (l->dropped)
            continue;
        if (l->kind->transparent) {
            l->backward = produced_with_backward(m, i, l->x) ||
                          produced_with_backward(m, i, l->residual);
            continue;
        }
        if (l->dx != ST_T_NONE && !produced_with_backward(m, i, l->x))
            l->dx = ST_T_NONE;
        l->backward = l->dx != ST_T_NONE;
        for (int k = 0; k < 2 && l->kind->layout && !l->backward; k++)
            l->backward = l->seg[k] != (size_t)-1 && m->segs[l->seg[k]].grad_offset != ST_NO_GRAD;
    }
}

/* ------------------------------------------------------------ bf16: forward-only tensors */

/* Whether layer l's backward reads tensor t (resolved), as its kind says
 * (st_layer_kind.backward_reads; a kind that does not say reads all). */
static int read_by_backward(const st_model *m, const st_layer *l, int t)
{
    if (l->dropped || !l->backward || !l->kind->backward)
        return 0;
    const unsigned r = l->kind->backward_reads ? l->kind->backward_reads(m, l) : ST_READS_ALL;
    return ((r & ST_READS_X) && l->x >= 0 && resolve(m, l->x) == t) ||
           ((r & ST_READS_Y) && l->y >= 0 && resolve(m, l->y) == t) ||
           ((r & ST_READS_RESIDUAL) && l->residual >= 0 && resolve(m, l->residual) == t);
}

/* bf16: whether tensor t (resolved) lives during the forward only, and
 * then its span: the first and last layers whose forward touches it (as
 * x, y or residual).  That is a tensor that a layer of this instance
 * writes before any reads it (not the input of the model or of a range,
 * which comes from outside), that is no layer's gradient (dx, dy), that
 * no backward reads (in bf16 the linear layers, norms, activations and
 * attention read their own bf16 copies), and that is not the output of
 * the model or range (the loss reads it).  The model's predeclared
 * tensors never are.  Inference runs the same forward, so the same spans
 * hold. */
static int forward_only(const st_model *m, int t, int *first, int *last)
{
    if (m->cfg.precision != ST_PRECISION_BF16 || t < ST_T_FIRST_FREE ||
        resolve(m, t) != t || m->tensors[t].data)
        return 0;
    int f = -1, l = -1, end = -1;
    for (int i = 0; i < m->n_layers; i++) {
        const st_layer *L = &m->layers[i];
        if (L->dropped)
            continue;
        end = i;
        const int x = L->x >= 0 && resolve(m, L->x) == t;
        const int y = L->y >= 0 && resolve(m, L->y) == t;
        const int r = L->residual >= 0 && resolve(m, L->residual) == t;
        if ((L->dx >= 0 && resolve(m, L->dx) == t) || (L->dy >= 0 && resolve(m, L->dy) == t) ||
            read_by_backward(m, L, t))
            return 0;
        if (!x && !y && !r)
            continue;
        if (f < 0 && (x || r || !y))   /* read before written: from outside */
            return 0;
        if (f < 0)
            f = i;
        l = i;
    }
    if (f < 0 || resolve(m, m->layers[end].y) == t)
        return 0;
    *first = f;
    *last = l;
    return 1;
}

/* bf16: whether tensor t (resolved) is a data gradient that lives during
 * the backward only: touched by layers as dx or dy only (never as x, y or
 * a residual), only by kinds that say what their backward reads (their
 * forwards touch x, y and the residual only), and not the last layer's dy
 * (the loss writes that, outside the backward).  A step runs the forward,
 * the loss, then the backward (st_model_forward_backward,
 * st_segnet_forward_backward), and each backward writes such a gradient
 * before it reads it (layers.h: data gradients are written; the skip adds
 * into one its branch has written), so nothing in it outlives the
 * backward, and the forward-only tensors are dead by then. */
static int backward_only(const st_model *m, int t)
{
    if (m->cfg.precision != ST_PRECISION_BF16 || t < ST_T_FIRST_FREE ||
        resolve(m, t) != t || m->tensors[t].data)
        return 0;
    int touched = 0, end = -1;
    for (int i = 0; i < m->n_layers; i++) {
        const st_layer *L = &m->layers[i];
        if (L->dropped)
            continue;
        end = i;
        if ((L->x >= 0 && resolve(m, L->x) == t) || (L->y >= 0 && resolve(m, L->y) == t) ||
            (L->residual >= 0 && resolve(m, L->residual) == t))
            return 0;
        if ((L->dx >= 0 && resolve(m, L->dx) == t) || (L->dy >= 0 && resolve(m, L->dy) == t)) {
            if (!L->kind->backward_reads)
                return 0;
            touched = 1;
        }
    }
    return touched && end >= 0 && (m->layers[end].dy < 0 || resolve(m, m->layers[end].dy) != t);
}

/* bf16: the forward-only tensors (above) share a few buffers (from the
 * workspace), assigned by their spans: in order of first use (then of
 * id), each goes to a buffer whose last tensor's span ended before its
 * own begins, the smallest one large enough, else the largest one (which
 * grows), else a new one.  Spans are closed, so a layer's input and
 * output (both touched by it) never share a buffer: no primitive runs in
 * place that was not built to.  Then the backward-only gradients (above),
 * which are never live with them, take the same buffers, one each (they
 * are not told apart by span: a distinct buffer per gradient, as they
 * had), the smallest free one large enough, else the
 * largest free one (grown), else a new one, largest gradient first (then
 * by id).  Deterministic: the same
 * model, the same assignment.  fp32 keeps every tensor (nothing here
 * runs). */
/* The buffer a tensor of `need` floats takes among those whose tenant's
 * span ended before `from` (busy[b] < from): the smallest one large
 * enough, else the largest one (grown), else a new one; it is then busy
 * until `until`.  Returns its index. */
static int take_buffer(size_t *size, int *busy, int *buffers, size_t need, int from, int until)
{
    int fit = -1, big = -1;
    for (int b = 0; b < *buffers; b++) {
        if (busy[b] >= from)
            continue;
        if (size[b] >= need && (fit < 0 || size[b] < size[fit]))
            fit = b;
        if (big < 0 || size[b] > size[big])
            big = b;
    }
    int b = fit >= 0 ? fit : big;
    if (b < 0) {
        b = (*buffers)++;
        size[b] = 0;
    }
    if (size[b] < need)
        size[b] = need;
    busy[b] = until;
    return b;
}

static st_status assign_forward_only(st_model *m)
{
    if (m->cfg.precision != ST_PRECISION_BF16)
        return ST_OK;
    const int T = m->n_tensors;
    int *first = malloc((size_t)T * sizeof *first), *last = malloc((size_t)T * sizeof *last);
    int *order = malloc((size_t)T * sizeof *order), *slot = malloc((size_t)T * sizeof *slot);
    size_t *size = malloc((size_t)T * sizeof *size);
    int *busy = malloc((size_t)T * sizeof *busy);   /* per buffer: last layer of its tenant */
    st_status s = ST_OK;
    if (!first || !last || !order || !slot || !size || !busy) {
        s = st_fail(ST_ERR_NOMEM, "out of memory assigning a model's buffers");
        goto done;
    }
    int n = 0, buffers = 0;
    for (int t = 0; t < T; t++)
        if (forward_only(m, t, &first[t], &last[t]))
            order[n++] = t;
    for (int i = 1; i < n; i++)   /* by first use, then id (insertion: stable) */
        for (int j = i; j > 0 && first[order[j - 1]] > first[order[j]]; j--) {
            const int k = order[j];
            order[j] = order[j - 1];
            order[j - 1] = k;
        }
    for (int i = 0; i < n; i++) {
        const int t = order[i];
        const size_t need = (size_t)m->rows * (size_t)tensor_width(m, &m->tensors[t]);
        slot[t] = take_buffer(size, busy, &buffers, need, first[t], last[t]);
    }
    /* the gradients, largest first (then by id), so that the large ones
     * take the large buffers: busy[b] = INT_MAX once one has taken buffer
     * b (the forward tenants' spans all end before) */
    const int n_fwd = n;
    for (int t = 0; t < T; t++)
        if (backward_only(m, t)) {
            first[t] = 0;
            last[t] = 0;
            int j = n++;
            const size_t w = (size_t)tensor_width(m, &m->tensors[t]);
            for (; j > n_fwd && (size_t)tensor_width(m, &m->tensors[order[j - 1]]) < w; j--)
                order[j] = order[j - 1];
            order[j] = t;
        }
    for (int i = n_fwd; i < n; i++) {
        const int t = order[i];
        const size_t need = (size_t)m->rows * (size_t)tensor_width(m, &m->tensors[t]);
        slot[t] = take_buffer(size, busy, &buffers, need, INT_MAX, INT_MAX);
    }
    float **buf = buffers ? malloc((size_t)buffers * sizeof *buf) : NULL;
    if (buffers && !buf) {
        s = st_fail(ST_ERR_NOMEM, "out of memory assigning a model's buffers");
        goto done;
    }
    for (int b = 0; b < buffers && s == ST_OK; b++)
        s = st_arena_alloc_floats(m->arena, ST_MEM_WORKSPACE, size[b], &buf[b]);
    for (int i = 0; i < n && s == ST_OK; i++)
        m->tensors[order[i]].data = buf[slot[order[i]]];
    free(buf);
done:
    free(first);
    free(last);
    free(order);
    free(slot);
    free(size);
    free(busy);
    return s;
}

st_status st_graph_build(st_model *m)
{
    const size_t R = (size_t)m->rows;
    prune_input_gradients(m);
    ST_TRY(st_arena_alloc_floats(m->arena, ST_MEM_WEIGHTS, m->n_params, &m->params));
    ST_TRY(st_arena_alloc_floats(m->arena, ST_MEM_GRADIENTS, m->n_grads, &m->grads));
    if (m->n_state) {
        ST_TRY(st_arena_alloc_floats(m->arena, ST_MEM_WEIGHTS, m->n_state, &m->state));
        for (int i = 0; i < m->n_state_segs; i++)
            for (size_t j = 0; j < m->state_segs[i].count; j++)
                m->state[m->state_segs[i].offset + j] = m->state_init[i];
    }
    /* bf16: the tensors that live during the forward only share buffers
     * (above); the others have their own, below. */
    ST_TRY(assign_forward_only(m));
    /* Every tensor a layer of this instance touches, once (the model's
     * input and logits are there already, see model.c). */
    for (int i = 0; i < m->n_layers; i++) {
        const st_layer *l = &m->layers[i];
        const int touched[5] = { l->x, l->y, l->dx, l->dy, l->residual };
        for (int k = 0; k < 5 && !l->dropped; k++) {
            const int t = touched[k] >= 0 ? resolve(m, touched[k]) : ST_T_NONE;
            if (t < 0 || m->tensors[t].data)
                continue;
            ST_TRY(st_graph_alloc(m, R * (size_t)tensor_width(m, &m->tensors[t]),
                                  &m->tensors[t].data));
        }
    }
    /* A norm whose parameters get no gradient (backward masking) still has
     * oneDNN compute dgamma and dbeta: its backward-data-only variant is
     * not implemented with a scale and shift.  They go to one scratch
     * pair that all such norms share (nobody reads it).  So do those of
     * a norm over a width unit under backward masking, all of its
     * channels, whose kept ones the norm then copies out. */
    for (int i = 0; i < m->n_layers; i++) {
        const st_layer *l = &m->layers[i];
        const int no_grad = l->group >= 0 && !m->group_grad[l->group];
        const int masked = l->out_unit >= 0 && m->grad_keep[l->out_unit].ids;
        if (!l->dropped && l->kind->norm && (no_grad || masked) && l->out > m->norm_scratch_cols)
            m->norm_scratch_cols = l->out;
    }
    if (m->norm_scratch_cols)
        ST_TRY(st_arena_alloc_floats(m->arena, ST_MEM_WORKSPACE, 2 * (size_t)m->norm_scratch_cols,
                                     &m->norm_scratch));
    /* Full weight gradients that a kind's primitive computes whole under
     * backward masking (a convolution's): one scratch, as large as the
     * largest, shared (each layer copies its kept part out right away). */
    for (int i = 0; i < m->n_layers; i++) {
        const st_layer *l = &m->layers[i];
        const size_t n = !l->dropped && l->kind->grad_scratch ? l->kind->grad_scratch(m, l) : 0;
        if (n > m->grad_scratch_floats)
            m->grad_scratch_floats = n;
    }
    if (m->grad_scratch_floats)
        ST_TRY(st_arena_alloc_floats(m->arena, ST_MEM_WORKSPACE, m->grad_scratch_floats,
                                     &m->grad_scratch));
    for (int i = 0; i < m->n_layers; i++) {
        st_layer *l = &m->layers[i];
        if (!l->dropped && l->kind->alloc)
            ST_TRY(l->kind->alloc(m, l));
    }
    for (int i = 0; i < m->n_layers; i++) {
        st_layer *l = &m->layers[i];
        if (!l->dropped)
            ST_TRY(l->kind->build(m, l));
    }
    return ST_OK;
}

/* ------------------------------------------------------------ run */

st_status st_graph_forward(const st_model *m, st_phase phase)
{
    for (int i = 0; i < m->n_layers; i++) {
        const st_layer *l = &m->layers[i];
        if (!l->dropped && l->kind->forward)
            ST_TRY(l->kind->forward(&m->ctx, l, phase));
    }
    return ST_OK;
}

st_status st_graph_backward(const st_model *m)
{
    for (int i = m->n_layers - 1; i >= 0; i--) {
        const st_layer *l = &m->layers[i];
        if (l->backward && l->kind->backward)
            ST_TRY(l->kind->backward(&m->ctx, l));
    }
    return ST_OK;
}

double st_graph_flops(const st_model *m)
{
    double f = 0.0;
    for (int i = 0; i < m->n_layers; i++) {
        const st_layer *l = &m->layers[i];
        if (!l->dropped && l->kind->flops)
            f += l->kind->flops(l);
    }
    return f;
}

void st_graph_free(st_model *m)
{
    for (int i = 0; i < m->n_layers; i++) {
        free(m->layers[i].col_ids);
        free(m->layers[i].grad_col_ids);
        free(m->layers[i].copy_ids);
        free(m->layers[i].copy_grad_ids);
        free(m->layers[i].copy_runs);
    }
    free(m->layers);
    free(m->tensors);
    free(m->group_held);
    free(m->group_grad);
    free(m->segs);
    free(m->maps);
    free(m->state_segs);
    free(m->state_init);
    free(m->state_sel);
    free(m->state_full);
    free(m->keep);
    free(m->kept);
    free(m->grad_keep);
    free(m->ids);
    free(m->runs);
    free(m->run_first);
    free(m->run_count);
    free(m->group_ids);
}

/*
 * nn/graph_declare.c — the declaring half of every model (nn/graph.h): the
 * calls a builder declares its tensors, layers and groups with, the units
 * a subnetwork keeps (layer groups, width layers), and the layout of the
 * flat parameter and state vectors by one walk over the layer table.
 * Building and running the table is graph.c's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/graph.h"

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
        .tokens = m->open_tokens,
    };
    if (width >= m->n_width)
        m->n_width = width + 1;
    return m->n_tensors++;
}

void st_graph_tokens(st_model *m, int64_t tokens)
{
    m->open_tokens = tokens;
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
    /* a group's key is even, a declared block's odd: neighbours differ */
    l->block = m->open_group >= 0 ? 2 * m->open_group
             : m->open_block >= 0 ? 2 * m->open_block + 1 : -1;
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

void st_graph_group_begin(st_model *m, int g)
{
    m->open_group = g;
    if (g >= m->n_groups)
        m->n_groups = g + 1;
}

void st_graph_block(st_model *m, int b)
{
    m->open_block = b;
}

void st_graph_section(st_model *m, int s)
{
    m->open_section = s;
}

int st_graph_resolve(const st_model *m, int t)
{
    while (t >= 0 && m->tensors[t].group >= 0 && !m->group_held[m->tensors[t].group] &&
           m->tensors[t].alias >= 0)
        t = m->tensors[t].alias;
    return t;
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
    m->open_block = -1;
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

/* ------------------------------------------------------------ free */

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

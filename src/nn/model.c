/*
 * nn/model.c — building mlp and resmlp instances, running them.
 *
 * Build order: (1) lay out the flat parameter vector (segments) so its size
 * is known, (2) take params, grads and every activation buffer from the
 * arena, (3) build the layers' primitives against those buffers, (4) give
 * the shared workspace to every primitive.  The per-step functions then
 * only execute primitives.
 *
 * Memory, resmlp with width W, hidden H, batch B, depth L (floats):
 *   saved per block for the backward: n, a, z, h_out = B(2W + 2H), + 2B stats
 *   shared: dh, dn, dtmp (B x W each), dz, da (B x H each)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/rng.h>

#include "core/rng_streams.h"
#include "nn/model_internal.h"

/* ------------------------------------------------------------ config */

st_model_config st_model_config_default(void)
{
    st_model_config c = {
        .kind = ST_MODEL_RESMLP, .depth = 4, .width = 256, .hidden = 0,
        .activation = ST_ACT_GELU, .in_dim = 784, .n_classes = 10,
    };
    return c;
}

#define ST_MAX_DEPTH 1024
#define ST_MAX_WIDTH (1 << 16)

st_status st_model_config_check(const st_model_config *c)
{
    if (c->kind != ST_MODEL_MLP && c->kind != ST_MODEL_RESMLP)
        return st_fail(ST_ERR_INVALID, "model: unknown kind %d (allowed: mlp, resmlp)", (int)c->kind);
    if (c->depth < 1 || c->depth > ST_MAX_DEPTH)
        return st_fail(ST_ERR_INVALID, "depth must be in [1, %d], got %d", ST_MAX_DEPTH, c->depth);
    if (c->width < 1 || c->width > ST_MAX_WIDTH)
        return st_fail(ST_ERR_INVALID, "width must be in [1, %d], got %d", ST_MAX_WIDTH, c->width);
    if (c->hidden < 0 || c->hidden > ST_MAX_WIDTH)
        return st_fail(ST_ERR_INVALID, "hidden must be in [1, %d] (or 0 for the width), got %d",
                       ST_MAX_WIDTH, c->hidden);
    if (c->activation != ST_ACT_RELU && c->activation != ST_ACT_GELU)
        return st_fail(ST_ERR_INVALID, "unknown activation %d (allowed: relu, gelu)", (int)c->activation);
    if (c->in_dim < 1 || c->in_dim > (1 << 24))
        return st_fail(ST_ERR_INVALID, "input dimension must be in [1, 2^24], got %d", c->in_dim);
    if (c->n_classes < 2 || c->n_classes > 255)
        return st_fail(ST_ERR_INVALID, "number of classes must be in [2, 255], got %d", c->n_classes);
    if (!(c->branch_scale >= 0.0f && c->branch_scale <= 1000.0f))
        return st_fail(ST_ERR_INVALID, "branch scale must be in [0, 1000] (0: none), got %g",
                       c->branch_scale);
    if (c->grad_blocks && c->kind != ST_MODEL_RESMLP)
        return st_fail(ST_ERR_INVALID, "backward masking skips resmlp blocks; %s has none",
                       st_model_kind_name(c->kind));
    if (c->full_depth || c->block_ids) {
        if (c->kind != ST_MODEL_RESMLP)
            return st_fail(ST_ERR_INVALID, "block subnetworks are made of resmlp blocks; %s has none",
                           st_model_kind_name(c->kind));
        if (!c->block_ids || c->full_depth < c->depth || c->full_depth > ST_MAX_DEPTH)
            return st_fail(ST_ERR_INVALID, "a subnetwork of %d blocks needs their ids in a model "
                           "of at least as many blocks (full depth %d)", c->depth, c->full_depth);
        for (int l = 0; l < c->depth; l++)
            if (c->block_ids[l] < 0 || c->block_ids[l] >= c->full_depth ||
                (l > 0 && c->block_ids[l] <= c->block_ids[l - 1]))
                return st_fail(ST_ERR_INVALID, "subnetwork block ids must increase within [0, %d); "
                               "id %d is %d", c->full_depth, l, c->block_ids[l]);
    }
    if (c->kept_count || c->kept_groups) {
        if (!c->kept_count || !c->kept_groups || c->neuron_group < 1)
            return st_fail(ST_ERR_INVALID, "neuron subnetworks need a group size >= 1 and the "
                           "kept groups of every layer");
        if (c->full_depth || c->block_ids)
            return st_fail(ST_ERR_INVALID, "a model is a block or a neuron subnetwork, not both");
        const int groups = st_model_neuron_groups(c);
        const int *g = c->kept_groups;
        for (int l = 0; l < c->depth; l++) {
            if (c->kept_count[l] < 1 || c->kept_count[l] > groups)
                return st_fail(ST_ERR_INVALID, "neuron layer %d keeps %d groups; it has %d and "
                               "needs at least one", l, c->kept_count[l], groups);
            for (int j = 0; j < c->kept_count[l]; j++, g++)
                if (*g < 0 || *g >= groups || (j > 0 && *g <= g[-1]))
                    return st_fail(ST_ERR_INVALID, "kept groups of neuron layer %d must increase "
                                   "within [0, %d); group %d is %d", l, groups, j, *g);
        }
    }
    return ST_OK;
}

static int hidden_of(const st_model_config *c);

int st_model_neuron_groups(const st_model_config *c)
{
    int n = c->kind == ST_MODEL_MLP ? c->width : hidden_of(c);
    int g = c->neuron_group > 0 ? c->neuron_group : 1;
    return (n + g - 1) / g;
}

size_t st_model_config_param_count(const st_model_config *c)
{
    const size_t in = (size_t)c->in_dim, W = (size_t)c->width, K = (size_t)c->n_classes;
    const size_t L = (size_t)c->depth, H = (size_t)(c->hidden > 0 ? c->hidden : c->width);
    size_t first = in * W + W, head = W * K + K;
    if (c->kind == ST_MODEL_MLP)
        return first + (L - 1) * (W * W + W) + head;
    size_t block = 2 * W + (W * H + H) + (H * W + W);
    return first + L * block + 2 * W + head;
}

static int hidden_of(const st_model_config *c)
{
    return c->hidden > 0 ? c->hidden : c->width;
}

/* ------------------------------------------------------------ parameter layout */

/* Appends a segment (sizes only, no memory yet) whose elements come from
 * the full model as `map` says; the map's full offset and init stream are
 * the layout cursor's, which then moves past the full tensor.  *index is
 * the segment's index (see seg_params). */
static st_status add_segment(st_model *m, const char *name, int decay, st_seg_map map,
                             size_t *index)
{
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
    map.full_offset = m->full_at;
    map.stream = m->full_seg;
    m->full_at += (size_t)(map.full_rows * map.full_cols);
    m->full_seg++;
    const int64_t grad_rows = map.grad_rows ? map.n_grad_rows : map.n_rows;
    st_param_segment *s = &m->segs[m->n_segs];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->offset = m->n_params;
    s->count = (size_t)(map.n_rows * map.n_cols);
    s->decay = decay;
    s->grad_count = (size_t)(grad_rows * map.n_cols);
    s->grad_offset = m->layout_grads ? m->n_grads : ST_NO_GRAD;
    m->maps[m->n_segs] = map;
    *index = (size_t)m->n_segs++;
    m->n_params += s->count;
    if (m->layout_grads)
        m->n_grads += s->grad_count;
    return ST_OK;
}

/* resmlp lays out 2 stem segments, 6 per block, then 4 (final norm, head):
 * the full index of a segment names the RNG stream it is initialised from. */
enum { STEM_SEGS = 2, BLOCK_SEGS = 6 };

/* One linear layer's weight and bias: their segment indices. */
typedef struct { size_t w, b; } linear_offsets;
typedef struct { size_t gamma, beta; } norm_offsets;

static const st_neuron_sel *all_of(int64_t n, st_neuron_sel *tmp)
{
    *tmp = (st_neuron_sel){ n, n, NULL };
    return tmp;
}

/* A linear layer from the `in` neurons to the `out` neurons kept of the
 * full layer.  Storage rows are the out neurons, or the in neurons when
 * in_major; grad (may be NULL) names the storage rows that get a weight
 * gradient under backward masking. */
static st_status layout_linear(st_model *m, const char *prefix, const st_neuron_sel *in,
                               const st_neuron_sel *out, int in_major, const st_neuron_sel *grad,
                               linear_offsets *o)
{
    const st_neuron_sel *rows = in_major ? in : out, *cols = in_major ? out : in;
    st_seg_map w = {
        .full_rows = rows->full, .full_cols = cols->full, .rows = rows->ids, .cols = cols->ids,
        .n_rows = rows->n, .n_cols = cols->n, .in_major = in_major, .fan_in = in->full,
    };
    if (grad && grad->ids) {
        w.grad_rows = grad->ids;
        w.n_grad_rows = grad->n;
    }
    st_seg_map b = {
        .full_rows = out->full, .full_cols = 1, .rows = out->ids, .n_rows = out->n, .n_cols = 1,
        .fan_in = in->full,
    };
    if (!in_major) {  /* the rows of an out-major matrix are its biases' */
        b.grad_rows = w.grad_rows;
        b.n_grad_rows = w.n_grad_rows;
    }
    char name[40];
    snprintf(name, sizeof name, "%s.weight", prefix);
    ST_TRY(add_segment(m, name, 1, w, &o->w));
    snprintf(name, sizeof name, "%s.bias", prefix);
    return add_segment(m, name, 0, b, &o->b);
}

static st_status layout_norm(st_model *m, const char *prefix, int64_t c, norm_offsets *o)
{
    st_seg_map v = { .full_rows = c, .full_cols = 1, .n_rows = c, .n_cols = 1, .fan_in = 1 };
    char name[40];
    snprintf(name, sizeof name, "%s.gamma", prefix);
    ST_TRY(add_segment(m, name, 0, v, &o->gamma));
    snprintf(name, sizeof name, "%s.beta", prefix);
    return add_segment(m, name, 0, v, &o->beta);
}

/* Segment i's values and gradient (NULL when it has none). */
static float *seg_params(const st_model *m, size_t i)
{
    return m->params + m->segs[i].offset;
}

static float *seg_grads(const st_model *m, size_t i)
{
    size_t g = m->segs[i].grad_offset;
    return g == ST_NO_GRAD ? NULL : m->grads + g;
}

/* The runs of rows with a weight gradient of neuron layer l's matrices
 * (NULL: all). */
static const st_row_run *grad_runs(const st_model *m, int l, int *n)
{
    if (!m->runs || !m->grad_keep[l].ids) {
        *n = 0;
        return NULL;
    }
    *n = m->run_count[l];
    return m->runs + m->run_first[l];
}

static st_linear_io linear_io(const st_model *m, linear_offsets o, const float *x, float *y,
                              float *dx, const float *dy)
{
    st_linear_io io = {
        .x = x, .y = y, .dx = dx, .dy = dy,
        .w = seg_params(m, o.w), .b = seg_params(m, o.b),
        .dw = seg_grads(m, o.w), .db = seg_grads(m, o.b),
        .in_major = m->maps[o.w].in_major,
    };
    return io;
}

static st_status alloc_act(st_model *m, size_t count, float **out)
{
    return st_arena_alloc_floats(m->arena, ST_MEM_ACTIVATIONS, count, out);
}

/* ------------------------------------------------------------ neuron layers */

/* Expands the config's kept groups into neuron ids (forward masking: the
 * compact layers; backward masking: the rows with gradients), and the
 * latter into runs of consecutive rows for the linear layers. */
static st_status setup_neurons(st_model *m)
{
    const st_model_config *c = &m->cfg;
    const int L = c->depth;
    const int64_t full = c->kind == ST_MODEL_MLP ? c->width : hidden_of(c);
    m->keep = calloc((size_t)L, sizeof *m->keep);
    m->grad_keep = calloc((size_t)L, sizeof *m->grad_keep);
    if (!m->keep || !m->grad_keep)
        return st_fail(ST_ERR_NOMEM, "out of memory creating a model");
    m->max_hidden = full;
    for (int l = 0; l < L; l++)
        m->keep[l] = m->grad_keep[l] = (st_neuron_sel){ full, full, NULL };
    if (!c->kept_count)
        return ST_OK;
    const int64_t G = c->neuron_group;
    size_t total = 0, groups = 0;
    for (int l = 0; l < L; l++)
        groups += (size_t)c->kept_count[l];
    total = groups * (size_t)G;
    /* the config keeps pointing at the model's own copy */
    m->kept = malloc(((size_t)L + groups) * sizeof *m->kept);
    if (!m->kept)
        return st_fail(ST_ERR_NOMEM, "out of memory creating a model");
    memcpy(m->kept, c->kept_count, (size_t)L * sizeof *m->kept);
    memcpy(m->kept + L, c->kept_groups, groups * sizeof *m->kept);
    m->cfg.kept_count = m->kept;
    m->cfg.kept_groups = m->kept + L;
    m->ids = malloc(total * sizeof *m->ids);
    if (!m->ids)
        return st_fail(ST_ERR_NOMEM, "out of memory creating a model");
    /* runs of gradient rows: backward masking only (see grad_runs) */
    st_row_run *runs = NULL;
    int *run_first = NULL, *run_count = NULL;
    if (c->neuron_grads_only) {
        m->runs = malloc(groups * sizeof *m->runs);
        m->run_first = calloc((size_t)L, sizeof *m->run_first);
        m->run_count = calloc((size_t)L, sizeof *m->run_count);
        if (!m->runs || !m->run_first || !m->run_count)
            return st_fail(ST_ERR_NOMEM, "out of memory creating a model");
        runs = m->runs;
        run_first = m->run_first;
        run_count = m->run_count;
    }
    int32_t *id = m->ids;
    const int *g = c->kept_groups;
    int n_runs = 0;
    m->max_hidden = 0;
    for (int l = 0; l < L; l++) {
        st_neuron_sel sel = { full, 0, id };
        if (runs)
            run_first[l] = n_runs;
        for (int j = 0; j < c->kept_count[l]; j++, g++) {
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
            run_count[l] = n_runs - run_first[l];
        if (c->neuron_grads_only)
            m->grad_keep[l] = sel;
        else
            m->keep[l] = sel;
        if (m->keep[l].n > m->max_hidden)
            m->max_hidden = m->keep[l].n;
    }
    return ST_OK;
}

/* ------------------------------------------------------------ mlp */

/* fc0 .. fc{L-1}, head: lo[0..L]. */
static st_status layout_mlp(st_model *m, linear_offsets *lo)
{
    const int L = m->cfg.depth;
    char name[32];
    st_neuron_sel input, classes;
    all_of(m->cfg.in_dim, &input);
    all_of(m->cfg.n_classes, &classes);
    for (int i = 0; i <= L; i++) {
        snprintf(name, sizeof name, i == L ? "head" : "fc%d", i);
        ST_TRY(layout_linear(m, name, i == 0 ? &input : &m->keep[i - 1],
                             i == L ? &classes : &m->keep[i], 0,
                             i == L ? NULL : &m->grad_keep[i], &lo[i]));
    }
    return ST_OK;
}

/* Layer i reads the kept neurons of layer i - 1 (the input: all of it) and
 * writes its own kept neurons; with forward masking, the layers after the
 * first read a subset and scale their product (not their bias, which every
 * worker holds) by branch_scale. */
static st_status build_mlp(st_model *m)
{
    const size_t B = (size_t)m->batch, L = (size_t)m->cfg.depth;
    const float scale = m->cfg.kept_count && !m->cfg.neuron_grads_only ? m->cfg.branch_scale : 0.0f;
    linear_offsets *lo = calloc(L + 1, sizeof *lo);
    m->dense = calloc(L, sizeof *m->dense);
    if (!lo || !m->dense) {
        free(lo);
        return st_fail(ST_ERR_NOMEM, "out of memory building the mlp");
    }
    st_status s = layout_mlp(m, lo);
    if (s == ST_OK)
        s = st_arena_alloc_floats(m->arena, ST_MEM_WEIGHTS, m->n_params, &m->params);
    if (s == ST_OK)
        s = st_arena_alloc_floats(m->arena, ST_MEM_GRADIENTS, m->n_grads, &m->grads);
    for (size_t i = 0; i < L && s == ST_OK; i++) {
        s = alloc_act(m, B * (size_t)m->keep[i].n, &m->dense[i].a);
        if (s == ST_OK)
            s = alloc_act(m, B * (size_t)m->keep[i].n, &m->dense[i].z);
    }
    /* Two shared data-gradient buffers, used alternately going backward:
     * a layer's dz feeds the activation, whose da feeds the linear below. */
    if (s == ST_OK)
        s = alloc_act(m, B * (size_t)m->max_hidden, &m->dz);
    if (s == ST_OK)
        s = alloc_act(m, B * (size_t)m->max_hidden, &m->da);

    for (size_t i = 0; i < L && s == ST_OK; i++) {
        st_dense *d = &m->dense[i];
        const float *x = i == 0 ? m->input : m->dense[i - 1].z;
        int64_t in = i == 0 ? m->cfg.in_dim : m->keep[i - 1].n, W = m->keep[i].n;
        st_linear_io io = linear_io(m, lo[i], x, d->a, i == 0 ? NULL : m->dz, m->da);
        io.dw_runs = grad_runs(m, (int)i, &io.n_dw_runs);
        io.scale = i == 0 ? 0.0f : scale;
        io.unscaled_bias = 1;   /* every worker holds the bias */
        s = st_linear_build(&m->ctx, &d->fc, (int64_t)B, in, W, &io);
        if (s == ST_OK)
            s = st_act_build(&m->ctx, &d->act, m->cfg.activation, (int64_t)B, W,
                             d->a, d->z, m->da, m->dz);
    }
    if (s == ST_OK) {
        st_linear_io io = linear_io(m, lo[L], m->dense[L - 1].z, m->logits, m->dz, m->dlogits);
        io.scale = scale;
        io.unscaled_bias = 1;
        s = st_linear_build(&m->ctx, &m->head, (int64_t)B, m->keep[L - 1].n, m->cfg.n_classes, &io);
    }
    free(lo);
    return s;
}

static st_status mlp_forward(const st_model *m)
{
    for (int i = 0; i < m->cfg.depth; i++) {
        ST_TRY(st_linear_forward(&m->ctx, &m->dense[i].fc));
        ST_TRY(st_act_forward(&m->ctx, &m->dense[i].act));
    }
    return st_linear_forward(&m->ctx, &m->head);
}

static st_status mlp_backward(const st_model *m)
{
    ST_TRY(st_linear_backward(&m->ctx, &m->head));          /* dlogits -> dz */
    for (int i = m->cfg.depth - 1; i >= 0; i--) {
        ST_TRY(st_act_backward(&m->ctx, &m->dense[i].act));  /* dz -> da */
        ST_TRY(st_linear_backward(&m->ctx, &m->dense[i].fc)); /* da -> dz */
    }
    return ST_OK;
}

/* ------------------------------------------------------------ resmlp */

typedef struct { norm_offsets ln; linear_offsets fc1, fc2; } block_offsets;

/* Full layout: stem, full_depth blocks, final norm, head; a block
 * subnetwork's block l sits where block block_ids[l] does. */
static st_status layout_resmlp(st_model *m, linear_offsets *stem, block_offsets *bo,
                               norm_offsets *lnf, linear_offsets *head)
{
    const int64_t W = m->cfg.width;
    st_neuron_sel input, width, classes;
    all_of(m->cfg.in_dim, &input);
    all_of(W, &width);
    all_of(m->cfg.n_classes, &classes);
    char name[32];
    ST_TRY(layout_linear(m, "stem", &input, &width, 0, NULL, stem));
    const size_t stem_end = m->full_at, H = (size_t)hidden_of(&m->cfg);
    const size_t block_full = 2 * (size_t)W + 2 * (size_t)W * H + H + (size_t)W;
    for (int l = 0; l < m->cfg.depth; l++) {
        int id = m->block_ids[l];
        m->full_at = stem_end + (size_t)id * block_full;
        m->full_seg = STEM_SEGS + (uint64_t)BLOCK_SEGS * (uint64_t)id;
        m->layout_grads = m->grad_blocks[l];
        snprintf(name, sizeof name, "block%d.ln", id);
        ST_TRY(layout_norm(m, name, W, &bo[l].ln));
        snprintf(name, sizeof name, "block%d.fc1", id);
        ST_TRY(layout_linear(m, name, &width, &m->keep[l], 0, &m->grad_keep[l], &bo[l].fc1));
        snprintf(name, sizeof name, "block%d.fc2", id);
        ST_TRY(layout_linear(m, name, &m->keep[l], &width, 1, &m->grad_keep[l], &bo[l].fc2));
    }
    m->full_at = stem_end + (size_t)m->full_depth * block_full;
    m->full_seg = STEM_SEGS + (uint64_t)BLOCK_SEGS * (uint64_t)m->full_depth;
    m->layout_grads = 1;
    ST_TRY(layout_norm(m, "final_ln", W, lnf));
    return layout_linear(m, "head", &width, &classes, 0, NULL, head);
}

static st_status alloc_resmlp_buffers(st_model *m)
{
    const size_t B = (size_t)m->batch, W = (size_t)m->cfg.width, H = (size_t)m->max_hidden;
    ST_TRY(alloc_act(m, B * W, &m->h0));
    for (int l = 0; l < m->cfg.depth; l++) {
        st_resblock *k = &m->blocks[l];
        const size_t Hl = (size_t)m->keep[l].n;
        ST_TRY(alloc_act(m, B * W, &k->n));
        ST_TRY(alloc_act(m, B, &k->mean));
        ST_TRY(alloc_act(m, B, &k->var));
        ST_TRY(alloc_act(m, B * Hl, &k->a));
        ST_TRY(alloc_act(m, B * Hl, &k->z));
        ST_TRY(alloc_act(m, B * W, &k->h_out));
    }
    ST_TRY(alloc_act(m, B * W, &m->nf));
    ST_TRY(alloc_act(m, B, &m->mean_f));
    ST_TRY(alloc_act(m, B, &m->var_f));
    /* Shared: nothing in them is needed once the next block has run. */
    ST_TRY(alloc_act(m, B * W, &m->dh));
    ST_TRY(alloc_act(m, B * W, &m->dn));
    ST_TRY(alloc_act(m, B * W, &m->dtmp));
    ST_TRY(alloc_act(m, B * H, &m->dz));
    if (m->n_grads < m->n_params)
        ST_TRY(st_arena_alloc_floats(m->arena, ST_MEM_WORKSPACE, 2 * W, &m->norm_scratch));
    return alloc_act(m, B * H, &m->da);
}

/* A norm whose parameters get no gradient (backward masking) still has
 * oneDNN compute dgamma and dbeta: its backward-data-only variant is not
 * implemented with a scale and shift.  They go to a scratch pair. */
static st_layernorm_io norm_io(const st_model *m, norm_offsets o, const float *x, float *y,
                               float *mean, float *var, float *dx, const float *dy)
{
    st_layernorm_io io = {
        .x = x, .y = y, .mean = mean, .var = var,
        .gamma = seg_params(m, o.gamma), .beta = seg_params(m, o.beta),
        .dx = dx, .dy = dy,
        .dgamma = seg_grads(m, o.gamma), .dbeta = seg_grads(m, o.beta),
    };
    if (!io.dgamma) {
        io.dgamma = m->norm_scratch;
        io.dbeta = m->norm_scratch + m->cfg.width;
    }
    return io;
}

static st_status build_block(st_model *m, int l, const float *h_in, block_offsets o)
{
    st_resblock *k = &m->blocks[l];
    const int64_t B = m->batch, W = m->cfg.width, H = m->keep[l].n;
    st_layernorm_io nio = norm_io(m, o.ln, h_in, k->n, k->mean, k->var, m->dtmp, m->dn);
    ST_TRY(st_layernorm_build(&m->ctx, &k->ln, B, W, &nio));
    st_linear_io io1 = linear_io(m, o.fc1, k->n, k->a, m->dn, m->da);
    io1.dw_runs = grad_runs(m, l, &io1.n_dw_runs);
    ST_TRY(st_linear_build(&m->ctx, &k->fc1, B, W, H, &io1));
    ST_TRY(st_act_build(&m->ctx, &k->act, m->cfg.activation, B, H, k->a, k->z, m->da, m->dz));
    st_linear_io io2 = linear_io(m, o.fc2, k->z, k->h_out, m->dz, m->dh);
    io2.residual = h_in;
    io2.scale = m->cfg.branch_scale;
    /* a dropped block takes its bias with it; dropped neurons do not */
    io2.unscaled_bias = m->cfg.kept_count != NULL;
    io2.dw_runs = grad_runs(m, l, &io2.n_dw_runs);
    ST_TRY(st_linear_build(&m->ctx, &k->fc2, B, H, W, &io2));
    return st_add_build(&m->ctx, &k->join, B, W, m->dh, m->dtmp, m->dh);
}

static st_status build_resmlp(st_model *m)
{
    const int64_t B = m->batch, W = m->cfg.width, L = m->cfg.depth;
    linear_offsets stem, head;
    norm_offsets lnf;
    block_offsets *bo = calloc((size_t)L, sizeof *bo);
    m->blocks = calloc((size_t)L, sizeof *m->blocks);
    if (!bo || !m->blocks) {
        free(bo);
        return st_fail(ST_ERR_NOMEM, "out of memory building the resmlp");
    }
    st_status s;
    ST_TRY_GOTO(s, layout_resmlp(m, &stem, bo, &lnf, &head), done);
    ST_TRY_GOTO(s, st_arena_alloc_floats(m->arena, ST_MEM_WEIGHTS, m->n_params, &m->params), done);
    ST_TRY_GOTO(s, st_arena_alloc_floats(m->arena, ST_MEM_GRADIENTS, m->n_grads, &m->grads), done);
    ST_TRY_GOTO(s, alloc_resmlp_buffers(m), done);

    /* The stem's input gradient is never needed: dx = NULL. */
    st_linear_io sio = linear_io(m, stem, m->input, m->h0, NULL, m->dh);
    ST_TRY_GOTO(s, st_linear_build(&m->ctx, &m->stem, B, m->cfg.in_dim, W, &sio), done);
    const float *h = m->h0;
    for (int64_t l = 0; l < L; l++) {
        ST_TRY_GOTO(s, build_block(m, (int)l, h, bo[l]), done);
        h = m->blocks[l].h_out;
    }
    /* Going backward the final norm writes dh directly: it starts the
     * accumulation that every block's join then adds to. */
    st_layernorm_io fio = norm_io(m, lnf, h, m->nf, m->mean_f, m->var_f, m->dh, m->dn);
    ST_TRY_GOTO(s, st_layernorm_build(&m->ctx, &m->ln_final, B, W, &fio), done);
    st_linear_io hio = linear_io(m, head, m->nf, m->logits, m->dn, m->dlogits);
    ST_TRY_GOTO(s, st_linear_build(&m->ctx, &m->head, B, W, m->cfg.n_classes, &hio), done);
done:
    free(bo);
    return s;
}

static st_status resmlp_forward(const st_model *m)
{
    ST_TRY(st_linear_forward(&m->ctx, &m->stem));
    for (int l = 0; l < m->cfg.depth; l++) {
        const st_resblock *k = &m->blocks[l];
        ST_TRY(st_layernorm_forward(&m->ctx, &k->ln));
        ST_TRY(st_linear_forward(&m->ctx, &k->fc1));
        ST_TRY(st_act_forward(&m->ctx, &k->act));
        ST_TRY(st_linear_forward(&m->ctx, &k->fc2));    /* h_out = h_in + branch */
    }
    ST_TRY(st_layernorm_forward(&m->ctx, &m->ln_final));
    return st_linear_forward(&m->ctx, &m->head);
}

static st_status resmlp_backward(const st_model *m)
{
    ST_TRY(st_linear_backward(&m->ctx, &m->head));          /* dlogits -> dn */
    ST_TRY(st_layernorm_backward(&m->ctx, &m->ln_final));   /* dn -> dh */
    for (int l = m->cfg.depth - 1; l >= 0; l--) {
        const st_resblock *k = &m->blocks[l];
        ST_TRY(st_linear_backward(&m->ctx, &k->fc2));       /* dh -> dz */
        ST_TRY(st_act_backward(&m->ctx, &k->act));          /* dz -> da */
        ST_TRY(st_linear_backward(&m->ctx, &k->fc1));       /* da -> dn */
        ST_TRY(st_layernorm_backward(&m->ctx, &k->ln));     /* dn -> dtmp */
        ST_TRY(st_add_run(&m->ctx, &k->join));              /* dh += dtmp */
    }
    return st_linear_backward(&m->ctx, &m->stem);
}

/* ------------------------------------------------------------ public */

st_status st_model_create(const st_model_config *cfg, int batch, st_arena *arena, st_model **out)
{
    *out = NULL;
    ST_TRY(st_model_config_check(cfg));
    if (batch < 1 || batch > (1 << 20))
        return st_fail(ST_ERR_INVALID, "batch must be in [1, 2^20], got %d", batch);
    st_model *m = calloc(1, sizeof *m);
    if (!m || !(m->block_ids = malloc((size_t)cfg->depth * sizeof *m->block_ids))) {
        free(m);
        return st_fail(ST_ERR_NOMEM, "out of memory creating a model");
    }
    m->cfg = *cfg;
    m->full_depth = cfg->full_depth ? cfg->full_depth : cfg->depth;
    for (int l = 0; l < cfg->depth; l++)
        m->block_ids[l] = cfg->block_ids ? cfg->block_ids[l] : l;
    m->cfg.block_ids = m->block_ids;
    m->cfg.full_depth = m->full_depth;
    m->grad_blocks = malloc((size_t)cfg->depth);
    if (!m->grad_blocks) {
        free(m->block_ids);
        free(m);
        return st_fail(ST_ERR_NOMEM, "out of memory creating a model");
    }
    for (int l = 0; l < cfg->depth; l++)
        m->grad_blocks[l] = cfg->grad_blocks ? (cfg->grad_blocks[l] != 0) : 1;
    m->cfg.grad_blocks = m->grad_blocks;
    m->layout_grads = 1;
    m->batch = batch;
    st_status s;
    ST_TRY_GOTO(s, setup_neurons(m), fail);
    m->arena = arena;
    ST_TRY_GOTO(s, st_nn_ctx_init(&m->ctx, arena), fail);
    const size_t B = (size_t)batch, K = (size_t)cfg->n_classes;
    ST_TRY_GOTO(s, alloc_act(m, B * (size_t)cfg->in_dim, &m->input), fail);
    ST_TRY_GOTO(s, st_arena_alloc(arena, ST_MEM_ACTIVATIONS, B * sizeof(int32_t),
                                  (void **)&m->labels), fail);
    ST_TRY_GOTO(s, alloc_act(m, B * K, &m->logits), fail);
    ST_TRY_GOTO(s, alloc_act(m, B * K, &m->logp), fail);
    ST_TRY_GOTO(s, alloc_act(m, B * K, &m->dlogits), fail);
    ST_TRY_GOTO(s, cfg->kind == ST_MODEL_MLP ? build_mlp(m) : build_resmlp(m), fail);
    ST_TRY_GOTO(s, st_xent_build(&m->ctx, &m->xent, (int64_t)B, (int64_t)K, m->logits,
                                 m->logp, m->dlogits), fail);
    ST_TRY_GOTO(s, st_nn_ctx_finalize(&m->ctx), fail);
    *out = m;
    return ST_OK;
fail:
    st_model_destroy(m);
    return s;
}

/* What layout_full allocates (and a built model too). */
static void destroy_layout(st_model *m)
{
    free(m->segs);
    free(m->maps);
    free(m->keep);
    free(m->kept);
    free(m->grad_keep);
    free(m->ids);
    free(m->runs);
    free(m->run_first);
    free(m->run_count);
    free(m->block_ids);
    free(m->grad_blocks);
}

void st_model_destroy(st_model *m)
{
    if (!m)
        return;
    st_nn_ctx_destroy(&m->ctx);
    destroy_layout(m);
    free(m->dense);
    free(m->blocks);
    free(m);
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

/* The full model's layout without its memory, for initial values. */
static st_status layout_full(st_model *m, const st_model_config *cfg)
{
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->cfg.full_depth = 0;
    m->cfg.block_ids = NULL;
    m->cfg.grad_blocks = NULL;
    m->cfg.kept_count = NULL;
    m->cfg.kept_groups = NULL;
    m->full_depth = cfg->depth;
    m->layout_grads = 1;
    m->block_ids = malloc((size_t)cfg->depth * sizeof *m->block_ids);
    m->grad_blocks = malloc((size_t)cfg->depth);
    linear_offsets *lo = calloc((size_t)cfg->depth + 1, sizeof *lo);
    block_offsets *bo = calloc((size_t)cfg->depth, sizeof *bo);
    st_status s = ST_OK;
    if (!m->block_ids || !m->grad_blocks || !lo || !bo)
        s = st_fail(ST_ERR_NOMEM, "out of memory laying out a model");
    for (int l = 0; s == ST_OK && l < cfg->depth; l++) {
        m->block_ids[l] = l;
        m->grad_blocks[l] = 1;
    }
    if (s == ST_OK)
        s = setup_neurons(m);
    if (s == ST_OK && cfg->kind == ST_MODEL_MLP)
        s = layout_mlp(m, lo);
    else if (s == ST_OK) {
        norm_offsets lnf;
        s = layout_resmlp(m, &lo[0], bo, &lnf, &lo[1]);
    }
    free(lo);
    free(bo);
    return s;
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

const st_model_config *st_model_get_config(const st_model *m) { return &m->cfg; }
int st_model_batch(const st_model *m) { return m->batch; }
float *st_model_input(st_model *m) { return m->input; }
int32_t *st_model_labels(st_model *m) { return m->labels; }
const float *st_model_logits(const st_model *m) { return m->logits; }
float *st_model_params(st_model *m) { return m->params; }
float *st_model_grads(st_model *m) { return m->grads; }
size_t st_model_param_count(const st_model *m) { return m->n_params; }
size_t st_model_grad_count(const st_model *m) { return m->n_grads; }

const st_param_segment *st_model_segments(const st_model *m, int *count)
{
    *count = m->n_segs;
    return m->segs;
}

static st_status model_forward(const st_model *m)
{
    return m->cfg.kind == ST_MODEL_MLP ? mlp_forward(m) : resmlp_forward(m);
}

st_status st_model_forward_backward(st_model *m, float *loss)
{
    double sum;
    ST_TRY(model_forward(m));
    ST_TRY(st_xent_forward(&m->ctx, &m->xent, m->labels, m->batch, 1, &sum, NULL));
    *loss = (float)(sum / m->batch);
    return m->cfg.kind == ST_MODEL_MLP ? mlp_backward(m) : resmlp_backward(m);
}

st_status st_model_evaluate(st_model *m, int rows, double *loss_sum, int64_t *correct)
{
    if (rows < 1 || rows > m->batch)
        return st_fail(ST_ERR_INVALID, "evaluate: %d rows for a batch of %d", rows, m->batch);
    double sum;
    int64_t hits;
    ST_TRY(model_forward(m));
    ST_TRY(st_xent_forward(&m->ctx, &m->xent, m->labels, rows, 0, &sum, &hits));
    *loss_sum += sum;
    *correct += hits;
    return ST_OK;
}

size_t st_model_full_param_count(const st_model *m)
{
    st_model_config full = m->cfg;
    full.depth = m->full_depth;
    return st_model_config_param_count(&full);
}

/* One segment's elements (grads: its gradient's rows) as full-layout
 * ranges: per stored row, each run of consecutive full columns. */
static int segment_ranges(const st_model *m, int i, int grads, st_range *ranges, size_t *local,
                          int n, int cap, size_t *last_end, size_t *last_pos)
{
    const st_param_segment *s = &m->segs[i];
    const st_seg_map *mp = &m->maps[i];
    size_t pos = grads ? s->grad_offset : s->offset;
    const int32_t *rows = grads && mp->grad_rows ? mp->grad_rows : mp->rows;
    int64_t n_rows = grads && mp->grad_rows ? mp->n_grad_rows : mp->n_rows;
    for (int64_t a = 0; a < n_rows && n >= 0; a++) {
        size_t row = mp->full_offset + (size_t)(rows ? rows[a] : a) * (size_t)mp->full_cols;
        for (int64_t b = 0; b < mp->n_cols && n >= 0;) {
            int64_t c0 = mp->cols ? mp->cols[b] : b, len = 1;
            while (b + len < mp->n_cols && (mp->cols ? mp->cols[b + len] : b + len) == c0 + len)
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

static double linear_flops(const st_linear *l)
{
    double one = 2.0 * (double)l->batch * (double)l->in * (double)l->out;
    double rows = (double)(l->in_major ? l->in : l->out);   /* backward masking: some */
    return one * (1.0 + (l->has_dx ? 1.0 : 0.0)) + (l->has_dw ? one * (double)l->dw_rows / rows : 0.0);
}

double st_model_step_flops(const st_model *m)
{
    double f = linear_flops(&m->head);
    if (m->cfg.kind == ST_MODEL_MLP) {
        for (int i = 0; i < m->cfg.depth; i++)
            f += linear_flops(&m->dense[i].fc);
    } else {
        f += linear_flops(&m->stem);
        for (int l = 0; l < m->cfg.depth; l++)
            f += linear_flops(&m->blocks[l].fc1) + linear_flops(&m->blocks[l].fc2);
    }
    return f;
}

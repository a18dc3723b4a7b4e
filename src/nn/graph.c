/*
 * nn/graph.c — the generic half of every model that builds and runs it:
 * the accessors the layer kinds build with, memory, primitives, and the
 * forward and backward loops over the layer table.  Declaring the table
 * and laying out its parameters is graph_declare.c's; what a model looks
 * like is its builder's business (src/nn/models/); what a layer computes
 * is its kind's (src/nn/layers/).
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "nn/graph.h"

static int64_t tensor_width(const st_model *m, const st_tensor *t);

/* ------------------------------------------------------------ access */

static int resolve(const st_model *m, int t)
{
    return st_graph_resolve(m, t);
}

const st_tensor *st_graph_tensor_info(const st_model *m, int tensor)
{
    return tensor < 0 ? NULL : &m->tensors[resolve(m, tensor)];
}

int64_t st_graph_rows(const st_model *m, int tensor)
{
    const st_tensor *t = &m->tensors[resolve(m, tensor)];
    return t->tokens ? (int64_t)m->batch * t->tokens : m->rows;
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
    if (st_tensor_layout_resolve(m->cfg.tensor_layout, m->cfg.precision) ==
        ST_TENSOR_LAYOUT_NHWC)
        return dnnl_nhwc;
    return channels % st_blocked_channels() == 0 ? st_blocked_tag() : dnnl_nchw;
}

float *st_graph_data(const st_model *m, int tensor)
{
    return tensor < 0 ? NULL : m->tensors[resolve(m, tensor)].data;
}

int st_graph_is_half(const st_model *m, int tensor)
{
    return tensor >= 0 && m->tensors[resolve(m, tensor)].half;
}

st_bf16 *st_graph_data_bf16(const st_model *m, int tensor)
{
    return st_graph_is_half(m, tensor) ? (st_bf16 *)m->tensors[resolve(m, tensor)].data : NULL;
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

/* Floats of tensor t (resolved) in this instance: its rows times its
 * width, or half as many (rounded up) for a tensor stored as bf16. */
static size_t tensor_floats(const st_model *m, int t)
{
    const size_t n = (size_t)st_graph_rows(m, t) * (size_t)tensor_width(m, &m->tensors[t]);
    return m->tensors[t].half ? (n + 1) / 2 : n;
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

/* ------------------------------------------------------------ bf16: tensors stored as bf16 */

static unsigned bf16_io(const st_model *m, const st_layer *l)
{
    return l->kind->bf16_io ? l->kind->bf16_io(m, l) : 0u;
}

/* Whether tensor t (resolved) may be stored as bf16 as far as each layer
 * touching it on its own says (graph.h, st_graph_half), TIED aside. */
static int half_candidate(const st_model *m, int t)
{
    if (t < ST_T_FIRST_FREE || resolve(m, t) != t || m->tensors[t].data)
        return 0;
    int first = 1, written = 0, grad = 0, end = -1;
    for (int i = 0; i < m->n_layers; i++) {
        const st_layer *L = &m->layers[i];
        const int x = L->x >= 0 && resolve(m, L->x) == t;
        const int y = L->y >= 0 && resolve(m, L->y) == t;
        const int r = L->residual >= 0 && resolve(m, L->residual) == t;
        const int dx = L->dx >= 0 && resolve(m, L->dx) == t;
        const int dy = L->dy >= 0 && resolve(m, L->dy) == t;
        if (L->dropped) {
            if (m->range && (x || y || r || dx || dy))   /* a layer outside the range touches it */
                return 0;
            continue;
        }
        end = i;
        if (!x && !y && !r && !dx && !dy)
            continue;
        const unsigned io = bf16_io(m, L);
        if (r || (x && !(io & ST_BF16_X)) || (y && !(io & ST_BF16_Y)) ||
            (dx && !(io & ST_BF16_DX)) || (dy && !(io & ST_BF16_DY)))
            return 0;
        /* a data gradient: written by each backward before it is read */
        grad |= dx || dy;
        if (dx || dy)
            continue;
        if (first && (x || !y))   /* read before this instance writes it */
            return 0;
        first = 0;
        written |= y;
    }
    if (grad)   /* never also a value; not the last layer's dy (the loss writes it) */
        return first && end >= 0 && (m->layers[end].dy < 0 || resolve(m, m->layers[end].dy) != t);
    return written && end >= 0 && resolve(m, m->layers[end].y) != t;
}

st_status st_graph_half(st_model *m)
{
    for (int t = 0; t < m->n_tensors; t++)
        m->tensors[t].half = 0;
    if (m->cfg.precision != ST_PRECISION_BF16)
        return ST_OK;
    for (int t = 0; t < m->n_tensors; t++)
        m->tensors[t].half = half_candidate(m, t);
    /* a TIED layer's x and y: both bf16 or neither (with TIED_GRADS, its
     * dx and dy too); unmarking one may unmark another's, so until nothing
     * changes */
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < m->n_layers; i++) {
            const st_layer *L = &m->layers[i];
            const unsigned io = L->dropped ? 0u : bf16_io(m, L);
            if (!(io & ST_BF16_TIED) || L->x < 0 || L->y < 0)
                continue;
            const int tied[4] = { L->x, L->y, io & ST_BF16_TIED_GRADS ? L->dx : ST_T_NONE,
                                  io & ST_BF16_TIED_GRADS ? L->dy : ST_T_NONE };
            int all = 1, any = 0;
            for (int k = 0; k < 4; k++)
                if (tied[k] >= 0) {
                    all &= m->tensors[resolve(m, tied[k])].half;
                    any |= m->tensors[resolve(m, tied[k])].half;
                }
            for (int k = 0; k < 4 && any && !all; k++)
                if (tied[k] >= 0)
                    m->tensors[resolve(m, tied[k])].half = 0;
            changed |= any && !all;
        }
    }
    return ST_OK;
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
    if (f < 0 || resolve(m, m->layers[end].y) == t || !st_recompute_one_block(m, t))
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
        const size_t need = tensor_floats(m, t);
        slot[t] = take_buffer(size, busy, &buffers, need, first[t], last[t]);
    }
    /* the gradients, largest first (then by id), so that the large ones
     * take the large buffers: busy[b] = INT_MAX once one has taken buffer
     * b (the forward tenants' spans all end before).  With recomputation
     * a block's forward runs again during the backward: the gradients
     * take buffers of their own. */
    const int n_fwd = n;
    for (int b = 0; b < buffers && m->n_blocks; b++)
        busy[b] = INT_MAX;
    for (int t = 0; t < T; t++)
        if (backward_only(m, t)) {
            first[t] = 0;
            last[t] = 0;
            int j = n++;
            const size_t w = tensor_floats(m, t);
            for (; j > n_fwd && tensor_floats(m, order[j - 1]) < w; j--)
                order[j] = order[j - 1];
            order[j] = t;
        }
    for (int i = n_fwd; i < n; i++) {
        const int t = order[i];
        const size_t need = tensor_floats(m, t);
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

/* m->grads_final: for each layer i, the start of the longest tail of the
 * gradient vector whose segments all belong to layers i, i + 1, ...: the
 * backward runs the layers from the last, and a segment's gradient is
 * written by its own layer's backward alone (a kind whose primitive
 * computes more writes a scratch and copies its part out in that same
 * backward), so after layer i that tail is final. */
static st_status grads_final(st_model *m)
{
    void *p;
    ST_TRY(st_arena_alloc(m->arena, ST_MEM_WORKSPACE,
                          (size_t)(m->n_layers > 0 ? m->n_layers : 1) * sizeof(size_t), &p));
    m->grads_final = p;
    int *owner = malloc((size_t)(m->n_segs > 0 ? m->n_segs : 1) * sizeof *owner);
    if (!owner)
        return st_fail(ST_ERR_NOMEM, "out of memory laying out the gradients");
    for (int s = 0; s < m->n_segs; s++)
        owner[s] = -1;   /* no layer's: never final before the end */
    for (int i = 0; i < m->n_layers; i++)
        for (int k = 0; k < 2; k++)
            if (!m->layers[i].dropped && m->layers[i].seg[k] != (size_t)-1)
                owner[m->layers[i].seg[k]] = i;
    for (int i = 0; i < m->n_layers; i++) {
        /* walk the segments down from the end of the gradient vector */
        size_t from = m->n_grads;
        for (;;) {
            int below = -1;
            for (int s = 0; s < m->n_segs; s++) {
                const st_param_segment *g = &m->segs[s];
                if (g->grad_offset != ST_NO_GRAD && g->grad_offset < from &&
                    (below < 0 || g->grad_offset > m->segs[below].grad_offset))
                    below = s;
            }
            if (below < 0 || owner[below] < i ||
                m->segs[below].grad_offset + m->segs[below].grad_count != from)
                break;
            from = m->segs[below].grad_offset;
        }
        m->grads_final[i] = from;
    }
    free(owner);
    return ST_OK;
}

static st_status build(st_model *m)
{
    prune_input_gradients(m);
    ST_TRY(st_graph_half(m));
    ST_TRY(st_recompute_plan(m));
    if (m->storage.params && m->storage.count != m->n_params)
        return st_fail(ST_ERR_INVALID, "storage of %zu parameters for a model of %zu",
                       m->storage.count, m->n_params);
    if (m->storage.params) {
        /* shared storage: the layers built below read (and their bf16
         * copies live) where every instance over it does */
        m->params = m->storage.params;
        if (m->storage.bf16 && !(m->cfg.unfuse & ST_UNFUSE_WEIGHT_COPY)) {
            m->ctx.copy_base = m->params;
            m->ctx.copy_store = m->storage.bf16;
            m->ctx.copy_n = m->n_params;
        }
        if (m->storage.blocked && !(m->cfg.unfuse & ST_UNFUSE_WEIGHT_COPY)) {
            m->ctx.blocked_store = m->storage.blocked;
            m->ctx.params = m->params;
            m->ctx.params_n = m->n_params;
        }
    } else {
        ST_TRY(st_arena_alloc_floats(m->arena, ST_MEM_WEIGHTS, m->n_params, &m->params));
    }
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
            st_recompute_open_tensor(m, t);
            ST_TRY(st_graph_alloc(m, tensor_floats(m, t), &m->tensors[t].data));
            st_recompute_close(m);
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
    /* a layer's own saved buffers are its block's (recomputation) */
    for (int i = 0; i < m->n_layers; i++) {
        st_layer *l = &m->layers[i];
        st_recompute_open_layer(m, i);
        if (!l->dropped && l->kind->alloc)
            ST_TRY(l->kind->alloc(m, l));
    }
    for (int i = 0; i < m->n_layers; i++) {
        st_layer *l = &m->layers[i];
        st_recompute_open_layer(m, i);
        if (!l->dropped)
            ST_TRY(l->kind->build(m, l));
    }
    return grads_final(m);
}

st_status st_graph_build(st_model *m)
{
    const st_status s = build(m);
    st_recompute_close(m);
    st_recompute_done(m);
    return s;
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
    return st_graph_backward_ready(m, NULL, NULL);
}

st_status st_graph_backward_ready(const st_model *m, void (*ready)(void *ctx, size_t from),
                                  void *ctx)
{
    size_t told = m->n_grads;
    for (int i = m->n_layers - 1; i >= 0; i--) {
        const st_layer *l = &m->layers[i];
        ST_TRY(st_recompute_before(m, i));
        if (l->backward && l->kind->backward)
            ST_TRY(l->kind->backward(&m->ctx, l));
        if (ready && m->grads_final[i] < told) {
            told = m->grads_final[i];
            ready(ctx, told);
        }
    }
    if (ready && told > 0)   /* what no layer's tail reached (no gradient, gaps) */
        ready(ctx, 0);
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

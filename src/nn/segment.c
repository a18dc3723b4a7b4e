/*
 * nn/segment.c — a segment of an mlp (segment.h) is an instance of a run
 * of the model's own layer table (nn/graph.h): everything after the linear
 * layer of the cut before it, through its last linear layer.  The graph
 * lays it out (the full model's names, offsets and initial values), takes
 * its buffers, builds its primitives and runs it; a segment adds only its
 * loss: MSE to a target, or cross-entropy for the one that ends with the
 * head.  Nobody needs the gradient of a segment's input, so the graph
 * computes none (the activation after the cut has no backward, the first
 * linear layer no data gradient).
 *
 * Buffers (floats), width W, batch B: those of the layers (graph.c: input,
 * a_j, z_j, shared dz, da), and the MSE target (B, W) or the labels and
 * log-probabilities (B, K).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/graph.h"
#include "nn/layers.h"
#include "nn/layers/mse.h"
#include "nn/segment.h"

struct st_segnet {
    st_segment_config cfg;
    int batch, in_dim, out_dim, last_is_head;
    st_model *m;                  /* the layers, an instance of a range */
    float *input, *output, *dout; /* the range's input, output and its gradient */
    float *target;                /* MSE */
    int32_t *labels;              /* cross-entropy */
    float *logp;
    st_mse mse;
    st_xent xent;
};

void st_segment_layer_shape(const st_model_config *m, int l, int *in, int *out)
{
    *in = l == 1 ? m->in_dim : m->width;
    *out = l == m->depth + 1 ? m->n_classes : m->width;
}

size_t st_segment_params(const st_model_config *m, int first, int last)
{
    size_t n = 0;
    for (int l = first; l <= last; l++) {
        int in, out;
        st_segment_layer_shape(m, l, &in, &out);
        n += (size_t)in * (size_t)out + (size_t)out;   /* weight (out, in), bias (out) */
    }
    return n;
}

double st_segment_flops(const st_model_config *m, int first, int last, int batch)
{
    double f = 0.0;
    for (int l = first; l <= last; l++) {
        int in, out;
        st_segment_layer_shape(m, l, &in, &out);
        /* forward and weight gradient; the input gradient except for the
         * segment's first layer; 2 FLOPs per multiply-add */
        f += 2.0 * (double)batch * (double)in * (double)out * (l == first ? 2.0 : 3.0);
    }
    return f;
}

static st_status check(const st_segment_config *c)
{
    ST_TRY(st_model_config_check(&c->model));
    if (strcmp(st_model_kind_name(c->model.kind), "mlp") != 0)
        return st_fail(ST_ERR_INVALID, "segments are cut from an mlp, not a %s",
                       st_model_kind_name(c->model.kind));
    if (c->first < 1 || c->last < c->first || c->last > c->model.depth + 1)
        return st_fail(ST_ERR_INVALID, "a segment of layers %d .. %d is not within the mlp's "
                       "layers 1 .. %d", c->first, c->last, c->model.depth + 1);
    return ST_OK;
}

st_status st_segnet_create(const st_segment_config *cfg, int batch, st_arena *arena,
                           st_segnet **out)
{
    *out = NULL;
    ST_TRY(check(cfg));
    if (batch < 1 || batch > (1 << 20))
        return st_fail(ST_ERR_INVALID, "batch must be in [1, 2^20], got %d", batch);
    /* the run of the table: after the cut's linear layer, through the last */
    const int lo = cfg->first > 1
                 ? st_model_layer_index(&cfg->model, &st_layer_linear, cfg->first - 2) + 1 : 0;
    const int hi = st_model_layer_index(&cfg->model, &st_layer_linear, cfg->last - 1);
    if (lo < 0 || hi < lo)
        return st_fail(ST_ERR_INVALID, "layers %d .. %d of the mlp not found", cfg->first,
                       cfg->last);
    st_segnet *s = calloc(1, sizeof *s);
    if (!s)
        return st_fail(ST_ERR_NOMEM, "out of memory creating a segment");
    s->cfg = *cfg;
    s->batch = batch;
    s->last_is_head = cfg->last == cfg->model.depth + 1;
    int unused;
    st_segment_layer_shape(&cfg->model, cfg->first, &s->in_dim, &unused);
    st_segment_layer_shape(&cfg->model, cfg->last, &unused, &s->out_dim);
    st_status st;
    ST_TRY_GOTO(st, st_model_create_range(&cfg->model, lo, hi, batch, arena, &s->m), fail);
    st_model *m = s->m;
    s->input = st_graph_data(m, m->layers[lo].x);
    s->output = st_graph_data(m, m->layers[hi].y);
    s->dout = st_graph_data(m, m->layers[hi].dy);
    const size_t B = (size_t)batch, D = (size_t)s->out_dim;
    if (s->last_is_head) {
        ST_TRY_GOTO(st, st_arena_alloc(arena, ST_MEM_ACTIVATIONS, B * sizeof(int32_t),
                                       (void **)&s->labels), fail);
        ST_TRY_GOTO(st, st_graph_alloc(m, B * D, &s->logp), fail);
        ST_TRY_GOTO(st, st_xent_build(&m->ctx, &s->xent, batch, s->out_dim, s->output, s->logp,
                                      s->dout), fail);
    } else {
        ST_TRY_GOTO(st, st_graph_alloc(m, B * D, &s->target), fail);
        st_mse_build(&s->mse, batch, s->out_dim, s->output, s->target, s->dout);
    }
    ST_TRY_GOTO(st, st_nn_ctx_finalize(&m->ctx), fail);
    *out = s;
    return ST_OK;
fail:
    st_segnet_destroy(s);
    return st;
}

void st_segnet_destroy(st_segnet *s)
{
    if (!s)
        return;
    st_model_destroy(s->m);
    free(s);
}

/* The full mlp's initial values: the graph draws every element from its
 * full tensor's stream at its full position (nn/model.c). */
void st_segnet_init_params(st_segnet *s, uint64_t seed)
{
    st_model_init_params(s->m, seed);
}

int st_segnet_batch(const st_segnet *s) { return s->batch; }
int st_segnet_in_dim(const st_segnet *s) { return s->in_dim; }
int st_segnet_out_dim(const st_segnet *s) { return s->out_dim; }
int st_segnet_is_last(const st_segnet *s) { return s->last_is_head; }
float *st_segnet_input(st_segnet *s) { return s->input; }
float *st_segnet_target(st_segnet *s) { return s->target; }
int32_t *st_segnet_labels(st_segnet *s) { return s->labels; }
const float *st_segnet_output(const st_segnet *s) { return s->output; }
float *st_segnet_params(st_segnet *s) { return s->m->params; }
st_model *st_segnet_model(st_segnet *s) { return s->m; }
float *st_segnet_grads(st_segnet *s) { return s->m->grads; }
size_t st_segnet_param_count(const st_segnet *s) { return s->m->n_params; }
size_t st_segnet_full_offset(const st_segnet *s) { return s->m->maps[0].full_offset; }

const st_param_segment *st_segnet_segments(const st_segnet *s, int *count)
{
    *count = s->m->n_segs;
    return s->m->segs;
}

st_status st_segnet_forward(st_segnet *s)
{
    return st_graph_forward(s->m, ST_PHASE_INFER);
}

st_status st_segnet_forward_backward(st_segnet *s, float *loss)
{
    return st_segnet_forward_backward_ready(s, loss, NULL, NULL);
}

st_status st_segnet_forward_backward_ready(st_segnet *s, float *loss,
                                           void (*ready)(void *ctx, size_t from), void *ctx)
{
    double sum;
    ST_TRY(st_model_train_forward(s->m));
    if (s->last_is_head)
        ST_TRY(st_xent_forward(&s->m->ctx, &s->xent, s->labels, s->batch, 1, &sum, NULL));
    else
        ST_TRY(st_mse_forward(&s->mse, s->batch, 1, &sum));
    *loss = (float)(sum / s->batch);
    return st_graph_backward_ready(s->m, ready, ctx);
}

double st_segnet_step_flops(const st_segnet *s)
{
    return st_graph_flops(s->m);
}

int st_segnet_step_costs(const st_segnet *s, st_step_cost *out, int cap)
{
    st_cost_sink sink = { out, cap, 0 };
    sink.n = st_model_step_costs(s->m, out, cap);
    const double y = (double)s->batch * (double)s->out_dim;
    if (s->last_is_head)
        st_cost_xent(&sink, y);
    else                     /* MSE: y and t read, dy written */
        st_cost_move(&sink, 12.0 * y, 1.0);
    return sink.n;
}

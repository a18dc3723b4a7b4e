/*
 * nn/segment.c — building and running a segment of an mlp (segment.h).
 *
 * The same build order as a model instance (nn/model.c): lay out the
 * parameters, take every buffer from the arena, build the primitives
 * against those buffers, then share one workspace among them.
 *
 * Buffers (floats), n linear layers, width W, batch B:
 *   input (B, in), z0 = act(input) (B, W) when the segment starts at a cut,
 *   a_j, z_j (B, W) for the n - 1 hidden layers inside, output and dout
 *   (B, out), the MSE target (B, W) or the labels and log-probabilities
 *   (B, K), and two shared data-gradient buffers dz, da (B, W).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/rng.h>

#include "core/rng_streams.h"
#include "nn/layers.h"
#include "nn/mse.h"
#include "nn/segment.h"

typedef struct seg_layer {
    st_linear fc;
    st_act act;        /* after fc, except for the segment's last layer */
    float *a, *z;      /* (B, W): fc's output and act's (hidden layers only) */
    int in, out;
    int index;         /* 1-based layer number in the full mlp */
} seg_layer;

struct st_segnet {
    st_segment_config cfg;
    int batch, n, in_dim, out_dim, last_is_head;
    st_arena *arena;
    st_nn_ctx ctx;
    float *params, *grads;
    size_t n_params, full_offset;
    st_param_segment *segs;       /* 2 n: weight, bias of each layer */
    seg_layer *layers;            /* n */
    st_act lead;                  /* act(input) when first > 1 */
    float *input, *z0, *output, *dout, *dz, *da;
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
    if (c->model.kind != ST_MODEL_MLP)
        return st_fail(ST_ERR_INVALID, "segments are cut from an mlp, not a %s",
                       st_model_kind_name(c->model.kind));
    if (c->first < 1 || c->last < c->first || c->last > c->model.depth + 1)
        return st_fail(ST_ERR_INVALID, "a segment of layers %d .. %d is not within the mlp's "
                       "layers 1 .. %d", c->first, c->last, c->model.depth + 1);
    return ST_OK;
}

/* The parameter layout, before any memory: the full mlp's names and order,
 * offsets local to the segment. */
static st_status layout(st_segnet *s)
{
    const st_model_config *m = &s->cfg.model;
    s->segs = calloc((size_t)(2 * s->n), sizeof *s->segs);
    s->layers = calloc((size_t)s->n, sizeof *s->layers);
    if (!s->segs || !s->layers)
        return st_fail(ST_ERR_NOMEM, "out of memory building a segment");
    s->full_offset = st_segment_params(m, 1, s->cfg.first - 1);
    for (int j = 0; j < s->n; j++) {
        seg_layer *L = &s->layers[j];
        L->index = s->cfg.first + j;
        st_segment_layer_shape(m, L->index, &L->in, &L->out);
        char prefix[16];
        if (L->index == m->depth + 1)
            snprintf(prefix, sizeof prefix, "head");
        else
            snprintf(prefix, sizeof prefix, "fc%d", L->index - 1);
        st_param_segment *w = &s->segs[2 * j], *b = &s->segs[2 * j + 1];
        snprintf(w->name, sizeof w->name, "%s.weight", prefix);
        w->offset = s->n_params;
        w->count = (size_t)L->in * (size_t)L->out;
        w->decay = 1;
        w->grad_offset = w->offset;
        s->n_params += w->count;
        snprintf(b->name, sizeof b->name, "%s.bias", prefix);
        b->offset = s->n_params;
        b->count = (size_t)L->out;
        b->decay = 0;
        b->grad_offset = b->offset;
        s->n_params += b->count;
    }
    return ST_OK;
}

static st_status alloc_act(st_segnet *s, size_t count, float **out)
{
    return st_arena_alloc_floats(s->arena, ST_MEM_ACTIVATIONS, count, out);
}

static st_status alloc_buffers(st_segnet *s)
{
    const size_t B = (size_t)s->batch, W = (size_t)s->cfg.model.width;
    ST_TRY(st_arena_alloc_floats(s->arena, ST_MEM_WEIGHTS, s->n_params, &s->params));
    ST_TRY(st_arena_alloc_floats(s->arena, ST_MEM_GRADIENTS, s->n_params, &s->grads));
    ST_TRY(alloc_act(s, B * (size_t)s->in_dim, &s->input));
    if (s->cfg.first > 1)
        ST_TRY(alloc_act(s, B * W, &s->z0));
    for (int j = 0; j + 1 < s->n; j++) {
        ST_TRY(alloc_act(s, B * W, &s->layers[j].a));
        ST_TRY(alloc_act(s, B * W, &s->layers[j].z));
    }
    ST_TRY(alloc_act(s, B * (size_t)s->out_dim, &s->output));
    ST_TRY(alloc_act(s, B * (size_t)s->out_dim, &s->dout));
    if (s->n > 1) {
        ST_TRY(alloc_act(s, B * W, &s->dz));
        ST_TRY(alloc_act(s, B * W, &s->da));
    }
    if (!s->last_is_head)
        return alloc_act(s, B * (size_t)s->out_dim, &s->target);
    ST_TRY(st_arena_alloc(s->arena, ST_MEM_ACTIVATIONS, B * sizeof(int32_t),
                          (void **)&s->labels));
    return alloc_act(s, B * (size_t)s->out_dim, &s->logp);
}

/* Going backward, layer j's dy is da (dout for the last) and its dx is dz
 * (none for the first: nobody needs the segment's input gradient); the
 * activation after layer j turns dz back into da. */
static st_status build_layers(st_segnet *s)
{
    const int64_t B = s->batch, W = s->cfg.model.width;
    const float *x = s->input;
    if (s->cfg.first > 1) {
        ST_TRY(st_act_build(&s->ctx, &s->lead, s->cfg.model.activation, B, W, s->input, s->z0,
                            NULL, NULL));
        x = s->z0;
    }
    for (int j = 0; j < s->n; j++) {
        seg_layer *L = &s->layers[j];
        const int last = j + 1 == s->n;
        st_linear_io io = {
            .x = x, .y = last ? s->output : L->a,
            .dx = j == 0 ? NULL : s->dz, .dy = last ? s->dout : s->da,
            .w = s->params + s->segs[2 * j].offset, .b = s->params + s->segs[2 * j + 1].offset,
            .dw = s->grads + s->segs[2 * j].offset, .db = s->grads + s->segs[2 * j + 1].offset,
        };
        ST_TRY(st_linear_build(&s->ctx, &L->fc, B, L->in, L->out, &io));
        if (last)
            break;
        ST_TRY(st_act_build(&s->ctx, &L->act, s->cfg.model.activation, B, W, L->a, L->z, s->da,
                            s->dz));
        x = L->z;
    }
    if (s->last_is_head)
        return st_xent_build(&s->ctx, &s->xent, B, s->out_dim, s->output, s->logp, s->dout);
    st_mse_build(&s->mse, B, s->out_dim, s->output, s->target, s->dout);
    return ST_OK;
}

st_status st_segnet_create(const st_segment_config *cfg, int batch, st_arena *arena,
                           st_segnet **out)
{
    *out = NULL;
    ST_TRY(check(cfg));
    if (batch < 1 || batch > (1 << 20))
        return st_fail(ST_ERR_INVALID, "batch must be in [1, 2^20], got %d", batch);
    st_segnet *s = calloc(1, sizeof *s);
    if (!s)
        return st_fail(ST_ERR_NOMEM, "out of memory creating a segment");
    s->cfg = *cfg;
    s->batch = batch;
    s->arena = arena;
    s->n = cfg->last - cfg->first + 1;
    s->last_is_head = cfg->last == cfg->model.depth + 1;
    int unused;
    st_segment_layer_shape(&cfg->model, cfg->first, &s->in_dim, &unused);
    st_segment_layer_shape(&cfg->model, cfg->last, &unused, &s->out_dim);
    st_status st;
    ST_TRY_GOTO(st, st_nn_ctx_init(&s->ctx, arena), fail);
    ST_TRY_GOTO(st, layout(s), fail);
    ST_TRY_GOTO(st, alloc_buffers(s), fail);
    ST_TRY_GOTO(st, build_layers(s), fail);
    ST_TRY_GOTO(st, st_nn_ctx_finalize(&s->ctx), fail);
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
    st_nn_ctx_destroy(&s->ctx);
    free(s->segs);
    free(s->layers);
    free(s);
}

/* The full mlp's initialisation (nn/model.c, st_model_init_params): tensor
 * i of its layout (weight of layer l: 2 (l - 1), its bias: 2 (l - 1) + 1)
 * draws from stream i of the "init" namespace, U(-1/sqrt(fan_in),
 * 1/sqrt(fan_in)).  tests/test_synth.c checks that the two agree. */
void st_segnet_init_params(st_segnet *s, uint64_t seed)
{
    st_rng root = st_rng_seed(seed);
    st_rng init_root = st_rng_split(&root, ST_RNG_STREAM_INIT);
    for (int i = 0; i < 2 * s->n; i++) {
        const st_param_segment *g = &s->segs[i];
        const seg_layer *L = &s->layers[i / 2];
        float bound = 1.0f / sqrtf((float)L->in);
        st_rng r = st_rng_split(&init_root, (uint64_t)(2 * (L->index - 1) + i % 2));
        float *p = s->params + g->offset;
        for (size_t k = 0; k < g->count; k++)
            p[k] = (2.0f * st_rng_uniform(&r) - 1.0f) * bound;
    }
}

int st_segnet_batch(const st_segnet *s) { return s->batch; }
int st_segnet_in_dim(const st_segnet *s) { return s->in_dim; }
int st_segnet_out_dim(const st_segnet *s) { return s->out_dim; }
int st_segnet_is_last(const st_segnet *s) { return s->last_is_head; }
float *st_segnet_input(st_segnet *s) { return s->input; }
float *st_segnet_target(st_segnet *s) { return s->target; }
int32_t *st_segnet_labels(st_segnet *s) { return s->labels; }
const float *st_segnet_output(const st_segnet *s) { return s->output; }
float *st_segnet_params(st_segnet *s) { return s->params; }
float *st_segnet_grads(st_segnet *s) { return s->grads; }
size_t st_segnet_param_count(const st_segnet *s) { return s->n_params; }
size_t st_segnet_full_offset(const st_segnet *s) { return s->full_offset; }

const st_param_segment *st_segnet_segments(const st_segnet *s, int *count)
{
    *count = 2 * s->n;
    return s->segs;
}

st_status st_segnet_forward(st_segnet *s)
{
    if (s->cfg.first > 1)
        ST_TRY(st_act_forward(&s->ctx, &s->lead));
    for (int j = 0; j < s->n; j++) {
        ST_TRY(st_linear_forward(&s->ctx, &s->layers[j].fc));
        if (j + 1 < s->n)
            ST_TRY(st_act_forward(&s->ctx, &s->layers[j].act));
    }
    return ST_OK;
}

st_status st_segnet_forward_backward(st_segnet *s, float *loss)
{
    double sum;
    ST_TRY(st_segnet_forward(s));
    if (s->last_is_head)
        ST_TRY(st_xent_forward(&s->ctx, &s->xent, s->labels, s->batch, 1, &sum, NULL));
    else
        ST_TRY(st_mse_forward(&s->mse, s->batch, 1, &sum));
    *loss = (float)(sum / s->batch);
    ST_TRY(st_linear_backward(&s->ctx, &s->layers[s->n - 1].fc));     /* dout -> dz */
    for (int j = s->n - 2; j >= 0; j--) {
        ST_TRY(st_act_backward(&s->ctx, &s->layers[j].act));          /* dz -> da */
        ST_TRY(st_linear_backward(&s->ctx, &s->layers[j].fc));        /* da -> dz */
    }
    return ST_OK;
}

double st_segnet_step_flops(const st_segnet *s)
{
    return st_segment_flops(&s->cfg.model, s->cfg.first, s->cfg.last, s->batch);
}

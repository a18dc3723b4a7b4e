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
    return ST_OK;
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

const char *st_model_kind_name(st_model_kind kind)
{
    return kind == ST_MODEL_MLP ? "mlp" : kind == ST_MODEL_RESMLP ? "resmlp" : "unknown";
}

const char *st_activation_name(st_activation act)
{
    return act == ST_ACT_RELU ? "relu" : act == ST_ACT_GELU ? "gelu" : "unknown";
}

int st_model_kind_parse(const char *name, st_model_kind *out)
{
    if (strcmp(name, "mlp") == 0) { *out = ST_MODEL_MLP; return 0; }
    if (strcmp(name, "resmlp") == 0) { *out = ST_MODEL_RESMLP; return 0; }
    return -1;
}

int st_activation_parse(const char *name, st_activation *out)
{
    if (strcmp(name, "relu") == 0) { *out = ST_ACT_RELU; return 0; }
    if (strcmp(name, "gelu") == 0) { *out = ST_ACT_GELU; return 0; }
    return -1;
}

static int hidden_of(const st_model_config *c)
{
    return c->hidden > 0 ? c->hidden : c->width;
}

/* ------------------------------------------------------------ parameter layout */

/* Appends a segment and returns its offset; sizes only, no memory yet. */
static st_status add_segment(st_model *m, const char *name, size_t count, int decay,
                             size_t *offset)
{
    if (m->n_segs == m->cap_segs) {
        int cap = m->cap_segs ? 2 * m->cap_segs : 16;
        st_param_segment *s = realloc(m->segs, (size_t)cap * sizeof *s);
        if (!s)
            return st_fail(ST_ERR_NOMEM, "out of memory laying out parameters");
        m->segs = s;
        m->cap_segs = cap;
    }
    st_param_segment *s = &m->segs[m->n_segs++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->offset = m->n_params;
    s->count = count;
    s->decay = decay;
    s->grad_offset = m->layout_grads ? m->n_grads : ST_NO_GRAD;
    *offset = (size_t)(s - m->segs);   /* the segment's index, see seg_params */
    m->n_params += count;
    if (m->layout_grads)
        m->n_grads += count;
    return ST_OK;
}

/* One linear layer's weight and bias: their segment indices. */
typedef struct { size_t w, b; } linear_offsets;
typedef struct { size_t gamma, beta; } norm_offsets;

static st_status layout_linear(st_model *m, const char *prefix, size_t in, size_t out,
                               linear_offsets *o)
{
    char name[40];
    snprintf(name, sizeof name, "%s.weight", prefix);
    ST_TRY(add_segment(m, name, in * out, 1, &o->w));
    snprintf(name, sizeof name, "%s.bias", prefix);
    return add_segment(m, name, out, 0, &o->b);
}

static st_status layout_norm(st_model *m, const char *prefix, size_t c, norm_offsets *o)
{
    char name[40];
    snprintf(name, sizeof name, "%s.gamma", prefix);
    ST_TRY(add_segment(m, name, c, 0, &o->gamma));
    snprintf(name, sizeof name, "%s.beta", prefix);
    return add_segment(m, name, c, 0, &o->beta);
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

static st_linear_io linear_io(const st_model *m, linear_offsets o, const float *x, float *y,
                              float *dx, const float *dy)
{
    st_linear_io io = {
        .x = x, .y = y, .dx = dx, .dy = dy,
        .w = seg_params(m, o.w), .b = seg_params(m, o.b),
        .dw = seg_grads(m, o.w), .db = seg_grads(m, o.b),
    };
    return io;
}

static st_status alloc_act(st_model *m, size_t count, float **out)
{
    return st_arena_alloc_floats(m->arena, ST_MEM_ACTIVATIONS, count, out);
}

/* ------------------------------------------------------------ mlp */

static st_status build_mlp(st_model *m)
{
    const size_t B = (size_t)m->batch, W = (size_t)m->cfg.width, L = (size_t)m->cfg.depth;
    linear_offsets *lo = calloc(L + 1, sizeof *lo);
    m->dense = calloc(L, sizeof *m->dense);
    if (!lo || !m->dense) {
        free(lo);
        return st_fail(ST_ERR_NOMEM, "out of memory building the mlp");
    }
    st_status s = ST_OK;
    char name[32];
    for (size_t i = 0; i <= L && s == ST_OK; i++) {
        size_t in = i == 0 ? (size_t)m->cfg.in_dim : W, out = i == L ? (size_t)m->cfg.n_classes : W;
        snprintf(name, sizeof name, i == L ? "head" : "fc%zu", i);
        s = layout_linear(m, name, in, out, &lo[i]);
    }
    if (s == ST_OK)
        s = st_arena_alloc_floats(m->arena, ST_MEM_WEIGHTS, m->n_params, &m->params);
    if (s == ST_OK)
        s = st_arena_alloc_floats(m->arena, ST_MEM_GRADIENTS, m->n_grads, &m->grads);
    for (size_t i = 0; i < L && s == ST_OK; i++) {
        s = alloc_act(m, B * W, &m->dense[i].a);
        if (s == ST_OK)
            s = alloc_act(m, B * W, &m->dense[i].z);
    }
    /* Two shared data-gradient buffers, used alternately going backward:
     * a layer's dz feeds the activation, whose da feeds the linear below. */
    if (s == ST_OK)
        s = alloc_act(m, B * W, &m->dz);
    if (s == ST_OK)
        s = alloc_act(m, B * W, &m->da);

    for (size_t i = 0; i < L && s == ST_OK; i++) {
        st_dense *d = &m->dense[i];
        const float *x = i == 0 ? m->input : m->dense[i - 1].z;
        int64_t in = i == 0 ? m->cfg.in_dim : (int64_t)W;
        st_linear_io io = linear_io(m, lo[i], x, d->a, i == 0 ? NULL : m->dz, m->da);
        s = st_linear_build(&m->ctx, &d->fc, (int64_t)B, in, (int64_t)W, &io);
        if (s == ST_OK)
            s = st_act_build(&m->ctx, &d->act, m->cfg.activation, (int64_t)B, (int64_t)W,
                             d->a, d->z, m->da, m->dz);
    }
    if (s == ST_OK) {
        st_linear_io io = linear_io(m, lo[L], m->dense[L - 1].z, m->logits, m->dz, m->dlogits);
        s = st_linear_build(&m->ctx, &m->head, (int64_t)B, (int64_t)W, m->cfg.n_classes, &io);
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

static st_status layout_resmlp(st_model *m, linear_offsets *stem, block_offsets *bo,
                               norm_offsets *lnf, linear_offsets *head)
{
    const size_t W = (size_t)m->cfg.width, H = (size_t)hidden_of(&m->cfg);
    char name[32];
    ST_TRY(layout_linear(m, "stem", (size_t)m->cfg.in_dim, W, stem));
    for (int l = 0; l < m->cfg.depth; l++) {
        int id = m->block_ids[l];
        m->layout_grads = m->grad_blocks[l];
        snprintf(name, sizeof name, "block%d.ln", id);
        ST_TRY(layout_norm(m, name, W, &bo[l].ln));
        snprintf(name, sizeof name, "block%d.fc1", id);
        ST_TRY(layout_linear(m, name, W, H, &bo[l].fc1));
        snprintf(name, sizeof name, "block%d.fc2", id);
        ST_TRY(layout_linear(m, name, H, W, &bo[l].fc2));
    }
    m->layout_grads = 1;
    ST_TRY(layout_norm(m, "final_ln", W, lnf));
    return layout_linear(m, "head", W, (size_t)m->cfg.n_classes, head);
}

static st_status alloc_resmlp_buffers(st_model *m)
{
    const size_t B = (size_t)m->batch, W = (size_t)m->cfg.width, H = (size_t)hidden_of(&m->cfg);
    ST_TRY(alloc_act(m, B * W, &m->h0));
    for (int l = 0; l < m->cfg.depth; l++) {
        st_resblock *k = &m->blocks[l];
        ST_TRY(alloc_act(m, B * W, &k->n));
        ST_TRY(alloc_act(m, B, &k->mean));
        ST_TRY(alloc_act(m, B, &k->var));
        ST_TRY(alloc_act(m, B * H, &k->a));
        ST_TRY(alloc_act(m, B * H, &k->z));
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

static st_status build_block(st_model *m, st_resblock *k, const float *h_in, block_offsets o)
{
    const int64_t B = m->batch, W = m->cfg.width, H = hidden_of(&m->cfg);
    st_layernorm_io nio = norm_io(m, o.ln, h_in, k->n, k->mean, k->var, m->dtmp, m->dn);
    ST_TRY(st_layernorm_build(&m->ctx, &k->ln, B, W, &nio));
    st_linear_io io1 = linear_io(m, o.fc1, k->n, k->a, m->dn, m->da);
    ST_TRY(st_linear_build(&m->ctx, &k->fc1, B, W, H, &io1));
    ST_TRY(st_act_build(&m->ctx, &k->act, m->cfg.activation, B, H, k->a, k->z, m->da, m->dz));
    st_linear_io io2 = linear_io(m, o.fc2, k->z, k->h_out, m->dz, m->dh);
    io2.residual = h_in;
    io2.scale = m->cfg.branch_scale;
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
        ST_TRY_GOTO(s, build_block(m, &m->blocks[l], h, bo[l]), done);
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
    m->arena = arena;
    st_status s;
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

void st_model_destroy(st_model *m)
{
    if (!m)
        return;
    st_nn_ctx_destroy(&m->ctx);
    free(m->segs);
    free(m->block_ids);
    free(m->grad_blocks);
    free(m->dense);
    free(m->blocks);
    free(m);
}

/* Norm parameters are recognised by name: gamma = 1, beta = 0. */
static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* resmlp lays out 2 stem segments, 6 per block, then 4 (final norm, head).
 * A subnetwork's segment i is segment full_segment_index(i) of the full
 * model: that index names the RNG stream it is initialised from. */
enum { STEM_SEGS = 2, BLOCK_SEGS = 6 };

static uint64_t full_segment_index(const st_model *m, int i)
{
    if (m->cfg.kind != ST_MODEL_RESMLP || i < STEM_SEGS)
        return (uint64_t)i;
    int l = (i - STEM_SEGS) / BLOCK_SEGS;
    if (l < m->cfg.depth)
        return (uint64_t)(STEM_SEGS + BLOCK_SEGS * m->block_ids[l] + (i - STEM_SEGS) % BLOCK_SEGS);
    return (uint64_t)(i + BLOCK_SEGS * (m->full_depth - m->cfg.depth));
}

void st_model_init_params(st_model *m, uint64_t seed)
{
    st_rng root = st_rng_seed(seed);
    st_rng init_root = st_rng_split(&root, 0x1A17); /* the "init" namespace */
    for (int i = 0; i < m->n_segs; i++) {
        const st_param_segment *s = &m->segs[i];
        float *p = m->params + s->offset;
        if (ends_with(s->name, ".gamma")) {
            for (size_t j = 0; j < s->count; j++)
                p[j] = 1.0f;
            continue;
        }
        if (ends_with(s->name, ".beta")) {
            memset(p, 0, s->count * sizeof *p);
            continue;
        }
        /* Weight and bias of a linear layer share the fan-in of the weight,
         * which is the segment just before a bias. */
        size_t fan_in = ends_with(s->name, ".bias")
                      ? m->segs[i - 1].count / s->count
                      : s->count / m->segs[i + 1].count;
        float bound = 1.0f / sqrtf((float)fan_in);
        st_rng r = st_rng_split(&init_root, full_segment_index(m, i));
        for (size_t j = 0; j < s->count; j++)
            p[j] = (2.0f * st_rng_uniform(&r) - 1.0f) * bound;
    }
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

/* Where segment i starts in the full model's vector. */
static size_t full_offset(const st_model *m, int i)
{
    const size_t W = (size_t)m->cfg.width, H = (size_t)hidden_of(&m->cfg);
    const size_t stem = (size_t)m->cfg.in_dim * W + W;
    const size_t block = 2 * W + (W * H + H) + (H * W + W);
    const st_param_segment *s = &m->segs[i];
    int l = (i - STEM_SEGS) / BLOCK_SEGS;
    if (m->cfg.kind != ST_MODEL_RESMLP || i < STEM_SEGS)
        return s->offset;
    if (l < m->cfg.depth)
        return stem + (size_t)m->block_ids[l] * block + (s->offset - stem - (size_t)l * block);
    return s->offset + (size_t)(m->full_depth - m->cfg.depth) * block;
}

/* Segments of one vector (parameters, or gradients: grads) as full-layout
 * ranges; consecutive segments whose full positions are consecutive too
 * make one range. */
static int full_ranges(const st_model *m, int grads, st_range *ranges, size_t *local, int cap)
{
    int n = 0;
    for (int i = 0; i < m->n_segs; i++) {
        const st_param_segment *s = &m->segs[i];
        size_t pos = grads ? s->grad_offset : s->offset;
        if (pos == ST_NO_GRAD)
            continue;
        size_t full = full_offset(m, i);
        if (n > 0 && ranges[n - 1].end == full &&
            local[n - 1] + (ranges[n - 1].end - ranges[n - 1].begin) == pos) {
            ranges[n - 1].end += s->count;
            continue;
        }
        if (n == cap)
            return -1;
        ranges[n] = (st_range){ full, full + s->count };
        local[n] = pos;
        n++;
    }
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
    return one * (1.0 + (l->has_dx ? 1.0 : 0.0) + (l->has_dw ? 1.0 : 0.0));
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

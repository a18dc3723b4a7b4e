/*
 * nn/layers/batchnorm.c — batch normalisation of NCHW activations per
 * channel, with a learned scale (gamma) and shift (beta), on oneDNN
 * batch_normalization primitives; optionally with the following ReLU fused
 * in (oneDNN's fuse_norm_relu: the forward keeps a bit mask of the cut
 * outputs in a workspace, the backward applies it to dy).
 *
 * Three primitives, made once: the training forward (batch statistics,
 * written to the caller's mean/var for the backward), the inference forward
 * (the running statistics, use_global_stats) and the backward of the
 * training forward.  The running statistics are updated after the training
 * forward by a loop over the C channels, PyTorch's rule: momentum 0.1, the
 * variance made unbiased (x N / (N - 1)); oneDNN's own variance is the
 * biased one the normalisation uses.
 *
 * Layouts: oneDNN 2.6 has only a generic kernel ("ncsp_bnorm:any") for
 * plain NCHW, and JIT kernels ("bnorm_jit:avx512_core") for nChw16c and
 * for nhwc (a model's tensors where its convolutions take nhwc); the
 * blocked path reorders x (and dy) into blocked copies and y (and dx)
 * back.  BLOCKED is the default, the faster with its reorders; fusing the
 * ReLU pays on it, not on the plain kernel (bench/bench_conv times both,
 * doc/benchmarks.md).
 *
 * bf16 activations (st_batchnorm_io.half): x, y, dx and dy are bf16 (oneDNN
 * 2.6's batch norm takes one data type for data and gradients:
 * "bnorm_jit:avx512_core_bf16"); the statistics, gamma, beta and their
 * gradients stay fp32, and so does the kernel's arithmetic.
 *
 * Backward masking: oneDNN's backward computes dgamma and dbeta of every
 * channel (its data-only variant is not implemented with a scale and
 * shift), so a norm whose parameters get no gradient (a block without
 * weight gradients) writes them to the model's norm scratch, and one over
 * a width unit under backward masking of channels writes all of them
 * there and copies the kept channels to its compact gradients.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/graph.h"
#include "nn/layers.h"

/* the faster layout (bench/bench_conv, doc/benchmarks.md) */
#define ST_BATCHNORM_MEASURED_DEFAULT ST_LAYOUT_BLOCKED

static st_status check(int64_t batch, int64_t channels, int64_t height, int64_t width,
                       const st_batchnorm_io *io)
{
    if (batch < 1 || channels < 1 || height < 1 || width < 1)
        return st_fail(ST_ERR_INVALID, "batch norm: bad shape %lldx%lldx%lldx%lld",
                       (long long)batch, (long long)channels, (long long)height,
                       (long long)width);
    if (!io->x || !io->y || !io->gamma || !io->beta || !io->mean || !io->var ||
        !io->running_mean || !io->running_var)
        return st_fail(ST_ERR_INVALID, "batch norm: missing buffer (x, y, gamma, beta, mean, "
                       "var, running_mean and running_var are needed)");
    if (io->dy && (!io->dx || !io->dgamma || !io->dbeta))
        return st_fail(ST_ERR_INVALID, "batch norm: a backward needs dx, dgamma and dbeta");
    return ST_OK;
}

st_status st_batchnorm_build(st_nn_ctx *ctx, st_batchnorm *n, int64_t batch,
                             int64_t channels, int64_t height, int64_t width,
                             const st_batchnorm_io *io)
{
    memset(n, 0, sizeof *n);
    ST_TRY(check(batch, channels, height, width, io));
    n->batch = batch;
    n->channels = channels;
    n->hw = height * width;
    n->fuse_relu = io->fuse_relu != 0;
    n->has_backward = io->dy != NULL;
    n->layout = io->layout == ST_LAYOUT_DEFAULT ? ST_BATCHNORM_MEASURED_DEFAULT : io->layout;
    n->mean = io->mean;
    n->var = io->var;
    n->running_mean = io->running_mean;
    n->running_var = io->running_var;

    const int64_t dims[4] = { batch, channels, height, width };
    const dnnl_format_tag_t tag = io->tag ? io->tag : dnnl_nchw;
    st_view x, y, dx, dy;
    const int h = io->half != 0;
    ST_TRY(st_view_init_as(ctx, &x, 4, dims, tag, h, io->x, ST_MEM_ACTIVATIONS, ST_SLOT_KEEP,
                           "batch norm reorder x", NULL));
    ST_TRY(st_view_init_as(ctx, &y, 4, dims, tag, h, io->y, ST_MEM_ACTIVATIONS, ST_SLOT_OUT,
                           NULL, "batch norm reorder y"));
    ST_TRY(st_view_init_as(ctx, &dx, 4, dims, tag, h, io->dx, ST_MEM_ACTIVATIONS, ST_SLOT_OUT,
                           NULL, "batch norm reorder dx"));
    ST_TRY(st_view_init_as(ctx, &dy, 4, dims, tag, h, io->dy, ST_MEM_ACTIVATIONS, ST_SLOT_IN,
                           "batch norm reorder dy", NULL));
    /* bf16 data: oneDNN 2.6's batch norm reads and writes one data type,
     * its gradients too, and keeps mean, variance, scale and shift fp32 */
    dnnl_memory_desc_t data_md, c_md;
    const dnnl_format_tag_t run_tag = n->layout != ST_LAYOUT_BLOCKED ? dnnl_nchw
                                      : tag == dnnl_nhwc               ? dnnl_nhwc
                                                                       : st_blocked_tag();
    if (h)
        st_md_tag_bf16(&data_md, 4, dims, run_tag);
    else
        st_md_tag(&data_md, 4, dims, run_tag);
    st_md_vector(&c_md, channels);
    const unsigned flags = dnnl_use_scale | dnnl_use_shift |
                           (n->fuse_relu ? (unsigned)dnnl_fuse_norm_relu : 0u);

    dnnl_batch_normalization_desc_t td, id;
    ST_DNNL(dnnl_batch_normalization_forward_desc_init(&td, dnnl_forward_training, &data_md,
                                                       ST_BATCHNORM_EPS, flags),
            "batch norm training forward descriptor");
    ST_DNNL(dnnl_batch_normalization_forward_desc_init(&id, dnnl_forward_inference, &data_md,
                                                       ST_BATCHNORM_EPS,
                                                       flags | dnnl_use_global_stats),
            "batch norm inference forward descriptor");
    dnnl_primitive_desc_t tpd;
    ST_TRY(st_prim_create(ctx, &n->fwd_train.prim, &td, NULL, "batch norm training forward",
                          &tpd));
    st_status s = st_prim_create(ctx, &n->fwd_infer.prim, &id, NULL,
                                 "batch norm inference forward", NULL);

    dnnl_memory_t gamma = NULL, beta = NULL, mean = NULL, var = NULL;
    dnnl_memory_t rmean = NULL, rvar = NULL, ws = NULL;
    if (s == ST_OK)
        s = st_mem_md(ctx, &gamma, &c_md, io->gamma);
    if (s == ST_OK)
        s = st_mem_md(ctx, &beta, &c_md, io->beta);
    if (s == ST_OK)
        s = st_mem_md(ctx, &mean, &c_md, io->mean);
    if (s == ST_OK)
        s = st_mem_md(ctx, &var, &c_md, io->var);
    if (s == ST_OK)
        s = st_mem_md(ctx, &rmean, &c_md, io->running_mean);
    if (s == ST_OK)
        s = st_mem_md(ctx, &rvar, &c_md, io->running_var);
    if (s == ST_OK && n->fuse_relu) {
        const dnnl_memory_desc_t *ws_md =
            dnnl_primitive_desc_query_md(tpd, dnnl_query_workspace_md, 0);
        size_t bytes = ws_md ? dnnl_memory_desc_get_size(ws_md) : 0;
        if (bytes > 0) {
            s = st_arena_alloc(ctx->arena, ST_MEM_ACTIVATIONS, bytes, &n->workspace);
            if (s == ST_OK)
                s = st_mem_md(ctx, &ws, ws_md, n->workspace);
        }
    }
    /* x: the training forward makes the blocked copy the backward reads;
     * the inference forward, which may run alone, fills it itself. */
    if (s == ST_OK)
        s = st_view_input(ctx, &n->fwd_train, &x, DNNL_ARG_SRC, &data_md, 1);
    if (s == ST_OK)
        s = st_view_output(ctx, &n->fwd_train, &y, DNNL_ARG_DST, &data_md);
    if (s == ST_OK)
        s = st_view_input(ctx, &n->fwd_infer, &x, DNNL_ARG_SRC, &data_md, 0);
    if (s == ST_OK)
        s = st_view_output(ctx, &n->fwd_infer, &y, DNNL_ARG_DST, &data_md);
    if (s == ST_OK) {
        st_prim *t = &n->fwd_train.prim, *f = &n->fwd_infer.prim;
        st_prim_arg(t, DNNL_ARG_SCALE, gamma);
        st_prim_arg(t, DNNL_ARG_SHIFT, beta);
        st_prim_arg(t, DNNL_ARG_MEAN, mean);
        st_prim_arg(t, DNNL_ARG_VARIANCE, var);
        if (ws)
            st_prim_arg(t, DNNL_ARG_WORKSPACE, ws);
        st_prim_arg(f, DNNL_ARG_SCALE, gamma);
        st_prim_arg(f, DNNL_ARG_SHIFT, beta);
        st_prim_arg(f, DNNL_ARG_MEAN, rmean);
        st_prim_arg(f, DNNL_ARG_VARIANCE, rvar);
    }

    if (s == ST_OK && n->has_backward) {
        dnnl_batch_normalization_desc_t bd;
        dnnl_status_t ds = dnnl_batch_normalization_backward_desc_init(
            &bd, dnnl_backward, &data_md, &data_md, ST_BATCHNORM_EPS, flags);
        s = ds == dnnl_success ? st_prim_create(ctx, &n->bwd.prim, &bd, tpd,
                                                "batch norm backward", NULL)
                               : st_dnnl_fail(ds, "batch norm backward descriptor", __FILE__,
                                              __LINE__);
        dnnl_memory_t dgamma = NULL, dbeta = NULL;
        if (s == ST_OK)
            s = st_mem_md(ctx, &dgamma, &c_md, io->dgamma);
        if (s == ST_OK)
            s = st_mem_md(ctx, &dbeta, &c_md, io->dbeta);
        /* x: the training forward's copy (the backward follows it) */
        if (s == ST_OK)
            s = st_view_input(ctx, &n->bwd, &x, DNNL_ARG_SRC, &data_md, 1);
        if (s == ST_OK)
            s = st_view_input(ctx, &n->bwd, &dy, DNNL_ARG_DIFF_DST, &data_md, 1);
        if (s == ST_OK)
            s = st_view_output(ctx, &n->bwd, &dx, DNNL_ARG_DIFF_SRC, &data_md);
        if (s == ST_OK) {
            st_prim *b = &n->bwd.prim;
            st_prim_arg(b, DNNL_ARG_MEAN, mean);
            st_prim_arg(b, DNNL_ARG_VARIANCE, var);
            st_prim_arg(b, DNNL_ARG_SCALE, gamma);
            /* As for layer norm: oneDNN 2.6 wants the shift in backward
             * too, though it does not read it. */
            st_prim_arg(b, DNNL_ARG_SHIFT, beta);
            st_prim_arg(b, DNNL_ARG_DIFF_SCALE, dgamma);
            st_prim_arg(b, DNNL_ARG_DIFF_SHIFT, dbeta);
            if (ws)
                st_prim_arg(b, DNNL_ARG_WORKSPACE, ws);
        }
    }
    dnnl_primitive_desc_destroy(tpd);
    return s;
}

/* PyTorch's running update, after the batch statistics are in mean/var;
 * momentum m (calibration: 1 / (k + 1), a cumulative mean). */
static void update_running(const st_batchnorm *n, float m)
{
    const int64_t count = n->batch * n->hw;
    const float unbias = (float)((double)count / (double)(count - 1));
    for (int64_t c = 0; c < n->channels; c++) {
        n->running_mean[c] = (1.0f - m) * n->running_mean[c] + m * n->mean[c];
        n->running_var[c] = (1.0f - m) * n->running_var[c] + m * (n->var[c] * unbias);
    }
}

st_status st_batchnorm_forward(const st_nn_ctx *ctx, const st_batchnorm *n, int training)
{
    if (!training)
        return st_pass_run(ctx, &n->fwd_infer);
    if (n->batch * n->hw < 2)
        return st_fail(ST_ERR_INVALID, "batch norm: training needs more than one value per "
                       "channel (batch %lld x %lld positions)", (long long)n->batch,
                       (long long)n->hw);
    ST_TRY(st_pass_run(ctx, &n->fwd_train));
    if (training == 1)
        update_running(n, ctx->bn_momentum > 0.0f ? ctx->bn_momentum : ST_BATCHNORM_MOMENTUM);
    return ST_OK;
}

st_status st_batchnorm_backward(const st_nn_ctx *ctx, const st_batchnorm *n)
{
    return n->has_backward ? st_pass_run(ctx, &n->bwd) : ST_OK;
}

/* ------------------------------------------------------------ layer kind */


/* gamma, beta over the (kept) channels; the running statistics are state:
 * kept, not trained (mean 0, variance 1 at the start).  Under backward
 * masking the kept channels are the ones with gradients (bn_build). */
static st_status bn_layout(st_model *m, st_layer *l)
{
    st_neuron_sel t;
    const st_neuron_sel *c = st_graph_sel(m, l->out_unit, l->out, &t);
    const st_neuron_sel *grad = st_graph_grad_sel(m, l->out_unit);
    st_seg_map v = { .full_rows = c->full, .full_cols = 1, .rows = c->ids, .n_rows = c->n,
                     .n_cols = 1, .fan_in = 1 };
    if (grad && grad->ids) {
        v.grad_rows = grad->ids;
        v.n_grad_rows = grad->n;
    }
    char name[48];
    snprintf(name, sizeof name, "%s.gamma", l->name);
    ST_TRY(st_graph_add_segment(m, name, 0, v, &l->seg[0]));
    snprintf(name, sizeof name, "%s.beta", l->name);
    ST_TRY(st_graph_add_segment(m, name, 0, v, &l->seg[1]));
    size_t at;
    snprintf(name, sizeof name, "%s.running_mean", l->name);
    ST_TRY(st_graph_add_state(m, name, c, 0.0f, &at));
    snprintf(name, sizeof name, "%s.running_var", l->name);
    return st_graph_add_state(m, name, c, 1.0f, &at);
}

/* The batch statistics, saved for the backward. */
static st_status bn_alloc(st_model *m, st_layer *l)
{
    st_neuron_sel t;
    const size_t c = (size_t)st_graph_sel(m, l->out_unit, l->out, &t)->n;
    ST_TRY(st_graph_alloc(m, c, &l->saved[0]));
    return st_graph_alloc(m, c, &l->saved[1]);
}

/* Its two state pieces follow each other: find them by name. */
static float *bn_state(const st_model *m, const st_layer *l, const char *what)
{
    char name[48];
    snprintf(name, sizeof name, "%s.%s", l->name, what);
    for (int i = 0; i < m->n_state_segs; i++)
        if (strcmp(m->state_segs[i].name, name) == 0)
            return st_graph_state(m, m->state_segs[i].offset);
    return NULL;
}

static st_status bn_build(st_model *m, st_layer *l)
{
    st_neuron_sel t;
    const st_tensor *x = st_graph_tensor_info(m, l->x);
    const int64_t c = st_graph_sel(m, l->out_unit, l->out, &t)->n;
    st_batchnorm_io io = {
        .x = st_graph_data(m, l->x), .y = st_graph_data(m, l->y),
        .gamma = st_graph_seg_params(m, l->seg[0]), .beta = st_graph_seg_params(m, l->seg[1]),
        .mean = l->saved[0], .var = l->saved[1],
        .running_mean = bn_state(m, l, "running_mean"),
        .running_var = bn_state(m, l, "running_var"),
        .dx = st_graph_data(m, l->dx), .dy = l->backward ? st_graph_data(m, l->dy) : NULL,
        .dgamma = st_graph_seg_grads(m, l->seg[0]), .dbeta = st_graph_seg_grads(m, l->seg[1]),
        .tag = st_graph_tag(m, l->x, c), .fuse_relu = l->fuse_relu,
        .half = st_graph_is_half(m, l->x),   /* tied: y, dx, dy alike (bn_bf16_io) */
    };
    const st_neuron_sel *grad = st_graph_grad_sel(m, l->out_unit);
    if (io.dy && io.dgamma && grad && grad->ids) {
        /* backward masking of its channels: oneDNN writes dgamma and dbeta
         * of every channel to the norm scratch, the kept ones are copied
         * to the compact gradients after the backward */
        l->gather_dst[0] = io.dgamma;
        l->gather_dst[1] = io.dbeta;
        io.dgamma = st_graph_norm_scratch(m);
        io.dbeta = io.dgamma + l->out;
        l->gather_src[0] = io.dgamma;
        l->gather_src[1] = io.dbeta;
        l->gather_rows = st_graph_grad_runs(m, l->out_unit, &l->n_gather_rows);
    } else if (io.dy && !io.dgamma) {   /* backward masking: see st_graph_norm_scratch */
        io.dgamma = st_graph_norm_scratch(m);
        io.dbeta = io.dgamma + l->out;
    }
    if (!io.running_mean || !io.running_var)
        return st_fail(ST_ERR_INVALID, "%s: running statistics not laid out", l->name);
    if (st_graph_is_half(m, l->y) != io.half || (io.dx && st_graph_is_half(m, l->dx) != io.half) ||
        (io.dy && st_graph_is_half(m, l->dy) != io.half))
        return st_fail(ST_ERR_INVALID, "%s: x, y and their gradients not of one data type",
                       l->name);
    return st_batchnorm_build(&m->ctx, &l->u.bn, m->batch, c, x->h, x->w, &io);
}

static st_status bn_forward(const st_nn_ctx *ctx, const st_layer *l, st_phase phase)
{
    return st_batchnorm_forward(ctx, &l->u.bn, phase == ST_PHASE_TRAIN ? 1
                                               : phase == ST_PHASE_RECOMPUTE ? 2 : 0);
}

static st_status bn_backward(const st_nn_ctx *ctx, const st_layer *l)
{
    ST_TRY(st_batchnorm_backward(ctx, &l->u.bn));
    for (int k = 0; k < 2 && l->gather_dst[0]; k++)
        st_graph_gather(l->gather_dst[k], l->gather_src[k], l->u.bn.channels, 1, l->gather_rows,
                        l->n_gather_rows, NULL, 0, 1);
    return ST_OK;
}

/* The backward reads the input (and its own statistics and fused-ReLU
 * mask), never its output. */
static unsigned bn_backward_reads(const st_model *m, const st_layer *l)
{
    (void)m;
    (void)l;
    return ST_READS_X;
}

/* bf16 activations: x, y and the gradients dx, dy all bf16 or all fp32
 * (one data type for the primitive, st_batchnorm_io.half). */
static unsigned bn_bf16_io(const st_model *m, const st_layer *l)
{
    (void)l;
    return m->cfg.activations == ST_PRECISION_BF16 ? ST_BF16_ALL_TIED : 0u;
}

/* Its forward (x read, y written) and backward (x, dy read, dx written)
 * as oneDNN's primitives of the kind. */
static void bn_costs(const st_model *m, const st_layer *l, int forward_only, st_cost_sink *s)
{
    const double y = st_cost_tensor_bytes(m, l->y);
    st_cost_pass(s, ST_OP_BATCHNORM, 0, y / 4.0, 2.0 * y, 1.0);
    if (!forward_only && l->backward)
        st_cost_pass(s, ST_OP_BATCHNORM, 1, y / 4.0, 3.0 * y, 1.0);
}

const st_layer_kind st_layer_batchnorm = {
    .name = "batchnorm", .layout = bn_layout, .alloc = bn_alloc, .build = bn_build,
    .forward = bn_forward, .backward = bn_backward, .norm = 1,
    .costs = bn_costs,
    .backward_reads = bn_backward_reads, .bf16_io = bn_bf16_io,
};

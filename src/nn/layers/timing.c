/*
 * nn/layers/timing.c — layers timed on their own, outside a model
 * (subtrain/layer_timing.h; layers.h's st_conv_reference_gflops): each
 * call builds the layer on its own context and arena, so that what is
 * timed is its primitives and calls, nothing of a model around them.
 */
#include <string.h>
#include <time.h>

#include <subtrain/layer_timing.h>
#include <subtrain/rng.h>

#include "core/arena_impl.h"
#include "nn/layers.h"

/* ------------------------------------------------------------ convolution */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef st_status (*timed_fn)(const st_nn_ctx *ctx, const void *arg);

static st_status run_prim(const st_nn_ctx *ctx, const void *arg)
{
    return st_prim_run(ctx, arg);
}

static st_status run_fwd(const st_nn_ctx *ctx, const void *arg)
{
    return st_conv_forward(ctx, arg);
}

static st_status run_bwd(const st_nn_ctx *ctx, const void *arg)
{
    return st_conv_backward(ctx, arg);
}

/* Best time of reps calls, seconds. */
static st_status best_of(const st_nn_ctx *ctx, timed_fn f, const void *arg, int reps, double *best)
{
    *best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        ST_TRY(f(ctx, arg));
        double t = now_s() - t0;
        if (t < *best)
            *best = t;
    }
    return ST_OK;
}

static st_status time_conv(st_nn_ctx *ctx, st_arena *arena, const st_conv_shape *s,
                           st_layout layout, int bf16, int reps, st_conv_rates *out)
{
    const int64_t oh = st_conv_out_size(s->ih, s->kh, s->stride, s->pad);
    const int64_t ow = st_conv_out_size(s->iw, s->kw, s->stride, s->pad);
    const size_t nx = (size_t)(s->batch * s->ic * s->ih * s->iw);
    const size_t ny = (size_t)(s->batch * s->oc * oh * ow);
    const size_t nw = (size_t)(s->oc * s->ic * s->kh * s->kw);
    st_conv_io io = { .layout = layout, .bf16 = bf16 };
    float *x, *y, *w, *b, *dx, *dy, *dw, *db;
    ST_TRY(st_arena_alloc_floats(arena, ST_MEM_ACTIVATIONS, nx, &x));
    ST_TRY(st_arena_alloc_floats(arena, ST_MEM_ACTIVATIONS, ny, &y));
    ST_TRY(st_arena_alloc_floats(arena, ST_MEM_WEIGHTS, nw, &w));
    ST_TRY(st_arena_alloc_floats(arena, ST_MEM_WEIGHTS, (size_t)s->oc, &b));
    ST_TRY(st_arena_alloc_floats(arena, ST_MEM_ACTIVATIONS, nx, &dx));
    ST_TRY(st_arena_alloc_floats(arena, ST_MEM_ACTIVATIONS, ny, &dy));
    ST_TRY(st_arena_alloc_floats(arena, ST_MEM_GRADIENTS, nw, &dw));
    ST_TRY(st_arena_alloc_floats(arena, ST_MEM_GRADIENTS, (size_t)s->oc, &db));
    /* Values of the usual magnitudes (no denormals, no zeros to skip). */
    st_rng r = st_rng_seed(2024);
    for (size_t i = 0; i < nx; i++)
        x[i] = st_rng_uniform(&r) - 0.5f;
    for (size_t i = 0; i < ny; i++)
        dy[i] = st_rng_uniform(&r) - 0.5f;
    for (size_t i = 0; i < nw; i++)
        w[i] = 0.1f * (st_rng_uniform(&r) - 0.5f);
    io.x = x; io.y = y; io.w = w; io.b = b;
    io.dx = dx; io.dy = dy; io.dw = dw; io.db = db;

    /* The context keeps pointers to the layer's primitives until it is
     * destroyed: the layer lives in the arena, not in this frame. */
    st_conv *cp;
    ST_TRY(st_arena_alloc(arena, ST_MEM_WORKSPACE, sizeof *cp, (void **)&cp));
    st_conv *const c = cp;
    ST_TRY(st_conv_build(ctx, c, s, &io));
    ST_TRY(st_nn_ctx_finalize(ctx));
    ST_TRY(st_conv_forward(ctx, c));   /* warm-up: oneDNN's first-call costs */
    ST_TRY(st_conv_backward(ctx, c));
    const double one = st_conv_pass_flops(s) * 1e-9;
    double t_f, t_d, t_w, t_lf, t_lb;
    ST_TRY(best_of(ctx, run_prim, &c->fwd.prim, reps, &t_f));
    ST_TRY(best_of(ctx, run_prim, &c->bwd_data.prim, reps, &t_d));
    ST_TRY(best_of(ctx, run_prim, &c->bwd_weights.prim, reps, &t_w));
    ST_TRY(best_of(ctx, run_fwd, c, reps, &t_lf));
    ST_TRY(best_of(ctx, run_bwd, c, reps, &t_lb));
    out->layout = c->layout;
    out->fwd = one / t_f;
    out->bwd_data = one / t_d;
    out->bwd_weights = one / t_w;
    out->layer_fwd = one / t_lf;
    out->layer_bwd = 2.0 * one / t_lb;
    out->layer_ms = 1e3 * (t_lf + t_lb);
    return ST_OK;
}

st_status st_conv_reference_gflops_as(const st_conv_shape *shape, st_layout layout, int bf16,
                                      int reps, st_conv_rates *out)
{
    memset(out, 0, sizeof *out);
    st_arena arena;
    st_nn_ctx ctx;
    st_arena_init(&arena, "conv timing", NULL, 0);
    st_status s = st_nn_ctx_init(&ctx, &arena);
    if (s == ST_OK)
        s = time_conv(&ctx, &arena, shape, layout, bf16, reps < 1 ? 1 : reps, out);
    st_nn_ctx_destroy(&ctx);
    st_arena_release(&arena);
    return s;
}

st_status st_conv_reference_gflops(const st_conv_shape *shape, st_layout layout,
                                   int reps, st_conv_rates *out)
{
    return st_conv_reference_gflops_as(shape, layout, 0, reps, out);
}

/* ------------------------------------------------------------ batch norm */

/* Batch norm + ReLU, forward (training) and backward, ms: separate layers
 * (fused = 0) or one (fused = 1), batch norm in `layout`; best of reps
 * after a warm-up. */
static st_status time_bn_relu(int64_t B, int64_t C, int64_t H, int64_t W, int fused,
                              st_layout layout, int reps, double *ms)
{
    st_arena arena;
    st_nn_ctx ctx;
    st_arena_init(&arena, "bn timing", NULL, 0);
    st_status s = st_nn_ctx_init(&ctx, &arena);
    const size_t n = (size_t)(B * C * H * W);
    float *buf[6] = { 0 }, *vec[8] = { 0 };
    for (int i = 0; i < 6 && s == ST_OK; i++)
        s = st_arena_alloc_floats(&arena, ST_MEM_ACTIVATIONS, n, &buf[i]);
    for (int i = 0; i < 8 && s == ST_OK; i++)
        s = st_arena_alloc_floats(&arena, ST_MEM_WORKSPACE, (size_t)C, &vec[i]);
    st_batchnorm *bn = NULL;
    st_act *act = NULL;
    if (s == ST_OK)
        s = st_arena_alloc(&arena, ST_MEM_WORKSPACE, sizeof *bn, (void **)&bn);
    if (s == ST_OK)
        s = st_arena_alloc(&arena, ST_MEM_WORKSPACE, sizeof *act, (void **)&act);
    if (s == ST_OK) {
        float *x = buf[0], *z = buf[1], *y = buf[2], *dx = buf[3], *dz = buf[4], *dy = buf[5];
        for (size_t i = 0; i < n; i++) {
            x[i] = (float)((i * 7919) % 1000) / 500.0f - 1.0f;
            dy[i] = (float)((i * 104729) % 1000) / 500.0f - 1.0f;
        }
        for (int64_t c = 0; c < C; c++)
            vec[0][c] = vec[5][c] = 1.0f; /* gamma, running var */
        st_batchnorm_io io = { .x = x, .y = fused ? y : z, .gamma = vec[0], .beta = vec[1],
                               .mean = vec[2], .var = vec[3], .running_mean = vec[4],
                               .running_var = vec[5], .dx = dx, .dy = fused ? dy : dz,
                               .dgamma = vec[6], .dbeta = vec[7], .fuse_relu = fused,
                               .layout = layout };
        s = st_batchnorm_build(&ctx, bn, B, C, H, W, &io);
        if (s == ST_OK && !fused)
            s = st_act_build(&ctx, act, ST_ACT_RELU, B, C * H * W, z, y, dz, dy, 0);
    }
    if (s == ST_OK)
        s = st_nn_ctx_finalize(&ctx);
    *ms = 1e30;
    for (int r = 0; r <= reps && s == ST_OK; r++) {  /* r = 0: warm-up */
        double t0 = now_s();
        s = st_batchnorm_forward(&ctx, bn, 1);
        if (s == ST_OK && !fused)
            s = st_act_forward(&ctx, act);
        if (s == ST_OK && !fused)
            s = st_act_backward(&ctx, act);
        if (s == ST_OK)
            s = st_batchnorm_backward(&ctx, bn);
        double t = 1e3 * (now_s() - t0);
        if (r > 0 && t < *ms)
            *ms = t;
    }
    st_nn_ctx_destroy(&ctx);
    st_arena_release(&arena);
    return s;
}

/* ------------------------------------------------------------ public */

static st_layout layout_of(int blocked)
{
    return blocked ? ST_LAYOUT_BLOCKED : ST_LAYOUT_PLAIN;
}

st_status st_time_conv(const st_conv_shape *shape, int blocked, int bf16, int reps,
                       st_conv_timing *out)
{
    st_conv_rates r;
    st_status s = st_conv_reference_gflops_as(shape, layout_of(blocked), bf16, reps, &r);
    *out = (st_conv_timing){ .fwd = r.fwd, .bwd_data = r.bwd_data,
                             .bwd_weights = r.bwd_weights, .layer_fwd = r.layer_fwd,
                             .layer_bwd = r.layer_bwd, .layer_ms = r.layer_ms };
    return s;
}

st_status st_time_batchnorm_relu(int64_t batch, int64_t channels, int64_t height,
                                 int64_t width, int blocked, int fused, int reps, double *ms)
{
    return time_bn_relu(batch, channels, height, width, fused, layout_of(blocked), reps, ms);
}

/*
 * bench/bench_step.c — speed of one training step against dnnl_sgemm.
 *
 * What is measured.  For each configuration, the time of one
 * st_trainer_step(): exactly the trainer's hot path (gather a shuffled
 * batch into the model's input, forward, backward, AdamW update) of a
 * one-worker data-parallel run, its worker built by st_trainer_create()
 * the way st_train_run builds it (an epoch is 8 batches: its first step
 * also draws the next order, 8 x batch indices).  From that: samples/s
 * and step GFLOP/s, where the FLOPs are those of st_model_step_flops()
 * (the matrix products of forward and backward, 2 per multiply-add).
 * Layer norms, activations, the loss and
 * the optimizer do no counted FLOPs, so everything they cost shows up as
 * a lower step GFLOP/s: that is on purpose, the number answers "how close
 * is a whole step to doing nothing but GEMMs".
 *
 * Why a reference in the same run.  Absolute GFLOP/s depend on the machine,
 * its clock and, on a shared box, on the neighbours.  So the step is
 * compared with dnnl_sgemm on the model's dominant GEMM shape (M = batch,
 * N = K = width: the products of the residual blocks), measured in the
 * same process, on the same thread count, with windows interleaved with
 * the step's windows so that a noisy period slows both.  The ratio
 * step GFLOP/s / sgemm GFLOP/s is the figure of merit (the aim is >= 0.85
 * for the large model); speed is reported, never asserted, which is why
 * this is not part of `make check`.
 *
 * How it is timed.  After a warm-up (primitives' first runs, page faults,
 * sgemm's JIT), K windows of each kind are run alternately; a window runs
 * whole steps (or sgemm calls) until it has lasted a minimum time, and its
 * mean per-call time is one sample.  The table shows the median window,
 * which resists both a slow outlier (a neighbour's burst) and a lucky one;
 * the best window is printed below it and written to the JSON record.
 *
 * The cnn configuration.  The default ResNet of `subtrain --model resnet`
 * (depth 3, width 16, ReLU) on Fashion-MNIST's shape (1 x 28 x 28, 10
 * classes), batch 128, on synthetic data of that shape.  Its FLOPs are
 * those of its convolutions (forward, backward-data, backward-weights; the
 * stem has no backward-data) and of its linear head; batch norms, ReLUs,
 * the skips and the pooling count none.  Its reference is not sgemm but
 * oneDNN's own convolution primitives, created here with the public C API
 * and format_tag_any (the blocked layouts oneDNN picks, the model's
 * default), on the model's dominant convolution shape: the shape whose
 * FLOPs, summed over every convolution of the model and its three passes,
 * are the largest (conv_shapes() enumerates them from the architecture of
 * subtrain/model.h; for depth 3, width 16, 28 x 28, batch 128 that is the
 * 3x3 stride-1 16->16 convolution at 28 x 28: 6 of them, 8.3 GFLOP a step
 * of the 23.8, against 6.9 for the five 32->32 at 14 x 14 and 6.9 for the
 * five 64->64 at 7 x 7, whose passes cost the same 0.46 GFLOP each; the
 * rest are the stride-2 and 1x1 convolutions, the stem and the head).  One
 * reference call is forward + backward-data + backward-weights, each on
 * its own primitive's layouts (no reorders): reference GFLOP/s = 3 x
 * one-pass FLOPs / (sum of the three primitives' times).  Its windows are
 * interleaved with the step's windows as sgemm's are.
 *
 * Breakdown.  A further window runs the same step by its parts, each timed:
 * the batch gather (st_dataset_gather into the model's input) and
 * st_model_forward_backward on the trainer's model (st_trainer_model),
 * then the optimizer's update alone (st_trainer_update).  It says where
 * the gap to sgemm is: in the forward/backward (non-GEMM layers, GEMM
 * shapes slower than the reference) or in the optimizer, which streams
 * about 28 bytes per parameter (reads p, g, m, v; writes p, m, v) and is
 * bound by memory bandwidth.
 *
 * Threads.  oneDNN's CPU runtime is OpenMP and runs a primitive with the
 * calling thread's nthreads-var.  The trainer runs its worker in a
 * one-thread parallel region that sets its own thread count to 1 and binds
 * the thread to the worker's PU for the call; the program sets its own
 * thread count to 1 and binds itself to that same PU (the plan of one
 * worker), so that dnnl_sgemm and the breakdown's forward-backward run
 * where the step runs, on one thread.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#define BENCH_NAME "bench_step"
#include "bench_util.h"

#include <subtrain/subtrain.h>

#define MAX_WINDOWS 32

#define TRY(expr)                        \
    do {                                 \
        st_status try_s_ = (expr);       \
        if (try_s_ != ST_OK)             \
            return try_s_;               \
    } while (0)

typedef struct bench_config {
    const char *name;   /* as given to --config */
    st_model_kind model;
    int depth, width, batch;
    int in_channels, in_height, in_width;   /* images; 0: 784 features */
    int conv_ref;       /* 1: the convolution reference, 0: sgemm */
} bench_config;

/* (a) the large model: big enough that GEMMs dominate;
 * (b) the README's default recipe;
 * (c) `subtrain --model resnet` on Fashion-MNIST: the default ResNet. */
static const bench_config CONFIGS[] = {
    { "large", ST_MODEL_RESMLP, 8, 1024, 256, 0, 0, 0, 0 },
    { "small", ST_MODEL_RESMLP, 4, 256, 128, 0, 0, 0, 0 },
    { "cnn", ST_MODEL_RESNET, 3, 16, 128, 1, 28, 28, 1 },
};
#define CONFIG_CNN 2
#define N_CONFIGS ((int)(sizeof CONFIGS / sizeof CONFIGS[0]))

typedef struct bench_options {
    int which;              /* index into CONFIGS, or -1 for all */
    int quick;
    int windows;            /* K windows of each kind */
    double step_window_s;   /* minimum length of one step window */
    double gemm_window_s;   /* minimum length of one sgemm window */
    int warmup_steps;
    const char *json_path;
    int workers;            /* > 1: also measure data-parallel scaling */
} bench_options;

typedef struct bench_result {
    const bench_config *cfg;
    size_t params;
    double flops;                   /* per step */
    int windows;
    uint64_t steps_timed;
    double step_s_med, step_s_best, step_s_worst;
    const char *ref_name;           /* "sgemm" or "conv" */
    char ref_shape[64];             /* the reference's shape, in words */
    double ref_flops;               /* per reference call (conv: the 3 passes) */
    double ref_s_med, ref_s_best;
    double conv_pass_s[3];          /* conv: median fwd, bwd-data, bwd-weights */
    char conv_impl[3][32];          /* conv: oneDNN's implementations */
    double ref_share;               /* conv: the shape's share of the step's FLOPs */
    /* breakdown, per step, mean over one window */
    double gather_s, fb_s, optim_s, parts_s;
    float last_loss;
} bench_result;

/* Median of v[0..n), n >= 1 (sorts v). */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static const char *isa_name(dnnl_cpu_isa_t isa)
{
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "unknown";
    }
}

/* "model name" of /proc/cpuinfo, for the record; "unknown" elsewhere. */
static void cpu_name(char *out, size_t size)
{
    snprintf(out, size, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0)
            continue;
        const char *p = strchr(line, ':');
        if (!p)
            break;
        p++;
        while (*p == ' ' || *p == '\t')
            p++;
        snprintf(out, size, "%s", p);
        out[strcspn(out, "\n")] = '\0';
        break;
    }
    fclose(f);
}

/* The 1-minute load average: on a shared machine, the first thing to look
 * at when two runs disagree.  -1 where /proc/loadavg is missing. */
static double load_average(void)
{
    double l = -1.0;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1)
            l = -1.0;
        fclose(f);
    }
    return l;
}

/* ------------------------------------------------------------ sgemm */

typedef struct gemm_ctx {
    int64_t m, n, k;
    float *a, *b, *c;
} gemm_ctx;

static float *alloc_floats(size_t count)
{
    size_t bytes = (count * sizeof(float) + 63) / 64 * 64;
    return aligned_alloc(64, bytes);
}

static int gemm_init(gemm_ctx *g, int64_t m, int64_t n, int64_t k)
{
    g->m = m, g->n = n, g->k = k;
    g->a = alloc_floats((size_t)(m * k));
    g->b = alloc_floats((size_t)(k * n));
    g->c = alloc_floats((size_t)(m * n));
    if (!g->a || !g->b || !g->c)
        return -1;
    /* Ordinary values (no zeros, no denormals) so that nothing is special-cased. */
    st_rng rng = st_rng_seed(7);
    for (int64_t i = 0; i < m * k; i++)
        g->a[i] = st_rng_uniform(&rng) - 0.5f;
    for (int64_t i = 0; i < k * n; i++)
        g->b[i] = st_rng_uniform(&rng) - 0.5f;
    memset(g->c, 0, (size_t)(m * n) * sizeof(float));
    return 0;
}

static void gemm_free(gemm_ctx *g)
{
    free(g->a);
    free(g->b);
    free(g->c);
}

/* C (m, n) = A (m, k) . B (k, n), row-major, as a forward linear layer. */
static int gemm_call(const gemm_ctx *g)
{
    return dnnl_sgemm('N', 'N', g->m, g->n, g->k, 1.0f, g->a, g->k, g->b, g->n, 0.0f, g->c,
                      g->n) == dnnl_success ? 0 : -1;
}

/* Mean seconds per call over a window of at least min_s; -1 on failure.
 * One untimed call first: the step windows in between evict A, B and C. */
static double gemm_window(const gemm_ctx *g, double min_s)
{
    if (gemm_call(g))
        return -1.0;
    uint64_t n = 0;
    double t0 = now_s(), t;
    do {
        if (gemm_call(g))
            return -1.0;
        n++;
        t = now_s();
    } while (t - t0 < min_s);
    return (t - t0) / (double)n;
}

/* ------------------------------------------------------------ conv */

/* A convolution shape of a model and its FLOPs summed over the model's
 * convolutions of that shape and their passes, per step. */
typedef struct conv_shape {
    int64_t ic, oc, h, w, k, stride, pad;
    double step_flops;
} conv_shape;

#define MAX_CONV_SHAPES 32

static int64_t conv_out(int64_t in, int64_t k, int64_t stride, int64_t pad)
{
    return (in + 2 * pad - k) / stride + 1;
}

/* One pass (forward, backward-data or backward-weights): 2 FLOPs per
 * multiply-add, as st_model_step_flops counts them. */
static double conv_pass_flops(const conv_shape *c, int64_t batch)
{
    return 2.0 * (double)batch * (double)c->oc * (double)conv_out(c->h, c->k, c->stride, c->pad) *
           (double)conv_out(c->w, c->k, c->stride, c->pad) * (double)c->ic * (double)(c->k * c->k);
}

static void add_conv(conv_shape *list, int *n, int64_t batch, int64_t ic, int64_t oc, int64_t h,
                     int64_t w, int64_t k, int64_t stride, int passes)
{
    conv_shape c = { ic, oc, h, w, k, stride, k / 2, 0.0 };
    const double f = passes * conv_pass_flops(&c, batch);
    for (int i = 0; i < *n; i++)
        if (list[i].ic == ic && list[i].oc == oc && list[i].h == h && list[i].w == w &&
            list[i].k == k && list[i].stride == stride) {
            list[i].step_flops += f;
            return;
        }
    if (*n < MAX_CONV_SHAPES) {
        c.step_flops = f;
        list[(*n)++] = c;
    }
}

/* The convolutions of a resnet (3 stages) as subtrain/model.h describes
 * it, by shape: the stem 3x3 (C -> w; forward and backward-weights, it
 * has no input gradient), then per stage s (w << s channels, the
 * resolution halved at s > 0): the first block of s > 0 has a 3x3 stride-2
 * convolution from the previous stage's channels, a 3x3 stride-1 one and
 * a 1x1 stride-2 projection; every other block two 3x3 stride-1 ones (all
 * three passes).  Returns the number of shapes; *best: the shape with the
 * most FLOPs, the reference's. */
static int conv_shapes(const bench_config *bc, conv_shape *list, int *best)
{
    int n = 0;
    const int64_t B = bc->batch;
    int64_t H = bc->in_height, W = bc->in_width, c = bc->width;
    add_conv(list, &n, B, bc->in_channels, c, H, W, 3, 1, 2);
    for (int s = 0; s < 3; s++) {
        const int64_t cs = (int64_t)bc->width << s;
        for (int b = 0; b < bc->depth; b++) {
            if (s > 0 && b == 0) {
                add_conv(list, &n, B, c, cs, H, W, 3, 2, 3);
                add_conv(list, &n, B, c, cs, H, W, 1, 2, 3);
                H = (H - 1) / 2 + 1;
                W = (W - 1) / 2 + 1;
            } else {
                add_conv(list, &n, B, c, cs, H, W, 3, 1, 3);
            }
            add_conv(list, &n, B, cs, cs, H, W, 3, 1, 3);
            c = cs;
        }
    }
    *best = 0;
    for (int i = 1; i < n; i++)
        if (list[i].step_flops > list[*best].step_flops)
            *best = i;
    return n;
}

/* oneDNN's convolution primitives on one shape, no bias (the model's
 * convolutions have none), every tensor in the layout its primitive picks
 * from format_tag_any; a tensor two primitives read in the same layout is
 * one buffer, as in the layer (nn/layers/conv.c). */
typedef struct conv_ref {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    dnnl_primitive_t prim[3];       /* forward, backward-data, backward-weights */
    dnnl_exec_arg_t args[3][3];
    dnnl_memory_t mem[9];
    int n_mem;
    char impl[3][32];
} conv_ref;

#define DNNL_TRY(call, what)                                                           \
    do {                                                                               \
        dnnl_status_t dnnl_s_ = (call);                                                \
        if (dnnl_s_ != dnnl_success) {                                                 \
            fprintf(stderr, "bench_step: conv reference: %s failed (oneDNN status %d)\n", \
                    what, (int)dnnl_s_);                                               \
            return -1;                                                                 \
        }                                                                              \
    } while (0)

/* A buffer for md: an earlier one of the same layout when `share` is one,
 * else a new one filled with ordinary values (scaled by `scale`). */
static int conv_ref_mem(conv_ref *c, const dnnl_memory_desc_t *md, dnnl_memory_t share,
                        float scale, st_rng *rng, dnnl_memory_t *out)
{
    if (share) {
        const dnnl_memory_desc_t *smd;
        DNNL_TRY(dnnl_memory_get_memory_desc(share, &smd), "memory descriptor");
        if (dnnl_memory_desc_equal(smd, md)) {
            *out = share;
            return 0;
        }
    }
    DNNL_TRY(dnnl_memory_create(out, md, c->engine, DNNL_MEMORY_ALLOCATE), "memory");
    c->mem[c->n_mem++] = *out;
    void *p;
    DNNL_TRY(dnnl_memory_get_data_handle(*out, &p), "data handle");
    float *f = p;
    const size_t n = dnnl_memory_desc_get_size(md) / sizeof(float);
    for (size_t i = 0; i < n; i++)
        f[i] = scale * (st_rng_uniform(rng) - 0.5f);
    return 0;
}

static const dnnl_memory_desc_t *conv_md(const_dnnl_primitive_desc_t pd, dnnl_query_t what)
{
    return dnnl_primitive_desc_query_md(pd, what, 0);
}

static void conv_impl_name(const_dnnl_primitive_desc_t pd, char *out, size_t size)
{
    const char *name = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name) != dnnl_success ||
        !name)
        name = "?";
    snprintf(out, size, "%s", name);
}

static void conv_ref_free(conv_ref *c)
{
    for (int i = 0; i < 3; i++)
        if (c->prim[i])
            dnnl_primitive_destroy(c->prim[i]);
    for (int i = 0; i < c->n_mem; i++)
        dnnl_memory_destroy(c->mem[i]);
    if (c->stream)
        dnnl_stream_destroy(c->stream);
    if (c->engine)
        dnnl_engine_destroy(c->engine);
    memset(c, 0, sizeof *c);
}

/* Created on this thread, whose OpenMP thread count (1) is the one the
 * primitives are built and run for, as the trainer's worker does. */
static int conv_ref_init(conv_ref *c, const conv_shape *sh, int64_t batch)
{
    memset(c, 0, sizeof *c);
    DNNL_TRY(dnnl_engine_create(&c->engine, dnnl_cpu, 0), "engine");
    DNNL_TRY(dnnl_stream_create(&c->stream, c->engine, dnnl_stream_default_flags), "stream");
    const int64_t oh = conv_out(sh->h, sh->k, sh->stride, sh->pad);
    const int64_t ow = conv_out(sh->w, sh->k, sh->stride, sh->pad);
    const dnnl_dims_t xd = { batch, sh->ic, sh->h, sh->w }, yd = { batch, sh->oc, oh, ow };
    const dnnl_dims_t wd = { sh->oc, sh->ic, sh->k, sh->k };
    const dnnl_dims_t strides = { sh->stride, sh->stride }, pad = { sh->pad, sh->pad };
    dnnl_memory_desc_t x_md, y_md, w_md;
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&x_md, 4, xd, dnnl_f32, dnnl_format_tag_any), "src md");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&y_md, 4, yd, dnnl_f32, dnnl_format_tag_any), "dst md");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&w_md, 4, wd, dnnl_f32, dnnl_format_tag_any),
             "weights md");

    dnnl_convolution_desc_t fd, bd, wdsc;
    DNNL_TRY(dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training,
                                                dnnl_convolution_direct, &x_md, &w_md, NULL,
                                                &y_md, strides, pad, pad),
             "forward descriptor");
    DNNL_TRY(dnnl_convolution_backward_data_desc_init(&bd, dnnl_convolution_direct, &x_md, &w_md,
                                                      &y_md, strides, pad, pad),
             "backward-data descriptor");
    DNNL_TRY(dnnl_convolution_backward_weights_desc_init(&wdsc, dnnl_convolution_direct, &x_md,
                                                         &w_md, NULL, &y_md, strides, pad, pad),
             "backward-weights descriptor");
    dnnl_primitive_desc_t pd[3] = { NULL, NULL, NULL };
    int rc = -1;
    if (dnnl_primitive_desc_create(&pd[0], &fd, NULL, c->engine, NULL) != dnnl_success ||
        dnnl_primitive_desc_create(&pd[1], &bd, NULL, c->engine, pd[0]) != dnnl_success ||
        dnnl_primitive_desc_create(&pd[2], &wdsc, NULL, c->engine, pd[0]) != dnnl_success) {
        fprintf(stderr, "bench_step: conv reference: no convolution primitive for the shape\n");
        goto out;
    }
    for (int i = 0; i < 3; i++) {
        if (dnnl_primitive_create(&c->prim[i], pd[i]) != dnnl_success) {
            fprintf(stderr, "bench_step: conv reference: creating a primitive failed\n");
            goto out;
        }
        conv_impl_name(pd[i], c->impl[i], sizeof c->impl[i]);
    }
    st_rng rng = st_rng_seed(2024);
    dnnl_memory_t x, y, w, dy, dx, xw, dyw, wd_, dw;
    if (conv_ref_mem(c, conv_md(pd[0], dnnl_query_src_md), NULL, 1.0f, &rng, &x) ||
        conv_ref_mem(c, conv_md(pd[0], dnnl_query_weights_md), NULL, 0.1f, &rng, &w) ||
        conv_ref_mem(c, conv_md(pd[0], dnnl_query_dst_md), NULL, 1.0f, &rng, &y) ||
        conv_ref_mem(c, conv_md(pd[1], dnnl_query_diff_dst_md), NULL, 1.0f, &rng, &dy) ||
        conv_ref_mem(c, conv_md(pd[1], dnnl_query_weights_md), w, 0.1f, &rng, &wd_) ||
        conv_ref_mem(c, conv_md(pd[1], dnnl_query_diff_src_md), NULL, 1.0f, &rng, &dx) ||
        conv_ref_mem(c, conv_md(pd[2], dnnl_query_src_md), x, 1.0f, &rng, &xw) ||
        conv_ref_mem(c, conv_md(pd[2], dnnl_query_diff_dst_md), dy, 1.0f, &rng, &dyw) ||
        conv_ref_mem(c, conv_md(pd[2], dnnl_query_diff_weights_md), NULL, 1.0f, &rng, &dw))
        goto out;
    const dnnl_exec_arg_t args[3][3] = {
        { { DNNL_ARG_SRC, x }, { DNNL_ARG_WEIGHTS, w }, { DNNL_ARG_DST, y } },
        { { DNNL_ARG_DIFF_DST, dy }, { DNNL_ARG_WEIGHTS, wd_ }, { DNNL_ARG_DIFF_SRC, dx } },
        { { DNNL_ARG_SRC, xw }, { DNNL_ARG_DIFF_DST, dyw }, { DNNL_ARG_DIFF_WEIGHTS, dw } },
    };
    memcpy(c->args, args, sizeof args);
    rc = 0;
out:
    for (int i = 0; i < 3; i++)
        if (pd[i])
            dnnl_primitive_desc_destroy(pd[i]);
    return rc;
}

static int conv_exec(const conv_ref *c, int i)
{
    return dnnl_primitive_execute(c->prim[i], c->stream, 3, c->args[i]) == dnnl_success &&
           dnnl_stream_wait(c->stream) == dnnl_success ? 0 : -1;
}

/* Mean seconds per forward + backward-data + backward-weights over a
 * window of at least min_s, and of each pass in pass_s; -1 on failure.
 * One untimed round first, as for sgemm. */
static double conv_window(const conv_ref *c, double min_s, double pass_s[3])
{
    for (int i = 0; i < 3; i++)
        if (conv_exec(c, i))
            return -1.0;
    double sum[3] = { 0.0, 0.0, 0.0 };
    uint64_t n = 0;
    double t0 = now_s(), t = t0;
    do {
        for (int i = 0; i < 3; i++) {
            double ta = t;
            if (conv_exec(c, i))
                return -1.0;
            t = now_s();
            sum[i] += t - ta;
        }
        n++;
    } while (t - t0 < min_s);
    for (int i = 0; i < 3; i++)
        pass_s[i] = sum[i] / (double)n;
    return (t - t0) / (double)n;
}

/* ------------------------------------------------------------ the reference */

/* sgemm or the convolution primitives: one call's seconds over a window. */
typedef struct ref_ctx {
    int conv;
    gemm_ctx g;
    conv_ref c;
} ref_ctx;

static double ref_window(ref_ctx *ref, double min_s, double pass_s[3])
{
    if (ref->conv)
        return conv_window(&ref->c, min_s, pass_s);
    double t = gemm_window(&ref->g, min_s);
    if (t < 0.0)
        fprintf(stderr, "bench_step: dnnl_sgemm failed\n");
    return t;
}

/* ------------------------------------------------------------ the step */

typedef struct step_ctx {
    st_trainer *t;
    st_model *m;            /* its worker's model, for the breakdown */
    const st_dataset *train;
    const uint32_t *order;  /* the breakdown's sample order */
    uint32_t steps_per_epoch;
    uint64_t step;          /* last step run, 1-based as in the trainer */
    float loss;
} step_ctx;

static st_status step_once(step_ctx *s)
{
    s->step++;
    return st_trainer_step(s->t, 1, &s->loss);
}

/* Mean seconds per step over a window of at least min_s (at least one step). */
static st_status step_window(step_ctx *s, double min_s, double *per_step, uint64_t *steps)
{
    uint64_t n = 0;
    double t0 = now_s(), t;
    do {
        TRY(step_once(s));
        n++;
        t = now_s();
    } while (t - t0 < min_s);
    *per_step = (t - t0) / (double)n;
    *steps += n;
    return ST_OK;
}

/* The same step as st_trainer_step, by its parts, each timed; means per
 * step over a window of at least min_s. */
static st_status breakdown_window(step_ctx *s, double min_s, bench_result *r)
{
    st_model *m = s->m;
    const int B = st_model_batch(m);
    double gather = 0.0, fb = 0.0, opt = 0.0;
    uint64_t n = 0;
    double t0 = now_s(), t;
    do {
        uint32_t first = (uint32_t)(s->step % s->steps_per_epoch) * (uint32_t)B;
        s->step++;
        double ta = now_s();
        st_dataset_gather(s->train, s->order + first, (size_t)B, st_model_input(m),
                          st_model_labels(m));
        double tb = now_s();
        TRY(st_model_forward_backward(m, &s->loss));
        double tc = now_s();
        float lr;
        TRY(st_trainer_update(s->t, &lr));
        t = now_s();
        gather += tb - ta;
        fb += tc - tb;
        opt += t - tc;
        n++;
    } while (t - t0 < min_s);
    r->gather_s = gather / (double)n;
    r->fb_s = fb / (double)n;
    r->optim_s = opt / (double)n;
    r->parts_s = (t - t0) / (double)n;
    return ST_OK;
}

/* ------------------------------------------------------------ one config */

static int fail(const char *what)
{
    fprintf(stderr, "bench_step: %s: %s\n", what, st_last_error());
    return EXIT_FAILURE;
}

static int run_config(const bench_config *bc, const bench_options *o, bench_result *r)
{
    memset(r, 0, sizeof *r);
    r->cfg = bc;
    r->windows = o->windows;

    /* One data-parallel worker, a constant rate, and more steps than any
     * measurement takes (the plan needs a length). */
    st_train_config tc = st_train_config_default();
    tc.model.kind = bc->model;
    tc.model.depth = bc->depth;
    tc.model.width = bc->width;
    tc.model.hidden = 0; /* = width */
    tc.model.in_dim = 784;
    tc.model.n_classes = 10;
    if (bc->in_channels) {
        /* as `subtrain --model resnet` sets it for Fashion-MNIST (cli/main.c,
         * cli/options.c): the images' shape, ReLU */
        tc.model.in_channels = bc->in_channels;
        tc.model.in_height = bc->in_height;
        tc.model.in_width = bc->in_width;
        tc.model.activation = ST_ACT_RELU;
    }
    tc.batch = bc->batch;
    tc.workers = 1;
    tc.schedule = ST_SCHED_CONSTANT;
    tc.steps = 1000000000;
    if (st_train_config_check(&tc) != ST_OK)
        return fail(bc->name);

    /* A few batches of data are enough: the step's cost does not depend on
     * which samples it sees, and a small set keeps start-up short.  Eight
     * batches rather than one so that successive steps gather different
     * rows in a shuffled order, as the trainer's do. */
    st_synthetic_config sc = st_synthetic_defaults(tc.seed);
    sc.train_count = 8u * (uint32_t)bc->batch;
    sc.test_count = 1;
    st_dataset train, test;
    if (st_synthetic_make(&sc, &train, &test) != ST_OK)
        return fail("synthetic data");
    st_dataset_normalize(&train, &test, NULL, NULL);
    if (bc->in_channels) {
        /* the same 784 features, read as 1 x 28 x 28 images */
        train.channels = test.channels = (uint32_t)bc->in_channels;
        train.height = test.height = (uint32_t)bc->in_height;
        train.width = test.width = (uint32_t)bc->in_width;
    }

    int rc = EXIT_SUCCESS;
    st_trainer *t = NULL;
    ref_ctx ref = { .conv = bc->conv_ref };
    uint32_t *order = malloc(train.count * sizeof *order);
    if (!order) {
        fprintf(stderr, "bench_step: out of memory for a sample order\n");
        rc = EXIT_FAILURE;
        goto out;
    }
    if (st_trainer_create(&tc, &train, &test, &t) != ST_OK) {
        rc = fail("trainer");
        goto out;
    }
    st_epoch_order(tc.seed, 0, order, train.count);
    st_model *m = st_trainer_model(t, 0);
    r->params = st_model_param_count(m);
    r->flops = st_model_step_flops(m);

    if (bc->conv_ref) {
        conv_shape shapes[MAX_CONV_SHAPES];
        int best;
        const int n_shapes = conv_shapes(bc, shapes, &best);
        const conv_shape *sh = &shapes[best];
        double conv_total = 0.0;
        for (int i = 0; i < n_shapes; i++)
            conv_total += shapes[i].step_flops;
        /* the head's few FLOPs aside, the enumeration must be the model */
        if (conv_total > r->flops || conv_total < 0.99 * r->flops)
            fprintf(stderr, "bench_step: warning: the resnet's convolutions as enumerated here "
                    "(%.2f GFLOP a step) are not the model's (%.2f): the reference shape may "
                    "not be its dominant one\n", conv_total * 1e-9, r->flops * 1e-9);
        if (conv_ref_init(&ref.c, sh, bc->batch)) {
            rc = EXIT_FAILURE;
            goto out;
        }
        r->ref_name = "conv";
        snprintf(r->ref_shape, sizeof r->ref_shape, "%lld->%lld %lldx%lld %lldx%lld s%lld",
                 (long long)sh->ic, (long long)sh->oc, (long long)sh->h, (long long)sh->w,
                 (long long)sh->k, (long long)sh->k, (long long)sh->stride);
        r->ref_flops = 3.0 * conv_pass_flops(sh, bc->batch);
        r->ref_share = sh->step_flops / r->flops;
        for (int i = 0; i < 3; i++)
            snprintf(r->conv_impl[i], sizeof r->conv_impl[i], "%s", ref.c.impl[i]);
    } else {
        if (gemm_init(&ref.g, bc->batch, bc->width, bc->width)) {
            fprintf(stderr, "bench_step: out of memory for the sgemm buffers\n");
            rc = EXIT_FAILURE;
            goto out;
        }
        r->ref_name = "sgemm";
        snprintf(r->ref_shape, sizeof r->ref_shape, "%dx%dx%d", bc->batch, bc->width,
                 bc->width);
        r->ref_flops = 2.0 * (double)ref.g.m * (double)ref.g.n * (double)ref.g.k;
    }

    step_ctx s = {
        .t = t, .m = m, .train = &train, .order = order,
        .steps_per_epoch = train.count / (uint32_t)bc->batch,
    };

    /* Warm-up: first runs of every primitive, first touch of the
     * activations and optimizer state, the reference's kernel generation. */
    for (int i = 0; i < o->warmup_steps; i++) {
        if (step_once(&s) != ST_OK) {
            rc = fail(bc->name);
            goto out;
        }
    }
    double pass_t[3][MAX_WINDOWS], pass[3];
    if (ref_window(&ref, o->gemm_window_s, pass) < 0.0) {
        rc = EXIT_FAILURE;
        goto out;
    }

    double step_t[MAX_WINDOWS], gemm_t[MAX_WINDOWS];
    for (int k = 0; k < o->windows; k++) {
        gemm_t[k] = ref_window(&ref, o->gemm_window_s, pass);
        if (gemm_t[k] < 0.0) {
            rc = EXIT_FAILURE;
            goto out;
        }
        for (int i = 0; i < 3; i++)
            pass_t[i][k] = pass[i];
        if (step_window(&s, o->step_window_s, &step_t[k], &r->steps_timed) != ST_OK) {
            rc = fail(bc->name);
            goto out;
        }
    }
    r->step_s_med = median(step_t, o->windows); /* sorted from here on */
    r->step_s_best = step_t[0];
    r->step_s_worst = step_t[o->windows - 1];
    r->ref_s_med = median(gemm_t, o->windows);
    r->ref_s_best = gemm_t[0];
    if (bc->conv_ref)
        for (int i = 0; i < 3; i++)
            r->conv_pass_s[i] = median(pass_t[i], o->windows);

    if (breakdown_window(&s, o->step_window_s, r) != ST_OK) {
        rc = fail(bc->name);
        goto out;
    }
    r->last_loss = s.loss;

out:
    if (ref.conv)
        conv_ref_free(&ref.c);
    else
        gemm_free(&ref.g);
    st_trainer_destroy(t);
    free(order);
    st_dataset_free(&train);
    st_dataset_free(&test);
    return rc;
}

/* ------------------------------------------------------------ output */

static double gflops(double flops, double s)
{
    return flops / s * 1e-9;
}

static void config_label(const bench_config *c, char *out, size_t size)
{
    if (c->model == ST_MODEL_RESMLP)   /* the lines of the resmlp configs as they were */
        snprintf(out, size, "%s d%d w%d", c->name, c->depth, c->width);
    else
        snprintf(out, size, "%s %s d%d w%d", c->name, st_model_kind_name(c->model), c->depth,
                 c->width);
}

static void print_header(const bench_options *o)
{
    const dnnl_version_t *v = dnnl_version();
    char cpu[128];
    cpu_name(cpu, sizeof cpu);
    printf("bench_step: one training step (gather, forward, backward, AdamW) vs dnnl_sgemm "
           "(resmlp) or oneDNN's convolutions (cnn)\n");
    printf("oneDNN %d.%d.%d, ISA %s, OpenMP threads %d, CPU %s (%d online), load average %.2f\n",
           v->major, v->minor, v->patch, isa_name(dnnl_get_effective_cpu_isa()),
           omp_get_max_threads(), cpu, omp_get_num_procs(), load_average());
    printf("timing: %d interleaved windows of each kind (step >= %.2f s, reference >= %.2f s), "
           "median window shown%s\n\n", o->windows, o->step_window_s, o->gemm_window_s,
           o->quick ? " [--quick: numbers are rough]" : "");
    printf("%-17s %5s %8s %9s %10s %12s %5s %11s %6s\n", "config", "batch", "params",
           "step ms", "samples/s", "step GFLOP/s", "ref", "ref GFLOP/s", "ratio");
}

static void print_row(const bench_result *r)
{
    char label[64];
    config_label(r->cfg, label, sizeof label);
    double step_g = gflops(r->flops, r->step_s_med);
    double ref_g = gflops(r->ref_flops, r->ref_s_med);
    printf("%-17s %5d %7.2fM %9.2f %10.0f %12.1f %5s %11.1f %6.3f\n", label, r->cfg->batch,
           (double)r->params * 1e-6, r->step_s_med * 1e3, r->cfg->batch / r->step_s_med,
           step_g, r->ref_name, ref_g, step_g / ref_g);
    fflush(stdout);
}

static void print_details(const bench_result *r)
{
    char label[64];
    config_label(r->cfg, label, sizeof label);
    double best_g = gflops(r->flops, r->step_s_best);
    double ref_best_g = gflops(r->ref_flops, r->ref_s_best);
    double ref_g = gflops(r->ref_flops, r->ref_s_med);
    if (r->cfg->conv_ref) {
        const double one = r->ref_flops / 3.0;
        printf("%s: conv %s at batch %d (%.0f%% of the step's FLOPs), fwd %.1f / bwd-data %.1f "
               "/ bwd-weights %.1f GFLOP/s (%s / %s / %s)\n", label, r->ref_shape,
               r->cfg->batch, 100.0 * r->ref_share, gflops(one, r->conv_pass_s[0]),
               gflops(one, r->conv_pass_s[1]), gflops(one, r->conv_pass_s[2]),
               r->conv_impl[0], r->conv_impl[1], r->conv_impl[2]);
    }
    printf("%s: %s %s; %llu steps in %d windows, step %.2f..%.2f ms; "
           "best windows: step %.1f, %s %.1f GFLOP/s, ratio %.3f\n", label, r->ref_name,
           r->ref_shape, (unsigned long long)r->steps_timed, r->windows,
           r->step_s_best * 1e3, r->step_s_worst * 1e3, best_g, r->ref_name, ref_best_g,
           best_g / ref_best_g);
    double p = r->parts_s;
    printf("%s: breakdown per step (one window, %.2f ms): gather %.2f ms (%.1f%%) | "
           "forward+backward %.2f ms (%.1f%%), %.1f GFLOP/s = %.3f of %s | "
           "AdamW %.2f ms (%.1f%%), %.1f GB/s at 28 B/param\n", label, p * 1e3,
           r->gather_s * 1e3, 100.0 * r->gather_s / p, r->fb_s * 1e3, 100.0 * r->fb_s / p,
           gflops(r->flops, r->fb_s), gflops(r->flops, r->fb_s) / ref_g, r->ref_name,
           r->optim_s * 1e3, 100.0 * r->optim_s / p,
           28.0 * (double)r->params / r->optim_s * 1e-9);
}

static void write_json(FILE *f, const bench_result *r, const bench_options *o)
{
    const dnnl_version_t *v = dnnl_version();
    const bench_config *c = r->cfg;
    double step_g = gflops(r->flops, r->step_s_med), ref_g = gflops(r->ref_flops, r->ref_s_med);
    double best_g = gflops(r->flops, r->step_s_best), ref_best_g = gflops(r->ref_flops,
                                                                          r->ref_s_best);
    fprintf(f, "{\"config\":\"%s\",\"model\":\"%s\",\"depth\":%d,\"width\":%d,", c->name,
            st_model_kind_name(c->model), c->depth, c->width);
    if (c->in_channels)
        fprintf(f, "\"input\":\"%dx%dx%d\",", c->in_channels, c->in_height, c->in_width);
    else
        fprintf(f, "\"hidden\":%d,", c->width);
    fprintf(f, "\"batch\":%d,\"params\":%zu,\"threads\":1,\"quick\":%s,"
            "\"oneDNN\":\"%d.%d.%d\",\"isa\":\"%s\","
            "\"flops_per_step\":%.0f,\"windows\":%d,\"steps_timed\":%llu,"
            "\"step_ms_median\":%.4f,\"step_ms_best\":%.4f,\"step_ms_worst\":%.4f,"
            "\"samples_per_s\":%.2f,\"step_gflops\":%.3f,\"step_gflops_best\":%.3f,",
            c->batch, r->params, o->quick ? "true" : "false",
            v->major, v->minor, v->patch, isa_name(dnnl_get_effective_cpu_isa()), r->flops,
            r->windows, (unsigned long long)r->steps_timed, r->step_s_med * 1e3,
            r->step_s_best * 1e3, r->step_s_worst * 1e3, c->batch / r->step_s_med, step_g,
            best_g);
    if (c->conv_ref) {
        const double one = r->ref_flops / 3.0;
        fprintf(f, "\"reference\":\"conv\",\"conv_shape\":\"%s\",\"conv_flops_share\":%.4f,"
                "\"conv_gflops\":%.3f,\"conv_gflops_best\":%.3f,"
                "\"conv_fwd_gflops\":%.3f,\"conv_bwd_data_gflops\":%.3f,"
                "\"conv_bwd_weights_gflops\":%.3f,\"conv_impl\":\"%s\",",
                r->ref_shape, r->ref_share, ref_g, ref_best_g, gflops(one, r->conv_pass_s[0]),
                gflops(one, r->conv_pass_s[1]), gflops(one, r->conv_pass_s[2]), r->conv_impl[0]);
    } else {
        fprintf(f, "\"reference\":\"sgemm\",\"sgemm_m\":%d,\"sgemm_n\":%d,\"sgemm_k\":%d,"
                "\"sgemm_gflops\":%.3f,\"sgemm_gflops_best\":%.3f,",
                c->batch, c->width, c->width, ref_g, ref_best_g);
    }
    fprintf(f, "\"ratio\":%.4f,\"ratio_best\":%.4f,"
            "\"gather_ms\":%.4f,\"forward_backward_ms\":%.4f,\"forward_backward_gflops\":%.3f,"
            "\"optimizer_ms\":%.4f,\"loss\":%.6g}\n",
            step_g / ref_g, best_g / ref_best_g, r->gather_s * 1e3, r->fb_s * 1e3,
            gflops(r->flops, r->fb_s), r->optim_s * 1e3, (double)r->last_loss);
}

/* Binds this thread to the PU a one-worker trainer binds its worker to:
 * the same plan (this machine, one worker, the process's PUs). */
static int bind_like_worker_0(void)
{
    st_topology *topo;
    st_plan plan;
    st_plan_request req = { 1, 0, NULL };
    if (st_topology_load(NULL, &topo) != ST_OK)
        return fail("topology");
    int rc = EXIT_SUCCESS;
    if (st_plan_make(topo, &req, &plan) != ST_OK) {
        rc = fail("placement");
    } else {
        if (st_plan_bind_self(topo, &plan, 0) != ST_OK)
            rc = fail("binding");
        st_plan_free(&plan);
    }
    st_topology_destroy(topo);
    return rc;
}

static int run_all(const bench_options *o, FILE *json)
{
    bench_result res[N_CONFIGS];
    int n = 0;
    print_header(o);
    if (bind_like_worker_0() != EXIT_SUCCESS) /* after the header's count of online CPUs */
        return EXIT_FAILURE;
    for (int i = 0; i < N_CONFIGS; i++) {
        if (o->which >= 0 && o->which != i)
            continue;
        int rc = run_config(&CONFIGS[i], o, &res[n]);
        if (rc != EXIT_SUCCESS)
            return rc;
        print_row(&res[n]);
        if (json)
            write_json(json, &res[n], o);
        n++;
    }
    printf("\n");
    for (int i = 0; i < n; i++)
        print_details(&res[i]);
    printf("\nratio = step GFLOP/s / reference GFLOP/s (matmul and convolution FLOPs of "
           "forward+backward, 2 per multiply-add, over the whole step's time); aim: >= 0.85 "
           "for large\n");
    if (o->which < 0 || CONFIGS[o->which].conv_ref)
        printf("cnn: reference = oneDNN convolution forward + backward-data + backward-weights "
               "on the model's dominant shape, blocked layouts; aim: >= 0.75\n");
    return EXIT_SUCCESS;
}

/* ------------------------------------------------------------ scaling */

/* Data-parallel scaling: the whole trainer (st_train_run: pinned workers,
 * NUMA arenas, reduce-scatter, sharded AdamW, all-gather) on synthetic
 * data, once with 1 worker and once with N, each worker at batch B.  The
 * trainer's own samples/s counts training time only (no evaluation), over
 * all steps of the run; the median of `reps` runs is shown. */
typedef struct scaling_result {
    double samples_per_s;
    st_epoch_record rec;
} scaling_result;

static int scaling_run(const bench_config *bc, int workers, int steps, scaling_result *out)
{
    st_synthetic_config sc = st_synthetic_defaults(1);
    sc.train_count = (uint32_t)(steps * workers * bc->batch);
    sc.test_count = 64;
    st_dataset train, test;
    if (st_synthetic_make(&sc, &train, &test) != ST_OK)
        return fail("synthetic data");
    st_dataset_normalize(&train, &test, NULL, NULL);
    st_train_config tc = st_train_config_default();
    tc.model.depth = bc->depth;
    tc.model.width = bc->width;
    tc.model.in_dim = (int)train.dim;
    tc.model.n_classes = (int)train.n_classes;
    tc.batch = bc->batch;
    tc.workers = workers;
    tc.steps = (uint64_t)steps;
    tc.schedule = ST_SCHED_CONSTANT;
    st_status s = st_train_run(&tc, &train, &test, NULL, &out->rec);
    st_dataset_free(&train);
    st_dataset_free(&test);
    if (s != ST_OK)
        return fail("training");
    out->samples_per_s = out->rec.samples_per_s;
    return EXIT_SUCCESS;
}

static int cmp_scaling(const void *a, const void *b)
{
    double x = ((const scaling_result *)a)->samples_per_s;
    double y = ((const scaling_result *)b)->samples_per_s;
    return (x > y) - (x < y);
}

static int scaling_median(const bench_config *bc, int workers, int steps, int reps,
                          scaling_result *med)
{
    scaling_result r[MAX_WINDOWS];
    for (int i = 0; i < reps; i++)
        if (scaling_run(bc, workers, steps, &r[i]) != EXIT_SUCCESS)
            return EXIT_FAILURE;
    qsort(r, (size_t)reps, sizeof *r, cmp_scaling);
    *med = r[reps / 2];
    return EXIT_SUCCESS;
}

static void print_scaling_row(int workers, const scaling_result *r, double base)
{
    const st_epoch_record *e = &r->rec;
    printf("%7d %12.0f %8.2fx %9.2f %7.2f %8.2f %9.2f %11.1f %11.1f\n", workers,
           r->samples_per_s, r->samples_per_s / base, e->step_ms_compute, e->step_ms_wait,
           e->step_ms_reduce, e->step_ms_optimizer, e->comm_bytes_per_worker_step / 1e6,
           (double)e->memory.peak_total / 1048576.0);
}

static int run_scaling(const bench_options *o)
{
    /* The measurement: resmlp d8 w1024 at batch 128 per worker
     * (the large config at its own batch with --config small). */
    bench_config bc = o->which == 1 ? CONFIGS[1] : (bench_config){ "large", ST_MODEL_RESMLP, 8, 1024, 128, 0, 0, 0, 0 };
    int steps = o->quick ? 6 : (bc.width >= 1024 ? 30 : 300);
    int reps = o->quick ? 1 : 3;
    scaling_result one, many;
    printf("\ndata-parallel scaling: resmlp d%d w%d, batch %d per worker, %d steps, "
           "median of %d runs of st_train_run\n", bc.depth, bc.width, bc.batch, steps, reps);
    if (scaling_median(&bc, 1, steps, reps, &one) != EXIT_SUCCESS ||
        scaling_median(&bc, o->workers, steps, reps, &many) != EXIT_SUCCESS)
        return EXIT_FAILURE;
    printf("workers    samples/s  vs 1 wk  compute ms  wait ms  reduce ms  optimizer ms"
           "  comm MB/step  peak MiB/wk\n");
    print_scaling_row(1, &one, one.samples_per_s);
    print_scaling_row(o->workers, &many, one.samples_per_s);
    printf("ring all-reduce among %d distributed workers would send %.1f MB per worker and step\n",
           o->workers, many.rec.ring_bytes_per_worker_step / 1e6);
    return EXIT_SUCCESS;
}

/* ------------------------------------------------------------ options */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: bench_step [--config large|small|cnn|all] [--quick] [--seconds S]\n"
            "                  [--json FILE] [--workers N]\n"
            "\n"
            "Times one training step of subtrain (st_trainer_step: gather, forward,\n"
            "backward, AdamW) on one thread and compares its GFLOP/s with dnnl_sgemm on\n"
            "the model's main GEMM shape, measured in the same run, on the same PU\n"
            "(cnn: with oneDNN's convolution primitives on its main convolution shape).\n"
            "  large: resmlp depth 8 width 1024, batch 256\n"
            "  small: resmlp depth 4 width 256, batch 128\n"
            "  cnn:   resnet depth 3 width 16 (ReLU) on 1 x 28 x 28 images, batch 128;\n"
            "         reference: conv 16->16 28x28 3x3 forward + backward-data +\n"
            "         backward-weights, blocked layouts\n"
            "\n"
            "  --config C    which configuration to run (default: all)\n"
            "  --quick       short windows, for smoke tests (numbers are rough)\n"
            "  --seconds S   timed step seconds per configuration, split into windows\n"
            "                (default 2; --quick: 0.3)\n"
            "  --json FILE   also write one JSON object per configuration (JSON Lines)\n"
            "  --workers N   also run the whole trainer with 1 and N data-parallel workers\n"
            "                (resmlp d8 w1024, batch 128 per worker; with --config small the\n"
            "                small model; not with --config cnn) and compare samples/s\n"
            "  --help        this text\n");
}

int main(int argc, char **argv)
{
    bench_options o = { .which = -1, .windows = 5, .warmup_steps = 3 };
    double seconds = -1.0;
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return EXIT_SUCCESS;
        } else if (strcmp(argv[i], "--quick") == 0) {
            o.quick = 1;
        } else if ((v = option_value(argc, argv, &i, "--config", &missing))) {
            if (strcmp(v, "all") == 0)
                o.which = -1;
            else if (strcmp(v, "large") == 0)
                o.which = 0;
            else if (strcmp(v, "small") == 0)
                o.which = 1;
            else if (strcmp(v, "cnn") == 0)
                o.which = CONFIG_CNN;
            else
                return usage_error("--config must be large, small, cnn or all, got '%s'", v);
        } else if ((v = option_value(argc, argv, &i, "--seconds", &missing))) {
            char *end;
            seconds = strtod(v, &end);
            if (end == v || *end != '\0' || !(seconds > 0.0 && seconds <= 3600.0))
                return usage_error("--seconds must be a number in (0, 3600], got '%s'", v);
        } else if ((v = option_value(argc, argv, &i, "--json", &missing))) {
            if (*v == '\0')
                return usage_error("--json needs a file name%s", "");
            o.json_path = v;
        } else if ((v = option_value(argc, argv, &i, "--workers", &missing))) {
            char *end;
            long n = strtol(v, &end, 10);
            if (end == v || *end != '\0' || n < 2 || n > 1024)
                return usage_error("--workers must be an integer in [2, 1024], got '%s'", v);
            o.workers = (int)n;
        } else if (missing) {
            return usage_error("%s needs a value", argv[i]);
        } else {
            return usage_error("unknown option '%s'", argv[i]);
        }
    }

    if (o.workers > 1 && o.which == CONFIG_CNN)
        return usage_error("--workers measures resmlp scaling; not with --config %s", "cnn");
    if (o.quick) {
        o.windows = 3;
        o.warmup_steps = 1;
    }
    if (seconds < 0.0)
        seconds = o.quick ? 0.3 : 2.0;
    o.step_window_s = seconds / o.windows;
    /* sgemm gets 30% of the step's time, at least 0.5 s in all
     * unless --quick: enough for a stable reference. */
    o.gemm_window_s = 0.3 * seconds / o.windows;
    if (!o.quick && o.gemm_window_s * o.windows < 0.5)
        o.gemm_window_s = 0.5 / o.windows;

    FILE *json = NULL;
    if (o.json_path && !(json = fopen(o.json_path, "w"))) {
        fprintf(stderr, "bench_step: cannot open %s: %s\n", o.json_path, strerror(errno));
        return EXIT_FAILURE;
    }

    /* One thread, on the PU of the trainer's worker: sgemm and the
     * breakdown's forward-backward run on this thread, the steps in the
     * trainer's one-thread region (which sets its own thread count and
     * binding for each call); st_train_run below opens its own regions,
     * one thread per worker. */
    omp_set_num_threads(1);
    int rc = run_all(&o, json);

    if (rc == EXIT_SUCCESS && o.workers > 1)
        rc = run_scaling(&o);

    if (json && fclose(json) != 0) {
        fprintf(stderr, "bench_step: cannot write %s: %s\n", o.json_path, strerror(errno));
        return EXIT_FAILURE;
    }
    return rc;
}

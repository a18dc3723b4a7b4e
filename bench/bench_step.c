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
 * compared with dnnl_sgemm on the model's dominant GEMM shape (resmlp:
 * M = batch, N = K = width, the products of the residual blocks; gpt:
 * below), measured in the same process, on the same thread count, with
 * windows interleaved with the step's windows so that a noisy period
 * slows both.  The ratio step GFLOP/s / sgemm GFLOP/s is the figure of
 * merit (the aim is >= 0.85 for the large model, >= 0.7 for gpt); speed
 * is reported, never asserted, which is why this is not part of `make
 * check`.
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
 * The gpt configuration.  `subtrain --model gpt` at the size of issue 12:
 * depth 4, width D = 256 in 4 heads of dh = 64, context T = 128, MLP
 * hidden F = 4 D, GELU, 256 classes (the next byte), batch 16 windows, so
 * every tensor has R = B T = 2048 rows, one per token; tokens/s is
 * reported besides samples (windows)/s.  The data are 4 MiB of generated
 * pseudo-English (make_text), so no file is needed; the bytes do not change
 * a step's cost.  Its FLOPs are st_model_step_flops': the three products of
 * every linear layer and the six batched products of every attention layer
 * (scores and context forward; dV, dP, dQ, dK backward; B H T^2 dh
 * multiply-adds each, the masked half included because the products
 * compute it).  The bench recomputes both from the architecture (gpt_flops)
 * and warns if the model's count differs, so an attention whose FLOPs were
 * not counted would show.  A step is 42.7 GFLOP: per block qkv 2.42, proj
 * 0.81, fc1 3.22, fc2 3.22 and attention 0.81; the head 0.81.  The sgemm
 * reference is fc1's forward shape, M = R = 2048, K = D = 256, N = F =
 * 1024: the MLP carries the most FLOPs (25.8 of the 42.7, 60%, against 9.7
 * for qkv), and its six products per block are all the same 2048 x 256 x
 * 1024 multiply-adds in three orientations (fc1 forward and fc2's input
 * gradient: 2048 x 256 -> 1024; fc2 forward and fc1's input gradient: 2048
 * x 1024 -> 256; the weight gradients: K = 2048), of which the forward is
 * taken, as for resmlp.  The aim is a ratio >= 0.7.
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
 * gpt: its attention, and what of the step is not GEMM.  The layers are
 * private (nn/graph.h), so attention is timed on a copy of one attention
 * layer built here with oneDNN's public API (attn_ref: attention.c's
 * matmuls on the same strided views, its in-place softmax, its mask loop,
 * buffers of the same sizes), each part timed, in windows as long as
 * sgemm's interleaved with the others; the step's attention is taken as
 * depth x the median parts.  The copy's buffers (about 25 MB) are all it
 * touches from one round to the next, while the model's products pass
 * through the other layers' data in between, so the copy may flatter
 * attention: read its time as a lower bound.  The median step is then
 * split by kind: GEMM = the linear layers' FLOPs at sgemm's median rate
 * (what they would cost as GEMMs of the reference's speed) + the copy's six
 * products; not GEMM = the gather and AdamW (the breakdown window's) + the
 * copy's mask and softmax (forward and backward) + the rest of the step,
 * which holds the layer norms, GELU, the embedding, the loss, the residual
 * adds and whatever the linear matmul primitives lose to sgemm.  That last
 * term is not separated from the others (it would need the model's
 * layers), so the non-GEMM share is an upper bound of the time spent
 * outside matrix products.  It relates to the ratio: 1 - ratio = the
 * non-GEMM share + what attention's products take beyond sgemm's rate.
 * The large terms are medians of interleaved windows, not the one
 * breakdown window, which a neighbour's burst can move by 20%.
 *
 * bf16 (--precision bf16 or both).  The same step with the model's
 * linear layers in bf16 (st_model_config.precision), against a second
 * reference measured in the same windows: oneDNN's matmul primitive with
 * bf16 operands and fp32 output (what the layers run) on the same shape
 * as sgemm's.  The row's ratio is to that bf16 reference; the sgemm
 * column keeps the fp32 reference next to it.  The cnn config's bf16
 * reference is the same three convolutions reading bf16 (x, w, dy) and
 * writing fp32, as its layers run them.
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
#include <math.h>
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
    int context, heads; /* sequence models: tokens per sample, heads; 0: none */
} bench_config;

/* (a) the large model: big enough that GEMMs dominate;
 * (b) the README's default recipe;
 * (c) `subtrain --model resnet` on Fashion-MNIST: the default ResNet;
 * (d) `subtrain --model gpt` as issue 12 sizes it: T = 128, D = 256. */
static const bench_config CONFIGS[] = {
    { "large", ST_MODEL_RESMLP, 8, 1024, 256, 0, 0, 0, 0, 0, 0 },
    { "small", ST_MODEL_RESMLP, 4, 256, 128, 0, 0, 0, 0, 0, 0 },
    { "cnn", ST_MODEL_RESNET, 3, 16, 128, 1, 28, 28, 1, 0, 0 },
    { "gpt", ST_MODEL_GPT, 4, 256, 16, 0, 0, 0, 0, 128, 4 },
};
#define CONFIG_CNN 2
#define CONFIG_GPT 3
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
    int fp32, bf16;         /* which precisions get a row (--precision) */
    unsigned unfuse;        /* ST_UNFUSE_* bits (--unfuse): fusions turned off */
} bench_options;

/* The parts of an attention layer's forward and backward, in the order
 * the model runs them (the gpt config times them: attn_ref below). */
enum {
    A_SCORES, A_MASK, A_SOFTMAX, A_CONTEXT,         /* forward */
    A_DV, A_DP, A_DSOFTMAX, A_DQ, A_DK,             /* backward */
    A_PARTS
};
static const char *const ATTN_PART_NAMES[A_PARTS] = {
    "scores", "mask", "softmax", "context", "dV", "dP", "softmax-bwd", "dQ", "dK",
};
/* The six parts that are matrix products. */
static int attn_is_matmul(int part)
{
    return part != A_MASK && part != A_SOFTMAX && part != A_DSOFTMAX;
}

typedef struct bench_result {
    const bench_config *cfg;
    int bf16;                       /* the row's precision: linear layers in bf16 */
    double ref16_flops;             /* bf16: the bf16 matmul reference, per call */
    double ref16_s_med, ref16_s_best;
    char ref16_impl[32];
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
    int64_t gemm_m, gemm_n, gemm_k; /* sgemm: the shape */
    /* breakdown, per step, mean over one window */
    double gather_s, fb_s, optim_s, parts_s;
    /* gpt: the FLOPs by kind, the attention copy's parts (one layer, a
     * median round over its windows) and its matmul implementation */
    double linear_flops, attn_flops;
    double attn_part_s[A_PARTS];
    char attn_impl[32];
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
    /* the bf16 reference: a matmul primitive, bf16 A and B, fp32 C */
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    dnnl_primitive_t mm16;
    dnnl_memory_t a16, b16, c32;
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

/* The bf16 matmul on the same shape, A and B converted from the fp32
 * values by reorders; the implementation's name in impl. */
static int gemm16_init(gemm_ctx *g, char *impl, size_t size)
{
    dnnl_dims_t ad = { g->m, g->k }, bd = { g->k, g->n }, cd = { g->m, g->n };
    dnnl_memory_desc_t a_md, b_md, c_md, a32_md, b32_md;
    dnnl_matmul_desc_t d;
    dnnl_primitive_desc_t pd = NULL, rpd = NULL;
    dnnl_primitive_t r = NULL;
    dnnl_memory_t a32 = NULL, b32 = NULL;
    int ok = dnnl_engine_create(&g->engine, dnnl_cpu, 0) == dnnl_success &&
             dnnl_stream_create(&g->stream, g->engine, dnnl_stream_default_flags) == dnnl_success &&
             dnnl_memory_desc_init_by_tag(&a_md, 2, ad, dnnl_bf16, dnnl_ab) == dnnl_success &&
             dnnl_memory_desc_init_by_tag(&b_md, 2, bd, dnnl_bf16, dnnl_ab) == dnnl_success &&
             dnnl_memory_desc_init_by_tag(&c_md, 2, cd, dnnl_f32, dnnl_ab) == dnnl_success &&
             dnnl_memory_desc_init_by_tag(&a32_md, 2, ad, dnnl_f32, dnnl_ab) == dnnl_success &&
             dnnl_memory_desc_init_by_tag(&b32_md, 2, bd, dnnl_f32, dnnl_ab) == dnnl_success &&
             dnnl_matmul_desc_init(&d, &a_md, &b_md, NULL, &c_md) == dnnl_success &&
             dnnl_primitive_desc_create(&pd, &d, NULL, g->engine, NULL) == dnnl_success &&
             dnnl_primitive_create(&g->mm16, pd) == dnnl_success &&
             dnnl_memory_create(&g->a16, &a_md, g->engine, DNNL_MEMORY_ALLOCATE) == dnnl_success &&
             dnnl_memory_create(&g->b16, &b_md, g->engine, DNNL_MEMORY_ALLOCATE) == dnnl_success &&
             dnnl_memory_create(&g->c32, &c_md, g->engine, DNNL_MEMORY_ALLOCATE) == dnnl_success &&
             dnnl_memory_create(&a32, &a32_md, g->engine, g->a) == dnnl_success &&
             dnnl_memory_create(&b32, &b32_md, g->engine, g->b) == dnnl_success;
    if (ok) {
        const char *name = "?";
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name);
        snprintf(impl, size, "%s", name);
    }
    for (int i = 0; ok && i < 2; i++) {   /* A, then B, to bf16 */
        dnnl_memory_t from = i ? b32 : a32, to = i ? g->b16 : g->a16;
        const dnnl_memory_desc_t *fm = i ? &b32_md : &a32_md, *tm = i ? &b_md : &a_md;
        dnnl_exec_arg_t args[2] = { { DNNL_ARG_FROM, from }, { DNNL_ARG_TO, to } };
        ok = dnnl_reorder_primitive_desc_create(&rpd, fm, g->engine, tm, g->engine, NULL) ==
                 dnnl_success &&
             dnnl_primitive_create(&r, rpd) == dnnl_success &&
             dnnl_primitive_execute(r, g->stream, 2, args) == dnnl_success &&
             dnnl_stream_wait(g->stream) == dnnl_success;
        if (r)
            dnnl_primitive_destroy(r);
        if (rpd)
            dnnl_primitive_desc_destroy(rpd);
        r = NULL, rpd = NULL;
    }
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (a32)
        dnnl_memory_destroy(a32);
    if (b32)
        dnnl_memory_destroy(b32);
    if (!ok)
        fprintf(stderr, "bench_step: oneDNN has no bf16 matmul here (ISA %s)\n",
                isa_name(dnnl_get_effective_cpu_isa()));
    return ok ? 0 : -1;
}

static int gemm16_call(const gemm_ctx *g)
{
    dnnl_exec_arg_t args[3] = { { DNNL_ARG_SRC, g->a16 }, { DNNL_ARG_WEIGHTS, g->b16 },
                                { DNNL_ARG_DST, g->c32 } };
    return dnnl_primitive_execute(g->mm16, g->stream, 3, args) == dnnl_success &&
           dnnl_stream_wait(g->stream) == dnnl_success ? 0 : -1;
}

static double gemm16_window(const gemm_ctx *g, double min_s)
{
    if (gemm16_call(g))
        return -1.0;
    uint64_t n = 0;
    double t0 = now_s(), t;
    do {
        if (gemm16_call(g))
            return -1.0;
        n++;
        t = now_s();
    } while (t - t0 < min_s);
    return (t - t0) / (double)n;
}

static void gemm_free(gemm_ctx *g)
{
    if (g->mm16)
        dnnl_primitive_destroy(g->mm16);
    dnnl_memory_t mems[3] = { g->a16, g->b16, g->c32 };
    for (int i = 0; i < 3; i++)
        if (mems[i])
            dnnl_memory_destroy(mems[i]);
    if (g->stream)
        dnnl_stream_destroy(g->stream);
    if (g->engine)
        dnnl_engine_destroy(g->engine);
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
 * else a new one filled with ordinary values (scaled by `scale`), in its
 * data type (f32 or bf16). */
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
    if (md->data_type == dnnl_bf16) {
        uint16_t *h = p;
        const size_t n = dnnl_memory_desc_get_size(md) / sizeof(uint16_t);
        for (size_t i = 0; i < n; i++) {
            float f = scale * (st_rng_uniform(rng) - 0.5f);
            uint32_t u;
            memcpy(&u, &f, sizeof u);
            h[i] = (uint16_t)(u >> 16);
        }
        return 0;
    }
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
 * primitives are built and run for, as the trainer's worker does.  bf16:
 * what each pass reads (x, w, dy) in bf16, what it writes (y, dx, dw) in
 * f32, as the layers run (nn/layers/conv.c). */
static int conv_ref_init(conv_ref *c, const conv_shape *sh, int64_t batch, int bf16)
{
    memset(c, 0, sizeof *c);
    DNNL_TRY(dnnl_engine_create(&c->engine, dnnl_cpu, 0), "engine");
    DNNL_TRY(dnnl_stream_create(&c->stream, c->engine, dnnl_stream_default_flags), "stream");
    const int64_t oh = conv_out(sh->h, sh->k, sh->stride, sh->pad);
    const int64_t ow = conv_out(sh->w, sh->k, sh->stride, sh->pad);
    const dnnl_dims_t xd = { batch, sh->ic, sh->h, sh->w }, yd = { batch, sh->oc, oh, ow };
    const dnnl_dims_t wd = { sh->oc, sh->ic, sh->k, sh->k };
    const dnnl_dims_t strides = { sh->stride, sh->stride }, pad = { sh->pad, sh->pad };
    const dnnl_data_type_t in = bf16 ? dnnl_bf16 : dnnl_f32;
    dnnl_memory_desc_t x_md, y_md, w_md, dx_md, dy_md, dw_md;
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&x_md, 4, xd, in, dnnl_format_tag_any), "src md");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&y_md, 4, yd, dnnl_f32, dnnl_format_tag_any), "dst md");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&w_md, 4, wd, in, dnnl_format_tag_any),
             "weights md");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&dx_md, 4, xd, dnnl_f32, dnnl_format_tag_any),
             "diff src md");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&dy_md, 4, yd, in, dnnl_format_tag_any),
             "diff dst md");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&dw_md, 4, wd, dnnl_f32, dnnl_format_tag_any),
             "diff weights md");

    dnnl_convolution_desc_t fd, bd, wdsc;
    DNNL_TRY(dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training,
                                                dnnl_convolution_direct, &x_md, &w_md, NULL,
                                                &y_md, strides, pad, pad),
             "forward descriptor");
    DNNL_TRY(dnnl_convolution_backward_data_desc_init(&bd, dnnl_convolution_direct, &dx_md,
                                                      &w_md, &dy_md, strides, pad, pad),
             "backward-data descriptor");
    DNNL_TRY(dnnl_convolution_backward_weights_desc_init(&wdsc, dnnl_convolution_direct, &x_md,
                                                         &dw_md, NULL, &dy_md, strides, pad,
                                                         pad),
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

/* ------------------------------------------------------------ gpt */

/* The FLOPs st_model_step_flops should count for the gpt config, from
 * the architecture of subtrain/model.h: per block the linear layers qkv
 * (D -> 3 D), proj (D -> D), fc1 (D -> F), fc2 (F -> D), three products
 * each over R = B T rows, and attention's six batched products (scores,
 * context; dV, dP, dQ, dK) of B H T^2 dh multiply-adds each, the masked
 * half included; then the head (D -> 256, three products: the final layer
 * norm needs its input gradient).  The embedding is a lookup, no FLOPs. */
static void gpt_flops(const bench_config *bc, double *linear, double *attention)
{
    const double R = (double)bc->batch * bc->context, D = bc->width, F = 4.0 * D;
    const double T = bc->context, dh = D / bc->heads;
    const double block = 3.0 * 2.0 * R * (D * 3.0 * D + D * D + 2.0 * D * F);
    *linear = bc->depth * block + 3.0 * 2.0 * R * D * 256.0;
    *attention = bc->depth * 6.0 * 2.0 * (double)bc->batch * bc->heads * T * T * dh;
}

/* Pseudo-English for the gpt config: words of a small vocabulary, the
 * frequent ones drawn more often, in sentences of 4 to 15 words with
 * commas, full stops and line breaks.  What the bytes are does not change
 * the cost of a step (the embedding is a lookup, the loss reads one label
 * a token); generating them keeps the bench free of files. */
static int make_text(size_t n, uint64_t seed, st_text *out)
{
    static const char *const words[] = {
        "the", "of", "and", "a", "to", "in", "is", "it", "that", "was", "for", "on", "as",
        "with", "he", "be", "at", "by", "this", "had", "not", "are", "but", "from", "or",
        "have", "an", "they", "which", "one", "you", "were", "her", "all", "she", "there",
        "would", "their", "we", "him", "been", "has", "when", "who", "will", "more", "no",
        "if", "out", "so", "said", "what", "up", "its", "about", "into", "than", "them",
        "can", "only", "other", "new", "some", "could", "time", "these", "two", "may",
        "then", "do", "first", "any", "my", "now", "such", "like", "our", "over", "man",
        "me", "even", "most", "made", "after", "also", "did", "many", "before", "must",
        "through", "years", "where", "much", "your", "way", "well", "down", "should",
        "because", "each", "just", "those", "people", "water", "light", "word", "number",
    };
    const uint32_t n_words = (uint32_t)(sizeof words / sizeof words[0]);
    uint8_t *b = malloc(n);
    if (!b)
        return -1;
    st_rng rng = st_rng_seed(seed);
    size_t at = 0;
    while (at < n) {
        const uint32_t len = 4 + st_rng_below(&rng, 12);
        for (uint32_t w = 0; w < len && at < n; w++) {
            /* the minimum of two draws: low indices (the frequent words) win */
            const char *word = words[st_rng_below(&rng, 1 + st_rng_below(&rng, n_words))];
            for (size_t c = 0; word[c] && at < n; c++)
                b[at++] = (uint8_t)(w == 0 && c == 0 ? word[c] - 'a' + 'A' : word[c]);
            if (w + 1 < len && at < n && st_rng_below(&rng, 8) == 0)
                b[at++] = ',';
            if (w + 1 < len && at < n)
                b[at++] = ' ';
        }
        if (at < n)
            b[at++] = '.';
        if (at < n)
            b[at++] = st_rng_below(&rng, 6) == 0 ? '\n' : ' ';
    }
    *out = (st_text){ b, n, n - n / 16 };
    return 0;
}

/* One attention layer of the gpt config rebuilt here with oneDNN's public
 * API: the primitives of nn/layers/attention.c on the same views (the
 * heads read through strides from a (B T, 3 D) buffer, transposes as
 * strides, the 1/sqrt(dh) a post-op), the same in-place softmax and the
 * same causal mask loop, on buffers of the same sizes.  The library's
 * layers are private (nn/graph.h), so this copy is how a step's attention
 * is timed by its parts; a change to attention.c's descriptors must be
 * made here too. */
#define ATTN_MAX_MEM 24

typedef struct attn_ref {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    dnnl_primitive_t prim[A_PARTS];     /* NULL for the mask */
    dnnl_exec_arg_t args[A_PARTS][3];
    int nargs[A_PARTS];
    dnnl_memory_t mem[ATTN_MAX_MEM];
    int n_mem;
    float *x, *y, *P, *dS, *dy, *dx;
    int64_t batch, heads, tokens, head_dim;
    double product_flops;               /* one batched product: 2 B H T^2 dh */
    char impl[32];                      /* the scores matmul's implementation */
} attn_ref;

#define ATTN_TRY(call, what)                                                           \
    do {                                                                               \
        dnnl_status_t dnnl_s_ = (call);                                                \
        if (dnnl_s_ != dnnl_success) {                                                 \
            fprintf(stderr, "bench_step: attention: %s failed (oneDNN status %d)\n", what, \
                    (int)dnnl_s_);                                                     \
            return -1;                                                                 \
        }                                                                              \
    } while (0)

/* A (B, H, rows, cols) view, as attention.c's md4. */
static void attn_md4(dnnl_memory_desc_t *md, int64_t B, int64_t H, int64_t rows, int64_t cols,
                     int64_t bs, int64_t hs, int64_t rs, int64_t cs)
{
    dnnl_dims_t dims = { B, H, rows, cols }, strides = { bs, hs, rs, cs };
    dnnl_memory_desc_init_by_strides(md, 4, dims, dnnl_f32, strides);
}

static int attn_mem(attn_ref *a, const dnnl_memory_desc_t *md, float *data, dnnl_memory_t *out)
{
    if (a->n_mem >= ATTN_MAX_MEM)
        return -1;
    ATTN_TRY(dnnl_memory_create(out, md, a->engine, data), "memory");
    a->mem[a->n_mem++] = *out;
    return 0;
}

/* Creates prim[part] from an operation descriptor, with scale as an
 * eltwise_linear post-op unless it is 1 (as st_prim_create_scaled). */
static int attn_prim(attn_ref *a, int part, const void *desc, const_dnnl_primitive_desc_t hint,
                     float scale, dnnl_primitive_desc_t *pd_out)
{
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t ops = NULL;
    dnnl_primitive_desc_t pd = NULL;
    int rc = -1;
    if (scale != 1.0f) {
        if (dnnl_primitive_attr_create(&attr) != dnnl_success ||
            dnnl_post_ops_create(&ops) != dnnl_success ||
            dnnl_post_ops_append_eltwise(ops, 1.0f, dnnl_eltwise_linear, scale, 0.0f) !=
                dnnl_success ||
            dnnl_primitive_attr_set_post_ops(attr, ops) != dnnl_success)
            goto out;
    }
    if (dnnl_primitive_desc_create(&pd, desc, attr, a->engine, hint) != dnnl_success ||
        dnnl_primitive_create(&a->prim[part], pd) != dnnl_success)
        goto out;
    if (part == A_SCORES)
        conv_impl_name(pd, a->impl, sizeof a->impl);
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "bench_step: attention: no primitive for %s\n", ATTN_PART_NAMES[part]);
    if (ops)
        dnnl_post_ops_destroy(ops);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    if (pd && (rc || !pd_out))
        dnnl_primitive_desc_destroy(pd);
    else if (pd_out)
        *pd_out = pd;
    return rc;
}

/* dst = scale (src x w), batched over (B, H): prim[part] and its arguments. */
static int attn_matmul(attn_ref *a, int part, const dnnl_memory_desc_t *src_md, float *src,
                       const dnnl_memory_desc_t *w_md, float *w, const dnnl_memory_desc_t *dst_md,
                       float *dst, float scale)
{
    dnnl_matmul_desc_t d;
    ATTN_TRY(dnnl_matmul_desc_init(&d, src_md, w_md, NULL, dst_md), ATTN_PART_NAMES[part]);
    if (attn_prim(a, part, &d, NULL, scale, NULL))
        return -1;
    dnnl_memory_t ms, mw, md;
    if (attn_mem(a, src_md, src, &ms) || attn_mem(a, w_md, w, &mw) || attn_mem(a, dst_md, dst, &md))
        return -1;
    const dnnl_exec_arg_t args[3] = {
        { DNNL_ARG_SRC, ms }, { DNNL_ARG_WEIGHTS, mw }, { DNNL_ARG_DST, md },
    };
    memcpy(a->args[part], args, sizeof args);
    a->nargs[part] = 3;
    return 0;
}

static void attn_ref_free(attn_ref *a)
{
    for (int i = 0; i < A_PARTS; i++)
        if (a->prim[i])
            dnnl_primitive_destroy(a->prim[i]);
    for (int i = 0; i < a->n_mem; i++)
        dnnl_memory_destroy(a->mem[i]);
    if (a->stream)
        dnnl_stream_destroy(a->stream);
    if (a->engine)
        dnnl_engine_destroy(a->engine);
    free(a->x);
    free(a->y);
    free(a->P);
    free(a->dS);
    free(a->dy);
    free(a->dx);
    memset(a, 0, sizeof *a);
}

/* Built on this thread (one OpenMP thread, the worker's PU), as the
 * model's primitives are built on the worker's. */
static int attn_ref_init(attn_ref *a, const bench_config *bc)
{
    memset(a, 0, sizeof *a);
    const int64_t B = bc->batch, T = bc->context, Dk = bc->width, H = bc->heads;
    const int64_t dh = Dk / H, X = 3 * Dk;
    a->batch = B, a->heads = H, a->tokens = T, a->head_dim = dh;
    a->product_flops = 2.0 * (double)(B * H) * (double)(T * T) * (double)dh;
    const float scale = 1.0f / sqrtf((float)dh);
    a->x = alloc_floats((size_t)(B * T * X));
    a->dx = alloc_floats((size_t)(B * T * X));
    a->y = alloc_floats((size_t)(B * T * Dk));
    a->dy = alloc_floats((size_t)(B * T * Dk));
    a->P = alloc_floats((size_t)(B * H * T * T));
    a->dS = alloc_floats((size_t)(B * H * T * T));
    if (!a->x || !a->dx || !a->y || !a->dy || !a->P || !a->dS) {
        fprintf(stderr, "bench_step: out of memory for the attention buffers\n");
        return -1;
    }
    /* ordinary values in x (Q, K, V) and dy; the rest is written before read */
    st_rng rng = st_rng_seed(12);
    for (int64_t i = 0; i < B * T * X; i++)
        a->x[i] = st_rng_uniform(&rng) - 0.5f;
    for (int64_t i = 0; i < B * T * Dk; i++)
        a->dy[i] = st_rng_uniform(&rng) - 0.5f;
    ATTN_TRY(dnnl_engine_create(&a->engine, dnnl_cpu, 0), "engine");
    ATTN_TRY(dnnl_stream_create(&a->stream, a->engine, dnnl_stream_default_flags), "stream");

    float *x = a->x, *dx = a->dx, *P = a->P, *dS = a->dS;
    dnnl_memory_desc_t q_md, kt_md, k_md, v_md, vt_md, y_md, p_md, pt_md;
    attn_md4(&q_md, B, H, T, dh, T * X, dh, X, 1);
    attn_md4(&k_md, B, H, T, dh, T * X, dh, X, 1);
    attn_md4(&kt_md, B, H, dh, T, T * X, dh, 1, X);
    attn_md4(&v_md, B, H, T, dh, T * X, dh, X, 1);
    attn_md4(&vt_md, B, H, dh, T, T * X, dh, 1, X);
    attn_md4(&y_md, B, H, T, dh, T * Dk, dh, Dk, 1);
    attn_md4(&p_md, B, H, T, T, H * T * T, T * T, T, 1);
    attn_md4(&pt_md, B, H, T, T, H * T * T, T * T, 1, T);
    if (attn_matmul(a, A_SCORES, &q_md, x, &kt_md, x + Dk, &p_md, P, scale) ||
        attn_matmul(a, A_CONTEXT, &p_md, P, &v_md, x + 2 * Dk, &y_md, a->y, 1.0f) ||
        attn_matmul(a, A_DV, &pt_md, P, &y_md, a->dy, &q_md, dx + 2 * Dk, 1.0f) ||
        attn_matmul(a, A_DP, &y_md, a->dy, &vt_md, x + 2 * Dk, &p_md, dS, 1.0f) ||
        attn_matmul(a, A_DQ, &p_md, dS, &k_md, x + Dk, &q_md, dx, scale) ||
        attn_matmul(a, A_DK, &pt_md, dS, &q_md, x, &q_md, dx + Dk, scale))
        return -1;

    /* the softmax over each row of (B H T, T), in place, and its backward */
    dnnl_memory_desc_t rows_md;
    const dnnl_dims_t rows_dims = { B * H * T, T };
    ATTN_TRY(dnnl_memory_desc_init_by_tag(&rows_md, 2, rows_dims, dnnl_f32, dnnl_ab), "rows md");
    dnnl_softmax_desc_t sf, sb;
    ATTN_TRY(dnnl_softmax_forward_desc_init(&sf, dnnl_forward_training, &rows_md, 1),
             "softmax descriptor");
    ATTN_TRY(dnnl_softmax_backward_desc_init(&sb, &rows_md, &rows_md, 1),
             "softmax backward descriptor");
    dnnl_primitive_desc_t fwd_pd = NULL;
    if (attn_prim(a, A_SOFTMAX, &sf, NULL, 1.0f, &fwd_pd))
        return -1;
    const int rc = attn_prim(a, A_DSOFTMAX, &sb, fwd_pd, 1.0f, NULL);
    dnnl_primitive_desc_destroy(fwd_pd);
    dnnl_memory_t mp, mds;
    if (rc || attn_mem(a, &rows_md, P, &mp) || attn_mem(a, &rows_md, dS, &mds))
        return -1;
    const dnnl_exec_arg_t fwd[2] = { { DNNL_ARG_SRC, mp }, { DNNL_ARG_DST, mp } };
    const dnnl_exec_arg_t bwd[3] = {
        { DNNL_ARG_DST, mp }, { DNNL_ARG_DIFF_DST, mds }, { DNNL_ARG_DIFF_SRC, mds },
    };
    memcpy(a->args[A_SOFTMAX], fwd, sizeof fwd);
    a->nargs[A_SOFTMAX] = 2;
    memcpy(a->args[A_DSOFTMAX], bwd, sizeof bwd);
    a->nargs[A_DSOFTMAX] = 3;
    return 0;
}

/* -inf above the diagonal of every (T, T) block: attention.c's loop. */
static void attn_mask(const attn_ref *a)
{
    const int64_t T = a->tokens;
    float *S = a->P;
    for (int64_t blk = 0; blk < a->batch * a->heads; blk++, S += T * T)
        for (int64_t i = 0; i + 1 < T; i++)
            for (int64_t j = i + 1; j < T; j++)
                S[i * T + j] = -INFINITY;
}

static int attn_run(const attn_ref *a, int part)
{
    if (part == A_MASK) {
        attn_mask(a);
        return 0;
    }
    return dnnl_primitive_execute(a->prim[part], a->stream, a->nargs[part], a->args[part]) ==
                   dnnl_success &&
                   dnnl_stream_wait(a->stream) == dnnl_success ? 0 : -1;
}

/* Mean seconds of each part of one layer's forward and backward, in the
 * order the model runs them, over a window of at least min_s (one
 * untimed round first); -1 on failure, else the mean per round. */
static double attn_window(const attn_ref *a, double min_s, double part_s[A_PARTS])
{
    for (int i = 0; i < A_PARTS; i++)
        if (attn_run(a, i))
            return -1.0;
    double sum[A_PARTS] = { 0.0 };
    uint64_t n = 0;
    double t0 = now_s(), t = t0;
    do {
        for (int i = 0; i < A_PARTS; i++) {
            const double ta = t;
            if (attn_run(a, i))
                return -1.0;
            t = now_s();
            sum[i] += t - ta;
        }
        n++;
    } while (t - t0 < min_s);
    for (int i = 0; i < A_PARTS; i++)
        part_s[i] = sum[i] / (double)n;
    return (t - t0) / (double)n;
}

/* --unfuse's names, in ST_UNFUSE_* bit order */
static const char *const unfuse_names[] = { "bias", "residual", "weight-copy" };

/* "bias,weight-copy", or "none" */
static void unfuse_text(unsigned bits, char *out, size_t n)
{
    out[0] = '\0';
    for (unsigned k = 0; k < 3; k++)
        if (bits & (1u << k))
            snprintf(out + strlen(out), n - strlen(out), "%s%s", out[0] ? "," : "",
                     unfuse_names[k]);
    if (!out[0])
        snprintf(out, n, "none");
}

/* "bias,residual,weight-copy" (or "both": bias and residual) into bits */
static int parse_unfuse(const char *v, unsigned *bits)
{
    *bits = 0;
    if (strcmp(v, "both") == 0) {
        *bits = ST_UNFUSE_BIAS | ST_UNFUSE_RESIDUAL;
        return 1;
    }
    while (*v) {
        size_t len = strcspn(v, ",");
        unsigned k = 0;
        while (k < 3 && !(strlen(unfuse_names[k]) == len && strncmp(v, unfuse_names[k], len) == 0))
            k++;
        if (k == 3)
            return 0;
        *bits |= 1u << k;
        v += len + (v[len] == ',');
    }
    return *bits != 0;
}

/* ------------------------------------------------------------ the reference */

/* sgemm or the convolution primitives: one call's seconds over a window. */
typedef struct ref_ctx {
    int conv;
    gemm_ctx g;
    conv_ref c;
    conv_ref c16;    /* cnn in bf16: the same convolutions reading bf16 */
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

/* The bf16 reference (bf16 rows): the matmul on sgemm's shape, or the
 * convolutions reading bf16. */
static double ref16_window(ref_ctx *ref, double min_s)
{
    double pass[3];
    if (ref->conv)
        return conv_window(&ref->c16, min_s, pass);
    return gemm16_window(&ref->g, min_s);
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

static int run_config(const bench_config *bc, const bench_options *o, int bf16, bench_result *r)
{
    memset(r, 0, sizeof *r);
    r->cfg = bc;
    r->windows = o->windows;
    r->bf16 = bf16;

    /* One data-parallel worker, a constant rate, and more steps than any
     * measurement takes (the plan needs a length). */
    st_train_config tc = st_train_config_default();
    tc.model.kind = bc->model;
    tc.model.depth = bc->depth;
    tc.model.width = bc->width;
    tc.model.hidden = 0; /* = width */
    tc.model.precision = bf16 ? ST_PRECISION_BF16 : ST_PRECISION_FP32;
    tc.model.unfuse = o->unfuse;
    tc.bf16_emulated = 1;   /* the header names the ISA: an emulated row says so */
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
    if (bc->context) {
        /* as `subtrain --model gpt --data text:FILE` sets it (cli/options.c):
         * a byte id per token in, the next byte (256 classes) out, MLP
         * hidden 4 D, GELU */
        tc.model.context = bc->context;
        tc.model.heads = bc->heads;
        tc.model.in_dim = bc->context;
        tc.model.n_classes = 256;
        tc.model.activation = ST_ACT_GELU;
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
     * rows in a shuffled order, as the trainer's do.  gpt: 4 MiB of
     * generated text, an epoch of 8 batches of windows drawn from it. */
    st_dataset train, test;
    if (bc->context) {
        st_text text;
        if (make_text((size_t)4 << 20, tc.seed, &text)) {
            fprintf(stderr, "bench_step: out of memory for the text\n");
            return EXIT_FAILURE;
        }
        st_status ts = st_text_dataset(&text, bc->context, tc.seed, 8u * (uint32_t)bc->batch,
                                       0, &train, &test);
        st_text_free(&text);
        if (ts != ST_OK)
            return fail("text data");
    } else {
        st_synthetic_config sc = st_synthetic_defaults(tc.seed);
        sc.train_count = 8u * (uint32_t)bc->batch;
        sc.test_count = 1;
        if (st_synthetic_make(&sc, &train, &test) != ST_OK)
            return fail("synthetic data");
        st_dataset_normalize(&train, &test, NULL, NULL);
    }
    if (bc->in_channels) {
        /* the same 784 features, read as 1 x 28 x 28 images */
        train.channels = test.channels = (uint32_t)bc->in_channels;
        train.height = test.height = (uint32_t)bc->in_height;
        train.width = test.width = (uint32_t)bc->in_width;
    }

    int rc = EXIT_SUCCESS;
    st_trainer *t = NULL;
    ref_ctx ref = { .conv = bc->conv_ref };
    attn_ref attn;
    memset(&attn, 0, sizeof attn);
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
        if (conv_ref_init(&ref.c, sh, bc->batch, 0) ||
            (bf16 && conv_ref_init(&ref.c16, sh, bc->batch, 1))) {
            rc = EXIT_FAILURE;
            goto out;
        }
        if (bf16) {
            r->ref16_flops = 3.0 * conv_pass_flops(sh, bc->batch);
            snprintf(r->ref16_impl, sizeof r->ref16_impl, "%s", ref.c16.impl[0]);
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
        /* resmlp: M = batch, N = K = width.  gpt: fc1's forward, M = B T
         * rows, K = D, N = 4 D (see the header comment). */
        const int64_t M = (int64_t)bc->batch * (bc->context ? bc->context : 1);
        const int64_t N = bc->context ? 4 * (int64_t)bc->width : bc->width, K = bc->width;
        if (gemm_init(&ref.g, M, N, K)) {
            fprintf(stderr, "bench_step: out of memory for the sgemm buffers\n");
            rc = EXIT_FAILURE;
            goto out;
        }
        r->ref_name = "sgemm";
        r->gemm_m = M, r->gemm_n = N, r->gemm_k = K;
        snprintf(r->ref_shape, sizeof r->ref_shape, "%lldx%lldx%lld", (long long)M,
                 (long long)N, (long long)K);
        r->ref_flops = 2.0 * (double)ref.g.m * (double)ref.g.n * (double)ref.g.k;
        if (bf16) {
            if (gemm16_init(&ref.g, r->ref16_impl, sizeof r->ref16_impl)) {
                rc = EXIT_FAILURE;
                goto out;
            }
            r->ref16_flops = r->ref_flops;
        }
    }
    if (bc->context) {
        gpt_flops(bc, &r->linear_flops, &r->attn_flops);
        /* the attention kind's products must be in st_model_step_flops */
        const double want = r->linear_flops + r->attn_flops;
        if (r->flops < 0.999 * want || r->flops > 1.001 * want)
            fprintf(stderr, "bench_step: warning: st_model_step_flops counts %.3f GFLOP a step, "
                    "the architecture %.3f (linear %.3f + attention %.3f): the breakdown's "
                    "split may be wrong\n", r->flops * 1e-9, want * 1e-9,
                    r->linear_flops * 1e-9, r->attn_flops * 1e-9);
        if (attn_ref_init(&attn, bc)) {
            rc = EXIT_FAILURE;
            goto out;
        }
        snprintf(r->attn_impl, sizeof r->attn_impl, "%s", attn.impl);
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

    double attn_part[A_PARTS], attn_t[A_PARTS][MAX_WINDOWS];
    if (bc->context && attn_window(&attn, o->gemm_window_s, attn_part) < 0.0) {
        fprintf(stderr, "bench_step: the attention copy failed\n");
        rc = EXIT_FAILURE;
        goto out;
    }

    if (bf16 && ref16_window(&ref, o->gemm_window_s) < 0.0) {   /* its warm-up */
        rc = EXIT_FAILURE;
        goto out;
    }

    double step_t[MAX_WINDOWS], gemm_t[MAX_WINDOWS], gemm16_t[MAX_WINDOWS];
    for (int k = 0; k < o->windows; k++) {
        gemm_t[k] = ref_window(&ref, o->gemm_window_s, pass);
        if (gemm_t[k] < 0.0) {
            rc = EXIT_FAILURE;
            goto out;
        }
        if (bf16 && (gemm16_t[k] = ref16_window(&ref, o->gemm_window_s)) < 0.0) {
            fprintf(stderr, "bench_step: the bf16 reference failed\n");
            rc = EXIT_FAILURE;
            goto out;
        }
        for (int i = 0; i < 3; i++)
            pass_t[i][k] = pass[i];
        /* gpt: a window of the attention copy, as long as sgemm's */
        if (bc->context && attn_window(&attn, o->gemm_window_s, attn_part) < 0.0) {
            fprintf(stderr, "bench_step: the attention copy failed\n");
            rc = EXIT_FAILURE;
            goto out;
        }
        for (int i = 0; bc->context && i < A_PARTS; i++)
            attn_t[i][k] = attn_part[i];
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
    if (bf16) {
        r->ref16_s_med = median(gemm16_t, o->windows);
        r->ref16_s_best = gemm16_t[0];
    }
    if (bc->conv_ref)
        for (int i = 0; i < 3; i++)
            r->conv_pass_s[i] = median(pass_t[i], o->windows);
    for (int i = 0; bc->context && i < A_PARTS; i++)
        r->attn_part_s[i] = median(attn_t[i], o->windows);

    if (breakdown_window(&s, o->step_window_s, r) != ST_OK) {
        rc = fail(bc->name);
        goto out;
    }
    r->last_loss = s.loss;

out:
    if (ref.conv) {
        conv_ref_free(&ref.c);
        conv_ref_free(&ref.c16);
    } else
        gemm_free(&ref.g);
    attn_ref_free(&attn);
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
    else if (c->context)
        snprintf(out, size, "%s d%d w%d T%d", c->name, c->depth, c->width, c->context);
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
           "(resmlp, gpt) or oneDNN's convolutions (cnn)\n");
    printf("oneDNN %d.%d.%d, ISA %s, OpenMP threads %d, CPU %s (%d online), load average %.2f\n",
           v->major, v->minor, v->patch, isa_name(dnnl_get_effective_cpu_isa()),
           omp_get_max_threads(), cpu, omp_get_num_procs(), load_average());
    printf("timing: %d interleaved windows of each kind (step >= %.2f s, reference >= %.2f s), "
           "median window shown%s\n\n", o->windows, o->step_window_s, o->gemm_window_s,
           o->quick ? " [--quick: numbers are rough]" : "");
    if (o->unfuse & (ST_UNFUSE_BIAS | ST_UNFUSE_RESIDUAL))
        printf("unfused: the linear layers' %s added by a pass of its own after the matmul\n",
               (o->unfuse & 3) == 3 ? "bias and skip"
               : o->unfuse & ST_UNFUSE_BIAS ? "bias" : "skip");
    if (o->unfuse & ST_UNFUSE_WEIGHT_COPY)
        printf("unfused: bf16 weight copies made by a reorder in each forward, not written by "
               "the update\n");
    if (o->unfuse)
        printf("\n");
    printf("%-17s %4s %5s %8s %9s %10s %12s %6s %11s %6s %9s\n", "config", "prec", "batch",
           "params", "step ms", "samples/s", "step GFLOP/s", "ref", "ref GFLOP/s", "ratio",
           "vs sgemm");
}

static void print_row(const bench_result *r)
{
    char label[64];
    config_label(r->cfg, label, sizeof label);
    double step_g = gflops(r->flops, r->step_s_med);
    double ref_g = gflops(r->ref_flops, r->ref_s_med);
    double own_g = r->bf16 ? gflops(r->ref16_flops, r->ref16_s_med) : ref_g;
    printf("%-17s %4s %5d %7.2fM %9.2f %10.0f %12.1f %6s %11.1f %6.3f", label,
           r->bf16 ? "bf16" : "fp32", r->cfg->batch, (double)r->params * 1e-6,
           r->step_s_med * 1e3, r->cfg->batch / r->step_s_med, step_g,
           r->bf16 ? (r->cfg->conv_ref ? "bf16cv" : "bf16mm") : r->ref_name, own_g,
           step_g / own_g);
    if (r->cfg->conv_ref)
        printf(" %9s\n", "-");
    else
        printf(" %9.3f\n", step_g / ref_g);
    fflush(stdout);
}

/* gpt: the median step's time by kind.  Attention is the copy's median
 * per-layer parts times the layers; the linear layers' products are taken
 * at sgemm's rate (their FLOPs / the median sgemm GFLOP/s), what they
 * would cost as GEMMs of the reference's speed; the gather and AdamW are
 * the breakdown window's.  What the step takes beyond all of them is
 * `rest`: the layer norms, GELU, the embedding, the loss, the residual
 * adds, and whatever the linear matmul primitives lose to sgemm (so the
 * non-GEMM share is an upper bound).  Every large term is a median of
 * windows interleaved with the step's, so a neighbour's burst in the one
 * breakdown window does not move the split. */
typedef struct gpt_split {
    double attn_mm_s, attn_other_s, linear_s, rest_s, non_gemm_s;
} gpt_split;

static gpt_split gpt_split_of(const bench_result *r)
{
    gpt_split g = { 0.0, 0.0, 0.0, 0.0, 0.0 };
    for (int i = 0; i < A_PARTS; i++)
        *(attn_is_matmul(i) ? &g.attn_mm_s : &g.attn_other_s) += r->attn_part_s[i];
    g.attn_mm_s *= r->cfg->depth;
    g.attn_other_s *= r->cfg->depth;
    g.linear_s = r->linear_flops * r->ref_s_med / r->ref_flops;
    g.rest_s = r->step_s_med - r->gather_s - r->optim_s - g.attn_mm_s - g.attn_other_s -
               g.linear_s;
    g.non_gemm_s = r->gather_s + r->optim_s + g.attn_other_s + g.rest_s;
    return g;
}

static void print_gpt(const bench_result *r, const char *label)
{
    const bench_config *c = r->cfg;
    const gpt_split g = gpt_split_of(r);
    const double p = r->step_s_med, tokens = (double)c->batch * c->context;
    const double step_g = gflops(r->flops, r->step_s_med), ref_g = gflops(r->ref_flops,
                                                                           r->ref_s_med);
    printf("%s: %.0f tokens a step (%d x %d), %.0f tokens/s, %.1f GFLOP/s (%.2f GFLOP a step, "
           "%.2f of them attention's products), %s %s %.1f GFLOP/s, ratio %.3f", label, tokens,
           c->batch, c->context, tokens / r->step_s_med, step_g, r->flops * 1e-9,
           r->attn_flops * 1e-9, r->ref_name, r->ref_shape, ref_g, step_g / ref_g);
    if (!r->bf16)
        printf("; not GEMM: %.1f%% of the step", 100.0 * g.non_gemm_s / p);
    printf("\n");
    if (r->bf16) {
        /* the copy of a layer's attention is built of fp32 primitives and
         * the split takes the products at sgemm's rate: neither is this
         * step's (its products read bf16) */
        printf("%s: attention's parts and the split by kind: fp32 only (the fp32 row); "
               "scripts/primitive-times gives a bf16 step's primitives\n", label);
        return;
    }
    printf("%s: attention, one layer's primitives rebuilt here (matmul %s) x %d layers: "
           "%.2f ms a step (%.1f%%): products %.2f ms at %.1f GFLOP/s = %.3f of sgemm, mask "
           "and softmax %.2f ms (%.1f%%); one layer, ms:", label, r->attn_impl, c->depth,
           (g.attn_mm_s + g.attn_other_s) * 1e3, 100.0 * (g.attn_mm_s + g.attn_other_s) / p,
           g.attn_mm_s * 1e3, gflops(r->attn_flops, g.attn_mm_s),
           gflops(r->attn_flops, g.attn_mm_s) / ref_g, g.attn_other_s * 1e3,
           100.0 * g.attn_other_s / p);
    for (int i = 0; i < A_PARTS; i++)
        printf(" %s %.3f", ATTN_PART_NAMES[i], r->attn_part_s[i] * 1e3);
    printf("\n");
    printf("%s: by kind (median step = 100%%): GEMM: linear products at sgemm's rate "
           "%.2f ms (%.1f%%), attention's products %.2f ms (%.1f%%) | not GEMM: gather %.1f%%, "
           "AdamW %.1f%%, attention's mask and softmax %.1f%%, the rest %.2f ms (%.1f%%: layer "
           "norms, GELU, embedding, loss, adds, and what the linear matmuls lose to sgemm) = "
           "%.1f%%\n", label, g.linear_s * 1e3, 100.0 * g.linear_s / p,
           g.attn_mm_s * 1e3, 100.0 * g.attn_mm_s / p, 100.0 * r->gather_s / p,
           100.0 * r->optim_s / p, 100.0 * g.attn_other_s / p, g.rest_s * 1e3,
           100.0 * g.rest_s / p, 100.0 * g.non_gemm_s / p);
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
    if (r->bf16)
        printf("%s bf16: bf16 %s reference %.1f GFLOP/s (best window %.1f; %s), %s "
               "%.1f; the same shape\n", label, r->cfg->conv_ref ? "convolution" : "matmul",
               gflops(r->ref16_flops, r->ref16_s_med), gflops(r->ref16_flops, r->ref16_s_best),
               r->ref16_impl, r->cfg->conv_ref ? "fp32 convolution" : "sgemm", ref_g);
    printf("%s%s: %s %s; %llu steps in %d windows, step %.2f..%.2f ms; "
           "best windows: step %.1f, %s %.1f GFLOP/s, ratio %.3f\n", label,
           r->bf16 ? " bf16" : "", r->ref_name,
           r->ref_shape, (unsigned long long)r->steps_timed, r->windows,
           r->step_s_best * 1e3, r->step_s_worst * 1e3, best_g, r->ref_name, ref_best_g,
           best_g / ref_best_g);
    /* forward+backward against the reference of the step's own precision
     * (the bf16 product in bf16): how far the products and the passes
     * between them are from the reference, with the update left out */
    double p = r->parts_s;
    const double own_g = r->bf16 ? gflops(r->ref16_flops, r->ref16_s_med) : ref_g;
    const char *own_name = r->bf16 ? (r->cfg->conv_ref ? "bf16 convolution" : "bf16 matmul")
                                   : r->ref_name;
    printf("%s: breakdown per step (one window, %.2f ms): gather %.2f ms (%.1f%%) | "
           "forward+backward %.2f ms (%.1f%%), %.1f GFLOP/s = %.3f of %s | "
           "AdamW %.2f ms (%.1f%%), %.1f GB/s at 28 B/param\n", label, p * 1e3,
           r->gather_s * 1e3, 100.0 * r->gather_s / p, r->fb_s * 1e3, 100.0 * r->fb_s / p,
           gflops(r->flops, r->fb_s), gflops(r->flops, r->fb_s) / own_g, own_name,
           r->optim_s * 1e3, 100.0 * r->optim_s / p,
           28.0 * (double)r->params / r->optim_s * 1e-9);
    if (r->cfg->context)
        print_gpt(r, label);
}

/* gpt: the FLOPs by kind, the attention copy and the step by kind
 * (print_gpt), fields of its record. */
static void write_json_gpt(FILE *f, const bench_result *r)
{
    const gpt_split g = gpt_split_of(r);
    fprintf(f, "\"linear_flops_per_step\":%.0f,\"attention_flops_per_step\":%.0f,",
            r->linear_flops, r->attn_flops);
    if (r->bf16)   /* the attention copy and the split are fp32's (print_gpt) */
        return;
    fprintf(f, "\"attention_impl\":\"%s\",\"attention_layer_ms\":{", r->attn_impl);
    for (int i = 0; i < A_PARTS; i++)
        fprintf(f, "%s\"%s\":%.4f", i ? "," : "", ATTN_PART_NAMES[i], r->attn_part_s[i] * 1e3);
    fprintf(f, "},\"attention_matmul_ms\":%.4f,\"attention_matmul_gflops\":%.3f,"
            "\"attention_other_ms\":%.4f,\"linear_at_sgemm_ms\":%.4f,\"rest_ms\":%.4f,"
            "\"non_gemm_share\":%.4f,", g.attn_mm_s * 1e3,
            gflops(r->attn_flops, g.attn_mm_s), g.attn_other_s * 1e3, g.linear_s * 1e3,
            g.rest_s * 1e3, g.non_gemm_s / r->step_s_med);
}

static void write_json(FILE *f, const bench_result *r, const bench_options *o)
{
    const dnnl_version_t *v = dnnl_version();
    const bench_config *c = r->cfg;
    double step_g = gflops(r->flops, r->step_s_med), ref_g = gflops(r->ref_flops, r->ref_s_med);
    double best_g = gflops(r->flops, r->step_s_best), ref_best_g = gflops(r->ref_flops,
                                                                          r->ref_s_best);
    char unfused[64];
    unfuse_text(o->unfuse, unfused, sizeof unfused);
    fprintf(f, "{\"config\":\"%s\",\"precision\":\"%s\",\"unfuse\":\"%s\",\"model\":\"%s\","
            "\"depth\":%d,\"width\":%d,", c->name, r->bf16 ? "bf16" : "fp32", unfused,
            st_model_kind_name(c->model), c->depth, c->width);
    if (r->bf16)
        fprintf(f, "\"bf16_reference\":\"%s\",\"bf16_ref_gflops\":%.3f,"
                "\"bf16_ref_gflops_best\":%.3f,\"bf16_ref_impl\":\"%s\",\"ratio_bf16\":%.4f,",
                c->conv_ref ? "conv" : "matmul",
                gflops(r->ref16_flops, r->ref16_s_med), gflops(r->ref16_flops, r->ref16_s_best),
                r->ref16_impl, step_g / gflops(r->ref16_flops, r->ref16_s_med));
    if (c->in_channels)
        fprintf(f, "\"input\":\"%dx%dx%d\",", c->in_channels, c->in_height, c->in_width);
    else if (c->context)
        fprintf(f, "\"hidden\":%d,\"context\":%d,\"heads\":%d,\"tokens_per_step\":%d,"
                "\"tokens_per_s\":%.1f,", 4 * c->width, c->context, c->heads,
                c->batch * c->context, (double)c->batch * c->context / r->step_s_med);
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
                (int)r->gemm_m, (int)r->gemm_n, (int)r->gemm_k, ref_g, ref_best_g);
    }
    if (c->context)
        write_json_gpt(f, r);
    const double own_g = r->bf16 ? gflops(r->ref16_flops, r->ref16_s_med) : ref_g;
    fprintf(f, "\"ratio\":%.4f,\"ratio_best\":%.4f,"
            "\"gather_ms\":%.4f,\"forward_backward_ms\":%.4f,\"forward_backward_gflops\":%.3f,"
            "\"forward_backward_ratio\":%.4f,\"optimizer_ms\":%.4f,\"loss\":%.6g}\n",
            step_g / ref_g, best_g / ref_best_g, r->gather_s * 1e3, r->fb_s * 1e3,
            gflops(r->flops, r->fb_s), gflops(r->flops, r->fb_s) / own_g, r->optim_s * 1e3,
            (double)r->last_loss);
}

/* Binds this thread to the PU a one-worker trainer binds its worker to:
 * the same plan (this machine, one worker, the process's PUs). */
static int bind_like_worker_0(void)
{
    st_topology *topo;
    st_plan plan;
    st_plan_request req = { .workers = 1 };
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
    bench_result res[2 * N_CONFIGS];
    int n = 0;
    print_header(o);
    if (bind_like_worker_0() != EXIT_SUCCESS) /* after the header's count of online CPUs */
        return EXIT_FAILURE;
    for (int i = 0; i < N_CONFIGS; i++) {
        if (o->which >= 0 && o->which != i)
            continue;
        for (int bf16 = 0; bf16 < 2; bf16++) {
            if (!(bf16 ? o->bf16 : o->fp32))
                continue;
            int rc = run_config(&CONFIGS[i], o, bf16, &res[n]);
            if (rc != EXIT_SUCCESS)
                return rc;
            print_row(&res[n]);
            if (json)
                write_json(json, &res[n], o);
            n++;
        }
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
    if (o->which < 0 || CONFIGS[o->which].context)
        printf("gpt: FLOPs include attention's six batched products; reference = sgemm on the "
               "MLP's fc1 (B T x 4 D x D); aim: >= 0.7; not GEMM = the median step less its "
               "linear FLOPs at sgemm's rate and attention's products as timed on the copy "
               "(an upper bound)\n");
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

static int scaling_run(const bench_config *bc, int workers, int steps, int bf16,
                       unsigned unfuse, scaling_result *out)
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
    tc.model.precision = bf16 ? ST_PRECISION_BF16 : ST_PRECISION_FP32;
    tc.model.unfuse = unfuse;
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

static int scaling_median(const bench_config *bc, int workers, int steps, int reps, int bf16,
                          unsigned unfuse, scaling_result *med)
{
    scaling_result r[MAX_WINDOWS];
    for (int i = 0; i < reps; i++)
        if (scaling_run(bc, workers, steps, bf16, unfuse, &r[i]) != EXIT_SUCCESS)
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
    bench_config bc = o->which == 1 ? CONFIGS[1] : (bench_config){ "large", ST_MODEL_RESMLP, 8, 1024, 128, 0, 0, 0, 0, 0, 0 };
    int steps = o->quick ? 6 : (bc.width >= 1024 ? 30 : 300);
    int reps = o->quick ? 1 : 3;
    scaling_result one, many;
    /* bf16 when it is the only precision asked for (--precision bf16) */
    const int bf16 = o->bf16 && !o->fp32;
    printf("\ndata-parallel scaling: resmlp d%d w%d %s, batch %d per worker, %d steps, "
           "median of %d runs of st_train_run\n", bc.depth, bc.width, bf16 ? "bf16" : "fp32",
           bc.batch, steps, reps);
    if (scaling_median(&bc, 1, steps, reps, bf16, o->unfuse, &one) != EXIT_SUCCESS ||
        scaling_median(&bc, o->workers, steps, reps, bf16, o->unfuse, &many) != EXIT_SUCCESS)
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
            "usage: bench_step [--config large|small|cnn|gpt|all] [--quick] [--seconds S]\n"
            "                  [--json FILE] [--workers N] [--precision fp32|bf16|both]\n"
            "                  [--unfuse bias,residual,weight-copy|both]\n"
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
            "  gpt:   gpt depth 4 width 256, 4 heads, context 128, hidden 1024 (GELU), on\n"
            "         generated text, batch 16 (2048 tokens); reference: sgemm 2048 x 1024\n"
            "         x 256 (fc1); also times attention's parts on a copy of one layer\n"
            "\n"
            "  --config C    which configuration to run (default: all)\n"
            "  --quick       short windows, for smoke tests (numbers are rough)\n"
            "  --seconds S   timed step seconds per configuration, split into windows\n"
            "                (default 2; --quick: 0.3)\n"
            "  --json FILE   also write one JSON object per configuration (JSON Lines)\n"
            "  --workers N   also run the whole trainer with 1 and N data-parallel workers\n"
            "                (resmlp d8 w1024, batch 128 per worker; with --config small the\n"
            "                small model; not with --config cnn or gpt) and compare\n"
            "                samples/s (in bf16 with --precision bf16; --unfuse applies)\n"
            "  --precision P fp32 (default), bf16 (linear layers in bf16; reference:\n"
            "                oneDNN's bf16 matmul on the same shape, sgemm beside it) or both\n"
            "  --unfuse F    run the linear layers' bias add, skip add or both as passes\n"
            "                of their own instead of in the matmul, and (weight-copy, bf16)\n"
            "                convert the weights in each forward instead of in the update:\n"
            "                a comma list, to measure each fusion\n"
            "  --help        this text\n");
}

int main(int argc, char **argv)
{
    bench_options o = { .which = -1, .windows = 5, .warmup_steps = 3, .fp32 = 1 };
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
            else if (strcmp(v, "gpt") == 0)
                o.which = CONFIG_GPT;
            else
                return usage_error("--config must be large, small, cnn, gpt or all, got '%s'",
                                   v);
        } else if ((v = option_value(argc, argv, &i, "--precision", &missing))) {
            o.fp32 = strcmp(v, "fp32") == 0 || strcmp(v, "both") == 0;
            o.bf16 = strcmp(v, "bf16") == 0 || strcmp(v, "both") == 0;
            if (!o.fp32 && !o.bf16)
                return usage_error("--precision must be fp32, bf16 or both, got '%s'", v);
        } else if ((v = option_value(argc, argv, &i, "--unfuse", &missing))) {
            if (!parse_unfuse(v, &o.unfuse))
                return usage_error("--unfuse takes a comma list of bias, residual and "
                                   "weight-copy (or both), got '%s'", v);
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

    if (o.workers > 1 && (o.which == CONFIG_CNN || o.which == CONFIG_GPT))
        return usage_error("--workers measures resmlp scaling; not with --config %s",
                           CONFIGS[o.which].name);
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

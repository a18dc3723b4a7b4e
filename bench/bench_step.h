/*
 * bench/bench_step.h — what the files of bench_step share (bench_step.c
 * says what it measures and how):
 *
 *   bench_step.c         the configurations, the options, the runs of
 *                        every configuration, data-parallel scaling
 *   bench_step_run.c     one configuration: its trainer, the reference
 *                        and step windows interleaved, the breakdown
 *   bench_step_ref.c     the references: sgemm, the bf16 matmul, oneDNN's
 *                        convolutions
 *   bench_step_gpt.c     the gpt configuration: its FLOPs, its text, the
 *                        copy of one attention layer that times its parts
 *   bench_step_output.c  the table, the details and the JSON records
 *
 * Public headers only (and oneDNN's): a program of the library's users.
 */
#ifndef SUBTRAIN_BENCH_STEP_H
#define SUBTRAIN_BENCH_STEP_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <oneapi/dnnl/dnnl.h>

#define BENCH_NAME "bench_step"
#include "bench_util.h"

#include <subtrain/subtrain.h>

#define MAX_WINDOWS 32

typedef struct bench_config {
    const char *name;   /* as given to --config */
    const char *model;  /* its --model name */
    int depth, width, batch;
    int in_channels, in_height, in_width;   /* images; 0: 784 features */
    int conv_ref;       /* 1: the convolution reference, 0: sgemm */
    int context, heads; /* sequence models: tokens per sample, heads; 0: none */
} bench_config;

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
    st_precision activations; /* of the bf16 rows' tensors between layers
                             * (--activation-precision) */
    st_tensor_layout layout; /* cnn's image tensors (--tensor-layout) */
    st_weight_layout weights; /* the bf16 rows' linear weight copies
                             * (--weight-layout) */
    int activation;         /* st_activation of resmlp and gpt (--activation); -1:
                             * the configs' own (GELU) */
    unsigned moments;       /* 1 << st_moments: the optimizer states that get a row
                             * (--optimizer-moments) */
    unsigned recompute;     /* 1 << st_recompute: the modes that get a row (--recompute) */
} bench_options;

/* The parts of an attention layer's forward and backward, in the order
 * the model runs them (the gpt config times them: attn_ref). */
enum {
    A_SCORES, A_MASK, A_SOFTMAX, A_CONTEXT,         /* forward */
    A_DV, A_DP, A_DSOFTMAX, A_DQ, A_DK,             /* backward */
    A_PARTS
};

extern const char *const ATTN_PART_NAMES[A_PARTS];   /* bench_step_gpt.c */

typedef struct bench_result {
    const bench_config *cfg;
    int bf16;                       /* the row's precision: linear layers in bf16 */
    st_moments moments;             /* the row's optimizer state */
    st_activation activation;       /* the model's */
    st_recompute recompute;         /* the row's activation recomputation */
    size_t act_bytes;               /* the worker's peak activations + attention bytes */
    double optim_bytes_per_param;   /* what the update read and wrote (the record's) */
    double ref16_flops;             /* bf16: the bf16 matmul reference, per call */
    double ref16_s_med, ref16_s_best;
    char ref16_impl[32];
    double wgrad16_s[4];            /* bf16 matmul configs: wgrad16_windows */
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

/* ------------------------------------------------------------ bench_step_ref.c */

typedef struct gemm_ctx {
    int64_t m, n, k;
    float *a, *b, *c;
    /* the bf16 reference: a matmul primitive, bf16 A and B, fp32 C */
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    dnnl_primitive_t mm16;
    dnnl_memory_t a16, b16, c32;
    /* the weight-gradient product of that layer, dB (k, n) = A^T dC in
     * bf16: A^T read from A as it lies (as the layers do), or from a
     * contiguous copy, and the transposition that would make the copy */
    dnnl_primitive_t wg_read, wg_copy, wg_transpose;
    dnnl_memory_t at16, dc16, db32;
} gemm_ctx;

/* A convolution shape of a model and its FLOPs summed over the model's
 * convolutions of that shape and their passes, per step. */
typedef struct conv_shape {
    int64_t ic, oc, h, w, k, stride, pad;
    double step_flops;
} conv_shape;

#define MAX_CONV_SHAPES 32

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

/* sgemm or the convolution primitives: one call's seconds over a window. */
typedef struct ref_ctx {
    int conv;
    gemm_ctx g;
    conv_ref c;
    conv_ref c16;    /* cnn in bf16: the same convolutions reading bf16 */
} ref_ctx;

/* count floats, 64-byte aligned (free()); NULL when out of memory. */
float *alloc_floats(size_t count);
/* A primitive's implementation ("brg:avx512_core", ...) into out. */
void conv_impl_name(const_dnnl_primitive_desc_t pd, char *out, size_t size);
/* sgemm's operands for C (m, n) = A (m, k) . B (k, n); -1: out of memory. */
int gemm_init(gemm_ctx *g, int64_t m, int64_t n, int64_t k);
/* The bf16 matmul on g's shape, its implementation in impl; -1: none. */
int gemm16_init(gemm_ctx *g, char *impl, size_t size);
/* Seconds a call of the weight-gradient product reading A transposed
 * (out[0]), from a contiguous copy (out[1]), and of the copy (out[2]),
 * each over a window of min_s; -1 where that is missing. */
/* out: seconds of the transposed read, the copy's product and the copy;
 * out[3] the fraction of the outputs whose bits differ between the two
 * reads (-1 where a piece is missing) */
void wgrad16_windows(const gemm_ctx *g, double min_s, double out[4]);
void gemm_free(gemm_ctx *g);
/* One pass of a convolution shape at batch, 2 FLOPs per multiply-add. */
double conv_pass_flops(const conv_shape *c, int64_t batch);
/* A resnet configuration's convolutions by shape into list (at most
 * MAX_CONV_SHAPES); their number, *best the one with the most FLOPs. */
int conv_shapes(const bench_config *bc, conv_shape *list, int *best);
/* The three primitives of a shape (bf16: reading bf16); -1 on failure. */
int conv_ref_init(conv_ref *c, const conv_shape *sh, int64_t batch, int bf16);
void conv_ref_free(conv_ref *c);
/* One reference call's seconds over a window of at least min_s (conv: each
 * pass's in pass_s), and the bf16 reference's; -1 on failure. */
double ref_window(ref_ctx *ref, double min_s, double pass_s[3]);
double ref16_window(ref_ctx *ref, double min_s);

/* ------------------------------------------------------------ bench_step_gpt.c */

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

/* The FLOPs of the gpt configuration's linear layers and attention. */
void gpt_flops(const bench_config *bc, double *linear, double *attention);
/* n bytes of pseudo-English; -1: out of memory. */
int make_text(size_t n, uint64_t seed, st_text *out);
/* The copy of one attention layer of bc; -1 on failure. */
int attn_ref_init(attn_ref *a, const bench_config *bc);
/* Each part's mean seconds over a window of at least min_s; -1 on failure,
 * else the mean per round. */
double attn_window(const attn_ref *a, double min_s, double part_s[A_PARTS]);
void attn_ref_free(attn_ref *a);

/* ------------------------------------------------------------ bench_step_run.c */

/* "bench_step: what: st_last_error()" on stderr; EXIT_FAILURE. */
int fail(const char *what);
/* One configuration in one precision and optimizer state, measured into
 * r; an exit status. */
/* The configuration's trainer options (model, batch, precision, the
 * options' fusions and activation precision; one worker, a constant
 * rate); the caller sets the rest. */
void bench_train_config(const bench_config *bc, const bench_options *o, int bf16,
                        st_train_config *tc);
/* count training samples of the config's data (gpt: windows of generated
 * text), as the trainer reads them; EXIT_FAILURE with a message. */
int bench_data(const bench_config *bc, uint64_t seed, uint32_t count, st_dataset *train,
               st_dataset *test);
int run_config(const bench_config *bc, const bench_options *o, int bf16, st_moments moments,
               st_recompute recompute, bench_result *r);

/* ------------------------------------------------------------ bench_step_output.c */

void print_header(const bench_options *o);
void print_row(const bench_result *r);
void print_details(const bench_result *r);
void write_json(FILE *f, const bench_result *r, const bench_options *o);
/* --unfuse's value into ST_UNFUSE_* bits; 0 if it is not one. */
int parse_unfuse(const char *v, unsigned *bits);

#endif /* SUBTRAIN_BENCH_STEP_H */

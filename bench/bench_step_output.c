/*
 * bench/bench_step_output.c — what bench_step prints and writes: the
 * header with the machine's facts, a table row per configuration and
 * precision, the details below the table (the breakdown, and for gpt the
 * step by kind) and one JSON record each.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include "bench_step.h"

/* The six parts that are matrix products. */
static int attn_is_matmul(int part)
{
    return part != A_MASK && part != A_SOFTMAX && part != A_DSOFTMAX;
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

/* --unfuse's value into ST_UNFUSE_* bits ("both": bias and residual); 0
 * if it is not one. */
int parse_unfuse(const char *v, unsigned *bits)
{
    if (strcmp(v, "both") == 0) {
        *bits = ST_UNFUSE_BIAS | ST_UNFUSE_RESIDUAL;
        return 1;
    }
    return st_unfuse_parse(v, bits) == ST_OK && *bits != 0;
}

/* ------------------------------------------------------------ output */

static double gflops(double flops, double s)
{
    return flops / s * 1e-9;
}

static void config_label(const bench_config *c, char *out, size_t size)
{
    if (strcmp(c->model, "resmlp") == 0)   /* the lines of the resmlp configs as they were */
        snprintf(out, size, "%s d%d w%d", c->name, c->depth, c->width);
    else if (c->context)
        snprintf(out, size, "%s d%d w%d T%d", c->name, c->depth, c->width, c->context);
    else
        snprintf(out, size, "%s %s d%d w%d", c->name, c->model, c->depth, c->width);
}

void print_header(const bench_options *o)
{
    const dnnl_version_t *v = dnnl_version();
    char cpu[128];
    cpu_name(cpu, sizeof cpu);
    printf("bench_step: one training step (gather, forward, backward, AdamW) vs dnnl_sgemm "
           "(resmlp, gpt) or oneDNN's convolutions (cnn)\n");
    printf("oneDNN %d.%d.%d, ISA %s, OpenMP threads %d, CPU %s (%d online), load average %.2f\n",
           v->major, v->minor, v->patch, st_cpu_isa_name(),
           omp_get_max_threads(), cpu, omp_get_num_procs(), load_average());
    printf("timing: %d interleaved windows of each kind (step >= %.2f s, reference >= %.2f s), "
           "median window shown, %s%s\n\n", o->windows, o->step_window_s, o->gemm_window_s,
           bench_clock() == CLOCK_MONOTONIC ? "wall-clock time"
                                            : "the thread's CPU time (BENCH_CLOCK=thread)",
           o->quick ? " [--quick: numbers are rough]" : "");
    if (o->unfuse & (ST_UNFUSE_BIAS | ST_UNFUSE_RESIDUAL))
        printf("unfused: the linear layers' %s added by a pass of its own after the matmul\n",
               (o->unfuse & 3) == 3 ? "bias and skip"
               : o->unfuse & ST_UNFUSE_BIAS ? "bias" : "skip");
    if (o->unfuse & ST_UNFUSE_WEIGHT_COPY)
        printf("unfused: bf16 weight copies made by a reorder in each forward, not written by "
               "the update\n");
    if (o->unfuse & ST_UNFUSE_RELU)
        printf("unfused: a ReLU after a linear layer is an eltwise pass of its own, not the "
               "matmul's post-op\n");
    if (o->unfuse & ST_UNFUSE_RELU_BACKWARD)
        printf("unfused: a fused ReLU's backward is an eltwise pass of its own, not a mask "
               "post-op of the next layer's backward-data product\n");
    if (o->unfuse & ST_UNFUSE_GELU_BACKWARD)
        printf("unfused: a bf16 GELU's backward is oneDNN's eltwise pass, not a multiply by "
               "gelu'(x) in the next layer's backward-data product\n");
    if (o->unfuse & ST_UNFUSE_BN_RELU)
        printf("unfused: a ReLU after a batch norm is an eltwise pass of its own, not the "
               "norm's fuse_norm_relu\n");
    if (o->activation >= 0)
        printf("activation of resmlp and gpt: %s\n", st_activation_name(o->activation));
    if (o->activations == ST_PRECISION_BF16)
        printf("bf16 rows: the tensors between layers in bf16 (--activation-precision bf16)\n");
    if (o->weights == ST_WEIGHT_LAYOUT_BLOCKED)
        printf("bf16 rows: linear weights in the products' blocked layouts (--weight-layout "
               "blocked)\n");
    printf("cnn's image tensors: fp32 %s, bf16 %s (--tensor-layout %s)\n",
           st_tensor_layout_name(st_tensor_layout_resolve(o->layout, ST_PRECISION_FP32)),
           st_tensor_layout_name(st_tensor_layout_resolve(o->layout, ST_PRECISION_BF16)),
           st_tensor_layout_name(o->layout));
    printf("\n");
    printf("%-17s %4s %5s %8s %9s %10s %12s %6s %11s %6s %9s %7s %7s %6s %6s %8s\n", "config",
           "prec", "batch", "params", "step ms", "samples/s", "step GFLOP/s", "ref",
           "ref GFLOP/s", "ratio", "vs sgemm", "moments", "opt B/p", "opt %", "recomp",
           "act MiB");
}

void print_row(const bench_result *r)
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
        printf(" %9s", "-");
    else
        printf(" %9.3f", step_g / ref_g);
    /* the optimizer: its state, bytes a parameter, share of the breakdown's step */
    printf(" %7s %7.1f %5.1f%% %6s %8.2f\n", st_moments_name(r->moments),
           r->optim_bytes_per_param, 100.0 * r->optim_s / r->parts_s,
           st_recompute_name(r->recompute), (double)r->act_bytes / 1048576.0);
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

void print_details(const bench_result *r)
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
    if (r->wgrad16_s[0] > 0.0 && r->wgrad16_s[1] > 0.0) {
        const double f = r->ref16_flops;   /* the same m n k */
        printf("%s bf16: its weight-gradient product %lldx%lldx%lld (A^T dC) %.1f GFLOP/s "
               "reading A transposed, %.1f from a contiguous copy (%s); the copy %.3f ms, "
               "%.2f of the product; %.1f%% of the outputs differ in bits (-100: not compared)\n", label,
               (long long)r->gemm_k, (long long)r->gemm_n, (long long)r->gemm_m,
               gflops(f, r->wgrad16_s[0]), gflops(f, r->wgrad16_s[1]),
               r->wgrad16_s[1] < r->wgrad16_s[0] ? "faster" : "not faster",
               r->wgrad16_s[2] * 1e3, r->wgrad16_s[2] / r->wgrad16_s[1],
               100.0 * r->wgrad16_s[3]);
    }
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
           "AdamW (%s moments) %.2f ms (%.1f%%), %.1f GB/s at %.1f B/param\n", label, p * 1e3,
           r->gather_s * 1e3, 100.0 * r->gather_s / p, r->fb_s * 1e3, 100.0 * r->fb_s / p,
           gflops(r->flops, r->fb_s), gflops(r->flops, r->fb_s) / own_g, own_name,
           st_moments_name(r->moments), r->optim_s * 1e3, 100.0 * r->optim_s / p,
           r->optim_bytes_per_param * (double)r->params / r->optim_s * 1e-9,
           r->optim_bytes_per_param);
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

void write_json(FILE *f, const bench_result *r, const bench_options *o)
{
    const dnnl_version_t *v = dnnl_version();
    const bench_config *c = r->cfg;
    double step_g = gflops(r->flops, r->step_s_med), ref_g = gflops(r->ref_flops, r->ref_s_med);
    double best_g = gflops(r->flops, r->step_s_best), ref_best_g = gflops(r->ref_flops,
                                                                          r->ref_s_best);
    char unfused[80];
    st_unfuse_describe(o->unfuse, unfused, sizeof unfused);
    fprintf(f, "{\"config\":\"%s\",\"precision\":\"%s\",\"unfuse\":\"%s\",\"model\":\"%s\","
            "\"clock\":\"%s\",\"activation\":\"%s\",\"depth\":%d,\"width\":%d,"
            "\"optimizer_moments\":\"%s\","
            "\"optimizer_bytes_per_param\":%.2f,\"optimizer_share\":%.4f,"
            "\"recompute\":\"%s\",\"activation_bytes\":%zu,\"activation_precision\":\"%s\","
            "\"tensor_layout\":\"%s\",\"weight_layout\":\"%s\",",
            c->name,
            r->bf16 ? "bf16" : "fp32", unfused, c->model,
            bench_clock() == CLOCK_MONOTONIC ? "wall" : "thread", st_activation_name(r->activation),
            c->depth, c->width, st_moments_name(r->moments), r->optim_bytes_per_param,
            r->optim_s / r->parts_s, st_recompute_name(r->recompute), r->act_bytes,
            st_precision_name(r->bf16 ? o->activations : ST_PRECISION_FP32),
            st_tensor_layout_name(st_tensor_layout_resolve(
                o->layout, r->bf16 ? ST_PRECISION_BF16 : ST_PRECISION_FP32)),
            st_weight_layout_name(r->bf16 ? o->weights : ST_WEIGHT_LAYOUT_PLAIN));
    if (r->wgrad16_s[0] > 0.0 && r->wgrad16_s[1] > 0.0)
        fprintf(f, "\"wgrad_transposed_gflops\":%.3f,\"wgrad_contiguous_gflops\":%.3f,"
                "\"wgrad_copy_ms\":%.4f,\"wgrad_differ\":%.4f,",
                gflops(r->ref16_flops, r->wgrad16_s[0]), gflops(r->ref16_flops, r->wgrad16_s[1]),
                r->wgrad16_s[2] * 1e3, r->wgrad16_s[3]);
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
            v->major, v->minor, v->patch, st_cpu_isa_name(), r->flops,
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

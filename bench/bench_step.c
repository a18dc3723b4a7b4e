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
 *
 * The program's files, by concern: bench_step.h.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "bench_step.h"

/* (a) the large model: big enough that GEMMs dominate;
 * (b) the README's default recipe;
 * (c) `subtrain --model resnet` on Fashion-MNIST: the default ResNet;
 * (d) `subtrain --model gpt` as issue 12 sizes it: T = 128, D = 256. */
static const bench_config CONFIGS[] = {
    { "large", "resmlp", 8, 1024, 256, 0, 0, 0, 0, 0, 0 },
    { "small", "resmlp", 4, 256, 128, 0, 0, 0, 0, 0, 0 },
    { "cnn", "resnet", 3, 16, 128, 1, 28, 28, 1, 0, 0 },
    { "gpt", "gpt", 4, 256, 16, 0, 0, 0, 0, 128, 4 },
};
#define CONFIG_CNN 2
#define CONFIG_GPT 3
#define N_CONFIGS ((int)(sizeof CONFIGS / sizeof CONFIGS[0]))
#define N_MOMENTS 3   /* st_moments: fp32, bf16, bf16-sr */

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
    bench_result res[2 * N_MOMENTS * N_CONFIGS * 3];
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
            for (int k = 0; k < N_MOMENTS; k++)
                for (int rm = 0; rm < 3; rm++) {
                    if (!(o->moments & (1u << k)) || !(o->recompute & (1u << rm)))
                        continue;
                    int rc = run_config(&CONFIGS[i], o, bf16, (st_moments)k, (st_recompute)rm,
                                        &res[n]);
                    if (rc != EXIT_SUCCESS)
                        return rc;
                    print_row(&res[n]);
                    if (json)
                        write_json(json, &res[n], o);
                    n++;
                }
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
 * data, once with 1 worker and twice with N, each worker at batch B: the
 * N workers reading a weight copy per NUMA domain (as training runs), the
 * same with the whole reduction after the backward
 * (st_train_config.reduce_after_backward), and each its own replica
 * (st_train_config.weights).  The trainer's own
 * samples/s counts training time only (no evaluation), over all steps of
 * the run; the median of `reps` runs is shown. */
typedef struct scaling_result {
    double samples_per_s;
    st_epoch_record rec;
} scaling_result;

static int scaling_run(const bench_config *bc, const bench_options *o, int bf16, int workers,
                       int steps, st_weights weights, int after, scaling_result *out)
{
    st_train_config tc = st_train_config_default();
    bench_train_config(bc, o, bf16, &tc);
    tc.workers = workers;
    tc.steps = (uint64_t)steps;
    tc.weights = weights;
    tc.reduce_after_backward = after;
    st_dataset train, test;
    if (bench_data(bc, 1, (uint32_t)(steps * workers * bc->batch), &train, &test) !=
        EXIT_SUCCESS)
        return EXIT_FAILURE;
    st_status s = st_train_config_check(&tc);
    if (s == ST_OK)
        s = st_train_run(&tc, &train, &test, NULL, &out->rec);
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

static int scaling_median(const bench_config *bc, const bench_options *o, int bf16, int workers,
                          int steps, int reps, st_weights weights, int after,
                          scaling_result *med)
{
    scaling_result r[MAX_WINDOWS];
    for (int i = 0; i < reps; i++)
        if (scaling_run(bc, o, bf16, workers, steps, weights, after, &r[i]) != EXIT_SUCCESS)
            return EXIT_FAILURE;
    qsort(r, (size_t)reps, sizeof *r, cmp_scaling);
    *med = r[reps / 2];
    return EXIT_SUCCESS;
}

/* overlapped: the reduction and update done during the backward;
 * exposed: the step's time beyond compute and that (wait, reduce,
 * optimizer), as a share of the step */
static void print_scaling_row(int workers, const char *weights, const scaling_result *r,
                              double base)
{
    const st_epoch_record *e = &r->rec;
    const double step = e->step_ms_compute + e->step_ms_wait + e->step_ms_reduce +
                        e->step_ms_optimizer + e->step_ms_overlapped;
    const double exposed = e->step_ms_wait + e->step_ms_reduce + e->step_ms_optimizer;
    printf("%7d %-8s %12.0f %8.2fx %9.2f %7.2f %8.2f %9.2f %11.2f %8.1f%% %11.1f %11.1f\n",
           workers, weights, r->samples_per_s, r->samples_per_s / base, e->step_ms_compute,
           e->step_ms_wait, e->step_ms_reduce, e->step_ms_optimizer, e->step_ms_overlapped,
           step > 0.0 ? 100.0 * exposed / step : 0.0, e->comm_bytes_per_worker_step / 1e6,
           (double)e->memory.peak_total / 1048576.0);
}

static void scaling_json(FILE *f, const bench_config *bc, int bf16, int workers,
                         const char *weights, const scaling_result *r, double base)
{
    const st_epoch_record *e = &r->rec;
    fprintf(f, "{\"scaling\":\"%s\",\"precision\":\"%s\",\"batch\":%d,\"workers\":%d,"
            "\"weights\":\"%s\",\"samples_per_s\":%.1f,\"tokens_per_s\":%.1f,"
            "\"vs_one_worker\":%.4f,\"compute_ms\":%.3f,\"wait_ms\":%.3f,\"reduce_ms\":%.3f,"
            "\"optimizer_ms\":%.3f,\"overlapped_ms\":%.3f,\"comm_bytes_per_worker_step\":%.0f,"
            "\"peak_bytes_per_worker\":%zu}\n",
            bc->name, bf16 ? "bf16" : "fp32", bc->batch, workers, weights, r->samples_per_s,
            r->samples_per_s * (bc->context ? bc->context : 0), r->samples_per_s / base,
            e->step_ms_compute, e->step_ms_wait, e->step_ms_reduce, e->step_ms_optimizer,
            e->step_ms_overlapped, e->comm_bytes_per_worker_step, e->memory.peak_total);
}

/* 1 and N workers of one config in one precision, the rows alternating
 * kinds as scaling_median runs them. */
static int scaling_of(const bench_config *bc, const bench_options *o, int bf16, FILE *json)
{
    /* about as long a run for each config: the small steps are short */
    int steps = o->quick ? 6 : (bc->width >= 1024 || bc->in_channels || bc->context ? 30 : 300);
    int reps = o->quick ? 1 : 3;
    scaling_result one, many, after, replicas;
    printf("\ndata-parallel scaling: %s %s d%d w%d %s, batch %d per worker, %d steps, "
           "median of %d runs of st_train_run\n", bc->name, bc->model, bc->depth, bc->width,
           bf16 ? "bf16" : "fp32", bc->batch, steps, reps);
    /* the N workers' runs with a weight copy per NUMA domain (as training
     * runs) and with a replica per worker, alternately: a same-run ratio */
    if (scaling_median(bc, o, bf16, 1, steps, reps, ST_WEIGHTS_SHARED, 0, &one) !=
            EXIT_SUCCESS ||
        scaling_median(bc, o, bf16, o->workers, steps, reps, ST_WEIGHTS_SHARED, 0, &many) !=
            EXIT_SUCCESS ||
        scaling_median(bc, o, bf16, o->workers, steps, reps, ST_WEIGHTS_SHARED, 1, &after) !=
            EXIT_SUCCESS ||
        scaling_median(bc, o, bf16, o->workers, steps, reps, ST_WEIGHTS_PRIVATE, 0,
                       &replicas) != EXIT_SUCCESS)
        return EXIT_FAILURE;
    printf("workers weights     samples/s  vs 1 wk  compute ms  wait ms  reduce ms  optimizer ms"
           "  overlap ms  exposed  comm MB/step  peak MiB/wk\n");
    print_scaling_row(1, "own", &one, one.samples_per_s);
    print_scaling_row(o->workers, "shared", &many, one.samples_per_s);
    print_scaling_row(o->workers, "after", &after, one.samples_per_s);
    print_scaling_row(o->workers, "replicas", &replicas, one.samples_per_s);
    if (bc->context)
        printf("tokens/s = samples/s x %d\n", bc->context);
    if (json) {
        scaling_json(json, bc, bf16, 1, "own", &one, one.samples_per_s);
        scaling_json(json, bc, bf16, o->workers, "shared", &many, one.samples_per_s);
        scaling_json(json, bc, bf16, o->workers, "after", &after, one.samples_per_s);
        scaling_json(json, bc, bf16, o->workers, "replicas", &replicas, one.samples_per_s);
    }
    printf("ring all-reduce among %d distributed workers would send %.1f MB per worker and step\n",
           o->workers, many.rec.ring_bytes_per_worker_step / 1e6);
    return EXIT_SUCCESS;
}

/* --workers N: the whole trainer with 1 and N data-parallel workers, for
 * each config and precision asked; the large resmlp at batch 128 per
 * worker (the many-core measurement's shape), the others at their own. */
static int run_scaling(const bench_options *o, FILE *json)
{
    const bench_config large128 = { "large", "resmlp", 8, 1024, 128, 0, 0, 0, 0, 0, 0 };
    for (int i = 0; i < N_CONFIGS; i++) {
        if (o->which >= 0 && o->which != i)
            continue;
        const bench_config *bc = i == 0 ? &large128 : &CONFIGS[i];
        for (int bf16 = 0; bf16 < 2; bf16++)
            if ((bf16 ? o->bf16 : o->fp32) && scaling_of(bc, o, bf16, json) != EXIT_SUCCESS)
                return EXIT_FAILURE;
    }
    printf("weights: shared = a copy per NUMA domain, updated in place by the shard owners; "
           "after = the same, its reduction and update after the backward; replicas = a "
           "replica per worker, filled by the all-gather; overlap = reduction and update "
           "during the backward; exposed = (wait + reduce + optimizer) / step\n");
    return EXIT_SUCCESS;
}

/* ------------------------------------------------------------ options */

/* "none,blocks" or "all" ... into 1 << st_recompute bits; 0 if it is not
 * one.  "all" is a mode: every mode is "none,blocks,all". */
static int parse_recompute(const char *v, unsigned *bits)
{
    *bits = 0;
    char word[16];
    while (*v) {
        const size_t len = strcspn(v, ",");
        st_recompute r;
        if (len == 0 || len >= sizeof word)
            return 0;
        memcpy(word, v, len);
        word[len] = '\0';
        if (st_recompute_parse(word, &r) != ST_OK)
            return 0;
        *bits |= 1u << r;
        v += len + (v[len] == ',');
    }
    return *bits != 0;
}

/* "fp32,bf16-sr" or "all" into 1 << st_moments bits; 0 if it is not one. */
static int parse_moments(const char *v, unsigned *bits)
{
    *bits = 0;
    if (strcmp(v, "all") == 0) {
        *bits = (1u << N_MOMENTS) - 1;
        return 1;
    }
    char word[16];
    while (*v) {
        const size_t len = strcspn(v, ",");
        st_moments m;
        if (len == 0 || len >= sizeof word)
            return 0;
        memcpy(word, v, len);
        word[len] = '\0';
        if (st_moments_parse(word, &m) != ST_OK)
            return 0;
        *bits |= 1u << m;
        v += len + (v[len] == ',');
    }
    return *bits != 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: bench_step [--config large|small|cnn|gpt|all] [--quick] [--seconds S]\n"
            "                  [--json FILE] [--workers N] [--precision fp32|bf16|both]\n"
            "                  [--unfuse bias,residual,weight-copy,relu,bn-relu,\n"
            "                            relu-backward,gelu-backward|both]\n"
            "                  [--activation relu|gelu]\n"
            "                  [--optimizer-moments fp32,bf16,bf16-sr|all]\n"
            "                  [--recompute none,blocks,all] [--activation-precision fp32|bf16]\n"
            "                  [--tensor-layout auto|blocked|nhwc] [--weight-layout plain|blocked]\n"
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
            "                for each config (large at batch 128 per worker) and precision\n"
            "                asked, N with a weight copy per NUMA domain (reducing during\n"
            "                the backward, and after it) and with a replica per worker, and\n"
            "                compare samples/s (--unfuse and --activation-precision apply;\n"
            "                --json gets a line per row)\n"
            "  --precision P fp32 (default), bf16 (linear layers in bf16; reference:\n"
            "                oneDNN's bf16 matmul on the same shape, sgemm beside it) or both\n"
            "  --unfuse F    run the linear layers' bias add, skip add or both as passes\n"
            "                of their own instead of in the matmul, (weight-copy, bf16)\n"
            "                convert the weights in each forward instead of in the update,\n"
            "                (relu) a ReLU after a linear layer, (bn-relu) after a batch\n"
            "                norm as an eltwise pass, (relu-backward) the backward of a\n"
            "                fused ReLU as a pass, (gelu-backward, bf16 activations) a\n"
            "                GELU's backward as a pass, not a multiply in the next\n"
            "                product: a comma list, to measure each fusion\n"
            "  --activation-precision P   the bf16 rows' tensors between layers: fp32\n"
            "                (default) or bf16 (subtrain --activation-precision)\n"
            "  --weight-layout W   the bf16 rows' linear weight copies: plain (default)\n"
            "                or blocked (subtrain --weight-layout)\n"
            "  --tensor-layout L   cnn's image tensors between layers: auto (default:\n"
            "                channels last where oneDNN's convolution takes it in the\n"
            "                row's precision, as on AMX in bf16; else blocked), blocked\n"
            "                (nChw16c) or nhwc\n"
            "  --activation A   relu or gelu in resmlp and gpt (default gelu; the step\n"
            "                rows only; cnn's ResNet is ReLU)\n"
            "  --optimizer-moments M   the optimizer's state of each row: a comma list of\n"
            "                fp32 (default), bf16, bf16-sr, or all: a row per state, with\n"
            "                the bytes a parameter the update reads and writes and its\n"
            "                share of the step\n"
            "  --recompute R activation recomputation of each row: a comma list of none\n"
            "                (default), blocks, all; the row's act MiB is the worker's peak\n"
            "                activation and attention bytes\n"
            "  --help        this text\n");
}

int main(int argc, char **argv)
{
    bench_options o = { .which = -1, .windows = 5, .warmup_steps = 3, .fp32 = 1,
                        .moments = 1u << ST_MOMENTS_FP32, .activation = -1,
                        .recompute = 1u << ST_RECOMPUTE_NONE };
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
        } else if ((v = option_value(argc, argv, &i, "--optimizer-moments", &missing))) {
            if (!parse_moments(v, &o.moments))
                return usage_error("--optimizer-moments takes a comma list of fp32, bf16 and "
                                   "bf16-sr (or all), got '%s'", v);
        } else if ((v = option_value(argc, argv, &i, "--recompute", &missing))) {
            if (!parse_recompute(v, &o.recompute))
                return usage_error("--recompute takes a comma list of none, blocks and all, "
                                   "got '%s'", v);
        } else if ((v = option_value(argc, argv, &i, "--unfuse", &missing))) {
            if (!parse_unfuse(v, &o.unfuse))
                return usage_error("--unfuse takes a comma list of bias, residual, "
                                   "weight-copy, relu, bn-relu, relu-backward and gelu-backward "
                                   "(or both), "
                                   "got '%s'", v);
        } else if ((v = option_value(argc, argv, &i, "--activation-precision", &missing))) {
            if (st_precision_parse(v, &o.activations) != ST_OK)
                return usage_error("--activation-precision must be fp32 or bf16, got '%s'", v);
        } else if ((v = option_value(argc, argv, &i, "--weight-layout", &missing))) {
            if (st_weight_layout_parse(v, &o.weights) != ST_OK)
                return usage_error("--weight-layout must be plain or blocked, got '%s'", v);
        } else if ((v = option_value(argc, argv, &i, "--tensor-layout", &missing))) {
            if (st_tensor_layout_parse(v, &o.layout) != ST_OK)
                return usage_error("--tensor-layout must be auto, blocked or nhwc, got '%s'", v);
        } else if ((v = option_value(argc, argv, &i, "--activation", &missing))) {
            st_activation a;
            if (st_activation_parse(v, &a) != ST_OK)
                return usage_error("--activation must be relu or gelu, got '%s'", v);
            o.activation = (int)a;
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
        rc = run_scaling(&o, json);

    if (json && fclose(json) != 0) {
        fprintf(stderr, "bench_step: cannot write %s: %s\n", o.json_path, strerror(errno));
        return EXIT_FAILURE;
    }
    return rc;
}

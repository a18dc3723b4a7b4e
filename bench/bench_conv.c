/*
 * bench/bench_conv.c — the convolution layer's speed, plain NCHW against
 * oneDNN's blocked layouts with reorders (nn/layers/conv.c), on the shapes
 * of a ResNet for 28 x 28 images (16 channels at 28 x 28, 32 at 14, 64 at
 * 7), one thread by default.
 *
 * For each shape and layout: the GFLOP/s of each primitive alone (forward,
 * backward-data, backward-weights; 2 FLOPs per multiply-add) and of the
 * layer's calls, reorders included, and the layer's forward + backward time.
 * The two layouts are timed alternately, --rounds times (default 3), and
 * the best of all rounds is kept, so that a noisy period on a shared machine
 * does not favour one of them.  Where oneDNN has bf16 kernels, a third row
 * in the same rounds: the blocked layout with the passes in bf16
 * (--precision bf16: bf16 x, w, dy; the layer's calls include the
 * conversions), and its ratios to the fp32 blocked row measured beside it
 * (of rates: above 1, bf16 is faster; the ms columns fp32 / bf16).
 *
 *   bench/bench_conv [--threads N] [--reps N] [--rounds N] [--batch B]
 *
 * Then batch norm (training forward + backward) followed by ReLU, as two
 * layers (st_batchnorm, st_act) and with the ReLU fused into the batch
 * norm (oneDNN's fuse_norm_relu), the batch norm plain or blocked (with
 * its reorders), on the same activation shapes.
 *
 * Public headers only: the layers are timed by the library
 * (subtrain/layer_timing.h), as a model builds them.  bench_step --config
 * cnn builds its reference (the blocked primitives alone, on the ResNet's
 * dominant shape) with oneDNN's public C API.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>

#include <omp.h>

#define MAX_ROUNDS 101
#define BENCH_NAME "bench_conv"
#include "bench_util.h"

#include <subtrain/layer_timing.h>
#include <subtrain/model.h>

typedef struct named_shape {
    const char *name;
    st_conv_shape s;   /* batch filled in from --batch */
} named_shape;

static const named_shape shapes[] = {
    { "stem 1->16 28x28 3x3 s1", { 0, 1, 28, 28, 16, 3, 3, 1, 1 } },
    { "16->16 28x28 3x3 s1", { 0, 16, 28, 28, 16, 3, 3, 1, 1 } },
    { "16->32 28x28 3x3 s2", { 0, 16, 28, 28, 32, 3, 3, 2, 1 } },
    { "32->32 14x14 3x3 s1", { 0, 32, 14, 14, 32, 3, 3, 1, 1 } },
    { "32->64 14x14 3x3 s2", { 0, 32, 14, 14, 64, 3, 3, 2, 1 } },
    { "32->64 14x14 1x1 s2", { 0, 32, 14, 14, 64, 1, 1, 2, 0 } },
    { "64->64 7x7 3x3 s1", { 0, 64, 7, 7, 64, 3, 3, 1, 1 } },
    { "32->64 28x28 3x3 s2", { 0, 32, 28, 28, 64, 3, 3, 2, 1 } },
};

static int parse_int(const char *v, int lo, int *out)
{
    char *end;
    long n = strtol(v, &end, 10);
    if (*end || n < lo || n > 1000000)
        return 0;
    *out = (int)n;
    return 1;
}

int main(int argc, char **argv)
{
    int threads = 1, reps = 5, rounds = 3, batch = 128;
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v;
        if ((v = option_value(argc, argv, &i, "--threads", &missing))) {
            if (!parse_int(v, 1, &threads))
                return usage_error("bad --threads %s", v);
        } else if ((v = option_value(argc, argv, &i, "--reps", &missing))) {
            if (!parse_int(v, 1, &reps))
                return usage_error("bad --reps %s", v);
        } else if ((v = option_value(argc, argv, &i, "--rounds", &missing))) {
            if (!parse_int(v, 1, &rounds) || rounds > MAX_ROUNDS)
                return usage_error("bad --rounds %s", v);
        } else if ((v = option_value(argc, argv, &i, "--batch", &missing))) {
            if (!parse_int(v, 1, &batch))
                return usage_error("bad --batch %s", v);
        } else if (missing) {
            return usage_error("%s needs a value", argv[i]);
        } else if (!strcmp(argv[i], "--help")) {
            printf("usage: bench_conv [--threads N] [--reps N] [--rounds N] [--batch B]\n");
            return 0;
        } else {
            return usage_error("unknown option %s", argv[i]);
        }
    }
    omp_set_num_threads(threads);
    printf("bench_conv: batch %d, %d thread(s), best of %d calls x %d rounds\n", batch, threads,
           reps, rounds);
    const double t0 = now_s();
    printf("%-24s %-7s %7s %7s %7s | %7s %7s %9s %9s\n", "shape", "layout", "fwd", "bwd-d",
           "bwd-w", "L fwd", "L bwd", "L ms", "median");
    printf("%-24s %-7s %23s | %15s %19s\n", "", "", "primitives, GFLOP/s", "layer, GFLOP/s",
           "fwd+bwd, ms");
    /* variants: fp32 plain, fp32 blocked, bf16 blocked (where it runs) */
    const int variants = st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE ? 2 : 3;
    static const char *const vname[3] = { "plain", "blocked", "bf16" };
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        st_conv_shape s = shapes[k].s;
        s.batch = batch;
        st_conv_timing best[3] = { { 0 } };
        double ms[3][MAX_ROUNDS];
        for (int r = 0; r < rounds; r++)
            for (int l = 0; l < variants; l++) {
                st_conv_timing got;
                st_status st = st_time_conv(&s, l != 0, l == 2, reps, &got);
                if (st != ST_OK) {
                    fprintf(stderr, "bench_conv: %s: %s\n", shapes[k].name, st_last_error());
                    return 1;
                }
                st_conv_timing *b = &best[l];
                ms[l][r] = got.layer_ms;
                if (r == 0 || got.fwd > b->fwd) b->fwd = got.fwd;
                if (r == 0 || got.bwd_data > b->bwd_data) b->bwd_data = got.bwd_data;
                if (r == 0 || got.bwd_weights > b->bwd_weights) b->bwd_weights = got.bwd_weights;
                if (r == 0 || got.layer_fwd > b->layer_fwd) b->layer_fwd = got.layer_fwd;
                if (r == 0 || got.layer_bwd > b->layer_bwd) b->layer_bwd = got.layer_bwd;
                if (r == 0 || got.layer_ms < b->layer_ms) b->layer_ms = got.layer_ms;
            }
        double med[3];
        for (int l = 0; l < variants; l++) {
            qsort(ms[l], (size_t)rounds, sizeof ms[l][0], cmp_double);
            med[l] = ms[l][rounds / 2];
            printf("%-24s %-7s %7.1f %7.1f %7.1f | %7.1f %7.1f %9.2f %9.2f\n",
                   l ? "" : shapes[k].name, vname[l], best[l].fwd,
                   best[l].bwd_data, best[l].bwd_weights, best[l].layer_fwd, best[l].layer_bwd,
                   best[l].layer_ms, med[l]);
        }
        printf("%-32s %33.2fx %8.2fx\n", "  plain / blocked", best[0].layer_ms / best[1].layer_ms,
               med[0] / med[1]);
        if (variants == 3)
            printf("%-24s %7.2fx %6.2fx %6.2fx | %7.2fx %6.2fx %8.2fx %8.2fx\n",
                   "  bf16 / fp32 blocked", best[2].fwd / best[1].fwd,
                   best[2].bwd_data / best[1].bwd_data, best[2].bwd_weights / best[1].bwd_weights,
                   best[2].layer_fwd / best[1].layer_fwd, best[2].layer_bwd / best[1].layer_bwd,
                   best[1].layer_ms / best[2].layer_ms, med[1] / med[2]);
    }
    printf("\n%-24s %25s %25s\n", "batch norm + ReLU, ms", "plain NCHW", "blocked + reorders");
    printf("%-24s %12s %12s %12s %12s\n", "fwd + bwd", "separate", "fused", "separate",
           "fused");
    const int64_t bn_shapes[][3] = { { 16, 28, 28 }, { 32, 14, 14 }, { 64, 7, 7 } };
    for (size_t k = 0; k < sizeof bn_shapes / sizeof bn_shapes[0]; k++) {
        double best[4] = { 1e30, 1e30, 1e30, 1e30 };
        for (int r = 0; r < rounds; r++)
            for (int v = 0; v < 4; v++) {
                double ms;
                st_status st = st_time_batchnorm_relu(batch, bn_shapes[k][0], bn_shapes[k][1],
                                                      bn_shapes[k][2], (v & 2) != 0, v & 1,
                                                      reps, &ms);
                if (st != ST_OK) {
                    fprintf(stderr, "bench_conv: batch norm: %s\n", st_last_error());
                    return 1;
                }
                if (ms < best[v])
                    best[v] = ms;
            }
        char name[48];
        snprintf(name, sizeof name, "%dx%lldx%lldx%lld", batch, (long long)bn_shapes[k][0],
                 (long long)bn_shapes[k][1], (long long)bn_shapes[k][2]);
        printf("%-24s %12.3f %12.3f %12.3f %12.3f\n", name, best[0], best[1], best[2], best[3]);
    }
    printf("bench_conv: %.1f s\n", now_s() - t0);
    return 0;
}

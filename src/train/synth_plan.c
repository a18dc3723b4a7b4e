/*
 * train/synth_plan.c — the pure parts of synthetic-label training: where
 * the cuts go, how the workers are split across segments, and the labels.
 * See include/subtrain/synth.h for the layer numbering.
 */
#include <stdlib.h>
#include <string.h>

#include <subtrain/rng.h>
#include <subtrain/synth.h>

#include "core/error.h"
#include "core/rng_streams.h"
#include "nn/segment.h"

st_synth_config st_synth_config_default(void)
{
    st_synth_config c;
    memset(&c, 0, sizeof c);
    c.segments = 2;
    c.labels = ST_SYNTH_GAUSSIAN;
    c.scale = 1.0f;
    c.noise = 0.5f;
    c.recovery_epochs = 0;
    return c;
}

/* A segment's FLOPs are the model's business (nn/segment.c). */
double st_synth_segment_flops(const st_model_config *m, int first, int last, int batch)
{
    return st_segment_flops(m, first, last, batch);
}

/* best[s * n1 + j]: the smallest largest-segment FLOPs over the ways of
 * cutting layers 1 .. j into s + 1 segments; from[...] the last cut there. */
st_status st_synth_balanced_cuts(const st_model_config *m, int segments, int *cuts)
{
    const int layers = m->depth + 1, n1 = layers + 1;
    if (segments < 2 || segments > ST_SYNTH_MAX_SEGMENTS)
        return st_fail(ST_ERR_INVALID, "segments must be in [2, %d], got %d",
                       ST_SYNTH_MAX_SEGMENTS, segments);
    if (segments > layers)
        return st_fail(ST_ERR_INVALID, "an mlp of depth %d has %d linear layers: it cannot be "
                       "cut into %d segments", m->depth, layers, segments);
    double *best = malloc(sizeof(double) * (size_t)segments * (size_t)n1);
    int *from = malloc(sizeof(int) * (size_t)segments * (size_t)n1);
    if (!best || !from) {
        free(best);
        free(from);
        return st_fail(ST_ERR_NOMEM, "out of memory choosing the cuts");
    }
    for (int j = 1; j <= layers; j++)
        best[j] = st_segment_flops(m, 1, j, 1);
    for (int s = 1; s < segments; s++)
        for (int j = s + 1; j <= layers; j++) {
            double b = -1.0;
            int at = s;
            for (int i = s; i < j; i++) { /* the last cut after layer i */
                double left = best[(s - 1) * n1 + i];
                double right = st_segment_flops(m, i + 1, j, 1);
                double worst = left > right ? left : right;
                if (b < 0.0 || worst < b) { /* strict: the earliest of equals */
                    b = worst;
                    at = i;
                }
            }
            best[s * n1 + j] = b;
            from[s * n1 + j] = at;
        }
    int j = layers;
    for (int s = segments - 1; s >= 1; s--) {
        j = from[s * n1 + j];
        cuts[s - 1] = j;
    }
    free(best);
    free(from);
    return ST_OK;
}

st_status st_synth_split_workers(int n_workers, int segments, const double *flops, int *counts)
{
    if (segments < 1 || segments > ST_SYNTH_MAX_SEGMENTS)
        return st_fail(ST_ERR_INVALID, "segments must be in [1, %d], got %d",
                       ST_SYNTH_MAX_SEGMENTS, segments);
    if (n_workers < segments)
        return st_fail(ST_ERR_INVALID, "--strategy synth --segments %d: %d worker%s cannot "
                       "train %d segments: each segment needs at least one worker (use "
                       "--workers %d or more%s)", segments, n_workers, n_workers == 1 ? "" : "s",
                       segments, segments, segments > 2 ? ", or fewer --segments" : "");
    for (int g = 0; g < segments; g++) {
        if (!(flops[g] > 0.0))
            return st_fail(ST_ERR_INVALID, "segment %d has no work (%g FLOPs)", g + 1, flops[g]);
        counts[g] = 1;
    }
    for (int k = segments; k < n_workers; k++) {
        int top = 0;
        for (int g = 1; g < segments; g++) /* flops[g]/counts[g] > flops[top]/counts[top] */
            if (flops[g] * counts[top] > flops[top] * counts[g])
                top = g;
        counts[top]++;
    }
    return ST_OK;
}

void st_synth_make_labels(st_synth_labels kind, float scale, uint64_t seed, int cut,
                          int classes, int dim, float *out)
{
    st_rng root = st_rng_seed(seed);
    st_rng labels = st_rng_split(&root, ST_RNG_STREAM_SYNTH_LABELS);
    for (int c = 0; c < classes; c++) {
        /* one stream per (cut, class): a label does not depend on the width
         * of the others */
        st_rng r = st_rng_split(&labels, (uint64_t)cut * 4096u + (uint64_t)c);
        float *row = out + (size_t)c * (size_t)dim;
        for (int d = 0; d < dim; d++)
            row[d] = kind == ST_SYNTH_SIGN ? (st_rng_u64(&r) >> 63 ? scale : -scale)
                                           : scale * st_rng_normal(&r);
    }
}

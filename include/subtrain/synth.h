/*
 * subtrain/synth.h — partitioned training with synthetic intermediate
 * labels (doc/synth.md): the pure parts, testable without training.
 *
 * The mlp of depth L has L + 1 linear layers, numbered 1 .. L + 1 (layer
 * L + 1 is the head).  A cut c in [1, L] sits after layer c, at the
 * pre-activation of hidden layer c: segment 1 is layers 1 .. c1, segment i
 * is the activation of the cut before it followed by layers c_{i-1} + 1 ..
 * c_i, and the last segment ends with the head.  Every layer of a segment
 * is a layer of the joined network, so joining is a parameter copy.
 *
 * Why the pre-activation: a non-final segment ends with a linear layer,
 * whose output can take any real value, so it can be regressed (mean
 * squared error) onto a synthetic label of any distribution; the
 * activation that follows the cut is the next segment's first operation,
 * so that the segments composed are exactly the mlp.
 */
#ifndef SUBTRAIN_SYNTH_H
#define SUBTRAIN_SYNTH_H

#include <stdint.h>
#include <subtrain/model.h>
#include <subtrain/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ST_SYNTH_MAX_SEGMENTS 16

typedef enum st_synth_labels {
    ST_SYNTH_GAUSSIAN,   /* each component ~ N(0, scale^2) */
    ST_SYNTH_SIGN        /* each component +scale or -scale, equally likely */
} st_synth_labels;

const char *st_synth_labels_name(st_synth_labels kind);
st_status st_synth_labels_parse(const char *name, st_synth_labels *out);

typedef struct st_synth_config {
    int segments;              /* S >= 2 */
    int cuts[ST_SYNTH_MAX_SEGMENTS - 1]; /* S - 1 strictly increasing layer
                                          * numbers in [1, depth]; cuts[0] == 0:
                                          * balanced by FLOPs */
    st_synth_labels labels;
    float scale;               /* of the synthetic labels */
    float noise;               /* std of the Gaussian noise added to a
                                * synthetic label fed to the next segment,
                                * relative to scale */
    int recovery_epochs;       /* end-to-end data-parallel epochs of the
                                * joined network afterwards */
} st_synth_config;

/* 2 segments, balanced cuts, Gaussian labels of scale 1, noise 0.5, no
 * recovery epoch. */
st_synth_config st_synth_config_default(void);

/* Matrix-multiply FLOPs of one training step of the segment made of linear
 * layers first .. last (1-based, inclusive) of the mlp `m`, with the same
 * counting as st_model_step_flops: 3 products per layer, 2 for a segment's
 * first layer (no segment needs its input's gradient). */
double st_synth_segment_flops(const st_model_config *m, int first, int last, int batch);

/* The S - 1 cuts that minimise the largest segment's FLOPs (segments run
 * at the same time: the slowest sets the pace).  Ties: the earliest last
 * cut among the best; the cuts before it then minimise the largest
 * segment of the layers before it, by the same rule (so not always the
 * lexicographically earliest cuts: with a head heavier than the rest,
 * depth 4, S = 3, every (c, 4) ties and (2, 4) is chosen).  Fails when the
 * mlp has fewer than S linear layers. */
st_status st_synth_balanced_cuts(const st_model_config *m, int segments, int *cuts);

/* Workers per segment: one each, then every next worker goes to the
 * segment with the most FLOPs per worker (ties: the lower segment), which
 * minimises the largest per-worker load and tracks the FLOPs proportions.
 * Group g is workers [sum_{h<g} counts[h], sum_{h<=g} counts[h]).  Fails
 * when n_workers < segments. */
st_status st_synth_split_workers(int n_workers, int segments, const double *flops, int *counts);

/* The synthetic labels of cut `cut` (1-based segment boundary index): row c
 * of out (classes x dim) is class c's vector.  A pure function of (kind,
 * scale, seed, cut): every worker draws its own copy. */
void st_synth_make_labels(st_synth_labels kind, float scale, uint64_t seed, int cut,
                          int classes, int dim, float *out);

#ifdef __cplusplus
}
#endif
#endif /* SUBTRAIN_SYNTH_H */

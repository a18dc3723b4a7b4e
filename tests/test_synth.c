/*
 * tests/test_synth.c — partitioned training with synthetic intermediate
 * labels (--strategy synth): the pure plan (cuts, worker split, labels),
 * the MSE loss and the segment networks against finite differences, the
 * join (the joined mlp is the composition of the segments, to the bit),
 * and short runs on synthetic data: every segment's loss falls, runs are
 * reproducible, nothing crosses a cut, recovery epochs follow, a stop and
 * checkpoints wait for a segment epoch's end and resume bitwise.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "gradcheck.h"

#include <subtrain/subtrain.h>
#include "core/arena_impl.h"
#include "nn/dnnl_util.h"
#include "nn/layers/mse.h"
#include "nn/segment.h"
#include "recorder.h"
#include "testutil.h"

/* ------------------------------------------------------------ worker split */

static void expect_split(int n, int s, const double *flops, const int *want)
{
    int got[ST_SYNTH_MAX_SEGMENTS];
    OK(st_synth_split_workers(n, s, flops, got));
    for (int g = 0; g < s; g++)
        cr_expect_eq(got[g], want[g], "N %d S %d: segment %d got %d workers, expected %d", n, s,
                     g + 1, got[g], want[g]);
}

Test(split, as_specified_for_several_workers_and_segments)
{
    const double equal[] = { 1, 1 }, heavy[] = { 3, 1 }, three[] = { 2, 1, 1 };
    expect_split(2, 2, equal, (int[]){ 1, 1 });
    expect_split(4, 2, equal, (int[]){ 2, 2 });
    expect_split(5, 2, equal, (int[]){ 3, 2 });        /* a tie: the lower segment */
    expect_split(2, 2, heavy, (int[]){ 1, 1 });        /* at least one each */
    expect_split(4, 2, heavy, (int[]){ 3, 1 });        /* proportional */
    expect_split(8, 2, heavy, (int[]){ 6, 2 });
    expect_split(3, 3, three, (int[]){ 1, 1, 1 });
    expect_split(4, 3, three, (int[]){ 2, 1, 1 });
    expect_split(6, 3, three, (int[]){ 3, 2, 1 });
    expect_split(8, 3, three, (int[]){ 4, 2, 2 });
    int got[3];
    cr_assert_eq(st_synth_split_workers(2, 3, three, got), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "at least one worker"), "%s", st_last_error());
}

/* The rule minimises the largest FLOPs per worker: checked against every
 * split of N workers (N <= 9, S <= 4) on uneven loads. */
Test(split, minimises_the_largest_load_per_worker)
{
    const double flops[] = { 7, 2, 5, 1 };
    for (int s = 2; s <= 4; s++)
        for (int n = s; n <= 9; n++) {
            int got[4];
            OK(st_synth_split_workers(n, s, flops, got));
            int sum = 0;
            double mine = 0.0;
            for (int g = 0; g < s; g++) {
                cr_assert_geq(got[g], 1);
                sum += got[g];
                mine = fmax(mine, flops[g] / got[g]);
            }
            cr_assert_eq(sum, n);
            double best = INFINITY; /* every composition of n into s parts >= 1 */
            int c[4] = { 1, 1, 1, 1 };
            for (;;) {
                int rest = n;
                for (int g = 0; g + 1 < s; g++)
                    rest -= c[g];
                if (rest >= 1) {
                    double worst = flops[s - 1] / rest;
                    for (int g = 0; g + 1 < s; g++)
                        worst = fmax(worst, flops[g] / c[g]);
                    best = fmin(best, worst);
                }
                int g = 0;
                while (g + 1 < s && ++c[g] > n) {
                    c[g] = 1;
                    g++;
                }
                if (g + 1 >= s)
                    break;
            }
            cr_assert_eq(mine, best, "N %d S %d: largest load %g, the best split has %g", n, s,
                         mine, best);
        }
}

/* ------------------------------------------------------------ cuts */

static st_model_config mlp(int depth, int width, int in, int classes)
{
    st_model_config m = st_model_config_default();
    m.kind = st_model_kind_named("mlp");
    m.depth = depth;
    m.width = width;
    m.in_dim = in;
    m.n_classes = classes;
    return m;
}

/* The Fashion-MNIST network of doc/synth.md: 784 -> 5 x 256 -> 10.  Per
 * sample (x 2 B): layer 1 (first of its segment) 784 x 256 x 2, a hidden
 * layer 256^2 x 3 (x 2 when first), the head 2560 x 3. */
Test(cuts, balanced_by_flops_for_the_six_layer_network)
{
    st_model_config m = mlp(5, 256, 784, 10);
    int cuts[3];
    OK(st_synth_balanced_cuts(&m, 2, cuts));
    cr_expect_eq(cuts[0], 2, "S = 2: after layer %d", cuts[0]);
    OK(st_synth_balanced_cuts(&m, 3, cuts));
    cr_expect(cuts[0] == 1 && cuts[1] == 3, "S = 3: after layers %d, %d", cuts[0], cuts[1]);
    double f1 = st_synth_segment_flops(&m, 1, 2, 1);
    cr_expect_eq(f1, 2.0 * (784.0 * 256 * 2 + 256.0 * 256 * 3));
    cr_expect_eq(st_synth_segment_flops(&m, 6, 6, 1), 2.0 * 2560 * 2);
    cr_assert_eq(st_synth_balanced_cuts(&m, 7, cuts), ST_ERR_INVALID, "6 layers, 7 segments");
}

/* Against every placement of the cuts (depth 6, S = 2 .. 4, uneven widths
 * make the first layer heavy). */
Test(cuts, minimise_the_largest_segment)
{
    st_model_config m = mlp(6, 48, 300, 10);
    for (int s = 2; s <= 4; s++) {
        int cuts[3];
        OK(st_synth_balanced_cuts(&m, s, cuts));
        double mine = 0.0;
        for (int g = 0; g < s; g++) {
            int a = g == 0 ? 1 : cuts[g - 1] + 1, b = g == s - 1 ? 7 : cuts[g];
            cr_assert_leq(a, b);
            mine = fmax(mine, st_synth_segment_flops(&m, a, b, 1));
        }
        double best = INFINITY;
        for (int c1 = 1; c1 <= 6; c1++)
            for (int c2 = s > 2 ? c1 + 1 : 7; c2 <= 7; c2++)
                for (int c3 = s > 3 ? c2 + 1 : 7; c3 <= 7; c3++) {
                    int c[3] = { c1, c2, c3 };
                    if ((s > 2 && c2 > 6) || (s > 3 && c3 > 6))
                        continue;
                    double worst = 0.0;
                    int a = 1;
                    for (int g = 0; g < s; g++) {
                        int b = g == s - 1 ? 7 : c[g];
                        worst = fmax(worst, st_synth_segment_flops(&m, a, b, 1));
                        a = b + 1;
                    }
                    best = fmin(best, worst);
                }
        cr_expect_eq(mine, best, "S %d: largest segment %g, the best cuts give %g", s, mine, best);
    }
}

/* Ties: the DP keeps, for each prefix, the earliest last cut among the
 * equal best, so the rule is "the earliest last cut; the cuts before it
 * then minimise the largest segment of the layers before it (the same rule
 * again)" — not "the lexicographically earliest cuts". */
Test(cuts, ties_go_to_the_earliest_last_cut)
{
    /* 3 equal layers (8 x 8), S = 2: a segment's first layer costs 2
     * products, the others 3; cut 1 gives 2 | 5, cut 2 gives 5 | 2: a tie,
     * and the earliest wins. */
    st_model_config m = mlp(2, 8, 8, 8);
    int cuts[3];
    OK(st_synth_balanced_cuts(&m, 2, cuts));
    cr_expect_eq(cuts[0], 1, "a tie between cuts 1 and 2 went to %d", cuts[0]);
    /* 4 layers of 8 x 8 and a head of 8 x 800, S = 3: the head alone is
     * the largest segment whatever the other cuts, so (1, 4), (2, 4) and
     * (3, 4) all tie overall; the last cut is 4 and the layers 1-4 before
     * it are split to minimise their own largest segment: (2, 4), not the
     * lexicographically earliest (1, 4). */
    m = mlp(4, 8, 8, 800);
    OK(st_synth_balanced_cuts(&m, 3, cuts));
    cr_expect(cuts[0] == 2 && cuts[1] == 4, "S = 3 with a heavy head: after layers %d, %d",
              cuts[0], cuts[1]);
    double f14 = fmax(st_synth_segment_flops(&m, 1, 1, 1), st_synth_segment_flops(&m, 2, 4, 1));
    double f24 = fmax(st_synth_segment_flops(&m, 1, 2, 1), st_synth_segment_flops(&m, 3, 4, 1));
    cr_expect_lt(f24, f14, "the prefix rule prefers the balanced prefix");
    cr_expect_gt(st_synth_segment_flops(&m, 5, 5, 1), f14, "and both tie overall");
}

/* ------------------------------------------------------------ labels */

Test(labels, drawn_from_the_seed_with_the_stated_distribution)
{
    enum { K = 10, D = 4096 };
    float *a = malloc(sizeof(float) * K * D), *b = malloc(sizeof(float) * K * D);
    cr_assert(a && b);
    st_synth_make_labels(ST_SYNTH_GAUSSIAN, 2.0f, 7, 1, K, D, a);
    st_synth_make_labels(ST_SYNTH_GAUSSIAN, 2.0f, 7, 1, K, D, b);
    cr_assert_eq(memcmp(a, b, sizeof(float) * K * D), 0, "a pure function of the seed");
    double sum = 0.0, sq = 0.0;
    for (int i = 0; i < K * D; i++) {
        sum += a[i];
        sq += (double)a[i] * a[i];
    }
    double mean = sum / (K * D), sd = sqrt(sq / (K * D) - mean * mean);
    /* 40960 draws: the mean's standard error is 0.01, the sd's 0.007 */
    cr_expect(fabs(mean) < 0.05 && fabs(sd - 2.0) < 0.05, "mean %g sd %g", mean, sd);
    cr_expect_neq(memcmp(a, a + D, sizeof(float) * D), 0, "classes differ");
    st_synth_make_labels(ST_SYNTH_GAUSSIAN, 2.0f, 7, 2, K, D, b);
    cr_expect_neq(memcmp(a, b, sizeof(float) * D), 0, "cuts differ");
    st_synth_make_labels(ST_SYNTH_SIGN, 0.5f, 7, 1, K, D, b);
    int plus = 0;
    for (int i = 0; i < K * D; i++) {
        cr_assert(b[i] == 0.5f || b[i] == -0.5f, "sign label %g", b[i]);
        plus += b[i] > 0;
    }
    cr_expect(abs(plus - K * D / 2) < 600, "%d of %d positive", plus, K * D);
    free(a);
    free(b);
}

/* ------------------------------------------------------------ MSE and segments */

static const tol TOL_MSE = { 1e-3, 1e-6, 1e-3 };

/* dy of the mean against central differences of the loss (the sum over
 * rows / rows), padding rows excluded and their gradient zero.  The loss
 * is accumulated in double, so the differences are exact to ~1e-9. */
Test(mse, gradient_matches_finite_differences)
{
    enum { B = 6, D = 5, ROWS = 4 };
    float y[B * D], t[B * D], dy[B * D];
    st_rng r = st_rng_seed(3);
    for (int i = 0; i < B * D; i++) {
        y[i] = st_rng_normal(&r);
        t[i] = st_rng_normal(&r);
        dy[i] = 99.0f;
    }
    st_mse e;
    st_mse_build(&e, B, D, y, t, dy);
    double sum;
    OK(st_mse_forward(&e, ROWS, 1, &sum));
    double direct = 0.0;
    for (int i = 0; i < ROWS * D; i++)
        direct += ((double)y[i] - t[i]) * ((double)y[i] - t[i]);
    cr_assert_float_eq(sum / ROWS, direct / (ROWS * D), 1e-12, "the mean over rows x D");
    double fd[ROWS * D], an[ROWS * D];
    for (int i = 0; i < ROWS * D; i++) {
        float v = y[i];
        double lp, lm;
        y[i] = (float)(v + TOL_MSE.h);
        OK(st_mse_forward(&e, ROWS, 0, &lp));
        y[i] = (float)(v - TOL_MSE.h);
        OK(st_mse_forward(&e, ROWS, 0, &lm));
        fd[i] = (lp - lm) / ROWS / ((double)(float)(v + TOL_MSE.h) - (float)(v - TOL_MSE.h));
        y[i] = v;
        an[i] = dy[i];
    }
    compare_grads("mse dy", fd, an, ROWS * D, 0, TOL_MSE);
    for (int i = ROWS * D; i < B * D; i++)
        cr_assert_eq(dy[i], 0.0f, "padding rows get no gradient");
    y[0] = INFINITY;
    cr_assert_eq(st_mse_forward(&e, ROWS, 1, &sum), ST_ERR_NUMERIC);
}

/* A segment's objective in double from its float output: the MSE to the
 * target, or the cross-entropy of the logits. */
static double segment_objective(st_segnet *s)
{
    OK(st_segnet_forward(s));
    const int B = st_segnet_batch(s), D = st_segnet_out_dim(s);
    const float *o = st_segnet_output(s);
    double L = 0.0;
    for (int b = 0; b < B; b++) {
        const float *row = o + (size_t)b * D;
        if (!st_segnet_is_last(s)) {
            const float *t = st_segnet_target(s) + (size_t)b * D;
            for (int d = 0; d < D; d++)
                L += ((double)row[d] - t[d]) * ((double)row[d] - t[d]) / D;
            continue;
        }
        double mx = row[0], z = 0.0;
        for (int d = 1; d < D; d++)
            mx = fmax(mx, row[d]);
        for (int d = 0; d < D; d++)
            z += exp((double)row[d] - mx);
        L -= (double)row[st_segnet_labels(s)[b]] - mx - log(z);
    }
    return L / B;
}

static st_segnet *make_segment(const st_model_config *m, int first, int last, int batch,
                               st_arena *arena, uint64_t seed)
{
    st_segment_config sc = { *m, first, last };
    st_segnet *s;
    OK(st_segnet_create(&sc, batch, arena, &s));
    st_segnet_init_params(s, seed);
    st_rng r = st_rng_seed(seed + 100);
    float *x = st_segnet_input(s);
    for (int i = 0; i < batch * st_segnet_in_dim(s); i++)
        x[i] = st_rng_normal(&r);
    if (st_segnet_is_last(s))
        for (int b = 0; b < batch; b++)
            st_segnet_labels(s)[b] = (int32_t)st_rng_below(&r, (uint32_t)m->n_classes);
    else
        for (int i = 0; i < batch * st_segnet_out_dim(s); i++)
            st_segnet_target(s)[i] = st_rng_normal(&r);
    return s;
}

/* GELU: smooth, so TOL_GELU of test_model.c applies (see its reasoning). */
static void gradcheck_segment(int first, int last)
{
    static const tol TOL_GELU = { 1e-2, 5e-5, 1e-2 };
    st_model_config m = mlp(3, 5, 6, 3);
    m.activation = ST_ACT_GELU;
    st_arena arena;
    st_arena_init(&arena, "test_synth", NULL, 0);
    st_segnet *s = make_segment(&m, first, last, 4, &arena, 11);
    float loss;
    OK(st_segnet_forward_backward(s, &loss));
    double L0 = segment_objective(s);
    cr_expect(fabs(loss - L0) <= 1e-5 * (1 + L0), "library loss %g, from the output %g", loss, L0);
    size_t np = st_segnet_param_count(s);
    float *p = st_segnet_params(s);
    double *fd = malloc(np * sizeof *fd), *an = malloc(np * sizeof *an);
    cr_assert(fd && an);
    for (size_t i = 0; i < np; i++) {
        float v = p[i], vp = (float)(v + TOL_GELU.h), vm = (float)(v - TOL_GELU.h);
        p[i] = vp;
        double lp = segment_objective(s);
        p[i] = vm;
        double lm = segment_objective(s);
        p[i] = v;
        fd[i] = (lp - lm) / ((double)vp - vm);
        an[i] = st_segnet_grads(s)[i];
    }
    char what[64];
    snprintf(what, sizeof what, "segment layers %d-%d", first, last);
    compare_grads(what, fd, an, np, 0, TOL_GELU);
    free(fd);
    free(an);
    st_segnet_destroy(s);
    st_arena_release(&arena);
}

Test(segment, first_segment_gradient_matches_finite_differences)
{
    omp_set_num_threads(1);
    gradcheck_segment(1, 2);
}

Test(segment, middle_segment_gradient_matches_finite_differences)
{
    omp_set_num_threads(1);
    gradcheck_segment(2, 3);
}

/* A segment is a run of an mlp's layers: another model is refused. */
Test(segment, only_an_mlp_is_cut)
{
    st_model_config m = mlp(3, 8, 6, 4);
    m.kind = st_model_kind_named("resmlp");
    st_segment_config sc = { m, 1, 2 };
    st_arena arena;
    st_arena_init(&arena, "segment", NULL, 0);
    st_segnet *s = NULL;
    cr_assert_eq(st_segnet_create(&sc, 4, &arena, &s), ST_ERR_INVALID);
    cr_assert_null(s);
    cr_assert_str_eq(st_last_error(), "segments are cut from an mlp, not a resmlp");
    st_arena_release(&arena);
}

Test(segment, last_segment_gradient_matches_finite_differences)
{
    omp_set_num_threads(1);
    gradcheck_segment(3, 4);
    gradcheck_segment(4, 4); /* the head alone after a cut */
}

/* ------------------------------------------------------------ the join */

/* Three segments of a depth-5 mlp (cuts after layers 2 and 4), their
 * parameters perturbed away from the initialisation, copied into a full
 * mlp by offset: its logits are bitwise those of the segments run one
 * after another on the same input.  Bitwise because every product is the
 * same oneDNN primitive on the same shapes, buffers and values (the
 * activation at a cut runs in the next segment instead of after the
 * linear layer, on the same values). */
Test(join, joined_network_is_the_composition_of_the_segments)
{
    omp_set_num_threads(1);
    enum { B = 8 };
    st_model_config m = mlp(5, 24, 20, 4);
    st_arena arena;
    st_arena_init(&arena, "test_synth", NULL, 0);
    const int first[3] = { 1, 3, 5 }, last[3] = { 2, 4, 6 };
    st_segnet *seg[3];
    st_model *full;
    OK(st_model_create(&m, B, &arena, &full));
    st_model_init_params(full, 5);
    float *fp = st_model_params(full);
    int nfs;
    const st_param_segment *fsegs = st_model_segments(full, &nfs);
    st_rng r = st_rng_seed(9);
    size_t covered = 0;
    for (int g = 0; g < 3; g++) {
        seg[g] = make_segment(&m, first[g], last[g], B, &arena, 5);
        float *sp = st_segnet_params(seg[g]);
        size_t off = st_segnet_full_offset(seg[g]), np = st_segnet_param_count(seg[g]);
        /* the initialisation is the full mlp's, to the bit */
        cr_assert_eq(memcmp(sp, fp + off, np * sizeof *sp), 0, "segment %d's init", g + 1);
        /* names and places agree with the full mlp's layout */
        int ns;
        const st_param_segment *ss = st_segnet_segments(seg[g], &ns);
        for (int i = 0; i < ns; i++) {
            int found = 0;
            for (int j = 0; j < nfs; j++)
                if (strcmp(fsegs[j].name, ss[i].name) == 0) {
                    found = 1;
                    cr_assert_eq(fsegs[j].offset, off + ss[i].offset, "%s", ss[i].name);
                    cr_assert_eq(fsegs[j].count, ss[i].count, "%s", ss[i].name);
                }
            cr_assert(found, "%s is not a parameter of the mlp", ss[i].name);
        }
        for (size_t i = 0; i < np; i++)
            sp[i] += 0.1f * st_rng_normal(&r);
        memcpy(fp + off, sp, np * sizeof *sp); /* the join */
        covered += np;
    }
    cr_assert_eq(covered, st_model_param_count(full), "the segments cover the mlp");

    float *x = st_model_input(full);
    memcpy(x, st_segnet_input(seg[0]), sizeof(float) * B * 20);
    memset(st_model_labels(full), 0, sizeof(int32_t) * B);
    double loss = 0.0;
    int64_t hits = 0;
    OK(st_model_evaluate(full, B, &loss, &hits));
    for (int g = 0; g < 3; g++) {
        if (g > 0)
            memcpy(st_segnet_input(seg[g]), st_segnet_output(seg[g - 1]), sizeof(float) * B * 24);
        OK(st_segnet_forward(seg[g]));
    }
    const float *a = st_model_logits(full), *b = st_segnet_output(seg[2]);
    double worst = 0.0;
    for (int i = 0; i < B * 4; i++)
        worst = fmax(worst, fabs((double)a[i] - b[i]));
    cr_assert_eq(memcmp(a, b, sizeof(float) * B * 4), 0,
                 "joined logits differ from the composed segments' by up to %g", worst);
    for (int g = 0; g < 3; g++)
        st_segnet_destroy(seg[g]);
    st_model_destroy(full);
    st_arena_release(&arena);
}

/* ------------------------------------------------------------ training */

static void make_data(uint64_t seed, st_dataset *train, st_dataset *test)
{
    st_synthetic_config sc = st_synthetic_defaults(seed);
    sc.train_count = 4096;
    sc.test_count = 1024;
    sc.dim = 32;
    sc.n_classes = 4;
    cr_assert_eq(st_synthetic_make(&sc, train, test), ST_OK, "%s", st_last_error());
    st_dataset_normalize(train, test, NULL, NULL);
}

/* mlp depth 3 width 32 (4 linear layers), 32 inputs, 4 classes. */
static st_train_config synth_config(int workers, int segments, int epochs)
{
    st_train_config c = st_train_config_default();
    c.strategy = ST_STRATEGY_SYNTH;
    c.model = mlp(3, 32, 32, 4);
    c.synth.segments = segments;
    c.workers = workers;
    c.oversubscribe = 1;
    c.batch = 32;
    c.epochs = epochs;
    c.seed = 3;
    return c;
}

/* Measured with these seeds over 3 epochs: the segments' losses fall to
 * between 0.05x and 0.65x of the first epoch's, the joined network reaches
 * 0.71-0.72 on a 4-class task (chance 0.25); the bars are set below. */
Test(train, every_segment_loss_falls_and_the_joined_network_learns, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    recorder *r = calloc(1, sizeof *r);
    for (int s = 2; s <= 3; s++) {
        st_train_config c = synth_config(s, s, 3);
        st_epoch_record final = train_recorded(&c, &train, &test, r);
        cr_assert_eq(r->n_records, 4, "3 epochs and the final record");
        cr_assert_eq(final.n_segments, s);
        for (int g = 0; g < s; g++) {
            double first = r->records[0].segment_loss[g], end = r->records[2].segment_loss[g];
            cr_log_info("S %d segment %d: loss %.4f -> %.4f", s, g + 1, first, end);
            cr_expect_lt(end, 0.8 * first, "S %d: segment %d's loss %.4f -> %.4f", s, g + 1,
                         first, end);
            cr_expect_eq(final.segment_workers[g], 1);
        }
        cr_log_info("S %d: joined test accuracy %.4f", s, final.test_acc);
        cr_expect_geq(final.test_acc, 0.5, "S %d: the joined network reached %.4f", s,
                      final.test_acc);
        cr_expect_eq(final.comm_bytes_per_worker_step, 0.0, "groups of one move nothing");
        cr_expect(final.final && !final.recovery);
    }
    free(r);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(train, same_seed_and_workers_give_bitwise_identical_runs, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    recorder *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    st_train_config c = synth_config(3, 2, 2); /* groups of 2 and 1 */
    st_epoch_record fa = train_recorded(&c, &train, &test, a);
    st_epoch_record fb = train_recorded(&c, &train, &test, b);
    cr_assert_eq(a->steps, b->steps);
    cr_assert_eq(memcmp(a->losses, b->losses, a->steps * sizeof(float)), 0);
    for (int e = 0; e < 2; e++)
        cr_assert_eq(memcmp(a->records[e].segment_loss, b->records[e].segment_loss,
                            sizeof a->records[e].segment_loss), 0);
    cr_assert_eq(memcmp(&fa.test_loss, &fb.test_loss, sizeof(double)), 0);
    cr_assert_gt(fa.comm_bytes_per_worker_step, 0.0, "a group of two reduces its gradients");
    free(a);
    free(b);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* Nothing crosses a cut, checked by what each group can see: changing the
 * images (which only segment 1 reads) leaves the later segments' training
 * bitwise the same, and changing the noise (which only the later segments
 * read) leaves segment 1's.  N = 5, S = 2: the cut after layer 2 gives
 * segment FLOPs 5120 : 2432 per sample, so groups of 3 and 2, and both
 * groups reduce through their engines. */
Test(train, no_group_sees_another_groups_data_or_parameters, .timeout = 120)
{
    st_dataset train, test, other, other_test;
    make_data(5, &train, &test);
    make_data(5, &other, &other_test);
    st_rng rng = st_rng_seed(1);
    for (size_t i = 0; i < (size_t)other.count * other.dim; i++)
        other.x[i] = st_rng_normal(&rng); /* other images, same labels */
    recorder *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    st_train_config c = synth_config(5, 2, 2);
    st_epoch_record fa = train_recorded(&c, &train, &test, a);
    train_recorded(&c, &other, &test, b);
    cr_assert(fa.segment_workers[0] == 3 && fa.segment_workers[1] == 2,
              "groups of %d and %d workers", fa.segment_workers[0], fa.segment_workers[1]);
    cr_assert_gt(fa.comm_bytes_per_worker_step, 0.0, "the groups reduce");
    for (int e = 0; e < 2; e++) {
        cr_expect_neq(a->records[e].segment_loss[0], b->records[e].segment_loss[0],
                      "segment 1 reads the images");
        cr_expect_eq(a->records[e].segment_loss[1], b->records[e].segment_loss[1],
                     "epoch %d: segment 2 saw segment 1's images", e + 1);
    }
    c.synth.noise = 0.25f;
    train_recorded(&c, &train, &test, b);
    for (int e = 0; e < 2; e++) {
        cr_expect_eq(a->records[e].segment_loss[0], b->records[e].segment_loss[0],
                     "epoch %d: segment 1 saw segment 2's noise", e + 1);
        cr_expect_neq(a->records[e].segment_loss[1], b->records[e].segment_loss[1]);
    }
    free(a);
    free(b);
    st_dataset_free(&train);
    st_dataset_free(&other);
    st_dataset_free(&other_test);
    st_dataset_free(&test);
}

/* Recovery: the segment epochs are those of a run without recovery (the
 * same joined network), then end-to-end epochs follow in the numbering;
 * the recovery records count the whole network per worker. */
Test(train, recovery_epochs_continue_the_joined_network, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    recorder *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    st_train_config c = synth_config(2, 2, 2);
    st_epoch_record f0 = train_recorded(&c, &train, &test, a);
    c.synth.recovery_epochs = 2;
    st_epoch_record f2 = train_recorded(&c, &train, &test, b);
    cr_assert_eq(b->n_records, 5, "2 segment epochs, 2 recovery epochs, the final record");
    for (int e = 0; e < 2; e++) {
        cr_assert_eq(memcmp(b->records[e].segment_loss, a->records[e].segment_loss,
                            sizeof a->records[e].segment_loss), 0, "epoch %d's segment losses", e + 1);
        cr_assert_eq(memcmp(&b->records[e].test_loss, &a->records[e].test_loss, sizeof(double)),
                     0, "epoch %d's joined network", e + 1);
    }
    cr_assert_eq(b->records[1].test_acc, f0.test_acc, "the joined network before recovery");
    uint64_t seg_steps = b->records[1].step;
    cr_assert_gt(b->etas[seg_steps - 1], 0.0,
                 "the last segment step's ETA counts the recovery epochs to come");
    cr_assert(!b->records[1].recovery && b->records[2].recovery && f2.recovery);
    cr_assert_eq(b->records[2].epoch, 3);
    cr_assert_eq(b->records[3].epoch, 4);
    cr_assert_eq(f2.epochs, 4);
    cr_assert_eq(b->steps, f2.step, "steps numbered across both phases");
    cr_assert_gt(b->records[2].memory.peak_total, b->records[1].memory.peak_total,
                 "a recovery worker holds the whole network");
    cr_log_info("joined %.4f, after 2 recovery epochs %.4f", f0.test_acc, f2.test_acc);
    cr_expect_geq(f2.test_acc, f0.test_acc - 0.02);
    free(a);
    free(b);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(train, bad_configurations_are_refused)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = synth_config(1, 2, 1);
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, NULL), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "--workers 2"), "%s", st_last_error());
    c = synth_config(2, 5, 1); /* 4 linear layers */
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "--segments"), "%s", st_last_error());
    c = synth_config(2, 2, 1);
    c.model.kind = st_model_kind_named("resmlp");
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "synth cuts an mlp into segments; --model resmlp is not"),
              "%s", st_last_error());
    c.model.kind = st_model_kind_named("resnet18");
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "--model resnet18 does not train with --strategy synth (its "
                     "segments would cut batch-normalised"), "%s", st_last_error());
    c = synth_config(2, 3, 1);
    c.synth.cuts[0] = 2;
    c.synth.cuts[1] = 2;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "--cuts"), "%s", st_last_error());
    c.synth.cuts[1] = 4; /* depth 3: cuts sit after layers 1 .. 3 */
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID, "a cut after the head");
    c = synth_config(2, 2, 1);
    c.steps = 10;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "--epochs"), "%s", st_last_error());
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* The warmup is checked against each group's own run, not against a
 * data-parallel run of all N workers: N = 3, S = 2 gives groups of 2 and 1
 * (64 and 128 steps an epoch at 4096 samples, batch 32), where data
 * parallelism of 3 workers would take 42.  A warmup of 50 steps is valid
 * for both groups (a data-parallel plan would refuse it); 70 is longer
 * than segment 1's run. */
Test(train, warmup_is_checked_per_group, .timeout = 60)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = synth_config(3, 2, 1);
    c.schedule = ST_SCHED_WARMUP_COSINE;
    c.warmup_steps = 50;
    recorder *r = calloc(1, sizeof *r);
    st_epoch_record f = train_recorded(&c, &train, &test, r);
    cr_assert(f.segment_workers[0] == 2 && f.segment_workers[1] == 1, "groups %d/%d",
              f.segment_workers[0], f.segment_workers[1]);
    cr_assert_eq(f.step, 64, "worker 0's group took %llu steps", (unsigned long long)f.step);
    c.warmup_steps = 70;
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, NULL), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "segment 1"), "%s", st_last_error());
    free(r);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* ------------------------------------------------------------ stops and checkpoints */

/* What a run with a stop flag reports: its records, its checkpoints'
 * names, its trained parameters; the flag is raised after worker 0's
 * step stop_at. */
typedef struct stop_run {
    volatile sig_atomic_t stop;
    uint64_t stop_at;
    st_epoch_record records[8];
    int n_records;
    uint64_t checkpoints[8];
    int n_checkpoints;
    float params[4096];
    size_t n_params;
} stop_run;

static void stop_on_step(const st_step_info *info, void *user)
{
    stop_run *s = user;
    if (s->stop_at && info->step == s->stop_at)
        s->stop = 1;
}

static void stop_on_epoch(const st_epoch_record *rec, void *user)
{
    stop_run *s = user;
    cr_assert_lt(s->n_records, 8);
    s->records[s->n_records++] = *rec;
}

static void stop_on_checkpoint(const char *path, uint64_t step, void *user)
{
    (void)path;
    stop_run *s = user;
    cr_assert_lt(s->n_checkpoints, 8);
    s->checkpoints[s->n_checkpoints++] = step;
}

static void stop_on_params(const float *params, size_t count, void *user)
{
    stop_run *s = user;
    cr_assert_leq(count, sizeof s->params / sizeof *s->params);
    memcpy(s->params, params, count * sizeof *params);
    s->n_params = count;
}

static void run_stopped(const st_train_config *c, const st_dataset *train,
                        const st_dataset *test, stop_run *s)
{
    st_train_callbacks cb = { .on_step = stop_on_step, .on_epoch = stop_on_epoch, .user = s,
                              .on_params = stop_on_params, .stop = &s->stop,
                              .on_checkpoint = stop_on_checkpoint };
    cr_assert_eq(st_train_run(c, train, test, &cb, NULL), ST_OK, "%s", st_last_error());
}

/* The segment epochs' groups meet only at epoch ends: a stop asked for
 * in an epoch ends the run at that epoch's end, and periodic checkpoints
 * are taken there, every worker agreeing although their own step counts
 * differ (N = 3, S = 2: groups of 2 and 1 workers take 64 and 128 steps an
 * epoch; names and records count group 0's).  The checkpoint of a stop
 * there resumes to the weights of the run never stopped, through the
 * remaining segment epoch and the recovery epoch. */
Test(train, segment_epochs_stop_and_checkpoint_at_their_ends, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    char dir[ST_TEST_PATH_MAX], path[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_train_config c = synth_config(3, 2, 4);
    c.synth.recovery_epochs = 1;
    stop_run *straight = calloc(1, sizeof *straight), *s = calloc(1, sizeof *s);
    run_stopped(&c, &train, &test, straight);
    cr_assert_eq(straight->n_records, 6, "4 segment epochs, a recovery epoch, the final");

    c.checkpoint.dir = dir;
    c.checkpoint.every = 100;
    s->stop_at = 140;   /* in segment epoch 3 (group 0's steps 129 .. 192) */
    run_stopped(&c, &train, &test, s);
    cr_assert_eq(s->n_records, 4, "epochs 1 to 3, then the final record");
    for (int e = 0; e < 3; e++) {
        cr_assert_eq(s->records[e].step, 64 * (uint64_t)(e + 1), "epoch %d's record", e + 1);
        cr_assert(!s->records[e].recovery && s->records[e].n_segments == 2);
        cr_assert_eq(memcmp(s->records[e].segment_loss, straight->records[e].segment_loss,
                            sizeof s->records[e].segment_loss), 0, "epoch %d", e + 1);
    }
    const st_epoch_record *f = &s->records[3];
    cr_assert(f->final && f->interrupted && f->step == 192 && f->epoch == 3 && f->epochs == 5,
              "the final record: epoch %d/%d, step %llu, interrupted %d", f->epoch, f->epochs,
              (unsigned long long)f->step, f->interrupted);
    cr_assert_eq(s->n_checkpoints, 2, "%d checkpoints", s->n_checkpoints);
    cr_assert_eq(s->checkpoints[0], 128, "the periodic one: step 100 passed in epoch 2");
    cr_assert_eq(s->checkpoints[1], 192, "the stop's, at epoch 3's end");

    snprintf(path, sizeof path, "%s/step-00000192.safetensors", dir);
    st_safetensors file;
    cr_assert_eq(st_safetensors_read(path, &file), ST_OK, "%s", st_last_error());
    cr_assert_str_eq(st_safetensors_meta(&file, "subtrain.synth.segment_epochs"), "3");
    cr_assert_str_eq(st_safetensors_meta(&file, "subtrain.epoch"), "1",
                     "an apart phase's checkpoint: the recovery epochs' start");
    cr_assert_str_eq(st_safetensors_meta(&file, "subtrain.step"), "0");
    st_train_config rc = synth_config(3, 2, 4);
    rc.synth.recovery_epochs = 1;
    rc.resume = &file;
    rc.resume_name = path;
    stop_run *resumed = calloc(1, sizeof *resumed);
    run_stopped(&rc, &train, &test, resumed);
    cr_assert_eq(resumed->n_records, 3, "segment epoch 4, the recovery epoch, the final");
    cr_assert(resumed->records[0].epoch == 4 && resumed->records[0].step == 256 &&
              !resumed->records[0].recovery);
    cr_assert(resumed->records[1].epoch == 5 && resumed->records[1].recovery);
    cr_assert_eq(resumed->n_params, straight->n_params);
    cr_assert_eq(memcmp(resumed->params, straight->params,
                        straight->n_params * sizeof *straight->params), 0,
                 "the resumed run's weights are those of the run never stopped");
    st_safetensors_free(&file);
    free(straight);
    free(s);
    free(resumed);
    st_test_rmdir(dir);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* ------------------------------------------------------------ hot path */

/* Counts heap calls of every thread between worker 0's step 3 and its
 * first epoch record (test_train.c explains the interposer; oneDNN's own
 * allocations inside dnnl_primitive_execute are counted apart).  Every
 * worker's steps count, not only worker 0's: the flag is one global atomic
 * (worker 0's callbacks arm and disarm it for everyone), the counters are
 * global atomics that every thread adds to (the sum over threads), and
 * only "inside oneDNN" is per thread (heapwatch.h). */
static atomic_int armed;
static atomic_long own_calls, executes;

static void heapwatch_heap_call(int inside_onednn)
{
    if (atomic_load_explicit(&armed, memory_order_relaxed) && !inside_onednn)
        atomic_fetch_add_explicit(&own_calls, 1, memory_order_relaxed);
}

static void heapwatch_execute(void)
{
    if (atomic_load_explicit(&armed, memory_order_relaxed))
        atomic_fetch_add_explicit(&executes, 1, memory_order_relaxed);
}

#include "heapwatch.h"

typedef struct heap_watch {
    long own, execs;
    int done;
} heap_watch;

static void watch_step(const st_step_info *info, void *user)
{
    (void)user;
    if (info->step == 3) {
        atomic_store(&own_calls, 0);
        atomic_store(&executes, 0);
        atomic_store(&armed, 1);
    }
}

static void watch_epoch(const st_epoch_record *rec, void *user)
{
    heap_watch *h = user;
    (void)rec;
    if (h->done)
        return;
    atomic_store(&armed, 0);
    h->done = 1;
    h->own = atomic_load(&own_calls);
    h->execs = atomic_load(&executes);
}

/* N = 4, S = 3 (cuts after layers 1 and 2, FLOPs 2048 : 2048 : 2432 per
 * sample): groups of 1, 1 and 2, so the steps watched are a first segment
 * updating alone, a middle one (noise, MSE, update alone) and a last one
 * (noise, cross-entropy, its group's engine). */
Test(train, a_segment_step_makes_no_heap_allocation, .timeout = 60)
{
    HEAPWATCH_SKIP_IF_OFF();
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = synth_config(4, 3, 1);
    heap_watch h = { 0 };
    st_train_callbacks cb = { .on_step = watch_step, .on_epoch = watch_epoch, .user = &h };
    st_epoch_record f;
    cr_assert_eq(st_train_run(&c, &train, &test, &cb, &f), ST_OK, "%s", st_last_error());
    cr_assert(h.done);
    cr_assert(f.segment_workers[0] == 1 && f.segment_workers[1] == 1 &&
              f.segment_workers[2] == 2, "groups %d/%d/%d", f.segment_workers[0],
              f.segment_workers[1], f.segment_workers[2]);
    cr_assert(c.synth.noise > 0.0f, "the later segments draw noise");
    /* each step runs >= 3 primitives per linear layer: every worker's count */
    cr_assert_gt(h.execs, 3 * 100, "the interposer saw the workers' primitives run (%ld)",
                 h.execs);
    cr_log_info("every worker, worker 0's steps 4-128 and the evaluation: %ld heap calls, "
                "%ld primitive executions", h.own, h.execs);
    cr_assert_eq(h.own, 0, "the workers called the heap %ld times in their segment steps", h.own);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* A segment is a run of the model's own layer table: it counts its FLOPs
 * from its layers, and that count is the planner's formula (which needs
 * no segment built); its parameters are the full model's, from the right
 * place. */
Test(segment, is_a_run_of_the_model_layer_table)
{
    st_arena a;
    st_arena_init(&a, "seg", NULL, 0);
    st_model_config m = mlp(4, 24, 12, 5);
    st_model *full;
    OK(st_model_create(&m, 8, &a, &full));
    st_model_init_params(full, 3);
    for (int first = 1; first <= 5; first++)
        for (int last = first; last <= 5; last++) {
            st_segnet *s = make_segment(&m, first, last, 8, &a, 3);
            cr_assert_eq(st_segnet_step_flops(s), st_segment_flops(&m, first, last, 8),
                         "layers %d .. %d", first, last);
            size_t off = st_segnet_full_offset(s);
            cr_assert_eq(off, st_segment_params(&m, 1, first - 1));
            cr_assert_eq(st_segnet_param_count(s), st_segment_params(&m, first, last));
            cr_assert_eq(memcmp(st_segnet_params(s), st_model_params(full) + off,
                                st_segnet_param_count(s) * sizeof(float)), 0,
                         "layers %d .. %d start with the full model's values", first, last);
            st_segnet_destroy(s);
        }
    st_model_destroy(full);
    st_arena_release(&a);
}

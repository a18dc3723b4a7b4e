/*
 * tests/test_synth.c — partitioned training with synthetic intermediate
 * labels (--strategy synth), its parts: the pure plan (cuts, worker split,
 * labels), the MSE loss and the segment networks against finite
 * differences, a segment as a run of the model's layer table, and the join
 * (the joined mlp is the composition of the segments, to the bit).
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "gradcheck.h"

#include <subtrain/subtrain.h>
#include "core/arena_impl.h"
#include "nn/layers/mse.h"
#include "nn/segment.h"
#include "testutil.h"
#include "synth_check.h"

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

Test(segment, last_segment_gradient_matches_finite_differences)
{
    omp_set_num_threads(1);
    gradcheck_segment(3, 4);
    gradcheck_segment(4, 4); /* the head alone after a cut */
}

/* A segment is a run of the model's own layer table: it counts its FLOPs
 * from its layers, and that count is the planner's formula (which needs
 * no segment built); its parameters are the full model's, from the right
 * place. */
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

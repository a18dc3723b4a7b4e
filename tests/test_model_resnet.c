/*
 * tests/test_model_resnet.c — the ResNet: its gradient check, its state under
 * subnetworks, blocked and plain layouts, bf16 tensors in passing,
 * calibration, its units.
 *
 * The small models and the gradient check: tests/model_check.h.
 */
#include "model_check.h"

/* ------------------------------------------------------------ resnet */

/* The CIFAR-family ResNet as a layer table: convolutions, batch norms
 * (training forward: batch statistics), activations, skips, a projection
 * block per stage after the first, global average pooling and the head,
 * checked against finite differences of the training loss.  GELU: with
 * ReLU after a batch norm, perturbing an early weight moves many
 * pre-activations across the kink and the guard would skip most of them
 * (the layers' own checks in test_layers_rowwise cover ReLU's backward). */
Test(gradcheck, resnet_training_forward)
{
    omp_set_num_threads(1);
    st_model_config c = resnet_config(st_model_kind_named("resnet"), 1, 4, 2, 6, 6);
    c.activation = ST_ACT_GELU;
    objective_train = 1;
    st_arena a;
    st_arena_init(&a, "resnet", NULL, 0);
    st_model *m = make_model(&c, 8, &a);
    st_rng r = st_rng_seed(71);
    st_model_init_params(m, 71);
    jitter_norms(m, &r);
    fill_rows(m, 0, 8, &r);
    int n;
    const st_param_segment *segs = st_model_segments(m, &n);
    cr_assert_str_eq(segs[0].name, "stem.weight");
    cr_assert_str_eq(segs[n - 1].name, "head.bias");
    size_t ns;
    cr_assert_not_null(st_model_state(m, &ns));
    cr_assert_gt(ns, 0, "batch norms keep running statistics");
    check_model_grads(m, "resnet d1 w4 2x6x6", 72);
    st_model_destroy(m);
    st_arena_release(&a);
    objective_train = 0;
}

/* Batch norms' running statistics in the full layout: the full model's
 * initial state, and subnetworks' pieces accumulated where they belong:
 * two block subnetworks (distinct values per model) average to their
 * common value where both hold a block and keep their own elsewhere; a
 * neuron subnetwork's compact channels load from and add back to the
 * same full positions. */
Test(state, subnetworks_state_sits_in_the_full_layout)
{
    omp_set_num_threads(1);
    st_model_config c = resnet_config(st_model_kind_named("resnet"), 2, 4, 2, 6, 6);
    st_model_units u;
    OK(st_model_config_units(&c, &u));
    cr_assert_gt(u.state, 0);
    cr_assert_eq(u.sections, 3, "stage 0: 2 blocks, stages 1, 2: 1 each");
    int sizes[4];
    cr_assert_eq(st_model_config_sections(&c, sizes, 4), 3);
    cr_assert(sizes[0] == 2 && sizes[1] == 1 && sizes[2] == 1);
    const size_t S = (size_t)u.state;
    float *init = malloc(S * sizeof *init), *full = malloc(S * sizeof *full);
    double *sum = calloc(S, sizeof *sum);
    uint32_t *count = calloc(S, sizeof *count);
    OK(st_model_config_state_init(&c, init));
    size_t ones = 0;
    for (size_t f = 0; f < S; f++) {
        cr_assert(init[f] == 0.0f || init[f] == 1.0f);
        ones += init[f] == 1.0f;
    }
    cr_assert_eq(2 * ones, S, "a mean (0) and a variance (1) per channel");

    st_arena a;
    st_arena_init(&a, "state", NULL, 0);
    st_model_config ca = c, cb = c;
    const int ga[] = { 0, 2 }, gb[] = { 1, 2, 3 };
    ca.subnet.groups = ga;
    ca.subnet.n_groups = 2;
    cb.subnet.groups = gb;
    cb.subnet.n_groups = 3;
    st_model *ma = make_model(&ca, 4, &a), *mb = make_model(&cb, 4, &a);
    size_t na, nb;
    float *sa = st_model_state(ma, &na), *sb = st_model_state(mb, &nb);
    cr_assert_lt(na, S);
    cr_assert_lt(nb, S);
    for (size_t j = 0; j < na; j++)
        sa[j] = 10.0f;
    for (size_t j = 0; j < nb; j++)
        sb[j] = 20.0f;
    st_model_state_accumulate(ma, sum, count);
    st_model_state_accumulate(mb, sum, count);
    size_t both = 0, total = 0;
    for (size_t f = 0; f < S; f++) {
        cr_assert(count[f] >= 1 && count[f] <= 2, "every block is held by a or b");
        double mean = sum[f] / count[f];
        cr_assert(count[f] == 2 ? mean == 15.0 : (mean == 10.0 || mean == 20.0));
        both += count[f] == 2;
        total += count[f];
        full[f] = (float)mean;
    }
    cr_assert_eq(total, na + nb);
    cr_assert_gt(both, 0, "the stem's, projections' and block 2's statistics are shared");
    st_model *m = make_model(&c, 4, &a);
    size_t nm;
    float *sm = st_model_state(m, &nm);
    cr_assert_eq(nm, S);
    st_model_state_load(m, full);
    cr_assert_eq(memcmp(sm, full, S * sizeof *full), 0, "the full model's state is the layout");

    /* neurons: 1 of 2 groups of 2 channels in each block */
    st_model_config cn = c;
    const int wc[] = { 1, 1, 1, 1 }, wk[] = { 1, 0, 1, 1 };
    cn.subnet.unit_size = 2;
    cn.subnet.width_count = wc;
    cn.subnet.width_kept = wk;
    st_model *mn = make_model(&cn, 4, &a);
    size_t nn;
    float *sn = st_model_state(mn, &nn);
    cr_assert_lt(nn, S);
    for (size_t f = 0; f < S; f++)
        full[f] = (float)f;
    st_model_state_load(mn, full);
    memset(sum, 0, S * sizeof *sum);
    memset(count, 0, S * sizeof *count);
    st_model_state_accumulate(mn, sum, count);
    size_t held = 0;
    for (size_t f = 0; f < S; f++)
        if (count[f]) {
            cr_assert_eq(count[f], 1);
            cr_assert_eq(sum[f], (double)f, "element %zu came back to its place", f);
            held++;
        }
    cr_assert_eq(held, nn);
    cr_assert_eq(sn[0], 0.0f, "the stem's first running mean comes first");
    st_model_destroy(mn);
    st_model_destroy(m);
    st_model_destroy(mb);
    st_model_destroy(ma);
    st_arena_release(&a);
    free(init);
    free(full);
    free(sum);
    free(count);
}

/* Image tensors kept in the blocked layout between layers (the default
 * here) or channels last compute what plain NCHW tensors with reorders
 * around every layer do: the whole model, a neuron subnetwork whose kept
 * channels are whole blocks (blocked) in some stages and not in others
 * (plain), its backward masking, and a block subnetwork; training and
 * inference forwards.  And the blocked model keeps less activation memory
 * (no blocked copies). */
static void check_layout_equals_plain(st_model_config c, st_tensor_layout layout,
                                      const char *what)
{
    omp_set_num_threads(1);
    st_arena a, b;
    st_arena_init(&a, "blocked", NULL, 0);
    st_arena_init(&b, "plain", NULL, 0);
    st_model_config cp = c;
    cp.plain_tensors = 1;
    c.tensor_layout = layout;
    st_model *mb = make_model(&c, 8, &a), *mp = make_model(&cp, 8, &b);
    cr_assert_eq(st_model_param_count(mb), st_model_param_count(mp));
    st_model_init_params(mb, 17);
    st_model_init_params(mp, 17);
    st_rng r = st_rng_seed(18);
    fill_rows(mb, 0, 8, &r);
    r = st_rng_seed(18);
    fill_rows(mp, 0, 8, &r);
    float lb, lp;
    OK(st_model_forward_backward(mb, &lb));
    OK(st_model_forward_backward(mp, &lp));
    cr_assert_lt(fabsf(lb - lp), 1e-5f * fabsf(lp), "%s: loss %.9g blocked, %.9g plain", what,
                 lb, lp);
    const float *gb = st_model_grads(mb), *gp = st_model_grads(mp);
    double worst = 0.0, scale = 0.0;
    for (size_t i = 0; i < st_model_grad_count(mp); i++)
        scale = fmax(scale, fabs(gp[i]));
    for (size_t i = 0; i < st_model_grad_count(mp); i++)
        worst = fmax(worst, fabs(gb[i] - gp[i]) / scale);
    cr_assert_lt(worst, 1e-5, "%s: gradients differ by %g of the largest", what, worst);
    double sb = 0.0, sp = 0.0;
    int64_t hb = 0, hp = 0;
    OK(st_model_evaluate(mb, 8, &sb, &hb));
    OK(st_model_evaluate(mp, 8, &sp, &hp));
    cr_assert_lt(fabs(sb - sp), 1e-5 * fabs(sp), "%s: inference loss", what);
    const size_t act_b = a.stats.peak[ST_MEM_ACTIVATIONS], act_p = b.stats.peak[ST_MEM_ACTIVATIONS];
    cr_log_info("%s: max gradient diff %.3g of the largest; activations %zu B blocked, %zu B plain",
                what, worst, act_b, act_p);
    if (st_tensor_layout_resolve(layout, c.precision) == ST_TENSOR_LAYOUT_BLOCKED)
        cr_assert_lt(act_b, act_p, "%s: no blocked copies of the tensors", what);
    st_model_destroy(mb);
    st_model_destroy(mp);
    st_arena_release(&a);
    st_arena_release(&b);
}

/* bf16 ResNet: the convolutions' inputs in passing (a block's BN -> ReLU
 * outputs, or the GELU after it, read by convolutions only) share
 * buffers (graph.c's assign_forward_only), and nothing reads it once its conv's forward has made the bf16
 * copy: with the buffer filled with NaN between the forward and the
 * backward, the loss and every gradient are bitwise those of the step
 * left alone; and they are close to fp32's, not equal.  The gradients
 * are compared with GELU only: with ReLU after batch norms over 16 values
 * (batch 4, 2 x 2 at stage 2) this model is chaotic in fp32 itself (inputs
 * moved by 0.2%, as bf16 moves them, move its conv weights' gradients by
 * 15%, measured; GELU's by 0.4%). */
static void check_resnet_bf16_passing(st_model_config c, const char *what)
{
    const int smooth = c.activation == ST_ACT_GELU;
    omp_set_num_threads(1);
    c.precision = ST_PRECISION_BF16;
    st_arena a;
    st_arena_init(&a, "resnet bf16", NULL, 0);
    st_model *m = make_model(&c, 4, &a);
    st_model_init_params(m, 91);
    st_rng r = st_rng_seed(92);
    fill_rows(m, 0, 4, &r);
    /* the buffer two or more convolutions read x from */
    float *passing = NULL;
    size_t floats = 0;
    int n_convs = 0, sharing = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const st_layer *l = &m->layers[i];
        if (l->dropped || l->kind != &st_layer_conv)
            continue;
        n_convs++;
        cr_expect(l->u.conv.bf16, "%s: %s is not bf16", what, l->name);
        for (int j = i + 1; j < m->n_layers && !passing; j++)
            if (!m->layers[j].dropped && m->layers[j].kind == &st_layer_conv &&
                st_graph_data(m, m->layers[j].x) == st_graph_data(m, l->x))
                passing = st_graph_data(m, l->x);
    }
    cr_assert_not_null(passing, "%s: no two convolutions share an input buffer", what);
    for (int i = 0; i < m->n_layers; i++) {
        const st_layer *l = &m->layers[i];
        if (l->dropped || l->kind != &st_layer_conv || st_graph_data(m, l->x) != passing)
            continue;
        sharing++;
        const size_t n = (size_t)m->rows * (size_t)st_graph_cols(m, l->x);
        floats = n > floats ? n : floats;
    }
    const size_t G = m->n_grads;
    float *g0 = malloc(G * sizeof *g0), loss0, loss1;
    OK(st_model_forward_backward(m, &loss0));
    memcpy(g0, st_model_grads(m), G * sizeof *g0);
    double sum;
    OK(st_graph_forward(m, ST_PHASE_TRAIN));
    OK(st_xent_forward(&m->ctx, &m->xent, m->labels, m->rows, 1, &sum, NULL));
    loss1 = (float)(sum / (double)m->rows);
    for (size_t i = 0; i < floats; i++)
        passing[i] = NAN;
    OK(st_graph_backward(m));
    cr_expect(memcmp(&loss0, &loss1, sizeof loss0) == 0, "%s: loss %.9g, again %.9g", what,
              loss0, loss1);
    size_t bad = 0;
    for (size_t i = 0; i < G; i++)
        bad += memcmp(&g0[i], &st_model_grads(m)[i], sizeof *g0) != 0;
    cr_expect_eq(bad, 0, "%s: %zu of %zu gradients change when the buffer in passing is "
                 "overwritten after the forward", what, bad, G);
    /* fp32: the same step */
    c.precision = ST_PRECISION_FP32;
    st_arena b;
    st_arena_init(&b, "resnet fp32", NULL, 0);
    st_model *m32 = make_model(&c, 4, &b);
    st_model_init_params(m32, 91);
    r = st_rng_seed(92);
    fill_rows(m32, 0, 4, &r);
    float loss32;
    OK(st_model_forward_backward(m32, &loss32));
    double dot = 0, n16 = 0, n32 = 0;
    for (size_t i = 0; i < G; i++) {
        dot += (double)g0[i] * st_model_grads(m32)[i];
        n16 += (double)g0[i] * g0[i];
        n32 += (double)st_model_grads(m32)[i] * st_model_grads(m32)[i];
    }
    const double cosine = dot / sqrt(n16 * n32);
    fprintf(stderr, "[bf16] %s: %d of %d convs read the buffer in passing; loss %.6f (fp32 "
            "%.6f), gradient cosine to fp32 %.6f\n", what, sharing, n_convs, loss0, loss32,
            cosine);
    cr_expect_gt(sharing, 1, "%s", what);
    cr_expect(fabsf(loss0 - loss32) <= 1e-2f * fabsf(loss32), "%s: loss %g, fp32 %g", what,
              loss0, loss32);
    cr_expect(loss0 != loss32, "%s: bf16 loss bitwise fp32's: not rounded?", what);
    if (smooth)
        cr_expect_gt(cosine, 0.999, "%s: gradients far from fp32's", what);
    free(g0);
    st_model_destroy(m);
    st_model_destroy(m32);
    st_arena_release(&a);
    st_arena_release(&b);
}

Test(layout, bf16_resnet_inputs_in_passing_are_not_read_by_the_backward)
{
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 kernels on this CPU");
    st_model_config c = resnet_config(st_model_kind_named("resnet"), 2, 16, 3, 8, 8);
    check_resnet_bf16_passing(c, "resnet d2 w16 relu");
    c.activation = ST_ACT_GELU;
    check_resnet_bf16_passing(c, "resnet d2 w16 gelu");
    /* a neuron subnetwork: compact widths, the branch scale */
    st_model_config n = resnet_config(st_model_kind_named("resnet"), 2, 16, 3, 8, 8);
    n.activation = ST_ACT_GELU;
    const int wc[] = { 1, 1, 1, 2 }, wk[] = { 0, 0, 1, 0, 3 };
    n.subnet.unit_size = 16;
    n.subnet.width_count = wc;
    n.subnet.width_kept = wk;
    n.subnet.scale = 2.0f;
    check_resnet_bf16_passing(n, "resnet d2 w16 neuron subnetwork");
}

static void check_layouts(st_tensor_layout layout)
{
    /* stages of 16, 32 and 64 channels: whole blocks of 16 (or 8) */
    st_model_config c = resnet_config(st_model_kind_named("resnet"), 2, 16, 3, 8, 8);
    check_layout_equals_plain(c, layout, "resnet d2 w16");
    st_model_config n = c;
    /* width layers: the 2 blocks of stage 0 (16 channels), 1 of stage 1
     * (32), 1 of stage 2 (64) */
    const int wc[] = { 1, 1, 1, 2 }, wk[] = { 0, 0, 1, 0, 3 };
    n.subnet.unit_size = 16;   /* 16 of 16, 16 of 16, 16 of 32, 32 of 64: blocked */
    n.subnet.width_count = wc;
    n.subnet.width_kept = wk;
    n.subnet.scale = 2.0f;
    cr_assert_eq(st_model_config_check(&n), ST_OK, "%s", st_last_error());
    check_layout_equals_plain(n, layout, "neuron subnetwork");
    const int wc8[] = { 2, 1, 2, 2 }, wk8[] = { 0, 1, 1, 1, 2, 0, 5 };
    n.subnet.scale = 0.0f;
    n.subnet.unit_size = 8;    /* 16, 8 (plain with AVX-512), 16, 16 channels */
    n.subnet.width_count = wc8;
    n.subnet.width_kept = wk8;
    n.subnet.width_grads_only = 1;
    check_layout_equals_plain(n, layout, "neuron backward masking, groups of 8");
    n.subnet.width_grads_only = 0;
    check_layout_equals_plain(n, layout, "neuron subnetwork, groups of 8");
    st_model_config g = c;
    const int held[] = { 1, 2, 3 };
    g.subnet.groups = held;
    g.subnet.n_groups = 3;
    g.subnet.scale = 1.5f;
    check_layout_equals_plain(g, layout, "block subnetwork");
}

Test(layout, blocked_tensors_compute_what_plain_ones_do)
{
    check_layouts(ST_TENSOR_LAYOUT_BLOCKED);
}

/* Channels last: batch norms, max pools and skips take it as it is; the
 * convolutions too where oneDNN's kernels do (AMX, bf16), else through
 * reorders (the conv layer's own bias loop on it: test_layers_conv). */
Test(layout, channels_last_tensors_compute_what_plain_ones_do)
{
    check_layouts(ST_TENSOR_LAYOUT_NHWC);
    st_model_config v = resnet_config(st_model_kind_named("convnet"), 2, 16, 3, 8, 8);
    check_layout_equals_plain(v, ST_TENSOR_LAYOUT_NHWC, "convnet d2 w16");
    check_layout_equals_plain(v, ST_TENSOR_LAYOUT_BLOCKED, "convnet d2 w16 blocked");
}

/* Recalibration: the first batch (k = 0) replaces whatever running
 * statistics the model had, and K batches give the mean of their
 * statistics (the same batch twice: the same state as once). */
Test(state, calibration_replaces_the_running_statistics)
{
    omp_set_num_threads(1);
    st_model_config c = resnet_config(st_model_kind_named("resnet"), 1, 4, 2, 6, 6);
    st_arena a;
    st_arena_init(&a, "calibrate", NULL, 0);
    st_model *m1 = make_model(&c, 8, &a), *m2 = make_model(&c, 8, &a);
    st_model_init_params(m1, 5);
    st_model_init_params(m2, 5);
    size_t n;
    float *s1 = st_model_state(m1, &n), *s2 = st_model_state(m2, &n);
    for (size_t i = 0; i < n; i++)
        s2[i] = 7.0f + (float)i;   /* m1 has its initial state, m2 another */
    st_rng r = st_rng_seed(6);
    fill_rows(m1, 0, 8, &r);
    memcpy(st_model_input(m2), st_model_input(m1), 8 * (size_t)c.in_dim * sizeof(float));
    OK(st_model_calibrate(m1, 0));
    OK(st_model_calibrate(m2, 0));
    cr_assert_eq(memcmp(s1, s2, n * sizeof *s1), 0, "k = 0 keeps nothing of the old state");
    float *once = malloc(n * sizeof *once);
    memcpy(once, s1, n * sizeof *once);
    OK(st_model_calibrate(m1, 1));
    for (size_t i = 0; i < n; i++)
        cr_assert_float_eq(s1[i], once[i], 1e-6f * (1.0f + fabsf(once[i])),
                           "the mean of one batch's statistics twice");
    cr_assert_eq(st_model_calibrate(m1, -1), ST_ERR_INVALID);
    free(once);
    st_model_destroy(m1);
    st_model_destroy(m2);
    st_arena_release(&a);
}

/* Units: one layer group per identity block (stage 1: depth blocks; later
 * stages: depth - 1, after their projection block); each group's inner
 * channels are a width layer. */
Test(units, resnet_declares_identity_blocks)
{
    st_model_units u;
    st_model_config c = resnet_config(st_model_kind_named("resnet"), 3, 8, 3, 32, 32);
    OK(st_model_config_units(&c, &u));
    cr_assert_eq(u.groups, 3 + 2 + 2);
    cr_assert_eq(u.width_layers, 7);
    cr_assert_eq(u.width, 8);
    c = resnet_config(st_model_kind_named("resnet18"), 1, 8, 1, 28, 28);
    OK(st_model_config_units(&c, &u));
    cr_assert_eq(u.groups, 2 + 1 + 1 + 1);
    st_model_config v = c;
    v.in_channels = v.in_height = v.in_width = 0;
    cr_assert_eq(st_model_config_units(&v, &u), ST_ERR_INVALID, "a resnet needs images");
    cr_assert_str_eq(st_last_error(), "--model resnet18 takes images (C x H x W data), not 784 "
                                      "features");
}

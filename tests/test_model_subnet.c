/*
 * tests/test_model_subnet.c — subnetworks of layer groups and of neurons: their
 * names, values and places in the full model, forward and backward
 * masking, bad selections; units declared by the layers.
 *
 * The small models and the gradient check: tests/model_check.h.
 */
#include "model_check.h"

/* ------------------------------------------------------------ subnetworks */

/* Asserts that each of the n full-layout ranges r holds, at local[i] of
 * `mine`, what `full` holds there, to the bit; returns the floats covered. */
static size_t ranges_match(const float *mine, const float *full, const st_range *r,
                           const size_t *local, int n)
{
    size_t covered = 0;
    for (int i = 0; i < n; i++) {
        size_t len = r[i].end - r[i].begin;
        cr_assert_eq(memcmp(mine + local[i], full + r[i].begin, len * sizeof(float)), 0,
                     "range %d holds the full model's values", i);
        covered += len;
    }
    return covered;
}

/* A block subnetwork is the full model with some blocks left out: its
 * parameters start as the full model's (same names, same values) and its
 * full-layout ranges say exactly where each of them lives. */
Test(subnetwork, blocks_keep_their_full_names_values_and_places)
{
    st_arena a;
    st_arena_init(&a, "sub", NULL, 0);
    st_model_config full_cfg = resmlp_config(5, 16, 24, ST_ACT_GELU);
    const int ids[] = { 1, 3, 4 };
    st_model_config sub_cfg = full_cfg;
    sub_cfg.subnet.groups = ids;
    sub_cfg.subnet.n_groups = 3;
    st_model *full = make_model(&full_cfg, 4, &a), *sub = make_model(&sub_cfg, 4, &a);
    st_model_init_params(full, 9);
    st_model_init_params(sub, 9);
    cr_assert_eq(st_model_full_param_count(sub), st_model_param_count(full));
    cr_assert_lt(st_model_param_count(sub), st_model_param_count(full));

    st_range r[16];
    size_t local[16];
    int n = st_model_full_ranges(sub, r, local, 16);
    /* stem | block 1 | block 3 + block 4 + final norm + head */
    cr_assert_eq(n, 3, "adjacent pieces merge: got %d ranges", n);
    cr_assert_eq(ranges_match(st_model_params(sub), st_model_params(full), r, local, n),
                 st_model_param_count(sub));

    int ns, nf;
    const st_param_segment *ss = st_model_segments(sub, &ns), *fs = st_model_segments(full, &nf);
    cr_assert_str_eq(ss[2].name, "block1.ln.gamma");
    cr_assert_str_eq(ss[8].name, "block3.ln.gamma");
    cr_assert_str_eq(ss[ns - 1].name, fs[nf - 1].name);

    st_model *whole = make_model(&full_cfg, 4, &a);
    cr_assert_eq(st_model_full_ranges(whole, r, local, 16), 1);
    cr_assert_eq(r[0].begin, 0);
    cr_assert_eq(r[0].end, st_model_param_count(whole));
    st_model_destroy(whole);
    st_model_destroy(sub);
    st_model_destroy(full);
    st_arena_release(&a);
}

Test(subnetwork, bad_block_ids_are_refused)
{
    st_model_config c = resmlp_config(2, 16, 24, ST_ACT_GELU);
    const int unsorted[] = { 3, 1 }, outside[] = { 0, 5 };
    c.depth = 4;
    c.subnet.n_groups = 2;
    c.subnet.groups = unsorted;
    cr_assert_eq(st_model_config_check(&c), ST_ERR_INVALID);
    c.subnet.groups = outside;
    cr_assert_eq(st_model_config_check(&c), ST_ERR_INVALID);
    c.subnet.groups = NULL;
    cr_assert_eq(st_model_config_check(&c), ST_ERR_INVALID, "a count without ids");
    const int ok[] = { 0, 3 };
    c.subnet.groups = ok;
    cr_assert_eq(st_model_config_check(&c), ST_OK);
    c.subnet.n_groups = 5;
    cr_assert_eq(st_model_config_check(&c), ST_ERR_INVALID, "more groups than the model has");
    /* an mlp declares no layer groups */
    st_model_config m = mlp_config(3, 8, ST_ACT_GELU);
    const int ids[] = { 0, 1 };
    m.subnet.groups = ids;
    m.subnet.n_groups = 2;
    cr_assert_eq(st_model_config_check(&m), ST_ERR_INVALID);
    const uint8_t grads[] = { 1, 0, 1 };
    m.subnet.groups = NULL;
    m.subnet.n_groups = 0;
    m.subnet.group_grads = grads;
    cr_assert_eq(st_model_config_check(&m), ST_ERR_INVALID);
}

/* Backward masking: the forward and every data gradient are the full
 * model's; weight gradients exist only for the kept blocks, and equal the
 * full model's there, to the bit. */
Test(subnetwork, backward_masking_keeps_the_full_gradient_of_held_blocks)
{
    omp_set_num_threads(1);
    st_arena a;
    st_arena_init(&a, "bwd", NULL, 0);
    st_model_config full_cfg = resmlp_config(3, 16, 24, ST_ACT_GELU), cfg = full_cfg;
    const uint8_t keep[] = { 1, 0, 1 };
    cfg.subnet.group_grads = keep;
    st_model *full = make_model(&full_cfg, 8, &a), *m = make_model(&cfg, 8, &a);
    st_model_init_params(full, 5);
    st_model_init_params(m, 5);
    st_rng r = st_rng_seed(6);
    fill_rows(full, 0, 8, &r);
    r = st_rng_seed(6);
    fill_rows(m, 0, 8, &r);
    float lf, lm;
    OK(st_model_forward_backward(full, &lf));
    OK(st_model_forward_backward(m, &lm));
    cr_assert_eq(lf, lm, "the forward is the full model's");
    size_t block = 2 * 16 + (16 * 24 + 24) + (24 * 16 + 16);
    cr_assert_eq(st_model_grad_count(m), st_model_param_count(m) - block);

    st_range rg[8];
    size_t local[8];
    int n = st_model_full_grad_ranges(m, rg, local, 8);
    cr_assert_eq(n, 2, "everything but block 1: two ranges, got %d", n);
    cr_assert_eq(ranges_match(st_model_grads(m), st_model_grads(full), rg, local, n),
                 st_model_grad_count(m));
    int ns;
    const st_param_segment *s = st_model_segments(m, &ns);
    for (int i = 0; i < ns; i++)
        cr_assert_eq(s[i].grad_offset == ST_NO_GRAD, strncmp(s[i].name, "block1.", 7) == 0,
                     "%s", s[i].name);
    cr_assert_lt(st_model_step_flops(m), st_model_step_flops(full),
                 "no weight-gradient products for the dropped block");
    st_model_destroy(m);
    st_model_destroy(full);
    st_arena_release(&a);
}

/* ------------------------------------------------------------ neuron subnetworks */

/* A compact neuron subnetwork starts with exactly the full model's values
 * at the places its ranges name; scattering it into a full-size vector and
 * gathering it back round-trips to the bit; ranges are sorted and disjoint
 * and cover the compact vector once. */
static void check_neuron_places(st_model_kind kind)
{
    st_arena a;
    st_arena_init(&a, "neurons", NULL, 0);
    st_model_config sub_cfg = neuron_config(kind, 0), full_cfg = sub_cfg;
    full_cfg.subnet.width_count = NULL;
    full_cfg.subnet.width_kept = NULL;
    st_model *full = make_model(&full_cfg, 4, &a), *sub = make_model(&sub_cfg, 4, &a);
    st_model_init_params(full, 9);
    st_model_init_params(sub, 9);
    cr_assert_lt(st_model_param_count(sub), st_model_param_count(full));
    cr_assert_eq(st_model_full_param_count(sub), st_model_param_count(full));
    st_range *r;
    size_t *local;
    int n = ranges_of(sub, 0, &r, &local);
    size_t P = st_model_param_count(full), covered = 0;
    float *scattered = calloc(P, sizeof *scattered), *back = calloc(st_model_param_count(sub), 4);
    for (int i = 0; i < n; i++) {
        size_t len = r[i].end - r[i].begin;
        cr_assert(i == 0 || r[i].begin > r[i - 1].end || (r[i].begin == r[i - 1].end &&
                  local[i] != local[i - 1] + (r[i - 1].end - r[i - 1].begin)),
                  "range %d sorted, disjoint, not mergeable", i);
        cr_assert_eq(memcmp(st_model_params(sub) + local[i], st_model_params(full) + r[i].begin,
                            len * sizeof(float)), 0, "%s range %d: the full model's values",
                     st_model_kind_name(kind), i);
        memcpy(scattered + r[i].begin, st_model_params(sub) + local[i], len * sizeof(float));
        covered += len;
    }
    for (int i = 0; i < n; i++)
        memcpy(back + local[i], scattered + r[i].begin, (r[i].end - r[i].begin) * sizeof(float));
    cr_assert_eq(covered, st_model_param_count(sub));
    cr_assert_eq(memcmp(back, st_model_params(sub), covered * sizeof(float)), 0, "round trip");
    fprintf(stderr, "neuron subnetwork of %s: %zu of %zu parameters in %d ranges\n",
            st_model_kind_name(kind), covered, P, n);
    free(scattered);
    free(back);
    free(r);
    free(local);
    st_model_destroy(sub);
    st_model_destroy(full);
    st_arena_release(&a);
}

Test(subnetwork, neurons_keep_their_full_values_and_places_resmlp)
{
    check_neuron_places(st_model_kind_named("resmlp"));
}

Test(subnetwork, neurons_keep_their_full_values_and_places_mlp)
{
    check_neuron_places(st_model_kind_named("mlp"));
}

/* Is neuron j of neuron layer l kept by neuron_config? */
static int neuron_kept(const st_model_config *c, int l, int j)
{
    const int *g = c->subnet.width_kept;
    for (int k = 0; k < l; k++)
        g += c->subnet.width_count[k];
    for (int k = 0; k < c->subnet.width_count[l]; k++)
        if (g[k] == j / c->subnet.unit_size)
            return 1;
    return 0;
}

static float *segment_named(st_model *m, const char *name, size_t *count)
{
    int n;
    const st_param_segment *s = st_model_segments(m, &n);
    for (int i = 0; i < n; i++)
        if (strcmp(s[i].name, name) == 0) {
            *count = s[i].count;
            return st_model_params(m) + s[i].offset;
        }
    cr_assert_fail("no segment %s", name);
    return NULL;
}

/* What a compact subnetwork computes is the full model with the dropped
 * neurons silenced: their outgoing weights zeroed. */
static void check_neuron_forward(st_model_kind kind)
{
    omp_set_num_threads(1);
    st_arena a;
    st_arena_init(&a, "neurons", NULL, 0);
    st_model_config sub_cfg = neuron_config(kind, 0), full_cfg = sub_cfg;
    full_cfg.subnet.width_count = NULL;
    full_cfg.subnet.width_kept = NULL;
    st_model *full = make_model(&full_cfg, 8, &a), *sub = make_model(&sub_cfg, 8, &a);
    st_model_init_params(full, 3);
    st_model_init_params(sub, 3);
    for (int l = 0; l < 3; l++) {
        char name[32];
        size_t count;
        /* resmlp's fc2 is stored (hidden, width): a row per neuron */
        if (kind == st_model_kind_named("resmlp")) {
            snprintf(name, sizeof name, "block%d.fc2.weight", l);
            float *w = segment_named(full, name, &count);
            for (int j = 0; j < 24; j++)
                if (!neuron_kept(&sub_cfg, l, j))
                    memset(w + (size_t)j * 16, 0, 16 * sizeof *w);
        } else {                         /* the next layer's (out, 20): a column */
            snprintf(name, sizeof name, l == 2 ? "head.weight" : "fc%d.weight", l + 1);
            float *w = segment_named(full, name, &count);
            for (size_t row = 0; row < count / 20; row++)
                for (int j = 0; j < 20; j++)
                    if (!neuron_kept(&sub_cfg, l, j))
                        w[row * 20 + (size_t)j] = 0.0f;
        }
    }
    st_rng r = st_rng_seed(4);
    fill_rows(full, 0, 8, &r);
    r = st_rng_seed(4);
    fill_rows(sub, 0, 8, &r);
    double ls = 0.0, lf = 0.0;
    int64_t cs = 0, cf = 0;
    OK(st_model_evaluate(sub, 8, &ls, &cs));
    OK(st_model_evaluate(full, 8, &lf, &cf));
    double worst = 0.0;
    for (int i = 0; i < 8 * 5; i++) {
        double d = fabs((double)st_model_logits(sub)[i] - st_model_logits(full)[i]);
        worst = d > worst ? d : worst;
    }
    fprintf(stderr, "%s neuron subnetwork vs masked full model: max |logit diff| %.3g\n",
            st_model_kind_name(kind), worst);
    /* the same sums with zeros left out: rounding only, ~ 1e-7 of O(1) logits */
    cr_assert_lt(worst, 1e-5, "compact = masked full model (max diff %g)", worst);
    st_model_destroy(sub);
    st_model_destroy(full);
    st_arena_release(&a);
}

Test(subnetwork, neuron_subnetwork_is_the_masked_full_model_resmlp)
{
    check_neuron_forward(st_model_kind_named("resmlp"));
}

Test(subnetwork, neuron_subnetwork_is_the_masked_full_model_mlp)
{
    check_neuron_forward(st_model_kind_named("mlp"));
}

Test(gradcheck, resmlp_neuron_subnetwork)
{
    st_model_config c = neuron_config(st_model_kind_named("resmlp"), 0);
    c.subnet.scale = 2.0f;
    gradcheck(&c, "resmlp neuron subnetwork (branch x2)", 41);
}

Test(gradcheck, mlp_neuron_subnetwork)
{
    st_model_config c = neuron_config(st_model_kind_named("mlp"), 0);
    c.subnet.scale = 2.0f;
    gradcheck(&c, "mlp neuron subnetwork (inputs x2)", 43);
}

/* Backward masking of neurons: the full model's forward; weight gradients
 * for the kept neurons' rows only, equal to the full model's there. */
static void check_neuron_backward(st_model_kind kind)
{
    omp_set_num_threads(1);
    st_arena a;
    st_arena_init(&a, "neurons", NULL, 0);
    st_model_config cfg = neuron_config(kind, 1), full_cfg = cfg;
    full_cfg.subnet.width_count = NULL;
    full_cfg.subnet.width_kept = NULL;
    st_model *full = make_model(&full_cfg, 8, &a), *m = make_model(&cfg, 8, &a);
    cr_assert_eq(st_model_param_count(m), st_model_param_count(full));
    cr_assert_lt(st_model_grad_count(m), st_model_param_count(m));
    st_model_init_params(full, 5);
    st_model_init_params(m, 5);
    cr_assert_eq(memcmp(st_model_params(m), st_model_params(full),
                        st_model_param_count(m) * sizeof(float)), 0);
    st_rng r = st_rng_seed(6);
    fill_rows(full, 0, 8, &r);
    r = st_rng_seed(6);
    fill_rows(m, 0, 8, &r);
    float lf, lm;
    OK(st_model_forward_backward(full, &lf));
    OK(st_model_forward_backward(m, &lm));
    cr_assert_eq(lf, lm, "the forward is the full model's");
    size_t covered;
    int n;
    double worst = kept_grad_diff(m, full, &covered, &n);
    cr_assert_eq(covered, st_model_grad_count(m));
    fprintf(stderr, "%s neuron backward masking: %zu of %zu gradients, max rel diff %.3g\n",
            st_model_kind_name(kind), covered, st_model_param_count(m), worst);
    /* the same dot products over the batch, maybe blocked differently */
    cr_assert_lt(worst, 1e-5, "kept rows carry the full model's gradient (%g)", worst);
    cr_assert_lt(st_model_step_flops(m), st_model_step_flops(full));
    st_model_destroy(m);
    st_model_destroy(full);
    st_arena_release(&a);
}

Test(subnetwork, neuron_backward_masking_resmlp)
{
    check_neuron_backward(st_model_kind_named("resmlp"));
}

Test(subnetwork, neuron_backward_masking_mlp)
{
    check_neuron_backward(st_model_kind_named("mlp"));
}

Test(subnetwork, bad_neuron_selections_are_refused)
{
    st_model_config c = neuron_config(st_model_kind_named("resmlp"), 0);
    cr_assert_eq(st_model_config_check(&c), ST_OK);
    cr_assert_eq(st_model_neuron_groups(&c, c.subnet.unit_size), 6);
    const int none[] = { 3, 0, 2 }, unsorted[] = { 0, 3, 2, 5, 1, 4 }, outside[] = { 0, 2, 6, 5, 1, 4 };
    c.subnet.width_count = none;
    cr_assert_eq(st_model_config_check(&c), ST_ERR_INVALID, "a layer with no neuron");
    c.subnet.width_count = NEURON_COUNT;
    c.subnet.width_kept = unsorted;
    cr_assert_eq(st_model_config_check(&c), ST_ERR_INVALID);
    c.subnet.width_kept = outside;
    cr_assert_eq(st_model_config_check(&c), ST_ERR_INVALID);
    c.subnet.width_kept = NULL;
    cr_assert_eq(st_model_config_check(&c), ST_ERR_INVALID, "counts without groups");
    c = neuron_config(st_model_kind_named("resmlp"), 0);
    const int ids[] = { 0, 1, 2 };
    c.subnet.groups = ids;
    c.subnet.n_groups = 3;
    cr_assert_eq(st_model_config_check(&c), ST_ERR_INVALID, "block and neuron at once");
}

/* st_model_init_full_range gives, for any range, the values
 * st_model_init_params puts there in a built full model (mlp; resmlp with
 * its neuron-major second layers). */
Test(init, full_range_without_a_model_matches_a_built_one)
{
    st_model_config cfgs[2] = { mlp_config(3, 20, ST_ACT_GELU),
                                resmlp_config(3, 16, 24, ST_ACT_GELU) };
    for (int t = 0; t < 2; t++) {
        st_arena a;
        st_arena_init(&a, "init", NULL, 0);
        st_model *m = make_model(&cfgs[t], 2, &a);
        st_model_init_params(m, 77);
        const size_t P = st_model_param_count(m);
        float *out = malloc(P * sizeof *out);
        st_rng r = st_rng_seed(5);
        for (int k = 0; k < 40; k++) {
            size_t lo = st_rng_below(&r, (uint32_t)P), hi = lo + 1 + st_rng_below(&r, (uint32_t)(P - lo));
            if (k == 0) {
                lo = 0;
                hi = P;
            }
            cr_assert_eq(st_model_init_full_range(&cfgs[t], 77, lo, hi, out), ST_OK);
            cr_assert_eq(memcmp(out, st_model_params(m) + lo, (hi - lo) * sizeof *out), 0,
                         "%s: range [%zu, %zu)", st_model_kind_name(cfgs[t].kind), lo, hi);
        }
        free(out);
        st_model_destroy(m);
        st_arena_release(&a);
    }
}

/* ------------------------------------------------------------ declared units */

/* The units come from the layers' declarations: mlp has one width layer
 * per hidden layer, chained (hidden-to-hidden matrices), no groups;
 * resmlp one group and one width layer (the inner layer) per block. */
Test(units, declared_by_layers)
{
    st_model_units u;
    st_model_config c = mlp_config(3, 48, ST_ACT_RELU);
    cr_assert_eq(st_model_config_units(&c, &u), ST_OK);
    cr_assert_eq(u.groups, 0);
    cr_assert_eq(u.width_layers, 3);
    cr_assert_eq(u.width, 48);
    cr_assert_eq(u.chained, 1);
    c = resmlp_config(5, 32, 80, ST_ACT_GELU);
    cr_assert_eq(st_model_config_units(&c, &u), ST_OK);
    cr_assert_eq(u.groups, 5);
    cr_assert_eq(u.width_layers, 5);
    cr_assert_eq(u.width, 80, "the inner width, not the stream's");
    cr_assert_eq(u.chained, 0);
    c.kind = (st_model_kind)77;
    cr_assert_eq(st_model_config_units(&c, &u), ST_ERR_INVALID);
}

/* Chained ranges are exactly the weights of fc1 .. fc{L-1} of an mlp (the
 * layers whose both sides are hidden layers), found from the segments. */
Test(units, chained_ranges_are_hidden_to_hidden_weights)
{
    st_model_config c = mlp_config(4, 24, ST_ACT_RELU);
    st_param_segment *segs;
    int n_segs;
    cr_assert_eq(st_model_config_segments(&c, &segs, &n_segs), ST_OK);
    st_range r[16];
    int n = st_model_config_chained_ranges(&c, r, 16);
    cr_assert_eq(n, 3);
    int k = 0;
    for (int i = 0; i < n_segs; i++) {
        const char *s = segs[i].name;
        if (strncmp(s, "fc", 2) == 0 && strcmp(s, "fc0.weight") != 0 && ends_with(s, ".weight")) {
            cr_assert_lt(k, n);
            cr_assert_eq(r[k].begin, segs[i].offset, "%s", s);
            cr_assert_eq(r[k].end, segs[i].offset + segs[i].count, "%s", s);
            k++;
        }
    }
    cr_assert_eq(k, n);
    free(segs);
    st_model_config rc = resmlp_config(3, 16, 0, ST_ACT_GELU);
    cr_assert_eq(st_model_config_chained_ranges(&rc, r, 16), 0);
}

/*
 * tests/test_model_new_kind.c — a layer kind the library does not have, declared
 * by the test: what adding a kind takes.
 *
 * The small models and the gradient check: tests/model_check.h.
 */
#include "model_check.h"

/* ------------------------------------------------------------ a new layer kind */

/* What adding a layer kind takes, shown with one the library does not
 * have: y = x / 2, its own loop, no parameters.  Its table entry is all
 * the graph needs; a model declared with it (below) gets layout, memory,
 * the forward and backward loops, layer groups and width units without a
 * line changed elsewhere. */
static st_status half_build(st_model *m, st_layer *l)
{
    st_neuron_sel t;
    l->u.loop.x = st_graph_data(m, l->x);
    l->u.loop.y = st_graph_data(m, l->y);
    l->u.loop.dx = st_graph_data(m, l->dx);
    l->u.loop.dy = st_graph_data(m, l->dy);
    l->u.loop.rows = st_model_batch(m);
    l->u.loop.cols = st_graph_sel(m, l->out_unit, l->out, &t)->n;
    return ST_OK;
}

static st_status half_forward(const st_nn_ctx *ctx, const st_layer *l, st_phase phase)
{
    (void)ctx;
    for (int64_t i = 0; i < l->u.loop.rows * l->u.loop.cols; i++)
        l->u.loop.y[i] = 0.5f * l->u.loop.x[i];
    return ST_OK;
}

static st_status half_backward(const st_nn_ctx *ctx, const st_layer *l)
{
    (void)ctx;
    for (int64_t i = 0; i < l->u.loop.rows * l->u.loop.cols; i++)
        l->u.loop.dx[i] = 0.5f * l->u.loop.dy[i];
    return ST_OK;
}

static const st_layer_kind half_kind = {
    .name = "half", .build = half_build, .forward = half_forward, .backward = half_backward,
};

/* stem -> depth x group { skip; fc1 (width unit g) -> half -> fc2 (+ skip) } -> head */
static st_status declare_half_net(st_model *m)
{
    const st_model_config *c = st_model_get_config(m);
    const int64_t W = c->width, H = c->hidden;
    const int h0 = st_graph_tensor(m, W, ST_W_FULL), dh = st_graph_tensor(m, W, ST_W_FULL);
    const int dtmp = st_graph_tensor(m, W, ST_W_FULL);
    const int dz = st_graph_tensor(m, H, ST_W_WIDEST), da = st_graph_tensor(m, H, ST_W_WIDEST);
    cr_assert(st_graph_linear(m, "stem", ST_T_INPUT, h0, ST_T_NONE, dh, c->in_dim, W));
    int h = h0;
    char name[32];
    for (int g = 0; g < c->depth; g++) {
        st_graph_group_begin(m, g);
        const int a = st_graph_tensor(m, H, g), z = st_graph_tensor(m, H, g);
        const int out = st_graph_tensor(m, W, ST_W_FULL);
        cr_assert(st_graph_add(m, &st_layer_residual, "skip", h, h, dh, dtmp));
        snprintf(name, sizeof name, "block%d.fc1", g);
        st_layer *l = st_graph_linear(m, name, h, a, dtmp, da, W, H);
        l->out_unit = g;
        l = st_graph_add(m, &half_kind, "half", a, z, da, dz);
        l->in_unit = l->out_unit = g;
        snprintf(name, sizeof name, "block%d.fc2", g);
        l = st_graph_linear(m, name, z, out, dz, dh, H, W);
        l->in_unit = g;
        l->in_major = 1;
        l->residual = h;
        l->closes_group = 1;
        st_graph_group_end(m, h, out);
        h = out;
    }
    cr_assert(st_graph_linear(m, "head", h, ST_T_LOGITS, dh, ST_T_DLOGITS, W, c->n_classes));
    return ST_OK;
}

static st_model *make_half_net(const st_model_config *c, st_arena *a, uint64_t seed)
{
    st_model *m;
    cr_assert_eq(st_model_create_declared(c, declare_half_net, 8, a, &m), ST_OK, "%s",
                 st_last_error());
    st_model_init_params(m, seed);
    st_rng r = st_rng_seed(seed + 1);
    fill_rows(m, 0, 8, &r);
    return m;
}

Test(new_kind, trains_through_the_generic_graph)
{
    omp_set_num_threads(1);
    st_arena a;
    st_arena_init(&a, "half", NULL, 0);
    st_model_config c = resmlp_config(3, 16, 24, ST_ACT_GELU);
    st_model *m = make_half_net(&c, &a, 21);
    int n;
    const st_param_segment *segs = st_model_segments(m, &n);
    cr_assert_eq(n, 2 + 3 * 4 + 2, "stem, 3 groups of two linear layers, head: %d", n);
    cr_assert_str_eq(segs[2].name, "block0.fc1.weight");
    check_model_grads(m, "new kind", 22);
    st_model_destroy(m);
    st_arena_release(&a);
}

/* A group left out is the identity: the subnetwork of groups {0, 2}
 * computes what the full model computes when group 1's branch is zero. */
Test(new_kind, a_dropped_group_is_the_identity)
{
    omp_set_num_threads(1);
    st_arena a;
    st_arena_init(&a, "half", NULL, 0);
    st_model_config c = resmlp_config(3, 16, 24, ST_ACT_GELU), sc = c;
    const int held[] = { 0, 2 };
    sc.subnet.groups = held;
    sc.subnet.n_groups = 2;
    st_model *full = make_half_net(&c, &a, 31), *sub = make_half_net(&sc, &a, 31);
    cr_assert_lt(st_model_param_count(sub), st_model_param_count(full));
    cr_assert_eq(st_model_full_param_count(sub), st_model_param_count(full));
    int n;
    const st_param_segment *segs = st_model_segments(full, &n);
    for (int i = 0; i < n; i++)
        if (strncmp(segs[i].name, "block1.fc2.", 11) == 0)
            memset(st_model_params(full) + segs[i].offset, 0, segs[i].count * sizeof(float));
    float lf, ls;
    OK(st_model_forward_backward(full, &lf));
    OK(st_model_forward_backward(sub, &ls));
    cr_assert_eq(lf, ls, "full with a zero branch %.9g, subnetwork %.9g", (double)lf, (double)ls);
    cr_assert_eq(memcmp(st_model_logits(full), st_model_logits(sub), 8 * 5 * sizeof(float)), 0);
    /* and its parameters sit where the full model keeps them */
    st_range r[8];
    size_t local[8];
    int k = st_model_full_ranges(sub, r, local, 8);
    cr_assert_eq(k, 2, "stem + group 0 | group 2 + head: %d ranges", k);
    st_model_destroy(sub);
    st_model_destroy(full);
    st_arena_release(&a);
}

/* Width units declared by the new kind's neighbours: a compact subnetwork
 * of some neurons of every group trains through the new kind too. */
Test(new_kind, width_subnetwork_gradients)
{
    omp_set_num_threads(1);
    st_arena a;
    st_arena_init(&a, "half", NULL, 0);
    st_model_config c = resmlp_config(2, 16, 24, ST_ACT_GELU);
    const int count[] = { 2, 1 }, kept[] = { 0, 5, 3 };
    c.subnet.unit_size = 4;
    c.subnet.width_count = count;
    c.subnet.width_kept = kept;
    c.subnet.scale = 2.0f;
    st_model *m = make_half_net(&c, &a, 41);
    int n;
    const st_param_segment *segs = st_model_segments(m, &n);
    cr_assert_eq(segs[2].count, 8 * 16, "block0.fc1: 8 kept neurons x 16 inputs");
    check_model_grads(m, "new kind, width subnetwork", 42);
    const int bad[] = { 0, 6, 3 };   /* 24 / 4 = 6 units: id 6 is outside */
    c.subnet.width_kept = bad;
    st_model *x;
    cr_assert_eq(st_model_create_declared(&c, declare_half_net, 8, &a, &x), ST_ERR_INVALID,
                 "checked against the declared units");
    st_model_destroy(m);
    st_arena_release(&a);
}

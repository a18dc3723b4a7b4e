/*
 * tests/test_model_layout.c — the parameter layout and count, initialisation,
 * configuration checks and the FLOP count.
 *
 * The small models and the gradient check: tests/model_check.h.
 */
#include "model_check.h"

/* ------------------------------------------------------------ layout and count */

/* One expected segment: name, element count, fan-in of its linear layer
 * (0 for norm parameters). */
typedef struct seg_spec {
    char name[40];
    size_t count, fan_in;
} seg_spec;

static void spec(seg_spec *s, int *n, const char *name, size_t count, size_t fan_in)
{
    snprintf(s[*n].name, sizeof s[*n].name, "%s", name);
    s[*n].count = count;
    s[*n].fan_in = fan_in;
    (*n)++;
}

static void spec_linear(seg_spec *s, int *n, const char *prefix, size_t in, size_t out)
{
    char name[40];
    snprintf(name, sizeof name, "%s.weight", prefix);
    spec(s, n, name, in * out, in);
    snprintf(name, sizeof name, "%s.bias", prefix);
    spec(s, n, name, out, in);
}

static void spec_norm(seg_spec *s, int *n, const char *prefix, size_t c)
{
    char name[40];
    snprintf(name, sizeof name, "%s.gamma", prefix);
    spec(s, n, name, c, 0);
    snprintf(name, sizeof name, "%s.beta", prefix);
    spec(s, n, name, c, 0);
}

/* The segments a config should have, in order, written out by hand from the
 * model descriptions in model.h. */
static int expected_segments(const st_model_config *c, seg_spec *s)
{
    int n = 0;
    char name[40];
    size_t W = (size_t)c->width, H = (size_t)(c->hidden ? c->hidden : c->width);
    size_t I = (size_t)c->in_dim, K = (size_t)c->n_classes;
    if (c->kind == st_model_kind_named("mlp")) {
        for (int i = 0; i < c->depth; i++) {
            snprintf(name, sizeof name, "fc%d", i);
            spec_linear(s, &n, name, i == 0 ? I : W, W);
        }
    } else {
        spec_linear(s, &n, "stem", I, W);
        for (int l = 0; l < c->depth; l++) {
            snprintf(name, sizeof name, "block%d.ln", l);
            spec_norm(s, &n, name, W);
            snprintf(name, sizeof name, "block%d.fc1", l);
            spec_linear(s, &n, name, W, H);
            snprintf(name, sizeof name, "block%d.fc2", l);
            spec_linear(s, &n, name, H, W);
        }
        spec_norm(s, &n, "final_ln", W);
    }
    spec_linear(s, &n, "head", W, K);
    return n;
}

/* Parameter count, by the closed-form formulas:
 *   mlp:    I W + W + (L - 1)(W^2 + W) + W K + K
 *   resmlp: I W + W + L (2W + W H + H + H W + W) + 2W + W K + K */
static size_t param_formula(const st_model_config *c)
{
    size_t W = (size_t)c->width, H = (size_t)(c->hidden ? c->hidden : c->width);
    size_t I = (size_t)c->in_dim, K = (size_t)c->n_classes, L = (size_t)c->depth;
    if (c->kind == st_model_kind_named("mlp"))
        return I * W + W + (L - 1) * (W * W + W) + W * K + K;
    return I * W + W + L * (2 * W + W * H + H + H * W + W) + 2 * W + W * K + K;
}

static void check_layout(const st_model_config *c, size_t want_count)
{
    st_arena arena;
    st_arena_init(&arena, "test_model", NULL, 0);
    st_model *m = make_model(c, 8, &arena);
    st_model *m3 = make_model(c, 3, &arena);
    cr_expect_eq(st_model_param_count(m), param_formula(c), "%s: %zu parameters, formula %zu",
                 st_model_kind_name(c->kind), st_model_param_count(m), param_formula(c));
    cr_expect_eq(st_model_param_count(m), want_count, "%s: %zu parameters, by hand %zu",
                 st_model_kind_name(c->kind), st_model_param_count(m), want_count);

    seg_spec want[64];
    int nw = expected_segments(c, want), ns, ns3;
    const st_param_segment *s = st_model_segments(m, &ns);
    const st_param_segment *s3 = st_model_segments(m3, &ns3);
    cr_assert_eq(ns, nw, "%d segments, expected %d", ns, nw);
    cr_assert_eq(ns3, ns, "the layout depends on the batch");
    size_t offset = 0;
    for (int i = 0; i < ns; i++) {
        cr_expect_str_eq(s[i].name, want[i].name);
        cr_expect_eq(s[i].count, want[i].count, "%s: %zu elements, expected %zu", s[i].name,
                     s[i].count, want[i].count);
        cr_expect_eq(s[i].offset, offset, "%s at %zu, expected %zu (contiguous)", s[i].name,
                     s[i].offset, offset);
        cr_expect_eq(s[i].decay, ends_with(want[i].name, ".weight"),
                     "%s: decay %d (only weight matrices decay)", s[i].name, s[i].decay);
        cr_expect_str_eq(s3[i].name, s[i].name);
        cr_expect_eq(s3[i].offset, s[i].offset);
        cr_expect_eq(s3[i].count, s[i].count);
        offset += want[i].count;
    }
    cr_expect_eq(offset, st_model_param_count(m));
    st_model_destroy(m3);
    st_model_destroy(m);
    st_arena_release(&arena);
}

Test(layout, mlp_parameter_count_and_segments)
{
    omp_set_num_threads(1);
    st_model_config c = mlp_config(3, 20, ST_ACT_RELU);
    /* 12*20+20 + 2*(20*20+20) + 20*5+5 = 260 + 840 + 105 */
    check_layout(&c, 1205);
    st_model_config c1 = mlp_config(1, 7, ST_ACT_GELU);
    /* 12*7+7 + 7*5+5 = 91 + 40 */
    check_layout(&c1, 131);
}

Test(layout, resmlp_parameter_count_and_segments)
{
    omp_set_num_threads(1);
    st_model_config c = resmlp_config(2, 16, 24, ST_ACT_GELU);
    /* stem 12*16+16 = 208; block: ln 32 + fc1 16*24+24 = 408 + fc2 24*16+16
     * = 400, = 840, twice 1680; final_ln 32; head 16*5+5 = 85 */
    check_layout(&c, 208 + 1680 + 32 + 85);
    st_model_config c0 = resmlp_config(1, 9, 0, ST_ACT_RELU); /* hidden 0 = width */
    /* stem 12*9+9 = 117; block 18 + 90 + 90 = 198; final_ln 18; head 50 */
    check_layout(&c0, 117 + 198 + 18 + 50);
}

/* ------------------------------------------------------------ initialisation */

/* Same seed: bitwise the same vector, whatever the batch; another seed:
 * different in every linear segment; linear weights and biases within
 * +-1/sqrt(fan_in) and spread over that range; gamma 1, beta 0. */
static void check_init(const st_model_config *c)
{
    st_arena arena;
    st_arena_init(&arena, "test_model", NULL, 0);
    st_model *a = make_model(c, 8, &arena), *b = make_model(c, 3, &arena);
    size_t np = st_model_param_count(a);
    float *pa = st_model_params(a), *pb = st_model_params(b);
    st_model_init_params(a, 42);
    st_model_init_params(b, 42);
    cr_expect_eq(memcmp(pa, pb, np * sizeof *pa), 0, "%s: same seed, different parameters",
                 st_model_kind_name(c->kind));
    st_model_init_params(b, 43);

    seg_spec want[64];
    expected_segments(c, want);
    int ns;
    const st_param_segment *s = st_model_segments(a, &ns);
    for (int i = 0; i < ns; i++) {
        const float *p = pa + s[i].offset, *q = pb + s[i].offset;
        size_t n = s[i].count;
        if (want[i].fan_in == 0) {
            float v = ends_with(s[i].name, ".gamma") ? 1.0f : 0.0f;
            for (size_t j = 0; j < n; j++) {
                cr_expect_eq(p[j], v, "%s[%zu] = %g, want %g", s[i].name, j, p[j], v);
                cr_expect_eq(q[j], v);
            }
            continue;
        }
        double bound = 1.0 / sqrt((double)want[i].fan_in), maxabs = 0.0, mean = 0.0;
        size_t same = 0;
        for (size_t j = 0; j < n; j++) {
            /* float bound: 1/sqrtf(fan_in) may round up by an ulp */
            cr_expect(fabs(p[j]) <= bound * (1 + 1e-6), "%s[%zu] = %g outside +-%g", s[i].name,
                      j, p[j], bound);
            maxabs = fmax(maxabs, fabs(p[j]));
            mean += p[j];
            same += p[j] == q[j];
        }
        mean /= (double)n;
        /* Spread: with n >= 60 draws from U(-b, b), max |p| < 0.8 b has
         * probability 0.8^60 ~ 1e-6; the mean is within 4 standard errors
         * (b / sqrt(3n)) of 0. */
        if (n >= 60)
            cr_expect(maxabs >= 0.8 * bound, "%s: max |p| = %g, bound %g: not U(-b, b)",
                      s[i].name, maxabs, bound);
        cr_expect(fabs(mean) <= 4.0 * bound / sqrt(3.0 * (double)n), "%s: mean %g, bound %g",
                  s[i].name, mean, bound);
        cr_expect(same < n, "%s: seeds 42 and 43 gave the same values", s[i].name);
    }
    st_model_destroy(b);
    st_model_destroy(a);
    st_arena_release(&arena);
}

Test(init, mlp)
{
    omp_set_num_threads(1);
    st_model_config c = mlp_config(3, 20, ST_ACT_RELU);
    check_init(&c);
}

Test(init, resmlp)
{
    omp_set_num_threads(1);
    st_model_config c = resmlp_config(2, 16, 24, ST_ACT_GELU);
    check_init(&c);
}

/* ------------------------------------------------------------ config checks */

/* A bad config is refused with ST_ERR_INVALID and a message that names the
 * field; st_model_create refuses it too and returns no model. */
static void expect_rejected(st_model_config c, const char *field)
{
    st_clear_error();
    cr_expect_eq(st_model_config_check(&c), ST_ERR_INVALID, "config with bad %s accepted", field);
    const char *msg = st_last_error();
    cr_expect_neq(msg[0], '\0', "no message for a bad %s", field);
    cr_expect_not_null(strstr(msg, field), "message \"%s\" does not name %s", msg, field);

    st_arena arena;
    st_arena_init(&arena, "test_model", NULL, 0);
    /* Any non-NULL value: create must reset it to NULL on failure (it is
     * never dereferenced). */
    static char sentinel;
    st_model *m = (st_model *)(void *)&sentinel;
    st_clear_error();
    cr_expect_eq(st_model_create(&c, 8, &arena, &m), ST_ERR_INVALID);
    cr_expect_null(m);
    cr_expect_neq(st_last_error()[0], '\0');
    st_arena_release(&arena);
}

Test(config, rejects_bad_configs)
{
    omp_set_num_threads(1);
    st_model_config good = resmlp_config(2, 16, 24, ST_ACT_GELU);
    OK(st_model_config_check(&good));
    st_model_config d = st_model_config_default();
    OK(st_model_config_check(&d));

    st_model_config c = good;
    c.depth = 0;
    expect_rejected(c, "depth");
    c = good;
    c.width = 0;
    expect_rejected(c, "width");
    c = good;
    c.n_classes = 1;
    expect_rejected(c, "classes");
    c = mlp_config(2, 8, ST_ACT_RELU);
    c.depth = 0;
    expect_rejected(c, "depth");
    c = good;
    c.hidden = -1;
    expect_rejected(c, "hidden");
    c = good;
    c.in_dim = 0;
    expect_rejected(c, "input");

    /* batch outside [1, 2^20] */
    st_arena arena;
    st_arena_init(&arena, "test_model", NULL, 0);
    st_model *m = NULL;
    st_clear_error();
    cr_expect_eq(st_model_create(&good, 0, &arena, &m), ST_ERR_INVALID);
    cr_expect_null(m);
    cr_expect_neq(st_last_error()[0], '\0');
    st_arena_release(&arena);
}

/* ------------------------------------------------------------ the table of kinds */

/* Every kind's name parses back to it, and the lists a front end prints
 * (--help's, a message's "allowed: ...") are the table's names in order. */
Test(kinds, names_parse_back_and_lists_follow_the_table)
{
    const int n = st_model_kind_count();
    cr_assert_geq(n, 5);
    char all[256], want[256] = "", text[64];
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        const st_model_kind k = st_model_kind_at(i);
        st_model_kind back = (st_model_kind)-1;
        OK(st_model_kind_parse(st_model_kind_name(k), &back));
        cr_expect_eq(back, k, "%s parses to %d, not %d", st_model_kind_name(k), (int)back,
                     (int)k);
        len += (size_t)snprintf(want + len, sizeof want - len, "%s%s", i ? "|" : "",
                                st_model_kind_name(k));
    }
    cr_expect_eq(st_model_kind_list(all, sizeof all, "|", -1), strlen(want));
    cr_expect_str_eq(all, want);
    cr_expect_eq(strncmp(all, "mlp|resmlp|resnet|resnet18|gpt", 30), 0, "%s", all);
    /* clipped like snprintf, the length still the whole list's */
    char small[8];
    cr_expect_eq(st_model_kind_list(small, sizeof small, "|", -1), strlen(want));
    cr_expect_str_eq(small, "mlp|res");
    st_model_kind_list(text, sizeof text, ", ", ST_MODEL_READS_TEXT);
    cr_expect_str_eq(text, "gpt");
    st_model_kind x;
    cr_expect_eq(st_model_kind_parse("vgg", &x), ST_ERR_INVALID);
    cr_expect(strstr(st_last_error(), all) == NULL, "a message lists names with ', '");
    st_model_kind_list(all, sizeof all, ", ", -1);
    cr_expect(strstr(st_last_error(), all), "%s does not list %s", st_last_error(), all);
    cr_expect_str_eq(st_model_kind_name((st_model_kind)1000), "unknown");
    cr_expect(!st_model_kind_takes(st_model_kind_named("resnet18"), ST_MODEL_OPT_DEPTH));
    cr_expect(st_model_kind_takes(st_model_kind_named("resnet"), ST_MODEL_OPT_DEPTH));
    cr_expect(st_model_kind_takes(st_model_kind_named("gpt"),
                                  ST_MODEL_OPT_CONTEXT | ST_MODEL_OPT_HEADS));
    cr_expect(!st_model_kind_takes(st_model_kind_named("resmlp"), ST_MODEL_OPT_CONTEXT));
}

/* A front end's configuration: each kind's defaults fill what was not
 * given, its checks refuse what it does not take, and the banner says
 * what it is. */
Test(kinds, resolve_fills_defaults_and_refuses_what_a_kind_does_not_take)
{
    char words[128];
    st_model_config c = st_model_config_default();
    OK(st_model_config_resolve(&c, 0));
    st_model_config_describe(&c, words, sizeof words);
    cr_expect_str_eq(words, "resmlp depth 4 width 256 hidden 256");

    c = st_model_config_default();
    c.kind = st_model_kind_named("resnet");
    c.width = 32;
    OK(st_model_config_resolve(&c, ST_MODEL_OPT_WIDTH));
    cr_expect_eq(c.depth, 3);
    cr_expect_eq(c.width, 32, "a width given stays");
    cr_expect_eq(c.activation, ST_ACT_RELU);

    c = st_model_config_default();
    c.kind = st_model_kind_named("gpt");
    OK(st_model_config_resolve(&c, 0));
    cr_expect(c.context == 128 && c.heads == 4 && c.in_dim == 128 && c.n_classes == 256);
    OK(st_model_config_check(&c));
    st_model_config_describe(&c, words, sizeof words);
    cr_expect_str_eq(words, "gpt depth 4 width 256 heads 4 context 128 hidden 1024");
    c.heads = 3;
    cr_expect_eq(st_model_config_resolve(&c, ST_MODEL_OPT_HEADS), ST_ERR_INVALID);
    cr_expect_str_eq(st_last_error(), "--heads 3 does not divide --width 256");

    c = mlp_config(2, 8, ST_ACT_GELU);
    c.hidden = 4;
    cr_expect_eq(st_model_config_resolve(&c, ST_MODEL_OPT_HIDDEN), ST_ERR_INVALID);
    cr_expect_str_eq(st_last_error(), "--hidden applies to resmlp only (mlp layers are --width "
                                      "wide)");
    c = resmlp_config(2, 8, 0, ST_ACT_GELU);
    cr_expect_eq(st_model_config_resolve(&c, ST_MODEL_OPT_HEADS), ST_ERR_INVALID);
    cr_expect_str_eq(st_last_error(), "--heads applies to --model gpt, vit only");
    c.context = c.in_dim = 5;
    c.heads = 2;
    cr_expect_eq(st_model_config_check(&c), ST_ERR_INVALID);
    cr_expect_str_eq(st_last_error(), "a context of 5 tokens is for the gpt model");
}

/* ------------------------------------------------------------ FLOPs */

/* Matrix-multiply FLOPs of one step, 2 per multiply-add: a linear layer
 * (B, in) -> (B, out) costs 2 B in out forward, the same for dw, and the
 * same again for dx except for the first layer, whose dx nobody needs. */
static double flops_formula(const st_model_config *c, int batch)
{
    double B = batch, W = c->width, H = c->hidden ? c->hidden : c->width;
    double I = c->in_dim, K = c->n_classes, L = c->depth;
    if (c->kind == st_model_kind_named("mlp"))
        return 2 * B * (2 * I * W + 3 * (L - 1) * W * W + 3 * W * K);
    return 2 * B * (2 * I * W + L * (3 * W * H + 3 * H * W) + 3 * W * K);
}

Test(flops, match_formula)
{
    omp_set_num_threads(1);
    st_model_config cfgs[4] = { mlp_config(3, 20, ST_ACT_RELU), mlp_config(1, 7, ST_ACT_GELU),
                                resmlp_config(2, 16, 24, ST_ACT_GELU),
                                resmlp_config(1, 9, 0, ST_ACT_RELU) };
    for (int t = 0; t < 4; t++) {
        st_arena arena;
        st_arena_init(&arena, "test_model", NULL, 0);
        st_model *m = make_model(&cfgs[t], 8, &arena);
        double got = st_model_step_flops(m), want = flops_formula(&cfgs[t], 8);
        cr_expect_eq(got, want, "%s: %.0f FLOPs, formula %.0f", st_model_kind_name(cfgs[t].kind),
                     got, want);
        st_model_destroy(m);
        st_arena_release(&arena);
    }
    /* By hand, mlp d3 w20, B 8: 2*8*(2*12*20 + 3*2*400 + 3*100) = 16*3180 */
    cr_expect_eq(flops_formula(&cfgs[0], 8), 16.0 * 3180.0);
}

/* st_model_forward_backward_ready: each tail of the gradient vector it
 * says is final is final (the pass ends with the same values there as
 * when it was said), the tails only grow, the last one is the whole
 * vector, and the gradients are bitwise those of st_model_forward_backward.
 * An mlp, a resmlp, a gpt, a ResNet (convolutions, batch norms) and a
 * backward-masked neuron subnetwork (a compact gradient vector). */
typedef struct tail_seen {
    const float *grads;
    size_t n, last;
    float *snap;          /* the gradient when each element was said final */
    int calls, bad_order;
} tail_seen;

static void seen_tail(void *ctx, size_t from)
{
    tail_seen *t = ctx;
    t->calls++;
    t->bad_order += from >= t->last;
    for (size_t i = from; i < t->last && i < t->n; i++)
        t->snap[i] = t->grads[i];
    if (from < t->last)
        t->last = from;
}

Test(layout, gradients_said_final_stay_final)
{
    omp_set_num_threads(1);
    st_model_config cfgs[6] = { mlp_config(3, 16, ST_ACT_RELU),
                                resmlp_config(3, 16, 24, ST_ACT_GELU), gpt_config(2, 8, 2, 6),
                                resnet_config(st_model_kind_named("resnet"), 1, 4, 3, 8, 8),
                                neuron_config(st_model_kind_named("resmlp"), 1),
                                vit_config(2, 1, 8, 8, 4, ST_POOL_CLS) };
    for (int k = 0; k < 6; k++) {
        st_arena a[2];
        st_model *m[2];
        for (int j = 0; j < 2; j++) {
            st_arena_init(&a[j], "tails", NULL, 0);
            m[j] = make_model(&cfgs[k], 4, &a[j]);
            st_model_init_params(m[j], 3);
        }
        const size_t n = st_model_grad_count(m[0]);
        tail_seen t = { st_model_grads(m[0]), n, n, calloc(n, sizeof(float)), 0, 0 };
        float loss[2];
        for (int j = 0; j < 2; j++) {
            st_rng r = st_rng_seed(4);
            fill_rows(m[j], 0, 4, &r);
        }
        OK(st_model_forward_backward_ready(m[0], &loss[0], seen_tail, &t));
        OK(st_model_forward_backward(m[1], &loss[1]));
        cr_assert_eq(t.last, 0, "config %d: the last tail said is [%zu, %zu)", k, t.last, n);
        cr_assert_eq(t.bad_order, 0, "config %d: a tail that did not grow", k);
        cr_assert_gt(t.calls, 1, "config %d: %d call(s): nothing during the backward", k,
                     t.calls);
        size_t changed = 0;
        for (size_t i = 0; i < n; i++)
            changed += memcmp(&t.snap[i], &st_model_grads(m[0])[i], sizeof(float)) != 0;
        cr_assert_eq(changed, 0, "config %d: %zu gradient elements changed after they were "
                     "said final", k, changed);
        cr_assert_eq(memcmp(st_model_grads(m[0]), st_model_grads(m[1]), n * sizeof(float)), 0,
                     "config %d: other gradients than st_model_forward_backward's", k);
        free(t.snap);
        for (int j = 0; j < 2; j++) {
            st_model_destroy(m[j]);
            st_arena_release(&a[j]);
        }
    }
}

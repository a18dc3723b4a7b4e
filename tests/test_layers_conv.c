/*
 * tests/test_layers_conv.c — gradient checks of the convolution layer: shapes
 * and strides, layouts, bf16 products, the branch scale, bad shapes.
 *
 * The pattern every test follows, and the helpers: tests/layer_check.h.
 */
#include "layer_check.h"

/* ------------------------------------------------------------ convolution */

/* L = sum(y R) is linear in each of x, w and b, so, as for the linear
 * layer, the central difference has no truncation error and what is left is
 * float32 rounding of the outputs a perturbation reaches: at most OC KH KW
 * of them for an input, B OH OW for a weight (<= 200 here on the shapes
 * checked at every coordinate, <= 800 on the larger ones), each a sum of
 * IC KH KW <= 300 products of O(1) values rounded to ~ 1e-6, so L moves by
 * ~ 1e-5 by rounding in the worst case and ~ 1e-6 typically; / 2h = 0.02
 * that is <= 5e-4, under atol 1e-3.  rtol 1e-2 is for the large weight and
 * bias gradients (sums of B OH OW terms of R). */
static const tol TOL_CONV = { 1e-2, 1e-3, 1e-2 };

typedef struct conv_case {
    env e;
    st_conv c;
    st_conv_shape s;
    int64_t oh, ow;
    size_t nx, ny, nw;
    int bias, with_dx;
    int bf16;        /* the passes read bf16 copies of x, w and dy */
    float scale;     /* 1: none; else y = scale (conv(x) + b), gradients scaled alike */
    float *x, *y, *w, *b, *dx, *dy, *dw, *db, *R;
} conv_case;

static double conv_objective(void *arg)
{
    conv_case *c = arg;
    OK(st_conv_forward(&c->e.ctx, &c->c));
    return dot_yr(c->y, c->R, c->ny);
}

/* Buffers with random x, w (init scale 1/sqrt(fan in)), b and R, the
 * layer built (products in bf16, a branch scale), forward run, dy = R,
 * backward run. */
static void conv_setup_as(conv_case *c, const st_conv_shape *s, st_layout layout, int bias,
                          int with_dx, int bf16, float scale, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    c->s = *s;
    c->bias = bias;
    c->with_dx = with_dx;
    c->bf16 = bf16;
    c->scale = scale;
    c->oh = st_conv_out_size(s->ih, s->kh, s->stride, s->pad);
    c->ow = st_conv_out_size(s->iw, s->kw, s->stride, s->pad);
    c->nx = (size_t)(s->batch * s->ic * s->ih * s->iw);
    c->ny = (size_t)(s->batch * s->oc * c->oh * c->ow);
    c->nw = (size_t)(s->oc * s->ic * s->kh * s->kw);
    env_init(&c->e, seed);
    env *e = &c->e;
    c->x = env_floats(e, c->nx);   // x, dx are (B, IC, IH, IW)
    c->dx = env_floats(e, c->nx);
    c->y = env_floats(e, c->ny);   // y, dy, R are (B, OC, OH, OW)
    c->dy = env_floats(e, c->ny);
    c->R = env_floats(e, c->ny);
    c->w = env_floats(e, c->nw);   // w, dw are (OC, IC, KH, KW)
    c->dw = env_floats(e, c->nw);
    c->b = env_floats(e, (size_t)s->oc);  // b, db are (OC)
    c->db = env_floats(e, (size_t)s->oc);
    fill_uniform(&e->rng, c->x, c->nx, -1.0f, 1.0f);
    float bound = 1.0f / sqrtf((float)(s->ic * s->kh * s->kw));
    fill_uniform(&e->rng, c->w, c->nw, -bound, bound);
    if (bias)
        fill_uniform(&e->rng, c->b, (size_t)s->oc, -bound, bound);
    fill_uniform(&e->rng, c->R, c->ny, -1.0f, 1.0f);
    st_conv_io io = { .x = c->x, .y = c->y, .w = c->w, .b = bias ? c->b : NULL,
                      .dx = with_dx ? c->dx : NULL, .dy = c->dy, .dw = c->dw,
                      .db = bias ? c->db : NULL, .layout = layout, .bf16 = bf16,
                      .scale = scale == 1.0f ? 0.0f : scale };
    OK(st_conv_build(&e->ctx, &c->c, s, &io));
    OK(st_nn_ctx_finalize(&e->ctx));
    OK(st_conv_forward(&e->ctx, &c->c));
    memcpy(c->dy, c->R, c->ny * sizeof *c->dy);
    OK(st_conv_backward(&e->ctx, &c->c));
}

static void conv_setup(conv_case *c, const st_conv_shape *s, st_layout layout, int bias,
                       int with_dx, uint64_t seed)
{
    conv_setup_as(c, s, layout, bias, with_dx, 0, 1.0f, seed);
}

/* y, dx, dw, db in double by direct loops over every (output, input,
 * kernel tap) triple, with the magnitudes of the terms (the rounding scale).
 * With `rounded`, x, w and dy as a bf16 pass reads them (bf16_round, below):
 * db too, which oneDNN's backward-weights sums from its bf16 dy. */
typedef struct conv_ref {
    double *y, *ym, *dx, *dxm, *dw, *dwm, *db, *dbm;
} conv_ref;

static void conv_reference_of(const conv_case *c, conv_ref *r, int rounded)
{
    const st_conv_shape *s = &c->s;
    const int64_t IC = s->ic, OC = s->oc, IH = s->ih, IW = s->iw, OH = c->oh, OW = c->ow;
    r->y = dalloc(c->ny); r->ym = dalloc(c->ny);
    r->dx = dalloc(c->nx); r->dxm = dalloc(c->nx);
    r->dw = dalloc(c->nw); r->dwm = dalloc(c->nw);
    r->db = dalloc((size_t)OC); r->dbm = dalloc((size_t)OC);
    for (int64_t n = 0; n < s->batch; n++)
        for (int64_t o = 0; o < OC; o++)
            for (int64_t i = 0; i < OH; i++)
                for (int64_t j = 0; j < OW; j++) {
                    const size_t yi = (size_t)(((n * OC + o) * OH + i) * OW + j);
                    const double g = bf16_round(c->dy[yi], rounded);
                    double sum = c->bias ? c->b[o] : 0.0, mag = fabs(sum);
                    for (int64_t ci = 0; ci < IC; ci++)
                        for (int64_t p = 0; p < s->kh; p++)
                            for (int64_t q = 0; q < s->kw; q++) {
                                const int64_t h = i * s->stride - s->pad + p;
                                const int64_t wq = j * s->stride - s->pad + q;
                                if (h < 0 || h >= IH || wq < 0 || wq >= IW)
                                    continue;
                                const size_t xi = (size_t)(((n * IC + ci) * IH + h) * IW + wq);
                                const size_t wi = (size_t)(((o * IC + ci) * s->kh + p) * s->kw + q);
                                const double xv = bf16_round(c->x[xi], rounded);
                                const double wv = bf16_round(c->w[wi], rounded);
                                const double t = xv * wv;
                                sum += t;
                                mag += fabs(t);
                                r->dx[xi] += g * wv;
                                r->dxm[xi] += fabs(g * wv);
                                r->dw[wi] += g * xv;
                                r->dwm[wi] += fabs(g * xv);
                            }
                    r->y[yi] = sum;
                    r->ym[yi] = mag;
                    r->db[o] += g;
                    r->dbm[o] += fabs(g);
                }
    /* a branch scale (the bias scaled too): every result times it */
    const double k = c->scale == 0.0f ? 1.0 : c->scale;
    double *all[8] = { r->y, r->ym, r->dx, r->dxm, r->dw, r->dwm, r->db, r->dbm };
    const size_t len[8] = { c->ny, c->ny, c->nx, c->nx, c->nw, c->nw, (size_t)OC, (size_t)OC };
    for (int v = 0; v < 8 && k != 1.0; v++)
        for (size_t i = 0; i < len[v]; i++)
            all[v][i] *= v % 2 ? fabs(k) : k;   /* a magnitude: |k| */
}

static void conv_reference(const conv_case *c, conv_ref *r)
{
    conv_reference_of(c, r, c->bf16);
}

static void conv_ref_free(conv_ref *r)
{
    free(r->y); free(r->ym); free(r->dx); free(r->dxm);
    free(r->dw); free(r->dwm); free(r->db); free(r->dbm);
}

static void conv_tag(char *tag, size_t n, const conv_case *c)
{
    const st_conv_shape *s = &c->s;
    snprintf(tag, n, "%lldx%lldx%lldx%lld->%lld k%lldx%lld s%lld p%lld %s%s%s%s%s",
             (long long)s->batch, (long long)s->ic, (long long)s->ih, (long long)s->iw,
             (long long)s->oc, (long long)s->kh, (long long)s->kw, (long long)s->stride,
             (long long)s->pad, layout_name(c->c.layout), c->bias ? "" : " nobias",
             c->with_dx ? "" : " nodx", c->bf16 ? " bf16" : "",
             c->scale != 1.0f ? " scaled" : "");
}

/* Forward and backward against the double reference; then, when
 * max_coords > 0, finite differences w.r.t. x, w and b. */
static void check_conv(const st_conv_shape *s, st_layout layout, int bias, int with_dx,
                       size_t max_coords, uint64_t seed)
{
    conv_case c;
    conv_setup(&c, s, layout, bias, with_dx, seed);
    cr_expect(c.c.layout == ST_LAYOUT_PLAIN || c.c.layout == ST_LAYOUT_BLOCKED);
    if (layout != ST_LAYOUT_DEFAULT)
        cr_expect_eq(c.c.layout, layout);
    char tag[96], what[128];
    conv_tag(tag, sizeof tag, &c);
    conv_ref r;
    conv_reference(&c, &r);
    snprintf(what, sizeof what, "conv %s y", tag);
    compare_ref(what, c.y, r.y, r.ym, c.ny, REF_RTOL);
    if (with_dx) {
        snprintf(what, sizeof what, "conv %s dx", tag);
        compare_ref(what, c.dx, r.dx, r.dxm, c.nx, REF_RTOL);
    } else {
        for (size_t i = 0; i < c.nx; i++)
            cr_expect_eq(c.dx[i], 0.0f, "conv %s: dx[%zu] written without dx", tag, i);
    }
    snprintf(what, sizeof what, "conv %s dw", tag);
    compare_ref(what, c.dw, r.dw, r.dwm, c.nw, REF_RTOL);
    if (bias) {
        snprintf(what, sizeof what, "conv %s db", tag);
        compare_ref(what, c.db, r.db, r.dbm, (size_t)s->oc, REF_RTOL);
    }
    conv_ref_free(&r);
    if (max_coords > 0) {
        /* the objective does not touch the gradients: copies are taken */
        if (with_dx) {
            snprintf(what, sizeof what, "conv %s dx", tag);
            check_param(what, conv_objective, &c, c.x, c.dx, c.nx, max_coords, TOL_CONV, &c.e.rng);
        }
        snprintf(what, sizeof what, "conv %s dw", tag);
        check_param(what, conv_objective, &c, c.w, c.dw, c.nw, max_coords, TOL_CONV, &c.e.rng);
        if (bias) {
            snprintf(what, sizeof what, "conv %s db", tag);
            check_param(what, conv_objective, &c, c.b, c.db, (size_t)s->oc, max_coords,
                        TOL_CONV, &c.e.rng);
        }
    }
    env_destroy(&c.e);
}

/* shapes: { batch, ic, ih, iw, oc, kh, kw, stride, pad } */
static const st_conv_shape CONV_3X3_S1 = { 2, 3, 6, 7, 5, 3, 3, 1, 1 };
static const st_conv_shape CONV_3X3_S2 = { 2, 4, 7, 8, 6, 3, 3, 2, 1 };  /* 7x8 -> 4x4 */
static const st_conv_shape CONV_1X1_S2 = { 3, 5, 6, 5, 7, 1, 1, 2, 0 };  /* 6x5 -> 3x3 */

Test(conv, k3_s1_p1_bias_every_coordinate)
{
    omp_set_num_threads(1);
    check_conv(&CONV_3X3_S1, ST_LAYOUT_BLOCKED, 1, 1, SIZE_MAX, 61);
    check_conv(&CONV_3X3_S1, ST_LAYOUT_PLAIN, 1, 1, SIZE_MAX, 62);
}

Test(conv, k3_s2_p1_every_coordinate)
{
    omp_set_num_threads(1);
    check_conv(&CONV_3X3_S2, ST_LAYOUT_BLOCKED, 1, 1, SIZE_MAX, 63);
    check_conv(&CONV_3X3_S2, ST_LAYOUT_PLAIN, 1, 1, SIZE_MAX, 64);
}

Test(conv, k1_s2_projection_every_coordinate)
{
    omp_set_num_threads(1);
    check_conv(&CONV_1X1_S2, ST_LAYOUT_BLOCKED, 1, 1, SIZE_MAX, 65);
    check_conv(&CONV_1X1_S2, ST_LAYOUT_PLAIN, 1, 1, SIZE_MAX, 66);
}

/* Channel counts at and around oneDNN's block of 16 (its tail code), an
 * even input with stride 2 (the last row and column in no window of a 1x1
 * kernel), no padding, and the default layout; forward and backward
 * against the reference, finite differences on a random subset. */
Test(conv, larger_shapes_reference_and_random_subset)
{
    omp_set_num_threads(1);
    const st_conv_shape shapes[] = {
        { 4, 16, 10, 10, 16, 3, 3, 1, 1 },
        { 2, 17, 9, 9, 33, 3, 3, 2, 1 },
        { 2, 32, 8, 8, 64, 1, 1, 2, 0 },
        { 2, 3, 5, 6, 4, 3, 3, 1, 0 },
        { 2, 16, 8, 8, 32, 3, 3, 2, 1 },
    };
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        check_conv(&shapes[k], ST_LAYOUT_DEFAULT, 1, 1, LARGE_SUBSET, 70 + k);
        check_conv(&shapes[k], ST_LAYOUT_PLAIN, 1, 1, 0, 80 + k);
    }
}

/* A first layer (no dx: dx is left alone) and a convolution without bias
 * (ResNet's, followed by batch norm), in both layouts. */
Test(conv, without_dx_and_without_bias)
{
    omp_set_num_threads(1);
    for (int l = 0; l < 2; l++) {
        st_layout layout = l ? ST_LAYOUT_BLOCKED : ST_LAYOUT_PLAIN;
        check_conv(&CONV_3X3_S1, layout, 1, 0, SIZE_MAX, 91);
        check_conv(&CONV_3X3_S2, layout, 0, 1, SIZE_MAX, 92);
        const st_conv_shape stem = { 3, 1, 8, 8, 16, 3, 3, 1, 1 };
        check_conv(&stem, layout, 0, 0, 0, 93);
    }
}

/* The blocked path computes what the plain path computes, up to float
 * rounding (the kernels sum in different orders): |blocked - plain| <=
 * 2 REF_RTOL x the magnitude of the terms, on shapes where the blocked
 * path really reorders (checked: reorders were made). */
Test(conv, blocked_equals_plain)
{
    omp_set_num_threads(1);
    const st_conv_shape shapes[] = {
        { 4, 16, 10, 10, 16, 3, 3, 1, 1 },
        { 2, 17, 9, 9, 33, 3, 3, 2, 1 },
        { 2, 32, 8, 8, 64, 1, 1, 2, 0 },
        CONV_3X3_S2,
    };
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        conv_case p, b;
        conv_setup(&p, &shapes[k], ST_LAYOUT_PLAIN, 1, 1, 100 + k);
        conv_setup(&b, &shapes[k], ST_LAYOUT_BLOCKED, 1, 1, 100 + k);
        cr_assert_eq(st_pass_reorders(&p.c.fwd) + st_pass_reorders(&p.c.bwd_data) +
                     st_pass_reorders(&p.c.bwd_weights), 0, "the plain path reorders");
        cr_assert(b.c.fwd.n_pre > 0 && b.c.fwd.has_post && b.c.bwd_weights.has_post,
                  "shape %zu: the blocked path made no reorders: nothing is compared", k);
        char tag[96], what[128];
        conv_tag(tag, sizeof tag, &p);
        conv_ref r;
        conv_reference(&p, &r);   /* for the magnitudes */
        snprintf(what, sizeof what, "conv blocked vs %s y", tag);
        compare_floats(what, b.y, p.y, r.ym, p.ny, 2 * REF_RTOL);
        snprintf(what, sizeof what, "conv blocked vs %s dx", tag);
        compare_floats(what, b.dx, p.dx, r.dxm, p.nx, 2 * REF_RTOL);
        snprintf(what, sizeof what, "conv blocked vs %s dw", tag);
        compare_floats(what, b.dw, p.dw, r.dwm, p.nw, 2 * REF_RTOL);
        snprintf(what, sizeof what, "conv blocked vs %s db", tag);
        compare_floats(what, b.db, p.db, r.dbm, (size_t)p.s.oc, 2 * REF_RTOL);
        conv_ref_free(&r);
        env_destroy(&p.e);
        env_destroy(&b.e);
    }
}

/* The data type of the memory a primitive reads or writes as `arg`, and
 * that memory object. */
static dnnl_data_type_t arg_type(const st_prim *p, int arg, dnnl_memory_t *mem)
{
    for (int i = 0; i < p->nargs; i++)
        if (p->args[i].arg == arg) {
            const dnnl_memory_desc_t *md;
            cr_assert_eq(dnnl_memory_get_memory_desc(p->args[i].memory, &md), dnnl_success);
            if (mem)
                *mem = p->args[i].memory;
            return md->data_type;
        }
    cr_assert_fail("%s: argument %d not bound", p->what, arg);
    return dnnl_data_type_undef;
}

/* The largest |got - unrounded| / (REF_RTOL mag): how far the fp32
 * results lie outside the tolerance the bf16 ones are held to. */
static double off_fp32(const float *got, const double *ref32, const double *mag, size_t n)
{
    double worst = 0.0;
    for (size_t i = 0; i < n; i++)
        worst = fmax(worst, fabs((double)got[i] - ref32[i]) / (REF_RTOL * mag[i] + 1e-30));
    return worst;
}

/* bf16: the three passes read x, w and dy rounded to bf16 (a product of
 * two bf16 values is exact in fp32, the sums are fp32), so against a
 * reference of rounded operands the tolerance stays fp32's; db is summed
 * by backward-weights from its bf16 dy.  Checked besides: the primitives
 * were created with bf16 operands and f32 results (oneDNN 2.6 takes
 * f32 dst, diff_src, diff_weights and diff_bias with bf16 inputs), the
 * rounding happened (the unrounded reference is far outside the
 * tolerance), and the backward reads x only through the forward's bf16
 * copy: x is overwritten with NaN between forward and backward (a model
 * reuses the buffer of a forward-only tensor, graph.c's assign_forward_only). */
static void check_conv_bf16(const st_conv_shape *s, st_layout layout, int bias, int with_dx,
                            float scale, uint64_t seed)
{
    conv_case c;
    conv_setup_as(&c, s, layout, bias, with_dx, 1, scale, seed);
    char tag[96], what[128];
    conv_tag(tag, sizeof tag, &c);
    const st_conv *v = &c.c;
    dnnl_memory_t x_fwd, x_bwd;
    cr_expect_eq(arg_type(&v->fwd.prim, DNNL_ARG_SRC, &x_fwd), dnnl_bf16, "%s fwd src", tag);
    cr_expect_eq(arg_type(&v->fwd.prim, DNNL_ARG_WEIGHTS, NULL), dnnl_bf16, "%s fwd wei", tag);
    cr_expect_eq(arg_type(&v->fwd.prim, DNNL_ARG_DST, NULL), dnnl_f32, "%s fwd dst", tag);
    if (bias)
        cr_expect_eq(arg_type(&v->fwd.prim, DNNL_ARG_BIAS, NULL), dnnl_f32, "%s bias", tag);
    if (with_dx) {
        cr_expect_eq(arg_type(&v->bwd_data.prim, DNNL_ARG_DIFF_DST, NULL), dnnl_bf16,
                     "%s bwd-data diff_dst", tag);
        cr_expect_eq(arg_type(&v->bwd_data.prim, DNNL_ARG_WEIGHTS, NULL), dnnl_bf16,
                     "%s bwd-data wei", tag);
        cr_expect_eq(arg_type(&v->bwd_data.prim, DNNL_ARG_DIFF_SRC, NULL), dnnl_f32,
                     "%s bwd-data diff_src", tag);
    }
    cr_expect_eq(arg_type(&v->bwd_weights.prim, DNNL_ARG_SRC, &x_bwd), dnnl_bf16,
                 "%s bwd-weights src", tag);
    cr_expect(x_bwd == x_fwd, "%s: backward-weights does not read the forward's bf16 x", tag);
    cr_expect_eq(arg_type(&v->bwd_weights.prim, DNNL_ARG_DIFF_DST, NULL), dnnl_bf16,
                 "%s bwd-weights diff_dst", tag);
    cr_expect_eq(arg_type(&v->bwd_weights.prim, DNNL_ARG_DIFF_WEIGHTS, NULL), dnnl_f32,
                 "%s bwd-weights diff_weights", tag);
    if (bias)
        cr_expect_eq(arg_type(&v->bwd_weights.prim, DNNL_ARG_DIFF_BIAS, NULL), dnnl_f32,
                     "%s bwd-weights diff_bias", tag);

    /* again, x poisoned once the forward has run */
    float *keep = malloc(c.nx * sizeof *keep);
    cr_assert(keep);
    memcpy(keep, c.x, c.nx * sizeof *keep);
    OK(st_conv_forward(&c.e.ctx, v));
    for (size_t i = 0; i < c.nx; i++)
        c.x[i] = NAN;
    OK(st_conv_backward(&c.e.ctx, v));
    memcpy(c.x, keep, c.nx * sizeof *keep);
    free(keep);

    conv_ref r, r32;
    conv_reference(&c, &r);
    conv_reference_of(&c, &r32, 0);
    snprintf(what, sizeof what, "conv %s y", tag);
    compare_ref(what, c.y, r.y, r.ym, c.ny, REF_RTOL);
    double off = off_fp32(c.y, r32.y, r.ym, c.ny);
    if (with_dx) {
        snprintf(what, sizeof what, "conv %s dx", tag);
        compare_ref(what, c.dx, r.dx, r.dxm, c.nx, REF_RTOL);
        off = fmin(off, off_fp32(c.dx, r32.dx, r.dxm, c.nx));
    }
    snprintf(what, sizeof what, "conv %s dw", tag);
    compare_ref(what, c.dw, r.dw, r.dwm, c.nw, REF_RTOL);
    off = fmin(off, off_fp32(c.dw, r32.dw, r.dwm, c.nw));
    if (bias) {
        snprintf(what, sizeof what, "conv %s db", tag);
        compare_ref(what, c.db, r.db, r.dbm, (size_t)s->oc, REF_RTOL);
    }
    /* every result is off fp32's by 10x the tolerance somewhere */
    fprintf(stderr, "[bf16] conv %s: the unrounded reference is off by >= %.0f tolerances\n",
            tag, off);
    cr_expect_gt(off, 10.0, "conv %s: bf16 results within %.3g tolerances of fp32: not "
                 "rounded?", tag, off);
    conv_ref_free(&r);
    conv_ref_free(&r32);
    env_destroy(&c.e);
}

/* Every stride, padding, kernel and channel count the fp32 tests take
 * (oneDNN's bf16 kernels block channels by 16 and pairs of 2: tails on
 * both), both layouts, with and without bias, dx and a branch scale. */
Test(conv, bf16_products_of_rounded_operands)
{
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 kernels on this CPU");
    omp_set_num_threads(1);
    const st_conv_shape stem = { 3, 1, 8, 8, 16, 3, 3, 1, 1 };
    const st_conv_shape shapes[] = {
        CONV_3X3_S1, CONV_3X3_S2, CONV_1X1_S2,
        { 2, 3, 5, 6, 4, 3, 3, 1, 0 },
        { 4, 16, 10, 10, 16, 3, 3, 1, 1 },
        { 2, 17, 9, 9, 33, 3, 3, 2, 1 },
        { 2, 32, 8, 8, 64, 1, 1, 2, 0 },
        { 2, 16, 8, 8, 32, 3, 3, 2, 1 },
    };
    for (int l = 0; l < 2; l++) {
        const st_layout layout = l ? ST_LAYOUT_BLOCKED : ST_LAYOUT_PLAIN;
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
            check_conv_bf16(&shapes[k], layout, k % 2 == 0, 1, 1.0f, 200 + k);
        check_conv_bf16(&stem, layout, 0, 0, 1.0f, 210);
        check_conv_bf16(&CONV_3X3_S2, layout, 1, 1, 2.0f, 211);
        check_conv_bf16(&shapes[5], layout, 1, 1, 0.5f, 212);
    }
}

/* Sizes and FLOPs: 2 per multiply-add, B OC OH OW IC KH KW per pass; the
 * passes a layer has (no dx: two). */
/* The branch scale of a convolution: y = s (conv(x) + b) with dx, dw, db
 * scaled, or with an unscaled bias y = s conv(x) + b and db the plain
 * sum; both layouts, against the same convolution unscaled (scaling by 2
 * is exact, so only the order of the bias addition may round). */
Test(conv, branch_scale_with_scaled_and_unscaled_bias)
{
    omp_set_num_threads(1);
    env e;
    env_init(&e, 171);
    const st_conv_shape s = { 2, 3, 5, 5, 4, 3, 3, 1, 1 };
    const size_t nx = 2 * 3 * 5 * 5, ny = 2 * 4 * 5 * 5, nw = 4 * 3 * 9, hw = 25;
    float *x = env_floats(&e, nx), *dy = env_floats(&e, ny), *w = env_floats(&e, nw);
    float *b = env_floats(&e, 4);
    fill_uniform(&e.rng, x, nx, -1, 1);
    fill_uniform(&e.rng, dy, ny, -1, 1);
    fill_uniform(&e.rng, w, nw, -0.3f, 0.3f);
    fill_uniform(&e.rng, b, 4, -1, 1);
    float *out[3][4];   /* plain, scaled bias, unscaled bias: y, dx, dw, db */
    st_conv c[3][2];
    for (int k = 0; k < 3; k++)
        for (int layout = 0; layout < 2; layout++) {
            float *y = env_floats(&e, ny), *dx = env_floats(&e, nx);
            float *dw = env_floats(&e, nw), *db = env_floats(&e, 4);
            st_conv_io io = { .x = x, .y = y, .w = w, .b = b, .dx = dx, .dy = dy, .dw = dw,
                              .db = db, .scale = k ? 2.0f : 0.0f, .unscaled_bias = k == 2,
                              .layout = layout ? ST_LAYOUT_BLOCKED : ST_LAYOUT_PLAIN };
            OK(st_conv_build(&e.ctx, &c[k][layout], &s, &io));
            if (layout == 0) {
                out[k][0] = y;
                out[k][1] = dx;
                out[k][2] = dw;
                out[k][3] = db;
            }
        }
    OK(st_nn_ctx_finalize(&e.ctx));
    for (int layout = 0; layout < 2; layout++) {
        for (int k = 0; k < 3; k++) {
            OK(st_conv_forward(&e.ctx, &c[k][layout]));
            OK(st_conv_backward(&e.ctx, &c[k][layout]));
        }
        double worst = 0.0;
        const size_t n[4] = { ny, nx, nw, 4 };
        for (int k = 1; k < 3; k++)
            for (int t = 0; t < 4; t++)
                for (size_t i = 0; i < n[t]; i++) {
                    double plain = out[0][t][i], want = 2.0 * plain;
                    if (k == 2 && t == 0)   /* 2 (conv + b) - b */
                        want -= b[(i / hw) % 4];
                    if (k == 2 && t == 3)
                        want = plain;
                    double d = fabs(out[k][t][i] - want) / (1.0 + fabs(want));
                    worst = d > worst ? d : worst;
                }
        fprintf(stderr, "[scale] conv x2 (%s), scaled and unscaled bias: max rel diff %.3g\n",
                layout ? "blocked" : "plain", worst);
        cr_expect_lt(worst, 1e-6, "scaled convolution (%s layout): %g",
                     layout ? "blocked" : "plain", worst);
        /* the blocked run writes its own buffers: compare it next round */
        for (int k = 0; k < 3 && layout == 0; k++) {
            out[k][0] = c[k][1].y;
            out[k][1] = c[k][1].dx;
            out[k][2] = c[k][1].dw;
            out[k][3] = c[k][1].db;
        }
    }
    cr_expect_eq(c[1][0].scale_loop + c[1][1].scale_loop + c[2][0].scale_loop +
                 c[2][1].scale_loop, 0,
                 "the scale is a post-op of both layouts' forward");
    env_destroy(&e);
}

/* NCHW <-> NHWC of n samples of c channels over hw positions. */
static void to_nhwc(float *out, const float *in, int64_t n, int64_t c, int64_t hw)
{
    for (int64_t s = 0; s < n; s++)
        for (int64_t o = 0; o < c; o++)
            for (int64_t i = 0; i < hw; i++)
                out[(s * hw + i) * c + o] = in[(s * c + o) * hw + i];
}

/* Channels-last tensors (a model's layout where AMX's bf16 convolutions
 * take it): with a branch scale and an unscaled bias, which a loop of the
 * layer's own adds in the output's layout, y and dx are the plain
 * layout's transposed, dw and db the plain layout's. */
Test(conv, channels_last_with_an_unscaled_bias)
{
    omp_set_num_threads(1);
    env e;
    env_init(&e, 173);
    const st_conv_shape s = { 2, 16, 5, 5, 32, 3, 3, 1, 1 };
    const int64_t hw = 25;
    const size_t nx = 2 * 16 * 25, ny = 2 * 32 * 25, nw = 32 * 16 * 9;
    float *x = env_floats(&e, nx), *dy = env_floats(&e, ny), *w = env_floats(&e, nw);
    float *b = env_floats(&e, 32), *xt = env_floats(&e, nx), *dyt = env_floats(&e, ny);
    fill_uniform(&e.rng, x, nx, -1, 1);
    fill_uniform(&e.rng, dy, ny, -1, 1);
    fill_uniform(&e.rng, w, nw, -0.3f, 0.3f);
    fill_uniform(&e.rng, b, 32, -1, 1);
    to_nhwc(xt, x, 2, 16, hw);
    to_nhwc(dyt, dy, 2, 32, hw);
    st_conv c[2];
    float *y[2], *dx[2], *dw[2], *db[2];
    for (int k = 0; k < 2; k++) {
        y[k] = env_floats(&e, ny);
        dx[k] = env_floats(&e, nx);
        dw[k] = env_floats(&e, nw);
        db[k] = env_floats(&e, 32);
        st_conv_io io = { .x = k ? xt : x, .y = y[k], .w = w, .b = b, .dx = dx[k],
                          .dy = k ? dyt : dy, .dw = dw[k], .db = db[k], .scale = 2.0f,
                          .unscaled_bias = 1, .layout = ST_LAYOUT_BLOCKED,
                          .x_tag = k ? dnnl_nhwc : 0, .y_tag = k ? dnnl_nhwc : 0 };
        OK(st_conv_build(&e.ctx, &c[k], &s, &io));
    }
    OK(st_nn_ctx_finalize(&e.ctx));
    for (int k = 0; k < 2; k++) {
        OK(st_conv_forward(&e.ctx, &c[k]));
        OK(st_conv_backward(&e.ctx, &c[k]));
    }
    float *want_y = env_floats(&e, ny), *want_dx = env_floats(&e, nx);
    to_nhwc(want_y, y[0], 2, 32, hw);
    to_nhwc(want_dx, dx[0], 2, 16, hw);
    const float *got[4] = { y[1], dx[1], dw[1], db[1] };
    const float *want[4] = { want_y, want_dx, dw[0], db[0] };
    const size_t n[4] = { ny, nx, nw, 32 };
    const char *name[4] = { "y", "dx", "dw", "db" };
    for (int t = 0; t < 4; t++) {
        double worst = 0.0;
        for (size_t i = 0; i < n[t]; i++)
            worst = fmax(worst, fabs(got[t][i] - want[t][i]) / (1.0 + fabs(want[t][i])));
        cr_expect_lt(worst, 1e-5, "channels last %s: max rel diff %g", name[t], worst);
    }
    env_destroy(&e);
}

Test(conv, flops_and_reference_timing)
{
    omp_set_num_threads(1);
    const st_conv_shape s = { 4, 6, 9, 8, 5, 3, 3, 2, 1 }; /* -> 5x4 */
    cr_expect_eq(st_conv_out_size(9, 3, 2, 1), 5);
    cr_expect_eq(st_conv_out_size(8, 3, 2, 1), 4);
    cr_expect_eq(st_conv_out_size(8, 1, 2, 0), 4);
    const double one = 2.0 * 4 * 5 * 5 * 4 * 6 * 3 * 3;
    cr_expect_eq(st_conv_pass_flops(&s), one);
    for (int with_dx = 0; with_dx < 2; with_dx++) {
        conv_case c;
        conv_setup(&c, &s, ST_LAYOUT_DEFAULT, 1, with_dx, 111);
        cr_expect_eq(c.c.oh, 5);
        cr_expect_eq(c.c.ow, 4);
        cr_expect_eq(st_conv_flops(&c.c), (with_dx ? 3.0 : 2.0) * one);
        env_destroy(&c.e);
    }
    /* The standalone timing runs (its numbers are not asserted). */
    st_conv_rates r;
    OK(st_conv_reference_gflops(&s, ST_LAYOUT_DEFAULT, 2, &r));
    cr_expect(r.layout == ST_LAYOUT_PLAIN || r.layout == ST_LAYOUT_BLOCKED);
    cr_expect(r.fwd > 0 && r.bwd_data > 0 && r.bwd_weights > 0 && r.layer_fwd > 0 &&
              r.layer_bwd > 0 && r.layer_ms > 0);
}

Test(conv, rejects_bad_shapes)
{
    omp_set_num_threads(1);
    env e;
    env_init(&e, 112);
    float *buf = env_floats(&e, 4096);
    st_conv c;
    st_conv_io io = { .x = buf, .y = buf, .w = buf };
    const st_conv_shape bad[] = {
        { 0, 3, 8, 8, 4, 3, 3, 1, 1 },  /* no batch */
        { 2, 3, 8, 8, 4, 3, 3, 0, 1 },  /* stride 0 */
        { 2, 3, 8, 8, 4, 3, 3, 1, 3 },  /* padding >= kernel */
        { 2, 3, 1, 1, 4, 5, 5, 1, 1 },  /* kernel larger than the padded input */
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        st_clear_error();
        cr_expect_eq(st_conv_build(&e.ctx, &c, &bad[k], &io), ST_ERR_INVALID, "shape %zu", k);
        cr_expect_neq(st_last_error()[0], '\0');
    }
    io.dw = buf; /* dw without dy */
    cr_expect_eq(st_conv_build(&e.ctx, &c, &CONV_3X3_S1, &io), ST_ERR_INVALID);
    env_destroy(&e);
}

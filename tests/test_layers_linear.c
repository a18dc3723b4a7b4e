/*
 * tests/test_layers_linear.c — gradient checks of the linear layer (its storage
 * variants, unfused bias and skip, bf16 products) and of the add of two
 * tensors.
 *
 * The pattern every test follows, and the helpers: tests/layer_check.h.
 */
#include "layer_check.h"

/* ------------------------------------------------------------ linear */

/* One linear layer and its objective. */
typedef struct linear_case {
    env e;
    st_linear l;
    int64_t B, in, out;
    float *x, *y, *w, *b, *dx, *dy, *dw, *db, *R;
} linear_case;

static double linear_objective(void *arg)
{
    linear_case *c = arg;
    OK(st_linear_forward(&c->e.ctx, &c->l));
    return dot_yr(c->y, c->R, (size_t)(c->B * c->out));
}

/* got (M x N) against the double product bias[n] + sum_k a[m, k] b[k, n]
 * (bias NULL: none), the operands read through their strides (a
 * transposed one swaps them); an entry's magnitude sums its terms'. */
static void check_product(const char *what, const float *got, const float *bias, int64_t M,
                          int64_t N, int64_t K, const float *a, int64_t am, int64_t ak,
                          const float *b, int64_t bk, int64_t bn)
{
    double *ref = dalloc((size_t)(M * N)), *mag = dalloc((size_t)(M * N));
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = bias ? bias[n] : 0.0, sm = bias ? fabs(bias[n]) : 0.0;
            for (int64_t k = 0; k < K; k++) {
                double t = (double)a[m * am + k * ak] * b[k * bk + n * bn];
                s += t;
                sm += fabs(t);
            }
            ref[m * N + n] = s;
            mag[m * N + n] = sm;
        }
    compare_ref(what, got, ref, mag, (size_t)(M * N), REF_RTOL);
    free(ref);
    free(mag);
}

/* y (B, out) = x (B, in) w^T + b against a double matmul; dx = dy w,
 * dw = dy^T x, db = sum_b dy against double too. */
static void linear_reference(const linear_case *c, const char *tag)
{
    const int64_t B = c->B, I = c->in, O = c->out;
    char what[64];
    snprintf(what, sizeof what, "linear %s y", tag);
    check_product(what, c->y, c->b, B, O, I, c->x, I, 1, c->w, 1, I);
    snprintf(what, sizeof what, "linear %s dx", tag);
    check_product(what, c->dx, NULL, B, I, O, c->dy, O, 1, c->w, I, 1);
    snprintf(what, sizeof what, "linear %s dw", tag);
    check_product(what, c->dw, NULL, O, I, B, c->dy, 1, O, c->x, I, 1);

    double *ref = dalloc((size_t)O), *mag = dalloc((size_t)O);
    for (int64_t o = 0; o < O; o++)
        for (int64_t b = 0; b < B; b++) {
            ref[o] += c->dy[b * O + o];
            mag[o] += fabs(c->dy[b * O + o]);
        }
    snprintf(what, sizeof what, "linear %s db", tag);
    compare_ref(what, c->db, ref, mag, (size_t)O, REF_RTOL);
    free(ref);
    free(mag);
}

/* Builds, runs and checks a linear layer of the given shape; every
 * coordinate of dx, dw, db is checked up to max_coords each. */
static void check_linear(int64_t B, int64_t in, int64_t out, size_t max_coords, uint64_t seed)
{
    linear_case c = { .B = B, .in = in, .out = out };
    env_init(&c.e, seed);
    env *e = &c.e;
    c.x = env_floats(e, (size_t)(B * in));   // x is (B, in)
    c.y = env_floats(e, (size_t)(B * out));  // y is (B, out)
    c.w = env_floats(e, (size_t)(out * in)); // w is (out, in)
    c.b = env_floats(e, (size_t)out);
    c.dx = env_floats(e, (size_t)(B * in));
    c.dy = env_floats(e, (size_t)(B * out));
    c.dw = env_floats(e, (size_t)(out * in));
    c.db = env_floats(e, (size_t)out);
    c.R = env_floats(e, (size_t)(B * out));
    fill_uniform(&e->rng, c.x, (size_t)(B * in), -1.0f, 1.0f);
    /* Weights at the model's init scale, U(-1/sqrt(in), 1/sqrt(in)), so that
     * y stays O(1) at every shape. */
    float bound = 1.0f / sqrtf((float)in);
    fill_uniform(&e->rng, c.w, (size_t)(out * in), -bound, bound);
    fill_uniform(&e->rng, c.b, (size_t)out, -bound, bound);
    fill_uniform(&e->rng, c.R, (size_t)(B * out), -1.0f, 1.0f);

    st_linear_io io = { .x = c.x, .y = c.y, .dx = c.dx, .dy = c.dy,
                        .w = c.w, .b = c.b, .dw = c.dw, .db = c.db };
    OK(st_linear_build(&e->ctx, &c.l, B, in, out, &io));
    OK(st_nn_ctx_finalize(&e->ctx));
    OK(st_linear_forward(&e->ctx, &c.l));
    memcpy(c.dy, c.R, (size_t)(B * out) * sizeof *c.dy); /* dL/dy = R */
    OK(st_linear_backward(&e->ctx, &c.l));

    char tag[32], what[64];
    snprintf(tag, sizeof tag, "%lldx%lld->%lld", (long long)B, (long long)in, (long long)out);
    linear_reference(&c, tag);

    snprintf(what, sizeof what, "linear %s dx", tag);
    check_param(what, linear_objective, &c, c.x, c.dx, (size_t)(B * in), max_coords, TOL_LINEAR, &e->rng);
    snprintf(what, sizeof what, "linear %s dw", tag);
    check_param(what, linear_objective, &c, c.w, c.dw, (size_t)(out * in), max_coords, TOL_LINEAR, &e->rng);
    snprintf(what, sizeof what, "linear %s db", tag);
    check_param(what, linear_objective, &c, c.b, c.db, (size_t)out, max_coords, TOL_LINEAR, &e->rng);
    env_destroy(e);
}

Test(linear, small_shapes_every_coordinate)
{
    omp_set_num_threads(1);
    check_linear(4, 5, 3, SIZE_MAX, 11);
    check_linear(7, 13, 11, SIZE_MAX, 12);
    check_linear(8, 17, 9, SIZE_MAX, 13);
}

Test(linear, large_shape_random_subset)
{
    omp_set_num_threads(1);
    check_linear(64, 256, 128, LARGE_SUBSET, 14);
}

/* The first layer of a model has no dx (nobody needs it): backward must
 * still produce dw and db, and must not write a dx it was not given. */
Test(linear, without_dx)
{
    omp_set_num_threads(1);
    env e;
    env_init(&e, 15);
    const int64_t B = 6, I = 7, O = 5;
    float *x = env_floats(&e, B * I), *y = env_floats(&e, B * O);
    float *w = env_floats(&e, O * I), *b = env_floats(&e, O);
    float *dy = env_floats(&e, B * O), *dw = env_floats(&e, O * I), *db = env_floats(&e, O);
    fill_uniform(&e.rng, x, B * I, -1, 1);
    fill_uniform(&e.rng, w, O * I, -1, 1);
    fill_uniform(&e.rng, dy, B * O, -1, 1);
    st_linear l;
    st_linear_io io = { .x = x, .y = y, .dx = NULL, .dy = dy, .w = w, .b = b, .dw = dw, .db = db };
    OK(st_linear_build(&e.ctx, &l, B, I, O, &io));
    OK(st_nn_ctx_finalize(&e.ctx));
    cr_expect_eq(l.has_dx, 0);
    OK(st_linear_forward(&e.ctx, &l));
    OK(st_linear_backward(&e.ctx, &l));
    for (int64_t o = 0; o < O; o++) {
        double s = 0;
        for (int64_t r = 0; r < B; r++)
            s += dy[r * O + o];
        cr_expect(fabs(db[o] - s) <= 1e-5 * (1 + fabs(s)), "db[%lld] = %g, want %g",
                  (long long)o, db[o], s);
        for (int64_t i = 0; i < I; i++) {
            double t = 0;
            for (int64_t r = 0; r < B; r++)
                t += (double)dy[r * O + o] * x[r * I + i];
            cr_expect(fabs(dw[o * I + i] - t) <= 1e-5 * (1 + fabs(t)));
        }
    }
    env_destroy(&e);
}

/* The variants the subnetworks use, against a direct double reference:
 * weights stored (in, out) (in_major), a scale with the bias scaled too
 * (a dropped block) or not (dropped neurons), a fused residual, and weight
 * gradients for some runs of rows only (backward masking). */

/* bf16: the three products read w, x and dy rounded to bf16 (products of
 * two bf16 values are exact in fp32, and the sums are fp32); the bias, its
 * gradient (a sum of the fp32 dy), the residual and the scale are fp32.
 * The reference rounds its operands alike, so the tolerance stays fp32's,
 * and it also checks that the rounding happened: the largest difference
 * from the unrounded products is far above it. */
static void check_linear_variant_grads(int in_major, int unscaled_bias, int runs, int bf16,
                                       int half_grads)
{
    env e;
    env_init(&e, 31 + (uint64_t)(4 * in_major + 2 * unscaled_bias + runs));
    const int64_t B = 5, I = 8, O = 6, R = in_major ? I : O, C = in_major ? O : I;
    const float scale = 2.5f;
    float *x = env_floats(&e, B * I), *y = env_floats(&e, B * O), *res = env_floats(&e, B * O);
    float *w = env_floats(&e, O * I), *b = env_floats(&e, O), *dx = env_floats(&e, B * I);
    float *dy = env_floats(&e, B * O), *dw = env_floats(&e, O * I), *db = env_floats(&e, O);
    fill_uniform(&e.rng, x, B * I, -1, 1);
    fill_uniform(&e.rng, w, O * I, -1, 1);
    fill_uniform(&e.rng, b, O, -1, 1);
    fill_uniform(&e.rng, res, B * O, -1, 1);
    fill_uniform(&e.rng, dy, B * O, -1, 1);
    /* storage rows kept for gradients: {1, 2} and {4} (or all) */
    const st_row_run kept[2] = { { 1, 2 }, { 4, 1 } };
    st_linear l;
    st_linear_io io = { .x = x, .y = y, .residual = res, .scale = scale, .dx = dx, .dy = dy,
                        .w = w, .b = b, .dw = dw, .db = db, .in_major = in_major,
                        .unscaled_bias = unscaled_bias, .dw_runs = runs ? kept : NULL,
                        .n_dw_runs = runs ? 2 : 0, .bf16 = bf16 };
    /* bf16 gradient tensors: dy given rounded, dx written rounded (the sums
     * below then read dy rounded, the bias gradient too) */
    st_bf16 *dyb = NULL, *dxb = NULL;
    if (half_grads) {
        dyb = (st_bf16 *)env_floats(&e, (B * O + 1) / 2);
        dxb = (st_bf16 *)env_floats(&e, (B * I + 1) / 2);
        for (int64_t i = 0; i < B * O; i++) {
            dyb[i] = st_bf16_from_float(dy[i]);
            dy[i] = st_bf16_to_float(dyb[i]);
        }
        io.dyb = dyb;
        io.dxb = dxb;
    }
    OK(st_linear_build(&e.ctx, &l, B, I, O, &io));
    cr_assert_eq(l.dy_half && l.dx_half, half_grads, "the layer took %s gradients",
                 half_grads ? "fp32" : "bf16");
    OK(st_nn_ctx_finalize(&e.ctx));
    OK(st_linear_forward(&e.ctx, &l));
    if (half_grads)   /* what the layer must not read: the fp32 dy */
        for (int64_t i = 0; i < B * O; i++)
            dy[i] = NAN;
    OK(st_linear_backward(&e.ctx, &l));
    if (half_grads)
        for (int64_t i = 0; i < B * O; i++)
            dy[i] = st_bf16_to_float(dyb[i]);
    const double dx_rtol = half_grads ? 1.0 / 256 : 0.0;   /* dx rounded once */
#define W(o, i) ((double)bf16_round(w[in_major ? (i) * O + (o) : (o) * I + (i)], bf16))
#define X(r, i) ((double)bf16_round(x[(r) * I + (i)], bf16))
#define DY(r, o) ((double)bf16_round(dy[(r) * O + (o)], bf16))
    const double bs = unscaled_bias ? 1.0 : scale;
    double off = 0;   /* largest |y - the unrounded product| */
    for (int64_t r = 0; r < B; r++)
        for (int64_t o = 0; o < O; o++) {
            double t = 0, t32 = 0;
            for (int64_t i = 0; i < I; i++) {
                t += X(r, i) * W(o, i);
                t32 += (double)x[r * I + i] * w[in_major ? i * O + o : o * I + i];
            }
            double want = res[r * O + o] + scale * t + bs * b[o];
            cr_expect(fabs(y[r * O + o] - want) <= 1e-5 * (1 + fabs(want)), "y[%lld,%lld] = %g, "
                      "want %g", (long long)r, (long long)o, y[r * O + o], want);
            off = fmax(off, fabs(y[r * O + o] - (res[r * O + o] + scale * t32 + bs * b[o])));
        }
    if (bf16)
        cr_expect(off > 1e-3, "bf16 products differ from fp32 by %g only: not rounded?", off);
    for (int64_t r = 0; r < B; r++)
        for (int64_t i = 0; i < I; i++) {
            double t = 0;
            for (int64_t o = 0; o < O; o++)
                t += DY(r, o) * W(o, i);
            const double got = half_grads ? st_bf16_to_float(dxb[r * I + i]) : dx[r * I + i];
            cr_expect(fabs(got - scale * t) <= dx_rtol * fabs(scale * t) + 1e-5 * (1 + fabs(t)),
                      "dx[%lld,%lld] = %g, want %g", (long long)r, (long long)i, got, scale * t);
        }
#undef W
    /* dw: the kept storage rows, back to back */
    int64_t row = 0;
    for (int64_t sr = 0; sr < R; sr++) {
        if (runs && !(sr == 1 || sr == 2 || sr == 4))
            continue;
        for (int64_t sc = 0; sc < C; sc++) {
            int64_t o = in_major ? sc : sr, i = in_major ? sr : sc;
            double t = 0;
            for (int64_t r = 0; r < B; r++)
                t += DY(r, o) * X(r, i);
            cr_expect(fabs(dw[row * C + sc] - scale * t) <= 1e-5 * (1 + fabs(t)),
                      "dw row %lld (storage row %lld), col %lld", (long long)row, (long long)sr,
                      (long long)sc);
        }
        row++;
    }
#undef X
#undef DY
    /* db: the kept rows' biases (out-major), or every bias (in-major) */
    int64_t k = 0;
    for (int64_t o = 0; o < O; o++) {
        if (runs && !in_major && !(o == 1 || o == 2 || o == 4))
            continue;
        double t = 0;
        for (int64_t r = 0; r < B; r++)
            t += dy[r * O + o];
        cr_expect(fabs(db[k] - bs * t) <= 1e-5 * (1 + fabs(t)), "db[%lld]", (long long)o);
        k++;
    }
    env_destroy(&e);
}

static void check_linear_variant(int in_major, int unscaled_bias, int runs, int bf16)
{
    check_linear_variant_grads(in_major, unscaled_bias, runs, bf16, 0);
}

Test(linear, storage_scale_bias_and_row_runs)
{
    omp_set_num_threads(1);
    for (int in_major = 0; in_major < 2; in_major++)
        for (int unscaled = 0; unscaled < 2; unscaled++)
            for (int runs = 0; runs < 2; runs++)
                check_linear_variant(in_major, unscaled, runs, 0);
}

/* The fusions turned off one at a time (bench_step --unfuse measures
 * them): the bias and the skip added by passes of their own give what the
 * fused matmul gives, in either weight storage and precision; a layer with
 * a branch scale keeps its fusions. */
Test(linear, unfused_bias_and_skip_match_the_fused_layer)
{
    omp_set_num_threads(1);
    const int bf16_ok = st_bf16_probe(NULL) != ST_BF16_UNAVAILABLE;
    for (int bf16 = 0; bf16 <= bf16_ok; bf16++)
        for (int in_major = 0; in_major < 2; in_major++)
            for (unsigned unfuse = 1; unfuse <= 3; unfuse++) {
                env e;
                env_init(&e, 77 + unfuse);
                const int64_t B = 9, I = 33, O = 17;
                float *x = env_floats(&e, B * I), *res = env_floats(&e, B * O);
                float *w = env_floats(&e, O * I), *b = env_floats(&e, O);
                float *y[2] = { env_floats(&e, B * O), env_floats(&e, B * O) };
                fill_uniform(&e.rng, x, B * I, -1, 1);
                fill_uniform(&e.rng, w, O * I, -1, 1);
                fill_uniform(&e.rng, b, O, -1, 1);
                fill_uniform(&e.rng, res, B * O, -1, 1);
                st_linear l[2];
                for (int k = 0; k < 2; k++) {
                    st_linear_io io = { .x = x, .y = y[k], .residual = res, .w = w, .b = b,
                                        .in_major = in_major, .bf16 = bf16,
                                        .unfuse = k ? unfuse : 0 };
                    OK(st_linear_build(&e.ctx, &l[k], B, I, O, &io));
                }
                cr_expect_eq(l[1].unfused_bias, (unfuse & ST_UNFUSE_BIAS) != 0);
                cr_expect_eq(l[1].unfused_residual, (unfuse & ST_UNFUSE_RESIDUAL) != 0);
                OK(st_nn_ctx_finalize(&e.ctx));
                for (int k = 0; k < 2; k++)
                    OK(st_linear_forward(&e.ctx, &l[k]));
                for (int64_t i = 0; i < B * O; i++)
                    cr_expect(fabsf(y[1][i] - y[0][i]) <= 1e-6f * (1 + fabsf(y[0][i])),
                              "bf16 %d in_major %d unfuse %u: y[%lld] = %g, fused %g", bf16,
                              in_major, unfuse, (long long)i, y[1][i], y[0][i]);
                st_linear scaled;
                st_linear_io io = { .x = x, .y = y[1], .residual = res, .scale = 0.5f, .w = w,
                                    .b = b, .unfuse = unfuse };
                OK(st_linear_build(&e.ctx, &scaled, B, I, O, &io));
                cr_expect(!scaled.unfused_bias && !scaled.unfused_residual);
                env_destroy(&e);
            }
}

/* The same variants with bf16 products, on any CPU whose oneDNN has bf16
 * kernels (native or emulated: the arithmetic is the same). */
Test(linear, bf16_products_of_rounded_operands)
{
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 matmul on this CPU");
    omp_set_num_threads(1);
    for (int v = 0; v < 8; v++)   /* in_major, unscaled bias, row runs */
        check_linear_variant(v >> 2, (v >> 1) & 1, v & 1, 1);
}

/* The same with the data gradients as bf16 tensors (--activation-precision
 * bf16): dy read where it lies, never its fp32 values (NaN here), the
 * bias gradient its sum, dx written rounded once. */
Test(linear, bf16_gradient_tensors)
{
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 matmul on this CPU");
    omp_set_num_threads(1);
    for (int v = 0; v < 8; v++)
        check_linear_variant_grads(v >> 2, (v >> 1) & 1, v & 1, 1, 1);
}

/* ------------------------------------------------------------ add */

/* out = a + b, and the in-place form out == a (the backward's gradient
 * accumulation).  Float addition is correctly rounded, so oneDNN must match
 * the C sum bitwise. */
static void check_add(int64_t rows, int64_t cols, uint64_t seed)
{
    env e;
    env_init(&e, seed);
    size_t n = (size_t)(rows * cols);
    float *a = env_floats(&e, n), *b = env_floats(&e, n), *out = env_floats(&e, n);
    float *acc = env_floats(&e, n), *a0 = env_floats(&e, n);
    fill_uniform(&e.rng, a, n, -1, 1);
    fill_uniform(&e.rng, b, n, -1, 1);
    memcpy(acc, a, n * sizeof *acc);
    memcpy(a0, a, n * sizeof *a0);
    st_add r, racc;
    OK(st_add_build(&e.ctx, &r, rows, cols, a, b, out));
    OK(st_add_build(&e.ctx, &racc, rows, cols, acc, b, acc)); /* acc += b */
    OK(st_nn_ctx_finalize(&e.ctx));

    OK(st_add_run(&e.ctx, &r));
    for (size_t i = 0; i < n; i++)
        cr_expect_eq(out[i], a[i] + b[i], "add %lldx%lld out[%zu] = %.9g, want %.9g",
                     (long long)rows, (long long)cols, i, out[i], a[i] + b[i]);
    for (size_t i = 0; i < n; i++)
        cr_expect_eq(a[i], a0[i], "add wrote its input a[%zu]", i);

    /* In place, twice: acc = (a + b) + b, each step rounded like C's. */
    OK(st_add_run(&e.ctx, &racc));
    OK(st_add_run(&e.ctx, &racc));
    for (size_t i = 0; i < n; i++) {
        float want = (a0[i] + b[i]) + b[i];
        cr_expect_eq(acc[i], want, "in-place add %lldx%lld acc[%zu] = %.9g, want %.9g",
                     (long long)rows, (long long)cols, i, acc[i], want);
    }
    fprintf(stderr, "[add] %lldx%lld out-of-place and in-place: checked bitwise\n",
            (long long)rows, (long long)cols);
    env_destroy(&e);
}

Test(add, out_of_place_and_in_place)
{
    omp_set_num_threads(1);
    check_add(5, 13, 41);
    check_add(3, 1, 42);
    check_add(64, 256, 43);
}

/*
 * tests/test_layers_cnn.c — the pooling layers (max, global average), the
 * CNN layers sharing one context, and the CNN layers' hot path.
 *
 * The pattern every test follows, and the helpers: tests/layer_check.h.
 */
#define _GNU_SOURCE /* RTLD_NEXT, for heapwatch.h */
#include "layer_check.h"

/* ------------------------------------------------------------ pooling */

/* Max pooling: L = sum(y R) is piecewise linear in x.  The inputs are a
 * random permutation of distinct values 0.05 apart, so a perturbation of
 * h = 1e-2 never changes which input is a window's maximum: the central
 * difference is exact up to the rounding of L (y is x, exactly).  Global
 * average pooling is linear.  Same bounds as linear layers. */
static const tol TOL_POOL = { 1e-2, 1e-3, 1e-2 };

/* Global average pooling, x ~ U(-1, 1): dx = dy / (H W) is small (0.02 at
 * 7 x 7), so atol is 1e-4, still ~ 10x what rounding leaves: a
 * perturbation moves one output, a mean of H W values rounded to ~ 6e-8,
 * ~ 3e-6 after / 2h. */
static const tol TOL_GAP = { 1e-2, 1e-4, 1e-2 };

typedef struct pool_case {
    env e;
    st_pool p;
    int64_t B, C, H, W, k, stride, pad; /* k = 0: global average */
    size_t nx, ny;
    float *x, *y, *dx, *dy, *R;
} pool_case;

static double pool_objective(void *arg)
{
    pool_case *c = arg;
    OK(st_pool_forward(&c->e.ctx, &c->p));
    return dot_yr(c->y, c->R, c->ny);
}

static void pool_setup(pool_case *c, int64_t B, int64_t C, int64_t H, int64_t W, int64_t k,
                       int64_t stride, int64_t pad, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    c->B = B; c->C = C; c->H = H; c->W = W; c->k = k; c->stride = stride; c->pad = pad;
    env_init(&c->e, seed);
    env *e = &c->e;
    int64_t oh = k ? (H + 2 * pad - k) / stride + 1 : 1;
    int64_t ow = k ? (W + 2 * pad - k) / stride + 1 : 1;
    c->nx = (size_t)(B * C * H * W);
    c->ny = (size_t)(B * C * oh * ow);
    c->x = env_floats(e, c->nx);   // x, dx are (B, C, H, W)
    c->dx = env_floats(e, c->nx);
    c->y = env_floats(e, c->ny);   // y, dy, R are (B, C, OH, OW) or (B, C)
    c->dy = env_floats(e, c->ny);
    c->R = env_floats(e, c->ny);
    if (k) {
        uint32_t *perm = malloc(c->nx * sizeof *perm);
        cr_assert(perm);
        for (size_t i = 0; i < c->nx; i++)
            perm[i] = (uint32_t)i;
        st_rng_shuffle_u32(&e->rng, perm, c->nx);
        for (size_t i = 0; i < c->nx; i++)  /* distinct, 0.05 apart, around 0 */
            c->x[i] = 0.05f * ((float)perm[i] - 0.5f * (float)c->nx);
        free(perm);
    } else {
        fill_uniform(&e->rng, c->x, c->nx, -1.0f, 1.0f);
    }
    fill_uniform(&e->rng, c->R, c->ny, -1.0f, 1.0f);
    st_pool_io io = { .x = c->x, .y = c->y, .dx = c->dx, .dy = c->dy };
    if (k)
        OK(st_maxpool_build(&e->ctx, &c->p, B, C, H, W, k, stride, pad, &io));
    else
        OK(st_global_avgpool_build(&e->ctx, &c->p, B, C, H, W, &io));
    OK(st_nn_ctx_finalize(&e->ctx));
    cr_assert_eq(c->p.oh, oh);
    cr_assert_eq(c->p.ow, ow);
    OK(st_pool_forward(&e->ctx, &c->p));
    memcpy(c->dy, c->R, c->ny * sizeof *c->dy);
    OK(st_pool_backward(&e->ctx, &c->p));
}

/* Max pooling against direct loops: y is the window's maximum over real
 * inputs (exact), dx gets each window's dy at its maximum (a sum where
 * windows overlap). */
static void check_maxpool(int64_t B, int64_t C, int64_t H, int64_t W, int64_t k, int64_t stride,
                          int64_t pad, uint64_t seed)
{
    pool_case c;
    pool_setup(&c, B, C, H, W, k, stride, pad, seed);
    const int64_t OH = c.p.oh, OW = c.p.ow;
    double *dx = dalloc(c.nx), *dxm = dalloc(c.nx);
    for (int64_t n = 0; n < B * C; n++)
        for (int64_t i = 0; i < OH; i++)
            for (int64_t j = 0; j < OW; j++) {
                float best = -INFINITY;
                size_t at = 0;
                for (int64_t p = 0; p < k; p++)
                    for (int64_t q = 0; q < k; q++) {
                        int64_t h = i * stride - pad + p, w = j * stride - pad + q;
                        if (h < 0 || h >= H || w < 0 || w >= W)
                            continue;
                        size_t xi = (size_t)((n * H + h) * W + w);
                        if (c.x[xi] > best) {
                            best = c.x[xi];
                            at = xi;
                        }
                    }
                size_t yi = (size_t)((n * OH + i) * OW + j);
                cr_expect_eq(c.y[yi], best, "max pool y[%zu] = %g, want %g", yi, c.y[yi], best);
                dx[at] += c.dy[yi];
                dxm[at] += fabs(c.dy[yi]);
            }
    for (size_t i = 0; i < c.nx; i++)
        dxm[i] += 1e-30;
    char tag[64], what[96];
    snprintf(tag, sizeof tag, "%lldx%lldx%lldx%lld k%lld s%lld p%lld", (long long)B,
             (long long)C, (long long)H, (long long)W, (long long)k, (long long)stride,
             (long long)pad);
    fprintf(stderr, "[ref] max pool %s y: checked exactly\n", tag);
    snprintf(what, sizeof what, "max pool %s dx", tag);
    compare_ref(what, c.dx, dx, dxm, c.nx, REF_RTOL);
    free(dx);
    free(dxm);
    check_param(what, pool_objective, &c, c.x, c.dx, c.nx, SIZE_MAX, TOL_POOL, &c.e.rng);
    env_destroy(&c.e);
}

Test(pool, max_3x3_s2_p1)
{
    omp_set_num_threads(1);
    check_maxpool(2, 3, 7, 7, 3, 2, 1, 121);   /* 7x7 -> 4x4 */
    check_maxpool(2, 3, 8, 6, 3, 2, 1, 122);   /* 8x6 -> 4x3: the last row in one window */
    check_maxpool(2, 17, 9, 9, 3, 2, 1, 123);  /* a channel tail past 16 */
}

Test(pool, max_2x2_s2)
{
    omp_set_num_threads(1);
    check_maxpool(2, 3, 6, 6, 2, 2, 0, 124);   /* 6x6 -> 3x3 */
    check_maxpool(3, 2, 7, 5, 2, 2, 0, 125);   /* 7x5 -> 3x2: the last row and column in none */
}

/* Global average: y[n, c] = mean over the plane, dx = dy[n, c] / (H W). */
static void check_global_avgpool(int64_t B, int64_t C, int64_t H, int64_t W, uint64_t seed)
{
    pool_case c;
    pool_setup(&c, B, C, H, W, 0, 1, 0, seed);
    double *y = dalloc(c.ny), *ym = dalloc(c.ny), *dx = dalloc(c.nx), *dxm = dalloc(c.nx);
    const int64_t P = H * W;
    for (int64_t n = 0; n < B * C; n++) {
        for (int64_t i = 0; i < P; i++) {
            y[n] += c.x[n * P + i] / (double)P;
            ym[n] += fabs(c.x[n * P + i]) / (double)P;
            dx[n * P + i] = c.dy[n] / (double)P;
            dxm[n * P + i] = fabs(c.dy[n]) / (double)P;
        }
    }
    char tag[64], what[96];
    snprintf(tag, sizeof tag, "%lldx%lldx%lldx%lld", (long long)B, (long long)C, (long long)H,
             (long long)W);
    snprintf(what, sizeof what, "global avg pool %s y", tag);
    compare_ref(what, c.y, y, ym, c.ny, REF_RTOL);
    snprintf(what, sizeof what, "global avg pool %s dx", tag);
    compare_ref(what, c.dx, dx, dxm, c.nx, REF_RTOL);
    check_param(what, pool_objective, &c, c.x, c.dx, c.nx, LARGE_SUBSET, TOL_GAP, &c.e.rng);
    free(y); free(ym); free(dx); free(dxm);
    env_destroy(&c.e);
}

Test(pool, global_average)
{
    omp_set_num_threads(1);
    check_global_avgpool(3, 5, 4, 6, 131);
    check_global_avgpool(2, 16, 7, 7, 132);
    check_global_avgpool(4, 3, 1, 1, 133);
}

/* Forward only (no dx): no workspace kept for a backward, and the
 * backward does nothing. */
Test(pool, forward_only)
{
    omp_set_num_threads(1);
    env e;
    env_init(&e, 134);
    float *x = env_floats(&e, 2 * 3 * 6 * 6), *y = env_floats(&e, 2 * 3 * 3 * 3);
    fill_uniform(&e.rng, x, 2 * 3 * 6 * 6, -1, 1);
    st_pool p;
    st_pool_io io = { .x = x, .y = y };
    OK(st_maxpool_build(&e.ctx, &p, 2, 3, 6, 6, 2, 2, 0, &io));
    OK(st_nn_ctx_finalize(&e.ctx));
    OK(st_pool_forward(&e.ctx, &p));
    OK(st_pool_backward(&e.ctx, &p));
    for (int64_t n = 0; n < 6; n++)
        for (int64_t i = 0; i < 3; i++)
            for (int64_t j = 0; j < 3; j++) {
                const float *w = x + n * 36 + 2 * i * 6 + 2 * j;
                float m = fmaxf(fmaxf(w[0], w[1]), fmaxf(w[6], w[7]));
                cr_expect_eq(y[n * 9 + i * 3 + j], m);
            }
    st_clear_error();
    cr_expect_eq(st_maxpool_build(&e.ctx, &p, 2, 3, 6, 6, 2, 2, 2, &io), ST_ERR_INVALID,
                 "padding above half the kernel is refused");
    env_destroy(&e);
}

/* ------------------------------------------------------------ layers sharing a context */

/* A conv -> batch norm -> conv chain built in one context shares the
 * context's buffers for blocked copies that live within a pass (st_view's
 * slots); run forward through the chain and backward through it reversed,
 * every output must be bitwise what the same layer computes alone, in a
 * context of its own, from the same inputs (single-threaded oneDNN is
 * deterministic). */
typedef struct chain_bufs {
    float *x0, *y1, *y2, *y3, *dx0, *dy1, *dy2, *dy3;
    float *w1, *b1, *dw1, *db1, *w3, *dw3;
    float *gamma, *beta, *mean, *var, *rm, *rv, *dgamma, *dbeta;
} chain_bufs;

Test(cnn_layers, layers_sharing_a_context_equal_layers_alone)
{
    omp_set_num_threads(1);
    /* conv3 (s2 -> 5x5) has the largest blocked copies, built last: the
     * shared buffers must grow to them */
    const int64_t B = 3, C0 = 5, C1 = 16, C3 = 64, H = 9;
    const st_conv_shape s1 = { B, C0, H, H, C1, 3, 3, 1, 1 };
    const st_conv_shape s3 = { B, C1, H, H, C3, 3, 3, 2, 1 };
    const size_t n0 = (size_t)(B * C0 * H * H), n1 = (size_t)(B * C1 * H * H);
    const size_t n3 = (size_t)(B * C3 * 5 * 5), nw1 = (size_t)(C1 * C0 * 9);
    const size_t nw3 = (size_t)(C3 * C1 * 9);
    env e;
    env_init(&e, 171);
    chain_bufs c;
    float **all[] = { &c.x0, &c.y1, &c.y2, &c.y3, &c.dx0, &c.dy1, &c.dy2, &c.dy3, &c.w1,
                      &c.b1, &c.dw1, &c.db1, &c.w3, &c.dw3, &c.gamma, &c.beta, &c.mean,
                      &c.var, &c.rm, &c.rv, &c.dgamma, &c.dbeta };
    const size_t size[] = { n0, n1, n1, n3, n0, n1, n1, n3, nw1, (size_t)C1, nw1, (size_t)C1,
                            nw3, nw3, 16, 16, 16, 16, 16, 16, 16, 16 };
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
        *all[k] = env_floats(&e, size[k]);
    fill_uniform(&e.rng, c.x0, n0, -1, 1);
    fill_uniform(&e.rng, c.dy3, n3, -1, 1);
    fill_uniform(&e.rng, c.w1, nw1, -0.3f, 0.3f);
    fill_uniform(&e.rng, c.b1, (size_t)C1, -0.3f, 0.3f);
    fill_uniform(&e.rng, c.w3, nw3, -0.1f, 0.1f);
    fill_uniform(&e.rng, c.gamma, 16, 0.5f, 1.5f);
    fill_uniform(&e.rng, c.beta, 16, -0.5f, 0.5f);
    fill_uniform(&e.rng, c.rv, 16, 0.5f, 1.5f);

    st_conv conv1, conv3;
    st_batchnorm bn;
    st_conv_io io1 = { .x = c.x0, .y = c.y1, .w = c.w1, .b = c.b1, .dx = c.dx0, .dy = c.dy1,
                       .dw = c.dw1, .db = c.db1, .layout = ST_LAYOUT_BLOCKED };
    st_batchnorm_io bio = { .x = c.y1, .y = c.y2, .gamma = c.gamma, .beta = c.beta,
                            .mean = c.mean, .var = c.var, .running_mean = c.rm,
                            .running_var = c.rv, .dx = c.dy1, .dy = c.dy2, .dgamma = c.dgamma,
                            .dbeta = c.dbeta, .fuse_relu = 1, .layout = ST_LAYOUT_BLOCKED };
    st_conv_io io3 = { .x = c.y2, .y = c.y3, .w = c.w3, .dx = c.dy2, .dy = c.dy3, .dw = c.dw3,
                       .layout = ST_LAYOUT_BLOCKED };
    OK(st_conv_build(&e.ctx, &conv1, &s1, &io1));
    OK(st_batchnorm_build(&e.ctx, &bn, B, C1, H, H, &bio));
    OK(st_conv_build(&e.ctx, &conv3, &s3, &io3));
    OK(st_nn_ctx_finalize(&e.ctx));
    cr_assert(e.ctx.slot_bytes[ST_SLOT_OUT] > 0 && e.ctx.slot_bytes[ST_SLOT_IN] > 0,
              "the chain shares no slot: nothing is tested");
    /* every copy fits its slot, and has it as its buffer */
    for (int i = 0; i < e.ctx.n_slot_mems; i++) {
        const dnnl_memory_desc_t *md;
        void *h;
        const int k = e.ctx.slot_mems[i].slot;
        cr_assert_eq(dnnl_memory_get_memory_desc(e.ctx.slot_mems[i].mem, &md), dnnl_success);
        cr_assert_eq(dnnl_memory_get_data_handle(e.ctx.slot_mems[i].mem, &h), dnnl_success);
        cr_expect(dnnl_memory_desc_get_size(md) <= e.ctx.slot_have[k],
                  "copy %d (%zu bytes) does not fit slot %d (%zu bytes)", i,
                  dnnl_memory_desc_get_size(md), k, e.ctx.slot_have[k]);
        cr_expect(h == e.ctx.slot[k] && h != NULL, "copy %d is not in slot %d", i, k);
    }
    OK(st_conv_forward(&e.ctx, &conv1));
    OK(st_batchnorm_forward(&e.ctx, &bn, 1));
    OK(st_conv_forward(&e.ctx, &conv3));
    OK(st_conv_backward(&e.ctx, &conv3));
    OK(st_batchnorm_backward(&e.ctx, &bn));
    OK(st_conv_backward(&e.ctx, &conv1));

    /* Each layer alone, from copies of its inputs in the chain. */
    for (int layer = 0; layer < 3; layer++) {
        env a;
        env_init(&a, 172);
        chain_bufs d;
        for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) {
            float **dk = (float **)((char *)&d + ((char *)all[k] - (char *)&c));
            *dk = env_floats(&a, size[k]);
            memcpy(*dk, *all[k], size[k] * sizeof(float));
        }
        /* the alone layer's outputs start from garbage, not the chain's */
        float *outs[3][4] = { { d.y1, d.dx0, d.dw1, d.db1 }, { d.y2, d.dy1, d.dgamma, d.dbeta },
                              { d.y3, d.dy2, d.dw3, NULL } };
        const size_t on[3][4] = { { n1, n0, nw1, (size_t)C1 }, { n1, n1, 16, 16 },
                                  { n3, n1, nw3, 0 } };
        for (int k = 0; k < 4; k++)
            for (size_t i = 0; i < on[layer][k]; i++)
                outs[layer][k][i] = 7.0f;
        st_conv one;
        st_batchnorm bone;
        if (layer == 1) {   /* (its running statistics are not compared) */
            st_batchnorm_io b2 = bio;
            b2.x = d.y1; b2.y = d.y2; b2.gamma = d.gamma; b2.beta = d.beta; b2.mean = d.mean;
            b2.var = d.var; b2.running_mean = d.rm; b2.running_var = d.rv; b2.dx = d.dy1;
            b2.dy = d.dy2; b2.dgamma = d.dgamma; b2.dbeta = d.dbeta;
            OK(st_batchnorm_build(&a.ctx, &bone, B, C1, H, H, &b2));
        } else if (layer == 0) {
            st_conv_io i1 = { .x = d.x0, .y = d.y1, .w = d.w1, .b = d.b1, .dx = d.dx0,
                              .dy = d.dy1, .dw = d.dw1, .db = d.db1, .layout = ST_LAYOUT_BLOCKED };
            OK(st_conv_build(&a.ctx, &one, &s1, &i1));
        } else {
            st_conv_io i3 = { .x = d.y2, .y = d.y3, .w = d.w3, .dx = d.dy2, .dy = d.dy3,
                              .dw = d.dw3, .layout = ST_LAYOUT_BLOCKED };
            OK(st_conv_build(&a.ctx, &one, &s3, &i3));
        }
        OK(st_nn_ctx_finalize(&a.ctx));
        if (layer == 1) {
            OK(st_batchnorm_forward(&a.ctx, &bone, 1));
            OK(st_batchnorm_backward(&a.ctx, &bone));
        } else {
            OK(st_conv_forward(&a.ctx, &one));
            OK(st_conv_backward(&a.ctx, &one));
        }
        const float *chain[3][4] = { { c.y1, c.dx0, c.dw1, c.db1 },
                                     { c.y2, c.dy1, c.dgamma, c.dbeta },
                                     { c.y3, c.dy2, c.dw3, NULL } };
        static const char *names[3][4] = { { "conv1 y", "conv1 dx", "conv1 dw", "conv1 db" },
                                           { "bn y", "bn dx", "bn dgamma", "bn dbeta" },
                                           { "conv2 y", "conv2 dx", "conv2 dw", "" } };
        for (int k = 0; k < 4; k++) {
            if (!on[layer][k])
                continue;
            size_t bad = 0;
            for (size_t i = 0; i < on[layer][k]; i++)
                bad += memcmp(&chain[layer][k][i], &outs[layer][k][i], sizeof(float)) != 0;
            cr_expect_eq(bad, 0, "%s: %zu of %zu entries differ from the layer alone",
                         names[layer][k], bad, on[layer][k]);
            fprintf(stderr, "[chain] %-10s in a shared context vs alone: %zu of %zu differ\n",
                    names[layer][k], bad, on[layer][k]);
        }
        env_destroy(&a);
    }
    env_destroy(&e);
}

/* ------------------------------------------------------------ hot path */

/* Counts heap calls on the armed thread (heapwatch.h interposes the malloc
 * family for the whole test program and forwards to the C library's);
 * calls made while oneDNN executes a primitive are counted apart: its C API
 * builds an argument map per execution, outside subtrain's control. */
#define HEAPWATCH_PER_THREAD
#include "heapwatch.h"

/* Every CNN layer, every pass, both layouts (convolutions in bf16 too,
 * where oneDNN has bf16 kernels): once built, a forward or
 * backward is primitive executions (and batch norm's running update) and
 * no heap call of subtrain's.  No Criterion call while armed (its
 * assertions may allocate). */
Test(cnn_layers, forward_and_backward_make_no_heap_call)
{
    HEAPWATCH_SKIP_IF_OFF();
    omp_set_num_threads(1);
    env e;
    env_init(&e, 161);
    const int64_t B = 4, C = 16, H = 8, W = 8;
    const size_t n = (size_t)(B * C * H * W);
    float *x = env_floats(&e, n), *y = env_floats(&e, n), *y2 = env_floats(&e, n);
    float *dx = env_floats(&e, n), *dy = env_floats(&e, n), *w = env_floats(&e, 16 * 16 * 9);
    float *b = env_floats(&e, 16), *dw = env_floats(&e, 16 * 16 * 9), *db = env_floats(&e, 16);
    float *pooled = env_floats(&e, n / 4), *dpooled = env_floats(&e, n / 4);
    float *g = env_floats(&e, (size_t)(B * C)), *dg = env_floats(&e, (size_t)(B * C));
    float *gamma = env_floats(&e, 16), *beta = env_floats(&e, 16), *mean = env_floats(&e, 16);
    float *var = env_floats(&e, 16), *rm = env_floats(&e, 16), *rv = env_floats(&e, 16);
    float *dgamma = env_floats(&e, 16), *dbeta = env_floats(&e, 16);
    fill_uniform(&e.rng, x, n, -1, 1);
    fill_uniform(&e.rng, dy, n, -1, 1);
    fill_uniform(&e.rng, w, 16 * 16 * 9, -0.1f, 0.1f);
    fill_uniform(&e.rng, gamma, 16, 0.5f, 1.5f);
    fill_uniform(&e.rng, rv, 16, 0.5f, 1.5f);
    fill_uniform(&e.rng, dpooled, n / 4, -1, 1);
    fill_uniform(&e.rng, dg, (size_t)(B * C), -1, 1);

    const st_conv_shape s = { B, C, H, W, C, 3, 3, 1, 1 };
    st_conv cb, cp, cfirst, cb16, cp16;
    st_conv_io io = { .x = x, .y = y, .w = w, .b = b, .dx = dx, .dy = dy, .dw = dw, .db = db,
                      .layout = ST_LAYOUT_BLOCKED };
    OK(st_conv_build(&e.ctx, &cb, &s, &io));
    io.layout = ST_LAYOUT_PLAIN;
    OK(st_conv_build(&e.ctx, &cp, &s, &io));
    /* bf16: the conversions are reorders made here too */
    const int bf16 = st_bf16_probe(NULL) != ST_BF16_UNAVAILABLE;
    io.bf16 = 1;
    if (bf16)
        OK(st_conv_build(&e.ctx, &cp16, &s, &io));
    io.layout = ST_LAYOUT_BLOCKED;
    if (bf16)
        OK(st_conv_build(&e.ctx, &cb16, &s, &io));
    io.bf16 = 0;
    io.layout = ST_LAYOUT_DEFAULT;
    io.dx = NULL;
    io.b = io.db = NULL;
    OK(st_conv_build(&e.ctx, &cfirst, &s, &io));
    st_pool mp, gap;
    st_pool_io pio = { .x = x, .y = pooled, .dx = dx, .dy = dpooled };
    OK(st_maxpool_build(&e.ctx, &mp, B, C, H, W, 3, 2, 1, &pio));
    st_pool_io gio = { .x = x, .y = g, .dx = dx, .dy = dg };
    OK(st_global_avgpool_build(&e.ctx, &gap, B, C, H, W, &gio));
    st_batchnorm bn, bnr, bnp;
    st_batchnorm_io bio = { .x = x, .y = y2, .gamma = gamma, .beta = beta, .mean = mean,
                            .var = var, .running_mean = rm, .running_var = rv, .dx = dx,
                            .dy = dy, .dgamma = dgamma, .dbeta = dbeta };
    OK(st_batchnorm_build(&e.ctx, &bn, B, C, H, W, &bio));
    bio.fuse_relu = 1;
    OK(st_batchnorm_build(&e.ctx, &bnr, B, C, H, W, &bio));
    bio.layout = ST_LAYOUT_PLAIN;
    OK(st_batchnorm_build(&e.ctx, &bnp, B, C, H, W, &bio));
    OK(st_nn_ctx_finalize(&e.ctx));

    st_status st = ST_OK;
    for (int round = 0; round < 4; round++) {
        armed = round >= 1; /* the first round lets oneDNN set up its per-thread state */
        const st_conv *convs[5] = { &cb, &cp, &cfirst, &cb16, &cp16 };
        for (int k = 0; k < (bf16 ? 5 : 3) && st == ST_OK; k++) {
            st = st_conv_forward(&e.ctx, convs[k]);
            if (st == ST_OK)
                st = st_conv_backward(&e.ctx, convs[k]);
        }
        const st_pool *pools[2] = { &mp, &gap };
        for (int k = 0; k < 2 && st == ST_OK; k++) {
            st = st_pool_forward(&e.ctx, pools[k]);
            if (st == ST_OK)
                st = st_pool_backward(&e.ctx, pools[k]);
        }
        const st_batchnorm *bns[3] = { &bn, &bnr, &bnp };
        for (int k = 0; k < 3 && st == ST_OK; k++) {
            st = st_batchnorm_forward(&e.ctx, bns[k], 1);
            if (st == ST_OK)
                st = st_batchnorm_backward(&e.ctx, bns[k]);
            if (st == ST_OK)
                st = st_batchnorm_forward(&e.ctx, bns[k], 0);
        }
        armed = 0;
    }
    cr_assert_eq(st, ST_OK, "%s", st_last_error());
    cr_assert_gt(executes, 0, "the interposer saw the primitives run");
    cr_expect_eq(own_calls, 0, "3 rounds of every CNN layer: subtrain called the heap %ld times",
                 own_calls);
    cr_log_info("oneDNN: %ld heap calls in %ld primitive executions", dnnl_calls, executes);
    cr_expect_leq(dnnl_calls, executes * (ST_PRIM_MAX_ARGS + 2),
                  "oneDNN allocated more than its argument maps explain");
    fprintf(stderr, "[heap] CNN layers, 3 rounds: subtrain %ld heap calls; oneDNN %ld in %ld "
            "executions\n", own_calls, dnnl_calls, executes);
    env_destroy(&e);
}

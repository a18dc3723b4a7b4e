/*
 * tests/test_layers_batchnorm.c — gradient checks of the batch norm layer: training,
 * the fused ReLU, inference and the running statistics, layouts.
 *
 * The pattern every test follows, and the helpers: tests/layer_check.h.
 */
#include "layer_check.h"

/* ------------------------------------------------------------ batch norm */

/* Batch norm (training): smooth, like layer norm, with the statistics over
 * a channel's N = B H W values instead of a row's C.  Truncation is
 * O(h^2 gamma / sigma^3) with sigma >= 0.3 by construction, <= 1e-4 at
 * h = 1e-2.  Rounding dominates: a perturbation of x moves all N outputs of
 * its channel, and the float mean and variance (offsets up to 2) shift
 * them coherently by ~ 1e-7, so L moves by ~ 1e-7 |sum of the channel's R|
 * ~ 1e-7 sqrt(N); / 2h that is ~ 1e-4 at N = 392, and the worst of 200
 * coordinates measured 5.3e-4 there (<= 1.7e-4 at N <= 150).  atol 2e-3
 * keeps a 4x margin; gradients are O(0.1 .. 20), so a 10% error is still
 * 5x or more above the bound (the teeth check proves it). */
static const tol TOL_BATCHNORM = { 1e-2, 2e-3, 1e-2 };

typedef struct bn_case {
    env e;
    st_batchnorm bn;
    int64_t B, C, H, W;
    int fuse;
    st_layout layout;
    size_t n;
    float *x, *y, *gamma, *beta, *mean, *var, *rmean, *rvar, *dx, *dy, *dgamma, *dbeta, *R;
} bn_case;

static double bn_objective(void *arg)
{
    bn_case *c = arg;
    OK(st_batchnorm_forward(&c->e.ctx, &c->bn, 1));
    return dot_yr(c->y, c->R, c->n);
}

/* Channel c of x is offset_c + scale_c u, u ~ U(-1, 1) with two entries
 * pinned at -1 and +1: a mean to remove and a spread sigma >= 0.3. */
static void bn_fill_x(st_rng *r, float *x, int64_t B, int64_t C, int64_t P)
{
    for (int64_t ch = 0; ch < C; ch++) {
        float off = -2.0f + 4.0f * st_rng_uniform(r);
        float scale = 0.5f + 1.5f * st_rng_uniform(r);
        for (int64_t b = 0; b < B; b++) {
            float *xc = x + (b * C + ch) * P;
            fill_uniform(r, xc, (size_t)P, -1.0f, 1.0f);
            if (b == 0) {
                xc[0] = -1.0f;
                xc[P > 1 ? 1 : 0] = 1.0f;
            }
            for (int64_t i = 0; i < P; i++)
                xc[i] = off + scale * xc[i];
        }
    }
}

static void bn_setup(bn_case *c, int64_t B, int64_t C, int64_t H, int64_t W, int fuse,
                     st_layout layout, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    c->B = B; c->C = C; c->H = H; c->W = W; c->fuse = fuse; c->layout = layout;
    c->n = (size_t)(B * C * H * W);
    env_init(&c->e, seed);
    env *e = &c->e;
    c->x = env_floats(e, c->n);  // x, y, dx, dy, R are (B, C, H, W)
    c->y = env_floats(e, c->n);
    c->dx = env_floats(e, c->n);
    c->dy = env_floats(e, c->n);
    c->R = env_floats(e, c->n);
    c->gamma = env_floats(e, (size_t)C);  // the rest are (C)
    c->beta = env_floats(e, (size_t)C);
    c->mean = env_floats(e, (size_t)C);
    c->var = env_floats(e, (size_t)C);
    c->rmean = env_floats(e, (size_t)C);
    c->rvar = env_floats(e, (size_t)C);
    c->dgamma = env_floats(e, (size_t)C);
    c->dbeta = env_floats(e, (size_t)C);
    bn_fill_x(&e->rng, c->x, B, C, H * W);
    fill_uniform(&e->rng, c->gamma, (size_t)C, 0.5f, 1.5f);
    fill_uniform(&e->rng, c->beta, (size_t)C, -0.5f, 0.5f);
    fill_uniform(&e->rng, c->rmean, (size_t)C, -1.0f, 1.0f);
    fill_uniform(&e->rng, c->rvar, (size_t)C, 0.5f, 2.0f);
    fill_uniform(&e->rng, c->R, c->n, -1.0f, 1.0f);
    st_batchnorm_io io = {
        .x = c->x, .y = c->y, .gamma = c->gamma, .beta = c->beta, .mean = c->mean,
        .var = c->var, .running_mean = c->rmean, .running_var = c->rvar, .dx = c->dx,
        .dy = c->dy, .dgamma = c->dgamma, .dbeta = c->dbeta, .fuse_relu = fuse,
        .layout = layout,
    };
    OK(st_batchnorm_build(&e->ctx, &c->bn, B, C, H, W, &io));
    OK(st_nn_ctx_finalize(&e->ctx));
    cr_assert(c->bn.layout == ST_LAYOUT_PLAIN || c->bn.layout == ST_LAYOUT_BLOCKED);
    if (layout != ST_LAYOUT_DEFAULT)
        cr_assert_eq(c->bn.layout, layout);
    /* the blocked path really reorders (the plain one does not) */
    cr_assert_eq(st_pass_reorders(&c->bn.fwd_train) > 0, c->bn.layout == ST_LAYOUT_BLOCKED);
}

static void bn_tag(char *tag, size_t n, const bn_case *c)
{
    snprintf(tag, n, "%lldx%lldx%lldx%lld %s%s", (long long)c->B, (long long)c->C,
             (long long)c->H, (long long)c->W, layout_name(c->bn.layout),
             c->fuse ? " +relu" : "");
}

/* Training forward (y, mean, var) and backward (dx, dgamma, dbeta) in
 * double, per channel over its N = B H W values:
 *   xhat = (x - mu) / s, s = sqrt(var + eps), z = gamma xhat + beta,
 *   y = z (fused: max(z, 0), and dy is cut where z <= 0: g = dy [z > 0]);
 *   dbeta = sum g, dgamma = sum g xhat,
 *   dx = gamma / s (g - dbeta / N - xhat dgamma / N).
 * Also the running update the forward made from rm0, rv0 (momentum 0.1,
 * unbiased variance). */
static void bn_reference(const bn_case *c, const float *rm0, const float *rv0)
{
    const int64_t B = c->B, C = c->C, P = c->H * c->W;
    const double N = (double)(B * P), eps = ST_BATCHNORM_EPS;
    double *y = dalloc(c->n), *ym = dalloc(c->n), *dx = dalloc(c->n), *dxm = dalloc(c->n);
    double *mu = dalloc((size_t)C), *var = dalloc((size_t)C), *sm = dalloc((size_t)C);
    double *vm = dalloc((size_t)C), *dg = dalloc((size_t)C), *dgm = dalloc((size_t)C);
    double *db = dalloc((size_t)C), *dbm = dalloc((size_t)C);
    double *rm = dalloc((size_t)C), *rmm = dalloc((size_t)C), *rv = dalloc((size_t)C);
    double *rvm = dalloc((size_t)C);
#define XAT(b, ch, i) ((b) * C * P + (ch) * P + (i))
    for (int64_t ch = 0; ch < C; ch++) {
        double m = 0, v = 0, sabs = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < P; i++) {
                m += c->x[XAT(b, ch, i)];
                sabs += fabs(c->x[XAT(b, ch, i)]);
            }
        m /= N;
        sabs /= N;
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < P; i++)
                v += (c->x[XAT(b, ch, i)] - m) * (c->x[XAT(b, ch, i)] - m);
        v /= N;
        mu[ch] = m;
        var[ch] = v;
        sm[ch] = sabs;
        vm[ch] = v + 0.1 * sabs * sabs; /* var's own rounding + the mean's */
        const double s = sqrt(v + eps), gam = c->gamma[ch];
        double sg = 0, sgx = 0, sgm = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < P; i++) {
                size_t k = (size_t)XAT(b, ch, i);
                double xh = (c->x[k] - m) / s, z = gam * xh + c->beta[ch];
                int on = !c->fuse || z > 0;
                y[k] = on ? z : 0.0;
                ym[k] = (fabs(c->x[k]) + sabs) / s * fabs(gam) + fabs(c->beta[ch]);
                double g = on ? c->dy[k] : 0.0;
                sg += g;
                sgx += g * xh;
                sgm += fabs(g) * (1 + fabs(xh));
                dgm[ch] += fabs(g * xh) + fabs(g) * sabs / s;
                dbm[ch] += fabs(g);
            }
        db[ch] = sg;
        dg[ch] = sgx;
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < P; i++) {
                size_t k = (size_t)XAT(b, ch, i);
                double xh = (c->x[k] - m) / s, z = gam * xh + c->beta[ch];
                double g = (!c->fuse || z > 0) ? c->dy[k] : 0.0;
                dx[k] = gam / s * (g - sg / N - xh * sgx / N);
                dxm[k] = fabs(gam) / s * (fabs(g) + sgm / N + fabs(g) * sabs / s);
            }
        rm[ch] = 0.9 * rm0[ch] + 0.1 * m;
        rmm[ch] = 0.9 * fabs(rm0[ch]) + 0.1 * sabs;
        rv[ch] = 0.9 * rv0[ch] + 0.1 * v * N / (N - 1);
        rvm[ch] = 0.9 * fabs(rv0[ch]) + 0.1 * vm[ch] * N / (N - 1);
    }
#undef XAT
    char tag[64], what[96];
    bn_tag(tag, sizeof tag, c);
    snprintf(what, sizeof what, "batchnorm %s y", tag);
    compare_ref(what, c->y, y, ym, c->n, REF_RTOL);
    snprintf(what, sizeof what, "batchnorm %s mean", tag);
    compare_ref(what, c->mean, mu, sm, (size_t)C, REF_RTOL);
    snprintf(what, sizeof what, "batchnorm %s var", tag);
    compare_ref(what, c->var, var, vm, (size_t)C, REF_RTOL);
    snprintf(what, sizeof what, "batchnorm %s running mean", tag);
    compare_ref(what, c->rmean, rm, rmm, (size_t)C, REF_RTOL);
    snprintf(what, sizeof what, "batchnorm %s running var", tag);
    compare_ref(what, c->rvar, rv, rvm, (size_t)C, REF_RTOL);
    snprintf(what, sizeof what, "batchnorm %s dx", tag);
    compare_ref(what, c->dx, dx, dxm, c->n, REF_RTOL);
    snprintf(what, sizeof what, "batchnorm %s dgamma", tag);
    compare_ref(what, c->dgamma, dg, dgm, (size_t)C, REF_RTOL);
    snprintf(what, sizeof what, "batchnorm %s dbeta", tag);
    compare_ref(what, c->dbeta, db, dbm, (size_t)C, REF_RTOL);
    free(y); free(ym); free(dx); free(dxm); free(mu); free(var); free(sm); free(vm);
    free(dg); free(dgm); free(db); free(dbm); free(rm); free(rmm); free(rv); free(rvm);
}

/* One training step against the reference (the running update included),
 * then, unfused, finite differences w.r.t. x, gamma and beta. */
static void check_batchnorm(int64_t B, int64_t C, int64_t H, int64_t W, int fuse,
                            st_layout layout, size_t max_coords, uint64_t seed)
{
    bn_case c;
    bn_setup(&c, B, C, H, W, fuse, layout, seed);
    float *rm0 = malloc((size_t)C * sizeof *rm0), *rv0 = malloc((size_t)C * sizeof *rv0);
    cr_assert(rm0 && rv0);
    memcpy(rm0, c.rmean, (size_t)C * sizeof *rm0);
    memcpy(rv0, c.rvar, (size_t)C * sizeof *rv0);
    OK(st_batchnorm_forward(&c.e.ctx, &c.bn, 1));
    memcpy(c.dy, c.R, c.n * sizeof *c.dy);
    OK(st_batchnorm_backward(&c.e.ctx, &c.bn));
    bn_reference(&c, rm0, rv0);
    free(rm0);
    free(rv0);
    if (!fuse && max_coords > 0) {
        char tag[64], what[96];
        bn_tag(tag, sizeof tag, &c);
        snprintf(what, sizeof what, "batchnorm %s dx", tag);
        check_param(what, bn_objective, &c, c.x, c.dx, c.n, max_coords, TOL_BATCHNORM, &c.e.rng);
        snprintf(what, sizeof what, "batchnorm %s dgamma", tag);
        check_param(what, bn_objective, &c, c.gamma, c.dgamma, (size_t)C, max_coords,
                    TOL_BATCHNORM, &c.e.rng);
        snprintf(what, sizeof what, "batchnorm %s dbeta", tag);
        check_param(what, bn_objective, &c, c.beta, c.dbeta, (size_t)C, max_coords,
                    TOL_BATCHNORM, &c.e.rng);
    }
    env_destroy(&c.e);
}

Test(batchnorm, training_small_every_coordinate)
{
    omp_set_num_threads(1);
    for (int l = 0; l < 2; l++) {
        st_layout layout = l ? ST_LAYOUT_BLOCKED : ST_LAYOUT_PLAIN;
        check_batchnorm(3, 4, 5, 5, 0, layout, SIZE_MAX, 141);
        check_batchnorm(2, 5, 3, 7, 0, layout, SIZE_MAX, 142);
        check_batchnorm(4, 3, 1, 1, 0, layout, SIZE_MAX, 143); /* after global pooling: N = B */
    }
}

Test(batchnorm, training_larger_random_subset)
{
    omp_set_num_threads(1);
    check_batchnorm(8, 16, 7, 7, 0, ST_LAYOUT_DEFAULT, LARGE_SUBSET, 144);
    check_batchnorm(4, 17, 6, 6, 0, ST_LAYOUT_DEFAULT, LARGE_SUBSET, 145);
    check_batchnorm(4, 17, 6, 6, 0, ST_LAYOUT_PLAIN, 0, 145);
    check_batchnorm(8, 16, 7, 7, 0, ST_LAYOUT_PLAIN, 0, 144);
}

/* With the ReLU fused: y = max(bn(x), 0), and dy cut where it was. */
Test(batchnorm, fused_relu_reference)
{
    omp_set_num_threads(1);
    for (int l = 0; l < 2; l++) {
        st_layout layout = l ? ST_LAYOUT_BLOCKED : ST_LAYOUT_PLAIN;
        check_batchnorm(3, 4, 5, 5, 1, layout, 0, 146);
        check_batchnorm(8, 17, 7, 7, 1, layout, 0, 147);
    }
}

/* Inference: y from the running statistics, which are left bitwise as
 * they were; then two training steps on different batches, the running
 * statistics following PyTorch's recurrence (checked step by step in
 * bn_reference), and inference again with the updated ones. */
static void check_bn_inference(const bn_case *c, const char *when)
{
    const int64_t C = c->C, P = c->H * c->W;
    double *y = dalloc(c->n), *ym = dalloc(c->n);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t ch = 0; ch < C; ch++) {
            double s = sqrt((double)c->rvar[ch] + ST_BATCHNORM_EPS);
            for (int64_t i = 0; i < P; i++) {
                size_t k = (size_t)((b * C + ch) * P + i);
                double z = c->gamma[ch] * ((double)c->x[k] - c->rmean[ch]) / s + c->beta[ch];
                y[k] = c->fuse && z < 0 ? 0.0 : z;
                ym[k] = fabs(c->gamma[ch]) * (fabs(c->x[k]) + fabs(c->rmean[ch])) / s +
                        fabs(c->beta[ch]);
            }
        }
    char tag[64], what[128];
    bn_tag(tag, sizeof tag, c);
    snprintf(what, sizeof what, "batchnorm %s inference %s", tag, when);
    compare_ref(what, c->y, y, ym, c->n, REF_RTOL);
    free(y);
    free(ym);
}

static void check_bn_modes(int64_t B, int64_t C, int64_t H, int64_t W, int fuse,
                           st_layout layout, uint64_t seed)
{
    bn_case c;
    bn_setup(&c, B, C, H, W, fuse, layout, seed);
    const size_t cb = (size_t)C * sizeof(float);
    float *rm0 = malloc(cb), *rv0 = malloc(cb);
    cr_assert(rm0 && rv0);
    memcpy(rm0, c.rmean, cb);
    memcpy(rv0, c.rvar, cb);
    OK(st_batchnorm_forward(&c.e.ctx, &c.bn, 0));
    cr_expect(!memcmp(rm0, c.rmean, cb) && !memcmp(rv0, c.rvar, cb),
              "an inference forward changed the running statistics");
    check_bn_inference(&c, "(initial statistics)");
    for (int step = 0; step < 2; step++) {
        if (step)
            bn_fill_x(&c.e.rng, c.x, B, C, H * W);  /* another batch */
        memcpy(rm0, c.rmean, cb);
        memcpy(rv0, c.rvar, cb);
        OK(st_batchnorm_forward(&c.e.ctx, &c.bn, 1));
        memcpy(c.dy, c.R, c.n * sizeof *c.dy);
        OK(st_batchnorm_backward(&c.e.ctx, &c.bn));
        bn_reference(&c, rm0, rv0);
    }
    memcpy(rm0, c.rmean, cb);
    memcpy(rv0, c.rvar, cb);
    OK(st_batchnorm_forward(&c.e.ctx, &c.bn, 0));
    cr_expect(!memcmp(rm0, c.rmean, cb) && !memcmp(rv0, c.rvar, cb));
    check_bn_inference(&c, "(after two steps)");
    free(rm0);
    free(rv0);
    env_destroy(&c.e);
}

Test(batchnorm, inference_and_running_statistics)
{
    omp_set_num_threads(1);
    for (int l = 0; l < 2; l++) {
        st_layout layout = l ? ST_LAYOUT_BLOCKED : ST_LAYOUT_PLAIN;
        check_bn_modes(3, 4, 5, 5, 0, layout, 151);
        check_bn_modes(2, 17, 6, 6, 1, layout, 152);
    }
}

Test(batchnorm, rejects_single_value_training)
{
    omp_set_num_threads(1);
    bn_case c;
    bn_setup(&c, 1, 3, 1, 1, 0, ST_LAYOUT_DEFAULT, 153);
    OK(st_batchnorm_forward(&c.e.ctx, &c.bn, 0));   /* inference is fine */
    st_clear_error();
    cr_expect_eq(st_batchnorm_forward(&c.e.ctx, &c.bn, 1), ST_ERR_INVALID);
    cr_expect_neq(st_last_error()[0], '\0');
    env_destroy(&c.e);
}

/* The blocked path (reorders around oneDNN's JIT kernels) computes what
 * the plain one does, up to rounding: training forward, backward, running
 * statistics and inference, fused or not. */
Test(batchnorm, blocked_equals_plain)
{
    omp_set_num_threads(1);
    const int64_t shapes[][4] = { { 4, 16, 7, 7 }, { 3, 17, 5, 6 }, { 2, 5, 3, 3 } };
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        for (int fuse = 0; fuse < 2; fuse++) {
            const int64_t *d = shapes[k];
            bn_case p, b;
            bn_setup(&p, d[0], d[1], d[2], d[3], fuse, ST_LAYOUT_PLAIN, 160 + k);
            bn_setup(&b, d[0], d[1], d[2], d[3], fuse, ST_LAYOUT_BLOCKED, 160 + k);
            const size_t C = (size_t)d[1];
            double *mag = dalloc(p.n), *cmag = dalloc(C), *nmag = dalloc(p.n);
            for (int mode = 0; mode < 2; mode++) {
                bn_case *cs[2] = { &p, &b };
                for (int i = 0; i < 2; i++) {
                    OK(st_batchnorm_forward(&cs[i]->e.ctx, &cs[i]->bn, mode == 0));
                    memcpy(cs[i]->dy, cs[i]->R, p.n * sizeof(float));
                    if (mode == 0)
                        OK(st_batchnorm_backward(&cs[i]->e.ctx, &cs[i]->bn));
                }
                /* |blocked - plain| <= 2e-5 (1 + |plain|): the outputs and
                 * statistics are O(1) here, rounded at ~ 1e-7 */
                for (size_t i = 0; i < p.n; i++) {
                    mag[i] = 1.0 + fabs(p.y[i]);
                    nmag[i] = 1.0 + fabs(p.dx[i]);
                }
                char tag[64], what[128];
                bn_tag(tag, sizeof tag, &p);
                snprintf(what, sizeof what, "batchnorm blocked vs %s %s y", tag,
                         mode ? "inference" : "training");
                compare_floats(what, b.y, p.y, mag, p.n, 2 * REF_RTOL);
                if (mode == 0) {
                    snprintf(what, sizeof what, "batchnorm blocked vs %s dx", tag);
                    compare_floats(what, b.dx, p.dx, nmag, p.n, 2 * REF_RTOL);
                    snprintf(what, sizeof what, "batchnorm blocked vs %s mean", tag);
                    for (size_t ch = 0; ch < C; ch++)
                        cmag[ch] = 1.0 + fabs(p.mean[ch]);
                    compare_floats(what, b.mean, p.mean, cmag, C, 2 * REF_RTOL);
                    snprintf(what, sizeof what, "batchnorm blocked vs %s var", tag);
                    for (size_t ch = 0; ch < C; ch++)
                        cmag[ch] = 1.0 + fabs(p.var[ch]);
                    compare_floats(what, b.var, p.var, cmag, C, 2 * REF_RTOL);
                    snprintf(what, sizeof what, "batchnorm blocked vs %s dgamma", tag);
                    for (size_t ch = 0; ch < C; ch++)
                        cmag[ch] = 1.0 + fabs(p.dgamma[ch]);
                    compare_floats(what, b.dgamma, p.dgamma, cmag, C, 2 * REF_RTOL);
                    snprintf(what, sizeof what, "batchnorm blocked vs %s dbeta", tag);
                    for (size_t ch = 0; ch < C; ch++)
                        cmag[ch] = 1.0 + fabs(p.dbeta[ch]);
                    compare_floats(what, b.dbeta, p.dbeta, cmag, C, 2 * REF_RTOL);
                    snprintf(what, sizeof what, "batchnorm blocked vs %s running var", tag);
                    for (size_t ch = 0; ch < C; ch++)
                        cmag[ch] = 1.0 + fabs(p.rvar[ch]);
                    compare_floats(what, b.rvar, p.rvar, cmag, C, 2 * REF_RTOL);
                }
            }
            free(mag);
            free(cmag);
            free(nmag);
            env_destroy(&p.e);
            env_destroy(&b.e);
        }
}

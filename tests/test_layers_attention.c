/*
 * tests/test_layers_attention.c — gradient checks of the self-attention layer, causal
 * and not (fp32 against a double reference, bf16 products), and its hot path.
 *
 * The pattern every test follows, and the helpers: tests/layer_check.h.
 */
#define _GNU_SOURCE /* RTLD_NEXT, for heapwatch.h */
#include "layer_check.h"

/* ------------------------------------------------------------ attention */

/* Causal self-attention: L is smooth in x (through the scores' softmax
 * and the products); the third derivative of an output in one input is
 * O(scale^2 |K| |V|) = O(1) here (|x| <= 1.5, scale 1/2), so truncation at
 * h = 1e-2 is ~ 2e-5.  A perturbation of one x moves a column of scores
 * and up to T rows of y, each rounded to ~ 1e-7, which / 2h is ~ 1e-5.
 * Gradients are O(0.01 .. 3): the atol of 1e-3 leaves a 10% error of the
 * typical one visible (the teeth check). */
static const tol TOL_ATTENTION = { 1e-2, 1e-3, 1e-2 };

/* One attention layer over B samples of T tokens, H heads of dh, its
 * buffers, and the objective L = sum(y * R) (dy = R). */
typedef struct attn_case {
    env e;
    st_attention a;
    int64_t B, T, H, dh;
    int bf16, noncausal;
    float *x, *y, *dx, *dy, *scratch;
    void *probs;
} attn_case;

static void attn_setup_mask(attn_case *c, int64_t B, int64_t T, int64_t H, int64_t dh,
                            int bf16, int noncausal, uint64_t seed)
{
    env_init(&c->e, seed);
    c->B = B, c->T = T, c->H = H, c->dh = dh, c->bf16 = bf16, c->noncausal = noncausal;
    const size_t X = (size_t)(B * T * 3 * H * dh), Y = (size_t)(B * T * H * dh);
    c->x = env_floats(&c->e, X);
    c->dx = env_floats(&c->e, X);
    c->y = env_floats(&c->e, Y);
    c->dy = env_floats(&c->e, Y);
    c->scratch = env_floats(&c->e, st_attention_scratch_floats(B, H, T));
    OK(st_arena_alloc(&c->e.arena, ST_MEM_ATTENTION, st_attention_probs_bytes(B, H, T, bf16),
                      &c->probs));
    fill_uniform(&c->e.rng, c->x, X, -1.5f, 1.5f);
    fill_uniform(&c->e.rng, c->dy, Y, -1, 1);
    const st_attention_io io = { .x = c->x, .y = c->y, .dx = c->dx, .dy = c->dy,
                                 .probs = c->probs, .scratch = c->scratch, .bf16 = bf16,
                                 .noncausal = noncausal };
    OK(st_attention_build(&c->e.ctx, &c->a, B, T, H, dh, &io));
    OK(st_nn_ctx_finalize(&c->e.ctx));
}

static void attn_setup(attn_case *c, int64_t B, int64_t T, int64_t H, int64_t dh, int bf16,
                       uint64_t seed)
{
    attn_setup_mask(c, B, T, H, dh, bf16, 0, seed);
}

static double attn_objective(void *arg)
{
    attn_case *c = arg;
    OK(st_attention_forward(&c->e.ctx, &c->a));
    return dot_yr(c->y, c->dy, (size_t)(c->B * c->T * c->H * c->dh));
}

/* Entry p (fp32 or bf16) of the layer's P-sized buffer, as a double. */
static double attn_probs_at(const attn_case *c, const void *buf, size_t p)
{
    return c->bf16 ? (double)st_bf16_to_float(((const st_bf16 *)buf)[p])
                   : (double)((const float *)buf)[p];
}

/* The reference, in double, of the layer on x and dy as its products read
 * them (rounded to bf16 when `round`), and the magnitudes that bound each
 * entry's fp32 error.  Pu and dSu (NULL: the reference's own P and dS)
 * are the probabilities and score gradients the layer multiplied: y and
 * dV are computed from Pu, dQ and dK from dSu, so that every product is
 * checked to fp32 precision whatever rounding its operands went through;
 * P and dS themselves are checked on their own. */
typedef struct attn_ref {
    double *P, *y, *ymag, *dP, *dPmag, *dS, *dSmag, *dx, *dxmag;
} attn_ref;

static void attn_reference(const attn_case *c, int round, const double *Pu, const double *dSu,
                           attn_ref *r)
{
    const int64_t B = c->B, T = c->T, H = c->H, dh = c->dh, Dk = H * dh, X = 3 * Dk;
    const double scale = 1.0 / sqrt((double)dh);
    const size_t np = (size_t)(B * H * T * T), ny = (size_t)(B * T * Dk), nx = (size_t)(B * T * X);
    *r = (attn_ref){ dalloc(np), dalloc(ny), dalloc(ny), dalloc(np), dalloc(np), dalloc(np),
                     dalloc(np), dalloc(nx), dalloc(nx) };
#define XR(b, i, part, h, d) \
    ((double)bf16_round(c->x[((b) * T + (i)) * X + (part) * Dk + (h) * dh + (d)], round))
#define DYR(b, i, h, d) ((double)bf16_round(c->dy[((b) * T + (i)) * Dk + (h) * dh + (d)], round))
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const size_t blk = (size_t)((b * H + h) * T * T);
            double *P = r->P + blk, *dP = r->dP + blk, *dPm = r->dPmag + blk;
            double *dS = r->dS + blk, *dSm = r->dSmag + blk;
            const double *pu = (Pu ? Pu : r->P) + blk;
            for (int64_t i = 0; i < T; i++) {   /* P: softmax over the keys j <= i */
                const int64_t last = c->noncausal ? T - 1 : i;   /* or over all */
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j <= last; j++) {
                    double s = 0;
                    for (int64_t d = 0; d < dh; d++)
                        s += XR(b, i, 0, h, d) * XR(b, j, 1, h, d);
                    P[i * T + j] = scale * s;
                    mx = fmax(mx, scale * s);
                }
                for (int64_t j = 0; j <= last; j++)
                    sum += P[i * T + j] = exp(P[i * T + j] - mx);
                for (int64_t j = 0; j < T; j++)
                    P[i * T + j] = j <= last ? P[i * T + j] / sum : 0.0;
            }
            for (int64_t i = 0; i < T; i++)
                for (int64_t d = 0; d < dh; d++) {
                    double t = 0, m = 0, tv = 0, mv = 0;
                    for (int64_t j = 0; j < T; j++) {
                        t += pu[i * T + j] * XR(b, j, 2, h, d);         /* y = P V */
                        m += fabs(pu[i * T + j] * XR(b, j, 2, h, d));
                        tv += pu[j * T + i] * DYR(b, j, h, d);          /* dV = P^T dY */
                        mv += fabs(pu[j * T + i] * DYR(b, j, h, d));
                    }
                    const size_t at = (size_t)((b * T + i) * Dk + h * dh + d);
                    r->y[at] = t;
                    r->ymag[at] = m;
                    const size_t v = (size_t)((b * T + i) * X + 2 * Dk + h * dh + d);
                    r->dx[v] = tv;
                    r->dxmag[v] = mv;
                }
            for (int64_t i = 0; i < T; i++) {
                double s = 0, sm = 0;
                for (int64_t j = 0; j < T; j++) {   /* dP = dY V^T */
                    double t = 0, m = 0;
                    for (int64_t d = 0; d < dh; d++) {
                        t += DYR(b, i, h, d) * XR(b, j, 2, h, d);
                        m += fabs(DYR(b, i, h, d) * XR(b, j, 2, h, d));
                    }
                    dP[i * T + j] = t;
                    dPm[i * T + j] = m;
                    s += pu[i * T + j] * t;
                    sm += fabs(pu[i * T + j]) * m;
                }
                for (int64_t j = 0; j < T; j++) {   /* dS = P (dP - sum P dP) */
                    dS[i * T + j] = pu[i * T + j] * (dP[i * T + j] - s);
                    dSm[i * T + j] = fabs(pu[i * T + j]) * (dPm[i * T + j] + sm);
                }
            }
            const double *dsu = (dSu ? dSu : r->dS) + blk;
            for (int64_t i = 0; i < T; i++)
                for (int64_t d = 0; d < dh; d++) {
                    double tq = 0, mq = 0, tk = 0, mk = 0;
                    for (int64_t j = 0; j < T; j++) {
                        tq += dsu[i * T + j] * XR(b, j, 1, h, d);      /* dQ = dS K */
                        mq += fabs(dsu[i * T + j] * XR(b, j, 1, h, d));
                        tk += dsu[j * T + i] * XR(b, j, 0, h, d);      /* dK = dS^T Q */
                        mk += fabs(dsu[j * T + i] * XR(b, j, 0, h, d));
                    }
                    const size_t q = (size_t)((b * T + i) * X + h * dh + d);
                    r->dx[q] = scale * tq;
                    r->dxmag[q] = scale * mq;
                    r->dx[q + (size_t)Dk] = scale * tk;
                    r->dxmag[q + (size_t)Dk] = scale * mk;
                }
        }
#undef XR
#undef DYR
}

static void attn_ref_free(attn_ref *r)
{
    double *all[] = { r->P, r->y, r->ymag, r->dP, r->dPmag, r->dS, r->dSmag, r->dx, r->dxmag };
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        free(all[i]);
}

/* sqrt(sum (got - ref)^2 / sum ref^2) */
static double rel_rms(const float *got, const double *ref, size_t n)
{
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        e += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        s += ref[i] * ref[i];
    }
    return sqrt(e / (s + 1e-300));
}

/* Forward, then backward, checked stage by stage against the reference:
 * P (the saved buffer after the forward), y from that P, dP (bf16: the
 * scratch; fp32 computes dS over it), dS (bf16: over P's buffer; fp32: the
 * scratch) from that P and the reference dP, dV from P, dQ and dK from
 * that dS.  In bf16, P and dS are fp32 values rounded to bf16 once (to
 * nearest: half an ulp, at most 2^-8 relative; the fp32 value is a few
 * fp32 ulps off the double one, so a near-tie may round the other way,
 * hence the fp32 bound on top); everything else is an fp32 sum. */
static void check_attention_mask(int64_t B, int64_t T, int64_t H, int64_t dh, int bf16,
                                 int noncausal, uint64_t seed)
{
    attn_case c;
    attn_setup_mask(&c, B, T, H, dh, bf16, noncausal, seed);
    const int64_t Dk = H * dh;
    const size_t np = (size_t)(B * H * T * T), ny = (size_t)(B * T * Dk), nx = 3 * ny;
    char what[96];
    const char *tag = bf16 ? "bf16" : "fp32";
    OK(st_attention_forward(&c.e.ctx, &c.a));
    double *Pu = dalloc(np), *dSu = dalloc(np);
    for (size_t p = 0; p < np; p++)
        Pu[p] = attn_probs_at(&c, c.probs, p);
    OK(st_attention_backward(&c.e.ctx, &c.a));
    for (size_t p = 0; p < np; p++)
        dSu[p] = bf16 ? attn_probs_at(&c, c.probs, p) : (double)c.scratch[p];
    attn_ref r;
    attn_reference(&c, bf16, Pu, dSu, &r);

    /* P: exactly 0 above the diagonal, else the softmax, rounded in bf16 */
    const double round_rtol = bf16 ? 1.0 / 256 : 0.0;
    float *got = malloc(np * sizeof *got);
    double *mag = dalloc(np);
    cr_assert(got);
    int64_t above = 0, zero_above = 0;
    for (size_t p = 0; p < np; p++) {
        const int64_t i = (int64_t)(p / (size_t)T) % T, j = (int64_t)(p % (size_t)T);
        above += j > i && Pu[p] != 0.0;
        zero_above += j > i && Pu[p] == 0.0;
        got[p] = (float)Pu[p];
        mag[p] = (round_rtol + 1e-5) * r.P[p] + 1e-7;   /* relative, with a floor for exp */
    }
    if (noncausal)   /* no mask: every key has a probability */
        cr_expect_eq(zero_above, 0, "%s: %lld probabilities above the diagonal are 0 without a "
                     "mask", tag, (long long)zero_above);
    else
        cr_expect_eq(above, 0, "%s: %lld masked probabilities are not 0", tag, (long long)above);
    snprintf(what, sizeof what, "attention %s P", tag);
    compare_ref(what, got, r.P, mag, np, 1.0);
    snprintf(what, sizeof what, "attention %s y = P V", tag);
    compare_ref(what, c.y, r.y, r.ymag, ny, REF_RTOL);
    if (bf16) {
        snprintf(what, sizeof what, "attention %s dP = dY V^T", tag);
        compare_ref(what, c.scratch, r.dP, r.dPmag, np, REF_RTOL);
    }
    for (size_t p = 0; p < np; p++) {
        got[p] = (float)dSu[p];
        mag[p] = round_rtol * fabs(r.dS[p]) + REF_RTOL * r.dSmag[p];
    }
    snprintf(what, sizeof what, "attention %s dS = P (dP - sum P dP)", tag);
    compare_ref(what, got, r.dS, mag, np, 1.0);
    snprintf(what, sizeof what, "attention %s dx = (dS K, dS^T Q, P^T dY)", tag);
    compare_ref(what, c.dx, r.dx, r.dxmag, nx, REF_RTOL);

    /* bf16 against the unrounded reference: rounded it is (far from it at
     * fp32's tolerance), and close (the kept P in bf16 costs the gradient
     * what the products' own rounding does) */
    attn_ref full;
    attn_reference(&c, 0, NULL, NULL, &full);
    const double ey = rel_rms(c.y, full.y, ny), edx = rel_rms(c.dx, full.dx, nx);
    fprintf(stderr, "[ref] attention %s against unrounded fp32 math: y %.2e, dx %.2e "
            "(relative rms)\n", tag, ey, edx);
    if (bf16) {
        cr_expect(ey > 1e-4 && edx > 1e-4, "bf16 y, dx within %.1e, %.1e of fp32: not rounded?",
                  ey, edx);
        cr_expect(ey < 1e-2 && edx < 1e-2, "bf16 y, dx off fp32 by %.1e, %.1e", ey, edx);
    } else {
        cr_expect(ey < 1e-6 && edx < 1e-6, "fp32 y, dx off by %.1e, %.1e", ey, edx);
    }
    attn_ref_free(&full);
    attn_ref_free(&r);
    free(got);
    free(mag);
    free(Pu);
    free(dSu);
    env_destroy(&c.e);
}

static void check_attention(int64_t B, int64_t T, int64_t H, int64_t dh, int bf16,
                            uint64_t seed)
{
    check_attention_mask(B, T, H, dh, bf16, 0, seed);
}

/* Central differences of L in every x (fp32), causal or not. */
static void check_every_input(int noncausal, uint64_t seed)
{
    attn_case c;
    attn_setup_mask(&c, 2, 7, 2, 4, 0, noncausal, seed);
    OK(st_attention_forward(&c.e.ctx, &c.a));
    OK(st_attention_backward(&c.e.ctx, &c.a));
    const size_t nx = (size_t)(2 * 7 * 3 * 8);
    float *an = malloc(nx * sizeof *an);
    cr_assert(an);
    memcpy(an, c.dx, nx * sizeof *an);
    check_param(noncausal ? "attention fp32 non-causal dx" : "attention fp32 dx",
                attn_objective, &c, c.x, an, nx, nx, TOL_ATTENTION, &c.e.rng);
    free(an);
    env_destroy(&c.e);
}

/* fp32: the reference (stage by stage, T not a multiple of anything, 2
 * samples, 2 heads) and central differences of L in every x. */
Test(attention, fp32_reference_and_every_input_coordinate)
{
    omp_set_num_threads(1);
    check_attention(2, 7, 2, 4, 0, 41);
    check_every_input(0, 43);
}

/* Not causal (a ViT's encoder): every key of the sample in the softmax,
 * against the same reference without its mask, and central differences
 * of L in every x. */
Test(attention, noncausal_fp32_reference_and_every_input_coordinate)
{
    omp_set_num_threads(1);
    check_attention_mask(2, 7, 2, 4, 0, 1, 51);
    check_every_input(1, 53);
}

/* Not causal in bf16: the softmax backward loop over every key. */
Test(attention, noncausal_bf16_products_of_rounded_operands)
{
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 matmul on this CPU");
    omp_set_num_threads(1);
    check_attention_mask(2, 7, 2, 4, 1, 1, 57);
}

/* bf16: the products of rounded operands (x's copy through every stride
 * and offset, P, dY and dS rounded), scores, softmax and its backward in
 * fp32 math, on any CPU whose oneDNN has bf16 kernels; and a larger shape
 * (dh 16, T 33: past oneDNN's blocks). */
Test(attention, bf16_products_of_rounded_operands)
{
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 matmul on this CPU");
    omp_set_num_threads(1);
    check_attention(2, 7, 2, 4, 1, 41);
    check_attention(3, 33, 3, 16, 1, 47);
}

/* bf16 data gradients as tensors (--activation-precision bf16): given dy
 * as bf16 and writing dQ, dK, dV as bf16, the layer computes what it does
 * from an fp32 dy, rounded once: its products read dy's copy, rounded to
 * nearest even as dy itself is here, and write dx rounded the same way. */
static void check_bf16_gradients(int64_t B, int64_t T, int64_t H, int64_t dh, uint64_t seed)
{
    attn_case c;
    attn_setup(&c, B, T, H, dh, 1, seed);
    OK(st_attention_forward(&c.e.ctx, &c.a));
    OK(st_attention_backward(&c.e.ctx, &c.a));
    const size_t ny = (size_t)(B * T * H * dh), nx = 3 * ny;

    env e;
    env_init(&e, seed);
    st_bf16 *dyb = (st_bf16 *)env_floats(&e, (ny + 1) / 2);
    st_bf16 *dxb = (st_bf16 *)env_floats(&e, (nx + 1) / 2);
    float *y = env_floats(&e, ny), *scratch = env_floats(&e, st_attention_scratch_floats(B, H, T));
    void *probs;
    OK(st_arena_alloc(&e.arena, ST_MEM_ATTENTION, st_attention_probs_bytes(B, H, T, 1), &probs));
    for (size_t i = 0; i < ny; i++)
        dyb[i] = st_bf16_from_float(c.dy[i]);
    const st_attention_io io = { .x = c.x, .y = y, .dx = c.dx, .dy = c.dy, .probs = probs,
                                 .scratch = scratch, .bf16 = 1, .dyb = dyb, .dxb = dxb };
    st_attention a;
    OK(st_attention_build(&e.ctx, &a, B, T, H, dh, &io));
    OK(st_nn_ctx_finalize(&e.ctx));
    cr_assert(a.dy_half && a.dx_half, "the layer took fp32 gradients");
    OK(st_attention_forward(&e.ctx, &a));
    OK(st_attention_backward(&e.ctx, &a));
    size_t off = 0;
    for (size_t i = 0; i < nx; i++)
        off += dxb[i] != st_bf16_from_float(c.dx[i]);
    cr_expect_eq(off, 0, "%zu of %zu bf16 dx values are not the fp32 ones rounded", off, nx);
    env_destroy(&e);
    env_destroy(&c.e);
}

Test(attention, bf16_gradients_are_the_fp32_ones_rounded)
{
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 matmul on this CPU");
    omp_set_num_threads(1);
    check_bf16_gradients(2, 7, 2, 4, 61);
    check_bf16_gradients(3, 33, 3, 16, 67);
}

/* ------------------------------------------------------------ hot path */

/* Counts heap calls on the armed thread (heapwatch.h interposes the malloc
 * family for the whole test program and forwards to the C library's);
 * calls made while oneDNN executes a primitive are counted apart: its C API
 * builds an argument map per execution, outside subtrain's control. */
#define HEAPWATCH_PER_THREAD
#include "heapwatch.h"

/* Attention, fp32 and bf16 (its reorders and the softmax backward loop):
 * once built, a forward and a backward make no heap call of subtrain's. */
Test(attention, forward_and_backward_make_no_heap_call)
{
    HEAPWATCH_SKIP_IF_OFF();
    omp_set_num_threads(1);
    const int with_bf16 = st_bf16_probe(NULL) != ST_BF16_UNAVAILABLE;
    attn_case c[2];
    for (int k = 0; k <= with_bf16; k++)
        attn_setup(&c[k], 2, 9, 2, 8, k, 171 + (uint64_t)k);
    st_status st = ST_OK;
    for (int round = 0; round < 4; round++) {
        armed = round >= 1; /* the first round lets oneDNN set up its per-thread state */
        for (int k = 0; k <= with_bf16 && st == ST_OK; k++) {
            st = st_attention_forward(&c[k].e.ctx, &c[k].a);
            if (st == ST_OK)
                st = st_attention_backward(&c[k].e.ctx, &c[k].a);
        }
        armed = 0;
    }
    cr_assert_eq(st, ST_OK, "%s", st_last_error());
    cr_assert_gt(executes, 0, "the interposer saw the primitives run");
    cr_expect_eq(own_calls, 0, "3 rounds of attention: subtrain called the heap %ld times",
                 own_calls);
    fprintf(stderr, "[heap] attention fp32%s, 3 rounds: subtrain %ld heap calls; oneDNN %ld in "
            "%ld executions\n", with_bf16 ? " and bf16" : "", own_calls, dnnl_calls, executes);
    for (int k = 0; k <= with_bf16; k++)
        env_destroy(&c[k].e);
}

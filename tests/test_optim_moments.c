/*
 * tests/test_optim_moments.c — the optimizer's bf16 state (st_moments):
 * each stored moment is the rounding of the fp32 update computed from
 * the stored state, the master weights are updated from the unrounded
 * moments, stochastic rounding is repeatable, unbiased and independent
 * of how the vector is sharded, the weights' bf16 copies are those of
 * the fp32 values, and the bytes and memory an update costs.
 */
#include <math.h>
#include <string.h>

#include <criterion/criterion.h>

#include <subtrain/optim.h>
#include <subtrain/rng.h>

#include "core/arena_impl.h"
#include "core/bf16.h"
#include "optim/optim_impl.h"
#include "optim_vectors.h"

/* The nearest bf16 (ties to even), from the bits, independently of
 * core/bf16.h's formula. */
static uint16_t nearest_bf16(float f)
{
    uint32_t u = bits(f), lower = u & 0xffffu, up = u >> 16;
    if (lower > 0x8000u || (lower == 0x8000u && (up & 1u)))
        up++;
    return (uint16_t)up;
}

static st_optim_config config(st_optimizer_kind kind, st_moments moments)
{
    st_optim_config c = st_optim_config_default();
    c.kind = kind;
    c.lr = kind == ST_OPT_SGD ? 0.01f : 3e-3f;
    c.weight_decay = 0.05f;
    c.moments = moments;
    c.seed = 11;
    return c;
}

/* AdamW with bf16 moments, step by step against the formula evaluated
 * here on the stored state: m and v are the nearest bf16 of the fp32
 * moments, the weights bitwise the fp32 update from those moments. */
Test(moments, adamw_bf16_stores_the_nearest_bf16_of_each_moment)
{
    st_optim_config c = config(ST_OPT_ADAMW, ST_MOMENTS_BF16);
    float p[N], g[N], want[N];
    random_fill(p, N, 1, 1.0f);
    st_arena a;
    st_arena_init(&a, "optim", NULL, 0);
    st_optim o;
    cr_assert_eq(st_optim_init(&o, &c, N, &a), ST_OK);
    cr_assert(o.m == NULL && o.v == NULL && o.m16 && o.v16, "the state is the bf16 vectors");
    for (int t = 1; t <= 5; t++) {
        random_fill(g, N, 100 + (uint64_t)t, t == 3 ? 1e-3f : 1.0f);
        uint16_t m_want[N], v_want[N];
        const float c1 = (float)(1.0 / (1.0 - pow(c.beta1, t)));
        const float c2 = (float)(1.0 / (1.0 - pow(c.beta2, t)));
        for (int i = 0; i < N; i++) {
            float mi = c.beta1 * st_bf16_to_float(o.m16[i]) + (1.0f - c.beta1) * g[i];
            float vi = c.beta2 * st_bf16_to_float(o.v16[i]) + (1.0f - c.beta2) * g[i] * g[i];
            float shrink = i < 200 ? 1.0f - c.lr * c.weight_decay : 1.0f;
            m_want[i] = nearest_bf16(mi);
            v_want[i] = nearest_bf16(vi);
            want[i] = p[i] * shrink - c.lr * (mi * c1) / (sqrtf(vi * c2) + c.eps);
        }
        st_optim_update(&o, p, g, segs, 2, 0, N, (uint64_t)t, c.lr);
        for (int i = 0; i < N; i++) {
            cr_assert_eq(o.m16[i], m_want[i], "step %d element %d: m %#x, want %#x", t, i,
                         o.m16[i], m_want[i]);
            cr_assert_eq(o.v16[i], v_want[i], "step %d element %d: v %#x, want %#x", t, i,
                         o.v16[i], v_want[i]);
            cr_assert_eq(bits(p[i]), bits(want[i]), "step %d element %d: %.9g, want %.9g", t,
                         i, p[i], want[i]);
        }
    }
    st_arena_release(&a);
}

/* SGD's momentum buffer in bf16: the same contract. */
Test(moments, sgd_bf16_stores_the_nearest_bf16_of_the_buffer)
{
    st_optim_config c = config(ST_OPT_SGD, ST_MOMENTS_BF16);
    float p[N], g[N], want[N];
    random_fill(p, N, 2, 1.0f);
    st_arena a;
    st_arena_init(&a, "optim", NULL, 0);
    st_optim o;
    cr_assert_eq(st_optim_init(&o, &c, N, &a), ST_OK);
    cr_assert(o.m == NULL && o.m16 && o.v16 == NULL);
    for (int t = 1; t <= 4; t++) {
        random_fill(g, N, 200 + (uint64_t)t, 1.0f);
        uint16_t b_want[N];
        for (int i = 0; i < N; i++) {
            float wd = i < 200 ? c.weight_decay : 0.0f;
            float b = c.momentum * st_bf16_to_float(o.m16[i]) + g[i] + wd * p[i];
            b_want[i] = nearest_bf16(b);
            want[i] = p[i] - c.lr * b;
        }
        st_optim_update(&o, p, g, segs, 2, 0, N, (uint64_t)t, c.lr);
        for (int i = 0; i < N; i++) {
            cr_assert_eq(o.m16[i], b_want[i], "step %d element %d", t, i);
            cr_assert_eq(bits(p[i]), bits(want[i]), "step %d element %d", t, i);
        }
    }
    st_arena_release(&a);
}

/* Stochastic rounding: every stored value is one of the two bf16
 * neighbours of the fp32 moment, up about as often as the dropped
 * fraction says (the mean of the stored values is the fp32 mean), the
 * same bits for the same seed and another draw for another seed. */
Test(moments, stochastic_rounding_is_unbiased_and_repeatable)
{
    enum { M = 4096 };
    static float p[M], p2[M], g[M];
    const st_param_segment seg = { .name = "w", .offset = 0, .count = M, .decay = 0 };
    st_optim_config c = config(ST_OPT_ADAMW, ST_MOMENTS_BF16_SR);
    random_fill(p, M, 3, 1.0f);
    memcpy(p2, p, sizeof p);
    /* every gradient 1 + a small offset: m = 0.1 g after step 1, whose
     * lower bits are all over the place */
    for (int i = 0; i < M; i++)
        g[i] = 1.0f + (float)i / (float)(8 * M);
    st_arena a;
    st_arena_init(&a, "optim", NULL, 0);
    st_optim o, same, other;
    st_optim_config c_other = c;
    c_other.seed = 12;
    cr_assert_eq(st_optim_init(&o, &c, M, &a), ST_OK);
    cr_assert_eq(st_optim_init(&same, &c, M, &a), ST_OK);
    cr_assert_eq(st_optim_init(&other, &c_other, M, &a), ST_OK);
    st_optim_update(&o, p, g, &seg, 1, 0, M, 1, c.lr);
    st_optim_update(&same, p2, g, &seg, 1, 0, M, 1, c.lr);
    cr_assert_arr_eq(o.m16, same.m16, M * sizeof *o.m16, "the same seed, the same bits");
    cr_assert_arr_eq(o.v16, same.v16, M * sizeof *o.v16);
    memcpy(p2, p, sizeof p);
    st_optim_update(&other, p2, g, &seg, 1, 0, M, 1, c.lr);
    int differ = 0, up = 0;
    double sum = 0.0, stored = 0.0;
    for (int i = 0; i < M; i++) {
        const float mi = (1.0f - c.beta1) * g[i];
        const uint32_t lo = bits(mi) & 0xffff0000u;
        const uint16_t down = (uint16_t)(lo >> 16), upper = (uint16_t)((lo >> 16) + 1);
        cr_assert(o.m16[i] == down || o.m16[i] == upper, "element %d: %#x is no neighbour of "
                  "%.9g", i, o.m16[i], mi);
        up += o.m16[i] == upper;
        differ += o.m16[i] != other.m16[i];
        sum += mi;
        stored += st_bf16_to_float(o.m16[i]);
    }
    cr_assert_gt(differ, M / 10, "another seed draws other roundings (%d differ)", differ);
    cr_assert(up > M / 8 && up < M - M / 8, "%d of %d rounded up", up, M);
    /* the mean of M stored values: the fp32 mean within a few standard
     * errors (each rounding's error is at most one bf16 step, 2^-10 here) */
    cr_assert_lt(fabs(stored - sum) / M, 4.0 * 0x1p-10 / sqrt((double)M),
                 "mean stored %.9g, fp32 %.9g", stored / M, sum / M);
    st_arena_release(&a);
}

/* v after a large gradient and then zero gradients: the fp32 state
 * decays by beta2 every step; rounded to nearest, each decay is smaller
 * than half a bf16 step and v stays where it was; stochastic rounding
 * decays it on average (the reason bf16-sr exists). */
Test(moments, decaying_second_moment_under_each_rounding)
{
    enum { M = 1024, STEPS = 200 };
    static float p[3][M], g[M];
    const st_param_segment seg = { .name = "w", .offset = 0, .count = M, .decay = 0 };
    const st_moments kinds[3] = { ST_MOMENTS_FP32, ST_MOMENTS_BF16, ST_MOMENTS_BF16_SR };
    double v_mean[3];
    st_arena a;
    st_arena_init(&a, "optim", NULL, 0);
    for (int k = 0; k < 3; k++) {
        st_optim_config c = config(ST_OPT_ADAMW, kinds[k]);
        st_optim o;
        cr_assert_eq(st_optim_init(&o, &c, M, &a), ST_OK);
        for (uint64_t t = 1; t <= STEPS; t++) {
            for (int i = 0; i < M; i++)
                g[i] = t == 1 ? 1.0f + (float)i / M : 0.0f;
            st_optim_update(&o, p[k], g, &seg, 1, 0, M, t, 1e-3f);
        }
        double s = 0.0;
        for (int i = 0; i < M; i++)
            s += o.v ? o.v[i] : st_bf16_to_float(o.v16[i]);
        v_mean[k] = s / M;
    }
    double after_first = 0.0;   /* the mean of 0.001 g^2 after step 1 */
    for (int i = 0; i < M; i++) {
        const float g1 = 1.0f + (float)i / M;
        after_first += 0.001 * g1 * g1 / M;
    }
    const double decayed = after_first * pow(0.999, STEPS - 1);
    cr_assert_lt(fabs(v_mean[0] / decayed - 1.0), 1e-3, "fp32: %.9g, want %.9g", v_mean[0],
                 decayed);
    cr_assert_lt(fabs(v_mean[1] / after_first - 1.0), 4e-3, "rne: v kept its first value "
                 "(%.9g, first %.9g)", v_mean[1], after_first);
    cr_assert_lt(fabs(v_mean[2] / decayed - 1.0), 0.01, "sr: decays on average (%.9g, fp32 "
                 "%.9g)", v_mean[2], decayed);
    st_arena_release(&a);
}

/* Shard by shard (a shard owner's share) is bitwise the whole update, for
 * both roundings: the stochastic one draws by the element's index in the
 * vector, not in the shard. */
Test(moments, shard_updates_equal_a_whole_update)
{
    const st_moments kinds[2] = { ST_MOMENTS_BF16, ST_MOMENTS_BF16_SR };
    for (int k = 0; k < 2; k++) {
        float whole[N], sharded[N], g[N];
        random_fill(whole, N, 5, 1.0f);
        memcpy(sharded, whole, sizeof whole);
        st_optim_config c = config(ST_OPT_ADAMW, kinds[k]);
        st_arena a;
        st_arena_init(&a, "optim", NULL, 0);
        st_optim o1, o2[3];
        const size_t cuts[] = { 0, 77, 201, N };
        cr_assert_eq(st_optim_init(&o1, &c, N, &a), ST_OK);
        for (int s = 0; s < 3; s++)
            cr_assert_eq(st_optim_init_range(&o2[s], &c, cuts[s], cuts[s + 1], &a), ST_OK);
        for (int t = 1; t <= 3; t++) {
            random_fill(g, N, 50 + (uint64_t)t, 1.0f);
            st_optim_update(&o1, whole, g, segs, 2, 0, N, (uint64_t)t, 1e-2f);
            for (int s = 0; s < 3; s++)
                st_optim_update(&o2[s], sharded + cuts[s], g + cuts[s], segs, 2, cuts[s],
                                cuts[s + 1], (uint64_t)t, 1e-2f);
        }
        cr_assert_arr_eq(whole, sharded, sizeof whole, "%s", st_moments_name(kinds[k]));
        for (int s = 0; s < 3; s++)
            cr_assert_arr_eq(o1.m16 + cuts[s], o2[s].m16, (cuts[s + 1] - cuts[s]) * 2,
                             "%s: shard %d's m", st_moments_name(kinds[k]), s);
        st_arena_release(&a);
    }
}

/* The weights' bf16 copies written in the same pass: the fp32 values are
 * the plain update's and each copy the nearest bf16 of its value. */
Test(moments, the_update_writes_the_bf16_copies)
{
    const st_optimizer_kind kinds[2] = { ST_OPT_ADAMW, ST_OPT_SGD };
    for (int k = 0; k < 4; k++) {
        st_optim_config c = config(kinds[k % 2], k < 2 ? ST_MOMENTS_BF16 : ST_MOMENTS_BF16_SR);
        float plain[N], with[N], g[N];
        uint16_t half[N];
        random_fill(plain, N, 7, 1.0f);
        random_fill(g, N, 8, 1.0f);
        memcpy(with, plain, sizeof plain);
        for (int i = 0; i < N; i++)
            half[i] = 0xdeadu;
        const st_param_copy copies[] = { { 10, 90, half + 10 }, { 150, 100, half + 150 } };
        st_arena a;
        st_arena_init(&a, "optim", NULL, 0);
        st_optim o1, o2;
        cr_assert_eq(st_optim_init(&o1, &c, N, &a), ST_OK);
        cr_assert_eq(st_optim_init(&o2, &c, N, &a), ST_OK);
        for (int t = 1; t <= 3; t++) {
            st_optim_update(&o1, plain, g, segs, 2, 0, N, (uint64_t)t, 1e-2f);
            st_optim_update_copies(&o2, with, g, segs, 2, 0, N, (uint64_t)t, 1e-2f, copies, 2);
        }
        cr_assert_arr_eq(plain, with, sizeof plain, "the fp32 values are the plain update's");
        cr_assert_arr_eq(o1.m16, o2.m16, sizeof(uint16_t) * N, "and the state");
        for (int i = 0; i < N; i++) {
            int covered = (i >= 10 && i < 100) || (i >= 150 && i < 250);
            cr_assert_eq(half[i], covered ? nearest_bf16(with[i]) : 0xdeadu, "element %d", i);
        }
        /* bytes: the copies' 190 elements write 2 more each */
        cr_assert_eq(o2.updated, N);
        cr_assert_eq(o2.update_bytes, N * (size_t)st_optim_bytes_per_param(&c, 0) + 190 * 2);
        st_arena_release(&a);
    }
}

/* Bytes an update reads and writes per parameter, and the state's memory. */
Test(moments, bytes_per_parameter_and_memory)
{
    st_optim_config c = config(ST_OPT_ADAMW, ST_MOMENTS_FP32);
    cr_assert_eq(st_optim_bytes_per_param(&c, 0), 28);
    cr_assert_eq(st_optim_bytes_per_param(&c, 1), 30);
    c.moments = ST_MOMENTS_BF16;
    cr_assert_eq(st_optim_bytes_per_param(&c, 0), 20);
    cr_assert_eq(st_optim_bytes_per_param(&c, 1), 22);
    c.kind = ST_OPT_SGD;
    cr_assert_eq(st_optim_bytes_per_param(&c, 0), 16);
    c.moments = ST_MOMENTS_FP32;
    cr_assert_eq(st_optim_bytes_per_param(&c, 0), 20);
    c.momentum = 0.0f;
    cr_assert_eq(st_optim_bytes_per_param(&c, 1), 14);

    st_arena a;
    st_arena_init(&a, "optim", NULL, 0);
    st_optim o;
    c = config(ST_OPT_ADAMW, ST_MOMENTS_BF16_SR);
    cr_assert_eq(st_optim_init(&o, &c, 1000, &a), ST_OK);
    cr_assert_eq(a.stats.current[ST_MEM_OPTIMIZER], 2 * 2048, "m and v, 2 bytes each, 64-aligned");
    st_arena_release(&a);
}

Test(moments, reset_clears_the_bf16_state)
{
    st_optim_config c = config(ST_OPT_ADAMW, ST_MOMENTS_BF16);
    float p[N], g[N];
    random_fill(p, N, 1, 1.0f);
    random_fill(g, N, 2, 1.0f);
    st_arena a;
    st_arena_init(&a, "optim", NULL, 0);
    st_optim o;
    cr_assert_eq(st_optim_init(&o, &c, N, &a), ST_OK);
    st_optim_update(&o, p, g, segs, 2, 0, N, 1, 1e-3f);
    st_optim_reset(&o);
    for (int i = 0; i < N; i++)
        cr_assert(o.m16[i] == 0 && o.v16[i] == 0);
    st_arena_release(&a);
}

/* Both bf16 layouts still minimise: the quadratic of test_optim. */
Test(moments, adamw_bf16_minimises_a_quadratic)
{
    enum { M = 16 };
    const st_param_segment seg = { .name = "p", .offset = 0, .count = M, .decay = 0 };
    for (int k = 0; k < 2; k++) {
        float p[M] = { 0 }, g[M];
        st_arena a;
        st_arena_init(&a, "optim", NULL, 0);
        st_optim_config c = config(ST_OPT_ADAMW, k ? ST_MOMENTS_BF16_SR : ST_MOMENTS_BF16);
        c.lr = 0.05f;
        st_optim o;
        cr_assert_eq(st_optim_init(&o, &c, M, &a), ST_OK);
        for (int t = 1; t <= 2000; t++) {
            for (int i = 0; i < M; i++)
                g[i] = (float)(i + 1) * (p[i] - 1.0f);
            st_optim_update(&o, p, g, &seg, 1, 0, M, (uint64_t)t,
                            c.lr * (1.0f - (float)t / 2001.0f));
        }
        for (int i = 0; i < M; i++)
            cr_assert_lt(fabsf(p[i] - 1.0f), 1e-3f, "%s: p[%d] = %g",
                         st_moments_name(c.moments), i, p[i]);
        st_arena_release(&a);
    }
}

Test(moments, names_round_trip_and_bad_values_are_refused)
{
    st_moments m;
    cr_assert_eq(st_moments_parse("bf16-sr", &m), ST_OK);
    cr_assert_eq(m, ST_MOMENTS_BF16_SR);
    cr_assert_str_eq(st_moments_name(ST_MOMENTS_BF16), "bf16");
    cr_assert_eq(st_moments_parse("fp16", &m), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "fp32, bf16, bf16-sr"), "%s", st_last_error());
    st_optim_config c = st_optim_config_default();
    cr_assert_eq(c.moments, ST_MOMENTS_FP32, "fp32 by default");
    c.moments = (st_moments)9;
    cr_assert_eq(st_optim_config_check(&c), ST_ERR_INVALID);
}

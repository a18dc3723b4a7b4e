/*
 * tests/test_optim_master.c — AdamW with a bf16 master (ST_MASTER_BF16_SR):
 * each new weight is the fp32 AdamW update of the widened master, rounded
 * stochastically with the documented hash (seed, step, index), whatever
 * the sharding and wherever the master is carried; a small update does
 * not vanish on average, as it would rounded to nearest; the bytes an
 * update moves.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include <subtrain/optim.h>
#include <subtrain/rng.h>

#include "core/arena_impl.h"
#include "core/bf16.h"
#include "optim/optim_impl.h"
#include "optim/state16.h"
#include "optim_vectors.h"

static float widen(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The nearest bf16 (ties to even), from the bits. */
static uint16_t nearest_bf16(float f)
{
    uint32_t u = bits(f), lower = u & 0xffffu, up = u >> 16;
    if (lower > 0x8000u || (lower == 0x8000u && (up & 1u)))
        up++;
    return (uint16_t)up;
}

/* The documented draw (doc/precision.md): Wellons' lowbias32 of the
 * element's index xor the step's key, the key the first 32 bits of the
 * stream 0x3A57E4 of the seed, split by the step. */
static uint32_t lowbias32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

static uint32_t master_key(uint64_t seed, uint64_t t)
{
    st_rng root = st_rng_seed(seed);
    st_rng mine = st_rng_split(&root, 0x3A57E4ull);
    st_rng step = st_rng_split(&mine, t);
    return (uint32_t)st_rng_u64(&step);
}

/* f rounded up with the probability of its dropped 16 bits: up when they
 * plus the draw's low 16 bits carry into bit 16. */
static uint16_t stochastic_bf16(float f, uint32_t draw)
{
    uint32_t u = bits(f);
    return (uint16_t)((u >> 16) + (((u & 0xffffu) + (draw & 0xffffu)) >> 16));
}

static st_optim_config config(st_moments moments)
{
    st_optim_config c = st_optim_config_default();
    c.lr = 3e-3f;
    c.weight_decay = 0.05f;
    c.moments = moments;
    c.master = ST_MASTER_BF16_SR;
    c.seed = 11;
    return c;
}

/* The copies: two ranges of the decaying segment and one over the edge
 * between the segments; the rest keeps an fp32 master. */
static void copies_of(uint16_t *half, st_param_copy out[3])
{
    out[0] = (st_param_copy){ 10, 90, half + 10 };
    out[1] = (st_param_copy){ 120, 40, half + 120 };
    out[2] = (st_param_copy){ 180, 60, half + 180 };
}

static int covered(int i)
{
    return (i >= 10 && i < 100) || (i >= 120 && i < 160) || (i >= 180 && i < 240);
}

/* Step by step against the reference computed here: fp32 AdamW of the
 * widened master from the stored moments, then the stochastic rounding
 * with the documented draw; the fp32 master elsewhere the plain update;
 * the fp32 vector's covered elements neither read nor written. */
Test(master, update_is_fp32_adamw_rounded_with_the_documented_draw)
{
    const st_moments kinds[3] = { ST_MOMENTS_FP32, ST_MOMENTS_BF16, ST_MOMENTS_BF16_SR };
    for (int k = 0; k < 3; k++) {
        st_optim_config c = config(kinds[k]);
        float p[N], g[N], want[N];
        uint16_t half[N];
        st_param_copy copies[3];
        copies_of(half, copies);
        random_fill(p, N, 1, 1.0f);
        for (int i = 0; i < N; i++) {
            half[i] = nearest_bf16(p[i]);
            if (covered(i))
                p[i] = NAN;   /* never read: the master is the copy */
        }
        st_arena a;
        st_arena_init(&a, "optim", NULL, 0);
        st_optim o;
        cr_assert_eq(st_optim_init(&o, &c, N, &a), ST_OK);
        for (int t = 1; t <= 5; t++) {
            random_fill(g, N, 100 + (uint64_t)t, t == 3 ? 1e-3f : 1.0f);
            uint16_t h_want[N];
            const float c1 = (float)(1.0 / (1.0 - pow(c.beta1, t)));
            const float c2 = (float)(1.0 / (1.0 - pow(c.beta2, t)));
            const uint32_t key = master_key(c.seed, (uint64_t)t);
            for (int i = 0; i < N; i++) {
                float mo = o.m ? o.m[i] : widen(o.m16[i]);
                float vo = o.v ? o.v[i] : widen(o.v16[i]);
                float mi = c.beta1 * mo + (1.0f - c.beta1) * g[i];
                float vi = c.beta2 * vo + (1.0f - c.beta2) * g[i] * g[i];
                float shrink = i < 200 ? 1.0f - c.lr * c.weight_decay : 1.0f;
                float w = covered(i) ? widen(half[i]) : p[i];
                want[i] = w * shrink - c.lr * (mi * c1) / (sqrtf(vi * c2) + c.eps);
                h_want[i] = covered(i) ? stochastic_bf16(want[i], lowbias32((uint32_t)i ^ key))
                                       : half[i];
            }
            st_optim_update_copies(&o, p, g, segs, 2, 0, N, (uint64_t)t, c.lr, copies, 3);
            for (int i = 0; i < N; i++) {
                cr_assert_eq(half[i], h_want[i], "%s moments, step %d element %d: master "
                             "%#x, want %#x (%.9g in fp32)", st_moments_name(kinds[k]), t, i,
                             half[i], h_want[i], want[i]);
                if (covered(i))
                    cr_assert(isnan(p[i]), "element %d: the fp32 vector was written", i);
                else
                    cr_assert_eq(bits(p[i]), bits(want[i]), "step %d element %d: %.9g, want "
                                 "%.9g", t, i, p[i], want[i]);
            }
        }
        st_arena_release(&a);
    }
}

/* The master cut into shards, each updated by its owner (the engine's
 * layout): the same bits as the copies updated whole, and the fp32
 * vector under the copies neither read nor written (NaN stays NaN). */
Test(master, sharded_updates_equal_the_copy_alone)
{
    float ref[N], sharded[N], g[N];
    uint16_t h_ref[N], h_shard[N];
    st_param_copy c_ref[3], c_shard[3];
    copies_of(h_ref, c_ref);
    copies_of(h_shard, c_shard);
    random_fill(ref, N, 5, 1.0f);
    for (int i = 0; i < N; i++) {
        h_ref[i] = h_shard[i] = nearest_bf16(ref[i]);
        sharded[i] = covered(i) ? NAN : ref[i];
    }
    st_optim_config c = config(ST_MOMENTS_BF16_SR);
    st_arena a;
    st_arena_init(&a, "optim", NULL, 0);
    st_optim whole, shard[3];
    const size_t cuts[] = { 0, 77, 201, N };
    cr_assert_eq(st_optim_init(&whole, &c, N, &a), ST_OK);
    for (int s = 0; s < 3; s++)
        cr_assert_eq(st_optim_init_range(&shard[s], &c, cuts[s], cuts[s + 1], &a), ST_OK);
    for (int t = 1; t <= 4; t++) {
        random_fill(g, N, 60 + (uint64_t)t, 1.0f);
        st_optim_update_copies(&whole, ref, g, segs, 2, 0, N, (uint64_t)t, 1e-2f, c_ref, 3);
        for (int s = 0; s < 3; s++)
            st_optim_update_copies(&shard[s], sharded + cuts[s], g + cuts[s], segs, 2, cuts[s],
                                   cuts[s + 1], (uint64_t)t, 1e-2f, c_shard, 3);
    }
    for (int i = 0; i < N; i++) {
        if (!covered(i)) {
            cr_assert_eq(bits(sharded[i]), bits(ref[i]), "element %d (fp32 master)", i);
            continue;
        }
        cr_assert_eq(h_shard[i], h_ref[i], "element %d: sharded %#x, whole %#x", i, h_shard[i],
                     h_ref[i]);
        cr_assert(isnan(sharded[i]), "element %d: the fp32 vector was written", i);
    }
    st_arena_release(&a);
}

/* Weights of 1 (bf16 exact) updated by 1e-4 a step, far below half a
 * bf16 step at 1 (2^-8): rounded to nearest each step rounds back to 1
 * and the update vanishes; rounded stochastically the mean over many
 * elements follows the fp32 weight. */
Test(master, small_updates_do_not_vanish)
{
    enum { M = 4096, STEPS = 50 };
    static float p[M], g[M], fp32[M];
    static uint16_t h[M], nearest[M];
    const st_param_segment seg = { .name = "w", .offset = 0, .count = M, .decay = 0 };
    const st_param_copy copy = { 0, M, h };
    st_optim_config c = config(ST_MOMENTS_FP32);
    st_optim_config f = c;
    f.master = ST_MASTER_FP32;
    for (int i = 0; i < M; i++) {
        fp32[i] = 1.0f;
        h[i] = nearest[i] = nearest_bf16(1.0f);
        g[i] = 1.0f;   /* m / sqrt(v) = 1 after bias correction: each step is -lr */
    }
    st_arena a;
    st_arena_init(&a, "optim", NULL, 0);
    st_optim o, ref;
    cr_assert_eq(st_optim_init(&o, &c, M, &a), ST_OK);
    cr_assert_eq(st_optim_init(&ref, &f, M, &a), ST_OK);
    for (uint64_t t = 1; t <= STEPS; t++) {
        st_optim_update_copies(&o, p, g, &seg, 1, 0, M, t, 1e-4f, &copy, 1);
        /* rounded to nearest: the fp32 step from the stored value */
        for (int i = 0; i < M; i++) {
            float w = widen(nearest[i]);
            nearest[i] = nearest_bf16(w - 1e-4f * 0.99f);
        }
        st_optim_update(&ref, fp32, g, &seg, 1, 0, M, t, 1e-4f);
    }
    double mean = 0.0, want = 0.0;
    int at_one = 0;
    for (int i = 0; i < M; i++) {
        mean += widen(h[i]) / M;
        want += fp32[i] / (double)M;
        at_one += nearest[i] == nearest_bf16(1.0f);
    }
    cr_assert_eq(at_one, M, "rounded to nearest, every weight stays at 1");
    cr_assert_lt(fabs(want - (1.0 - STEPS * 1e-4)), 1e-5, "fp32: %.9g", want);
    /* each rounding errs by at most a bf16 step below 1 (2^-8), a sum of
     * STEPS independent ones per element: a few standard errors of it */
    cr_assert_lt(fabs(mean - want), 4.0 * 0x1p-8 * sqrt((double)STEPS / M),
                 "mean of the bf16 master %.9g, fp32 %.9g", mean, want);
    cr_assert_lt(mean, 1.0 - 0.5 * STEPS * 1e-4, "the update did not vanish (%.9g)", mean);
    st_arena_release(&a);
}

/* Bytes a parameter: the copy read and written instead of the fp32
 * master; 16 with bf16 moments. */
Test(master, bytes_per_parameter)
{
    st_optim_config c = config(ST_MOMENTS_BF16_SR);
    cr_assert_eq(st_optim_bytes_per_param(&c, 1), 16);
    cr_assert_eq(st_optim_bytes_per_param(&c, 0), 20, "no copy: an fp32 master");
    c.moments = ST_MOMENTS_FP32;
    cr_assert_eq(st_optim_bytes_per_param(&c, 1), 24);
    c.moments = ST_MOMENTS_BF16;
    float p[N], g[N];
    uint16_t half[N];
    st_param_copy copies[3];
    copies_of(half, copies);
    random_fill(p, N, 1, 1.0f);
    random_fill(g, N, 2, 1.0f);
    st_bf16_round_n(half, p, N);
    st_arena a;
    st_arena_init(&a, "optim", NULL, 0);
    st_optim o;
    cr_assert_eq(st_optim_init(&o, &c, N, &a), ST_OK);
    st_optim_update_copies(&o, p, g, segs, 2, 0, N, 1, 1e-3f, copies, 3);
    cr_assert_eq(o.updated, N);
    cr_assert_eq(o.update_bytes, 190 * 16 + 110 * 20, "190 covered, 110 not: %zu",
                 o.update_bytes);
    st_arena_release(&a);
}

Test(master, names_round_trip_and_bad_values_are_refused)
{
    st_master m;
    cr_assert_eq(st_master_parse("bf16-sr", &m), ST_OK);
    cr_assert_eq(m, ST_MASTER_BF16_SR);
    cr_assert_str_eq(st_master_name(ST_MASTER_FP32), "fp32");
    cr_assert_neq(st_master_parse("bf16", &m), ST_OK);
    st_optim_config c = config(ST_MOMENTS_BF16);
    c.kind = ST_OPT_SGD;
    cr_assert_neq(st_optim_config_check(&c), ST_OK, "SGD has no bf16 master");
    c.kind = ST_OPT_ADAMW;
    c.master = (st_master)7;
    cr_assert_neq(st_optim_config_check(&c), ST_OK);
}

/* Local SGD's draws (doc/precision.md): a replica's update keyed by the
 * run's step and the worker, the split of the step's stream by the
 * worker, so that workers draw apart; the average of the replicas rounded
 * stochastically with a key of its own (stream 0x3A57A7 split by the
 * step) and the element's index, whatever the pieces it is cut into, and
 * unbiased where rounding to nearest is not. */
Test(master, local_sgd_draws_its_own_keys_and_rounds_averages_stochastically)
{
    enum { M = 4096 };
    st_rng root = st_rng_seed(11), mine = st_rng_split(&root, 0x3A57E4ull);
    st_rng step = st_rng_split(&mine, 9), own = st_rng_split(&step, 1);
    cr_assert_eq(st_master_replica_key(11, 9, 1), (uint32_t)st_rng_u64(&own));
    cr_assert_neq(st_master_replica_key(11, 9, 0), st_master_replica_key(11, 9, 1));
    cr_assert_neq(st_master_replica_key(11, 9, 0), master_key(11, 9));
    root = st_rng_seed(11);
    mine = st_rng_split(&root, 0x3A57A7ull);
    step = st_rng_split(&mine, 9);
    const uint32_t key = (uint32_t)st_rng_u64(&step);
    cr_assert_eq(st_master_average_key(11, 9), key);
    cr_assert_neq(key, master_key(11, 9));

    /* a worker's update draws its own key: the same state and gradient
     * give other roundings on worker 2 than on worker 1 */
    static float p[M], g[M];
    static uint16_t h[3][M];
    const st_param_segment seg = { .name = "w", .offset = 0, .count = M, .decay = 0 };
    st_optim_config c = config(ST_MOMENTS_FP32);
    st_arena a;
    st_arena_init(&a, "optim", NULL, 0);
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < M; i++) {
            h[k][i] = nearest_bf16(1.0f + (float)i / M);
            g[i] = 0.5f - (float)(i % 7) / 7.0f;
        }
        const st_param_copy copy = { 0, M, h[k] };
        st_optim o;
        cr_assert_eq(st_optim_init(&o, &c, M, &a), ST_OK);
        o.master_worker = k == 2 ? 2 : 1;
        o.master_step = 9;
        st_optim_update_copies(&o, p, g, &seg, 1, 0, M, 1, 1e-3f, &copy, 1);
    }
    int apart = 0;
    for (int i = 0; i < M; i++) {
        cr_assert_eq(h[0][i], h[1][i], "element %d: worker 1 twice, %#x and %#x", i, h[0][i],
                     h[1][i]);
        cr_assert_leq(abs((int)h[2][i] - (int)h[0][i]), 1, "element %d: a bf16 step apart", i);
        apart += h[2][i] != h[0][i];
    }
    cr_assert_gt(apart, M / 20, "workers 1 and 2 round alike (%d of %d apart)", apart, M);

    /* the average's rounding: the documented draw, in pieces as whole */
    static float x[M];
    static uint16_t whole[M], cut[M];
    double mean = 0.0;
    for (int i = 0; i < M; i++)
        x[i] = 1.0f + 0.3f * 0x1p-7f;   /* 0.3 of a bf16 step above 1 */
    st_master_round_sr(whole, x, M, key, 100);
    st_master_round_sr(cut, x, 1000, key, 100);
    st_master_round_sr(cut + 1000, x + 1000, M - 1000, key, 1100);
    for (int i = 0; i < M; i++) {
        const uint16_t want = stochastic_bf16(x[i], lowbias32((uint32_t)(100 + i) ^ key));
        cr_assert_eq(whole[i], want, "element %d: %#x, want %#x", i, whole[i], want);
        cr_assert_eq(cut[i], whole[i], "element %d: cut %#x, whole %#x", i, cut[i], whole[i]);
        mean += widen(whole[i]) / M;
    }
    /* each rounding errs by at most a bf16 step (2^-7 above 1) */
    cr_assert_lt(fabs(mean - x[0]), 4.0 * 0x1p-7 / sqrt((double)M),
                 "mean of the rounded averages %.9g, the average %.9g", mean, x[0]);
    st_arena_release(&a);
}

/*
 * tests/test_optim.c — SGD and AdamW against double-precision references,
 * range (shard) updates, weight-decay masking, learning-rate schedules.
 */
#include <math.h>
#include <string.h>

#include <criterion/criterion.h>

#include <subtrain/optim.h>
#include <subtrain/rng.h>

#include "core/arena_impl.h"
#include "optim/optim_impl.h"

enum { N = 300, STEPS = 20 };

/* Two segments: a decayed "weight" [0, 200) and an undecayed "bias". */
static const st_param_segment segs[2] = {
    { .name = "w", .offset = 0, .count = 200, .decay = 1 },
    { .name = "b", .offset = 200, .count = 100, .decay = 0 },
};

static void random_fill(float *x, size_t n, uint64_t stream)
{
    st_rng r = st_rng_seed(stream);
    for (size_t i = 0; i < n; i++)
        x[i] = st_rng_normal(&r);
}

/* Float results against a double reference: relative 1e-5 covers float
 * rounding over 20 steps; a wrong formula (e.g. no bias correction, decay
 * applied to the bias) is off by orders of magnitude more. */
static void assert_close(const float *got, const double *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        cr_assert_leq(fabs(got[i] - want[i]), 1e-5 * (1.0 + fabs(want[i])),
                      "element %zu: got %.9g want %.9g", i, got[i], want[i]);
}

static void run_reference(const st_optim_config *c, double *p, const float grads[STEPS][N])
{
    static double m[N], v[N];
    memset(m, 0, sizeof m);
    memset(v, 0, sizeof v);
    for (int t = 1; t <= STEPS; t++) {
        for (int i = 0; i < N; i++) {
            double g = grads[t - 1][i], wd = i < 200 ? c->weight_decay : 0.0;
            if (c->kind == ST_OPT_SGD) {
                g += wd * p[i];
                m[i] = c->momentum * m[i] + g;
                p[i] -= c->lr * (c->momentum > 0 ? m[i] : g);
            } else {
                p[i] *= 1.0 - c->lr * wd;
                m[i] = c->beta1 * m[i] + (1 - c->beta1) * g;
                v[i] = c->beta2 * v[i] + (1 - c->beta2) * g * g;
                double mh = m[i] / (1 - pow(c->beta1, t)), vh = v[i] / (1 - pow(c->beta2, t));
                p[i] -= c->lr * mh / (sqrt(vh) + c->eps);
            }
        }
    }
}

static void check_against_reference(st_optim_config c)
{
    static float grads[STEPS][N];
    float p[N];
    double ref[N];
    for (int t = 0; t < STEPS; t++)
        random_fill(grads[t], N, 100 + (uint64_t)t);
    random_fill(p, N, 1);
    for (int i = 0; i < N; i++)
        ref[i] = p[i];

    /* through the public API: an arena and an optimizer created */
    st_arena *a;
    cr_assert_eq(st_arena_create("optim", NULL, 0, &a), ST_OK);
    st_optim *o;
    cr_assert_eq(st_optim_create(&c, 0, N, a, &o), ST_OK);
    for (int t = 1; t <= STEPS; t++)
        st_optim_update(o, p, grads[t - 1], segs, 2, 0, N, (uint64_t)t, c.lr);
    run_reference(&c, ref, grads);
    assert_close(p, ref, N);
    st_optim_destroy(o);
    st_arena_destroy(a);
}

Test(optim, sgd_plain_matches_reference)
{
    st_optim_config c = st_optim_config_default();
    c.kind = ST_OPT_SGD;
    c.momentum = 0.0f;
    c.lr = 0.05f;
    c.weight_decay = 0.1f;
    check_against_reference(c);
}

Test(optim, sgd_momentum_matches_reference)
{
    st_optim_config c = st_optim_config_default();
    c.kind = ST_OPT_SGD;
    c.momentum = 0.9f;
    c.lr = 0.01f;
    c.weight_decay = 5e-4f;
    check_against_reference(c);
}

Test(optim, adamw_matches_reference)
{
    st_optim_config c = st_optim_config_default();
    c.lr = 3e-3f;
    c.weight_decay = 0.05f;
    check_against_reference(c);
}

Test(optim, state_is_counted_as_optimizer_memory)
{
    st_arena a;
    st_arena_init(&a, "optim", NULL, 0);
    st_optim o;
    st_optim_config c = st_optim_config_default();
    cr_assert_eq(st_optim_init(&o, &c, 1000, &a), ST_OK);
    cr_assert_eq(a.stats.current[ST_MEM_OPTIMIZER], 2 * 4032); /* m and v, 64-aligned */
    st_arena_release(&a);
    st_arena_init(&a, "optim", NULL, 0);
    c.kind = ST_OPT_SGD;
    c.momentum = 0.0f;
    cr_assert_eq(st_optim_init(&o, &c, 1000, &a), ST_OK);
    cr_assert_eq(a.stats.current[ST_MEM_OPTIMIZER], 0, "plain SGD keeps no state");
    st_arena_release(&a);
}

/* A created optimizer holds the state of its range only, from the arena;
 * a refused configuration creates none. */
Test(optim, created_optimizer_holds_its_range_in_the_arena)
{
    st_arena *a;
    cr_assert_eq(st_arena_create("optim", NULL, 0, &a), ST_OK);
    st_optim_config c = st_optim_config_default();
    st_optim *o = NULL;
    cr_assert_eq(st_optim_create(&c, 1000, 2000, a, &o), ST_OK);
    cr_assert_eq(st_arena_stats(a).current[ST_MEM_OPTIMIZER], 2 * 4032, "m and v of 1000");
    st_optim_destroy(o);
    c.lr = -1.0f;
    o = (st_optim *)1;   /* overwritten: NULL */
    cr_assert_eq(st_optim_create(&c, 0, 10, a, &o), ST_ERR_INVALID);
    cr_assert_null(o);
    st_optim_destroy(NULL);
    st_arena_destroy(a);
}

/* Updating the vector shard by shard (as shard owners will) is bitwise the
 * same as updating it whole, and a range update touches nothing else. */
Test(optim, shard_updates_equal_a_whole_update)
{
    float whole[N], sharded[N], g[N];
    random_fill(whole, N, 5);
    random_fill(g, N, 6);
    memcpy(sharded, whole, sizeof whole);
    st_arena a;
    st_arena_init(&a, "optim", NULL, 0);
    st_optim_config c = st_optim_config_default();
    st_optim o1, o2;
    cr_assert_eq(st_optim_init(&o1, &c, N, &a), ST_OK);
    cr_assert_eq(st_optim_init(&o2, &c, N, &a), ST_OK);
    for (int t = 1; t <= 3; t++) {
        st_optim_update(&o1, whole, g, segs, 2, 0, N, (uint64_t)t, 1e-2f);
        const size_t cuts[] = { 0, 77, 201, N }; /* one cut inside each segment */
        for (int s = 0; s < 3; s++)
            st_optim_update(&o2, sharded, g, segs, 2, cuts[s], cuts[s + 1], (uint64_t)t, 1e-2f);
    }
    cr_assert_arr_eq(whole, sharded, sizeof whole);

    float before[N];
    memcpy(before, sharded, sizeof before);
    st_optim_update(&o2, sharded, g, segs, 2, 50, 60, 4, 1e-2f);
    for (int i = 0; i < N; i++)
        if (i < 50 || i >= 60)
            cr_assert_eq(sharded[i], before[i], "element %d outside the range changed", i);
        else
            cr_assert_neq(sharded[i], before[i]);
    st_arena_release(&a);
}

/* The bf16 weight copies the update writes (st_optim_update_copies): the
 * fp32 values bitwise those of the plain update, each covered element's
 * copy the nearest bf16 (ties to even) of its new value, computed here
 * from the bits, and nothing outside the copies written.  The copies
 * start inside a segment, span the cut between the two, and leave gaps;
 * the update is also cut into ranges (a shard owner's). */
static uint16_t nearest_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t lower = u & 0xffffu, up = u >> 16;
    if (lower > 0x8000u || (lower == 0x8000u && (up & 1u)))
        up++;
    return (uint16_t)up;
}

static void check_copies(st_optim_config c)
{
    float plain[N], with[N], g[N];
    uint16_t half[N];
    random_fill(plain, N, 7);
    random_fill(g, N, 8);
    memcpy(with, plain, sizeof plain);
    for (int i = 0; i < N; i++)
        half[i] = 0xdeadu;
    const st_param_copy copies[] = {
        { 10, 90, half + 10 },     /* inside the first segment */
        { 150, 100, half + 150 },  /* across the cut at 200 */
        { 270, 30, half + 270 },   /* the end of the second */
    };
    st_arena a;
    st_arena_init(&a, "optim", NULL, 0);
    st_optim o1, o2;
    cr_assert_eq(st_optim_init(&o1, &c, N, &a), ST_OK);
    cr_assert_eq(st_optim_init(&o2, &c, N, &a), ST_OK);
    for (int t = 1; t <= 3; t++) {
        st_optim_update(&o1, plain, g, segs, 2, 0, N, (uint64_t)t, 1e-2f);
        const size_t cuts[] = { 0, 50, 230, N }; /* each inside a copy */
        for (int s = 0; s < 3; s++)
            st_optim_update_copies(&o2, with, g, segs, 2, cuts[s], cuts[s + 1], (uint64_t)t,
                                   1e-2f, copies, 3);
    }
    cr_assert_arr_eq(plain, with, sizeof plain, "the fp32 values are the plain update's");
    for (int i = 0; i < N; i++) {
        int covered = (i >= 10 && i < 100) || (i >= 150 && i < 250) || i >= 270;
        if (covered)
            cr_assert_eq(half[i], nearest_bf16(with[i]), "element %d: copy %#x of %.9g", i,
                         half[i], with[i]);
        else
            cr_assert_eq(half[i], 0xdeadu, "element %d is in no copy but was written", i);
    }
    st_arena_release(&a);
}

Test(optim, adamw_writes_the_bf16_copies)
{
    check_copies(st_optim_config_default());
}

Test(optim, sgd_writes_the_bf16_copies)
{
    st_optim_config c = st_optim_config_default();
    c.kind = ST_OPT_SGD;
    check_copies(c);
    c.momentum = 0.0f;
    check_copies(c);
}

Test(optim, reset_clears_state)
{
    st_arena a;
    st_arena_init(&a, "optim", NULL, 0);
    st_optim_config c = st_optim_config_default();
    st_optim o;
    float p[N], g[N];
    random_fill(p, N, 1);
    random_fill(g, N, 2);
    cr_assert_eq(st_optim_init(&o, &c, N, &a), ST_OK);
    st_optim_update(&o, p, g, segs, 2, 0, N, 1, 1e-3f);
    st_optim_reset(&o);
    for (int i = 0; i < N; i++)
        cr_assert(o.m[i] == 0.0f && o.v[i] == 0.0f);
    st_arena_release(&a);
}

Test(optim, adamw_minimises_a_quadratic)
{
    /* f(p) = 1/2 sum_i (i+1) (p_i - 1)^2, gradient (i+1)(p_i - 1). */
    enum { M = 16 };
    float p[M] = { 0 }, g[M];
    st_param_segment seg = { .name = "p", .offset = 0, .count = M, .decay = 0 };
    st_arena a;
    st_arena_init(&a, "optim", NULL, 0);
    st_optim_config c = st_optim_config_default();
    c.lr = 0.05f;
    st_optim o;
    cr_assert_eq(st_optim_init(&o, &c, M, &a), ST_OK);
    for (int t = 1; t <= 2000; t++) {
        for (int i = 0; i < M; i++)
            g[i] = (float)(i + 1) * (p[i] - 1.0f);
        st_optim_update(&o, p, g, &seg, 1, 0, M, (uint64_t)t, c.lr * (1.0f - (float)t / 2001.0f));
    }
    for (int i = 0; i < M; i++)
        cr_assert_lt(fabsf(p[i] - 1.0f), 1e-3f, "p[%d] = %g", i, p[i]);
    st_arena_release(&a);
}

Test(optim, bad_configs_are_refused_with_a_message)
{
    st_optim_config good = st_optim_config_default(), c;
    cr_assert_eq(st_optim_config_check(&good), ST_OK);
    c = good; c.lr = 0.0f;
    cr_assert_eq(st_optim_config_check(&c), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "learning rate"));
    c = good; c.lr = NAN;
    cr_assert_eq(st_optim_config_check(&c), ST_ERR_INVALID);
    c = good; c.momentum = 1.0f;
    cr_assert_eq(st_optim_config_check(&c), ST_ERR_INVALID);
    c = good; c.weight_decay = -1.0f;
    cr_assert_eq(st_optim_config_check(&c), ST_ERR_INVALID);
    c = good; c.beta2 = 1.0f;
    cr_assert_eq(st_optim_config_check(&c), ST_ERR_INVALID);
    c = good; c.kind = (st_optimizer_kind)7;
    cr_assert_eq(st_optim_config_check(&c), ST_ERR_INVALID);
}

Test(optim, names_round_trip)
{
    st_optimizer_kind k;
    cr_assert_eq(st_optimizer_parse("sgd", &k), ST_OK);
    cr_assert_eq(k, ST_OPT_SGD);
    cr_assert_str_eq(st_optimizer_name(ST_OPT_ADAMW), "adamw");
    cr_assert_eq(st_optimizer_parse("adam", &k), ST_ERR_INVALID);
    st_schedule_kind s;
    cr_assert_eq(st_schedule_parse("cosine", &s), ST_OK);
    cr_assert_eq(s, ST_SCHED_WARMUP_COSINE);
    cr_assert_eq(st_schedule_parse("linear", &s), ST_ERR_INVALID);
}

/* ------------------------------------------------------------ schedules */

Test(schedule, constant_is_constant)
{
    st_schedule s = { ST_SCHED_CONSTANT, 0.1f, 0, 100 };
    for (uint64_t t = 1; t <= 200; t++)
        cr_assert_eq(st_schedule_lr(&s, t), 0.1f);
}

Test(schedule, warmup_then_cosine_to_zero)
{
    st_schedule s = { ST_SCHED_WARMUP_COSINE, 1.0f, 10, 110 };
    cr_assert_float_eq(st_schedule_lr(&s, 1), 0.1f, 1e-7);
    cr_assert_float_eq(st_schedule_lr(&s, 5), 0.5f, 1e-7);
    cr_assert_float_eq(st_schedule_lr(&s, 10), 1.0f, 1e-7);
    cr_assert_float_eq(st_schedule_lr(&s, 60), 0.5f, 1e-6);   /* half way: cos(pi/2) */
    cr_assert_float_eq(st_schedule_lr(&s, 110), 0.0f, 1e-7);
    float prev = 2.0f;
    for (uint64_t t = 11; t <= 110; t++) {
        float lr = st_schedule_lr(&s, t);
        cr_assert_lt(lr, prev, "the decay is strictly decreasing (step %llu)", (unsigned long long)t);
        prev = lr;
    }
    st_schedule nowarm = { ST_SCHED_WARMUP_COSINE, 1.0f, 0, 100 };
    cr_assert_lt(st_schedule_lr(&nowarm, 1), 1.0f);
    cr_assert_gt(st_schedule_lr(&nowarm, 1), 0.999f);
}

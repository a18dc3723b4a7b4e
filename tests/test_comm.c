/*
 * tests/test_comm.c — the reduction engine: results against a sequential
 * reference (bitwise, in the engine's fixed order, and against a double
 * sum), all-gather into replicas, determinism under artificial delays,
 * abort, byte accounting, the printed description (against the text of
 * the engine before its split), the table of backends and what the public
 * functions check before forwarding to one, attach validation.
 *
 * Every test runs its workers as one OpenMP parallel region with one thread
 * per worker, as the trainer does; more threads than cores is fine (the
 * barrier yields when it waits long).  Assertions are made on the main
 * thread after the region: the workers only record what they saw.
 */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <omp.h>
#include <criterion/criterion.h>

#include <subtrain/comm.h>
#include <subtrain/rng.h>
#include <subtrain/world.h>

#define MAXW 8
#define STEPS 3

static const float SENTINEL = -777.0f;

/* The payload of the engines rig_init creates, and where bf16 is rounded
 * (the bf16 tests set them, then put them back). */
static st_comm_payload g_payload = ST_COMM_PAYLOAD_FP32;
static st_comm_bf16_at g_bf16_at = ST_COMM_BF16_BUFFER;

/* An fp32 rounded to bf16 (nearest even) and widened back, computed here
 * independently of the engine. */
static float bf16_round(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return f;
    uint32_t lsb = (u >> 16) & 1u;
    u = (u + 0x7fffu + lsb) & 0xffff0000u;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ------------------------------------------------------------ the rig */

typedef struct rig {
    int n;
    size_t p;
    const int *domain_of;
    st_comm *c;
    st_arena arena[MAXW];
    float *grads[MAXW], *params[MAXW];
    float *init[MAXW];             /* params as given to attach */
    unsigned char *mask[MAXW];     /* element held by worker w */
    st_range *held[MAXW];
    int n_held[MAXW];
} rig;

typedef struct run_out {
    int threads[MAXW];
    st_status attach[MAXW], rs[MAXW], ag[MAXW];
    char msg[MAXW][256];
    long bad_params[MAXW];         /* replica mismatches seen after all-gathers */
    long changed[MAXW];            /* shard gradients differing from the first step's */
    float *init_master;            /* p: master shards right after attach */
    float *means;                  /* steps x p: shard gradients of each step */
} run_out;

static int domain(const rig *r, int w)
{
    return r->domain_of ? r->domain_of[w] : 0;
}

/* Random holder masks: runs of random length (short ones and long ones),
 * each held by a random subset of the workers (never none); dp: everyone
 * holds everything.  Ranges are the masks' runs, sometimes split in two
 * adjacent ranges. */
static void rig_masks(rig *r, uint64_t seed, int dp)
{
    st_rng rng = st_rng_seed(seed);
    for (int w = 0; w < r->n; w++)
        r->mask[w] = calloc(r->p, 1);
    size_t i = 0;
    while (i < r->p) {
        size_t len = 1 + (st_rng_below(&rng, 4) == 0 ? st_rng_below(&rng, (uint32_t)(r->p / 2 + 1))
                                                      : st_rng_below(&rng, 40));
        if (len > r->p - i)
            len = r->p - i;
        int any = 0;
        for (int w = 0; w < r->n; w++) {
            int bit = dp || st_rng_below(&rng, 2);
            memset(r->mask[w] + i, bit, len);
            any |= bit;
        }
        if (!any)
            memset(r->mask[st_rng_below(&rng, (uint32_t)r->n)] + i, 1, len);
        i += len;
    }
    for (int w = 0; w < r->n; w++) {
        r->held[w] = malloc((2 * r->p + 1) * sizeof *r->held[w]);
        int k = 0;
        for (size_t a = 0; a < r->p;) {
            if (!r->mask[w][a]) {
                a++;
                continue;
            }
            size_t b = a;
            while (b < r->p && r->mask[w][b])
                b++;
            if (b - a >= 2 && st_rng_below(&rng, 3) == 0) {
                size_t mid = a + 1 + st_rng_below(&rng, (uint32_t)(b - a - 1));
                r->held[w][k++] = (st_range){ a, mid };
                r->held[w][k++] = (st_range){ mid, b };
            } else {
                r->held[w][k++] = (st_range){ a, b };
            }
            a = b;
        }
        r->n_held[w] = k;
    }
}

static void rig_init(rig *r, int n, size_t p, const int *domain_of, uint64_t seed, int dp)
{
    memset(r, 0, sizeof *r);
    r->n = n;
    r->p = p;
    r->domain_of = domain_of;
    st_comm_config cfg = { .n_workers = n, .n_params = p, .domain_of = domain_of, .roles = 0,
                           .payload = g_payload, .bf16_at = g_bf16_at };
    cr_assert_eq(st_comm_create(&cfg, &r->c), ST_OK, "create: %s", st_last_error());
    rig_masks(r, seed, dp);
    st_rng rng = st_rng_seed(seed ^ 0x5eed);
    for (int w = 0; w < n; w++) {
        st_arena_init(&r->arena[w], "worker", NULL, 0);
        r->grads[w] = malloc(p * sizeof(float));
        r->params[w] = malloc(p * sizeof(float));
        for (size_t i = 0; i < p; i++) {
            r->grads[w][i] = NAN;
            r->params[w][i] = r->mask[w][i] ? st_rng_normal(&rng) : SENTINEL;
        }
        r->init[w] = malloc(p * sizeof(float));
        memcpy(r->init[w], r->params[w], p * sizeof(float));
    }
}

static void rig_free(rig *r)
{
    st_comm_destroy(r->c);
    for (int w = 0; w < r->n; w++) {
        st_arena_release(&r->arena[w]);
        free(r->grads[w]);
        free(r->params[w]);
        free(r->init[w]);
        free(r->mask[w]);
        free(r->held[w]);
    }
}

static void out_init(run_out *o, const rig *r, int steps)
{
    memset(o, 0, sizeof *o);
    o->init_master = calloc(r->p, sizeof(float));
    o->means = calloc((size_t)steps * r->p, sizeof(float));
}

static void out_free(run_out *o)
{
    free(o->init_master);
    free(o->means);
}

/* ------------------------------------------------------------ one run */

/* Gradients of worker w for a step: normal values where w holds the
 * element, NaN elsewhere (an engine that read them would show it). */
static void fill_grads(rig *r, int w, uint64_t step)
{
    st_rng root = st_rng_seed(1000 + step);
    st_rng g = st_rng_split(&root, (uint64_t)w);
    for (size_t i = 0; i < r->p; i++) {
        float v = st_rng_normal(&g);
        r->grads[w][i] = r->mask[w][i] ? v : NAN;
    }
}

static void spin(uint32_t iters)
{
    volatile uint32_t x = 0;
    for (uint32_t i = 0; i < iters; i++)
        x = x + 1;
}

static int owner_of(const st_comm *c, int n, size_t i)
{
    for (int v = 0; v < n; v++) {
        st_range s = st_comm_shard(c, v);
        if (i >= s.begin && i < s.end)
            return v;
    }
    return -1;
}

static int same_bits(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

/* Attach, then `steps` steps: gradients, reduce-scatter, the owner's
 * "update" master -= 0.25 x mean, all-gather, and a check of the replica
 * against every owner's master.  same_grads: every step reduces the same
 * gradients and does not update (determinism); delays: every worker spins
 * a random while before each collective. */
static void run_rig(rig *r, int steps, int same_grads, int delays, run_out *o)
{
#pragma omp parallel num_threads(r->n)
    {
        int w = omp_get_thread_num();
        o->threads[w] = omp_get_num_threads();
        if (o->threads[w] == r->n) {
            st_status s = st_comm_attach(r->c, w, &r->arena[w], r->grads[w], r->params[w],
                                         r->held[w], r->n_held[w]);
            o->attach[w] = s;
            if (s != ST_OK)
                snprintf(o->msg[w], sizeof o->msg[w], "%s", st_last_error());
            st_range sh = st_comm_shard(r->c, w);
            size_t len = sh.end - sh.begin;
            float *mp = st_comm_shard_params(r->c, w), *sg = st_comm_shard_grads(r->c, w);
            if (s == ST_OK)
                memcpy(o->init_master + sh.begin, mp, len * sizeof(float));
            st_rng dr = st_rng_seed(77 + (uint64_t)w * 1000003u + (uint64_t)steps);
            for (int t = 0; t < steps && s == ST_OK; t++) {
                if (t == 0 || !same_grads)
                    fill_grads(r, w, (uint64_t)t);
                if (delays)
                    spin(st_rng_below(&dr, 200000));
                s = o->rs[w] = st_comm_reduce_scatter(r->c, w);
                if (s != ST_OK)
                    break;
                float *m = o->means + (same_grads ? 0 : (size_t)t) * r->p;
                if (same_grads && t > 0) {
                    for (size_t j = 0; j < len; j++)
                        o->changed[w] += !same_bits(m[sh.begin + j], sg[j]);
                } else {
                    memcpy(m + sh.begin, sg, len * sizeof(float));
                }
                if (!same_grads)
                    for (size_t j = 0; j < len; j++)
                        mp[j] = mp[j] - 0.25f * sg[j];
                if (delays)
                    spin(st_rng_below(&dr, 200000));
                s = o->ag[w] = st_comm_all_gather(r->c, w);
                if (s != ST_OK)
                    break;
                for (size_t i = 0; i < r->p; i++) {
                    if (r->mask[w][i]) {
                        int v = owner_of(r->c, r->n, i);
                        float want = st_comm_shard_params(r->c, v)[i - st_comm_shard(r->c, v).begin];
                        o->bad_params[w] += !same_bits(r->params[w][i], want);
                    } else {
                        o->bad_params[w] += !same_bits(r->params[w][i], SENTINEL);
                    }
                }
            }
        }
    }
}

/* The mean of element i in the engine's documented order: within a domain
 * the holders in increasing worker order, then the domain partials in
 * increasing domain order, then / count.  g[w] are the step's gradients. */
static float ref_mean(const rig *r, float *const *g, size_t i, double *dmean, double *abs_sum)
{
    float total = 0.0f;
    int have_total = 0, count = 0;
    double dsum = 0.0, asum = 0.0;
    for (int w = 0; w < r->n;) {
        int d = domain(r, w), have = 0;
        float part = 0.0f;
        for (; w < r->n && domain(r, w) == d; w++) {
            if (!r->mask[w][i])
                continue;
            part = have ? part + g[w][i] : g[w][i];
            have = 1;
            count++;
            dsum += g[w][i];
            asum += fabs(g[w][i]);
        }
        if (have) {
            total = have_total ? total + part : part;
            have_total = 1;
        }
    }
    *dmean = dsum / count;
    *abs_sum = asum / count;
    return count > 1 ? total / (float)count : total;
}

/* Runs one configuration for `steps` steps (with random delays before each
 * collective if `delays`) and checks everything against the reference. */
static void check_run(int n, size_t p, const int *domain_of, uint64_t seed, int dp, int steps,
                      int delays)
{
    rig r;
    run_out o;
    rig_init(&r, n, p, domain_of, seed, dp);
    out_init(&o, &r, steps);
    run_rig(&r, steps, 0, delays, &o);
    for (int w = 0; w < n; w++) {
        cr_assert_eq(o.threads[w], n, "OpenMP gave %d threads, not %d", o.threads[w], n);
        cr_assert_eq(o.attach[w], ST_OK, "n=%d p=%zu worker %d attach: %s", n, p, w, o.msg[w]);
        cr_assert_eq(o.rs[w], ST_OK);
        cr_assert_eq(o.ag[w], ST_OK);
        cr_assert_eq(o.bad_params[w], 0, "n=%d p=%zu seed=%llu: worker %d has %ld replica "
                     "elements differing from the masters or touched outside its ranges", n, p,
                     (unsigned long long)seed, w, o.bad_params[w]);
    }
    /* the master starts as the first holder's parameters */
    float *master = malloc(p * sizeof(float));
    for (size_t i = 0; i < p; i++) {
        int h = 0;
        while (!r.mask[h][i])
            h++;
        master[i] = r.init[h][i];
        cr_assert(same_bits(o.init_master[i], master[i]),
                  "element %zu: master starts at %.9g, first holder %d has %.9g", i,
                  o.init_master[i], h, master[i]);
    }
    float **g = malloc((size_t)n * sizeof *g);
    for (int w = 0; w < n; w++)
        g[w] = malloc(p * sizeof(float));
    for (int t = 0; t < steps; t++) {
        for (int w = 0; w < n; w++) {
            st_rng root = st_rng_seed(1000 + (uint64_t)t);
            st_rng gr = st_rng_split(&root, (uint64_t)w);
            for (size_t i = 0; i < p; i++) {
                g[w][i] = st_rng_normal(&gr);
                /* bf16 payloads: the reference sums the rounded values */
                if (g_payload == ST_COMM_PAYLOAD_BF16)
                    g[w][i] = bf16_round(g[w][i]);
            }
        }
        for (size_t i = 0; i < p; i++) {
            double dmean, amean;
            float want = ref_mean(&r, g, i, &dmean, &amean);
            float got = o.means[(size_t)t * p + i];
            cr_assert(same_bits(got, want), "n=%d p=%zu seed=%llu step %d element %zu: got "
                      "%.9g, sequential sum in the fixed order gives %.9g", n, p,
                      (unsigned long long)seed, t, i, got, want);
            cr_assert_leq(fabs(got - dmean), 1e-5 * amean + 1e-30,
                          "element %zu: %.9g vs double mean %.9g", i, got, dmean);
            master[i] = master[i] - 0.25f * want;
        }
    }
    /* final replicas: the last masters where held, untouched elsewhere */
    for (int w = 0; w < n; w++)
        for (size_t i = 0; i < p; i++)
            cr_assert(same_bits(r.params[w][i], r.mask[w][i] ? master[i] : SENTINEL),
                      "worker %d element %zu: %.9g", w, i, r.params[w][i]);
    for (int w = 0; w < n; w++)
        free(g[w]);
    free(g);
    free(master);
    out_free(&o);
    rig_free(&r);
}

static void check_config(int n, size_t p, const int *domain_of, uint64_t seed, int dp)
{
    check_run(n, p, domain_of, seed, dp, STEPS, 0);
}

/* Sizes: 1, under 16 N (some shards empty), around 16-float lines, not
 * divisible by N, and a few larger ones. */
static void check_sizes(int n, const int *domain_of, uint64_t seed)
{
    size_t sizes[] = { 1, 15, 17, (size_t)(16 * n - 1), 100, 1000, 4099, 20000 };
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        if (sizes[k] == 0)
            continue;
        check_config(n, sizes[k], domain_of, seed + k, 1);
        check_config(n, sizes[k], domain_of, seed + 100 + k, 0);
        check_config(n, sizes[k], domain_of, seed + 200 + k, 0);
    }
}

/* ------------------------------------------------------------ reduction */

Test(comm_reduce, one_worker)
{
    check_sizes(1, NULL, 10);
}

Test(comm_reduce, two_workers)
{
    static const int two[2] = { 0, 1 };
    check_sizes(2, NULL, 20);
    check_sizes(2, two, 30);
}

Test(comm_reduce, three_workers)
{
    static const int d[3] = { 0, 0, 1 };
    check_sizes(3, NULL, 40);
    check_sizes(3, d, 50);
}

Test(comm_reduce, four_workers, .timeout = 60)
{
    static const int pairs[4] = { 0, 0, 1, 1 }, each[4] = { 0, 1, 2, 3 };
    check_sizes(4, NULL, 60);
    check_sizes(4, pairs, 70);
    check_sizes(4, each, 80);
}

Test(comm_reduce, seven_workers, .timeout = 60)
{
    static const int d[7] = { 0, 0, 0, 1, 1, 2, 2 };
    check_sizes(7, NULL, 90);
    check_sizes(7, d, 100);
}

Test(comm_reduce, eight_workers, .timeout = 60)
{
    static const int three[8] = { 0, 0, 0, 1, 1, 2, 2, 2 }, two[8] = { 0, 0, 0, 0, 1, 1, 1, 1 };
    check_sizes(8, NULL, 110);
    check_sizes(8, three, 120);
    check_sizes(8, two, 130);
}

/* Domain ids need not start at 0 or be dense, only non-decreasing. */
Test(comm_reduce, sparse_domain_ids)
{
    static const int d[4] = { 2, 2, 5, 5 };
    check_config(4, 1000, d, 140, 0);
}

/* ------------------------------------------------------------ determinism */

static void check_determinism(int n, const int *domain_of, size_t p, uint64_t seed)
{
    enum { REPS = 50 };
    rig r;
    run_out o;
    rig_init(&r, n, p, domain_of, seed, 0);
    out_init(&o, &r, 2);
    run_rig(&r, REPS, 1, 1, &o);
    for (int w = 0; w < n; w++) {
        cr_assert_eq(o.attach[w], ST_OK, "%s", o.msg[w]);
        cr_assert_eq(o.rs[w], ST_OK);
        cr_assert_eq(o.ag[w], ST_OK);
        cr_assert_eq(o.changed[w], 0, "worker %d: %ld shard-gradient elements differ from one "
                     "repetition to another", w, o.changed[w]);
        cr_assert_eq(o.bad_params[w], 0);
    }
    out_free(&o);
    rig_free(&r);
}

Test(comm_determinism, delays_single_level, .timeout = 60)
{
    check_determinism(4, NULL, 5000, 300);
}

Test(comm_determinism, delays_two_levels, .timeout = 60)
{
    static const int d[8] = { 0, 0, 0, 1, 1, 2, 2, 2 };
    check_determinism(8, d, 5000, 310);
}

/* Changing gradients with delays: a missing barrier between the level-1
 * partials and the owners' sums, or between the all-gather's copiers and
 * their readers, would show as stale values. */
Test(comm_determinism, delays_changing_gradients, .timeout = 60)
{
    static const int d[8] = { 0, 0, 0, 1, 1, 2, 2, 2 };
    check_run(8, 3000, d, 320, 1, 12, 1);
    check_run(8, 3000, d, 330, 0, 12, 1);
}

/* ------------------------------------------------------------ bf16 payloads */

/* Runs check_sizes-like configurations with bf16 payloads (rounded where
 * `at` says): the reference (check_run) sums the bf16-rounded gradients in
 * fp32 in the documented order and divides by the count, bitwise; dp = 1
 * is data parallelism, dp = 0 random partial holders (SDP-like: segments
 * of different holder sets, single holders, two-level partials). */
static void check_bf16(st_comm_bf16_at at, int n, const int *domain_of, uint64_t seed)
{
    size_t sizes[] = { 1, 17, (size_t)(16 * n - 1), 1000, 4099, 20000 };
    g_payload = ST_COMM_PAYLOAD_BF16;
    g_bf16_at = at;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        check_config(n, sizes[k], domain_of, seed + k, 1);
        check_config(n, sizes[k], domain_of, seed + 100 + k, 0);
    }
    g_payload = ST_COMM_PAYLOAD_FP32;
    g_bf16_at = ST_COMM_BF16_BUFFER;
}

Test(comm_bf16, buffer_single_domain, .timeout = 60)
{
    check_bf16(ST_COMM_BF16_BUFFER, 1, NULL, 600);
    check_bf16(ST_COMM_BF16_BUFFER, 2, NULL, 610);
    check_bf16(ST_COMM_BF16_BUFFER, 3, NULL, 620);
    check_bf16(ST_COMM_BF16_BUFFER, 4, NULL, 630);
}

Test(comm_bf16, buffer_two_levels, .timeout = 60)
{
    static const int pairs[4] = { 0, 0, 1, 1 }, three[8] = { 0, 0, 0, 1, 1, 2, 2, 2 };
    check_bf16(ST_COMM_BF16_BUFFER, 4, pairs, 640);
    check_bf16(ST_COMM_BF16_BUFFER, 8, three, 650);
}

Test(comm_bf16, on_read_single_domain_and_two_levels, .timeout = 60)
{
    static const int pairs[4] = { 0, 0, 1, 1 }, three[8] = { 0, 0, 0, 1, 1, 2, 2, 2 };
    check_bf16(ST_COMM_BF16_ON_READ, 2, NULL, 660);
    check_bf16(ST_COMM_BF16_ON_READ, 3, NULL, 670);
    check_bf16(ST_COMM_BF16_ON_READ, 4, pairs, 680);
    check_bf16(ST_COMM_BF16_ON_READ, 8, three, 690);
}

/* Random delays before each collective, bf16 buffers written every step:
 * the same result every repetition, and changing gradients never seen
 * stale (the buffer is rewritten at each reduce-scatter's entry). */
Test(comm_bf16, deterministic_under_delays, .timeout = 60)
{
    static const int d[8] = { 0, 0, 0, 1, 1, 2, 2, 2 };
    g_payload = ST_COMM_PAYLOAD_BF16;
    check_determinism(4, NULL, 5000, 700);
    check_determinism(8, d, 5000, 710);
    check_run(8, 3000, d, 720, 0, 12, 1);
    g_payload = ST_COMM_PAYLOAD_FP32;
}

/* The rounding itself: ties to even, carries into the exponent, infinity
 * kept, overflow to infinity, NaN stays NaN (the conversions the two
 * places use, seen through a one-worker, one-holder engine: the mean of
 * one holder is its value). */
Test(comm_bf16, rounding_cases, .timeout = 10)
{
    const uint32_t in[] = { 0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x3f807fffu, 0x7f7fffffu,
                            0x7f800000u, 0xff800000u, 0x80000001u, 0x3fffffffu, 0x7fc00001u };
    const uint32_t want[] = { 0x3f800000u, 0x3f820000u, 0x3f810000u, 0x3f800000u, 0x7f800000u,
                              0x7f800000u, 0xff800000u, 0x80000000u, 0x40000000u, 0x7fc00000u };
    enum { K = sizeof in / sizeof in[0] };
    for (int at = 0; at < 2; at++) {
        st_comm_config cfg = { .n_workers = 1, .n_params = K, .payload = ST_COMM_PAYLOAD_BF16,
                               .bf16_at = (st_comm_bf16_at)at };
        st_comm *c;
        cr_assert_eq(st_comm_create(&cfg, &c), ST_OK, "%s", st_last_error());
        st_arena a;
        st_arena_init(&a, "worker", NULL, 0);
        float g[K], p[K] = { 0 };
        memcpy(g, in, sizeof g);
        st_range all = { 0, K };
        cr_assert_eq(st_comm_attach(c, 0, &a, g, p, &all, 1), ST_OK, "%s", st_last_error());
        cr_assert_eq(st_comm_reduce_scatter(c, 0), ST_OK);
        const float *m = st_comm_shard_grads(c, 0);
        for (int k = 0; k < K; k++) {
            uint32_t got;
            memcpy(&got, &m[k], sizeof got);
            if ((want[k] & 0x7fffffffu) > 0x7f800000u)
                cr_assert(isnan(m[k]) && (got & 0x00400000u), "at %d case %d: %08x is not a "
                          "quiet NaN", at, k, got);
            else
                cr_assert_eq(got, want[k], "at %d case %d: %08x -> %08x, want %08x", at, k, in[k],
                             got, want[k]);
        }
        st_comm_destroy(c);
        st_arena_release(&a);
    }
}

/* Bytes and memory: two workers, data parallel, P = 4096 (S = 2048).
 * Buffers: each worker converts its 4096 held gradients (reads 4 x 4096,
 * writes 2 x 4096), its shard reads 2 x 2048 bf16 values (2 bytes each)
 * instead of fp32; the all-gather is fp32 as before.  The buffer is in
 * the arena's gradients (4096 x 2 bytes more than fp32).  On read: the
 * bytes of fp32, no buffer. */
Test(comm_bf16, bytes_and_memory, .timeout = 30)
{
    st_comm_bytes b[3][MAXW];
    size_t grads_mem[3];
    for (int mode = 0; mode < 3; mode++) {
        g_payload = mode ? ST_COMM_PAYLOAD_BF16 : ST_COMM_PAYLOAD_FP32;
        g_bf16_at = mode == 2 ? ST_COMM_BF16_ON_READ : ST_COMM_BF16_BUFFER;
        rig r;
        run_out o;
        rig_init(&r, 2, 4096, NULL, 800, 1);
        out_init(&o, &r, 1);
        run_rig(&r, 1, 0, 0, &o);
        for (int w = 0; w < 2; w++) {
            cr_assert_eq(o.attach[w], ST_OK, "%s", o.msg[w]);
            b[mode][w] = st_comm_bytes_per_step(r.c, w);
        }
        grads_mem[mode] = r.arena[0].stats.peak[ST_MEM_GRADIENTS];
        out_free(&o);
        rig_free(&r);
    }
    g_payload = ST_COMM_PAYLOAD_FP32;
    g_bf16_at = ST_COMM_BF16_BUFFER;
    for (int w = 0; w < 2; w++) {
        cr_assert_eq(b[0][w].read, 2 * 2048 * 4 + 4096 * 4);
        cr_assert_eq(b[0][w].written, 2048 * 4 + 4096 * 4);
        cr_assert_eq(b[1][w].read, 4096 * 4 + 2 * 2048 * 2 + 4096 * 4, "read %zu", b[1][w].read);
        cr_assert_eq(b[1][w].written, 4096 * 2 + 2048 * 4 + 4096 * 4);
        cr_assert_eq(b[1][w].gather_read, b[0][w].gather_read);
        cr_assert_eq(b[2][w].read, b[0][w].read);
        cr_assert_eq(b[2][w].written, b[0][w].written);
    }
    cr_assert_eq(grads_mem[1], grads_mem[0] + 4096 * 2, "gradients %zu vs fp32 %zu",
                 grads_mem[1], grads_mem[0]);
    cr_assert_eq(grads_mem[2], grads_mem[0]);
}

/* An unknown payload or place of rounding is refused at create. */
Test(comm_bf16, bad_config_refused)
{
    st_comm *c = NULL;
    st_comm_config cfg = { .n_workers = 2, .n_params = 100, .payload = (st_comm_payload)7 };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "payload"), "%s", st_last_error());
    cfg.payload = ST_COMM_PAYLOAD_BF16;
    cfg.bf16_at = (st_comm_bf16_at)9;
    cr_assert_eq(st_comm_create(&cfg, &c), ST_ERR_INVALID);
    cr_assert_null(c);
}

/* ------------------------------------------------------------ abort */

enum { ABORT_IN_RS, ABORT_IN_AG, ABORT_IN_BARRIER };

static void check_abort(const int *domain_of, int where)
{
    enum { N = 4 };
    rig r;
    rig_init(&r, N, 1000, domain_of, 400, 1);
    st_status got[N];
    char msg[N][256];
    int ok_attach = 1;
#pragma omp parallel num_threads(N) reduction(&& : ok_attach)
    {
        int w = omp_get_thread_num();
        st_status s = st_comm_attach(r.c, w, &r.arena[w], r.grads[w], r.params[w], r.held[w],
                                     r.n_held[w]);
        ok_attach = s == ST_OK;
        fill_grads(&r, w, 0);
        if (s == ST_OK && where != ABORT_IN_RS)
            s = st_comm_reduce_scatter(r.c, w);
        if (w == 2) {
            spin(1000000);
            st_comm_abort(r.c);
            s = ST_OK;
        } else if (s == ST_OK) {
            s = where == ABORT_IN_RS ? st_comm_reduce_scatter(r.c, w)
                : where == ABORT_IN_AG ? st_comm_all_gather(r.c, w)
                : st_comm_barrier(r.c, w);
        }
        got[w] = s;
        snprintf(msg[w], sizeof msg[w], "%s", st_last_error());
    }
    cr_assert(ok_attach);
    for (int w = 0; w < N; w++) {
        if (w == 2)
            continue;
        cr_assert_eq(got[w], ST_ERR_INVALID, "worker %d returned %d", w, (int)got[w]);
        cr_assert(strstr(msg[w], "another worker failed"), "worker %d: \"%s\"", w, msg[w]);
    }
    /* and any later call fails at once */
    cr_assert_eq(st_comm_barrier(r.c, 0), ST_ERR_INVALID);
    rig_free(&r);
}

Test(comm_abort, in_reduce_scatter, .timeout = 10)
{
    check_abort(NULL, ABORT_IN_RS);
}

Test(comm_abort, in_reduce_scatter_two_levels, .timeout = 10)
{
    static const int d[4] = { 0, 0, 1, 1 };
    check_abort(d, ABORT_IN_RS);
}

Test(comm_abort, in_all_gather, .timeout = 10)
{
    static const int d[4] = { 0, 0, 1, 1 };
    check_abort(d, ABORT_IN_AG);
}

Test(comm_abort, in_barrier, .timeout = 10)
{
    check_abort(NULL, ABORT_IN_BARRIER);
}

/* ------------------------------------------------------------ bytes */

/* Data-parallel rig, attached; bytes of each worker into b. */
static void dp_bytes(int n, size_t p, const int *domain_of, st_comm_bytes *b)
{
    rig r;
    run_out o;
    rig_init(&r, n, p, domain_of, 500, 1);
    out_init(&o, &r, 1);
    run_rig(&r, 1, 0, 0, &o);
    for (int w = 0; w < n; w++) {
        cr_assert_eq(o.attach[w], ST_OK, "%s", o.msg[w]);
        b[w] = st_comm_bytes_per_step(r.c, w);
    }
    out_free(&o);
    rig_free(&r);
}

/* One domain, everyone holds everything: worker w reads the N gradients of
 * its shard (N S_w x 4) and the whole vector from the masters (P x 4), and
 * writes its shard gradient (S_w x 4) and its whole replica (P x 4). */
Test(comm_bytes, data_parallel_single_domain)
{
    st_comm_bytes b[MAXW];
    dp_bytes(4, 4096, NULL, b);
    for (int w = 0; w < 4; w++) {
        cr_assert_eq(b[w].read, 4 * 1024 * 4 + 4096 * 4);
        cr_assert_eq(b[w].written, 1024 * 4 + 4096 * 4);
        cr_assert_eq(b[w].cross_domain_read, 0);
    }
    /* P = 1000, N = 3: 63 lines of 16 floats -> shards of 336, 336, 328 */
    dp_bytes(3, 1000, NULL, b);
    size_t shard[3] = { 336, 336, 328 };
    for (int w = 0; w < 3; w++) {
        cr_assert_eq(b[w].read, (3 * shard[w] + 1000) * 4, "worker %d read %zu", w, b[w].read);
        cr_assert_eq(b[w].written, (shard[w] + 1000) * 4);
        cr_assert_eq(b[w].cross_domain_read, 0);
    }
}

/* Two domains of two, P = 4096, shards S = 1024 floats (s = 4096 bytes).
 * Worker 0: level 1, the partial of remote shard 2 (reads g0, g1: 2s,
 * writes s); level 2, its shard from g0, g1 (2s) and domain 1's partial
 * (s, cross), writes s; all-gather: shards 0 and 1 from local masters (2s
 * read, 2s written), shard 2 from its remote master (s, cross; it is the
 * copier), shard 3 from worker 1's replica (s).  Total read 9s, written
 * 6s, cross 2s: one read per remote domain for the reduce, one for the
 * gather, where a single level would read 2s + 2s across. */
Test(comm_bytes, data_parallel_two_domains)
{
    static const int d[4] = { 0, 0, 1, 1 };
    st_comm_bytes b[MAXW];
    dp_bytes(4, 4096, d, b);
    for (int w = 0; w < 4; w++) {
        cr_assert_eq(b[w].read, 9 * 4096, "worker %d read %zu", w, b[w].read);
        cr_assert_eq(b[w].written, 6 * 4096, "worker %d wrote %zu", w, b[w].written);
        cr_assert_eq(b[w].cross_domain_read, 2 * 4096, "worker %d: %zu", w,
                     b[w].cross_domain_read);
    }
}

/* Three domains {0,0,0,1,1,2,2,2}, P = 8192, S = 1024 floats (s = 4096
 * bytes).  Remote shards go to the least-loaded worker of a domain, ties to
 * the lowest: domain 0 computes partials of shards 3..7 as w0, w1, w2, w0,
 * w1; domain 1 of shards 0,1,2,5,6,7 as w3, w4, w3, w4, w3, w4; domain 2
 * of 0..4 as w5, w6, w7, w5, w6.  Copiers are chosen the same way.  So:
 * cross-domain reads = 2s (one partial from each of the two other domains
 * for the own shard) + s per remote shard copied in. */
Test(comm_bytes, data_parallel_three_domains)
{
    static const int d[8] = { 0, 0, 0, 1, 1, 2, 2, 2 };
    static const size_t copies[8] = { 2, 2, 1, 3, 3, 2, 2, 1 };  /* = partials computed */
    static const size_t m[8] = { 3, 3, 3, 2, 2, 3, 3, 3 };        /* domain size */
    st_comm_bytes b[MAXW];
    dp_bytes(8, 8192, d, b);
    const size_t s = 4096;
    for (int w = 0; w < 8; w++) {
        size_t remote = 8 - m[w];
        /* read: partials (m s each) + own shard (m s local + 2 s) + local
         * masters (m s) + copies (s each) + the rest from local copiers */
        size_t read = copies[w] * m[w] * s + m[w] * s + 2 * s + m[w] * s + copies[w] * s +
                      (remote - copies[w]) * s;
        size_t written = copies[w] * s + s + 8 * s;
        cr_assert_eq(b[w].cross_domain_read, (2 + copies[w]) * s, "worker %d: %zu", w,
                     b[w].cross_domain_read);
        cr_assert_eq(b[w].read, read, "worker %d read %zu, want %zu", w, b[w].read, read);
        cr_assert_eq(b[w].written, written, "worker %d wrote %zu, want %zu", w, b[w].written,
                     written);
    }
}

Test(comm_bytes, ring_formula)
{
    cr_assert_float_eq(st_comm_ring_bytes(4, 1000), 6000.0, 1e-9);
    cr_assert_float_eq(st_comm_ring_bytes(1, 1000), 0.0, 1e-9);
    cr_assert_float_eq(st_comm_ring_bytes(2, 1 << 20), 4.0 * (1 << 20), 1e-9);
}

/* ------------------------------------------------------------ shards */

Test(comm_shards, boundaries)
{
    st_comm *c;
    st_comm_config cfg = { .n_workers = 3, .n_params = 1000, .domain_of = NULL, .roles = 0 };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_OK);
    size_t want[4] = { 0, 336, 672, 1000 };
    for (int w = 0; w < 3; w++) {
        st_range s = st_comm_shard(c, w);
        cr_assert_eq(s.begin, want[w]);
        cr_assert_eq(s.end, want[w + 1]);
    }
    st_comm_destroy(c);

    /* P < 16 N: 7 lines of 16 floats for 8 workers, the last one empty */
    cfg = (st_comm_config){ .n_workers = 8, .n_params = 100, .domain_of = NULL, .roles = 0 };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_OK);
    for (int w = 0; w < 8; w++) {
        st_range s = st_comm_shard(c, w);
        cr_assert_eq(s.begin, w < 7 ? 16 * (size_t)w : 100);
        cr_assert_eq(s.end, w < 6 ? 16 * (size_t)w + 16 : 100);
    }
    st_comm_destroy(c);
}

Test(comm_shards, bad_config)
{
    st_comm *c = NULL;
    static const int down[3] = { 0, 1, 0 };
    st_comm_config cfg = { .n_workers = 3, .n_params = 100, .domain_of = down, .roles = 0 };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_ERR_INVALID);
    cr_assert_null(c);
    cr_assert(strstr(st_last_error(), "non-decreasing"), "%s", st_last_error());
    cfg = (st_comm_config){ .n_workers = 0, .n_params = 100, .domain_of = NULL, .roles = 0 };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_ERR_INVALID);
    cfg = (st_comm_config){ .n_workers = 2, .n_params = 0, .domain_of = NULL, .roles = 0 };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_ERR_INVALID);
}

Test(comm_shards, describe)
{
    static const int d[8] = { 0, 0, 0, 1, 1, 2, 2, 2 };
    FILE *f = tmpfile();
    cr_assert_not_null(f);
    st_comm_describe(f, 8, d, 1000000);
    st_comm_describe(f, 2, NULL, 1000);
    rewind(f);
    char line[4096];
    int lines = 0, domains = 0, level1 = 0, gathers = 0;
    while (fgets(line, sizeof line, f)) {
        lines++;
        domains += strncmp(line, "domain ", 7) == 0;
        level1 += strstr(line, "level 1") != NULL;
        gathers += strstr(line, "all-gather:") != NULL;
    }
    fclose(f);
    /* 8 workers: a header, then per domain its line, level 1, level 2 and
     * the all-gather; 2 workers: a header and one domain line */
    cr_assert_eq(lines, 1 + 3 * 4 + 2, "%d lines", lines);
    cr_assert_eq(domains, 4);
    cr_assert_eq(level1, 3);
    cr_assert_eq(gathers, 3);
}

/* st_comm_describe, character for character, against a reference text
 * captured from a build of the engine as a single file: the same shards,
 * the same least-loaded assignment of partials and copies, the same byte
 * figures. */
static char *describe_text(int n, const int *domain_of, size_t p)
{
    FILE *f = tmpfile();
    cr_assert_not_null(f);
    st_comm_describe(f, n, domain_of, p);
    long len = ftell(f);
    cr_assert_geq(len, 0);
    char *text = calloc((size_t)len + 1, 1);
    rewind(f);
    cr_assert_eq(fread(text, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    return text;
}

static void check_describe(int n, const int *domain_of, size_t p, const char *want)
{
    char *got = describe_text(n, domain_of, p);
    cr_assert_str_eq(got, want, "n=%d p=%zu: the description changed:\n%s", n, p, got);
    free(got);
}

Test(comm_shards, describe_text_unchanged)
{
    static const int pairs[4] = { 0, 0, 1, 1 }, lone[3] = { 0, 1, 1 };
    check_describe(4, pairs, 4096,
        "reduction: 4 workers, 2 NUMA domains, 4096 parameters (0.02 MiB); shard w (up "
        "to 1024 floats, boundaries on 16-float lines) owned by worker w; two levels "
        "(domain partials, then owners)\n"
        "domain 0: workers 0-1 own shards 0-1 = [0, 2048) (0.01 MiB)\n"
        "  domain 0 level 1: partials of remote shards, each the sum of workers 0-1 in "
        "order, written on this node: s2:w0 s3:w1 (0.01 MiB)\n"
        "  domain 0 level 2: owners sum their domain's 2 gradients, then one partial "
        "(or a lone worker's gradient) from each of the 1 other domain in domain "
        "order, and divide by 4: 0.01 MiB cross-domain per step (single level: 0.02 "
        "MiB)\n"
        "  domain 0 all-gather: remote shards copied in once, by: s2:w0 s3:w1, the "
        "others copy from them locally: 0.01 MiB cross-domain per step (single level: "
        "0.02 MiB)\n"
        "domain 1: workers 2-3 own shards 2-3 = [2048, 4096) (0.01 MiB)\n"
        "  domain 1 level 1: partials of remote shards, each the sum of workers 2-3 in "
        "order, written on this node: s0:w2 s1:w3 (0.01 MiB)\n"
        "  domain 1 level 2: owners sum their domain's 2 gradients, then one partial "
        "(or a lone worker's gradient) from each of the 1 other domain in domain "
        "order, and divide by 4: 0.01 MiB cross-domain per step (single level: 0.02 "
        "MiB)\n"
        "  domain 1 all-gather: remote shards copied in once, by: s0:w2 s1:w3, the "
        "others copy from them locally: 0.01 MiB cross-domain per step (single level: "
        "0.02 MiB)\n");
    /* a domain of one worker: no partials, its gradient read directly */
    check_describe(3, lone, 100,
        "reduction: 3 workers, 2 NUMA domains, 100 parameters (0.00 MiB); shard w (up "
        "to 48 floats, boundaries on 16-float lines) owned by worker w; two levels "
        "(domain partials, then owners)\n"
        "domain 0: worker 0 owns shard 0 = [0, 48) (0.00 MiB)\n"
        "  domain 0 level 1: no partials (one worker: remote owners read its gradient "
        "directly)\n"
        "  domain 0 level 2: owners sum their domain's 1 gradient, then one partial "
        "(or a lone worker's gradient) from each of the 1 other domain in domain "
        "order, and divide by 3: 0.00 MiB cross-domain per step (single level: 0.00 "
        "MiB)\n"
        "  domain 0 all-gather: remote shards copied in once, by: s1:w0 s2:w0: 0.00 "
        "MiB cross-domain per step (single level: 0.00 MiB)\n"
        "domain 1: workers 1-2 own shards 1-2 = [48, 100) (0.00 MiB)\n"
        "  domain 1 level 1: partials of remote shards, each the sum of workers 1-2 in "
        "order, written on this node: s0:w1 (0.00 MiB)\n"
        "  domain 1 level 2: owners sum their domain's 2 gradients, then one partial "
        "(or a lone worker's gradient) from each of the 1 other domain in domain "
        "order, and divide by 3: 0.00 MiB cross-domain per step (single level: 0.00 "
        "MiB)\n"
        "  domain 1 all-gather: remote shards copied in once, by: s0:w1, the others "
        "copy from them locally: 0.00 MiB cross-domain per step (single level: 0.00 "
        "MiB)\n");
    check_describe(2, NULL, 1000,
        "reduction: 2 workers, 1 NUMA domain, 1000 parameters (0.00 MiB); shard w (up "
        "to 512 floats, boundaries on 16-float lines) owned by worker w; single level\n"
        "domain 0: workers 0-1 own shards 0-1 = [0, 1000) (0.00 MiB); each owner sums "
        "workers 0-1 in order and divides by 2; the all-gather copies every shard from "
        "its owner; no cross-domain reads\n");
    check_describe(0, NULL, 1000,
        "reduction: cannot describe: number of workers must be in [1, 65535], got 0\n");
}
/* The printed plan against the plan attach builds.  For every remote
 * shard st_comm_describe names the worker of each domain that computes
 * its partial (level 1) and the one that copies it in (all-gather); the
 * engine's byte counts say what each worker does: its writes outside the
 * all-gather are its own shard gradient and the partials it computes, its
 * cross-domain reads one source per other domain for its own shard and
 * the shards it copies in.  Shards of different lengths (P not a multiple
 * of 16 N) make every choice show in the bytes, ties included. */
static void check_describe_is_the_engine(int n, const int *domain_of, size_t p)
{
    char *text = describe_text(n, domain_of, p);
    int partial[MAXW][MAXW], copier[MAXW][MAXW];   /* [shard][domain]: worker, or -1 */
    memset(partial, -1, sizeof partial);
    memset(copier, -1, sizeof copier);
    int D = 1, named = 0;
    for (char *line = text; line && *line;) {
        char *end = strchr(line, '\n');
        if (end)
            *end = '\0';
        int d, off = 0;
        int(*table)[MAXW] = NULL;
        if (sscanf(line, "  domain %d level 1: %n", &d, &off) == 1 && off > 0)
            table = partial;
        else if (sscanf(line, "  domain %d all-gather: %n", &d, &off) == 1 && off > 0)
            table = copier;
        if (table) {
            cr_assert(d >= 0 && d < MAXW, "%s", line);
            D = d + 1 > D ? d + 1 : D;
            for (char *t = strstr(line, " s"); t; t = strstr(t + 1, " s")) {
                int sh, w;
                if (sscanf(t, " s%d:w%d", &sh, &w) != 2)
                    continue;
                cr_assert(sh >= 0 && sh < n && w >= 0 && w < n, "%s", line);
                cr_assert_eq(table[sh][d], -1, "shard %d named twice: %s", sh, line);
                table[sh][d] = w;
                named++;
            }
        }
        line = end ? end + 1 : NULL;
    }
    free(text);
    st_comm *c;
    st_comm_config cfg = { .n_workers = n, .n_params = p, .domain_of = domain_of };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_OK, "%s", st_last_error());
    size_t len[MAXW];
    for (int w = 0; w < n; w++) {
        st_range r = st_comm_shard(c, w);
        len[w] = r.end - r.begin;
    }
    st_comm_destroy(c);
    st_comm_bytes b[MAXW];
    dp_bytes(n, p, domain_of, b);
    for (int w = 0; w < n; w++) {
        int d = domain_of ? domain_of[w] : 0;
        size_t written = len[w], cross = (size_t)(D - 1) * len[w];
        for (int sh = 0; sh < n; sh++) {
            written += partial[sh][d] == w ? len[sh] : 0;
            cross += copier[sh][d] == w ? len[sh] : 0;
        }
        cr_assert_eq(b[w].written - b[w].gather_written, written * 4,
                     "n=%d p=%zu: worker %d writes %zu bytes of shard gradient and partials, the "
                     "printed plan says %zu", n, p, w, b[w].written - b[w].gather_written,
                     written * 4);
        cr_assert_eq(b[w].cross_domain_read, cross * 4,
                     "n=%d p=%zu: worker %d reads %zu bytes across domains, the printed plan "
                     "says %zu", n, p, w, b[w].cross_domain_read, cross * 4);
    }
    cr_assert(D == 1 || named > 0, "n=%d p=%zu: no assignment printed", n, p);
}

Test(comm_shards, describe_is_the_plan_attach_builds)
{
    static const int pairs[4] = { 0, 0, 1, 1 }, lone[3] = { 0, 1, 1 },
                     three[8] = { 0, 0, 0, 1, 1, 2, 2, 2 }, big_small[5] = { 0, 0, 0, 0, 1 };
    static const size_t sizes[] = { 100, 112, 1000, 4096 + 48, 8192 };
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        check_describe_is_the_engine(4, pairs, sizes[i]);
        check_describe_is_the_engine(3, lone, sizes[i]);
        check_describe_is_the_engine(8, three, sizes[i]);
        check_describe_is_the_engine(5, big_small, sizes[i]);
        check_describe_is_the_engine(2, NULL, sizes[i]);
    }
}

/* ------------------------------------------------------------ backends */

/* The table of backends: names both ways, and 0 (what a designated
 * initialiser that leaves .backend out gives) is the shared buffers. */
Test(comm_backend, names_and_default)
{
    cr_assert_eq((int)ST_COMM_BACKEND_SHARED, 0);
    cr_assert_str_eq(st_comm_backend_name(ST_COMM_BACKEND_SHARED), "shared");
    cr_assert_str_eq(st_comm_backend_name(ST_COMM_BACKEND_MPI), "mpi");
    cr_assert_str_eq(st_comm_backend_name((st_comm_backend_kind)42), "unknown");
    st_comm_backend_kind k = ST_COMM_BACKEND_MPI;
    cr_assert_eq(st_comm_backend_parse("shared", &k), ST_OK);
    cr_assert_eq(k, ST_COMM_BACKEND_SHARED);
    cr_assert_eq(st_comm_backend_parse("mpi", &k), ST_OK);
    cr_assert_eq(k, ST_COMM_BACKEND_MPI);
    cr_assert_eq(st_comm_backend_parse("nccl", &k), ST_ERR_INVALID);
    cr_assert_str_eq(st_last_error(), "unknown reduction backend 'nccl' (allowed: shared, mpi)");
    cr_assert_eq(st_comm_backend_parse("", &k), ST_ERR_INVALID);
    cr_assert_eq(st_comm_backend_parse(NULL, &k), ST_ERR_INVALID);
    cr_assert_eq(k, ST_COMM_BACKEND_MPI, "a failed parse leaves *out alone");

    st_comm *c;
    st_comm_config cfg = { .n_workers = 2, .n_params = 100 };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_OK, "%s", st_last_error());
    cr_assert_eq(st_comm_backend_of(c), ST_COMM_BACKEND_SHARED);
    st_comm_destroy(c);
    cfg.backend = ST_COMM_BACKEND_SHARED;
    cr_assert_eq(st_comm_create(&cfg, &c), ST_OK, "%s", st_last_error());
    cr_assert_eq(st_comm_backend_of(c), ST_COMM_BACKEND_SHARED);
    st_comm_destroy(c);
}

/* A backend the library does not know, and one it knows but does not
 * have, are refused at create with a message that names them; nothing is
 * created.  The backend is checked before the rest of the configuration. */
Test(comm_backend, unknown_and_unavailable_refused)
{
    st_comm *c = (st_comm *)&c;
    st_comm_config cfg = { .n_workers = 2, .n_params = 100,
                           .backend = (st_comm_backend_kind)42 };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_ERR_INVALID);
    cr_assert_null(c);
    cr_assert(strstr(st_last_error(), "unknown reduction backend 42"), "%s", st_last_error());
    cr_assert(strstr(st_last_error(), "available: shared"), "%s", st_last_error());

    c = (st_comm *)&c;
    cfg.backend = ST_COMM_BACKEND_MPI;
    cr_assert_eq(st_comm_create(&cfg, &c), ST_ERR_INVALID);
    cr_assert_null(c);
    if (st_world_has_mpi()) {
        /* built in, but this test is no MPI job (tests/mpi.sh runs those) */
        cr_assert(strstr(st_last_error(), "reduction backend 'mpi': MPI is not running"), "%s",
                  st_last_error());
        return;
    }
    cr_assert(strstr(st_last_error(), "reduction backend 'mpi' is not built"), "%s",
              st_last_error());

    cfg.n_workers = 0;
    cr_assert_eq(st_comm_create(&cfg, &c), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "'mpi'"), "%s", st_last_error());
}

/* What the public functions check before they forward to the backend: no
 * engine, a worker out of range (which also aborts the engine, so that
 * nobody waits for the caller), and the queries' answers for both. */
Test(comm_dispatch, missing_engine_and_bad_worker, .timeout = 10)
{
    cr_assert_eq(st_comm_reduce_scatter(NULL, 0), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "reduce-scatter: no reduction engine"), "%s",
              st_last_error());
    cr_assert_eq(st_comm_all_gather(NULL, 0), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "all-gather: no reduction engine"));
    cr_assert_eq(st_comm_barrier(NULL, 0), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "barrier: no reduction engine"));
    float v[4] = { 0 };
    st_range all = { 0, 4 };
    st_arena a;
    st_arena_init(&a, "dispatch", NULL, 0);
    cr_assert_eq(st_comm_attach(NULL, 0, &a, v, v, &all, 1), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "st_comm_attach: no reduction engine"));
    st_range none = st_comm_shard(NULL, 0);
    cr_assert_eq(none.begin, 0);
    cr_assert_eq(none.end, 0);
    cr_assert_null(st_comm_shard_grads(NULL, 0));
    cr_assert_null(st_comm_shard_params(NULL, 0));
    cr_assert_eq(st_comm_bytes_per_step(NULL, 0).read, 0);
    st_comm_abort(NULL);
    st_comm_reset(NULL);
    st_comm_set_shard_output(NULL, 0, v);
    st_comm_destroy(NULL);

    /* P = 100, N = 2: 7 lines of 16 floats, 4 + 3 */
    st_comm *c;
    st_comm_config cfg = { .n_workers = 2, .n_params = 100 };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_OK);
    for (int w = -1; w <= 2; w += 3) {
        st_range r = st_comm_shard(c, w);
        cr_assert_eq(r.begin, 0, "worker %d", w);
        cr_assert_eq(r.end, 0, "worker %d", w);
        cr_assert_null(st_comm_shard_grads(c, w));
        cr_assert_null(st_comm_shard_params(c, w));
        cr_assert_eq(st_comm_bytes_per_step(c, w).written, 0);
        st_comm_set_shard_output(c, w, v);   /* ignored */
    }
    cr_assert_eq(st_comm_shard(c, 1).begin, 64);
    cr_assert_eq(st_comm_shard(c, 1).end, 100);
    /* not attached yet: no buffers, no bytes */
    cr_assert_null(st_comm_shard_grads(c, 0));
    cr_assert_eq(st_comm_bytes_per_step(c, 0).read, 0);
    cr_assert_eq(st_comm_reduce_scatter(c, 2), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "reduce-scatter: worker 2 is out of range [0, 2)"), "%s",
              st_last_error());
    /* the engine is aborted: a barrier returns at once instead of waiting
     * for a second worker */
    cr_assert_eq(st_comm_barrier(c, 0), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "another worker failed"), "%s", st_last_error());
    st_comm_destroy(c);

    /* a collective before attach: the backend's check, which aborts too */
    cr_assert_eq(st_comm_create(&cfg, &c), ST_OK);
    cr_assert_eq(st_comm_all_gather(c, 1), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "all-gather: worker 1 has not attached"), "%s",
              st_last_error());
    cr_assert_eq(st_comm_barrier(c, 0), ST_ERR_INVALID);
    st_comm_destroy(c);

    /* bad held ranges are refused before the backend sees them */
    cr_assert_eq(st_comm_create(&cfg, &c), ST_OK);
    st_range past = { 50, 101 };
    cr_assert_eq(st_comm_attach(c, 0, &a, v, v, &past, 1), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "worker 0: held range 0 [50, 101) is out of range"), "%s",
              st_last_error());
    cr_assert_eq(st_comm_barrier(c, 1), ST_ERR_INVALID);
    st_comm_destroy(c);
    st_arena_release(&a);
}

/* The dispatcher and reset: after st_comm_reset the same engine takes new
 * holdings and reduces them like a fresh one (the sdp/ist rounds), the
 * shard output set before the first attach still in use. */
Test(comm_dispatch, reset_then_attach_again, .timeout = 30)
{
    enum { N = 2, P = 200 };
    st_comm *c;
    st_comm_config cfg = { .n_workers = N, .n_params = P, .roles = ST_COMM_REDUCE };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_OK);
    static float grads[N][P], out[N][P];
    static float got[2][P];
    int wrong = 0;
#pragma omp parallel num_threads(N) reduction(+ : wrong)
    {
        int w = omp_get_thread_num();
        st_arena a;
        st_arena_init(&a, "reset", NULL, 0);
        for (int i = 0; i < P; i++)
            grads[w][i] = (float)(w + 1) * (float)(i + 1);
        st_comm_set_shard_output(c, w, out[w]);
        for (int round = 0; round < 2 && !wrong; round++) {
            /* round 0: everyone holds everything; round 1: worker w holds
             * only its half, so every mean is one worker's gradient */
            st_range held = round == 0 ? (st_range){ 0, P }
                                       : (st_range){ (size_t)w * P / 2, (size_t)(w + 1) * P / 2 };
            wrong += st_comm_attach(c, w, &a, grads[w], grads[w], &held, 1) != ST_OK;
            wrong += st_comm_reduce_scatter(c, w) != ST_OK;
            wrong += st_comm_shard_grads(c, w) != out[w];
            st_range sh = st_comm_shard(c, w);
            memcpy(got[round] + sh.begin, out[w], (sh.end - sh.begin) * sizeof(float));
            wrong += st_comm_barrier(c, w) != ST_OK;   /* every result copied */
            if (w == 0)
                st_comm_reset(c);
            wrong += st_comm_barrier(c, w) != ST_OK;   /* the reset is done */
            st_arena_release(&a);
            st_arena_init(&a, "reset", NULL, 0);
        }
        st_arena_release(&a);
    }
    cr_assert_eq(wrong, 0, "%s", st_last_error());
    for (int i = 0; i < P; i++) {
        cr_assert_eq(got[0][i], 1.5f * (float)(i + 1), "round 0 element %d: %g", i, got[0][i]);
        cr_assert_eq(got[1][i], (float)(i < P / 2 ? 1 : 2) * (float)(i + 1),
                     "round 1 element %d: %g", i, got[1][i]);
    }
    st_comm_destroy(c);
}

/* ------------------------------------------------------------ bf16 weight copies */

#define COPY_GUARD 0xdeadu   /* a bf16 copy's element nobody wrote */

/* The bf16 bits of f rounded to nearest even (bf16_round, above). */
static uint16_t bf16_bits(float f)
{
    f = bf16_round(f);
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16);
}

/* Random copies of worker w's vector: sorted, disjoint runs of 1 to 300
 * elements with gaps of 0 to 40 between them, from element `from` on,
 * where keep says an element may be in one (NULL: any); each copy's bf16
 * at half + offset (half: p guard values). */
static int random_copies(st_rng *rng, size_t p, const unsigned char *keep, uint16_t *half,
                         st_param_copy *out, int max)
{
    int n = 0;
    size_t i = st_rng_below(rng, 3);
    while (i < p && n < max) {
        size_t len = 1 + (st_rng_below(rng, 3) == 0 ? st_rng_below(rng, 300) : st_rng_below(rng, 20));
        if (len > p - i)
            len = p - i;
        size_t ok = 0;
        while (keep && ok < len && keep[i + ok])
            ok++;
        if (!keep)
            ok = len;
        if (ok > 0) {
            out[n++] = (st_param_copy){ i, ok, half + i };
            i += ok;
        }
        i += (keep && ok < len ? 1 : 0) + st_rng_below(rng, 41);
    }
    return n;
}

/* Workers of `domain_of` (n, NULL: one domain) attach with the copies of
 * copies[w] (n_copies[w]; -1: none registered) over the rig's holdings
 * (dp: everyone holds everything), run `steps` steps (each moves the
 * masters), and after every all-gather compare each registered copy with
 * the bf16 rounding of w's parameters.  got_claims[w]: what
 * st_comm_gathers_copies said; wrong[w]: copied elements not equal to the
 * rounding of the value just gathered (only counted where claimed), or
 * guards overwritten outside the copies. */
static void run_copies(rig *r, int steps, st_param_copy *const *copies, const int *n_copies,
                       uint16_t *const *half, int *got_claims, long *wrong)
{
#pragma omp parallel num_threads(r->n)
    {
        int w = omp_get_thread_num();
        st_status s = ST_OK;
        if (n_copies[w] >= 0)
            st_comm_set_param_copies(r->c, w, copies[w], n_copies[w]);
        s = st_comm_attach(r->c, w, &r->arena[w], r->grads[w], r->params[w], r->held[w],
                           r->n_held[w]);
        got_claims[w] = s == ST_OK && st_comm_gathers_copies(r->c, w);
        st_range sh = st_comm_shard(r->c, w);
        float *mp = st_comm_shard_params(r->c, w), *sg = st_comm_shard_grads(r->c, w);
        for (int t = 0; t < steps && s == ST_OK; t++) {
            fill_grads(r, w, (uint64_t)t);
            s = st_comm_reduce_scatter(r->c, w);
            for (size_t j = 0; s == ST_OK && j < sh.end - sh.begin; j++)
                mp[j] = mp[j] - 0.37f * sg[j];
            if (s == ST_OK)
                s = st_comm_all_gather(r->c, w);
            if (s != ST_OK)
                break;
            unsigned char *in = calloc(r->p, 1);
            for (int c = 0; n_copies[w] > 0 && c < n_copies[w]; c++)
                memset(in + copies[w][c].offset, 1, copies[w][c].count);
            for (size_t i = 0; i < r->p; i++) {
                if (!in[i])
                    wrong[w] += half[w][i] != COPY_GUARD;
                else if (got_claims[w])
                    wrong[w] += half[w][i] != bf16_bits(r->params[w][i]);
            }
            free(in);
        }
        if (s != ST_OK)
            wrong[w] += 1000000;
    }
}

static uint16_t *guarded_half(size_t p)
{
    uint16_t *h = malloc(p * sizeof *h);
    for (size_t i = 0; i < p; i++)
        h[i] = COPY_GUARD;
    return h;
}

/* Data parallelism, one domain and two (where a copier brings a remote
 * shard in and its neighbours copy from its replica: phase 2): each
 * worker's all-gather writes every element of its copies, cut wherever
 * shards and segments end, as the bf16 rounding of the value it gathers,
 * and nothing outside them. */
Test(comm_copies, the_all_gather_writes_the_bf16_copies, .timeout = 60)
{
    static const int two[] = { 0, 0, 1, 1, 1 };
    const int *doms[] = { NULL, two };
    const int ns[] = { 3, 5 };
    for (int k = 0; k < 2; k++) {
        rig r;
        rig_init(&r, ns[k], 4099, doms[k], 11 + (uint64_t)k, 1);
        st_param_copy *copies[MAXW];
        uint16_t *half[MAXW];
        int n_copies[MAXW], claims[MAXW];
        long wrong[MAXW] = { 0 };
        st_rng rng = st_rng_seed(99 + (uint64_t)k);
        for (int w = 0; w < r.n; w++) {
            half[w] = guarded_half(r.p);
            copies[w] = malloc(4099 * sizeof **copies);
            n_copies[w] = random_copies(&rng, r.p, NULL, half[w], copies[w], 4099);
            cr_assert_gt(n_copies[w], 10);
        }
        run_copies(&r, 3, copies, n_copies, half, claims, wrong);
        for (int w = 0; w < r.n; w++) {
            cr_assert(claims[w], "%d workers: worker %d: the copies not claimed", r.n, w);
            cr_assert_eq(wrong[w], 0, "%d workers: worker %d: %ld copied elements wrong or "
                         "guards written", r.n, w, wrong[w]);
            free(copies[w]);
            free(half[w]);
        }
        rig_free(&r);
    }
}

/* Subnetworks (random holdings, full layout): copies inside w's held
 * elements are claimed and written; a copy that takes in one element w
 * does not hold is not claimed (the model converts, as without copies);
 * a list out of order is not taken; a reset forgets the copies. */
Test(comm_copies, only_held_sorted_copies_are_claimed, .timeout = 60)
{
    rig r;
    rig_init(&r, 4, 3001, NULL, 5, 0);
    st_param_copy *copies[MAXW];
    uint16_t *half[MAXW];
    int n_copies[MAXW], claims[MAXW];
    long wrong[MAXW] = { 0 };
    st_rng rng = st_rng_seed(123);
    for (int w = 0; w < r.n; w++) {
        half[w] = guarded_half(r.p);
        copies[w] = malloc(3001 * sizeof **copies);
        n_copies[w] = random_copies(&rng, r.p, r.mask[w], half[w], copies[w], 3001);
        cr_assert_gt(n_copies[w], 3);
    }
    /* worker 1: its first copy grows by an element it does not hold;
     * worker 2: its first two copies swapped */
    st_param_copy *c1 = copies[1];
    size_t x = c1[0].offset + c1[0].count;
    while (x < r.p && r.mask[1][x])
        x++;
    cr_assert_lt(x, r.p);
    if (n_copies[1] > 1 && c1[1].offset <= x)
        n_copies[1] = 1;
    c1[0].count = x + 1 - c1[0].offset;
    st_param_copy t = copies[2][0];
    copies[2][0] = copies[2][1];
    copies[2][1] = t;
    run_copies(&r, 2, copies, n_copies, half, claims, wrong);
    cr_assert(claims[0] && claims[3], "held copies not claimed: %d %d", claims[0], claims[3]);
    cr_assert(!claims[1], "a copy over an element worker 1 does not hold was claimed");
    cr_assert(!claims[2], "copies out of order were claimed");
    for (int w = 0; w < r.n; w++)
        if (w != 1)   /* 1's unclaimed copy was written where it holds */
            cr_assert_eq(wrong[w], 0, "worker %d: %ld copied elements wrong or guards written",
                         w, wrong[w]);
    for (size_t i = 0; i < r.p; i++)
        cr_assert_eq(half[2][i], COPY_GUARD, "worker 2's refused copies were written");

    /* a reset forgets them: attached again without, nothing is claimed */
    st_comm_reset(r.c);
    for (int w = 0; w < r.n; w++) {
        st_arena_release(&r.arena[w]);
        st_arena_init(&r.arena[w], "worker", NULL, 0);
        n_copies[w] = -1;
    }
    run_copies(&r, 1, copies, n_copies, half, claims, wrong);
    for (int w = 0; w < r.n; w++) {
        cr_assert(!claims[w], "worker %d: copies claimed after a reset", w);
        free(copies[w]);
        free(half[w]);
    }
    rig_free(&r);
}

/* ------------------------------------------------------------ attach errors */

/* Attaches N workers with the given ranges (n_held[w] of held[w]);
 * returns each worker's status and message. */
static void attach_all(int n, size_t p, const st_range *const *held, const int *n_held,
                       st_status *got, char (*msg)[256], int bad_w)
{
    st_comm *c;
    st_comm_config cfg = { .n_workers = n, .n_params = p, .domain_of = NULL, .roles = 0 };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_OK);
    st_arena arena[MAXW];
    float *g[MAXW], *pr[MAXW];
    for (int w = 0; w < n; w++) {
        st_arena_init(&arena[w], "worker", NULL, 0);
        g[w] = calloc(p, sizeof(float));
        pr[w] = calloc(p, sizeof(float));
    }
#pragma omp parallel num_threads(n)
    {
        int w = omp_get_thread_num();
        got[w] = st_comm_attach(c, w == bad_w ? n : w, &arena[w], g[w], pr[w], held[w],
                                n_held[w]);
        snprintf(msg[w], 256, "%s", st_last_error());
    }
    for (int w = 0; w < n; w++) {
        st_arena_release(&arena[w]);
        free(g[w]);
        free(pr[w]);
    }
    st_comm_destroy(c);
}

Test(comm_attach, overlapping_ranges, .timeout = 10)
{
    static const st_range all[1] = { { 0, 100 } }, bad[2] = { { 0, 50 }, { 40, 100 } };
    const st_range *held[3] = { all, bad, all };
    int n_held[3] = { 1, 2, 1 };
    st_status got[3];
    char msg[3][256];
    attach_all(3, 100, held, n_held, got, msg, -1);
    cr_assert_eq(got[1], ST_ERR_INVALID);
    cr_assert(strstr(msg[1], "overlap"), "%s", msg[1]);
    cr_assert(strstr(msg[1], "worker 1"), "%s", msg[1]);
    for (int w = 0; w < 3; w += 2) {
        cr_assert_eq(got[w], ST_ERR_INVALID);
        cr_assert(strstr(msg[w], "another worker failed"), "%s", msg[w]);
    }
}

Test(comm_attach, unsorted_and_empty_ranges, .timeout = 10)
{
    static const st_range all[1] = { { 0, 100 } }, unsorted[2] = { { 50, 100 }, { 0, 50 } },
                          empty[1] = { { 30, 30 } };
    const st_range *held[2] = { unsorted, all };
    int n_held[2] = { 2, 1 };
    st_status got[2];
    char msg[2][256];
    attach_all(2, 100, held, n_held, got, msg, -1);
    cr_assert_eq(got[0], ST_ERR_INVALID);
    cr_assert(strstr(msg[0], "not sorted"), "%s", msg[0]);
    cr_assert(strstr(msg[1], "another worker failed"), "%s", msg[1]);
    held[0] = all;
    held[1] = empty;
    n_held[0] = 1;
    attach_all(2, 100, held, n_held, got, msg, -1);
    cr_assert_eq(got[1], ST_ERR_INVALID);
    cr_assert(strstr(msg[1], "empty"), "%s", msg[1]);
}

Test(comm_attach, out_of_range, .timeout = 10)
{
    static const st_range all[1] = { { 0, 100 } }, past[1] = { { 90, 101 } };
    const st_range *held[2] = { all, past };
    int n_held[2] = { 1, 1 };
    st_status got[2];
    char msg[2][256];
    attach_all(2, 100, held, n_held, got, msg, -1);
    cr_assert_eq(got[1], ST_ERR_INVALID);
    cr_assert(strstr(msg[1], "out of range"), "%s", msg[1]);
    cr_assert_eq(got[0], ST_ERR_INVALID);
    cr_assert(strstr(msg[0], "another worker failed"), "%s", msg[0]);
}

Test(comm_attach, bad_worker_index, .timeout = 10)
{
    static const st_range all[1] = { { 0, 100 } };
    const st_range *held[2] = { all, all };
    int n_held[2] = { 1, 1 };
    st_status got[2];
    char msg[2][256];
    attach_all(2, 100, held, n_held, got, msg, 1);
    cr_assert_eq(got[1], ST_ERR_INVALID);
    cr_assert(strstr(msg[1], "out of range"), "%s", msg[1]);
    cr_assert(strstr(msg[0], "another worker failed"), "%s", msg[0]);
}

Test(comm_attach, unheld_element, .timeout = 10)
{
    static const st_range a[1] = { { 0, 37 } }, b[2] = { { 10, 20 }, { 38, 100 } };
    const st_range *held[2] = { a, b };
    int n_held[2] = { 1, 2 };
    st_status got[2];
    char msg[2][256];
    attach_all(2, 100, held, n_held, got, msg, -1);
    for (int w = 0; w < 2; w++) {
        cr_assert_eq(got[w], ST_ERR_INVALID);
        cr_assert(strstr(msg[w], "element 37 "), "worker %d: %s", w, msg[w]);
    }
    /* a worker may hold nothing, as long as the others cover everything */
    static const st_range all[1] = { { 0, 100 } };
    held[0] = all;
    held[1] = NULL;
    n_held[0] = 1;
    n_held[1] = 0;
    attach_all(2, 100, held, n_held, got, msg, -1);
    cr_assert_eq(got[0], ST_OK, "%s", msg[0]);
    cr_assert_eq(got[1], ST_OK, "%s", msg[1]);
}

/* ------------------------------------------------------------ compact storage */

/* A subnetwork keeps only the parameters it holds, back to back.  The engine
 * must read and write them through the (range -> local offset) map exactly
 * as it reads full-layout vectors. */
#define CP_P 1000
#define CP_N 3

static const st_range cp_held0[] = { { 0, 400 }, { 600, 1000 } };
static const st_range cp_held1[] = { { 200, 700 } };
static const st_range cp_held2[] = { { 0, 100 }, { 650, 1000 } };

static float cp_grad(int w, size_t x) { return (float)(w + 1) * 0.001f * (float)(x % 97) + (float)w; }
static float cp_param(size_t x) { return 0.5f * (float)x; }

Test(comm, compact_vectors_reduce_like_full_ones, .timeout = 30)
{
    const st_range *held[CP_N] = { cp_held0, cp_held1, cp_held2 };
    const int n_held[CP_N] = { 2, 1, 2 };
    st_comm *c;
    st_comm_config cfg = { .n_workers = CP_N, .n_params = CP_P, .domain_of = NULL, .roles = 0 };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_OK, "%s", st_last_error());
    static float grads[CP_N][CP_P], params[CP_N][CP_P];
    static float shard_out[CP_P];
    int failures = 0;
#pragma omp parallel num_threads(CP_N) reduction(+ : failures)
    {
        int w = omp_get_thread_num();
        st_arena a;
        st_arena_init(&a, "compact", NULL, 0);
        size_t local[2], off = 0;
        for (int i = 0; i < n_held[w]; i++) {
            local[i] = off;
            for (size_t x = held[w][i].begin; x < held[w][i].end; x++) {
                grads[w][off + x - held[w][i].begin] = cp_grad(w, x);
                params[w][off + x - held[w][i].begin] = cp_param(x);
            }
            off += held[w][i].end - held[w][i].begin;
        }
        for (size_t k = off; k < CP_P; k++)
            grads[w][k] = params[w][k] = -7.0f; /* beyond the compact vector: untouched */
        st_status s = st_comm_attach_compact(c, w, &a, grads[w], params[w], held[w], local,
                                             n_held[w]);
        if (s == ST_OK)
            s = st_comm_reduce_scatter(c, w);
        if (s == ST_OK) {
            st_range sh = st_comm_shard(c, w);
            memcpy(shard_out + sh.begin, st_comm_shard_grads(c, w),
                   (sh.end - sh.begin) * sizeof(float));
            /* Move the master shard so the all-gather has something to bring. */
            float *m = st_comm_shard_params(c, w);
            for (size_t x = sh.begin; x < sh.end; x++)
                m[x - sh.begin] += 1.0f;
            s = st_comm_all_gather(c, w);
        }
        failures += s != ST_OK;
        for (size_t k = off; k < CP_P; k++)
            failures += grads[w][k] != -7.0f || params[w][k] != -7.0f;
        st_comm_barrier(c, w);
        st_arena_release(&a);
    }
    cr_assert_eq(failures, 0, "%s", st_last_error());
    for (size_t x = 0; x < CP_P; x++) {
        double sum = 0.0;
        int holders = 0;
        for (int w = 0; w < CP_N; w++)
            for (int i = 0; i < n_held[w]; i++)
                if (held[w][i].begin <= x && x < held[w][i].end) {
                    sum += cp_grad(w, x);
                    holders++;
                }
        cr_assert_float_eq(shard_out[x], sum / holders, 1e-5, "element %zu", x);
    }
    for (int w = 0; w < CP_N; w++) {
        size_t off = 0;
        for (int i = 0; i < n_held[w]; i++)
            for (size_t x = held[w][i].begin; x < held[w][i].end; x++, off++)
                cr_assert_eq(params[w][off], cp_param(x) + 1.0f, "worker %d element %zu", w, x);
    }
    st_comm_destroy(c);
}

/* An engine with one role keeps only that role's buffers and refuses the
 * other collective (backward masking pairs a reduce-only and a gather-only
 * engine). */
Test(comm, single_role_engines_refuse_the_other_collective, .timeout = 30)
{
    st_comm *red, *gat;
    st_comm_config cr = { .n_workers = 2, .n_params = 100, .domain_of = NULL, .roles = ST_COMM_REDUCE }, cg = { .n_workers = 2, .n_params = 100, .domain_of = NULL, .roles = ST_COMM_GATHER };
    cr_assert_eq(st_comm_create(&cr, &red), ST_OK);
    cr_assert_eq(st_comm_create(&cg, &gat), ST_OK);
    static float grads[2][100], params[2][100];
    int wrong = 0;
    size_t weights[2], gradients[2];
#pragma omp parallel num_threads(2) reduction(+ : wrong)
    {
        int w = omp_get_thread_num();
        st_arena a;
        st_arena_init(&a, "roles", NULL, 0);
        st_range all = { 0, 100 };
        for (int i = 0; i < 100; i++)
            grads[w][i] = params[w][i] = (float)(w + i);
        wrong += st_comm_attach(red, w, &a, grads[w], grads[w], &all, 1) != ST_OK;
        wrong += st_comm_attach(gat, w, &a, params[w], params[w], &all, 1) != ST_OK;
        weights[w] = a.stats.current[ST_MEM_WEIGHTS];
        gradients[w] = a.stats.current[ST_MEM_GRADIENTS];
        wrong += st_comm_shard_params(red, w) != NULL;
        wrong += st_comm_shard_grads(gat, w) != NULL;
        wrong += st_comm_reduce_scatter(red, w) != ST_OK;
        wrong += st_comm_all_gather(gat, w) != ST_OK;
        st_comm_barrier(red, w);
        st_arena_release(&a);
    }
    cr_assert_eq(wrong, 0, "%s", st_last_error());
    for (int w = 0; w < 2; w++) {
        cr_assert_gt(weights[w], 0, "the gather engine's master shard");
        cr_assert_gt(gradients[w], 0, "the reduce engine's shard gradient");
        cr_assert_leq(weights[w], 64 * sizeof(float) + 64, "one master shard, not two");
    }
    cr_assert_eq(st_comm_all_gather(red, 0), ST_ERR_INVALID);
    st_comm_destroy(red);
    st_comm_destroy(gat);
}

/* Neuron subnetworks of mlp: some elements are nobody's.  With
 * allow_unheld the engine skips them — a shard gradient of its own reads 0
 * there, a caller's output buffer (st_comm_set_shard_output) keeps its
 * values — and averages the rest over their holders.  3 workers, 300
 * elements: worker w holds [100 w, 100 w + 60) and everyone holds
 * [280, 300); [60, 100), [160, 200), [260, 280) are nobody's. */
Test(comm, unheld_elements_are_skipped_and_kept, .timeout = 30)
{
    for (int external = 0; external < 2; external++) {
        st_comm *c;
        st_comm_config cfg = { .n_workers = 3, .n_params = 300, .roles = ST_COMM_REDUCE,
                               .allow_unheld = 1 };
        cr_assert_eq(st_comm_create(&cfg, &c), ST_OK);
        static float grads[3][300], out[3][300];
        int wrong = 0;
        st_range shard[3];
        float *result[3];
#pragma omp parallel num_threads(3) reduction(+ : wrong)
        {
            int w = omp_get_thread_num();
            st_arena a;
            st_arena_init(&a, "unheld", NULL, 0);
            st_range held[2] = { { 100 * (size_t)w, 100 * (size_t)w + 60 }, { 280, 300 } };
            for (int i = 0; i < 300; i++)
                grads[w][i] = (float)(w + 1) * (float)i;
            shard[w] = st_comm_shard(c, w);
            for (size_t i = 0; i < 300; i++)
                out[w][i] = SENTINEL;
            if (external)
                st_comm_set_shard_output(c, w, out[w]);
            wrong += st_comm_attach(c, w, &a, grads[w], grads[w], held, 2) != ST_OK;
            wrong += st_comm_reduce_scatter(c, w) != ST_OK;
            result[w] = st_comm_shard_grads(c, w);
            wrong += st_comm_barrier(c, w) != ST_OK;
#pragma omp barrier
            if (w == 0)
                for (int k = 0; k < 3; k++)
                    for (size_t i = shard[k].begin; i < shard[k].end; i++) {
                        float got = result[k][i - shard[k].begin];
                        int holders = i >= 280 ? 3 : (i % 100 < 60 ? 1 : 0);
                        float want = holders == 3 ? 2.0f * (float)i      /* (1+2+3) i / 3 */
                                   : holders == 1 ? (float)(i / 100 + 1) * (float)i
                                   : external ? SENTINEL : 0.0f;
                        wrong += got != want;
                    }
#pragma omp barrier
            st_arena_release(&a);
        }
        cr_assert_eq(wrong, 0, "external output %d: %s", external, st_last_error());
        if (external)
            cr_assert_eq(result[1], out[1] + 0, "the caller's buffer is the shard output");
        st_comm_destroy(c);
    }
}

/* allow_unheld with a list: elements nobody holds are fine inside the
 * listed ranges and still an error outside them (a layout mistake must not
 * pass unnoticed).  The layout of the test above: [60, 100), [160, 200),
 * [260, 280) are nobody's. */
Test(comm, unheld_elements_only_where_allowed, .timeout = 30)
{
    const st_range all_gaps[3] = { { 50, 100 }, { 160, 200 }, { 250, 280 } };
    for (int n_allowed = 3; n_allowed >= 2; n_allowed--) {
        st_comm *c;
        st_comm_config cfg = { .n_workers = 3, .n_params = 300, .roles = ST_COMM_REDUCE,
                               .allow_unheld = 1, .unheld_ranges = all_gaps,
                               .n_unheld_ranges = n_allowed };
        cr_assert_eq(st_comm_create(&cfg, &c), ST_OK);
        static float grads[3][300];
        int failed = 0;
        char message[256] = "";
#pragma omp parallel num_threads(3) reduction(+ : failed)
        {
            int w = omp_get_thread_num();
            st_arena a;
            st_arena_init(&a, "unheld", NULL, 0);
            st_range held[2] = { { 100 * (size_t)w, 100 * (size_t)w + 60 }, { 280, 300 } };
            st_status s = st_comm_attach(c, w, &a, grads[w], grads[w], held, 2);
            failed += s != ST_OK;
            if (s != ST_OK && w == 0)
                snprintf(message, sizeof message, "%s", st_last_error());
#pragma omp barrier
            st_arena_release(&a);
        }
        if (n_allowed == 3) {
            cr_assert_eq(failed, 0, "every gap is allowed: %s", message);
        } else {
            cr_assert_eq(failed, 3, "[260, 280) is not allowed to be unheld");
            cr_assert(strstr(message, "element 260"), "%s", message);
        }
        st_comm_destroy(c);
    }
}

/* ------------------------------------------------------------ the spin barrier */

/* The barrier itself (comm/barrier.h), under stress: many rounds with
 * nothing between them and more threads than cores.  The order of the
 * last arriver's two stores matters: bumping the generation before
 * clearing the counter lets a woken waiter arrive for the next round
 * before the clear, which then erases that arrival, and the round never
 * completes.  Plain stress hits that window rarely (measured: a 2-thread
 * loop deadlocked after 20,000 to 70,000 rounds, seconds on a quiet
 * machine), so this copy of the barrier yields the CPU between the two
 * stores (ST_BARRIER_RELEASE_HOOK): with more threads than cores a woken
 * waiter runs right then, and a wrong order hangs within a few rounds.
 * Waiters yield after a few spins (ST_BARRIER_SPINS), so that the rounds
 * of an oversubscribed machine stay fast.  A watchdog turns a hang into a
 * failure: it aborts the barrier, which lets every waiter out.  Each
 * thread also checks, after each round, that every thread arrived in it
 * and none is more than one round ahead. */
#define ST_BARRIER_SPINS 64
#define ST_BARRIER_RELEASE_HOOK() sched_yield()
#include "comm/barrier.h"

#define STRESS_ROUNDS 20000
#define STRESS_STALL_S 5.0     /* no round completed for this long: a hang */

typedef struct stress {
    st_spin_barrier barrier;
    int threads;
    alignas(64) atomic_long arrivals;   /* every thread adds 1 before each wait */
    alignas(64) atomic_long done;       /* rounds thread 0 has passed */
    atomic_long early, late;            /* rounds some thread saw wrong counts in */
    atomic_int aborted;
} stress;

typedef struct stress_arg {
    stress *s;
    int id;
} stress_arg;

static void *stress_thread(void *p)
{
    stress_arg *a = p;
    stress *s = a->s;
    const long T = s->threads;
    for (long r = 0; r < STRESS_ROUNDS; r++) {
        atomic_fetch_add(&s->arrivals, 1);
        if (st_spin_barrier_wait(&s->barrier) != 0) {
            atomic_store(&s->aborted, 1);
            return NULL;
        }
        /* past round r: all T arrived r + 1 times; the others may have
         * arrived for round r + 1 already, not later (they wait for me) */
        long seen = atomic_load(&s->arrivals);
        if (seen < (r + 1) * T)
            atomic_fetch_add(&s->early, 1);
        if (seen > (r + 2) * T - 1)
            atomic_fetch_add(&s->late, 1);
        if (a->id == 0)
            atomic_store(&s->done, r + 1);
    }
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

Test(spin_barrier, many_rounds_more_threads_than_cores_lose_no_arrival, .timeout = 120)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int T = (int)(cpus < 2 ? 3 : cpus + 1);   /* more threads than cores */
    T = T > 64 ? 64 : T;
    stress *s = aligned_alloc(64, sizeof *s);
    cr_assert_not_null(s);
    memset(s, 0, sizeof *s);
    st_spin_barrier_init(&s->barrier, (unsigned)T);
    s->threads = T;
    pthread_t tid[64];
    stress_arg args[64];
    for (int i = 0; i < T; i++) {
        args[i] = (stress_arg){ s, i };
        cr_assert_eq(pthread_create(&tid[i], NULL, stress_thread, &args[i]), 0);
    }
    /* the watchdog: progress is thread 0's rounds */
    long last = -1;
    double since = now_s();
    int hung = 0;
    while (atomic_load(&s->done) < STRESS_ROUNDS && !atomic_load(&s->aborted)) {
        struct timespec nap = { 0, 10 * 1000 * 1000 };
        nanosleep(&nap, NULL);
        long d = atomic_load(&s->done);
        if (d != last) {
            last = d;
            since = now_s();
        } else if (now_s() - since > STRESS_STALL_S) {
            hung = 1;
            st_spin_barrier_abort(&s->barrier);
            break;
        }
    }
    for (int i = 0; i < T; i++)
        pthread_join(tid[i], NULL);
    long done = atomic_load(&s->done), arrivals = atomic_load(&s->arrivals);
    cr_log_info("spin barrier: %d threads on %ld CPUs, %ld of %d rounds", T, cpus, done,
                STRESS_ROUNDS);
    cr_assert(!hung, "%d threads hung in round %ld of %d (%ld arrivals counted, the barrier "
              "waits for more): an arrival was lost", T, done + 1, STRESS_ROUNDS, arrivals);
    cr_assert_eq(done, STRESS_ROUNDS);
    cr_assert_eq(arrivals, (long)STRESS_ROUNDS * T);
    cr_assert_eq(atomic_load(&s->early), 0, "a thread left a round before every thread arrived");
    cr_assert_eq(atomic_load(&s->late), 0, "a thread ran more than a round ahead");
    free(s);
}

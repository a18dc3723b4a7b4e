/*
 * tests/comm_rig.h — what the suites of the reduction engine share
 * (tests/test_comm_*.c, through the public API, subtrain/comm.h): a rig of
 * workers with random holdings, one run of attach, reduce-scatter and
 * all-gather over it, and the check of every result against a sequential
 * reference (bitwise, in the engine's fixed order, and against a double
 * sum).  Header-only, every function static inline.
 *
 * Every test runs its workers as one OpenMP parallel region with one thread
 * per worker, as the trainer does; more threads than cores is fine (the
 * barrier yields when it waits long).  Assertions are made on the main
 * thread after the region: the workers only record what they saw.
 */
#ifndef SUBTRAIN_TESTS_COMM_RIG_H
#define SUBTRAIN_TESTS_COMM_RIG_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>
#include <criterion/criterion.h>

#include <subtrain/comm.h>
#include <subtrain/rng.h>

#include "core/arena_impl.h"

#define MAXW 8
#define STEPS 3

static const float SENTINEL = -777.0f;

/* The payload of the engines rig_init creates, and where bf16 is rounded
 * (the bf16 tests set them, then put them back). */
static st_comm_payload g_payload = ST_COMM_PAYLOAD_FP32;
static st_comm_bf16_at g_bf16_at = ST_COMM_BF16_BUFFER;
/* 1: shared parameters (comm.h): the workers of a domain attach one
 * vector, every domain its own with the same initial values, and every
 * worker holds everything (the shared tests set it for dp rigs). */
static int g_shared = 0;
/* > 0: every worker writes its gradient in that many pieces from the top
 * of the vector down, saying each final (st_comm_reduce_ready) as a
 * backward does, with random delays between them; unwritten elements are
 * NaN until then, so an owner that read one early would show it. */
static int g_ready_pieces = 0;

/* An fp32 rounded to bf16 (nearest even) and widened back, computed here
 * independently of the engine. */
static inline float bf16_round(float f)
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

static inline int domain(const rig *r, int w)
{
    return r->domain_of ? r->domain_of[w] : 0;
}

/* Random holder masks: runs of random length (short ones and long ones),
 * each held by a random subset of the workers (never none); dp: everyone
 * holds everything.  Ranges are the masks' runs, sometimes split in two
 * adjacent ranges. */
static inline void rig_masks(rig *r, uint64_t seed, int dp)
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

static inline void rig_init(rig *r, int n, size_t p, const int *domain_of, uint64_t seed, int dp)
{
    memset(r, 0, sizeof *r);
    r->n = n;
    r->p = p;
    r->domain_of = domain_of;
    st_comm_config cfg = { .n_workers = n, .n_params = p, .domain_of = domain_of, .roles = 0,
                           .payload = g_payload, .bf16_at = g_bf16_at,
                           .shared_params = g_shared };
    cr_assert_eq(st_comm_create(&cfg, &r->c), ST_OK, "create: %s", st_last_error());
    rig_masks(r, seed, dp || g_shared);
    st_rng rng = st_rng_seed(seed ^ 0x5eed);
    for (int w = 0; w < n; w++) {
        st_arena_init(&r->arena[w], "worker", NULL, 0);
        r->grads[w] = malloc(p * sizeof(float));
        /* shared: a domain's first worker makes its vector, with worker
         * 0's values (every domain's copy starts the same) */
        const int first = w == 0 || domain(r, w) != domain(r, w - 1);
        r->params[w] = !g_shared || first ? malloc(p * sizeof(float)) : r->params[w - 1];
        for (size_t i = 0; i < p; i++) {
            r->grads[w][i] = NAN;
            float v = r->mask[w][i] ? st_rng_normal(&rng) : SENTINEL;
            if (!g_shared || w == 0)
                r->params[w][i] = v;
            else if (first)
                r->params[w][i] = r->params[0][i];
        }
        r->init[w] = malloc(p * sizeof(float));
        memcpy(r->init[w], r->params[w], p * sizeof(float));
    }
}

static inline void rig_free(rig *r)
{
    st_comm_destroy(r->c);
    for (int w = 0; w < r->n; w++) {
        st_arena_release(&r->arena[w]);
        free(r->grads[w]);
        if (!g_shared || w == 0 || domain(r, w) != domain(r, w - 1))
            free(r->params[w]);
        free(r->init[w]);
        free(r->mask[w]);
        free(r->held[w]);
    }
}

static inline void out_init(run_out *o, const rig *r, int steps)
{
    memset(o, 0, sizeof *o);
    o->init_master = calloc(r->p, sizeof(float));
    o->means = calloc((size_t)steps * r->p, sizeof(float));
}

static inline void out_free(run_out *o)
{
    free(o->init_master);
    free(o->means);
}

/* ------------------------------------------------------------ one run */

/* Gradients of worker w for a step: normal values where w holds the
 * element, NaN elsewhere (an engine that read them would show it). */
static inline void fill_grads(rig *r, int w, uint64_t step)
{
    st_rng root = st_rng_seed(1000 + step);
    st_rng g = st_rng_split(&root, (uint64_t)w);
    for (size_t i = 0; i < r->p; i++) {
        float v = st_rng_normal(&g);
        r->grads[w][i] = r->mask[w][i] ? v : NAN;
    }
}

static inline void spin(uint32_t iters)
{
    volatile uint32_t x = 0;
    for (uint32_t i = 0; i < iters; i++)
        x = x + 1;
}

/* fill_grads as a backward writes them: NaN first, then g_ready_pieces
 * pieces from the top down, each said final once written. */
static inline st_status fill_grads_ready(rig *r, int w, uint64_t step, st_rng *dr)
{
    float *g = r->grads[w];
    for (size_t i = 0; i < r->p; i++)
        g[i] = NAN;
    st_rng root = st_rng_seed(1000 + step);
    st_rng gr = st_rng_split(&root, (uint64_t)w);
    float *v = malloc(r->p * sizeof *v);
    for (size_t i = 0; i < r->p; i++)
        v[i] = st_rng_normal(&gr);
    size_t top = r->p;
    st_status s = ST_OK;
    for (int k = g_ready_pieces; k >= 1 && s == ST_OK; k--) {
        size_t from = k == 1 ? 0 : (size_t)st_rng_below(dr, (uint32_t)top + 1);
        for (size_t i = from; i < top; i++)
            g[i] = r->mask[w][i] ? v[i] : NAN;
        s = st_comm_reduce_ready(r->c, w, from, NULL);
        top = from;
        spin(st_rng_below(dr, 20000));
    }
    free(v);
    return s;
}

static inline int owner_of(const st_comm *c, int n, size_t i)
{
    for (int v = 0; v < n; v++) {
        st_range s = st_comm_shard(c, v);
        if (i >= s.begin && i < s.end)
            return v;
    }
    return -1;
}

static inline int same_bits(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

/* Attach, then `steps` steps: gradients, reduce-scatter, the owner's
 * "update" master -= 0.25 x mean, all-gather, and a check of the replica
 * against every owner's master.  same_grads: every step reduces the same
 * gradients and does not update (determinism); delays: every worker spins
 * a random while before each collective. */
static inline void run_rig(rig *r, int steps, int same_grads, int delays, run_out *o)
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
                if (g_ready_pieces)
                    s = o->rs[w] = fill_grads_ready(r, w, (uint64_t)t, &dr);
                else if (t == 0 || !same_grads)
                    fill_grads(r, w, (uint64_t)t);
                if (s != ST_OK)
                    break;
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
static inline float ref_mean(const rig *r, float *const *g, size_t i, double *dmean,
                             double *abs_sum)
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
static inline void check_run(int n, size_t p, const int *domain_of, uint64_t seed, int dp,
                             int steps, int delays)
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

static inline void check_config(int n, size_t p, const int *domain_of, uint64_t seed, int dp)
{
    check_run(n, p, domain_of, seed, dp, STEPS, 0);
}

/* Sizes: 1, under 16 N (some shards empty), around 16-float lines, not
 * divisible by N, and a few larger ones. */
static inline void check_sizes(int n, const int *domain_of, uint64_t seed)
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

#endif /* SUBTRAIN_TESTS_COMM_RIG_H */

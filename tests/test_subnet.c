/*
 * tests/test_subnet.c — assignments of units to workers: exactly k holders
 * per unit, balanced loads, reproducible from (seed, round), redrawn rounds
 * keep both properties.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>
#include <criterion/criterion.h>

#include <subtrain/comm.h>
#include <subtrain/rng.h>
#include <subtrain/subnet.h>

#include "core/arena_impl.h"

static void check_assignment(const st_assignment *a)
{
    int lo = a->n_units, hi = 0;
    for (int w = 0; w < a->n_workers; w++) {
        int c = 0;
        for (int u = 0; u < a->n_units; u++)
            c += st_assignment_holds(a, w, u);
        cr_assert_eq(c, a->count[w], "count of worker %d", w);
        if (c < lo) lo = c;
        if (c > hi) hi = c;
    }
    cr_assert_leq(hi - lo, 1, "loads %d..%d differ by more than one", lo, hi);
    for (int u = 0; u < a->n_units; u++) {
        int holders = 0;
        for (int w = 0; w < a->n_workers; w++)
            holders += st_assignment_holds(a, w, u);
        cr_assert_eq(holders, a->k, "unit %d has %d holders, want %d", u, holders, a->k);
    }
}

Test(subnet, every_unit_exactly_k_holders_and_balanced_loads)
{
    const int workers[] = { 1, 2, 3, 4, 7, 8, 16 };
    const int units[] = { 1, 2, 5, 8, 13, 64, 100 };
    const double coverage[] = { 0.1, 0.25, 0.3, 0.5, 0.75, 1.0 };
    for (size_t i = 0; i < sizeof workers / sizeof *workers; i++)
        for (size_t j = 0; j < sizeof units / sizeof *units; j++)
            for (size_t c = 0; c < sizeof coverage / sizeof *coverage; c++) {
                int k = st_subnet_holders_per_unit(workers[i], coverage[c]);
                for (uint64_t round = 0; round < 4; round++) {
                    st_assignment a;
                    cr_assert_eq(st_assignment_make(workers[i], units[j], k, 42, round, &a),
                                 ST_OK);
                    check_assignment(&a);
                    st_assignment_free(&a);
                }
            }
}

/* Neuron groups of several layers: on top of the whole assignment's
 * properties, each layer is balanced on its own. */
Test(subnet, layered_units_are_balanced_within_every_layer)
{
    const int workers[] = { 1, 2, 3, 4, 7, 8, 16 };
    const int layers[] = { 1, 2, 3, 8 };
    const int per_layer[] = { 1, 3, 16, 64 };
    const double coverage[] = { 0.1, 0.25, 0.5, 1.0 };
    for (size_t i = 0; i < sizeof workers / sizeof *workers; i++)
        for (size_t l = 0; l < sizeof layers / sizeof *layers; l++)
            for (size_t u = 0; u < sizeof per_layer / sizeof *per_layer; u++)
                for (size_t c = 0; c < sizeof coverage / sizeof *coverage; c++) {
                    int k = st_subnet_holders_per_unit(workers[i], coverage[c]), U = per_layer[u];
                    st_assignment a;
                    cr_assert_eq(st_assignment_make_layered(workers[i], layers[l], U, k, 7, c,
                                                            &a), ST_OK);
                    cr_assert_eq(a.n_units, layers[l] * U);
                    check_assignment(&a);
                    for (int layer = 0; layer < layers[l]; layer++) {
                        int lo = U, hi = 0;
                        for (int w = 0; w < workers[i]; w++) {
                            int n = 0;
                            for (int j = 0; j < U; j++)
                                n += st_assignment_holds(&a, w, layer * U + j);
                            lo = n < lo ? n : lo;
                            hi = n > hi ? n : hi;
                        }
                        cr_assert_leq(hi - lo, 1, "layer %d: loads %d..%d", layer, lo, hi);
                        cr_assert_geq(lo, U * k / workers[i], "layer %d: floor(U k / N)", layer);
                    }
                    st_assignment_free(&a);
                }
}

/* Sections of different sizes (a ResNet's stages): each section balanced
 * on its own, the totals too, and one section is the plain assignment
 * (so models with one section are drawn exactly as before). */
Test(subnet, sections_are_balanced_each_and_one_section_is_the_plain_assignment)
{
    const int sizes[][4] = { { 3, 2, 2, 0 }, { 1, 1, 1, 0 }, { 5, 3, 1, 2 } };
    const int n_sections[] = { 3, 3, 4 };
    const int workers[] = { 1, 2, 3, 4, 8 };
    for (size_t z = 0; z < 3; z++)
        for (size_t i = 0; i < sizeof workers / sizeof *workers; i++)
            for (int k = 1; k <= workers[i]; k++) {
                st_assignment a;
                cr_assert_eq(st_assignment_make_sections(workers[i], n_sections[z], sizes[z], k,
                                                         9, 2, &a), ST_OK);
                check_assignment(&a);
                int first = 0;
                for (int l = 0; l < n_sections[z]; l++) {
                    int lo = 1 << 30, hi = 0;
                    for (int w = 0; w < workers[i]; w++) {
                        int n = 0;
                        for (int j = 0; j < sizes[z][l]; j++)
                            n += st_assignment_holds(&a, w, first + j);
                        lo = n < lo ? n : lo;
                        hi = n > hi ? n : hi;
                    }
                    cr_assert_leq(hi - lo, 1, "section %d: loads %d..%d", l, lo, hi);
                    first += sizes[z][l];
                }
                st_assignment_free(&a);
            }
    const int one[] = { 7 };
    st_assignment a, b;
    cr_assert_eq(st_assignment_make_sections(3, 1, one, 2, 5, 4, &a), ST_OK);
    cr_assert_eq(st_assignment_make(3, 7, 2, 5, 4, &b), ST_OK);
    cr_assert_eq(memcmp(a.held, b.held, 3 * 7), 0, "one section: the plain assignment");
    st_assignment_free(&a);
    st_assignment_free(&b);
    const int bad[] = { 2, 0 };
    cr_assert_eq(st_assignment_make_sections(2, 2, bad, 1, 5, 0, &a), ST_ERR_INVALID,
                 "an empty section");
    cr_assert_null(a.held);
}

Test(subnet, holders_per_unit_follows_the_coverage)
{
    cr_assert_eq(st_subnet_holders_per_unit(4, 0.5), 2);
    cr_assert_eq(st_subnet_holders_per_unit(4, 0.25), 1);
    cr_assert_eq(st_subnet_holders_per_unit(4, 1.0), 4);
    cr_assert_eq(st_subnet_holders_per_unit(4, 0.01), 1, "at least one holder");
    cr_assert_eq(st_subnet_holders_per_unit(8, 0.3), 2);
    cr_assert_eq(st_subnet_holders_per_unit(1, 0.5), 1);
}

Test(subnet, same_seed_and_round_same_assignment_and_rounds_differ)
{
    st_assignment a, b, c;
    cr_assert_eq(st_assignment_make(4, 16, 2, 7, 3, &a), ST_OK);
    cr_assert_eq(st_assignment_make(4, 16, 2, 7, 3, &b), ST_OK);
    cr_assert_eq(st_assignment_make(4, 16, 2, 7, 4, &c), ST_OK);
    cr_assert_eq(memcmp(a.held, b.held, 4 * 16), 0);
    cr_assert_neq(memcmp(a.held, c.held, 4 * 16), 0, "a new round redraws the masks");
    st_assignment_free(&a);
    st_assignment_free(&b);
    st_assignment_free(&c);
}

/* Over many rounds each worker holds each unit about k/N of the time: the
 * draw is not stuck on some pattern. */
Test(subnet, rounds_spread_units_evenly_over_workers)
{
    enum { N = 4, U = 8, ROUNDS = 4000 };
    int hits[N][U] = { { 0 } };
    for (uint64_t r = 0; r < ROUNDS; r++) {
        st_assignment a;
        cr_assert_eq(st_assignment_make(N, U, 2, 1, r, &a), ST_OK);
        for (int w = 0; w < N; w++)
            for (int u = 0; u < U; u++)
                hits[w][u] += st_assignment_holds(&a, w, u);
        st_assignment_free(&a);
    }
    /* Expected 2000 each (p = 1/2); binomial sd = 32; 6 sd = 190. */
    for (int w = 0; w < N; w++)
        for (int u = 0; u < U; u++)
            cr_assert(abs(hits[w][u] - ROUNDS / 2) < 190, "worker %d unit %d: %d", w, u,
                      hits[w][u]);
}

Test(subnet, invalid_requests_are_refused)
{
    st_assignment a;
    cr_assert_eq(st_assignment_make(4, 8, 5, 1, 0, &a), ST_ERR_INVALID);
    cr_assert_eq(st_assignment_make(4, 0, 1, 1, 0, &a), ST_ERR_INVALID);
    cr_assert_eq(st_assignment_make(0, 8, 1, 1, 0, &a), ST_ERR_INVALID);
    cr_assert_eq(st_assignment_make(4, 8, 0, 1, 0, &a), ST_ERR_INVALID);
    cr_assert_null(a.held);
}

Test(subnet, names_round_trip)
{
    st_subnet_kind k;
    st_masking m;
    cr_assert_eq(st_subnet_kind_parse("block", &k), ST_OK);
    cr_assert_eq(k, ST_SUBNET_BLOCK);
    cr_assert_eq(st_subnet_kind_parse("layer", &k), ST_ERR_INVALID);
    cr_assert_eq(st_masking_parse("backward", &m), ST_OK);
    cr_assert_eq(m, ST_MASKING_BACKWARD);
    cr_assert_str_eq(st_masking_name(ST_MASKING_FORWARD), "forward");
}

/* ------------------------------------------------------------ unbiasedness */

/* Backward masking's gradient is unbiased: each unit's gradient is averaged
 * over its k holders, a uniformly random k-subset of the workers, so over
 * many draws the engine's result tends to the mean over all N workers.
 * Fixed per-worker gradients, UB_DRAWS assignments, the real reduction
 * engine; every coordinate within 6 standard errors of the k-subset mean
 * (sampling without replacement: var = s2 / k (N - k) / (N - 1), s2 the
 * workers' variance).  A scheme that divided by N instead of k would be
 * biased by (1 - k/N) of the mean: the same bound must reject it. */
#define UB_N 4
#define UB_UNITS 8
#define UB_UNIT 16
#define UB_SHARED 32
#define UB_P (UB_SHARED + UB_UNITS * UB_UNIT)
#define UB_K 2
#define UB_DRAWS 300

static void reduce_once(const float g[UB_N][UB_P], const st_assignment *a, float *out)
{
    st_comm *c;
    st_comm_config cfg = { .n_workers = UB_N, .n_params = UB_P, .domain_of = NULL, .roles = ST_COMM_REDUCE };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_OK, "%s", st_last_error());
    int failures = 0;
#pragma omp parallel num_threads(UB_N) reduction(+ : failures)
    {
        int w = omp_get_thread_num();
        st_arena arena;
        st_arena_init(&arena, "ub", NULL, 0);
        st_range held[1 + UB_UNITS];
        int n = 0;
        held[n++] = (st_range){ 0, UB_SHARED };
        for (int u = 0; u < UB_UNITS; u++)
            if (st_assignment_holds(a, w, u))
                held[n++] = (st_range){ UB_SHARED + (size_t)u * UB_UNIT,
                                        UB_SHARED + (size_t)(u + 1) * UB_UNIT };
        float params[UB_P] = { 0 };
        st_status s = st_comm_attach(c, w, &arena, (float *)g[w], params, held, n);
        if (s == ST_OK)
            s = st_comm_reduce_scatter(c, w);
        if (s == ST_OK) {
            st_range sh = st_comm_shard(c, w);
            memcpy(out + sh.begin, st_comm_shard_grads(c, w), (sh.end - sh.begin) * sizeof *out);
        }
        failures += s != ST_OK;
        st_comm_barrier(c, w);
        st_arena_release(&arena);
    }
    cr_assert_eq(failures, 0, "%s", st_last_error());
    st_comm_destroy(c);
}

Test(subnet, holder_averaged_gradient_is_unbiased, .timeout = 60)
{
    static float g[UB_N][UB_P];
    st_rng r = st_rng_seed(77);
    for (int w = 0; w < UB_N; w++)
        for (int j = 0; j < UB_P; j++)
            g[w][j] = st_rng_normal(&r);
    double avg[UB_P] = { 0 };
    float out[UB_P];
    for (uint64_t d = 0; d < UB_DRAWS; d++) {
        st_assignment a;
        cr_assert_eq(st_assignment_make(UB_N, UB_UNITS, UB_K, 5, d, &a), ST_OK);
        reduce_once((const float(*)[UB_P])g, &a, out);
        for (int j = 0; j < UB_P; j++)
            avg[j] += out[j] / (double)UB_DRAWS;
        st_assignment_free(&a);
    }
    int biased_rejected = 0;
    for (int j = 0; j < UB_P; j++) {
        double mean = 0.0, s2 = 0.0;
        for (int w = 0; w < UB_N; w++)
            mean += g[w][j] / (double)UB_N;
        for (int w = 0; w < UB_N; w++)
            s2 += (g[w][j] - mean) * (g[w][j] - mean) / (double)UB_N;
        if (j < UB_SHARED) {
            cr_assert_float_eq(avg[j], mean, 1e-5, "shared element %d: every worker holds it", j);
            continue;
        }
        double var = s2 / UB_K * (UB_N - UB_K) / (UB_N - 1) / UB_DRAWS;
        double bound = 6.0 * sqrt(var) + 1e-5;
        cr_assert_leq(fabs(avg[j] - mean), bound, "element %d: %.5f against %.5f (bound %.5f)",
                      j, avg[j], mean, bound);
        double biased = avg[j] * UB_K / UB_N;
        biased_rejected += fabs(biased - mean) > bound;
    }
    cr_assert_geq(biased_rejected, UB_UNITS * UB_UNIT / 2,
                  "dividing by N instead of k is rejected on most elements (%d)", biased_rejected);
}

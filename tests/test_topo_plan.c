/*
 * tests/test_topo_plan.c — the placement plan: one domain, SMT, two and
 * eight domains, cpusets, purity, the printed table, teams of threads.
 *
 * Plans on synthetic topologies are checked exactly, worker by worker:
 * placement is a contract (the reduction engine and the memory layout
 * depend on which worker sits where), not a heuristic.
 *
 * load, make, the plan comparisons and printing: tests/topo_check.h.
 */
#include "topo_check.h"

/* ------------------------------------------------------------ helpers */

/* A plan that must fail with `status`, leave *p empty and say `needle`. */
static void make_fails(const st_topology *t, int workers, int over, const char *cpuset,
                       st_status status, const char *needle)
{
    st_plan p;
    memset(&p, 0xab, sizeof p);
    st_plan_request req = { .workers = workers, .oversubscribe = over, .cpuset = cpuset };
    st_status s = st_plan_make(t, &req, &p);
    cr_assert_eq(s, status, "%d workers, cpuset '%s': status %d, want %d (%s)", workers,
                 cpuset ? cpuset : "-", s, status, st_last_error());
    cr_assert_null(p.workers);
    cr_assert_null(p.domain_first);
    cr_assert_eq(p.n_workers, 0);
    cr_assert_eq(p.n_domains, 0);
    cr_assert(strstr(st_last_error(), needle), "message '%s' lacks '%s'", st_last_error(),
              needle);
}

typedef struct want {
    int domain, numa_os, core, pu, sibling, shared_pu;
} want;

/* Every field of every worker, plus the invariants of the plan's layout. */
static void expect(const st_plan *p, int n, const want *w)
{
    cr_assert_eq(p->n_workers, n, "n_workers %d, want %d", p->n_workers, n);
    for (int i = 0; i < n; i++) {
        const st_placement *g = &p->workers[i];
        cr_assert_eq(g->worker, i);
        cr_assert_eq(g->domain, w[i].domain, "worker %d: domain %d, want %d", i, g->domain,
                     w[i].domain);
        cr_assert_eq(g->numa_os, w[i].numa_os, "worker %d: numa_os %d, want %d", i,
                     g->numa_os, w[i].numa_os);
        cr_assert_eq(g->core, w[i].core, "worker %d: core %d, want %d", i, g->core, w[i].core);
        cr_assert_eq(g->pu, w[i].pu, "worker %d: pu %d, want %d", i, g->pu, w[i].pu);
        cr_assert_eq(g->sibling, w[i].sibling, "worker %d: sibling %d, want %d", i,
                     g->sibling, w[i].sibling);
        cr_assert_eq(g->shared_pu, w[i].shared_pu, "worker %d: shared_pu %d, want %d", i,
                     g->shared_pu, w[i].shared_pu);
    }
    /* Workers of a domain are consecutive and domain_first says where. */
    cr_assert_eq(p->domain_first[0], 0);
    cr_assert_eq(p->domain_first[p->n_domains], n);
    for (int d = 0; d < p->n_domains; d++) {
        cr_assert_lt(p->domain_first[d], p->domain_first[d + 1], "domain %d is empty", d);
        for (int i = p->domain_first[d]; i < p->domain_first[d + 1]; i++)
            cr_assert_eq(p->workers[i].domain, d);
    }
}

/* Workers per plan domain. */
static void expect_counts(const st_plan *p, int n_domains, const int *count)
{
    cr_assert_eq(p->n_domains, n_domains, "n_domains %d, want %d", p->n_domains, n_domains);
    for (int d = 0; d < n_domains; d++)
        cr_assert_eq(p->domain_first[d + 1] - p->domain_first[d], count[d],
                     "domain %d has %d workers, want %d", d,
                     p->domain_first[d + 1] - p->domain_first[d], count[d]);
}

/* ------------------------------------------------------------ one domain */

Test(plan, one_domain_one_worker_per_core)
{
    st_topology *t = load("synthetic:pack:1 numa:1 core:4 pu:1");
    const want all[4] = { { 0, 0, 0, 0, 0, 0 }, { 0, 0, 1, 1, 0, 0 }, { 0, 0, 2, 2, 0, 0 },
                          { 0, 0, 3, 3, 0, 0 } };
    const int sizes[] = { 0, 2, 4 };
    const int expected_n[] = { 4, 2, 4 };
    for (int i = 0; i < 3; i++) {
        st_plan p;
        make(t, sizes[i], 0, NULL, &p);
        expect(&p, expected_n[i], all);
        expect_counts(&p, 1, &expected_n[i]);
        expect_available(&p, 4, 4);
        cr_assert_eq(p.oversubscribed, 0);
        cr_assert_str_empty(p.warning);
        st_plan_free(&p);
    }
    st_topology_destroy(t);
}

Test(plan, one_domain_more_workers_than_pus)
{
    st_topology *t = load("synthetic:pack:1 numa:1 core:4 pu:1");
    make_fails(t, 5, 0, NULL, ST_ERR_INVALID, "5 workers but only 4 PUs are allowed");
    make_fails(t, 5, 0, NULL, ST_ERR_INVALID, "--oversubscribe");
    make_fails(t, 5, 0, NULL, ST_ERR_INVALID, "--workers 4");

    st_plan p;
    make(t, 5, 1, NULL, &p);
    const want w[5] = { { 0, 0, 0, 0, 0, 1 }, { 0, 0, 1, 1, 0, 0 }, { 0, 0, 2, 2, 0, 0 },
                        { 0, 0, 3, 3, 0, 0 }, { 0, 0, 0, 0, 0, 1 } };
    expect(&p, 5, w);
    cr_assert_eq(p.oversubscribed, 1);
    cr_assert_str_not_empty(p.warning);
    cr_assert(strstr(p.warning, "oversubscribed"), "warning: %s", p.warning);
    st_plan_free(&p);

    /* Oversubscription is not needed, so not reported, when it fits. */
    make(t, 4, 1, NULL, &p);
    cr_assert_eq(p.oversubscribed, 0);
    cr_assert_str_empty(p.warning);
    st_plan_free(&p);
    st_topology_destroy(t);
}

Test(plan, worker_count_limits)
{
    st_topology *t = load("synthetic:pack:1 numa:1 core:4 pu:1");
    make_fails(t, -1, 0, NULL, ST_ERR_INVALID, "-1 workers");
    make_fails(t, 65537, 1, NULL, ST_ERR_INVALID, "65537 workers");
    st_topology_destroy(t);
}

/* ------------------------------------------------------------ SMT */

Test(plan, smt_siblings_only_after_every_core)
{
    st_topology *t = load("synthetic:pack:1 numa:1 core:4 pu:2");
    st_plan p;

    make(t, 4, 0, NULL, &p);
    const want four[4] = { { 0, 0, 0, 0, 0, 0 }, { 0, 0, 1, 2, 0, 0 }, { 0, 0, 2, 4, 0, 0 },
                           { 0, 0, 3, 6, 0, 0 } };
    expect(&p, 4, four);
    expect_available(&p, 4, 8);
    st_plan_free(&p);

    make(t, 0, 0, NULL, &p); /* default: one per core */
    expect(&p, 4, four);
    st_plan_free(&p);

    make(t, 6, 0, NULL, &p);
    const want six[6] = { { 0, 0, 0, 0, 1, 0 }, { 0, 0, 1, 2, 1, 0 }, { 0, 0, 2, 4, 0, 0 },
                          { 0, 0, 3, 6, 0, 0 }, { 0, 0, 0, 1, 1, 0 }, { 0, 0, 1, 3, 1, 0 } };
    expect(&p, 6, six);
    cr_assert_eq(p.oversubscribed, 0);
    st_plan_free(&p);

    make(t, 8, 0, NULL, &p);
    const want eight[8] = { { 0, 0, 0, 0, 1, 0 }, { 0, 0, 1, 2, 1, 0 }, { 0, 0, 2, 4, 1, 0 },
                            { 0, 0, 3, 6, 1, 0 }, { 0, 0, 0, 1, 1, 0 }, { 0, 0, 1, 3, 1, 0 },
                            { 0, 0, 2, 5, 1, 0 }, { 0, 0, 3, 7, 1, 0 } };
    expect(&p, 8, eight);
    st_plan_free(&p);

    make_fails(t, 9, 0, NULL, ST_ERR_INVALID, "9 workers but only 8 PUs");
    make(t, 9, 1, NULL, &p);
    const want nine[9] = { { 0, 0, 0, 0, 1, 1 }, { 0, 0, 1, 2, 1, 0 }, { 0, 0, 2, 4, 1, 0 },
                           { 0, 0, 3, 6, 1, 0 }, { 0, 0, 0, 1, 1, 0 }, { 0, 0, 1, 3, 1, 0 },
                           { 0, 0, 2, 5, 1, 0 }, { 0, 0, 3, 7, 1, 0 }, { 0, 0, 0, 0, 1, 1 } };
    expect(&p, 9, nine);
    cr_assert_eq(p.oversubscribed, 1);
    cr_assert_str_not_empty(p.warning);
    st_plan_free(&p);
    st_topology_destroy(t);
}

/* Siblings numbered as many Intel servers do (CPU n and n + 4 share a
 * core): logical and OS indices differ, and the plan must use the first
 * PU of each core in logical order, reporting the OS index alongside. */
Test(plan, os_indices_differ_from_logical)
{
    st_topology *t = load("synthetic:pack:2 numa:1 core:2 pu:2(indexes=0,4,1,5,2,6,3,7)");
    st_plan p;
    make(t, 0, 0, NULL, &p);
    const want w[4] = { { 0, 0, 0, 0, 0, 0 }, { 0, 0, 1, 2, 0, 0 }, { 1, 1, 2, 4, 0, 0 },
                        { 1, 1, 3, 6, 0, 0 } };
    expect(&p, 4, w);
    const int os[4] = { 0, 1, 2, 3 };
    for (int i = 0; i < 4; i++)
        cr_assert_eq(p.workers[i].pu_os, os[i], "worker %d: pu_os %d", i, p.workers[i].pu_os);
    st_plan_free(&p);

    /* A cpuset is in OS indices: "4-7" is the second PU of every core. */
    make(t, 0, 0, "4-7", &p);
    const want sib[4] = { { 0, 0, 0, 1, 0, 0 }, { 0, 0, 1, 3, 0, 0 }, { 1, 1, 2, 5, 0, 0 },
                          { 1, 1, 3, 7, 0, 0 } };
    expect(&p, 4, sib);
    expect_available(&p, 4, 4);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(p.workers[i].pu_os, 4 + i);
    st_plan_free(&p);
    st_topology_destroy(t);
}

/* ------------------------------------------------------------ two domains */

Test(plan, two_domains_balanced)
{
    st_topology *t = load("synthetic:pack:2 numa:1 core:4 pu:2");
    st_plan p;

    make(t, 2, 0, NULL, &p);
    const want two[2] = { { 0, 0, 0, 0, 0, 0 }, { 1, 1, 4, 8, 0, 0 } };
    expect(&p, 2, two);
    expect_counts(&p, 2, (const int[]){ 1, 1 });
    expect_available(&p, 8, 16);
    st_plan_free(&p);

    make(t, 3, 0, NULL, &p);
    const want three[3] = { { 0, 0, 0, 0, 0, 0 }, { 0, 0, 1, 2, 0, 0 }, { 1, 1, 4, 8, 0, 0 } };
    expect(&p, 3, three);
    expect_counts(&p, 2, (const int[]){ 2, 1 });
    st_plan_free(&p);

    make(t, 8, 0, NULL, &p);
    const want eight[8] = { { 0, 0, 0, 0, 0, 0 }, { 0, 0, 1, 2, 0, 0 }, { 0, 0, 2, 4, 0, 0 },
                            { 0, 0, 3, 6, 0, 0 }, { 1, 1, 4, 8, 0, 0 }, { 1, 1, 5, 10, 0, 0 },
                            { 1, 1, 6, 12, 0, 0 }, { 1, 1, 7, 14, 0, 0 } };
    expect(&p, 8, eight);
    expect_counts(&p, 2, (const int[]){ 4, 4 });
    st_plan_free(&p);

    make(t, 12, 0, NULL, &p);
    const want twelve[12] = {
        { 0, 0, 0, 0, 1, 0 }, { 0, 0, 1, 2, 1, 0 }, { 0, 0, 2, 4, 0, 0 },
        { 0, 0, 3, 6, 0, 0 }, { 0, 0, 0, 1, 1, 0 }, { 0, 0, 1, 3, 1, 0 },
        { 1, 1, 4, 8, 1, 0 }, { 1, 1, 5, 10, 1, 0 }, { 1, 1, 6, 12, 0, 0 },
        { 1, 1, 7, 14, 0, 0 }, { 1, 1, 4, 9, 1, 0 }, { 1, 1, 5, 11, 1, 0 },
    };
    expect(&p, 12, twelve);
    expect_counts(&p, 2, (const int[]){ 6, 6 });
    st_plan_free(&p);
    st_topology_destroy(t);
}

Test(plan, two_domains_in_one_package)
{
    st_topology *t = load("synthetic:pack:1 numa:2 core:4 pu:1");
    st_plan p;
    make(t, 5, 0, NULL, &p);
    const want five[5] = { { 0, 0, 0, 0, 0, 0 }, { 0, 0, 1, 1, 0, 0 }, { 0, 0, 2, 2, 0, 0 },
                           { 1, 1, 4, 4, 0, 0 }, { 1, 1, 5, 5, 0, 0 } };
    expect(&p, 5, five);
    st_plan_free(&p);

    /* Oversubscribed: the extra workers go evenly to the domains, then
     * round-robin over each domain's PUs. */
    make(t, 11, 1, NULL, &p);
    expect_counts(&p, 2, (const int[]){ 6, 5 });
    const want eleven[11] = {
        { 0, 0, 0, 0, 0, 1 }, { 0, 0, 1, 1, 0, 1 }, { 0, 0, 2, 2, 0, 0 }, { 0, 0, 3, 3, 0, 0 },
        { 0, 0, 0, 0, 0, 1 }, { 0, 0, 1, 1, 0, 1 },
        { 1, 1, 4, 4, 0, 1 }, { 1, 1, 5, 5, 0, 0 }, { 1, 1, 6, 6, 0, 0 }, { 1, 1, 7, 7, 0, 0 },
        { 1, 1, 4, 4, 0, 1 },
    };
    expect(&p, 11, eleven);
    cr_assert_eq(p.oversubscribed, 1);
    st_plan_free(&p);
    st_topology_destroy(t);
}

/* ------------------------------------------------------------ eight domains */

Test(plan, eight_domains)
{
    st_topology *t = load("synthetic:pack:2 numa:4 core:16 pu:2");
    st_plan p;

    make(t, 0, 0, NULL, &p);
    cr_assert_eq(p.n_workers, 128);
    expect_available(&p, 128, 256);
    expect_counts(&p, 8, (const int[]){ 16, 16, 16, 16, 16, 16, 16, 16 });
    for (int w = 0; w < 128; w++) {
        cr_assert_eq(p.workers[w].domain, w / 16);
        cr_assert_eq(p.workers[w].numa_os, w / 16);
        cr_assert_eq(p.workers[w].core, w);
        cr_assert_eq(p.workers[w].pu, 2 * w);
        cr_assert_eq(p.workers[w].pu_os, 2 * w);
        cr_assert_eq(p.workers[w].sibling, 0);
        cr_assert_eq(p.workers[w].shared_pu, 0);
    }
    st_plan_free(&p);

    make(t, 8, 0, NULL, &p);
    want one_each[8];
    for (int d = 0; d < 8; d++)
        one_each[d] = (want){ d, d, 16 * d, 32 * d, 0, 0 };
    expect(&p, 8, one_each);
    st_plan_free(&p);

    make(t, 20, 0, NULL, &p);
    const int counts[8] = { 3, 3, 3, 3, 2, 2, 2, 2 };
    expect_counts(&p, 8, counts);
    want twenty[20];
    for (int d = 0, w = 0; d < 8; d++)
        for (int i = 0; i < counts[d]; i++, w++)
            twenty[w] = (want){ d, d, 16 * d + i, 32 * d + 2 * i, 0, 0 };
    expect(&p, 20, twenty);
    st_plan_free(&p);

    /* 3 workers: only the first three domains hold workers. */
    make(t, 3, 0, NULL, &p);
    expect_counts(&p, 3, (const int[]){ 1, 1, 1 });
    expect_available(&p, 128, 256);
    st_plan_free(&p);

    /* 136 = every core and one sibling per domain, on each domain's core 0. */
    make(t, 136, 0, NULL, &p);
    expect_counts(&p, 8, (const int[]){ 17, 17, 17, 17, 17, 17, 17, 17 });
    for (int d = 0; d < 8; d++) {
        const st_placement *s = &p.workers[p.domain_first[d] + 16];
        cr_assert_eq(s->core, 16 * d);
        cr_assert_eq(s->pu, 32 * d + 1);
        cr_assert_eq(s->sibling, 1);
        cr_assert_eq(p.workers[p.domain_first[d]].sibling, 1);
        cr_assert_eq(p.workers[p.domain_first[d] + 1].sibling, 0);
    }
    st_plan_free(&p);

    make(t, 256, 0, NULL, &p);
    cr_assert_eq(p.oversubscribed, 0);
    st_plan_free(&p);
    make_fails(t, 257, 0, NULL, ST_ERR_INVALID, "257 workers but only 256 PUs");
    st_topology_destroy(t);
}

/* ------------------------------------------------------------ cpusets */

Test(plan, restricted_cpuset)
{
    st_topology *t = load("synthetic:pack:1 numa:2 core:4 pu:1");
    st_plan p;

    make(t, 6, 0, "0-5", &p);
    const want six[6] = { { 0, 0, 0, 0, 0, 0 }, { 0, 0, 1, 1, 0, 0 }, { 0, 0, 2, 2, 0, 0 },
                          { 0, 0, 3, 3, 0, 0 }, { 1, 1, 4, 4, 0, 0 }, { 1, 1, 5, 5, 0, 0 } };
    expect(&p, 6, six);
    expect_counts(&p, 2, (const int[]){ 4, 2 });
    expect_available(&p, 6, 6);
    st_plan_free(&p);

    make(t, 0, 0, "0-5", &p); /* default: one per allowed core */
    expect(&p, 6, six);
    st_plan_free(&p);

    make(t, 4, 0, "0-5", &p);
    const want four[4] = { { 0, 0, 0, 0, 0, 0 }, { 0, 0, 1, 1, 0, 0 }, { 1, 1, 4, 4, 0, 0 },
                           { 1, 1, 5, 5, 0, 0 } };
    expect(&p, 4, four);
    expect_counts(&p, 2, (const int[]){ 2, 2 });
    st_plan_free(&p);

    make(t, 0, 0, "4-7", &p);
    const want second[4] = { { 0, 1, 4, 4, 0, 0 }, { 0, 1, 5, 5, 0, 0 }, { 0, 1, 6, 6, 0, 0 },
                             { 0, 1, 7, 7, 0, 0 } };
    expect(&p, 4, second);
    expect_counts(&p, 1, (const int[]){ 4 });
    expect_available(&p, 4, 4);
    st_plan_free(&p);
    make(t, 0, 0, "4-", &p);   /* N and above: the same PUs */
    expect(&p, 4, second);
    expect_available(&p, 4, 4);
    st_plan_free(&p);

    make_fails(t, 7, 0, "0-5", ST_ERR_INVALID, "7 workers but only 6 PUs");
    make_fails(t, 0, 0, "0-8", ST_ERR_INVALID, "PU 8 is not in the topology");
    make_fails(t, 0, 0, "3,9-10", ST_ERR_INVALID, "PUs 9-10 are not in");
    make_fails(t, 0, 0, "", ST_ERR_INVALID, "names no PU");
    make_fails(t, 0, 0, "abc", ST_ERR_INVALID, "'abc'");
    make_fails(t, 0, 0, "9-", ST_ERR_INVALID, "cpuset '9-': PUs 9- are not in the topology");
    /* digits only: hwloc's own parser takes -1 (printed as "PU  is not in the
     * topology") and wraps 2^32 + 1 to PU 1 */
    make_fails(t, 0, 0, "-1", ST_ERR_INVALID, "expected a list of OS PU indices");
    make_fails(t, 0, 0, "4294967297", ST_ERR_INVALID, "cpuset '4294967297': PU 4294967297 "
               "is not in the topology");
    make_fails(t, 0, 0, "1,18446744073709551617", ST_ERR_INVALID,
               "PU 18446744073709551617 is not in the topology");
    make_fails(t, 0, 0, "0-4294967297", ST_ERR_INVALID, "PUs 8-4294967297 are not in");
    make_fails(t, 0, 0, "5-2", ST_ERR_INVALID, "the range 5-2 runs backwards");
    make_fails(t, 0, 0, "0,,1", ST_ERR_INVALID, "expected a list");
    make_fails(t, 0, 0, " 1", ST_ERR_INVALID, "expected a list");
    make_fails(t, 0, 0, "+1", ST_ERR_INVALID, "expected a list");
    make_fails(t, 0, 0, "0x1", ST_ERR_INVALID, "expected a list");
    make(t, 0, 0, "1,3-4,7", &p);
    cr_assert_eq(p.n_workers, 4);
    st_plan_free(&p);
    st_topology_destroy(t);
}

Test(plan, cpuset_with_part_of_a_core)
{
    st_topology *t = load("synthetic:pack:1 numa:1 core:4 pu:2");
    st_plan p;
    make(t, 0, 0, "0,1,2", &p); /* core 0 whole, core 1 half */
    const want two[2] = { { 0, 0, 0, 0, 0, 0 }, { 0, 0, 1, 2, 0, 0 } };
    expect(&p, 2, two);
    expect_available(&p, 2, 3);
    st_plan_free(&p);

    make(t, 3, 0, "0,1,2", &p);
    const want three[3] = { { 0, 0, 0, 0, 1, 0 }, { 0, 0, 1, 2, 0, 0 }, { 0, 0, 0, 1, 1, 0 } };
    expect(&p, 3, three);
    st_plan_free(&p);
    st_topology_destroy(t);
}

/* ------------------------------------------------------------ purity, printing */

Test(plan, same_request_same_plan)
{
    const char *specs[] = { "synthetic:pack:2 numa:4 core:16 pu:2", NULL };
    for (int i = 0; i < 2; i++) {
        st_topology *t = load(specs[i]);
        st_plan a, b;
        make(t, 0, 0, NULL, &a);
        make(t, 0, 0, NULL, &b);
        expect_same_plan(&a, &b);
        st_plan_free(&a);
        st_plan_free(&b);
        st_topology_destroy(t);
    }
}

/* Rows of the table: lines that start with a worker number. */
static int count_rows(const char *text, int *siblings)
{
    int rows = 0;
    *siblings = 0;
    for (const char *line = text; *line; ) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char buf[256];
        snprintf(buf, sizeof buf, "%.*s", (int)len, line);
        int w, used = 0;
        if (sscanf(buf, "%d%n", &w, &used) == 1 && used > 0) {
            rows++;
            *siblings += strstr(buf, "SMT sibling") != NULL;
        }
        line += len + (end ? 1 : 0);
    }
    return rows;
}

Test(plan, printed_table_has_a_row_per_worker)
{
    st_topology *t = load("synthetic:pack:2 numa:1 core:4 pu:2");
    const int sizes[] = { 1, 3, 8, 12, 16 };
    const int siblings[] = { 0, 0, 0, 8, 16 };
    for (int i = 0; i < 5; i++) {
        st_plan p;
        make(t, sizes[i], 0, NULL, &p);
        char *text = print_plan(t, &p);
        int sib;
        cr_assert_eq(count_rows(text, &sib), sizes[i], "%d workers:\n%s", sizes[i], text);
        cr_assert_eq(sib, siblings[i], "%d workers:\n%s", sizes[i], text);
        cr_assert(strstr(text, "synthetic:pack:2 numa:1 core:4 pu:2"), "%s", text);
        cr_assert_null(strstr(text, "warning"), "%s", text);
        free(text);
        st_plan_free(&p);
    }
    st_plan p;
    make(t, 20, 1, NULL, &p);
    char *text = print_plan(t, &p);
    int sib;
    cr_assert_eq(count_rows(text, &sib), 20, "%s", text);
    cr_assert(strstr(text, "shared PU"), "%s", text);
    cr_assert(strstr(text, "warning: oversubscribed"), "%s", text);
    cr_log_info("an oversubscribed plan:\n%s", text);
    free(text);
    st_plan_free(&p);
    st_topology_destroy(t);
}

/* ------------------------------------------------------------ teams */

static st_status make_teams(const st_topology *t, int workers, int T, int spans, st_plan *p)
{
    st_plan_request req = { .workers = workers, .threads_per_worker = T, .team_spans = spans };
    return st_plan_make(t, &req, p);
}

/* Workers of T threads: each team is T whole cores of one domain while
 * the domains have them, the team's first PU is the placement's; a plan
 * of one-thread workers lists each worker's PU as its team. */
Test(plan, teams_take_whole_cores_of_one_domain)
{
    st_topology *t = load("synthetic:numa:2 core:4 pu:2");
    st_plan p;
    cr_assert_eq(make_teams(t, 4, 2, 0, &p), ST_OK, "%s", st_last_error());
    cr_assert_eq(p.threads_per_worker, 2);
    cr_assert_eq(p.n_domains, 2);
    for (int w = 0; w < 4; w++) {
        const st_placement *pl = &p.workers[w];
        cr_assert_eq(p.team_pu[2 * w], pl->pu);
        cr_assert_eq(pl->domain, w / 2, "two teams a domain");
        for (int k = 0; k < 2; k++) {
            const int pu = p.team_pu[2 * w + k];
            cr_assert_eq(pu / 8, pl->domain, "worker %d's PU %d is in its domain", w, pu);
            cr_assert_eq(pu % 2, 0, "a first PU of a core (no SMT sibling yet)");
        }
        cr_assert_not(pl->sibling || pl->shared_pu || pl->spans);
    }
    cr_assert_neq(p.team_pu[0], p.team_pu[1]);
    cr_assert_neq(p.team_pu[1], p.team_pu[2], "teams do not share a PU");
    st_plan_free(&p);
    make(t, 3, 0, NULL, &p);
    cr_assert_eq(p.threads_per_worker, 1);
    for (int w = 0; w < 3; w++)
        cr_assert_eq(p.team_pu[w], p.workers[w].pu);
    st_plan_free(&p);
    st_topology_destroy(t);
}

/* A team that cannot stay in one domain is refused, naming the option
 * that allows it; allowed, it is marked and the plan warns. */
Test(plan, a_team_across_domains_only_when_allowed)
{
    st_topology *t = load("synthetic:numa:2 core:3 pu:2");
    st_plan p;
    memset(&p, 0, sizeof p);
    cr_assert_eq(make_teams(t, 3, 4, 0, &p), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "--team-spans-domains"), "%s", st_last_error());
    cr_assert_null(p.workers);
    cr_assert_eq(make_teams(t, 3, 4, 1, &p), ST_OK, "%s", st_last_error());
    int spanning = 0;
    for (int w = 0; w < 3; w++)
        spanning += p.workers[w].spans;
    cr_assert_eq(spanning, 1);
    cr_assert(strstr(p.warning, "span"), "%s", p.warning);
    st_plan_free(&p);
    cr_assert_eq(make_teams(t, 4, 4, 1, &p), ST_ERR_INVALID, "16 PUs of 12");
    cr_assert(strstr(st_last_error(), "--oversubscribe"), "%s", st_last_error());
    st_topology_destroy(t);
}

/*
 * tests/topo_check.h — what the suites of topologies, plans and binding
 * share (tests/test_topo_*.c): a topology loaded and a plan made that must
 * succeed, the plan's count of what is available, two plans compared, a
 * plan printed to a string.  Header-only, every function static inline.
 */
#ifndef SUBTRAIN_TESTS_TOPO_CHECK_H
#define SUBTRAIN_TESTS_TOPO_CHECK_H

#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <hwloc.h>

#include <subtrain/topo.h>
#include "topo/topo_internal.h"

/* ------------------------------------------------------------ helpers */

static inline st_topology *load(const char *spec)
{
    st_topology *t = NULL;
    st_status s = st_topology_load(spec, &t);
    cr_assert_eq(s, ST_OK, "loading '%s': %s", spec ? spec : "(this machine)", st_last_error());
    cr_assert_not_null(t);
    return t;
}

static inline void make(const st_topology *t, int workers, int over, const char *cpuset, st_plan *p)
{
    st_plan_request req = { .workers = workers, .oversubscribe = over, .cpuset = cpuset };
    st_status s = st_plan_make(t, &req, p);
    cr_assert_eq(s, ST_OK, "%s, %d workers, cpuset %s: %s", st_topology_name(t), workers,
                 cpuset ? cpuset : "-", st_last_error());
}

static inline void expect_available(const st_plan *p, int cores, int pus)
{
    cr_assert_eq(p->cores_available, cores, "cores_available %d, want %d", p->cores_available,
                 cores);
    cr_assert_eq(p->pus_available, pus, "pus_available %d, want %d", p->pus_available, pus);
}

static inline void expect_same_plan(const st_plan *a, const st_plan *b)
{
    cr_assert_eq(a->n_workers, b->n_workers);
    cr_assert_eq(a->n_domains, b->n_domains);
    cr_assert_eq(a->cores_available, b->cores_available);
    cr_assert_eq(a->pus_available, b->pus_available);
    cr_assert_eq(a->oversubscribed, b->oversubscribed);
    cr_assert_str_eq(a->warning, b->warning);
    cr_assert_eq(memcmp(a->workers, b->workers, (size_t)a->n_workers * sizeof *a->workers), 0);
    cr_assert_eq(memcmp(a->domain_first, b->domain_first,
                        (size_t)(a->n_domains + 1) * sizeof *a->domain_first), 0);
}

static inline char *print_plan(const st_topology *t, const st_plan *p)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_not_null(f);
    st_plan_print(f, t, p);
    cr_assert_eq(fclose(f), 0);
    return text;
}

#endif /* SUBTRAIN_TESTS_TOPO_CHECK_H */

/*
 * tests/test_topo.c — topologies (this machine, synthetic, XML), the
 * placement plan, binding and the NUMA chunk backend.
 *
 * Plans on synthetic topologies are checked exactly, worker by worker:
 * placement is a contract (the reduction engine and the memory layout
 * depend on which worker sits where), not a heuristic.  Binding and NUMA
 * allocation are checked on the machine the tests run on, against hwloc's
 * own view of it, without assuming its size.
 */
#define _GNU_SOURCE /* sched_getcpu */
#include "testutil.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <hwloc.h>
#include <omp.h>

#include <subtrain/arena.h>
#include <subtrain/topo.h>
#include "topo/topo_internal.h"

/* ------------------------------------------------------------ helpers */

static st_topology *load(const char *spec)
{
    st_topology *t = NULL;
    st_status s = st_topology_load(spec, &t);
    cr_assert_eq(s, ST_OK, "loading '%s': %s", spec ? spec : "(this machine)", st_last_error());
    cr_assert_not_null(t);
    return t;
}

static void make(const st_topology *t, int workers, int over, const char *cpuset, st_plan *p)
{
    st_plan_request req = { .workers = workers, .oversubscribe = over, .cpuset = cpuset };
    st_status s = st_plan_make(t, &req, p);
    cr_assert_eq(s, ST_OK, "%s, %d workers, cpuset %s: %s", st_topology_name(t), workers,
                 cpuset ? cpuset : "-", st_last_error());
}

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

static void expect_available(const st_plan *p, int cores, int pus)
{
    cr_assert_eq(p->cores_available, cores, "cores_available %d, want %d", p->cores_available,
                 cores);
    cr_assert_eq(p->pus_available, pus, "pus_available %d, want %d", p->pus_available, pus);
}

/* ------------------------------------------------------------ loading */

Test(topology, synthetic_counts_and_name)
{
    st_topology *t = load("synthetic:pack:2 numa:4 core:16 pu:2");
    cr_assert_eq(st_topology_is_this_machine(t), 0);
    cr_assert_str_eq(st_topology_name(t), "synthetic:pack:2 numa:4 core:16 pu:2");
    cr_assert_eq(st_topology_numa_count(t), 8);
    cr_assert_eq(st_topology_core_count(t), 128);
    cr_assert_eq(st_topology_pu_count(t), 256);
    st_topology_destroy(t);
}

Test(topology, synthetic_os_indices_equal_logical_by_default)
{
    st_topology *t = load("synthetic:pack:2 numa:1 core:4 pu:2");
    hwloc_topology_t hw = st_topology_hwloc(t);
    for (int i = 0; i < st_topology_pu_count(t); i++)
        cr_assert_eq(hwloc_get_obj_by_type(hw, HWLOC_OBJ_PU, (unsigned)i)->os_index,
                     (unsigned)i);
    for (int i = 0; i < st_topology_numa_count(t); i++)
        cr_assert_eq(hwloc_get_obj_by_type(hw, HWLOC_OBJ_NUMANODE, (unsigned)i)->os_index,
                     (unsigned)i);
    st_topology_destroy(t);
}

Test(topology, this_machine_matches_hwloc)
{
    st_topology *t = load(NULL);
    hwloc_topology_t hw = st_topology_hwloc(t);
    cr_assert_eq(st_topology_is_this_machine(t), 1);
    cr_assert_str_eq(st_topology_name(t), "this machine");
    cr_assert_eq(st_topology_numa_count(t), hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_NUMANODE));
    cr_assert_eq(st_topology_pu_count(t), hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_PU));
    int cores = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_CORE);
    cr_assert_eq(st_topology_core_count(t), cores > 0 ? cores : st_topology_pu_count(t));
    cr_log_info("this machine: %d NUMA nodes, %d cores, %d PUs", st_topology_numa_count(t),
                st_topology_core_count(t), st_topology_pu_count(t));
    st_topology_destroy(t);

    st_topology *e = load("");
    cr_assert_eq(st_topology_is_this_machine(e), 1);
    st_topology_destroy(e);
}

static void load_fails(const char *spec, st_status status, const char *needle)
{
    st_topology *t = (st_topology *)&t; /* not NULL: must be cleared */
    st_status s = st_topology_load(spec, &t);
    cr_assert_eq(s, status, "'%s': status %d, want %d (%s)", spec, s, status, st_last_error());
    cr_assert_null(t);
    cr_assert(strstr(st_last_error(), needle), "'%s': message '%s' lacks '%s'", spec,
              st_last_error(), needle);
}

Test(topology, bad_specs_say_what_is_wrong)
{
    load_fails("synthetic:nonsense", ST_ERR_INVALID, "nonsense");
    load_fails("synthetic:", ST_ERR_INVALID, "no description");
    load_fails("xml:/nonexistent.xml", ST_ERR_IO, "/nonexistent.xml");
    load_fails("xml:/nonexistent.xml", ST_ERR_IO, "No such file");
    load_fails("xml:", ST_ERR_INVALID, "no file name");
    load_fails("xml:/tmp", ST_ERR_IO, "directory");
    load_fails("bogus:x", ST_ERR_INVALID, "'bogus:x'");
    load_fails("bogus:x", ST_ERR_INVALID, "synthetic:");
    load_fails("bogus:x", ST_ERR_INVALID, "xml:FILE");
}

/* Described topologies past the size limit (topo/limits.c) are refused
 * before hwloc builds them, in a moment: these took hwloc minutes, or
 * forever.  The timeout only guards against the hang returning. */
Test(topology, too_large_descriptions_are_refused_before_loading, .timeout = 60)
{
    load_fails("synthetic:core:20000 pu:1", ST_ERR_INVALID, "is too large: 20000 PUs, up to "
               "20000 under one parent");
    load_fails("synthetic:pack:65536 pu:65536", ST_ERR_INVALID, "4294967296 PUs");
    load_fails("synthetic:core:0x1000 pu:1", ST_ERR_INVALID, "4096 PUs");   /* hwloc's base 0 */
    load_fails("synthetic:core:1024 pu:16", ST_ERR_INVALID, "16384 PUs");
    load_fails("synthetic:pack:2(memory=1GB) core:4096 pu:1", ST_ERR_INVALID, "8192 PUs");
    load_fails("synthetic:pack:16 [numa] core:1024 pu:2", ST_ERR_INVALID, "32768 PUs");
    /* the same through hwloc's environment, which the default load reads */
    cr_assert_eq(setenv("HWLOC_SYNTHETIC", "core:20000 pu:1", 1), 0);
    load_fails(NULL, ST_ERR_INVALID, "topology HWLOC_SYNTHETIC='core:20000 pu:1' is too large");
    cr_assert_eq(setenv("HWLOC_COMPONENTS", "synthetic", 1), 0);
    load_fails(NULL, ST_ERR_INVALID, "HWLOC_SYNTHETIC='core:20000 pu:1'");
    unsetenv("HWLOC_COMPONENTS");
    unsetenv("HWLOC_SYNTHETIC");
}

/* Realistic large machines stay within the limit: 2048 PUs as 8 packages
 * of 2 domains of 64 two-thread cores, and 4096 cores in 64 domains. */
Test(topology, large_real_machines_load)
{
    st_topology *t = load("synthetic:pack:8 numa:2 core:64 pu:2");
    cr_assert_eq(st_topology_pu_count(t), 2048);
    cr_assert_eq(st_topology_core_count(t), 1024);
    cr_assert_eq(st_topology_numa_count(t), 16);
    st_topology_destroy(t);
    t = load("synthetic:pack:8 numa:8 core:64 pu:1");
    cr_assert_eq(st_topology_core_count(t), 4096);
    cr_assert_eq(st_topology_numa_count(t), 64);
    st_topology_destroy(t);
}

/* A default load that hwloc's environment turned into another machine is
 * named after the variable, not "this machine". */
Test(topology, environment_described_topology_is_named)
{
    unsetenv("HWLOC_THISSYSTEM");
    cr_assert_eq(setenv("HWLOC_SYNTHETIC", "pack:2 pu:1", 1), 0);
    st_topology *t = load(NULL);
    cr_assert_eq(st_topology_is_this_machine(t), 0);
    cr_assert_str_eq(st_topology_name(t), "HWLOC_SYNTHETIC='pack:2 pu:1'");
    cr_assert_eq(st_topology_pu_count(t), 2);
    st_topology_destroy(t);
    unsetenv("HWLOC_SYNTHETIC");
}

/* An lstopo export of 8192 cores side by side under the machine: small
 * as a file (6 MiB) but past the import limit; the same cores in 64
 * domains pass it. */
static void write_flat_xml(const char *path, int cores, int domains)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    hwloc_bitmap_t b = hwloc_bitmap_alloc();
    char *s = NULL;
    hwloc_bitmap_set_range(b, 0, cores - 1);
    hwloc_bitmap_asprintf(&s, b);
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE topology SYSTEM "
            "\"hwloc2.dtd\">\n<topology version=\"2.0\">\n<object type=\"Machine\" "
            "os_index=\"0\" cpuset=\"%s\" complete_cpuset=\"%s\" nodeset=\"0x%x\" "
            "complete_nodeset=\"0x%x\" gp_index=\"1\">\n", s, s, (1u << domains) - 1,
            (1u << domains) - 1);
    free(s);
    int gp = 2, per = cores / domains;
    for (int d = 0; d < domains; d++) {
        hwloc_bitmap_zero(b);
        hwloc_bitmap_set_range(b, d * per, d * per + per - 1);
        hwloc_bitmap_asprintf(&s, b);
        const unsigned node = 1u << d;
        fprintf(f, "<object type=\"Package\" os_index=\"%d\" cpuset=\"%s\" "
                "complete_cpuset=\"%s\" nodeset=\"0x%x\" complete_nodeset=\"0x%x\" "
                "gp_index=\"%d\">\n<object type=\"NUMANode\" os_index=\"%d\" cpuset=\"%s\" "
                "complete_cpuset=\"%s\" nodeset=\"0x%x\" complete_nodeset=\"0x%x\" "
                "gp_index=\"%d\" local_memory=\"1073741824\"/>\n",
                d, s, s, node, node, gp, d, s, s, node, node, gp + 1);
        gp += 2;
        free(s);
        for (int c = d * per; c < d * per + per; c++) {
            hwloc_bitmap_only(b, (unsigned)c);
            hwloc_bitmap_asprintf(&s, b);
            fprintf(f, "<object type=\"Core\" os_index=\"%d\" cpuset=\"%s\" "
                    "complete_cpuset=\"%s\" nodeset=\"0x%x\" complete_nodeset=\"0x%x\" "
                    "gp_index=\"%d\">\n<object type=\"PU\" os_index=\"%d\" cpuset=\"%s\" "
                    "complete_cpuset=\"%s\" nodeset=\"0x%x\" complete_nodeset=\"0x%x\" "
                    "gp_index=\"%d\"/>\n</object>\n", c, s, s, node, node, gp, c, s, s, node,
                    node, gp + 1);
            gp += 2;
            free(s);
        }
        fprintf(f, "</object>\n");
    }
    fprintf(f, "</object>\n</topology>\n");
    hwloc_bitmap_free(b);
    cr_assert_eq(fclose(f), 0);
}

Test(topology, too_large_xml_is_refused_before_loading, .timeout = 60)
{
    char dir[ST_TEST_PATH_MAX], path[ST_TEST_PATH_MAX], spec[ST_TEST_PATH_MAX + 8];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(path, dir, "flat.xml");
    write_flat_xml(path, 8192, 1);
    snprintf(spec, sizeof spec, "xml:%s", path);
    load_fails(spec, ST_ERR_INVALID, "is too large: 8192 PUs");
    cr_assert_eq(setenv("HWLOC_XMLFILE", path, 1), 0);
    load_fails(NULL, ST_ERR_INVALID, "HWLOC_XMLFILE=");
    unsetenv("HWLOC_XMLFILE");
    /* the limit counts the tree, not the file: 1024 cores in 8 packages */
    write_flat_xml(path, 1024, 8);
    st_topology *t = load(spec);
    cr_assert_eq(st_topology_core_count(t), 1024);
    cr_assert_eq(st_topology_numa_count(t), 8);
    st_topology_destroy(t);
    st_test_rmdir(dir);
}

Test(topology, xml_that_is_not_xml_is_a_format_error)
{
    char dir[ST_TEST_PATH_MAX], path[ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(path, dir, "garbage.xml");
    const char junk[] = "this is not an lstopo export\n";
    cr_assert_eq(st_test_write_file(path, junk, sizeof junk - 1), 0);
    char spec[ST_TEST_PATH_MAX + 8];
    snprintf(spec, sizeof spec, "xml:%s", path);
    load_fails(spec, ST_ERR_FORMAT, path);
    st_test_rmdir(dir);
}

/* Exports `from` to dir/name and loads it back through "xml:". */
static st_topology *xml_round_trip(const st_topology *from, const char *dir, const char *name,
                                   char *path)
{
    st_test_path(path, dir, name);
    cr_assert_eq(hwloc_topology_export_xml(st_topology_hwloc(from), path, 0), 0,
                 "exporting to %s", path);
    char spec[ST_TEST_PATH_MAX + 8];
    snprintf(spec, sizeof spec, "xml:%s", path);
    st_topology *t = load(spec);
    cr_assert_str_eq(st_topology_name(t), spec);
    return t;
}

static void expect_same_plan(const st_plan *a, const st_plan *b)
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

Test(topology, xml_export_plans_like_the_original_and_is_not_this_machine)
{
    unsetenv("HWLOC_THISSYSTEM");
    char dir[ST_TEST_PATH_MAX], path[ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_topology *syn = load("synthetic:pack:2 numa:4 core:16 pu:2");
    st_topology *xml = xml_round_trip(syn, dir, "eight-domains.xml", path);
    cr_assert_eq(st_topology_is_this_machine(xml), 0);
    cr_assert_eq(st_topology_numa_count(xml), 8);
    cr_assert_eq(st_topology_core_count(xml), 128);
    cr_assert_eq(st_topology_pu_count(xml), 256);
    const int sizes[] = { 0, 8, 20, 200 };
    for (int i = 0; i < 4; i++) {
        st_plan a, b;
        make(syn, sizes[i], 0, NULL, &a);
        make(xml, sizes[i], 0, NULL, &b);
        expect_same_plan(&a, &b);
        st_plan_free(&a);
        st_plan_free(&b);
    }
    st_plan p;
    make(xml, 2, 0, NULL, &p);
    cr_assert_eq(st_plan_bind_self(xml, &p, 0), ST_ERR_TOPOLOGY);
    st_plan_free(&p);
    st_topology_destroy(xml);
    st_topology_destroy(syn);

    /* Even an export of this very machine describes it; it is not it. */
    st_topology *here = load(NULL);
    st_topology *copy = xml_round_trip(here, dir, "here.xml", path);
    cr_assert_eq(st_topology_is_this_machine(copy), 0);
    cr_assert_eq(st_topology_pu_count(copy), st_topology_pu_count(here));
    cr_assert_eq(st_topology_core_count(copy), st_topology_core_count(here));
    cr_assert_eq(st_topology_numa_count(copy), st_topology_numa_count(here));
    st_topology_destroy(copy);
    st_topology_destroy(here);
    st_test_rmdir(dir);
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

    make_fails(t, 7, 0, "0-5", ST_ERR_INVALID, "7 workers but only 6 PUs");
    make_fails(t, 0, 0, "0-8", ST_ERR_INVALID, "PU 8 is not in the topology");
    make_fails(t, 0, 0, "3,9-10", ST_ERR_INVALID, "PUs 9-10 are not in");
    make_fails(t, 0, 0, "", ST_ERR_INVALID, "names no PU");
    make_fails(t, 0, 0, "abc", ST_ERR_INVALID, "'abc'");
    make_fails(t, 0, 0, "2-", ST_ERR_INVALID, "not in the topology");
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

static char *print_plan(const st_topology *t, const st_plan *p)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_not_null(f);
    st_plan_print(f, t, p);
    cr_assert_eq(fclose(f), 0);
    return text;
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

/* ------------------------------------------------------------ binding env */

Test(topology, binding_env_warning_names_the_variables)
{
    unsetenv("OMP_PROC_BIND");
    unsetenv("OMP_PLACES");
    unsetenv("GOMP_CPU_AFFINITY");
    cr_assert_null(st_topology_binding_env_warning());

    setenv("OMP_PLACES", "", 1); /* set but empty: the runtimes ignore it too */
    cr_assert_null(st_topology_binding_env_warning());

    setenv("OMP_PLACES", "cores", 1);
    const char *w = st_topology_binding_env_warning();
    cr_assert_not_null(w);
    cr_assert(strstr(w, "OMP_PLACES is set"), "%s", w);
    cr_assert_null(strstr(w, "OMP_PROC_BIND"), "%s", w);
    cr_assert(strstr(w, "hwloc"), "%s", w);
    cr_assert(strstr(w, "ignores"), "%s", w);

    setenv("GOMP_CPU_AFFINITY", "0-3", 1);
    setenv("OMP_PROC_BIND", "close", 1);
    w = st_topology_binding_env_warning();
    cr_assert_not_null(w);
    cr_assert(strstr(w, "OMP_PROC_BIND, OMP_PLACES, GOMP_CPU_AFFINITY are set"), "%s", w);
}

/* ------------------------------------------------------------ binding */

Test(bind, refused_on_a_described_topology)
{
    st_topology *t = load("synthetic:pack:1 numa:1 core:4 pu:1");
    st_plan p;
    make(t, 0, 0, NULL, &p);
    st_status s = st_plan_bind_self(t, &p, 0);
    cr_assert_eq(s, ST_ERR_TOPOLOGY);
    cr_assert(strstr(st_last_error(), "cannot bind on a described topology "
                                      "(synthetic:pack:1 numa:1 core:4 pu:1)"),
              "%s", st_last_error());
    st_plan_free(&p);
    st_topology_destroy(t);
}

Test(bind, worker_out_of_range)
{
    st_topology *t = load(NULL);
    st_plan p;
    make(t, 1, 0, NULL, &p);
    cr_assert_eq(st_plan_bind_self(t, &p, 1), ST_ERR_INVALID);
    cr_assert_eq(st_plan_bind_self(t, &p, -1), ST_ERR_INVALID);
    st_plan_free(&p);
    st_topology_destroy(t);
}

/* What hwloc says this process may use: the plan's default must agree.
 * With OpenMP binding variables in the environment (someone runs the tests
 * so), libgomp has bound this thread and the plan takes the system's PUs. */
static void process_allowed(hwloc_topology_t hw, int *cores, int *pus)
{
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (st_topology_binding_env_warning() ||
        hwloc_get_cpubind(hw, set, HWLOC_CPUBIND_PROCESS) != 0)
        hwloc_bitmap_copy(set, hwloc_topology_get_allowed_cpuset(hw));
    hwloc_bitmap_and(set, set, hwloc_topology_get_topology_cpuset(hw));
    *pus = hwloc_bitmap_weight(set);
    int n_cores = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_CORE);
    *cores = 0;
    for (int i = 0; i < n_cores; i++)
        *cores += hwloc_bitmap_intersects(
            hwloc_get_obj_by_type(hw, HWLOC_OBJ_CORE, (unsigned)i)->cpuset, set);
    if (n_cores == 0)
        *cores = *pus;
    hwloc_bitmap_free(set);
}

#define ARENA_BYTES ((size_t)3 << 20)

typedef struct worker_result {
    st_status bind;
    char error[512];
    int cpubind_ok;        /* the thread's binding is exactly its PU */
    int cpu;               /* sched_getcpu() after binding */
    st_status alloc;
    int membind_checked;   /* hwloc_get_area_membind worked */
    int membind_ok;        /* ... and names the worker's node */
    int location_checked;  /* hwloc_get_area_memlocation worked */
    int location_ok;
    int warned;
    char warning[160];
} worker_result;

/* One worker's life in miniature: pin, check, take memory on its node
 * through an arena, touch it, check where it went. */
static void run_worker(const st_topology *t, const st_plan *p, int w, worker_result *r)
{
    hwloc_topology_t hw = st_topology_hwloc(t);
    const st_placement *pl = &p->workers[w];
    r->bind = st_plan_bind_self(t, p, w);
    snprintf(r->error, sizeof r->error, "%s", st_last_error());
    if (r->bind != ST_OK)
        return;
    hwloc_bitmap_t got = hwloc_bitmap_alloc();
    hwloc_bitmap_t want_set = hwloc_bitmap_alloc();
    hwloc_bitmap_only(want_set, (unsigned)pl->pu_os);
    r->cpubind_ok = hwloc_get_cpubind(hw, got, HWLOC_CPUBIND_THREAD) == 0 &&
                    hwloc_bitmap_isequal(got, want_set);
    r->cpu = sched_getcpu();

    st_numa_ctx ctx;
    st_chunk_backend be = st_numa_backend(&ctx, t, pl->numa_os);
    st_arena arena;
    st_arena_init(&arena, "test worker", &be, ARENA_BYTES);
    float *x = NULL;
    r->alloc = st_arena_alloc_floats(&arena, ST_MEM_WEIGHTS, ARENA_BYTES / 8, &x);
    if (r->alloc == ST_OK) {
        for (size_t i = 0; i < ARENA_BYTES / 8; i++)
            x[i] = (float)i;
        size_t len = ARENA_BYTES / 8 * sizeof(float);
        hwloc_nodeset_t nodes = hwloc_bitmap_alloc();
        hwloc_membind_policy_t policy;
        if (hwloc_get_area_membind(hw, x, len, nodes, &policy, HWLOC_MEMBIND_BYNODESET) == 0) {
            r->membind_checked = 1;
            r->membind_ok = hwloc_bitmap_isset(nodes, (unsigned)pl->numa_os);
        }
        if (hwloc_get_area_memlocation(hw, x, len, nodes, HWLOC_MEMBIND_BYNODESET) == 0 &&
            !hwloc_bitmap_iszero(nodes)) {
            r->location_checked = 1;
            r->location_ok = hwloc_bitmap_isset(nodes, (unsigned)pl->numa_os) &&
                             hwloc_bitmap_weight(nodes) == 1;
        }
        hwloc_bitmap_free(nodes);
    }
    r->warned = ctx.warned;
    snprintf(r->warning, sizeof r->warning, "%s", ctx.warning);
    st_arena_release(&arena);
    hwloc_bitmap_free(got);
    hwloc_bitmap_free(want_set);
}

Test(bind, every_worker_runs_on_its_pu_on_this_machine)
{
    st_topology *t = load(NULL);
    int cores, pus;
    process_allowed(st_topology_hwloc(t), &cores, &pus);
    st_plan p;
    make(t, 0, 0, NULL, &p);
    expect_available(&p, cores, pus);
    cr_assert_eq(p.n_workers, cores);
    cr_assert_eq(p.oversubscribed, 0);
    char *text = print_plan(t, &p);
    cr_log_info("this machine's plan:\n%s", text);
    free(text);

    int n = p.n_workers;
    worker_result *res = calloc((size_t)n, sizeof *res);
    cr_assert_not_null(res);
    int team = 0;
    omp_set_dynamic(0);
#pragma omp parallel num_threads(n)
    {
        int w = omp_get_thread_num();
#pragma omp master
        team = omp_get_num_threads();
        run_worker(t, &p, w, &res[w]);
    }
    cr_assert_eq(team, n, "OpenMP gave %d threads for %d workers", team, n);
    for (int w = 0; w < n; w++) {
        worker_result *r = &res[w];
        cr_assert_eq(r->bind, ST_OK, "worker %d: %s", w, r->error);
        cr_assert(r->cpubind_ok, "worker %d: binding is not exactly PU %d", w,
                  p.workers[w].pu_os);
        cr_assert_eq(r->cpu, p.workers[w].pu_os, "worker %d runs on CPU %d, want %d", w, r->cpu,
                     p.workers[w].pu_os);
        cr_assert_eq(r->alloc, ST_OK, "worker %d: allocation failed", w);
        if (r->warned)
            cr_log_info("worker %d: %s", w, r->warning);
        if (r->membind_checked && !r->warned)
            cr_assert(r->membind_ok, "worker %d: memory is not bound to node %d", w,
                      p.workers[w].numa_os);
        if (r->location_checked)
            cr_assert(r->location_ok, "worker %d: pages are not on node %d", w,
                      p.workers[w].numa_os);
        else
            cr_log_info("worker %d: page location could not be read here", w);
    }
    free(res);
    st_plan_free(&p);
    st_topology_destroy(t);
}

/* Worker 0 is usually the main thread, which stays bound after a run: a
 * second plan in the same process must still see the whole process's
 * PUs, not the one PU we bound it to. */
Test(bind, later_plans_ignore_our_own_binding)
{
    unsetenv("OMP_PROC_BIND");
    unsetenv("OMP_PLACES");
    unsetenv("GOMP_CPU_AFFINITY");
    st_topology *t = load(NULL);
    st_plan before, one, after;
    make(t, 0, 0, NULL, &before);
    make(t, 1, 0, NULL, &one);
    cr_assert_eq(st_plan_bind_self(t, &one, 0), ST_OK, "%s", st_last_error());
    /* As if every thread of the process were a worker we bound there
     * (Criterion's own threads would otherwise keep the union wide). */
    hwloc_topology_t hw = st_topology_hwloc(t);
    hwloc_obj_t pu = hwloc_get_obj_by_type(hw, HWLOC_OBJ_PU, (unsigned)one.workers[0].pu);
    cr_assert_eq(hwloc_set_cpubind(hw, pu->cpuset, HWLOC_CPUBIND_PROCESS), 0);
    make(t, 0, 0, NULL, &after);
    expect_same_plan(&before, &after);
    st_plan_free(&before);
    st_plan_free(&one);
    st_plan_free(&after);
    st_topology_destroy(t);
}

/* A process restricted to one PU (as taskset does) plans on that PU; but
 * when the OpenMP binding variables are set, the restriction may be
 * libgomp's binding of the initial thread, which subtrain ignores: the
 * plan then uses every PU the system allows and says so. */
Test(bind, openmp_binding_variables_do_not_narrow_the_plan)
{
    unsetenv("OMP_PROC_BIND");
    unsetenv("OMP_PLACES");
    unsetenv("GOMP_CPU_AFFINITY");
    st_topology *t = load(NULL);
    hwloc_topology_t hw = st_topology_hwloc(t);
    hwloc_bitmap_t system = hwloc_bitmap_dup(hwloc_topology_get_allowed_cpuset(hw));
    hwloc_bitmap_and(system, system, hwloc_topology_get_topology_cpuset(hw));
    if (hwloc_bitmap_weight(system) < 2) {
        hwloc_bitmap_free(system);
        st_topology_destroy(t);
        cr_skip_test("needs at least two PUs");
    }
    hwloc_bitmap_t first = hwloc_bitmap_alloc();
    hwloc_bitmap_only(first, (unsigned)hwloc_bitmap_first(system));
    cr_assert_eq(hwloc_set_cpubind(hw, first, HWLOC_CPUBIND_PROCESS), 0);

    st_plan p;
    make(t, 0, 0, NULL, &p);
    expect_available(&p, 1, 1);
    cr_assert_eq(p.workers[0].pu_os, hwloc_bitmap_first(system));
    cr_assert_str_empty(p.warning);
    st_plan_free(&p);

    setenv("OMP_PROC_BIND", "close", 1);
    make(t, 0, 0, NULL, &p);
    cr_assert_eq(p.pus_available, hwloc_bitmap_weight(system));
    cr_assert(strstr(p.warning, "OpenMP binding variables"), "%s", p.warning);
    cr_assert(strstr(p.warning, "--cpuset"), "%s", p.warning);
    st_plan_free(&p);

    /* An explicit cpuset is the user's word: no fallback, no note. */
    char list[32];
    snprintf(list, sizeof list, "%d", hwloc_bitmap_first(system));
    make(t, 0, 0, list, &p);
    expect_available(&p, 1, 1);
    cr_assert_str_empty(p.warning);
    st_plan_free(&p);

    hwloc_bitmap_free(first);
    hwloc_bitmap_free(system);
    st_topology_destroy(t);
}

/* On a described topology the backend cannot bind, but must still give
 * memory: plans and arenas for other machines are exercised in tests. */
Test(bind, numa_backend_allocates_on_a_described_topology)
{
    st_topology *t = load("synthetic:pack:2 numa:1 core:2 pu:1");
    st_numa_ctx ctx;
    st_chunk_backend be = st_numa_backend(&ctx, t, 1);
    cr_assert_eq(ctx.topology, t);
    cr_assert_eq(ctx.numa_os, 1);
    st_arena arena;
    st_arena_init(&arena, "described", &be, 1 << 16);
    for (int i = 0; i < 5; i++) {
        void *x = NULL;
        cr_assert_eq(st_arena_alloc(&arena, ST_MEM_GRADIENTS, 100000, &x), ST_OK);
        memset(x, i, 100000);
    }
    cr_assert_geq(arena.stats.reserved, 5 * 100000);
    cr_assert_eq(ctx.warned, 0);
    cr_assert_str_empty(ctx.warning);
    st_arena_release(&arena);
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

/*
 * tests/test_topo_bind.c — binding and the NUMA chunk backend, and the
 * warning about OpenMP's binding variables.
 *
 * Binding and NUMA allocation are checked on the machine the tests run on,
 * against hwloc's own view of it, without assuming its size.
 *
 * load, make, the plan comparisons and printing: tests/topo_check.h.
 */
#define _GNU_SOURCE /* sched_getcpu */
#include "topo_check.h"

#include <sched.h>

#include <omp.h>

#include <subtrain/arena.h>

#include "topo/numa_impl.h"

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

    st_numa_ctx *ctx = NULL;
    st_arena *arena = NULL;
    float *x = NULL;
    r->alloc = st_numa_ctx_create(t, pl->numa_os, &ctx);
    if (r->alloc == ST_OK) {
        const st_chunk_backend be = st_numa_backend(ctx);
        r->alloc = st_arena_create("test worker", &be, ARENA_BYTES, &arena);
    }
    if (r->alloc == ST_OK)
        r->alloc = st_arena_alloc_floats(arena, ST_MEM_WEIGHTS, ARENA_BYTES / 8, &x);
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
    r->warned = ctx && st_numa_warning(ctx);
    snprintf(r->warning, sizeof r->warning, "%s", r->warned ? st_numa_warning(ctx) : "");
    st_arena_destroy(arena);
    st_numa_ctx_destroy(ctx);
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
    st_numa_ctx *ctx = NULL;
    cr_assert_eq(st_numa_ctx_create(t, 1, &ctx), ST_OK);
    cr_assert_eq(ctx->topology, t);
    cr_assert_eq(ctx->numa_os, 1);
    const st_chunk_backend be = st_numa_backend(ctx);
    st_arena *arena = NULL;
    cr_assert_eq(st_arena_create("described", &be, 1 << 16, &arena), ST_OK);
    for (int i = 0; i < 5; i++) {
        void *x = NULL;
        cr_assert_eq(st_arena_alloc(arena, ST_MEM_GRADIENTS, 100000, &x), ST_OK);
        memset(x, i, 100000);
    }
    cr_assert_geq(st_arena_stats(arena).reserved, 5 * 100000);
    cr_assert_null(st_numa_warning(ctx));
    cr_assert_eq(ctx->warned, 0);
    cr_assert_str_empty(ctx->warning);
    st_arena_destroy(arena);
    st_numa_ctx_destroy(ctx);
    st_topology_destroy(t);
}

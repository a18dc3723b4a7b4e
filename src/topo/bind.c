/*
 * topo/bind.c — applying a plan on this machine: pinning a worker thread
 * to its PU, and a chunk backend that puts a worker's arena on its node.
 *
 * These are the only functions of the module that act on the machine, so
 * they are the ones that refuse a described topology: a synthetic or XML
 * topology names PUs and nodes that may not exist here, or exist with
 * other numbers.
 *
 * Every binding is read back.  The kernel, a container runtime or a batch
 * scheduler may silently narrow or ignore what we ask for; a worker that
 * believes it is pinned but is not would make every later measurement and
 * NUMA decision wrong without any error.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "topo/topo_internal.h"
#include "topo/numa_impl.h"

/* How often to let the scheduler move us before concluding that the
 * thread does not run where its binding says. */
#define ST_MIGRATE_TRIES 100

static st_status bitmap_mismatch(int w, const char *what, hwloc_const_cpuset_t want,
                                 hwloc_const_cpuset_t got)
{
    char *a = NULL, *b = NULL;
    hwloc_bitmap_list_asprintf(&a, want);
    hwloc_bitmap_list_asprintf(&b, got);
    st_status s = st_fail(ST_ERR_TOPOLOGY, "worker %d: %s: expected OS PU %s, got %s", w,
                          what, a ? a : "?", b ? b : "?");
    free(a);
    free(b);
    return s;
}

/* Binds the calling thread.  STRICT asks the OS not to run it anywhere
 * else even briefly; some systems cannot promise that (ENOSYS, EXDEV) and
 * then a plain binding is the best there is. */
static int bind_thread(hwloc_topology_t hw, hwloc_const_cpuset_t set)
{
    if (hwloc_set_cpubind(hw, set, HWLOC_CPUBIND_THREAD | HWLOC_CPUBIND_STRICT) == 0)
        return 0;
    if (errno != ENOSYS && errno != EXDEV)
        return -1;
    return hwloc_set_cpubind(hw, set, HWLOC_CPUBIND_THREAD);
}

/* The binding takes effect when the scheduler next runs the thread
 * elsewhere; yield until we are inside the set.  Where the OS cannot say
 * where a thread last ran, the read-back binding is all we can check. */
static st_status check_location(hwloc_topology_t hw, int w, hwloc_const_cpuset_t set,
                                hwloc_cpuset_t where)
{
    for (int i = 0; i < ST_MIGRATE_TRIES; i++) {
        if (hwloc_get_last_cpu_location(hw, where, HWLOC_CPUBIND_THREAD) != 0)
            return ST_OK;
        if (hwloc_bitmap_isincluded(where, set))
            return ST_OK;
        sched_yield();
    }
    return bitmap_mismatch(w, "the thread still runs outside its binding", set, where);
}

st_status st_plan_bind_self(const st_topology *t, const st_plan *p, int w)
{
    if (!t->this_machine)
        return st_fail(ST_ERR_TOPOLOGY, "cannot bind on a described topology (%s): plans "
                       "for other machines can be printed, not applied", t->name);
    if (w < 0 || w >= p->n_workers)
        return st_fail(ST_ERR_INVALID, "worker %d: the plan has workers 0 to %d", w,
                       p->n_workers - 1);
    const st_placement *pl = &p->workers[w];
    hwloc_obj_t pu = hwloc_get_obj_by_type(t->hw, HWLOC_OBJ_PU, (unsigned)pl->pu);
    if (!pu || (int)pu->os_index != pl->pu_os)
        return st_fail(ST_ERR_TOPOLOGY, "worker %d: the plan's PU %d (OS %d) is not in "
                       "topology '%s'; was the plan made for another topology?", w, pl->pu,
                       pl->pu_os, t->name);
    /* the team's PUs (one PU for a worker of one thread) */
    hwloc_cpuset_t set = hwloc_bitmap_alloc(), got = hwloc_bitmap_alloc();
    if (!set || !got) {
        hwloc_bitmap_free(set);
        hwloc_bitmap_free(got);
        return st_fail(ST_ERR_NOMEM, "worker %d: out of memory binding it", w);
    }
    const int T = p->threads_per_worker > 1 ? p->threads_per_worker : 1;
    st_status s = ST_OK;
    for (int k = 0; k < T && s == ST_OK; k++) {
        const int logical = p->team_pu ? p->team_pu[w * T + k] : pl->pu;
        hwloc_obj_t o = hwloc_get_obj_by_type(t->hw, HWLOC_OBJ_PU, (unsigned)logical);
        if (!o)
            s = st_fail(ST_ERR_TOPOLOGY, "worker %d: the plan's PU %d is not in topology "
                        "'%s'", w, logical, t->name);
        else
            hwloc_bitmap_or(set, set, o->cpuset);
    }
    /* Later plans in this process must not mistake our bindings for the
     * PUs the process was given (see topology.c). */
    if (s == ST_OK)
        st_topo_freeze_process_cpuset(t);
    if (s == ST_OK && bind_thread(t->hw, set) != 0)
        s = st_fail(ST_ERR_TOPOLOGY, "worker %d: binding the thread to PU %d (OS %d)%s "
                    "failed: %s", w, pl->pu, pl->pu_os, T > 1 ? " and its team's" : "",
                    strerror(errno));
    if (s == ST_OK && hwloc_get_cpubind(t->hw, got, HWLOC_CPUBIND_THREAD) != 0)
        s = st_fail(ST_ERR_TOPOLOGY, "worker %d: cannot read back the thread's binding: %s",
                    w, strerror(errno));
    else if (s == ST_OK && !hwloc_bitmap_isequal(got, set))
        s = bitmap_mismatch(w, "the binding reads back differently", set, got);
    else if (s == ST_OK)
        s = check_location(t->hw, w, set, got);
    hwloc_bitmap_free(set);
    hwloc_bitmap_free(got);
    return s;
}

/* ------------------------------------------------------------ NUMA backend */

static void remember_refusal(st_numa_ctx *c, int err, const char *what)
{
    if (c->warned)
        return;
    c->warned = 1;
    snprintf(c->warning, sizeof c->warning, "NUMA node %d: strict memory binding refused "
             "(%s); memory %s: first touch by the pinned worker decides its node",
             c->numa_os, strerror(err), what);
}

static void *numa_alloc(size_t bytes, void *ctx)
{
    st_numa_ctx *c = ctx;
    hwloc_topology_t hw = c->topology->hw;
    /* A described topology has no nodes here to bind to; tests and dry
     * runs still need working memory. */
    if (!c->topology->this_machine)
        return hwloc_alloc(hw, bytes);
    hwloc_nodeset_t nodes = hwloc_bitmap_alloc();
    if (!nodes)
        return NULL;
    hwloc_bitmap_only(nodes, (unsigned)c->numa_os);
    const int by_nodes = HWLOC_MEMBIND_BYNODESET;
    void *p = hwloc_alloc_membind(hw, bytes, nodes, HWLOC_MEMBIND_BIND,
                                  HWLOC_MEMBIND_STRICT | by_nodes);
    if (!p) {
        /* Containers often forbid mbind (seccomp), and some kernels lack
         * it: the memory is still worth having, bound loosely or not. */
        int err = errno;
        p = hwloc_alloc_membind(hw, bytes, nodes, HWLOC_MEMBIND_BIND, by_nodes);
        if (p)
            remember_refusal(c, err, "bound loosely");
        else if ((p = hwloc_alloc(hw, bytes)) != NULL)
            remember_refusal(c, err, "allocated unbound");
    }
    hwloc_bitmap_free(nodes);
    return p;
}

static void numa_free(void *ptr, size_t bytes, void *ctx)
{
    st_numa_ctx *c = ctx;
    /* hwloc_free pairs with both hwloc_alloc and hwloc_alloc_membind (on
     * Linux both are mmap), which is why it needs the length. */
    hwloc_free(c->topology->hw, ptr, bytes);
}

void st_numa_ctx_init(st_numa_ctx *ctx, const st_topology *t, int numa_os)
{
    memset(ctx, 0, sizeof *ctx);
    ctx->topology = t;
    ctx->numa_os = numa_os;
}

st_status st_numa_ctx_create(const st_topology *t, int numa_os, st_numa_ctx **out)
{
    *out = malloc(sizeof **out);
    if (!*out)
        return st_fail(ST_ERR_NOMEM, "NUMA node %d: out of memory creating its context",
                       numa_os);
    st_numa_ctx_init(*out, t, numa_os);
    return ST_OK;
}

void st_numa_ctx_destroy(st_numa_ctx *ctx)
{
    free(ctx);
}

st_chunk_backend st_numa_backend(st_numa_ctx *ctx)
{
    return (st_chunk_backend){ numa_alloc, numa_free, ctx };
}

const char *st_numa_warning(const st_numa_ctx *ctx)
{
    return ctx->warned ? ctx->warning : NULL;
}

/*
 * topo/topo_internal.h — private: what an st_topology is, for plan.c,
 * bind.c and the tests.
 *
 * The public header keeps st_topology opaque so that callers never need
 * hwloc's headers; inside the module (and in tests that check our answers
 * against hwloc's own) the hwloc handle is reachable through
 * st_topology_hwloc().
 */
#ifndef SUBTRAIN_TOPO_INTERNAL_H
#define SUBTRAIN_TOPO_INTERNAL_H

#include <hwloc.h>

#include <subtrain/topo.h>

struct st_topology {
    hwloc_topology_t hw;
    /* "this machine", or the spec as given ("synthetic:...", "xml:...");
     * owned, printed in plan headers and error messages. */
    char *name;
    /* hwloc_topology_is_thissystem() at load time: 1 only when binding
     * and memory binding act on the machine we run on. */
    int this_machine;
};

/* The loaded hwloc topology (read-only use: plans never modify it). */
static inline hwloc_topology_t st_topology_hwloc(const st_topology *t)
{
    return t->hw;
}

/* The PUs this process may run on (OS indices, within the topology), as
 * they were before subtrain bound its first thread: the process binding
 * (taskset, numactl, a batch scheduler), else the PUs the system allows.
 * Only meaningful on this machine. */
void st_topo_process_cpuset(const st_topology *t, hwloc_bitmap_t out);

/* Remembers the process binding for st_topo_process_cpuset(); called by
 * st_plan_bind_self() before it binds, so later plans are not narrowed by
 * our own bindings.  Only the first call in a process does anything. */
void st_topo_freeze_process_cpuset(const st_topology *t);

/* The size limits of described topologies (limits.c), checked before
 * hwloc loads them: ST_ERR_INVALID naming `what` ("topology 'SPEC'") when
 * hwloc's work to build it would pass the budget.  A synthetic
 * description hwloc would refuse passes (hwloc says why); an XML file that
 * cannot be opened fails only when must_exist (else hwloc falls back to
 * this machine, as it does for HWLOC_XMLFILE). */
st_status st_topo_check_synthetic(const char *what, const char *desc);
st_status st_topo_check_xml(const char *what, const char *path, int must_exist);

#endif /* SUBTRAIN_TOPO_INTERNAL_H */

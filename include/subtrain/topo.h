/*
 * subtrain/topo.h — machine topology, the placement plan, binding and NUMA
 * allocation (hwloc).
 *
 * Planning and applying are kept apart on purpose: st_plan_make() is a pure
 * function of a topology and a request, so plans for machines we do not have
 * (hwloc synthetic descriptions, lstopo XML exports) can be printed and
 * tested anywhere; only st_plan_bind_self() and the NUMA chunk backend touch
 * the real machine, and they refuse to run on a described one.
 *
 * Binding authority: subtrain binds its worker threads itself, with hwloc,
 * one thread per worker to one PU.  OMP_PROC_BIND, OMP_PLACES and
 * GOMP_CPU_AFFINITY are not obeyed for worker threads; st_topology_
 * binding_env_warning() says when they are set so the user knows.
 */
#ifndef SUBTRAIN_TOPO_H
#define SUBTRAIN_TOPO_H

#include <stddef.h>
#include <stdio.h>
#include <subtrain/arena.h>
#include <subtrain/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct st_topology st_topology;

/* spec: NULL or "" for this machine; "synthetic:DESCRIPTION" (hwloc's
 * synthetic syntax, e.g. "synthetic:pack:2 numa:4 core:16 pu:2"); or
 * "xml:FILE" (an lstopo XML export).  Errors name the spec and the problem. */
st_status st_topology_load(const char *spec, st_topology **out);
void st_topology_destroy(st_topology *t);

/* 1 when the topology is this machine's (binding and NUMA allocation work). */
int st_topology_is_this_machine(const st_topology *t);
/* "this machine", "synthetic:...", "xml:...". */
const char *st_topology_name(const st_topology *t);

/* Counts over the whole topology (not restricted to a cpuset). */
int st_topology_numa_count(const st_topology *t);
int st_topology_core_count(const st_topology *t);
int st_topology_pu_count(const st_topology *t);
/* The CPU model of the first package ("AMD EPYC 9654 96-Core Processor"):
 * hwloc's CPUModel, else /proc/cpuinfo's model name on this machine; NULL
 * when neither says. */
const char *st_topology_cpu_model(const st_topology *t);

/* NULL, or a one-line warning when OMP_PROC_BIND, OMP_PLACES or
 * GOMP_CPU_AFFINITY are set (subtrain binds its workers itself). */
const char *st_topology_binding_env_warning(void);

/* ------------------------------------------------------------ the plan */

/* Where one worker runs.  Indices are hwloc logical indices; pu_os is the
 * OS index (what taskset and /proc call the CPU). */
typedef struct st_placement {
    int worker;
    int domain;        /* index of the NUMA domain among the plan's domains */
    int numa_os;       /* OS index of that NUMA node */
    int core;          /* logical index of the core */
    int pu;            /* logical index of the PU */
    int pu_os;         /* OS index of the PU */
    int sibling;       /* 1 if another worker shares this core (SMT) */
    int shared_pu;     /* 1 if another worker shares this PU (oversubscribed) */
    int spans;         /* a team whose PUs are in more than one NUMA domain */
} st_placement;

typedef struct st_plan {
    int n_workers;
    st_placement *workers;     /* n_workers, ordered by domain: the workers of
                                * a domain have consecutive numbers */
    int n_domains;             /* NUMA domains that hold at least one worker */
    int *domain_first;         /* n_domains + 1: workers of domain d are
                                * domain_first[d] .. domain_first[d+1]-1 */
    int cores_available;       /* physical cores in the allowed cpuset */
    int pus_available;         /* PUs in the allowed cpuset */
    int oversubscribed;        /* more workers than PUs */
    int threads_per_worker;    /* T: a worker is a team of T PUs */
    int *team_pu;              /* n_workers x T logical PU indices: worker w's
                                * team is team_pu[w T .. w T + T), its first
                                * being the placement's pu */
    int *team_pu_os;           /* the same as OS indices */
    char warning[256];         /* "" or a line to show the user */
} st_plan;

typedef struct st_plan_request {
    int workers;           /* 0: one per physical core of the allowed cpuset */
    int oversubscribe;     /* allow more workers than allowed PUs */
    const char *cpuset;    /* NULL: the process's allowed cpuset on this
                            * machine, everything on a described one; else
                            * a list of OS PU indices, e.g. "0-3,8,10" */
    int threads_per_worker; /* 0 or 1: a worker is one PU; T > 1: a team of
                             * T PUs in one NUMA domain */
    int team_spans;        /* allow a team across NUMA domains */
    int core_limit;        /* workers 0: count at most this many cores (the
                            * CPUs a batch system gave the task, which may
                            * not have bound it to them); 0: no limit */
} st_plan_request;

/* The placement rules:
 *  - workers are spread evenly over the NUMA domains that have allowed
 *    cores (no domain gets more than its share while another has room);
 *  - one worker per core; a second PU of a core (SMT sibling) is used only
 *    when workers outnumber allowed cores;
 *  - more workers than allowed PUs only with oversubscribe (then PUs are
 *    shared round-robin and the plan carries a warning); otherwise an error
 *    that says to pass --oversubscribe or fewer --workers;
 *  - threads_per_worker T > 1: each worker is a team of T PUs of one NUMA
 *    domain (its cores first, then their SMT siblings), and domains get
 *    teams as they get workers above; a plan that needs a team across
 *    domains is refused unless team_spans (then teams are cut from the
 *    domains' PUs in order, and such a team is marked `spans`).
 * Pure: depends only on the topology and the request. */
st_status st_plan_make(const st_topology *t, const st_plan_request *req, st_plan *out);
void st_plan_free(st_plan *p);

/* The table worker -> NUMA domain -> core -> PU and a summary line, as
 * `subtrain topo` prints it (the reduction tree is comm's to describe:
 * st_comm_describe). */
void st_plan_print(FILE *f, const st_topology *t, const st_plan *p);

/* Binds the calling thread to worker w's PU (its team's PUs) and
 * verifies the binding by reading it back.  Only on this machine's
 * topology.  Threads the caller starts afterwards (a team's) inherit it. */
st_status st_plan_bind_self(const st_topology *t, const st_plan *p, int w);

/* Chunks for st_arena on one NUMA node of t, numa_os (a worker's:
 * hwloc_alloc_membind, strict binding).  When the OS refuses strict
 * binding the memory is allocated anyway (first touch by the worker then
 * decides its node) and the context keeps a warning, once, for the caller
 * to tell the user (st_numa_warning).  The context must outlive every
 * arena that uses its backend. */
typedef struct st_numa_ctx st_numa_ctx;
st_status st_numa_ctx_create(const st_topology *t, int numa_os, st_numa_ctx **out);
/* NULL does nothing. */
void st_numa_ctx_destroy(st_numa_ctx *ctx);
st_chunk_backend st_numa_backend(st_numa_ctx *ctx);
/* Why strict binding was refused, and what was done instead; NULL while
 * it never was. */
const char *st_numa_warning(const st_numa_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif /* SUBTRAIN_TOPO_H */

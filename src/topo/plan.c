/*
 * topo/plan.c — the placement plan: which worker runs on which PU.
 *
 * Why plan and apply are separate: the plan is a pure function of a
 * topology and a request, so it can be made for machines we do not have
 * (synthetic descriptions, XML exports), printed by `subtrain topo`, and
 * tested exactly.  Applying it (bind.c) is the only part that needs the
 * real machine.  (On this machine a request without a cpuset also reads
 * the PUs the process was given, as it was before we bound anything:
 * that is what "no cpuset" means there.)
 *
 * Indices: everything the plan decides is in hwloc *logical* indices,
 * which follow the tree (PUs of a core are adjacent, cores of a NUMA node
 * are adjacent) on every machine; OS indices are whatever the firmware
 * numbered, often interleaving sockets or SMT siblings (CPU 0 and 64 are
 * one core).  OS indices appear only at the edges: a --cpuset the user
 * types (what taskset and /proc use) and the pu_os / numa_os we report.
 *
 * How: first collect the allowed PUs as domains -> cores -> PUs, then
 * decide how many workers each domain gets (water-filling, so domains stay
 * balanced), then place each domain's workers on its cores.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "topo/topo_internal.h"

#define ST_MAX_WORKERS 65536

/* ------------------------------------------------------------ layout */

/* The allowed part of the topology, in logical order. */
typedef struct lay_pu {
    int logical, os;
} lay_pu;

typedef struct lay_core {
    int logical;
    int first_pu, n_pus;      /* into layout.pus */
} lay_core;

typedef struct lay_domain {
    int numa_os;
    int first_core, n_cores;  /* into layout.cores */
    int n_pus;
} lay_domain;

typedef struct layout {
    lay_domain *domains;
    lay_core *cores;
    lay_pu *pus;
    int n_domains, n_cores, n_pus;
} layout;

static void layout_free(layout *l)
{
    free(l->domains);
    free(l->cores);
    free(l->pus);
    memset(l, 0, sizeof *l);
}

/* Adds one domain: the allowed PUs of a NUMA node, grouped by core.  PUs
 * come in logical order, so the PUs of a core are consecutive and cores
 * come in logical order too.  Where hwloc reports no cores, each PU is its
 * own core. */
static void layout_add_domain(layout *l, hwloc_topology_t hw, hwloc_obj_t node,
                              hwloc_const_cpuset_t pus)
{
    lay_domain *d = &l->domains[l->n_domains++];
    d->numa_os = (int)node->os_index;
    d->first_core = l->n_cores;
    d->n_cores = 0;
    d->n_pus = 0;
    hwloc_obj_t prev_core = NULL;
    hwloc_obj_t pu = NULL;
    while ((pu = hwloc_get_next_obj_inside_cpuset_by_type(hw, pus, HWLOC_OBJ_PU, pu))) {
        hwloc_obj_t core = hwloc_get_ancestor_obj_by_type(hw, HWLOC_OBJ_CORE, pu);
        if (!core)
            core = pu;
        if (core != prev_core || d->n_cores == 0) {
            lay_core *c = &l->cores[l->n_cores++];
            c->logical = (int)core->logical_index;
            c->first_pu = l->n_pus;
            c->n_pus = 0;
            d->n_cores++;
            prev_core = core;
        }
        l->pus[l->n_pus++] = (lay_pu){ (int)pu->logical_index, (int)pu->os_index };
        l->cores[l->n_cores - 1].n_pus++;
        d->n_pus++;
    }
}

/* Domains are NUMA nodes in logical order with at least one allowed PU.
 * A PU belongs to the first node whose cpuset holds it: machines with two
 * kinds of memory per package (DRAM and HBM, or CXL) list the same cores
 * under two nodes, and counting them twice would double the capacity. */
static st_status layout_make(hwloc_topology_t hw, hwloc_const_cpuset_t allowed, layout *l)
{
    memset(l, 0, sizeof *l);
    int n_nodes = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_NUMANODE);
    int n_pus = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_PU);
    if (n_nodes < 1 || n_pus < 1)
        return st_fail(ST_ERR_TOPOLOGY, "the topology has %d NUMA nodes and %d PUs",
                       n_nodes, n_pus);
    l->domains = calloc((size_t)n_nodes, sizeof *l->domains);
    l->cores = calloc((size_t)n_pus, sizeof *l->cores);
    l->pus = calloc((size_t)n_pus, sizeof *l->pus);
    hwloc_bitmap_t claimed = hwloc_bitmap_alloc();
    hwloc_bitmap_t mine = hwloc_bitmap_alloc();
    if (!l->domains || !l->cores || !l->pus || !claimed || !mine) {
        hwloc_bitmap_free(claimed);
        hwloc_bitmap_free(mine);
        layout_free(l);
        return st_fail(ST_ERR_NOMEM, "out of memory making a placement plan");
    }
    for (int i = 0; i < n_nodes; i++) {
        hwloc_obj_t node = hwloc_get_obj_by_type(hw, HWLOC_OBJ_NUMANODE, (unsigned)i);
        if (!node || !node->cpuset)
            continue;
        hwloc_bitmap_and(mine, node->cpuset, allowed);
        hwloc_bitmap_andnot(mine, mine, claimed);
        if (hwloc_bitmap_iszero(mine))
            continue;
        hwloc_bitmap_or(claimed, claimed, mine);
        layout_add_domain(l, hw, node, mine);
    }
    hwloc_bitmap_free(claimed);
    hwloc_bitmap_free(mine);
    if (l->n_pus == 0) {
        layout_free(l);
        return st_fail(ST_ERR_TOPOLOGY, "no allowed PU lies in a NUMA node of the topology");
    }
    return ST_OK;
}

/* ------------------------------------------------------------ allowed cpuset */

/* One OS index of a cpuset list: decimal digits only (hwloc's own parser
 * takes "-1" and wraps 4294967297 to 1).  An index too large for any
 * machine reads as UINT64_MAX: not in the topology, whatever it is. */
static int read_index(const char **p, unsigned long long *v)
{
    const char *s = *p;
    *v = 0;
    while (**p >= '0' && **p <= '9') {
        unsigned d = (unsigned)(**p - '0');
        *v = *v > (UINT64_MAX - d) / 10 ? UINT64_MAX : *v * 10 + d;
        (*p)++;
    }
    return *p > s;
}

/* A user's list of OS PU indices ("0-3,8,10"), checked against the
 * topology so that a typo fails here, with the PUs named, rather than as
 * a binding error in worker 37. */
static st_status parse_cpuset(hwloc_topology_t hw, const char *list, hwloc_bitmap_t out)
{
    hwloc_const_cpuset_t all = hwloc_topology_get_topology_cpuset(hw);
    const int last = hwloc_bitmap_last(all);
    char beyond[64] = "";   /* the first item naming PUs past the topology's last */
    hwloc_bitmap_zero(out);
    if (*list == '\0')
        return st_fail(ST_ERR_INVALID, "cpuset '%s' names no PU", list);
    for (const char *p = list, *item = list;; item = ++p) {
        unsigned long long lo, hi;
        int ok = read_index(&p, &lo);
        hi = lo;
        int open_range = 0;
        if (ok && *p == '-') {
            p++;
            open_range = *p == ',' || *p == '\0';
            if (open_range)   /* "N-": N and above, up to the last PU */
                hi = last >= 0 && lo <= (unsigned long long)last ? (unsigned long long)last
                                                                 : UINT64_MAX;
            else
                ok = read_index(&p, &hi);
        }
        if (!ok || (*p != ',' && *p != '\0'))
            return st_fail(ST_ERR_INVALID, "cpuset '%s': expected a list of OS PU indices "
                           "such as '0-3,8,10'", list);
        if (hi < lo)
            return st_fail(ST_ERR_INVALID, "cpuset '%s': the range %llu-%llu runs backwards",
                           list, lo, hi);
        if (last >= 0 && lo <= (unsigned long long)last && !open_range)
            hwloc_bitmap_set_range(out, (unsigned)lo,
                                   hi < (unsigned long long)last ? (int)hi : last);
        /* "N-" names the topology's PUs from N, not the gaps between their
         * indices (offline CPUs) */
        if (open_range && last >= 0 && lo <= (unsigned long long)last)
            for (int pu = (int)lo; pu <= last; pu++)
                if (hwloc_bitmap_isset(all, (unsigned)pu))
                    hwloc_bitmap_set(out, (unsigned)pu);
        if ((last < 0 || hi > (unsigned long long)last) && !*beyond) {
            /* the part past the last PU, its digits as given: "8", "8-12", "8-" */
            const int len = (int)(p - item);
            const char *dash = memchr(item, '-', (size_t)len);
            unsigned long long first = last < 0 || lo > (unsigned long long)last
                                           ? lo : (unsigned long long)last + 1;
            if (!dash || first == lo)
                snprintf(beyond, sizeof beyond, "%.*s", len, item);
            else if (first == hi)
                snprintf(beyond, sizeof beyond, "%llu", hi);
            else
                snprintf(beyond, sizeof beyond, "%llu-%.*s", first,
                         (int)(item + len - dash - 1), dash + 1);
        }
        if (*p == '\0')
            break;
    }
    hwloc_bitmap_t missing = hwloc_bitmap_alloc();
    if (!missing)
        return st_fail(ST_ERR_NOMEM, "out of memory checking cpuset '%s'", list);
    hwloc_bitmap_andnot(missing, out, all);
    if (!*beyond && hwloc_bitmap_iszero(missing)) {
        hwloc_bitmap_free(missing);
        return ST_OK;
    }
    char *miss = NULL, *have = NULL;
    if (!*beyond)
        hwloc_bitmap_list_asprintf(&miss, missing);
    hwloc_bitmap_list_asprintf(&have, all);
    int one = *beyond ? strchr(beyond, '-') == NULL : hwloc_bitmap_weight(missing) == 1;
    st_status s = st_fail(ST_ERR_INVALID, "cpuset '%s': %s %s %s not in the topology "
                          "(its PUs, by OS index: %s)", list, one ? "PU" : "PUs",
                          *beyond ? beyond : miss ? miss : "?", one ? "is" : "are",
                          have ? have : "?");
    free(miss);
    free(have);
    hwloc_bitmap_free(missing);
    return s;
}

/* Which PUs the plan may use (OS indices, as hwloc cpusets are).  `note`
 * receives a line for the plan's warning when the choice needs one. */
static st_status allowed_cpuset(const st_topology *t, const char *list, hwloc_bitmap_t out,
                                char *note, size_t note_len)
{
    hwloc_topology_t hw = t->hw;
    note[0] = '\0';
    if (list)
        return parse_cpuset(hw, list, out);
    if (!t->this_machine) {
        /* A described machine runs nothing of ours: all of it is allowed. */
        hwloc_bitmap_copy(out, hwloc_topology_get_topology_cpuset(hw));
        return ST_OK;
    }
    /* This machine: what taskset, numactl or a batch scheduler left us. */
    st_topo_process_cpuset(t, out);
    /* But with OMP_PROC_BIND, OMP_PLACES or GOMP_CPU_AFFINITY set, libgomp
     * binds the initial thread to the first place as the program starts:
     * the process binding then says "one core", the OpenMP runtime's
     * choice, which subtrain promises to ignore.  The original binding is
     * lost by then, so fall back to what the system allows (cgroup
     * cpusets still apply) and say so. */
    if (st_topology_binding_env_warning()) {
        hwloc_bitmap_t system = hwloc_bitmap_dup(hwloc_topology_get_allowed_cpuset(hw));
        if (!system)
            return st_fail(ST_ERR_NOMEM, "out of memory making a placement plan");
        hwloc_bitmap_and(system, system, hwloc_topology_get_topology_cpuset(hw));
        if (!hwloc_bitmap_isequal(out, system) && !hwloc_bitmap_iszero(system)) {
            snprintf(note, note_len, "OpenMP binding variables are set, so the process's "
                     "binding is the runtime's: planning on all %d allowed PUs (restrict "
                     "with --cpuset)", hwloc_bitmap_weight(system));
            hwloc_bitmap_copy(out, system);
        }
        hwloc_bitmap_free(system);
    }
    if (hwloc_bitmap_iszero(out))
        return st_fail(ST_ERR_TOPOLOGY, "the process may run on no PU of the topology");
    return ST_OK;
}

/* ------------------------------------------------------------ distribution */

/* Water-filling: adds `amount` to give[] over n domains so that counts
 * grow level by level, each domain taking at most room[d] (NULL: no
 * limit; room[] is used up as it fills); a remainder smaller than the
 * number of domains with room goes to the lowest-numbered ones.  This is
 * what keeps domains balanced: no domain gets more than its share while
 * another still has room.  The caller guarantees the rooms add up to at
 * least `amount`. */
static void water_fill(int n, int *room, int amount, int *give)
{
    int left = amount;
    while (left > 0) {
        int active = 0;
        for (int d = 0; d < n; d++)
            active += !room || room[d] > 0;
        if (active == 0)
            break;
        int share = left / active;
        for (int d = 0; d < n && left > 0; d++) {
            if (room && room[d] == 0)
                continue;
            int g = share > 0 ? share : 1;
            if (room && g > room[d])
                g = room[d];
            if (room)
                room[d] -= g;
            give[d] += g;
            left -= g;
        }
    }
}

/* The order in which a domain's workers take PUs: the first PU of every
 * core, then the second PU of every core, and so on; past the end (only
 * when oversubscribed) it starts over.  So a core gets a second worker
 * only when every core of the domain has one. */
static int domain_slots(const layout *l, int d, int *slot)
{
    const lay_domain *dom = &l->domains[d];
    int n = 0;
    for (int rank = 0; n < dom->n_pus; rank++)
        for (int c = dom->first_core; c < dom->first_core + dom->n_cores; c++)
            if (rank < l->cores[c].n_pus)
                slot[n++] = l->cores[c].first_pu + rank;
    return n;
}

/* ------------------------------------------------------------ the plan */

/* A worker is a team of T PUs (T = 1: one PU).  A domain's slots
 * (domain_slots: cores first, then siblings) are cut into runs of T, so a
 * team takes whole cores while the domain has them.  How many teams each
 * domain gets: water-filling over the teams its cores hold, then those
 * its siblings add (so domains stay balanced, and a core gets a second
 * worker only when every core has one), then, only when oversubscribing,
 * the rest evenly.  *fits: 0 when the domains cannot hold n teams each
 * within one. */
static void distribute(const layout *l, int n, int T, int *count, int *fits)
{
    const int nd = l->n_domains;
    int cores[nd], extra[nd], room = 0;
    for (int d = 0; d < nd; d++) {
        cores[d] = l->domains[d].n_cores / T;
        extra[d] = l->domains[d].n_pus / T - cores[d];
        count[d] = 0;
        room += cores[d] + extra[d];
    }
    int c = 0;
    for (int d = 0; d < nd; d++)
        c += cores[d];
    int first = n < c ? n : c;
    water_fill(nd, cores, first, count);
    int second = n - first < room - c ? n - first : room - c;
    water_fill(nd, extra, second, count);
    *fits = first + second == n;
    if (!*fits)   /* oversubscribed teams: the rest evenly, slots reused */
        water_fill(nd, NULL, n - first - second, count);
}

/* Fills p: worker w of a domain takes its next T slots (span: the next T
 * of every domain's slots in order; past the end, only when
 * oversubscribed, it starts over).  Flags need the whole placement:
 * worker 0 learns it has an SMT sibling only when worker 4 lands on the
 * other PU of its core. */
static st_status fill_plan(const layout *l, int n, int T, const int *count, int span,
                            st_plan *p)
{
    st_status s = ST_OK;
    const int nd = l->n_domains;
    int *slot = calloc((size_t)l->n_pus, sizeof *slot);
    int *dom_of = calloc((size_t)l->n_pus, sizeof *dom_of);      /* layout domain of a PU */
    int *core_of = calloc((size_t)l->n_pus, sizeof *core_of);
    int *pu_load = calloc((size_t)l->n_pus, sizeof *pu_load);
    int *units = calloc((size_t)n * (size_t)T, sizeof *units);
    int *pdom = calloc((size_t)nd, sizeof *pdom);                /* plan domain of a layout one */
    p->n_workers = n;
    p->threads_per_worker = T;
    p->workers = calloc((size_t)n, sizeof *p->workers);
    p->domain_first = calloc((size_t)nd + 1, sizeof *p->domain_first);
    p->team_pu = calloc((size_t)n * (size_t)T, sizeof *p->team_pu);
    p->team_pu_os = calloc((size_t)n * (size_t)T, sizeof *p->team_pu_os);
    if (!slot || !dom_of || !core_of || !pu_load || !units || !pdom || !p->workers ||
        !p->domain_first || !p->team_pu || !p->team_pu_os) {
        s = st_fail(ST_ERR_NOMEM, "out of memory making a plan of %d teams", n);
        goto out;
    }
    for (int d = 0; d < nd; d++)
        for (int c = l->domains[d].first_core; c < l->domains[d].first_core + l->domains[d].n_cores;
             c++)
            for (int i = 0; i < l->cores[c].n_pus; i++) {
                dom_of[l->cores[c].first_pu + i] = d;
                core_of[l->cores[c].first_pu + i] = c;
            }
    /* the slots: per domain (each worker's T from its own domain's), or
     * all domains' one after another (span) */
    int w = 0;
    if (span) {
        int n_slots = 0;
        for (int d = 0; d < nd; d++)
            n_slots += domain_slots(l, d, slot + n_slots);
        for (; w < n; w++)
            for (int t = 0; t < T; t++)
                units[w * T + t] = slot[(w * T + t) % n_slots];
    } else {
        for (int d = 0; d < nd; d++) {
            int n_slots = domain_slots(l, d, slot);
            for (int i = 0; i < count[d]; i++, w++)
                for (int t = 0; t < T; t++)
                    units[w * T + t] = slot[(i * T + t) % n_slots];
        }
    }
    int used = 0;
    for (int d = 0; d < nd; d++)
        pdom[d] = -1;
    for (w = 0; w < n; w++) {
        const int u0 = units[w * T], d = dom_of[u0];
        if (pdom[d] < 0) {
            pdom[d] = used;
            p->domain_first[used++] = w;
        }
        st_placement *pl = &p->workers[w];
        pl->worker = w;
        pl->domain = pdom[d];
        pl->numa_os = l->domains[d].numa_os;
        pl->core = l->cores[core_of[u0]].logical;
        pl->pu = l->pus[u0].logical;
        pl->pu_os = l->pus[u0].os;
        for (int t = 0; t < T; t++) {
            const int u = units[w * T + t];
            p->team_pu[w * T + t] = l->pus[u].logical;
            p->team_pu_os[w * T + t] = l->pus[u].os;
            pl->spans |= dom_of[u] != d;
            pu_load[u]++;
        }
    }
    p->n_domains = used;
    p->domain_first[used] = n;
    for (w = 0; w < n; w++) {
        st_placement *pl = &p->workers[w];
        for (int t = 0; t < T; t++) {
            const int u = units[w * T + t];
            const lay_core *c = &l->cores[core_of[u]];
            int mine = 0, busy = 0;
            for (int k = c->first_pu; k < c->first_pu + c->n_pus; k++) {
                busy += pu_load[k] > 0;
                for (int v = 0; v < T; v++)
                    mine += units[w * T + v] == k;
            }
            pl->sibling |= busy > mine;   /* another team on one of its cores */
            pl->shared_pu |= pu_load[u] > 1;
        }
    }
out:
    free(slot);
    free(dom_of);
    free(core_of);
    free(pu_load);
    free(units);
    free(pdom);
    return s;
}

/* The plan for a collected layout; on failure *p may be half filled (the
 * caller frees it). */
static st_status plan_from_layout(const layout *l, const st_plan_request *req, st_plan *p)
{
    const int T = req->threads_per_worker > 1 ? req->threads_per_worker : 1;
    const int cores = req->core_limit > 0 && req->core_limit < l->n_cores ? req->core_limit
                                                                          : l->n_cores;
    const int n = req->workers ? req->workers : (cores / T > 0 ? cores / T : 1);
    const int total = n * T;
    if (total > l->n_pus && !req->oversubscribe)
        return T == 1 ? st_fail(ST_ERR_INVALID, "%d workers but only %d PUs are allowed; pass "
                                "--oversubscribe to share PUs or use --workers %d", n,
                                l->n_pus, l->n_pus)
                      : st_fail(ST_ERR_INVALID, "%d workers of %d threads need %d PUs but only "
                                "%d are allowed; pass --oversubscribe to share PUs or use "
                                "fewer", n, T, total, l->n_pus);
    int *count = calloc((size_t)l->n_domains, sizeof *count);
    if (!count)
        return st_fail(ST_ERR_NOMEM, "out of memory making a placement plan");
    int fits;
    distribute(l, n, T, count, &fits);
    const int span = !fits && req->team_spans;
    st_status s = ST_OK;
    if (!fits && !span && !req->oversubscribe)   /* (T > 1 only: one PU always fits) */
        s = st_fail(ST_ERR_INVALID, "%d workers of %d threads: the allowed NUMA domains hold "
                    "fewer teams of %d PUs within one domain; a team across domains reads its "
                    "memory remotely: allow it with --team-spans-domains, or use fewer or "
                    "smaller teams", n, T, T);
    if (s == ST_OK)
        s = fill_plan(l, n, T, count, span, p);
    free(count);
    ST_TRY(s);
    p->cores_available = l->n_cores;
    p->pus_available = l->n_pus;
    if (total > l->n_pus) {
        p->oversubscribed = 1;
        if (T == 1)
            snprintf(p->warning, sizeof p->warning, "oversubscribed: %d workers share %d "
                     "PUs, each shared PU runs its workers at a fraction of its speed",
                     n, l->n_pus);
        else
            snprintf(p->warning, sizeof p->warning, "oversubscribed: %d workers of %d threads "
                     "share %d PUs", n, T, l->n_pus);
    } else if (span) {
        snprintf(p->warning, sizeof p->warning, "some teams span NUMA domains "
                 "(--team-spans-domains): their threads read memory across domains");
    }
    return ST_OK;
}

/* Appends a line to the plan's warning ("; " between lines). */
static void add_warning(st_plan *p, const char *line)
{
    size_t used = strlen(p->warning);
    snprintf(p->warning + used, sizeof p->warning - used, "%s%s", used ? "; " : "", line);
}

st_status st_plan_make(const st_topology *t, const st_plan_request *req, st_plan *out)
{
    memset(out, 0, sizeof *out);
    static const st_plan_request defaults = { .threads_per_worker = 1 };
    if (!req)
        req = &defaults;
    if (req->threads_per_worker < 0 || req->threads_per_worker > 1024)
        return st_fail(ST_ERR_INVALID, "%d threads per worker: expected 1 to 1024",
                       req->threads_per_worker);
    if (req->workers < 0 || req->workers > ST_MAX_WORKERS)
        return st_fail(ST_ERR_INVALID, "%d workers: expected 0 (one per core) to %d",
                       req->workers, ST_MAX_WORKERS);

    hwloc_bitmap_t allowed = hwloc_bitmap_alloc();
    if (!allowed)
        return st_fail(ST_ERR_NOMEM, "out of memory making a placement plan");
    layout l;
    memset(&l, 0, sizeof l);
    char note[sizeof out->warning];
    st_status s = allowed_cpuset(t, req->cpuset, allowed, note, sizeof note);
    if (s == ST_OK)
        s = layout_make(t->hw, allowed, &l);
    hwloc_bitmap_free(allowed);
    if (s == ST_OK)
        s = plan_from_layout(&l, req, out);
    if (s == ST_OK && note[0])
        add_warning(out, note);
    layout_free(&l);
    if (s != ST_OK)
        st_plan_free(out);
    return s;
}

void st_plan_free(st_plan *p)
{
    if (!p)
        return;
    free(p->workers);
    free(p->domain_first);
    free(p->team_pu);
    free(p->team_pu_os);
    memset(p, 0, sizeof *p);
}

/* ------------------------------------------------------------ printing */

void st_plan_print(FILE *f, const st_topology *t, const st_plan *p)
{
    fprintf(f, "topology %s: %d worker%s%s on %d NUMA domain%s; %d core%s, %d PU%s available\n",
            st_topology_name(t), p->n_workers, p->n_workers == 1 ? "" : "s",
            p->threads_per_worker > 1 ? " (teams of threads)" : "",
            p->n_domains, p->n_domains == 1 ? "" : "s", p->cores_available,
            p->cores_available == 1 ? "" : "s", p->pus_available,
            p->pus_available == 1 ? "" : "s");
    fprintf(f, "%6s  %6s  %6s  %-17s  %s\n", "worker", "NUMA", "core", "PU (logical / OS)",
            "notes");
    for (int i = 0; i < p->n_workers; i++) {
        const st_placement *w = &p->workers[i];
        char pu[32];
        snprintf(pu, sizeof pu, "%d / %d", w->pu, w->pu_os);
        const char *notes = w->spans                  ? "team spans NUMA domains"
                            : w->sibling && w->shared_pu ? "SMT sibling, shared PU"
                            : w->sibling              ? "SMT sibling"
                            : w->shared_pu            ? "shared PU"
                                                      : "";
        /* a team: the OS indices of its PUs, first one first */
        char team[96] = "";
        const int T = p->threads_per_worker;
        for (int k = 0; T > 1 && k < T; k++) {
            size_t used = strlen(team);
            if (used + 16 >= sizeof team) {
                snprintf(team + used, sizeof team - used, ",...");
                break;
            }
            snprintf(team + used, sizeof team - used, "%s%d", k ? "," : "team (OS): ",
                     p->team_pu_os[i * T + k]);
        }
        if (*notes || *team)
            fprintf(f, "%6d  %6d  %6d  %-17s  %s%s%s\n", w->worker, w->numa_os, w->core, pu,
                    team, *team && *notes ? "; " : "", notes);
        else
            fprintf(f, "%6d  %6d  %6d  %s\n", w->worker, w->numa_os, w->core, pu);
    }
    if (p->warning[0])
        fprintf(f, "warning: %s\n", p->warning);
}

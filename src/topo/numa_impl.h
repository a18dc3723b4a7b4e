/*
 * topo/numa_impl.h — private: what an st_numa_ctx is, for the run that
 * holds one per worker slot, and the tests.
 *
 * The public header keeps st_numa_ctx opaque (st_numa_ctx_create); inside
 * the library a worker slot embeds one and sets it up in place.
 */
#ifndef SUBTRAIN_TOPO_NUMA_IMPL_H
#define SUBTRAIN_TOPO_NUMA_IMPL_H

#include <subtrain/topo.h>

struct st_numa_ctx {
    const st_topology *topology;
    int numa_os;              /* node to bind to */
    int warned;               /* set when strict binding was refused */
    char warning[160];
};

/* A context for node numa_os of t in the caller's storage, as
 * st_numa_ctx_create makes one. */
void st_numa_ctx_init(st_numa_ctx *ctx, const st_topology *t, int numa_os);

#endif /* SUBTRAIN_TOPO_NUMA_IMPL_H */

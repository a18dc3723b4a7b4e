/*
 * comm/backend.h — private: what a reduction backend provides.
 *
 * A backend is reduce-scatter and all-gather over owner shards, with
 * holder counts: worker w owns shard w of the flat vector (the boundaries
 * of st_comm_shards), the reduce-scatter leaves in w's shard gradient the
 * mean of every element over the workers that hold it, and the all-gather
 * copies w's master shard into every replica that holds its elements.
 * The shared-buffer backend (shared.c) does it in one process through
 * NUMA-placed buffers; another (e.g. MPI across nodes) implements the same
 * operations over its own transport.
 *
 * The public functions (comm.c) check their arguments before forwarding,
 * so an op may assume: the engine exists; 0 <= w < n_workers; attach's
 * arena and vectors are given and its held ranges are non-empty, sorted,
 * disjoint and inside the vector; create's configuration has passed
 * st_comm_check_size and st_comm_map_domains.  Everything else (attached
 * twice, a collective before attach, a role the engine lacks) is the
 * backend's to report.  A failing op leaves its message in st_last_error.
 *
 * The hot path is reduce_scatter, all_gather and barrier, called every
 * step by every worker: they must not allocate, create anything or take a
 * lock; the dispatcher adds one indirect call and nothing else.
 *
 * Adding a backend: one new file defining a `const st_comm_backend_ops`,
 * its declaration below, and one entry in the table of comm.c (and its
 * name in st_comm_backend_kind, include/subtrain/comm.h, if it is new).
 */
#ifndef SUBTRAIN_COMM_BACKEND_H
#define SUBTRAIN_COMM_BACKEND_H

#include <stddef.h>

#include <subtrain/arena.h>
#include <subtrain/comm.h>
#include <subtrain/params.h>
#include <subtrain/status.h>

#include "core/blocked.h"

/* How many of the n blocked copies a backend takes: all when they are
 * sorted and disjoint, as its items' cuts need, else none. */
static inline int st_comm_blocked_taken(const st_param_blocked *b, int n)
{
    for (int i = 1; i < n; i++)
        if (b[i].offset < st_blocked_end(&b[i - 1]))
            return 0;
    return n > 0 ? n : 0;
}

/* A backend's own state.  Never defined: each backend converts the pointer
 * to its own structure (a distinct type, so that it cannot be mixed up
 * with the public st_comm). */
typedef struct st_comm_backend st_comm_backend;

typedef struct st_comm_backend_ops {
    /* One thread, before the workers start; *out is the backend's state. */
    st_status (*create)(const st_comm_config *cfg, st_comm_backend **out);
    void (*destroy)(st_comm_backend *b);

    /* Every worker on its own thread, once (the compact form: held range i
     * at grads + local[i], params + local[i]; local NULL: full layout).
     * Returns after every worker has attached. */
    st_status (*attach)(st_comm_backend *b, int w, st_arena *arena, float *grads,
                        float *params, const st_range *held, const size_t *local, int n_held);
    void (*set_shard_output)(st_comm_backend *b, int w, float *out);
    /* Optional (NULL: the all-gather writes no bf16 copies). */
    void (*set_param_copies)(st_comm_backend *b, int w, const st_param_copy *copies, int n);
    int (*gathers_copies)(const st_comm_backend *b, int w);
    /* Optional (NULL: the all-gather packs no blocked copies). */
    void (*set_param_blocked)(st_comm_backend *b, int w, const st_param_blocked *blocked,
                              int n);
    int (*gathers_blocked)(const st_comm_backend *b, int w);
    void (*reset)(st_comm_backend *b);

    /* w's shard (range, averaged gradient, master weights). */
    st_range (*shard)(const st_comm_backend *b, int w);
    float *(*shard_grads)(st_comm_backend *b, int w);
    float *(*shard_params)(st_comm_backend *b, int w);
    /* Optional (NULL: no bf16 master shards). */
    uint16_t *(*shard_params16)(st_comm_backend *b, int w);

    /* The hot path.  reduce_ready is optional (NULL: nothing to do before
     * the reduce-scatter, which then reduces everything). */
    st_status (*reduce_scatter)(st_comm_backend *b, int w);
    st_status (*reduce_ready)(st_comm_backend *b, int w, size_t from, st_range *done);
    st_status (*all_gather)(st_comm_backend *b, int w);
    st_status (*barrier)(st_comm_backend *b, int w);

    /* From any thread: every worker waiting in, or later entering, a
     * collective or barrier returns ST_ERR_INVALID ("another worker
     * failed"). */
    void (*abort)(st_comm_backend *b);

    /* Worker w's bytes per step from the plan (zeros before attach). */
    st_comm_bytes (*bytes_per_step)(const st_comm_backend *b, int w);
} st_comm_backend_ops;

/* The backends built into the library (one per file). */
extern const st_comm_backend_ops st_comm_shared_ops;   /* shared.c */
#ifdef HAVE_MPI
extern const st_comm_backend_ops st_comm_mpi_ops;      /* mpi.c */
/* The MPI backend of rank `rank` of a described job (comm/sizing_world.h):
 * its layout without MPI, for a sizing run.  mpi.c. */
struct st_comm_world;
st_status st_comm_mpi_create_sizing(const st_comm_config *cfg, struct st_comm_world *world,
                                    int rank, st_comm_backend **out);
#endif

#endif /* SUBTRAIN_COMM_BACKEND_H */

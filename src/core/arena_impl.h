/*
 * core/arena_impl.h — private: what an st_arena is, for the library's
 * own structures that hold one (a worker's, a run's evaluation arena) and
 * for the tests.
 *
 * The public header keeps st_arena opaque (st_arena_create); inside the
 * library an arena is embedded and set up in place with st_arena_init.
 */
#ifndef SUBTRAIN_CORE_ARENA_IMPL_H
#define SUBTRAIN_CORE_ARENA_IMPL_H

#include <subtrain/arena.h>

/* Storage that takes turns (activation recomputation, nn/recompute.c):
 * while a lane is open, the arena's activation and attention allocations
 * are that lane's.  Lanes share a region per kind: each lane starts at
 * its region's start, so lanes of one region overlap.  With no region
 * yet (base NULL) the allocations are the arena's own and each lane's
 * bytes are counted, which is how the regions are sized. */
enum { ST_ARENA_REGIONS = 3 };
typedef struct st_arena_lanes {
    int open;                      /* the lane allocations go to; -1: none */
    int n;                         /* lanes */
    const int *region;             /* n: each lane's region */
    size_t *used;                  /* n x ST_MEM_KIND_COUNT: bytes each lane took */
    char *base[ST_ARENA_REGIONS][ST_MEM_KIND_COUNT];   /* NULL: counting */
    size_t size[ST_ARENA_REGIONS][ST_MEM_KIND_COUNT];
} st_arena_lanes;

/* Whether allocations of `kind` go to an open lane. */
static inline int st_arena_lane_kind(st_mem_kind kind)
{
    return kind == ST_MEM_ACTIVATIONS || kind == ST_MEM_ATTENTION;
}

/* The blocks an arena handed out from its chunks (an open lane's region
 * aside), in order: what one build took (nn/model_memo.c), to replay
 * into another arena with st_arena_replay. */
typedef struct st_arena_logged {
    char *p;
    size_t bytes;              /* as accounted: rounded up to the alignment */
    st_mem_kind kind;
} st_arena_logged;

typedef struct st_arena_log {
    st_arena_logged *e;
    int n, cap;
    int failed;                /* out of memory recording: the log is incomplete */
} st_arena_log;

struct st_arena {
    char owner[32];            /* e.g. "worker 3": used in error messages */
    st_chunk_backend backend;
    size_t chunk_bytes;        /* default size of a new chunk */
    st_arena_chunk *head;      /* most recent chunk first */
    st_arena_chunk *spare;     /* chunks a rewind emptied, kept for reuse */
    st_mem_stats stats;
    st_arena_lanes *lanes;     /* NULL: none (the arena's owner sets it) */
    st_arena_log *log;         /* NULL: none (the arena's owner sets it) */
    struct st_arena_sparse *sparse;   /* st_arena_reserve_floats', newest first */
};

/* A vector of `count` floats of which some pages never hold memory: its
 * address space now (nothing readable, nothing counted), its memory from
 * st_arena_commit_floats.  A rewind or release unmaps it. */
st_status st_arena_reserve_floats(st_arena *arena, size_t count, float **out);
/* Memory for the pages of v (reserved above) that hold an element outside
 * the n ranges [skip[2k], skip[2k + 1]) (increasing, disjoint), counted
 * under kind and zero-filled by the calling thread (first touch; a sizing
 * arena's stay untouched).  The other pages stay unmapped. */
st_status st_arena_commit_floats(st_arena *arena, st_mem_kind kind, float *v,
                                 const size_t *skip, int n);

/* An empty arena in the caller's storage, as st_arena_create makes one;
 * st_arena_release gives its chunks back. */
void st_arena_init(st_arena *arena, const char *owner,
                   const st_chunk_backend *backend, size_t chunk_bytes);

/* The blocks of `log`, asked of `arena` in the same order, kinds and
 * sizes: its accounting changes as the logged calls would have changed
 * it.  out[i]: the block of log entry i. */
st_status st_arena_replay(st_arena *arena, const st_arena_log *log, char **out);
/* Frees what the log holds (not its blocks: they are its arena's). */
void st_arena_log_free(st_arena_log *log);

/* The backend of a sizing run (st_train_size): chunks of address space
 * that nobody touches.  An arena over it accounts every block as any
 * arena does, but does not zero-fill them, so laying out a worker's
 * buffers with the run's own code costs no memory. */
st_chunk_backend st_sizing_backend(void);

/* The address space of one sizing run (st_train_size): its chunks come
 * from one reservation of `bytes` (of address space, never committed
 * unless written), a chunk beyond it from a mapping of its own, and a
 * freed chunk of it is given back with the whole space.  Destroy it after
 * every arena over it is released. */
typedef struct st_sizing_space st_sizing_space;
st_status st_sizing_space_create(size_t bytes, st_sizing_space **out);
void st_sizing_space_destroy(st_sizing_space *space);
/* st_sizing_backend over the space (NULL: st_sizing_backend). */
st_chunk_backend st_sizing_backend_in(st_sizing_space *space);
/* The space a sizing arena's chunks come from (NULL: none, or not a
 * sizing arena). */
st_sizing_space *st_arena_sizing_space(const st_arena *arena);
/* What the run's code remembers over one sizing run: a memo of each
 * kind (named by its make; four kinds at most) is made by the first
 * caller's make() and freed by drop with the space.  NULL if make failed
 * or there is no room for another kind. */
void *st_sizing_space_memo(st_sizing_space *space, void *(*make)(void), void (*drop)(void *));
/* Whether the arena's chunks come from st_sizing_backend: the code that
 * fills a buffer at build time (initial weights) skips it there. */
int st_arena_is_sizing(const st_arena *arena);

#endif /* SUBTRAIN_CORE_ARENA_IMPL_H */

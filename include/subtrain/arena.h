/*
 * subtrain/arena.h — per-owner memory arena with byte accounting.
 *
 * Every byte a worker uses for training (weights, gradients, optimizer state,
 * activations, oneDNN workspace) comes from that worker's arena, so that the
 * trainer can report per-worker memory, current and peak, broken down by
 * kind.  An arena hands out 64-byte aligned blocks carved from large chunks
 * (bump allocation); it is released as a whole, or rewound to a mark for
 * short-lived scratch.  Chunks come from a pluggable backend so that a later
 * worker can allocate on its own NUMA node; the default backend is the C
 * library's aligned allocator.
 *
 * An arena is owned by one thread at a time: it takes no lock.
 */
#ifndef SUBTRAIN_ARENA_H
#define SUBTRAIN_ARENA_H

#include <stddef.h>
#include <subtrain/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What the bytes are for: the breakdown reported per worker. */
typedef enum st_mem_kind {
    ST_MEM_WEIGHTS = 0,
    ST_MEM_GRADIENTS,
    ST_MEM_OPTIMIZER,
    ST_MEM_ACTIVATIONS,
    ST_MEM_WORKSPACE,
    ST_MEM_ATTENTION,     /* activations too: attention's probabilities, saved
                           * for the backward (batch x heads x T^2 per layer),
                           * on their own line since they grow with T^2 */
    ST_MEM_KIND_COUNT
} st_mem_kind;

/* "weights", "gradients", "optimizer", "activations", "workspace",
 * "attention". */
const char *st_mem_kind_name(st_mem_kind kind);

typedef struct st_mem_stats {
    size_t current[ST_MEM_KIND_COUNT]; /* bytes handed out now, per kind */
    size_t peak[ST_MEM_KIND_COUNT];    /* most bytes ever out at once, per kind */
    size_t current_total;              /* sum of current[] */
    size_t peak_total;                 /* most bytes ever out at once, all kinds */
    size_t reserved;                   /* bytes of chunks obtained from the backend */
} st_mem_stats;

/* Where chunks come from.  alloc returns uninitialised memory: the arena's
 * owner first-touches it, which is what decides NUMA page placement. */
typedef struct st_chunk_backend {
    void *(*alloc)(size_t bytes, void *ctx);
    void (*free)(void *ptr, size_t bytes, void *ctx);
    void *ctx;
} st_chunk_backend;

typedef struct st_arena_chunk st_arena_chunk;
typedef struct st_arena st_arena;

/* A point to rewind to: everything allocated after it is given back. */
typedef struct st_arena_mark {
    st_arena_chunk *chunk;
    size_t used;
    size_t current[ST_MEM_KIND_COUNT];
    void *sparse;                      /* the newest sparse vector then */
} st_arena_mark;

/* A new arena, empty; owner names it in error messages ("worker 3").
 * backend may be NULL (C library allocator); chunk_bytes 0 means 4 MiB. */
st_status st_arena_create(const char *owner, const st_chunk_backend *backend,
                          size_t chunk_bytes, st_arena **out);
/* Gives every chunk back and frees the arena; NULL does nothing. */
void st_arena_destroy(st_arena *arena);

/* Its bytes: handed out now and at most, per kind, and reserved. */
st_mem_stats st_arena_stats(const st_arena *arena);

/* A 64-byte aligned block of `bytes`, counted under `kind`.  The content is
 * zero-filled by the calling thread (first touch). */
st_status st_arena_alloc(st_arena *arena, st_mem_kind kind, size_t bytes,
                         void **out);

/* Typed convenience: `count` floats. */
st_status st_arena_alloc_floats(st_arena *arena, st_mem_kind kind,
                                size_t count, float **out);

st_arena_mark st_arena_get_mark(const st_arena *arena);
/* Gives back everything allocated after the mark.  Chunks emptied by it are
 * kept (still reserved) and reused by later allocations: a subnetwork
 * rebuilt every round then touches pages it already has, on its node,
 * instead of faulting fresh ones in (doc/benchmarks.md says what that
 * saves). */
void st_arena_rewind(st_arena *arena, const st_arena_mark *mark);

/* Gives every chunk back; the peaks are kept (they are history). */
void st_arena_release(st_arena *arena);

#ifdef __cplusplus
}
#endif
#endif /* SUBTRAIN_ARENA_H */

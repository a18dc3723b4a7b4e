/*
 * core/arena.c — chunked bump allocator with per-kind byte accounting.
 *
 * Why an arena: every buffer of a worker is created once, before the first
 * step, and lives until the worker ends; a bump allocator makes that cheap,
 * keeps a worker's memory in a few large chunks (one NUMA placement decision
 * per chunk) and gives exact accounting for the per-worker memory report.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/arena_impl.h"
#include "core/enum_table.h"
#include "core/error.h"

#define ST_ALIGN 64
#define ST_DEFAULT_CHUNK ((size_t)4 << 20)

struct st_arena_chunk {
    st_arena_chunk *next;   /* older chunk */
    size_t size;            /* usable bytes after the header */
    size_t used;
    void *base;             /* as returned by the backend */
    size_t base_bytes;
};

static const st_enum_entry mem_kind_entries[] = {
    { "weights", ST_MEM_WEIGHTS },
    { "gradients", ST_MEM_GRADIENTS },
    { "optimizer", ST_MEM_OPTIMIZER },
    { "activations", ST_MEM_ACTIVATIONS },
    { "workspace", ST_MEM_WORKSPACE },
    { "attention", ST_MEM_ATTENTION },
};
static const st_enum_table mem_kinds = ST_ENUM_TABLE("memory kind", mem_kind_entries);

const char *st_mem_kind_name(st_mem_kind kind)
{
    return st_enum_name(&mem_kinds, (int)kind);
}

static void *libc_alloc(size_t bytes, void *ctx)
{
    (void)ctx;
    void *p = NULL;
    return posix_memalign(&p, ST_ALIGN, bytes) == 0 ? p : NULL;
}

static void libc_free(void *ptr, size_t bytes, void *ctx)
{
    (void)bytes;
    (void)ctx;
    free(ptr);
}

/* A sizing run's address space: one reservation that its workers' chunks
 * are bumped off without a system call, given back in one piece. */
struct st_sizing_space {
    char *base;
    size_t size;
    atomic_size_t used;
    pthread_mutex_t lock;        /* for the memos' creation */
    struct {                     /* st_sizing_space_memo's, by make */
        void *(*make)(void);
        void *memo;
        void (*drop)(void *);
    } memos[4];
};

#define ST_PAGE ((size_t)4096)

st_status st_sizing_space_create(size_t bytes, st_sizing_space **out)
{
    *out = NULL;
    st_sizing_space *sp = malloc(sizeof *sp);
    if (!sp)
        return st_fail(ST_ERR_NOMEM, "out of memory for a sizing run's address space");
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    sp->base = p == MAP_FAILED ? NULL : p;   /* none: every chunk is mapped alone */
    sp->size = p == MAP_FAILED ? 0 : bytes;
    atomic_init(&sp->used, 0);
    pthread_mutex_init(&sp->lock, NULL);
    memset(sp->memos, 0, sizeof sp->memos);
    *out = sp;
    return ST_OK;
}

void st_sizing_space_destroy(st_sizing_space *sp)
{
    if (!sp)
        return;
    for (size_t i = 0; i < sizeof sp->memos / sizeof *sp->memos; i++)
        if (sp->memos[i].memo)
            sp->memos[i].drop(sp->memos[i].memo);
    pthread_mutex_destroy(&sp->lock);
    if (sp->base)
        munmap(sp->base, sp->size);
    free(sp);
}

void *st_sizing_space_memo(st_sizing_space *sp, void *(*make)(void), void (*drop)(void *))
{
    void *m = NULL;
    pthread_mutex_lock(&sp->lock);
    for (size_t i = 0; i < sizeof sp->memos / sizeof *sp->memos; i++)
        if (sp->memos[i].make == make || !sp->memos[i].make) {
            if (!sp->memos[i].make && (sp->memos[i].memo = make()) != NULL) {
                sp->memos[i].make = make;
                sp->memos[i].drop = drop;
            }
            m = sp->memos[i].memo;
            break;
        }
    pthread_mutex_unlock(&sp->lock);
    return m;
}

/* Address space only: pages are committed when first written, and the
 * arena writes none (st_arena_alloc does not zero-fill for this backend),
 * so the big buffers of a sizing run cost no memory.  From the space
 * (ctx) while it has room, else a mapping of its own. */
static void *sizing_alloc(size_t bytes, void *ctx)
{
    st_sizing_space *sp = ctx;
    if (sp && sp->base && bytes <= sp->size) {
        const size_t take = (bytes + ST_PAGE - 1) & ~(ST_PAGE - 1);
        const size_t at = atomic_fetch_add(&sp->used, take);
        if (at <= sp->size - bytes)
            return sp->base + at;
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* A chunk of the space goes with it (st_sizing_space_destroy). */
static void sizing_free(void *ptr, size_t bytes, void *ctx)
{
    const st_sizing_space *sp = ctx;
    if (sp && sp->base && (char *)ptr >= sp->base && (char *)ptr < sp->base + sp->size)
        return;
    munmap(ptr, bytes);
}

st_chunk_backend st_sizing_backend(void)
{
    return (st_chunk_backend){ sizing_alloc, sizing_free, NULL };
}

st_chunk_backend st_sizing_backend_in(st_sizing_space *space)
{
    return (st_chunk_backend){ sizing_alloc, sizing_free, space };
}

int st_arena_is_sizing(const st_arena *arena)
{
    return arena->backend.alloc == sizing_alloc;
}

st_sizing_space *st_arena_sizing_space(const st_arena *arena)
{
    return st_arena_is_sizing(arena) ? arena->backend.ctx : NULL;
}

void st_arena_init(st_arena *arena, const char *owner,
                   const st_chunk_backend *backend, size_t chunk_bytes)
{
    memset(arena, 0, sizeof *arena);
    strncpy(arena->owner, owner ? owner : "arena", sizeof arena->owner - 1);
    if (backend)
        arena->backend = *backend;
    else
        arena->backend = (st_chunk_backend){ libc_alloc, libc_free, NULL };
    arena->chunk_bytes = chunk_bytes ? chunk_bytes : ST_DEFAULT_CHUNK;
}

st_status st_arena_create(const char *owner, const st_chunk_backend *backend,
                          size_t chunk_bytes, st_arena **out)
{
    *out = malloc(sizeof **out);
    if (!*out)
        return st_fail(ST_ERR_NOMEM, "%s: out of memory creating an arena",
                       owner ? owner : "arena");
    st_arena_init(*out, owner, backend, chunk_bytes);
    return ST_OK;
}

void st_arena_destroy(st_arena *arena)
{
    if (!arena)
        return;
    st_arena_release(arena);
    free(arena);
}

st_mem_stats st_arena_stats(const st_arena *arena)
{
    return arena->stats;
}

static size_t align_up(size_t n)
{
    return (n + ST_ALIGN - 1) & ~(size_t)(ST_ALIGN - 1);
}

/* The smallest spare chunk with room for need bytes, unlinked; NULL if
 * none.  Smallest, so that a small request does not take the chunk a
 * large one will want next (a rebuilt subnetwork asks for the same sizes
 * in the same order, give or take a group). */
static st_arena_chunk *take_spare(st_arena *arena, size_t need)
{
    st_arena_chunk **best = NULL;
    for (st_arena_chunk **p = &arena->spare; *p; p = &(*p)->next)
        if ((*p)->size >= need && (!best || (*p)->size < (*best)->size))
            best = p;
    if (!best)
        return NULL;
    st_arena_chunk *c = *best;
    *best = c->next;
    return c;
}

static st_status add_chunk(st_arena *arena, size_t need)
{
    st_arena_chunk *spare = take_spare(arena, need);
    if (spare) {
        spare->next = arena->head;
        spare->used = 0;
        arena->head = spare;
        return ST_OK;
    }
    size_t header = align_up(sizeof(st_arena_chunk));
    size_t usable = need > arena->chunk_bytes ? need : arena->chunk_bytes;
    if (usable > SIZE_MAX - header)
        return st_fail(ST_ERR_NOMEM, "%s: %zu bytes is more than can be addressed",
                       arena->owner, need);
    void *base = arena->backend.alloc(header + usable, arena->backend.ctx);
    if (!base)
        return st_fail(ST_ERR_NOMEM, "%s: out of memory allocating a %zu-byte chunk "
                       "(%zu bytes already reserved)", arena->owner,
                       header + usable, arena->stats.reserved);
    /* a sizing chunk's header is kept apart, so that its space stays
     * untouched (its bytes are reserved all the same) */
    st_arena_chunk *c = st_arena_is_sizing(arena) ? malloc(sizeof *c) : base;
    if (!c) {
        arena->backend.free(base, header + usable, arena->backend.ctx);
        return st_fail(ST_ERR_NOMEM, "%s: out of memory for a chunk's header", arena->owner);
    }
    c->next = arena->head;
    c->size = usable;
    c->used = 0;
    c->base = base;
    c->base_bytes = header + usable;
    arena->head = c;
    arena->stats.reserved += c->base_bytes;
    return ST_OK;
}

static char *chunk_data(st_arena_chunk *c)
{
    return (char *)c->base + align_up(sizeof(st_arena_chunk));
}

static void account(st_mem_stats *s, st_mem_kind kind, size_t bytes)
{
    s->current[kind] += bytes;
    s->current_total += bytes;
    if (s->current[kind] > s->peak[kind])
        s->peak[kind] = s->current[kind];
    if (s->current_total > s->peak_total)
        s->peak_total = s->current_total;
}

static void log_add(st_arena_log *log, char *p, size_t bytes, st_mem_kind kind)
{
    if (log->failed)
        return;
    if (log->n == log->cap) {
        const int cap = log->cap ? 2 * log->cap : 64;
        st_arena_logged *e = realloc(log->e, (size_t)cap * sizeof *e);
        if (!e) {
            log->failed = 1;
            return;
        }
        log->e = e;
        log->cap = cap;
    }
    log->e[log->n++] = (st_arena_logged){ p, bytes, kind };
}

st_status st_arena_alloc(st_arena *arena, st_mem_kind kind, size_t bytes, void **out)
{
    *out = NULL;
    if ((unsigned)kind >= ST_MEM_KIND_COUNT)
        return st_fail(ST_ERR_INVALID, "%s: unknown memory kind %d", arena->owner, (int)kind);
    if (bytes > SIZE_MAX / 2)
        return st_fail(ST_ERR_NOMEM, "%s: request of %zu bytes is absurd", arena->owner, bytes);
    size_t need = align_up(bytes ? bytes : 1);
    st_arena_lanes *L = arena->lanes;
    if (L && L->open >= 0 && st_arena_lane_kind(kind)) {
        size_t *used = &L->used[(size_t)L->open * ST_MEM_KIND_COUNT + (size_t)kind];
        char *base = L->base[L->region[L->open]][kind];
        if (base) {
            if (need > L->size[L->region[L->open]][kind] - *used)
                return st_fail(ST_ERR_INVALID, "%s: lane %d of %s outgrows its region of %zu "
                               "bytes", arena->owner, L->open, st_mem_kind_name(kind),
                               L->size[L->region[L->open]][kind]);
            *out = base + *used;
            *used += need;
            if (!st_arena_is_sizing(arena))
                memset(*out, 0, need);
            return ST_OK;
        }
        *used += need;   /* counting: the arena's own, below */
    }
    if (!arena->head || arena->head->size - arena->head->used < need)
        ST_TRY(add_chunk(arena, need));
    st_arena_chunk *c = arena->head;
    char *p = chunk_data(c) + c->used;
    c->used += need;
    if (!st_arena_is_sizing(arena))
        memset(p, 0, need); /* first touch by the owner thread */
    account(&arena->stats, kind, need);
    *out = p;
    if (arena->log)
        log_add(arena->log, p, need, kind);
    return ST_OK;
}

st_status st_arena_replay(st_arena *arena, const st_arena_log *log, char **out)
{
    for (int i = 0; i < log->n; i++) {
        void *p;
        ST_TRY(st_arena_alloc(arena, log->e[i].kind, log->e[i].bytes, &p));
        out[i] = p;
    }
    return ST_OK;
}

void st_arena_log_free(st_arena_log *log)
{
    free(log->e);
    memset(log, 0, sizeof *log);
}

st_status st_arena_alloc_floats(st_arena *arena, st_mem_kind kind, size_t count, float **out)
{
    if (count > SIZE_MAX / sizeof(float))
        return st_fail(ST_ERR_NOMEM, "%s: %zu floats overflow size_t", arena->owner, count);
    void *p;
    st_status s = st_arena_alloc(arena, kind, count * sizeof(float), &p);
    *out = p;
    return s;
}

/* A reserved vector (st_arena_reserve_floats): its mapping. */
struct st_arena_sparse {
    struct st_arena_sparse *next;   /* older */
    char *base;
    size_t bytes;                   /* mapped address space */
    size_t count;                   /* floats */
    int committed;
    st_mem_kind kind;
};

st_status st_arena_reserve_floats(st_arena *arena, size_t count, float **out)
{
    *out = NULL;
    if (count > (SIZE_MAX / 2) / sizeof(float))
        return st_fail(ST_ERR_NOMEM, "%s: %zu floats overflow size_t", arena->owner, count);
    struct st_arena_sparse *v = calloc(1, sizeof *v);
    if (!v)
        return st_fail(ST_ERR_NOMEM, "%s: out of memory reserving %zu floats", arena->owner,
                       count);
    v->bytes = (count * sizeof(float) + ST_PAGE - 1) & ~(ST_PAGE - 1);
    if (!v->bytes)
        v->bytes = ST_PAGE;
    void *p = mmap(NULL, v->bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) {
        free(v);
        return st_fail(ST_ERR_NOMEM, "%s: no address space for %zu floats", arena->owner,
                       count);
    }
    v->base = p;
    v->count = count;
    v->next = arena->sparse;
    arena->sparse = v;
    *out = p;
    return ST_OK;
}

/* Pages [lo, hi) of v readable and written; counted up to the vector's
 * end (64-byte aligned, as st_arena_alloc would hand it out). */
static st_status commit_pages(st_arena *arena, struct st_arena_sparse *v, size_t lo, size_t hi)
{
    if (lo >= hi)
        return ST_OK;
    char *p = v->base + lo * ST_PAGE;
    const size_t bytes = (hi - lo) * ST_PAGE, end = align_up(v->count * sizeof(float));
    if (mprotect(p, bytes, PROT_READ | PROT_WRITE) != 0)
        return st_fail(ST_ERR_NOMEM, "%s: out of memory committing %zu bytes", arena->owner,
                       bytes);
    const size_t counted = (hi * ST_PAGE < end ? hi * ST_PAGE : end) - lo * ST_PAGE;
    if (!st_arena_is_sizing(arena))
        memset(p, 0, counted);
    account(&arena->stats, v->kind, counted);
    return ST_OK;
}

st_status st_arena_commit_floats(st_arena *arena, st_mem_kind kind, float *vec,
                                 const size_t *skip, int n)
{
    struct st_arena_sparse *v = arena->sparse;
    while (v && v->base != (char *)vec)
        v = v->next;
    if (!v || v->committed)
        return st_fail(ST_ERR_INVALID, "%s: committing a vector not reserved, or twice",
                       arena->owner);
    v->kind = kind;
    v->committed = 1;
    /* the kept elements run from `from` to the next skipped range; a page
     * they share with the one before is committed once */
    const size_t P = v->bytes / ST_PAGE;
    size_t from = 0, done = 0;   /* elements; pages committed below `done` */
    for (int k = 0; k <= n; k++) {
        const size_t to = k < n ? skip[2 * k] : v->count;
        if (to > from) {
            size_t lo = from * sizeof(float) / ST_PAGE;
            const size_t hi = ((to * sizeof(float) + ST_PAGE - 1) / ST_PAGE);
            lo = lo > done ? lo : done;
            ST_TRY(commit_pages(arena, v, lo, hi < P ? hi : P));
            done = hi > done ? hi : done;
        }
        if (k < n)
            from = skip[2 * k + 1];
    }
    return ST_OK;
}

/* Unmaps the reserved vectors newer than `keep`, their bytes uncounted
 * (a rewind then sets the counts from its mark). */
static void drop_sparse(st_arena *arena, const struct st_arena_sparse *keep)
{
    while (arena->sparse && arena->sparse != keep) {
        struct st_arena_sparse *v = arena->sparse;
        arena->sparse = v->next;
        munmap(v->base, v->bytes);
        free(v);
    }
}

st_arena_mark st_arena_get_mark(const st_arena *arena)
{
    st_arena_mark m;
    m.chunk = arena->head;
    m.used = arena->head ? arena->head->used : 0;
    memcpy(m.current, arena->stats.current, sizeof m.current);
    m.sparse = arena->sparse;
    return m;
}

static void free_chunks(st_arena *arena, st_arena_chunk *c)
{
    while (c) {
        st_arena_chunk *next = c->next;
        void *base = c->base;
        const size_t bytes = c->base_bytes;
        arena->stats.reserved -= bytes;
        if ((void *)c != base)   /* a sizing chunk's header */
            free(c);
        arena->backend.free(base, bytes, arena->backend.ctx);
        c = next;
    }
}

void st_arena_rewind(st_arena *arena, const st_arena_mark *mark)
{
    drop_sparse(arena, mark->sparse);
    while (arena->head && arena->head != mark->chunk) {
        st_arena_chunk *c = arena->head;
        arena->head = c->next;
        c->next = arena->spare;
        arena->spare = c;
    }
    if (arena->head)
        arena->head->used = mark->used;
    memcpy(arena->stats.current, mark->current, sizeof mark->current);
    arena->stats.current_total = 0;
    for (int k = 0; k < ST_MEM_KIND_COUNT; k++)
        arena->stats.current_total += arena->stats.current[k];
}

void st_arena_release(st_arena *arena)
{
    st_arena_mark empty = { 0 };
    st_arena_rewind(arena, &empty);
    free_chunks(arena, arena->spare);
    arena->spare = NULL;
}

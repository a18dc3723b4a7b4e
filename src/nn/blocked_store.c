/*
 * nn/blocked_store.c — one set of blocked weight copies for the models
 * over one storage (nn/blocked_store.h).
 *
 * The models of a NUMA domain's workers are built at once, each by its
 * worker's thread, and the first to build a layer allocates its copies:
 * so taking a copy is under a mutex.  Building is all that locks; the
 * step finds its copies through the pointers the layers kept.
 */
#include <pthread.h>
#include <stdlib.h>

#include "core/error.h"
#include "nn/blocked_store.h"

typedef struct store_copy {
    size_t offset;
    int row_dim;
    dnnl_memory_desc_t md;
    void *p;
    size_t bytes;
} store_copy;

struct st_blocked_store {
    st_arena *arena;
    pthread_mutex_t lock;
    store_copy *c;
    int n, cap;
};

st_status st_blocked_store_create(st_arena *arena, st_blocked_store **out)
{
    st_blocked_store *s = calloc(1, sizeof *s);
    if (!s)
        return st_fail(ST_ERR_NOMEM, "out of memory for a store of blocked weight copies");
    s->arena = arena;
    pthread_mutex_init(&s->lock, NULL);
    *out = s;
    return ST_OK;
}

void st_blocked_store_destroy(st_blocked_store *s)
{
    if (!s)
        return;
    pthread_mutex_destroy(&s->lock);
    free(s->c);
    free(s);
}

static st_status take_locked(st_blocked_store *s, size_t offset, int row_dim,
                             const dnnl_memory_desc_t *md, void **p)
{
    for (int i = 0; i < s->n; i++) {
        const store_copy *c = &s->c[i];
        if (c->offset != offset || c->row_dim != row_dim)
            continue;
        if (!dnnl_memory_desc_equal(&c->md, md))
            return st_fail(ST_ERR_INVALID, "two models over one storage lay out the blocked "
                           "copy of the weights at parameter %zu differently", offset);
        *p = c->p;
        return ST_OK;
    }
    if (s->n == s->cap) {
        const int cap = s->cap ? 2 * s->cap : 16;
        store_copy *c = realloc(s->c, (size_t)cap * sizeof *c);
        if (!c)
            return st_fail(ST_ERR_NOMEM, "out of memory listing the blocked weight copies");
        s->c = c;
        s->cap = cap;
    }
    const size_t bytes = dnnl_memory_desc_get_size(md);
    ST_TRY(st_arena_alloc(s->arena, ST_MEM_WEIGHTS, bytes, p));
    s->c[s->n++] = (store_copy){ offset, row_dim, *md, *p, bytes };
    return ST_OK;
}

st_status st_blocked_store_take(st_blocked_store *s, size_t offset, int row_dim,
                                const dnnl_memory_desc_t *md, void **p)
{
    pthread_mutex_lock(&s->lock);
    st_status st = take_locked(s, offset, row_dim, md, p);
    pthread_mutex_unlock(&s->lock);
    return st;
}

void *st_blocked_store_moved(const st_blocked_store *s, st_blocked_store *t, const void *p)
{
    const char *q = p;
    for (int i = 0; s && t && i < s->n; i++) {
        const store_copy *c = &s->c[i];
        if (q < (const char *)c->p || q >= (const char *)c->p + c->bytes)
            continue;
        void *to;
        if (st_blocked_store_take(t, c->offset, c->row_dim, &c->md, &to) != ST_OK)
            return NULL;
        return (char *)to + (q - (const char *)c->p);
    }
    return NULL;
}

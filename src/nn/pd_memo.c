/* nn/pd_memo.c — a sizing run's primitive descriptors (nn/pd_memo.h). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/arena_impl.h"
#include "nn/dnnl_util.h"
#include "nn/pd_memo.h"

typedef struct memo_entry {
    uint64_t hash;   /* of the key: compared first */
    unsigned char *key;
    size_t len;
    dnnl_primitive_desc_t pd;
} memo_entry;

/* A descriptor handed out (a forward's, the hint of its backward) and its
 * entry. */
typedef struct memo_given {
    const void *pd;
    int id;
} memo_given;

typedef struct pd_memo {
    pthread_mutex_t lock;
    memo_entry *e;
    int n, cap;
    memo_given *given;
    int n_given, cap_given;
    int given_lost;   /* a descriptor went unrecorded: no hint is known */
} pd_memo;

static void *memo_make(void)
{
    pd_memo *m = calloc(1, sizeof *m);
    if (m)
        pthread_mutex_init(&m->lock, NULL);
    return m;
}

static void memo_drop(void *p)
{
    pd_memo *m = p;
    for (int i = 0; i < m->n; i++) {
        free(m->e[i].key);
        dnnl_primitive_desc_destroy(m->e[i].pd);
    }
    free(m->e);
    free(m->given);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

static pd_memo *memo_of(const st_arena *arena)
{
    st_sizing_space *sp = arena ? st_arena_sizing_space(arena) : NULL;
    return sp ? st_sizing_space_memo(sp, memo_make, memo_drop) : NULL;
}

/* The bytes of an operation descriptor (plain data in oneDNN 2), by its
 * kind; 0: a kind not listed, not memoised. */
static size_t op_size(const void *op_desc)
{
    switch (*(const dnnl_primitive_kind_t *)op_desc) {
    case dnnl_batch_normalization: return sizeof(dnnl_batch_normalization_desc_t);
    case dnnl_binary: return sizeof(dnnl_binary_desc_t);
    case dnnl_convolution: return sizeof(dnnl_convolution_desc_t);
    case dnnl_eltwise: return sizeof(dnnl_eltwise_desc_t);
    case dnnl_layer_normalization: return sizeof(dnnl_layer_normalization_desc_t);
    case dnnl_logsoftmax: return sizeof(dnnl_logsoftmax_desc_t);
    case dnnl_matmul: return sizeof(dnnl_matmul_desc_t);
    case dnnl_pooling_v2: return sizeof(dnnl_pooling_v2_desc_t);
    case dnnl_softmax: return sizeof(dnnl_softmax_desc_t);
    default: return 0;
    }
}

/* The entry of a hint handed out before; -1: none (not memoised). */
static int hint_id(const pd_memo *m, const_dnnl_primitive_desc_t hint)
{
    for (int i = m->given_lost ? -1 : m->n_given - 1; i >= 0; i--)
        if (m->given[i].pd == hint)
            return m->given[i].id;
    return -1;
}

/* Four interleaved multiply-xor lanes over 8-byte words: a key is some
 * kilobytes of descriptors. */
static uint64_t hash_of(const unsigned char *key, size_t len)
{
    uint64_t h[4] = { 1, 2, 3, 4 }, w;
    size_t i = 0;
    for (; i + 4 * sizeof w <= len; i += 4 * sizeof w)
        for (int l = 0; l < 4; l++) {
            memcpy(&w, key + i + (size_t)l * sizeof w, sizeof w);
            h[l] = (h[l] ^ w) * 0x9e3779b97f4a7c15u;
        }
    for (; i < len; i++)
        h[0] = (h[0] ^ key[i]) * 0x9e3779b97f4a7c15u;
    return (h[0] ^ (h[1] >> 7) ^ (h[2] << 11) ^ (h[3] >> 17)) + len;
}

static int find(const pd_memo *m, uint64_t hash, const unsigned char *key, size_t len)
{
    for (int i = 0; i < m->n; i++)
        if (m->e[i].hash == hash && m->e[i].len == len && memcmp(m->e[i].key, key, len) == 0)
            return i;
    return -1;
}

enum { KEY_MAX = 16384 };

static size_t put(unsigned char *k, size_t at, const void *p, size_t n)
{
    memcpy(k + at, p, n);
    return at + n;
}

/* The key into k (KEY_MAX bytes), its length: an operation's (form 0):
 * its bytes, the variant's (the memory descriptors it has only), the
 * hint's entry; 0: too long. */
static size_t make_key(unsigned char *k, const void *op_desc, size_t op, const st_pd_variant *v,
                       int hint)
{
    const int form = 0;
    if (sizeof form + op + sizeof *v + sizeof hint > KEY_MAX)
        return 0;
    const int flags[4] = { v->relu, v->has_add0, v->has_add1, v->has_mul };
    size_t n = put(k, 0, &form, sizeof form);
    n = put(k, n, op_desc, op);
    n = put(k, n, &v->scale, sizeof v->scale);
    n = put(k, n, flags, sizeof flags);
    if (v->has_add0)
        n = put(k, n, &v->add0, sizeof v->add0);
    if (v->has_add1)
        n = put(k, n, &v->add1, sizeof v->add1);
    if (v->has_mul)
        n = put(k, n, &v->mul, sizeof v->mul);
    return put(k, n, &hint, sizeof hint);
}

/* What to create on a miss: an operation's descriptor, or (op_desc NULL)
 * a reorder's from src to dst. */
typedef struct pd_request {
    const void *op_desc;
    const dnnl_memory_desc_t *src, *dst;
    const_dnnl_primitive_attr_t attr;
    dnnl_engine_t engine;
    const_dnnl_primitive_desc_t hint;
} pd_request;

static dnnl_status_t create_pd(const pd_request *q, dnnl_primitive_desc_t *pd)
{
    if (q->op_desc)
        return dnnl_primitive_desc_create(pd, q->op_desc, q->attr, q->engine, q->hint);
    return dnnl_reorder_primitive_desc_create(pd, q->src, q->engine, q->dst, q->engine, q->attr);
}

/* *pd: a clone of key's entry, or created (and its clone kept); *id: the
 * entry (-1: none). len 0: not memoised. */
static st_status memo_get(pd_memo *m, const unsigned char *key, size_t len, const pd_request *q,
                          dnnl_primitive_desc_t *pd, int *id, const char *what)
{
    *id = -1;
    const uint64_t hash = len ? hash_of(key, len) : 0;
    pthread_mutex_lock(&m->lock);
    const int at = len ? find(m, hash, key, len) : -1;
    /* an entry stays until the space goes: cloned outside the lock */
    const_dnnl_primitive_desc_t first = at >= 0 ? m->e[at].pd : NULL;
    pthread_mutex_unlock(&m->lock);
    if (at >= 0) {
        *id = at;
        ST_DNNL(dnnl_primitive_desc_clone(pd, first), what);
        return ST_OK;
    }
    /* created outside the lock: the searches of the threads overlap */
    ST_DNNL(create_pd(q, pd), what);
    unsigned char *kept = len ? malloc(len) : NULL;
    if (!kept)
        return ST_OK;
    memcpy(kept, key, len);
    pthread_mutex_lock(&m->lock);
    int again = find(m, hash, key, len);   /* another thread's, made meanwhile */
    if (again < 0 && m->n == m->cap) {
        int cap = m->cap ? 2 * m->cap : 64;
        memo_entry *e = realloc(m->e, (size_t)cap * sizeof *e);
        if (e) {
            m->e = e;
            m->cap = cap;
        }
    }
    dnnl_primitive_desc_t keep = NULL;
    if (again < 0 && m->n < m->cap && dnnl_primitive_desc_clone(&keep, *pd) == dnnl_success) {
        m->e[m->n] = (memo_entry){ hash, kept, len, keep };
        again = m->n++;
        kept = NULL;
    }
    pthread_mutex_unlock(&m->lock);
    free(kept);
    *id = again;
    return ST_OK;
}

st_status st_pd_memo_create(const st_arena *arena, dnnl_primitive_desc_t *pd, const void *op_desc,
                            const st_pd_variant *variant, const_dnnl_primitive_attr_t attr,
                            dnnl_engine_t engine, const_dnnl_primitive_desc_t hint, int *id,
                            const char *what)
{
    *id = -1;
    const pd_request q = { op_desc, NULL, NULL, attr, engine, hint };
    pd_memo *m = memo_of(arena);
    const size_t op = m ? op_size(op_desc) : 0;
    if (!op) {
        ST_DNNL(create_pd(&q, pd), what);
        return ST_OK;
    }
    pthread_mutex_lock(&m->lock);
    const int h = hint ? hint_id(m, hint) : -2;
    pthread_mutex_unlock(&m->lock);
    unsigned char key[KEY_MAX];
    const size_t len = h != -1 ? make_key(key, op_desc, op, variant, h) : 0;
    return memo_get(m, key, len, &q, pd, id, what);
}

st_status st_pd_memo_reorder(const st_arena *arena, dnnl_primitive_desc_t *pd,
                             const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *dst,
                             const_dnnl_primitive_attr_t attr, dnnl_engine_t engine,
                             const char *what)
{
    const pd_request q = { NULL, src, dst, attr, engine, NULL };
    pd_memo *m = memo_of(arena);
    if (!m) {
        ST_DNNL(create_pd(&q, pd), what);
        return ST_OK;
    }
    const int form = 1;   /* the key: the form, the two descriptors */
    unsigned char key[sizeof form + 2 * sizeof *src];
    size_t n = put(key, 0, &form, sizeof form);
    n = put(key, n, src, sizeof *src);
    n = put(key, n, dst, sizeof *dst);
    int id;
    return memo_get(m, key, n, &q, pd, &id, what);
}

void st_pd_memo_given(const st_arena *arena, const_dnnl_primitive_desc_t pd, int id)
{
    /* also when not memoised (-1): a freed descriptor's address may be
     * given again, and must not name the entry of the one before */
    pd_memo *m = memo_of(arena);
    if (!m)
        return;
    pthread_mutex_lock(&m->lock);
    if (m->n_given == m->cap_given) {
        int cap = m->cap_given ? 2 * m->cap_given : 256;
        memo_given *g = realloc(m->given, (size_t)cap * sizeof *g);
        if (g) {
            m->given = g;
            m->cap_given = cap;
        }
    }
    if (m->n_given < m->cap_given)
        m->given[m->n_given++] = (memo_given){ pd, id };
    else   /* its address could name an older descriptor's entry */
        m->given_lost = 1;
    pthread_mutex_unlock(&m->lock);
}

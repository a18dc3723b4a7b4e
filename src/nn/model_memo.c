/*
 * nn/model_memo.c — a sizing run's models, one build per class
 * (model_memo.h).
 *
 * Why a shell's accounting is exact: a build's arena calls (kinds, sizes,
 * order) follow from its key alone, never from where its blocks land, so
 * asking another arena for the prototype's logged blocks changes that
 * arena as the build would have.  A pointer of the prototype that lies in
 * none of its logged blocks nor its storage fails the shell, and the
 * model is built instead.
 */
#define _GNU_SOURCE /* qsort_r */
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/arena_impl.h"
#include "core/error.h"
#include "nn/blocked_store.h"
#include "nn/model_memo.h"

/* What a build follows from, besides the subnetwork's lists (compared by
 * content); zero-filled, then set, so that it compares as bytes. */
typedef struct memo_key {
    st_model_config cfg;             /* the subnetwork's list pointers NULL */
    st_model_declare_fn declare;
    int lo, hi, batch, threads;
    int params, bf16, blocked;       /* storage given, with bf16 copies, a blocked store */
    size_t count;                    /* the storage's parameters */
    int lists;                       /* bits: groups, group_grads, width_count, width_kept */
} memo_key;

typedef struct memo_class {
    memo_key key;
    int *groups, *width_count, *width_kept;   /* the lists, copied */
    uint8_t *group_grads;
    int n_group_grads, n_width, n_kept;
    int lists_known;                 /* the lists above are copied */
    int state;                       /* 0: being built, 1: ready, -1: failed */
    st_arena arena;                  /* the prototype's blocks */
    st_arena_log log;
    int *by_address;                 /* log entries by block address */
    st_model_storage storage;        /* the prototype's */
    st_model *proto;
} memo_class;

typedef struct model_memo {
    int off;                         /* SUBTRAIN_SIZING=build-all: every model built */
    pthread_mutex_t lock;
    pthread_cond_t built;
    memo_class **c;
    int n, cap;
} model_memo;

static void free_class(memo_class *c)
{
    if (!c)
        return;
    st_model_destroy(c->proto);
    st_arena_release(&c->arena);
    st_arena_log_free(&c->log);
    free(c->by_address);
    free(c->groups);
    free(c->width_count);
    free(c->width_kept);
    free(c->group_grads);
    free(c);
}

static void *memo_make(void)
{
    model_memo *m = calloc(1, sizeof *m);
    if (m) {
        /* for the tests that show a shell's figures are a build's */
        const char *e = getenv("SUBTRAIN_SIZING");
        m->off = e && strcmp(e, "build-all") == 0;
        pthread_mutex_init(&m->lock, NULL);
        pthread_cond_init(&m->built, NULL);
    }
    return m;
}

static void memo_drop(void *p)
{
    model_memo *m = p;
    for (int i = 0; i < m->n; i++)
        free_class(m->c[i]);
    free(m->c);
    pthread_cond_destroy(&m->built);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

static void make_key(memo_key *k, const st_model_config *cfg, st_model_declare_fn declare, int lo,
                     int hi, int batch, const st_model_storage *storage)
{
    memset(k, 0, sizeof *k);
    memcpy(&k->cfg, cfg, sizeof *cfg);
    const st_model_subnet *u = &cfg->subnet;
    k->lists = (u->groups != NULL) | (u->group_grads != NULL) << 1 |
               (u->width_count != NULL) << 2 | (u->width_kept != NULL) << 3;
    k->cfg.subnet.groups = NULL;
    k->cfg.subnet.group_grads = NULL;
    k->cfg.subnet.width_count = NULL;
    k->cfg.subnet.width_kept = NULL;
    k->declare = declare;
    k->lo = lo;
    k->hi = hi;
    k->batch = batch;
    k->threads = omp_get_max_threads();
    k->params = storage && storage->params;
    k->bf16 = storage && storage->bf16;
    k->blocked = storage && storage->blocked;
    k->count = storage ? storage->count : 0;
}

/* Whether cfg's lists are c's (their lengths are c's: the keys, equal,
 * declare the same full model). */
static int same_lists(const memo_class *c, const st_model_config *cfg)
{
    const st_model_subnet *u = &cfg->subnet;
    const size_t ni = sizeof(int);
    return (!u->groups || memcmp(u->groups, c->groups, (size_t)u->n_groups * ni) == 0) &&
           (!u->group_grads || memcmp(u->group_grads, c->group_grads,
                                      (size_t)c->n_group_grads) == 0) &&
           (!u->width_count || memcmp(u->width_count, c->width_count,
                                      (size_t)c->n_width * ni) == 0) &&
           (!u->width_kept || memcmp(u->width_kept, c->width_kept,
                                     (size_t)c->n_kept * ni) == 0);
}

static void *copy_of(const void *p, size_t bytes, int *failed)
{
    if (!p)
        return NULL;
    void *q = malloc(bytes ? bytes : 1);
    if (!q)
        *failed = 1;
    else
        memcpy(q, p, bytes);
    return q;
}

static int cmp_address(const void *a, const void *b, void *log)
{
    const st_arena_logged *e = ((const st_arena_log *)log)->e;
    const char *x = e[*(const int *)a].p, *y = e[*(const int *)b].p;
    return (x > y) - (x < y);
}

/* Where a pointer of the prototype lies in a shell: the same offset in
 * the shell's block of the same log entry, or in its storage. */
typedef struct rebase {
    const memo_class *c;
    char *const *blocks;
    const st_model_storage *storage;
    int lost;                        /* a pointer in none of them */
} rebase;

static void *moved(rebase *r, const void *p)
{
    const char *q = p;
    const memo_class *c = r->c;
    if (!q)
        return NULL;
    const st_model_storage *ps = &c->storage;
    if (ps->params && q >= (const char *)ps->params && q < (const char *)(ps->params + ps->count))
        return (char *)r->storage->params + (q - (const char *)ps->params);
    if (ps->bf16 && q >= (const char *)ps->bf16 && q < (const char *)(ps->bf16 + ps->count))
        return (char *)r->storage->bf16 + (q - (const char *)ps->bf16);
    void *b = st_blocked_store_moved(ps->blocked, r->storage->blocked, q);
    if (b)
        return b;
    int lo = 0, hi = c->log.n - 1;
    while (lo <= hi) {
        const int mid = (lo + hi) / 2;
        const st_arena_logged *e = &c->log.e[c->by_address[mid]];
        if (q < e->p)
            hi = mid - 1;
        else if (q >= e->p + e->bytes)
            lo = mid + 1;
        else
            return r->blocks[c->by_address[mid]] + (q - e->p);
    }
    r->lost = 1;
    return NULL;
}

/* The prototype's buffers that a run writes, placed in m (a copy of the
 * prototype with arrays of its own for tensors and copies); the build's
 * tables stay the prototype's. */
static void place(rebase *r, st_model *m)
{
    const st_model *p = r->c->proto;
    m->params = moved(r, p->params);
    m->grads = moved(r, p->grads);
    m->state = moved(r, p->state);
    m->norm_scratch = moved(r, p->norm_scratch);
    m->grad_scratch = moved(r, p->grad_scratch);
    m->labels = moved(r, p->labels);
    m->logp = moved(r, p->logp);
    for (int t = 0; t < p->n_tensors; t++) {
        m->tensors[t] = p->tensors[t];
        m->tensors[t].data = moved(r, p->tensors[t].data);
    }
    for (int i = 0; i < p->n_copies; i++) {
        m->copies[i] = p->copies[i];
        m->copies[i].bf16 = moved(r, p->copies[i].bf16);
    }
    for (int i = 0; i < p->n_blocked; i++) {
        m->blocked[i] = p->blocked[i];
        for (int k = 0; k < p->blocked[i].n; k++)
            m->blocked[i].copy[k].bf16 = moved(r, p->blocked[i].copy[k].bf16);
    }
    for (int g = 0; g < ST_ARENA_REGIONS; g++)
        for (int k = 0; k < ST_MEM_KIND_COUNT; k++)
            m->lanes.base[g][k] = moved(r, p->lanes.base[g][k]);
}

/* A copy of c's prototype with arrays of its own for what place() sets;
 * NULL out of memory. */
static st_model *shell_of(const memo_class *c, st_arena *arena)
{
    const st_model *p = c->proto;
    st_model *m = malloc(sizeof *m);
    if (!m)
        return NULL;
    *m = *p;
    m->proto = p;
    m->arena = arena;
    m->tensors = malloc((size_t)(p->n_tensors > 0 ? p->n_tensors : 1) * sizeof *m->tensors);
    m->copies = p->n_copies ? malloc((size_t)p->n_copies * sizeof *m->copies) : NULL;
    m->blocked = p->n_blocked ? malloc((size_t)p->n_blocked * sizeof *m->blocked) : NULL;
    if (!m->tensors || (p->n_copies && !m->copies) || (p->n_blocked && !m->blocked)) {
        st_model_memo_free_shell(m);
        return NULL;
    }
    return m;
}

/* Whether every pointer place() moves lies in the prototype's blocks or
 * storage (placed onto themselves). */
static int placeable(const memo_class *c)
{
    char **own = malloc((size_t)(c->log.n > 0 ? c->log.n : 1) * sizeof *own);
    st_model *m = shell_of(c, NULL);
    int ok = own && m;
    if (ok) {
        for (int i = 0; i < c->log.n; i++)
            own[i] = c->log.e[i].p;
        rebase r = { c, own, &c->storage, 0 };
        place(&r, m);
        ok = !r.lost;
    }
    free(own);
    if (m)
        st_model_memo_free_shell(m);
    return ok;
}

/* cfg's lists into c, of the lengths of a full model of G groups and U
 * width layers; 0, or -1 out of memory. */
static int copy_lists(memo_class *c, const st_model_config *cfg, int G, int U)
{
    const st_model_subnet *u = &cfg->subnet;
    int failed = 0;
    c->n_group_grads = G;
    c->n_width = U;
    c->n_kept = 0;
    for (int l = 0; u->width_count && l < U; l++)
        c->n_kept += u->width_count[l];
    const size_t ni = sizeof(int);
    c->groups = copy_of(u->groups, (size_t)u->n_groups * ni, &failed);
    c->group_grads = copy_of(u->group_grads, (size_t)G, &failed);
    c->width_count = copy_of(u->width_count, (size_t)U * ni, &failed);
    c->width_kept = copy_of(u->width_kept, (size_t)c->n_kept * ni, &failed);
    c->lists_known = !failed;
    return failed ? -1 : 0;
}

/* A built prototype's class made ready: its lists (lengths from the
 * prototype), its log's entries by address; 0, or -1 (out of memory, a
 * pointer not placed). */
static int complete_class(memo_class *c, const st_model_config *cfg)
{
    if (c->log.failed)
        return -1;
    if (!c->lists_known && copy_lists(c, cfg, c->proto->n_groups, c->proto->n_width) != 0)
        return -1;
    c->by_address = malloc((size_t)(c->log.n > 0 ? c->log.n : 1) * sizeof *c->by_address);
    if (!c->by_address)
        return -1;
    for (int i = 0; i < c->log.n; i++)
        c->by_address[i] = i;
    qsort_r(c->by_address, (size_t)c->log.n, sizeof *c->by_address, cmp_address, &c->log);
    return placeable(c) ? 0 : -1;
}

/* A shell of c's prototype (placeable) over arena, which gets the
 * prototype's blocks, and storage. */
static st_status make_shell(const memo_class *c, st_arena *arena,
                            const st_model_storage *storage, st_model **out)
{
    *out = NULL;
    char **blocks = malloc((size_t)(c->log.n > 0 ? c->log.n : 1) * sizeof *blocks);
    st_model *m = shell_of(c, arena);
    st_status s = blocks && m ? st_arena_replay(arena, &c->log, blocks)
                              : st_fail(ST_ERR_NOMEM, "out of memory creating a model");
    if (s == ST_OK) {
        static const st_model_storage none = { NULL, NULL, 0, 0, NULL };
        rebase r = { c, blocks, storage ? storage : &none, 0 };
        m->storage = storage ? *storage : none;
        place(&r, m);
        if (!r.lost) {
            *out = m;
        } else {
            st_model_memo_free_shell(m);
            s = st_fail(ST_ERR_NOMEM, "out of memory placing a model's blocked weight copies");
        }
    } else if (m) {
        st_model_memo_free_shell(m);
    }
    free(blocks);
    return s;
}

void st_model_memo_free_shell(st_model *m)
{
    free(m->tensors);
    free(m->copies);
    free(m->blocked);
    free(m);
}

/* The class of key k and cfg's lists, found (ready or failed) or added
 * for the caller to build (*mine = 1); NULL out of memory.  Under the
 * lock.  A class's lists are compared once their lengths are known (a
 * class of the key was built: the key declares the full model); until
 * then the asker waits.  A class that failed before its lists were known
 * is every such asker's, who builds for itself. */
static memo_class *class_of(model_memo *mm, const memo_key *k, const st_model_config *cfg,
                            int *mine)
{
    *mine = 0;
    for (;;) {
        const memo_class *sized = NULL;
        memo_class *found = NULL;
        int unknown = 0;
        for (int i = 0; i < mm->n && !found; i++) {
            memo_class *c = mm->c[i];
            if (memcmp(&c->key, k, sizeof *k) != 0)
                continue;
            if (c->lists_known) {
                sized = c;
                if (same_lists(c, cfg))
                    found = c;
            } else if (c->state == 0) {
                unknown = 1;
            } else {
                found = c;
            }
        }
        if ((found && found->state == 0) || (!found && unknown && !sized)) {
            pthread_cond_wait(&mm->built, &mm->lock);
            continue;
        }
        if (found)
            return found;
        if (mm->n == mm->cap) {
            const int cap = mm->cap ? 2 * mm->cap : 16;
            memo_class **nc = realloc(mm->c, (size_t)cap * sizeof *nc);
            if (!nc)
                return NULL;
            mm->c = nc;
            mm->cap = cap;
        }
        memo_class *c = calloc(1, sizeof *c);
        if (!c)
            return NULL;
        if (sized && copy_lists(c, cfg, sized->n_group_grads, sized->n_width) != 0) {
            free_class(c);
            return NULL;
        }
        c->key = *k;
        mm->c[mm->n++] = c;
        *mine = 1;
        return c;
    }
}

st_status st_model_memo_build(st_model_build_fn build, const st_model_config *cfg,
                              st_model_declare_fn declare, int lo, int hi, int batch,
                              st_arena *arena, const st_model_storage *storage, st_model **out)
{
    *out = NULL;
    st_sizing_space *sp = arena ? st_arena_sizing_space(arena) : NULL;
    model_memo *mm = sp ? st_sizing_space_memo(sp, memo_make, memo_drop) : NULL;
    /* a range of layers (hi >= 0) is finished by its caller, who adds its
     * loss and workspace through the model's context: a shell's context is
     * its prototype's (arena, primitives), so such a model is built */
    if (!mm || mm->off || arena->lanes || arena->log || hi >= 0)
        return build(cfg, declare, lo, hi, batch, arena, storage, out);
    memo_key k;
    make_key(&k, cfg, declare, lo, hi, batch, storage);
    pthread_mutex_lock(&mm->lock);
    int mine;
    memo_class *c = class_of(mm, &k, cfg, &mine);
    pthread_mutex_unlock(&mm->lock);
    if (c && mine) {
        /* the prototype, outside the lock: other classes build meanwhile */
        st_arena_init(&c->arena, "model class", &arena->backend, 0);
        c->arena.log = &c->log;
        st_status s = build(cfg, declare, lo, hi, batch, &c->arena, storage, &c->proto);
        c->arena.log = NULL;
        if (s == ST_OK)
            c->storage = storage ? *storage : (st_model_storage){ NULL, NULL, 0, 0, NULL };
        pthread_mutex_lock(&mm->lock);
        c->state = s == ST_OK && complete_class(c, cfg) == 0 ? 1 : -1;
        pthread_cond_broadcast(&mm->built);
        pthread_mutex_unlock(&mm->lock);
    }
    if (c && c->state == 1)
        return make_shell(c, arena, storage, out);
    /* out of memory for the memo, a failed prototype, a pointer it could
     * not place: the build itself (its own message if it fails) */
    return build(cfg, declare, lo, hi, batch, arena, storage, out);
}

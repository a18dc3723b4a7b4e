/*
 * comm/comm.c — the public reduction engine: a thin dispatcher over the
 * backends of comm/backend.h.
 *
 * An st_comm is its backend's ops table and state.  Every public function
 * checks what is the same for every backend (an engine is given, the
 * worker index is in range, attach's ranges are sound; a bad index also
 * aborts the engine, so that the other workers do not wait for this one),
 * then makes one indirect call.  The backends never see NULL engines or
 * out-of-range workers, and the step's path gains one call and no
 * allocation, lock or atomic.
 *
 * The files, one concern each:
 *
 *   comm.c      this dispatcher and the table of backends
 *   backend.h   what a backend provides (the ops table)
 *   shared.c    the shared-buffer backend: attach, collectives, barrier
 *   mpi.c       the MPI backend: ranks x workers, hierarchical (with MPI)
 *   world.c     the ranks of the run: MPI's start and the loop's collectives
 *   sizing_world.c  a described job's ranks in one process (sizing runs)
 *   plan.h/.c   shards, domains, segments, work lists, byte accounting
 *   kernels.h/.c  the work items and the sum / divide / copy loops
 *   barrier.h   the spin barrier on C11 atomics
 *   describe.c  st_comm_describe
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/comm.h>

#include "comm/backend.h"
#include "comm/plan.h"
#include "comm/sizing_world.h"
#include "core/enum_table.h"
#include "core/error.h"

struct st_comm {
    const st_comm_backend_ops *ops;
    st_comm_backend *impl;
    st_comm_backend_kind kind;
    int n_workers;
    size_t n_params;
};

/* ------------------------------------------------------------ backends */

/* Every backend the library knows, built in or not: adding one is its file,
 * its name and its entry here (ops NULL and `absent` say why when it is not
 * built).  Names, printing and parsing: one table (core/enum_table.h). */
static const st_enum_entry backend_names[] = {
    { "shared", ST_COMM_BACKEND_SHARED },
    { "mpi", ST_COMM_BACKEND_MPI },
};
static const st_enum_table backend_table = ST_ENUM_TABLE("reduction backend", backend_names);

static const struct backend_entry {
    st_comm_backend_kind kind;
    const st_comm_backend_ops *ops;
    const char *absent;
} backends[] = {
    { ST_COMM_BACKEND_SHARED, &st_comm_shared_ops, NULL },
#ifdef HAVE_MPI
    { ST_COMM_BACKEND_MPI, &st_comm_mpi_ops, NULL },
#else
    { ST_COMM_BACKEND_MPI, NULL, "not built into this library (configure found no MPI: "
                                 "apt-get install libopenmpi-dev, then configure --with-mpi)" },
#endif
};

#define N_BACKENDS (sizeof backends / sizeof backends[0])

static const struct backend_entry *backend_entry(st_comm_backend_kind kind)
{
    for (size_t i = 0; i < N_BACKENDS; i++)
        if (backends[i].kind == kind)
            return &backends[i];
    return NULL;
}

const char *st_comm_backend_name(st_comm_backend_kind kind)
{
    return st_enum_name(&backend_table, (int)kind);
}

st_status st_comm_backend_parse(const char *name, st_comm_backend_kind *out)
{
    int v;
    ST_TRY(st_enum_parse(&backend_table, name, &v));
    *out = (st_comm_backend_kind)v;
    return ST_OK;
}

/* The ops of a backend that is built in, else ST_ERR_INVALID saying why. */
static st_status backend_ops(st_comm_backend_kind kind, const st_comm_backend_ops **ops)
{
    const struct backend_entry *e = backend_entry(kind);
    if (!e) {
        char known[128] = "";
        for (size_t i = 0; i < N_BACKENDS; i++)
            if (backends[i].ops)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s",
                         known[0] ? ", " : "", st_comm_backend_name(backends[i].kind));
        return st_fail(ST_ERR_INVALID, "unknown reduction backend %d (available: %s)",
                       (int)kind, known);
    }
    if (!e->ops)
        return st_fail(ST_ERR_INVALID, "reduction backend '%s' is %s", st_comm_backend_name(kind),
                       e->absent);
    *ops = e->ops;
    return ST_OK;
}

/* ------------------------------------------------------------ create */

/* An engine of cfg's backend, or (world) the MPI backend's layout for
 * rank `rank` of a described job. */
static st_status create_engine(const st_comm_config *cfg, st_comm_world *world, int rank,
                               st_comm **out)
{
    *out = NULL;
    if (!cfg)
        return st_fail(ST_ERR_INVALID, "st_comm_create: no configuration");
    const st_comm_backend_ops *ops = NULL;
    ST_TRY(backend_ops(cfg->backend, &ops));
    ST_TRY(st_comm_check_size(cfg->n_workers, cfg->n_params));
    int n_domains;
    ST_TRY(st_comm_map_domains(cfg->n_workers, cfg->domain_of, NULL, NULL, &n_domains));
    if (cfg->payload != ST_COMM_PAYLOAD_FP32 && cfg->payload != ST_COMM_PAYLOAD_BF16)
        return st_fail(ST_ERR_INVALID, "unknown reduction payload %d (fp32 or bf16)",
                       (int)cfg->payload);
    if (cfg->bf16_at != ST_COMM_BF16_BUFFER && cfg->bf16_at != ST_COMM_BF16_ON_READ)
        return st_fail(ST_ERR_INVALID, "unknown place of the bf16 rounding %d (buffer or on "
                       "read)", (int)cfg->bf16_at);
    if (cfg->shared_params && cfg->roles == ST_COMM_REDUCE)
        return st_fail(ST_ERR_INVALID, "shared parameters are the masters the all-gather "
                       "writes: a reduce-only engine has none");
    /* (its all-gather reads an owner's bf16 shard in one domain only) */
    if (cfg->n_bf16_master > 0 &&
        (cfg->backend != ST_COMM_BACKEND_SHARED || n_domains > 1 || cfg->copies_master ||
         cfg->shared_params || !cfg->bf16_master || !(cfg->roles == 0 ||
                                                     (cfg->roles & ST_COMM_GATHER))))
        return st_fail(ST_ERR_INVALID, "bf16 master shards need the shared backend on one NUMA "
                       "domain, an engine that gathers, and neither shared parameters nor "
                       "copies_master (this one: %s backend, %d domains)",
                       st_comm_backend_name(cfg->backend), n_domains);
    for (int i = 0; i < cfg->n_bf16_master; i++)
        if (cfg->bf16_master[i].begin >= cfg->bf16_master[i].end ||
            cfg->bf16_master[i].end > cfg->n_params ||
            (i > 0 && cfg->bf16_master[i].begin < cfg->bf16_master[i - 1].end))
            return st_fail(ST_ERR_INVALID, "bf16 master range %d [%zu, %zu) is empty, out of "
                           "the vector or out of order", i, cfg->bf16_master[i].begin,
                           cfg->bf16_master[i].end);
    st_comm *c = malloc(sizeof *c);
    if (!c)
        return st_fail(ST_ERR_NOMEM, "out of memory creating the reduction engine");
    *c = (st_comm){ ops, NULL, cfg->backend, cfg->n_workers, cfg->n_params };
    /* a described job's engine is the MPI backend's, which backend_ops
     * has found built in */
#ifdef HAVE_MPI
    st_status s = world ? st_comm_mpi_create_sizing(cfg, world, rank, &c->impl)
                        : ops->create(cfg, &c->impl);
#else
    (void)world;
    (void)rank;
    st_status s = ops->create(cfg, &c->impl);
#endif
    if (s != ST_OK) {
        free(c);
        return s;
    }
    *out = c;
    return ST_OK;
}

st_status st_comm_create(const st_comm_config *cfg, st_comm **out)
{
    return create_engine(cfg, NULL, 0, out);
}

st_status st_comm_create_sizing(const st_comm_config *cfg, st_comm_world *w, int rank,
                                st_comm **out)
{
    *out = NULL;
    if (!cfg || cfg->backend != ST_COMM_BACKEND_MPI || !w || rank < 0 ||
        rank >= st_comm_world_size(w))
        return st_fail(ST_ERR_INVALID, "st_comm_create_sizing: the MPI backend of a rank of "
                       "the described job");
    return create_engine(cfg, w, rank, out);
}

void st_comm_destroy(st_comm *c)
{
    if (!c)
        return;
    c->ops->destroy(c->impl);
    free(c);
}

st_comm_backend_kind st_comm_backend_of(const st_comm *c)
{
    return c ? c->kind : ST_COMM_BACKEND_SHARED;
}

void st_comm_set_shard_output(st_comm *c, int w, float *out)
{
    if (c && w >= 0 && w < c->n_workers)
        c->ops->set_shard_output(c->impl, w, out);
}

void st_comm_set_param_copies(st_comm *c, int w, const st_param_copy *copies, int n)
{
    if (c && w >= 0 && w < c->n_workers && c->ops->set_param_copies)
        c->ops->set_param_copies(c->impl, w, copies, n);
}

int st_comm_gathers_copies(const st_comm *c, int w)
{
    return c && w >= 0 && w < c->n_workers && c->ops->gathers_copies &&
           c->ops->gathers_copies(c->impl, w);
}

void st_comm_set_param_blocked(st_comm *c, int w, const st_param_blocked *blocked, int n)
{
    if (c && w >= 0 && w < c->n_workers && c->ops->set_param_blocked)
        c->ops->set_param_blocked(c->impl, w, blocked, n);
}

int st_comm_gathers_blocked(const st_comm *c, int w)
{
    return c && w >= 0 && w < c->n_workers && c->ops->gathers_blocked &&
           c->ops->gathers_blocked(c->impl, w);
}

void st_comm_reset(st_comm *c)
{
    if (c)
        c->ops->reset(c->impl);
}

/* ------------------------------------------------------------ checks */

/* The engine and w, for `what`; an out-of-range worker aborts the engine
 * (the others would otherwise wait for it at the next barrier). */
static st_status check_worker(st_comm *c, int w, const char *what)
{
    if (!c)
        return st_fail(ST_ERR_INVALID, "%s: no reduction engine", what);
    if (w < 0 || w >= c->n_workers) {
        c->ops->abort(c->impl);
        return st_fail(ST_ERR_INVALID, "%s: worker %d is out of range [0, %d)", what, w,
                       c->n_workers);
    }
    return ST_OK;
}

static int valid_worker(const st_comm *c, int w)
{
    return c && w >= 0 && w < c->n_workers;
}

/* ------------------------------------------------------------ attach */

st_status st_comm_attach(st_comm *c, int w, st_arena *arena, float *grads, float *params,
                         const st_range *held, int n_held)
{
    return st_comm_attach_compact(c, w, arena, grads, params, held, NULL, n_held);
}

st_status st_comm_attach_compact(st_comm *c, int w, st_arena *arena, float *grads,
                                 float *params, const st_range *held, const size_t *local,
                                 int n_held)
{
    ST_TRY(check_worker(c, w, "st_comm_attach"));
    st_status s = st_comm_check_held(c->n_params, w, arena, grads, params, held, n_held);
    if (s != ST_OK) {
        c->ops->abort(c->impl);
        return s;
    }
    return c->ops->attach(c->impl, w, arena, grads, params, held, local, n_held);
}

/* ------------------------------------------------------------ the step */

st_status st_comm_reduce_scatter(st_comm *c, int w)
{
    ST_TRY(check_worker(c, w, "reduce-scatter"));
    return c->ops->reduce_scatter(c->impl, w);
}

st_status st_comm_reduce_ready(st_comm *c, int w, size_t from, st_range *done)
{
    st_range none = { 0, 0 };
    if (done)
        *done = none;
    ST_TRY(check_worker(c, w, "reduce-ready"));
    return c->ops->reduce_ready ? c->ops->reduce_ready(c->impl, w, from, done ? done : &none)
                                : ST_OK;
}

st_status st_comm_all_gather(st_comm *c, int w)
{
    ST_TRY(check_worker(c, w, "all-gather"));
    return c->ops->all_gather(c->impl, w);
}

st_status st_comm_barrier(st_comm *c, int w)
{
    ST_TRY(check_worker(c, w, "barrier"));
    return c->ops->barrier(c->impl, w);
}

void st_comm_abort(st_comm *c)
{
    if (c)
        c->ops->abort(c->impl);
}

/* ------------------------------------------------------------ queries */

st_range st_comm_shard(const st_comm *c, int w)
{
    st_range r = { 0, 0 };
    return valid_worker(c, w) ? c->ops->shard(c->impl, w) : r;
}

float *st_comm_shard_grads(st_comm *c, int w)
{
    return valid_worker(c, w) ? c->ops->shard_grads(c->impl, w) : NULL;
}

float *st_comm_shard_params(st_comm *c, int w)
{
    return valid_worker(c, w) ? c->ops->shard_params(c->impl, w) : NULL;
}

uint16_t *st_comm_shard_params16(st_comm *c, int w)
{
    return valid_worker(c, w) && c->ops->shard_params16 ? c->ops->shard_params16(c->impl, w)
                                                        : NULL;
}

st_comm_bytes st_comm_bytes_per_step(const st_comm *c, int w)
{
    st_comm_bytes none = { 0, 0, 0, 0, 0 };
    return valid_worker(c, w) ? c->ops->bytes_per_step(c->impl, w) : none;
}

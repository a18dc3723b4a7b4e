/*
 * subtrain/comm.h — the reduction engine: workers' gradients are averaged
 * over their holders and the updated weights handed back, laid out like a
 * distributed all-reduce (reduce-scatter to shard owners, owner update,
 * all-gather), behind a choice of backend.
 *
 * One step, for N workers and a flat parameter vector of P floats split
 * into N contiguous shards (shard w owned by worker w):
 *
 *   reduce-scatter  the owner of each shard sums the gradients of the
 *                   workers that hold each element, in a fixed order
 *                   (worker 0, 1, ...), and divides by the holder count;
 *   update          the owner applies the optimizer to its shard of the
 *                   master weights and of the optimizer state (ZeRO-1);
 *   all-gather      every worker copies the updated values of the elements
 *                   it holds into its own replica; with shared parameters
 *                   (st_comm_config.shared_params: one vector a NUMA
 *                   domain, its owners' masters in it) each domain's vector
 *                   gets the other domains' shards, and on one domain
 *                   nothing is copied.
 *
 * The reduce-scatter may begin during the backward pass, as the workers
 * say which of their gradient is final (st_comm_reduce_ready).
 *
 * Backends (st_comm_config.backend).  ST_COMM_BACKEND_MPI spans the ranks
 * of an MPI job (all of them, or a consecutive range): n_workers is then
 * each rank's own count (ranks may differ), the global workers are
 * numbered rank by rank — worker w of rank r is global worker
 * n_0 + ... + n_{r-1} + w and owns that global shard — and the ranks
 * exchange owner shards with MPI (doc/reduction.md).  ST_COMM_BACKEND_SHARED,
 * the default, is one process: the workers are threads and
 * meet in NUMA-aware shared buffers, each shard's buffers on its owner's
 * NUMA node.  With more than one NUMA domain both collectives are
 * two-level: the workers of a domain first sum their part of every remote
 * shard into one partial on their own node, so that the owner reads one
 * buffer per remote domain, not one per remote worker; and the all-gather
 * brings each remote shard into a domain once, then copies it locally.
 * Synchronisation: C11 atomics only — a generation-counting barrier on
 * padded counters, spin-waiting (workers are pinned, one per core).  No
 * lock and no allocation after st_comm_attach().  Summation order is
 * fixed, so the result is bitwise the same from run to run whatever the
 * thread timing.
 *
 * Every function below that takes an engine goes through its backend;
 * st_comm_describe prints the shared-buffer plan, st_comm_ring_bytes is a
 * formula.
 */
#ifndef SUBTRAIN_COMM_H
#define SUBTRAIN_COMM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <subtrain/arena.h>
#include <subtrain/params.h>
#include <subtrain/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Which implementation of the collectives an engine uses.  0 is the
 * default, so a configuration that does not name one gets the shared
 * buffers. */
typedef enum st_comm_backend_kind {
    ST_COMM_BACKEND_SHARED = 0,   /* threads of one process, NUMA-placed buffers */
    ST_COMM_BACKEND_MPI,          /* the ranks of an MPI job (world.h), each with
                                   * n_workers threads: hierarchical
                                   * (doc/reduction.md).  Only when configure
                                   * found MPI; else st_comm_create refuses it */
} st_comm_backend_kind;

/* "shared", "mpi"; "unknown" for anything else. */
const char *st_comm_backend_name(st_comm_backend_kind kind);
/* ST_ERR_INVALID, naming the allowed ones, if `name` is not a known
 * backend (known does not mean built in: st_comm_create says whether it
 * is). */
st_status st_comm_backend_parse(const char *name, st_comm_backend_kind *out);

/* What the reduce-scatter reads of the workers' gradients (its payload).
 * FP32 (0, the default): the fp32 gradients themselves.  BF16: each
 * gradient element rounded to bf16 (round to nearest even); the sums,
 * the division by the holder count, the shard gradients, the masters and
 * the all-gather stay fp32, so the result is exactly the fp32 sum, in
 * the fixed order, of the bf16-rounded gradients, divided as in fp32
 * (over MPI with n > 1 workers a rank, of the ranks' partials rounded
 * once more).  Where the rounding happens is st_comm_bf16_at. */
typedef enum st_comm_payload {
    ST_COMM_PAYLOAD_FP32 = 0,
    ST_COMM_PAYLOAD_BF16,
} st_comm_payload;

/* With ST_COMM_PAYLOAD_BF16 (shared backend): where the gradients become
 * bf16.  Both give bitwise the same result; they differ in memory traffic
 * (doc/reduction.md, "Comm precision").
 *   BUFFER   (0) each worker converts its held gradient once per step, at
 *            the entry of the reduce-scatter, into a bf16 buffer from its
 *            arena (taken at attach, counted as gradients), and every
 *            reader reads 2 bytes per element: half the bytes between
 *            workers, plus the worker's own conversion pass;
 *   ON_READ  no buffer: the readers (owners, partials' computers) round
 *            each fp32 gradient as they stream it, reading 4 bytes per
 *            element as fp32 does. */
typedef enum st_comm_bf16_at {
    ST_COMM_BF16_BUFFER = 0,
    ST_COMM_BF16_ON_READ,
} st_comm_bf16_at;

typedef struct st_comm_config {
    int n_workers;
    size_t n_params;
    /* NUMA domain of each worker (n_workers entries, non-decreasing: the
     * workers of a domain are consecutive, as st_plan orders them).  NULL:
     * everyone in domain 0 (single level). */
    const int *domain_of;
    /* What the engine is for: ST_COMM_REDUCE (reduce-scatter, shard
     * gradients), ST_COMM_GATHER (master shards, all-gather), or both (0
     * means both).  An engine with one role does not allocate the other's
     * buffers: backward masking pairs a reduce-only engine (gradient
     * holders) with a gather-only one (parameter holders). */
    int roles;
    /* 1: an element may be held by nobody (a hidden-to-hidden weight whose
     * two neurons no worker holds together, in neuron subnetworks of mlp).
     * The reduce-scatter never writes it (its shard gradient stays 0 from
     * attach on), the all-gather never reads it, its master is not
     * initialised: the caller does that.  0: such an element is an error. */
    int allow_unheld;
    /* With allow_unheld: the only ranges (sorted, disjoint) where an
     * unheld element is allowed; anywhere else it is still an error, so
     * that a layout mistake cannot go unnoticed.  NULL: anywhere.  Copied. */
    const st_range *unheld_ranges;
    int n_unheld_ranges;
    /* The implementation (0: ST_COMM_BACKEND_SHARED).  One that is unknown
     * or not built into this library makes st_comm_create fail with
     * ST_ERR_INVALID and a message naming it. */
    st_comm_backend_kind backend;
    /* ST_COMM_BACKEND_MPI: the ranks the engine spans, world ranks
     * [rank_first, rank_first + n_ranks), each with n_workers >= 1 of its
     * own; only those ranks call st_comm_create, in the same order of
     * engines.  n_ranks 0: every rank.  Ignored by the shared backend. */
    int rank_first, n_ranks;
    /* The reduce-scatter's payload (0: fp32) and, for bf16 on the shared
     * backend, where it is rounded (0: a buffer per worker).  The MPI
     * backend ignores bf16_at: its pack rounds each gradient as it reads
     * it, and a rank of n > 1 workers rounds its partial once more before
     * it leaves the rank. */
    st_comm_payload payload;
    st_comm_bf16_at bf16_at;
    /* 1 (shared backend, an engine with the gather role): the workers of
     * each NUMA domain attach one parameter vector, in the full layout,
     * each holding every element (data parallelism): one weight copy per
     * domain, not a replica per worker.  Each owner's master shard is its
     * slice of its own domain's vector, updated there in place; the
     * all-gather copies each shard into the other domains' vectors only,
     * one worker of a domain bringing in each segment, and returns once
     * its domain's vector is whole (on one domain it copies nothing: it
     * is the barrier after which every update is visible).  Every worker
     * of a domain must attach the same vector, every domain its own.  The
     * MPI backend refuses it (a replica per worker). */
    int shared_params;
    /* 1 (an engine with the gather role; shared and MPI backends): the
     * bf16 copies every worker lists (st_comm_set_param_copies, the same
     * offsets for all, over vectors in the full layout) are the master of
     * their elements (a bf16 master): each owner's update writes its own
     * copies, and the all-gather brings a copied element in as bf16, from
     * the owner's (or the copier's) copy into the worker's, without its
     * fp32 value (over MPI: 2 bytes an element between ranks); the master
     * shards have no memory under a copy, and the attached vectors'
     * elements there are neither read nor written.  With shared_params
     * the copies are the domain's: the owner's update writes its domain's,
     * and each other domain's copier copies them, bit for bit, into its
     * own. */
    int copies_master;
    /* Ranges of the full layout (sorted, disjoint; copied), for an engine
     * with the gather role whose workers attach compact vectors with copies
     * of their own layouts (subnetworks, which copies_master cannot serve:
     * it needs the same list everywhere): the elements there have a bf16
     * master.  Each owner keeps its shard's in a bf16 shard of its own
     * (st_comm_shard_params16, indexed from the shard's begin), which the
     * update writes; its fp32 master shard has no memory under them, and
     * the all-gather brings them from the bf16 shard into the holders'
     * copies, leaving the holders' fp32 elements there unwritten.  Every
     * copied element a worker holds must lie in these ranges, and every
     * element there it holds in one of its copies.  The shared backend on
     * one NUMA domain alone; not with copies_master.  NULL: none. */
    const st_range *bf16_master;
    int n_bf16_master;
    /* 1 (shared backend): a worker waiting at a barrier sleeps until the
     * last one arrives, instead of spinning: for many more workers than
     * cores when no step is timed (a sizing run lays its workers out on
     * threads that only meet).  0: spinning, the steps' barrier. */
    int blocking;
} st_comm_config;

#define ST_COMM_REDUCE 1
#define ST_COMM_GATHER 2

typedef struct st_comm st_comm;

/* Creates the engine with the configured backend (by one thread, before
 * the workers start).  The per-worker buffers are created by
 * st_comm_attach. */
st_status st_comm_create(const st_comm_config *cfg, st_comm **out);
void st_comm_destroy(st_comm *c);

/* The backend c runs on (ST_COMM_BACKEND_SHARED for NULL). */
st_comm_backend_kind st_comm_backend_of(const st_comm *c);

/* Called by every worker w on its own thread, once, before the first step:
 * registers w's gradient and parameter vectors (full layout, P floats each;
 * only the held elements are read or written) and the ranges of the vector
 * that w holds (sorted, disjoint; {0, P} for data parallelism), and takes
 * w's shard buffers (master weights of the shard, the averaged gradient,
 * holder counts, and partials for the two-level path) from w's arena, so
 * they live on w's node.  The master shard is initialised from `params`
 * of the first holder.  Returns after every worker has attached (it
 * contains a barrier).  Every element must be held by at least one worker. */
st_status st_comm_attach(st_comm *c, int w, st_arena *arena, float *grads, float *params,
                         const st_range *held, int n_held);

/* The same for a worker whose vectors are compact: held range i of the
 * full layout lives at grads + local[i] and params + local[i] (a
 * subnetwork's own, smaller parameter vector).  local NULL: full layout. */
st_status st_comm_attach_compact(st_comm *c, int w, st_arena *arena, float *grads,
                                 float *params, const st_range *held, const size_t *local,
                                 int n_held);

/* Worker w's reduce-scatter writes its shard's means into `out` (the
 * shard's length, w's own) instead of a buffer the engine takes from w's
 * arena: for a caller that keeps the result anyway (IST's saved masters),
 * one shard-sized buffer and two copies fewer.  Elements nobody holds are
 * left as they are in `out`.  Called before w attaches; kept across
 * st_comm_reset. */
void st_comm_set_shard_output(st_comm *c, int w, float *out);

/* bf16 weight copies (--precision bf16): ranges of w's own parameter
 * vector (offsets as in the vector w attaches: compact or full) whose
 * bf16 rounding the model's products read (st_model_copies).  The
 * all-gather then writes each element's bf16 rounding (to nearest even,
 * as oneDNN's reorders round) into copies[i].bf16 in the same pass that
 * copies its fp32 value, and the model need not convert the weights
 * before its next forward: one pass over them fewer per step and worker.
 * Called before w attaches (the list is read by the attach, not kept);
 * forgotten by st_comm_reset.  A backend that cannot (MPI) ignores it. */
void st_comm_set_param_copies(st_comm *c, int w, const st_param_copy *copies, int n);

/* 1 if every all-gather writes every element of the copies w registered
 * before its last attach (the caller may then mark its model's copies
 * current after each all-gather: st_model_copies_written), else 0.  With
 * shared parameters: 1 if w registered copies (the same list as every
 * worker of its domain, in the domain's vector): the all-gather writes the
 * copies of every element another domain owns, and each owner writes
 * those of its own shard with its update (st_optim_update_copies). */
int st_comm_gathers_copies(const st_comm *c, int w);

/* The same for w's blocked bf16 copies (st_param_blocked, --weight-layout
 * blocked) of ranges of the replica it attaches (not shared parameters,
 * whose domain's copies the updates pack): the all-gather packs each
 * element into them, from the slab of the replica it has just copied, and
 * the model need not pack its weights before its next forward
 * (st_model_blocked_written).  Sorted and disjoint, apart from the bf16
 * copies; else not taken.  Both backends. */
void st_comm_set_param_blocked(st_comm *c, int w, const st_param_blocked *blocked, int n);
/* 1 if every all-gather packs every element of the blocked copies w
 * registered before its last attach, else 0. */
int st_comm_gathers_blocked(const st_comm *c, int w);

/* Forgets every attachment so that the workers can attach again with other
 * holdings (a new round of subnetworks); the shards stay where they are.
 * The workers' buffers were in their arenas: the caller rewinds those.
 * Called by one thread while all the others wait at st_comm_barrier. */
void st_comm_reset(st_comm *c);

/* w's shard: its range of the vector, the averaged gradient and master
 * weights of that range (float arrays indexed from the range's begin). */
st_range st_comm_shard(const st_comm *c, int w);
float *st_comm_shard_grads(st_comm *c, int w);
float *st_comm_shard_params(st_comm *c, int w);
/* w's bf16 master shard (st_comm_config.bf16_master), indexed from its
 * shard's begin, only the elements inside those ranges meaningful; NULL
 * without one, or where w's shard meets none of them. */
uint16_t *st_comm_shard_params16(st_comm *c, int w);

/* Reduce-scatter.  Every worker calls it once its gradient vector is
 * complete; on return w's shard gradient holds, for every element, the
 * mean over its holders.  Internally waits for all workers. */
st_status st_comm_reduce_scatter(st_comm *c, int w);

/* Optional, during w's backward, before its reduce-scatter, as often as
 * wanted with `from` not increasing: w's gradient elements [from, P) (full
 * layout) are final for this step: w writes none of them before the
 * step's all-gather.  w then reduces the means of its own shard's elements
 * that every worker has said final (a call with the same `from` again only
 * does that), so that the reduction runs during the backward pass and the
 * reduce-scatter only finishes it; *done (may be NULL) is the part of w's
 * shard whose means this call completed (empty: none), which w may update
 * at once.  The same sums in the same order: the result is bitwise the
 * same as without.  Never waits.  With two levels (partials of NUMA
 * domains) w also sums its partials over what its domain's workers have
 * all said, and an owner reduces what every partial covers.  A backend
 * that does not do it (MPI) only remembers, and the reduce-scatter
 * reduces all. */
st_status st_comm_reduce_ready(st_comm *c, int w, size_t from, st_range *done);

/* All-gather.  Every worker calls it once it has updated its shard's master
 * weights; on return w's parameter vector holds the master values of every
 * element w holds.  Internally waits for all workers first, every owner
 * then done reading the gradients: a worker's gradient vector may be its
 * parameter vector (an average of the parameters themselves). */
st_status st_comm_all_gather(st_comm *c, int w);

/* A barrier over all workers (shared backend: spin on C11 atomics). */
st_status st_comm_barrier(st_comm *c, int w);

/* Called by a worker that failed: every worker waiting in (or later
 * entering) a collective or barrier returns ST_ERR_INVALID with a message
 * saying that another worker failed, instead of waiting forever. */
void st_comm_abort(st_comm *c);

/* Bytes worker w reads and writes in one reduce-scatter + all-gather
 * (its own buffers included), from the plan, not measured. */
typedef struct st_comm_bytes {
    size_t read, written;
    size_t cross_domain_read;   /* of `read`, bytes read from another node */
    size_t gather_read, gather_written; /* of read and written, the all-gather's */
} st_comm_bytes;

st_comm_bytes st_comm_bytes_per_step(const st_comm *c, int w);

/* What st_comm_bytes_per_step of worker w will be for an engine of cfg
 * (the shared backend's plan: workers, domains, parameters, roles,
 * payload, bf16_at, shared_params) whose workers all hold every element,
 * counted by the plan's rules without attaching anything (`subtrain
 * topo`).  ST_ERR_INVALID for a configuration the engine refuses. */
st_status st_comm_plan_bytes(const st_comm_config *cfg, int w, st_comm_bytes *out);

/* What a ring all-reduce among N distributed workers sends per worker:
 * 2 (N - 1) / N x P x 4 bytes. */
double st_comm_ring_bytes(int n_workers, size_t n_params);

/* Human-readable description of the shared backend's reduction tree for
 * data parallelism, one line per domain and level, for `subtrain topo` and
 * --verbose runs. */
void st_comm_describe(FILE *f, int n_workers, const int *domain_of, size_t n_params);

/* The same for the plan of `cfg` (the shared backend's: workers, domains,
 * parameters, payload and shared_params; its other fields are ignored),
 * and then, with shared parameters, the weight copies: one a domain, who
 * brings each remote shard into it, and the bytes per worker and per
 * domain and step. */
void st_comm_describe_config(FILE *f, const st_comm_config *cfg);

/* The same for `ranks` MPI ranks of `workers_per_rank` workers each
 * (ST_COMM_BACKEND_MPI): global numbering, rank shards, the exchange and
 * its bytes per rank and step. */
void st_comm_describe_ranks(FILE *f, int ranks, int workers_per_rank, size_t n_params);

#ifdef __cplusplus
}
#endif
#endif /* SUBTRAIN_COMM_H */

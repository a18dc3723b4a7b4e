/*
 * comm/plan.h — private: the plan of the reduction — shards, NUMA
 * domains, segments with their holder counts, and each worker's work
 * lists for the two-level reduce-scatter and all-gather (plan.c).
 *
 * The plan is pure bookkeeping: it never waits and never synchronises.
 * Attach is a sequence of planning phases that the backend (shared.c)
 * separates with barriers, because each phase reads what every worker
 * wrote in the phase before:
 *
 *   st_comm_plan_register        w's pointers, ranges and shard buffers
 *   -- barrier --
 *   st_comm_plan_check_coverage  every element has a holder (all workers)
 *   st_comm_plan_segments        w's segments and master shard
 *   -- barrier --
 *   st_comm_plan_tasks           w's level-1 partials and all-gather copies;
 *                                writes the partials' addresses into the
 *                                owners' tables
 *   -- barrier --
 *   st_comm_plan_owner           w's level-2 program (reads those tables)
 *   st_comm_plan_finish          which mid-collective barriers are needed
 *
 * The helpers at the top (shards, domains, argument checks) are pure
 * functions: the dispatcher (comm.c) and the description (describe.c) use
 * them too, so that all three agree on the layout.
 */
#ifndef SUBTRAIN_COMM_PLAN_H
#define SUBTRAIN_COMM_PLAN_H

#include <stdalign.h>
#include <stddef.h>
#include <stdint.h>

#include <subtrain/arena.h>
#include <subtrain/comm.h>

#include "comm/kernels.h"

#define ST_COMM_SHARD_ALIGN 16      /* floats: shard boundaries on 64-byte lines */
#define ST_COMM_MAX_WORKERS 65535   /* holder ids and counts are uint16 */

/* ------------------------------------------------------------ layout */

/* n_workers in [1, ST_COMM_MAX_WORKERS], n_params >= 1 and addressable;
 * else ST_ERR_INVALID with a message. */
st_status st_comm_check_size(int n_workers, size_t n_params);

/* Dense domain indices from domain_of (NULL: all 0): dense[w] (if dense is
 * not NULL), the first worker of each dense domain and n (if domain_first
 * is not NULL: n_domains + 1 entries), and the number of domains.
 * ST_ERR_INVALID if domain_of is negative or decreasing. */
st_status st_comm_map_domains(int n, const int *domain_of, int *dense, int *domain_first,
                              int *n_domains);

/* Shard boundaries begin[0..n] (n + 1 entries): ceil(P / 16) blocks of 16
 * floats split as evenly as possible (the first P_blocks mod N shards get
 * one more); the last block may be partial, and shards past the last
 * block are empty. */
void st_comm_shards(size_t n_params, int n, size_t *begin);

/* Index of the least loaded of load[0..n), ties to the lowest: the one
 * rule by which a domain's workers share its partials and copies. */
size_t st_comm_least_loaded(const size_t *load, size_t n);

/* Worker w's attach arguments: arena and vectors given, held ranges
 * non-empty, sorted, disjoint and inside the n_params-element vector. */
st_status st_comm_check_held(size_t n_params, int w, const st_arena *arena, const float *grads,
                             const float *params, const st_range *held, int n_held);

/* ------------------------------------------------------------ the plan */

/* A run of the owner's shard with a constant set of holders. */
typedef struct comm_seg {
    size_t begin, end;        /* absolute indices into the vector */
    size_t holder_first;      /* index of its first holder in slot->holders */
    uint16_t count;           /* number of holders: the divisor */
} comm_seg;

/* Worker w's part of the plan.  Each worker writes its own slot during
 * attach, so slots start on their own 64-byte line (no false sharing
 * between the planning workers); during a step they are only read. */
typedef struct comm_slot {
    alignas(64) int domain;   /* dense domain index */
    st_arena *arena;
    /* registered by attach, read by everyone after the first barrier */
    float *grads, *params;
    st_range *held;
    size_t *local;            /* held[i] starts at grads/params + local[i] */
    int n_held;
    float *master, *shard_grad;
    uint16_t *master16;       /* the bf16 master shard (comm_plan.bf16_master),
                               * indexed from the shard's begin, or NULL */
    float *shard_out;         /* the caller's buffer for shard_grad, or NULL
                               * (st_comm_set_shard_output; survives a reset) */
    const st_param_copy *copies;  /* bf16 copies of ranges of params, read by the
                               * attach (st_comm_set_param_copies; a reset
                               * forgets them) */
    int n_copies;
    const st_param_copy *own_copies;  /* the same list, kept for the other
                               * workers' attach (copies_master) */
    int n_own_copies;
    int copies_gathered;      /* the all-gather writes every copied element */
    const st_param_blocked *blocked;  /* blocked bf16 copies of ranges of a
                               * replica's params, sorted and disjoint,
                               * read by the attach (st_comm_set_param_blocked) */
    int n_blocked;
    int blocked_gathered;     /* the all-gather packs every element of them */
    /* the owner's segments (read by everyone after the second barrier) */
    comm_seg *segs;
    size_t n_segs;
    uint16_t *holders;
    const float **seg_src;    /* [seg * n_domains + d]: the partial of domain d
                               * (>= 2 holders there), set by its computer */
    /* the step's program */
    rs_item *rs1, *rs2;       /* level 1 (partials for remote owners), level 2 */
    size_t *rs1_at;           /* where each level-1 item begins in the vector */
    size_t n_rs1, n_rs2;
    rs_op *ops1, *ops2;
    ag_item *ag1, *ag2;       /* all-gather phases 1 and 2 */
    size_t n_ag1, n_ag2;
    float *partials;
    float *scratch;           /* ST_CHUNK floats, for a local partial */
    /* bf16 payloads: the buffer of w's held gradient (BUFFER: same compact
     * layout as grads, held range i at bf16 + local[i]; written by w at
     * the entry of each reduce-scatter), and the L1 chunks where bf16
     * sources are widened (2 x ST_CHUNK floats; BUFFER and ON_READ) */
    uint16_t *bf16;
    float *wide;
    int rs_mid_barrier, ag_mid_barrier;
    int ag_exit_barrier;      /* shared parameters over several domains: wait
                               * for the domain's copiers before returning */
    /* the reduction during the backward (st_comm_reduce_ready), this step:
     * w's gradient elements [ready_from, P) are said final (and converted,
     * with bf16 buffers); its shard's means [done_from, shard end) are
     * reduced; its level-1 partials are summed for [partial_from, P).
     * Written by w alone. */
    size_t ready_from, done_from, partial_from;
    uint64_t step;            /* steps reduced since attach */
    st_comm_bytes bytes;
} comm_slot;

typedef struct comm_plan {
    int roles;                /* ST_COMM_REDUCE | ST_COMM_GATHER */
    st_comm_payload payload;  /* what the reduce-scatter reads (fp32, bf16) */
    st_comm_bf16_at bf16_at;  /* bf16: a buffer per worker, or rounded on read */
    int allow_unheld;         /* elements nobody holds are skipped */
    int shared_params;        /* one parameter vector a domain (comm.h) */
    int copies_master;        /* the listed bf16 copies are the master (comm.h) */
    st_range *bf16_master;    /* ranges with bf16 master shards (comm.h) */
    int n_bf16_master;
    st_range *unheld_ranges;  /* where they may be (NULL: anywhere) */
    int n_unheld_ranges;
    int n_workers, n_domains;
    size_t n_params;
    int *domain_of;           /* dense domain index of each worker */
    int *domain_first;        /* n_domains + 1 */
    size_t *shard_begin;      /* n_workers + 1 */
    comm_slot *slots;
} comm_plan;

/* The tables fixed at create (domains, shards, empty slots) from a checked
 * configuration; st_comm_plan_free releases them (also after a failed
 * init: pl is zeroed first). */
st_status st_comm_plan_init(comm_plan *pl, const st_comm_config *cfg);
void st_comm_plan_free(comm_plan *pl);

/* A master shard of len elements, [begin, begin + len) of the vector, in
 * arena (weights).  copies (n, sorted and disjoint, full layout): a bf16
 * master's, whose elements the shard never holds: their pages are left
 * out (st_arena_reserve_floats); NULL: the whole shard. */
st_status st_comm_alloc_master(st_arena *arena, size_t begin, size_t len,
                               const st_param_copy *copies, int n, float **out);

/* Forgets every registration and work list (st_comm_reset); keeps each
 * slot's domain and shard output. */
void st_comm_plan_forget(comm_plan *pl);

/* Phase 1: w's vectors and ranges (copied into its arena) and its shard
 * buffers (master, shard gradient) from its arena, on its node. */
st_status st_comm_plan_register(comm_plan *pl, int w, st_arena *arena, float *grads,
                                float *params, const st_range *held, const size_t *local,
                                int n_held);

/* Phase 2, run by every worker (they all report the same element):
 * every element held by someone, except where unheld ones are allowed. */
st_status st_comm_plan_check_coverage(const comm_plan *pl);

/* Phase 2, run by every worker (they all report the same pair), with
 * shared parameters: one vector a domain, a different one for each. */
st_status st_comm_plan_check_shared(const comm_plan *pl);

/* Phase 2: the segments of w's shard, its master shard from each element's
 * first holder, and the tables of the two-level path. */
st_status st_comm_plan_segments(comm_plan *pl, int w);

/* Phase 3: w's level-1 items (partials of remote shards) and all-gather
 * items; the partials' addresses go into the owners' seg_src tables. */
st_status st_comm_plan_tasks(comm_plan *pl, int w);

/* Phase 4: w's level-2 program (the owner's sum over its shard). */
st_status st_comm_plan_owner(comm_plan *pl, int w);

/* Phase 4, last: whether w's collectives need their middle barrier (some
 * worker computes a partial; some worker copies from a copier), and its
 * all-gather a barrier of its domain at the end (shared parameters over
 * several domains). */
void st_comm_plan_finish(comm_plan *pl, int w);

/* With bf16 payloads in buffers, w rounds its held gradient's elements
 * of [lo, hi) (full layout) into its bf16 buffer (nothing otherwise): in
 * the step, before they are said final or at the reduce-scatter's entry. */
void st_comm_plan_convert(const comm_plan *pl, int w, size_t lo, size_t hi);

/* w's level-2 program (the owner's means) over the elements [lo, hi) of
 * its shard alone: what st_comm_run_rs of all of it computes there. */
void st_comm_plan_reduce_part(const comm_plan *pl, int w, size_t lo, size_t hi);

/* w's level-1 items (its domain's partials of remote shards) over the
 * elements [lo, hi) of the vector alone, as st_comm_plan_reduce_part. */
void st_comm_plan_partials_part(const comm_plan *pl, int w, size_t lo, size_t hi);

#endif /* SUBTRAIN_COMM_PLAN_H */

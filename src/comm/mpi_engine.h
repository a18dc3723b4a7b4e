/*
 * comm/mpi_engine.h — private to the MPI backend (mpi.c, mpi_plan.c,
 * mpi_items.c): its state, and the two steps of attach that mpi.c runs
 * between the barriers of a rank's workers.
 *
 *   mpi_plan.c   the layout of the exchange: every rank's profile, the
 *                regions each rank sends and receives, the buffers, and
 *                where the step reads and writes in place (worker 0);
 *   mpi_items.c  each worker's share of the step as work items
 *                (comm/kernels.h), from that layout;
 *   mpi.c        the engine: create, attach, the exchange between ranks
 *                and the step.
 *
 * mpi.c describes the algorithm.  Only with HAVE_MPI.
 */
#ifndef SUBTRAIN_COMM_MPI_ENGINE_H
#define SUBTRAIN_COMM_MPI_ENGINE_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <subtrain/arena.h>
#include <subtrain/comm.h>
#include <subtrain/status.h>

#include "comm/barrier.h"
#include "comm/kernels.h"
#include "comm/world_mpi.h"

/* A segment of one rank's profile: elements [begin, end) with `count`
 * local holders (>= 1), inside one global shard; `off`: where it starts in
 * that rank's region for the shard's rank (its position in the exchange). */
typedef struct prof_seg {
    uint64_t begin, end, count, off;
} prof_seg;

typedef struct mpi_worker {
    alignas(64) atomic_int attached;
    int ready;
    /* registered */
    float *grads, *params;
    st_range *held;
    size_t *local;
    int n_held;
    float *master, *shard_grad, *shard_out;
    const st_param_copy *copies;   /* its model's bf16 copies: a bf16 master's,
                                    * or written by its all-gather items */
    int n_copies;
    int copies_gathered;           /* every element of them, each step (not a
                                    * bf16 master's) */
    const st_param_blocked *blocked;   /* its replica's blocked copies, packed
                                        * by its all-gather items */
    int n_blocked;
    int blocked_gathered;          /* every element of them, each step */
    st_arena *arena;
    /* the step's program (in the arena) */
    rs_item *pack, *own;
    rs_op *pack_ops, *own_ops;
    size_t n_pack, n_own;
    ag_item *ag_out, *ag_in;
    size_t n_ag_out, n_ag_in;
    float *scratch;
    float *wide;              /* bf16 payloads: 2 x ST_CHUNK, where sources widen */
    st_comm_bytes bytes;
} mpi_worker;

typedef struct mpi_comm {
    st_spin_barrier barrier;
    MPI_Comm comm;
    int rank, size, n, N;
    int *first;               /* R + 1: rank r's workers are global f[r] .. f[r + 1] - 1 */
    size_t P;
    int roles, allow_unheld;
    st_range *unheld;
    int n_unheld;
    size_t *shard_begin;      /* N + 1 */
    mpi_worker *workers;      /* n */
    /* the exchange, made by worker 0 at attach */
    prof_seg **prof;          /* [rank]: its profile, split at shard boundaries */
    size_t *n_prof;
    size_t *send_off, *send_len;   /* [d]: this rank's region for rank d in `send` */
    size_t *recv_off, *recv_len;   /* [s]: rank s's region in `recv` */
    /* Per peer, where the step's exchange reads and writes: the packed
     * region of send or recv, or (direct) the run of one local worker's
     * vector, or of one owner's master, that the region is, with no copy
     * (data parallelism with one worker a rank, for instance) */
    const float **rs_out;     /* [d]: this rank's partial for d */
    const float **ag_src;     /* [s]: the masters s holds */
    float **ag_dst;           /* [d]: where d's masters land */
    int *rs_direct, *ag_src_direct, *ag_dst_direct;
    MPI_Request *reqs;        /* 2 per peer */
    float *send, *recv;
    int bf16;                 /* bf16 gradient payloads between ranks */
    /* A bf16 master in the copies (st_comm_config.copies_master): the
     * all-gather moves a region's elements outside the copies as fp32,
     * then those inside as bf16 (the owner's copy), in the same buffer:
     * f_off[r][j] of rank r's segment j counts the fp32 elements before it
     * in its region; send_f and recv_f are the regions' fp32 counts. */
    int copies_master;
    const st_param_copy *copies;   /* worker 0's list (every worker's alike) */
    int n_copies;
    size_t **f_off;
    size_t *send_f, *recv_f;
    uint16_t *send16, *recv16; /* bf16: the reduce-scatter's payloads, laid out
                               * as send and recv (same offsets, in elements) */
    size_t mpi_bytes;         /* what this rank receives per step */
    int plan_failed;          /* worker 0's planning failed (its message is its own) */
    struct st_comm_world *world;   /* a sizing run's described job (comm/sizing_world.h):
                                    * gathers there, no MPI, no step; else NULL */
} mpi_comm;

/* A growable list (attach only: the step's lists are copied into the
 * worker's arena). */
typedef struct list {
    void *v;
    size_t n, cap, size;
} list;

/* ------------------------------------------------------------ mpi_plan.c */

/* A new last element of l (uninitialised), NULL when out of memory. */
void *st_mpi_list_push(list *l);
/* ST_ERR_NOMEM, "out of memory planning the MPI reduction". */
st_status st_mpi_no_memory(void);
/* The rank whose rank shard holds element x. */
int st_mpi_rank_of_element(const mpi_comm *mc, uint64_t x);
/* Local worker v's address of element x in its gradient (or parameter)
 * vector, v being x's one local holder (*who = v); NULL if no local
 * worker holds x. */
float *st_mpi_sole_holder_at(const mpi_comm *mc, uint64_t x, int params, int *who);
/* copies_master: the end of the run from x (below end) whose elements are
 * all in one copy (*copy its index) or all outside the copies (*copy
 * -1); else end, *copy -1. */
uint64_t st_mpi_copy_run(const mpi_comm *mc, uint64_t x, uint64_t end, int *copy);
/* copies_master: the elements of [a, b) inside a copy; else 0. */
uint64_t st_mpi_copied_in(const mpi_comm *mc, uint64_t a, uint64_t b);
/* Worker 0, between the barriers of attach: every rank's profile, the
 * layout of the exchange and its buffers (from arena). */
st_status st_mpi_plan_exchange(mpi_comm *mc, st_arena *arena);

/* ------------------------------------------------------------ mpi_items.c */

/* Worker w's share of the rank's partials, as rs items into items and ops
 * (first_only: the first local holder's parameters, for the initial
 * masters; else the sum of the local holders' gradients). */
st_status st_mpi_build_pack(const mpi_comm *mc, int w, int first_only, list *items, list *ops);
/* Owner w's shard into out from the partials received: the mean over
 * every holder, or (first_only) the first rank's value. */
st_status st_mpi_build_own(const mpi_comm *mc, int w, int first_only, float *out, list *items,
                           list *ops);
/* Worker w's program of the step in its arena, and its bytes per step. */
st_status st_mpi_step_lists(mpi_comm *mc, int w);

#endif /* SUBTRAIN_COMM_MPI_ENGINE_H */

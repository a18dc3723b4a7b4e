/*
 * subtrain/world.h — the processes of a run: this one alone, or the ranks
 * of an MPI job (mpirun, srun).
 *
 * A run of R ranks with n workers each has R x n workers in all; rank r's
 * local worker w is global worker r * n + w.  Everything a worker draws
 * (its batch rows, its subnetwork, its partition) is a function of its
 * global index, so a layout of ranks x workers trains like one process of
 * R x n workers, and the reduction (comm.h, ST_COMM_BACKEND_MPI) moves
 * the gradients between ranks.
 *
 * st_world_init starts MPI only when the library has it (configure
 * --with-mpi) and an MPI launcher started the process (its environment
 * says so); otherwise the world is this process alone, size 1, and every
 * collective below is a no-op.  With MPI the thread level asked for is
 * MPI_THREAD_SERIALIZED: a run calls MPI from one thread at a time (the
 * main thread outside the workers' region; inside it, local worker 0
 * between two barriers of the rank's workers, which need not be the
 * thread that initialised MPI when the library is driven by another
 * program).
 *
 * The collectives are called by one thread per rank, every rank in the
 * same order.  They fail (ST_ERR_IO, with MPI's message) rather than abort,
 * so that the caller can say what it was doing; a program that cannot go
 * on calls st_world_abort, which ends every rank.
 */
#ifndef SUBTRAIN_WORLD_H
#define SUBTRAIN_WORLD_H

#include <stddef.h>
#include <stdint.h>
#include <subtrain/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 if this library was built with MPI. */
int st_world_has_mpi(void);
/* 1 if the environment says an MPI launcher started this process. */
int st_world_launched(void);

/* Starts MPI when built with it and launched by an MPI launcher (else
 * nothing).  Call once, before any thread is started. */
st_status st_world_init(int *argc, char ***argv);
/* Ends MPI if st_world_init started it. */
void st_world_finalize(void);

/* This process's rank and the number of ranks (0 and 1 without MPI). */
int st_world_rank(void);
int st_world_size(void);
/* The processor name MPI reports (the host name without MPI). */
const char *st_world_host(void);

/* Ends every rank with exit status `code` (MPI_Abort); without MPI, or
 * with one rank, it returns and the caller exits as usual. */
void st_world_abort(int code);

/* all[r * bytes ..] <- rank r's `mine` (bytes each), every rank. */
st_status st_world_allgather(const void *mine, size_t bytes, void *all);
/* v[0..n) <- the largest of each over the ranks. */
st_status st_world_max_ints(int *v, int n);
/* v[0..n) <- the sum of each over the ranks (MPI's order: bitwise the
 * same as a sum in rank order for 2 ranks, within rounding beyond). */
st_status st_world_sum_doubles(double *v, size_t n);
/* The same for counts (exact). */
st_status st_world_sum_u32(uint32_t *v, size_t n);
/* Every rank holds v[begin, end) (the ranks' ranges in rank order,
 * adjacent: rank r's begins where rank r - 1's ends); afterwards every
 * rank holds all of them. */
st_status st_world_allgather_range(float *v, size_t begin, size_t end);
/* buf on every rank <- buf of rank `root`. */
st_status st_world_bcast(void *buf, size_t bytes, int root);
st_status st_world_barrier(void);
/* The exchange of the MPI backend's step, timed: every rank sends `bytes`
 * to every other rank and receives as much from each, all messages posted
 * at once; *seconds is the best of `rounds` rounds (after one to warm up)
 * of the slowest rank's time, the same on every rank.  0 with one process. */
st_status st_world_time_exchange(size_t bytes, int rounds, double *seconds);
/* Point to point, any size (sent in pieces MPI's int counts can take):
 * rank `to` must post the matching st_world_recv from this rank. */
st_status st_world_send(const void *buf, size_t bytes, int to);
st_status st_world_recv(void *buf, size_t bytes, int from);

#ifdef __cplusplus
}
#endif
#endif /* SUBTRAIN_WORLD_H */

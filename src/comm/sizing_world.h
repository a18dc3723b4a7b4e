/*
 * comm/sizing_world.h — private: the ranks of an MPI job, described, for
 * a sizing run (st_train_size_ranks): every rank's workers are laid out in
 * this one process, and the MPI backend, whose attach learns what every
 * rank holds, gathers it from the other ranks' local worker 0 here
 * instead of over MPI.  It plans the exchange and the step's work as a
 * real rank does, and never steps.  Only the MPI backend uses it.
 */
#ifndef SUBTRAIN_COMM_SIZING_WORLD_H
#define SUBTRAIN_COMM_SIZING_WORLD_H

#include <stddef.h>

#include <subtrain/comm.h>
#include <subtrain/status.h>

typedef struct st_comm_world st_comm_world;

st_status st_comm_world_create(int ranks, st_comm_world **out);
/* NULL does nothing. */
void st_comm_world_destroy(st_comm_world *w);
int st_comm_world_size(const st_comm_world *w);
/* Every rank waiting in, or later entering, a gather fails ("another
 * rank failed"): a worker that fails stops the other ranks too. */
void st_comm_world_abort(st_comm_world *w);

/* Called by one thread of each rank (its local worker 0): every rank has
 * come (MPI_Barrier's part in a sizing run's phases). */
st_status st_comm_world_barrier(st_comm_world *w);

/* Called by one thread of each rank (its local worker 0), every rank the
 * same gathers in the same order, as MPI's collectives: *all (malloc'd,
 * the caller frees it) <- every rank's `mine` in rank order, counts[r]
 * bytes of rank r (counts: one per rank). */
st_status st_comm_world_allgatherv(st_comm_world *w, int rank, const void *mine, size_t bytes,
                                   void **all, size_t *counts);

/* st_comm_create for rank `rank` of w: the MPI backend's layout without
 * MPI (ST_ERR_INVALID when the library has no MPI backend). */
st_status st_comm_create_sizing(const st_comm_config *cfg, st_comm_world *w, int rank,
                                st_comm **out);

#endif /* SUBTRAIN_COMM_SIZING_WORLD_H */

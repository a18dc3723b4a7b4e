/*
 * comm/world_mpi.h — private: the communicator of the run's ranks
 * (world.c), for the MPI backend (mpi.c), and MPI's error text.  Only with
 * HAVE_MPI.
 */
#ifndef SUBTRAIN_COMM_WORLD_MPI_H
#define SUBTRAIN_COMM_WORLD_MPI_H

#include <mpi.h>

#include <subtrain/status.h>

/* MPI_COMM_WORLD with MPI_ERRORS_RETURN, once st_world_init started MPI;
 * MPI_COMM_NULL otherwise. */
MPI_Comm st_world_comm(void);

/* st_fail(ST_ERR_IO, "what: MPI's message for rc"). */
st_status st_world_fail(int rc, const char *what);

#endif /* SUBTRAIN_COMM_WORLD_MPI_H */

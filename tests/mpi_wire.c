/*
 * tests/mpi_wire.c — what a rank's point-to-point calls move, counted
 * where the program hands them to MPI (the PMPI profiling interface), so
 * that a test can hold the bytes the reduction says it moves against the
 * bytes it asks MPI to move.  Loaded into the ranks with LD_PRELOAD
 * (tests/mpi.sh); at MPI_Finalize each rank writes one line to
 * $MPI_WIRE_OUT.<rank>: "recv BYTES send BYTES".  Collectives are not
 * counted: Open MPI runs them below this interface.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static unsigned long long recv_bytes, send_bytes;

static unsigned long long bytes_of(int count, MPI_Datatype type)
{
    int size = 0;
    PMPI_Type_size(type, &size);
    return (unsigned long long)count * (unsigned long long)size;
}

int MPI_Irecv(void *buf, int count, MPI_Datatype type, int src, int tag, MPI_Comm comm,
              MPI_Request *req)
{
    recv_bytes += bytes_of(count, type);
    return PMPI_Irecv(buf, count, type, src, tag, comm, req);
}

int MPI_Recv(void *buf, int count, MPI_Datatype type, int src, int tag, MPI_Comm comm,
             MPI_Status *status)
{
    recv_bytes += bytes_of(count, type);
    return PMPI_Recv(buf, count, type, src, tag, comm, status);
}

int MPI_Isend(const void *buf, int count, MPI_Datatype type, int dst, int tag, MPI_Comm comm,
              MPI_Request *req)
{
    send_bytes += bytes_of(count, type);
    return PMPI_Isend(buf, count, type, dst, tag, comm, req);
}

int MPI_Send(const void *buf, int count, MPI_Datatype type, int dst, int tag, MPI_Comm comm)
{
    send_bytes += bytes_of(count, type);
    return PMPI_Send(buf, count, type, dst, tag, comm);
}

int MPI_Finalize(void)
{
    const char *out = getenv("MPI_WIRE_OUT");
    int rank = 0;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (out) {
        char path[4096];
        snprintf(path, sizeof path, "%s.%d", out, rank);
        FILE *f = fopen(path, "w");
        if (f) {
            fprintf(f, "recv %llu send %llu\n", recv_bytes, send_bytes);
            fclose(f);
        }
    }
    return PMPI_Finalize();
}

/*
 * comm/world.c — the processes of a run (subtrain/world.h): MPI's start,
 * end and the few collectives the training loop needs besides the
 * reduction (losses, evaluation sums, stop requests).
 *
 * Without HAVE_MPI (or when no MPI launcher started the process) the world
 * is this process: rank 0 of 1, and the collectives copy or do nothing.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <subtrain/world.h>

#include "core/error.h"
#ifdef HAVE_MPI
#include "comm/world_mpi.h"
#endif

static int world_rank = 0, world_size = 1;
static char world_host[256];

int st_world_has_mpi(void)
{
#ifdef HAVE_MPI
    return 1;
#else
    return 0;
#endif
}

/* What the launchers set: Open MPI's mpirun, PMIx (srun --mpi=pmix, prterun),
 * PMI-1/2 (srun --mpi=pmi2, MPICH's hydra). */
int st_world_launched(void)
{
    static const char *vars[] = { "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE" };
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i]))
            return 1;
    return 0;
}

int st_world_rank(void)
{
    return world_rank;
}

int st_world_size(void)
{
    return world_size;
}

const char *st_world_host(void)
{
    if (!world_host[0] && gethostname(world_host, sizeof world_host - 1) != 0)
        snprintf(world_host, sizeof world_host, "unknown");
    return world_host;
}

#ifdef HAVE_MPI

static MPI_Comm world_comm = MPI_COMM_NULL;
static int world_started = 0;

MPI_Comm st_world_comm(void)
{
    return world_comm;
}

st_status st_world_fail(int rc, const char *what)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error %d", rc);
    return st_fail(ST_ERR_IO, "%s: %s", what, text);
}

st_status st_world_init(int *argc, char ***argv)
{
    if (world_started || !st_world_launched())
        return ST_OK;
    int provided = 0;
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS)
        return st_fail(ST_ERR_IO, "MPI_Init_thread failed (error %d)", rc);
    world_started = 1;
    if (provided < MPI_THREAD_SERIALIZED) {
        MPI_Finalize();
        world_started = 0;
        return st_fail(ST_ERR_INVALID, "this MPI library gives thread level %d; subtrain needs "
                       "MPI_THREAD_SERIALIZED (%d): its workers call MPI from one thread at a "
                       "time, not always the main one", provided, MPI_THREAD_SERIALIZED);
    }
    /* errors come back as return codes, turned into messages that say what
     * subtrain was doing; a program that cannot go on calls st_world_abort */
    MPI_Comm_dup(MPI_COMM_WORLD, &world_comm);
    MPI_Comm_set_errhandler(world_comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(world_comm, &world_rank);
    MPI_Comm_size(world_comm, &world_size);
    int len = 0;
    char name[MPI_MAX_PROCESSOR_NAME];
    if (MPI_Get_processor_name(name, &len) == MPI_SUCCESS)
        snprintf(world_host, sizeof world_host, "%s", name);
    return ST_OK;
}

void st_world_finalize(void)
{
    if (!world_started)
        return;
    MPI_Comm_free(&world_comm);
    MPI_Finalize();
    world_started = 0;
    world_rank = 0;
    world_size = 1;
}

void st_world_abort(int code)
{
    if (world_started && world_size > 1) {
        fflush(stdout);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, code);
    }
}

st_status st_world_allgather(const void *mine, size_t bytes, void *all)
{
    if (world_size == 1) {
        memmove(all, mine, bytes);
        return ST_OK;
    }
    if (bytes > (size_t)0x7fffffff)
        return st_fail(ST_ERR_INVALID, "st_world_allgather: %zu bytes is too many", bytes);
    int rc = MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, world_comm);
    return rc == MPI_SUCCESS ? ST_OK : st_world_fail(rc, "gathering from the ranks");
}

st_status st_world_max_ints(int *v, int n)
{
    if (world_size == 1)
        return ST_OK;
    int rc = MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_INT, MPI_MAX, world_comm);
    return rc == MPI_SUCCESS ? ST_OK : st_world_fail(rc, "agreeing with the ranks");
}

static st_status sum_over_ranks(void *v, size_t n, MPI_Datatype type)
{
    if (world_size == 1)
        return ST_OK;
    if (n > (size_t)INT_MAX)
        return st_fail(ST_ERR_INVALID, "%zu values are too many to add up over the ranks", n);
    int rc = MPI_Allreduce(MPI_IN_PLACE, v, (int)n, type, MPI_SUM, world_comm);
    return rc == MPI_SUCCESS ? ST_OK : st_world_fail(rc, "adding up over the ranks");
}

st_status st_world_sum_doubles(double *v, size_t n)
{
    return sum_over_ranks(v, n, MPI_DOUBLE);
}

st_status st_world_sum_u32(uint32_t *v, size_t n)
{
    return sum_over_ranks(v, n, MPI_UINT32_T);
}

st_status st_world_allgather_range(float *v, size_t begin, size_t end)
{
    if (world_size == 1)
        return ST_OK;
    unsigned long long mine[2] = { begin, end };
    unsigned long long *all = malloc(sizeof mine * (size_t)world_size);
    int *counts = malloc(sizeof *counts * 2 * (size_t)world_size);
    if (!all || !counts) {
        free(all);
        free(counts);
        return st_fail(ST_ERR_NOMEM, "out of memory gathering from the ranks");
    }
    st_status s = ST_OK;
    int rc = MPI_Allgather(mine, 2, MPI_UNSIGNED_LONG_LONG, all, 2, MPI_UNSIGNED_LONG_LONG,
                           world_comm);
    if (rc != MPI_SUCCESS)
        s = st_world_fail(rc, "gathering from the ranks");
    for (int r = 0; r < world_size && s == ST_OK; r++) {
        if (all[2 * r + 1] < all[2 * r] || all[2 * r + 1] > (unsigned long long)INT_MAX)
            s = st_fail(ST_ERR_INVALID, "rank %d's range [%llu, %llu) cannot be gathered", r,
                        all[2 * r], all[2 * r + 1]);
        else {
            counts[r] = (int)(all[2 * r + 1] - all[2 * r]);
            counts[world_size + r] = (int)all[2 * r];
        }
    }
    if (s == ST_OK) {
        rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, v, counts, counts + world_size,
                            MPI_FLOAT, world_comm);
        if (rc != MPI_SUCCESS)
            s = st_world_fail(rc, "gathering the model from the ranks");
    }
    free(all);
    free(counts);
    return s;
}

st_status st_world_bcast(void *buf, size_t bytes, int root)
{
    if (world_size == 1)
        return ST_OK;
    if (bytes > (size_t)0x7fffffff)
        return st_fail(ST_ERR_INVALID, "st_world_bcast: %zu bytes is too many", bytes);
    int rc = MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, world_comm);
    return rc == MPI_SUCCESS ? ST_OK : st_world_fail(rc, "broadcasting to the ranks");
}

st_status st_world_barrier(void)
{
    if (world_size == 1)
        return ST_OK;
    int rc = MPI_Barrier(world_comm);
    return rc == MPI_SUCCESS ? ST_OK : st_world_fail(rc, "waiting for the ranks");
}

st_status st_world_time_exchange(size_t bytes, int rounds, double *seconds)
{
    *seconds = 0.0;
    if (world_size == 1)
        return ST_OK;
    if (bytes < 1 || bytes > (size_t)0x7fffffff || rounds < 1)
        return st_fail(ST_ERR_INVALID, "st_world_time_exchange: %zu bytes, %d rounds", bytes,
                       rounds);
    const int peers = world_size - 1;
    char *out = calloc(1, bytes), *in = calloc((size_t)peers, bytes);
    MPI_Request *req = malloc(2 * (size_t)peers * sizeof *req);
    if (!out || !in || !req) {
        free(out);
        free(in);
        free(req);
        return st_fail(ST_ERR_NOMEM, "out of memory timing the ranks' exchange");
    }
    double best = 1e30;
    int rc = MPI_SUCCESS;
    for (int round = 0; round <= rounds && rc == MPI_SUCCESS; round++) {   /* 0 warms up */
        rc = MPI_Barrier(world_comm);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int n = 0;
        for (int k = 1; k <= peers && rc == MPI_SUCCESS; k++) {
            const int from = (world_rank + world_size - k) % world_size;
            rc = MPI_Irecv(in + (size_t)(k - 1) * bytes, (int)bytes, MPI_BYTE, from, 2,
                           world_comm, &req[n++]);
        }
        for (int k = 1; k <= peers && rc == MPI_SUCCESS; k++)
            rc = MPI_Isend(out, (int)bytes, MPI_BYTE, (world_rank + k) % world_size, 2,
                           world_comm, &req[n++]);
        if (rc == MPI_SUCCESS)
            rc = MPI_Waitall(n, req, MPI_STATUSES_IGNORE);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double t = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        if (rc == MPI_SUCCESS)   /* a round lasts until its slowest rank is done */
            rc = MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, world_comm);
        if (rc == MPI_SUCCESS && round > 0 && t < best)
            best = t;
    }
    free(out);
    free(in);
    free(req);
    if (rc != MPI_SUCCESS)
        return st_world_fail(rc, "timing the ranks' exchange");
    *seconds = best;
    return ST_OK;
}

#define WORLD_PIECE ((size_t)1 << 30)   /* bytes per message: an int count */

st_status st_world_send(const void *buf, size_t bytes, int to)
{
    const char *p = buf;
    do {
        int n = (int)(bytes < WORLD_PIECE ? bytes : WORLD_PIECE);
        int rc = MPI_Send(p, n, MPI_BYTE, to, 0, world_comm);
        if (rc != MPI_SUCCESS)
            return st_world_fail(rc, "sending to another rank");
        p += n;
        bytes -= (size_t)n;
    } while (bytes > 0);
    return ST_OK;
}

st_status st_world_recv(void *buf, size_t bytes, int from)
{
    char *p = buf;
    do {
        int n = (int)(bytes < WORLD_PIECE ? bytes : WORLD_PIECE);
        int rc = MPI_Recv(p, n, MPI_BYTE, from, 0, world_comm, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return st_world_fail(rc, "receiving from another rank");
        p += n;
        bytes -= (size_t)n;
    } while (bytes > 0);
    return ST_OK;
}

#else /* !HAVE_MPI */

st_status st_world_init(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return ST_OK;
}

void st_world_finalize(void)
{
}

void st_world_abort(int code)
{
    (void)code;
}

st_status st_world_allgather(const void *mine, size_t bytes, void *all)
{
    memmove(all, mine, bytes);
    return ST_OK;
}

st_status st_world_max_ints(int *v, int n)
{
    (void)v;
    (void)n;
    return ST_OK;
}

st_status st_world_sum_doubles(double *v, size_t n)
{
    (void)v;
    (void)n;
    return ST_OK;
}

st_status st_world_sum_u32(uint32_t *v, size_t n)
{
    (void)v;
    (void)n;
    return ST_OK;
}

st_status st_world_allgather_range(float *v, size_t begin, size_t end)
{
    (void)v;
    (void)begin;
    (void)end;
    return ST_OK;
}

st_status st_world_bcast(void *buf, size_t bytes, int root)
{
    (void)buf;
    (void)bytes;
    (void)root;
    return ST_OK;
}

st_status st_world_barrier(void)
{
    return ST_OK;
}

st_status st_world_time_exchange(size_t bytes, int rounds, double *seconds)
{
    (void)bytes;
    (void)rounds;
    *seconds = 0.0;
    return ST_OK;
}

st_status st_world_send(const void *buf, size_t bytes, int to)
{
    (void)buf;
    (void)bytes;
    return st_fail(ST_ERR_INVALID, "no rank %d to send to: one process", to);
}

st_status st_world_recv(void *buf, size_t bytes, int from)
{
    (void)buf;
    (void)bytes;
    return st_fail(ST_ERR_INVALID, "no rank %d to receive from: one process", from);
}

#endif /* HAVE_MPI */

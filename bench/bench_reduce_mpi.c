/*
 * bench/bench_reduce_mpi.c — the MPI reduction backend against the
 * in-process engine and against MPI_Allreduce, in one run.
 *
 *   mpirun -np 2 --bind-to none bench/bench_reduce_mpi [--sizes 16,64,256] [--reps K]
 *                                                      [--payload fp32|bf16]
 *
 * For each gradient size P x 4 bytes, one step of data parallelism over
 * two workers, three ways, each repeated K times (default 5) in windows of
 * at least 0.25 s, alternating, the median kept:
 *
 *   mpi        2 ranks x 1 worker, ST_COMM_BACKEND_MPI: reduce-scatter
 *              and all-gather over owner shards (the step subtrain runs);
 *   allreduce  MPI_Allreduce(SUM) of the same P floats, in place (what a
 *              framework's data parallelism calls; it leaves no mean, no
 *              master shard);
 *   shared     rank 0 alone with 2 worker threads, ST_COMM_BACKEND_SHARED
 *              (rank 1 sleeps meanwhile: it polls a barrier every ms).
 *
 * Worker w (rank w, or thread w of rank 0) is pinned to CPU w.  GB/s is
 * P x 4 / step time: the gradient bytes reduced per second (each backend
 * moves a different number of bytes to do it; ratios of this figure
 * compare what a trainer gets).  The ratios mpi/shared and mpi/allreduce
 * are of the medians of the same run.  --payload bf16: both engines with
 * bf16 gradient payloads (--comm-precision bf16); `MB/rank` is what a rank
 * receives from the other per step (st_comm_bytes.cross_domain_read of
 * the MPI engine): the reduce-scatter's payloads and the all-gather's
 * fp32 masters.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>
#include <omp.h>

#include <subtrain/arena.h>
#include <subtrain/comm.h>
#include <subtrain/world.h>

static int rank, ranks;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void pin(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu % CPU_SETSIZE, &set);
    sched_setaffinity(0, sizeof set, &set);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void die(const char *what)
{
    fprintf(stderr, "bench_reduce_mpi: rank %d: %s: %s\n", rank, what, st_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Seconds per step of the MPI backend (every rank), over a window. */
static double window_mpi(st_comm *c, double min_s)
{
    double t0 = now_s(), t;
    long steps = 0;
    int go = 1;
    do {
        if (st_comm_reduce_scatter(c, 0) != ST_OK || st_comm_all_gather(c, 0) != ST_OK)
            die("MPI backend step");
        steps++;
        t = now_s() - t0;
        go = t < min_s;
        MPI_Allreduce(MPI_IN_PLACE, &go, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    } while (go);
    return t / (double)steps;
}

static double window_allreduce(float *v, size_t p, double min_s)
{
    double t0 = now_s(), t;
    long steps = 0;
    int go = 1;
    do {
        MPI_Allreduce(MPI_IN_PLACE, v, (int)p, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        steps++;
        t = now_s() - t0;
        go = t < min_s;
        MPI_Allreduce(MPI_IN_PLACE, &go, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    } while (go);
    return t / (double)steps;
}

/* Rank 0: the shared engine with 2 threads; rank 1 sleeps until it is done. */
static double window_shared(st_comm *c, double min_s)
{
    double per = 0.0;
    if (rank == 0) {
        long steps = 0;
        double t0 = now_s(), t = 0.0;
#pragma omp parallel num_threads(2)
        {
            int w = omp_get_thread_num();
            int go = 1;
            long k = 0;
            while (go) {
                if (st_comm_reduce_scatter(c, w) != ST_OK || st_comm_all_gather(c, w) != ST_OK)
                    die("shared engine step");
                k++;
                if (w == 0)
                    t = now_s() - t0;
                /* worker 0 decides; the barrier hands the decision over */
                static int stop;
                if (w == 0)
                    stop = t >= min_s;
                if (st_comm_barrier(c, w) != ST_OK)
                    die("shared engine barrier");
                go = !stop;
                if (st_comm_barrier(c, w) != ST_OK)
                    die("shared engine barrier");
            }
            if (w == 0)
                steps = k;
        }
        per = t / (double)steps;
    }
    MPI_Request req;
    MPI_Ibarrier(MPI_COMM_WORLD, &req);
    int done = 0;
    while (!done) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (!done)
            usleep(1000);
    }
    MPI_Bcast(&per, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return per;
}

int main(int argc, char **argv)
{
    if (st_world_init(&argc, &argv) != ST_OK || st_world_size() != 2) {
        fprintf(stderr, "bench_reduce_mpi: run it as mpirun -np 2 --bind-to none "
                        "bench/bench_reduce_mpi [--sizes MiB,...] [--reps K]\n");
        if (st_world_size() > 1)
            MPI_Abort(MPI_COMM_WORLD, 2);
        return 2;
    }
    rank = st_world_rank();
    ranks = st_world_size();
    int sizes[16] = { 16, 64, 256 }, n_sizes = 3, reps = 5;
    st_comm_payload payload = ST_COMM_PAYLOAD_FP32;
    double min_s = 0.25;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            n_sizes = 0;
            for (char *tok = strtok(argv[++i], ","); tok && n_sizes < 16; tok = strtok(NULL, ","))
                sizes[n_sizes++] = atoi(tok);
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--payload") == 0 && i + 1 < argc) {
            i++;
            if (strcmp(argv[i], "fp32") == 0 || strcmp(argv[i], "bf16") == 0) {
                payload = strcmp(argv[i], "bf16") == 0 ? ST_COMM_PAYLOAD_BF16
                                                       : ST_COMM_PAYLOAD_FP32;
            } else {
                if (rank == 0)
                    fprintf(stderr, "bench_reduce_mpi: --payload is fp32 or bf16, got '%s'\n",
                            argv[i]);
                MPI_Abort(MPI_COMM_WORLD, 2);
            }
        } else if (strcmp(argv[i], "--quick") == 0) {
            reps = 3;
            min_s = 0.05;
        } else {
            if (rank == 0)
                fprintf(stderr, "bench_reduce_mpi: unknown option '%s'\n", argv[i]);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (reps < 1 || reps > 101)
        reps = 5;
    for (int k = 0; k < n_sizes; k++)
        if (sizes[k] < 1 || sizes[k] > 1024) {
            if (rank == 0)
                fprintf(stderr, "bench_reduce_mpi: sizes are MiB in [1, 1024]\n");
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    pin(rank);
    if (rank == 0) {
        printf("bench_reduce_mpi: 2 workers, data parallel, one step = reduce-scatter + "
               "all-gather (allreduce: MPI_Allreduce SUM, fp32); %s gradient payloads\n",
               payload == ST_COMM_PAYLOAD_BF16 ? "bf16" : "fp32");
        printf("%8s %12s %12s %12s %10s %10s %10s\n", "MiB", "mpi GB/s", "shared GB/s",
               "allred GB/s", "mpi/shared", "mpi/allred", "MB/rank");
    }
    for (int k = 0; k < n_sizes; k++) {
        size_t p = (size_t)sizes[k] << 18;   /* floats */
        /* the MPI backend: this rank's one worker */
        st_arena *a_mpi;
        if (st_arena_create("bench", NULL, 0, &a_mpi) != ST_OK)
            die("out of memory");
        float *g = malloc(p * sizeof *g), *w = malloc(p * sizeof *w), *v = malloc(p * sizeof *v);
        if (!g || !w || !v)
            die("out of memory");
        for (size_t i = 0; i < p; i++)
            g[i] = w[i] = v[i] = (float)(i % 1000) * 1e-3f;
        st_comm_config mc = { .n_workers = 1, .n_params = p, .backend = ST_COMM_BACKEND_MPI,
                              .payload = payload };
        st_comm *cm = NULL;
        st_range all = { 0, p };
        if (st_comm_create(&mc, &cm) != ST_OK ||
            st_comm_attach(cm, 0, a_mpi, g, w, &all, 1) != ST_OK)
            die("the MPI backend");
        /* the shared engine on rank 0: two threads, their own vectors */
        st_comm *cs = NULL;
        st_arena *a_sh[2] = { NULL, NULL };
        float *gs[2] = { NULL, NULL }, *ws[2] = { NULL, NULL };
        if (rank == 0) {
            st_comm_config sc = { .n_workers = 2, .n_params = p, .payload = payload };
            if (st_comm_create(&sc, &cs) != ST_OK)
                die("the shared engine");
            int bad = 0;
#pragma omp parallel num_threads(2) reduction(| : bad)
            {
                int t = omp_get_thread_num();
                pin(t);
                gs[t] = malloc(p * sizeof(float));
                ws[t] = malloc(p * sizeof(float));
                if (st_arena_create("bench", NULL, 0, &a_sh[t]) != ST_OK || !gs[t] || !ws[t])
                    bad = 1;
                else {
                    for (size_t i = 0; i < p; i++)   /* first touch by the worker */
                        gs[t][i] = ws[t][i] = (float)(i % 1000) * 1e-3f;
                    bad = st_comm_attach(cs, t, a_sh[t], gs[t], ws[t], &all, 1) != ST_OK;
                }
            }
            if (bad)
                die("the shared engine's attach");
            pin(0);
        }
        double t_mpi[101], t_sh[101], t_ar[101];
        window_mpi(cm, min_s / 4);            /* warm-up */
        window_allreduce(v, p, min_s / 4);
        window_shared(cs, min_s / 4);
        for (int r = 0; r < reps; r++) {
            t_mpi[r] = window_mpi(cm, min_s);
            t_ar[r] = window_allreduce(v, p, min_s);
            t_sh[r] = window_shared(cs, min_s);
        }
        qsort(t_mpi, (size_t)reps, sizeof(double), cmp_double);
        qsort(t_ar, (size_t)reps, sizeof(double), cmp_double);
        qsort(t_sh, (size_t)reps, sizeof(double), cmp_double);
        double bytes = (double)p * 4.0, m = t_mpi[reps / 2], s = t_sh[reps / 2], a = t_ar[reps / 2];
        const double wire = (double)st_comm_bytes_per_step(cm, 0).cross_domain_read;
        if (rank == 0)
            printf("%8d %12.2f %12.2f %12.2f %10.2f %10.2f %10.2f\n", sizes[k], bytes / m * 1e-9,
                   bytes / s * 1e-9, bytes / a * 1e-9, s / m, a / m, wire * 1e-6);
        st_comm_destroy(cm);
        st_arena_destroy(a_mpi);
        if (rank == 0) {
            st_comm_destroy(cs);
            for (int t = 0; t < 2; t++) {
                st_arena_destroy(a_sh[t]);
                free(gs[t]);
                free(ws[t]);
            }
        }
        free(g);
        free(w);
        free(v);
    }
    st_world_finalize();
    return 0;
}

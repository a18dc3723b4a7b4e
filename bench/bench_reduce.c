/*
 * bench/bench_reduce.c — bandwidth of the reduction engine against a
 * STREAM add measured in the same run.
 *
 * What is measured.  One step of the engine = st_comm_reduce_scatter() +
 * st_comm_all_gather(), data parallel (every worker holds every element),
 * with NOTHING between the two calls (no optimizer, not even a copy: the
 * number is the collectives' own).  Gradient sizes 1, 4, 16, 64, 256 MiB
 * by default, N workers (default: one per core, from st_plan_make), each
 * pinned with st_plan_bind_self and allocating from an arena on its NUMA
 * node (st_numa_backend), as the trainer does.
 *
 * How bytes are counted.  Reduce bytes per step = the sum over workers of
 * st_comm_bytes_per_step() read + written: the engine's plan, every buffer
 * counted once per step where it is read or written (own buffers included,
 * cache-resident scratch not counted).  Data parallel on one NUMA domain
 * with N workers and P floats that is, per worker, read P x 4 (its shard
 * from N gradient vectors) and written P/N x 4 bytes with a parameter
 * vector per domain (--weights shared, as training runs; the all-gather
 * copies nothing then), and with a replica per worker (--weights private)
 * read 2P x 4 (the whole vector from the masters too) and written
 * (P + P/N) x 4 bytes.  STREAM add a[i] = b[i] + c[i] counts 12 bytes per
 * element (two reads, one write), as STREAM does.  Neither counts the
 * write-allocate reads the hardware may add: the two figures use the same
 * convention, so their ratio compares like with like.
 *
 * No cache reuse.  Each size runs k independent sets (grads, params and
 * an st_comm with its own shard buffers) and cycles through them, k chosen
 * so that the sets of all workers together exceed 256 MiB (one set from
 * 64 MiB up, with two workers); the STREAM arrays are 3 x 256 MiB (at
 * least 8 MiB per worker each).  Both run on the same threads with the same
 * binding, each thread on its own part.
 *
 * Payloads (--payload).  fp32: the engine as the trainer runs it by
 * default.  bf16: bf16 gradient payloads in buffers (each worker rounds its
 * gradient into a bf16 buffer at the reduce-scatter's entry; the owners
 * read 2 bytes per element and sum in fp32); bf16-read: the owners round
 * the fp32 gradients as they read them (no buffer).  The bytes are the
 * plan's for each (bf16: the conversion pass counted, bf16 reads at 2
 * bytes), so "reduce GB/s" is the bandwidth each achieves; "vs fp32" is
 * the step time over the fp32 row's of the same size: the saving (or the
 * cost) of the payload.  The all-gather is fp32 in every mode.
 *
 * Timing.  For each size, after a warm-up pass over every set, K
 * repetitions (default 5) alternate a STREAM window and a reduce window,
 * each at least 0.25 s (--quick: 3 x 0.05 s), so that a noisy period slows
 * both; the table shows the median of each and the ratio of the medians.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <omp.h>

#define BENCH_NAME "bench_reduce"
#include "bench_util.h"

#include <subtrain/arena.h>
#include <subtrain/comm.h>
#include <subtrain/topo.h>

#define MAX_SIZES 16
#define MAX_REPS 101
#define MIB ((size_t)1 << 20)
#define ROTATE_BYTES ((size_t)256 << 20)   /* all workers' sets together */
#define STREAM_BYTES ((size_t)256 << 20)   /* each STREAM array */

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define ST_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ST_VECTOR_CLONES
#endif

typedef struct bench_options {
    int workers;                  /* 0: one per core */
    int oversubscribe;
    size_t sizes[MAX_SIZES];      /* MiB */
    int n_sizes;
    int reps;
    int quick;
    double window_s;
    int payloads[3];              /* PAY_* in the order given */
    int n_payloads;
    int shared;                   /* a parameter vector per NUMA domain (shared_params) */
} bench_options;

enum { PAY_FP32, PAY_BF16, PAY_BF16_READ };
static const char *const payload_names[] = { "fp32", "bf16", "bf16-read" };

typedef struct size_result {
    size_t mib;
    int payload;                  /* PAY_* */
    int sets;
    size_t bytes_step;            /* all workers, read + written */
    size_t worker_bytes;          /* the busiest worker's read + written */
    size_t cross_bytes;           /* all workers' cross-domain reads */
    double step_s[MAX_REPS], reduce_gbs[MAX_REPS], stream_gbs[MAX_REPS];
} size_result;

/* Shared by the workers of the parallel region. */
typedef struct bench_shared {
    const bench_options *o;
    int n;
    st_topology *topo;            /* NULL: unbound, default arenas */
    st_plan plan;
    int *domain_of;
    int n_domains;
    st_comm **comms;              /* k per size */
    float **shared_prm;           /* --weights shared: [k n_domains + d], set k's
                                   * vector of domain d (its first worker's) */
    int sets;
    size_t stream_n;              /* floats per worker per STREAM array */
    long stream_passes, steps;    /* per window, decided by worker 0 */
    double t_calib;
    size_result *res;
    st_numa_ctx **numa;           /* n (NULL: unbound) */
    atomic_int failed;
} bench_shared;

static double median(const double *v, int n)
{
    double t[MAX_REPS];
    memcpy(t, v, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* A failure at run time: one line, exit status 1 (the first thread to fail
 * prints; the process ends with it). */
static void die(bench_shared *s, const char *what, const char *msg)
{
    if (atomic_exchange(&s->failed, 1) == 0) {
        fprintf(stderr, "bench_reduce: %s: %s\n", what, msg);
        fflush(stderr);
    }
    exit(EXIT_FAILURE);
}

ST_VECTOR_CLONES
static void stream_add(float *restrict a, const float *restrict b, const float *restrict c,
                       size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        a[i] = b[i] + c[i];
}

/* ------------------------------------------------------------ the region */

static void worker(bench_shared *s, int w)
{
    const bench_options *o = s->o;
    st_chunk_backend backend, *bk = NULL;
    if (s->topo) {
        if (st_plan_bind_self(s->topo, &s->plan, w) != ST_OK)
            die(s, "binding", st_last_error());
        if (st_numa_ctx_create(s->topo, s->plan.workers[w].numa_os, &s->numa[w]) != ST_OK)
            die(s, "NUMA backend", st_last_error());
        backend = st_numa_backend(s->numa[w]);
        bk = &backend;
    }
    /* STREAM arrays: this worker's part of each, on its node */
    st_arena *sa;
    float *a, *b, *c;
    if (st_arena_create("stream", bk, 0, &sa) != ST_OK ||
        st_arena_alloc_floats(sa, ST_MEM_WORKSPACE, s->stream_n, &a) != ST_OK ||
        st_arena_alloc_floats(sa, ST_MEM_WORKSPACE, s->stream_n, &b) != ST_OK ||
        st_arena_alloc_floats(sa, ST_MEM_WORKSPACE, s->stream_n, &c) != ST_OK)
        die(s, "STREAM arrays", st_last_error());
    for (size_t i = 0; i < s->stream_n; i++) {
        b[i] = (float)(i % 1000);
        c[i] = 0.5f;
    }

    for (int z = 0; z < o->n_sizes * o->n_payloads; z++) {
        size_result *r = &s->res[z];
        size_t p = r->mib * MIB / sizeof(float);
#pragma omp single
        {
            /* k sets: all workers' grads + params over the rotation exceed
             * ROTATE_BYTES */
            size_t per_set = (size_t)s->n * 2 * r->mib * MIB;
            s->sets = (int)((ROTATE_BYTES + per_set - 1) / per_set);
            if (s->sets < 1)
                s->sets = 1;
            r->sets = s->sets;
            s->comms = calloc((size_t)s->sets, sizeof *s->comms);
            s->shared_prm = calloc((size_t)s->sets * (size_t)s->n_domains,
                                   sizeof *s->shared_prm);
            if (!s->comms || !s->shared_prm)
                die(s, "memory", "out of memory");
            st_comm_config cfg = { .n_workers = s->n, .n_params = p, .domain_of = s->domain_of,
                                   .roles = 0, .shared_params = o->shared };
            if (r->payload != PAY_FP32) {
                cfg.payload = ST_COMM_PAYLOAD_BF16;
                cfg.bf16_at = r->payload == PAY_BF16 ? ST_COMM_BF16_BUFFER : ST_COMM_BF16_ON_READ;
            }
            for (int k = 0; k < s->sets; k++)
                if (st_comm_create(&cfg, &s->comms[k]) != ST_OK)
                    die(s, "st_comm_create", st_last_error());
        }
        int k_sets = s->sets;
        st_arena *da;
        if (st_arena_create("data", bk, 64 * MIB, &da) != ST_OK)
            die(s, "buffers", st_last_error());
        st_range all = { 0, p };
        /* --weights shared: a domain's first worker takes its vector, on
         * its node; the domain's workers attach that one */
        const int d = s->domain_of[w];
        const int first = w == 0 || s->domain_of[w - 1] != d;
        float **g = malloc((size_t)k_sets * sizeof *g);
        if (!g)
            die(s, "memory", "out of memory");
        for (int k = 0; k < k_sets; k++) {
            float *prm = NULL;
            if (st_arena_alloc_floats(da, ST_MEM_GRADIENTS, p, &g[k]) != ST_OK ||
                ((!o->shared || first) &&
                 st_arena_alloc_floats(da, ST_MEM_WEIGHTS, p, &prm) != ST_OK))
                die(s, "buffers", st_last_error());
            for (size_t i = 0; i < p; i++) {
                g[k][i] = (float)((i + (size_t)w) % 97) * 0.01f;
                if (prm)
                    prm[i] = 1.0f;
            }
            if (o->shared && first)
                s->shared_prm[(size_t)k * (size_t)s->n_domains + (size_t)d] = prm;
            if (!o->shared && st_comm_attach(s->comms[k], w, da, g[k], prm, &all, 1) != ST_OK)
                die(s, "st_comm_attach", st_last_error());
        }
        if (o->shared) {
#pragma omp barrier
            for (int k = 0; k < k_sets; k++)
                if (st_comm_attach(s->comms[k], w, da, g[k],
                                   s->shared_prm[(size_t)k * (size_t)s->n_domains + (size_t)d],
                                   &all, 1) != ST_OK)
                    die(s, "st_comm_attach", st_last_error());
        }
        free(g);
        /* warm-up, and the length of a window */
        double t0 = now_s();
        stream_add(a, b, c, s->stream_n);
#pragma omp barrier
        double t1 = now_s();
        for (int k = 0; k < k_sets; k++)
            if (st_comm_reduce_scatter(s->comms[k], w) != ST_OK ||
                st_comm_all_gather(s->comms[k], w) != ST_OK)
                die(s, "warm-up", st_last_error());
#pragma omp barrier
        double t2 = now_s();
#pragma omp single
        {
            double st = t1 - t0 > 1e-6 ? t1 - t0 : 1e-6;
            double rt = (t2 - t1) / k_sets > 1e-7 ? (t2 - t1) / k_sets : 1e-7;
            s->stream_passes = (long)(o->window_s / st) + 1;
            long rounds = (long)(o->window_s / (rt * k_sets)) + 1;
            s->steps = rounds * k_sets;
            r->bytes_step = 0;
            r->worker_bytes = 0;
            r->cross_bytes = 0;
            for (int v = 0; v < s->n; v++) {
                st_comm_bytes by = st_comm_bytes_per_step(s->comms[0], v);
                r->bytes_step += by.read + by.written;
                r->cross_bytes += by.cross_domain_read;
                if (by.read + by.written > r->worker_bytes)
                    r->worker_bytes = by.read + by.written;
            }
        }
        for (int rep = 0; rep < o->reps; rep++) {
            /* STREAM window */
#pragma omp barrier
            t0 = now_s();
            for (long i = 0; i < s->stream_passes; i++)
                stream_add(a, b, c, s->stream_n);
#pragma omp barrier
            t1 = now_s();
            /* reduce window: rotate through the sets */
            for (long i = 0; i < s->steps; i++) {
                st_comm *cm = s->comms[i % k_sets];
                if (st_comm_reduce_scatter(cm, w) != ST_OK || st_comm_all_gather(cm, w) != ST_OK)
                    die(s, "reduction", st_last_error());
            }
#pragma omp barrier
            t2 = now_s();
            if (w == 0) {
                double sbytes = 3.0 * sizeof(float) * (double)s->stream_n * s->n *
                                (double)s->stream_passes;
                r->stream_gbs[rep] = sbytes / (t1 - t0) / 1e9;
                r->step_s[rep] = (t2 - t1) / (double)s->steps;
                r->reduce_gbs[rep] = (double)r->bytes_step / r->step_s[rep] / 1e9;
            }
        }
        /* the arena holds the comms' shard buffers: destroy them first */
#pragma omp barrier
#pragma omp single
        {
            for (int k = 0; k < k_sets; k++)
                st_comm_destroy(s->comms[k]);
            free(s->comms);
            free(s->shared_prm);
            s->comms = NULL;
            s->shared_prm = NULL;
        }
        st_arena_destroy(da);
    }
    /* a[] is the STREAM output; reading one value keeps the adds alive */
    if (a[s->stream_n / 2] < -1.0f)
        fprintf(stderr, "?");
    st_arena_destroy(sa);
}

/* ------------------------------------------------------------ main */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: bench_reduce [--workers N] [--oversubscribe] [--sizes LIST] [--reps K]\n"
            "                    [--payload LIST] [--weights shared|private] [--quick]\n"
            "\n"
            "Bandwidth of subtrain's reduction engine (reduce-scatter + all-gather, data\n"
            "parallel, nothing between them) against a STREAM add (a = b + c) on the same\n"
            "threads with the same binding, measured in the same run.  Bytes: the sum over\n"
            "workers of st_comm_bytes_per_step (read + written) per second; STREAM: 12\n"
            "bytes per element.  Buffers rotate so that no window reuses the cache.\n"
            "\n"
            "  --workers N       workers (default: one per core of this machine)\n"
            "  --oversubscribe   allow more workers than PUs (they then share PUs and\n"
            "                    spin against each other: the numbers mean little)\n"
            "  --sizes LIST      gradient sizes in MiB, comma-separated (default\n"
            "                    1,4,16,64,256)\n"
            "  --reps K          windows of each kind; the median is shown (default 5,\n"
            "                    max %d)\n"
            "  --payload LIST    gradient payloads, comma-separated: fp32, bf16 (bf16\n"
            "                    buffers), bf16-read (rounded as read); one row each\n"
            "                    per size (default fp32,bf16,bf16-read)\n"
            "  --weights W       shared (default): the workers of a NUMA domain attach one\n"
            "                    parameter vector, as training does (the all-gather copies\n"
            "                    between domains only); private: a replica per worker\n"
            "  --quick           3 short windows (numbers are rough)\n"
            "  --help            this text\n", MAX_REPS);
}

static int parse_sizes(const char *v, bench_options *o)
{
    o->n_sizes = 0;
    const char *p = v;
    while (1) {
        char *end;
        errno = 0;
        long m = strtol(p, &end, 10);
        if (end == p || errno || m < 1 || m > 65536 || (*end != ',' && *end != '\0'))
            return -1;
        if (o->n_sizes == MAX_SIZES)
            return -1;
        o->sizes[o->n_sizes++] = (size_t)m;
        if (*end == '\0')
            return 0;
        p = end + 1;
    }
}

static int parse_payloads(const char *v, bench_options *o)
{
    o->n_payloads = 0;
    const char *p = v;
    while (1) {
        size_t len = strcspn(p, ",");
        int k = -1;
        for (int j = 0; j < 3; j++)
            if (strlen(payload_names[j]) == len && strncmp(p, payload_names[j], len) == 0)
                k = j;
        if (k < 0)
            return -1;
        for (int j = 0; j < o->n_payloads; j++)
            if (o->payloads[j] == k)
                return -1;
        o->payloads[o->n_payloads++] = k;
        if (p[len] == '\0')
            return 0;
        p += len + 1;
    }
}

static const char *fmt_mib(size_t bytes, char *buf, size_t n)
{
    snprintf(buf, n, "%.2f MiB", (double)bytes / (double)MIB);
    return buf;
}

int main(int argc, char **argv)
{
    bench_options o = { .workers = 0, .sizes = { 1, 4, 16, 64, 256 }, .n_sizes = 5, .reps = 5,
                        .payloads = { PAY_FP32, PAY_BF16, PAY_BF16_READ }, .n_payloads = 3,
                        .shared = 1 };
    int reps_given = 0;
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return EXIT_SUCCESS;
        } else if (strcmp(argv[i], "--quick") == 0) {
            o.quick = 1;
        } else if (strcmp(argv[i], "--oversubscribe") == 0) {
            o.oversubscribe = 1;
        } else if ((v = option_value(argc, argv, &i, "--workers", &missing))) {
            char *end;
            long n = strtol(v, &end, 10);
            if (end == v || *end != '\0' || n < 1 || n > 4096)
                return usage_error("--workers must be an integer in [1, 4096], got '%s'", v);
            o.workers = (int)n;
        } else if ((v = option_value(argc, argv, &i, "--sizes", &missing))) {
            if (parse_sizes(v, &o) != 0)
                return usage_error("--sizes must be up to 16 comma-separated integers of MiB in "
                                   "[1, 65536], got '%s'", v);
        } else if ((v = option_value(argc, argv, &i, "--payload", &missing))) {
            if (parse_payloads(v, &o) != 0)
                return usage_error("--payload must be a comma-separated list of distinct fp32, "
                                   "bf16, bf16-read, got '%s'", v);
        } else if ((v = option_value(argc, argv, &i, "--weights", &missing))) {
            if (strcmp(v, "shared") != 0 && strcmp(v, "private") != 0)
                return usage_error("--weights must be shared or private, got '%s'", v);
            o.shared = strcmp(v, "shared") == 0;
        } else if ((v = option_value(argc, argv, &i, "--reps", &missing))) {
            char *end;
            long n = strtol(v, &end, 10);
            if (end == v || *end != '\0' || n < 1 || n > MAX_REPS)
                return usage_error("--reps must be an integer in [1, 101], got '%s'", v);
            o.reps = (int)n;
            reps_given = 1;
        } else if (missing) {
            return usage_error("%s needs a value", argv[i]);
        } else {
            return usage_error("unknown option '%s'", argv[i]);
        }
    }
    if (o.quick && !reps_given)
        o.reps = 3;
    o.window_s = o.quick ? 0.05 : 0.25;

    bench_shared s;
    memset(&s, 0, sizeof s);
    s.o = &o;
    atomic_init(&s.failed, 0);
    const char *placement = "";
    char why[600] = "";
    if (st_topology_load(NULL, &s.topo) != ST_OK) {
        snprintf(why, sizeof why, "%s", st_last_error());
        s.topo = NULL;
    } else {
        st_plan_request req = { .workers = o.workers, .oversubscribe = o.oversubscribe };
        if (st_plan_make(s.topo, &req, &s.plan) != ST_OK) {
            fprintf(stderr, "bench_reduce: placement: %s\n", st_last_error());
            st_topology_destroy(s.topo);
            return EXIT_FAILURE;
        }
    }
    if (s.topo) {
        s.n = s.plan.n_workers;
        s.n_domains = s.plan.n_domains;
        placement = "pinned one per core (st_plan_bind_self), arenas on each worker's NUMA "
                    "node (st_numa_backend)";
    } else {
        s.n = o.workers ? o.workers : omp_get_num_procs();
        s.n_domains = 1;
        placement = "NOT pinned, default arenas (the topology could not be loaded)";
    }
    s.domain_of = calloc((size_t)s.n, sizeof *s.domain_of);
    s.numa = calloc((size_t)s.n, sizeof *s.numa);
    int n_res = o.n_sizes * o.n_payloads;
    s.res = calloc((size_t)n_res, sizeof *s.res);
    if (!s.domain_of || !s.numa || !s.res) {
        fprintf(stderr, "bench_reduce: out of memory\n");
        return EXIT_FAILURE;
    }
    for (int w = 0; s.topo && w < s.n; w++)
        s.domain_of[w] = s.plan.workers[w].domain;
    for (int z = 0; z < n_res; z++) {   /* each size, its payloads in a row */
        s.res[z].mib = o.sizes[z / o.n_payloads];
        s.res[z].payload = o.payloads[z % o.n_payloads];
    }
    s.stream_n = STREAM_BYTES / sizeof(float) / (size_t)s.n;
    if (s.stream_n < 8 * MIB / sizeof(float))
        s.stream_n = 8 * MIB / sizeof(float);

    char b1[32], b2[32];
    printf("bench_reduce: reduce-scatter + all-gather (data parallel, no optimizer between) "
           "against a STREAM add\n");
    printf("workers %d, %d NUMA domain%s, %s%s%s; %s\n", s.n, s.n_domains,
           s.n_domains == 1 ? "" : "s", placement, *why ? ": " : "", why,
           o.shared ? "weights: a vector per NUMA domain (shared)"
                    : "weights: a replica per worker (private)");
    printf("bytes: reduce = sum over workers of st_comm_bytes_per_step read + written (the plan); "
           "STREAM = 12 bytes per element (2 reads, 1 write); write-allocate counted in neither\n");
    printf("no cache reuse: k rotating sets (grads, params, st_comm) with all workers' sets "
           "> %s; STREAM arrays 3 x %s\n", fmt_mib(ROTATE_BYTES, b1, sizeof b1),
           fmt_mib(s.stream_n * sizeof(float) * (size_t)s.n, b2, sizeof b2));
    printf("%d windows of each kind, alternating, >= %.2f s each; medians\n", o.reps, o.window_s);
    fflush(stdout);

#pragma omp parallel num_threads(s.n)
    {
        if (omp_get_num_threads() != s.n)
            die(&s, "OpenMP", "could not start one thread per worker");
        worker(&s, omp_get_thread_num());
    }
    for (int w = 0; s.topo && w < s.n; w++)
        if (st_numa_warning(s.numa[w])) {
            printf("note: %s\n", st_numa_warning(s.numa[w]));
            break;
        }

    printf("\n%8s %-9s %5s %14s %10s %12s %12s %7s %8s %16s %16s\n", "grads", "payload", "sets",
           "bytes/step", "step ms", "reduce GB/s", "STREAM GB/s", "ratio", "vs fp32",
           "per worker", "ring per worker");
    for (int z = 0; z < n_res; z++) {
        size_result *r = &s.res[z];
        double rg = median(r->reduce_gbs, o.reps), sg = median(r->stream_gbs, o.reps);
        double ms = median(r->step_s, o.reps) * 1e3;
        char sz[16], bs[32], pw[32], rw[32], vs[16] = "-";
        for (int y = z - z % o.n_payloads; y < z - z % o.n_payloads + o.n_payloads; y++)
            if (s.res[y].payload == PAY_FP32)
                snprintf(vs, sizeof vs, "%.3f", ms / (median(s.res[y].step_s, o.reps) * 1e3));
        snprintf(sz, sizeof sz, "%zu MiB", r->mib);
        fmt_mib(r->bytes_step, bs, sizeof bs);
        fmt_mib(r->worker_bytes, pw, sizeof pw);
        fmt_mib((size_t)st_comm_ring_bytes(s.n, r->mib * MIB / sizeof(float)), rw, sizeof rw);
        printf("%8s %-9s %5d %14s %10.3f %12.2f %12.2f %7.3f %8s %16s %16s\n", sz,
               payload_names[r->payload], r->sets, bs, ms, rg, sg, rg / sg, vs, pw, rw);
    }
    int cross = 0;
    for (int z = 0; z < n_res; z++)
        cross |= s.res[z].cross_bytes > 0;
    if (cross) {
        printf("\ncross-domain reads per step (all workers):");
        for (int z = 0; z < n_res; z++)
            printf(" %zu MiB %s: %s;", s.res[z].mib, payload_names[s.res[z].payload],
                   fmt_mib(s.res[z].cross_bytes, b1, sizeof b1));
        printf("\n");
    }
    printf("\nratio = reduce GB/s / STREAM GB/s (medians); vs fp32 = step time / the fp32 row's "
           "(same size); per worker = the busiest worker's bytes per step; ring = 2 (N-1)/N x P "
           "x 4, what a ring all-reduce sends per worker\n");
    printf("payloads: fp32; bf16 = each worker rounds its gradient into a bf16 buffer (counted: "
           "read 4, write 2 bytes an element), owners read 2 bytes an element, sum in fp32; "
           "bf16-read = owners round the fp32 gradients as they read them; all-gather fp32\n");

    if (s.topo) {
        st_plan_free(&s.plan);
        st_topology_destroy(s.topo);
    }
    free(s.domain_of);
    for (int w = 0; w < s.n; w++)
        st_numa_ctx_destroy(s.numa[w]);
    free(s.numa);
    free(s.res);
    return EXIT_SUCCESS;
}

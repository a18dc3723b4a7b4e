/*
 * cli/calibration.c — the calibration file (calibration.h) and
 * `subtrain calibrate`, which measures this machine's rates.
 *
 * Each rate is the best of several timed repetitions after a warm-up, on
 * the calling thread alone (OpenMP nthreads 1, as a worker runs): a
 * neighbour's burst can only make a repetition slower, so the best is the
 * machine's rate.
 */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <oneapi/dnnl/dnnl.h>

#include <subtrain/layer_timing.h>
#include <subtrain/subtrain.h>

#include "cli/calibration.h"
#include "cli/cli_util.h"

#define CMD "subtrain calibrate"

/* ------------------------------------------------------------ the file */

typedef struct cal_key {
    const char *name;
    size_t offset;
} cal_key;

#define AT(field) offsetof(st_calibration, field)
static const cal_key keys[] = {
    { "matmul_fp32_small_gflops", AT(matmul_gflops[0][0]) },
    { "matmul_fp32_large_gflops", AT(matmul_gflops[0][1]) },
    { "matmul_bf16_small_gflops", AT(matmul_gflops[1][0]) },
    { "matmul_bf16_large_gflops", AT(matmul_gflops[1][1]) },
    { "conv_fp32_gflops", AT(conv_gflops[0]) },
    { "conv_bf16_gflops", AT(conv_gflops[1]) },
    { "elementwise_gbps", AT(elementwise_gbps) },
    { "reduce_gbps", AT(reduce_gbps) },
    { "stream_triad_gbps", AT(stream_gbps) },
};
#define N_KEYS (sizeof keys / sizeof *keys)

static double *rate_of(st_calibration *c, size_t k)
{
    return (double *)((char *)c + keys[k].offset);
}

void st_calibration_write(FILE *f, const st_calibration *c)
{
    fprintf(f, "# subtrain calibration: one thread's rates (calibration.h, doc/planning.md)\n");
    fprintf(f, "format 1\nmachine %s\nisa %s\n", c->machine, c->isa);
    for (size_t k = 0; k < N_KEYS; k++)
        fprintf(f, "%s %.4g\n", keys[k].name, *rate_of((st_calibration *)c, k));
}

int st_calibration_read(const char *path, st_calibration *out, char *err, size_t n)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (!f)
        return st_cli_fail(err, n, "cannot open it: %s", strerror(errno));
    char line[512];
    int lineno = 0, format = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        lineno++;
        line[strcspn(line, "\r\n")] = '\0';
        char *p = line + strspn(line, " \t");
        if (*p == '\0' || *p == '#')
            continue;
        char *val = p + strcspn(p, " \t");
        if (*val)
            *val++ = '\0';
        val += strspn(val, " \t");
        if (strcmp(p, "machine") == 0) {
            snprintf(out->machine, sizeof out->machine, "%s", val);
            continue;
        }
        if (strcmp(p, "isa") == 0) {
            snprintf(out->isa, sizeof out->isa, "%s", val);
            continue;
        }
        double v;
        if (strcmp(p, "format") == 0) {
            if (strcmp(val, "1") != 0)
                rc = st_cli_fail(err, n, "line %d: format '%s', expected 1", lineno,
                                 ST_CLI_SHOW(val));
            format = 1;
            continue;
        }
        size_t k = 0;
        while (k < N_KEYS && strcmp(keys[k].name, p) != 0)
            k++;
        if (k == N_KEYS)
            rc = st_cli_fail(err, n, "line %d: unknown key '%s'", lineno, ST_CLI_SHOW(p));
        else if (st_cli_parse_real(keys[k].name, val, '[', 0.0, 1e9, ']', 0, &v, err, n) != 0)
            rc = st_cli_fail(err, n, "line %d: %s %s: expected a rate in [0, 1e9]", lineno,
                             keys[k].name, ST_CLI_SHOW(val));
        else
            *rate_of(out, k) = v;
    }
    if (rc == 0 && ferror(f))
        rc = st_cli_fail(err, n, "reading it failed");
    if (rc == 0 && !format)
        rc = st_cli_fail(err, n, "no 'format 1' line: not a calibration file");
    fclose(f);
    return rc;
}

double st_calibration_compute_rate(const st_calibration *c, int conv, int bf16, int width)
{
    if (conv)
        return c->conv_gflops[bf16 ? 1 : 0];
    return c->matmul_gflops[bf16 ? 1 : 0][width > 512];
}

/* ------------------------------------------------------------ measuring */

/* Timed rounds of each rate, the first a warm-up: many short ones, so
 * that on a shared machine some fall in a quiet moment. */
#define ROUNDS 40

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The best seconds of one call of a (M x K) x (K x N) matmul of data type
 * dt (the output fp32), over a few repetitions of `reps` calls; 0 when
 * oneDNN has no such matmul. */
static double time_matmul(dnnl_engine_t eng, dnnl_stream_t stream, int64_t M, int64_t K,
                          int64_t N, dnnl_data_type_t dt, int reps)
{
    dnnl_dims_t ad = { M, K }, bd = { K, N }, cd = { M, N };
    dnnl_memory_desc_t a, b, c;
    dnnl_matmul_desc_t d;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_memory_t ma = NULL, mb = NULL, mc = NULL;
    double best = 0.0;
    if (dnnl_memory_desc_init_by_tag(&a, 2, ad, dt, dnnl_ab) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&b, 2, bd, dt, dnnl_ab) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&c, 2, cd, dnnl_f32, dnnl_ab) != dnnl_success ||
        dnnl_matmul_desc_init(&d, &a, &b, NULL, &c) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &d, NULL, eng, NULL) != dnnl_success ||
        dnnl_primitive_create(&prim, pd) != dnnl_success ||
        dnnl_memory_create(&ma, &a, eng, DNNL_MEMORY_ALLOCATE) != dnnl_success ||
        dnnl_memory_create(&mb, &b, eng, DNNL_MEMORY_ALLOCATE) != dnnl_success ||
        dnnl_memory_create(&mc, &c, eng, DNNL_MEMORY_ALLOCATE) != dnnl_success)
        goto done;
    void *h;
    dnnl_memory_get_data_handle(ma, &h);
    memset(h, 0, dnnl_memory_desc_get_size(&a));
    dnnl_memory_get_data_handle(mb, &h);
    memset(h, 0, dnnl_memory_desc_get_size(&b));
    dnnl_exec_arg_t args[3] = { { DNNL_ARG_SRC, ma }, { DNNL_ARG_WEIGHTS, mb },
                                { DNNL_ARG_DST, mc } };
    best = 1e30;
    for (int round = 0; round < ROUNDS; round++) {
        const double t0 = now_s();
        for (int r = 0; r < reps; r++)
            if (dnnl_primitive_execute(prim, stream, 3, args) != dnnl_success) {
                best = 0.0;
                goto done;
            }
        dnnl_stream_wait(stream);
        const double t = (now_s() - t0) / reps;
        if (round > 0 && t < best)   /* round 0 warms up */
            best = t;
    }
done:
    dnnl_memory_destroy(ma);
    dnnl_memory_destroy(mb);
    dnnl_memory_destroy(mc);
    if (prim)
        dnnl_primitive_destroy(prim);
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    return best;
}

/* Best bytes a second of one of three loops over n floats: 0 the
 * element-wise y = a x + y, 1 the reduction's d = (s1 + s2) / 2, 2
 * STREAM's triad a = b + s c. */
static double time_loop(int which, size_t n, int reps)
{
    float *x = aligned_alloc(64, n * sizeof *x), *y = aligned_alloc(64, n * sizeof *y);
    float *z = aligned_alloc(64, n * sizeof *z);
    double best = 1e30;
    if (!x || !y || !z) {
        best = 0.0;
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)(i & 255) * 0.5f;
        y[i] = 1.0f;
        z[i] = 2.0f;
    }
    for (int round = 0; round < ROUNDS; round++) {
        const double t0 = now_s();
        for (int r = 0; r < reps; r++) {
            const float s = 1.0f + 1e-7f * (float)r;
            if (which == 0)
                for (size_t i = 0; i < n; i++)
                    y[i] = s * x[i] + y[i];
            else if (which == 1)
                for (size_t i = 0; i < n; i++)
                    z[i] = (x[i] + y[i]) * 0.5f;
            else
                for (size_t i = 0; i < n; i++)
                    x[i] = y[i] + s * z[i];
        }
        const double t = (now_s() - t0) / reps;
        if (round > 0 && t < best)
            best = t;
    }
    /* a value out of the loops, so that none is optimised away */
    if (x[n / 2] + y[n / 3] + z[n / 5] == -1.0f)
        best *= 1.0;
done:
    free(x);
    free(y);
    free(z);
    return best > 0.0 ? 3.0 * (double)n * sizeof(float) / best : 0.0;
}

int st_calibration_measure(st_calibration *out, char *err, size_t n)
{
    memset(out, 0, sizeof *out);
    char host[64] = "";
    gethostname(host, sizeof host - 1);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(out->machine, sizeof out->machine, "%s, %ld CPUs online", host, cpus);
    snprintf(out->isa, sizeof out->isa, "%s", st_cpu_isa_name());
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    if (dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success)
        return st_cli_fail(err, n, "oneDNN: cannot create a CPU engine");
    if (dnnl_stream_create(&stream, eng, dnnl_stream_default_flags) != dnnl_success) {
        dnnl_engine_destroy(eng);
        return st_cli_fail(err, n, "oneDNN: cannot create a stream");
    }
    const int64_t shape[2][3] = { { 128, 256, 256 }, { 256, 1024, 1024 } };
    const dnnl_data_type_t types[2] = { dnnl_f32, dnnl_bf16 };
    for (int t = 0; t < 2; t++)
        for (int s = 0; s < 2; s++) {
            const double flop = 2.0 * (double)shape[s][0] * (double)shape[s][1] *
                                (double)shape[s][2];
            const double sec = time_matmul(eng, stream, shape[s][0], shape[s][1], shape[s][2],
                                           types[t], s ? 1 : 10);
            out->matmul_gflops[t][s] = sec > 0.0 ? flop / sec / 1e9 : 0.0;
        }
    dnnl_stream_destroy(stream);
    dnnl_engine_destroy(eng);
    const st_conv_shape cs = { .batch = 32, .ic = 16, .ih = 32, .iw = 32, .oc = 16,
                               .kh = 3, .kw = 3, .stride = 1, .pad = 1 };
    for (int b = 0; b < 2; b++) {
        st_conv_timing ct;
        if (b && st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
            continue;
        if (st_time_conv(&cs, 1, b, 20, &ct) == ST_OK && ct.layer_ms > 0.0)
            out->conv_gflops[b] = 3.0 * 2.0 * (double)(cs.batch * cs.oc * 32 * 32) *
                                  (double)(cs.ic * cs.kh * cs.kw) / (ct.layer_ms * 1e-3) / 1e9;
    }
    out->elementwise_gbps = time_loop(0, (size_t)1 << 18, 10) / 1e9;
    out->reduce_gbps = time_loop(1, (size_t)1 << 20, 2) / 1e9;
    out->stream_gbps = time_loop(2, (size_t)1 << 24, 1) / 1e9;
    return 0;
}

/* ------------------------------------------------------------ the command */

static void print_help(FILE *f)
{
    fputs(
"Usage: subtrain calibrate [-o FILE]\n"
"Measure this machine's rates on one thread (matmul and convolution GFLOP/s\n"
"in fp32 and bf16, element-wise, reduction and STREAM triad GB/s) and write\n"
"them as a calibration file for 'subtrain plan --calibration FILE'.\n"
"\n"
"  -o, --output FILE   write the file there (default: standard output)\n"
"  -h, --help          this text\n"
"\n"
"Exit status: 0 success, 1 runtime failure, 2 bad usage.\n", f);
}

typedef struct cal_options {
    const char *output;
    int help;
} cal_options;

static int apply(int c, const char *arg, void *ctx)
{
    cal_options *o = ctx;
    if (c == 'h')
        o->help = 1;
    else if (c == 'o')
        o->output = arg;
    return 0;
}

int st_cli_calibrate_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "output", required_argument, NULL, 'o' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    cal_options o = { 0 };
    if (st_cli_parse_args(argc, argv, "ho:", longopts, CMD, apply, &o) != 0)
        return 2;
    if (o.help) {
        print_help(stdout);
        return 0;
    }
    FILE *f = o.output ? fopen(o.output, "w") : stdout;
    if (!f) {
        st_cli_error(CMD, "--output %s: cannot create it: %s", ST_CLI_SHOW(o.output),
                     strerror(errno));
        return 1;
    }
    omp_set_num_threads(1);
    st_calibration c;
    char err[512];
    int rc = st_calibration_measure(&c, err, sizeof err);
    if (rc != 0)
        st_cli_error(CMD, "%s", err);
    else
        st_calibration_write(f, &c);
    if (f != stdout && fclose(f) != 0 && rc == 0) {
        st_cli_error(CMD, "--output %s: writing it failed", ST_CLI_SHOW(o.output));
        rc = -1;
    }
    return rc == 0 ? 0 : 1;
}

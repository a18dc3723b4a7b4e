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
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <oneapi/dnnl/dnnl.h>

#include <subtrain/layer_timing.h>
#include <subtrain/subtrain.h>

#include "cli/calibration.h"
#include "cli/cli_util.h"
#include "cli/out_file.h"
#include "core/file.h"

#define CMD "subtrain calibrate"

/* ------------------------------------------------------------ the file */

/* Every rate's key and where it goes: the grid's names are made once. */
typedef struct cal_key {
    char name[40];
    size_t offset;
} cal_key;

#define N_KEYS (2 * ST_OPERANDS_COUNT * ST_CAL_DIMS * ST_CAL_DIMS * ST_CAL_DIMS + ST_CAL_PASSES + \
                2 * (ST_OP_COUNT - 1) + 4 + 18 + ST_CAL_TEAMS * (2 * ST_CAL_DIMS + 2))
static cal_key keys[N_KEYS];
static const char *const pass_names[ST_CAL_PASSES] = { "16k", "256k", "4m", "64m" };
static const char *const operand_names[ST_OPERANDS_COUNT] = { "nn", "nt", "tn" };
static const char *const op_names[ST_OP_COUNT] = { NULL, "relu", "gelu", "layernorm", "softmax",
                                                   "logsoftmax", "batchnorm" };

static int dim_of(int i)
{
    return ST_CAL_DIM0 << (2 * i);
}

static void make_keys(void)
{
    if (keys[0].name[0])
        return;
    size_t k = 0;
#define KEY(field, at, ...)                                                    \
    do {                                                                       \
        if (k == N_KEYS)   /* N_KEYS counts fewer than listed here */          \
            abort();                                                           \
        snprintf(keys[k].name, sizeof keys[k].name, __VA_ARGS__);              \
        keys[k++].offset = offsetof(st_calibration, field) + (at) * sizeof(double); \
    } while (0)
    KEY(cpus, 0, "cpus");
    for (int t = 0; t < 2; t++)
        for (int o = 0; o < ST_OPERANDS_COUNT; o++)
            for (int i = 0; i < ST_CAL_DIMS; i++)
                for (int j = 0; j < ST_CAL_DIMS; j++)
                    for (int l = 0; l < ST_CAL_DIMS; l++)
                        KEY(matmul_gflops,
                            (((t * ST_OPERANDS_COUNT + o) * ST_CAL_DIMS + i) * ST_CAL_DIMS + j) *
                                    ST_CAL_DIMS + l,
                            "matmul_%s_%s_m%d_n%d_k%d_gflops", t ? "bf16" : "fp32",
                            operand_names[o], dim_of(i), dim_of(j), dim_of(l));
    KEY(conv_gflops, 0, "conv_fp32_gflops");
    KEY(conv_gflops, 1, "conv_bf16_gflops");
    KEY(chain, 0, "chain_fp32");
    KEY(chain, 1, "chain_bf16");
    KEY(chain_wide, 0, "chain_wide_fp32");
    KEY(chain_wide, 1, "chain_wide_bf16");
    KEY(chain_all, 0, "chain_all_fp32");
    KEY(chain_all, 1, "chain_all_bf16");
    KEY(attention, 0, "attention_fp32");
    KEY(attention, 1, "attention_bf16");
    KEY(call_us, 0, "call_us");
    for (int o = 1; o < ST_OP_COUNT; o++)
        for (int b = 0; b < 2; b++)
            KEY(op_ns, 2 * o + b, "%s_%s_ns", op_names[o], b ? "bwd" : "fwd");
    for (int o = 0; o < 2; o++)
        for (int b = 0; b < 2; b++)
            KEY(update_ns, 2 * o + b, "update_%s_%s_ns", o ? "sgd" : "adamw", b ? "bf16" : "fp32");
    for (int i = 0; i < ST_CAL_PASSES; i++)
        KEY(elementwise_gbps, i, "elementwise_%s_gbps", pass_names[i]);
    KEY(reduce_gbps, 0, "reduce_gbps");
    KEY(stream_gbps, 0, "stream_triad_gbps");
    KEY(stream_all_gbps, 0, "stream_triad_all_gbps");
    KEY(network_ranks, 0, "network_ranks");
    KEY(network_gbps, 0, "network_gbps");
    KEY(network_us, 0, "network_us");
    for (int i = 0; i < ST_CAL_TEAMS; i++) {
        for (int t = 0; t < 2; t++)
            for (int d = 0; d < ST_CAL_DIMS; d++)
                KEY(team_matmul, (i * 2 + t) * ST_CAL_DIMS + d, "team_%d_matmul_%s_d%d",
                    2 << i, t ? "bf16" : "fp32", dim_of(d));
        KEY(team_pass, i, "team_%d_relu_fwd", 2 << i);
        KEY(team_call_us, i, "team_%d_call_us", 2 << i);
    }
#undef KEY
    if (k != N_KEYS)   /* N_KEYS counts more than listed: a key would read "" */
        abort();
}

static double *rate_of(st_calibration *c, size_t k)
{
    return (double *)((char *)c + keys[k].offset);
}

void st_calibration_write(FILE *f, const st_calibration *c)
{
    make_keys();
    fprintf(f, "# subtrain calibration: one thread's rates and teams' speedups (calibration.h, "
               "doc/planning.md)\n");
    fprintf(f, "format 2\nmachine %s\nisa %s\n", c->machine, c->isa);
    for (size_t k = 0; k < N_KEYS; k++)   /* one process's: no network keys */
        if (c->network_ranks > 0.0 || strncmp(keys[k].name, "network_", 8) != 0)
            fprintf(f, "%s %.4g\n", keys[k].name, *rate_of((st_calibration *)c, k));
}

int st_calibration_read(const char *path, st_calibration *out, char *err, size_t n)
{
    make_keys();
    memset(out, 0, sizeof *out);
    FILE *f;
    char why[256];
    if (st_file_open_read(path, &f) != ST_OK)   /* a FIFO or a device is refused */
        return st_cli_fail(err, n, "%s", st_cli_open_failure(why, sizeof why));
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
            if (strcmp(val, "1") == 0)
                rc = st_cli_fail(err, n, "line %d: format 1, an older calibration without "
                                 "the rates the prediction uses: run 'subtrain calibrate' "
                                 "again", lineno);
            else if (strcmp(val, "2") != 0)
                rc = st_cli_fail(err, n, "line %d: format '%s', expected 2", lineno,
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
        rc = st_cli_fail(err, n, "no 'format 2' line: not a calibration file");
    fclose(f);
    return rc;
}

/* Where x falls on the grid x0 * step^i (i < count): the cell's first
 * index and the fraction into it, in log space, clamped at the edges. */
static void grid_pos(double x, double x0, double step, int count, int *i, double *frac)
{
    double u = x > 0.0 ? log(x / x0) / log(step) : 0.0;
    if (u < 0.0)
        u = 0.0;
    if (u > count - 1)
        u = count - 1;
    *i = (int)u < count - 1 ? (int)u : count - 2;
    *frac = u - *i;
}

double st_calibration_matmul_rate(const st_calibration *c, int bf16, st_cost_operands ops,
                                  double m, double n, double k)
{
    int i[3];
    double f[3];
    const double x[3] = { m, n, k };
    for (int d = 0; d < 3; d++)
        grid_pos(x[d], ST_CAL_DIM0, 4.0, ST_CAL_DIMS, &i[d], &f[d]);
    double logr = 0.0;
    for (int corner = 0; corner < 8; corner++) {
        int at[3];
        double w = 1.0;
        for (int d = 0; d < 3; d++) {
            const int up = (corner >> d) & 1;
            at[d] = i[d] + up;
            w *= up ? f[d] : 1.0 - f[d];
        }
        const double r = c->matmul_gflops[bf16 ? 1 : 0][ops][at[0]][at[1]][at[2]];
        if (!(r > 0.0))
            return 0.0;
        logr += w * log(r);
    }
    return exp(logr);
}

double st_calibration_pass_rate(const st_calibration *c, double bytes)
{
    int i;
    double f;
    /* the measured loop moves 1.5 times its vectors' size */
    grid_pos(bytes / 1.5, ST_CAL_PASS0, 16.0, ST_CAL_PASSES, &i, &f);
    const double lo = c->elementwise_gbps[i], hi = c->elementwise_gbps[i + 1];
    return lo > 0.0 && hi > 0.0 ? exp((1.0 - f) * log(lo) + f * log(hi)) : 0.0;
}

st_team_rates st_calibration_team_rates(const st_calibration *c, int threads)
{
    st_team_rates r = { 0.0, 0.0, 0, 0, 0.0 };
    if (threads < 2 || threads > 2 << (ST_CAL_TEAMS - 1))
        return r;
    const double x = log2((double)threads) - 1.0;   /* index 0: a team of 2 */
    const int lo = (int)floor(x);
    const int hi = x > (double)lo ? lo + 1 : lo;
    const double at = x - (double)lo;
    if (!(c->team_pass[lo] > 0.0) || !(c->team_pass[hi] > 0.0))
        return r;
    r.pass = exp((1.0 - at) * log(c->team_pass[lo]) + at * log(c->team_pass[hi]));
    r.call_us = (1.0 - at) * c->team_call_us[lo] + at * c->team_call_us[hi];
    r.lo = lo;
    r.hi = hi;
    r.at = at;
    return r;
}

/* One calibrated team's speedup on a product of `flops`. */
static double team_matmul_at(const st_calibration *c, int team, int bf16, double flops)
{
    int i;
    double f;
    /* a cube of side D: 2 D^3 FLOPs, the sides 4 times apart */
    const double d0 = (double)ST_CAL_DIM0;
    grid_pos(flops / 2.0, d0 * d0 * d0, 64.0, ST_CAL_DIMS, &i, &f);
    const double lo = c->team_matmul[team][bf16 ? 1 : 0][i];
    const double hi = c->team_matmul[team][bf16 ? 1 : 0][i + 1];
    return lo > 0.0 && hi > 0.0 ? exp((1.0 - f) * log(lo) + f * log(hi)) : 0.0;
}

double st_calibration_team_matmul(const st_calibration *c, const st_team_rates *team, int bf16,
                                  double flops)
{
    if (!(team->pass > 0.0))
        return 0.0;
    const double lo = team_matmul_at(c, team->lo, bf16, flops);
    const double hi = team_matmul_at(c, team->hi, bf16, flops);
    return lo > 0.0 && hi > 0.0 ? exp((1.0 - team->at) * log(lo) + team->at * log(hi)) : 0.0;
}

/* ------------------------------------------------------------ measuring */

/* Timed rounds of each rate, the first a warm-up: many short ones, so
 * that on a shared machine some fall in a quiet moment. */
#define ROUNDS 40


/* The operands a product of the calibration cycles through: copies
 * enough to fill COLD_BYTES, so that each call finds its operands out of
 * the core's own caches, as a layer's product does in a step that touches
 * more than they hold. */
#define COLD_BYTES ((size_t)8 << 20)
#define MAX_COPIES 64

/* Memory of md, zero-filled (timed kernels must not read NaNs or
 * denormals); 0, or -1. */
static int zeroed_memory(const dnnl_memory_desc_t *md, dnnl_engine_t eng, dnnl_memory_t *out)
{
    if (dnnl_memory_create(out, md, eng, DNNL_MEMORY_ALLOCATE) != dnnl_success) {
        *out = NULL;
        return -1;
    }
    void *h;
    dnnl_memory_get_data_handle(*out, &h);
    memset(h, 0, dnnl_memory_desc_get_size(md));
    return 0;
}

/* The best seconds of one execution of prim over `rounds` rounds of
 * `reps` calls, call r taking the (r mod sets)-th set of n_args arguments;
 * round 0 warms up.  0 when an execution fails. */
static double best_call_s(dnnl_primitive_t prim, dnnl_stream_t stream, int rounds, int reps,
                          int sets, int n_args, const dnnl_exec_arg_t *args)
{
    double best = 1e30;
    for (int round = 0; round < rounds; round++) {
        const double t0 = st_cli_now_s();
        for (int r = 0; r < reps; r++)
            if (dnnl_primitive_execute(prim, stream, n_args, args + (r % sets) * n_args) !=
                dnnl_success)
                return 0.0;
        dnnl_stream_wait(stream);
        const double t = (st_cli_now_s() - t0) / reps;
        if (round > 0 && t < best)
            best = t;
    }
    return best;
}

/* The best seconds of one call of a (M x K) x (K x N) matmul of data type
 * dt (the output fp32), over a few repetitions of `reps` calls; 0 when
 * oneDNN has no such matmul.  cold: the calls cycle through copies of the
 * operands (COLD_BYTES); else they reuse one set. */
static double time_matmul(dnnl_engine_t eng, dnnl_stream_t stream, int64_t M, int64_t K,
                          int64_t N, dnnl_data_type_t dt, st_cost_operands ops, int reps,
                          int rounds, int cold)
{
    dnnl_dims_t ad = { M, K }, bd = { K, N }, cd = { M, N };
    dnnl_memory_desc_t a, b, c;
    dnnl_matmul_desc_t d;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_memory_t mem[MAX_COPIES][3] = { { NULL } };
    dnnl_exec_arg_t args[MAX_COPIES][3];
    int copies = 0;
    double best = 0.0;
    if (dnnl_memory_desc_init_by_tag(&a, 2, ad, dt, ops == ST_OPERANDS_TN ? dnnl_ba : dnnl_ab) !=
            dnnl_success ||
        dnnl_memory_desc_init_by_tag(&b, 2, bd, dt, ops == ST_OPERANDS_NT ? dnnl_ba : dnnl_ab) !=
            dnnl_success ||
        dnnl_memory_desc_init_by_tag(&c, 2, cd, dnnl_f32, dnnl_ab) != dnnl_success ||
        dnnl_matmul_desc_init(&d, &a, &b, NULL, &c) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &d, NULL, eng, NULL) != dnnl_success ||
        dnnl_primitive_create(&prim, pd) != dnnl_success)
        goto done;
    const dnnl_memory_desc_t *mds[3] = { &a, &b, &c };
    const size_t set = dnnl_memory_desc_get_size(&a) + dnnl_memory_desc_get_size(&b) +
                       dnnl_memory_desc_get_size(&c);
    const size_t want = cold ? (COLD_BYTES + set - 1) / set : 1;
    for (copies = 0; copies < (int)(want < MAX_COPIES ? want : MAX_COPIES); copies++) {
        for (int j = 0; j < 3; j++)
            if (zeroed_memory(mds[j], eng, &mem[copies][j]) != 0)
                goto done;
        args[copies][0] = (dnnl_exec_arg_t){ DNNL_ARG_SRC, mem[copies][0] };
        args[copies][1] = (dnnl_exec_arg_t){ DNNL_ARG_WEIGHTS, mem[copies][1] };
        args[copies][2] = (dnnl_exec_arg_t){ DNNL_ARG_DST, mem[copies][2] };
    }
    best = best_call_s(prim, stream, rounds, reps < copies ? copies : reps, copies, 3, args[0]);
done:
    for (int i = 0; i < MAX_COPIES; i++)
        for (int j = 0; j < 3; j++)
            if (mem[i][j])
                dnnl_memory_destroy(mem[i][j]);
    if (prim)
        dnnl_primitive_destroy(prim);
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    return best;
}

/* The chains calibrate times: CHAIN_LAYERS layers of CHAIN_ROWS x
 * width -> width, width CHAIN_WIDTH and CHAIN_WIDE (whose operands no
 * longer stay in a core's caches from one layer to the next). */
#define CHAIN_LAYERS 8
#define CHAIN_ROWS 128
#define CHAIN_WIDTH 256
#define CHAIN_WIDE 1024
#define CHAIN_WIDE_ROUNDS 8

/* Threads of a team timing the chain that could not set it up (zeroed
 * before each timing). */
static int chain_team_failed;

/* How much longer a chain of products takes as a network's linear layers
 * run them (every layer's forward, x w^T: NT; then from the last layer to
 * the first its backward-data, dy w: NN, and backward-weights, dy^T x: TN,
 * products; each layer's operands its own) than the same products run as
 * the grid runs them (one product's calls back to back over the same
 * operands), both the best of `rounds` rounds; 0 when not made.  *chain_s:
 * the chain's best seconds.  Called by every thread of a team, each with
 * its own engine, the rounds start together (a barrier each). */
static double time_chain(dnnl_engine_t eng, dnnl_stream_t stream, dnnl_data_type_t dt,
                         int64_t width, int rounds, double *chain_s)
{
    const int64_t B = CHAIN_ROWS, W = width;
    /* [product]: M, K, N and which operand is transposed */
    const int64_t shape[3][3] = { { B, W, W }, { B, W, W }, { W, B, W } };
    const st_cost_operands ops[3] = { ST_OPERANDS_NT, ST_OPERANDS_NN, ST_OPERANDS_TN };
    dnnl_primitive_desc_t pd[3] = { NULL };
    dnnl_primitive_t prim[3] = { NULL };
    dnnl_memory_t mem[CHAIN_LAYERS][3][3] = { { { NULL } } };
    dnnl_exec_arg_t args[CHAIN_LAYERS][3][3];
    double best = 0.0;
    int ok = 0;
    for (int p = 0; p < 3; p++) {
        dnnl_dims_t ad = { shape[p][0], shape[p][1] }, bd = { shape[p][1], shape[p][2] };
        dnnl_dims_t cd = { shape[p][0], shape[p][2] };
        dnnl_memory_desc_t md[3];
        dnnl_matmul_desc_t d;
        if (dnnl_memory_desc_init_by_tag(&md[0], 2, ad, dt,
                                         ops[p] == ST_OPERANDS_TN ? dnnl_ba : dnnl_ab) !=
                dnnl_success ||
            dnnl_memory_desc_init_by_tag(&md[1], 2, bd, dt,
                                         ops[p] == ST_OPERANDS_NT ? dnnl_ba : dnnl_ab) !=
                dnnl_success ||
            dnnl_memory_desc_init_by_tag(&md[2], 2, cd, dnnl_f32, dnnl_ab) != dnnl_success ||
            dnnl_matmul_desc_init(&d, &md[0], &md[1], NULL, &md[2]) != dnnl_success ||
            dnnl_primitive_desc_create(&pd[p], &d, NULL, eng, NULL) != dnnl_success ||
            dnnl_primitive_create(&prim[p], pd[p]) != dnnl_success)
            goto ready;
        static const int arg_ids[3] = { DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST };
        for (int l = 0; l < CHAIN_LAYERS; l++)
            for (int j = 0; j < 3; j++) {
                if (dnnl_memory_create(&mem[l][p][j], &md[j], eng, DNNL_MEMORY_ALLOCATE) !=
                    dnnl_success)
                    goto ready;
                void *h;
                dnnl_memory_get_data_handle(mem[l][p][j], &h);
                memset(h, 0, dnnl_memory_desc_get_size(&md[j]));
                args[l][p][j] = (dnnl_exec_arg_t){ arg_ids[j], mem[l][p][j] };
            }
    }
    ok = 1;
ready:
    /* a team goes on together or not at all: one thread's failure stops
     * every thread before the rounds' barriers */
    if (!ok) {
#pragma omp atomic update
        chain_team_failed++;
    }
#pragma omp barrier
    if (chain_team_failed)
        goto done;
    double alone[3] = { 1e30, 1e30, 1e30 };
    dnnl_status_t st = dnnl_success;
    /* every round runs, a failure or not: a team's threads meet at each */
    for (int p = 0; p < 3; p++)
        for (int round = 0; round < rounds; round++) {
#pragma omp barrier
            const double t0 = st_cli_now_s();
            for (int l = 0; l < CHAIN_LAYERS && st == dnnl_success; l++)
                st = dnnl_primitive_execute(prim[p], stream, 3, args[0][p]);
            dnnl_stream_wait(stream);
            const double t = st_cli_now_s() - t0;
            if (round > 0 && t < alone[p])
                alone[p] = t;
        }
    best = 1e30;
    for (int round = 0; round < rounds; round++) {
#pragma omp barrier
        const double t0 = st_cli_now_s();
        for (int l = 0; l < CHAIN_LAYERS && st == dnnl_success; l++)
            st = dnnl_primitive_execute(prim[0], stream, 3, args[l][0]);
        for (int l = CHAIN_LAYERS - 1; l >= 0 && st == dnnl_success; l--)
            for (int p = 1; p < 3 && st == dnnl_success; p++)
                st = dnnl_primitive_execute(prim[p], stream, 3, args[l][p]);
        dnnl_stream_wait(stream);
        const double t = st_cli_now_s() - t0;
        if (round > 0 && t < best)
            best = t;
    }
    *chain_s = st == dnnl_success ? best : 0.0;
    best = st == dnnl_success ? best / (alone[0] + alone[1] + alone[2]) : 0.0;
done:
    for (int l = 0; l < CHAIN_LAYERS; l++)
        for (int p = 0; p < 3; p++)
            for (int j = 0; j < 3; j++)
                if (mem[l][p][j])
                    dnnl_memory_destroy(mem[l][p][j]);
    for (int p = 0; p < 3; p++) {
        if (prim[p])
            dnnl_primitive_destroy(prim[p]);
        if (pd[p])
            dnnl_primitive_desc_destroy(pd[p]);
    }
    return best;
}

/* The best seconds of one call of a matmul of the given views (each over
 * memory of its own), over ROUNDS rounds of `reps` calls; 0 when not made. */
static double time_views(dnnl_engine_t eng, dnnl_stream_t stream, const dnnl_memory_desc_t *a,
                         const dnnl_memory_desc_t *b, const dnnl_memory_desc_t *c, int reps)
{
    dnnl_matmul_desc_t d;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_memory_t mem[3] = { NULL };
    const dnnl_memory_desc_t *mds[3] = { a, b, c };
    double best = 0.0;
    if (dnnl_matmul_desc_init(&d, a, b, NULL, c) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &d, NULL, eng, NULL) != dnnl_success ||
        dnnl_primitive_create(&prim, pd) != dnnl_success)
        goto done;
    for (int j = 0; j < 3; j++)
        if (zeroed_memory(mds[j], eng, &mem[j]) != 0)
            goto done;
    const dnnl_exec_arg_t args[3] = { { DNNL_ARG_SRC, mem[0] }, { DNNL_ARG_WEIGHTS, mem[1] },
                                      { DNNL_ARG_DST, mem[2] } };
    best = best_call_s(prim, stream, ROUNDS, reps, 1, 3, args);
done:
    for (int j = 0; j < 3; j++)
        if (mem[j])
            dnnl_memory_destroy(mem[j]);
    if (prim)
        dnnl_primitive_destroy(prim);
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    return best;
}

/* A (B, H, rows, cols) view: a sample every bs values, a head every hs,
 * a row every rs, a column every cs. */
static void view4(dnnl_memory_desc_t *md, dnnl_data_type_t dt, int64_t B, int64_t H,
                  int64_t rows, int64_t cols, int64_t bs, int64_t hs, int64_t rs, int64_t cs)
{
    dnnl_dims_t dims = { B, H, rows, cols }, strides = { bs, hs, rs, cs };
    dnnl_memory_desc_init_by_strides(md, 4, dims, dt, strides);
}

/* Attention's scores (Q K^T) and context (P V) products as the layer runs
 * them, over every sample and head at once through strided views of the
 * (B, T, 3 W) projections, against the same products with the heads' rows
 * stacked in plain matrices: their time over the plain ones'; 0 when not
 * made. */
static double time_attention(dnnl_engine_t eng, dnnl_stream_t stream, dnnl_data_type_t dt)
{
    const int64_t B = 8, H = 8, T = 128, dh = 64, W = H * dh, R = B * H * T;
    dnnl_memory_desc_t q, kt, s, p, v, o;
    view4(&q, dt, B, H, T, dh, T * 3 * W, dh, 3 * W, 1);
    view4(&kt, dt, B, H, dh, T, T * 3 * W, dh, 1, 3 * W);
    view4(&s, dnnl_f32, B, H, T, T, H * T * T, T * T, T, 1);
    view4(&p, dt, B, H, T, T, H * T * T, T * T, T, 1);
    view4(&v, dt, B, H, T, dh, T * 3 * W, dh, 3 * W, 1);
    view4(&o, dnnl_f32, B, H, T, dh, T * W, dh, W, 1);
    const double heads = time_views(eng, stream, &q, &kt, &s, 2) +
                         time_views(eng, stream, &p, &v, &o, 2);
    dnnl_memory_desc_t a1, b1, c1, a2, b2, c2;
    dnnl_dims_t ad1 = { R, dh }, bd1 = { dh, T }, cd1 = { R, T };
    dnnl_dims_t ad2 = { R, T }, bd2 = { T, dh }, cd2 = { R, dh };
    dnnl_memory_desc_init_by_tag(&a1, 2, ad1, dt, dnnl_ab);
    dnnl_memory_desc_init_by_tag(&b1, 2, bd1, dt, dnnl_ba);
    dnnl_memory_desc_init_by_tag(&c1, 2, cd1, dnnl_f32, dnnl_ab);
    dnnl_memory_desc_init_by_tag(&a2, 2, ad2, dt, dnnl_ab);
    dnnl_memory_desc_init_by_tag(&b2, 2, bd2, dt, dnnl_ab);
    dnnl_memory_desc_init_by_tag(&c2, 2, cd2, dnnl_f32, dnnl_ab);
    const double stacked = time_views(eng, stream, &a1, &b1, &c1, 2) +
                           time_views(eng, stream, &a2, &b2, &c2, 2);
    return heads > 0.0 && stacked > 0.0 && heads < 1e29 && stacked < 1e29 ? heads / stacked
                                                                          : 0.0;
}

/* The best seconds of one execution of pd's primitive over zeroed
 * memory for each of its arguments; 0 when it cannot be made. */
static double time_pd(dnnl_engine_t eng, dnnl_stream_t stream, const_dnnl_primitive_desc_t pd,
                      int reps)
{
    static const int wanted[] = { DNNL_ARG_SRC, DNNL_ARG_DST, DNNL_ARG_DIFF_SRC,
                                  DNNL_ARG_DIFF_DST, DNNL_ARG_MEAN, DNNL_ARG_VARIANCE,
                                  DNNL_ARG_WORKSPACE, DNNL_ARG_SCALE, DNNL_ARG_SHIFT,
                                  DNNL_ARG_DIFF_SCALE, DNNL_ARG_DIFF_SHIFT };
    enum { N_ARGS = sizeof wanted / sizeof *wanted };
    dnnl_exec_arg_t args[N_ARGS];
    int n = 0;
    dnnl_primitive_t prim = NULL;
    double best = 0.0;
    for (int i = 0; i < N_ARGS; i++) {
        const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md,
                                                                     wanted[i]);
        if (!md || md->ndims == 0)
            continue;
        dnnl_memory_t mem;
        if (zeroed_memory(md, eng, &mem) != 0)
            goto done;
        args[n++] = (dnnl_exec_arg_t){ wanted[i], mem };
    }
    if (dnnl_primitive_create(&prim, pd) != dnnl_success)
        goto done;
    best = best_call_s(prim, stream, ROUNDS, reps, 1, n, args);
done:
    for (int i = 0; i < n; i++)
        dnnl_memory_destroy(args[i].memory);
    if (prim)
        dnnl_primitive_destroy(prim);
    return best;
}

/* ns a value of operation op's training forward and backward (oneDNN's
 * primitive, as the layers run it) into ns[0], ns[1]; 0: not made. */
static void time_op_rows(dnnl_engine_t eng, dnnl_stream_t stream, st_cost_op op, int64_t rows,
                         double ns[2])
{
    const int image = op == ST_OP_BATCHNORM;
    dnnl_dims_t mat = { rows, 256 }, img = { 32, 16, 32, 32 }, stat = { rows };
    dnnl_memory_desc_t md, sd;
    /* a batch norm's images blocked by channels, as the layer lays them
     * out (16 a block with AVX-512, else 8) */
    const dnnl_format_tag_t blocked = strstr(st_cpu_isa_name(), "avx512") ? dnnl_aBcd16b
                                                                           : dnnl_aBcd8b;
    dnnl_memory_desc_init_by_tag(&md, image ? 4 : 2, image ? img : mat, dnnl_f32,
                                 image ? blocked : dnnl_ab);
    dnnl_memory_desc_init_by_tag(&sd, 1, stat, dnnl_f32, dnnl_a);
    const double values = image ? 2.0 * 1024.0 * 256.0 : (double)rows * 256.0;
    const unsigned flags = dnnl_use_scale | dnnl_use_shift;
    const dnnl_alg_kind_t alg = op == ST_OP_GELU ? dnnl_eltwise_gelu_erf : dnnl_eltwise_relu;
    union {
        dnnl_eltwise_desc_t e;
        dnnl_layer_normalization_desc_t l;
        dnnl_softmax_desc_t s;
        dnnl_logsoftmax_desc_t ls;
        dnnl_batch_normalization_desc_t b;
    } fd, bd;
    dnnl_status_t f = dnnl_unimplemented, b = dnnl_unimplemented;
    switch (op) {
    case ST_OP_RELU:
    case ST_OP_GELU:
        f = dnnl_eltwise_forward_desc_init(&fd.e, dnnl_forward_training, alg, &md, 0.f, 0.f);
        b = dnnl_eltwise_backward_desc_init(&bd.e, alg, &md, &md, 0.f, 0.f);
        break;
    case ST_OP_LAYERNORM:
        f = dnnl_layer_normalization_forward_desc_init(&fd.l, dnnl_forward_training, &md, &sd,
                                                       1e-5f, flags);
        b = dnnl_layer_normalization_backward_desc_init(&bd.l, dnnl_backward, &md, &md, &sd,
                                                        1e-5f, flags);
        break;
    case ST_OP_SOFTMAX:
        f = dnnl_softmax_forward_desc_init(&fd.s, dnnl_forward_training, &md, 1);
        b = dnnl_softmax_backward_desc_init(&bd.s, &md, &md, 1);
        break;
    case ST_OP_LOGSOFTMAX:
        f = dnnl_logsoftmax_forward_desc_init(&fd.ls, dnnl_forward_training, &md, 1);
        b = dnnl_logsoftmax_backward_desc_init(&bd.ls, &md, &md, 1);
        break;
    case ST_OP_BATCHNORM:
        /* with the ReLU fused, as a network's batch norms run */
        f = dnnl_batch_normalization_forward_desc_init(&fd.b, dnnl_forward_training, &md, 1e-5f,
                                                       flags | dnnl_fuse_norm_relu);
        b = dnnl_batch_normalization_backward_desc_init(&bd.b, dnnl_backward, &md, &md, 1e-5f,
                                                        flags | dnnl_fuse_norm_relu);
        break;
    default:
        break;
    }
    ns[0] = ns[1] = 0.0;
    dnnl_primitive_desc_t fpd = NULL, bpd = NULL;
    if (f != dnnl_success || dnnl_primitive_desc_create(&fpd, &fd, NULL, eng, NULL) != dnnl_success)
        return;
    ns[0] = time_pd(eng, stream, fpd, 4) / values * 1e9;
    if (b == dnnl_success && dnnl_primitive_desc_create(&bpd, &bd, NULL, eng, fpd) == dnnl_success)
        ns[1] = time_pd(eng, stream, bpd, 4) / values * 1e9;
    if (bpd)
        dnnl_primitive_desc_destroy(bpd);
    dnnl_primitive_desc_destroy(fpd);
}

static void time_op(dnnl_engine_t eng, dnnl_stream_t stream, st_cost_op op, double ns[2])
{
    time_op_rows(eng, stream, op, 1024, ns);
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
        const double t0 = st_cli_now_s();
        for (int r = 0; r < reps; r++) {
            const float s = 1.0f + 1e-7f * (float)r;
            /* vectorised whatever the compiler knows of n (simd) */
            if (which == 0) {
#pragma omp simd
                for (size_t i = 0; i < n; i++)
                    y[i] = s * x[i] + y[i];
            } else if (which == 1) {
#pragma omp simd
                for (size_t i = 0; i < n; i++)
                    z[i] = (x[i] + y[i]) * 0.5f;
            } else {
#pragma omp simd
                for (size_t i = 0; i < n; i++)
                    x[i] = y[i] + s * z[i];
            }
        }
        const double t = (st_cli_now_s() - t0) / reps;
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

/* ns a parameter of the library's update (st_optim_update) of optimizer
 * kind with moments `moments` over n parameters, one segment. */
static double time_update(st_optimizer_kind kind, st_moments moments, size_t n)
{
    st_optim_config cfg = st_optim_config_default();
    cfg.kind = kind;
    cfg.moments = moments;
    st_arena *arena = NULL;
    st_optim *opt = NULL;
    float *p = aligned_alloc(64, n * sizeof *p), *g = aligned_alloc(64, n * sizeof *g);
    double best = 0.0;
    if (!p || !g || st_arena_create("calibrate", NULL, 0, &arena) != ST_OK ||
        st_optim_create(&cfg, 0, n, arena, &opt) != ST_OK)
        goto done;
    for (size_t i = 0; i < n; i++) {
        p[i] = 0.01f * (float)(i % 97);
        g[i] = 1e-3f * (float)(i % 89) - 0.04f;
    }
    st_param_segment seg = { .name = "w", .offset = 0, .count = n, .decay = 1,
                             .grad_offset = 0, .grad_count = n, .rows = (long long)n,
                             .cols = 1 };
    best = 1e30;
    for (int round = 0; round < 12; round++) {
        const double t0 = st_cli_now_s();
        st_optim_update(opt, p, g, &seg, 1, 0, n, (uint64_t)round + 1, 1e-3f);
        const double t = st_cli_now_s() - t0;
        if (round > 0 && t < best)
            best = t;
    }
    best = best / (double)n * 1e9;
done:
    st_optim_destroy(opt);
    st_arena_destroy(arena);
    free(p);
    free(g);
    return best;
}

/* STREAM's triad on every one of `threads` threads at once, each on its
 * own n-float arrays: the machine's total bytes a second (the best of
 * ROUNDS rounds that start together). */
static double time_triad_all(int threads, size_t n)
{
    double best = 1e30;
    int failed = 0;
#pragma omp parallel num_threads(threads) shared(best, failed)
    {
        float *a = aligned_alloc(64, n * sizeof *a), *b = aligned_alloc(64, n * sizeof *b);
        float *c = aligned_alloc(64, n * sizeof *c);
        if (!a || !b || !c) {
#pragma omp atomic write
            failed = 1;
        } else {
            for (size_t i = 0; i < n; i++) {
                a[i] = 0.0f;
                b[i] = 1.0f;
                c[i] = 2.0f;
            }
        }
        for (int round = 0; round < ROUNDS; round++) {
            double t0 = 0.0;
#pragma omp barrier
#pragma omp master
            t0 = st_cli_now_s();
            if (a && b && c) {
                const float s = 1.0f + 1e-7f * (float)round;
#pragma omp simd
                for (size_t i = 0; i < n; i++)
                    a[i] = b[i] + s * c[i];
            }
#pragma omp barrier
#pragma omp master
            {
                const double t = st_cli_now_s() - t0;
                if (round > 0 && t < best)
                    best = t;
            }
        }
        if (a && a[n / 2] == -1.0f)   /* a value out of the loop: it is not optimised away */
            best *= 1.0;
        free(a);
        free(b);
        free(c);
    }
    return failed ? 0.0 : 3.0 * (double)threads * (double)n * sizeof(float) / best;
}

/* Teams up to the CPUs: each cube's product, the relu forward and the
 * smallest call on T threads against one, the primitives made and run
 * with the calling thread's nthreads-var at T, as a team worker's are. */
static void measure_teams_here(dnnl_engine_t eng, dnnl_stream_t stream, st_calibration *out)
{
    const dnnl_data_type_t types[2] = { dnnl_f32, dnnl_bf16 };
    double one[2][ST_CAL_DIMS] = { { 0.0 } }, relu1[2] = { 0.0 }, small1[2] = { 0.0 };
    for (int i = -1; i < ST_CAL_TEAMS && (i < 0 || (2 << i) <= (int)out->cpus); i++) {
        omp_set_num_threads(i < 0 ? 1 : 2 << i);
        for (int t = 0; t < 2; t++)
            for (int d = 0; d < ST_CAL_DIMS; d++) {
                const int64_t D = dim_of(d);
                const double flop = 2.0 * (double)(D * D * D);
                const int reps = flop < 4e5 ? 200 : flop < 4e7 ? (int)(8e7 / flop) : 1;
                /* all the rounds: a team is slowed by any neighbour on its cores */
                const double s = time_matmul(eng, stream, D, D, D, types[t], ST_OPERANDS_NN,
                                             reps, ROUNDS, 1);
                if (i < 0)
                    one[t][d] = s;
                else
                    out->team_matmul[i][t][d] = s > 0.0 && one[t][d] > 0.0 ? one[t][d] / s
                                                                           : 0.0;
            }
        double ns[2], small[2];
        time_op(eng, stream, ST_OP_RELU, ns);
        time_op_rows(eng, stream, ST_OP_RELU, 64, small);   /* 16k values */
        if (i < 0) {
            relu1[0] = ns[0];
            relu1[1] = ns[1];
            small1[0] = small[0];
            small1[1] = small[1];
            continue;
        }
        const int T = 2 << i;
        out->team_pass[i] = ns[0] > 0.0 && relu1[0] > 0.0 ? relu1[0] / ns[0] : 0.0;
        /* what a call costs the team beyond its share of the work: a
         * small pass's time on T threads over one thread's over T */
        out->team_call_us[i] = small[0] > 0.0 && small1[0] > 0.0
                                   ? fmax(0.0, (small[0] - small1[0] / T) * 64.0 * 256.0 * 1e-3)
                                   : 0.0;
    }
    omp_set_num_threads(1);
}

/* The same inside a workers' region, as a run's team opens its
 * primitives' regions: nested, one level down. */
static void measure_teams(dnnl_engine_t eng, dnnl_stream_t stream, st_calibration *out)
{
    const int levels = omp_get_max_active_levels();
    if (levels < 2)
        omp_set_max_active_levels(2);
#pragma omp parallel num_threads(1)
    measure_teams_here(eng, stream, out);
    omp_set_max_active_levels(levels);
}

int st_calibration_measure(st_calibration *out, char *err, size_t n)
{
    memset(out, 0, sizeof *out);
    char host[64] = "";
    gethostname(host, sizeof host - 1);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(out->machine, sizeof out->machine, "%s, %ld CPUs online", host, cpus);
    snprintf(out->isa, sizeof out->isa, "%s", st_cpu_isa_name());
    out->cpus = (double)(cpus > 0 ? cpus : 1);
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    if (dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success)
        return st_cli_fail(err, n, "oneDNN: cannot create a CPU engine");
    if (dnnl_stream_create(&stream, eng, dnnl_stream_default_flags) != dnnl_success) {
        dnnl_engine_destroy(eng);
        return st_cli_fail(err, n, "oneDNN: cannot create a stream");
    }
    const dnnl_data_type_t types[2] = { dnnl_f32, dnnl_bf16 };
    for (int t = 0; t < 2; t++)
        for (int o = 0; o < ST_OPERANDS_COUNT; o++)
            for (int i = 0; i < ST_CAL_DIMS; i++)
                for (int j = 0; j < ST_CAL_DIMS; j++)
                    for (int l = 0; l < ST_CAL_DIMS; l++) {
                        const int64_t M = dim_of(i), N = dim_of(j), K = dim_of(l);
                        const double flop = 2.0 * (double)M * (double)N * (double)K;
                        /* calls enough for some 0.2 ms a round: a clock's tick is small */
                        const int reps = flop < 4e5 ? 200 : flop < 4e7 ? (int)(8e7 / flop) : 1;
                        const double sec = time_matmul(eng, stream, M, K, N, types[t],
                                                       (st_cost_operands)o, reps, 12, 1);
                        out->matmul_gflops[t][o][i][j][l] = sec > 0.0 ? flop / sec / 1e9 : 0.0;
                    }
    for (int t = 0; t < 2; t++) {
        double alone = 0.0, all = 0.0;
        chain_team_failed = 0;
        out->chain[t] = time_chain(eng, stream, types[t], CHAIN_WIDTH, ROUNDS, &alone);
        double wide_s;
        out->chain_wide[t] = out->chain[t] > 0.0
                                 ? time_chain(eng, stream, types[t], CHAIN_WIDE,
                                              CHAIN_WIDE_ROUNDS, &wide_s)
                                 : 0.0;
        out->chain_all[t] = out->cpus > 1 ? 0.0 : 1.0;
        if (!(out->chain[t] > 0.0) || out->cpus <= 1)
            continue;
        /* the same chain on every CPU at once, each thread its own */
        chain_team_failed = 0;
#pragma omp parallel num_threads((int)out->cpus) shared(all)
        {
            dnnl_engine_t e = NULL;
            dnnl_stream_t es = NULL;
            double mine = 0.0;
            if (dnnl_engine_create(&e, dnnl_cpu, 0) == dnnl_success)
                dnnl_stream_create(&es, e, dnnl_stream_default_flags);
            /* fails with the team without them */
            time_chain(e, es, types[t], CHAIN_WIDTH, ROUNDS, &mine);
#pragma omp critical
            all = fmax(all, mine);
            if (es)
                dnnl_stream_destroy(es);
            if (e)
                dnnl_engine_destroy(e);
        }
        out->chain_all[t] = alone > 0.0 && all > 0.0 ? all / alone : 0.0;
    }
    for (int t = 0; t < 2; t++)
        out->attention[t] = time_attention(eng, stream, types[t]);
    const double call = time_matmul(eng, stream, 1, 1, 1, dnnl_f32, ST_OPERANDS_NN, 200, ROUNDS, 0);
    out->call_us = call * 1e6;
    for (int o = 1; o < ST_OP_COUNT; o++)
        time_op(eng, stream, (st_cost_op)o, out->op_ns[o]);
    measure_teams(eng, stream, out);
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
    for (int o = 0; o < 2; o++)
        for (int b = 0; b < 2; b++)
            out->update_ns[o][b] = time_update(o ? ST_OPT_SGD : ST_OPT_ADAMW,
                                               b ? ST_MOMENTS_BF16 : ST_MOMENTS_FP32,
                                               (size_t)1 << 20);
    for (int i = 0; i < ST_CAL_PASSES; i++) {
        /* two vectors of the size: n floats each */
        const size_t floats = (size_t)(ST_CAL_PASS0 * pow(16.0, i)) / (2 * sizeof(float));
        const int reps = (int)(((size_t)1 << 22) / floats) + 1;
        out->elementwise_gbps[i] = time_loop(0, floats, reps) / 1e9;
    }
    out->reduce_gbps = time_loop(1, (size_t)1 << 20, 2) / 1e9;
    out->stream_gbps = time_loop(2, (size_t)1 << 24, 1) / 1e9;
    out->stream_all_gbps = time_triad_all((int)out->cpus, (size_t)1 << 24) / 1e9;
    return 0;
}

/* Between the ranks of an MPI job (every rank calls it): the exchange's
 * rate at 4 MiB a peer and its time at 8 bytes.  Nothing with one. */
static int measure_network(st_calibration *out, char *err, size_t n)
{
    const int R = st_world_size();
    if (R < 2)
        return 0;
    double big, small;
    const size_t bytes = (size_t)4 << 20;
    if (st_world_time_exchange(bytes, 10, &big) != ST_OK ||
        st_world_time_exchange(8, ROUNDS, &small) != ST_OK)
        return st_cli_fail(err, n, "timing the exchange between the ranks: %s",
                           st_last_error());
    out->network_ranks = R;
    out->network_gbps = big > 0.0 ? (double)(R - 1) * (double)bytes / big / 1e9 : 0.0;
    out->network_us = small * 1e6;
    return 0;
}

/* ------------------------------------------------------------ the command */

static void print_help(FILE *f)
{
    fputs(
"Usage: subtrain calibrate [-o FILE]\n"
"       mpirun -np R subtrain calibrate --network FILE\n"
"Measure this machine's rates on one thread (matmul GFLOP/s over a grid of\n"
"shapes and operand layouts, a chain of layers' products against the grid,\n"
"and convolution GFLOP/s, in fp32 and bf16; a primitive's call time; the\n"
"element-wise operations' and the optimizer's time a value; element-wise\n"
"GB/s at four sizes, reduction and STREAM triad GB/s), the triad on every\n"
"CPU at once, and a team's speedups (products, the relu forward, a call, on\n"
"T = 2, 4, ... threads up to the CPUs), and write them as a calibration file\n"
"for 'subtrain plan --calibration FILE'.\n"
"\n"
"  -o, --output FILE   write the file there (default: standard output)\n"
"  --network FILE      under an MPI launcher ('mpirun -np R subtrain calibrate\n"
"                      --network FILE'): time the exchange between the ranks\n"
"                      and put its rates into FILE, this machine's calibration,\n"
"                      for plans of --ranks\n"
"  -h, --help          this text\n"
"\n"
"Exit status: 0 success, 1 runtime failure, 2 bad usage.\n", f);
}

typedef struct cal_options {
    const char *output;
    const char *network;
    int help;
} cal_options;

static int apply(int c, const char *arg, void *ctx)
{
    cal_options *o = ctx;
    if (c == 'h')
        o->help = 1;
    else if (c == 'o')
        o->output = arg;
    else if (c == 'n')
        o->network = arg;
    return 0;
}

/* c into the output opened by st_cli_out_open.  0, or 1 said. */
static int write_output(st_cli_out *o, const st_calibration *c)
{
    FILE *f = st_cli_out_begin(o);
    if (!f)
        return 1;
    st_calibration_write(f, c);
    return st_cli_out_commit(o, f);
}

/* This machine's rates into `output` (NULL: stdout): 0, or 1. */
static int calibrate_machine(const char *output)
{
    /* said before the minute of measuring, not after */
    st_cli_out out;
    if (output && st_cli_out_open(&out, CMD, "--output", output) != 0)
        return 1;
    omp_set_num_threads(1);
    st_calibration c;
    char err[512];
    if (st_calibration_measure(&c, err, sizeof err) != 0) {
        st_cli_error(CMD, "%s", err);
        if (output)
            st_cli_out_abandon(&out);
        return 1;
    }
    if (output)
        return write_output(&out, &c);
    st_calibration_write(stdout, &c);
    return 0;
}

/* --network FILE: every rank times the exchange; rank 0 puts the rates
 * into FILE, a calibration of this machine, and writes it back whole
 * (write_output).  0, 1 (a failure at run time) or 2 (FILE is no
 * calibration). */
static int calibrate_network(const char *path)
{
    const int root = st_world_rank() == 0;
    st_calibration c;
    char err[512];
    int bad = root && st_calibration_read(path, &c, err, sizeof err) != 0;
    if (st_world_bcast(&bad, sizeof bad, 0) != ST_OK)
        return 1;
    if (bad) {
        if (root)
            st_cli_error(CMD, "--network %s: %s", ST_CLI_SHOW(path), err);
        return 2;
    }
    st_calibration net;
    memset(&net, 0, sizeof net);
    if (measure_network(&net, err, sizeof err) != 0) {
        st_cli_error(CMD, "%s", err);
        return 1;
    }
    if (!root)
        return 0;
    c.network_ranks = net.network_ranks;
    c.network_gbps = net.network_gbps;
    c.network_us = net.network_us;
    st_cli_out out;
    return st_cli_out_open(&out, CMD, "--network", path) != 0 ? 1 : write_output(&out, &c);
}

int st_cli_calibrate_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "output", required_argument, NULL, 'o' },
        { "network", required_argument, NULL, 'n' },
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
    if (o.network && o.output) {
        st_cli_error(CMD, "--network %s updates that file: --output %s does not go with it",
                     ST_CLI_SHOW(o.network), ST_CLI_SHOW(o.output));
        return 2;
    }
    if (st_world_init(NULL, NULL) != ST_OK) {
        st_cli_error(CMD, "starting MPI: %s", st_last_error());
        return 1;
    }
    const int ranks = st_world_size();
    int rc;
    if (o.network && ranks < 2) {
        st_cli_error(CMD, "--network %s times the exchange between MPI ranks: start it with "
                     "'mpirun -np 2 subtrain calibrate --network FILE' (or more ranks)",
                     ST_CLI_SHOW(o.network));
        rc = 2;
    } else if (o.network) {
        rc = calibrate_network(o.network);
    } else if (ranks > 1) {
        /* a launcher binds the ranks, and they share the machine: its
         * rates are one process's, the network's are --network's */
        if (st_world_rank() == 0)
            st_cli_error(CMD, "under an MPI launcher of %d ranks calibrate times the exchange "
                         "between them: give --network FILE, FILE this machine's calibration "
                         "('subtrain calibrate -o FILE', without the launcher)", ranks);
        rc = 2;
    } else {
        rc = calibrate_machine(o.output);
    }
    st_world_finalize();
    return rc;
}

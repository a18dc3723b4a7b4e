/*
 * cli/plan_cmd.c — `subtrain plan`: which strategies fit a memory budget
 * per worker, on this machine or a described one, and how fast each would
 * run, before training.
 *
 * A row's memory is not estimated: st_train_size builds every worker of
 * the row's run with the run's own code over untouched address space and
 * reads the arenas' accounting, so it is what the run's records report.
 * Its time is predicted from a calibration file (calibration.h): the
 * worker's step, layer by layer (st_model_step_costs), each product at the
 * rate measured for its shape, each element-wise pass at its operation's
 * and its size's rates, the engine's bytes at the reduction's rate
 * (predict_step).  Accuracy is never predicted: a row names measured
 * differences (plan-accuracy.csv).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include <subtrain/subtrain.h>

#include "cli/calibration.h"
#include "cli/cli_util.h"
#include "cli/out_file.h"
#include "cli/options.h"
#include "cli/plan_cmd.h"
#include "cli/run_data.h"
#include "core/file.h"
#include "config.h"

#define EXIT_USAGE 2
#define CMD "subtrain plan"
#define MAX_ROWS 64
#define MAX_NOTES 8
#define MAX_TEAMS 16

/* What the plan varies; everything else is the run's options as given. */
typedef struct plan_candidate {
    st_strategy strategy;
    double coverage;          /* sdp */
    st_precision precision;
    st_moments moments;
    st_recompute recompute;
    int threads;              /* a worker's team (1: one core) */
} plan_candidate;

/* One rank's busiest worker: what that rank's records report. */
typedef struct rank_size {
    st_mem_stats mem;
    double comm_bytes;
} rank_size;

typedef struct plan_row {
    plan_candidate c;
    int order;                /* the candidate's place: ties keep it */
    st_train_config cfg;
    int ok;                   /* sized; else why not in `refused` */
    char refused[256];
    int workers, threads;     /* workers of each rank, threads of each worker */
    int ranks;                /* MPI ranks, each with `workers` */
    rank_size *rank;          /* ranks > 1: each rank's (else NULL) */
    st_mem_stats mem;         /* the worker with the largest total (of every rank) */
    double comm_bytes;        /* the busiest worker's, read + written a step */
    double local_bytes;       /* ranks > 1: the largest of them in this machine */
    double mpi_bytes;         /* and from other ranks (a rank's, its worker 0's) */
    double flops;             /* that worker's model, a step */
    st_step_cost costs[ST_STEP_COSTS_MAX];   /* and its work, layer by layer */
    int n_costs;
    double budget;            /* a worker's (a total is shared by the row's workers) */
    int fits;
    int over;                 /* the kind that overflows: the largest one (-1: fits) */
    double step_s, samples_per_s;   /* NAN: no calibration */
    char notes[MAX_NOTES][200];
    int n_notes;
} plan_row;

typedef struct plan_options {
    double per_worker, total;      /* bytes; 0: not given */
    const char *strategies;        /* NULL: dp,sdp,ist,localsgd */
    const char *calibration;
    const char *accuracy;
    const char *json;
    const char *topology;          /* NULL: this machine */
    int as_given;                  /* one row: the options as given */
    int workers_given;             /* else one worker per core of the machine */
    int threads_given;             /* else teams of every size that divides the
                                    * domains' cores */
    int ranks;                     /* MPI ranks, each on a machine like topology */
    int help;
} plan_options;

static void print_help(FILE *f)
{
    fputs(
"Usage: subtrain plan --memory-per-worker SIZE|--memory-total SIZE [OPTION]...\n"
"                     [RUN OPTION]...\n"
"Which strategies fit a memory budget per worker, what each holds and moves,\n"
"and how fast each would run, for the run the other options describe (model,\n"
"data, batch, workers, --topology), on this machine or a described one.\n"
"Trains nothing; binds nothing; touches none of the workers' buffers.\n"
"Without --workers or --threads-per-worker, every team size T = 1, 2, 4, ...\n"
"that divides the cores of each NUMA domain, with cores / T workers.\n"
"\n"
"  --topology SPEC            the machine, as for 'subtrain topo': omitted for\n"
"                             this one; synthetic:DESC (hwloc's synthetic\n"
"                             syntax); xml:FILE (lstopo --of xml)\n"
"  --ranks R                  an MPI job of R ranks (1 to 65535, as mpirun -np R\n"
"                             on R machines like --topology), each with the\n"
"                             workers the plan gives it; laid out here without\n"
"                             MPI; time from a calibration's network rate\n"
"                             ('mpirun -np 2 subtrain calibrate --network')\n"
"  --memory-per-worker SIZE   budget of one worker: bytes, or with K, M, G, T\n"
"                             (or KiB, MiB, GiB, TiB: the same, powers of 1024),\n"
"                             e.g. 512M, 1G, 1.5GiB\n"
"  --memory-total SIZE        budget of all workers together, shared evenly\n"
"  --strategies LIST          candidates among dp, sdp, ist, localsgd, synth\n"
"                             (default dp,sdp,ist,localsgd); sdp at coverage\n"
"                             0.5 and 0.25; each in fp32 and bf16, with fp32\n"
"                             and bf16 optimizer moments\n"
"  --as-given                 one row: the run exactly as its options say\n"
"  --calibration FILE         rates measured by 'subtrain calibrate' (this\n"
"                             machine's or another's): predicted step time and\n"
"                             samples/s; without it those columns are empty\n"
"  --accuracy FILE            measured accuracy differences (default: the\n"
"                             installed plan-accuracy.csv)\n"
"  --json FILE                also write the table as JSON ('-': stdout only)\n"
"  -h, --help                 this text\n"
"\n"
"Memory is what the run's records report per worker (its arena, and its\n"
"share of a NUMA domain's weight copy), laid out by the run's own code: over\n"
"every subnetwork the run draws (sdp --resample, ist), and for synth the phase\n"
"its records report.\n"
"Rows that do not fit say which kind is the largest; the fitting rows come\n"
"first, fastest first.  Accuracy is never predicted: a row names measured\n"
"differences from the documentation's tables where there are some.\n"
"Exit status: 0 success, 1 runtime failure, 2 bad usage.\n", f);
}

/* ------------------------------------------------------------ sizes */

/* "512M", "1G", "1.5GiB", "4096": bytes (K, M, G, T and their -iB forms
 * are powers of 1024; a bare number is bytes), a decimal number (no sign,
 * exponent or hex) of at most 1 EiB.  0, or -1. */
int st_cli_parse_size(const char *s, double *out)
{
    if (!s || !(*s >= '0' && *s <= '9'))
        return -1;
    const char *p = s;
    while (*p >= '0' && *p <= '9')
        p++;
    if (*p == '.')
        for (p++; *p >= '0' && *p <= '9'; p++)
            continue;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || !isfinite(v) || v <= 0.0 || end != p)
        return -1;
    static const struct { const char *suffix; double scale; } units[] = {
        { "", 1.0 }, { "B", 1.0 },
        { "K", 1024.0 }, { "KiB", 1024.0 }, { "M", 1048576.0 }, { "MiB", 1048576.0 },
        { "G", 1073741824.0 }, { "GiB", 1073741824.0 },
        { "T", 1099511627776.0 }, { "TiB", 1099511627776.0 },
    };
    for (size_t i = 0; i < sizeof units / sizeof *units; i++)
        if (strcmp(end, units[i].suffix) == 0) {
            *out = v * units[i].scale;
            return *out >= 1.0 && *out <= 1152921504606846976.0 ? 0 : -1;   /* 2^60 */
        }
    return -1;
}

static double mib(double bytes)
{
    return bytes / 1048576.0;
}

/* ------------------------------------------------------------ the command line */

/* Splits argv into the plan's own options (into p) and the run's (into
 * run_argv, argv[0] first).  0, 2 (said why), or 1 (--help). */
static int split_args(int argc, char **argv, plan_options *p, char **run_argv, int *run_argc)
{
    static const char *const own[] = { "--memory-per-worker", "--memory-total", "--strategies",
                                       "--calibration", "--accuracy", "--json",
                                       "--topology", "--ranks" };
    *run_argc = 0;
    run_argv[(*run_argc)++] = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            p->help = 1;
            continue;
        }
        if (strcmp(a, "--as-given") == 0) {
            p->as_given = 1;
            continue;
        }
        int k = -1;
        const char *val = NULL;
        for (int j = 0; j < (int)(sizeof own / sizeof *own); j++) {
            size_t n = strlen(own[j]);
            if (strncmp(a, own[j], n) == 0 && (a[n] == '\0' || a[n] == '=')) {
                k = j;
                val = a[n] == '=' ? a + n + 1 : NULL;
            }
        }
        if (k < 0) {
            if (strncmp(a, "--workers", 9) == 0 && (a[9] == '\0' || a[9] == '='))
                p->workers_given = 1;
            if (strncmp(a, "--threads-per-worker", 20) == 0 && (a[20] == '\0' || a[20] == '='))
                p->threads_given = 1;
            run_argv[(*run_argc)++] = argv[i];
            continue;
        }
        if (!val) {
            if (i + 1 >= argc) {
                st_cli_error(CMD, "%s needs a value", own[k]);
                return 2;
            }
            /* an option where the value belongs (--json -q): the value was
             * forgotten; none of these values begins with a dash and a letter */
            const char *next = argv[i + 1];
            if (next[0] == '-' && (next[1] == '-' || (next[1] >= 'a' && next[1] <= 'z') ||
                                   (next[1] >= 'A' && next[1] <= 'Z'))) {
                st_cli_error(CMD, "%s needs a value, and '%s' is an option (write %s=%s for "
                             "that value)", own[k], ST_CLI_SHOW(argv[i + 1]), own[k],
                             ST_CLI_SHOW(argv[i + 1]));
                return 2;
            }
            val = argv[++i];
        }
        if (k <= 1) {
            double v;
            if (st_cli_parse_size(val, &v) != 0) {
                st_cli_error(CMD, "%s %s: expected a size such as 512M, 1G or 1.5GiB", own[k],
                             ST_CLI_SHOW(val));
                return 2;
            }
            *(k == 0 ? &p->per_worker : &p->total) = v;
        } else if (k == 2) {
            p->strategies = val;
        } else if (k == 3) {
            p->calibration = val;
        } else if (k == 4) {
            p->accuracy = val;
        } else if (k == 5) {
            if (!*val) {
                st_cli_error(CMD, "--json: expected a file name, got ''");
                return 2;
            }
            p->json = val;
        } else if (k == 6) {
            p->topology = val;
        } else {
            unsigned long long v;
            if (st_cli_count_arg(CMD, own[k], val, 1, 65535, &v) != 0)
                return 2;
            p->ranks = (int)v;
        }
    }
    run_argv[*run_argc] = NULL;
    if (p->help)
        return 1;
    if ((p->per_worker > 0.0) == (p->total > 0.0)) {
        st_cli_error(CMD, "give one budget: --memory-per-worker SIZE or --memory-total SIZE");
        return 2;
    }
    return 0;
}

static int strategy_candidates(const plan_options *p, const st_train_config *base,
                               plan_candidate *out, int *n);

/* The team sizes the plan tries, into out: the one the options give
 * (--workers or --threads-per-worker, or --as-given), else 1, 2, 4, ...
 * while T divides the cores of every NUMA domain the run's workers would
 * use (one worker per core).  Their count, or -1 (said why): a
 * --threads-per-worker that does not divide them without --workers, for
 * cores / T workers would leave cores idle. */
static int team_sizes(const plan_options *p, const st_train_config *base,
                      const st_topology *topo, int *out)
{
    const int given = base->threads_per_worker > 1 ? base->threads_per_worker : 1;
    out[0] = given;
    if (p->workers_given)
        return 1;
    st_plan pl;
    memset(&pl, 0, sizeof pl);
    st_plan_request req = { .workers = 0, .cpuset = base->cpuset,
                            .core_limit = base->core_limit };
    int n = 1;
    if (st_plan_make(topo, &req, &pl) == ST_OK && pl.n_domains > 0) {
        int fewest = pl.n_workers, odd = -1;
        for (int d = 0; d < pl.n_domains; d++) {
            const int cores = pl.domain_first[d + 1] - pl.domain_first[d];
            fewest = cores < fewest ? cores : fewest;
            if (cores % given != 0 && odd < 0)
                odd = cores;
        }
        if (p->threads_given && odd >= 0) {
            st_cli_error(CMD, "--threads-per-worker %d: does not divide the %d cores of a NUMA "
                         "domain of %s; give --workers N to plan teams that leave cores idle",
                         given, odd, st_topology_name(topo));
            n = -1;
        }
        for (int t = 2; !p->as_given && !p->threads_given && t <= fewest && n < MAX_TEAMS;
             t *= 2) {
            int divides = 1;
            for (int d = 0; d < pl.n_domains; d++)
                divides &= (pl.domain_first[d + 1] - pl.domain_first[d]) % t == 0;
            if (divides)
                out[n++] = t;
        }
    }
    st_plan_free(&pl);
    return n;
}

/* The candidates of --strategies (or the options as given), each with
 * every team size: *out (to free), *n of them. */
static int make_candidates(const plan_options *p, const st_train_config *base,
                           const int *teams, int n_teams, plan_candidate **out, int *n)
{
    plan_candidate one[MAX_ROWS];
    int n_one = 0;
    *out = NULL;
    *n = 0;
    if (p->as_given) {
        one[n_one++] = (plan_candidate){ base->strategy, base->sdp.coverage,
                                         base->model.precision, base->optim.moments,
                                         base->model.recompute, 1 };
    } else {
        const int status = strategy_candidates(p, base, one, &n_one);
        if (status)
            return status;
    }
    *out = calloc((size_t)(n_one * n_teams), sizeof **out);
    if (!*out) {
        st_cli_error(CMD, "out of memory");
        return 1;
    }
    for (int t = 0; t < n_teams; t++)
        for (int i = 0; i < n_one; i++) {
            plan_candidate c = one[i];
            c.threads = teams[t];
            (*out)[(*n)++] = c;
        }
    return 0;
}

/* The strategies' candidates of --strategies. */
static int strategy_candidates(const plan_options *p, const st_train_config *base,
                               plan_candidate *out, int *n)
{
    *n = 0;
    char list[256];
    snprintf(list, sizeof list, "%s", p->strategies ? p->strategies : "dp,sdp,ist,localsgd");
    const st_precision precisions[] = { ST_PRECISION_FP32, ST_PRECISION_BF16 };
    const st_moments moments[] = { ST_MOMENTS_FP32, ST_MOMENTS_BF16 };
    const st_recompute recomputes[] = { ST_RECOMPUTE_NONE, ST_RECOMPUTE_BLOCKS };
    const size_t len = strlen(list);
    if (len == 0 || list[0] == ',' || list[len - 1] == ',' || strstr(list, ",,")) {
        st_cli_error(CMD, "--strategies %s: an empty name in the list",
                     ST_CLI_SHOW(p->strategies));
        return 2;
    }
    char *save = NULL;
    for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        st_strategy s;
        if (st_strategy_parse(tok, &s) != ST_OK) {
            st_cli_error(CMD, "--strategies %s: '%s' is no strategy (%s)",
                         ST_CLI_SHOW(p->strategies), ST_CLI_SHOW(tok), st_last_error());
            return 2;
        }
        const double cover[] = { 0.5, 0.25 };
        const int n_cover = s == ST_STRATEGY_SDP ? 2 : 1;
        for (int c = 0; c < n_cover; c++)
            for (int pr = 0; pr < 2; pr++)
                for (int mo = 0; mo < 2; mo++)
                    for (int rc = 0; rc < 2 && *n < MAX_ROWS; rc++)
                        out[(*n)++] = (plan_candidate){
                            s, s == ST_STRATEGY_SDP ? cover[c] : base->sdp.coverage,
                            precisions[pr], moments[mo], recomputes[rc], 1 };
    }
    if (*n == 0) {
        st_cli_error(CMD, "--strategies %s: no strategy named", ST_CLI_SHOW(p->strategies));
        return 2;
    }
    return 0;
}

/* ------------------------------------------------------------ a row */

static void size_row(plan_row *row, const st_train_config *base, int ranks,
                     const st_dataset *train, const st_dataset *test)
{
    row->cfg = *base;
    row->cfg.strategy = row->c.strategy;
    row->cfg.sdp.coverage = row->c.coverage;
    row->cfg.model.precision = row->c.precision;
    row->cfg.optim.moments = row->c.moments;
    row->cfg.model.recompute = row->c.recompute;
    row->cfg.threads_per_worker = row->c.threads;
    row->step_s = row->samples_per_s = NAN;
    row->over = -1;
    st_worker_size *ws;
    int n;
    if (st_train_size_ranks(&row->cfg, ranks, train, test, &ws, &n) != ST_OK) {
        snprintf(row->refused, sizeof row->refused, "%s", st_last_error());
        return;
    }
    int worst = 0;
    double bytes = 0.0;
    row->rank = ranks > 1 ? calloc((size_t)ranks, sizeof *row->rank) : NULL;
    if (ranks > 1 && !row->rank) {
        snprintf(row->refused, sizeof row->refused, "out of memory");
        free(ws);
        return;
    }
    for (int k = 0; k < n; k++) {
        if (ws[k].memory.peak_total > ws[worst].memory.peak_total)
            worst = k;
        double b = (double)(ws[k].comm.read + ws[k].comm.written);
        if (b > bytes)
            bytes = b;
        /* over ranks, what the MPI backend counts as read from another
         * node is what its worker 0 receives from the other ranks */
        const double mpi = ranks > 1 ? (double)ws[k].comm.cross_domain_read : 0.0;
        row->local_bytes = fmax(row->local_bytes, b - mpi);
        row->mpi_bytes = fmax(row->mpi_bytes, mpi);
        rank_size *rk = row->rank ? &row->rank[k / (n / ranks)] : NULL;
        if (rk && ws[k].memory.peak_total > rk->mem.peak_total)
            rk->mem = ws[k].memory;
        if (rk && b > rk->comm_bytes)
            rk->comm_bytes = b;
    }
    row->ok = 1;
    row->workers = n / ranks;
    row->ranks = ranks;
    row->threads = row->c.threads;
    row->mem = ws[worst].memory;
    row->comm_bytes = bytes;
    row->flops = ws[worst].flops;
    row->n_costs = ws[worst].n_costs;
    memcpy(row->costs, ws[worst].costs, sizeof row->costs);
    free(ws);
}

static void judge_row(plan_row *row, double budget)
{
    row->budget = budget;
    if (!row->ok)
        return;
    row->fits = (double)row->mem.peak_total <= budget;
    if (row->fits)
        return;
    row->over = 0;
    for (int k = 1; k < ST_MEM_KIND_COUNT; k++)
        if (row->mem.peak[k] > row->mem.peak[row->over])
            row->over = k;
}

/* A worker's rate (GB/s) of a memory-bound pass over `bytes` when
 * `sharing` workers run such passes at once, from its rate alone, r.  The
 * single thread's rates say which part of a pass's time is spent beyond
 * the caches at a size (from none at the smallest size measured to all at
 * the largest); that part, at the size of all the workers' passes
 * together, runs at a worker's share of the machine's total. */
static double shared_rate(const st_calibration *cal, double r, double bytes, int sharing)
{
    const double cache = cal->elementwise_gbps[0];
    const double dram = cal->elementwise_gbps[ST_CAL_PASSES - 1];
    if (sharing <= 1 || !(cache > dram) || !(dram > 0.0) || !(cal->stream_all_gbps > 0.0))
        return r;
    const double all = st_calibration_pass_rate(cal, bytes * sharing);
    double beyond = (cache / all - 1.0) / (cache / dram - 1.0);
    beyond = beyond < 0.0 ? 0.0 : beyond > 1.0 ? 1.0 : beyond;
    const double share = fmin(dram, cal->stream_all_gbps / sharing);
    const double per_byte = (1.0 - beyond) / cache + beyond / share;
    return fmin(r, 1.0 / per_byte);
}

/* How much a chain of layers slows a product of c's size: the narrow
 * chain's factor up to its operands (256 x 256), the wide chain's from
 * its (1024 x 1024), between them as the log of the largest operand's
 * elements says; the narrow one alone where the wide was not measured. */
static double chain_at(const st_calibration *cal, int b, const st_step_cost *c)
{
    if (!(cal->chain_wide[b] > 0.0))
        return cal->chain[b];
    const double m = (double)c->m, n = (double)c->n, k = (double)c->k;
    const double largest = fmax(fmax(m * k, k * n), m * n);
    double x = log(largest / (256.0 * 256.0)) / log(16.0);
    x = x < 0.0 ? 0.0 : x > 1.0 ? 1.0 : x;
    return exp((1.0 - x) * log(cal->chain[b]) + x * log(cal->chain_wide[b]));
}

/* Seconds of one worker's step at the calibration's rates: each product
 * at the rate the grid gives its own shape, slowed as the calibration's
 * chain of layers' products was against the grid; a convolution at its
 * product's rate, scaled as the calibration's convolution layer ran
 * against its product; each element-wise pass at its operation's rate or
 * its bytes' plus a primitive call each; the optimizer's update at the
 * library's measured rate; the engine's bytes at the reduction's rate;
 * the memory-bound parts shared among the machine's workers.  NAN when a
 * rate it needs is not measured. */
static double predict_step(const plan_row *row, const st_calibration *cal)
{
    const int sharing = row->workers;
    /* a team's primitives run on its T threads: its products, convolutions
     * and operations at the calibrated team's speedup, each call at the
     * team's call time; its moves, update and reduction are the worker's
     * own loops, on its first thread */
    const int team = row->threads > 1;
    const st_team_rates tr = team ? st_calibration_team_rates(cal, row->threads)
                                  : (st_team_rates){ 0.0, 0.0, 0, 0, 0.0 };
    if (team && !(tr.pass > 0.0))
        return NAN;
    /* an operation's work on the team: the calibrated relu's speedup with
     * its call's cost to the team taken out (that is each call's, below) */
    const double region_s = tr.call_us * 1e-6;
    const double relu1 = cal->op_ns[ST_OP_RELU][0] * 1024.0 * 256.0 * 1e-9;
    const double relu_team = team ? relu1 / tr.pass : 0.0;
    const double op_speedup = !team ? 1.0
                              : relu_team > region_s ? fmin(row->threads, relu1 /
                                                                         (relu_team - region_s))
                                                     : row->threads;
    const double call_s = cal->call_us * 1e-6 + region_s;
    const double move_call_s = cal->call_us * 1e-6;
    double t = 0.0;
    /* none: no step to price */
    if (row->n_costs < 1 || row->n_costs > ST_STEP_COSTS_MAX || !(op_speedup > 0.0) ||
        (team && !(relu_team > 0.0)))
        return NAN;
    for (int i = 0; i < row->n_costs; i++) {
        const st_step_cost *c = &row->costs[i];
        double r = 0.0;
        switch (c->kind) {
        case ST_COST_MATMUL: {
            /* slowed as a chain of layers' products ran against the same
             * alone (and with every CPU running one against one alone), and
             * attention's as its strided heads' against stacked */
            const int b = c->bf16 ? 1 : 0;
            const double chain = chain_at(cal, b, c) *
                                 (c->heads ? cal->attention[b] : 1.0) *
                                 (sharing > 1 ? cal->chain_all[b] : 1.0);
            r = chain > 0.0 ? st_calibration_matmul_rate(cal, c->bf16, c->operands, (double)c->m,
                                                         (double)c->n, (double)c->k) / chain
                            : 0.0;
            if (team)
                r *= st_calibration_team_matmul(cal, &tr, c->bf16, c->flops / c->count);
            t += r > 0.0 ? c->flops / (r * 1e9) : NAN;
            break;
        }
        case ST_COST_CONV: {
            /* the calibration's layer: 32 x 32 x 32 pixels, 16 x 9 deep, 16 out */
            const double ref = st_calibration_matmul_rate(cal, c->bf16, ST_OPERANDS_NN, 32768.0,
                                                          16.0, 144.0);
            r = st_calibration_matmul_rate(cal, c->bf16, ST_OPERANDS_NN, (double)c->m,
                                           (double)c->n, (double)c->k) *
                (ref > 0.0 ? cal->conv_gflops[c->bf16 ? 1 : 0] / ref : 0.0);
            if (team)
                r *= st_calibration_team_matmul(cal, &tr, c->bf16, c->flops / c->count);
            t += r > 0.0 ? c->flops / (r * 1e9) : NAN;
            break;
        }
        case ST_COST_PASS: {
            /* its operation's time a value, or its bytes' at the rate of
             * their size, whichever is longer */
            const double ns = c->op == ST_OP_MEMORY ? 0.0 : cal->op_ns[c->op][c->backward];
            r = shared_rate(cal, st_calibration_pass_rate(cal, c->bytes / c->calls),
                            c->bytes / c->calls, sharing);
            if (c->op != ST_OP_MEMORY && !(ns > 0.0))
                r = 0.0;
            const double speedup = c->op == ST_OP_MEMORY ? 1.0 : op_speedup;
            t += r > 0.0 ? fmax(c->elements * ns * 1e-9, c->bytes / (r * 1e9)) / speedup +
                               c->calls * (c->op == ST_OP_MEMORY ? move_call_s : call_s)
                         : NAN;
            break;
        }
        }
    }
    /* the update of the parameters whose state the worker holds, at the
     * library's measured rate (over 1M parameters), slowed as its bytes
     * are at their size against that size's, and when shared */
    const st_optim_config *oc = &row->cfg.optim;
    const int sgd = oc->kind == ST_OPT_SGD, bf16 = oc->moments != ST_MOMENTS_FP32;
    const double params = (double)row->mem.peak[ST_MEM_OPTIMIZER] /
                          ((sgd ? 1.0 : 2.0) * (bf16 ? 2.0 : 4.0));
    const double opt_bytes = params * st_optim_bytes_per_param(oc, 0);
    const double r_alone = st_calibration_pass_rate(cal, opt_bytes);
    const double r_cal = st_calibration_pass_rate(cal, (double)(1u << 20) *
                                                            st_optim_bytes_per_param(oc, 0));
    const double r_opt = shared_rate(cal, r_alone, opt_bytes, sharing);
    const double local = row->ranks > 1 ? row->local_bytes : row->comm_bytes;
    const double r_red = shared_rate(cal, cal->reduce_gbps, local, sharing);
    const double update_ns = cal->update_ns[sgd][bf16];
    if (!(r_opt > 0.0) || !(r_cal > 0.0) || !(r_red > 0.0) || !(update_ns > 0.0))
        return NAN;
    /* ranks: worker 0's exchange with the others, the reduce-scatter's
     * and the all-gather's, while the rank's workers wait for it */
    double net = 0.0;
    if (row->ranks > 1) {
        if (!(cal->network_gbps > 0.0) || !(cal->network_us > 0.0))
            return NAN;
        net = row->mpi_bytes / (cal->network_gbps * 1e9) + 2.0 * cal->network_us * 1e-6;
    }
    return t + params * update_ns * 1e-9 * (r_cal / r_opt) + local / (r_red * 1e9) + net;
}

static void predict_row(plan_row *row, const st_calibration *cal)
{
    if (!row->ok || !cal)
        return;
    const double step = predict_step(row, cal);
    if (!(step > 0.0))
        return;
    row->step_s = step;
    const double rows = (double)row->cfg.batch *
                        (row->cfg.accumulate > 1 ? row->cfg.accumulate : 1);
    /* synth: a sample goes through every segment, each on its own workers */
    const double through = row->c.strategy == ST_STRATEGY_SYNTH && row->cfg.synth.segments > 1
                               ? (double)row->cfg.synth.segments : 1.0;
    row->samples_per_s = rows * row->workers * row->ranks / through / row->step_s;
}

/* ------------------------------------------------------------ the accuracy side */

/* The strategy's words in plan-accuracy.csv's "strategy" column. */
static void row_key(const plan_row *row, char *out, size_t n)
{
    if (row->c.strategy == ST_STRATEGY_SDP)
        snprintf(out, n, "sdp %s C=%g", st_subnet_kind_name(row->cfg.sdp.subnet),
                 row->c.coverage);
    else
        snprintf(out, n, "%s", st_strategy_name(row->c.strategy));
}

/* plan-accuracy.csv: strategy,model,delta_points,seeds,config,doc (made
 * by scripts/plan-accuracy.sh from doc/data's tables).  Lines that name
 * the row's strategy become its notes. */
static void add_notes(plan_row *row, const char *path)
{
    FILE *f;
    if (!path || st_file_open_read(path, &f) != ST_OK)
        return;
    char key[64], line[512];
    row_key(row, key, sizeof key);
    while (fgets(line, sizeof line, f) && row->n_notes < MAX_NOTES) {
        char *fields[6];
        int nf = 0;
        line[strcspn(line, "\r\n")] = '\0';
        for (char *p = line, *save = NULL, *t; nf < 6 && (t = strtok_r(p, ",", &save)); p = NULL)
            fields[nf++] = t;
        if (nf < 6 || strcmp(fields[0], key) != 0 ||
            strcmp(fields[1], st_model_kind_name(row->cfg.model.kind)) != 0)
            continue;
        snprintf(row->notes[row->n_notes++], sizeof row->notes[0],
                 "%s: %s points of test accuracy against data parallelism on %s (%s, "
                 "%s seeds), see %s", fields[0],
                 fields[2], fields[1], fields[4], fields[3], fields[5]);
    }
    fclose(f);
}

/* The installed file, else the source tree's (a build not installed). */
static const char *default_accuracy(void)
{
    static const char *const paths[] = { ST_DOCDATA_DIR "/plan-accuracy.csv",
                                         ST_SRCDIR "/doc/data/plan-accuracy.csv" };
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
        FILE *f = fopen(paths[i], "r");
        if (f) {
            fclose(f);
            return paths[i];
        }
    }
    return NULL;
}

/* ------------------------------------------------------------ output */

static int by_throughput(const void *a, const void *b)
{
    const plan_row *x = a, *y = b;
    const int fx = x->ok && x->fits, fy = y->ok && y->fits;
    if (fx != fy)
        return fy - fx;
    if (!fx && x->ok != y->ok)
        return y->ok - x->ok;
    const double sx = isnan(x->samples_per_s) || !fx ? 0.0 : x->samples_per_s;
    const double sy = isnan(y->samples_per_s) || !fy ? 0.0 : y->samples_per_s;
    if (sx != sy)
        return (sx < sy) - (sx > sy);
    return (x->order > y->order) - (x->order < y->order);
}

static void row_params(const plan_row *r, char *out, size_t n)
{
    const st_train_config *c = &r->cfg;
    switch (c->strategy) {
    case ST_STRATEGY_SDP:
        snprintf(out, n, "%s C=%g %s", st_subnet_kind_name(c->sdp.subnet), c->sdp.coverage,
                 st_masking_name(c->sdp.masking));
        break;
    case ST_STRATEGY_IST:
        snprintf(out, n, "R=%llu", (unsigned long long)c->ist.local_steps);
        break;
    case ST_STRATEGY_SYNTH:
        snprintf(out, n, "segments=%d", c->synth.segments);
        break;
    default:
        if (strcmp(st_strategy_name(c->strategy), "localsgd") == 0)
            snprintf(out, n, "R=%llu", (unsigned long long)c->localsgd.local_steps);
        else
            snprintf(out, n, "-");
    }
}

static void print_table(FILE *f, const plan_row *rows, int n, double budget, double total,
                        const char *where, const char *cal)
{
    /* a total shared by rows of different worker counts: each row's share */
    int same = 1;
    for (int i = 1; i < n; i++)
        same &= rows[i].budget == rows[0].budget;
    if (same)
        fprintf(f, "plan for %s: budget %.1f MiB a worker; time from %s\n", where, mib(budget),
                cal ? cal : "no calibration (--calibration FILE)");
    else
        fprintf(f, "plan for %s: budget %.1f MiB in all, shared evenly by each row's workers; "
                   "time from %s\n", where, mib(total),
                cal ? cal : "no calibration (--calibration FILE)");
    fprintf(f, "%-8s %-20s %-9s %-4s %-5s %5s %3s %5s | %8s %8s %8s %8s %8s %8s %9s | %9s "
               "%9s %10s | %s\n", "strategy", "parameters", "recompute", "prec", "mom",
            "N", "T", "ranks", "weights", "grads", "optim", "activ", "attent", "worksp",
            "total MiB", "MB/step", "step ms", "samples/s", "fits");
    for (int i = 0; i < n; i++) {
        const plan_row *r = &rows[i];
        char params[64];
        row_params(r, params, sizeof params);
        fprintf(f, "%-8s %-20s %-9s %-4s %-5s", st_strategy_name(r->c.strategy), params,
                st_recompute_name(r->c.recompute),
                st_precision_name(r->c.precision), st_moments_name(r->c.moments));
        if (!r->ok) {
            fprintf(f, " not possible: %s\n", r->refused);
            continue;
        }
        fprintf(f, " %5d %3d %5d |", r->workers, r->threads, r->ranks);
        const int order[] = { ST_MEM_WEIGHTS, ST_MEM_GRADIENTS, ST_MEM_OPTIMIZER,
                              ST_MEM_ACTIVATIONS, ST_MEM_ATTENTION, ST_MEM_WORKSPACE };
        for (int k = 0; k < 6; k++)
            fprintf(f, " %8.2f", mib((double)r->mem.peak[order[k]]));
        fprintf(f, " %9.2f | %9.3f", mib((double)r->mem.peak_total), r->comm_bytes / 1e6);
        if (isnan(r->step_s))
            fprintf(f, " %9s %10s", "-", "-");
        else
            fprintf(f, " %9.3f %10.0f", r->step_s * 1e3, r->samples_per_s);
        if (r->fits)
            fprintf(f, " | yes\n");
        else
            fprintf(f, " | no: over by %.1f MiB, largest %s\n",
                    mib((double)r->mem.peak_total - r->budget),
                    st_mem_kind_name((st_mem_kind)r->over));
    }
    int timed = 0;
    for (int i = 0; i < n; i++)
        timed |= !isnan(rows[i].step_s);
    if (n > 0 && rows[0].ranks > 1)
        fprintf(f, "rows of %d MPI ranks: N workers a rank, memory the busiest worker of all "
                   "ranks; %s\n", rows[0].ranks,
                timed ? "time with the exchange between ranks at the calibration's network "
                        "rate"
                      : "no predicted time without a calibration of the network between "
                        "ranks\n(mpirun -np 2 subtrain calibrate --network FILE: doc/planning.md)");
    int redraws = 0, synth = 0;
    for (int i = 0; i < n; i++) {
        redraws |= rows[i].ok && (rows[i].c.strategy == ST_STRATEGY_IST ||
                                  (rows[i].c.strategy == ST_STRATEGY_SDP &&
                                   rows[i].cfg.sdp.resample > 0));
        synth |= rows[i].ok && rows[i].c.strategy == ST_STRATEGY_SYNTH;
    }
    if (redraws)
        fprintf(f, "ist and sdp --resample rows: memory over every subnetwork drawn in the "
                   "run's --epochs or --steps;\nMB/step and step time: the first draw's "
                   "(doc/planning.md)\n");
    if (synth)
        fprintf(f, "synth rows: the segments' memory or the joined network's (--recovery-epochs), "
                   "whichever\nthe run's records report; MB/step and time: the segment epochs', "
                   "samples/s through every segment (doc/planning.md)\n");
    /* each strategy's measured differences once: its rows share them */
    int any = 0;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = rows[j].n_notes && strcmp(rows[j].notes[0], rows[i].notes[0]) == 0;
        for (int k = 0; k < rows[i].n_notes && !seen; k++) {
            if (!any++)
                fprintf(f, "measured accuracy (never predicted; the table's own runs):\n");
            fprintf(f, "  %s\n", rows[i].notes[k]);
        }
    }
}

/* A worker's memory by kind, in bytes, and its total. */
static json_t *memory_json(const st_mem_stats *m)
{
    json_t *mem = json_object();
    for (int k = 0; k < ST_MEM_KIND_COUNT; k++)
        json_object_set_new(mem, st_mem_kind_name((st_mem_kind)k),
                            json_integer((json_int_t)m->peak[k]));
    json_object_set_new(mem, "total", json_integer((json_int_t)m->peak_total));
    return mem;
}

static json_t *row_json(const plan_row *r)
{
    char params[64];
    row_params(r, params, sizeof params);
    json_t *o = json_object();
    json_object_set_new(o, "strategy", json_string(st_strategy_name(r->c.strategy)));
    json_t *pj = json_object();
    json_object_set_new(pj, "summary", json_string(params));
    if (r->c.strategy == ST_STRATEGY_SDP) {
        json_object_set_new(pj, "coverage", json_real(r->cfg.sdp.coverage));
        json_object_set_new(pj, "units", json_string(st_subnet_kind_name(r->cfg.sdp.subnet)));
        json_object_set_new(pj, "masking", json_string(st_masking_name(r->cfg.sdp.masking)));
    }
    if (r->c.strategy == ST_STRATEGY_IST)
        json_object_set_new(pj, "local_steps", json_integer((json_int_t)r->cfg.ist.local_steps));
    if (strcmp(st_strategy_name(r->c.strategy), "localsgd") == 0)
        json_object_set_new(pj, "local_steps",
                            json_integer((json_int_t)r->cfg.localsgd.local_steps));
    if (r->c.strategy == ST_STRATEGY_SYNTH)
        json_object_set_new(pj, "segments", json_integer(r->cfg.synth.segments));
    json_object_set_new(pj, "recompute", json_string(st_recompute_name(r->c.recompute)));
    json_object_set_new(o, "parameters", pj);
    json_object_set_new(o, "precision", json_string(st_precision_name(r->c.precision)));
    json_object_set_new(o, "moments", json_string(st_moments_name(r->c.moments)));
    if (!r->ok) {
        json_object_set_new(o, "possible", json_false());
        json_object_set_new(o, "why", json_string(r->refused));
        return o;
    }
    json_object_set_new(o, "possible", json_true());
    json_object_set_new(o, "workers", json_integer(r->workers * r->ranks));
    json_object_set_new(o, "workers_per_rank", json_integer(r->workers));
    json_object_set_new(o, "threads_per_worker", json_integer(r->threads));
    json_object_set_new(o, "ranks", json_integer(r->ranks));
    json_object_set_new(o, "memory_per_worker", memory_json(&r->mem));
    json_object_set_new(o, "budget_per_worker", json_real(r->budget));
    json_object_set_new(o, "fits", json_boolean(r->fits));
    json_object_set_new(o, "overflow", r->fits ? json_null()
                        : json_string(st_mem_kind_name((st_mem_kind)r->over)));
    json_object_set_new(o, "bytes_per_worker_step", json_real(r->comm_bytes));
    if (r->rank) {   /* what each rank's records report: its own busiest worker */
        json_t *ranks = json_array();
        for (int k = 0; k < r->ranks; k++) {
            json_t *rk = json_object();
            json_object_set_new(rk, "memory_per_worker", memory_json(&r->rank[k].mem));
            json_object_set_new(rk, "bytes_per_worker_step", json_real(r->rank[k].comm_bytes));
            json_array_append_new(ranks, rk);
        }
        json_object_set_new(o, "per_rank", ranks);
    }
    if (r->ranks > 1)
        json_object_set_new(o, "bytes_from_other_ranks_per_step", json_real(r->mpi_bytes));
    json_object_set_new(o, "flops_per_worker_step", json_real(r->flops));
    json_object_set_new(o, "step_s", isnan(r->step_s) ? json_null() : json_real(r->step_s));
    if (r->ranks > 1 && isnan(r->step_s))
        json_object_set_new(o, "time_not_predicted",
                            json_string("no calibration of the network between ranks"));
    json_object_set_new(o, "samples_per_s",
                        isnan(r->samples_per_s) ? json_null() : json_real(r->samples_per_s));
    json_t *notes = json_array();
    for (int k = 0; k < r->n_notes; k++)
        json_array_append_new(notes, json_string(r->notes[k]));
    json_object_set_new(o, "accuracy", notes);
    return o;
}

/* The table as JSON on stdout (path "-"), or into out (opened by
 * st_cli_out_open before the plan).  0, or 1 said. */
static int write_json(const char *path, st_cli_out *out, const plan_row *rows, int n,
                      double budget, const char *where, const char *cal)
{
    json_t *root = json_object();
    json_object_set_new(root, "machine", json_string(where));
    json_object_set_new(root, "budget_per_worker", json_real(budget));
    json_object_set_new(root, "calibration", cal ? json_string(cal) : json_null());
    json_t *arr = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(arr, row_json(&rows[i]));
    json_object_set_new(root, "rows", arr);
    int rc;
    if (strcmp(path, "-") == 0) {
        rc = json_dumpf(root, stdout, JSON_INDENT(1)) != 0 || fputc('\n', stdout) == EOF;
        if (rc)
            st_cli_error(CMD, "--json -: writing stdout failed");
    } else {
        FILE *f = st_cli_out_begin(out);
        rc = !f;
        if (f) {
            json_dumpf(root, f, JSON_INDENT(1));   /* its errors: the stream's, said by commit */
            fputc('\n', f);
            rc = st_cli_out_commit(out, f);
        }
    }
    json_decref(root);
    return rc ? 1 : 0;
}

/* ------------------------------------------------------------ main */

int st_cli_plan_main(int argc, char **argv)
{
    plan_options p;
    memset(&p, 0, sizeof p);
    p.ranks = 1;
    char **run_argv = calloc((size_t)argc + 2, sizeof *run_argv);
    if (!run_argv) {
        st_cli_error(CMD, "out of memory");
        return 1;
    }
    int run_argc, status = split_args(argc, argv, &p, run_argv, &run_argc);
    st_cli_options o;
    char err[2048];
    memset(&o, 0, sizeof o);
    if (status == 1) {
        /* as train's --help: whatever else the line holds, but a malformed
         * run option is still refused */
        run_argv[run_argc++] = "--help";
        run_argv[run_argc] = NULL;
        status = st_cli_parse(run_argc, run_argv, &o, err, sizeof err) != 0 ? EXIT_USAGE : 0;
        if (status)
            st_cli_error(CMD, "%s", err);
        else
            print_help(stdout);
        st_cli_options_free(&o);
        free(run_argv);
        return status;
    }
    if (status == 0 && st_cli_parse(run_argc, run_argv, &o, err, sizeof err) != 0) {
        st_cli_error(CMD, "%s", err);
        status = EXIT_USAGE;
    } else if (status == 0 && o.action != ST_CLI_RUN) {
        st_cli_error(CMD, "plans a training run: --help, --version and the other commands "
                          "are not for it");
        status = EXIT_USAGE;
    }
    o.train.topology = p.topology;   /* the run's parser refuses it: training is here */
    if (!p.workers_given)
        o.train.workers = 0;         /* one per core, as --workers cores */
    st_calibration cal;
    const int have_cal = status == 0 && p.calibration;
    if (have_cal && st_calibration_read(p.calibration, &cal, err, sizeof err) != 0) {
        st_cli_error(CMD, "--calibration %s: %s", ST_CLI_SHOW(p.calibration), err);
        status = EXIT_USAGE;
    }
    /* the machine first: a topology that does not load is a usage error */
    st_topology *topo = NULL;
    if (status == 0 && st_topology_load(o.train.topology, &topo) != ST_OK) {
        st_cli_error(CMD, "--topology %s: %s", ST_CLI_SHOW(o.train.topology ? o.train.topology
                                                                             : "(this machine)"),
                     st_last_error());
        status = EXIT_USAGE;
    }
    char where[256] = "";
    if (topo)
        snprintf(where, sizeof where, "%s", st_topology_name(topo));
    plan_candidate *cand = NULL;
    int n = 0, teams[MAX_TEAMS];
    const int n_teams = status == 0 ? team_sizes(&p, &o.train, topo, teams) : 0;
    if (status == 0 && n_teams < 0)
        status = EXIT_USAGE;
    if (status == 0)
        status = make_candidates(&p, &o.train, teams, n_teams, &cand, &n);
    /* an unwritable --json FILE said before the plan, not after it; one
     * the plan reads refused */
    st_cli_out out;
    const int json_file = p.json && strcmp(p.json, "-") != 0;
    const char *read = status == 0 && json_file ? st_cli_input_named(&o, p.json) : NULL;
    if (status == 0 && json_file && !read && st_cli_same_file(p.calibration, p.json))
        read = "the file --calibration reads";
    if (status == 0 && json_file && !read && st_cli_same_file(p.accuracy, p.json))
        read = "the file --accuracy reads";
    if (read) {
        st_cli_error(CMD, "--json %s is %s: name another file (the plan would overwrite it)",
                     ST_CLI_SHOW(p.json), read);
        status = EXIT_USAGE;
    }
    if (status == 0 && json_file && st_cli_out_open(&out, CMD, "--json", p.json) != 0)
        status = 1;
    const int out_open = status == 0 && json_file;
    st_dataset train, test;
    memset(&train, 0, sizeof train);
    memset(&test, 0, sizeof test);
    o.quiet = 1;
    if (status == 0 && st_cli_load_run_shapes(&o, &train, &test) != ST_OK) {
        st_cli_error(CMD, "loading data: %s", st_last_error());
        status = 1;
    }
    plan_row *rows = status == 0 ? calloc((size_t)n, sizeof *rows) : NULL;
    if (status == 0 && !rows) {
        st_cli_error(CMD, "out of memory");
        status = 1;
    }
    const char *acc = p.accuracy ? p.accuracy : default_accuracy();
    FILE *af;   /* a file named by --accuracy is one the plan can read */
    if (status == 0 && p.accuracy && st_file_open_read(p.accuracy, &af) != ST_OK) {
        char why[256];
        st_cli_error(CMD, "--accuracy %s: %s", ST_CLI_SHOW(p.accuracy),
                     st_cli_open_failure(why, sizeof why));
        status = EXIT_USAGE;
    } else if (status == 0 && p.accuracy) {
        fclose(af);
    }
    double budget = p.per_worker;
    for (int i = 0; status == 0 && i < n; i++) {
        rows[i].c = cand[i];
        rows[i].order = i;
        size_row(&rows[i], &o.train, p.ranks, &train, &test);
        if (p.total > 0.0 && rows[i].ok)
            budget = p.total / (rows[i].workers * rows[i].ranks);
        judge_row(&rows[i], budget);
        predict_row(&rows[i], have_cal ? &cal : NULL);
        add_notes(&rows[i], acc);
    }
    /* destroyed after the rows: while one topology is open, hwloc keeps
     * its plugins loaded, which each row's load would load again */
    st_topology_destroy(topo);
    if (status == 0 && p.as_given && !rows[0].ok) {
        st_cli_error(CMD, "%s", rows[0].refused);
        status = EXIT_USAGE;
    }
    if (status == 0) {
        qsort(rows, (size_t)n, sizeof *rows, by_throughput);
        const int json_only = p.json && strcmp(p.json, "-") == 0;
        if (!json_only)
            print_table(stdout, rows, n, budget, p.total, where,
                        have_cal ? p.calibration : NULL);
        if (p.json)
            status = write_json(p.json, &out, rows, n, budget, where,
                                have_cal ? p.calibration : NULL);
    } else if (out_open) {
        st_cli_out_abandon(&out);
    }
    for (int i = 0; rows && i < n; i++)
        free(rows[i].rank);
    free(rows);
    free(cand);
    st_dataset_free(&train);
    st_dataset_free(&test);
    st_cli_options_free(&o);
    free(run_argv);
    return status;
}

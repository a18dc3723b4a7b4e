/*
 * cli/topo_cmd.c — `subtrain topo`: where the workers would run.
 *
 * Nothing is bound and nothing is allocated on a node: the command only
 * makes a plan (st_plan_make is pure), so it works as well for a machine we
 * do not have (--topology synthetic:... or xml:...) as for this one, and is
 * the way to check a placement before a long run.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/comm.h>
#include <subtrain/topo.h>
#include <subtrain/train.h>

#include "cli/cli_util.h"
#include "cli/topo_cmd.h"

#define EXIT_USAGE 2
#define DEFAULT_PARAMS 1000000ull
#define MAX_PARAMS 1000000000000ull

enum { OPT_TOPOLOGY = 256, OPT_WORKERS, OPT_OVERSUBSCRIBE, OPT_CPUSET, OPT_PARAMS,
       OPT_THREADS, OPT_TEAM_SPANS, OPT_RANKS, OPT_COMPRESS, OPT_ERROR_FEEDBACK };

static const struct option long_options[] = {
    { "topology", required_argument, NULL, OPT_TOPOLOGY },
    { "workers", required_argument, NULL, OPT_WORKERS },
    { "oversubscribe", no_argument, NULL, OPT_OVERSUBSCRIBE },
    { "cpuset", required_argument, NULL, OPT_CPUSET },
    { "params", required_argument, NULL, OPT_PARAMS },
    { "threads-per-worker", required_argument, NULL, OPT_THREADS },
    { "team-spans-domains", no_argument, NULL, OPT_TEAM_SPANS },
    { "ranks", required_argument, NULL, OPT_RANKS },
    { "compress", required_argument, NULL, OPT_COMPRESS },
    { "error-feedback", no_argument, NULL, OPT_ERROR_FEEDBACK },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
};

typedef struct topo_options {
    const char *topology;        /* NULL: this machine */
    st_plan_request req;
    unsigned long long params;
    int ranks;                   /* MPI ranks, each with this plan (1: one process) */
    st_dp_config compress;       /* dp's --compress and --error-feedback */
    int help;
} topo_options;

static void print_help(FILE *f)
{
    fputs(
"Usage: subtrain topo [OPTION]...\n"
"Show where subtrain places its workers (NUMA domain, core, PU), how their\n"
"gradients are reduced, where the weight copies are (one per NUMA domain) and\n"
"the bytes each worker and domain moves a step, for this machine or a\n"
"described one.  Binds nothing.\n"
"\n"
"  --topology SPEC   the machine: omitted or '' for this one;\n"
"                    synthetic:DESC, hwloc's synthetic syntax, e.g.\n"
"                    'synthetic:pack:2 numa:4 core:16 pu:2';\n"
"                    xml:FILE, an export made with lstopo --of xml\n"
"  --workers N       number of workers (default: one per core of the cpuset)\n"
"  --oversubscribe   allow more workers than PUs (they then share PUs)\n"
"  --cpuset LIST     OS PU indices the workers may use, e.g. 0-3,8 (default:\n"
"                    the process's CPUs here, every PU of a described machine)\n"
"  --threads-per-worker T   each worker a team of T PUs in one NUMA domain\n"
"  --team-spans-domains     allow a team across NUMA domains\n"
"  --ranks R         an MPI job of R ranks, each with this plan (one rank per\n"
"                    node or socket): the hybrid plan and its traffic\n"
"  --params N        parameter count used to illustrate the reduction\n"
"                    (default 1000000)\n"
"  --compress none|randk:Q   also the bytes of dp with --compress randk:Q\n"
"                    (Q in (0, 1]): a shared random fraction Q of the\n"
"                    gradient's coordinates reduced\n"
"  --error-feedback  with --compress randk:Q: its error feedback's bytes\n"
"  -h, --help        this text\n"
"\n"
"Workers are spread evenly over NUMA domains, one per core; SMT siblings are\n"
"used only when workers outnumber cores.  OMP_PROC_BIND, OMP_PLACES and\n"
"GOMP_CPU_AFFINITY are ignored: subtrain binds its workers with hwloc.\n"
"Exit status: 0 success, 1 runtime failure, 2 bad usage.\n", f);
}

/* One-line errors and counts, prefixed with the command. */
#define CMD "subtrain topo"
#define cmd_error(...) st_cli_error(CMD, __VA_ARGS__)
#define parse_count(opt, s, lo, hi, out) st_cli_count_arg(CMD, opt, s, lo, hi, out)

static int apply_option(int c, const char *arg, void *ctx)
{
    topo_options *o = ctx;
    unsigned long long v;
    switch (c) {
    case OPT_TOPOLOGY: o->topology = arg; return 0;
    case OPT_WORKERS:
        if (parse_count("--workers", arg, 1, 65536, &v))
            return -1;
        o->req.workers = (int)v;
        return 0;
    case OPT_OVERSUBSCRIBE: o->req.oversubscribe = 1; return 0;
    case OPT_CPUSET:
        if (*arg == '\0') {
            cmd_error("--cpuset: expected a list of OS PU indices such as 0-3,8, got ''");
            return -1;
        }
        o->req.cpuset = arg;
        return 0;
    case OPT_PARAMS: return parse_count("--params", arg, 1, MAX_PARAMS, &o->params);
    case OPT_THREADS:
        if (parse_count("--threads-per-worker", arg, 1, 1024, &v))
            return -1;
        o->req.threads_per_worker = (int)v;
        return 0;
    case OPT_TEAM_SPANS: o->req.team_spans = 1; return 0;
    case OPT_RANKS:
        if (parse_count("--ranks", arg, 1, 65535, &v))
            return -1;
        o->ranks = (int)v;
        return 0;
    case OPT_COMPRESS:
        if (st_compress_parse(arg, &o->compress) != ST_OK) {
            cmd_error("--compress %s: %s", ST_CLI_SHOW(arg), st_last_error());
            return -1;
        }
        return 0;
    case OPT_ERROR_FEEDBACK: o->compress.error_feedback = 1; return 0;
    case 'h': o->help = 1; return 0;
    }
    cmd_error("internal: unhandled option %d", c);
    return -1;
}

/* Returns -1 (and has printed why) on bad usage. */
static int parse(int argc, char **argv, topo_options *o)
{
    memset(o, 0, sizeof *o);
    o->params = DEFAULT_PARAMS;
    o->ranks = 1;
    o->compress.keep = 1.0f;
    if (st_cli_parse_args(argc, argv, ":h", long_options, CMD, apply_option, o) != 0)
        return -1;
    if (!o->help && o->compress.error_feedback && o->compress.compress == ST_COMPRESS_NONE) {
        cmd_error("--error-feedback keeps what --compress randk:Q drops; without --compress "
                  "there is nothing dropped");
        return -1;
    }
    return 0;
}

/* Bad specs, cpusets and worker counts are the user's to fix (exit 2); a
 * file that cannot be read or parsed, or an hwloc failure, is a runtime
 * failure (exit 1), as for `subtrain train`. */
static int fail_status(st_status s, const char *what)
{
    cmd_error("%s: %s", what, st_last_error());
    return s == ST_ERR_INVALID ? EXIT_USAGE : EXIT_FAILURE;
}

/* dp with --compress randk:Q on cfg's plan: every worker's bytes a step,
 * consecutive equal ones on one line (the records' figure,
 * doc/reduction.md "Compressed communication"). */
static int describe_compressed(const topo_options *o, const st_comm_config *cfg)
{
    printf("\nrandom-k %g%s, bytes a step (the draw, the pack, the reduction of the kept "
           "coordinates, the spread, the all-gather):\n", (double)o->compress.keep,
           o->compress.error_feedback ? " with error feedback" : "");
    st_comm_bytes prev = { 0, 0, 0, 0, 0 }, b = prev;
    int from = 0;
    for (int w = 0; w <= cfg->n_workers; w++) {
        if (w < cfg->n_workers) {
            st_status s = st_compress_plan_bytes(&o->compress, cfg, w, &b);
            if (s != ST_OK)
                return fail_status(s, "--compress");
        }
        if (w > 0 && (w == cfg->n_workers || b.read != prev.read ||
                      b.written != prev.written ||
                      b.cross_domain_read != prev.cross_domain_read ||
                      cfg->domain_of[w] != cfg->domain_of[w - 1])) {
            if (w - from > 1)
                printf("  workers %d-%d: ", from, w - 1);
            else
                printf("  worker %d: ", from);
            printf("read %zu B (%zu B across domains), written %zu B%s\n", prev.read,
                   prev.cross_domain_read, prev.written, w - from > 1 ? " each" : "");
            from = w;
        }
        prev = b;
    }
    return 0;
}

int st_cli_topo_main(int argc, char **argv)
{
    topo_options o;
    if (parse(argc, argv, &o) != 0)
        return EXIT_USAGE;
    if (o.help) {
        print_help(stdout);
        return EXIT_SUCCESS;
    }
    const char *env = st_topology_binding_env_warning();
    if (env)
        cmd_error("warning: %s", env);

    /* On this machine under SLURM, plan as `subtrain train` would: one
     * worker per core, at most the task's CPUs (cli/options.c). */
    char err[512];
    if (!o.topology && st_cli_slurm_cpus(&o.req.core_limit, err, sizeof err)) {
        cmd_error("%s", err);
        return EXIT_USAGE;
    }
    st_topology *t = NULL;
    st_status s = st_topology_load(o.topology, &t);
    if (s != ST_OK)
        return fail_status(s, "loading the topology");
    st_plan plan;
    s = st_plan_make(t, &o.req, &plan);
    if (s != ST_OK) {
        int rc = fail_status(s, "planning");
        st_topology_destroy(t);
        return rc;
    }
    int *domain_of = malloc((size_t)plan.n_workers * sizeof *domain_of);
    int rc = EXIT_SUCCESS;
    if (!domain_of) {
        fputs("subtrain topo: out of memory\n", stderr);
        rc = EXIT_FAILURE;
    } else {
        for (int w = 0; w < plan.n_workers; w++)
            domain_of[w] = plan.workers[w].domain;
        st_plan_print(stdout, t, &plan);
        printf("\n");
        /* data parallelism as a run plans it: a weight copy per domain */
        const st_comm_config cc = { .n_workers = plan.n_workers, .n_params = (size_t)o.params,
                                    .domain_of = domain_of, .shared_params = 1 };
        st_comm_describe_config(stdout, &cc);
        if (o.compress.compress != ST_COMPRESS_NONE)
            rc = describe_compressed(&o, &cc);
        if (o.ranks > 1) {
            printf("\n");
            st_comm_describe_ranks(stdout, o.ranks, plan.n_workers, (size_t)o.params);
        }
        if (fflush(stdout) != 0) {
            fprintf(stderr, "subtrain topo: writing the output failed: %s\n", strerror(errno));
            rc = EXIT_FAILURE;
        }
    }
    free(domain_of);
    st_plan_free(&plan);
    st_topology_destroy(t);
    return rc;
}

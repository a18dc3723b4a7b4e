/*
 * comm/describe.c — st_comm_describe: the reduction tree of the
 * data-parallel case, in words, for `subtrain topo` and --verbose runs.
 *
 * It reruns the plan's rules (the same shards, the same domain map, the
 * same least-loaded assignment over the same walk as plan.c) on a
 * configuration without workers, so what it prints is what attach would
 * build when every worker holds every element.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/comm.h>
#include <subtrain/status.h>

#include "comm/plan.h"

static double mib(size_t bytes)
{
    return (double)bytes / (1024.0 * 1024.0);
}

static void print_workers(FILE *f, const char *what, int lo, int hi)
{
    if (hi - lo == 1)
        fprintf(f, "%s %d", what, lo);
    else
        fprintf(f, "%ss %d-%d", what, lo, hi - 1);
}

/* The data-parallel plan (everyone holds everything), as st_comm_attach
 * builds it: one segment per non-empty shard, the same assignments. */
void st_comm_describe(FILE *f, int n_workers, const int *domain_of, size_t n_params)
{
    if (!f)
        return;
    int D;
    if (st_comm_check_size(n_workers, n_params) != ST_OK ||
        st_comm_map_domains(n_workers, domain_of, NULL, NULL, &D) != ST_OK) {
        fprintf(f, "reduction: cannot describe: %s\n", st_last_error());
        return;
    }
    int n = n_workers;
    int *dom = malloc((size_t)n * sizeof *dom);
    int *first = malloc(((size_t)D + 1) * sizeof *first);
    size_t *sb = malloc(((size_t)n + 1) * sizeof *sb);
    size_t *load = malloc(2 * (size_t)n * sizeof *load);
    if (!dom || !first || !sb || !load) {
        fprintf(f, "reduction: cannot describe: out of memory\n");
        goto out;
    }
    st_comm_map_domains(n, domain_of, dom, first, &D);
    st_comm_shards(n_params, n, sb);
    size_t largest = 0;
    for (int w = 0; w < n; w++)
        if (sb[w + 1] - sb[w] > largest)
            largest = sb[w + 1] - sb[w];
    fprintf(f, "reduction: %d worker%s, %d NUMA domain%s, %zu parameters (%.2f MiB); "
            "shard w (up to %zu floats, boundaries on 16-float lines) owned by worker w; %s\n",
            n, n == 1 ? "" : "s", D, D == 1 ? "" : "s", n_params, mib(n_params * sizeof(float)),
            largest, D == 1 ? "single level" : "two levels (domain partials, then owners)");
    for (int d = 0; d < D; d++) {
        int lo = first[d], hi = first[d + 1], m = hi - lo;
        size_t own = sb[hi] - sb[lo], remote = n_params - own;
        fprintf(f, "domain %d: ", d);
        print_workers(f, "worker", lo, hi);
        fprintf(f, " own%s ", m == 1 ? "s" : "");
        print_workers(f, "shard", lo, hi);
        fprintf(f, " = [%zu, %zu) (%.2f MiB)", sb[lo], sb[hi], mib(own * sizeof(float)));
        if (D == 1) {
            fprintf(f, "; each owner sums workers 0-%d in order and divides by %d; the "
                    "all-gather copies every shard from its owner; no cross-domain reads\n",
                    n - 1, n);
            continue;
        }
        fprintf(f, "\n");
        /* level 1: this domain's partials of remote shards */
        size_t *load_p = load, *load_c = load + n;
        memset(load, 0, 2 * (size_t)n * sizeof *load);
        fprintf(f, "  domain %d level 1: ", d);
        if (m == 1) {
            fprintf(f, "no partials (one worker: remote owners read its gradient directly)\n");
        } else {
            fprintf(f, "partials of remote shards, each the sum of workers %d-%d in order, "
                    "written on this node:", lo, hi - 1);
            size_t written = 0;
            for (int s = 0; s < n; s++) {
                size_t len = sb[s + 1] - sb[s];
                if (dom[s] == d || len == 0)
                    continue;
                size_t j = st_comm_least_loaded(load_p, (size_t)m);
                load_p[j] += len;
                written += len * sizeof(float);
                fprintf(f, " s%d:w%d", s, lo + (int)j);
            }
            fprintf(f, " (%.2f MiB)\n", mib(written));
        }
        /* level 2: what this domain's owners read from other nodes */
        fprintf(f, "  domain %d level 2: owners sum their domain's %d gradient%s, then one "
                "partial (or a lone worker's gradient) from each of the %d other domain%s in "
                "domain order, and divide by %d: %.2f MiB cross-domain per step (single level: "
                "%.2f MiB)\n", d, m, m == 1 ? "" : "s", D - 1, D == 2 ? "" : "s", n,
                mib((size_t)(D - 1) * own * sizeof(float)),
                mib((size_t)(n - m) * own * sizeof(float)));
        /* all-gather: each remote shard enters the domain once */
        fprintf(f, "  domain %d all-gather: remote shards copied in once, by:", d);
        for (int s = 0; s < n; s++) {
            size_t len = sb[s + 1] - sb[s];
            if (dom[s] == d || len == 0)
                continue;
            size_t j = st_comm_least_loaded(load_c, (size_t)m);
            load_c[j] += len;
            fprintf(f, " s%d:w%d", s, lo + (int)j);
        }
        fprintf(f, "%s: %.2f MiB cross-domain per step (single level: %.2f MiB)\n",
                m > 1 ? ", the others copy from them locally" : "",
                mib(remote * sizeof(float)), mib((size_t)m * remote * sizeof(float)));
    }
out:
    free(dom);
    free(first);
    free(sb);
    free(load);
}

void st_comm_describe_ranks(FILE *f, int ranks, int workers_per_rank, size_t n_params)
{
    const int R = ranks, n = workers_per_rank, N = R * n;
    if (R < 1 || n < 1 || N > ST_COMM_MAX_WORKERS || n_params == 0)
        return;
    size_t *sb = malloc(sizeof *sb * ((size_t)N + 1));
    if (!sb)
        return;
    st_comm_shards(n_params, N, sb);
    fprintf(f, "hybrid plan: %d rank%s x %d worker%s = %d workers (rank r's worker w is global "
            "worker r x %d + w and owns global shard r x %d + w; the data rows, subnetworks "
            "and partitions follow the global index)\n", R, R == 1 ? "" : "s", n,
            n == 1 ? "" : "s", N, n, n);
    size_t max_out = 0;
    for (int r = 0; r < R; r++) {
        size_t lo = sb[(size_t)r * n], hi = sb[(size_t)(r + 1) * n];
        size_t out = n_params - (hi - lo);   /* its partials of the other ranks' shards */
        if (out > max_out)
            max_out = out;
        fprintf(f, "  rank %d: workers %d-%d, rank shard [%zu, %zu) (%.2f MiB)\n", r, r * n,
                r * n + n - 1, lo, hi, mib((hi - lo) * sizeof(float)));
    }
    fprintf(f, "  step, data parallel: each rank sums its %d worker%s' gradients in worker "
            "order (in one level: on nodes of several NUMA domains, run a rank per domain), sends its partial of every other rank's shard and "
            "receives the others' of its own (a message each way per peer), its owners sum the %d "
            "partials in rank order and divide by %d; the all-gather sends the masters back "
            "the same way\n", n, n == 1 ? "" : "s", R, N);
    fprintf(f, "  between ranks, per rank and step: %.2f MiB out and in (a ring all-reduce "
            "among %d ranks: %.2f MiB)\n", mib(2 * max_out * sizeof(float)), R,
            R > 1 ? st_comm_ring_bytes(R, n_params) / 1048576.0 : 0.0);
    free(sb);
}

/*
 * comm/describe.c — st_comm_describe: the reduction tree of the
 * data-parallel case, in words, for `subtrain topo` and --verbose runs.
 *
 * It reruns the plan's rules (the same shards, the same domain map, the
 * same least-loaded assignment over the same walk as plan.c) on a
 * configuration without workers, so what it prints is what attach would
 * build when every worker holds every element; st_comm_describe_config
 * adds the weight copies (shared parameters) and what each worker and each
 * domain read and write a step, counted by the plan's rules.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/comm.h>
#include <subtrain/status.h>

#include "comm/plan.h"
#include "core/error.h"

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

/* The data-parallel layout every description starts from: domains, their
 * first workers and the shards (NULL tables: out of memory). */
typedef struct dp_layout {
    int n, D;
    int *dom, *first;
    size_t *sb;
    size_t P;
    /* domain `assigned`'s holders of each other domain's shard s: the one
     * that sums its partial (part[s]) and the one that copies it in
     * (copy[s]), as indices in the domain (-1: none); the same for every
     * worker of the domain, so computed once per domain, not per worker */
    int assigned;
    int *part, *copy;
} dp_layout;

static void layout_free(dp_layout *l)
{
    free(l->dom);
    free(l->first);
    free(l->sb);
    free(l->part);
    free(l->copy);
}

/* 0, or -1 after printing why there is no description (f NULL: the
 * message is st_last_error's). */
static int layout_make(FILE *f, const st_comm_config *cfg, dp_layout *l)
{
    memset(l, 0, sizeof *l);
    int D;
    if (st_comm_check_size(cfg->n_workers, cfg->n_params) != ST_OK ||
        st_comm_map_domains(cfg->n_workers, cfg->domain_of, NULL, NULL, &D) != ST_OK) {
        if (f)
            fprintf(f, "reduction: cannot describe: %s\n", st_last_error());
        return -1;
    }
    l->n = cfg->n_workers;
    l->D = D;
    l->P = cfg->n_params;
    l->dom = malloc((size_t)l->n * sizeof *l->dom);
    l->first = malloc(((size_t)D + 1) * sizeof *l->first);
    l->sb = malloc(((size_t)l->n + 1) * sizeof *l->sb);
    l->part = malloc((size_t)l->n * sizeof *l->part);
    l->copy = malloc((size_t)l->n * sizeof *l->copy);
    l->assigned = -1;
    if (!l->dom || !l->first || !l->sb || !l->part || !l->copy) {
        layout_free(l);
        if (f)
            fprintf(f, "reduction: cannot describe: out of memory\n");
        else
            st_fail(ST_ERR_NOMEM, "out of memory for the plan's layout");
        return -1;
    }
    st_comm_map_domains(l->n, cfg->domain_of, l->dom, l->first, &D);
    st_comm_shards(l->P, l->n, l->sb);
    return 0;
}

/* The reduction tree: the header, then per domain its shards, the
 * partials of level 1, the owners' level 2 and the all-gather (shared:
 * into the domain's weight copy). */
static void describe_tree(FILE *f, const dp_layout *l, int shared, size_t *load)
{
    const int n = l->n, D = l->D;
    const int *dom = l->dom, *first = l->first;
    const size_t *sb = l->sb, n_params = l->P;
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
            fprintf(f, "; each owner sums workers 0-%d in order and divides by %d; %s; no "
                    "cross-domain reads\n", n - 1, n,
                    shared ? "each owner updates its shard of the weight copy in place: the "
                             "all-gather copies nothing"
                           : "the all-gather copies every shard from its owner");
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
        if (shared)
            fprintf(f, ", into the domain's weight copy: %.2f MiB cross-domain per step (a "
                    "replica per worker, single level: %.2f MiB)\n", mib(remote * sizeof(float)),
                    mib((size_t)m * remote * sizeof(float)));
        else
            fprintf(f, "%s: %.2f MiB cross-domain per step (single level: %.2f MiB)\n",
                    m > 1 ? ", the others copy from them locally" : "",
                    mib(remote * sizeof(float)), mib((size_t)m * remote * sizeof(float)));
    }
}

static void describe(FILE *f, const st_comm_config *cfg, int bytes);

/* The data-parallel plan (everyone holds everything), as st_comm_attach
 * builds it: one segment per non-empty shard, the same assignments. */
void st_comm_describe(FILE *f, int n_workers, const int *domain_of, size_t n_params)
{
    if (!f)
        return;
    const st_comm_config cfg = { .n_workers = n_workers, .n_params = n_params,
                                 .domain_of = domain_of };
    describe(f, &cfg, 0);
}

/* ------------------------------------------------------------ bytes */

static void count_read(st_comm_bytes *b, size_t bytes, int cross)
{
    b->read += bytes;
    if (cross)
        b->cross_domain_read += bytes;
}

static void count_gather(st_comm_bytes *b, size_t n, int cross)
{
    count_read(b, n * sizeof(float), cross);
    b->written += n * sizeof(float);
    b->gather_read += n * sizeof(float);
    b->gather_written += n * sizeof(float);
}

/* Worker w's bytes a step in the data-parallel plan, by the rules of
 * plan.c (its accounting, element by element: what attach counts); an
 * engine of one role counts that role's terms only. */
/* Domain d's holders for the other domains' shards (dp_layout.part and
 * copy), by the least loaded holder in shard order, as st_comm_attach
 * assigns them. */
static void assign_holders(dp_layout *l, int d, size_t *load)
{
    if (l->assigned == d)
        return;
    const size_t m = (size_t)(l->first[d + 1] - l->first[d]);
    size_t *load_p = load, *load_c = load + m;
    memset(load, 0, 2 * m * sizeof *load);
    for (int s = 0; s < l->n; s++) {
        const size_t len = l->sb[s + 1] - l->sb[s];
        l->part[s] = l->copy[s] = -1;
        if (len == 0 || l->dom[s] == d)
            continue;
        if (m >= 2) {   /* a partial of this domain's holders */
            const size_t j = st_comm_least_loaded(load_p, m);
            load_p[j] += len;
            l->part[s] = (int)j;
        }
        const size_t c = st_comm_least_loaded(load_c, m);
        load_c[c] += len;
        l->copy[s] = (int)c;
    }
    l->assigned = d;
}

static st_comm_bytes dp_bytes(dp_layout *l, const st_comm_config *cfg, int w, size_t *load)
{
    const int reduce = cfg->roles == 0 || (cfg->roles & ST_COMM_REDUCE),
              gather = cfg->roles == 0 || (cfg->roles & ST_COMM_GATHER);
    const int n = l->n, dw = l->dom[w], df = l->first[dw];
    const size_t m = (size_t)(l->first[dw + 1] - df), P = l->P;
    const int bf16 = cfg->payload == ST_COMM_PAYLOAD_BF16;
    const int buffer = bf16 && cfg->bf16_at == ST_COMM_BF16_BUFFER;
    const size_t elt = buffer ? sizeof(uint16_t) : sizeof(float);   /* a gradient read */
    st_comm_bytes b = { 0, 0, 0, 0, 0 };
    if (buffer && reduce) {   /* w's conversion of its whole gradient */
        b.read += P * sizeof(float);
        b.written += P * sizeof(uint16_t);
    }
    assign_holders(l, dw, load);
    for (int s = 0; s < n; s++) {
        const size_t len = l->sb[s + 1] - l->sb[s];
        if (len == 0)
            continue;
        if (l->dom[s] == dw) {   /* the own domain's shard: from its owner */
            if (!cfg->shared_params && gather)
                count_gather(&b, len, 0);
            continue;
        }
        if (l->part[s] >= 0 && df + l->part[s] == w && reduce) {   /* its partial */
            count_read(&b, m * len * elt, 0);
            b.written += len * sizeof(float);
        }
        if (!gather)
            continue;
        if (df + l->copy[s] == w)
            count_gather(&b, len, 1);
        else if (!cfg->shared_params)
            count_gather(&b, len, 0);   /* from the domain's copier */
    }
    if (!reduce)
        return b;
    /* the owner: every domain's holders, own ones directly, others as a
     * partial (fp32) or a lone gradient, then the mean written */
    const size_t own = l->sb[w + 1] - l->sb[w];
    for (int d = 0; own > 0 && d < l->D; d++) {
        const size_t md = (size_t)(l->first[d + 1] - l->first[d]);
        if (d == dw)
            count_read(&b, md * own * elt, 0);
        else
            count_read(&b, own * (md >= 2 ? sizeof(float) : elt), 1);
    }
    b.written += own * sizeof(float);
    return b;
}

/* The bytes of every worker, consecutive equal ones on one line, then
 * each domain's sum, then the busiest worker's per parameter beside what a
 * replica per worker moves. */
static void describe_bytes(FILE *f, dp_layout *l, const st_comm_config *cfg, size_t *load)
{
    st_comm_config replica = *cfg;
    replica.shared_params = 0;
    st_comm_bytes prev = { 0, 0, 0, 0, 0 };
    double busiest = 0.0, busiest_replica = 0.0;
    int from = 0;
    fprintf(f, "bytes a step (reduce-scatter and all-gather, %s gradients, %s):\n",
            cfg->payload == ST_COMM_PAYLOAD_BF16 ? "bf16" : "fp32",
            cfg->shared_params ? "a weight copy per domain" : "a replica per worker");
    for (int w = 0; w <= l->n; w++) {
        st_comm_bytes b = prev;
        if (w < l->n) {
            b = dp_bytes(l, cfg, w, load);
            const st_comm_bytes r = dp_bytes(l, &replica, w, load);
            busiest = fmax(busiest, (double)(b.read + b.written));
            busiest_replica = fmax(busiest_replica, (double)(r.read + r.written));
        }
        const int same = w > 0 && w < l->n && l->dom[w] == l->dom[w - 1] &&
                         b.read == prev.read && b.written == prev.written &&
                         b.cross_domain_read == prev.cross_domain_read;
        if (w > 0 && !same) {
            fprintf(f, "  ");
            print_workers(f, "worker", from, w);
            fprintf(f, ": read %zu B (%zu B across domains), written %zu B%s\n", prev.read,
                    prev.cross_domain_read, prev.written, w - from > 1 ? " each" : "");
            from = w;
        }
        prev = b;
    }
    for (int d = 0; d < l->D; d++) {
        st_comm_bytes sum = { 0, 0, 0, 0, 0 };
        for (int w = l->first[d]; w < l->first[d + 1]; w++) {
            const st_comm_bytes b = dp_bytes(l, cfg, w, load);
            sum.read += b.read;
            sum.written += b.written;
            sum.cross_domain_read += b.cross_domain_read;
        }
        fprintf(f, "  domain %d: read %zu B (%zu B across domains), written %zu B\n", d,
                sum.read, sum.cross_domain_read, sum.written);
    }
    fprintf(f, "  the busiest worker: %.2f B a parameter and step (a replica per worker: %.2f; "
            "the gradients read once and the shard written once: %.2f)\n",
            busiest / (double)l->P, busiest_replica / (double)l->P,
            (double)(cfg->payload == ST_COMM_PAYLOAD_BF16 ? 2 : 4) +
                4.0 * (double)(l->sb[1] - l->sb[0]) / (double)l->P);
}

/* The weight copies: one per domain, who reads it, who writes what. */
static void describe_weights(FILE *f, const dp_layout *l)
{
    fprintf(f, "weights: one copy per NUMA domain, %zu floats (%.2f MiB; a model in bf16 adds "
            "%.2f MiB of bf16 copies), on the domain's node; %.2f MiB in all for %d worker%s "
            "(a replica per worker: %.2f MiB)\n", l->P, mib(l->P * sizeof(float)),
            mib(l->P * sizeof(uint16_t)), mib((size_t)l->D * l->P * sizeof(float)), l->n,
            l->n == 1 ? "" : "s", mib((size_t)l->n * l->P * sizeof(float)));
    for (int d = 0; d < l->D; d++) {
        const int lo = l->first[d], hi = l->first[d + 1];
        fprintf(f, "  domain %d: read by ", d);
        print_workers(f, "worker", lo, hi);
        fprintf(f, "; its owners update [%zu, %zu) in it%s\n", l->sb[lo], l->sb[hi],
                l->D > 1 ? ", the rest comes from the other domains' copies (all-gather)" : "");
    }
}

/* cfg's plan: the tree, and with `bytes` its weight copies and each
 * worker's and domain's bytes. */
static void describe(FILE *f, const st_comm_config *cfg, int bytes)
{
    dp_layout l;
    if (layout_make(f, cfg, &l) != 0)
        return;
    size_t *load = malloc(2 * (size_t)l.n * sizeof *load);
    if (!load) {
        fprintf(f, "reduction: cannot describe: out of memory\n");
    } else {
        describe_tree(f, &l, cfg->shared_params, load);
        if (bytes && cfg->shared_params)
            describe_weights(f, &l);
        if (bytes)
            describe_bytes(f, &l, cfg, load);
    }
    free(load);
    layout_free(&l);
}

st_status st_comm_plan_bytes(const st_comm_config *cfg, int w, st_comm_bytes *out)
{
    memset(out, 0, sizeof *out);
    if (!cfg || w < 0 || w >= cfg->n_workers)
        return st_fail(ST_ERR_INVALID, "st_comm_plan_bytes: worker %d of %d", w,
                       cfg ? cfg->n_workers : 0);
    dp_layout l;
    if (layout_make(NULL, cfg, &l) != 0)
        return ST_ERR_INVALID;
    size_t *load = malloc(2 * (size_t)l.n * sizeof *load);
    st_status s = load ? ST_OK : st_fail(ST_ERR_NOMEM, "out of memory for the plan's loads");
    if (load)
        *out = dp_bytes(&l, cfg, w, load);
    free(load);
    layout_free(&l);
    return s;
}

void st_comm_describe_config(FILE *f, const st_comm_config *cfg)
{
    if (!f || !cfg)
        return;
    describe(f, cfg, 1);
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

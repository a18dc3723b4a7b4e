/*
 * tests/test_mpi.c — the MPI reduction backend against the shared-buffer
 * engine, run under mpirun by tests/mpi.sh (Criterion forks every test,
 * which an MPI process must not do: this is a plain program).
 *
 *   mpirun -np R tests/test_mpi N         R ranks x N workers each
 *   mpirun -np R tests/test_mpi N0,N1,..  rank r with N_r workers
 *
 * Every rank builds the same random holdings for the R x N global workers
 * (data parallel: all of them; subnetworks: random runs with random
 * holders, some elements held by nobody where that is allowed), runs the
 * MPI engine with its N workers, and also runs one shared-buffer engine
 * of R x N workers in-process on the same gradients, as the reference,
 * with one NUMA domain per rank.  After each reduce-scatter every owner's
 * shard gradient, and after each all-gather every replica, must equal the
 * reference's bitwise: both sum each rank's (domain's) holders in worker
 * order, then the ranks in order, then divide; with one worker per rank
 * that is worker 0, 1, ... as in one domain.
 * With one worker a rank, the same cases with bf16 gradient payloads
 * (--comm-precision bf16) against the shared engine's bf16, bitwise; with
 * any workers a rank, bf16 payloads against the per-rank rounded sum the
 * backend documents, computed in the test, bitwise.
 * With a bf16 master (st_comm_config.copies_master), data parallel, the
 * replicas' copies and fp32 elements against the shared engine's, bitwise.
 * Then: three rounds of reset and attach with new holdings (IST, SDP),
 * a reduce-only engine paired with a gather-only one (backward masking),
 * an engine over the ranks 1 .. R-1 alone (synth's groups: rank 0 takes
 * no part), and a refused engine (ranks that disagree on the model) that
 * fails on every rank instead of hanging.
 *
 * Prints one line per case and "test_mpi: N passed, M failed" on rank 0;
 * exits non-zero if any rank failed a case.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>
#include <omp.h>

#include <subtrain/comm.h>
#include <subtrain/rng.h>
#include <subtrain/world.h>

#include "core/arena_impl.h"

static int rank, ranks, n_local, failed_here;
static st_comm_payload payload = ST_COMM_PAYLOAD_FP32;   /* of both engines */
static int count_of[64], first_of[65];   /* each rank's workers, and the first's global index */

/* The holdings of N global workers over p elements (runs held by random
 * subsets; dp: everyone; unheld: some runs held by nobody). */
typedef struct layout {
    int N;
    size_t p;
    unsigned char **mask;
    st_range **held;
    int *n_held;
} layout;

static void layout_make(layout *l, int N, size_t p, uint64_t seed, int dp, int unheld)
{
    l->N = N;
    l->p = p;
    l->mask = calloc((size_t)N, sizeof *l->mask);
    l->held = calloc((size_t)N, sizeof *l->held);
    l->n_held = calloc((size_t)N, sizeof *l->n_held);
    st_rng rng = st_rng_seed(seed);
    for (int w = 0; w < N; w++)
        l->mask[w] = calloc(p, 1);
    for (size_t i = 0; i < p;) {
        size_t len = 1 + (st_rng_below(&rng, 4) == 0 ? st_rng_below(&rng, (uint32_t)(p / 3 + 1))
                                                      : st_rng_below(&rng, 50));
        if (len > p - i)
            len = p - i;
        int nobody = unheld && st_rng_below(&rng, 6) == 0;
        int any = 0;
        for (int w = 0; w < N && !nobody; w++) {
            int bit = dp || st_rng_below(&rng, 2);
            memset(l->mask[w] + i, bit, len);
            any |= bit;
        }
        if (!any && !nobody)
            memset(l->mask[st_rng_below(&rng, (uint32_t)N)] + i, 1, len);
        i += len;
    }
    for (int w = 0; w < N; w++) {
        l->held[w] = malloc((p + 1) * sizeof **l->held);
        int k = 0;
        for (size_t a = 0; a < p;) {
            if (!l->mask[w][a]) {
                a++;
                continue;
            }
            size_t b = a;
            while (b < p && l->mask[w][b])
                b++;
            l->held[w][k++] = (st_range){ a, b };
            a = b;
        }
        l->n_held[w] = k;
    }
}

static void layout_free(layout *l)
{
    for (int w = 0; w < l->N; w++) {
        free(l->mask[w]);
        free(l->held[w]);
    }
    free(l->mask);
    free(l->held);
    free(l->n_held);
}

/* Worker g's compact vectors: its held elements back to back. */
static size_t compact_size(const layout *l, int g)
{
    size_t n = 0;
    for (int i = 0; i < l->n_held[g]; i++)
        n += l->held[g][i].end - l->held[g][i].begin;
    return n;
}

static void compact_offsets(const layout *l, int g, size_t *local)
{
    size_t at = 0;
    for (int i = 0; i < l->n_held[g]; i++) {
        local[i] = at;
        at += l->held[g][i].end - l->held[g][i].begin;
    }
}

/* Values of worker g at step t: gradients, and the initial parameters
 * (t = 0xffff), element by element of its compact vector. */
static void fill(const layout *l, int g, uint64_t t, float *v)
{
    st_rng root = st_rng_seed(7000 + t);
    st_rng r = st_rng_split(&root, (uint64_t)g);
    size_t n = compact_size(l, g);
    for (size_t i = 0; i < n; i++)
        v[i] = st_rng_normal(&r);
}

/* One engine's run: attach the workers [first, first + count) of the
 * layout (global indices), then `steps` steps of reduce-scatter, owner
 * update master -= 0.5 x mean, all-gather.  Records every owner's shard
 * gradients (rs[g]) and every replica (ag[g]) of the last step, in the
 * full layout (elements not held: 0). */
typedef struct result {
    float **rs, **ag;   /* [global worker][p] */
} result;

static int run_engine(st_comm *c, const layout *l, int first, int count, int steps,
                      int split_engines, st_comm *c2, result *out)
{
    int bad = 0;
#pragma omp parallel num_threads(count) reduction(| : bad)
    {
        int w = omp_get_thread_num(), g = first + w;
        st_arena arena;
        st_arena_init(&arena, "test", NULL, 0);
        size_t n = compact_size(l, g);
        float *grads = calloc(n + 1, sizeof *grads), *params = calloc(n + 1, sizeof *params);
        size_t *local = calloc((size_t)l->n_held[g] + 1, sizeof *local);
        compact_offsets(l, g, local);
        fill(l, g, 0xffff, params);
        st_comm *gc = c, *pc = split_engines ? c2 : c;
        st_status s = st_comm_attach_compact(gc, w, &arena, grads, params, l->held[g], local,
                                             l->n_held[g]);
        if (s == ST_OK && split_engines)
            s = st_comm_attach_compact(pc, w, &arena, grads, params, l->held[g], local,
                                       l->n_held[g]);
        for (int t = 0; t < steps && s == ST_OK; t++) {
            fill(l, g, (uint64_t)t, grads);
            s = st_comm_reduce_scatter(gc, w);
            if (s != ST_OK)
                break;
            st_range sh = st_comm_shard(gc, w);
            float *sg = st_comm_shard_grads(gc, w), *m = st_comm_shard_params(pc, w);
            for (size_t i = 0; i < sh.end - sh.begin; i++)
                m[i] -= 0.5f * sg[i];
            if (t == steps - 1)
                for (size_t i = sh.begin; i < sh.end; i++)
                    out->rs[g][i] = sg[i - sh.begin];
            s = st_comm_all_gather(pc, w);
        }
        if (s == ST_OK)
            for (int i = 0; i < l->n_held[g]; i++)
                for (size_t x = l->held[g][i].begin; x < l->held[g][i].end; x++)
                    out->ag[g][x] = params[local[i] + (x - l->held[g][i].begin)];
        /* nobody reads another's master any more (the all-gather has no
         * exit barrier) before the arenas go */
        if (s == ST_OK)
            s = st_comm_barrier(pc, w);
        if (s != ST_OK) {
            fprintf(stderr, "rank %d worker %d: %s\n", rank, w, st_last_error());
            st_comm_abort(gc);
            bad = 1;
        }
        st_arena_release(&arena);
        free(grads);
        free(params);
        free(local);
    }
    return bad;
}

static void result_init(result *r, int N, size_t p)
{
    r->rs = calloc((size_t)N, sizeof *r->rs);
    r->ag = calloc((size_t)N, sizeof *r->ag);
    for (int g = 0; g < N; g++) {
        r->rs[g] = calloc(p, sizeof(float));
        r->ag[g] = calloc(p, sizeof(float));
    }
}

static void result_free(result *r, int N)
{
    for (int g = 0; g < N; g++) {
        free(r->rs[g]);
        free(r->ag[g]);
    }
    free(r->rs);
    free(r->ag);
}

static int passed, failed;

/* Every rank agrees on the verdict (a case fails if it fails anywhere). */
static void verdict(const char *name, int ok)
{
    int all_ok = ok;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    if (all_ok)
        passed++;
    else
        failed++;
    if (rank == 0)
        printf("  %-58s %s\n", name, all_ok ? "ok" : "FAILED");
    if (!ok)
        failed_here = 1;
}

/* MPI engine of this rank's workers against the shared engine of all,
 * over the ranks r0 .. R-1 (the others take no part). */
static void compare_from(const char *name, int r0, size_t p, uint64_t seed, int dp, int unheld,
                         int split, int rounds)
{
    if (rank < r0) {
        verdict(name, 1);
        return;
    }
    int N = first_of[ranks] - first_of[r0], first = first_of[rank] - first_of[r0], ok = 1;
    st_comm_config mc = { .n_workers = n_local, .n_params = p, .allow_unheld = unheld,
                          .backend = ST_COMM_BACKEND_MPI, .rank_first = r0,
                          .n_ranks = r0 ? ranks - r0 : 0, .payload = payload };
    /* the reference has one NUMA domain per rank: its two-level sums are
     * then the MPI backend's order (each domain's holders, then the
     * domains in order), so the two must agree bitwise */
    int *domain_of = malloc(sizeof *domain_of * (size_t)N);
    for (int r = r0; r < ranks; r++)
        for (int g = first_of[r]; g < first_of[r + 1]; g++)
            domain_of[g - first_of[r0]] = r - r0;
    st_comm_config sc = { .n_workers = N, .n_params = p, .allow_unheld = unheld,
                          .domain_of = domain_of, .payload = payload };
    st_comm *m = NULL, *m2 = NULL;
    if (split) {
        mc.roles = ST_COMM_REDUCE;
        sc.roles = ST_COMM_REDUCE;
    }
    if (st_comm_create(&mc, &m) != ST_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, st_last_error());
        verdict(name, 0);
        return;
    }
    if (split) {
        st_comm_config mg = mc;
        mg.roles = ST_COMM_GATHER;
        if (st_comm_create(&mg, &m2) != ST_OK) {
            fprintf(stderr, "rank %d: %s\n", rank, st_last_error());
            st_comm_destroy(m);
            verdict(name, 0);
            return;
        }
    }
    for (int round = 0; round < rounds && ok; round++) {
        layout l;
        layout_make(&l, N, p, seed + (uint64_t)round, dp, unheld);
        result got, want;
        result_init(&got, N, p);
        result_init(&want, N, p);
        if (round) {
            st_comm_reset(m);
            if (m2)
                st_comm_reset(m2);
        }
        if (run_engine(m, &l, first, n_local, 3, split, m2, &got))
            ok = 0;
        st_comm *ref = NULL, *ref2 = NULL;
        st_comm_config sg = sc;
        sg.roles = ST_COMM_GATHER;
        if (ok && (st_comm_create(&sc, &ref) != ST_OK ||
                   (split && st_comm_create(&sg, &ref2) != ST_OK))) {
            fprintf(stderr, "reference: %s\n", st_last_error());
            ok = 0;
        }
        if (ok && run_engine(ref, &l, 0, N, 3, split, ref2, &want))
            ok = 0;
        st_comm_destroy(ref);
        st_comm_destroy(ref2);
        for (int g = first; g < first + n_local && ok; g++)
            for (size_t i = 0; i < p; i++) {
                float a[2] = { got.rs[g][i], got.ag[g][i] }, b[2] = { want.rs[g][i], want.ag[g][i] };
                for (int k = 0; k < 2; k++) {
                    if (memcmp(&a[k], &b[k], sizeof a[k]) == 0)
                        continue;
                    {
                        if (ok)
                            fprintf(stderr, "rank %d %s: worker %d element %zu %s: %.9g, "
                                    "reference %.9g\n", rank, name, g, i, k ? "replica" : "mean",
                                    a[k], b[k]);
                        ok = 0;
                    }
                }
            }
        result_free(&got, N);
        result_free(&want, N);
        layout_free(&l);
    }
    st_comm_destroy(m);
    st_comm_destroy(m2);
    free(domain_of);
    verdict(name, ok);
}

static void compare(const char *name, size_t p, uint64_t seed, int dp, int unheld, int split,
                    int rounds)
{
    compare_from(name, 0, p, seed, dp, unheld, split, rounds);
}

/* An fp32 rounded to bf16 (nearest, ties to even) and widened back,
 * computed here independently of the library; a NaN stays itself. */
static float bf16_rne(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return f;
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* bf16 payloads with any number of workers a rank, against the sum the
 * backend documents (doc/reduction.md), computed here element by element:
 * a rank's partial is the fp32 sum of its holders' gradients, each rounded
 * to bf16, in worker order; a partial bound for another rank's owner is
 * rounded to bf16 (nearest, ties to even) on its way out, the owner's own
 * rank's stays fp32; the owner sums the ranks' partials in rank order and
 * divides by the holder count.  With two workers a rank most partials
 * need 9 or 10 significant bits, many of them exact ties, so a payload
 * truncated, or rounded ties away, differs.  Every owner checks its shard
 * of the last step's mean, bitwise. */
static void compare_bf16_partials(const char *name, size_t p, uint64_t seed, int dp)
{
    const int N = first_of[ranks], first = first_of[rank], steps = 3;
    int ok = 1;
    st_comm_config mc = { .n_workers = n_local, .n_params = p, .backend = ST_COMM_BACKEND_MPI,
                          .payload = ST_COMM_PAYLOAD_BF16 };
    st_comm *m = NULL;
    if (st_comm_create(&mc, &m) != ST_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, st_last_error());
        verdict(name, 0);
        return;
    }
    layout l;
    layout_make(&l, N, p, seed, dp, 0);
    result got;
    result_init(&got, N, p);
    if (run_engine(m, &l, first, n_local, steps, 0, NULL, &got))
        ok = 0;
    /* every worker's gradients of the last step, in the full layout */
    float **grad = calloc((size_t)N, sizeof *grad);
    for (int g = 0; g < N; g++) {
        grad[g] = calloc(p, sizeof **grad);
        float *v = calloc(compact_size(&l, g) + 1, sizeof *v);
        fill(&l, g, (uint64_t)(steps - 1), v);
        for (int i = 0, at = 0; i < l.n_held[g]; i++)
            for (size_t x = l.held[g][i].begin; x < l.held[g][i].end; x++)
                grad[g][x] = v[at++];
        free(v);
    }
    size_t ties = 0, wrong = 0;
    for (int w = 0; w < n_local && ok; w++) {
        const st_range sh = st_comm_shard(m, w);
        for (size_t x = sh.begin; x < sh.end; x++) {
            float sum = 0.0f;
            int count = 0;
            for (int r = 0; r < ranks; r++) {
                float part = 0.0f;
                int n = 0;
                for (int g = first_of[r]; g < first_of[r + 1]; g++)
                    if (l.mask[g][x]) {
                        const float v = bf16_rne(grad[g][x]);
                        part = n++ ? part + v : v;
                    }
                if (!n)
                    continue;
                if (r != rank) {   /* sent to this rank's owner as bf16 */
                    uint32_t u;
                    memcpy(&u, &part, sizeof u);
                    ties += (u & 0xffffu) == 0x8000u;
                    part = bf16_rne(part);
                }
                sum = count ? sum + part : part;
                count += n;
            }
            const float want = sum / (float)count, have = got.rs[first + w][x];
            if (memcmp(&have, &want, sizeof want) != 0 && wrong++ == 0)
                fprintf(stderr, "rank %d %s: worker %d element %zu mean %.9g, reference %.9g\n",
                        rank, name, first + w, x, have, want);
        }
    }
    if (wrong) {
        fprintf(stderr, "rank %d %s: %zu means differ\n", rank, name, wrong);
        ok = 0;
    }
    /* the case tests the rounding only where partials are not bf16 already:
     * with more workers than ranks, some must be exact ties */
    unsigned long long all_ties = ties;
    MPI_Allreduce(MPI_IN_PLACE, &all_ties, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (N > ranks && all_ties == 0) {
        if (rank == 0)
            fprintf(stderr, "%s: no partial was an exact tie: the case tests no rounding\n",
                    name);
        ok = 0;
    }
    for (int g = 0; g < N; g++)
        free(grad[g]);
    free(grad);
    result_free(&got, N);
    layout_free(&l);
    st_comm_destroy(m);
    verdict(name, ok);
    if (rank == 0 && N > ranks)
        printf("    (%llu of the partials sent were exact ties)\n", all_ties);
}

/* bf16 bits of f (nearest, ties to even), and back (exact). */
static uint16_t to_bf16(float f)
{
    f = bf16_rne(f);
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16);
}

static float of_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* One engine's run with a bf16 master (st_comm_config.copies_master),
 * data parallel: every worker lists the copies `cp` (n, its own bf16
 * arrays), all starting from the same values; `steps` steps of
 * reduce-scatter, owner update (outside the copies: master -= 0.5 x mean;
 * inside: its own copy, the same in fp32 and rounded to bf16), all-gather.
 * Records every replica of the last step: fp32 outside the copies, the
 * copies widened inside.  The fp32 vector's elements under the copies
 * hold a NaN that nothing may change, and nobody touches a master shard
 * there (it has no memory). */
static int run_copies(st_comm *c, size_t p, int first, int count, int steps,
                      const st_param_copy *cp, int n, result *out)
{
    int bad = 0;
    const uint32_t poison = 0x7fc0deadu;
#pragma omp parallel num_threads(count) reduction(| : bad)
    {
        int w = omp_get_thread_num(), g = first + w;
        st_arena arena;
        st_arena_init(&arena, "test", NULL, 0);
        float *grads = calloc(p + 1, sizeof *grads), *params = calloc(p + 1, sizeof *params);
        uint16_t *h = calloc(p + 1, sizeof *h);
        st_param_copy *mine = calloc((size_t)n + 1, sizeof *mine);
        layout all;
        layout_make(&all, 1, p, 0, 1, 0);
        fill(&all, 0, 0xffff, params);   /* the same initial values everywhere */
        for (int k = 0; k < n; k++) {
            mine[k] = (st_param_copy){ cp[k].offset, cp[k].count, h + cp[k].offset };
            for (size_t x = cp[k].offset; x < cp[k].offset + cp[k].count; x++) {
                h[x] = to_bf16(params[x]);
                memcpy(&params[x], &poison, sizeof poison);
            }
        }
        const st_range whole = { 0, p };
        st_comm_set_param_copies(c, w, mine, n);
        st_status s = st_comm_attach(c, w, &arena, grads, params, &whole, 1);
        for (int t = 0; t < steps && s == ST_OK; t++) {
            st_rng root = st_rng_seed(7000 + (uint64_t)t);
            st_rng r = st_rng_split(&root, (uint64_t)g);
            for (size_t i = 0; i < p; i++)
                grads[i] = st_rng_normal(&r);
            s = st_comm_reduce_scatter(c, w);
            if (s != ST_OK)
                break;
            const st_range sh = st_comm_shard(c, w);
            float *sg = st_comm_shard_grads(c, w), *m = st_comm_shard_params(c, w);
            int k = 0;
            for (size_t x = sh.begin; x < sh.end; x++) {
                while (k < n && cp[k].offset + cp[k].count <= x)
                    k++;
                if (k < n && cp[k].offset <= x)
                    h[x] = to_bf16(of_bf16(h[x]) - 0.5f * sg[x - sh.begin]);
                else
                    m[x - sh.begin] -= 0.5f * sg[x - sh.begin];
            }
            s = st_comm_all_gather(c, w);
        }
        if (s == ST_OK) {
            int k = 0;
            for (size_t x = 0; x < p; x++) {
                while (k < n && cp[k].offset + cp[k].count <= x)
                    k++;
                const int in = k < n && cp[k].offset <= x;
                uint32_t u;
                memcpy(&u, &params[x], sizeof u);
                if (in && u != poison && !bad) {
                    fprintf(stderr, "rank %d worker %d: element %zu under a copy was written\n",
                            rank, g, x);
                    bad = 1;
                }
                out->ag[g][x] = in ? of_bf16(h[x]) : params[x];
            }
        }
        if (s == ST_OK)
            s = st_comm_barrier(c, w);
        if (s != ST_OK) {
            fprintf(stderr, "rank %d worker %d: %s\n", rank, w, st_last_error());
            st_comm_abort(c);
            bad = 1;
        }
        st_arena_release(&arena);
        layout_free(&all);
        free(grads);
        free(params);
        free(h);
        free(mine);
    }
    return bad;
}

/* A bf16 master over ranks against the shared engine's over as many
 * workers in one process (one domain a rank), bitwise: the copies' values
 * come as bf16 from their owners, the other elements as fp32.  Copies:
 * random runs, so that regions mix the two kinds, some a few elements
 * long, and shards begin and end inside them. */
static void compare_copies_master(const char *name, size_t p, uint64_t seed)
{
    const int N = first_of[ranks], first = first_of[rank];
    int ok = 1;
    st_param_copy cp[64];
    int n = 0;
    st_rng rng = st_rng_seed(seed);
    for (size_t x = st_rng_below(&rng, 40); x < p && n < 64;) {
        size_t len = 1 + st_rng_below(&rng, (uint32_t)(p / 8));
        len = len < p - x ? len : p - x;
        cp[n++] = (st_param_copy){ x, len, NULL };
        x += len + 1 + st_rng_below(&rng, 60);
    }
    int *domain_of = malloc(sizeof *domain_of * (size_t)N);
    for (int r = 0; r < ranks; r++)
        for (int g = first_of[r]; g < first_of[r + 1]; g++)
            domain_of[g] = r;
    st_comm_config mc = { .n_workers = n_local, .n_params = p, .backend = ST_COMM_BACKEND_MPI,
                          .copies_master = 1 };
    st_comm_config sc = { .n_workers = N, .n_params = p, .domain_of = domain_of,
                          .copies_master = 1 };
    st_comm *m = NULL, *ref = NULL;
    result got, want;
    result_init(&got, N, p);
    result_init(&want, N, p);
    if (st_comm_create(&mc, &m) != ST_OK || st_comm_create(&sc, &ref) != ST_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, st_last_error());
        ok = 0;
    }
    if (ok && run_copies(m, p, first, n_local, 3, cp, n, &got))
        ok = 0;
    if (ok && run_copies(ref, p, 0, N, 3, cp, n, &want))
        ok = 0;
    for (int g = first; g < first + n_local && ok; g++)
        for (size_t i = 0; i < p && ok; i++)
            if (memcmp(&got.ag[g][i], &want.ag[g][i], sizeof(float)) != 0) {
                fprintf(stderr, "rank %d %s: worker %d element %zu replica %.9g, reference "
                        "%.9g\n", rank, name, g, i, got.ag[g][i], want.ag[g][i]);
                ok = 0;
            }
    /* the copies move as bf16: less than the fp32 replica's 4 bytes */
    st_comm_bytes b = st_comm_bytes_per_step(m, 0);
    if (ok && rank == 0)
        printf("    (worker 0 of rank 0: %zu bytes a step, %zu of them from other ranks)\n",
               (size_t)b.read + b.written, (size_t)b.cross_domain_read);
    st_comm_destroy(m);
    st_comm_destroy(ref);
    result_free(&got, N);
    result_free(&want, N);
    free(domain_of);
    verdict(name, ok);
}

/* Ranks that describe different engines are refused on every rank. */
static void refused(void)
{
    st_comm_config mc = { .n_workers = n_local, .n_params = (size_t)(100 + (rank == 1)),
                          .backend = ST_COMM_BACKEND_MPI };
    st_comm *m = NULL;
    st_status s = st_comm_create(&mc, &m);
    int ok = s != ST_OK && strstr(st_last_error(), "every rank must run the same");
    if (rank == 0 && s != ST_OK)
        printf("    (refused: %s)\n", st_last_error());
    st_comm_destroy(m);
    verdict("ranks with different models are refused on every rank", ok);
}

int main(int argc, char **argv)
{
    if (st_world_init(&argc, &argv) != ST_OK) {
        fprintf(stderr, "test_mpi: %s\n", st_last_error());
        return 1;
    }
    if (!st_world_launched()) {
        fprintf(stderr, "test_mpi: run it under mpirun (tests/mpi.sh)\n");
        st_world_finalize();
        return 1;
    }
    rank = st_world_rank();
    ranks = st_world_size();
    /* N for every rank, or N0,N1,... (the last repeats) */
    const char *arg = argc > 1 ? argv[1] : "1";
    if (ranks > 64) {
        fprintf(stderr, "test_mpi: at most 64 ranks\n");
        st_world_finalize();
        return 1;
    }
    first_of[0] = 0;
    for (int r = 0; r < ranks; r++) {
        char *end;
        long v = strtol(arg, &end, 10);
        count_of[r] = v >= 1 && v <= 8 ? (int)v : 1;
        if (*end == ',')
            arg = end + 1;
        first_of[r + 1] = first_of[r] + count_of[r];
    }
    n_local = count_of[rank];
    omp_set_max_active_levels(1);
    if (rank == 0) {
        printf("test_mpi: %d ranks, workers", ranks);
        for (int r = 0; r < ranks; r++)
            printf(" %d", count_of[r]);
        printf("\n");
    }
    compare("data parallel, 1 round", 10007, 11, 1, 0, 0, 1);
    compare("data parallel, tiny vector (empty shards)", 5, 12, 1, 0, 0, 1);
    compare("subnetworks, random holders, 3 rounds of re-attach", 20011, 13, 0, 0, 0, 3);
    compare("subnetworks with unheld elements", 9001, 14, 0, 1, 0, 2);
    compare("reduce-only and gather-only engines (backward masking)", 8009, 15, 0, 0, 1, 2);
    if (ranks > 1)
        compare_from("subnetworks over ranks 1 .. R-1 alone", 1, 7001, 16, 0, 0, 0, 2);
    /* bf16 payloads: a rank of one worker sends its one rounded gradient,
     * which bf16 holds exactly, so the sums are the shared engine's (each
     * gradient rounded, fp32 sums in the same order) bitwise.  With more
     * workers a rank the partial is rounded once more on its way out, which
     * the shared engine does not do: compare_bf16_partials computes that. */
    if (first_of[ranks] == ranks) {
        payload = ST_COMM_PAYLOAD_BF16;
        compare("bf16 payloads: data parallel", 10007, 21, 1, 0, 0, 1);
        compare("bf16 payloads: subnetworks, 2 rounds", 20011, 22, 0, 0, 0, 2);
        compare("bf16 payloads: unheld elements", 9001, 23, 0, 1, 0, 1);
        compare("bf16 payloads: reduce-only and gather-only engines", 8009, 24, 0, 0, 1, 1);
        payload = ST_COMM_PAYLOAD_FP32;
    }
    /* bf16 payloads with any workers a rank (the line above: one a rank):
     * each rank's partial rounded once more, bitwise as documented */
    compare_bf16_partials("bf16 payloads: rank partials rounded, data parallel", 10007, 31, 1);
    compare_bf16_partials("bf16 payloads: rank partials rounded, subnetworks", 20011, 32, 0);
    compare_copies_master("bf16 master: copies gathered as bf16", 10007, 41);
    compare_copies_master("bf16 master: tiny vector (empty shards)", 37, 42);
    if (ranks > 1)
        refused();
    if (rank == 0)
        printf("test_mpi: %d passed, %d failed\n", passed, failed);
    st_world_finalize();
    return failed ? 1 : 0;
}

/*
 * tests/test_comm_reduce.c — the reduction engine's collectives: results
 * against a sequential reference for one to eight workers in one domain or
 * several, all-gather into replicas, determinism under artificial delays,
 * bf16 payloads, abort, the bf16 weight copies the all-gather writes and
 * the blocked ones it packs.
 *
 * The rig, one run and the reference check: tests/comm_rig.h.
 */
#include "comm_rig.h"
#include "core/blocked.h"

/* ------------------------------------------------------------ reduction */

Test(comm_reduce, one_worker)
{
    check_sizes(1, NULL, 10);
}

Test(comm_reduce, two_workers)
{
    static const int two[2] = { 0, 1 };
    check_sizes(2, NULL, 20);
    check_sizes(2, two, 30);
}

Test(comm_reduce, three_workers)
{
    static const int d[3] = { 0, 0, 1 };
    check_sizes(3, NULL, 40);
    check_sizes(3, d, 50);
}

Test(comm_reduce, four_workers, .timeout = 60)
{
    static const int pairs[4] = { 0, 0, 1, 1 }, each[4] = { 0, 1, 2, 3 };
    check_sizes(4, NULL, 60);
    check_sizes(4, pairs, 70);
    check_sizes(4, each, 80);
}

Test(comm_reduce, seven_workers, .timeout = 60)
{
    static const int d[7] = { 0, 0, 0, 1, 1, 2, 2 };
    check_sizes(7, NULL, 90);
    check_sizes(7, d, 100);
}

Test(comm_reduce, eight_workers, .timeout = 60)
{
    static const int three[8] = { 0, 0, 0, 1, 1, 2, 2, 2 }, two[8] = { 0, 0, 0, 0, 1, 1, 1, 1 };
    check_sizes(8, NULL, 110);
    check_sizes(8, three, 120);
    check_sizes(8, two, 130);
}

/* Domain ids need not start at 0 or be dense, only non-decreasing. */
Test(comm_reduce, sparse_domain_ids)
{
    static const int d[4] = { 2, 2, 5, 5 };
    check_config(4, 1000, d, 140, 0);
}

/* ------------------------------------------------------------ determinism */

static void check_determinism(int n, const int *domain_of, size_t p, uint64_t seed)
{
    enum { REPS = 50 };
    rig r;
    run_out o;
    rig_init(&r, n, p, domain_of, seed, 0);
    out_init(&o, &r, 2);
    run_rig(&r, REPS, 1, 1, &o);
    for (int w = 0; w < n; w++) {
        cr_assert_eq(o.attach[w], ST_OK, "%s", o.msg[w]);
        cr_assert_eq(o.rs[w], ST_OK);
        cr_assert_eq(o.ag[w], ST_OK);
        cr_assert_eq(o.changed[w], 0, "worker %d: %ld shard-gradient elements differ from one "
                     "repetition to another", w, o.changed[w]);
        cr_assert_eq(o.bad_params[w], 0);
    }
    out_free(&o);
    rig_free(&r);
}

Test(comm_determinism, delays_single_level, .timeout = 60)
{
    check_determinism(4, NULL, 5000, 300);
}

Test(comm_determinism, delays_two_levels, .timeout = 60)
{
    static const int d[8] = { 0, 0, 0, 1, 1, 2, 2, 2 };
    check_determinism(8, d, 5000, 310);
}

/* Changing gradients with delays: a missing barrier between the level-1
 * partials and the owners' sums, or between the all-gather's copiers and
 * their readers, would show as stale values. */
Test(comm_determinism, delays_changing_gradients, .timeout = 60)
{
    static const int d[8] = { 0, 0, 0, 1, 1, 2, 2, 2 };
    check_run(8, 3000, d, 320, 1, 12, 1);
    check_run(8, 3000, d, 330, 0, 12, 1);
}

/* ------------------------------------------------------------ shared parameters */

/* One parameter vector a domain (comm.h, shared_params): the means, the
 * masters and every domain's vector after each all-gather are those of
 * the reference, bitwise, on one domain and over two and three, every
 * size (shards empty, partial lines, several segments of copies). */
Test(comm_shared, every_size_one_two_and_three_domains, .timeout = 120)
{
    static const int two[4] = { 0, 0, 1, 1 }, lone[3] = { 0, 1, 1 },
                     three[8] = { 0, 0, 0, 1, 1, 2, 2, 2 };
    g_shared = 1;
    check_sizes(1, NULL, 900);
    check_sizes(3, NULL, 910);
    check_sizes(4, two, 920);
    check_sizes(3, lone, 930);
    check_sizes(8, three, 940);
    g_shared = 0;
}

/* Changing gradients and updates with random delays before every
 * collective, shared parameters over three domains: a worker that read
 * its domain's vector before the domain's copiers were done, or an owner
 * that updated its shard while another domain still copied it, shows as
 * a vector element differing from its owner's master (bad_params) or a
 * mean or master off the reference. */
Test(comm_shared, delays_changing_gradients, .timeout = 120)
{
    static const int d[8] = { 0, 0, 0, 1, 1, 2, 2, 2 }, two[4] = { 0, 0, 1, 1 };
    g_shared = 1;
    check_run(8, 3000, d, 950, 1, 12, 1);
    check_run(4, 20000, two, 960, 1, 12, 1);
    check_run(4, 5000, NULL, 970, 1, 12, 1);
    g_shared = 0;
}

/* bf16 payloads with shared parameters: the rounded gradients' sums. */
Test(comm_shared, bf16_payloads, .timeout = 60)
{
    static const int two[4] = { 0, 0, 1, 1 };
    g_shared = 1;
    g_payload = ST_COMM_PAYLOAD_BF16;
    check_config(4, 4099, two, 980, 1);
    check_config(4, 4099, NULL, 990, 1);
    g_payload = ST_COMM_PAYLOAD_FP32;
    g_shared = 0;
}

/* ------------------------------------------------------------ during the backward */

/* st_comm_reduce_ready: each worker writes its gradient from the top down
 * in random pieces, saying each final, with random delays (the rest NaN
 * until written); the owners reduce what every worker has said as they
 * go, the reduce-scatter the rest.  Means, masters and replicas are the
 * reference's, bitwise: one domain and two or three (each domain's
 * partials summed during the pieces too), with replicas and with shared
 * parameters, fp32 and both bf16 payloads, random holders too. */
Test(comm_ready, pieces_said_final_reduce_to_the_same_bits, .timeout = 120)
{
    static const int two[4] = { 0, 0, 1, 1 }, three[8] = { 0, 0, 0, 1, 1, 2, 2, 2 };
    g_ready_pieces = 5;
    for (int shared = 0; shared < 2; shared++) {
        g_shared = shared;
        check_run(4, 5000, NULL, 1100 + (uint64_t)shared, 1, 6, 1);
        check_run(3, 4099, NULL, 1110 + (uint64_t)shared, 1, 6, 1);
        check_run(2, 17, NULL, 1120 + (uint64_t)shared, 1, 6, 1);
        check_run(4, 5000, two, 1130 + (uint64_t)shared, 1, 6, 1);
        check_run(8, 3000, three, 1140 + (uint64_t)shared, 1, 4, 1);
    }
    g_shared = 0;
    check_run(4, 3000, NULL, 1150, 0, 6, 1);   /* random holders */
    for (int at = 0; at < 2; at++) {
        g_payload = ST_COMM_PAYLOAD_BF16;
        g_bf16_at = at ? ST_COMM_BF16_ON_READ : ST_COMM_BF16_BUFFER;
        check_run(4, 5000, NULL, 1160 + (uint64_t)at, 1, 6, 1);
        check_run(4, 3000, two, 1170 + (uint64_t)at, 0, 4, 1);
    }
    g_payload = ST_COMM_PAYLOAD_FP32;
    g_bf16_at = ST_COMM_BF16_BUFFER;
    g_ready_pieces = 0;
}

/* Every worker says its whole gradient final, then meets the others at a
 * barrier and asks again, `asks` times: each owner's means are then
 * complete before its reduce-scatter (the shard gradient, zero from
 * attach, holds the means), and the reduce-scatter leaves them as they
 * are.  The calls complete the shard from its top down, each a part
 * adjacent to the last.  One level needs one ask (the owners read the
 * gradients); two levels two (the partials, summed at the first, are
 * read at the second). */
static void check_said_by_everyone(int n, const int *domain_of, uint64_t seed, int asks)
{
    enum { P = 1000, CALLS = 3 };
    rig r;
    rig_init(&r, n, P, domain_of, seed, 1);
    float before[P], after[P];
    st_status st[MAXW][CALLS + 2];
    st_range dn[MAXW][CALLS];   /* what each call completed */
#pragma omp parallel num_threads(n)
    {
        int w = omp_get_thread_num();
        st_status *s = st[w];
        s[0] = st_comm_attach(r.c, w, &r.arena[w], r.grads[w], r.params[w], r.held[w],
                              r.n_held[w]);
        fill_grads(&r, w, 0);
        s[1] = st_comm_reduce_ready(r.c, w, 0, &dn[w][0]);
        for (int k = 1; k <= asks; k++) {
            s[k + 1] = st_comm_barrier(r.c, w);
            if (s[k + 1] == ST_OK)
                s[k + 1] = st_comm_reduce_ready(r.c, w, 0, &dn[w][k]);
        }
        st_range sh = st_comm_shard(r.c, w);
        memcpy(before + sh.begin, st_comm_shard_grads(r.c, w),
               (sh.end - sh.begin) * sizeof(float));
        if (st_comm_reduce_scatter(r.c, w) == ST_OK)
            memcpy(after + sh.begin, st_comm_shard_grads(r.c, w),
                   (sh.end - sh.begin) * sizeof(float));
    }
    for (int w = 0; w < n; w++) {
        for (int k = 0; k <= asks + 1; k++)
            cr_assert_eq(st[w][k], ST_OK, "n=%d worker %d call %d: %s", n, w, k,
                         st_last_error());
        st_range sh = st_comm_shard(r.c, w);
        size_t top = sh.end;
        for (int k = 0; k <= asks; k++) {
            const st_range *d = &dn[w][k];
            cr_assert(d->end == d->begin || (d->end == top && d->begin < top),
                      "n=%d worker %d: call %d did [%zu, %zu), the shard [%zu, %zu) was done "
                      "from %zu", n, w, k, d->begin, d->end, sh.begin, sh.end, top);
            if (d->end > d->begin)
                top = d->begin;
        }
        cr_assert_eq(top, sh.begin, "n=%d worker %d: the calls left [%zu, %zu) of its shard "
                     "to the reduce-scatter", n, w, sh.begin, top);
    }
    float *g[MAXW];
    for (int w = 0; w < n; w++)
        g[w] = r.grads[w];
    for (size_t i = 0; i < P; i++) {
        double dm, am;
        float want = ref_mean(&r, g, i, &dm, &am);
        cr_assert(same_bits(before[i], want), "n=%d element %zu: %.9g before the "
                  "reduce-scatter, the mean is %.9g", n, i, before[i], want);
        cr_assert(same_bits(after[i], want), "n=%d element %zu: %.9g after", n, i, after[i]);
    }
    rig_free(&r);
}

Test(comm_ready, said_by_everyone_means_reduced_before_the_reduce_scatter, .timeout = 30)
{
    static const int two[4] = { 0, 0, 1, 1 }, three[7] = { 0, 0, 0, 1, 2, 2, 2 };
    check_said_by_everyone(3, NULL, 1200, 1);
    check_said_by_everyone(4, two, 1210, 2);
    check_said_by_everyone(7, three, 1220, 2);
}

/* ------------------------------------------------------------ bf16 payloads */

/* Runs check_sizes-like configurations with bf16 payloads (rounded where
 * `at` says): the reference (check_run) sums the bf16-rounded gradients in
 * fp32 in the documented order and divides by the count, bitwise; dp = 1
 * is data parallelism, dp = 0 random partial holders (SDP-like: segments
 * of different holder sets, single holders, two-level partials). */
static void check_bf16(st_comm_bf16_at at, int n, const int *domain_of, uint64_t seed)
{
    size_t sizes[] = { 1, 17, (size_t)(16 * n - 1), 1000, 4099, 20000 };
    g_payload = ST_COMM_PAYLOAD_BF16;
    g_bf16_at = at;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        check_config(n, sizes[k], domain_of, seed + k, 1);
        check_config(n, sizes[k], domain_of, seed + 100 + k, 0);
    }
    g_payload = ST_COMM_PAYLOAD_FP32;
    g_bf16_at = ST_COMM_BF16_BUFFER;
}

Test(comm_bf16, buffer_single_domain, .timeout = 60)
{
    check_bf16(ST_COMM_BF16_BUFFER, 1, NULL, 600);
    check_bf16(ST_COMM_BF16_BUFFER, 2, NULL, 610);
    check_bf16(ST_COMM_BF16_BUFFER, 3, NULL, 620);
    check_bf16(ST_COMM_BF16_BUFFER, 4, NULL, 630);
}

Test(comm_bf16, buffer_two_levels, .timeout = 60)
{
    static const int pairs[4] = { 0, 0, 1, 1 }, three[8] = { 0, 0, 0, 1, 1, 2, 2, 2 };
    check_bf16(ST_COMM_BF16_BUFFER, 4, pairs, 640);
    check_bf16(ST_COMM_BF16_BUFFER, 8, three, 650);
}

Test(comm_bf16, on_read_single_domain_and_two_levels, .timeout = 60)
{
    static const int pairs[4] = { 0, 0, 1, 1 }, three[8] = { 0, 0, 0, 1, 1, 2, 2, 2 };
    check_bf16(ST_COMM_BF16_ON_READ, 2, NULL, 660);
    check_bf16(ST_COMM_BF16_ON_READ, 3, NULL, 670);
    check_bf16(ST_COMM_BF16_ON_READ, 4, pairs, 680);
    check_bf16(ST_COMM_BF16_ON_READ, 8, three, 690);
}

/* Random delays before each collective, bf16 buffers written every step:
 * the same result every repetition, and changing gradients never seen
 * stale (the buffer is rewritten at each reduce-scatter's entry). */
Test(comm_bf16, deterministic_under_delays, .timeout = 60)
{
    static const int d[8] = { 0, 0, 0, 1, 1, 2, 2, 2 };
    g_payload = ST_COMM_PAYLOAD_BF16;
    check_determinism(4, NULL, 5000, 700);
    check_determinism(8, d, 5000, 710);
    check_run(8, 3000, d, 720, 0, 12, 1);
    g_payload = ST_COMM_PAYLOAD_FP32;
}

/* The rounding itself: ties to even, carries into the exponent, infinity
 * kept, overflow to infinity, NaN stays NaN (the conversions the two
 * places use, seen through a one-worker, one-holder engine: the mean of
 * one holder is its value). */
Test(comm_bf16, rounding_cases, .timeout = 10)
{
    const uint32_t in[] = { 0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x3f807fffu, 0x7f7fffffu,
                            0x7f800000u, 0xff800000u, 0x80000001u, 0x3fffffffu, 0x7fc00001u };
    const uint32_t want[] = { 0x3f800000u, 0x3f820000u, 0x3f810000u, 0x3f800000u, 0x7f800000u,
                              0x7f800000u, 0xff800000u, 0x80000000u, 0x40000000u, 0x7fc00000u };
    enum { K = sizeof in / sizeof in[0] };
    for (int at = 0; at < 2; at++) {
        st_comm_config cfg = { .n_workers = 1, .n_params = K, .payload = ST_COMM_PAYLOAD_BF16,
                               .bf16_at = (st_comm_bf16_at)at };
        st_comm *c;
        cr_assert_eq(st_comm_create(&cfg, &c), ST_OK, "%s", st_last_error());
        st_arena a;
        st_arena_init(&a, "worker", NULL, 0);
        float g[K], p[K] = { 0 };
        memcpy(g, in, sizeof g);
        st_range all = { 0, K };
        cr_assert_eq(st_comm_attach(c, 0, &a, g, p, &all, 1), ST_OK, "%s", st_last_error());
        cr_assert_eq(st_comm_reduce_scatter(c, 0), ST_OK);
        const float *m = st_comm_shard_grads(c, 0);
        for (int k = 0; k < K; k++) {
            uint32_t got;
            memcpy(&got, &m[k], sizeof got);
            if ((want[k] & 0x7fffffffu) > 0x7f800000u)
                cr_assert(isnan(m[k]) && (got & 0x00400000u), "at %d case %d: %08x is not a "
                          "quiet NaN", at, k, got);
            else
                cr_assert_eq(got, want[k], "at %d case %d: %08x -> %08x, want %08x", at, k, in[k],
                             got, want[k]);
        }
        st_comm_destroy(c);
        st_arena_release(&a);
    }
}

/* Bytes and memory: two workers, data parallel, P = 4096 (S = 2048).
 * Buffers: each worker converts its 4096 held gradients (reads 4 x 4096,
 * writes 2 x 4096), its shard reads 2 x 2048 bf16 values (2 bytes each)
 * instead of fp32; the all-gather is fp32 as before.  The buffer is in
 * the arena's gradients (4096 x 2 bytes more than fp32).  On read: the
 * bytes of fp32, no buffer. */
Test(comm_bf16, bytes_and_memory, .timeout = 30)
{
    st_comm_bytes b[3][MAXW];
    size_t grads_mem[3];
    for (int mode = 0; mode < 3; mode++) {
        g_payload = mode ? ST_COMM_PAYLOAD_BF16 : ST_COMM_PAYLOAD_FP32;
        g_bf16_at = mode == 2 ? ST_COMM_BF16_ON_READ : ST_COMM_BF16_BUFFER;
        rig r;
        run_out o;
        rig_init(&r, 2, 4096, NULL, 800, 1);
        out_init(&o, &r, 1);
        run_rig(&r, 1, 0, 0, &o);
        for (int w = 0; w < 2; w++) {
            cr_assert_eq(o.attach[w], ST_OK, "%s", o.msg[w]);
            b[mode][w] = st_comm_bytes_per_step(r.c, w);
        }
        grads_mem[mode] = r.arena[0].stats.peak[ST_MEM_GRADIENTS];
        out_free(&o);
        rig_free(&r);
    }
    g_payload = ST_COMM_PAYLOAD_FP32;
    g_bf16_at = ST_COMM_BF16_BUFFER;
    for (int w = 0; w < 2; w++) {
        cr_assert_eq(b[0][w].read, 2 * 2048 * 4 + 4096 * 4);
        cr_assert_eq(b[0][w].written, 2048 * 4 + 4096 * 4);
        cr_assert_eq(b[1][w].read, 4096 * 4 + 2 * 2048 * 2 + 4096 * 4, "read %zu", b[1][w].read);
        cr_assert_eq(b[1][w].written, 4096 * 2 + 2048 * 4 + 4096 * 4);
        cr_assert_eq(b[1][w].gather_read, b[0][w].gather_read);
        cr_assert_eq(b[2][w].read, b[0][w].read);
        cr_assert_eq(b[2][w].written, b[0][w].written);
    }
    cr_assert_eq(grads_mem[1], grads_mem[0] + 4096 * 2, "gradients %zu vs fp32 %zu",
                 grads_mem[1], grads_mem[0]);
    cr_assert_eq(grads_mem[2], grads_mem[0]);
}

/* An unknown payload or place of rounding is refused at create. */
Test(comm_bf16, bad_config_refused)
{
    st_comm *c = NULL;
    st_comm_config cfg = { .n_workers = 2, .n_params = 100, .payload = (st_comm_payload)7 };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "payload"), "%s", st_last_error());
    cfg.payload = ST_COMM_PAYLOAD_BF16;
    cfg.bf16_at = (st_comm_bf16_at)9;
    cr_assert_eq(st_comm_create(&cfg, &c), ST_ERR_INVALID);
    cr_assert_null(c);
}

/* ------------------------------------------------------------ abort */

enum { ABORT_IN_RS, ABORT_IN_AG, ABORT_IN_BARRIER };

static void check_abort(const int *domain_of, int where)
{
    enum { N = 4 };
    rig r;
    rig_init(&r, N, 1000, domain_of, 400, 1);
    st_status got[N];
    char msg[N][256];
    int ok_attach = 1;
#pragma omp parallel num_threads(N) reduction(&& : ok_attach)
    {
        int w = omp_get_thread_num();
        st_status s = st_comm_attach(r.c, w, &r.arena[w], r.grads[w], r.params[w], r.held[w],
                                     r.n_held[w]);
        ok_attach = s == ST_OK;
        fill_grads(&r, w, 0);
        if (s == ST_OK && where != ABORT_IN_RS)
            s = st_comm_reduce_scatter(r.c, w);
        if (w == 2) {
            spin(1000000);
            st_comm_abort(r.c);
            s = ST_OK;
        } else if (s == ST_OK) {
            s = where == ABORT_IN_RS ? st_comm_reduce_scatter(r.c, w)
                : where == ABORT_IN_AG ? st_comm_all_gather(r.c, w)
                : st_comm_barrier(r.c, w);
        }
        got[w] = s;
        snprintf(msg[w], sizeof msg[w], "%s", st_last_error());
    }
    cr_assert(ok_attach);
    for (int w = 0; w < N; w++) {
        if (w == 2)
            continue;
        cr_assert_eq(got[w], ST_ERR_INVALID, "worker %d returned %d", w, (int)got[w]);
        cr_assert(strstr(msg[w], "another worker failed"), "worker %d: \"%s\"", w, msg[w]);
    }
    /* and any later call fails at once */
    cr_assert_eq(st_comm_barrier(r.c, 0), ST_ERR_INVALID);
    rig_free(&r);
}

Test(comm_abort, in_reduce_scatter, .timeout = 10)
{
    check_abort(NULL, ABORT_IN_RS);
}

Test(comm_abort, in_reduce_scatter_two_levels, .timeout = 10)
{
    static const int d[4] = { 0, 0, 1, 1 };
    check_abort(d, ABORT_IN_RS);
}

Test(comm_abort, in_all_gather, .timeout = 10)
{
    static const int d[4] = { 0, 0, 1, 1 };
    check_abort(d, ABORT_IN_AG);
}

Test(comm_abort, in_barrier, .timeout = 10)
{
    check_abort(NULL, ABORT_IN_BARRIER);
}

/* ------------------------------------------------------------ bf16 weight copies */

#define COPY_GUARD 0xdeadu   /* a bf16 copy's element nobody wrote */

/* The bf16 bits of f rounded to nearest even (bf16_round, tests/comm_rig.h). */
static uint16_t bf16_bits(float f)
{
    f = bf16_round(f);
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16);
}

/* Random copies of worker w's vector: sorted, disjoint runs of 1 to 300
 * elements with gaps of 0 to 40 between them, from element `from` on,
 * where keep says an element may be in one (NULL: any); each copy's bf16
 * at half + offset (half: p guard values). */
static int random_copies(st_rng *rng, size_t p, const unsigned char *keep, uint16_t *half,
                         st_param_copy *out, int max)
{
    int n = 0;
    size_t i = st_rng_below(rng, 3);
    while (i < p && n < max) {
        size_t len = 1 + (st_rng_below(rng, 3) == 0 ? st_rng_below(rng, 300) : st_rng_below(rng, 20));
        if (len > p - i)
            len = p - i;
        size_t ok = 0;
        while (keep && ok < len && keep[i + ok])
            ok++;
        if (!keep)
            ok = len;
        if (ok > 0) {
            out[n++] = (st_param_copy){ i, ok, half + i };
            i += ok;
        }
        i += (keep && ok < len ? 1 : 0) + st_rng_below(rng, 41);
    }
    return n;
}

/* Workers of `domain_of` (n, NULL: one domain) attach with the copies of
 * copies[w] (n_copies[w]; -1: none registered) over the rig's holdings
 * (dp: everyone holds everything), run `steps` steps (each moves the
 * masters), and after every all-gather compare each registered copy with
 * the bf16 rounding of w's parameters.  got_claims[w]: what
 * st_comm_gathers_copies said; wrong[w]: copied elements not equal to the
 * rounding of the value just gathered (only counted where claimed), or
 * guards overwritten outside the copies. */
static void run_copies(rig *r, int steps, st_param_copy *const *copies, const int *n_copies,
                       uint16_t *const *half, int *got_claims, long *wrong)
{
#pragma omp parallel num_threads(r->n)
    {
        int w = omp_get_thread_num();
        st_status s = ST_OK;
        if (n_copies[w] >= 0)
            st_comm_set_param_copies(r->c, w, copies[w], n_copies[w]);
        s = st_comm_attach(r->c, w, &r->arena[w], r->grads[w], r->params[w], r->held[w],
                           r->n_held[w]);
        got_claims[w] = s == ST_OK && st_comm_gathers_copies(r->c, w);
        st_range sh = st_comm_shard(r->c, w);
        float *mp = st_comm_shard_params(r->c, w), *sg = st_comm_shard_grads(r->c, w);
        for (int t = 0; t < steps && s == ST_OK; t++) {
            fill_grads(r, w, (uint64_t)t);
            s = st_comm_reduce_scatter(r->c, w);
            for (size_t j = 0; s == ST_OK && j < sh.end - sh.begin; j++)
                mp[j] = mp[j] - 0.37f * sg[j];
            if (s == ST_OK)
                s = st_comm_all_gather(r->c, w);
            if (s != ST_OK)
                break;
            unsigned char *in = calloc(r->p, 1);
            for (int c = 0; n_copies[w] > 0 && c < n_copies[w]; c++)
                memset(in + copies[w][c].offset, 1, copies[w][c].count);
            for (size_t i = 0; i < r->p; i++) {
                if (!in[i])
                    wrong[w] += half[w][i] != COPY_GUARD;
                else if (got_claims[w])
                    wrong[w] += half[w][i] != bf16_bits(r->params[w][i]);
            }
            free(in);
        }
        if (s != ST_OK)
            wrong[w] += 1000000;
    }
}

static uint16_t *guarded_half(size_t p)
{
    uint16_t *h = malloc(p * sizeof *h);
    for (size_t i = 0; i < p; i++)
        h[i] = COPY_GUARD;
    return h;
}

/* Data parallelism, one domain and two (where a copier brings a remote
 * shard in and its neighbours copy from its replica: phase 2): each
 * worker's all-gather writes every element of its copies, cut wherever
 * shards and segments end, as the bf16 rounding of the value it gathers,
 * and nothing outside them. */
Test(comm_copies, the_all_gather_writes_the_bf16_copies, .timeout = 60)
{
    static const int two[] = { 0, 0, 1, 1, 1 };
    const int *doms[] = { NULL, two };
    const int ns[] = { 3, 5 };
    for (int k = 0; k < 2; k++) {
        rig r;
        rig_init(&r, ns[k], 4099, doms[k], 11 + (uint64_t)k, 1);
        st_param_copy *copies[MAXW];
        uint16_t *half[MAXW];
        int n_copies[MAXW], claims[MAXW];
        long wrong[MAXW] = { 0 };
        st_rng rng = st_rng_seed(99 + (uint64_t)k);
        for (int w = 0; w < r.n; w++) {
            half[w] = guarded_half(r.p);
            copies[w] = malloc(4099 * sizeof **copies);
            n_copies[w] = random_copies(&rng, r.p, NULL, half[w], copies[w], 4099);
            cr_assert_gt(n_copies[w], 10);
        }
        run_copies(&r, 3, copies, n_copies, half, claims, wrong);
        for (int w = 0; w < r.n; w++) {
            cr_assert(claims[w], "%d workers: worker %d: the copies not claimed", r.n, w);
            cr_assert_eq(wrong[w], 0, "%d workers: worker %d: %ld copied elements wrong or "
                         "guards written", r.n, w, wrong[w]);
            free(copies[w]);
            free(half[w]);
        }
        rig_free(&r);
    }
}

/* Subnetworks (random holdings, full layout): copies inside w's held
 * elements are claimed and written; a copy that takes in one element w
 * does not hold is not claimed (the model converts, as without copies);
 * a list out of order is not taken; a reset forgets the copies. */
Test(comm_copies, only_held_sorted_copies_are_claimed, .timeout = 60)
{
    rig r;
    rig_init(&r, 4, 3001, NULL, 5, 0);
    st_param_copy *copies[MAXW];
    uint16_t *half[MAXW];
    int n_copies[MAXW], claims[MAXW];
    long wrong[MAXW] = { 0 };
    st_rng rng = st_rng_seed(123);
    for (int w = 0; w < r.n; w++) {
        half[w] = guarded_half(r.p);
        copies[w] = malloc(3001 * sizeof **copies);
        n_copies[w] = random_copies(&rng, r.p, r.mask[w], half[w], copies[w], 3001);
        cr_assert_gt(n_copies[w], 3);
    }
    /* worker 1: its first copy grows by an element it does not hold;
     * worker 2: its first two copies swapped */
    st_param_copy *c1 = copies[1];
    size_t x = c1[0].offset + c1[0].count;
    while (x < r.p && r.mask[1][x])
        x++;
    cr_assert_lt(x, r.p);
    if (n_copies[1] > 1 && c1[1].offset <= x)
        n_copies[1] = 1;
    c1[0].count = x + 1 - c1[0].offset;
    st_param_copy t = copies[2][0];
    copies[2][0] = copies[2][1];
    copies[2][1] = t;
    run_copies(&r, 2, copies, n_copies, half, claims, wrong);
    cr_assert(claims[0] && claims[3], "held copies not claimed: %d %d", claims[0], claims[3]);
    cr_assert(!claims[1], "a copy over an element worker 1 does not hold was claimed");
    cr_assert(!claims[2], "copies out of order were claimed");
    for (int w = 0; w < r.n; w++)
        if (w != 1)   /* 1's unclaimed copy was written where it holds */
            cr_assert_eq(wrong[w], 0, "worker %d: %ld copied elements wrong or guards written",
                         w, wrong[w]);
    for (size_t i = 0; i < r.p; i++)
        cr_assert_eq(half[2][i], COPY_GUARD, "worker 2's refused copies were written");

    /* a reset forgets them: attached again without, nothing is claimed */
    st_comm_reset(r.c);
    for (int w = 0; w < r.n; w++) {
        st_arena_release(&r.arena[w]);
        st_arena_init(&r.arena[w], "worker", NULL, 0);
        n_copies[w] = -1;
    }
    run_copies(&r, 1, copies, n_copies, half, claims, wrong);
    for (int w = 0; w < r.n; w++) {
        cr_assert(!claims[w], "worker %d: copies claimed after a reset", w);
        free(copies[w]);
        free(half[w]);
    }
    rig_free(&r);
}

/* ------------------------------------------------------------ blocked copies */

/* Random matrices of worker w's vector, sorted and disjoint, some small
 * and some of several packing slabs, with gaps between them, where keep
 * says an element may be in one (NULL: any).  Copy 0 of each is in the
 * matrix's own order at half + offset; every other matrix has a copy 1 at
 * half2 + offset, in a kernel's paired layout where a dim is even (rows
 * r, r + 1 side by side, or columns c, c + 1: the packing's paired
 * paths), else transposed.  small: only small ones.  paired: incremented
 * for each copy the packing takes as paired. */
static int random_blocked(st_rng *rng, size_t p, const unsigned char *keep, int small,
                          uint16_t *half, uint16_t *half2, st_param_blocked *out, int max,
                          int *paired)
{
    int n = 0;
    size_t i = st_rng_below(rng, 5);
    while (i < p && n < max) {
        const int big = !small && st_rng_below(rng, 20) == 0;
        int64_t rows = big ? 20 + st_rng_below(rng, 21) : 1 + st_rng_below(rng, small ? 4 : 9);
        int64_t cols = big ? 300 + st_rng_below(rng, 101) : 1 + st_rng_below(rng, small ? 12 : 40);
        size_t len = (size_t)(rows * cols), ok = 0;
        while (ok < len && i + ok < p && (!keep || keep[i + ok]))
            ok++;
        if (ok == len) {
            int64_t *at = malloc((size_t)(2 * (rows + cols)) * sizeof *at);
            st_param_blocked *b = &out[n++];
            *b = (st_param_blocked){ .offset = i, .rows = rows, .cols = cols, .n = 1 };
            const int pair_rows = rows % 2 == 0 && (cols % 2 || st_rng_below(rng, 2));
            const int pair_cols = !pair_rows && cols % 2 == 0;
            for (int64_t r = 0; r < rows; r++) {
                at[r] = (int64_t)i + r * cols;
                at[rows + cols + r] = (int64_t)i + (pair_rows   ? r / 2 * 2 * cols + r % 2
                                                    : pair_cols ? 2 * r
                                                                : r);
            }
            for (int64_t c = 0; c < cols; c++) {
                at[rows + c] = c;
                at[2 * rows + cols + c] = pair_rows   ? 2 * c
                                          : pair_cols ? c / 2 * 2 * rows + c % 2
                                                      : c * rows;
            }
            b->copy[0] = (struct st_blocked_copy){ half, at, at + rows, 0, 0 };
            st_blocked_pattern(&b->copy[0], rows, cols);
            if (n % 2 == 0) {
                b->copy[1] = (struct st_blocked_copy){ half2, at + rows + cols,
                                                       at + 2 * rows + cols, 0, 0 };
                st_blocked_pattern(&b->copy[1], rows, cols);
                *paired += b->copy[1].pair != 0;
                b->n = 2;
            }
            i += len;
        } else {
            i += ok + 1;
        }
        i += st_rng_below(rng, 31);
    }
    return n;
}

static void free_blocked(st_param_blocked *b, int n)
{
    for (int i = 0; i < n; i++)
        free((int64_t *)b[i].copy[0].row_at);
    free(b);
}

/* Workers attach with the blocked copies of blocked[w] (n_blocked[w]),
 * run `steps` steps, and after every all-gather compare each copy's
 * elements with the bf16 rounding of w's parameters.  got_claims[w]: what
 * st_comm_gathers_blocked said; wrong[w]: elements of claimed copies not
 * equal to it, or guards written outside the copies. */
static void run_blocked(rig *r, int steps, st_param_blocked *const *blocked,
                        const int *n_blocked, uint16_t *const *half, uint16_t *const *half2,
                        int *got_claims, long *wrong)
{
#pragma omp parallel num_threads(r->n)
    {
        int w = omp_get_thread_num();
        st_comm_set_param_blocked(r->c, w, blocked[w], n_blocked[w]);
        st_status s = st_comm_attach(r->c, w, &r->arena[w], r->grads[w], r->params[w],
                                     r->held[w], r->n_held[w]);
        got_claims[w] = s == ST_OK && st_comm_gathers_blocked(r->c, w);
        st_range sh = st_comm_shard(r->c, w);
        float *mp = st_comm_shard_params(r->c, w), *sg = st_comm_shard_grads(r->c, w);
        unsigned char *in = calloc(2 * r->p, 1);
        for (int k = 0; k < n_blocked[w]; k++) {
            const st_param_blocked *b = &blocked[w][k];
            memset(in + b->offset, 1, (size_t)(b->rows * b->cols));
            if (b->n == 2)
                memset(in + r->p + b->offset, 1, (size_t)(b->rows * b->cols));
        }
        for (int t = 0; t < steps && s == ST_OK; t++) {
            fill_grads(r, w, (uint64_t)t);
            s = st_comm_reduce_scatter(r->c, w);
            for (size_t j = 0; s == ST_OK && j < sh.end - sh.begin; j++)
                mp[j] = mp[j] - 0.37f * sg[j];
            if (s == ST_OK)
                s = st_comm_all_gather(r->c, w);
            if (s != ST_OK)
                break;
            for (size_t i = 0; i < r->p; i++) {
                wrong[w] += !in[i] && half[w][i] != COPY_GUARD;
                wrong[w] += !in[r->p + i] && half2[w][i] != COPY_GUARD;
            }
            for (int k = 0; got_claims[w] && k < n_blocked[w]; k++) {
                const st_param_blocked *b = &blocked[w][k];
                for (int64_t e = 0; e < b->rows * b->cols; e++)
                    for (int c = 0; c < b->n; c++) {
                        const struct st_blocked_copy *cp = &b->copy[c];
                        wrong[w] += cp->bf16[cp->row_at[e / b->cols] + cp->col_at[e % b->cols]] !=
                                    bf16_bits(r->params[w][b->offset + (size_t)e]);
                    }
            }
        }
        free(in);
        if (s != ST_OK)
            wrong[w] += 1000000;
    }
}

/* Replicas, one domain and two (phase 2 copies from a copier's replica):
 * every worker's all-gather packs every element of its blocked copies,
 * cut wherever shards and segments end (inside rows too), as the bf16
 * rounding of the value it gathers, and writes nothing else of them. */
Test(comm_blocked, the_all_gather_packs_the_blocked_copies, .timeout = 60)
{
    static const int two[] = { 0, 0, 1, 1, 1 };
    const int *doms[] = { NULL, two };
    const int ns[] = { 3, 5 };
    for (int k = 0; k < 2; k++) {
        rig r;
        rig_init(&r, ns[k], 50021, doms[k], 21 + (uint64_t)k, 1);
        st_param_blocked *blocked[MAXW];
        uint16_t *half[MAXW], *half2[MAXW];
        int n_blocked[MAXW], claims[MAXW];
        long wrong[MAXW] = { 0 };
        int paired = 0;
        st_rng rng = st_rng_seed(77 + (uint64_t)k);
        for (int w = 0; w < r.n; w++) {
            half[w] = guarded_half(r.p);
            half2[w] = guarded_half(r.p);
            blocked[w] = malloc(r.p * sizeof **blocked);
            n_blocked[w] = random_blocked(&rng, r.p, NULL, 0, half[w], half2[w], blocked[w],
                                          (int)r.p, &paired);
            cr_assert_gt(n_blocked[w], 10);
        }
        cr_assert_gt(paired, 10, "%d copies in a paired layout", paired);
        run_blocked(&r, 3, blocked, n_blocked, half, half2, claims, wrong);
        for (int w = 0; w < r.n; w++) {
            cr_assert(claims[w], "%d workers: worker %d: the blocked copies not claimed", r.n, w);
            cr_assert_eq(wrong[w], 0, "%d workers: worker %d: %ld packed elements wrong or "
                         "guards written", r.n, w, wrong[w]);
            free_blocked(blocked[w], n_blocked[w]);
            free(half[w]);
            free(half2[w]);
        }
        rig_free(&r);
    }
}

/* Subnetworks (random holdings): copies inside w's held elements are
 * claimed and packed; a matrix with one element w does not hold is not
 * claimed (the model packs, as before); a list out of order is not
 * taken; shared parameters claim none (their domain's copies are the
 * updates' to pack). */
Test(comm_blocked, only_held_sorted_replica_copies_are_claimed, .timeout = 60)
{
    rig r;
    rig_init(&r, 4, 6007, NULL, 9, 0);
    st_param_blocked *blocked[MAXW];
    uint16_t *half[MAXW], *half2[MAXW];
    int n_blocked[MAXW], claims[MAXW];
    long wrong[MAXW] = { 0 };
    int paired = 0;
    st_rng rng = st_rng_seed(321);
    for (int w = 0; w < r.n; w++) {
        half[w] = guarded_half(r.p);
        half2[w] = guarded_half(r.p);
        blocked[w] = malloc(r.p * sizeof **blocked);
        n_blocked[w] = random_blocked(&rng, r.p, w == 1 ? NULL : r.mask[w], 1, half[w],
                                      half2[w], blocked[w], (int)r.p, &paired);
        cr_assert_gt(n_blocked[w], 3);
    }
    /* worker 1's matrices ignore its holdings; worker 2's first two swapped */
    size_t unheld = 0;
    for (int k = 0; k < n_blocked[1]; k++)
        for (size_t e = 0; e < (size_t)(blocked[1][k].rows * blocked[1][k].cols); e++)
            unheld += !r.mask[1][blocked[1][k].offset + e];
    cr_assert_gt(unheld, 0);
    st_param_blocked t = blocked[2][0];
    blocked[2][0] = blocked[2][1];
    blocked[2][1] = t;
    run_blocked(&r, 2, blocked, n_blocked, half, half2, claims, wrong);
    cr_assert(claims[0] && claims[3], "held copies not claimed: %d %d", claims[0], claims[3]);
    cr_assert(!claims[1], "a copy over an element worker 1 does not hold was claimed");
    cr_assert(!claims[2], "copies out of order were claimed");
    for (int w = 0; w < r.n; w++)
        if (w != 1)   /* 1's unclaimed copies were packed where it holds */
            cr_assert_eq(wrong[w], 0, "worker %d: %ld packed elements wrong or guards written",
                         w, wrong[w]);
    for (size_t i = 0; i < r.p; i++)
        cr_assert(half[2][i] == COPY_GUARD && half2[2][i] == COPY_GUARD,
                  "worker 2's refused copies were written");
    for (int w = 0; w < r.n; w++) {
        free_blocked(blocked[w], n_blocked[w]);
        free(half[w]);
        free(half2[w]);
    }
    rig_free(&r);

    /* shared parameters over two domains (whose copiers bring the other
     * domain's shards in): the domain's vector, never claimed or packed */
    static const int two[] = { 0, 0, 1, 1 };
    g_shared = 1;
    rig_init(&r, 4, 6007, two, 10, 1);
    for (int w = 0; w < r.n; w++) {
        half[w] = guarded_half(r.p);
        half2[w] = guarded_half(r.p);
        blocked[w] = malloc(r.p * sizeof **blocked);
        n_blocked[w] = random_blocked(&rng, r.p, NULL, 1, half[w], half2[w], blocked[w],
                                      (int)r.p, &paired);
    }
    memset(wrong, 0, sizeof wrong);
    run_blocked(&r, 2, blocked, n_blocked, half, half2, claims, wrong);
    for (int w = 0; w < r.n; w++) {
        cr_assert(!claims[w], "worker %d: a shared vector's copies claimed", w);
        for (size_t i = 0; i < r.p; i++)
            cr_assert(half[w][i] == COPY_GUARD && half2[w][i] == COPY_GUARD,
                      "worker %d: a shared vector's copies written by the all-gather", w);
        free_blocked(blocked[w], n_blocked[w]);
        free(half[w]);
        free(half2[w]);
    }
    rig_free(&r);
    g_shared = 0;
}

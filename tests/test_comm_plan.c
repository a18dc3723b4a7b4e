/*
 * tests/test_comm_plan.c — the engine's plan: shard boundaries, the bytes
 * each worker reads and writes per step, and the printed description
 * (against the text of the engine before its split, and against the plan
 * attach builds).
 *
 * The rig, one run and the reference check: tests/comm_rig.h.
 */
#include "comm_rig.h"

/* ------------------------------------------------------------ bytes */

/* Data-parallel rig, attached; bytes of each worker into b. */
static void dp_bytes(int n, size_t p, const int *domain_of, st_comm_bytes *b)
{
    rig r;
    run_out o;
    rig_init(&r, n, p, domain_of, 500, 1);
    out_init(&o, &r, 1);
    run_rig(&r, 1, 0, 0, &o);
    for (int w = 0; w < n; w++) {
        cr_assert_eq(o.attach[w], ST_OK, "%s", o.msg[w]);
        b[w] = st_comm_bytes_per_step(r.c, w);
    }
    out_free(&o);
    rig_free(&r);
}

/* One domain, everyone holds everything: worker w reads the N gradients of
 * its shard (N S_w x 4) and the whole vector from the masters (P x 4), and
 * writes its shard gradient (S_w x 4) and its whole replica (P x 4). */
Test(comm_bytes, data_parallel_single_domain)
{
    st_comm_bytes b[MAXW];
    dp_bytes(4, 4096, NULL, b);
    for (int w = 0; w < 4; w++) {
        cr_assert_eq(b[w].read, 4 * 1024 * 4 + 4096 * 4);
        cr_assert_eq(b[w].written, 1024 * 4 + 4096 * 4);
        cr_assert_eq(b[w].cross_domain_read, 0);
    }
    /* P = 1000, N = 3: 63 lines of 16 floats -> shards of 336, 336, 328 */
    dp_bytes(3, 1000, NULL, b);
    size_t shard[3] = { 336, 336, 328 };
    for (int w = 0; w < 3; w++) {
        cr_assert_eq(b[w].read, (3 * shard[w] + 1000) * 4, "worker %d read %zu", w, b[w].read);
        cr_assert_eq(b[w].written, (shard[w] + 1000) * 4);
        cr_assert_eq(b[w].cross_domain_read, 0);
    }
}

/* Two domains of two, P = 4096, shards S = 1024 floats (s = 4096 bytes).
 * Worker 0: level 1, the partial of remote shard 2 (reads g0, g1: 2s,
 * writes s); level 2, its shard from g0, g1 (2s) and domain 1's partial
 * (s, cross), writes s; all-gather: shards 0 and 1 from local masters (2s
 * read, 2s written), shard 2 from its remote master (s, cross; it is the
 * copier), shard 3 from worker 1's replica (s).  Total read 9s, written
 * 6s, cross 2s: one read per remote domain for the reduce, one for the
 * gather, where a single level would read 2s + 2s across. */
Test(comm_bytes, data_parallel_two_domains)
{
    static const int d[4] = { 0, 0, 1, 1 };
    st_comm_bytes b[MAXW];
    dp_bytes(4, 4096, d, b);
    for (int w = 0; w < 4; w++) {
        cr_assert_eq(b[w].read, 9 * 4096, "worker %d read %zu", w, b[w].read);
        cr_assert_eq(b[w].written, 6 * 4096, "worker %d wrote %zu", w, b[w].written);
        cr_assert_eq(b[w].cross_domain_read, 2 * 4096, "worker %d: %zu", w,
                     b[w].cross_domain_read);
    }
}

/* Three domains {0,0,0,1,1,2,2,2}, P = 8192, S = 1024 floats (s = 4096
 * bytes).  Remote shards go to the least-loaded worker of a domain, ties to
 * the lowest: domain 0 computes partials of shards 3..7 as w0, w1, w2, w0,
 * w1; domain 1 of shards 0,1,2,5,6,7 as w3, w4, w3, w4, w3, w4; domain 2
 * of 0..4 as w5, w6, w7, w5, w6.  Copiers are chosen the same way.  So:
 * cross-domain reads = 2s (one partial from each of the two other domains
 * for the own shard) + s per remote shard copied in. */
Test(comm_bytes, data_parallel_three_domains)
{
    static const int d[8] = { 0, 0, 0, 1, 1, 2, 2, 2 };
    static const size_t copies[8] = { 2, 2, 1, 3, 3, 2, 2, 1 };  /* = partials computed */
    static const size_t m[8] = { 3, 3, 3, 2, 2, 3, 3, 3 };        /* domain size */
    st_comm_bytes b[MAXW];
    dp_bytes(8, 8192, d, b);
    const size_t s = 4096;
    for (int w = 0; w < 8; w++) {
        size_t remote = 8 - m[w];
        /* read: partials (m s each) + own shard (m s local + 2 s) + local
         * masters (m s) + copies (s each) + the rest from local copiers */
        size_t read = copies[w] * m[w] * s + m[w] * s + 2 * s + m[w] * s + copies[w] * s +
                      (remote - copies[w]) * s;
        size_t written = copies[w] * s + s + 8 * s;
        cr_assert_eq(b[w].cross_domain_read, (2 + copies[w]) * s, "worker %d: %zu", w,
                     b[w].cross_domain_read);
        cr_assert_eq(b[w].read, read, "worker %d read %zu, want %zu", w, b[w].read, read);
        cr_assert_eq(b[w].written, written, "worker %d wrote %zu, want %zu", w, b[w].written,
                     written);
    }
}

/* Shared parameters (one vector a domain), one domain: worker w reads the
 * N gradients of its shard and writes its mean; the all-gather moves
 * nothing, the owners having updated the domain's vector itself.  4 + 4 / N
 * bytes a parameter: the gradients read once, the shard written once. */
Test(comm_bytes, shared_parameters_single_domain)
{
    st_comm_bytes b[MAXW];
    g_shared = 1;
    dp_bytes(4, 4096, NULL, b);
    for (int w = 0; w < 4; w++) {
        cr_assert_eq(b[w].read, 4 * 1024 * 4, "worker %d read %zu", w, b[w].read);
        cr_assert_eq(b[w].written, 1024 * 4, "worker %d wrote %zu", w, b[w].written);
        cr_assert_eq(b[w].gather_read + b[w].gather_written + b[w].cross_domain_read, 0);
    }
    dp_bytes(3, 1000, NULL, b);
    size_t shard[3] = { 336, 336, 328 };
    for (int w = 0; w < 3; w++) {
        cr_assert_eq(b[w].read, 3 * shard[w] * 4, "worker %d read %zu", w, b[w].read);
        cr_assert_eq(b[w].written, shard[w] * 4);
    }
    g_shared = 0;
}

/* Shared parameters over two domains of two, P = 4096, S = 1024 floats (s
 * = 4096 bytes).  Worker 0: its partial of remote shard 2 (2s read, s
 * written), its own shard from g0, g1 and domain 1's partial (3s read, s
 * across; s written); the all-gather: shard 2 from its owner's domain
 * into domain 0's vector (s across, s written) and nothing else: shard 3
 * is worker 1's to bring in, shards 0 and 1 are updated in place.  Read
 * 6s, written 3s, across 2s, where a replica per worker reads 9s and
 * writes 6s. */
Test(comm_bytes, shared_parameters_two_domains)
{
    static const int d[4] = { 0, 0, 1, 1 };
    st_comm_bytes b[MAXW];
    g_shared = 1;
    dp_bytes(4, 4096, d, b);
    for (int w = 0; w < 4; w++) {
        cr_assert_eq(b[w].read, 6 * 4096, "worker %d read %zu", w, b[w].read);
        cr_assert_eq(b[w].written, 3 * 4096, "worker %d wrote %zu", w, b[w].written);
        cr_assert_eq(b[w].cross_domain_read, 2 * 4096, "worker %d: %zu", w,
                     b[w].cross_domain_read);
        cr_assert_eq(b[w].gather_read, 4096);
        cr_assert_eq(b[w].gather_written, 4096);
    }
    g_shared = 0;
}

/* Three domains {0,0,0,1,1,2,2,2}, P = 8192, s = 4096 bytes, shared
 * parameters: as data_parallel_three_domains, less every local copy (the
 * owners' shards of the domain and the copiers' segments for the others
 * of their domain). */
Test(comm_bytes, shared_parameters_three_domains)
{
    static const int d[8] = { 0, 0, 0, 1, 1, 2, 2, 2 };
    static const size_t copies[8] = { 2, 2, 1, 3, 3, 2, 2, 1 };  /* = partials computed */
    static const size_t m[8] = { 3, 3, 3, 2, 2, 3, 3, 3 };        /* domain size */
    st_comm_bytes b[MAXW];
    g_shared = 1;
    dp_bytes(8, 8192, d, b);
    const size_t s = 4096;
    for (int w = 0; w < 8; w++) {
        size_t read = copies[w] * m[w] * s + m[w] * s + 2 * s + copies[w] * s;
        size_t written = copies[w] * s + s + copies[w] * s;
        cr_assert_eq(b[w].cross_domain_read, (2 + copies[w]) * s, "worker %d: %zu", w,
                     b[w].cross_domain_read);
        cr_assert_eq(b[w].read, read, "worker %d read %zu, want %zu", w, b[w].read, read);
        cr_assert_eq(b[w].written, written, "worker %d wrote %zu, want %zu", w, b[w].written,
                     written);
    }
    g_shared = 0;
}

Test(comm_bytes, ring_formula)
{
    cr_assert_float_eq(st_comm_ring_bytes(4, 1000), 6000.0, 1e-9);
    cr_assert_float_eq(st_comm_ring_bytes(1, 1000), 0.0, 1e-9);
    cr_assert_float_eq(st_comm_ring_bytes(2, 1 << 20), 4.0 * (1 << 20), 1e-9);
}

/* ------------------------------------------------------------ shards */

Test(comm_shards, boundaries)
{
    st_comm *c;
    st_comm_config cfg = { .n_workers = 3, .n_params = 1000, .domain_of = NULL, .roles = 0 };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_OK);
    size_t want[4] = { 0, 336, 672, 1000 };
    for (int w = 0; w < 3; w++) {
        st_range s = st_comm_shard(c, w);
        cr_assert_eq(s.begin, want[w]);
        cr_assert_eq(s.end, want[w + 1]);
    }
    st_comm_destroy(c);

    /* P < 16 N: 7 lines of 16 floats for 8 workers, the last one empty */
    cfg = (st_comm_config){ .n_workers = 8, .n_params = 100, .domain_of = NULL, .roles = 0 };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_OK);
    for (int w = 0; w < 8; w++) {
        st_range s = st_comm_shard(c, w);
        cr_assert_eq(s.begin, w < 7 ? 16 * (size_t)w : 100);
        cr_assert_eq(s.end, w < 6 ? 16 * (size_t)w + 16 : 100);
    }
    st_comm_destroy(c);
}

Test(comm_shards, bad_config)
{
    st_comm *c = NULL;
    static const int down[3] = { 0, 1, 0 };
    st_comm_config cfg = { .n_workers = 3, .n_params = 100, .domain_of = down, .roles = 0 };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_ERR_INVALID);
    cr_assert_null(c);
    cr_assert(strstr(st_last_error(), "non-decreasing"), "%s", st_last_error());
    cfg = (st_comm_config){ .n_workers = 0, .n_params = 100, .domain_of = NULL, .roles = 0 };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_ERR_INVALID);
    cfg = (st_comm_config){ .n_workers = 2, .n_params = 0, .domain_of = NULL, .roles = 0 };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_ERR_INVALID);
}

Test(comm_shards, describe)
{
    static const int d[8] = { 0, 0, 0, 1, 1, 2, 2, 2 };
    FILE *f = tmpfile();
    cr_assert_not_null(f);
    st_comm_describe(f, 8, d, 1000000);
    st_comm_describe(f, 2, NULL, 1000);
    rewind(f);
    char line[4096];
    int lines = 0, domains = 0, level1 = 0, gathers = 0;
    while (fgets(line, sizeof line, f)) {
        lines++;
        domains += strncmp(line, "domain ", 7) == 0;
        level1 += strstr(line, "level 1") != NULL;
        gathers += strstr(line, "all-gather:") != NULL;
    }
    fclose(f);
    /* 8 workers: a header, then per domain its line, level 1, level 2 and
     * the all-gather; 2 workers: a header and one domain line */
    cr_assert_eq(lines, 1 + 3 * 4 + 2, "%d lines", lines);
    cr_assert_eq(domains, 4);
    cr_assert_eq(level1, 3);
    cr_assert_eq(gathers, 3);
}

/* st_comm_describe, character for character, against a reference text
 * captured from a build of the engine as a single file: the same shards,
 * the same least-loaded assignment of partials and copies, the same byte
 * figures. */
static char *describe_text(int n, const int *domain_of, size_t p)
{
    FILE *f = tmpfile();
    cr_assert_not_null(f);
    st_comm_describe(f, n, domain_of, p);
    long len = ftell(f);
    cr_assert_geq(len, 0);
    char *text = calloc((size_t)len + 1, 1);
    rewind(f);
    cr_assert_eq(fread(text, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    return text;
}

static void check_describe(int n, const int *domain_of, size_t p, const char *want)
{
    char *got = describe_text(n, domain_of, p);
    cr_assert_str_eq(got, want, "n=%d p=%zu: the description changed:\n%s", n, p, got);
    free(got);
}

Test(comm_shards, describe_text_unchanged)
{
    static const int pairs[4] = { 0, 0, 1, 1 }, lone[3] = { 0, 1, 1 };
    check_describe(4, pairs, 4096,
        "reduction: 4 workers, 2 NUMA domains, 4096 parameters (0.02 MiB); shard w (up "
        "to 1024 floats, boundaries on 16-float lines) owned by worker w; two levels "
        "(domain partials, then owners)\n"
        "domain 0: workers 0-1 own shards 0-1 = [0, 2048) (0.01 MiB)\n"
        "  domain 0 level 1: partials of remote shards, each the sum of workers 0-1 in "
        "order, written on this node: s2:w0 s3:w1 (0.01 MiB)\n"
        "  domain 0 level 2: owners sum their domain's 2 gradients, then one partial "
        "(or a lone worker's gradient) from each of the 1 other domain in domain "
        "order, and divide by 4: 0.01 MiB cross-domain per step (single level: 0.02 "
        "MiB)\n"
        "  domain 0 all-gather: remote shards copied in once, by: s2:w0 s3:w1, the "
        "others copy from them locally: 0.01 MiB cross-domain per step (single level: "
        "0.02 MiB)\n"
        "domain 1: workers 2-3 own shards 2-3 = [2048, 4096) (0.01 MiB)\n"
        "  domain 1 level 1: partials of remote shards, each the sum of workers 2-3 in "
        "order, written on this node: s0:w2 s1:w3 (0.01 MiB)\n"
        "  domain 1 level 2: owners sum their domain's 2 gradients, then one partial "
        "(or a lone worker's gradient) from each of the 1 other domain in domain "
        "order, and divide by 4: 0.01 MiB cross-domain per step (single level: 0.02 "
        "MiB)\n"
        "  domain 1 all-gather: remote shards copied in once, by: s0:w2 s1:w3, the "
        "others copy from them locally: 0.01 MiB cross-domain per step (single level: "
        "0.02 MiB)\n");
    /* a domain of one worker: no partials, its gradient read directly */
    check_describe(3, lone, 100,
        "reduction: 3 workers, 2 NUMA domains, 100 parameters (0.00 MiB); shard w (up "
        "to 48 floats, boundaries on 16-float lines) owned by worker w; two levels "
        "(domain partials, then owners)\n"
        "domain 0: worker 0 owns shard 0 = [0, 48) (0.00 MiB)\n"
        "  domain 0 level 1: no partials (one worker: remote owners read its gradient "
        "directly)\n"
        "  domain 0 level 2: owners sum their domain's 1 gradient, then one partial "
        "(or a lone worker's gradient) from each of the 1 other domain in domain "
        "order, and divide by 3: 0.00 MiB cross-domain per step (single level: 0.00 "
        "MiB)\n"
        "  domain 0 all-gather: remote shards copied in once, by: s1:w0 s2:w0: 0.00 "
        "MiB cross-domain per step (single level: 0.00 MiB)\n"
        "domain 1: workers 1-2 own shards 1-2 = [48, 100) (0.00 MiB)\n"
        "  domain 1 level 1: partials of remote shards, each the sum of workers 1-2 in "
        "order, written on this node: s0:w1 (0.00 MiB)\n"
        "  domain 1 level 2: owners sum their domain's 2 gradients, then one partial "
        "(or a lone worker's gradient) from each of the 1 other domain in domain "
        "order, and divide by 3: 0.00 MiB cross-domain per step (single level: 0.00 "
        "MiB)\n"
        "  domain 1 all-gather: remote shards copied in once, by: s0:w1, the others "
        "copy from them locally: 0.00 MiB cross-domain per step (single level: 0.00 "
        "MiB)\n");
    check_describe(2, NULL, 1000,
        "reduction: 2 workers, 1 NUMA domain, 1000 parameters (0.00 MiB); shard w (up "
        "to 512 floats, boundaries on 16-float lines) owned by worker w; single level\n"
        "domain 0: workers 0-1 own shards 0-1 = [0, 1000) (0.00 MiB); each owner sums "
        "workers 0-1 in order and divides by 2; the all-gather copies every shard from "
        "its owner; no cross-domain reads\n");
    check_describe(0, NULL, 1000,
        "reduction: cannot describe: number of workers must be in [1, 65535], got 0\n");
}
/* The printed plan against the plan attach builds.  For every remote
 * shard st_comm_describe names the worker of each domain that computes
 * its partial (level 1) and the one that copies it in (all-gather); the
 * engine's byte counts say what each worker does: its writes outside the
 * all-gather are its own shard gradient and the partials it computes, its
 * cross-domain reads one source per other domain for its own shard and
 * the shards it copies in.  Shards of different lengths (P not a multiple
 * of 16 N) make every choice show in the bytes, ties included. */
static void check_describe_is_the_engine(int n, const int *domain_of, size_t p)
{
    char *text = describe_text(n, domain_of, p);
    int partial[MAXW][MAXW], copier[MAXW][MAXW];   /* [shard][domain]: worker, or -1 */
    memset(partial, -1, sizeof partial);
    memset(copier, -1, sizeof copier);
    int D = 1, named = 0;
    for (char *line = text; line && *line;) {
        char *end = strchr(line, '\n');
        if (end)
            *end = '\0';
        int d, off = 0;
        int(*table)[MAXW] = NULL;
        if (sscanf(line, "  domain %d level 1: %n", &d, &off) == 1 && off > 0)
            table = partial;
        else if (sscanf(line, "  domain %d all-gather: %n", &d, &off) == 1 && off > 0)
            table = copier;
        if (table) {
            cr_assert(d >= 0 && d < MAXW, "%s", line);
            D = d + 1 > D ? d + 1 : D;
            for (char *t = strstr(line, " s"); t; t = strstr(t + 1, " s")) {
                int sh, w;
                if (sscanf(t, " s%d:w%d", &sh, &w) != 2)
                    continue;
                cr_assert(sh >= 0 && sh < n && w >= 0 && w < n, "%s", line);
                cr_assert_eq(table[sh][d], -1, "shard %d named twice: %s", sh, line);
                table[sh][d] = w;
                named++;
            }
        }
        line = end ? end + 1 : NULL;
    }
    free(text);
    st_comm *c;
    st_comm_config cfg = { .n_workers = n, .n_params = p, .domain_of = domain_of };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_OK, "%s", st_last_error());
    size_t len[MAXW];
    for (int w = 0; w < n; w++) {
        st_range r = st_comm_shard(c, w);
        len[w] = r.end - r.begin;
    }
    st_comm_destroy(c);
    st_comm_bytes b[MAXW];
    dp_bytes(n, p, domain_of, b);
    for (int w = 0; w < n; w++) {
        int d = domain_of ? domain_of[w] : 0;
        size_t written = len[w], cross = (size_t)(D - 1) * len[w];
        for (int sh = 0; sh < n; sh++) {
            written += partial[sh][d] == w ? len[sh] : 0;
            cross += copier[sh][d] == w ? len[sh] : 0;
        }
        cr_assert_eq(b[w].written - b[w].gather_written, written * 4,
                     "n=%d p=%zu: worker %d writes %zu bytes of shard gradient and partials, the "
                     "printed plan says %zu", n, p, w, b[w].written - b[w].gather_written,
                     written * 4);
        cr_assert_eq(b[w].cross_domain_read, cross * 4,
                     "n=%d p=%zu: worker %d reads %zu bytes across domains, the printed plan "
                     "says %zu", n, p, w, b[w].cross_domain_read, cross * 4);
    }
    cr_assert(D == 1 || named > 0, "n=%d p=%zu: no assignment printed", n, p);
}

Test(comm_shards, describe_is_the_plan_attach_builds)
{
    static const int pairs[4] = { 0, 0, 1, 1 }, lone[3] = { 0, 1, 1 },
                     three[8] = { 0, 0, 0, 1, 1, 2, 2, 2 }, big_small[5] = { 0, 0, 0, 0, 1 };
    static const size_t sizes[] = { 100, 112, 1000, 4096 + 48, 8192 };
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        check_describe_is_the_engine(4, pairs, sizes[i]);
        check_describe_is_the_engine(3, lone, sizes[i]);
        check_describe_is_the_engine(8, three, sizes[i]);
        check_describe_is_the_engine(5, big_small, sizes[i]);
        check_describe_is_the_engine(2, NULL, sizes[i]);
    }
}

/* st_comm_describe_config's bytes against the engine's: for every worker
 * the printed read, cross-domain read and written bytes are what attach
 * counts (st_comm_bytes_per_step), with a weight copy per domain and with
 * a replica per worker, fp32 and bf16 payloads; each domain's line is the
 * sum of its workers'. */
static void check_described_bytes(int n, const int *domain_of, size_t p, int shared,
                                  st_comm_payload payload)
{
    FILE *f = tmpfile();
    cr_assert_not_null(f);
    st_comm_config cfg = { .n_workers = n, .n_params = p, .domain_of = domain_of,
                           .payload = payload, .shared_params = shared };
    st_comm_describe_config(f, &cfg);
    rewind(f);
    size_t rd[MAXW], cross[MAXW], wr[MAXW], dom_rd[MAXW] = { 0 }, dom_wr[MAXW] = { 0 };
    int seen[MAXW] = { 0 }, domains = 0, weights = 0;
    char line[8192];
    while (fgets(line, sizeof line, f)) {
        int a, b, off = 0;
        size_t x, y, z;
        weights += strncmp(line, "weights: one copy per NUMA domain", 33) == 0;
        if (sscanf(line, "  workers %d-%d: read %zu B (%zu B across domains), written %zu B",
                   &a, &b, &x, &y, &z) == 5 ||
            (sscanf(line, "  worker %d: read %zu B (%zu B across domains), written %zu B%n", &a,
                    &x, &y, &z, &off) == 4 && off > 0 && (b = a, 1))) {
            for (int w = a; w <= b; w++) {
                cr_assert(w >= 0 && w < n, "%s", line);
                rd[w] = x;
                cross[w] = y;
                wr[w] = z;
                seen[w]++;
            }
        } else if (sscanf(line, "  domain %d: read %zu B (%zu B across domains), written %zu B",
                          &a, &x, &y, &z) == 4) {
            cr_assert(a >= 0 && a < MAXW, "%s", line);
            dom_rd[a] = x;
            dom_wr[a] = z;
            domains++;
        }
    }
    fclose(f);
    cr_assert_eq(weights, shared, "the weight copies are described with shared parameters");
    st_comm_bytes b[MAXW];
    int old = g_shared;
    st_comm_payload old_payload = g_payload;
    g_shared = shared;
    g_payload = payload;
    dp_bytes(n, p, domain_of, b);
    g_shared = old;
    g_payload = old_payload;
    size_t sum_rd[MAXW] = { 0 }, sum_wr[MAXW] = { 0 };
    for (int w = 0; w < n; w++) {
        cr_assert_eq(seen[w], 1, "n=%d p=%zu: worker %d printed %d times", n, p, w, seen[w]);
        cr_assert_eq(rd[w], b[w].read, "n=%d p=%zu shared=%d: worker %d reads %zu, the engine "
                     "says %zu", n, p, shared, w, rd[w], b[w].read);
        cr_assert_eq(cross[w], b[w].cross_domain_read, "n=%d p=%zu shared=%d: worker %d",
                     n, p, shared, w);
        cr_assert_eq(wr[w], b[w].written, "n=%d p=%zu shared=%d: worker %d writes %zu, the "
                     "engine says %zu", n, p, shared, w, wr[w], b[w].written);
        int d = domain_of ? domain_of[w] : 0;
        sum_rd[d] += b[w].read;
        sum_wr[d] += b[w].written;
    }
    for (int d = 0; d < domains; d++) {
        cr_assert_eq(dom_rd[d], sum_rd[d], "domain %d", d);
        cr_assert_eq(dom_wr[d], sum_wr[d], "domain %d", d);
    }
}

Test(comm_shards, described_bytes_are_the_engines, .timeout = 60)
{
    static const int pairs[4] = { 0, 0, 1, 1 }, lone[3] = { 0, 1, 1 },
                     three[8] = { 0, 0, 0, 1, 1, 2, 2, 2 }, big_small[5] = { 0, 0, 0, 0, 1 };
    static const size_t sizes[] = { 100, 1000, 4096 + 48 };
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        for (int shared = 0; shared < 2; shared++)
            for (int bf16 = 0; bf16 < 2; bf16++) {
                st_comm_payload pay = bf16 ? ST_COMM_PAYLOAD_BF16 : ST_COMM_PAYLOAD_FP32;
                check_described_bytes(4, pairs, sizes[i], shared, pay);
                check_described_bytes(3, lone, sizes[i], shared, pay);
                check_described_bytes(8, three, sizes[i], shared, pay);
                check_described_bytes(5, big_small, sizes[i], shared, pay);
                check_described_bytes(4, NULL, sizes[i], shared, pay);
                check_described_bytes(1, NULL, sizes[i], shared, pay);
            }
}

/* What `subtrain topo` prints of the weights for a 2-socket machine of 8
 * workers: one copy per domain, each read by its four workers, and the
 * bytes of the two-level plan beside the lower bound 4 + 4 / 8. */
Test(comm_shards, describe_config_weights_text)
{
    static const int d[8] = { 0, 0, 0, 0, 1, 1, 1, 1 };
    FILE *f = tmpfile();
    cr_assert_not_null(f);
    st_comm_config cfg = { .n_workers = 8, .n_params = 1 << 20, .domain_of = d,
                           .shared_params = 1 };
    st_comm_describe_config(f, &cfg);
    long len = ftell(f);
    char *text = calloc((size_t)len + 1, 1);
    rewind(f);
    cr_assert_eq(fread(text, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    cr_assert(strstr(text, "weights: one copy per NUMA domain, 1048576 floats (4.00 MiB; a model "
                           "in bf16 adds 2.00 MiB of bf16 copies), on the domain's node; 8.00 MiB "
                           "in all for 8 workers (a replica per worker: 32.00 MiB)\n"), "%s", text);
    cr_assert(strstr(text, "  domain 0: read by workers 0-3; its owners update [0, 524288) in it, "
                           "the rest comes from the other domains' copies (all-gather)\n"),
              "%s", text);
    cr_assert(strstr(text, "into the domain's weight copy: 2.00 MiB cross-domain per step"), "%s",
              text);
    /* per worker, s = 131072 x 4 bytes: its shard from its domain's 4
     * gradients and the other domain's partial (5 s read, s across; s
     * written), its domain's partial of a remote shard (4 s read, s
     * written), that shard copied into the domain's vector (s read across,
     * s written): 13 s = 6.5 bytes a parameter */
    cr_assert(strstr(text, "  workers 0-3: read 5242880 B (1048576 B across domains), written "
                           "1572864 B each\n"), "%s", text);
    cr_assert(strstr(text, "  the busiest worker: 6.50 B a parameter and step (a replica per "
                           "worker: 13.50; the gradients read once and the shard written once: "
                           "4.50)\n"), "%s", text);
    free(text);
}

/*
 * tests/test_core.c — status messages, the version, the names of every
 * enum, the arena allocator and its accounting, the counter-based RNG and
 * its hash of bytes, the bf16 rounding of gradient payloads.
 */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include <subtrain/quad.h>
#include <subtrain/subtrain.h>
#include "config.h"
#include "core/arena_impl.h"
#include "core/bf16.h"
#include "core/enum_table.h"
#include "core/error.h"

/* ------------------------------------------------------------ status */

Test(status, fail_records_message_and_returns_status)
{
    st_clear_error();
    cr_assert_str_empty(st_last_error());
    st_status s = st_fail(ST_ERR_FORMAT, "file %s: bad magic 0x%04x", "x.idx", 0x1234);
    cr_assert_eq(s, ST_ERR_FORMAT);
    cr_assert_str_eq(st_last_error(), "file x.idx: bad magic 0x1234");
    st_fail_context(s, "loading %s", "train");
    cr_assert_str_eq(st_last_error(), "loading train: file x.idx: bad magic 0x1234");
}

/* A message longer than the buffer keeps its start and its cause: the
 * long path in the middle gives way ("shorten the path, not the
 * reason"), whatever the length, in st_fail and st_fail_context alike. */
Test(status, long_messages_keep_their_cause)
{
    static char path[40000];
    const size_t lens[] = { 600, 5000, 20000, sizeof path - 1 };
    for (size_t k = 0; k < sizeof lens / sizeof *lens; k++) {
        memset(path, 'a', lens[k]);
        path[0] = '/';
        path[lens[k]] = '\0';
        st_fail(ST_ERR_IO, "%s: cannot open: %s", path, "Too many levels of symbolic links");
        const char *m = st_last_error();
        const size_t n = strlen(m);
        cr_assert_lt(n, 512, "%zu bytes", n);
        cr_assert_gt(n, 400, "the message uses its room: %zu bytes", n);
        cr_assert_eq(strncmp(m, "/aaaa", 5), 0, "%s", m);
        cr_assert_str_eq(m + n - strlen(": cannot open: Too many levels of symbolic links"),
                         ": cannot open: Too many levels of symbolic links", "%s", m);
        cr_assert(strstr(m, "[...]"), "the cut is marked: %s", m);
        st_fail(ST_ERR_FORMAT, "x.idx: bad magic");
        st_fail_context(ST_ERR_FORMAT, "loading %s", path);
        m = st_last_error();
        const size_t n2 = strlen(m);
        cr_assert_lt(n2, 512);
        cr_assert_eq(strncmp(m, "loading /aaa", 12), 0, "%s", m);
        cr_assert_str_eq(m + n2 - strlen(": x.idx: bad magic"), ": x.idx: bad magic", "%s", m);
    }
    /* short ones are untouched */
    st_fail(ST_ERR_IO, "%s: cannot open: %s", "/x", "No such file or directory");
    cr_assert_str_eq(st_last_error(), "/x: cannot open: No such file or directory");
}

Test(status, every_code_has_a_name)
{
    for (int s = ST_OK; s <= ST_ERR_NUMERIC; s++)
        cr_assert_str_neq(st_status_name((st_status)s), "unknown status", "status %d", s);
    cr_assert_str_eq(st_status_name((st_status)999), "unknown status");
}

/* ------------------------------------------------------------ version */

Test(version, headers_and_library_agree_with_configure)
{
    char parts[64];
    snprintf(parts, sizeof parts, "%d.%d.%d", SUBTRAIN_VERSION_MAJOR, SUBTRAIN_VERSION_MINOR,
             SUBTRAIN_VERSION_PATCH);
    cr_assert_str_eq(SUBTRAIN_VERSION, PACKAGE_VERSION);
    cr_assert_str_eq(parts, SUBTRAIN_VERSION);
    cr_assert_str_eq(st_version(), SUBTRAIN_VERSION);
    cr_assert_eq(SUBTRAIN_VERSION_NUMBER, (SUBTRAIN_VERSION_MAJOR << 16) |
                                              (SUBTRAIN_VERSION_MINOR << 8) |
                                              SUBTRAIN_VERSION_PATCH);
#if SUBTRAIN_VERSION_NUMBER < SUBTRAIN_VERSION_ENCODE(0, 1, 0)
    cr_assert_fail("the version number does not order: %#x", SUBTRAIN_VERSION_NUMBER);
#endif
    cr_assert_lt(SUBTRAIN_VERSION_NUMBER,
                 SUBTRAIN_VERSION_ENCODE(SUBTRAIN_VERSION_MAJOR, SUBTRAIN_VERSION_MINOR + 1, 0));
}

/* ------------------------------------------------------------ enum names */

/* Every public enum with a parser, through int-typed adapters. */
#define ENUM_ADAPTERS(fn, type)                                              \
    static const char *fn##_name_i(int v) { return fn##_name((type)v); }     \
    static st_status fn##_parse_i(const char *s, int *v)                     \
    {                                                                        \
        type t = (type)*v;                                                   \
        st_status r = fn##_parse(s, &t);                                     \
        *v = (int)t;                                                         \
        return r;                                                            \
    }
ENUM_ADAPTERS(st_model_kind, st_model_kind)
ENUM_ADAPTERS(st_activation, st_activation)
ENUM_ADAPTERS(st_optimizer, st_optimizer_kind)
ENUM_ADAPTERS(st_schedule, st_schedule_kind)
ENUM_ADAPTERS(st_strategy, st_strategy)
ENUM_ADAPTERS(st_subnet_kind, st_subnet_kind)
ENUM_ADAPTERS(st_masking, st_masking)
ENUM_ADAPTERS(st_synth_labels, st_synth_labels)

typedef struct enum_api {
    const char *what;          /* in the message */
    const char *allowed;       /* the names of values 0, 1, ... */
    const char *(*name)(int);
    st_status (*parse)(const char *, int *);
} enum_api;

#define API(fn, what, allowed) { what, allowed, fn##_name_i, fn##_parse_i }
static const enum_api enum_apis[] = {
    API(st_model_kind, "model", "mlp, resmlp, resnet, resnet18, gpt, convnet, vit"),
    API(st_activation, "activation", "relu, gelu"),
    API(st_optimizer, "optimizer", "sgd, adamw"),
    API(st_schedule, "schedule", "constant, cosine"),
    API(st_strategy, "strategy", "dp, sdp, ist, synth, localsgd"),
    API(st_subnet_kind, "subnetwork unit", "block, neuron"),
    API(st_masking, "masking", "forward, backward"),
    API(st_synth_labels, "synthetic-label kind", "gaussian, sign"),
};

Test(enums, every_name_parses_back_to_its_value)
{
    for (size_t e = 0; e < sizeof enum_apis / sizeof *enum_apis; e++) {
        const enum_api *api = &enum_apis[e];
        char names[256] = "";
        int v = 0;
        for (; strcmp(api->name(v), "unknown") != 0; v++) {
            const char *name = api->name(v);
            int back = -1;
            cr_assert_eq(api->parse(name, &back), ST_OK, "%s '%s': %s", api->what, name,
                         st_last_error());
            cr_assert_eq(back, v, "%s '%s' parsed to %d, not %d", api->what, name, back, v);
            cr_assert_str_eq(api->name(back), name);
            strcat(strcat(names, v ? ", " : ""), name);
        }
        /* The enumerators are 0..count-1 and all are named, in order. */
        cr_assert_str_eq(names, api->allowed, "%s", api->what);
        cr_assert_str_eq(api->name(-1), "unknown", "%s", api->what);
    }
}

/* A model kind is its place in the table of kinds: count, at, named and
 * name agree; a name no kind has is -1, and leaves the last error alone. */
Test(enums, model_kinds_are_places_in_the_table)
{
    const int n = st_model_kind_count();
    cr_assert_geq(n, 6);
    for (int i = 0; i < n; i++) {
        cr_assert_eq(st_model_kind_at(i), i);
        cr_assert_eq(st_model_kind_named(st_model_kind_name(i)), i, "%s",
                     st_model_kind_name(i));
    }
    cr_assert_eq(st_model_kind_at(n), -1);
    cr_assert_eq(st_model_kind_at(-1), -1);
    cr_assert_str_eq(st_model_kind_name(n), "unknown");
    cr_assert_str_eq(st_model_kind_name(st_model_kind_named("convnet")), "convnet");
    cr_assert_str_eq(st_model_kind_name(st_model_config_default().kind), "resmlp");
    st_fail(ST_ERR_IO, "the last error");
    cr_assert_eq(st_model_kind_named("bogus"), -1);
    cr_assert_eq(st_model_kind_named("MLP"), -1);
    cr_assert_eq(st_model_kind_named(NULL), -1);
    cr_assert_str_eq(st_last_error(), "the last error");
}

Test(enums, unknown_names_are_invalid_and_list_the_allowed_ones)
{
    const char *bad[] = { "bogus", "", "MLP", "dp ", "cosine2" };
    for (size_t e = 0; e < sizeof enum_apis / sizeof *enum_apis; e++) {
        const enum_api *api = &enum_apis[e];
        for (size_t b = 0; b < sizeof bad / sizeof *bad; b++) {
            int v = 12345;
            st_clear_error();
            cr_assert_eq(api->parse(bad[b], &v), ST_ERR_INVALID, "%s '%s'", api->what, bad[b]);
            cr_assert_eq(v, 12345, "a failed parse leaves the value alone");
            char want[512];
            snprintf(want, sizeof want, "unknown %s '%s' (allowed: %s)", api->what, bad[b],
                     api->allowed);
            cr_assert_str_eq(st_last_error(), want);
        }
        int v = 12345;
        cr_assert_eq(api->parse(NULL, &v), ST_ERR_INVALID);
        cr_assert_eq(v, 12345);
    }
}

Test(enums, aliases_parse_but_are_neither_printed_nor_listed)
{
    st_schedule_kind s = ST_SCHED_CONSTANT;
    cr_assert_eq(st_schedule_parse("warmup-cosine", &s), ST_OK);
    cr_assert_eq(s, ST_SCHED_WARMUP_COSINE);
    cr_assert_str_eq(st_schedule_name(s), "cosine");
    cr_assert_eq(st_schedule_parse("linear", &s), ST_ERR_INVALID);
    cr_assert_str_eq(st_last_error(), "unknown schedule 'linear' (allowed: constant, cosine)");
}

Test(enums, names_without_a_parser)
{
    const char *mem[] = { "weights", "gradients", "optimizer", "activations", "workspace",
                          "attention" };
    for (int k = 0; k < ST_MEM_KIND_COUNT; k++)
        cr_assert_str_eq(st_mem_kind_name((st_mem_kind)k), mem[k]);
    cr_assert_str_eq(st_mem_kind_name(ST_MEM_KIND_COUNT), "unknown");
    cr_assert_str_eq(st_quad_sketch_kind_name(ST_QUAD_PLAIN), "plain");
    cr_assert_str_eq(st_quad_sketch_kind_name(ST_QUAD_PRECONDITIONED), "preconditioned");
    cr_assert_str_eq(st_quad_sketch_kind_name((st_quad_sketch_kind)2), "unknown");
}

static const st_enum_entry colour_entries[] = {
    { "red", 3 }, { "green", 5 }, { "rouge", 3 }, { "blue", 7 },
};
static const st_enum_table colours = ST_ENUM_TABLE("colour", colour_entries);

Test(enums, table_lookups)
{
    cr_assert_eq(colours.count, 4);
    cr_assert_str_eq(st_enum_name(&colours, 3), "red");
    cr_assert_str_eq(st_enum_name(&colours, 4), "unknown");
    int v = 0;
    cr_assert_eq(st_enum_parse(&colours, "rouge", &v), ST_OK);
    cr_assert_eq(v, 3);

    char buf[64];
    cr_assert_eq(st_enum_allowed(&colours, buf, sizeof buf), strlen("red, green, blue"));
    cr_assert_str_eq(buf, "red, green, blue");
    cr_assert_eq(st_enum_allowed(&colours, buf, 8), strlen("red, green, blue"));
    cr_assert_str_eq(buf, "red, gr");   /* clipped like snprintf */
    cr_assert_eq(st_enum_allowed(&colours, buf, 0), strlen("red, green, blue"));

    /* A long unknown name is clipped, so the allowed names always fit. */
    char name[300];
    memset(name, 'x', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    cr_assert_eq(st_enum_parse(&colours, name, &v), ST_ERR_INVALID);
    const char *msg = st_last_error();
    cr_assert(strstr(msg, "xxx...' (allowed: red, green, blue)"), "%s", msg);
    cr_assert_lt(strlen(msg), 200);
}

/* ------------------------------------------------------------ arena */

/* A backend that counts what it hands out, to prove the arena gives every
 * chunk back, and that can be told to refuse. */
typedef struct counting_backend {
    int live_chunks;
    size_t live_bytes;
    int refuse;
} counting_backend;

static void *count_alloc(size_t bytes, void *ctx)
{
    counting_backend *c = ctx;
    if (c->refuse)
        return NULL;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes) != 0)
        return NULL;
    c->live_chunks++;
    c->live_bytes += bytes;
    return p;
}

static void count_free(void *ptr, size_t bytes, void *ctx)
{
    counting_backend *c = ctx;
    c->live_chunks--;
    c->live_bytes -= bytes;
    free(ptr);
}

Test(arena, blocks_are_aligned_zeroed_and_counted_by_kind)
{
    counting_backend cb = { 0 };
    st_chunk_backend be = { count_alloc, count_free, &cb };
    st_arena a;
    st_arena_init(&a, "worker 7", &be, 4096);
    void *p1, *p2, *p3;
    cr_assert_eq(st_arena_alloc(&a, ST_MEM_WEIGHTS, 100, &p1), ST_OK);
    cr_assert_eq(st_arena_alloc(&a, ST_MEM_GRADIENTS, 1, &p2), ST_OK);
    cr_assert_eq(st_arena_alloc(&a, ST_MEM_WEIGHTS, 10000, &p3), ST_OK); /* > chunk */
    cr_assert_eq((uintptr_t)p1 % 64, 0);
    cr_assert_eq((uintptr_t)p2 % 64, 0);
    cr_assert_eq((uintptr_t)p3 % 64, 0);
    for (int i = 0; i < 10000; i++)
        cr_assert_eq(((unsigned char *)p3)[i], 0);
    /* Sizes are rounded up to the 64-byte alignment. */
    cr_assert_eq(a.stats.current[ST_MEM_WEIGHTS], 128 + 10048);
    cr_assert_eq(a.stats.current[ST_MEM_GRADIENTS], 64);
    cr_assert_eq(a.stats.current_total, 128 + 10048 + 64);
    cr_assert_eq(a.stats.peak_total, a.stats.current_total);
    cr_assert_eq(cb.live_chunks, 2);
    cr_assert_eq(a.stats.reserved, cb.live_bytes);
    st_arena_release(&a);
    cr_assert_eq(cb.live_chunks, 0, "every chunk goes back to the backend");
    cr_assert_eq(a.stats.current_total, 0);
    cr_assert_eq(a.stats.peak_total, 128 + 10048 + 64, "peaks are history and stay");
}

/* Pages of this process in memory (/proc/self/statm's second field). */
static long resident_pages(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, resident = -1;
    if (f && fscanf(f, "%ld %ld", &size, &resident) != 2)
        resident = -1;
    if (f)
        fclose(f);
    return resident;
}

/* A sizing arena (st_train_size's) counts every block as the default
 * arena does, and 1 GiB of blocks costs no memory: nobody touches them. */
Test(arena, sizing_arena_counts_alike_and_touches_nothing)
{
    st_chunk_backend sizing = st_sizing_backend();
    st_arena a, b;
    st_arena_init(&a, "sized", &sizing, 0);
    st_arena_init(&b, "real", NULL, 0);
    cr_assert(st_arena_is_sizing(&a));
    cr_assert(!st_arena_is_sizing(&b));
    const size_t sizes[] = { 100, 1, 10000, (size_t)5 << 20, 64 };
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        void *p, *q;
        const st_mem_kind k = (st_mem_kind)(i % ST_MEM_KIND_COUNT);
        cr_assert_eq(st_arena_alloc(&a, k, sizes[i], &p), ST_OK);
        cr_assert_eq(st_arena_alloc(&b, k, sizes[i], &q), ST_OK);
        cr_assert_eq((uintptr_t)p % 64, 0);
    }
    cr_assert_eq(memcmp(&a.stats, &b.stats, sizeof a.stats), 0, "the same accounting");
    const size_t kept = b.stats.current[ST_MEM_ACTIVATIONS];
    st_arena_release(&b);
    const long before = resident_pages();
    void *big;
    cr_assert_eq(st_arena_alloc(&a, ST_MEM_ACTIVATIONS, (size_t)1 << 30, &big), ST_OK);
    const long after = resident_pages();
    cr_assert(before > 0 && after > 0);
    cr_assert_lt((after - before) * 4096L, 64L << 20, "1 GiB of blocks took %ld pages",
                 after - before);
    cr_assert_eq(a.stats.current[ST_MEM_ACTIVATIONS] - kept, (size_t)1 << 30);
    st_arena_release(&a);
}

/* The public API's arena: created, counted (st_arena_stats), and every
 * chunk back to the backend when destroyed. */
Test(arena, created_arena_counts_and_gives_every_chunk_back)
{
    counting_backend cb = { 0 };
    st_chunk_backend be = { count_alloc, count_free, &cb };
    st_arena *a = NULL;
    cr_assert_eq(st_arena_create("worker 7", &be, 4096, &a), ST_OK);
    void *p1, *p2;
    cr_assert_eq(st_arena_alloc(a, ST_MEM_WEIGHTS, 100, &p1), ST_OK);
    cr_assert_eq(st_arena_alloc(a, ST_MEM_WEIGHTS, 10000, &p2), ST_OK); /* > chunk */
    const st_mem_stats s = st_arena_stats(a);
    cr_assert_eq(s.current[ST_MEM_WEIGHTS], 128 + 10048);
    cr_assert_eq(s.peak_total, 128 + 10048);
    cr_assert_eq(cb.live_chunks, 2);
    cr_assert_eq(s.reserved, cb.live_bytes);
    st_arena_destroy(a);
    cr_assert_eq(cb.live_chunks, 0, "every chunk goes back to the backend");
    st_arena_destroy(NULL);
}

Test(arena, rewind_gives_back_and_keeps_peaks)
{
    counting_backend cb = { 0 };
    st_chunk_backend be = { count_alloc, count_free, &cb };
    st_arena a;
    st_arena_init(&a, "w", &be, 1024);
    float *keep, *tmp;
    cr_assert_eq(st_arena_alloc_floats(&a, ST_MEM_WEIGHTS, 16, &keep), ST_OK);
    st_arena_mark m = st_arena_get_mark(&a);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(st_arena_alloc_floats(&a, ST_MEM_WORKSPACE, 200, &tmp), ST_OK);
    size_t peak = a.stats.peak[ST_MEM_WORKSPACE];
    cr_assert_gt(cb.live_chunks, 1);
    int chunks = cb.live_chunks;
    st_arena_rewind(&a, &m);
    cr_assert_eq(cb.live_chunks, chunks, "chunks emptied by the rewind are kept for reuse");
    cr_assert_eq(a.stats.current[ST_MEM_WORKSPACE], 0);
    cr_assert_eq(a.stats.current[ST_MEM_WEIGHTS], 64);
    cr_assert_eq(a.stats.peak[ST_MEM_WORKSPACE], peak);
    /* The space after the mark is reused. */
    float *again;
    cr_assert_eq(st_arena_alloc_floats(&a, ST_MEM_WORKSPACE, 16, &again), ST_OK);
    cr_assert_eq((char *)again, (char *)keep + 64);
    /* ... and the spare chunks are reused, zeroed, before any new one */
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(st_arena_alloc_floats(&a, ST_MEM_WORKSPACE, 200, &tmp), ST_OK);
        for (int j = 0; j < 200; j++)
            cr_assert_eq(tmp[j], 0.0f);
        tmp[0] = 1.0f;
    }
    cr_assert_eq(cb.live_chunks, chunks, "no new chunk for what fitted before");
    st_arena_release(&a);
    cr_assert_eq(cb.live_chunks, 0, "release frees the spares too");
}

Test(arena, refused_or_absurd_requests_fail_cleanly)
{
    counting_backend cb = { .refuse = 1 };
    st_chunk_backend be = { count_alloc, count_free, &cb };
    st_arena a;
    st_arena_init(&a, "worker 3", &be, 0);
    void *p = (void *)1;
    cr_assert_eq(st_arena_alloc(&a, ST_MEM_ACTIVATIONS, 100, &p), ST_ERR_NOMEM);
    cr_assert_null(p);
    cr_assert(strstr(st_last_error(), "worker 3"), "message names the owner: %s", st_last_error());
    cb.refuse = 0;
    cr_assert_eq(st_arena_alloc(&a, ST_MEM_ACTIVATIONS, SIZE_MAX - 10, &p), ST_ERR_NOMEM);
    float *f;
    cr_assert_eq(st_arena_alloc_floats(&a, ST_MEM_ACTIVATIONS, SIZE_MAX / 2, &f), ST_ERR_NOMEM);
    cr_assert_eq(st_arena_alloc(&a, ST_MEM_KIND_COUNT, 8, &p), ST_ERR_INVALID);
    cr_assert_eq(a.stats.current_total, 0);
    st_arena_release(&a);
    cr_assert_eq(cb.live_chunks, 0);
}

/* ------------------------------------------------------------ rng */

Test(rng, same_seed_same_stream_different_seed_different_stream)
{
    st_rng a = st_rng_seed(42), b = st_rng_seed(42), c = st_rng_seed(43);
    int differ = 0;
    for (int i = 0; i < 1000; i++) {
        uint64_t x = st_rng_u64(&a);
        cr_assert_eq(x, st_rng_u64(&b));
        differ += x != st_rng_u64(&c);
    }
    cr_assert_eq(differ, 1000);
}

Test(rng, split_is_pure_and_streams_are_distinct)
{
    st_rng root = st_rng_seed(7);
    (void)st_rng_u64(&root);
    st_rng before = root;
    st_rng s1 = st_rng_split(&root, 1), s1b = st_rng_split(&root, 1), s2 = st_rng_split(&root, 2);
    cr_assert_eq(root.counter, before.counter, "splitting does not advance the parent");
    /* The child depends on the key only: drawing from the parent first does
     * not change it (that is what makes streams thread-order independent). */
    st_rng fresh = st_rng_seed(7);
    st_rng s1c = st_rng_split(&fresh, 1);
    for (int i = 0; i < 100; i++) {
        uint64_t x = st_rng_u64(&s1);
        cr_assert_eq(x, st_rng_u64(&s1b));
        cr_assert_eq(x, st_rng_u64(&s1c));
        cr_assert_neq(x, st_rng_u64(&s2));
    }
}

Test(rng, below_is_in_range_and_uniform)
{
    st_rng r = st_rng_seed(1);
    enum { K = 10, N = 200000 };
    int hist[K] = { 0 };
    for (int i = 0; i < N; i++) {
        uint32_t v = st_rng_below(&r, K);
        cr_assert_lt(v, K);
        hist[v]++;
    }
    /* Chi-square with 9 degrees of freedom: P(X > 27.9) = 0.001. */
    double chi2 = 0.0;
    for (int k = 0; k < K; k++)
        chi2 += pow(hist[k] - N / (double)K, 2) / (N / (double)K);
    cr_assert_lt(chi2, 27.9, "chi2 = %g", chi2);
    for (int i = 0; i < 1000; i++)
        cr_assert_eq(st_rng_below(&r, 1), 0);
}

Test(rng, uniform_and_normal_moments)
{
    st_rng r = st_rng_seed(3);
    enum { N = 200000 };
    double su = 0, sn = 0, sn2 = 0;
    for (int i = 0; i < N; i++) {
        float u = st_rng_uniform(&r);
        cr_assert(u >= 0.0f && u < 1.0f);
        su += u;
        float z = st_rng_normal(&r);
        cr_assert(isfinite(z));
        sn += z;
        sn2 += (double)z * z;
    }
    /* Standard errors: uniform mean 0.00065, normal mean 0.0022, var 0.0032;
     * the bounds are about 5 of them. */
    cr_assert_lt(fabs(su / N - 0.5), 0.0035);
    cr_assert_lt(fabs(sn / N), 0.011);
    cr_assert_lt(fabs(sn2 / N - 1.0), 0.016);
}

Test(rng, shuffle_is_a_permutation_and_deterministic)
{
    enum { N = 1000 };
    uint32_t a[N], b[N];
    for (uint32_t i = 0; i < N; i++)
        a[i] = b[i] = i;
    st_rng r1 = st_rng_seed(9), r2 = st_rng_seed(9);
    st_rng_shuffle_u32(&r1, a, N);
    st_rng_shuffle_u32(&r2, b, N);
    cr_assert_arr_eq(a, b, sizeof a);
    int seen[N] = { 0 }, moved = 0;
    for (uint32_t i = 0; i < N; i++) {
        cr_assert_lt(a[i], N);
        cr_assert_eq(seen[a[i]]++, 0, "value %u twice", a[i]);
        moved += a[i] != i;
    }
    cr_assert_gt(moved, N * 9 / 10);
}

/* ------------------------------------------------------------ bf16 */

/* st_bf16_round_n, the conversion of a whole gradient payload (the shared
 * engine's bf16 buffers, the MPI backend's send buffer): round to nearest,
 * ties to even, on the cases a truncation or a ties-away rounding gets
 * wrong.  Each case sits at every position of a 67-element array, so that
 * the vector clone's body and its remainder both convert it; the scalar
 * st_bf16_from_float agrees. */
Test(bf16, payload_rounding_ties_to_even_and_keeps_nan)
{
    static const struct { uint32_t in; uint16_t want; } c[] = {
        { 0x3f808000u, 0x3f80u },   /* 1 + 2^-8: halfway, even below: down */
        { 0x3f818000u, 0x3f82u },   /* halfway, odd below: up to even */
        { 0xbf808000u, 0xbf80u },   /* negative, even below: toward zero */
        { 0xbf818000u, 0xbf82u },   /* negative, odd below: away from zero */
        { 0x3f808001u, 0x3f81u },   /* just above halfway: up */
        { 0x3f807fffu, 0x3f80u },   /* just below halfway: down */
        { 0x3fff8000u, 0x4000u },   /* halfway, odd: the carry reaches the exponent */
        { 0x7f7f8000u, 0x7f80u },   /* the largest finite's halfway, odd: infinity */
        { 0x7f7f7fffu, 0x7f7fu },   /* below it: stays finite */
        { 0x00008000u, 0x0000u },   /* subnormal halfway, even below: zero */
        { 0x00018000u, 0x0002u },   /* subnormal halfway, odd below: up */
        { 0x80018000u, 0x8002u },   /* negative subnormal, odd below */
        { 0x807f8000u, 0x8080u },   /* the largest subnormal's halfway: the smallest normal */
        { 0x00000000u, 0x0000u },
        { 0x80000000u, 0x8000u },   /* -0 keeps its sign */
        { 0x7f800000u, 0x7f80u },   /* infinities stay */
        { 0xff800000u, 0xff80u },
    };
    /* NaNs stay NaNs, quiet, whatever their payload: truncating 0x7f800001
     * would make it infinity, rounding 0x7fffffff would carry into the sign */
    static const uint32_t nans[] = { 0x7f800001u, 0x7f808000u, 0x7fc00000u, 0x7fffffffu,
                                     0xff800001u, 0xffffffffu };
    enum { N = 67, K = sizeof c / sizeof c[0], M = sizeof nans / sizeof nans[0] };
    uint32_t in[N];
    uint16_t out[N];
    for (int k = 0; k < K + M; k++)
        for (int at = 0; at < N; at++) {
            for (int i = 0; i < N; i++)
                in[i] = 0x3f800000u + (uint32_t)i * 0x10000u;   /* exact bf16 values */
            in[at] = k < K ? c[k].in : nans[k - K];
            float f[N];
            memcpy(f, in, sizeof f);
            st_bf16_round_n(out, f, N);
            for (int i = 0; i < N; i++) {
                const uint16_t got = out[i];
                if (i != at) {
                    cr_assert_eq(got, (uint16_t)(in[i] >> 16), "case %d at %d: exact %08x -> "
                                 "%04x", k, at, in[i], got);
                    continue;
                }
                const uint16_t scalar = st_bf16_from_float(f[i]);
                if (k < K) {
                    cr_assert_eq(got, c[k].want, "%08x -> %04x, want %04x (at %d of %d)", in[i],
                                 got, c[k].want, at, N);
                    cr_assert_eq(scalar, c[k].want, "st_bf16_from_float: %08x -> %04x",
                                 in[i], scalar);
                } else {
                    cr_assert((got & 0x7f80u) == 0x7f80u && (got & 0x0040u) &&
                              (got & 0x8000u) == (uint16_t)((in[i] >> 16) & 0x8000u),
                              "NaN %08x -> %04x, want a quiet NaN of the same sign (at %d)",
                              in[i], got, at);
                    cr_assert_eq(scalar, got, "st_bf16_from_float: NaN %08x -> %04x", in[i],
                                 scalar);
                }
            }
        }
}

/* st_hash_bytes: a function of the bytes, their length and the seed;
 * every single-bit change of any byte, at any length (a tail of 0 to 7
 * bytes after whole 32- and 8-byte blocks), changes it. */
Test(rng, hash_of_bytes_sees_every_bit_and_length)
{
    unsigned char buf[80];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (unsigned char)(i * 37 + 11);
    uint64_t by_length[sizeof buf + 1];
    for (size_t n = 0; n <= sizeof buf; n++) {
        const uint64_t h = st_hash_bytes(buf, n, 5);
        cr_assert_eq(h, st_hash_bytes(buf, n, 5));
        cr_assert_neq(h, st_hash_bytes(buf, n, 6), "the seed counts (n %zu)", n);
        for (size_t m = 0; m < n; m++)
            cr_assert_neq(h, by_length[m], "lengths %zu and %zu", m, n);
        by_length[n] = h;
        for (size_t i = 0; i < n; i++)
            for (int bit = 0; bit < 8; bit++) {
                buf[i] ^= (unsigned char)(1u << bit);
                cr_assert_neq(st_hash_bytes(buf, n, 5), h, "n %zu: byte %zu bit %d", n, i, bit);
                buf[i] ^= (unsigned char)(1u << bit);
            }
    }
    /* a zero tail is not the shorter buffer */
    unsigned char zeros[12] = { 0 };
    cr_assert_neq(st_hash_bytes(zeros, 9, 0), st_hash_bytes(zeros, 10, 0));
}

/* A reserved vector holds memory in the pages that hold an element outside
 * the skipped ranges, counted up to its end; a rewind drops it. 5000
 * floats skipping [1100, 4000): page 2 (elements 2048 .. 3071) only. */
Test(arena, a_sparse_vector_holds_the_pages_of_its_kept_elements)
{
    st_arena a;
    st_arena_init(&a, "w", NULL, 0);
    float *keep;
    cr_assert_eq(st_arena_alloc_floats(&a, ST_MEM_WEIGHTS, 16, &keep), ST_OK);
    st_arena_mark m = st_arena_get_mark(&a);
    float *v;
    cr_assert_eq(st_arena_reserve_floats(&a, 5000, &v), ST_OK);
    cr_assert_eq(a.stats.current[ST_MEM_WEIGHTS], 64, "a reservation counts nothing");
    const size_t skip[2] = { 1100, 4000 };
    cr_assert_eq(st_arena_commit_floats(&a, ST_MEM_WEIGHTS, v, skip, 1), ST_OK);
    /* pages 0, 1, 3 and page 4 up to 20032 bytes (20000 aligned to 64) */
    cr_assert_eq(a.stats.current[ST_MEM_WEIGHTS], 64 + 3 * 4096 + (20032 - 4 * 4096));
    for (size_t i = 0; i < 5000; i++)
        if (i < skip[0] || i >= skip[1]) {
            cr_assert_eq(v[i], 0.0f, "element %zu", i);
            v[i] = 1.0f;
        }
    cr_assert_neq(st_arena_commit_floats(&a, ST_MEM_WEIGHTS, v, skip, 1), ST_OK,
                  "committed twice");
    st_arena_rewind(&a, &m);
    cr_assert_eq(a.stats.current[ST_MEM_WEIGHTS], 64);
    cr_assert_eq(a.stats.current_total, 64);
    cr_assert_neq(st_arena_commit_floats(&a, ST_MEM_WEIGHTS, v, skip, 1), ST_OK,
                  "the rewind dropped it");
    st_arena_release(&a);
}

/* Its skipped pages are no memory at all: touching one faults. */
/* AddressSanitizer's handler reports a fault and exits 1: no SIGSEGV to see */
#if defined(__SANITIZE_ADDRESS__)
#define SPARSE_FAULT 0
#else
#define SPARSE_FAULT SIGSEGV
#endif
Test(arena, a_sparse_vector_has_no_memory_under_a_skipped_page, .signal = SPARSE_FAULT)
{
    if (SPARSE_FAULT == 0)
        cr_skip_test("a fault under AddressSanitizer is its report, not SIGSEGV");
    st_arena a;
    st_arena_init(&a, "w", NULL, 0);
    float *v;
    cr_assert_eq(st_arena_reserve_floats(&a, 5000, &v), ST_OK);
    const size_t skip[2] = { 1100, 4000 };
    cr_assert_eq(st_arena_commit_floats(&a, ST_MEM_WEIGHTS, v, skip, 1), ST_OK);
    volatile float *x = v + 2500;
    *x = 1.0f;
    st_arena_release(&a);
}

/*
 * tests/test_comm_attach.c — the engine's entry points and what a worker
 * may hold: the table of backends, what the public functions check before
 * forwarding to one, reset, attach validation, compact vectors, engines of
 * one role, and elements nobody holds.
 *
 * The rig, one run and the reference check: tests/comm_rig.h.
 */
#include "comm_rig.h"

#include <subtrain/world.h>

/* ------------------------------------------------------------ backends */

/* The table of backends: names both ways, and 0 (what a designated
 * initialiser that leaves .backend out gives) is the shared buffers. */
Test(comm_backend, names_and_default)
{
    cr_assert_eq((int)ST_COMM_BACKEND_SHARED, 0);
    cr_assert_str_eq(st_comm_backend_name(ST_COMM_BACKEND_SHARED), "shared");
    cr_assert_str_eq(st_comm_backend_name(ST_COMM_BACKEND_MPI), "mpi");
    cr_assert_str_eq(st_comm_backend_name((st_comm_backend_kind)42), "unknown");
    st_comm_backend_kind k = ST_COMM_BACKEND_MPI;
    cr_assert_eq(st_comm_backend_parse("shared", &k), ST_OK);
    cr_assert_eq(k, ST_COMM_BACKEND_SHARED);
    cr_assert_eq(st_comm_backend_parse("mpi", &k), ST_OK);
    cr_assert_eq(k, ST_COMM_BACKEND_MPI);
    cr_assert_eq(st_comm_backend_parse("nccl", &k), ST_ERR_INVALID);
    cr_assert_str_eq(st_last_error(), "unknown reduction backend 'nccl' (allowed: shared, mpi)");
    cr_assert_eq(st_comm_backend_parse("", &k), ST_ERR_INVALID);
    cr_assert_eq(st_comm_backend_parse(NULL, &k), ST_ERR_INVALID);
    cr_assert_eq(k, ST_COMM_BACKEND_MPI, "a failed parse leaves *out alone");

    st_comm *c;
    st_comm_config cfg = { .n_workers = 2, .n_params = 100 };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_OK, "%s", st_last_error());
    cr_assert_eq(st_comm_backend_of(c), ST_COMM_BACKEND_SHARED);
    st_comm_destroy(c);
    cfg.backend = ST_COMM_BACKEND_SHARED;
    cr_assert_eq(st_comm_create(&cfg, &c), ST_OK, "%s", st_last_error());
    cr_assert_eq(st_comm_backend_of(c), ST_COMM_BACKEND_SHARED);
    st_comm_destroy(c);
}

/* A backend the library does not know, and one it knows but does not
 * have, are refused at create with a message that names them; nothing is
 * created.  The backend is checked before the rest of the configuration. */
Test(comm_backend, unknown_and_unavailable_refused)
{
    st_comm *c = (st_comm *)&c;
    st_comm_config cfg = { .n_workers = 2, .n_params = 100,
                           .backend = (st_comm_backend_kind)42 };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_ERR_INVALID);
    cr_assert_null(c);
    cr_assert(strstr(st_last_error(), "unknown reduction backend 42"), "%s", st_last_error());
    cr_assert(strstr(st_last_error(), "available: shared"), "%s", st_last_error());

    c = (st_comm *)&c;
    cfg.backend = ST_COMM_BACKEND_MPI;
    cr_assert_eq(st_comm_create(&cfg, &c), ST_ERR_INVALID);
    cr_assert_null(c);
    if (st_world_has_mpi()) {
        /* built in, but this test is no MPI job (tests/mpi.sh runs those) */
        cr_assert(strstr(st_last_error(), "reduction backend 'mpi': MPI is not running"), "%s",
                  st_last_error());
        return;
    }
    cr_assert(strstr(st_last_error(), "reduction backend 'mpi' is not built"), "%s",
              st_last_error());

    cfg.n_workers = 0;
    cr_assert_eq(st_comm_create(&cfg, &c), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "'mpi'"), "%s", st_last_error());
}

/* What the public functions check before they forward to the backend: no
 * engine, a worker out of range (which also aborts the engine, so that
 * nobody waits for the caller), and the queries' answers for both. */
Test(comm_dispatch, missing_engine_and_bad_worker, .timeout = 10)
{
    cr_assert_eq(st_comm_reduce_scatter(NULL, 0), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "reduce-scatter: no reduction engine"), "%s",
              st_last_error());
    cr_assert_eq(st_comm_all_gather(NULL, 0), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "all-gather: no reduction engine"));
    cr_assert_eq(st_comm_barrier(NULL, 0), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "barrier: no reduction engine"));
    float v[4] = { 0 };
    st_range all = { 0, 4 };
    st_arena a;
    st_arena_init(&a, "dispatch", NULL, 0);
    cr_assert_eq(st_comm_attach(NULL, 0, &a, v, v, &all, 1), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "st_comm_attach: no reduction engine"));
    st_range none = st_comm_shard(NULL, 0);
    cr_assert_eq(none.begin, 0);
    cr_assert_eq(none.end, 0);
    cr_assert_null(st_comm_shard_grads(NULL, 0));
    cr_assert_null(st_comm_shard_params(NULL, 0));
    cr_assert_eq(st_comm_bytes_per_step(NULL, 0).read, 0);
    st_comm_abort(NULL);
    st_comm_reset(NULL);
    st_comm_set_shard_output(NULL, 0, v);
    st_comm_destroy(NULL);

    /* P = 100, N = 2: 7 lines of 16 floats, 4 + 3 */
    st_comm *c;
    st_comm_config cfg = { .n_workers = 2, .n_params = 100 };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_OK);
    for (int w = -1; w <= 2; w += 3) {
        st_range r = st_comm_shard(c, w);
        cr_assert_eq(r.begin, 0, "worker %d", w);
        cr_assert_eq(r.end, 0, "worker %d", w);
        cr_assert_null(st_comm_shard_grads(c, w));
        cr_assert_null(st_comm_shard_params(c, w));
        cr_assert_eq(st_comm_bytes_per_step(c, w).written, 0);
        st_comm_set_shard_output(c, w, v);   /* ignored */
    }
    cr_assert_eq(st_comm_shard(c, 1).begin, 64);
    cr_assert_eq(st_comm_shard(c, 1).end, 100);
    /* not attached yet: no buffers, no bytes */
    cr_assert_null(st_comm_shard_grads(c, 0));
    cr_assert_eq(st_comm_bytes_per_step(c, 0).read, 0);
    cr_assert_eq(st_comm_reduce_scatter(c, 2), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "reduce-scatter: worker 2 is out of range [0, 2)"), "%s",
              st_last_error());
    /* the engine is aborted: a barrier returns at once instead of waiting
     * for a second worker */
    cr_assert_eq(st_comm_barrier(c, 0), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "another worker failed"), "%s", st_last_error());
    st_comm_destroy(c);

    /* a collective before attach: the backend's check, which aborts too */
    cr_assert_eq(st_comm_create(&cfg, &c), ST_OK);
    cr_assert_eq(st_comm_all_gather(c, 1), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "all-gather: worker 1 has not attached"), "%s",
              st_last_error());
    cr_assert_eq(st_comm_barrier(c, 0), ST_ERR_INVALID);
    st_comm_destroy(c);

    /* bad held ranges are refused before the backend sees them */
    cr_assert_eq(st_comm_create(&cfg, &c), ST_OK);
    st_range past = { 50, 101 };
    cr_assert_eq(st_comm_attach(c, 0, &a, v, v, &past, 1), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "worker 0: held range 0 [50, 101) is out of range"), "%s",
              st_last_error());
    cr_assert_eq(st_comm_barrier(c, 1), ST_ERR_INVALID);
    st_comm_destroy(c);
    st_arena_release(&a);
}

/* The dispatcher and reset: after st_comm_reset the same engine takes new
 * holdings and reduces them like a fresh one (the sdp/ist rounds), the
 * shard output set before the first attach still in use. */
Test(comm_dispatch, reset_then_attach_again, .timeout = 30)
{
    enum { N = 2, P = 200 };
    st_comm *c;
    st_comm_config cfg = { .n_workers = N, .n_params = P, .roles = ST_COMM_REDUCE };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_OK);
    static float grads[N][P], out[N][P];
    static float got[2][P];
    int wrong = 0;
#pragma omp parallel num_threads(N) reduction(+ : wrong)
    {
        int w = omp_get_thread_num();
        st_arena a;
        st_arena_init(&a, "reset", NULL, 0);
        for (int i = 0; i < P; i++)
            grads[w][i] = (float)(w + 1) * (float)(i + 1);
        st_comm_set_shard_output(c, w, out[w]);
        for (int round = 0; round < 2 && !wrong; round++) {
            /* round 0: everyone holds everything; round 1: worker w holds
             * only its half, so every mean is one worker's gradient */
            st_range held = round == 0 ? (st_range){ 0, P }
                                       : (st_range){ (size_t)w * P / 2, (size_t)(w + 1) * P / 2 };
            wrong += st_comm_attach(c, w, &a, grads[w], grads[w], &held, 1) != ST_OK;
            wrong += st_comm_reduce_scatter(c, w) != ST_OK;
            wrong += st_comm_shard_grads(c, w) != out[w];
            st_range sh = st_comm_shard(c, w);
            memcpy(got[round] + sh.begin, out[w], (sh.end - sh.begin) * sizeof(float));
            wrong += st_comm_barrier(c, w) != ST_OK;   /* every result copied */
            if (w == 0)
                st_comm_reset(c);
            wrong += st_comm_barrier(c, w) != ST_OK;   /* the reset is done */
            st_arena_release(&a);
            st_arena_init(&a, "reset", NULL, 0);
        }
        st_arena_release(&a);
    }
    cr_assert_eq(wrong, 0, "%s", st_last_error());
    for (int i = 0; i < P; i++) {
        cr_assert_eq(got[0][i], 1.5f * (float)(i + 1), "round 0 element %d: %g", i, got[0][i]);
        cr_assert_eq(got[1][i], (float)(i < P / 2 ? 1 : 2) * (float)(i + 1),
                     "round 1 element %d: %g", i, got[1][i]);
    }
    st_comm_destroy(c);
}

/* ------------------------------------------------------------ attach errors */

/* Attaches N workers with the given ranges (n_held[w] of held[w]);
 * returns each worker's status and message. */
static void attach_all(int n, size_t p, const st_range *const *held, const int *n_held,
                       st_status *got, char (*msg)[256], int bad_w)
{
    st_comm *c;
    st_comm_config cfg = { .n_workers = n, .n_params = p, .domain_of = NULL, .roles = 0 };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_OK);
    st_arena arena[MAXW];
    float *g[MAXW], *pr[MAXW];
    for (int w = 0; w < n; w++) {
        st_arena_init(&arena[w], "worker", NULL, 0);
        g[w] = calloc(p, sizeof(float));
        pr[w] = calloc(p, sizeof(float));
    }
#pragma omp parallel num_threads(n)
    {
        int w = omp_get_thread_num();
        got[w] = st_comm_attach(c, w == bad_w ? n : w, &arena[w], g[w], pr[w], held[w],
                                n_held[w]);
        snprintf(msg[w], 256, "%s", st_last_error());
    }
    for (int w = 0; w < n; w++) {
        st_arena_release(&arena[w]);
        free(g[w]);
        free(pr[w]);
    }
    st_comm_destroy(c);
}

Test(comm_attach, overlapping_ranges, .timeout = 10)
{
    static const st_range all[1] = { { 0, 100 } }, bad[2] = { { 0, 50 }, { 40, 100 } };
    const st_range *held[3] = { all, bad, all };
    int n_held[3] = { 1, 2, 1 };
    st_status got[3];
    char msg[3][256];
    attach_all(3, 100, held, n_held, got, msg, -1);
    cr_assert_eq(got[1], ST_ERR_INVALID);
    cr_assert(strstr(msg[1], "overlap"), "%s", msg[1]);
    cr_assert(strstr(msg[1], "worker 1"), "%s", msg[1]);
    for (int w = 0; w < 3; w += 2) {
        cr_assert_eq(got[w], ST_ERR_INVALID);
        cr_assert(strstr(msg[w], "another worker failed"), "%s", msg[w]);
    }
}

Test(comm_attach, unsorted_and_empty_ranges, .timeout = 10)
{
    static const st_range all[1] = { { 0, 100 } }, unsorted[2] = { { 50, 100 }, { 0, 50 } },
                          empty[1] = { { 30, 30 } };
    const st_range *held[2] = { unsorted, all };
    int n_held[2] = { 2, 1 };
    st_status got[2];
    char msg[2][256];
    attach_all(2, 100, held, n_held, got, msg, -1);
    cr_assert_eq(got[0], ST_ERR_INVALID);
    cr_assert(strstr(msg[0], "not sorted"), "%s", msg[0]);
    cr_assert(strstr(msg[1], "another worker failed"), "%s", msg[1]);
    held[0] = all;
    held[1] = empty;
    n_held[0] = 1;
    attach_all(2, 100, held, n_held, got, msg, -1);
    cr_assert_eq(got[1], ST_ERR_INVALID);
    cr_assert(strstr(msg[1], "empty"), "%s", msg[1]);
}

Test(comm_attach, out_of_range, .timeout = 10)
{
    static const st_range all[1] = { { 0, 100 } }, past[1] = { { 90, 101 } };
    const st_range *held[2] = { all, past };
    int n_held[2] = { 1, 1 };
    st_status got[2];
    char msg[2][256];
    attach_all(2, 100, held, n_held, got, msg, -1);
    cr_assert_eq(got[1], ST_ERR_INVALID);
    cr_assert(strstr(msg[1], "out of range"), "%s", msg[1]);
    cr_assert_eq(got[0], ST_ERR_INVALID);
    cr_assert(strstr(msg[0], "another worker failed"), "%s", msg[0]);
}

Test(comm_attach, bad_worker_index, .timeout = 10)
{
    static const st_range all[1] = { { 0, 100 } };
    const st_range *held[2] = { all, all };
    int n_held[2] = { 1, 1 };
    st_status got[2];
    char msg[2][256];
    attach_all(2, 100, held, n_held, got, msg, 1);
    cr_assert_eq(got[1], ST_ERR_INVALID);
    cr_assert(strstr(msg[1], "out of range"), "%s", msg[1]);
    cr_assert(strstr(msg[0], "another worker failed"), "%s", msg[0]);
}

Test(comm_attach, unheld_element, .timeout = 10)
{
    static const st_range a[1] = { { 0, 37 } }, b[2] = { { 10, 20 }, { 38, 100 } };
    const st_range *held[2] = { a, b };
    int n_held[2] = { 1, 2 };
    st_status got[2];
    char msg[2][256];
    attach_all(2, 100, held, n_held, got, msg, -1);
    for (int w = 0; w < 2; w++) {
        cr_assert_eq(got[w], ST_ERR_INVALID);
        cr_assert(strstr(msg[w], "element 37 "), "worker %d: %s", w, msg[w]);
    }
    /* a worker may hold nothing, as long as the others cover everything */
    static const st_range all[1] = { { 0, 100 } };
    held[0] = all;
    held[1] = NULL;
    n_held[0] = 1;
    n_held[1] = 0;
    attach_all(2, 100, held, n_held, got, msg, -1);
    cr_assert_eq(got[0], ST_OK, "%s", msg[0]);
    cr_assert_eq(got[1], ST_OK, "%s", msg[1]);
}

/* ------------------------------------------------------------ compact storage */

/* A subnetwork keeps only the parameters it holds, back to back.  The engine
 * must read and write them through the (range -> local offset) map exactly
 * as it reads full-layout vectors. */
#define CP_P 1000
#define CP_N 3

static const st_range cp_held0[] = { { 0, 400 }, { 600, 1000 } };
static const st_range cp_held1[] = { { 200, 700 } };
static const st_range cp_held2[] = { { 0, 100 }, { 650, 1000 } };

static float cp_grad(int w, size_t x) { return (float)(w + 1) * 0.001f * (float)(x % 97) + (float)w; }
static float cp_param(size_t x) { return 0.5f * (float)x; }

Test(comm, compact_vectors_reduce_like_full_ones, .timeout = 30)
{
    const st_range *held[CP_N] = { cp_held0, cp_held1, cp_held2 };
    const int n_held[CP_N] = { 2, 1, 2 };
    st_comm *c;
    st_comm_config cfg = { .n_workers = CP_N, .n_params = CP_P, .domain_of = NULL, .roles = 0 };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_OK, "%s", st_last_error());
    static float grads[CP_N][CP_P], params[CP_N][CP_P];
    static float shard_out[CP_P];
    int failures = 0;
#pragma omp parallel num_threads(CP_N) reduction(+ : failures)
    {
        int w = omp_get_thread_num();
        st_arena a;
        st_arena_init(&a, "compact", NULL, 0);
        size_t local[2], off = 0;
        for (int i = 0; i < n_held[w]; i++) {
            local[i] = off;
            for (size_t x = held[w][i].begin; x < held[w][i].end; x++) {
                grads[w][off + x - held[w][i].begin] = cp_grad(w, x);
                params[w][off + x - held[w][i].begin] = cp_param(x);
            }
            off += held[w][i].end - held[w][i].begin;
        }
        for (size_t k = off; k < CP_P; k++)
            grads[w][k] = params[w][k] = -7.0f; /* beyond the compact vector: untouched */
        st_status s = st_comm_attach_compact(c, w, &a, grads[w], params[w], held[w], local,
                                             n_held[w]);
        if (s == ST_OK)
            s = st_comm_reduce_scatter(c, w);
        if (s == ST_OK) {
            st_range sh = st_comm_shard(c, w);
            memcpy(shard_out + sh.begin, st_comm_shard_grads(c, w),
                   (sh.end - sh.begin) * sizeof(float));
            /* Move the master shard so the all-gather has something to bring. */
            float *m = st_comm_shard_params(c, w);
            for (size_t x = sh.begin; x < sh.end; x++)
                m[x - sh.begin] += 1.0f;
            s = st_comm_all_gather(c, w);
        }
        failures += s != ST_OK;
        for (size_t k = off; k < CP_P; k++)
            failures += grads[w][k] != -7.0f || params[w][k] != -7.0f;
        st_comm_barrier(c, w);
        st_arena_release(&a);
    }
    cr_assert_eq(failures, 0, "%s", st_last_error());
    for (size_t x = 0; x < CP_P; x++) {
        double sum = 0.0;
        int holders = 0;
        for (int w = 0; w < CP_N; w++)
            for (int i = 0; i < n_held[w]; i++)
                if (held[w][i].begin <= x && x < held[w][i].end) {
                    sum += cp_grad(w, x);
                    holders++;
                }
        cr_assert_float_eq(shard_out[x], sum / holders, 1e-5, "element %zu", x);
    }
    for (int w = 0; w < CP_N; w++) {
        size_t off = 0;
        for (int i = 0; i < n_held[w]; i++)
            for (size_t x = held[w][i].begin; x < held[w][i].end; x++, off++)
                cr_assert_eq(params[w][off], cp_param(x) + 1.0f, "worker %d element %zu", w, x);
    }
    st_comm_destroy(c);
}

/* An engine with one role keeps only that role's buffers and refuses the
 * other collective (backward masking pairs a reduce-only and a gather-only
 * engine). */
Test(comm, single_role_engines_refuse_the_other_collective, .timeout = 30)
{
    st_comm *red, *gat;
    st_comm_config cr = { .n_workers = 2, .n_params = 100, .domain_of = NULL, .roles = ST_COMM_REDUCE }, cg = { .n_workers = 2, .n_params = 100, .domain_of = NULL, .roles = ST_COMM_GATHER };
    cr_assert_eq(st_comm_create(&cr, &red), ST_OK);
    cr_assert_eq(st_comm_create(&cg, &gat), ST_OK);
    static float grads[2][100], params[2][100];
    int wrong = 0;
    size_t weights[2], gradients[2];
#pragma omp parallel num_threads(2) reduction(+ : wrong)
    {
        int w = omp_get_thread_num();
        st_arena a;
        st_arena_init(&a, "roles", NULL, 0);
        st_range all = { 0, 100 };
        for (int i = 0; i < 100; i++)
            grads[w][i] = params[w][i] = (float)(w + i);
        wrong += st_comm_attach(red, w, &a, grads[w], grads[w], &all, 1) != ST_OK;
        wrong += st_comm_attach(gat, w, &a, params[w], params[w], &all, 1) != ST_OK;
        weights[w] = a.stats.current[ST_MEM_WEIGHTS];
        gradients[w] = a.stats.current[ST_MEM_GRADIENTS];
        wrong += st_comm_shard_params(red, w) != NULL;
        wrong += st_comm_shard_grads(gat, w) != NULL;
        wrong += st_comm_reduce_scatter(red, w) != ST_OK;
        wrong += st_comm_all_gather(gat, w) != ST_OK;
        st_comm_barrier(red, w);
        st_arena_release(&a);
    }
    cr_assert_eq(wrong, 0, "%s", st_last_error());
    for (int w = 0; w < 2; w++) {
        cr_assert_gt(weights[w], 0, "the gather engine's master shard");
        cr_assert_gt(gradients[w], 0, "the reduce engine's shard gradient");
        cr_assert_leq(weights[w], 64 * sizeof(float) + 64, "one master shard, not two");
    }
    cr_assert_eq(st_comm_all_gather(red, 0), ST_ERR_INVALID);
    st_comm_destroy(red);
    st_comm_destroy(gat);
}

/* Neuron subnetworks of mlp: some elements are nobody's.  With
 * allow_unheld the engine skips them — a shard gradient of its own reads 0
 * there, a caller's output buffer (st_comm_set_shard_output) keeps its
 * values — and averages the rest over their holders.  3 workers, 300
 * elements: worker w holds [100 w, 100 w + 60) and everyone holds
 * [280, 300); [60, 100), [160, 200), [260, 280) are nobody's. */
Test(comm, unheld_elements_are_skipped_and_kept, .timeout = 30)
{
    for (int external = 0; external < 2; external++) {
        st_comm *c;
        st_comm_config cfg = { .n_workers = 3, .n_params = 300, .roles = ST_COMM_REDUCE,
                               .allow_unheld = 1 };
        cr_assert_eq(st_comm_create(&cfg, &c), ST_OK);
        static float grads[3][300], out[3][300];
        int wrong = 0;
        st_range shard[3];
        float *result[3];
#pragma omp parallel num_threads(3) reduction(+ : wrong)
        {
            int w = omp_get_thread_num();
            st_arena a;
            st_arena_init(&a, "unheld", NULL, 0);
            st_range held[2] = { { 100 * (size_t)w, 100 * (size_t)w + 60 }, { 280, 300 } };
            for (int i = 0; i < 300; i++)
                grads[w][i] = (float)(w + 1) * (float)i;
            shard[w] = st_comm_shard(c, w);
            for (size_t i = 0; i < 300; i++)
                out[w][i] = SENTINEL;
            if (external)
                st_comm_set_shard_output(c, w, out[w]);
            wrong += st_comm_attach(c, w, &a, grads[w], grads[w], held, 2) != ST_OK;
            wrong += st_comm_reduce_scatter(c, w) != ST_OK;
            result[w] = st_comm_shard_grads(c, w);
            wrong += st_comm_barrier(c, w) != ST_OK;
#pragma omp barrier
            if (w == 0)
                for (int k = 0; k < 3; k++)
                    for (size_t i = shard[k].begin; i < shard[k].end; i++) {
                        float got = result[k][i - shard[k].begin];
                        int holders = i >= 280 ? 3 : (i % 100 < 60 ? 1 : 0);
                        float want = holders == 3 ? 2.0f * (float)i      /* (1+2+3) i / 3 */
                                   : holders == 1 ? (float)(i / 100 + 1) * (float)i
                                   : external ? SENTINEL : 0.0f;
                        wrong += got != want;
                    }
#pragma omp barrier
            st_arena_release(&a);
        }
        cr_assert_eq(wrong, 0, "external output %d: %s", external, st_last_error());
        if (external)
            cr_assert_eq(result[1], out[1] + 0, "the caller's buffer is the shard output");
        st_comm_destroy(c);
    }
}

/* allow_unheld with a list: elements nobody holds are fine inside the
 * listed ranges and still an error outside them (a layout mistake must not
 * pass unnoticed).  The layout of the test above: [60, 100), [160, 200),
 * [260, 280) are nobody's. */
Test(comm, unheld_elements_only_where_allowed, .timeout = 30)
{
    const st_range all_gaps[3] = { { 50, 100 }, { 160, 200 }, { 250, 280 } };
    for (int n_allowed = 3; n_allowed >= 2; n_allowed--) {
        st_comm *c;
        st_comm_config cfg = { .n_workers = 3, .n_params = 300, .roles = ST_COMM_REDUCE,
                               .allow_unheld = 1, .unheld_ranges = all_gaps,
                               .n_unheld_ranges = n_allowed };
        cr_assert_eq(st_comm_create(&cfg, &c), ST_OK);
        static float grads[3][300];
        int failed = 0;
        char message[256] = "";
#pragma omp parallel num_threads(3) reduction(+ : failed)
        {
            int w = omp_get_thread_num();
            st_arena a;
            st_arena_init(&a, "unheld", NULL, 0);
            st_range held[2] = { { 100 * (size_t)w, 100 * (size_t)w + 60 }, { 280, 300 } };
            st_status s = st_comm_attach(c, w, &a, grads[w], grads[w], held, 2);
            failed += s != ST_OK;
            if (s != ST_OK && w == 0)
                snprintf(message, sizeof message, "%s", st_last_error());
#pragma omp barrier
            st_arena_release(&a);
        }
        if (n_allowed == 3) {
            cr_assert_eq(failed, 0, "every gap is allowed: %s", message);
        } else {
            cr_assert_eq(failed, 3, "[260, 280) is not allowed to be unheld");
            cr_assert(strstr(message, "element 260"), "%s", message);
        }
        st_comm_destroy(c);
    }
}

/* ------------------------------------------------------------ shared parameters */

/* Attaches n workers of the given domains with shared parameters, worker
 * w giving vector vec[w] of `vectors` (indices), holding `held` (n_held
 * ranges, the same for all); each worker's status and message. */
static void attach_shared(int n, const int *domain_of, const int *vec, const st_range *held,
                          int n_held, st_status *got, char (*msg)[256])
{
    enum { P = 100 };
    st_comm *c;
    st_comm_config cfg = { .n_workers = n, .n_params = P, .domain_of = domain_of,
                           .shared_params = 1 };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_OK, "%s", st_last_error());
    st_arena arena[MAXW];
    float *g[MAXW], *pr[MAXW];
    for (int w = 0; w < n; w++) {
        st_arena_init(&arena[w], "worker", NULL, 0);
        g[w] = calloc(P, sizeof(float));
        pr[w] = calloc(P, sizeof(float));
    }
#pragma omp parallel num_threads(n)
    {
        int w = omp_get_thread_num();
        got[w] = st_comm_attach(c, w, &arena[w], g[w], pr[vec[w]], held, n_held);
        snprintf(msg[w], 256, "%s", st_last_error());
    }
    for (int w = 0; w < n; w++) {
        st_arena_release(&arena[w]);
        free(g[w]);
        free(pr[w]);
    }
    st_comm_destroy(c);
}

/* Shared parameters are a vector a domain held whole: two vectors in one
 * domain, one vector for two domains, a vector not held whole, and a
 * reduce-only engine are refused with a message naming them; one vector a
 * domain, held whole as two adjacent ranges, attaches. */
Test(comm_attach, shared_parameters_one_vector_a_domain, .timeout = 10)
{
    static const int two[4] = { 0, 0, 1, 1 };
    static const st_range all[1] = { { 0, 100 } }, split[2] = { { 0, 40 }, { 40, 100 } },
                          part[1] = { { 0, 99 } };
    st_status got[4];
    char msg[4][256];
    static const int good[4] = { 0, 0, 2, 2 }, mixed[4] = { 0, 1, 2, 2 },
                     same[4] = { 0, 0, 0, 0 };
    attach_shared(4, two, good, split, 2, got, msg);
    for (int w = 0; w < 4; w++)
        cr_assert_eq(got[w], ST_OK, "worker %d: %s", w, msg[w]);
    attach_shared(4, two, mixed, all, 1, got, msg);
    for (int w = 0; w < 4; w++)
        cr_assert(strstr(msg[w], "workers 0 and 1 of NUMA domain 0 attach different parameter "
                                 "vectors"), "worker %d: %s", w, msg[w]);
    attach_shared(4, two, same, all, 1, got, msg);
    for (int w = 0; w < 4; w++)
        cr_assert(strstr(msg[w], "NUMA domains 0 and 1 attach the same parameter vector"),
                  "worker %d: %s", w, msg[w]);
    attach_shared(4, two, good, part, 1, got, msg);
    cr_assert_eq(got[0], ST_ERR_INVALID);
    cr_assert(strstr(msg[0], "worker 0: shared parameters are one vector held whole, in the "
                             "full layout: element 99 is not held there"), "%s", msg[0]);
    st_comm *c = NULL;
    st_comm_config cfg = { .n_workers = 2, .n_params = 100, .roles = ST_COMM_REDUCE,
                           .shared_params = 1 };
    cr_assert_eq(st_comm_create(&cfg, &c), ST_ERR_INVALID);
    cr_assert_null(c);
    cr_assert(strstr(st_last_error(), "a reduce-only engine has none"), "%s", st_last_error());
}

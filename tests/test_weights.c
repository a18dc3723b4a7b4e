/*
 * tests/test_weights.c — a weight copy per NUMA domain (doc/reduction.md,
 * "Weights"): the workers of a domain read one copy of the parameters
 * (and of their bf16 copies), which the shard owners update in place.
 *
 * Such runs are bitwise the runs with a replica per worker
 * (st_train_config.weights = ST_WEIGHTS_PRIVATE): every step's loss,
 * every record and the final weights, in fp32 and bf16, for dp, sdp with
 * backward masking (its masks redrawn: models rebuilt over the copy) and
 * synth's recovery epochs.  A worker's memory holds its share of the copy,
 * not a replica, and the records' bytes are the engine's, exactly.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include <subtrain/subtrain.h>
#include "recorder.h"

static void make_data(uint64_t seed, st_dataset *train, st_dataset *test)
{
    st_synthetic_config sc = st_synthetic_defaults(seed);
    sc.train_count = 4096;
    sc.test_count = 512;
    sc.dim = 32;
    sc.n_classes = 4;
    cr_assert_eq(st_synthetic_make(&sc, train, test), ST_OK, "%s", st_last_error());
    st_dataset_normalize(train, test, NULL, NULL);
}

/* The OS index of the PU a one-worker plan takes here: a cpuset of it
 * alone puts every worker in one NUMA domain, whatever the machine. */
static void one_pu_cpuset(char *buf, size_t size)
{
    st_topology *t;
    cr_assert_eq(st_topology_load(NULL, &t), ST_OK, "%s", st_last_error());
    st_plan_request req = { .workers = 1 };
    st_plan p;
    cr_assert_eq(st_plan_make(t, &req, &p), ST_OK, "%s", st_last_error());
    snprintf(buf, size, "%d", p.workers[0].pu_os);
    st_plan_free(&p);
    st_topology_destroy(t);
}

static char g_pu[32];

static st_train_config dp_config(int workers, int batch, uint64_t steps)
{
    st_train_config c = st_train_config_default();
    c.model.kind = st_model_kind_named("resmlp");
    c.model.depth = 2;
    c.model.width = 64;
    c.model.in_dim = 32;
    c.model.n_classes = 4;
    c.workers = workers;
    c.batch = batch;
    c.steps = steps;
    c.epochs = 0;
    c.oversubscribe = 1;   /* this machine may have fewer cores than workers */
    if (!g_pu[0])
        one_pu_cpuset(g_pu, sizeof g_pu);
    c.cpuset = g_pu;
    return c;
}

#define MAX_WORKERS 8

/* A run's steps, records, final weights and the workers' memory in its
 * last record (a record's worker_memory lives as long as the run). */
typedef struct run_seen {
    recorder rec;
    float *params;
    size_t count;
    st_mem_stats memory[MAX_WORKERS];
} run_seen;

static void keep_params(const float *params, size_t count, void *user)
{
    run_seen *s = ((run_seen **)user)[1];
    s->params = malloc(count * sizeof *params);
    memcpy(s->params, params, count * sizeof *params);
    s->count = count;
}

static void seen_step(const st_step_info *info, void *user)
{
    on_step(info, ((void **)user)[0]);
}

static void seen_epoch(const st_epoch_record *rec, void *user)
{
    run_seen *s = ((run_seen **)user)[1];
    on_epoch(rec, ((void **)user)[0]);
    for (int k = 0; k < rec->workers && k < MAX_WORKERS && rec->worker_memory; k++)
        s->memory[k] = rec->worker_memory[k];
}

static st_epoch_record run(const st_train_config *c, const st_dataset *train,
                           const st_dataset *test, run_seen *s)
{
    memset(s, 0, sizeof *s);
    void *user[2] = { &s->rec, s };
    st_train_callbacks cb = { .on_step = seen_step, .on_epoch = seen_epoch,
                              .on_params = keep_params, .user = user };
    st_epoch_record final;
    cr_assert_eq(st_train_run(c, train, test, &cb, &final), ST_OK, "%s", st_last_error());
    return final;
}

/* Two runs seen: every step's loss, every record's losses and accuracy,
 * and the final weights bitwise equal. */
static void assert_bitwise_runs(const char *what, const run_seen *a, const run_seen *b)
{
    cr_assert_gt(a->rec.steps, 0, "%s", what);
    cr_assert_eq(a->rec.steps, b->rec.steps, "%s", what);
    cr_assert_eq(memcmp(a->rec.losses, b->rec.losses, a->rec.steps * sizeof(float)), 0,
                 "%s: every step's loss is bitwise the same", what);
    cr_assert_eq(a->rec.n_records, b->rec.n_records, "%s", what);
    for (int k = 0; k < a->rec.n_records; k++) {
        const st_epoch_record *x = &a->rec.records[k], *y = &b->rec.records[k];
        cr_assert(memcmp(&x->train_loss, &y->train_loss, sizeof(double)) == 0 &&
                  memcmp(&x->test_loss, &y->test_loss, sizeof(double)) == 0 &&
                  memcmp(&x->test_acc, &y->test_acc, sizeof(double)) == 0,
                  "%s: record %d differs: %.9g %.9g %.9g vs %.9g %.9g %.9g", what, k,
                  x->train_loss, x->test_loss, x->test_acc, y->train_loss, y->test_loss,
                  y->test_acc);
    }
    cr_assert_eq(a->count, b->count, "%s", what);
    cr_assert_not_null(a->params, "%s: no final weights", what);
    size_t differ = 0;
    for (size_t i = 0; i < a->count; i++)
        differ += memcmp(&a->params[i], &b->params[i], sizeof(float)) != 0;
    cr_assert_eq(differ, 0, "%s: %zu of %zu final weights differ", what, differ, a->count);
}

/* cfg with shared weights (the default) and with a replica per worker:
 * bitwise the same runs (assert_bitwise_runs); the shared run's bytes and
 * per-worker memory are fewer.  *sh, *pr: the two final records; ms, mp
 * (may be NULL): the workers' memory in their last records. */
static void assert_shared_is_replicas(const char *what, st_train_config cfg, st_epoch_record *sh,
                                      st_epoch_record *pr, st_mem_stats *ms, st_mem_stats *mp)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    run_seen *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    cfg.weights = ST_WEIGHTS_SHARED;
    *sh = run(&cfg, &train, &test, a);
    cfg.weights = ST_WEIGHTS_PRIVATE;
    *pr = run(&cfg, &train, &test, b);
    assert_bitwise_runs(what, a, b);
    cr_assert_lt(sh->comm_bytes_per_worker_step, pr->comm_bytes_per_worker_step, "%s", what);
    cr_assert_lt(sh->memory.peak_total, pr->memory.peak_total, "%s", what);
    sh->worker_memory = pr->worker_memory = NULL;   /* gone with the runs */
    if (ms)
        memcpy(ms, a->memory, sizeof a->memory);
    if (mp)
        memcpy(mp, b->memory, sizeof b->memory);
    free(a->params);
    free(b->params);
    free(a);
    free(b);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(shared_weights, dp_is_bitwise_a_replica_per_worker, .timeout = 120)
{
    st_epoch_record s, p;
    assert_shared_is_replicas("dp, 2 workers", dp_config(2, 32, 40), &s, &p, NULL, NULL);
    st_train_config c = dp_config(3, 16, 30);
    c.optim.kind = ST_OPT_SGD;
    c.optim.lr = 0.05f;
    c.model.kind = st_model_kind_named("mlp");
    assert_shared_is_replicas("dp, 3 workers, mlp, sgd", c, &s, &p, NULL, NULL);
}

/* bf16: the owners write their shard's bf16 copies with their update, and
 * the layers read them from the domain's copy without converting. */
Test(shared_weights, dp_bf16_is_bitwise_a_replica_per_worker, .timeout = 120)
{
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 kernels on this CPU");
    st_train_config c = dp_config(2, 32, 40);
    c.model.precision = ST_PRECISION_BF16;
    c.bf16_emulated = 1;
    st_epoch_record s, p;
    assert_shared_is_replicas("dp bf16, 2 workers", c, &s, &p, NULL, NULL);
    /* the layers' own conversions (a private bf16 copy each, fp32 shared) */
    c.model.unfuse = ST_UNFUSE_WEIGHT_COPY;
    assert_shared_is_replicas("dp bf16, copies made by each forward", c, &s, &p, NULL, NULL);
}

/* Backward masking: every worker holds the full model; its masks redrawn
 * every 3 steps rebuild the models over the same copy. */
Test(shared_weights, sdp_backward_masking_is_bitwise_replicas, .timeout = 120)
{
    st_train_config c = dp_config(4, 16, 24);
    c.strategy = ST_STRATEGY_SDP;
    c.sdp.masking = ST_MASKING_BACKWARD;
    c.sdp.coverage = 0.5;
    c.sdp.resample = 3;
    c.model.depth = 4;
    st_epoch_record s, p;
    assert_shared_is_replicas("sdp, backward masking, redrawn", c, &s, &p, NULL, NULL);
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        return;
    c.model.precision = ST_PRECISION_BF16;
    c.bf16_emulated = 1;
    assert_shared_is_replicas("sdp bf16, backward masking, redrawn", c, &s, &p, NULL, NULL);
}

/* synth: the recovery epochs' data parallelism on the joined mlp. */
Test(shared_weights, synth_recovery_is_bitwise_replicas, .timeout = 120)
{
    st_train_config c = dp_config(2, 32, 0);
    c.strategy = ST_STRATEGY_SYNTH;
    c.model.kind = st_model_kind_named("mlp");
    c.model.depth = 3;
    c.steps = 0;
    c.epochs = 1;
    c.synth.segments = 2;
    c.synth.recovery_epochs = 1;
    st_epoch_record s, p;
    assert_shared_is_replicas("synth, recovery epoch", c, &s, &p, NULL, NULL);
}

/* Shard w of P elements over N owners: ceil(P / 16) lines dealt out
 * evenly, the first (lines mod N) one more, the last line partial. */
static size_t shard_len(size_t P, int N, int w)
{
    size_t lines = (P + 15) / 16, q = lines / (size_t)N, rem = lines % (size_t)N;
    size_t first = (size_t)w * q + ((size_t)w < rem ? (size_t)w : rem);
    size_t last = first + q + ((size_t)w < rem);
    size_t b = 16 * first < P ? 16 * first : P, e = 16 * last < P ? 16 * last : P;
    return e - b;
}

static size_t pad64(size_t bytes)
{
    return (bytes + 63) / 64 * 64;
}

/* One domain of N workers, P parameters: with shared weights a worker
 * reads the N gradients of its shard and writes its mean, 4 (N + 1) |S_w|
 * bytes, and nothing else (the owners update the copy in place); with a
 * replica it also reads and writes all P in the all-gather: 8 P more.  Its
 * weights are its share of the copy, ceil(4 P / N) (64-byte blocks), where
 * a replica per worker holds 4 P and a master shard of 4 |S_w|. */
Test(shared_weights, records_count_the_bytes_and_the_share, .timeout = 120)
{
    const int N = 2;
    st_epoch_record s, p;
    st_train_config c = dp_config(N, 32, 20);
    st_mem_stats ms[MAX_WORKERS], mp[MAX_WORKERS];
    assert_shared_is_replicas("dp, 2 workers", c, &s, &p, ms, mp);
    const size_t P = st_model_config_param_count(&c.model);
    double busy_s = 0.0, busy_p = 0.0;
    for (int w = 0; w < N; w++) {
        const size_t S = shard_len(P, N, w);
        busy_s = fmax(busy_s, 4.0 * (double)((N + 1) * S));
        busy_p = fmax(busy_p, 4.0 * (double)((N + 1) * S + 2 * P));
        const size_t share = (pad64(4 * P) + (size_t)N - 1) / (size_t)N;
        cr_assert_eq(ms[w].peak[ST_MEM_WEIGHTS], share,
                     "worker %d: weights %zu bytes, its share of the copy is %zu", w,
                     ms[w].peak[ST_MEM_WEIGHTS], share);
        cr_assert_eq(mp[w].peak[ST_MEM_WEIGHTS], pad64(4 * P) + pad64(4 * S),
                     "worker %d, a replica: %zu bytes", w, mp[w].peak[ST_MEM_WEIGHTS]);
    }
    cr_assert_eq(s.comm_bytes_per_worker_step, busy_s, "shared: %.0f bytes a step, want %.0f",
                 s.comm_bytes_per_worker_step, busy_s);
    /* dp reduces during the backward (st_comm_reduce_ready), either way */
    cr_assert_gt(s.step_ms_overlapped, 0.0, "no reduction during the backward");
    cr_assert_gt(p.step_ms_overlapped, 0.0, "no reduction during the backward (replicas)");
    /* and updates there what it reduced: the step's update still counts
     * its whole shard (AdamW, fp32: 28 bytes a parameter), whatever part
     * of it ran during the backward */
    const double upd = 28.0 * (double)shard_len(P, N, 0);
    cr_assert_eq(s.optimizer_bytes_per_worker_step, upd, "the update moved %.0f bytes a step, "
                 "its shard makes %.0f", s.optimizer_bytes_per_worker_step, upd);
    cr_assert_eq(p.optimizer_bytes_per_worker_step, upd, "replicas: %.0f, want %.0f",
                 p.optimizer_bytes_per_worker_step, upd);
    cr_assert_eq(p.comm_bytes_per_worker_step, busy_p, "replicas: %.0f bytes a step, want %.0f",
                 p.comm_bytes_per_worker_step, busy_p);
}

Test(shared_weights, an_unknown_placement_is_refused)
{
    st_train_config c = dp_config(2, 32, 4);
    c.weights = (st_weights)7;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
    cr_assert_str_eq(st_last_error(), "unknown weights placement 7 (shared or private)");
}

/* A step reduces (and updates) during the backward what every worker's
 * layers have completed (st_comm_reduce_ready); the trainer's update
 * after the caller's own forward and backward of each worker reduces it
 * all afterwards.  Same sums, same order: 2 workers, 20 steps, the same
 * weights to the bit, in fp32 and bf16. */
Test(shared_weights, reducing_during_the_backward_changes_no_bit, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        if (bf16 && st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
            break;
        st_train_config c = dp_config(2, 32, 20);
        c.schedule = ST_SCHED_CONSTANT;
        if (bf16) {
            c.model.precision = ST_PRECISION_BF16;
            c.bf16_emulated = 1;
        }
        st_trainer *a, *b;
        cr_assert_eq(st_trainer_create(&c, &train, &test, &a), ST_OK, "%s", st_last_error());
        cr_assert_eq(st_trainer_create(&c, &train, &test, &b), ST_OK, "%s", st_last_error());
        uint32_t *order = malloc(train.count * sizeof *order);
        const uint64_t S = train.count / (uint32_t)(2 * c.batch);
        for (uint64_t s = 1; s <= 20; s++) {
            float la, lb, lr;
            cr_assert_eq(st_trainer_step(a, 1, &la), ST_OK, "%s", st_last_error());
            if ((s - 1) % S == 0)
                st_epoch_order(c.seed, (s - 1) / S, order, train.count);
            for (int k = 0; k < 2; k++) {   /* worker k's rows of global batch s - 1 */
                st_model *m = st_trainer_model(b, k);
                uint32_t first = (uint32_t)(((s - 1) % S) * 2 + (uint64_t)k) * (uint32_t)c.batch;
                st_dataset_gather(&train, order + first, (size_t)c.batch, st_model_input(m),
                                  st_model_labels(m));
                cr_assert_eq(st_model_forward_backward(m, &lb), ST_OK, "%s", st_last_error());
            }
            cr_assert_eq(st_trainer_update(b, &lr), ST_OK, "%s", st_last_error());
        }
        size_t P = st_model_config_param_count(&c.model);
        float *pa = malloc(P * sizeof *pa), *pb = malloc(P * sizeof *pb);
        cr_assert_eq(st_trainer_params(a, pa, P), ST_OK);
        cr_assert_eq(st_trainer_params(b, pb, P), ST_OK);
        size_t differ = 0;
        for (size_t i = 0; i < P; i++)
            differ += memcmp(&pa[i], &pb[i], sizeof *pa) != 0;
        cr_assert_eq(differ, 0, "%s: %zu of %zu weights differ", bf16 ? "bf16" : "fp32", differ,
                     P);
        st_epoch_record ra, rb;
        cr_assert_eq(st_trainer_metrics(a, &ra), ST_OK);
        cr_assert_eq(st_trainer_metrics(b, &rb), ST_OK);
        cr_assert_gt(ra.step_ms_overlapped, 0.0, "the steps reduced nothing in the backward");
        cr_assert_eq(rb.step_ms_overlapped, 0.0, "the updates alone reduced in a backward");
        free(pa);
        free(pb);
        free(order);
        st_trainer_destroy(a);
        st_trainer_destroy(b);
    }
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* The reduction during the backward (st_comm_reduce_ready) against the
 * whole reduce-scatter after it (reduce_after_backward): bitwise the same
 * runs, for every strategy that reduces gradients a step, and the records
 * say it ran (step_ms.overlapped) in the one and not the other. */
static void assert_overlap_changes_no_bit(const char *what, st_train_config cfg)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    run_seen *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    cfg.reduce_after_backward = 0;
    run(&cfg, &train, &test, a);
    cfg.reduce_after_backward = 1;
    run(&cfg, &train, &test, b);
    assert_bitwise_runs(what, a, b);
    double during = 0.0, after = 0.0;
    for (int k = 0; k < a->rec.n_records; k++) {
        during += a->rec.records[k].step_ms_overlapped;
        after += b->rec.records[k].step_ms_overlapped;
    }
    cr_assert_gt(during, 0.0, "%s: nothing reduced during the backward", what);
    cr_assert_eq(after, 0.0, "%s: reduce_after_backward reduced during it", what);
    free(a->params);
    free(b->params);
    free(a);
    free(b);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(overlap, every_strategy_reduces_during_the_backward_to_the_same_bits, .timeout = 120)
{
    st_train_config c = dp_config(2, 32, 20);
    assert_overlap_changes_no_bit("dp, 2 workers", c);
    c.accumulate = 3;
    assert_overlap_changes_no_bit("dp, 3 micro-batches", c);
    c = dp_config(4, 16, 12);
    c.strategy = ST_STRATEGY_SDP;
    c.model.depth = 4;
    c.sdp.coverage = 0.5;
    c.sdp.resample = 5;
    assert_overlap_changes_no_bit("sdp, blocks, forward masking", c);
    c.sdp.masking = ST_MASKING_BACKWARD;
    assert_overlap_changes_no_bit("sdp, blocks, backward masking", c);
    c.sdp.masking = ST_MASKING_FORWARD;
    c.sdp.subnet = ST_SUBNET_NEURON;
    c.model.kind = st_model_kind_named("mlp");
    c.model.depth = 3;
    assert_overlap_changes_no_bit("sdp, neurons of an mlp (compact, many ranges)", c);
    c = dp_config(4, 32, 0);
    c.strategy = ST_STRATEGY_SYNTH;
    c.model.kind = st_model_kind_named("mlp");
    c.model.depth = 3;
    c.epochs = 1;
    c.synth.segments = 2;
    c.synth.recovery_epochs = 0;
    assert_overlap_changes_no_bit("synth, segment groups of 2", c);
}

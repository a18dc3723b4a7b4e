/*
 * tests/test_synth_train.c — short synth runs on synthetic data: every
 * segment's loss falls, runs are reproducible, nothing crosses a cut,
 * recovery epochs follow, a stop and checkpoints wait for a segment epoch's
 * end and resume bitwise, and a segment step makes no heap call of
 * subtrain's own.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include <subtrain/subtrain.h>
#include "nn/dnnl_util.h"
#include "recorder.h"
#include "testutil.h"
#include "synth_check.h"

/* ------------------------------------------------------------ training */

static void make_data(uint64_t seed, st_dataset *train, st_dataset *test)
{
    st_synthetic_config sc = st_synthetic_defaults(seed);
    sc.train_count = 4096;
    sc.test_count = 1024;
    sc.dim = 32;
    sc.n_classes = 4;
    cr_assert_eq(st_synthetic_make(&sc, train, test), ST_OK, "%s", st_last_error());
    st_dataset_normalize(train, test, NULL, NULL);
}

/* mlp depth 3 width 32 (4 linear layers), 32 inputs, 4 classes. */
static st_train_config synth_config(int workers, int segments, int epochs)
{
    st_train_config c = st_train_config_default();
    c.strategy = ST_STRATEGY_SYNTH;
    c.model = mlp(3, 32, 32, 4);
    c.synth.segments = segments;
    c.workers = workers;
    c.oversubscribe = 1;
    c.batch = 32;
    c.epochs = epochs;
    c.seed = 3;
    return c;
}

/* Measured with these seeds over 3 epochs: the segments' losses fall to
 * between 0.05x and 0.65x of the first epoch's, the joined network reaches
 * 0.71-0.72 on a 4-class task (chance 0.25); the bars are set below. */
Test(train, every_segment_loss_falls_and_the_joined_network_learns, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    recorder *r = calloc(1, sizeof *r);
    for (int s = 2; s <= 3; s++) {
        st_train_config c = synth_config(s, s, 3);
        st_epoch_record final = train_recorded(&c, &train, &test, r);
        cr_assert_eq(r->n_records, 4, "3 epochs and the final record");
        cr_assert_eq(final.n_segments, s);
        for (int g = 0; g < s; g++) {
            double first = r->records[0].segment_loss[g], end = r->records[2].segment_loss[g];
            cr_log_info("S %d segment %d: loss %.4f -> %.4f", s, g + 1, first, end);
            cr_expect_lt(end, 0.8 * first, "S %d: segment %d's loss %.4f -> %.4f", s, g + 1,
                         first, end);
            cr_expect_eq(final.segment_workers[g], 1);
        }
        cr_log_info("S %d: joined test accuracy %.4f", s, final.test_acc);
        cr_expect_geq(final.test_acc, 0.5, "S %d: the joined network reached %.4f", s,
                      final.test_acc);
        cr_expect_eq(final.comm_bytes_per_worker_step, 0.0, "groups of one move nothing");
        cr_expect(final.final && !final.recovery);
    }
    free(r);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(train, same_seed_and_workers_give_bitwise_identical_runs, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    recorder *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    st_train_config c = synth_config(3, 2, 2); /* groups of 2 and 1 */
    st_epoch_record fa = train_recorded(&c, &train, &test, a);
    st_epoch_record fb = train_recorded(&c, &train, &test, b);
    cr_assert_eq(a->steps, b->steps);
    cr_assert_eq(memcmp(a->losses, b->losses, a->steps * sizeof(float)), 0);
    for (int e = 0; e < 2; e++)
        cr_assert_eq(memcmp(a->records[e].segment_loss, b->records[e].segment_loss,
                            sizeof a->records[e].segment_loss), 0);
    cr_assert_eq(memcmp(&fa.test_loss, &fb.test_loss, sizeof(double)), 0);
    cr_assert_gt(fa.comm_bytes_per_worker_step, 0.0, "a group of two reduces its gradients");
    free(a);
    free(b);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* Nothing crosses a cut, checked by what each group can see: changing the
 * images (which only segment 1 reads) leaves the later segments' training
 * bitwise the same, and changing the noise (which only the later segments
 * read) leaves segment 1's.  N = 5, S = 2: the cut after layer 2 gives
 * segment FLOPs 5120 : 2432 per sample, so groups of 3 and 2, and both
 * groups reduce through their engines. */
Test(train, no_group_sees_another_groups_data_or_parameters, .timeout = 120)
{
    st_dataset train, test, other, other_test;
    make_data(5, &train, &test);
    make_data(5, &other, &other_test);
    st_rng rng = st_rng_seed(1);
    for (size_t i = 0; i < (size_t)other.count * other.dim; i++)
        other.x[i] = st_rng_normal(&rng); /* other images, same labels */
    recorder *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    st_train_config c = synth_config(5, 2, 2);
    st_epoch_record fa = train_recorded(&c, &train, &test, a);
    train_recorded(&c, &other, &test, b);
    cr_assert(fa.segment_workers[0] == 3 && fa.segment_workers[1] == 2,
              "groups of %d and %d workers", fa.segment_workers[0], fa.segment_workers[1]);
    cr_assert_gt(fa.comm_bytes_per_worker_step, 0.0, "the groups reduce");
    for (int e = 0; e < 2; e++) {
        cr_expect_neq(a->records[e].segment_loss[0], b->records[e].segment_loss[0],
                      "segment 1 reads the images");
        cr_expect_eq(a->records[e].segment_loss[1], b->records[e].segment_loss[1],
                     "epoch %d: segment 2 saw segment 1's images", e + 1);
    }
    c.synth.noise = 0.25f;
    train_recorded(&c, &train, &test, b);
    for (int e = 0; e < 2; e++) {
        cr_expect_eq(a->records[e].segment_loss[0], b->records[e].segment_loss[0],
                     "epoch %d: segment 1 saw segment 2's noise", e + 1);
        cr_expect_neq(a->records[e].segment_loss[1], b->records[e].segment_loss[1]);
    }
    free(a);
    free(b);
    st_dataset_free(&train);
    st_dataset_free(&other);
    st_dataset_free(&other_test);
    st_dataset_free(&test);
}

/* Recovery: the segment epochs are those of a run without recovery (the
 * same joined network), then end-to-end epochs follow in the numbering;
 * the recovery records count the whole network per worker. */
Test(train, recovery_epochs_continue_the_joined_network, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    recorder *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    st_train_config c = synth_config(2, 2, 2);
    st_epoch_record f0 = train_recorded(&c, &train, &test, a);
    c.synth.recovery_epochs = 2;
    st_epoch_record f2 = train_recorded(&c, &train, &test, b);
    cr_assert_eq(b->n_records, 5, "2 segment epochs, 2 recovery epochs, the final record");
    for (int e = 0; e < 2; e++) {
        cr_assert_eq(memcmp(b->records[e].segment_loss, a->records[e].segment_loss,
                            sizeof a->records[e].segment_loss), 0, "epoch %d's segment losses", e + 1);
        cr_assert_eq(memcmp(&b->records[e].test_loss, &a->records[e].test_loss, sizeof(double)),
                     0, "epoch %d's joined network", e + 1);
    }
    cr_assert_eq(b->records[1].test_acc, f0.test_acc, "the joined network before recovery");
    uint64_t seg_steps = b->records[1].step;
    cr_assert_gt(b->etas[seg_steps - 1], 0.0,
                 "the last segment step's ETA counts the recovery epochs to come");
    cr_assert(!b->records[1].recovery && b->records[2].recovery && f2.recovery);
    cr_assert_eq(b->records[2].epoch, 3);
    cr_assert_eq(b->records[3].epoch, 4);
    cr_assert_eq(f2.epochs, 4);
    cr_assert_eq(b->steps, f2.step, "steps numbered across both phases");
    cr_assert_gt(b->records[2].memory.peak_total, b->records[1].memory.peak_total,
                 "a recovery worker holds the whole network");
    cr_log_info("joined %.4f, after 2 recovery epochs %.4f", f0.test_acc, f2.test_acc);
    cr_expect_geq(f2.test_acc, f0.test_acc - 0.02);
    free(a);
    free(b);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(train, bad_configurations_are_refused)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = synth_config(1, 2, 1);
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, NULL), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "--workers 2"), "%s", st_last_error());
    c = synth_config(2, 5, 1); /* 4 linear layers */
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "--segments"), "%s", st_last_error());
    c = synth_config(2, 2, 1);
    c.model.kind = st_model_kind_named("resmlp");
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "synth cuts an mlp into segments; --model resmlp is not"),
              "%s", st_last_error());
    c.model.kind = st_model_kind_named("resnet18");
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "--model resnet18 does not train with --strategy synth (its "
                     "segments would cut batch-normalised"), "%s", st_last_error());
    c = synth_config(2, 3, 1);
    c.synth.cuts[0] = 2;
    c.synth.cuts[1] = 2;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "--cuts"), "%s", st_last_error());
    c.synth.cuts[1] = 4; /* depth 3: cuts sit after layers 1 .. 3 */
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID, "a cut after the head");
    c = synth_config(2, 2, 1);
    c.steps = 10;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "--epochs"), "%s", st_last_error());
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* The warmup is checked against each group's own run, not against a
 * data-parallel run of all N workers: N = 3, S = 2 gives groups of 2 and 1
 * (64 and 128 steps an epoch at 4096 samples, batch 32), where data
 * parallelism of 3 workers would take 42.  A warmup of 50 steps is valid
 * for both groups (a data-parallel plan would refuse it); 70 is longer
 * than segment 1's run. */
Test(train, warmup_is_checked_per_group, .timeout = 60)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = synth_config(3, 2, 1);
    c.schedule = ST_SCHED_WARMUP_COSINE;
    c.warmup_steps = 50;
    recorder *r = calloc(1, sizeof *r);
    st_epoch_record f = train_recorded(&c, &train, &test, r);
    cr_assert(f.segment_workers[0] == 2 && f.segment_workers[1] == 1, "groups %d/%d",
              f.segment_workers[0], f.segment_workers[1]);
    cr_assert_eq(f.step, 64, "worker 0's group took %llu steps", (unsigned long long)f.step);
    c.warmup_steps = 70;
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, NULL), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "segment 1"), "%s", st_last_error());
    free(r);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* ------------------------------------------------------------ stops and checkpoints */

/* What a run with a stop flag reports: its records, its checkpoints'
 * names, its trained parameters; the flag is raised after worker 0's
 * step stop_at. */
typedef struct stop_run {
    volatile sig_atomic_t stop;
    uint64_t stop_at;
    st_epoch_record records[8];
    int n_records;
    uint64_t checkpoints[8];
    int n_checkpoints;
    float params[4096];
    size_t n_params;
} stop_run;

static void stop_on_step(const st_step_info *info, void *user)
{
    stop_run *s = user;
    if (s->stop_at && info->step == s->stop_at)
        s->stop = 1;
}

static void stop_on_epoch(const st_epoch_record *rec, void *user)
{
    stop_run *s = user;
    cr_assert_lt(s->n_records, 8);
    s->records[s->n_records++] = *rec;
}

static void stop_on_checkpoint(const char *path, uint64_t step, void *user)
{
    (void)path;
    stop_run *s = user;
    cr_assert_lt(s->n_checkpoints, 8);
    s->checkpoints[s->n_checkpoints++] = step;
}

static void stop_on_params(const float *params, size_t count, void *user)
{
    stop_run *s = user;
    cr_assert_leq(count, sizeof s->params / sizeof *s->params);
    memcpy(s->params, params, count * sizeof *params);
    s->n_params = count;
}

static void run_stopped(const st_train_config *c, const st_dataset *train,
                        const st_dataset *test, stop_run *s)
{
    st_train_callbacks cb = { .on_step = stop_on_step, .on_epoch = stop_on_epoch, .user = s,
                              .on_params = stop_on_params, .stop = &s->stop,
                              .on_checkpoint = stop_on_checkpoint };
    cr_assert_eq(st_train_run(c, train, test, &cb, NULL), ST_OK, "%s", st_last_error());
}

/* The segment epochs' groups meet only at epoch ends: a stop asked for
 * in an epoch ends the run at that epoch's end, and periodic checkpoints
 * are taken there, every worker agreeing although their own step counts
 * differ (N = 3, S = 2: groups of 2 and 1 workers take 64 and 128 steps an
 * epoch; names and records count group 0's).  The checkpoint of a stop
 * there resumes to the weights of the run never stopped, through the
 * remaining segment epoch and the recovery epoch. */
Test(train, segment_epochs_stop_and_checkpoint_at_their_ends, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    char dir[ST_TEST_PATH_MAX], path[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_train_config c = synth_config(3, 2, 4);
    c.synth.recovery_epochs = 1;
    stop_run *straight = calloc(1, sizeof *straight), *s = calloc(1, sizeof *s);
    run_stopped(&c, &train, &test, straight);
    cr_assert_eq(straight->n_records, 6, "4 segment epochs, a recovery epoch, the final");

    c.checkpoint.dir = dir;
    c.checkpoint.every = 100;
    s->stop_at = 140;   /* in segment epoch 3 (group 0's steps 129 .. 192) */
    run_stopped(&c, &train, &test, s);
    cr_assert_eq(s->n_records, 4, "epochs 1 to 3, then the final record");
    for (int e = 0; e < 3; e++) {
        cr_assert_eq(s->records[e].step, 64 * (uint64_t)(e + 1), "epoch %d's record", e + 1);
        cr_assert(!s->records[e].recovery && s->records[e].n_segments == 2);
        cr_assert_eq(memcmp(s->records[e].segment_loss, straight->records[e].segment_loss,
                            sizeof s->records[e].segment_loss), 0, "epoch %d", e + 1);
    }
    const st_epoch_record *f = &s->records[3];
    cr_assert(f->final && f->interrupted && f->step == 192 && f->epoch == 3 && f->epochs == 5,
              "the final record: epoch %d/%d, step %llu, interrupted %d", f->epoch, f->epochs,
              (unsigned long long)f->step, f->interrupted);
    cr_assert_eq(s->n_checkpoints, 2, "%d checkpoints", s->n_checkpoints);
    cr_assert_eq(s->checkpoints[0], 128, "the periodic one: step 100 passed in epoch 2");
    cr_assert_eq(s->checkpoints[1], 192, "the stop's, at epoch 3's end");

    snprintf(path, sizeof path, "%s/step-00000192.safetensors", dir);
    st_safetensors file;
    cr_assert_eq(st_safetensors_read(path, &file), ST_OK, "%s", st_last_error());
    cr_assert_str_eq(st_safetensors_meta(&file, "subtrain.synth.segment_epochs"), "3");
    cr_assert_str_eq(st_safetensors_meta(&file, "subtrain.epoch"), "1",
                     "an apart phase's checkpoint: the recovery epochs' start");
    cr_assert_str_eq(st_safetensors_meta(&file, "subtrain.step"), "0");
    st_train_config rc = synth_config(3, 2, 4);
    rc.synth.recovery_epochs = 1;
    rc.resume = &file;
    rc.resume_name = path;
    stop_run *resumed = calloc(1, sizeof *resumed);
    run_stopped(&rc, &train, &test, resumed);
    cr_assert_eq(resumed->n_records, 3, "segment epoch 4, the recovery epoch, the final");
    cr_assert(resumed->records[0].epoch == 4 && resumed->records[0].step == 256 &&
              !resumed->records[0].recovery);
    cr_assert(resumed->records[1].epoch == 5 && resumed->records[1].recovery);
    cr_assert_eq(resumed->n_params, straight->n_params);
    cr_assert_eq(memcmp(resumed->params, straight->params,
                        straight->n_params * sizeof *straight->params), 0,
                 "the resumed run's weights are those of the run never stopped");
    st_safetensors_free(&file);
    free(straight);
    free(s);
    free(resumed);
    st_test_rmdir(dir);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* ------------------------------------------------------------ hot path */

/* Counts heap calls of every thread between worker 0's step 3 and its
 * first epoch record (test_train_hotpath.c explains the interposer; oneDNN's own
 * allocations inside dnnl_primitive_execute are counted apart).  Every
 * worker's steps count, not only worker 0's: the flag is one global atomic
 * (worker 0's callbacks arm and disarm it for everyone), the counters are
 * global atomics that every thread adds to (the sum over threads), and
 * only "inside oneDNN" is per thread (heapwatch.h). */
static atomic_int armed;
static atomic_long own_calls, executes;

static void heapwatch_heap_call(int inside_onednn)
{
    if (atomic_load_explicit(&armed, memory_order_relaxed) && !inside_onednn)
        atomic_fetch_add_explicit(&own_calls, 1, memory_order_relaxed);
}

static void heapwatch_execute(void)
{
    if (atomic_load_explicit(&armed, memory_order_relaxed))
        atomic_fetch_add_explicit(&executes, 1, memory_order_relaxed);
}

#include "heapwatch.h"

typedef struct heap_watch {
    long own, execs;
    int done;
} heap_watch;

static void watch_step(const st_step_info *info, void *user)
{
    (void)user;
    if (info->step == 3) {
        atomic_store(&own_calls, 0);
        atomic_store(&executes, 0);
        atomic_store(&armed, 1);
    }
}

static void watch_epoch(const st_epoch_record *rec, void *user)
{
    heap_watch *h = user;
    (void)rec;
    if (h->done)
        return;
    atomic_store(&armed, 0);
    h->done = 1;
    h->own = atomic_load(&own_calls);
    h->execs = atomic_load(&executes);
}

/* N = 4, S = 3 (cuts after layers 1 and 2, FLOPs 2048 : 2048 : 2432 per
 * sample): groups of 1, 1 and 2, so the steps watched are a first segment
 * updating alone, a middle one (noise, MSE, update alone) and a last one
 * (noise, cross-entropy, its group's engine). */
Test(train, a_segment_step_makes_no_heap_allocation, .timeout = 60)
{
    HEAPWATCH_SKIP_IF_OFF();
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = synth_config(4, 3, 1);
    heap_watch h = { 0 };
    st_train_callbacks cb = { .on_step = watch_step, .on_epoch = watch_epoch, .user = &h };
    st_epoch_record f;
    cr_assert_eq(st_train_run(&c, &train, &test, &cb, &f), ST_OK, "%s", st_last_error());
    cr_assert(h.done);
    cr_assert(f.segment_workers[0] == 1 && f.segment_workers[1] == 1 &&
              f.segment_workers[2] == 2, "groups %d/%d/%d", f.segment_workers[0],
              f.segment_workers[1], f.segment_workers[2]);
    cr_assert(c.synth.noise > 0.0f, "the later segments draw noise");
    /* each step runs >= 3 primitives per linear layer: every worker's count */
    cr_assert_gt(h.execs, 3 * 100, "the interposer saw the workers' primitives run (%ld)",
                 h.execs);
    cr_log_info("every worker, worker 0's steps 4-128 and the evaluation: %ld heap calls, "
                "%ld primitive executions", h.own, h.execs);
    cr_assert_eq(h.own, 0, "the workers called the heap %ld times in their segment steps", h.own);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

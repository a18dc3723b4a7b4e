/*
 * tests/test_train.c — the training loop: it learns, it is deterministic,
 * its step path allocates nothing, and it refuses bad configurations.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include <subtrain/subtrain.h>
#include "json_check.h"
#include "recorder.h"
#include "nn/dnnl_util.h"
#include "train/worker.h"

/* A small synthetic task so that each test runs in seconds. */
static void make_data(uint64_t seed, st_dataset *train, st_dataset *test)
{
    st_synthetic_config sc = st_synthetic_defaults(seed);
    sc.train_count = 8192;
    sc.test_count = 1024;
    sc.dim = 32;
    sc.n_classes = 4;
    cr_assert_eq(st_synthetic_make(&sc, train, test), ST_OK, "%s", st_last_error());
    st_dataset_normalize(train, test, NULL, NULL);
}

static st_train_config small_config(st_model_kind kind)
{
    st_train_config c = st_train_config_default();
    c.model.kind = kind;
    c.model.depth = 2;
    c.model.width = 64;
    c.model.in_dim = 32;
    c.model.n_classes = 4;
    c.batch = 32;
    c.epochs = 2;
    return c;
}

/* The stated bar: the synthetic task's teacher is a 32-unit tanh network.
 * After 8 epochs each student must classify the test set with >= 0.85
 * accuracy.  Chance is 0.25; measured with this seed: mlp 0.879, resmlp
 * 0.873, and a width-1 mlp (a bottleneck that cannot represent the teacher)
 * 0.43, so a trainer with a wrong gradient or update does not pass. */
#define SYNTH_MIN_ACCURACY 0.85

static void assert_learns(st_model_kind kind)
{
    st_dataset train, test;
    make_data(11, &train, &test);
    st_train_config c = small_config(kind);
    c.epochs = 8;
    recorder *r = calloc(1, sizeof *r);
    st_epoch_record final = train_recorded(&c, &train, &test, r);
    cr_assert_geq(final.test_acc, SYNTH_MIN_ACCURACY, "%s reached only %.4f",
                  st_model_kind_name(kind), final.test_acc);
    cr_assert_lt(r->records[c.epochs - 1].train_loss, r->records[0].train_loss / 2,
                 "the training loss falls");
    free(r);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(train, mlp_learns_the_synthetic_task, .timeout = 120)
{
    assert_learns(st_model_kind_named("mlp"));
}

Test(train, resmlp_learns_the_synthetic_task, .timeout = 120)
{
    assert_learns(st_model_kind_named("resmlp"));
}

Test(train, same_seed_gives_bitwise_identical_runs, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = small_config(st_model_kind_named("resmlp"));
    recorder *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b), *d = calloc(1, sizeof *d);
    st_epoch_record fa = train_recorded(&c, &train, &test, a);
    st_epoch_record fb = train_recorded(&c, &train, &test, b);
    cr_assert_eq(a->steps, b->steps);
    cr_assert_eq(memcmp(a->losses, b->losses, a->steps * sizeof(float)), 0,
                 "every step's loss is bitwise the same");
    cr_assert_eq(memcmp(&fa.test_loss, &fb.test_loss, sizeof(double)), 0);
    cr_assert_eq(fa.test_acc, fb.test_acc);
    c.seed = 6;
    train_recorded(&c, &train, &test, d);
    cr_assert_neq(memcmp(a->losses, d->losses, a->steps * sizeof(float)), 0,
                  "another seed gives another run");
    free(a);
    free(b);
    free(d);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(train, steps_option_runs_exactly_that_many_steps)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = small_config(st_model_kind_named("mlp"));
    c.steps = 300; /* 256 steps per epoch: one full epoch and a partial one */
    recorder *r = calloc(1, sizeof *r);
    st_epoch_record final = train_recorded(&c, &train, &test, r);
    cr_assert_eq(r->steps, 300);
    cr_assert_eq(final.step, 300);
    cr_assert_eq(r->n_records, 3, "two epoch records and the final one");
    cr_assert_eq(r->records[0].step, 256);
    cr_assert_eq(r->records[1].step, 300);
    cr_assert(r->records[2].final);
    cr_assert_eq(r->records[2].epoch, 2);
    free(r);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(train, records_carry_memory_and_throughput)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = small_config(st_model_kind_named("resmlp"));
    c.epochs = 1;
    recorder *r = calloc(1, sizeof *r);
    st_epoch_record final = train_recorded(&c, &train, &test, r);
    cr_assert_gt(final.samples_per_s, 0.0);
    cr_assert_gt(final.wall_s, 0.0);
    cr_assert_eq(final.workers, 1);
    size_t sum = 0;
    for (int k = 0; k < ST_MEM_KIND_COUNT; k++) {
        if (k != ST_MEM_ATTENTION)   /* a model without attention has none */
            cr_assert_gt(final.memory.peak[k], 0, "%s", st_mem_kind_name((st_mem_kind)k));
        sum += final.memory.peak[k];
    }
    cr_assert_eq(final.memory.peak[ST_MEM_ATTENTION], 0);
    cr_assert_leq(final.memory.peak_total, sum);
    cr_assert_eq(final.memory.peak[ST_MEM_WEIGHTS], final.memory.peak[ST_MEM_GRADIENTS]);
    cr_assert_eq(final.memory.peak[ST_MEM_OPTIMIZER], 2 * final.memory.peak[ST_MEM_WEIGHTS],
                 "AdamW keeps two moments per parameter");
    free(r);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(train, bad_configurations_are_refused)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = small_config(st_model_kind_named("mlp"));
    c.batch = 9000;
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, NULL), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "larger than the training set"), "%s", st_last_error());
    c = small_config(st_model_kind_named("mlp"));
    c.model.in_dim = 33;
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, NULL), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "inputs"), "%s", st_last_error());
    c = small_config(st_model_kind_named("mlp"));
    c.model.n_classes = 5;
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, NULL), ST_ERR_INVALID);
    c = small_config(st_model_kind_named("mlp"));
    c.steps = 10;
    c.warmup_steps = 10;
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, NULL), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "warmup"), "%s", st_last_error());
    /* the options a checkpoint records: unique keys, each with a value */
    const st_safetensors_meta_entry twice[2] = { { "lr", "0.001" }, { "lr", "0.01" } };
    c = small_config(st_model_kind_named("mlp"));
    c.options = twice;
    c.n_options = 2;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "'lr' given twice"), "%s", st_last_error());
    const st_safetensors_meta_entry no_value[1] = { { "lr", NULL } };
    c.options = no_value;
    c.n_options = 1;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
    c.options = NULL;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID, "1 option and no list");
    c.n_options = 0;
    cr_assert_eq(st_train_config_check(&c), ST_OK);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* ------------------------------------------------------------ the strategy table */

/* The table's names are the enumerators' and the parser's; a front end
 * (the CLI) reads each option of one name with one syntax, whichever
 * strategy takes it, and stores it with that strategy's set. */
Test(strategy, names_options_and_shared_syntax_agree)
{
    static const struct { st_strategy s; const char *name; } named[] = {
        { ST_STRATEGY_DP, "dp" }, { ST_STRATEGY_SDP, "sdp" }, { ST_STRATEGY_IST, "ist" },
        { ST_STRATEGY_SYNTH, "synth" },
    };
    for (size_t k = 0; k < sizeof named / sizeof *named; k++) {
        cr_assert_str_eq(st_strategy_name(named[k].s), named[k].name);
        cr_assert_str_eq(st_strategy_info_of(named[k].s)->name, named[k].name);
    }
    int n = 0;
    for (; st_strategy_info_of((st_strategy)n); n++) {
        const st_strategy_info *a = st_strategy_info_of((st_strategy)n);
        st_strategy parsed;
        cr_assert_eq(st_strategy_parse(a->name, &parsed), ST_OK, "%s", st_last_error());
        cr_assert_eq((int)parsed, n, "%s", a->name);
        cr_assert(a->help && strncmp(a->help, a->name, strlen(a->name)) == 0, "%s", a->name);
        for (const st_strategy_option *d = a->options; d && d->name; d++) {
            cr_assert(d->syntax && d->help && d->set && d->get, "--%s", d->name);
            for (int m = 0; m < n; m++)   /* an earlier strategy's option of that name */
                for (const st_strategy_option *e = st_strategy_info_of((st_strategy)m)->options;
                     e && e->name; e++) {
                    if (strcmp(e->name, d->name) != 0)
                        continue;
                    cr_assert(e->kind == d->kind && e->lo == d->lo && e->hi == d->hi &&
                              e->real_lo == d->real_lo && e->real_hi == d->real_hi &&
                              e->lo_bracket == d->lo_bracket && e->hi_bracket == d->hi_bracket &&
                              strcmp(e->syntax, d->syntax) == 0,
                              "--%s: %s and %s read it differently", d->name,
                              st_strategy_info_of((st_strategy)m)->name, a->name);
                    for (int v = 0; d->kind == ST_OPTION_NAME && (v == 0 || d->names[v - 1]); v++)
                        cr_assert(d->names[v] == e->names[v] ||
                                  (d->names[v] && e->names[v] &&
                                   strcmp(d->names[v], e->names[v]) == 0), "--%s", d->name);
                }
        }
    }
    cr_assert_geq(n, 4);
    st_strategy s;
    cr_assert_eq(st_strategy_parse("nope", &s), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "(allowed: dp, sdp, ist, synth"), "%s", st_last_error());
    cr_assert_str_eq(st_strategy_name((st_strategy)n), "unknown");
}

/* Every option's value goes into the config and comes back as it went in
 * (what --dump-config prints is what a configuration file gives back). */
Test(strategy, option_values_round_trip)
{
    for (int n = 0; st_strategy_info_of((st_strategy)n); n++)
        for (const st_strategy_option *d = st_strategy_info_of((st_strategy)n)->options;
             d && d->name; d++) {
            st_train_config c = st_train_config_default();
            c.strategy = (st_strategy)n;
            st_option_value in, out;
            memset(&in, 0, sizeof in);
            memset(&out, 0, sizeof out);
            switch (d->kind) {
            case ST_OPTION_COUNT: in.count = d->lo + 1 <= d->hi ? d->lo + 1 : d->lo; break;
            case ST_OPTION_REAL: in.real = (double)(float)(d->real_hi / 2); break;
            case ST_OPTION_NAME: in.name = d->names[1] ? 1 : 0; break;
            case ST_OPTION_COUNTS:
                in.n_counts = 1;
                in.counts[0] = (int)d->lo;
                c.synth.segments = 2;   /* one count of synth's --cuts */
                break;
            }
            d->set(&c, &in);
            cr_assert_eq(d->get(&c, &out), 1, "--%s", d->name);
            cr_assert(out.count == in.count && out.real == in.real && out.name == in.name &&
                      out.n_counts == in.n_counts && out.counts[0] == in.counts[0],
                      "--%s of %s does not come back", d->name, st_strategy_name(c.strategy));
        }
}

/* The banner's description of each strategy, and the scale ist evaluates
 * with. */
Test(strategy, descriptions_and_eval_scale)
{
    st_train_config c = st_train_config_default();
    char line[256];
    st_strategy_describe(&c, 2, line, sizeof line);
    cr_assert_str_eq(line, "dp");
    c.strategy = ST_STRATEGY_SDP;
    c.sdp.coverage = 0.3;
    st_strategy_describe(&c, 4, line, sizeof line);
    cr_assert_str_eq(line, "sdp (block, forward masking, coverage 1/4 = 0.25, requested 0.3)");
    st_strategy_describe(&c, 0, line, sizeof line);
    cr_assert_str_eq(line, "sdp (block, forward masking, coverage 0.3)");
    c.strategy = ST_STRATEGY_IST;
    st_strategy_describe(&c, 4, line, sizeof line);
    cr_assert_str_eq(line, "ist (50 local steps)");
    cr_assert_eq(st_strategy_eval_scale(&c, 4), 0.25f);
    c.ist.eval_scale = 0;
    cr_assert_eq(st_strategy_eval_scale(&c, 4), 0.0f);
    c.strategy = ST_STRATEGY_DP;
    cr_assert_eq(st_strategy_eval_scale(&c, 4), 0.0f);
    st_strategy_describe(&c, 4, line, 3);   /* cut, terminated */
    cr_assert_str_eq(line, "dp");
}

Test(train, a_diverging_run_stops_with_a_numerical_error)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = small_config(st_model_kind_named("mlp"));
    c.optim.kind = ST_OPT_SGD;
    c.optim.lr = 100.0f;
    c.schedule = ST_SCHED_CONSTANT;
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, NULL), ST_ERR_NUMERIC);
    cr_assert(strstr(st_last_error(), "--lr"), "the message suggests a fix: %s", st_last_error());
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* ------------------------------------------------------------ hot path */

/* Counts heap calls made on the armed thread: the test binary's malloc
 * family interposes the C library's for the whole process (heapwatch.h) and
 * forwards to it; calls made while oneDNN executes are counted apart.  The
 * assertion is on subtrain's own code; oneDNN's count is reported (and
 * checked to be what the argument map explains, so that a change there is
 * noticed). */
#define HEAPWATCH_PER_THREAD
#include "heapwatch.h"

Test(train, a_training_step_makes_no_heap_allocation)
{
    HEAPWATCH_SKIP_IF_OFF();
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = small_config(st_model_kind_named("resmlp"));
    st_schedule sched = { ST_SCHED_WARMUP_COSINE, 1e-3f, 5, 100 };
    long own = -1, in_onednn = -1, execs = 0;
    st_status s = ST_OK;
#pragma omp parallel num_threads(1)
    {
        omp_set_num_threads(1);
        st_worker w;
        s = st_worker_init(&w, 0, &c, train.count, NULL);
        if (s == ST_OK)
            s = st_worker_init_optimizer(&w, &c, 0, st_model_param_count(w.model));
        st_epoch_order(c.seed, 0, w.order, train.count);
        float loss, lr;
        /* The first steps may let oneDNN set up its per-thread state. */
        for (uint64_t t = 1; t <= 3 && s == ST_OK; t++)
            s = st_worker_train_step(&w, &train, w.order, (uint32_t)(t * 32), &sched, t, &loss, &lr);
        armed = 1;
        for (uint64_t t = 4; t <= 40 && s == ST_OK; t++)
            s = st_worker_train_step(&w, &train, w.order, (uint32_t)(t * 32), &sched, t, &loss, &lr);
        armed = 0;
        own = own_calls;
        in_onednn = dnnl_calls;
        execs = executes;
        st_worker_destroy(&w);
    }
    cr_assert_eq(s, ST_OK, "%s", st_last_error());
    cr_assert_gt(execs, 0, "the interposer saw the primitives run");
    cr_assert_eq(own, 0, "37 training steps: subtrain called the heap %ld times", own);
    cr_log_info("oneDNN: %ld heap calls in %ld primitive executions", in_onednn, execs);
    /* The argument map: a bucket array and a node per argument, at most. */
    cr_assert_leq(in_onednn, execs * (ST_PRIM_MAX_ARGS + 2),
                  "oneDNN allocated more than its argument maps explain");
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* ------------------------------------------------------------ metrics */

Test(metrics, one_json_object_per_line_with_the_documented_keys)
{
    st_epoch_record r;
    memset(&r, 0, sizeof r);
    r.epoch = 3;
    r.step = 1404;
    r.test_acc = 0.875;
    r.memory.peak_total = 12345;
    r.memory.peak[ST_MEM_ACTIVATIONS] = 678;
    char buf[2048] = { 0 };
    FILE *f = fmemopen(buf, sizeof buf - 1, "w");
    cr_assert_eq(st_metrics_write(f, &r), 0);
    fclose(f);
    const char *keys[] = { "\"epoch\":3", "\"step\":1404", "\"final\":false", "\"train_loss\":",
                           "\"test_loss\":", "\"test_acc\":0.8750", "\"samples_per_s\":",
                           "\"wall_s\":", "\"peak_bytes\":12345", "\"activations\":678",
                           "\"workers\":" };
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        cr_assert(strstr(buf, keys[i]), "missing %s in %s", keys[i], buf);
    cr_assert_eq(buf[0], '{');
    cr_assert_eq(strchr(buf, '\n'), buf + strlen(buf) - 1, "exactly one line");
    /* the optional objects and keys keep the braces balanced */
    r.align_measured = 4;
    r.comm_bytes_per_worker_round = 5e6;
    memset(buf, 0, sizeof buf);
    f = fmemopen(buf, sizeof buf - 1, "w");
    cr_assert_eq(st_metrics_write(f, &r), 0);
    fclose(f);
    cr_assert(strstr(buf, "\"comm_bytes_per_worker_round\":5000000,"), "%s", buf);
    cr_assert(strstr(buf, "\"grad_alignment\":{"), "%s", buf);
    int depth = 0;
    for (const char *c = buf; *c; c++) {
        depth += (*c == '{') - (*c == '}');
        cr_assert_geq(depth, 0, "%s", buf);
        if (depth == 0 && *c == '}')
            cr_assert(c[1] == '\n' && c[2] == '\0', "one object, closed at the end: %s", buf);
    }
}

/* Every number of a record may be NaN or infinite (a diverged loss, a
 * rate over no time, zero gradients' alignment): each is written null,
 * and every record, with all its optional parts, parses as JSON. */
Test(metrics, non_finite_numbers_are_null_and_every_line_parses)
{
    static const st_epoch_record zero;
    const double bad[3] = { NAN, INFINITY, -INFINITY };
    char buf[8192];
    for (int k = 0; k < 3; k++) {
        st_epoch_record r = zero;
        double segments[3] = { 0.5, bad[k], 1.0 };
        int workers[3] = { 1, 1, 2 }, cuts[2] = { 2, 4 };
        r.epoch = 1;
        r.final = 1;
        r.train_loss = r.test_loss = (float)bad[k];
        r.test_acc = r.samples_per_s = r.wall_s = bad[k];
        r.lr = (float)bad[k];
        r.tokens_per_sample = 128;
        r.align_measured = 2;
        r.align_mean = r.align_min = bad[k];
        r.n_segments = 3;
        memcpy(r.segment_loss, segments, sizeof segments);
        memcpy(r.segment_workers, workers, sizeof workers);
        memcpy(r.cuts, cuts, sizeof cuts);
        r.comm_bytes_per_worker_step = r.ring_bytes_per_worker_step = bad[k];
        r.comm_bytes_per_worker_round = 1e6;
        r.step_ms_compute = r.step_ms_wait = r.step_ms_reduce = r.step_ms_optimizer = bad[k];
        memset(buf, 0, sizeof buf);
        FILE *f = fmemopen(buf, sizeof buf - 1, "w");
        cr_assert_eq(st_metrics_write(f, &r), 0);
        fclose(f);
        cr_assert(st_json_valid(buf), "not JSON: %s", buf);
        cr_assert_null(strstr(buf, "nan"), "%s", buf);
        cr_assert_null(strstr(buf, "inf"), "%s", buf);
        static const char *const nulls[] = {
            "\"train_loss\":null", "\"test_loss\":null", "\"test_acc\":null",
            "\"samples_per_s\":null", "\"wall_s\":null", "\"lr\":null", "\"train_bpb\":null",
            "\"tokens_per_s\":null", "\"mean\":null", "\"min\":null",
            "\"segment_loss\":[0.500000,null,1.000000]", "\"comm_bytes_per_worker_step\":null",
            "\"ring_bytes_per_worker_step\":null", "\"compute\":null", "\"optimizer\":null",
        };
        for (size_t i = 0; i < sizeof nulls / sizeof *nulls; i++)
            cr_assert(strstr(buf, nulls[i]), "missing %s in %s", nulls[i], buf);
    }
    /* and the validator refuses what the old records held */
    cr_assert(st_json_valid("{\"a\":[1,-0.5e+3,null,true,\"x\\n\"]}\n"));
    cr_assert_not(st_json_valid("{\"train_loss\":nan}"));
    cr_assert_not(st_json_valid("{\"train_loss\":inf}"));
    cr_assert_not(st_json_valid("{\"a\":1,}"));
    cr_assert_not(st_json_valid("{\"a\":01}"));
    cr_assert_not(st_json_valid("{\"a\":1}{"));
}

/* Datasets handed to the library whose splits differ in shape: the
 * message says which set and both shapes (the loaders, which know the
 * files, refuse such splits first and name the file). */
Test(train, splits_of_two_shapes_are_described)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = small_config(st_model_kind_named("mlp"));
    test.dim = 28;   /* as if its samples were 1x4x7 */
    test.channels = 1;
    test.height = 4;
    test.width = 7;
    st_epoch_record final;
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, &final), ST_ERR_INVALID);
    cr_assert_str_eq(st_last_error(), "the test set's samples are 1x4x7 (28 features) but the "
                     "training set's are 32x1x1 (32): both sets need one shape");
    test.dim = 32;
    test.channels = 32;
    test.height = test.width = 1;
    c.model.in_dim = 30;
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, &final), ST_ERR_INVALID);
    cr_assert_str_eq(st_last_error(), "the model takes 30 inputs but the data's samples are "
                     "32x1x1 (32 features)");
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* ------------------------------------------------------------ data parallel */

static st_train_config dp_config(int workers, int batch, uint64_t steps)
{
    st_train_config c = small_config(st_model_kind_named("resmlp"));
    c.workers = workers;
    c.batch = batch;
    c.steps = steps;
    c.epochs = 0;
    c.oversubscribe = 1; /* this machine may have fewer cores than workers */
    return c;
}

/* N workers at batch B see, at step i, exactly the samples one worker sees
 * at batch N B, and the mean of their mean gradients is the mean gradient
 * of the global batch.  What differs is float summation order (the GEMMs
 * of a batch of B rows, the reduction's order): the losses of the two runs
 * must agree within DP_LOSS_RTOL over 60 AdamW steps.  Measured: about
 * 1e-6 relative; a real error (a missing 1/N, a sample seen twice, a
 * worker's gradient dropped) moves the loss by 1e-2 or more within a few
 * steps. */
#define DP_LOSS_RTOL 1e-4

static void assert_dp_matches_one_worker(int n, int batch)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    recorder *one = calloc(1, sizeof *one), *many = calloc(1, sizeof *many);
    st_train_config c1 = dp_config(1, n * batch, 60), cn = dp_config(n, batch, 60);
    st_epoch_record f1 = train_recorded(&c1, &train, &test, one);
    st_epoch_record fn = train_recorded(&cn, &train, &test, many);
    cr_assert_eq(one->steps, many->steps);
    double worst = 0.0;
    for (uint64_t i = 0; i < one->steps; i++) {
        double d = fabs((double)one->losses[i] - many->losses[i]) / fabs((double)one->losses[i]);
        if (d > worst)
            worst = d;
    }
    cr_log_info("%d workers x %d vs 1 x %d: worst relative loss difference %.2e over %llu steps",
                n, batch, n * batch, worst, (unsigned long long)one->steps);
    cr_assert_leq(worst, DP_LOSS_RTOL, "%d workers x %d disagree with 1 worker x %d: %.3e",
                  n, batch, n * batch, worst);
    cr_assert_leq(fabs(f1.test_loss - fn.test_loss), DP_LOSS_RTOL * 10 * f1.test_loss);
    cr_assert_eq(fn.workers, n);
    free(one);
    free(many);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(dp, two_workers_agree_with_one_worker_on_the_global_batch, .timeout = 120)
{
    assert_dp_matches_one_worker(2, 32);
}

Test(dp, three_workers_agree_with_one_worker_on_the_global_batch, .timeout = 120)
{
    assert_dp_matches_one_worker(3, 16);
}

Test(dp, same_seed_and_workers_give_bitwise_identical_runs, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    recorder *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    st_train_config c = dp_config(2, 32, 80);
    st_epoch_record fa = train_recorded(&c, &train, &test, a);
    st_epoch_record fb = train_recorded(&c, &train, &test, b);
    cr_assert_eq(a->steps, b->steps);
    cr_assert_eq(memcmp(a->losses, b->losses, a->steps * sizeof(float)), 0,
                 "every step's loss is bitwise the same");
    cr_assert_eq(memcmp(&fa.test_loss, &fb.test_loss, sizeof(double)), 0);
    free(a);
    free(b);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* The OS index of the PU a one-worker plan takes on this machine: a
 * cpuset of it alone puts every worker there (oversubscribed), in one
 * NUMA domain whatever the machine, so the reduction has one level and
 * its byte counts follow the formulas below. */
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

/* Shard w of P elements over N owners (doc/reduction.md): ceil(P / 16)
 * lines of 16 floats dealt out evenly, the first (lines mod N) shards one
 * line more, the last line possibly partial. */
static st_range shard_of(size_t P, int N, int w)
{
    size_t lines = (P + 15) / 16, q = lines / (size_t)N, rem = lines % (size_t)N;
    size_t first = (size_t)w * q + ((size_t)w < rem ? (size_t)w : rem);
    size_t last = first + q + ((size_t)w < rem);
    st_range r = { 16 * first < P ? 16 * first : P, 16 * last < P ? 16 * last : P };
    return r;
}

/* The record's communication, exactly: in one NUMA domain the owner of
 * shard S reads the N gradients of it and writes its mean, and the
 * all-gather reads and writes all P elements, so worker w moves
 * 4 ((N + 1) |S_w| + 2 P) bytes a step; the record has the busiest
 * worker's (the first shards are the largest). */
Test(dp, records_carry_workers_memory_and_communication, .timeout = 60)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = dp_config(2, 32, 10);
    char pu[32];
    one_pu_cpuset(pu, sizeof pu);
    c.cpuset = pu;
    recorder *r = calloc(1, sizeof *r);
    st_epoch_record f = train_recorded(&c, &train, &test, r);
    size_t P = st_model_config_param_count(&c.model);
    cr_assert_eq(f.workers, 2);
    cr_assert_float_eq(f.ring_bytes_per_worker_step, 2.0 * 1 / 2 * (double)P * 4, 1.0);
    double busiest = 0.0;
    for (int w = 0; w < 2; w++) {
        st_range s = shard_of(P, 2, w);
        busiest = fmax(busiest, 4.0 * (3.0 * (double)(s.end - s.begin) + 2.0 * (double)P));
    }
    cr_assert_eq(f.comm_bytes_per_worker_step, busiest, "%.0f bytes a step, %zu parameters "
                 "make %.0f", f.comm_bytes_per_worker_step, P, busiest);
    cr_assert_eq(f.comm_bytes_per_worker_round, 0.0, "no rounds in dp");
    cr_assert_gt(f.step_ms_compute, 0.0);
    cr_assert_gt(f.step_ms_reduce, 0.0);
    cr_assert_gt(f.step_ms_optimizer, 0.0);
    /* ZeRO-1: a worker keeps the optimizer state of its shard only. */
    cr_assert_lt(f.memory.peak[ST_MEM_OPTIMIZER], 2 * P * sizeof(float) * 3 / 4,
                 "optimizer state %zu bytes for %zu parameters", f.memory.peak[ST_MEM_OPTIMIZER], P);
    free(r);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(dp, more_workers_than_cpus_needs_oversubscribe)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_topology *t;
    cr_assert_eq(st_topology_load(NULL, &t), ST_OK, "%s", st_last_error());
    int pus = st_topology_pu_count(t);
    st_topology_destroy(t);
    st_train_config c = dp_config(pus + 1, 8, 2);
    c.oversubscribe = 0;
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, NULL), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "--oversubscribe"), "%s", st_last_error());
    c.oversubscribe = 1;
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, NULL), ST_OK, "%s", st_last_error());
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* The data-parallel step (compute, barrier, reduce-scatter, shard update,
 * all-gather) makes no heap call of its own either.  The callbacks run on
 * worker 0's thread, between its steps: they arm the counter after step 3
 * and read it at the end of the epoch.  Worker 1 runs the same code. */
typedef struct heap_watch {
    long own, onednn, execs;
    int done;
} heap_watch;

static void watch_step(const st_step_info *info, void *user)
{
    (void)user;
    if (info->step == 3) {
        own_calls = dnnl_calls = executes = 0;
        armed = 1;
    }
}

static void watch_epoch(const st_epoch_record *rec, void *user)
{
    heap_watch *h = user;
    (void)rec;
    if (h->done)
        return;
    armed = 0;
    h->done = 1;
    h->own = own_calls;
    h->onednn = dnnl_calls;
    h->execs = executes;
}

/* Worker 0 after step 3 of a 40-step run of c, evaluation included:
 * subtrain itself must make no heap call. */
static void assert_no_heap_call_on(const st_train_config *c, const st_dataset *train,
                                   const st_dataset *test, const char *what);

static void assert_steps_make_no_heap_call(const st_train_config *c, const char *what)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    assert_no_heap_call_on(c, &train, &test, what);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

static void assert_no_heap_call_on(const st_train_config *c, const st_dataset *train,
                                   const st_dataset *test, const char *what)
{
    heap_watch h = { 0 };
    st_train_callbacks cb = { .on_step = watch_step, .on_epoch = watch_epoch, .user = &h };
    cr_assert_eq(st_train_run(c, train, test, &cb, NULL), ST_OK, "%s", st_last_error());
    cr_assert(h.done);
    cr_assert_gt(h.execs, 0, "the interposer saw worker 0's primitives run");
    cr_log_info("%s, worker 0, steps 4-40 and the evaluation: subtrain %ld heap calls, oneDNN "
                "%ld in %ld executions", what, h.own, h.onednn, h.execs);
    cr_assert_eq(h.own, 0, "%s: worker 0 called the heap %ld times in 37 steps", what, h.own);
}

Test(dp, a_data_parallel_step_makes_no_heap_allocation, .timeout = 60)
{
    HEAPWATCH_SKIP_IF_OFF();
    st_train_config c = dp_config(2, 32, 40);
    assert_steps_make_no_heap_call(&c, "data parallelism");
}

/* ------------------------------------------------------------ subnetworks */

static st_train_config sdp_config(int workers, double coverage, uint64_t steps)
{
    st_train_config c = dp_config(workers, 16, steps);
    c.strategy = ST_STRATEGY_SDP;
    c.sdp.subnet = ST_SUBNET_BLOCK;
    c.sdp.masking = ST_MASKING_FORWARD;
    c.sdp.coverage = coverage;
    c.model.depth = 4;
    return c;
}

/* Trains both configurations on the same data and asserts that every
 * step's loss is bitwise the same; returns both final records. */
static void assert_bitwise_same_run(const st_train_config *a, const st_train_config *b,
                                    st_epoch_record *fa, st_epoch_record *fb)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    recorder *ra = calloc(1, sizeof *ra), *rb = calloc(1, sizeof *rb);
    *fa = train_recorded(a, &train, &test, ra);
    *fb = train_recorded(b, &train, &test, rb);
    cr_assert_eq(ra->steps, rb->steps);
    cr_assert_eq(memcmp(ra->losses, rb->losses, ra->steps * sizeof(float)), 0,
                 "every step's loss is bitwise the same");
    cr_assert_eq(fa->test_acc, fb->test_acc);
    free(ra);
    free(rb);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* Coverage 1: every worker holds every block, so SDP with forward masking
 * is data parallelism, to the bit (same init, same products, same
 * reduction order), although it goes through subnetwork models and compact
 * attachment. */
Test(sdp, coverage_one_is_bitwise_data_parallelism, .timeout = 120)
{
    st_train_config cs = sdp_config(2, 1.0, 40), cd = cs;
    cd.strategy = ST_STRATEGY_DP;
    st_epoch_record fd, fs;
    assert_bitwise_same_run(&cd, &cs, &fd, &fs);
    cr_assert_float_eq(fd.test_loss, fs.test_loss, 1e-9 * fd.test_loss,
                       "evaluation sums in another order only");
}

/* Coverage 1/2 over 4 workers: every block is trained by 2 workers, each
 * worker runs 2 of 4 blocks; per-worker memory falls, the run learns, and
 * two runs are bitwise identical. */
Test(sdp, half_coverage_learns_with_less_memory_and_is_deterministic, .timeout = 120)
{
    st_dataset train, test;
    make_data(11, &train, &test);
    recorder *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b), *d = calloc(1, sizeof *d);
    st_train_config cs = sdp_config(4, 0.5, 512), cd = cs;
    cd.strategy = ST_STRATEGY_DP;
    st_epoch_record fa = train_recorded(&cs, &train, &test, a);
    st_epoch_record fb = train_recorded(&cs, &train, &test, b);
    st_epoch_record fd = train_recorded(&cd, &train, &test, d);
    cr_assert_eq(memcmp(a->losses, b->losses, a->steps * sizeof(float)), 0);
    cr_log_info("4 workers, 512 steps: dp test_acc %.4f peak %zu B; sdp block C=0.5 test_acc "
                "%.4f peak %zu B", fd.test_acc, fd.memory.peak_total, fa.test_acc,
                fa.memory.peak_total);
    cr_assert_geq(fa.test_acc, SYNTH_MIN_ACCURACY, "sdp reached only %.4f", fa.test_acc);
    cr_assert_lt(fa.memory.peak[ST_MEM_WEIGHTS], fd.memory.peak[ST_MEM_WEIGHTS]);
    cr_assert_lt(fa.memory.peak[ST_MEM_ACTIVATIONS], fd.memory.peak[ST_MEM_ACTIVATIONS]);
    cr_assert_lt(fa.memory.peak_total, fd.memory.peak_total);
    (void)fb;
    free(a);
    free(b);
    free(d);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(sdp, unimplemented_variants_and_bad_coverage_are_refused)
{
    st_train_config c = sdp_config(2, 0.5, 10);
    c.sdp.masking = ST_MASKING_BACKWARD;
    c.sdp.align_every = 5;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID, "nothing to align");
    c = sdp_config(2, 0.5, 10);
    c.neuron_group = 0;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
    c = sdp_config(2, 0.5, 10);
    c.sdp.coverage = 0.0;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
    c = sdp_config(2, 0.5, 10);
    c.model.kind = st_model_kind_named("mlp");
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
}

/* Alignment: at coverage 1 a worker's "subnetwork" is the full model with
 * the same parameters and batch, so the cosine is 1 (up to float); at
 * coverage 1/2 it is less than 1 and the report is there. */
Test(sdp, alignment_is_one_at_full_coverage_and_less_below, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    recorder *r = calloc(1, sizeof *r);
    st_train_config c = sdp_config(2, 1.0, 20);
    c.sdp.align_every = 5;
    st_epoch_record f = train_recorded(&c, &train, &test, r);
    cr_assert_eq(f.align_measured, 4 * 2, "4 measurements of 2 workers");
    cr_assert_float_eq(f.align_mean, 1.0, 1e-5, "mean %.9f", f.align_mean);
    cr_assert_float_eq(f.align_min, 1.0, 1e-5, "min %.9f", f.align_min);
    c = sdp_config(4, 0.5, 20);
    c.sdp.align_every = 10;
    f = train_recorded(&c, &train, &test, r);
    cr_assert_eq(f.align_measured, 2 * 4);
    cr_assert(f.align_mean > 0.0 && f.align_mean < 0.9999, "mean %.6f", f.align_mean);
    cr_assert_leq(f.align_min, f.align_mean);
    c = dp_config(2, 16, 10);
    c.sdp.align_every = 5;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID, "alignment needs sdp");
    free(r);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* Redrawing the masks rebuilds every worker's subnetwork and re-attaches it
 * to the engine between two steps.  At coverage 1 every round holds every
 * block, so a run that rebuilds every 7 steps must still be data
 * parallelism to the bit: nothing is lost or changed in the rebuild. */
Test(sdp, rebuilding_every_round_loses_nothing, .timeout = 120)
{
    st_train_config cs = sdp_config(2, 1.0, 40), cd = cs;
    cs.sdp.resample = 7;
    cd.strategy = ST_STRATEGY_DP;
    st_epoch_record fd, fs;
    assert_bitwise_same_run(&cd, &cs, &fd, &fs);
}

/* Below coverage 1, rounds change who trains what: the run differs from a
 * fixed assignment after the first round, is the fixed one while no round
 * has ended, and is reproducible. */
Test(sdp, resampled_masks_are_reproducible_and_take_effect, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    recorder *fixed = calloc(1, sizeof *fixed), *a = calloc(1, sizeof *a),
             *b = calloc(1, sizeof *b), *late = calloc(1, sizeof *late);
    st_train_config c = sdp_config(4, 0.5, 40);
    train_recorded(&c, &train, &test, fixed);
    c.sdp.resample = 10;
    train_recorded(&c, &train, &test, a);
    train_recorded(&c, &train, &test, b);
    c.sdp.resample = 1000;
    train_recorded(&c, &train, &test, late);
    cr_assert_eq(memcmp(a->losses, b->losses, a->steps * sizeof(float)), 0, "reproducible");
    cr_assert_eq(memcmp(fixed->losses, late->losses, fixed->steps * sizeof(float)), 0,
                 "no round ended: the fixed assignment");
    cr_assert_eq(memcmp(fixed->losses, a->losses, 10 * sizeof(float)), 0,
                 "round 0 is the fixed assignment");
    cr_assert_neq(memcmp(fixed->losses + 10, a->losses + 10, 30 * sizeof(float)), 0,
                  "later rounds redraw the masks");
    free(fixed);
    free(a);
    free(b);
    free(late);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* Backward masking with every block held by every worker is data
 * parallelism to the bit, although gradients and parameters travel through
 * two engines. */
Test(sdp, backward_masking_at_full_coverage_is_bitwise_data_parallelism, .timeout = 120)
{
    st_train_config cb = sdp_config(2, 1.0, 40), cd = cb;
    cb.sdp.masking = ST_MASKING_BACKWARD;
    cd.strategy = ST_STRATEGY_DP;
    st_epoch_record fd, fb;
    assert_bitwise_same_run(&cd, &cb, &fd, &fb);
}

/* Below full coverage, backward masking keeps less gradient and optimizer
 * memory than data parallelism, learns, and redrawn rounds work. */
Test(sdp, backward_masking_learns_with_less_gradient_memory, .timeout = 120)
{
    st_dataset train, test;
    make_data(11, &train, &test);
    recorder *r = calloc(1, sizeof *r), *d = calloc(1, sizeof *d);
    st_train_config cb = sdp_config(4, 0.5, 512), cd = cb;
    cb.sdp.masking = ST_MASKING_BACKWARD;
    cd.strategy = ST_STRATEGY_DP;
    st_epoch_record fb = train_recorded(&cb, &train, &test, r);
    st_epoch_record fd = train_recorded(&cd, &train, &test, d);
    cr_log_info("backward masking C=0.5: test_acc %.4f, gradients %zu B (dp %zu B)", fb.test_acc,
                fb.memory.peak[ST_MEM_GRADIENTS], fd.memory.peak[ST_MEM_GRADIENTS]);
    cr_assert_geq(fb.test_acc, SYNTH_MIN_ACCURACY);
    cr_assert_lt(fb.memory.peak[ST_MEM_GRADIENTS], fd.memory.peak[ST_MEM_GRADIENTS]);
    cb.sdp.resample = 50;
    cb.steps = 120;
    st_epoch_record fr = train_recorded(&cb, &train, &test, r);
    cr_assert_eq(fr.step, 120);
    free(r);
    free(d);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* ------------------------------------------------------------ IST */

static st_train_config ist_config(int workers, uint64_t local_steps, uint64_t steps)
{
    st_train_config c = dp_config(workers, 32, steps);
    c.strategy = ST_STRATEGY_IST;
    c.ist.local_steps = local_steps;
    c.model.depth = 4;
    return c;
}

/* With one worker IST is plain SGD: the worker holds every block, its
 * rounds copy its own parameters back, and plain SGD keeps no state for a
 * reset to lose.  Bitwise, with rounds of 7 steps (and one at each epoch
 * end). */
Test(ist, one_worker_is_bitwise_sgd, .timeout = 120)
{
    st_train_config ci = ist_config(1, 7, 300), cs = ci;
    ci.optim.kind = cs.optim.kind = ST_OPT_SGD;
    ci.optim.momentum = cs.optim.momentum = 0.0f;
    ci.optim.lr = cs.optim.lr = 0.05f;
    cs.strategy = ST_STRATEGY_DP;
    st_epoch_record fi, fs;
    assert_bitwise_same_run(&cs, &ci, &fi, &fs);
    cr_assert_eq(memcmp(&fi.test_loss, &fs.test_loss, sizeof(double)), 0);
}

/* Two workers, disjoint halves of the blocks, 10 local steps a round: the
 * run learns the synthetic task, is reproducible, and communicates once a
 * round: less than data parallelism per step. */
Test(ist, two_workers_learn_reproducibly_with_less_communication, .timeout = 120)
{
    st_dataset train, test;
    make_data(11, &train, &test);
    recorder *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b), *d = calloc(1, sizeof *d);
    st_train_config ci = ist_config(2, 10, 768), cd = ci;
    cd.strategy = ST_STRATEGY_DP;
    st_epoch_record fa = train_recorded(&ci, &train, &test, a);
    st_epoch_record fb = train_recorded(&ci, &train, &test, b);
    st_epoch_record fd = train_recorded(&cd, &train, &test, d);
    cr_log_info("ist 2 workers R=10: test_acc %.4f, %.0f B/worker-step; dp %.4f, %.0f B", fa.test_acc,
                fa.comm_bytes_per_worker_step, fd.test_acc, fd.comm_bytes_per_worker_step);
    cr_assert_eq(memcmp(a->losses, b->losses, a->steps * sizeof(float)), 0, "reproducible");
    cr_assert_eq(fa.test_acc, fb.test_acc);
    cr_assert_geq(fa.test_acc, SYNTH_MIN_ACCURACY, "ist reached only %.4f", fa.test_acc);
    cr_assert_lt(fa.comm_bytes_per_worker_step, fd.comm_bytes_per_worker_step / 4);
    cr_assert_float_eq(fa.comm_bytes_per_worker_round, 10.0 * fa.comm_bytes_per_worker_step,
                       1e-6 * fa.comm_bytes_per_worker_round, "a round is 10 steps");
    cr_assert_eq(fd.comm_bytes_per_worker_round, 0.0, "no rounds in dp");
    free(a);
    free(b);
    free(d);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(ist, bad_options_are_refused)
{
    st_train_config c = ist_config(2, 0, 10);
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
    c = dp_config(2, 16, 10);
    c.ist.keep_state = 1;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID, "keep is an ist option");
    c = ist_config(2, 10, 10);
    c.sdp.subnet = ST_SUBNET_NEURON;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID, "ist of resmlp is block-level");
    c = ist_config(2, 10, 10);
    c.ist.keep_state = 1;
    c.optim.kind = ST_OPT_SGD;
    c.optim.momentum = 0.0f;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID, "no state to keep");
}

/* ------------------------------------------------------------ neuron units */

static st_train_config neuron_sdp_config(st_model_kind kind, int workers, double coverage,
                                         uint64_t steps)
{
    st_train_config c = sdp_config(workers, coverage, steps);
    c.sdp.subnet = ST_SUBNET_NEURON;
    c.neuron_group = 4;
    c.model.kind = kind;
    c.model.depth = 2;
    return c;
}

/* bf16: the all-gather writes the weights' bf16 copies as it brings the
 * parameters in (comm.h: st_comm_set_param_copies), and the next forward
 * reads them instead of converting the weights.  Every step's loss and the
 * final record are bitwise those of the same run with the copies made by
 * each forward (ST_UNFUSE_WEIGHT_COPY), for data parallelism, subnetworks
 * redrawn every 3 steps (a new model and attachment each round), backward
 * masking (a gather-only engine of its own) and neuron subnetworks of an
 * mlp (elements nobody holds); the engine's bytes say the copies were
 * written by it (2 bytes more a copied element). */
Test(bf16_train, gathered_weight_copies_change_nothing, .timeout = 180)
{
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 kernels on this CPU");
    st_train_config cfg[4];
    cfg[0] = dp_config(2, 16, 12);
    cfg[1] = sdp_config(4, 0.5, 12);
    cfg[1].sdp.resample = 3;
    cfg[2] = sdp_config(4, 0.5, 12);
    cfg[2].sdp.masking = ST_MASKING_BACKWARD;
    cfg[3] = neuron_sdp_config(st_model_kind_named("mlp"), 4, 0.5, 12);
    const char *what[] = { "dp", "sdp, redrawn", "sdp, backward masking", "sdp neurons, mlp" };
    for (int k = 0; k < 4; k++) {
        st_train_config a = cfg[k], b;
        a.model.precision = ST_PRECISION_BF16;
        b = a;
        b.model.unfuse = ST_UNFUSE_WEIGHT_COPY;
        st_epoch_record fa, fb;
        assert_bitwise_same_run(&a, &b, &fa, &fb);
        cr_assert_eq(fa.train_loss, fb.train_loss, "%s", what[k]);
        cr_assert_eq(fa.test_loss, fb.test_loss, "%s", what[k]);
        cr_assert_gt(fa.comm_bytes_per_worker_step, fb.comm_bytes_per_worker_step,
                     "%s: the engine wrote no copies", what[k]);
    }
}


/* Coverage 1 with neuron units: every worker's compact model keeps every
 * group, so it is the full model (same values, products, order): data
 * parallelism to the bit, with forward and with backward masking. */
static void assert_neuron_full_coverage_is_dp(st_model_kind kind, st_masking masking)
{
    st_train_config cs = neuron_sdp_config(kind, 2, 1.0, 30), cd = cs;
    cs.sdp.masking = masking;
    cd.strategy = ST_STRATEGY_DP;
    st_epoch_record fd, fs;
    assert_bitwise_same_run(&cd, &cs, &fd, &fs);
}

Test(sdp_neuron, forward_full_coverage_is_bitwise_dp_resmlp, .timeout = 120)
{
    assert_neuron_full_coverage_is_dp(st_model_kind_named("resmlp"), ST_MASKING_FORWARD);
}

Test(sdp_neuron, forward_full_coverage_is_bitwise_dp_mlp, .timeout = 120)
{
    assert_neuron_full_coverage_is_dp(st_model_kind_named("mlp"), ST_MASKING_FORWARD);
}

Test(sdp_neuron, backward_full_coverage_is_bitwise_dp_resmlp, .timeout = 120)
{
    assert_neuron_full_coverage_is_dp(st_model_kind_named("resmlp"), ST_MASKING_BACKWARD);
}

/* Half coverage over 4 workers: every group held by 2; the run learns
 * with less weight and activation memory per worker than data
 * parallelism, and is reproducible; redrawn masks too. */
Test(sdp_neuron, half_coverage_learns_with_less_memory, .timeout = 120)
{
    st_dataset train, test;
    make_data(11, &train, &test);
    recorder *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b), *d = calloc(1, sizeof *d);
    st_train_config cs = neuron_sdp_config(st_model_kind_named("resmlp"), 4, 0.5, 512), cd = cs;
    cd.strategy = ST_STRATEGY_DP;
    cs.sdp.resample = 100;
    st_epoch_record fa = train_recorded(&cs, &train, &test, a);
    st_epoch_record fb = train_recorded(&cs, &train, &test, b);
    st_epoch_record fd = train_recorded(&cd, &train, &test, d);
    cr_log_info("4 workers, 512 steps: dp test_acc %.4f peak %zu B; sdp neuron C=0.5 test_acc "
                "%.4f peak %zu B", fd.test_acc, fd.memory.peak_total, fa.test_acc,
                fa.memory.peak_total);
    cr_assert_eq(memcmp(a->losses, b->losses, a->steps * sizeof(float)), 0);
    cr_assert_eq(fa.test_acc, fb.test_acc);
    cr_assert_geq(fa.test_acc, SYNTH_MIN_ACCURACY, "sdp neuron reached only %.4f", fa.test_acc);
    cr_assert_lt(fa.memory.peak[ST_MEM_WEIGHTS], fd.memory.peak[ST_MEM_WEIGHTS]);
    cr_assert_lt(fa.memory.peak[ST_MEM_ACTIVATIONS], fd.memory.peak[ST_MEM_ACTIVATIONS]);
    free(a);
    free(b);
    free(d);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* The hot path of neuron subnetworks: compact models, compact attachment,
 * per-run weight-gradient products, skipped unheld weights. */
Test(sdp_neuron, a_step_makes_no_heap_allocation, .timeout = 60)
{
    HEAPWATCH_SKIP_IF_OFF();
    st_train_config c = neuron_sdp_config(st_model_kind_named("resmlp"), 2, 0.5, 40);
    c.batch = 32;
    assert_steps_make_no_heap_call(&c, "sdp neuron forward (resmlp)");
    c.sdp.masking = ST_MASKING_BACKWARD;
    assert_steps_make_no_heap_call(&c, "sdp neuron backward (resmlp)");
    c = neuron_sdp_config(st_model_kind_named("mlp"), 2, 0.5, 40);
    c.batch = 32;
    assert_steps_make_no_heap_call(&c, "sdp neuron forward (mlp, unheld weights)");
}

/* The trained full model, as on_params hands it over. */
typedef struct params_out {
    float *p;
    size_t n;
} params_out;

static void keep_params(const float *params, size_t count, void *user)
{
    params_out *o = user;
    o->p = malloc(count * sizeof *o->p);
    cr_assert_not_null(o->p);
    memcpy(o->p, params, count * sizeof *o->p);
    o->n = count;
}

/* Every parameter of the full model moved from its initial value: each is
 * held by some worker and its owner updated it (a shard owner that
 * updated its shard with its own subnetwork's layout would leave the end
 * of the vector untouched). */
static void assert_every_parameter_trained(const st_train_config *c, const char *what)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    params_out o = { 0 };
    st_train_callbacks cb = { .on_params = keep_params, .user = &o };
    cr_assert_eq(st_train_run(c, &train, &test, &cb, NULL), ST_OK, "%s", st_last_error());
    cr_assert_eq(o.n, st_model_config_param_count(&c->model), "%s: the full model", what);
    float *init = malloc(o.n * sizeof *init);
    cr_assert_eq(st_model_init_full_range(&c->model, c->seed, 0, o.n, init), ST_OK);
    size_t same = 0, first = o.n;
    for (size_t i = 0; i < o.n; i++)
        if (o.p[i] == init[i]) {
            same++;
            first = first < i ? first : i;
        }
    cr_assert_eq(same, 0, "%s: %zu of %zu parameters never moved (the first at %zu)", what, same,
                 o.n, first);
    free(init);
    free(o.p);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(sdp_neuron, every_parameter_is_trained, .timeout = 120)
{
    st_train_config c = sdp_config(4, 0.5, 60);
    assert_every_parameter_trained(&c, "sdp block forward C=0.5");
    c = neuron_sdp_config(st_model_kind_named("resmlp"), 4, 0.5, 60);
    assert_every_parameter_trained(&c, "sdp neuron forward C=0.5 (resmlp)");
    c = neuron_sdp_config(st_model_kind_named("mlp"), 4, 0.5, 60);
    assert_every_parameter_trained(&c, "sdp neuron forward C=0.5 (mlp)");
    c.sdp.masking = ST_MASKING_BACKWARD;
    assert_every_parameter_trained(&c, "sdp neuron backward C=0.5 (mlp)");
    c = dp_config(2, 16, 30);
    assert_every_parameter_trained(&c, "data parallelism");
}

Test(sdp_neuron, too_few_groups_for_the_workers_is_refused)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = neuron_sdp_config(st_model_kind_named("resmlp"), 4, 0.25, 10);
    c.neuron_group = 1024;   /* one group per layer, one holder: 3 workers without */
    st_epoch_record f;
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, &f), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "--neuron-group"), "%s", st_last_error());
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* IST of mlp with one worker: it holds every neuron, rounds copy its own
 * parameters back, scaling by N = 1 is none: plain SGD to the bit. */
Test(ist_neuron, one_worker_mlp_is_bitwise_sgd, .timeout = 120)
{
    st_train_config ci = ist_config(1, 7, 300), cs = ci;
    ci.model.kind = cs.model.kind = st_model_kind_named("mlp");
    ci.model.depth = cs.model.depth = 2;
    ci.neuron_group = cs.neuron_group = 4;
    ci.optim.kind = cs.optim.kind = ST_OPT_SGD;
    ci.optim.momentum = cs.optim.momentum = 0.0f;
    ci.optim.lr = cs.optim.lr = 0.05f;
    cs.strategy = ST_STRATEGY_DP;
    st_epoch_record fi, fs;
    assert_bitwise_same_run(&cs, &ci, &fi, &fs);
}

/* Kept optimizer state with one worker: the state carries over rounds, so
 * IST with momentum SGD is momentum SGD to the bit, and with AdamW AdamW
 * (a reset would differ). */
Test(ist_neuron, kept_state_with_one_worker_is_bitwise_momentum_sgd, .timeout = 120)
{
    st_train_config ci = ist_config(1, 7, 200), cs = ci;
    ci.model.kind = cs.model.kind = st_model_kind_named("mlp");
    ci.model.depth = cs.model.depth = 2;
    ci.neuron_group = cs.neuron_group = 4;
    ci.optim.kind = cs.optim.kind = ST_OPT_SGD;
    ci.optim.lr = cs.optim.lr = 0.02f;
    ci.ist.keep_state = 1;
    cs.strategy = ST_STRATEGY_DP;
    st_epoch_record fi, fs;
    assert_bitwise_same_run(&cs, &ci, &fi, &fs);
    /* AdamW: both moments carried over and the step count running on */
    ci.optim.kind = cs.optim.kind = ST_OPT_ADAMW;
    ci.optim.lr = cs.optim.lr = 1e-3f;
    assert_bitwise_same_run(&cs, &ci, &fi, &fs);
    ci.optim.kind = ST_OPT_SGD;
    ci.optim.lr = 0.02f;
    st_dataset train, test;
    make_data(5, &train, &test);
    recorder *reset = calloc(1, sizeof *reset), *kept = calloc(1, sizeof *kept);
    ci.ist.keep_state = 0;
    train_recorded(&ci, &train, &test, reset);
    ci.ist.keep_state = 1;
    train_recorded(&ci, &train, &test, kept);
    cr_assert_neq(memcmp(reset->losses, kept->losses, kept->steps * sizeof(float)), 0,
                  "resetting the momentum every round changes the run");
    free(reset);
    free(kept);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* IST of mlp, 2 workers, disjoint neuron halves: learns, reproducible,
 * communicates once a round. */
Test(ist_neuron, two_workers_mlp_learn_reproducibly, .timeout = 120)
{
    st_dataset train, test;
    make_data(11, &train, &test);
    recorder *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    st_train_config ci = ist_config(2, 10, 768);
    ci.model.kind = st_model_kind_named("mlp");
    ci.model.depth = 2;
    ci.neuron_group = 4;
    st_epoch_record fa = train_recorded(&ci, &train, &test, a);
    st_epoch_record fb = train_recorded(&ci, &train, &test, b);
    cr_log_info("ist mlp 2 workers R=10: test_acc %.4f, %.0f B/worker-step", fa.test_acc,
                fa.comm_bytes_per_worker_step);
    cr_assert_eq(memcmp(a->losses, b->losses, a->steps * sizeof(float)), 0, "reproducible");
    cr_assert_eq(fa.test_acc, fb.test_acc);
    cr_assert_geq(fa.test_acc, SYNTH_MIN_ACCURACY, "ist mlp reached only %.4f", fa.test_acc);
    free(a);
    free(b);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* ------------------------------------------------------------ resnet */

/* A ResNet (convolutions, batch norms: batch statistics each worker's
 * own, running statistics averaged over their holders before each
 * evaluation and each rebuild) with several workers under each strategy
 * that trains it: the run ends (an uneven last test batch for one worker
 * included), learns, and is bitwise reproducible. */
static st_train_config resnet_train_config(int workers)
{
    st_train_config c = st_train_config_default();
    c.model.kind = st_model_kind_named("resnet");
    c.model.depth = 1;
    c.model.width = 4;
    c.model.activation = ST_ACT_RELU;
    c.model.in_dim = 32;          /* make_data's 32 features as 2 x 4 x 4 images */
    c.model.in_channels = 2;
    c.model.in_height = 4;
    c.model.in_width = 4;
    c.model.n_classes = 4;
    c.workers = workers;
    c.oversubscribe = 1;
    c.batch = 24;
    c.steps = 6;
    return c;
}

Test(resnet, two_workers_dp_is_reproducible, .timeout = 120)
{
    st_dataset train, test;
    make_data(11, &train, &test);
    st_train_config c = resnet_train_config(2);
    st_epoch_record a, b;
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, &a), ST_OK, "%s", st_last_error());
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, &b), ST_OK, "%s", st_last_error());
    cr_assert_eq(a.train_loss, b.train_loss);
    cr_assert_eq(a.test_loss, b.test_loss);
    cr_assert_eq(a.test_acc, b.test_acc);
    cr_assert(isfinite(a.test_loss) && a.test_acc > 0.0);
    c.strategy = ST_STRATEGY_SYNTH;
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, &a), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "synth") != NULL, "%s", st_last_error());
    st_dataset_free(&train);
    st_dataset_free(&test);
}

static void check_resnet_reproducible(const st_train_config *c, const char *what)
{
    st_dataset train, test;
    make_data(11, &train, &test);
    st_epoch_record a, b;
    cr_assert_eq(st_train_run(c, &train, &test, NULL, &a), ST_OK, "%s: %s", what, st_last_error());
    cr_assert_eq(st_train_run(c, &train, &test, NULL, &b), ST_OK, "%s: %s", what, st_last_error());
    cr_log_info("resnet %s: test_acc %.4f, %.0f B/worker-step", what, a.test_acc,
                a.comm_bytes_per_worker_step);
    cr_assert_eq(a.train_loss, b.train_loss, "%s", what);
    cr_assert_eq(a.test_loss, b.test_loss, "%s", what);
    cr_assert_eq(a.test_acc, b.test_acc, "%s", what);
    cr_assert(isfinite(a.test_loss) && a.test_acc > 0.35, "%s: test_acc %.4f (4 classes: chance is 0.25)", what,
              a.test_acc);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* A ResNet with blocks to share (depth 2: two stage-0 blocks, one in each
 * later stage; 8, 16, 32 channels) that learns in 24 steps. */
static st_train_config subnet_resnet_config(int workers, st_strategy strategy)
{
    st_train_config c = resnet_train_config(workers);
    c.model.depth = 2;
    c.model.width = 8;
    c.optim.lr = 0.01f;
    c.steps = 24;
    c.strategy = strategy;
    c.sdp.coverage = 0.5;
    return c;
}

/* SDP with blocks held by 2 of 4 workers, forward and backward masking. */
Test(resnet, sdp_blocks_are_reproducible, .timeout = 180)
{
    st_train_config c = subnet_resnet_config(4, ST_STRATEGY_SDP);
    c.sdp.subnet = ST_SUBNET_BLOCK;
    check_resnet_reproducible(&c, "sdp block forward");
    /* the full model's recalibrated statistics change its evaluation,
     * never the training */
    st_train_config raw = c;
    raw.bn_calibration = 0;
    st_dataset train, test;
    make_data(11, &train, &test);
    st_epoch_record a, b;
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, &a), ST_OK, "%s", st_last_error());
    cr_assert_eq(st_train_run(&raw, &train, &test, NULL, &b), ST_OK, "%s", st_last_error());
    cr_assert_eq(a.train_loss, b.train_loss);
    cr_assert_neq(a.test_loss, b.test_loss);
    st_dataset_free(&train);
    st_dataset_free(&test);
    st_train_config redrawn = c;   /* running statistics meet at each rebuild */
    redrawn.sdp.resample = 8;
    check_resnet_reproducible(&redrawn, "sdp block forward, masks redrawn every 8 steps");
    c.sdp.masking = ST_MASKING_BACKWARD;
    check_resnet_reproducible(&c, "sdp block backward");
}

/* SDP with channel groups of 4 (stages of 8, 16 and 32 channels: 2, 4
 * and 8 units, each dealt evenly), each held by 2 of 4 workers. */
Test(resnet, sdp_channel_groups_are_reproducible, .timeout = 180)
{
    st_train_config c = subnet_resnet_config(4, ST_STRATEGY_SDP);
    c.sdp.subnet = ST_SUBNET_NEURON;
    c.neuron_group = 4;
    check_resnet_reproducible(&c, "sdp neuron forward");
    c.sdp.masking = ST_MASKING_BACKWARD;
    check_resnet_reproducible(&c, "sdp neuron backward");
}

/* ResIST: each stage's blocks partitioned over 2 workers, rounds of 3
 * steps. */
Test(resnet, ist_blocks_are_reproducible, .timeout = 180)
{
    st_train_config c = subnet_resnet_config(2, ST_STRATEGY_IST);
    c.ist.local_steps = 3;
    check_resnet_reproducible(&c, "ist blocks");
}

/* ------------------------------------------------------------ transformers */

/* Word-like text (a skewed, repetitive byte stream: learnable in a few
 * hundred steps) as a text set of windows of `context` bytes. */
static st_text gpt_text(size_t n)
{
    static const char *w[] = { "the ", "of ", "and ", "a ", "to ", "in ", "is ", "word ",
                               "dictionary ", "noun. ", "verb; ", "\n" };
    uint8_t *p = malloc(n);
    cr_assert_not_null(p);
    uint32_t s = 12345;
    for (size_t i = 0; i < n;) {
        s = s * 1664525u + 1013904223u;
        const char *x = w[(s >> 24) % 12];
        for (size_t k = 0; x[k] && i < n; k++)
            p[i++] = (uint8_t)x[k];
    }
    return (st_text){ p, n, n - n / 10 };
}

static st_train_config gpt_train_config(int workers, uint64_t steps)
{
    st_train_config c = st_train_config_default();
    c.model = (st_model_config){ .kind = st_model_kind_named("gpt"), .depth = 2, .width = 32,
                                 .heads = 2, .context = 16, .in_dim = 16, .n_classes = 256,
                                 .activation = ST_ACT_GELU };
    c.workers = workers;
    c.batch = 8;
    c.steps = steps;
    c.epochs = 0;
    c.optim.lr = 0.003f;
    c.neuron_group = 16;   /* one head */
    return c;
}

/* dp on text: below the unigram baseline by a clear margin, per-token
 * losses, and bitwise reproducible. */
Test(gpt, learns_text_below_the_unigram_baseline_reproducibly, .timeout = 120)
{
    st_text t = gpt_text(60000);
    st_dataset train, test;
    cr_assert_eq(st_text_dataset(&t, 16, 1, 0, 4096, &train, &test), ST_OK, "%s",
                 st_last_error());
    st_train_config c = gpt_train_config(2, 150);
    recorder *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    st_epoch_record fa = train_recorded(&c, &train, &test, a);
    st_epoch_record fb = train_recorded(&c, &train, &test, b);
    const double unigram = st_text_unigram_bpb(&t), bpb = fa.test_loss / M_LN2;
    cr_log_info("gpt d2 w32 T16, 150 steps: %.3f bits per byte, unigram %.3f", bpb, unigram);
    cr_assert_lt(bpb, unigram - 0.5, "%.3f bits per byte against the unigram's %.3f", bpb,
                 unigram);
    cr_assert_eq(fa.tokens_per_sample, 16);
    cr_assert_eq(a->steps, b->steps);
    cr_assert_eq(memcmp(a->losses, b->losses, a->steps * sizeof(float)), 0);
    cr_assert_eq(fa.test_loss, fb.test_loss);
    free(a);
    free(b);
    st_dataset_free(&train);
    st_dataset_free(&test);
    free(t.bytes);
}

/* Every strategy trains a transformer: blocks and heads (forward and
 * backward masking), ResIST over blocks; each run is reproducible and
 * learns, and every parameter of the full model is trained. */
Test(gpt, every_strategy_trains_every_parameter, .timeout = 240)
{
    st_text t = gpt_text(60000);
    st_dataset train, test;
    cr_assert_eq(st_text_dataset(&t, 16, 1, 0, 2048, &train, &test), ST_OK);
    const struct { st_strategy strategy; st_subnet_kind subnet; st_masking masking; } v[] = {
        { ST_STRATEGY_SDP, ST_SUBNET_BLOCK, ST_MASKING_FORWARD },
        { ST_STRATEGY_SDP, ST_SUBNET_BLOCK, ST_MASKING_BACKWARD },
        { ST_STRATEGY_SDP, ST_SUBNET_NEURON, ST_MASKING_FORWARD },
        { ST_STRATEGY_SDP, ST_SUBNET_NEURON, ST_MASKING_BACKWARD },
        { ST_STRATEGY_IST, ST_SUBNET_BLOCK, ST_MASKING_FORWARD },
    };
    const double unigram = st_text_unigram_bpb(&t);
    for (size_t k = 0; k < sizeof v / sizeof *v; k++) {
        st_train_config c = gpt_train_config(2, 60);
        c.strategy = v[k].strategy;
        c.sdp.subnet = v[k].subnet;
        c.sdp.masking = v[k].masking;
        c.ist.local_steps = 10;
        params_out o = { 0 };
        st_train_callbacks cb = { .on_params = keep_params, .user = &o };
        st_epoch_record f;
        cr_assert_eq(st_train_run(&c, &train, &test, &cb, &f), ST_OK, "variant %zu: %s", k,
                     st_last_error());
        cr_assert_eq(o.n, st_model_config_param_count(&c.model));
        float *init = malloc(o.n * sizeof *init);
        cr_assert_eq(st_model_init_full_range(&c.model, c.seed, 0, o.n, init), ST_OK);
        size_t same = 0;
        for (size_t i = 0; i < o.n; i++)
            same += o.p[i] == init[i];
        cr_assert_eq(same, 0, "variant %zu: %zu parameters never moved", k, same);
        cr_assert_lt(f.test_loss / M_LN2, unigram, "variant %zu: %.3f bits per byte", k,
                     f.test_loss / M_LN2);
        st_epoch_record g;
        cr_assert_eq(st_train_run(&c, &train, &test, NULL, &g), ST_OK);
        cr_assert_eq(f.test_loss, g.test_loss, "variant %zu is reproducible", k);
        free(init);
        free(o.p);
    }
    st_dataset_free(&train);
    st_dataset_free(&test);
    free(t.bytes);
}

Test(gpt, a_step_makes_no_heap_allocation, .timeout = 60)
{
    HEAPWATCH_SKIP_IF_OFF();
    st_text t = gpt_text(30000);
    st_dataset train, test;
    cr_assert_eq(st_text_dataset(&t, 16, 1, 0, 1024, &train, &test), ST_OK);
    st_train_config c = gpt_train_config(2, 40);
    assert_no_heap_call_on(&c, &train, &test, "gpt data parallelism");
    st_dataset_free(&train);
    st_dataset_free(&test);
    free(t.bytes);
}

/* ------------------------------------------------------------ --init */

/* A run started from another run's final weights (init_params) with a
 * negligible learning rate evaluates as that run ended, whatever the
 * strategy: every worker's subnetwork and every shard owner start from
 * those weights, not from the seed's. */
Test(init, runs_start_from_the_given_weights, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = dp_config(2, 32, 60);
    params_out o = { 0 };
    st_train_callbacks cb = { .on_params = keep_params, .user = &o };
    st_epoch_record first;
    cr_assert_eq(st_train_run(&c, &train, &test, &cb, &first), ST_OK, "%s", st_last_error());
    const st_strategy strategies[3] = { ST_STRATEGY_DP, ST_STRATEGY_SDP, ST_STRATEGY_SDP };
    const st_masking masking[3] = { ST_MASKING_FORWARD, ST_MASKING_FORWARD, ST_MASKING_BACKWARD };
    for (int k = 0; k < 3; k++) {
        st_train_config d = c;
        d.strategy = strategies[k];
        d.sdp.masking = masking[k];
        d.steps = 1;
        d.optim.lr = 1e-12f;
        d.seed = 99;   /* another seed: its initial values must not be used */
        d.init_params = o.p;
        st_epoch_record f;
        cr_assert_eq(st_train_run(&d, &train, &test, NULL, &f), ST_OK, "%s", st_last_error());
        cr_assert_float_eq(f.test_loss, first.test_loss, 1e-6 * first.test_loss,
                           "strategy %d: %.9f, the weights' %.9f", k, f.test_loss,
                           first.test_loss);
    }
    st_train_config s = c;
    s.strategy = ST_STRATEGY_SYNTH;
    s.init_params = o.p;
    cr_assert_eq(st_train_config_check(&s), ST_ERR_INVALID);
    free(o.p);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* ------------------------------------------------------------ exact mechanisms */

/* What the accuracy bars above check only end to end, checked by value
 * here: the branch scales of subnetworks (training: N / k for sdp, N for
 * ist of an mlp; evaluation: 1 / N for ResIST), the alignment report, and
 * the communication counters.  An accuracy bar also depends on the
 * kernels the CPU gets; these do not: they compare the trainer's workers
 * with models the test builds and scales by hand, on the same batch. */

/* The layers a branch scale multiplies, by the names of their segments:
 * a residual block's closing layer (weight and bias), and the layers of
 * an mlp that read a subset of a width layer (fc1.. and the head; their
 * weights only: every worker holds the bias). */
static int closes_a_block(const char *name)
{
    return strncmp(name, "block", 5) == 0 && strstr(name, ".fc2.") != NULL;
}

static int reads_a_width_subset(const char *name)
{
    return (strcmp(name, "head.weight") == 0 ||
            (strncmp(name, "fc", 2) == 0 && strncmp(name, "fc0.", 4) != 0)) &&
           strstr(name, ".weight") != NULL;
}

/* The first batch of d into m (rows 0 .. B - 1 as stored). */
static void first_batch(st_model *m, const st_dataset *d)
{
    const int B = st_model_batch(m);
    uint32_t *idx = malloc((size_t)B * sizeof *idx);
    for (int i = 0; i < B; i++)
        idx[i] = (uint32_t)i;
    st_dataset_gather(d, idx, (size_t)B, st_model_input(m), st_model_labels(m));
    free(idx);
}

/* A model of hcfg (a subnetwork without a branch scale) with m's
 * parameters, those of the segments `scaled` names multiplied by
 * `factor` here; returns the largest difference between its logits and
 * m's on d's first batch, relative to the largest logit.  The two must
 * be the same subnetwork: the same parameters in the same places of the
 * full layout. */
static double hand_scaled_gap(st_model *m, const st_model_config *hcfg, const st_dataset *d,
                              int (*scaled)(const char *), float factor)
{
    st_arena arena;
    st_arena_init(&arena, "hand", NULL, 0);
    st_model *hand;
    cr_assert_eq(st_model_create(hcfg, st_model_batch(m), &arena, &hand), ST_OK, "%s",
                 st_last_error());
    const size_t P = st_model_param_count(m);
    cr_assert_eq(st_model_param_count(hand), P, "the hand-built subnetwork is another one");
    int nm = st_model_full_ranges(m, NULL, NULL, 0), nh = st_model_full_ranges(hand, NULL, NULL, 0);
    cr_assert(nm > 0 && nm == nh, "the hand-built subnetwork holds other parameters");
    st_range *rm = malloc(2 * (size_t)nm * sizeof *rm), *rh = rm + nm;
    size_t *lm = malloc(2 * (size_t)nm * sizeof *lm), *lh = lm + nm;
    st_model_full_ranges(m, rm, lm, nm);
    st_model_full_ranges(hand, rh, lh, nm);
    cr_assert(memcmp(rm, rh, (size_t)nm * sizeof *rm) == 0 &&
              memcmp(lm, lh, (size_t)nm * sizeof *lm) == 0,
              "the hand-built subnetwork holds other parameters");
    free(rm);
    free(lm);
    float *p = st_model_params(hand);
    memcpy(p, st_model_params(m), P * sizeof *p);
    int n_segs, n_scaled = 0;
    const st_param_segment *segs = st_model_segments(hand, &n_segs);
    for (int s = 0; s < n_segs; s++) {
        if (!scaled(segs[s].name))
            continue;
        n_scaled++;
        for (size_t i = 0; i < segs[s].count; i++)
            p[segs[s].offset + i] *= factor;
    }
    cr_assert_gt(n_scaled, 0, "no layer to scale");
    float loss;
    first_batch(m, d);
    first_batch(hand, d);
    cr_assert_eq(st_model_forward_backward(m, &loss), ST_OK, "%s", st_last_error());
    cr_assert_eq(st_model_forward_backward(hand, &loss), ST_OK, "%s", st_last_error());
    const size_t n = (size_t)st_model_batch(m) * hcfg->n_classes;
    const float *a = st_model_logits(m), *b = st_model_logits(hand);
    double gap = 0.0, top = 0.0;
    for (size_t i = 0; i < n; i++) {
        gap = fmax(gap, fabs((double)a[i] - b[i]));
        top = fmax(top, fabs((double)b[i]));
    }
    st_model_destroy(hand);
    st_arena_release(&arena);
    return gap / top;
}

/* Agreement of a forward pass with one scaled by hand: float products in
 * another order (the trainer's primitives, fused scales) only.  Measured
 * about 1e-7; the scale left out moves the logits by 1e-2 or more. */
#define HAND_SCALE_RTOL 1e-5

static st_trainer *make_trainer(const st_train_config *c, const st_dataset *train,
                                const st_dataset *test)
{
    st_trainer *t;
    cr_assert_eq(st_trainer_create(c, train, test, &t), ST_OK, "%s", st_last_error());
    return t;
}

/* sdp, blocks, forward masking, 4 workers at coverage 1/2 (k = 2): each
 * worker's subnetwork is its blocks with every branch scaled by N / k =
 * 2 (the default for resmlp).  Its forward pass is that of the same
 * blocks unscaled with each block's closing layer doubled by hand, after
 * a few steps too. */
Test(scale, sdp_branches_are_scaled_by_workers_over_holders, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = sdp_config(4, 0.5, 20);
    const int N = c.workers, k = (int)(c.sdp.coverage * N + 0.5);
    st_trainer *t = make_trainer(&c, &train, &test);
    st_assignment a;
    cr_assert_eq(st_assignment_make(N, c.model.depth, k, c.seed, 0, &a), ST_OK);
    for (int pass = 0; pass < 2; pass++) {
        for (int w = 0; w < N; w++) {
            int ids[16], n = 0;
            for (int g = 0; g < c.model.depth; g++)
                if (st_assignment_holds(&a, w, g))
                    ids[n++] = g;
            st_model_config h = c.model;
            h.subnet.groups = ids;
            h.subnet.n_groups = n;
            st_model *m = st_trainer_model(t, w);
            double gap = hand_scaled_gap(m, &h, &train, closes_a_block, (float)N / (float)k);
            cr_assert_leq(gap, HAND_SCALE_RTOL, "worker %d: its branches are not scaled by "
                          "N / k = %d / %d (logits %.3g apart)", w, N, k, gap);
            double unscaled = hand_scaled_gap(m, &h, &train, closes_a_block, 1.0f);
            cr_assert_gt(unscaled, 100 * HAND_SCALE_RTOL, "worker %d: the scale shows", w);
        }
        cr_assert_eq(st_trainer_step(t, 5, NULL), ST_OK, "%s", st_last_error());
    }
    st_assignment_free(&a);
    st_trainer_destroy(t);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* ist of an mlp, 2 workers: each holds half of every hidden layer's
 * neuron groups, and what reads a half (fc1, the head) is scaled by N =
 * 2 in training (the default for mlp), like inverted dropout. */
Test(scale, ist_mlp_training_scales_what_reads_a_part_by_n, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = ist_config(2, 10, 20);
    c.model.kind = st_model_kind_named("mlp");
    c.model.depth = 2;
    c.neuron_group = 4;
    const int N = c.workers, L = c.model.depth, G = c.model.width / c.neuron_group;
    st_trainer *t = make_trainer(&c, &train, &test);
    int sizes[2] = { G, G };
    st_assignment a;
    cr_assert_eq(st_assignment_make_sections(N, L, sizes, 1, c.seed, 0, &a), ST_OK);
    for (int w = 0; w < N; w++) {
        int count[2] = { 0, 0 }, kept[64], n = 0;
        for (int l = 0; l < L; l++)
            for (int j = 0; j < G; j++)
                if (st_assignment_holds(&a, w, l * G + j)) {
                    kept[n++] = j;
                    count[l]++;
                }
        st_model_config h = c.model;
        h.subnet.unit_size = c.neuron_group;
        h.subnet.width_count = count;
        h.subnet.width_kept = kept;
        st_model *m = st_trainer_model(t, w);
        double gap = hand_scaled_gap(m, &h, &train, reads_a_width_subset, (float)N);
        cr_assert_leq(gap, HAND_SCALE_RTOL, "worker %d: what reads a part is not scaled by "
                      "N = %d (logits %.3g apart)", w, N, gap);
        double unscaled = hand_scaled_gap(m, &h, &train, reads_a_width_subset, 1.0f);
        cr_assert_gt(unscaled, 100 * HAND_SCALE_RTOL, "worker %d: the scale shows", w);
    }
    st_assignment_free(&a);
    st_trainer_destroy(t);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* The test set's mean loss of m, as an evaluation computes it (stored
 * order, batches of m's batch, the last padded). */
static double test_loss_of(st_model *m, const st_dataset *d)
{
    const int B = st_model_batch(m);
    uint32_t *idx = malloc((size_t)B * sizeof *idx);
    double sum = 0.0;
    int64_t correct = 0;
    for (uint32_t first = 0; first < d->count; first += (uint32_t)B) {
        int rows = d->count - first < (uint32_t)B ? (int)(d->count - first) : B;
        for (int i = 0; i < B; i++)
            idx[i] = first + (uint32_t)(i < rows ? i : 0);
        st_dataset_gather(d, idx, (size_t)B, st_model_input(m), st_model_labels(m));
        cr_assert_eq(st_model_evaluate(m, rows, &sum, &correct), ST_OK, "%s", st_last_error());
    }
    free(idx);
    return sum / d->count;
}

/* ResIST evaluates the full model with every block's branch scaled by
 * 1 / N (each block trained by 1 of N workers): the trainer's evaluation
 * is that of the full model with each block's closing layer divided by N
 * by hand, after a round and at the start. */
Test(scale, ist_evaluation_scales_every_branch_by_one_over_n, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = ist_config(2, 5, 20);
    const int N = c.workers;
    st_trainer *t = make_trainer(&c, &train, &test);
    const size_t P = st_model_config_param_count(&c.model);
    float *full = malloc(P * sizeof *full);
    st_arena arena;
    st_arena_init(&arena, "hand", NULL, 0);
    st_model *hand;
    cr_assert_eq(st_model_create(&c.model, c.batch, &arena, &hand), ST_OK, "%s",
                 st_last_error());
    int n_segs;
    const st_param_segment *segs = st_model_segments(hand, &n_segs);
    for (int pass = 0; pass < 2; pass++) {
        double loss, acc;
        cr_assert_eq(st_trainer_evaluate(t, &loss, &acc), ST_OK, "%s", st_last_error());
        cr_assert_eq(st_trainer_params(t, full, P), ST_OK, "%s", st_last_error());
        double by_hand[2];
        for (int scaled = 0; scaled < 2; scaled++) {
            float *p = st_model_params(hand);
            memcpy(p, full, P * sizeof *p);
            for (int s = 0; scaled && s < n_segs; s++)
                if (closes_a_block(segs[s].name))
                    for (size_t i = 0; i < segs[s].count; i++)
                        p[segs[s].offset + i] *= 1.0f / (float)N;
            by_hand[scaled] = test_loss_of(hand, &test);
        }
        cr_log_info("after %d rounds: ist evaluates %.9f; by hand, branches / %d: %.9f, "
                    "unscaled: %.9f", pass, loss, N, by_hand[1], by_hand[0]);
        cr_assert_float_eq(loss, by_hand[1], HAND_SCALE_RTOL * by_hand[1],
                           "ist evaluates %.9f, the full model with branches / %d %.9f", loss, N,
                           by_hand[1]);
        cr_assert_gt(fabs(by_hand[0] - by_hand[1]), 100 * HAND_SCALE_RTOL * by_hand[1],
                     "the scale shows");
        cr_assert_eq(st_trainer_step(t, c.ist.local_steps, NULL), ST_OK, "%s", st_last_error());
    }
    st_model_destroy(hand);
    st_arena_release(&arena);
    free(full);
    st_trainer_destroy(t);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* The alignment report, against the cosine computed here: at step 1
 * every worker's subnetwork gradient (its own model, the batch of its
 * rows of epoch 1's order) and the full model's gradient with the
 * initial weights on the same batch, over the coordinates the worker
 * holds; the report's mean and minimum are over the 4 workers. */
Test(sdp, alignment_report_is_the_cosine_of_the_two_gradients, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = sdp_config(4, 0.5, 20);
    c.sdp.align_every = 1;
    const int N = c.workers, B = c.batch;
    st_trainer *t = make_trainer(&c, &train, &test);
    uint32_t *order = malloc(train.count * sizeof *order);
    st_epoch_order(c.seed, 0, order, train.count);
    st_arena arena;
    st_arena_init(&arena, "full", NULL, 0);
    st_model *full;
    cr_assert_eq(st_model_create(&c.model, B, &arena, &full), ST_OK, "%s", st_last_error());
    st_model_init_params(full, c.seed);
    double sum = 0.0, least = 2.0;
    for (int w = 0; w < N; w++) {
        st_model *m = st_trainer_model(t, w);
        float loss;
        const uint32_t *rows = order + (size_t)w * B;   /* step 1: rows [w B, (w + 1) B) */
        st_dataset_gather_train(&train, 0, rows, (size_t)B, st_model_input(m), st_model_labels(m));
        cr_assert_eq(st_model_forward_backward(m, &loss), ST_OK, "%s", st_last_error());
        st_dataset_gather_train(&train, 0, rows, (size_t)B, st_model_input(full),
                                st_model_labels(full));
        cr_assert_eq(st_model_forward_backward(full, &loss), ST_OK, "%s", st_last_error());
        int n = st_model_full_grad_ranges(m, NULL, NULL, 0);
        cr_assert_gt(n, 1, "a subnetwork's gradient is in pieces of the full one");
        st_range *r = malloc((size_t)n * sizeof *r);
        size_t *local = malloc((size_t)n * sizeof *local);
        st_model_full_grad_ranges(m, r, local, n);
        const float *g = st_model_grads(m), *f = st_model_grads(full);
        double dot = 0.0, gg = 0.0, ff = 0.0;
        for (int i = 0; i < n; i++)
            for (size_t j = 0; j < r[i].end - r[i].begin; j++) {
                double a = g[local[i] + j], b = f[r[i].begin + j];
                dot += a * b;
                gg += a * a;
                ff += b * b;
            }
        free(r);
        free(local);
        double cosine = dot / sqrt(gg * ff);
        sum += cosine;
        least = fmin(least, cosine);
    }
    cr_assert_eq(st_trainer_step(t, 1, NULL), ST_OK, "%s", st_last_error());
    st_epoch_record rec;
    cr_assert_eq(st_trainer_metrics(t, &rec), ST_OK, "%s", st_last_error());
    cr_log_info("alignment at step 1: reported mean %.9f min %.9f; computed %.9f, %.9f",
                rec.align_mean, rec.align_min, sum / N, least);
    cr_assert_eq(rec.align_measured, N);
    cr_assert_float_eq(rec.align_mean, sum / N, 1e-5, "reported mean %.9f, the cosines' %.9f",
                       rec.align_mean, sum / N);
    cr_assert_float_eq(rec.align_min, least, 1e-5, "reported min %.9f, the cosines' %.9f",
                       rec.align_min, least);
    cr_assert_lt(sum / N, 0.9999, "below full coverage the gradients differ");
    st_model_destroy(full);
    st_arena_release(&arena);
    free(order);
    st_trainer_destroy(t);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* Holders of every element of the full layout (n_params), from the
 * workers' models as the trainer has them now, and what each worker holds
 * (held[w] elements, the parameters of its model). */
static uint16_t *count_holders(st_trainer *t, size_t n_params, size_t *held)
{
    uint16_t *holders = calloc(n_params, sizeof *holders);
    for (int w = 0; w < st_trainer_workers(t); w++) {
        st_model *m = st_trainer_model(t, w);
        int n = st_model_full_ranges(m, NULL, NULL, 0);
        st_range *r = malloc((size_t)n * sizeof *r);
        size_t *local = malloc((size_t)n * sizeof *local);
        st_model_full_ranges(m, r, local, n);
        held[w] = 0;
        for (int i = 0; i < n; i++) {
            for (size_t e = r[i].begin; e < r[i].end; e++)
                holders[e]++;
            held[w] += r[i].end - r[i].begin;
        }
        cr_assert_eq(held[w], st_model_param_count(m));
        free(r);
        free(local);
    }
    return holders;
}

/* A step's bytes of worker w in a one-level engine: as the owner of its
 * shard, each element's holders' gradients read and the mean written
 * (elements someone holds); with the all-gather, every element w holds
 * read from its owner and written into w's vector. */
static double engine_bytes(const uint16_t *holders, size_t n_params, int n, int w, size_t held,
                           int gather)
{
    st_range s = shard_of(n_params, n, w);
    double b = 0.0;
    for (size_t e = s.begin; e < s.end; e++)
        b += 4.0 * (holders[e] + (holders[e] > 0));
    return b + (gather ? 8.0 * (double)held : 0.0);
}

/* sdp, blocks at coverage 1/2 over 4 workers: the record's bytes per
 * step are the busiest worker's, from the holders of its shard and what
 * it holds (every worker has the stem, the final norm and the head; each
 * block is held by 2). */
Test(comm_counters, sdp_bytes_per_step_follow_the_holders, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = sdp_config(4, 0.5, 20);
    char pu[32];
    one_pu_cpuset(pu, sizeof pu);
    c.cpuset = pu;
    st_trainer *t = make_trainer(&c, &train, &test);
    cr_assert_eq(st_trainer_step(t, 3, NULL), ST_OK, "%s", st_last_error());
    st_epoch_record rec;
    cr_assert_eq(st_trainer_metrics(t, &rec), ST_OK, "%s", st_last_error());
    const size_t P = st_model_config_param_count(&c.model);
    size_t held[4];
    uint16_t *holders = count_holders(t, P, held);
    double busiest = 0.0;
    for (int w = 0; w < 4; w++)
        busiest = fmax(busiest, engine_bytes(holders, P, 4, w, held[w], 1));
    cr_assert_eq(rec.comm_bytes_per_worker_step, busiest, "%.0f bytes a step, the holders "
                 "make %.0f", rec.comm_bytes_per_worker_step, busiest);
    cr_assert_eq(rec.comm_bytes_per_worker_round, 0.0, "no rounds in sdp");
    free(holders);
    st_trainer_destroy(t);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* Whether workers 0 and 1 have the same values of every parameter both
 * hold (the layers every ResIST subnetwork shares): *both of them. */
static size_t shared_equal(st_trainer *t, size_t n_params, size_t *both)
{
    float *v[2];
    uint8_t *has[2];
    for (int w = 0; w < 2; w++) {
        st_model *m = st_trainer_model(t, w);
        v[w] = malloc(n_params * sizeof *v[w]);
        has[w] = calloc(n_params, 1);
        int n = st_model_full_ranges(m, NULL, NULL, 0);
        st_range *r = malloc((size_t)n * sizeof *r);
        size_t *local = malloc((size_t)n * sizeof *local);
        st_model_full_ranges(m, r, local, n);
        for (int i = 0; i < n; i++)
            for (size_t e = r[i].begin; e < r[i].end; e++) {
                v[w][e] = st_model_params(m)[local[i] + e - r[i].begin];
                has[w][e] = 1;
            }
        free(r);
        free(local);
    }
    size_t equal = 0;
    *both = 0;
    for (size_t e = 0; e < n_params; e++)
        if (has[0][e] && has[1][e]) {
            (*both)++;
            equal += memcmp(&v[0][e], &v[1][e], sizeof(float)) == 0;
        }
    for (int w = 0; w < 2; w++) {
        free(v[w]);
        free(has[w]);
    }
    return equal;
}

/* ist communicates once a round, and its record says how much: 2 workers,
 * rounds of R = 5 steps.  Between round ends the workers' copies of the
 * shared layers drift apart (nobody communicates); right after one they
 * are the same (the average, loaded back).  The bytes of a round are the
 * busiest worker's reduce-scatter of the parameters (no all-gather: the
 * next subnetwork is loaded from the owners' shards, its parameters read
 * and written once), and the record's bytes per step are those / R. */
Test(comm_counters, ist_communicates_once_a_round, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = ist_config(2, 5, 20);
    char pu[32];
    one_pu_cpuset(pu, sizeof pu);
    c.cpuset = pu;
    const uint64_t R = c.ist.local_steps;
    const size_t P = st_model_config_param_count(&c.model);
    st_trainer *t = make_trainer(&c, &train, &test);
    for (uint64_t step = 1; step <= 2 * R; step++) {
        cr_assert_eq(st_trainer_step(t, 1, NULL), ST_OK, "%s", st_last_error());
        size_t both, equal = shared_equal(t, P, &both);
        cr_assert_gt(both, 0, "the stem, final norm and head are shared");
        if (step % R == 0)
            cr_assert_eq(equal, both, "step %llu ends a round: the shared layers are averaged "
                         "(%zu of %zu equal)", (unsigned long long)step, equal, both);
        else
            cr_assert_lt(equal, both, "step %llu is inside a round: no communication, the "
                         "shared layers differ (%zu of %zu equal)", (unsigned long long)step,
                         equal, both);
    }
    st_epoch_record rec;
    cr_assert_eq(st_trainer_metrics(t, &rec), ST_OK, "%s", st_last_error());
    size_t held[2];
    uint16_t *holders = count_holders(t, P, held);
    double round = 0.0;
    for (int w = 0; w < 2; w++)
        round = fmax(round, engine_bytes(holders, P, 2, w, held[w], 0) + 8.0 * (double)held[w]);
    cr_assert_eq(rec.comm_bytes_per_worker_step, round / (double)R, "%.1f bytes a step, the "
                 "holders make %.0f a round of %llu steps", rec.comm_bytes_per_worker_step, round,
                 (unsigned long long)R);
    cr_assert_float_eq(rec.comm_bytes_per_worker_round, round, 1e-9 * round, "%.0f bytes a "
                       "round, the holders make %.0f", rec.comm_bytes_per_worker_round, round);
    free(holders);
    st_trainer_destroy(t);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

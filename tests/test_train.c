/*
 * tests/test_train.c — the training loop on one worker: it learns, it is
 * deterministic, its records say what they should, it refuses bad
 * configurations; the strategy table; the metrics file.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include <subtrain/subtrain.h>
#include "json_check.h"
#include "train_check.h"

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
            case ST_OPTION_FLAG: in.name = 1; break;
            case ST_OPTION_TEXT: {
                /* its default's text read back by its own parser */
                char text[128], why[192];
                cr_assert_eq(d->get(&c, &out), 1, "--%s", d->name);
                d->print(&out, text, sizeof text);
                cr_assert_eq(d->parse(text, &in, why, sizeof why), 0, "--%s %s: %s", d->name,
                             text, why);
                memset(&out, 0, sizeof out);
                break;
            }
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
    cr_assert_not(st_json_valid("{\"a\":1,\"a\":2}"));
    cr_assert(st_json_valid("{\"seed\":18446744073709551615}"));
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

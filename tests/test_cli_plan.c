/*
 * tests/test_cli_plan.c — `subtrain plan` and `subtrain calibrate` as a
 * user runs them: the plan's memory equal to the byte to what a run of
 * the same options reports, for every strategy it sizes, the four model
 * families and both precisions; the budgets and their errors; the
 * calibration file.
 */
#include "cli_run.h"
#include "model_check.h"

#include <jansson.h>
#include <unistd.h>

#include <subtrain/model.h>
#include <subtrain/world.h>

/* A calibration file in format 2 (calibration.h): every matmul shape of
 * type fp32 at `fp32` GFLOP/s, of bf16 at `bf16`, and the other rates. */
static void write_calibration(const char *path, double fp32, double bf16)
{
    static const char *const ops[] = { "relu", "gelu", "layernorm", "softmax", "logsoftmax",
                                       "batchnorm" };
    static const char *const sizes[] = { "16k", "256k", "4m", "64m" };
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "format 2\nmachine test\nisa none\ncpus 2\ncall_us 1\nchain_fp32 1.2\n"
               "chain_bf16 1.1\nchain_all_fp32 1.1\nchain_all_bf16 1.2\nattention_fp32 1.3\n"
               "attention_bf16 1.4\n");
    for (int t = 0; t < 2; t++)
        for (int o = 0; o < 3; o++)
            for (int i = 16; i <= 1024; i *= 4)
                for (int j = 16; j <= 1024; j *= 4)
                    for (int k = 16; k <= 1024; k *= 4)
                        fprintf(f, "matmul_%s_%s_m%d_n%d_k%d_gflops %g\n", t ? "bf16" : "fp32",
                                (const char *[]){ "nn", "nt", "tn" }[o], i, j, k,
                                t ? bf16 : fp32);
    fprintf(f, "conv_fp32_gflops %g\nconv_bf16_gflops %g\n", fp32, bf16);
    for (size_t o = 0; o < sizeof ops / sizeof *ops; o++)
        fprintf(f, "%s_fwd_ns 0.5\n%s_bwd_ns 1\n", ops[o], ops[o]);
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        fprintf(f, "elementwise_%s_gbps %g\n", sizes[i], 8.0 / (double)(i + 1));
    fprintf(f, "update_adamw_fp32_ns 1\nupdate_adamw_bf16_ns 1\nupdate_sgd_fp32_ns 1\n"
               "update_sgd_bf16_ns 1\n");
    fprintf(f, "reduce_gbps 2\nstream_triad_gbps 2\nstream_triad_all_gbps 3\n");
    fclose(f);
}

/* The last record of a metrics file: its per-kind peaks and total. */
static void record_memory(const char *path, json_int_t *kinds, int n_kinds, json_int_t *total)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "no metrics file %s", path);
    char line[16384], last[16384] = "";
    while (fgets(line, sizeof line, f))
        if (line[0] == '{')
            strcpy(last, line);
    fclose(f);
    json_error_t e;
    json_t *rec = json_loads(last, 0, &e);
    cr_assert_not_null(rec, "the last record is not JSON: %s", e.text);
    json_t *by = json_object_get(rec, "peak_bytes_by_kind");
    for (int k = 0; k < n_kinds; k++)
        kinds[k] = json_integer_value(json_object_get(by, st_mem_kind_name((st_mem_kind)k)));
    *total = json_integer_value(json_object_get(rec, "peak_bytes"));
    json_decref(rec);
}

/* A synth run's metrics: its final record reports the memory of phase
 * `phase` ("segments" or "recovery": the last record of it), not the
 * other's, which differs. */
static void expect_final_memory_of_phase(const char *path, const char *phase)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "no metrics file %s", path);
    char line[16384];
    json_int_t final = -1, same = -1, other = -1;
    while (fgets(line, sizeof line, f)) {
        json_t *rec = json_loads(line, 0, NULL);
        const char *ph = json_string_value(json_object_get(json_object_get(rec, "synth"),
                                                           "phase"));
        const json_int_t total = json_integer_value(json_object_get(rec, "peak_bytes"));
        if (ph && json_is_true(json_object_get(rec, "final")))
            final = total;
        else if (ph)
            *(strcmp(ph, phase) == 0 ? &same : &other) = total;
        json_decref(rec);
    }
    fclose(f);
    cr_expect(final == same && same != other && other > 0, "%s: the final record's %lld bytes "
              "are not the %s phase's %lld alone (the other phase's: %lld)", path,
              (long long)final, phase, (long long)same, (long long)other);
}

/* The plan's one row (--as-given), from its JSON on stdout. */
static json_t *plan_row(const run_result *r, const char *what)
{
    json_error_t e;
    json_t *root = json_loads(r->out, 0, &e);
    cr_assert_not_null(root, "%s: the plan's JSON does not parse (%s): %s", what, e.text, r->out);
    json_t *row = json_incref(json_array_get(json_object_get(root, "rows"), 0));
    json_decref(root);
    cr_assert_not_null(row, "%s: no row", what);
    return row;
}

/* A run of `opts` for `length` (--steps N, --epochs N), then the plan of
 * the same options, both with `env` before the program (NULL: none):
 * every kind and the total equal.  synth_phase: the synth phase whose
 * memory the run's final record reports (NULL: not a synth run with
 * recovery epochs). */
static void expect_plan_equals_run_in(const char *env, const char *opts, const char *length,
                                      const char *synth_phase)
{
    static char args[15 * ST_TEST_PATH_MAX];
    char dir[ST_TEST_PATH_MAX], metrics[ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(metrics, dir, "m.jsonl");
    run_result *r = calloc(1, sizeof *r);
    cr_assert_not_null(r);
    snprintf(args, sizeof args, "%s %s --progress none --metrics '%s'", opts, length, metrics);
    run(r, env, args);
    cr_assert_eq(r->status, 0, "the run of %s failed: %s", opts, r->err);
    json_int_t kinds[ST_MEM_KIND_COUNT], total;
    record_memory(metrics, kinds, ST_MEM_KIND_COUNT, &total);
    if (synth_phase)
        expect_final_memory_of_phase(metrics, synth_phase);
    snprintf(args, sizeof args, "plan --as-given --memory-per-worker 1G --json - %s %s", opts,
             length);
    run(r, env, args);
    cr_assert_eq(r->status, 0, "the plan of %s failed: %s", opts, r->err);
    json_t *row = plan_row(r, opts);
    json_t *mem = json_object_get(row, "memory_per_worker");
    for (int k = 0; k < ST_MEM_KIND_COUNT; k++) {
        const char *name = st_mem_kind_name((st_mem_kind)k);
        cr_expect_eq(json_integer_value(json_object_get(mem, name)), kinds[k],
                     "%s: %s: the plan says %lld bytes, the run %lld", opts, name,
                     (long long)json_integer_value(json_object_get(mem, name)),
                     (long long)kinds[k]);
    }
    cr_expect_eq(json_integer_value(json_object_get(mem, "total")), total,
                 "%s: total: the plan says %lld bytes, the run %lld", opts,
                 (long long)json_integer_value(json_object_get(mem, "total")), (long long)total);
    json_decref(row);
    free(r);
    st_test_rmdir(dir);
}

static void expect_plan_equals_run_of(const char *opts, const char *length,
                                      const char *synth_phase)
{
    expect_plan_equals_run_in(NULL, opts, length, synth_phase);
}

/* The same, a run of two steps. */
static void expect_plan_equals_run(const char *opts)
{
    expect_plan_equals_run_of(opts, "--steps 2", NULL);
}

/* 64 training and 16 test images of 8 x 8 in dir (cli_run.h), and the
 * --data option that names them: data that loads in no time, so that a
 * test's cost is its runs. */
static void tiny_images(char *dir, char *opt, size_t n)
{
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    write_idx_set(dir, 64, 16, 4, 3);
    snprintf(opt, n, "--data 'idx:%s:tr-img,tr-lab,te-img,te-lab'", dir);
}

/* A small text for gpt, written once per test. */
static void write_text(const char *path)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    static const char *const words[] = { "the", "word", "of", "a", "noun", "verb", "to" };
    uint32_t h = 7;
    for (int i = 0; i < 3000; i++) {
        h = h * 1103515245u + 12345u;
        fprintf(f, "%s%s", words[(h >> 16) % 7], (h >> 8) % 10 ? " " : ".\n");
    }
    fclose(f);
}

/* Every strategy the plan sizes, on mlp, resmlp, resnet (8 x 8 images)
 * and gpt, in fp32 and bf16, two workers: the units a strategy spreads
 * need models of two blocks at least.  synth (mlp alone) trains whole
 * epochs: its segment epoch, then a recovery epoch of the joined network,
 * which holds the more here. */
Test(plan, memory_equals_the_runs_for_every_strategy_model_and_precision, .timeout = 600)
{
    const st_bf16_support bf16 = st_bf16_probe(NULL);
    char dir[ST_TEST_PATH_MAX], text[ST_TEST_PATH_MAX], data[2 * ST_TEST_PATH_MAX];
    tiny_images(dir, data, sizeof data);
    st_test_path(text, dir, "text.txt");
    write_text(text);
    char models[4][3 * ST_TEST_PATH_MAX];
    snprintf(models[0], sizeof models[0], "--model mlp %s --depth 3 --width 32 --batch 8 "
             "--subnet neuron", data);
    snprintf(models[1], sizeof models[1], "--model resmlp %s --depth 2 --width 32 --batch 8",
             data);
    snprintf(models[2], sizeof models[2], "--model resnet %s --depth 2 --batch 8", data);
    snprintf(models[3], sizeof models[3], "--model gpt --data 'text:%s' --depth 2 --width 16 "
             "--heads 2 --context 8 --batch 4 --val-bytes 256", text);
    static const char *const strategies[] = { "dp", "sdp", "ist", "localsgd", "synth" };
    for (int p = 0; p < 2; p++) {
        if (p == 1 && bf16 == ST_BF16_UNAVAILABLE)
            continue;
        for (int m = 0; m < 4; m++)
            for (int s = 0; s < 5; s++) {
                if (s == 2 && m == 3)
                    continue;   /* ist refuses gpt (doc/ist.md) */
                if (s == 4 && m > 0)
                    continue;   /* synth cuts an mlp (doc/synth.md) */
                static char opts[13 * ST_TEST_PATH_MAX];
                snprintf(opts, sizeof opts, "%s --workers 2 --oversubscribe --strategy %s "
                         "--precision %s%s%s", models[m], strategies[s], p ? "bf16" : "fp32",
                         p && bf16 == ST_BF16_EMULATED ? " --bf16-emulated" : "",
                         s == 4 ? " --recovery-epochs 1" : "");
                if (s == 4)
                    expect_plan_equals_run_of(opts, "--epochs 1", "recovery");
                else
                    expect_plan_equals_run(opts);
            }
    }
    st_test_rmdir(dir);
}

/* Backward masking, accumulation, bf16 optimizer moments, a bf16 master
 * and recomputation change what a worker holds: still the run's figures. */
Test(plan, memory_equals_the_runs_with_masking_accumulation_and_moments, .timeout = 300)
{
    char dir[ST_TEST_PATH_MAX], data[2 * ST_TEST_PATH_MAX], opts[3 * ST_TEST_PATH_MAX];
    tiny_images(dir, data, sizeof data);
    snprintf(opts, sizeof opts, "%s --depth 3 --width 32 --batch 8 --workers 2 --oversubscribe "
             "--strategy sdp --masking backward", data);
    expect_plan_equals_run(opts);
    snprintf(opts, sizeof opts, "%s --depth 2 --width 32 --batch 8 --workers 2 --oversubscribe "
             "--accumulate 2 --optimizer-moments bf16", data);
    expect_plan_equals_run(opts);
    snprintf(opts, sizeof opts, "%s --depth 3 --width 32 --batch 8 --workers 2 --oversubscribe "
             "--recompute blocks", data);
    expect_plan_equals_run(opts);
    const st_bf16_support bf16 = st_bf16_probe(NULL);
    /* a bf16 master: dp's copies, the fp32 vector without the matrices (a
     * domain's, a worker's own, private replicas gathered as bf16); sdp's
     * with backward masking (masks redrawn: shared weights save no shard,
     * private ones theirs); localsgd's; forward-masked subnetworks' bf16
     * master shards (masks redrawn: the shards saved widened) */
    static const char *const layouts[] = {
        "--workers 2", "--workers 1", "--workers 2 --weights private",
        "--workers 2 --strategy sdp --masking backward --resample 2",
        "--workers 2 --strategy sdp --masking backward --weights private --resample 2",
        "--workers 2 --strategy localsgd --local-steps 2",
        "--workers 2 --strategy sdp --resample 2" };
    for (int n = 0; n < 7 && bf16 != ST_BF16_UNAVAILABLE; n++) {
        snprintf(opts, sizeof opts, "%s --depth 2 --width 32 --batch 8 %s --oversubscribe "
                 "--precision bf16%s --optimizer-moments bf16-sr --master-weights bf16-sr", data,
                 layouts[n], bf16 == ST_BF16_EMULATED ? " --bf16-emulated" : "");
        expect_plan_equals_run(opts);
    }
    /* over two domains, a worker each: each domain's copies hold the
     * master, its vector none under them (dp; sdp's rounds save none) */
    for (int n = 0; n < 4 && bf16 != ST_BF16_UNAVAILABLE; n += 3) {
        snprintf(opts, sizeof opts, "%s --depth 2 --width 32 --batch 8 %s --precision bf16%s "
                 "--optimizer-moments bf16-sr --master-weights bf16-sr", data, layouts[n],
                 bf16 == ST_BF16_EMULATED ? " --bf16-emulated" : "");
        expect_plan_equals_run_in(two_domains_env(), opts, "--steps 2", NULL);
    }
    snprintf(opts, sizeof opts, "%s --model resnet --depth 2 --batch 8 --workers 2 "
             "--oversubscribe --strategy sdp --recompute all", data);
    expect_plan_equals_run(opts);
    st_test_rmdir(dir);
}

/* synth's workers hold their segments, then (--recovery-epochs) the
 * joined network on fresh arenas: the plan reports the phase the run's
 * final record reports, the one whose busiest worker holds the more (the
 * segments here: three workers, the first layer's segment trained by
 * two), a run without recovery epochs its segments; groups of one and of
 * more workers, three segments, both precisions.  Under a calibration
 * its time is a segment step's (the busiest worker's), and its samples a
 * second count each sample once, through every segment: batch x workers
 * / segments a step. */
Test(plan, synth_memory_equals_the_runs_in_either_phase, .timeout = 300)
{
    const st_bf16_support bf16 = st_bf16_probe(NULL);
    char dir[ST_TEST_PATH_MAX], data[2 * ST_TEST_PATH_MAX], opts[4 * ST_TEST_PATH_MAX];
    tiny_images(dir, data, sizeof data);
    char cal[ST_TEST_PATH_MAX], args[6 * ST_TEST_PATH_MAX];
    st_test_path(cal, dir, "cal");
    write_calibration(cal, 10.0, 40.0);
    snprintf(args, sizeof args, "plan --as-given --memory-per-worker 1G --calibration '%s' "
             "--json - %s --strategy synth --depth 2 --width 16 --batch 8 --workers 2 "
             "--oversubscribe --epochs 1", cal, data);
    run_result *r = calloc(1, sizeof *r);
    cr_assert_not_null(r);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s: %s", args, r->err);
    json_t *row = plan_row(r, args);
    json_t *step = json_object_get(row, "step_s");
    cr_assert(json_is_real(step) && json_real_value(step) > 0.0, "synth: no step time: %s",
              r->out);
    cr_expect_gt(json_number_value(json_object_get(row, "flops_per_worker_step")), 0.0);
    const double per_s = json_real_value(json_object_get(row, "samples_per_s"));
    const double want = 8.0 * 2.0 / 2.0 / json_real_value(step);
    cr_expect(fabs(per_s - want) <= 1e-9 * want, "synth: %g samples/s, expected %g", per_s,
              want);
    cr_expect_gt(json_integer_value(json_object_get(json_object_get(row, "memory_per_worker"),
                                                    "total")), 0);
    json_decref(row);
    free(r);
    snprintf(opts, sizeof opts, "%s --strategy synth --depth 2 --width 16 --batch 2 --cuts 1 "
             "--workers 3 --oversubscribe --recovery-epochs 1", data);
    expect_plan_equals_run_of(opts, "--epochs 1", "segments");
    snprintf(opts, sizeof opts, "%s --strategy synth --depth 3 --width 32 --batch 8 "
             "--segments 3 --workers 4 --oversubscribe", data);
    expect_plan_equals_run_of(opts, "--epochs 1", NULL);
    if (bf16 != ST_BF16_UNAVAILABLE) {
        snprintf(opts, sizeof opts, "%s --strategy synth --depth 3 --width 32 --batch 8 "
                 "--workers 4 --oversubscribe --recovery-epochs 1 --precision bf16%s", data,
                 bf16 == ST_BF16_EMULATED ? " --bf16-emulated" : "");
        expect_plan_equals_run_of(opts, "--epochs 1", "recovery");
    }
    st_test_rmdir(dir);
}

/* Runs that draw new subnetworks (sdp --resample, ist's rounds) build
 * each draw's on their arenas, and a later draw can need more than the
 * first (the engines' plans, the units a worker holds): the plan lays out
 * every draw the run makes, and equals the records after several, on
 * every model family, both masking kinds, ist's rounds at epoch ends and
 * its kept optimizer state. */
Test(plan, memory_equals_the_runs_over_every_redraw, .timeout = 300)
{
    const st_bf16_support bf16 = st_bf16_probe(NULL);
    char dir[ST_TEST_PATH_MAX], text[ST_TEST_PATH_MAX], data[2 * ST_TEST_PATH_MAX];
    tiny_images(dir, data, sizeof data);
    st_test_path(text, dir, "text.txt");
    write_text(text);
    const struct { const char *opts, *length; int bf16; } cases[] = {
        { "--model mlp --depth 3 --width 32 --batch 8 --workers 3 --strategy sdp --subnet neuron "
          "--neuron-group 4 --resample 2", "--steps 7", 0 },
        { "--model resnet --depth 2 --batch 8 --workers 3 --strategy sdp --resample 1",
          "--steps 4", 0 },
        { "--model gpt --depth 2 --width 16 --heads 2 --context 8 --batch 4 --val-bytes 256 "
          "--workers 2 --strategy sdp --subnet neuron --neuron-group 8 --resample 1", "--steps 4",
          0 },
        { "--model resmlp --depth 5 --width 32 --batch 8 --workers 3 --strategy sdp "
          "--masking backward --resample 1", "--steps 4", 0 },
        { "--model resmlp --depth 4 --width 32 --batch 8 --workers 3 --strategy ist "
          "--local-steps 1", "--steps 4", 0 },
        { "--model mlp --depth 3 --width 32 --batch 8 --workers 2 --strategy ist "
          "--neuron-group 4 --local-steps 3", "--epochs 2", 0 },
        { "--model mlp --depth 3 --width 32 --batch 8 --workers 3 --strategy ist "
          "--neuron-group 4 --local-steps 2 --optimizer-state keep --precision bf16", "--steps 6",
          1 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        if (cases[i].bf16 && bf16 == ST_BF16_UNAVAILABLE)
            continue;
        char opts[4 * ST_TEST_PATH_MAX], where[2 * ST_TEST_PATH_MAX];
        if (strstr(cases[i].opts, "gpt"))
            snprintf(where, sizeof where, "--data 'text:%s'", text);
        else
            snprintf(where, sizeof where, "%s", data);
        snprintf(opts, sizeof opts, "%s %s --oversubscribe%s", cases[i].opts, where,
                 cases[i].bf16 && bf16 == ST_BF16_EMULATED ? " --bf16-emulated" : "");
        expect_plan_equals_run_of(opts, cases[i].length, NULL);
    }
    st_test_rmdir(dir);
}

/* A team worker's primitives run T threads, and oneDNN sizes their
 * scratchpads for them: the plan lays a team out with T threads too. */
Test(plan, memory_equals_the_runs_for_a_team_worker, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], data[2 * ST_TEST_PATH_MAX], opts[3 * ST_TEST_PATH_MAX];
    tiny_images(dir, data, sizeof data);
    snprintf(opts, sizeof opts, "%s --depth 2 --width 256 --batch 8 --workers 1 "
             "--threads-per-worker 2 --oversubscribe", data);
    expect_plan_equals_run(opts);
    st_test_rmdir(dir);
}

Test(plan, bad_budgets_topologies_and_calibrations_are_one_line_usage_errors, .timeout = 60)
{
    const char *base = "--data synthetic --depth 2 --width 32 --batch 8";
    char args[512];
    const struct { const char *opts, *needle; } cases[] = {
        { "", "give one budget" },
        { "--memory-per-worker 1G --memory-total 2G", "give one budget" },
        { "--memory-per-worker 12X", "--memory-per-worker 12X: expected a size" },
        { "--memory-per-worker 0", "--memory-per-worker 0: expected a size" },
        { "--memory-per-worker -1G", "--memory-per-worker -1G: expected a size" },
        { "--memory-total 1.5Gi", "--memory-total 1.5Gi: expected a size" },
        { "--memory-per-worker 0x10", "--memory-per-worker 0x10: expected a size" },
        { "--memory-per-worker 1e30G", "--memory-per-worker 1e30G: expected a size" },
        { "--memory-total 2000000T", "--memory-total 2000000T: expected a size" },
        { "--memory-per-worker", "--memory-per-worker needs a value" },
        { "--memory-per-worker 1G --topology synthetic:bogus:3", "--topology synthetic:bogus:3" },
        { "--memory-per-worker 1G --topology xml:/nonexistent.xml", "--topology xml:" },
        { "--memory-per-worker 1G --strategies dp,nope", "--strategies dp,nope: 'nope'" },
        { "--memory-per-worker 1G --strategies dp,,sdp",
          "--strategies dp,,sdp: an empty name in the list" },
        { "--memory-per-worker 1G --json ''", "--json: expected a file name, got ''" },
        { "--memory-per-worker 1G --calibration /nonexistent", "--calibration /nonexistent" },
        /* read at once, or refused: a device or a FIFO is never read */
        { "--memory-per-worker 1G --calibration /dev/zero",
          "--calibration /dev/zero: not a regular file (a character device)" },
        { "--memory-per-worker 1G --accuracy /dev/zero",
          "--accuracy /dev/zero: not a regular file (a character device)" },
        { "--memory-per-worker 1G --accuracy /nonexistent",
          "--accuracy /nonexistent: cannot open it: No such file or directory" },
        { "--memory-per-worker 1G --ranks 0",
          "--ranks: expected an integer in [1, 65535], got '0'" },
        { "--memory-per-worker 1G --ranks x",
          "--ranks: expected an integer in [1, 65535], got 'x'" },
        { "--memory-per-worker 1G --ranks 65536", "--ranks: expected an integer in [1, 65535]" },
        { "--memory-per-worker 1G --ranks", "--ranks needs a value" },
        { "--memory-per-worker 1G --topology 'synthetic:numa:2 core:4 pu:1' "
          "--threads-per-worker 3", "--threads-per-worker 3: does not divide the 4 cores of a "
          "NUMA domain of synthetic:numa:2 core:4 pu:1; give --workers N" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(args, sizeof args, "plan %s %s", base, cases[i].opts);
        expect_usage_error(args, cases[i].needle);
    }
}

/* --help answers whatever else the line holds, as train's does, but a
 * malformed option is still refused. */
Test(plan, help_whatever_else_the_line_holds)
{
    run_result *r = calloc(1, sizeof *r);
    cr_assert_not_null(r);
    run(r, NULL, "plan --model gpt --memory-per-worker 1G --help");
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_expect(strstr(r->out, "Usage: subtrain plan"), "%s", r->out);
    free(r);
    expect_usage_error("plan --help --frobnicate", "unknown option '--frobnicate'");
    expect_usage_error("calibrate --help --frobnicate", "--frobnicate");
}

/* The sizes as written: powers of 1024, fractions, the -iB forms. */
Test(plan, budgets_read_as_written)
{
    const struct { const char *size; double mib; } cases[] = {
        { "512M", 512.0 }, { "1G", 1024.0 }, { "1.5GiB", 1536.0 }, { "2048K", 2.0 },
        { "1048576", 1.0 }, { "0.5T", 524288.0 },
    };
    char dir[ST_TEST_PATH_MAX], data[2 * ST_TEST_PATH_MAX];
    tiny_images(dir, data, sizeof data);
    run_result *r = calloc(1, sizeof *r);
    cr_assert_not_null(r);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char args[3 * ST_TEST_PATH_MAX], want[64];
        snprintf(args, sizeof args, "plan --as-given --memory-per-worker %s %s --depth 2 "
                 "--width 32 --batch 8", cases[i].size, data);
        run(r, NULL, args);
        cr_assert_eq(r->status, 0, "%s: %s", args, r->err);
        snprintf(want, sizeof want, "budget %.1f MiB a worker", cases[i].mib);
        cr_expect(strstr(r->out, want), "%s: expected '%s' in %s", args, want, r->out);
    }
    /* a total is shared evenly by the row's workers */
    char args[3 * ST_TEST_PATH_MAX];
    snprintf(args, sizeof args, "plan --as-given --memory-total 3G --workers 2 --oversubscribe "
             "%s --depth 2 --width 32 --batch 8", data);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s: %s", args, r->err);
    cr_expect(strstr(r->out, "budget 1536.0 MiB a worker"), "%s: %s", args, r->out);
    free(r);
    st_test_rmdir(dir);
}

/* With shared weights a worker holds its share of its domain's copy: of
 * 5 workers over 2 NUMA domains (3 + 2) the busiest is one of the 2,
 * holding what a worker of 4 (2 + 2) holds, more than one of 6 (3 + 3).
 * Sizing one worker for all (worker 0, of the domain of 3) would say the
 * latter. */
Test(plan, uneven_domains_report_the_busiest_workers_share)
{
    const int workers[3] = { 4, 5, 6 };
    json_int_t weights[3];
    for (int i = 0; i < 3; i++) {
        char args[512];
        snprintf(args, sizeof args, "plan --as-given --strategy dp --topology "
                 "'synthetic:numa:2 core:4 pu:1' --workers %d --memory-per-worker 1G --data "
                 "synthetic --model mlp --depth 2 --width 256 --batch 8 --json -", workers[i]);
        run_result *r = calloc(1, sizeof *r);
        cr_assert_not_null(r);
        run(r, NULL, args);
        cr_assert_eq(r->status, 0, "%s: %s", args, r->err);
        json_t *row = plan_row(r, args);
        weights[i] = json_integer_value(json_object_get(json_object_get(row, "memory_per_worker"),
                                                        "weights"));
        json_decref(row);
        free(r);
    }
    cr_expect_eq(weights[1], weights[0], "5 workers over 3 + 2: the plan says %lld bytes of "
                 "weights, a worker of 2 + 2 holds %lld", (long long)weights[1],
                 (long long)weights[0]);
    cr_expect_gt(weights[1], weights[2], "5 workers over 3 + 2: the plan says %lld bytes of "
                 "weights, no more than a worker of 3 + 3 (%lld)", (long long)weights[1],
                 (long long)weights[2]);
}

/* The plan of `opts` as JSON, with `env` before the program (NULL: none). */
static char *plan_json(const char *dir, const char *env, const char *opts)
{
    char path[ST_TEST_PATH_MAX], args[4 * ST_TEST_PATH_MAX];
    st_test_path(path, dir, env ? "all.json" : "classes.json");
    snprintf(args, sizeof args, "plan --memory-per-worker 1G --json '%s' %s", path, opts);
    run_result *r = calloc(1, sizeof *r);
    cr_assert_not_null(r);
    run(r, env, args);
    cr_assert_eq(r->status, 0, "%s%s: %s", env ? env : "", args, r->err);
    free(r);
    size_t len;
    unsigned char *data = st_test_read_file(path, &len);
    cr_assert_not_null(data, "%s: no JSON written", args);
    char *text = malloc(len + 1);
    cr_assert_not_null(text);
    memcpy(text, data, len);
    text[len] = '\0';
    free(data);
    return text;
}

/* A sizing run builds one model per class of alike builds and lays the
 * others out as its shells (nn/model_memo.h): every figure of the plan is
 * the one building every worker's model gives (SUBTRAIN_SIZING=build-all),
 * over uneven NUMA domains (5 workers over 3 + 2; 6 over 4 domains), with
 * the strategies' subnetwork draws (blocks, neurons, backward masking),
 * the domains' blocked weight copies, ResNet's batch norm state, gpt's
 * attention and synth's two phases: where a run on this machine cannot
 * show it. */
Test(plan, class_builds_give_every_workers_figures, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], text[ST_TEST_PATH_MAX], gpt[3 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(text, dir, "text.txt");
    write_text(text);
    snprintf(gpt, sizeof gpt, "--model gpt --data 'text:%s' --depth 2 --width 16 --heads 2 "
             "--context 8 --batch 4 --val-bytes 256 --strategies dp,sdp,localsgd", text);
    const char *t2 = "synthetic:numa:2 core:4 pu:1", *t4 = "synthetic:pack:2 numa:2 core:2 pu:1";
    const char *res = "--data synthetic --model resmlp --depth 3 --width 64 --batch 8";
    const char *syn = "--data synthetic --model mlp --strategy synth --strategies synth";
    const struct { const char *topology; int workers; const char *opts, *more; } cases[] = {
        { t2, 5, res, "" },
        { t4, 6, res, "" },
        { t2, 5, res, "--subnet neuron --strategies sdp,ist" },
        { t4, 6, res, "--masking backward --strategies sdp" },
        /* a domain's blocked weight copies, in a store of its own */
        { t2, 5, res, "--precision bf16 --weight-layout blocked --strategies dp" },
        { t2, 5, "--data synthetic --model resnet --batch 8", "--strategies dp,sdp,ist" },
        { t4, 6, gpt, "" },
        /* synth: the segments' layer ranges (their phase reported), then
         * the joined network (reported with private weights) */
        { t2, 5, syn, "--depth 2 --width 16 --batch 2 --cuts 1 --recovery-epochs 1" },
        { t4, 6, syn, "--depth 3 --width 32 --batch 8 --recovery-epochs 1 --weights private" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char opts[4 * ST_TEST_PATH_MAX];
        snprintf(opts, sizeof opts, "--topology '%s' --workers %d %s %s", cases[i].topology,
                 cases[i].workers, cases[i].opts, cases[i].more);
        char *classes = plan_json(dir, NULL, opts);
        char *all = plan_json(dir, "SUBTRAIN_SIZING=build-all", opts);
        size_t at = 0, line = 1;
        while (classes[at] && classes[at] == all[at])
            line += classes[at++] == '\n';
        size_t from = at;
        while (from > 0 && classes[from - 1] != '\n')
            from--;
        cr_expect(classes[at] == '\0' && all[at] == '\0', "%s: line %zu of the plan's JSON "
                  "is '%.60s' with one build per class, '%.60s' with every worker's", opts, line,
                  classes + from, all + from);
        free(classes);
        free(all);
    }
    st_test_rmdir(dir);
}

/* A budget below every row: none fits, each says its largest kind; the
 * same in the JSON. */
Test(plan, rows_over_the_budget_name_their_largest_kind)
{
    char dir[ST_TEST_PATH_MAX], data[2 * ST_TEST_PATH_MAX], args[3 * ST_TEST_PATH_MAX];
    tiny_images(dir, data, sizeof data);
    run_result *r = calloc(1, sizeof *r);
    cr_assert_not_null(r);
    snprintf(args, sizeof args, "plan --memory-per-worker 1M --strategies dp --workers 2 "
             "--oversubscribe %s --depth 2 --width 256 --batch 8 --json -", data);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    json_error_t e;
    json_t *root = json_loads(r->out, 0, &e);
    cr_assert_not_null(root, "%s", e.text);
    json_t *rows = json_object_get(root, "rows");
    cr_assert_eq(json_array_size(rows), 8, "dp in two precisions, two moment layouts, and "
                 "without and with recomputation");
    for (size_t i = 0; i < json_array_size(rows); i++) {
        json_t *row = json_array_get(rows, i), *mem = json_object_get(row, "memory_per_worker");
        cr_expect(json_is_false(json_object_get(row, "fits")));
        const char *over = json_string_value(json_object_get(row, "overflow"));
        cr_assert_not_null(over);
        const char *k;
        json_t *v;
        json_int_t big = json_integer_value(json_object_get(mem, over));
        json_object_foreach(mem, k, v)
            if (strcmp(k, "total") != 0)
                cr_expect_geq(big, json_integer_value(v), "%s is larger than %s", k, over);
    }
    json_decref(root);
    free(r);
    st_test_rmdir(dir);
}

/* With a calibration, the fitting rows come fastest first, and a row's
 * samples/s is workers x batch over its step time. */
Test(plan, fitting_rows_are_ranked_by_predicted_samples_per_second)
{
    char dir[ST_TEST_PATH_MAX], cal[ST_TEST_PATH_MAX], args[6 * ST_TEST_PATH_MAX];
    char data[2 * ST_TEST_PATH_MAX];
    tiny_images(dir, data, sizeof data);
    st_test_path(cal, dir, "cal");
    FILE *f = fopen(cal, "w");
    cr_assert_not_null(f);
    fclose(f);
    write_calibration(cal, 10.0, 40.0);
    char json[ST_TEST_PATH_MAX];
    st_test_path(json, dir, "plan.json");
    snprintf(args, sizeof args, "plan --memory-per-worker 1G --calibration '%s' --workers 2 "
             "--oversubscribe %s --depth 2 --width 64 --batch 16 --json '%s'", cal, data, json);
    run_result *r = calloc(1, sizeof *r);
    cr_assert_not_null(r);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    json_error_t e;
    json_t *root = json_load_file(json, 0, &e);
    cr_assert_not_null(root, "%s", e.text);
    json_t *rows = json_object_get(root, "rows");
    cr_assert_gt(json_array_size(rows), 4);
    double prev = 1e300;
    for (size_t i = 0; i < json_array_size(rows); i++) {
        json_t *row = json_array_get(rows, i);
        if (!json_is_true(json_object_get(row, "possible")))
            continue;
        const double sps = json_real_value(json_object_get(row, "samples_per_s"));
        const double step = json_real_value(json_object_get(row, "step_s"));
        cr_expect_leq(sps, prev, "row %zu: %g samples/s after %g", i, sps, prev);
        cr_expect_float_eq(sps, 2.0 * 16.0 / step, 1e-9 * sps);
        prev = sps;
    }
    json_decref(root);
    free(r);
    st_test_rmdir(dir);
}

/* --json FILE that cannot be written is said before the plan (nothing
 * printed), with the reason, and exit 1. */
Test(plan, an_unwritable_json_file_is_said_before_the_plan, .timeout = 60)
{
    run_result *r = calloc(1, sizeof *r);
    cr_assert_not_null(r);
    run(r, NULL, "plan --memory-per-worker 1G --data synthetic --depth 2 --width 32 "
                 "--json /nonexistent-dir/plan.json");
    cr_assert_eq(r->status, 1, "%s", r->err);
    cr_assert(strstr(r->err, "subtrain plan: --json /nonexistent-dir/plan.json: cannot create") &&
              strstr(r->err, "No such file or directory") && count_lines(r->err) == 1,
              "%s", r->err);
    cr_assert_str_empty(r->out, "planned before saying it: %s", r->out);
    free(r);
}

/* An output naming a file the command reads is refused before anything
 * is written (exit 2), and the file is left as it was: plan --json over
 * its text data, its --config, its --calibration; export -o over its
 * --config or its --init weights. */
Test(plan, an_output_over_an_input_is_refused, .timeout = 60)
{
    char dir[ST_TEST_PATH_MAX], text[ST_TEST_PATH_MAX], conf[ST_TEST_PATH_MAX],
        cal[ST_TEST_PATH_MAX], args[6 * ST_TEST_PATH_MAX], before[4096], after[4096];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(text, dir, "d.txt");
    st_test_path(conf, dir, "run.conf");
    st_test_path(cal, dir, "c.cal");
    static const char words[] = "the quick brown fox jumps over the lazy dog, and again. ";
    FILE *f = fopen(text, "w");
    cr_assert_not_null(f);
    for (int k = 0; k < 40; k++)
        fputs(words, f);
    fclose(f);
    cr_assert_eq(st_test_write_file(conf, "steps = 2\n", 10), 0);
    write_calibration(cal, 10.0, 40.0);
    run_result *r = calloc(1, sizeof *r);
    cr_assert_not_null(r);
    const struct { const char *opts, *file, *needle; } cases[] = {
        { "plan --memory-per-worker 1G --model gpt --depth 1 --width 16 --heads 2 --context 8 "
          "--data text:%s --json %s", text, "is the text --data reads" },
        { "plan --memory-per-worker 1G --data synthetic --config %s --json %s", conf,
          "is the file --config reads" },
        { "plan --memory-per-worker 1G --data synthetic --calibration %s --json %s", cal,
          "is the file --calibration reads" },
        { "export --init /nonexistent.safetensors --data synthetic --config %s -o %s", conf,
          "is the file --config reads" },
        { "export --data synthetic --init %s -o %s", cal, "is the weights --init reads" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        read_into(cases[i].file, before, sizeof before);
        snprintf(args, sizeof args, cases[i].opts, cases[i].file, cases[i].file);
        run(r, NULL, args);
        cr_assert_eq(r->status, 2, "%s: exit %d: %s", args, r->status, r->err);
        cr_assert(strstr(r->err, cases[i].needle) && count_lines(r->err) == 1, "%s: %s", args,
                  r->err);
        read_into(cases[i].file, after, sizeof after);
        cr_assert_str_eq(after, before, "%s changed %s", args, cases[i].file);
    }
    free(r);
    st_test_rmdir(dir);
}

/* What calibrate writes, plan reads; a file with an unknown key or a bad
 * rate is refused with its line.  calibrate times fixed windows on a shared
 * machine (about 45 s at a load average of 5), hence the longer limit. */
Test(plan, calibrate_writes_what_plan_reads, .timeout = 240)
{
    char dir[ST_TEST_PATH_MAX], cal[ST_TEST_PATH_MAX], bad[ST_TEST_PATH_MAX];
    char data[2 * ST_TEST_PATH_MAX], args[5 * ST_TEST_PATH_MAX];
    tiny_images(dir, data, sizeof data);
    st_test_path(cal, dir, "cal");
    st_test_path(bad, dir, "bad");
    run_result *r = calloc(1, sizeof *r);
    cr_assert_not_null(r);
    snprintf(args, sizeof args, "calibrate -o '%s'", cal);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    snprintf(args, sizeof args, "plan --as-given --memory-per-worker 1G --calibration '%s' "
             "%s --depth 2 --width 32 --batch 8 --json -", cal, data);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    json_t *row = plan_row(r, "calibrated");
    cr_expect_gt(json_real_value(json_object_get(row, "samples_per_s")), 0.0);
    json_decref(row);
    FILE *f = fopen(bad, "w");
    cr_assert_not_null(f);
    fprintf(f, "format 2\nmatmul_fp32_nn_m16_n16_k16_gflops 10\n"
               "matmul_fp32_nn_m16_n16_k32_gflops 1\n");
    fclose(f);
    snprintf(args, sizeof args, "plan --memory-per-worker 1G --calibration '%s' %s", bad, data);
    expect_usage_error(args, "line 3: unknown key 'matmul_fp32_nn_m16_n16_k32_gflops'");
    f = fopen(bad, "w");
    cr_assert_not_null(f);
    fprintf(f, "format 2\nreduce_gbps fast\n");
    fclose(f);
    expect_usage_error(args, "line 2: reduce_gbps fast: expected a rate");
    f = fopen(bad, "w");
    cr_assert_not_null(f);
    fprintf(f, "# an older file\nformat 1\nmatmul_fp32_small_gflops 10\n");
    fclose(f);
    expect_usage_error(args, "line 2: format 1, an older calibration without the rates the "
                             "prediction uses: run 'subtrain calibrate' again");
    f = fopen(bad, "w");
    cr_assert_not_null(f);
    fprintf(f, "format 3\n");
    fclose(f);
    expect_usage_error(args, "line 1: format '3', expected 2");
    f = fopen(bad, "w");
    cr_assert_not_null(f);
    fprintf(f, "gelu_bwd_ns 1\n");
    fclose(f);
    expect_usage_error(args, "no 'format 2' line");
    free(r);
    st_test_rmdir(dir);
}

/* calibrate -o FILE writes FILE at the end, through a rename: stopped
 * while it measures, an earlier calibration is there as it was and a new
 * name is not created; a directory is said at once. */
Test(plan, an_interrupted_calibration_keeps_the_earlier_file, .timeout = 60)
{
    char dir[ST_TEST_PATH_MAX], cal[ST_TEST_PATH_MAX], fresh[ST_TEST_PATH_MAX];
    char args[3 * ST_TEST_PATH_MAX], got[64] = "";
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(cal, dir, "cal");
    st_test_path(fresh, dir, "fresh");
    FILE *f = fopen(cal, "w");
    cr_assert_not_null(f);
    fputs("format 2\n# earlier\n", f);
    fclose(f);
    run_result *r = calloc(1, sizeof *r);
    cr_assert_not_null(r);
    snprintf(args, sizeof args, "calibrate -o '%s'", cal);
    run(r, "timeout -s TERM 2", args);
    cr_assert_neq(r->status, 0, "calibrate finished within 2 s: the test needs it stopped");
    f = fopen(cal, "r");
    cr_assert_not_null(f);
    size_t n = fread(got, 1, sizeof got - 1, f);
    fclose(f);
    got[n] = '\0';
    cr_assert_str_eq(got, "format 2\n# earlier\n", "the earlier calibration became '%s'", got);
    snprintf(args, sizeof args, "calibrate -o '%s'", fresh);
    run(r, "timeout -s TERM 2", args);
    cr_assert_neq(access(fresh, F_OK), 0, "a stopped calibration left %s", fresh);
    snprintf(args, sizeof args, "calibrate -o '%s'", dir);
    expect_runtime_error(NULL, args, "cannot open it: Is a directory");
    /* the temporary name the end needs, tried at once */
    char longname[300];
    memset(longname, 'c', 255);
    longname[255] = '\0';
    snprintf(args, sizeof args, "calibrate -o '%s/%s'", dir, longname);
    expect_runtime_error("timeout 10", args, "beside it: File name too long");
    free(r);
    st_test_rmdir(dir);
}

/* The step's work the plan prices, layer by layer: its products and
 * convolutions add up to the model's FLOPs (st_model_step_flops) for the
 * model families, in both precisions and recomputing blocks; every entry
 * has work in it, and the list fits what a plan keeps of it. */
Test(plan, step_costs_add_up_to_the_step_flops)
{
    omp_set_num_threads(1);
    st_model_config cfgs[] = {
        mlp_config(3, 20, ST_ACT_RELU), resmlp_config(2, 16, 24, ST_ACT_GELU),
        gpt_config(2, 16, 2, 8),
        resnet_config(st_model_kind_named("resnet"), 1, 16, 1, 8, 8),
        resmlp_config(3, 16, 24, ST_ACT_GELU),
    };
    const int n_cfgs = (int)(sizeof cfgs / sizeof *cfgs);
    for (int t = 0; t < 2 * n_cfgs; t++) {
        st_model_config c = cfgs[t % n_cfgs];
        c.precision = t >= n_cfgs ? ST_PRECISION_BF16 : ST_PRECISION_FP32;
        if (t % n_cfgs == n_cfgs - 1)
            c.recompute = ST_RECOMPUTE_BLOCKS;
        if (c.precision == ST_PRECISION_BF16 && st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
            continue;
        st_arena arena;
        st_arena_init(&arena, "test_plan", NULL, 0);
        st_model *m = make_model(&c, 8, &arena);
        st_step_cost costs[ST_STEP_COSTS_MAX];
        const int n = st_model_step_costs(m, costs, ST_STEP_COSTS_MAX);
        cr_assert(n > 0 && n <= ST_STEP_COSTS_MAX, "%d entries", n);
        double flops = 0.0;
        int passes = 0;
        for (int i = 0; i < n; i++) {
            const st_step_cost *e = &costs[i];
            if (e->kind == ST_COST_PASS) {
                passes++;
                cr_expect(e->bytes > 0.0 && e->calls > 0.0 && e->elements > 0.0,
                          "entry %d: an empty pass", i);
                continue;
            }
            cr_expect(e->flops > 0.0 && e->count > 0.0, "entry %d: an empty product", i);
            if (e->kind == ST_COST_MATMUL)
                cr_expect_eq(e->flops, 2.0 * (double)(e->m * e->n * e->k) * e->count,
                             "entry %d: %g FLOPs for %g of %lld x %lld x %lld", i, e->flops,
                             e->count, (long long)e->m, (long long)e->n, (long long)e->k);
            flops += e->flops;
        }
        const double want = st_model_step_flops(m);
        cr_expect(fabs(flops - want) <= 1e-12 * want, "%s %s%s: the costs' %.0f FLOPs, the "
                  "step's %.0f", st_model_kind_name(c.kind), st_precision_name(c.precision),
                  c.recompute ? " recompute" : "", flops, want);
        cr_expect_gt(passes, 2, "%s: the loss's and the layers' passes",
                     st_model_kind_name(c.kind));
        st_model_destroy(m);
        st_arena_release(&arena);
    }
}

/* The step time as the rates say: a wider model takes longer; a bf16 row
 * is priced at the bf16 rates (none measured: no time for it, while the
 * fp32 row has one; faster bf16 products: a shorter bf16 step, the fp32
 * row's the same). */
Test(plan, predicted_step_follows_width_and_precision_rates, .timeout = 60)
{
    char dir[ST_TEST_PATH_MAX], cal[ST_TEST_PATH_MAX], args[6 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(cal, dir, "cal");
    run_result *r = calloc(1, sizeof *r);
    cr_assert_not_null(r);
    const double bf16_rates[3] = { 0.0, 100.0, 400.0 };
    double fp32[3][2], bf16[3][2];   /* [bf16 rate][width 256] */
    for (int b = 0; b < 3; b++) {
        write_calibration(cal, 50.0, bf16_rates[b]);
        for (int wide = 0; wide < 2; wide++) {
            snprintf(args, sizeof args, "plan --memory-per-worker 1G --calibration '%s' "
                     "--strategies dp --data synthetic --model resmlp --depth 2 --width %d "
                     "--batch 32 --workers 1 --json -", cal, wide ? 256 : 64);
            run(r, NULL, args);
            cr_assert_eq(r->status, 0, "%s", r->err);
            json_error_t e;
            json_t *root = json_loads(r->out, 0, &e);
            cr_assert_not_null(root, "%s", e.text);
            json_t *rows = json_object_get(root, "rows");
            fp32[b][wide] = bf16[b][wide] = NAN;
            for (size_t i = 0; i < json_array_size(rows); i++) {
                json_t *row = json_array_get(rows, i);
                json_t *s = json_object_get(row, "step_s");
                const int is_bf16 = strcmp(json_string_value(json_object_get(row, "precision")),
                                           "bf16") == 0;
                if (is_bf16 && b == 0)
                    cr_expect(json_is_null(s), "a bf16 row priced without bf16 rates");
                if (json_is_real(s))
                    *(is_bf16 ? &bf16[b][wide] : &fp32[b][wide]) = json_real_value(s);
            }
            json_decref(root);
            cr_assert(fp32[b][wide] > 0.0, "no fp32 step time");
        }
        cr_expect_gt(fp32[b][1], 2.0 * fp32[b][0], "width 256 %g s, width 64 %g s",
                     fp32[b][1], fp32[b][0]);
        cr_expect_eq(fp32[b][1], fp32[0][1], "the fp32 row's time moved with the bf16 rates");
    }
    cr_expect_lt(bf16[2][1], bf16[1][1], "bf16 products at 4x the rate: %g s, not less than %g s",
                 bf16[2][1], bf16[1][1]);
    free(r);
    st_test_rmdir(dir);
}

/* The plan's JSON rows for `args` (run here). */
static json_t *plan_rows(const char *args)
{
    run_result *r = calloc(1, sizeof *r);
    cr_assert_not_null(r);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s: %s", args, r->err);
    json_error_t e;
    json_t *root = json_loads(r->out, 0, &e);
    cr_assert_not_null(root, "%s: %s", args, e.text);
    free(r);
    json_t *rows = json_incref(json_object_get(root, "rows"));
    json_decref(root);
    return rows;
}

/* The plan's step time of resmlp depth 2 at `width`, 1 worker, fp32, under
 * the calibration at cal; its step's FLOPs into *flops. */
static double fp32_step_s(const char *cal, int width, double *flops)
{
    char args[4 * ST_TEST_PATH_MAX];
    snprintf(args, sizeof args, "plan --as-given --memory-per-worker 1G --calibration '%s' "
             "--data synthetic --model resmlp --depth 2 --width %d --batch 32 --workers 1 "
             "--json -", cal, width);
    json_t *rows = plan_rows(args);
    json_t *row = json_array_get(rows, 0);
    json_t *s = json_object_get(row, "step_s");
    cr_assert(json_is_real(s), "no fp32 step time at width %d", width);
    const double t = json_real_value(s);
    *flops = json_number_value(json_object_get(row, "flops_per_worker_step"));
    json_decref(rows);
    return t;
}

/* chain_wide_T slows products as large as its layers' (1024 x 1024) by
 * its factor instead of chain_T's, and leaves those of chain_T's layers
 * (256 x 256) and smaller as they were: width 1024's products at 50
 * GFLOP/s take (2.4 - 1.2) / 50e9 s a FLOP longer, but for the stem's
 * 784 x 1024 (0.9 of the way in the log) and the head's small ones. */
Test(plan, a_wide_chain_slows_wide_products_only, .timeout = 60)
{
    char dir[ST_TEST_PATH_MAX], cal[ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(cal, dir, "cal");
    write_calibration(cal, 50.0, 100.0);
    double f64, f1024, flops;
    const double narrow = fp32_step_s(cal, 64, &f64), wide = fp32_step_s(cal, 1024, &flops);
    FILE *f = fopen(cal, "a");
    cr_assert_not_null(f);
    fprintf(f, "chain_wide_fp32 2.4\n");
    fclose(f);
    cr_expect_eq(fp32_step_s(cal, 64, &f64), narrow, "width 64 moved with the wide chain");
    const double longer = fp32_step_s(cal, 1024, &f1024) - wide;
    const double all = flops * (2.4 - 1.2) / 50e9;
    cr_expect(longer > 0.8 * all && longer <= all * (1.0 + 1e-9),
              "width 1024: %g s longer, expected 0.8 to 1 of %g s", longer, all);
    st_test_rmdir(dir);
}

/* Without --workers or --threads-per-worker, every team size T = 1, 2, 4,
 * ... that divides the cores of each NUMA domain, cores / T workers each;
 * with either option, the options' alone. */
Test(plan, team_candidates_divide_the_domains_cores)
{
    const struct { const char *topo, *opts; int teams[4], workers[4]; } cases[] = {
        { "numa:2 core:4 pu:1", "", { 1, 2, 4, 0 }, { 8, 4, 2, 0 } },
        { "numa:2 core:6 pu:2", "", { 1, 2, 0, 0 }, { 12, 6, 0, 0 } },
        { "numa:1 core:3 pu:1", "", { 1, 0, 0, 0 }, { 3, 0, 0, 0 } },
        { "numa:2 core:4 pu:1", "--threads-per-worker 2", { 2, 0, 0, 0 }, { 4, 0, 0, 0 } },
        { "numa:2 core:4 pu:1", "--workers 2", { 1, 0, 0, 0 }, { 2, 0, 0, 0 } },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char args[512];
        snprintf(args, sizeof args, "plan --strategies dp --topology 'synthetic:%s' %s "
                 "--memory-per-worker 1G --data synthetic --depth 2 --width 32 --batch 8 "
                 "--json -", cases[i].topo, cases[i].opts);
        json_t *rows = plan_rows(args);
        int seen[4] = { 0 };
        for (size_t k = 0; k < json_array_size(rows); k++) {
            json_t *row = json_array_get(rows, k);
            const int t = (int)json_integer_value(json_object_get(row, "threads_per_worker"));
            const int w = (int)json_integer_value(json_object_get(row, "workers"));
            int j = 0;
            while (j < 4 && cases[i].teams[j] != t)
                j++;
            cr_assert(j < 4 && t > 0, "%s: a row of %d threads a worker", args, t);
            cr_expect_eq(w, cases[i].workers[j], "%s: %d workers of %d threads, not %d", args,
                         w, t, cases[i].workers[j]);
            seen[j]++;
        }
        for (int j = 0; j < 4 && cases[i].teams[j]; j++)
            cr_expect_eq(seen[j], 8, "%s: %d rows of %d threads a worker, not dp's 8", args,
                         seen[j], cases[i].teams[j]);
        json_decref(rows);
    }
}

/* A team's step is priced at the calibration's team speedups: faster than
 * one thread's when they say 2, slower when they say 0.5, and not at all
 * when the calibration measured no team of that size. */
Test(plan, a_team_is_priced_at_its_calibrated_speedup, .timeout = 60)
{
    char dir[ST_TEST_PATH_MAX], cal[ST_TEST_PATH_MAX], args[4 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(cal, dir, "cal");
    double step[3][2];   /* [no team rates, speedup 2, speedup 0.5][T = 1, 2] */
    for (int c = 0; c < 3; c++) {
        write_calibration(cal, 50.0, 100.0);
        if (c > 0) {
            FILE *f = fopen(cal, "a");
            cr_assert_not_null(f);
            const double s = c == 1 ? 2.0 : 0.5;
            for (int d = 16; d <= 1024; d *= 4)
                fprintf(f, "team_2_matmul_fp32_d%d %g\nteam_2_matmul_bf16_d%d %g\n", d, s, d, s);
            fprintf(f, "team_2_relu_fwd %g\nteam_2_call_us 1\n", s);
            fclose(f);
        }
        for (int t = 0; t < 2; t++) {
            snprintf(args, sizeof args, "plan --as-given --memory-per-worker 1G --calibration "
                     "'%s' --data synthetic --model resmlp --depth 2 --width 256 --batch 64 "
                     "--workers 1 --threads-per-worker %d --json -", cal, t + 1);
            json_t *rows = plan_rows(args);
            json_t *s = json_object_get(json_array_get(rows, 0), "step_s");
            step[c][t] = json_is_real(s) ? json_real_value(s) : NAN;
            json_decref(rows);
        }
    }
    cr_expect(step[0][0] > 0.0 && isnan(step[0][1]), "without team rates: one thread %g s, a "
              "team %g s (none expected)", step[0][0], step[0][1]);
    cr_expect_lt(step[1][1], step[1][0], "team speedup 2: %g s, one thread %g s", step[1][1],
                 step[1][0]);
    cr_expect_gt(step[2][1], step[2][0], "team speedup 0.5: %g s, one thread %g s", step[2][1],
                 step[2][0]);
    st_test_rmdir(dir);
}

/* A team of 3 threads (a domain of 6 cores divided) is priced between the
 * calibrated teams of 2 and 4, their rates interpolated in log2 T: here
 * speedups of 2 and 3 at the same call cost, so its step lies strictly
 * between theirs. */
Test(plan, a_team_between_calibrated_sizes_is_priced_between_them, .timeout = 60)
{
    char dir[ST_TEST_PATH_MAX], cal[ST_TEST_PATH_MAX], args[4 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(cal, dir, "cal");
    write_calibration(cal, 50.0, 100.0);
    FILE *f = fopen(cal, "a");
    cr_assert_not_null(f);
    for (int t = 2; t <= 4; t += 2) {
        const double s = t == 2 ? 2.0 : 3.0;
        for (int d = 16; d <= 1024; d *= 4)
            fprintf(f, "team_%d_matmul_fp32_d%d %g\nteam_%d_matmul_bf16_d%d %g\n", t, d, s, t,
                    d, s);
        fprintf(f, "team_%d_relu_fwd %g\nteam_%d_call_us 1\n", t, s, t);
    }
    fclose(f);
    double step[3];   /* T = 2, 3, 4 */
    for (int t = 0; t < 3; t++) {
        snprintf(args, sizeof args, "plan --as-given --memory-per-worker 1G --calibration '%s' "
                 "--topology 'synthetic:pack:1 numa:1 core:12 pu:1' --data synthetic "
                 "--model resmlp --depth 2 --width 256 --batch 64 --workers 1 "
                 "--threads-per-worker %d --json -", cal, t + 2);
        json_t *rows = plan_rows(args);
        json_t *s = json_object_get(json_array_get(rows, 0), "step_s");
        step[t] = json_is_real(s) ? json_real_value(s) : NAN;
        json_decref(rows);
    }
    cr_expect(step[2] < step[1] && step[1] < step[0], "teams of 2, 3, 4: %g, %g, %g s a step",
              step[0], step[1], step[2]);
    st_test_rmdir(dir);
}

/* --ranks N: N described ranks of the workers the options give, each
 * rank's busiest worker (what its records report) and the busiest of all
 * in the row; no predicted time under a calibration without the network
 * keys.  The layouts against a real mpirun's are
 * tests/mpi.sh's plan_ranks_* cases. */
Test(plan, ranks_rows_give_every_ranks_busiest_worker_and_no_time_without_a_network,
     .timeout = 60)
{
    if (!st_world_has_mpi())
        cr_skip_test("built without MPI: --ranks sizes the MPI backend's layout");
    char dir[ST_TEST_PATH_MAX], cal[ST_TEST_PATH_MAX], args[4 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(cal, dir, "cal");
    write_calibration(cal, 50.0, 100.0);
    snprintf(args, sizeof args, "plan --ranks 3 --memory-per-worker 1G --calibration '%s' "
             "--strategies dp --data synthetic --depth 2 --width 64 --batch 8 --workers 2 "
             "--oversubscribe --json -", cal);
    json_t *rows = plan_rows(args);
    cr_assert_gt(json_array_size(rows), 0);
    for (size_t i = 0; i < json_array_size(rows); i++) {
        json_t *row = json_array_get(rows, i);
        cr_assert(json_is_true(json_object_get(row, "possible")), "row %zu: %s", i,
                  json_string_value(json_object_get(row, "why")));
        cr_expect_eq(json_integer_value(json_object_get(row, "ranks")), 3);
        cr_expect_eq(json_integer_value(json_object_get(row, "workers_per_rank")), 2);
        cr_expect_eq(json_integer_value(json_object_get(row, "workers")), 6);
        cr_expect(json_is_null(json_object_get(row, "step_s")), "row %zu: a time", i);
        cr_expect(json_is_string(json_object_get(row, "time_not_predicted")));
        json_t *per = json_object_get(row, "per_rank");
        cr_assert_eq(json_array_size(per), 3);
        json_int_t most = 0;
        double bytes = 0.0;
        for (size_t k = 0; k < 3; k++) {
            json_t *rk = json_array_get(per, k);
            const json_int_t t = json_integer_value(
                json_object_get(json_object_get(rk, "memory_per_worker"), "total"));
            cr_expect_gt(t, 0);
            most = t > most ? t : most;
            const double b = json_real_value(json_object_get(rk, "bytes_per_worker_step"));
            bytes = b > bytes ? b : bytes;
        }
        cr_expect_eq(json_integer_value(json_object_get(json_object_get(row, "memory_per_worker"),
                                                        "total")), most);
        cr_expect_eq(json_real_value(json_object_get(row, "bytes_per_worker_step")), bytes);
        cr_expect_gt(json_real_value(json_object_get(row, "bytes_from_other_ranks_per_step")),
                     0.0, "row %zu: nothing from the other ranks", i);
    }
    json_decref(rows);
    st_test_rmdir(dir);
}

/* The step time of the first row of `args` (ranks > 1), and its bytes
 * from the other ranks. */
static double ranks_step_s(const char *args, double *from_others)
{
    json_t *rows = plan_rows(args);
    json_t *row = json_array_get(rows, 0);
    cr_assert_not_null(row);
    json_t *s = json_object_get(row, "step_s");
    cr_assert(json_is_real(s), "no step time: %s",
              json_string_value(json_object_get(row, "time_not_predicted")));
    cr_expect_null(json_object_get(row, "time_not_predicted"));
    const double t = json_real_value(s);
    *from_others = json_real_value(json_object_get(row, "bytes_from_other_ranks_per_step"));
    json_decref(rows);
    return t;
}

/* With the network keys, a row of ranks adds its worker 0's exchange to
 * the step: the bytes from the other ranks at network_gbps and two
 * exchanges' network_us (the reduce-scatter's and the all-gather's). */
Test(plan, ranks_rows_add_the_exchange_at_the_calibrated_network, .timeout = 60)
{
    if (!st_world_has_mpi())
        cr_skip_test("built without MPI: --ranks sizes the MPI backend's layout");
    char dir[ST_TEST_PATH_MAX], cal[ST_TEST_PATH_MAX], args[4 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(cal, dir, "cal");
    snprintf(args, sizeof args, "plan --ranks 2 --as-given --memory-per-worker 1G "
             "--calibration '%s' --data synthetic --depth 2 --width 64 --batch 8 --workers 1 "
             "--json -", cal);
    double t[2], bytes[2];
    for (int k = 0; k < 2; k++) {
        write_calibration(cal, 50.0, 100.0);
        FILE *f = fopen(cal, "a");
        cr_assert_not_null(f);
        fprintf(f, "network_ranks 2\nnetwork_gbps %d\nnetwork_us %d\n", k ? 2 : 1,
                k ? 50 : 100);
        fclose(f);
        t[k] = ranks_step_s(args, &bytes[k]);
    }
    cr_assert_gt(bytes[0], 0.0);
    cr_expect_eq(bytes[0], bytes[1]);
    const double want = bytes[0] / 2e9 + 2.0 * 50e-6;
    cr_expect(fabs((t[0] - t[1]) - want) <= 1e-9 * t[0],
              "the slower network's step is %g s longer, expected %g s", t[0] - t[1], want);
    st_test_rmdir(dir);
}

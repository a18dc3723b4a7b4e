/*
 * tests/test_cli_config.c — configuration files and provenance:
 * --dump-config reads back as itself, a dumped configuration or a metrics
 * file repeats the run bitwise, a configuration file's errors name the file
 * and line, the first record holds the run's provenance.
 */
#include "cli_run.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <criterion/criterion.h>
#include <subtrain/model.h>
#include <signal.h>

/* ------------------------------------------------------------ configuration and provenance */

/* path's bytes as a string (heap; the caller frees), "" when unreadable. */
static char *slurp(const char *path)
{
    size_t len = 0;
    unsigned char *data = st_test_read_file(path, &len);
    char *s = malloc(len + 1);
    cr_assert_not_null(s);
    if (data)
        memcpy(s, data, len);
    s[data ? len : 0] = '\0';
    free(data);
    return s;
}

static int count_of(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)) != NULL; p++)
        n++;
    return n;
}

/* The long options --dump-config must print (those of --help's test,
 * without the actions), each as "key =" at a line's start. */
static void expect_every_key(const char *dump)
{
    static const char *const keys[] = {
        "data", "model", "depth", "width", "hidden", "activation", "epochs", "steps", "batch",
        "optimizer", "lr", "momentum", "weight-decay", "schedule", "warmup", "seed", "metrics",
        "progress", "quiet", "strategy", "workers", "oversubscribe", "cpuset", "subnet",
        "masking", "coverage", "resample", "branch-scale", "report", "local-steps",
        "eval-branch-scale", "augment-crop", "augment-flip", "bn-calibration", "sample",
        "prompt", "temperature", "top-k", "context", "heads", "holdout", "val-bytes",
        "epoch-windows", "checkpoint", "init", "resume", "keep", "checkpoint-every", "usr1",
        "precision", "bf16-emulated", "comm-precision", "threads-per-worker",
        "team-spans-domains", "segments", "cuts", "synth-labels", "synth-scale", "synth-noise",
        "recovery-epochs", "train-scale", "optimizer-state", "neuron-group", "weights" };
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        char line[64];
        snprintf(line, sizeof line, "\n%s =", keys[i]);
        cr_assert(strstr(dump, line), "--dump-config lacks '%s': %s", keys[i], dump);
    }
    cr_assert(!strstr(dump, "\nhelp =") && !strstr(dump, "\nconfig =") &&
              !strstr(dump, "\ndump-config ="), "actions are not configuration: %s", dump);
}

/* --dump-config prints every option resolved and trains nothing; the run
 * it describes (sdp, C = 0.3 of 2 workers: k = 1, coverage 1/2, said in
 * the banner, a warning and the records) repeated from the dump and from
 * its metrics file gives the same records, losses and accuracy to the
 * printed digit; the command line wins over the file wherever it stands;
 * a metrics file is not overwritten by its own repetition. */
Test(cli, dumped_config_and_metrics_file_repeat_the_run_bitwise, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], a[ST_TEST_PATH_MAX], b[ST_TEST_PATH_MAX], c[ST_TEST_PATH_MAX],
        conf[ST_TEST_PATH_MAX], args[6 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(a, dir, "a.jsonl");
    st_test_path(b, dir, "b.jsonl");
    st_test_path(c, dir, "c.jsonl");
    st_test_path(conf, dir, "run.conf");
    const char *opts = "--data synthetic --model mlp --depth 2 --width 32 --batch 32 --steps 40 "
                       "--workers 2 --strategy sdp --subnet neuron --coverage 0.3 --resample 10 "
                       "--lr 0.003 --seed 5 --progress none";
    run_result *r = calloc(1, sizeof *r);
    snprintf(args, sizeof args, "%s --metrics '%s' --dump-config", opts, a);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert_str_empty(r->err);
    expect_every_key(r->out);
    const char *want[] = { "\ncoverage = 0.3\n", "\nsteps = 40\n", "\nepochs =\n",
                           "\nworkers = 2\n", "\nseed = 5\n", "\nlr = 0.003\n",
                           "\nwarmup =\n", "\nsegments =\n", "\noversubscribe = false\n" };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        cr_assert(strstr(r->out, want[i]), "no '%s' in: %s", want[i] + 1, r->out);
    cr_assert(!strstr(r->out, "final:"), "--dump-config trained: %s", r->out);
    cr_assert_neq(access(a, F_OK), 0, "--dump-config wrote the metrics file");
    cr_assert_eq(st_test_write_file(conf, r->out, strlen(r->out)), 0);

    snprintf(args, sizeof args, "%s --metrics '%s'", opts, a);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert(strstr(r->out, "coverage 1/2 = 0.5, requested 0.3"), "banner: %s", r->out);
    cr_assert_eq(count_lines(r->err), 1, "one warning: %s", r->err);
    cr_assert(strstr(r->err, "warning: --coverage 0.3 with 2 workers") &&
              strstr(r->err, "coverage is 1/2 = 0.5"), "%s", r->err);
    /* the command line before --config wins all the same */
    snprintf(args, sizeof args, "--metrics '%s' --config '%s'", b, conf);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    snprintf(args, sizeof args, "--config '%s' --metrics '%s'", a, c);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    char *ma = slurp(a), *mb = slurp(b), *mc = slurp(c);
    cr_assert_eq(count_lines(ma), 2, "an epoch record and the final one: %s", ma);
    cr_assert(strstr(ma, "\"coverage\":{\"requested\":0.3,\"holders\":1,\"workers\":2,"
                         "\"effective\":0.5}"), "%s", ma);
    expect_same_records(ma, mb, "dumped-configuration");
    expect_same_records(ma, mc, "metrics-file-configuration");
    cr_assert_eq(count_lines(mb), count_lines(ma));
    cr_assert_eq(count_lines(mc), count_lines(ma));
    /* its run record names it, the metrics file, as the run's: a
     * repetition that would write over it is refused */
    snprintf(args, sizeof args, "--config '%s'", a);
    expect_usage_error(args, "is the file --config reads");
    /* --steps on the command line replaces the file's steps; --epochs them */
    snprintf(args, sizeof args, "--steps 7 --config '%s' --dump-config", conf);
    run(r, NULL, args);
    cr_assert(strstr(r->out, "\nsteps = 7\n"), "%s", r->out);
    snprintf(args, sizeof args, "--config '%s' --epochs 2 --dump-config", conf);
    run(r, NULL, args);
    cr_assert(strstr(r->out, "\nepochs = 2\n") && strstr(r->out, "\nsteps =\n"), "%s", r->out);
    free(ma);
    free(mb);
    free(mc);
    free(r);
    st_test_rmdir(dir);
}

/* The configuration printed and read back prints the same, whatever the
 * strategy, model and data: every value reads back as itself (floats to
 * the bit, a prompt with a newline, quotes and '#' quoted). */
Test(cli, dump_config_reads_back_as_itself)
{
    char dir[ST_TEST_PATH_MAX], conf[ST_TEST_PATH_MAX], args[4 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(conf, dir, "c.conf");
    static const char gpt[] = "\xef\xbb\xbf# a gpt with a sample (after a byte order mark)\n"
                              "model = gpt\n  data = text:/no/corpus.txt\n"
                              "sample = 20\nprompt = \"<p>\\n\\\"x\\\" # kept\"\n"
                              "temperature = 0.35\n\nworkers = cores\n";
    cr_assert_eq(st_test_write_file(conf, gpt, strlen(gpt)), 0);
    char from_file[ST_TEST_PATH_MAX + 16];
    snprintf(from_file, sizeof from_file, "--config '%s'", conf);
    const char *const cases[] = {
        "--data synthetic",
        "--data synthetic --strategy sdp --workers 3 --coverage 0.7 --report memory,align=9 "
        "--branch-scale none --lr 3e-4 --weight-decay 0.1234567",
        "--data synthetic --strategy ist --model mlp --local-steps 7 --train-scale none "
        "--optimizer-state keep --epochs 3 --warmup 11 --cpuset 0",
        "--data synthetic --strategy synth --segments 3 --cuts 2,4 --synth-noise 0.25 "
        "--recovery-epochs 1 --workers 3 --oversubscribe --checkpoint /tmp/ck "
        "--checkpoint-every epoch",
        from_file,
    };
    run_result *r = calloc(1, sizeof *r), *again = calloc(1, sizeof *again);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(args, sizeof args, "%s --dump-config", cases[i]);
        run(r, NULL, args);
        cr_assert_eq(r->status, 0, "%s: %s", cases[i], r->err);
        expect_every_key(r->out);
        char copy[ST_TEST_PATH_MAX];
        st_test_path(copy, dir, "dump.conf");
        cr_assert_eq(st_test_write_file(copy, r->out, strlen(r->out)), 0);
        snprintf(args, sizeof args, "--config '%s' --dump-config", copy);
        run(again, NULL, args);
        cr_assert_eq(again->status, 0, "%s: %s", cases[i], again->err);
        cr_assert_str_eq(again->out, r->out, "%s: the dump read back differs", cases[i]);
    }
    cr_assert(strstr(r->out, "\nprompt = \"<p>\\n\\\"x\\\" # kept\"\n"), "%s", r->out);
    cr_assert(strstr(r->out, "\ntemperature = 0.35\n") && strstr(r->out, "\nworkers = cores\n") &&
              strstr(r->out, "\ncontext = 128\n") && strstr(r->out, "\nsegments =\n"), "%s",
              r->out);
    run(r, NULL, "--data synthetic --strategy synth --segments 3 --cuts 2,4 --workers 3 "
        "--dump-config");
    cr_assert(strstr(r->out, "\ncuts = 2,4\n") && strstr(r->out, "\ndepth = 5\n") &&
              strstr(r->out, "\ncontext =\n"), "%s", r->out);
    /* --weights: what the run has (ist's are private whatever is given) */
    static const char *const weights[][2] = {
        { "--data synthetic --workers 2", "\nweights = shared\n" },
        { "--data synthetic --workers 2 --weights private", "\nweights = private\n" },
        { "--data synthetic --strategy ist --workers 2", "\nweights = private\n" },
        { "--data synthetic --strategy sdp --masking backward", "\nweights = shared\n" },
    };
    for (size_t i = 0; i < sizeof weights / sizeof *weights; i++) {
        snprintf(args, sizeof args, "%s --dump-config", weights[i][0]);
        run(r, NULL, args);
        cr_assert(r->status == 0 && strstr(r->out, weights[i][1]), "%s: %s", weights[i][0],
                  r->out);
    }
    free(r);
    free(again);
    st_test_rmdir(dir);
}

/* --weights shared where the strategy's workers need their own weights:
 * a usage error naming the strategy as typed. */
Test(cli, weights_shared_only_where_the_strategy_can)
{
    expect_usage_error("--data synthetic --strategy ist --weights shared",
                       "--weights shared: --strategy ist keeps a private weight copy in each "
                       "worker (give --weights private, or leave --weights out)");
    expect_usage_error("--data synthetic --strategy localsgd --weights shared",
                       "--weights shared: --strategy localsgd keeps");
    expect_usage_error("--data synthetic --strategy sdp --weights shared",
                       "--weights shared: --strategy sdp --masking forward keeps");
    expect_usage_error("--data synthetic --weights both",
                       "--weights: unknown value 'both' (allowed: shared, private)");
}

/* A bad line gets the message its option gets on the command line, after
 * FILE:LINE; a missing file, an unknown or repeated key, a line without
 * '=', a metrics file without a run record, whose first line is not JSON
 * or names a key twice are refused (exit 2, one line), and so is a second
 * --config; topo and quad take no --config. */
Test(cli, config_file_errors_name_the_file_and_line)
{
    char dir[ST_TEST_PATH_MAX], conf[ST_TEST_PATH_MAX], args[4 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(conf, dir, "bad.conf");
    static const struct { const char *text, *needle; } bad[] = {
        { "# ok so far\n\ndepth = 2\nwidth = 12x\n", "bad.conf:4: --width: expected an integer" },
        { "model = cnn\n", "bad.conf:1: --model: unknown value 'cnn' (allowed: mlp" },
        { "depth = 2\nfrobnicate = 1\n", "bad.conf:2: unknown key 'frobnicate'" },
        { "depth 3\n", "bad.conf:1: expected 'key = value', got 'depth 3'" },
        { "depth = 3\n\ndepth = 4\n", "bad.conf:3: 'depth' is set twice (line 1" },
        { "oversubscribe = yes\n", "bad.conf:1: --oversubscribe: expected true or false" },
        { "help = true\n", "bad.conf:1: 'help' is not a configuration key" },
        { "prompt = \"open\n", "bad.conf:1: prompt: a quoted value" },
        { "strategy = dp\ncoverage = 1.5\n", "bad.conf:2: --coverage: expected a number" },
        { "{\"epoch\":1,\"final\":true}\n", "bad.conf:1: the first record has no \"run\"" },
        { "{\"run\":{\"config\":{\"depth\":\"0\"}}}\n", "bad.conf:1: --depth: expected an" },
        { "{\"run\":{\"config\":{\"depth\":\"3\"}}\n", "bad.conf:1: not a JSON record" },
        { "{\"run\":{\"config\":{\"depth\":\"3\",\"depth\":\"4\"}}}\n",
          "bad.conf:1: a key twice in one object near '\"depth\"'" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(st_test_write_file(conf, bad[i].text, strlen(bad[i].text)), 0);
        snprintf(args, sizeof args, "--data synthetic --config '%s'", conf);
        expect_usage_error(args, bad[i].needle);
    }
    expect_usage_error("--config /nonexistent/run.conf",
                       "--config /nonexistent/run.conf: cannot read it");
    /* a second file would replace the first's options without a word */
    cr_assert_eq(st_test_write_file(conf, "depth = 3\n", 10), 0);
    snprintf(args, sizeof args, "--data synthetic --config '%s' --config '%s' --dump-config",
             conf, conf);
    expect_usage_error(args, "--config given twice (");
    expect_usage_error("topo --config x.conf", "unknown option '--config'");
    expect_usage_error("quad --config x.conf", "unknown option '--config'");
    st_test_rmdir(dir);
}

/* A split is refused where it cannot be dealt: text (before the data),
 * synth, classes nobody holds once the data's classes are known (still a
 * usage error); a split run names it in its banner and its first record
 * holds the class histogram per worker. */
Test(cli, splits_are_checked_named_and_recorded, .timeout = 60)
{
    expect_usage_error("--model gpt --data text:/nonexistent --split classes:2",
                       "--split classes:2: text data has no classes to split by");
    expect_usage_error("--data synthetic --strategy synth --split dirichlet:0.5",
                       "--split dirichlet:0.5 does not apply to --strategy synth");
    expect_usage_error("--data synthetic --workers 2 --split classes:4 --steps 1",
                       "--split classes:4 with 2 workers holds 8 of the data's 10 classes: "
                       "workers x K must be at least 10");
    char dir[ST_TEST_PATH_MAX], m[ST_TEST_PATH_MAX], args[4 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(m, dir, "m.jsonl");
    snprintf(args, sizeof args, "--data synthetic --model mlp --depth 1 --width 16 --batch 32 "
             "--steps 4 --workers 2 --oversubscribe --split classes:5 --progress plain "
             "--metrics '%s'", m);
    run_result *r = calloc(1, sizeof *r);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert(strstr(r->out, " 10 classes, split classes:5) | dp, 2 workers"), "%s", r->out);
    char *s = slurp(m);
    const char *first_end = strchr(s, '\n'), *split = strstr(s, "\"split\":{\"spec\":");
    cr_assert(split && split < first_end, "%s", s);
    /* the synthetic set's classes, as its teacher labels them, wholly to
     * worker 0 (0..4) or 1 (5..9) */
    const char *head = "\"split\":{\"spec\":\"classes:5\",\"classes\":10,\"histogram\":[[";
    cr_assert(strncmp(split, head, strlen(head)) == 0, "%.200s", split);
    cr_assert(strstr(split, ",0,0,0,0,0],[0,0,0,0,0,") && strstr(split, "]]}},\"epoch\":1,"),
              "%.200s", split);
    cr_assert_eq(count_of(s, "\"split\":{"), 1, "in the first record only: %s", s);
    free(s);
    free(r);
    st_test_rmdir(dir);
}


/* The first record of a run says what made it (its configuration, the
 * versions, the machine, each worker's PUs and NUMA node, the seed, the
 * start time); the records after it do not repeat it; a resumed run
 * appending to the file starts its records with its own. */
Test(cli, first_record_holds_the_run_provenance, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], m[ST_TEST_PATH_MAX], ck[ST_TEST_PATH_MAX],
        args[6 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(m, dir, "m.jsonl");
    st_test_path(ck, dir, "ck");
    /* 16384 / (2 x 32) = 256 steps an epoch: 300 steps are two records and a
     * final one */
    const char *opts = "--data synthetic --model mlp --depth 1 --width 16 --batch 32 "
                       "--steps 300 --workers 2 --seed 7 --progress none";
    run_result *r = calloc(1, sizeof *r);
    snprintf(args, sizeof args, "%s --metrics '%s' --checkpoint '%s' --checkpoint-every 100",
             opts, m, ck);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    char *s = slurp(m);
    cr_assert_eq(count_lines(s), 3, "%s", s);
    cr_assert(strncmp(s, "{\"run\":{\"config\":{\"data\":\"synthetic\",", 37) == 0, "%s", s);
    cr_assert_eq(count_of(s, "\"run\":"), 1, "only the first record: %s", s);
    const char *want[] = { "\"seed\":\"7\"", "\"steps\":\"300\"", "\"epochs\":\"\"",
                           "\"version\":\"", "\"git\":", "\"onednn\":{\"version\":\"",
                           "\"isa\":\"", "\"hwloc\":\"", "\"machine\":{\"cpu\":", "\"cores\":",
                           "\"pus\":", "\"numa\":",
                           "\"placement\":[{\"worker\":0,\"rank\":0,\"pus\":\"",
                           "},{\"worker\":1,\"rank\":0,\"pus\":\"", "\"seed\":7,",
                           "\"start_time\":\"" };
    const char *first_end = strchr(s, '\n');
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const char *at = strstr(s, want[i]);
        cr_assert(at && at < first_end, "the first record lacks %s: %.*s", want[i],
                  (int)(first_end - s), s);
    }
    /* ISO 8601, UTC: 2025-01-31T12:34:56Z */
    const char *t = strstr(s, "\"start_time\":\"") + 14;
    cr_assert(strlen(t) > 21 && t[4] == '-' && t[7] == '-' && t[10] == 'T' && t[13] == ':' &&
              t[16] == ':' && t[19] == 'Z' && t[20] == '"', "start_time %.24s", t);
    /* the run record is what the records continue: "run":{...},"epoch":1 */
    cr_assert(strstr(s, "\"},\"epoch\":1,\"step\":256,"), "%.*s", (int)(first_end - s), s);
    free(s);

    snprintf(args, sizeof args, "%s --metrics '%s' --checkpoint '%s' --resume "
             "'%s/step-00000100.safetensors'", opts, m, ck, ck);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    s = slurp(m);
    cr_assert_eq(count_lines(s), 6, "the resumed run's epochs 1, 2 and final appended: %s", s);
    cr_assert_eq(count_of(s, "\"run\":"), 2, "%s", s);
    const char *second = strstr(strstr(s, "\"final\":true"), "\n") + 1;
    cr_assert(strncmp(second, "{\"run\":{\"config\":{", 18) == 0, "%s", second);
    cr_assert(strstr(second, "\"resume\":\""), "the resumed run's config names it: %s", second);
    free(s);
    free(r);
    st_test_rmdir(dir);
}

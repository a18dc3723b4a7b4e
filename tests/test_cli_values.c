/*
 * tests/test_cli_values.c — the values a user types, as every command
 * reads them and as its messages show them: one syntax for every number
 * (train, eval, topo, quad, a configuration file, SLURM_CPUS_PER_TASK),
 * the range checked on the value kept, and a message that quotes the
 * text typed, escaped and cut in its middle when long, on one line.
 *
 * Every case is a usage error (or a missing file) found before any data
 * loads: milliseconds each.
 */
#include "cli_run.h"

#include <criterion/criterion.h>

/* Whether s is valid UTF-8 (no overlong form, surrogate or code point
 * past U+10FFFF). */
static int valid_utf8(const unsigned char *s)
{
    while (*s) {
        unsigned cp, min;
        int len;
        if (*s < 0x80) {
            s++;
            continue;
        }
        if ((*s & 0xe0) == 0xc0)
            len = 2, cp = *s & 0x1fu, min = 0x80;
        else if ((*s & 0xf0) == 0xe0)
            len = 3, cp = *s & 0x0fu, min = 0x800;
        else if ((*s & 0xf8) == 0xf0)
            len = 4, cp = *s & 0x07u, min = 0x10000;
        else
            return 0;
        for (int k = 1; k < len; k++) {
            if ((s[k] & 0xc0) != 0x80)
                return 0;
            cp = cp << 6 | (s[k] & 0x3fu);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000))
            return 0;
        s += len;
    }
    return 1;
}

/* Runs the command; it must exit `status` with one line on stderr that
 * holds `needle`, no control byte but its newline, and valid UTF-8. */
static void expect_line(run_result *r, const char *env, const char *args, int status,
                        const char *needle)
{
    run(r, env, args);
    cr_assert_eq(r->status, status, "'%s' exited %d (stderr: %s)", args, r->status, r->err);
    cr_assert_eq(count_lines(r->err), 1, "'%s' printed: %s", args, r->err);
    cr_assert(strncmp(r->err, "subtrain", 8) == 0, "%s", r->err);
    const size_t len = strlen(r->err);
    cr_assert_eq(r->err[len - 1], '\n', "%s", r->err);
    for (size_t k = 0; k + 1 < len; k++)
        cr_assert((unsigned char)r->err[k] >= 0x20 && r->err[k] != 0x7f,
                  "'%s': a raw control byte 0x%02x at %zu: %s", args,
                  (unsigned char)r->err[k], k, r->err);
    cr_assert(valid_utf8((const unsigned char *)r->err), "'%s': not UTF-8: %s", args, r->err);
    cr_assert(strstr(r->err, needle), "'%s': expected '%s' in: %s", args, needle, r->err);
}

/* A configuration file holding `text`, its path into conf. */
static void write_conf(const char *dir, const char *text, char *conf)
{
    st_test_path(conf, dir, "v.conf");
    cr_assert_eq(st_test_write_file(conf, text, strlen(text)), 0);
}

/* A value that is no float's: 1e-300 is no learning rate, but as a float
 * it is 0, which the range refuses; the option's own message says so with
 * the text typed, on the command line as in a configuration file. */
Test(values, tiny_numbers_are_refused_by_their_own_range)
{
    static const struct { const char *args, *needle; } bad[] = {
        { "--lr 1e-300", "subtrain: --lr: expected a number in (0, 100], got '1e-300'" },
        { "--lr 1e-46", "--lr: expected a number in (0, 100], got '1e-46'" },
        { "--lr 1e-400", "--lr: expected a number in (0, 100], got '1e-400'" },
        { "--lr 1e39", "--lr: expected a number in (0, 100], got '1e39'" },
        { "--lr 1e400", "--lr: expected a number in (0, 100], got '1e400'" },
        { "--strategy sdp --coverage 1e-300", "--coverage: expected a number in (0, 1], got "
                                              "'1e-300'" },
        { "--strategy synth --synth-scale 1e-300", "--synth-scale: expected a number in (0, "
                                                   "1000], got '1e-300'" },
        { "--model gpt --data text:/x --holdout 1e-300", "--holdout: expected a fraction in "
                                                         "(0, 1), got '1e-300'" },
        /* rounds to 1 as a float */
        { "--model gpt --data text:/x --holdout 0.99999999", "--holdout: expected a fraction "
                                                             "in (0, 1), got '0.99999999'" },
        { "--momentum 0.99999999", "--momentum: expected a number in [0, 1), got "
                                   "'0.99999999'" },
        { "--weight-decay 10.000001", "--weight-decay: expected a number in [0, 10], got "
                                      "'10.000001'" },
        { "--temperature 1e39 --model gpt --data text:/x --sample 1",
          "--temperature: expected a number in [0, 1000], got '1e39'" },
        { "quad --gamma 1e-400", "subtrain quad: --gamma: expected a number in (0, 2), got "
                                 "'1e-400'" },
        /* decimal numbers only */
        { "--lr ' 0.1'", "--lr: expected a number in (0, 100], got ' 0.1'" },
        { "--lr '0.1 '", "--lr: expected a number in (0, 100], got '0.1 '" },
        { "--lr +0.1", "--lr: expected a number in (0, 100], got '+0.1'" },
        { "--lr 0x1p-3", "--lr: expected a number in (0, 100], got '0x1p-3'" },
        { "--lr inf", "--lr: expected a number in (0, 100], got 'inf'" },
        { "--lr 1e", "--lr: expected a number in (0, 100], got '1e'" },
        { "--lr .", "--lr: expected a number in (0, 100], got '.'" },
        { "--weight-decay -0", "--weight-decay: expected a number in [0, 10], got '-0'" },
        { "quad --gamma ' 1'", "subtrain quad: --gamma: expected a number in (0, 2), got ' 1'" },
    };
    run_result *r = calloc(1, sizeof *r);
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        expect_line(r, NULL, bad[k].args, 2, bad[k].needle);
        cr_assert_null(strstr(r->err, "got 0\n"), "%s", r->err);
    }
    char dir[ST_TEST_PATH_MAX], conf[ST_TEST_PATH_MAX], args[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    static const struct { const char *text, *needle; } file[] = {
        { "lr = 1e-300\n", "v.conf:1: --lr: expected a number in (0, 100], got '1e-300'" },
        { "strategy = sdp\ncoverage = 1e-300\n", "v.conf:2: --coverage: expected a number in "
                                                 "(0, 1], got '1e-300'" },
        { "{\"run\":{\"config\":{\"lr\":\"1e-300\"}}}\n", "v.conf:1: --lr: expected a number "
                                                        "in (0, 100], got '1e-300'" },
    };
    for (size_t k = 0; k < sizeof file / sizeof *file; k++) {
        write_conf(dir, file[k].text, conf);
        snprintf(args, sizeof args, "--data synthetic --config '%s'", conf);
        expect_line(r, NULL, args, 2, file[k].needle);
    }
    st_test_rmdir(dir);
    /* what the range holds, as the float kept, is taken */
    static const struct { const char *args, *line; } good[] = {
        { "--lr 100", "\nlr = 100\n" },
        { "--lr 1e-3", "\nlr = 0.001\n" },
        { "--momentum 0", "\nmomentum = 0\n" },
        { "--momentum 0.9999999", "\nmomentum = 0.9999999\n" },
        { "--strategy sdp --coverage 1", "\ncoverage = 1\n" },
        { "--weight-decay 1E-2", "\nweight-decay = 0.01\n" },
    };
    for (size_t k = 0; k < sizeof good / sizeof *good; k++) {
        snprintf(args, sizeof args, "--data synthetic %s --dump-config", good[k].args);
        run(r, NULL, args);
        cr_assert_eq(r->status, 0, "'%s': %s", args, r->err);
        cr_assert(strstr(r->out, good[k].line), "'%s' dumped: %s", args, r->out);
    }
    free(r);
}

/* Every integer, of every command and source, is decimal digits in the
 * range its message states: no blanks, no sign (none of them takes a
 * negative), not empty, no overflow. */
Test(values, integers_are_plain_digits_everywhere)
{
    static const struct { const char *opts, *range; } ints[] = {
        { "--depth", "subtrain: --depth: expected an integer in [1, 1024], got '" },
        { "--keep", "subtrain: --keep: expected an integer in [0, 1000000], got '" },
        { "--seed", "subtrain: --seed: expected an integer in [0, 18446744073709551615], got '" },
        { "--steps", "subtrain: --steps: expected an integer in [1, 1000000000], got '" },
        { "--workers", "subtrain: --workers: expected an integer in [1, 4096] or 'cores', "
                       "got '" },
        { "--strategy sdp --report align=", "subtrain: --report align=N: expected an integer "
                                            "in [1, 1000000000], got '" },
        { "--strategy synth --cuts", "subtrain: --cuts: expected increasing layer numbers "
                                     "such as 2,4, got '" },
        { "eval --init x.safetensors --batch", "subtrain: --batch: expected an integer in "
                                               "[1, 65536], got '" },
        { "topo --workers", "subtrain topo: --workers: expected an integer in [1, 65536], "
                            "got '" },
        { "topo --ranks", "subtrain topo: --ranks: expected an integer in [1, 65535], got '" },
        { "topo --threads-per-worker", "subtrain topo: --threads-per-worker: expected an "
                                       "integer in [1, 1024], got '" },
        { "topo --params", "subtrain topo: --params: expected an integer in [1, "
                           "1000000000000], got '" },
        { "quad --iters", "subtrain quad: --iters: expected an integer in [1, 10000000], "
                          "got '" },
        { "quad --seed", "subtrain quad: --seed: expected an integer in [0, "
                         "18446744073709551615], got '" },
    };
    static const char *const bad[] = { " 2", "2 ", "+2", "-0", "-2", "", "0x2", "2.0", "1e2",
                                       "99999999999999999999" };
    run_result *r = calloc(1, sizeof *r);
    for (size_t k = 0; k < sizeof ints / sizeof *ints; k++)
        for (size_t b = 0; b < sizeof bad / sizeof *bad; b++) {
            char args[256], needle[256];
            const char *o = ints[k].opts;
            snprintf(args, sizeof args, "%s%s'%s'", o, o[strlen(o) - 1] == '=' ? "" : " ",
                     bad[b]);
            snprintf(needle, sizeof needle, "%s%s'", ints[k].range, bad[b]);
            expect_line(r, NULL, args, 2, needle);
        }
    /* 0 is no worker count for topo as for train */
    expect_line(r, NULL, "topo --workers 0", 2,
                "subtrain topo: --workers: expected an integer in [1, 65536], got '0'");
    expect_line(r, NULL, "--workers 0", 2,
                "subtrain: --workers: expected an integer in [1, 4096] or 'cores', got '0'");
    /* a configuration file's values, bare or quoted */
    char dir[ST_TEST_PATH_MAX], conf[ST_TEST_PATH_MAX], args[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    static const struct { const char *text, *needle; } file[] = {
        { "keep = -0\n", "v.conf:1: --keep: expected an integer in [0, 1000000], got '-0'" },
        { "depth = +2\n", "v.conf:1: --depth: expected an integer in [1, 1024], got '+2'" },
        { "depth = \" 2\"\n", "v.conf:1: --depth: expected an integer in [1, 1024], got ' 2'" },
        { "depth = \"2 \"\n", "v.conf:1: --depth: expected an integer in [1, 1024], got '2 '" },
        { "seed = 0x10\n", "v.conf:1: --seed: expected an integer in [0, "
                           "18446744073709551615], got '0x10'" },
    };
    for (size_t k = 0; k < sizeof file / sizeof *file; k++) {
        write_conf(dir, file[k].text, conf);
        snprintf(args, sizeof args, "--data synthetic --config '%s'", conf);
        expect_line(r, NULL, args, 2, file[k].needle);
    }
    st_test_rmdir(dir);
    /* SLURM_CPUS_PER_TASK, for train and topo alike */
    static const char *const slurm[] = { " 2", "2 ", "+2", "-0", "0", "99999999999999999999" };
    for (size_t k = 0; k < sizeof slurm / sizeof *slurm; k++) {
        char env[64], needle[128];
        snprintf(env, sizeof env, "SLURM_CPUS_PER_TASK='%s'", slurm[k]);
        snprintf(needle, sizeof needle, "SLURM_CPUS_PER_TASK='%s': expected a CPU count, an "
                 "integer in [1, 65536]", slurm[k]);
        expect_line(r, env, "--data synthetic --workers cores --steps 1", 2, needle);
        expect_line(r, env, "topo", 2, needle);
    }
    /* digits are taken, leading zeros too */
    run(r, NULL, "--data synthetic --depth 007 --keep 0 --dump-config");
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert(strstr(r->out, "\ndepth = 7\n") && strstr(r->out, "\nkeep = 0\n"), "%s", r->out);
    run(r, NULL, "topo --topology 'synthetic:pack:1 core:2 pu:1' --workers 2 --ranks 1");
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert(strstr(r->out, ": 2 workers on 1 NUMA domain"), "%s", r->out);
    free(r);
}

/* A long value keeps its start and its end around "[...]" (doc/cli.md),
 * whichever message quotes it, so the line still ends with its closing
 * quote and what is allowed; a cut never splits a UTF-8 character. */
Test(values, long_values_keep_their_ends_and_what_is_allowed)
{
    /* START, 500 two-byte characters, END: 1008 bytes */
    char v[1100] = "START";
    for (int k = 0; k < 500; k++)
        strcat(v, "\xc3\xa9");
    strcat(v, "END");
    static const struct { const char *args, *before, *after; } c[] = {
        { "--progress '%s'", "--progress: unknown value '", "' (allowed: auto, bar, plain, "
                                                             "none)\n" },
        { "--model '%s'", "--model: unknown value '", "' (allowed: mlp, resmlp, resnet, "
                                                      "resnet18, gpt, convnet, vit)\n" },
        { "--strategy sdp --branch-scale '%s'", "--branch-scale: unknown value '",
          "' (allowed: none, inverse-coverage)\n" },
        { "--report 'memory,%s'", "--report: unknown value '", "' (allowed: memory, align, "
                                                               "align=N)\n" },
        { "--usr1 '%s'", "--usr1: expected 'stop' or 'checkpoint', got '", "'\n" },
        { "--split 'classes:%s'", "--split classes:START", ": K, the classes per worker, must "
                                                           "be a whole number in [1, 256]\n" },
        { "--split '%s'", "--split START", ": expected iid, classes:K or dirichlet:ALPHA\n" },
        { "--depth '%s'", "--depth: expected an integer in [1, 1024], got '", "'\n" },
        { "--lr '%s'", "--lr: expected a number in (0, 100], got '", "'\n" },
        { "--workers '%s'", "--workers: expected an integer in [1, 4096] or 'cores', got '",
          "'\n" },
        { "--checkpoint x --checkpoint-every '%s'", "--checkpoint-every: expected a number of "
          "steps in [1, 1099511627776] or 'epoch', got '", "'\n" },
        { "--strategy synth --cuts '2,%s'", "--cuts: expected increasing layer numbers such "
                                            "as 2,4, got '2,", "'\n" },
        { "--data 'idx:/d:%s,b,c'", "expected four file names", ",b,c'\n" },
        { "'--%s'", "unknown option '--", "' (see subtrain --help)\n" },
        { "'--quiet=%s'", "option '--quiet=", "' takes no value (see subtrain --help)\n" },
        { "train '%s'", "unexpected argument '", "' (usage: subtrain [train] [OPTION]...)\n" },
        { "topo --workers '%s'", "subtrain topo: --workers: expected an integer in [1, 65536], "
                                 "got '", "'\n" },
        { "topo '%s'", "subtrain topo: unexpected argument '", "' (usage: subtrain topo "
                                                               "[OPTION]...)\n" },
        { "quad '%s'", "subtrain quad: unexpected argument '", "' (usage: subtrain quad "
                                                               "[OPTION]...)\n" },
        { "quad --case '%s'", "subtrain quad: --case: expected all, 1, 2, 3, 4, 5 or 6, got '",
          "'\n" },
        { "quad --gamma '%s'", "subtrain quad: --gamma: expected a number in (0, 2), got '",
          "'\n" },
    };
    run_result *r = calloc(1, sizeof *r);
    char args[2 * ST_TEST_PATH_MAX];
    for (size_t k = 0; k < sizeof c / sizeof *c; k++) {
        snprintf(args, sizeof args, c[k].args, v);
        expect_line(r, NULL, args, 2, c[k].before);
        cr_assert(strstr(r->err, "START\xc3\xa9") && strstr(r->err, "[...]\xc3\xa9"),
                  "'%.40s...': the start, [...], the end: %s", args, r->err);
        const size_t len = strlen(r->err), tail = strlen(c[k].after);
        cr_assert(len < 512, "'%.40s...': %zu bytes: %s", args, len, r->err);
        cr_assert(len > tail + 3 && strcmp(r->err + len - tail, c[k].after) == 0 &&
                  strncmp(r->err + len - tail - 3, "END", 3) == 0,
                  "'%.40s...': expected the value's end, then '%s': %s", args, c[k].after,
                  r->err);
    }
    /* a value far longer than a message shows: 1100 bytes of --progress */
    char x[1101];
    memset(x, 'x', 1100);
    x[1100] = '\0';
    snprintf(args, sizeof args, "--progress %s", x);
    expect_line(r, NULL, args, 2, "x[...]x");
    const char *end = "x' (allowed: auto, bar, plain, none)\n";
    cr_assert_str_eq(r->err + strlen(r->err) - strlen(end), end, "%s", r->err);
    /* a configuration file's key and value, its path, SLURM_CPUS_PER_TASK */
    char dir[ST_TEST_PATH_MAX], conf[ST_TEST_PATH_MAX], text[1200];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    snprintf(text, sizeof text, "progress = %s\n", v);
    write_conf(dir, text, conf);
    snprintf(args, sizeof args, "--data synthetic --config '%s'", conf);
    expect_line(r, NULL, args, 2, "v.conf:1: --progress: unknown value 'START");
    cr_assert(strstr(r->err, "[...]\xc3\xa9") &&
              strstr(r->err, "END' (allowed: auto, bar, plain, none)\n"), "%s", r->err);
    snprintf(text, sizeof text, "%s = 1\n", v);
    write_conf(dir, text, conf);
    expect_line(r, NULL, args, 2, "v.conf:1: unknown key 'START");
    cr_assert(strstr(r->err, "END' (keys are the long options"), "%s", r->err);
    st_test_rmdir(dir);
    snprintf(args, sizeof args, "--config '/nonexistent/%s'", v);
    expect_line(r, NULL, args, 2, "--config /nonexistent/START");
    cr_assert(strstr(r->err, "[...]") && strstr(r->err, "END: cannot read it: "), "%s", r->err);
    char env[1200];
    snprintf(env, sizeof env, "SLURM_CPUS_PER_TASK='%s'", v);
    expect_line(r, env, "topo", 2, "SLURM_CPUS_PER_TASK='START");
    cr_assert(strstr(r->err, "END': expected a CPU count, an integer in [1, 65536]\n"), "%s",
              r->err);
    free(r);
}

/* Control bytes and bytes that are not UTF-8 are shown escaped (\r, \n,
 * \xNN), whichever message echoes them; valid UTF-8 shows as it is. */
Test(values, control_bytes_and_bad_utf8_are_escaped)
{
    run_result *r = calloc(1, sizeof *r);
    expect_line(r, NULL, "--progress \"$(printf 'a\\001b\\377c\\303\\251')\"", 2,
                "--progress: unknown value 'a\\x01b\\xffc\xc3\xa9' (allowed:");
    expect_line(r, NULL, "\"--$(printf '\\033[31m')\"", 2, "unknown option '--\\x1b[31m'");
    expect_line(r, NULL, "--depth \"$(printf '2\\r\\tjunk\\177')\"", 2,
                "--depth: expected an integer in [1, 1024], got '2\\r\\tjunk\\x7f'");
    expect_line(r, NULL, "topo --topology \"$(printf 'synthetic:pack:2\\rx')\"", 2,
                "'pack:2\\rx'");
    expect_line(r, NULL, "quad --csv \"$(printf '/nonexistent/\\033[31mq.csv')\" --case 4", 1,
                "subtrain quad: --csv /nonexistent/\\x1b[31mq.csv: cannot create "
                "/nonexistent/\\x1b[31mq.csv.tmp.");
    /* paths in run-time messages, the library's and the command's */
    expect_line(r, NULL, "--data \"$(printf '/nonexistent/a\\rb')\"", 1,
                "not found in /nonexistent/a\\rb (missing");
    expect_line(r, NULL, "--data synthetic --steps 1 --metrics \"$(printf '/nonexistent/m\\nx')\"",
                1, "cannot write the metrics file '/nonexistent/m\\nx': ");
    char dir[ST_TEST_PATH_MAX], conf[ST_TEST_PATH_MAX], args[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    static const struct { const char *text, *needle; } file[] = {
        { "depth = 2\rjunk\n", "v.conf:1: --depth: expected an integer in [1, 1024], got "
                               "'2\\rjunk'" },
        { "de\xffpth = 2\n", "v.conf:1: unknown key 'de\\xffpth'" },
        { "progress = a\x01" "b\n", "v.conf:1: --progress: unknown value 'a\\x01b'" },
        { "progress = \"a\\x1b[2Jb\"\n", "v.conf:1: --progress: unknown value 'a\\x1b[2Jb'" },
        { "dep\x7fth 2\n", "v.conf:1: expected 'key = value', got 'dep\\x7fth 2'" },
        { "{\"run\":{\"config\":{\"pr\\u0007ogress\":\"x\"}}}\n",
          "v.conf:1: unknown key 'pr\\x07ogress'" },
        { "model = r\xc3\xa9smlp\n", "v.conf:1: --model: unknown value 'r\xc3\xa9smlp'" },
    };
    for (size_t k = 0; k < sizeof file / sizeof *file; k++) {
        write_conf(dir, file[k].text, conf);
        snprintf(args, sizeof args, "--data synthetic --config '%s'", conf);
        expect_line(r, NULL, args, 2, file[k].needle);
    }
    st_test_rmdir(dir);
    free(r);
}

/* An option where a value belongs (`--metrics --quiet`, an abbreviation,
 * a bundle of short options, `--`) was a forgotten value: refused, naming
 * both, in every command (a file named --quiet was written, or the next
 * option was lost); the --NAME=VALUE form still gives any value, and a
 * negative number is a value. */
Test(values, an_option_is_not_taken_as_a_value)
{
    const struct { const char *args, *needle; } bad[] = {
        { "--data synthetic --metrics --quiet", "option '--metrics' needs a value, and "
                                                "'--quiet' is an option (write "
                                                "--metrics=--quiet for that value" },
        { "--data synthetic --metrics -q", "option '--metrics' needs a value, and '-q' is an "
                                           "option" },
        { "--data synthetic --checkpoint --steps 5", "option '--checkpoint' needs a value, "
                                                     "and '--steps' is an option" },
        { "topo --topology --workers 2", "option '--topology' needs a value, and '--workers' "
                                         "is an option" },
        { "quad --csv --case 1", "option '--csv' needs a value, and '--case' is an option" },
        { "plan --memory-per-worker 1G --json --workers 2", "--json needs a value, and "
                                                            "'--workers' is an option" },
        { "plan --memory-per-worker 1G --json -q", "--json needs a value, and '-q' is an "
                                                   "option" },
        /* as getopt reads them: an abbreviation, a bundle, the end of the options */
        { "--data synthetic --metrics --quie", "and '--quie' is an option" },
        { "--data synthetic --metrics -qV", "and '-qV' is an option" },
        { "export --data synthetic --init x -o --", "and '--' is an option" },
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++)
        expect_usage_error(bad[k].args, bad[k].needle);
    run_result *r = calloc(1, sizeof *r);
    run(r, NULL, "--data synthetic --metrics=--quiet --dump-config");
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert(strstr(r->out, "metrics = --quiet\n"), "%s", r->out);
    free(r);
    expect_usage_error("--data synthetic --lr -1", "--lr: expected a number in (0, 100], got "
                                                   "'-1'");
}

/*
 * tests/cli_run.h — running the `subtrain` command as a user would, for
 * the suites that test the program itself (test_cli.c and its siblings).
 *
 * The program under test is $SUBTRAIN_BIN (set by `make check`).
 */
#ifndef SUBTRAIN_TESTS_CLI_RUN_H
#define SUBTRAIN_TESTS_CLI_RUN_H

#include "testutil.h"
#include "json_check.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <criterion/criterion.h>

typedef struct run_result {
    int status;           /* exit status, or -1 if killed by a signal */
    char out[32768];      /* --help's whole text */
    char err[4096];
} run_result;

static inline void read_into(const char *path, char *buf, size_t n)
{
    size_t len = 0;
    unsigned char *data = st_test_read_file(path, &len);
    buf[0] = '\0';
    if (!data)
        return;
    if (len >= n)
        len = n - 1;
    memcpy(buf, data, len);
    buf[len] = '\0';
    free(data);
}

/* Runs "$SUBTRAIN_BIN args" through the shell with `env` prepended. */
static inline void run(run_result *r, const char *env, const char *args)
{
    const char *bin = getenv("SUBTRAIN_BIN");
    cr_assert(bin && *bin, "SUBTRAIN_BIN is not set: run the tests with make check");
    char dir[ST_TEST_PATH_MAX], out[ST_TEST_PATH_MAX], err[ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(out, dir, "out");
    st_test_path(err, dir, "err");
    char cmd[6 * ST_TEST_PATH_MAX];
    snprintf(cmd, sizeof cmd, "%s '%s' %s >'%s' 2>'%s' </dev/null", env ? env : "", bin, args,
             out, err);
    int w = system(cmd);
    r->status = WIFEXITED(w) ? WEXITSTATUS(w) : -1;
    read_into(out, r->out, sizeof r->out);
    read_into(err, r->err, sizeof r->err);
    st_test_rmdir(dir);
}

static inline int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/* Every line of a metrics file is one valid JSON value (json_check.h). */
static inline void expect_json_lines(const char *text)
{
    char line[8192];
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        cr_assert_not_null(nl, "the last record ends its line: %s", p);
        cr_assert_lt((size_t)(nl - p), sizeof line);
        memcpy(line, p, (size_t)(nl - p));
        line[nl - p] = '\0';
        cr_assert(st_json_valid(line), "not JSON: %s", line);
        p = nl + 1;
    }
}

/* Usage errors: exit 2, exactly one line on stderr naming the problem. */
static inline void expect_usage_error(const char *args, const char *needle)
{
    run_result *r = calloc(1, sizeof *r);
    run(r, NULL, args);
    cr_assert_eq(r->status, 2, "'%s' exited %d (stderr: %s)", args, r->status, r->err);
    cr_assert_eq(count_lines(r->err), 1, "'%s' printed: %s", args, r->err);
    cr_assert(strncmp(r->err, "subtrain", 8) == 0, "%s", r->err); /* "subtrain[ cmd]: " */
    cr_assert(strstr(r->err, needle), "'%s': expected '%s' in: %s", args, needle, r->err);
    cr_assert_str_empty(r->out, "nothing on stdout for a usage error");
    free(r);
}

/* Runtime errors: exit 1, one line. */
static inline void expect_runtime_error(const char *env, const char *args, const char *needle)
{
    run_result *r = calloc(1, sizeof *r);
    run(r, env, args);
    cr_assert_eq(r->status, 1, "'%s' exited %d (stderr: %s)", args, r->status, r->err);
    cr_assert_eq(count_lines(r->err), 1, "'%s' printed: %s", args, r->err);
    cr_assert(strstr(r->err, needle), "'%s': expected '%s' in: %s", args, needle, r->err);
    free(r);
}

/* The environment (for run()'s `env`) of a run over two NUMA domains of
 * one core each, on a machine of one domain and two PUs or more: hwloc's
 * synthetic topology taken for this system (HWLOC_THISSYSTEM=1), so the
 * run places, pins and plans its workers as on a 2-socket node (PUs 0
 * and 1; memory on a node that is not there is bound loosely or not at
 * all, with a warning). */
static inline const char *two_domains_env(void)
{
    return "HWLOC_THISSYSTEM=1 HWLOC_SYNTHETIC='pack:1 numa:2 core:1 pu:1'";
}

/* dir/corpus.txt, about 8 KiB of "the cat sat on a mat." in a fixed
 * order, for a tiny gpt run (--data text:PATH); its path into path. */
static inline void write_cat_corpus(char *path, const char *dir)
{
    static const char *const words[] = { "the ", "cat ", "sat ", "on ", "a ", "mat.\n" };
    char corpus[8192];
    size_t len = 0;
    for (unsigned i = 0; len + 8 < sizeof corpus; i = i * 5 + 3)
        len += (size_t)snprintf(corpus + len, sizeof corpus - len, "%s", words[i % 6]);
    cr_assert_eq(st_test_write_file(st_test_path(path, dir, "corpus.txt"), corpus, len), 0);
}

/* Whether two files hold the same bytes. */
static inline int same_file(const char *a, const char *b)
{
    size_t na = 0, nb = 0;
    unsigned char *x = st_test_read_file(a, &na), *y = st_test_read_file(b, &nb);
    int same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

/* An IDX file of unsigned bytes, dir/name: rank dims, then count bytes of
 * payload (the data a run reads with --data idx:DIR). */
static inline void write_idx_file(const char *dir, const char *name, int rank,
                                  const uint32_t *dims, const unsigned char *payload,
                                  size_t count)
{
    char path[ST_TEST_PATH_MAX];
    unsigned char *buf = malloc(4 + 4 * (size_t)rank + count);
    cr_assert_not_null(buf);
    buf[0] = buf[1] = 0;
    buf[2] = 0x08;
    buf[3] = (unsigned char)rank;
    for (int i = 0; i < rank; i++)
        for (int b = 0; b < 4; b++)
            buf[4 + 4 * i + b] = (unsigned char)(dims[i] >> (24 - 8 * b));
    memcpy(buf + 4 + 4 * rank, payload, count);
    size_t len = 4 + 4 * (size_t)rank + count;
    cr_assert_eq(st_test_write_file(st_test_path(path, dir, name), buf, len), 0);
    free(buf);
}

/* An IDX set of 8 x 8 images under the test's own names (tr-img, tr-lab,
 * te-img, te-lab): n_train training and n_test test images, pixel i of
 * the training bytes i * mul + i / 64, label k of image k mod classes;
 * the test images are the first training ones. */
static inline void write_idx_set(const char *dir, uint32_t n_train, uint32_t n_test,
                                 int classes, unsigned mul)
{
    unsigned char *px = malloc((size_t)n_train * 64), *lab = malloc(n_train);
    cr_assert(px && lab && n_test <= n_train);
    for (size_t i = 0; i < (size_t)n_train * 64; i++)
        px[i] = (unsigned char)(i * mul + i / 64);
    for (uint32_t i = 0; i < n_train; i++)
        lab[i] = (unsigned char)(i % (uint32_t)classes);
    uint32_t di[3] = { n_train, 8, 8 }, dl[1] = { n_train }, ti[3] = { n_test, 8, 8 },
             tl[1] = { n_test };
    write_idx_file(dir, "tr-img", 3, di, px, (size_t)n_train * 64);
    write_idx_file(dir, "tr-lab", 1, dl, lab, n_train);
    write_idx_file(dir, "te-img", 3, ti, px, (size_t)n_test * 64);
    write_idx_file(dir, "te-lab", 1, tl, lab, n_test);
    free(px);
    free(lab);
}

/* Two runs' records, one by one: every record's losses and accuracy (the
 * text from "train_loss" to "samples_per_s", timings excluded) equal to the
 * printed digit, and at least one record. */
static inline void expect_same_records(const char *one, const char *two, const char *what)
{
    int n = 0;
    for (const char *a = one, *b = two;
         (a = strstr(a, "\"train_loss\"")) && (b = strstr(b, "\"train_loss\"")); a++, b++, n++) {
        const size_t len = (size_t)(strstr(a, "\"samples_per_s\"") - a);
        cr_assert(strncmp(a, b, len) == 0, "two %s runs differ: %.*s against %.*s", what,
                  (int)len, a, (int)len, b);
    }
    cr_assert_geq(n, 1, "no records: %s", one);
}

#endif /* SUBTRAIN_TESTS_CLI_RUN_H */

/*
 * tests/test_quad_cmd.c — the quad command's answers to bad options (one
 * line on stderr, exit 2; exit 1 for a file it cannot write), to --help,
 * where its --csv file goes (through a link, a dangling one too, into a
 * FIFO, and not at all when the run fails or is stopped, even while it
 * writes), and its progress line.
 *
 * Links src/cli/quad_cmd.c in to call st_cli_quad_main directly.
 */
#if !defined(_POSIX_C_SOURCE) && !defined(_GNU_SOURCE) && !defined(_DEFAULT_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "cli/quad_cmd.h"

/* Runs the command with stdout and stderr sent to temporary files; err
 * gets the first line of stderr. */
static int run_cli(const char *const *args, char *out, size_t out_len, char *err, size_t err_len)
{
    char *argv[16];
    int argc = 0;
    argv[argc++] = (char *)"quad";
    for (; *args; args++)
        argv[argc++] = (char *)*args;
    argv[argc] = NULL;
    FILE *fo = tmpfile(), *fe = tmpfile();
    cr_assert(fo && fe);
    fflush(stdout);
    fflush(stderr);
    int so = dup(1), se = dup(2);
    dup2(fileno(fo), 1);
    dup2(fileno(fe), 2);
    int rc = st_cli_quad_main(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(so, 1);
    dup2(se, 2);
    close(so);
    close(se);
    rewind(fo);
    rewind(fe);
    size_t n = fread(out, 1, out_len - 1, fo);
    out[n] = '\0';
    n = fread(err, 1, err_len - 1, fe);
    err[n] = '\0';
    fclose(fo);
    fclose(fe);
    return rc;
}

Test(quad, command_rejects_bad_options_with_one_line)
{
    const char *const bad[][4] = {
        { "--dim", "10", "--workers", "4" },
        { "--dim", "12", "--q", "5" },
        { "--workers", "4", "--q", "2" },   /* fine: the control */
        { "--gamma", "2" },
        { "--gamma", "abc" },
        { "--case", "7" },
        { "--keep", "0" },
        { "--keep", "1.5" },
        { "--iters", "-3" },
        { "--seed", "x" },
        { "--frobnicate" },
        { "--help=1" },
        { "--csv" },
        { "--progress", "sometimes" },
        { "surplus" },
    };
    static char out[1 << 16], err[4096];
    for (size_t t = 0; t < sizeof bad / sizeof *bad; t++) {
        const char *args[6] = { 0 };
        for (int k = 0; k < 4 && bad[t][k]; k++)
            args[k] = bad[t][k];
        if (t == 2) {
            args[4] = "--case";
            args[5] = NULL;
            const char *ok[] = { "--workers", "4", "--q", "2", "--case", "4", NULL };
            cr_assert_eq(run_cli(ok, out, sizeof out, err, sizeof err), 0, "%s", err);
            cr_assert(strstr(out, "Case 4:"), "%s", out);
            cr_assert_str_empty(err);
            continue;
        }
        int rc = run_cli(args, out, sizeof out, err, sizeof err);
        cr_assert_eq(rc, 2, "args %zu: exit %d", t, rc);
        cr_assert(strncmp(err, "subtrain quad: ", 15) == 0, "args %zu: '%s'", t, err);
        char *nl = strchr(err, '\n');
        cr_assert(nl && nl[1] == '\0', "args %zu: not one line: '%s'", t, err);
        cr_assert_str_empty(out, "args %zu printed '%s'", t, out);
    }
    const char *unwritable[] = { "--case", "4", "--csv", "/nonexistent-dir/q.csv", NULL };
    cr_assert_eq(run_cli(unwritable, out, sizeof out, err, sizeof err), 1);
    cr_assert(strstr(err, "--csv /nonexistent-dir/q.csv: cannot create"), "%s", err);
    const char *six[] = { "--case", "6", "--runs", "20", "--iters", "50", NULL };
    cr_assert_eq(run_cli(six, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(out, "Case 6: IST against random-k (k = 2 of d = 8"), "%s", out);
    const char *help[] = { "--help", NULL };
    cr_assert_eq(run_cli(help, out, sizeof out, err, sizeof err), 0);
    cr_assert(strstr(out, "Usage: subtrain quad"), "%s", out);
}

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
}

static void first_line(const char *path, char *buf, size_t n)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    if (!fgets(buf, (int)n, f))
        buf[0] = '\0';
    fclose(f);
}

/* The number of names in dir holding "tmp" (temporary files left). */
static int tmps_in(const char *dir)
{
    char listing[128];
    snprintf(listing, sizeof listing, "ls %s | grep -c tmp", dir);
    FILE *p = popen(listing, "r");
    cr_assert_not_null(p);
    int n = -1;
    cr_assert_eq(fscanf(p, "%d", &n), 1);
    pclose(p);
    return n;
}

/* --csv through a symbolic link replaces the link's target and keeps the
 * link; a run stopped before the trace leaves an earlier file as it was
 * and no temporary file beside it; the file's permission bits stay;
 * --csv /dev/stdout with stdout in a file keeps the report; a FIFO gets
 * the whole trace from one open. */
Test(quad_cmd, the_csv_file_is_written_whole_or_not_at_all, .timeout = 60)
{
    char dir[] = "/tmp/st-quad-XXXXXX", real[64], link_[64], fifo[64], line[256];
    char out[4096], err[1024];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(real, sizeof real, "%s/real.csv", dir);
    snprintf(link_, sizeof link_, "%s/link.csv", dir);
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    put(real, "earlier\n");
    cr_assert_eq(symlink("real.csv", link_), 0);
    const char *via_link[] = { "--case", "4", "--iters", "20", "--csv", link_, NULL };
    cr_assert_eq(run_cli(via_link, out, sizeof out, err, sizeof err), 0, "%s", err);
    struct stat sb;
    cr_assert(lstat(link_, &sb) == 0 && S_ISLNK(sb.st_mode), "the link was replaced");
    first_line(real, line, sizeof line);
    cr_assert_str_eq(line, "iter,ist,ist_mean,gd,ist_b0,gd_b0\n", "the target holds '%s'", line);

    /* a run stopped before its end leaves the earlier file */
    put(real, "earlier\n");
    const char *bin = getenv("SUBTRAIN_BIN");
    char cmd[512];
    snprintf(cmd, sizeof cmd, "timeout -s TERM 1 '%s' quad --case 2 --runs 10000000 --csv %s "
             ">/dev/null", bin ? bin : "./subtrain", real);
    const int w = system(cmd);
    cr_assert(WIFEXITED(w) && WEXITSTATUS(w) == 124, "quad was not stopped by timeout(1): "
              "status %d", w);
    first_line(real, line, sizeof line);
    cr_assert_str_eq(line, "earlier\n", "a stopped run left '%s'", line);
    cr_assert_eq(tmps_in(dir), 0, "temporary files left beside the CSV file");

    /* the file's permission bits stay; a file stdout already writes
     * (--csv /dev/stdout) gets the trace through stdout, after the report */
    cr_assert_eq(chmod(real, 0600), 0);
    const char *again[] = { "--case", "4", "--iters", "20", "--csv", real, NULL };
    cr_assert_eq(run_cli(again, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert(stat(real, &sb) == 0 && (sb.st_mode & 0777) == 0600, "mode %o",
              (unsigned)(sb.st_mode & 0777));
    const char *to_stdout[] = { "--case", "4", "--iters", "20", "--csv", "/dev/stdout", NULL };
    cr_assert_eq(run_cli(to_stdout, out, sizeof out, err, sizeof err), 0, "%s", err);
    const char *csv = strstr(out, "iter,ist,ist_mean,gd,ist_b0,gd_b0\n");
    cr_assert(strstr(out, "Case 4:") && csv && strstr(csv, "\n20,") &&
              strstr(csv, "Trace written to /dev/stdout"), "%s", out);

    /* a FIFO: one reader gets every line */
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    char reader[160], got[64];
    snprintf(reader, sizeof reader, "cat %s | wc -l", fifo);
    FILE *p = popen(reader, "r");
    cr_assert_not_null(p);
    const char *into_fifo[] = { "--case", "4", "--iters", "20", "--csv", fifo, NULL };
    cr_assert_eq(run_cli(into_fifo, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert_not_null(fgets(got, sizeof got, p));
    pclose(p);
    cr_assert_eq(atoi(got), 22, "the FIFO's reader got %s lines, not the header and 21 rows", got);
    char rm[96];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    cr_assert_eq(system(rm), 0);
}

/* A dangling link's target is created at the end, as a new name would
 * be, never by a run that is stopped before it; a signal that comes while
 * the file is written ends the command once it is renamed into place
 * (SUBTRAIN_FAULT=stop:NAME stops the process there); --progress bar
 * draws on stderr and changes nothing that stdout says. */
Test(quad_cmd, a_dangling_link_and_a_signal_in_the_write_leave_whole_files, .timeout = 60)
{
    char dir[] = "/tmp/st-quad-XXXXXX", target[64], link_[64], line[256];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(target, sizeof target, "%s/target.csv", dir);
    snprintf(link_, sizeof link_, "%s/link.csv", dir);
    cr_assert_eq(symlink("target.csv", link_), 0);
    const char *bin = getenv("SUBTRAIN_BIN") ? getenv("SUBTRAIN_BIN") : "./subtrain";
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "timeout -s TERM 1 '%s' quad --case 2 --runs 10000000 --csv %s "
             ">/dev/null", bin, link_);
    int w = system(cmd);
    cr_assert(WIFEXITED(w) && WEXITSTATUS(w) == 124, "quad was not stopped: status %d", w);
    cr_assert_neq(access(target, F_OK), 0, "a stopped run created the link's target");
    cr_assert_eq(tmps_in(dir), 0, "temporary files left");

    /* stopped (SIGSTOP) with the trace in its temporary file: SIGTERM
     * then, and the run ends by it with the trace whole at the target */
    snprintf(cmd, sizeof cmd, "SUBTRAIN_FAULT=stop:target.csv '%s' quad --case 4 --iters 20 "
             "--csv %s >/dev/null & pid=$!; i=0; while [ \"$(cut -d' ' -f3 /proc/$pid/stat)\" "
             "!= T ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; kill -TERM $pid; "
             "kill -CONT $pid; wait $pid", bin, link_);
    w = system(cmd);
    cr_assert(WIFEXITED(w) && WEXITSTATUS(w) == 128 + SIGTERM, "status %d, not SIGTERM's", w);
    struct stat sb;
    cr_assert(lstat(link_, &sb) == 0 && S_ISLNK(sb.st_mode), "the link was replaced");
    FILE *f = fopen(target, "r");
    cr_assert_not_null(f, "no trace at the link's target");
    int rows = 0;
    while (fgets(line, sizeof line, f))
        rows++;
    fclose(f);
    cr_assert_eq(rows, 22, "%d lines, not the header and 21 rows", rows);
    cr_assert_eq(tmps_in(dir), 0, "temporary files left");

    /* past a file size limit the write fails, the temporary file goes,
     * then SIGXFSZ ends the command as it would have */
    snprintf(cmd, sizeof cmd, "ulimit -f 8; '%s' quad --case 4 --iters 2000 --csv %s/big.csv "
             ">/dev/null 2>&1", bin, dir);
    w = system(cmd);
    cr_assert(WIFEXITED(w) && WEXITSTATUS(w) == 128 + SIGXFSZ, "status %d, not SIGXFSZ's", w);
    cr_assert_eq(tmps_in(dir), 0, "a temporary file left past the size limit");

    static char out[1 << 16], out_bar[1 << 16], err[4096];
    const char *none[] = { "--case", "6", "--runs", "300", "--iters", "50", "--progress", "none",
                           NULL };
    const char *bar[] = { "--case", "6", "--runs", "300", "--iters", "50", "--progress", "bar",
                          NULL };
    cr_assert_eq(run_cli(none, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert_str_empty(err);
    cr_assert_eq(run_cli(bar, out_bar, sizeof out_bar, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(err, "case 6: 300/300 runs (100%)"), "%s", err);
    cr_assert_str_eq(out_bar, out);
    char rm[96];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    cr_assert_eq(system(rm), 0);
}

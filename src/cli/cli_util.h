/*
 * cli/cli_util.h — what the subcommands' option parsers share: the
 * getopt_long pass and the messages for what it rejects, whole-string
 * numbers, a user's text as a message shows it, and the one-line error of
 * a command.
 */
#ifndef SUBTRAIN_CLI_UTIL_H
#define SUBTRAIN_CLI_UTIL_H

#include <getopt.h>
#include <stddef.h>

/* The one-line message for getopt_long's '?' (unknown option, or a value
 * given to an option that takes none) or ':' (missing value).  `word` is
 * the argument being parsed, `cmd` the command ("subtrain topo"). */
void st_cli_getopt_message(int c, int optopt, const char *word, const char *cmd, char *err,
                           size_t n);

/* Starts a getopt_long pass over argv[1..]: a full reset (glibc keeps
 * state inside a grouped -xyz across passes unless optind is 0, so a
 * second parse in one process starts clean) and no getopt messages of its
 * own. */
void st_cli_getopt_start(void);

/* The next option of the pass (getopt_long's return value), -1 at the
 * end, or ST_CLI_REJECTED with the one-line message in err when getopt
 * rejects the argument. */
#define ST_CLI_REJECTED (-2)
int st_cli_next_option(int argc, char **argv, const char *shortopts,
                       const struct option *longopts, const char *cmd, char *err, size_t n);

/* A subcommand's whole command line: every option in turn to
 * apply(c, optarg, ctx), which prints why it refuses one and returns -1.
 * A rejected option or an argument that is no option is printed as
 * "cmd: ..." (usage: "cmd [OPTION]...").  0, or -1 when it has printed why. */
typedef int (*st_cli_apply_fn)(int c, const char *arg, void *ctx);
int st_cli_parse_args(int argc, char **argv, const char *shortopts,
                      const struct option *longopts, const char *cmd, st_cli_apply_fn apply,
                      void *ctx);

/* A user's text as a message quotes it: control bytes and bytes that are
 * not UTF-8 escaped (\t, \n, \r, \xNN; valid UTF-8 as it is), and a text
 * that would show longer than ST_CLI_SHOW_MAX bytes cut to its start and
 * its end around "[...]", so that the message stays one line and keeps
 * what follows the text.  out holds ST_CLI_SHOW_MAX + 1 bytes; returns it. */
#define ST_CLI_SHOW_MAX 160
const char *st_cli_show(const char *s, char *out);
/* st_cli_show into a buffer that lives until the end of the enclosing
 * block: for a message's arguments, ST_CLI_SHOW(arg). */
#define ST_CLI_SHOW(s) st_cli_show((s), (char[ST_CLI_SHOW_MAX + 1]){ 0 })

/* The one integer syntax of every count a user gives (options, their
 * values in a configuration file, SLURM_CPUS_PER_TASK): decimal digits
 * only, so no blanks, no sign and not empty, in [lo, hi] (overflow is out
 * of it).  0, or -1 with "WHAT: expected an integer in [lo, hi], got
 * 'S'" in err; `what` names the value as the user gave it ("--depth"). */
int st_cli_parse_count(const char *what, const char *s, unsigned long long lo,
                       unsigned long long hi, unsigned long long *out, char *err, size_t n);

/* SLURM_CPUS_PER_TASK, the CPUs of a SLURM task: 0 with *cpus its value
 * (0 when unset or empty), or -1 with a message when it is no count in
 * [1, 65536]. */
int st_cli_slurm_cpus(int *cpus, char *err, size_t n);

/* A whole-string decimal number (digits with an optional fraction and
 * exponent: 0.001, 1e-3; no blanks, inf, nan or hex, and no sign unless lo
 * is negative) in the range lo_bracket lo, hi hi_bracket ('[' or '(',
 * ']' or ')'), as typed and, when `single`, once rounded to the float it
 * is kept as (1e-300 is 0 then).  0 with *out the value kept, or -1 with
 * "WHAT: expected a number in (lo, hi], got 'S'" in err. */
int st_cli_parse_real(const char *what, const char *s, char lo_bracket, double lo, double hi,
                      char hi_bracket, int single, double *out, char *err, size_t n);

/* The message into err (n bytes), and -1: the parsers' way to refuse. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
int st_cli_fail(char *err, size_t n, const char *fmt, ...);

/* Why st_file_open_read (core/file.h) just refused a file, without its
 * path: "cannot open it: REASON", or "not a regular file (a FIFO)". */
const char *st_cli_open_failure(char *buf, size_t n);

/* Prints "cmd: message" as one line on stderr, its control bytes and
 * invalid UTF-8 escaped as st_cli_show escapes them (a path or a value in
 * the message cannot break the line): every failure of the commands. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
void st_cli_error(const char *cmd, const char *fmt, ...);

/* st_cli_parse_count for a subcommand: prints the message itself. */
int st_cli_count_arg(const char *cmd, const char *what, const char *s, unsigned long long lo,
                     unsigned long long hi, unsigned long long *out);

/* Seconds on the monotonic clock: the progress lines' and calibration's
 * timer. */
double st_cli_now_s(void);
/* s seconds as M:SS, or H:MM:SS from an hour on (an ETA). */
void st_cli_format_duration(char *buf, size_t n, double s);

/* What the dangling symbolic link `path` names, through a chain of
 * links, into out: the file a write through it creates.  0, or -1 when
 * it is not that (a loop, a name too long, a link changed meanwhile). */
int st_cli_dangling_target(const char *path, char *out, size_t len);

#endif /* SUBTRAIN_CLI_UTIL_H */

/*
 * cli/cli_util.h — what the subcommands' option parsers share: the
 * getopt_long pass and the messages for what it rejects, whole-string
 * counts, and the one-line usage error of a subcommand.
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

/* A whole-string unsigned integer in [lo, hi]; 0, or -1 with a message
 * naming --opt and the range. */
int st_cli_parse_count(const char *opt, const char *s, unsigned long long lo,
                       unsigned long long hi, unsigned long long *out, char *err, size_t n);

/* The message into err (n bytes), and -1: the parsers' way to refuse. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
int st_cli_fail(char *err, size_t n, const char *fmt, ...);

/* Prints "cmd: message" on stderr: the subcommands' one-line usage errors. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
void st_cli_usage_error(const char *cmd, const char *fmt, ...);

/* st_cli_parse_count for a subcommand: prints the message itself. */
int st_cli_count_arg(const char *cmd, const char *opt, const char *s, unsigned long long lo,
                     unsigned long long hi, unsigned long long *out);

#endif /* SUBTRAIN_CLI_UTIL_H */

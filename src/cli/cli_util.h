/*
 * cli/cli_util.h — what the subcommands' option parsers share: the
 * messages for what getopt_long rejects, whole-string counts, and the
 * one-line usage error of a subcommand.
 */
#ifndef SUBTRAIN_CLI_UTIL_H
#define SUBTRAIN_CLI_UTIL_H

#include <stddef.h>

/* The one-line message for getopt_long's '?' (unknown option, or a value
 * given to an option that takes none) or ':' (missing value).  `word` is
 * the argument being parsed, `cmd` the command ("subtrain topo"). */
void st_cli_getopt_message(int c, int optopt, const char *word, const char *cmd, char *err,
                           size_t n);

/* A whole-string unsigned integer in [lo, hi]; 0, or -1 with a message
 * naming --opt and the range. */
int st_cli_parse_count(const char *opt, const char *s, unsigned long long lo,
                       unsigned long long hi, unsigned long long *out, char *err, size_t n);

/* Prints "cmd: message" on stderr: the subcommands' one-line usage errors. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
void st_cli_usage_error(const char *cmd, const char *fmt, ...);

/* st_cli_parse_count for a subcommand: prints the message itself. */
int st_cli_count_arg(const char *cmd, const char *opt, const char *s, unsigned long long lo,
                     unsigned long long hi, unsigned long long *out);

#endif /* SUBTRAIN_CLI_UTIL_H */

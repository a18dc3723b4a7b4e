/* cli/cli_util.c — shared pieces of the option parsers. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_util.h"

void st_cli_getopt_message(int c, int optopt, const char *word, const char *cmd, char *err,
                           size_t n)
{
    if (c == ':') {
        snprintf(err, n, "option '%s' needs a value (see %s --help)", word, cmd);
        return;
    }
    /* getopt_long sets optopt to a short option's letter, to a long
     * option's value when it was given a value it takes not (--quiet=x),
     * and to 0 for an unknown long option: tell them apart by the word. */
    int is_long = strncmp(word, "--", 2) == 0;
    if (!is_long && optopt > 0 && optopt < 256)
        snprintf(err, n, "unknown option '-%c' (see %s --help)", optopt, cmd);
    else if (is_long && optopt != 0)
        snprintf(err, n, "option '%s' takes no value (see %s --help)", word, cmd);
    else
        snprintf(err, n, "unknown option '%s' (see %s --help)", word, cmd);
}

int st_cli_parse_count(const char *opt, const char *s, unsigned long long lo,
                       unsigned long long hi, unsigned long long *out, char *err, size_t n)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*s == '\0' || *s == '-' || *s == '+' || *end != '\0' || errno == ERANGE || v < lo ||
        v > hi) {
        snprintf(err, n, "--%s: expected an integer in [%llu, %llu], got '%s'", opt, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

void st_cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

int st_cli_count_arg(const char *cmd, const char *opt, const char *s, unsigned long long lo,
                     unsigned long long hi, unsigned long long *out)
{
    char err[256];
    if (st_cli_parse_count(opt, s, lo, hi, out, err, sizeof err) == 0)
        return 0;
    st_cli_usage_error(cmd, "%s", err);
    return -1;
}

void st_cli_getopt_start(void)
{
#ifdef __GLIBC__
    optind = 0; /* glibc: 0 also resets its state inside a grouped -xyz */
#else
    optind = 1;
#endif
    opterr = 0; /* our own one-line messages */
}

int st_cli_next_option(int argc, char **argv, const char *shortopts,
                       const struct option *longopts, const char *cmd, char *err, size_t n)
{
    int prev = optind ? optind : 1; /* optind 0 asks glibc for a reset: argv[1] is next */
    int c = getopt_long(argc, argv, shortopts, longopts, NULL);
    if (c != '?' && c != ':')
        return c;
    st_cli_getopt_message(c, optopt, prev < argc ? argv[prev] : "", cmd, err, n);
    return ST_CLI_REJECTED;
}

int st_cli_fail(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return -1;
}

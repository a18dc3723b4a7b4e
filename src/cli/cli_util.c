/* cli/cli_util.c — shared pieces of the option parsers. */
#include <errno.h>
#include <limits.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli_util.h"
#include "core/error.h"

/* ------------------------------------------------------------ showing text */

/* The length of the valid UTF-8 sequence at p (1 to 4 bytes), or 0 when
 * p starts none (a stray or overlong byte, a surrogate, past U+10FFFF). */
static size_t utf8_length(const unsigned char *p)
{
    size_t len;
    unsigned cp, min;
    if (p[0] < 0x80)
        return 1;
    if (p[0] >= 0xc2 && p[0] <= 0xdf) {
        len = 2, cp = p[0] & 0x1fu, min = 0x80;
    } else if ((p[0] & 0xf0) == 0xe0) {
        len = 3, cp = p[0] & 0x0fu, min = 0x800;
    } else if (p[0] >= 0xf0 && p[0] <= 0xf4) {
        len = 4, cp = p[0] & 0x07u, min = 0x10000;
    } else {
        return 0;
    }
    for (size_t k = 1; k < len; k++) {
        if ((p[k] & 0xc0) != 0x80)   /* a NUL stops here too */
            return 0;
        cp = cp << 6 | (p[k] & 0x3fu);
    }
    return cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000) ? 0 : len;
}

/* One character of p as a message shows it, into out (4 bytes at most):
 * its length there; *used gets the bytes of p it stands for. */
static size_t show_unit(const unsigned char *p, char *out, size_t *used)
{
    static const char hex[] = "0123456789abcdef";
    size_t len = utf8_length(p);
    if (len > 1 || (len == 1 && p[0] >= 0x20 && p[0] != 0x7f)) {
        memcpy(out, p, len);
        *used = len;
        return len;
    }
    *used = 1;
    const char named = p[0] == '\t' ? 't' : p[0] == '\n' ? 'n' : p[0] == '\r' ? 'r' : 0;
    out[0] = '\\';
    if (named) {
        out[1] = named;
        return 2;
    }
    out[1] = 'x';
    out[2] = hex[p[0] >> 4];
    out[3] = hex[p[0] & 15];
    return 4;
}

#define ELLIPSIS "[...]"
#define SHOW_HEAD 80   /* bytes of a long text's start; its end fills the rest */

const char *st_cli_show(const char *s, char *out)
{
    const unsigned char *p = (const unsigned char *)s;
    char unit[4];
    size_t used, total = 0;
    for (size_t i = 0; p[i]; i += used)
        total += show_unit(p + i, unit, &used);
    /* a long text: the characters that end within its first SHOW_HEAD
     * shown bytes, the ellipsis, the characters that start within the
     * last ones that fill ST_CLI_SHOW_MAX */
    const int cut = total > ST_CLI_SHOW_MAX;
    const size_t head = cut ? SHOW_HEAD : total;
    const size_t tail = cut ? total - (ST_CLI_SHOW_MAX - SHOW_HEAD - (sizeof ELLIPSIS - 1))
                            : total;
    size_t k = 0, at = 0;
    int marked = 0;
    for (size_t i = 0; p[i]; i += used) {
        size_t w = show_unit(p + i, unit, &used);
        if (at + w <= head || at >= tail) {
            memcpy(out + k, unit, w);
            k += w;
        } else if (!marked) {   /* the first character left out */
            memcpy(out + k, ELLIPSIS, sizeof ELLIPSIS - 1);
            k += sizeof ELLIPSIS - 1;
            marked = 1;
        }
        at += w;
    }
    out[k] = '\0';
    return out;
}

/* "CMD: S\n" on f, S escaped as st_cli_show escapes it, whole, in one
 * write: the ranks of an MPI job share one stderr, and a rank ended between
 * two writes would leave half a line in another's. */
static void put_line(FILE *f, const char *cmd, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    char small[4096];
    const size_t need = strlen(cmd) + 3 + 4 * strlen(s);
    char *line = need <= sizeof small ? small : malloc(need);
    const size_t cap = line ? need : sizeof small;   /* out of memory: the start */
    if (!line)
        line = small;
    size_t k = (size_t)snprintf(line, cap, "%s: ", cmd), used;
    for (size_t i = 0; p[i] && k + 5 <= cap; i += used)
        k += show_unit(p + i, line + k, &used);
    line[k++] = '\n';
    fwrite(line, 1, k, f);
    fflush(f);
    if (line != small)
        free(line);
}

/* ------------------------------------------------------------ numbers */

int st_cli_parse_count(const char *what, const char *s, unsigned long long lo,
                       unsigned long long hi, unsigned long long *out, char *err, size_t n)
{
    /* digits only: strtoull alone would take blanks, a sign, and wrap -1 */
    int digits = *s != '\0';
    for (const char *p = s; *p; p++)
        digits &= *p >= '0' && *p <= '9';
    errno = 0;
    unsigned long long v = digits ? strtoull(s, NULL, 10) : 0;
    if (!digits || errno == ERANGE || v < lo || v > hi)
        return st_cli_fail(err, n, "%s: expected an integer in [%llu, %llu], got '%s'", what, lo,
                           hi, ST_CLI_SHOW(s));
    *out = v;
    return 0;
}

int st_cli_slurm_cpus(int *cpus, char *err, size_t n)
{
    const char *slurm = getenv("SLURM_CPUS_PER_TASK");
    unsigned long long v = 0;
    if (slurm && *slurm && st_cli_parse_count("SLURM_CPUS_PER_TASK", slurm, 1, 65536, &v, err, n))
        return st_cli_fail(err, n, "SLURM_CPUS_PER_TASK='%s': expected a CPU count, an integer "
                           "in [1, 65536]", ST_CLI_SHOW(slurm));
    *cpus = (int)v;
    return 0;
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Whole-string [-]digits[.digits][e[+-]digits], digits on one side of the
 * point at least. */
static int is_decimal(const char *p, int minus)
{
    int digits = 0;
    if (minus && *p == '-')
        p++;
    for (; is_digit(*p); p++)
        digits++;
    if (*p == '.')
        for (p++; is_digit(*p); p++)
            digits++;
    if (!digits)
        return 0;
    if (*p == 'e' || *p == 'E') {
        p += p[1] == '+' || p[1] == '-' ? 2 : 1;
        if (!is_digit(*p))
            return 0;
        while (is_digit(*p))
            p++;
    }
    return *p == '\0';
}

static int in_range(double v, char lo_bracket, double lo, double hi, char hi_bracket)
{
    return (lo_bracket == '(' ? v > lo : v >= lo) && (hi_bracket == ')' ? v < hi : v <= hi);
}

int st_cli_parse_real(const char *what, const char *s, char lo_bracket, double lo, double hi,
                      char hi_bracket, int single, double *out, char *err, size_t n)
{
    /* strtod's overflow is +-HUGE_VAL and its underflow a tiny value or 0:
     * the range refuses them as typed, or as the float kept */
    double v = is_decimal(s, lo < 0) ? strtod(s, NULL) : NAN;
    int ok = in_range(v, lo_bracket, lo, hi, hi_bracket);
    if (ok && single) {
        v = fabs(v) <= FLT_MAX ? (double)(float)v : v > 0 ? INFINITY : -INFINITY;
        ok = in_range(v, lo_bracket, lo, hi, hi_bracket);
    }
    if (!ok)
        return st_cli_fail(err, n, "%s: expected a number in %c%g, %g%c, got '%s'", what,
                           lo_bracket, lo, hi, hi_bracket, ST_CLI_SHOW(s));
    *out = v;
    return 0;
}

/* ------------------------------------------------------------ messages */

void st_cli_getopt_message(int c, int optopt, const char *word, const char *cmd, char *err,
                           size_t n)
{
    if (c == ':') {
        snprintf(err, n, "option '%s' needs a value (see %s --help)", ST_CLI_SHOW(word), cmd);
        return;
    }
    /* getopt_long sets optopt to a short option's letter, to a long
     * option's value when it was given a value it takes not (--quiet=x),
     * and to 0 for an unknown long option: tell them apart by the word. */
    int is_long = strncmp(word, "--", 2) == 0;
    const char letter[2] = { (char)optopt, '\0' };
    if (!is_long && optopt > 0 && optopt < 256)
        snprintf(err, n, "unknown option '-%s' (see %s --help)", ST_CLI_SHOW(letter), cmd);
    else if (is_long && optopt != 0)
        snprintf(err, n, "option '%s' takes no value (see %s --help)", ST_CLI_SHOW(word), cmd);
    else
        snprintf(err, n, "unknown option '%s' (see %s --help)", ST_CLI_SHOW(word), cmd);
}

void st_cli_error(const char *cmd, const char *fmt, ...)
{
    char buf[2048], *msg = buf;
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    int len = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (len >= (int)sizeof buf) {   /* rare: formatted again, whole, on the heap */
        char *big = malloc((size_t)len + 1);
        if (big && vsnprintf(big, (size_t)len + 1, fmt, again) == len)
            msg = big;
        else
            free(big);
    }
    va_end(again);
    put_line(stderr, cmd, len < 0 ? fmt : msg);
    if (msg != buf)
        free(msg);
}

int st_cli_count_arg(const char *cmd, const char *what, const char *s, unsigned long long lo,
                     unsigned long long hi, unsigned long long *out)
{
    char err[512];
    if (st_cli_parse_count(what, s, lo, hi, out, err, sizeof err) == 0)
        return 0;
    st_cli_error(cmd, "%s", err);
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

/* Whether word reads as options, as getopt_long would take it: "--"
 * (their end), "--NAME" or "--NAME=..." where NAME begins a long option's
 * name (getopt takes abbreviations), or "-XY..." of short options only
 * (a bundle; a negative number is none). */
static int names_option(const char *shortopts, const struct option *longopts, const char *word)
{
    if (word[0] == '-' && word[1] && word[1] != '-') {
        for (const char *c = word + 1; *c; c++)
            if (*c == ':' || !strchr(shortopts, *c))
                return 0;
        return 1;
    }
    if (strncmp(word, "--", 2) != 0)
        return 0;
    const size_t len = strcspn(word + 2, "=");
    if (len == 0)
        return word[2] == '\0';
    for (const struct option *o = longopts; o && o->name; o++)
        if (strlen(o->name) >= len && strncmp(o->name, word + 2, len) == 0)
            return 1;
    return 0;
}

int st_cli_next_option(int argc, char **argv, const char *shortopts,
                       const struct option *longopts, const char *cmd, char *err, size_t n)
{
    int prev = optind ? optind : 1; /* optind 0 asks glibc for a reset: argv[1] is next */
    int c = getopt_long(argc, argv, shortopts, longopts, NULL);
    /* a value taken from the next word that is one of the options
     * (`--metrics --quiet`): the value was forgotten, not meant; the
     * --NAME=VALUE form still gives any value */
    if (c != '?' && c != ':' && optarg && optind >= 2 && optarg == argv[optind - 1] &&
        names_option(shortopts, longopts, optarg)) {
        const char *opt = argv[optind - 2];
        snprintf(err, n, "option '%s' needs a value, and '%s' is an option (write %s%s%s for "
                 "that value; see %s --help)", ST_CLI_SHOW(opt), ST_CLI_SHOW(optarg),
                 ST_CLI_SHOW(opt), strncmp(opt, "--", 2) == 0 ? "=" : "", ST_CLI_SHOW(optarg),
                 cmd);
        return ST_CLI_REJECTED;
    }
    if (c != '?' && c != ':')
        return c;
    st_cli_getopt_message(c, optopt, prev < argc ? argv[prev] : "", cmd, err, n);
    return ST_CLI_REJECTED;
}

int st_cli_parse_args(int argc, char **argv, const char *shortopts,
                      const struct option *longopts, const char *cmd, st_cli_apply_fn apply,
                      void *ctx)
{
    st_cli_getopt_start();
    for (;;) {
        char err[512];
        int c = st_cli_next_option(argc, argv, shortopts, longopts, cmd, err, sizeof err);
        if (c == -1)
            break;
        if (c == ST_CLI_REJECTED) {
            st_cli_error(cmd, "%s", err);
            return -1;
        }
        if (apply(c, optarg, ctx))
            return -1;
    }
    if (optind < argc) {
        st_cli_error(cmd, "unexpected argument '%s' (usage: %s [OPTION]...)",
                     ST_CLI_SHOW(argv[optind]), cmd);
        return -1;
    }
    return 0;
}

int st_cli_fail(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return -1;
}

const char *st_cli_open_failure(char *buf, size_t n)
{
    const int e = errno;   /* 0: the file was there, not a regular one */
    const char *why = strstr(st_last_error(), "not a regular file");
    if (e || !why)
        snprintf(buf, n, "cannot open it: %s", strerror(e));
    else
        snprintf(buf, n, "%s", why);
    return buf;
}

int st_cli_dangling_target(const char *path, char *out, size_t len)
{
    char cur[PATH_MAX], dest[PATH_MAX];
    if ((size_t)snprintf(cur, sizeof cur, "%s", path) >= sizeof cur)
        return -1;
    for (int hops = 0; hops < 40; hops++) {
        const ssize_t n = readlink(cur, dest, sizeof dest - 1);
        if (n < 0)
            return -1;
        dest[n] = '\0';
        const char *slash = strrchr(cur, '/');
        int w = dest[0] == '/' || !slash
              ? snprintf(out, len, "%s", dest)
              : snprintf(out, len, "%.*s/%s", (int)(slash - cur), cur, dest);
        if (w < 0 || (size_t)w >= len)
            return -1;
        struct stat sb;
        if (lstat(out, &sb) != 0)
            return errno == ENOENT ? 0 : -1;
        if (!S_ISLNK(sb.st_mode) || (size_t)snprintf(cur, sizeof cur, "%s", out) >= sizeof cur)
            return -1;
    }
    return -1;
}

double st_cli_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void st_cli_format_duration(char *buf, size_t n, double s)
{
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

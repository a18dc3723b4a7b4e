/* cli/option_values.c — the values of options with a syntax of their own:
 * --data DIR|synthetic|cifar10:DIR|...|text:FILE, and the strategies'
 * options by their descriptors (counts, reals, names, lists of counts). */
#include <stdio.h>
#include <string.h>

#include "cli/cli_util.h"
#include "cli/option_values.h"

/* Copies s[0 .. len) into dst (ST_CLI_DATA_PATH_MAX bytes). */
static int copy_part(const char *what, const char *s, size_t len, char *dst, char *err, size_t n)
{
    if (len >= ST_CLI_DATA_PATH_MAX)
        return st_cli_fail(err, n, "%s: the name is too long (%zu bytes)", what, len);
    memcpy(dst, s, len);
    dst[len] = '\0';
    return 0;
}

/* idx:DIR[:TRAIN_IMAGES,TRAIN_LABELS,TEST_IMAGES,TEST_LABELS]: the names
 * follow the last ':' when what follows it has a comma (so a directory
 * may contain ':'). */
static int parse_idx_spec(const char *what, const char *spec, st_cli_data *d, char *err,
                          size_t n)
{
    const char *colon = strrchr(spec, ':');
    size_t dir_len = strlen(spec);
    d->has_names = colon && strchr(colon + 1, ',') != NULL;
    if (d->has_names) {
        dir_len = (size_t)(colon - spec);
        const char *p = colon + 1;
        for (int k = 0; k < 4; k++) {
            const char *end = strchr(p, ',');
            size_t len = end ? (size_t)(end - p) : strlen(p);
            if (len == 0 || (k == 3) != (end == NULL))
                return st_cli_fail(err, n, "%s idx:%s: expected four file names "
                            "TRAIN_IMAGES,TRAIN_LABELS,TEST_IMAGES,TEST_LABELS after the "
                            "directory, got '%s'", what, ST_CLI_SHOW(spec),
                            ST_CLI_SHOW(colon + 1));
            if (copy_part(what, p, len, d->names[k], err, n))
                return -1;
            p = end ? end + 1 : p + len;
        }
    }
    if (dir_len == 0)
        return st_cli_fail(err, n, "%s idx:%s: the directory is missing (idx:DIR[:TRAIN_IMAGES,"
                    "TRAIN_LABELS,TEST_IMAGES,TEST_LABELS])", what, ST_CLI_SHOW(spec));
    return copy_part(what, spec, dir_len, d->dir, err, n);
}

int st_cli_parse_data(const char *what, const char *s, st_cli_data *d, char *err, size_t n)
{
    static const struct { const char *prefix; st_cli_data_kind kind; } kinds[] = {
        { "cifar10", ST_CLI_DATA_CIFAR10 },
        { "cifar100", ST_CLI_DATA_CIFAR100 },
        { "idx", ST_CLI_DATA_IDX },
    };
    memset(d, 0, sizeof *d);
    if (*s == '\0')
        return st_cli_fail(err, n, "%s: expected a directory, 'synthetic', cifar10:DIR, "
                    "cifar100:DIR, idx:DIR or text:FILE, got ''", what);
    if (strcmp(s, "synthetic") == 0) {
        d->kind = ST_CLI_DATA_SYNTHETIC;
        return 0;
    }
    if (strncmp(s, "text:", 5) == 0 || strcmp(s, "text") == 0) {
        d->kind = ST_CLI_DATA_TEXT;
        if (s[4] == '\0' || s[5] == '\0')
            return st_cli_fail(err, n, "%s %s: the file is missing (text:FILE, e.g. "
                        "text:/usr/share/dictd/gcide.dict.dz)", what, ST_CLI_SHOW(s));
        return copy_part(what, s + 5, strlen(s + 5), d->dir, err, n);
    }
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        size_t len = strlen(kinds[k].prefix);
        if (strncmp(s, kinds[k].prefix, len) != 0 || (s[len] != ':' && s[len] != '\0'))
            continue;
        d->kind = kinds[k].kind;
        const char *rest = s[len] ? s + len + 1 : s + len;
        if (d->kind == ST_CLI_DATA_IDX)
            return parse_idx_spec(what, rest, d, err, n);
        if (*rest == '\0')
            return st_cli_fail(err, n, "%s %s: the directory is missing (%s:DIR, DIR the extracted "
                        "%s directory)", what, ST_CLI_SHOW(s), kinds[k].prefix,
                        d->kind == ST_CLI_DATA_CIFAR10 ? "cifar-10-batches-bin"
                                                       : "cifar-100-binary");
        return copy_part(what, rest, strlen(rest), d->dir, err, n);
    }
    d->kind = ST_CLI_DATA_FASHION;
    return copy_part(what, s, strlen(s), d->dir, err, n);
}

/* --cuts 2,4: at most d->most increasing integers in [lo, hi] (digits
 * only, as every count). */
static int parse_counts(const st_strategy_option *d, const char *s, st_option_value *v,
                        char *err, size_t n)
{
    int k = 0;
    for (const char *p = s;; k++) {
        size_t len = strcspn(p, ",");
        char part[24], what[64], msg[128];
        unsigned long long x = 0;
        if (k == d->most || k == ST_OPTION_MAX_COUNTS)
            return st_cli_fail(err, n, "--%s: at most %d %s, got '%s'", d->name, k, d->name,
                               ST_CLI_SHOW(s));
        if (len < sizeof part) {
            memcpy(part, p, len);
            part[len] = '\0';
        }
        snprintf(what, sizeof what, "--%s", d->name);
        if (len >= sizeof part ||
            st_cli_parse_count(what, part, d->lo, d->hi, &x, msg, sizeof msg) ||
            (k > 0 && (int)x <= v->counts[k - 1]))
            return st_cli_fail(err, n, "--%s: expected %s, got '%s'", d->name, d->expected,
                               ST_CLI_SHOW(s));
        v->counts[k] = (int)x;
        if (p[len] == '\0')
            break;
        p += len + 1;
    }
    v->n_counts = k + 1;
    return 0;
}

int st_cli_parse_strategy_value(const st_strategy_option *d, const char *arg,
                                st_option_value *v, char *err, size_t n)
{
    char what[64];
    unsigned long long x;
    memset(v, 0, sizeof *v);
    snprintf(what, sizeof what, "--%s", d->name);
    switch (d->kind) {
    case ST_OPTION_COUNT:
        if (st_cli_parse_count(what, arg, d->lo, d->hi, &x, err, n))
            return -1;
        v->count = x;
        return 0;
    case ST_OPTION_REAL:
        return st_cli_parse_real(what, arg, d->lo_bracket, d->real_lo, d->real_hi,
                                 d->hi_bracket, 1, &v->real, err, n);
    case ST_OPTION_NAME: {
        char allowed[256] = "";
        for (int k = 0; d->names[k]; k++) {
            if (strcmp(arg, d->names[k]) == 0) {
                v->name = k;
                return 0;
            }
            snprintf(allowed + strlen(allowed), sizeof allowed - strlen(allowed), "%s%s",
                     k ? ", " : "", d->names[k]);
        }
        return st_cli_fail(err, n, "%s: unknown value '%s' (allowed: %s)", what, ST_CLI_SHOW(arg),
                           allowed);
    }
    case ST_OPTION_COUNTS:
        return parse_counts(d, arg, v, err, n);
    case ST_OPTION_TEXT: {
        char why[192];
        if (d->parse(arg, v, why, sizeof why) == 0)
            return 0;
        return st_cli_fail(err, n, "%s %s: %s", what, ST_CLI_SHOW(arg), why);
    }
    case ST_OPTION_FLAG:
        v->name = 1;
        return 0;
    }
    return st_cli_fail(err, n, "internal: %s has no value syntax", what);
}

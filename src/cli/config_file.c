/*
 * cli/config_file.c — reading a configuration file (or a metrics file's
 * "run" record) into key-value entries, and the quoting both directions
 * share.  The entries' strings live in the file's text (cut in place, or
 * for a metrics file copied back into it from jansson's parse), for as
 * long as the options that point into them.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli_util.h"
#include "cli/config_file.h"
#include "core/file.h"

/* Enough for any configuration by far; a metrics file is read up to the
 * end of its first line, which must fit too. */
#define CONFIG_MAX_BYTES (1u << 20)


static int is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v';
}

/* ------------------------------------------------------------ quoting */

static int needs_quotes(const char *v)
{
    size_t len = strlen(v);
    if (len == 0)
        return 0;
    if (is_blank(v[0]) || is_blank(v[len - 1]) || v[0] == '"')
        return 1;
    for (const unsigned char *p = (const unsigned char *)v; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            return 1;
    return 0;
}

int st_cli_config_quote(const char *value, char *out, size_t n)
{
    if (!needs_quotes(value)) {
        int w = snprintf(out, n, "%s", value);
        return w >= 0 && (size_t)w < n ? 0 : -1;
    }
    size_t k = 0;
    int ok = 1;
#define PUT(c) do { if (k + 1 < n) out[k++] = (char)(c); else ok = 0; } while (0)
    PUT('"');
    for (const unsigned char *p = (const unsigned char *)value; *p; p++) {
        switch (*p) {
        case '"': PUT('\\'); PUT('"'); break;
        case '\\': PUT('\\'); PUT('\\'); break;
        case '\n': PUT('\\'); PUT('n'); break;
        case '\t': PUT('\\'); PUT('t'); break;
        case '\r': PUT('\\'); PUT('r'); break;
        default:
            if (*p < 0x20 || *p == 0x7f) {
                static const char hex[] = "0123456789abcdef";
                PUT('\\'); PUT('x'); PUT(hex[*p >> 4]); PUT(hex[*p & 15]);
            } else {
                PUT(*p);
            }
        }
    }
    PUT('"');
#undef PUT
    out[k < n ? k : n - 1] = '\0';
    return ok ? 0 : -1;
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* s is a quoted value (s[0] == '"', nothing after its closing quote):
 * unquoted in place.  0, or -1 when it is malformed. */
static int unquote(char *s)
{
    size_t len = strlen(s);
    if (len < 2 || s[len - 1] != '"')
        return -1;
    char *out = s;
    for (size_t i = 1; i + 1 < len; i++) {
        char c = s[i];
        if (c == '"')
            return -1;
        if (c != '\\') {
            *out++ = c;
            continue;
        }
        if (++i + 1 >= len)
            return -1;
        switch (s[i]) {
        case '"': *out++ = '"'; break;
        case '\\': *out++ = '\\'; break;
        case 'n': *out++ = '\n'; break;
        case 't': *out++ = '\t'; break;
        case 'r': *out++ = '\r'; break;
        case 'x': {
            int hi = i + 2 < len ? hex_digit(s[i + 1]) : -1;
            int lo = hi >= 0 ? hex_digit(s[i + 2]) : -1;
            if (lo < 0 || (hi == 0 && lo == 0))
                return -1;
            *out++ = (char)(hi * 16 + lo);
            i += 2;
            break;
        }
        default:
            return -1;
        }
    }
    *out = '\0';
    return 0;
}

void st_cli_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", f);
        else if (*p == '\t')
            fputs("\\t", f);
        else if (*p < 0x20 || *p == 0x7f)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

/* ------------------------------------------------------------ reading */

static int add_entry(st_cli_config_file *cf, int cap, const char *key, const char *value,
                     int line, char *err, size_t n)
{
    for (int k = 0; k < cf->n; k++)
        if (strcmp(cf->entries[k].key, key) == 0)
            return st_cli_fail(err, n, "%s:%d: '%s' is set twice (line %d sets it too)",
                               ST_CLI_SHOW(cf->path), line, ST_CLI_SHOW(key),
                               cf->entries[k].line);
    if (cf->n == cap)
        return st_cli_fail(err, n, "%s:%d: too many entries", ST_CLI_SHOW(cf->path), line);
    cf->entries[cf->n++] = (st_cli_config_entry){ key, value, line };
    return 0;
}

/* key = value lines. */
static int parse_text(st_cli_config_file *cf, char *err, size_t n)
{
    int cap = 1;
    for (const char *p = cf->text; *p; p++)
        cap += *p == '\n';
    cf->entries = calloc((size_t)cap, sizeof *cf->entries);
    if (!cf->entries)
        return st_cli_fail(err, n, "--config %s: out of memory", ST_CLI_SHOW(cf->path));
    char *line = cf->text;
    if (strncmp(line, "\xef\xbb\xbf", 3) == 0)
        line += 3;   /* a UTF-8 byte order mark, as some editors write one */
    for (int no = 1; line; no++) {
        char *next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        char *s = line;
        line = next;
        while (is_blank(*s))
            s++;
        if (*s == '\0' || *s == '#')
            continue;
        char *eq = strchr(s, '=');
        char *end = s + strlen(s);
        while (end > s && is_blank(end[-1]))
            *--end = '\0';
        if (!eq)
            return st_cli_fail(err, n, "%s:%d: expected 'key = value', got '%s'",
                               ST_CLI_SHOW(cf->path), no, ST_CLI_SHOW(s));
        char *key_end = eq;
        while (key_end > s && is_blank(key_end[-1]))
            key_end--;
        *key_end = '\0';
        char *value = eq + 1;
        while (is_blank(*value))
            value++;
        if (*s == '\0' || strpbrk(s, " \t"))
            return st_cli_fail(err, n, "%s:%d: expected 'key = value' with a key such as 'depth', "
                        "got '%s' before '='", ST_CLI_SHOW(cf->path), no, ST_CLI_SHOW(s));
        if (*value == '"' && unquote(value) != 0)
            return st_cli_fail(err, n, "%s:%d: %s: a quoted value ends at its closing '\"' and knows "
                        "the escapes \\\\ \\\" \\n \\t \\r \\xHH", ST_CLI_SHOW(cf->path), no,
                        ST_CLI_SHOW(s));
        if (add_entry(cf, cap, s, value, no, err, n))
            return -1;
    }
    return 0;
}

/* ------------------------------------------------------------ a metrics file */

typedef struct metrics_read {
    st_cli_config_file *cf;
    int cap;
    char *out;   /* where the next decoded string goes in cf->text */
    char *err;
    size_t n;
} metrics_read;

/* s copied to m->out (the line it was parsed from is no longer needed:
 * decoded strings are never longer than their JSON text), its copy. */
static char *keep(metrics_read *m, const char *s)
{
    char *at = m->out;
    const size_t len = strlen(s) + 1;
    memcpy(at, s, len);
    m->out += len;
    return at;
}

static int config_member(metrics_read *m, const char *key, const json_t *v)
{
    if (!json_is_string(v))
        return st_cli_fail(m->err, m->n, "%s:1: \"run\".\"config\".\"%s\": expected a string "
                           "(the value as --dump-config prints it)", ST_CLI_SHOW(m->cf->path),
                           ST_CLI_SHOW(key));
    key = keep(m, key);
    char *value = keep(m, json_string_value(v));
    if (*value == '"' && unquote(value) != 0)
        return st_cli_fail(m->err, m->n, "%s:1: %s: a quoted value ends at its closing '\"'",
                           ST_CLI_SHOW(m->cf->path), ST_CLI_SHOW(key));
    return add_entry(m->cf, m->cap, key, value, 1, m->err, m->n);
}

/* The first line parsed by jansson: an object whose "run" holds "config",
 * an object of strings.  Anything after the object on that line is not
 * read, and the lines after it are other records. */
static int parse_metrics(st_cli_config_file *cf, char *err, size_t n)
{
    char *nl = strchr(cf->text, '\n');
    if (nl)
        *nl = '\0';
    int cap = 1;
    for (const char *p = cf->text; *p; p++)
        cap += *p == ',';
    cf->entries = calloc((size_t)cap, sizeof *cf->entries);
    if (!cf->entries)
        return st_cli_fail(err, n, "--config %s: out of memory", ST_CLI_SHOW(cf->path));
    cf->from_metrics = 1;
    json_error_t e;
    json_t *record = json_loads(cf->text, JSON_DISABLE_EOF_CHECK | JSON_REJECT_DUPLICATES, &e);
    const json_t *run = json_object_get(record, "run");
    const json_t *config = json_object_get(run, "config");
    int r = 0;
    if (!record && json_error_code(&e) == json_error_duplicate_key)   /* " near '<the key>'" */
        r = st_cli_fail(err, n, "%s:1: a key twice in one object%s", ST_CLI_SHOW(cf->path),
                        strstr(e.text, " near ") ? strstr(e.text, " near ") : "");
    else if (!json_is_object(record) || (run && !json_is_object(run)) ||
        (config && !json_is_object(config)))
        r = st_cli_fail(err, n, "%s:1: not a JSON record (a metrics file's first line is one)",
                        ST_CLI_SHOW(cf->path));
    else if (!config)
        r = st_cli_fail(err, n, "%s:1: the first record has no \"run\":{\"config\":...} (the "
                        "metrics of a subtrain older than its provenance records?)",
                        ST_CLI_SHOW(cf->path));
    metrics_read m = { cf, cap, cf->text, err, n };
    const char *key;
    const json_t *v;
    if (r == 0)
        json_object_foreach((json_t *)config, key, v)
            if ((r = config_member(&m, key, v)) != 0)
                break;
    json_decref(record);
    return r;
}

int st_cli_config_read(const char *path, st_cli_config_file *cf, char *err, size_t n)
{
    memset(cf, 0, sizeof *cf);
    cf->path = path;
    FILE *f;
    if (st_file_open_read(path, &f) != ST_OK)
        return errno ? st_cli_fail(err, n, "--config %s: cannot read it: %s", ST_CLI_SHOW(path),
                                   strerror(errno))
                     : st_cli_fail(err, n, "--config %s", st_last_error());
    cf->text = malloc(CONFIG_MAX_BYTES + 1);
    if (!cf->text) {
        fclose(f);
        return st_cli_fail(err, n, "--config %s: out of memory", ST_CLI_SHOW(path));
    }
    size_t len = fread(cf->text, 1, CONFIG_MAX_BYTES + 1, f);
    int read_error = ferror(f) ? errno : 0;
    fclose(f);
    if (read_error)
        return st_cli_fail(err, n, "--config %s: cannot read it: %s", ST_CLI_SHOW(path),
                           strerror(read_error));
    cf->text[len < CONFIG_MAX_BYTES ? len : CONFIG_MAX_BYTES] = '\0';
    if (memchr(cf->text, '\0', len < CONFIG_MAX_BYTES ? len : CONFIG_MAX_BYTES))
        return st_cli_fail(err, n, "--config %s: a binary file, not a configuration",
                           ST_CLI_SHOW(path));
    const char *first = cf->text;
    while (is_blank(*first))
        first++;
    if (*first == '{') {
        if (len > CONFIG_MAX_BYTES && !strchr(cf->text, '\n'))
            return st_cli_fail(err, n, "%s:1: longer than %u bytes", ST_CLI_SHOW(path),
                               CONFIG_MAX_BYTES);
        return parse_metrics(cf, err, n);
    }
    if (len > CONFIG_MAX_BYTES)
        return st_cli_fail(err, n, "--config %s: larger than %u bytes", ST_CLI_SHOW(path),
                           CONFIG_MAX_BYTES);
    return parse_text(cf, err, n);
}

void st_cli_config_free(st_cli_config_file *cf)
{
    free(cf->text);
    free(cf->entries);
    memset(cf, 0, sizeof *cf);
}

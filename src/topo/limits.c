/*
 * topo/limits.c — how large a described topology may be, checked on its
 * description before hwloc loads it.
 *
 * Why: hwloc builds a synthetic topology by inserting every object from
 * the root down, comparing its cpuset with the siblings on each level it
 * passes, so the work grows as PUs x objects x siblings: 'core:20000
 * pu:1' takes minutes and 'pack:65536 pu:65536' never ends, and a run or
 * `subtrain topo` would hang rather than say anything.  An XML export is
 * imported the same way, about fifteen times faster per comparison.  The
 * estimate below is that work, counted from the description (the
 * synthetic string's arities, the XML file's object tree), and a
 * description above the budget is refused with one line saying so.
 *
 * The budgets: about two seconds of hwloc's time on a 2-core VM (the
 * load times they are set from: doc/benchmarks.md).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/file.h"
#include "topo/topo_internal.h"

#define SYNTHETIC_BUDGET 34359738368.0   /* 2^35 */
#define XML_BUDGET 549755813888.0        /* 2^39 */
#define XML_MAX_BYTES ((long long)64 << 20)
#define MAX_LEVELS 128                   /* hwloc's own limit */

/* The synthetic description's levels, as hwloc reads them
 * (hwloc_backend_synthetic_init): an optional "(attributes)" for the root,
 * then levels "[type:]arity[(attributes)]" separated by spaces, and
 * "[numa...]" attached memory, which adds no level.  Arities are read as
 * hwloc reads them (strtoul, base 0).  Returns the number of levels, or 0
 * when the string is not one hwloc would take (hwloc then says so). */
static int synthetic_arities(const char *desc, double *arity)
{
    const char *p = desc;
    int n = 0;
    if (*p == '(' && !(p = strchr(p, ')')))
        return 0;
    if (*p == ')')
        p++;
    for (;;) {
        while (*p == ' ')
            p++;
        if (!*p)
            break;
        if (*p == '[') {
            if (!(p = strchr(p, ']')))
                return 0;
            p++;
            continue;
        }
        if (*p < '0' || *p > '9') {
            const char *colon = strchr(p, ':');
            if (!colon)
                return 0;
            p = colon + 1;
        }
        char *end;
        errno = 0;
        unsigned long long v = strtoull(p, &end, 0);
        if (end == p || v == 0 || n == MAX_LEVELS)
            return 0;
        arity[n++] = errno == ERANGE ? 1.8e19 : (double)v;
        p = end;
        if (*p == '(' && !(p = strchr(p, ')')))
            return 0;
        if (*p == ')')
            p++;
    }
    return n;
}

/* The work of inserting a tree of these levels: each object at level L is
 * compared with the siblings of every level down to it, each comparison
 * reading cpusets as long as the PU count. */
static double synthetic_work(const double *arity, int n, double *pus)
{
    double count = 1.0, siblings = 0.0, work = 0.0;
    for (int l = 0; l < n; l++) {
        count *= arity[l];
        siblings += arity[l];
        work += count * siblings;
    }
    *pus = count;
    return work * count;
}

st_status st_topo_check_synthetic(const char *what, const char *desc)
{
    double arity[MAX_LEVELS], pus;
    int n = synthetic_arities(desc, arity);
    if (n == 0)
        return ST_OK;   /* not a description hwloc takes: it refuses it itself */
    double work = synthetic_work(arity, n, &pus);
    if (work <= SYNTHETIC_BUDGET)
        return ST_OK;
    double widest = 0.0;
    for (int l = 0; l < n; l++)
        widest = arity[l] > widest ? arity[l] : widest;
    return st_fail(ST_ERR_INVALID, "%s is too large: %.0f PUs, up to %.0f under one parent; "
                   "hwloc's work to build it (PUs x objects x siblings, %.1e) passes the "
                   "limit of %.1e ('pack:16 numa:4 core:64 pu:4' is 2.9e+10; doc/cli.md)",
                   what, pus, widest, work, SYNTHETIC_BUDGET);
}

/* ------------------------------------------------------------------ XML */

/* The object tree of an lstopo XML export, seen through its <object> tags
 * alone: each element's children and subtree size give the same work as
 * synthetic_work (sum over parents of children x (subtree - 1), times the
 * PUs).  Attribute values are skipped whole, so a '>' in an info value
 * does not end a tag. */
typedef struct xml_frame {
    double children, subtree;
} xml_frame;

static double xml_work(const char *text, size_t len, double *pus, double *widest)
{
    xml_frame stack[MAX_LEVELS + 2];
    int depth = 0;
    double work = 0.0;
    *pus = *widest = 0.0;
    stack[0].children = stack[0].subtree = 0.0;
    for (size_t i = 0; i < len; i++) {
        if (text[i] != '<')
            continue;
        if (len - i >= 9 && memcmp(text + i, "</object>", 9) == 0) {
            if (depth == 0)
                return -1.0;
            xml_frame *f = &stack[depth--];
            work += f->children * (f->subtree - 1.0);
            *widest = f->children > *widest ? f->children : *widest;
            stack[depth].subtree += f->subtree;
            continue;
        }
        if (len - i < 8 || memcmp(text + i, "<object", 7) != 0 ||
            (text[i + 7] != ' ' && text[i + 7] != '>' && text[i + 7] != '\n'))
            continue;
        /* the start tag: its end, and whether it closes itself */
        size_t j = i + 7;
        int pu = 0;
        char quote = 0;
        for (; j < len && (quote || text[j] != '>'); j++) {
            if (quote) {
                quote = text[j] == quote ? 0 : quote;
            } else if (text[j] == '"' || text[j] == '\'') {
                quote = text[j];
                pu |= j >= 5 && memcmp(text + j - 5, "type=", 5) == 0 && len - j > 4 &&
                      memcmp(text + j + 1, "PU", 2) == 0 && text[j + 3] == quote;
            }
        }
        if (j == len)
            return -1.0;
        *pus += pu;
        stack[depth].children += 1.0;
        if (text[j - 1] == '/') {   /* <object .../>: a leaf */
            stack[depth].subtree += 1.0;
        } else {
            if (depth == MAX_LEVELS + 1)
                return -1.0;
            depth++;
            stack[depth].children = 0.0;
            stack[depth].subtree = 1.0;
        }
        i = j;
    }
    if (depth != 0)
        return -1.0;
    *widest = stack[0].children > *widest ? stack[0].children : *widest;
    return work * *pus;
}

st_status st_topo_check_xml(const char *what, const char *path, int must_exist)
{
    /* a FIFO or a device would hang hwloc's own read: refused like every
     * file subtrain reads */
    FILE *f;
    if (st_file_open_read(path, &f) != ST_OK) {
        if (!must_exist && errno != 0)
            return ST_OK;   /* no such file: hwloc falls back to this machine */
        return st_fail(ST_ERR_IO, "%s: %s", what, st_last_error());
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        fclose(f);
        return st_fail(ST_ERR_IO, "%s: cannot read '%s': %s", what, path, strerror(errno));
    }
    if ((long long)sb.st_size > XML_MAX_BYTES) {
        fclose(f);
        return st_fail(ST_ERR_INVALID, "%s is too large: '%s' has %lld bytes, more than the "
                       "%lld MiB subtrain reads as a topology (doc/cli.md)", what,
                       path, (long long)sb.st_size, XML_MAX_BYTES >> 20);
    }
    size_t len = (size_t)sb.st_size;
    char *text = malloc(len ? len : 1);
    if (!text) {
        fclose(f);
        return st_fail(ST_ERR_NOMEM, "%s: out of memory reading '%s'", what, path);
    }
    size_t got = fread(text, 1, len, f);
    fclose(f);
    double pus, widest;
    double work = xml_work(text, got, &pus, &widest);
    free(text);
    if (work <= XML_BUDGET)   /* also a file that is not an export: hwloc refuses it */
        return ST_OK;
    return st_fail(ST_ERR_INVALID, "%s is too large: %.0f PUs, up to %.0f objects under one "
                   "parent; hwloc's work to import it (PUs x objects x siblings, %.1e) passes "
                   "the limit of %.1e for XML (doc/cli.md)", what, pus, widest, work,
                   XML_BUDGET);
}

/*
 * cli/config_file.h — options kept in a file (--config FILE) and printed
 * as one (--dump-config): the text form, independent of which options
 * exist (option_table.c knows those).
 *
 * A configuration file holds one `key = value` per line, the key a long
 * option's name without its dashes; blank lines and lines whose first
 * non-blank character is '#' are skipped.  A value is the rest of the line
 * with the blanks around it removed, or a quoted string ("...", with \\,
 * \", \n, \t, \r and \xHH escapes) when it has blanks at its ends or
 * characters a line cannot hold.  An empty value leaves the option at its
 * default.  A metrics file (its first line a JSON record with
 * "run":{"config":{...}}) is read as the configuration of the run that
 * wrote it: the same keys, the same values as strings.  doc/provenance.md.
 */
#ifndef SUBTRAIN_CLI_CONFIG_FILE_H
#define SUBTRAIN_CLI_CONFIG_FILE_H

#include <stddef.h>
#include <stdio.h>

typedef struct st_cli_config_entry {
    const char *key;
    const char *value;     /* unquoted; "" leaves the option at its default */
    int line;              /* in the file, 1-based */
} st_cli_config_entry;

typedef struct st_cli_config_file {
    const char *path;
    int from_metrics;      /* read from a metrics file's "run" record */
    char *text;            /* the file's bytes, cut into the entries' strings */
    st_cli_config_entry *entries;
    int n;
} st_cli_config_file;

/* Reads path into cf: 0, or -1 with a one-line message in err naming the
 * file (and the line: "FILE:LINE: ..."). */
int st_cli_config_read(const char *path, st_cli_config_file *cf, char *err, size_t n);
void st_cli_config_free(st_cli_config_file *cf);

/* A value as a configuration line carries it: itself, or quoted when it
 * must be (see above).  Always terminated; -1 when out was too small. */
int st_cli_config_quote(const char *value, char *out, size_t n);

/* s as a JSON string, quotes included. */
void st_cli_json_string(FILE *f, const char *s);

#endif /* SUBTRAIN_CLI_CONFIG_FILE_H */

/*
 * core/enum_table.h — private: names of enumerators from one table per enum.
 *
 * Each public enum with names has one table; its *_name and *_parse
 * functions are thin wrappers around the lookups below, so that the name
 * printed, the names accepted and the names listed in an error message
 * cannot disagree:
 *
 *   static const st_enum_entry activation_entries[] = {
 *       { "relu", ST_ACT_RELU }, { "gelu", ST_ACT_GELU },
 *   };
 *   static const st_enum_table activations = ST_ENUM_TABLE("activation", activation_entries);
 *
 * (The model kinds' names are their entries' in nn/model.c's table, parsed
 * through the same lookup.)
 *
 * A value's name is its first entry; later entries with the same value are
 * aliases: accepted by the parser, never printed or listed.
 */
#ifndef SUBTRAIN_CORE_ENUM_TABLE_H
#define SUBTRAIN_CORE_ENUM_TABLE_H

#include <stddef.h>

#include <subtrain/status.h>

typedef struct st_enum_entry {
    const char *name;
    int value;
} st_enum_entry;

typedef struct st_enum_table {
    const char *what;              /* "model", "activation": for messages */
    const st_enum_entry *entries;
    size_t count;
} st_enum_table;

#define ST_ENUM_TABLE(what, entries) { (what), (entries), sizeof(entries) / sizeof((entries)[0]) }

/* The value's name, or "unknown" when no entry has it. */
const char *st_enum_name(const st_enum_table *t, int value);

/* Sets *out to the value named `name` (exact, case-sensitive match).
 * Otherwise ST_ERR_INVALID with "unknown model 'foo' (allowed: mlp, resmlp, ...)"
 * and *out untouched. */
st_status st_enum_parse(const st_enum_table *t, const char *name, int *out);

/* Writes the allowed names, aliases left out, as "mlp, resmlp" (clipped to
 * n - 1 characters, always terminated when n > 0); returns the length the
 * whole list needs, like snprintf. */
size_t st_enum_allowed(const st_enum_table *t, char *buf, size_t n);

#endif /* SUBTRAIN_CORE_ENUM_TABLE_H */

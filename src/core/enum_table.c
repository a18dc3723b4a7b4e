/* core/enum_table.c — name and parse lookups over an enum's table. */
#include <string.h>

#include "core/enum_table.h"
#include "core/error.h"

/* Names quoted in a message are clipped so that the list of allowed names
 * always fits in the message buffer. */
#define QUOTED_MAX 64

const char *st_enum_name(const st_enum_table *t, int value)
{
    for (size_t i = 0; i < t->count; i++)
        if (t->entries[i].value == value)
            return t->entries[i].name;
    return "unknown";
}

/* An alias is an entry whose value an earlier entry already names. */
static int is_alias(const st_enum_table *t, size_t i)
{
    for (size_t j = 0; j < i; j++)
        if (t->entries[j].value == t->entries[i].value)
            return 1;
    return 0;
}

size_t st_enum_allowed(const st_enum_table *t, char *buf, size_t n)
{
    size_t len = 0;
    if (n > 0)
        buf[0] = '\0';
    for (size_t i = 0; i < t->count; i++) {
        if (is_alias(t, i))
            continue;
        const char *parts[2] = { len ? ", " : "", t->entries[i].name };
        for (int p = 0; p < 2; p++) {
            size_t k = strlen(parts[p]);
            if (len + 1 < n) {
                size_t room = n - 1 - len;
                memcpy(buf + len, parts[p], k < room ? k : room);
                buf[len + (k < room ? k : room)] = '\0';
            }
            len += k;
        }
    }
    return len;
}

st_status st_enum_parse(const st_enum_table *t, const char *name, int *out)
{
    for (size_t i = 0; name && i < t->count; i++)
        if (strcmp(t->entries[i].name, name) == 0) {
            *out = t->entries[i].value;
            return ST_OK;
        }
    char allowed[256];
    st_enum_allowed(t, allowed, sizeof allowed);
    if (!name)
        return st_fail(ST_ERR_INVALID, "no %s name given (allowed: %s)", t->what, allowed);
    size_t len = strlen(name);
    return st_fail(ST_ERR_INVALID, "unknown %s '%.*s%s' (allowed: %s)", t->what,
                   (int)(len > QUOTED_MAX ? QUOTED_MAX : len), name,
                   len > QUOTED_MAX ? "..." : "", allowed);
}

/*
 * tests/json_check.h — a strict JSON validator (RFC 8259) for the tests
 * that read metrics files: every line of JSON Lines must be one JSON value
 * that any parser accepts, so the bare nan, inf, trailing commas or
 * unquoted keys that a printf-built record can produce are caught here
 * (python3 or jq may not exist where the tests run).
 *
 * st_json_valid(text) is 1 when text is exactly one JSON value with
 * optional whitespace around it.
 */
#ifndef SUBTRAIN_TESTS_JSON_CHECK_H
#define SUBTRAIN_TESTS_JSON_CHECK_H

#include <string.h>

#define ST_JSON_MAX_DEPTH 64

static const char *st_json_value(const char *p, int depth);

static const char *st_json_ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    return p;
}

static int st_json_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static const char *st_json_string(const char *p)
{
    if (*p++ != '"')
        return NULL;
    for (;;) {
        unsigned char c = (unsigned char)*p++;
        if (c == '"')
            return p;
        if (c < 0x20)   /* the end of the text, or an unescaped control */
            return NULL;
        if (c == '\\') {
            c = (unsigned char)*p++;
            if (c == 'u') {
                for (int i = 0; i < 4; i++)
                    if (!st_json_hex(*p++))
                        return NULL;
            } else if (!strchr("\"\\/bfnrt", c) || c == '\0') {
                return NULL;
            }
        }
    }
}

/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static const char *st_json_number(const char *p)
{
    if (*p == '-')
        p++;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (*p >= '0' && *p <= '9')
            p++;
    } else {
        return NULL;
    }
    if (*p == '.') {
        p++;
        if (!(*p >= '0' && *p <= '9'))
            return NULL;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-')
            p++;
        if (!(*p >= '0' && *p <= '9'))
            return NULL;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    return p;
}

/* An object ('{') or array ('['): members "key": value or values,
 * separated by commas, none trailing. */
static const char *st_json_container(const char *p, int depth)
{
    const char close = *p == '{' ? '}' : ']';
    const int object = *p == '{';
    p = st_json_ws(p + 1);
    if (*p == close)
        return p + 1;
    for (;;) {
        if (object) {
            if (!(p = st_json_string(p)))
                return NULL;
            p = st_json_ws(p);
            if (*p++ != ':')
                return NULL;
        }
        if (!(p = st_json_value(p, depth + 1)))
            return NULL;
        if (*p == close)
            return p + 1;
        if (*p++ != ',')
            return NULL;
        p = st_json_ws(p);
    }
}

/* One value and the whitespace after it; NULL when it is not JSON. */
static const char *st_json_value(const char *p, int depth)
{
    if (depth > ST_JSON_MAX_DEPTH)
        return NULL;
    p = st_json_ws(p);
    if (*p == '{' || *p == '[')
        p = st_json_container(p, depth);
    else if (*p == '"')
        p = st_json_string(p);
    else if (strncmp(p, "true", 4) == 0)
        p += 4;
    else if (strncmp(p, "false", 5) == 0)
        p += 5;
    else if (strncmp(p, "null", 4) == 0)
        p += 4;
    else
        p = st_json_number(p);
    return p ? st_json_ws(p) : NULL;
}

static inline int st_json_valid(const char *text)
{
    const char *end = st_json_value(text, 0);
    return end && *end == '\0';
}

#endif /* SUBTRAIN_TESTS_JSON_CHECK_H */

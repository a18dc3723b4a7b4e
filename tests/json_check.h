/*
 * tests/json_check.h — the JSON check of the tests that read metrics
 * files: every line of JSON Lines must be one JSON value that any parser
 * accepts, so the bare nan, inf, trailing commas or unquoted keys that a
 * printf-built record can produce are caught here.  jansson parses (the
 * library the safetensors reader uses); python3 or jq may not exist where
 * the tests run.
 *
 * st_json_valid(text) is 1 when text is exactly one JSON value with
 * optional whitespace around it, and no object in it names a key twice.
 * Numbers are read as doubles, so that an integer past 2^63 is valid JSON
 * here as it is for any reader.
 */
#ifndef SUBTRAIN_TESTS_JSON_CHECK_H
#define SUBTRAIN_TESTS_JSON_CHECK_H

#include <math.h>
#include <string.h>

#include <jansson.h>

static inline int st_json_valid(const char *text)
{
    json_error_t e;
    json_t *v = json_loads(text, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES |
                           JSON_DECODE_INT_AS_REAL, &e);
    json_decref(v);
    return v != NULL;
}

/* The first number named `key` in v, depth first through its objects
 * and arrays; NAN when there is none (a null included). */
static inline double st_json_find_number(const json_t *v, const char *key)
{
    if (json_is_object(v)) {
        const json_t *x = json_object_get(v, key);
        if (json_is_number(x))
            return json_number_value(x);
        const char *k;
        json_t *child;
        json_object_foreach((json_t *)v, k, child) {
            const double d = st_json_find_number(child, key);
            if (!isnan(d))
                return d;
        }
    } else if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            const double d = st_json_find_number(json_array_get(v, i), key);
            if (!isnan(d))
                return d;
        }
    }
    return NAN;
}

/* The number `key` of the JSON Lines record (the line of text) that holds
 * position `at`: NAN when that line is no JSON or has no such number. */
static inline double st_json_number_at(const char *text, const char *at, const char *key)
{
    const char *start = at, *end = strchr(at, '\n');
    while (start > text && start[-1] != '\n')
        start--;
    json_error_t e;
    json_t *v = json_loadb(start, end ? (size_t)(end - start) : strlen(start),
                           JSON_DECODE_INT_AS_REAL, &e);
    const double d = v ? st_json_find_number(v, key) : NAN;
    json_decref(v);
    return d;
}

#endif /* SUBTRAIN_TESTS_JSON_CHECK_H */

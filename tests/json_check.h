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

#include <jansson.h>

static inline int st_json_valid(const char *text)
{
    json_error_t e;
    json_t *v = json_loads(text, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES |
                           JSON_DECODE_INT_AS_REAL, &e);
    json_decref(v);
    return v != NULL;
}

#endif /* SUBTRAIN_TESTS_JSON_CHECK_H */

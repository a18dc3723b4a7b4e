/*
 * core/error.h — private: setting the thread's error message, check macros.
 *
 *   if (n == 0) return st_fail(ST_ERR_INVALID, "width must be > 0, got %d", n);
 *   ST_TRY(st_arena_alloc(...));          // propagate a failure as is
 */
#ifndef SUBTRAIN_CORE_ERROR_H
#define SUBTRAIN_CORE_ERROR_H

#include <subtrain/status.h>

#if defined(__GNUC__)
#define ST_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define ST_PRINTF(a, b)
#endif

/* Records a formatted message for st_last_error() and returns `status`. */
st_status st_fail(st_status status, const char *fmt, ...) ST_PRINTF(2, 3);

/* Prefixes the current message with "context: " (keeps the status). */
st_status st_fail_context(st_status status, const char *fmt, ...) ST_PRINTF(2, 3);

#define ST_TRY(expr)                         \
    do {                                     \
        st_status st_try_status_ = (expr);   \
        if (st_try_status_ != ST_OK)         \
            return st_try_status_;           \
    } while (0)

/* For cleanup paths: jump to `label` with `status` set on failure. */
#define ST_TRY_GOTO(status, expr, label)     \
    do {                                     \
        (status) = (expr);                   \
        if ((status) != ST_OK)               \
            goto label;                      \
    } while (0)

#endif /* SUBTRAIN_CORE_ERROR_H */

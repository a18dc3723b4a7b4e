/* core/status.c — status names and the thread-local last-error message. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* One message per thread: a worker's failure must not be overwritten by
 * another worker's before the caller reads it. */
static _Thread_local char last_error[512];

/* What of a message too long for last_error survives: its start (what
 * failed) and its end (why), joined by ELLIPSIS.  The long part of such a
 * message is a path or a name in the middle ("PATH: cannot open: CAUSE",
 * "... not found in DIR (missing NAME); install it ..."), so cutting the
 * middle keeps the cause that cutting the end would lose. */
#define ELLIPSIS "[...]"
#define KEEP_HEAD 160

/* Copies msg (len bytes) into last_error, eliding its middle if needed. */
static void keep_ends(const char *msg, size_t len)
{
    if (len < sizeof last_error) {
        memcpy(last_error, msg, len + 1);
        return;
    }
    const size_t tail = sizeof last_error - 1 - KEEP_HEAD - (sizeof ELLIPSIS - 1);
    memcpy(last_error, msg, KEEP_HEAD);
    memcpy(last_error + KEEP_HEAD, ELLIPSIS, sizeof ELLIPSIS - 1);
    memcpy(last_error + KEEP_HEAD + sizeof ELLIPSIS - 1, msg + len - tail, tail + 1);
}

/* Formats into last_error, keeping both ends of a long message.  Up to
 * 16 KiB is formatted on the stack (two PATH_MAX paths and the words
 * around them); a longer one, only ever a failure, takes the heap. */
static void set_message(const char *fmt, va_list ap)
{
    char buf[16384];
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    if (n < 0) {
        snprintf(last_error, sizeof last_error, "(unprintable message: %s)", fmt);
    } else if ((size_t)n < sizeof buf) {
        keep_ends(buf, (size_t)n);
    } else {
        char *big = malloc((size_t)n + 1);
        if (big && vsnprintf(big, (size_t)n + 1, fmt, again) == n)
            keep_ends(big, (size_t)n);
        else
            keep_ends(buf, sizeof buf - 1);
        free(big);
    }
    va_end(again);
}

const char *st_status_name(st_status status)
{
    switch (status) {
    case ST_OK: return "success";
    case ST_ERR_INVALID: return "invalid argument";
    case ST_ERR_NOMEM: return "out of memory";
    case ST_ERR_IO: return "I/O error";
    case ST_ERR_FORMAT: return "malformed data";
    case ST_ERR_DNNL: return "oneDNN error";
    case ST_ERR_TOPOLOGY: return "topology error";
    case ST_ERR_NUMERIC: return "numerical error";
    }
    return "unknown status";
}

const char *st_last_error(void)
{
    return last_error;
}

void st_clear_error(void)
{
    last_error[0] = '\0';
}

st_status st_fail(st_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_message(fmt, ap);
    va_end(ap);
    return status;
}

st_status st_fail_context(st_status status, const char *fmt, ...)
{
    /* "context: old message", as one message whose middle gives way when
     * it is too long (the old message's cause is at its end) */
    char old[sizeof last_error], buf[16384];
    memcpy(old, last_error, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    const size_t room = sizeof buf - strlen(old) - 2;   /* the old message always fits */
    int n = vsnprintf(buf, room, fmt, ap);
    va_end(ap);
    size_t used = n < 0 ? 0 : (size_t)n < room ? (size_t)n : room - 1;
    snprintf(buf + used, sizeof buf - used, ": %s", old);
    keep_ends(buf, strlen(buf));
    return status;
}

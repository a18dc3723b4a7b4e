/* core/status.c — status names and the thread-local last-error message. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"

/* One message per thread: a worker's failure must not be overwritten by
 * another worker's before the caller reads it. */
static _Thread_local char last_error[512];

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
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

st_status st_fail_context(st_status status, const char *fmt, ...)
{
    char old[sizeof last_error];
    memcpy(old, last_error, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    /* Append ": old message" after the prefix, clipped to the buffer. */
    size_t used = n < 0 ? 0 : (size_t)n < sizeof last_error ? (size_t)n : sizeof last_error - 1;
    size_t room = sizeof last_error - used;
    if (room > 3) {
        memcpy(last_error + used, ": ", 2);
        size_t keep = strlen(old) < room - 3 ? strlen(old) : room - 3;
        memcpy(last_error + used + 2, old, keep);
        last_error[used + 2 + keep] = '\0';
    }
    return status;
}

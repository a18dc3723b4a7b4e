/*
 * subtrain/status.h — status codes and the last error's message.
 *
 * Library functions never exit and never print: they return an st_status and
 * leave a one-line human message, retrievable with st_last_error(), in
 * thread-local storage (each worker thread has its own).
 */
#ifndef SUBTRAIN_STATUS_H
#define SUBTRAIN_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum st_status {
    ST_OK = 0,
    ST_ERR_INVALID,     /* bad argument or configuration */
    ST_ERR_NOMEM,       /* an allocation failed */
    ST_ERR_IO,          /* a file could not be opened, read or written */
    ST_ERR_FORMAT,      /* a file's content is malformed */
    ST_ERR_DNNL,        /* oneDNN refused a descriptor, primitive or execution */
    ST_ERR_TOPOLOGY,    /* hwloc topology, placement or binding failed */
    ST_ERR_NUMERIC,     /* a loss or gradient became NaN or infinite */
} st_status;

/* Names of enumerators.  Every enum with names has st_<enum>_name(value),
 * which returns "unknown" for a value out of range, and most have
 * st_<enum>_parse(name, &value): ST_OK, or ST_ERR_INVALID with a message
 * that lists the names allowed, "unknown model 'foo' (allowed: mlp, resmlp,
 * resnet, resnet18, gpt)", and the value left unchanged. */

/* Short name of a status code ("invalid argument", "I/O error", ...). */
const char *st_status_name(st_status status);

/* Message of the last failure on the calling thread ("" if none). */
const char *st_last_error(void);

/* Forget the calling thread's last error message. */
void st_clear_error(void);

#ifdef __cplusplus
}
#endif
#endif /* SUBTRAIN_STATUS_H */

/*
 * data/gzio.h — private: reading plain or gzip files through zlib, with
 * errors as statuses (gzio.c).
 */
#ifndef SUBTRAIN_DATA_GZIO_H
#define SUBTRAIN_DATA_GZIO_H

#include <stddef.h>

#include <zlib.h>

#include <subtrain/status.h>

/* Opens path for reading (plain or gzip), with a read buffer of `buffer`
 * bytes (0: zlib's default). */
st_status st_gz_open(const char *path, unsigned buffer, gzFile *out);
/* ST_OK when the stream is healthy, else its error as a status naming
 * path (a gzip stream that ends early: truncated; a damaged one: corrupt). */
st_status st_gz_check(gzFile gz, const char *path, int saved_errno);
/* Reads up to len bytes into buf; *got is how many arrived.  A short count
 * with ST_OK means the end of the file. */
st_status st_gz_read_upto(gzFile gz, const char *path, void *buf, size_t len, size_t *got);

#endif /* SUBTRAIN_DATA_GZIO_H */

/*
 * data/gzio.h — private: reading plain or gzip files, with errors as
 * statuses (gzio.c).
 */
#ifndef SUBTRAIN_DATA_GZIO_H
#define SUBTRAIN_DATA_GZIO_H

#include <stddef.h>

#include <zlib.h>

#include <subtrain/status.h>

typedef struct st_gz st_gz;

/* Opens path for reading, with an input buffer of `buffer` bytes (0: 64
 * KiB): gzip when it starts with the gzip magic, else plain.  A file that
 * is not a regular file is refused before it is read (core/file.h). */
st_status st_gz_open(const char *path, unsigned buffer, st_gz **out);
/* Reads up to len bytes into buf; *got is how many arrived.  A short count
 * with ST_OK means the end of the file.  A gzip file: concatenated members
 * read as one stream; one that ends early is truncated, a damaged one
 * corrupt, bytes after the last member that are not another member are
 * trailing bytes (all ST_ERR_FORMAT, naming path). */
st_status st_gz_read_upto(st_gz *g, const char *path, void *buf, size_t len, size_t *got);
/* Whether the file is read as gzip (1) or as it is (0); its size on disk
 * when it was opened, in bytes. */
int st_gz_compressed(const st_gz *g);
unsigned long long st_gz_file_bytes(const st_gz *g);
/* A gzip file's last four bytes: the length (modulo 2^32) its last member
 * records for its data (ISIZE), read without decompressing; 0 in *ok when
 * the file is too short to have them or is not gzip. */
st_status st_gz_recorded_length(const st_gz *g, const char *path, unsigned long *length,
                                int *ok);
void st_gz_close(st_gz *g);

#endif /* SUBTRAIN_DATA_GZIO_H */

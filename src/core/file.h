/*
 * core/file.h — private: opening a file that subtrain reads (weights,
 * checkpoints, data, configuration), the one way every reader does it;
 * and a fault for the tests of its writers.
 */
#ifndef SUBTRAIN_CORE_FILE_H
#define SUBTRAIN_CORE_FILE_H

#include <stdio.h>

#include <subtrain/status.h>

/* Opens path for reading ("rb") into *out, or refuses it before anything
 * could block: the open is non-blocking (a FIFO without a writer would
 * otherwise hang in open(2) itself), fstat(2) then refuses anything but a
 * regular file, and a regular file is read in blocking mode.  Failures are
 * ST_ERR_IO, "PATH: cannot open: REASON" with errno left as open(2) set
 * it, or "PATH: not a regular file (a FIFO)" with errno 0. */
st_status st_file_open_read(const char *path, FILE **out);

/* SUBTRAIN_FAULT=stop:NAME or slow:NAME, for the tests of signals and
 * kills mid-write (doc/reliability.md): a writer calls this with the file
 * it is about to rename into place, and when that file's name is NAME the
 * process stops itself (SIGSTOP), or sleeps 5 s, a slow disk's write. */
void st_file_fault_in_write(const char *path);

#endif /* SUBTRAIN_CORE_FILE_H */

/*
 * fuzz/fuzz_file.h — the fuzz input as a file, for the readers that take a
 * path (st_idx_read, st_safetensors_read, st_cifar_load_files,
 * st_text_load).  The library has no buffer entry points and gets none for
 * fuzzing: the readers are tested as the program uses them, through
 * open, fstat and read.
 *
 * One memfd per process, rewritten for every input and named
 * /proc/self/fd/N: opening that name opens the memfd afresh (its own
 * offset), it is a regular file to fstat, and nothing touches a disk, so
 * an input costs two system calls.  Where memfd_create is missing (not
 * Linux), a file in a fresh temporary directory, removed at exit.
 */
#ifndef SUBTRAIN_FUZZ_FILE_H
#define SUBTRAIN_FUZZ_FILE_H

#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static char fuzz_path_[64];
static int fuzz_fd_ = -1;

#ifndef MFD_CLOEXEC
static char fuzz_dir_[64];
static void fuzz_remove_(void)
{
    unlink(fuzz_path_);
    rmdir(fuzz_dir_);
}
#endif

/* Aborts: a harness that cannot write its input finds nothing. */
static inline void fuzz_die_(const char *what)
{
    perror(what);
    abort();
}

/* Writes data[0 .. size) to the process's input file; returns its name. */
static inline const char *fuzz_file(const uint8_t *data, size_t size)
{
    if (fuzz_fd_ < 0) {
#ifdef MFD_CLOEXEC
        fuzz_fd_ = memfd_create("subtrain-fuzz", MFD_CLOEXEC);
        if (fuzz_fd_ < 0)
            fuzz_die_("memfd_create");
        snprintf(fuzz_path_, sizeof fuzz_path_, "/proc/self/fd/%d", fuzz_fd_);
#else
        const char *tmp = getenv("TMPDIR");
        snprintf(fuzz_dir_, sizeof fuzz_dir_, "%s/subtrain-fuzz.XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(fuzz_dir_))
            fuzz_die_("mkdtemp");
        snprintf(fuzz_path_, sizeof fuzz_path_, "%s/input", fuzz_dir_);
        fuzz_fd_ = open(fuzz_path_, O_RDWR | O_CREAT | O_TRUNC, 0600);
        if (fuzz_fd_ < 0)
            fuzz_die_(fuzz_path_);
        atexit(fuzz_remove_);
#endif
    }
    if (ftruncate(fuzz_fd_, 0) != 0)
        fuzz_die_("ftruncate");
    size_t done = 0;
    while (done < size) {
        ssize_t w = pwrite(fuzz_fd_, data + done, size - done, (off_t)done);
        if (w <= 0)
            fuzz_die_("pwrite");
        done += (size_t)w;
    }
    return fuzz_path_;
}

/* A check of the reader's own promise: a failure is a finding. */
#define FUZZ_CHECK(cond)                                                                    \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);        \
            abort();                                                                        \
        }                                                                                   \
    } while (0)

#endif /* SUBTRAIN_FUZZ_FILE_H */

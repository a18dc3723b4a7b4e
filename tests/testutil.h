/*
 * tests/testutil.h — small helpers shared by the tests: scratch directories
 * and files.  Header-only, every function static.
 *
 * Uses POSIX (mkdtemp, unlink, rmdir, opendir); include it before any other
 * header when building with a strict -std=c11, so that the feature macro
 * below takes effect.
 */
#ifndef SUBTRAIN_TESTUTIL_H
#define SUBTRAIN_TESTUTIL_H

#if !defined(_POSIX_C_SOURCE) && !defined(_GNU_SOURCE) && !defined(_DEFAULT_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif

#include <dirent.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ST_TEST_PATH_MAX 4096

/* Creates a fresh, empty directory /tmp/subtrain-test-XXXXXX; dir must hold
 * ST_TEST_PATH_MAX bytes.  Returns 0 on success, -1 on failure. */
static inline int st_test_mkdtemp(char *dir)
{
    strcpy(dir, "/tmp/subtrain-test-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

/* path = dir/name (ST_TEST_PATH_MAX bytes); returns path, or aborts the
 * test program if the name does not fit: a clipped path would make a test
 * pass or fail for the wrong reason. */
static inline char *st_test_path(char *path, const char *dir, const char *name)
{
    int n = snprintf(path, ST_TEST_PATH_MAX, "%s/%s", dir, name);
    if (n < 0 || n >= ST_TEST_PATH_MAX)
        abort();
    return path;
}

/* Writes exactly len bytes to path, replacing it.  Returns 0 or -1. */
static inline int st_test_write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t wrote = len ? fwrite(data, 1, len, f) : 0;
    int closed = fclose(f);
    return wrote == len && closed == 0 ? 0 : -1;
}

/* Reads the whole of path into a malloc'd buffer (*len bytes); NULL on
 * failure.  The caller frees it. */
static inline unsigned char *st_test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    unsigned char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        unsigned char *p = realloc(buf, cap * 2);
        if (!p) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = p;
        cap *= 2;
    }
    if (buf && ferror(f)) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = buf ? n : 0;
    return buf;
}

/* Removes dir and what is in it (two levels: the tests' runs write
 * checkpoint directories into their own). */
static inline void st_test_rmdir_depth(const char *dir, int depth)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char path[ST_TEST_PATH_MAX];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            st_test_path(path, dir, e->d_name);
            if (unlink(path) != 0 && depth > 0)
                st_test_rmdir_depth(path, depth - 1);
        }
        closedir(d);
    }
    rmdir(dir);
}

static inline void st_test_rmdir(const char *dir)
{
    st_test_rmdir_depth(dir, 1);
}

#endif /* SUBTRAIN_TESTUTIL_H */

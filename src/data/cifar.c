/*
 * data/cifar.c — the CIFAR-10 and CIFAR-100 binary formats.
 *
 * A file is a sequence of fixed-size records and nothing else:
 *   CIFAR-10    1 label byte (0..9), 3072 pixel bytes
 *   CIFAR-100   coarse label byte (0..19), fine label byte (0..99), 3072 pixels
 * The pixels are 1024 red, 1024 green and 1024 blue values, each plane a
 * row-major 32 x 32 image: a record is already channel-major (CHW).
 *
 * Files come from outside and nothing in them is trusted: the size must be
 * a whole, non-zero number of records (what the size says is what is
 * allocated: the file is really that large, unlike an IDX header's claim),
 * every label is checked, and a file that changes size while it is read is
 * reported.  Every message names the file.
 */
#define _POSIX_C_SOURCE 200809L   /* fileno */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <subtrain/data.h>

#include "core/error.h"
#include "core/file.h"

/* Largest file accepted (1 GiB; the real ones are 31 MB and 154 MB). */
#define CIFAR_MAX_FILE ((int64_t)1 << 30)
#define CHUNK_RECORDS 256   /* records converted per read */

typedef struct cifar_format {
    const char *name;       /* "CIFAR-10" */
    const char *option;     /* "cifar10" */
    const char *archive;    /* what to download */
    const char *folder;     /* what it extracts to */
    size_t label_bytes;     /* before the pixels */
    uint32_t n_classes;     /* of the label kept (the last label byte) */
    uint32_t coarse;        /* CIFAR-100: classes of the first label byte */
} cifar_format;

static const cifar_format formats[] = {
    [ST_CIFAR10] = { "CIFAR-10", "cifar10", "cifar-10-binary.tar.gz", "cifar-10-batches-bin",
                     1, 10, 0 },
    [ST_CIFAR100] = { "CIFAR-100", "cifar100", "cifar-100-binary.tar.gz", "cifar-100-binary",
                      2, 100, 20 },
};

static size_t record_bytes(const cifar_format *f)
{
    return f->label_bytes + ST_CIFAR_PIXELS;
}

/* The number of records of an open file, from its size. */
static st_status count_records(const cifar_format *f, const char *path, FILE *file,
                               uint32_t *records)
{
    struct stat st;
    if (fstat(fileno(file), &st) != 0)
        return st_fail(ST_ERR_IO, "%s: cannot read its size: %s", path, strerror(errno));
    int64_t size = (int64_t)st.st_size, rec = (int64_t)record_bytes(f);
    if (size == 0)
        return st_fail(ST_ERR_FORMAT, "%s: file is empty", path);
    if (size > CIFAR_MAX_FILE)
        return st_fail(ST_ERR_FORMAT, "%s: %lld bytes, more than the %lld-byte limit for one "
                       "%s file", path, (long long)size, (long long)CIFAR_MAX_FILE, f->name);
    if (size % rec != 0)
        return st_fail(ST_ERR_FORMAT, "%s: %lld bytes is not a whole number of %lld-byte %s "
                       "records (%lld records and %lld bytes over); not a %s binary file, "
                       "or truncated", path, (long long)size, (long long)rec, f->name,
                       (long long)(size / rec), (long long)(size % rec), f->name);
    *records = (uint32_t)(size / rec);
    return ST_OK;
}

static st_status open_file(const cifar_format *f, const char *path, FILE **out)
{
    st_status s = st_file_open_read(path, out);
    if (s != ST_OK && (errno == ENOENT || errno == ENOTDIR))
        return st_fail(ST_ERR_IO, "%s: no such file; %s is not packaged on Debian: download "
                       "the binary version (%s) from https://www.cs.toronto.edu/~kriz/cifar.html, "
                       "extract it and point --data %s:DIR at the extracted %s directory",
                       path, f->name, f->archive, f->option, f->folder);
    return s;
}

/* The size of one file, in records (opened, measured, closed). */
static st_status probe_file(const cifar_format *f, const char *path, uint32_t *records)
{
    FILE *file;
    ST_TRY(open_file(f, path, &file));
    st_status s = count_records(f, path, file, records);
    fclose(file);
    return s;
}

/* Checks a chunk's labels; `first` is the chunk's first record in the file. */
static st_status check_labels(const cifar_format *f, const char *path, const uint8_t *buf,
                              size_t n, size_t first)
{
    size_t rec = record_bytes(f);
    for (size_t r = 0; r < n; r++) {
        const uint8_t *p = buf + r * rec;
        if (f->coarse && p[0] >= f->coarse)
            return st_fail(ST_ERR_FORMAT, "%s: record %zu has coarse label %u, outside "
                           "0..%lu; not a %s file", path, first + r, (unsigned)p[0],
                           (unsigned long)f->coarse - 1, f->name);
        uint8_t label = p[f->label_bytes - 1];
        if (label >= f->n_classes)
            return st_fail(ST_ERR_FORMAT, "%s: record %zu has %slabel %u, outside 0..%lu; "
                           "not a %s file", path, first + r, f->coarse ? "fine " : "",
                           (unsigned)label, (unsigned long)f->n_classes - 1, f->name);
    }
    return ST_OK;
}

/* Reads the `records` records of path into x (records, 3072) and y, through
 * buf (chunk records: CHUNK_RECORDS, fewer when no file holds that many,
 * so that a small file costs no 786 KB buffer). */
static st_status read_file(const cifar_format *f, const char *path, uint32_t records,
                           uint32_t chunk, uint8_t *buf, float *x, uint8_t *y)
{
    FILE *file;
    ST_TRY(open_file(f, path, &file));
    uint32_t now = 0;
    st_status s = count_records(f, path, file, &now);
    if (s == ST_OK && now != records)
        s = st_fail(ST_ERR_IO, "%s: changed size while it was being read (%lu records, "
                    "then %lu)", path, (unsigned long)records, (unsigned long)now);
    size_t rec = record_bytes(f);
    for (size_t done = 0; s == ST_OK && done < records;) {
        size_t n = records - done < chunk ? records - done : chunk;
        errno = 0;
        size_t got = fread(buf, 1, n * rec, file);
        if (got < n * rec) {
            if (ferror(file))
                s = st_fail(ST_ERR_IO, "%s: read failed: %s", path,
                            errno ? strerror(errno) : "I/O error");
            else
                s = st_fail(ST_ERR_FORMAT, "%s: truncated while being read (%zu of %zu "
                            "bytes)", path, done * rec + got, (size_t)records * rec);
            break;
        }
        s = check_labels(f, path, buf, n, done);
        if (s != ST_OK)
            break;
        for (size_t r = 0; r < n; r++) {
            const uint8_t *p = buf + r * rec;
            float *row = x + (done + r) * ST_CIFAR_PIXELS;
            y[done + r] = p[f->label_bytes - 1];
            p += f->label_bytes;
            for (size_t i = 0; i < ST_CIFAR_PIXELS; i++)
                row[i] = (float)p[i] * (1.0f / 255.0f);
        }
        done += n;
    }
    fclose(file);
    return s;
}

st_status st_cifar_load_files(st_cifar_kind kind, const char *const *paths, int n_paths,
                              st_dataset *out)
{
    if (!out)
        return st_fail(ST_ERR_INVALID, "st_cifar_load_files: no output dataset");
    memset(out, 0, sizeof *out);
    if (kind != ST_CIFAR10 && kind != ST_CIFAR100)
        return st_fail(ST_ERR_INVALID, "st_cifar_load_files: unknown CIFAR kind %d", (int)kind);
    if (!paths || n_paths < 1)
        return st_fail(ST_ERR_INVALID, "st_cifar_load_files: no files");
    const cifar_format *f = &formats[kind];

    /* First the sizes: the arrays are allocated once, at the total. */
    uint32_t *records = malloc((size_t)n_paths * sizeof *records);
    if (!records)
        return st_fail(ST_ERR_NOMEM, "%s: out of memory", f->name);
    uint64_t total = 0;
    uint32_t chunk = 1;   /* records a read converts: CHUNK_RECORDS, or the largest file */
    st_status s = ST_OK;
    for (int i = 0; s == ST_OK && i < n_paths; i++) {
        if (!paths[i])
            s = st_fail(ST_ERR_INVALID, "st_cifar_load_files: file %d has no name", i);
        else
            s = probe_file(f, paths[i], &records[i]);
        total += s == ST_OK ? records[i] : 0;
        if (s == ST_OK && records[i] > chunk)
            chunk = records[i] < CHUNK_RECORDS ? records[i] : CHUNK_RECORDS;
    }
    if (s == ST_OK && (total > UINT32_MAX ||
                       total > SIZE_MAX / (ST_CIFAR_PIXELS * sizeof(float))))
        s = st_fail(ST_ERR_NOMEM, "%s: %llu records in %d files do not fit in memory",
                    paths[0], (unsigned long long)total, n_paths);

    float *x = NULL;
    uint8_t *y = NULL, *buf = NULL;
    if (s == ST_OK) {
        x = malloc((size_t)total * ST_CIFAR_PIXELS * sizeof *x);   // (total, 3072)
        y = malloc((size_t)total);
        buf = malloc((size_t)chunk * record_bytes(f));
        if (!x || !y || !buf)
            s = st_fail(ST_ERR_NOMEM, "%s: out of memory for %llu %s images", paths[0],
                        (unsigned long long)total, f->name);
    }
    size_t at = 0;
    for (int i = 0; s == ST_OK && i < n_paths; i++) {
        s = read_file(f, paths[i], records[i], chunk, buf, x + at * ST_CIFAR_PIXELS, y + at);
        at += records[i];
    }
    free(records);
    free(buf);
    if (s != ST_OK) {
        free(x);
        free(y);
        return s;
    }
    out->count = (uint32_t)total;
    out->dim = ST_CIFAR_PIXELS;
    out->n_classes = f->n_classes;
    out->x = x;
    out->y = y;
    out->channels = ST_CIFAR_CHANNELS;
    out->height = ST_CIFAR_SIDE;
    out->width = ST_CIFAR_SIDE;
    return ST_OK;
}

/* dir/name for each name. */
static st_status join_paths(const char *dir, const char *const *names, int n, char (*paths)[4096])
{
    for (int i = 0; i < n; i++) {
        int len = snprintf(paths[i], sizeof paths[i], "%s/%s", dir, names[i]);
        if (len < 0 || (size_t)len >= sizeof paths[i])
            return st_fail(ST_ERR_INVALID, "%s: directory name is too long", dir);
    }
    return ST_OK;
}

static st_status load_dir(st_cifar_kind kind, const char *dir, const char *const *train_names,
                          int n_train, const char *test_name, st_dataset *train,
                          st_dataset *test)
{
    if (!train || !test)
        return st_fail(ST_ERR_INVALID, "CIFAR loader: no output dataset");
    memset(train, 0, sizeof *train);
    memset(test, 0, sizeof *test);
    if (!dir || !*dir)
        return st_fail(ST_ERR_INVALID, "%s: no directory given (the extracted %s directory)",
                       formats[kind].name, formats[kind].folder);
    char paths[6][4096];
    const char *p[6];
    ST_TRY(join_paths(dir, train_names, n_train, paths));
    ST_TRY(join_paths(dir, &test_name, 1, paths + n_train));
    for (int i = 0; i <= n_train; i++)
        p[i] = paths[i];
    ST_TRY(st_cifar_load_files(kind, p, n_train, train));
    st_status s = st_cifar_load_files(kind, p + n_train, 1, test);
    if (s != ST_OK)
        st_dataset_free(train);
    return s;
}

st_status st_cifar10_load(const char *dir, st_dataset *train, st_dataset *test)
{
    static const char *const names[] = { "data_batch_1.bin", "data_batch_2.bin",
                                         "data_batch_3.bin", "data_batch_4.bin",
                                         "data_batch_5.bin" };
    return load_dir(ST_CIFAR10, dir, names, 5, "test_batch.bin", train, test);
}

st_status st_cifar100_load(const char *dir, st_dataset *train, st_dataset *test)
{
    static const char *const names[] = { "train.bin" };
    return load_dir(ST_CIFAR100, dir, names, 1, "test.bin", train, test);
}

/*
 * subtrain/data.h — datasets: IDX files (plain or gzip), synthetic data,
 * normalisation, seeded shuffles and batch gathering.
 *
 * A dataset is read-only once loaded and is shared by all workers; it is not
 * counted in any worker's arena.
 */
#ifndef SUBTRAIN_DATA_H
#define SUBTRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>
#include <subtrain/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Default location of Fashion-MNIST (Debian package dataset-fashion-mnist). */
#define ST_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

/* ------------------------------------------------------------------ IDX */

#define ST_IDX_MAX_RANK 4
/* Largest payload accepted from one IDX file (1 GiB): a header declaring
 * more is rejected before anything is allocated. */
#define ST_IDX_MAX_BYTES ((size_t)1 << 30)

/* One IDX array of unsigned bytes (type code 0x08), the only element type
 * the MNIST family uses.  dims[0] is the item count. */
typedef struct st_idx_array {
    int rank;                       /* 1..ST_IDX_MAX_RANK */
    uint32_t dims[ST_IDX_MAX_RANK];
    size_t count;                   /* product of dims */
    uint8_t *data;                  /* count bytes, row-major */
} st_idx_array;

/* Reads `path`, gzip-compressed or plain (detected from the content).
 * Validates the magic (two zero bytes), the element type, the rank, every
 * dimension (non-zero), the declared payload against ST_IDX_MAX_BYTES and
 * against what the file really holds (truncated or trailing data is an
 * error), and gzip integrity.  On failure *out is left empty and the message
 * names the file and the problem. */
st_status st_idx_read(const char *path, st_idx_array *out);
void st_idx_free(st_idx_array *a);

/* --------------------------------------------------------------- dataset */

typedef struct st_dataset {
    uint32_t count;       /* samples */
    uint32_t dim;         /* features per sample */
    uint32_t n_classes;   /* labels are in [0, n_classes) */
    float *x;             /* (count, dim) features, row-major */
    uint8_t *y;           /* (count) labels */
} st_dataset;

/* Images (rank >= 2: count x rows x cols ...) and labels (rank 1) from two
 * IDX files; checks that the counts agree and that labels are < n_classes.
 * Pixels become floats in [0, 1]; call st_dataset_normalize afterwards. */
st_status st_dataset_load_idx(const char *images_path, const char *labels_path,
                              uint32_t n_classes, st_dataset *out);

/* Fashion-MNIST from `dir` (train-images-idx3-ubyte[.gz], ...).  When the
 * directory or files are missing the message says how to install the
 * package or to use --data synthetic. */
st_status st_fashion_mnist_load(const char *dir, st_dataset *train, st_dataset *test);

typedef struct st_synthetic_config {
    uint64_t seed;
    uint32_t train_count;  /* e.g. 8192 */
    uint32_t test_count;   /* e.g. 2048 */
    uint32_t dim;          /* e.g. 784, the shape of Fashion-MNIST */
    uint32_t n_classes;    /* e.g. 10 */
} st_synthetic_config;

/* Defaults: 16384 train, 4096 test, dim 784, 10 classes. */
st_synthetic_config st_synthetic_defaults(uint64_t seed);

/* A seeded, learnable classification task: x ~ N(0, I), label = argmax of a
 * random two-layer teacher network applied to x.  Same seed, same data. */
st_status st_synthetic_make(const st_synthetic_config *cfg,
                            st_dataset *train, st_dataset *test);

/* Standardises both sets with the training set's mean and standard
 * deviation over all features (one scalar each, as usual for MNIST-like
 * data); returns them for the record. */
void st_dataset_normalize(st_dataset *train, st_dataset *test,
                          float *mean_out, float *std_out);

void st_dataset_free(st_dataset *d);

/* order[0..n) = a permutation of 0..n-1 that depends only on (seed, epoch). */
void st_epoch_order(uint64_t seed, uint64_t epoch, uint32_t *order, uint32_t n);

/* Copies samples idx[0..n) into x_out (n, dim) and labels into y_out. */
void st_dataset_gather(const st_dataset *d, const uint32_t *idx, size_t n,
                       float *x_out, int32_t *y_out);

#ifdef __cplusplus
}
#endif
#endif /* SUBTRAIN_DATA_H */

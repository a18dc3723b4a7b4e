/*
 * data/dataset.c — datasets from IDX files, Fashion-MNIST, normalisation,
 * per-epoch shuffles and batch gathering.
 *
 * Datasets are plain malloc'd arrays: they are loaded once, read by every
 * worker and never counted in a worker's arena.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/data.h>
#include <subtrain/rng.h>

#include "core/error.h"

/* Stream namespace of the epoch shuffles under a seed's root, so that they
 * never share a stream with anything else drawn from the same seed. */
#define EPOCH_STREAM 0x0DA7Aull

#define FASHION_MNIST_CLASSES 10

/* ------------------------------------------------------------ IDX pairs */

static st_status check_images(const char *path, const st_idx_array *img)
{
    if (img->rank < 2)
        return st_fail(ST_ERR_FORMAT, "%s: images need rank >= 2 (count x rows x cols), "
                       "this file has rank %d", path, img->rank);
    return ST_OK;
}

static st_status check_labels(const char *images_path, const st_idx_array *img,
                              const char *labels_path, const st_idx_array *lab,
                              uint32_t n_classes)
{
    if (lab->rank != 1)
        return st_fail(ST_ERR_FORMAT, "%s: labels need rank 1, this file has rank %d",
                       labels_path, lab->rank);
    if (lab->dims[0] != img->dims[0])
        return st_fail(ST_ERR_FORMAT, "%s holds %lu images but %s holds %lu labels",
                       images_path, (unsigned long)img->dims[0],
                       labels_path, (unsigned long)lab->dims[0]);
    for (size_t i = 0; i < lab->count; i++)
        if (lab->data[i] >= n_classes)
            return st_fail(ST_ERR_FORMAT, "%s: label %zu is %u, outside 0..%lu",
                           labels_path, i, (unsigned)lab->data[i],
                           (unsigned long)n_classes - 1);
    return ST_OK;
}

/* Moves the checked arrays into a dataset: pixels to floats in [0, 1], the
 * label bytes taken over as they are. */
static st_status build_dataset(const char *images_path, const st_idx_array *img,
                               st_idx_array *lab, uint32_t n_classes, st_dataset *out)
{
    uint32_t count = img->dims[0];
    size_t dim = img->count / count;   // <= ST_IDX_MAX_BYTES, fits uint32_t
    if (img->count > SIZE_MAX / sizeof(float))
        return st_fail(ST_ERR_NOMEM, "%s: %zu pixels do not fit in memory as floats",
                       images_path, img->count);
    // x is (count, dim)
    float *x = malloc(img->count * sizeof(float));
    if (!x)
        return st_fail(ST_ERR_NOMEM, "%s: out of memory allocating %zu floats",
                       images_path, img->count);
    for (size_t i = 0; i < img->count; i++)
        x[i] = (float)img->data[i] * (1.0f / 255.0f);

    out->count = count;
    out->dim = (uint32_t)dim;
    out->n_classes = n_classes;
    out->x = x;
    out->y = lab->data;   // labels are already one byte each: take the buffer
    lab->data = NULL;
    return ST_OK;
}

st_status st_dataset_load_idx(const char *images_path, const char *labels_path,
                              uint32_t n_classes, st_dataset *out)
{
    if (!out)
        return st_fail(ST_ERR_INVALID, "st_dataset_load_idx: no output dataset");
    memset(out, 0, sizeof *out);
    if (!images_path || !labels_path)
        return st_fail(ST_ERR_INVALID, "st_dataset_load_idx: missing file name");
    if (n_classes < 1 || n_classes > 256)
        return st_fail(ST_ERR_INVALID, "st_dataset_load_idx: %lu classes cannot be "
                       "stored as byte labels (1..256)", (unsigned long)n_classes);

    st_idx_array img, lab;
    memset(&lab, 0, sizeof lab);
    st_status s = st_idx_read(images_path, &img);
    if (s == ST_OK)
        s = check_images(images_path, &img);
    if (s == ST_OK)
        s = st_idx_read(labels_path, &lab);
    if (s == ST_OK)
        s = check_labels(images_path, &img, labels_path, &lab, n_classes);
    if (s == ST_OK)
        s = build_dataset(images_path, &img, &lab, n_classes, out);
    st_idx_free(&img);
    st_idx_free(&lab);
    return s;
}

/* -------------------------------------------------------- Fashion-MNIST */

/* Sets path to dir/name.gz if that can be opened, else to dir/name.  When
 * neither exists the message gives installation advice instead of a bare
 * "no such file": a missing dataset is the usual first-run problem. */
static st_status find_file(const char *dir, const char *name, char *path, size_t size)
{
    int open_errno = 0;
    for (int gz = 1; gz >= 0; gz--) {
        int n = snprintf(path, size, "%s/%s%s", dir, name, gz ? ".gz" : "");
        if (n < 0 || (size_t)n >= size)
            return st_fail(ST_ERR_INVALID, "%s: directory name is too long", dir);
        errno = 0;
        FILE *f = fopen(path, "rb");
        if (f) {
            fclose(f);
            return ST_OK;
        }
        if (errno != ENOENT && errno != ENOTDIR && !open_errno)
            open_errno = errno;
    }
    if (open_errno) {   // it is there but unreadable: say so, not "missing"
        snprintf(path, size, "%s/%s.gz", dir, name);
        return st_fail(ST_ERR_IO, "%s: cannot open: %s", path, strerror(open_errno));
    }
    return st_fail(ST_ERR_IO, "Fashion-MNIST not found in %s (missing %s.gz); "
                   "install it with 'apt-get install dataset-fashion-mnist', "
                   "point --data or SUBTRAIN_DATA at a directory holding the "
                   "four IDX files, or use --data synthetic", dir, name);
}

static st_status load_split(const char *dir, const char *images, const char *labels,
                            st_dataset *out)
{
    char img_path[4096], lab_path[4096];
    ST_TRY(find_file(dir, images, img_path, sizeof img_path));
    ST_TRY(find_file(dir, labels, lab_path, sizeof lab_path));
    return st_dataset_load_idx(img_path, lab_path, FASHION_MNIST_CLASSES, out);
}

/* dir may be NULL for ST_FASHION_MNIST_DIR. */
st_status st_fashion_mnist_load(const char *dir, st_dataset *train, st_dataset *test)
{
    if (!train || !test)
        return st_fail(ST_ERR_INVALID, "st_fashion_mnist_load: no output dataset");
    memset(train, 0, sizeof *train);
    memset(test, 0, sizeof *test);
    if (!dir)
        dir = ST_FASHION_MNIST_DIR;

    ST_TRY(load_split(dir, "train-images-idx3-ubyte", "train-labels-idx1-ubyte", train));
    st_status s = load_split(dir, "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", test);
    if (s != ST_OK)
        st_dataset_free(train);
    return s;
}

/* --------------------------------------------------------- normalisation */

/* Mean and (population) standard deviation of all n values, in double: a
 * float sum over 47 million pixels would lose several digits. */
static void moments(const float *x, size_t n, double *mean, double *std)
{
    double sum = 0.0;
    for (size_t i = 0; i < n; i++)
        sum += x[i];
    double m = n ? sum / (double)n : 0.0;
    double sq = 0.0;   // second pass: no cancellation of E[x^2] - m^2
    for (size_t i = 0; i < n; i++) {
        double d = x[i] - m;
        sq += d * d;
    }
    *mean = m;
    *std = n ? sqrt(sq / (double)n) : 0.0;
}

static void standardize(st_dataset *d, float mean, float inv_std)
{
    size_t n = (size_t)d->count * d->dim;
    for (size_t i = 0; i < n; i++)
        d->x[i] = (d->x[i] - mean) * inv_std;
}

void st_dataset_normalize(st_dataset *train, st_dataset *test,
                          float *mean_out, float *std_out)
{
    double mean = 0.0, std = 1.0;
    if (train && train->x)
        moments(train->x, (size_t)train->count * train->dim, &mean, &std);
    if (!(std > 1e-12))   // a constant input: centre it, do not divide by 0
        std = 1.0;
    float inv = (float)(1.0 / std);
    if (train && train->x)
        standardize(train, (float)mean, inv);
    if (test && test->x)
        standardize(test, (float)mean, inv);
    if (mean_out)
        *mean_out = (float)mean;
    if (std_out)
        *std_out = (float)std;
}

void st_dataset_free(st_dataset *d)
{
    if (!d)
        return;
    free(d->x);
    free(d->y);
    memset(d, 0, sizeof *d);
}

/* ----------------------------------------------------- epochs and batches */

void st_epoch_order(uint64_t seed, uint64_t epoch, uint32_t *order, uint32_t n)
{
    st_rng root = st_rng_seed(seed);
    st_rng epochs = st_rng_split(&root, EPOCH_STREAM);
    st_rng rng = st_rng_split(&epochs, epoch);
    for (uint32_t i = 0; i < n; i++)
        order[i] = i;
    st_rng_shuffle_u32(&rng, order, n);
}

/* Every idx[i] must be < d->count. */
void st_dataset_gather(const st_dataset *d, const uint32_t *idx, size_t n,
                       float *x_out, int32_t *y_out)
{
    size_t dim = d->dim;
    // x_out is (n, dim)
    for (size_t i = 0; i < n; i++) {
        size_t row = idx[i];
        memcpy(x_out + i * dim, d->x + row * dim, dim * sizeof(float));
        y_out[i] = d->y[row];
    }
}

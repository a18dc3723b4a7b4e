/*
 * data/dataset.c — datasets from IDX files, Fashion-MNIST and other IDX
 * image sets, normalisation, per-epoch shuffles and batch gathering.
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
#include <sys/stat.h>
#include <unistd.h>

#include <subtrain/data.h>
#include <subtrain/rng.h>

#include "data/gather.h"
#include "core/error.h"
#include "core/file.h"

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

/* hint: what follows a label out of range in its message ("" for none). */
static st_status check_labels(const char *images_path, const st_idx_array *img,
                              const char *labels_path, const st_idx_array *lab,
                              uint32_t n_classes, const char *hint)
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
            return st_fail(ST_ERR_FORMAT, "%s: label %zu is %u, outside 0..%lu%s",
                           labels_path, i, (unsigned)lab->data[i],
                           (unsigned long)n_classes - 1, hint);
    return ST_OK;
}

/* Moves the checked arrays into a dataset: pixels to floats in [0, 1]
 * (values = 0: none, x NULL), the label bytes taken over as they are. */
static st_status build_dataset(const char *images_path, const st_idx_array *img,
                               st_idx_array *lab, uint32_t n_classes, int values,
                               st_dataset *out)
{
    uint32_t count = img->dims[0];
    size_t dim = img->count / count;   // <= ST_IDX_MAX_BYTES, fits uint32_t
    if (img->count > SIZE_MAX / sizeof(float))
        return st_fail(ST_ERR_NOMEM, "%s: %zu pixels do not fit in memory as floats",
                       images_path, img->count);
    // x is (count, dim)
    float *x = values ? malloc(img->count * sizeof(float)) : NULL;
    if (values && !x)
        return st_fail(ST_ERR_NOMEM, "%s: out of memory allocating %zu floats",
                       images_path, img->count);
    for (size_t i = 0; x && i < img->count; i++)
        x[i] = (float)img->data[i] * (1.0f / 255.0f);

    out->count = count;
    out->dim = (uint32_t)dim;
    out->n_classes = n_classes;
    if (img->rank == 3) {          // count x rows x cols: one channel
        out->channels = 1;
        out->height = img->dims[1];
        out->width = img->dims[2];
    } else if (img->rank == 4) {   // count x C x H x W, channel-major as stored
        out->channels = img->dims[1];
        out->height = img->dims[2];
        out->width = img->dims[3];
    } else {                       // count x dim: no image shape
        out->channels = (uint32_t)dim;
        out->height = 1;
        out->width = 1;
    }
    out->x = x;
    out->y = lab->data;   // labels are already one byte each: take the buffer
    lab->data = NULL;
    return ST_OK;
}

static st_status load_idx(const char *images_path, const char *labels_path,
                          uint32_t n_classes, const char *hint, int values, st_dataset *out)
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
    /* values = 0: the images' shape is all that is read */
    st_status s = values ? st_idx_read(images_path, &img) : st_idx_read_shape(images_path, &img);
    if (s == ST_OK)
        s = check_images(images_path, &img);
    if (s == ST_OK)
        s = st_idx_read(labels_path, &lab);
    if (s == ST_OK)
        s = check_labels(images_path, &img, labels_path, &lab, n_classes, hint);
    if (s == ST_OK)
        s = build_dataset(images_path, &img, &lab, n_classes, values, out);
    st_idx_free(&img);
    st_idx_free(&lab);
    return s;
}

st_status st_dataset_load_idx(const char *images_path, const char *labels_path,
                              uint32_t n_classes, st_dataset *out)
{
    return load_idx(images_path, labels_path, n_classes, "", 1, out);
}

/* -------------------------------------------------------- Fashion-MNIST */

static const st_idx_files fashion_files = {
    "train-images-idx3-ubyte", "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte",
};

/* Sets path to dir/name.gz if that can be opened, else to dir/name.  When
 * neither exists the message gives advice instead of a bare "no such
 * file": a missing dataset is the usual first-run problem.  fashion: the
 * advice is how to get Fashion-MNIST; else how to name an IDX set's
 * files.  Anything else is not "missing" and gets no advice: a DIR that
 * is a file, a file that is there but cannot be opened (the message
 * names that file, .gz or not, and why), a symbolic link to nothing. */
static st_status find_file(const char *dir, const char *name, int fashion, char *path,
                           size_t size)
{
    struct stat sb;
    const int there = stat(dir, &sb) == 0;
    if (!there && errno != ENOENT)   /* ENOENT: missing, and the advice below */
        return st_fail(ST_ERR_IO, "%s: cannot open the directory: %s", dir, strerror(errno));
    if (there && !S_ISDIR(sb.st_mode))
        return st_fail(ST_ERR_IO, "%s: not a directory (the data is a directory holding the "
                       "IDX files)", dir);
    char failed[4096] = "";   /* the first file there that could not be opened */
    char why[512] = "";       /* and the reason, as the opening said it */
    int dangling = 0;
    for (int gz = 1; gz >= 0; gz--) {
        int n = snprintf(path, size, "%s/%s%s", dir, name, gz ? ".gz" : "");
        if (n < 0 || (size_t)n >= size)
            return st_fail(ST_ERR_INVALID, "%s: directory name is too long", dir);
        FILE *f;
        if (st_file_open_read(path, &f) == ST_OK) {
            fclose(f);
            return ST_OK;
        }
        int e = errno;   /* 0: there, but not a regular file */
        if (*failed)
            continue;
        if (e == ENOENT && lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode))
            dangling = 1;   /* the name is there, what it points to is not */
        else if (e == ENOENT || e == ENOTDIR)
            continue;
        snprintf(why, sizeof why, "%s", st_last_error());
        snprintf(failed, sizeof failed, "%s", path);
    }
    if (dangling) {
        char target[4096];
        ssize_t len = readlink(failed, target, sizeof target - 1);
        target[len > 0 ? len : 0] = '\0';
        return st_fail(ST_ERR_IO, "%s: cannot open: it is a symbolic link to '%s', which does "
                       "not exist", failed, target);
    }
    if (*failed)
        return st_fail(ST_ERR_IO, "%s", why);
    if (fashion)
        return st_fail(ST_ERR_IO, "Fashion-MNIST not found in %s (missing %s.gz); "
                       "install it with 'apt-get install dataset-fashion-mnist', "
                       "point --data or SUBTRAIN_DATA at a directory holding the "
                       "four IDX files, or use --data synthetic", dir, name);
    return st_fail(ST_ERR_IO, "%s/%s: no such file (nor %s.gz); an IDX set is "
                   "--data idx:DIR[:TRAIN_IMAGES,TRAIN_LABELS,TEST_IMAGES,TEST_LABELS], "
                   "the names relative to DIR", dir, name, name);
}

static st_status load_split(const char *dir, const char *images, const char *labels,
                            int fashion, uint32_t n_classes, int values, st_dataset *out)
{
    /* a Fashion-MNIST directory is Fashion-MNIST's 10 classes: a label
     * beyond them is a damaged file, or another set read the wrong way */
    static const char fashion_hint[] = ": --data DIR takes Fashion-MNIST's 10 classes; "
                                       "--data idx:DIR reads the class count from the labels";
    char img_path[4096], lab_path[4096];
    ST_TRY(find_file(dir, images, fashion, img_path, sizeof img_path));
    ST_TRY(find_file(dir, labels, fashion, lab_path, sizeof lab_path));
    return load_idx(img_path, lab_path, n_classes, fashion ? fashion_hint : "", values, out);
}

/* Both splits; the test images must have the training images' shape. */
static st_status load_pair(const char *dir, const st_idx_files *f, int fashion,
                           uint32_t n_classes, int values, st_dataset *train, st_dataset *test)
{
    ST_TRY(load_split(dir, f->train_images, f->train_labels, fashion, n_classes, values,
                      train));
    st_status s = load_split(dir, f->test_images, f->test_labels, fashion, n_classes, values,
                             test);
    if (s == ST_OK && (train->channels != test->channels || train->height != test->height ||
                       train->width != test->width))
        s = st_fail(ST_ERR_FORMAT, "%s/%s: test samples are %lux%lux%lu but the training "
                    "samples (%s) are %lux%lux%lu", dir, f->test_images,
                    (unsigned long)test->channels, (unsigned long)test->height,
                    (unsigned long)test->width, f->train_images,
                    (unsigned long)train->channels, (unsigned long)train->height,
                    (unsigned long)train->width);
    if (s != ST_OK) {
        st_dataset_free(train);
        st_dataset_free(test);
    }
    return s;
}

/* dir may be NULL for ST_FASHION_MNIST_DIR. */
static st_status fashion_load(const char *dir, int values, st_dataset *train, st_dataset *test)
{
    if (!train || !test)
        return st_fail(ST_ERR_INVALID, "st_fashion_mnist_load: no output dataset");
    memset(train, 0, sizeof *train);
    memset(test, 0, sizeof *test);
    if (!dir)
        dir = ST_FASHION_MNIST_DIR;
    return load_pair(dir, &fashion_files, 1, FASHION_MNIST_CLASSES, values, train, test);
}

st_status st_fashion_mnist_load(const char *dir, st_dataset *train, st_dataset *test)
{
    return fashion_load(dir, 1, train, test);
}

st_status st_fashion_mnist_load_labels(const char *dir, st_dataset *train, st_dataset *test)
{
    return fashion_load(dir, 0, train, test);
}

/* ------------------------------------------------------- other IDX sets */

/* The largest label of d + 1 (0 for an empty set). */
static uint32_t labels_used(const st_dataset *d)
{
    uint32_t top = 0;
    for (uint32_t i = 0; i < d->count; i++)
        if ((uint32_t)d->y[i] + 1 > top)
            top = (uint32_t)d->y[i] + 1;
    return top;
}

static st_status idx_set_load(const char *dir, const st_idx_files *files, int values,
                              st_dataset *train, st_dataset *test)
{
    if (!train || !test)
        return st_fail(ST_ERR_INVALID, "st_idx_set_load: no output dataset");
    memset(train, 0, sizeof *train);
    memset(test, 0, sizeof *test);
    if (!dir)
        return st_fail(ST_ERR_INVALID, "st_idx_set_load: no directory");
    st_idx_files f = fashion_files;
    if (files) {
        f.train_images = files->train_images ? files->train_images : f.train_images;
        f.train_labels = files->train_labels ? files->train_labels : f.train_labels;
        f.test_images = files->test_images ? files->test_images : f.test_images;
        f.test_labels = files->test_labels ? files->test_labels : f.test_labels;
    }
    /* Byte labels: any value is a class; the count is what the labels use. */
    ST_TRY(load_pair(dir, &f, 0, 256, values, train, test));
    uint32_t a = labels_used(train), b = labels_used(test);
    train->n_classes = test->n_classes = a > b ? a : b;
    return ST_OK;
}

st_status st_idx_set_load(const char *dir, const st_idx_files *files, st_dataset *train,
                          st_dataset *test)
{
    return idx_set_load(dir, files, 1, train, test);
}

st_status st_idx_set_load_labels(const char *dir, const st_idx_files *files,
                                 st_dataset *train, st_dataset *test)
{
    return idx_set_load(dir, files, 0, train, test);
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

/* Channel c of every sample of d: count runs of `plane` values, `dim`
 * apart.  The sums run sample by sample, pixel by pixel: for one channel
 * the same additions in the same order as moments() over the whole set. */
static void channel_moments(const st_dataset *d, uint32_t c, size_t plane, double *mean,
                            double *std)
{
    size_t dim = d->dim, n = (size_t)d->count * plane;
    double sum = 0.0;
    for (size_t s = 0; s < d->count; s++) {
        const float *p = d->x + s * dim + c * plane;
        for (size_t i = 0; i < plane; i++)
            sum += p[i];
    }
    double m = n ? sum / (double)n : 0.0;
    double sq = 0.0;
    for (size_t s = 0; s < d->count; s++) {
        const float *p = d->x + s * dim + c * plane;
        for (size_t i = 0; i < plane; i++) {
            double e = p[i] - m;
            sq += e * e;
        }
    }
    *mean = m;
    *std = n ? sqrt(sq / (double)n) : 0.0;
}

static void standardize_channel(st_dataset *d, uint32_t c, size_t plane, float mean,
                                float inv_std)
{
    for (size_t s = 0; s < d->count; s++) {
        float *p = d->x + s * d->dim + c * plane;
        for (size_t i = 0; i < plane; i++)
            p[i] = (p[i] - mean) * inv_std;
    }
}

void st_dataset_normalize_channels(st_dataset *train, st_dataset *test,
                                   float *mean_out, float *std_out, uint32_t max_out)
{
    if (!train || !train->x || train->channels == 0 ||
        (size_t)train->channels * train->height * train->width != train->dim) {
        /* no shape: one channel of the whole sample */
        float m, sd;
        st_dataset_normalize(train, test, &m, &sd);
        if (mean_out && max_out)
            mean_out[0] = m;
        if (std_out && max_out)
            std_out[0] = sd;
        return;
    }
    size_t plane = (size_t)train->height * train->width;
    for (uint32_t c = 0; c < train->channels; c++) {
        double mean, std;
        channel_moments(train, c, plane, &mean, &std);
        if (!(std > 1e-12))
            std = 1.0;
        float inv = (float)(1.0 / std);
        standardize_channel(train, c, plane, (float)mean, inv);
        if (test && test->x && test->dim == train->dim)
            standardize_channel(test, c, plane, (float)mean, inv);
        if (mean_out && c < max_out)
            mean_out[c] = (float)mean;
        if (std_out && c < max_out)
            std_out[c] = (float)std;
    }
}

uint64_t st_dataset_fingerprint(const st_dataset *d)
{
    const uint64_t shape[] = { d->count, d->dim, d->n_classes, d->channels, d->height,
                               d->width, d->n_bytes, d->context, d->window_seed,
                               (uint64_t)d->sequential, !!d->x, !!d->y };
    uint64_t h = st_hash_bytes(shape, sizeof shape, 0);
    if (d->x)
        h = st_hash_bytes(d->x, (size_t)d->count * d->dim * sizeof *d->x, h);
    if (d->y)
        h = st_hash_bytes(d->y, d->count, h);
    if (d->bytes)
        h = st_hash_bytes(d->bytes, d->n_bytes, h);
    return h;
}

void st_dataset_free(st_dataset *d)
{
    if (!d)
        return;
    free(d->x);
    free(d->bytes);
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

/* The one gather: samples idx[0..n) (idx NULL: first .. first + n) of
 * `epoch`, augmented when `train` asks and the set has an augmentation.
 * Every idx[i] must be < d->count. */
static void gather(const st_dataset *d, uint64_t epoch, const uint32_t *idx, uint32_t first,
                   size_t n, int train, float *x_out, int32_t *y_out)
{
    if (d->bytes) {   /* a text set: the epoch's windows */
        st_text_gather(d, epoch, idx, first, n, x_out, y_out);
        return;
    }
    if (train && idx && st_augment_active(&d->augment)) {
        st_augment_gather(d, epoch, idx, n, x_out, y_out);
        return;
    }
    const size_t dim = d->dim;
    if (!idx) {   /* stored order: one copy */
        memcpy(x_out, d->x + (size_t)first * dim, n * dim * sizeof *x_out);
        for (size_t i = 0; i < n; i++)
            y_out[i] = d->y[first + i];
        return;
    }
    for (size_t i = 0; i < n; i++) {
        size_t row = idx[i];
        memcpy(x_out + i * dim, d->x + row * dim, dim * sizeof(float));
        y_out[i] = d->y[row];
    }
}

void st_dataset_gather(const st_dataset *d, const uint32_t *idx, size_t n,
                       float *x_out, int32_t *y_out)
{
    gather(d, 0, idx, 0, n, 0, x_out, y_out);
}

void st_dataset_gather_train(const st_dataset *d, uint64_t epoch, const uint32_t *idx,
                             size_t n, float *x_out, int32_t *y_out)
{
    gather(d, epoch, idx, 0, n, 1, x_out, y_out);
}

void st_dataset_gather_rows(const st_dataset *d, uint32_t first, int rows, int B,
                            float *x_out, int32_t *y_out)
{
    const size_t dim = d->dim, L = st_dataset_labels_per_sample(d);
    gather(d, 0, NULL, first, (size_t)rows, 0, x_out, y_out);
    memset(x_out + (size_t)rows * dim, 0, (size_t)(B - rows) * dim * sizeof *x_out);
    memset(y_out + (size_t)rows * L, 0, (size_t)(B - rows) * L * sizeof *y_out);
}

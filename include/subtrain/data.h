/*
 * subtrain/data.h — datasets: IDX files (plain or gzip), CIFAR-10 and
 * CIFAR-100 binaries, synthetic data, normalisation, seeded shuffles,
 * batch gathering and seeded augmentation of image batches.
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
/* The header of `path` only (data NULL): the same checks of it, and of the
 * file's length against the declared payload, taken from its size (plain)
 * or the length gzip records at its end, so that nothing is decompressed;
 * a file whose length differs is read through for st_idx_read's message.
 * For what needs a set's shapes and not its values (a plan). */
st_status st_idx_read_shape(const char *path, st_idx_array *out);
void st_idx_free(st_idx_array *a);

/* --------------------------------------------------------------- dataset */

/* Seeded augmentation of a training set's samples (image data only), applied
 * when a training batch is gathered (st_dataset_gather_train); all zero:
 * none.  What a sample becomes depends on (seed, epoch, sample index) only. */
typedef struct st_augment {
    uint32_t crop;   /* pad `crop` zeros on each side of every channel, then
                      * crop back to height x width at a random offset
                      * (0: no crop); must be < height and < width */
    int flip;        /* mirror left-right with probability 1/2 */
    uint64_t seed;   /* the run's seed */
} st_augment;

/* A sample is channels x height x width values, channel-major (NCHW within
 * the batch: channel c's image is height rows of width values, row-major):
 * Fashion-MNIST is 1 x 28 x 28, CIFAR 3 x 32 x 32.  Data with no image
 * shape (the synthetic task, IDX vectors of rank 2) is dim x 1 x 1: every
 * feature a channel of one pixel.  dim = channels x height x width. */
typedef struct st_dataset {
    uint32_t count;       /* samples */
    uint32_t dim;         /* features per sample: channels x height x width */
    uint32_t n_classes;   /* labels are in [0, n_classes) */
    float *x;             /* (count, dim) features, row-major */
    uint8_t *y;           /* (count) labels */
    uint32_t channels, height, width;   /* the sample's shape, see above */
    st_augment augment;   /* training gathers only; set by the caller */
    /* A byte corpus as windows (st_text_dataset): x and y are NULL, dim is
     * the context T, and sample k is a window of T + 1 bytes, its first T
     * the input (byte ids) and its last T the labels (T per sample: the
     * next byte at every position).  Training sets draw window k of an
     * epoch at random (seeded); test sets read consecutive windows. */
    uint8_t *bytes;       /* NULL: not text */
    size_t n_bytes;
    uint32_t context;     /* T; 0: not text */
    uint64_t window_seed;
    int sequential;       /* 1: window k starts at byte k T */
} st_dataset;

/* Labels per sample: the context of a text set, else 1. */
static inline uint32_t st_dataset_labels_per_sample(const st_dataset *d)
{
    return d->context ? d->context : 1;
}

/* Samples [first, first + rows) in stored order (a test set's), into the
 * first rows of a batch of B, the rest zero: x_out (B, dim), y_out
 * (B x labels per sample). */
void st_dataset_gather_rows(const st_dataset *d, uint32_t first, int rows, int B,
                            float *x_out, int32_t *y_out);

/* Images (rank >= 2: count x rows x cols ...) and labels (rank 1) from two
 * IDX files; checks that the counts agree and that labels are < n_classes.
 * Pixels become floats in [0, 1]; call st_dataset_normalize afterwards. */
st_status st_dataset_load_idx(const char *images_path, const char *labels_path,
                              uint32_t n_classes, st_dataset *out);

/* Fashion-MNIST from `dir` (train-images-idx3-ubyte[.gz], ...): 1 x 28 x 28,
 * 10 classes.  When the directory or files are missing the message says how
 * to install the package or to use --data synthetic. */
st_status st_fashion_mnist_load(const char *dir, st_dataset *train, st_dataset *test);
/* The same files, checks and errors, for what reads the sets' shapes and
 * labels only (a plan): no sample's values, x NULL. */
st_status st_fashion_mnist_load_labels(const char *dir, st_dataset *train, st_dataset *test);

/* The four files of an IDX image set, relative to its directory; each is
 * found as NAME.gz or NAME.  A NULL member: Fashion-MNIST's name. */
typedef struct st_idx_files {
    const char *train_images;   /* train-images-idx3-ubyte */
    const char *train_labels;   /* train-labels-idx1-ubyte */
    const char *test_images;    /* t10k-images-idx3-ubyte */
    const char *test_labels;    /* t10k-labels-idx1-ubyte */
} st_idx_files;

/* An IDX image set of any class count (MNIST, EMNIST, Fashion-MNIST, ...):
 * n_classes = the largest label + 1 over train and test.  Images of rank 3
 * (count x rows x cols) are 1 x rows x cols; rank 4 is read as count x C x
 * H x W; rank 2 (count x dim) is dim x 1 x 1.  Train and test images must
 * have the same shape.  files may be NULL (Fashion-MNIST's names). */
st_status st_idx_set_load(const char *dir, const st_idx_files *files,
                          st_dataset *train, st_dataset *test);
/* The same files, checks and errors, without the samples' values (x NULL). */
st_status st_idx_set_load_labels(const char *dir, const st_idx_files *files,
                                 st_dataset *train, st_dataset *test);

/* ------------------------------------------------------------------ CIFAR */

#define ST_CIFAR_CHANNELS 3
#define ST_CIFAR_SIDE 32
#define ST_CIFAR_PIXELS (ST_CIFAR_CHANNELS * ST_CIFAR_SIDE * ST_CIFAR_SIDE)   /* 3072 */

typedef enum st_cifar_kind {
    ST_CIFAR10,    /* record: 1 label byte (0..9) + 3072 pixels */
    ST_CIFAR100    /* record: coarse (0..19) and fine (0..99) label bytes + 3072 pixels */
} st_cifar_kind;

/* Records of the CIFAR binary files paths[0 .. n_paths) in order, as one
 * dataset of 3 x 32 x 32 images (a record's pixels are 1024 red, 1024
 * green, 1024 blue values, each a row-major 32 x 32 image: channel-major
 * already) with pixels in [0, 1].  CIFAR-100 keeps the fine label (100
 * classes).  Each file must be a regular file holding a whole, non-zero
 * number of records with every label in range; a failure names the file.
 * Call st_dataset_normalize_channels afterwards. */
st_status st_cifar_load_files(st_cifar_kind kind, const char *const *paths, int n_paths,
                              st_dataset *out);

/* CIFAR-10 from `dir`, the extracted cifar-10-batches-bin directory:
 * data_batch_1.bin .. data_batch_5.bin (train), test_batch.bin (test). */
st_status st_cifar10_load(const char *dir, st_dataset *train, st_dataset *test);

/* CIFAR-100 from `dir`, the extracted cifar-100-binary directory: train.bin
 * and test.bin. */
st_status st_cifar100_load(const char *dir, st_dataset *train, st_dataset *test);

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

/* The sets st_synthetic_make makes, their counts and shapes only: no
 * samples (x and y NULL), for what reads no sample (a plan's sizing). */
st_status st_synthetic_shapes(const st_synthetic_config *cfg,
                              st_dataset *train, st_dataset *test);

/* Standardises both sets with the training set's mean and standard
 * deviation over all features (one scalar each, as usual for MNIST-like
 * data); returns them for the record. */
void st_dataset_normalize(st_dataset *train, st_dataset *test,
                          float *mean_out, float *std_out);

/* Standardises every channel of both sets with the training set's mean and
 * standard deviation of that channel (over all its pixels and samples);
 * returns them (at most max_out channels each; either may be NULL).  For
 * one channel this is st_dataset_normalize, to the bit.  Meant for image
 * data: on dim x 1 x 1 data it would standardise every feature. */
void st_dataset_normalize_channels(st_dataset *train, st_dataset *test,
                                   float *mean_out, float *std_out, uint32_t max_out);

/* A 64-bit fingerprint of a loaded set's content (st_hash_bytes): its
 * counts and shape, its features as they are (normalised or not), labels
 * and text bytes, and a text set's windows.  The same content gives the
 * same value wherever it was read from (plain or gzip files, another
 * directory).  Reads every byte once; a step checkpoint records the
 * training and test sets' (doc/checkpoints.md). */
uint64_t st_dataset_fingerprint(const st_dataset *d);

void st_dataset_free(st_dataset *d);

/* order[0..n) = a permutation of 0..n-1 that depends only on (seed, epoch). */
void st_epoch_order(uint64_t seed, uint64_t epoch, uint32_t *order, uint32_t n);

/* Copies samples idx[0..n) into x_out (n, dim) and labels into y_out, as
 * stored (no augmentation; a text training set's windows of epoch 0). */
void st_dataset_gather(const st_dataset *d, const uint32_t *idx, size_t n,
                       float *x_out, int32_t *y_out);

/* ----------------------------------------------------------------- splits */

/* How a training set is dealt to the data-parallel workers of a run
 * (doc/noniid.md).  IID: not at all: every worker reads its batches from
 * one shuffle of the whole set an epoch (st_epoch_order).  The others give
 * every worker a split of its own, from the labels: CLASSES, K classes per
 * worker, worker g holding classes (g K + j) mod C for j < K and each
 * class's samples dealt evenly among its holders; DIRICHLET, each class's
 * samples dealt to the workers in proportions drawn from Dirichlet(ALPHA)
 * (small ALPHA: a strong skew; large: near iid).  Text data has no
 * classes and takes IID only; test sets stay whole. */
typedef enum st_split_kind {
    ST_SPLIT_IID, ST_SPLIT_CLASSES, ST_SPLIT_DIRICHLET
} st_split_kind;

#define ST_SPLIT_MAX_CLASSES 256   /* byte labels */

typedef struct st_split_config {
    st_split_kind kind;
    uint32_t classes;   /* CLASSES: K per worker, in [1, ST_SPLIT_MAX_CLASSES] */
    double alpha;       /* DIRICHLET: > 0 and finite */
} st_split_config;

/* "iid", "classes:K" or "dirichlet:ALPHA" (ALPHA decimal, as 0.1 or 1e-2)
 * into *out; refused with the line "--split TEXT: why", TEXT's first 64
 * bytes. */
st_status st_split_parse(const char *text, st_split_config *out);
/* st_split_parse, and *why (when why is not NULL) the reason alone, a
 * static string, or NULL when text is a split: for a caller that shows
 * the value its own way. */
st_status st_split_parse_why(const char *text, st_split_config *out, const char **why);
/* The text st_split_parse reads back as c ("dirichlet:0.1"), at most n
 * bytes like snprintf. */
void st_split_name(const st_split_config *c, char *out, size_t n);
/* c's values in range, no data needed. */
st_status st_split_config_check(const st_split_config *c);

/* A training set dealt to workers: each sample in one worker's split. */
typedef struct st_split st_split;

/* The split of c of `train` over `workers` workers, a pure function of
 * (c, the labels, workers, seed, batch); *out NULL for IID (no split).
 * The samples of each class are shuffled (seeded) before they are dealt.
 * Every worker holds at least one batch of samples: a Dirichlet draw that
 * leaves one with fewer is drawn again (the next draw of the seed's
 * stream, up to 100 draws).  Refused (ST_ERR_INVALID, a line naming
 * --split): text data; CLASSES with K above the data's classes or with
 * workers x K below them (classes no worker holds); a worker left with
 * fewer samples than a batch. */
st_status st_split_make(const st_split_config *c, const st_dataset *train, int workers,
                        uint64_t seed, uint32_t batch, st_split **out);
void st_split_destroy(st_split *s);

int st_split_workers(const st_split *s);
uint32_t st_split_classes(const st_split *s);
/* Worker g's samples (training set indices), *count of them. */
const uint32_t *st_split_samples(const st_split *s, int g, uint32_t *count);
/* The class histogram: worker g holds h[g x classes + c] samples of class
 * c. */
const uint32_t *st_split_histogram(const st_split *s);
/* The most samples a worker holds: the scratch st_split_epoch_order needs. */
uint32_t st_split_largest(const st_split *s);

/* The order of one epoch over the whole training set, order[0..count),
 * in which batch i of worker g, positions (i x workers + g) x batch ..
 * + batch, holds the next samples of worker g's stream: its split
 * shuffled from (seed, epoch, g), reshuffled for each further pass when
 * the epoch needs more than the split holds.  Every position belongs to
 * a worker, the last partial ones included.  scratch holds
 * st_split_largest(s) entries.  Allocates nothing. */
void st_split_epoch_order(const st_split *s, uint64_t seed, uint64_t epoch, uint32_t batch,
                          uint32_t *scratch, uint32_t *order);

/* ----------------------------------------------------------- augmentation */

/* The training gather: st_dataset_gather, with d->augment applied to every
 * sample, drawn from (d->augment.seed, epoch, idx[i]).  Without
 * augmentation it is st_dataset_gather.  Allocates nothing, takes no lock:
 * the hot path of a step.  d->augment must have passed st_augment_check. */
void st_dataset_gather_train(const st_dataset *d, uint64_t epoch, const uint32_t *idx,
                             size_t n, float *x_out, int32_t *y_out);

/* ST_OK when `a` fits d's sample shape: a crop smaller than the height and
 * the width, a flip on images at least 2 wide, and a shape that multiplies
 * to dim.  The message names the --augment-* option. */
st_status st_augment_check(const st_augment *a, const st_dataset *d);

/* One sample's draw: the crop window's corner in the padded image (top and
 * left, each in [0, 2 crop]; crop = top = left: the image as it is) and
 * whether it is mirrored.  A pure function of (a->seed, epoch, index). */
typedef struct st_augment_choice {
    uint32_t top, left;
    int flip;
} st_augment_choice;

st_augment_choice st_augment_draw(const st_augment *a, uint64_t epoch, uint64_t index);

/* dst = the window of src padded by `pad` zeros (the padded image's rows
 * top .. top + height, columns left .. left + width), mirrored left-right
 * when choice->flip; every channel alike.  src and dst are
 * channels x height x width and must not overlap. */
void st_augment_apply(const st_augment_choice *choice, uint32_t pad, uint32_t channels,
                      uint32_t height, uint32_t width, const float *src, float *dst);

/* ----------------------------------------------------------------- text */

/* A byte corpus for language models: any file read as bytes (gzip too),
 * its first train_count bytes for training and the rest, the held-out
 * tail, for validation. */
typedef struct st_text {
    uint8_t *bytes;
    size_t count;
    size_t train_count;
} st_text;

/* Reads path whole; holdout in (0, 1) is the validation fraction (the
 * tail).  Refused with a one-line message naming the file: a missing,
 * unreadable, corrupt or empty file, one that is not a regular file (a
 * FIFO, a device: before reading), one of more than 2^32 bytes (4 GiB; a
 * plain file before reading, a gzip file once it inflates past that), a
 * split that leaves either part under 2 bytes. */
st_status st_text_load(const char *path, double holdout, st_text *out);
void st_text_free(st_text *t);

/* The first byte of training window k (0-based) of `epoch` for a context
 * of T bytes: windows of T + 1 bytes (T inputs and their T next bytes)
 * start uniformly in the training part, a pure function of (seed, epoch,
 * k).  The training part must hold at least T + 1 bytes. */
size_t st_text_window(const st_text *t, int context, uint64_t seed, uint64_t epoch, uint64_t k);

/* Training and test sets of windows of `context` bytes over t (see
 * st_dataset): the training part, train_windows windows an epoch (0: its
 * bytes / context, about one pass), drawn from (seed, epoch, k); and the
 * first val_bytes of the held-out tail (0: all of it) in consecutive
 * windows.  Both own copies of their bytes (t may be freed).  Refused
 * with a message: a part too small for one window. */
st_status st_text_dataset(const st_text *t, int context, uint64_t seed, uint32_t train_windows,
                          size_t val_bytes, st_dataset *train, st_dataset *test);

/* The baseline a language model must beat: the cross-entropy, in bits
 * per byte, of the validation bytes under the training bytes' unigram
 * frequencies (add-one smoothing over the 256 values). */
double st_text_unigram_bpb(const st_text *t);

#ifdef __cplusplus
}
#endif
#endif /* SUBTRAIN_DATA_H */

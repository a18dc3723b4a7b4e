/*
 * subtrain/checkpoint.h — safetensors files: named tensors and string
 * metadata, written atomically, read back with every field checked.
 *
 * The format (https://github.com/huggingface/safetensors): an 8-byte
 * little-endian header length N, N bytes of a JSON object, then the raw
 * little-endian data.  The object maps each tensor's name to
 *   {"dtype":"F32","shape":[r,c],"data_offsets":[begin,end]}
 * (offsets relative to the data, which the tensors cover without holes)
 * and may hold "__metadata__": a map of strings to strings.  subtrain
 * writes the header padded with spaces to a multiple of 8 bytes, so the
 * data is aligned for any reader that maps it.
 *
 * Writes are atomic: a temporary file in the same directory, written,
 * fsync'ed, renamed over the target, and the directory fsync'ed, so a
 * crash at any moment leaves either the old file or the new one, whole.
 * A write removes what writers of the same name that were killed
 * mid-write left beside it.
 */
#ifndef SUBTRAIN_CHECKPOINT_H
#define SUBTRAIN_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>
#include <subtrain/model.h>
#include <subtrain/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* BF16: the upper halves of F32 values (an optimizer's bf16 state). */
typedef enum st_dtype { ST_DTYPE_F32, ST_DTYPE_U8, ST_DTYPE_U64, ST_DTYPE_BF16 } st_dtype;

#define ST_SAFETENSORS_MAX_NAME 128
#define ST_SAFETENSORS_MAX_DIMS 4
/* Largest header accepted (the format's readers use 100 MB). */
#define ST_SAFETENSORS_MAX_HEADER ((uint64_t)100 << 20)

typedef struct st_safetensors_tensor {
    char name[ST_SAFETENSORS_MAX_NAME];
    st_dtype dtype;
    int ndims;                       /* 0..ST_SAFETENSORS_MAX_DIMS (0: a scalar) */
    int64_t shape[ST_SAFETENSORS_MAX_DIMS];
    const void *data;                /* writing: the caller's; reading: in the file's buffer */
    size_t bytes;                    /* reading: elements x dtype size (writing: computed) */
} st_safetensors_tensor;

typedef struct st_safetensors_meta_entry {
    const char *key, *value;
} st_safetensors_meta_entry;

/* The metadata key of the data's CRC-32 (zlib's, 8 lowercase hex
 * digits), which the writer adds and the reader checks where present. */
#define ST_SAFETENSORS_CRC_KEY "subtrain.crc32"

/* Writes tensors[0..n) in that order and the metadata to `path`,
 * atomically (see above), with the data's CRC-32 (ST_SAFETENSORS_CRC_KEY;
 * one in the caller's metadata, a file's it read, is replaced).  Names
 * must be unique and non-empty, shapes non-negative. */
st_status st_safetensors_write(const char *path, const st_safetensors_tensor *tensors, int n,
                               const st_safetensors_meta_entry *meta, int n_meta);

/* The temporary name st_safetensors_write writes `path` through in this
 * process, "PATH.tmp.PID": a signal handler that ends the process
 * mid-write can unlink it.  0, or -1 when it does not fit in len. */
int st_safetensors_tmp_name(const char *path, char *buf, size_t len);

/* Whether a directory entry's name is a temporary file of a writer that
 * is gone: "TARGET.tmp.PID" (`target`: the file's name; NULL: any name
 * ending in .safetensors) with PID neither this process nor a live one on
 * this machine.  A live PID may be another run writing into the same
 * directory; a writer on another machine sharing it looks gone. */
int st_safetensors_dead_tmp(const char *name, const char *target);

/* A file read whole and checked: a regular file (a FIFO or a device is
 * refused before anything is read), the header's length and JSON, every
 * entry's dtype, shape and offsets (within the data, covering it with no
 * hole or overlap, matching the shape), unique names, the data's CRC-32
 * where the metadata records one, and every F32 and BF16 value finite
 * (no NaN, no infinity).  A failure names the file and what is
 * wrong (the tensor, for a value), in one line. */
typedef struct st_safetensors {
    uint8_t *buf;                      /* the whole file */
    size_t size;
    st_safetensors_tensor *tensors;    /* in the header's order */
    int n;
    st_safetensors_meta_entry *meta;   /* keys and values point into meta_text */
    int n_meta;
    char *meta_text;
} st_safetensors;

st_status st_safetensors_read(const char *path, st_safetensors *out);
const st_safetensors_tensor *st_safetensors_find(const st_safetensors *f, const char *name);
/* NULL when the key is absent. */
const char *st_safetensors_meta(const st_safetensors *f, const char *key);
void st_safetensors_free(st_safetensors *f);

/* The first of tensors[0..n) holding an F32 or BF16 value that is a NaN
 * or an infinity: its index, the value's element in *at and what it is
 * in *what ("a NaN", "+infinity", "-infinity"); n when every value is
 * finite.  What the reader refuses, for a writer to check first. */
int st_safetensors_first_not_finite(const st_safetensors_tensor *tensors, int n, size_t *at,
                                    const char **what);

/* ------------------------------------------------------------ weights */

/* The full model of cfg's parameters (a flat vector in its layout) as a
 * safetensors file: a tensor per parameter segment, named as the segment
 * ("block0.fc1.weight"), F32, in its storage shape (matrices stored
 * (in, out) are listed in the metadata key "subtrain.in_major"), plus
 * the caller's metadata and "subtrain.version", "subtrain.model". */
st_status st_checkpoint_write_weights(const char *path, const st_model_config *cfg,
                                      const float *params, const st_safetensors_meta_entry *meta,
                                      int n_meta);
/* The same with more tensors after the weights: a training state's, named
 * under ST_CHECKPOINT_STATE_PREFIX (which weight readers skip). */
st_status st_checkpoint_write(const char *path, const st_model_config *cfg, const float *params,
                              const st_safetensors_tensor *extra, int n_extra,
                              const st_safetensors_meta_entry *meta, int n_meta);
#define ST_CHECKPOINT_STATE_PREFIX "train."

/* Reads a weights file into the full model's flat vector of cfg
 * (st_model_config_param_count floats): every segment must be there with
 * its shape and dtype; a missing tensor, another shape or dtype, or a
 * tensor the model does not have is refused with a message naming it. */
st_status st_checkpoint_read_weights(const char *path, const st_model_config *cfg, float *params);
/* The same from a file already read (path: its name, for the messages).
 * Tensors of a training state (ST_CHECKPOINT_STATE_PREFIX) are skipped. */
st_status st_checkpoint_load_weights(const st_safetensors *f, const char *path,
                                     const st_model_config *cfg, float *params);

/* The step of a step checkpoint's name "step-NNNNNNNN.safetensors", or -1
 * for any other name (a write's temporary "NAME.tmp.PID" included). */
long long st_checkpoint_step_of(const char *name);

/* --resume DIR: the step checkpoint of DIR with the highest step
 * (DIR/step-NNNNNNNN.safetensors) into path; a path that is a file is
 * itself.  Fails, naming DIR, when it holds none. */
st_status st_checkpoint_latest(const char *dir_or_file, char *path, size_t path_len);

#ifdef __cplusplus
}
#endif
#endif /* SUBTRAIN_CHECKPOINT_H */

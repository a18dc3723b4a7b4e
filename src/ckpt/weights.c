/*
 * ckpt/weights.c — a full model's parameters as a safetensors file: a
 * tensor per parameter segment, named and shaped as the model lays it
 * out (subtrain/checkpoint.h).
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <subtrain/checkpoint.h>
#include <subtrain/torch_layout.h>
#include <subtrain/version.h>

#include "core/error.h"

st_status st_checkpoint_write_weights(const char *path, const st_model_config *cfg,
                                      const float *params, const st_safetensors_meta_entry *meta,
                                      int n_meta)
{
    return st_checkpoint_write(path, cfg, params, NULL, 0, meta, n_meta);
}

st_status st_checkpoint_write(const char *path, const st_model_config *cfg, const float *params,
                              const st_safetensors_tensor *extra, int n_extra,
                              const st_safetensors_meta_entry *meta, int n_meta)
{
    st_param_segment *segs;
    int n;
    ST_TRY(st_model_config_segments(cfg, &segs, &n));
    st_safetensors_tensor *t = calloc((size_t)n + (size_t)n_extra + 1, sizeof *t);
    st_safetensors_meta_entry *m = calloc((size_t)n_meta + 3, sizeof *m);
    /* the in-major matrices, by name: "a,b,c" */
    size_t cap = 1;
    for (int i = 0; i < n; i++)
        cap += strlen(segs[i].name) + 1;
    char *in_major = calloc(cap, 1);
    if (!t || !m || !in_major) {
        free(segs);
        free(t);
        free(m);
        free(in_major);
        return st_fail(ST_ERR_NOMEM, "out of memory writing %s", path);
    }
    for (int i = 0; i < n; i++) {
        snprintf(t[i].name, sizeof t[i].name, "%s", segs[i].name);
        t[i].dtype = ST_DTYPE_F32;
        t[i].data = params + segs[i].offset;
        if (segs[i].cols == 1) {
            t[i].ndims = 1;
            t[i].shape[0] = segs[i].rows;
        } else {
            t[i].ndims = 2;
            t[i].shape[0] = segs[i].rows;
            t[i].shape[1] = segs[i].cols;
        }
        if (segs[i].in_major) {
            if (*in_major)
                strcat(in_major, ",");
            strcat(in_major, segs[i].name);
        }
    }
    if (n_extra)
        memcpy(t + n, extra, (size_t)n_extra * sizeof *t);
    if (n_meta)
        memcpy(m, meta, (size_t)n_meta * sizeof *m);
    m[n_meta] = (st_safetensors_meta_entry){ "subtrain.version", SUBTRAIN_VERSION };
    m[n_meta + 1] = (st_safetensors_meta_entry){ "subtrain.model", st_model_kind_name(cfg->kind) };
    m[n_meta + 2] = (st_safetensors_meta_entry){ "subtrain.in_major", in_major };
    st_status s = st_safetensors_write(path, t, n + n_extra, m, n_meta + 3);
    free(segs);
    free(t);
    free(m);
    free(in_major);
    return s;
}

/* A training state's tensor, not a weight. */
static int is_state(const char *name)
{
    return strncmp(name, ST_CHECKPOINT_STATE_PREFIX, strlen(ST_CHECKPOINT_STATE_PREFIX)) == 0;
}

st_status st_checkpoint_read_weights(const char *path, const st_model_config *cfg, float *params)
{
    st_safetensors f;
    ST_TRY(st_safetensors_read(path, &f));
    st_status s = st_checkpoint_load_weights(&f, path, cfg, params);
    st_safetensors_free(&f);
    return s;
}

st_status st_checkpoint_load_weights(const st_safetensors *f, const char *path,
                                     const st_model_config *cfg, float *params)
{
    int torch;
    ST_TRY(st_torch_layout_detect(f, cfg, &torch));
    if (torch)   /* PyTorch's names and shapes (doc/interop.md) */
        return st_torch_load(f, path, cfg, params, NULL, NULL);
    st_param_segment *segs;
    int n;
    ST_TRY(st_model_config_segments(cfg, &segs, &n));
    st_status s = ST_OK;
    const char *kind = st_safetensors_meta(f, "subtrain.model");
    if (kind && strcmp(kind, st_model_kind_name(cfg->kind)) != 0)
        s = st_fail(ST_ERR_FORMAT, "%s: the weights of a %s model, not of %s", path, kind,
                    st_model_kind_name(cfg->kind));
    int found = 0;
    for (int i = 0; s == ST_OK && i < n; i++) {
        const st_safetensors_tensor *t = st_safetensors_find(f, segs[i].name);
        const long long rows = segs[i].rows, cols = segs[i].cols;
        char shape[64];
        if (cols == 1)
            snprintf(shape, sizeof shape, "[%lld]", rows);
        else
            snprintf(shape, sizeof shape, "[%lld, %lld]", rows, cols);
        if (!t) {
            s = st_fail(ST_ERR_FORMAT, "%s: no tensor '%s' (of shape %s): the weights of another "
                        "model", path, segs[i].name, shape);
            break;
        }
        const int ok_shape = cols == 1 ? t->ndims == 1 && t->shape[0] == rows
                                       : t->ndims == 2 && t->shape[0] == rows &&
                                             t->shape[1] == cols;
        if (t->dtype != ST_DTYPE_F32 || !ok_shape) {
            s = st_fail(ST_ERR_FORMAT, "%s: tensor '%s' is not F32 of shape %s as the model's: "
                        "another model's weights", path, segs[i].name, shape);
            break;
        }
        memcpy(params + segs[i].offset, t->data, t->bytes);   /* the file's data may be unaligned */
        found++;
    }
    int state = 0;
    for (int j = 0; j < f->n; j++)
        state += is_state(f->tensors[j].name);
    if (s == ST_OK && found + state != f->n) {
        for (int j = 0; j < f->n; j++) {
            int known = is_state(f->tensors[j].name);
            for (int i = 0; i < n && !known; i++)
                known = strcmp(f->tensors[j].name, segs[i].name) == 0;
            if (!known) {
                s = st_fail(ST_ERR_FORMAT, "%s: tensor '%s' is not in the model: the weights of "
                            "another model", path, f->tensors[j].name);
                break;
            }
        }
    }
    free(segs);
    return s;
}

/* ------------------------------------------------------------ --resume DIR */

long long st_checkpoint_step_of(const char *name)
{
    static const char pre[] = "step-", post[] = ".safetensors";
    const size_t len = strlen(name), lp = sizeof pre - 1, ls = sizeof post - 1;
    if (len <= lp + ls || strncmp(name, pre, lp) != 0 || strcmp(name + len - ls, post) != 0)
        return -1;
    long long v = 0;
    for (size_t i = lp; i < len - ls; i++) {
        if (name[i] < '0' || name[i] > '9' || v > (LLONG_MAX - 9) / 10)
            return -1;
        v = v * 10 + (name[i] - '0');
    }
    return v;
}

st_status st_checkpoint_latest(const char *dir_or_file, char *path, size_t path_len)
{
    struct stat sb;
    if (stat(dir_or_file, &sb) != 0)
        return st_fail(ST_ERR_IO, "%s: %s", dir_or_file, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) {
        if ((size_t)snprintf(path, path_len, "%s", dir_or_file) >= path_len)
            return st_fail(ST_ERR_INVALID, "%s: the name is too long", dir_or_file);
        return ST_OK;
    }
    DIR *d = opendir(dir_or_file);
    if (!d)
        return st_fail(ST_ERR_IO, "%s: %s", dir_or_file, strerror(errno));
    long long best = -1;
    char name[256] = "";
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        long long v = st_checkpoint_step_of(e->d_name);
        if (v > best && strlen(e->d_name) < sizeof name) {
            best = v;
            snprintf(name, sizeof name, "%s", e->d_name);
        }
    }
    closedir(d);
    if (best < 0)
        return st_fail(ST_ERR_INVALID, "%s holds no step checkpoint (step-*.safetensors) to "
                       "resume from", dir_or_file);
    if ((size_t)snprintf(path, path_len, "%s/%s", dir_or_file, name) >= path_len)
        return st_fail(ST_ERR_INVALID, "%s: the name is too long", dir_or_file);
    return ST_OK;
}

/*
 * ckpt/weights.c — a full model's parameters as a safetensors file: a
 * tensor per parameter segment, named and shaped as the model lays it
 * out (subtrain/checkpoint.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/checkpoint.h>
#include <subtrain/version.h>

#include "core/error.h"

st_status st_checkpoint_write_weights(const char *path, const st_model_config *cfg,
                                      const float *params, const st_st_meta *meta, int n_meta)
{
    st_param_segment *segs;
    int n;
    ST_TRY(st_model_config_segments(cfg, &segs, &n));
    st_st_tensor *t = calloc((size_t)(n ? n : 1), sizeof *t);
    st_st_meta *m = calloc((size_t)n_meta + 3, sizeof *m);
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
    memcpy(m, meta, (size_t)n_meta * sizeof *m);
    m[n_meta] = (st_st_meta){ "subtrain.version", SUBTRAIN_VERSION };
    m[n_meta + 1] = (st_st_meta){ "subtrain.model", st_model_kind_name(cfg->kind) };
    m[n_meta + 2] = (st_st_meta){ "subtrain.in_major", in_major };
    st_status s = st_safetensors_write(path, t, n, m, n_meta + 3);
    free(segs);
    free(t);
    free(m);
    free(in_major);
    return s;
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
        const st_st_tensor *t = st_safetensors_find(f, segs[i].name);
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
    if (s == ST_OK && found != f->n) {
        for (int j = 0; j < f->n; j++) {
            int known = 0;
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

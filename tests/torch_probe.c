/*
 * tests/torch_probe.c — what subtrain computes on one batch, for
 * tests/torch_interop.sh to compare with PyTorch: a program of the public
 * API only (the library as its users see it).
 *
 *   torch_probe MODEL BATCH OUT
 *
 * MODEL: a torch-layout weights file (subtrain export, or
 * subtrain_torch.save), whose metadata gives the model; BATCH: a
 * safetensors file of "input" (B, features) and "labels" (B x tokens),
 * F32.  The full model is built for batch B with the file's weights and
 * running statistics (when it has them), and writes
 *   OUT.logits.safetensors  "eval_logits" (B x tokens, classes) and
 *                           "eval_loss" [1]: st_model_evaluate (inference:
 *                           the running statistics); then "train_logits",
 *                           "train_loss": st_model_forward_backward
 *                           (training: the batch's statistics)
 *   OUT.grads.safetensors   that pass's gradients, and the running
 *                           statistics it updated, in the torch layout
 *                           (names and shapes of the weights').
 * Exit status 0, 1 when something failed (one line on stderr), 2 for bad
 * arguments.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/subtrain.h>

static int fail(const char *what)
{
    fprintf(stderr, "torch_probe: %s: %s\n", what, st_last_error());
    return 1;
}

/* An integer of the model's metadata (0 when absent). */
static int meta_int(const st_safetensors *f, const char *key)
{
    const char *v = st_safetensors_meta(f, key);
    return v ? atoi(v) : 0;
}

static int config_of(const st_safetensors *f, const char *path, st_model_config *c)
{
    *c = st_model_config_default();
    const char *kind = st_safetensors_meta(f, "subtrain.model");
    const char *act = st_safetensors_meta(f, "subtrain.activation");
    if (!kind || !act) {
        fprintf(stderr, "torch_probe: %s: no subtrain.model or subtrain.activation in its "
                "metadata\n", path);
        return 1;
    }
    if (st_model_kind_parse(kind, &c->kind) != ST_OK ||
        st_activation_parse(act, &c->activation) != ST_OK)
        return fail(path);
    c->depth = meta_int(f, "subtrain.depth");
    c->width = meta_int(f, "subtrain.width");
    c->hidden = meta_int(f, "subtrain.hidden");
    c->heads = meta_int(f, "subtrain.heads");
    c->context = meta_int(f, "subtrain.context");
    c->in_dim = meta_int(f, "subtrain.in_features");
    c->in_channels = meta_int(f, "subtrain.in_channels");
    c->in_height = meta_int(f, "subtrain.in_height");
    c->in_width = meta_int(f, "subtrain.in_width");
    c->n_classes = meta_int(f, "subtrain.classes");
    c->patch = meta_int(f, "subtrain.patch");
    const char *pool = st_safetensors_meta(f, "subtrain.pool");
    if (pool && st_token_pool_parse(pool, &c->pool) != ST_OK)
        return fail(path);
    const char *scale = st_safetensors_meta(f, "subtrain.eval_branch_scale");
    const double s = scale ? strtod(scale, NULL) : 0.0;
    c->subnet.scale = s > 0.0 && s < 1.0 ? (float)s : 0.0f;
    return 0;
}

/* A tensor of the batch file: F32 of `count` elements. */
static const float *batch_tensor(const st_safetensors *b, const char *path, const char *name,
                                 size_t count)
{
    const st_safetensors_tensor *t = st_safetensors_find(b, name);
    if (!t || t->dtype != ST_DTYPE_F32 || t->bytes != count * sizeof(float)) {
        fprintf(stderr, "torch_probe: %s: no F32 tensor '%s' of %zu elements\n", path, name,
                count);
        return NULL;
    }
    return t->data;
}

static int write_logits(const char *path, const float *eval, float eval_loss,
                        const float *train, float train_loss, int64_t rows, int64_t classes)
{
    const st_safetensors_tensor t[4] = {
        { .name = "eval_logits", .dtype = ST_DTYPE_F32, .ndims = 2, .shape = { rows, classes },
          .data = eval },
        { .name = "eval_loss", .dtype = ST_DTYPE_F32, .ndims = 1, .shape = { 1 },
          .data = &eval_loss },
        { .name = "train_logits", .dtype = ST_DTYPE_F32, .ndims = 2,
          .shape = { rows, classes }, .data = train },
        { .name = "train_loss", .dtype = ST_DTYPE_F32, .ndims = 1, .shape = { 1 },
          .data = &train_loss },
    };
    return st_safetensors_write(path, t, 4, NULL, 0) == ST_OK ? 0 : fail(path);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: torch_probe MODEL BATCH OUT\n");
        return 2;
    }
    const char *model_path = argv[1], *batch_path = argv[2];
    char out[4096];
    st_safetensors f, b;
    if (st_safetensors_read(model_path, &f) != ST_OK)
        return fail("reading the model");
    if (st_safetensors_read(batch_path, &b) != ST_OK) {
        st_safetensors_free(&f);
        return fail("reading the batch");
    }
    st_model_config cfg;
    int status = config_of(&f, model_path, &cfg);
    const st_safetensors_tensor *labels = st_safetensors_find(&b, "labels");
    const int tokens = cfg.context > 0 ? cfg.context : 1;
    const int B = labels ? (int)(labels->bytes / sizeof(float)) / tokens : 0;
    if (!status && B < 1) {
        fprintf(stderr, "torch_probe: %s: no labels\n", batch_path);
        status = 1;
    }
    st_arena *arena = NULL;
    st_model *m = NULL;
    st_model_units units;
    float *state = NULL, *eval_logits = NULL;
    int has_state = 0;
    if (!status && (st_model_config_units(&cfg, &units) != ST_OK ||
                    st_arena_create("probe", NULL, 0, &arena) != ST_OK ||
                    st_model_create(&cfg, B, arena, &m) != ST_OK))
        status = fail("building the model");
    if (!status && units.state && !(state = malloc((size_t)units.state * sizeof *state)))
        status = fail("memory");
    if (!status && st_torch_load(&f, model_path, &cfg, st_model_params(m), state,
                                 &has_state) != ST_OK)
        status = fail("loading the weights");
    if (!status && has_state)
        st_model_state_load(m, state);
    const int64_t rows = (int64_t)B * tokens, K = cfg.n_classes;
    const float *x = status ? NULL : batch_tensor(&b, batch_path, "input", (size_t)B * cfg.in_dim);
    const float *y = x ? batch_tensor(&b, batch_path, "labels", (size_t)rows) : NULL;
    if (!status && (!x || !y))
        status = 1;
    if (!status) {
        memcpy(st_model_input(m), x, (size_t)B * cfg.in_dim * sizeof *x);
        for (int64_t r = 0; r < rows; r++)
            st_model_labels(m)[r] = (int32_t)y[r];
    }
    double sum = 0.0;
    int64_t hits = 0;
    float loss = 0.0f;
    if (!status && st_model_evaluate(m, B, &sum, &hits) != ST_OK)
        status = fail("evaluating");
    if (!status && !(eval_logits = malloc((size_t)(rows * K) * sizeof *eval_logits)))
        status = fail("memory");
    if (!status)
        memcpy(eval_logits, st_model_logits(m), (size_t)(rows * K) * sizeof *eval_logits);
    if (!status && st_model_forward_backward(m, &loss) != ST_OK)
        status = fail("forward and backward");
    if (!status) {
        snprintf(out, sizeof out, "%s.logits.safetensors", argv[3]);
        status = write_logits(out, eval_logits, (float)(sum / (double)rows), st_model_logits(m),
                              loss, rows, K);
    }
    if (!status && units.state) {   /* after the training forward's update */
        double *s = calloc((size_t)units.state, sizeof *s);
        uint32_t *n = calloc((size_t)units.state, sizeof *n);
        if (s && n) {
            st_model_state_accumulate(m, s, n);
            for (int k = 0; k < units.state; k++)
                state[k] = (float)s[k];
        } else {
            status = fail("memory");
        }
        free(s);
        free(n);
    }
    if (!status) {
        snprintf(out, sizeof out, "%s.grads.safetensors", argv[3]);
        if (st_torch_write(out, &cfg, st_model_grads(m), units.state ? state : NULL, NULL,
                           0) != ST_OK)
            status = fail(out);
    }
    free(state);
    free(eval_logits);
    st_model_destroy(m);
    st_arena_destroy(arena);
    st_safetensors_free(&f);
    st_safetensors_free(&b);
    return status;
}

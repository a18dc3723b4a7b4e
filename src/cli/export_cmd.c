/*
 * cli/export_cmd.c — the model of --init's file as `subtrain eval` runs it,
 * and `subtrain export`, which writes it in PyTorch's layout or back in
 * subtrain's (doc/interop.md).
 *
 * A subtrain weights file holds no running statistics (checkpoints.md);
 * a torch-layout file may.  Where the file has none, they are
 * re-estimated as `subtrain eval` always did, so that an exported file
 * evaluates as its source does, in subtrain and in PyTorch.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_util.h"
#include "cli/export_cmd.h"

static int fail(const char *what)
{
    st_cli_error("subtrain", "%s: %s", what, st_last_error());
    return EXIT_FAILURE;
}

/* The branch scale the run that wrote the file evaluated with (ist; 0:
 * none): eval and export apply it too. */
static float branch_scale(const st_safetensors *f)
{
    const char *s = st_safetensors_meta(f, "subtrain.eval_branch_scale");
    const double v = s ? strtod(s, NULL) : 0.0;
    return v > 0.0 && v < 1.0 ? (float)v : 0.0f;
}

/* The model's state in the full layout (a whole model's own layout is
 * that one; accumulating says so without assuming it). */
static int full_state(const st_model *m, size_t n, float *out)
{
    double *sum = calloc(n ? n : 1, sizeof *sum);
    uint32_t *count = calloc(n ? n : 1, sizeof *count);
    if (!sum || !count) {
        free(sum);
        free(count);
        st_cli_error("subtrain", "export: out of memory for %zu running statistics", n);
        return EXIT_FAILURE;
    }
    st_model_state_accumulate(m, sum, count);
    for (size_t k = 0; k < n; k++)
        out[k] = count[k] ? (float)(sum[k] / count[k]) : 0.0f;
    free(sum);
    free(count);
    return EXIT_SUCCESS;
}

/* The value of `key` in a subtrain.config entry ("model = mlp; depth =
 * 2; ...; activation = gelu; ..."), into out; 0, or -1 if absent. */
static int config_value(const char *config, const char *key, char *out, size_t n)
{
    const size_t k = strlen(key);
    for (const char *p = config; p && *p; p = strchr(p, ';'), p = p ? p + 1 : NULL) {
        while (*p == ' ')
            p++;
        if (strncmp(p, key, k) != 0 || strncmp(p + k, " = ", 3) != 0)
            continue;
        const char *v = p + k + 3, *end = strchr(v, ';');
        const size_t len = end ? (size_t)(end - v) : strlen(v);
        snprintf(out, n, "%.*s", (int)len, v);
        return 0;
    }
    return -1;
}

/* A subtrain-layout file names no activation or heads in its tensors (the
 * shapes are the same): the run's configuration in its metadata does,
 * and another value would compute another function of the same weights. */
static int check_config(const st_safetensors *f, const char *path, const st_model_config *mc)
{
    const char *config = st_safetensors_meta(f, "subtrain.config");
    char v[64], want[64];
    const char *kind = st_model_kind_name(mc->kind);
    const int attention = strcmp(kind, "gpt") == 0 || strcmp(kind, "vit") == 0;
    if (config && config_value(config, "activation", v, sizeof v) == 0 &&
        strcmp(v, st_activation_name(mc->activation)) != 0) {
        st_cli_error("subtrain", "--init: %s: its run had --activation %s, the model %s: give "
                     "--activation %s", ST_CLI_SHOW(path), ST_CLI_SHOW(v),
                     st_activation_name(mc->activation), ST_CLI_SHOW(v));
        return EXIT_FAILURE;
    }
    snprintf(want, sizeof want, "%d", mc->heads);
    if (config && attention && config_value(config, "heads", v, sizeof v) == 0 &&
        strcmp(v, want) != 0) {
        st_cli_error("subtrain", "--init: %s: its run had --heads %s, the model %s: give --heads "
                     "%s", ST_CLI_SHOW(path), ST_CLI_SHOW(v), want, ST_CLI_SHOW(v));
        return EXIT_FAILURE;
    }
    return EXIT_SUCCESS;
}

int st_cli_init_model(const st_cli_options *o, const st_safetensors *f, const st_dataset *train,
                      st_arena *arena, st_model **out, st_cli_stats *stats, int *batches)
{
    *out = NULL;
    *stats = ST_CLI_STATS_NONE;
    *batches = 0;
    st_model_config mc = o->train.model;
    memset(&mc.subnet, 0, sizeof mc.subnet);
    mc.subnet.scale = branch_scale(f);
    const int B = o->train.batch;
    int torch = 0, has_state = 0, status = EXIT_SUCCESS;
    st_model *m = NULL;
    st_model_units units;
    const size_t n = st_model_config_param_count(&mc);
    float *params = malloc((n ? n : 1) * sizeof *params), *state = NULL;
    if (st_model_config_units(&mc, &units) != ST_OK ||
        st_torch_layout_detect(f, &mc, &torch) != ST_OK)
        status = fail("--init");
    if (status == EXIT_SUCCESS && (!params || (units.state && !(state = malloc(
                                       (size_t)units.state * sizeof *state))))) {
        st_cli_error("subtrain", "--init: out of memory for %zu parameters", n);
        status = EXIT_FAILURE;
    }
    if (status == EXIT_SUCCESS && !torch)
        status = check_config(f, o->init_path, &mc);
    /* the file first: a refusal of its weights comes before the model's */
    if (status == EXIT_SUCCESS &&
        (torch ? st_torch_load(f, o->init_path, &mc, params, state, &has_state)
               : st_checkpoint_load_weights(f, o->init_path, &mc, params)) != ST_OK)
        status = fail("--init");
    if (status == EXIT_SUCCESS && st_model_create(&mc, B, arena, &m) != ST_OK)
        status = fail(o->action == ST_CLI_EXPORT ? "export: building the model"
                                                 : "eval: building the model");
    if (status == EXIT_SUCCESS)   /* a whole model: the full layout */
        memcpy(st_model_params(m), params, st_model_param_count(m) * sizeof *params);
    free(params);
    if (status == EXIT_SUCCESS && units.state) {
        if (has_state) {
            st_model_state_load(m, state);
            *stats = ST_CLI_STATS_FILE;
        } else {
            *stats = ST_CLI_STATS_INITIAL;
            for (int k = 0; k < o->train.bn_calibration &&
                            (uint32_t)(k + 1) * (uint32_t)B <= train->count; k++) {
                st_dataset_gather_rows(train, (uint32_t)(k * B), B, B, st_model_input(m),
                                       st_model_labels(m));
                if (st_model_calibrate(m, k) != ST_OK) {
                    status = fail(o->action == ST_CLI_EXPORT ? "export: calibration"
                                                             : "eval: calibration");
                    break;
                }
                *stats = ST_CLI_STATS_CALIBRATED;
                (*batches)++;
            }
        }
    }
    free(state);
    if (status != EXIT_SUCCESS) {
        st_model_destroy(m);
        return status;
    }
    *out = m;
    return EXIT_SUCCESS;
}

/* What the output's metadata keeps of the input's: what made the weights. */
static const char *const kept_keys[] = {
    "subtrain.config", "subtrain.data", "onednn.version", "subtrain.eval_branch_scale",
};
#define N_KEPT ((int)(sizeof kept_keys / sizeof *kept_keys))

int st_cli_export(const st_cli_options *o, const st_dataset *train)
{
    st_arena *arena = NULL;
    st_model *m = NULL;
    st_cli_stats stats = ST_CLI_STATS_NONE;
    int batches = 0, status = EXIT_SUCCESS;
    st_safetensors f;
    memset(&f, 0, sizeof f);
    if (st_arena_create("export", NULL, 0, &arena) != ST_OK)
        status = fail("export");
    else if (st_safetensors_read(o->init_path, &f) != ST_OK)
        status = fail("--init");
    else
        status = st_cli_init_model(o, &f, train, arena, &m, &stats, &batches);
    size_t n_state = 0;
    if (m)
        st_model_state(m, &n_state);
    float *state = status == EXIT_SUCCESS && n_state ? malloc(n_state * sizeof *state) : NULL;
    if (status == EXIT_SUCCESS && n_state && !state) {
        st_cli_error("subtrain", "export: out of memory for %zu running statistics", n_state);
        status = EXIT_FAILURE;
    }
    if (status == EXIT_SUCCESS && n_state)
        status = full_state(m, n_state, state);
    if (status == EXIT_SUCCESS) {
        st_safetensors_meta_entry meta[N_KEPT + 1];
        int n_meta = 0;
        for (int k = 0; k < N_KEPT; k++) {
            const char *v = st_safetensors_meta(&f, kept_keys[k]);
            if (v)
                meta[n_meta++] = (st_safetensors_meta_entry){ kept_keys[k], v };
        }
        char how[160];
        switch (stats) {
        case ST_CLI_STATS_FILE: snprintf(how, sizeof how, "from the source file"); break;
        case ST_CLI_STATS_CALIBRATED:
            snprintf(how, sizeof how, "re-estimated: the mean of the batch statistics of %d "
                     "training batches of %d", batches, o->train.batch);
            break;
        case ST_CLI_STATS_INITIAL:
            snprintf(how, sizeof how, "initial: mean 0, variance 1 (no calibration batch)");
            break;
        case ST_CLI_STATS_NONE: break;
        }
        if (stats != ST_CLI_STATS_NONE && o->format == ST_CLI_FORMAT_TORCH)
            meta[n_meta++] = (st_safetensors_meta_entry){ "subtrain.running_stats", how };
        const st_model_config *mc = st_model_get_config(m);
        const st_status s = o->format == ST_CLI_FORMAT_TORCH
                                ? st_torch_write(o->output_path, mc, st_model_params(m), state,
                                                 meta, n_meta)
                                : st_checkpoint_write_weights(o->output_path, mc,
                                                              st_model_params(m), meta, n_meta);
        if (s != ST_OK)
            status = fail("export");
        else if (!o->quiet)
            printf("export: %s (%s layout%s%s)\n", o->output_path,
                   o->format == ST_CLI_FORMAT_TORCH ? "torch" : "subtrain",
                   stats == ST_CLI_STATS_NONE ? ""
                   : o->format == ST_CLI_FORMAT_TORCH ? "; running statistics "
                                                      : "; weights only, no running statistics",
                   stats != ST_CLI_STATS_NONE && o->format == ST_CLI_FORMAT_TORCH ? how : "");
    }
    free(state);
    st_safetensors_free(&f);
    st_model_destroy(m);
    st_arena_destroy(arena);
    return status;
}

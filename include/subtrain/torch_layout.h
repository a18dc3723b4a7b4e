/*
 * subtrain/torch_layout.h — a model's weights as PyTorch lays them out
 * (doc/interop.md): the names, shapes and element order of the reference
 * modules of python/subtrain_torch.py, in a safetensors file that its
 * load() builds the module from and its save() writes back.
 *
 * Per parameter segment of the full model (st_model_config_segments):
 *   - the name of the module's parameter ("blocks.0.fc2.weight" for
 *     subtrain's "block0.fc2.weight", "norm.weight" for "final_ln.gamma");
 *   - a matrix stored (in, out) (st_param_segment.in_major) transposed to
 *     nn.Linear's (out, in); an (out, in x k x k) convolution weight as
 *     the (out, in, k, k) of nn.Conv2d (OIHW, the same elements);
 *   - everything else as it is.
 * With batch norms, their running statistics may follow each norm's
 * parameters, named as nn.BatchNorm2d's buffers ("stages.0.0.bn0.
 * running_mean").  The metadata says the layout ("subtrain.layout":
 * "torch") and the model, so that the module can be built from the file
 * alone: "subtrain.model", "subtrain.depth", "subtrain.width",
 * "subtrain.hidden" (the inner width, resolved), "subtrain.heads",
 * "subtrain.context", "subtrain.activation", "subtrain.in_features",
 * "subtrain.in_channels", "subtrain.in_height", "subtrain.in_width",
 * "subtrain.classes".
 */
#ifndef SUBTRAIN_TORCH_LAYOUT_H
#define SUBTRAIN_TORCH_LAYOUT_H

#include <subtrain/checkpoint.h>
#include <subtrain/model.h>
#include <subtrain/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ST_TORCH_LAYOUT_KEY "subtrain.layout"

/* The torch name of a parameter segment or state piece of cfg's model,
 * named as subtrain names it ("block0.fc2.weight"), into out (n bytes);
 * ST_ERR_INVALID for a name the model does not have. */
st_status st_torch_name(const st_model_config *cfg, const char *name, char *out, size_t n);

/* Whether f holds cfg's weights in the torch layout (*torch = 1) or in
 * subtrain's (0): its "subtrain.layout" metadata when it has the key,
 * else its tensor names (a torch-layout file holds at least one name
 * that subtrain's layout of cfg does not have). */
st_status st_torch_layout_detect(const st_safetensors *f, const st_model_config *cfg,
                                 int *torch);

/* The full model of cfg's parameters (st_model_config_param_count
 * floats) and, when state is not NULL, its running statistics
 * (st_model_units.state floats, st_model_config_state_init's layout), as
 * a torch-layout safetensors file written atomically: the caller's
 * metadata first, then subtrain.version, the layout and the model's. */
st_status st_torch_write(const char *path, const st_model_config *cfg, const float *params,
                         const float *state, const st_safetensors_meta_entry *meta, int n_meta);

/* Reads a torch-layout file into the full model's parameters: every one
 * must be there, F32, in its torch shape, and the metadata the file has
 * of the model must be cfg's; a missing tensor, another shape, a tensor
 * the model does not have or another model is refused, naming it (one
 * line).  Running statistics: a file holds all of the model's or none;
 * with state not NULL they are read into it and *has_state says whether
 * there were any (state NULL: they are skipped). */
st_status st_torch_load(const st_safetensors *f, const char *path, const st_model_config *cfg,
                        float *params, float *state, int *has_state);

#ifdef __cplusplus
}
#endif
#endif /* SUBTRAIN_TORCH_LAYOUT_H */

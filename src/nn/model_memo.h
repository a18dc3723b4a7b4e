/*
 * nn/model_memo.h — private: the models of a sizing run, built once per
 * class of identical builds.
 *
 * A sizing run (st_train_size) lays out every worker's model, most of
 * them built from the same configuration.  Over one sizing run, a model
 * asked for again with the same configuration (its subnetwork's lists
 * compared by content), batch, layers, storage presence and thread count
 * is not built again: the arena blocks the first build took (its class's
 * prototype, built in an arena of the memo's own) are asked of the new
 * model's arena in the same order, kinds and sizes, so that arena's
 * accounting is what a build would have left, and the new model is a
 * shell: the prototype's tables, with its own buffers (parameters,
 * gradients, state, tensors, weight copies) at the same places in its own
 * blocks and storage.  A shell is laid out, never run, nor built on: a
 * model of a range of layers, which its caller finishes through the
 * model's context, is always built.
 * SUBTRAIN_SIZING=build-all in the environment builds every model.
 */
#ifndef SUBTRAIN_NN_MODEL_MEMO_H
#define SUBTRAIN_NN_MODEL_MEMO_H

#include "nn/graph.h"

/* How model.c builds a model (its create). */
typedef st_status (*st_model_build_fn)(const st_model_config *cfg, st_model_declare_fn declare,
                                       int lo, int hi, int batch, st_arena *arena,
                                       const st_model_storage *storage, st_model **out);

/* *out <- build(...)'s model: built, or over a sizing arena's space a
 * shell of its class's prototype (built by the first to ask). */
st_status st_model_memo_build(st_model_build_fn build, const st_model_config *cfg,
                              st_model_declare_fn declare, int lo, int hi, int batch,
                              st_arena *arena, const st_model_storage *storage, st_model **out);

/* Frees a shell (m->proto set): its own arrays, not the prototype's. */
void st_model_memo_free_shell(st_model *m);

#endif /* SUBTRAIN_NN_MODEL_MEMO_H */

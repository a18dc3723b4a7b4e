/*
 * nn/model_kinds.h — private: the kinds' table (model_kinds.c) as the rest
 * of nn/ reaches it.
 */
#ifndef SUBTRAIN_NN_MODEL_KINDS_H
#define SUBTRAIN_NN_MODEL_KINDS_H

#include <stddef.h>

#include "nn/graph.h"

/* Kind's entry, NULL for a number that is no kind. */
const st_model_builder *st_model_builder_of(st_model_kind kind);

/* A kind's declaration (its builder's), after what every kind that reads
 * images needs: a model config with an image shape. */
st_status st_model_declare_kind(st_model *m);

/* "gpt" ("resmlp, gpt" for --hidden): the kinds that take an option. */
void st_model_kinds_taking(unsigned option, char *buf, size_t n);

#endif /* SUBTRAIN_NN_MODEL_KINDS_H */

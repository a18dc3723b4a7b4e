/*
 * nn/recompute.h — private: a model's memory for a recompute mode,
 * computed by the layout code the run uses (nn/recompute.c), for the
 * library's own callers (a planner, the tests, the benches).
 */
#ifndef SUBTRAIN_NN_RECOMPUTE_H
#define SUBTRAIN_NN_RECOMPUTE_H

#include <subtrain/model.h>
#include "core/arena_impl.h"

typedef struct st_activation_layout {
    /* Bytes of each kind (st_mem_kind) that creating the model with
     * st_model_create takes from its arena: activations and attention as
     * cfg->recompute lays them out, the other kinds as they are. */
    size_t bytes[ST_MEM_KIND_COUNT];
    /* Of those, the regions the recomputed blocks take turns in (0: a
     * block's own activations, one block's worth; 1 and 2: ALL's block
     * boundaries, the even blocks' outputs and the odd ones'), per kind;
     * zero with ST_RECOMPUTE_NONE. */
    size_t region[ST_ARENA_REGIONS][ST_MEM_KIND_COUNT];
    int blocks;           /* blocks recomputed (0: none) */
} st_activation_layout;

/* The memory of st_model_create(cfg, batch, ...) for cfg->recompute, by
 * building the model once in a scratch arena of its own (the lanes
 * counting each block's bytes): the caller's arenas are not touched.  It
 * is the function st_model_create itself sizes the regions with. */
st_status st_model_activation_layout(const st_model_config *cfg, int batch,
                                     st_activation_layout *out);

#endif /* SUBTRAIN_NN_RECOMPUTE_H */

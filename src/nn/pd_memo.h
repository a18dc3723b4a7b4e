/*
 * nn/pd_memo.h — private: the primitive descriptors of a sizing run,
 * remembered.
 *
 * A sizing run (st_train_size) builds every worker's model, most of them
 * alike; creating a oneDNN primitive descriptor (the search for an
 * implementation) is the most of such a build.  Over one sizing run, a
 * descriptor asked for again with the same operation, attributes and hint
 * (or a reorder between the same memory descriptors) is a clone of the
 * first: the same implementation, memory formats and scratchpad, as
 * creating it again would give.
 */
#ifndef SUBTRAIN_NN_PD_MEMO_H
#define SUBTRAIN_NN_PD_MEMO_H

#include <dnnl.h>

#include <subtrain/arena.h>
#include <subtrain/status.h>

/* What, besides the operation and the hint, makes the attributes of a
 * descriptor (nn/dnnl_util.c's post-ops); zero-filled, then set. */
typedef struct st_pd_variant {
    float scale;
    int relu;
    int has_add0, has_add1, has_mul;
    dnnl_memory_desc_t add0, add1, mul;
} st_pd_variant;

/* *pd <- the descriptor of op_desc with attr (which `variant` describes)
 * and hint: created, or over a sizing arena's space a clone of the one
 * created first.  *id: its entry, for pd_memo_given (-1: not memoised). */
st_status st_pd_memo_create(const st_arena *arena, dnnl_primitive_desc_t *pd, const void *op_desc,
                            const st_pd_variant *variant, const_dnnl_primitive_attr_t attr,
                            dnnl_engine_t engine, const_dnnl_primitive_desc_t hint, int *id,
                            const char *what);

/* *pd <- the reorder's descriptor from src to dst with attr: created, or
 * over a sizing arena's space a clone of the first created. */
st_status st_pd_memo_reorder(const st_arena *arena, dnnl_primitive_desc_t *pd,
                             const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *dst,
                             const_dnnl_primitive_attr_t attr, dnnl_engine_t engine,
                             const char *what);

/* pd, handed to the caller, is the descriptor of entry id (-1: none):
 * as a hint, it names that entry. */
void st_pd_memo_given(const st_arena *arena, const_dnnl_primitive_desc_t pd, int id);

#endif /* SUBTRAIN_NN_PD_MEMO_H */

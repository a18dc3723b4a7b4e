/*
 * comm/kernels.h — private: the work items a step of the shared-buffer
 * backend runs, and the loops that run them (kernels.c).
 *
 * The plan (plan.c) turns holdings into these items once, at attach; a
 * step only walks them.  Two kinds:
 *
 *   rs items   "out[0..n) = combination of some source arrays": a short
 *              program of ops (copy, a + b, +=, the last one optionally
 *              divided by the holder count), run in chunks of ST_CHUNK
 *              floats so that the output chunk (and the scratch chunk of a
 *              local partial) stays in L1 while every source is streamed
 *              from memory exactly once.  Level 1 (remote domains' partials)
 *              and level 2 (the owner's shard gradient) are both rs items.
 *   ag items   "copy n floats from src to dst": all-gather phase 1 (from an
 *              owner's master shard) and phase 2 (from a copier's replica
 *              in the same domain).
 *
 * The order of the ops is the summation order: the kernels add exactly
 * what the program says in the order it says it, element-wise, so the
 * result does not depend on the vector width of the clone the CPU picks.
 */
#ifndef SUBTRAIN_COMM_KERNELS_H
#define SUBTRAIN_COMM_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#define ST_CHUNK 2048           /* floats per pass of the summing loops (8 KiB) */

enum { OP_COPY, OP_SUM2, OP_ACC };

/* One pass over an rs item's chunk. a and b point at element 0 of the item
 * in their source; a == NULL means the scratch chunk. */
typedef struct rs_op {
    const float *a, *b;
    uint8_t kind;
    uint8_t to_tmp;           /* destination: the scratch chunk, not the output */
    uint8_t divide;           /* divide the result by the item's count */
} rs_op;

typedef struct rs_item {
    float *out;
    size_t n;
    size_t op_first, n_ops;
    float count;
} rs_item;

typedef struct ag_item {
    float *dst;
    const float *src;
    size_t n;
} ag_item;

/* Runs n_items rs items; their ops are ops[item.op_first ..].  tmp: the
 * scratch chunk (ST_CHUNK floats), used only by ops with to_tmp or a NULL
 * source. */
void st_comm_run_rs(const rs_item *items, size_t n_items, const rs_op *ops, float *tmp);

/* Runs n_items ag items (plain copies). */
void st_comm_run_ag(const ag_item *items, size_t n_items);

#endif /* SUBTRAIN_COMM_KERNELS_H */

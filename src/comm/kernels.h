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
 *   ag items   "copy n floats from src to dst" (and, where dst has a bf16
 *              copy that the model's products read, write their bf16
 *              rounding there too, or pack them into its blocked copies
 *              from the slab just copied): all-gather phase 1 (from an owner's
 *              master shard) and phase 2 (from a copier's replica in the
 *              same domain).
 *
 * The order of the ops is the summation order: the kernels add exactly
 * what the program says in the order it says it, element-wise, so the
 * result does not depend on the vector width of the clone the CPU picks.
 *
 * Sources of an op are fp32 (SRC_F32, the default and the only kind an
 * fp32 engine emits: its loops are exactly those of before bf16 existed)
 * or, for an engine with bf16 gradient payloads (st_comm_config.payload),
 * a bf16 buffer (SRC_BF16: widened exactly, bf16 being the upper half of
 * an fp32) or an fp32 gradient rounded to bf16 as it is read
 * (SRC_F32_RNE: round to nearest even, then widened).  Either way the
 * sums are fp32, in the same order: both kinds give bitwise the same
 * result, the fp32 sum of the bf16-rounded gradients.  A non-fp32 source
 * is first widened into an L1 chunk (kernels.c), then summed by the fp32
 * loops.
 */
#ifndef SUBTRAIN_COMM_KERNELS_H
#define SUBTRAIN_COMM_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <subtrain/params.h>

#define ST_CHUNK 2048           /* floats per pass of the summing loops (8 KiB) */

enum { OP_COPY, OP_SUM2, OP_ACC };
enum { SRC_F32, SRC_BF16, SRC_F32_RNE };   /* what an op's a or b points at */

/* One pass over an rs item's chunk. a and b point at element 0 of the item
 * in their source (floats, or uint16_t bf16 for SRC_BF16); a == NULL means
 * the scratch chunk (fp32). */
typedef struct rs_op {
    const void *a, *b;
    uint8_t kind;
    uint8_t to_tmp;           /* destination: the scratch chunk, not the output */
    uint8_t divide;           /* divide the result by the item's count */
    uint8_t a_src, b_src;     /* SRC_*: 0 (fp32) unless the engine has bf16 payloads */
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
    uint16_t *half;   /* NULL, or where dst's bf16 copy is: half[i] = bf16(src[i]) */
    /* NULL, or the blocked copies dst lies in (its elements at, at + 1,
     * ... of the vector), packed from dst as it is written */
    const st_param_blocked *blk;
    size_t at;
} ag_item;             /* dst NULL: src holds n bf16 values (a bf16 master's), copied
                        * into half */

/* Runs n_items rs items; their ops are ops[item.op_first ..].  tmp: the
 * scratch chunk (ST_CHUNK floats), used only by ops with to_tmp or a NULL
 * source.  wide: 2 x ST_CHUNK floats where bf16 sources are widened, used
 * only by ops with a source that is not SRC_F32 (NULL if there are none). */
void st_comm_run_rs(const rs_item *items, size_t n_items, const rs_op *ops, float *tmp,
                    float *wide);

/* Elements [lo, hi) of one rs item alone (0 <= lo <= hi <= it->n): the
 * same operations on those elements as st_comm_run_rs (element-wise, so
 * the same bits whatever the part). */
void st_comm_run_rs_part(const rs_item *it, const rs_op *ops, size_t lo, size_t hi, float *tmp,
                         float *wide);


/* Runs n_items ag items: copies, and for an item with a bf16 copy the
 * rounding of each value (to nearest even, core/bf16.h) in the same pass;
 * an item in blocked copies is copied and packed a slab at a time, the
 * packing reading the slab from cache. */
void st_comm_run_ag(const ag_item *items, size_t n_items);

#endif /* SUBTRAIN_COMM_KERNELS_H */

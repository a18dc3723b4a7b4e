/*
 * subtrain/params.h — how a model's parameters are laid out.
 *
 * All parameters of a model instance live in one flat float vector, and
 * their gradients in another of the same length and layout.  Flat vectors
 * are what the optimizer updates (range by range, so a shard owner can
 * update just its shard) and what a reduction engine moves.  A segment names
 * one tensor inside the vector.
 */
#ifndef SUBTRAIN_PARAMS_H
#define SUBTRAIN_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* [begin, end) of the flat parameter vector. */
typedef struct st_range {
    size_t begin, end;
} st_range;

typedef struct st_param_segment {
    char name[40];      /* "block2.fc1.weight" */
    size_t offset;      /* first element in the flat vector */
    size_t count;       /* elements */
    int decay;          /* weight decay applies (matrices) or not (biases, norms) */
    size_t grad_offset; /* where its gradient sits in the gradient vector, or
                         * ST_NO_GRAD (backward masking: not computed) */
    size_t grad_count;  /* elements of its gradient: count, or fewer when
                         * backward masking keeps some neurons' rows only */
    long long rows, cols; /* its storage shape (rows x cols = count; a vector:
                           * n x 1) */
    int in_major;       /* a weight stored (in, out): a row per input */
} st_param_segment;

#define ST_NO_GRAD ((size_t)-1)

/* A bf16 copy of parameters [offset, offset + count), in the same order,
 * that the model's products read instead of the fp32 values (--precision
 * bf16: a linear layer's weights).  The update can write it along with the
 * new values (st_optim_update_copies), which saves the model a pass over
 * the weights before its next forward. */
typedef struct st_param_copy {
    size_t offset, count;
    uint16_t *bf16;     /* count values (bf16 bits) */
} st_param_copy;

/* The bf16 copies of a weight matrix in the blocked layouts its products'
 * kernels read (--weight-layout blocked: one for the forward, one for the
 * backward-data product).  The matrix is params [offset, offset + rows *
 * cols), row-major; its element (r, c) lies at bf16[row_at[r] + col_at[c]]
 * of each copy (a blocked layout's offset is a sum of one term per dim).
 * The update can write them from the new values (st_optim_update_blocked). */
#define ST_BLOCKED_COPIES 2
enum { ST_PAIR_ROWS = 1, ST_PAIR_COLS = 2 };
typedef struct st_param_blocked {
    size_t offset;
    int64_t rows, cols;
    int n;              /* copies: 1 or 2 */
    struct st_blocked_copy {
        uint16_t *bf16;
        const int64_t *row_at, *col_at;
        /* What the packing may count on (set with the offsets): ST_PAIR_ROWS,
         * rows r and r + 1 (r even) side by side and each row's columns 2
         * apart in aligned runs of `run`; ST_PAIR_COLS, the same with rows
         * and columns swapped; 0, neither (one element at a time). */
        int pair;
        int64_t run;
    } copy[ST_BLOCKED_COPIES];
} st_param_blocked;

#ifdef __cplusplus
}
#endif
#endif /* SUBTRAIN_PARAMS_H */

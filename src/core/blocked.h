/*
 * core/blocked.h — private: fp32 weights into bf16 copies in a matrix
 * kernel's blocked layout (st_param_blocked's copies, --weight-layout
 * blocked), for the update (optim.c) and a layer's own conversion
 * (nn/layers/linear.c).
 */
#ifndef SUBTRAIN_CORE_BLOCKED_H
#define SUBTRAIN_CORE_BLOCKED_H

#include <stddef.h>

#include <subtrain/params.h>

/* Rows a packing call takes whole where it can: the update hands it
 * multiples of this many rows (from the matrix's first). */
#define ST_PACK_ROWS 16
/* Elements a writer updates or copies before it packs them, at least:
 * small enough that the packing reads them from cache. */
#define ST_PACK_CHUNK 8192

/* The parameter index after b's matrix. */
static inline size_t st_blocked_end(const st_param_blocked *b)
{
    return b->offset + (size_t)(b->rows * b->cols);
}

/* Sets c's pair and run from its offsets (a rows x cols matrix): what
 * the packing may count on. */
void st_blocked_pattern(struct st_blocked_copy *c, int64_t rows, int64_t cols);

/* Elements [lo, hi) of b's matrix (parameter indices; v: lo's value) into
 * its copies, rounded to nearest even as oneDNN's reorders round. */
void st_blocked_pack(const st_param_blocked *b, const float *v, size_t lo, size_t hi);

/* Where the piece of b's matrix that a writer handles before packing
 * ends, from element x (parameter index, inside b): the next multiple of
 * whole ST_PACK_ROWS-row blocks of at least ST_PACK_CHUNK elements, or the
 * matrix's end. */
size_t st_blocked_slab_end(const st_param_blocked *b, size_t x);

/* Rows [r0, r1) of a row-major matrix of cols columns (v: row r0) into
 * copy c, rounded alike. */
void st_blocked_pack_rows(const struct st_blocked_copy *c, const float *v, int64_t r0,
                          int64_t r1, int64_t cols);

#endif /* SUBTRAIN_CORE_BLOCKED_H */

/*
 * optim/blocked.h — private: packing new weight values into their blocked
 * bf16 copies (st_param_blocked, --weight-layout blocked), for the update
 * in optim.c.
 */
#ifndef SUBTRAIN_OPTIM_BLOCKED_H
#define SUBTRAIN_OPTIM_BLOCKED_H

#include <stddef.h>

#include <subtrain/params.h>

/* Rows a packing call takes whole where it can: the update hands it
 * multiples of this many rows (from the matrix's first). */
#define ST_PACK_ROWS 16

/* Elements [lo, hi) of b's matrix (parameter indices; v: lo's value) into
 * its copies, rounded to nearest even as oneDNN's reorders round. */
void st_blocked_pack(const st_param_blocked *b, const float *v, size_t lo, size_t hi);

#endif /* SUBTRAIN_OPTIM_BLOCKED_H */

/*
 * train/compress.h — private: compressed communication for data
 * parallelism (--compress randk:Q, doc/reduction.md "Compressed
 * communication").  dp.c calls it; it calls run.h's helpers and the
 * engine only.
 *
 * The step's subset is shared by all workers: each shard of the masters'
 * engine keeps k = ceil(Q S) of its S coordinates, drawn from (seed, step,
 * shard), so no index travels.  Every worker packs its kept coordinates
 * (scaled by S / k, or unscaled with error feedback) shard after shard
 * into a vector of N L floats (L: the largest k, rounded up to 16), whose
 * own engine reduces only those: the owner of shard w gets the mean of
 * its k kept coordinates, spreads them into its shard gradient (zero
 * elsewhere) and updates; the masters' engine gathers as in dp.
 */
#ifndef SUBTRAIN_TRAIN_COMPRESS_H
#define SUBTRAIN_TRAIN_COMPRESS_H

#include "train/run.h"

typedef struct st_randk st_randk;

/* After the masters' engine r->comm (gather only) is made: the shards'
 * kept counts and scales, the packed engine, the shared index buffer. */
st_status st_randk_create(run_shared *r, st_randk **out);
void st_randk_destroy(st_randk *k);
void st_randk_abort(st_randk *k);

/* Worker w, on its thread: its packed vector, shard gradient and (error
 * feedback) residual from its arena, attached to the packed engine. */
st_status st_randk_attach(st_randk *k, run_shared *r, st_worker *w);

/* Worker w before its step's barrier: its shard's kept coordinates of
 * step `step` into the shared index buffer (the others read them after
 * the barrier). */
void st_randk_draw(st_randk *k, int wid, uint64_t step);

/* run_sharded.reduce (ctx: the st_randk): pack, the packed engine's
 * reduce-scatter, the owner's shard gradient. */
st_status st_randk_reduce(run_shared *r, void *ctx, st_worker *w, float **out);

/* What worker w reads and writes a step besides its compute: the draw,
 * the pack (and residual), the packed reduce-scatter, the spread, and
 * the masters' all-gather. */
st_comm_bytes st_randk_bytes(const st_randk *k, const run_shared *r, int wid);

/* Error feedback: every worker's residual saved (worker 0, the others
 * waiting), and w's own read back on a resume. */
st_status st_randk_save(st_randk *k, run_shared *r, run_ckpt *ck);
st_status st_randk_resume(st_randk *k, run_shared *r, st_worker *w);

#endif /* SUBTRAIN_TRAIN_COMPRESS_H */

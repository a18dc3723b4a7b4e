/*
 * optim/state16.h — private: the update loops over a bf16 optimizer
 * state (st_moments BF16 and BF16_SR), for optim.c's dispatch.
 */
#ifndef SUBTRAIN_OPTIM_STATE16_H
#define SUBTRAIN_OPTIM_STATE16_H

#include <stddef.h>
#include <stdint.h>

/* One AdamW update's constants. */
typedef struct st_adam_step {
    float lr, wd, b1, b2, eps;
    float c1, c2;   /* bias corrections 1/(1-b1^t), 1/(1-b2^t) */
} st_adam_step;

/* How the state is rounded to bf16: to nearest even (sr 0), or
 * stochastically from a hash of key and the element's index in the
 * vector (first: the index of element 0 of the call's arrays). */
typedef struct st_state_rounding {
    int sr;
    uint32_t key;
    size_t first;
    uint32_t master_key;   /* a bf16 master's draw (st_master_rounding_key) */
} st_state_rounding;

/* The key of update t of a state seeded `seed`. */
uint32_t st_state_rounding_key(uint64_t seed, uint64_t t);

/* The key of update t of a bf16 master seeded `seed`: another stream than
 * the state's, so that the master's draw is independent of the moments'. */
uint32_t st_master_rounding_key(uint64_t seed, uint64_t t);

/* The key of update t of worker `worker`'s own replica of a bf16 master
 * (local SGD: every worker updates every element, each its own draw); t
 * the run's step. */
uint32_t st_master_replica_key(uint64_t seed, uint64_t t, uint64_t worker);

/* The key of the average of bf16 masters after the run's step t (local
 * SGD's round end): a stream of its own. */
uint32_t st_master_average_key(uint64_t seed, uint64_t t);

/* h[i] = x[i] rounded to bf16 stochastically, 16 bits of the hash of key
 * and the element's index first + i: the update's draw. */
void st_master_round_sr(uint16_t *h, const float *x, size_t n, uint32_t key, size_t first);

/* p, g (n) fp32; m, v (n) bf16, read and written; h (n) the bf16 copy of
 * p written, or NULL; shrink: the decoupled weight decay's factor. */
void st_adamw16(float *p, const float *g, uint16_t *m, uint16_t *v, uint16_t *h, size_t n,
                const st_adam_step *a, float shrink, const st_state_rounding *r);

/* SGD with a bf16 momentum buffer buf (n); wd: L2 of this piece (0: none). */
void st_sgd16(float *p, const float *g, uint16_t *buf, uint16_t *h, size_t n, float lr,
              float momentum, float wd, const st_state_rounding *r);

/* AdamW with a bf16 master (ST_MASTER_BF16_SR) over n parameters that
 * have a bf16 copy h, the master: read widened, the new weight computed
 * in fp32 as adamw_one computes it and stored in h rounded stochastically
 * (the hash of r->master_key and the element's index); no fp32 weight
 * is read or written.  The state is m, v (fp32) or m16, v16 (bf16,
 * rounded as r says): the other pair is NULL. */
void st_adamw_master16(const float *g, float *m, float *v, uint16_t *m16, uint16_t *v16,
                       uint16_t *h, size_t n, const st_adam_step *a, float shrink,
                       const st_state_rounding *r);

#endif /* SUBTRAIN_OPTIM_STATE16_H */

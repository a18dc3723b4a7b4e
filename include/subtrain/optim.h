/*
 * subtrain/optim.h — optimizers and learning-rate schedules.
 *
 * Optimizers update a flat parameter vector from a flat gradient vector,
 * over any sub-range [begin, end): a shard owner updates just its shard of
 * the master weights and of the optimizer state.  Weight decay applies to
 * the segments marked `decay` (matrices), not to biases and norms.
 *
 *   SGD:   g' = g + wd p;  buf = momentum buf + g';  p -= lr buf
 *          (PyTorch's formulation; momentum 0 is plain SGD, no state used)
 *   AdamW: p -= lr wd p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *          p -= lr (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
 */
#ifndef SUBTRAIN_OPTIM_H
#define SUBTRAIN_OPTIM_H

#include <stddef.h>
#include <stdint.h>
#include <subtrain/arena.h>
#include <subtrain/params.h>
#include <subtrain/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum st_optimizer_kind { ST_OPT_SGD, ST_OPT_ADAMW } st_optimizer_kind;

/* How the state vectors (AdamW's moments m and v, SGD's momentum buffer)
 * are stored; the master weights stay fp32 in every layout.  A bf16
 * state is computed in fp32 each update and stored rounded: to nearest
 * even (BF16), or stochastically (BF16_SR: up or down with the
 * probabilities that make the rounding unbiased, from a hash of the
 * seed, the step and the element's index, so that a run is repeatable).
 * Under rne, v's decay by beta2 = 0.999 is smaller than half a bf16 step
 * and rounds away: v only grows (doc/precision.md). */
typedef enum st_moments {
    ST_MOMENTS_FP32,
    ST_MOMENTS_BF16,
    ST_MOMENTS_BF16_SR,
} st_moments;

/* Where AdamW keeps the master weights of the parameters that have a bf16
 * copy: fp32 (the default), or in that copy (BF16_SR): the update widens
 * it, computes in fp32 and stores the new weight rounded stochastically
 * from a hash of the seed, the step and the element's index.  Rounded to
 * nearest, an update below half a bf16 step would vanish (doc/precision.md).
 * Parameters without a copy (biases, norms) keep an fp32 master. */
typedef enum st_master {
    ST_MASTER_FP32,
    ST_MASTER_BF16_SR,
} st_master;

typedef struct st_optim_config {
    st_optimizer_kind kind;
    float lr;             /* peak learning rate */
    float momentum;       /* SGD */
    float weight_decay;
    float beta1, beta2, eps;  /* AdamW */
    st_moments moments;   /* the state's storage (default fp32) */
    uint64_t seed;        /* stochastic rounding's (BF16_SR) */
    st_master master;     /* the master weights' storage (default fp32) */
} st_optim_config;

/* AdamW, lr 1e-3, weight decay 0.01, betas (0.9, 0.999), eps 1e-8;
 * momentum 0.9 for when the kind is switched to SGD. */
st_optim_config st_optim_config_default(void);
st_status st_optim_config_check(const st_optim_config *cfg);
const char *st_optimizer_name(st_optimizer_kind kind);
st_status st_optimizer_parse(const char *name, st_optimizer_kind *out);
/* "fp32", "bf16", "bf16-sr". */
const char *st_moments_name(st_moments m);
st_status st_moments_parse(const char *name, st_moments *out);
/* "fp32", "bf16-sr". */
const char *st_master_name(st_master m);
st_status st_master_parse(const char *name, st_master *out);

/* Bytes one update reads and writes per parameter: the gradient read,
 * the fp32 master read and written, each state vector read and written
 * (4 or 2 bytes each way), and 2 more for each bf16 copy it writes
 * (`copy`: 0, 1, or 2 blocked copies): AdamW 28 (30, 32) with fp32
 * moments, 20 (22, 24) with bf16.  With a
 * bf16 master (ST_MASTER_BF16_SR) a parameter with a copy (`copy`) reads
 * and writes the copy only: AdamW 24 with fp32 moments, 16 with bf16. */
int st_optim_bytes_per_param(const st_optim_config *cfg, int copy);

/* An optimizer and its state for parameters [begin, end) of a vector (0
 * and n: all n; a shard owner: its share).  The state (moments, momentum)
 * comes from the arena, counted as optimizer memory, and lives as long as
 * the arena's blocks do; st_optim_destroy frees the rest. */
typedef struct st_optim st_optim;
st_status st_optim_create(const st_optim_config *cfg, size_t begin, size_t end,
                          st_arena *arena, st_optim **out);
/* NULL does nothing. */
void st_optim_destroy(st_optim *opt);

/* Zeroes the state (moments, momentum). */
void st_optim_reset(st_optim *opt);

/* One update of parameters [begin, end) (within the state's range) from
 * their gradients.  params and grads cover the state's range and are
 * indexed from its start (st_optim_create's begin, here `base`): element
 * i of the vector is params[i - base].  `t` is the 1-based step number
 * (Adam's bias correction), `lr` the rate for this step (from a
 * schedule).  segs covers the whole vector in order. */
void st_optim_update(st_optim *opt, float *params, const float *grads,
                     const st_param_segment *segs, int n_segs,
                     size_t begin, size_t end, uint64_t t, float lr);

/* The same, also writing the new value of every parameter that `copies`
 * cover (n_copies ranges, increasing and disjoint) into its bf16 copy,
 * rounded as oneDNN's reorders round: one pass over the weights instead of
 * the update's and then the model's conversion. */
void st_optim_update_copies(st_optim *opt, float *params, const float *grads,
                            const st_param_segment *segs, int n_segs, size_t begin,
                            size_t end, uint64_t t, float lr, const st_param_copy *copies,
                            int n_copies);
/* The same, also writing the blocked copies of the weight matrices that
 * `blocked` cover (n_blocked, increasing, disjoint from each other and
 * from `copies`): the new values of a few thousand parameters at a time,
 * then their roundings into each copy's blocked layout while they are
 * still in cache. */
void st_optim_update_blocked(st_optim *opt, float *params, const float *grads,
                             const st_param_segment *segs, int n_segs, size_t begin,
                             size_t end, uint64_t t, float lr, const st_param_copy *copies,
                             int n_copies, const st_param_blocked *blocked, int n_blocked);

/* ------------------------------------------------------------ schedules */

typedef enum st_schedule_kind { ST_SCHED_CONSTANT, ST_SCHED_WARMUP_COSINE } st_schedule_kind;

typedef struct st_schedule {
    st_schedule_kind kind;
    float peak_lr;
    uint64_t warmup_steps;   /* linear ramp from peak/warmup to peak */
    uint64_t total_steps;    /* cosine decays to 0 at total_steps */
} st_schedule;

/* "constant", "cosine" (also accepted: "warmup-cosine"). */
const char *st_schedule_name(st_schedule_kind kind);
st_status st_schedule_parse(const char *name, st_schedule_kind *out);

/* Learning rate of step t (1-based). */
float st_schedule_lr(const st_schedule *s, uint64_t t);

#ifdef __cplusplus
}
#endif
#endif /* SUBTRAIN_OPTIM_H */

/*
 * optim/optim_impl.h — private: what an st_optim is, for the workers that
 * hold one, the checkpoints that save its state, the strategies that reset
 * or average it, and the tests.
 *
 * The public header keeps st_optim opaque (st_optim_create); inside the
 * library a worker embeds one and sets it up in place.
 */
#ifndef SUBTRAIN_OPTIM_IMPL_H
#define SUBTRAIN_OPTIM_IMPL_H

#include <stdint.h>

#include <subtrain/optim.h>

struct st_optim {
    st_optim_config cfg;
    size_t base;      /* first parameter covered by the state */
    size_t n;         /* parameters covered by the state */
    float *m;         /* SGD momentum buffer or Adam first moment (n), or NULL */
    float *v;         /* Adam second moment (n), or NULL */
    uint16_t *m16;    /* the same in bf16 (moments BF16, BF16_SR: m and v are */
    uint16_t *v16;    /* then NULL), or NULL */
    /* A bf16 master every worker updates in its own replica (local SGD):
     * master_worker = the worker + 1, and the draw of the next update is
     * keyed by the run's step master_step and the worker
     * (st_master_replica_key), both set by the strategy before it; 0: by
     * the update's t alone (st_master_rounding_key). */
    int master_worker;
    uint64_t master_step;
    /* The last update's parameters and the bytes it read and wrote
     * (st_optim_bytes_per_param of each, copies included). */
    size_t updated, update_bytes;
};

/* State for n parameters from the arena (counted as optimizer memory), in
 * the caller's storage. */
st_status st_optim_init(st_optim *opt, const st_optim_config *cfg, size_t n,
                        st_arena *arena);

/* State for parameters [begin, end) only: a shard owner's share. */
st_status st_optim_init_range(st_optim *opt, const st_optim_config *cfg, size_t begin,
                              size_t end, st_arena *arena);

#endif /* SUBTRAIN_OPTIM_IMPL_H */

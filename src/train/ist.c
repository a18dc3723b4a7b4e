/*
 * train/ist.c — independent subnetwork training, in its ResIST form for
 * resmlp: at the start of each round the residual blocks are split into N
 * disjoint sets (a balanced, seeded assignment with one holder per block;
 * stem, final norm and head shared by all); each worker trains the resmlp of
 * its blocks for R local steps on its own data with its own optimizer, no
 * communication; then the parameters are written back — a block by its
 * only holder (a copy), the shared layers averaged over all workers — and a
 * new partition is drawn.  PAPERS.md section 2.
 *
 * Communication is the reduction engine's reduce-scatter once per round,
 * applied to the parameters instead of the gradients (the mean over
 * holders is exactly "copy disjoint parts, average shared ones"); the
 * owners keep the result as the saved masters from which the next round's
 * subnetworks are loaded, and from which evaluation builds the full model.
 * The optimizer state is reset every round by default (ResIST resets
 * momentum; the subnetworks change shape anyway); --optimizer-state keep
 * sends the state vectors through engines of their own, averaged like the
 * parameters, and a new subnetwork starts from what its parameters' holders
 * left (Adam's step count then runs on).  A round also ends at every epoch
 * end, so that evaluation sees synchronised parameters.
 *
 * mlp (IST proper): the hidden neurons of every layer are split into N
 * disjoint parts (groups of --neuron-group); a hidden-to-hidden matrix
 * gives each worker its diagonal block only, so the off-diagonal blocks are
 * nobody's in that round and keep their values (the engine skips them).
 * What reads a 1/N part is scaled by N in training (--train-scale, default
 * for mlp: chosen by measurement, doc/ist.md).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "train/run.h"

st_status st_ist_check_config(const st_train_config *c)
{
    if (c->strategy != ST_STRATEGY_IST) {
        if (c->ist_keep_state || c->ist_train_scale >= 0)
            return st_fail(ST_ERR_INVALID, "--optimizer-state and --train-scale are options of "
                           "--strategy ist");
        return ST_OK;
    }
    if (c->local_steps < 1)
        return st_fail(ST_ERR_INVALID, "--local-steps must be >= 1");
    if (c->model.kind == ST_MODEL_RESMLP && c->subnet == ST_SUBNET_NEURON)
        return st_fail(ST_ERR_INVALID, "ist partitions the blocks of resmlp (ResIST) and the "
                       "neurons of mlp; --subnet neuron with resmlp is an sdp option");
    if (c->ist_keep_state && c->optim.kind == ST_OPT_SGD && c->optim.momentum == 0.0f)
        return st_fail(ST_ERR_INVALID, "--optimizer-state keep: SGD without momentum keeps no "
                       "state");
    return ST_OK;
}

/* State vector i of w's optimizer (compact, the parameters' layout). */
static float *state_vector(st_worker *w, int i)
{
    return i == 0 ? w->optim.m : w->optim.v;
}

/* The engines read the parameters (and kept state vectors) as if they
 * were gradients: their mean over holders is the round's result. */
static st_status attach_params(run_shared *r, int wid, st_worker *w)
{
    st_range *ranges;
    size_t *local;
    int n;
    ST_TRY(st_run_model_ranges(w, 0, &ranges, &local, &n));
    float *p = st_model_params(w->model);
    ST_TRY(st_comm_attach_compact(r->comm, wid, &w->arena, p, p, ranges, local, n));
    for (int i = 0; i < r->n_state; i++) {
        float *v = state_vector(w, i);
        ST_TRY(st_comm_attach_compact(r->state_comm[i], wid, &w->arena, v, v, ranges, local, n));
    }
    return ST_OK;
}

/* The subnetwork of the current partition, its fresh optimizer, attached. */
static st_status build_round(run_shared *r, int wid, st_worker *w, int rebuild)
{
    st_train_config mine;
    int *buf;
    int scale = r->cfg->ist_train_scale < 0 ? r->cfg->model.kind == ST_MODEL_MLP
                                            : r->cfg->ist_train_scale;
    ST_TRY(st_run_subnet_config(r, wid, scale, &mine, &buf));
    st_status s = rebuild ? st_worker_rebuild_model(w, &mine) : st_worker_build_model(w, &mine);
    free(buf);
    ST_TRY(s);
    if (rebuild)
        ST_TRY(st_run_load_saved(r, w, st_model_params(w->model), 0));
    ST_TRY(st_worker_init_optimizer(w, r->cfg, 0, st_model_param_count(w->model)));
    if (rebuild)   /* kept state: what the holders of each parameter left */
        for (int i = 0; i < r->n_state; i++)
            ST_TRY(st_run_load_saved(r, w, state_vector(w, i), 1 + i));
    /* read from the owners' shards, written into the compact vectors */
    r->slots[wid].load_bytes = 2 * (size_t)(1 + r->n_state) * st_model_param_count(w->model) *
                               sizeof(float);
    if (r->n_state == 0)
        r->slots[wid].round_step = 0;
    return attach_params(r, wid, w);
}

st_status st_ist_init_worker(run_shared *r, int wid, st_worker *w,
                             const st_chunk_backend *backend)
{
    ST_TRY(st_worker_init_base(w, wid, r->train->count, backend));
    st_range shard = st_comm_shard(r->comm, wid);
    ST_TRY(st_arena_alloc_floats(&w->arena, ST_MEM_WEIGHTS, shard.end - shard.begin,
                                 &r->slots[wid].saved_master));
    /* what no subnetwork of the first round holds (mlp: off-diagonal
     * blocks) starts, and stays until someone holds it, at its initial value */
    ST_TRY(st_model_init_full_range(&r->cfg->model, r->cfg->seed, shard.begin, shard.end,
                                    r->slots[wid].saved_master));
    st_comm_set_shard_output(r->comm, wid, r->slots[wid].saved_master);
    for (int i = 0; i < r->n_state; i++) {
        ST_TRY(st_arena_alloc_floats(&w->arena, ST_MEM_OPTIMIZER, shard.end - shard.begin,
                                     &r->slots[wid].saved_state[i]));
        st_comm_set_shard_output(r->state_comm[i], wid, r->slots[wid].saved_state[i]);
    }
    return build_round(r, wid, w, 0);
}

st_status st_ist_step(run_shared *r, st_worker *w, uint64_t i, uint64_t step, float *loss,
                      float *lr)
{
    worker_slot *slot = &r->slots[w->id];
    double t = st_run_now_s();
    uint32_t first = (uint32_t)((i * (uint64_t)r->n + (uint64_t)w->id) * (uint64_t)r->cfg->batch);
    ST_TRY(st_worker_compute(w, r->train, w->order, first, loss));
    double t1 = st_run_now_s();
    slot->times.compute += t1 - t;
    int n_segs;
    const st_param_segment *segs = st_model_segments(w->model, &n_segs);
    *lr = st_schedule_lr(&r->plan.schedule, step);
    slot->round_step++; /* Adam's bias correction restarts with a reset state */
    st_optim_update(&w->optim, st_model_params(w->model), st_model_grads(w->model), segs, n_segs,
                    0, st_model_param_count(w->model), slot->round_step, *lr);
    slot->times.optimizer += st_run_now_s() - t1;
    return ST_OK;
}

st_status st_ist_round_end(run_shared *r, st_worker *w, uint64_t round)
{
    const int wid = w->id;
    worker_slot *slot = &r->slots[wid];
    double t = st_run_now_s();
    /* into the saved masters (and states) directly: what someone held is
     * replaced by its mean over the holders, the rest keeps its value */
    ST_TRY(st_comm_reduce_scatter(r->comm, wid)); /* waits for every worker */
    for (int i = 0; i < r->n_state; i++)   /* the kept state: the same average */
        ST_TRY(st_comm_reduce_scatter(r->state_comm[i], wid));
    ST_TRY(st_comm_barrier(r->comm, wid)); /* every saved master written, engine idle */
    if (wid == 0) {
        st_comm_reset(r->comm);
        for (int i = 0; i < r->n_state; i++)
            st_comm_reset(r->state_comm[i]);
        ST_TRY(st_run_draw_assignment(r, round));
    }
    ST_TRY(st_comm_barrier(r->comm, wid)); /* the new partition is there */
    st_status s = build_round(r, wid, w, 1);
    slot->times.reduce += st_run_now_s() - t;
    return s;
}

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
 * The optimizer state is reset every round (ResIST resets momentum; the
 * subnetworks change shape anyway).  A round also ends at every epoch end,
 * so that evaluation sees synchronised parameters.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "train/run.h"

st_status st_ist_check_config(const st_train_config *c)
{
    if (c->strategy != ST_STRATEGY_IST)
        return ST_OK;
    if (c->model.kind != ST_MODEL_RESMLP)
        return st_fail(ST_ERR_INVALID, "ist of --model %s needs neuron-level subnetworks, "
                       "which are not implemented yet; --model resmlp (ResIST) is",
                       st_model_kind_name(c->model.kind));
    if (c->local_steps < 1)
        return st_fail(ST_ERR_INVALID, "--local-steps must be >= 1");
    return ST_OK;
}

/* Worker w's subnetwork in the current partition: the blocks it holds. */
static st_train_config round_config(const run_shared *r, int wid, int *ids)
{
    const st_assignment *a = &r->assign;
    int n = 0;
    for (int u = 0; u < a->n_units; u++)
        if (st_assignment_holds(a, wid, u))
            ids[n++] = u;
    st_train_config mine = *r->cfg;
    mine.model.depth = n;
    mine.model.full_depth = r->cfg->model.depth;
    mine.model.block_ids = ids;
    return mine;
}

/* The engine reads the parameters as if they were gradients. */
static st_status attach_params(run_shared *r, int wid, st_worker *w)
{
    int cap = st_model_get_config(w->model)->depth + 3;
    st_range ranges[cap];
    size_t local[cap];
    int n = st_model_full_ranges(w->model, ranges, local, cap);
    float *p = st_model_params(w->model);
    return st_comm_attach_compact(r->comm, wid, &w->arena, p, p, ranges, local, n);
}

/* The subnetwork of the current partition, its fresh optimizer, attached. */
static st_status build_round(run_shared *r, int wid, st_worker *w, int rebuild)
{
    int ids[r->cfg->model.depth];
    st_train_config mine = round_config(r, wid, ids);
    if (rebuild) {
        ST_TRY(st_worker_rebuild_model(w, &mine));
        st_run_load_saved_masters(r, w);
    } else {
        ST_TRY(st_worker_build_model(w, &mine));
    }
    ST_TRY(st_worker_init_optimizer(w, r->cfg, 0, st_model_param_count(w->model)));
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
    slot->round_step++; /* Adam's bias correction restarts with the state */
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
    ST_TRY(st_comm_reduce_scatter(r->comm, wid)); /* waits for every worker */
    st_range shard = st_comm_shard(r->comm, wid);
    memcpy(slot->saved_master, st_comm_shard_grads(r->comm, wid),
           (shard.end - shard.begin) * sizeof(float));
    ST_TRY(st_comm_barrier(r->comm, wid)); /* every saved master written, engine idle */
    if (wid == 0) {
        st_comm_reset(r->comm);
        st_assignment_free(&r->assign);
        ST_TRY(st_assignment_make(r->n, r->cfg->model.depth, 1, r->cfg->seed, round,
                                  &r->assign));
    }
    ST_TRY(st_comm_barrier(r->comm, wid)); /* the new partition is there */
    st_status s = build_round(r, wid, w, 1);
    slot->times.reduce += st_run_now_s() - t;
    return s;
}

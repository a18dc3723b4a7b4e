/*
 * train/sdp.c — subnetwork data parallelism: each worker trains the blocks
 * it holds (forward masking) or the full model with weight gradients for
 * its blocks only (backward masking); each parameter is averaged over its
 * holders by the reduction engine.  See doc/sdp.md.
 *
 * The step itself is data parallelism's (train.c: compute, wait, reduce,
 * shard update, gather); what is here is who holds what, building and
 * rebuilding the subnetworks, and what only subnetworks need: evaluation
 * of the full model and the alignment report.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "train/run.h"

/* What of subnetwork data parallelism exists so far: block-level units with
 * forward or backward masking, masks fixed or redrawn every R steps
 * (doc/status.md lists the rest). */
st_status st_sdp_check_config(const st_train_config *c)
{
    if (c->strategy != ST_STRATEGY_SDP) {
        if (c->align_every)
            return st_fail(ST_ERR_INVALID, "the alignment report compares subnetwork gradients "
                           "with the full model's: it needs --strategy sdp");
        return ST_OK;
    }
    if (!(c->coverage > 0.0 && c->coverage <= 1.0))
        return st_fail(ST_ERR_INVALID, "coverage must be in (0, 1], got %g", c->coverage);
    if (c->subnet != ST_SUBNET_BLOCK && c->subnet != ST_SUBNET_NEURON)
        return st_fail(ST_ERR_INVALID, "unknown subnetwork unit %d (allowed: block, neuron)",
                       (int)c->subnet);
    if (c->subnet == ST_SUBNET_BLOCK && c->model.kind != ST_MODEL_RESMLP)
        return st_fail(ST_ERR_INVALID, "--subnet block trains subnetworks of resmlp blocks; "
                       "--model %s has none (use --subnet neuron)", st_model_kind_name(c->model.kind));
    if (c->masking != ST_MASKING_FORWARD && c->masking != ST_MASKING_BACKWARD)
        return st_fail(ST_ERR_INVALID, "unknown masking %d (allowed: forward, backward)",
                       (int)c->masking);
    if (c->masking == ST_MASKING_BACKWARD && c->align_every)
        return st_fail(ST_ERR_INVALID, "--report align measures forward-masked subnetworks; "
                       "a backward-masked gradient is the full gradient on its coordinates");
    return ST_OK;
}

/* Copies every owner's master shard into worker 0's full model: after an
 * all-gather, the current values of every parameter. */
static void load_full_model(run_shared *r)
{
    float *p = st_model_params(r->eval_model);
    for (int k = 0; k < r->n; k++) {
        st_range sh = st_comm_shard(st_run_masters(r), k);
        /* IST keeps its averaged parameters in the saved masters */
        const float *src = r->cfg->strategy == ST_STRATEGY_IST
                         ? r->slots[k].saved_master : st_comm_shard_params(st_run_masters(r), k);
        memcpy(p + sh.begin, src, (sh.end - sh.begin) * sizeof *p);
    }
}

/* cos(g, G) over the coordinates worker k holds: g its subnetwork gradient
 * (compact), G the full model's gradient on the same batch. */
static double worker_alignment(const worker_slot *s, const float *full)
{
    double dot = 0.0, gg = 0.0, ff = 0.0;
    for (int i = 0; i < s->n_ranges; i++) {
        const float *g = s->grads + s->local[i], *f = full + s->ranges[i].begin;
        size_t len = s->ranges[i].end - s->ranges[i].begin;
        for (size_t j = 0; j < len; j++) {
            dot += (double)g[j] * f[j];
            gg += (double)g[j] * g[j];
            ff += (double)f[j] * f[j];
        }
    }
    return gg > 0.0 && ff > 0.0 ? dot / sqrt(gg * ff) : 0.0;
}

/* The alignment report (worker 0, while the others wait in the
 * reduce-scatter: their gradients are complete and stay put).  Costs one
 * full-model forward and backward per worker: measured every align_every
 * steps only. */
st_status st_sdp_measure_alignment(run_shared *r, st_worker *w0, uint64_t i)
{
    const int B = r->cfg->batch;
    load_full_model(r);
    for (int k = 0; k < r->n; k++) {
        uint32_t first = (uint32_t)((i * (uint64_t)r->n + (uint64_t)k) * (uint64_t)B);
        st_dataset_gather(r->train, w0->order + first, (size_t)B, st_model_input(r->eval_model),
                          st_model_labels(r->eval_model));
        float loss;
        ST_TRY(st_model_forward_backward(r->eval_model, &loss));
        double a = worker_alignment(&r->slots[k], st_model_grads(r->eval_model));
        r->align_sum += a;
        if (r->align_count == 0 || a < r->align_min)
            r->align_min = a;
        r->align_count++;
    }
    return ST_OK;
}

/* Subnetworks: evaluation always uses the full model.  Worker 0 keeps one
 * (in an arena of its own: it is not training memory), fills it from every
 * owner's master shard, which after the epoch's last all-gather holds the
 * current values, and runs the whole test set; the others wait. */
st_status st_sdp_evaluate_full(run_shared *r, st_worker *w, double *loss, double *acc)
{
    ST_TRY(st_run_sync(r, w->id)); /* every master shard is final */
    if (w->id == 0) {
        load_full_model(r);
        ST_TRY(st_run_evaluate_model(r->eval_model, r->test, loss, acc));
    }
    return st_run_sync(r, w->id);
}

/* Builds (or rebuilds) w's subnetwork of the current assignment. */
static st_status build_subnet(run_shared *r, st_worker *w, int rebuild)
{
    st_train_config mine;
    int *buf;
    ST_TRY(st_run_subnet_config(r, w->id, r->cfg->scale_branches, &mine, &buf));
    st_status s = rebuild ? st_worker_rebuild_model(w, &mine) : st_worker_build_model(w, &mine);
    free(buf);
    return s;
}

/* A subnetwork worker: state that outlives rounds first (order, optimizer
 * state of its shard, the saved master), then its first subnetwork. */
st_status st_sdp_init_worker(run_shared *r, int wid, st_worker *w,
                             const st_chunk_backend *backend)
{
    ST_TRY(st_worker_init_base(w, wid, r->train->count, backend));
    st_range shard = st_comm_shard(r->comm, wid);
    ST_TRY(st_optim_init_range(&w->optim, &r->cfg->optim, shard.begin, shard.end, &w->arena));
    if (r->cfg->resample)
        ST_TRY(st_arena_alloc_floats(&w->arena, ST_MEM_WEIGHTS, shard.end - shard.begin,
                                     &r->slots[wid].saved_master));
    ST_TRY(build_subnet(r, w, 0));
    ST_TRY(st_run_attach_worker(r, wid, w));
    /* weights no subnetwork holds yet have their initial values too */
    if (st_run_unheld_possible(r->cfg))
        ST_TRY(st_model_init_full_range(&r->cfg->model, r->cfg->seed, shard.begin, shard.end,
                                        st_comm_shard_params(st_run_masters(r), wid)));
    return ST_OK;
}

/* Round `round` of subnetworks (--resample): every worker saves its master
 * shard, worker 0 draws the new assignment, every worker rebuilds its
 * subnetwork, loads the current values of what it now holds and attaches
 * again.  The optimizer state stays: shards do not move. */
st_status st_sdp_new_round(run_shared *r, st_worker *w, uint64_t round)
{
    const int wid = w->id;
    st_range shard = st_comm_shard(r->comm, wid);
    ST_TRY(st_comm_barrier(r->comm, wid)); /* every all-gather is done */
    memcpy(r->slots[wid].saved_master, st_comm_shard_params(st_run_masters(r), wid),
           (shard.end - shard.begin) * sizeof(float));
    ST_TRY(st_comm_barrier(r->comm, wid)); /* every master saved, the engines idle */
    if (wid == 0) {
        st_comm_reset(r->comm);
        if (r->params_comm)
            st_comm_reset(r->params_comm);
        ST_TRY(st_run_draw_assignment(r, round));
    }
    ST_TRY(st_comm_barrier(r->comm, wid)); /* the new assignment is there */
    ST_TRY(build_subnet(r, w, 1));
    ST_TRY(st_run_load_saved(r, w, st_model_params(w->model), 0));
    ST_TRY(st_run_attach_worker(r, wid, w));
    /* the engine initialised the held elements (the same values): the
     * others, nobody's in this round, keep theirs */
    if (st_run_unheld_possible(r->cfg))
        memcpy(st_comm_shard_params(st_run_masters(r), wid), r->slots[wid].saved_master,
               (shard.end - shard.begin) * sizeof(float));
    return ST_OK;
}

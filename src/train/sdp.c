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

/* Neuron units: layer l's groups are units l x groups + j. */
static int units_per_layer(const run_shared *r)
{
    st_model_config m = r->cfg->model;
    m.neuron_group = r->cfg->neuron_group;
    return st_model_neuron_groups(&m);
}

int st_run_neuron_units(const st_train_config *c)
{
    return c->subnet == ST_SUBNET_NEURON ||
           (c->strategy == ST_STRATEGY_IST && c->model.kind == ST_MODEL_MLP);
}

int st_run_unheld_possible(const st_train_config *c)
{
    return st_run_neuron_units(c) && c->model.kind == ST_MODEL_MLP &&
           !(c->strategy == ST_STRATEGY_SDP && c->masking == ST_MASKING_BACKWARD);
}

st_status st_run_check_units(const run_shared *r)
{
    const st_train_config *c = r->cfg;
    const int k = r->assign_k, L = c->model.depth;
    if (!st_run_neuron_units(c)) {
        if ((long)L * k < r->n)
            return st_fail(ST_ERR_INVALID, "%d blocks, each held by %d worker(s), leave some of "
                           "the %d workers without a block (need blocks x holders >= workers)",
                           L, k, r->n);
        return ST_OK;
    }
    const int U = units_per_layer(r);
    if ((long)U * k < r->n)
        return st_fail(ST_ERR_INVALID, "a neuron layer has %d groups of %d; each held by %d "
                       "worker(s), they leave some of the %d workers without a neuron in a layer "
                       "(need groups x holders >= workers: use a smaller --neuron-group)",
                       U, c->neuron_group, k, r->n);
    return ST_OK;
}

st_status st_run_draw_assignment(run_shared *r, uint64_t round)
{
    st_assignment_free(&r->assign);
    if (st_run_neuron_units(r->cfg))
        return st_assignment_make_layered(r->n, r->cfg->model.depth, units_per_layer(r),
                                          r->assign_k, r->cfg->seed, round, &r->assign);
    return st_assignment_make(r->n, r->cfg->model.depth, r->assign_k, r->cfg->seed, round,
                              &r->assign);
}

/* Worker w's subnetwork in the current assignment.  Blocks: the blocks it
 * holds (forward masking), or the full model with gradients for them
 * (backward).  Neurons: the groups it holds in every layer, as a compact
 * model or as gradient rows.  Forward masking scales branches by the
 * inverse coverage when asked (train_scale).  *buf (freed by the caller
 * once the model is built) holds the lists the config points to. */
st_status st_run_subnet_config(const run_shared *r, int wid, int train_scale,
                               st_train_config *mine, int **buf)
{
    const st_assignment *a = &r->assign;
    const int L = r->cfg->model.depth;
    *mine = *r->cfg;
    *buf = malloc(((size_t)L + (size_t)a->n_units) * sizeof **buf);
    if (!*buf)
        return st_fail(ST_ERR_NOMEM, "out of memory describing a subnetwork");
    const int backward = r->cfg->strategy == ST_STRATEGY_SDP &&
                         r->cfg->masking == ST_MASKING_BACKWARD;
    if (!backward && train_scale)
        mine->model.branch_scale = (float)r->n / (float)a->k;
    if (st_run_neuron_units(r->cfg)) {
        const int U = a->n_units / L;
        int *count = *buf, *groups = *buf + L, n = 0;
        for (int l = 0; l < L; l++) {
            count[l] = 0;
            for (int j = 0; j < U; j++)
                if (st_assignment_holds(a, wid, l * U + j)) {
                    groups[n++] = j;
                    count[l]++;
                }
        }
        mine->model.neuron_group = r->cfg->neuron_group;
        mine->model.kept_count = count;
        mine->model.kept_groups = groups;
        mine->model.neuron_grads_only = backward;
        return ST_OK;
    }
    if (backward) {
        /* the whole model; weight gradients for the held blocks only */
        uint8_t *keep = (uint8_t *)*buf;
        for (int u = 0; u < a->n_units; u++)
            keep[u] = (uint8_t)st_assignment_holds(a, wid, u);
        mine->model.grad_blocks = keep;
        return ST_OK;
    }
    int *ids = *buf, n = 0;
    for (int u = 0; u < a->n_units; u++)
        if (st_assignment_holds(a, wid, u))
            ids[n++] = u;
    mine->model.depth = n;
    mine->model.full_depth = L;
    mine->model.block_ids = ids;
    return ST_OK;
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

/* A new subnetwork gets the current values of what it holds: the owners'
 * master shards, saved before the rebuild. */
st_status st_run_load_saved(const run_shared *r, st_worker *w, float *dst, int which)
{
    int n = st_model_full_ranges(w->model, NULL, NULL, 0);
    st_range *ranges = malloc((size_t)n * sizeof *ranges);
    size_t *local = malloc((size_t)n * sizeof *local);
    if (!ranges || !local) {
        free(ranges);
        free(local);
        return st_fail(ST_ERR_NOMEM, "out of memory loading a subnetwork");
    }
    st_model_full_ranges(w->model, ranges, local, n);
    /* both sorted: walk the shards along the ranges */
    int k = 0;
    for (int i = 0; i < n; i++) {
        size_t pos = ranges[i].begin;
        while (pos < ranges[i].end) {
            st_range sh = st_comm_shard(r->comm, k);
            if (sh.end <= pos) {
                k++;
                continue;
            }
            size_t hi = ranges[i].end < sh.end ? ranges[i].end : sh.end;
            const float *src = which == 0 ? r->slots[k].saved_master : r->slots[k].saved_state[which - 1];
            memcpy(dst + local[i] + (pos - ranges[i].begin), src + (pos - sh.begin),
                   (hi - pos) * sizeof *dst);
            pos = hi;
        }
    }
    free(ranges);
    free(local);
    return ST_OK;
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

/*
 * train/subnets.c — what the subnetwork strategies (sdp.c, ist.c) share:
 * which units there are (blocks, or neuron groups per layer), drawing a
 * round's assignment, the model config of a worker's subnetwork in it, and
 * loading a rebuilt subnetwork's current values from the owners' saved
 * shards.
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "train/run.h"

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

int st_run_unheld_ranges(const run_shared *r, st_range *out, int cap)
{
    if (!st_run_unheld_possible(r->cfg))
        return 0;
    int n = 0;
    for (int i = 0; i < r->n_full_segs && n < cap; i++) {
        const st_param_segment *g = &r->full_segs[i];
        size_t len = strlen(g->name);
        /* fc1.weight .. fc{L-1}.weight: both sides are neuron layers */
        if (strncmp(g->name, "fc", 2) == 0 && strcmp(g->name, "fc0.weight") != 0 &&
            len > 7 && strcmp(g->name + len - 7, ".weight") == 0)
            out[n++] = (st_range){ g->offset, g->offset + g->count };
    }
    return n;
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

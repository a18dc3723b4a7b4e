/*
 * train/subnets.c — what the subnetwork strategies (sdp.c, ist.c) share
 * (subnets.h): which units there are (blocks, or neuron groups per layer),
 * drawing a round's assignment, the model config of a worker's subnetwork
 * in it, loading a rebuilt subnetwork's current values from the owners'
 * saved shards, and worker 0's full model for evaluation.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/world.h>

#include "core/arena_impl.h"
#include "core/bf16.h"
#include "core/error.h"
#include "core/ranges.h"
#include "train/subnets.h"


/* What the model's layers declare (st_model_units); a config that cannot
 * be declared was refused by st_model_config_check before. */
static st_model_units units_of(const st_train_config *c)
{
    st_model_units u;
    if (st_model_config_units(&c->model, &u) != ST_OK)
        memset(&u, 0, sizeof u);
    return u;
}

int st_subnets_neuron_units(const st_train_config *c, st_subnet_kind subnet, int without_groups)
{
    return subnet == ST_SUBNET_NEURON || (without_groups && units_of(c).groups == 0);
}

int st_subnets_unheld_possible(const st_train_config *c, int neuron_units, int backward)
{
    return neuron_units && units_of(c).chained && !backward;
}

int st_subnets_unheld_ranges(const subnets *s, const run_shared *r, st_range *out, int cap)
{
    /* the weights from one width layer to another (mlp: fc1 .. fc{L-1}) */
    return s->unheld_possible ? st_model_config_chained_ranges(&r->cfg->model, out, cap) : 0;
}

/* "--model resmlp --depth 4" ("--model resnet18": a kind whose depth is fixed) */
static void model_words(const st_model_config *m, char *out, size_t size)
{
    if (!st_model_kind_takes(m->kind, ST_MODEL_OPT_DEPTH))
        snprintf(out, size, "--model %s", st_model_kind_name(m->kind));
    else
        snprintf(out, size, "--model %s --depth %d", st_model_kind_name(m->kind), m->depth);
}

/* The narrowest width layer in groups of --neuron-group: *groups of them,
 * from *neurons neurons; 0 when the model declares no width layer. */
static st_status narrowest_width_layer(const st_model_config *m, int unit_size, int *groups,
                                       int *neurons)
{
    const int n = st_model_config_width_groups(m, unit_size, NULL, 0);
    *groups = *neurons = 0;
    if (n < 1)
        return ST_OK;
    int *g = malloc(2 * (size_t)n * sizeof *g);
    if (!g)
        return st_fail(ST_ERR_NOMEM, "out of memory for the width layers");
    st_model_config_width_groups(m, unit_size, g, n);
    st_model_config_width_groups(m, 1, g + n, n);
    int at = 0;
    for (int l = 1; l < n; l++)
        at = g[l] < g[at] ? l : at;
    *groups = g[at];
    *neurons = g[n + at];
    free(g);
    return ST_OK;
}

st_status st_subnets_check_layout(const st_train_config *c, const char *strategy, int workers,
                                  int k, int neuron_units, double coverage)
{
    st_model_units u;
    /* a model that cannot be declared yet (a ResNet before its data's
     * shape is known) is checked when the loop prepares, which declares it
     * or says why not */
    if (workers < 1 || k < 1 || st_model_config_units(&c->model, &u) != ST_OK)
        return ST_OK;
    const int sdp = coverage > 0.0, need = (workers + k - 1) / k;
    const char *ranks = st_world_size() > 1 ? " of all ranks" : "";
    char at[32] = "";
    if (sdp)
        snprintf(at, sizeof at, " at --coverage %g", coverage);
    char holders[80];
    if (sdp)
        snprintf(holders, sizeof holders, "k = max(1, round(C x N)) = %d holder%s", k,
                 k == 1 ? "" : "s");
    else
        snprintf(holders, sizeof holders, "%d holder%s", k, k == 1 ? "" : "s");
    if (!neuron_units) {
        const int L = u.groups;
        if (L < 1 || (long)L * k >= workers)
            return ST_OK;
        char model[64];
        model_words(&c->model, model, sizeof model);
        return st_fail(ST_ERR_INVALID, "--strategy %s%s: %s has %d block%s, and %d workers%s%s "
                       "need %d (each block has %s, and every worker needs one): %s",
                       strategy, sdp ? " --subnet block" : "", model, L,
                       L == 1 ? "" : "s", workers, ranks, at, need, holders,
                       sdp ? "raise --depth or --coverage, or lower --workers"
                           : "raise --depth or lower --workers");
    }
    int U, neurons;
    ST_TRY(narrowest_width_layer(&c->model, c->neuron_group, &U, &neurons));
    if (U < 1 || (long)U * k >= workers)
        return ST_OK;
    /* an image model without patches is convolutional: its units are channels */
    const int channels = st_model_kind_reads(c->model.kind) == ST_MODEL_READS_IMAGES &&
                         !st_model_kind_takes(c->model.kind, ST_MODEL_OPT_PATCH);
    return st_fail(ST_ERR_INVALID, "--strategy %s%s: a width layer of %d %s%s makes %d "
                   "group%s of --neuron-group %d, and %d workers%s%s need %d (each group has "
                   "%s, and every worker needs a group in every layer): %s",
                   strategy, sdp ? " --subnet neuron" : "", neurons,
                   channels ? "channel" : "neuron", neurons == 1 ? "" : "s", U, U == 1 ? "" : "s",
                   c->neuron_group, workers, ranks,
                   at, need, holders,
                   sdp ? "lower --neuron-group, raise --coverage or lower --workers"
                       : "lower --neuron-group or --workers");
}

st_status st_subnets_prepare(subnets *s, const run_shared *r, int k, int neuron_units,
                             int backward)
{
    s->neuron_units = neuron_units;
    s->backward = backward;
    s->unheld_possible = st_subnets_unheld_possible(r->cfg, neuron_units, backward);
    s->k = k;
    /* the units the model's layers declare: layer groups, or width layers
     * whose units follow each other layer by layer */
    st_model_units u;
    ST_TRY(st_model_config_units(&r->cfg->model, &u));
    s->layers = neuron_units ? u.width_layers : u.groups;
    if (s->layers < 1)
        return st_fail(ST_ERR_INVALID, "--model %s declares no %s to make subnetworks of",
                       st_model_kind_name(r->cfg->model.kind),
                       neuron_units ? "width layers" : "layer groups");
    s->n_sections = neuron_units ? s->layers : u.sections;
    s->sections = calloc((size_t)(s->n_sections + 1), sizeof *s->sections);
    s->saved = calloc((size_t)r->n, sizeof *s->saved);
    if (!s->saved || !s->sections)
        return st_fail(ST_ERR_NOMEM, "out of memory for %d workers' saved shards", r->n);
    if (neuron_units)
        st_model_config_width_groups(&r->cfg->model, r->cfg->neuron_group, s->sections,
                                     s->n_sections);
    else if (s->n_sections)
        st_model_config_sections(&r->cfg->model, s->sections, s->n_sections);
    /* every worker gets a unit: the loop checked the layout
     * (st_strategy_check_layout) before the strategy's prepare */
    return st_subnets_draw(s, r, 0);
}

void st_subnets_release(subnets *s)
{
    st_model_destroy(s->eval_model);
    s->eval_model = NULL;
    st_arena_release(&s->eval_arena);
    st_assignment_free(&s->assign);
    free(s->saved);
    s->saved = NULL;
    free(s->sections);
    s->sections = NULL;
    for (int i = 0; i < s->n_gathered; i++)
        free(s->gathered[i]);
    s->n_gathered = 0;
    free(s->m16);
    s->m16 = NULL;
    s->n_m16 = 0;
    free(s->laid);
    free(s->laid_hash);
    s->laid = NULL;
    s->laid_hash = NULL;
    s->n_laid = s->cap_laid = 0;
}

st_status st_subnets_prepare_gather(subnets *s, const run_shared *r, int kinds)
{
    if (r->ranks == 1)
        return ST_OK;
    for (; s->n_gathered < kinds; s->n_gathered++) {
        s->gathered[s->n_gathered] = calloc(r->n_params, sizeof(float));
        if (!s->gathered[s->n_gathered])
            return st_fail(ST_ERR_NOMEM, "out of memory for the gathered shards of the ranks");
    }
    return ST_OK;
}

st_status st_subnets_gather_saved(subnets *s, const run_shared *r, st_comm *c)
{
    for (int which = 0; which < s->n_gathered; which++) {
        float *full = s->gathered[which];
        for (int k = 0; k < r->n; k++) {
            st_range sh = st_comm_shard(c, k);
            const float *src = which == 0 ? s->saved[k].master : s->saved[k].state[which - 1];
            memcpy(full + sh.begin, src, (sh.end - sh.begin) * sizeof *full);
        }
        /* a rank's shards are one run of the vector */
        ST_TRY(st_world_allgather_range(full, st_comm_shard(c, 0).begin,
                                        st_comm_shard(c, r->n - 1).end));
    }
    return ST_OK;
}

st_status st_subnets_draw(subnets *s, const run_shared *r, uint64_t round)
{
    st_assignment_free(&s->assign);
    /* neurons: each width layer's groups dealt evenly (with equal layers
     * st_assignment_make_layered); blocks: each section's (a ResNet's
     * stage's) */
    if (s->neuron_units || s->n_sections > 1)
        ST_TRY(st_assignment_make_sections(r->n_all, s->n_sections, s->sections, s->k,
                                           r->cfg->seed, round, &s->assign));
    else
        ST_TRY(st_assignment_make(r->n_all, s->layers, s->k, r->cfg->seed, round, &s->assign));
    s->repeat = r->sizing && st_subnets_laid_before(s);
    return ST_OK;
}

/* What a sizing run remembers of the assignments it laid out: at most
 * this many, of this many bytes in all. */
enum { LAID_MOST = 4096 };
#define LAID_BYTES ((size_t)64 << 20)

int st_subnets_laid_before(subnets *s)
{
    const size_t size = (size_t)s->assign.n_workers * (size_t)s->assign.n_units;
    uint64_t h = 1469598103934665603ull;   /* FNV-1a */
    for (size_t i = 0; i < size; i++)
        h = (h ^ s->assign.held[i]) * 1099511628211ull;
    for (int i = 0; i < s->n_laid; i++)
        if (s->laid_hash[i] == h && memcmp(s->laid + (size_t)i * size, s->assign.held, size) == 0)
            return 1;
    if (s->n_laid == s->cap_laid) {   /* room for more, within the bounds */
        const size_t most = LAID_BYTES / size < LAID_MOST ? LAID_BYTES / size : LAID_MOST;
        const int cap = s->cap_laid ? 2 * s->cap_laid : 16;
        if ((size_t)cap > most)
            return 0;
        uint8_t *laid = realloc(s->laid, (size_t)cap * size);
        if (laid)
            s->laid = laid;
        uint64_t *hash = realloc(s->laid_hash, (size_t)cap * sizeof *hash);
        if (hash)
            s->laid_hash = hash;
        if (!laid || !hash)
            return 0;   /* not remembered: laid out again if drawn again */
        s->cap_laid = cap;
    }
    memcpy(s->laid + (size_t)s->n_laid * size, s->assign.held, size);
    s->laid_hash[s->n_laid++] = h;
    return 0;
}

/* Worker w's subnetwork in the current assignment.  Blocks: the blocks it
 * holds (forward masking), or the full model with gradients for them
 * (backward).  Neurons: the groups it holds in every layer, as a compact
 * model or as gradient rows.  Forward masking scales branches by the
 * inverse coverage when asked (train_scale).  *buf (freed by the caller
 * once the model is built) holds the lists the config points to. */
st_status st_subnets_config(const subnets *s, const run_shared *r, int wid, int train_scale,
                            st_train_config *mine, int **buf)
{
    const st_assignment *a = &s->assign;
    const int L = s->layers;
    *mine = *r->cfg;
    *buf = malloc(((size_t)L + (size_t)a->n_units) * sizeof **buf);
    if (!*buf)
        return st_fail(ST_ERR_NOMEM, "out of memory describing a subnetwork");
    const int backward = s->backward;
    st_model_subnet *sub = &mine->model.subnet;
    if (!backward && train_scale)
        sub->scale = (float)r->n_all / (float)a->k;
    if (s->neuron_units) {
        int *count = *buf, *groups = *buf + L, n = 0;
        for (int l = 0, first = 0; l < L; first += s->sections[l++]) {
            count[l] = 0;
            for (int j = 0; j < s->sections[l]; j++)
                if (st_assignment_holds(a, wid, first + j)) {
                    groups[n++] = j;
                    count[l]++;
                }
        }
        sub->unit_size = r->cfg->neuron_group;
        sub->width_count = count;
        sub->width_kept = groups;
        sub->width_grads_only = backward;
        return ST_OK;
    }
    if (backward) {
        /* the whole model; weight gradients for the held blocks only */
        uint8_t *keep = (uint8_t *)*buf;
        for (int u = 0; u < a->n_units; u++)
            keep[u] = (uint8_t)st_assignment_holds(a, wid, u);
        sub->group_grads = keep;
        return ST_OK;
    }
    int *ids = *buf, n = 0;
    for (int u = 0; u < a->n_units; u++)
        if (st_assignment_holds(a, wid, u))
            ids[n++] = u;
    sub->groups = ids;
    sub->n_groups = n;
    return ST_OK;
}

/* A new subnetwork gets the current values of what it holds: the owners'
 * master shards, saved before the rebuild. */
st_status st_subnets_load_saved(const subnets *s, const run_shared *r, st_worker *w, float *dst,
                                int which)
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
    if (which < s->n_gathered) {   /* over ranks: the gathered full vector */
        for (int i = 0; i < n; i++)
            memcpy(dst + local[i], s->gathered[which] + ranges[i].begin,
                   (ranges[i].end - ranges[i].begin) * sizeof *dst);
        free(ranges);
        free(local);
        return ST_OK;
    }
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
            const float *src = which == 0 ? s->saved[k].master : s->saved[k].state[which - 1];
            memcpy(dst + local[i] + (pos - ranges[i].begin), src + (pos - sh.begin),
                   (hi - pos) * sizeof *dst);
            pos = hi;
        }
    }
    free(ranges);
    free(local);
    return ST_OK;
}

/* ------------------------------------------------------------ the full model */

st_status st_subnets_build_eval(subnets *s, const st_train_config *cfg,
                                const st_model_config *model, const st_chunk_backend *backend)
{
    st_arena_init(&s->eval_arena, "evaluation", backend, 0);
    return st_model_create(model, cfg->batch, &s->eval_arena, &s->eval_model);
}

st_status st_subnets_master16(subnets *s, const run_shared *r)
{
    /* address space only, as a sizing run's (no primitive, nothing
     * written), outside a sizing run's space: its memos of models are the
     * workers' */
    st_arena scratch;
    const st_chunk_backend untouched = st_sizing_backend();
    st_arena_init(&scratch, "weight copies' layout", &untouched, 0);
    st_model *m = NULL;
    st_status st = st_model_create(&r->cfg->model, r->cfg->batch, &scratch, &m);
    int n = 0;
    const st_param_copy *c = st == ST_OK ? st_model_copies(m, &n) : NULL;
    if (st == ST_OK && n > 0 && !(s->m16 = malloc((size_t)n * sizeof *s->m16)))
        st = st_fail(ST_ERR_NOMEM, "out of memory listing the weight copies");
    for (int i = 0; st == ST_OK && i < n; i++)
        s->m16[i] = (st_range){ c[i].offset, c[i].offset + c[i].count };
    if (st == ST_OK)
        s->n_m16 = n;
    st_model_destroy(m);
    st_arena_release(&scratch);
    return st;
}

void st_subnets_shard_widen(const subnets *s, st_comm *masters, int k, float *dst)
{
    const st_range sh = st_comm_shard(masters, k);
    const float *p = st_comm_shard_params(masters, k);
    const uint16_t *h = st_comm_shard_params16(masters, k);
    int inside;
    for (size_t at = sh.begin, to; at < sh.end; at = to) {
        to = st_ranges_piece(s->m16, s->n_m16, at, sh.end, &inside);
        if (inside)
            st_bf16_widen_n(dst + (at - sh.begin), h + (at - sh.begin), to - at);
        else
            memcpy(dst + (at - sh.begin), p + (at - sh.begin), (to - at) * sizeof *dst);
    }
}

void st_subnets_shard_store(const subnets *s, st_comm *masters, int k, const float *src)
{
    const st_range sh = st_comm_shard(masters, k);
    float *p = st_comm_shard_params(masters, k);
    uint16_t *h = st_comm_shard_params16(masters, k);
    int inside;
    for (size_t at = sh.begin, to; at < sh.end; at = to) {
        to = st_ranges_piece(s->m16, s->n_m16, at, sh.end, &inside);
        if (inside)
            st_bf16_round_n(h + (at - sh.begin), src + (at - sh.begin), to - at);
        else
            memcpy(p + (at - sh.begin), src + (at - sh.begin), (to - at) * sizeof *p);
    }
}

st_status st_subnets_load_full(subnets *s, const run_shared *r, st_comm *masters, int from_saved)
{
    float *p = st_model_params(s->eval_model);
    for (int k = 0; k < r->n; k++) {
        st_range sh = st_comm_shard(masters, k);
        const float *src = from_saved ? s->saved[k].master : st_comm_shard_params(masters, k);
        if (s->n_m16 && !from_saved)   /* a bf16 master widened */
            st_subnets_shard_widen(s, masters, k, p + sh.begin);
        else
            memcpy(p + sh.begin, src, (sh.end - sh.begin) * sizeof *p);
    }
    if (r->ranks == 1)
        return ST_OK;
    /* the other ranks' shards: a rank's shards are one run of the vector */
    return st_world_allgather_range(p, st_comm_shard(masters, 0).begin,
                                    st_comm_shard(masters, r->n - 1).end);
}

/* The full model's batch norms see a network none of the subnetworks
 * trained as: a block's input is the sum of every block before it, not of
 * the few a subnetwork held, scaled.  Their running statistics, averaged
 * over the subnetworks, describe those, and on a ResNet they wreck the
 * full model's test accuracy (doc/cnn.md).  So, as networks trained in
 * several widths or depths do, the full model re-estimates them on
 * training batches (the first of the current epoch's order), its weights
 * untouched. */
static st_status calibrate(subnets *s, run_shared *r, st_worker *w)
{
    st_model *m = s->eval_model;
    size_t n_state;
    const uint32_t B = (uint32_t)r->cfg->batch;
    int K = r->cfg->bn_calibration;
    if (!st_model_state(m, &n_state) || K == 0)
        return ST_OK;
    if ((uint64_t)K * B > r->train->count)
        K = (int)(r->train->count / B);
    for (int k = 0; k < K; k++) {
        st_dataset_gather_train(r->train, w->epoch, w->order + (size_t)k * B, B,
                                st_model_input(m), st_model_labels(m));
        ST_TRY(st_model_calibrate(m, k));
    }
    return ST_OK;
}

/* Worker 0 keeps the full model, fills it from every owner's shard, which
 * after the epoch's last all-gather (or round end) holds the current
 * values, and runs the whole test set; the others wait. */
st_status st_subnets_evaluate_full(subnets *s, run_shared *r, st_comm *masters, int from_saved,
                                   st_worker *w, double *loss, double *acc)
{
    ST_TRY(st_run_sync(r, w->id)); /* every master shard is final */
    if (w->id == 0) {
        ST_TRY(st_subnets_load_full(s, r, masters, from_saved));
        st_run_load_state(r, s->eval_model);   /* the loop synced it */
        ST_TRY(calibrate(s, r, w));
        ST_TRY(st_run_evaluate_model(s->eval_model, r->test, loss, acc));
    }
    return st_run_sync(r, w->id);
}

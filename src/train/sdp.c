/*
 * train/sdp.c — subnetwork data parallelism: each worker trains the blocks
 * it holds (forward masking) or the full model with weight gradients for
 * its blocks only (backward masking); each parameter is averaged over its
 * holders by the reduction engine.  See doc/sdp.md.
 *
 * The step itself is the sharded data-parallel step (run.c: compute, wait,
 * reduce, shard update, gather); what is here is who holds what, building
 * and rebuilding the subnetworks, and what only subnetworks need:
 * evaluation of the full model and the alignment report.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/world.h>

#include "core/bf16.h"
#include "core/error.h"
#include "train/strategy.h"
#include "train/subnets.h"

typedef struct sdp_run {
    subnets sn;                  /* assignment, saved masters, the full model */
    st_comm *params_comm;        /* backward masking: every worker holds every
                                  * parameter; used for its all-gather (and
                                  * masters) only; r->comm reduces gradients */
    run_attachment *att;         /* n: what each worker's gradient holds */
    double align_sum, align_min; /* worker 0, over the current epoch */
    int align_count;
    double *align_all;           /* ranks > 1: every rank's sums (3 x ranks) */
    /* forward masking with a bf16 master: each worker's update writes its
     * bf16 master shard through these (the full model's copies over its
     * shard, st_comm_shard_params16), rebuilt after each attach */
    st_param_copy **master_copies;   /* n */
    int *n_master_copies;
} sdp_run;

/* The engine whose master shards hold the parameters and whose all-gather
 * brings them to the workers (backward masking has a second engine). */
static st_comm *masters(const run_shared *r, const sdp_run *s)
{
    return s->params_comm ? s->params_comm : r->comm;
}

/* What of subnetwork data parallelism exists so far: block-level units with
 * forward or backward masking, masks fixed or redrawn every R steps
 * (doc/status.md lists the rest). */
static st_status sdp_check(const st_train_config *c, int chosen)
{
    if (!chosen) {
        if (c->sdp.align_every)
            return st_fail(ST_ERR_INVALID, "the alignment report compares subnetwork gradients "
                           "with the full model's: it needs --strategy sdp");
        return ST_OK;
    }
    if (!(c->sdp.coverage > 0.0 && c->sdp.coverage <= 1.0))
        return st_fail(ST_ERR_INVALID, "coverage must be in (0, 1], got %g", c->sdp.coverage);
    /* the report's full-model gradient is of one batch */
    if (c->sdp.align_every && c->accumulate > 1)
        return st_fail(ST_ERR_INVALID, "--report align compares gradients of one batch; "
                       "--accumulate %d adds up micro-batches (drop one of the two)",
                       c->accumulate);
    if (c->sdp.subnet != ST_SUBNET_BLOCK && c->sdp.subnet != ST_SUBNET_NEURON)
        return st_fail(ST_ERR_INVALID, "unknown subnetwork unit %d (allowed: block, neuron)",
                       (int)c->sdp.subnet);
    st_model_units units;
    /* a model that cannot be declared yet (a resnet before its data's
     * shape is known: the CLI checks before loading) is checked again by
     * st_train_run */
    if (st_model_config_units(&c->model, &units) != ST_OK)
        return ST_OK;
    /* (a model with attention heads, gpt: a neuron unit is a whole head and
     * as many neurons of the MLP) */
    const st_model_kind kind = c->model.kind;
    const int head = st_model_kind_takes(kind, ST_MODEL_OPT_HEADS) && c->model.heads > 0
                         ? c->model.width / c->model.heads : 0;
    if (c->sdp.subnet == ST_SUBNET_NEURON && head > 0 && c->neuron_group % head)
        return st_fail(ST_ERR_INVALID, "--neuron-group %d: %s's neuron units are whole attention "
                       "heads, so it must be a multiple of the head size %d (--width %d / "
                       "--heads %d)", c->neuron_group, st_model_kind_name(kind), head,
                       c->model.width, c->model.heads);
    if (c->sdp.subnet == ST_SUBNET_BLOCK && units.groups == 0)
        return st_fail(ST_ERR_INVALID, "--subnet block trains subnetworks of residual blocks "
                       "(layer groups, as in resmlp); --model %s has none (use --subnet neuron)",
                       st_model_kind_name(kind));
    if (c->sdp.masking != ST_MASKING_FORWARD && c->sdp.masking != ST_MASKING_BACKWARD)
        return st_fail(ST_ERR_INVALID, "unknown masking %d (allowed: forward, backward)",
                       (int)c->sdp.masking);
    if (c->sdp.masking == ST_MASKING_BACKWARD && c->sdp.align_every)
        return st_fail(ST_ERR_INVALID, "--report align measures forward-masked subnetworks; "
                       "a backward-masked gradient is the full gradient on its coordinates");
    return ST_OK;
}

/* Backward masking: every worker holds the full model, whose weights it
 * writes only as a shard owner: one copy per NUMA domain.  Forward
 * masking: each worker's subnetwork is a compact vector of its own. */
static st_weights sdp_weights(const st_train_config *c)
{
    return c->sdp.masking == ST_MASKING_BACKWARD ? ST_WEIGHTS_SHARED : ST_WEIGHTS_PRIVATE;
}

/* Every worker needs a unit: k = max(1, round(C x N)) holders of each. */
static st_status sdp_layout(const st_train_config *c, int workers)
{
    const st_sdp_config *o = &c->sdp;
    return st_subnets_check_layout(c, "sdp", workers,
                                   st_subnet_holders_per_unit(workers, o->coverage),
                                   st_subnets_neuron_units(c, o->subnet, 0), o->coverage);
}

/* The plan, the assignment of round 0, the gradients' engine (reduce-only
 * with backward masking, which adds a gather-only one for the
 * parameters). */
static st_status sdp_prepare(run_shared *r, void **state)
{
    const st_train_config *cfg = r->cfg;
    sdp_run *s = calloc(1, sizeof *s);
    if (!s)
        return st_fail(ST_ERR_NOMEM, "out of memory for the subnetworks' state");
    *state = s;
    ST_TRY(st_run_make_plan(cfg, r->n_all, r->train, &r->plan));
    const int backward = cfg->sdp.masking == ST_MASKING_BACKWARD;
    ST_TRY(st_subnets_prepare(&s->sn, r, st_subnet_holders_per_unit(r->n_all, cfg->sdp.coverage),
                              st_subnets_neuron_units(cfg, cfg->sdp.subnet, 0), backward));
    /* resuming after step S: the masks of S's round ((S - 1) / R); a new
     * round due before step S + 1 is drawn by that step as ever */
    if (r->resume && cfg->sdp.resample && r->resume->at.step > 0)
        ST_TRY(st_subnets_draw(&s->sn, r, (r->resume->at.step - 1) / cfg->sdp.resample));
    s->att = calloc((size_t)r->n, sizeof *s->att);
    if (r->ranks > 1)
        s->align_all = malloc(sizeof(double) * 3 * (size_t)r->ranks);
    if (!s->att || (r->ranks > 1 && !s->align_all))
        return st_fail(ST_ERR_NOMEM, "out of memory for the subnetworks' state");
    st_range unheld[ST_MAX_UNHELD_RANGES];
    int n_unheld = st_subnets_unheld_ranges(&s->sn, r, unheld, ST_MAX_UNHELD_RANGES);
    if (!backward && st_run_copies_master(r)) {
        /* compact subnetworks list copies of their own layouts: the masters
         * are the engine's bf16 shards, which one domain's workers read */
        if (r->ranks > 1 || r->placement.n_domains > 1)
            return st_fail(ST_ERR_INVALID, "--master-weights bf16-sr with --strategy sdp "
                           "--masking forward runs in one process on one NUMA domain; this "
                           "run has %d rank%s and %d domain%s", r->ranks,
                           r->ranks == 1 ? "" : "s", r->placement.n_domains,
                           r->placement.n_domains == 1 ? "" : "s");
        s->master_copies = calloc((size_t)r->n, sizeof *s->master_copies);
        s->n_master_copies = calloc((size_t)r->n, sizeof *s->n_master_copies);
        if (!s->master_copies || !s->n_master_copies)
            return st_fail(ST_ERR_NOMEM, "out of memory for the subnetworks' state");
        ST_TRY(st_subnets_master16(&s->sn, r));
        ST_TRY(st_run_create_engine16(r, 0, s->sn.unheld_possible, unheld, n_unheld,
                                      s->sn.m16, s->sn.n_m16, &r->comm));
    } else {
        ST_TRY(st_run_create_engine(r, backward ? ST_COMM_REDUCE : 0, s->sn.unheld_possible,
                                    unheld, n_unheld, &r->comm));
    }
    if (backward)
        ST_TRY(st_run_create_engine(r, ST_COMM_GATHER, s->sn.unheld_possible, unheld, n_unheld,
                                    &s->params_comm));
    return cfg->sdp.resample ? st_subnets_prepare_gather(&s->sn, r, 1) : ST_OK;
}

/* cos(g, G) over the coordinates worker k holds: g its subnetwork gradient
 * (compact), G the full model's gradient on the same batch. */
static double worker_alignment(const run_attachment *s, const float *full)
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
static st_status measure_alignment(run_shared *r, void *ctx, st_worker *w0, uint64_t i,
                                   uint64_t step)
{
    sdp_run *s = ctx;
    if (step % r->cfg->sdp.align_every != 0)
        return ST_OK;
    const int B = r->cfg->batch;
    st_model *full = s->sn.eval_model;
    ST_TRY(st_subnets_load_full(&s->sn, r, masters(r, s), 0));
    for (int k = 0; k < r->n; k++) {   /* this rank's workers, their global rows */
        uint32_t first = (uint32_t)((i * (uint64_t)r->n_all + (uint64_t)st_run_global(r, k)) *
                                    (uint64_t)B);
        st_dataset_gather_train(r->train, w0->epoch, w0->order + first, (size_t)B,
                                st_model_input(full), st_model_labels(full));
        float loss;
        ST_TRY(st_model_forward_backward(full, &loss));
        double a = worker_alignment(&s->att[k], st_model_grads(full));
        s->align_sum += a;
        if (s->align_count == 0 || a < s->align_min)
            s->align_min = a;
        s->align_count++;
    }
    return ST_OK;
}

/* Builds (or rebuilds) w's subnetwork of the current assignment. */
static st_status build_subnet(run_shared *r, sdp_run *s, st_worker *w, int rebuild)
{
    st_train_config mine;
    int *buf;
    /* the default: scaled, except blocks of a model with batch norm,
     * whose accuracy the scale lowers (doc/sdp.md for resmlp, doc/cnn.md
     * for resnet, where it helps channel groups) */
    const int scale = r->cfg->sdp.scale_branches >= 0 ? r->cfg->sdp.scale_branches
                                                  : r->n_state == 0 || s->sn.neuron_units;
    ST_TRY(st_subnets_config(&s->sn, r, st_run_global(r, w->id), scale, &mine, &buf));
    st_status st = rebuild ? st_worker_rebuild_model(w, &mine) : st_worker_build_model(w, &mine);
    free(buf);
    return st;
}

/* Forward masking with a bf16 master, after w attached: the full model's
 * copies over w's shard, pointing into its bf16 master shard (which the
 * attach took from w's arena), for its update. */
static st_status attach_master_copies(run_shared *r, sdp_run *s, st_worker *w)
{
    if (!s->master_copies)
        return ST_OK;
    const st_range sh = st_comm_shard(r->comm, w->id);
    uint16_t *h = st_comm_shard_params16(r->comm, w->id);
    int n = 0;
    for (int i = 0; h && i < s->sn.n_m16; i++)
        n += s->sn.m16[i].begin < sh.end && s->sn.m16[i].end > sh.begin;
    s->master_copies[w->id] = NULL;
    s->n_master_copies[w->id] = 0;
    if (!n)
        return ST_OK;
    void *p;
    ST_TRY(st_arena_alloc(&w->arena, ST_MEM_WORKSPACE, (size_t)n * sizeof(st_param_copy), &p));
    st_param_copy *c = p;
    n = 0;
    for (int i = 0; i < s->sn.n_m16; i++) {
        const size_t lo = s->sn.m16[i].begin > sh.begin ? s->sn.m16[i].begin : sh.begin;
        const size_t hi = s->sn.m16[i].end < sh.end ? s->sn.m16[i].end : sh.end;
        if (lo < hi)
            c[n++] = (st_param_copy){ .offset = lo, .count = hi - lo,
                                      .bf16 = h + (lo - sh.begin) };
    }
    s->master_copies[w->id] = c;
    s->n_master_copies[w->id] = n;
    return ST_OK;
}

/* Forward masking with a bf16 master: w's master shard from the shard's
 * values (initial, saved, resumed), rounded into its bf16 shard; else
 * copied into its fp32 shard. */
static void store_shard(const run_shared *r, sdp_run *s, int wid, const float *values)
{
    if (s->master_copies)
        st_subnets_shard_store(&s->sn, r->comm, wid, values);
    else
        memcpy(st_comm_shard_params(masters(r, s), wid), values,
               (st_comm_shard(r->comm, wid).end - st_comm_shard(r->comm, wid).begin) *
                   sizeof(float));
}

/* A subnetwork worker: state that outlives rounds first (order, optimizer
 * state of its shard, the saved master), then its first subnetwork;
 * worker 0 also builds the full model that forward masking evaluates. */
static st_status sdp_init_worker(run_shared *r, void *state, int wid, st_worker *w,
                                 const st_chunk_backend *backend)
{
    sdp_run *s = state;
    ST_TRY(st_worker_init_base(w, wid, r->train->count, backend));
    st_range shard = st_comm_shard(r->comm, wid);
    ST_TRY(st_worker_init_optimizer(w, r->cfg, shard.begin, shard.end));
    /* (a bf16 master in the domain's copies saves none: new_round) */
    if (r->cfg->sdp.resample && !(st_run_copies_master(r) && r->shared_weights))
        ST_TRY(st_arena_alloc_floats(&w->arena, ST_MEM_WEIGHTS, shard.end - shard.begin,
                                     &s->sn.saved[wid].master));
    /* shared weights (backward masking): the full models over the domain's
     * copy, its initial values written once; a bf16 master (backward
     * masking too) in the copies, as dp's */
    if (!s->master_copies)   /* (compact subnetworks keep their own vectors) */
        ST_TRY(st_run_weights_storage(r, w, r->cfg, backend));
    ST_TRY(build_subnet(r, s, w, 0));
    ST_TRY(st_run_weights_built(r, w));
    ST_TRY(st_run_attach_worker(r->comm, s->params_comm, wid, w, &s->att[wid]));
    ST_TRY(attach_master_copies(r, s, w));
    /* weights no subnetwork holds yet have their initial values too (the
     * layout is all a sizing run reads); a bf16 master's are in the
     * copies already, and its master shard has no memory under them */
    if (s->sn.unheld_possible && !r->sizing && !w->storage.copies_master) {
        float *v = malloc((shard.end - shard.begin + 1) * sizeof *v);
        if (!v)
            return st_fail(ST_ERR_NOMEM, "out of memory for %zu initial weights",
                           shard.end - shard.begin);
        st_status st = st_run_initial_range(r->cfg, shard.begin, shard.end, v);
        if (st == ST_OK)
            store_shard(r, s, wid, v);
        free(v);
        ST_TRY(st);
    }
    if (wid == 0 && !s->sn.backward)
        ST_TRY(st_subnets_build_eval(&s->sn, r->cfg, &r->cfg->model, backend));
    return ST_OK;
}

/* Resuming: the subnetwork's parameters, optimizer shard and statistics,
 * and the master shard (the parameters nobody holds included). */
static st_status sdp_resume(run_shared *r, void *state, st_worker *w)
{
    sdp_run *s = state;
    ST_TRY(st_run_resume_model(r, w));
    if (s->master_copies)   /* (the saved weights are on the bf16 grid there) */
        st_subnets_shard_store(&s->sn, r->comm, w->id,
                               r->resume->params + st_comm_shard(r->comm, w->id).begin);
    else
        st_run_resume_master(r, masters(r, s), w);
    return ST_OK;
}

/* A private replica's new copies (backward masking, a bf16 master): the
 * saved shards' values, rounded (exact: they are on the bf16 grid); over
 * ranks from the gathered full vector. */
static void load_saved_copies(const sdp_run *s, const run_shared *r, st_worker *w)
{
    int n;
    const st_param_copy *c = st_model_copies(w->model, &n);
    int k = 0;   /* both sorted: walk the shards along the copies */
    for (int i = 0; i < n; i++) {
        size_t pos = c[i].offset;
        const size_t end = c[i].offset + c[i].count;
        if (s->sn.n_gathered)   /* over ranks */
            st_bf16_round_n(c[i].bf16, s->sn.gathered[0] + pos, end - pos);
        while (!s->sn.n_gathered && pos < end) {
            const st_range sh = st_comm_shard(r->comm, k);
            if (sh.end <= pos) {
                k++;
                continue;
            }
            const size_t hi = end < sh.end ? end : sh.end;
            st_bf16_round_n(c[i].bf16 + (pos - c[i].offset),
                            s->sn.saved[k].master + (pos - sh.begin), hi - pos);
            pos = hi;
        }
    }
}

/* Round `round` of subnetworks (--resample): every worker saves its master
 * shard, worker 0 draws the new assignment, every worker rebuilds its
 * subnetwork, loads the current values of what it now holds and attaches
 * again.  The optimizer state stays: shards do not move.  A sizing run
 * draws and rebuilds alike, moving no values. */
static st_status new_round(run_shared *r, sdp_run *s, st_worker *w, uint64_t round)
{
    /* A bf16 master in the copies (backward masking): a domain's copies
     * keep it through the rebuild, nothing is saved; a private replica's
     * are rebuilt with its model, so its shard is saved widened from
     * them and the new copies get the saved values (load_saved_copies),
     * its fp32 elements staying in its vector. */
    const int wid = w->id, moves = !r->sizing, copies = w->storage.copies_master;
    const int saves = moves && !(copies && r->shared_weights);
    float *saved = s->sn.saved[wid].master;
    st_range shard = st_comm_shard(r->comm, wid);
    if (moves)
        ST_TRY(st_run_sync_state(r, w));   /* the running statistics meet */
    ST_TRY(st_comm_barrier(r->comm, wid)); /* every all-gather is done */
    if (saves && copies)
        st_run_master_widen(w, shard.begin, shard.end, saved);
    else if (saves && s->master_copies)   /* bf16 master shards, widened */
        st_subnets_shard_widen(&s->sn, r->comm, wid, saved);
    else if (saves)
        memcpy(saved, st_comm_shard_params(masters(r, s), wid),
               (shard.end - shard.begin) * sizeof(float));
    ST_TRY(st_comm_barrier(r->comm, wid)); /* every master saved, the engines idle */
    if (wid == 0) {
        ST_TRY(st_subnets_gather_saved(&s->sn, r, r->comm));   /* over ranks */
        st_comm_reset(r->comm);
        if (s->params_comm)
            st_comm_reset(s->params_comm);
        ST_TRY(st_subnets_draw(&s->sn, r, round));
    }
    ST_TRY(st_comm_barrier(r->comm, wid)); /* the new assignment is there */
    if (s->sn.repeat)   /* a sizing run laid it out before */
        return ST_OK;
    ST_TRY(build_subnet(r, s, w, 1));
    /* shared weights: the new model reads its domain's copy, which holds
     * the current values already */
    if (saves && copies)
        load_saved_copies(s, r, w);
    else if (saves && !r->shared_weights)
        ST_TRY(st_subnets_load_saved(&s->sn, r, w, st_model_params(w->model), 0));
    if (moves)
        st_run_load_state(r, w->model);
    ST_TRY(st_run_attach_worker(r->comm, s->params_comm, wid, w, &s->att[wid]));
    ST_TRY(attach_master_copies(r, s, w));
    /* the engine initialised the held elements (the same values): the
     * others, nobody's in this round, keep theirs (a bf16 master's
     * parameters' engine holds every element) */
    if (saves && !copies && s->sn.unheld_possible)
        store_shard(r, s, wid, saved);
    return ST_OK;
}

/* A sizing run: the rounds the run draws, before steps R + 1, 2 R + 1, ...
 * of its r->plan.total_steps (sdp_step). */
static st_status sdp_size_draws(run_shared *r, void *state, st_worker *w)
{
    const uint64_t R = r->cfg->sdp.resample;
    for (uint64_t done = R; R && done < r->plan.total_steps; done += R)
        ST_TRY(new_round(r, state, w, done / R));
    return ST_OK;
}

/* A new round first when --resample says so (before steps R + 1, 2 R + 1,
 * ...), then the sharded step; the alignment report between its barrier
 * and its reduction. */
static st_status sdp_step(run_shared *r, void *state, st_worker *w, uint64_t i, uint64_t step,
                          float *loss, float *lr)
{
    sdp_run *s = state;
    const uint64_t done = step - 1, R = r->cfg->sdp.resample;
    if (i == 0 && w->id == 0) {   /* the report covers an epoch */
        s->align_sum = 0.0;
        s->align_count = 0;
    }
    if (R && done > 0 && done % R == 0)
        ST_TRY(new_round(r, s, w, done / R));
    /* a step the alignment report measures reads the masters before the
     * update (measure_alignment): it reduces after the backward */
    const uint64_t A = r->cfg->sdp.align_every;
    const int measured = A && step % A == 0;
    run_sharded e = { .grads = r->comm, .masters = masters(r, s),
                      .at_barrier = A ? measure_alignment : NULL, .ctx = s,
                      .overlap = !measured, .att = &s->att[w->id],
                      .own_copies = s->master_copies != NULL,
                      .copies = s->master_copies ? s->master_copies[w->id] : NULL,
                      .n_copies = s->master_copies ? s->n_master_copies[w->id] : 0 };
    return st_run_sharded_step(r, &e, w, i, step, loss, lr);
}

/* Forward masking: worker 0's full model from the master shards; backward
 * masking: every worker holds the full model, the replicas. */
static st_status sdp_evaluate(run_shared *r, void *state, st_worker *w, double *loss, double *acc)
{
    sdp_run *s = state;
    if (s->sn.backward)
        return st_run_evaluate_replicas(r, w, loss, acc);
    return st_subnets_evaluate_full(&s->sn, r, masters(r, s), 0, w, loss, acc);
}

/* With two engines: the gradients' reduce-scatter and the parameters'
 * all-gather. */
static st_comm_bytes sdp_bytes(const run_shared *r, const void *state, int wid)
{
    const sdp_run *s = state;
    st_comm_bytes b = st_run_engine_bytes(r, wid);
    if (!s->params_comm)
        return b;
    st_comm_bytes g = st_comm_bytes_per_step(s->params_comm, wid);
    b.read = b.read - b.gather_read + g.gather_read;
    b.written = b.written - b.gather_written + g.gather_written;
    b.gather_read = g.gather_read;
    b.gather_written = g.gather_written;
    return b;
}

static void sdp_record(const run_shared *r, void *state, st_epoch_record *rec)
{
    sdp_run *s = state;
    rec->coverage_holders = s->sn.k;
    rec->coverage = r->cfg->sdp.coverage;
    double sum = s->align_sum, least = s->align_min;
    int count = s->align_count;
    if (r->ranks > 1 && s->align_all) {
        /* every rank's measurements, combined in rank order (as one
         * process adds its workers' in worker order); a failure here
         * leaves this rank's own, and shows at the next collective */
        double mine[3] = { sum, least, (double)count };
        if (st_world_allgather(mine, sizeof mine, s->align_all) == ST_OK) {
            sum = 0.0;
            count = 0;
            for (int k = 0; k < r->ranks; k++) {
                const double *a = s->align_all + 3 * k;
                if (a[2] > 0 && (count == 0 || a[1] < least))
                    least = a[1];
                sum += a[0];
                count += (int)a[2];
            }
        }
    }
    rec->align_measured = count;
    rec->align_mean = count ? sum / count : 0.0;
    rec->align_min = count ? least : 0.0;
}

/* Forward masking: the full model loaded from the masters (what the last
 * evaluation loaded); backward masking: worker 0's replica (a bf16
 * master's widened, st_run_master_full). */
static st_status sdp_full_params(run_shared *r, void *state, st_worker *w0, const float **out,
                                 size_t *count)
{
    sdp_run *s = state;
    if (s->sn.backward) {   /* a bf16 master in the copies widened */
        *count = st_model_param_count(w0->model);
        return st_run_master_full(r, w0, out);
    }
    ST_TRY(st_subnets_load_full(&s->sn, r, masters(r, s), 0));
    *count = st_model_param_count(s->sn.eval_model);
    *out = st_model_params(s->sn.eval_model);
    return ST_OK;
}

static void sdp_abort(run_shared *r, void *state)
{
    (void)r;
    sdp_run *s = state;
    if (s->params_comm)
        st_comm_abort(s->params_comm);
}

static void sdp_release(run_shared *r, void *state)
{
    (void)r;
    sdp_run *s = state;
    if (!s)
        return;
    st_subnets_release(&s->sn);
    st_comm_destroy(s->params_comm);
    free(s->att);
    free(s->align_all);
    free(s->master_copies);
    free(s->n_master_copies);
    free(s);
}

static void sdp_defaults(st_train_config *c)
{
    c->sdp = (st_sdp_config){ .subnet = ST_SUBNET_BLOCK, .masking = ST_MASKING_FORWARD,
                              .coverage = 0.5, .resample = 0, .scale_branches = -1,
                              .align_every = 0 };
}

/* " (block, forward masking, coverage 1/2 = 0.5)": the coverage that
 * runs, k = max(1, round(C x N)) of N workers holding each unit, and the
 * C asked for when k / N is not it (C = 0.3 of 4 workers runs 1/4); just
 * C when N is not known. */
static void sdp_describe(const st_train_config *c, int workers, char *out, size_t n)
{
    const st_sdp_config *o = &c->sdp;
    int len = snprintf(out, n, " (%s, %s masking, ", st_subnet_kind_name(o->subnet),
                       st_masking_name(o->masking));
    if (workers < 1) {
        snprintf(out + len, n - (size_t)len, "coverage %g)", o->coverage);
        return;
    }
    const int k = st_subnet_holders_per_unit(workers, o->coverage);
    const double runs = (double)k / workers;
    char requested[48] = "";
    if (fabs(runs - o->coverage) > 1e-6)
        snprintf(requested, sizeof requested, ", requested %g", o->coverage);
    snprintf(out + len, n - (size_t)len, "coverage %d/%d = %g%s)", k, workers, runs, requested);
}

/* k = max(1, round(C x N)) holders per unit, so the coverage that runs is
 * k / N; said when that is not the C asked for (C = 0.3 with 4 workers
 * runs 1/4) rather than let the banner's C stand. */
static int sdp_warning(const run_shared *r, char *msg, size_t n)
{
    const double C = r->cfg->sdp.coverage;
    const int k = st_subnet_holders_per_unit(r->n_all, C);
    if (fabs((double)k / r->n_all - C) <= 1e-6)
        return 0;
    snprintf(msg, n, "--coverage %g with %d workers: each unit is held by k = max(1, round(C x "
             "N)) = %d worker%s, so the coverage is %d/%d = %g", C, r->n_all, k,
             k == 1 ? "" : "s", k, r->n_all, (double)k / r->n_all);
    return 1;
}

/* ------------------------------------------------------------ options */

static const char *const subnet_names[] = { "block", "neuron", NULL };
static const char *const masking_names[] = { "forward", "backward", NULL };
static const char *const branch_scale_names[] = { "none", "inverse-coverage", NULL };

static void set_subnet(st_train_config *c, const st_option_value *v)
{
    c->sdp.subnet = (st_subnet_kind)v->name;
}

static int get_subnet(const st_train_config *c, st_option_value *v)
{
    v->name = (int)c->sdp.subnet;
    return 1;
}

static void set_masking(st_train_config *c, const st_option_value *v)
{
    c->sdp.masking = (st_masking)v->name;
}

static int get_masking(const st_train_config *c, st_option_value *v)
{
    v->name = (int)c->sdp.masking;
    return 1;
}

static void set_coverage(st_train_config *c, const st_option_value *v)
{
    c->sdp.coverage = v->real;
}

static int get_coverage(const st_train_config *c, st_option_value *v)
{
    v->real = c->sdp.coverage;
    return 1;
}

static void set_resample(st_train_config *c, const st_option_value *v)
{
    c->sdp.resample = v->count;
}

static int get_resample(const st_train_config *c, st_option_value *v)
{
    v->count = c->sdp.resample;
    return 1;
}

static void set_branch_scale(st_train_config *c, const st_option_value *v)
{
    c->sdp.scale_branches = v->name;
}

/* the default depends on the model and the units */
static int get_branch_scale(const st_train_config *c, st_option_value *v)
{
    v->name = c->sdp.scale_branches;
    return c->sdp.scale_branches >= 0;
}

static const st_strategy_option sdp_options[] = {
    { .name = "subnet", .syntax = "block|neuron",
      .help = "sdp units: residual blocks of resmlp (default block), or\n"
              "groups of hidden neurons of every block's inner layer\n"
              "(resmlp) or of every hidden layer (mlp)",
      .kind = ST_OPTION_NAME, .names = subnet_names, .set = set_subnet, .get = get_subnet },
    { .name = "masking", .syntax = "forward|backward",
      .help = "sdp: run only the held units (forward, default),\n"
              "or the full model with weight gradients for the held\n"
              "units only (backward)",
      .kind = ST_OPTION_NAME, .names = masking_names, .set = set_masking, .get = get_masking },
    { .name = "coverage", .syntax = "C",
      .help = "sdp: each unit held by max(1, round(C x workers))\n"
              "workers, C in (0, 1] (default 0.5)",
      .kind = ST_OPTION_REAL, .lo_bracket = '(', .real_lo = 0.0, .real_hi = 1.0,
      .hi_bracket = ']', .set = set_coverage, .get = get_coverage },
    { .name = "resample", .syntax = "R",
      .help = "sdp: redraw the masks every R steps (default 0: fixed)",
      .kind = ST_OPTION_COUNT, .lo = 0, .hi = 1000000000, .set = set_resample,
      .get = get_resample },
    { .name = "branch-scale", .syntax = "none|inverse-coverage",
      .help = "sdp: scale each block's residual branch\n"
              "by 1/coverage in training (default inverse-coverage;\n"
              "none for the blocks of models with batch norm)",
      .kind = ST_OPTION_NAME, .names = branch_scale_names, .set = set_branch_scale,
      .get = get_branch_scale },
    { .name = NULL },
};

const st_strategy_ops st_sdp_ops = {
    .info = {
        .name = "sdp",
        .help = "sdp: each worker trains its subnetwork, each parameter\n"
                "averaged over the workers that hold it",
        .options = sdp_options,
    },
    .defaults = sdp_defaults,
    .check = sdp_check,
    .describe = sdp_describe,
    .warning = sdp_warning,
    .layout = sdp_layout,
    .weights = sdp_weights,
    .prepare = sdp_prepare,
    .init_worker = sdp_init_worker,
    .step = sdp_step,
    .size_draws = sdp_size_draws,
    .evaluate = sdp_evaluate,
    .bytes = sdp_bytes,
    .record = sdp_record,
    .resume = sdp_resume,
    .full_params = sdp_full_params,
    .abort = sdp_abort,
    .release = sdp_release,
};

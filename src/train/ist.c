/*
 * train/ist.c — independent subnetwork training, in its ResIST form for
 * resmlp: at the start of each round the residual blocks are split into N
 * disjoint sets (a balanced, seeded assignment with one holder per block;
 * stem, final norm and head shared by all); each worker trains the resmlp of
 * its blocks for R local steps on its own data with its own optimizer, no
 * communication; then the parameters are written back — a block by its
 * only holder (a copy), the shared layers averaged over all workers — and a
 * new partition is drawn.  See doc/ist.md.
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
#include "train/strategy.h"
#include "train/subnets.h"

/* What one worker keeps between its steps: its own line, written every
 * step. */
typedef struct ist_worker {
    _Alignas(64) uint64_t round_step; /* local steps since the round began */
    uint64_t rounds;                  /* rounds ended so far */
    size_t load_bytes;                /* what a round's rebuild reads from the
                                       * saved shards and writes into the new
                                       * subnetwork (its "all-gather") */
} ist_worker;

typedef struct ist_run {
    subnets sn;                  /* partition, saved masters, the full model */
    st_comm *state_comm[2];      /* --optimizer-state keep: one reduce-only
                                  * engine per state vector (Adam: m and v;
                                  * SGD: momentum) */
    int n_state;                 /* of them in use */
    ist_worker *workers;         /* n */
    uint64_t resumed_rounds, resumed_round_step; /* of the checkpoint resumed */
} ist_run;

static st_status ist_check(const st_train_config *c, int chosen)
{
    const st_ist_config *o = &c->ist;
    if (!chosen) {
        if (o->keep_state || o->train_scale >= 0)
            return st_fail(ST_ERR_INVALID, "--optimizer-state and --train-scale are options of "
                           "--strategy ist");
        return ST_OK;
    }
    if (o->local_steps < 1)
        return st_fail(ST_ERR_INVALID, "--local-steps must be >= 1");
    /* the reduction averages parameters and optimizer state once a round,
     * not gradients: bf16 there would round the masters themselves (a
     * block's only holder's weights cut to 8 bits of mantissa every round) */
    if (c->comm_precision == ST_PRECISION_BF16)
        return st_fail(ST_ERR_INVALID, "--comm-precision bf16 rounds gradients; --strategy ist "
                       "averages parameters in its rounds, which stay fp32 (use dp, sdp or "
                       "synth, or --comm-precision fp32)");
    /* a model with layer groups has its groups partitioned (ResIST), one
     * without has its neurons (IST of an mlp) */
    st_model_units units;
    /* a model that cannot be declared yet (a resnet before its data's
     * shape is known: the CLI checks before loading) is checked again by
     * st_train_run */
    if (st_model_config_units(&c->model, &units) != ST_OK)
        return ST_OK;
    /* sdp's --subnet neuron would ask for units ist does not train */
    if (units.groups > 0 && c->sdp.subnet == ST_SUBNET_NEURON)
        return st_fail(ST_ERR_INVALID, "ist partitions the blocks of a model that has them "
                       "(ResIST: --model %s) and the neurons of one that has none (mlp); "
                       "--subnet neuron with %s is an sdp option",
                       st_model_kind_name(c->model.kind), st_model_kind_name(c->model.kind));
    if (o->keep_state && c->optim.kind == ST_OPT_SGD && c->optim.momentum == 0.0f)
        return st_fail(ST_ERR_INVALID, "--optimizer-state keep: SGD without momentum keeps no "
                       "state");
    if (o->keep_state && c->optim.moments != ST_MOMENTS_FP32)
        return st_fail(ST_ERR_INVALID, "--optimizer-state keep averages the optimizer state "
                       "over the workers in fp32; --optimizer-moments %s keeps it in bf16 (use "
                       "--optimizer-state reset or --optimizer-moments fp32)",
                       st_moments_name(c->optim.moments));
    return ST_OK;
}

/* Units: the blocks of a model that has them (ResIST), else the neurons
 * (IST of an mlp). */
static int neuron_units(const st_train_config *c)
{
    return st_subnets_neuron_units(c, ST_SUBNET_BLOCK, 1);
}

/* Every worker needs a unit of its own: one holder of each. */
static st_status ist_layout(const st_train_config *c, int workers)
{
    return st_subnets_check_layout(c, "ist", workers, 1, neuron_units(c), 0.0);
}

/* The plan, the partition of round 0 (one holder per unit), the run's
 * engine (a once-a-round parameter average: reduce-only) and, keeping the
 * optimizer state, one engine per state vector. */
static st_status ist_prepare(run_shared *r, void **state)
{
    const st_train_config *cfg = r->cfg;
    ist_run *s = calloc(1, sizeof *s);
    if (!s)
        return st_fail(ST_ERR_NOMEM, "out of memory for the subnetworks' state");
    *state = s;
    ST_TRY(st_run_make_plan(cfg, r->n_all, r->train, &r->plan));
    ST_TRY(st_subnets_prepare(&s->sn, r, 1, neuron_units(cfg), 0));
    if (r->resume && st_safetensors_meta(r->resume->file, "subtrain.ist.rounds")) {
        ST_TRY(st_run_resume_meta_steps(r, "subtrain.ist.rounds", &s->resumed_rounds));
        ST_TRY(st_run_resume_meta_steps(r, "subtrain.ist.round_step", &s->resumed_round_step));
    }
    if (s->resumed_rounds)   /* the partition of the round resumed */
        ST_TRY(st_subnets_draw(&s->sn, r, s->resumed_rounds));
    s->workers = aligned_alloc(64, sizeof(ist_worker) * (size_t)r->n);
    if (!s->workers)
        return st_fail(ST_ERR_NOMEM, "out of memory for %d workers' rounds", r->n);
    memset(s->workers, 0, sizeof(ist_worker) * (size_t)r->n);
    st_range unheld[ST_MAX_UNHELD_RANGES];
    int n_unheld = st_subnets_unheld_ranges(&s->sn, r, unheld, ST_MAX_UNHELD_RANGES);
    ST_TRY(st_run_create_engine(r, ST_COMM_REDUCE, s->sn.unheld_possible, unheld, n_unheld,
                                &r->comm));
    if (cfg->ist.keep_state)
        s->n_state = cfg->optim.kind == ST_OPT_ADAMW ? 2 : cfg->optim.momentum > 0.0f;
    for (int i = 0; i < s->n_state; i++)
        ST_TRY(st_run_create_engine(r, ST_COMM_REDUCE, s->sn.unheld_possible, unheld, n_unheld,
                                    &s->state_comm[i]));
    return st_subnets_prepare_gather(&s->sn, r, 1 + s->n_state);
}

/* State vector i of w's optimizer (compact, the parameters' layout). */
static float *state_vector(st_worker *w, int i)
{
    return i == 0 ? w->optim.m : w->optim.v;
}

/* The engines read the parameters (and kept state vectors) as if they
 * were gradients: their mean over holders is the round's result. */
static st_status attach_params(run_shared *r, ist_run *s, int wid, st_worker *w)
{
    st_range *ranges;
    size_t *local;
    int n;
    ST_TRY(st_run_model_ranges(w, 0, &ranges, &local, &n));
    float *p = st_model_params(w->model);
    ST_TRY(st_comm_attach_compact(r->comm, wid, &w->arena, p, p, ranges, local, n));
    for (int i = 0; i < s->n_state; i++) {
        float *v = state_vector(w, i);
        ST_TRY(st_comm_attach_compact(s->state_comm[i], wid, &w->arena, v, v, ranges, local, n));
    }
    return ST_OK;
}

/* The subnetwork of the current partition, its fresh optimizer, attached. */
static st_status build_round(run_shared *r, ist_run *s, int wid, st_worker *w, int rebuild)
{
    st_train_config mine;
    int *buf;
    /* default: scale what reads a 1/N part of the neurons, not blocks */
    int scale = r->cfg->ist.train_scale < 0 ? s->sn.neuron_units : r->cfg->ist.train_scale;
    ST_TRY(st_subnets_config(&s->sn, r, st_run_global(r, wid), scale, &mine, &buf));
    st_status st = rebuild ? st_worker_rebuild_model(w, &mine) : st_worker_build_model(w, &mine);
    free(buf);
    ST_TRY(st);
    const int moves = rebuild && !r->sizing;   /* a sizing run moves no values */
    if (moves) {
        ST_TRY(st_subnets_load_saved(&s->sn, r, w, st_model_params(w->model), 0));
        st_run_load_state(r, w->model);
    }
    /* the record reads the last update's counts, which a new state clears */
    const size_t updated = w->optim.updated, update_bytes = w->optim.update_bytes;
    ST_TRY(st_worker_init_optimizer(w, r->cfg, 0, st_model_param_count(w->model)));
    if (rebuild) {
        w->optim.updated = updated;
        w->optim.update_bytes = update_bytes;
    }
    if (moves)   /* kept state: what the holders of each parameter left */
        for (int i = 0; i < s->n_state; i++)
            ST_TRY(st_subnets_load_saved(&s->sn, r, w, state_vector(w, i), 1 + i));
    /* read from the owners' shards, written into the compact vectors */
    s->workers[wid].load_bytes = 2 * (size_t)(1 + s->n_state) *
                                 st_model_param_count(w->model) * sizeof(float);
    if (s->n_state == 0)
        s->workers[wid].round_step = 0;
    return attach_params(r, s, wid, w);
}

/* The saved shards (outside the model's part of the arena), then the first
 * round's subnetwork; worker 0 also builds the full model for evaluation
 * (ResIST: each block's branch scaled by 1/N, each trained by 1 of N). */
static st_status ist_init_worker(run_shared *r, void *state, int wid, st_worker *w,
                                 const st_chunk_backend *backend)
{
    ist_run *s = state;
    subnet_saved *saved = &s->sn.saved[wid];
    ST_TRY(st_worker_init_base(w, wid, r->train->count, backend));
    st_range shard = st_comm_shard(r->comm, wid);
    ST_TRY(st_arena_alloc_floats(&w->arena, ST_MEM_WEIGHTS, shard.end - shard.begin,
                                 &saved->master));
    /* what no subnetwork of the first round holds (mlp: off-diagonal
     * blocks) starts, and stays until someone holds it, at its initial
     * value; the layout is all a sizing run reads */
    if (!r->sizing)
        ST_TRY(st_run_initial_range(r->cfg, shard.begin, shard.end, saved->master));
    st_comm_set_shard_output(r->comm, wid, saved->master);
    for (int i = 0; i < s->n_state; i++) {
        ST_TRY(st_arena_alloc_floats(&w->arena, ST_MEM_OPTIMIZER, shard.end - shard.begin,
                                     &saved->state[i]));
        st_comm_set_shard_output(s->state_comm[i], wid, saved->state[i]);
    }
    ST_TRY(build_round(r, s, wid, w, 0));
    if (wid == 0) {
        st_model_config full = r->cfg->model;
        if (r->cfg->ist.eval_scale)
            full.subnet.scale = 1.0f / (float)r->n_all;
        ST_TRY(st_subnets_build_eval(&s->sn, r->cfg, &full, backend));
    }
    return ST_OK;
}

/* One local step: compute, then the worker's own optimizer on its
 * subnetwork; no communication. */
static st_status ist_step(run_shared *r, void *state, st_worker *w, uint64_t i, uint64_t step,
                          float *loss, float *lr)
{
    ist_run *s = state;
    worker_slot *slot = &r->slots[w->id];
    ist_worker *me = &s->workers[w->id];
    double t = st_run_now_s();
    uint32_t first = (uint32_t)((i * (uint64_t)r->n_all + (uint64_t)st_run_global(r, w->id)) *
                                st_run_step_rows(r->cfg));
    ST_TRY(st_worker_compute(w, r->train, w->order, first, loss));
    double t1 = st_run_now_s();
    slot->times.compute += t1 - t;
    *lr = st_schedule_lr(&r->plan.schedule, step);
    me->round_step++; /* Adam's bias correction restarts with a reset state */
    /* the subnetwork is the worker's own: its update writes the bf16 and
     * blocked copies the next forward reads (a round end rebuilds the
     * model, whose new copies its first forward makes) */
    st_worker_update_own(w, me->round_step, *lr);
    slot->times.optimizer += st_run_now_s() - t1;
    return ST_OK;
}

/* The end of a round (every R steps and at the end of an epoch):
 * parameters averaged over their holders (disjoint blocks: copied; shared
 * layers: averaged), a new partition, new subnetworks.  A sizing run
 * draws and rebuilds alike, averaging nothing. */
static st_status ist_round_end(run_shared *r, void *state, st_worker *w, uint64_t step, int last)
{
    ist_run *s = state;
    if (step % r->cfg->ist.local_steps != 0 && !last)
        return ST_OK;
    const int wid = w->id;
    const uint64_t round = ++s->workers[wid].rounds;
    worker_slot *slot = &r->slots[wid];
    double t = st_run_now_s();
    /* into the saved masters (and states) directly: what someone held is
     * replaced by its mean over the holders, the rest keeps its value */
    if (!r->sizing) {
        ST_TRY(st_comm_reduce_scatter(r->comm, wid)); /* waits for every worker */
        for (int i = 0; i < s->n_state; i++)   /* the kept state: the same average */
            ST_TRY(st_comm_reduce_scatter(s->state_comm[i], wid));
        ST_TRY(st_run_sync_state(r, w));       /* and the running statistics */
    }
    ST_TRY(st_comm_barrier(r->comm, wid)); /* every saved master written, engine idle */
    if (wid == 0) {
        ST_TRY(st_subnets_gather_saved(&s->sn, r, r->comm));   /* over ranks */
        st_comm_reset(r->comm);
        for (int i = 0; i < s->n_state; i++)
            st_comm_reset(s->state_comm[i]);
        ST_TRY(st_subnets_draw(&s->sn, r, round));
    }
    ST_TRY(st_comm_barrier(r->comm, wid)); /* the new partition is there */
    if (s->sn.repeat)   /* a sizing run laid it out before */
        return ST_OK;
    st_status st = build_round(r, s, wid, w, 1);
    slot->times.reduce += st_run_now_s() - t;
    return st;
}

/* A sizing run: the round ends of the run's steps (the loop's `last`: an
 * epoch's last step, or the run's), each drawing and building the next
 * round. */
static st_status ist_size_draws(run_shared *r, void *state, st_worker *w)
{
    const run_plan *p = &r->plan;
    for (uint64_t step = 1; step <= p->total_steps; step++) {
        const uint64_t i = (step - 1) % p->steps_per_epoch;
        ST_TRY(ist_round_end(r, state, w, step,
                             i + 1 == p->steps_per_epoch || step == p->total_steps));
    }
    return ST_OK;
}

/* A checkpoint holds ist's state at a round end only: mid-round, every
 * worker's subnetwork has drifted on its own and the saved masters are
 * the previous round's. */
static int ist_whole_after(const run_shared *r, uint64_t step, int last)
{
    return last || step % r->cfg->ist.local_steps == 0;
}

/* At a round end the saved masters are the parameters (the loop saves the
 * full model from them); kept optimizer state is in the saved state
 * shards, each worker's; the round counters (every worker's are equal). */
static st_status ist_save(run_shared *r, void *state, run_ckpt *ck)
{
    ist_run *s = state;
    char name[ST_SAFETENSORS_MAX_NAME];
    for (int i = 0; i < s->n_state; i++)
        for (int k = 0; k < r->n; k++) {
            st_range shard = st_comm_shard(r->comm, k);
            snprintf(name, sizeof name, "train.ist.state%d.worker%d", i, st_run_global(r, k));
            ST_TRY(st_run_ckpt_tensor(ck, name, s->sn.saved[k].state[i], shard.end - shard.begin));
        }
    ST_TRY(st_run_ckpt_meta(ck, "subtrain.ist.rounds", "%llu",
                            (unsigned long long)s->workers[0].rounds));
    return st_run_ckpt_meta(ck, "subtrain.ist.round_step", "%llu",
                            (unsigned long long)s->workers[0].round_step);
}

/* Resuming at a round end: the subnetwork of the round's partition
 * (prepare drew it) with its parameters and optimizer vectors, the saved
 * masters and state shards, the counters. */
static st_status ist_resume(run_shared *r, void *state, st_worker *w)
{
    ist_run *s = state;
    const int wid = w->id;
    ST_TRY(st_run_resume_model(r, w));
    st_range shard = st_comm_shard(r->comm, wid);
    st_run_resume_shard(r, r->comm, wid, s->sn.saved[wid].master);
    char name[ST_SAFETENSORS_MAX_NAME];
    for (int i = 0; i < s->n_state; i++) {
        snprintf(name, sizeof name, "train.ist.state%d.worker%d", i, st_run_global(r, wid));
        ST_TRY(st_run_resume_load(r, name, s->sn.saved[wid].state[i], shard.end - shard.begin));
    }
    s->workers[wid].rounds = s->resumed_rounds;
    s->workers[wid].round_step = s->resumed_round_step;
    return ST_OK;
}

/* The full model from the saved masters (a round ends at every epoch end). */
static st_status ist_evaluate(run_shared *r, void *state, st_worker *w, double *loss, double *acc)
{
    ist_run *s = state;
    return st_subnets_evaluate_full(&s->sn, r, r->comm, 1, w, loss, acc);
}

/* Per round: the parameters' (and kept states') reduce-scatter, and the
 * next round's subnetwork loaded from the saved shards: ist's counterpart
 * of the all-gather (cross-domain reads not split out). */
static st_comm_bytes ist_bytes(const run_shared *r, const void *state, int wid)
{
    const ist_run *s = state;
    st_comm_bytes b = st_run_engine_bytes(r, wid);
    for (int i = 0; i < s->n_state; i++) {
        st_comm_bytes g = st_comm_bytes_per_step(s->state_comm[i], wid);
        b.read += g.read;
        b.written += g.written;
        b.cross_domain_read += g.cross_domain_read;
    }
    size_t half = s->workers[wid].load_bytes / 2;
    b.read += half;
    b.written += half;
    b.gather_read += half;
    b.gather_written += half;
    return b;
}

/* The bytes are a round's, once every R steps. */
static void ist_record(const run_shared *r, void *state, st_epoch_record *rec)
{
    (void)state;
    const double R = (double)r->cfg->ist.local_steps;
    rec->comm_bytes_per_worker_step /= R;
    rec->comm_bytes_per_worker_round = rec->comm_bytes_per_worker_step * R;
}

static st_status ist_full_params(run_shared *r, void *state, st_worker *w0, const float **out,
                                 size_t *count)
{
    (void)w0;
    ist_run *s = state;
    ST_TRY(st_subnets_load_full(&s->sn, r, r->comm, 1));
    *count = st_model_param_count(s->sn.eval_model);
    *out = st_model_params(s->sn.eval_model);
    return ST_OK;
}

static void ist_abort(run_shared *r, void *state)
{
    (void)r;
    ist_run *s = state;
    for (int i = 0; i < s->n_state; i++)
        st_comm_abort(s->state_comm[i]);
}

static void ist_release(run_shared *r, void *state)
{
    (void)r;
    ist_run *s = state;
    if (!s)
        return;
    st_subnets_release(&s->sn);
    for (int i = 0; i < 2; i++)
        st_comm_destroy(s->state_comm[i]);
    free(s->workers);
    free(s);
}

static void ist_defaults(st_train_config *c)
{
    c->ist = (st_ist_config){ .local_steps = 50, .eval_scale = 1, .train_scale = -1,
                              .keep_state = 0 };
}

static void ist_describe(const st_train_config *c, int workers, char *out, size_t n)
{
    (void)workers;
    snprintf(out, n, " (%llu local steps)", (unsigned long long)c->ist.local_steps);
}

/* ResIST evaluates the full model with each block's branch scaled by 1/N,
 * each block having been trained by 1 of N workers. */
static float ist_eval_scale(const st_train_config *c, int workers)
{
    return c->ist.eval_scale && workers > 0 ? 1.0f / (float)workers : 0.0f;
}

/* ------------------------------------------------------------ options */

static const char *const scale_names[] = { "none", "inverse-workers", NULL };
static const char *const state_names[] = { "reset", "keep", NULL };

static void set_local_steps(st_train_config *c, const st_option_value *v)
{
    c->ist.local_steps = v->count;
}

static int get_local_steps(const st_train_config *c, st_option_value *v)
{
    v->count = c->ist.local_steps;
    return 1;
}

static void set_eval_scale(st_train_config *c, const st_option_value *v)
{
    c->ist.eval_scale = v->name;
}

static int get_eval_scale(const st_train_config *c, st_option_value *v)
{
    v->name = c->ist.eval_scale != 0;
    return 1;
}

static void set_train_scale(st_train_config *c, const st_option_value *v)
{
    c->ist.train_scale = v->name;
}

/* the default depends on the model */
static int get_train_scale(const st_train_config *c, st_option_value *v)
{
    v->name = c->ist.train_scale;
    return c->ist.train_scale >= 0;
}

static void set_state(st_train_config *c, const st_option_value *v)
{
    c->ist.keep_state = v->name;
}

static int get_state(const st_train_config *c, st_option_value *v)
{
    v->name = c->ist.keep_state != 0;
    return 1;
}

static const st_strategy_option ist_options[] = {
    { .name = "local-steps", .syntax = "R",
      .help = "ist: steps between synchronisations (default 50)",
      .kind = ST_OPTION_COUNT, .lo = 1, .hi = 1000000000, .set = set_local_steps,
      .get = get_local_steps },
    { .name = "eval-branch-scale", .syntax = "none|inverse-workers",
      .help = "ist of resmlp: scale each block's\n"
              "branch by 1/N at evaluation (default inverse-workers, as\n"
              "ResIST)",
      .kind = ST_OPTION_NAME, .names = scale_names, .set = set_eval_scale,
      .get = get_eval_scale },
    { .name = "train-scale", .syntax = "none|inverse-workers",
      .help = "ist: in training, scale what reads a 1/N\n"
              "part by N (default: inverse-workers for mlp, none for\n"
              "resmlp)",
      .kind = ST_OPTION_NAME, .names = scale_names, .set = set_train_scale,
      .get = get_train_scale },
    { .name = "optimizer-state", .syntax = "reset|keep",
      .help = "ist: reset the optimizer state every round\n"
              "(default, as ResIST) or keep it, averaged over holders",
      .kind = ST_OPTION_NAME, .names = state_names, .set = set_state, .get = get_state },
    { .name = NULL },
};

const st_strategy_ops st_ist_ops = {
    .info = {
        .name = "ist",
        .help = "ist: disjoint neuron (mlp) or block (resmlp: ResIST)\n"
                "subnetworks trained alone for --local-steps steps,\n"
                "then written back",
        .options = ist_options,
    },
    .defaults = ist_defaults,
    .check = ist_check,
    .describe = ist_describe,
    .eval_scale = ist_eval_scale,
    .layout = ist_layout,
    .prepare = ist_prepare,
    .init_worker = ist_init_worker,
    .step = ist_step,
    .round_end = ist_round_end,
    .size_draws = ist_size_draws,
    .evaluate = ist_evaluate,
    .bytes = ist_bytes,
    .record = ist_record,
    .whole_after = ist_whole_after,
    .save = ist_save,
    .resume = ist_resume,
    .full_params = ist_full_params,
    .abort = ist_abort,
    .release = ist_release,
};

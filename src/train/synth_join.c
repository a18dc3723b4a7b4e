/*
 * train/synth_join.c — the ends of synth's segment epochs (doc/synth.md):
 * the groups meet there only, at a blocking barrier of all workers; each
 * group's first worker copies its segment's parameters into its range of
 * worker 0's joined network (the join: one parameter copy a segment and
 * epoch, not part of training), and worker 0 evaluates the joined network
 * on the test set while the others wait.  Over ranks, each rank's worker
 * 0 takes every segment from the rank of its group's first worker and the
 * losses of the groups that span ranks (join_over_ranks).  Also the
 * records of both phases: the segment epochs' (step times per group, the
 * segments' losses) and the recovery epochs' label.
 */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include <subtrain/world.h>

#include "core/error.h"
#include "train/synth_run.h"

/* ------------------------------------------------------------ the epoch-end barrier */

void st_synth_barrier_init(epoch_barrier *b, int n)
{
    pthread_mutex_init(&b->lock, NULL);
    pthread_cond_init(&b->turn, NULL);
    b->n = n;
    b->arrived = 0;
    b->aborted = 0;
    b->generation = 0;
}

void st_synth_barrier_destroy(epoch_barrier *b)
{
    pthread_cond_destroy(&b->turn);
    pthread_mutex_destroy(&b->lock);
}

void st_synth_barrier_abort(epoch_barrier *b)
{
    pthread_mutex_lock(&b->lock);
    b->aborted = 1;
    pthread_cond_broadcast(&b->turn);
    pthread_mutex_unlock(&b->lock);
}

/* Everything a worker wrote before arriving is visible to every worker
 * after it leaves (the mutex orders them). */
st_status st_synth_sync(run_shared *r, void *state, st_worker *w)
{
    (void)r;
    (void)w;
    synth_run *sy = state;
    epoch_barrier *b = &sy->barrier;
    pthread_mutex_lock(&b->lock);
    unsigned gen = b->generation;
    if (!b->aborted && ++b->arrived == b->n) {
        b->arrived = 0;
        b->generation++;
        pthread_cond_broadcast(&b->turn);
    }
    while (!b->aborted && b->generation == gen)
        pthread_cond_wait(&b->turn, &b->lock);
    int aborted = b->aborted && b->generation == gen;
    pthread_mutex_unlock(&b->lock);
    return aborted ? st_fail(ST_ERR_INVALID, "another worker failed") : ST_OK;
}


/* ------------------------------------------------------------ the join */

/* Worker 0 of every rank, after the barrier of an epoch end: the
 * groups' parameters and losses from the ranks that have them (one
 * broadcast a segment from the rank of its group's first worker; the
 * spanning groups' step losses summed over ranks, where each member's row
 * is nonzero on one rank only, so the sum is exact whatever its order),
 * and the spanning groups' mean step losses, in one process's order. */
static st_status join_over_ranks(run_shared *r, synth_run *sy)
{
    double sums[ST_SYNTH_MAX_SEGMENTS];
    for (int g = 0; g < sy->segments; g++) {
        synth_group *G = &sy->groups[g];
        ST_TRY(st_world_bcast(st_model_params(sy->joined) + G->full_offset,
                              G->n_params * sizeof(float), G->rank_first));
        sums[g] = r->rank == G->rank_first ? G->loss_sum : 0.0;
        if (!G->losses)
            continue;
        const uint64_t steps = G->steps_per_epoch;
        ST_TRY(st_world_sum_doubles(G->losses, (size_t)G->count * steps));
        double total = 0.0;
        for (uint64_t i = 0; i < steps; i++) {
            double sum = 0.0;
            for (int v = 0; v < G->count; v++)
                sum += G->losses[(size_t)v * steps + i];
            total += (float)(sum / G->count);
        }
        memset(G->losses, 0, sizeof *G->losses * (size_t)G->count * steps);
        sums[g] = r->rank == G->rank_first ? total : 0.0;
    }
    ST_TRY(st_world_sum_doubles(sums, (size_t)sy->segments));
    for (int g = 0; g < sy->segments; g++)
        sy->groups[g].loss_sum = sums[g];
    return ST_OK;
}
/* ------------------------------------------------------------ records */

static void describe_segments(const synth_run *sy, st_epoch_record *rec)
{
    rec->n_segments = sy->segments;
    for (int g = 0; g < sy->segments; g++) {
        rec->segment_workers[g] = sy->groups[g].count;
        if (g + 1 < sy->segments)
            rec->cuts[g] = sy->cuts[g];
    }
}

/* How far the segment epochs are, in [0, 1]: the slowest group's share of
 * its steps (the groups meet at every epoch end, so the phase ends when
 * the slowest group does).  Over ranks, of the groups this rank sees. */
static double segment_progress(const synth_run *sy, int epochs)
{
    double least = 1.0;
    for (int g = 0; g < sy->segments; g++) {
        const synth_group *G = &sy->groups[g];
        if (G->local_count == 0)
            continue;
        uint64_t done = atomic_load_explicit(&G->done, memory_order_relaxed);
        least = fmin(least, (double)done / ((double)epochs * (double)G->steps_per_epoch));
    }
    return least;
}


/* The join and its evaluation (the loop's barrier of the epoch's end has
 * passed: every group's steps are done, and after its all-gather every
 * replica of a segment holds the same values). */
st_status st_synth_join_evaluate(run_shared *r, void *state, st_worker *w, double *loss,
                                 double *acc)
{
    synth_run *sy = state;
    const synth_group *G = &sy->groups[sy->group_of[w->id]];
    if (st_run_global(r, w->id) == G->first)
        memcpy(st_model_params(sy->joined) + G->full_offset,
               st_segnet_params(sy->workers[w->id].net), G->n_params * sizeof(float));
    ST_TRY(st_synth_sync(r, sy, w));
    if (w->id != 0)
        return ST_OK;
    if (r->ranks > 1)
        ST_TRY(join_over_ranks(r, sy));
    return st_run_evaluate_model(sy->joined, r->test, loss, acc);
}

st_comm_bytes st_synth_segment_bytes(const run_shared *r, const void *state, int wid)
{
    (void)r;
    const synth_run *sy = state;
    const synth_group *G = &sy->groups[sy->group_of[wid]];
    st_comm_bytes none = { 0, 0, 0, 0, 0 };
    return G->comm ? st_comm_bytes_per_step(G->comm, wid - G->first) : none;
}

int st_synth_segment_work(const run_shared *r, const void *state, int wid, double *flops,
                          st_step_cost *out, int cap)
{
    (void)r;
    const synth_run *sy = state;
    const st_segnet *net = sy->workers[wid].net;
    *flops = net ? st_segnet_step_flops(net) : 0.0;
    return net ? st_segnet_step_costs(net, out, cap) : 0;
}

/* Worker 0 after each of its steps.  Throughput and the time left by the
 * slowest group's progress f: samples through the whole network so far
 * are f x the segment epochs' samples, and the segment epochs end after
 * train_time x (1 - f) / f more.  The recovery epochs, not yet measured,
 * are estimated at the mean segment epoch's time each: every segment sees
 * every sample, so an epoch of the segments does about the FLOPs of a
 * data-parallel epoch (a little less).  Once they start, the loop reports
 * on its own measurements. */
void st_synth_segment_estimate(const run_shared *r, void *state, double train_time,
                               st_step_info *info)
{
    const st_train_config *cfg = r->cfg;
    const synth_run *sy = state;
    double f = segment_progress(sy, cfg->epochs);
    double phase = f > 0.0 ? train_time / f : 0.0;   /* the segment epochs' estimated time */
    info->samples_per_s = f * cfg->epochs * sy->samples_per_epoch / train_time;
    info->eta_s = phase * (1.0 - f) + phase / cfg->epochs * cfg->synth.recovery_epochs;
}

/* Worker 0, after the loop's common fields (st_run_fill_record): the
 * segments and their mean losses.  No training loss of the joined network
 * exists in the segment epochs: train_loss is the last segment's
 * cross-entropy on synthetic inputs (documented in train.h; the CLI labels
 * it so). */
void st_synth_segment_record(const run_shared *r, void *state, st_epoch_record *rec)
{
    (void)r;
    synth_run *sy = state;
    describe_segments(sy, rec);
    for (int g = 0; g < sy->segments; g++)
        rec->segment_loss[g] = sy->groups[g].loss_sum / (double)sy->groups[g].steps_per_epoch;
    rec->train_loss = rec->segment_loss[sy->segments - 1];
    sy->epochs_done = rec->epoch;
    sy->phase1_worst = rec->memory;
}

void st_synth_recovery_label(const run_shared *r, void *state, st_epoch_record *rec)
{
    (void)r;
    const synth_run *sy = state;
    rec->recovery = 1;
    describe_segments(sy, rec);
    if (rec->final && sy->phase1_worst.peak_total > rec->memory.peak_total)
        rec->memory = sy->phase1_worst;
}

/*
 * train/loop.c — the loop: the phases of a run (strategy.h, st_phase),
 * each epochs of shuffled global batches, one step of the phase per
 * global batch, evaluation on the test set and a record after each epoch.
 * What the user asks for (a stop, a checkpoint), periodic checkpoints,
 * step reports and the final record are handled here, the same for every
 * phase.  st_train_run (train.c) runs it in one parallel region; the
 * trainer handle (trainer.c) takes its steps one call at a time.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#include <subtrain/comm.h>
#include <subtrain/world.h>

#include "core/error.h"
#include "train/loop.h"

void st_loop_default_phase(const run_shared *r, st_phase *ph)
{
    const st_strategy_ops *ops = r->ops;
    memset(ph, 0, sizeof *ph);
    ph->plan = r->plan;
    ph->epoch_steps = r->plan.steps_per_epoch;
    ph->from = r->resume ? r->resume->at : (run_position){ .epoch = 1 };
    ph->run_epochs = r->plan.epochs;
    ph->run_steps = r->plan.total_steps;
    ph->samples_per_step = (double)st_run_step_rows(r->cfg) * r->n_all;
    ph->last = 1;
    ph->step = ops->step;
    ph->evaluate = ops->evaluate;
    ph->bytes = ops->bytes;
    ph->record = ops->record;
}

void st_loop_epoch_order(run_shared *r, st_worker *w, uint64_t epoch)
{
    /* Every worker draws the same order from the seed: no sharing.  With a
     * split, batch i of worker g holds the next samples of g's own split. */
    w->epoch = epoch - 1;
    if (r->split)
        st_split_epoch_order(r->split, r->cfg->seed, w->epoch, (uint32_t)r->cfg->batch,
                             w->split_scratch, w->order);
    else
        st_epoch_order(r->cfg->seed, w->epoch, w->order, r->train->count);
}

st_status st_loop_step(run_shared *r, const st_phase *ph, st_worker *w, uint64_t i,
                       uint64_t step, float *loss, float *lr)
{
    const run_plan *p = &ph->plan;
    ST_TRY(ph->step(r, r->strategy, w, i, step, loss, lr));
    if (ph->apart || !r->ops->round_end)
        return ST_OK;
    int last = i + 1 == p->steps_per_epoch || step == p->total_steps;
    return r->ops->round_end(r, r->strategy, w, step, last);
}

/* The barrier of the phase's workers. */
static st_status meet(run_shared *r, const st_phase *ph, st_worker *w)
{
    return ph->sync ? ph->sync(r, r->strategy, w) : st_run_sync(r, w->id);
}

/* What the user asked for by the time of the run's step `step`, the same
 * answer for every worker: a stop (REQ_STOP), a checkpoint (REQ_SAVE).
 * Worker 0 reads the requests and, the first time it sees one, names the
 * step (stop_step, save_step); everyone reads them after a barrier.  A
 * worker still at an earlier step reads a later step there and goes on:
 * worker 0 cannot name step s + 1 before every worker has passed step s's
 * barrier, so no two workers act at different steps.  A request waits for
 * a step after which the state is whole (ist: a round end): the caller
 * checks.  An apart phase takes them at its epochs' ends, where its
 * workers meet. */
enum { REQ_STOP = 1, REQ_SAVE = 2 };

static unsigned requests(run_shared *r, const st_phase *ph, st_worker *w, uint64_t step)
{
    const st_train_callbacks *cb = r->cb;
    if (!cb || (!cb->stop && !cb->checkpoint_now))
        return 0;
    if (w->id == 0) {
        /* over ranks, what any rank was asked (a signal reaches the ranks
         * at different steps; srun --signal, a kill of one rank) */
        int asked[2] = { cb->stop && *cb->stop, cb->checkpoint_now && *cb->checkpoint_now };
        if (cb->checkpoint_now)
            *cb->checkpoint_now = 0;
        st_status s = r->ranks > 1 ? st_world_max_ints(asked, 2) : ST_OK;
        if (s != ST_OK) {
            st_loop_record_failure(r, s);   /* the barrier below returns */
            asked[0] = asked[1] = 0;
        }
        if (asked[0] && atomic_load(&r->stop_step) == 0)
            atomic_store(&r->stop_step, step);
        if (asked[1] && atomic_load(&r->save_step) == 0)
            atomic_store(&r->save_step, step);
    }
    if (meet(r, ph, w) != ST_OK)
        return 0;   /* aborted: the step reports the failure */
    const uint64_t stop = atomic_load(&r->stop_step), save = atomic_load(&r->save_step);
    return (stop && stop <= step ? REQ_STOP : 0u) | (save && save <= step ? REQ_SAVE : 0u);
}

/* A step checkpoint of position `at` after the run's step `step` (every
 * worker, between steps): the workers publish their models and
 * optimizers, worker 0 writes while the others wait, and takes the
 * pending request.  The waiting spins (the engine's barrier; an apart
 * phase's own): a write of a model's size takes some hundred
 * milliseconds, once in thousands of steps, and the workers own their
 * cores anyway. */
static st_status checkpoint(run_shared *r, const st_phase *ph, st_worker *w,
                            const run_position *at, uint64_t step)
{
    if (!r->cfg->checkpoint.dir)
        return ST_OK;
    r->slots[w->id].model = w->model;
    r->slots[w->id].optim = &w->optim;
    ST_TRY(meet(r, ph, w));   /* every worker between its steps, published */
    if (w->id == 0) {
        ST_TRY(st_run_checkpoint_write(r, w, at, step));
        atomic_store(&r->save_step, 0);
    }
    return meet(r, ph, w);    /* worker 0 is done reading everyone's vectors */
}

/* The first step of the phase at or after which a periodic checkpoint is
 * due, after one at `step` (counted as the checkpoints' names count: from
 * the run's start, the phases before included). */
static uint64_t next_due(const run_shared *r, const st_phase *ph, uint64_t step)
{
    const uint64_t every = r->cfg->checkpoint.dir ? r->cfg->checkpoint.every : 0,
                   off = ph->steps_before;
    return every ? ((off + step) / every + 1) * every - off : UINT64_MAX;
}

/* Worker 0 after each step: where the run is (st_run_note_step), and the
 * on_step callback. */
static void report_step(run_shared *r, const st_phase *ph, int epoch, uint64_t step, float loss,
                        float lr, double train_time)
{
    const int run_epoch = ph->epochs_before + epoch;
    const uint64_t run_step = ph->steps_before + step;
    st_run_note_step(r, run_epoch, ph->run_epochs, run_step, lr);
    const st_train_callbacks *cb = r->cb;
    if (!cb || !cb->on_step)
        return;
    double now = st_run_now_s();
    st_step_info info = {
        run_step, ph->run_steps, run_epoch, ph->run_epochs, loss, lr,
        (double)step * ph->samples_per_step / train_time, now - r->t0,
        train_time / (double)step * (double)(ph->plan.total_steps - step),
    };
    if (ph->estimate)
        ph->estimate(r, r->strategy, train_time, &info);
    cb->on_step(&info, cb->user);
}

/* The phase's step count, as records, reports and checkpoint names count
 * it, after worker w's `step` (epoch `epochs` ended): an apart phase's
 * workers take different numbers of steps, and it counts worker 0's. */
static uint64_t counted(const st_phase *ph, int epochs, uint64_t step)
{
    return ph->apart ? (uint64_t)epochs * ph->epoch_steps : step;
}

/* The epochs of phase ph for worker w, from ph->from, with their records;
 * the final record if it is the run's last phase or a stop ends the run
 * in it (*stopped). */
static st_status run_phase(run_shared *r, st_worker *w, const st_phase *ph, int *stopped)
{
    const st_strategy_ops *ops = r->ops;
    const run_plan *p = &ph->plan;
    worker_slot *slot = &r->slots[w->id];
    const int every_epoch = r->cfg->checkpoint.dir && r->cfg->checkpoint.every_epoch;
    double train_time = ph->from.train_time;   /* worker 0's view: the phase's so far */
    uint64_t step = ph->from.step, done = counted(ph, ph->from.epoch - 1, step),
             due = next_due(r, ph, done);
    st_epoch_record rec;
    memset(&rec, 0, sizeof rec);

    *stopped = 0;
    for (int epoch = ph->from.epoch; epoch <= p->epochs && !*stopped; epoch++) {
        const int resumed = epoch == ph->from.epoch;
        st_loop_epoch_order(r, w, ph->order_offset + (uint64_t)epoch);
        memset(&slot->times, 0, sizeof slot->times);
        double loss_sum = resumed ? ph->from.loss_sum : 0.0, te = st_run_now_s();
        uint64_t n = 0, losses = resumed ? ph->from.losses : 0,
                 i = resumed ? ph->from.epoch_step : 0;
        float lr = 0.0f;
        unsigned req = 0;
        for (; i < p->steps_per_epoch && step < p->total_steps && !*stopped; i++, n++) {
            float loss = 0.0f;
            step++;
            const int last = i + 1 == p->steps_per_epoch || step == p->total_steps;
            int whole = 0;   /* an apart phase: only at its epochs' ends */
            if (!ph->apart) {
                whole = !ops->whole_after || ops->whole_after(r, step, last);
                req = requests(r, ph, w, ph->steps_before + step);
                *stopped = (req & REQ_STOP) && whole;
                if (step == r->fault_step && w->id == 0)
                    return st_fail(ST_ERR_INVALID, "the fault SUBTRAIN_FAULT asked for: rank %d "
                                   "fails at step %llu", r->rank, (unsigned long long)step);
            }
            ST_TRY(st_loop_step(r, ph, w, i, step, &loss, &lr));
            if (w->id == 0) {
                loss_sum += loss;
                report_step(r, ph, epoch, step, loss, lr, train_time + (st_run_now_s() - te));
            }
            losses++;
            /* in an epoch: before its end's evaluation, which averages the
             * running statistics (the end's checkpoint follows the record) */
            if (!last && whole && (*stopped || (req & REQ_SAVE) || step >= due)) {
                const run_position at = { epoch, i + 1, step, loss_sum, losses,
                                          train_time + (st_run_now_s() - te) };
                ST_TRY(checkpoint(r, ph, w, &at, ph->steps_before + step));
                due = next_due(r, ph, step);
                req = 0;
            }
        }
        const int complete = i == p->steps_per_epoch;
        const int run_end = ph->last && step == p->total_steps;
        const uint64_t before = done;
        done = counted(ph, epoch, step);
        /* an apart phase's workers meet here: its epoch's time includes the
         * wait for the slowest */
        if (ph->apart)
            ST_TRY(meet(r, ph, w));
        double epoch_time = st_run_now_s() - te;
        train_time += epoch_time;

        ST_TRY(st_run_sync_state(r, w));
        ST_TRY(ph->evaluate(r, r->strategy, w, &rec.test_loss, &rec.test_acc));
        st_run_publish_worker(r, w, n);
        if (r->comm)
            slot->bytes = ph->bytes(r, r->strategy, w->id);
        ST_TRY(meet(r, ph, w));
        if (w->id == 0) {
            rec.epoch = ph->epochs_before + epoch;
            rec.epochs = ph->run_epochs;
            rec.step = ph->steps_before + done;
            rec.train_loss = loss_sum / (double)losses;
            rec.samples_per_s = (double)(done - before) * ph->samples_per_step / epoch_time;
            rec.lr = lr;
            rec.wall_s = st_run_now_s() - r->t0;
            st_run_fill_record(r, &rec);
            if (ph->record)
                ph->record(r, r->strategy, &rec);
            if (ph->label)
                ph->label(r, r->strategy, &rec);
            /* an epoch a signal cut short has one record: the final,
             * interrupted one below, with these numbers */
            if (r->cb && r->cb->on_epoch && !(*stopped && !complete))
                r->cb->on_epoch(&rec, r->cb->user);
        }
        if (ph->apart) {
            /* a stop at the run's end ends nothing: the run is complete */
            req = requests(r, ph, w, ph->steps_before + done);
            *stopped = (req & REQ_STOP) && !run_end;
        }
        /* The slots are read by worker 0 until here. */
        ST_TRY(meet(r, ph, w));
        const int save = (req & REQ_SAVE) || done >= due;
        if (complete && !run_end && (every_epoch || *stopped || save)) {
            const run_position at = ph->apart
                                  ? (run_position){ 1, 0, 0, 0.0, 0, train_time }
                                  : (run_position){ epoch + 1, 0, step, 0.0, 0, train_time };
            ST_TRY(checkpoint(r, ph, w, &at, ph->steps_before + done));
            due = next_due(r, ph, done);
        }
    }
    if (w->id == 0 && (ph->last || *stopped)) {
        rec.final = 1;
        rec.interrupted = *stopped;
        rec.samples_per_s = (double)done * ph->samples_per_step / train_time;
        if (ph->label)
            ph->label(r, r->strategy, &rec);
        if (r->cb && r->cb->on_epoch)
            r->cb->on_epoch(&rec, r->cb->user);
        r->final = rec;
    }
    return ST_OK;
}

st_status st_loop_run_worker(run_shared *r, st_worker *w, const st_chunk_backend *backend)
{
    const st_strategy_ops *ops = r->ops;
    int stopped = 0;
    for (int k = 0; !stopped; k++) {
        st_phase ph;
        st_loop_default_phase(r, &ph);
        if (ops->phase_begin)
            ST_TRY(ops->phase_begin(r, r->strategy, k, w, backend, &ph));
        if (w->id == 0) {
            r->at_label = ph.label;
            if (k > 0)   /* a diverged run's record: not the previous phase's step */
                st_run_note_step(r, ph.epochs_before + 1, ph.run_epochs, ph.steps_before, 0.0f);
        }
        /* every worker has begun it (every arena has its chunks) */
        st_status s = st_run_sync(r, w->id);
        if (s == ST_OK && k == 0 && w->id == 0)
            st_loop_report_warnings(r);
        if (s == ST_OK)
            s = run_phase(r, w, &ph, &stopped);
        if (ops->phase_end) {   /* also after a failure, a worker's included: what the
                                 * phase built goes before its arena does */
            st_status e = ops->phase_end(r, r->strategy, k, w);
            s = s != ST_OK ? s : e;
        }
        ST_TRY(s);
        if (ph.last)
            break;
    }
    if (w->id == 0 && r->cb && r->cb->on_params) {
        size_t count;
        const float *params;
        ST_TRY(ops->full_params(r, r->strategy, w, &params, &count));
        r->cb->on_params(params, count, r->cb->user);
        st_run_master_full_done(r);
    }
    return ST_OK;
}

/* ------------------------------------------------------------ failures and warnings */

void st_loop_report_warnings(run_shared *r)
{
    const st_train_callbacks *cb = r->cb;
    if (!cb || !cb->on_warning)
        return;
    if (r->placement.warning[0])
        cb->on_warning(r->placement.warning, cb->user);
    char line[200];   /* the strategy's: its options as they run */
    if (r->ops->warning && r->ops->warning(r, line, sizeof line))
        cb->on_warning(line, cb->user);
    const char *isa;
    if (r->cfg->model.precision == ST_PRECISION_BF16 && st_bf16_probe(&isa) == ST_BF16_EMULATED) {
        char msg[160];
        snprintf(msg, sizeof msg, "bf16 runs emulated on ISA %s (no native bf16): about a "
                 "third of fp32 speed", isa);
        cb->on_warning(msg, cb->user);
    }
    const char *was = r->cfg->resume ? st_safetensors_meta(r->cfg->resume, "subtrain.onednn_isa")
                                     : NULL;
    if (was && strcmp(was, st_cpu_isa_name()) != 0) {
        char msg[320];
        snprintf(msg, sizeof msg, "the checkpoint resumed was written on oneDNN ISA %.64s, this "
                 "run has %s: its kernels sum in another order, so the rest is not bitwise the "
                 "run never stopped", was, st_cpu_isa_name());
        cb->on_warning(msg, cb->user);
    }
    for (int k = 0; k < r->n; k++)
        if (st_numa_warning(&r->slots[k].numa)) {
            cb->on_warning(st_numa_warning(&r->slots[k].numa), cb->user);
            break; /* the same refusal for every worker: once is enough */
        }
}

void st_loop_record_failure(run_shared *r, st_status s)
{
    if (atomic_exchange(&r->failed, 1) == 0) {
        r->error_status = s;
        snprintf(r->error, sizeof r->error, "%s", st_last_error());
    }
    if (r->comm)
        st_comm_abort(r->comm);
    if (r->ops->abort)
        r->ops->abort(r, r->strategy);
}

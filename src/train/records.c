/*
 * train/records.c — what the loop reports: an epoch record combined from
 * the workers' slots, and the per-step callback.  Strategy-specific parts
 * of a record (communication per round, the alignment report) are added
 * by the strategy's record hook; synth's segment epochs have records of
 * their own (synth.c).
 */
#include <string.h>

#include "train/run.h"

void st_run_fill_record(run_shared *r, st_epoch_record *rec, uint64_t steps_in_epoch)
{
    step_times sum = { 0, 0, 0, 0 };
    size_t worst = 0;
    double bytes = 0.0;
    for (int k = 0; k < r->n; k++) {
        const worker_slot *s = &r->slots[k];
        sum.compute += s->times.compute;
        sum.wait += s->times.wait;
        sum.reduce += s->times.reduce;
        sum.optimizer += s->times.optimizer;
        if (s->memory.peak_total > r->slots[worst].memory.peak_total)
            worst = (size_t)k;
        double b = (double)(s->bytes.read + s->bytes.written);
        if (b > bytes)
            bytes = b;
    }
    double per = 1e3 / ((double)r->n * (double)(steps_in_epoch ? steps_in_epoch : 1));
    rec->step_ms_compute = sum.compute * per;
    rec->step_ms_wait = sum.wait * per;
    rec->step_ms_reduce = sum.reduce * per;
    rec->step_ms_optimizer = sum.optimizer * per;
    rec->memory = r->slots[worst].memory;
    for (int k = 0; k < r->n; k++)
        r->memory[k] = r->slots[k].memory;
    rec->worker_memory = r->memory;
    rec->placement = &r->placement;
    rec->align_measured = 0;
    rec->align_mean = 0.0;
    rec->align_min = 0.0;
    rec->workers = r->n_all;
    rec->ranks = r->ranks;
    rec->workers_per_rank = r->n;
    rec->threads_per_worker = r->placement.threads_per_worker;
    rec->precision = r->cfg->model.precision;
    rec->comm_precision = r->cfg->comm_precision;
    rec->tokens_per_sample = r->cfg->model.context;
    rec->comm_bytes_per_worker_step = bytes;
    rec->comm_bytes_per_worker_round = 0.0;
    rec->ring_bytes_per_worker_step =
        r->n_all > 1 ? st_comm_ring_bytes(r->n_all, r->n_params) : 0.0;
}

void st_run_report_step(run_shared *r, int epoch, uint64_t step, float loss, float lr,
                        double train_time)
{
    st_run_note_step(r, epoch, r->plan.epochs, step, lr);
    const st_train_callbacks *cb = r->cb;
    if (!cb || !cb->on_step)
        return;
    double now = st_run_now_s();
    double samples = (double)step * r->cfg->batch * r->n_all;
    st_step_info info = {
        step, r->plan.total_steps, epoch, r->plan.epochs, loss, lr, samples / train_time,
        now - r->t0, train_time / (double)step * (double)(r->plan.total_steps - step),
    };
    cb->on_step(&info, cb->user);
}

/*
 * train/records.c — an epoch record's common fields, combined from the
 * workers' slots.  A phase's record hook (strategy.h) adds its own:
 * communication per round, the alignment report, synth's segments.
 */
#include <string.h>

#include "train/run.h"

void st_run_fill_record(run_shared *r, st_epoch_record *rec)
{
    step_times sum = { 0, 0, 0, 0, 0 };
    size_t worst = 0, optim = 0;
    double bytes = 0.0;
    for (int k = 0; k < r->n; k++) {
        const worker_slot *s = &r->slots[k];
        /* the workers of a phase may take different numbers of steps
         * (synth's groups): each worker's mean first */
        const double steps = (double)(s->steps ? s->steps : 1);
        sum.compute += s->times.compute / steps;
        sum.wait += s->times.wait / steps;
        sum.reduce += s->times.reduce / steps;
        sum.optimizer += s->times.optimizer / steps;
        sum.overlapped += s->times.overlapped / steps;
        if (s->memory.peak_total > r->slots[worst].memory.peak_total)
            worst = (size_t)k;
        double b = (double)(s->bytes.read + s->bytes.written);
        if (b > bytes)
            bytes = b;
        if (s->optim_bytes > r->slots[optim].optim_bytes)
            optim = (size_t)k;
    }
    rec->step_ms_compute = sum.compute * 1e3 / r->n;
    rec->step_ms_wait = sum.wait * 1e3 / r->n;
    rec->step_ms_reduce = sum.reduce * 1e3 / r->n;
    rec->step_ms_optimizer = sum.optimizer * 1e3 / r->n;
    rec->step_ms_overlapped = sum.overlapped * 1e3 / r->n;
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
    const worker_slot *o = &r->slots[optim];
    rec->optimizer_moments = r->cfg->optim.moments;
    rec->optimizer_master = r->cfg->optim.master;
    rec->optimizer_bytes_per_worker_step = (double)o->optim_bytes;
    rec->optimizer_bytes_per_param =
        o->optim_params ? (double)o->optim_bytes / (double)o->optim_params : 0.0;
    rec->comm_bytes_per_worker_round = 0.0;
    rec->ring_bytes_per_worker_step =
        r->n_all > 1 ? st_comm_ring_bytes(r->n_all, r->ring_params ? r->ring_params
                                                                   : r->n_params) : 0.0;
}

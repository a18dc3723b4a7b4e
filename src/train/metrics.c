/* train/metrics.c — metrics records as JSON Lines, one object per line, so
 * that a run can be followed with `tail -f` and read back with any JSON
 * tool line by line.  peak_bytes and peak_bytes_per_worker are the same
 * number (the largest worker's peak); the first name is kept for scripts
 * written against one-worker runs.  synth runs add "synth": {phase
 * ("segments" or "recovery"), segment_workers, cuts, and segment_loss in
 * the segment epochs}.  Language models add "text": {train_bpb, test_bpb
 * (the losses, per byte, in bits), tokens_per_s, context}; their
 * test_acc is the next byte's.  sdp runs add "coverage": {requested (C),
 * holders (k), workers (N), effective (k / N)}.  Every record has
 * "optimizer": {moments (the state's layout), bytes_per_param,
 * bytes_per_worker_step (what the busiest worker's update reads and
 * writes), master (the master weights' layout)}.  A number that is not finite is null. */
#include <math.h>

#include <subtrain/train.h>

/* A number as JSON, into buf (NUM bytes).  JSON has no NaN or infinity: a
 * loss that diverged, a rate over no time, an alignment of zero gradients
 * are written null, so that every line stays valid JSON. */
#define NUM 40
static const char *num(char *buf, const char *fmt, double v)
{
    if (!isfinite(v))
        return "null";
    snprintf(buf, NUM, fmt, v);
    return buf;
}

int st_metrics_write(FILE *f, const st_epoch_record *r)
{
    fputc('{', f);
    return st_metrics_write_members(f, r);
}

int st_metrics_write_members(FILE *f, const st_epoch_record *r)
{
    const st_mem_stats *m = &r->memory;
    char b[8][NUM];
    if (r->interrupted)   /* only then: other records stay as they were */
        fprintf(f, "\"interrupted\":true,");
    if (r->diverged)      /* why the run stopped: its loss is no longer finite */
        fprintf(f, "\"stopped\":\"diverged\",");
    fprintf(f, "\"epoch\":%d,\"step\":%llu,\"final\":%s,\"train_loss\":%s,"
               "\"test_loss\":%s,\"test_acc\":%s,\"samples_per_s\":%s,"
               "\"wall_s\":%s,\"lr\":%s,\"workers\":%d,\"ranks\":%d,"
               "\"workers_per_rank\":%d,\"threads_per_worker\":%d,\"precision\":\"%s\","
               "\"comm_precision\":\"%s\",\"peak_bytes\":%zu,\"peak_bytes_by_kind\":{",
            r->epoch, (unsigned long long)r->step, r->final ? "true" : "false",
            num(b[0], "%.6f", r->train_loss), num(b[1], "%.6f", r->test_loss),
            num(b[2], "%.4f", r->test_acc), num(b[3], "%.1f", r->samples_per_s),
            num(b[4], "%.3f", r->wall_s), num(b[5], "%.6g", r->lr), r->workers, r->ranks > 1 ? r->ranks : 1,
            r->workers_per_rank > 0 ? r->workers_per_rank : r->workers,
            r->threads_per_worker > 1 ? r->threads_per_worker : 1,
            st_precision_name(r->precision), st_precision_name(r->comm_precision), m->peak_total);
    for (int k = 0; k < ST_MEM_KIND_COUNT; k++)
        fprintf(f, "%s\"%s\":%zu", k ? "," : "", st_mem_kind_name((st_mem_kind)k), m->peak[k]);
    if (r->tokens_per_sample)   /* a byte-level language model: nats per byte to bits */
        fprintf(f, "},\"text\":{\"train_bpb\":%s,\"test_bpb\":%s,\"tokens_per_s\":%s,"
                   "\"context\":%d", num(b[0], "%.6f", r->train_loss / M_LN2),
                num(b[1], "%.6f", r->test_loss / M_LN2),
                num(b[2], "%.1f", r->samples_per_s * r->tokens_per_sample),
                r->tokens_per_sample);
    if (r->align_measured)
        fprintf(f, "},\"grad_alignment\":{\"mean\":%s,\"min\":%s,\"measurements\":%d",
                num(b[0], "%.6f", r->align_mean), num(b[1], "%.6f", r->align_min),
                r->align_measured);
    if (r->coverage_holders)   /* sdp: the coverage asked for and the k / N that runs */
        fprintf(f, "},\"coverage\":{\"requested\":%s,\"holders\":%d,\"workers\":%d,"
                   "\"effective\":%s", num(b[0], "%.6g", r->coverage), r->coverage_holders,
                r->workers, num(b[1], "%.6g", (double)r->coverage_holders /
                                                  (double)(r->workers > 0 ? r->workers : 1)));
    if (r->n_segments) {
        /* left open like the others: the next "}," closes it */
        fprintf(f, "},\"synth\":{\"phase\":\"%s\",\"segment_workers\":[",
                r->recovery ? "recovery" : "segments");
        for (int g = 0; g < r->n_segments; g++)
            fprintf(f, "%s%d", g ? "," : "", r->segment_workers[g]);
        fprintf(f, "],\"cuts\":[");
        for (int g = 0; g + 1 < r->n_segments; g++)
            fprintf(f, "%s%d", g ? "," : "", r->cuts[g]);
        fprintf(f, "]");
        if (!r->recovery) {
            fprintf(f, ",\"segment_loss\":[");
            for (int g = 0; g < r->n_segments; g++)
                fprintf(f, "%s%s", g ? "," : "", num(b[0], "%.6f", r->segment_loss[g]));
            fprintf(f, "]");
        }
    }
    fprintf(f, "},\"peak_bytes_per_worker\":%zu,\"comm_bytes_per_worker_step\":%s,"
               "\"ring_bytes_per_worker_step\":%s,",
            m->peak_total, num(b[0], "%.0f", r->comm_bytes_per_worker_step),
            num(b[1], "%.0f", r->ring_bytes_per_worker_step));
    if (r->comm_bytes_per_worker_round > 0.0)
        fprintf(f, "\"comm_bytes_per_worker_round\":%s,",
                num(b[0], "%.0f", r->comm_bytes_per_worker_round));
    fprintf(f, "\"optimizer\":{\"moments\":\"%s\",\"bytes_per_param\":%s,"
               "\"bytes_per_worker_step\":%s,\"master\":\"%s\"},",
            st_moments_name(r->optimizer_moments), num(b[0], "%.2f", r->optimizer_bytes_per_param),
            num(b[1], "%.0f", r->optimizer_bytes_per_worker_step),
            st_master_name(r->optimizer_master));
    fprintf(f, "\"step_ms\":{\"compute\":%s,\"wait\":%s,\"reduce\":%s,\"optimizer\":%s,"
               "\"overlapped\":%s}}\n",
            num(b[0], "%.3f", r->step_ms_compute), num(b[1], "%.3f", r->step_ms_wait),
            num(b[2], "%.3f", r->step_ms_reduce), num(b[3], "%.3f", r->step_ms_optimizer),
            num(b[4], "%.3f", r->step_ms_overlapped));
    return fflush(f) == 0 && !ferror(f) ? 0 : -1;
}

/* train/metrics.c — metrics records as JSON Lines, one object per line, so
 * that a run can be followed with `tail -f` and read back with any JSON
 * tool line by line. */
#include <subtrain/train.h>

int st_metrics_write(FILE *f, const st_epoch_record *r)
{
    const st_mem_stats *m = &r->memory;
    fprintf(f, "{\"epoch\":%d,\"step\":%llu,\"final\":%s,\"train_loss\":%.6f,"
               "\"test_loss\":%.6f,\"test_acc\":%.4f,\"samples_per_s\":%.1f,"
               "\"wall_s\":%.3f,\"lr\":%.6g,\"workers\":%d,\"peak_bytes\":%zu,"
               "\"peak_bytes_by_kind\":{",
            r->epoch, (unsigned long long)r->step, r->final ? "true" : "false",
            r->train_loss, r->test_loss, r->test_acc, r->samples_per_s, r->wall_s,
            r->lr, r->workers, m->peak_total);
    for (int k = 0; k < ST_MEM_KIND_COUNT; k++)
        fprintf(f, "%s\"%s\":%zu", k ? "," : "", st_mem_kind_name((st_mem_kind)k), m->peak[k]);
    fprintf(f, "}}\n");
    return fflush(f) == 0 && !ferror(f) ? 0 : -1;
}

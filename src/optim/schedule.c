/* optim/schedule.c — learning-rate schedules: constant, and linear warmup
 * followed by a cosine decay to zero at the last step. */
#include <math.h>

#include <subtrain/optim.h>

#include "core/enum_table.h"
#include "core/error.h"

/* "warmup-cosine" is an alias: accepted, never printed. */
static const st_enum_entry schedule_entries[] = {
    { "constant", ST_SCHED_CONSTANT },
    { "cosine", ST_SCHED_WARMUP_COSINE },
    { "warmup-cosine", ST_SCHED_WARMUP_COSINE },
};
static const st_enum_table schedules = ST_ENUM_TABLE("schedule", schedule_entries);

const char *st_schedule_name(st_schedule_kind kind)
{
    return st_enum_name(&schedules, (int)kind);
}

st_status st_schedule_parse(const char *name, st_schedule_kind *out)
{
    int v;
    ST_TRY(st_enum_parse(&schedules, name, &v));
    *out = (st_schedule_kind)v;
    return ST_OK;
}

float st_schedule_lr(const st_schedule *s, uint64_t t)
{
    if (s->kind == ST_SCHED_CONSTANT)
        return s->peak_lr;
    if (t <= s->warmup_steps)
        return s->peak_lr * (float)t / (float)s->warmup_steps;
    if (t >= s->total_steps)
        return 0.0f;
    double progress = (double)(t - s->warmup_steps) / (double)(s->total_steps - s->warmup_steps);
    return (float)(0.5 * s->peak_lr * (1.0 + cos(3.141592653589793 * progress)));
}

/* optim/schedule.c — learning-rate schedules: constant, and linear warmup
 * followed by a cosine decay to zero at the last step. */
#include <math.h>
#include <string.h>

#include <subtrain/optim.h>

const char *st_schedule_name(st_schedule_kind kind)
{
    return kind == ST_SCHED_CONSTANT ? "constant"
         : kind == ST_SCHED_WARMUP_COSINE ? "cosine" : "unknown";
}

int st_schedule_parse(const char *name, st_schedule_kind *out)
{
    if (strcmp(name, "constant") == 0) { *out = ST_SCHED_CONSTANT; return 0; }
    if (strcmp(name, "cosine") == 0 || strcmp(name, "warmup-cosine") == 0) {
        *out = ST_SCHED_WARMUP_COSINE;
        return 0;
    }
    return -1;
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

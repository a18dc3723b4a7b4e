/*
 * tests/recorder.h — training callbacks that record a run: every step's
 * loss and ETA, and the epoch records.  Header-only, every function
 * static inline; include it after <criterion/criterion.h> and <subtrain/subtrain.h>.
 */
#ifndef SUBTRAIN_TEST_RECORDER_H
#define SUBTRAIN_TEST_RECORDER_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define ST_TEST_MAX_STEPS 4096
#define ST_TEST_MAX_RECORDS 16

/* The first ST_TEST_MAX_STEPS steps and ST_TEST_MAX_RECORDS records;
 * steps counts them all.  Large: allocate it. */
typedef struct recorder {
    float losses[ST_TEST_MAX_STEPS];
    double etas[ST_TEST_MAX_STEPS];
    uint64_t steps;
    st_epoch_record records[ST_TEST_MAX_RECORDS];
    int n_records;
} recorder;

/* Also asserts that steps come in order, once each, with a rate and an
 * ETA that are finite and not negative. */
static inline void on_step(const st_step_info *info, void *user)
{
    recorder *r = user;
    cr_assert_eq(info->step, r->steps + 1, "steps are reported in order, once each");
    if (r->steps < ST_TEST_MAX_STEPS) {
        r->losses[r->steps] = info->loss;
        r->etas[r->steps] = info->eta_s;
    }
    cr_assert(info->samples_per_s >= 0.0 && isfinite(info->samples_per_s) &&
              info->eta_s >= 0.0 && isfinite(info->eta_s), "step %llu: %g samples/s, eta %g s",
              (unsigned long long)info->step, info->samples_per_s, info->eta_s);
    r->steps++;
}

static inline void on_epoch(const st_epoch_record *rec, void *user)
{
    recorder *r = user;
    if (r->n_records < ST_TEST_MAX_RECORDS)
        r->records[r->n_records++] = *rec;
}

/* st_train_run with r recording (cleared first); the final record. */
static inline st_epoch_record train_recorded(const st_train_config *c,
                                             const st_dataset *train, const st_dataset *test,
                                             recorder *r)
{
    memset(r, 0, sizeof *r);
    st_train_callbacks cb = { .on_step = on_step, .on_epoch = on_epoch, .user = r };
    st_epoch_record final;
    cr_assert_eq(st_train_run(c, train, test, &cb, &final), ST_OK, "%s", st_last_error());
    return final;
}

#endif /* SUBTRAIN_TEST_RECORDER_H */

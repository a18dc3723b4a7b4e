/*
 * tests/run_params.h — one training run kept whole for a bitwise
 * comparison: its step losses, its final record and a copy of its final
 * parameters.  Header-only, every function static inline; include it after
 * <criterion/criterion.h> and <subtrain/subtrain.h>.
 */
#ifndef SUBTRAIN_TESTS_RUN_PARAMS_H
#define SUBTRAIN_TESTS_RUN_PARAMS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define RUN_MAX_STEPS 256

/* The first RUN_MAX_STEPS step losses (a resumed run's start after its
 * checkpoint's); steps counts them all. */
typedef struct run_out {
    float losses[RUN_MAX_STEPS];
    uint64_t steps;
    st_epoch_record final;
    float *params;
    size_t n;
} run_out;

static inline void run_keep_params(const float *params, size_t count, void *user)
{
    run_out *o = user;
    free(o->params);
    o->params = malloc(count * sizeof *params);
    cr_assert_not_null(o->params);
    memcpy(o->params, params, count * sizeof *params);
    o->n = count;
}

static inline void run_keep_step(const st_step_info *info, void *user)
{
    run_out *o = user;
    if (o->steps < RUN_MAX_STEPS)
        o->losses[o->steps] = info->loss;
    o->steps++;
}

static inline run_out *run_train(const st_train_config *c, const st_dataset *train,
                                 const st_dataset *test)
{
    run_out *o = calloc(1, sizeof *o);
    cr_assert_not_null(o);
    st_train_callbacks cb = { .on_step = run_keep_step, .user = o,
                              .on_params = run_keep_params };
    cr_assert_eq(st_train_run(c, train, test, &cb, &o->final), ST_OK, "%s", st_last_error());
    cr_assert_not_null(o->params);
    return o;
}

static inline void run_free(run_out *o)
{
    free(o->params);
    free(o);
}

#endif /* SUBTRAIN_TESTS_RUN_PARAMS_H */

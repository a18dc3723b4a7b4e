/*
 * tests/model_heapwatch.h — a model's steps under the heap watch, for the
 * model suites that count heap calls.  Include it after model_check.h and
 * after heapwatch.h with HEAPWATCH_PER_THREAD defined.
 */
#ifndef SUBTRAIN_TESTS_MODEL_HEAPWATCH_H
#define SUBTRAIN_TESTS_MODEL_HEAPWATCH_H

/* A model of cfg at batch 8 (parameters of seed 7, rows of seed 8) takes
 * 4 steps, the last 3 armed: heapwatch's counters (own_calls, dnnl_calls,
 * executes) are left holding theirs.  No Criterion call while armed. */
static inline void watch_model_steps(const st_model_config *cfg, const char *name)
{
    st_arena a;
    st_arena_init(&a, name, NULL, 0);
    st_model *m = make_model(cfg, 8, &a);
    st_model_init_params(m, 7);
    st_rng r = st_rng_seed(8);
    fill_rows(m, 0, 8, &r);
    st_status st = ST_OK;
    own_calls = dnnl_calls = executes = 0;
    for (int round = 0; round < 4 && st == ST_OK; round++) {
        float loss;
        armed = round >= 1; /* the first round lets oneDNN set up its per-thread state */
        st = st_model_forward_backward(m, &loss);
        armed = 0;
    }
    cr_assert_eq(st, ST_OK, "%s", st_last_error());
    cr_assert_gt(executes, 0, "the interposer saw the primitives run");
    st_model_destroy(m);
    st_arena_release(&a);
}

#endif /* SUBTRAIN_TESTS_MODEL_HEAPWATCH_H */

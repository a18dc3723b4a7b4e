/*
 * tests/synth_check.h — what the synth suites share (tests/test_synth*.c):
 * an mlp configuration of the given shape. Header-only, every function
 * static inline.
 */
#ifndef SUBTRAIN_TESTS_SYNTH_CHECK_H
#define SUBTRAIN_TESTS_SYNTH_CHECK_H

#include <subtrain/model.h>

static inline st_model_config mlp(int depth, int width, int in, int classes)
{
    st_model_config m = st_model_config_default();
    m.kind = st_model_kind_named("mlp");
    m.depth = depth;
    m.width = width;
    m.in_dim = in;
    m.n_classes = classes;
    return m;
}

#endif /* SUBTRAIN_TESTS_SYNTH_CHECK_H */

/*
 * tests/test_model_bf16.c — bf16 models: shared buffers, no heap call, the
 * same steps from the same seed, and the weight copies the update writes.
 *
 * The small models and the gradient check: tests/model_check.h.
 */
#define _GNU_SOURCE /* RTLD_NEXT, for heapwatch.h */
#include "model_check.h"

/* Heap calls of the armed thread. */
#define HEAPWATCH_PER_THREAD
#include "heapwatch.h"

/* --precision bf16 keeps 2-byte copies for the backward and lets the fp32
 * tensors that no backward reads, and the data gradients, share buffers
 * (graph.c).  A resmlp (GELU), the same with backward masking of neurons,
 * and a gpt: some tensors do share a buffer; a training step makes no heap
 * call of subtrain's; two models of the same seed give bitwise the same
 * losses and gradients over 3 steps with an evaluation between steps. */
Test(bf16, shared_buffers_no_heap_call_same_seed_same_steps)
{
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 matmul on this CPU");
    omp_set_num_threads(1);
    st_model_config cfgs[3] = { resmlp_config(3, 16, 24, ST_ACT_GELU),
                                neuron_config(st_model_kind_named("resmlp"), 1),
                                gpt_config(2, 8, 2, 6) };
    for (int k = 0; k < 3; k++) {
        cfgs[k].precision = ST_PRECISION_BF16;
        st_arena a[2];
        st_model *m[2];
        float loss[2][3];
        for (int j = 0; j < 2; j++) {
            st_arena_init(&a[j], "bf16 keep", NULL, 0);
            m[j] = make_model(&cfgs[k], 4, &a[j]);
            st_model_init_params(m[j], 11);
        }
        int shared = 0;
        for (int t = ST_T_FIRST_FREE; t < m[0]->n_tensors; t++)
            for (int u = t + 1; u < m[0]->n_tensors; u++)
                shared += m[0]->tensors[t].data && m[0]->tensors[t].data == m[0]->tensors[u].data;
        cr_assert_gt(shared, 0, "config %d: no two tensors share a buffer in bf16", k);
        for (int j = 0; j < 2; j++) {
            st_rng r = st_rng_seed(5);
            for (int step = 0; step < 3; step++) {
                fill_rows(m[j], 0, 4, &r);
                own_calls = 0;
                armed = step >= 1;   /* the first lets oneDNN set up its thread */
                st_status st = st_model_forward_backward(m[j], &loss[j][step]);
                armed = 0;
                cr_assert_eq(st, ST_OK, "%s", st_last_error());
                if (HEAPWATCH_ACTIVE && step >= 1)
                    cr_expect_eq(own_calls, 0, "config %d: a bf16 step called the heap %ld "
                                 "times", k, own_calls);
                double sum = 0;
                int64_t hits = 0;
                OK(st_model_evaluate(m[j], 4, &sum, &hits));
            }
        }
        cr_assert_eq(memcmp(loss[0], loss[1], sizeof loss[0]), 0,
                     "config %d: the same seed gave other bf16 losses", k);
        cr_assert_eq(memcmp(st_model_grads(m[0]), st_model_grads(m[1]),
                            m[0]->n_grads * sizeof(float)), 0,
                     "config %d: the same seed gave other bf16 gradients", k);
        for (int j = 0; j < 2; j++) {
            st_model_destroy(m[j]);
            st_arena_release(&a[j]);
        }
    }
}

/* The update writes the bf16 weight copies (st_optim_update_copies), and
 * the forward after it skips their conversion (st_model_copies_written):
 * 4 steps with an evaluation between each, bitwise the same losses and
 * parameters as a model that converts its weights in every forward
 * (ST_UNFUSE_WEIGHT_COPY).  Every linear weight is listed: the copies add
 * up to the decayed matrices of a resmlp. */
Test(bf16, update_written_weight_copies_change_nothing)
{
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 matmul on this CPU");
    omp_set_num_threads(1);
    st_model_config cfgs[2] = { resmlp_config(3, 16, 24, ST_ACT_GELU), gpt_config(2, 8, 2, 6) };
    for (int k = 0; k < 2; k++) {
        st_arena a[2];
        st_model *m[2];
        st_optim o[2];
        float loss[2][4];
        st_optim_config oc = st_optim_config_default();
        for (int j = 0; j < 2; j++) {
            st_model_config c = cfgs[k];
            c.precision = ST_PRECISION_BF16;
            c.unfuse = j == 0 ? ST_UNFUSE_WEIGHT_COPY : 0;
            st_arena_init(&a[j], "bf16 copies", NULL, 0);
            m[j] = make_model(&c, 4, &a[j]);
            st_model_init_params(m[j], 13);
            OK(st_optim_init(&o[j], &oc, st_model_param_count(m[j]), &a[j]));
        }
        int n0, n1, n_segs;
        st_model_copies(m[0], &n0);
        const st_param_copy *copies = st_model_copies(m[1], &n1);
        const st_param_segment *segs = st_model_segments(m[1], &n_segs);
        cr_assert_eq(n0, 0, "config %d: unfused, yet copies are listed", k);
        cr_assert_gt(n1, 0, "config %d: no weight copy listed", k);
        if (k == 0) {
            size_t listed = 0, matrices = 0;
            for (int i = 0; i < n1; i++)
                listed += copies[i].count;
            for (int i = 0; i < n_segs; i++)
                matrices += segs[i].decay ? segs[i].count : 0;
            cr_assert_eq(listed, matrices, "resmlp: %zu weights in copies, %zu in matrices",
                         listed, matrices);
        }
        for (int j = 0; j < 2; j++) {
            st_rng r = st_rng_seed(6);
            for (int step = 0; step < 4; step++) {
                fill_rows(m[j], 0, 4, &r);
                OK(st_model_forward_backward(m[j], &loss[j][step]));
                int n, ns;
                const st_param_copy *cp = st_model_copies(m[j], &n);
                const st_param_segment *sg = st_model_segments(m[j], &ns);
                st_optim_update_copies(&o[j], st_model_params(m[j]), st_model_grads(m[j]), sg,
                                       ns, 0, st_model_param_count(m[j]),
                                       (uint64_t)step + 1, 1e-2f, cp, n);
                st_model_copies_written(m[j]);
                double sum = 0;
                int64_t hits = 0;
                OK(st_model_evaluate(m[j], 4, &sum, &hits));
            }
        }
        cr_assert_eq(memcmp(loss[0], loss[1], sizeof loss[0]), 0,
                     "config %d: losses differ with the update writing the copies (step 4: "
                     "%.9g vs %.9g)", k, loss[0][3], loss[1][3]);
        cr_assert_eq(memcmp(st_model_params(m[0]), st_model_params(m[1]),
                            st_model_param_count(m[0]) * sizeof(float)), 0,
                     "config %d: parameters differ with the update writing the copies", k);
        /* the parameters written by hand after an update that wrote the
         * copies: st_model_params_changed makes the next forward convert */
        float after[2];
        for (int j = 0; j < 2; j++) {
            st_model_copies_written(m[j]);
            float *p = st_model_params(m[j]);
            for (size_t i = 0; i < st_model_param_count(m[j]); i++)
                p[i] *= 0.5f;
            st_model_params_changed(m[j]);
            st_rng r = st_rng_seed(7);
            fill_rows(m[j], 0, 4, &r);
            OK(st_model_forward_backward(m[j], &after[j]));
        }
        cr_assert_eq(memcmp(&after[0], &after[1], sizeof after[0]), 0,
                     "config %d: a forward after st_model_params_changed used stale copies "
                     "(%.9g vs %.9g)", k, after[1], after[0]);
        for (int j = 0; j < 2; j++) {
            st_model_destroy(m[j]);
            st_arena_release(&a[j]);
        }
    }
}

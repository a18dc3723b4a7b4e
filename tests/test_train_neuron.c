/*
 * tests/test_train_neuron.c — neuron subnetworks (sdp and ist of neuron
 * groups), and bf16 weight copies written by the all-gather under every
 * strategy.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include <subtrain/subtrain.h>
#include "train_check.h"

/* ------------------------------------------------------------ neuron units */

/* bf16: the all-gather writes the weights' bf16 copies as it brings the
 * parameters in (comm.h: st_comm_set_param_copies), and the next forward
 * reads them instead of converting the weights.  Every step's loss and the
 * final record are bitwise those of the same run with the copies made by
 * each forward (ST_UNFUSE_WEIGHT_COPY), for data parallelism, subnetworks
 * redrawn every 3 steps (a new model and attachment each round), backward
 * masking (a gather-only engine of its own) and neuron subnetworks of an
 * mlp (elements nobody holds); the engine's bytes say the copies were
 * written by it (2 bytes more a copied element).  A replica per worker
 * each: shared weights (one copy per domain, whose owners write the
 * copies with their update) are test_weights.c's. */
Test(bf16_train, gathered_weight_copies_change_nothing, .timeout = 180)
{
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 kernels on this CPU");
    st_train_config cfg[4];
    cfg[0] = dp_config(2, 16, 12);
    cfg[1] = sdp_config(4, 0.5, 12);
    cfg[1].sdp.resample = 3;
    cfg[2] = sdp_config(4, 0.5, 12);
    cfg[2].sdp.masking = ST_MASKING_BACKWARD;
    cfg[3] = neuron_sdp_config(st_model_kind_named("mlp"), 4, 0.5, 12);
    const char *what[] = { "dp", "sdp, redrawn", "sdp, backward masking", "sdp neurons, mlp" };
    for (int k = 0; k < 4; k++) {
        st_train_config a = cfg[k], b;
        a.model.precision = ST_PRECISION_BF16;
        a.weights = ST_WEIGHTS_PRIVATE;
        b = a;
        b.model.unfuse = ST_UNFUSE_WEIGHT_COPY;
        st_epoch_record fa, fb;
        assert_bitwise_same_run(&a, &b, &fa, &fb);
        cr_assert_eq(fa.train_loss, fb.train_loss, "%s", what[k]);
        cr_assert_eq(fa.test_loss, fb.test_loss, "%s", what[k]);
        cr_assert_gt(fa.comm_bytes_per_worker_step, fb.comm_bytes_per_worker_step,
                     "%s: the engine wrote no copies", what[k]);
    }
}

/* Coverage 1 with neuron units: every worker's compact model keeps every
 * group, so it is the full model (same values, products, order): data
 * parallelism to the bit, with forward and with backward masking. */
static void assert_neuron_full_coverage_is_dp(st_model_kind kind, st_masking masking)
{
    st_train_config cs = neuron_sdp_config(kind, 2, 1.0, 30), cd = cs;
    cs.sdp.masking = masking;
    cd.strategy = ST_STRATEGY_DP;
    st_epoch_record fd, fs;
    assert_bitwise_same_run(&cd, &cs, &fd, &fs);
}

Test(sdp_neuron, forward_full_coverage_is_bitwise_dp_resmlp, .timeout = 120)
{
    assert_neuron_full_coverage_is_dp(st_model_kind_named("resmlp"), ST_MASKING_FORWARD);
}

Test(sdp_neuron, forward_full_coverage_is_bitwise_dp_mlp, .timeout = 120)
{
    assert_neuron_full_coverage_is_dp(st_model_kind_named("mlp"), ST_MASKING_FORWARD);
}

Test(sdp_neuron, backward_full_coverage_is_bitwise_dp_resmlp, .timeout = 120)
{
    assert_neuron_full_coverage_is_dp(st_model_kind_named("resmlp"), ST_MASKING_BACKWARD);
}

/* Half coverage over 4 workers: every group held by 2; the run learns
 * with less weight and activation memory per worker than data
 * parallelism with a replica per worker, and is reproducible; redrawn
 * masks too. */
Test(sdp_neuron, half_coverage_learns_with_less_memory, .timeout = 120)
{
    st_dataset train, test;
    make_data(11, &train, &test);
    recorder *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b), *d = calloc(1, sizeof *d);
    st_train_config cs = neuron_sdp_config(st_model_kind_named("resmlp"), 4, 0.5, 512), cd = cs;
    cd.strategy = ST_STRATEGY_DP;
    cd.weights = ST_WEIGHTS_PRIVATE;
    cs.sdp.resample = 100;
    st_epoch_record fa = train_recorded(&cs, &train, &test, a);
    st_epoch_record fb = train_recorded(&cs, &train, &test, b);
    st_epoch_record fd = train_recorded(&cd, &train, &test, d);
    cr_log_info("4 workers, 512 steps: dp test_acc %.4f peak %zu B; sdp neuron C=0.5 test_acc "
                "%.4f peak %zu B", fd.test_acc, fd.memory.peak_total, fa.test_acc,
                fa.memory.peak_total);
    cr_assert_eq(memcmp(a->losses, b->losses, a->steps * sizeof(float)), 0);
    cr_assert_eq(fa.test_acc, fb.test_acc);
    cr_assert_geq(fa.test_acc, SYNTH_MIN_ACCURACY, "sdp neuron reached only %.4f", fa.test_acc);
    cr_assert_lt(fa.memory.peak[ST_MEM_WEIGHTS], fd.memory.peak[ST_MEM_WEIGHTS]);
    cr_assert_lt(fa.memory.peak[ST_MEM_ACTIVATIONS], fd.memory.peak[ST_MEM_ACTIVATIONS]);
    free(a);
    free(b);
    free(d);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* Every parameter of the full model moved from its initial value: each is
 * held by some worker and its owner updated it (a shard owner that
 * updated its shard with its own subnetwork's layout would leave the end
 * of the vector untouched). */
static void assert_every_parameter_trained(const st_train_config *c, const char *what)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    params_out o = { 0 };
    st_train_callbacks cb = { .on_params = keep_params, .user = &o };
    cr_assert_eq(st_train_run(c, &train, &test, &cb, NULL), ST_OK, "%s", st_last_error());
    cr_assert_eq(o.n, st_model_config_param_count(&c->model), "%s: the full model", what);
    float *init = malloc(o.n * sizeof *init);
    cr_assert_eq(st_model_init_full_range(&c->model, c->seed, 0, o.n, init), ST_OK);
    size_t same = 0, first = o.n;
    for (size_t i = 0; i < o.n; i++)
        if (o.p[i] == init[i]) {
            same++;
            first = first < i ? first : i;
        }
    cr_assert_eq(same, 0, "%s: %zu of %zu parameters never moved (the first at %zu)", what, same,
                 o.n, first);
    free(init);
    free(o.p);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(sdp_neuron, every_parameter_is_trained, .timeout = 120)
{
    st_train_config c = sdp_config(4, 0.5, 60);
    assert_every_parameter_trained(&c, "sdp block forward C=0.5");
    c = neuron_sdp_config(st_model_kind_named("resmlp"), 4, 0.5, 60);
    assert_every_parameter_trained(&c, "sdp neuron forward C=0.5 (resmlp)");
    c = neuron_sdp_config(st_model_kind_named("mlp"), 4, 0.5, 60);
    assert_every_parameter_trained(&c, "sdp neuron forward C=0.5 (mlp)");
    c.sdp.masking = ST_MASKING_BACKWARD;
    assert_every_parameter_trained(&c, "sdp neuron backward C=0.5 (mlp)");
    c = dp_config(2, 16, 30);
    assert_every_parameter_trained(&c, "data parallelism");
}

Test(sdp_neuron, too_few_groups_for_the_workers_is_refused)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = neuron_sdp_config(st_model_kind_named("resmlp"), 4, 0.25, 10);
    c.neuron_group = 1024;   /* one group per layer, one holder: 3 workers without */
    st_epoch_record f;
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, &f), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "--neuron-group"), "%s", st_last_error());
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* IST of mlp with one worker: it holds every neuron, rounds copy its own
 * parameters back, scaling by N = 1 is none: plain SGD to the bit. */
Test(ist_neuron, one_worker_mlp_is_bitwise_sgd, .timeout = 120)
{
    st_train_config ci = ist_config(1, 7, 300), cs = ci;
    ci.model.kind = cs.model.kind = st_model_kind_named("mlp");
    ci.model.depth = cs.model.depth = 2;
    ci.neuron_group = cs.neuron_group = 4;
    ci.optim.kind = cs.optim.kind = ST_OPT_SGD;
    ci.optim.momentum = cs.optim.momentum = 0.0f;
    ci.optim.lr = cs.optim.lr = 0.05f;
    cs.strategy = ST_STRATEGY_DP;
    st_epoch_record fi, fs;
    assert_bitwise_same_run(&cs, &ci, &fi, &fs);
}

/* Kept optimizer state with one worker: the state carries over rounds, so
 * IST with momentum SGD is momentum SGD to the bit, and with AdamW AdamW
 * (a reset would differ). */
Test(ist_neuron, kept_state_with_one_worker_is_bitwise_momentum_sgd, .timeout = 120)
{
    st_train_config ci = ist_config(1, 7, 200), cs = ci;
    ci.model.kind = cs.model.kind = st_model_kind_named("mlp");
    ci.model.depth = cs.model.depth = 2;
    ci.neuron_group = cs.neuron_group = 4;
    ci.optim.kind = cs.optim.kind = ST_OPT_SGD;
    ci.optim.lr = cs.optim.lr = 0.02f;
    ci.ist.keep_state = 1;
    cs.strategy = ST_STRATEGY_DP;
    st_epoch_record fi, fs;
    assert_bitwise_same_run(&cs, &ci, &fi, &fs);
    /* AdamW: both moments carried over and the step count running on */
    ci.optim.kind = cs.optim.kind = ST_OPT_ADAMW;
    ci.optim.lr = cs.optim.lr = 1e-3f;
    assert_bitwise_same_run(&cs, &ci, &fi, &fs);
    ci.optim.kind = ST_OPT_SGD;
    ci.optim.lr = 0.02f;
    st_dataset train, test;
    make_data(5, &train, &test);
    recorder *reset = calloc(1, sizeof *reset), *kept = calloc(1, sizeof *kept);
    ci.ist.keep_state = 0;
    train_recorded(&ci, &train, &test, reset);
    ci.ist.keep_state = 1;
    train_recorded(&ci, &train, &test, kept);
    cr_assert_neq(memcmp(reset->losses, kept->losses, kept->steps * sizeof(float)), 0,
                  "resetting the momentum every round changes the run");
    free(reset);
    free(kept);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* IST of mlp, 2 workers, disjoint neuron halves: learns, reproducible,
 * communicates once a round. */
Test(ist_neuron, two_workers_mlp_learn_reproducibly, .timeout = 120)
{
    st_dataset train, test;
    make_data(11, &train, &test);
    recorder *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    st_train_config ci = ist_config(2, 10, 768);
    ci.model.kind = st_model_kind_named("mlp");
    ci.model.depth = 2;
    ci.neuron_group = 4;
    st_epoch_record fa = train_recorded(&ci, &train, &test, a);
    st_epoch_record fb = train_recorded(&ci, &train, &test, b);
    cr_log_info("ist mlp 2 workers R=10: test_acc %.4f, %.0f B/worker-step", fa.test_acc,
                fa.comm_bytes_per_worker_step);
    cr_assert_eq(memcmp(a->losses, b->losses, a->steps * sizeof(float)), 0, "reproducible");
    cr_assert_eq(fa.test_acc, fb.test_acc);
    cr_assert_geq(fa.test_acc, SYNTH_MIN_ACCURACY, "ist mlp reached only %.4f", fa.test_acc);
    free(a);
    free(b);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

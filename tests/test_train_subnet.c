/*
 * tests/test_train_subnet.c — block subnetworks: sdp (forward and backward
 * masking, redrawn masks, the alignment report) and ist, against data
 * parallelism and each other.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include <subtrain/subtrain.h>
#include "train_check.h"

/* ------------------------------------------------------------ subnetworks */

/* Coverage 1: every worker holds every block, so SDP with forward masking
 * is data parallelism, to the bit (same init, same products, same
 * reduction order), although it goes through subnetwork models and compact
 * attachment. */
Test(sdp, coverage_one_is_bitwise_data_parallelism, .timeout = 120)
{
    st_train_config cs = sdp_config(2, 1.0, 40), cd = cs;
    cd.strategy = ST_STRATEGY_DP;
    st_epoch_record fd, fs;
    assert_bitwise_same_run(&cd, &cs, &fd, &fs);
    cr_assert_float_eq(fd.test_loss, fs.test_loss, 1e-9 * fd.test_loss,
                       "evaluation sums in another order only");
}

/* Coverage 1/2 over 4 workers: every block is trained by 2 workers, each
 * worker runs 2 of 4 blocks; per-worker memory falls below data
 * parallelism with a replica per worker (dp's workers sharing one weight
 * copy hold less weight memory still: test_weights.c), the run learns,
 * and two runs are bitwise identical. */
Test(sdp, half_coverage_learns_with_less_memory_and_is_deterministic, .timeout = 120)
{
    st_dataset train, test;
    make_data(11, &train, &test);
    recorder *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b), *d = calloc(1, sizeof *d);
    st_train_config cs = sdp_config(4, 0.5, 512), cd = cs;
    cd.strategy = ST_STRATEGY_DP;
    cd.weights = ST_WEIGHTS_PRIVATE;
    st_epoch_record fa = train_recorded(&cs, &train, &test, a);
    st_epoch_record fb = train_recorded(&cs, &train, &test, b);
    st_epoch_record fd = train_recorded(&cd, &train, &test, d);
    cr_assert_eq(memcmp(a->losses, b->losses, a->steps * sizeof(float)), 0);
    cr_log_info("4 workers, 512 steps: dp test_acc %.4f peak %zu B; sdp block C=0.5 test_acc "
                "%.4f peak %zu B", fd.test_acc, fd.memory.peak_total, fa.test_acc,
                fa.memory.peak_total);
    cr_assert_geq(fa.test_acc, SYNTH_MIN_ACCURACY, "sdp reached only %.4f", fa.test_acc);
    cr_assert_lt(fa.memory.peak[ST_MEM_WEIGHTS], fd.memory.peak[ST_MEM_WEIGHTS]);
    cr_assert_lt(fa.memory.peak[ST_MEM_ACTIVATIONS], fd.memory.peak[ST_MEM_ACTIVATIONS]);
    cr_assert_lt(fa.memory.peak_total, fd.memory.peak_total);
    (void)fb;
    free(a);
    free(b);
    free(d);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(sdp, unimplemented_variants_and_bad_coverage_are_refused)
{
    st_train_config c = sdp_config(2, 0.5, 10);
    c.sdp.masking = ST_MASKING_BACKWARD;
    c.sdp.align_every = 5;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID, "nothing to align");
    c = sdp_config(2, 0.5, 10);
    c.neuron_group = 0;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
    c = sdp_config(2, 0.5, 10);
    c.sdp.coverage = 0.0;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
    c = sdp_config(2, 0.5, 10);
    c.model.kind = st_model_kind_named("mlp");
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
}

/* Alignment: at coverage 1 a worker's "subnetwork" is the full model with
 * the same parameters and batch, so the cosine is 1 (up to float); at
 * coverage 1/2 it is less than 1 and the report is there. */
Test(sdp, alignment_is_one_at_full_coverage_and_less_below, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    recorder *r = calloc(1, sizeof *r);
    st_train_config c = sdp_config(2, 1.0, 20);
    c.sdp.align_every = 5;
    st_epoch_record f = train_recorded(&c, &train, &test, r);
    cr_assert_eq(f.align_measured, 4 * 2, "4 measurements of 2 workers");
    cr_assert_float_eq(f.align_mean, 1.0, 1e-5, "mean %.9f", f.align_mean);
    cr_assert_float_eq(f.align_min, 1.0, 1e-5, "min %.9f", f.align_min);
    c = sdp_config(4, 0.5, 20);
    c.sdp.align_every = 10;
    f = train_recorded(&c, &train, &test, r);
    cr_assert_eq(f.align_measured, 2 * 4);
    cr_assert(f.align_mean > 0.0 && f.align_mean < 0.9999, "mean %.6f", f.align_mean);
    cr_assert_leq(f.align_min, f.align_mean);
    c = dp_config(2, 16, 10);
    c.sdp.align_every = 5;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID, "alignment needs sdp");
    free(r);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* Redrawing the masks rebuilds every worker's subnetwork and re-attaches it
 * to the engine between two steps.  At coverage 1 every round holds every
 * block, so a run that rebuilds every 7 steps must still be data
 * parallelism to the bit: nothing is lost or changed in the rebuild. */
Test(sdp, rebuilding_every_round_loses_nothing, .timeout = 120)
{
    st_train_config cs = sdp_config(2, 1.0, 40), cd = cs;
    cs.sdp.resample = 7;
    cd.strategy = ST_STRATEGY_DP;
    st_epoch_record fd, fs;
    assert_bitwise_same_run(&cd, &cs, &fd, &fs);
}

/* Below coverage 1, rounds change who trains what: the run differs from a
 * fixed assignment after the first round, is the fixed one while no round
 * has ended, and is reproducible. */
Test(sdp, resampled_masks_are_reproducible_and_take_effect, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    recorder *fixed = calloc(1, sizeof *fixed), *a = calloc(1, sizeof *a),
             *b = calloc(1, sizeof *b), *late = calloc(1, sizeof *late);
    st_train_config c = sdp_config(4, 0.5, 40);
    train_recorded(&c, &train, &test, fixed);
    c.sdp.resample = 10;
    train_recorded(&c, &train, &test, a);
    train_recorded(&c, &train, &test, b);
    c.sdp.resample = 1000;
    train_recorded(&c, &train, &test, late);
    cr_assert_eq(memcmp(a->losses, b->losses, a->steps * sizeof(float)), 0, "reproducible");
    cr_assert_eq(memcmp(fixed->losses, late->losses, fixed->steps * sizeof(float)), 0,
                 "no round ended: the fixed assignment");
    cr_assert_eq(memcmp(fixed->losses, a->losses, 10 * sizeof(float)), 0,
                 "round 0 is the fixed assignment");
    cr_assert_neq(memcmp(fixed->losses + 10, a->losses + 10, 30 * sizeof(float)), 0,
                  "later rounds redraw the masks");
    free(fixed);
    free(a);
    free(b);
    free(late);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* Backward masking with every block held by every worker is data
 * parallelism to the bit, although gradients and parameters travel through
 * two engines. */
Test(sdp, backward_masking_at_full_coverage_is_bitwise_data_parallelism, .timeout = 120)
{
    st_train_config cb = sdp_config(2, 1.0, 40), cd = cb;
    cb.sdp.masking = ST_MASKING_BACKWARD;
    cd.strategy = ST_STRATEGY_DP;
    st_epoch_record fd, fb;
    assert_bitwise_same_run(&cd, &cb, &fd, &fb);
}

/* Below full coverage, backward masking keeps less gradient and optimizer
 * memory than data parallelism, learns, and redrawn rounds work. */
Test(sdp, backward_masking_learns_with_less_gradient_memory, .timeout = 120)
{
    st_dataset train, test;
    make_data(11, &train, &test);
    recorder *r = calloc(1, sizeof *r), *d = calloc(1, sizeof *d);
    st_train_config cb = sdp_config(4, 0.5, 512), cd = cb;
    cb.sdp.masking = ST_MASKING_BACKWARD;
    cd.strategy = ST_STRATEGY_DP;
    st_epoch_record fb = train_recorded(&cb, &train, &test, r);
    st_epoch_record fd = train_recorded(&cd, &train, &test, d);
    cr_log_info("backward masking C=0.5: test_acc %.4f, gradients %zu B (dp %zu B)", fb.test_acc,
                fb.memory.peak[ST_MEM_GRADIENTS], fd.memory.peak[ST_MEM_GRADIENTS]);
    cr_assert_geq(fb.test_acc, SYNTH_MIN_ACCURACY);
    cr_assert_lt(fb.memory.peak[ST_MEM_GRADIENTS], fd.memory.peak[ST_MEM_GRADIENTS]);
    cb.sdp.resample = 50;
    cb.steps = 120;
    st_epoch_record fr = train_recorded(&cb, &train, &test, r);
    cr_assert_eq(fr.step, 120);
    free(r);
    free(d);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* ------------------------------------------------------------ IST */

/* With one worker IST is plain SGD: the worker holds every block, its
 * rounds copy its own parameters back, and plain SGD keeps no state for a
 * reset to lose.  Bitwise, with rounds of 7 steps (and one at each epoch
 * end). */
Test(ist, one_worker_is_bitwise_sgd, .timeout = 120)
{
    st_train_config ci = ist_config(1, 7, 300), cs = ci;
    ci.optim.kind = cs.optim.kind = ST_OPT_SGD;
    ci.optim.momentum = cs.optim.momentum = 0.0f;
    ci.optim.lr = cs.optim.lr = 0.05f;
    cs.strategy = ST_STRATEGY_DP;
    st_epoch_record fi, fs;
    assert_bitwise_same_run(&cs, &ci, &fi, &fs);
    cr_assert_eq(memcmp(&fi.test_loss, &fs.test_loss, sizeof(double)), 0);
}

/* Two workers, disjoint halves of the blocks, 10 local steps a round: the
 * run learns the synthetic task, is reproducible, and communicates once a
 * round: less than data parallelism per step. */
Test(ist, two_workers_learn_reproducibly_with_less_communication, .timeout = 120)
{
    st_dataset train, test;
    make_data(11, &train, &test);
    recorder *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b), *d = calloc(1, sizeof *d);
    st_train_config ci = ist_config(2, 10, 768), cd = ci;
    cd.strategy = ST_STRATEGY_DP;
    st_epoch_record fa = train_recorded(&ci, &train, &test, a);
    st_epoch_record fb = train_recorded(&ci, &train, &test, b);
    st_epoch_record fd = train_recorded(&cd, &train, &test, d);
    cr_log_info("ist 2 workers R=10: test_acc %.4f, %.0f B/worker-step; dp %.4f, %.0f B", fa.test_acc,
                fa.comm_bytes_per_worker_step, fd.test_acc, fd.comm_bytes_per_worker_step);
    cr_assert_eq(memcmp(a->losses, b->losses, a->steps * sizeof(float)), 0, "reproducible");
    cr_assert_eq(fa.test_acc, fb.test_acc);
    cr_assert_geq(fa.test_acc, SYNTH_MIN_ACCURACY, "ist reached only %.4f", fa.test_acc);
    cr_assert_lt(fa.comm_bytes_per_worker_step, fd.comm_bytes_per_worker_step / 4);
    cr_assert_float_eq(fa.comm_bytes_per_worker_round, 10.0 * fa.comm_bytes_per_worker_step,
                       1e-6 * fa.comm_bytes_per_worker_round, "a round is 10 steps");
    cr_assert_eq(fd.comm_bytes_per_worker_round, 0.0, "no rounds in dp");
    free(a);
    free(b);
    free(d);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(ist, bad_options_are_refused)
{
    st_train_config c = ist_config(2, 0, 10);
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID);
    c = dp_config(2, 16, 10);
    c.ist.keep_state = 1;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID, "keep is an ist option");
    c = ist_config(2, 10, 10);
    c.sdp.subnet = ST_SUBNET_NEURON;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID, "ist of resmlp is block-level");
    c = ist_config(2, 10, 10);
    c.ist.keep_state = 1;
    c.optim.kind = ST_OPT_SGD;
    c.optim.momentum = 0.0f;
    cr_assert_eq(st_train_config_check(&c), ST_ERR_INVALID, "no state to keep");
}

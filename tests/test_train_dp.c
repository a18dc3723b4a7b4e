/*
 * tests/test_train_dp.c — data parallelism: N workers are one worker on the
 * global batch, runs are reproducible, records count the communication
 * exactly; a run started from given weights (--init).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include <subtrain/subtrain.h>
#include "train_check.h"

/* ------------------------------------------------------------ data parallel */

/* N workers at batch B see, at step i, exactly the samples one worker sees
 * at batch N B, and the mean of their mean gradients is the mean gradient
 * of the global batch.  What differs is float summation order (the GEMMs
 * of a batch of B rows, the reduction's order): the losses of the two runs
 * must agree within DP_LOSS_RTOL over 60 AdamW steps.  Measured: about
 * 1e-6 relative; a real error (a missing 1/N, a sample seen twice, a
 * worker's gradient dropped) moves the loss by 1e-2 or more within a few
 * steps. */
#define DP_LOSS_RTOL 1e-4

static void assert_dp_matches_one_worker(int n, int batch)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    recorder *one = calloc(1, sizeof *one), *many = calloc(1, sizeof *many);
    st_train_config c1 = dp_config(1, n * batch, 60), cn = dp_config(n, batch, 60);
    st_epoch_record f1 = train_recorded(&c1, &train, &test, one);
    st_epoch_record fn = train_recorded(&cn, &train, &test, many);
    cr_assert_eq(one->steps, many->steps);
    double worst = 0.0;
    for (uint64_t i = 0; i < one->steps; i++) {
        double d = fabs((double)one->losses[i] - many->losses[i]) / fabs((double)one->losses[i]);
        if (d > worst)
            worst = d;
    }
    cr_log_info("%d workers x %d vs 1 x %d: worst relative loss difference %.2e over %llu steps",
                n, batch, n * batch, worst, (unsigned long long)one->steps);
    cr_assert_leq(worst, DP_LOSS_RTOL, "%d workers x %d disagree with 1 worker x %d: %.3e",
                  n, batch, n * batch, worst);
    cr_assert_leq(fabs(f1.test_loss - fn.test_loss), DP_LOSS_RTOL * 10 * f1.test_loss);
    cr_assert_eq(fn.workers, n);
    free(one);
    free(many);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(dp, two_workers_agree_with_one_worker_on_the_global_batch, .timeout = 120)
{
    assert_dp_matches_one_worker(2, 32);
}

Test(dp, three_workers_agree_with_one_worker_on_the_global_batch, .timeout = 120)
{
    assert_dp_matches_one_worker(3, 16);
}

Test(dp, same_seed_and_workers_give_bitwise_identical_runs, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    recorder *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    st_train_config c = dp_config(2, 32, 80);
    st_epoch_record fa = train_recorded(&c, &train, &test, a);
    st_epoch_record fb = train_recorded(&c, &train, &test, b);
    cr_assert_eq(a->steps, b->steps);
    cr_assert_eq(memcmp(a->losses, b->losses, a->steps * sizeof(float)), 0,
                 "every step's loss is bitwise the same");
    cr_assert_eq(memcmp(&fa.test_loss, &fb.test_loss, sizeof(double)), 0);
    free(a);
    free(b);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* The record's communication, exactly: in one NUMA domain the owner of
 * shard S reads the N gradients of it and writes its mean, 4 (N + 1) |S_w|
 * bytes a step, the workers reading the domain's weight copy that the
 * owners update in place; with a replica per worker the all-gather also
 * reads and writes all P elements, 4 ((N + 1) |S_w| + 2 P).  The record
 * has the busiest worker's (the first shards are the largest). */
Test(dp, records_carry_workers_memory_and_communication, .timeout = 60)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = dp_config(2, 32, 10);
    char pu[32];
    one_pu_cpuset(pu, sizeof pu);
    c.cpuset = pu;
    recorder *r = calloc(1, sizeof *r);
    st_train_config cr = c;
    cr.weights = ST_WEIGHTS_PRIVATE;
    st_epoch_record fr = train_recorded(&cr, &train, &test, r);
    st_epoch_record f = train_recorded(&c, &train, &test, r);
    size_t P = st_model_config_param_count(&c.model);
    cr_assert_eq(f.workers, 2);
    cr_assert_float_eq(f.ring_bytes_per_worker_step, 2.0 * 1 / 2 * (double)P * 4, 1.0);
    double busiest = 0.0, busiest_replica = 0.0;
    for (int w = 0; w < 2; w++) {
        st_range s = shard_of(P, 2, w);
        busiest = fmax(busiest, 4.0 * 3.0 * (double)(s.end - s.begin));
        busiest_replica = fmax(busiest_replica,
                               4.0 * (3.0 * (double)(s.end - s.begin) + 2.0 * (double)P));
    }
    cr_assert_eq(f.comm_bytes_per_worker_step, busiest, "%.0f bytes a step, %zu parameters "
                 "make %.0f", f.comm_bytes_per_worker_step, P, busiest);
    cr_assert_eq(fr.comm_bytes_per_worker_step, busiest_replica, "a replica per worker: %.0f "
                 "bytes a step, %zu parameters make %.0f", fr.comm_bytes_per_worker_step, P,
                 busiest_replica);
    cr_assert_eq(f.comm_bytes_per_worker_round, 0.0, "no rounds in dp");
    cr_assert_gt(f.step_ms_compute, 0.0);
    cr_assert_gt(f.step_ms_reduce, 0.0);
    cr_assert_gt(f.step_ms_optimizer, 0.0);
    /* ZeRO-1: a worker keeps the optimizer state of its shard only. */
    cr_assert_lt(f.memory.peak[ST_MEM_OPTIMIZER], 2 * P * sizeof(float) * 3 / 4,
                 "optimizer state %zu bytes for %zu parameters", f.memory.peak[ST_MEM_OPTIMIZER], P);
    free(r);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

Test(dp, more_workers_than_cpus_needs_oversubscribe)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_topology *t;
    cr_assert_eq(st_topology_load(NULL, &t), ST_OK, "%s", st_last_error());
    int pus = st_topology_pu_count(t);
    st_topology_destroy(t);
    st_train_config c = dp_config(pus + 1, 8, 2);
    c.oversubscribe = 0;
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, NULL), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "--oversubscribe"), "%s", st_last_error());
    c.oversubscribe = 1;
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, NULL), ST_OK, "%s", st_last_error());
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* ------------------------------------------------------------ --init */

/* A run started from another run's final weights (init_params) with a
 * negligible learning rate evaluates as that run ended, whatever the
 * strategy: every worker's subnetwork and every shard owner start from
 * those weights, not from the seed's. */
Test(init, runs_start_from_the_given_weights, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = dp_config(2, 32, 60);
    params_out o = { 0 };
    st_train_callbacks cb = { .on_params = keep_params, .user = &o };
    st_epoch_record first;
    cr_assert_eq(st_train_run(&c, &train, &test, &cb, &first), ST_OK, "%s", st_last_error());
    const st_strategy strategies[3] = { ST_STRATEGY_DP, ST_STRATEGY_SDP, ST_STRATEGY_SDP };
    const st_masking masking[3] = { ST_MASKING_FORWARD, ST_MASKING_FORWARD, ST_MASKING_BACKWARD };
    for (int k = 0; k < 3; k++) {
        st_train_config d = c;
        d.strategy = strategies[k];
        d.sdp.masking = masking[k];
        d.steps = 1;
        d.optim.lr = 1e-12f;
        d.seed = 99;   /* another seed: its initial values must not be used */
        d.init_params = o.p;
        st_epoch_record f;
        cr_assert_eq(st_train_run(&d, &train, &test, NULL, &f), ST_OK, "%s", st_last_error());
        cr_assert_float_eq(f.test_loss, first.test_loss, 1e-6 * first.test_loss,
                           "strategy %d: %.9f, the weights' %.9f", k, f.test_loss,
                           first.test_loss);
    }
    st_train_config s = c;
    s.strategy = ST_STRATEGY_SYNTH;
    s.init_params = o.p;
    cr_assert_eq(st_train_config_check(&s), ST_ERR_INVALID);
    free(o.p);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/*
 * tests/test_train_hotpath.c — the hot path: a training step makes no heap
 * call of subtrain's own, on one worker, with data parallelism, neuron
 * subnetworks, synth's segment groups, a transformer and a vision transformer,
 * and with activation recomputation.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <omp.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include <subtrain/subtrain.h>
#include "train_check.h"
#include "nn/dnnl_util.h"
#include "train/worker.h"

/* ------------------------------------------------------------ hot path */

/* Counts heap calls made on the armed thread: the test binary's malloc
 * family interposes the C library's for the whole process (heapwatch.h) and
 * forwards to it; calls made while oneDNN executes are counted apart.  The
 * assertion is on subtrain's own code; oneDNN's count is reported (and
 * checked to be what the argument map explains, so that a change there is
 * noticed). */
#define HEAPWATCH_PER_THREAD
#include "heapwatch.h"

Test(train, a_training_step_makes_no_heap_allocation)
{
    HEAPWATCH_SKIP_IF_OFF();
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = small_config(st_model_kind_named("resmlp"));
    st_schedule sched = { ST_SCHED_WARMUP_COSINE, 1e-3f, 5, 100 };
    long own = -1, in_onednn = -1, execs = 0;
    st_status s = ST_OK;
#pragma omp parallel num_threads(1)
    {
        omp_set_num_threads(1);
        st_worker w;
        s = st_worker_init(&w, 0, &c, train.count, NULL);
        if (s == ST_OK)
            s = st_worker_init_optimizer(&w, &c, 0, st_model_param_count(w.model));
        st_epoch_order(c.seed, 0, w.order, train.count);
        float loss, lr;
        /* The first steps may let oneDNN set up its per-thread state. */
        for (uint64_t t = 1; t <= 3 && s == ST_OK; t++)
            s = st_worker_train_step(&w, &train, w.order, (uint32_t)(t * 32), &sched, t, &loss, &lr);
        armed = 1;
        for (uint64_t t = 4; t <= 40 && s == ST_OK; t++)
            s = st_worker_train_step(&w, &train, w.order, (uint32_t)(t * 32), &sched, t, &loss, &lr);
        armed = 0;
        own = own_calls;
        in_onednn = dnnl_calls;
        execs = executes;
        st_worker_destroy(&w);
    }
    cr_assert_eq(s, ST_OK, "%s", st_last_error());
    cr_assert_gt(execs, 0, "the interposer saw the primitives run");
    cr_assert_eq(own, 0, "37 training steps: subtrain called the heap %ld times", own);
    cr_log_info("oneDNN: %ld heap calls in %ld primitive executions", in_onednn, execs);
    /* The argument map: a bucket array and a node per argument, at most. */
    cr_assert_leq(in_onednn, execs * (ST_PRIM_MAX_ARGS + 2),
                  "oneDNN allocated more than its argument maps explain");
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* The data-parallel step (compute, barrier, reduce-scatter, shard update,
 * all-gather) makes no heap call of its own either.  The callbacks run on
 * worker 0's thread, between its steps: they arm the counter after step 3
 * and read it at the end of the epoch.  Worker 1 runs the same code. */
typedef struct heap_watch {
    long own, onednn, execs;
    int done;
} heap_watch;

static void watch_step(const st_step_info *info, void *user)
{
    (void)user;
    if (info->step == 3) {
        own_calls = dnnl_calls = executes = 0;
        armed = 1;
    }
}

static void watch_epoch(const st_epoch_record *rec, void *user)
{
    heap_watch *h = user;
    (void)rec;
    if (h->done)
        return;
    armed = 0;
    h->done = 1;
    h->own = own_calls;
    h->onednn = dnnl_calls;
    h->execs = executes;
}

/* Worker 0 after step 3 of a 40-step run of c, evaluation included:
 * subtrain itself must make no heap call. */
static void assert_no_heap_call_on(const st_train_config *c, const st_dataset *train,
                                   const st_dataset *test, const char *what);

static void assert_steps_make_no_heap_call(const st_train_config *c, const char *what)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    assert_no_heap_call_on(c, &train, &test, what);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

static void assert_no_heap_call_on(const st_train_config *c, const st_dataset *train,
                                   const st_dataset *test, const char *what)
{
    heap_watch h = { 0 };
    st_train_callbacks cb = { .on_step = watch_step, .on_epoch = watch_epoch, .user = &h };
    cr_assert_eq(st_train_run(c, train, test, &cb, NULL), ST_OK, "%s", st_last_error());
    cr_assert(h.done);
    cr_assert_gt(h.execs, 0, "the interposer saw worker 0's primitives run");
    cr_log_info("%s, worker 0, steps 4-40 and the evaluation: subtrain %ld heap calls, oneDNN "
                "%ld in %ld executions", what, h.own, h.onednn, h.execs);
    cr_assert_eq(h.own, 0, "%s: worker 0 called the heap %ld times in 37 steps", what, h.own);
}

Test(dp, a_data_parallel_step_makes_no_heap_allocation, .timeout = 60)
{
    HEAPWATCH_SKIP_IF_OFF();
    st_train_config c = dp_config(2, 32, 40);
    assert_steps_make_no_heap_call(&c, "data parallelism");
    /* the last micro-batch's mean taken per part during its backward */
    c.accumulate = 2;
    assert_steps_make_no_heap_call(&c, "data parallelism, 2 micro-batches");
}

/* Random-k (--compress randk:Q): the draw, the pack, the packed
 * engine's reduce-scatter and the spread; with error feedback too. */
Test(dp, a_randk_step_makes_no_heap_allocation, .timeout = 60)
{
    HEAPWATCH_SKIP_IF_OFF();
    st_train_config c = dp_config(2, 32, 40);
    c.dp.compress = ST_COMPRESS_RANDK;
    c.dp.keep = 0.25f;
    assert_steps_make_no_heap_call(&c, "randk 0.25");
    c.dp.error_feedback = 1;
    assert_steps_make_no_heap_call(&c, "randk 0.25, error feedback");
}

/* The hot path of neuron subnetworks: compact models, compact attachment,
 * per-run weight-gradient products, skipped unheld weights. */
Test(sdp_neuron, a_step_makes_no_heap_allocation, .timeout = 60)
{
    HEAPWATCH_SKIP_IF_OFF();
    st_train_config c = neuron_sdp_config(st_model_kind_named("resmlp"), 2, 0.5, 40);
    c.batch = 32;
    assert_steps_make_no_heap_call(&c, "sdp neuron forward (resmlp)");
    c.sdp.masking = ST_MASKING_BACKWARD;
    assert_steps_make_no_heap_call(&c, "sdp neuron backward (resmlp)");
    c = neuron_sdp_config(st_model_kind_named("mlp"), 2, 0.5, 40);
    c.batch = 32;
    assert_steps_make_no_heap_call(&c, "sdp neuron forward (mlp, unheld weights)");
}

/* Forward-masked subnetworks with a bf16 master: the updates write the
 * owners' bf16 master shards, the all-gather brings them into the compact
 * copies, evaluation widens them: no heap call either (neurons of an mlp,
 * with unheld weights; resmlp's blocks). */
Test(sdp_neuron, a_bf16_master_step_makes_no_heap_allocation, .timeout = 60)
{
    HEAPWATCH_SKIP_IF_OFF();
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 matmul on this CPU");
    st_train_config c = neuron_sdp_config(st_model_kind_named("mlp"), 2, 0.5, 40);
    c.batch = 32;
    c.model.precision = ST_PRECISION_BF16;
    c.bf16_emulated = 1;
    c.optim.master = ST_MASTER_BF16_SR;
    assert_steps_make_no_heap_call(&c, "sdp neuron forward, bf16 master (mlp, unheld weights)");
    c.model.kind = st_model_kind_named("resmlp");
    c.sdp.subnet = ST_SUBNET_BLOCK;
    assert_steps_make_no_heap_call(&c, "sdp block forward, bf16 master (resmlp)");
}

/* synth's segment groups: each group's data parallelism over its segment
 * network, reduced and updated during the backward. */
Test(synth, a_segment_group_step_makes_no_heap_allocation, .timeout = 60)
{
    HEAPWATCH_SKIP_IF_OFF();
    st_train_config c = dp_config(4, 32, 0);
    c.strategy = ST_STRATEGY_SYNTH;
    c.model.kind = st_model_kind_named("mlp");
    c.model.depth = 3;
    c.epochs = 1;
    c.synth.segments = 2;
    c.synth.recovery_epochs = 0;
    assert_steps_make_no_heap_call(&c, "synth, segment groups of 2");
}

Test(gpt, a_step_makes_no_heap_allocation, .timeout = 60)
{
    HEAPWATCH_SKIP_IF_OFF();
    st_text t = gpt_text(30000);
    st_dataset train, test;
    cr_assert_eq(st_text_dataset(&t, 16, 1, 0, 1024, &train, &test), ST_OK);
    st_train_config c = gpt_train_config(2, 40);
    assert_no_heap_call_on(&c, &train, &test, "gpt data parallelism");
    st_dataset_free(&train);
    st_dataset_free(&test);
    free(t.bytes);
}

/* A vision transformer (32 features as 2 x 4 x 4 images, patches of 2, a
 * class token): the patch, position and pooling loops and the non-causal
 * attention, under sdp over heads. */
Test(vit, a_step_makes_no_heap_allocation, .timeout = 60)
{
    HEAPWATCH_SKIP_IF_OFF();
    st_train_config c = st_train_config_default();
    c.model = (st_model_config){ .kind = st_model_kind_named("vit"), .depth = 2, .width = 16,
                                 .heads = 2, .patch = 2, .pool = ST_POOL_CLS,
                                 .activation = ST_ACT_GELU, .in_dim = 32, .in_channels = 2,
                                 .in_height = 4, .in_width = 4, .n_classes = 4 };
    c.workers = 2;
    c.oversubscribe = 1;
    c.batch = 16;
    c.steps = 40;
    c.epochs = 0;
    c.neuron_group = 8;   /* one head */
    assert_steps_make_no_heap_call(&c, "vit data parallelism");
    c.strategy = ST_STRATEGY_SDP;
    c.sdp.subnet = ST_SUBNET_NEURON;
    assert_steps_make_no_heap_call(&c, "vit sdp over heads");
}

/* With activation recomputation the backward runs blocks' forwards again
 * with the forward's primitives, in storage laid out at build time: no
 * heap call either, data parallelism and neuron subnetworks in both modes,
 * gpt with its attention recomputed. */
Test(recompute, a_step_makes_no_heap_allocation, .timeout = 120)
{
    HEAPWATCH_SKIP_IF_OFF();
    for (int mode = ST_RECOMPUTE_BLOCKS; mode <= ST_RECOMPUTE_ALL; mode++) {
        st_train_config c = dp_config(2, 32, 40);
        c.model.recompute = (st_recompute)mode;
        assert_steps_make_no_heap_call(&c, st_recompute_name(c.model.recompute));
        c = neuron_sdp_config(st_model_kind_named("resmlp"), 2, 0.5, 40);
        c.batch = 32;
        c.model.recompute = (st_recompute)mode;
        assert_steps_make_no_heap_call(&c, "sdp neuron forward, recompute");
    }
    st_text t = gpt_text(30000);
    st_dataset train, test;
    cr_assert_eq(st_text_dataset(&t, 16, 1, 0, 1024, &train, &test), ST_OK);
    st_train_config c = gpt_train_config(2, 40);
    c.model.recompute = ST_RECOMPUTE_BLOCKS;
    assert_no_heap_call_on(&c, &train, &test, "gpt, recompute blocks");
    st_dataset_free(&train);
    st_dataset_free(&test);
    free(t.bytes);
}

/* --activation-precision bf16: tensors stored as bf16 and the bf16
 * activation passes add no heap call: resmlp (GELU) with data
 * parallelism, with recomputation, and a gpt. */
Test(bf16_activations, a_step_makes_no_heap_allocation, .timeout = 120)
{
    HEAPWATCH_SKIP_IF_OFF();
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 matmul on this CPU");
    st_train_config c = dp_config(2, 32, 40);
    c.model.precision = ST_PRECISION_BF16;
    c.model.activations = ST_PRECISION_BF16;
    c.bf16_emulated = 1;
    assert_steps_make_no_heap_call(&c, "resmlp, bf16 activations");
    c.model.recompute = ST_RECOMPUTE_BLOCKS;
    assert_steps_make_no_heap_call(&c, "resmlp, bf16 activations, recompute blocks");
    st_text t = gpt_text(30000);
    st_dataset train, test;
    cr_assert_eq(st_text_dataset(&t, 16, 1, 0, 1024, &train, &test), ST_OK);
    c = gpt_train_config(2, 40);
    c.model.precision = ST_PRECISION_BF16;
    c.model.activations = ST_PRECISION_BF16;
    c.bf16_emulated = 1;
    assert_no_heap_call_on(&c, &train, &test, "gpt, bf16 activations");
    st_dataset_free(&train);
    st_dataset_free(&test);
    free(t.bytes);
}

/* --weight-layout blocked: the update packing the blocked weight copies
 * (one worker, its own vector) and the layers' reorders into them (two
 * workers: the engine's update writes no blocked copy) add no heap call. */
Test(bf16_weights, a_blocked_step_makes_no_heap_allocation, .timeout = 120)
{
    HEAPWATCH_SKIP_IF_OFF();
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 matmul on this CPU");
    for (int w = 1; w <= 2; w++) {
        st_train_config c = dp_config(w, 32, 40);
        c.model.precision = ST_PRECISION_BF16;
        c.model.weight_layout = ST_WEIGHT_LAYOUT_BLOCKED;
        c.bf16_emulated = 1;
        assert_steps_make_no_heap_call(&c, w == 1 ? "resmlp, blocked weights, 1 worker"
                                                  : "resmlp, blocked weights, 2 workers");
    }
}

/* --activation-precision bf16 on CNNs: the bf16 blocked tensors and
 * gradients between convolutions, batch norms and pools add no heap call,
 * a ResNet and a convnet under data parallelism (2 x 4 x 4 images), and
 * with the tensors channels last (AMX's layout) the same. */
Test(bf16_activations, a_cnn_step_makes_no_heap_allocation, .timeout = 120)
{
    HEAPWATCH_SKIP_IF_OFF();
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 kernels on this CPU");
    const char *kinds[2] = { "resnet", "convnet" };
    for (int k = 0; k < 2; k++) {
        st_train_config c = dp_config(2, 16, 40);
        c.model = (st_model_config){ .kind = st_model_kind_named(kinds[k]), .depth = 2,
                                     .width = 16, .activation = ST_ACT_RELU, .in_dim = 32,
                                     .in_channels = 2, .in_height = 4, .in_width = 4,
                                     .n_classes = 4, .precision = ST_PRECISION_BF16,
                                     .activations = ST_PRECISION_BF16 };
        c.bf16_emulated = 1;
        assert_steps_make_no_heap_call(&c, kinds[k]);
        c.model.tensor_layout = ST_TENSOR_LAYOUT_NHWC;
        assert_steps_make_no_heap_call(&c, kinds[k]);
    }
}

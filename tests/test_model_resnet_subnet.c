/*
 * tests/test_model_resnet_subnet.c — ResNet subnetworks of channels and of blocks:
 * gradient checks, backward masking, and their step's heap calls.
 *
 * The small models and the gradient check: tests/model_check.h.
 */
#define _GNU_SOURCE /* RTLD_NEXT, for heapwatch.h */
#include "model_check.h"

/* Heap calls of the armed thread. */
#define HEAPWATCH_PER_THREAD
#include "heapwatch.h"
#include "model_heapwatch.h"

/* ------------------------------------------------------------ resnet subnetworks */

/* resnet d2 w4 on 2x6x6: four identity blocks (groups 0, 1 in stage 0, 2
 * and 3 after the projections of stages 1 and 2), whose width units have
 * 4, 4, 8 and 16 channels: 2, 2, 4 and 8 units of 2 channels.  Kept: the
 * first, the last, a scattered set with an adjacent pair, and four
 * scattered units. */
static const int RESNET_COUNT[] = { 1, 1, 3, 4 };
static const int RESNET_KEPT[] = { 0, 1, 0, 2, 3, 1, 2, 5, 7 };

static st_model_config resnet_small(void)
{
    st_model_config c = resnet_config(st_model_kind_named("resnet"), 2, 4, 2, 6, 6);
    c.activation = ST_ACT_GELU;
    return c;
}

static st_model_config resnet_neuron_config(int grads_only)
{
    st_model_config c = resnet_small();
    c.subnet.unit_size = 2;
    c.subnet.width_count = RESNET_COUNT;
    c.subnet.width_kept = RESNET_KEPT;
    c.subnet.width_grads_only = grads_only;
    return c;
}

/* The training loss (batch norm: batch statistics), as the resnet check
 * above, at a smaller step. */
/* The finite-difference step of these checks.  Depth 2 with batch norms
 * is less smooth than the d1 check above: at the GELU step (1e-2) even
 * the full model's truncation error exceeds the tolerance (measured up to
 * 2x), at 3e-3 still for a scaled neuron subnetwork (4.7x); at 1e-3 every
 * segment passes with the worst ratio <= 0.8, and the rounding noise,
 * ~ 2e-8 / 2h = 1e-5, stays below atol. */
#define FD_STEP_RESNET 1e-3

static void resnet_gradcheck(const st_model_config *c, const char *tag, uint64_t seed)
{
    omp_set_num_threads(1);
    objective_train = 1;
    fd_step = FD_STEP_RESNET;
    gradcheck(c, tag, seed);
    fd_step = 0.0;
    objective_train = 0;
}

/* Forward masking of channel units: conv1 holds the kept output channels
 * (rows), bn1 their gamma and beta, conv2 the kept input channels
 * (columns); conv2 reads a subset of a width unit and closes its block,
 * so the branch scale multiplies it, forward and backward. */
Test(gradcheck, resnet_neuron_subnetwork_scaled)
{
    st_model_config c = resnet_neuron_config(0);
    c.subnet.scale = 2.0f;
    resnet_gradcheck(&c, "resnet d2 w4 neuron subnetwork (branch x2)", 81);
}

/* A block subnetwork: blocks 1 and 3 are the identity, the kept blocks'
 * conv2 is scaled. */
Test(gradcheck, resnet_block_subnetwork_scaled)
{
    st_model_config c = resnet_small();
    const int ids[] = { 0, 2 };
    c.subnet.groups = ids;
    c.subnet.n_groups = 2;
    c.subnet.scale = 2.0f;
    resnet_gradcheck(&c, "resnet d2 w4 blocks {0, 2} (branch x2)", 83);
}

/* Scale 0 (none) and 1 are the same model, to the bit: no post-op and no
 * loop. */
Test(model, resnet_branch_scale_one_is_plain)
{
    check_scale_one_is_plain(resnet_small());
}

/* Backward masking (cfg: of channel units or of blocks): the full model's
 * forward (the same loss, to the bit), and where the ranges say a
 * gradient lives, the full model's gradient.  Returns the worst relative
 * difference. */
static double check_resnet_backward(const st_model_config *cfg, const char *tag)
{
    omp_set_num_threads(1);
    st_arena a;
    st_arena_init(&a, "resnet bwd", NULL, 0);
    st_model_config full_cfg = *cfg;
    memset(&full_cfg.subnet, 0, sizeof full_cfg.subnet);
    st_model *full = make_model(&full_cfg, 8, &a), *m = make_model(cfg, 8, &a);
    cr_assert_eq(st_model_param_count(m), st_model_param_count(full));
    cr_assert_lt(st_model_grad_count(m), st_model_param_count(m));
    st_model_init_params(full, 5);
    st_model_init_params(m, 5);
    st_rng r = st_rng_seed(6);
    jitter_norms(full, &r);
    fill_rows(full, 0, 8, &r);
    r = st_rng_seed(6);
    jitter_norms(m, &r);
    fill_rows(m, 0, 8, &r);
    float lf, lm;
    OK(st_model_forward_backward(full, &lf));
    OK(st_model_forward_backward(m, &lm));
    cr_assert_eq(lf, lm, "%s: the forward is the full model's", tag);
    size_t covered;
    int n;
    double worst = kept_grad_diff(m, full, &covered, &n);
    cr_assert_eq(covered, st_model_grad_count(m));
    fprintf(stderr, "%s: %zu of %zu gradients in %d ranges, max rel diff %.3g\n", tag, covered,
            st_model_param_count(m), n, worst);
    cr_assert_lt(worst, 1e-5, "%s: the kept gradients are the full model's (%g)", tag, worst);
    st_model_destroy(m);
    st_model_destroy(full);
    st_arena_release(&a);
    return worst;
}

/* Channel units: conv1's kept rows, bn1's kept channels, conv2's kept
 * columns (9 per channel) get gradients; everything outside the blocks'
 * units gets all of them.  The weight passes stay whole (oneDNN computes
 * the full dW, the kept part is copied out): the FLOPs are the full
 * model's. */
Test(subnetwork, neuron_backward_masking_resnet)
{
    st_model_config c = resnet_neuron_config(1);
    check_resnet_backward(&c, "resnet neuron backward masking");
    st_model_config full_cfg = resnet_small();
    st_arena a;
    st_arena_init(&a, "resnet flops", NULL, 0);
    st_model *m = make_model(&c, 8, &a), *full = make_model(&full_cfg, 8, &a);
    cr_assert_eq(st_model_step_flops(m), st_model_step_flops(full));
    /* conv2 of block 2 (8 channels, 3 kept units of 2): 8 x 6 x 9 */
    int ns;
    const st_param_segment *s = st_model_segments(m, &ns);
    int seen = 0;
    for (int i = 0; i < ns; i++)
        if (strcmp(s[i].name, "stage1.block1.conv2.weight") == 0) {
            cr_assert_eq(s[i].grad_count, 8 * 6 * 9);
            cr_assert_eq(s[i].count, 8 * 8 * 9);
            seen++;
        } else if (strcmp(s[i].name, "stage1.block1.conv1.weight") == 0) {
            cr_assert_eq(s[i].grad_count, 6 * 8 * 9);
            seen++;
        } else if (strcmp(s[i].name, "stage1.block1.bn1.gamma") == 0) {
            cr_assert_eq(s[i].grad_count, 6);
            seen++;
        }
    cr_assert_eq(seen, 3);
    st_model_destroy(m);
    st_model_destroy(full);
    st_arena_release(&a);
}

/* Blocks: the kept blocks' gradients are the full model's. */
Test(subnetwork, block_backward_masking_resnet)
{
    st_model_config c = resnet_small();
    const uint8_t keep[] = { 1, 0, 0, 1 };
    c.subnet.group_grads = keep;
    check_resnet_backward(&c, "resnet block backward masking");
}

/* A masked resnet's step (forward masking, backward masking of channels
 * and of blocks, each with a branch scale: post-ops, the scale loops and
 * the gathers), and a bf16 one's, makes no heap call of subtrain's.  No Criterion call
 * while armed. */
Test(subnetwork, masked_resnet_forward_and_backward_make_no_heap_call)
{
    HEAPWATCH_SKIP_IF_OFF();
    omp_set_num_threads(1);
    const uint8_t keep[] = { 1, 0, 0, 1 };
    st_model_config cfgs[4] = { resnet_neuron_config(0), resnet_neuron_config(1), resnet_small(),
                                resnet_config(st_model_kind_named("resnet"), 1, 16, 3, 8, 8) };
    cfgs[2].subnet.group_grads = keep;
    /* and a bf16 resnet (its conversions, the buffer in passing) */
    cfgs[3].precision = ST_PRECISION_BF16;
    const int n = st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE ? 3 : 4;
    for (int k = 0; k < n; k++) {
        if (k < 3)
            cfgs[k].subnet.scale = 2.0f;
        watch_model_steps(&cfgs[k], "resnet heap");
        cr_expect_eq(own_calls, 0, "masked resnet %d: subtrain called the heap %ld times in 3 "
                     "steps", k, own_calls);
        fprintf(stderr, "[heap] masked resnet %d, 3 steps: subtrain %ld heap calls; oneDNN %ld "
                "in %ld executions\n", k, own_calls, dnnl_calls, executes);
    }
}

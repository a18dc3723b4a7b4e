/*
 * tests/test_fusion.c — each fusion against its separate pass
 * (st_model_config.unfuse, --unfuse): the same steps give bitwise the same
 * losses, gradients and weights, in fp32 and in bf16; the fused step runs
 * one primitive fewer per fused activation, and calls the heap no more
 * than the unfused one (never).  The bias is the exception: the matmul's
 * bias argument and a separate add round differently (to 1 ulp).
 */
#define _GNU_SOURCE /* RTLD_NEXT, for heapwatch.h */
#include "model_check.h"

#define HEAPWATCH_PER_THREAD
#include "heapwatch.h"

/* Activation layers whose ReLU a linear layer runs as a post-op. */
static int fused_relus(const st_model *m)
{
    int n = 0;
    for (int i = 0; i < m->n_layers; i++)
        n += m->layers[i].kind == &st_layer_activation && m->layers[i].u.act.fused;
    return n;
}

/* Fused ReLUs whose backward the next linear layer runs (a mask post-op). */
static int folded_relus(const st_model *m)
{
    int n = 0;
    for (int i = 0; i < m->n_layers; i++)
        n += m->layers[i].kind == &st_layer_activation && m->layers[i].u.act.mask;
    return n;
}

/* GELUs whose backward the next linear layer runs (a multiply by gelu'(x)). */
static int folded_gelus(const st_model *m)
{
    int n = 0;
    for (int i = 0; i < m->n_layers; i++)
        n += m->layers[i].kind == &st_layer_activation && m->layers[i].u.act.deriv;
    return n;
}

/* Batch norms that run their ReLU (fuse_norm_relu). */
static int bn_relus(const st_model *m)
{
    int n = 0;
    for (int i = 0; i < m->n_layers; i++)
        n += m->layers[i].kind == &st_layer_batchnorm && m->layers[i].u.bn.fuse_relu;
    return n;
}

typedef struct run {
    float loss[4];
    long executes[4], heap[4];
} run;

/* 4 steps of forward, backward, AdamW (writing the bf16 weight copies
 * where the model lists them) and an evaluation, from seed 21. */
static void train(st_model *m, st_optim *o, run *r)
{
    st_rng g = st_rng_seed(21);
    const int B = st_model_batch(m);
    for (int step = 0; step < 4; step++) {
        fill_rows(m, 0, B, &g);
        own_calls = 0;
        executes = 0;
        armed = step >= 1;   /* the first lets oneDNN set up its thread */
        st_status st = st_model_forward_backward(m, &r->loss[step]);
        armed = 0;
        cr_assert_eq(st, ST_OK, "%s", st_last_error());
        r->executes[step] = executes;
        r->heap[step] = own_calls;
        int n, ns;
        const st_param_copy *cp = st_model_copies(m, &n);
        const st_param_segment *sg = st_model_segments(m, &ns);
        st_optim_update_copies(o, st_model_params(m), st_model_grads(m), sg, ns, 0,
                               st_model_param_count(m), (uint64_t)step + 1, 1e-2f, cp, n);
        st_model_copies_written(m);
        double sum = 0;
        int64_t hits = 0;
        OK(st_model_evaluate(m, B, &sum, &hits));
    }
}

/* cfg fused (unfuse 0) and with `unfuse`: bitwise equal steps; the fused
 * model has `fused(m)` > 0 fusions, the unfused none, and its steps run
 * `fewer` primitives fewer per fusion (the separate layer's). */
/* Models 0 (cfg) and 1 (cfg with `unfuse`), each trained by train() from
 * the same weights; nf: fused(m) of each. */
typedef struct pair {
    st_arena a[2];
    st_model *m[2];
    st_optim o[2];
    run r[2];
    int nf[2];
} pair;

static void train_pair(pair *p, st_model_config cfg, unsigned unfuse,
                       int (*fused)(const st_model *))
{
    st_optim_config oc = st_optim_config_default();
    for (int j = 0; j < 2; j++) {
        st_model_config c = cfg;
        c.unfuse = j ? unfuse : 0;
        st_arena_init(&p->a[j], "fusion", NULL, 0);
        p->m[j] = make_model(&c, 4, &p->a[j]);
        st_model_init_params(p->m[j], 17);
        OK(st_optim_init(&p->o[j], &oc, st_model_param_count(p->m[j]), &p->a[j]));
        train(p->m[j], &p->o[j], &p->r[j]);
        p->nf[j] = fused(p->m[j]);
    }
}

static void release_pair(pair *p)
{
    for (int j = 0; j < 2; j++) {
        st_model_destroy(p->m[j]);
        st_arena_release(&p->a[j]);
    }
}

static void check_fusion(st_model_config cfg, unsigned unfuse, int (*fused)(const st_model *),
                         int fewer, const char *tag)
{
    pair p;
    train_pair(&p, cfg, unfuse, fused);
    st_model **m = p.m;
    run *r = p.r;
    const int *nf = p.nf;
    cr_assert_gt(nf[0], 0, "%s: nothing fused", tag);
    cr_assert_eq(nf[1], 0, "%s: %d fused under --unfuse", tag, nf[1]);
    for (int step = 0; step < 4; step++)
        cr_expect_eq(memcmp(&r[0].loss[step], &r[1].loss[step], sizeof(float)), 0,
                     "%s: step %d's loss %.9g fused, %.9g unfused", tag, step + 1,
                     r[0].loss[step], r[1].loss[step]);
    cr_expect_eq(memcmp(st_model_grads(m[0]), st_model_grads(m[1]),
                        m[0]->n_grads * sizeof(float)), 0, "%s: the gradients differ", tag);
    cr_expect_eq(memcmp(st_model_params(m[0]), st_model_params(m[1]),
                        st_model_param_count(m[0]) * sizeof(float)), 0,
                 "%s: the weights differ after 4 steps", tag);
    for (int step = 1; step < 4 && HEAPWATCH_ACTIVE; step++) {
        cr_expect_eq(r[0].executes[step], r[1].executes[step] - fewer * nf[0],
                     "%s: step %d ran %ld primitives fused, %ld unfused (%d fusions)", tag,
                     step + 1, r[0].executes[step], r[1].executes[step], nf[0]);
        for (int j = 0; j < 2; j++)
            cr_expect_eq(r[j].heap[step], 0, "%s (%s): step %d called the heap %ld times",
                         tag, j ? "unfused" : "fused", step + 1, r[j].heap[step]);
    }
    release_pair(&p);
}

static int bf16_runs(void)
{
    return st_bf16_probe(NULL) != ST_BF16_UNAVAILABLE;
}

/* A ReLU after a linear layer as the matmul's post-op (mlp's layers,
 * resmlp's and gpt's inner layers): max(0, y) computed in registers gives
 * the separate eltwise pass's values, and its backward as the mask
 * post-op of the next layer's backward-data product the backward from
 * the input. */
Test(fusion, relu_post_op_is_bitwise_the_separate_relu)
{
    omp_set_num_threads(1);
    st_model_config gpt = gpt_config(2, 8, 2, 6);
    gpt.activation = ST_ACT_RELU;
    const st_model_config cfgs[3] = { mlp_config(3, 20, ST_ACT_RELU),
                                      resmlp_config(3, 16, 24, ST_ACT_RELU), gpt };
    const char *names[3] = { "mlp", "resmlp", "gpt" };
    for (int bf16 = 0; bf16 <= bf16_runs(); bf16++)
        for (int k = 0; k < 3; k++) {
            st_model_config c = cfgs[k];
            c.precision = bf16 ? ST_PRECISION_BF16 : ST_PRECISION_FP32;
            char tag[48];
            snprintf(tag, sizeof tag, "%s %s", names[k], bf16 ? "bf16" : "fp32");
            /* the ReLU's forward (bf16: it keeps its copy either way); folded,
             * the mask replaces the ReLU's forward (bf16: and its copy's two
             * conversions), and its backward is gone */
            check_fusion(c, ST_UNFUSE_RELU, fused_relus, bf16 ? 3 : 1, tag);
        }
}

/* The fused ReLU's backward folded into the next layer's backward-data
 * product (resmlp's and gpt's fc2, an mlp's next hidden layer or head; a
 * binary multiply by the mask y > 0) against its own eltwise backward
 * (--unfuse relu-backward): the mask pass replaces the backward pass in
 * fp32, and in bf16 also the kept copy's two conversions. */
Test(fusion, relu_backward_mask_post_op_is_bitwise_the_separate_backward)
{
    omp_set_num_threads(1);
    st_model_config gpt = gpt_config(2, 8, 2, 6);
    gpt.activation = ST_ACT_RELU;
    const st_model_config cfgs[3] = { resmlp_config(3, 16, 24, ST_ACT_RELU), gpt,
                                      mlp_config(3, 20, ST_ACT_RELU) };
    const char *names[3] = { "resmlp", "gpt", "mlp" };
    for (int bf16 = 0; bf16 <= bf16_runs(); bf16++)
        for (int k = 0; k < 3; k++) {
            st_model_config c = cfgs[k];
            c.precision = bf16 ? ST_PRECISION_BF16 : ST_PRECISION_FP32;
            char tag[48];
            snprintf(tag, sizeof tag, "%s %s", names[k], bf16 ? "bf16" : "fp32");
            check_fusion(c, ST_UNFUSE_RELU_BACKWARD, folded_relus, bf16 ? 2 : 0, tag);
        }
}

/* --activation-precision bf16: a GELU's backward folded into the next
 * layer's backward-data product (resmlp's and gpt's fc2: a binary multiply
 * by gelu'(x), which the GELU's own pass wrote over x) against oneDNN's
 * bf16 eltwise backward (--unfuse gelu-backward).  Not bitwise: the fold
 * rounds the product times gelu'(x) once, the pass rounds the product and
 * then its product with gelu'(x).  The same steps' losses within 5e-3,
 * the gradients' cosine above 0.999 after 4 steps; two primitives fewer
 * per fold (the GELU's forward and backward: its pass is no primitive);
 * no heap call. */
Test(fusion, gelu_backward_folded_into_the_next_product)
{
    if (st_bf16_probe(NULL) != ST_BF16_NATIVE)
        cr_skip_test("no native bf16 on this CPU");
    omp_set_num_threads(1);
    const st_model_config cfgs[2] = { resmlp_config(3, 16, 24, ST_ACT_GELU),
                                      gpt_config(2, 8, 2, 6) };
    const char *names[2] = { "resmlp", "gpt" };
    for (int k = 0; k < 2; k++) {
        st_model_config c = cfgs[k];
        c.precision = ST_PRECISION_BF16;
        c.activations = ST_PRECISION_BF16;
        pair p;
        train_pair(&p, c, ST_UNFUSE_GELU_BACKWARD, folded_gelus);
        st_model **m = p.m;
        run *r = p.r;
        const int *nf = p.nf;
        cr_expect_eq(nf[0], cfgs[k].depth, "%s: %d GELUs folded", names[k], nf[0]);
        cr_expect_eq(nf[1], 0, "%s: %d folded under --unfuse", names[k], nf[1]);
        for (int step = 0; step < 4; step++)
            cr_expect(fabsf(r[0].loss[step] - r[1].loss[step]) <= 5e-3f * fabsf(r[1].loss[step]),
                      "%s: step %d's loss %.9g folded, %.9g unfolded", names[k], step + 1,
                      r[0].loss[step], r[1].loss[step]);
        double dot = 0, n0 = 0, n1 = 0;
        int differ = 0;
        for (size_t i = 0; i < m[0]->n_grads; i++) {
            const double g0 = st_model_grads(m[0])[i], g1 = st_model_grads(m[1])[i];
            dot += g0 * g1;
            n0 += g0 * g0;
            n1 += g1 * g1;
            differ |= g0 != g1;
        }
        const double cosine = dot / sqrt(n0 * n1);
        fprintf(stderr, "[gelu fold] %s: losses %.6f %.6f after 4 steps, gradient cosine %.6f\n",
                names[k], r[0].loss[3], r[1].loss[3], cosine);
        cr_expect(differ, "%s: the gradients are bitwise the unfolded ones (nothing folded?)",
                  names[k]);
        cr_expect_gt(cosine, 0.999, "%s: gradient cosine %.6f against the unfolded",
                     names[k], cosine);
        for (int step = 1; step < 4 && HEAPWATCH_ACTIVE; step++) {
            cr_expect_eq(r[0].executes[step], r[1].executes[step] - 2 * nf[0],
                         "%s: step %d ran %ld primitives folded, %ld unfolded (%d folds)",
                         names[k], step + 1, r[0].executes[step], r[1].executes[step], nf[0]);
            for (int j = 0; j < 2; j++)
                cr_expect_eq(r[j].heap[step], 0, "%s: step %d called the heap %ld times",
                             names[k], step + 1, r[j].heap[step]);
        }
        release_pair(&p);
    }
}

/* Every hidden layer of an mlp folds its ReLU's backward into the next
 * layer's product; under --recompute none does (the next block's
 * recomputed forward reuses the memory of the mask, nn/models/mlp.c), a
 * resmlp's blocks still do (fc1 and fc2 are one block). */
Test(fusion, an_mlp_folds_every_relu_backward_but_under_recompute)
{
    omp_set_num_threads(1);
    for (int mode = 0; mode < 3; mode++)
        for (int k = 0; k < 2; k++) {
            st_model_config c = k ? resmlp_config(3, 16, 24, ST_ACT_RELU)
                                  : mlp_config(3, 20, ST_ACT_RELU);
            c.recompute = (st_recompute)mode;
            st_arena a;
            st_arena_init(&a, "fusion", NULL, 0);
            st_model *m = make_model(&c, 4, &a);
            cr_expect_eq(folded_relus(m), k || mode == ST_RECOMPUTE_NONE ? 3 : 0,
                         "%s, recompute %s: %d folded", k ? "resmlp" : "mlp",
                         st_recompute_name(c.recompute), folded_relus(m));
            st_model_destroy(m);
            st_arena_release(&a);
        }
}

/* --unfuse bias runs the bias as an add after the product, so the ReLU
 * after it cannot be the matmul's post-op either. */
Test(fusion, an_unfused_bias_unfuses_the_relu)
{
    st_arena a;
    st_model *m;
    st_model_config c = mlp_config(2, 8, ST_ACT_RELU);
    c.unfuse = ST_UNFUSE_BIAS;
    st_arena_init(&a, "fusion", NULL, 0);
    m = make_model(&c, 4, &a);
    cr_expect_eq(fused_relus(m), 0);
    st_model_destroy(m);
    st_arena_release(&a);
}

/* A range of an mlp's layers (a segment of --strategy synth) may be cut
 * between a product and its ReLU: it keeps them apart. */
Test(fusion, a_range_of_layers_keeps_the_relu_apart)
{
    st_arena a;
    st_model *m;
    const st_model_config c = mlp_config(3, 8, ST_ACT_RELU);
    st_arena_init(&a, "fusion", NULL, 0);
    m = make_model(&c, 4, &a);
    const int n = m->n_layers;
    cr_expect_eq(fused_relus(m), 3);
    st_model_destroy(m);
    OK(st_model_create_range(&c, 1, n - 1, 4, &a, &m));
    cr_expect_eq(fused_relus(m), 0);
    st_model_destroy(m);
    st_arena_release(&a);
}

/* A batch norm's ReLU (fuse_norm_relu) against a ReLU layer after it,
 * in a ResNet and a plain convnet. */
Test(fusion, bn_relu_is_bitwise_the_separate_relu)
{
    omp_set_num_threads(1);
    const st_model_config cfgs[2] = {
        resnet_config(st_model_kind_named("resnet"), 3, 4, 1, 8, 8),
        resnet_config(st_model_kind_named("convnet"), 2, 4, 1, 8, 8),
    };
    const char *names[2] = { "resnet", "convnet" };
    for (int bf16 = 0; bf16 <= bf16_runs(); bf16++)
        for (int k = 0; k < 2; k++) {
            st_model_config c = cfgs[k];
            c.precision = bf16 ? ST_PRECISION_BF16 : ST_PRECISION_FP32;
            char tag[48];
            snprintf(tag, sizeof tag, "%s %s", names[k], bf16 ? "bf16" : "fp32");
            /* the ReLU layer's forward and backward (bf16: and the
             * conversions of its kept copy) */
            check_fusion(c, ST_UNFUSE_BN_RELU, bn_relus, bf16 ? 4 : 2, tag);
        }
}

/* Linear layers and convolutions that add the skip as a binary post-op. */
static int skips_fused(const st_model *m)
{
    int n = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const st_layer *l = &m->layers[i];
        n += l->residual >= 0 &&
             ((l->kind == &st_layer_linear && !l->u.linear.unfused_residual) ||
              (l->kind == &st_layer_conv && !l->u.conv.residual_pass));
    }
    return n;
}

/* The residual add as a binary post-op of a block's second matmul: the
 * same correctly rounded fp32 sum as the add's own primitive.  (The bias
 * is the matmul's bias argument, which oneDNN adds in its own order: an
 * unfused bias matches it to rounding only, tests/test_layers_linear.) */
Test(fusion, skip_post_op_is_bitwise_the_separate_add)
{
    omp_set_num_threads(1);
    for (int bf16 = 0; bf16 <= bf16_runs(); bf16++) {
        st_model_config c = resmlp_config(3, 16, 24, ST_ACT_GELU);
        c.precision = bf16 ? ST_PRECISION_BF16 : ST_PRECISION_FP32;
        check_fusion(c, ST_UNFUSE_RESIDUAL, skips_fused, 1, bf16 ? "resmlp bf16" : "resmlp fp32");
    }
}

/* A ResNet's identity block: its second convolution adds the skip as a
 * binary post-op where the kernel takes one (a separate add otherwise,
 * as unfused), in fp32, bf16 and with bf16 activations, and scaled as a
 * subnetwork's branch is. */
Test(fusion, a_resnet_skip_post_op_is_bitwise_the_separate_add)
{
    omp_set_num_threads(1);
    for (int k = 0; k < 2 + 2 * bf16_runs(); k++) {
        st_model_config c = resnet_config(st_model_kind_named("resnet"), 2, 16, 1, 8, 8);
        c.precision = k >= 2 ? ST_PRECISION_BF16 : ST_PRECISION_FP32;
        if (k == 3)
            c.activations = ST_PRECISION_BF16;
        if (k == 1)
            c.subnet.scale = 0.5f;
        static const char *const tag[4] = { "resnet fp32", "resnet fp32 scaled", "resnet bf16",
                                            "resnet bf16 activations" };
        check_fusion(c, ST_UNFUSE_RESIDUAL, skips_fused, 1, tag[k]);
    }
}

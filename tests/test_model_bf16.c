/*
 * tests/test_model_bf16.c — bf16 models: shared buffers, no heap call, the
 * same steps from the same seed, and the weight copies the update writes.
 *
 * The small models and the gradient check: tests/model_check.h.
 */
#define _GNU_SOURCE /* RTLD_NEXT, for heapwatch.h */
#include "model_check.h"

#include "core/blocked.h"

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
    st_model_config cfgs[4] = { resmlp_config(3, 16, 24, ST_ACT_GELU),
                                neuron_config(st_model_kind_named("resmlp"), 1),
                                gpt_config(2, 8, 2, 6), vit_config(2, 1, 8, 8, 4, ST_POOL_CLS) };
    for (int k = 0; k < 4; k++) {
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

/* --activation-precision bf16 on CNNs: the tensors between convolutions,
 * batch norms (ReLU fused) and max pools, and their data gradients, are
 * stored bf16 in the blocked layout, so that no reorder runs between those
 * layers: a layer's passes run exactly the reorders of the same model with
 * fp32 activations less one per bf16 tensor it reads (a convolution's x,
 * dy), and a batch norm or a max pool over bf16 runs none.  A ResNet's
 * skip stream (what a join writes and a batch norm reads at a block's
 * start) stays fp32.  Activations and workspace take less memory; the
 * loss is within 2% of the fp32 activations' and the gradients point the
 * same way; two models of one seed give bitwise the same steps, with an
 * evaluation between them, and a step makes no heap call of subtrain's. */
static int cnn_reorders(const st_layer *l)
{
    if (l->kind == &st_layer_conv)
        return st_pass_reorders(&l->u.conv.fwd) + st_pass_reorders(&l->u.conv.bwd_data) +
               st_pass_reorders(&l->u.conv.bwd_weights);
    if (l->kind == &st_layer_batchnorm)
        return st_pass_reorders(&l->u.bn.fwd_train) + st_pass_reorders(&l->u.bn.fwd_infer) +
               st_pass_reorders(&l->u.bn.bwd);
    if (l->kind == &st_layer_maxpool || l->kind == &st_layer_avgpool)
        return st_pass_reorders(&l->u.pool.fwd) + st_pass_reorders(&l->u.pool.bwd);
    return 0;
}

/* Whether each of x, y, dx, dy that the layer has is stored bf16 (want 1)
 * or fp32 (want 0). */
static void expect_halves(const st_model *m, const st_layer *l, int want, const char *what)
{
    const int t[4] = { l->x, l->y, l->dx, l->dy };
    const char *name[4] = { "x", "y", "dx", "dy" };
    for (int k = 0; k < 4; k++)
        if (t[k] >= 0 && t[k] != ST_T_INPUT)
            cr_expect_eq(st_graph_is_half(m, t[k]), want, "%s: %s's %s %s", what, l->name,
                         name[k], want ? "is fp32" : "is bf16");
}

static void check_cnn_bf16_activations(st_model_config c, const char *what)
{
    c.precision = ST_PRECISION_BF16;
    st_model_config f = c;   /* bf16 products, fp32 activations: the reference */
    c.activations = ST_PRECISION_BF16;
    const st_model_config *cfgs[3] = { &c, &c, &f };
    st_arena a[3];
    st_model *m[3];
    for (int j = 0; j < 3; j++) {
        st_arena_init(&a[j], "bf16 activations", NULL, 0);
        m[j] = make_model(cfgs[j], 4, &a[j]);
        st_model_init_params(m[j], 21);
    }
    const int resnet = c.kind == st_model_kind_named("resnet");
    int halves = 0, bns = 0;
    for (int i = 0; i < m[0]->n_layers; i++) {
        const st_layer *l = &m[0]->layers[i], *r = &m[2]->layers[i];
        if (l->dropped)
            continue;
        /* what a ResNet keeps fp32: the stream and what its batch norms
         * at a block's start (bn0, final_bn) read and write */
        const int stream = resnet && (strstr(l->name, "bn0") || !strcmp(l->name, "final_bn"));
        if (l->kind == &st_layer_batchnorm) {
            bns += !stream;
            expect_halves(m[0], l, !stream, what);
        }
        if (l->kind == &st_layer_maxpool)
            expect_halves(m[0], l, 1, what);
        /* the global pool runs in its input's type, all four alike: no
         * reorder of its own (a ResNet's head converts y once) */
        if (l->kind == &st_layer_avgpool) {
            expect_halves(m[0], l, !resnet, what);
            cr_expect_eq(cnn_reorders(l), 0, "%s: %s runs %d reorders", what, l->name,
                         cnn_reorders(l));
        }
        if (l->kind == &st_layer_conv && (!resnet || strstr(l->name, "conv1")))
            cr_expect(st_graph_is_half(m[0], l->y) && st_graph_is_half(m[0], l->dy),
                      "%s: %s writes fp32", what, l->name);
        if (l->kind == &st_layer_conv && strstr(l->name, "conv2"))
            cr_expect(st_graph_is_half(m[0], l->x) && st_graph_is_half(m[0], l->dx),
                      "%s: %s reads fp32", what, l->name);
        /* the reorders: those of fp32 activations less one per bf16 input
         * of a convolution (x forward, dy backward), none left in a batch
         * norm or max pool over bf16 */
        if (l->kind == &st_layer_conv) {
            const int saved = st_graph_is_half(m[0], l->x) + st_graph_is_half(m[0], l->dy);
            cr_expect_eq(cnn_reorders(l), cnn_reorders(r) - saved,
                         "%s: %s runs %d reorders, %d with fp32 activations, %d saved", what,
                         l->name, cnn_reorders(l), cnn_reorders(r), saved);
        }
        if ((l->kind == &st_layer_batchnorm || l->kind == &st_layer_maxpool) &&
            st_graph_is_half(m[0], l->x))
            cr_expect_eq(cnn_reorders(l), 0, "%s: %s reorders bf16", what, l->name);
    }
    for (int t = ST_T_FIRST_FREE; t < m[0]->n_tensors; t++)
        halves += m[0]->tensors[t].data && st_graph_is_half(m[0], t);
    cr_expect_gt(bns, 0, "%s: no batch norm over bf16", what);
    const st_mem_stats s0 = st_arena_stats(&a[0]), s2 = st_arena_stats(&a[2]);
    const size_t mem0 = s0.peak[ST_MEM_ACTIVATIONS] + s0.peak[ST_MEM_WORKSPACE];
    const size_t mem2 = s2.peak[ST_MEM_ACTIVATIONS] + s2.peak[ST_MEM_WORKSPACE];
    cr_expect_lt(mem0, mem2, "%s: activations and workspace %zu bytes, fp32 activations' %zu",
                 what, mem0, mem2);
    /* close to the reference: the loss, and the gradients' direction */
    float first[3];
    for (int j = 0; j < 3; j++) {
        st_rng r = st_rng_seed(22);
        fill_rows(m[j], 0, 4, &r);
        OK(st_model_forward_backward(m[j], &first[j]));
    }
    const size_t G = m[0]->n_grads;
    double dot = 0, n0 = 0, n2 = 0;
    for (size_t i = 0; i < G; i++) {
        const double g0 = st_model_grads(m[0])[i], g2 = st_model_grads(m[2])[i];
        dot += g0 * g2;
        n0 += g0 * g0;
        n2 += g2 * g2;
    }
    const double cosine = dot / sqrt(n0 * n2);
    fprintf(stderr, "[bf16 activations] %s: %d tensors bf16, activations + workspace %.1f KiB "
            "(fp32 activations %.1f KiB), loss %.6f (fp32 activations %.6f), gradient cosine "
            "%.6f\n", what, halves, (double)mem0 / 1024.0, (double)mem2 / 1024.0, first[0],
            first[2], cosine);
    cr_expect(fabsf(first[0] - first[2]) <= 2e-2f * fabsf(first[2]),
              "%s: loss %g, fp32 activations %g", what, first[0], first[2]);
    cr_expect(first[0] != first[2], "%s: the loss of fp32 activations: nothing bf16?", what);
    cr_expect_gt(cosine, 0.99, "%s: gradients far from fp32 activations' (cosine %g)", what,
                 cosine);
    /* the same seed: bitwise the same steps, with no heap call */
    float loss[2][3];
    for (int j = 0; j < 2; j++) {
        st_rng r = st_rng_seed(23);
        for (int step = 0; step < 3; step++) {
            fill_rows(m[j], 0, 4, &r);
            own_calls = 0;
            armed = step >= 1;   /* the first lets oneDNN set up its thread */
            st_status st = st_model_forward_backward(m[j], &loss[j][step]);
            armed = 0;
            cr_assert_eq(st, ST_OK, "%s", st_last_error());
            if (HEAPWATCH_ACTIVE && step >= 1)
                cr_expect_eq(own_calls, 0, "%s: a step called the heap %ld times", what,
                             own_calls);
            double sum = 0;
            int64_t hits = 0;
            OK(st_model_evaluate(m[j], 4, &sum, &hits));
        }
    }
    cr_assert_eq(memcmp(loss[0], loss[1], sizeof loss[0]), 0,
                 "%s: the same seed gave other losses", what);
    cr_assert_eq(memcmp(st_model_grads(m[0]), st_model_grads(m[1]), G * sizeof(float)), 0,
                 "%s: the same seed gave other gradients", what);
    for (int j = 0; j < 3; j++) {
        st_model_destroy(m[j]);
        st_arena_release(&a[j]);
    }
}

Test(bf16, cnn_activations_stay_bf16_between_layers)
{
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 kernels on this CPU");
    omp_set_num_threads(1);
    /* stages of 16, 32 and 64 channels on 8 x 8 images: whole blocks */
    check_cnn_bf16_activations(resnet_config(st_model_kind_named("resnet"), 2, 16, 3, 8, 8),
                               "resnet d2 w16");
    st_model_config cv = resnet_config(st_model_kind_named("convnet"), 2, 16, 3, 8, 8);
    check_cnn_bf16_activations(cv, "convnet d2 w16");
}

/* One update of m's parameters by its own optimizer, writing whichever
 * copies the model lists (as st_worker_update_own does). */
static void update_own(st_model *m, st_optim *o, int step)
{
    int n, nb, ns;
    const st_param_copy *cp = st_model_copies(m, &n);
    const st_param_blocked *bp = st_model_blocked_copies(m, &nb);
    const st_param_segment *sg = st_model_segments(m, &ns);
    st_optim_update_blocked(o, st_model_params(m), st_model_grads(m), sg, ns, 0,
                            st_model_param_count(m), (uint64_t)step + 1, 1e-2f, cp, n, bp, nb);
    st_model_copies_current(m);
}

/* 4 steps of m on rows seeded alike, each updated by update_own and
 * followed by an evaluation (whose forward reads the copies the update
 * wrote); their losses in loss. */
static void train_four(st_model *m, st_optim *o, float loss[4])
{
    st_rng r = st_rng_seed(6);
    for (int step = 0; step < 4; step++) {
        fill_rows(m, 0, 4, &r);
        OK(st_model_forward_backward(m, &loss[step]));
        update_own(m, o, step);
        double sum = 0;
        int64_t hits = 0;
        OK(st_model_evaluate(m, 4, &sum, &hits));
    }
}

/* --weight-layout blocked: the forward and backward-data products read
 * copies in the blocked layouts they picked.  Three models train 4 steps
 * with an evaluation after each: plain copies (0), blocked copies that
 * the layers pack in every forward (1, ST_UNFUSE_WEIGHT_COPY), and
 * blocked copies the update packs, 16 rows at a time (2).  1 and 2 give
 * bitwise the same losses and parameters; 0 and 2 the same losses within
 * 1e-4 (the products' kernels are the same up to where they find their
 * packed weights).  Every matrix of the resmlp is listed once, with two
 * copies where the layer has an input gradient, and none of it among the
 * plain copies.  The forward after the update reads the packed copies,
 * and after another writer packs them again.  (The packing against
 * oneDNN's reorder: blocked_packing_is_onednns_reorder.) */
Test(bf16, blocked_weight_copies_written_by_the_update)
{
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 matmul on this CPU");
    omp_set_num_threads(1);
    /* widths past one 64-column block and not a multiple of it: padding */
    st_model_config cfgs[3] = { resmlp_config(3, 72, 80, ST_ACT_GELU), gpt_config(2, 8, 2, 6),
                                resmlp_config(2, 24, 16, ST_ACT_RELU) };
    cfgs[2].kind = st_model_kind_named("mlp");
    for (int k = 0; k < 3; k++) {
        st_arena a[3];
        st_model *m[3];
        st_optim o[3];
        float loss[3][4];
        st_optim_config oc = st_optim_config_default();
        for (int j = 0; j < 3; j++) {
            st_model_config c = cfgs[k];
            c.precision = ST_PRECISION_BF16;
            c.weight_layout = j ? ST_WEIGHT_LAYOUT_BLOCKED : ST_WEIGHT_LAYOUT_PLAIN;
            c.unfuse = j == 1 ? ST_UNFUSE_WEIGHT_COPY : 0;
            st_arena_init(&a[j], "blocked copies", NULL, 0);
            m[j] = make_model(&c, 4, &a[j]);
            st_model_init_params(m[j], 13);
            OK(st_optim_init(&o[j], &oc, st_model_param_count(m[j]), &a[j]));
        }
        int n_plain, n_blocked, n_segs, two = 0;
        st_model_copies(m[2], &n_plain);
        const st_param_blocked *b = st_model_blocked_copies(m[2], &n_blocked);
        const st_param_segment *segs = st_model_segments(m[2], &n_segs);
        cr_assert_eq(n_plain, 0, "config %d: blocked, yet plain copies are listed", k);
        cr_assert_gt(n_blocked, 0, "config %d: no blocked copy listed", k);
        size_t listed = 0, matrices = 0;
        int moved = 0;   /* some element away from its row-major place */
        for (int i = 0; i < n_blocked; i++) {
            listed += (size_t)(b[i].rows * b[i].cols);
            two += b[i].n == 2;
            for (int c = 0; c < b[i].n; c++)
                for (int64_t r = 0; r < b[i].rows; r++)
                    for (int64_t q = 0; q < b[i].cols; q++)
                        moved |= b[i].copy[c].row_at[r] + b[i].copy[c].col_at[q] != r * b[i].cols + q;
        }
        for (int i = 0; i < n_segs; i++)
            matrices += segs[i].decay ? segs[i].count : 0;
        if (k != 1)   /* (a gpt's embeddings decay and have no copy) */
            cr_assert_eq(listed, matrices, "config %d: %zu weights in blocked copies, %zu in "
                         "matrices", k, listed, matrices);
        cr_assert_gt(two, 0, "config %d: no layer has a backward-data copy", k);
        if (st_bf16_probe(NULL) == ST_BF16_NATIVE)
            cr_assert(moved, "config %d: every copy is in the row-major order", k);
        int n_unfused;
        st_model_blocked_copies(m[1], &n_unfused);
        cr_assert_eq(n_unfused, 0, "config %d: unfused, yet blocked copies are listed", k);
        for (int j = 0; j < 3; j++)
            train_four(m[j], &o[j], loss[j]);
        cr_assert_eq(memcmp(loss[1], loss[2], sizeof loss[1]), 0,
                     "config %d: losses differ with the update packing the copies (step 4: "
                     "%.9g vs %.9g)", k, loss[1][3], loss[2][3]);
        cr_assert_eq(memcmp(st_model_params(m[1]), st_model_params(m[2]),
                            st_model_param_count(m[1]) * sizeof(float)), 0,
                     "config %d: parameters differ with the update packing the copies", k);
        for (int step = 0; step < 4; step++)
            cr_assert_float_eq(loss[2][step], loss[0][step], 1e-4f * fabsf(loss[0][step]),
                               "config %d step %d: blocked %.9g, plain %.9g", k, step,
                               loss[2][step], loss[0][step]);
        /* the forward after an update that packed the copies reads them,
         * not the matrices: halved behind the model's back, they change
         * nothing; restored and announced, the same loss again */
        float read[2];
        for (int j = 1; j < 3; j++)
            update_own(m[j], &o[j], 4);
        const size_t np = st_model_param_count(m[2]);
        float *p2 = st_model_params(m[2]), *kept = malloc(np * sizeof *kept);
        cr_assert_not_null(kept);
        memcpy(kept, p2, np * sizeof *kept);
        for (int h = 0; h < 2; h++) {
            for (int i = 0; h == 0 && i < n_blocked; i++)
                for (int64_t e = 0; e < b[i].rows * b[i].cols; e++)
                    p2[b[i].offset + (size_t)e] *= 0.5f;
            if (h) {
                memcpy(p2, kept, np * sizeof *kept);
                st_model_params_changed(m[2]);
            }
            st_rng r = st_rng_seed(8);
            fill_rows(m[2], 0, 4, &r);
            OK(st_model_forward_backward(m[2], &read[h]));
        }
        free(kept);
        st_rng r8 = st_rng_seed(8);   /* m[1]'s gradients as m[2]'s last */
        fill_rows(m[1], 0, 4, &r8);
        float unused;
        OK(st_model_forward_backward(m[1], &unused));
        cr_assert_eq(memcmp(&read[0], &read[1], sizeof read[0]), 0,
                     "config %d: the forward after the update did not read the packed copies "
                     "(%.9g vs %.9g)", k, read[0], read[1]);
        /* the parameters written by another writer after an update that
         * packed the copies (an all-gather: st_model_copies_written; by
         * hand: st_model_params_changed): the next forward converts */
        for (int w = 0; w < 2; w++) {
            float after[3];
            for (int j = 1; j < 3; j++) {
                update_own(m[j], &o[j], 5 + w);
                float *p = st_model_params(m[j]);
                for (size_t i = 0; i < st_model_param_count(m[j]); i++)
                    p[i] *= 0.5f;
                if (w)
                    st_model_params_changed(m[j]);
                else
                    st_model_copies_written(m[j]);
                st_rng r = st_rng_seed(7);
                fill_rows(m[j], 0, 4, &r);
                OK(st_model_forward_backward(m[j], &after[j]));
            }
            cr_assert_eq(memcmp(&after[1], &after[2], sizeof after[1]), 0,
                         "config %d: a forward after %s used stale blocked copies (%.9g vs "
                         "%.9g)", k, w ? "st_model_params_changed" : "st_model_copies_written",
                         after[2], after[1]);
        }
        for (int j = 0; j < 3; j++) {
            st_model_destroy(m[j]);
            st_arena_release(&a[j]);
        }
    }
}

/* A matrix of rows x cols (row-major, values with ties to even and
 * exponents over 64 binades) packed into the layout a bf16 matmul picks
 * for its (k, n) weights, by st_blocked_pack in random pieces (whole
 * slabs, mid-row cuts) and by st_blocked_pack_rows, each bitwise what
 * oneDNN's reorder from the strided fp32 view makes.  rows index dim
 * row_dim of the weights.  Returns the copy's pattern (ST_PAIR_*). */
static int check_packing(int64_t k, int64_t n, int row_dim, st_rng *r)
{
    st_arena a;
    st_nn_ctx ctx;
    st_arena_init(&a, "packing", NULL, 0);
    OK(st_nn_ctx_init(&ctx, &a));
    dnnl_memory_desc_t x_md, w_md, y_md;
    const int64_t xd[2] = { 16, k }, wd[2] = { k, n }, yd[2] = { 16, n };
    st_md_tag_bf16(&x_md, 2, xd, dnnl_ab);
    st_md_tag_bf16(&w_md, 2, wd, dnnl_format_tag_any);
    st_md_tag(&y_md, 2, yd, dnnl_ab);
    dnnl_matmul_desc_t d;
    cr_assert_eq(dnnl_matmul_desc_init(&d, &x_md, &w_md, NULL, &y_md), dnnl_success);
    st_prim mm;
    dnnl_primitive_desc_t pd;
    OK(st_prim_create(&ctx, &mm, &d, NULL, "packing's product", &pd));
    const dnnl_memory_desc_t md = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    dnnl_primitive_desc_destroy(pd);
    const int64_t rows = wd[row_dim], cols = wd[1 - row_dim];
    const size_t bytes = dnnl_memory_desc_get_size(&md);
    void *ref, *got[2];
    OK(st_arena_alloc(&a, ST_MEM_WEIGHTS, bytes, &ref));
    OK(st_arena_alloc(&a, ST_MEM_WEIGHTS, bytes, &got[0]));
    OK(st_arena_alloc(&a, ST_MEM_WEIGHTS, bytes, &got[1]));
    float *w;
    OK(st_arena_alloc_floats(&a, ST_MEM_WEIGHTS, (size_t)(rows * cols), &w));
    for (int64_t i = 0; i < rows * cols; i++) {
        uint32_t u = (uint32_t)st_rng_u64(r);
        u = (u & 0x807fffffu) | (0x3c000000u + (uint32_t)(st_rng_u64(r) % 64) * 0x800000u);
        if (st_rng_u64(r) % 4 == 0)
            u = (u & 0xffff0000u) | 0x8000u;   /* halfway: ties to even */
        memcpy(&w[i], &u, sizeof u);
    }
    dnnl_memory_t f32, blk;
    OK(st_mem_strided(&ctx, &f32, k, n, row_dim == 0 ? cols : 1, row_dim == 0 ? 1 : cols, w));
    OK(st_mem_md(&ctx, &blk, &md, ref));
    st_prim reorder;
    OK(st_prim_create_reorder(&ctx, &reorder, f32, blk, "packing's reference"));
    OK(st_prim_run(&ctx, &reorder));
    int id;
    OK(st_nn_ctx_add_blocked_copy(&ctx, w, got[0], rows, cols, &md, row_dim, &id));
    struct st_blocked_copy c = ctx.copies[id].blk;
    st_param_blocked b = { .offset = 1000, .rows = rows, .cols = cols, .n = 1, .copy = { c } };
    for (size_t x = 0, all = (size_t)(rows * cols); x < all;) {
        size_t y = x + 1 + st_rng_u64(r) % (size_t)(3 * cols + 5);
        if (st_rng_u64(r) % 2)   /* to a slab's end */
            y = (x / (size_t)cols + 1 + st_rng_u64(r) % (2 * ST_PACK_ROWS)) * (size_t)cols;
        y = y < all ? y : all;
        st_blocked_pack(&b, w + x, b.offset + x, b.offset + y);
        x = y;
    }
    c.bf16 = got[1];
    st_blocked_pack_rows(&c, w, 0, rows, cols);
    for (int j = 0; j < 2; j++)
        cr_assert_eq(memcmp(got[j], ref, bytes), 0, "%lld x %lld, rows along dim %d: %s differs "
                     "from oneDNN's reorder", (long long)k, (long long)n, row_dim,
                     j ? "st_blocked_pack_rows" : "st_blocked_pack in pieces");
    st_nn_ctx_destroy(&ctx);
    st_arena_release(&a);
    return c.pair;
}

/* The packing into blocked copies against oneDNN's reorder, over shapes
 * odd and even, inside one block and over several, wider than a packing
 * chunk (530, 1030), both orientations; with native bf16 the layouts of
 * even shapes take the paired fast paths, rows and columns both. */
Test(bf16, blocked_packing_is_onednns_reorder, .timeout = 120)
{
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 matmul on this CPU");
    omp_set_num_threads(1);
    const int64_t dims[] = { 1, 2, 3, 7, 16, 17, 33, 64, 65, 80, 129, 530, 1030 };
    const int nd = (int)(sizeof dims / sizeof *dims);
    st_rng r = st_rng_seed(3);
    int paired[3] = { 0 };
    for (int i = 0; i < nd; i++)
        for (int j = 0; j < nd; j++)
            for (int row_dim = 0; row_dim < 2; row_dim++) {
                if (dims[i] * dims[j] > 300000)
                    continue;   /* 1030 x 530 and up: the same paths as 530 x 530 */
                const int pair = check_packing(dims[i], dims[j], row_dim, &r);
                if (dims[i] % 2 == 0 && dims[j] % 2 == 0 && dims[i] >= 16 && dims[j] >= 16) {
                    paired[pair]++;
                    if (st_bf16_probe(NULL) == ST_BF16_NATIVE)
                        cr_assert_neq(pair, 0, "%lld x %lld, rows along dim %d: packed an "
                                      "element at a time", (long long)dims[i],
                                      (long long)dims[j], row_dim);
                }
            }
    if (st_bf16_probe(NULL) == ST_BF16_NATIVE)
        cr_assert(paired[ST_PAIR_ROWS] > 0 && paired[ST_PAIR_COLS] > 0,
                  "paired rows %d times, columns %d", paired[ST_PAIR_ROWS],
                  paired[ST_PAIR_COLS]);
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
        for (int j = 0; j < 2; j++)
            train_four(m[j], &o[j], loss[j]);
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

/* Two models over one storage (st_model_create_on): their parameters and
 * bf16 weight copies are the storage's, listed at the same places; with
 * the copies written (here by hand, as the update and the engine write
 * them) they compute what a model of its own computes, bitwise, and a
 * forward never converts a shared copy: parameters changed without
 * st_model_params_changed still multiply the old copies, and after it the
 * new ones.  Storage of another size is refused, naming both sizes. */
Test(bf16, models_over_shared_storage)
{
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 matmul on this CPU");
    omp_set_num_threads(1);
    st_model_config c = resmlp_config(3, 16, 24, ST_ACT_GELU);
    c.precision = ST_PRECISION_BF16;
    st_arena a[3];
    for (int j = 0; j < 3; j++)
        st_arena_init(&a[j], "storage", NULL, 0);
    st_model *own = make_model(&c, 4, &a[2]);
    st_model_init_params(own, 17);
    const size_t P = st_model_param_count(own);
    float *params = calloc(P, sizeof *params);
    uint16_t *bf16 = calloc(P, sizeof *bf16);
    memcpy(params, st_model_params(own), P * sizeof *params);
    st_model_storage s = { params, bf16, P, 0, NULL };
    st_model *m[2];
    for (int j = 0; j < 2; j++) {
        OK(st_model_create_on(&c, 4, &a[j], &s, &m[j]));
        cr_assert_eq(st_model_params(m[j]), params);
    }
    int n0, n1, n;
    const st_param_copy *c0 = st_model_copies(m[0], &n0), *c1 = st_model_copies(m[1], &n1);
    st_model_copies(own, &n);
    cr_assert(n0 == n && n1 == n && n > 0, "%d, %d and %d copies", n0, n1, n);
    for (int i = 0; i < n; i++) {
        cr_assert_eq(c0[i].bf16, bf16 + c0[i].offset, "copy %d is not in the storage", i);
        cr_assert_eq(c1[i].bf16, c0[i].bf16);
    }
    st_model_params_changed(m[0]);   /* converts the shared copies, once */
    float loss[3];
    for (int step = 0; step < 3; step++) {
        st_model *each[3] = { m[0], m[1], own };
        for (int j = 0; j < 3; j++) {
            st_rng r = st_rng_seed(8 + (uint64_t)step);
            fill_rows(each[j], 0, 4, &r);
            OK(st_model_forward_backward(each[j], &loss[j]));
        }
        cr_assert(memcmp(&loss[0], &loss[2], sizeof *loss) == 0 &&
                  memcmp(&loss[1], &loss[2], sizeof *loss) == 0,
                  "step %d: %.9g and %.9g over the storage, %.9g alone", step, loss[0], loss[1],
                  loss[2]);
    }
    /* new weights, copies not converted: the stale copies are what multiply */
    for (size_t i = 0; i < P; i++) {
        params[i] *= 0.5f;
        st_model_params(own)[i] *= 0.5f;
    }
    st_model_params_changed(own);
    st_rng r0 = st_rng_seed(30), r1 = st_rng_seed(30);
    fill_rows(m[0], 0, 4, &r0);
    fill_rows(own, 0, 4, &r1);
    OK(st_model_forward_backward(m[0], &loss[0]));
    OK(st_model_forward_backward(own, &loss[2]));
    cr_assert_neq(loss[0], loss[2], "a forward converted the shared copies");
    st_model_params_changed(m[1]);
    r0 = st_rng_seed(30);
    fill_rows(m[0], 0, 4, &r0);
    OK(st_model_forward_backward(m[0], &loss[0]));
    cr_assert_eq(memcmp(&loss[0], &loss[2], sizeof *loss), 0, "%.9g vs %.9g", loss[0], loss[2]);
    st_model *bad = NULL;
    st_model_storage wrong = { params, bf16, P - 1, 0, NULL };
    st_arena b;
    st_arena_init(&b, "wrong", NULL, 0);
    cr_assert_eq(st_model_create_on(&c, 4, &b, &wrong, &bad), ST_ERR_INVALID);
    cr_assert_null(bad);
    char want[128];
    snprintf(want, sizeof want, "storage of %zu parameters for a model of %zu", P - 1, P);
    cr_assert_str_eq(st_last_error(), want);
    st_arena_release(&b);
    for (int j = 0; j < 2; j++)
        st_model_destroy(m[j]);
    st_model_destroy(own);
    for (int j = 0; j < 3; j++)
        st_arena_release(&a[j]);
    free(params);
    free(bf16);
}

/* Half tensors of m: how many, and whether each lies between layers that
 * take bf16 (written by a linear layer, attention, an activation or a
 * layer norm, read as x by all but the layer norm) and none is read as a
 * residual; a gradient only between linear layers, GELU and attention
 * (*grads: how many gradients, none also a value). */
static int count_half(const st_model *m, int *grads)
{
    int n = 0;
    *grads = 0;
    for (int t = 0; t < m->n_tensors; t++) {
        if (!m->tensors[t].half)
            continue;
        n++;
        int value = 0, grad = 0;
        for (int i = 0; i < m->n_layers; i++) {
            const st_layer *l = &m->layers[i];
            if (l->dropped)
                continue;
            const char *k = l->kind->name;
            const int takes = !strcmp(k, "linear") || !strcmp(k, "attention") ||
                              !strcmp(k, "activation");
            const int writes = takes || !strcmp(k, "layernorm");   /* its y, not its x */
            cr_assert(!((l->x == t && !takes) || (l->y == t && !writes)), "tensor %d is bf16 "
                      "and %s (%s) touches it", t, l->name, k);
            cr_assert(l->residual != t, "tensor %d is bf16 and %s reads it as a residual", t,
                      l->name);
            const int g = l->dx == t || l->dy == t;
            cr_assert(!g || !strcmp(k, "linear") || !strcmp(k, "attention") ||
                      (!strcmp(k, "activation") && l->activation == ST_ACT_GELU),
                      "tensor %d is a bf16 gradient and %s (%s) touches it", t, l->name, k);
            value |= l->x == t || l->y == t;
            grad |= g;
        }
        cr_assert(!(value && grad), "tensor %d is bf16 as a value and a gradient", t);
        *grads += grad;
    }
    return n;
}

/* Three steps of m on the same rows (seeded); the losses, and m's bytes of
 * activations (the arena's, with attention's). */
static void three_steps(st_model *m, float loss[3])
{
    st_rng r = st_rng_seed(5);
    for (int step = 0; step < 3; step++) {
        fill_rows(m, 0, 4, &r);
        own_calls = 0;
        armed = step >= 1;
        st_status st = st_model_forward_backward(m, &loss[step]);
        armed = 0;
        cr_assert_eq(st, ST_OK, "%s", st_last_error());
        if (HEAPWATCH_ACTIVE && step >= 1)
            cr_expect_eq(own_calls, 0, "a step with bf16 activations called the heap %ld "
                         "times", own_calls);
        double sum = 0;
        int64_t hits = 0;
        OK(st_model_evaluate(m, 4, &sum, &hits));
    }
}

/* --activation-precision bf16 (cfg.activations): the tensors between
 * products are stored as bf16 (a resmlp's fc1 outputs and activations,
 * with GELU and with a fused ReLU whose backward is folded, an mlp's, a
 * gpt's Q, K, V and attention outputs and its MLP's), and only those; the
 * activations take fewer bytes than with fp32 activations; the losses of
 * 3 steps stay within 2% of those, the gradients within 5% (relative
 * norm of the difference); two models of the same seed give bitwise the
 * same losses and gradients; a step makes no heap call.  Without the
 * option a resmlp stores nothing as bf16 and a gpt only its attention's
 * Q, K, V and output (2 a block: read by products only). */
Test(bf16, activations_stored_as_bf16)
{
    if (st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 matmul on this CPU");
    omp_set_num_threads(1);
    st_model_config cfgs[4] = { resmlp_config(3, 16, 24, ST_ACT_GELU),
                                resmlp_config(2, 16, 24, ST_ACT_RELU),
                                mlp_config(3, 16, ST_ACT_GELU), gpt_config(2, 8, 2, 6) };
    /* without the option: tensors stored as bf16 (gpt: 2 a block) */
    const int plain_half[4] = { 0, 0, 0, 4 };
    for (int k = 0; k < 4; k++) {
        cfgs[k].precision = ST_PRECISION_BF16;
        st_arena a[3];
        st_model *m[3];
        float loss[3][3];
        for (int j = 0; j < 3; j++) {   /* fp32 activations, then bf16 twice */
            st_model_config c = cfgs[k];
            c.activations = j ? ST_PRECISION_BF16 : ST_PRECISION_FP32;
            st_arena_init(&a[j], "bf16 activations", NULL, 0);
            m[j] = make_model(&c, 4, &a[j]);
            st_model_init_params(m[j], 11);
        }
        int base_grads, grads;
        const int base = count_half(m[0], &base_grads), half = count_half(m[1], &grads);
        cr_assert_eq(base, plain_half[k], "config %d: %d tensors in bf16 without the option, "
                     "not %d", k, base, plain_half[k]);
        cr_assert_eq(base_grads, 0, "config %d: %d gradients in bf16 without the option", k,
                     base_grads);
        /* with it, each GELU's and attention's dx and dy (none around a ReLU,
         * fused into its product and folded into the next) */
        int gelus = 0;
        for (int i = 0; i < m[1]->n_layers; i++) {
            const st_layer *l = &m[1]->layers[i];
            if (!strcmp(l->kind->name, "attention"))
                cr_assert(st_graph_is_half(m[1], l->dx) && st_graph_is_half(m[1], l->dy),
                          "config %d: %s's gradients are not bf16", k, l->name);
            /* a layer norm writes the product after it a bf16 y, from the
             * fp32 stream */
            if (!strcmp(l->kind->name, "layernorm"))
                cr_assert(st_graph_is_half(m[1], l->y) && !st_graph_is_half(m[1], l->x) &&
                          !st_graph_is_half(m[0], l->y),
                          "config %d: %s's y is %s, its x %s", k, l->name,
                          st_graph_is_half(m[1], l->y) ? "bf16" : "fp32",
                          st_graph_is_half(m[1], l->x) ? "bf16" : "fp32");
            if (strcmp(l->kind->name, "activation") || l->activation != ST_ACT_GELU)
                continue;
            gelus++;
            cr_assert(st_graph_is_half(m[1], l->dx) && st_graph_is_half(m[1], l->dy),
                      "config %d: %s's gradients are not bf16", k, l->name);
        }
        cr_assert_eq(grads > 0, gelus > 0, "config %d: %d gradients in bf16 around %d GELUs",
                     k, grads, gelus);
        cr_assert_gt(half, base, "config %d: --activation-precision bf16 stores no more "
                     "tensors as bf16 (%d)", k, half);
        const st_mem_stats s0 = st_arena_stats(&a[0]), s1 = st_arena_stats(&a[1]);
        const size_t act0 = s0.current[ST_MEM_ACTIVATIONS] + s0.current[ST_MEM_WORKSPACE],
                     act1 = s1.current[ST_MEM_ACTIVATIONS] + s1.current[ST_MEM_WORKSPACE];
        cr_log_info("config %d: activations and workspace %zu bytes, %zu with fp32 "
                    "activations", k, act1, act0);
        cr_assert_leq(act1, act0, "config %d: bf16 activations take %zu bytes, fp32 %zu", k,
                      act1, act0);
        for (int j = 0; j < 3; j++)
            three_steps(m[j], loss[j]);
        for (int step = 0; step < 3; step++)
            cr_assert_lt(fabsf(loss[1][step] - loss[0][step]), 0.02f * fabsf(loss[0][step]),
                         "config %d step %d: loss %g with bf16 activations, %g with fp32", k,
                         step, loss[1][step], loss[0][step]);
        const float *g0 = st_model_grads(m[0]), *g1 = st_model_grads(m[1]);
        double diff = 0, norm = 0;
        for (size_t i = 0; i < m[0]->n_grads; i++) {
            diff += ((double)g1[i] - g0[i]) * ((double)g1[i] - g0[i]);
            norm += (double)g0[i] * g0[i];
        }
        cr_assert_lt(sqrt(diff), 0.05 * sqrt(norm), "config %d: gradients %g apart (norm %g)",
                     k, sqrt(diff), sqrt(norm));
        cr_assert_eq(memcmp(loss[1], loss[2], sizeof loss[1]), 0,
                     "config %d: the same seed gave other losses with bf16 activations", k);
        cr_assert_eq(memcmp(st_model_grads(m[1]), st_model_grads(m[2]),
                            m[1]->n_grads * sizeof(float)), 0,
                     "config %d: the same seed gave other gradients with bf16 activations", k);
        for (int j = 0; j < 3; j++) {
            st_model_destroy(m[j]);
            st_arena_release(&a[j]);
        }
    }
}

/*
 * tests/test_model_recompute.c — activation recomputation (cfg.recompute,
 * nn/recompute.c): the same bits as keeping every activation, in every
 * model, subnetwork and precision, with no heap call in a step; and the
 * activation bytes it saves, equal to the layout's prediction.
 *
 * The runs of every strategy with --recompute: tests/test_cli_recompute.c.
 */
#define _GNU_SOURCE /* RTLD_NEXT, for heapwatch.h */
#include "model_check.h"
#include "nn/recompute.h"

#define HEAPWATCH_PER_THREAD
#include "heapwatch.h"

static const int HELD[] = { 0, 2, 3 };
static const uint8_t GRADS[] = { 1, 0, 1, 1 };

enum { N_CONFIGS = 11, STEPS = 3, BATCH = 4 };

/* The models: every kind, their subnetworks (dropped groups, groups
 * without gradients, kept neurons forward and backward). */
static st_model_config config(int k)
{
    st_model_config c;
    switch (k) {
    case 0: return mlp_config(3, 20, ST_ACT_GELU);
    case 1: return resmlp_config(4, 16, 24, ST_ACT_GELU);
    case 2:
        c = resmlp_config(4, 16, 24, ST_ACT_RELU);
        c.subnet.groups = HELD;
        c.subnet.n_groups = 3;
        c.subnet.scale = 4.0f / 3.0f;
        return c;
    case 3:
        c = resmlp_config(4, 16, 24, ST_ACT_GELU);
        c.subnet.group_grads = GRADS;
        return c;
    case 4: return neuron_config(st_model_kind_named("resmlp"), 0);
    case 5: return neuron_config(st_model_kind_named("resmlp"), 1);
    case 6: return neuron_config(st_model_kind_named("mlp"), 0);
    case 7: return resnet_config(st_model_kind_named("resnet"), 1, 16, 3, 8, 8);
    case 8: return gpt_config(3, 8, 2, 6);
    case 9:
        c = gpt_config(3, 8, 2, 6);
        c.subnet.groups = HELD;
        c.subnet.n_groups = 2;
        return c;
    default:   /* recomputed, its ReLUs' backward is not folded (nn/models/mlp.c) */
        return mlp_config(3, 20, ST_ACT_RELU);
    }
}

/* A model's steps: losses, then after each its gradients, state and an
 * evaluation's sums, and the parameters after a plain update. */
typedef struct trace {
    float loss[STEPS];
    double eval[STEPS];
    int64_t hits[STEPS];
    float *grads, *state, *params;
    size_t n_grads, n_state, n_params;
    long heap_calls;
} trace;

static void run_steps(const st_model_config *cfg, trace *t)
{
    st_arena a;
    st_arena_init(&a, "recompute", NULL, 0);
    st_model *m = make_model(cfg, BATCH, &a);
    st_model_init_params(m, 11);
    st_rng r = st_rng_seed(5);
    t->heap_calls = 0;
    for (int step = 0; step < STEPS; step++) {
        fill_rows(m, 0, BATCH, &r);
        own_calls = 0;
        armed = step >= 1;   /* the first lets oneDNN set up its thread */
        st_status s = st_model_forward_backward(m, &t->loss[step]);
        armed = 0;
        cr_assert_eq(s, ST_OK, "%s", st_last_error());
        t->heap_calls += own_calls;
        float *p = st_model_params(m);
        const float *g = st_model_grads(m);
        int n_segs;
        const st_param_segment *seg = st_model_segments(m, &n_segs);
        for (int i = 0; i < n_segs; i++)   /* a plain update of the kept gradients */
            for (size_t j = 0; seg[i].grad_offset != ST_NO_GRAD && j < seg[i].grad_count &&
                               seg[i].grad_count == seg[i].count; j++)
                p[seg[i].offset + j] -= 0.05f * g[seg[i].grad_offset + j];
        st_model_params_changed(m);
        t->eval[step] = 0.0;
        t->hits[step] = 0;
        OK(st_model_evaluate(m, BATCH, &t->eval[step], &t->hits[step]));
    }
    t->n_grads = st_model_grad_count(m);
    t->n_params = st_model_param_count(m);
    const float *state = st_model_state(m, &t->n_state);
    t->grads = malloc((t->n_grads + 1) * sizeof(float));
    t->params = malloc((t->n_params + 1) * sizeof(float));
    t->state = malloc((t->n_state + 1) * sizeof(float));
    memcpy(t->grads, st_model_grads(m), t->n_grads * sizeof(float));
    memcpy(t->params, st_model_params(m), t->n_params * sizeof(float));
    if (t->n_state)
        memcpy(t->state, state, t->n_state * sizeof(float));
    st_model_destroy(m);
    st_arena_release(&a);
}

static void trace_free(trace *t)
{
    free(t->grads);
    free(t->params);
    free(t->state);
}

/* Every model above, fp32, bf16 and bf16 with bf16 activations (its
 * GELUs folded into the next product), with BLOCKS and ALL: bitwise the
 * losses, gradients, running statistics, evaluations and updated
 * parameters of the model that keeps its activations, and no heap call of
 * subtrain's in a step (so no primitive is created: the recomputed
 * forward runs the forward's own). */
Test(recompute, same_bits_as_keeping_every_activation)
{
    omp_set_num_threads(1);
    const int precisions = st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE ? 1 : 3;
    for (int k = 0; k < N_CONFIGS; k++)
        for (int p = 0; p < precisions; p++) {
            st_model_config c = config(k);
            c.precision = p ? ST_PRECISION_BF16 : ST_PRECISION_FP32;
            c.activations = p == 2 ? ST_PRECISION_BF16 : ST_PRECISION_FP32;
            trace keep;
            run_steps(&c, &keep);
            for (int mode = ST_RECOMPUTE_BLOCKS; mode <= ST_RECOMPUTE_ALL; mode++) {
                c.recompute = (st_recompute)mode;
                trace t;
                run_steps(&c, &t);
                const char *what = st_recompute_name(c.recompute);
                cr_assert_eq(memcmp(keep.loss, t.loss, sizeof t.loss), 0,
                             "config %d %s%s, recompute %s: other losses (%.9g against %.9g at "
                             "the last step)", k, st_precision_name(c.precision),
                             p == 2 ? " (bf16 activations)" : "", what,
                             (double)t.loss[STEPS - 1], (double)keep.loss[STEPS - 1]);
                cr_assert_eq(t.n_grads, keep.n_grads);
                cr_assert_eq(memcmp(keep.grads, t.grads, t.n_grads * sizeof(float)), 0,
                             "config %d %s, recompute %s: other gradients", k,
                             st_precision_name(c.precision), what);
                cr_assert_eq(t.n_state, keep.n_state);
                cr_assert_eq(memcmp(keep.state, t.state, t.n_state * sizeof(float)), 0,
                             "config %d %s, recompute %s: other running statistics", k,
                             st_precision_name(c.precision), what);
                cr_assert_eq(memcmp(keep.params, t.params, t.n_params * sizeof(float)), 0,
                             "config %d %s, recompute %s: other parameters after the updates",
                             k, st_precision_name(c.precision), what);
                cr_assert_eq(memcmp(keep.eval, t.eval, sizeof t.eval), 0,
                             "config %d %s, recompute %s: other evaluations", k,
                             st_precision_name(c.precision), what);
                if (HEAPWATCH_ACTIVE)
                    cr_expect_eq(t.heap_calls, 0, "config %d %s, recompute %s: %ld heap calls "
                                 "in %d steps", k, st_precision_name(c.precision), what,
                                 t.heap_calls, STEPS - 1);
                trace_free(&t);
            }
            trace_free(&keep);
        }
}

/* What a model of each kind takes of each memory kind is what
 * st_model_activation_layout says, to the byte; activations (with
 * attention) shrink from NONE to BLOCKS (but a bf16 mlp's) to ALL in
 * these models of 3 or more blocks.  (In bf16 the data gradients take
 * buffers of their own, workspace: a block's forward runs during the
 * backward.) */
Test(recompute, activation_bytes_shrink_as_the_layout_says)
{
    omp_set_num_threads(1);
    const int picks[] = { 0, 1, 2, 7, 8 };
    const int precisions = st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE ? 1 : 2;
    for (size_t i = 0; i < sizeof picks / sizeof *picks; i++)
        for (int p = 0; p < precisions; p++) {
            size_t act[3], ws[3];
            for (int mode = 0; mode < 3; mode++) {
                st_model_config c = config(picks[i]);
                c.precision = p ? ST_PRECISION_BF16 : ST_PRECISION_FP32;
                c.recompute = (st_recompute)mode;
                st_activation_layout layout;
                OK(st_model_activation_layout(&c, BATCH, &layout));
                st_arena a;
                st_arena_init(&a, "recompute bytes", NULL, 0);
                st_model *m = make_model(&c, BATCH, &a);
                const st_mem_stats s = st_arena_stats(&a);
                for (int kind = 0; kind < ST_MEM_KIND_COUNT; kind++)
                    cr_expect_eq(s.current[kind], layout.bytes[kind], "config %d %s, recompute "
                                 "%s: %s %zu bytes, the layout says %zu", picks[i],
                                 st_precision_name(c.precision), st_recompute_name(c.recompute),
                                 st_mem_kind_name((st_mem_kind)kind), s.current[kind],
                                 layout.bytes[kind]);
                cr_expect_eq(layout.blocks > 0, mode > 0, "config %d: %d blocks recomputed",
                             picks[i], layout.blocks);
                act[mode] = s.current[ST_MEM_ACTIVATIONS] + s.current[ST_MEM_ATTENTION];
                ws[mode] = s.current[ST_MEM_WORKSPACE];
                st_model_destroy(m);
                st_arena_release(&a);
            }
            fprintf(stderr, "[recompute] config %d %s: activations %zu %zu %zu, workspace %zu "
                    "%zu %zu bytes (none, blocks, all)\n", picks[i], p ? "bf16" : "fp32", act[0],
                    act[1], act[2], ws[0], ws[1], ws[2]);
            /* a bf16 mlp's hidden layer keeps its bf16 copies without
             * recomputation, its fp32 input with BLOCKS: no saving */
            if (!p || picks[i] != 0)
                cr_expect_lt(act[1], act[0], "config %d: blocks %zu bytes of activations, none "
                             "%zu", picks[i], act[1], act[0]);
            cr_expect_lt(act[2], act[1], "config %d: all %zu bytes of activations, blocks %zu",
                         picks[i], act[2], act[1]);
        }
}

/* A mode that is none of the three is refused, naming the field. */
Test(recompute, unknown_mode_is_refused)
{
    st_model_config c = resmlp_config(2, 8, 8, ST_ACT_GELU);
    c.recompute = (st_recompute)7;
    st_arena a;
    st_arena_init(&a, "recompute refused", NULL, 0);
    st_model *m = NULL;
    cr_assert_eq(st_model_create(&c, 4, &a, &m), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "recompute mode 7"), "%s", st_last_error());
    st_recompute r;
    cr_assert_eq(st_recompute_parse("some", &r), ST_ERR_INVALID);
    OK(st_recompute_parse("blocks", &r));
    cr_assert_eq(r, ST_RECOMPUTE_BLOCKS);
    st_arena_release(&a);
}

/*
 * bench/bench_step_run.c — one configuration of bench_step (bench_step.c
 * says what is measured): its trainer and data, its references, the
 * warm-up, the windows of the reference and of the step interleaved, and
 * the breakdown of a step by its parts.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_step.h"

#define TRY(expr)                        \
    do {                                 \
        st_status try_s_ = (expr);       \
        if (try_s_ != ST_OK)             \
            return try_s_;               \
    } while (0)

/* Median of v[0..n), n >= 1 (sorts v). */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ------------------------------------------------------------ the step */

typedef struct step_ctx {
    st_trainer *t;
    st_model *m;            /* its worker's model, for the breakdown */
    const st_dataset *train;
    const uint32_t *order;  /* the breakdown's sample order */
    uint32_t steps_per_epoch;
    uint64_t step;          /* last step run, 1-based as in the trainer */
    float loss;
} step_ctx;

static st_status step_once(step_ctx *s)
{
    s->step++;
    return st_trainer_step(s->t, 1, &s->loss);
}

/* Mean seconds per step over a window of at least min_s (at least one step). */
static st_status step_window(step_ctx *s, double min_s, double *per_step, uint64_t *steps)
{
    uint64_t n = 0;
    double t0 = now_s(), t;
    do {
        TRY(step_once(s));
        n++;
        t = now_s();
    } while (t - t0 < min_s);
    *per_step = (t - t0) / (double)n;
    *steps += n;
    return ST_OK;
}

/* The same step as st_trainer_step, by its parts, each timed; means per
 * step over a window of at least min_s. */
static st_status breakdown_window(step_ctx *s, double min_s, bench_result *r)
{
    st_model *m = s->m;
    const int B = st_model_batch(m);
    double gather = 0.0, fb = 0.0, opt = 0.0;
    uint64_t n = 0;
    double t0 = now_s(), t;
    do {
        uint32_t first = (uint32_t)(s->step % s->steps_per_epoch) * (uint32_t)B;
        s->step++;
        double ta = now_s();
        st_dataset_gather(s->train, s->order + first, (size_t)B, st_model_input(m),
                          st_model_labels(m));
        double tb = now_s();
        TRY(st_model_forward_backward(m, &s->loss));
        double tc = now_s();
        float lr;
        TRY(st_trainer_update(s->t, &lr));
        t = now_s();
        gather += tb - ta;
        fb += tc - tb;
        opt += t - tc;
        n++;
    } while (t - t0 < min_s);
    r->gather_s = gather / (double)n;
    r->fb_s = fb / (double)n;
    r->optim_s = opt / (double)n;
    r->parts_s = (t - t0) / (double)n;
    return ST_OK;
}

/* ------------------------------------------------------------ one config */

int fail(const char *what)
{
    fprintf(stderr, "bench_step: %s: %s\n", what, st_last_error());
    return EXIT_FAILURE;
}

/* The configuration's model as the trainer builds it for `subtrain`
 * with the same options, at the config's batch, a constant rate. */
void bench_train_config(const bench_config *bc, const bench_options *o, int bf16,
                        st_train_config *tc)
{
    tc->model.kind = st_model_kind_named(bc->model);
    tc->model.depth = bc->depth;
    tc->model.width = bc->width;
    tc->model.hidden = 0; /* = width */
    tc->model.precision = bf16 ? ST_PRECISION_BF16 : ST_PRECISION_FP32;
    tc->model.unfuse = o->unfuse;
    tc->model.activations = bf16 ? o->activations : ST_PRECISION_FP32;
    tc->model.tensor_layout = o->layout;
    tc->model.weight_layout = bf16 ? o->weights : ST_WEIGHT_LAYOUT_PLAIN;
    tc->bf16_emulated = 1;   /* the header names the ISA: an emulated row says so */
    tc->model.in_dim = 784;
    tc->model.n_classes = 10;
    if (bc->in_channels) {
        /* as `subtrain --model resnet` sets it for Fashion-MNIST: the
         * images' shape (cli/main.c), ReLU (models/resnet.c's defaults) */
        tc->model.in_channels = bc->in_channels;
        tc->model.in_height = bc->in_height;
        tc->model.in_width = bc->in_width;
        tc->model.activation = ST_ACT_RELU;
    }
    if (bc->context) {
        /* as `subtrain --model gpt --data text:FILE` sets it (models/gpt.c's
         * defaults): a byte id per token in, the next byte (256 classes)
         * out, MLP hidden 4 D, GELU */
        tc->model.context = bc->context;
        tc->model.heads = bc->heads;
        tc->model.in_dim = bc->context;
        tc->model.n_classes = 256;
        tc->model.activation = ST_ACT_GELU;
    }
    if (o->activation >= 0 && !bc->in_channels)
        tc->model.activation = (st_activation)o->activation;
    tc->batch = bc->batch;
    tc->schedule = ST_SCHED_CONSTANT;
}

/* count samples of the config's data: synthetic features (images of the
 * cnn's shape), or for gpt windows of 4 MiB of generated text. */
int bench_data(const bench_config *bc, uint64_t seed, uint32_t count, st_dataset *train,
               st_dataset *test)
{
    if (bc->context) {
        st_text text;
        if (make_text((size_t)4 << 20, seed, &text)) {
            fprintf(stderr, "bench_step: out of memory for the text\n");
            return EXIT_FAILURE;
        }
        st_status ts = st_text_dataset(&text, bc->context, seed, count, 0, train, test);
        st_text_free(&text);
        if (ts != ST_OK)
            return fail("text data");
    } else {
        st_synthetic_config sc = st_synthetic_defaults(seed);
        sc.train_count = count;
        sc.test_count = 1;
        if (st_synthetic_make(&sc, train, test) != ST_OK)
            return fail("synthetic data");
        st_dataset_normalize(train, test, NULL, NULL);
    }
    if (bc->in_channels) {
        /* the same 784 features, read as 1 x 28 x 28 images */
        train->channels = test->channels = (uint32_t)bc->in_channels;
        train->height = test->height = (uint32_t)bc->in_height;
        train->width = test->width = (uint32_t)bc->in_width;
    }
    return EXIT_SUCCESS;
}

int run_config(const bench_config *bc, const bench_options *o, int bf16, st_moments moments,
               st_recompute recompute, bench_result *r)
{
    memset(r, 0, sizeof *r);
    r->cfg = bc;
    r->windows = o->windows;
    r->bf16 = bf16;
    r->moments = moments;
    r->recompute = recompute;

    /* One data-parallel worker, a constant rate, and more steps than any
     * measurement takes (the plan needs a length). */
    st_train_config tc = st_train_config_default();
    bench_train_config(bc, o, bf16, &tc);
    tc.model.recompute = recompute;
    r->activation = tc.model.activation;
    tc.optim.moments = moments;
    tc.workers = 1;
    tc.steps = 1000000000;
    if (st_train_config_check(&tc) != ST_OK)
        return fail(bc->name);

    /* A few batches of data are enough: the step's cost does not depend on
     * which samples it sees, and a small set keeps start-up short.  Eight
     * batches rather than one so that successive steps gather different
     * rows in a shuffled order, as the trainer's do. */
    st_dataset train, test;
    if (bench_data(bc, tc.seed, 8u * (uint32_t)bc->batch, &train, &test) != EXIT_SUCCESS)
        return EXIT_FAILURE;

    int rc = EXIT_SUCCESS;
    st_trainer *t = NULL;
    ref_ctx ref = { .conv = bc->conv_ref };
    attn_ref attn;
    memset(&attn, 0, sizeof attn);
    uint32_t *order = malloc(train.count * sizeof *order);
    if (!order) {
        fprintf(stderr, "bench_step: out of memory for a sample order\n");
        rc = EXIT_FAILURE;
        goto out;
    }
    if (st_trainer_create(&tc, &train, &test, &t) != ST_OK) {
        rc = fail("trainer");
        goto out;
    }
    st_epoch_order(tc.seed, 0, order, train.count);
    st_model *m = st_trainer_model(t, 0);
    r->params = st_model_param_count(m);
    r->flops = st_model_step_flops(m);

    if (bc->conv_ref) {
        conv_shape shapes[MAX_CONV_SHAPES];
        int best;
        const int n_shapes = conv_shapes(bc, shapes, &best);
        const conv_shape *sh = &shapes[best];
        double conv_total = 0.0;
        for (int i = 0; i < n_shapes; i++)
            conv_total += shapes[i].step_flops;
        /* the head's few FLOPs aside, the enumeration must be the model */
        if (conv_total > r->flops || conv_total < 0.99 * r->flops)
            fprintf(stderr, "bench_step: warning: the resnet's convolutions as enumerated here "
                    "(%.2f GFLOP a step) are not the model's (%.2f): the reference shape may "
                    "not be its dominant one\n", conv_total * 1e-9, r->flops * 1e-9);
        if (conv_ref_init(&ref.c, sh, bc->batch, 0) ||
            (bf16 && conv_ref_init(&ref.c16, sh, bc->batch, 1))) {
            rc = EXIT_FAILURE;
            goto out;
        }
        if (bf16) {
            r->ref16_flops = 3.0 * conv_pass_flops(sh, bc->batch);
            snprintf(r->ref16_impl, sizeof r->ref16_impl, "%s", ref.c16.impl[0]);
        }
        r->ref_name = "conv";
        snprintf(r->ref_shape, sizeof r->ref_shape, "%lld->%lld %lldx%lld %lldx%lld s%lld",
                 (long long)sh->ic, (long long)sh->oc, (long long)sh->h, (long long)sh->w,
                 (long long)sh->k, (long long)sh->k, (long long)sh->stride);
        r->ref_flops = 3.0 * conv_pass_flops(sh, bc->batch);
        r->ref_share = sh->step_flops / r->flops;
        for (int i = 0; i < 3; i++)
            snprintf(r->conv_impl[i], sizeof r->conv_impl[i], "%s", ref.c.impl[i]);
    } else {
        /* resmlp: M = batch, N = K = width.  gpt: fc1's forward, M = B T
         * rows, K = D, N = 4 D (see the header comment). */
        const int64_t M = (int64_t)bc->batch * (bc->context ? bc->context : 1);
        const int64_t N = bc->context ? 4 * (int64_t)bc->width : bc->width, K = bc->width;
        if (gemm_init(&ref.g, M, N, K)) {
            fprintf(stderr, "bench_step: out of memory for the sgemm buffers\n");
            rc = EXIT_FAILURE;
            goto out;
        }
        r->ref_name = "sgemm";
        r->gemm_m = M, r->gemm_n = N, r->gemm_k = K;
        snprintf(r->ref_shape, sizeof r->ref_shape, "%lldx%lldx%lld", (long long)M,
                 (long long)N, (long long)K);
        r->ref_flops = 2.0 * (double)ref.g.m * (double)ref.g.n * (double)ref.g.k;
        if (bf16) {
            if (gemm16_init(&ref.g, r->ref16_impl, sizeof r->ref16_impl)) {
                rc = EXIT_FAILURE;
                goto out;
            }
            r->ref16_flops = r->ref_flops;
        }
    }
    if (bc->context) {
        gpt_flops(bc, &r->linear_flops, &r->attn_flops);
        /* the attention kind's products must be in st_model_step_flops */
        const double want = r->linear_flops + r->attn_flops;
        if (r->flops < 0.999 * want || r->flops > 1.001 * want)
            fprintf(stderr, "bench_step: warning: st_model_step_flops counts %.3f GFLOP a step, "
                    "the architecture %.3f (linear %.3f + attention %.3f): the breakdown's "
                    "split may be wrong\n", r->flops * 1e-9, want * 1e-9,
                    r->linear_flops * 1e-9, r->attn_flops * 1e-9);
        if (attn_ref_init(&attn, bc)) {
            rc = EXIT_FAILURE;
            goto out;
        }
        snprintf(r->attn_impl, sizeof r->attn_impl, "%s", attn.impl);
    }

    step_ctx s = {
        .t = t, .m = m, .train = &train, .order = order,
        .steps_per_epoch = train.count / (uint32_t)bc->batch,
    };

    /* Warm-up: first runs of every primitive, first touch of the
     * activations and optimizer state, the reference's kernel generation. */
    for (int i = 0; i < o->warmup_steps; i++) {
        if (step_once(&s) != ST_OK) {
            rc = fail(bc->name);
            goto out;
        }
    }
    double pass_t[3][MAX_WINDOWS], pass[3];
    if (ref_window(&ref, o->gemm_window_s, pass) < 0.0) {
        rc = EXIT_FAILURE;
        goto out;
    }

    double attn_part[A_PARTS], attn_t[A_PARTS][MAX_WINDOWS];
    if (bc->context && attn_window(&attn, o->gemm_window_s, attn_part) < 0.0) {
        fprintf(stderr, "bench_step: the attention copy failed\n");
        rc = EXIT_FAILURE;
        goto out;
    }

    if (bf16 && ref16_window(&ref, o->gemm_window_s) < 0.0) {   /* its warm-up */
        rc = EXIT_FAILURE;
        goto out;
    }

    double step_t[MAX_WINDOWS], gemm_t[MAX_WINDOWS], gemm16_t[MAX_WINDOWS];
    for (int k = 0; k < o->windows; k++) {
        gemm_t[k] = ref_window(&ref, o->gemm_window_s, pass);
        if (gemm_t[k] < 0.0) {
            rc = EXIT_FAILURE;
            goto out;
        }
        if (bf16 && (gemm16_t[k] = ref16_window(&ref, o->gemm_window_s)) < 0.0) {
            fprintf(stderr, "bench_step: the bf16 reference failed\n");
            rc = EXIT_FAILURE;
            goto out;
        }
        for (int i = 0; i < 3; i++)
            pass_t[i][k] = pass[i];
        /* gpt: a window of the attention copy, as long as sgemm's */
        if (bc->context && attn_window(&attn, o->gemm_window_s, attn_part) < 0.0) {
            fprintf(stderr, "bench_step: the attention copy failed\n");
            rc = EXIT_FAILURE;
            goto out;
        }
        for (int i = 0; bc->context && i < A_PARTS; i++)
            attn_t[i][k] = attn_part[i];
        if (step_window(&s, o->step_window_s, &step_t[k], &r->steps_timed) != ST_OK) {
            rc = fail(bc->name);
            goto out;
        }
    }
    r->step_s_med = median(step_t, o->windows); /* sorted from here on */
    r->step_s_best = step_t[0];
    r->step_s_worst = step_t[o->windows - 1];
    r->ref_s_med = median(gemm_t, o->windows);
    r->ref_s_best = gemm_t[0];
    for (int i = 0; i < 4; i++)
        r->wgrad16_s[i] = -1.0;
    if (bf16 && !bc->conv_ref)
        wgrad16_windows(&ref.g, o->gemm_window_s, r->wgrad16_s);
    if (bf16) {
        r->ref16_s_med = median(gemm16_t, o->windows);
        r->ref16_s_best = gemm16_t[0];
    }
    if (bc->conv_ref)
        for (int i = 0; i < 3; i++)
            r->conv_pass_s[i] = median(pass_t[i], o->windows);
    for (int i = 0; bc->context && i < A_PARTS; i++)
        r->attn_part_s[i] = median(attn_t[i], o->windows);

    if (breakdown_window(&s, o->step_window_s, r) != ST_OK) {
        rc = fail(bc->name);
        goto out;
    }
    r->last_loss = s.loss;
    st_epoch_record rec;
    if (st_trainer_metrics(t, &rec) != ST_OK) {
        rc = fail(bc->name);
        goto out;
    }
    r->optim_bytes_per_param = rec.optimizer_bytes_per_param;
    r->act_bytes = rec.memory.peak[ST_MEM_ACTIVATIONS] + rec.memory.peak[ST_MEM_ATTENTION];

out:
    if (ref.conv) {
        conv_ref_free(&ref.c);
        conv_ref_free(&ref.c16);
    } else
        gemm_free(&ref.g);
    attn_ref_free(&attn);
    st_trainer_destroy(t);
    free(order);
    st_dataset_free(&train);
    st_dataset_free(&test);
    return rc;
}

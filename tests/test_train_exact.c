/*
 * tests/test_train_exact.c — the mechanisms checked by value: the branch
 * scales of subnetworks, the alignment report and the communication
 * counters, against models and counts the test makes by hand.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include <subtrain/subtrain.h>
#include "core/arena_impl.h"
#include "train_check.h"

/* ------------------------------------------------------------ exact mechanisms */

/* What the other suites' accuracy bars check only end to end, checked by value
 * here: the branch scales of subnetworks (training: N / k for sdp, N for
 * ist of an mlp; evaluation: 1 / N for ResIST), the alignment report, and
 * the communication counters.  An accuracy bar also depends on the
 * kernels the CPU gets; these do not: they compare the trainer's workers
 * with models the test builds and scales by hand, on the same batch. */

/* The layers a branch scale multiplies, by the names of their segments:
 * a residual block's closing layer (weight and bias), and the layers of
 * an mlp that read a subset of a width layer (fc1.. and the head; their
 * weights only: every worker holds the bias). */
static int closes_a_block(const char *name)
{
    return strncmp(name, "block", 5) == 0 && strstr(name, ".fc2.") != NULL;
}

static int reads_a_width_subset(const char *name)
{
    return (strcmp(name, "head.weight") == 0 ||
            (strncmp(name, "fc", 2) == 0 && strncmp(name, "fc0.", 4) != 0)) &&
           strstr(name, ".weight") != NULL;
}

/* The first batch of d into m (rows 0 .. B - 1 as stored). */
static void first_batch(st_model *m, const st_dataset *d)
{
    const int B = st_model_batch(m);
    uint32_t *idx = malloc((size_t)B * sizeof *idx);
    for (int i = 0; i < B; i++)
        idx[i] = (uint32_t)i;
    st_dataset_gather(d, idx, (size_t)B, st_model_input(m), st_model_labels(m));
    free(idx);
}

/* A model of hcfg (a subnetwork without a branch scale) with m's
 * parameters, those of the segments `scaled` names multiplied by
 * `factor` here; returns the largest difference between its logits and
 * m's on d's first batch, relative to the largest logit.  The two must
 * be the same subnetwork: the same parameters in the same places of the
 * full layout. */
static double hand_scaled_gap(st_model *m, const st_model_config *hcfg, const st_dataset *d,
                              int (*scaled)(const char *), float factor)
{
    st_arena arena;
    st_arena_init(&arena, "hand", NULL, 0);
    st_model *hand;
    cr_assert_eq(st_model_create(hcfg, st_model_batch(m), &arena, &hand), ST_OK, "%s",
                 st_last_error());
    const size_t P = st_model_param_count(m);
    cr_assert_eq(st_model_param_count(hand), P, "the hand-built subnetwork is another one");
    int nm = st_model_full_ranges(m, NULL, NULL, 0), nh = st_model_full_ranges(hand, NULL, NULL, 0);
    cr_assert(nm > 0 && nm == nh, "the hand-built subnetwork holds other parameters");
    st_range *rm = malloc(2 * (size_t)nm * sizeof *rm), *rh = rm + nm;
    size_t *lm = malloc(2 * (size_t)nm * sizeof *lm), *lh = lm + nm;
    st_model_full_ranges(m, rm, lm, nm);
    st_model_full_ranges(hand, rh, lh, nm);
    cr_assert(memcmp(rm, rh, (size_t)nm * sizeof *rm) == 0 &&
              memcmp(lm, lh, (size_t)nm * sizeof *lm) == 0,
              "the hand-built subnetwork holds other parameters");
    free(rm);
    free(lm);
    float *p = st_model_params(hand);
    memcpy(p, st_model_params(m), P * sizeof *p);
    int n_segs, n_scaled = 0;
    const st_param_segment *segs = st_model_segments(hand, &n_segs);
    for (int s = 0; s < n_segs; s++) {
        if (!scaled(segs[s].name))
            continue;
        n_scaled++;
        for (size_t i = 0; i < segs[s].count; i++)
            p[segs[s].offset + i] *= factor;
    }
    cr_assert_gt(n_scaled, 0, "no layer to scale");
    float loss;
    first_batch(m, d);
    first_batch(hand, d);
    cr_assert_eq(st_model_forward_backward(m, &loss), ST_OK, "%s", st_last_error());
    cr_assert_eq(st_model_forward_backward(hand, &loss), ST_OK, "%s", st_last_error());
    const size_t n = (size_t)st_model_batch(m) * hcfg->n_classes;
    const float *a = st_model_logits(m), *b = st_model_logits(hand);
    double gap = 0.0, top = 0.0;
    for (size_t i = 0; i < n; i++) {
        gap = fmax(gap, fabs((double)a[i] - b[i]));
        top = fmax(top, fabs((double)b[i]));
    }
    st_model_destroy(hand);
    st_arena_release(&arena);
    return gap / top;
}

/* Agreement of a forward pass with one scaled by hand: float products in
 * another order (the trainer's primitives, fused scales) only.  Measured
 * about 1e-7; the scale left out moves the logits by 1e-2 or more. */
#define HAND_SCALE_RTOL 1e-5

static st_trainer *make_trainer(const st_train_config *c, const st_dataset *train,
                                const st_dataset *test)
{
    st_trainer *t;
    cr_assert_eq(st_trainer_create(c, train, test, &t), ST_OK, "%s", st_last_error());
    return t;
}

/* sdp, blocks, forward masking, 4 workers at coverage 1/2 (k = 2): each
 * worker's subnetwork is its blocks with every branch scaled by N / k =
 * 2 (the default for resmlp).  Its forward pass is that of the same
 * blocks unscaled with each block's closing layer doubled by hand, after
 * a few steps too. */
Test(scale, sdp_branches_are_scaled_by_workers_over_holders, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = sdp_config(4, 0.5, 20);
    const int N = c.workers, k = (int)(c.sdp.coverage * N + 0.5);
    st_trainer *t = make_trainer(&c, &train, &test);
    st_assignment a;
    cr_assert_eq(st_assignment_make(N, c.model.depth, k, c.seed, 0, &a), ST_OK);
    for (int pass = 0; pass < 2; pass++) {
        for (int w = 0; w < N; w++) {
            int ids[16], n = 0;
            for (int g = 0; g < c.model.depth; g++)
                if (st_assignment_holds(&a, w, g))
                    ids[n++] = g;
            st_model_config h = c.model;
            h.subnet.groups = ids;
            h.subnet.n_groups = n;
            st_model *m = st_trainer_model(t, w);
            double gap = hand_scaled_gap(m, &h, &train, closes_a_block, (float)N / (float)k);
            cr_assert_leq(gap, HAND_SCALE_RTOL, "worker %d: its branches are not scaled by "
                          "N / k = %d / %d (logits %.3g apart)", w, N, k, gap);
            double unscaled = hand_scaled_gap(m, &h, &train, closes_a_block, 1.0f);
            cr_assert_gt(unscaled, 100 * HAND_SCALE_RTOL, "worker %d: the scale shows", w);
        }
        cr_assert_eq(st_trainer_step(t, 5, NULL), ST_OK, "%s", st_last_error());
    }
    st_assignment_free(&a);
    st_trainer_destroy(t);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* ist of an mlp, 2 workers: each holds half of every hidden layer's
 * neuron groups, and what reads a half (fc1, the head) is scaled by N =
 * 2 in training (the default for mlp), like inverted dropout. */
Test(scale, ist_mlp_training_scales_what_reads_a_part_by_n, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = ist_config(2, 10, 20);
    c.model.kind = st_model_kind_named("mlp");
    c.model.depth = 2;
    c.neuron_group = 4;
    const int N = c.workers, L = c.model.depth, G = c.model.width / c.neuron_group;
    st_trainer *t = make_trainer(&c, &train, &test);
    int sizes[2] = { G, G };
    st_assignment a;
    cr_assert_eq(st_assignment_make_sections(N, L, sizes, 1, c.seed, 0, &a), ST_OK);
    for (int w = 0; w < N; w++) {
        int count[2] = { 0, 0 }, kept[64], n = 0;
        for (int l = 0; l < L; l++)
            for (int j = 0; j < G; j++)
                if (st_assignment_holds(&a, w, l * G + j)) {
                    kept[n++] = j;
                    count[l]++;
                }
        st_model_config h = c.model;
        h.subnet.unit_size = c.neuron_group;
        h.subnet.width_count = count;
        h.subnet.width_kept = kept;
        st_model *m = st_trainer_model(t, w);
        double gap = hand_scaled_gap(m, &h, &train, reads_a_width_subset, (float)N);
        cr_assert_leq(gap, HAND_SCALE_RTOL, "worker %d: what reads a part is not scaled by "
                      "N = %d (logits %.3g apart)", w, N, gap);
        double unscaled = hand_scaled_gap(m, &h, &train, reads_a_width_subset, 1.0f);
        cr_assert_gt(unscaled, 100 * HAND_SCALE_RTOL, "worker %d: the scale shows", w);
    }
    st_assignment_free(&a);
    st_trainer_destroy(t);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* The test set's mean loss of m, as an evaluation computes it (stored
 * order, batches of m's batch, the last padded). */
static double test_loss_of(st_model *m, const st_dataset *d)
{
    const int B = st_model_batch(m);
    uint32_t *idx = malloc((size_t)B * sizeof *idx);
    double sum = 0.0;
    int64_t correct = 0;
    for (uint32_t first = 0; first < d->count; first += (uint32_t)B) {
        int rows = d->count - first < (uint32_t)B ? (int)(d->count - first) : B;
        for (int i = 0; i < B; i++)
            idx[i] = first + (uint32_t)(i < rows ? i : 0);
        st_dataset_gather(d, idx, (size_t)B, st_model_input(m), st_model_labels(m));
        cr_assert_eq(st_model_evaluate(m, rows, &sum, &correct), ST_OK, "%s", st_last_error());
    }
    free(idx);
    return sum / d->count;
}

/* ResIST evaluates the full model with every block's branch scaled by
 * 1 / N (each block trained by 1 of N workers): the trainer's evaluation
 * is that of the full model with each block's closing layer divided by N
 * by hand, after a round and at the start. */
Test(scale, ist_evaluation_scales_every_branch_by_one_over_n, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = ist_config(2, 5, 20);
    const int N = c.workers;
    st_trainer *t = make_trainer(&c, &train, &test);
    const size_t P = st_model_config_param_count(&c.model);
    float *full = malloc(P * sizeof *full);
    st_arena arena;
    st_arena_init(&arena, "hand", NULL, 0);
    st_model *hand;
    cr_assert_eq(st_model_create(&c.model, c.batch, &arena, &hand), ST_OK, "%s",
                 st_last_error());
    int n_segs;
    const st_param_segment *segs = st_model_segments(hand, &n_segs);
    for (int pass = 0; pass < 2; pass++) {
        double loss, acc;
        cr_assert_eq(st_trainer_evaluate(t, &loss, &acc), ST_OK, "%s", st_last_error());
        cr_assert_eq(st_trainer_params(t, full, P), ST_OK, "%s", st_last_error());
        double by_hand[2];
        for (int scaled = 0; scaled < 2; scaled++) {
            float *p = st_model_params(hand);
            memcpy(p, full, P * sizeof *p);
            for (int s = 0; scaled && s < n_segs; s++)
                if (closes_a_block(segs[s].name))
                    for (size_t i = 0; i < segs[s].count; i++)
                        p[segs[s].offset + i] *= 1.0f / (float)N;
            by_hand[scaled] = test_loss_of(hand, &test);
        }
        cr_log_info("after %d rounds: ist evaluates %.9f; by hand, branches / %d: %.9f, "
                    "unscaled: %.9f", pass, loss, N, by_hand[1], by_hand[0]);
        cr_assert_float_eq(loss, by_hand[1], HAND_SCALE_RTOL * by_hand[1],
                           "ist evaluates %.9f, the full model with branches / %d %.9f", loss, N,
                           by_hand[1]);
        cr_assert_gt(fabs(by_hand[0] - by_hand[1]), 100 * HAND_SCALE_RTOL * by_hand[1],
                     "the scale shows");
        cr_assert_eq(st_trainer_step(t, c.ist.local_steps, NULL), ST_OK, "%s", st_last_error());
    }
    st_model_destroy(hand);
    st_arena_release(&arena);
    free(full);
    st_trainer_destroy(t);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* The alignment report, against the cosine computed here: at step 1
 * every worker's subnetwork gradient (its own model, the batch of its
 * rows of epoch 1's order) and the full model's gradient with the
 * initial weights on the same batch, over the coordinates the worker
 * holds; the report's mean and minimum are over the 4 workers. */
Test(sdp, alignment_report_is_the_cosine_of_the_two_gradients, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = sdp_config(4, 0.5, 20);
    c.sdp.align_every = 1;
    const int N = c.workers, B = c.batch;
    st_trainer *t = make_trainer(&c, &train, &test);
    uint32_t *order = malloc(train.count * sizeof *order);
    st_epoch_order(c.seed, 0, order, train.count);
    st_arena arena;
    st_arena_init(&arena, "full", NULL, 0);
    st_model *full;
    cr_assert_eq(st_model_create(&c.model, B, &arena, &full), ST_OK, "%s", st_last_error());
    st_model_init_params(full, c.seed);
    double sum = 0.0, least = 2.0;
    for (int w = 0; w < N; w++) {
        st_model *m = st_trainer_model(t, w);
        float loss;
        const uint32_t *rows = order + (size_t)w * B;   /* step 1: rows [w B, (w + 1) B) */
        st_dataset_gather_train(&train, 0, rows, (size_t)B, st_model_input(m), st_model_labels(m));
        cr_assert_eq(st_model_forward_backward(m, &loss), ST_OK, "%s", st_last_error());
        st_dataset_gather_train(&train, 0, rows, (size_t)B, st_model_input(full),
                                st_model_labels(full));
        cr_assert_eq(st_model_forward_backward(full, &loss), ST_OK, "%s", st_last_error());
        int n = st_model_full_grad_ranges(m, NULL, NULL, 0);
        cr_assert_gt(n, 1, "a subnetwork's gradient is in pieces of the full one");
        st_range *r = malloc((size_t)n * sizeof *r);
        size_t *local = malloc((size_t)n * sizeof *local);
        st_model_full_grad_ranges(m, r, local, n);
        const float *g = st_model_grads(m), *f = st_model_grads(full);
        double dot = 0.0, gg = 0.0, ff = 0.0;
        for (int i = 0; i < n; i++)
            for (size_t j = 0; j < r[i].end - r[i].begin; j++) {
                double a = g[local[i] + j], b = f[r[i].begin + j];
                dot += a * b;
                gg += a * a;
                ff += b * b;
            }
        free(r);
        free(local);
        double cosine = dot / sqrt(gg * ff);
        sum += cosine;
        least = fmin(least, cosine);
    }
    cr_assert_eq(st_trainer_step(t, 1, NULL), ST_OK, "%s", st_last_error());
    st_epoch_record rec;
    cr_assert_eq(st_trainer_metrics(t, &rec), ST_OK, "%s", st_last_error());
    cr_log_info("alignment at step 1: reported mean %.9f min %.9f; computed %.9f, %.9f",
                rec.align_mean, rec.align_min, sum / N, least);
    cr_assert_eq(rec.align_measured, N);
    cr_assert_float_eq(rec.align_mean, sum / N, 1e-5, "reported mean %.9f, the cosines' %.9f",
                       rec.align_mean, sum / N);
    cr_assert_float_eq(rec.align_min, least, 1e-5, "reported min %.9f, the cosines' %.9f",
                       rec.align_min, least);
    cr_assert_lt(sum / N, 0.9999, "below full coverage the gradients differ");
    st_model_destroy(full);
    st_arena_release(&arena);
    free(order);
    st_trainer_destroy(t);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* Holders of every element of the full layout (n_params), from the
 * workers' models as the trainer has them now, and what each worker holds
 * (held[w] elements, the parameters of its model). */
static uint16_t *count_holders(st_trainer *t, size_t n_params, size_t *held)
{
    uint16_t *holders = calloc(n_params, sizeof *holders);
    for (int w = 0; w < st_trainer_workers(t); w++) {
        st_model *m = st_trainer_model(t, w);
        int n = st_model_full_ranges(m, NULL, NULL, 0);
        st_range *r = malloc((size_t)n * sizeof *r);
        size_t *local = malloc((size_t)n * sizeof *local);
        st_model_full_ranges(m, r, local, n);
        held[w] = 0;
        for (int i = 0; i < n; i++) {
            for (size_t e = r[i].begin; e < r[i].end; e++)
                holders[e]++;
            held[w] += r[i].end - r[i].begin;
        }
        cr_assert_eq(held[w], st_model_param_count(m));
        free(r);
        free(local);
    }
    return holders;
}

/* A step's bytes of worker w in a one-level engine: as the owner of its
 * shard, each element's holders' gradients read and the mean written
 * (elements someone holds); with the all-gather, every element w holds
 * read from its owner and written into w's vector. */
static double engine_bytes(const uint16_t *holders, size_t n_params, int n, int w, size_t held,
                           int gather)
{
    st_range s = shard_of(n_params, n, w);
    double b = 0.0;
    for (size_t e = s.begin; e < s.end; e++)
        b += 4.0 * (holders[e] + (holders[e] > 0));
    return b + (gather ? 8.0 * (double)held : 0.0);
}

/* sdp, blocks at coverage 1/2 over 4 workers: the record's bytes per
 * step are the busiest worker's, from the holders of its shard and what
 * it holds (every worker has the stem, the final norm and the head; each
 * block is held by 2). */
Test(comm_counters, sdp_bytes_per_step_follow_the_holders, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = sdp_config(4, 0.5, 20);
    char pu[32];
    one_pu_cpuset(pu, sizeof pu);
    c.cpuset = pu;
    st_trainer *t = make_trainer(&c, &train, &test);
    cr_assert_eq(st_trainer_step(t, 3, NULL), ST_OK, "%s", st_last_error());
    st_epoch_record rec;
    cr_assert_eq(st_trainer_metrics(t, &rec), ST_OK, "%s", st_last_error());
    const size_t P = st_model_config_param_count(&c.model);
    size_t held[4];
    uint16_t *holders = count_holders(t, P, held);
    double busiest = 0.0;
    for (int w = 0; w < 4; w++)
        busiest = fmax(busiest, engine_bytes(holders, P, 4, w, held[w], 1));
    cr_assert_eq(rec.comm_bytes_per_worker_step, busiest, "%.0f bytes a step, the holders "
                 "make %.0f", rec.comm_bytes_per_worker_step, busiest);
    cr_assert_eq(rec.comm_bytes_per_worker_round, 0.0, "no rounds in sdp");
    free(holders);
    st_trainer_destroy(t);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

/* Whether workers 0 and 1 have the same values of every parameter both
 * hold (the layers every ResIST subnetwork shares): *both of them. */
static size_t shared_equal(st_trainer *t, size_t n_params, size_t *both)
{
    float *v[2];
    uint8_t *has[2];
    for (int w = 0; w < 2; w++) {
        st_model *m = st_trainer_model(t, w);
        v[w] = malloc(n_params * sizeof *v[w]);
        has[w] = calloc(n_params, 1);
        int n = st_model_full_ranges(m, NULL, NULL, 0);
        st_range *r = malloc((size_t)n * sizeof *r);
        size_t *local = malloc((size_t)n * sizeof *local);
        st_model_full_ranges(m, r, local, n);
        for (int i = 0; i < n; i++)
            for (size_t e = r[i].begin; e < r[i].end; e++) {
                v[w][e] = st_model_params(m)[local[i] + e - r[i].begin];
                has[w][e] = 1;
            }
        free(r);
        free(local);
    }
    size_t equal = 0;
    *both = 0;
    for (size_t e = 0; e < n_params; e++)
        if (has[0][e] && has[1][e]) {
            (*both)++;
            equal += memcmp(&v[0][e], &v[1][e], sizeof(float)) == 0;
        }
    for (int w = 0; w < 2; w++) {
        free(v[w]);
        free(has[w]);
    }
    return equal;
}

/* ist communicates once a round, and its record says how much: 2 workers,
 * rounds of R = 5 steps.  Between round ends the workers' copies of the
 * shared layers drift apart (nobody communicates); right after one they
 * are the same (the average, loaded back).  The bytes of a round are the
 * busiest worker's reduce-scatter of the parameters (no all-gather: the
 * next subnetwork is loaded from the owners' shards, its parameters read
 * and written once), and the record's bytes per step are those / R. */
Test(comm_counters, ist_communicates_once_a_round, .timeout = 120)
{
    st_dataset train, test;
    make_data(5, &train, &test);
    st_train_config c = ist_config(2, 5, 20);
    char pu[32];
    one_pu_cpuset(pu, sizeof pu);
    c.cpuset = pu;
    const uint64_t R = c.ist.local_steps;
    const size_t P = st_model_config_param_count(&c.model);
    st_trainer *t = make_trainer(&c, &train, &test);
    for (uint64_t step = 1; step <= 2 * R; step++) {
        cr_assert_eq(st_trainer_step(t, 1, NULL), ST_OK, "%s", st_last_error());
        size_t both, equal = shared_equal(t, P, &both);
        cr_assert_gt(both, 0, "the stem, final norm and head are shared");
        if (step % R == 0)
            cr_assert_eq(equal, both, "step %llu ends a round: the shared layers are averaged "
                         "(%zu of %zu equal)", (unsigned long long)step, equal, both);
        else
            cr_assert_lt(equal, both, "step %llu is inside a round: no communication, the "
                         "shared layers differ (%zu of %zu equal)", (unsigned long long)step,
                         equal, both);
    }
    st_epoch_record rec;
    cr_assert_eq(st_trainer_metrics(t, &rec), ST_OK, "%s", st_last_error());
    size_t held[2];
    uint16_t *holders = count_holders(t, P, held);
    double round = 0.0;
    for (int w = 0; w < 2; w++)
        round = fmax(round, engine_bytes(holders, P, 2, w, held[w], 0) + 8.0 * (double)held[w]);
    cr_assert_eq(rec.comm_bytes_per_worker_step, round / (double)R, "%.1f bytes a step, the "
                 "holders make %.0f a round of %llu steps", rec.comm_bytes_per_worker_step, round,
                 (unsigned long long)R);
    cr_assert_float_eq(rec.comm_bytes_per_worker_round, round, 1e-9 * round, "%.0f bytes a "
                       "round, the holders make %.0f", rec.comm_bytes_per_worker_round, round);
    free(holders);
    st_trainer_destroy(t);
    st_dataset_free(&train);
    st_dataset_free(&test);
}

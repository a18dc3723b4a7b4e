/*
 * tests/test_cli_precision.c — bf16 runs against fp32 runs: products (mlp,
 * gpt attention, ResNet) and the reduction's communication, each
 * deterministic and close to fp32; a CPU without bf16 named.
 */
#include "cli_run.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <criterion/criterion.h>
#include <subtrain/model.h>
#include <signal.h>

/* The final record's value of "key": (a number). */
static double final_value(const char *out, const char *key)
{
    const char *f = strstr(out, "\"final\":true");
    cr_assert_not_null(f, "no final record: %s", out);
    const char *v = strstr(f, key);
    cr_assert_not_null(v, "%s not in the final record", key);
    return strtod(v + strlen(key), NULL);
}

/* --precision bf16: trains to what fp32 trains (the products' rounding
 * only), the same run twice is bitwise the same (every record), and a
 * CPU without bf16 is told so in one line naming oneDNN's ISA, which
 * ONEDNN_MAX_CPU_ISA lowers here: AVX2 has no bf16 matmul at all,
 * AVX512_CORE only an emulated one, refused unless --bf16-emulated. */
Test(cli, bf16_trains_like_fp32_deterministically_and_names_a_missing_isa, .timeout = 120)
{
    const st_bf16_support have = st_bf16_probe(NULL);
    run_result *r = calloc(1, sizeof *r), *again = calloc(1, sizeof *again);
    const char *base = "--data synthetic --model resmlp --depth 2 --width 128 --steps 60 "
                       "--batch 64 --progress none --metrics /dev/stdout";
    char opts[512];
    if (have != ST_BF16_UNAVAILABLE) {
        snprintf(opts, sizeof opts, "%s --precision bf16%s", base,
                 have == ST_BF16_EMULATED ? " --bf16-emulated" : "");
        run(r, NULL, opts);
        cr_assert_eq(r->status, 0, "%s", r->err);
        run(again, NULL, opts);
        expect_same_records(r->out, again->out, "bf16");
        cr_assert(strstr(r->out, "\"precision\":\"bf16\""), "%s", r->out);
        cr_assert(strstr(r->out, "bf16 gelu"), "the plan names the precision: %s", r->out);
        run(again, NULL, base);
        cr_assert_eq(again->status, 0, "%s", again->err);
        cr_assert(strstr(again->out, "\"precision\":\"fp32\""), "%s", again->out);
        const double t16 = final_value(r->out, "\"test_loss\":");
        const double t32 = final_value(again->out, "\"test_loss\":");
        cr_assert(fabs(t16 - t32) <= 0.02 * t32, "bf16 test loss %.6f, fp32 %.6f", t16, t32);
        cr_assert(t16 != t32, "bf16 and fp32 ended bitwise equal (%.6f): bf16 not used?", t16);
        /* The activations kept for the backward (the peak breakdown's
         * "activations"), the default resmlp (depth 4, width 256, batch
         * 128): bf16 keeps 2-byte copies only (linear layers, norms,
         * activations), the fp32 tensors no backward reads share the
         * workspace, so at most 0.55x fp32's. */
        snprintf(opts, sizeof opts, "--data synthetic --steps 3 --progress none --metrics "
                 "/dev/stdout --precision bf16%s", have == ST_BF16_EMULATED ? " --bf16-emulated" : "");
        run(r, NULL, opts);
        cr_assert_eq(r->status, 0, "%s", r->err);
        run(again, NULL, "--data synthetic --steps 3 --progress none --metrics /dev/stdout");
        cr_assert_eq(again->status, 0, "%s", again->err);
        const char *k16 = strstr(strstr(r->out, "\"final\":true"), "\"activations\":");
        const char *k32 = strstr(strstr(again->out, "\"final\":true"), "\"activations\":");
        cr_assert(k16 && k32, "no activations in the final records: %s", r->out);
        const double a16 = strtod(k16 + 14, NULL), a32 = strtod(k32 + 14, NULL);
        cr_assert(a32 > 0 && a16 <= 0.55 * a32, "activations: bf16 %.0f bytes, fp32 %.0f (%.3fx)",
                  a16, a32, a16 / a32);
    }
    run(r, "ONEDNN_MAX_CPU_ISA=AVX2", "--data synthetic --steps 2 --precision bf16");
    cr_assert_eq(r->status, 2, "%s", r->err);
    cr_assert(count_lines(r->err) == 1 && strstr(r->err, "ISA avx2"), "%s", r->err);
    if (have == ST_BF16_NATIVE) {   /* else AVX512_CORE may not lower anything */
        run(r, "ONEDNN_MAX_CPU_ISA=AVX512_CORE", "--data synthetic --steps 2 --precision bf16");
        cr_assert_eq(r->status, 2, "%s", r->err);
        cr_assert(count_lines(r->err) == 1 && strstr(r->err, "avx512_core, without native "
                                                     "bf16"), "%s", r->err);
        run(r, "ONEDNN_MAX_CPU_ISA=AVX512_CORE", "--data synthetic --steps 2 --precision bf16 "
            "--bf16-emulated --progress none");
        cr_assert_eq(r->status, 0, "%s", r->err);
        cr_assert(strstr(r->err, "warning: bf16 runs emulated on ISA avx512_core"), "%s",
                  r->err);
    }
    expect_usage_error("--data synthetic --precision fp16", "--precision");
    free(r);
    free(again);
}

/* --comm-precision bf16: two workers reduce bf16-rounded gradients (fp32
 * sums): the same run twice is bitwise the same (every record's losses
 * and accuracy), it trains to within a few percent of fp32's test loss
 * without being equal to it (the rounding is used), for dp and an sdp
 * variant; the records and the plan say so; the bytes per step count the
 * bf16 reads and the conversion; ist, a bad value: usage errors. */
Test(cli, comm_bf16_is_deterministic_and_close_to_fp32, .timeout = 180)
{
    const char *variants[] = {
        "--data synthetic --model resmlp --depth 2 --width 128 --steps 60 --batch 32 --workers 2",
        "--data synthetic --model resmlp --depth 4 --width 64 --steps 60 --batch 16 --workers 4 "
        "--strategy sdp --subnet block --masking backward",
    };
    run_result *r = calloc(1, sizeof *r), *again = calloc(1, sizeof *again);
    run_result *f32 = calloc(1, sizeof *f32);
    /* the records in a file of their own (a second opening of /dev/stdout
     * would write over the summary, or the summary over them), appended
     * to what the run printed */
    char dir[ST_TEST_PATH_MAX], path[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
#define RUN_WITH_RECORDS(res, o)                                                               \
    do {                                                                                       \
        remove(path);                                                                          \
        run(res, NULL, o);                                                                     \
        size_t have = strlen((res)->out);                                                      \
        read_into(path, (res)->out + have, sizeof (res)->out - have);                          \
    } while (0)
    for (size_t k = 0; k < sizeof variants / sizeof variants[0]; k++) {
        char opts[3 * ST_TEST_PATH_MAX + 512];
        snprintf(opts, sizeof opts, "%s --oversubscribe --progress none --metrics '%s' "
                 "--comm-precision bf16", variants[k], path);
        RUN_WITH_RECORDS(r, opts);
        cr_assert_eq(r->status, 0, "%s: %s", opts, r->err);
        RUN_WITH_RECORDS(again, opts);
        cr_assert_eq(again->status, 0, "%s", again->err);
        expect_same_records(r->out, again->out, "comm-bf16");
        cr_assert(strstr(r->out, "\"comm_precision\":\"bf16\""), "%s", r->out);
        cr_assert(strstr(r->out, ", comm bf16"), "the plan names it: %s", r->out);
        snprintf(opts, sizeof opts, "%s --oversubscribe --progress none --metrics '%s'",
                 variants[k], path);
        RUN_WITH_RECORDS(f32, opts);
        cr_assert_eq(f32->status, 0, "%s", f32->err);
        cr_assert(strstr(f32->out, "\"comm_precision\":\"fp32\""), "%s", f32->out);
        const double t16 = final_value(r->out, "\"test_loss\":");
        const double t32 = final_value(f32->out, "\"test_loss\":");
        cr_assert(fabs(t16 - t32) <= 0.03 * t32, "%s: comm bf16 test loss %.6f, fp32 %.6f",
                  variants[k], t16, t32);
        /* the records print 6 digits: compare the final train losses and
         * the bytes too, one of them must show the rounding */
        const double r16 = final_value(r->out, "\"train_loss\":");
        const double r32 = final_value(f32->out, "\"train_loss\":");
        cr_assert(t16 != t32 || r16 != r32, "%s: comm bf16 and fp32 ended equal (%.6f, %.6f): "
                  "bf16 not used?", variants[k], t16, r16);
        /* bytes: bf16 reads are 2 bytes, plus each worker's conversion
         * pass (read 4, write 2 an element): more than fp32 in all, and
         * strictly counted (not equal) */
        const double b16 = final_value(r->out, "\"comm_bytes_per_worker_step\":");
        const double b32 = final_value(f32->out, "\"comm_bytes_per_worker_step\":");
        cr_assert(b16 != b32 && b16 > 0, "bytes %.0f vs fp32 %.0f", b16, b32);
        cr_assert(strstr(r->out, "bf16 gradients: read at 2 bytes"), "%s", r->out);
    }
    expect_usage_error("--data synthetic --comm-precision fp16", "--comm-precision");
    expect_usage_error("--data synthetic --workers 2 --strategy ist --comm-precision bf16",
                       "--comm-precision bf16");
#undef RUN_WITH_RECORDS
    remove(path);
    st_test_rmdir(dir);
    free(r);
    free(again);
    free(f32);
}

/* --precision bf16 with --model gpt: attention's products in bf16 too.
 * The same run twice is bitwise the same (every record's losses), it
 * trains to what fp32 trains (the products' rounding only: within 2%,
 * not equal), and the probabilities kept for the backward take half the
 * bytes (the attention line of the memory breakdown). */
Test(cli, bf16_gpt_attention_deterministic_close_to_fp32_half_the_memory, .timeout = 120)
{
    const st_bf16_support have = st_bf16_probe(NULL);
    if (have == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 matmul on this CPU");
    char dir[ST_TEST_PATH_MAX], path[ST_TEST_PATH_MAX], base[2 * ST_TEST_PATH_MAX];
    char opts[3 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(path, dir, "words.txt");
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    static const char *const words[] = { "the", "word", "of", "a", "dictionary", "noun",
                                         "verb", "to", "learn", "attention", "in", "and" };
    uint32_t h = 5;
    for (int i = 0; i < 6000; i++) {   /* a fixed pseudo-random text */
        h = h * 1103515245u + 12345u;
        fprintf(f, "%s%s", words[(h >> 16) % 12], (h >> 8) % 10 ? " " : ".\n");
    }
    fclose(f);
    snprintf(base, sizeof base, "--model gpt --data 'text:%s' --depth 2 --width 32 --heads 2 "
             "--context 32 --batch 8 --steps 150 --val-bytes 2048 --seed 2 --progress none "
             "--metrics /dev/stdout", path);
    run_result *r = calloc(1, sizeof *r), *again = calloc(1, sizeof *again);
    cr_assert(r && again);
    snprintf(opts, sizeof opts, "%s --precision bf16%s", base,
             have == ST_BF16_EMULATED ? " --bf16-emulated" : "");
    run(r, NULL, opts);
    cr_assert_eq(r->status, 0, "%s", r->err);
    run(again, NULL, opts);
    cr_assert_eq(again->status, 0, "%s", again->err);
    expect_same_records(r->out, again->out, "bf16 gpt");
    cr_assert(strstr(r->out, "\"precision\":\"bf16\""), "%s", r->out);
    run(again, NULL, base);
    cr_assert_eq(again->status, 0, "%s", again->err);
    const double t16 = final_value(r->out, "\"test_loss\":");
    const double t32 = final_value(again->out, "\"test_loss\":");
    cr_assert(fabs(t16 - t32) <= 0.02 * t32, "bf16 gpt test loss %.6f, fp32 %.6f", t16, t32);
    cr_assert(t16 != t32, "bf16 and fp32 gpt ended bitwise equal (%.6f): bf16 not used?", t16);
    const double a16 = final_value(r->out, "\"attention\":");
    const double a32 = final_value(again->out, "\"attention\":");
    cr_assert(a32 > 0 && a16 == a32 / 2, "attention memory: bf16 %.0f bytes, fp32 %.0f", a16,
              a32);
    free(r);
    free(again);
    st_test_rmdir(dir);
}

/* --precision bf16 of a ResNet: its convolutions read bf16 copies of
 * their inputs, weights and output gradients, and the block's BN -> ReLU
 * outputs each conv reads share buffers (graph.c's assign_forward_only).
 * The same run twice is bitwise the same (every record), and it trains
 * to what fp32 trains, not to the same bits.  On Fashion-MNIST, where it
 * is installed (the default data set; no synthetic images here). */
Test(cli, resnet_bf16_deterministic_and_close_to_fp32, .timeout = 240)
{
    const st_bf16_support have = st_bf16_probe(NULL);
    if (have == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 kernels on this CPU");
    const char *data = getenv("SUBTRAIN_DATA") ? getenv("SUBTRAIN_DATA")
                                               : "/usr/share/datasets/fashion-mnist";
    char probe[ST_TEST_PATH_MAX + 64];
    snprintf(probe, sizeof probe, "%s/train-images-idx3-ubyte.gz", data);
    if (access(probe, R_OK) != 0)
        cr_skip_test("no Fashion-MNIST at %s", data);
    run_result *r = calloc(1, sizeof *r), *again = calloc(1, sizeof *again);
    char base[512], opts[600];
    snprintf(base, sizeof base, "--data '%s' --model resnet --depth 1 --steps 30 --batch 32 "
             "--progress none --metrics /dev/stdout", data);
    snprintf(opts, sizeof opts, "%s --precision bf16%s", base,
             have == ST_BF16_EMULATED ? " --bf16-emulated" : "");
    run(r, NULL, opts);
    cr_assert_eq(r->status, 0, "%s", r->err);
    run(again, NULL, opts);
    cr_assert_eq(again->status, 0, "%s", again->err);
    expect_same_records(r->out, again->out, "bf16 resnet");
    cr_assert(strstr(r->out, "\"precision\":\"bf16\""), "%s", r->out);
    cr_assert(strstr(r->out, "resnet depth 1 width 16 bf16"), "the plan: %s", r->out);
    run(again, NULL, base);
    cr_assert_eq(again->status, 0, "%s", again->err);
    const char *f16 = strstr(r->out, "\"final\":true"), *f32 = strstr(again->out, "\"final\":true");
    cr_assert(f16 && f32, "%s\n%s", r->out, again->out);
    const char *keys[3] = { "train_loss", "test_loss", "test_acc" };
    int equal = 0;
    for (int k = 0; k < 3; k++) {
        const double v16 = st_json_number_at(r->out, f16, keys[k]);
        const double v32 = st_json_number_at(again->out, f32, keys[k]);
        cr_assert(!isnan(v16) && !isnan(v32), "%s in both final records", keys[k]);
        fprintf(stderr, "[resnet] %s bf16 %.6f, fp32 %.6f\n", keys[k], v16, v32);
        cr_assert(fabs(v16 - v32) <= 0.03 * fabs(v32), "%s bf16 %.6f, fp32 %.6f", keys[k], v16,
                  v32);
        equal += v16 == v32;
    }
    cr_assert_lt(equal, 3, "bf16 and fp32 resnet runs ended bitwise equal: bf16 not used?");
    free(r);
    free(again);
}

/* --tensor-layout: a ResNet on 8 x 8 images with channels-last tensors
 * trains to what the blocked layout does (summation order only), bf16
 * too, with bf16 tensors between its layers as well; --dump-config
 * carries the layout; a bad one is a usage error. */
Test(cli, tensor_layouts_train_alike, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], opts[4 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    write_idx_set(dir, 64, 16, 4, 5);
    run_result *r = calloc(1, sizeof *r), *b = calloc(1, sizeof *b);
    const int precisions = st_bf16_probe(NULL) == ST_BF16_NATIVE ? 3 : 1;
    for (int p = 0; p < precisions; p++) {
        const char *prec = p == 2 ? "bf16 --activation-precision bf16" : p ? "bf16" : "fp32";
        for (int k = 0; k < 2; k++) {
            snprintf(opts, sizeof opts, "--data 'idx:%s:tr-img,tr-lab,te-img,te-lab' --model "
                     "resnet --depth 1 --width 16 --batch 8 --steps 6 --seed 5 --progress none "
                     "--metrics /dev/stdout --precision %s --tensor-layout %s", dir, prec,
                     k ? "nhwc" : "blocked");
            run(k ? r : b, NULL, opts);
            cr_assert_eq((k ? r : b)->status, 0, "%s: %s", opts, (k ? r : b)->err);
        }
        const char *fb = strstr(b->out, "\"final\":true"), *fn = strstr(r->out, "\"final\":true");
        cr_assert(fb && fn, "%s\n%s", b->out, r->out);
        const char *keys[2] = { "train_loss", "test_loss" };
        for (int k = 0; k < 2; k++) {
            const double vb = st_json_number_at(b->out, fb, keys[k]);
            const double vn = st_json_number_at(r->out, fn, keys[k]);
            fprintf(stderr, "[layout] %s %s blocked %.7f, nhwc %.7f\n", prec, keys[k], vb, vn);
            cr_assert(fabs(vb - vn) <= (p ? 1e-2 : 1e-4) * fabs(vb), "%s %s: blocked %.7f, nhwc %.7f",
                      prec, keys[k], vb, vn);
        }
    }
    run(r, NULL, "--model resnet --tensor-layout nhwc --dump-config");
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert(strstr(r->out, "tensor-layout = nhwc\n"), "%s", r->out);
    run(r, NULL, "--model resnet --dump-config");
    cr_assert(strstr(r->out, "tensor-layout = auto\n"), "auto is the default: %s", r->out);
    free(r);
    free(b);
    st_test_rmdir(dir);
    expect_usage_error("--tensor-layout sideways", "--tensor-layout");
}

/* --weight-layout blocked: the linear layers' products read blocked
 * copies of the weights, packed by the update (one worker's own; the
 * shard owners' into their domain's with two); either trains to what
 * plain copies give (the same
 * kernels, up to where they find the packed weights), and bitwise to
 * what the layers' own packing gives (--unfuse weight-copy); --dump-config
 * carries the layout; a bad one, one without --precision bf16 and one
 * with a bf16 master are usage errors. */
Test(cli, weight_layouts_train_alike, .timeout = 120)
{
    if (st_bf16_probe(NULL) != ST_BF16_NATIVE)
        cr_skip_test("no native bf16 here");
    run_result *r = calloc(1, sizeof *r), *b = calloc(1, sizeof *b);
    char opts[512];
    run_result *u = calloc(1, sizeof *u);
    snprintf(opts, sizeof opts, "--data synthetic --model resmlp --depth 2 --width 80 --batch 16 "
             "--steps 12 --seed 5 --progress none --metrics /dev/stdout --precision bf16 "
             "--weight-layout blocked --unfuse weight-copy");
    run(u, NULL, opts);
    cr_assert_eq(u->status, 0, "%s: %s", opts, u->err);
    for (int w = 1; w <= 2; w++) {
        for (int k = 0; k < 2; k++) {
            snprintf(opts, sizeof opts, "--data synthetic --model resmlp --depth 2 --width 80 "
                     "--batch 16 --steps 12 --seed 5 --progress none --metrics /dev/stdout "
                     "--precision bf16 --workers %d --oversubscribe --weight-layout %s", w,
                     k ? "blocked" : "plain");
            run(k ? r : b, NULL, opts);
            cr_assert_eq((k ? r : b)->status, 0, "%s: %s", opts, (k ? r : b)->err);
        }
        const char *fp = strstr(b->out, "\"final\":true"), *fb = strstr(r->out, "\"final\":true");
        cr_assert(fp && fb, "%s\n%s", b->out, r->out);
        const char *keys[2] = { "train_loss", "test_loss" };
        for (int k = 0; k < 2; k++) {
            const double vp = st_json_number_at(b->out, fp, keys[k]);
            const double vb = st_json_number_at(r->out, fb, keys[k]);
            cr_assert(fabs(vp - vb) <= 1e-4 * fabs(vp), "%d workers, %s: plain %.7f, "
                      "blocked %.7f", w, keys[k], vp, vb);
            if (w == 1) {
                const double vu = st_json_number_at(u->out, strstr(u->out, "\"final\":true"),
                                                    keys[k]);
                cr_assert(vb == vu, "%s: packed by the update %.9g, by the layers %.9g",
                          keys[k], vb, vu);
            }
        }
    }
    free(u);
    run(r, NULL, "--precision bf16 --weight-layout blocked --dump-config");
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert(strstr(r->out, "weight-layout = blocked\n"), "%s", r->out);
    run(r, NULL, "--precision bf16 --dump-config");
    cr_assert(strstr(r->out, "weight-layout = plain\n"), "plain is the default: %s", r->out);
    free(r);
    free(b);
    expect_usage_error("--weight-layout packed", "--weight-layout");
    expect_usage_error("--data synthetic --weight-layout blocked",
                       "--weight-layout blocked needs --precision bf16");
    expect_usage_error("--data synthetic --precision bf16 --weight-layout blocked "
                       "--master-weights bf16-sr", "which --weight-layout blocked does not make");
}

/* --weight-layout blocked with workers sharing their domain's weights:
 * one set of blocked copies a domain, which the shard owners' updates
 * write (shard edges inside rows), the initial and resumed loads write in
 * parts, and each domain packs the shards the all-gather brought from the
 * others.  Every run's weights are bitwise those of the layers packing
 * their own copies in every forward (--unfuse weight-copy), over one and
 * two domains, sdp with backward masking and redrawn masks, and a resume;
 * a worker's weight memory is its share of one copy. */
Test(cli, shared_blocked_copies_are_packed_by_their_writers, .timeout = 240)
{
    if (st_bf16_probe(NULL) != ST_BF16_NATIVE)
        cr_skip_test("no native bf16 here");
    run_result *r = calloc(1, sizeof *r);
    char dir[ST_TEST_PATH_MAX], opts[3 * ST_TEST_PATH_MAX + 512];
    char a[2 * ST_TEST_PATH_MAX], b[2 * ST_TEST_PATH_MAX], env[256];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    const char *base = "--data synthetic --model resmlp --depth 2 --width 80 --batch 16 "
                       "--steps 12 --seed 5 --progress none -q --precision bf16 "
                       "--weight-layout blocked --oversubscribe";
    const struct {
        int two_domains;
        const char *opts;
    } runs[] = {
        { 0, "--workers 2" },
        { 0, "--workers 3" },   /* shard edges inside rows */
        { 0, "--workers 2 --strategy sdp --masking backward --resample 4" },
        { 1, "--workers 2" },   /* one worker a domain */
        { 1, "--workers 5" },
    };
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        snprintf(env, sizeof env, "%s", runs[k].two_domains ? two_domains_env() : "");
        for (int unfused = 0; unfused < 2; unfused++) {
            snprintf(opts, sizeof opts, "%s %s --checkpoint '%s/%c'%s", base, runs[k].opts, dir,
                     "ab"[unfused], unfused ? " --unfuse weight-copy" : "");
            run(r, env, opts);
            cr_assert_eq(r->status, 0, "%s: %s", opts, r->err);
        }
        snprintf(a, sizeof a, "%s/a/final.safetensors", dir);
        snprintf(b, sizeof b, "%s/b/final.safetensors", dir);
        cr_assert(same_file(a, b), "%s%s: the shared copies train otherwise than the layers' "
                  "own", env, runs[k].opts);
    }
    /* a resume from a step checkpoint, bitwise the run it resumes */
    snprintf(opts, sizeof opts, "%s --workers 2 --checkpoint '%s/c' --checkpoint-every 6", base,
             dir);
    run(r, NULL, opts);
    cr_assert_eq(r->status, 0, "%s: %s", opts, r->err);
    snprintf(opts, sizeof opts, "%s --workers 2 --checkpoint '%s/d' "
             "--resume '%s/c/step-00000006.safetensors'", base, dir, dir);
    run(r, NULL, opts);
    cr_assert_eq(r->status, 0, "%s: %s", opts, r->err);
    snprintf(a, sizeof a, "%s/c/final.safetensors", dir);
    snprintf(b, sizeof b, "%s/d/final.safetensors", dir);
    cr_assert(same_file(a, b), "a resumed run with shared blocked copies differs");
    /* memory: n workers of one domain hold a share of one worker's weights */
    double one = 0.0;
    for (int n = 1; n <= 4; n *= 2) {
        snprintf(opts, sizeof opts, "%s --workers %d --steps 2 --metrics /dev/stdout", base, n);
        run(r, NULL, opts);
        cr_assert_eq(r->status, 0, "%s: %s", opts, r->err);
        const double weights = final_value(r->out, "\"weights\":");
        if (n == 1)
            one = weights;
        else
            cr_assert(weights <= ceil(one / n), "%d workers hold %.0f bytes of weights each, "
                      "one alone %.0f", n, weights, one);
    }
    free(r);
    st_test_rmdir(dir);
}

/* A worker that updates a model of its own outside dp (an ist
 * subnetwork, a synth segment trained by one worker) writes its weight
 * copies in its update, and a synth group's all-gather writes its
 * members': bitwise the run whose layers convert their own in every
 * forward (--unfuse weight-copy), with the update's or the all-gather's
 * bytes counting the copies. */
Test(cli, own_updates_write_the_weight_copies, .timeout = 240)
{
    if (st_bf16_probe(NULL) != ST_BF16_NATIVE)
        cr_skip_test("no native bf16 here");
    run_result *r = calloc(1, sizeof *r);
    char dir[ST_TEST_PATH_MAX], opts[3 * ST_TEST_PATH_MAX + 512];
    char a[2 * ST_TEST_PATH_MAX], b[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    const char *base = "--data synthetic --width 80 --batch 16 --seed 5 --progress none -q "
                       "--precision bf16 --oversubscribe --metrics /dev/stdout";
    const char *optimizer = "\"bytes_per_param\":", *gather = "\"comm_bytes_per_worker_step\":";
    const struct {
        const char *opts, *key;
    } runs[] = {
        { "--model resmlp --depth 2 --steps 12 --workers 2 --strategy ist --local-steps 3",
          optimizer },
        { "--model resmlp --depth 2 --steps 12 --workers 2 --strategy ist --local-steps 3 "
          "--weight-layout blocked", optimizer },
        { "--model mlp --depth 3 --epochs 1 --workers 2 --strategy synth", optimizer },
        { "--model mlp --depth 3 --epochs 1 --workers 3 --strategy synth", gather },
        { "--model mlp --depth 3 --epochs 1 --workers 3 --strategy synth --weight-layout blocked",
          gather },
    };
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        double bytes[2];
        for (int unfused = 0; unfused < 2; unfused++) {
            snprintf(opts, sizeof opts, "%s %s --checkpoint '%s/%c%zu'%s", base, runs[k].opts,
                     dir, "ab"[unfused], k, unfused ? " --unfuse weight-copy" : "");
            run(r, NULL, opts);
            cr_assert_eq(r->status, 0, "%s: %s", opts, r->err);
            bytes[unfused] = final_value(r->out, runs[k].key);
        }
        snprintf(a, sizeof a, "%s/a%zu/final.safetensors", dir, k);
        snprintf(b, sizeof b, "%s/b%zu/final.safetensors", dir, k);
        cr_assert(same_file(a, b), "%s: the copies written by the update or the all-gather "
                  "train otherwise than the layers' own", runs[k].opts);
        cr_assert_gt(bytes[0], bytes[1], "%s: %s%.2f, as without the copies (%.2f)",
                     runs[k].opts, runs[k].key, bytes[0], bytes[1]);
    }
    free(r);
    st_test_rmdir(dir);
}

/* A replica's blocked copies (--weights private, sdp with forward
 * masking, localsgd's averages) are packed by the all-gather as it writes
 * the replica: bitwise the run whose layers pack their own in every
 * forward, and the all-gather's bytes count the packing. */
Test(cli, replica_blocked_copies_are_packed_by_the_all_gather, .timeout = 240)
{
    if (st_bf16_probe(NULL) != ST_BF16_NATIVE)
        cr_skip_test("no native bf16 here");
    run_result *r = calloc(1, sizeof *r);
    char dir[ST_TEST_PATH_MAX], opts[3 * ST_TEST_PATH_MAX + 512];
    char a[2 * ST_TEST_PATH_MAX], b[2 * ST_TEST_PATH_MAX], env[256];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    const char *base = "--data synthetic --model resmlp --depth 2 --width 80 --batch 16 "
                       "--steps 12 --seed 5 --progress none -q --precision bf16 "
                       "--weight-layout blocked --oversubscribe --metrics /dev/stdout";
    const struct {
        int two_domains;
        const char *opts;
    } runs[] = {
        { 0, "--workers 2 --weights private" },
        { 0, "--workers 3 --weights private" },   /* shard edges inside rows */
        { 1, "--workers 3 --weights private" },   /* a copier's replica read */
        { 0, "--workers 3 --strategy sdp --masking forward --resample 4" },
        { 0, "--workers 2 --strategy localsgd --local-steps 3" },
    };
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        snprintf(env, sizeof env, "%s", runs[k].two_domains ? two_domains_env() : "");
        double bytes[2];
        for (int unfused = 0; unfused < 2; unfused++) {
            snprintf(opts, sizeof opts, "%s %s --checkpoint '%s/%c%zu'%s", base, runs[k].opts,
                     dir, "ab"[unfused], k, unfused ? " --unfuse weight-copy" : "");
            run(r, env, opts);
            cr_assert_eq(r->status, 0, "%s: %s", opts, r->err);
            bytes[unfused] = final_value(r->out, "\"comm_bytes_per_worker_step\":");
        }
        snprintf(a, sizeof a, "%s/a%zu/final.safetensors", dir, k);
        snprintf(b, sizeof b, "%s/b%zu/final.safetensors", dir, k);
        cr_assert(same_file(a, b), "%s%s: the all-gather's packing trains otherwise than the "
                  "layers' own", env, runs[k].opts);
        cr_assert_gt(bytes[0], bytes[1], "%s%s: the all-gather moves %.0f bytes a worker and "
                     "step, as many as without its packing (%.0f)", env, runs[k].opts, bytes[0],
                     bytes[1]);
    }
    free(r);
    st_test_rmdir(dir);
}

/*
 * tests/test_resume.c — --resume continues only the run that wrote the
 * checkpoint (doc/checkpoints.md): another option's value, another data
 * set of the same size or an earlier version's file is refused in one
 * line naming it as the user types it; what may change on a resume
 * changes nothing; a run resumed inside sdp's mask round is bitwise the
 * run never stopped.
 */
#include "cli_run.h"

#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <subtrain/subtrain.h>

/* The environment of the runs train() starts (NULL: none). */
static const char *g_env = NULL;

/* `opts` with --checkpoint dir/name and what follows, quiet, its exit
 * status; stderr into dir/name.err. */
static int train(const char *dir, const char *name, const char *opts, const char *extra)
{
    char cmd[8 * ST_TEST_PATH_MAX];
    snprintf(cmd, sizeof cmd, "%s '%s' %s --quiet --progress none --checkpoint '%s/%s' %s "
             ">/dev/null 2>'%s/%s.err' </dev/null", g_env ? g_env : "", getenv("SUBTRAIN_BIN"),
             opts, dir, name, extra, dir, name);
    int w = system(cmd);
    return WIFEXITED(w) ? WEXITSTATUS(w) : -1;
}

static void expect_trains(const char *dir, const char *name, const char *opts, const char *extra)
{
    const int status = train(dir, name, opts, extra);
    char path[2 * ST_TEST_PATH_MAX], err[4096];
    snprintf(path, sizeof path, "%s/%s.err", dir, name);
    read_into(path, err, sizeof err);
    cr_assert_eq(status, 0, "%s %s exited %d: %s", opts, extra, status, err);
}

/* The data of a safetensors file (after its length and JSON header): the
 * tensors alone, whatever the metadata says (it names --data). */
static int same_tensors(const char *a, const char *b)
{
    size_t na = 0, nb = 0;
    unsigned char *x = st_test_read_file(a, &na), *y = st_test_read_file(b, &nb);
    int same = 0;
    if (x && y && na >= 8 && nb >= 8) {
        uint64_t ha = 0, hb = 0;
        for (int i = 7; i >= 0; i--) {
            ha = ha << 8 | x[i];
            hb = hb << 8 | y[i];
        }
        same = ha + 8 <= na && hb + 8 <= nb && na - ha == nb - hb &&
               memcmp(x + 8 + ha, y + 8 + hb, na - 8 - ha) == 0;
    }
    free(x);
    free(y);
    return same;
}

/* The first `what` (len bytes) in b[0..n), or NULL. */
static unsigned char *find(unsigned char *b, size_t n, const char *what, size_t len)
{
    for (size_t i = 0; i + len <= n; i++)
        if (memcmp(b + i, what, len) == 0)
            return b + i;
    return NULL;
}

/* The first `from` in file `path` replaced by `to`, of the same length. */
static void replace_in(const char *path, const char *from, const char *to)
{
    size_t n = 0;
    unsigned char *b = st_test_read_file(path, &n);
    cr_assert_not_null(b);
    unsigned char *at = find(b, n, from, strlen(from));
    cr_assert_not_null(at, "%s: no %s", path, from);
    cr_assert_eq(strlen(to), strlen(from));
    memcpy(at, to, strlen(to));
    cr_assert_eq(st_test_write_file(path, b, n), 0);
    free(b);
}

/* A copy of dir/ck/step-00000010.safetensors as dir/name with the
 * metadata key `from` renamed `to` (as long): the file another subtrain
 * would have written. */
static void rename_key(const char *dir, const char *name, const char *from, const char *to)
{
    char path[2 * ST_TEST_PATH_MAX];
    snprintf(path, sizeof path, "%s/ck/step-00000010.safetensors", dir);
    size_t n = 0;
    unsigned char *b = st_test_read_file(path, &n);
    cr_assert_not_null(b);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cr_assert_eq(st_test_write_file(path, b, n), 0);
    free(b);
    replace_in(path, from, to);
}

/* 260 training and 52 test images of 8 x 8 under Fashion-MNIST's names,
 * their pixels i * mul + i / 64, labels 0..9. */
static void write_images(const char *dir, int mul)
{
    static unsigned char px[260 * 64], lab[260];
    for (size_t i = 0; i < sizeof px; i++)
        px[i] = (unsigned char)(i * (size_t)mul + i / 64);
    for (int i = 0; i < 260; i++)
        lab[i] = (unsigned char)(i % 10);
    uint32_t di[3] = { 260, 8, 8 }, dl[1] = { 260 }, ti[3] = { 52, 8, 8 }, tl[1] = { 52 };
    cr_assert_eq(mkdir(dir, 0755), 0);
    write_idx_file(dir, "train-images-idx3-ubyte", 3, di, px, sizeof px);
    write_idx_file(dir, "train-labels-idx1-ubyte", 1, dl, lab, 260);
    write_idx_file(dir, "t10k-images-idx3-ubyte", 3, ti, px, 52 * 64);
    write_idx_file(dir, "t10k-labels-idx1-ubyte", 1, tl, lab, 52);
}

/* A scratch directory with an image set in dir/data, and the options of a
 * small run on it, opts then `more`. */
static void setup_run(char *dir, char *opts, size_t n, const char *more)
{
    char data[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    snprintf(data, sizeof data, "%s/data", dir);
    write_images(data, 7);
    snprintf(opts, n, "--data 'idx:%s' --batch 26 --steps 20 %s", data, more);
}

Test(resume, another_precision_is_refused_naming_both_values, .timeout = 60)
{
    char dir[ST_TEST_PATH_MAX], base[4 * ST_TEST_PATH_MAX], args[8 * ST_TEST_PATH_MAX];
    setup_run(dir, base, sizeof base, "--model mlp --depth 2 --width 32");
    expect_trains(dir, "ck", base, "--checkpoint-every 10");
    const st_bf16_support bf16 = st_bf16_probe(NULL);
    if (bf16 != ST_BF16_UNAVAILABLE) {   /* else --precision bf16 is a usage error first */
        snprintf(args, sizeof args, "%s --precision bf16%s --resume '%s/ck'", base,
                 bf16 == ST_BF16_EMULATED ? " --bf16-emulated" : "", dir);
        expect_runtime_error(NULL, args, "/ck/step-00000010.safetensors: its run had "
                             "--precision fp32, this one has --precision bf16: resume with the "
                             "options of the run that wrote it");
    }
    snprintf(args, sizeof args, "%s --comm-precision bf16 --resume '%s/ck'", base, dir);
    expect_runtime_error(NULL, args, "its run had --comm-precision fp32, this one has "
                         "--comm-precision bf16");
    st_test_rmdir(dir);
}

/* --activation-precision changes the numbers (each product's output is
 * rounded once): a resume with another value is refused, in both
 * directions, naming both values. */
Test(resume, another_activation_precision_is_refused, .timeout = 60)
{
    const st_bf16_support bf16 = st_bf16_probe(NULL);
    if (bf16 == ST_BF16_UNAVAILABLE)
        cr_skip_test("no bf16 matrix product here");
    char dir[ST_TEST_PATH_MAX], base[4 * ST_TEST_PATH_MAX], args[8 * ST_TEST_PATH_MAX];
    setup_run(dir, base, sizeof base, "--model mlp --depth 2 --width 32 --precision bf16 "
              "--bf16-emulated");
    expect_trains(dir, "ck", base, "--checkpoint-every 10");
    expect_trains(dir, "ckb", base, "--activation-precision bf16 --checkpoint-every 10");
    snprintf(args, sizeof args, "%s --activation-precision bf16 --resume '%s/ck'", base, dir);
    expect_runtime_error(NULL, args, "/ck/step-00000010.safetensors: its run had "
                         "--activation-precision fp32, this one has --activation-precision "
                         "bf16: resume with the options of the run that wrote it");
    snprintf(args, sizeof args, "%s --resume '%s/ckb'", base, dir);
    expect_runtime_error(NULL, args, "/ckb/step-00000010.safetensors: its run had "
                         "--activation-precision bf16, this one has --activation-precision "
                         "fp32");
    st_test_rmdir(dir);
}

/* Refusals name the option as typed, a default as "default", a key on
 * one side only as "no --KEY", and the workers of every rank. */
Test(resume, refusals_say_the_options_as_the_user_types_them, .timeout = 60)
{
    char dir[ST_TEST_PATH_MAX], sdp[4 * ST_TEST_PATH_MAX], args[8 * ST_TEST_PATH_MAX];
    setup_run(dir, sdp, sizeof sdp, "--depth 2 --width 32 --strategy sdp --workers 2");
    expect_trains(dir, "ck", sdp, "--checkpoint-every 10");
    static const struct { const char *change, *needle; } other[] = {
        { "--lr 0.01", "its run had --lr 0.001, this one has --lr 0.01:" },
        { "--subnet neuron", "its run had --subnet block, this one has --subnet neuron:" },
        { "--branch-scale none", "its run had --branch-scale default, this one has "
                                 "--branch-scale none:" },
        { "--hidden 64", "its run had --hidden default, this one has --hidden 64:" },
        { "--warmup 3", "its run had --warmup default, this one has --warmup 3:" },
        { "--coverage 1", "its run had --coverage 0.5, this one has --coverage 1:" },
        { "--workers 1", "its run had 2 workers, this one has 1 (--workers 1):" },
    };
    for (size_t i = 0; i < sizeof other / sizeof *other; i++) {
        snprintf(args, sizeof args, "%s %s --resume '%s/ck'", sdp, other[i].change, dir);
        expect_runtime_error(NULL, args, other[i].needle);
    }
    /* --steps 20 resumed as --epochs 1 differs in both: the file's value is said */
    snprintf(args, sizeof args, "--data 'idx:%s/data' --depth 2 --width 32 --batch 26 "
             "--epochs 1 --strategy sdp --workers 2 --resume '%s/ck'", dir, dir);
    expect_runtime_error(NULL, args, "its run had --steps 20, this one has --steps default:");
    /* an option only the file has (as a later subtrain's would be), and one
     * only this run has: both are differences */
    rename_key(dir, "other.safetensors", "\"subtrain.option.lr\"", "\"subtrain.option.xy\"");
    snprintf(args, sizeof args, "%s --resume '%s/other.safetensors'", sdp, dir);
    expect_runtime_error(NULL, args, "its run had --xy 0.001, this one has no --xy:");
    /* a file of an earlier subtrain, which recorded no data fingerprint */
    rename_key(dir, "old.safetensors", "\"subtrain.run.train-data\"",
               "\"subtrain.run.xxxxx-data\"");
    snprintf(args, sizeof args, "%s --resume '%s/old.safetensors'", sdp, dir);
    expect_runtime_error(NULL, args, "old.safetensors: written by an earlier subtrain");
    st_test_rmdir(dir);
}

/* A checkpoint of an earlier subtrain lacks the options added since: at
 * their defaults they are what its run had, and the resume goes on; set
 * to anything else, they are a difference. */
Test(resume, an_option_added_since_the_checkpoint_resumes_at_its_default, .timeout = 60)
{
    char dir[ST_TEST_PATH_MAX], base[4 * ST_TEST_PATH_MAX], args[8 * ST_TEST_PATH_MAX];
    setup_run(dir, base, sizeof base, "--model mlp --depth 2 --width 32");
    expect_trains(dir, "ck", base, "--checkpoint-every 10");
    rename_key(dir, "earlier.safetensors", "\"subtrain.option.split\"",
               "\"subtrain.xption.split\"");
    snprintf(args, sizeof args, "--resume '%s/earlier.safetensors'", dir);
    expect_trains(dir, "resumed", base, args);
    snprintf(args, sizeof args, "%s --split classes:10 --resume '%s/earlier.safetensors'", base,
             dir);
    expect_runtime_error(NULL, args, "its run had no --split, this one has --split classes:10:");
    st_test_rmdir(dir);
}

/* An fp32 checkpoint of a subtrain that recorded --activation-precision
 * and --weight-layout as "" (the default, unspelled) in fp32 runs resumes
 * where they are at their defaults, bitwise, and not where they are not. */
Test(resume, an_option_recorded_empty_resumes_at_its_default, .timeout = 60)
{
    char dir[ST_TEST_PATH_MAX], base[4 * ST_TEST_PATH_MAX], args[8 * ST_TEST_PATH_MAX];
    setup_run(dir, base, sizeof base, "--model mlp --depth 2 --width 32");
    expect_trains(dir, "ck", base, "--checkpoint-every 10");
    rename_key(dir, "earlier.safetensors", "\"subtrain.option.activation-precision\":\"fp32\"",
               "\"subtrain.option.activation-precision\":\"\"    ");
    char from[2 * ST_TEST_PATH_MAX];
    snprintf(from, sizeof from, "%s/earlier.safetensors", dir);
    replace_in(from, "\"subtrain.option.weight-layout\":\"plain\"",
               "\"subtrain.option.weight-layout\":\"\"     ");
    snprintf(args, sizeof args, "--resume '%s'", from);
    expect_trains(dir, "resumed", base, args);
    char a[2 * ST_TEST_PATH_MAX], b[2 * ST_TEST_PATH_MAX];
    snprintf(a, sizeof a, "%s/ck/final.safetensors", dir);
    snprintf(b, sizeof b, "%s/resumed/final.safetensors", dir);
    cr_assert(same_tensors(a, b), "the resume differs from the run never stopped");
    if (st_bf16_probe(NULL) == ST_BF16_NATIVE) {   /* "" is the default, nothing else */
        snprintf(args, sizeof args, "%s --precision bf16 --activation-precision bf16 "
                 "--resume '%s'", base, from);
        expect_runtime_error(NULL, args,
                             "its run had --precision fp32, this one has --precision bf16:");
    }
    st_test_rmdir(dir);
}

/* The same for a bf16 run's options that only bf16 uses: a bf16
 * checkpoint of a subtrain without --weight-layout (or without
 * --activation-precision) resumes at their defaults. */
Test(resume, a_bf16_option_added_since_resumes_at_its_default, .timeout = 60)
{
    const st_bf16_support bf16 = st_bf16_probe(NULL);
    if (bf16 == ST_BF16_UNAVAILABLE)
        cr_skip_test("oneDNN has no bf16 matmul on this CPU");
    char dir[ST_TEST_PATH_MAX], base[4 * ST_TEST_PATH_MAX], args[8 * ST_TEST_PATH_MAX];
    setup_run(dir, base, sizeof base, bf16 == ST_BF16_EMULATED
                                          ? "--model mlp --depth 2 --width 32 --precision bf16 "
                                            "--bf16-emulated"
                                          : "--model mlp --depth 2 --width 32 --precision bf16");
    expect_trains(dir, "ck", base, "--checkpoint-every 10");
    rename_key(dir, "earlier.safetensors", "\"subtrain.option.weight-layout\"",
               "\"subtrain.xption.weight-layout\"");
    snprintf(args, sizeof args, "--resume '%s/earlier.safetensors'", dir);
    expect_trains(dir, "resumed", base, args);
    rename_key(dir, "earlier2.safetensors", "\"subtrain.option.activation-precision\"",
               "\"subtrain.xption.activation-precision\"");
    snprintf(args, sizeof args, "--resume '%s/earlier2.safetensors'", dir);
    expect_trains(dir, "resumed2", base, args);
    st_test_rmdir(dir);
}

/* Other pixels in the same counts are another run; the same content
 * elsewhere, gzipped, is the same run and resumes bitwise. */
Test(resume, other_data_of_the_same_size_is_refused_moved_data_is_not, .timeout = 60)
{
    char dir[ST_TEST_PATH_MAX], sub[3][2 * ST_TEST_PATH_MAX], opts[3][4 * ST_TEST_PATH_MAX],
        args[8 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    static const char *const name[3] = { "a", "b", "moved" };
    for (int k = 0; k < 3; k++) {
        snprintf(sub[k], sizeof sub[k], "%s/%s", dir, name[k]);
        write_images(sub[k], k == 1 ? 11 : 7);
        snprintf(opts[k], sizeof opts[k], "--data 'idx:%s' --model mlp --depth 1 --width 16 "
                 "--batch 26 --steps 30", sub[k]);
    }
    snprintf(args, sizeof args, "gzip '%s/train-images-idx3-ubyte'", sub[2]);
    cr_assert_eq(system(args), 0);
    expect_trains(dir, "ck", opts[0], "--checkpoint-every 10");
    snprintf(args, sizeof args, "%s --resume '%s/ck/step-00000010.safetensors'", opts[1], dir);
    expect_runtime_error(NULL, args, "step-00000010.safetensors: its run's training set had "
                         "other content (its fingerprint ");
    snprintf(args, sizeof args, "--resume '%s/ck/step-00000010.safetensors'", dir);
    expect_trains(dir, "resumed", opts[2], args);
    char a[2 * ST_TEST_PATH_MAX], b[2 * ST_TEST_PATH_MAX];
    snprintf(a, sizeof a, "%s/ck/final.safetensors", dir);
    snprintf(b, sizeof b, "%s/resumed/final.safetensors", dir);
    cr_assert(same_tensors(a, b), "the moved data's resume differs from the run never stopped");
    /* the test set alone differs: said as the test set */
    snprintf(args, sizeof args, "cp '%s'/t10k-* '%s'", sub[1], sub[2]);
    cr_assert_eq(system(args), 0);
    snprintf(args, sizeof args, "%s --resume '%s/ck/step-00000010.safetensors'", opts[2], dir);
    expect_runtime_error(NULL, args, "its run's test set had other content");
    st_test_rmdir(dir);
}

/* What may change on a resume (doc/checkpoints.md) changes nothing: the
 * display, the metrics file, where and how often checkpoints go, what
 * SIGUSR1 does, the workers' cores. */
Test(resume, options_that_may_change_leave_the_run_bitwise, .timeout = 60)
{
    char dir[ST_TEST_PATH_MAX], opts[4 * ST_TEST_PATH_MAX], extra[4 * ST_TEST_PATH_MAX],
        a[2 * ST_TEST_PATH_MAX], b[2 * ST_TEST_PATH_MAX];
    setup_run(dir, opts, sizeof opts, "--model mlp --depth 2 --width 32 --workers 2");
    expect_trains(dir, "ck", opts, "--checkpoint-every 7");
    snprintf(extra, sizeof extra, "--resume '%s/ck/step-00000007.safetensors' --progress plain "
             "--metrics '%s/m.jsonl' --checkpoint-every 5 --keep 1 --usr1 checkpoint "
             "--oversubscribe", dir, dir);
    /* expect_trains's --quiet and --progress none come first: these win */
    expect_trains(dir, "resumed", opts, extra);
    snprintf(a, sizeof a, "%s/ck/final.safetensors", dir);
    snprintf(b, sizeof b, "%s/resumed/final.safetensors", dir);
    cr_assert(same_file(a, b), "a resume with other display and checkpoint options differs");
    snprintf(a, sizeof a, "%s/m.jsonl", dir);
    cr_assert_eq(access(a, R_OK), 0, "the resumed run wrote its metrics");
    st_test_rmdir(dir);
}

/* A resume on another oneDNN ISA than the checkpoint's (ONEDNN_MAX_CPU_ISA,
 * or another machine) is warned of: its kernels sum in another order.  On
 * the same ISA, no warning. */
Test(resume, another_isa_is_warned_of, .timeout = 60)
{
    char dir[ST_TEST_PATH_MAX], opts[4 * ST_TEST_PATH_MAX], cmd[10 * ST_TEST_PATH_MAX],
        path[2 * ST_TEST_PATH_MAX], err[4096];
    setup_run(dir, opts, sizeof opts, "--model mlp --depth 1 --width 32");
    expect_trains(dir, "ck", opts, "--checkpoint-every 7");
    static const char *const env[2] = { "", "ONEDNN_MAX_CPU_ISA=SSE41" };
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd, "%s '%s' %s --progress none --resume "
                 "'%s/ck/step-00000007.safetensors' --checkpoint '%s/r%d' >/dev/null "
                 "2>'%s/r.err' </dev/null", env[k], getenv("SUBTRAIN_BIN"), opts, dir, dir, k,
                 dir);
        const int w = system(cmd);
        snprintf(path, sizeof path, "%s/r.err", dir);
        read_into(path, err, sizeof err);
        cr_assert(WIFEXITED(w) && WEXITSTATUS(w) == 0, "%s: %s", env[k], err);
        const char *warned = strstr(err, "subtrain: warning: the checkpoint resumed was written "
                                         "on oneDNN ISA ");
        cr_assert(k ? warned && strstr(err, "this run has sse41") : !warned, "%s: %s", env[k],
                  err);
    }
    st_test_rmdir(dir);
}

/* A split run resumed mid-epoch deals and orders its samples again from
 * the seed: bitwise the run never stopped.  Another split is another run. */
Test(resume, a_split_run_resumes_bitwise_and_refuses_another_split, .timeout = 60)
{
    char dir[ST_TEST_PATH_MAX], opts[4 * ST_TEST_PATH_MAX], args[8 * ST_TEST_PATH_MAX],
        a[2 * ST_TEST_PATH_MAX], b[2 * ST_TEST_PATH_MAX];
    setup_run(dir, opts, sizeof opts, "--model mlp --depth 2 --width 32 --workers 2 "
              "--oversubscribe --split dirichlet:0.5");
    expect_trains(dir, "ck", opts, "--checkpoint-every 7");
    snprintf(args, sizeof args, "--resume '%s/ck/step-00000007.safetensors'", dir);
    expect_trains(dir, "resumed", opts, args);
    snprintf(a, sizeof a, "%s/ck/final.safetensors", dir);
    snprintf(b, sizeof b, "%s/resumed/final.safetensors", dir);
    cr_assert(same_file(a, b), "resumed after step 7, the weights differ");
    static const struct { const char *change, *needle; } other[] = {
        { "--split classes:5", "its run had --split dirichlet:0.5, this one has --split "
                               "classes:5: resume with the options of the run that wrote it" },
        { "--split iid", "its run had --split dirichlet:0.5, this one has --split iid:" },
        { "--split dirichlet:0.50001", "this one has --split dirichlet:0.50001:" },
    };
    for (size_t i = 0; i < sizeof other / sizeof *other; i++) {
        snprintf(args, sizeof args, "%s %s --resume '%s/ck'", opts, other[i].change, dir);
        expect_runtime_error(NULL, args, other[i].needle);
    }
    st_test_rmdir(dir);
}

/* `run` with a checkpoint at step 7 (as ck<i> under dir), resumed from it
 * (as resumed<i>): the final weights must be bitwise those of the run
 * that never stopped. */
static void expect_resumes_at_step_7(const char *dir, size_t i, const char *run)
{
    char ck[16], resumed[16], extra[3 * ST_TEST_PATH_MAX], a[2 * ST_TEST_PATH_MAX],
        b[2 * ST_TEST_PATH_MAX];
    snprintf(ck, sizeof ck, "ck%zu", i);
    snprintf(resumed, sizeof resumed, "resumed%zu", i);
    expect_trains(dir, ck, run, "--checkpoint-every 7");
    snprintf(extra, sizeof extra, "--resume '%s/%s/step-00000007.safetensors'", dir, ck);
    expect_trains(dir, resumed, run, extra);
    snprintf(a, sizeof a, "%s/%s/final.safetensors", dir, ck);
    snprintf(b, sizeof b, "%s/%s/final.safetensors", dir, resumed);
    cr_assert(same_file(a, b), "%s: resumed after step 7, the weights differ", run);
}

/* sdp redraws its masks every --resample R steps.  A run resumed after a
 * step S inside a round (S not a multiple of R) must draw that round's
 * masks again, or its next steps train other subnetworks: from step 7 of
 * --resample 5, bitwise the run never stopped (a stop at a step that is a
 * multiple of R would hide it). */
Test(resume, sdp_resumed_inside_a_mask_round_is_bitwise, .timeout = 60)
{
    char dir[ST_TEST_PATH_MAX], runs[3][4 * ST_TEST_PATH_MAX];
    setup_run(dir, runs[0], sizeof runs[0], "--model mlp --depth 2 --width 32 --workers 2 "
              "--strategy sdp --subnet neuron --resample 5");
    snprintf(runs[1], sizeof runs[1], "--data 'idx:%s/data' --batch 26 --steps 20 --model resmlp "
             "--depth 4 --width 32 --workers 2 --strategy sdp --masking backward --resample 5",
             dir);
    /* a ViT's heads as the units, a class token */
    snprintf(runs[2], sizeof runs[2], "--data 'idx:%s/data' --batch 26 --steps 20 --model vit "
             "--depth 2 --width 16 --heads 2 --patch 4 --pool cls --workers 2 --strategy sdp "
             "--subnet neuron --resample 5", dir);
    for (size_t i = 0; i < 3; i++)
        expect_resumes_at_step_7(dir, i, runs[i]);
    st_test_rmdir(dir);
}

/* The optimizer's bf16 state (--optimizer-moments) in a step checkpoint:
 * BF16 tensors holding the state's own bits, from which a resume
 * continues bitwise: rne and stochastic rounding, AdamW and SGD's
 * momentum, one worker and two (each its shard), micro-batches too. */
Test(resume, a_bf16_optimizer_state_resumes_bitwise, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], base[4 * ST_TEST_PATH_MAX], runs[3][5 * ST_TEST_PATH_MAX],
        extra[8 * ST_TEST_PATH_MAX], a[2 * ST_TEST_PATH_MAX], b[2 * ST_TEST_PATH_MAX];
    setup_run(dir, base, sizeof base, "--model mlp --depth 2 --width 32");
    snprintf(runs[0], sizeof runs[0], "%s --optimizer-moments bf16", base);
    snprintf(runs[1], sizeof runs[1], "--data 'idx:%s/data' --batch 13 --steps 20 --model mlp "
             "--depth 2 --width 32 --workers 2 --accumulate 2 --optimizer-moments bf16-sr", dir);
    snprintf(runs[2], sizeof runs[2], "--data 'idx:%s/data' --batch 26 --steps 20 --model mlp "
             "--depth 2 --width 32 --optimizer sgd --lr 0.05 --optimizer-moments bf16-sr", dir);
    for (size_t i = 0; i < 3; i++) {
        char ck[16], resumed[16];
        snprintf(ck, sizeof ck, "ck%zu", i);
        snprintf(resumed, sizeof resumed, "resumed%zu", i);
        expect_trains(dir, ck, runs[i], "--checkpoint-every 7");
        snprintf(a, sizeof a, "%s/%s/step-00000007.safetensors", dir, ck);
        st_safetensors f;
        cr_assert_eq(st_safetensors_read(a, &f), ST_OK, "%s", st_last_error());
        const st_safetensors_tensor *m = st_safetensors_find(&f, "train.optimizer.m.worker0");
        cr_assert(m && m->dtype == ST_DTYPE_BF16 && m->bytes == 2 * (size_t)m->shape[0],
                  "%s: the first moment is stored as BF16", runs[i]);
        cr_assert_str_eq(st_safetensors_meta(&f, "subtrain.run.optimizer-moments"),
                         i == 0 ? "bf16" : "bf16-sr");
        st_safetensors_free(&f);
        snprintf(extra, sizeof extra, "--resume '%s'", a);
        expect_trains(dir, resumed, runs[i], extra);
        snprintf(a, sizeof a, "%s/%s/final.safetensors", dir, ck);
        snprintf(b, sizeof b, "%s/%s/final.safetensors", dir, resumed);
        cr_assert(same_file(a, b), "%s: resumed after step 7, the weights differ", runs[i]);
    }
    /* the state's layout is compared as an option: refused, not converted */
    snprintf(extra, sizeof extra, "%s --optimizer-moments fp32 --resume '%s/ck0'", base, dir);
    expect_runtime_error(NULL, extra, "its run had --optimizer-moments bf16, this one has "
                         "--optimizer-moments fp32: resume with the options of the run that "
                         "wrote it");
    snprintf(extra, sizeof extra, "%s --accumulate 2 --resume '%s/ck0'", runs[0], dir);
    expect_runtime_error(NULL, extra, "its run had --accumulate 1, this one has --accumulate 2");
    st_test_rmdir(dir);
}

/* A bf16 master (--master-weights bf16-sr) in a step checkpoint: the
 * weights saved are the master's values, from which a resume continues
 * bitwise: one worker and two (the copies the master), private weights
 * (the copies gathered as bf16), bf16 and fp32 moments; sdp with backward
 * masking, shared and private weights with masks redrawn across the
 * checkpoint; localsgd at a round's end (the averages rounded); another
 * layout is refused. */
Test(resume, a_bf16_master_resumes_bitwise, .timeout = 180)
{
    char dir[ST_TEST_PATH_MAX], base[4 * ST_TEST_PATH_MAX], runs[6][5 * ST_TEST_PATH_MAX],
        extra[8 * ST_TEST_PATH_MAX], a[2 * ST_TEST_PATH_MAX], b[2 * ST_TEST_PATH_MAX];
    const st_bf16_support bf16 = st_bf16_probe(NULL);
    if (bf16 == ST_BF16_UNAVAILABLE)
        cr_skip_test("no bf16 matrix product here");
    setup_run(dir, base, sizeof base, "--model mlp --depth 2 --width 32 --precision bf16 "
              "--bf16-emulated --master-weights bf16-sr");
    snprintf(runs[0], sizeof runs[0], "%s --optimizer-moments bf16-sr", base);
    snprintf(runs[1], sizeof runs[1], "%s --workers 2 --optimizer-moments bf16", base);
    snprintf(runs[2], sizeof runs[2], "%s --workers 2 --weights private", base);
    snprintf(runs[3], sizeof runs[3], "%s --workers 2 --strategy sdp --masking backward "
             "--subnet neuron --resample 5 --optimizer-moments bf16-sr", base);
    snprintf(runs[4], sizeof runs[4], "%s --workers 2 --strategy sdp --masking backward "
             "--subnet neuron --weights private --resample 5", base);
    snprintf(runs[5], sizeof runs[5], "%s --workers 2 --strategy localsgd --local-steps 7 "
             "--optimizer-moments bf16-sr", base);
    for (size_t i = 0; i < 6; i++) {
        char ck[16], resumed[16];
        snprintf(ck, sizeof ck, "ck%zu", i);
        snprintf(resumed, sizeof resumed, "resumed%zu", i);
        expect_trains(dir, ck, runs[i], "--checkpoint-every 7");
        snprintf(a, sizeof a, "%s/%s/step-00000007.safetensors", dir, ck);
        st_safetensors f;
        cr_assert_eq(st_safetensors_read(a, &f), ST_OK, "%s", st_last_error());
        cr_assert_str_eq(st_safetensors_meta(&f, "subtrain.run.master-weights"), "bf16-sr");
        st_safetensors_free(&f);
        snprintf(extra, sizeof extra, "--resume '%s'", a);
        expect_trains(dir, resumed, runs[i], extra);
        snprintf(a, sizeof a, "%s/%s/final.safetensors", dir, ck);
        snprintf(b, sizeof b, "%s/%s/final.safetensors", dir, resumed);
        cr_assert(same_file(a, b), "%s: resumed after step 7, the weights differ", runs[i]);
    }
    snprintf(extra, sizeof extra, "%s --master-weights fp32 --resume '%s/ck0'", runs[0], dir);
    expect_runtime_error(NULL, extra, "its run had --master-weights bf16-sr, this one has "
                         "--master-weights fp32: resume with the options of the run that "
                         "wrote it");
    st_test_rmdir(dir);
}

/* Forward-masked subnetworks with a bf16 master (sdp's default masking:
 * the engine's bf16 master shards): a resume from a step checkpoint
 * continues bitwise, masks redrawn across it (neuron units, elements
 * nobody holds in some rounds) and fixed. */
Test(resume, a_bf16_master_of_forward_masked_subnetworks_resumes_bitwise, .timeout = 180)
{
    char dir[ST_TEST_PATH_MAX], base[4 * ST_TEST_PATH_MAX], runs[2][5 * ST_TEST_PATH_MAX];
    const st_bf16_support bf16 = st_bf16_probe(NULL);
    if (bf16 == ST_BF16_UNAVAILABLE)
        cr_skip_test("no bf16 matrix product here");
    setup_run(dir, base, sizeof base, "--model mlp --depth 2 --width 32 --precision bf16 "
              "--bf16-emulated --master-weights bf16-sr --strategy sdp --subnet neuron");
    snprintf(runs[0], sizeof runs[0], "%s --workers 2 --resample 5 --optimizer-moments "
             "bf16-sr", base);
    snprintf(runs[1], sizeof runs[1], "%s --workers 3 --oversubscribe --coverage 0.67", base);
    for (size_t i = 0; i < 2; i++)
        expect_resumes_at_step_7(dir, i, runs[i]);
    st_test_rmdir(dir);
}

/* A bf16 master with shared weights over two NUMA domains (a worker
 * each, each domain's copies holding the master): a resume from a step
 * checkpoint continues bitwise, dp and sdp with backward masking (masks
 * redrawn across the checkpoint); and the weights are those of the same
 * run on one domain, bit for bit: one worker a domain sums the gradients
 * in the same order, the updates draw by seed, step and element, and the
 * all-gather copies the owners' copies as they are. */
Test(resume, a_bf16_master_over_two_domains_resumes_bitwise, .timeout = 180)
{
    char dir[ST_TEST_PATH_MAX], base[4 * ST_TEST_PATH_MAX], runs[2][5 * ST_TEST_PATH_MAX],
        extra[8 * ST_TEST_PATH_MAX], a[2 * ST_TEST_PATH_MAX], b[2 * ST_TEST_PATH_MAX];
    const st_bf16_support bf16 = st_bf16_probe(NULL);
    if (bf16 == ST_BF16_UNAVAILABLE)
        cr_skip_test("no bf16 matrix product here");
    setup_run(dir, base, sizeof base, "--model mlp --depth 2 --width 32 --precision bf16 "
              "--bf16-emulated --master-weights bf16-sr --workers 2 --optimizer-moments "
              "bf16-sr");
    snprintf(runs[0], sizeof runs[0], "%s", base);
    snprintf(runs[1], sizeof runs[1], "%s --strategy sdp --masking backward --subnet neuron "
             "--resample 5", base);
    for (size_t i = 0; i < 2; i++) {
        char ck[16], resumed[16], one[16];
        snprintf(ck, sizeof ck, "ck%zu", i);
        snprintf(resumed, sizeof resumed, "resumed%zu", i);
        snprintf(one, sizeof one, "one%zu", i);
        g_env = two_domains_env();
        expect_trains(dir, ck, runs[i], "--checkpoint-every 7 --metrics /dev/stderr");
        snprintf(a, sizeof a, "%s/%s.err", dir, ck);
        char err[16384];
        read_into(a, err, sizeof err);
        cr_assert(strstr(err, "\"numa\":2},\"placement\""), "%s: not over two domains: %s",
                  runs[i], err);
        snprintf(a, sizeof a, "%s/%s/step-00000007.safetensors", dir, ck);
        snprintf(extra, sizeof extra, "--resume '%s'", a);
        expect_trains(dir, resumed, runs[i], extra);
        g_env = NULL;
        expect_trains(dir, one, runs[i], "");
        snprintf(a, sizeof a, "%s/%s/final.safetensors", dir, ck);
        snprintf(b, sizeof b, "%s/%s/final.safetensors", dir, resumed);
        cr_assert(same_file(a, b), "%s: resumed after step 7 over two domains, the weights "
                  "differ", runs[i]);
        snprintf(b, sizeof b, "%s/%s/final.safetensors", dir, one);
        cr_assert(same_tensors(a, b), "%s: over two domains and on one, the weights differ",
                  runs[i]);
    }
    st_test_rmdir(dir);
}

/* The library compares the state's layout itself (a program that gives
 * no options, st_train_config.options): another layout is refused in one
 * line, the same one resumes. */
Test(resume, the_library_refuses_another_state_layout, .timeout = 60)
{
    char dir[ST_TEST_PATH_MAX], path[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_synthetic_config sc = st_synthetic_defaults(3);
    sc.train_count = 320;
    sc.test_count = 64;
    sc.dim = 16;
    sc.n_classes = 4;
    st_dataset train, test;
    cr_assert_eq(st_synthetic_make(&sc, &train, &test), ST_OK);
    st_train_config c = st_train_config_default();
    c.model.kind = st_model_kind_named("mlp");
    c.model.depth = 1;
    c.model.width = 16;
    c.model.in_dim = 16;
    c.model.n_classes = 4;
    c.batch = 32;
    c.steps = 10;
    c.epochs = 0;
    c.optim.moments = ST_MOMENTS_BF16;
    c.checkpoint.dir = dir;
    c.checkpoint.every = 5;
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, NULL), ST_OK, "%s", st_last_error());
    snprintf(path, sizeof path, "%s/step-00000005.safetensors", dir);
    st_safetensors f;
    cr_assert_eq(st_safetensors_read(path, &f), ST_OK, "%s", st_last_error());
    c.checkpoint.dir = NULL;
    c.resume = &f;
    c.resume_name = "step-5";
    static const struct { st_moments m; const char *needle; } other[] = {
        { ST_MOMENTS_FP32, "step-5: its run kept the optimizer moments in bf16, this one in fp32" },
        { ST_MOMENTS_BF16_SR, "its run kept the optimizer moments in bf16, this one in bf16-sr" },
    };
    for (size_t i = 0; i < 2; i++) {
        c.optim.moments = other[i].m;
        cr_assert_eq(st_train_run(&c, &train, &test, NULL, NULL), ST_ERR_INVALID);
        cr_assert(strstr(st_last_error(), other[i].needle), "%s", st_last_error());
    }
    c.optim.moments = ST_MOMENTS_BF16;
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, NULL), ST_OK, "%s", st_last_error());
    st_safetensors_free(&f);
    st_dataset_free(&train);
    st_dataset_free(&test);
    st_test_rmdir(dir);
}

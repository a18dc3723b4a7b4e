/*
 * tests/test_cli_recompute.c — `--recompute none|blocks|all` as a user
 * runs it: every strategy, in fp32 and bf16, on resmlp, mlp, resnet and
 * gpt, gives the records and final weights of --recompute none byte for
 * byte; a resume may change the mode; the option's errors.
 *
 * The models themselves (every subnetwork, the bytes): test_model_recompute.c.
 */
#include "cli_run.h"

#include <subtrain/model.h>

/* Runs `opts` with none and `mode` into dir/MODE.jsonl and dir/MODE/,
 * and expects the mode's records and final weights to be none's. */
static void expect_modes_agree(const char *dir, const char *opts, const char *mode)
{
    const char *const modes[] = { "none", mode };
    char cmd[8 * ST_TEST_PATH_MAX], path[2 * ST_TEST_PATH_MAX];
    char *rec[2];
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd, "'%s' %s --recompute %s --seed 3 --oversubscribe --progress "
                 "none --checkpoint '%s/%s' --metrics '%s/%s.jsonl' >'%s/out' 2>'%s/err' "
                 "</dev/null", getenv("SUBTRAIN_BIN"), opts, modes[k], dir, modes[k], dir,
                 modes[k], dir, dir);
        const int w = system(cmd);
        snprintf(path, sizeof path, "%s/err", dir);
        char err[4096];
        read_into(path, err, sizeof err);
        cr_assert(WIFEXITED(w) && WEXITSTATUS(w) == 0, "%s --recompute %s failed: %s", opts,
                  modes[k], err);
        rec[k] = malloc(1 << 16);
        cr_assert_not_null(rec[k]);
        snprintf(path, sizeof path, "%s/%s.jsonl", dir, modes[k]);
        read_into(path, rec[k], 1 << 16);
    }
    for (int k = 1; k < 2; k++) {
        char what[1024], a[2 * ST_TEST_PATH_MAX], b[2 * ST_TEST_PATH_MAX];
        snprintf(what, sizeof what, "%s (none, %s)", opts, modes[k]);
        expect_same_records(rec[0], rec[k], what);
        snprintf(a, sizeof a, "%s/none/final.safetensors", dir);
        snprintf(b, sizeof b, "%s/%s/final.safetensors", dir, modes[k]);
        cr_assert(same_file(a, b), "%s: the final weights differ", what);
    }
    for (int k = 0; k < 2; k++)
        free(rec[k]);
}

/* dp, sdp (blocks forward, neurons backward), ist, localsgd and synth on
 * 8 x 8 images, gpt (sdp of blocks) on a text file and resnet (sdp of
 * neurons) on the images: BLOCKS in fp32, ALL in bf16 (every model
 * and subnetwork in both modes and precisions: test_model_recompute). */
Test(cli_recompute, every_strategy_and_precision_gives_the_same_records_and_weights,
     .timeout = 300)
{
    char dir[ST_TEST_PATH_MAX], text[ST_TEST_PATH_MAX], opts[8 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(text, dir, "words.txt");
    FILE *f = fopen(text, "w");
    cr_assert_not_null(f);
    for (int i = 0; i < 600; i++)
        fputs(i % 3 ? "the word of a dictionary; " : "noun.\n", f);
    fclose(f);
    write_idx_set(dir, 64, 16, 4, 5);
    char data[2 * ST_TEST_PATH_MAX], res[4 * ST_TEST_PATH_MAX];
    snprintf(data, sizeof data, "--data 'idx:%s:tr-img,tr-lab,te-img,te-lab'", dir);
    snprintf(res, sizeof res, "%s --model resmlp --depth 3 --width 16 --batch 8 --steps 12 "
             "--workers 2", data);
    const char *runs[] = {
        "--strategy dp",
        "--strategy sdp --subnet block --masking forward",
        "--strategy sdp --subnet neuron --masking backward --neuron-group 4",
        "--strategy ist --local-steps 3",
        "--strategy localsgd --local-steps 3",
    };
    const int precisions = st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE ? 1 : 2;
    for (int p = 0; p < precisions; p++) {
        const char *prec = p ? "--precision bf16" : "--precision fp32";
        const char *mode = p ? "all" : "blocks";
        for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
            snprintf(opts, sizeof opts, "%s %s %s", res, runs[i], prec);
            expect_modes_agree(dir, opts, mode);
        }
        snprintf(opts, sizeof opts, "%s --strategy synth --depth 3 --width 16 --batch 8 "
                 "--epochs 2 --recovery-epochs 1 --workers 2 %s", data, prec);
        expect_modes_agree(dir, opts, mode);
        snprintf(opts, sizeof opts, "--model gpt --data 'text:%s' --depth 2 --width 16 "
                 "--heads 2 --context 8 --batch 4 --steps 6 --val-bytes 256 --workers 2 "
                 "--strategy sdp %s", text, prec);
        expect_modes_agree(dir, opts, mode);
        snprintf(opts, sizeof opts, "%s --model resnet --depth 1 --width 8 --batch 8 --steps 6 "
                 "--workers 2 --strategy sdp --subnet neuron --neuron-group 4 %s", data, prec);
        expect_modes_agree(dir, opts, mode);
    }
    st_test_rmdir(dir);
}

/* The mode does not change the numbers, so a resume may change it: a run
 * stopped at its step checkpoint and resumed with another mode ends with
 * the weights of the run never stopped; --dump-config prints the mode
 * and --config reads it back. */
Test(cli_recompute, a_resume_may_change_the_mode, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], cmd[8 * ST_TEST_PATH_MAX], a[2 * ST_TEST_PATH_MAX],
        b[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    const char *opts = "--data synthetic --model resmlp --depth 3 --width 16 --batch 16 "
                       "--steps 40 --progress none";
    snprintf(cmd, sizeof cmd, "'%s' %s --checkpoint '%s/straight' >/dev/null 2>&1",
             getenv("SUBTRAIN_BIN"), opts, dir);
    cr_assert_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "'%s' %s --recompute blocks --checkpoint-every 20 "
             "--checkpoint '%s/part' >/dev/null 2>&1", getenv("SUBTRAIN_BIN"), opts, dir);
    cr_assert_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "'%s' %s --recompute all --resume '%s/part/step-00000020."
             "safetensors' --checkpoint '%s/resumed' >'%s/out' 2>'%s/err'",
             getenv("SUBTRAIN_BIN"), opts, dir, dir, dir, dir);
    const int w = system(cmd);
    snprintf(a, sizeof a, "%s/err", dir);
    char err[4096];
    read_into(a, err, sizeof err);
    cr_assert(WIFEXITED(w) && WEXITSTATUS(w) == 0, "the resume with another mode: %s", err);
    snprintf(a, sizeof a, "%s/straight/final.safetensors", dir);
    snprintf(b, sizeof b, "%s/resumed/final.safetensors", dir);
    cr_assert(same_file(a, b), "resumed with --recompute all, the weights differ");
    st_test_rmdir(dir);

    run_result *r = calloc(1, sizeof *r);
    run(r, NULL, "--recompute all --dump-config");
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert(strstr(r->out, "recompute = all\n"), "%s", r->out);
    run(r, NULL, "--dump-config");
    cr_assert(strstr(r->out, "recompute = none\n"), "%s", r->out);
    run(r, NULL, "--data synthetic --depth 2 --width 8 --steps 2 --recompute blocks");
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert(strstr(r->out, "recompute blocks"), "the banner names the mode: %s", r->out);
    free(r);
}

Test(cli_recompute, a_bad_mode_is_a_usage_error)
{
    expect_usage_error("--recompute some", "--recompute");
    expect_usage_error("--recompute", "--recompute");
}

/*
 * tests/test_cli_checkpoints.c — checkpoints from the command line: eval
 * and --init of saved weights, signals that stop a run after its step,
 * periodic checkpoints, resumes that are bitwise the run never stopped, and
 * what a resume refuses.
 */
#include "cli_run.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <criterion/criterion.h>
#include <subtrain/checkpoint.h>
#include <subtrain/model.h>
#include <signal.h>

/* --checkpoint writes the trained weights; `subtrain eval --init` gives
 * the run's final test numbers from them, to the printed digit; --init
 * fine-tunes from them; another model's options are refused. */
Test(cli, checkpoint_eval_and_init, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], args[4 * ST_TEST_PATH_MAX], file[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    snprintf(file, sizeof file, "%s/ck/final.safetensors", dir);
    const char *model = "--data synthetic --depth 2 --width 32 --batch 64";
    snprintf(args, sizeof args, "%s --steps 60 --workers 2 --progress none --checkpoint '%s/ck'",
             model, dir);
    run_result *r = calloc(1, sizeof *r);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "stderr: %s", r->err);
    cr_assert(strstr(r->out, "weights: ") && strstr(r->out, "final.safetensors"), "%s", r->out);
    const char *fin = strstr(r->out, "final: test_acc ");
    cr_assert_not_null(fin, "%s", r->out);
    char acc[16], loss[16];
    cr_assert_eq(sscanf(fin, "final: test_acc %15s test_loss %15s", acc, loss), 2);
    snprintf(args, sizeof args, "eval --init '%s' %s", file, model);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "stderr: %s", r->err);
    char want[64];
    snprintf(want, sizeof want, "test_acc %s  test_loss %s", acc, loss);
    cr_assert(strstr(r->out, want), "expected '%s' in: %s", want, r->out);
    snprintf(args, sizeof args, "--init '%s' %s --steps 10 --lr 0.0001 --progress none", file,
             model);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "stderr: %s", r->err);
    snprintf(args, sizeof args, "eval --init '%s' --data synthetic --depth 3 --width 32", file);
    run(r, NULL, args);
    cr_assert_eq(r->status, 1, "stderr: %s", r->err);
    cr_assert(strstr(r->err, "block2.ln.gamma") && strstr(r->err, "another model") &&
              count_lines(r->err) == 1, "%s", r->err);
    snprintf(args, sizeof args, "eval --init '%s/missing.safetensors' --data synthetic", dir);
    run(r, NULL, args);
    cr_assert_eq(r->status, 1, "stderr: %s", r->err);
    cr_assert(strstr(r->err, "missing.safetensors") && count_lines(r->err) == 1, "%s", r->err);
    free(r);
    st_test_rmdir(dir);
    expect_usage_error("eval --data synthetic", "eval needs --init FILE");
    expect_usage_error("eval --init x --checkpoint y --data synthetic", "eval writes no checkpoint");
    expect_usage_error("--init x --strategy synth --data synthetic", "--init does not apply");
}

/* A signal during a run: every worker finishes its step, the final
 * record says "interrupted", the weights are written, and the exit
 * status is 128 + the signal.  The signal is sent once the first epoch
 * record is in the metrics file (the run is training by then); a file
 * merely not empty may be the start-up probe's byte, written and cut. */
static void expect_graceful_stop(int sig, const char *strategy, int want)
{
    char dir[ST_TEST_PATH_MAX], metrics[ST_TEST_PATH_MAX], cmd[8 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(metrics, dir, "m.jsonl");
    snprintf(cmd, sizeof cmd, "'%s' --data synthetic --depth 2 --width 32 --batch 64 "
             "--steps 100000000 --workers 2 --strategy %s --local-steps 7 --progress none "
             "--metrics '%s' --checkpoint '%s/ck' >'%s/out' 2>'%s/err' </dev/null & "
             "pid=$!; i=0; while ! grep -q '\"epoch\":' '%s' 2>/dev/null && [ $i -lt 600 ]; do "
             "sleep 0.1; i=$((i+1)); done; "
             "kill -%d $pid; wait $pid", getenv("SUBTRAIN_BIN"), strategy, metrics, dir, dir, dir,
             metrics, sig);
    int w = system(cmd);
    cr_assert(WIFEXITED(w), "the shell was killed");
    cr_assert_eq(WEXITSTATUS(w), want, "signal %d, %s: exit %d", sig, strategy, WEXITSTATUS(w));
    char rec[1 << 16], path[2 * ST_TEST_PATH_MAX];
    read_into(metrics, rec, sizeof rec);
    const char *last = strstr(rec, "{\"interrupted\":true,");
    cr_assert_not_null(last, "no interrupted record: %s", rec);
    cr_assert(strstr(last, "\"final\":true"), "%s", last);
    /* the epoch the signal cut short has no record of its own: every
     * other record ends an epoch (128 steps of 2 x 64 samples) */
    for (const char *at = rec; (at = strstr(at, "\"step\":")) && at < last; at++)
        cr_assert_eq(strtoull(at + 7, NULL, 10) % 128, 0, "a record of a cut epoch: %.80s", at);
    snprintf(path, sizeof path, "%s/ck/final.safetensors", dir);
    size_t n = 0;   /* (test_ckpt reads such files; here: it is there, a header and data) */
    unsigned char *b = st_test_read_file(path, &n);
    cr_assert(b && n > 8, "no weights at %s", path);
    uint64_t h = 0;
    for (int k = 7; k >= 0; k--)
        h = h << 8 | b[k];
    cr_assert(h > 0 && 8 + h < n && b[8] == '{', "not a safetensors file: %s", path);
    free(b);
    st_test_rmdir(dir);
}

Test(cli, signals_stop_after_the_step_with_records_and_weights, .timeout = 180)
{
    expect_graceful_stop(SIGTERM, "dp", 143);
    expect_graceful_stop(SIGINT, "sdp", 130);
    expect_graceful_stop(SIGUSR1, "ist", 128 + SIGUSR1);
}

/* --checkpoint DIR holding step checkpoints is their run's: a new run
 * there (which would overwrite same-numbered files, and with --keep
 * delete the others) and a run resumed from elsewhere are refused before
 * the data loads (exit 2), leaving the files as they were; a run resumed
 * from DIR goes on there.  The checkpoint notes are on standard output. */
Test(cli, a_checkpoint_directory_of_another_run_is_refused, .timeout = 60)
{
    char dir[ST_TEST_PATH_MAX], args[4 * ST_TEST_PATH_MAX], step[2 * ST_TEST_PATH_MAX];
    char copy[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    const char *base = "--data synthetic --depth 2 --width 32 --batch 32 --steps 12 "
                       "--checkpoint-every 6 --progress none -q";
    run_result *r = calloc(1, sizeof *r);
    /* (without -q: the checkpoint notes go to standard output, so that
     * standard error holds a failure's one line alone) */
    snprintf(args, sizeof args, "%s --checkpoint '%s/a' --progress none", base, dir);
    char *loud = strstr(args, " -q");
    cr_assert_not_null(loud);
    memcpy(loud, "   ", 3);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert_str_eq(r->err, "", "a run's checkpoint notes on standard error");
    cr_assert(strstr(r->out, "checkpoint: ") && strstr(r->out, "(step 6)\n"), "%s", r->out);
    snprintf(step, sizeof step, "%s/a/step-00000006.safetensors", dir);
    size_t n0 = 0, n1 = 0;
    unsigned char *before = st_test_read_file(step, &n0);
    cr_assert_not_null(before);
    snprintf(args, sizeof args, "%s --seed 9 --keep 1 --checkpoint '%s/a'", base, dir);
    expect_usage_error(args, "holds another run's step checkpoints "
                             "(step-00000006.safetensors, ...): continue it with --resume");
    snprintf(copy, sizeof copy, "%s/b", dir);
    cr_assert_eq(mkdir(copy, 0700), 0);
    snprintf(copy, sizeof copy, "%s/b/step-00000006.safetensors", dir);
    cr_assert_eq(st_test_write_file(copy, (const char *)before, n0), 0);
    snprintf(args, sizeof args, "%s --checkpoint '%s/a' --resume '%s/b'", base, dir, dir);
    expect_usage_error(args, "holds another run's step checkpoints");
    unsigned char *after = st_test_read_file(step, &n1);
    cr_assert(after && n1 == n0 && memcmp(before, after, n0) == 0,
              "a refused run changed %s", step);
    snprintf(args, sizeof args, "%s --checkpoint '%s/a' --resume '%s'", base, dir, step);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "resumed from its own directory: %s", r->err);
    free(before);
    free(after);
    free(r);
    st_test_rmdir(dir);
}

/* eval and export of a subtrain-layout file refuse another --activation
 * or --heads than its run's (the tensors' shapes are the same, the
 * function is not): one line naming the value to give, exit 1. */
Test(cli, eval_refuses_another_activation_or_heads, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], text[ST_TEST_PATH_MAX], args[6 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    write_cat_corpus(text, dir);
    const char *mlp = "--data synthetic --model mlp --depth 2 --width 32";
    char gpt[2 * ST_TEST_PATH_MAX];
    snprintf(gpt, sizeof gpt, "--model gpt --data 'text:%s' --depth 1 --width 16 --heads 2 "
             "--context 16 --batch 4 --val-bytes 256", text);
    run_result *r = calloc(1, sizeof *r);
    snprintf(args, sizeof args, "%s --steps 2 -q --checkpoint '%s/m'", mlp, dir);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    snprintf(args, sizeof args, "%s --steps 2 -q --checkpoint '%s/g'", gpt, dir);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    const struct { const char *cmd, *model, *ck, *extra, *needle; } cases[] = {
        { "eval", mlp, "m", "--activation relu", "its run had --activation gelu, the model relu" },
        { "eval", gpt, "g", "--heads 4", "its run had --heads 2, the model 4: give --heads 2" },
        { "export", mlp, "m", "--activation relu -o /dev/null/x", "--activation gelu" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(args, sizeof args, "%s --init '%s/%s/final.safetensors' %s %s", cases[i].cmd,
                 dir, cases[i].ck, cases[i].model, cases[i].extra);
        run(r, NULL, args);
        cr_assert(r->status == 1 && strstr(r->err, cases[i].needle) && count_lines(r->err) == 1,
                  "%s: exit %d: %s", args, r->status, r->err);
        snprintf(args, sizeof args, "eval --init '%s/%s/final.safetensors' %s", dir,
                 cases[i].ck, cases[i].model);
        run(r, NULL, args);
        cr_assert_eq(r->status, 0, "%s: %s", args, r->err);
    }
    free(r);
    st_test_rmdir(dir);
}

/* --sample after training: a stop signal while it draws ends the run at
 * once with the signal's status (its records and final weights are
 * written before the sample, which is all that is left).  Sent once the
 * final record is out, into a sample far longer than the test's wait. */
Test(cli, a_signal_stops_the_sample_at_once, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], text[ST_TEST_PATH_MAX], metrics[ST_TEST_PATH_MAX];
    char cmd[10 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    write_cat_corpus(text, dir);
    st_test_path(metrics, dir, "m.jsonl");
    snprintf(cmd, sizeof cmd, "'%s' --model gpt --data 'text:%s' --depth 1 --width 16 "
             "--heads 2 --context 64 --batch 4 --steps 5 --val-bytes 256 --progress none "
             "--sample 1000000 --metrics '%s' --checkpoint '%s/ck' >'%s/out' 2>'%s/err' "
             "</dev/null & pid=$!; i=0; while ! grep -q '\"final\":true' '%s' 2>/dev/null && "
             "[ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; sleep 0.5; kill -TERM $pid; "
             "i=0; while kill -0 $pid 2>/dev/null && [ $i -lt 200 ]; do sleep 0.05; "
             "i=$((i+1)); done; kill -KILL $pid 2>/dev/null; wait $pid",
             getenv("SUBTRAIN_BIN"), text, metrics, dir, dir, dir, metrics);
    int w = system(cmd);
    cr_assert(WIFEXITED(w), "the shell was killed");
    cr_assert_eq(WEXITSTATUS(w), 143, "SIGTERM while sampling: exit %d (137: it sampled on "
                 "for 10 s)", WEXITSTATUS(w));
    char err[4096], path[2 * ST_TEST_PATH_MAX];
    snprintf(path, sizeof path, "%s/err", dir);
    read_into(path, err, sizeof err);
    cr_assert(strstr(err, "subtrain: stopping the sample\n"), "%s", err);
    snprintf(path, sizeof path, "%s/ck/final.safetensors", dir);
    cr_assert_eq(access(path, F_OK), 0, "no final weights before the sample");
    st_test_rmdir(dir);
}

/* The shell command of a run of `opts` writing into dir/name (its
 * checkpoint directory, metrics, stdout and stderr). */
static void run_cmd(char *cmd, size_t len, const char *opts, const char *dir, const char *name,
                    const char *extra)
{
    snprintf(cmd, len, "'%s' %s --progress none --checkpoint '%s/%s' --metrics '%s/%s.jsonl' "
             "%s >'%s/%s.out' 2>'%s/%s.err' </dev/null", getenv("SUBTRAIN_BIN"), opts, dir,
             name, dir, name, extra, dir, name, dir, name);
}

/* A run stopped by SIGTERM once its first epoch record is out, with
 * --checkpoint, then resumed with --resume DIR (and `resume_opts`), ends
 * with the weights of the same run never stopped, byte for byte; the
 * stopped run's step checkpoint and interrupted record are there. */
static void expect_resume_with(const char *opts, const char *resume_opts)
{
    char dir[ST_TEST_PATH_MAX], cmd[8 * ST_TEST_PATH_MAX], a[2 * ST_TEST_PATH_MAX],
        b[2 * ST_TEST_PATH_MAX], rest[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    run_cmd(cmd, sizeof cmd, opts, dir, "straight", "");
    int w = system(cmd);
    cr_assert(WIFEXITED(w) && WEXITSTATUS(w) == 0, "%s: the straight run failed", opts);
    run_cmd(cmd, sizeof cmd, opts, dir, "stopped", "");
    char bg[9 * ST_TEST_PATH_MAX];
    snprintf(bg, sizeof bg, "%s & pid=$!; i=0; "
             "while ! grep -q '\"epoch\":' '%s/stopped.jsonl' 2>/dev/null && "
             "[ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; kill -TERM $pid; wait $pid",
             cmd, dir);
    w = system(bg);
    cr_assert(WIFEXITED(w) && WEXITSTATUS(w) == 143, "%s: the stopped run exited %d (it must "
              "still be training when its first record is out)", opts, WEXITSTATUS(w));
    char rec[1 << 16];
    snprintf(a, sizeof a, "%s/stopped.jsonl", dir);
    read_into(a, rec, sizeof rec);
    cr_assert(strstr(rec, "{\"interrupted\":true,"), "%s", rec);
    snprintf(rest, sizeof rest, "--resume '%s/stopped' %s", dir, resume_opts);
    run_cmd(cmd, sizeof cmd, opts, dir, "resumed", rest);
    w = system(cmd);
    snprintf(a, sizeof a, "%s/resumed.err", dir);
    read_into(a, rec, sizeof rec);
    cr_assert(WIFEXITED(w) && WEXITSTATUS(w) == 0, "%s: the resumed run failed: %s", opts, rec);
    snprintf(a, sizeof a, "%s/straight/final.safetensors", dir);
    snprintf(b, sizeof b, "%s/resumed/final.safetensors", dir);
    cr_assert(same_file(a, b), "%s: resumed weights differ from the straight run's", opts);
    st_test_rmdir(dir);
}

static void expect_exact_resume(const char *opts)
{
    expect_resume_with(opts, "");
}

Test(cli, stopped_runs_resume_bitwise, .timeout = 240)
{
    const char *base = "--data synthetic --model mlp --depth 2 --width 32 --batch 32 "
                       "--epochs 10 --workers 2";
    char opts[512];
    snprintf(opts, sizeof opts, "%s --strategy dp", base);
    expect_exact_resume(opts);
    snprintf(opts, sizeof opts, "%s --strategy sdp --subnet neuron --resample 5", base);
    expect_exact_resume(opts);
    snprintf(opts, sizeof opts, "%s --strategy ist --local-steps 7 --optimizer-state keep", base);
    expect_exact_resume(opts);
    snprintf(opts, sizeof opts, "%s --strategy localsgd --local-steps 7 --optimizer-state keep",
             base);
    expect_exact_resume(opts);
    /* synth stops at a segment epoch's end (or in its recovery epochs) */
    expect_exact_resume("--data synthetic --strategy synth --depth 3 --width 32 --batch 32 "
                        "--epochs 8 --recovery-epochs 2 --workers 2");
}

/* --weights may change on a resume: where the weights lie is not what
 * they are (a checkpoint holds the full model either way). */
Test(cli, resumes_with_the_other_weights_placement, .timeout = 120)
{
    const char *base = "--data synthetic --model mlp --depth 2 --width 32 --batch 32 "
                       "--epochs 10 --workers 2";
    char opts[512];
    snprintf(opts, sizeof opts, "%s --weights private", base);
    expect_resume_with(opts, "--weights shared");
    snprintf(opts, sizeof opts, "%s --weights shared", base);
    expect_resume_with(opts, "--weights private");
}

/* --checkpoint-every with --keep: the newest K step files stay;
 * SIGUSR1 with --usr1 checkpoint writes one more and the run goes on to
 * the end, its weights those of a run never signalled. */
Test(cli, periodic_checkpoints_keep_the_newest, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], cmd[8 * ST_TEST_PATH_MAX], path[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    const char *opts = "--data synthetic --model mlp --depth 2 --width 32 --batch 32 "
                       "--steps 300 --workers 2";
    run_cmd(cmd, sizeof cmd, opts, dir, "kept", "--checkpoint-every 50 --keep 2");
    int w = system(cmd);
    cr_assert(WIFEXITED(w) && WEXITSTATUS(w) == 0);
    static const char *const want[] = { "step-00000200.safetensors",
                                        "step-00000250.safetensors" };
    static const char *const gone[] = { "step-00000050.safetensors", "step-00000150.safetensors",
                                        "step-00000300.safetensors" };
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/kept/%s", dir, want[i]);
        cr_assert_eq(access(path, R_OK), 0, "%s is missing", path);
        snprintf(path, sizeof path, "%s/kept/%s", dir, gone[i]);
        cr_assert_neq(access(path, F_OK), 0, "%s should not be there", path);
    }
    snprintf(path, sizeof path, "%s/kept/%s", dir, gone[2]);
    cr_assert_neq(access(path, F_OK), 0, "no step checkpoint after the last step");

    const char *longer = "--data synthetic --model mlp --depth 2 --width 32 --batch 32 "
                         "--epochs 16 --workers 2";
    run_cmd(cmd, sizeof cmd, longer, dir, "plain", "");
    w = system(cmd);
    cr_assert(WIFEXITED(w) && WEXITSTATUS(w) == 0);
    run_cmd(cmd, sizeof cmd, longer, dir, "usr1", "--usr1 checkpoint");
    char bg[9 * ST_TEST_PATH_MAX];
    snprintf(bg, sizeof bg, "%s & pid=$!; i=0; "
             "while ! grep -q '\"epoch\":' '%s/usr1.jsonl' 2>/dev/null && "
             "[ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; kill -USR1 $pid; wait $pid; "
             "ls '%s/usr1' | grep -q '^step-'", cmd, dir, dir);
    w = system(bg);
    cr_assert(WIFEXITED(w) && WEXITSTATUS(w) == 0, "SIGUSR1 with --usr1 checkpoint: exit %d, or "
              "no step checkpoint", WEXITSTATUS(w));
    char a[2 * ST_TEST_PATH_MAX];
    snprintf(a, sizeof a, "%s/plain/final.safetensors", dir);
    snprintf(path, sizeof path, "%s/usr1/final.safetensors", dir);
    cr_assert(same_file(a, path), "a checkpoint on SIGUSR1 changed the run");
    st_test_rmdir(dir);
}

/* kill -9 of a run that writes a step checkpoint every 3 steps (keeping
 * 2), at random moments after its first checkpoint (0-800 ms later, while
 * it trains and writes): every time, --resume of its directory continues
 * from the newest complete file to the end.  The atomic rename leaves no
 * half-written step file to find. */
Test(cli, killed_runs_resume_from_their_newest_checkpoint, .timeout = 300)
{
    char dir[ST_TEST_PATH_MAX], cmd[8 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    /* 1000 steps: about 2 s quiet, longer than the first checkpoint and
     * the 800 ms that may follow it before the kill */
    const char *opts = "--data synthetic --model mlp --depth 2 --width 64 --batch 32 "
                       "--steps 1000 --workers 2 --progress none --quiet";
    srand(7);
    for (int k = 0; k < 6; k++) {
        const int ms = rand() % 800;
        snprintf(cmd, sizeof cmd, "rm -rf '%s/ck'; '%s' %s --checkpoint '%s/ck' "
                 "--checkpoint-every 3 --keep 2 >/dev/null 2>&1 & pid=$!; i=0; "
                 "while ! ls '%s/ck' 2>/dev/null | grep -q '^step-' && [ $i -lt 1200 ]; "
                 "do sleep 0.05; i=$((i+1)); done; sleep 0.%03d; kill -9 $pid; "
                 "wait $pid 2>/dev/null; "
                 "'%s' %s --checkpoint '%s/ck' --resume '%s/ck' >'%s/out' 2>&1",
                 dir, getenv("SUBTRAIN_BIN"), opts, dir, dir, ms, getenv("SUBTRAIN_BIN"), opts,
                 dir, dir, dir);
        int w = system(cmd);
        cr_assert(WIFEXITED(w), "the shell was killed");
        char out[4096], path[2 * ST_TEST_PATH_MAX];
        snprintf(path, sizeof path, "%s/out", dir);
        read_into(path, out, sizeof out);
        cr_assert_eq(WEXITSTATUS(w), 0, "kill -9 %d ms after the first checkpoint, then "
                     "--resume: %s", ms, out);
        snprintf(path, sizeof path, "%s/ck/final.safetensors", dir);
        cr_assert_eq(access(path, R_OK), 0, "no final weights after resuming");
    }
    st_test_rmdir(dir);
}

/* --resume refuses, in one line, what would not continue this run. */
Test(cli, resume_refuses_another_run_or_a_bad_file, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], cmd[8 * ST_TEST_PATH_MAX], args[4 * ST_TEST_PATH_MAX],
        step[2 * ST_TEST_PATH_MAX], path[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    const char *opts = "--data synthetic --model mlp --depth 2 --width 32 --batch 32 "
                       "--steps 120 --workers 2";
    run_cmd(cmd, sizeof cmd, opts, dir, "ck", "--checkpoint-every 100");
    int w = system(cmd);
    cr_assert(WIFEXITED(w) && WEXITSTATUS(w) == 0);
    snprintf(step, sizeof step, "%s/ck/step-00000100.safetensors", dir);
    static const struct { const char *change, *needle; } other[] = {
        { "--workers 1", "its run had 2 workers, this one has 1 (--workers 1)" },
        { "--workers 2 --strategy ist", "its run had --strategy dp, this one has --strategy ist" },
        { "--workers 2 --width 16", "its run had --width 32, this one has --width 16" },
        { "--workers 2 --seed 7", "its run had --seed 1, this one has --seed 7" },
        { "--workers 2 --lr 0.01", "its run had --lr 0.001, this one has --lr 0.01" },
        { "--workers 2 --steps 200", "its run had --steps 120, this one has --steps 200" },
    };
    for (size_t i = 0; i < sizeof other / sizeof *other; i++) {
        snprintf(args, sizeof args, "--data synthetic --model mlp --depth 2 --width 32 "
                 "--batch 32 --steps 120 %s --resume '%s'", other[i].change, step);
        expect_runtime_error(NULL, args, other[i].needle);
    }
    /* weights only, no checkpoint in the directory, a truncated file, a bad header */
    snprintf(args, sizeof args, "%s --resume '%s/ck/final.safetensors'", opts, dir);
    expect_runtime_error(NULL, args, "holds weights only");
    snprintf(args, sizeof args, "%s --resume '%s'", opts, dir);
    expect_runtime_error(NULL, args, "holds no step checkpoint");
    size_t n = 0;
    unsigned char *b = st_test_read_file(step, &n);
    cr_assert(b && n > 1000);
    snprintf(path, sizeof path, "%s/cut.safetensors", dir);
    cr_assert_eq(st_test_write_file(path, b, n - 100), 0);
    snprintf(args, sizeof args, "%s --resume '%s'", opts, path);
    expect_runtime_error(NULL, args, "cut.safetensors");
    b[9] = 'x';   /* the JSON header's first key */
    snprintf(path, sizeof path, "%s/bad.safetensors", dir);
    cr_assert_eq(st_test_write_file(path, b, n), 0);
    snprintf(args, sizeof args, "%s --resume '%s'", opts, path);
    expect_runtime_error(NULL, args, "bad.safetensors");
    free(b);
    st_test_rmdir(dir);
    expect_usage_error("--data synthetic --keep 2", "--keep needs --checkpoint DIR");
    expect_usage_error("--data synthetic --checkpoint x --checkpoint-every 0",
                       "--checkpoint-every");
    expect_usage_error("--data synthetic --usr1 later", "--usr1");
    expect_usage_error("--data synthetic --init a --resume b", "--init and --resume");
}

/* A copy of the step checkpoint `from` at `to` with metadata entry `key`
 * set to `value` (the writer records the new CRC, as a tool editing the
 * file would). */
static void rewrite_meta(const char *from, const char *to, const char *key, const char *value)
{
    st_safetensors f;
    cr_assert_eq(st_safetensors_read(from, &f), ST_OK);
    int found = 0;
    for (int i = 0; i < f.n_meta; i++)
        if (strcmp(f.meta[i].key, key) == 0) {
            f.meta[i].value = value;
            found = 1;
        }
    cr_assert(found, "no %s in %s", key, from);
    cr_assert_eq(st_safetensors_write(to, f.tensors, f.n, f.meta, f.n_meta), ST_OK);
    st_safetensors_free(&f);
}

/* The position's numbers and a strategy's counters in a step
 * checkpoint's metadata are checked: a time below zero, a sum that is
 * not finite, a count of rounds or steps beyond the steps taken are
 * refused in one line naming the entry, and the file unchanged resumes. */
Test(cli, resume_refuses_metadata_out_of_range, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], cmd[8 * ST_TEST_PATH_MAX], args[4 * ST_TEST_PATH_MAX],
        step[2 * ST_TEST_PATH_MAX], path[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    const char *opts = "--data synthetic --model mlp --depth 2 --width 32 --batch 32 "
                       "--steps 20 --workers 2 --strategy ist --local-steps 5";
    run_cmd(cmd, sizeof cmd, opts, dir, "ck", "--checkpoint-every 10");
    int w = system(cmd);
    cr_assert(WIFEXITED(w) && WEXITSTATUS(w) == 0);
    snprintf(step, sizeof step, "%s/ck/step-00000010.safetensors", dir);
    static const struct { const char *key, *value, *needle; } bad[] = {
        { "subtrain.train_time", "-1", "'subtrain.train_time' is -1 in its metadata, not a "
          "finite number of 0 or more" },
        { "subtrain.loss_sum", "nan", "'subtrain.loss_sum' is nan in its metadata, not a "
          "finite number" },
        { "subtrain.loss_sum", "inf", "'subtrain.loss_sum' is inf" },
        { "subtrain.ist.rounds", "11", "'subtrain.ist.rounds' is 11 in its metadata, more "
          "than the 10 steps its run had taken" },
        { "subtrain.ist.round_step", "18446744073709551615", "'subtrain.ist.round_step' is "
          "18446744073709551615" },
        { "subtrain.ist.rounds", "2", NULL },   /* as written: resumes */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(path, sizeof path, "%s/edited%zu.safetensors", dir, i);
        rewrite_meta(step, path, bad[i].key, bad[i].value);
        snprintf(args, sizeof args, "%s --resume '%s'", opts, path);
        if (bad[i].needle) {
            expect_runtime_error(NULL, args, bad[i].needle);
            continue;
        }
        run_result *r = calloc(1, sizeof *r);
        run(r, NULL, args);
        cr_assert_eq(r->status, 0, "%s: %s", args, r->err);
        free(r);
    }
    st_test_rmdir(dir);
}

/* A run that diverges writes no step checkpoint of its state once that
 * is not finite: the last finite one stays, --keep 1 keeps it, and a
 * resume reads it (and diverges again, as the same run would). */
Test(cli, a_diverging_run_keeps_its_last_finite_checkpoint, .timeout = 60)
{
    char dir[ST_TEST_PATH_MAX], args[4 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    static const char opts[] = "--data synthetic --model mlp --depth 2 --width 32 --batch 16 "
                               "--steps 30 --lr 10 --weight-decay 10 -q";
    snprintf(args, sizeof args, "%s --checkpoint '%s/ck' --checkpoint-every 1 --keep 1", opts,
             dir);
    expect_runtime_error(NULL, args, "holds +infinity (element 0): training diverged; try a "
                         "smaller --lr (no step checkpoint written for it)");
    char path[2 * ST_TEST_PATH_MAX];
    snprintf(path, sizeof path, "%s/ck/step-00000006.safetensors", dir);
    cr_assert_eq(access(path, R_OK), 0, "the last finite checkpoint, step 6, is gone");
    run_result *r = calloc(1, sizeof *r);
    snprintf(args, sizeof args, "%s --resume '%s/ck'", opts, dir);
    run(r, NULL, args);
    cr_assert_eq(r->status, 1, "%s", r->err);
    cr_assert(strstr(r->err, "training diverged") && !strstr(r->err, "must be finite"),
              "the resume did not read the checkpoint: %s", r->err);
    free(r);
    st_test_rmdir(dir);
}

/* A --checkpoint the run cannot write in is said before the data loads,
 * not when the trained weights are due (here: 400 steps later). */
Test(cli, an_unwritable_checkpoint_directory_is_said_at_once, .timeout = 60)
{
    char dir[ST_TEST_PATH_MAX], path[2 * ST_TEST_PATH_MAX], args[4 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    snprintf(path, sizeof path, "%s/afile", dir);
    cr_assert_eq(st_test_write_file(path, "x", 1), 0);
    snprintf(args, sizeof args, "--data /nonexistent/data --steps 400 -q --checkpoint '%s'", path);
    expect_runtime_error(NULL, args, "afile: cannot write in it: Not a directory");
    /* a directory the run made goes again if it fails before it writes
     * a file in it: at the data, and while it builds its workers */
    snprintf(path, sizeof path, "%s/made", dir);
    snprintf(args, sizeof args, "--data /nonexistent/data --steps 2 -q --checkpoint '%s'", path);
    expect_runtime_error(NULL, args, "Fashion-MNIST not found");
    cr_assert_neq(access(path, F_OK), 0, "a failed run left %s", path);
    snprintf(args, sizeof args, "--data synthetic --model convnet --steps 2 -q --checkpoint '%s'",
             path);
    expect_runtime_error(NULL, args, "--model convnet takes images");
    cr_assert_neq(access(path, F_OK), 0, "a failed run left %s", path);
    st_test_rmdir(dir);
}

/* The weights file is written beside its name and renamed over it: a
 * FIFO (or a device, a link) there is refused, and left as it was. */
Test(cli, weights_are_not_renamed_over_a_fifo, .timeout = 60)
{
    char dir[ST_TEST_PATH_MAX], path[2 * ST_TEST_PATH_MAX], args[4 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    snprintf(path, sizeof path, "%s/final.safetensors", dir);
    cr_assert_eq(mkfifo(path, 0644), 0);
    snprintf(args, sizeof args, "--data synthetic --model mlp --depth 1 --width 16 --steps 2 -q "
             "--checkpoint '%s'", dir);
    expect_runtime_error(NULL, args, "final.safetensors: not a regular file (a FIFO): a "
                         "safetensors file is written beside it and renamed over it");
    struct stat sb;
    cr_assert(lstat(path, &sb) == 0 && S_ISFIFO(sb.st_mode), "the FIFO was replaced");
    st_test_rmdir(dir);
}

/* The shell lines that wait (up to 20 s) for $pid to stop itself
 * (SUBTRAIN_FAULT=stop:final.safetensors: the final weights are in their
 * temporary file), then send it `sigs` and let it go on, and wait for it. */
#define STOPPED_THEN(sigs)                                                                    \
    "i=0; while [ \"$(cut -d' ' -f3 /proc/$pid/stat)\" != T ] && [ $i -lt 400 ]; do "         \
    "sleep 0.05; i=$((i+1)); done; kill " sigs " $pid; kill -CONT $pid; wait $pid"

/* Names in dir holding ".tmp." (a writer's temporary files). */
static int tmps_in(const char *dir)
{
    char cmd[2 * ST_TEST_PATH_MAX];
    snprintf(cmd, sizeof cmd, "ls -a '%s' | grep -c '[.]tmp[.]'", dir);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    int n = -1;
    cr_assert_eq(fscanf(p, "%d", &n), 1);
    pclose(p);
    return n;
}

/* Signals while the final weights are written: one after the last step
 * lets the write finish, says so and exits as the signal would have; a
 * second SIGINT (after a SIGTERM that stopped training) ends the run at
 * once and takes the temporary file with it; a writer killed there
 * (SIGKILL) leaves its temporary file, which the next write of the same
 * name removes. */
Test(cli, a_signal_while_the_final_weights_are_written, .timeout = 180)
{
    char dir[ST_TEST_PATH_MAX], cmd[8 * ST_TEST_PATH_MAX], path[2 * ST_TEST_PATH_MAX];
    char out[1 << 14], err[1 << 14];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    const char *bin = getenv("SUBTRAIN_BIN");
    const char *opts = "--data synthetic --model mlp --depth 2 --width 32 --batch 32 "
                       "--progress none";
    snprintf(cmd, sizeof cmd, "SUBTRAIN_FAULT=stop:final.safetensors '%s' %s --steps 20 "
             "--checkpoint '%s/late' >'%s/late.out' 2>'%s/late.err' </dev/null & pid=$!; "
             STOPPED_THEN("-TERM"), bin, opts, dir, dir, dir);
    int w = system(cmd);
    cr_assert(WIFEXITED(w) && WEXITSTATUS(w) == 143, "a late SIGTERM: exit %d", w);
    snprintf(path, sizeof path, "%s/late.out", dir);
    read_into(path, out, sizeof out);
    snprintf(path, sizeof path, "%s/late.err", dir);
    read_into(path, err, sizeof err);
    cr_assert(strstr(out, "interrupted by signal 15 after training\n"), "%s", out);
    cr_assert(strstr(err, "subtrain: training is done: finishing its evaluation"), "%s", err);
    snprintf(path, sizeof path, "%s/late/final.safetensors", dir);
    cr_assert_eq(access(path, F_OK), 0, "no final weights");
    snprintf(path, sizeof path, "%s/late", dir);
    cr_assert_eq(tmps_in(path), 0, "a temporary file left");

    snprintf(cmd, sizeof cmd, "SUBTRAIN_FAULT=stop:final.safetensors '%s' %s --epochs 40 "
             "--checkpoint '%s/again' --metrics '%s/again.jsonl' >'%s/again.out' "
             "2>'%s/again.err' </dev/null & pid=$!; i=0; while ! grep -q '\"epoch\":' "
             "'%s/again.jsonl' 2>/dev/null && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); "
             "done; kill -TERM $pid; " STOPPED_THEN("-INT"), bin, opts, dir, dir, dir, dir, dir);
    w = system(cmd);
    cr_assert(WIFEXITED(w) && WEXITSTATUS(w) == 130, "a second SIGINT: exit %d (it must still "
              "be training at its first record)", w);
    snprintf(path, sizeof path, "%s/again.err", dir);
    read_into(path, err, sizeof err);
    cr_assert(strstr(err, "subtrain: interrupted again: stopping now"), "%s", err);
    snprintf(path, sizeof path, "%s/again/final.safetensors", dir);
    cr_assert_neq(access(path, F_OK), 0, "final weights from a run stopped at once");
    snprintf(path, sizeof path, "%s/again", dir);
    cr_assert_eq(tmps_in(path), 0, "the temporary file was left");

    snprintf(cmd, sizeof cmd, "SUBTRAIN_FAULT=stop:final.safetensors '%s' %s --steps 20 "
             "--checkpoint '%s/killed' >/dev/null 2>&1 </dev/null & pid=$!; "
             STOPPED_THEN("-KILL"), bin, opts, dir);
    w = system(cmd);
    cr_assert(WIFEXITED(w) && WEXITSTATUS(w) == 137, "SIGKILL: exit %d", w);
    snprintf(path, sizeof path, "%s/killed", dir);
    cr_assert_eq(tmps_in(path), 1, "a killed writer left no temporary file to clear");
    snprintf(cmd, sizeof cmd, "'%s' %s --steps 20 --checkpoint '%s/killed' >/dev/null 2>&1 "
             "</dev/null", bin, opts, dir);
    w = system(cmd);
    cr_assert(WIFEXITED(w) && WEXITSTATUS(w) == 0, "the next run: exit %d", w);
    cr_assert_eq(tmps_in(path), 0, "the dead writer's temporary file is still there");
    st_test_rmdir(dir);
}

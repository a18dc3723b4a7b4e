/*
 * tests/test_cli_runs.c — runs as a user starts them, on every kind of data
 * and model: what they print and the metrics they write; a team of threads
 * against workers; --workers cores under SLURM.
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

/* 260 train and 52 test images of 8 x 8, labels 0..25 (EMNIST letters'
 * class count), under names of the test's own. */
static void write_letters(const char *dir)
{
    write_idx_set(dir, 260, 52, 26, 7);
}

Test(cli, idx_set_with_its_own_names_and_classes_trains_augmented, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], args[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    write_letters(dir);
    snprintf(args, sizeof args, "--data 'idx:%s:tr-img,tr-lab,te-img,te-lab' --model mlp "
             "--depth 1 --width 16 --batch 26 --epochs 2 --augment-crop 2 --augment-flip "
             "--progress plain", dir);
    run_result *r = calloc(1, sizeof *r);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "stderr: %s", r->err);
    cr_assert(strstr(r->out, "(260 train, 52 test, 1x8x8, 26 classes, crop 2, flip)"), "%s",
              r->out);
    cr_assert(strstr(r->out, "final: test_acc"), "%s", r->out);
    /* a crop the 8 x 8 images cannot take: a usage error naming the option */
    snprintf(args, sizeof args, "--data 'idx:%s:tr-img,tr-lab,te-img,te-lab' --augment-crop 8",
             dir);
    run(r, NULL, args);
    cr_assert_eq(r->status, 2, "stderr: %s", r->err);
    cr_assert(strstr(r->err, "--augment-crop") && strstr(r->err, "8x8"), "%s", r->err);
    cr_assert_eq(count_lines(r->err), 1, "%s", r->err);
    free(r);
    st_test_rmdir(dir);
}

/* --model convnet on 8 x 8 images: it trains with dp (its weights saved
 * and evaluated: with batch statistics re-estimated, so not the run's
 * running statistics' numbers), with sdp of channel units under either
 * masking and with ist; what it cannot do is said in one line. */
Test(cli, convnet_trains_with_dp_sdp_and_ist, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], data[2 * ST_TEST_PATH_MAX], args[4 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    write_letters(dir);
    snprintf(data, sizeof data, "--data 'idx:%s:tr-img,tr-lab,te-img,te-lab' --model convnet "
             "--width 8 --batch 26", dir);
    static const char *const runs[] = {
        "dp", "--strategy sdp --subnet neuron --neuron-group 4",
        "--strategy sdp --subnet neuron --masking backward --neuron-group 4",
        "--strategy ist --local-steps 3 --neuron-group 4",
    };
    run_result *r = calloc(1, sizeof *r);
    for (size_t k = 0; k < sizeof runs / sizeof *runs; k++) {
        if (k == 0)
            snprintf(args, sizeof args, "%s --steps 6 --workers 2 --oversubscribe --progress none "
                     "--checkpoint '%s/ck'", data, dir);
        else
            snprintf(args, sizeof args, "%s --steps 6 --workers 2 --oversubscribe --progress none "
                     "%s", data, runs[k]);
        run(r, NULL, args);
        cr_assert_eq(r->status, 0, "%s: %s", runs[k], r->err);
        cr_assert(strstr(r->out, ": convnet depth 3 width 8 relu |"), "%s", r->out);
        cr_assert(strstr(r->out, "final: test_acc "), "%s", r->out);
    }
    snprintf(args, sizeof args, "eval --init '%s/ck/final.safetensors' %s", dir, data);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert(strstr(r->out, "final.safetensors: test_acc ") &&
              strstr(r->out, "on 52 test samples"), "%s", r->out);
    /* found once the images are loaded, still usage errors (exit 2) */
    snprintf(args, sizeof args, "%s --steps 1 --depth 4", data);
    expect_usage_error(args, "--model convnet --depth 4: each stage halves the image, and "
                       "8x8 images take at most 3 stages");
    snprintf(args, sizeof args, "%s --steps 1 --strategy sdp --workers 2 --oversubscribe", data);
    expect_usage_error(args, "--model convnet has none (use --subnet neuron)");
    /* its units are channels, and said so */
    snprintf(args, sizeof args, "%s --steps 1 --strategy ist --workers 2 --oversubscribe", data);
    expect_usage_error(args, "--strategy ist: a width layer of 8 channels makes 1 group of "
                       "--neuron-group 16, and 2 workers need 2");
    expect_runtime_error(NULL, "--model convnet --data synthetic --steps 1",
                         "--model convnet takes images (C x H x W data), not 784 features");
    expect_usage_error("--model convnet --hidden 8",
                       "--hidden applies to --model resmlp, gpt, vit only");
    expect_usage_error("--model convnet --heads 2", "--heads applies to --model gpt, vit only");
    expect_usage_error("--model convnet --depth 12 --width 64",
                       "its last stage would have more than 65536 channels");
    free(r);
    st_test_rmdir(dir);
}

/* --model vit on images: dp, sdp over blocks and over heads (forward and
 * backward masking), ist and bf16 train, with a class token or the mean;
 * its own options are refused where they do not apply, and patches that
 * do not tile the images once those are loaded. */
Test(cli, vit_trains_with_dp_sdp_ist_and_bf16, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], data[2 * ST_TEST_PATH_MAX], args[4 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    write_letters(dir);
    snprintf(data, sizeof data, "--data 'idx:%s:tr-img,tr-lab,te-img,te-lab' --model vit "
             "--depth 2 --width 16 --heads 2 --batch 26", dir);
    const int bf16 = st_bf16_probe(NULL) == ST_BF16_NATIVE;
    static const char *const runs[] = {
        "--patch 4", "--patch 2 --pool cls --strategy sdp --subnet block",
        "--patch 4 --strategy sdp --subnet neuron --masking forward",
        "--patch 4 --pool cls --strategy sdp --subnet neuron --masking backward",
        "--patch 4 --strategy ist --local-steps 3", "--patch 4 --pool cls --precision bf16",
    };
    run_result *r = calloc(1, sizeof *r);
    for (size_t k = 0; k < sizeof runs / sizeof *runs; k++) {
        if (strstr(runs[k], "bf16") && !bf16)
            continue;
        snprintf(args, sizeof args, "%s --steps 6 --workers 2 --oversubscribe --progress none "
                 "%s", data, runs[k]);
        run(r, NULL, args);
        cr_assert_eq(r->status, 0, "%s: %s", runs[k], r->err);
        cr_assert(strstr(r->out, ": vit depth 2 width 16 heads 2 patch "), "%s", r->out);
        cr_assert(strstr(r->out, "final: test_acc "), "%s", r->out);
    }
    /* found once the images are loaded, still a usage error (exit 2) */
    snprintf(args, sizeof args, "%s --steps 1 --patch 3", data);
    expect_usage_error(args, "--patch 3 does not divide the 8 x 8 images (a patch side "
                       "must divide both)");
    expect_runtime_error(NULL, "--model vit --data synthetic --steps 1",
                         "--model vit takes images (C x H x W data), not 784 features");
    expect_usage_error("--model resmlp --patch 4", "--patch applies to --model vit only");
    expect_usage_error("--model convnet --pool cls", "--pool applies to --model vit only");
    expect_usage_error("--model vit --pool max", "--pool: unknown value 'max' (allowed: mean, "
                       "cls)");
    expect_usage_error("--model vit --patch 0", "--patch");
    expect_usage_error("--model vit --heads 3 --width 16", "--heads 3 does not divide --width 16");
    free(r);
    st_test_rmdir(dir);
}

/* --model gpt on a text file: a short run reports bits per byte and
 * tokens/s (and the metrics record its "text" object); its options are
 * refused where they do not apply. */
Test(cli, gpt_on_a_text_file_reports_bits_per_byte, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], path[ST_TEST_PATH_MAX], metrics[ST_TEST_PATH_MAX];
    char args[4 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(path, dir, "words.txt");
    st_test_path(metrics, dir, "m.jsonl");
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    for (int i = 0; i < 3000; i++)
        fputs(i % 3 ? "the word of a dictionary; " : "noun.\n", f);
    fclose(f);
    snprintf(args, sizeof args, "--model gpt --data 'text:%s' --depth 1 --width 16 --heads 2 "
             "--context 16 --batch 4 --steps 20 --val-bytes 512 --progress plain "
             "--metrics '%s'", path, metrics);
    run_result *r = calloc(1, sizeof *r);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "stderr: %s", r->err);
    cr_assert(strstr(r->out, "gpt depth 1 width 16 heads 2 context 16 hidden 64"), "%s", r->out);
    cr_assert(strstr(r->out, "unigram baseline"), "%s", r->out);
    cr_assert(strstr(r->out, "bits per byte") && strstr(r->out, "tokens/s"), "%s", r->out);
    char rec[8192];
    read_into(metrics, rec, sizeof rec);
    cr_assert(strstr(rec, "\"text\":{\"train_bpb\":") && strstr(rec, "\"context\":16"), "%s",
              rec);
    cr_assert(strstr(rec, "\"attention\":"), "the attention memory line: %s", rec);
    snprintf(args, sizeof args, "--model gpt --data 'text:%s' --width 16 --heads 2 --strategy sdp "
             "--subnet neuron --neuron-group 4", path);
    expect_usage_error(args, "multiple of the head size 8");
    snprintf(args, sizeof args, "--model gpt --data 'text:%s' --width 16 --heads 3", path);
    expect_usage_error(args, "--heads 3 does not divide --width 16");
    snprintf(args, sizeof args, "--model gpt --data 'text:%s' --strategy synth", path);
    expect_usage_error(args, "synth");
    snprintf(args, sizeof args, "--model gpt --data 'text:%s/missing.txt' --context 8", dir);
    run(r, NULL, args);
    cr_assert_eq(r->status, 1, "stderr: %s", r->err);
    cr_assert(strstr(r->err, "missing.txt") && count_lines(r->err) == 1, "%s", r->err);
    free(r);
    st_test_rmdir(dir);
    expect_usage_error("--model gpt --data synthetic", "needs --data text:FILE");
    expect_usage_error("--data text:/x --model resmlp", "is for --model gpt");
    expect_usage_error("--data text:", "the file is missing");
    expect_usage_error("--context 8", "--context applies to --model gpt only");
    expect_usage_error("--holdout 0.2", "--holdout applies to --data text:FILE only");
    expect_usage_error("--model gpt --data text:/x --holdout 1", "--holdout");
    expect_usage_error("--model gpt --data text:/x --epoch-windows 0", "--epoch-windows");
}

/* The final test_loss of a run's metrics (its last record). */
static double final_test_loss(const char *opts)
{
    char dir[ST_TEST_PATH_MAX], cmd[4 * ST_TEST_PATH_MAX], rec[1 << 16], path[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    snprintf(cmd, sizeof cmd, "'%s' %s --progress none --metrics '%s' >/dev/null 2>'%s/err'",
             getenv("SUBTRAIN_BIN"), opts, path, dir);
    int w = system(cmd);
    cr_assert(WIFEXITED(w) && WEXITSTATUS(w) == 0, "%s failed", opts);
    read_into(path, rec, sizeof rec);
    const char *last = strstr(rec, "\"final\":true");
    cr_assert_not_null(last, "%s", rec);
    const double v = st_json_number_at(rec, last, "test_loss");
    cr_assert(!isnan(v), "a test_loss in the final record: %s", last);
    cr_assert(!isnan(st_json_number_at(rec, last, "threads_per_worker")),
              "the layout is in the record");
    st_test_rmdir(dir);
    return v;
}

/* A worker of a team of 2 threads trains what 2 workers of one thread
 * train on the same global batch, and what one thread alone trains: the
 * sums are only reassociated (oneDNN's threads, the two workers' mean). */
Test(cli, team_workers_match_single_thread_workers, .timeout = 120)
{
    const char *base = "--data synthetic --model resmlp --depth 2 --width 256 --steps 80";
    char opts[512];
    snprintf(opts, sizeof opts, "%s --batch 64 --workers 1 --threads-per-worker 2", base);
    const double team = final_test_loss(opts);
    snprintf(opts, sizeof opts, "%s --batch 32 --workers 2", base);
    const double two = final_test_loss(opts);
    snprintf(opts, sizeof opts, "%s --batch 64 --workers 1", base);
    const double one = final_test_loss(opts);
    cr_assert(fabs(team - two) <= 1e-3 * fabs(two), "1 x 2 threads %.6f, 2 x 1 %.6f", team, two);
    cr_assert(fabs(team - one) <= 1e-3 * fabs(one), "1 x 2 threads %.6f, 1 x 1 %.6f", team, one);
    expect_usage_error("--data synthetic --threads-per-worker 0", "--threads-per-worker");
}

/* A team is the size asked or the run fails: OMP_DYNAMIC=true gives the
 * run bitwise its records (the runtime may not shrink the team), and
 * OMP_THREAD_LIMIT=1, which must, is one line naming it. */
Test(cli, a_team_is_the_size_asked_or_refused, .timeout = 120)
{
    const char *opts = "--data synthetic --model mlp --depth 1 --width 64 --batch 8 --steps 3 "
                       "--workers 1 --threads-per-worker 2 --oversubscribe";
    const double base = final_test_loss(opts);
    char env_opts[512];
    snprintf(env_opts, sizeof env_opts, "%s", opts);
    setenv("OMP_DYNAMIC", "true", 1);
    const double dynamic = final_test_loss(env_opts);
    unsetenv("OMP_DYNAMIC");
    cr_assert(dynamic == base, "OMP_DYNAMIC=true: test_loss %.9g, not %.9g", dynamic, base);
    expect_runtime_error("OMP_THREAD_LIMIT=1", opts, "a team of 1 threads, not 2 (is "
                         "OMP_THREAD_LIMIT set?)");
}

/* --workers cores under SLURM: one worker per core of the cpuset, at most
 * SLURM_CPUS_PER_TASK of them (per team of --threads-per-worker), so a
 * task the site did not bind does not spread over the node, and a count
 * above the cpuset's cores (hardware threads counted as CPUs) does not
 * put two workers on a core; a bad value is a usage error naming it. */
static int workers_in_record(const char *path)
{
    FILE *f = fopen(path, "r");
    char line[8192];
    int w = -1;
    while (f && fgets(line, sizeof line, f)) {
        const double n = st_json_number_at(line, line, "workers_per_rank");
        if (!isnan(n))
            w = (int)n;
    }
    if (f)
        fclose(f);
    return w;
}

Test(cli, slurm_cpus_per_task_caps_workers_cores, .timeout = 240)
{
    run_result *r = calloc(1, sizeof *r);
    char dir[ST_TEST_PATH_MAX], args[4 * ST_TEST_PATH_MAX], path[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(path, dir, "m.jsonl");
    snprintf(args, sizeof args, "--data synthetic --workers cores --steps 1 --progress none "
             "--metrics %s", path);
    run(r, "env -u SLURM_CPUS_PER_TASK", args);
    cr_assert_eq(r->status, 0, "stderr: %s", r->err);
    const int cores = workers_in_record(path);
    cr_assert_geq(cores, 1);
    run(r, "SLURM_CPUS_PER_TASK=1", args);
    cr_assert_eq(r->status, 0, "stderr: %s", r->err);
    cr_assert(strstr(r->out, "one worker per core (cores at most SLURM_CPUS_PER_TASK=1)"), "%s",
              r->out);
    cr_assert_eq(workers_in_record(path), 1, "SLURM_CPUS_PER_TASK=1 caps the workers at 1");
    run(r, "SLURM_CPUS_PER_TASK=4096", args);
    cr_assert_eq(r->status, 0, "more CPUs than cores is capped by the cores: %s", r->err);
    cr_assert_eq(workers_in_record(path), cores, "one worker per core of the cpuset (%d)", cores);
    if (cores >= 2) {
        snprintf(args, sizeof args, "--data synthetic --workers cores --threads-per-worker 2 "
                 "--steps 1 --progress none --metrics %s", path);
        run(r, "SLURM_CPUS_PER_TASK=2", args);
        cr_assert_eq(r->status, 0, "stderr: %s", r->err);
        cr_assert_eq(workers_in_record(path), 1, "2 CPUs make one team of 2 threads");
    }
    unlink(path);
    st_test_rmdir(dir);
    run(r, "SLURM_CPUS_PER_TASK=2", "--data synthetic --workers 1 --steps 3 --progress none");
    cr_assert(strstr(r->out, ", 1 worker\n"), "an explicit --workers wins: %s", r->out);
    run(r, "SLURM_CPUS_PER_TASK=lots", "--data synthetic --workers cores");
    cr_assert_eq(r->status, 2);
    cr_assert(strstr(r->err, "SLURM_CPUS_PER_TASK='lots'") && count_lines(r->err) == 1, "%s",
              r->err);
    free(r);
}

/* n CIFAR-10 records into dir/name. */
static void write_cifar10_file(const char *dir, const char *name, int n)
{
    char path[ST_TEST_PATH_MAX];
    unsigned char *buf = malloc((size_t)n * 3073);
    cr_assert_not_null(buf);
    for (int r = 0; r < n; r++) {
        buf[r * 3073] = (unsigned char)(r % 10);
        for (int i = 0; i < 3072; i++)
            buf[r * 3073 + 1 + i] = (unsigned char)(r * 13 + i * 5 + (i >> 10) * 60);
    }
    cr_assert_eq(st_test_write_file(st_test_path(path, dir, name), buf, (size_t)n * 3073), 0);
    free(buf);
}

Test(cli, cifar10_directory_trains, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], args[2 * ST_TEST_PATH_MAX], name[32];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    for (int f = 1; f <= 5; f++) {
        snprintf(name, sizeof name, "data_batch_%d.bin", f);
        write_cifar10_file(dir, name, 8);
    }
    write_cifar10_file(dir, "test_batch.bin", 10);
    snprintf(args, sizeof args, "--data 'cifar10:%s' --model mlp --depth 1 --width 16 "
             "--batch 10 --epochs 1 --augment-crop 4 --augment-flip --progress plain", dir);
    run_result *r = calloc(1, sizeof *r);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "stderr: %s", r->err);
    cr_assert(strstr(r->out, "(40 train, 10 test, 3x32x32, 10 classes, crop 4, flip)"), "%s",
              r->out);
    /* a record cut short: one line naming the file */
    char path[ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_write_file(st_test_path(path, dir, "data_batch_3.bin"), "xx", 2), 0);
    snprintf(args, sizeof args, "--data 'cifar10:%s'", dir);
    free(r);
    expect_runtime_error(NULL, args, "data_batch_3.bin: 2 bytes is not a whole number");
    st_test_rmdir(dir);
}

Test(cli, short_run_prints_epochs_and_writes_metrics, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], metrics[ST_TEST_PATH_MAX], args[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(metrics, dir, "m.jsonl");
    /* 16384 synthetic samples / batch 64 = 256 steps an epoch; 300 steps
     * make one full epoch and a partial second one. */
    snprintf(args, sizeof args, "--data synthetic --model mlp --depth 1 --width 32 --batch 64 "
             "--steps 300 --progress plain --metrics '%s'", metrics);
    run_result *r = calloc(1, sizeof *r);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "stderr: %s", r->err);
    cr_assert_str_empty(r->err);
    cr_assert(strstr(r->out, "epoch 1/2"), "%s", r->out);
    cr_assert(strstr(r->out, "epoch 2/2"), "%s", r->out);
    cr_assert(strstr(r->out, "final: test_acc"), "%s", r->out);
    cr_assert(strstr(r->out, "peak memory per worker"), "%s", r->out);

    char m[8192];
    read_into(metrics, m, sizeof m);
    cr_assert_eq(count_lines(m), 3, "two epoch records and a final one:\n%s", m);
    expect_json_lines(m);
    cr_assert(strstr(m, "\"step\":256,"), "%s", m);
    cr_assert(strstr(m, "\"final\":true"), "%s", m);
    const char *keys[] = { "\"epoch\":", "\"train_loss\":", "\"test_loss\":", "\"test_acc\":",
                           "\"samples_per_s\":", "\"wall_s\":", "\"peak_bytes\":" };
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        cr_assert(strstr(m, keys[i]), "metrics lack %s", keys[i]);

    run(r, NULL, "--data synthetic --model mlp --depth 1 --width 32 --steps 20 --quiet");
    cr_assert_eq(r->status, 0, "stderr: %s", r->err);
    cr_assert_str_empty(r->out, "--quiet prints nothing");
    cr_assert_str_empty(r->err);
    free(r);
    st_test_rmdir(dir);
}

/* --sample: after a tiny gpt run on generated text, the sample line and
 * the prompt's continuation; with --quiet the text alone, the same for
 * the same seed; sampling options without their context are usage
 * errors. */
Test(cli, gpt_run_prints_a_sample, .timeout = 60)
{
    char dir[ST_TEST_PATH_MAX], text[ST_TEST_PATH_MAX], args[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    write_cat_corpus(text, dir);
    const char *tiny = "--depth 1 --width 16 --heads 2 --context 16 --batch 4 --steps 5 "
                       "--val-bytes 256 --progress none";
    run_result *r = calloc(1, sizeof *r);
    snprintf(args, sizeof args, "--model gpt --data 'text:%s' %s --sample 20 --prompt ab", text,
             tiny);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "stderr: %s", r->err);
    cr_assert_str_empty(r->err);
    const char *line = strstr(r->out, "sample (temperature 0.8, top-k 40, seed 1):\n");
    cr_assert(line, "%s", r->out);
    const char *sample = strchr(line, '\n') + 1;
    cr_assert(strncmp(sample, "ab", 2) == 0, "%s", r->out);
    cr_assert_geq(strlen(sample), 2 + 20 + 1, "%s", sample);   /* may hold newlines */

    snprintf(args, sizeof args, "--model gpt --data 'text:%s' %s --sample 20 --prompt ab "
             "--temperature 0 -q", text, tiny);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "stderr: %s", r->err);
    char *first = strdup(r->out);
    cr_assert_not_null(first);
    cr_assert(strncmp(first, "ab", 2) == 0 && !strstr(first, "sample ("), "%s", first);
    run(r, NULL, args);
    cr_assert_str_eq(r->out, first, "greedy text differs between two runs");
    free(first);
    free(r);

    snprintf(args, sizeof args, "--model gpt --data 'text:%s' --prompt ab", text);
    expect_usage_error(args, "--prompt applies to --sample N only");
    snprintf(args, sizeof args, "--model gpt --data 'text:%s' --sample 5 --top-k 300", text);
    expect_usage_error(args, "--top-k: expected an integer in [0, 256]");
    snprintf(args, sizeof args, "--model gpt --data 'text:%s' --sample 5 --temperature -1",
             text);
    expect_usage_error(args, "--temperature");
    expect_usage_error("--data synthetic --sample 5", "--sample applies to --model gpt only");
    expect_usage_error("--sample x", "--sample: expected");
    st_test_rmdir(dir);
}

Test(cli, progress_bar_goes_to_stderr_and_ends_cleanly, .timeout = 60)
{
    run_result *r = calloc(1, sizeof *r);
    run(r, NULL, "train --data synthetic --model mlp --depth 1 --width 32 --steps 50 --progress bar");
    cr_assert_eq(r->status, 0, "stderr: %s", r->err);
    cr_assert(strstr(r->err, "step 50/50"), "%s", r->err);
    cr_assert(strstr(r->err, "samples/s") && strstr(r->err, "ETA"), "%s", r->err);
    free(r);
}

/* The default synth model is the 6-layer mlp; the epoch lines name the
 * phase, the summary the segments, the metrics carry a "synth" object. */
Test(cli, synth_run_prints_segments_and_writes_metrics, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], metrics[ST_TEST_PATH_MAX], args[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(metrics, dir, "m.jsonl");
    snprintf(args, sizeof args, "--data synthetic --strategy synth --width 32 --workers 2 "
             "--oversubscribe --epochs 1 --recovery-epochs 1 --progress plain --metrics '%s'",
             metrics);
    run_result *r = calloc(1, sizeof *r);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "stderr: %s", r->err);
    cr_assert(strstr(r->out, "mlp depth 5 width 32"), "%s", r->out);
    cr_assert(strstr(r->out, "synth (2 segments"), "%s", r->out);
    cr_assert(strstr(r->out, "epoch 1/2") && strstr(r->out, "(joined) segment_loss"), "%s", r->out);
    cr_assert(strstr(r->out, "epoch 2/2") && strstr(r->out, "(recovery)"), "%s", r->out);
    cr_assert(strstr(r->out, "segments: layers 1-"), "%s", r->out);
    char m[8192];
    read_into(metrics, m, sizeof m);
    cr_assert_eq(count_lines(m), 3, "two epoch records and a final one:\n%s", m);
    expect_json_lines(m);
    cr_assert(strstr(m, "\"synth\":{\"phase\":\"segments\",\"segment_workers\":[1,1],\"cuts\":["),
              "%s", m);
    cr_assert(strstr(m, "\"segment_loss\":["), "%s", m);
    cr_assert(strstr(m, "\"synth\":{\"phase\":\"recovery\""), "%s", m);
    int depth = 0;
    for (const char *p = m; *p; p++) {
        depth += (*p == '{') - (*p == '}');
        cr_assert_geq(depth, 0, "unbalanced braces in %s", m);
        if (*p == '\n')
            cr_assert_eq(depth, 0, "unbalanced braces in %s", m);
    }
    free(r);
    st_test_rmdir(dir);
}

/* --accumulate and --optimizer-moments: the banner and the summary say
 * them, a step is an update (an epoch of 16384 synthetic samples at 4
 * micro-batches of 64 is 64 steps), the record carries the optimizer's
 * state and bytes; bad values and the combinations that cannot work are
 * usage errors in one line. */
Test(cli, accumulate_and_optimizer_moments, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], metrics[ST_TEST_PATH_MAX], args[4 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(metrics, dir, "m.jsonl");
    snprintf(args, sizeof args, "--data synthetic --model resmlp --depth 2 --width 32 --epochs 1 "
             "--batch 64 --accumulate 4 --optimizer-moments bf16-sr --progress none "
             "--metrics '%s'", metrics);
    run_result *r = calloc(1, sizeof *r);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "stderr: %s", r->err);
    cr_assert(strstr(r->out, "cosine, bf16-sr moments | batch 64, 4 micro-batches a step, "),
              "%s", r->out);
    cr_assert(strstr(r->out, "optimizer per worker and step: ") &&
              strstr(r->out, "(20.0 bytes a parameter, bf16-sr moments)"), "%s", r->out);
    char rec[16384];
    read_into(metrics, rec, sizeof rec);
    const char *last = strstr(rec, "\"final\":true");
    cr_assert_not_null(last, "%s", rec);
    cr_assert(strstr(rec, "\"epoch\":1,\"step\":64,\"final\":true"), "%s", rec);
    cr_assert(strstr(last, "\"optimizer\":{\"moments\":\"bf16-sr\",\"bytes_per_param\":20.00,"),
              "%s", last);
    free(r);
    st_test_rmdir(dir);
    expect_usage_error("--data synthetic --accumulate 0",
                       "--accumulate: expected an integer in [1, 65536], got '0'");
    expect_usage_error("--data synthetic --optimizer-moments fp16",
                       "--optimizer-moments: unknown value 'fp16' (allowed: fp32, bf16, bf16-sr)");
    expect_usage_error("--data synthetic --strategy synth --accumulate 2",
                       "--accumulate 2: --strategy synth trains its segments one batch a step");
    expect_usage_error("--data synthetic --strategy sdp --workers 2 --report align "
                       "--accumulate 2", "--report align compares gradients of one batch");
    expect_usage_error("--data synthetic --strategy ist --workers 2 --optimizer-state keep "
                       "--optimizer-moments bf16", "--optimizer-state keep averages the "
                       "optimizer state over the workers in fp32");
    expect_usage_error("--data synthetic --strategy localsgd --workers 2 --optimizer-state keep "
                       "--optimizer-moments bf16-sr", "--optimizer-moments bf16-sr keeps it in "
                       "bf16");
}

/* The final line's accuracy and losses (up to the throughput). */
static void final_losses(const char *out, char *buf, size_t n)
{
    const char *f = strstr(out, "final: ");
    cr_assert_not_null(f, "%s", out);
    const char *end = strstr(f, "train_loss ");
    cr_assert_not_null(end, "%s", f);
    end = strchr(end + strlen("train_loss "), ' ');
    cr_assert_not_null(end, "%s", f);
    snprintf(buf, n, "%.*s", (int)(end - f), f);
}

/* --master-weights bf16-sr: one worker, dp and sdp with backward masking
 * (shared and private weights; sdp with masks redrawn too: the private
 * replicas' copies saved and reloaded, the domain's kept), localsgd
 * (replicas averaged every 5 steps) say the layout
 * and its bytes, 16 a parameter with bf16 moments (private weights: the
 * engine gathers the copies as bf16); a seed repeats a run bitwise and the
 * two placements agree; the combinations that cannot work are usage
 * errors in one line. */
Test(cli, master_weights_bf16_sr, .timeout = 180)
{
    static const char *const layouts[] = {
        "--workers 1", "--workers 2", "--workers 2 --weights private",
        "--workers 2 --strategy sdp --masking backward",
        "--workers 2 --strategy sdp --masking backward --weights private",
        "--workers 2 --strategy sdp --masking backward --resample 5",
        "--workers 2 --strategy sdp --masking backward --resample 5 --weights private",
        "--workers 2 --strategy localsgd --local-steps 5" };
    static const char *const bytes[] = { "(16.0 bytes a parameter, bf16-sr moments, bf16-sr "
                                         "master)", "(16.1 bytes a parameter",
                                         "(16.1 bytes a parameter", "(16.1 bytes a parameter",
                                         "(16.1 bytes a parameter", "(16.1 bytes a parameter",
                                         "(16.1 bytes a parameter", "(16.0 bytes a parameter" };
    char args[1024], first[256], again[256], two[256] = "";
    run_result *r = calloc(1, sizeof *r);
    for (int k = 0; k < 8; k++) {
        snprintf(args, sizeof args, "--data synthetic --model resmlp --depth 2 --width 32 "
                 "--steps 20 --batch 32 --precision bf16 --bf16-emulated --optimizer-moments "
                 "bf16-sr --master-weights bf16-sr --progress none --metrics /dev/stdout %s",
                 layouts[k]);
        run(r, NULL, args);
        cr_assert_eq(r->status, 0, "%s: %s", layouts[k], r->err);
        cr_assert(strstr(r->out, ", bf16-sr moments, bf16-sr master | batch 32"), "%s", r->out);
        cr_assert(strstr(r->out, bytes[k]), "%s: %s", layouts[k], r->out);
        cr_assert(strstr(r->out, "\"master\":\"bf16-sr\"}"), "%s", r->out);
        final_losses(r->out, first, sizeof first);
        run(r, NULL, args);
        final_losses(r->out, again, sizeof again);
        cr_assert_str_eq(first, again, "%s: the same seed, another run", layouts[k]);
        if (k == 1 || k == 3 || k == 5)
            snprintf(two, sizeof two, "%s", first);
        if (k == 2 || k == 4 || k == 6)
            cr_assert_str_eq(first, two, "%s (the copies gathered as bf16) against shared "
                             "weights (the copies alone)", layouts[k]);
    }
    snprintf(args, sizeof args, "--data synthetic --model resmlp --depth 2 --width 32 "
             "--steps 20 --batch 32 --precision bf16 --bf16-emulated --optimizer-moments "
             "bf16-sr --progress none --workers 1");
    run(r, NULL, args);
    final_losses(r->out, again, sizeof again);
    cr_assert_str_neq(first, again, "the fp32 master trains otherwise");
    free(r);
    expect_usage_error("--data synthetic --master-weights bf16",
                       "--master-weights: unknown value 'bf16' (allowed: fp32, bf16-sr)");
    expect_usage_error("--data synthetic --master-weights bf16-sr",
                       "--master-weights bf16-sr keeps the master weights in the bf16 copies of "
                       "--precision bf16; this run has --precision fp32");
    expect_usage_error("--data synthetic --precision bf16 --bf16-emulated --master-weights "
                       "bf16-sr --strategy ist --workers 2", "--master-weights bf16-sr "
                       "applies to --strategy dp, localsgd and sdp, not to --strategy ist");
    expect_usage_error("--data synthetic --precision bf16 --bf16-emulated --master-weights "
                       "bf16-sr --strategy synth --workers 2", "--master-weights bf16-sr "
                       "applies to --strategy dp, localsgd and sdp, not to --strategy synth");
    expect_usage_error("--data synthetic --precision bf16 --bf16-emulated --master-weights "
                       "bf16-sr --optimizer sgd", "a bf16 master (--master-weights bf16-sr) is "
                       "updated by AdamW only, not by --optimizer sgd");
    expect_usage_error("--data synthetic --precision bf16 --bf16-emulated --master-weights "
                       "bf16-sr --unfuse weight-copy", "--unfuse weight-copy does not make");
}

/* The test_loss of the final record a run printed (--metrics /dev/stdout). */
static double printed_test_loss(const char *out)
{
    const char *last = strstr(out, "\"final\":true");
    cr_assert_not_null(last, "%s", out);
    const double v = st_json_number_at(out, last, "test_loss");
    cr_assert(!isnan(v), "a test_loss in the final record: %s", last);
    return v;
}

/* --master-weights bf16-sr with forward-masked subnetworks (sdp's
 * default masking: compact models, whose masters are the engine's bf16
 * master shards): the layout and its bytes, 16 a parameter with bf16-sr
 * moments (16.1 with the biases' 20, the busiest worker's); a seed repeats the run bitwise
 * (blocks and neurons, masks fixed and redrawn, with elements nobody
 * holds); the test loss is the fp32 master's within 0.05 (resmlp after
 * 60 steps: about 2.1); over two NUMA domains it is refused in one line. */
Test(cli, a_bf16_master_of_forward_masked_subnetworks, .timeout = 180)
{
    static const char *const layouts[] = {
        "--model resmlp --depth 2 --width 32 --strategy sdp --workers 2",
        "--model resmlp --depth 2 --width 32 --strategy sdp --workers 2 --resample 5",
        "--model mlp --depth 2 --width 32 --strategy sdp --subnet neuron --neuron-group 8 "
        "--workers 3 --coverage 0.34 --resample 7" };
    char args[1024], first[256], again[256];
    run_result *r = calloc(1, sizeof *r);
    for (int k = 0; k < 3; k++) {
        double loss[2];
        for (int sr = 1; sr >= 0; sr--) {
            snprintf(args, sizeof args, "--data synthetic --steps 60 --batch 32 --precision "
                     "bf16 --bf16-emulated --optimizer-moments bf16-sr --master-weights %s "
                     "--oversubscribe --progress none --metrics /dev/stdout %s",
                     sr ? "bf16-sr" : "fp32", layouts[k]);
            run(r, NULL, args);
            cr_assert_eq(r->status, 0, "%s: %s", layouts[k], r->err);
            loss[sr] = printed_test_loss(r->out);
            if (!sr)
                continue;
            cr_assert(strstr(r->out, ", bf16-sr moments, bf16-sr master | batch 32"), "%s",
                      r->out);
            cr_assert(strstr(r->out, "(16.0 bytes a parameter") ||
                          strstr(r->out, "(16.1 bytes a parameter"), "%s: %s", layouts[k], r->out);
            cr_assert(strstr(r->out, "\"master\":\"bf16-sr\"}"), "%s", r->out);
            final_losses(r->out, first, sizeof first);
            run(r, NULL, args);
            final_losses(r->out, again, sizeof again);
            cr_assert_str_eq(first, again, "%s: the same seed, another run", layouts[k]);
        }
        cr_assert(fabs(loss[1] - loss[0]) < 0.05, "%s: test loss %.4f with the bf16-sr master, "
                  "%.4f with fp32", layouts[k], loss[1], loss[0]);
    }
    free(r);
    expect_runtime_error(two_domains_env(), "--data synthetic --precision bf16 --bf16-emulated "
                         "--master-weights bf16-sr --strategy sdp --workers 2 --steps 2",
                         "--master-weights bf16-sr with --strategy sdp --masking forward runs "
                         "in one process on one NUMA domain; this run has 1 rank and 2 "
                         "domains");
}

/* A bf16 master with shared weights over two NUMA domains, a worker
 * each (dp; sdp with backward masking, masks redrawn): the copies of each
 * domain hold it, and an update moves 16 bytes a parameter with bf16
 * moments (16.1 with the biases' 20), as on one domain; a seed repeats
 * the run bitwise; the fp32 master counts 22 (its update writes the
 * copies too). */
Test(cli, a_bf16_master_over_two_domains_moves_16_bytes_a_parameter, .timeout = 120)
{
    static const char *const layouts[] = {
        "--workers 2", "--workers 2 --strategy sdp --masking backward --resample 5" };
    char args[1024], first[256], again[256];
    run_result *r = calloc(1, sizeof *r);
    for (int k = 0; k < 2; k++) {
        for (int sr = 0; sr < 2; sr++) {
            snprintf(args, sizeof args, "--data synthetic --model resmlp --depth 2 --width 32 "
                     "--steps 20 --batch 32 --precision bf16 --bf16-emulated "
                     "--optimizer-moments bf16-sr --master-weights %s --progress none "
                     "--metrics /dev/stdout %s", sr ? "bf16-sr" : "fp32", layouts[k]);
            run(r, two_domains_env(), args);
            cr_assert_eq(r->status, 0, "%s: %s", layouts[k], r->err);
            cr_assert(strstr(r->out, "\"numa\":2},\"placement\""), "%s: not over two "
                      "domains: %s", layouts[k], r->out);
            cr_assert(strstr(r->out, sr ? "(16.1 bytes a parameter" : "(22.0 bytes a parameter"),
                      "%s, %s master: %s", layouts[k], sr ? "bf16-sr" : "fp32", r->out);
        }
        cr_assert(strstr(r->out, "\"master\":\"bf16-sr\"}"), "%s", r->out);
        final_losses(r->out, first, sizeof first);
        run(r, two_domains_env(), args);
        final_losses(r->out, again, sizeof again);
        cr_assert_str_eq(first, again, "%s: the same seed, another run", layouts[k]);
    }
    free(r);
}

/* The peak weights bytes a worker of `args` (with --metrics /dev/stdout;
 * `env` before the program, NULL: none) reports in its final record. */
static double weights_bytes(run_result *r, const char *env, const char *args)
{
    run(r, env, args);
    cr_assert_eq(r->status, 0, "%s: %s", args, r->err);
    const char *last = strstr(r->out, "\"final\":true");
    cr_assert_not_null(last, "%s", r->out);
    const double v = st_json_number_at(r->out, last, "weights");
    cr_assert(!isnan(v), "weights bytes in the final record: %s", last);
    return v;
}

/* A bf16 master in the copies (one worker, shared weights in one domain
 * and over two, private replicas in one process; dp, sdp with backward
 * masking, whose parameters' engine holds the masters, and localsgd's
 * replicas) leaves the fp32 vector without memory
 * under the matrices: the weights fall by 4 bytes a matrix parameter
 * against the fp32 master, less the pages that a matrix shares with a
 * bias (two at most each).  Private replicas' master shards too: 4 bytes
 * a matrix parameter of the shard.  The mlp: 784 -> 64 -> 64 -> 10 on the
 * synthetic data, three matrices. */
/* Layouts from..to-1 of the table below: the weights' bytes with the fp32
 * master and with bf16-sr (split in two tests to fit the sanitizer build's
 * time limit). */
static void master_layouts_hold_no_fp32_matrices(int from, int to)
{
    const double matrices = 784 * 64 + 64 * 64 + 64 * 10, page = 4096;
    /* two shards (st_comm_shards: 16-float blocks): the first, [0, half),
     * inside the first matrix; the second holds the other matrix elements */
    const double params = matrices + 64 + 64 + 10, half = ceil(ceil(params / 16) / 2) * 16;
    /* sdp's new rounds with the fp32 master save each worker's whole
     * shard, counted by both sharers here: twice half; a bf16 master
     * saves none */
    const double shard_lo[] = { 0, 0, matrices - half, 0, matrices - half, matrices - half,
                                2 * half, 0, 0, matrices - half },
                 shard_hi[] = { 0, 0, half, 0, half, half, 2 * half, 0, 0, half };
    static const char *const layouts[] = {
        "--workers 1", "--workers 2 --oversubscribe",
        "--workers 2 --oversubscribe --weights private",
        "--workers 2 --oversubscribe --strategy sdp --masking backward --subnet neuron",
        "--workers 2 --oversubscribe --strategy sdp --masking backward --subnet neuron "
        "--weights private",
        "--workers 2 --oversubscribe --strategy localsgd --local-steps 1",
        "--workers 2 --oversubscribe --strategy sdp --masking backward --subnet neuron "
        "--resample 1",
        /* two domains of one worker, a vector each: the owner's domain's
         * copies hold its shard's master, the other's a copy of them */
        "--workers 2", "--workers 2 --strategy sdp --masking backward --subnet neuron",
        /* fp32: each worker saves its shard at a new round (the busiest
         * counted), a bf16 master none */
        "--workers 2 --strategy sdp --masking backward --subnet neuron --resample 1" };
    static const int sharing[] = { 1, 2, 1, 2, 1, 1, 2, 1, 1, 1 };   /* workers a vector */
    char args[512];
    run_result *r = calloc(1, sizeof *r);
    for (int k = from; k < to; k++) {
        double w[2];
        const char *env = k >= 7 ? two_domains_env() : NULL;
        for (int sr = 0; sr < 2; sr++) {
            snprintf(args, sizeof args, "--data synthetic --model mlp --depth 2 --width 64 "
                     "--steps 2 --batch 16 --precision bf16 --bf16-emulated --master-weights %s "
                     "--progress none --metrics /dev/stdout %s", sr ? "bf16-sr" : "fp32",
                     layouts[k]);
            w[sr] = weights_bytes(r, env, args);
            if (env)
                cr_assert(strstr(r->out, "\"numa\":2},\"placement\""), "%s: not over two "
                          "domains: %s", layouts[k], r->out);
        }
        /* a domain's vector: each of its workers counts its share */
        const double fell = (w[0] - w[1]) * sharing[k];
        cr_assert(fell <= 4 * (matrices + shard_hi[k]) + sharing[k] &&
                      fell >= 4 * (matrices + shard_lo[k]) - 7 * page,
                  "%s: weights %.0f bytes with the fp32 master, %.0f with bf16-sr: %.0f fewer "
                  "a domain, want 4 x (%.0f + %.0f to %.0f of the master shard) less at most 7 "
                  "pages", layouts[k], w[0], w[1], fell, matrices, shard_lo[k], shard_hi[k]);
    }
    free(r);
}

Test(cli, a_bf16_master_holds_no_fp32_matrices, .timeout = 120)
{
    master_layouts_hold_no_fp32_matrices(0, 7);
}

Test(cli, a_bf16_master_over_two_domains_holds_no_fp32_matrices, .timeout = 120)
{
    master_layouts_hold_no_fp32_matrices(7, 10);
}

/* Forward-masked subnetworks with a bf16 master: each owner's master
 * shard keeps no fp32 under the matrices and a bf16 shard of its whole
 * length instead, so its weights fall by 4 bytes a matrix element of the
 * shard, less 2 an element of the shard, less the pages a matrix shares
 * with a bias; the compact models are as with the fp32 master.  The mlp
 * 784 -> 64 -> 64 -> 10, neuron units, 2 workers: two shards, the first
 * inside the first matrix. */
Test(cli, a_bf16_master_of_forward_masked_subnetworks_holds_no_fp32_matrices, .timeout = 120)
{
    const double matrices = 784 * 64 + 64 * 64 + 64 * 10, page = 4096;
    const double params = matrices + 64 + 64 + 10, half = ceil(ceil(params / 16) / 2) * 16;
    char args[512];
    double w[2];
    run_result *r = calloc(1, sizeof *r);
    for (int sr = 0; sr < 2; sr++) {
        snprintf(args, sizeof args, "--data synthetic --model mlp --depth 2 --width 64 --steps 2 "
                 "--batch 16 --precision bf16 --bf16-emulated --master-weights %s --progress "
                 "none --metrics /dev/stdout --workers 2 --oversubscribe --strategy sdp "
                 "--subnet neuron", sr ? "bf16-sr" : "fp32");
        w[sr] = weights_bytes(r, NULL, args);
    }
    /* the busiest worker's: either shard's fall */
    const double fell = w[0] - w[1], most = 4 * half - 2 * half,
                 least = 4 * (matrices - half) - 2 * (params - half) - 7 * page;
    cr_assert(fell <= most && fell >= least, "weights %.0f bytes a worker with the fp32 master, "
              "%.0f with bf16-sr: %.0f fewer, want %.0f to %.0f", w[0], w[1], fell, least, most);
    free(r);
}

/* A worker that fails once set up, before training, ends the run with
 * its one line and exit 1 for every strategy: what its set-up built for
 * the first phase (synth's segment, in the worker's arena) is dropped
 * before the arena is, and the workers that did not fail leave too. */
Test(cli, a_worker_failing_once_set_up_ends_the_run_with_one_line, .timeout = 120)
{
    static const char *const strategies[] = { "dp", "sdp", "ist", "localsgd", "synth" };
    for (size_t k = 0; k < sizeof strategies / sizeof *strategies; k++) {
        char args[160];
        snprintf(args, sizeof args, "--data synthetic --depth 2 --width 32 --batch 16 "
                 "--workers 2 --oversubscribe --epochs 1 --strategy %s", strategies[k]);
        expect_runtime_error("SUBTRAIN_FAULT=0:init", args, "worker 1 fails once set up");
    }
}

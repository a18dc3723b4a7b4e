/*
 * tests/test_cli.c — the `subtrain` command as a user meets it: every bad
 * input ends in one line on stderr and exit status 2 (usage) or 1 (run
 * time); nothing crashes; a short run writes the metrics it promises.
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

Test(cli, bad_values_name_the_option_and_what_is_allowed)
{
    expect_usage_error("--depth abc", "--depth: expected an integer in [1, 1024]");
    expect_usage_error("--depth 0", "--depth");
    expect_usage_error("--width 12x", "--width");
    expect_usage_error("--batch -3", "--batch");
    expect_usage_error("--epochs 99999999999999999999", "--epochs");
    expect_usage_error("--model cnn", "allowed: mlp, resmlp");
    expect_usage_error("--activation tanh", "allowed: relu, gelu");
    expect_usage_error("--optimizer adam", "allowed: sgd, adamw");
    expect_usage_error("--schedule linear", "allowed: constant, cosine");
    expect_usage_error("--progress fancy", "allowed: auto, bar, plain, none");
    expect_usage_error("--lr 0", "--lr");
    expect_usage_error("--lr nan", "--lr");
    expect_usage_error("--lr ''", "--lr");
    expect_usage_error("--momentum 1", "--momentum");
    expect_usage_error("--weight-decay -0.1", "--weight-decay");
    expect_usage_error("--seed -1", "--seed");
    expect_usage_error("--steps 0", "--steps");
    expect_usage_error("--data ''", "--data");
    expect_usage_error("--workers 0", "--workers");
    expect_usage_error("--workers many", "--workers");
    expect_usage_error("--strategy pp", "allowed: dp, sdp, ist");
    expect_usage_error("--strategy ist --local-steps 0", "--local-steps");
    expect_usage_error("--strategy ist --optimizer-state forget", "allowed: reset, keep");
    expect_usage_error("--strategy ist --train-scale double", "allowed: none, inverse-workers");
    expect_usage_error("--optimizer-state keep", "--strategy ist");
    expect_usage_error("--strategy ist --eval-branch-scale half", "allowed: none, inverse-workers");
    expect_usage_error("--strategy sdp --coverage 0", "--coverage");
    expect_usage_error("--strategy sdp --coverage 1.5", "--coverage");
    expect_usage_error("--strategy sdp --masking sideways", "allowed: forward, backward");
    expect_usage_error("--strategy sdp --masking backward --report align", "align");
    expect_usage_error("--strategy sdp --subnet atom", "allowed: block, neuron");
    expect_usage_error("--strategy sdp --subnet neuron --neuron-group 0", "--neuron-group");
    expect_usage_error("--strategy sdp --model mlp", "resmlp");
    expect_usage_error("--strategy sdp --branch-scale half", "allowed: none, inverse-coverage");
    expect_usage_error("--bn-calibration -3", "--bn-calibration");
    expect_usage_error("--bn-calibration many", "--bn-calibration");
    expect_usage_error("--report speed", "allowed: memory, align, align=N");
    expect_usage_error("--strategy sdp --report align=0", "align");
    expect_usage_error("--report align", "needs --strategy sdp");
    expect_usage_error("--segments 3", "applies to --strategy synth only");
    expect_usage_error("--recovery-epochs 1 --strategy dp", "--recovery-epochs applies to");
    expect_usage_error("--strategy synth --segments 1", "--segments: expected an integer in [2, 16]");
    expect_usage_error("--strategy synth --segments 7", "--segments must be in [2, 6]");
    expect_usage_error("--strategy synth --cuts 2,x", "--cuts: expected increasing");
    expect_usage_error("--strategy synth --cuts 3,2 --segments 3", "--cuts: expected increasing");
    expect_usage_error("--strategy synth --cuts 2,4", "--cuts: 2 cuts for --segments 2");
    expect_usage_error("--strategy synth --cuts 6", "--cuts must be 1 increasing");
    expect_usage_error("--strategy synth --synth-labels uniform", "allowed: gaussian, sign");
    expect_usage_error("--strategy synth --synth-scale 0", "--synth-scale");
    expect_usage_error("--strategy synth --synth-noise -1", "--synth-noise");
    expect_usage_error("--strategy synth --recovery-epochs -1", "--recovery-epochs");
    expect_usage_error("--strategy synth --model resmlp", "synth cuts an mlp");
    expect_usage_error("--strategy synth --steps 10", "use --epochs");
    expect_usage_error("--cpuset ''", "--cpuset");
    expect_usage_error("--topology synthetic:pack:2", "subtrain topo");
}

/* An option two strategies take (--local-steps, --optimizer-state: ist's
 * and localsgd's) goes to the chosen one's config only: localsgd keeps
 * its optimizer state without ist refusing it elsewhere, and gets the
 * values given; an option only ist takes is refused with localsgd as
 * with any other strategy. */
Test(cli, localsgd_takes_its_options_and_refuses_others)
{
    run_result *r = calloc(1, sizeof *r);
    run(r, NULL, "--data synthetic --strategy localsgd --local-steps 7 --optimizer-state keep "
        "--dump-config");
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert(strstr(r->out, "\nstrategy = localsgd\n") && strstr(r->out, "\nlocal-steps = 7\n") &&
              strstr(r->out, "\noptimizer-state = keep\n"), "%s", r->out);
    run(r, NULL, "--data synthetic --strategy localsgd --steps 3 --workers 2 --batch 32 "
        "--local-steps 2 --oversubscribe --progress none");
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert(strstr(r->out, "| localsgd (2 local steps, optimizer state reset), 2 workers"),
              "%s", r->out);
    cr_assert(strstr(r->out, "communication per worker and round:"), "%s", r->out);
    free(r);
    expect_usage_error("--strategy localsgd --local-steps 0",
                       "--local-steps: expected an integer in [1, 1000000000]");
    expect_usage_error("--strategy localsgd --optimizer-state forget", "allowed: reset, keep");
    expect_usage_error("--strategy localsgd --train-scale none",
                       "--optimizer-state and --train-scale are options of --strategy ist");
    expect_usage_error("--strategy localsgd --optimizer sgd --momentum 0 --optimizer-state keep",
                       "SGD without momentum keeps no state");
    expect_usage_error("--strategy localsgd --comm-precision bf16",
                       "--strategy localsgd averages parameters");
    expect_usage_error("--strategy localsgd --segments 3",
                       "--segments applies to --strategy synth only");
}

/* A count that must be >= 1 states [1, ...] for every bad value, 0 among
 * them: the range printed for 'abc' is the one 0 is refused by. */
Test(cli, the_stated_range_is_the_enforced_one)
{
    static const struct { const char *opts, *range; } c[] = {
        { "--steps", "--steps: expected an integer in [1, 1000000000]" },
        { "--strategy ist --local-steps", "--local-steps: expected an integer in [1, 1000000000]" },
        { "--strategy sdp --report align=", "--report align=N: expected an integer in [1, "
                                            "1000000000]" },
        { "--model gpt --data text:/x --epoch-windows", "--epoch-windows: expected an integer "
                                                       "in [1, 4294967295]" },
        { "--checkpoint x --checkpoint-every", "--checkpoint-every: expected a number of steps "
                                               "in [1, 1099511627776] or 'epoch'" },
        { "--model gpt --data text:/x --holdout", "--holdout: expected a fraction in (0, 1)" },
    };
    static const char *const bad[] = { "abc", "-1", "1.5", "0", "99999999999999999999" };
    for (size_t k = 0; k < sizeof c / sizeof *c; k++)
        for (size_t b = 0; b < sizeof bad / sizeof *bad; b++) {
            char args[256];
            const char *o = c[k].opts;
            snprintf(args, sizeof args, "%s%s%s", o, o[strlen(o) - 1] == '=' ? "" : " ", bad[b]);
            expect_usage_error(args, c[k].range);
        }
    expect_usage_error("--model gpt --data text:/x --holdout 1", "expected a fraction in (0, 1)");
}

/* --cpuset: a malformed or impossible list is bad usage under training as
 * under `subtrain topo`, said before any data loads, naming the PUs; digits
 * only (hwloc's parser takes -1 and wraps 4294967297 to CPU 1). */
Test(cli, bad_cpusets_are_usage_errors_everywhere)
{
    static const struct { const char *value, *needle; } c[] = {
        { "-1", "cpuset '-1': expected a list of OS PU indices" },
        { "abc", "cpuset 'abc': expected a list of OS PU indices" },
        { "4294967297", "cpuset '4294967297': PU 4294967297 is not in the topology" },
        { "99999", "cpuset '99999': PU 99999 is not in the topology" },
        { "5-2", "the range 5-2 runs backwards" },
    };
    for (size_t k = 0; k < sizeof c / sizeof *c; k++) {
        char args[256];
        snprintf(args, sizeof args, "--data /nonexistent/fmnist --steps 1 --cpuset %s",
                 c[k].value);
        expect_usage_error(args, c[k].needle);
        snprintf(args, sizeof args, "topo --cpuset %s", c[k].value);
        expect_usage_error(args, c[k].needle);
    }
}

/* A layout the strategy cannot spread over its units (too few blocks or
 * neuron groups for the workers at the coverage, too few workers for the
 * segments) is bad usage, said in one line naming the options before the
 * data loads (the data here does not exist) and by --dump-config; with
 * --workers cores, once the placement check has counted the cores. */
Test(cli, impossible_layouts_are_usage_errors_before_data, .timeout = 60)
{
    static const struct { const char *args, *needle; } c[] = {
        { "--strategy sdp --workers 2 --depth 1",
          "--strategy sdp --subnet block: --model resmlp --depth 1 has 1 block, and 2 workers "
          "at --coverage 0.5 need 2 (each block has k = max(1, round(C x N)) = 1 holder" },
        { "--strategy sdp --masking backward --workers 4 --oversubscribe --depth 3 "
          "--coverage 0.3", "--depth 3 has 3 blocks, and 4 workers at --coverage 0.3 need 4" },
        { "--strategy sdp --subnet neuron --model mlp --width 16 --neuron-group 16 --workers 2",
          "--strategy sdp --subnet neuron: a width layer of 16 neurons makes 1 group of "
          "--neuron-group 16, and 2 workers at --coverage 0.5 need 2" },
        { "--strategy sdp --subnet neuron --model resmlp --width 64 --hidden 32 "
          "--neuron-group 16 --coverage 0.25 --workers 4 --oversubscribe",
          "a width layer of 32 neurons makes 2 groups of --neuron-group 16, and 4 workers at "
          "--coverage 0.25 need 4" },
        { "--strategy ist --workers 2 --depth 1",
          "--strategy ist: --model resmlp --depth 1 has 1 block, and 2 workers need 2" },
        { "--strategy ist --model mlp --width 16 --neuron-group 16 --workers 2",
          "--strategy ist: a width layer of 16 neurons makes 1 group of --neuron-group 16, and "
          "2 workers need 2" },
        { "--strategy synth --workers 1",
          "--strategy synth --segments 2: 1 worker cannot train 2 segments" },
        { "--strategy synth --workers 2 --segments 3",
          "--strategy synth --segments 3: 2 workers cannot train 3 segments" },
        { "--model gpt --strategy sdp --workers 2 --depth 1",
          "--strategy sdp --subnet block: --model gpt --depth 1 has 1 block" },
    };
    for (size_t k = 0; k < sizeof c / sizeof *c; k++) {
        char args[512];
        const char *data = strstr(c[k].args, "gpt") ? "text:/nonexistent/t.txt"
                                                     : "/nonexistent/fmnist";
        snprintf(args, sizeof args, "--data %s %s", data, c[k].args);
        expect_usage_error(args, c[k].needle);
        snprintf(args, sizeof args, "--data %s %s --dump-config", data, c[k].args);
        expect_usage_error(args, c[k].needle);
    }
    /* k = max(1, round(C x N)) is not monotonic in N: 5 workers at 0.3
     * hold each of 3 blocks twice, which covers them */
    run_result *r = calloc(1, sizeof *r);
    run(r, NULL, "--data synthetic --strategy sdp --workers 5 --oversubscribe --depth 3 "
        "--coverage 0.3 --dump-config");
    cr_assert_eq(r->status, 0, "stderr: %s", r->err);
    /* cores: counted by the placement check, still before the data */
    run(r, "SLURM_CPUS_PER_TASK=1", "--data /nonexistent/fmnist --strategy synth --workers cores");
    cr_assert_eq(r->status, 2, "stderr: %s", r->err);
    cr_assert(count_lines(r->err) == 1 &&
              strstr(r->err, "--strategy synth --segments 2: 1 worker cannot train 2 segments"),
              "%s", r->err);
    free(r);
}

/* A ResNet's units are declared by its images' shape: its impossible
 * layout is found once the data loaded, still a usage error, before any
 * worker starts (Fashion-MNIST, the default data set, gives the images). */
Test(cli, impossible_resnet_layout_is_a_usage_error_after_the_data, .timeout = 60)
{
    const char *data = getenv("SUBTRAIN_DATA") ? getenv("SUBTRAIN_DATA")
                                               : "/usr/share/datasets/fashion-mnist";
    char probe[ST_TEST_PATH_MAX + 64], args[ST_TEST_PATH_MAX + 128];
    snprintf(probe, sizeof probe, "%s/train-images-idx3-ubyte.gz", data);
    if (access(probe, R_OK) != 0)
        cr_skip_test("no Fashion-MNIST at %s", data);
    snprintf(args, sizeof args, "--data '%s' --model resnet --strategy sdp --workers 2 --depth 1 "
             "--steps 1 --quiet", data);
    run_result *r = calloc(1, sizeof *r);
    run(r, NULL, args);
    cr_assert_eq(r->status, 2, "exit %d, stderr: %s", r->status, r->err);
    cr_assert(count_lines(r->err) == 1 &&
              strstr(r->err, "--strategy sdp --subnet block: --model resnet --depth 1 has 1 "
                             "block, and 2 workers at --coverage 0.5 need 2"), "%s", r->err);
    free(r);
}

/* Described machines too large for hwloc to build in reasonable time are
 * refused at once, by spec or through hwloc's environment; a default
 * topology that hwloc's environment describes is named after the
 * variable when training refuses it. */
Test(cli, topologies_too_large_or_from_the_environment, .timeout = 60)
{
    /* timeout(1): a hang that came back ends as a failure, not an orphan */
    run_result *r = calloc(1, sizeof *r);
    static const char *const specs[] = { "synthetic:core:20000 pu:1",
                                         "synthetic:pack:65536 pu:65536" };
    for (int k = 0; k < 2; k++) {
        char args[128];
        snprintf(args, sizeof args, "topo --topology '%s'", specs[k]);
        run(r, "timeout 20", args);
        cr_assert_eq(r->status, 2, "%s: %d %s", specs[k], r->status, r->err);
        cr_assert_eq(count_lines(r->err), 1, "%s", r->err);
        cr_assert(strstr(r->err, "is too large"), "%s", r->err);
    }
    run(r, "HWLOC_SYNTHETIC='pack:65536 pu:65536' timeout 20", "topo");
    cr_assert_eq(r->status, 2, "%s", r->err);
    cr_assert(strstr(r->err, "HWLOC_SYNTHETIC='pack:65536 pu:65536' is too large"), "%s",
              r->err);
    run(r, "HWLOC_COMPONENTS=synthetic HWLOC_SYNTHETIC='pack:2 pu:1'",
        "--data /nonexistent/fmnist --steps 2");
    cr_assert_eq(r->status, 2, "%s", r->err);
    cr_assert_eq(count_lines(r->err), 1, "%s", r->err);
    cr_assert(strstr(r->err, "not on HWLOC_SYNTHETIC='pack:2 pu:1'"), "%s", r->err);
    cr_assert_null(strstr(r->err, "not on this machine"), "%s", r->err);
    run(r, "HWLOC_SYNTHETIC='pack:2 pu:1'", "topo");
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert(strncmp(r->out, "topology HWLOC_SYNTHETIC='pack:2 pu:1': 2 workers", 49) == 0,
              "%s", r->out);
    free(r);
}

/* A message longer than the error buffer keeps its cause: the long path
 * is shortened in the middle, the advice at the end stays. */
Test(cli, long_paths_keep_the_cause)
{
    char args[4096] = "--data /tmp";
    for (int k = 0; k < 14; k++) {
        strcat(args, "/");
        memset(args + strlen(args), 'b', 200);
    }
    run_result *r = calloc(1, sizeof *r);
    run(r, NULL, args);
    cr_assert_eq(r->status, 1, "%s", r->err);
    cr_assert_eq(count_lines(r->err), 1, "%s", r->err);
    cr_assert(strstr(r->err, "[...]"), "%s", r->err);
    const char *end = "or use --data synthetic\n";
    cr_assert_str_eq(r->err + strlen(r->err) - strlen(end), end, "%s", r->err);
    free(r);
}

Test(cli, bad_data_and_augment_values_name_the_option)
{
    expect_usage_error("--augment-crop -1", "--augment-crop: expected an integer in [0, 1024]");
    expect_usage_error("--augment-crop 2000", "--augment-crop: expected an integer");
    expect_usage_error("--augment-crop x", "--augment-crop");
    expect_usage_error("--augment-crop", "needs a value");
    expect_usage_error("--augment-flip=yes", "option '--augment-flip=yes' takes no value");
    expect_usage_error("--data cifar10:", "--data cifar10:: the directory is missing");
    expect_usage_error("--data cifar10", "cifar-10-batches-bin");
    expect_usage_error("--data cifar100", "--data cifar100: the directory is missing");
    expect_usage_error("--data idx:", "--data idx:: the directory is missing");
    expect_usage_error("--data idx:/d:a,b,c", "expected four file names");
    expect_usage_error("--data idx:/d:a,b,c,d,e", "expected four file names");
    expect_usage_error("--data idx:/d:a,,c,d", "expected four file names");
    expect_usage_error("--data idx::a,b,c,d", "the directory is missing");
    /* the default from the environment is parsed alike, and named */
    run_result *r = calloc(1, sizeof *r);
    run(r, "SUBTRAIN_DATA=cifar100:", "");
    cr_assert_eq(r->status, 2, "exited %d: %s", r->status, r->err);
    cr_assert(strstr(r->err, "SUBTRAIN_DATA cifar100:"), "%s", r->err);
    /* known once the data is loaded: the synthetic task has no image shape */
    expect_usage_error("--data synthetic --augment-crop 2", "--augment-crop: needs images");
    expect_usage_error("--data synthetic --augment-flip", "--augment-flip: needs images");
    expect_usage_error("--data synthetic --augment-crop 0 --augment-flip", "784x1x1");
    free(r);
}

Test(cli, bad_usage_is_explained)
{
    expect_usage_error("--frobnicate", "unknown option '--frobnicate'");
    expect_usage_error("-x", "unknown option '-x'");
    expect_usage_error("--quiet=yes", "option '--quiet=yes' takes no value");
    expect_usage_error("quad --gamma", "option '--gamma' needs a value");
    expect_usage_error("topo --frobnicate", "unknown option '--frobnicate'");
    expect_usage_error("--depth", "needs a value");
    expect_usage_error("train extra", "unexpected argument 'extra'");
    expect_usage_error("--epochs 2 --steps 10", "cannot be used together");
    expect_usage_error("--model mlp --hidden 32", "--hidden applies to resmlp");
    expect_usage_error("--steps 10 --warmup 10", "warmup");
}

Test(cli, help_and_version)
{
    run_result *r = calloc(1, sizeof *r);
    run(r, NULL, "--help");
    cr_assert_eq(r->status, 0);
    cr_assert(strstr(r->out, "Usage: subtrain"));
    const char *documented[] = { "--data", "--model", "--depth", "--width", "--hidden",
                                 "--activation", "--epochs", "--steps", "--batch",
                                 "--optimizer", "--lr", "--momentum", "--weight-decay",
                                 "--schedule", "--warmup", "--seed", "--metrics",
                                 "--progress", "--quiet", "--help", "--version",
                                 "--strategy", "--workers", "--oversubscribe", "--cpuset",
                                 "--subnet", "--masking", "--coverage", "--resample",
                                 "--branch-scale", "--report", "--local-steps",
                                 "--eval-branch-scale", "--augment-crop", "--augment-flip",
                                 "--bn-calibration", "--sample", "--prompt",
                                 "--temperature", "--top-k", "--context", "--heads",
                                 "--holdout", "--val-bytes", "--epoch-windows",
                                 "--checkpoint", "--init", "subtrain eval", "text:FILE",
                                 "--config", "--dump-config",
                                 "cifar10:DIR", "cifar100:DIR", "idx:DIR" };
    for (size_t i = 0; i < sizeof documented / sizeof *documented; i++)
        cr_assert(strstr(r->out, documented[i]), "--help does not mention %s", documented[i]);
    run(r, NULL, "--version");
    cr_assert_eq(r->status, 0);
    cr_assert(strstr(r->out, "subtrain ") && strstr(r->out, "oneDNN 2."), "%s", r->out);
    free(r);
}

/* --help and --version answer whatever else the line holds (a line being
 * typed, with --help appended to see the options), as topo's and quad's do;
 * a malformed option is still refused: the bash completion tells options
 * that take a value from flags by `subtrain --help --OPT` (tests/completion.sh). */
Test(cli, help_and_version_whatever_else_the_line_holds)
{
    run_result *r = calloc(1, sizeof *r);
    const char *lines[] = { "--model gpt --help", "--usr1 checkpoint --help",
                            "--epochs 2 --steps 10 --help", "--help extra",
                            "eval --help", "--strategy ist --synth-noise 1 --version",
                            /* one word, many options: the parser once kept one slot
                             * a word (heap overflow, found by fuzz_options) */
                            "-qhh", "-qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqh" };
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++) {
        run(r, NULL, lines[i]);
        cr_assert_eq(r->status, 0, "'%s' exited %d (stderr: %s)", lines[i], r->status, r->err);
        cr_assert(strstr(r->out, i == 5 ? "oneDNN 2." : "Usage: subtrain"), "'%s': %s",
                  lines[i], r->out);
    }
    free(r);
    expect_usage_error("--help --depth", "needs a value");
    expect_usage_error("--help --frobnicate", "unknown option '--frobnicate'");
    expect_usage_error("--strategy nonsense --help", "--strategy");
}

Test(cli, missing_dataset_says_how_to_get_one)
{
    expect_runtime_error(NULL, "--data /nonexistent/fmnist", "dataset-fashion-mnist");
    expect_runtime_error(NULL, "--data /nonexistent/fmnist", "synthetic");
    expect_runtime_error("SUBTRAIN_DATA=/nonexistent/env", "", "/nonexistent/env");
}

Test(cli, missing_cifar_or_idx_set_says_what_is_missing)
{
    expect_runtime_error(NULL, "--data cifar10:/nonexistent/c10", "not packaged on Debian");
    expect_runtime_error(NULL, "--data cifar10:/nonexistent/c10",
                         "/nonexistent/c10/data_batch_1.bin");
    expect_runtime_error(NULL, "--data cifar100:/nonexistent/c100",
                         "/nonexistent/c100/train.bin");
    expect_runtime_error(NULL, "--data idx:/nonexistent/e:tri,trl,tei,tel", "/nonexistent/e/tri");
    expect_runtime_error(NULL, "--data idx:/nonexistent/e", "train-images-idx3-ubyte");
}

/* 260 train and 52 test images of 8 x 8, labels 0..25 (EMNIST letters'
 * class count), under names of the test's own. */
static void write_letters(const char *dir)
{
    static unsigned char px[260 * 64], lab[260];
    for (size_t i = 0; i < sizeof px; i++)
        px[i] = (unsigned char)(i * 7 + i / 64);
    for (int i = 0; i < 260; i++)
        lab[i] = (unsigned char)(i % 26);
    uint32_t di[3] = { 260, 8, 8 }, dl[1] = { 260 }, ti[3] = { 52, 8, 8 }, tl[1] = { 52 };
    write_idx_file(dir, "tr-img", 3, di, px, sizeof px);
    write_idx_file(dir, "tr-lab", 1, dl, lab, 260);
    write_idx_file(dir, "te-img", 3, ti, px, 52 * 64);
    write_idx_file(dir, "te-lab", 1, tl, lab, 52);
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
    /* found once the images are loaded: exit 1 */
    snprintf(args, sizeof args, "%s --steps 1 --depth 4", data);
    expect_runtime_error(NULL, args, "--model convnet --depth 4: each stage halves the image, and "
                         "8x8 images take at most 3 stages");
    snprintf(args, sizeof args, "%s --steps 1 --strategy sdp --workers 2 --oversubscribe", data);
    expect_runtime_error(NULL, args, "--model convnet has none (use --subnet neuron)");
    expect_runtime_error(NULL, "--model convnet --data synthetic --steps 1",
                         "--model convnet takes images (C x H x W data), not 784 features");
    expect_usage_error("--model convnet --hidden 8",
                       "--hidden applies to --model resmlp, gpt only");
    expect_usage_error("--model convnet --heads 2", "--heads applies to --model gpt only");
    expect_usage_error("--model convnet --depth 12 --width 64",
                       "its last stage would have more than 65536 channels");
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
 * record is in the metrics file (the run is training by then). */
static void expect_graceful_stop(int sig, const char *strategy, int want)
{
    char dir[ST_TEST_PATH_MAX], metrics[ST_TEST_PATH_MAX], cmd[8 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(metrics, dir, "m.jsonl");
    snprintf(cmd, sizeof cmd, "'%s' --data synthetic --depth 2 --width 32 --batch 64 "
             "--steps 100000000 --workers 2 --strategy %s --local-steps 7 --progress none "
             "--metrics '%s' --checkpoint '%s/ck' >'%s/out' 2>'%s/err' </dev/null & "
             "pid=$!; i=0; while [ ! -s '%s' ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; "
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
 * --checkpoint, then resumed with --resume DIR, ends with the weights of
 * the same run never stopped, byte for byte; the stopped run's step
 * checkpoint and interrupted record are there. */
static void expect_exact_resume(const char *opts)
{
    char dir[ST_TEST_PATH_MAX], cmd[8 * ST_TEST_PATH_MAX], a[2 * ST_TEST_PATH_MAX],
        b[2 * ST_TEST_PATH_MAX], rest[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    run_cmd(cmd, sizeof cmd, opts, dir, "straight", "");
    int w = system(cmd);
    cr_assert(WIFEXITED(w) && WEXITSTATUS(w) == 0, "%s: the straight run failed", opts);
    run_cmd(cmd, sizeof cmd, opts, dir, "stopped", "");
    char bg[9 * ST_TEST_PATH_MAX];
    snprintf(bg, sizeof bg, "%s & pid=$!; i=0; while [ ! -s '%s/stopped.jsonl' ] && [ $i -lt 600 ]; "
             "do sleep 0.05; i=$((i+1)); done; kill -TERM $pid; wait $pid", cmd, dir);
    w = system(bg);
    cr_assert(WIFEXITED(w) && WEXITSTATUS(w) == 143, "%s: the stopped run exited %d (it must "
              "still be training when its first record is out)", opts, WEXITSTATUS(w));
    char rec[1 << 16];
    snprintf(a, sizeof a, "%s/stopped.jsonl", dir);
    read_into(a, rec, sizeof rec);
    cr_assert(strstr(rec, "{\"interrupted\":true,"), "%s", rec);
    snprintf(rest, sizeof rest, "--resume '%s/stopped'", dir);
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
    snprintf(bg, sizeof bg, "%s & pid=$!; i=0; while [ ! -s '%s/usr1.jsonl' ] && [ $i -lt 600 ]; "
             "do sleep 0.05; i=$((i+1)); done; kill -USR1 $pid; wait $pid; "
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
    const char *v = strstr(last, "\"test_loss\":");
    cr_assert_not_null(v);
    cr_assert(strstr(last, "\"threads_per_worker\":"), "the layout is in the record");
    st_test_rmdir(dir);
    return strtod(v + strlen("\"test_loss\":"), NULL);
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

/* The final record's value of "key": (a number). */
static double final_value(const char *out, const char *key)
{
    const char *f = strstr(out, "\"final\":true");
    cr_assert_not_null(f, "no final record: %s", out);
    const char *v = strstr(f, key);
    cr_assert_not_null(v, "%s not in the final record", key);
    return strtod(v + strlen(key), NULL);
}

/* Two runs' records, one by one: every record's losses and accuracy (the
 * text from "train_loss" to "samples_per_s", timings excluded) equal to the
 * printed digit, and at least one record. */
static void expect_same_records(const char *one, const char *two, const char *what)
{
    int n = 0;
    for (const char *a = one, *b = two;
         (a = strstr(a, "\"train_loss\"")) && (b = strstr(b, "\"train_loss\"")); a++, b++, n++) {
        const size_t len = (size_t)(strstr(a, "\"samples_per_s\"") - a);
        cr_assert(strncmp(a, b, len) == 0, "two %s runs differ: %.*s against %.*s", what,
                  (int)len, a, (int)len, b);
    }
    cr_assert_geq(n, 1, "no records: %s", one);
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
    const char *keys[3] = { "\"train_loss\":", "\"test_loss\":", "\"test_acc\":" };
    int equal = 0;
    for (int k = 0; k < 3; k++) {
        const double v16 = strtod(strstr(f16, keys[k]) + strlen(keys[k]), NULL);
        const double v32 = strtod(strstr(f32, keys[k]) + strlen(keys[k]), NULL);
        fprintf(stderr, "[resnet] %s bf16 %.6f, fp32 %.6f\n", keys[k], v16, v32);
        cr_assert(fabs(v16 - v32) <= 0.03 * fabs(v32), "%s bf16 %.6f, fp32 %.6f", keys[k], v16,
                  v32);
        equal += v16 == v32;
    }
    cr_assert_lt(equal, 3, "bf16 and fp32 resnet runs ended bitwise equal: bf16 not used?");
    free(r);
    free(again);
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
        const char *p = strstr(line, "\"workers_per_rank\":");
        if (p)
            w = atoi(p + strlen("\"workers_per_rank\":"));
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

Test(cli, corrupt_dataset_names_the_file)
{
    char dir[ST_TEST_PATH_MAX], path[ST_TEST_PATH_MAX], args[ST_TEST_PATH_MAX + 16];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    const char *names[] = { "train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                            "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte" };
    for (int i = 0; i < 4; i++)
        cr_assert_eq(st_test_write_file(st_test_path(path, dir, names[i]), "garbage!", 8), 0);
    snprintf(args, sizeof args, "--data '%s'", dir);
    expect_runtime_error(NULL, args, "train-images-idx3-ubyte");
    st_test_rmdir(dir);
}

Test(cli, unwritable_metrics_file_is_a_runtime_error)
{
    expect_runtime_error(NULL, "--data synthetic --steps 2 --metrics /nonexistent/dir/m.jsonl",
                         "/nonexistent/dir/m.jsonl");
}

/* --metrics is opened before the data loads (a bad path is named before a
 * missing dataset), a failed write says why (/dev/full: no space), and a
 * FIFO nobody reads is refused instead of blocking the run (the timeout
 * guards against the hang). */
Test(cli, metrics_problems_are_said_early_and_with_the_reason, .timeout = 60)
{
    expect_runtime_error(NULL, "--data /nonexistent/fmnist --metrics /nonexistent/dir/m.jsonl",
                         "cannot write the metrics file '/nonexistent/dir/m.jsonl': No such "
                         "file or directory");
    char want[256];
    snprintf(want, sizeof want, "writing the metrics file '/dev/full' failed: %s",
             strerror(ENOSPC));
    expect_runtime_error(NULL, "--data synthetic --model mlp --depth 1 --width 16 --steps 2 "
                         "--metrics /dev/full", want);
    char dir[ST_TEST_PATH_MAX], fifo[ST_TEST_PATH_MAX], args[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(fifo, dir, "fifo");
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    snprintf(args, sizeof args, "--data synthetic --steps 2 --metrics '%s'", fifo);
    expect_runtime_error("timeout 30", args, "a FIFO with no reader");
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
    static const char *const words[] = { "the ", "cat ", "sat ", "on ", "a ", "mat.\n" };
    char corpus[8192];
    size_t len = 0;
    for (unsigned i = 0; len + 8 < sizeof corpus; i = i * 5 + 3)
        len += (size_t)snprintf(corpus + len, sizeof corpus - len, "%s", words[i % 6]);
    cr_assert_eq(st_test_write_file(st_test_path(text, dir, "corpus.txt"), corpus, len), 0);
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

/* ------------------------------------------------------------ configuration and provenance */

/* path's bytes as a string (heap; the caller frees), "" when unreadable. */
static char *slurp(const char *path)
{
    size_t len = 0;
    unsigned char *data = st_test_read_file(path, &len);
    char *s = malloc(len + 1);
    cr_assert_not_null(s);
    if (data)
        memcpy(s, data, len);
    s[data ? len : 0] = '\0';
    free(data);
    return s;
}

static int count_of(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)) != NULL; p++)
        n++;
    return n;
}

/* The long options --dump-config must print (those of --help's test,
 * without the actions), each as "key =" at a line's start. */
static void expect_every_key(const char *dump)
{
    static const char *const keys[] = {
        "data", "model", "depth", "width", "hidden", "activation", "epochs", "steps", "batch",
        "optimizer", "lr", "momentum", "weight-decay", "schedule", "warmup", "seed", "metrics",
        "progress", "quiet", "strategy", "workers", "oversubscribe", "cpuset", "subnet",
        "masking", "coverage", "resample", "branch-scale", "report", "local-steps",
        "eval-branch-scale", "augment-crop", "augment-flip", "bn-calibration", "sample",
        "prompt", "temperature", "top-k", "context", "heads", "holdout", "val-bytes",
        "epoch-windows", "checkpoint", "init", "resume", "keep", "checkpoint-every", "usr1",
        "precision", "bf16-emulated", "comm-precision", "threads-per-worker",
        "team-spans-domains", "segments", "cuts", "synth-labels", "synth-scale", "synth-noise",
        "recovery-epochs", "train-scale", "optimizer-state", "neuron-group" };
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        char line[64];
        snprintf(line, sizeof line, "\n%s =", keys[i]);
        cr_assert(strstr(dump, line), "--dump-config lacks '%s': %s", keys[i], dump);
    }
    cr_assert(!strstr(dump, "\nhelp =") && !strstr(dump, "\nconfig =") &&
              !strstr(dump, "\ndump-config ="), "actions are not configuration: %s", dump);
}

/* --dump-config prints every option resolved and trains nothing; the run
 * it describes (sdp, C = 0.3 of 2 workers: k = 1, coverage 1/2, said in
 * the banner, a warning and the records) repeated from the dump and from
 * its metrics file gives the same records, losses and accuracy to the
 * printed digit; the command line wins over the file wherever it stands;
 * a metrics file is not overwritten by its own repetition. */
Test(cli, dumped_config_and_metrics_file_repeat_the_run_bitwise, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], a[ST_TEST_PATH_MAX], b[ST_TEST_PATH_MAX], c[ST_TEST_PATH_MAX],
        conf[ST_TEST_PATH_MAX], args[6 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(a, dir, "a.jsonl");
    st_test_path(b, dir, "b.jsonl");
    st_test_path(c, dir, "c.jsonl");
    st_test_path(conf, dir, "run.conf");
    const char *opts = "--data synthetic --model mlp --depth 2 --width 32 --batch 32 --steps 40 "
                       "--workers 2 --strategy sdp --subnet neuron --coverage 0.3 --resample 10 "
                       "--lr 0.003 --seed 5 --progress none";
    run_result *r = calloc(1, sizeof *r);
    snprintf(args, sizeof args, "%s --metrics '%s' --dump-config", opts, a);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert_str_empty(r->err);
    expect_every_key(r->out);
    const char *want[] = { "\ncoverage = 0.3\n", "\nsteps = 40\n", "\nepochs =\n",
                           "\nworkers = 2\n", "\nseed = 5\n", "\nlr = 0.003\n",
                           "\nwarmup =\n", "\nsegments =\n", "\noversubscribe = false\n" };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        cr_assert(strstr(r->out, want[i]), "no '%s' in: %s", want[i] + 1, r->out);
    cr_assert(!strstr(r->out, "final:"), "--dump-config trained: %s", r->out);
    cr_assert_neq(access(a, F_OK), 0, "--dump-config wrote the metrics file");
    cr_assert_eq(st_test_write_file(conf, r->out, strlen(r->out)), 0);

    snprintf(args, sizeof args, "%s --metrics '%s'", opts, a);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert(strstr(r->out, "coverage 1/2 = 0.5, requested 0.3"), "banner: %s", r->out);
    cr_assert_eq(count_lines(r->err), 1, "one warning: %s", r->err);
    cr_assert(strstr(r->err, "warning: --coverage 0.3 with 2 workers") &&
              strstr(r->err, "coverage is 1/2 = 0.5"), "%s", r->err);
    /* the command line before --config wins all the same */
    snprintf(args, sizeof args, "--metrics '%s' --config '%s'", b, conf);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    snprintf(args, sizeof args, "--config '%s' --metrics '%s'", a, c);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    char *ma = slurp(a), *mb = slurp(b), *mc = slurp(c);
    cr_assert_eq(count_lines(ma), 2, "an epoch record and the final one: %s", ma);
    cr_assert(strstr(ma, "\"coverage\":{\"requested\":0.3,\"holders\":1,\"workers\":2,"
                         "\"effective\":0.5}"), "%s", ma);
    expect_same_records(ma, mb, "dumped-configuration");
    expect_same_records(ma, mc, "metrics-file-configuration");
    cr_assert_eq(count_lines(mb), count_lines(ma));
    cr_assert_eq(count_lines(mc), count_lines(ma));
    /* its run record names it, the metrics file, as the run's: a
     * repetition that would write over it is refused */
    snprintf(args, sizeof args, "--config '%s'", a);
    expect_usage_error(args, "is the file --config reads");
    /* --steps on the command line replaces the file's steps; --epochs them */
    snprintf(args, sizeof args, "--steps 7 --config '%s' --dump-config", conf);
    run(r, NULL, args);
    cr_assert(strstr(r->out, "\nsteps = 7\n"), "%s", r->out);
    snprintf(args, sizeof args, "--config '%s' --epochs 2 --dump-config", conf);
    run(r, NULL, args);
    cr_assert(strstr(r->out, "\nepochs = 2\n") && strstr(r->out, "\nsteps =\n"), "%s", r->out);
    free(ma);
    free(mb);
    free(mc);
    free(r);
    st_test_rmdir(dir);
}

/* The configuration printed and read back prints the same, whatever the
 * strategy, model and data: every value reads back as itself (floats to
 * the bit, a prompt with a newline, quotes and '#' quoted). */
Test(cli, dump_config_reads_back_as_itself)
{
    char dir[ST_TEST_PATH_MAX], conf[ST_TEST_PATH_MAX], args[4 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(conf, dir, "c.conf");
    static const char gpt[] = "# a gpt with a sample\nmodel = gpt\n  data = text:/no/corpus.txt\n"
                              "sample = 20\nprompt = \"<p>\\n\\\"x\\\" # kept\"\n"
                              "temperature = 0.35\n\nworkers = cores\n";
    cr_assert_eq(st_test_write_file(conf, gpt, strlen(gpt)), 0);
    char from_file[ST_TEST_PATH_MAX + 16];
    snprintf(from_file, sizeof from_file, "--config '%s'", conf);
    const char *const cases[] = {
        "--data synthetic",
        "--data synthetic --strategy sdp --workers 3 --coverage 0.7 --report memory,align=9 "
        "--branch-scale none --lr 3e-4 --weight-decay 0.1234567",
        "--data synthetic --strategy ist --model mlp --local-steps 7 --train-scale none "
        "--optimizer-state keep --epochs 3 --warmup 11 --cpuset 0",
        "--data synthetic --strategy synth --segments 3 --cuts 2,4 --synth-noise 0.25 "
        "--recovery-epochs 1 --workers 3 --oversubscribe --checkpoint /tmp/ck "
        "--checkpoint-every epoch",
        from_file,
    };
    run_result *r = calloc(1, sizeof *r), *again = calloc(1, sizeof *again);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(args, sizeof args, "%s --dump-config", cases[i]);
        run(r, NULL, args);
        cr_assert_eq(r->status, 0, "%s: %s", cases[i], r->err);
        expect_every_key(r->out);
        char copy[ST_TEST_PATH_MAX];
        st_test_path(copy, dir, "dump.conf");
        cr_assert_eq(st_test_write_file(copy, r->out, strlen(r->out)), 0);
        snprintf(args, sizeof args, "--config '%s' --dump-config", copy);
        run(again, NULL, args);
        cr_assert_eq(again->status, 0, "%s: %s", cases[i], again->err);
        cr_assert_str_eq(again->out, r->out, "%s: the dump read back differs", cases[i]);
    }
    cr_assert(strstr(r->out, "\nprompt = \"<p>\\n\\\"x\\\" # kept\"\n"), "%s", r->out);
    cr_assert(strstr(r->out, "\ntemperature = 0.35\n") && strstr(r->out, "\nworkers = cores\n") &&
              strstr(r->out, "\ncontext = 128\n") && strstr(r->out, "\nsegments =\n"), "%s",
              r->out);
    run(r, NULL, "--data synthetic --strategy synth --segments 3 --cuts 2,4 --workers 3 "
        "--dump-config");
    cr_assert(strstr(r->out, "\ncuts = 2,4\n") && strstr(r->out, "\ndepth = 5\n") &&
              strstr(r->out, "\ncontext =\n"), "%s", r->out);
    free(r);
    free(again);
    st_test_rmdir(dir);
}

/* A bad line gets the message its option gets on the command line, after
 * FILE:LINE; a missing file, an unknown or repeated key, a line without
 * '=' and a metrics file without a run record are refused (exit 2, one
 * line); topo and quad take no --config. */
Test(cli, config_file_errors_name_the_file_and_line)
{
    char dir[ST_TEST_PATH_MAX], conf[ST_TEST_PATH_MAX], args[4 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(conf, dir, "bad.conf");
    static const struct { const char *text, *needle; } bad[] = {
        { "# ok so far\n\ndepth = 2\nwidth = 12x\n", "bad.conf:4: --width: expected an integer" },
        { "model = cnn\n", "bad.conf:1: --model: unknown value 'cnn' (allowed: mlp" },
        { "depth = 2\nfrobnicate = 1\n", "bad.conf:2: unknown key 'frobnicate'" },
        { "depth 3\n", "bad.conf:1: expected 'key = value', got 'depth 3'" },
        { "depth = 3\n\ndepth = 4\n", "bad.conf:3: 'depth' is set twice (line 1" },
        { "oversubscribe = yes\n", "bad.conf:1: --oversubscribe: expected true or false" },
        { "help = true\n", "bad.conf:1: 'help' is not a configuration key" },
        { "prompt = \"open\n", "bad.conf:1: prompt: a quoted value" },
        { "strategy = dp\ncoverage = 1.5\n", "bad.conf:2: --coverage: expected a number" },
        { "{\"epoch\":1,\"final\":true}\n", "bad.conf:1: the first record has no \"run\"" },
        { "{\"run\":{\"config\":{\"depth\":\"0\"}}}\n", "bad.conf:1: --depth: expected an" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(st_test_write_file(conf, bad[i].text, strlen(bad[i].text)), 0);
        snprintf(args, sizeof args, "--data synthetic --config '%s'", conf);
        expect_usage_error(args, bad[i].needle);
    }
    expect_usage_error("--config /nonexistent/run.conf",
                       "--config /nonexistent/run.conf: cannot read it");
    expect_usage_error("topo --config x.conf", "unknown option '--config'");
    expect_usage_error("quad --config x.conf", "unknown option '--config'");
    st_test_rmdir(dir);
}

/* The first record of a run says what made it (its configuration, the
 * versions, the machine, each worker's PUs and NUMA node, the seed, the
 * start time); the records after it do not repeat it; a resumed run
 * appending to the file starts its records with its own. */
Test(cli, first_record_holds_the_run_provenance, .timeout = 120)
{
    char dir[ST_TEST_PATH_MAX], m[ST_TEST_PATH_MAX], ck[ST_TEST_PATH_MAX],
        args[6 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(m, dir, "m.jsonl");
    st_test_path(ck, dir, "ck");
    /* 16384 / (2 x 32) = 256 steps an epoch: 300 steps are two records and a
     * final one */
    const char *opts = "--data synthetic --model mlp --depth 1 --width 16 --batch 32 "
                       "--steps 300 --workers 2 --seed 7 --progress none";
    run_result *r = calloc(1, sizeof *r);
    snprintf(args, sizeof args, "%s --metrics '%s' --checkpoint '%s' --checkpoint-every 100",
             opts, m, ck);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    char *s = slurp(m);
    cr_assert_eq(count_lines(s), 3, "%s", s);
    cr_assert(strncmp(s, "{\"run\":{\"config\":{\"data\":\"synthetic\",", 37) == 0, "%s", s);
    cr_assert_eq(count_of(s, "\"run\":"), 1, "only the first record: %s", s);
    const char *want[] = { "\"seed\":\"7\"", "\"steps\":\"300\"", "\"epochs\":\"\"",
                           "\"version\":\"", "\"git\":", "\"onednn\":{\"version\":\"",
                           "\"isa\":\"", "\"hwloc\":\"", "\"machine\":{\"cpu\":", "\"cores\":",
                           "\"pus\":", "\"numa\":",
                           "\"placement\":[{\"worker\":0,\"rank\":0,\"pus\":\"",
                           "},{\"worker\":1,\"rank\":0,\"pus\":\"", "\"seed\":7,",
                           "\"start_time\":\"" };
    const char *first_end = strchr(s, '\n');
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const char *at = strstr(s, want[i]);
        cr_assert(at && at < first_end, "the first record lacks %s: %.*s", want[i],
                  (int)(first_end - s), s);
    }
    /* ISO 8601, UTC: 2025-01-31T12:34:56Z */
    const char *t = strstr(s, "\"start_time\":\"") + 14;
    cr_assert(strlen(t) > 21 && t[4] == '-' && t[7] == '-' && t[10] == 'T' && t[13] == ':' &&
              t[16] == ':' && t[19] == 'Z' && t[20] == '"', "start_time %.24s", t);
    /* the run record is what the records continue: "run":{...},"epoch":1 */
    cr_assert(strstr(s, "\"},\"epoch\":1,\"step\":256,"), "%.*s", (int)(first_end - s), s);
    free(s);

    snprintf(args, sizeof args, "%s --metrics '%s' --checkpoint '%s' --resume "
             "'%s/step-00000100.safetensors'", opts, m, ck, ck);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    s = slurp(m);
    cr_assert_eq(count_lines(s), 6, "the resumed run's epochs 1, 2 and final appended: %s", s);
    cr_assert_eq(count_of(s, "\"run\":"), 2, "%s", s);
    const char *second = strstr(strstr(s, "\"final\":true"), "\n") + 1;
    cr_assert(strncmp(second, "{\"run\":{\"config\":{", 18) == 0, "%s", second);
    cr_assert(strstr(second, "\"resume\":\""), "the resumed run's config names it: %s", second);
    free(s);
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

/*
 * tests/test_cli.c — the `subtrain` command as a user meets it: every bad
 * input ends in one line on stderr and exit status 2 (usage) or 1 (run
 * time), nothing crashes; --help and --version.
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
    expect_usage_error("--split classes:0", "--split classes:0: K, the classes per worker, must "
                       "be a whole number in [1, 256]");
    expect_usage_error("--split classes:x", "--split classes:x: K");
    expect_usage_error("--split dirichlet:-1", "--split dirichlet:-1: ALPHA, the Dirichlet "
                       "concentration, must be a finite number > 0");
    expect_usage_error("--split dirichlet:nan", "--split dirichlet:nan: ALPHA");
    expect_usage_error("--split foo", "--split foo: expected iid, classes:K or dirichlet:ALPHA");
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

/* dp's --compress randk:Q and --error-feedback: read back by
 * --dump-config (a configuration file's text), in the banner; bad values
 * and other strategies refused in one line, exit 2. */
Test(cli, compress_takes_randk_and_refuses_bad_values)
{
    run_result *r = calloc(1, sizeof *r);
    run(r, NULL, "--data synthetic --compress randk:0.3 --error-feedback --dump-config");
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert(strstr(r->out, "\ncompress = randk:0.3\n") &&
              strstr(r->out, "\nerror-feedback = true\n"), "%s", r->out);
    run(r, NULL, "--data synthetic --dump-config");
    cr_assert(strstr(r->out, "\ncompress = none\n") &&
              strstr(r->out, "\nerror-feedback = false\n"), "%s", r->out);
    run(r, NULL, "--data synthetic --steps 2 --workers 2 --batch 32 --compress randk:0.5 "
        "--oversubscribe --progress none");
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert(strstr(r->out, "| dp (randk 0.5), 2 workers"), "%s", r->out);
    /* topo: each worker's bytes a step, by the plan (doc/reduction.md's
     * table: P = 55050, two workers on one domain) */
    run(r, NULL, "topo --topology 'synthetic:pack:1 numa:1 core:2 pu:1' --params 55050 "
        "--compress randk:0.5");
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert(strstr(r->out, "\nrandom-k 0.5, bytes a step") &&
              strstr(r->out, "\n  worker 0: read 440552 B (0 B across domains), written "
                             "330420 B\n"), "%s", r->out);
    run(r, NULL, "topo --topology 'synthetic:pack:2 numa:1 core:2 pu:1' --params 55050 "
        "--compress randk:0.25 --error-feedback");
    cr_assert_eq(r->status, 0, "%s", r->err);
    /* two domains: the packed vectors' partials cross them */
    const char *rk = strstr(r->out, "random-k 0.25 with error feedback");
    cr_assert(rk && strstr(rk, "\n  worker 3: read ") && !strstr(rk, "(0 B across domains)"),
              "%s", r->out);
    free(r);
    expect_usage_error("topo --compress randk:0", "subtrain topo: --compress randk:0: Q");
    expect_usage_error("topo --error-feedback", "subtrain topo: --error-feedback keeps");
    const char *q = "Q, the fraction of coordinates kept, must be a number in (0, 1]";
    expect_usage_error("--compress randk:0", "--compress randk:0: Q, the fraction");
    expect_usage_error("--compress randk:1.5", q);
    expect_usage_error("--compress randk:x", q);
    expect_usage_error("--compress randk:-0.5", q);
    expect_usage_error("--compress randk:", "--compress randk:: Q");
    expect_usage_error("--compress topk:0.5", "--compress topk:0.5: expected none or randk:Q");
    expect_usage_error("--compress randk:0.5 --strategy ist",
                       "--compress applies to --strategy dp only");
    expect_usage_error("--strategy localsgd --error-feedback",
                       "--error-feedback applies to --strategy dp only");
    expect_usage_error("--error-feedback", "--error-feedback keeps what --compress randk:Q drops");
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
    /* "N-": the topology's PUs from N, not the gaps in their indices */
    run_result *r = calloc(1, sizeof *r);
    run(r, NULL, "topo --topology 'synthetic:pack:1 core:4 pu:1(indexes=0,1,4,5)' --cpuset 1-");
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert(strstr(r->out, "3 workers on 1 NUMA domain") && strstr(r->out, "2 / 4") &&
              strstr(r->out, "3 / 5"), "%s", r->out);
    free(r);
    expect_usage_error("topo --topology 'synthetic:pack:1 core:4 pu:1(indexes=0,1,4,5)' "
                       "--cpuset 2,1-", "cpuset '2,1-': PU 2 is not in the topology");
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

/* subtrain topo plans data parallelism as a run does: a weight copy per
 * NUMA domain, who reads it, and the bytes a step.  A 2-socket node of 16
 * workers, and 16 workers over 8 domains of 2 (two packages of four):
 * the busiest worker's bytes a parameter, 4 + 4/16 + 16 (D - 1)/16 with
 * copies (5.25, 11.25) against 12 + 4/16 + 8 (D - 1)/16 with replicas
 * (12.75, 15.75); with --params 16777216 the 2-socket workers each read
 * 4 P + 2 x 4 S and write 3 x 4 S bytes (S = P / 16). */
Test(cli, topo_prints_the_weight_copies_and_the_bytes, .timeout = 60)
{
    run_result *r = calloc(1, sizeof *r);
    run(r, NULL, "topo --topology 'synthetic:pack:2 numa:1 core:8 pu:2' --params 16777216");
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert(strstr(r->out, "weights: one copy per NUMA domain, 16777216 floats (64.00 MiB; a "
                             "model in bf16 adds 32.00 MiB of bf16 copies), on the domain's "
                             "node; 128.00 MiB in all for 16 workers (a replica per worker: "
                             "1024.00 MiB)\n"), "%s", r->out);
    cr_assert(strstr(r->out, "  domain 1: read by workers 8-15; its owners update [8388608, "
                             "16777216) in it"), "%s", r->out);
    cr_assert(strstr(r->out, "  workers 0-7: read 75497472 B (8388608 B across domains), "
                             "written 12582912 B each\n"), "%s", r->out);
    cr_assert(strstr(r->out, "  the busiest worker: 5.25 B a parameter and step (a replica per "
                             "worker: 12.75; the gradients read once and the shard written once: "
                             "4.25)\n"), "%s", r->out);
    run(r, NULL, "topo --topology 'synthetic:pack:2 numa:4 core:16 pu:2' --workers 16");
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert(strstr(r->out, "weights: one copy per NUMA domain"), "%s", r->out);
    cr_assert(strstr(r->out, "  domain 7: read by workers 14-15;"), "%s", r->out);
    cr_assert(strstr(r->out, "  the busiest worker: 11.25 B a parameter and step (a replica "
                             "per worker: 15.75;"), "%s", r->out);
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
 * missing dataset), a failed write says why (/dev/full: no space) and
 * leaves whole records only, and a FIFO nobody reads is refused instead
 * of blocking the run (the timeout guards against the hang). */
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
    /* a run that fails before training leaves an earlier run's records;
     * one that trains replaces them */
    char path[ST_TEST_PATH_MAX], text[4096];
    st_test_path(path, dir, "m.jsonl");
    static const char earlier[] = "{\"earlier\":1}\n{\"earlier\":2, \"and\": \"longer\"}\n";
    cr_assert_eq(st_test_write_file(path, earlier, strlen(earlier)), 0);
    snprintf(args, sizeof args, "--data /nonexistent/fmnist --metrics '%s'", path);
    expect_runtime_error(NULL, args, "Fashion-MNIST not found in /nonexistent/fmnist");
    read_into(path, text, sizeof text);
    cr_assert_str_eq(text, earlier, "the failed run changed the metrics file");
    /* also one that fails while it builds its workers, before a record */
    snprintf(args, sizeof args, "--data synthetic --model convnet "
             "--steps 1 -q --metrics '%s'", path);
    expect_runtime_error(NULL, args, "training: --model convnet takes images");
    read_into(path, text, sizeof text);
    cr_assert_str_eq(text, earlier, "a run that failed before its first record changed it");
    /* and creates none: a new name, or a dangling link's target */
    char fresh[ST_TEST_PATH_MAX], link_[ST_TEST_PATH_MAX], target[ST_TEST_PATH_MAX];
    st_test_path(fresh, dir, "new.jsonl");
    st_test_path(link_, dir, "link.jsonl");
    st_test_path(target, dir, "target.jsonl");
    cr_assert_eq(symlink("target.jsonl", link_), 0);
    const char *never[] = { fresh, link_ };
    for (int k = 0; k < 2; k++) {
        snprintf(args, sizeof args, "--data /nonexistent/fmnist --metrics '%s'", never[k]);
        expect_runtime_error(NULL, args, "Fashion-MNIST not found in /nonexistent/fmnist");
        snprintf(args, sizeof args, "--data synthetic --model convnet "
                 "--steps 1 -q --metrics '%s'", never[k]);
        expect_runtime_error(NULL, args, "training: --model convnet takes images");
    }
    cr_assert_neq(access(fresh, F_OK), 0, "a run that failed before training made %s", fresh);
    cr_assert_neq(access(target, F_OK), 0, "a run that failed before training made %s", target);
    struct stat sb;
    cr_assert(lstat(link_, &sb) == 0 && S_ISLNK(sb.st_mode), "the link is gone");
    snprintf(args, sizeof args, "--data synthetic --model mlp --depth 1 --width 16 --steps 2 -q "
             "--metrics '%s'", path);
    run_result *r = calloc(1, sizeof *r);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    read_into(path, text, sizeof text);
    cr_assert(strncmp(text, "{\"run\":", 7) == 0 && !strstr(text, "earlier"), "%.200s", text);
    /* a write cut short (a file size limit, as a full disk cuts it) is
     * taken back: the file holds whole records only */
    snprintf(args, sizeof args, "--data synthetic --model mlp --depth 1 --width 16 --epochs 40 "
             "-q --metrics '%s'", path);
    expect_runtime_error("trap '' XFSZ; ulimit -f 16;", args, "writing the metrics file");
    static char all[1 << 16];
    read_into(path, all, sizeof all);
    cr_assert(strlen(all) > 0 && strlen(all) < 16 * 1024, "%zu bytes", strlen(all));
    expect_json_lines(all);
    free(r);
    st_test_rmdir(dir);
}

/* --unfuse runs fusions as passes of their own: the ReLU of an mlp and
 * the skip of a resmlp give bitwise the records of the fused run (in
 * bf16 too), the value names every fusion, and a bad list is one line. */
Test(cli, unfuse_keeps_the_records_and_refuses_unknown_fusions, .timeout = 60)
{
    const char *runs[] = {
        "--data synthetic --model mlp --depth 2 --width 32 --activation relu --steps 12 "
        "--batch 32 --quiet --metrics /dev/stdout",
        "--data synthetic --model resmlp --depth 2 --width 32 --activation relu --steps 12 "
        "--batch 32 --quiet --metrics /dev/stdout --precision bf16 --bf16-emulated",
    };
    run_result *r = calloc(1, sizeof *r), *u = calloc(1, sizeof *u);
    for (int k = 0; k < 2; k++) {
        if (k == 1 && st_bf16_probe(NULL) == ST_BF16_UNAVAILABLE)
            break;
        char args[512];
        run(r, NULL, runs[k]);
        cr_assert_eq(r->status, 0, "%s", r->err);
        cr_assert(strstr(r->out, "\"unfuse\":\"none\""), "%s", r->out);
        snprintf(args, sizeof args, "%s --unfuse relu,residual,bn-relu", runs[k]);
        run(u, NULL, args);
        cr_assert_eq(u->status, 0, "%s", u->err);
        cr_assert(strstr(u->out, "\"unfuse\":\"residual,relu,bn-relu\""), "%s", u->out);
        expect_same_records(r->out, u->out, k ? "resmlp bf16 fused and unfused"
                                              : "mlp fused and unfused");
    }
    free(r);
    free(u);
    expect_usage_error("--data synthetic --unfuse gelu",
                       "--unfuse: unknown fusion 'gelu' (allowed: none, bias, residual, "
                       "weight-copy, relu, bn-relu, relu-backward, gelu-backward)");
    expect_usage_error("--data synthetic --unfuse relu,none",
                       "--unfuse: 'none' cannot be listed with other fusions");
}

/* --metrics naming a file the run reads is refused before it is opened
 * (opened, it would be emptied before it is read); a metrics file next
 * to checkpoints or data is not such a file. */
Test(cli, metrics_over_an_input_is_refused, .timeout = 60)
{
    char dir[ST_TEST_PATH_MAX], text[ST_TEST_PATH_MAX], ck[ST_TEST_PATH_MAX],
        w[2 * ST_TEST_PATH_MAX], args[6 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(text, dir, "corpus.txt");
    static const char words[] = "the quick brown fox jumps over the lazy dog, again and again\n";
    cr_assert_eq(st_test_write_file(text, words, strlen(words)), 0);
    snprintf(args, sizeof args, "--model gpt --data 'text:%s' --metrics '%s'", text, text);
    expect_usage_error(args, "corpus.txt is the text --data reads: name another metrics file");
    st_test_path(ck, dir, "ck");
    snprintf(args, sizeof args, "--data synthetic --model mlp --depth 1 --width 16 --steps 2 -q "
             "--checkpoint '%s' --checkpoint-every 1 --metrics '%s/m.jsonl'", ck, ck);
    run_result *r = calloc(1, sizeof *r);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "a metrics file among the checkpoints: %s", r->err);
    snprintf(w, sizeof w, "%s/final.safetensors", ck);
    snprintf(args, sizeof args, "--data synthetic --model mlp --depth 1 --width 16 --steps 2 "
             "--init '%s' --metrics '%s'", w, w);
    expect_usage_error(args, "final.safetensors is the weights --init reads");
    snprintf(args, sizeof args, "--data synthetic --model mlp --depth 1 --width 16 --steps 2 "
             "--resume '%s' --metrics '%s/step-00000001.safetensors'", ck, ck);
    expect_usage_error(args, "is a checkpoint in the directory --resume reads");
    snprintf(args, sizeof args, "%s -q --init '%s'", "--data synthetic --model mlp --depth 1 "
             "--width 16 --steps 2", w);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "the weights were damaged: %s", r->err);
    free(r);
    st_test_rmdir(dir);
}

/*
 * cli/main.c — the `subtrain` command.
 *
 * Exit status: 0 on success, 1 when something failed at run time (data,
 * memory, oneDNN, numerics), 2 for bad usage, 128 + the signal after a run
 * stopped by SIGINT, SIGTERM or SIGUSR1 (130, 143, 138) that finished its
 * step, its records and its checkpoint, or that was stopped while it
 * started, before training.  Every failure is one line on stderr that says
 * what went wrong.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <hwloc.h>
#include <oneapi/dnnl/dnnl.h>

#include <subtrain/subtrain.h>

#include "cli/cli_util.h"
#include "cli/export_cmd.h"
#include "cli/calibration.h"
#include "cli/options.h"
#include "cli/plan_cmd.h"
#include "cli/progress.h"
#include "cli/provenance.h"
#include "cli/quad_cmd.h"
#include "cli/resume_options.h"
#include "cli/run_data.h"
#include "cli/topo_cmd.h"
#include "config.h"

#define EXIT_USAGE 2

static int runtime_error(const char *what)
{
    if (st_world_size() > 1)   /* which rank: the others are ended (run_train) */
        st_cli_error("subtrain", "rank %d of %d (%s): %s: %s", st_world_rank(), st_world_size(),
                     st_world_host(), what, st_last_error());
    else
        st_cli_error("subtrain", "%s: %s", what, st_last_error());
    return EXIT_FAILURE;
}

static void print_version(void)
{
    const dnnl_version_t *v = dnnl_version();
    unsigned h = hwloc_get_api_version();
    printf("subtrain %s\n", st_version());
    printf("oneDNN %d.%d.%d (CPU runtime: OpenMP), hwloc API %u.%u.%u\n", v->major, v->minor,
           v->patch, h >> 16, (h >> 8) & 0xff, h & 0xff);
}

/* workers: of the run, all ranks (0: not known). */
static void print_plan(const st_cli_options *o, const st_dataset *train, const st_dataset *test,
                       int workers)
{
    const st_train_config *t = &o->train;
    const st_model_config *m = &t->model;
    char model[256];
    st_model_config_describe(m, model, sizeof model);
    printf("subtrain %s: %s", PACKAGE_VERSION, model);
    if (m->precision != ST_PRECISION_FP32)
        printf(" %s", st_precision_name(m->precision));
    if (m->activations != ST_PRECISION_FP32)
        printf(" activations %s", st_precision_name(m->activations));
    if (m->recompute != ST_RECOMPUTE_NONE)
        printf(" recompute %s", st_recompute_name(m->recompute));
    printf(" %s | %s lr %g wd %g %s", st_activation_name(m->activation),
           st_optimizer_name(t->optim.kind), t->optim.lr, t->optim.weight_decay,
           st_schedule_name(t->schedule));
    if (t->optim.moments != ST_MOMENTS_FP32)
        printf(", %s moments", st_moments_name(t->optim.moments));
    if (t->optim.master != ST_MASTER_FP32)
        printf(", %s master", st_master_name(t->optim.master));
    printf(" | batch %d, ", t->batch);
    if (t->accumulate > 1)
        printf("%d micro-batches a step, ", t->accumulate);
    if (t->steps)
        printf("%llu steps", (unsigned long long)t->steps);
    else
        printf("%d epochs", t->epochs);
    printf(", seed %llu | data %s (%u train, %u test, %ux%ux%u, %u classes",
           (unsigned long long)t->seed, o->data, train->count, test->count, train->channels,
           train->height, train->width, train->n_classes);
    if (train->augment.crop)
        printf(", crop %u", train->augment.crop);
    if (train->augment.flip)
        printf(", flip");
    if (t->split.kind != ST_SPLIT_IID) {
        char split[64];
        st_split_name(&t->split, split, sizeof split);
        printf(", split %s", split);
    }
    char strategy[256];
    st_strategy_describe(t, workers, strategy, sizeof strategy);
    printf(") | %s, ", strategy);
    if (t->workers)
        printf("%d worker%s", t->workers, t->workers == 1 ? "" : "s");
    else
        printf("one worker per core");
    if (t->threads_per_worker > 1)
        printf(" of %d threads", t->threads_per_worker);
    if (st_world_size() > 1)
        printf(" per rank x %d MPI ranks", st_world_size());
    if (t->comm_precision != ST_PRECISION_FP32)
        printf(", comm %s", st_precision_name(t->comm_precision));
    if (o->slurm_cpus)
        printf(" (cores at most SLURM_CPUS_PER_TASK=%d)", o->slurm_cpus);
    printf("\n");
}

/* synth: where the cuts went and how many workers each segment got. */
static void print_segments(const st_epoch_record *r)
{
    printf("segments: layers ");
    for (int g = 0; g < r->n_segments; g++) {
        int first = g == 0 ? 1 : r->cuts[g - 1] + 1;
        if (g + 1 < r->n_segments)
            printf("%d-%d", first, r->cuts[g]);
        else
            printf("%d-end", first);
        printf(" (%d worker%s)%s", r->segment_workers[g], r->segment_workers[g] == 1 ? "" : "s",
               g + 1 < r->n_segments ? " | " : "");
    }
    printf("; nothing crosses a cut: bytes below are within a segment's group%s\n",
           r->recovery ? " (recovery epochs: the whole network's data parallelism)" : "");
}

static void print_summary(const st_epoch_record *r, int compressed)
{
    const st_mem_stats *m = &r->memory;
    if (r->n_segments)
        print_segments(r);
    printf("final: test_acc %.4f  test_loss %.4f  ", r->test_acc, r->test_loss);
    if (r->n_segments && !r->recovery) /* synth: the joined network was never trained as such */
        printf("last segment's loss %.4f (on synthetic inputs)", r->train_loss);
    else
        printf("train_loss %.4f", r->train_loss);
    printf("  %.0f samples/s  wall %.1fs\n", r->samples_per_s, r->wall_s);
    if (r->tokens_per_sample)
        printf("text: validation %.4f nats = %.4f bits per byte (train %.4f bpb), next-byte "
               "accuracy %.4f, %.0f tokens/s\n", r->test_loss, r->test_loss / M_LN2,
               r->train_loss / M_LN2, r->test_acc, r->samples_per_s * r->tokens_per_sample);
    printf("step (ms, mean over %d worker%s): compute %.2f  wait %.2f  reduce %.2f  optimizer %.2f",
           r->workers, r->workers == 1 ? "" : "s", r->step_ms_compute, r->step_ms_wait,
           r->step_ms_reduce, r->step_ms_optimizer);
    if (r->step_ms_overlapped > 0.0)
        printf("  reduce during the backward %.2f", r->step_ms_overlapped);
    printf("\n");
    if (r->optimizer_bytes_per_worker_step > 0.0)
        printf("optimizer per worker and step: %.2f MB read and written (%.1f bytes a "
               "parameter, %s moments%s)\n", r->optimizer_bytes_per_worker_step / 1e6,
               r->optimizer_bytes_per_param, st_moments_name(r->optimizer_moments),
               r->optimizer_master == ST_MASTER_BF16_SR ? ", bf16-sr master" : "");
    if (r->workers > 1)
        printf("communication per worker and step: %.2f MB (%s as a ring all-reduce "
               "would send %.2f MB)%s\n", r->comm_bytes_per_worker_step / 1e6,
               compressed ? "the kept coordinates" : "data parallelism",
               r->ring_bytes_per_worker_step / 1e6,
               r->comm_precision == ST_PRECISION_BF16
                   ? "; bf16 gradients: read at 2 bytes, each worker's conversion pass included"
                   : "");
    if (r->workers > 1 && r->comm_bytes_per_worker_round > 0.0)
        printf("communication per worker and round: %.2f MB (once every %.0f steps)\n",
               r->comm_bytes_per_worker_round / 1e6,
               r->comm_bytes_per_worker_round / r->comm_bytes_per_worker_step);
    printf("peak memory per worker: %.1f MiB (", (double)m->peak_total / 1048576.0);
    for (int k = 0; k < ST_MEM_KIND_COUNT; k++)
        printf("%s%s %.1f", k ? ", " : "", st_mem_kind_name((st_mem_kind)k),
               (double)m->peak[k] / 1048576.0);
    printf(")\n");
}

/* What the run's callbacks feed: the progress display, and for --sample
 * a copy of the trained parameters (on_params lends them during the call
 * only, on worker 0's thread, after the final record). */
typedef struct run_ui {
    st_progress *prog;
    float *params;        /* malloc'd; NULL: not (yet) handed over */
    size_t n_params;
    int params_nomem;     /* the copy could not be allocated */
} run_ui;

/* Graceful stop: the first SIGINT, SIGTERM or SIGUSR1 asks the run to
 * finish its step (st_train_callbacks.stop); a second SIGINT ends the
 * process at once, taking with it the final weights' temporary file if
 * they are being written, and before training the metrics file the run
 * created.  One that comes while the run starts (reading the checkpoint,
 * the data, the weights) ends it once that reading is done, before
 * training: there is no step to finish and nothing to save.  One after
 * the last step lets the final evaluation, records and weights finish.
 *
 * The handler runs in whichever thread the signal finds (the workers',
 * oneDNN's, MPI's), maybe while the main thread switches the run's phase.
 * They meet through sequentially consistent atomics, each writing its
 * side before it reads the other's (the handler: the signal, then the
 * phase; the main thread: the phase, then the signal), so that at least
 * one of them sees the other: no signal goes unseen at a switch.  Only
 * async-signal-safe calls and lock-free atomics in the handler. */
enum run_phase {
    PHASE_STARTING,   /* no bar drawn yet */
    PHASE_TRAINING,
    PHASE_TRAINED,    /* the last step taken: the evaluation and the writes left */
    PHASE_SAMPLING,   /* records and weights written; --sample draws */
    PHASE_ENDED,      /* records and weights written, the exit status decided */
};
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "the signal handler's atomics must be lock-free");
static atomic_int phase;                          /* enum run_phase */
static atomic_int raised;                         /* the first stop signal, 0 if none */
static atomic_int stops_seen;                     /* stop signals caught */
static volatile sig_atomic_t stop_signal;         /* raised, as the library polls it */
static volatile sig_atomic_t checkpoint_signal;   /* --usr1 checkpoint: SIGUSR1 */
static atomic_int writing;                        /* writing_tmp may exist */
static char writing_tmp[4200];                    /* the final weights' temporary file */
static atomic_int created;                        /* metrics_created is the run's to remove */
static char metrics_created[4096];                /* a metrics file the run created */
static dev_t created_dev;                         /* and its identity, */
static ino_t created_ino;                         /* checked before it is removed */
static int usr1_checkpoints;                      /* set before the handlers */

static void ui_on_step(const st_step_info *info, void *user)
{
    int training = PHASE_TRAINING;   /* what a stop now waits for: the evaluation and writes */
    if (info->step >= info->total_steps)
        atomic_compare_exchange_strong(&phase, &training, PHASE_TRAINED);
    st_progress_on_step(info, ((run_ui *)user)->prog);
}

static void ui_on_epoch(const st_epoch_record *rec, void *user)
{
    st_progress_on_epoch(rec, ((run_ui *)user)->prog);
}

static void ui_on_warning(const char *message, void *user)
{
    st_progress_on_warning(message, ((run_ui *)user)->prog);
}

static void ui_on_params(const float *params, size_t count, void *user)
{
    run_ui *ui = user;
    free(ui->params);
    ui->params = malloc(count * sizeof *params);
    ui->n_params = ui->params ? count : 0;
    ui->params_nomem = !ui->params;
    if (ui->params)
        memcpy(ui->params, params, count * sizeof *params);
}

/* One byte of a sample as printed: text as is, other bytes as '?' so that
 * the terminal sees no control sequences and the line count stays what
 * the text's newlines make. */
static int shown(uint8_t b)
{
    return (b >= 0x20 && b < 0x7f) || b == '\n' || b == '\t' ? b : '?';
}

/* The branch scale the run evaluated with (ist's blocks' branches by
 * 1 / workers, --eval-branch-scale), else none (0). */
static float eval_branch_scale(const st_cli_options *o, const st_epoch_record *final)
{
    return st_strategy_eval_scale(&o->train, final->workers);
}

/* --sample: the full model of the run, built for batch 1 on its own arena
 * with the trained parameters, continues the prompt.  It is the model the
 * run evaluated, the branch scale included. */
static int print_sample(const st_cli_options *o, const st_epoch_record *final,
                        const run_ui *ui)
{
    if (!ui->params) {
        fprintf(stderr, "subtrain: sampling: %s\n", ui->params_nomem
                ? "out of memory copying the trained parameters"
                : "the run handed over no parameters");
        return EXIT_FAILURE;
    }
    st_model_config mc = o->train.model;
    memset(&mc.subnet, 0, sizeof mc.subnet);
    mc.subnet.scale = eval_branch_scale(o, final);
    const size_t n = (size_t)o->sample, plen = strlen(o->prompt);
    int status = EXIT_FAILURE;
    st_arena *arena = NULL;
    st_model *m = NULL;
    uint8_t *text = malloc(n);
    if (!text) {
        fprintf(stderr, "subtrain: sampling: out of memory for %zu bytes\n", n);
        goto out;
    }
    if (st_arena_create("sampling", NULL, 0, &arena) != ST_OK ||
        st_model_create(&mc, 1, arena, &m) != ST_OK) {
        runtime_error("sampling: building the model");
        goto out;
    }
    if (st_model_param_count(m) != ui->n_params) {
        fprintf(stderr, "subtrain: sampling: the run handed over %zu parameters, the model "
                "has %zu\n", ui->n_params, st_model_param_count(m));
        goto out;
    }
    memcpy(st_model_params(m), ui->params, ui->n_params * sizeof *ui->params);
    if (st_model_generate(m, (const uint8_t *)o->prompt, plen, n, o->temperature, o->top_k,
                          o->train.seed, text) != ST_OK) {
        runtime_error("sampling");
        goto out;
    }
    if (!o->quiet)
        printf("sample (temperature %g, top-k %d, seed %llu):\n", (double)o->temperature,
               o->top_k, (unsigned long long)o->train.seed);
    int last = '\n';
    for (size_t i = 0; i < plen; i++)
        putchar(last = shown((uint8_t)o->prompt[i]));
    for (size_t i = 0; i < n; i++)
        putchar(last = shown(text[i]));
    if (last != '\n')
        putchar('\n');
    status = EXIT_SUCCESS;
out:
    st_model_destroy(m);
    st_arena_destroy(arena);
    free(text);
    return status;
}

static int load_data_for_model(st_cli_options *o, st_dataset *train, st_dataset *test)
{
    if (st_cli_load_run_data(o, train, test) != ST_OK)
        return runtime_error("loading data");
    return EXIT_SUCCESS;
}

/* --init: the full model's parameters from a weights file (either
 * layout: doc/interop.md), into *out (malloc'd), checked against the model
 * the options describe. */
static int load_init(const st_cli_options *o, float **out)
{
    st_model_config mc = o->train.model;
    memset(&mc.subnet, 0, sizeof mc.subnet);
    const size_t n = st_model_config_param_count(&mc);
    *out = malloc((n ? n : 1) * sizeof **out);
    if (!*out) {
        fprintf(stderr, "subtrain: --init: out of memory for %zu parameters\n", n);
        return EXIT_FAILURE;
    }
    if (st_checkpoint_read_weights(o->init_path, &mc, *out) != ST_OK)
        return runtime_error("--init");
    return EXIT_SUCCESS;
}

/* What made a checkpoint, for its metadata: the options in words, and
 * the oneDNN that ran them. */
typedef struct run_provenance {
    char config[512], onednn[32];
} run_provenance;

static void describe_run(const st_cli_options *o, run_provenance *pv)
{
    const st_model_config *m = &o->train.model;
    snprintf(pv->config, sizeof pv->config, "model = %s; depth = %d; width = %d; hidden = %d; "
             "heads = %d; context = %d; activation = %s; precision = %s; strategy = %s; "
             "seed = %llu",
             st_model_kind_name(m->kind), m->depth, m->width, m->hidden, m->heads, m->context,
             st_activation_name(m->activation), st_precision_name(m->precision),
             st_strategy_name(o->train.strategy),
             (unsigned long long)o->train.seed);
    const dnnl_version_t *v = dnnl_version();
    snprintf(pv->onednn, sizeof pv->onednn, "%d.%d.%d", v->major, v->minor, v->patch);
}

/* --checkpoint DIR, made if missing. */
static int checkpoint_dir_made;   /* by this run: removed again if it ends empty */

static int make_checkpoint_dir(const char *dir)
{
    if (mkdir(dir, 0755) == 0) {
        checkpoint_dir_made = 1;
        return EXIT_SUCCESS;
    }
    if (errno == EEXIST)
        return EXIT_SUCCESS;
    const int e = errno;
    st_cli_error("subtrain", "--checkpoint %s: cannot create it: %s", ST_CLI_SHOW(dir),
                 strerror(e));
    return EXIT_FAILURE;
}

/* A --checkpoint directory the run made and left empty (it failed before
 * it wrote a file) goes: rmdir removes none that holds anything. */
static void drop_empty_checkpoint_dir(const st_cli_options *o)
{
    if (checkpoint_dir_made && o->checkpoint_dir)
        rmdir(o->checkpoint_dir);
}

/* --checkpoint DIR: the trained weights as DIR/final.safetensors, with
 * what made them in the metadata. */
static int write_final_weights(const st_cli_options *o, const st_epoch_record *final,
                               const run_ui *ui)
{
    char path[4096];
    if (make_checkpoint_dir(o->checkpoint_dir) != EXIT_SUCCESS)
        return EXIT_FAILURE;
    if (!ui->params) {
        fprintf(stderr, "subtrain: --checkpoint: %s\n", ui->params_nomem
                ? "out of memory copying the trained parameters"
                : "the run handed over no parameters");
        return EXIT_FAILURE;
    }
    snprintf(path, sizeof path, "%s/final.safetensors", o->checkpoint_dir);
    const st_model_config *m = &o->train.model;
    run_provenance pv;
    describe_run(o, &pv);
    /* the scale the run evaluated with: eval applies it too */
    char scale[32];
    const float s = eval_branch_scale(o, final);
    snprintf(scale, sizeof scale, "%.9g", s > 0.0f ? (double)s : 1.0);
    const st_safetensors_meta_entry meta[4] = { { "subtrain.config", pv.config },
                                              { "subtrain.data", o->data },
                                              { "onednn.version", pv.onednn },
                                              { "subtrain.eval_branch_scale", scale } };
    st_model_config mc = *m;
    memset(&mc.subnet, 0, sizeof mc.subnet);
    /* the name written once, whole before the handler may read it */
    atomic_store(&writing, st_safetensors_tmp_name(path, writing_tmp, sizeof writing_tmp) == 0);
    const st_status written = st_checkpoint_write_weights(path, &mc, ui->params, meta, 4);
    atomic_store(&writing, 0);
    if (written != ST_OK)
        return runtime_error("--checkpoint");
    if (!o->quiet)
        printf("weights: %s\n", path);
    return EXIT_SUCCESS;
}

/* subtrain eval --init FILE: the weights on the test set, as the training
 * run's evaluation computes it (models with batch norm take the file's
 * running statistics, else re-estimate them on --bn-calibration training
 * batches: a subtrain weights file holds weights, not statistics). */
static int run_eval(st_cli_options *o)
{
    st_dataset train, test;
    if (load_data_for_model(o, &train, &test) != EXIT_SUCCESS)
        return EXIT_FAILURE;
    st_model *m = NULL;
    st_arena *arena = NULL;
    const int B = o->train.batch;
    st_cli_stats stats;
    int batches;
    st_safetensors f;
    int status = EXIT_SUCCESS;
    if (st_arena_create("eval", NULL, 0, &arena) != ST_OK)
        status = runtime_error("eval: building the model");
    else if (st_safetensors_read(o->init_path, &f) == ST_OK) {
        status = st_cli_init_model(o, &f, &train, arena, &m, &stats, &batches);
        st_safetensors_free(&f);
    } else
        status = runtime_error("--init");
    double sum = 0.0;
    int64_t hits = 0;
    for (uint32_t first = 0; status == EXIT_SUCCESS && first < test.count; first += (uint32_t)B) {
        const int rows = test.count - first < (uint32_t)B ? (int)(test.count - first) : B;
        st_dataset_gather_rows(&test, first, rows, B, st_model_input(m), st_model_labels(m));
        if (st_model_evaluate(m, rows, &sum, &hits) != ST_OK)
            status = runtime_error("eval");
    }
    if (status == EXIT_SUCCESS) {
        const double n = (double)test.count * st_dataset_labels_per_sample(&test);
        printf("eval %s: test_acc %.4f  test_loss %.4f", o->init_path, hits / n, sum / n);
        if (test.context)
            printf("  (%.4f bits per byte)", sum / n / M_LN2);
        printf("  on %u test samples\n", test.count);
    }
    st_model_destroy(m);
    st_arena_destroy(arena);
    st_dataset_free(&train);
    st_dataset_free(&test);
    return status;
}

/* subtrain export: the data gives the model its input and classes, and
 * the batches a batch norm's statistics are re-estimated on. */
static int run_export(st_cli_options *o)
{
    st_dataset train, test;
    if (load_data_for_model(o, &train, &test) != EXIT_SUCCESS)
        return EXIT_FAILURE;
    const int status = st_cli_export(o, &train);
    st_dataset_free(&train);
    st_dataset_free(&test);
    return status;
}

/* A line of the handler; the newline before it ends a progress bar's
 * line, which only training draws. */
static void say(const char *line, size_t len)
{
    const size_t skip = atomic_load(&phase) == PHASE_STARTING && line[0] == '\n';
    ssize_t w = write(STDERR_FILENO, line + skip, len - skip);
    (void)w;
}

static void on_signal(int sig)
{
    static const char saving[] = "\nsubtrain: SIGUSR1: a checkpoint at the next step, then "
                                 "on\n";
    if (sig == SIGUSR1 && usr1_checkpoints) {
        checkpoint_signal = 1;
        say(saving, sizeof saving - 1);
        return;
    }
    static const char sample[] = "\nsubtrain: stopping the sample\n";
    static const char end[] = "subtrain: stopping: the run's records and weights are "
                              "written\n";
    static const char again[] = "\nsubtrain: interrupted again: stopping now\n";
    static const char first[] = "\nsubtrain: stopping after the current step (interrupt again "
                                "to stop at once)\n";
    static const char early[] = "subtrain: stopping before training starts (interrupt again "
                                "to stop at once)\n";
    static const char done[] = "\nsubtrain: training is done: finishing its evaluation, "
                               "records and weights (interrupt again to stop at once)\n";
    atomic_fetch_add(&stops_seen, 1);
    int none = 0;
    const int is_first = atomic_compare_exchange_strong(&raised, &none, sig);
    if (is_first)
        stop_signal = sig;
    const int ph = atomic_load(&phase);
    if (ph >= PHASE_SAMPLING) {   /* nothing left to finish or save */
        if (ph == PHASE_SAMPLING)
            say(sample, sizeof sample - 1);
        else
            say(end, sizeof end - 1);
        _exit(128 + sig);
    }
    if (!is_first && sig == SIGINT) {
        if (atomic_load(&writing))
            unlink(writing_tmp);
        if (ph == PHASE_STARTING && atomic_load(&created))
            unlink(metrics_created);
        say(again, sizeof again - 1);
        _exit(128 + SIGINT);
    }
    if (is_first && ph == PHASE_TRAINED)
        say(done, sizeof done - 1);
    else if (is_first && ph == PHASE_TRAINING)
        say(first, sizeof first - 1);
    else if (is_first)
        say(early, sizeof early - 1);
}

/* The run's end, once its records and weights are written: the signal
 * that stopped it (0: none), and whether --sample draws (*draw).  The
 * phase first, then the signals (see on_signal): a signal the handler
 * took for the run's (no sample after the stop that ended training, or
 * after any when training ran to its end) is seen here, one it did not
 * ends the process at once. */
static int end_run(int interrupted, int sample, int *draw)
{
    atomic_store(&phase, sample ? PHASE_SAMPLING : PHASE_ENDED);
    const int sig = atomic_load(&raised);
    *draw = sample && atomic_load(&stops_seen) <= (interrupted ? 1 : 0);
    return sig;
}

/* SA_RESTART: a read or an open that a signal interrupts goes on (the
 * stop is taken between steps, or once the start-up's reading is done)
 * rather than failing with EINTR.  SIGXFSZ ignored: a write past a file
 * size limit fails (EFBIG) and is said, its temporary file removed,
 * rather than ending the run. */
static void install_stop_handlers(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    signal(SIGXFSZ, SIG_IGN);
}

/* The switch from starting to training: the phase first, then the signal
 * (see on_signal), so that a signal comes before it (the run ends without
 * training) or after it (the run stops after a step), never unseen
 * between.  Over ranks, each learns whether any was stopped, so that all
 * end alike.  *sig: the signal that stopped the start, 0 if none. */
static st_status begin_training(int *sig)
{
    atomic_store(&phase, PHASE_TRAINING);
    *sig = atomic_load(&raised);
    return st_world_max_ints(sig, 1);
}

static void ui_on_checkpoint(const char *path, uint64_t step, void *user)
{
    char line[4200];
    snprintf(line, sizeof line, "checkpoint: %s (step %llu)", path, (unsigned long long)step);
    st_progress_on_note(line, ((run_ui *)user)->prog);
}

/* --resume: the newest step checkpoint of the directory (or the file),
 * read whole; the library checks it against the run. */
static int open_resume(const st_cli_options *o, char *path, size_t len, st_safetensors *f)
{
    if (st_checkpoint_latest(o->resume_path, path, len) != ST_OK ||
        st_safetensors_read(path, f) != ST_OK)
        return runtime_error("--resume");
    if (!o->quiet)
        printf("resuming from %s (step %s)\n", path,
               st_safetensors_meta(f, "subtrain.step") ? st_safetensors_meta(f, "subtrain.step")
                                                       : "?");
    return EXIT_SUCCESS;
}

/* A metrics file open_metrics created, removed when the run ends before
 * its first record (a failed start leaves no file that says nothing), if
 * it is still the file created and empty. */
static void drop_unstarted_metrics(void)
{
    struct stat sb;
    if (atomic_exchange(&created, 0) && lstat(metrics_created, &sb) == 0 &&
        sb.st_dev == created_dev && sb.st_ino == created_ino && sb.st_size == 0)
        unlink(metrics_created);
}

/* A run that ends before its first record: its metrics file closed, and
 * a metrics file or checkpoint directory it made, still empty, removed. */
static void drop_unstarted_outputs(const st_cli_options *o, FILE *metrics)
{
    if (metrics)
        fclose(metrics);
    drop_unstarted_metrics();
    drop_empty_checkpoint_dir(o);
}

/* --metrics FILE, opened before the data loads so that a bad path is
 * said at once, not after it.  Opened non-blocking: a FIFO nobody reads
 * fails (ENXIO) instead of hanging the run; the writes block as usual.  A
 * regular file is probed with a byte written and taken back, which finds
 * a full disk or quota (a device such as /dev/full takes no probe: its
 * first record's write reports it, with the reason).  A resumed run
 * appends to the stopped run's records; a new run empties the file with
 * its first record (start_metrics), so that a run that fails before keeps
 * what the file held.  A new name, or a dangling link's target, is
 * created with O_EXCL, so that the file is surely this run's: removed if
 * the run ends before its first record (drop_unstarted_metrics, or the
 * handler before training). */
static int open_metrics(const st_cli_options *o, FILE **out)
{
    const char *path = o->metrics_path;
    const int flags = O_WRONLY | O_NONBLOCK | O_CLOEXEC | (o->resume_path ? O_APPEND : 0);
    struct stat lb, tb;
    int fd = -1, made = 0, fail = 0, is_new = 0;
    const int listed = lstat(path, &lb) == 0;
    if (!listed && errno == ENOENT)
        is_new = (size_t)snprintf(metrics_created, sizeof metrics_created, "%s", path) <
                 sizeof metrics_created;
    else if (listed && S_ISLNK(lb.st_mode) && stat(path, &tb) != 0 && errno == ENOENT)
        is_new = st_cli_dangling_target(path, metrics_created, sizeof metrics_created) == 0;
    if (is_new) {
        fd = open(metrics_created, flags | O_CREAT | O_EXCL, 0666);
        made = fd >= 0;
        fail = fd < 0 && errno != EEXIST ? errno : 0;   /* EEXIST: made meanwhile, opened */
    }
    if (made && fstat(fd, &tb) == 0) {
        created_dev = tb.st_dev;
        created_ino = tb.st_ino;
        atomic_store(&created, 1);
    }
    if (fd < 0 && !fail)
        fd = open(path, flags | O_CREAT, 0666);
    int err = fail ? fail : fd < 0 ? errno : 0;
    struct stat sb;
    if (!err && fstat(fd, &sb) != 0)
        err = errno;
    if (!err && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0)
        err = errno;
    if (!err && S_ISREG(sb.st_mode)) {
        off_t end = lseek(fd, 0, SEEK_END);
        if (end < 0 || pwrite(fd, "\n", 1, end) != 1 || ftruncate(fd, end) != 0)
            err = errno ? errno : EIO;
    }
    if (!err && !(*out = fdopen(fd, o->resume_path ? "a" : "w")))
        err = errno;
    if (err) {
        if (fd >= 0)
            close(fd);
        drop_unstarted_metrics();
        st_cli_error("subtrain", "cannot write the metrics file '%s': %s", ST_CLI_SHOW(path),
                     err == ENXIO && fd < 0 ? "a FIFO with no reader" : strerror(err));
        return EXIT_FAILURE;
    }
    return EXIT_SUCCESS;
}

/* A new run's metrics file: a regular file is emptied by the first
 * record (a device or a FIFO takes no truncation), so that a run that
 * fails before it (building its workers) keeps what the file held. */
static void start_metrics(const st_cli_options *o, FILE *metrics, st_progress *prog)
{
    struct stat sb;
    prog->metrics_replace = metrics && !o->resume_path && fstat(fileno(metrics), &sb) == 0 &&
                            S_ISREG(sb.st_mode);
}

/* --checkpoint DIR, before the data loads: made if missing, and a file
 * created in it and removed, so that a directory the run cannot write in
 * (a file, a read-only one) is said at once, not when the trained weights
 * are due. */
static int probe_checkpoint_dir(const char *dir)
{
    if (make_checkpoint_dir(dir) != EXIT_SUCCESS)
        return EXIT_FAILURE;
    char path[4200];
    snprintf(path, sizeof path, "%s/.subtrain-probe.%ld", dir, (long)getpid());
    const int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        const int e = errno;
        st_cli_error("subtrain", "--checkpoint %s: cannot write in it: %s", ST_CLI_SHOW(dir),
                     strerror(e));
        return EXIT_FAILURE;
    }
    close(fd);
    unlink(path);
    return EXIT_SUCCESS;
}

/* --checkpoint DIR holding step checkpoints is a run's: a new run there
 * would write over its same-numbered files, and --keep would count and
 * delete them.  Only a run resumed from a file in DIR goes on writing
 * there (resumed: the file resumed, else NULL).  0, or EXIT_USAGE said. */
static int check_checkpoint_owner(const char *dir, const char *resumed)
{
    char newest[4200];
    if (st_checkpoint_latest(dir, newest, sizeof newest) != ST_OK)
        return 0;   /* no step checkpoint there */
    if (resumed) {
        char *copy = strdup(resumed), *here = realpath(dir, NULL), *there = NULL;
        if (copy)
            there = realpath(dirname(copy), NULL);
        const int same = here && there && strcmp(here, there) == 0;
        free(copy);
        free(here);
        free(there);
        if (same)
            return 0;
    }
    const char *slash = strrchr(newest, '/');
    st_cli_error("subtrain", "--checkpoint %s holds another run's step checkpoints (%s, ...): "
                 "continue it with --resume %s, or name another directory", ST_CLI_SHOW(dir),
                 slash ? slash + 1 : newest, ST_CLI_SHOW(dir));
    return EXIT_USAGE;
}

/* Workers, a --cpuset, teams or a layout this machine cannot give are bad
 * usage (exit 2, as for `subtrain topo`), said before the data loads.  The
 * ranks agree on the verdict, and each ends with the worst code: an abort
 * would leave the exit status to whichever rank mpirun saw end first. */
static int check_placement(const st_cli_options *o)
{
    const st_status placed = st_train_placement_check(&o->train);
    int code = placed == ST_OK ? EXIT_SUCCESS
                               : placed == ST_ERR_INVALID ? EXIT_USAGE : EXIT_FAILURE;
    if (code != EXIT_SUCCESS)
        runtime_error("placement");
    const int n = st_world_size();
    int *all = n > 1 ? malloc((size_t)n * sizeof *all) : NULL;
    if (n > 1 && (!all || st_world_allgather(&code, sizeof code, all) != ST_OK)) {
        free(all);
        return -1;   /* no verdict: the caller aborts every rank */
    }
    for (int k = 0; k < n && all; k++)
        code = all[k] > code ? all[k] : code;
    free(all);
    return code;
}

static int run_train_rank(st_cli_options *o, st_cli_resume_options *ro);

/* Training, as one process or as a rank of an MPI job (mpirun, srun:
 * st_world_init starts MPI when a launcher started us).  Rank 0 alone
 * prints and writes the metrics; a rank that fails says so in one line
 * and ends every rank (MPI_Abort), so that none waits forever for it. */
static int run_train(st_cli_options *o)
{
    if (st_world_init(NULL, NULL) != ST_OK)
        return runtime_error("starting MPI");
    /* the options as given, before a rank other than 0 is silenced: every
     * rank compares the same list with a checkpoint's */
    st_cli_resume_options ro;
    int status = st_cli_resume_options_make(o, &ro) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
    o->train.options = ro.list;
    o->train.n_options = ro.n;
    if (st_world_rank() != 0) {
        o->quiet = 1;
        o->metrics_path = NULL;
        o->report_memory = 0;
    }
    int agreed = 0;   /* every rank ends with this status by itself */
    if (status == EXIT_SUCCESS) {
        status = check_placement(o);
        agreed = status > 0;
        status = status < 0 ? EXIT_FAILURE : status;
    }
    if (status == EXIT_SUCCESS)
        status = run_train_rank(o, &ro);
    if (!agreed && st_world_size() > 1 && status != EXIT_SUCCESS && status < 128)
        st_world_abort(status);   /* the failure is said; nobody waits for this rank */
    st_world_finalize();
    st_cli_resume_options_free(&ro);
    return status;
}

static int run_train_rank(st_cli_options *o, st_cli_resume_options *ro)
{
    /* from the start: a signal while the run starts ends it before
     * training (begin_training), with its exit status */
    usr1_checkpoints = o->usr1_checkpoint;
    install_stop_handlers();
    st_safetensors resume;
    memset(&resume, 0, sizeof resume);
    char resume_path[4096];
    if (o->resume_path) {
        if (open_resume(o, resume_path, sizeof resume_path, &resume) != EXIT_SUCCESS)
            return EXIT_FAILURE;
        o->train.resume = &resume;
        o->train.resume_name = resume_path;
        st_cli_resume_options_since(ro, &resume);
        o->train.n_options = ro->n;
    }
    /* what made the step checkpoints, in their metadata */
    run_provenance pv;
    describe_run(o, &pv);
    const st_safetensors_meta_entry ckpt_meta[3] = { { "subtrain.config", pv.config },
                                                   { "subtrain.data", o->data },
                                                   { "onednn.version", pv.onednn } };
    o->train.checkpoint.meta = ckpt_meta;
    o->train.checkpoint.n_meta = 3;
    FILE *metrics = NULL;
    if (o->checkpoint_dir && st_world_rank() == 0) {   /* rank 0 writes the files */
        int bad = probe_checkpoint_dir(o->checkpoint_dir);
        if (!bad)
            bad = check_checkpoint_owner(o->checkpoint_dir, o->resume_path ? resume_path : NULL);
        if (bad) {
            drop_unstarted_outputs(o, NULL);
            st_safetensors_free(&resume);
            return bad;
        }
    }
    if (o->metrics_path && open_metrics(o, &metrics) != EXIT_SUCCESS) {
        drop_unstarted_outputs(o, NULL);
        st_safetensors_free(&resume);
        return EXIT_FAILURE;
    }
    st_dataset train, test;
    if (load_data_for_model(o, &train, &test) != EXIT_SUCCESS) {
        drop_unstarted_outputs(o, metrics);
        st_safetensors_free(&resume);
        return EXIT_FAILURE;
    }
    float *init = NULL;
    if (o->init_path) {
        if (load_init(o, &init) != EXIT_SUCCESS) {
            drop_unstarted_outputs(o, metrics);
            free(init);
            st_dataset_free(&train);
            st_dataset_free(&test);
            return EXIT_FAILURE;
        }
        o->train.init_params = init;
    }

    int status = EXIT_FAILURE;
    st_progress prog;
    memset(&prog, 0, sizeof prog);
    st_cli_provenance prov;
    memset(&prov, 0, sizeof prov);
    run_ui ui = { .prog = &prog };
    prog.metrics = metrics;
    prog.metrics_path = o->metrics_path;
    train.augment = o->augment;   /* the training set only */
    train.augment.seed = o->train.seed;
    if (st_augment_check(&train.augment, &train) != ST_OK) {
        /* a usage error, found once the data's shape is known */
        st_cli_error("subtrain", "%s", st_last_error());
        status = EXIT_USAGE;
        goto out;
    }
    /* an image model's units are declared by its images' shape: its
     * options and layout are checked again now that the data gave it,
     * still usage errors */
    if (st_train_config_check(&o->train) != ST_OK) {
        st_cli_error("subtrain", "%s", st_last_error());
        status = EXIT_USAGE;
        goto out;
    }
    if (st_train_placement_check(&o->train) != ST_OK) {
        st_cli_error("subtrain", "placement: %s", st_last_error());
        status = EXIT_USAGE;
        goto out;
    }
    /* what made the run: the metrics' first record says it, the banner
     * takes the worker count from it */
    if (st_cli_provenance_make(o, &prov) != 0)
        goto out;
    /* a split is dealt from the labels over the run's workers: known now,
     * still a usage error */
    if (st_cli_provenance_split(&prov, o, &train) != 0) {
        status = EXIT_USAGE;
        goto out;
    }
    prog.provenance = &prov;
    int early;
    if (begin_training(&early) != ST_OK) {
        runtime_error("starting");
        goto out;
    }
    if (early) {   /* said by the handler when it came */
        status = 128 + early;
        goto out;
    }
    start_metrics(o, metrics, &prog);
    int tty = isatty(STDERR_FILENO);
    st_progress_mode mode = o->quiet ? ST_PROGRESS_NONE : o->progress;
    prog.bar = mode == ST_PROGRESS_BAR || (mode == ST_PROGRESS_AUTO && tty);
    prog.epoch_lines = mode != ST_PROGRESS_NONE;

    if (!o->quiet) {
        print_plan(o, &train, &test, prov.workers);
        const char *env = st_topology_binding_env_warning();
        if (env)
            st_cli_error("subtrain", "warning: %s", env);
    }
    prog.quiet = o->quiet;
    prog.report_memory = o->report_memory && !o->quiet;
    st_train_callbacks cb = { .on_step = ui_on_step, .on_epoch = ui_on_epoch,
                              .on_warning = ui_on_warning, .user = &ui,
                              .on_params = o->sample || o->checkpoint_dir ? ui_on_params
                                                                           : NULL,
                              .stop = &stop_signal,
                              .checkpoint_now = o->usr1_checkpoint ? &checkpoint_signal : NULL,
                              .on_checkpoint = ui_on_checkpoint };
    st_epoch_record final;
    if (st_train_run(&o->train, &train, &test, &cb, &final) != ST_OK) {
        fprintf(stderr, "%s", prog.bar_visible ? "\n" : "");
        runtime_error("training");
        goto out;
    }
    if (!o->quiet)
        print_summary(&final, o->train.dp.compress != ST_COMPRESS_NONE);
    if (final.interrupted && !o->quiet)
        printf("interrupted by signal %d after step %llu\n", (int)stop_signal,
               (unsigned long long)final.step);
    /* over ranks, rank 0 writes the final weights and samples (every rank
     * took part in gathering them: ui_on_params) */
    const int root = st_world_rank() == 0;
    fflush(stdout);   /* out before a second interrupt may end the write */
    int unwritten = root && o->checkpoint_dir && write_final_weights(o, &final, &ui) != 0;
    /* every rank after rank 0's write: one that ended at a signal before
     * (end_run) would end the job, and the write with it */
    if (st_world_max_ints(&unwritten, 1) != ST_OK) {
        runtime_error("finishing");
        goto out;
    }
    if (unwritten)   /* said by rank 0 */
        goto out;
    /* a signal after the last step (in the final evaluation or the
     * weights' write) found training whole: its records and weights are
     * written, the sample is not drawn, and the run exits as the signal
     * would have; one from here on ends the run at once */
    fflush(stdout);
    int draw;
    const int sig = end_run(final.interrupted, root && o->sample, &draw);
    if (sig && !final.interrupted && !o->quiet)
        printf("interrupted by signal %d after training%s\n", sig,
               o->sample ? ": no sample" : "");
    if (draw && print_sample(o, &final, &ui) != EXIT_SUCCESS)
        goto out;

    if (prog.metrics_failed)   /* said when it happened, with the reason */
        goto out;
    /* a run stopped by a signal exits as the signal would have, after
     * finishing its step, its records and its checkpoint */
    status = sig ? 128 + sig : EXIT_SUCCESS;
out:
    if (prog.metrics && fclose(prog.metrics) != 0 && status == EXIT_SUCCESS) {
        const int e = errno;
        st_cli_error("subtrain", "closing the metrics file '%s' failed: %s",
                     ST_CLI_SHOW(o->metrics_path), strerror(e));
        status = EXIT_FAILURE;
    }
    drop_unstarted_outputs(o, NULL);   /* closed above */
    st_cli_provenance_free(&prov);
    free(ui.params);
    free(init);
    st_dataset_free(&train);
    st_dataset_free(&test);
    st_safetensors_free(&resume);
    return status;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "topo") == 0)
        return st_cli_topo_main(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "quad") == 0)
        return st_cli_quad_main(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "plan") == 0)
        return st_cli_plan_main(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "calibrate") == 0)
        return st_cli_calibrate_main(argc - 1, argv + 1);
    st_cli_options o;
    char err[2048];
    int status = EXIT_SUCCESS;
    if (st_cli_parse(argc, argv, &o, err, sizeof err) != 0) {
        st_cli_error("subtrain", "%s", err);
        status = EXIT_USAGE;
    } else if (o.action == ST_CLI_HELP) {
        st_cli_print_help(stdout);
    } else if (o.action == ST_CLI_VERSION) {
        print_version();
    } else if (st_train_config_check(&o.train) != ST_OK) {
        /* Configuration errors found by the library (e.g. warmup longer
         * than the run) are usage errors too. */
        st_cli_error("subtrain", "%s", st_last_error());
        status = EXIT_USAGE;
    } else if (o.dump_config) {   /* checked: what it prints runs */
        st_cli_config_dump(stdout, &o);
        if (fflush(stdout) != 0 || ferror(stdout)) {
            fprintf(stderr, "subtrain: --dump-config: writing the configuration failed\n");
            status = EXIT_FAILURE;
        }
    } else {
        status = o.action == ST_CLI_EVAL     ? run_eval(&o)
                 : o.action == ST_CLI_EXPORT ? run_export(&o)
                                             : run_train(&o);
    }
    st_cli_options_free(&o);
    return status;
}

/*
 * train/checkpoint.c — a run's whole training state in a step checkpoint,
 * and a run resumed from one (doc/checkpoints.md).
 *
 * A step checkpoint is a weights file (ckpt/weights.c: a tensor per
 * parameter segment of the full model) with the training state after it:
 *
 *   train.optimizer.m.worker<k>   worker k's optimizer vectors, as it holds
 *   train.optimizer.v.worker<k>   them (a shard owner: its shard; a worker
 *                                 alone or an ist subnetwork: its own)
 *   train.state.worker<k>         worker k's model's running statistics,
 *                                 in its model's layout
 *   train.state.full              the averaged running statistics
 *   train.<strategy>.*            what the strategy adds (its save hook)
 *
 * and, in __metadata__, the position (epoch, steps done in it, step, the
 * epoch's loss sum as an exact hexadecimal float) and the run's
 * fingerprint, compared on resume so that a refusal names what differs:
 * the caller's options in its user's words ("subtrain.option.KEY"), and
 * what only the library knows ("subtrain.run.KEY": the workers of all
 * ranks, the data's sample counts and content fingerprints).
 *
 * Nothing else needs saving: every random draw is a function of the seed
 * and a counter (the epoch order and augmentation of (seed, epoch), sdp's
 * masks and ist's partitions of (seed, round), synth's noise of (seed,
 * epoch, position)), the schedule of the step, Adam's bias correction of
 * the step (or of ist's round step).
 *
 * Writing happens between steps with every worker waiting at a barrier,
 * so it may allocate (the tensor list, the JSON header): a checkpoint is
 * not a training step.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <subtrain/version.h>

#include <subtrain/world.h>

#include "core/error.h"
#include "train/strategy.h"

/* ------------------------------------------------------------ the builder */

#define OPTION_PREFIX "subtrain.option."

static st_status ckpt_init(run_ckpt *ck, int cap, const st_train_config *cfg)
{
    memset(ck, 0, sizeof *ck);
    ck->cap = cap;
    ck->cap_meta = 96 + cfg->n_options;
    ck->text_cap = 16384;
    for (int i = 0; i < cfg->n_options; i++)
        ck->text_cap += sizeof OPTION_PREFIX + strlen(cfg->options[i].key) +
                        strlen(cfg->options[i].value) + 1;
    ck->tensors = calloc((size_t)cap, sizeof *ck->tensors);
    ck->meta = calloc((size_t)ck->cap_meta, sizeof *ck->meta);
    ck->text = malloc(ck->text_cap);
    if (!ck->tensors || !ck->meta || !ck->text)
        return st_fail(ST_ERR_NOMEM, "out of memory for a checkpoint's header");
    return ST_OK;
}

static void ckpt_free(run_ckpt *ck)
{
    free(ck->tensors);
    free(ck->meta);
    free(ck->text);
}

/* A vector of count F32 or BF16 values. */
static st_status add_tensor(run_ckpt *ck, const char *name, st_dtype dtype, const void *data,
                            size_t count)
{
    if (ck->n == ck->cap)
        return st_fail(ST_ERR_INVALID, "a checkpoint of more than %d state tensors", ck->cap);
    st_safetensors_tensor *t = &ck->tensors[ck->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->ndims = 1;
    t->shape[0] = (int64_t)count;
    t->data = data;
    return ST_OK;
}

st_status st_run_ckpt_tensor(run_ckpt *ck, const char *name, const float *data, size_t count)
{
    return add_tensor(ck, name, ST_DTYPE_F32, data, count);
}

static size_t value_bytes(st_dtype dtype)
{
    return dtype == ST_DTYPE_BF16 ? sizeof(uint16_t) : sizeof(float);
}

/* Keys and values are copied into ck->text, which never moves: its
 * capacity is fixed (a checkpoint's metadata is some hundred bytes, the
 * caller's config line and its options). */
static const char *keep_text(run_ckpt *ck, const char *fmt, va_list ap)
{
    const size_t room = ck->text_cap - ck->text_used;
    int len = vsnprintf(ck->text + ck->text_used, room, fmt, ap);
    if (len < 0 || (size_t)len >= room)
        return NULL;
    const char *t = ck->text + ck->text_used;
    ck->text_used += (size_t)len + 1;
    return t;
}

static const char *keep_string(run_ckpt *ck, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const char *t = keep_text(ck, fmt, ap);
    va_end(ap);
    return t;
}

st_status st_run_ckpt_meta(run_ckpt *ck, const char *key, const char *fmt, ...)
{
    if (ck->n_meta == ck->cap_meta)
        return st_fail(ST_ERR_INVALID, "a checkpoint of more than %d metadata entries",
                       ck->cap_meta);
    const char *k = keep_string(ck, "%s", key);
    va_list ap;
    va_start(ap, fmt);
    const char *v = k ? keep_text(ck, fmt, ap) : NULL;
    va_end(ap);
    if (!v)
        return st_fail(ST_ERR_INVALID, "a checkpoint's metadata over %zu bytes", ck->text_cap);
    ck->meta[ck->n_meta++] = (st_safetensors_meta_entry){ k, v };
    return ST_OK;
}

/* ------------------------------------------------------------ the fingerprint */

/* What a resume compares: the caller's options (cfg->options, each
 * "subtrain.option.KEY") and what only the library knows, each
 * "subtrain.run.KEY": the workers of all ranks (a run of R ranks x n
 * workers is one of R x n, whatever the layout), the data's sample counts
 * and its content's fingerprints (computed once, before the first step). */
static st_status add_fingerprint(run_ckpt *ck, const run_shared *r)
{
    ST_TRY(st_run_ckpt_meta(ck, "subtrain.run.workers", "%d", r->n_all));
    ST_TRY(st_run_ckpt_meta(ck, "subtrain.run.train-samples", "%u", r->train->count));
    ST_TRY(st_run_ckpt_meta(ck, "subtrain.run.test-samples", "%u", r->test->count));
    ST_TRY(st_run_ckpt_meta(ck, "subtrain.run.train-data", "%016" PRIx64, r->data_print[0]));
    ST_TRY(st_run_ckpt_meta(ck, "subtrain.run.test-data", "%016" PRIx64, r->data_print[1]));
    ST_TRY(st_run_ckpt_meta(ck, "subtrain.run.optimizer-moments", "%s",
                            st_moments_name(r->cfg->optim.moments)));
    if (r->cfg->optim.master != ST_MASTER_FP32)   /* files without the key: fp32 */
        ST_TRY(st_run_ckpt_meta(ck, "subtrain.run.master-weights", "%s",
                                st_master_name(r->cfg->optim.master)));
    const st_train_config *c = r->cfg;
    for (int i = 0; i < c->n_options; i++) {
        char key[256];   /* keys are at most 200 bytes (st_train_config_check) */
        snprintf(key, sizeof key, OPTION_PREFIX "%s", c->options[i].key);
        ST_TRY(st_run_ckpt_meta(ck, key, "%s", c->options[i].value));
    }
    return ST_OK;
}

/* An option as its user gives it: "--lr 0.001", "--hidden default" (its
 * value ""), "no --lr" (value NULL: not recorded). */
static const char *option_words(const char *key, const char *value, char *buf, size_t n)
{
    if (!value)
        snprintf(buf, n, "no --%s", key);
    else
        snprintf(buf, n, "--%s %s", key, *value ? value : "default");
    return buf;
}

/* A difference between the file's option `key` (was) and this run's
 * (now), NULL where a side lacks it.  The one said is the first that
 * gives a value on both sides, else the first that gives the file's: a
 * run of --steps 20 resumed with --epochs 1 differs in both, and "its run
 * had --steps 20" says what to give. */
typedef struct option_diff {
    const char *key, *was, *now;
    int rank;   /* 2: a value on both sides; 1: on the file's */
} option_diff;

static void note_diff(option_diff *d, const char *key, const char *was, const char *now)
{
    const int rank = was && *was ? (now && *now ? 2 : 1) : 0;
    if (!d->key || rank > d->rank)
        *d = (option_diff){ key, was, now, rank };
}

static const char *run_option(const st_train_config *c, const char *key)
{
    for (int i = 0; i < c->n_options; i++)
        if (strcmp(c->options[i].key, key) == 0)
            return c->options[i].value;
    return NULL;
}

/* The file's options against this run's, both ways. */
static st_status check_options(const run_shared *r, const char *name)
{
    const st_train_config *c = r->cfg;
    const st_safetensors *f = c->resume;
    option_diff d = { 0 };
    for (int i = 0; i < c->n_options; i++) {
        char key[256];
        snprintf(key, sizeof key, OPTION_PREFIX "%s", c->options[i].key);
        const char *was = st_safetensors_meta(f, key);
        if (!was || strcmp(was, c->options[i].value) != 0)
            note_diff(&d, c->options[i].key, was, c->options[i].value);
    }
    const size_t len = strlen(OPTION_PREFIX);
    for (int j = 0; j < f->n_meta; j++) {
        const char *key = f->meta[j].key;
        if (strncmp(key, OPTION_PREFIX, len) == 0 && !run_option(c, key + len))
            note_diff(&d, key + len, f->meta[j].value, NULL);
    }
    if (!d.key)
        return ST_OK;
    char was[512], now[512];
    return st_fail(ST_ERR_INVALID, "%s: its run had %s, this one has %s: resume with the "
                   "options of the run that wrote it", name,
                   option_words(d.key, d.was, was, sizeof was),
                   option_words(d.key, d.now, now, sizeof now));
}

/* A "subtrain.run.KEY" entry of the file being resumed. */
static st_status run_meta(const run_shared *r, const char *name, const char *key,
                          const char **out)
{
    char full[64];
    snprintf(full, sizeof full, "subtrain.run.%s", key);
    *out = st_safetensors_meta(r->cfg->resume, full);
    if (!*out)
        return st_fail(ST_ERR_FORMAT, "%s: no '%s' in its metadata: not a step checkpoint",
                       name, full);
    return ST_OK;
}

/* The file's fingerprint against this run's: written by this version,
 * then the options, the workers, the data's size and content. */
static st_status check_fingerprint(const run_shared *r, const char *name)
{
    const st_safetensors *f = r->cfg->resume;
    if (!st_safetensors_meta(f, "subtrain.run.train-data")) {
        const char *v = st_safetensors_meta(f, "subtrain.version");
        return st_fail(ST_ERR_FORMAT, "%s: written by an earlier subtrain (version %s) that "
                       "recorded neither its run's options nor its data: resume it with that "
                       "version, or start from its weights with --init", name, v ? v : "unknown");
    }
    ST_TRY(check_options(r, name));
    const char *was;
    char now[64];
    ST_TRY(run_meta(r, name, "workers", &was));
    snprintf(now, sizeof now, "%d", r->n_all);
    if (strcmp(was, now) != 0) {
        char layout[64];
        if (r->ranks > 1)
            snprintf(layout, sizeof layout, "%d ranks x --workers %d", r->ranks, r->n);
        else
            snprintf(layout, sizeof layout, "--workers %d", r->n);
        return st_fail(ST_ERR_INVALID, "%s: its run had %s worker%s, this one has %d (%s): "
                       "resume with the options of the run that wrote it", name, was,
                       strcmp(was, "1") ? "s" : "", r->n_all, layout);
    }
    const char *train, *test;
    ST_TRY(run_meta(r, name, "train-samples", &train));
    ST_TRY(run_meta(r, name, "test-samples", &test));
    char train_now[16], test_now[16];
    snprintf(train_now, sizeof train_now, "%u", r->train->count);
    snprintf(test_now, sizeof test_now, "%u", r->test->count);
    if (strcmp(train, train_now) != 0 || strcmp(test, test_now) != 0)
        return st_fail(ST_ERR_INVALID, "%s: its run's data had %s training and %s test "
                       "samples, this one's %s and %s: resume with the data of the run that "
                       "wrote it", name, train, test, train_now, test_now);
    static const char *const set[2] = { "training", "test" };
    for (int k = 0; k < 2; k++) {
        ST_TRY(run_meta(r, name, k ? "test-data" : "train-data", &was));
        snprintf(now, sizeof now, "%016" PRIx64, r->data_print[k]);
        if (strcmp(was, now) != 0)
            return st_fail(ST_ERR_INVALID, "%s: its run's %s set had other content (its "
                           "fingerprint %s, this one's %s): resume with the data of the run "
                           "that wrote it", name, set[k], was, now);
    }
    /* The state's layout is refused, not converted, when it differs: a
     * resume continues the stopped run bitwise, and a rounded or widened
     * state would make another run (files without the key kept fp32). */
    was = st_safetensors_meta(r->cfg->resume, "subtrain.run.optimizer-moments");
    const char *moments = st_moments_name(r->cfg->optim.moments);
    if (strcmp(was ? was : "fp32", moments) != 0)
        return st_fail(ST_ERR_INVALID, "%s: its run kept the optimizer moments in %s, this one "
                       "in %s (--optimizer-moments): resume with the options of the run that "
                       "wrote it, or start from its weights with --init", name,
                       was ? was : "fp32", moments);
    was = st_safetensors_meta(r->cfg->resume, "subtrain.run.master-weights");
    const char *master = st_master_name(r->cfg->optim.master);
    if (strcmp(was ? was : "fp32", master) != 0)
        return st_fail(ST_ERR_INVALID, "%s: its run kept the master weights in %s, this one "
                       "in %s (--master-weights): resume with the options of the run that "
                       "wrote it, or start from its weights with --init", name,
                       was ? was : "fp32", master);
    return ST_OK;
}

/* ------------------------------------------------------------ writing */

static int cmp_step(const void *a, const void *b)
{
    const long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

static st_status add_position(run_ckpt *ck, const run_shared *r, const run_position *at)
{
    ST_TRY(st_run_ckpt_meta(ck, "subtrain.kind", "state"));
    ST_TRY(st_run_ckpt_meta(ck, "subtrain.epoch", "%d", at->epoch));
    ST_TRY(st_run_ckpt_meta(ck, "subtrain.epoch_step", "%" PRIu64, at->epoch_step));
    ST_TRY(st_run_ckpt_meta(ck, "subtrain.step", "%" PRIu64, at->step));
    /* exact: the resumed epoch's mean loss continues bit for bit */
    ST_TRY(st_run_ckpt_meta(ck, "subtrain.loss_sum", "%a", at->loss_sum));
    ST_TRY(st_run_ckpt_meta(ck, "subtrain.losses", "%" PRIu64, at->losses));
    ST_TRY(st_run_ckpt_meta(ck, "subtrain.train_time", "%a", at->train_time));
    /* a resume on another ISA is warned of (st_loop_report_warnings): its
     * kernels sum in another order */
    ST_TRY(st_run_ckpt_meta(ck, "subtrain.onednn_isa", "%s", st_cpu_isa_name()));
    return add_fingerprint(ck, r);
}

/* Every worker's vectors, as the slots publish them, named by the
 * workers' global indices. */
static st_status add_workers(run_ckpt *ck, run_shared *r)
{
    char name[ST_SAFETENSORS_MAX_NAME];
    for (int k = 0; k < r->n; k++) {
        const st_optim *o = r->slots[k].optim;
        const int g = st_run_global(r, k);
        /* a bf16 state as it is, BF16: a resume continues from its bits */
        const void *m = o->m ? (const void *)o->m : (const void *)o->m16;
        const void *v = o->v ? (const void *)o->v : (const void *)o->v16;
        const st_dtype dtype = o->m16 ? ST_DTYPE_BF16 : ST_DTYPE_F32;
        if (m) {
            snprintf(name, sizeof name, "train.optimizer.m.worker%d", g);
            ST_TRY(add_tensor(ck, name, dtype, m, o->n));
        }
        if (v) {
            snprintf(name, sizeof name, "train.optimizer.v.worker%d", g);
            ST_TRY(add_tensor(ck, name, dtype, v, o->n));
        }
        size_t count = 0;
        const float *state = r->slots[k].model ? st_model_state(r->slots[k].model, &count)
                                               : NULL;
        if (count) {
            snprintf(name, sizeof name, "train.state.worker%d", g);
            ST_TRY(st_run_ckpt_tensor(ck, name, state, count));
        }
    }
    if (r->state_full)
        ST_TRY(st_run_ckpt_tensor(ck, "train.state.full", r->state_full, r->n_state));
    return ST_OK;
}

/* One pass over the directory after a write: the newest `keep` step
 * files stay (0: all), and what writers killed mid-write left,
 * "step-*.safetensors.tmp.PID" of a process that is gone, goes (a live
 * PID may be another run writing into the same directory).  Steps are
 * collected first: readdir's order is not theirs. */
static void tidy(const char *dir, int keep)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    long long *steps = NULL;
    size_t n = 0, cap = 0;
    int listed = 1;   /* every step file is in steps (else nothing is pruned) */
    char path[4096], name[64];
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        const long long step = st_checkpoint_step_of(e->d_name);
        /* only the names this writer makes: pruning unlinks by the step */
        snprintf(name, sizeof name, "step-%08lld.safetensors", step);
        if (step >= 0 && keep > 0 && listed && strcmp(name, e->d_name) == 0) {
            if (n == cap) {
                long long *grown = realloc(steps, (cap = cap ? 2 * cap : 64) * sizeof *steps);
                listed = grown != NULL;   /* out of memory: the next write prunes */
                if (grown)
                    steps = grown;
            }
            if (listed)
                steps[n++] = step;
        }
        if (step >= 0 || strncmp(e->d_name, "step-", 5) != 0 ||
            !st_safetensors_dead_tmp(e->d_name, NULL))
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    if (keep > 0 && listed && n > (size_t)keep) {
        qsort(steps, n, sizeof *steps, cmp_step);
        for (size_t i = 0; i + (size_t)keep < n; i++) {
            snprintf(path, sizeof path, "%s/step-%08lld.safetensors", dir, steps[i]);
            unlink(path);
        }
    }
    free(steps);
}

/* Over ranks: rank 0 receives every other rank's tensors, and keeps those
 * it lacks (its workers' are its own; what every rank holds alike, such as
 * the averaged running statistics, it has already).  What it receives
 * lives in *held (n_held buffers) until the file is written. */
typedef struct tensor_header {
    char name[ST_SAFETENSORS_MAX_NAME];
    uint64_t count;
    uint32_t dtype;
} tensor_header;

static int has_tensor(const run_ckpt *ck, const char *name)
{
    for (int i = 0; i < ck->n; i++)
        if (strcmp(ck->tensors[i].name, name) == 0)
            return 1;
    return 0;
}

static st_status gather_tensors(const run_shared *r, run_ckpt *ck, void ***held, int *n_held)
{
    if (r->rank != 0) {
        uint64_t n = (uint64_t)ck->n;
        ST_TRY(st_world_send(&n, sizeof n, 0));
        for (int i = 0; i < ck->n; i++) {
            tensor_header h;
            memset(&h, 0, sizeof h);
            snprintf(h.name, sizeof h.name, "%s", ck->tensors[i].name);
            h.count = (uint64_t)ck->tensors[i].shape[0];
            h.dtype = (uint32_t)ck->tensors[i].dtype;
            ST_TRY(st_world_send(&h, sizeof h, 0));
            ST_TRY(st_world_send(ck->tensors[i].data, h.count * value_bytes(h.dtype), 0));
        }
        return ST_OK;
    }
    for (int from = 1; from < r->ranks; from++) {
        uint64_t n;
        ST_TRY(st_world_recv(&n, sizeof n, from));
        for (uint64_t i = 0; i < n; i++) {
            tensor_header h;
            ST_TRY(st_world_recv(&h, sizeof h, from));
            h.name[sizeof h.name - 1] = '\0';
            const st_dtype dtype = h.dtype == ST_DTYPE_BF16 ? ST_DTYPE_BF16 : ST_DTYPE_F32;
            const size_t bytes = h.count * value_bytes(dtype);
            void **grown = realloc(*held, sizeof **held * (size_t)(*n_held + 1));
            void *buf = grown ? malloc(bytes ? bytes : 1) : NULL;
            if (grown)
                *held = grown;
            if (!buf)
                return st_fail(ST_ERR_NOMEM, "out of memory for rank %d's checkpoint tensors",
                               from);
            (*held)[(*n_held)++] = buf;
            ST_TRY(st_world_recv(buf, bytes, from));
            if (!has_tensor(ck, h.name))
                ST_TRY(add_tensor(ck, h.name, dtype, buf, h.count));
        }
    }
    return ST_OK;
}

/* The step's weights and state are finite, or the run diverged: a file
 * holding a NaN or an infinity is one no resume takes (the reader refuses
 * it), and with --keep it would have pushed out the last good one. */
static st_status state_finite(const run_ckpt *ck, const float *params, size_t count,
                              uint64_t step)
{
    st_safetensors_tensor weights = { .name = "weights", .dtype = ST_DTYPE_F32, .ndims = 1,
                                      .shape = { (int64_t)count }, .data = params };
    const st_safetensors_tensor *t = &weights;
    size_t k;
    const char *what;
    int i = st_safetensors_first_not_finite(&weights, 1, &k, &what);
    if (i == 1) {
        i = st_safetensors_first_not_finite(ck->tensors, ck->n, &k, &what);
        if (i == ck->n)
            return ST_OK;
        t = &ck->tensors[i];
    }
    char where[ST_SAFETENSORS_MAX_NAME + 32];
    if (t == &weights)
        snprintf(where, sizeof where, "the weights hold %s", what);
    else
        snprintf(where, sizeof where, "'%s' holds %s", t->name, what);
    return st_fail(ST_ERR_NUMERIC, "after step %llu %s (element %zu): training diverged; try "
                   "a smaller --lr (no step checkpoint written for it)",
                   (unsigned long long)step, where, k);
}

st_status st_run_checkpoint_write(run_shared *r, st_worker *w0, const run_position *at,
                                  uint64_t step)
{
    const st_checkpoint_plan *plan = &r->cfg->checkpoint;
    const int root = r->rank == 0;   /* over ranks, rank 0 writes the one file */
    if (root && mkdir(plan->dir, 0755) != 0 && errno != EEXIST)
        return st_fail(ST_ERR_IO, "checkpoint directory %s: %s", plan->dir, strerror(errno));
    size_t count;
    const float *params;
    ST_TRY(r->ops->full_params(r, r->strategy, w0, &params, &count));
    run_ckpt ck;
    void **held = NULL;
    int n_held = 0;
    /* per worker: optimizer m and v, running statistics, and two
     * tensors of the strategy's own (ist's kept state shards) */
    st_status s = ckpt_init(&ck, 5 * r->n_all + 16, r->cfg);
    for (int i = 0; s == ST_OK && i < plan->n_meta; i++)
        s = st_run_ckpt_meta(&ck, plan->meta[i].key, "%s", plan->meta[i].value);
    if (s == ST_OK)
        s = add_position(&ck, r, at);
    if (s == ST_OK)
        s = add_workers(&ck, r);
    if (s == ST_OK && r->ops->save)
        s = r->ops->save(r, r->strategy, &ck);
    if (s == ST_OK && r->ranks > 1)
        s = gather_tensors(r, &ck, &held, &n_held);
    char path[4096];
    snprintf(path, sizeof path, "%s/step-%08" PRIu64 ".safetensors", plan->dir, step);
    st_model_config mc = r->cfg->model;
    memset(&mc.subnet, 0, sizeof mc.subnet);
    if (s == ST_OK && root)
        s = state_finite(&ck, params, count, step);
    if (s == ST_OK && root)
        s = st_checkpoint_write(path, &mc, params, ck.tensors, ck.n, ck.meta, ck.n_meta);
    ckpt_free(&ck);
    st_run_master_full_done(r);
    for (int i = 0; i < n_held; i++)
        free(held[i]);
    free(held);
    ST_TRY(s);
    if (!root)
        return ST_OK;
    tidy(plan->dir, plan->keep);
    if (r->cb && r->cb->on_checkpoint)
        r->cb->on_checkpoint(path, step, r->cb->user);
    return ST_OK;
}

/* ------------------------------------------------------------ resuming */

st_status st_run_resume_meta_u64(const run_shared *r, const char *key, uint64_t *out)
{
    const char *v = st_safetensors_meta(r->cfg->resume, key);
    char *end;
    errno = 0;
    unsigned long long x = v ? strtoull(v, &end, 10) : 0;
    if (!v || end == v || *end || errno)
        return st_fail(ST_ERR_FORMAT, "%s: no valid '%s' in its metadata: not a step checkpoint",
                       r->cfg->resume_name, key);
    *out = x;
    return ST_OK;
}

st_status st_run_resume_meta_steps(const run_shared *r, const char *key, uint64_t *out)
{
    ST_TRY(st_run_resume_meta_u64(r, key, out));
    const uint64_t steps = r->resume->at.step;
    if (*out > steps)
        return st_fail(ST_ERR_FORMAT, "%s: '%s' is %llu in its metadata, more than the %llu "
                       "steps its run had taken", r->resume->name, key,
                       (unsigned long long)*out, (unsigned long long)steps);
    return ST_OK;
}

/* A sum or a time: a finite number, not below zero unless `signed_`. */
static st_status meta_double(const run_shared *r, const char *key, int signed_, double *out)
{
    const char *v = st_safetensors_meta(r->cfg->resume, key);
    char *end;
    double x = v ? strtod(v, &end) : 0.0;
    if (!v || end == v || *end)
        return st_fail(ST_ERR_FORMAT, "%s: no valid '%s' in its metadata: not a step checkpoint",
                       r->cfg->resume_name, key);
    if (!isfinite(x) || (!signed_ && x < 0.0))
        return st_fail(ST_ERR_FORMAT, "%s: '%s' is %s in its metadata, not a finite number%s",
                       r->cfg->resume_name, key, v, signed_ ? "" : " of 0 or more");
    *out = x;
    return ST_OK;
}

st_status st_run_resume_load(const run_shared *r, const char *name, float *dst, size_t count)
{
    const st_safetensors_tensor *t = st_safetensors_find(r->cfg->resume, name);
    if (!t)
        return st_fail(ST_ERR_FORMAT, "%s: no tensor '%s': not a step checkpoint of this run",
                       r->cfg->resume_name, name);
    if (t->dtype != ST_DTYPE_F32 || t->bytes != count * sizeof(float))
        return st_fail(ST_ERR_FORMAT, "%s: tensor '%s' is not F32 of %zu elements, as this run "
                       "holds it", r->cfg->resume_name, name, count);
    memcpy(dst, t->data, count * sizeof *dst);   /* the file's data may be unaligned */
    return ST_OK;
}

void st_run_resume_shard(const run_shared *r, st_comm *c, int wid, float *dst)
{
    if (r->shared_weights)
        return;
    const st_range shard = st_comm_shard(c, wid);
    memcpy(dst, r->resume->params + shard.begin, (shard.end - shard.begin) * sizeof *dst);
}

void st_run_resume_master(const run_shared *r, st_comm *c, st_worker *w)
{
    if (r->shared_weights)
        return;
    float *dst = st_comm_shard_params(c, w->id);
    if (!w->storage.copies_master) {
        st_run_resume_shard(r, c, w->id, dst);
        return;
    }
    const st_range shard = st_comm_shard(c, w->id);
    int n;
    const st_param_copy *cp = st_model_copies(w->model, &n);
    size_t at = shard.begin;   /* the copies are sorted and disjoint */
    for (int i = 0; i <= n && at < shard.end; i++) {
        const size_t lo = i < n ? cp[i].offset : shard.end, hi = i < n ? lo + cp[i].count : lo;
        const size_t to = lo < shard.end ? lo : shard.end;
        if (to > at)
            memcpy(dst + (at - shard.begin), r->resume->params + at, (to - at) * sizeof *dst);
        at = hi > at ? hi : at;
    }
}

st_status st_run_resume_open(run_shared *r)
{
    const st_train_config *cfg = r->cfg;
    if (cfg->checkpoint.dir || cfg->resume) {
        r->data_print[0] = st_dataset_fingerprint(r->train);
        r->data_print[1] = st_dataset_fingerprint(r->test);
    }
    if (!cfg->resume)
        return ST_OK;
    const char *name = cfg->resume_name ? cfg->resume_name : "the checkpoint";
    const char *kind = st_safetensors_meta(cfg->resume, "subtrain.kind");
    if (!kind || strcmp(kind, "state") != 0)
        return st_fail(ST_ERR_INVALID, "%s holds weights only, not a training state: --resume "
                       "takes a step checkpoint (DIR/step-*.safetensors); --init starts from "
                       "weights", name);
    ST_TRY(check_fingerprint(r, name));
    run_resume *rs = calloc(1, sizeof *rs);
    if (!rs)
        return st_fail(ST_ERR_NOMEM, "out of memory resuming %s", name);
    r->resume = rs;
    rs->file = cfg->resume;
    rs->name = name;
    uint64_t epoch;
    ST_TRY(st_run_resume_meta_u64(r, "subtrain.epoch", &epoch));
    ST_TRY(st_run_resume_meta_u64(r, "subtrain.epoch_step", &rs->at.epoch_step));
    ST_TRY(st_run_resume_meta_u64(r, "subtrain.step", &rs->at.step));
    ST_TRY(meta_double(r, "subtrain.loss_sum", 1, &rs->at.loss_sum));
    ST_TRY(st_run_resume_meta_u64(r, "subtrain.losses", &rs->at.losses));
    ST_TRY(meta_double(r, "subtrain.train_time", 0, &rs->at.train_time));
    if (epoch < 1 || epoch > 1000000)
        return st_fail(ST_ERR_FORMAT, "%s: epoch %llu in its metadata", name,
                       (unsigned long long)epoch);
    rs->at.epoch = (int)epoch;
    rs->params = malloc((r->n_params ? r->n_params : 1) * sizeof *rs->params);
    if (!rs->params)
        return st_fail(ST_ERR_NOMEM, "out of memory for %zu parameters resuming %s",
                       r->n_params, name);
    st_model_config mc = cfg->model;
    memset(&mc.subnet, 0, sizeof mc.subnet);
    ST_TRY(st_checkpoint_load_weights(cfg->resume, name, &mc, rs->params));
    if (r->state_full)
        ST_TRY(st_run_resume_load(r, "train.state.full", r->state_full, r->n_state));
    return ST_OK;
}

st_status st_run_resume_check_position(const run_shared *r)
{
    const run_resume *rs = r->resume;
    if (!rs)
        return ST_OK;
    const run_plan *p = &r->plan;
    const run_position *at = &rs->at;
    /* (1, 0, 0): the plan's start, which a checkpoint of an apart phase
     * (synth's segment epochs, strategy.h) records, whatever the plan */
    if (at->epoch == 1 && at->epoch_step == 0 && at->step == 0 && at->losses == 0)
        return ST_OK;
    if (at->epoch > p->epochs || at->epoch_step >= p->steps_per_epoch ||
        at->step != (uint64_t)(at->epoch - 1) * p->steps_per_epoch + at->epoch_step ||
        at->step >= p->total_steps || at->losses != at->epoch_step)
        return st_fail(ST_ERR_FORMAT, "%s: its position (epoch %d, step %llu of the epoch, "
                       "step %llu) is not one of this run of %llu steps", rs->name, at->epoch,
                       (unsigned long long)at->epoch_step, (unsigned long long)at->step,
                       (unsigned long long)p->total_steps);
    return ST_OK;
}

void st_run_resume_close(run_shared *r)
{
    if (!r->resume)
        return;
    free(r->resume->params);
    free(r->resume);
    r->resume = NULL;
}

/* A bf16 state vector of the file being resumed into dst, checked:
 * BF16, count elements. */
static st_status resume_load_bf16(const run_shared *r, const char *name, uint16_t *dst,
                                  size_t count)
{
    const st_safetensors_tensor *t = st_safetensors_find(r->cfg->resume, name);
    if (!t)
        return st_fail(ST_ERR_FORMAT, "%s: no tensor '%s': not a step checkpoint of this run",
                       r->cfg->resume_name, name);
    if (t->dtype != ST_DTYPE_BF16 || t->bytes != count * sizeof *dst)
        return st_fail(ST_ERR_FORMAT, "%s: tensor '%s' is not BF16 of %zu elements, as this "
                       "run holds it", r->cfg->resume_name, name, count);
    memcpy(dst, t->data, count * sizeof *dst);
    return ST_OK;
}

st_status st_run_resume_optimizer(run_shared *r, st_worker *w)
{
    char name[ST_SAFETENSORS_MAX_NAME];
    static const char *const which[2] = { "m", "v" };
    float *const f32[2] = { w->optim.m, w->optim.v };
    uint16_t *const b16[2] = { w->optim.m16, w->optim.v16 };
    for (int k = 0; k < 2; k++) {
        snprintf(name, sizeof name, "train.optimizer.%s.worker%d", which[k],
                 st_run_global(r, w->id));
        if (f32[k])
            ST_TRY(st_run_resume_load(r, name, f32[k], w->optim.n));
        else if (b16[k])
            ST_TRY(resume_load_bf16(r, name, b16[k], w->optim.n));
    }
    return ST_OK;
}

st_status st_run_resume_model(run_shared *r, st_worker *w)
{
    char name[ST_SAFETENSORS_MAX_NAME];
    /* w's part of its domain's copy, then a barrier; a bf16 master's
     * values into the copies */
    if (r->shared_weights || w->storage.copies_master)
        ST_TRY(st_run_weights_load(r, w, r->resume->params));
    else
        ST_TRY(st_model_load_full_params(w->model, r->resume->params));
    ST_TRY(st_run_resume_optimizer(r, w));
    size_t count;
    float *state = st_model_state(w->model, &count);
    if (count) {
        snprintf(name, sizeof name, "train.state.worker%d", st_run_global(r, w->id));
        ST_TRY(st_run_resume_load(r, name, state, count));
    }
    return ST_OK;
}

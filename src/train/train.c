/*
 * train/train.c — the training loop: one worker, epochs of shuffled batches,
 * an optimizer step per batch, evaluation on the test set after each epoch.
 *
 * The loop runs inside an OpenMP parallel region of one thread per worker
 * (here: one).  Why a region even for one worker: oneDNN's OpenMP runtime
 * runs a primitive with the calling thread's nthreads-var, so the worker sets
 * it to 1 on its own thread, and its primitives are created and executed on
 * the thread that will own them, as every worker will when there are many.
 */
#include <omp.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "train/worker.h"

st_train_config st_train_config_default(void)
{
    st_train_config c = {
        .model = st_model_config_default(),
        .optim = st_optim_config_default(),
        .schedule = ST_SCHED_WARMUP_COSINE,
        .warmup_steps = ST_WARMUP_AUTO,
        .batch = 128,
        .epochs = 5,
        .steps = 0,
        .seed = 1,
    };
    return c;
}

st_status st_train_config_check(const st_train_config *c)
{
    ST_TRY(st_model_config_check(&c->model));
    ST_TRY(st_optim_config_check(&c->optim));
    if (c->batch < 1 || c->batch > 65536)
        return st_fail(ST_ERR_INVALID, "batch must be in [1, 65536], got %d", c->batch);
    if (c->steps == 0 && (c->epochs < 1 || c->epochs > 100000))
        return st_fail(ST_ERR_INVALID, "epochs must be in [1, 100000], got %d", c->epochs);
    if (c->schedule == ST_SCHED_WARMUP_COSINE && c->warmup_steps != ST_WARMUP_AUTO &&
        c->steps && c->warmup_steps >= c->steps)
        return st_fail(ST_ERR_INVALID, "warmup (%llu steps) must be shorter than the run (%llu steps)",
                       (unsigned long long)c->warmup_steps, (unsigned long long)c->steps);
    return ST_OK;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* What the loop needs besides the config, fixed before the first step. */
typedef struct run_plan {
    uint64_t steps_per_epoch;
    uint64_t total_steps;
    int epochs;             /* epochs started, the last possibly partial */
    st_schedule schedule;
} run_plan;

static st_status make_plan(const st_train_config *cfg, const st_dataset *train, run_plan *p)
{
    p->steps_per_epoch = train->count / (uint32_t)cfg->batch;
    if (p->steps_per_epoch == 0)
        return st_fail(ST_ERR_INVALID, "batch %d is larger than the training set (%u samples)",
                       cfg->batch, train->count);
    p->total_steps = cfg->steps ? cfg->steps : (uint64_t)cfg->epochs * p->steps_per_epoch;
    p->epochs = (int)((p->total_steps + p->steps_per_epoch - 1) / p->steps_per_epoch);
    uint64_t warmup = cfg->warmup_steps == ST_WARMUP_AUTO ? p->total_steps / 20 : cfg->warmup_steps;
    if (cfg->schedule == ST_SCHED_WARMUP_COSINE && warmup >= p->total_steps)
        return st_fail(ST_ERR_INVALID, "warmup (%llu steps) must be shorter than the run (%llu steps)",
                       (unsigned long long)warmup, (unsigned long long)p->total_steps);
    p->schedule = (st_schedule){ cfg->schedule, cfg->optim.lr, warmup, p->total_steps };
    return ST_OK;
}

static st_status run_worker(st_worker *w, const st_train_config *cfg, const st_dataset *train,
                            const st_dataset *test, const st_train_callbacks *cb,
                            const run_plan *p, st_epoch_record *final_out)
{
    const int B = cfg->batch;
    const double t0 = now_s();
    double train_time = 0.0;
    uint64_t step = 0;
    st_epoch_record rec;
    memset(&rec, 0, sizeof rec);

    for (int epoch = 1; epoch <= p->epochs; epoch++) {
        st_epoch_order(cfg->seed, (uint64_t)epoch - 1, w->order, train->count);
        double loss_sum = 0.0, te = now_s();
        uint64_t n = 0;
        float lr = 0.0f;
        for (uint64_t i = 0; i < p->steps_per_epoch && step < p->total_steps; i++, n++) {
            float loss;
            step++;
            ST_TRY(st_worker_train_step(w, train, w->order, (uint32_t)(i * (uint64_t)B),
                                         &p->schedule, step, &loss, &lr));
            loss_sum += loss;
            if (cb && cb->on_step) {
                double now = now_s(), trained = train_time + (now - te);
                st_step_info info = {
                    step, p->total_steps, epoch, loss, lr,
                    (double)step * B / trained, now - t0,
                    trained / (double)step * (double)(p->total_steps - step),
                };
                cb->on_step(&info, cb->user);
            }
        }
        double epoch_time = now_s() - te;
        train_time += epoch_time;

        rec.epoch = epoch;
        rec.step = step;
        rec.train_loss = loss_sum / (double)n;
        rec.samples_per_s = (double)n * B / epoch_time;
        rec.lr = lr;
        rec.workers = 1;
        ST_TRY(st_worker_evaluate(w, test, &rec.test_loss, &rec.test_acc));
        rec.wall_s = now_s() - t0;
        rec.memory = w->arena.stats;
        if (cb && cb->on_epoch)
            cb->on_epoch(&rec, cb->user);
    }
    rec.final = 1;
    rec.samples_per_s = (double)step * B / train_time;
    if (cb && cb->on_epoch)
        cb->on_epoch(&rec, cb->user);
    if (final_out)
        *final_out = rec;
    return ST_OK;
}

st_status st_train_run(const st_train_config *cfg, const st_dataset *train,
                       const st_dataset *test, const st_train_callbacks *cb,
                       st_epoch_record *final_out)
{
    ST_TRY(st_train_config_check(cfg));
    if (train->dim != (uint32_t)cfg->model.in_dim || test->dim != train->dim)
        return st_fail(ST_ERR_INVALID, "the model takes %d inputs but the data has %u (train) "
                       "and %u (test) features", cfg->model.in_dim, train->dim, test->dim);
    if (train->n_classes != (uint32_t)cfg->model.n_classes)
        return st_fail(ST_ERR_INVALID, "the model has %d classes but the data has %u",
                       cfg->model.n_classes, train->n_classes);
    run_plan plan;
    ST_TRY(make_plan(cfg, train, &plan));

    st_status status = ST_OK;
    /* One thread per worker.  With one worker the team's only thread is
     * the caller's, so the thread-local error message reaches the caller. */
#pragma omp parallel num_threads(1)
    {
        omp_set_num_threads(1); /* this worker's primitives: one thread */
        st_worker w;
        status = st_worker_init(&w, omp_get_thread_num(), cfg, train->count);
        if (status == ST_OK)
            status = run_worker(&w, cfg, train, test, cb, &plan, final_out);
        st_worker_destroy(&w);
    }
    return status;
}

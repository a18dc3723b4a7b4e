/*
 * examples/train_synthetic.c — libsubtrain from another program.
 *
 * Generates the seeded synthetic dataset, trains a small model for 200
 * steps with one worker, and prints the final test metrics.  It uses the
 * installed API only; build it with pkg-config:
 *
 *   cc -o train_synthetic train_synthetic.c $(pkg-config --cflags --libs subtrain)
 *   ./train_synthetic [mlp|resmlp]
 *
 * Exit status: 0 on success, 1 when something failed, 2 for a bad argument.
 */
#include <stdio.h>
#include <string.h>

#include <subtrain/subtrain.h>

static void on_warning(const char *message, void *user)
{
    (void)user;
    fprintf(stderr, "train_synthetic: warning: %s\n", message);
}

int main(int argc, char **argv)
{
    /* The headers this program was compiled with, and the library it runs
     * with: they may differ when the library was upgraded in place. */
    printf("subtrain %s (headers %s, 0x%06x)\n", st_version(), SUBTRAIN_VERSION,
           (unsigned)SUBTRAIN_VERSION_NUMBER);
    if (strcmp(st_version(), SUBTRAIN_VERSION) != 0)
        fprintf(stderr, "train_synthetic: note: compiled with subtrain %s, running %s\n",
                SUBTRAIN_VERSION, st_version());

    st_train_config cfg = st_train_config_default();
    if (argc > 2) {
        fprintf(stderr, "usage: train_synthetic [mlp|resmlp]\n");
        return 2;
    }
    if (argc == 2 && st_model_kind_parse(argv[1], &cfg.model.kind) != ST_OK) {
        fprintf(stderr, "train_synthetic: %s\n", st_last_error());
        return 2;
    }

    /* Half the default task: 8192 training samples, 1024 test. */
    st_synthetic_config sc = st_synthetic_defaults(1);
    sc.train_count = 8192;
    sc.test_count = 1024;
    st_dataset train, test;
    if (st_synthetic_make(&sc, &train, &test) != ST_OK) {
        fprintf(stderr, "train_synthetic: synthetic data: %s\n", st_last_error());
        return 1;
    }
    float mean, std;
    st_dataset_normalize(&train, &test, &mean, &std);

    /* A small model, one data-parallel worker, 200 steps of AdamW. */
    cfg.model.in_dim = (int)train.dim;
    cfg.model.n_classes = (int)train.n_classes;
    cfg.model.depth = 2;
    cfg.model.width = 64;
    cfg.batch = 64;
    cfg.epochs = 0;
    cfg.steps = 200;
    cfg.workers = 1;

    st_train_callbacks cb = { .on_warning = on_warning };
    st_epoch_record final;
    st_status s = st_train_run(&cfg, &train, &test, &cb, &final);
    if (s == ST_OK)
        printf("%s depth %d width %d, %s, %llu steps: train loss %.4f, test loss %.4f, "
               "test accuracy %.4f\n",
               st_model_kind_name(cfg.model.kind), cfg.model.depth, cfg.model.width,
               st_strategy_name(cfg.strategy), (unsigned long long)final.step, final.train_loss,
               final.test_loss, final.test_acc);
    else
        fprintf(stderr, "train_synthetic: training: %s (%s)\n", st_last_error(),
                st_status_name(s));
    st_dataset_free(&train);
    st_dataset_free(&test);
    return s == ST_OK ? 0 : 1;
}

/* cli/run_data.c — the data a run's options name, loaded and normalised,
 * and the model's input and classes taken from it: what training, and
 * the plan of a run, start from. */
#include <stdio.h>

#include <subtrain/subtrain.h>

#include "cli/run_data.h"

/* values = 0: an IDX set's samples (Fashion-MNIST's included) without
 * their values, x NULL (the other kinds have theirs). */
static st_status load_data(const st_cli_options *o, int values, st_dataset *train,
                           st_dataset *test)
{
    const st_cli_data *d = &o->data_spec;
    switch (d->kind) {
    case ST_CLI_DATA_SYNTHETIC: {
        st_synthetic_config sc = st_synthetic_defaults(o->train.seed);
        return st_synthetic_make(&sc, train, test);
    }
    case ST_CLI_DATA_CIFAR10:
        return st_cifar10_load(d->dir, train, test);
    case ST_CLI_DATA_CIFAR100:
        return st_cifar100_load(d->dir, train, test);
    case ST_CLI_DATA_IDX: {
        st_idx_files f = { d->names[0], d->names[1], d->names[2], d->names[3] };
        return (values ? st_idx_set_load : st_idx_set_load_labels)(
            d->dir, d->has_names ? &f : NULL, train, test);
    }
    case ST_CLI_DATA_TEXT: {
        st_text t;
        st_status s = st_text_load(d->dir, o->holdout, &t);
        if (s != ST_OK)
            return s;
        s = st_text_dataset(&t, o->train.model.context, o->train.seed,
                                      (uint32_t)o->epoch_windows, (size_t)o->val_bytes, train,
                                      test);
        if (s == ST_OK && !o->quiet)
            printf("text %s: %zu bytes, %zu for training, %zu held out (%zu evaluated); "
                   "unigram baseline %.4f bits per byte\n", d->dir, t.count, t.train_count,
                   t.count - t.train_count, test->n_bytes, st_text_unigram_bpb(&t));
        st_text_free(&t);
        return s;
    }
    case ST_CLI_DATA_FASHION:
        break;
    }
    return (values ? st_fashion_mnist_load : st_fashion_mnist_load_labels)(d->dir, train, test);
}

/* Images of several channels are standardised per channel (CIFAR's red,
 * green and blue differ in mean and spread); everything else with one mean
 * and deviation over all features: Fashion-MNIST, IDX sets and the
 * synthetic task, as they always were. */
static void normalize(st_dataset *train, st_dataset *test)
{
    if (train->bytes)   /* text: byte ids, not features */
        return;
    if (train->channels > 1 && train->height * train->width > 1) {
        st_dataset_normalize_channels(train, test, NULL, NULL, 0);
        return;
    }
    st_dataset_normalize(train, test, NULL, NULL);
}

/* The model's input and classes (and image shape) from the data. */
static void take_shape(st_cli_options *o, const st_dataset *train)
{
    o->train.model.in_dim = (int)train->dim;
    o->train.model.n_classes = (int)train->n_classes;
    if (train->height * train->width > 1 && !train->bytes) {
        o->train.model.in_channels = (int)train->channels;
        o->train.model.in_height = (int)train->height;
        o->train.model.in_width = (int)train->width;
    }
}

st_status st_cli_load_run_data(st_cli_options *o, st_dataset *train, st_dataset *test)
{
    st_status s = load_data(o, 1, train, test);
    if (s != ST_OK)
        return s;
    normalize(train, test);
    take_shape(o, train);
    return ST_OK;
}

st_status st_cli_load_run_shapes(st_cli_options *o, st_dataset *train, st_dataset *test)
{
    /* a split reads the labels; nothing reads the samples' values, which
     * are not normalised, nor made from an IDX set's bytes */
    st_status s;
    if (o->data_spec.kind != ST_CLI_DATA_SYNTHETIC || o->train.split.kind != ST_SPLIT_IID) {
        s = load_data(o, 0, train, test);
    } else {
        st_synthetic_config sc = st_synthetic_defaults(o->train.seed);
        s = st_synthetic_shapes(&sc, train, test);
    }
    if (s == ST_OK)
        take_shape(o, train);
    return s;
}

/*
 * fuzz/fuzz_text.c — libFuzzer harness of the text reader (data/text.c):
 * st_text_load, then st_text_dataset on what it read, the unigram
 * baseline, and a gather of a few windows of each set.
 *
 * The first four bytes are the parameters: the held-out fraction
 * (including the refused 0 and 1), the context (1 .. 1024, and now and
 * then out of range), the training windows per epoch and the validation
 * bytes; the rest is the file (gzip or plain).  A gather reads every
 * window's T + 1 bytes: AddressSanitizer checks they lie in the set.
 */
#include "fuzz_file.h"

#include <math.h>

#include <subtrain/data.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define WINDOWS 4   /* gathered per set */

static void gather(const st_dataset *d)
{
    uint32_t n = d->count < WINDOWS ? d->count : WINDOWS;
    if (n == 0)
        return;
    uint32_t idx[WINDOWS];
    for (uint32_t i = 0; i < n; i++)
        idx[i] = d->count - 1 - i;   /* the last windows: the edge */
    float *x = malloc((size_t)n * d->context * sizeof *x);
    int32_t *y = malloc((size_t)n * d->context * sizeof *y);
    FUZZ_CHECK(x && y);
    st_dataset_gather(d, idx, n, x, y);
    for (size_t k = 0; k < (size_t)n * d->context; k++)
        FUZZ_CHECK(x[k] >= 0.0f && x[k] < 256.0f && y[k] >= 0 && y[k] < 256);
    free(x);
    free(y);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4)
        return 0;
    const double holdout = data[0] / 255.0;       /* 0 and 1 are refused */
    int context = 1 + (data[1] & 0x7f) * 8 + (data[1] >> 7) * (data[2] & 7);
    if (data[2] == 0xff)
        context = data[1] == 0xff ? 70000 : 0;    /* out of range: refused */
    const uint32_t train_windows = data[3] & 0x0f;
    const size_t val_bytes = (size_t)(data[3] >> 4) * 7;

    st_text t;
    if (st_text_load(fuzz_file(data + 4, size - 4), holdout, &t) != ST_OK) {
        FUZZ_CHECK(t.bytes == NULL && t.count == 0);
        return 0;
    }
    FUZZ_CHECK(t.train_count >= 2 && t.count - t.train_count >= 2);
    const int gz = size >= 6 && data[4] == 0x1f && data[5] == 0x8b;
    if (!gz)   /* a plain file is its bytes */
        FUZZ_CHECK(t.count == size - 4 && memcmp(t.bytes, data + 4, t.count) == 0);
    FUZZ_CHECK(isfinite(st_text_unigram_bpb(&t)));
    st_dataset train, test;
    if (st_text_dataset(&t, context, 1, train_windows, val_bytes, &train, &test) == ST_OK) {
        FUZZ_CHECK(train.context == (uint32_t)context && test.context == (uint32_t)context);
        FUZZ_CHECK(train.n_bytes == t.train_count && test.count >= 1);
        gather(&train);
        gather(&test);
        st_dataset_free(&train);
        st_dataset_free(&test);
    } else {
        FUZZ_CHECK(train.bytes == NULL && test.bytes == NULL);
    }
    st_text_free(&t);
    return 0;
}

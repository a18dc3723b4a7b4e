/*
 * fuzz/fuzz_cifar.c — libFuzzer harness of the CIFAR binary reader,
 * st_cifar_load_files (data/cifar.c).
 *
 * The first byte chooses how the rest is read: bit 0, CIFAR-100 records
 * instead of CIFAR-10; bit 1, the file listed twice (a set of several
 * files); bit 2, the rest cut to a whole number of records, so that the
 * mutations reach the labels and pixels instead of stopping at the size
 * check.  An accepted set must hold what the reader promises: the records
 * of every file, labels below the class count, pixels in [0, 1].
 */
#include "fuzz_file.h"

#include <subtrain/data.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const st_cifar_kind kind = data[0] & 1 ? ST_CIFAR100 : ST_CIFAR10;
    const int twice = (data[0] & 2) != 0;
    const size_t record = (kind == ST_CIFAR100 ? 2 : 1) + ST_CIFAR_PIXELS;
    data++;
    size--;
    if (data[-1] & 4)
        size -= size % record;

    const char *path = fuzz_file(data, size);
    const char *paths[2] = { path, path };
    st_dataset d;
    if (st_cifar_load_files(kind, paths, twice ? 2 : 1, &d) != ST_OK) {
        FUZZ_CHECK(d.x == NULL && d.y == NULL && d.count == 0);
        return 0;
    }
    FUZZ_CHECK(size % record == 0 && d.count == (twice ? 2 : 1) * (size / record));
    FUZZ_CHECK(d.dim == ST_CIFAR_PIXELS && d.channels * d.height * d.width == d.dim);
    FUZZ_CHECK(d.n_classes == (kind == ST_CIFAR100 ? 100u : 10u));
    for (uint32_t i = 0; i < d.count; i++) {
        FUZZ_CHECK(d.y[i] < d.n_classes);
        for (uint32_t k = 0; k < d.dim; k++)
            FUZZ_CHECK(d.x[(size_t)i * d.dim + k] >= 0.0f && d.x[(size_t)i * d.dim + k] <= 1.0f);
    }
    st_dataset_free(&d);
    return 0;
}

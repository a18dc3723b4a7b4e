/*
 * fuzz/fuzz_idx.c — libFuzzer harness of the IDX reader, st_idx_read
 * (data/idx.c): the input is the file, plain or gzip (data/gzio.c tells
 * them apart by the gzip magic, so a mutated gzip seed reaches the
 * inflate path, its members and what trails them).
 *
 * Beyond "no crash, no leak, no undefined behaviour", an accepted file
 * must be what st_idx_read promises: a rank in range, non-zero
 * dimensions whose product is the count, and count readable bytes.
 */
#include "fuzz_file.h"

#include <subtrain/data.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    st_idx_array a;
    if (st_idx_read(fuzz_file(data, size), &a) != ST_OK) {
        FUZZ_CHECK(a.data == NULL && a.count == 0);   /* "left empty" */
        return 0;
    }
    FUZZ_CHECK(a.rank >= 1 && a.rank <= ST_IDX_MAX_RANK);
    uint64_t count = 1;
    for (int i = 0; i < a.rank; i++) {
        FUZZ_CHECK(a.dims[i] > 0);
        count *= a.dims[i];
    }
    FUZZ_CHECK(count == a.count && a.count <= ST_IDX_MAX_BYTES && a.data != NULL);
    /* every payload byte is the file's: the plain file ends with them */
    unsigned sum = 0;
    for (size_t i = 0; i < a.count; i++)
        sum += a.data[i];
    if (size >= 2 && !(data[0] == 0x1f && data[1] == 0x8b))
        FUZZ_CHECK(a.count <= size && memcmp(a.data, data + size - a.count, a.count) == 0);
    (void)sum;
    st_idx_free(&a);
    return 0;
}

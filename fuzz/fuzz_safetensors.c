/*
 * fuzz/fuzz_safetensors.c — libFuzzer harness of the safetensors reader
 * (ckpt/safetensors.c): st_safetensors_read on the input as a file, then
 * st_safetensors_find and st_safetensors_meta on what it accepted.
 *
 * An accepted file must keep the reader's promises (checkpoint.h): every
 * tensor's bytes are its shape's elements times its dtype's size, they
 * lie in the file's data after the header, the tensors cover that data
 * exactly, names are unique (find returns each tensor itself), every F32
 * value is finite, and every metadata key is found.  A file that breaks
 * one of them aborts: the weights loader trusts them.
 */
#include "fuzz_file.h"

#include <subtrain/checkpoint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t dtype_size(st_dtype d)
{
    return d == ST_DTYPE_F32 ? 4 : d == ST_DTYPE_U8 ? 1 : 8;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    st_safetensors f;
    if (st_safetensors_read(fuzz_file(data, size), &f) != ST_OK) {
        FUZZ_CHECK(f.buf == NULL && f.tensors == NULL && f.meta == NULL);
        return 0;
    }
    FUZZ_CHECK(f.size == size && f.size >= 8 && memcmp(f.buf, data, size) == 0);
    uint64_t header = 0;
    for (int k = 7; k >= 0; k--)
        header = header << 8 | f.buf[k];
    const uint8_t *begin = f.buf + 8 + header, *end = f.buf + f.size;
    size_t covered = 0;
    for (int i = 0; i < f.n; i++) {
        const st_safetensors_tensor *t = &f.tensors[i];
        FUZZ_CHECK(t->dtype >= ST_DTYPE_F32 && t->dtype <= ST_DTYPE_U64);
        FUZZ_CHECK(t->ndims >= 0 && t->ndims <= ST_SAFETENSORS_MAX_DIMS);
        FUZZ_CHECK(memchr(t->name, '\0', sizeof t->name) != NULL);
        /* the shape's size, without wrapping: the reader's promise */
        uint64_t elements = 1;
        for (int d = 0; d < t->ndims; d++) {
            FUZZ_CHECK(t->shape[d] >= 0);
            const uint64_t dim = (uint64_t)t->shape[d];
            FUZZ_CHECK(dim == 0 || elements <= UINT64_MAX / dim);
            elements *= dim;
        }
        FUZZ_CHECK(elements <= UINT64_MAX / dtype_size(t->dtype));
        FUZZ_CHECK(t->bytes == elements * dtype_size(t->dtype));
        const uint8_t *p = t->data;
        FUZZ_CHECK(p >= begin && p <= end && t->bytes <= (size_t)(end - p));
        unsigned sum = 0;
        for (size_t b = 0; b < t->bytes; b++)
            sum += p[b];
        (void)sum;
        for (size_t b = 0; t->dtype == ST_DTYPE_F32 && b < t->bytes; b += 4) {
            uint32_t u;   /* no NaN, no infinity: all exponent bits set */
            memcpy(&u, p + b, 4);
            FUZZ_CHECK((u & 0x7f800000u) != 0x7f800000u);
        }
        covered += t->bytes;
        FUZZ_CHECK(st_safetensors_find(&f, t->name) == t);
    }
    FUZZ_CHECK(covered == (size_t)(end - begin));
    for (int k = 0; k < f.n_meta; k++) {
        FUZZ_CHECK(f.meta[k].key != NULL && f.meta[k].value != NULL);
        FUZZ_CHECK(st_safetensors_meta(&f, f.meta[k].key) != NULL);
    }
    st_safetensors_free(&f);
    return 0;
}

/*
 * core/blocked.c — fp32 weights into their blocked bf16 copies
 * (core/blocked.h): what the update and a layer's conversion write.
 *
 * The layouts oneDNN's bf16 matmul kernels take (BA16a64b2a and its kin)
 * keep the two elements of a 32-bit VNNI pair side by side: two rows of
 * the weight matrix (ST_PAIR_ROWS) or two columns (ST_PAIR_COLS), with the
 * other axis 2 apart in runs of a block.  So a pair is one 32-bit store;
 * two rows interleave into a run of words; a block of 16 rows' column
 * pairs is a 16 x 16 transposition of words, each of whose rows fills a
 * 64-byte line of the copy.  A copy of any other layout is written an
 * element at a time.
 */

#include "core/bf16.h"
#include "core/simd.h"
#include "core/blocked.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_AVX512_TRANSPOSE 1
#endif

static inline uint32_t pair32(float lo, float hi)
{
    return (uint32_t)st_bf16_from_float(lo) | (uint32_t)st_bf16_from_float(hi) << 16;
}

/* a 32-bit view of the bf16 copies (typed access through another type) */
typedef uint32_t __attribute__((may_alias)) u32_alias;

static int pattern_holds(const int64_t *pair_at, int64_t pair_n, const int64_t *run_at,
                         int64_t run_n, int64_t run)
{
    for (int64_t i = 0; i + 1 < pair_n; i += 2)
        if (pair_at[i + 1] != pair_at[i] + 1 || pair_at[i] % 2)
            return 0;
    for (int64_t i = 0; i < run_n; i++)
        if (i % run ? run_at[i] != run_at[i - 1] + 2 : run_at[i] % 2 != 0)
            return 0;
    return 1;
}

void st_blocked_pattern(struct st_blocked_copy *c, int64_t rows, int64_t cols)
{
    c->pair = 0;
    c->run = 1;
    for (int kind = ST_PAIR_ROWS; kind <= ST_PAIR_COLS; kind++) {
        const int64_t *pair_at = kind == ST_PAIR_ROWS ? c->row_at : c->col_at;
        const int64_t *run_at = kind == ST_PAIR_ROWS ? c->col_at : c->row_at;
        const int64_t pair_n = kind == ST_PAIR_ROWS ? rows : cols;
        const int64_t run_n = kind == ST_PAIR_ROWS ? cols : rows;
        int64_t run = 1;   /* the first run's length */
        while (run < run_n && run_at[run] == run_at[run - 1] + 2)
            run++;
        if (run > 1 && pattern_holds(pair_at, pair_n, run_at, run_n, run)) {
            c->pair = kind;
            c->run = run;
            return;
        }
    }
}

/* d[j] = the pair (a[j], b[j]) rounded, j < n: two rows' run */
ST_VECTOR_CLONES_BW
static void pair_rows(u32_alias *restrict d, const float *restrict a, const float *restrict b,
                      int64_t n)
{
#pragma omp simd
    for (int64_t j = 0; j < n; j++)
        d[j] = pair32(a[j], b[j]);
}

/* h[q] = the pair (a[2q], a[2q + 1]) rounded, q < n: a row's column pairs */
ST_VECTOR_CLONES_BW
static void pair_cols(uint32_t *restrict h, const float *restrict a, int64_t n)
{
#pragma omp simd
    for (int64_t q = 0; q < n; q++)
        h[q] = pair32(a[2 * q], a[2 * q + 1]);
}

#define PACK_PAIRS 256   /* a row's pairs rounded at a time */

#ifdef HAVE_AVX512_TRANSPOSE
/* r[k] = column k of the 16 x 16 words r[0..15] */
__attribute__((target("avx512f"))) static void transpose16(__m512i r[16])
{
    __m512i t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 4; k++) {
            t[8 * i + k] = _mm512_shuffle_i32x4(r[8 * i + k], r[8 * i + 4 + k], 0x88);
            t[8 * i + 4 + k] = _mm512_shuffle_i32x4(r[8 * i + k], r[8 * i + 4 + k], 0xdd);
        }
    for (int k = 0; k < 8; k++) {
        r[k] = _mm512_shuffle_i32x4(t[k], t[8 + k], 0x88);
        r[8 + k] = _mm512_shuffle_i32x4(t[k], t[8 + k], 0xdd);
    }
}

/* store_pair_block's pairs 16 at a time; returns how many it stored */
__attribute__((target("avx512f"))) static int64_t
store_pair_block_avx512(uint16_t *row, const int64_t *col_at, const uint32_t *h, int64_t n)
{
    int64_t q0 = 0;
    for (; q0 + 16 <= n; q0 += 16) {
        __m512i r[16];
        for (int j = 0; j < 16; j++)
            r[j] = _mm512_loadu_si512(h + j * PACK_PAIRS + q0);
        transpose16(r);
        for (int q = 0; q < 16; q++) {
            void *d = row + col_at[2 * (q0 + q)];
            if ((uintptr_t)d % 64 == 0)   /* a whole line: no read for ownership */
                _mm512_stream_si512(d, r[q]);
            else
                _mm512_storeu_si512(d, r[q]);
        }
    }
    return q0;
}
#endif

/* ST_PACK_ROWS rows' pair q at row + col_at[2q], their words one after
 * another, h holding the rows' pairs PACK_PAIRS apart, q < n. */
static void store_pair_block(uint16_t *row, const int64_t *col_at, const uint32_t *h, int64_t n)
{
    int64_t q = 0;
#ifdef HAVE_AVX512_TRANSPOSE
    if (__builtin_cpu_supports("avx512f"))
        q = store_pair_block_avx512(row, col_at, h, n);
#endif
    for (; q < n; q++) {
        u32_alias *d = (u32_alias *)(row + col_at[2 * q]);
        for (int j = 0; j < ST_PACK_ROWS; j++)
            d[j] = h[j * PACK_PAIRS + q];
    }
}

/* Rows [r0, r1) (whole) of the matrix at v (cols a row) into copy c. */
static void pack_rows(const struct st_blocked_copy *c, const float *v, int64_t r0, int64_t r1,
                      int64_t cols)
{
    int64_t r = r0;
    if (c->pair == ST_PAIR_ROWS) {   /* rows r, r + 1: interleaved, a run at a time */
        if (r % 2 && r < r1) {   /* an odd first row, its pair's other half not ours */
            for (int64_t q = 0; q < cols; q++)
                c->bf16[c->row_at[r] + c->col_at[q]] = st_bf16_from_float(v[q]);
            r++;
        }
        for (; r + 1 < r1; r += 2) {
            const float *a = v + (r - r0) * cols;
            for (int64_t q = 0; q < cols; q += c->run)
                pair_rows((u32_alias *)(c->bf16 + c->row_at[r] + c->col_at[q]), a + q,
                          a + cols + q, cols - q < c->run ? cols - q : c->run);
        }
    } else if (c->pair == ST_PAIR_COLS && cols % 2 == 0) {
        uint32_t h[ST_PACK_ROWS * PACK_PAIRS];
        /* blocks of ST_PACK_ROWS rows inside a run: rounded a row at a
         * time, stored a pair (the block's words side by side) at a time */
        for (; r + ST_PACK_ROWS <= r1 && r % c->run % ST_PACK_ROWS == 0 &&
               r % c->run + ST_PACK_ROWS <= c->run;
             r += ST_PACK_ROWS) {
            const float *a = v + (r - r0) * cols;
            for (int64_t q0 = 0; q0 < cols; q0 += 2 * PACK_PAIRS) {
                const int64_t n = (cols - q0) / 2 < PACK_PAIRS ? (cols - q0) / 2 : PACK_PAIRS;
                for (int j = 0; j < ST_PACK_ROWS; j++)
                    pair_cols(h + j * PACK_PAIRS, a + j * cols + q0, n);
                store_pair_block(c->bf16 + c->row_at[r], c->col_at + q0, h, n);
            }
        }
        for (; r < r1; r++) {   /* the rest: a row's pairs at a time */
            const float *a = v + (r - r0) * cols;
            for (int64_t q0 = 0; q0 < cols; q0 += 2 * PACK_PAIRS) {
                const int64_t n = (cols - q0) / 2 < PACK_PAIRS ? (cols - q0) / 2 : PACK_PAIRS;
                pair_cols(h, a + q0, n);
                uint16_t *row = c->bf16 + c->row_at[r];
                for (int64_t q = 0; q < n; q++)
                    *(u32_alias *)(row + c->col_at[q0 + 2 * q]) = h[q];
            }
        }
    }
    for (; r < r1; r++)   /* what the pattern leaves: an element at a time */
        for (int64_t q = 0; q < cols; q++)
            c->bf16[c->row_at[r] + c->col_at[q]] = st_bf16_from_float(v[(r - r0) * cols + q]);
}

/* The streaming stores before whatever reads the copies next, on any
 * thread (the primitives' own threads included). */
static void stores_done(void)
{
#ifdef HAVE_AVX512_TRANSPOSE
    _mm_sfence();
#endif
}

void st_blocked_pack_rows(const struct st_blocked_copy *c, const float *v, int64_t r0,
                          int64_t r1, int64_t cols)
{
    pack_rows(c, v, r0, r1, cols);
    stores_done();
}

/* Elements [i, end) of row i / cols alone (a piece of one row): an
 * element at a time into every copy. */
static void pack_piece(const st_param_blocked *b, const float *v, int64_t i, int64_t end)
{
    const int64_t cols = b->cols;
    for (; i < end; i++, v++)
        for (int k = 0; k < b->n; k++)
            b->copy[k].bf16[b->copy[k].row_at[i / cols] + b->copy[k].col_at[i % cols]] =
                st_bf16_from_float(*v);
}

void st_blocked_pack(const st_param_blocked *b, const float *v, size_t lo, size_t hi)
{
    const int64_t cols = b->cols;
    int64_t i = (int64_t)(lo - b->offset), end = (int64_t)(hi - b->offset);
    /* a head and a tail inside rows an element at a time (another thread
     * may write the rest of those rows), the whole rows between in blocks */
    const int64_t r0 = (i + cols - 1) / cols, r1 = end / cols;
    if (r0 >= r1) {
        pack_piece(b, v, i, end);
        return;
    }
    pack_piece(b, v, i, r0 * cols);
    for (int k = 0; k < b->n; k++)
        pack_rows(&b->copy[k], v + (r0 * cols - i), r0, r1, cols);
    pack_piece(b, v + (r1 * cols - i), r1 * cols, end);
    stores_done();
}

size_t st_blocked_slab_end(const st_param_blocked *b, size_t x)
{
    size_t slab = ST_PACK_ROWS * (size_t)b->cols;   /* whole blocks of rows */
    if (slab < ST_PACK_CHUNK)
        slab *= ST_PACK_CHUNK / slab;
    const size_t y = b->offset + ((x - b->offset) / slab + 1) * slab;
    return y < st_blocked_end(b) ? y : st_blocked_end(b);
}

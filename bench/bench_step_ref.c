/*
 * bench/bench_step_ref.c — bench_step's references, measured in windows
 * interleaved with the step's (bench_step.c): dnnl_sgemm on the model's
 * dominant GEMM shape, oneDNN's bf16 matmul on the same shape, and for the
 * cnn configuration oneDNN's convolution primitives on its dominant
 * convolution shape (fp32, and reading bf16).
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "bench_step.h"

/* ------------------------------------------------------------ sgemm */

float *alloc_floats(size_t count)
{
    size_t bytes = (count * sizeof(float) + 63) / 64 * 64;
    return aligned_alloc(64, bytes);
}

int gemm_init(gemm_ctx *g, int64_t m, int64_t n, int64_t k)
{
    g->m = m, g->n = n, g->k = k;
    g->a = alloc_floats((size_t)(m * k));
    g->b = alloc_floats((size_t)(k * n));
    g->c = alloc_floats((size_t)(m * n));
    if (!g->a || !g->b || !g->c)
        return -1;
    /* Ordinary values (no zeros, no denormals) so that nothing is special-cased. */
    st_rng rng = st_rng_seed(7);
    for (int64_t i = 0; i < m * k; i++)
        g->a[i] = st_rng_uniform(&rng) - 0.5f;
    for (int64_t i = 0; i < k * n; i++)
        g->b[i] = st_rng_uniform(&rng) - 0.5f;
    memset(g->c, 0, (size_t)(m * n) * sizeof(float));
    return 0;
}

static dnnl_primitive_t make_prim(const_dnnl_op_desc_t d, dnnl_engine_t engine)
{
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t p = NULL;
    if (dnnl_primitive_desc_create(&pd, d, NULL, engine, NULL) == dnnl_success)
        dnnl_primitive_create(&p, pd);
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    return p;
}

/* The weight-gradient product of the reference's layer (A^T: k x m, read
 * from A's memory as "ba" or from a contiguous "ab" copy; dC: an m x n
 * bf16 matrix of its own) and the reorder that makes the copy.  Missing
 * pieces stay NULL: the row then prints no such line. */
static void wgrad16_init(gemm_ctx *g)
{
    const dnnl_dims_t at = { g->k, g->m }, dc = { g->m, g->n }, db = { g->k, g->n };
    dnnl_memory_desc_t read_md, copy_md, dc_md, db_md;
    dnnl_matmul_desc_t d;
    dnnl_memory_desc_init_by_tag(&read_md, 2, at, dnnl_bf16, dnnl_ba);
    dnnl_memory_desc_init_by_tag(&copy_md, 2, at, dnnl_bf16, dnnl_ab);
    dnnl_memory_desc_init_by_tag(&dc_md, 2, dc, dnnl_bf16, dnnl_ab);
    dnnl_memory_desc_init_by_tag(&db_md, 2, db, dnnl_f32, dnnl_ab);
    if (dnnl_memory_create(&g->at16, &copy_md, g->engine, DNNL_MEMORY_ALLOCATE) != dnnl_success ||
        dnnl_memory_create(&g->dc16, &dc_md, g->engine, DNNL_MEMORY_ALLOCATE) != dnnl_success ||
        dnnl_memory_create(&g->db32, &db_md, g->engine, DNNL_MEMORY_ALLOCATE) != dnnl_success)
        return;
    /* dC: bf16 ones and halves, values a product of them cannot overflow */
    void *h = NULL;
    if (dnnl_memory_get_data_handle(g->dc16, &h) == dnnl_success && h)
        for (int64_t i = 0; i < g->m * g->n; i++)
            ((uint16_t *)h)[i] = i % 3 ? 0x3f80 : 0x3f00;
    if (dnnl_matmul_desc_init(&d, &read_md, &dc_md, NULL, &db_md) == dnnl_success)
        g->wg_read = make_prim(&d, g->engine);
    if (dnnl_matmul_desc_init(&d, &copy_md, &dc_md, NULL, &db_md) == dnnl_success)
        g->wg_copy = make_prim(&d, g->engine);
    dnnl_primitive_desc_t rpd = NULL;
    if (dnnl_reorder_primitive_desc_create(&rpd, &read_md, g->engine, &copy_md, g->engine,
                                           NULL) == dnnl_success)
        dnnl_primitive_create(&g->wg_transpose, rpd);
    if (rpd)
        dnnl_primitive_desc_destroy(rpd);
}

/* The bf16 matmul on the same shape, A and B converted from the fp32
 * values by reorders; the implementation's name in impl. */
int gemm16_init(gemm_ctx *g, char *impl, size_t size)
{
    dnnl_dims_t ad = { g->m, g->k }, bd = { g->k, g->n }, cd = { g->m, g->n };
    dnnl_memory_desc_t a_md, b_md, c_md, a32_md, b32_md;
    dnnl_matmul_desc_t d;
    dnnl_primitive_desc_t pd = NULL, rpd = NULL;
    dnnl_primitive_t r = NULL;
    dnnl_memory_t a32 = NULL, b32 = NULL;
    int ok = dnnl_engine_create(&g->engine, dnnl_cpu, 0) == dnnl_success &&
             dnnl_stream_create(&g->stream, g->engine, dnnl_stream_default_flags) == dnnl_success &&
             dnnl_memory_desc_init_by_tag(&a_md, 2, ad, dnnl_bf16, dnnl_ab) == dnnl_success &&
             dnnl_memory_desc_init_by_tag(&b_md, 2, bd, dnnl_bf16, dnnl_ab) == dnnl_success &&
             dnnl_memory_desc_init_by_tag(&c_md, 2, cd, dnnl_f32, dnnl_ab) == dnnl_success &&
             dnnl_memory_desc_init_by_tag(&a32_md, 2, ad, dnnl_f32, dnnl_ab) == dnnl_success &&
             dnnl_memory_desc_init_by_tag(&b32_md, 2, bd, dnnl_f32, dnnl_ab) == dnnl_success &&
             dnnl_matmul_desc_init(&d, &a_md, &b_md, NULL, &c_md) == dnnl_success &&
             dnnl_primitive_desc_create(&pd, &d, NULL, g->engine, NULL) == dnnl_success &&
             dnnl_primitive_create(&g->mm16, pd) == dnnl_success &&
             dnnl_memory_create(&g->a16, &a_md, g->engine, DNNL_MEMORY_ALLOCATE) == dnnl_success &&
             dnnl_memory_create(&g->b16, &b_md, g->engine, DNNL_MEMORY_ALLOCATE) == dnnl_success &&
             dnnl_memory_create(&g->c32, &c_md, g->engine, DNNL_MEMORY_ALLOCATE) == dnnl_success &&
             dnnl_memory_create(&a32, &a32_md, g->engine, g->a) == dnnl_success &&
             dnnl_memory_create(&b32, &b32_md, g->engine, g->b) == dnnl_success;
    if (ok) {
        const char *name = "?";
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name);
        snprintf(impl, size, "%s", name);
    }
    for (int i = 0; ok && i < 2; i++) {   /* A, then B, to bf16 */
        dnnl_memory_t from = i ? b32 : a32, to = i ? g->b16 : g->a16;
        const dnnl_memory_desc_t *fm = i ? &b32_md : &a32_md, *tm = i ? &b_md : &a_md;
        dnnl_exec_arg_t args[2] = { { DNNL_ARG_FROM, from }, { DNNL_ARG_TO, to } };
        ok = dnnl_reorder_primitive_desc_create(&rpd, fm, g->engine, tm, g->engine, NULL) ==
                 dnnl_success &&
             dnnl_primitive_create(&r, rpd) == dnnl_success &&
             dnnl_primitive_execute(r, g->stream, 2, args) == dnnl_success &&
             dnnl_stream_wait(g->stream) == dnnl_success;
        if (r)
            dnnl_primitive_destroy(r);
        if (rpd)
            dnnl_primitive_desc_destroy(rpd);
        r = NULL, rpd = NULL;
    }
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (a32)
        dnnl_memory_destroy(a32);
    if (b32)
        dnnl_memory_destroy(b32);
    if (!ok)
        fprintf(stderr, "bench_step: oneDNN has no bf16 matmul here (ISA %s)\n",
                st_cpu_isa_name());
    if (ok)
        wgrad16_init(g);
    return ok ? 0 : -1;
}

static int gemm16_call(const gemm_ctx *g)
{
    dnnl_exec_arg_t args[3] = { { DNNL_ARG_SRC, g->a16 }, { DNNL_ARG_WEIGHTS, g->b16 },
                                { DNNL_ARG_DST, g->c32 } };
    return dnnl_primitive_execute(g->mm16, g->stream, 3, args) == dnnl_success &&
           dnnl_stream_wait(g->stream) == dnnl_success ? 0 : -1;
}

static double gemm_window(int (*call)(const gemm_ctx *), const gemm_ctx *g, double min_s);

static int wg_exec(const gemm_ctx *g, dnnl_primitive_t p, dnnl_memory_t src)
{
    dnnl_exec_arg_t args[3] = { { DNNL_ARG_SRC, src }, { DNNL_ARG_WEIGHTS, g->dc16 },
                                { DNNL_ARG_DST, g->db32 } };
    return dnnl_primitive_execute(p, g->stream, 3, args) == dnnl_success &&
           dnnl_stream_wait(g->stream) == dnnl_success ? 0 : -1;
}

static int wg_read_call(const gemm_ctx *g)
{
    return wg_exec(g, g->wg_read, g->a16);
}

static int wg_copy_call(const gemm_ctx *g)
{
    return wg_exec(g, g->wg_copy, g->at16);
}

static int wg_transpose_call(const gemm_ctx *g)
{
    dnnl_exec_arg_t args[2] = { { DNNL_ARG_FROM, g->a16 }, { DNNL_ARG_TO, g->at16 } };
    return dnnl_primitive_execute(g->wg_transpose, g->stream, 2, args) == dnnl_success &&
           dnnl_stream_wait(g->stream) == dnnl_success ? 0 : -1;
}

/* Whether the two reads sum alike: a layer may copy only by a fixed rule
 * if they do not (timing both at run time would change its bits). */
static double wgrad16_differ(const gemm_ctx *g)
{
    const size_t n = (size_t)(g->k * g->n);
    void *db = NULL;
    float *first = malloc(n * sizeof *first);
    double frac = -1.0;
    if (first && dnnl_memory_get_data_handle(g->db32, &db) == dnnl_success && db &&
        wg_read_call(g) == 0) {
        memcpy(first, db, n * sizeof *first);
        if (wg_copy_call(g) == 0) {
            size_t differ = 0;
            for (size_t i = 0; i < n; i++)
                differ += memcmp(&first[i], (const float *)db + i, sizeof *first) != 0;
            frac = (double)differ / (double)n;
        }
    }
    free(first);
    return frac;
}

void wgrad16_windows(const gemm_ctx *g, double min_s, double out[4])
{
    out[0] = g->wg_read ? gemm_window(wg_read_call, g, min_s) : -1.0;
    out[2] = g->wg_transpose ? gemm_window(wg_transpose_call, g, min_s) : -1.0;
    /* after the copy's window: it filled the copy the product reads */
    out[1] = g->wg_copy && out[2] >= 0.0 ? gemm_window(wg_copy_call, g, min_s) : -1.0;
    out[3] = out[0] >= 0.0 && out[1] >= 0.0 ? wgrad16_differ(g) : -1.0;
}

void gemm_free(gemm_ctx *g)
{
    if (g->mm16)
        dnnl_primitive_destroy(g->mm16);
    dnnl_primitive_t prims[3] = { g->wg_read, g->wg_copy, g->wg_transpose };
    for (int i = 0; i < 3; i++)
        if (prims[i])
            dnnl_primitive_destroy(prims[i]);
    dnnl_memory_t mems[6] = { g->a16, g->b16, g->c32, g->at16, g->dc16, g->db32 };
    for (int i = 0; i < 6; i++)
        if (mems[i])
            dnnl_memory_destroy(mems[i]);
    if (g->stream)
        dnnl_stream_destroy(g->stream);
    if (g->engine)
        dnnl_engine_destroy(g->engine);
    free(g->a);
    free(g->b);
    free(g->c);
}

/* C (m, n) = A (m, k) . B (k, n), row-major, as a forward linear layer. */
static int gemm_call(const gemm_ctx *g)
{
    return dnnl_sgemm('N', 'N', g->m, g->n, g->k, 1.0f, g->a, g->k, g->b, g->n, 0.0f, g->c,
                      g->n) == dnnl_success ? 0 : -1;
}

/* Mean seconds per call (gemm_call, gemm16_call) over a window of at
 * least min_s; -1 on failure.  One untimed call first: the step windows
 * in between evict A, B and C. */
static double gemm_window(int (*call)(const gemm_ctx *), const gemm_ctx *g, double min_s)
{
    if (call(g))
        return -1.0;
    uint64_t n = 0;
    double t0 = now_s(), t;
    do {
        if (call(g))
            return -1.0;
        n++;
        t = now_s();
    } while (t - t0 < min_s);
    return (t - t0) / (double)n;
}

/* ------------------------------------------------------------ conv */

static int64_t conv_out(int64_t in, int64_t k, int64_t stride, int64_t pad)
{
    return (in + 2 * pad - k) / stride + 1;
}

/* One pass (forward, backward-data or backward-weights): 2 FLOPs per
 * multiply-add, as st_model_step_flops counts them. */
double conv_pass_flops(const conv_shape *c, int64_t batch)
{
    return 2.0 * (double)batch * (double)c->oc * (double)conv_out(c->h, c->k, c->stride, c->pad) *
           (double)conv_out(c->w, c->k, c->stride, c->pad) * (double)c->ic * (double)(c->k * c->k);
}

static void add_conv(conv_shape *list, int *n, int64_t batch, int64_t ic, int64_t oc, int64_t h,
                     int64_t w, int64_t k, int64_t stride, int passes)
{
    conv_shape c = { ic, oc, h, w, k, stride, k / 2, 0.0 };
    const double f = passes * conv_pass_flops(&c, batch);
    for (int i = 0; i < *n; i++)
        if (list[i].ic == ic && list[i].oc == oc && list[i].h == h && list[i].w == w &&
            list[i].k == k && list[i].stride == stride) {
            list[i].step_flops += f;
            return;
        }
    if (*n < MAX_CONV_SHAPES) {
        c.step_flops = f;
        list[(*n)++] = c;
    }
}

/* The convolutions of a resnet (3 stages) as subtrain/model.h describes
 * it, by shape: the stem 3x3 (C -> w; forward and backward-weights, it
 * has no input gradient), then per stage s (w << s channels, the
 * resolution halved at s > 0): the first block of s > 0 has a 3x3 stride-2
 * convolution from the previous stage's channels, a 3x3 stride-1 one and
 * a 1x1 stride-2 projection; every other block two 3x3 stride-1 ones (all
 * three passes).  Returns the number of shapes; *best: the shape with the
 * most FLOPs, the reference's. */
int conv_shapes(const bench_config *bc, conv_shape *list, int *best)
{
    int n = 0;
    const int64_t B = bc->batch;
    int64_t H = bc->in_height, W = bc->in_width, c = bc->width;
    add_conv(list, &n, B, bc->in_channels, c, H, W, 3, 1, 2);
    for (int s = 0; s < 3; s++) {
        const int64_t cs = (int64_t)bc->width << s;
        for (int b = 0; b < bc->depth; b++) {
            if (s > 0 && b == 0) {
                add_conv(list, &n, B, c, cs, H, W, 3, 2, 3);
                add_conv(list, &n, B, c, cs, H, W, 1, 2, 3);
                H = (H - 1) / 2 + 1;
                W = (W - 1) / 2 + 1;
            } else {
                add_conv(list, &n, B, c, cs, H, W, 3, 1, 3);
            }
            add_conv(list, &n, B, cs, cs, H, W, 3, 1, 3);
            c = cs;
        }
    }
    *best = 0;
    for (int i = 1; i < n; i++)
        if (list[i].step_flops > list[*best].step_flops)
            *best = i;
    return n;
}

#define DNNL_TRY(call, what)                                                           \
    do {                                                                               \
        dnnl_status_t dnnl_s_ = (call);                                                \
        if (dnnl_s_ != dnnl_success) {                                                 \
            fprintf(stderr, "bench_step: conv reference: %s failed (oneDNN status %d)\n", \
                    what, (int)dnnl_s_);                                               \
            return -1;                                                                 \
        }                                                                              \
    } while (0)

/* A buffer for md: an earlier one of the same layout when `share` is one,
 * else a new one filled with ordinary values (scaled by `scale`), in its
 * data type (f32 or bf16). */
static int conv_ref_mem(conv_ref *c, const dnnl_memory_desc_t *md, dnnl_memory_t share,
                        float scale, st_rng *rng, dnnl_memory_t *out)
{
    if (share) {
        const dnnl_memory_desc_t *smd;
        DNNL_TRY(dnnl_memory_get_memory_desc(share, &smd), "memory descriptor");
        if (dnnl_memory_desc_equal(smd, md)) {
            *out = share;
            return 0;
        }
    }
    DNNL_TRY(dnnl_memory_create(out, md, c->engine, DNNL_MEMORY_ALLOCATE), "memory");
    c->mem[c->n_mem++] = *out;
    void *p;
    DNNL_TRY(dnnl_memory_get_data_handle(*out, &p), "data handle");
    if (md->data_type == dnnl_bf16) {
        uint16_t *h = p;
        const size_t n = dnnl_memory_desc_get_size(md) / sizeof(uint16_t);
        for (size_t i = 0; i < n; i++) {
            float f = scale * (st_rng_uniform(rng) - 0.5f);
            uint32_t u;
            memcpy(&u, &f, sizeof u);
            h[i] = (uint16_t)(u >> 16);
        }
        return 0;
    }
    float *f = p;
    const size_t n = dnnl_memory_desc_get_size(md) / sizeof(float);
    for (size_t i = 0; i < n; i++)
        f[i] = scale * (st_rng_uniform(rng) - 0.5f);
    return 0;
}

static const dnnl_memory_desc_t *conv_md(const_dnnl_primitive_desc_t pd, dnnl_query_t what)
{
    return dnnl_primitive_desc_query_md(pd, what, 0);
}

void conv_impl_name(const_dnnl_primitive_desc_t pd, char *out, size_t size)
{
    const char *name = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name) != dnnl_success ||
        !name)
        name = "?";
    snprintf(out, size, "%s", name);
}

void conv_ref_free(conv_ref *c)
{
    for (int i = 0; i < 3; i++)
        if (c->prim[i])
            dnnl_primitive_destroy(c->prim[i]);
    for (int i = 0; i < c->n_mem; i++)
        dnnl_memory_destroy(c->mem[i]);
    if (c->stream)
        dnnl_stream_destroy(c->stream);
    if (c->engine)
        dnnl_engine_destroy(c->engine);
    memset(c, 0, sizeof *c);
}

/* Created on this thread, whose OpenMP thread count (1) is the one the
 * primitives are built and run for, as the trainer's worker does.  bf16:
 * what each pass reads (x, w, dy) in bf16, what it writes (y, dx, dw) in
 * f32, as the layers run (nn/layers/conv.c). */
int conv_ref_init(conv_ref *c, const conv_shape *sh, int64_t batch, int bf16)
{
    memset(c, 0, sizeof *c);
    DNNL_TRY(dnnl_engine_create(&c->engine, dnnl_cpu, 0), "engine");
    DNNL_TRY(dnnl_stream_create(&c->stream, c->engine, dnnl_stream_default_flags), "stream");
    const int64_t oh = conv_out(sh->h, sh->k, sh->stride, sh->pad);
    const int64_t ow = conv_out(sh->w, sh->k, sh->stride, sh->pad);
    const dnnl_dims_t xd = { batch, sh->ic, sh->h, sh->w }, yd = { batch, sh->oc, oh, ow };
    const dnnl_dims_t wd = { sh->oc, sh->ic, sh->k, sh->k };
    const dnnl_dims_t strides = { sh->stride, sh->stride }, pad = { sh->pad, sh->pad };
    const dnnl_data_type_t in = bf16 ? dnnl_bf16 : dnnl_f32;
    dnnl_memory_desc_t x_md, y_md, w_md, dx_md, dy_md, dw_md;
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&x_md, 4, xd, in, dnnl_format_tag_any), "src md");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&y_md, 4, yd, dnnl_f32, dnnl_format_tag_any), "dst md");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&w_md, 4, wd, in, dnnl_format_tag_any),
             "weights md");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&dx_md, 4, xd, dnnl_f32, dnnl_format_tag_any),
             "diff src md");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&dy_md, 4, yd, in, dnnl_format_tag_any),
             "diff dst md");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&dw_md, 4, wd, dnnl_f32, dnnl_format_tag_any),
             "diff weights md");

    dnnl_convolution_desc_t fd, bd, wdsc;
    DNNL_TRY(dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training,
                                                dnnl_convolution_direct, &x_md, &w_md, NULL,
                                                &y_md, strides, pad, pad),
             "forward descriptor");
    DNNL_TRY(dnnl_convolution_backward_data_desc_init(&bd, dnnl_convolution_direct, &dx_md,
                                                      &w_md, &dy_md, strides, pad, pad),
             "backward-data descriptor");
    DNNL_TRY(dnnl_convolution_backward_weights_desc_init(&wdsc, dnnl_convolution_direct, &x_md,
                                                         &dw_md, NULL, &dy_md, strides, pad,
                                                         pad),
             "backward-weights descriptor");
    dnnl_primitive_desc_t pd[3] = { NULL, NULL, NULL };
    int rc = -1;
    if (dnnl_primitive_desc_create(&pd[0], &fd, NULL, c->engine, NULL) != dnnl_success ||
        dnnl_primitive_desc_create(&pd[1], &bd, NULL, c->engine, pd[0]) != dnnl_success ||
        dnnl_primitive_desc_create(&pd[2], &wdsc, NULL, c->engine, pd[0]) != dnnl_success) {
        fprintf(stderr, "bench_step: conv reference: no convolution primitive for the shape\n");
        goto out;
    }
    for (int i = 0; i < 3; i++) {
        if (dnnl_primitive_create(&c->prim[i], pd[i]) != dnnl_success) {
            fprintf(stderr, "bench_step: conv reference: creating a primitive failed\n");
            goto out;
        }
        conv_impl_name(pd[i], c->impl[i], sizeof c->impl[i]);
    }
    st_rng rng = st_rng_seed(2024);
    dnnl_memory_t x, y, w, dy, dx, xw, dyw, wd_, dw;
    if (conv_ref_mem(c, conv_md(pd[0], dnnl_query_src_md), NULL, 1.0f, &rng, &x) ||
        conv_ref_mem(c, conv_md(pd[0], dnnl_query_weights_md), NULL, 0.1f, &rng, &w) ||
        conv_ref_mem(c, conv_md(pd[0], dnnl_query_dst_md), NULL, 1.0f, &rng, &y) ||
        conv_ref_mem(c, conv_md(pd[1], dnnl_query_diff_dst_md), NULL, 1.0f, &rng, &dy) ||
        conv_ref_mem(c, conv_md(pd[1], dnnl_query_weights_md), w, 0.1f, &rng, &wd_) ||
        conv_ref_mem(c, conv_md(pd[1], dnnl_query_diff_src_md), NULL, 1.0f, &rng, &dx) ||
        conv_ref_mem(c, conv_md(pd[2], dnnl_query_src_md), x, 1.0f, &rng, &xw) ||
        conv_ref_mem(c, conv_md(pd[2], dnnl_query_diff_dst_md), dy, 1.0f, &rng, &dyw) ||
        conv_ref_mem(c, conv_md(pd[2], dnnl_query_diff_weights_md), NULL, 1.0f, &rng, &dw))
        goto out;
    const dnnl_exec_arg_t args[3][3] = {
        { { DNNL_ARG_SRC, x }, { DNNL_ARG_WEIGHTS, w }, { DNNL_ARG_DST, y } },
        { { DNNL_ARG_DIFF_DST, dy }, { DNNL_ARG_WEIGHTS, wd_ }, { DNNL_ARG_DIFF_SRC, dx } },
        { { DNNL_ARG_SRC, xw }, { DNNL_ARG_DIFF_DST, dyw }, { DNNL_ARG_DIFF_WEIGHTS, dw } },
    };
    memcpy(c->args, args, sizeof args);
    rc = 0;
out:
    for (int i = 0; i < 3; i++)
        if (pd[i])
            dnnl_primitive_desc_destroy(pd[i]);
    return rc;
}

static int conv_exec(const conv_ref *c, int i)
{
    return dnnl_primitive_execute(c->prim[i], c->stream, 3, c->args[i]) == dnnl_success &&
           dnnl_stream_wait(c->stream) == dnnl_success ? 0 : -1;
}

/* Mean seconds per forward + backward-data + backward-weights over a
 * window of at least min_s, and of each pass in pass_s; -1 on failure.
 * One untimed round first, as for sgemm. */
static double conv_window(const conv_ref *c, double min_s, double pass_s[3])
{
    for (int i = 0; i < 3; i++)
        if (conv_exec(c, i))
            return -1.0;
    double sum[3] = { 0.0, 0.0, 0.0 };
    uint64_t n = 0;
    double t0 = now_s(), t = t0;
    do {
        for (int i = 0; i < 3; i++) {
            double ta = t;
            if (conv_exec(c, i))
                return -1.0;
            t = now_s();
            sum[i] += t - ta;
        }
        n++;
    } while (t - t0 < min_s);
    for (int i = 0; i < 3; i++)
        pass_s[i] = sum[i] / (double)n;
    return (t - t0) / (double)n;
}

/* ------------------------------------------------------------ the reference */

double ref_window(ref_ctx *ref, double min_s, double pass_s[3])
{
    if (ref->conv)
        return conv_window(&ref->c, min_s, pass_s);
    double t = gemm_window(gemm_call, &ref->g, min_s);
    if (t < 0.0)
        fprintf(stderr, "bench_step: dnnl_sgemm failed\n");
    return t;
}

/* The bf16 reference (bf16 rows): the matmul on sgemm's shape, or the
 * convolutions reading bf16. */
double ref16_window(ref_ctx *ref, double min_s)
{
    double pass[3];
    if (ref->conv)
        return conv_window(&ref->c16, min_s, pass);
    return gemm_window(gemm16_call, &ref->g, min_s);
}

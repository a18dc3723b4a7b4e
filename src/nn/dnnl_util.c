/* nn/dnnl_util.c — engine, stream, primitive and memory bookkeeping. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/arena_impl.h"
#include "core/blocked.h"
#include "nn/dnnl_util.h"
#include "nn/pd_memo.h"

static const char *dnnl_status_text(dnnl_status_t s)
{
    switch (s) {
    case dnnl_success: return "success";
    case dnnl_out_of_memory: return "out of memory";
    case dnnl_invalid_arguments: return "invalid arguments";
    case dnnl_unimplemented: return "unimplemented (no implementation for these shapes/formats on this CPU)";
    case dnnl_iterator_ends: return "iterator ends";
    case dnnl_runtime_error: return "runtime error";
    case dnnl_not_required: return "not required";
    }
    return "unknown oneDNN status";
}

st_status st_dnnl_fail(dnnl_status_t s, const char *what, const char *file, int line)
{
    return st_fail(ST_ERR_DNNL, "oneDNN: %s failed: %s (%s:%d); run with DNNL_VERBOSE=1 "
                   "to see the primitive oneDNN was asked for", what,
                   dnnl_status_text(s), file, line);
}

/* Grows a pointer array at build time (never on the step path). */
static st_status grow(void **array, int *cap, int need, size_t elem)
{
    if (need <= *cap)
        return ST_OK;
    int ncap = *cap ? *cap * 2 : 32;
    while (ncap < need)
        ncap *= 2;
    void *p = realloc(*array, (size_t)ncap * elem);
    if (!p)
        return st_fail(ST_ERR_NOMEM, "out of memory tracking oneDNN objects");
    *array = p;
    *cap = ncap;
    return ST_OK;
}

st_status st_nn_ctx_init(st_nn_ctx *ctx, st_arena *arena)
{
    memset(ctx, 0, sizeof *ctx);
    ctx->arena = arena;
    ST_DNNL(dnnl_engine_create(&ctx->engine, dnnl_cpu, 0), "creating the CPU engine");
    ST_DNNL(dnnl_stream_create(&ctx->stream, ctx->engine, dnnl_stream_default_flags),
            "creating a stream");
    ST_DNNL(dnnl_primitive_attr_create(&ctx->attr), "creating primitive attributes");
    /* A user scratchpad: oneDNN would otherwise allocate (and free) its own
     * per execution or per primitive, outside our arena and our NUMA node. */
    ST_DNNL(dnnl_primitive_attr_set_scratchpad_mode(ctx->attr, dnnl_scratchpad_mode_user),
            "setting the user scratchpad mode");
    return ST_OK;
}

st_status st_nn_ctx_finalize(st_nn_ctx *ctx)
{
    for (int k = 0; k < ST_NN_SLOTS; k++)
        if (ctx->slot_bytes[k] > ctx->slot_have[k]) {
            ST_TRY(st_arena_alloc(ctx->arena, ST_MEM_WORKSPACE, ctx->slot_bytes[k],
                                  &ctx->slot[k]));
            ctx->slot_have[k] = ctx->slot_bytes[k];
        }
    for (int i = 0; i < ctx->n_slot_mems; i++)
        ST_DNNL(dnnl_memory_set_data_handle(ctx->slot_mems[i].mem,
                                            (char *)ctx->slot[ctx->slot_mems[i].slot] +
                                            ctx->slot_mems[i].offset),
                "attaching a shared buffer of blocked copies");
    if (ctx->scratchpad_bytes > 0 && !ctx->scratchpad)
        ST_TRY(st_arena_alloc(ctx->arena, ST_MEM_WORKSPACE, ctx->scratchpad_bytes,
                              &ctx->scratchpad));
    for (int i = 0; i < ctx->n_prims; i++)
        if (ctx->prims[i]->scratchpad)
            ST_DNNL(dnnl_memory_set_data_handle(ctx->prims[i]->scratchpad, ctx->scratchpad),
                    "attaching the scratchpad");
    return ST_OK;
}

st_status st_nn_ctx_add_copy(st_nn_ctx *ctx, const float *src, st_bf16 *dst, size_t n, int *id)
{
    ST_TRY(grow((void **)&ctx->copies, &ctx->cap_copies, ctx->n_copies + 1,
                sizeof *ctx->copies));
    ctx->copies[ctx->n_copies] = (struct st_weight_copy){
        .src = src, .dst = dst, .n = n, .shared = dst == st_nn_shared_copy(ctx, src, n) };
    *id = ctx->n_copies++;
    return ST_OK;
}

/* Offsets of indices 0..n-1 along dim d of the blocked md: an element's
 * offset in a blocked layout is a sum of one term per dim (its outer block
 * times the dim's stride, plus its digits in the inner blocks). */
static void dim_offsets(const dnnl_memory_desc_t *md, int d, int64_t n, int64_t *at)
{
    const dnnl_blocking_desc_t *b = &md->format_desc.blocking;
    int64_t block = 1;
    for (int k = 0; k < b->inner_nblks; k++)
        if (b->inner_idxs[k] == d)
            block *= b->inner_blks[k];
    for (int64_t i = 0; i < n; i++) {
        int64_t off = (i / block) * b->strides[d], stride = 1, below = 1;
        for (int k = b->inner_nblks - 1; k >= 0; k--) {   /* innermost first */
            if (b->inner_idxs[k] == d) {
                off += (i / below % b->inner_blks[k]) * stride;
                below *= b->inner_blks[k];
            }
            stride *= b->inner_blks[k];
        }
        at[i] = off;
    }
}

st_status st_nn_ctx_add_blocked_copy(st_nn_ctx *ctx, const float *src, st_bf16 *dst,
                                     int64_t rows, int64_t cols, const dnnl_memory_desc_t *md,
                                     int row_dim, int *id)
{
    if (md->ndims != 2 || md->format_kind != dnnl_blocked || md->data_type != dnnl_bf16 ||
        md->dims[row_dim] != rows || md->dims[1 - row_dim] != cols)
        return st_fail(ST_ERR_INVALID, "a blocked weight copy of %lld x %lld: the product's "
                       "weights are not a 2-d bf16 blocked matrix of that shape",
                       (long long)rows, (long long)cols);
    int64_t *row_at = malloc((size_t)(rows + cols) * sizeof *row_at);
    if (!row_at)
        return st_fail(ST_ERR_NOMEM, "out of memory for a blocked weight copy's offsets");
    dim_offsets(md, row_dim, rows, row_at);
    dim_offsets(md, 1 - row_dim, cols, row_at + rows);
    for (int64_t r = 0; r < rows; r++)
        row_at[r] += md->offset0;
    st_status s = st_nn_ctx_add_copy(ctx, src, dst, (size_t)(rows * cols), id);
    if (s != ST_OK) {
        free(row_at);
        return s;
    }
    struct st_weight_copy *c = &ctx->copies[*id];
    c->blk = (struct st_blocked_copy){ .bf16 = dst, .row_at = row_at, .col_at = row_at + rows };
    st_blocked_pattern(&c->blk, rows, cols);
    c->rows = rows;
    c->cols = cols;
    return ST_OK;
}

st_status st_nn_ctx_ones(st_nn_ctx *ctx, int64_t n, const float **out)
{
    if (n > ctx->n_ones) {
        ST_TRY(st_arena_alloc_floats(ctx->arena, ST_MEM_WORKSPACE, (size_t)n, &ctx->ones));
        for (int64_t i = 0; i < n; i++)
            ctx->ones[i] = 1.0f;
        ctx->n_ones = n;
    }
    *out = ctx->ones;
    return ST_OK;
}

void st_nn_ctx_destroy(st_nn_ctx *ctx)
{
    for (int i = 0; i < ctx->n_copies; i++)
        free((int64_t *)ctx->copies[i].blk.row_at);   /* col_at lies in the same block */
    for (int i = 0; i < ctx->n_prims; i++) {
        dnnl_primitive_destroy(ctx->prims[i]->prim);
        if (ctx->prims[i]->scratchpad)
            dnnl_memory_destroy(ctx->prims[i]->scratchpad);
    }
    for (int i = 0; i < ctx->n_mems; i++)
        dnnl_memory_destroy(ctx->mems[i]);
    free(ctx->prims);
    free(ctx->mems);
    free(ctx->slot_mems);
    free(ctx->copies);
    if (ctx->attr)
        dnnl_primitive_attr_destroy(ctx->attr);
    if (ctx->stream)
        dnnl_stream_destroy(ctx->stream);
    if (ctx->engine)
        dnnl_engine_destroy(ctx->engine);
    memset(ctx, 0, sizeof *ctx);
}

/* The primitive of a primitive descriptor `pd` (created by the caller, after
 * p was cleared and the tracking array grown): its scratchpad, tracking. */
static st_status prim_from_pd(st_nn_ctx *ctx, st_prim *p, dnnl_primitive_desc_t pd,
                              const char *what, dnnl_primitive_desc_t *pd_out)
{
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t sbytes = smd ? dnnl_memory_desc_get_size(smd) : 0;
    /* a model laid out in a sizing arena never runs: the descriptor says
     * what it takes (its scratchpad), the primitive itself is not made */
    const int runs = !(ctx->arena && st_arena_is_sizing(ctx->arena));
    dnnl_status_t s = runs ? dnnl_primitive_create(&p->prim, pd) : dnnl_success;
    if (s == dnnl_success && sbytes > 0 && runs)
        s = dnnl_memory_create(&p->scratchpad, smd, ctx->engine, DNNL_MEMORY_NONE);
    if (s != dnnl_success || !pd_out)
        dnnl_primitive_desc_destroy(pd);
    else
        *pd_out = pd;
    if (s != dnnl_success)
        return st_dnnl_fail(s, what, __FILE__, __LINE__);

    if (sbytes > ctx->scratchpad_bytes)
        ctx->scratchpad_bytes = sbytes;
    if (p->scratchpad)
        st_prim_arg(p, DNNL_ARG_SCRATCHPAD, p->scratchpad);
    ctx->prims[ctx->n_prims++] = p;
    return ST_OK;
}

/* attr is ctx->attr with what `variant` says (NULL: nothing more). */
static st_status prim_create(st_nn_ctx *ctx, st_prim *p, const void *op_desc,
                             const_dnnl_primitive_desc_t hint, const_dnnl_primitive_attr_t attr,
                             const st_pd_variant *variant, const char *what,
                             dnnl_primitive_desc_t *pd_out)
{
    memset(p, 0, sizeof *p);
    p->what = what;
    ST_TRY(grow((void **)&ctx->prims, &ctx->cap_prims, ctx->n_prims + 1, sizeof *ctx->prims));

    st_pd_variant plain;
    if (!variant) {
        memset(&plain, 0, sizeof plain);
        plain.scale = 1.0f;
        variant = &plain;
    }
    dnnl_primitive_desc_t pd;
    int id;
    ST_TRY(st_pd_memo_create(ctx->arena, &pd, op_desc, variant, attr, ctx->engine, hint, &id,
                             what));
    ST_TRY(prim_from_pd(ctx, p, pd, what, pd_out));
    if (pd_out)
        st_pd_memo_given(ctx->arena, *pd_out, id);
    return ST_OK;
}

st_status st_prim_create_reorder(st_nn_ctx *ctx, st_prim *p, dnnl_memory_t src,
                                 dnnl_memory_t dst, const char *what)
{
    memset(p, 0, sizeof *p);
    p->what = what;
    ST_TRY(grow((void **)&ctx->prims, &ctx->cap_prims, ctx->n_prims + 1, sizeof *ctx->prims));
    const dnnl_memory_desc_t *src_md, *dst_md;
    ST_DNNL(dnnl_memory_get_memory_desc(src, &src_md), what);
    ST_DNNL(dnnl_memory_get_memory_desc(dst, &dst_md), what);
    dnnl_primitive_desc_t pd;
    ST_TRY(st_pd_memo_reorder(ctx->arena, &pd, src_md, dst_md, ctx->attr, ctx->engine, what));
    ST_TRY(prim_from_pd(ctx, p, pd, what, NULL));
    st_prim_arg(p, DNNL_ARG_FROM, src);
    st_prim_arg(p, DNNL_ARG_TO, dst);
    return ST_OK;
}

st_status st_prim_create(st_nn_ctx *ctx, st_prim *p, const void *op_desc,
                         const_dnnl_primitive_desc_t hint, const char *what,
                         dnnl_primitive_desc_t *pd_out)
{
    return prim_create(ctx, p, op_desc, hint, ctx->attr, NULL, what, pd_out);
}

st_status st_prim_create_pair(st_nn_ctx *ctx, st_prim *fwd, const void *fwd_desc,
                              st_prim *bwd, const void *bwd_desc, const char *fwd_what,
                              const char *bwd_what)
{
    dnnl_primitive_desc_t fwd_pd;
    ST_TRY(st_prim_create(ctx, fwd, fwd_desc, NULL, fwd_what, &fwd_pd));
    st_status s = st_prim_create(ctx, bwd, bwd_desc, fwd_pd, bwd_what, NULL);
    dnnl_primitive_desc_destroy(fwd_pd);
    return s;
}

/* The context's attributes with the post-ops below, into *out (the
 * caller destroys it). */
static dnnl_status_t post_ops_attr(const st_nn_ctx *ctx, float scale,
                                   const dnnl_memory_desc_t *add0_md,
                                   const dnnl_memory_desc_t *add1_md, int relu,
                                   const dnnl_memory_desc_t *mul_md, dnnl_primitive_attr_t *out)
{
    dnnl_post_ops_t ops = NULL;
    dnnl_status_t s = dnnl_primitive_attr_clone(out, ctx->attr);
    if (s == dnnl_success)
        s = dnnl_post_ops_create(&ops);
    if (s == dnnl_success && scale != 1.0f)
        s = dnnl_post_ops_append_eltwise(ops, 1.0f, dnnl_eltwise_linear, scale, 0.0f);
    if (s == dnnl_success && add0_md)
        s = dnnl_post_ops_append_binary(ops, dnnl_binary_add, add0_md);
    if (s == dnnl_success && add1_md)
        s = dnnl_post_ops_append_binary(ops, dnnl_binary_add, add1_md);
    if (s == dnnl_success && relu)
        s = dnnl_post_ops_append_eltwise(ops, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f);
    if (s == dnnl_success && mul_md)
        s = dnnl_post_ops_append_binary(ops, dnnl_binary_mul, mul_md);
    if (s == dnnl_success)
        s = dnnl_primitive_attr_set_post_ops(*out, ops);
    if (ops)
        dnnl_post_ops_destroy(ops);
    return s;
}

/* A primitive with post-ops: the scale (an eltwise_linear; order matters:
 * it applies to the product, and its bias when the bias is the
 * primitive's own), then up to two binary adds, then a ReLU, then a binary
 * multiply. */
static st_status create_with_post_ops(st_nn_ctx *ctx, st_prim *p, const void *op_desc,
                                      const_dnnl_primitive_desc_t hint, float scale,
                                      const dnnl_memory_desc_t *add0_md,
                                      const dnnl_memory_desc_t *add1_md, int relu,
                                      const dnnl_memory_desc_t *mul_md, const char *what,
                                      dnnl_primitive_desc_t *pd_out)
{
    if (scale == 1.0f && !add0_md && !add1_md && !relu && !mul_md)
        return st_prim_create(ctx, p, op_desc, hint, what, pd_out);
    st_pd_variant v;   /* field by field over zeros: its bytes are a key */
    memset(&v, 0, sizeof v);
    v.scale = scale;
    v.relu = relu;
    v.has_add0 = add0_md != NULL;
    v.has_add1 = add1_md != NULL;
    v.has_mul = mul_md != NULL;
    if (add0_md)
        v.add0 = *add0_md;
    if (add1_md)
        v.add1 = *add1_md;
    if (mul_md)
        v.mul = *mul_md;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_status_t s = post_ops_attr(ctx, scale, add0_md, add1_md, relu, mul_md, &attr);
    st_status st = s == dnnl_success ? prim_create(ctx, p, op_desc, hint, attr, &v, what, pd_out)
                                     : st_dnnl_fail(s, what, __FILE__, __LINE__);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    return st;
}

st_status st_prim_impl(st_nn_ctx *ctx, const void *op_desc, float scale,
                       const dnnl_memory_desc_t *add0_md, char *name, size_t n,
                       dnnl_memory_desc_t *dst_md)
{
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    const char *impl = NULL;
    dnnl_status_t s = post_ops_attr(ctx, scale, add0_md, NULL, 0, NULL, &attr);
    if (s == dnnl_success)
        s = dnnl_primitive_desc_create(&pd, op_desc, attr, ctx->engine, NULL);
    if (s == dnnl_success)
        s = dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    if (s == dnnl_success) {
        snprintf(name, n, "%s", impl);
        *dst_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
    }
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    return s == dnnl_success ? ST_OK : st_dnnl_fail(s, "probing an implementation", __FILE__,
                                                     __LINE__);
}

st_status st_prim_create_with_post_ops(st_nn_ctx *ctx, st_prim *p, const void *op_desc,
                                       float scale, const dnnl_memory_desc_t *add0_md,
                                       const dnnl_memory_desc_t *add1_md, const char *what)
{
    return create_with_post_ops(ctx, p, op_desc, NULL, scale, add0_md, add1_md, 0, NULL, what,
                                NULL);
}

st_status st_prim_create_with_relu(st_nn_ctx *ctx, st_prim *p, const void *op_desc, float scale,
                                   const dnnl_memory_desc_t *add0_md,
                                   const dnnl_memory_desc_t *add1_md, const char *what)
{
    return create_with_post_ops(ctx, p, op_desc, NULL, scale, add0_md, add1_md, 1, NULL, what,
                                NULL);
}

st_status st_prim_create_masked(st_nn_ctx *ctx, st_prim *p, const void *op_desc, float scale,
                                const dnnl_memory_desc_t *mask_md, const char *what)
{
    return create_with_post_ops(ctx, p, op_desc, NULL, scale, NULL, NULL, 0, mask_md, what,
                                NULL);
}

st_status st_prim_create_fused(st_nn_ctx *ctx, st_prim *p, const void *op_desc, float scale,
                               const dnnl_memory_desc_t *add0_md,
                               const dnnl_memory_desc_t *add1_md, int relu,
                               const dnnl_memory_desc_t *mask_md, const char *what,
                               dnnl_primitive_desc_t *pd_out)
{
    return create_with_post_ops(ctx, p, op_desc, NULL, scale, add0_md, add1_md, relu, mask_md,
                                what, pd_out);
}

st_status st_prim_create_scaled(st_nn_ctx *ctx, st_prim *p, const void *op_desc,
                                const_dnnl_primitive_desc_t hint, float scale, const char *what,
                                dnnl_primitive_desc_t *pd_out)
{
    return create_with_post_ops(ctx, p, op_desc, hint, scale, NULL, NULL, 0, NULL, what, pd_out);
}

void st_prim_arg(st_prim *p, int arg, dnnl_memory_t mem)
{
    /* Arguments are bound at build time from a fixed list per layer, so
     * overflowing is a programming error, caught by the tests. */
    if (p->nargs < ST_PRIM_MAX_ARGS)
        p->args[p->nargs++] = (dnnl_exec_arg_t){ arg, mem };
}

st_status st_prim_run(const st_nn_ctx *ctx, const st_prim *p)
{
    ST_DNNL(dnnl_primitive_execute(p->prim, ctx->stream, p->nargs, p->args), p->what);
    return ST_OK;
}

void st_md_strided(dnnl_memory_desc_t *md, int64_t rows, int64_t cols,
                   int64_t row_stride, int64_t col_stride)
{
    dnnl_dims_t dims = { rows, cols };
    dnnl_dims_t strides = { row_stride, col_stride };
    dnnl_memory_desc_init_by_strides(md, 2, dims, dnnl_f32, strides);
}

void st_md_matrix(dnnl_memory_desc_t *md, int64_t rows, int64_t cols)
{
    st_md_strided(md, rows, cols, cols, 1);
}

void st_md_vector(dnnl_memory_desc_t *md, int64_t n)
{
    dnnl_dims_t dims = { n };
    dnnl_memory_desc_init_by_tag(md, 1, dims, dnnl_f32, dnnl_a);
}

void st_md_tag(dnnl_memory_desc_t *md, int ndims, const int64_t *dims, dnnl_format_tag_t tag)
{
    dnnl_dims_t d;
    for (int i = 0; i < ndims; i++)
        d[i] = dims[i];
    dnnl_memory_desc_init_by_tag(md, ndims, d, dnnl_f32, tag);
}

void st_md_tag_bf16(dnnl_memory_desc_t *md, int ndims, const int64_t *dims,
                    dnnl_format_tag_t tag)
{
    dnnl_dims_t d;
    for (int i = 0; i < ndims; i++)
        d[i] = dims[i];
    dnnl_memory_desc_init_by_tag(md, ndims, d, dnnl_bf16, tag);
}

static int has_avx512(void)
{
    const unsigned avx512 = (unsigned)dnnl_cpu_isa_avx512_core;
    return ((unsigned)dnnl_get_effective_cpu_isa() & avx512) == avx512;
}

dnnl_format_tag_t st_blocked_tag(void)
{
    return has_avx512() ? dnnl_aBcd16b : dnnl_aBcd8b;
}

int64_t st_blocked_channels(void)
{
    return has_avx512() ? 16 : 8;
}

/* Asked once per precision of a 3x3 convolution on 16 channels: the
 * layout depends on the ISA oneDNN dispatches to, not on the shape. */
static int conv_nhwc[2];
static pthread_once_t conv_once[2] = { PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT };

static void ask_conv(int bf16)
{
    dnnl_engine_t engine = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_convolution_desc_t cd;
    dnnl_memory_desc_t x, w, y, nhwc;
    const dnnl_dims_t xd = { 32, 16, 14, 14 }, wd = { 16, 16, 3, 3 }, one = { 1, 1 };
    const dnnl_data_type_t t = bf16 ? dnnl_bf16 : dnnl_f32;
    dnnl_memory_desc_init_by_tag(&x, 4, xd, t, dnnl_format_tag_any);
    dnnl_memory_desc_init_by_tag(&w, 4, wd, t, dnnl_format_tag_any);
    dnnl_memory_desc_init_by_tag(&y, 4, xd, dnnl_f32, dnnl_format_tag_any);
    dnnl_memory_desc_init_by_tag(&nhwc, 4, xd, t, dnnl_nhwc);
    if (dnnl_engine_create(&engine, dnnl_cpu, 0) == dnnl_success &&
        dnnl_convolution_forward_desc_init(&cd, dnnl_forward_training, dnnl_convolution_direct,
                                           &x, &w, NULL, &y, one, one, one) == dnnl_success &&
        dnnl_primitive_desc_create(&pd, &cd, NULL, engine, NULL) == dnnl_success)
        conv_nhwc[bf16] =
            dnnl_memory_desc_equal(dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0), &nhwc);
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (engine)
        dnnl_engine_destroy(engine);
}

static void ask_conv_fp32(void)
{
    ask_conv(0);
}

static void ask_conv_bf16(void)
{
    ask_conv(1);
}

int st_conv_takes_nhwc(int bf16)
{
    bf16 = bf16 != 0;
    pthread_once(&conv_once[bf16], bf16 ? ask_conv_bf16 : ask_conv_fp32);
    return conv_nhwc[bf16];
}

st_status st_mem_md(st_nn_ctx *ctx, dnnl_memory_t *out, const dnnl_memory_desc_t *md,
                    const void *data)
{
    ST_TRY(grow((void **)&ctx->mems, &ctx->cap_mems, ctx->n_mems + 1, sizeof *ctx->mems));
    /* oneDNN takes a non-const handle; read-only operands are never written. */
    ST_DNNL(dnnl_memory_create(out, md, ctx->engine, (void *)data), "creating a memory object");
    ctx->mems[ctx->n_mems++] = *out;
    return ST_OK;
}

static st_status track_memory(st_nn_ctx *ctx, dnnl_memory_t *out,
                              const dnnl_memory_desc_t *md, const float *data)
{
    return st_mem_md(ctx, out, md, data);
}

st_status st_mem_strided(st_nn_ctx *ctx, dnnl_memory_t *out, int64_t rows, int64_t cols,
                         int64_t row_stride, int64_t col_stride, const float *data)
{
    dnnl_memory_desc_t md;
    st_md_strided(&md, rows, cols, row_stride, col_stride);
    return track_memory(ctx, out, &md, data);
}

st_status st_mem_matrix(st_nn_ctx *ctx, dnnl_memory_t *out, int64_t rows, int64_t cols,
                        const float *data)
{
    return st_mem_strided(ctx, out, rows, cols, cols, 1, data);
}

void st_md_strided_bf16(dnnl_memory_desc_t *md, int64_t rows, int64_t cols,
                        int64_t row_stride, int64_t col_stride)
{
    dnnl_dims_t dims = { rows, cols };
    dnnl_dims_t strides = { row_stride, col_stride };
    dnnl_memory_desc_init_by_strides(md, 2, dims, dnnl_bf16, strides);
}

st_status st_mem_strided_bf16(st_nn_ctx *ctx, dnnl_memory_t *out, int64_t rows,
                              int64_t cols, int64_t row_stride, int64_t col_stride,
                              const st_bf16 *data)
{
    dnnl_memory_desc_t md;
    st_md_strided_bf16(&md, rows, cols, row_stride, col_stride);
    return st_mem_md(ctx, out, &md, data);
}

st_status st_mem_slot_md(st_nn_ctx *ctx, dnnl_memory_t *out, const dnnl_memory_desc_t *md,
                         int slot, size_t offset, size_t bytes)
{
    if (slot < 0 || slot >= ST_NN_SLOTS)
        return st_fail(ST_ERR_INVALID, "no shared slot %d", slot);
    ST_TRY(grow((void **)&ctx->slot_mems, &ctx->cap_slot_mems, ctx->n_slot_mems + 1,
                sizeof *ctx->slot_mems));
    ST_TRY(st_mem_md(ctx, out, md, NULL));   /* no buffer yet: finalize attaches the slot */
    ctx->slot_mems[ctx->n_slot_mems++] = (struct st_slot_mem){ *out, slot, offset };
    if (bytes > ctx->slot_bytes[slot])
        ctx->slot_bytes[slot] = bytes;
    return ST_OK;
}

st_status st_mem_slot_bf16(st_nn_ctx *ctx, dnnl_memory_t *out, int64_t rows, int64_t cols,
                           int64_t row_stride, int64_t col_stride, int slot, size_t offset,
                           size_t bytes)
{
    dnnl_memory_desc_t md;
    st_md_strided_bf16(&md, rows, cols, row_stride, col_stride);
    return st_mem_slot_md(ctx, out, &md, slot, offset, bytes);
}

st_status st_mem_vector(st_nn_ctx *ctx, dnnl_memory_t *out, int64_t n, const float *data)
{
    dnnl_memory_desc_t md;
    st_md_vector(&md, n);
    return track_memory(ctx, out, &md, data);
}

/* ------------------------------------------------------------ layouts */

st_status st_pass_run(const st_nn_ctx *ctx, const st_pass *p)
{
    for (int i = 0; i < p->n_pre; i++)
        ST_TRY(st_prim_run(ctx, &p->pre[i]));
    ST_TRY(st_prim_run(ctx, &p->prim));
    return p->has_post ? st_prim_run(ctx, &p->post) : ST_OK;
}

st_status st_view_init(st_nn_ctx *ctx, st_view *v, int ndims, const int64_t *dims,
                       dnnl_format_tag_t tag, const void *data, st_mem_kind kind,
                       st_slot slot, const char *reorder_in, const char *reorder_out)
{
    return st_view_init_as(ctx, v, ndims, dims, tag, 0, data, kind, slot, reorder_in,
                           reorder_out);
}

st_status st_view_init_as(st_nn_ctx *ctx, st_view *v, int ndims, const int64_t *dims,
                          dnnl_format_tag_t tag, int bf16, const void *data, st_mem_kind kind,
                          st_slot slot, const char *reorder_in, const char *reorder_out)
{
    memset(v, 0, sizeof *v);
    v->kind = kind;
    v->slot = slot;
    v->reorder_in = reorder_in;
    v->reorder_out = reorder_out;
    if (bf16)
        st_md_tag_bf16(&v->plain_md, ndims, dims, tag);
    else
        st_md_tag(&v->plain_md, ndims, dims, tag);
    return data ? st_mem_md(ctx, &v->plain, &v->plain_md, data) : ST_OK;
}

/* The copy of v in layout md: an existing one (*fresh = 0), else a new
 * buffer from the arena (*fresh = 1). */
static st_status view_copy(st_nn_ctx *ctx, st_view *v, const dnnl_memory_desc_t *md,
                           dnnl_memory_t *out, int *fresh)
{
    for (int i = 0; i < v->n; i++) {
        const dnnl_memory_desc_t *have;
        ST_DNNL(dnnl_memory_get_memory_desc(v->copy[i], &have), "querying a layout");
        if (dnnl_memory_desc_equal(have, md)) {
            *out = v->copy[i];
            *fresh = 0;
            return ST_OK;
        }
    }
    if (v->n == ST_VIEW_MAX_COPIES)
        return st_fail(ST_ERR_INVALID, "more than %d layouts of one tensor (%s)",
                       ST_VIEW_MAX_COPIES, v->reorder_in ? v->reorder_in : v->reorder_out);
    const size_t bytes = dnnl_memory_desc_get_size(md);
    if (v->slot == ST_SLOT_KEEP) {
        void *buf;
        ST_TRY(st_arena_alloc(ctx->arena, v->kind, bytes, &buf));
        ST_TRY(st_mem_md(ctx, &v->copy[v->n], md, buf));
    } else {
        /* no buffer yet: finalize hands it the shared slot */
        ST_TRY(grow((void **)&ctx->slot_mems, &ctx->cap_slot_mems, ctx->n_slot_mems + 1,
                    sizeof *ctx->slot_mems));
        ST_TRY(st_mem_md(ctx, &v->copy[v->n], md, NULL));
        ctx->slot_mems[ctx->n_slot_mems++] = (struct st_slot_mem){ v->copy[v->n], v->slot, 0 };
        if (bytes > ctx->slot_bytes[v->slot])
            ctx->slot_bytes[v->slot] = bytes;
    }
    *out = v->copy[v->n++];
    *fresh = 1;
    return ST_OK;
}

st_status st_view_input(st_nn_ctx *ctx, st_pass *p, st_view *v, int arg,
                        const dnnl_memory_desc_t *md, int shared)
{
    if (!v->plain)
        return st_fail(ST_ERR_INVALID, "an input without a buffer (%s)", v->reorder_in);
    if (dnnl_memory_desc_equal(md, &v->plain_md)) {
        st_prim_arg(&p->prim, arg, v->plain);
        return ST_OK;
    }
    dnnl_memory_t copy;
    int fresh;
    ST_TRY(view_copy(ctx, v, md, &copy, &fresh));
    if (fresh || !shared) {
        if (p->n_pre == ST_PASS_MAX_PRE)
            return st_fail(ST_ERR_INVALID, "more than %d reorders before a pass (%s)",
                           ST_PASS_MAX_PRE, v->reorder_in);
        ST_TRY(st_prim_create_reorder(ctx, &p->pre[p->n_pre++], v->plain, copy, v->reorder_in));
    }
    st_prim_arg(&p->prim, arg, copy);
    return ST_OK;
}

st_status st_view_output(st_nn_ctx *ctx, st_pass *p, st_view *v, int arg,
                         const dnnl_memory_desc_t *md)
{
    if (!v->plain)
        return st_fail(ST_ERR_INVALID, "an output without a buffer (%s)", v->reorder_out);
    if (dnnl_memory_desc_equal(md, &v->plain_md)) {
        st_prim_arg(&p->prim, arg, v->plain);
        return ST_OK;
    }
    if (p->has_post)
        return st_fail(ST_ERR_INVALID, "two reordered outputs of one pass (%s)", v->reorder_out);
    dnnl_memory_t copy;
    int fresh;
    ST_TRY(view_copy(ctx, v, md, &copy, &fresh));
    ST_TRY(st_prim_create_reorder(ctx, &p->post, copy, v->plain, v->reorder_out));
    p->has_post = 1;
    st_prim_arg(&p->prim, arg, copy);
    return ST_OK;
}

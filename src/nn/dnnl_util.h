/*
 * nn/dnnl_util.h — private: the thin layer between subtrain and oneDNN.
 *
 * A model instance owns one st_nn_ctx: a CPU engine, an in-order stream, and
 * every primitive and memory object the instance created.  All primitives
 * are created once, when the model is built, with a user-managed scratchpad;
 * after st_nn_ctx_finalize() one workspace buffer (the largest scratchpad any
 * primitive asked for) is shared by all of them, which is safe because a
 * worker executes its primitives one at a time on its own stream.
 *
 * A training step only calls st_prim_run(): no allocation, no primitive
 * creation, no lock.
 */
#ifndef SUBTRAIN_NN_DNNL_UTIL_H
#define SUBTRAIN_NN_DNNL_UTIL_H

#include <stdint.h>
#include <string.h>
#include <oneapi/dnnl/dnnl.h>

#include <subtrain/arena.h>
#include <subtrain/params.h>
#include "core/bf16.h"
#include "core/error.h"

/* Calls a oneDNN function; on failure records which call failed, oneDNN's
 * status and a hint, and returns ST_ERR_DNNL from the enclosing function. */
#define ST_DNNL(call, what)                                                  \
    do {                                                                     \
        dnnl_status_t st_dnnl_status_ = (call);                              \
        if (st_dnnl_status_ != dnnl_success)                                 \
            return st_dnnl_fail(st_dnnl_status_, (what), __FILE__, __LINE__); \
    } while (0)

st_status st_dnnl_fail(dnnl_status_t s, const char *what, const char *file, int line);

#define ST_PRIM_MAX_ARGS 12

/* A primitive with its execution arguments, bound once at build time. */
typedef struct st_prim {
    dnnl_primitive_t prim;
    dnnl_memory_t scratchpad;  /* handle set by st_nn_ctx_finalize */
    int nargs;
    dnnl_exec_arg_t args[ST_PRIM_MAX_ARGS];
    const char *what;          /* for error messages: "linear forward", ... */
} st_prim;

typedef struct st_nn_ctx {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    dnnl_primitive_attr_t attr;  /* scratchpad_mode_user */
    st_arena *arena;             /* the owner's arena: workspace comes from it */
    size_t scratchpad_bytes;     /* largest scratchpad requested so far */
    void *scratchpad;            /* shared workspace, after finalize */
    float *ones;                 /* n_ones ones, for batch sums */
    float bn_momentum;           /* of the running statistics' update in the next
                                  * training forward; 0: ST_BATCHNORM_MOMENTUM
                                  * (st_model_calibrate sets 1 / (k + 1)) */
    int64_t n_ones;
    /* Everything created, for st_nn_ctx_destroy.  Grown at build time only. */
    st_prim **prims;
    int n_prims, cap_prims;
    dnnl_memory_t *mems;
    int n_mems, cap_mems;
    /* Blocked copies that live within one pass (st_view, ST_SLOT_*): all
     * layers share ST_NN_SLOTS buffers, each as large as its largest copy,
     * allocated by finalize like the scratchpad. */
    size_t slot_bytes[2];        /* largest requested so far, per slot */
    size_t slot_have[2];         /* allocated, after finalize */
    void *slot[2];
    struct st_slot_mem {
        dnnl_memory_t mem;
        int slot;
        size_t offset;           /* bytes into the slot where its data starts */
    } *slot_mems;                /* the copies living in a slot */
    int n_slot_mems, cap_slot_mems;
    /* bf16 copies of weights (a linear layer's, made by a reorder in its
     * forward), so that the model can hand those that lie in its
     * parameter vector to the update (st_param_copy), which then writes
     * them itself.  Grown at build time only. */
    struct st_weight_copy {
        const float *src;
        st_bf16 *dst;
        size_t n;
        int listed;              /* in the model's list of st_param_copy */
        int shared;              /* dst is in shared storage: never converted here */
        /* blk.row_at NULL: dst is in src's order.  Else dst (blk.bf16) is
         * in a product's blocked layout (--weight-layout blocked): src is
         * a row-major (rows, cols) matrix whose element (r, c) lies at
         * dst[blk.row_at[r] + blk.col_at[c]]. */
        struct st_blocked_copy blk;
        int64_t rows, cols;
    } *copies;
    int n_copies, cap_copies;
    /* Set by the model when the update wrote every listed copy since the
     * last training forward (st_model_copies_written); the layers then skip
     * their conversions in that forward, which clears it. */
    int copies_current;
    /* The same for the blocked copies, which only a worker's own update
     * writes (st_model_copies_current). */
    int blocked_current;
    /* Shared storage of the weights' bf16 copies (st_model_create_on):
     * the copy of params[i] is at copy_store[i], params being copy_base's
     * copy_n floats.  NULL: each layer has its own. */
    const float *copy_base;
    st_bf16 *copy_store;
    size_t copy_n;
    /* Shared storage of the blocked copies (st_model_storage.blocked) of
     * the weights among params, params_n floats; NULL: the arena's. */
    struct st_blocked_store *blocked_store;
    const float *params;
    size_t params_n;
} st_nn_ctx;

#define ST_NN_SLOTS 2

st_status st_nn_ctx_init(st_nn_ctx *ctx, st_arena *arena);
/* Allocates the shared workspace and hands it to every primitive, and the
 * shared slots of the blocked copies (st_view) to their memory objects. */
st_status st_nn_ctx_finalize(st_nn_ctx *ctx);
void st_nn_ctx_destroy(st_nn_ctx *ctx);
/* Registers the bf16 copy dst of the n weights at src (made by the layer's
 * own reorder); *id is what st_nn_copy_fresh takes. */
st_status st_nn_ctx_add_copy(st_nn_ctx *ctx, const float *src, st_bf16 *dst, size_t n, int *id);
/* Where the bf16 copy of the n weights at src lives when the context's
 * copies are in shared storage and src is among its parameters; NULL: the
 * layer makes its own (from the arena). */
static inline st_bf16 *st_nn_shared_copy(const st_nn_ctx *ctx, const float *src, size_t n)
{
    if (!ctx->copy_store || src < ctx->copy_base || src + n > ctx->copy_base + ctx->copy_n)
        return NULL;
    return ctx->copy_store + (src - ctx->copy_base);
}
/* Whether copy id holds the current weights already (written by the update
 * after the last training forward, or shared: kept current by whoever
 * writes the weights): the layer need not convert. */
static inline int st_nn_copy_fresh(const st_nn_ctx *ctx, int id)
{
    const struct st_weight_copy *c = &ctx->copies[id];
    if (!c->listed)
        return 0;
    return c->blk.row_at ? ctx->blocked_current || c->shared : ctx->copies_current || c->shared;
}
/* Registers dst, the bf16 copy of the row-major (rows, cols) weights at
 * src in the blocked layout md (the product's weights, whose dim row_dim
 * the rows index, the other the columns). */
st_status st_nn_ctx_add_blocked_copy(st_nn_ctx *ctx, const float *src, st_bf16 *dst,
                                     int64_t rows, int64_t cols, const dnnl_memory_desc_t *md,
                                     int row_dim, int *id);
/* A read-only vector of at least n ones (from the arena, shared). */
st_status st_nn_ctx_ones(st_nn_ctx *ctx, int64_t n, const float **out);

/* Creates the primitive for `op_desc` (any oneDNN *_desc_t); `hint` is the
 * forward primitive descriptor for backward ones, else NULL.  If pd_out is
 * not NULL the primitive descriptor is returned (caller destroys it). */
st_status st_prim_create(st_nn_ctx *ctx, st_prim *p, const void *op_desc,
                         const_dnnl_primitive_desc_t hint, const char *what,
                         dnnl_primitive_desc_t *pd_out);
/* A forward primitive and its backward, which oneDNN builds from the
 * forward's primitive descriptor (the hint). */
st_status st_prim_create_pair(st_nn_ctx *ctx, st_prim *fwd, const void *fwd_desc,
                              st_prim *bwd, const void *bwd_desc, const char *fwd_what,
                              const char *bwd_what);

/* The same with post-ops fused into the primitive: dst = scale * dst
 * (skipped when scale is 1), then dst += add0, then dst += add1 for each
 * of add0_md, add1_md that is not NULL (binary adds; a (1, n) operand is
 * broadcast over the rows).  The caller binds add j with
 * st_prim_arg(p, DNNL_ARG_ATTR_MULTIPLE_POST_OP(i) | DNNL_ARG_SRC_1, mem),
 * i being its position in the list (st_post_op_index). */
st_status st_prim_create_with_post_ops(st_nn_ctx *ctx, st_prim *p, const void *op_desc,
                                       float scale, const dnnl_memory_desc_t *add0_md,
                                       const dnnl_memory_desc_t *add1_md, const char *what);
/* The same, then dst = max(dst, 0) (an eltwise ReLU post-op, last: the
 * binary adds keep their positions). */
st_status st_prim_create_with_relu(st_nn_ctx *ctx, st_prim *p, const void *op_desc, float scale,
                                   const dnnl_memory_desc_t *add0_md,
                                   const dnnl_memory_desc_t *add1_md, const char *what);
/* The same with dst = scale * dst, then dst *= mask (a binary multiply
 * by a tensor of dst's shape; bind it at st_post_op_index(scale, NULL,
 * 0)). */
st_status st_prim_create_masked(st_nn_ctx *ctx, st_prim *p, const void *op_desc, float scale,
                                const dnnl_memory_desc_t *mask_md, const char *what);
/* Any of the three above (relu, mask_md: the ReLU and the multiply), and
 * its primitive descriptor (the caller destroys it): what a layer asks
 * for the layouts the primitive picked for format_tag_any operands. */
st_status st_prim_create_fused(st_nn_ctx *ctx, st_prim *p, const void *op_desc, float scale,
                               const dnnl_memory_desc_t *add0_md,
                               const dnnl_memory_desc_t *add1_md, int relu,
                               const dnnl_memory_desc_t *mask_md, const char *what,
                               dnnl_primitive_desc_t *pd_out);
/* st_prim_create with dst = scale * dst fused as an eltwise_linear
 * post-op (alpha = scale, beta = 0); scale 1: exactly st_prim_create. */
st_status st_prim_create_scaled(st_nn_ctx *ctx, st_prim *p, const void *op_desc,
                                const_dnnl_primitive_desc_t hint, float scale, const char *what,
                                dnnl_primitive_desc_t *pd_out);
/* The implementation oneDNN picks for op_desc with the scale and a binary
 * add (add0_md, NULL: none) as post-ops, its name (the verbose log's) into
 * name, and its dst layout: made and dropped, for a caller that fuses a
 * post-op only where it keeps the kernel. */
st_status st_prim_impl(st_nn_ctx *ctx, const void *op_desc, float scale,
                       const dnnl_memory_desc_t *add0_md, char *name, size_t n,
                       dnnl_memory_desc_t *dst_md);
/* Position of binary add j (0 or 1) among the post-ops above. */
static inline int st_post_op_index(float scale, const dnnl_memory_desc_t *add0_md, int j)
{
    return (scale != 1.0f) + (j == 1 && add0_md != NULL);
}
/* A reorder primitive copying src into dst (the same tensor in two
 * layouts, e.g. plain nchw and oneDNN's blocked nChw16c), its arguments
 * bound. */
st_status st_prim_create_reorder(st_nn_ctx *ctx, st_prim *p, dnnl_memory_t src,
                                 dnnl_memory_t dst, const char *what);
void st_prim_arg(st_prim *p, int arg, dnnl_memory_t mem);
/* The per-step call. */
st_status st_prim_run(const st_nn_ctx *ctx, const st_prim *p);

/* Memory objects over caller-owned buffers (never copied).  A row-major
 * (rows, cols) matrix, the same viewed through arbitrary strides (used to
 * read a matrix as its transpose), and a vector. */
st_status st_mem_matrix(st_nn_ctx *ctx, dnnl_memory_t *out, int64_t rows,
                        int64_t cols, const float *data);
st_status st_mem_strided(st_nn_ctx *ctx, dnnl_memory_t *out, int64_t rows,
                         int64_t cols, int64_t row_stride, int64_t col_stride,
                         const float *data);
st_status st_mem_vector(st_nn_ctx *ctx, dnnl_memory_t *out, int64_t n,
                        const float *data);

/* A memory object with any descriptor (a tensor's plain or blocked layout)
 * over a buffer of dnnl_memory_desc_get_size(md) bytes. */
st_status st_mem_md(st_nn_ctx *ctx, dnnl_memory_t *out, const dnnl_memory_desc_t *md,
                    const void *data);

/* bf16 (oneDNN's dnnl_bf16; st_bf16 and its conversions: core/bf16.h).
 * The same matrices as the f32 ones above, over bf16 buffers. */
void st_md_strided_bf16(dnnl_memory_desc_t *md, int64_t rows, int64_t cols,
                        int64_t row_stride, int64_t col_stride);
st_status st_mem_strided_bf16(st_nn_ctx *ctx, dnnl_memory_t *out, int64_t rows,
                              int64_t cols, int64_t row_stride, int64_t col_stride,
                              const st_bf16 *data);
/* The same over one of the context's shared slots (ST_SLOT_OUT, ST_SLOT_IN
 * below), its data `offset` bytes into it; the slot grows to hold `bytes`
 * (the whole buffer the views read, not only this one).  finalize attaches
 * it. */
st_status st_mem_slot_bf16(st_nn_ctx *ctx, dnnl_memory_t *out, int64_t rows, int64_t cols,
                           int64_t row_stride, int64_t col_stride, int slot, size_t offset,
                           size_t bytes);
/* The same with any descriptor (a batched view of several dims). */
st_status st_mem_slot_md(st_nn_ctx *ctx, dnnl_memory_t *out, const dnnl_memory_desc_t *md,
                         int slot, size_t offset, size_t bytes);

/* Matching memory descriptors, for building op descriptors. */
void st_md_matrix(dnnl_memory_desc_t *md, int64_t rows, int64_t cols);
void st_md_strided(dnnl_memory_desc_t *md, int64_t rows, int64_t cols,
                   int64_t row_stride, int64_t col_stride);
void st_md_vector(dnnl_memory_desc_t *md, int64_t n);
/* An f32 tensor of ndims (<= DNNL_MAX_NDIMS) dims in the layout `tag`
 * (dnnl_nchw, dnnl_oihw, ..., or dnnl_format_tag_any for a primitive to
 * choose). */
void st_md_tag(dnnl_memory_desc_t *md, int ndims, const int64_t *dims, dnnl_format_tag_t tag);
/* The same tensor in bf16 (a primitive's operand read as bf16: a view's
 * copy of an f32 tensor, made by a reorder). */
void st_md_tag_bf16(dnnl_memory_desc_t *md, int ndims, const int64_t *dims,
                    dnnl_format_tag_t tag);
/* The blocked activation layout oneDNN's JIT convolutions and batch norms
 * run on: nChw16c with AVX-512, nChw8c below; its channel block. */
dnnl_format_tag_t st_blocked_tag(void);
int64_t st_blocked_channels(void);
/* Whether oneDNN's convolution, left to choose, takes its activations
 * channels last (nhwc) in this precision on this CPU: AMX's bf16 kernels
 * do, the AVX-512 ones take nChw16c.  Asked once a process. */
int st_conv_takes_nhwc(int bf16);

/* ------------------------------------------------------------ layouts */

/* How a layer's primitives see the caller's plain tensors (NCHW, OIHW):
 * PLAIN, directly; BLOCKED, in oneDNN's blocked layouts (nChw16c, ...)
 * through copies made at build time, with reorders at the layer's
 * boundaries.  DEFAULT: the one measured faster for that layer. */
typedef enum st_layout {
    ST_LAYOUT_DEFAULT = 0,
    ST_LAYOUT_PLAIN,
    ST_LAYOUT_BLOCKED,
} st_layout;

/* A primitive with the reorders around it: pre (plain inputs -> blocked
 * copies), the primitive, post (its blocked output -> the plain buffer). */
#define ST_PASS_MAX_PRE 2
typedef struct st_pass {
    st_prim pre[ST_PASS_MAX_PRE];
    int n_pre;
    st_prim prim;
    st_prim post;
    int has_post;
} st_pass;

st_status st_pass_run(const st_nn_ctx *ctx, const st_pass *p);
/* How many reorders it runs (0 on the plain path). */
static inline int st_pass_reorders(const st_pass *p)
{
    return p->n_pre + p->has_post;
}

/* Where a tensor's blocked copies live.  ST_SLOT_KEEP: buffers of their
 * own from the arena (under the view's kind), for a copy read by a later
 * pass (x's, read by the backward; w's).  ST_SLOT_OUT, ST_SLOT_IN: one of
 * the context's shared buffers, for a copy that lives within a pass or a
 * layer's backward only (an output's copy, reordered out as soon as the
 * primitive ends; dy's, read by the two backward passes); OUT and IN are
 * distinct so that a pass can have one of each (dy's and dx's). */
typedef enum st_slot {
    ST_SLOT_KEEP = -1,
    ST_SLOT_OUT = 0,
    ST_SLOT_IN = 1,
} st_slot;

/* Build time only: a tensor in the caller's plain layout, and the blocked
 * copies the primitives asked for (one per distinct layout). */
#define ST_VIEW_MAX_COPIES 3
typedef struct st_view {
    const char *reorder_in, *reorder_out;  /* the reorders' names, for errors */
    st_mem_kind kind;
    st_slot slot;
    dnnl_memory_desc_t plain_md;
    dnnl_memory_t plain;                   /* NULL when data is NULL */
    int n;
    dnnl_memory_t copy[ST_VIEW_MAX_COPIES];
} st_view;

st_status st_view_init(st_nn_ctx *ctx, st_view *v, int ndims, const int64_t *dims,
                       dnnl_format_tag_t tag, const void *data, st_mem_kind kind,
                       st_slot slot, const char *reorder_in, const char *reorder_out);
/* The same over a caller's buffer of bf16 values when bf16 is set (a
 * tensor the graph stores as bf16, st_tensor.half): a primitive that
 * asks for bf16 in this layout reads or writes it as it is; the copies
 * and reorders for other layouts or types convert. */
st_status st_view_init_as(st_nn_ctx *ctx, st_view *v, int ndims, const int64_t *dims,
                          dnnl_format_tag_t tag, int bf16, const void *data, st_mem_kind kind,
                          st_slot slot, const char *reorder_in, const char *reorder_out);
/* Binds argument `arg` of p's primitive, read in layout md: the plain
 * buffer, or a blocked copy filled by a reorder before p.  With `shared`,
 * a copy in that layout made for an earlier pass is read as it is, without
 * a reorder of p's own (the caller guarantees that pass runs first, on the
 * same data). */
st_status st_view_input(st_nn_ctx *ctx, st_pass *p, st_view *v, int arg,
                        const dnnl_memory_desc_t *md, int shared);
/* Binds argument `arg` of p's primitive, written in layout md: the plain
 * buffer, or a blocked copy reordered into it after p. */
st_status st_view_output(st_nn_ctx *ctx, st_pass *p, st_view *v, int arg,
                         const dnnl_memory_desc_t *md);

#endif /* SUBTRAIN_NN_DNNL_UTIL_H */

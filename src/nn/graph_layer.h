/*
 * nn/graph_layer.h — private: a layer of a model's table (nn/graph.h) and
 * what its kind provides.  The graph (graph.c, graph_declare.c) walks the
 * table and calls each layer's kind; a kind's own computation is in
 * nn/layers.h and its file of src/nn/layers/.
 */
#ifndef SUBTRAIN_NN_GRAPH_LAYER_H
#define SUBTRAIN_NN_GRAPH_LAYER_H

#include <subtrain/model.h>
#include "nn/layers.h"

typedef struct st_model st_model;
typedef struct st_layer st_layer;

/* Where st_model_step_costs collects a step's work (nn/costs.c). */
typedef struct st_cost_sink {
    st_step_cost *out;
    int cap, n;
} st_cost_sink;
/* Adds c, merged into an entry of the same kind, precision and shape. */
void st_cost_add(st_cost_sink *s, st_step_cost c);
/* A product of count (m x k) x (k x n) matrices, operands read as
 * `operands` says, in calls executions. */
void st_cost_matmul(st_cost_sink *s, int bf16, st_cost_operands operands, int64_t m, int64_t n,
                    int64_t k, double count, double calls);
/* The same for attention's products over every head at once (heads). */
void st_cost_heads(st_cost_sink *s, int bf16, st_cost_operands operands, int64_t m, int64_t n,
                   int64_t k, double count);
/* An element-wise pass of op (a backward one: backward) over `elements`
 * values, `bytes` read and written, in calls executions. */
void st_cost_pass(st_cost_sink *s, st_cost_op op, int backward, double elements, double bytes,
                  double calls);
/* Bytes of tensor t (0: ST_T_NONE): 4 an element, 2 stored as bf16. */
double st_cost_tensor_bytes(const st_model *m, int t);
/* A pass that moves `bytes` (read and written): a copy, an add, a conversion. */
void st_cost_move(st_cost_sink *s, double bytes, double calls);
/* The cross-entropy loss over `logits` values: the log-softmax forward
 * (logits read, log-probabilities written) and its gradient (those read,
 * dlogits written). */
void st_cost_xent(st_cost_sink *s, double logits);

/* Which forward: training (batch statistics, saved for the backward; a
 * batch norm updates its running statistics) or inference (evaluation:
 * running statistics, nothing updated).  Most kinds compute the same. */
/* RECOMPUTE: a training forward run again before the backward of its
 * block (nn/recompute.c): the same batch statistics and saved buffers,
 * nothing updated (a batch norm's running statistics are the first
 * forward's). */
typedef enum st_phase { ST_PHASE_TRAIN, ST_PHASE_INFER, ST_PHASE_RECOMPUTE } st_phase;
/* What a layer kind provides.  Each kind is one file of src/nn/layers/
 * that defines one of these (their declarations follow); nothing else in
 * the graph knows the kinds. */
typedef struct st_layer_kind {
    const char *name;
    /* Appends its parameter segments (st_graph_add_segment), NULL: none. */
    st_status (*layout)(st_model *m, st_layer *l);
    /* Takes its own saved buffers from the arena (after the tensors). */
    st_status (*alloc)(st_model *m, st_layer *l);
    /* Creates its primitives against the model's buffers. */
    st_status (*build)(st_model *m, st_layer *l);
    st_status (*forward)(const st_nn_ctx *ctx, const st_layer *l, st_phase phase);
    st_status (*backward)(const st_nn_ctx *ctx, const st_layer *l);
    /* Matrix-multiply FLOPs of its forward and backward (2 per
     * multiply-add), NULL: none worth counting. */
    double (*flops)(const st_layer *l);
    /* Its products or convolutions and its own element-wise passes
     * (st_model_step_costs), of the forward only (a recomputed forward)
     * or of forward and backward; NULL: none, its passes are counted from
     * its tensors (st_cost_tensor_passes). */
    void (*costs)(const st_model *m, const st_layer *l, int forward_only, st_cost_sink *s);
    /* 1: its inputs' gradient is its output's (a join), so it passes the
     * question "is this gradient needed" on to what produced its inputs. */
    int transparent;
    /* Floats of the model's shared gradient scratch (st_graph_grad_scratch)
     * its backward (or, attention in bf16, its forward) needs in this
     * instance, NULL: none. */
    size_t (*grad_scratch)(const st_model *m, const st_layer *l);
    /* 1: a normalisation with scale and shift (gamma, beta over `out`
     * channels) whose backward computes their gradients even when they
     * are not kept (backward masking): they go to a shared scratch. */
    int norm;
    /* Which of the tensors its forward touches (x, y, residual) its
     * backward reads, ST_READS_* (it may depend on the instance: in bf16
     * a kind that keeps its own copy of x reads that, not x).  NULL: all
     * of them (the safe answer, for a kind that does not say).  In bf16 a
     * tensor that no backward reads lives during the forward only, from
     * its first use to its last, and shares a buffer with others that do
     * not overlap it (st_graph_build). */
    unsigned (*backward_reads)(const st_model *m, const st_layer *l);
    /* Which of its tensors it can take stored as bf16 in this instance
     * (ST_BF16_*; asked in bf16 only, after the graph has decided which
     * layers run a backward, l->backward), NULL: none.  The graph stores a
     * tensor as bf16 only where every layer touching it says it can
     * (st_graph_half); a kind's build then finds the answer in
     * st_graph_is_half / st_graph_data_bf16 and must handle either. */
    unsigned (*bf16_io)(const st_model *m, const st_layer *l);
} st_layer_kind;

/* st_layer_kind.backward_reads: its backward reads x, y, the residual. */
enum { ST_READS_X = 1u, ST_READS_Y = 2u, ST_READS_RESIDUAL = 4u,
       ST_READS_ALL = ST_READS_X | ST_READS_Y | ST_READS_RESIDUAL };

/* st_layer_kind.bf16_io: it can read x stored as bf16 (forward and
 * backward: where its backward reads x, ST_READS_X, it reads those bf16
 * values), write y as bf16, and (TIED) only both or neither (an eltwise
 * primitive runs on one data type).  DX, DY: it can write its input
 * gradient, read its output gradient, stored as bf16 (a data gradient
 * touched only by layers that say so: convolution, batch norm and pooling
 * between each other); TIED_GRADS with TIED: dx and dy tied to x and y
 * too (oneDNN's batch norm and pooling: one data type, gradients
 * included).  A residual stays fp32 whatever it says. */
enum { ST_BF16_X = 1u, ST_BF16_Y = 2u, ST_BF16_TIED = 4u, ST_BF16_DX = 8u, ST_BF16_DY = 16u,
       ST_BF16_TIED_GRADS = 32u,
       /* x, y, dx and dy all bf16 or all fp32 (batch norm, max pooling) */
       ST_BF16_ALL_TIED = ST_BF16_X | ST_BF16_Y | ST_BF16_DX | ST_BF16_DY | ST_BF16_TIED |
                          ST_BF16_TIED_GRADS };

extern const st_layer_kind st_layer_linear;     /* nn/layers/linear.c */
extern const st_layer_kind st_layer_activation; /* nn/layers/activation.c */
extern const st_layer_kind st_layer_layernorm;  /* nn/layers/layernorm.c */
extern const st_layer_kind st_layer_residual;   /* nn/layers/residual.c */
extern const st_layer_kind st_layer_join;       /* nn/layers/residual.c */
extern const st_layer_kind st_layer_conv;       /* nn/layers/conv.c */
extern const st_layer_kind st_layer_batchnorm;  /* nn/layers/batchnorm.c */
extern const st_layer_kind st_layer_avgpool;    /* nn/layers/pool.c: global average */
extern const st_layer_kind st_layer_maxpool;    /* nn/layers/pool.c */
extern const st_layer_kind st_layer_embedding;  /* nn/layers/embedding.c */
extern const st_layer_kind st_layer_attention;  /* nn/layers/attention.c */
extern const st_layer_kind st_layer_patches;    /* nn/layers/patch.c */
extern const st_layer_kind st_layer_positions;  /* nn/layers/tokens.c */
extern const st_layer_kind st_layer_token_pool; /* nn/layers/tokens.c */

struct st_layer {
    const st_layer_kind *kind;
    char name[32];         /* its segments' prefix, in the full model */
    int group;             /* layer group (-1: held by every subnetwork) */
    int block;             /* recomputation block: 2 x its group, or 2 x
                            * what st_graph_block declares + 1 (-1: none,
                            * never recomputed) */
    int section;           /* st_graph_section when declared (a ResNet's stage) */
    int x, y, dx, dy;      /* tensors: input, output and their gradients
                            * (dx ST_T_NONE: nobody needs dL/dx) */
    int64_t in, out;       /* full widths */
    int in_unit, out_unit; /* width layers of its input and output (ST_W_FULL) */
    /* linear */
    int residual;          /* tensor added to y in the same pass (the skip) */
    int in_major;          /* weights stored (in, out): a row per input */
    int closes_group;      /* the last layer of a group's branch: its
                            * product is scaled by the branch scale */
    int copies;            /* its outputs are `copies` runs of its width
                            * layer's neurons (a fused Q, K, V projection:
                            * 3), its weight rows alike; 1: plain */
    int32_t *copy_ids;     /* layout of a linear layer with copies: its
                            * kept rows (and those with gradients) in the
                            * full matrix, and their runs, owned */
    int32_t *copy_grad_ids;
    st_row_run *copy_runs;
    /* attention */
    int heads;             /* of the full layer (its width layer's units are
                            * groups of whole heads) */
    int noncausal;         /* 1: no causal mask (a ViT's encoder) */
    /* patches (its side: kernel), positions, token pool */
    int64_t tokens;        /* positions: rows a sample out; pool: in */
    int class_token;       /* positions: prepends one; pool: reads it */
    /* activation */
    st_activation activation;
    int fuse_relu;         /* batch norm: y = relu(bn(x)), the ReLU fused in;
                            * linear: a ReLU post-op, and its activation layer
                            * (in place on y) runs the backward only */
    int fold_relu;         /* a fused ReLU's activation layer and the linear
                            * layer after it: the ReLU's backward is a post-op
                            * of that layer's backward-data product */
    int fold_gelu;         /* the same for a GELU whose x, y and gradients are
                            * bf16 (if st_graph_half makes them so): a multiply
                            * by gelu'(x), which its forward writes over x */
    /* convolution, pooling: square kernel, stride, symmetric padding */
    int kernel, stride, pad;
    int has_bias;          /* convolution */
    int32_t *col_ids;      /* convolution reading kept channels: its weight's
                            * kept columns (kernel^2 per channel), owned */
    int32_t *grad_col_ids; /* backward masking, the same for the columns with
                            * a gradient, owned */
    /* Backward masking of a layer whose kind lets oneDNN compute the full
     * weight gradients (convolution, batch norm): they go to a scratch the
     * model shares, and these runs of it (of rows: output channels; of
     * columns: input channels, kernel^2 columns each; NULL: all) are
     * copied to the compact gradients. */
    const st_row_run *gather_rows, *gather_cols;
    int n_gather_rows, n_gather_cols;
    const float *gather_src[2];  /* full gradients of seg[0], seg[1] (scratch) */
    float *gather_dst[2];        /* their compact gradients; [0] NULL: no gather */
    /* set by the graph */
    int dropped;           /* its group is not in this model */
    int backward;          /* its backward does something (graph.c) */
    size_t seg[2];         /* its segments (weight, bias / gamma, beta) */
    float *saved[2];       /* its own saved buffers (layer norm: mean, var) */
    union {
        st_linear linear;
        st_act act;
        st_layernorm norm;
        st_add add;
        st_conv conv;
        st_pool pool;
        st_batchnorm bn;
        st_attention attn;        /* nn/layers/attention.c */
        struct st_embedding {     /* nn/layers/embedding.c */
            int64_t batch, tokens, vocab, width;
            const float *ids, *tok, *pos;
            float *y;
            const float *dy;
            float *dtok, *dpos;
        } embed;
        struct st_patches {       /* nn/layers/patch.c */
            int64_t batch, channels, height, width, patch, n_patches;
            const float *x;
            float *y;
        } patches;
        struct st_tokens {        /* nn/layers/tokens.c */
            int64_t batch, in_rows, out_rows, width;
            int class_token;
            const float *x, *dy, *cls, *pos;
            float *y, *dx, *dcls, *dpos;
        } tokens;
        struct {           /* a kind that runs its own loop: its buffers */
            const float *x, *dy;
            float *y, *dx;
            int64_t rows, cols;
        } loop;
    } u;
};

#endif /* SUBTRAIN_NN_GRAPH_LAYER_H */

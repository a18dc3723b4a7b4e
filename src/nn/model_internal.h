/*
 * nn/model_internal.h — private: the inside of a model instance, for the
 * modules that build on it (subnetworks, strategies) and for tests.
 */
#ifndef SUBTRAIN_NN_MODEL_INTERNAL_H
#define SUBTRAIN_NN_MODEL_INTERNAL_H

#include <subtrain/model.h>
#include "nn/layers.h"

/* A pre-norm residual block of resmlp.  Buffers saved by the forward for
 * the backward are per block; everything else is shared (see model.c). */
typedef struct st_resblock {
    st_layernorm ln;      /* n = LN(h_in) */
    st_linear fc1;        /* a = n w1^T + b1       (B, hidden) */
    st_act act;           /* z = act(a)            (B, hidden) */
    st_linear fc2;        /* h_out = h_in + z w2^T + b2  (B, width): the skip
                           * is fused into the matmul */
    st_add join;          /* dh += d(h_in) through the branch */
    float *h_out, *n, *mean, *var, *a, *z;
} st_resblock;

/* A hidden layer of mlp. */
typedef struct st_dense {
    st_linear fc;         /* a = x w^T + b  (B, width) */
    st_act act;           /* z = act(a) */
    float *a, *z;
} st_dense;

/* Where a segment's elements come from in the full model, element by
 * element: compact storage row r, column c is full row rows[r], column
 * cols[c].  Everything that relates a subnetwork to the full model (its
 * initial values, its full-layout ranges for the reduction engine) is
 * computed from this, for block and neuron subnetworks alike. */
typedef struct st_seg_map {
    size_t full_offset;            /* the full tensor's first element in the full vector */
    int64_t full_rows, full_cols;  /* storage shape of the full tensor (a vector: n x 1) */
    const int32_t *rows, *cols;    /* compact -> full (NULL: the same index) */
    int64_t n_rows, n_cols;        /* compact storage shape */
    const int32_t *grad_rows;      /* backward masking: full rows that get a
                                    * gradient (NULL: every row) */
    int64_t n_grad_rows;
    int in_major;                  /* a weight stored (in, out) */
    int64_t fan_in;                /* of the full layer: the init bound */
    uint64_t stream;               /* init RNG stream: the full segment's index */
} st_seg_map;

/* One neuron layer's kept neurons (full indices, increasing). */
typedef struct st_neuron_sel {
    int64_t full, n;               /* full width, kept */
    const int32_t *ids;            /* NULL: all (n == full) */
} st_neuron_sel;

struct st_model {
    st_model_config cfg;
    int *block_ids;        /* depth entries (a copy; cfg.block_ids points here) */
    int full_depth;        /* cfg.full_depth, or depth for a whole model */
    int batch;
    st_arena *arena;
    st_nn_ctx ctx;

    /* Flat parameters and gradients (same layout), and their segments. */
    float *params, *grads;
    size_t n_params, n_grads;
    uint8_t *grad_blocks;  /* depth entries (a copy), 1: weight grads kept */
    int layout_grads;      /* while laying out: the segment gets a gradient */
    float *norm_scratch;   /* 2 x width: dgamma, dbeta of norms without gradient */
    st_param_segment *segs;
    st_seg_map *maps;      /* n_segs, parallel to segs */
    int n_segs, cap_segs;
    size_t full_at;        /* while laying out: the next segment's full offset */
    uint64_t full_seg;     /*                   and full index */

    /* Neuron layers (depth): kept neurons (forward masking) and neurons
     * with gradients (backward masking).  Storage for the ids is below. */
    st_neuron_sel *keep, *grad_keep;
    int *kept;             /* the model's own copies of cfg.kept_count, then of
                           * cfg.kept_groups: cfg points here */
    int32_t *ids;
    st_row_run *runs;      /* backward masking: grad_keep as runs, per layer at
                           * run_first[l]; NULL otherwise */
    int *run_first, *run_count;
    int64_t max_hidden;    /* widest kept neuron layer */

    float *input;          /* (B, in_dim) */
    int32_t *labels;       /* (B) */
    float *logits, *logp, *dlogits;   /* (B, classes) */

    /* mlp */
    st_dense *dense;       /* depth hidden layers */
    /* resmlp */
    st_linear stem;        /* h0 = x ws^T + bs */
    float *h0;
    st_resblock *blocks;   /* depth */
    st_layernorm ln_final; /* nf = LN(h_L) */
    float *nf, *mean_f, *var_f;

    st_linear head;        /* logits = (z_last | nf) wh^T + bh */
    st_xent xent;

    /* Shared scratch: the backward's data gradients. */
    float *dh, *dn, *dtmp, *dz, *da;
};

#endif /* SUBTRAIN_NN_MODEL_INTERNAL_H */

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
    int n_segs, cap_segs;

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

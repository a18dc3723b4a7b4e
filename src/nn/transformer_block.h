/*
 * nn/transformer_block.h — private: the pre-norm transformer block that
 * models/gpt.c (causal) and models/vit.c (non-causal) stack.
 */
#ifndef SUBTRAIN_NN_TRANSFORMER_BLOCK_H
#define SUBTRAIN_NN_TRANSFORMER_BLOCK_H

#include "nn/mlp_branch.h"

/* The gradient tensors a block writes and reads: the MLP branch's, the
 * Q, K, V projection's dqkv (3 x the heads' widest) and the attention's
 * output gradient dout. */
typedef struct st_block_grads {
    st_mlp_grads mlp;
    int dqkv, dout;
} st_block_grads;

/* The shape of the blocks of a stack: width D, MLP hidden F, heads, the
 * MLP's activation, and whether attention is causal. */
typedef struct st_block_shape {
    int64_t D, F;
    int heads;
    st_activation activation;
    int noncausal;
} st_block_shape;

/* Appends block g, layer group g, reading the stream h:
 *   h' = h + proj(attn(qkv(LN1(h))))
 *   out = h' + fc2(act(fc1(LN2(h'))))
 * its heads width layer 2g, its MLP neurons width layer 2g + 1.  Returns
 * out, ST_T_NONE when out of memory. */
int st_graph_transformer_block(st_model *m, int g, int h, const st_block_shape *s,
                               const st_block_grads *d);

#endif /* SUBTRAIN_NN_TRANSFORMER_BLOCK_H */

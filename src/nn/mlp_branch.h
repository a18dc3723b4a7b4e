/*
 * nn/mlp_branch.h — private: the pre-norm MLP branch of a residual block,
 * a helper of the builders whose blocks have one (models/resmlp.c, the
 * second half of models/gpt.c's transformer block), and the final norm and
 * head both stacks end with.
 */
#ifndef SUBTRAIN_NN_MLP_BRANCH_H
#define SUBTRAIN_NN_MLP_BRANCH_H

#include "nn/graph.h"

/* The gradient tensors a pre-norm MLP branch writes and reads: the
 * stream's dh (accumulated), the norm's dtmp, dn (width W), and da, dz
 * (width H, the branch's width layer or a widest scratch). */
typedef struct st_mlp_grads {
    int dh, dtmp, dn, da, dz;
} st_mlp_grads;

/* Appends out = h + fc2(act(fc1(LN(h)))) to the open group: a skip layer,
 * the norm "<prefix>.<ln>", "<prefix>.fc1" (W -> H, its outputs width
 * layer u) and "<prefix>.fc2" (H -> W, stored in-major, adding the skip,
 * closing the group's branch).  Returns out, ST_T_NONE when out of memory. */
int st_graph_mlp_branch(st_model *m, const char *prefix, const char *ln, int h, int u,
                        int64_t W, int64_t H, st_activation act, const st_mlp_grads *d);

/* Ends a pre-norm residual stack at its stream h (width W): the norm
 * "final_ln" into a tensor of its own, then the linear "head" (W ->
 * n_classes) to the logits.  Returns 1, 0 when out of memory. */
int st_graph_norm_head(st_model *m, int h, int64_t W, int n_classes, const st_mlp_grads *d);

#endif /* SUBTRAIN_NN_MLP_BRANCH_H */

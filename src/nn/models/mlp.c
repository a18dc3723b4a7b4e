/*
 * nn/models/mlp.c — the multilayer perceptron:
 *
 *   x (B, in) -> [fc_i -> act] x depth -> head -> logits (B, K)
 *
 * Hidden layer i's neurons are width layer i: its rows of fc_i, its
 * columns of fc_{i+1} (or the head).  No layer groups; hidden layer i
 * (fc_i and its activation) is recomputation block i.
 *
 * Memory (floats): saved a_i, z_i (B x W_i each, W_i the kept neurons of
 * layer i); shared da, dz (B x widest) used alternately going backward: a
 * layer's dz feeds the activation, whose da feeds the linear below.
 *
 * A fused ReLU's backward folds into the next layer's backward-data
 * product (a mask post-op, nn/layers/activation.c): that product then
 * writes hidden layer i's da itself while it reads layer i + 1's, so
 * the layers' gradients alternate between the two buffers (layer i's in
 * da for even i, dz for odd) and no product writes what it reads.  Not
 * under --recompute: layer i's mask is a saved buffer of block i, and
 * block i + 1's recomputed forward, run before the product that reads
 * the mask, reuses block i's memory (every block's lane starts at the
 * same place, nn/recompute.c).  A bf16 GELU does not fold here (resmlp's
 * and gpt's do, nn/mlp_branch.c): its fold is not bitwise its pass, and
 * since it could not fold under --recompute either, recomputing would
 * change the numbers.
 */
#include <stdio.h>

#include "nn/graph.h"

static st_status declare(st_model *m)
{
    const st_model_config *c = &m->cfg;
    const int L = c->depth;
    const int64_t W = c->width;
    const int dz = st_graph_tensor(m, W, ST_W_WIDEST), da = st_graph_tensor(m, W, ST_W_WIDEST);
    const int fold = st_graph_fuses_relu(m, c->activation) &&
                     !(c->unfuse & ST_UNFUSE_RELU_BACKWARD) &&
                     c->recompute == ST_RECOMPUTE_NONE;
    int x = ST_T_INPUT, dx = ST_T_NONE;   /* the first layer's input gradient is never needed */
    int64_t in = c->in_dim;
    char name[32];
    for (int i = 0; i < L; i++) {
        st_graph_block(m, i);   /* recomputation: a hidden layer is a block */
        snprintf(name, sizeof name, "fc%d", i);
        /* folded: the activation's gradients are one tensor (it runs no
         * backward), the one the next layer's product writes */
        const int g = fold && (i & 1) ? dz : da, gz = fold ? g : dz;
        st_layer *act = st_graph_linear_act(m, name, x, dx, g, gz, in, W, i, c->activation);
        if (!act)
            return st_fail(ST_ERR_NOMEM, "out of memory declaring the mlp");
        act[-1].in_unit = i == 0 ? ST_W_FULL : i - 1;
        act[-1].fold_relu = i > 0 && fold;   /* it runs layer i - 1's ReLU backward */
        act->fold_relu = fold;
        x = act->y;
        dx = gz;
        in = W;
    }
    st_graph_block(m, -1);
    st_layer *head = st_graph_linear(m, "head", x, ST_T_LOGITS, dx, ST_T_DLOGITS, in, c->n_classes);
    if (!head || dz < 0 || da < 0)
        return st_fail(ST_ERR_NOMEM, "out of memory declaring the mlp");
    head->in_unit = L - 1;
    head->fold_relu = L > 0 && fold;
    return ST_OK;
}

static st_status check_options(const st_model_config *c, unsigned given)
{
    (void)c;
    if (given & ST_MODEL_OPT_HIDDEN)
        return st_fail(ST_ERR_INVALID, "--hidden applies to resmlp only (mlp layers are --width "
                       "wide)");
    return ST_OK;
}

const st_model_builder st_model_mlp = {
    .name = "mlp", .reads = ST_MODEL_READS_FEATURES,
    .options = ST_MODEL_OPT_DEPTH | ST_MODEL_OPT_WIDTH | ST_MODEL_OPT_ACTIVATION,
    .check_options = check_options, .declare = declare,
};

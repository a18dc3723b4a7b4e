/*
 * nn/mlp_branch.c — the pre-norm MLP branch of a residual block, shared by
 * the builders whose blocks have one (resmlp's blocks, the second half of
 * a transformer block):
 *
 *   out = h + fc2(act(fc1(LN(h))))       fc1: W -> H, fc2: H -> W
 *
 * fc1's outputs are width layer u (its groups of neurons are units), so
 * fc2 is stored (in, out): a neuron's incoming and outgoing weights are
 * each one contiguous row.  fc2 adds the skip in its epilogue and closes
 * the group's branch (the branch scale multiplies it).  Backward, fc2
 * reads dh (the stream's gradient), fc1 writes dn, the norm dtmp, and the
 * skip layer adds dtmp into dh: dh is then h's gradient.  With a fused
 * ReLU, fc2 writes da itself (its product times the ReLU's mask) and the
 * activation runs no backward; so with a GELU on bf16 tensors (its
 * product times gelu'(a), nn/gelu.h).
 *
 * The stacks of such blocks end with the same final norm and head.
 */
#include <stdio.h>

#include "nn/mlp_branch.h"

int st_graph_mlp_branch(st_model *m, const char *prefix, const char *ln, int h, int u,
                        int64_t W, int64_t H, st_activation act, const st_mlp_grads *d)
{
    const int n = st_graph_tensor(m, W, ST_W_FULL);
    char name[32];
    st_layer *l;
    /* pointers into the table are good until the next layer is added */
    int ok = n >= 0 && st_graph_add(m, &st_layer_residual, "skip", h, h, d->dh, d->dtmp);
    snprintf(name, sizeof name, "%s.%s", prefix, ln);
    ok = ok && st_graph_add(m, &st_layer_layernorm, name, h, n, d->dtmp, d->dn);
    snprintf(name, sizeof name, "%s.fc1", prefix);
    if (!ok || !(l = st_graph_linear_act(m, name, n, d->dn, d->da, d->dz, W, H, u, act)))
        return ST_T_NONE;
    const int z = l->y, out = st_graph_tensor(m, W, ST_W_FULL);
    /* a fused ReLU's backward folds into fc2's backward-data product: fc2
     * writes da (not dz) from dh, two other buffers */
    const int fold = l->fuse_relu && !(m->cfg.unfuse & ST_UNFUSE_RELU_BACKWARD);
    l->fold_relu = fold;
    /* a GELU on bf16 tensors and gradients: fc2 writes da = gelu'(a) times
     * its product, the derivative the activation's forward wrote over a */
    const int fold_gelu = act == ST_ACT_GELU && m->cfg.activations == ST_PRECISION_BF16 &&
                          !(m->cfg.unfuse & ST_UNFUSE_GELU_BACKWARD);
    l->fold_gelu = fold_gelu;
    if (out < 0)
        return ST_T_NONE;
    snprintf(name, sizeof name, "%s.fc2", prefix);
    if (!(l = st_graph_linear(m, name, z, out, d->dz, d->dh, H, W)))
        return ST_T_NONE;
    l->fold_relu = fold;
    l->fold_gelu = fold_gelu;
    l->in_unit = u;
    l->in_major = 1;
    l->residual = h;           /* out = h + branch, in fc2's epilogue */
    l->closes_group = 1;
    return out;
}

int st_graph_norm_head(st_model *m, int h, int64_t W, int n_classes, const st_mlp_grads *d)
{
    const int nf = st_graph_tensor(m, W, ST_W_FULL);
    /* going backward the final norm writes dh: it starts the accumulation
     * that every block's residual layer then adds to */
    return nf >= 0 && st_graph_add(m, &st_layer_layernorm, "final_ln", h, nf, d->dh, d->dn) &&
           st_graph_linear(m, "head", nf, ST_T_LOGITS, d->dn, ST_T_DLOGITS, W, n_classes);
}

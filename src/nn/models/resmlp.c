/*
 * nn/models/resmlp.c — the pre-norm residual MLP:
 *
 *   h0 = stem(x)                                      (B, W)
 *   block g (a layer group with a skip edge), g < depth:
 *     h_{g+1} = h_g + fc2(act(fc1(LN(h_g))))           fc1: W -> H, fc2: H -> W
 *   logits = head(LN(h_depth))                        (B, K)
 *
 * Block g's inner neurons are width layer g: its rows of fc1 and, since
 * fc2 is stored (in, out), its rows of fc2 too, so that a neuron's
 * incoming and outgoing weights are each one contiguous row.
 *
 * Memory (floats), width W, inner width H, batch B:
 *   saved per block for the backward: n, a, z, h_out = B(2W + 2H), + 2B stats
 *   shared: dh, dn, dtmp (B x W each), dz, da (B x widest H each)
 * dh is the residual stream's gradient: the final norm writes it, every
 * block's fc2 reads it and its residual layer adds the branch's share.
 */
#include <stdio.h>

#include "nn/mlp_branch.h"

static st_status declare(st_model *m)
{
    const st_model_config *c = &m->cfg;
    const int64_t W = c->width, H = c->hidden > 0 ? c->hidden : c->width;
    const int h0 = st_graph_tensor(m, W, ST_W_FULL);
    const int dh = st_graph_tensor(m, W, ST_W_FULL), dn = st_graph_tensor(m, W, ST_W_FULL);
    const int dtmp = st_graph_tensor(m, W, ST_W_FULL);
    const int dz = st_graph_tensor(m, H, ST_W_WIDEST), da = st_graph_tensor(m, H, ST_W_WIDEST);
    int ok = h0 >= 0 && dh >= 0 && dn >= 0 && dtmp >= 0 && dz >= 0 && da >= 0;
    ok = ok && st_graph_linear(m, "stem", ST_T_INPUT, h0, ST_T_NONE, dh, c->in_dim, W);
    const st_mlp_grads d = { dh, dtmp, dn, da, dz };
    int h = h0;
    char prefix[24];
    for (int g = 0; ok && g < c->depth; g++) {
        st_graph_group_begin(m, g);
        snprintf(prefix, sizeof prefix, "block%d", g);
        const int out = st_graph_mlp_branch(m, prefix, "ln", h, g, W, H, c->activation, &d);
        if (out < 0)
            goto oom;
        st_graph_group_end(m, h, out);
        h = out;
    }
    ok = ok && st_graph_norm_head(m, h, W, c->n_classes, &d);
    if (ok)
        return ST_OK;
oom:
    return st_fail(ST_ERR_NOMEM, "out of memory declaring the resmlp");
}

static void describe(const st_model_config *c, char *out, size_t n)
{
    snprintf(out, n, " hidden %d", c->hidden ? c->hidden : c->width);
}

const st_model_builder st_model_resmlp = {
    .name = "resmlp", .reads = ST_MODEL_READS_FEATURES,
    .options = ST_MODEL_OPT_DEPTH | ST_MODEL_OPT_WIDTH | ST_MODEL_OPT_HIDDEN |
               ST_MODEL_OPT_ACTIVATION,
    .describe = describe, .declare = declare,
};

/*
 * nn/transformer_block.c — a pre-norm transformer block (GPT-2's and
 * ViT's arrangement, no dropout), shared by models/gpt.c and models/vit.c.
 *
 * Units.  Block g is layer group g (sdp --subnet block: a dropped block is
 * the identity, both of its branches gone).  Its attention heads are
 * width layer 2g: qkv's output is that layer's neurons three times over
 * (Q, K and V rows of the weight, each head-major: `copies` = 3), attn
 * reads and writes them, and proj, stored (in, out), reads them, so a
 * head's Q, K, V rows and its rows of proj move together.  Its MLP
 * neurons are width layer 2g + 1 (nn/mlp_branch.c).  Groups of neurons
 * must be whole heads for the attention layer (attention.c checks).
 */
#include <stdio.h>

#include "nn/transformer_block.h"

int st_graph_transformer_block(st_model *m, int g, int h, const st_block_shape *s,
                               const st_block_grads *d)
{
    const int ua = 2 * g, um = 2 * g + 1;   /* width layers: heads, MLP neurons */
    const int64_t D = s->D;
    st_graph_group_begin(m, g);
    const int n1 = st_graph_tensor(m, D, ST_W_FULL), qkv = st_graph_tensor_copies(m, D, 3, ua);
    const int o = st_graph_tensor(m, D, ua), h1 = st_graph_tensor(m, D, ST_W_FULL);
    char name[32];
    st_layer *l;
    /* attention branch: h1 = h + proj(attn(qkv(LN1(h)))) */
    int ok = n1 >= 0 && qkv >= 0 && o >= 0 && h1 >= 0 &&
             st_graph_add(m, &st_layer_residual, "skip", h, h, d->mlp.dh, d->mlp.dtmp);
    snprintf(name, sizeof name, "block%d.ln1", g);
    ok = ok && st_graph_add(m, &st_layer_layernorm, name, h, n1, d->mlp.dtmp, d->mlp.dn);
    snprintf(name, sizeof name, "block%d.qkv", g);
    if (!ok || !(l = st_graph_linear(m, name, n1, qkv, d->mlp.dn, d->dqkv, D, 3 * D)))
        return ST_T_NONE;
    l->out_unit = ua;
    l->copies = 3;
    snprintf(name, sizeof name, "block%d.attn", g);
    if (!(l = st_graph_add(m, &st_layer_attention, name, qkv, o, d->dqkv, d->dout)))
        return ST_T_NONE;
    l->in_unit = l->out_unit = ua;
    l->in = l->out = D;
    l->heads = s->heads;
    l->noncausal = s->noncausal;
    snprintf(name, sizeof name, "block%d.proj", g);
    if (!(l = st_graph_linear(m, name, o, h1, d->dout, d->mlp.dh, D, D)))
        return ST_T_NONE;
    l->in_unit = ua;
    l->in_major = 1;
    l->residual = h;
    l->closes_group = 1;   /* a branch of the block: scaled with it */
    /* MLP branch: out = h1 + fc2(act(fc1(LN2(h1)))) */
    snprintf(name, sizeof name, "block%d", g);
    const int out = st_graph_mlp_branch(m, name, "ln2", h1, um, D, s->F, s->activation, &d->mlp);
    if (out >= 0)
        st_graph_group_end(m, h, out);
    return out;
}

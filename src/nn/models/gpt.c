/*
 * nn/models/gpt.c — a byte-level causal transformer language model with
 * pre-norm blocks (GPT-2's arrangement, no dropout, untied head):
 *
 *   h0 = tok[x] + pos[t]                                 (B T, D)
 *   block g (a layer group with two skip edges), g < depth:
 *     h' = h + proj(attn(qkv(LN1(h))))                   qkv: D -> 3 D, proj: D -> D
 *     h_{g+1} = h' + fc2(gelu(fc1(LN2(h'))))            fc1: D -> F, fc2: F -> D
 *   logits = head(LN(h_depth))                           (B T, 256)
 *
 * Every tensor has a row per token (B T rows); attention is the one layer
 * that mixes a sample's rows.  Width D = H heads of D / H; F = hidden, 4 D
 * unless --hidden says otherwise.
 *
 * Units.  Block g is layer group g (sdp --subnet block: a dropped block is
 * the identity, both of its branches gone).  Its attention heads are
 * width layer 2g: qkv's output is that layer's neurons three times over
 * (Q, K and V rows of the weight, each head-major: `copies` = 3), attn
 * reads and writes them, and proj, stored (in, out), reads them, so a
 * head's Q, K, V rows and its rows of proj move together.  Its MLP
 * neurons are width layer 2g + 1, as in resmlp.  Groups of neurons must be
 * whole heads for the attention layer (attention.c checks).
 *
 * Memory (floats), B T = R rows, per block saved for the backward:
 *   n1, qkv, o, h', n2, a, z, out = R (3 D + 3 D + 2 F) + 4 R norm stats
 *   P = B H T^2 (the "attention" line of the breakdown)
 * shared: dh, dn, dtmp (R x D), dqkv (R x 3 D), do (R x D), da, dz (R x F),
 * and one B H T^2 scratch (dP, then dS) for every attention's backward.
 */
#include <stdio.h>

#include "nn/mlp_branch.h"

#define VOCAB 256   /* byte ids in, the next byte out */

static st_status declare(st_model *m)
{
    const st_model_config *c = &m->cfg;
    const int64_t D = c->width, F = c->hidden > 0 ? c->hidden : 4 * (int64_t)c->width;
    const int h0 = st_graph_tensor(m, D, ST_W_FULL);
    const int dh = st_graph_tensor(m, D, ST_W_FULL), dn = st_graph_tensor(m, D, ST_W_FULL);
    const int dtmp = st_graph_tensor(m, D, ST_W_FULL);
    const int dqkv = st_graph_tensor_widest_of(m, D, 3), dout = st_graph_tensor_widest_of(m, D, 1);
    const int da = st_graph_tensor_widest_of(m, F, 1), dz = st_graph_tensor_widest_of(m, F, 1);
    int ok = h0 >= 0 && dh >= 0 && dn >= 0 && dtmp >= 0 && dqkv >= 0 && dout >= 0 && da >= 0 &&
             dz >= 0;
    ok = ok && st_graph_add(m, &st_layer_embedding, "embed", ST_T_INPUT, h0, ST_T_NONE, dh);
    if (ok)
        m->layers[m->n_layers - 1].out = D;
    const st_mlp_grads d = { dh, dtmp, dn, da, dz };
    int h = h0;
    char name[32];
    st_layer *l;
    for (int g = 0; ok && g < c->depth; g++) {
        const int ua = 2 * g, um = 2 * g + 1;   /* width layers: heads, MLP neurons */
        st_graph_group_begin(m, g);
        const int n1 = st_graph_tensor(m, D, ST_W_FULL), qkv = st_graph_tensor_copies(m, D, 3, ua);
        const int o = st_graph_tensor(m, D, ua), h1 = st_graph_tensor(m, D, ST_W_FULL);
        ok = n1 >= 0 && qkv >= 0 && o >= 0 && h1 >= 0;
        /* attention branch: h1 = h + proj(attn(qkv(LN1(h)))) */
        ok = ok && st_graph_add(m, &st_layer_residual, "skip", h, h, dh, dtmp);
        snprintf(name, sizeof name, "block%d.ln1", g);
        ok = ok && st_graph_add(m, &st_layer_layernorm, name, h, n1, dtmp, dn);
        snprintf(name, sizeof name, "block%d.qkv", g);
        if (!ok || !(l = st_graph_linear(m, name, n1, qkv, dn, dqkv, D, 3 * D)))
            goto oom;
        l->out_unit = ua;
        l->copies = 3;
        snprintf(name, sizeof name, "block%d.attn", g);
        if (!(l = st_graph_add(m, &st_layer_attention, name, qkv, o, dqkv, dout)))
            goto oom;
        l->in_unit = l->out_unit = ua;
        l->in = l->out = D;
        l->heads = c->heads;
        snprintf(name, sizeof name, "block%d.proj", g);
        if (!(l = st_graph_linear(m, name, o, h1, dout, dh, D, D)))
            goto oom;
        l->in_unit = ua;
        l->in_major = 1;
        l->residual = h;
        l->closes_group = 1;   /* a branch of the block: scaled with it */
        /* MLP branch: out = h1 + fc2(gelu(fc1(LN2(h1)))) */
        snprintf(name, sizeof name, "block%d", g);
        const int out = st_graph_mlp_branch(m, name, "ln2", h1, um, D, F, c->activation, &d);
        if (out < 0)
            goto oom;
        st_graph_group_end(m, h, out);
        h = out;
    }
    ok = ok && st_graph_norm_head(m, h, D, c->n_classes, &d);
    if (ok)
        return ST_OK;
oom:
    return st_fail(ST_ERR_NOMEM, "out of memory declaring the gpt model");
}

/* About 3M parameters: 4 blocks of width 256, 4 heads, 128 bytes. */
static void defaults(st_model_config *c, unsigned given)
{
    if (!(given & ST_MODEL_OPT_CONTEXT))
        c->context = 128;
    if (!(given & ST_MODEL_OPT_HEADS))
        c->heads = 4;
    c->in_dim = c->context;   /* a byte id per token */
    c->n_classes = VOCAB;
}

static st_status check_options(const st_model_config *c, unsigned given)
{
    (void)given;
    if (c->width % c->heads)
        return st_fail(ST_ERR_INVALID, "--heads %d does not divide --width %d", c->heads,
                       c->width);
    return ST_OK;
}

static void describe(const st_model_config *c, char *out, size_t n)
{
    snprintf(out, n, " heads %d context %d hidden %d", c->heads, c->context,
             c->hidden ? c->hidden : 4 * c->width);
}

const st_model_builder st_model_gpt = {
    .name = "gpt",
    .help = "gpt: a byte-level causal transformer of pre-norm blocks (attention, GELU MLP of "
            "4 x width), text data",
    .reads = ST_MODEL_READS_TEXT,
    .options = ST_MODEL_OPT_DEPTH | ST_MODEL_OPT_WIDTH | ST_MODEL_OPT_HIDDEN |
               ST_MODEL_OPT_ACTIVATION | ST_MODEL_OPT_CONTEXT | ST_MODEL_OPT_HEADS,
    .defaults = defaults, .check_options = check_options, .describe = describe,
    .declare = declare,
};

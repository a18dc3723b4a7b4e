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
 * Units.  Block g is layer group g, its heads width layer 2g, its MLP
 * neurons width layer 2g + 1 (nn/transformer_block.c, which it shares
 * with the ViT).
 *
 * Memory (floats), B T = R rows, per block saved for the backward:
 *   n1, qkv, o, h', n2, a, z, out = R (3 D + 3 D + 2 F) + 4 R norm stats
 *   P = B H T^2 (the "attention" line of the breakdown)
 * shared: dh, dn, dtmp (R x D), dqkv (R x 3 D), do (R x D), da, dz (R x F),
 * and one B H T^2 scratch (dP, then dS) for every attention's backward.
 */
#include <stdio.h>

#include "nn/transformer_block.h"

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
    const st_block_grads d = { { dh, dtmp, dn, da, dz }, dqkv, dout };
    const st_block_shape shape = { D, F, c->heads, c->activation, 0 };
    int h = h0;
    for (int g = 0; ok && g < c->depth; g++)
        ok = (h = st_graph_transformer_block(m, g, h, &shape, &d)) >= 0;
    ok = ok && st_graph_norm_head(m, h, D, c->n_classes, &d.mlp);
    if (ok)
        return ST_OK;
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

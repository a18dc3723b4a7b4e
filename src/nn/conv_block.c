/*
 * nn/conv_block.c — the convolution and the batch norm -> activation of
 * the convolutional builders.
 */
#include "nn/conv_block.h"

st_layer *st_graph_conv(st_model *m, const char *name, int x, int y, int dx, int dy, int64_t in,
                        int64_t out, int kernel, int stride)
{
    st_layer *l = st_graph_add(m, &st_layer_conv, name, x, y, dx, dy);
    if (l) {
        l->in = in;
        l->out = out;
        l->kernel = kernel;
        l->stride = stride;
        l->pad = kernel / 2;
    }
    return l;
}

/* A ReLU is fused into the batch norm (the primitive's fuse_norm_relu: one
 * pass over the tensor fewer each way, and no pre-activation tensor kept:
 * faster, doc/benchmarks.md). */
int st_graph_bn_fuses_relu(const st_model *m)
{
    return m->cfg.activation == ST_ACT_RELU && !(m->cfg.unfuse & ST_UNFUSE_BN_RELU);
}

st_layer *st_graph_bn_act(st_model *m, const char *name, int x, int y, int dx, int dy, int mid,
                          int dmid, int64_t c, int unit)
{
    const st_activation act = m->cfg.activation;
    const int fuse = st_graph_bn_fuses_relu(m);
    st_layer *n = st_graph_add(m, &st_layer_batchnorm, name, x, fuse ? y : mid, dx,
                               fuse ? dy : dmid);
    if (!n)
        return NULL;
    n->in = n->out = c;
    n->in_unit = n->out_unit = unit;
    n->fuse_relu = fuse;
    if (fuse)
        return n;
    st_layer *r = st_graph_add(m, &st_layer_activation, "act", mid, y, dmid, dy);
    if (!r)
        return NULL;
    r->in_unit = r->out_unit = unit;
    r->activation = act;
    return r;
}

/*
 * nn/conv_block.h — private: the convolution and the batch norm ->
 * activation that the convolutional builders declare (models/resnet.c,
 * models/convnet.c).
 */
#ifndef SUBTRAIN_NN_CONV_BLOCK_H
#define SUBTRAIN_NN_CONV_BLOCK_H

#include "nn/graph.h"

/* A convolution of a square kernel (padding kernel / 2, no bias) from in
 * to out channels between image tensors x and y; NULL when out of memory. */
st_layer *st_graph_conv(st_model *m, const char *name, int x, int y, int dx, int dy, int64_t in,
                        int64_t out, int kernel, int stride);

/* Whether st_graph_bn_act fuses the ReLU into the batch norm: a ReLU,
 * not under --unfuse bn-relu. */
int st_graph_bn_fuses_relu(const st_model *m);
/* BN -> the config's activation from x to y over c channels (width layer
 * unit).  A ReLU is fused into the batch norm; another activation (or a
 * ReLU under --unfuse bn-relu) is a layer of its own through mid (its
 * gradient dmid), unused when fused.
 * Returns the last layer, NULL when out of memory. */
st_layer *st_graph_bn_act(st_model *m, const char *name, int x, int y, int dx, int dy, int mid,
                          int dmid, int64_t c, int unit);

#endif /* SUBTRAIN_NN_CONV_BLOCK_H */

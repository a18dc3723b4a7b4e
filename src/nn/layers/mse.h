/*
 * nn/layers/mse.h — private: mean squared error against a target matrix, the loss
 * of a non-final segment (synthetic-label training).
 *
 *   loss = 1 / (rows D) sum_{b < rows, d} (y[b, d] - t[b, d])^2
 *   dy   = 2 (y - t) / (rows D) for the real rows, 0 for padding rows
 *
 * The mean over every element (PyTorch's MSELoss default), so that the
 * loss of a label of width D does not grow with D.  A loop over B x D
 * values: O(1 / in) of the GEMM before it, nothing worth a primitive.
 */
#ifndef SUBTRAIN_NN_LAYERS_MSE_H
#define SUBTRAIN_NN_LAYERS_MSE_H

#include <stdint.h>
#include <subtrain/status.h>

typedef struct st_mse {
    int64_t batch, dim;
    const float *y;       /* (B, D) the prediction */
    const float *target;  /* (B, D) */
    float *dy;            /* (B, D) */
} st_mse;

void st_mse_build(st_mse *e, int64_t batch, int64_t dim, const float *y, const float *target,
                  float *dy);
/* Summed squared error of the first `rows` rows, divided by D (so that the
 * sum over rows divided by rows is the loss), into *loss_sum; dy of the
 * mean when want_grad. */
st_status st_mse_forward(const st_mse *e, int64_t rows, int want_grad, double *loss_sum);

#endif /* SUBTRAIN_NN_LAYERS_MSE_H */

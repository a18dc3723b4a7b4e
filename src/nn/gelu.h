/*
 * nn/gelu.h — GELU (erf form) on bf16 tensors, with its derivative
 * computed in the same pass: the folded GELU of --activation-precision
 * bf16 (nn/layers/activation.c), whose backward is a multiply by that
 * derivative in the next linear layer's backward-data product.
 *
 * The math is oneDNN's gelu_erf: erf by Abramowitz and Stegun 7.1.26
 * (absolute error <= 1.5e-7), whose exp(-x^2/2) also gives the normal
 * density, so one exponential serves y and y'.  fp32 inside; y and y'
 * rounded to bf16 to nearest even.
 */
#ifndef ST_NN_GELU_H
#define ST_NN_GELU_H

#include <stddef.h>

#include "core/bf16.h"

/* y[i] = gelu(xd[i]) and xd[i] = gelu'(xd[i]), i < n: the derivative
 * written over its argument (nobody reads x after it). */
void st_gelu_deriv_bf16(st_bf16 *restrict y, st_bf16 *xd, size_t n);

/* y[i] = gelu(x[i]), i < n: the same values of y as above. */
void st_gelu_bf16(st_bf16 *restrict y, const st_bf16 *restrict x, size_t n);

#endif /* ST_NN_GELU_H */

/* nn/layers/mse.c — mean squared error (see mse.h).  The sum is accumulated in
 * double in a fixed order: deterministic, and exact enough for B x D
 * terms. */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "nn/layers/mse.h"

void st_mse_build(st_mse *e, int64_t batch, int64_t dim, const float *y, const float *target,
                  float *dy)
{
    e->batch = batch;
    e->dim = dim;
    e->y = y;
    e->target = target;
    e->dy = dy;
}

/* y, target, dy are (B, D); rows <= B are real samples. */
st_status st_mse_forward(const st_mse *e, int64_t rows, int want_grad, double *loss_sum)
{
    if (rows < 1 || rows > e->batch)
        return st_fail(ST_ERR_INVALID, "mse: %lld rows for a batch of %lld", (long long)rows,
                       (long long)e->batch);
    const int64_t D = e->dim, n = rows * D;
    double sum = 0.0;
    for (int64_t k = 0; k < n; k++) {
        double r = (double)e->y[k] - (double)e->target[k];
        sum += r * r;
    }
    if (!isfinite(sum))
        return st_fail(ST_ERR_NUMERIC, "the loss is not finite (%g): training diverged; "
                       "try a smaller --lr", sum);
    if (want_grad) {
        const float g = 2.0f / (float)n;
        for (int64_t k = 0; k < n; k++)
            e->dy[k] = g * (e->y[k] - e->target[k]);
        memset(e->dy + n, 0, (size_t)((e->batch - rows) * D) * sizeof(float));
    }
    *loss_sum = sum / (double)D;
    return ST_OK;
}

/*
 * nn/layers/loss.c — softmax cross-entropy.
 *
 * logp = log_softmax(logits) is a oneDNN primitive (numerically stable);
 * loss = -mean_b logp[b, y_b]; dlogits = (exp(logp) - onehot(y)) / rows.
 * The loop is B x K (K = 10 classes): negligible next to the GEMMs, and the
 * loss sum is accumulated in double in a fixed order (deterministic).
 */
#include <math.h>
#include <string.h>

#include "nn/layers.h"

st_status st_xent_build(st_nn_ctx *ctx, st_xent *e, int64_t batch, int64_t classes,
                        const float *logits, float *logp, float *dlogits)
{
    e->batch = batch;
    e->classes = classes;
    e->logits = logits;
    e->logp = logp;
    e->dlogits = dlogits;
    dnnl_memory_desc_t md;
    st_md_matrix(&md, batch, classes);
    dnnl_logsoftmax_desc_t d;
    ST_DNNL(dnnl_logsoftmax_forward_desc_init(&d, dnnl_forward_training, &md, 1),
            "log-softmax descriptor");
    ST_TRY(st_prim_create(ctx, &e->logsoftmax, &d, NULL, "log-softmax", NULL));
    dnnl_memory_t src, dst;
    ST_TRY(st_mem_matrix(ctx, &src, batch, classes, logits));
    ST_TRY(st_mem_matrix(ctx, &dst, batch, classes, logp));
    st_prim_arg(&e->logsoftmax, DNNL_ARG_SRC, src);
    st_prim_arg(&e->logsoftmax, DNNL_ARG_DST, dst);
    return ST_OK;
}

static int64_t argmax(const float *row, int64_t n)
{
    int64_t best = 0;
    for (int64_t k = 1; k < n; k++)
        if (row[k] > row[best])
            best = k;
    return best;
}

/* logits, logp, dlogits are (B, K); labels (B); rows <= B are real samples. */
st_status st_xent_forward(const st_nn_ctx *ctx, const st_xent *e, const int32_t *labels,
                          int64_t rows, int want_grad, double *loss_sum, int64_t *correct)
{
    ST_TRY(st_prim_run(ctx, &e->logsoftmax));
    const int64_t K = e->classes;
    double sum = 0.0;
    int64_t hits = 0;
    for (int64_t b = 0; b < rows; b++) {
        const float *lp = e->logp + b * K;
        int32_t y = labels[b];
        if (y < 0 || y >= K)
            return st_fail(ST_ERR_INVALID, "label %d of row %lld is outside [0, %lld)",
                           (int)y, (long long)b, (long long)K);
        sum -= lp[y];
        hits += argmax(e->logits + b * K, K) == y;
    }
    if (!isfinite(sum))
        return st_fail(ST_ERR_NUMERIC, "the loss is not finite (%g): training diverged; "
                       "try a smaller --lr", sum);
    if (want_grad) {
        const float inv = 1.0f / (float)rows;
        for (int64_t b = 0; b < rows; b++) {
            const float *lp = e->logp + b * K;
            float *g = e->dlogits + b * K;
            for (int64_t k = 0; k < K; k++)
                g[k] = expf(lp[k]) * inv;
            g[labels[b]] -= inv;
        }
        memset(e->dlogits + rows * K, 0, (size_t)((e->batch - rows) * K) * sizeof(float));
    }
    *loss_sum = sum;
    if (correct)
        *correct = hits;
    return ST_OK;
}

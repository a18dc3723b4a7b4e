/*
 * data/augment.c — seeded augmentation of training images: random crop of
 * the zero-padded image, horizontal flip.
 *
 * Applied while a worker gathers its batch (st_dataset_gather_train), from
 * the stored sample straight into the model's input, so there is no
 * scratch buffer: the gather allocates nothing and takes no lock.  What a
 * sample becomes is drawn from its own stream, keyed by (seed, epoch,
 * sample index) and nothing else — not the worker, the thread, the batch
 * position or the time — so a run is bitwise reproducible and the same
 * sample is augmented the same way whichever worker loads it.
 *
 * The padding is 0 in the stored values: after normalisation that is the
 * training set's mean (of the channel), the usual padding of a normalised
 * tensor.
 */
#include <stdint.h>
#include <string.h>

#include <subtrain/data.h>
#include <subtrain/rng.h>

#include "core/error.h"
#include "data/gather.h"

/* Stream namespace of the augmentation draws under a seed's root (see
 * core/rng_streams.h for the others). */
#define AUGMENT_STREAM 0xA0C7ull

int st_augment_active(const st_augment *a)
{
    return a->crop > 0 || a->flip;
}

st_status st_augment_check(const st_augment *a, const st_dataset *d)
{
    if (!a || !d)
        return st_fail(ST_ERR_INVALID, "st_augment_check: missing argument");
    if (!st_augment_active(a))
        return ST_OK;
    const char *opt = a->crop ? "--augment-crop" : "--augment-flip";
    if (d->channels == 0 || (uint64_t)d->channels * d->height * d->width != d->dim)
        return st_fail(ST_ERR_INVALID, "%s: the data's sample shape is unknown (%lux%lux%lu "
                       "for %lu features)", opt, (unsigned long)d->channels,
                       (unsigned long)d->height, (unsigned long)d->width,
                       (unsigned long)d->dim);
    if (d->width < 2 || d->height < 2)
        return st_fail(ST_ERR_INVALID, "%s: needs images; the data's samples are %lux%lux%lu "
                       "(channels x height x width), not images", opt,
                       (unsigned long)d->channels, (unsigned long)d->height,
                       (unsigned long)d->width);
    if (a->crop >= d->height || a->crop >= d->width)
        return st_fail(ST_ERR_INVALID, "--augment-crop: %lu pixels of padding must be fewer "
                       "than the images' height and width (%lux%lu)", (unsigned long)a->crop,
                       (unsigned long)d->height, (unsigned long)d->width);
    return ST_OK;
}

/* The draw of one sample from its epoch's stream. */
static st_augment_choice draw(const st_augment *a, const st_rng *epoch_stream, uint64_t index)
{
    st_rng r = st_rng_split(epoch_stream, index);
    st_augment_choice c = { a->crop, a->crop, 0 };
    uint64_t u = st_rng_u64(&r);
    if (a->flip)
        c.flip = (int)(u >> 63);
    if (a->crop) {
        c.top = st_rng_below(&r, 2 * a->crop + 1);
        c.left = st_rng_below(&r, 2 * a->crop + 1);
    }
    return c;
}

static st_rng epoch_stream(const st_augment *a, uint64_t epoch)
{
    st_rng root = st_rng_seed(a->seed);
    st_rng aug = st_rng_split(&root, AUGMENT_STREAM);
    return st_rng_split(&aug, epoch);
}

st_augment_choice st_augment_draw(const st_augment *a, uint64_t epoch, uint64_t index)
{
    st_rng e = epoch_stream(a, epoch);
    return draw(a, &e, index);
}

/* Output row y of a channel reads source row y + top - pad (zeros outside);
 * output column x reads source column x' + left - pad, x' = x, or W-1-x
 * when flipped (crop, then mirror the window). */
void st_augment_apply(const st_augment_choice *c, uint32_t pad, uint32_t channels,
                      uint32_t height, uint32_t width, const float *src, float *dst)
{
    const int64_t H = height, W = width;
    const int64_t dy = (int64_t)c->top - pad, dx = (int64_t)c->left - pad;
    /* Window columns x' in [x0, x1) read the source (x' + dx in [0, W)). */
    const int64_t x0 = dx < 0 ? -dx : 0, x1 = dx > 0 ? W - dx : W;
    const size_t plane = (size_t)H * (size_t)W;
    for (uint32_t ch = 0; ch < channels; ch++) {
        const float *s = src + ch * plane;
        float *d = dst + ch * plane;
        for (int64_t y = 0; y < H; y++) {
            float *out = d + y * W;
            int64_t sy = y + dy;
            if (sy < 0 || sy >= H || x1 <= x0) {
                memset(out, 0, (size_t)W * sizeof *out);
                continue;
            }
            const float *in = s + sy * W;   // window column x' reads in[x' + dx]
            if (!c->flip) {
                memset(out, 0, (size_t)x0 * sizeof *out);
                memcpy(out + x0, in + x0 + dx, (size_t)(x1 - x0) * sizeof *out);
                memset(out + x1, 0, (size_t)(W - x1) * sizeof *out);
            } else {
                for (int64_t x = 0; x < W; x++) {
                    int64_t xw = W - 1 - x;
                    out[x] = xw >= x0 && xw < x1 ? in[xw + dx] : 0.0f;
                }
            }
        }
    }
}

void st_augment_gather(const st_dataset *d, uint64_t epoch, const uint32_t *idx, size_t n,
                       float *x_out, int32_t *y_out)
{
    const st_augment *a = &d->augment;
    const size_t dim = d->dim;
    const st_rng e = epoch_stream(a, epoch);
    for (size_t i = 0; i < n; i++) {
        size_t row = idx[i];
        st_augment_choice c = draw(a, &e, row);
        st_augment_apply(&c, a->crop, d->channels, d->height, d->width, d->x + row * dim,
                         x_out + i * dim);
        y_out[i] = d->y[row];
    }
}

/*
 * tests/test_data_augment.c — augmentation: crops and flips against their
 * definition, the seeded draws, the training gather (which makes no heap
 * call), and training with it.
 *
 * The scratch directory: tests/data_check.h.
 */
#define _GNU_SOURCE   /* heapwatch.h: RTLD_NEXT */
#include "data_check.h"

#include <oneapi/dnnl/dnnl.h>

TestSuite(augment, .init = setup, .fini = teardown);

/* ------------------------------------------------------------ augmentation */

/* The 3 x 3 image 1..9 padded by one zero pixel, every crop window of the
 * 5 x 5 padded image, written out by hand for three of them. */
Test(augment, crop_and_flip_of_a_known_image)
{
    const float img[9] = { 1, 2, 3, 4, 5, 6, 7, 8, 9 };
    float out[9];
    st_augment_choice c = { 0, 0, 0 };   /* the window's corner at the padding's */
    st_augment_apply(&c, 1, 1, 3, 3, img, out);
    const float down_right[9] = { 0, 0, 0, 0, 1, 2, 0, 4, 5 };
    cr_assert(memcmp(out, down_right, sizeof out) == 0);
    c.flip = 1;
    st_augment_apply(&c, 1, 1, 3, 3, img, out);
    const float down_right_flipped[9] = { 0, 0, 0, 2, 1, 0, 5, 4, 0 };
    cr_assert(memcmp(out, down_right_flipped, sizeof out) == 0);
    c = (st_augment_choice){ 2, 1, 0 };   /* one row up, columns as they are */
    st_augment_apply(&c, 1, 1, 3, 3, img, out);
    const float up[9] = { 4, 5, 6, 7, 8, 9, 0, 0, 0 };
    cr_assert(memcmp(out, up, sizeof out) == 0);
    c = (st_augment_choice){ 1, 1, 1 };   /* no shift, mirrored */
    st_augment_apply(&c, 1, 1, 3, 3, img, out);
    const float mirrored[9] = { 3, 2, 1, 6, 5, 4, 9, 8, 7 };
    cr_assert(memcmp(out, mirrored, sizeof out) == 0);
    c = (st_augment_choice){ 1, 2, 0 };   /* one column left */
    st_augment_apply(&c, 1, 1, 3, 3, img, out);
    const float left[9] = { 2, 3, 0, 5, 6, 0, 8, 9, 0 };
    cr_assert(memcmp(out, left, sizeof out) == 0);
}

/* Every window and flip of a 2 x 4 x 5 image against the definition:
 * out(c, y, x) = padded(c, y + top, x' + left), x' = x or W-1-x. */
Test(augment, every_window_matches_the_definition)
{
    enum { C = 2, H = 4, W = 5, P = 3 };
    float img[C * H * W], out[C * H * W];
    for (int i = 0; i < C * H * W; i++)
        img[i] = (float)(i + 1);   /* no pixel is 0: a 0 is padding */
    for (uint32_t top = 0; top <= 2 * P; top++)
        for (uint32_t left = 0; left <= 2 * P; left++)
            for (int flip = 0; flip < 2; flip++) {
                st_augment_choice c = { top, left, flip };
                memset(out, 0xFF, sizeof out);
                st_augment_apply(&c, P, C, H, W, img, out);
                for (int ch = 0; ch < C; ch++)
                    for (int y = 0; y < H; y++)
                        for (int x = 0; x < W; x++) {
                            int xw = flip ? W - 1 - x : x;
                            int sy = y + (int)top - P, sx = xw + (int)left - P;
                            float want = sy >= 0 && sy < H && sx >= 0 && sx < W
                                             ? img[(ch * H + sy) * W + sx] : 0.0f;
                            cr_assert_eq(out[(ch * H + y) * W + x], want,
                                         "top %u left %u flip %d: (%d, %d, %d)", top, left,
                                         flip, ch, y, x);
                        }
            }
}

Test(augment, padding_is_zeros_and_flip_twice_is_identity)
{
    enum { C = 3, H = 6, W = 7, P = 2 };
    float img[C * H * W], a[C * H * W], b[C * H * W];
    for (int i = 0; i < C * H * W; i++)
        img[i] = 0.5f + (float)i;
    /* the window at the padded image's corner: P rows and P columns of 0 */
    st_augment_choice c = { 0, 0, 0 };
    st_augment_apply(&c, P, C, H, W, img, a);
    for (int ch = 0; ch < C; ch++)
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++) {
                float v = a[(ch * H + y) * W + x];
                if (y < P || x < P)
                    cr_assert_eq(v, 0.0f, "padding (%d, %d, %d) is %g", ch, y, x, v);
                else
                    cr_assert_eq(v, img[(ch * H + y - P) * W + x - P]);
            }
    /* the centre window, flipped twice, is the image */
    c = (st_augment_choice){ P, P, 1 };
    st_augment_apply(&c, P, C, H, W, img, a);
    cr_assert(memcmp(a, img, sizeof img) != 0);
    st_augment_apply(&c, P, C, H, W, a, b);
    cr_assert(memcmp(b, img, sizeof img) == 0);
    c.flip = 0;
    st_augment_apply(&c, P, C, H, W, img, a);
    cr_assert(memcmp(a, img, sizeof img) == 0, "the centre window unflipped: the image");
}

Test(augment, draws_depend_on_seed_epoch_and_index_only)
{
    st_augment a = { .crop = 4, .flip = 1, .seed = 7 };
    uint32_t seen_top[9] = { 0 }, seen_left[9] = { 0 }, flips = 0, differ_epoch = 0;
    const uint32_t N = 4000;
    for (uint32_t i = 0; i < N; i++) {
        st_augment_choice c = st_augment_draw(&a, 3, i), d = st_augment_draw(&a, 3, i);
        cr_assert(c.top == d.top && c.left == d.left && c.flip == d.flip, "a pure function");
        cr_assert(c.top <= 8 && c.left <= 8 && (c.flip == 0 || c.flip == 1));
        seen_top[c.top]++;
        seen_left[c.left]++;
        flips += (uint32_t)c.flip;
        st_augment_choice e = st_augment_draw(&a, 4, i);
        differ_epoch += c.top != e.top || c.left != e.left || c.flip != e.flip;
    }
    for (int k = 0; k <= 8; k++)
        cr_assert(seen_top[k] > N / 9 / 2 && seen_left[k] > N / 9 / 2,
                  "offset %d: %u, %u of %u", k, seen_top[k], seen_left[k], N);
    cr_assert(flips > N / 2 - N / 10 && flips < N / 2 + N / 10, "p = 1/2: %u of %u", flips, N);
    cr_assert_gt(differ_epoch, N * 9 / 10, "another epoch, other draws: %u of %u differ",
                 differ_epoch, N);
    /* another seed, other draws */
    st_augment b = a;
    b.seed = 8;
    uint32_t differ_seed = 0;
    for (uint32_t i = 0; i < 100; i++) {
        st_augment_choice c = st_augment_draw(&a, 3, i), e = st_augment_draw(&b, 3, i);
        differ_seed += c.top != e.top || c.left != e.left || c.flip != e.flip;
    }
    cr_assert_gt(differ_seed, 80);
    /* a flip alone leaves the window centred; a crop alone never flips */
    st_augment f = { .flip = 1, .seed = 7 }, k = { .crop = 2, .seed = 7 };
    for (uint32_t i = 0; i < 100; i++) {
        st_augment_choice c = st_augment_draw(&f, 0, i), e = st_augment_draw(&k, 0, i);
        cr_assert(c.top == 0 && c.left == 0);
        cr_assert_eq(e.flip, 0);
    }
}

/* n images 3 x 8 x 8 with pixel values that say where they come from. */
static void image_set(st_dataset *d, uint32_t n)
{
    memset(d, 0, sizeof *d);
    d->count = n;
    d->channels = 3;
    d->height = 8;
    d->width = 8;
    d->dim = 192;
    d->n_classes = 5;
    d->x = malloc((size_t)n * 192 * sizeof(float));
    d->y = malloc(n);
    cr_assert(d->x && d->y);
    for (uint32_t i = 0; i < n; i++) {
        d->y[i] = (uint8_t)(i % 5);
        for (int j = 0; j < 192; j++)
            d->x[(size_t)i * 192 + j] = (float)(i * 1000 + j + 1);
    }
}

Test(augment, the_training_gather)
{
    st_dataset d;
    image_set(&d, 64);
    uint32_t idx[64], rev[64];
    for (uint32_t i = 0; i < 64; i++) {
        idx[i] = i;
        rev[i] = 63 - i;
    }
    float *plain = malloc(64 * 192 * sizeof(float)), *a = malloc(64 * 192 * sizeof(float)),
          *b = malloc(64 * 192 * sizeof(float)), *e = malloc(64 * 192 * sizeof(float));
    int32_t ya[64], yb[64];
    st_dataset_gather(&d, idx, 64, plain, ya);

    /* no augmentation: the plain gather, to the bit */
    st_dataset_gather_train(&d, 5, idx, 64, a, yb);
    cr_assert(memcmp(a, plain, 64 * 192 * sizeof(float)) == 0);
    cr_assert(memcmp(ya, yb, sizeof ya) == 0);

    d.augment = (st_augment){ .crop = 2, .flip = 1, .seed = 3 };
    cr_assert_eq(st_augment_check(&d.augment, &d), ST_OK, "%s", st_last_error());
    st_dataset_gather_train(&d, 5, idx, 64, a, ya);
    st_dataset_gather_train(&d, 5, idx, 64, b, yb);
    cr_assert(memcmp(a, b, 64 * 192 * sizeof(float)) == 0, "same (seed, epoch, index)");
    cr_assert(memcmp(ya, yb, sizeof ya) == 0);
    for (uint32_t i = 0; i < 64; i++)
        cr_assert_eq(ya[i], d.y[i], "labels as stored");
    cr_assert(memcmp(a, plain, 64 * 192 * sizeof(float)) != 0, "augmented");
    /* each sample is what st_augment_draw and st_augment_apply make of it */
    for (uint32_t i = 0; i < 64; i++) {
        st_augment_choice c = st_augment_draw(&d.augment, 5, i);
        float one[192];
        st_augment_apply(&c, 2, 3, 8, 8, d.x + (size_t)i * 192, one);
        cr_assert(memcmp(one, a + (size_t)i * 192, sizeof one) == 0, "sample %u", i);
    }
    /* the batch position does not matter, the sample does */
    st_dataset_gather_train(&d, 5, rev, 64, b, yb);
    for (uint32_t i = 0; i < 64; i++)
        cr_assert(memcmp(b + (size_t)i * 192, a + (size_t)(63 - i) * 192,
                         192 * sizeof(float)) == 0, "sample %u", 63 - i);
    /* another epoch, another augmentation */
    st_dataset_gather_train(&d, 6, idx, 64, e, yb);
    int differ = 0;
    for (uint32_t i = 0; i < 64; i++)
        differ += memcmp(e + (size_t)i * 192, a + (size_t)i * 192, 192 * sizeof(float)) != 0;
    cr_assert_gt(differ, 48, "epochs 5 and 6: only %d of 64 samples differ", differ);
    free(plain);
    free(a);
    free(b);
    free(e);
    st_dataset_free(&d);
}

Test(augment, check_refuses_what_does_not_fit)
{
    st_dataset d;
    image_set(&d, 2);
    st_augment a = { .crop = 7, .flip = 1 };
    cr_assert_eq(st_augment_check(&a, &d), ST_OK, "%s", st_last_error());
    a.crop = 8;
    cr_assert_eq(st_augment_check(&a, &d), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "--augment-crop") && strstr(st_last_error(), "8x8"),
              "%s", st_last_error());
    st_augment none = { 0 };
    cr_assert_eq(st_augment_check(&none, &d), ST_OK);
    /* no image shape: the synthetic task */
    d.channels = 192;
    d.height = d.width = 1;
    st_augment flip = { .flip = 1 };
    cr_assert_eq(st_augment_check(&flip, &d), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "--augment-flip") && strstr(st_last_error(), "192x1x1"),
              "%s", st_last_error());
    cr_assert_eq(st_augment_check(&none, &d), ST_OK, "nothing asked, nothing to refuse");
    /* a shape that does not multiply to dim, or none at all */
    d.channels = 0;
    cr_assert_eq(st_augment_check(&flip, &d), ST_ERR_INVALID);
    d.channels = 2;
    d.height = d.width = 8;
    cr_assert_eq(st_augment_check(&flip, &d), ST_ERR_INVALID);
    st_dataset_free(&d);
}

/* Counts heap calls on the armed thread (heapwatch.h interposes the C
 * library's malloc family for the whole test program). */
static _Thread_local int armed;
static _Thread_local long heap_calls;

static void heapwatch_heap_call(int inside_onednn)
{
    (void)inside_onednn;
    heap_calls += armed;
}

static void heapwatch_execute(void)
{
}

#include "heapwatch.h"

Test(augment, an_augmented_gather_makes_no_heap_call)
{
    HEAPWATCH_SKIP_IF_OFF();
    st_dataset d;
    image_set(&d, 256);
    d.augment = (st_augment){ .crop = 3, .flip = 1, .seed = 11 };
    uint32_t *order = malloc(256 * sizeof *order);
    float *x = malloc(128 * 192 * sizeof *x);
    int32_t *y = malloc(128 * sizeof *y);
    st_epoch_order(1, 0, order, 256);
    /* the interposer sees calls: one here (through a volatile pointer, so
     * that the compiler cannot drop the malloc/free pair) */
    void *(*volatile alloc)(size_t) = malloc;
    armed = 1;
    void *probe = alloc(16);
    armed = 0;
    free(probe);
    cr_assert_eq(heap_calls, 1, "the interposer counts");
    heap_calls = 0;
    armed = 1;
    for (uint64_t epoch = 0; epoch < 4; epoch++) {
        st_dataset_gather_train(&d, epoch, order, 128, x, y);
        st_dataset_gather_train(&d, epoch, order + 128, 128, x, y);
    }
    armed = 0;
    cr_assert_eq(heap_calls, 0, "8 augmented gathers called the heap %ld times", heap_calls);
    free(order);
    free(x);
    free(y);
    st_dataset_free(&d);
}

/* A learnable 1 x 8 x 8 task: the class is the bright quadrant. */
static void quadrant_set(st_dataset *d, uint32_t n, uint32_t seed)
{
    memset(d, 0, sizeof *d);
    d->count = n;
    d->channels = 1;
    d->height = d->width = 8;
    d->dim = 64;
    d->n_classes = 4;
    d->x = malloc((size_t)n * 64 * sizeof(float));
    d->y = malloc(n);
    cr_assert(d->x && d->y);
    uint32_t s = seed * 2654435761u + 7;
    for (uint32_t i = 0; i < n; i++) {
        int q = (int)(i % 4);
        d->y[i] = (uint8_t)q;
        for (int yy = 0; yy < 8; yy++)
            for (int xx = 0; xx < 8; xx++) {
                s = s * 1664525u + 1013904223u;
                float v = (float)(s >> 8) / 16777216.0f;
                if ((yy / 4) * 2 + xx / 4 == q)
                    v += 1.5f;
                d->x[(size_t)i * 64 + yy * 8 + xx] = v;
            }
    }
}

static st_epoch_record augmented_run(int crop, int flip, int workers)
{
    st_dataset train, test;
    quadrant_set(&train, 512, 1);
    quadrant_set(&test, 128, 2);
    st_dataset_normalize_channels(&train, &test, NULL, NULL, 0);
    train.augment = (st_augment){ .crop = (uint32_t)crop, .flip = flip, .seed = 9 };
    st_train_config c = st_train_config_default();
    c.model.kind = st_model_kind_named("mlp");
    c.model.depth = 1;
    c.model.width = 32;
    c.model.in_dim = 64;
    c.model.n_classes = 4;
    c.batch = 32 / workers;
    c.epochs = 2;
    c.seed = 9;
    c.workers = workers;
    c.oversubscribe = 1;
    st_epoch_record final;
    cr_assert_eq(st_train_run(&c, &train, &test, NULL, &final), ST_OK, "%s", st_last_error());
    st_dataset_free(&train);
    st_dataset_free(&test);
    return final;
}

Test(augment, augmented_training_is_reproducible, .timeout = 120)
{
    st_epoch_record a = augmented_run(2, 1, 1), b = augmented_run(2, 1, 1);
    st_epoch_record plain = augmented_run(0, 0, 1);
    cr_assert(a.train_loss == b.train_loss && a.test_loss == b.test_loss,
              "same seed, same run: %.9g %.9g", a.train_loss, b.train_loss);
    cr_assert(a.train_loss != plain.train_loss, "the workers apply the augmentation");
    /* two workers: the same global batches, whichever thread loads them */
    st_epoch_record c = augmented_run(2, 1, 2), d = augmented_run(2, 1, 2);
    cr_assert(c.train_loss == d.train_loss && c.test_loss == d.test_loss,
              "two workers, same seed: %.9g %.9g", c.train_loss, d.train_loss);
    cr_assert(c.train_loss != augmented_run(0, 0, 2).train_loss);
    /* a crop the images cannot take is refused before training */
    st_dataset train, test;
    quadrant_set(&train, 64, 1);
    quadrant_set(&test, 32, 2);
    train.augment.crop = 8;
    st_train_config cfg = st_train_config_default();
    cfg.model.in_dim = 64;
    cfg.model.n_classes = 4;
    cfg.batch = 16;
    cr_assert_eq(st_train_run(&cfg, &train, &test, NULL, NULL), ST_ERR_INVALID);
    cr_assert(strstr(st_last_error(), "--augment-crop"), "%s", st_last_error());
    st_dataset_free(&train);
    st_dataset_free(&test);
}

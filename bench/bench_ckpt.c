/*
 * bench/bench_ckpt.c — how long a weights checkpoint takes to write,
 * against a plain sequential write of the same bytes to the same disk,
 * measured in the same run.
 *
 * The model is resmlp d8 w1024 (784 inputs, 10 classes: 17.6 M parameters,
 * 70.5 MB of floats).  Each round writes, alternately:
 *   checkpoint  st_checkpoint_write_weights: header, data, fsync of the
 *               temporary file, rename, fsync of the directory;
 *   plain       the same number of bytes with write(2) to one file, then
 *               fsync: what the disk does for a file of that size.
 * The median of --rounds (default 5) of each is reported as MB/s, and the
 * ratio checkpoint / plain: what the format and the atomic replacement
 * cost over the bytes themselves.
 *
 * --state: the checkpoint is a step checkpoint's shape instead, the
 * weights and AdamW's two moments as two workers' shards (the
 * train.optimizer.{m,v}.worker<k> tensors, 3 x the weights' bytes), and
 * the plain write is of as many bytes.
 *
 *   bench/bench_ckpt [--dir DIR] [--rounds N] [--state]     (DIR default: .)
 */
#define _POSIX_C_SOURCE 200809L

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BENCH_NAME "bench_ckpt"
#include "bench_util.h"

#include <subtrain/subtrain.h>

#define MAX_ROUNDS 101

static int plain_write(const char *path, const void *p, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return -1;
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w <= 0) {
            close(fd);
            return -1;
        }
        c += w;
        n -= (size_t)w;
    }
    int r = fsync(fd);
    return close(fd) || r ? -1 : 0;
}

int main(int argc, char **argv)
{
    const char *dir = ".";
    int rounds = 5, state = 0;
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v;
        if ((v = option_value(argc, argv, &i, "--dir", &missing))) {
            dir = v;
        } else if ((v = option_value(argc, argv, &i, "--rounds", &missing))) {
            rounds = atoi(v);
            if (rounds < 1 || rounds > MAX_ROUNDS)
                return usage_error("--rounds: expected 1..101, got '%s'", v);
        } else if (strcmp(argv[i], "--state") == 0) {
            state = 1;
        } else if (strcmp(argv[i], "--help") == 0) {
            printf("usage: bench_ckpt [--dir DIR] [--rounds N] [--state]\n");
            return 0;
        } else {
            return usage_error(missing ? "%s needs a value" : "unknown option '%s'", argv[i]);
        }
    }
    st_model_config c = st_model_config_default();
    c.depth = 8;
    c.width = 1024;
    const size_t n = st_model_config_param_count(&c);
    /* the weights, then (--state) the two moments: one buffer, so that
     * the plain write is one sequential write of all the bytes */
    const size_t total = state ? 3 * n : n;
    float *p = malloc(total * sizeof *p);
    if (p)
        for (size_t i = n; i < total; i++)
            p[i] = 1e-3f * (float)(i % 1000);
    if (!p || st_model_init_full_range(&c, 1, 0, n, p) != ST_OK) {
        fprintf(stderr, "bench_ckpt: %s\n", p ? st_last_error() : "out of memory");
        return 1;
    }
    char ck[4096], plain[4096];
    snprintf(ck, sizeof ck, "%s/bench_ckpt.safetensors", dir);
    snprintf(plain, sizeof plain, "%s/bench_ckpt.plain", dir);
    st_safetensors_tensor extra[4];
    memset(extra, 0, sizeof extra);
    const size_t half = n / 2;
    for (int k = 0; k < 4; k++) {   /* m.worker0, m.worker1, v.worker0, v.worker1 */
        snprintf(extra[k].name, sizeof extra[k].name, "train.optimizer.%c.worker%d",
                 k < 2 ? 'm' : 'v', k % 2);
        extra[k].dtype = ST_DTYPE_F32;
        extra[k].ndims = 1;
        extra[k].shape[0] = (int64_t)(k % 2 ? n - half : half);
        extra[k].data = p + n * (size_t)(1 + k / 2) + (k % 2 ? half : 0);
    }
    double tc[MAX_ROUNDS], tp[MAX_ROUNDS];
    for (int r = 0; r < rounds; r++) {
        double t0 = now_s();
        if (st_checkpoint_write(ck, &c, p, extra, state ? 4 : 0, NULL, 0) != ST_OK) {
            fprintf(stderr, "bench_ckpt: %s\n", st_last_error());
            return 1;
        }
        double t1 = now_s();
        if (plain_write(plain, p, total * sizeof *p) != 0) {
            fprintf(stderr, "bench_ckpt: %s: cannot write\n", plain);
            return 1;
        }
        tc[r] = t1 - t0;
        tp[r] = now_s() - t1;
    }
    qsort(tc, (size_t)rounds, sizeof *tc, cmp_double);
    qsort(tp, (size_t)rounds, sizeof *tp, cmp_double);
    const double mb = (double)(total * sizeof *p) / 1e6, c_med = tc[rounds / 2],
                 p_med = tp[rounds / 2];
    printf("resmlp d8 w1024: %zu parameters, %s %.1f MB; median of %d rounds in %s\n", n,
           state ? "weights and AdamW state (a step checkpoint)" : "weights", mb, rounds, dir);
    printf("checkpoint  %.3f s  %.0f MB/s  (best %.3f s)\n", c_med, mb / c_med, tc[0]);
    printf("plain write %.3f s  %.0f MB/s  (best %.3f s)\n", p_med, mb / p_med, tp[0]);
    printf("checkpoint / plain: %.2f of the plain write's rate\n", p_med / c_med);
    unlink(ck);
    unlink(plain);
    free(p);
    return 0;
}

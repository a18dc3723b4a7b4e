/*
 * cli/calibration.h — a machine's measured rates, as `subtrain calibrate`
 * writes them and `subtrain plan --calibration FILE` reads them.
 *
 * The file is text, one `key value` a line, '#' starting a comment:
 *
 *   format 1
 *   machine TEXT                   where it was measured (the rest of the line)
 *   isa NAME                       oneDNN's effective ISA there
 *   matmul_fp32_small_gflops X     a (128 x 256) x (256 x 256) matmul, fp32
 *   matmul_fp32_large_gflops X     a (256 x 1024) x (1024 x 1024) matmul, fp32
 *   matmul_bf16_small_gflops X     the same, bf16 inputs, fp32 output
 *   matmul_bf16_large_gflops X     (0: oneDNN has no bf16 matmul there)
 *   conv_fp32_gflops X             a 3x3 convolution, 32 x 16 x 32 x 32 -> 16
 *                                  channels, forward and backward (the layer's)
 *   conv_bf16_gflops X             the same in bf16 (0: none)
 *   elementwise_gbps X             y = a x + y over 1 MiB vectors: bytes read
 *                                  and written a second
 *   reduce_gbps X                  d = (s1 + s2) / 2 over 4 MiB vectors, the
 *                                  reduction's work on an element
 *   stream_triad_gbps X            STREAM's triad a = b + s c over 64 MiB arrays
 *
 * Every rate is one thread's (a worker's), the machine otherwise idle.
 * Rates a key does not give are 0: rows that need them get no predicted
 * time.  Unknown keys and malformed values are refused with their line.
 */
#ifndef SUBTRAIN_CLI_CALIBRATION_H
#define SUBTRAIN_CLI_CALIBRATION_H

#include <stddef.h>
#include <stdio.h>

typedef struct st_calibration {
    char machine[160];
    char isa[40];
    double matmul_gflops[2][2];   /* [bf16][large] */
    double conv_gflops[2];        /* [bf16] */
    double elementwise_gbps, reduce_gbps, stream_gbps;
} st_calibration;

/* 0, or -1 with a message ("line 3: ...") in err. */
int st_calibration_read(const char *path, st_calibration *out, char *err, size_t n);
/* The file's text. */
void st_calibration_write(FILE *f, const st_calibration *c);
/* This machine's rates (a few seconds). */
int st_calibration_measure(st_calibration *out, char *err, size_t n);
/* The products' rate of a model: convolutions or matmuls (small shapes up
 * to width 512, large above), in fp32 or bf16; 0 when not measured. */
double st_calibration_compute_rate(const st_calibration *c, int conv, int bf16, int width);

/* `subtrain calibrate`. */
int st_cli_calibrate_main(int argc, char **argv);

#endif /* SUBTRAIN_CLI_CALIBRATION_H */

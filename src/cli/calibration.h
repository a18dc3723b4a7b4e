/*
 * cli/calibration.h — a machine's measured rates, as `subtrain calibrate`
 * writes them and `subtrain plan --calibration FILE` reads them.
 *
 * The file is text, one `key value` a line, '#' starting a comment:
 *
 *   format 2
 *   machine TEXT                   where it was measured (the rest of the line)
 *   isa NAME                       oneDNN's effective ISA there
 *   cpus N                         its CPUs online
 *   matmul_T_L_mM_nN_kK_gflops X   an (M x K) x (K x N) matmul, inputs of type
 *                                  T (fp32, bf16; the output fp32) read as L
 *                                  says (nn: both row-major; nt: B transposed;
 *                                  tn: A transposed), for M, N, K each 16, 64,
 *                                  256, 1024 (0: oneDNN has none); the calls
 *                                  cycle through 8 MiB of operands
 *   conv_fp32_gflops X             a 3x3 convolution, 32 x 16 x 32 x 32 -> 16
 *                                  channels, forward and backward (the layer's)
 *   conv_bf16_gflops X             the same in bf16 (0: none)
 *   chain_T X                      a chain of products as layers run them (8
 *                                  layers of 128 x 256 -> 256: their forwards,
 *                                  then their backward-data and -weights
 *                                  products, each layer's operands its own),
 *                                  its time over the same products' as the
 *                                  grid runs them
 *   chain_wide_T X                 the same of 8 layers of 128 x 1024 -> 1024,
 *                                  whose operands leave a core's caches (0:
 *                                  not measured: chain_T serves every width)
 *   chain_all_T X                  the same chain on every CPU at once (each
 *                                  its own), the slowest's time over the chain
 *                                  alone's
 *   attention_T X                  attention's two forward products over 8
 *                                  samples x 8 heads (128 tokens, 64 a head)
 *                                  as the layer runs them, strided views of
 *                                  one buffer, over the same products with
 *                                  the heads' rows stacked in plain matrices
 *   call_us X                      one execution of the smallest primitive
 *   OP_fwd_ns X, OP_bwd_ns X       oneDNN's primitive OP (relu, gelu, layernorm,
 *                                  softmax, logsoftmax: over 1024 x 256 floats;
 *                                  batchnorm: 32 x 16 x 32 x 32, blocked by
 *                                  channels, the ReLU fused), training
 *                                  forward and backward: ns a value
 *   update_O_M_ns X                the library's optimizer O (adamw, sgd) with
 *                                  moments M (fp32, bf16), over 1M parameters:
 *                                  ns a parameter
 *   elementwise_S_gbps X           y = a x + y over vectors of S in all (16k,
 *                                  256k, 4m, 64m bytes): bytes read and
 *                                  written a second
 *   reduce_gbps X                  d = (s1 + s2) / 2 over 4 MiB vectors, the
 *                                  reduction's work on an element
 *   stream_triad_gbps X            STREAM's triad a = b + s c over 64 MiB arrays
 *   stream_triad_all_gbps X        the same on every CPU at once: the machine's
 *                                  total
 *   team_T_matmul_P_dD X           a team's speedup: a D x D x D matmul (NN,
 *                                  inputs of type P, D each 16, 64, 256,
 *                                  1024) on T threads (T 2, 4, ... 256, up to
 *                                  the CPUs; 0: not measured), one thread's
 *                                  time over the team's
 *   team_T_relu_fwd X              the same of the relu forward (1024 x 256)
 *   team_T_call_us X               what a primitive's call costs a team of T
 *                                  beyond its share of the work: the relu
 *                                  forward over 16k values on T threads less
 *                                  one thread's time over T
 *
 * Every rate but the triad on every CPU and the teams' is one thread's (a
 * worker's), the machine otherwise idle.  Rates a key does not give are 0: rows that need them
 * get no predicted time.  Unknown keys and malformed values are refused
 * with their line; so is a format 1 file (its rates are too few for the
 * prediction: calibrate again).
 *   network_ranks R                `mpirun -np R subtrain calibrate --network`:
 *                                  that measured the two rates below (left
 *                                  out by a calibration of one process)
 *   network_gbps X                 bytes a rank receives a second while every
 *                                  rank sends each other rank 4 MiB and
 *                                  receives as much, the messages posted at
 *                                  once (the MPI backend's exchange)
 *   network_us X                   the same exchange of 8 bytes: its time
 */
#ifndef SUBTRAIN_CLI_CALIBRATION_H
#define SUBTRAIN_CLI_CALIBRATION_H

#include <stddef.h>
#include <stdio.h>

#include <subtrain/model.h>

/* The matmul grid: M, N and K each ST_CAL_DIM0 x 4^i, i < ST_CAL_DIMS. */
#define ST_CAL_DIMS 4
#define ST_CAL_DIM0 16
/* The element-wise sizes: ST_CAL_PASS0 x 16^i bytes, i < ST_CAL_PASSES. */
#define ST_CAL_PASSES 4
#define ST_CAL_PASS0 16384.0
/* Teams of T = 2^(i + 1) threads, i < ST_CAL_TEAMS. */
#define ST_CAL_TEAMS 8

typedef struct st_calibration {
    char machine[160];
    char isa[40];
    double cpus;
    /* [bf16][st_cost_operands][m][n][k] */
    double matmul_gflops[2][ST_OPERANDS_COUNT][ST_CAL_DIMS][ST_CAL_DIMS][ST_CAL_DIMS];
    double conv_gflops[2];        /* [bf16] */
    double chain[2];              /* [bf16]: a chain's time over its products' alone */
    double chain_wide[2];         /* [bf16]: the same of the wide chain (0: none) */
    double chain_all[2];          /* [bf16]: the chain on every CPU at once over alone */
    double attention[2];          /* [bf16]: heads' strided products over stacked ones */
    double call_us;
    double op_ns[ST_OP_COUNT][2];   /* [st_cost_op][backward]: ns a value */
    double update_ns[2][2];         /* [sgd][bf16 moments]: ns a parameter */
    double elementwise_gbps[ST_CAL_PASSES];
    double reduce_gbps, stream_gbps, stream_all_gbps;
    /* [team]: a team's speedup over one thread (0: not measured) */
    double team_matmul[ST_CAL_TEAMS][2][ST_CAL_DIMS];   /* [bf16][D] */
    double team_pass[ST_CAL_TEAMS];
    double team_call_us[ST_CAL_TEAMS];
    /* between MPI ranks (0: calibrated without them) */
    double network_ranks, network_gbps, network_us;
} st_calibration;

/* 0, or -1 with a message ("line 3: ...") in err. */
int st_calibration_read(const char *path, st_calibration *out, char *err, size_t n);
/* The file's text. */
void st_calibration_write(FILE *f, const st_calibration *c);
/* This machine's rates (some seconds). */
int st_calibration_measure(st_calibration *out, char *err, size_t n);
/* GFLOP/s of an (m x k) x (k x n) product, interpolated between the
 * grid's shapes in log space (clamped at its edges); 0 when not measured. */
double st_calibration_matmul_rate(const st_calibration *c, int bf16, st_cost_operands ops,
                                  double m, double n, double k);
/* GB/s of an element-wise pass over `bytes` (read and written), between
 * the measured sizes in log space; 0 when not measured. */
double st_calibration_pass_rate(const st_calibration *c, double bytes);
/* A team of T threads' rates: those of the calibrated team of T, or of a
 * T between two calibrated sizes (3, 6, 12, ...: a domain's cores divided)
 * the two interpolated as log2 T is between theirs, speedups in log space
 * and the call's cost linearly.  0 in every field when T is beyond the
 * calibrated sizes or a rate it needs was not measured. */
typedef struct st_team_rates {
    double pass;          /* the relu forward's speedup */
    double call_us;       /* a call's cost to the team */
    int lo, hi;           /* the calibrated teams it comes from */
    double at;            /* its place between them: 0 at lo, 1 at hi */
} st_team_rates;
st_team_rates st_calibration_team_rates(const st_calibration *c, int threads);
/* That team's speedup on one product of `flops`, between the measured
 * cubes' FLOPs in log space (clamped at their edges); 0 when not measured. */
double st_calibration_team_matmul(const st_calibration *c, const st_team_rates *team, int bf16,
                                  double flops);

/* `subtrain calibrate`. */
int st_cli_calibrate_main(int argc, char **argv);

#endif /* SUBTRAIN_CLI_CALIBRATION_H */

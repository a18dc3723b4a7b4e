#!/bin/sh
# The strategy table of doc/cnn.md: the default ResNet (depth 3, width 16,
# about 0.27 M parameters) on Fashion-MNIST, 4 workers with 32 samples each
# (oversubscribed on a 2-core machine: accuracy, memory and bytes are what
# count; samples/s is of 4 workers sharing 2 cores), E epochs (default 3):
# data parallelism; SDP with block and neuron (channel-group) units at
# coverage 0.5 and 0.25, forward masking with and without the branch scale
# (off by default for the blocks of models with batch norm), and backward
# masking;
# block forward masking at C = 0.5 FLOP-matched (2 E epochs), with masks
# redrawn every 50 steps, and without batch norm recalibration; ResIST
# with 2 and 4 workers, data parallelism with 2; a second seed of data
# parallelism and of block SDP at C = 0.5.  Prints a markdown table; the
# metrics files stay in $OUT (default /tmp/cnn-table).
#
#   EPOCHS=3 sh scripts/cnn_table.sh [path/to/subtrain]
set -eu
BIN=${1:-./subtrain}
OUT=${OUT:-/tmp/cnn-table}
E=${EPOCHS:-3}
mkdir -p "$OUT"
COMMON="--model resnet --seed 1 --batch 32 --oversubscribe --progress none"
# 16 channels in stage 0: groups of 4 give every worker a unit at C = 0.25
NEURON="--subnet neuron --neuron-group 4"

# field NAME < one JSON line (a number)
field() { sed -E "s/.*\"$1\":([-0-9.e+]+).*/\1/"; }

run() { # name, options...
    name=$1
    shift
    [ -s "$OUT/$name.jsonl" ] && return 0   # done by an earlier call
    nice "$BIN" $COMMON "$@" --quiet --metrics "$OUT/$name.tmp" && mv "$OUT/$name.tmp" "$OUT/$name.jsonl"
}

DP_PEAK=
row() { # label, workers, epochs, file
    line=$(grep '"final":true' "$OUT/$4.jsonl" | tail -n 1)
    acc=$(echo "$line" | field test_acc)
    peak=$(echo "$line" | field peak_bytes_per_worker)
    act=$(echo "$line" | field activations)
    comm=$(echo "$line" | field comm_bytes_per_worker_step)
    wall=$(echo "$line" | field wall_s)
    sps=$(echo "$line" | field samples_per_s)
    [ -n "$DP_PEAK" ] || DP_PEAK=$peak
    awk -v l="$1" -v n="$2" -v e="$3" -v a="$acc" -v p="$peak" -v d="$DP_PEAK" -v x="$act" \
        -v c="$comm" -v w="$wall" -v s="$sps" 'BEGIN {
        printf "| %s | %s | %s | %.4f | %.1f (%.2f) | %.1f | %.3f | %.0f | %.0f |\n",
               l, n, e, a, p / 1048576, p / d, x / 1048576, c / 1e6, w, s }'
}

E2=$((2 * E))
SCALE="--branch-scale inverse-coverage"
NOSCALE="--branch-scale none"
SDP="--workers 4 --strategy sdp"
run dp4 --workers 4 --epochs $E
run dp4-seed2 --workers 4 --epochs $E --seed 2
run sdp-block-f50 $SDP --epochs $E --subnet block --coverage 0.5 $SCALE
run sdp-block-f50-fm $SDP --epochs $E2 --subnet block --coverage 0.5 $SCALE
run sdp-block-f25 $SDP --epochs $E --subnet block --coverage 0.25 $SCALE
run sdp-block-f50-noscale $SDP --epochs $E --subnet block --coverage 0.5 $NOSCALE
run sdp-block-f50-noscale-seed2 $SDP --epochs $E --subnet block --coverage 0.5 $NOSCALE --seed 2
run sdp-block-f50-noscale-fm $SDP --epochs $E2 --subnet block --coverage 0.5 $NOSCALE
run sdp-block-f50-noscale-r50 $SDP --epochs $E --subnet block --coverage 0.5 $NOSCALE --resample 50
run sdp-block-f25-noscale $SDP --epochs $E --subnet block --coverage 0.25 $NOSCALE
run sdp-block-f50-nocal $SDP --epochs $E --subnet block --coverage 0.5 $SCALE --bn-calibration 0
run sdp-block-b50 $SDP --epochs $E --subnet block --coverage 0.5 --masking backward
run sdp-block-b25 $SDP --epochs $E --subnet block --coverage 0.25 --masking backward
run sdp-neuron-f50 $SDP --epochs $E $NEURON --coverage 0.5 $SCALE
run sdp-neuron-f25 $SDP --epochs $E $NEURON --coverage 0.25 $SCALE
run sdp-neuron-f50-noscale $SDP --epochs $E $NEURON --coverage 0.5 $NOSCALE
run sdp-neuron-f25-noscale $SDP --epochs $E $NEURON --coverage 0.25 $NOSCALE
run sdp-neuron-b50 $SDP --epochs $E $NEURON --coverage 0.5 --masking backward
run sdp-neuron-b25 $SDP --epochs $E $NEURON --coverage 0.25 --masking backward
run dp2 --workers 2 --epochs $E
run ist2 --workers 2 --epochs $E --strategy ist
run ist4 --workers 4 --epochs $E --strategy ist

echo "| run | N | epochs | test acc | peak MiB per worker (vs dp) | activations MiB | comm MB per worker-step | wall s | samples/s |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
row "data parallel" 4 $E dp4
row "data parallel, seed 2" 4 $E dp4-seed2
row "SDP block fwd C=0.5 (default: no branch scale)" 4 $E sdp-block-f50-noscale
row "SDP block fwd C=0.5, seed 2" 4 $E sdp-block-f50-noscale-seed2
row "SDP block fwd C=0.5, FLOP-matched" 4 $E2 sdp-block-f50-noscale-fm
row "SDP block fwd C=0.5, masks redrawn every 50 steps" 4 $E sdp-block-f50-noscale-r50
row "SDP block fwd C=0.25" 4 $E sdp-block-f25-noscale
row "SDP block fwd C=0.5, branch scale" 4 $E sdp-block-f50
row "SDP block fwd C=0.5, branch scale, FLOP-matched" 4 $E2 sdp-block-f50-fm
row "SDP block fwd C=0.25, branch scale" 4 $E sdp-block-f25
row "SDP block fwd C=0.5, branch scale, no recalibration" 4 $E sdp-block-f50-nocal
row "SDP block bwd C=0.5" 4 $E sdp-block-b50
row "SDP block bwd C=0.25" 4 $E sdp-block-b25
row "SDP neuron fwd C=0.5, no branch scale" 4 $E sdp-neuron-f50-noscale
row "SDP neuron fwd C=0.25, no branch scale" 4 $E sdp-neuron-f25-noscale
row "SDP neuron fwd C=0.5 (default: branch scale)" 4 $E sdp-neuron-f50
row "SDP neuron fwd C=0.25, branch scale" 4 $E sdp-neuron-f25
row "SDP neuron bwd C=0.5" 4 $E sdp-neuron-b50
row "SDP neuron bwd C=0.25" 4 $E sdp-neuron-b25
DP_PEAK=
row "data parallel" 2 $E dp2
row "ResIST (ist, blocks per stage)" 2 $E ist2
row "ResIST (ist, blocks per stage)" 4 $E ist4

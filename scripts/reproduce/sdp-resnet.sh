#!/bin/sh
# scripts/reproduce/sdp-resnet.sh — the SDP table of doc/cnn.md in the
# paper's regime: the depth-5 ResNet, 4 workers, coverage 0.5 (two holders
# a block), masks redrawn every 50 steps, forward and backward masking
# against data parallelism, 10 epochs, 3 seeds (9 runs; about 11 minutes a
# data-parallel run on a quiet 2-core machine).  Options: common.sh.
. "$(cd "$(dirname "$0")" && pwd)/common.sh"

claim <<'TEXT'
Subnetwork data parallelism with block units reaches the accuracy of data parallelism on a ResNet while each worker holds and updates only its blocks. Setting: Fashion-MNIST, ResNet of 3 stages of 5 basic blocks, 4 workers of batch 32, coverage 0.5, --resample 50, 10 epochs.
TEXT
sweep sdp-resnet
compare sdp-resnet acc <<'PAIRS'
data parallel | SDP block forward C=0.5, --resample 50
data parallel | SDP block backward C=0.5, --resample 50
SDP block forward C=0.5, --resample 50 | SDP block backward C=0.5, --resample 50
PAIRS
compare sdp-resnet peak <<'PAIRS'
data parallel | SDP block forward C=0.5, --resample 50
data parallel | SDP block backward C=0.5, --resample 50
PAIRS

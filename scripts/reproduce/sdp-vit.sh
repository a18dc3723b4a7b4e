#!/bin/sh
# scripts/reproduce/sdp-vit.sh — SDP with several holders a unit on the
# ViT (patch 7, width 128, depth 4, 4 heads, Fashion-MNIST), 4 workers of
# batch 32, 3 epochs and 6 for the FLOP-matched rows; coverage 0.5 (two
# holders a block or head), masks redrawn every 50 steps, blocks against
# heads against data parallelism, 3 seeds (about 7 minutes a seed on a
# quiet 2-core machine).
# Options: common.sh.
. "$(cd "$(dirname "$0")" && pwd)/common.sh"

claim <<'TEXT'
Subnetwork data parallelism reaches the accuracy of data parallelism at lower memory per worker, and block units do better than neuron (head) units at the same coverage. Setting: the ViT (patch 7, width 128, depth 4, 4 heads, Fashion-MNIST), 4 workers of batch 32, 3 epochs and 6 for the FLOP-matched rows; coverage 0.5, --resample 50. Compared on test accuracy.
TEXT
sweep sdp-vit
holders sdp-vit acc ", 2x epochs"
compare sdp-vit peak <<'PAIRS'
data parallel | SDP block forward C=0.5
data parallel | SDP heads forward C=0.5
PAIRS

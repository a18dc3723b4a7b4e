#!/bin/sh
# scripts/reproduce/sdp-gpt.sh — SDP with several holders a unit on the
# byte-level gpt (depth 4, width 256, 4 heads, context 128, GCIDE), 4
# workers of batch 8, 600 steps and 1200 for the FLOP-matched rows;
# coverage 0.5 (two holders a block or head), masks redrawn every 50
# steps, blocks against heads against data parallelism, 3 seeds (about 25
# minutes a seed on a quiet 2-core machine).
# Options: common.sh.
. "$(cd "$(dirname "$0")" && pwd)/common.sh"

claim <<'TEXT'
Subnetwork data parallelism reaches the accuracy of data parallelism at lower memory per worker, and block units do better than neuron (head) units at the same coverage. Setting: the byte-level gpt (depth 4, width 256, 4 heads, context 128, GCIDE), 4 workers of batch 8, 600 steps and 1200 for the FLOP-matched rows; coverage 0.5, --resample 50. Compared on the held-out loss (nats a byte) and the next byte's accuracy.
TEXT
sweep sdp-gpt
holders sdp-gpt loss ", 2x steps"
holders sdp-gpt acc ", 2x steps"
compare sdp-gpt peak <<'PAIRS'
data parallel | SDP block forward C=0.5
data parallel | SDP heads forward C=0.5
PAIRS

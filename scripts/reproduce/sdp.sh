#!/bin/sh
# scripts/reproduce/sdp.sh — the SDP memory and accuracy table of
# doc/sdp.md: data parallelism against subnetwork data parallelism, blocks
# and neurons, C = 0.5 and 0.25, same epochs and FLOP-matched, 3 seeds.
# About 6 minutes on a quiet 2-core machine.  Options: common.sh.
. "$(cd "$(dirname "$0")" && pwd)/common.sh"

claim <<'TEXT'
Subnetwork data parallelism (each worker trains a structured subnetwork; every parameter held by k = C N workers, its gradient averaged over them) keeps data parallelism's accuracy with less memory per worker. As doc/sdp.md states the aims: FLOP-matched (C = 0.5 for twice the epochs), within 0.5 points of data parallelism's test accuracy; per-worker memory about 0.6x of data parallelism's at C = 0.5. Setting: resmlp depth 8 width 256, 4 workers, batch 32 each, Fashion-MNIST, 5 epochs (10 FLOP-matched).
TEXT
sweep sdp
compare sdp acc <<'PAIRS'
data parallel | SDP block C=0.5
data parallel | SDP block C=0.5, FLOP-matched (10 epochs)
data parallel | SDP neuron C=0.5
data parallel | SDP neuron C=0.5, FLOP-matched (10 epochs)
data parallel | SDP block C=0.25
data parallel | SDP neuron C=0.25
SDP block C=0.5 | SDP neuron C=0.5
SDP block C=0.25 | SDP neuron C=0.25
PAIRS
compare sdp peak <<'PAIRS'
data parallel | SDP block C=0.5
data parallel | SDP neuron C=0.5
data parallel | SDP block C=0.25
data parallel | SDP neuron C=0.25
PAIRS

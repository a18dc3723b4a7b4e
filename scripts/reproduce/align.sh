#!/bin/sh
# scripts/reproduce/align.sh — block against neuron subnetworks, gradient
# alignment (doc/sdp.md): the cosine between each worker's subnetwork
# gradient and the full model's on the same batch, every 100 steps, mean
# over the last epoch; C = 0.5 and 0.25, 3 seeds.  About 3 minutes on a
# quiet 2-core machine.  Options: common.sh.
. "$(cd "$(dirname "$0")" && pwd)/common.sh"

claim <<'TEXT'
Block-level subnetworks (whole residual blocks) align better with the full model's gradient than neuron-level ones (groups of hidden neurons of every block) at the same coverage. Measured: the cosine between each worker's subnetwork gradient and the full model's gradient on the worker's batch, with the current parameters (--report align=100); resmlp depth 8 width 256, 4 workers, Fashion-MNIST, 5 epochs.
TEXT
sweep align
compare align align <<'PAIRS'
subnet=block coverage=0.5 | subnet=neuron coverage=0.5
subnet=block coverage=0.25 | subnet=neuron coverage=0.25
PAIRS
compare align acc <<'PAIRS'
subnet=block coverage=0.5 | subnet=neuron coverage=0.5
subnet=block coverage=0.25 | subnet=neuron coverage=0.25
PAIRS

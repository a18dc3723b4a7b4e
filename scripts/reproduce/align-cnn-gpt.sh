#!/bin/sh
# scripts/reproduce/align-cnn-gpt.sh — the alignment claim on the ResNet
# and the gpt (doc/sdp.md): the cosine between each worker's subnetwork
# gradient and the full model's on the same batch, every 50 steps, blocks
# against neurons (channels of the ResNet, heads of the gpt), C = 0.5 and
# 0.25, 4 workers, 3 seeds (24 runs).  Options: common.sh.
. "$(cd "$(dirname "$0")" && pwd)/common.sh"

claim <<'TEXT'
Block-level subnetworks align better with the full model's gradient than neuron-level ones at the same coverage. Measured: --report align=50 on a ResNet (depth 3, 2 epochs of Fashion-MNIST, batch 32; neuron units of 4 channels) and the byte-level gpt (depth 4, width 256, 400 steps of GCIDE, batch 8; neuron units of 64: whole heads), 4 workers.
TEXT
sweep align-cnn-gpt
compare align-cnn-gpt align <<'PAIRS'
resnet subnet=block coverage=0.5 | resnet subnet=neuron coverage=0.5
resnet subnet=block coverage=0.25 | resnet subnet=neuron coverage=0.25
gpt subnet=block coverage=0.5 | gpt subnet=neuron coverage=0.5
gpt subnet=block coverage=0.25 | gpt subnet=neuron coverage=0.25
PAIRS

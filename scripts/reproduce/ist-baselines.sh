#!/bin/sh
# scripts/reproduce/ist-baselines.sh — the baselines table of doc/ist.md:
# IST (mlp, neuron groups) and ResIST (resmlp depth 8, blocks) against data
# parallelism, local SGD and random-k compressed data parallelism, N = 2
# and 4, the data dealt iid and with a Dirichlet(0.1) label skew, 3 seeds,
# 5 epochs (168 runs, about 45 minutes on a quiet 2-core machine).
# Options: common.sh.
. "$(cd "$(dirname "$0")" && pwd)/common.sh"

claim <<'TEXT'
IST reaches accuracy close to local SGD at the same number of local steps while communicating less, and its theory compares it with compressed-communication methods: on heterogeneous data IST converges to a biased point where unbiased compression does not. Setting: Fashion-MNIST, global batch 128, AdamW lr 1e-3 (local SGD's and IST's state reset at every average), cosine schedule, 5 epochs; --split iid and --split dirichlet:0.1.
TEXT
sweep ist-baselines
compare ist-baselines acc <<'PAIRS'
mlp N=2 dp split=iid | mlp N=2 local SGD R=10 split=iid
mlp N=2 dp split=iid | mlp N=2 local SGD R=50 split=iid
mlp N=2 dp split=iid | mlp N=2 IST R=10 split=iid
mlp N=2 dp split=iid | mlp N=2 IST R=50 split=iid
mlp N=2 dp split=iid | mlp N=2 randk Q=0.5 split=iid
mlp N=2 dp split=iid | mlp N=2 randk Q=0.25 split=iid
mlp N=2 local SGD R=10 split=iid | mlp N=2 IST R=10 split=iid
mlp N=2 local SGD R=50 split=iid | mlp N=2 IST R=50 split=iid
mlp N=2 dp split=dirichlet:0.1 | mlp N=2 local SGD R=10 split=dirichlet:0.1
mlp N=2 dp split=dirichlet:0.1 | mlp N=2 local SGD R=50 split=dirichlet:0.1
mlp N=2 dp split=dirichlet:0.1 | mlp N=2 IST R=10 split=dirichlet:0.1
mlp N=2 dp split=dirichlet:0.1 | mlp N=2 IST R=50 split=dirichlet:0.1
mlp N=2 dp split=dirichlet:0.1 | mlp N=2 randk Q=0.5 split=dirichlet:0.1
mlp N=2 dp split=dirichlet:0.1 | mlp N=2 randk Q=0.25 split=dirichlet:0.1
mlp N=2 local SGD R=10 split=dirichlet:0.1 | mlp N=2 IST R=10 split=dirichlet:0.1
mlp N=2 local SGD R=50 split=dirichlet:0.1 | mlp N=2 IST R=50 split=dirichlet:0.1
mlp N=2 dp split=iid | mlp N=2 dp split=dirichlet:0.1
mlp N=2 local SGD R=50 split=iid | mlp N=2 local SGD R=50 split=dirichlet:0.1
mlp N=2 IST R=50 split=iid | mlp N=2 IST R=50 split=dirichlet:0.1
mlp N=2 randk Q=0.25 split=iid | mlp N=2 randk Q=0.25 split=dirichlet:0.1
mlp N=4 dp split=iid | mlp N=4 local SGD R=10 split=iid
mlp N=4 dp split=iid | mlp N=4 local SGD R=50 split=iid
mlp N=4 dp split=iid | mlp N=4 IST R=10 split=iid
mlp N=4 dp split=iid | mlp N=4 IST R=50 split=iid
mlp N=4 dp split=iid | mlp N=4 randk Q=0.5 split=iid
mlp N=4 dp split=iid | mlp N=4 randk Q=0.25 split=iid
mlp N=4 local SGD R=10 split=iid | mlp N=4 IST R=10 split=iid
mlp N=4 local SGD R=50 split=iid | mlp N=4 IST R=50 split=iid
mlp N=4 dp split=dirichlet:0.1 | mlp N=4 local SGD R=10 split=dirichlet:0.1
mlp N=4 dp split=dirichlet:0.1 | mlp N=4 local SGD R=50 split=dirichlet:0.1
mlp N=4 dp split=dirichlet:0.1 | mlp N=4 IST R=10 split=dirichlet:0.1
mlp N=4 dp split=dirichlet:0.1 | mlp N=4 IST R=50 split=dirichlet:0.1
mlp N=4 dp split=dirichlet:0.1 | mlp N=4 randk Q=0.5 split=dirichlet:0.1
mlp N=4 dp split=dirichlet:0.1 | mlp N=4 randk Q=0.25 split=dirichlet:0.1
mlp N=4 local SGD R=10 split=dirichlet:0.1 | mlp N=4 IST R=10 split=dirichlet:0.1
mlp N=4 local SGD R=50 split=dirichlet:0.1 | mlp N=4 IST R=50 split=dirichlet:0.1
mlp N=4 dp split=iid | mlp N=4 dp split=dirichlet:0.1
mlp N=4 local SGD R=50 split=iid | mlp N=4 local SGD R=50 split=dirichlet:0.1
mlp N=4 IST R=50 split=iid | mlp N=4 IST R=50 split=dirichlet:0.1
mlp N=4 randk Q=0.25 split=iid | mlp N=4 randk Q=0.25 split=dirichlet:0.1
resmlp N=2 dp split=iid | resmlp N=2 local SGD R=10 split=iid
resmlp N=2 dp split=iid | resmlp N=2 local SGD R=50 split=iid
resmlp N=2 dp split=iid | resmlp N=2 IST R=10 split=iid
resmlp N=2 dp split=iid | resmlp N=2 IST R=50 split=iid
resmlp N=2 dp split=iid | resmlp N=2 randk Q=0.5 split=iid
resmlp N=2 dp split=iid | resmlp N=2 randk Q=0.25 split=iid
resmlp N=2 local SGD R=10 split=iid | resmlp N=2 IST R=10 split=iid
resmlp N=2 local SGD R=50 split=iid | resmlp N=2 IST R=50 split=iid
resmlp N=2 dp split=dirichlet:0.1 | resmlp N=2 local SGD R=10 split=dirichlet:0.1
resmlp N=2 dp split=dirichlet:0.1 | resmlp N=2 local SGD R=50 split=dirichlet:0.1
resmlp N=2 dp split=dirichlet:0.1 | resmlp N=2 IST R=10 split=dirichlet:0.1
resmlp N=2 dp split=dirichlet:0.1 | resmlp N=2 IST R=50 split=dirichlet:0.1
resmlp N=2 dp split=dirichlet:0.1 | resmlp N=2 randk Q=0.5 split=dirichlet:0.1
resmlp N=2 dp split=dirichlet:0.1 | resmlp N=2 randk Q=0.25 split=dirichlet:0.1
resmlp N=2 local SGD R=10 split=dirichlet:0.1 | resmlp N=2 IST R=10 split=dirichlet:0.1
resmlp N=2 local SGD R=50 split=dirichlet:0.1 | resmlp N=2 IST R=50 split=dirichlet:0.1
resmlp N=2 dp split=iid | resmlp N=2 dp split=dirichlet:0.1
resmlp N=2 local SGD R=50 split=iid | resmlp N=2 local SGD R=50 split=dirichlet:0.1
resmlp N=2 IST R=50 split=iid | resmlp N=2 IST R=50 split=dirichlet:0.1
resmlp N=2 randk Q=0.25 split=iid | resmlp N=2 randk Q=0.25 split=dirichlet:0.1
resmlp N=4 dp split=iid | resmlp N=4 local SGD R=10 split=iid
resmlp N=4 dp split=iid | resmlp N=4 local SGD R=50 split=iid
resmlp N=4 dp split=iid | resmlp N=4 IST R=10 split=iid
resmlp N=4 dp split=iid | resmlp N=4 IST R=50 split=iid
resmlp N=4 dp split=iid | resmlp N=4 randk Q=0.5 split=iid
resmlp N=4 dp split=iid | resmlp N=4 randk Q=0.25 split=iid
resmlp N=4 local SGD R=10 split=iid | resmlp N=4 IST R=10 split=iid
resmlp N=4 local SGD R=50 split=iid | resmlp N=4 IST R=50 split=iid
resmlp N=4 dp split=dirichlet:0.1 | resmlp N=4 local SGD R=10 split=dirichlet:0.1
resmlp N=4 dp split=dirichlet:0.1 | resmlp N=4 local SGD R=50 split=dirichlet:0.1
resmlp N=4 dp split=dirichlet:0.1 | resmlp N=4 IST R=10 split=dirichlet:0.1
resmlp N=4 dp split=dirichlet:0.1 | resmlp N=4 IST R=50 split=dirichlet:0.1
resmlp N=4 dp split=dirichlet:0.1 | resmlp N=4 randk Q=0.5 split=dirichlet:0.1
resmlp N=4 dp split=dirichlet:0.1 | resmlp N=4 randk Q=0.25 split=dirichlet:0.1
resmlp N=4 local SGD R=10 split=dirichlet:0.1 | resmlp N=4 IST R=10 split=dirichlet:0.1
resmlp N=4 local SGD R=50 split=dirichlet:0.1 | resmlp N=4 IST R=50 split=dirichlet:0.1
resmlp N=4 dp split=iid | resmlp N=4 dp split=dirichlet:0.1
resmlp N=4 local SGD R=50 split=iid | resmlp N=4 local SGD R=50 split=dirichlet:0.1
resmlp N=4 IST R=50 split=iid | resmlp N=4 IST R=50 split=dirichlet:0.1
resmlp N=4 randk Q=0.25 split=iid | resmlp N=4 randk Q=0.25 split=dirichlet:0.1
PAIRS
compare ist-baselines peak <<'PAIRS'
mlp N=2 dp split=iid | mlp N=2 local SGD R=50 split=iid
mlp N=2 dp split=iid | mlp N=2 IST R=50 split=iid
mlp N=2 dp split=iid | mlp N=2 randk Q=0.25 split=iid
mlp N=4 dp split=iid | mlp N=4 local SGD R=50 split=iid
mlp N=4 dp split=iid | mlp N=4 IST R=50 split=iid
mlp N=4 dp split=iid | mlp N=4 randk Q=0.25 split=iid
resmlp N=2 dp split=iid | resmlp N=2 local SGD R=50 split=iid
resmlp N=2 dp split=iid | resmlp N=2 IST R=50 split=iid
resmlp N=2 dp split=iid | resmlp N=2 randk Q=0.25 split=iid
resmlp N=4 dp split=iid | resmlp N=4 local SGD R=50 split=iid
resmlp N=4 dp split=iid | resmlp N=4 IST R=50 split=iid
resmlp N=4 dp split=iid | resmlp N=4 randk Q=0.25 split=iid
PAIRS

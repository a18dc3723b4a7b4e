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
# each method against dp and IST against local SGD at the same R, per
# model, N and split; each method's split against its iid run; memory
pairs() {
    for m in mlp resmlp; do
        for n in 2 4; do
            for s in iid dirichlet:0.1; do
                for c in "local SGD R=10" "local SGD R=50" "IST R=10" "IST R=50" \
                         "randk Q=0.5" "randk Q=0.25"; do
                    echo "$m N=$n dp split=$s | $m N=$n $c split=$s"
                done
                for r in 10 50; do
                    echo "$m N=$n local SGD R=$r split=$s | $m N=$n IST R=$r split=$s"
                done
            done
            for c in dp "local SGD R=50" "IST R=50" "randk Q=0.25"; do
                echo "$m N=$n $c split=iid | $m N=$n $c split=dirichlet:0.1"
            done
        done
    done
}
pairs | compare ist-baselines acc
for m in mlp resmlp; do
    for n in 2 4; do
        for c in "local SGD R=50" "IST R=50" "randk Q=0.25"; do
            echo "$m N=$n dp split=iid | $m N=$n $c split=iid"
        done
    done
done | compare ist-baselines peak

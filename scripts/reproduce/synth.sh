#!/bin/sh
# scripts/reproduce/synth.sh — the synthetic-labels table of doc/synth.md:
# the 6-layer mlp cut into 2 or 3 segments trained at the same time against
# synthetic labels, joined, with and without a recovery epoch, against
# end-to-end data parallelism; 2 and 4 workers, 3 seeds.  About 6 minutes
# on a quiet 2-core machine.  Options: common.sh.
. "$(cd "$(dirname "$0")" && pwd)/common.sh"

claim <<'TEXT'
Cutting the network into segments trained at the same time, each against fixed random "synthetic labels" of the classes so that no activation and no gradient crosses a cut, gives accuracy similar to end-to-end training once the segments are joined. Setting: the paper's 6-layer fully connected network (784 -> 5 x 256 -> 10), Fashion-MNIST, 5 epochs; one end-to-end recovery epoch is compared with 6 epochs of data parallelism.
TEXT
sweep synth
compare synth acc <<'PAIRS'
N=2 data parallel, 5 epochs | N=2 synth S=2, joined
N=4 data parallel, 5 epochs | N=4 synth S=2, joined
N=2 data parallel, 6 epochs | N=2 synth S=2, + 1 recovery epoch
N=4 data parallel, 6 epochs | N=4 synth S=2, + 1 recovery epoch
N=4 data parallel, 5 epochs | N=4 synth S=3, joined
N=4 synth S=3, joined | N=4 synth S=3 --cuts 2,4, joined
N=2 synth S=2, joined | N=2 synth S=2 --cuts 1, joined
PAIRS
compare synth peak <<'PAIRS'
N=2 data parallel, 5 epochs | N=2 synth S=2, joined
N=4 data parallel, 5 epochs | N=4 synth S=2, joined
N=4 data parallel, 5 epochs | N=4 synth S=3, joined
PAIRS

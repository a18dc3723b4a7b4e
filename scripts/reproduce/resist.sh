#!/bin/sh
# scripts/reproduce/resist.sh — the ResIST table of doc/ist.md: ResIST of
# resmlp depth 8 width 256 with R = 1, 10, 50 local steps against data
# parallelism, 2 and 4 workers, the same samples, 3 seeds.  About 7
# minutes on a quiet 2-core machine.  Options: common.sh.
. "$(cd "$(dirname "$0")" && pwd)/common.sh"

claim <<'TEXT'
ResIST (each round the residual blocks are split among the workers, each trains its blocks alone for R local steps, then blocks are written back and the shared layers averaged) reaches accuracy close to local SGD and data parallelism, while communicating once a round: bytes per worker and step fall as 1/R, and each worker holds only its blocks. Setting: Fashion-MNIST, AdamW reset every round, 5 epochs, global batch 128.
TEXT
sweep resist
compare resist acc <<'PAIRS'
N=2 data parallel | N=2 ResIST R=1
N=2 data parallel | N=2 ResIST R=10
N=2 data parallel | N=2 ResIST R=50
N=4 data parallel | N=4 ResIST R=1
N=4 data parallel | N=4 ResIST R=10
N=4 data parallel | N=4 ResIST R=50
N=2 ResIST R=10 | N=2 ResIST R=50
N=4 ResIST R=10 | N=4 ResIST R=50
PAIRS
compare resist peak <<'PAIRS'
N=2 data parallel | N=2 ResIST R=50
N=4 data parallel | N=4 ResIST R=50
PAIRS

#!/bin/sh
# The measurements of doc/synth.md: Fashion-MNIST, the 6-layer mlp (depth 5,
# width 256), 5 epochs; synthetic-label training split in 2 and 3 segments
# with 2 and 4 workers (one recovery epoch, whose run also gives the joined
# network before it), against data parallelism with 5 and 6 epochs.  The
# global batch of data parallelism is 128 (--batch 128 / N).  Prints a
# markdown table; the metrics files stay in $OUT (default /tmp/synth-table).
#
#   sh scripts/synth_table.sh [path/to/subtrain]
set -eu
BIN=${1:-./subtrain}
OUT=${OUT:-/tmp/synth-table}
mkdir -p "$OUT"
COMMON="--width 256 --seed 1 --epochs 5 --oversubscribe --progress none"

# field NAME < one JSON line
field() { sed -E "s/.*\"$1\":([-0-9.e+]+).*/\1/"; }

run() { # name, options...
    name=$1
    shift
    nice "$BIN" $COMMON "$@" --quiet --metrics "$OUT/$name.jsonl"
}

row() { # label, workers, file, selector (grep pattern of the record)
    line=$(grep -E "$4" "$OUT/$3.jsonl" | tail -n 1)
    acc=$(echo "$line" | field test_acc)
    peak=$(echo "$line" | field peak_bytes_per_worker)
    comm=$(echo "$line" | field comm_bytes_per_worker_step)
    wall=$(echo "$line" | field wall_s)
    awk -v l="$1" -v n="$2" -v a="$acc" -v p="$peak" -v c="$comm" -v w="$wall" 'BEGIN {
        printf "| %s | %s | %.4f | %.1f | %.2f | %.1f |\n", l, n, a, p / 1048576, c / 1e6, w }'
}

for n in 2 4; do
    b=$((128 / n))
    run dp$n-e5 --model mlp --depth 5 --workers $n --batch $b
    run dp$n-e6 --model mlp --depth 5 --workers $n --batch $b --epochs 6
    run synth2-$n --strategy synth --segments 2 --workers $n --batch $b --recovery-epochs 1
done
run synth3-4 --strategy synth --segments 3 --workers 4 --batch 32 --recovery-epochs 1
run synth3c-4 --strategy synth --segments 3 --cuts 2,4 --workers 4 --batch 32 --recovery-epochs 1
run synth2c-2 --strategy synth --segments 2 --cuts 1 --workers 2 --batch 64 --recovery-epochs 1

echo "| run | N | test acc | peak MiB per worker | comm MB per worker-step | wall s |"
echo "| --- | --- | --- | --- | --- | --- |"
for n in 2 4; do
    row "data parallel, 5 epochs" $n dp$n-e5 '"final":true'
    row "data parallel, 6 epochs" $n dp$n-e6 '"final":true'
    row "synth S=2, joined (0 recovery)" $n synth2-$n '"phase":"segments"'
    row "synth S=2, + 1 recovery epoch" $n synth2-$n '"final":true'
done
row "synth S=3, joined (0 recovery)" 4 synth3-4 '"phase":"segments"'
row "synth S=3, + 1 recovery epoch" 4 synth3-4 '"final":true'
row "synth S=3 --cuts 2,4, joined" 4 synth3c-4 '"phase":"segments"'
row "synth S=3 --cuts 2,4, + 1 recovery epoch" 4 synth3c-4 '"final":true'
row "synth S=2 --cuts 1, joined" 2 synth2c-2 '"phase":"segments"'
row "synth S=2 --cuts 1, + 1 recovery epoch" 2 synth2c-2 '"final":true'

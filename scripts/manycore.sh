#!/bin/sh
# scripts/manycore.sh — data-parallel scaling on a many-core machine (16
# cores or more): the efficiency measured at 1, 2, 4, 8 and 16 workers
# beside the scaling model's prediction for the same workers
# (doc/scaling.md).  Run it from a built tree after `make bench`.
#
#   sh scripts/manycore.sh                         # WORKERS="1 2 4 8 16"
#   WORKERS="1 2" QUICK=1 sh scripts/manycore.sh   # a machine of 2 cores
#
# For each N of WORKERS:
#   bench/bench_reduce --workers N --sizes MIB --payload fp32: the engine's
#       step alone (reduce-scatter + all-gather, a weight copy per NUMA
#       domain) and a STREAM add on the same N pinned workers;
#   bench/bench_step --config large --workers N (N > 1): the whole trainer,
#       resmlp d8 w1024 at batch 128 a worker, with 1 and N workers, the N
#       with a weight copy per domain ("shared") and with a replica per
#       worker ("replicas"), alternately in one run.
# Measured efficiency = samples/s(N) / (N x samples/s(1)), bench_step's
# "vs 1 wk" / N (the 1-worker run of the same bench_step).  Predicted =
# compute / (compute + the reduction's time): the model of
# scripts/scaling_model.sh on one node, with this machine's STREAM
# (bench_reduce's, N workers), the engine's bytes per worker and step
# (bench_step's comm MB/step) and the 1-worker compute ms; once with the
# reduction after the backward (N x bytes / STREAM), once with OVERLAP of
# it during the backward (its own streaming at the 1-worker STREAM, or
# what does not fit in the compute).  Speed is printed, never asserted;
# on a shared machine read ratios of one run.
#
#   WORKERS   the worker counts (default "1 2 4 8 16")
#   MIB       bench_reduce's gradient size (default 64, the large model's)
#   QUICK=1   short runs (bench_step --quick, bench_reduce --quick)
#   PRECISION fp32 (default) or bf16 (bench_step --precision)
#   OUT       where the benches' full outputs go (default /tmp/subtrain-manycore)
#   OVERLAP   the share of the reduction run during the backward (default
#             0.9, measured at 2 workers: doc/scaling.md)
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
WORKERS=${WORKERS:-"1 2 4 8 16"}
MIB=${MIB:-64}
PRECISION=${PRECISION:-fp32}
OUT=${OUT:-/tmp/subtrain-manycore}
OVERLAP=${OVERLAP:-0.9}
quick=""
[ "${QUICK:-0}" = 1 ] && quick="--quick"
for b in bench_reduce bench_step; do
    [ -x "$top/bench/$b" ] ||
        { echo "manycore: $top/bench/$b is not built (make bench)" >&2; exit 2; }
done
mkdir -p "$OUT"
cores=$(nproc)
echo "manycore: $cores CPUs here; workers $WORKERS; resmlp d8 w1024, batch 128 a worker, $PRECISION"
printf '%s' '| workers | STREAM GB/s | engine GB/s | engine / STREAM | samples/s ' \
    '| measured eff. | predicted | predicted, overlapped | replicas: samples/s ' \
    '| replicas: eff. | exposed (shared) | exposed (replicas) | comm MB/step ' \
    '| peak MiB/worker |'
printf '\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n'
core=
one_compute=""
for n in $WORKERS; do
    over=""
    [ "$n" -gt "$cores" ] && over="--oversubscribe"
    # shellcheck disable=SC2086  # the options are words
    "$top/bench/bench_reduce" --workers "$n" $over --sizes "$MIB" --payload fp32 $quick \
        >"$OUT/reduce-$n.txt" 2>&1 ||
        { echo "manycore: bench_reduce --workers $n failed:" \
               "$(tail -n 1 "$OUT/reduce-$n.txt")" >&2; exit 1; }
    # the size's row: grads MiB payload sets bytes MiB step-ms reduce-GB/s STREAM-GB/s ratio ...
    set -- $(awk -v m="$MIB" '$1 == m && $2 == "MiB" && $3 == "fp32" { print $8, $9, $10 }' \
                 "$OUT/reduce-$n.txt")
    engine=$1 stream=$2 ratio=$3
    [ -n "$core" ] || core=$stream   # the first count's: one core's, with WORKERS from 1
    if [ "$n" -eq 1 ]; then
        # one worker alone: the 1-worker row of a 2-worker bench_step run
        "$top/bench/bench_step" --config large --workers 2 --precision "$PRECISION" $quick \
            >"$OUT/step-1.txt" 2>&1 ||
            { echo "manycore: bench_step failed: $(tail -n 1 "$OUT/step-1.txt")" >&2; exit 1; }
        set -- $(awk '$1 == 1 && $2 == "own" { print $3, $5, $11, $12 }' "$OUT/step-1.txt")
        one_compute=$2
        echo "| 1 | $stream | $engine | $ratio | $1 | 1.00 | 1.00 | 1.00 | - | - | - | - |" \
             "$3 | $4 |"
        continue
    fi
    # shellcheck disable=SC2086
    "$top/bench/bench_step" --config large --workers "$n" --precision "$PRECISION" $quick \
        >"$OUT/step-$n.txt" 2>&1 ||
        { echo "manycore: bench_step --workers $n failed:" \
               "$(tail -n 1 "$OUT/step-$n.txt")" >&2; exit 1; }
    if [ -z "$one_compute" ]; then   # WORKERS without 1: this run's 1-worker row
        set -- $(awk '$1 == 1 && $2 == "own" { print $5 }' "$OUT/step-$n.txt")
        one_compute=$1
    fi
    # rows: workers weights samples/s vs-1 compute wait reduce optimizer overlap exposed% MB MiB
    # speed-ups over the 1-worker row of the same run (a same-run ratio)
    set -- $(awk -v n="$n" '$1 == n && $2 == "shared" {
                     sub("x", "", $4); print $3, $4, $10, $11, $12 }' "$OUT/step-$n.txt")
    sps=$1 up=$2 exposed=$3 mb=$4 mib=$5
    set -- $(awk -v n="$n" '$1 == n && $2 == "replicas" {
                     sub("x", "", $4); print $3, $4, $10 }' "$OUT/step-$n.txt")
    rsps=$1 rup=$2 rexposed=$3
    awk -v n="$n" -v sps="$sps" -v up="$up" -v tc="$one_compute" -v mb="$mb" \
        -v bw="$stream" -v rsps="$rsps" -v rup="$rup" -v engine="$engine" -v ratio="$ratio" \
        -v ex="$exposed" -v rex="$rexposed" -v mib="$mib" -v core="$core" -v ov="$OVERLAP" 'BEGIN {
        red_ms = n * mb * 1e6 / (bw * 1e9) * 1e3     # the node shared by n workers
        own = mb * 1e6 / (core * 1e9) * 1e3          # a worker alone, on its core
        late = red_ms - tc > own ? red_ms - tc : own
        printf "| %d | %s | %s | %s | %s | %.2f | %.2f | %.2f | %s | %.2f | %s | %s | %s | %s |\n",
            n, bw, engine, ratio, sps, up / n, tc / (tc + red_ms),
            tc / (tc + (1 - ov) * red_ms + ov * late), rsps, rup / n, ex, rex, mb, mib
    }'
done
echo "measured eff. = samples/s / (workers x the 1-worker samples/s of the same bench_step run);"
echo "predicted = compute ms of one worker / (that + workers x comm MB/step / STREAM GB/s of"
echo "bench_reduce at that many workers); overlapped: $OVERLAP of that during the backward, taking"
echo "its own streaming time at the first count's STREAM; outputs in $OUT"

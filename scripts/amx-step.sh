#!/bin/sh
# scripts/amx-step.sh — the step against its aims on the machine it runs
# on, in one prepared run of bounded length: what doc/benchmarks.md ("The
# step on a Xeon with AMX") reports, for a Xeon with AMX or any other CPU.
# Run it from a built tree after `make bench/bench_step`.
#
#   sh scripts/amx-step.sh                  # what 600 s allow
#   QUICK=1 sh scripts/amx-step.sh          # a smoke test (rough numbers)
#
# In this order, each part skipped once BUDGET seconds have gone:
#   1. the CPU's flags (bench_step's header names the ISA oneDNN picks);
#   2. bench_step --config all --precision both on PU $PU, the thread's
#      CPU time: the default step, then with --activation-precision bf16;
#   3. the per-primitive profile of the bf16 step with bf16 activations
#      (large, gpt, cnn; ONEDNN_VERBOSE=1, classed by
#      scripts/primitive-times -s -c);
#   4. as 2: --weight-layout blocked, --optimizer-moments all (the bytes
#      a parameter of each optimizer state, large);
#   5. throughput with 1 and WORKERS workers, fp32 and bf16;
#   6. as 2: cnn's --tensor-layout blocked; with OLD=PATH/bench_step,
#      that build's default step.
# Everything goes into OUT (JSON lines, logs, summary.txt).  Speed is
# printed, never asserted: read ratios of one run.
#
#   OUT=DIR      where the results go (default ./amx-step)
#   BUDGET=S     seconds after which the remaining parts are skipped (600)
#   SECONDS_=S   bench_step --seconds (default 1; QUICK: 0.3)
#   PU=N         the PU of the one-thread parts (default 1)
#   WORKERS=N    part 4's workers (default 2)
#   OLD=PATH     an older bench_step to time beside this one
set -eu
cd "$(dirname "$0")/.."
B=./bench/bench_step
[ -x "$B" ] || { echo "amx-step.sh: build bench/bench_step first (make bench/bench_step)" >&2; exit 2; }
OUT=${OUT:-./amx-step}
BUDGET=${BUDGET:-600}
PU=${PU:-1}
WORKERS=${WORKERS:-2}
if [ -n "${QUICK:-}" ]; then S=${SECONDS_:-0.3}; else S=${SECONDS_:-1}; fi
mkdir -p "$OUT"
SUM=$OUT/summary.txt
: >"$SUM"
start=$(date +%s)
left() { [ $(($(date +%s) - start)) -lt "$BUDGET" ]; }
say() { echo "$*" | tee -a "$SUM"; }
# one bench_step on PU $PU, the thread's CPU time: NAME OPTIONS...
step() {
    name=$1
    shift
    left || { say "skipped (budget): $name"; return 0; }
    say "== $name: $*"
    BENCH_CLOCK=thread taskset -c "$PU" "$@" --seconds "$S" --json "$OUT/$name.jsonl" \
        >"$OUT/$name.log" 2>&1 || say "   failed: see $OUT/$name.log"
    grep -E '^(oneDNN|config)|^(large|small|cnn|gpt)[^:]*$|breakdown' "$OUT/$name.log" >>"$SUM" ||
        true
}

say "== cpu: $(grep -o -w -E 'amx_bf16|amx_int8|amx_tile|avx512_bf16|avx512_fp16' /proc/cpuinfo |
    sort -u | tr '\n' ' ')($(nproc) PUs)"
step default $B --config all --precision both
step act-bf16 $B --config all --precision both --activation-precision bf16
for c in large gpt cnn; do
    left || { say "skipped (budget): profile $c"; continue; }
    case $c in large) p=softmax ;; gpt) p='softmax_v2 2048x256' ;; cnn) p=softmax ;; esac
    ONEDNN_VERBOSE=1 BENCH_CLOCK=thread taskset -c "$PU" $B --config $c --precision bf16 \
        --activation-precision bf16 --seconds "$S" >"$OUT/profile-$c.log" 2>&1 || true
    say "== profile $c (bf16, bf16 activations; per step, -p '$p')"
    sh scripts/primitive-times -s -c -k 12 -p "$p" "$OUT/profile-$c.log" >>"$SUM" 2>&1 || true
done

step blocked $B --config all --precision bf16 --weight-layout blocked
step moments $B --config large --precision both --optimizer-moments all

if left && [ "$WORKERS" -gt 1 ]; then
    say "== throughput, 1 and $WORKERS workers"
    $B --config all --precision both --workers "$WORKERS" --seconds "$S" \
        --json "$OUT/workers.jsonl" >"$OUT/workers.log" 2>&1 || say "   failed: see $OUT/workers.log"
    grep -E '^(config|large|small|cnn|gpt)[^:]*$|wk' "$OUT/workers.log" >>"$SUM" || true
fi
step cnn-blocked $B --config cnn --precision both --tensor-layout blocked
[ -z "${OLD:-}" ] || step old "$OLD" --config all --precision both
say "== done in $(($(date +%s) - start)) s: $OUT"

#!/bin/sh
# Predicted against measured: for each configuration below (all of which a
# 2-core machine runs), `subtrain plan --as-given --calibration CAL` says
# the samples/s it predicts, and the run of the same options says what it
# measured (the best of RUNS runs: a busy neighbour only slows a run, as it
# only slows a calibration's repetition).  Prints a markdown table and the
# share of rows within 15%.
#
#   sh scripts/plan-check.sh [SUBTRAIN]     (default: ./subtrain)
#
#   CAL=FILE   a calibration to use (default: `subtrain calibrate` first)
#   RUNS=N     runs of each configuration (default 2)
#   STEPS=N    steps of each run at least (default 100)
#   MIN_S=S    and as many more as the predicted step time says make S
#              seconds (default 1): a run of a tenth of a second measures
#              the CPUs waking from the idle wait as much as the step
#   WORK=DIR   where the metrics go (default a temporary directory)
#   ONLY=TEXT  only the configurations whose label contains TEXT
#   MPIRUN=M   the MPI launcher (default mpirun, if the program has MPI):
#              the calibration then gets the network keys of 2 ranks
#              (`M -np 2 SUBTRAIN calibrate --network CAL`) and rows of 2
#              ranks of 1 worker run as `M -np 2 SUBTRAIN ...`, planned
#              with --ranks 2
#   IDLE=S     before each run, wait up to S seconds (default 5) for a
#              second in which the CPUs were at least 90% idle; the table
#              gives the 1-minute load average when each row's runs ended
set -eu
bin=${1:-./subtrain}
top=$(cd "$(dirname "$0")/.." && pwd)
RUNS=${RUNS:-2}
IDLE=${IDLE:-5}
STEPS=${STEPS:-100}
MIN_S=${MIN_S:-1}
WORK=${WORK:-$(mktemp -d)}
mkdir -p "$WORK"
MPIRUN=${MPIRUN:-mpirun}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=0
# a build without MPI refuses to plan ranks
if command -v "$MPIRUN" >/dev/null &&
    "$bin" plan --ranks 2 --as-given --memory-per-worker 1G --data synthetic --model mlp \
        --depth 1 --width 16 --batch 1 --workers 1 >/dev/null 2>&1; then
    mpi=1
fi
if [ -z "${CAL:-}" ]; then
    CAL=$WORK/calibration
    "$bin" calibrate -o "$CAL"
    if [ "$mpi" = 1 ]; then
        "$MPIRUN" --oversubscribe -np 2 "$bin" calibrate --network "$CAL" </dev/null
    fi
fi
fashion=${SUBTRAIN_DATA:-/usr/share/datasets/fashion-mnist}

# label|options|ranks (1 if not given)|epochs (synth trains whole epochs:
# those instead of the steps)
configs() {
    r="--data synthetic --model resmlp --depth 4 --width 256 --batch 128"
    echo "resmlp d4 w256, 1 worker, fp32|$r --workers 1"
    echo "resmlp d4 w256, 1 worker, bf16|$r --workers 1 --precision bf16"
    echo "resmlp d4 w256, 1 worker, bf16 moments|$r --workers 1 --optimizer-moments bf16"
    echo "resmlp d4 w256, 2 workers dp, fp32|$r --workers 2"
    echo "resmlp d4 w256, 2 workers dp, bf16|$r --workers 2 --precision bf16"
    echo "resmlp d4 w256, 2 workers sdp C=0.5|$r --workers 2 --strategy sdp --coverage 0.5"
    echo "resmlp d4 w256, 2 workers ist|$r --workers 2 --strategy ist"
    echo "resmlp d4 w256, 2 workers localsgd|$r --workers 2 --strategy localsgd"
    m="--data synthetic --model mlp --depth 3 --width 512 --batch 128"
    echo "mlp d3 w512, 1 worker, fp32|$m --workers 1"
    echo "mlp d3 w512, 2 workers dp, fp32|$m --workers 2"
    echo "mlp d3 w512, 2 workers synth S=2, fp32|$m --workers 2 --strategy synth|1|4"
    l="--data synthetic --model resmlp --depth 4 --width 1024 --batch 256 --workers 1"
    echo "resmlp d4 w1024 b256, 1 worker, fp32|$l"
    echo "resmlp d4 w1024 b256, 1 worker, bf16|$l --precision bf16"
    echo "resmlp d4 w1024 b256, 1 worker x 2 threads, fp32|$l --threads-per-worker 2"
    echo "resmlp d4 w1024 b256, 1 worker x 2 threads, bf16|$l --threads-per-worker 2 --precision bf16"
    echo "resmlp d4 w256, 1 worker x 2 threads, fp32|$r --workers 1 --threads-per-worker 2"
    if [ "$mpi" = 1 ]; then
        echo "resmlp d4 w256, 2 ranks x 1 worker dp, fp32|$r --workers 1|2"
        echo "resmlp d4 w256, 2 ranks x 1 worker dp, bf16|$r --workers 1 --precision bf16|2"
        echo "resmlp d4 w256, 2 ranks x 1 worker sdp C=0.5|$r --workers 1 --strategy sdp --coverage 0.5|2"
    fi
    g="--model gpt --data text:$top/doc/design.md --depth 2 --width 128 --heads 4"
    g="$g --context 64 --batch 16 --val-bytes 4096 --workers 1"
    echo "gpt d2 w128 context 64, 1 worker, fp32|$g"
    if [ -f "$fashion/train-images-idx3-ubyte.gz" ]; then
        n="--model resnet --data $fashion --depth 1 --batch 32 --workers 1"
        echo "resnet d1 b32, 1 worker, fp32|$n"
    fi
}

# waits for a quiet second: other jobs only slow a run down
wait_idle() {
    python3 -c 'import sys, time
def stat():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[3] + v[4], sum(v)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    a = stat(); time.sleep(1); b = stat()
    if (b[0] - a[0]) >= 0.9 * (b[1] - a[1]):
        break' "$IDLE"
}

printf '| configuration | predicted samples/s | measured samples/s (best of %s) |' "$RUNS"
printf ' predicted / measured | load |\n'
printf '| --- | --- | --- | --- | --- |\n'
within=0
rows=0
configs | grep -F -- "${ONLY:-}" | while IFS='|' read -r label opts ranks epochs; do
    ranks=${ranks:-1}
    launch=
    [ "$ranks" -gt 1 ] && launch="$MPIRUN --oversubscribe -np $ranks"
    # shellcheck disable=SC2086
    set -- $("$bin" plan --as-given --ranks "$ranks" --memory-per-worker 64G --calibration "$CAL" \
                 --json - $opts |
             python3 -c 'import json,math,sys
r = json.load(sys.stdin)["rows"][0]
s = r["step_s"] or 0
print(r["samples_per_s"] or 0, max('"$STEPS"', math.ceil('"$MIN_S"' / s) if s > 0 else 0))')
    pred=$1
    length="--steps $2"
    [ -n "${epochs:-}" ] && length="--epochs $epochs"
    best=0
    k=0
    while [ "$k" -lt "$RUNS" ]; do
        k=$((k + 1))
        rm -f "$WORK/m.jsonl"
        wait_idle
        # shellcheck disable=SC2086
        # mpirun would read the configurations' lines: stdin is not its
        $launch "$bin" $opts $length --progress none --quiet --metrics "$WORK/m.jsonl" \
            >/dev/null </dev/null
        got=$(tail -n 1 "$WORK/m.jsonl" |
              python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["samples_per_s"])')
        best=$(python3 -c "print(max($best, $got))")
    done
    ratio=$(python3 -c "print('%.2f' % ($pred / $best))")
    rows=$((rows + 1))
    ok=$(python3 -c "print(1 if abs($pred / $best - 1) <= 0.15 else 0)")
    within=$((within + ok))
    load=$(cut -d' ' -f1 /proc/loadavg)
    printf '| %s | %.0f | %.0f | %s | %s |\n' "$label" "$pred" "$best" "$ratio" "$load"
    echo "$within $rows" > "$WORK/count"
done
read -r within rows < "$WORK/count"
echo
echo "within 15%: $within of $rows configurations (calibration: $CAL)"

#!/bin/sh
# The step's ratios to its same-run reference for two builds, side by side:
# bench_step --config all --precision both of each build, in turns, on one
# PU and the thread's CPU time, ROUNDS times; prints a markdown row per
# configuration and precision with the median ratio (and the rounds' range)
# of each build, and the samples/s.
#
#   sh scripts/step-ratios.sh OLD_BENCH_STEP NEW_BENCH_STEP
#
#   ROUNDS=3        turns of each build
#   SECONDS_=2      bench_step --seconds
#   PU=1            the PU both run on (taskset -c)
#   NEW_EXTRA="--activation-precision bf16"   options of the new build only
#   OLD_EXTRA="..."  options of the old build only
#   CONFIG=all      bench_step --config (a subset: gpt, large, small or cnn)
#   OUT=DIR         the JSON lines (default /tmp/step-ratios)
set -eu
[ $# -eq 2 ] || { echo "usage: step-ratios.sh OLD_BENCH_STEP NEW_BENCH_STEP" >&2; exit 2; }
for b in "$1" "$2"; do
    [ -x "$b" ] || { echo "step-ratios.sh: $b is not an executable bench_step" >&2; exit 2; }
done
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-/tmp/step-ratios}
PU=${PU:-1}
mkdir -p "$OUT"
rm -f "$OUT"/old.*.jsonl "$OUT"/new.*.jsonl
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for which in old new; do
        if [ "$which" = old ]; then bin=$1; extra=${OLD_EXTRA:-}; else bin=$2; extra=${NEW_EXTRA:-}; fi
        # shellcheck disable=SC2086
        BENCH_CLOCK=thread taskset -c "$PU" "$bin" --config "${CONFIG:-all}" --precision both \
            --seconds "${SECONDS_:-2}" --json "$OUT/$which.$r.jsonl" $extra >"$OUT/$which.$r.log"
    done
    r=$((r + 1))
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import glob, json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for which in ("old", "new"):
    for path in sorted(glob.glob("%s/%s.*.jsonl" % (out, which))):
        for line in open(path):
            d = json.loads(line)
            if "scaling" in d:
                continue
            ratio = d.get("ratio_bf16", d["ratio"])
            rows.setdefault((d["config"], d["precision"]), {}).setdefault(which, []).append(
                (ratio, d["samples_per_s"]))
print("| config | precision | old ratio | new ratio | old samples/s | new samples/s |")
print("| --- | --- | --- | --- | --- | --- |")
def cell(v, i, fmt):
    xs = [x[i] for x in v]
    return (fmt + " (" + fmt + "-" + fmt + ")") % (statistics.median(xs), min(xs), max(xs))
for (config, prec), by in rows.items():
    o, n = by.get("old", []), by.get("new", [])
    if not o or not n:
        continue
    print("| %s | %s | %s | %s | %s | %s |" % (config, prec, cell(o, 0, "%.3f"), cell(n, 0, "%.3f"),
                                             cell(o, 1, "%.0f"), cell(n, 1, "%.0f")))
PY

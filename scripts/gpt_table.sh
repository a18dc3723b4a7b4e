#!/bin/sh
# The transformer table of doc/transformer.md: a byte-level gpt (depth 4,
# width 256, 4 heads, context 128: 3.2M parameters) on GCIDE, 2 workers of
# batch 16 (4096 tokens a step), every strategy at the same seed and
# learning rate, one run at a time.  SDP at coverage 0.5 runs at equal
# steps and at twice the steps (about the FLOPs of data parallelism: a
# forward-masked worker computes half of the blocks or heads and neurons).
#
#   sh scripts/gpt_table.sh            STEPS=1200 steps per run
#   STEPS=N OUT=DIR BIN=./subtrain sh scripts/gpt_table.sh
#
# Installs dict-gcide (Debian) when the corpus is missing and apt-get is
# there.  Writes OUT/NAME.jsonl and OUT/NAME.log per run and prints one
# markdown row per run (scripts/gpt_row.sh reads the metrics).
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$top/subtrain}
OUT=${OUT:-/tmp/gpt-table}
STEPS=${STEPS:-1200}
CORPUS=${CORPUS:-/usr/share/dictd/gcide.dict.dz}
if [ ! -r "$CORPUS" ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dict-gcide
fi
mkdir -p "$OUT"
COMMON="--model gpt --data text:$CORPUS --depth 4 --width 256 --heads 4 --context 128
        --batch 16 --workers 2 --lr 0.002 --seed ${SEED:-1} --progress plain"
S2=$((2 * STEPS))
RUNS="dp|$STEPS|--strategy dp
sdp-block-fwd|$STEPS|--strategy sdp --subnet block --masking forward --coverage 0.5
sdp-head-fwd|$STEPS|--strategy sdp --subnet neuron --neuron-group 64 --masking forward --coverage 0.5
sdp-block-fwd-2x|$S2|--strategy sdp --subnet block --masking forward --coverage 0.5
sdp-head-fwd-2x|$S2|--strategy sdp --subnet neuron --neuron-group 64 --masking forward --coverage 0.5
sdp-block-bwd|$STEPS|--strategy sdp --subnet block --masking backward --coverage 0.5
sdp-head-bwd|$STEPS|--strategy sdp --subnet neuron --neuron-group 64 --masking backward --coverage 0.5
ist-blocks|$STEPS|--strategy ist --local-steps 50"
echo "$RUNS" | while IFS='|' read -r name steps opts; do
    [ -n "${ONLY:-}" ] && [ "$ONLY" != "$name" ] && continue
    # shellcheck disable=SC2086
    "$BIN" $COMMON --steps "$steps" $opts --metrics "$OUT/$name.jsonl" >"$OUT/$name.log" 2>&1 ||
        { echo "$name failed: see $OUT/$name.log" >&2; continue; }
    sh "$top/scripts/gpt_row.sh" "$name" "$steps" "$OUT/$name.jsonl"
done

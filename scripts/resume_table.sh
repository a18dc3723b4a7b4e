#!/bin/sh
# The resume-equality table of doc/checkpoints.md: for each strategy, one
# run straight through, the same run writing step checkpoints, and a run
# resumed from one of them; the three final weight files must be equal
# byte for byte (and so the final records).
#
#   sh scripts/resume_table.sh [SUBTRAIN]
#
# Each case: uninterrupted (no checkpoint), checkpointed (--checkpoint-every
# K: checkpointing must change nothing), resumed from the first step
# checkpoint at or after step K (ist: the next round end).  Prints a
# markdown row per case and exits 1 on any difference.
#
#   WORK=DIR   where runs go (default /tmp/subtrain-resume)
#   FULL=1     adds the Fashion-MNIST resnet and the gcide gpt cases
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
BIN=${1:-$top/subtrain}
WORK=${WORK:-/tmp/subtrain-resume}
rm -rf "$WORK"
mkdir -p "$WORK"
bad=0

SYN="--data synthetic --progress none --quiet"
FASHION=/usr/share/datasets/fashion-mnist
GCIDE=/usr/share/dictd/gcide.dict.dz

# final FIELD FILE: a field of the last record of a metrics file
final() {
    tail -n 1 "$2" | tr ',' '\n' | sed -n "s/^\"$1\":\\(.*\\)/\\1/p" | head -n 1
}

# case NAME K OPTIONS...
case_() {
    name=$1 k=$2
    shift 2
    d="$WORK/$(echo "$name" | tr -c 'a-zA-Z0-9\n' '_')"
    mkdir -p "$d"
    "$BIN" "$@" --checkpoint "$d/plain" --metrics "$d/plain.jsonl" >"$d/plain.log" 2>&1 ||
        { echo "resume_table: $name: the plain run failed ($d/plain.log)" >&2; bad=1; return; }
    "$BIN" "$@" --checkpoint "$d/ckpt" --checkpoint-every "$k" --metrics "$d/ckpt.jsonl" \
        >"$d/ckpt.log" 2>&1 ||
        { echo "resume_table: $name: the checkpointing run failed ($d/ckpt.log)" >&2; bad=1; return; }
    # the first step checkpoint (PICK=last: the last one)
    if [ "${PICK:-first}" = last ]; then
        first=$(ls "$d/ckpt" | grep '^step-' | tail -n 1)
    else
        first=$(ls "$d/ckpt" | grep '^step-' | head -n 1)
    fi
    [ -n "$first" ] || { echo "resume_table: $name: no step checkpoint written" >&2; bad=1; return; }
    at=$(echo "$first" | sed 's/step-0*\([0-9]*\)\.safetensors/\1/')
    "$BIN" "$@" --resume "$d/ckpt/$first" --checkpoint "$d/resumed" \
        --metrics "$d/resumed.jsonl" >"$d/resumed.log" 2>&1 ||
        { echo "resume_table: $name: the resumed run failed ($d/resumed.log)" >&2; bad=1; return; }
    same=yes
    # every record of the resumed run against the straight run's of its
    # epoch; a run's first record opens with its "run" provenance object
    for f in plain resumed; do
        sed 's/^{"run":.*},"epoch":/{"epoch":/' "$d/$f.jsonl" >"$d/$f.records"
    done
    while read -r line; do
        e=$(echo "$line" | tr ',' '\n' | sed -n 's/^{"epoch":\(.*\)/\1/p')
        f=$(echo "$line" | tr ',' '\n' | sed -n 's/^"final":\(.*\)/\1/p')
        want=$(grep "^{\"epoch\":$e,[^,]*,\"final\":$f," "$d/plain.records" | head -n 1)
        for field in train_loss test_loss test_acc; do
            a=$(echo "$want" | tr ',' '\n' | grep "^\"$field\":" || true)
            b=$(echo "$line" | tr ',' '\n' | grep "^\"$field\":" || true)
            [ -n "$a" ] && [ "$a" = "$b" ] || same="NO (epoch $e $field: $a / $b)"
        done
    done <"$d/resumed.records"
    cmp -s "$d/plain/final.safetensors" "$d/ckpt/final.safetensors" || same="NO (checkpointing changed it)"
    cmp -s "$d/plain/final.safetensors" "$d/resumed/final.safetensors" || same="NO"
    [ "$same" = yes ] || bad=1
    printf '| %s | %s | %s | %s | %s | %s |\n' "$name" "$at" \
        "$(final step "$d/plain.jsonl")" "$(final test_loss "$d/plain.jsonl")" \
        "$(final test_loss "$d/resumed.jsonl")" "$same"
}

echo "| run | resumed after step | steps | final test_loss, straight | resumed | final weights bitwise equal |"
echo "|---|---|---|---|---|---|"
MLP="--model mlp --depth 3 --width 64 --batch 32 --epochs 2"
RES="--model resmlp --depth 4 --width 64 --batch 32 --epochs 2"
case_ "dp, 1 worker, mlp" 100 $SYN $MLP --workers 1
case_ "dp, 2 workers, resmlp, sgd" 300 $SYN $RES --workers 2 --optimizer sgd --lr 0.05
case_ "sdp blocks, forward masking, fixed masks" 150 $SYN $RES --workers 2 --strategy sdp
case_ "sdp blocks, forward masking, resample 10" 155 $SYN $RES --workers 2 --strategy sdp --resample 10
case_ "sdp blocks, backward masking, resample 7" 100 $SYN $RES --workers 2 --strategy sdp --masking backward --resample 7
case_ "sdp neurons, mlp, resample 5" 301 $SYN $MLP --workers 2 --strategy sdp --subnet neuron --resample 5
case_ "ist resmlp, 4 local steps, stop mid-round" 99 $SYN $RES --workers 2 --strategy ist --local-steps 4
case_ "ist mlp, 5 local steps, optimizer state kept" 260 $SYN $MLP --workers 2 --strategy ist --local-steps 5 --optimizer-state keep
case_ "dp, 2 workers, at an epoch end" 256 $SYN $MLP --workers 2
SYNTH="--strategy synth --model mlp --depth 3 --width 64 --batch 32 --epochs 3 --workers 3 --oversubscribe"
case_ "synth, 2 segments, at segment epoch 2's end" 400 $SYN $SYNTH --recovery-epochs 1
PICK=last case_ "synth, in the recovery epochs" 300 $SYN $SYNTH --recovery-epochs 2
if [ "${FULL:-0}" = 1 ] && [ -d "$FASHION" ]; then
    case_ "dp resnet (batch norm), Fashion-MNIST" 25 --data "$FASHION" --progress none --quiet \
        --model resnet --depth 1 --width 8 --batch 32 --steps 60 --workers 2
    case_ "sdp resnet channels, resample 10" 25 --data "$FASHION" --progress none --quiet \
        --model resnet --depth 1 --width 16 --batch 32 --steps 60 --workers 2 --strategy sdp \
        --subnet neuron --neuron-group 4 --resample 10
    case_ "ist resnet blocks, 4 local steps" 25 --data "$FASHION" --progress none --quiet \
        --model resnet --depth 2 --width 8 --batch 32 --steps 60 --workers 2 --strategy ist \
        --local-steps 4
fi
if [ "${FULL:-0}" = 1 ] && [ -f "$GCIDE" ]; then
    case_ "gpt, gcide text, 2 workers" 30 --data "text:$GCIDE" --progress none --quiet \
        --model gpt --depth 2 --width 64 --heads 2 --context 32 --batch 8 --steps 80 \
        --epoch-windows 400 --val-bytes 20000 --workers 2
fi
exit $bad

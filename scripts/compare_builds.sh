#!/bin/sh
# Side by side: the same runs with two builds of subtrain, and whether their
# metrics agree to the last printed digit.  A refactor must not change what
# a fixed seed computes; this is how that is shown.
#
#   sh scripts/compare_builds.sh OLD NEW
#
# OLD and NEW are each a subtrain binary or a git revision of this
# repository (a revision is checked out into a worktree under $WORK and
# built there once; later calls reuse the build).  Every epoch record's
# train_loss, test_loss and test_acc and the final record's are compared
# (a difference in the final peak memory or bytes moved is reported),
# on the synthetic task and on Fashion-MNIST (skipped if not installed),
# then the runs with data of their own: a ResNet's on Fashion-MNIST, gpt's
# on doc/design.md.  Prints one markdown table row per run and exits 1 on
# any difference.
#
#   QUICK=1   only the synthetic task and the text file
#   WORK=DIR  where builds and metrics go (default /tmp/subtrain-compare)
#   EXTRA="--precision bf16"   options added to every run
#   OLD_EXTRA=..., NEW_EXTRA=...  options added to one build's runs only:
#             the same binary twice compares two settings of an option
#             (NEW_EXTRA="--weight-layout blocked")
set -eu
[ $# -eq 2 ] || { echo "usage: compare_builds.sh OLD NEW (binary or git revision)" >&2; exit 2; }
top=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-/tmp/subtrain-compare}
mkdir -p "$WORK"
rm -f "$WORK/bad"

# binary_of REV-OR-PATH: prints the path of a built subtrain
binary_of() {
    if [ -x "$1" ] && [ -f "$1" ]; then
        (cd "$(dirname "$1")" && echo "$(pwd)/$(basename "$1")")
        return
    fi
    rev=$(git -C "$top" rev-parse --short "$1^{commit}") ||
        { echo "compare_builds: $1 is neither a binary nor a revision" >&2; exit 2; }
    tree="$WORK/tree-$rev"
    if [ ! -x "$tree/subtrain" ]; then
        rm -rf "$tree"
        git -C "$top" worktree prune
        git -C "$top" worktree add --detach "$tree" "$rev" >&2
        (cd "$tree" && autoreconf -fi && ./configure && make -j"$(nproc)") >"$WORK/build-$rev.log" 2>&1 ||
            { echo "compare_builds: building $rev failed, see $WORK/build-$rev.log" >&2; exit 1; }
    fi
    echo "$tree/subtrain"
}

OLD=$(binary_of "$1")
NEW=$(binary_of "$2")

# The runs: every strategy and variant whose numbers must not move.
# name | options (the data option is added per data set)
RUNS='dp-1|--model resmlp --depth 4 --width 64 --workers 1 --batch 64
dp-2|--model resmlp --depth 4 --width 64 --workers 2 --batch 32
dp-2-mlp-sgd|--model mlp --depth 2 --width 128 --workers 2 --batch 32 --optimizer sgd --lr 0.05
dp-2-accumulate-3|--model resmlp --depth 4 --width 64 --workers 2 --batch 16 --accumulate 3
sdp-block-fwd|--model resmlp --depth 4 --width 64 --workers 4 --batch 16 --strategy sdp --subnet block --masking forward
sdp-block-fwd-resample|--model resmlp --depth 4 --width 64 --workers 4 --batch 16 --strategy sdp --subnet block --masking forward --resample 20
sdp-block-bwd|--model resmlp --depth 4 --width 64 --workers 4 --batch 16 --strategy sdp --subnet block --masking backward
sdp-block-bwd-resample|--model resmlp --depth 4 --width 64 --workers 4 --batch 16 --strategy sdp --subnet block --masking backward --resample 20
sdp-neuron-fwd|--model resmlp --depth 2 --width 64 --workers 4 --batch 16 --strategy sdp --subnet neuron --masking forward
sdp-neuron-fwd-resample|--model resmlp --depth 2 --width 64 --workers 4 --batch 16 --strategy sdp --subnet neuron --masking forward --resample 20
sdp-neuron-bwd|--model resmlp --depth 2 --width 64 --workers 4 --batch 16 --strategy sdp --subnet neuron --masking backward
sdp-neuron-bwd-resample|--model resmlp --depth 2 --width 64 --workers 4 --batch 16 --strategy sdp --subnet neuron --masking backward --resample 20
sdp-neuron-fwd-mlp|--model mlp --depth 3 --width 128 --workers 4 --batch 16 --strategy sdp --subnet neuron --masking forward --resample 20
sdp-neuron-bwd-mlp|--model mlp --depth 3 --width 128 --workers 4 --batch 16 --strategy sdp --subnet neuron --masking backward
sdp-align|--model resmlp --depth 4 --width 64 --workers 4 --batch 16 --strategy sdp --report align=10
ist-resmlp-reset|--model resmlp --depth 4 --width 64 --workers 2 --batch 32 --strategy ist --local-steps 10
ist-resmlp-keep|--model resmlp --depth 4 --width 64 --workers 2 --batch 32 --strategy ist --local-steps 10 --optimizer-state keep
ist-mlp-reset|--model mlp --depth 2 --width 128 --workers 2 --batch 32 --strategy ist --local-steps 10
ist-mlp-keep|--model mlp --depth 2 --width 128 --workers 2 --batch 32 --strategy ist --local-steps 10 --optimizer-state keep
ist-mlp-keep-sgd|--model mlp --depth 2 --width 128 --workers 2 --batch 32 --strategy ist --local-steps 10 --optimizer-state keep --optimizer sgd --lr 0.05
synth-s2|--model mlp --depth 5 --width 64 --workers 2 --batch 32 --strategy synth --segments 2 --recovery-epochs 1
synth-s3|--model mlp --depth 5 --width 64 --workers 3 --batch 32 --strategy synth --segments 3 --recovery-epochs 1
synth-s2-groups-of-2|--model mlp --depth 5 --width 64 --workers 4 --batch 32 --strategy synth --segments 2 --recovery-epochs 1'

# Runs whose model needs data of its own: name | data | options, the
# run's length included (fashion: Fashion-MNIST, as the runs above; text:
# a file of this tree, with QUICK=1 too)
OWN_RUNS='resnet-dp-2|fashion|--model resnet --depth 1 --width 8 --workers 2 --batch 32 --steps 40
resnet-sdp-neuron|fashion|--model resnet --depth 1 --width 8 --workers 2 --batch 32 --steps 40 --strategy sdp --subnet neuron --neuron-group 4
resnet-sdp-neuron-bwd|fashion|--model resnet --depth 1 --width 8 --workers 2 --batch 32 --steps 40 --strategy sdp --subnet neuron --neuron-group 4 --masking backward
gpt-dp-2|text|--model gpt --depth 1 --width 32 --heads 2 --context 32 --workers 2 --batch 16 --epochs 2 --epoch-windows 640
gpt-sdp-block|text|--model gpt --depth 2 --width 32 --heads 2 --context 32 --workers 2 --batch 16 --epochs 2 --epoch-windows 640 --strategy sdp'
TEXT="text:$top/doc/design.md"

FASHION=${SUBTRAIN_DATA:-/usr/share/datasets/fashion-mnist}
DATASETS="synthetic"
if [ "${QUICK:-0}" != 1 ] && [ -d "$FASHION" ]; then
    DATASETS="synthetic $FASHION"
fi

# the records' compared fields, one line per record
fields() {
    sed -E 's/.*"epoch":([0-9]+),"step":([0-9]+),"final":([a-z]+),"train_loss":([-0-9.e+na]+),"test_loss":([-0-9.e+na]+),"test_acc":([-0-9.e+na]+).*/\1 \2 \3 \4 \5 \6/' "$1"
}
# and what the final record says of resources: peak bytes per worker,
# bytes moved per worker and step (reported when they differ, not failed:
# a refactor may save memory)
resources() {
    grep '"final":true' "$1" | sed -E 's/.*"peak_bytes_per_worker":([0-9]+),"comm_bytes_per_worker_step":([0-9]+).*/\1 \2/'
}

# compare SHORT NAME DATA OPTIONS...: runs both builds, prints the row
compare() {
    short=$1 name=$2 data=$3
    shift 3
    for which in old new; do
        bin=$([ $which = old ] && echo "$OLD" || echo "$NEW")
        own=$([ $which = old ] && echo "${OLD_EXTRA:-}" || echo "${NEW_EXTRA:-}")
        out="$WORK/$short-$name-$which.jsonl"
        rm -f "$out"
        # synth's segment epochs come from --epochs as well
        # shellcheck disable=SC2086
        if ! "$bin" "$@" ${EXTRA:-} $own --data "$data" --seed 7 --oversubscribe --quiet \
             --metrics "$out" >"$WORK/$short-$name-$which.log" 2>&1; then
            echo "| $short | $name | $which build failed: $(tail -n 1 "$WORK/$short-$name-$which.log") |"
            echo fail >>"$WORK/bad"
            return
        fi
    done
    fields "$WORK/$short-$name-old.jsonl" >"$WORK/a"
    fields "$WORK/$short-$name-new.jsonl" >"$WORK/b"
    set -- $(grep ' true ' "$WORK/a")
    o_te=$5 o_tr=$4 o_acc=$6
    set -- $(grep ' true ' "$WORK/b")
    n_te=$5 n_tr=$4 n_acc=$6
    recs=$(wc -l <"$WORK/a")
    if cmp -s "$WORK/a" "$WORK/b"; then verdict="$recs equal"; else
        verdict="**DIFFER**"
        echo fail >>"$WORK/bad"
    fi
    set -- $(resources "$WORK/$short-$name-old.jsonl") $(resources "$WORK/$short-$name-new.jsonl")
    [ "$1" = "$3" ] || verdict="$verdict; peak memory per worker $1 -> $3 B"
    [ "$2" = "$4" ] || verdict="$verdict; bytes per worker and step $2 -> $4"
    echo "| $short | $name | $o_te | $n_te | $o_tr | $n_tr | $o_acc | $n_acc | $verdict |"
}

echo "| data | run | final test_loss old | new | train_loss old | new | test_acc old | new | records |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for data in $DATASETS; do
    short=$([ "$data" = synthetic ] && echo synthetic || echo fashion)
    # epochs: a short run on each data set (every run crosses epoch ends)
    if [ "$short" = synthetic ]; then len="--epochs 2"; else len="--epochs 1"; fi
    echo "$RUNS" | while IFS='|' read -r name opts; do
        # shellcheck disable=SC2086  # the options are words
        compare "$short" "$name" "$data" $opts $len
    done
done
echo "$OWN_RUNS" | while IFS='|' read -r name kind opts; do
    case $kind in
    fashion) echo " $DATASETS " | grep -q " $FASHION " || continue; data=$FASHION ;;
    text) data=$TEXT ;;
    esac
    # shellcheck disable=SC2086
    compare "$kind" "$name" "$data" $opts
done
if [ -s "$WORK/bad" ]; then
    rm -f "$WORK/bad"
    echo "compare_builds: the builds differ" >&2
    exit 1
fi
echo "compare_builds: every record equal"

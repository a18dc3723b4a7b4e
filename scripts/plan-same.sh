#!/bin/sh
# Whether two builds' `subtrain plan` say the same: for each configuration
# below, both builds' --json output (every row's memory per kind, bytes a
# step, FLOPs, whether it fits), compared as text.  Prints one line per
# configuration and "plan-same: every plan equal", or the first lines that
# differ and exits 1.
#
#   sh scripts/plan-same.sh OLD NEW     (two subtrain programs)
#
#   QUICK=1    the small topologies only (no 128-worker plans)
#   WORK=DIR   where the JSON files go (default a temporary directory)
set -eu
old=$1
new=$2
WORK=${WORK:-$(mktemp -d)}
mkdir -p "$WORK"

# label|topology|options: strategies, models, precisions (every row's),
# topologies with 2 and 4 NUMA domains, even and uneven (5 workers over 2)
configs() {
    mlp="--data synthetic --model mlp --depth 3 --width 64 --batch 16"
    res="--data synthetic --model resmlp --depth 4 --width 128 --batch 16"
    cnn="--data synthetic --model resnet --batch 8"
    gpt="--model gpt --data text:doc/design.md --depth 2 --width 64 --heads 2 --context 32 \
--batch 4 --epoch-windows 2048"
    t2="synthetic:numa:2 core:4 pu:1"
    t4="synthetic:pack:2 numa:2 core:2 pu:1"
    echo "mlp-2dom|$t2|$mlp"
    echo "mlp-uneven|$t2|$mlp --workers 5"
    echo "resmlp-2dom|$t2|$res"
    echo "resmlp-4dom|$t4|$res"
    echo "resmlp-uneven|$t2|$res --workers 5"
    echo "resmlp-4dom-6w|$t4|$res --workers 6"
    echo "resmlp-neuron|$t4|$res --subnet neuron --strategies sdp"
    echo "resmlp-neuron-uneven|$t2|$res --workers 5 --subnet neuron --strategies sdp"
    echo "resmlp-backward|$t2|$res --masking backward --strategies sdp"
    echo "resmlp-split|$t2|$res --split classes:2 --strategies dp,localsgd"
    echo "resnet-2dom|$t2|$cnn --strategies dp,sdp,ist"
    echo "resnet-uneven|$t2|$cnn --workers 3 --strategies dp,sdp"
    echo "gpt-4dom|$t4|$gpt"
    echo "gpt-uneven|$t2|$gpt --workers 5"
    [ -n "${QUICK:-}" ] && return
    t128="synthetic:pack:2 numa:4 core:16 pu:2"
    echo "resmlp-128|$t128|--data synthetic --model resmlp --depth 8 --width 1024 --batch 128"
    echo "gpt-128|$t128|$gpt"
    echo "resnet-128|$t128|$cnn --strategies dp,sdp"
}

configs | while IFS='|' read -r label topo opts; do
    for side in old new; do
        bin=$old
        [ $side = new ] && bin=$new
        # shellcheck disable=SC2086
        "$bin" plan --topology "$topo" --memory-per-worker 1G $opts \
            --json "$WORK/$label.$side.json" > /dev/null
    done
    if ! cmp -s "$WORK/$label.old.json" "$WORK/$label.new.json"; then
        echo "$label: DIFFERENT"
        diff "$WORK/$label.old.json" "$WORK/$label.new.json" | head -20
        exit 1
    fi
    echo "$label: equal ($(grep -c '"strategy"' "$WORK/$label.new.json") rows)"
done
echo "plan-same: every plan equal"

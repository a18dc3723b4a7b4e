#!/bin/sh
# doc/data/plan-accuracy.csv from the documentation's measured tables
# (doc/data/sdp.csv, sdp-variants.csv, resist.csv, ist-mlp.csv,
# synth.csv, sdp-vit.csv, sdp-resnet.csv, sdp-gpt.csv): for every configuration of a
# subnetwork strategy, its mean test accuracy over its seeds minus that of
# the same table's data-parallel rows (the first configuration whose name
# says "data parallel"), in points.  `subtrain plan` names these beside the
# rows of the same strategy; it never predicts accuracy.
#
#   sh scripts/plan-accuracy.sh > doc/data/plan-accuracy.csv
#
# Columns: strategy (as the plan keys its rows: "sdp block C=0.5", "ist",
# "synth", "localsgd"), model, delta_points, seeds, config (the table's
# name for it, commas made semicolons), doc (where the table is).
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
echo "strategy,model,delta_points,seeds,config,doc"
for t in sdp:sdp sdp-variants:sdp resist:ist ist-mlp:ist synth:synth sdp-vit:vit sdp-resnet:cnn sdp-gpt:transformer; do
    csv=${t%%:*}
    doc=${t#*:}
    awk -v doc="doc/$doc.md" -f "$top/scripts/lib/csv.awk" \
        -f "$top/scripts/lib/plan_accuracy.awk" "$top/doc/data/$csv.csv"
done

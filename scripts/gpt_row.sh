#!/bin/sh
# One markdown row of the transformer table from a run's metrics (its final
# record): name, steps, validation bits per byte, next-byte accuracy, peak
# MiB per worker by kind (activations + attention, weights + gradients +
# optimizer), comm MB per worker-step, tokens/s and wall time.
#   sh scripts/gpt_row.sh NAME STEPS METRICS.jsonl
set -eu
tail -n 1 "$3" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read()); k = r["peak_bytes_by_kind"]; M = 1048576
print("| %s | %s | %.4f | %.4f | %.1f | %.1f | %.1f | %.1f | %.2f | %.0f | %.0f |" % (
    sys.argv[1], sys.argv[2], r["text"]["test_bpb"], r["test_acc"], r["peak_bytes"] / M,
    (k["weights"] + k["gradients"] + k["optimizer"]) / M, k["activations"] / M,
    k["attention"] / M, r["comm_bytes_per_worker_step"] / 1e6, r["text"]["tokens_per_s"],
    r["wall_s"]))' "$1" "$2"

#!/bin/sh
# tests/torch_interop.sh — make check's test of subtrain against PyTorch
# (doc/interop.md): for each model family, a tiny model trained a few
# steps, exported with `subtrain export --format torch`, loaded with
# python/subtrain_torch.py, and on one batch:
#
#   torch/FAMILY   subtrain's logits (inference and training mode) and loss
#                  against PyTorch's fp32 (max |a - b| / max |b|), its
#                  weight gradients against PyTorch's float64 (||a - b|| /
#                  ||b||, the whole gradient) and the running statistics its
#                  training forward updated (max-norm): each within 1e-5
#                  relative (tests/torch_interop.py); one SGD step in PyTorch,
#                  saved, read back by subtrain (--init): the same logits,
#                  and `subtrain eval` and a training run start from it;
#                  subtrain -> torch -> torch and -> subtrain are bitwise
#                  (every tensor); subtrain_torch.load refuses a subtrain-layout
#                  file.
#
# Needs python3 with torch (Debian: python3-torch): without it the test is
# skipped (exit 77), unless SUBTRAIN_REQUIRE_TORCH=1 (CI), where it fails.
# PYTHON names the interpreter; else the first of python3 and
# /usr/bin/python3 (Debian's torch is the system interpreter's) that
# imports torch.  SUBTRAIN_BIN (default ./subtrain) and TORCH_PROBE
# (default tests/torch_probe, next to it) are what is tested;
# TORCH_INTEROP_WORK=DIR keeps the files made in DIR;
# TORCH_INTEROP_FAMILIES (a list) and TORCH_INTEROP_SEED (the batches')
# choose what is checked.  Prints a
# Criterion-style synthesis line for scripts/summary.sh.
set -u
. "$(dirname "$0")/case.sh"
srcdir=${srcdir:-.}
BIN=${SUBTRAIN_BIN:-./subtrain}
PROBE=${TORCH_PROBE:-$(dirname "$BIN")/tests/torch_probe}
HERE=$srcdir/tests
export PYTHONPATH="$srcdir/python${PYTHONPATH:+:$PYTHONPATH}"

PY=
for p in ${PYTHON:-python3 /usr/bin/python3}; do
    if "$p" -c 'import torch' >/dev/null 2>&1; then PY=$p; break; fi
done
no_torch() {
    echo "torch_interop: no python3 that imports torch (tried" \
        "${PYTHON:-python3 /usr/bin/python3}; Debian: apt-get install python3-torch)"
    [ "${SUBTRAIN_REQUIRE_TORCH:-0}" = 1 ] || return 77
    echo "torch_interop: SUBTRAIN_REQUIRE_TORCH=1: failing"
    return 1
}
if [ -z "$PY" ]; then   # one case, skipped or failed, for scripts/summary.sh
    run "torch/python" no_torch
    finish || exit 1
    exit 77
fi
[ -x "$PROBE" ] || { echo "torch_interop: no $PROBE (make check builds it)"; exit 1; }
echo "torch_interop: $PY, torch $("$PY" -c 'import torch; print(torch.__version__)')"

# TORCH_INTEROP_WORK=DIR: the files are made there and kept (to look at)
if [ -n "${TORCH_INTEROP_WORK:-}" ]; then
    W=$TORCH_INTEROP_WORK
    mkdir -p "$W" && rm -rf "${W:?}"/* || exit 1
else
    W=$(mktemp -d)
    trap 'rm -rf "$W"' EXIT
fi
# tiny data: 8 x 8 images (features for mlp and resmlp), a text of some
# kilobytes
mkdir "$W/img" && "$PY" "$HERE/torch_interop.py" idx "$W/img" ${TORCH_INTEROP_SIDE:-8} || exit 1
awk 'BEGIN { for (i = 0; i < 400; i++) printf "line %d: the quick brown fox %d\n", i, i * 7 }' \
    >"$W/text.txt"
IMG="--data idx:$W/img:tr-img,tr-lab,te-img,te-lab"
# (resmlp-ist: trained by ist, evaluated with its branch scale 1/2)
# (vit-cls: a class token, 2 x 2 patches)
FAMILIES=${TORCH_INTEROP_FAMILIES:-mlp resmlp resmlp-ist gpt resnet resnet18 convnet vit vit-cls}
opts() {   # the data and model options of a family
    case $1 in
    mlp) echo "$IMG --model mlp --depth 2 --width 16 --activation relu" ;;
    resmlp) echo "$IMG --model resmlp --depth 2 --width 16 --hidden 24" ;;
    resmlp-ist) echo "$IMG --model resmlp --depth 2 --width 16 --strategy ist --workers 2" \
        "--oversubscribe --local-steps 1" ;;
    gpt) echo "--data text:$W/text.txt --model gpt --depth 2 --width 16 --heads 2 --context 8" \
        "--val-bytes 512" ;;
    resnet) echo "$IMG --model resnet --depth 1 --width 4" ;;
    resnet18) echo "$IMG --model resnet18 --width 4 --activation gelu" ;;
    convnet) echo "$IMG --model convnet --depth 2 --width 4" ;;
    vit) echo "$IMG --model vit --depth 2 --width 16 --heads 2 --hidden 24 --patch 4" ;;
    vit-cls) echo "$IMG --model vit --depth 1 --width 16 --heads 2 --patch 2 --pool cls" ;;
    esac
}
say() {   # say WHAT COMMAND...: runs it, its output kept; on failure shown
    what=$1
    shift
    "$@" >"$W/out" 2>&1 && return 0
    echo "$what failed (exit $?): $*"
    cat "$W/out"
    return 1
}

# subtrain: train, export (the calibration: 2 batches of 16)
setup() {
    for f in $FAMILIES; do
        # shellcheck disable=SC2046
        say "$f: training" "$BIN" $(opts "$f") --steps 3 --batch 16 --progress none -q \
            --checkpoint "$W/$f.ck" || return 1
        cp "$W/$f.ck/final.safetensors" "$W/$f.source.safetensors"
        # shellcheck disable=SC2046
        say "$f: export" "$BIN" export $(opts "$f") --batch 16 --bn-calibration 2 -q \
            --init "$W/$f.source.safetensors" -o "$W/$f.torch.safetensors" || return 1
    done
    say "PyTorch" "$PY" "$HERE/torch_interop.py" prepare "$W" $FAMILIES || return 1
    for f in $FAMILIES; do
        say "$f: probe" "$PROBE" "$W/$f.torch.safetensors" "$W/$f.batch.safetensors" \
            "$W/$f.probe" || return 1
        say "$f: probe of the PyTorch step" "$PROBE" "$W/$f.tuned.safetensors" \
            "$W/$f.batch.safetensors" "$W/$f.tuned_probe" || return 1
        # shellcheck disable=SC2046
        say "$f: export back" "$BIN" export --format subtrain $(opts "$f") -q \
            --init "$W/$f.resaved.safetensors" -o "$W/$f.back.safetensors" || return 1
    done
    "$PY" "$HERE/torch_interop.py" compare "$W" $FAMILIES >"$W/compare" 2>&1
    echo $? >"$W/compare.rc"
    grep -v "^FAIL" "$W/compare"
}

family() {   # the numbers of one family, then subtrain on PyTorch's step
    f=$1
    grep -q "^$f " "$W/compare" || { echo "no comparison for $f"; return 1; }
    ok=0
    grep "^FAIL $f:" "$W/compare" && ok=1
    # shellcheck disable=SC2046
    say "$f: eval of the PyTorch step" "$BIN" eval $(opts "$f") --batch 16 \
        --init "$W/$f.tuned.safetensors" || return 1
    grep -q "^eval $W/$f.tuned.safetensors: test_acc [0-9.]*  test_loss [0-9.]*" "$W/out" ||
        { cat "$W/out"; return 1; }
    cat "$W/out"
    # shellcheck disable=SC2046
    say "$f: training from the PyTorch step" "$BIN" $(opts "$f") --batch 16 --steps 1 \
        --progress none -q --init "$W/$f.tuned.safetensors" || return 1
    return $ok
}

if setup; then
    for f in $FAMILIES; do
        run "torch/$f" family "$f"
    done
    [ "$(cat "$W/compare.rc")" = 0 ] || [ "$failed" -gt 0 ] ||
        { echo "torch_interop.py compare failed: see above"; failed=$((failed + 1)); }
else
    run "torch/setup" false
fi
finish

#!/bin/sh
# The README's second command (and CI's): install, build, run `make check`
# (PyTorch installed and required: tests/torch_interop.sh must not skip),
# print one summary line over every Criterion suite, then install into a
# staging directory and run `make installcheck` there
# (scripts/test-install.sh).
set -eu
cd "$(dirname "$0")/.."
sh scripts/install-deps.sh
# tests/torch_interop.sh compares subtrain with PyTorch: here it must run
sh scripts/install-deps.sh python3-torch
sh scripts/build.sh

status=0
SUBTRAIN_REQUIRE_TORCH=1 make -j"$(nproc)" check || status=$?

sh scripts/summary.sh "$status"
sh scripts/test-install.sh

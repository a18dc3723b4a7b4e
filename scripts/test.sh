#!/bin/sh
# The README's second command (and CI's): install, build, run `make check`,
# print one summary line over every Criterion suite, then install into a
# staging directory and run `make installcheck` there
# (scripts/test-install.sh).
set -eu
cd "$(dirname "$0")/.."
sh scripts/install-deps.sh
sh scripts/build.sh

status=0
make -j"$(nproc)" check || status=$?

sh scripts/summary.sh "$status"
sh scripts/test-install.sh

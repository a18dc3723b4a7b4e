#!/bin/sh
# The README's second command (and CI's): install, build, run `make check`,
# and print one summary line over every Criterion suite.
set -eu
cd "$(dirname "$0")/.."
sh scripts/install-deps.sh
sh scripts/build.sh

status=0
make -j"$(nproc)" check || status=$?

sh scripts/summary.sh "$status"

#!/bin/sh
# CI's fuzz smoke, after scripts/test.sh and scripts/test-sanitizers.sh:
# `make fuzz` runs every libFuzzer harness of fuzz/ (doc/reliability.md)
# for FUZZ_RUNS inputs or FUZZ_SECONDS seconds, whichever ends first
# (20000 and 10 by default: about two minutes on 2 cores, the build
# included).  A crash, leak, sanitizer report or timeout fails it, with
# the input in fuzz/artifacts/.  The long runs are `make fuzz` by hand.
#
# Installs the build's packages and clang with libFuzzer's runtime when
# they are missing (Debian 12: clang-14 libclang-rt-14-dev; clang only
# recommends the runtime, so --no-install-recommends leaves it out), and
# re-runs ./configure when the tree was configured without them.
set -eu
cd "$(dirname "$0")/.."
sh scripts/install-deps.sh
sh scripts/install-deps.sh clang-14 libclang-rt-14-dev
[ -x configure ] || autoreconf -fi
if [ ! -f Makefile ] || grep -q '^HAVE_FUZZ_TRUE = #' Makefile; then
    ./configure >/dev/null
fi
make -j"$(nproc)" fuzz FUZZ_RUNS="${FUZZ_RUNS:-20000}" \
    FUZZ_ARGS="-max_total_time=${FUZZ_SECONDS:-10}"
echo "fuzz: every harness ran, no finding"

#!/bin/sh
# The test suite once more, built with AddressSanitizer and
# UndefinedBehaviorSanitizer (./configure --enable-sanitizers), in a copy of
# the tree so that the plain build stays as it is.  CI runs it after
# scripts/test.sh.  The tests that count heap calls skip themselves there
# (tests/heapwatch.h); every other assertion runs sanitized.
set -eu
cd "$(dirname "$0")/.."
dir=${SANITIZER_DIR:-/tmp/subtrain-sanitizers}
rm -rf "$dir"
mkdir -p "$dir"
cp -a . "$dir"
cd "$dir"
[ -f Makefile ] && make distclean >/dev/null
autoreconf -fi >/dev/null
# Without MPI: the MPI backend and its tests (tests/mpi.sh) run in the
# plain build only; the MPI library's own allocations and shared memory are
# not ours to audit.
./configure --enable-sanitizers --without-mpi >/dev/null
make -j"$(nproc)" >/dev/null
status=0
make -j"$(nproc)" check || status=$?
echo "sanitizers (AddressSanitizer, UndefinedBehaviorSanitizer):"
sh scripts/summary.sh "$status"

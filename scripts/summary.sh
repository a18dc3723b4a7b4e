#!/bin/sh
# One summary line over every Criterion suite of the build in the current
# directory, after `make check`: "tests: P passed, F failed, S skipped",
# the logs of failing suites printed and every skipped test named (a
# machine without Fashion-MNIST, or without bf16 kernels, skips tests: CI
# shows it instead of a pass count that is merely smaller).  $1: make
# check's exit status, which it exits with.
set -eu
status=${1:-0}

# Criterion writes "Synthesis: Tested: N | Passing: P | Failing: F |
# Crashing: C" at the end of each suite's log; Tested leaves skipped tests
# out and Failing counts crashes already (Crashing is the part of it that
# crashed).  Skipped tests are lines "[SKIP] suite::name: why", which
# Criterion writes at verbosity 1 (make check sets
# CRITERION_VERBOSITY_LEVEL=1).
passed=0 failed=0 skipped=0 skips=
for log in tests/*.log; do
    [ -f "$log" ] || continue
    line=$(grep 'Synthesis: Tested:' "$log" | tail -n 1) || true
    s=$(grep -c '^\[SKIP\]' "$log") || true
    skipped=$((skipped + s))
    if [ "$s" -gt 0 ]; then
        skips="$skips$(grep '^\[SKIP\]' "$log")
"
    fi
    if [ -z "$line" ]; then
        # A suite that died before its synthesis counts as one failure.
        failed=$((failed + 1))
        continue
    fi
    p=$(echo "$line" | sed -n 's/.*Passing: \([0-9]*\).*/\1/p')
    f=$(echo "$line" | sed -n 's/.*Failing: \([0-9]*\).*/\1/p')
    passed=$((passed + p))
    failed=$((failed + f))
    if [ "$f" != 0 ]; then
        echo "---- $log"
        cat "$log"
    fi
done
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
    failed=1
    cat tests/*.log examples/*.log 2>/dev/null || true
fi
if [ -n "$skips" ]; then
    printf '%s' "$skips"
fi
echo "tests: $passed passed, $failed failed, $skipped skipped"
exit "$status"

#!/bin/sh
# One summary line over every Criterion suite of the build in the current
# directory, after `make check`: "tests: P passed, F failed", the logs of
# failing suites printed.  $1: make check's exit status, which it exits with.
set -eu
status=${1:-0}

# Criterion writes "Synthesis: Tested: N | Passing: P | Failing: F |
# Crashing: C" at the end of each suite's log; add them up.
passed=0 failed=0
for log in tests/*.log; do
    [ -f "$log" ] || continue
    line=$(grep 'Synthesis: Tested:' "$log" | tail -n 1) || true
    if [ -z "$line" ]; then
        # A suite that died before its synthesis counts as one failure.
        failed=$((failed + 1))
        continue
    fi
    p=$(echo "$line" | sed -n 's/.*Passing: \([0-9]*\).*/\1/p')
    f=$(echo "$line" | sed -n 's/.*Failing: \([0-9]*\).*/\1/p')
    c=$(echo "$line" | sed -n 's/.*Crashing: \([0-9]*\).*/\1/p')
    passed=$((passed + p))
    failed=$((failed + f + c))
    if [ "$f" != 0 ] || [ "$c" != 0 ]; then
        echo "---- $log"
        cat "$log"
    fi
done
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
    failed=1
    cat tests/*.log examples/*.log 2>/dev/null || true
fi
echo "tests: $passed passed, $failed failed"
exit "$status"

# tests/case.sh — sourced by the shell tests (mpi.sh, manpage.sh,
# completion.sh, scripts.sh): one case at a time, and the closing line in
# Criterion's form, which scripts/summary.sh reads with the C suites'.
#
#   . "$(dirname "$0")/case.sh"
#   run NAME COMMAND [ARG]...   a case: passes on exit 0, is skipped on 77
#   finish                      the synthesis line; fails if a case failed
passed=0 failed=0 skipped=0

run() {
    case_name=$1
    shift
    echo "---- $case_name: $*"
    "$@"
    case_rc=$?
    if [ "$case_rc" -eq 0 ]; then
        passed=$((passed + 1)); echo "[PASS] $case_name"
    elif [ "$case_rc" -eq 77 ]; then
        skipped=$((skipped + 1)); echo "[SKIP] $case_name"
    else
        failed=$((failed + 1)); echo "[FAIL] $case_name (exit $case_rc)"
    fi
}

finish() {
    echo "[====] Synthesis: Tested: $((passed + failed)) | Passing: $passed | Failing: $failed | Crashing: 0 | Skipped: $skipped"
    [ "$failed" -eq 0 ]
}

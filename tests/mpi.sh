#!/bin/sh
# tests/mpi.sh — make check's MPI tests (with MPI and mpirun): every case
# runs under mpirun with a time limit, so a hang is a failure, not a stuck
# build.  Prints a Criterion-style synthesis line for scripts/summary.sh.
#
#   test_mpi            the MPI backend against the shared engine
#                       (2 ranks x 1 and x 2 workers, 3 ranks x 1)
set -u
MPIRUN=${MPIRUN:-mpirun}
# root is allowed (CI runs as root); more ranks than cores are allowed
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# a container may forbid the cross-memory-attach single copy; shared
# memory without it still works
export OMPI_MCA_btl_vader_single_copy_mechanism=none
passed=0 failed=0

run() {   # run NAME COMMAND...: one case, 300 s at most
    name=$1; shift
    echo "---- $name: $*"
    if timeout 300 "$@"; then
        passed=$((passed + 1)); echo "[PASS] $name"
    else
        failed=$((failed + 1)); echo "[FAIL] $name (exit $?)"
    fi
}

run "mpi/backend_2x1" "$MPIRUN" -np 2 tests/test_mpi 1
run "mpi/backend_2x2" "$MPIRUN" -np 2 tests/test_mpi 2
run "mpi/backend_3x1" "$MPIRUN" -np 3 tests/test_mpi 1

echo "[====] Synthesis: Tested: $((passed + failed)) | Passing: $passed | Failing: $failed | Crashing: 0"
[ "$failed" -eq 0 ]

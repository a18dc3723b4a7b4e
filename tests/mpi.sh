#!/bin/sh
# tests/mpi.sh — make check's MPI tests (with MPI and mpirun): every case
# runs under mpirun with a time limit, so a hang is a failure, not a stuck
# build.  Prints a Criterion-style synthesis line for scripts/summary.sh.
#
#   test_mpi            the MPI backend against the shared engine
#                       (2 ranks x 1 and x 2 workers, 3 ranks x 1, ranks
#                       of 1, 3 and 2 workers; an engine over some ranks);
#                       bf16 payloads against the per-rank rounded sum
#                       (bitwise, every layout); a bf16 master's copies
#                       gathered as bf16 against the shared engine's
#   train_*, weights_*  subtrain over 2 ranks against one process: dp,
#                       sdp (blocks, neurons with backward masking), ist,
#                       localsgd, dp, sdp (backward masking) and localsgd
#                       with a bf16 master; records and final
#                       weights (bitwise); a bf16 master's memory (no fp32
#                       under the matrices) and bytes a parameter
#   *_split_*           a non-iid --split over 2 ranks against one process
#                       (records, class histogram, weights: bitwise)
#   resume_*            a step checkpoint of 2 ranks resumed by 2 ranks and
#                       by one process (a bf16 optimizer state with
#                       micro-batches too, a bf16 master); another option
#                       refused over ranks
#   synth_*             synth over ranks against one process: a group
#                       spanning ranks, recovery epochs, resume across
#                       layouts
#   failing_rank, sigterm_*: failure and signals (one rank stopped; every
#                       rank stopped while rank 0 writes the final weights)
#   impossible_layout   a layout the ranks' workers cannot have: exit 2
#                       before the data loads
#   bf16_copies_*, blocked_*  bf16 over 2 ranks: the replicas' weight
#                       copies written (plain) or packed (--weight-layout
#                       blocked) by the all-gather where it copies, by
#                       the layers where a rank receives in place; bitwise
#                       the layers' own, and counted in the bytes
#   *_comm_bf16_*       --comm-precision bf16 over ranks: 2 x 1 equals one
#                       process of 2 (dp, sdp), 2 x 2 close to 1 x 4 (no
#                       process rounds per rank: test_mpi checks that)
#   calibrate_network   `mpirun -np 2 subtrain calibrate --network FILE` adds
#                       the network rates, and a plan of ranks under them
#                       has a time
#   plan_ranks_*        `subtrain plan --ranks 2` against the records of the
#                       2 ranks' run: rank 0's memory by kind and bytes a
#                       worker-step, to the byte
#   wire_bytes_*        the bytes the ranks hand to MPI in a step (counted
#                       through PMPI) against the plan's bytes between ranks:
#                       fp32, bf16 gradients, a bf16 master
set -u
. "$(dirname "$0")/case.sh"
MPIRUN=${MPIRUN:-mpirun}
# root is allowed (CI runs as root); more ranks than cores are allowed
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# a container may forbid the cross-memory-attach single copy; shared
# memory without it still works
export OMPI_MCA_btl_vader_single_copy_mechanism=none
# ranks waiting in MPI yield the CPU: the tests run more threads than cores
export OMPI_MCA_mpi_yield_when_idle=1
mpi() {   # mpirun, 300 s at most: a hang fails the case
    timeout 300 "$MPIRUN" "$@"
}

run "mpi/backend_2x1" mpi -np 2 tests/test_mpi 1
run "mpi/backend_2x2" mpi -np 2 tests/test_mpi 2
run "mpi/backend_3x1" mpi -np 3 tests/test_mpi 1
run "mpi/backend_ranks_of_1_3_2_workers" mpi -np 3 tests/test_mpi 1,3,2

# ---- training over ranks against training in one process
BIN=${SUBTRAIN_BIN:-./subtrain}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
COMMON="--data synthetic --steps 40 --quiet"

# the records' epoch, step, losses and accuracy (not the timings)
key() {
    sed -n 's/.*\("epoch":[0-9]*,"step":[0-9]*\).*\("train_loss":[^,]*,"test_loss":[^,]*,"test_acc":[^,]*\).*/\1 \2/p' "$1"
}

# same NAME OPTIONS...: 2 ranks x 1 worker must give the records of
# 1 process x 2 workers exactly (the sums run in the same order)
same() {
    shift   # the case's short name
    "$BIN" $COMMON --workers 2 "$@" --metrics "$TMP/one.jsonl" &&
    mpi -np 2 "$BIN" $COMMON --workers 1 "$@" --metrics "$TMP/two.jsonl" || return 1
    key "$TMP/one.jsonl" >"$TMP/one.key"
    key "$TMP/two.jsonl" >"$TMP/two.key"
    [ -s "$TMP/one.key" ] || { echo "no records"; return 1; }
    grep -q '"ranks":2,"workers_per_rank":1' "$TMP/two.jsonl" || { echo "layout not recorded"; return 1; }
    diff "$TMP/one.key" "$TMP/two.key" && cat "$TMP/two.key" || return 1
    # sdp's alignment report, where asked for
    grep -o '"grad_alignment[^}]*}' "$TMP/one.jsonl" >"$TMP/one.align" || true
    grep -o '"grad_alignment[^}]*}' "$TMP/two.jsonl" >"$TMP/two.align" || true
    diff "$TMP/one.align" "$TMP/two.align" && cat "$TMP/two.align"
}
# the data section of a safetensors file (after its 8-byte length and
# header): the weights alone, whatever the metadata says
data() {
    n=$(od -An -t u8 -N8 "$1" | tr -d ' ')
    tail -c +$((8 + n + 1)) "$1"
}

# weights NAME OPTIONS...: the final weights of 2 ranks x 1 worker are
# bitwise those of 1 process x 2 workers
weights() {
    shift
    rm -rf "$TMP/ck1" "$TMP/ck2"
    "$BIN" $COMMON --workers 2 "$@" --checkpoint "$TMP/ck1" &&
    mpi -np 2 "$BIN" $COMMON --workers 1 "$@" --checkpoint "$TMP/ck2" || return 1
    data "$TMP/ck1/final.safetensors" >"$TMP/w1"
    data "$TMP/ck2/final.safetensors" >"$TMP/w2"
    [ -s "$TMP/w1" ] && cmp "$TMP/w1" "$TMP/w2" && echo "$(wc -c <"$TMP/w1") bytes of weights equal"
}

# resume NAME OPTIONS...: a step checkpoint written by 2 ranks, resumed by
# 2 ranks and by one process of 2 workers, ends as the run that was never
# stopped (records and weights)
resume() {
    shift
    rm -rf "$TMP/ck" "$TMP/ckA" "$TMP/ckB"
    mpi -np 2 "$BIN" $COMMON --workers 1 "$@" --checkpoint "$TMP/ck" --checkpoint-every 20 \
        --keep 0 --metrics "$TMP/ref.jsonl" || return 1
    [ -f "$TMP/ck/step-00000020.safetensors" ] || { echo "no step checkpoint"; return 1; }
    mpi -np 2 "$BIN" $COMMON --workers 1 "$@" --resume "$TMP/ck/step-00000020.safetensors" \
        --checkpoint "$TMP/ckA" --metrics "$TMP/a.jsonl" &&
    "$BIN" $COMMON --workers 2 "$@" --resume "$TMP/ck/step-00000020.safetensors" \
        --checkpoint "$TMP/ckB" --metrics "$TMP/b.jsonl" || return 1
    key "$TMP/ref.jsonl" | tail -n 1 >"$TMP/ref.key"
    key "$TMP/a.jsonl" | tail -n 1 >"$TMP/a.key"
    key "$TMP/b.jsonl" | tail -n 1 >"$TMP/b.key"
    cat "$TMP/ref.key"
    diff "$TMP/ref.key" "$TMP/a.key" && diff "$TMP/ref.key" "$TMP/b.key" || return 1
    data "$TMP/ck/final.safetensors" >"$TMP/w0"
    data "$TMP/ckA/final.safetensors" >"$TMP/wA"
    data "$TMP/ckB/final.safetensors" >"$TMP/wB"
    cmp "$TMP/w0" "$TMP/wA" && cmp "$TMP/w0" "$TMP/wB"
}

run "mpi/train_dp_2x1_equals_1x2" same dp
run "mpi/train_sdp_2x1_equals_1x2" same sdp --strategy sdp --coverage 0.5 --resample 10 \
    --report align=10
run "mpi/train_sdp_neuron_backward_2x1_equals_1x2" same sdpn --strategy sdp --coverage 0.5 --subnet neuron --masking backward
run "mpi/train_ist_2x1_equals_1x2" same ist --strategy ist --local-steps 4
run "mpi/weights_dp_2x1_bitwise_1x2" weights dp
run "mpi/weights_sdp_2x1_bitwise_1x2" weights sdp --strategy sdp --coverage 0.5
run "mpi/weights_ist_2x1_bitwise_1x2" weights ist --strategy ist --local-steps 4
run "mpi/resume_dp_over_ranks_and_across_layouts" resume dp
run "mpi/resume_ist_over_ranks_and_across_layouts" resume ist --strategy ist --local-steps 4
run "mpi/resume_dp_bf16_state_accumulate_over_ranks_and_across_layouts" resume dpb \
    --optimizer-moments bf16-sr --accumulate 2
# gathered more|same OPTIONS...: bf16 over 2 ranks trains bitwise as the
# layers' own conversion of the weights in every forward (--unfuse
# weight-copy).  more: the all-gather writes the replicas' copies (plain,
# or blocked with --weight-layout blocked) in the pass that copies the
# replicas, and its bytes count them; plain copies taken as current run
# fewer oneDNN reorders; same: a rank of one worker receives the other
# ranks' parts in place, so its layers convert (the bytes equal)
gathered() {
    want=$1
    shift
    "$BIN" --data synthetic --steps 1 --quiet --precision bf16 --bf16-emulated || return 77
    rm -rf "$TMP/ckp" "$TMP/cku"
    set -- --precision bf16 --bf16-emulated --model resmlp --depth 2 "$@"
    ONEDNN_VERBOSE=1 mpi -np 2 "$BIN" $COMMON "$@" --checkpoint "$TMP/ckp" \
        --metrics "$TMP/p.jsonl" >"$TMP/p.verbose" &&
    ONEDNN_VERBOSE=1 mpi -np 2 "$BIN" $COMMON "$@" --unfuse weight-copy --checkpoint "$TMP/cku" \
        --metrics "$TMP/u.jsonl" >"$TMP/u.verbose" || return 1
    data "$TMP/ckp/final.safetensors" >"$TMP/wp"
    data "$TMP/cku/final.safetensors" >"$TMP/wu"
    [ -s "$TMP/wp" ] && cmp "$TMP/wp" "$TMP/wu" || return 1
    p=$(sed -n 's/.*"comm_bytes_per_worker_step":\([0-9]*\).*/\1/p' "$TMP/p.jsonl" | tail -n 1)
    u=$(sed -n 's/.*"comm_bytes_per_worker_step":\([0-9]*\).*/\1/p' "$TMP/u.jsonl" | tail -n 1)
    # the layers' conversions of plain copies are oneDNN reorders: fewer
    # when the copies written by the all-gather are taken as current (a
    # few reorders more or less come from elsewhere)
    rp=$(grep -c 'exec,cpu,reorder' "$TMP/p.verbose")
    ru=$(grep -c 'exec,cpu,reorder' "$TMP/u.verbose")
    echo "weights equal; the all-gather moves $p bytes a worker and step, $u without the copies;"
    echo "$rp reorders run, $ru without"
    [ -n "$p" ] && [ -n "$u" ] || return 1
    if [ "$want" = same ]; then
        [ "$p" -eq "$u" ]
        return
    fi
    [ "$p" -gt "$u" ] || return 1
    case " $* " in
    *" blocked "*) ;;   # packed outside oneDNN
    *) [ $((rp * 10)) -lt $((ru * 9)) ] ;;   # a tenth fewer at least (30% here)
    esac
}
run "mpi/bf16_copies_written_by_the_all_gather_2x2" gathered more --workers 2 --oversubscribe
run "mpi/bf16_copies_received_in_place_are_the_layers_2x1" gathered same --workers 1
run "mpi/blocked_copies_packed_by_the_all_gather_2x2" gathered more --workers 2 \
    --oversubscribe --weight-layout blocked
run "mpi/blocked_copies_packed_by_the_all_gather_2x2_sdp_forward" gathered more --workers 2 \
    --oversubscribe --weight-layout blocked --strategy sdp --masking forward --resample 10
run "mpi/blocked_copies_received_in_place_are_the_layers_2x1" gathered same --workers 1 \
    --weight-layout blocked
# a bf16 master (--master-weights bf16-sr): the replicas' copies over
# ranks (the all-gather moves them as bf16), the domain's copies in one
# process, the same bits; skipped (77) where bf16 cannot run at all
bf16_runs() {
    "$BIN" --data synthetic --steps 1 --quiet --precision bf16 --bf16-emulated || return 77
}
bf16_master() {
    bf16_runs || return 77
    "$@" --precision bf16 --bf16-emulated --master-weights bf16-sr --optimizer-moments bf16-sr
}
run "mpi/weights_dp_bf16_master_2x1_bitwise_1x2" bf16_master weights dpm
run "mpi/weights_sdp_backward_bf16_master_2x1_bitwise_1x2" bf16_master weights sdpm \
    --strategy sdp --coverage 0.5 --masking backward --resample 10
run "mpi/weights_localsgd_bf16_master_2x1_bitwise_1x2" bf16_master weights lsgdm \
    --strategy localsgd --local-steps 4
run "mpi/resume_dp_bf16_master_over_ranks_and_across_layouts" bf16_master resume dpm
# ... and no fp32 under the matrices: against the fp32 master, rank 0's
# weights fall by 4 bytes a matrix element of its replica and of its
# master shard (the mlp 784 -> 64 -> 64 -> 10; the first of two shards,
# st_comm_shards' 16-float blocks, lies in the first matrix), less the
# pages a matrix shares with a bias; the update moves 16 bytes a parameter
bf16_master_memory() {
    bf16_runs || return 77
    command -v python3 >/dev/null || { echo "no python3 to read the JSON"; return 77; }
    for m in fp32 bf16-sr; do
        mpi -np 2 "$BIN" --data synthetic --model mlp --depth 2 --width 64 --steps 2 \
            --batch 16 --quiet --workers 1 --precision bf16 --bf16-emulated \
            --optimizer-moments bf16 --master-weights $m --metrics "$TMP/$m.jsonl" || return 1
    done
    python3 - "$TMP/fp32.jsonl" "$TMP/bf16-sr.jsonl" <<'PY'
import json, math, sys
f, b = (json.loads(open(a).read().strip().splitlines()[-1]) for a in sys.argv[1:])
matrices, page = 784 * 64 + 64 * 64 + 64 * 10, 4096
shard = math.ceil(math.ceil((matrices + 64 + 64 + 10) / 16) / 2) * 16
want = 4 * (matrices + shard)
fell = f["peak_bytes_by_kind"]["weights"] - b["peak_bytes_by_kind"]["weights"]
bpp = b["optimizer"]["bytes_per_param"]
print("weights %d bytes with the fp32 master, %d with bf16-sr: %d fewer, want %d less at most "
      "3 pages; the update: %s bytes a parameter, want 16.0"
      % (f["peak_bytes_by_kind"]["weights"], b["peak_bytes_by_kind"]["weights"], fell, want, bpp))
sys.exit(0 if want - 3 * page <= fell <= want and bpp == 16.0 else 1)
PY
}
run "mpi/a_bf16_master_over_ranks_holds_no_fp32_matrices" bf16_master_memory
run "mpi/train_localsgd_2x1_equals_1x2" same lsgd --strategy localsgd --local-steps 4 \
    --optimizer-state keep
run "mpi/weights_localsgd_2x1_bitwise_1x2" weights lsgd --strategy localsgd --local-steps 4
run "mpi/resume_localsgd_over_ranks_and_across_layouts" resume lsgd --strategy localsgd \
    --local-steps 4 --optimizer-state keep

# a non-iid split over 2 ranks x 1 worker deals and reads as one process of
# 2 workers: the same records, and the same class histogram per worker
split_same() {
    same "$@" || return 1
    grep -o '"split":{[^}]*}' "$TMP/one.jsonl" >"$TMP/one.split"
    grep -o '"split":{[^}]*}' "$TMP/two.jsonl" >"$TMP/two.split"
    [ -s "$TMP/one.split" ] && diff "$TMP/one.split" "$TMP/two.split" && cat "$TMP/two.split"
}
run "mpi/train_dp_split_2x1_equals_1x2" split_same dps --split classes:5
run "mpi/train_ist_split_2x1_equals_1x2" split_same ists --strategy ist --local-steps 4 \
    --split dirichlet:0.3
run "mpi/weights_dp_split_2x1_bitwise_1x2" weights dps --split dirichlet:0.3

# every rank compares the checkpoint with its own options and data: a
# resume over ranks with another option is refused in the user's words
resume_refused() {
    rm -rf "$TMP/ck"
    mpi -np 2 "$BIN" $COMMON --workers 1 --checkpoint "$TMP/ck" --checkpoint-every 20 ||
        return 1
    mpi -np 2 "$BIN" $COMMON --workers 1 --seed 2 --resume "$TMP/ck" 2>"$TMP/err"
    rc=$?
    grep '^subtrain' "$TMP/err"
    [ "$rc" -ne 0 ] &&
        grep -q '^subtrain: rank [01] of 2 .*: its run had --seed 1, this one has --seed 2: ' \
            "$TMP/err"
}
run "mpi/resume_with_another_option_refused_over_ranks" resume_refused

# hybrid: 2 ranks x 2 workers against 1 x 4 (the sums group by rank, so
# equal within rounding, not bitwise: losses within 1e-3, accuracy within
# 0.01 after 40 steps)
close() {
    "$BIN" $COMMON --workers 4 --oversubscribe "$@" --metrics "$TMP/one.jsonl" &&
    mpi -np 2 --bind-to none "$BIN" $COMMON --workers 2 --oversubscribe "$@" \
        --metrics "$TMP/two.jsonl" || return 1
    # a tab joins the two records: JSON strings hold no raw tab, while
    # spaces are common in them (the run record's CPU name)
    paste "$TMP/one.jsonl" "$TMP/two.jsonl" | awk '
        { split($0, h, "\t"); a = h[1]; b = h[2];
          match(a, /"test_loss":[^,]*/); la = substr(a, RSTART + 12, RLENGTH - 12);
          match(b, /"test_loss":[^,]*/); lb = substr(b, RSTART + 12, RLENGTH - 12);
          match(a, /"test_acc":[^,]*/); aa = substr(a, RSTART + 11, RLENGTH - 11);
          match(b, /"test_acc":[^,]*/); ab = substr(b, RSTART + 11, RLENGTH - 11);
          d = la - lb; if (d < 0) d = -d; e = aa - ab; if (e < 0) e = -e;
          printf "test_loss %s vs %s, test_acc %s vs %s\n", la, lb, aa, ab;
          if (d > 1e-3 || e > 0.01) bad = 1 }
        END { exit bad }'
}
run "mpi/train_2x2_close_to_1x4" close

# a rank that fails mid-run ends every rank, with one line naming it
fails() {
    SUBTRAIN_FAULT=1:20 mpi -np 2 "$BIN" $COMMON --workers 1 2>"$TMP/err"
    rc=$?
    cat "$TMP/err" | grep '^subtrain'
    [ "$rc" -ne 0 ] && grep -q '^subtrain: rank 1 of 2 .*: training: .*rank 1 fails at step 20' "$TMP/err"
}
run "mpi/failing_rank_ends_every_rank" fails

# a layout the ranks' workers together cannot have (2 ranks x 1 worker,
# one block at coverage 0.5) is bad usage, said before the data loads
# (the data here does not exist)
layout() {
    mpi -np 2 "$BIN" --data /nonexistent/fmnist --strategy sdp --depth 1 --workers 1 \
        2>"$TMP/err"
    rc=$?
    grep '^subtrain' "$TMP/err"
    [ "$rc" -eq 2 ] && grep -q '^subtrain: rank [01] of 2 .*: placement: --strategy sdp --subnet '\
'block: --model resmlp --depth 1 has 1 block, and 2 workers of all ranks at --coverage 0.5 '\
'need 2' "$TMP/err"
}
run "mpi/impossible_layout_over_ranks_is_a_usage_error" layout

# bf16 gradient payloads between ranks: a rank of one worker sends its
# rounded gradient, so 2 x 1 is one process of 2 workers exactly; with 2
# workers a rank the partial is rounded again (close, as fp32's 2 x 2;
# the rounding itself is test_mpi's bitwise case)
run "mpi/train_dp_comm_bf16_2x1_equals_1x2" same dpb --comm-precision bf16
run "mpi/train_sdp_comm_bf16_2x1_equals_1x2" same sdpb --strategy sdp --coverage 0.5 \
    --comm-precision bf16
run "mpi/train_comm_bf16_2x2_close_to_1x4" close --comm-precision bf16

# plan_ranks OPTIONS...: `subtrain plan --ranks 2 --as-given` lays out the
# two ranks without MPI; rank 0's row (its busiest worker, as rank 0's
# records report it) equals the records of `mpirun -np 2` to the byte:
# every kind, the total and the bytes a worker-step (a round's for ist and
# localsgd, as the plan gives them)
plan_ranks() {   # [memory-only] OPTIONS...: memory-only leaves the bytes out
    command -v python3 >/dev/null || { echo "no python3 to read the JSON"; return 77; }
    only=0
    [ "$1" = memory-only ] && { only=1; shift; }
    P="--data synthetic --width 64 --batch 8 --workers 2 --oversubscribe $*"
    rm -f "$TMP/pr.jsonl"
    # shellcheck disable=SC2086
    mpi -np 2 "$BIN" $P --steps 2 --quiet --progress none --metrics "$TMP/pr.jsonl" &&
    "$BIN" plan --ranks 2 --as-given --memory-per-worker 1G --json - $P --steps 2 \
        >"$TMP/plan.json" ||
        return 1
    python3 - "$TMP/pr.jsonl" "$TMP/plan.json" "$only" <<'PY'
import json, sys
rec = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
row = json.load(open(sys.argv[2]))["rows"][0]
mine = row["per_rank"][0]
want = dict(rec["peak_bytes_by_kind"], total=rec["peak_bytes"])
bytes_run = rec.get("comm_bytes_per_worker_round") or rec["comm_bytes_per_worker_step"]
bad = [k for k in want if mine["memory_per_worker"][k] != want[k]]
for k in want:
    print("%-12s plan %10d run %10d" % (k, mine["memory_per_worker"][k], want[k]))
print("bytes        plan %10d run %10d" % (mine["bytes_per_worker_step"], bytes_run))
top = row["memory_per_worker"]["total"]
most = max(r["memory_per_worker"]["total"] for r in row["per_rank"])
same_bytes = sys.argv[3] == "1" or mine["bytes_per_worker_step"] == bytes_run
sys.exit(1 if bad or not same_bytes or top != most
         or row["ranks"] != 2 or row["step_s"] is not None else 0)
PY
}
run "mpi/plan_ranks_dp_equals_the_runs_records" plan_ranks --depth 2
run "mpi/plan_ranks_sdp_neuron_backward_equals_the_runs_records" plan_ranks --depth 3 \
    --strategy sdp --subnet neuron --masking backward
run "mpi/plan_ranks_ist_equals_the_runs_records" plan_ranks --depth 4 --strategy ist
run "mpi/plan_ranks_localsgd_equals_the_runs_records" plan_ranks --depth 2 --strategy localsgd
run "mpi/plan_ranks_comm_bf16_equals_the_runs_records" plan_ranks --depth 2 --comm-precision bf16
bf16_plan_ranks() {
    bf16_runs || return 77
    plan_ranks "$@"
}
run "mpi/plan_ranks_bf16_master_equals_the_runs_records" bf16_plan_ranks --depth 2 \
    --precision bf16 --bf16-emulated --master-weights bf16-sr --optimizer-moments bf16
# the replicas' bf16 copies, plain and blocked, written by the all-gather
run "mpi/plan_ranks_bf16_equals_the_runs_records" bf16_plan_ranks --depth 2 \
    --precision bf16 --bf16-emulated
run "mpi/plan_ranks_bf16_blocked_equals_the_runs_records" bf16_plan_ranks --depth 2 \
    --precision bf16 --bf16-emulated --weight-layout blocked

# wire OPTIONS...: the bytes each rank asks MPI to receive in a step,
# counted at the MPI calls (tests/mpi_wire.c, preloaded into the ranks; a
# 4-step run less a 2-step one, so setup and the end cancel), equal the
# most a rank receives by the plan (bytes_from_other_ranks_per_step, the
# part of the records' comm bytes that crosses ranks): an exchange that
# moved other payloads than the ones counted would fail here
wire() {
    command -v python3 >/dev/null || { echo "no python3 to read the JSON"; return 77; }
    lib=$(pwd)/tests/.libs/libmpiwire.so
    [ -f "$lib" ] || { echo "no $lib (built without shared libraries)"; return 77; }
    P="--data synthetic --model mlp --depth 2 --width 64 --batch 16 --workers 1 $*"
    for s in 2 4; do
        rm -f "$TMP/wire.$s".*
        # shellcheck disable=SC2086
        mpi -np 2 -x LD_PRELOAD="$lib" -x MPI_WIRE_OUT="$TMP/wire.$s" \
            "$BIN" $P --steps $s --quiet --progress none || return 1
    done
    # shellcheck disable=SC2086
    "$BIN" plan --ranks 2 --as-given --memory-per-worker 1G --json - $P --steps 2 \
        >"$TMP/wire.json" || return 1
    python3 - "$TMP" <<'PY'
import json, sys
t = sys.argv[1]
def recv(s, r):
    return int(open("%s/wire.%d.%d" % (t, s, r)).read().split()[1])
step = [(recv(4, r) - recv(2, r)) / 2 for r in (0, 1)]
plan = json.load(open(t + "/wire.json"))["rows"][0]["bytes_from_other_ranks_per_step"]
print("received a step: rank 0 %d, rank 1 %d bytes; the plan: %d at most" % (*step, plan))
sys.exit(0 if max(step) == plan else 1)
PY
}
run "mpi/wire_bytes_of_dp_equal_the_plans" wire
run "mpi/wire_bytes_of_dp_comm_bf16_equal_the_plans" wire --comm-precision bf16
bf16_wire() {
    bf16_runs || return 77
    wire "$@" --precision bf16 --bf16-emulated
}
run "mpi/wire_bytes_of_a_bf16_master_equal_the_plans" bf16_wire --master-weights bf16-sr \
    --optimizer-moments bf16

# masks redrawn before step 2: the plan lays out that draw too (its
# bytes are the first draw's, the record's the last one's)
run "mpi/plan_ranks_sdp_redrawn_memory_equals_the_runs_records" plan_ranks memory-only \
    --depth 3 --strategy sdp --resample 1

# `mpirun -np 2 subtrain calibrate --network FILE` puts the rates between
# the ranks into this machine's calibration FILE (the rest as it was), and
# a plan of 2 ranks under it has a time; the launcher without --network,
# or --network without the launcher, is refused
calibrate_network() {
    "$BIN" calibrate -o "$TMP/net.cal" && cp "$TMP/net.cal" "$TMP/machine.cal" &&
    mpi -np 2 "$BIN" calibrate --network "$TMP/net.cal" || return 1
    grep '^network_' "$TMP/net.cal"
    grep -v '^network_' "$TMP/net.cal" | diff "$TMP/machine.cal" - ||
        { echo "the machine's rates changed"; return 1; }
    grep -qx 'network_ranks 2' "$TMP/net.cal" &&
    awk '$1 == "network_gbps" && $2 > 0 { g = 1 } $1 == "network_us" && $2 > 0 { u = 1 }
         END { exit !(g && u) }' "$TMP/net.cal" || { echo "no network rates"; return 1; }
    "$BIN" plan --ranks 2 --as-given --memory-per-worker 1G --calibration "$TMP/net.cal" \
        --data synthetic --width 64 --batch 8 --workers 1 >"$TMP/net.plan" || return 1
    grep -q "time with the exchange between ranks" "$TMP/net.plan" ||
        { cat "$TMP/net.plan"; return 1; }
    mpi -np 2 "$BIN" calibrate -o "$TMP/no.cal" 2>"$TMP/net.err" </dev/null
    grep -q "^subtrain calibrate: under an MPI launcher of 2 ranks" "$TMP/net.err" &&
        [ ! -s "$TMP/no.cal" ] || { cat "$TMP/net.err"; return 1; }
}
run "mpi/calibrate_measures_the_network_and_plans_time_ranks" calibrate_network

# SIGTERM to one rank stops both at the same step, with a final record
signal() {
    "$MPIRUN" -np 2 "$BIN" --data synthetic --steps 100000 --quiet --workers 1 \
        --metrics "$TMP/sig.jsonl" 2>"$TMP/err" &
    mp=$!
    # the signal goes to a rank that trains: its first record is out (on a
    # loaded machine the ranks' start-up can take many seconds)
    i=0
    while [ ! -s "$TMP/sig.jsonl" ] && [ $i -lt 120 ]; do
        sleep 1
        i=$((i + 1))
    done
    sleep 1
    victim=$(pgrep -P $mp | tail -n 1)
    [ -n "$victim" ] || { echo "no rank found"; kill $mp; return 1; }
    kill -TERM "$victim"
    ( sleep 120; kill -KILL $mp 2>/dev/null ) &   # a hang fails the case
    dog=$!
    wait $mp
    rc=$?
    kill $dog 2>/dev/null
    tail -n 1 "$TMP/sig.jsonl" | cut -c1-80
    [ "$rc" -ne 0 ] && tail -n 1 "$TMP/sig.jsonl" | grep -q '"interrupted":true,.*"final":true'
}
run "mpi/sigterm_to_one_rank_stops_all" signal

# SIGTERM to every rank (as scancel sends it) while rank 0 writes its final
# weights, 5 s slow there by SUBTRAIN_FAULT: the other rank waits for the
# write rather than ending the job under it (mpirun kills the rest of a job
# a rank left, within 2 s); the weights are whole, no temporary file is
# left, and the ranks exit as the signal would have
late_signal() {
    rm -rf "$TMP/lw"
    "$MPIRUN" -np 2 -x SUBTRAIN_FAULT=slow:final.safetensors "$BIN" --data synthetic \
        --steps 20 --quiet --checkpoint "$TMP/lw" 2>"$TMP/lw.err" &
    mp=$!
    i=0
    while ! ls "$TMP/lw" 2>/dev/null | grep -q '[.]tmp[.]' && [ $i -lt 600 ]; do
        sleep 0.2
        i=$((i + 1))
    done
    ranks=$(pgrep -P $mp)
    [ -n "$ranks" ] || { echo "no rank found"; kill $mp; return 1; }
    kill -TERM $ranks
    ( sleep 120; kill -KILL $mp 2>/dev/null ) &   # a hang fails the case
    dog=$!
    wait $mp
    rc=$?
    kill $dog 2>/dev/null
    echo "exit $rc: $(ls "$TMP/lw" | tr '\n' ' ')"
    [ "$rc" -ne 0 ] && [ -s "$TMP/lw/final.safetensors" ] &&
        ! ls "$TMP/lw" | grep -q '[.]tmp[.]' && grep -q 'training is done' "$TMP/lw.err"
}
run "mpi/sigterm_to_every_rank_while_rank_0_writes_keeps_the_weights" late_signal

# synth R N OPTIONS...: R ranks x N workers give the records (segment
# losses included) and final weights of one process of R N workers
synth() {
    R=$1 N=$2; shift 2
    rm -rf "$TMP/ck1" "$TMP/ck2"
    S="--data synthetic --quiet --strategy synth --oversubscribe --epochs 2"
    "$BIN" $S --workers $((R * N)) "$@" --metrics "$TMP/one.jsonl" --checkpoint "$TMP/ck1" &&
    mpi -np "$R" "$BIN" $S --workers "$N" "$@" --metrics "$TMP/two.jsonl" \
        --checkpoint "$TMP/ck2" || return 1
    for f in one two; do
        key "$TMP/$f.jsonl" >"$TMP/$f.key"
        grep -o '"segment_workers":[^]]*\]\|"segment_loss":[^]]*\]' "$TMP/$f.jsonl" >>"$TMP/$f.key"
    done
    [ -s "$TMP/one.key" ] || { echo "no records"; return 1; }
    grep -q "\"ranks\":$R,\"workers_per_rank\":$N" "$TMP/two.jsonl" ||
        { echo "layout not recorded"; return 1; }
    diff "$TMP/one.key" "$TMP/two.key" && tail -n 3 "$TMP/two.key" || return 1
    data "$TMP/ck1/final.safetensors" >"$TMP/w1"
    data "$TMP/ck2/final.safetensors" >"$TMP/w2"
    [ -s "$TMP/w1" ] && cmp "$TMP/w1" "$TMP/w2" && echo "$(wc -c <"$TMP/w1") bytes of weights equal"
}
# 3 x 1: segments of 2 and 1 workers, the first spanning ranks 0 and 1
run "mpi/synth_3x1_spanning_group_and_recovery" synth 3 1 --recovery-epochs 1
# 2 x 2, cut after layer 4: segments of 3 and 1 workers, the first on
# 2 workers of rank 0 and 1 of rank 1
run "mpi/synth_2x2_uneven_spanning_group" synth 2 2 --cuts 4

# a synth checkpoint of 3 ranks at a segment epoch's end, resumed by 3
# ranks and by one process of 3 workers, ends as the run never stopped
synth_resume() {
    rm -rf "$TMP/ck" "$TMP/ckA" "$TMP/ckB"
    S="--data synthetic --quiet --strategy synth --oversubscribe --epochs 3 --recovery-epochs 1"
    mpi -np 3 "$BIN" $S --workers 1 --checkpoint "$TMP/ck" --checkpoint-every epoch --keep 0 \
        --metrics "$TMP/ref.jsonl" || return 1
    step=$(ls "$TMP/ck" | grep -m 1 '^step-')
    [ -n "$step" ] || { echo "no step checkpoint"; return 1; }
    mpi -np 3 "$BIN" $S --workers 1 --resume "$TMP/ck/$step" --checkpoint "$TMP/ckA" \
        --metrics "$TMP/a.jsonl" &&
    "$BIN" $S --workers 3 --resume "$TMP/ck/$step" --checkpoint "$TMP/ckB" \
        --metrics "$TMP/b.jsonl" || return 1
    key "$TMP/ref.jsonl" | tail -n 1 >"$TMP/ref.key"
    key "$TMP/a.jsonl" | tail -n 1 >"$TMP/a.key"
    key "$TMP/b.jsonl" | tail -n 1 >"$TMP/b.key"
    echo "resumed from $step: $(cat "$TMP/ref.key")"
    diff "$TMP/ref.key" "$TMP/a.key" && diff "$TMP/ref.key" "$TMP/b.key" || return 1
    data "$TMP/ck/final.safetensors" >"$TMP/w0"
    data "$TMP/ckA/final.safetensors" >"$TMP/wA"
    data "$TMP/ckB/final.safetensors" >"$TMP/wB"
    cmp "$TMP/w0" "$TMP/wA" && cmp "$TMP/w0" "$TMP/wB"
}
run "mpi/synth_resume_over_ranks_and_across_layouts" synth_resume

finish

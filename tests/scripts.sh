#!/bin/sh
# tests/scripts.sh — make check's tests of scripts/sweep, scripts/plot and
# scripts/primitive-times (POSIX sh and awk; the PNG cases need gnuplot
# and are skipped without it).  Prints a Criterion-style synthesis line
# for scripts/summary.sh.
#
#   sweep_*   a 2 x 2 grid on --data synthetic, 2 steps a run, 2 seeds:
#             the CSV's rows, the markdown table's mean ± sd against the
#             CSV's numbers, -k keeps finished runs, a failing run, bad specs
#   plot_*    labels from the provenance record "run" (hand-written
#             records), and from file names without it; PNGs of metrics
#             files and of a sweep's runs.csv; bad input
#   primitive_times  groups, per-step division and the reference left out
#             on a hand-written oneDNN verbose log; bad input
#   compare   scripts/lib/compare.awk's differences and verdicts against
#             the seed spread on a hand-written runs.csv (acc, loss, peak)
#   plan_accuracy  scripts/plan-accuracy.sh makes doc/data/plan-accuracy.csv
#             from doc/data's tables as committed (the plan reads it)
set -u
. "$(dirname "$0")/case.sh"
srcdir=${srcdir:-.}
BIN=${SUBTRAIN_BIN:-./subtrain}
SWEEP="$srcdir/scripts/sweep"
PLOT="$srcdir/scripts/plot"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
expect() {   # expect WHAT GOT WANT
    [ "$2" = "$3" ] && return 0
    echo "$1: got '$2', expected '$3'"
    return 1
}

# ------------------------------------------------------------------ sweep
cat >"$TMP/grid.spec" <<'SPEC'
# two configurations (a run line crossed with an axis), two seeds
options --data synthetic --steps 2 --workers 2 --oversubscribe   # every run
seeds 1 2
run sdp, blocks | --strategy sdp --subnet block
coverage 0.5 1
SPEC

sweep_grid() {
    sh "$SWEEP" -b "$BIN" -o "$TMP/grid" "$TMP/grid.spec" >"$TMP/grid.out" 2>"$TMP/grid.err" ||
        { cat "$TMP/grid.err"; return 1; }
    csv=$TMP/grid/runs.csv
    expect "CSV lines" "$(wc -l <"$csv" | tr -d ' ')" 5 || return 1
    expect "CSV header" "$(head -n 1 "$csv")" \
        "config,seed,test_acc,test_loss,train_loss,peak_mib,comm_mb_step,comm_mb_round,wall_s,samples_per_s,align_mean,align_min,exit,options" || return 1
    # configurations in order, seeds inner; every run finished
    expect "configurations" "$(tail -n +2 "$csv" | cut -d '"' -f 2 | paste -sd '|' -)" \
        "sdp, blocks coverage=0.5|sdp, blocks coverage=0.5|sdp, blocks coverage=1|sdp, blocks coverage=1" || return 1
    expect "seeds" "$(tail -n +2 "$csv" | cut -d '"' -f 3 | cut -d , -f 2 | paste -sd ' ' -)" "1 2 1 2" || return 1
    tail -n +2 "$csv" | grep -q -v ',0,"--data' && { echo "a run did not exit 0"; return 1; }
    # the options and the seed reached the program
    grep -q -- '--coverage 1 --seed 2 ' "$TMP/grid/runs/sdp-blocks-coverage-1-s2.cmd" || { cat "$TMP/grid/runs/sdp-blocks-coverage-1-s2.cmd"; return 1; }
    # the seeds differ in what they train: not the same accuracy and loss
    a=$(sed -n 2p "$csv" | cut -d '"' -f 3 | cut -d , -f 3,4)
    b=$(sed -n 3p "$csv" | cut -d '"' -f 3 | cut -d , -f 3,4)
    [ "$a" != "$b" ] || { echo "seeds 1 and 2 gave the same '$a'"; return 1; }
    # peak memory: coverage 0.5 holds less than coverage 1
    p1=$(sed -n 2p "$csv" | cut -d '"' -f 3 | cut -d , -f 6)
    p2=$(sed -n 4p "$csv" | cut -d '"' -f 3 | cut -d , -f 6)
    awk -v a="$p1" -v b="$p2" 'BEGIN { exit !(a > 0 && a < b) }' ||
        { echo "peak MiB: coverage 0.5 $p1, coverage 1 $p2"; return 1; }
}

# The table's test accuracy cell of each configuration is the mean ± the
# sample standard deviation of the CSV's two values, computed here again.
sweep_table() {
    table=$TMP/grid/table.md
    [ -f "$table" ] || { echo "no table.md"; return 1; }
    expect "table lines" "$(wc -l <"$table" | tr -d ' ')" 4 || return 1
    cmp -s "$table" "$TMP/grid.out" || { echo "the table printed is not table.md"; return 1; }
    for c in 0.5 1; do
        want=$(grep "coverage=$c\"" "$TMP/grid/runs.csv" | cut -d '"' -f 3 | cut -d , -f 3 |
            awk '{ x[NR] = $1; s += $1 } END { m = s / NR; v = 0
                   for (i = 1; i <= NR; i++) v += (x[i] - m) ^ 2
                   printf "%.4f ± %.4f", m, sqrt(v / (NR - 1)) }')
        got=$(grep "| sdp, blocks coverage=$c |" "$table" | awk -F ' [|] ' '{ print $3 }')
        expect "coverage $c test acc" "$got" "$want" || { cat "$table"; return 1; }
        grep -q "| sdp, blocks coverage=$c | 1 2 |" "$table" || { cat "$table"; return 1; }
    done
}

# -k: every run finished with the same command line, none runs again, and
# the CSV is the same
sweep_keep() {
    cp "$TMP/grid/runs.csv" "$TMP/before.csv"
    sh "$SWEEP" -k -b "$BIN" -o "$TMP/grid" "$TMP/grid.spec" >/dev/null 2>"$TMP/keep.err" ||
        { cat "$TMP/keep.err"; return 1; }
    expect "kept runs" "$(grep -c ': kept$' "$TMP/keep.err")" 4 || return 1
    cmp "$TMP/before.csv" "$TMP/grid/runs.csv"
}

# a run that fails: the sweep goes on, exits 1, and the table counts it
sweep_failing_run() {
    printf 'options --data synthetic --steps 2\nrun bad | --coverage 7 --strategy sdp --workers 2 --oversubscribe\nrun good | --workers 1\n' >"$TMP/fail.spec"
    sh "$SWEEP" -b "$BIN" -o "$TMP/fail" "$TMP/fail.spec" >/dev/null 2>"$TMP/fail.err"
    expect "exit status" $? 1 || { cat "$TMP/fail.err"; return 1; }
    grep -q '^"bad",1,,,,,,,,,,,2,' "$TMP/fail/runs.csv" || { cat "$TMP/fail/runs.csv"; return 1; }
    grep -q '| bad | 0 of 1 (1) | – |' "$TMP/fail/table.md" || { cat "$TMP/fail/table.md"; return 1; }
    grep -q '| good | 1 | 0\.[0-9]* |' "$TMP/fail/table.md" || { cat "$TMP/fail/table.md"; return 1; }
}

# bad specs: one line naming the file and line, exit 2, nothing run
sweep_bad_spec() {
    for body in 'seeds 1 x' 'run no bar here' 'run  | --epochs 1' 'Coverage 0.5' 'coverage' \
                'coverage 0.5\ncoverage 0.25'; do
        printf "# a comment\n$body\n" >"$TMP/bad.spec"
        sh "$SWEEP" -b "$BIN" -o "$TMP/bad" "$TMP/bad.spec" >/dev/null 2>"$TMP/bad.err"
        rc=$?
        expect "exit status of '$body'" $rc 2 || return 1
        expect "lines of stderr" "$(wc -l <"$TMP/bad.err" | tr -d ' ')" 1 || { cat "$TMP/bad.err"; return 1; }
        grep -q "^sweep: $TMP/bad.spec:[23]: " "$TMP/bad.err" || { cat "$TMP/bad.err"; return 1; }
        [ ! -e "$TMP/bad" ] || { echo "'$body' ran something"; return 1; }
    done
    sh "$SWEEP" -b "$BIN" "$TMP/none.spec" 2>/dev/null; expect "missing spec" $? 2 || return 1
    sh "$SWEEP" -x "$TMP/grid.spec" 2>/dev/null; expect "unknown option" $? 2
}

run "scripts/sweep_grid_csv" sweep_grid
run "scripts/sweep_table_mean_sd" sweep_table
run "scripts/sweep_keep" sweep_keep
run "scripts/sweep_failing_run" sweep_failing_run
run "scripts/sweep_bad_spec" sweep_bad_spec

# ------------------------------------------------------------------ plot
# Hand-written records: two runs with a provenance record (differing in
# --lr), a run without one, and a second record of each.
rec() {   # rec EPOCH FINAL ACC: one record without "run"
    printf '"epoch":%s,"step":%s,"final":%s,"train_loss":0.5,"test_loss":0.4,"test_acc":%s,"samples_per_s":10.0,"wall_s":%s,"lr":0.001,"workers":4,"peak_bytes_by_kind":{"weights":1048576,"gradients":1048576,"optimizer":2097152,"activations":524288,"workspace":0,"attention":0},"peak_bytes_per_worker":4718592,"comm_bytes_per_worker_step":2500000,"ring_bytes_per_worker_step":0,"step_ms":{"compute":1.0,"wait":0.0,"reduce":0.1,"optimizer":0.2}}\n' \
        "$1" $(($1 * 10)) "$2" "$3" "$1.5"
}
provenance() {   # provenance LR: the "run" object
    printf '"run":{"config":{"model":"resmlp","strategy":"sdp","subnet":"block","coverage":"0.5","workers":"4","lr":"%s","metrics":"m%s.jsonl","prompt":"a \\"quoted\\" {text}"},"version":"0.1.0","git":null,"seed":1,"start_time":"2026-01-01T00:00:00Z"},' "$1" "$1"
}
{ printf '{'; provenance 0.001; rec 1 false 0.80; printf '{'; rec 2 false 0.85; printf '{'; rec 2 true 0.85; } >"$TMP/a.jsonl"
{ printf '{'; provenance 0.01; rec 1 false 0.70; printf '{'; rec 2 true 0.75; } >"$TMP/b.jsonl"
{ printf '{'; rec 1 false 0.60; printf '{'; rec 2 true 0.65; } >"$TMP/plain.jsonl"

plot_labels() {
    got=$(sh "$PLOT" -L "$TMP/a.jsonl" "$TMP/b.jsonl" "$TMP/plain.jsonl" | paste -sd '|' -)
    expect "labels" "$got" "resmlp sdp block C=0.5 N=4 lr=0.001|resmlp sdp block C=0.5 N=4 lr=0.01|plain" || return 1
    # alone, a file is its model, strategy and workers; -l overrides
    expect "one label" "$(sh "$PLOT" -L "$TMP/a.jsonl")" "resmlp sdp block C=0.5 N=4" || return 1
    expect "given label" "$(sh "$PLOT" -L -l mine "$TMP/b.jsonl" "$TMP/plain.jsonl" | paste -sd '|' -)" "mine|plain"
}

plot_bad_input() {
    echo "not json" >"$TMP/bad.jsonl"
    sh "$PLOT" -o "$TMP/x.png" "$TMP/bad.jsonl" 2>"$TMP/perr"; expect "not JSON" $? 2 || return 1
    sh "$PLOT" -o "$TMP/x.png" "$TMP/nothere.jsonl" 2>/dev/null; expect "missing file" $? 2 || return 1
    sh "$PLOT" -o "$TMP/x.png" -p acc,nope "$TMP/a.jsonl" 2>/dev/null; expect "unknown panel" $? 2 || return 1
    sh "$PLOT" -o "$TMP/x.svg" "$TMP/a.jsonl" 2>/dev/null; expect "not a PNG name" $? 2 || return 1
    [ ! -e "$TMP/x.png" ] || { echo "a figure was drawn"; return 1; }
    expect "stderr" "$(cat "$TMP/perr")" "plot: '$TMP/bad.jsonl' is neither a metrics file (JSON Lines) nor a sweep's runs.csv"
}

is_png() {   # a PNG file: its signature, and more than the signature
    [ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" = '211PNG' ] && [ "$(wc -c <"$1")" -gt 1000 ] ||
        { echo "$1 is not a PNG"; return 1; }
}

plot_metrics_png() {
    command -v gnuplot >/dev/null 2>&1 || { echo "no gnuplot: skipped"; return 77; }
    sh "$PLOT" -o "$TMP/m.png" -t "three runs" "$TMP/a.jsonl" "$TMP/b.jsonl" "$TMP/plain.jsonl" || return 1
    is_png "$TMP/m.png" || return 1
    sh "$PLOT" -o "$TMP/m2.png" -p memory,comm "$TMP/a.jsonl" || return 1
    is_png "$TMP/m2.png"
}

plot_sweep_png() {
    command -v gnuplot >/dev/null 2>&1 || { echo "no gnuplot: skipped"; return 77; }
    [ -f "$TMP/grid/runs.csv" ] || { echo "no runs.csv (sweep_grid failed)"; return 1; }
    sh "$PLOT" -o "$TMP/s.png" -p acc,loss,memory,comm,wall "$TMP/grid/runs.csv" || return 1
    is_png "$TMP/s.png" || return 1
    sh "$PLOT" -o "$TMP/s2.png" "$TMP/grid/runs.csv" "$TMP/a.jsonl" 2>/dev/null; expect "csv and metrics" $? 2
}

run "scripts/plot_labels" plot_labels
run "scripts/plot_bad_input" plot_bad_input
run "scripts/plot_metrics_png" plot_metrics_png
run "scripts/plot_sweep_png" plot_sweep_png

# ------------------------------------------------------- primitive-times
# oneDNN 2.6's verbose lines of two steps (made up: the format is what
# counts), with a reference matmul that has no user scratchpad
PRIM="$srcdir/scripts/primitive-times"
cat >"$TMP/verbose.log" <<'LOG'
onednn_verbose,info,oneDNN v2.6.3 (commit N/A)
onednn_verbose,exec,cpu,matmul,brg:avx512_core_bf16,undef,src_bf16::blocked:ab:f0 wei_bf16::blocked:ab:f0 dst_f32::blocked:ab:f0,attr-scratchpad:user ,,4x8:8x2:4x2,1.5
onednn_verbose,exec,cpu,reorder,jit:uni,undef,src_f32::blocked:ab:f0 dst_bf16::blocked:ab:f0,attr-scratchpad:user ,,4x8,0.25
onednn_verbose,exec,cpu,matmul,brg:avx512_core_bf16,undef,src_bf16::blocked:ab:f0 wei_bf16::blocked:ab:f0 bia_f32::blocked:ab:f0_mask2 dst_f32::blocked:ab:f0,attr-scratchpad:user attr-post-ops:binary_add:f32:3:ab ,,4x8:8x2:4x2,2
onednn_verbose,exec,cpu,softmax_v2,jit:avx512_core,forward_training,src_f32::blocked:ab:f0 dst_f32::blocked:ab:f0,attr-scratchpad:user ,alg:softmax_accurate axis:1,4x2,0.5
dnnl_verbose,exec,cpu,matmul,brg:avx512_core_bf16,undef,src_bf16::blocked:ab:f0 wei_bf16::blocked:ab:f0 dst_f32::blocked:ab:f0,attr-scratchpad:user ,,4x8:8x2:4x2,2.5
onednn_verbose,exec,cpu,reorder,jit:uni,undef,src_f32::blocked:ab:f0 dst_bf16::blocked:ab:f0,attr-scratchpad:user ,,4x8,0.75
onednn_verbose,exec,cpu,softmax_v2,jit:avx512_core,forward_training,src_f32::blocked:ab:f0 dst_f32::blocked:ab:f0,attr-scratchpad:user ,alg:softmax_accurate axis:1,4x2,0.5
onednn_verbose,exec,cpu,matmul,brg:avx512_core_bf16,undef,src_bf16::blocked:ab:f0 wei_bf16::blocked:ab:f0 dst_f32::blocked:ab:f0,,,4x8:8x2:4x2,9
not a verbose line,exec
LOG

primitive_times() {
    out=$(sh "$PRIM" -s -p softmax "$TMP/verbose.log") || return 1
    # per step (2 softmax calls): the plain matmul 2 calls (1.5 + 2.5) / 2,
    # the reorder (0.25 + 0.75) / 2, the post-op matmul a group of its own;
    # the reference matmul (no user scratchpad) left out
    expect "rows" "$(echo "$out" | wc -l | tr -d ' ')" 6 || return 1
    expect "first" "$(echo "$out" | sed -n 2p | awk '{ print $1, $2, $3, $5, $6 }')" \
        "2.000 1.0 2.0000 matmul 4x8:8x2:4x2" || return 1
    echo "$out" | grep -q '^ *1\.000 *0\.5 *2\.0000 .*matmul 4x8:8x2:4x2 .* +post-ops$' ||
        { echo "post-op group: $out"; return 1; }
    echo "$out" | grep -q '^ *0\.500 *1\.0 *0\.5000 .*reorder 4x8 src_f32::ab dst_bf16::ab$' ||
        { echo "reorder group: $out"; return 1; }
    expect "total" "$(echo "$out" | tail -n 1 | awk '{ print $1, $3, $4 }')" "4.000 all 4" ||
        return 1
    # without -s the reference is counted, in totals (no -n, no -p)
    expect "with the reference" "$(sh "$PRIM" "$TMP/verbose.log" | tail -n 1 | awk '{ print $1 }')" \
        "17.000" || return 1
    # -c: the classes after the groups; the two matmul groups are one class
    out=$(sh "$PRIM" -s -p softmax -c "$TMP/verbose.log") || return 1
    echo "$out" | grep -q '^ *3\.000 *1\.5 *2\.0000 *75\.0%  products$' ||
        { echo "products class: $out"; return 1; }
    echo "$out" | grep -q '^ *0\.500 *1\.0 *0\.5000 *12\.5%  softmax_v2$' ||
        { echo "softmax class: $out"; return 1; }
    expect "rows with -c" "$(echo "$out" | wc -l | tr -d ' ')" 11 || return 1
    sh "$PRIM" -n two "$TMP/verbose.log" 2>/dev/null; expect "bad -n" $? 2 || return 1
    sh "$PRIM" -p nothing-like-it "$TMP/verbose.log" 2>/dev/null; expect "no match" $? 1 || return 1
    sh "$PRIM" "$TMP/missing.log" 2>/dev/null; expect "missing log" $? 2 || return 1
    sh "$PRIM" "$TMP/grid.spec" 2>/dev/null; expect "no verbose lines" $? 1
}

run "scripts/primitive_times" primitive_times

# ------------------------------------------------------------------ compare
cat >"$TMP/cmp.csv" <<'CSV'
config,seed,test_acc,test_loss,train_loss,peak_mib,comm_mb_step,comm_mb_round,wall_s,samples_per_s,align_mean,align_min,exit,options
"a",1,0.90,1.50,1,10,,,1,1,,,0,"x"
"a",2,0.92,1.52,1,10,,,1,1,,,0,"x"
"b, far",1,0.86,1.60,1,5,,,1,1,,,0,"x"
"b, far",2,0.87,1.61,1,5,,,1,1,,,0,"x"
"c",1,0.91,1.49,1,20,,,1,1,,,0,"x"
"c",2,0.93,1.53,1,20,,,1,1,,,1,"x"
CSV
printf 'a | b, far\na | c\na | missing\n' >"$TMP/cmp.pairs"

compare() {   # compare WHAT: the lines compare.awk prints
    awk -v what="$1" -f "$srcdir/scripts/lib/csv.awk" -f "$srcdir/scripts/lib/compare.awk" \
        "$TMP/cmp.pairs" "$TMP/cmp.csv"
}

compare_verdicts() {
    # a: 0.91 +- 0.0141, b: 0.865 +- 0.00707: -4.50 points against a spread
    # of 2.1; c's failed seed is left out: one seed, no spread
    expect "acc far" "$(compare acc | sed -n 1p)" \
        "- b, far against a: -4.50 points (sd 1.4 + 0.71 = 2.1 points): exceeds the seed spread" ||
        return 1
    expect "acc one seed" "$(compare acc | sed -n 2p | sed "s/.*): //")" "one seed: no spread" ||
        return 1
    expect "missing" "$(compare acc | sed -n 3p)" "- missing against a: not measured (missing)" ||
        return 1
    # loss: a 1.51 +- 0.0141, b 1.605 +- 0.00707: +0.095 nats, beyond 0.021
    expect "loss" "$(compare loss | sed -n 1p)" \
        "- b, far against a: +0.0950 (sd 0.014 + 0.0071 = 0.021): exceeds the seed spread" ||
        return 1
    expect "peak" "$(compare peak | sed -n 1p)" "- b, far against a: 5.0 / 10.0 MiB = 0.50x"
}
run "scripts/compare_verdicts" compare_verdicts

# ------------------------------------------------------------------ plan-accuracy
plan_accuracy() {
    sh "$srcdir/scripts/plan-accuracy.sh" >"$TMP/plan-accuracy.csv" || return 1
    diff "$srcdir/doc/data/plan-accuracy.csv" "$TMP/plan-accuracy.csv" ||
        { echo "doc/data/plan-accuracy.csv is not what scripts/plan-accuracy.sh makes"; return 1; }
    grep -qx 'sdp block C=0.5,resmlp,-0.84,3,SDP block C=0.5,doc/sdp.md' "$TMP/plan-accuracy.csv"
}
run "scripts/plan_accuracy" plan_accuracy

finish

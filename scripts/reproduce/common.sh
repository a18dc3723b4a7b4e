# scripts/reproduce/common.sh — what the reproduction scripts share (sourced).
#
#   sh scripts/reproduce/NAME.sh [-b BIN] [-o DIR] [-s "SEEDS"] [-k|-c]
#
#   -b BIN     the program (default $SUBTRAIN, else ./subtrain)
#   -o DIR     the sweeps' folders go under DIR (default reproduce)
#   -s SEEDS   seeds (default the spec's: 1 2 3)
#   -k         keep the runs a previous call finished (scripts/sweep -k)
#   -c         run nothing: the table of the runs finished so far
#
# Each prints the claim, the measured table (mean ± sd over the seeds) and
# the comparisons that carry the claim, each against the seed spread.
set -eu
REPRO=$(cd "$(dirname "$0")" && pwd)
SCRIPTS=$(dirname "$REPRO")
BIN=${SUBTRAIN:-./subtrain}
OUT=reproduce
SEEDS=
KEEP=
while [ $# -gt 0 ]; do
    case $1 in
    -b) [ $# -ge 2 ] || { echo "reproduce: -b needs a program" >&2; exit 2; }; BIN=$2; shift 2 ;;
    -o) [ $# -ge 2 ] || { echo "reproduce: -o needs a folder" >&2; exit 2; }; OUT=$2; shift 2 ;;
    -s) [ $# -ge 2 ] || { echo "reproduce: -s needs seeds" >&2; exit 2; }; SEEDS=$2; shift 2 ;;
    -k|-c) KEEP=$1; shift ;;
    -h|--help) sed -n '3,12p' "$REPRO/common.sh" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "reproduce: unknown argument '$1'" >&2; exit 2 ;;
    esac
done

claim() {   # the claim's text, from stdin
    echo "== Claim"
    fold -s -w 76 | sed 's/ *$//; s/^/   /'
    echo
}

# sweep NAME: runs scripts/reproduce/NAME.spec into $OUT/NAME, prints its
# table; a failed run leaves it out of the table (the sweep says which)
sweep() {
    name=$1
    echo "== Measured: scripts/sweep scripts/reproduce/$name.spec${SEEDS:+ -s \"$SEEDS\"}"
    set -- -b "$BIN" -o "$OUT/$name"
    [ -z "$SEEDS" ] || set -- "$@" -s "$SEEDS"
    [ -z "$KEEP" ] || set -- "$@" "$KEEP"
    sh "$SCRIPTS/sweep" "$@" "$REPRO/$name.spec" >/dev/null || true
    cat "$OUT/$name/table.md"
    echo
}

# compare NAME [acc|align|peak]: the pairs on stdin ("A | B" a line)
compare() {
    case ${2:-acc} in
    peak) echo "== Peak memory per worker, B / A" ;;
    *) echo "== Differences of the means of ${2:-acc} (B against A; beyond the seed spread when larger than sd A + sd B)" ;;
    esac
    cat >"$OUT/$1.pairs"
    awk -v what="${2:-acc}" -f "$SCRIPTS/lib/csv.awk" -f "$SCRIPTS/lib/compare.awk" \
        "$OUT/$1.pairs" "$OUT/$1/runs.csv"
    echo
}

# holders NAME WHAT MORE: the pairs of an SDP table with several holders a
# unit (sdp-gpt, sdp-vit): blocks and heads against data parallelism and
# against each other, at equal length and with MORE (", 2x steps")
holders() {
    for more in "" "$3"; do
        echo "data parallel | SDP block forward C=0.5$more"
        echo "data parallel | SDP heads forward C=0.5$more"
        echo "SDP heads forward C=0.5$more | SDP block forward C=0.5$more"
    done | compare "$1" "$2"
}

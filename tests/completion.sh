#!/bin/bash
# tests/completion.sh — make check's test of the bash completion,
# completions/subtrain, against the program: what it offers is read from
# --help, and what the program accepts is asked of the program.
#
#   completion/commands   `subtrain TAB` offers every command --help names
#   completion/CMD_options     `subtrain [CMD] --TAB` offers the long options
#                         of `subtrain [CMD] --help`, no more, no fewer
#   completion/CMD_values      after each option: the options again when
#                         the program takes it without a value (`subtrain
#                         [CMD] --help --OPT` exits 0), never when it wants
#                         one (it exits 2); and every value offered (dp,
#                         sdp, ... of --strategy) is one the program accepts
#                         (`subtrain [CMD] --help --OPT VALUE` exits 0), and
#                         none is offered twice (--optimizer-state's, whose
#                         line --help shows for ist and for localsgd)
#   completion/forms      --opt=VALUE, --data cifar10:DIR and text:FILE,
#                         --metrics FILE, cut where bash replaces the word
#
# Runs in an empty directory, so that no file is offered where none is
# asked for.  SUBTRAIN_BIN (default ./subtrain) and SUBTRAIN_COMPLETION
# (default $srcdir/completions/subtrain) say what is tested: make
# installcheck runs this on the installed files.  Prints a Criterion-style
# synthesis line for scripts/summary.sh.
set -u
. "$(dirname "$0")/case.sh"
BIN=$(cd "$(dirname "${SUBTRAIN_BIN:-./subtrain}")" && pwd)/$(basename "${SUBTRAIN_BIN:-./subtrain}")
# The program is run some 150 times.  In the build tree it is libtool's
# wrapper script, a shell more each time: with SUBTRAIN_LIBTOOL (make check
# sets it) the test runs again under `libtool --mode=execute`, which puts
# the program itself in the wrapper's place and sets the library path.
if [ -n "${SUBTRAIN_LIBTOOL:-}" ] && [ -z "${ST_COMPLETION_EXECUTED:-}" ]; then
    ST_COMPLETION_EXECUTED=1 exec $SUBTRAIN_LIBTOOL --mode=execute "$BASH" "$0" "$BIN"
fi
BIN=${1:-$BIN}
COMPLETION=$(cd "$(dirname "${SUBTRAIN_COMPLETION:-${srcdir:-.}/completions/subtrain}")" &&
             pwd)/$(basename "${SUBTRAIN_COMPLETION:-completions/subtrain}")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir "$TMP/empty"
cd "$TMP/empty" || exit 1
# shellcheck source=../completions/subtrain
. "$COMPLETION" || { echo "cannot source $COMPLETION"; exit 1; }
# complete LINE: what TAB at the end of LINE offers, one per line, sorted
complete_line() {
    COMP_LINE=$1 COMP_POINT=${#1} COMPREPLY=()
    _subtrain
    ((${#COMPREPLY[@]})) && printf '%s\n' "${COMPREPLY[@]}" | LC_ALL=C sort
}

# the long options of a --help text on stdin (tests/manpage.sh reads them
# alike), and the commands of the main --help
help_options() {
    sed -n 's/^  \(-[A-Za-z], \)\{0,1\}\(--[a-z0-9][a-z0-9-]*\).*/\2/p' | LC_ALL=C sort -u
}
"$BIN" --help >"$TMP/help" 2>&1 || { echo "$BIN --help failed"; cat "$TMP/help"; exit 1; }
COMMANDS=$(grep -o 'subtrain \[*[a-z][a-z0-9-]*' "$TMP/help" | sed 's/.* \[*//' | LC_ALL=C sort -u)
# the line starts with the program's path: the completion asks that program
P=$BIN

commands() {
    complete_line "$P " >"$TMP/c"
    echo "offered: $(tr '\n' ' ' <"$TMP/c")"
    echo "$COMMANDS" | diff - "$TMP/c"
}

options() {   # options [CMD]
    "$BIN" ${1:+"$1"} --help | help_options >"$TMP/h"
    complete_line "$P${1:+ $1} --" >"$TMP/c"
    echo "subtrain${1:+ $1} --help: $(wc -l <"$TMP/h") long options, $(wc -l <"$TMP/c") offered"
    [ -s "$TMP/h" ] && diff "$TMP/h" "$TMP/c"
}

values() {   # values [CMD]
    local ok=0 opt v flags=0 valued=0 checked=0
    "$BIN" ${1:+"$1"} --help | help_options >"$TMP/h"
    complete_line "$P${1:+ $1} --" >"$TMP/all"
    while read -r opt; do
        complete_line "$P${1:+ $1} $opt " >"$TMP/v"
        "$BIN" ${1:+"$1"} --help "$opt" >/dev/null 2>"$TMP/err"
        case $? in
        0)  flags=$((flags + 1))
            cmp -s "$TMP/v" "$TMP/all" ||
                { echo "$opt takes no value, but the options are not offered after it"; ok=1; } ;;
        2)  valued=$((valued + 1))
            if cmp -s "$TMP/v" "$TMP/all"; then
                echo "$opt takes a value ($(cat "$TMP/err")), but options are offered for it"; ok=1
            fi
            # an option --help shows twice (two strategies take it): its values once
            [ -z "$(uniq -d "$TMP/v")" ] ||
                { echo "$opt: offered twice: $(uniq -d "$TMP/v" | tr '\n' ' ')"; ok=1; }
            while read -r v; do
                case $v in *:) continue ;; esac   # a prefix: cifar10:, text:
                checked=$((checked + 1))
                "$BIN" ${1:+"$1"} --help "$opt" "$v" >/dev/null 2>"$TMP/err" ||
                    { echo "$opt $v is offered, but: $(cat "$TMP/err")"; ok=1; }
            done <"$TMP/v" ;;
        *)  echo "subtrain${1:+ $1} --help $opt: exit status not 0 or 2"; ok=1 ;;
        esac
    done <"$TMP/h"
    echo "subtrain${1:+ $1}: $flags options without a value, $valued with one, $checked values offered and accepted"
    # not vacuous: the values of --strategy, --model and --precision are offered
    if [ -z "${1:-}" ]; then
        for opt in --strategy --model --precision; do
            [ "$(complete_line "$P $opt " | wc -l)" -ge 2 ] ||
                { echo "$opt: fewer than two values offered"; ok=1; }
        done
    fi
    return $ok
}

forms() {
    local ok=0 got
    expect() {   # expect LINE WANT...: what TAB after "subtrain LINE" offers
        local line=$1
        shift
        got=$(complete_line "$P $line" | tr '\n' ' ')
        echo "subtrain $line: $got"
        [ "$got" = "$* " ] || { echo "  expected: $*"; ok=1; }
    }
    mkdir cifar-10-batches-bin && touch corpus.txt
    expect "--strategy=s" sdp synth
    expect "--data cif" cifar-10-batches-bin cifar100: cifar10:
    expect "--data cifar10:ci" cifar-10-batches-bin
    expect "--data text:co" corpus.txt
    expect "--data=text:co" corpus.txt
    expect "--metrics co" corpus.txt
    expect "--checkpoint c" cifar-10-batches-bin
    expect "train --stra" --strategy
    expect "--split " classes: dirichlet: iid
    # after a prefix whose value is a number, no directory
    got=$(complete_line "$P --split classes:c" | tr '\n' ' ')
    echo "subtrain --split classes:c: $got"
    [ -z "$got" ] || { echo "  expected nothing: K is a number"; ok=1; }
    rm -rf cifar-10-batches-bin corpus.txt
    return $ok
}

run "completion/commands" commands
run "completion/train_options" options ""
run "completion/train_values" values ""
for c in $COMMANDS; do
    # a command with a --help of its own (topo, quad); eval's is train's
    "$BIN" "$c" --help | cmp -s - "$TMP/help" && continue
    run "completion/${c}_options" options "$c"
    run "completion/${c}_values" values "$c"
done
run "completion/forms" forms

finish

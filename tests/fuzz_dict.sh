#!/bin/sh
# tests/fuzz_dict.sh — make check's test of fuzz/options.dict against the
# program, so that fuzz_options splices every word a command line can hold:
#
#   fuzz_dict/options     every long option of `subtrain --help` is a word
#   fuzz_dict/values      every fixed value of an option's a|b|c syntax is a
#                         word; of a value with a placeholder (cifar10:DIR,
#                         classes:K) the part before it (cifar10:, classes:)
#
# SUBTRAIN_BIN (default ./subtrain) and SUBTRAIN_DICT (default
# $srcdir/fuzz/options.dict) say what is tested.
set -u
. "$(dirname "$0")/case.sh"
BIN=${SUBTRAIN_BIN:-./subtrain}
DICT=${SUBTRAIN_DICT:-${srcdir:-.}/fuzz/options.dict}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

"$BIN" --help > "$TMP/help" || { echo "subtrain --help failed"; exit 1; }
sed -n 's/^"\(.*\)"$/\1/p' "$DICT" | LC_ALL=C sort -u > "$TMP/dict"

# "option WORD" and "value WORD" lines, read as tests/manpage.sh reads --help
awk '/^  (-[A-Za-z0-9], )?--[a-z0-9]/ {
    line = substr($0, 3)
    if (line ~ /^-[A-Za-z0-9], /) line = substr(line, 5)
    match(line, /^--[a-z0-9-]+/)
    print "option", substr(line, 1, RLENGTH)
    rest = substr(line, RLENGTH + 1)
    if (rest !~ /^ [^ ]/) next
    split(substr(rest, 2), w, " ")
    n = split(w[1], v, "|")
    for (i = 1; i <= n; i++) {
        sub(/[A-Z[].*/, "", v[i])
        if (n > 1 || v[i] != w[1]) if (v[i] != "") print "value", v[i]
    }
}' "$TMP/help" | LC_ALL=C sort -u > "$TMP/words"

missing() { # KIND: the words of that kind the dictionary lacks
    awk -v k="$1" '$1 == k { print $2 }' "$TMP/words" | LC_ALL=C sort -u |
        LC_ALL=C comm -23 - "$TMP/dict" > "$TMP/missing"
    [ -s "$TMP/missing" ] || return 0
    echo "$DICT lacks: $(tr '\n' ' ' < "$TMP/missing")"
    return 1
}

run fuzz_dict/options missing option
run fuzz_dict/values missing value
finish

#!/bin/sh
# tests/manpage.sh — make check's test of the manual page, subtrain(1),
# against the program, so that the two cannot drift apart.  Nothing here
# lists an option: both sides are read, the --help texts and the page.
#
#   man/renders           groff renders the page without a warning (-ww)
#   man/commands          every command `subtrain --help` names is in the
#                         page's SYNOPSIS; a command whose --help is its own
#                         (topo, quad) has a section "NAME OPTIONS", and
#                         every such section is a command's
#   man/options_CMD       the options of `subtrain CMD --help` and the .It
#                         entries of its section (OPTIONS for train and
#                         eval) are the same set, and an entry shows a value
#                         exactly when --help shows one
#
# An option of --help is a line of two spaces, an optional "-x, ", the long
# option, then one space and its value's syntax, or two spaces or more and
# the text (a flag).  An entry of the page is an ".It Fl ..." line of the
# section: its options, then anything but a comma when it takes a value.
#
# SUBTRAIN_BIN (default ./subtrain) and SUBTRAIN_MAN (default
# $srcdir/doc/subtrain.1) say what is tested: make installcheck runs this on
# the installed program and page.  Prints a Criterion-style synthesis line
# for scripts/summary.sh.
set -u
. "$(dirname "$0")/case.sh"
BIN=${SUBTRAIN_BIN:-./subtrain}
MAN=${SUBTRAIN_MAN:-${srcdir:-.}/doc/subtrain.1}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# "OPTION flag" or "OPTION value" per option of a --help text on stdin
help_options() {
    awk '/^  (-[A-Za-z], )?--[a-z0-9]/ {
        line = substr($0, 3); short = ""
        if (line ~ /^-[A-Za-z], /) { short = substr(line, 1, 2); line = substr(line, 5) }
        match(line, /^--[a-z0-9-]+/)
        arg = substr(line, RLENGTH + 1) ~ /^ [^ ]/ ? "value" : "flag"
        if (short != "") print short, arg
        print substr(line, 1, RLENGTH), arg
    }' | LC_ALL=C sort -u
}

# the same for the .It Fl entries of the page's section $1
man_options() {
    awk -v sect="$1" '
    /^\.Sh / { insec = substr($0, 5) == sect; next }
    insec && /^\.It Fl / {
        n = split($0, w, " "); k = 0; arg = "flag"
        for (i = 2; i <= n; i++) {
            if (w[i] == "Fl" && i < n) { o = w[++i]; gsub(/\\-/, "-", o); opt[++k] = "-" o }
            else if (w[i] != ",") arg = "value"
        }
        for (i = 1; i <= k; i++) print opt[i], arg
    }' "$MAN" | LC_ALL=C sort -u
}

sections() {   # the page's section names
    sed -n 's/^\.Sh //p' "$MAN"
}

renders() {
    command -v groff >/dev/null 2>&1 || {
        echo "groff not found: the page cannot be checked (Debian: apt-get install groff-base)"
        return 1
    }
    groff -mandoc -ww -z "$MAN" >"$TMP/groff" 2>&1
    rc=$?
    cat "$TMP/groff"
    [ "$rc" -eq 0 ] && [ ! -s "$TMP/groff" ]
}

# the commands the main --help names ("subtrain [train]", "subtrain topo",
# "subtrain eval --init ..."), and the section that documents each
"$BIN" --help >"$TMP/help" 2>&1 || { echo "$BIN --help failed:"; cat "$TMP/help"; exit 1; }
COMMANDS=$(grep -o 'subtrain \[*[a-z][a-z0-9-]*' "$TMP/help" | sed 's/.* \[*//' | LC_ALL=C sort -u)
section_of() {   # OPTIONS when the command's --help is the main one
    "$BIN" "$1" --help >"$TMP/help.$1" 2>&1 || return 1
    if cmp -s "$TMP/help" "$TMP/help.$1"; then echo OPTIONS
    else echo "$1 OPTIONS" | tr '[:lower:]' '[:upper:]'; fi
}
for c in $COMMANDS; do
    section_of "$c" >"$TMP/section.$c" || echo "subtrain $c --help failed" >"$TMP/section.$c"
done
SECTIONS=$(cat "$TMP"/section.* | LC_ALL=C sort -u)
section() { cat "$TMP/section.$1"; }

commands() {
    ok=0
    synopsis=$(sed -n '/^\.Sh SYNOPSIS/,/^\.Sh /p' "$MAN")
    for c in $COMMANDS; do
        echo "$synopsis" | grep -q "Cm $c\$" ||
            { echo "subtrain $c (in --help) is not in the SYNOPSIS"; ok=1; }
        s=$(section "$c")
        sections | grep -qx "$s" || { echo "subtrain $c: no section '$s'"; ok=1; }
        echo "subtrain $c: $s"
    done
    for s in $(sections | sed -n 's/ OPTIONS$//p' | tr '[:upper:]' '[:lower:]'); do
        if ! echo "$COMMANDS" | grep -qx "$s" || [ "$(section "$s")" = OPTIONS ]; then
            echo "section '$s OPTIONS' documents no command with a --help of its own"; ok=1
        fi
    done
    return $ok
}

options() {   # options SECTION: the --help of its commands against it
    s=$1
    c=$(cd "$TMP" && grep -lxF "$s" section.* | sed -n '$s/^section\.//p')
    [ -n "$c" ] || { echo "no command's --help goes with section $s"; return 1; }
    help_options <"$TMP/help.$c" >"$TMP/h"
    man_options "$s" >"$TMP/m"
    echo "subtrain $c --help: $(wc -l <"$TMP/h") options; section $s: $(wc -l <"$TMP/m") entries"
    [ -s "$TMP/h" ] || { echo "no option found in subtrain $c --help"; return 1; }
    LC_ALL=C comm -23 "$TMP/h" "$TMP/m" | sed "s/^\(.*\)/--help has '\1', $s has not/"
    LC_ALL=C comm -13 "$TMP/h" "$TMP/m" | sed "s/^\(.*\)/$s has '\1', --help has not/"
    cmp -s "$TMP/h" "$TMP/m"
}

run "man/renders" renders
run "man/commands" commands
# one case per section: train and eval share OPTIONS
echo "$SECTIONS" >"$TMP/sections"
while read -r s; do
    run "man/$(echo "$s" | tr 'A-Z ' 'a-z_')" options "$s"
done <"$TMP/sections"

finish

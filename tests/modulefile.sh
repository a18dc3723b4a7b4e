#!/bin/sh
# Loads subtrain's modulefile with each module system found, Lmod and
# Environment Modules, and uses what it puts on the paths: the program on
# PATH, its manual page on MANPATH, the library through pkg-config and
# LD_LIBRARY_PATH (an example built and run), subtrain_torch.py on
# PYTHONPATH, then unloads it.
#
#   tests/modulefile.sh MODULEPATH MODULE BINDIR EXAMPLES
#
# MODULE is NAME/VERSION, found in MODULEPATH; BINDIR is where the program
# must be found.  Lmod is its libexec/lmod (LMOD_CMD, or Debian's place);
# Environment Modules is modulecmd.tcl run by tclsh (MODULES_CMD, or
# Debian's place).  A system not installed is skipped, unless it is named
# in SUBTRAIN_MODULE_SYSTEMS ("lmod environment-modules"), as CI does.
set -u
[ $# -eq 4 ] || { echo "usage: tests/modulefile.sh MODULEPATH MODULE BINDIR EXAMPLES" >&2; exit 2; }
modulepath=$1 module=$2 bindir=$3 examples=$4
version=${module#*/}
required=${SUBTRAIN_MODULE_SYSTEMS:-}
work=$(mktemp -d) || exit 1
trap 'rm -rf "$work"' EXIT

first_of() {
    for f in "$@"; do [ -f "$f" ] && { echo "$f"; return 0; }; done
    return 1
}

# module SYSTEM ARGS...: the shell code a module command prints, evaluated
module_eval() {
    sys=$1; shift
    case $sys in
    lmod) code=$("$lmod" sh "$@") ;;
    environment-modules) code=$(tclsh "$modulecmd" sh "$@") ;;
    esac || return 1
    eval "$code"
}

fail() { echo "modulefile: $sys: $*"; exit 1; }

# check SYSTEM: in a subshell, so each system starts from the same paths
check() (
    sys=$1
    MODULEPATH=$modulepath; export MODULEPATH
    module_eval "$sys" load "$module" || fail "module load $module failed"
    found=$(command -v subtrain) || fail "subtrain is not on PATH after module load"
    [ "$found" = "$bindir/subtrain" ] || fail "PATH finds $found, not $bindir/subtrain"
    v=$(subtrain --version | head -n 1)
    [ "$v" = "subtrain $version" ] || fail "subtrain --version says '$v', not 'subtrain $version'"
    page=
    IFS=:; for d in ${MANPATH:-}; do [ -f "$d/man1/subtrain.1" ] && page=$d/man1/subtrain.1; done; unset IFS
    [ -n "$page" ] || fail "no man1/subtrain.1 under MANPATH=${MANPATH:-}"
    py=
    IFS=:; for d in ${PYTHONPATH:-}; do [ -f "$d/subtrain_torch.py" ] && py=$d/subtrain_torch.py; done; unset IFS
    [ -n "$py" ] || fail "no subtrain_torch.py under PYTHONPATH=${PYTHONPATH:-}"
    pv=$(${PKG_CONFIG:-pkg-config} --modversion subtrain) || fail "pkg-config does not find subtrain (PKG_CONFIG_PATH=${PKG_CONFIG_PATH:-})"
    [ "$pv" = "$version" ] || fail "pkg-config says version $pv"
    rm -rf "$work/$sys" && cp -r "$examples" "$work/$sys" && chmod -R u+w "$work/$sys" || exit 1
    make -s -C "$work/$sys" CC="${CC:-cc}" PKG_CONFIG="${PKG_CONFIG:-pkg-config}" >"$work/$sys.log" 2>&1 ||
        { cat "$work/$sys.log"; fail "the example does not build with pkg-config"; }
    "$work/$sys/train_synthetic" >"$work/$sys.run" 2>&1 ||
        { cat "$work/$sys.run"; fail "the example does not run with the module's LD_LIBRARY_PATH"; }
    module_eval "$sys" unload "${module%/*}" || fail "module unload failed"
    if command -v subtrain >/dev/null 2>&1 && [ "$(command -v subtrain)" = "$bindir/subtrain" ]; then
        fail "subtrain is still on PATH after module unload"
    fi
    echo "modulefile: $sys loads $module: $found, $v, $page, $py, pkg-config $pv, the example built and ran; unloaded"
)

lmod=$(first_of "${LMOD_CMD:-}" /usr/share/lmod/lmod/libexec/lmod /usr/share/lmod/*/libexec/lmod)
modulecmd=$(first_of "${MODULES_CMD:-}" /usr/lib/x86_64-linux-gnu/modulecmd.tcl /usr/share/modules/libexec/modulecmd.tcl /usr/lib/modulecmd.tcl)
command -v tclsh >/dev/null 2>&1 || modulecmd=

status=0 ran=0
for sys in lmod environment-modules; do
    case $sys in lmod) cmd=$lmod ;; *) cmd=$modulecmd ;; esac
    if [ -z "$cmd" ]; then
        case " $required " in
        *" $sys "*) echo "modulefile: $sys is not installed, and SUBTRAIN_MODULE_SYSTEMS names it"; status=1 ;;
        *) echo "modulefile: $sys is not installed: skipped" ;;
        esac
        continue
    fi
    check "$sys" || status=1
    ran=$((ran + 1))
done
[ $status -ne 0 ] || echo "modulefile: $ran module systems loaded $module"
exit $status

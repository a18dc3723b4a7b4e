#!/bin/sh
# What make install puts in place, checked as a user would use it: a staged
# install (DESTDIR) and `make installcheck` over it, in the build of the
# current tree (scripts/test.sh builds it first).  installcheck loads the
# modulefile with both module systems of Debian 12, which conflict as
# packages: Lmod is installed, and Environment Modules' package is
# unpacked into a directory of its own, where tclsh runs its modulecmd.tcl.
set -eu
cd "$(dirname "$0")/.."
sh scripts/install-deps.sh lmod tcl
mods=${MODULES_DIR:-/tmp/subtrain-environment-modules}
cmd=$mods/usr/lib/x86_64-linux-gnu/modulecmd.tcl
if [ ! -f "$cmd" ]; then
    rm -rf "$mods" && mkdir -p "$mods/deb"
    (cd "$mods/deb" && apt-get download environment-modules >/dev/null)
    dpkg-deb -x "$mods"/deb/environment-modules_*.deb "$mods"
fi
[ -f "$cmd" ] || { echo "test-install: no modulecmd.tcl in Environment Modules' package" >&2; exit 1; }
stage=${STAGE_DIR:-/tmp/subtrain-stage}
rm -rf "$stage"
make install DESTDIR="$stage" >/dev/null
MODULES_CMD=$cmd SUBTRAIN_MODULE_SYSTEMS="lmod environment-modules" \
    make installcheck DESTDIR="$stage"

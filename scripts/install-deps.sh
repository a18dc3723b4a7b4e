#!/bin/sh
# Installs what subtrain needs on Debian 12 (bookworm), if it is missing.
# Idempotent: when everything is there it changes nothing and needs no
# network.  Needs root (or sudo) only when something must be installed.
# Packages given as arguments replace the list (scripts/test-fuzz.sh
# installs clang and libFuzzer's runtime this way).
set -eu

PACKAGES="build-essential autoconf automake libtool autoconf-archive pkg-config
libdnnl-dev libhwloc-dev libcriterion-dev zlib1g-dev libjansson-dev dataset-fashion-mnist
libopenmpi-dev openmpi-bin gnuplot-nox groff-base"
[ $# -eq 0 ] || PACKAGES="$*"

missing=""
for p in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
        missing="$missing $p"
done
if [ -z "$missing" ]; then
    echo "install-deps: all packages present"
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
else
    echo "install-deps: missing packages:$missing; run this script as root" >&2
    exit 1
fi
echo "install-deps: installing$missing"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends $missing

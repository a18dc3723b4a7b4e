#!/bin/sh
# Bootstraps (once), configures (once) and builds subtrain in the source
# tree, leaving the program at ./subtrain.  Safe to run again: it only
# redoes what is out of date.
set -eu
cd "$(dirname "$0")/.."
[ -x configure ] || autoreconf -fi
[ -f Makefile ] || ./configure
make -j"$(nproc)"

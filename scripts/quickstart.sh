#!/bin/sh
# The README's first command: install, build, and train the default model
# (resmlp depth 4 width 256, AdamW, 5 epochs, batch 128) on Fashion-MNIST.
set -eu
cd "$(dirname "$0")/.."
sh scripts/install-deps.sh
sh scripts/build.sh
./subtrain --metrics metrics.jsonl "$@"

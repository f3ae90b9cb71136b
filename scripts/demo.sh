#!/usr/bin/env bash
# The main job: builds attnops and runs `attnops demo` (a packed varlen GQA causal bf16 batch,
# checked against the reference). Extra arguments go to `attnops demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTNOPS_BUILD_TESTS=OFF >/dev/null
cmake --build build --target attnops_cli
build/tools/cli/attnops demo "$@"

#!/usr/bin/env bash
# The main job: builds attnops and runs `attnops demo` (a packed varlen GQA causal bf16 batch,
# checked against the reference). Extra arguments go to `attnops demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache keys on paths relative to the checkout, so a clone in another folder (CI's) reuses the
# objects of an earlier build instead of compiling everything again.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
scripts/install-deps.sh
# The same compile options as scripts/test.sh's first configuration (so the two share objects in
# build/), every option stated: a cached value from an earlier configuration never carries over.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_COMPILE_WARNING_AS_ERROR=ON \
  -DATTNOPS_BUILD_TESTS=OFF -DATTNOPS_BUILD_CLI=ON -DATTNOPS_BUILD_ACL=ON -DATTNOPS_BUILD_FUZZERS=OFF -DATTNOPS_BUILD_PYTHON=OFF \
  -DATTNOPS_SANITIZE= >/dev/null
cmake --build build --target attnops_cli
build/tools/cli/attnops demo "$@"

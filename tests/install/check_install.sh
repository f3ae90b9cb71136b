#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, then builds and runs a find_package consumer:
#   check_install.sh BUILD_DIR core|acl CXX_COMPILER [SANITIZERS]
# "core" runs the C++-layer consumer (shared and static library), "acl" the aclnn host programs
# of tests/install/acl/. The consumer is compiled by the build's compiler with the build's
# sanitizers (an instrumented library needs an instrumented program).
set -euo pipefail
build_dir=$1
what=$2
cxx=$3
sanitize=${4:-}
source_dir=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
flags=()
if [ -n "$sanitize" ]; then
  flags=(-DCMAKE_CXX_FLAGS="-fsanitize=$sanitize -fno-omit-frame-pointer -fno-sanitize-recover=all"
         -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=$sanitize")
fi
cmake -S "$source_dir" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_CXX_COMPILER="$cxx" \
  -DATTNOPS_CONSUMER="$what" "${flags[@]}" >/dev/null
cmake --build "$work/build" >/dev/null
export LD_LIBRARY_PATH="$work/prefix/lib:$work/prefix/lib64:${LD_LIBRARY_PATH:-}"
if [ "$what" = core ]; then
  "$work/build/consumer_shared"
  "$work/build/consumer_static"
else
  # The README's complete example is this file, word for word.
  awk '/^A complete program/ {found = 1} found && /^```cpp$/ {copy = 1; next} copy && /^```$/ {exit} copy' \
    "$source_dir/../../README.md" | diff -u - "$source_dir/acl/example_flash_attention_score.cpp" \
    || { echo "README's example differs from tests/install/acl/example_flash_attention_score.cpp"; exit 1; }
  for program in example_flash_attention_score test_aclnn_flash_attention_score \
                 test_aclnn_flash_attention_score_grad test_aclnn_block_attention_residuals \
                 test_aclnn_fused_infer_attention_score; do
    echo "== $program"
    "$work/build/$program"
  done
fi

#!/usr/bin/env bash
# The test command (README, .ci/run): builds attnops and runs every test configuration.
#   1. g++ Release, warnings as errors: the whole CTest suite (unit, CLI smoke, install), then
#      the slow size tests (CTest label `large`: S = 65,536 forward and backward).
#   2. clang with AddressSanitizer + UndefinedBehaviorSanitizer (LeakSanitizer included),
#      warnings as errors: the suite again without `large` (this is also the clang warning check).
#   3. clang with ThreadSanitizer: the runtime, fault and concurrency tests (reduced iterations).
#   4. libFuzzer (clang, ASan+UBSan) over the FlashAttentionScore, FlashAttentionScoreGrad,
#      BlockAttentionResiduals and inference-family (FIA V4, PFA V3, IFA V4) APIs for a bounded time each (ATTNOPS_FUZZ_SECONDS, default 40).
#   5. The Python package (pip install .) and its pytest suite (tests/python).
# Set ATTNOPS_TEST_QUICK=1 to run step 1 only.
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache keys on paths relative to the checkout, so a clone in another folder (CI's) reuses the
# objects of an earlier build instead of compiling everything again.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
scripts/install-deps.sh
jobs=$(nproc)
start=$SECONDS
stamp() { echo "== [$((SECONDS - start)) s] $*"; }

stamp "g++ Release build"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_COMPILE_WARNING_AS_ERROR=ON \
  -DATTNOPS_BUILD_TESTS=ON -DATTNOPS_BUILD_CLI=ON -DATTNOPS_BUILD_ACL=ON -DATTNOPS_BUILD_FUZZERS=OFF -DATTNOPS_BUILD_PYTHON=OFF \
  -DATTNOPS_SANITIZE= >/dev/null
cmake --build build -j "$jobs"
stamp "g++ Release tests"
ctest --no-tests=error --test-dir build --output-on-failure -j "$jobs" --timeout 1200 -LE large
stamp "g++ Release tests, label large (long sequences)"
ctest --no-tests=error --test-dir build -j "$jobs" --timeout 2400 -L large -V > build/large.log 2>&1 || { tail -n 200 build/large.log; exit 1; }
grep -E "long-sequence:|tests passed" build/large.log || true
[ "${ATTNOPS_TEST_QUICK:-0}" = 1 ] && { stamp "quick run: sanitizers skipped"; exit 0; }

# Sanitizers abort on huge allocations unless told to return NULL; the tests ask for some on
# purpose (out-of-memory paths).
export ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=allocator_may_return_null=1:halt_on_error=1

stamp "clang ASan+UBSan build"
CC=clang CXX=clang++ cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DATTNOPS_SANITIZE=address,undefined -DCMAKE_COMPILE_WARNING_AS_ERROR=ON \
  -DATTNOPS_BUILD_TESTS=ON -DATTNOPS_BUILD_CLI=ON -DATTNOPS_BUILD_ACL=ON -DATTNOPS_BUILD_FUZZERS=OFF >/dev/null
cmake --build build-asan -j "$jobs"
stamp "clang ASan+UBSan tests"
ctest --no-tests=error --test-dir build-asan --output-on-failure -j "$jobs" --timeout 1800 -LE large

stamp "clang TSan build"
CC=clang CXX=clang++ cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DATTNOPS_SANITIZE=thread -DATTNOPS_BUILD_TESTS=ON -DATTNOPS_BUILD_CLI=OFF -DATTNOPS_BUILD_ACL=OFF -DATTNOPS_BUILD_FUZZERS=OFF \
  -DCMAKE_COMPILE_WARNING_AS_ERROR=ON >/dev/null
cmake --build build-tsan -j "$jobs" --target test_runtime test_fa_backward test_faults test_concurrency
stamp "clang TSan tests (runtime, streams, faults, concurrency)"
ctest --no-tests=error --test-dir build-tsan --output-on-failure -j "$jobs" --timeout 1800 \
  -R '^(Device|Stream|AsyncError|Executor|PlanCache|Memory|ColdStart|Environment|MultiDevice|FaBackwardDeterminism|Fault|Concurrency)\.'
stamp "libFuzzer build"
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTNOPS_SANITIZE=address,undefined \
  -DATTNOPS_BUILD_FUZZERS=ON -DATTNOPS_BUILD_TESTS=OFF -DATTNOPS_BUILD_CLI=OFF -DATTNOPS_BUILD_ACL=OFF -DCMAKE_COMPILE_WARNING_AS_ERROR=ON >/dev/null
cmake --build build-fuzz -j "$jobs" --target fa_forward_fuzz fa_backward_fuzz bar_fuzz fia_fuzz
for target in fa_forward_fuzz fa_backward_fuzz bar_fuzz fia_fuzz; do
  stamp "libFuzzer: $target, ${ATTNOPS_FUZZ_SECONDS:-40} s"
  corpus=$(mktemp -d)
  status=0
  "build-fuzz/$target" -max_total_time="${ATTNOPS_FUZZ_SECONDS:-40}" -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="$corpus/" "$corpus" > "$corpus.log" 2>&1 || status=$?
  grep -E "^(Done|stat::number_of_executed_units)" "$corpus.log" || true
  if [ "$status" -ne 0 ]; then
    tail -n 80 "$corpus.log"
    echo "fuzzing $target found a failure (exit $status); the input that failed is in $corpus (crash-*)"
    exit 1
  fi
  rm -rf "$corpus" "$corpus.log"
done

# Python package: `pip install .` (scikit-build-core + nanobind, the same CMake project) and its
# pytest suite, in a virtual environment (.venv) that also sees python3's own packages; what is
# missing comes from PyPI (torch's PyPI wheel, a CUDA build that runs on the CPU; the only index
# this project's machines reach), with pip's cache. The fixed build folder
# (build-python/) and ccache keep the extension build incremental.
stamp "Python package: install"
[ -x .venv/bin/python ] || python3 -m venv --system-site-packages .venv
py=.venv/bin/python
if ! "$py" -c "import torch, numpy, pytest, nanobind, scikit_build_core" 2>/dev/null; then
  "$py" -m pip install -q numpy pytest "nanobind>=2.0" "scikit-build-core>=0.10"
  "$py" -c "import torch" 2>/dev/null || "$py" -m pip install -q torch
fi
"$py" -m pip install -q --no-build-isolation .
# ring-flash-attention, a real context-parallel client, runs on attnops as its flash-attn backend
# in tests/python/test_ring_flash_attn_compat.py (--no-deps: it would pull the CUDA flash-attn).
"$py" -m pip show -q ring-flash-attn >/dev/null 2>&1 || "$py" -m pip install -q --no-deps ring-flash-attn
stamp "Python package: pytest"
"$py" -m pytest tests/python -q -p no:cacheprovider
stamp "all test configurations passed"

#!/usr/bin/env bash
# Measures this machine: every benchmark the README's performance section quotes, one after the
# other in one run (so their ratios share the machine's state), into this CPU's own folder of
# bench/results/. Run it from an idle machine; the README's performance section says how to read
# the files.
#
#   bench/run_machine.sh [--tag TAG] [--out DIR] [--quick] [--no-torch] [--cli PATH] [--python PATH] [--commit]
#
#   --tag     suffix of the files (default: the UTC date and time, e.g. 20261204-2130)
#   --out     folder of the files (default: the folder of bench/results/ whose machine.txt names
#             this CPU, else a new one named after the vendor, the model name and the widest ISA)
#   --quick   the benchmarks' small shapes (a check that the script works, not a measurement)
#   --no-torch  skip bench/compare_torch.py (needs PyTorch)
#   --cli     the attnops CLI (default build/tools/cli/attnops, built if missing)
#   --python  the Python that runs compare_torch.py (default .venv/bin/python, else python3)
#   --commit  git-commit each step's files as soon as the step ends (only those files), so that a
#             machine taken away in the middle of the run keeps what it measured (one session
#             lost a whole AMX run that way: bench/results/intel-xeon-amx/NOTES.md)
#
# Files: info (`attnops info`: the CPU, its ISA, the kernels chosen and why), bench (attention
# forward and backward, fp32/bf16/fp16, against the peaks measured in the same run), decode,
# compare_torch (attnops against PyTorch SDPA, .txt and .json), bar (Block Attention Residuals
# against the DRAM read), prefill (FusedInferAttentionScore's prefill route against the
# FlashAttentionScore forward) and, where the OS grants AMX and the tests are built, amx (the AMX
# tests on the hardware: the tile kernels against the emulator bit for bit).
set -euo pipefail
cd "$(dirname "$0")/.."

tag=$(date -u +%Y%m%d-%H%M)
out=""
quick=""
torch=1
cli=build/tools/cli/attnops
python=""
commit=0
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --quick) quick=--quick; shift ;;
    --no-torch) torch=0; shift ;;
    --cli) cli=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --commit) commit=1; shift ;;
    *) echo "run_machine.sh: unknown argument '$1' (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
done

if [ ! -x "$cli" ]; then
  echo "building $cli ..."
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTNOPS_BUILD_CLI=ON >/dev/null
  cmake --build build --target attnops_cli
fi

# This CPU, as the OS reports it (never used to choose a kernel: only to file the results).
field() { grep -m1 "^$1[[:space:]]*:" /proc/cpuinfo | sed 's/^[^:]*:[[:space:]]*//'; }
isa=avx2
for f in avx512f amx_tile; do grep -qw "$f" /proc/cpuinfo && isa=${f/_tile/}; done
machine="$(field vendor_id) family $(field 'cpu family') model $(field model) \"$(field 'model name')\" $isa"
if [ -z "$out" ]; then
  for known in bench/results/*/machine.txt; do
    [ -f "$known" ] && [ "$(head -n 1 "$known")" = "$machine" ] && out=$(dirname "$known") && break
  done
fi
if [ -z "$out" ]; then
  vendor=$(field vendor_id | sed 's/GenuineIntel/intel/; s/AuthenticAMD/amd/')
  model=$(field 'model name' | tr 'A-Z' 'a-z' | sed 's/([^)]*)//g; s/ cpu .*//; s/[^a-z0-9]\+/-/g; s/^-//; s/-$//')
  out=bench/results/$vendor-${model#"$vendor"-}-f$(field 'cpu family')m$(field model)-$isa
fi
mkdir -p "$out"
[ -f "$out/machine.txt" ] || echo "$machine" > "$out/machine.txt"
echo "machine: $machine"
echo "files:   $out/*-$tag.*"

header() {
  date -u
  uptime
  lscpu | grep -E "^CPU\(s\)|Model name|Vendor ID|CPU family|^Model:|L1d|L2|L3" || true
  # The commit of the code (with --commit, HEAD moves on with every step's files).
  echo "attnops $(git log -1 --format=%h -- src include tools CMakeLists.txt 2>/dev/null || echo '(no git)')$(git diff --quiet HEAD -- src include tools 2>/dev/null || echo ' with uncommitted changes')"
  echo "\$ $*"
}
# run NAME COMMAND...: the command's output, with the header and the load after it, in NAME-TAG.txt.
run() {
  local name=$1 file="$out/$1-$tag.txt"
  shift
  echo "== $name: $*"
  { header "$@"; "$@" 2>&1; echo; uptime; } > "$file" || { echo "$name failed; see $file" >&2; exit 1; }
  keep "$file" "$out/machine.txt" "$out/$name-$tag.json"
}
# keep FILE...: with --commit, commits the files that exist (and nothing else that is staged).
keep() {
  [ "$commit" = 1 ] || return 0
  local files=()
  for f in "$@"; do [ -f "$f" ] && files+=("$f"); done
  git add -- "${files[@]}" && git commit -q -m "bench/results: $(basename "${files[0]}") ($machine)" -- "${files[@]}" ||
    echo "run_machine.sh: could not commit ${files[*]}" >&2
}

# The workloads the README quotes (their --quick forms have other sizes in their names).
if [ -n "$quick" ]; then gqa=gqa32x8-s256-d128-causal tnd=tnd-4k-causal sweep=256; else gqa=gqa32x8-s2048-d128-causal tnd=tnd-32k-causal sweep=2048; fi

run info "$cli" info
run bench "$cli" bench $quick --workloads $gqa,sweep-s$sweep --sweep $sweep --dtypes fp32,bf16,fp16 --repeat 3
run decode "$cli" bench $quick --workloads decode,mla-decode --repeat 3
if [ "$torch" = 1 ]; then
  [ -n "$python" ] || { [ -x .venv/bin/python ] && python=.venv/bin/python || python=python3; }
  if "$python" -c "import torch" 2>/dev/null; then
    run compare_torch "$python" bench/compare_torch.py --attnops "$cli" $quick \
      --workloads $gqa,sweep-s$sweep,$tnd,decode,mla-decode --sweep $sweep \
      --dtypes fp32,bf16 --repeat 3 --max-seconds 20 --json "$out/compare_torch-$tag.json"
  else
    echo "compare_torch skipped: $python cannot import torch (pip install torch, or --python PATH)" | tee "$out/compare_torch-$tag.txt"
  fi
fi
run bar "$cli" bench $quick --workloads bar --repeat 3
run prefill "$cli" bench $quick --workloads fia-prefill --dtypes bf16,fp16 --repeat 3
if grep -q "AMX tile data granted by the OS: yes" "$out/info-$tag.txt"; then
  if [ -x build/tests/test_amx ]; then
    run amx build/tests/test_amx
  else
    echo "amx: the OS grants AMX but build/tests/test_amx is not built (bash scripts/test.sh builds it)" >&2
  fi
fi
echo "done: $out/*-$tag.*"

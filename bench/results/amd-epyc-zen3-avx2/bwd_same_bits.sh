#!/bin/bash
# Byte-for-byte comparison of two attnops CLIs' gradients (dq, dk, dv, dsink) on 18 backward problems, with the
# default (fused) and the forced two-kind ("avx2") scheme, 2 threads. usage: bwd_same_bits.sh OLD_CLI NEW_CLI
# Session 9 (branch s9-bwd 24a2e89 against cf57154): "compared 110 files, 0 differ".
mkdir -p /tmp/cmpbits
OLD=$1; NEW=$2; n=0; bad=0
probs=(
"--q-seqlen 300 --heads 2 --dim 128 --sparse-mode 3"
"--q-seqlen 300 --heads 2 --dim 128 --sparse-mode 2 --kv-seqlen 400"
"--q-seqlen 517 --heads 4 --kv-heads 1 --dim 128 --sparse-mode 3 --dtype bf16"
"--q-seqlen 640 --kv-seqlen 500 --heads 2 --dim 64 --sparse-mode 3 --dtype fp16"
"--q-seqlen 400 --heads 2 --dim 128 --sparse-mode 4 --pre-tokens 100 --next-tokens 30"
"--q-seqlen 400 --heads 2 --dim 80 --sparse-mode 0 --pre-tokens 150 --next-tokens 0"
"--q-seqlen 400 --heads 2 --dim 128 --sparse-mode 0 --pre-tokens 50 --next-tokens 70"
"--q-seqlen 333 --heads 2 --dim 64 --sparse-mode 6"
"--q-seqlen 333 --heads 2 --dim 64 --sparse-mode 5 --mask none"
"--q-seqlen 300 --heads 2 --dim 128 --sparse-mode 3 --sink"
"--q-seqlen 1100 --heads 1 --dim 64 --sparse-mode 3 --dtype bf16"
"--heads 2 --dim 128 --sparse-mode 7 --layout TND --q-seqlens 250,1,0,130,300 --kv-seqlens 250,5,3,129,200"
"--layout TND --q-seqlens 250,1,0,130,300 --kv-seqlens 260,5,3,129,310 --heads 4 --kv-heads 2 --dim 64 --sparse-mode 3"
"--layout TND --q-seqlens 200,77,300 --heads 2 --dim 128 --sparse-mode 8 --dtype bf16"
"--q-seqlen 256 --heads 2 --dim 128"
"--q-seqlen 300 --heads 2 --dim 128 --sparse-mode 3 --pse-type 0"
"--q-seqlen 300 --heads 2 --dim 128 --sparse-mode 3 --keep-prob 0.9"
"--q-seqlen 200 --kv-seqlen 700 --heads 2 --dim 96 --sparse-mode 4 --pre-tokens 300 --next-tokens -100"
)
for impl in default avx2; do
for i in "${!probs[@]}"; do
  pr=${probs[$i]}
  for bin in old new; do
    B=$OLD; [ $bin = new ] && B=$NEW
    rm -rf /tmp/cmpbits/$bin; env $( [ $impl = avx2 ] && echo ATTNOPS_FORCE_IMPL=avx2) $B run flash-attention $pr --backward --threads 2 --save /tmp/cmpbits/$bin > /tmp/cmpbits/$bin.log 2>&1 || { echo "FAIL run $bin $impl $pr"; tail -2 /tmp/cmpbits/$bin.log; }
  done
  for f in dq dk dv dsink; do
    [ -f /tmp/cmpbits/old/$f.npy ] || continue
    n=$((n+1))
    cmp -s /tmp/cmpbits/old/$f.npy /tmp/cmpbits/new/$f.npy || { bad=$((bad+1)); echo "DIFF $impl $f: $pr"; }
  done
done; done
echo "compared $n files, $bad differ"

#!/bin/bash
# Byte-for-byte comparison of two attnops CLIs' forward outputs (every .npy that --save writes: inputs, attentionOut,
# softmaxMax/softmaxSum, FIA's softmaxLse) on FlashAttentionScore and FusedInferAttentionScore prefill problems, 2 and 1
# threads (THREADS="3 2 1" for others). usage: fwd_same_bits.sh OLD_CLI NEW_CLI. Prints "compared N files, M differ".
OLD=$1; NEW=$2; n=0; bad=0; dir=$(mktemp -d /tmp/fwdbits.XXXXXX)
fa=(
"--q-seqlen 256 --heads 2 --dim 128"
"--q-seqlen 300 --kv-seqlen 130 --heads 2 --dim 128"
"--q-seqlen 241 --kv-seqlen 5 --heads 2 --dim 64"
"--q-seqlen 120 --kv-seqlen 1 --heads 1 --dim 128"
"--q-seqlen 300 --heads 2 --dim 128 --sparse-mode 3"
"--q-seqlen 300 --heads 2 --dim 128 --sparse-mode 2 --kv-seqlen 403"
"--q-seqlen 517 --heads 4 --kv-heads 1 --dim 128 --sparse-mode 3 --dtype bf16"
"--q-seqlen 640 --kv-seqlen 502 --heads 2 --dim 64 --sparse-mode 3 --dtype fp16"
"--q-seqlen 400 --heads 2 --dim 128 --sparse-mode 4 --pre-tokens 100 --next-tokens 30"
"--q-seqlen 400 --heads 2 --dim 80 --sparse-mode 0 --pre-tokens 150 --next-tokens 0"
"--q-seqlen 333 --heads 2 --dim 64 --sparse-mode 6"
"--q-seqlen 333 --heads 2 --dim 64 --sparse-mode 5 --mask none"
"--q-seqlen 300 --heads 2 --dim 128 --sparse-mode 3 --sink"
"--q-seqlen 1100 --heads 1 --dim 64 --sparse-mode 3 --dtype bf16"
"--heads 2 --dim 128 --sparse-mode 7 --layout TND --q-seqlens 250,1,0,130,300 --kv-seqlens 250,5,3,129,200"
"--layout TND --q-seqlens 250,1,0,130,300 --kv-seqlens 261,5,3,129,310 --heads 4 --kv-heads 2 --dim 64 --sparse-mode 3"
"--layout TND --q-seqlens 200,77,300 --heads 2 --dim 128 --sparse-mode 8 --dtype bf16"
"--layout BSH --q-seqlen 257 --heads 3 --dim 128 --dtype bf16"
"--q-seqlen 300 --heads 2 --dim 128 --sparse-mode 3 --pse-type 0"
"--q-seqlen 300 --heads 2 --dim 128 --mask random"
"--q-seqlen 300 --heads 2 --dim 128 --sparse-mode 3 --keep-prob 0.9"
"--q-seqlen 200 --kv-seqlen 701 --heads 2 --dim 96 --sparse-mode 4 --pre-tokens 300 --next-tokens -100"
"--q-seqlen 480 --kv-seqlen 520 --heads 4 --kv-heads 2 --dim 128"
"--layout BSH --q-seqlen 257 --kv-seqlen 300 --heads 3 --dim 128"
"--layout TND --q-seqlens 250,1,0,130,300 --kv-seqlens 261,5,3,129,310 --heads 4 --kv-heads 2 --dim 128"
"--q-seqlen 360 --heads 2 --dim 120 --sparse-mode 3"
"--q-seqlen 241 --heads 2 --dim 128 --dtype bf16"
"--q-seqlen 241 --heads 2 --dim 128 --dtype fp16"
)
fia=(
"--q-seqlen 300 --kv-seqlen 300 --heads 8 --kv-heads 2 --dim 128 --dtype bf16 --sparse-mode 3"
"--q-seqlen 257 --kv-seqlen 390 --heads 4 --kv-heads 4 --dim 64 --dtype fp16"
"--q-seqlen 241 --kv-seqlen 243 --heads 2 --kv-heads 1 --dim 128 --dtype fp16 --sparse-mode 3"
)
run() {  # op args...
  local op=$1; shift
  for th in ${THREADS:-2 1}; do
    for bin in old new; do
      rm -rf "$dir/$bin"; local cli=$OLD; [ $bin = new ] && cli=$NEW
      "$cli" run $op "$@" --threads $th --save "$dir/$bin" > /dev/null 2>&1 || echo "FAILED: $bin $op $* --threads $th"
    done
    for f in "$dir"/old/*.npy; do
      n=$((n + 1))
      cmp -s "$f" "$dir/new/$(basename "$f")" || { bad=$((bad + 1)); echo "DIFFER: $op $* --threads $th $(basename "$f")"; }
    done
  done
}
for pr in "${fa[@]}"; do run flash-attention $pr; done
for pr in "${fia[@]}"; do run fused-infer-attention $pr; done
echo "compared $n files, $bad differ"
rm -rf "$dir"

#!/usr/bin/env bash
# Smoke test of the attnops command-line tool: every command once, the --save / --load --compare
# round trips (attention forward, attention --backward, block-attention-residuals forward and
# backward), and compares that must fail on corrupted outputs and gradients. Reports every
# failure and exits non-zero if there was one.
# Usage: smoke.sh [path/to/attnops]   (default: build/tools/cli/attnops)
set -u

cli=${1:-build/tools/cli/attnops}
[ -x "$cli" ] || { echo "smoke: $cli is not an executable (pass the attnops binary)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

# expect STATUS DESCRIPTION PATTERN -- COMMAND...: runs COMMAND, requires exit status STATUS and,
# unless PATTERN is empty, a line of its output (stdout and stderr) matching PATTERN.
expect() {
    local want=$1 what=$2 pattern=$3
    shift 4
    local out rc
    out=$("$@" 2>&1)
    rc=$?
    if [ "$rc" -ne "$want" ]; then
        echo "FAIL: $what: exit status $rc, expected $want"
        echo "  command: $*"
        echo "$out" | sed 's/^/  | /' | tail -n 20
        failures=$((failures + 1))
    elif [ -n "$pattern" ] && ! grep -qE -- "$pattern" <<< "$out"; then
        echo "FAIL: $what: no output line matches /$pattern/"
        echo "  command: $*"
        echo "$out" | sed 's/^/  | /' | tail -n 20
        failures=$((failures + 1))
    else
        echo "ok: $what"
    fi
}

# Overwrites the first 64 bytes of an .npy file's data (row 0 of head 0 in every layout, a row
# the check always samples) with 0x7f bytes: huge values in fp32, fp16 (inf) and bf16.
corrupt_npy() {
    local file=$1 header_len
    header_len=$(od -An -tu2 -j8 -N2 "$file" | tr -d ' ')
    head -c 64 /dev/zero | tr '\0' '\177' | dd of="$file" bs=1 seek=$((10 + header_len)) conv=notrunc status=none
}

expect 0 "--version" '^[0-9]+\.[0-9]+\.[0-9]+' -- "$cli" --version
expect 0 "--help" 'Subcommands' -- "$cli" --help
for cmd in info run demo bench "run flash-attention" "run block-attention-residuals" "run fused-infer-attention"; do
    # shellcheck disable=SC2086
    expect 0 "$cmd --help" 'Usage' -- "$cli" $cmd --help
done
expect 0 "info" 'usable cores' -- "$cli" info
expect 0 "info --json" '"usableCores"' -- "$cli" info --json
expect 64 "unknown flag is rejected" 'not expected' -- "$cli" run flash-attention --no-such-flag
expect 64 "missing command" 'subcommand' -- "$cli"

expect 0 "run fp32 BNSD --check" 'PASS' -- "$cli" run flash-attention --check --repeat 2
expect 0 "run bf16 BSND GQA causal --check --json" '"passed": true' -- \
    "$cli" run flash-attention --layout BSND --batch 2 --q-seqlen 100 --kv-seqlen 130 --heads 4 --kv-heads 2 \
    --dtype bf16 --sparse-mode 3 --check --json
expect 0 "run fp16 BSH pse + random mask + sink" 'PASS' -- \
    "$cli" run flash-attention --layout BSH --q-seqlen 64 --dtype fp16 --pse-type 1 --mask random --sink --check
expect 2 "invalid problem reports the library's message" 'ATTNOPS_ERROR_INVALID_ARGUMENT' -- \
    "$cli" run flash-attention --heads 3 --kv-heads 2
expect 2 "keepProb out of range" 'keepProb' -- "$cli" run flash-attention --keep-prob 1.5

# TND from a length file, generated dropout: save, reload, compare.
printf '17 0 64\n200, 1\n33\n' > "$work/lengths.txt"
dir="$work/saved"
expect 0 "run TND @FILE dropout --save" 'saved' -- \
    "$cli" run flash-attention --layout TND --q-seqlens "@$work/lengths.txt" --heads 4 --kv-heads 1 --dim 64 \
    --dtype bf16 --sparse-mode 3 --keep-prob 0.8 --seed 42 --offset 12 --check --save "$dir"
for f in query key value dropMask attenMask attentionOut softmaxMax softmaxSum actualSeqQLen actualSeqKvLen; do
    [ -f "$dir/$f.npy" ] || { echo "FAIL: --save did not write $f.npy"; failures=$((failures + 1)); }
done
# A NULL attenMask means no masking at all (upstream rule): --mask none with a causal mode warns
# once and runs full attention; the saved problem has no attenMask and reproduces it.
ndir="$work/nullmask"
expect 0 "run --sparse-mode 3 --mask none warns" 'attnops warning: sparseMode = 3 with attenMask = NULL' -- \
    "$cli" run flash-attention --layout BNSD --q-seqlen 40 --heads 2 --dim 16 --sparse-mode 3 --mask none --check \
    --backward --save "$ndir"
[ ! -f "$ndir/attenMask.npy" ] || { echo "FAIL: --mask none saved an attenMask"; failures=$((failures + 1)); }
expect 0 "null-mask problem: --load --compare" '^compare: PASS' -- "$cli" run --load "$ndir" --compare
expect 0 "params.json records the generated drop mask" '"dropMaskGenerated": true' -- cat "$dir/params.json"
expect 0 "run --load --compare round trip" '^compare: PASS' -- "$cli" run --load "$dir" --compare
expect 0 "run flash-attention --load --compare --json" '"passed": true' -- \
    "$cli" run flash-attention --load "$dir" --compare --json
expect 2 "problem flags are refused with --load" 'cannot be combined' -- \
    "$cli" run flash-attention --load "$dir" --heads 8
expect 2 "--compare needs --load" 'needs --load' -- "$cli" run flash-attention --compare

cp -r "$dir" "$work/corrupt"
corrupt_npy "$work/corrupt/attentionOut.npy"
expect 1 "compare fails on a corrupted attentionOut" '^compare: FAIL' -- "$cli" run --load "$work/corrupt" --compare
echo garbage > "$work/corrupt/query.npy"
expect 2 "a file that is not NPY is refused" 'not an NPY file' -- "$cli" run --load "$work/corrupt"

# FusedInferAttentionScore: a paged int8 decode (save / load / compare of the cache and block
# table as given), a causal TND prefill, a corrupted output, bad input.
idir="$work/saved-fia"
expect 0 "fia paged int8 decode --check --save" '^check against .*PASS' -- \
    "$cli" run fused-infer-attention --layout BSH --batch 3 --q-seqlen 1 --kv-seqlens 100,37,250 --heads 8 \
    --kv-heads 2 --dim 64 --dtype bf16 --cache BnBsH --block-size 32 --int8-kv --value-quant-mode 1 --lse --check \
    --save "$idir"
for f in query key value blockTable keyAntiquantScale keyAntiquantOffset valueAntiquantScale valueAntiquantOffset \
    actualSeqLengthsKv attentionOut softmaxLse; do
    [ -f "$idir/$f.npy" ] || { echo "FAIL: fia --save did not write $f.npy"; failures=$((failures + 1)); }
done
expect 0 "fia params.json names the op" '"op": "fused-infer-attention"' -- cat "$idir/params.json"
expect 0 "fia run --load --compare round trip" '^compare: PASS' -- "$cli" run --load "$idir" --compare
expect 0 "fia run fused-infer-attention --load --compare --json" '"passed": true' -- \
    "$cli" run fused-infer-attention --load "$idir" --compare --json
expect 0 "fia --json reports KV GB/s and the kernel" '"kvGbPerSecond"' -- \
    "$cli" run fused-infer-attention --load "$idir" --json
expect 0 "fia TND causal prefill, GQA, sink --check" '^check against .*PASS' -- \
    "$cli" run fused-infer-attention --layout TND --q-seqlens 17,0,64,33 --heads 4 --kv-heads 1 --dim 64 \
    --dtype bf16 --sparse-mode 3 --sink --lse --check
expect 0 "fia BNSD NZ int8 per-token decode --check" '^check against .*PASS' -- \
    "$cli" run fused-infer-attention --batch 2 --kv-seqlens 70,129 --heads 8 --kv-heads 2 --cache NZ \
    --block-size 32 --int8-kv --key-quant-mode 1 --value-quant-mode 1 --check
adir="$work/saved-fia-addressing"
expect 0 "fia left padding, BSND_NBSD output --check --save" '^check against .*PASS' -- \
    "$cli" run fused-infer-attention --layout BSND_NBSD --batch 2 --q-seqlen 12 --kv-seqlen 40 --q-seqlens 4,9 \
    --kv-seqlens 30,33 --query-padding 2 --kv-padding 3 --sparse-mode 3 --lse --check --save "$adir"
expect 0 "fia left padding round trip" '^compare: PASS' -- "$cli" run --load "$adir" --compare
expect 2 "fia tensor-list KV with a shared prefix is refused by the library" 'not supported with tensor-list' -- \
    "$cli" run fused-infer-attention --batch 3 --kv-seqlens 30,1,12 --kv-list --prefix-rows 4
expect 0 "fia tensor-list KV --save" '^check against .*PASS' -- \
    "$cli" run fused-infer-attention --layout BSH --batch 3 --q-seqlen 3 --kv-seqlens 30,1,12 --kv-list --lse --check \
    --save "$work/saved-fia-list"
expect 0 "fia tensor-list round trip" '^compare: PASS' -- "$cli" run --load "$work/saved-fia-list" --compare
expect 0 "fia BNSD causal prefill with a shared prefix --check" '^check against .*PASS' -- \
    "$cli" run fused-infer-attention --layout BNSD --batch 2 --q-seqlen 5 --kv-seqlen 20 --prefix-rows 9 --prefix-len 7 \
    --sparse-mode 3 --lse --check
qdir="$work/saved-fia-fullquant"
expect 0 "fia full int8 quant, pse with left padding --check --save" '^check against .*PASS' -- \
    "$cli" run fused-infer-attention --full-quant --layout BSND --batch 2 --q-seqlen 12 --kv-seqlen 40 --q-seqlens 4,9 \
    --kv-seqlens 30,33 --query-padding 2 --kv-padding 3 --pse batch --sparse-mode 3 --dim 32 --lse --check --save "$qdir"
for f in query deqScale1 quantScale1 deqScale2 pseShift attentionOut; do
    [ -f "$qdir/$f.npy" ] || { echo "FAIL: fia --full-quant --save did not write $f.npy"; failures=$((failures + 1)); }
done
expect 0 "fia full int8 quant round trip" '^compare: PASS' -- "$cli" run --load "$qdir" --compare
mdir="$work/saved-fia-mla"
expect 0 "fia decode MLA (rope, value = key) --check --save" '^check against .*PASS' -- \
    "$cli" run fused-infer-attention --layout BSND --batch 2 --kv-seqlens 130,7 --heads 8 --kv-heads 1 --dim 512 \
    --rope-dim 64 --dtype bf16 --cache BnBsH --block-size 64 --lse --check --save "$mdir"
expect 0 "fia MLA --load --compare carries the rope tensors" '^compare: PASS' -- "$cli" run --load "$mdir" --compare
udir="$work/saved-fia-fullquant-u64"
expect 0 "fia full int8 quant with uint64 deq scales --check --save" '^check against .*PASS' -- \
    "$cli" run fused-infer-attention --full-quant --deq-scale-dtype uint64 --layout BNSD --batch 2 --q-seqlen 6 \
    --kv-seqlen 50 --dim 32 --lse --check --save "$udir"
expect 0 "fia uint64 deqScale1 saved as NPY <u8" '' -- grep -aq "'<u8'" "$udir/deqScale1.npy"
expect 0 "fia uint64 deq scales round trip" '^compare: PASS' -- "$cli" run --load "$udir" --compare
qmdir="$work/saved-fia-mla-quant"
expect 0 "fia MLA full quant (int8 query, dequantScaleQuery) --check --save" '^check against .*PASS' -- \
    "$cli" run fused-infer-attention --mla-full-quant --layout BSND --batch 2 --kv-seqlens 130,7 --heads 8 --kv-heads 1 \
    --dim 512 --rope-dim 64 --dtype bf16 --cache NZ --block-size 128 --lse --check --save "$qmdir"
expect 0 "fia MLA full quant params.json has queryQuantMode 3" '"queryQuantMode": 3' -- cat "$qmdir/params.json"
expect 0 "fia MLA full quant round trip" '^compare: PASS' -- "$cli" run --load "$qmdir" --compare
expect 0 "fia pseShift with a paged cache --check" '^check against .*PASS' -- \
    "$cli" run fused-infer-attention --batch 2 --q-seqlen 4 --kv-seqlens 40,9 --heads 4 --kv-heads 2 --cache BnNBsD \
    --block-size 16 --pse batch --check
expect 0 "fia tree mask (sparse mode 9) --check" '^check against .*PASS' -- \
    "$cli" run fused-infer-attention --layout TND --q-seqlens 3,1,4 --kv-seqlens 10,1,20 --heads 4 --kv-heads 2 \
    --dim 32 --sparse-mode 9 --check
cp -r "$idir" "$work/corrupt-fia"
corrupt_npy "$work/corrupt-fia/attentionOut.npy"
expect 1 "fia compare fails on a corrupted attentionOut" '^compare: FAIL' -- \
    "$cli" run --load "$work/corrupt-fia" --compare
expect 2 "fia problem flags are refused with --load" 'cannot be combined' -- \
    "$cli" run fused-infer-attention --load "$idir" --heads 4
expect 2 "fia: a length list that does not match the batch" '--kv-seqlens: 3 lengths for --batch 2' -- \
    "$cli" run fused-infer-attention --batch 2 --kv-seqlens 1,2,3
expect 2 "fia: the library names the broken rule" 'blockSize = 16: must be a multiple of 32' -- \
    "$cli" run fused-infer-attention --cache BnBsH --block-size 16 --int8-kv
expect 2 "fia: a block table narrower than the lengths is the library's to refuse" \
    'actualSeqLengthsKv\[0\] = 100: must be in \[0, 32\]' -- \
    "$cli" run fused-infer-attention --cache BnBsH --block-size 16 --kv-seqlen 100 --max-blocks-per-seq 2 --check
expect 64 "fia: --scale nan is refused, not taken as the default" 'NaN is not a value here' -- \
    "$cli" run fused-infer-attention --scale nan --check
expect 64 "flash-attention: --scale nan is refused, not taken as the default" 'NaN is not a value here' -- \
    "$cli" run flash-attention --scale nan --check
expect 2 "fia: a sink with full quantisation names the quantisation, not a dtype" 'defined for non-quantised attention only' -- \
    "$cli" run fused-infer-attention --full-quant --q-seqlen 40 --kv-seqlen 100 --sink
expect 2 "flash-attention refuses a fia directory" 'holds op' -- "$cli" run flash-attention --load "$idir"

# FlashAttentionScoreGrad: --backward timing and check, save / load / compare of the gradients.
expect 0 "run --backward fp32 BNSD --check" '^backward check .*dq .*dk .*dv .*PASS' -- \
    "$cli" run flash-attention --backward --check --repeat 2
expect 0 "run --backward --json reports the FLOP convention" '"flopsNote": "2.5 x' -- \
    "$cli" run flash-attention --backward --layout BSH --q-seqlen 48 --kv-seqlen 80 --dtype fp16 --json
expect 0 "run --backward bf16 GQA pse + dropout --check" 'backward check .*PASS' -- \
    "$cli" run flash-attention --backward --layout BSND --batch 2 --q-seqlen 40 --heads 4 --kv-heads 2 \
    --dtype bf16 --pse-type 1 --keep-prob 0.9 --seed 5 --check
expect 0 "run --backward --check-sequences samples sequences" '2 of 6 sequences \(evenly spaced\).*PASS' -- \
    "$cli" run flash-attention --backward --layout TND --q-seqlens "@$work/lengths.txt" --heads 2 --dim 32 \
    --check --check-sequences 2
bdir="$work/saved-backward"
expect 0 "run TND GQA sink --backward --save" 'saved 15 ' -- \
    "$cli" run flash-attention --layout TND --q-seqlens "@$work/lengths.txt" --heads 4 --kv-heads 2 --dim 64 \
    --dtype bf16 --sparse-mode 3 --sink --backward --check --save "$bdir"
for f in dy dq dk dv dsink; do
    [ -f "$bdir/$f.npy" ] || { echo "FAIL: --backward --save did not write $f.npy"; failures=$((failures + 1)); }
done
expect 0 "params.json records the backward" '"backward": true' -- cat "$bdir/params.json"
expect 0 "run --load --compare of a backward save" '^compare: PASS' -- "$cli" run --load "$bdir" --compare
expect 0 "compare covers each gradient" '^  dsink .*attnops vs file' -- "$cli" run --load "$bdir" --compare
expect 0 "run flash-attention --load --compare --json (backward)" '"dq": \{' -- \
    "$cli" run flash-attention --load "$bdir" --compare --json
cp -r "$bdir" "$work/corrupt-dq"
corrupt_npy "$work/corrupt-dq/dq.npy"
expect 1 "compare fails on a corrupted dq" '^ +dq: max error' -- "$cli" run --load "$work/corrupt-dq" --compare
# fp16: the 0x7f bytes are NaNs.
hdir="$work/saved-backward-fp16"
expect 0 "run fp16 BSND --backward --save" 'saved' -- \
    "$cli" run flash-attention --layout BSND --batch 2 --q-seqlen 33 --heads 2 --dtype fp16 --backward --save "$hdir"
cp -r "$hdir" "$work/corrupt-dv"
corrupt_npy "$work/corrupt-dv/dv.npy"
expect 1 "compare fails on a NaN-corrupted fp16 dv" '^compare: FAIL' -- "$cli" run --load "$work/corrupt-dv" --compare
rm "$work/corrupt-dv/dy.npy"
sed -i 's/"backward": true/"backward": false/' "$work/corrupt-dv/params.json"
sed -i '/"dy": {/,/}/d' "$work/corrupt-dv/params.json"
expect 2 "gradients without dy.npy are refused" 'no dy.npy' -- "$cli" run --load "$work/corrupt-dv" --compare

# BlockAttentionResiduals: forward, backward, strided source-major blockRes, save / load / compare.
expect 0 "bar forward fp32 --check" '^check against .*PASS' -- "$cli" run block-attention-residuals --check
expect 0 "bar bf16 source-major --backward --check --json" '"gbPerSecond"' -- \
    "$cli" run block-attention-residuals --tokens 70 --blocks 3 --hidden 160 --dtype bf16 --source-major \
    --backward --check --json --repeat 2
expect 0 "bar w=0 [1,H] projWeight fp16 --backward --check" '^backward check .*PASS' -- \
    "$cli" run block-attention-residuals --tokens 33 --blocks 2 --hidden 96 --dtype fp16 --zero-proj-weight \
    --proj-weight-2d --backward --check
expect 2 "bar invalid problem reports the library's message" 'ATTNOPS_ERROR' -- \
    "$cli" run block-attention-residuals --blocks 0
rdir="$work/saved-bar"
expect 0 "bar bf16 source-major --backward --save" 'saved 12 ' -- \
    "$cli" run block-attention-residuals --tokens 50 --blocks 4 --hidden 128 --dtype bf16 --source-major \
    --backward --check --save "$rdir"
for f in partialBlock blockRes projWeight normWeight hiddenStates invNorm probs gradHiddenStates \
    gradPartialBlock gradBlockRes gradProjWeight gradNormWeight; do
    [ -f "$rdir/$f.npy" ] || { echo "FAIL: bar --save did not write $f.npy"; failures=$((failures + 1)); }
done
expect 0 "bar params.json names the op" '"op": "block-attention-residuals"' -- cat "$rdir/params.json"
expect 0 "bar blockRes is saved in its logical [T,N,H] shape" '^ +50,$' -- \
    python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['tensors']['blockRes']['shape'], indent=1))" \
    "$rdir/params.json"
expect 0 "bar run --load --compare round trip" '^compare: PASS' -- "$cli" run --load "$rdir" --compare
expect 0 "bar run block-attention-residuals --load --compare --json" '"passed": true' -- \
    "$cli" run block-attention-residuals --load "$rdir" --compare --json
expect 2 "bar problem flags are refused with --load" 'cannot be combined' -- \
    "$cli" run block-attention-residuals --load "$rdir" --tokens 3
expect 2 "flash-attention refuses a bar directory" 'holds op' -- "$cli" run flash-attention --load "$rdir"
fdir="$work/saved-bar-forward"
expect 0 "bar fp32 forward-only --save" 'saved 5 ' -- \
    "$cli" run block-attention-residuals --tokens 20 --blocks 2 --hidden 64 --save "$fdir"
expect 0 "bar forward-only round trip" '^compare: PASS' -- "$cli" run --load "$fdir" --compare
for f in gradBlockRes hiddenStates invNorm; do
    cp -r "$rdir" "$work/corrupt-bar-$f"
    corrupt_npy "$work/corrupt-bar-$f/$f.npy"
    expect 1 "bar compare fails on a corrupted $f" '^compare: FAIL' -- \
        "$cli" run --load "$work/corrupt-bar-$f" --compare
done

expect 0 "demo --quick (attention, residuals, serving)" '^check: .*serving .*: PASS; against the double reference: PASS' -- "$cli" demo --quick

expect 0 "bench --list" '^tnd-100000-short-causal' -- "$cli" bench --list
expect 0 "bench --quick, one workload, both directions" '^bnsd-s512-d128 +fp32 +bwd +[a-z0-9-]+ .*TFLOP/s' -- \
    "$cli" bench --quick --workloads bnsd-s512-d128,bar --dtypes fp32 --repeat 1 --warmup 0 --no-peaks
expect 0 "bench --json with peaks" '"ratioToPeak"' -- \
    "$cli" bench --quick --workloads bar --dtypes bf16 --directions fwd --repeat 1 --json
expect 0 "bench --quick, decode with bf16 and int8 KV" '^decode-b32-s512-int8kv +i8kv +fwd .*GB/s.*x bf16 KV' -- \
    "$cli" bench --quick --workloads decode-b32 --repeat 1 --warmup 0 --no-peaks
expect 2 "bench: unknown workload" 'matched no workload' -- "$cli" bench --workloads no-such-workload
expect 2 "bench: a pattern of the full shapes with --quick" "'bnsd-s4096-d128' matched no workload of the catalogue with --quick shapes" -- "$cli" bench --quick --workloads bnsd-s512-d128,bnsd-s4096-d128

if [ "$failures" -ne 0 ]; then
    echo "smoke: $failures failure(s)"
    exit 1
fi
echo "smoke: all passed"

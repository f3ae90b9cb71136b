// The attnops command-line tool: `info`, `run [flash-attention|block-attention-residuals|fused-infer-attention]`, `demo` and `bench`.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <exception>

#include "attnops/attnops.h"
#include "bar_cmd.hpp"
#include "bench.hpp"
#include "commands.hpp"
#include "fia_cmd.hpp"
#include "flash_attention_cmd.hpp"
#include "runner.hpp"

int main(int argc, char** argv) {
    using namespace attnops::cli;
    CLI::App app{
        "attnops: fused transformer attention operators with the semantics of CANN's FlashAttentionScore, "
        "on CPUs."};
    app.set_version_flag("--version", attnopsVersion());
    app.require_subcommand(1);
    app.footer(
        "Exit status: 0 success; 1 a reference check or a compare failed; 2 invalid problem, library error or "
        "unreadable input; 64 bad command line.");

    bool infoJson = false;
    CLI::App* info = app.add_subcommand("info",
                                        "Version, CPU features (AVX-512, AMX and whether the OS grants it), "
                                        "devices, usable cores and caches");
    info->add_flag("--json", infoJson, "Print JSON");

    RunOptions runOptions;
    CLI::App* run = app.add_subcommand("run", "Run an operator on a described problem, or on tensors saved by --save");
    addRunOptions(*run, runOptions);
    run->require_subcommand(0, 1);
    run->footer(
        "`attnops run --load DIR` runs the operator named in DIR/params.json. DIR holds one .npy per tensor, named as "
        "the API argument (query, key, value, realShift, dropMask, attenMask, sink, attentionOut, softmaxMax, "
        "softmaxSum; int64 arrays actualSeqQLen, actualSeqKvLen (cumulative), prefix, qStartIdx, kvStartIdx), and "
        "params.json: {\"op\": \"flash-attention\", \"layout\", \"headNum\" (required), \"scale\", \"keepProb\", "
        "\"preTokens\", \"nextTokens\", \"sparseMode\", \"pseType\", \"seed\", \"offset\", \"innerPrecise\" (C API "
        "defaults when absent), \"tensors\": {name: {\"dtype\", \"shape\"}}}. .npy dtypes: <f4 fp32, <f2 fp16, <u2 "
        "bf16 bits (say \"bf16\" in params.json), |u1 or |b1 masks, <i8 or <i4 int arrays, <u8 uint64 deq scales (fused-infer-attention full quant). A backward call adds "
        "dy, dq, dk, dv (dsink) and \"backward\": true. block-attention-residuals: partialBlock, blockRes (its "
        "logical [T,N,H] shape), projWeight, normWeight, hiddenStates, invNorm, probs, gradHiddenStates, "
        "gradPartialBlock, gradBlockRes, gradProjWeight, gradNormWeight; params.json: {\"op\": "
        "\"block-attention-residuals\", \"eps\", \"validBlockNum\", \"needBackward\", \"backward\", "
        "\"blockResLayout\": \"token-major\"|\"source-major\", \"tensors\"}. fused-infer-attention: query, key, value (a paged "
        "cache as it is), blockTable (int32 <i4), attenMask, keyAntiquantScale/Offset, valueAntiquantScale/Offset (int8 "
        "caches: |i1; int4: int32 containers <i4), antiquantScale/Offset (the combined style), quantScale2/Offset2 (int8 "
        "attentionOut), learnableSink, pseShift, queryRope, keyRope (MLA), keySharedPrefix, valueSharedPrefix, key_<i>/"
        "value_<i> (tensor lists), attentionOut, softmaxLse; int64 arrays actualSeqLengths, actualSeqLengthsKv (as "
        "passed: TND cumulative, paged KV per batch), queryPaddingSize, kvPaddingSize, actualSharedPrefixLen; "
        "params.json: {\"op\": \"fused-infer-attention\", \"inputLayout\", "
        "\"numHeads\" (required), \"numKeyValueHeads\", \"scaleValue\" (1.0 when absent), \"preTokens\", \"nextTokens\", "
        "\"sparseMode\", \"blockSize\", \"softmaxLseFlag\", \"antiquantMode\", \"keyAntiquantMode\", "
        "\"valueAntiquantMode\", \"keyCount\", \"tensors\"}.");

    FaFlags faFlags;
    CLI::App* runFa = run->add_subcommand(
        "flash-attention",
        "FlashAttentionScore forward (and with --backward FlashAttentionScoreGrad) on deterministic random inputs (or "
        "--load DIR): time, GFLOP/s (mask-aware; the backward counts 2.5 x the forward's FLOPs), --check against the "
        "double reference, --save");
    addRunOptions(*runFa, runOptions);
    addFlashAttentionFlags(*runFa, faFlags);

    BarFlags barFlags;
    CLI::App* runBar = run->add_subcommand(
        "block-attention-residuals",
        "BlockAttentionResiduals forward (and with --backward its grad) on deterministic random inputs (or --load "
        "DIR): time, GB/s of compulsory traffic (spec section 5), --check against the double reference, --save");
    addRunOptions(*runBar, runOptions, false);
    addBlockAttentionResidualsFlags(*runBar, barFlags);

    FiaFlags fiaFlags;
    CLI::App* runFia = run->add_subcommand(
        "fused-infer-attention",
        "FusedInferAttentionScore (V4) on deterministic random inputs (or --load DIR): layouts, GQA, actual lengths, "
        "sparse modes 0-4 and 9, paged caches (BnBsH, BnNBsD, NZ), int8/int4 KV, int8 output, pse, MLA rope, left padding, "
        "shared prefix, tensor lists, lse, sink; time, GB/s of KV read, TFLOP/s, "
        "--check against the double reference (every row), --save");
    addRunOptions(*runFia, runOptions, false);
    addFusedInferAttentionFlags(*runFia, fiaFlags);

    DemoOptions demoOptions;
    CLI::App* demo = app.add_subcommand(
        "demo",
        "A realistic packed varlen batch (thousands of sequences, GQA, D=128, bf16, causal) forward, its backward "
        "on a sampled subset of the sequences, a BlockAttentionResiduals forward + backward (T=8192 N=8 H=4096 "
        "bf16), and serving (32 requests: FusedInferAttentionScore causal prefill, then token-by-token decode from "
        "paged bf16 and int8 caches); timed and checked against the reference");
    addDemoOptions(*demo, demoOptions);

    BenchOptions benchOptions;
    CLI::App* bench = app.add_subcommand(
        "bench",
        "The benchmark catalogue (BNSD, GQA, D=64/256, packed TND, 100,000 short sequences, BlockAttentionResiduals) per "
        "dtype and direction: median time, TFLOP/s or GB/s, the implementation that ran, and the ratio to this "
        "machine's fp32 FMA, bf16 dot-product and DRAM read peaks measured in the same run");
    addBenchOptions(*bench, benchOptions);

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? kExitOk : kExitUsage;  // --help and --version exit 0
    }
    try {
        if (*info) return runInfo(infoJson);
        if (*runFa) return runFlashAttention(faFlags, runOptions);
        if (*runBar) return runBlockAttentionResiduals(barFlags, runOptions);
        if (*runFia) return runFusedInferAttention(fiaFlags, runOptions);
        if (*run) return runLoaded(runOptions);
        if (*demo) return runDemo(demoOptions);
        if (*bench) return runBench(benchOptions);
    } catch (const std::exception& e) {
        fmt::print(stderr, "error: {}\n", e.what());
        return kExitError;
    }
    return kExitOk;
}

// `attnops run fused-infer-attention`: problem flags -> FiaProblem (validated so that the input
// generator never writes outside its tensors), or a saved directory -> FiaInstance; then time,
// check, compare and save.
#include "fia_cmd.hpp"

#include <fmt/format.h>

#include <optional>

#include "runner.hpp"

namespace attnops::cli {
namespace {

using nlohmann::json;
using tools::FiaCheck;
using tools::FiaInstance;
using tools::FiaProblem;

constexpr const char* kBytesNote =
    "KV read: every key and value of the actual lengths once per kv head (int8: 1 byte per element plus "
    "per-token scales/offsets; MLA: the key rope too, and decode MLA's key once as key and value)";
constexpr const char* kFlopsNote = "2 (D + rope + Dv) per score the sparse mode keeps, per query head";

attnopsDataType dtypeOf(const std::string& name) {
    if (name == "bf16") return ATTNOPS_BFLOAT16;
    if (name == "fp32") return ATTNOPS_FLOAT32;
    return ATTNOPS_FLOAT16;
}

// Left padding, the shared prefix and tensor lists: what the generator needs to place the rows.
void validateAddressing(const FiaProblem& p) {
    if (p.kvList && p.paged()) throw CliError("--kv-list: a tensor list is not a paged cache (omit --cache)");
    if (p.kvList && p.tnd()) throw CliError("--kv-list: a tensor list needs a batched layout, not " + p.layout);
    if (p.prefixRows < 0) throw CliError(fmt::format("--prefix-rows {} must be >= 0", p.prefixRows));
    if (p.prefixLen >= 0 && p.prefixRows == 0) throw CliError("--prefix-len needs --prefix-rows (the prefix tensors)");
    if ((p.queryPadding >= 0 || p.kvPadding >= 0) && p.tnd())
        throw CliError("--query-padding/--kv-padding: left padding needs a batched layout, not " + p.layout);
    for (int64_t b = 0; b < p.batches() && !p.tnd(); ++b) {
        if (p.queryPadding >= 0 && p.qSeqLen > 1 && p.qSeqLen - p.queryPadding - p.qLen(b) < 0)
            throw CliError(fmt::format("--query-padding {}: batch {}'s {} rows do not fit before it in --q-seqlen {}", p.queryPadding,
                                       b, p.qLen(b), p.qSeqLen));
        if (p.kvPadding >= 0 && p.qSeqLen > 1 && p.kvSeqLen - p.kvPadding - p.kvLen(b) < 0)
            throw CliError(fmt::format("--kv-padding {}: batch {}'s {} rows do not fit before it in --kv-seqlen {}", p.kvPadding, b,
                                       p.kvLen(b), p.kvSeqLen));
    }
}

// The rules the input generator relies on (the library checks everything else and says why).
void validate(const FiaProblem& p) {
    const int64_t batches = p.batches();
    if (p.tnd()) {
        if (p.qLens.empty()) throw CliError("--layout TND needs --q-seqlens (one length per sequence)");
        if (p.kvLens.size() != p.qLens.size())
            throw CliError(fmt::format("--kv-seqlens: {} lengths, but --q-seqlens has {} (one per sequence)",
                                       p.kvLens.size(), p.qLens.size()));
    } else {
        for (const auto& [flag, lens, limit, limitFlag] :
             {std::tuple{"--q-seqlens", &p.qLens, p.qSeqLen, "--q-seqlen"},
              std::tuple{"--kv-seqlens", &p.kvLens, p.paged() ? int64_t(-1) : p.kvSeqLen, "--kv-seqlen"}}) {
            if (!lens->empty() && lens->size() != 1 && int64_t(lens->size()) != batches)
                throw CliError(fmt::format("{}: {} lengths for --batch {} (give 1 or {})", flag, lens->size(), batches,
                                           batches));
            for (int64_t len : *lens)
                if (limit >= 0 && len > limit)
                    throw CliError(fmt::format("{}: length {} exceeds {} {} (the tensor's rows)", flag, len,
                                               limitFlag, limit));
        }
    }
    if (p.paged()) {
        if (p.blockSize <= 0) throw CliError(fmt::format("--block-size {} must be positive", p.blockSize));
        if (p.vdim() != p.dim) throw CliError("--v-dim: a paged cache holds keys and values of one D (omit --v-dim)");
        const int64_t lanes = p.int8Kv ? 32 : 16;
        if (p.cache == "NZ" && p.dim % lanes != 0)
            throw CliError(fmt::format("--cache NZ: --dim {} must be a multiple of {} (the NZ lanes{})", p.dim, lanes,
                                       p.int8Kv ? " of int8" : ""));
    }
    if (p.fullQuant && p.dtype != ATTNOPS_FLOAT16) throw CliError("--full-quant: the output (--dtype) is fp16");
    if (p.fullQuant && p.mlaFullQuant) throw CliError("--full-quant and --mla-full-quant: pass one of them");
    if (p.mlaFullQuant && (p.dtype != ATTNOPS_BFLOAT16 || p.ropeDim != 64 || p.dim != 512 || !p.paged()))
        throw CliError("--mla-full-quant: needs --dtype bf16 (rope and output), --rope-dim 64, --dim 512 and a paged --cache");
    if (p.mlaFullQuant && (p.int4Kv || p.combinedQuant || p.int8Out))
        throw CliError("--mla-full-quant: not with --int4-kv, --combined-quant or --int8-out");
    if (p.fullQuant && (p.int4Kv || p.combinedQuant)) throw CliError("--full-quant: not with --int4-kv or --combined-quant");
    if (p.int8Kv && p.dtype == ATTNOPS_FLOAT32)
        throw CliError("--int8-kv: the query must be fp16 or bf16 (antiquant scales take the query dtype)");
    if (p.int8Kv && p.int4Kv) throw CliError("--int8-kv and --int4-kv: pass one of them");
    if (p.int4Kv && p.paged()) throw CliError("--int4-kv: int4 key/value cannot be paged (--cache none)");
    if (p.int4Kv && (p.dim % 8 != 0 || p.vdim() % 8 != 0))
        throw CliError(fmt::format("--int4-kv: --dim {} (and --v-dim) must fill whole int32 containers of 8", p.dim));
    if (p.combinedQuant && (!p.quantKv() || p.keyQuantMode != p.valueQuantMode || p.keyQuantMode > 1))
        throw CliError("--combined-quant: needs --int8-kv and equal --key-quant-mode/--value-quant-mode 0 or 1");
    validateAddressing(p);
    if (p.ropeDim > 0 && (p.kvList || p.prefixRows > 0 || p.queryPadding >= 0 || p.kvPadding >= 0))
        throw CliError("--rope-dim: MLA is not combined with --kv-list, --prefix-rows or left padding");
    if (p.int4Kv && p.prefixRows > 0) throw CliError("--int4-kv: not with --prefix-rows (a shared prefix is not int4)");
}

FiaProblem problemFromFlags(const FiaFlags& f) {
    FiaProblem p = f.problem;
    p.dtype = dtypeOf(f.dtype);
    if (p.fullQuant || p.mlaFullQuant) p.int8Kv = true;  // int8 key/value, no (full quant) or per-tensor (MLA) antiquant operands
    p.deqScaleDType = f.deqScaleDType == "uint64" ? ATTNOPS_UINT64 : ATTNOPS_FLOAT32;
    p.quantOffset = !f.noQuantOffset;
    p.outQuantDType = dtypeOf(f.outQuantDType);
    p.outQuantOffset = !f.noOutQuantOffset;
    p.shuffleBlocks = !f.noShuffle;
    if (!f.qSeqLens.empty()) p.qLens = parseLengthList(f.qSeqLens, "--q-seqlens");
    if (!f.kvSeqLens.empty()) p.kvLens = parseLengthList(f.kvSeqLens, "--kv-seqlens");
    if (p.tnd() && f.kvSeqLens.empty()) p.kvLens = p.qLens;
    validate(p);
    return p;
}

json checkJson(const FiaCheck& rc) {
    json j = {{"scope", fmt::format("every row ({})", rc.rows)},
              {"rowsOutsideLengths", rc.emptyRows},
              {"attentionOut", {{"maxAbsError", rc.maxAbsError}, {"tolerance", rc.tolerance}}},
              {"maxAbsNaiveError", rc.maxAbsNaiveError},
              {"passed", rc.passed}};
    if (rc.lseTolerance > 0) j["softmaxLse"] = {{"maxAbsError", rc.maxLseError}, {"tolerance", rc.lseTolerance}};
    if (!rc.firstFailure.empty()) j["failure"] = rc.firstFailure;
    return j;
}

std::string checkText(const FiaCheck& rc, bool lse) {
    std::string line = fmt::format("every row ({}, and {} rows outside the lengths): attentionOut max abs error {:.3g} "
                                   "vs tolerance {:.3g} (naive low precision {:.3g})",
                                   rc.rows, rc.emptyRows, rc.maxAbsError, rc.tolerance, rc.maxAbsNaiveError);
    if (lse) line += fmt::format(", softmaxLse {:.3g} vs {:.3g} x (1 + |lse|)", rc.maxLseError, rc.lseTolerance);
    return line + (rc.passed ? ": PASS" : ": FAIL -- " + rc.firstFailure);
}

int runInstance(FiaInstance& inst, const RunOptions& o, const std::string& source) {
    if (o.backward) throw CliError("--backward: FusedInferAttentionScore is an inference operator (no grad)");
    const FiaProblem& p = inst.problem;
    const int32_t threads = useThreads(o.threads);
    const Timing timing = timeCalls([&] { return inst.run(); }, o.repeat);
    const std::string implementation = tools::lastImplementation();
    // After a successful call: the lengths are the ones the library accepted.
    const double flops = tools::fiaForwardFlops(p), bytes = tools::fiaKvBytes(p);
    const double ms = timing.median();

    std::optional<FiaCheck> check;
    if (o.check || o.compare) check = tools::checkFia(inst);
    std::optional<FiaComparison> comparison;
    if (o.compare) comparison = compareFusedInferAttention(inst, o.load);
    int saved = 0;
    if (!o.save.empty()) saved = saveFusedInferAttention(inst, o.save);
    const bool passed = (!check || check->passed) && (!comparison || comparison->passed);

    if (o.json) {
        json j = {{"op", kFusedInferAttentionOp},
                  {"source", source},
                  {"problem", p.describe()},
                  {"implementation", implementation},
                  {"threads", threads},
                  {"timing", timingJson(timing)},
                  {"kvBytes", bytes},
                  {"bytesNote", kBytesNote},
                  {"kvGbPerSecond", bytes / (ms * 1e-3) / 1e9},
                  {"flops", flops},
                  {"flopsNote", kFlopsNote},
                  {"tflops", flops / (ms * 1e-3) / 1e12},
                  {"passed", passed}};
        if (check) j["check"] = checkJson(*check);
        if (comparison) j["compare"] = {{"outputs", outputsJson(comparison->outputs)}, {"passed", comparison->passed}};
        if (saved) j["saved"] = {{"dir", o.save}, {"npyFiles", saved}};
        fmt::print("{}\n", j.dump(2));
    } else {
        fmt::print("fused-infer-attention ({}): {}\n", source, p.describe());
        fmt::print("time: {}, {} threads, implementation {}: {:.4g} MB of KV read, {}; {:.4g} TFLOP/s (mask-aware)\n",
                   timingText(timing), threads, implementation, bytes / 1e6, formatBandwidth(bytes, ms),
                   flops / (ms * 1e-3) / 1e12);
        if (check) fmt::print("check against the double reference: {}\n", checkText(*check, p.lse));
        if (comparison)
            fmt::print("compare with {}:\n{}compare: {}\n", o.load, outputsText(comparison->outputs),
                       comparison->passed ? "PASS" : "FAIL");
        if (saved) fmt::print("saved {} .npy files and params.json to {}\n", saved, o.save);
    }
    return passed ? kExitOk : kExitCheckFailed;
}

}  // namespace

void addFusedInferAttentionFlags(CLI::App& cmd, FiaFlags& f) {
    FiaProblem& p = f.problem;
    p.lse = false;  // the API's default (softmaxLseFlag false)
    auto add = [&](CLI::Option* opt) {
        opt->group("Problem");
        f.all.push_back(opt);
        return opt;
    };
    add(cmd.add_option("--layout", p.layout, "inputLayout")
            ->check(CLI::IsMember({"BSH", "BSND", "BNSD", "TND", "NTD", "BNSD_BSND", "BSH_BNSD", "BSND_BNSD", "BSH_NBSD",
                                   "BSND_NBSD", "BNSD_NBSD", "NTD_TND", "TND_NTD"}))
            ->capture_default_str());
    add(cmd.add_option("--batch", p.batch, "Batch B (not TND)")->check(CLI::PositiveNumber)->capture_default_str());
    add(cmd.add_option("--q-seqlen", p.qSeqLen, "Query rows S per batch (not TND; 1 = decode)")
            ->check(CLI::NonNegativeNumber)
            ->capture_default_str());
    add(cmd.add_option("--kv-seqlen", p.kvSeqLen,
                       "KV rows per batch (not TND; paged: every batch's length when --kv-seqlens is absent)")
            ->check(CLI::NonNegativeNumber)
            ->capture_default_str());
    add(cmd.add_option("--q-seqlens", f.qSeqLens,
                       "actualSeqLengths, per batch (one value: every batch), \"3,1,4\" or @FILE; TND: per-sequence "
                       "lengths (passed cumulative)"));
    add(cmd.add_option("--kv-seqlens", f.kvSeqLens,
                       "actualSeqLengthsKv, per batch; TND: per-sequence lengths [default: --q-seqlens] (passed "
                       "cumulative, per batch with a paged cache)"));
    add(cmd.add_option("--heads", p.heads, "numHeads N1")->check(CLI::PositiveNumber)->capture_default_str());
    add(cmd.add_option("--kv-heads", p.kvHeads, "numKeyValueHeads N2 (GQA: N1 a multiple of it)")
            ->check(CLI::PositiveNumber)
            ->capture_default_str());
    add(cmd.add_option("--dim", p.dim, "Head dim D")->check(CLI::PositiveNumber)->capture_default_str());
    add(cmd.add_option("--v-dim", p.vDim, "Value head dim [default: D]")->check(CLI::PositiveNumber));
    add(cmd.add_option("--dtype", f.dtype, "Query / output dtype (and the KV dtype without --int8-kv)")
            ->check(CLI::IsMember({"fp16", "bf16", "fp32"}))
            ->capture_default_str());
    add(cmd.add_option("--scale", p.scale, "scaleValue [default: 1/sqrt(D)]")->check(notNan));
    add(cmd.add_option("--sparse-mode", p.sparseMode, "sparseMode 0-4 (3: causal, bottom-right), 9 (tree mask, generated)")
            ->capture_default_str());
    add(cmd.add_option("--pre-tokens", p.preTokens, "preTokens")->capture_default_str());
    add(cmd.add_option("--next-tokens", p.nextTokens, "nextTokens")->capture_default_str());
    add(cmd.add_option("--mask", p.maskKind,
                       "attenMask: auto (the compressed 2048x2048 mask for modes 2-4, none for mode 0, random for "
                       "mode 1), none, random (a quarter masked, one row fully masked)")
            ->check(CLI::IsMember({"auto", "none", "random"}))
            ->capture_default_str());
    add(cmd.add_option("--cache", p.cache, "Paged KV cache format (none: contiguous key/value in the layout)")
            ->check(CLI::IsMember({"none", "BnBsH", "BnNBsD", "NZ"}))
            ->capture_default_str());
    add(cmd.add_option("--block-size", p.blockSize, "blockSize of the paged cache")->capture_default_str());
    add(cmd.add_option("--max-blocks-per-seq", p.maxBlocksPerSeq,
                       "blockTable columns [default: what the longest sequence needs; fewer: the library refuses "
                       "the call, as it would such a table from an NPU program]")
            ->check(CLI::NonNegativeNumber));
    add(cmd.add_flag("--no-shuffle-blocks", f.noShuffle, "Physical blocks in order (default: a scrambled order)"));
    add(cmd.add_flag("--int8-kv", p.int8Kv, "int8 key/value with antiquant scales (and offsets)"));
    add(cmd.add_option("--key-quant-mode", p.keyQuantMode,
                       "keyAntiquantMode: 0 per channel [N2,D], 1 per token [B,S] fp32, 2 per head [N2], 3 per token and "
                       "head [B,N2,S], 4 per token [blockNum,blockSize], 5 per token and head [blockNum,N2,blockSize]")
            ->check(CLI::Range(0, 5))
            ->capture_default_str());
    add(cmd.add_option("--value-quant-mode", p.valueQuantMode, "valueAntiquantMode: as --key-quant-mode (equal, or 0/1)")
            ->check(CLI::Range(0, 5))
            ->capture_default_str());
    add(cmd.add_flag("--no-quant-offset", f.noQuantOffset, "Scales only (symmetric int8), no antiquant offsets"));
    add(cmd.add_flag("--int4-kv", p.int4Kv, "int4 key/value in int32 containers of eight (decode, not paged, D % 64 == 0)"));
    add(cmd.add_flag("--combined-quant", p.combinedQuant,
                     "The combined style: antiquantScale/antiquantOffset [2,...] = [key, value], antiquantMode = "
                     "--key-quant-mode (0 or 1)"));
    add(cmd.add_flag("--quant-per-tensor", p.quantPerTensor, "Mode 0 with one scale ([1]; combined [2])"));
    add(cmd.add_flag("--full-quant", p.fullQuant,
                     "Full int8 quantisation: int8 query/key/value with deqScale1/quantScale1/deqScale2 (fp32), fp16 output "
                     "(prefill, not paged, D % 32 == 0; implies --int8-kv)"));
    add(cmd.add_option("--deq-scale-dtype", f.deqScaleDType,
                       "--full-quant: deqScale1/deqScale2 as fp32, or uint64 holding the float19 fp32 bits in the low half")
            ->check(CLI::IsMember({"fp32", "uint64"}))
            ->capture_default_str());
    add(cmd.add_flag("--mla-full-quant", p.mlaFullQuant,
                     "MLA full quantisation: int8 query with dequantScaleQuery (fp32 per token and head, queryQuantMode 3), "
                     "int8 key/value with per-tensor fp32 key/valueAntiquantScale, bf16 rope and output (needs --dtype bf16 "
                     "--rope-dim 64 --dim 512 and a paged --cache; implies --int8-kv)"));
    add(cmd.add_flag("--int8-out", p.int8Out, "int8 attentionOut through quantScale2 (and quantOffset2)"));
    add(cmd.add_flag("--out-quant-per-channel", p.outQuantPerChannel, "quantScale2 per channel [N1,Dv] (default: [1])"));
    add(cmd.add_option("--out-quant-dtype", f.outQuantDType, "quantScale2/quantOffset2 dtype")
            ->check(CLI::IsMember({"fp32", "bf16"}))
            ->capture_default_str());
    add(cmd.add_flag("--no-out-quant-offset", f.noOutQuantOffset, "quantScale2 only, no quantOffset2"));
    add(cmd.add_flag("--lse", p.lse, "softmaxLseFlag: also write softmaxLse"));
    add(cmd.add_flag("--sink", p.sink, "learnableSink, one logit per query head"));
    add(cmd.add_option("--query-padding", p.queryPadding,
                       "queryPaddingSize: left padding of the query (valid rows end this many rows before Q_S; needs "
                       "--q-seqlens) [default: not passed]"));
    add(cmd.add_option("--kv-padding", p.kvPadding,
                       "kvPaddingSize: left padding of key/value (needs --kv-seqlens) [default: not passed]"));
    add(cmd.add_option("--prefix-rows", p.prefixRows, "keySharedPrefix/valueSharedPrefix rows prefix_S (0: no shared prefix)")
            ->capture_default_str());
    add(cmd.add_option("--prefix-len", p.prefixLen, "actualSharedPrefixLen (<= --prefix-rows) [default: not passed]"));
    add(cmd.add_flag("--kv-list", p.kvList, "Tensor-list key/value: one tensor per batch, each with its own S"));
    add(cmd.add_option("--pse", p.pse,
                       "pseShift, added to the scores after the scale: none, batch [B,N,Q_S,K] or shared [1,N,Q_S,K] "
                       "(K: KV_S, or maxBlocksPerSeq*blockSize with a paged cache)")
            ->check(CLI::IsMember({"none", "batch", "shared"}))
            ->capture_default_str());
    add(cmd.add_option("--rope-dim", p.ropeDim,
                       "MLA: queryRope/keyRope of this width (64; 0: none). With --dim 512 (decode MLA, --kv-heads 1, "
                       "paged) the value is the key")
            ->check(CLI::IsMember({0, 64}))
            ->capture_default_str());
    add(cmd.add_option("--data-seed", p.dataSeed, "Seed of the random inputs")->capture_default_str());
}

int runFusedInferAttention(const FiaFlags& f, const RunOptions& o) {
    if (!o.load.empty()) {
        for (const CLI::Option* opt : f.all)
            if (opt->count())
                throw CliError(fmt::format("{} cannot be combined with --load: the problem comes from DIR/params.json",
                                           opt->get_name()));
        const json params = readParams(o.load);
        if (params.contains("op") && params["op"] != kFusedInferAttentionOp)
            throw CliError(fmt::format("{}/params.json holds op {}, not {}", o.load, params["op"].dump(),
                                       kFusedInferAttentionOp));
        return runLoadedFusedInferAttention(o, params);
    }
    if (o.compare) throw CliError("--compare needs --load DIR (the outputs to compare with)");
    FiaInstance inst(problemFromFlags(f));
    return runInstance(inst, o, "generated");
}

int runLoadedFusedInferAttention(const RunOptions& o, const json& params) {
    FiaInstance inst = loadFusedInferAttention(o.load, params);
    return runInstance(inst, o, "loaded from " + o.load);
}

}  // namespace attnops::cli

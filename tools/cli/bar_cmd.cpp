// `attnops run block-attention-residuals`: problem flags -> BarProblem, or a saved directory ->
// BarInstance; then time (GB/s of compulsory traffic), check, compare and save.
#include "bar_cmd.hpp"

#include <fmt/format.h>

#include <optional>

#include "peaks.hpp"
#include "runner.hpp"

namespace attnops::cli {
namespace {

using nlohmann::json;
using tools::BarCheck;
using tools::BarInstance;
using tools::BarProblem;

constexpr const char* kForwardBytesNote =
    "compulsory traffic (spec section 5): (K+1)*H*b per token, +8K with invNorm/probs (K = N+1 sources)";
constexpr const char* kBackwardBytesNote = "compulsory traffic (spec section 5): (2K+1)*H*b + 8K per token";

attnopsDataType dtypeOf(const std::string& name) {
    if (name == "fp16") return ATTNOPS_FLOAT16;
    if (name == "bf16") return ATTNOPS_BFLOAT16;
    return ATTNOPS_FLOAT32;
}

std::string scopeOf(int64_t checked, int64_t tokens) {
    return checked >= tokens ? fmt::format("every token ({})", tokens)
                             : fmt::format("{} of {} tokens", checked, tokens);
}

json forwardCheckJson(const BarCheck& rc, int64_t tokens, bool stats) {
    json j = {{"scope", scopeOf(rc.tokens, tokens)},
              {"hiddenStates", {{"maxAbsError", rc.maxAbsError[0]}, {"tolerance", rc.tolerance[0]}}},
              {"maxAbsNaiveError", rc.maxAbsNaiveError},
              {"passed", rc.passed}};
    if (stats) {
        j["invNorm"] = {{"maxRelError", rc.maxAbsError[1]}, {"tolerance", rc.tolerance[1]}};
        j["probs"] = {{"maxAbsError", rc.maxAbsError[2]}, {"tolerance", rc.tolerance[2]}};
    }
    if (!rc.failure.empty()) j["failure"] = rc.failure;
    return j;
}

json backwardCheckJson(const BarCheck& rc, int64_t tokens) {
    json j = {{"scope", scopeOf(rc.tokens, tokens)},
              {"gradPartialBlock", {{"maxAbsError", rc.maxAbsErrorPartial}, {"tolerance", rc.tolerance[0]}}},
              {"gradBlockRes", {{"maxAbsError", rc.maxAbsErrorBlockRes}, {"tolerance", rc.tolerance[0]}}},
              {"weightScope", scopeOf(tokens, tokens)},
              {"gradProjWeight", {{"maxAbsError", rc.maxAbsError[1]}, {"tolerance", rc.tolerance[1]}}},
              {"gradNormWeight", {{"maxAbsError", rc.maxAbsError[2]}, {"tolerance", rc.tolerance[2]}}},
              {"maxAbsNaiveError", rc.maxAbsNaiveError},
              {"passed", rc.passed}};
    if (!rc.failure.empty()) j["failure"] = rc.failure;
    return j;
}

std::string verdict(const BarCheck& rc) {
    return rc.passed ? "PASS" : rc.failure.empty() ? "FAIL" : "FAIL -- " + rc.failure;
}

std::string forwardCheckLine(const BarCheck& rc, int64_t tokens, bool stats) {
    std::string line = fmt::format("{}: hiddenStates max abs error {:.3g} vs tolerance {:.3g}",
                                   scopeOf(rc.tokens, tokens), rc.maxAbsError[0], rc.tolerance[0]);
    if (rc.maxAbsNaiveError > 0) line += fmt::format(" (naive low precision {:.3g})", rc.maxAbsNaiveError);
    if (stats)
        line += fmt::format(", invNorm max rel error {:.3g} vs {:.3g}, probs {:.3g} vs {:.3g}", rc.maxAbsError[1],
                            rc.tolerance[1], rc.maxAbsError[2], rc.tolerance[2]);
    return line + ": " + verdict(rc);
}

std::string backwardCheckLine(const BarCheck& rc, int64_t tokens) {
    std::string line =
        fmt::format("{}: gradPartialBlock max abs error {:.3g}, gradBlockRes {:.3g} vs tolerance {:.3g}",
                    scopeOf(rc.tokens, tokens), rc.maxAbsErrorPartial, rc.maxAbsErrorBlockRes, rc.tolerance[0]);
    if (rc.maxAbsNaiveError > 0) line += fmt::format(" (naive low precision {:.3g})", rc.maxAbsNaiveError);
    line += fmt::format("; every token: gradProjWeight {:.3g} vs {:.3g}, gradNormWeight {:.3g} vs {:.3g}",
                        rc.maxAbsError[1], rc.tolerance[1], rc.maxAbsError[2], rc.tolerance[2]);
    return line + ": " + verdict(rc);
}

int runInstance(BarInstance& inst, bool needBackward, bool backward, const RunOptions& o, const std::string& source) {
    const BarProblem& p = inst.problem;
    const int32_t threads = useThreads(o.threads);
    needBackward = needBackward || backward;
    const Timing timing = timeCalls([&] { return inst.runForward(needBackward); }, o.repeat);
    const double bytes = p.forwardBytes(needBackward);
    std::optional<Timing> backwardTiming;
    if (backward) backwardTiming = timeCalls([&] { return inst.runBackward(); }, o.repeat);
    const double backwardBytes = p.backwardBytes();
    // The ceiling this memory-bound op is judged against, measured in the same run (a 1 GiB
    // buffer: larger than the last-level cache).
    const double dramGbps = tools::measureReadBandwidth(uint64_t(1) << 30, threads);
    const auto ofPeak = [&](double b, double ms) { return b / (ms * 1e-3) / 1e9 / dramGbps; };

    std::optional<BarCheck> check, backwardCheck;
    if (o.check || o.compare) {
        check = tools::checkBarForward(inst, o.checkRows, needBackward);
        if (backward) backwardCheck = tools::checkBarBackward(inst, o.checkRows);
    }
    std::optional<BarComparison> comparison;
    if (o.compare) comparison = compareBlockAttentionResiduals(inst, o.load, o.checkRows, needBackward, backward);
    int saved = 0;
    if (!o.save.empty()) saved = saveBlockAttentionResiduals(inst, o.save, needBackward, backward);
    const bool passed =
        (!check || check->passed) && (!backwardCheck || backwardCheck->passed) && (!comparison || comparison->passed);

    if (o.json) {
        json j = {{"op", kBlockAttentionResidualsOp},
                  {"source", source},
                  {"problem", p.describe()},
                  {"tokens", p.tokens},
                  {"blocks", p.blocks},
                  {"hidden", p.hidden},
                  {"dtype", attnopsDataTypeName(p.dtype)},
                  {"eps", p.eps},
                  {"blockResLayout", p.sourceMajor ? "source-major" : "token-major"},
                  {"needBackward", needBackward},
                  {"threads", threads},
                  {"bytes", bytes},
                  {"bytesNote", kForwardBytesNote},
                  {"timing", timingJson(timing)},
                  {"gbPerSecond", bytes / (timing.median() * 1e-3) / 1e9},
                  {"measuredDramReadGbPerSecond", dramGbps},
                  {"fractionOfMeasuredDram", ofPeak(bytes, timing.median())},
                  {"passed", passed}};
        if (check) j["check"] = forwardCheckJson(*check, p.tokens, needBackward);
        if (backwardTiming) {
            json b = {{"bytes", backwardBytes},
                      {"bytesNote", kBackwardBytesNote},
                      {"timing", timingJson(*backwardTiming)},
                      {"gbPerSecond", backwardBytes / (backwardTiming->median() * 1e-3) / 1e9},
                      {"fractionOfMeasuredDram", ofPeak(backwardBytes, backwardTiming->median())}};
            if (backwardCheck) b["check"] = backwardCheckJson(*backwardCheck, p.tokens);
            j["backward"] = b;
        }
        if (comparison) j["compare"] = {{"outputs", outputsJson(comparison->outputs)}, {"passed", comparison->passed}};
        if (saved) j["saved"] = {{"dir", o.save}, {"npyFiles", saved}};
        fmt::print("{}\n", j.dump(2));
    } else {
        fmt::print("block-attention-residuals ({}): {}{}\n", source, p.describe(),
                   needBackward ? ", needBackward (saves invNorm/probs)" : "");
        fmt::print("time: {}, {} threads, {:.4g} GB of compulsory traffic: {} ({:.0f}% of the {:.1f} GB/s DRAM read "
                   "bandwidth measured in this run)\n",
                   timingText(timing), threads, bytes / 1e9, formatBandwidth(bytes, timing.median()),
                   100 * ofPeak(bytes, timing.median()), dramGbps);
        if (backwardTiming)
            fmt::print("backward time: {}, {:.4g} GB of compulsory traffic: {} ({:.0f}% of measured DRAM read)\n",
                       timingText(*backwardTiming), backwardBytes / 1e9,
                       formatBandwidth(backwardBytes, backwardTiming->median()),
                       100 * ofPeak(backwardBytes, backwardTiming->median()));
        if (check)
            fmt::print("check against the double reference: {}\n", forwardCheckLine(*check, p.tokens, needBackward));
        if (backwardCheck)
            fmt::print("backward check against the double reference, {}\n",
                       backwardCheckLine(*backwardCheck, p.tokens));
        if (comparison)
            fmt::print("compare with {}:\n{}compare: {}\n", o.load, outputsText(comparison->outputs),
                       comparison->passed ? "PASS" : "FAIL");
        if (saved) fmt::print("saved {} .npy files and params.json to {}\n", saved, o.save);
    }
    return passed ? kExitOk : kExitCheckFailed;
}

}  // namespace

void addBlockAttentionResidualsFlags(CLI::App& cmd, BarFlags& f) {
    BarProblem& p = f.problem;
    auto add = [&](CLI::Option* opt) {
        opt->group("Problem");
        f.all.push_back(opt);
        return opt;
    };
    add(cmd.add_option("--tokens", p.tokens, "Tokens T")->check(CLI::NonNegativeNumber)->capture_default_str());
    add(cmd.add_option("--blocks", p.blocks,
                       "Completed blocks N (blockRes [T,N,H]; N+1 sources with the partial block)")
            ->check(CLI::NonNegativeNumber)
            ->capture_default_str());
    add(cmd.add_option("--hidden", p.hidden, "Hidden size H")->check(CLI::NonNegativeNumber)->capture_default_str());
    add(cmd.add_option("--dtype", f.dtype, "dtype of every main tensor (invNorm/probs are fp32)")
            ->check(CLI::IsMember({"fp32", "fp16", "bf16"}))
            ->capture_default_str());
    add(cmd.add_option("--eps", p.eps, "normEps (inside the RMS square root)")->capture_default_str());
    add(cmd.add_flag("--source-major", p.sourceMajor,
                     "blockRes as a strided [T,N,H] view of a source-major [N,T,H] block cache (no copy)"));
    add(cmd.add_flag("--zero-proj-weight", p.zeroProjWeight,
                     "projWeight = 0 (the paper's initialisation: uniform probabilities)"));
    add(cmd.add_flag("--proj-weight-2d", p.projWeight2d, "projWeight of shape [1,H] instead of [H]"));
    add(cmd.add_option("--valid-block-num", p.validBlockNum,
                       "validBlockNum, passed to both calls (reserved; the forward takes -1 or N, the grad -1, 0 or N)")
            ->capture_default_str());
    add(cmd.add_flag("--need-backward", f.needBackward,
                     "Forward with needBackward: also write invNorm/probs (implied by --backward)"));
    add(cmd.add_option("--data-seed", p.dataSeed, "Seed of the random inputs")->capture_default_str());
}

int runBlockAttentionResiduals(const BarFlags& f, const RunOptions& o) {
    if (!o.load.empty()) {
        for (const CLI::Option* opt : f.all)
            if (opt->count())
                throw CliError(fmt::format("{} cannot be combined with --load: the problem comes from DIR/params.json",
                                           opt->get_name()));
        const json params = readParams(o.load);
        if (params.contains("op") && params["op"] != kBlockAttentionResidualsOp)
            throw CliError(fmt::format("{}/params.json holds op {}, not {}", o.load, params["op"].dump(),
                                       kBlockAttentionResidualsOp));
        return runLoadedBlockAttentionResiduals(o, params);
    }
    if (o.compare) throw CliError("--compare needs --load DIR (the outputs to compare with)");
    BarProblem p = f.problem;
    p.dtype = dtypeOf(f.dtype);
    BarInstance inst(p);
    return runInstance(inst, f.needBackward, o.backward, o, "generated");
}

int runLoadedBlockAttentionResiduals(const RunOptions& o, const json& params) {
    LoadedBar loaded = loadBlockAttentionResiduals(o.load, params);
    return runInstance(loaded.inst, loaded.needBackward, loaded.backward || o.backward, o, "loaded from " + o.load);
}

}  // namespace attnops::cli

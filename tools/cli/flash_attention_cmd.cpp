// `attnops run flash-attention`: problem flags -> FaProblem, or a saved directory -> FaInstance;
// then time, check, compare and save.
#include "flash_attention_cmd.hpp"

#include <fmt/format.h>

#include <fstream>
#include <optional>
#include <sstream>

#include "bar_cmd.hpp"
#include "fa_files.hpp"
#include "fia_cmd.hpp"
#include "runner.hpp"

namespace attnops::cli {
namespace {

using nlohmann::json;
using tools::FaGrads;
using tools::FaInstance;
using tools::FaProblem;

const char* const kGradNames[4] = {"dq", "dk", "dv", "dsink"};

json gradCheckJson(const tools::GradCheck& gc, const SequenceSample& sample, bool sink) {
    json j = {{"scope", sample.scope}, {"sequences", sample.sequences.size()}};
    for (int t = 0; t < (sink ? 4 : 3); ++t)
        j[kGradNames[t]] = {{"maxAbsError", gc.maxAbsError[t]},
                            {"tolerance", gc.tolerance[t]},
                            {"maxAbsNaiveError", gc.maxAbsNaiveError[t]},
                            {"maxAbsReference", gc.maxAbsReference[t]}};
    j["passed"] = gc.passed;
    if (!gc.failure.empty()) j["failure"] = gc.failure;
    return j;
}

std::string gradCheckLine(const tools::GradCheck& gc, const SequenceSample& sample, bool sink) {
    std::string line = sample.scope + ":";
    for (int t = 0; t < (sink ? 4 : 3); ++t)
        line +=
            fmt::format("{} {} {:.3g} vs {:.3g}", t == 0 ? "" : ",", kGradNames[t], gc.maxAbsError[t], gc.tolerance[t]);
    line += gc.passed ? ": PASS" : ": FAIL";
    if (!gc.passed && !gc.failure.empty()) line += " -- " + gc.failure;
    return line;
}

// Integers separated by commas and/or whitespace.
std::vector<int64_t> parseIntList(const std::string& text, const std::string& what, bool allowNegative) {
    std::string body = text;
    std::string source = what;
    if (!text.empty() && text[0] == '@') {
        std::ifstream in(text.substr(1));
        if (!in) throw CliError(fmt::format("{}: cannot open {}", what, text.substr(1)));
        std::ostringstream all;
        all << in.rdbuf();
        body = all.str();
        source = fmt::format("{} ({})", what, text.substr(1));
    }
    for (char& c : body)
        if (c == ',') c = ' ';
    std::istringstream in(body);
    std::vector<int64_t> values;
    std::string token;
    while (in >> token) {
        size_t used = 0;
        int64_t v = 0;
        try {
            v = std::stoll(token, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (used != token.size())
            throw CliError(fmt::format("{}: \"{}\" (entry {}) is not an integer", source, token, values.size() + 1));
        if (v < 0 && !allowNegative)
            throw CliError(fmt::format("{}: entry {} is {}; lengths must be >= 0", source, values.size() + 1, v));
        values.push_back(v);
    }
    return values;
}

attnopsDataType dtypeOf(const std::string& name) {
    if (name == "fp16") return ATTNOPS_FLOAT16;
    if (name == "bf16") return ATTNOPS_BFLOAT16;
    return ATTNOPS_FLOAT32;
}

FaProblem problemFromFlags(const FaFlags& f) {
    FaProblem p = f.problem;
    p.dtype = dtypeOf(f.dtype);
    if (!f.kvSeqLen->count()) p.kvSeqLen = p.qSeqLen;
    if (!f.kvHeads->count()) p.kvHeads = p.heads;
    if (p.tnd()) {
        if (f.qSeqLens.empty()) throw CliError("--layout TND needs --q-seqlens (per-sequence lengths, or @FILE)");
        if (f.batch->count() || f.qSeqLen->count() || f.kvSeqLen->count())
            throw CliError(
                "--batch, --q-seqlen and --kv-seqlen describe fixed layouts; TND takes --q-seqlens/--kv-seqlens");
        p.qSeqLens = parseLengthList(f.qSeqLens, "--q-seqlens");
        p.kvSeqLens = f.kvSeqLens.empty() ? p.qSeqLens : parseLengthList(f.kvSeqLens, "--kv-seqlens");
        if (p.qSeqLens.size() != p.kvSeqLens.size())
            throw CliError(fmt::format("--q-seqlens has {} entries and --kv-seqlens {}: give one pair per sequence",
                                       p.qSeqLens.size(), p.kvSeqLens.size()));
    } else if (!f.qSeqLens.empty() || !f.kvSeqLens.empty()) {
        throw CliError("--q-seqlens/--kv-seqlens describe the TND layout; add --layout TND");
    }
    if (!f.prefix.empty()) p.prefix = parseIntList(f.prefix, "--prefix", true);
    return p;
}

// grads: the backward's tensors for a backward run (null: forward only).
int runInstance(FaInstance& inst, FaGrads* grads, const RunOptions& o, const std::string& source) {
    const int32_t threads = useThreads(o.threads);
    const Timing timing = timeForward(inst, o.repeat);
    const std::string implementation = tools::lastImplementation();
    if (inst.problem.prefix.empty()) inst.problem.prefix = inst.prefix;  // generated: count it in the FLOPs
    const double flops = inst.problem.forwardFlops();
    const double backwardFlops = kBackwardFlopFactor * flops;
    std::optional<Timing> backwardTiming;
    if (grads != nullptr) backwardTiming = timeCalls([&] { return tools::runBackward(inst, *grads); }, o.repeat);
    const std::string backwardImplementation = grads != nullptr ? tools::lastImplementation() : "";
    const bool sink = !inst.sink.empty();

    std::optional<tools::RowCheck> check;
    if (o.check || o.compare) check = tools::checkForwardRows(inst, o.checkRows);
    SequenceSample sample;
    if (grads != nullptr) sample = backwardSample(inst.problem, o.checkSequences);
    std::optional<tools::GradCheck> gradCheck;
    if (grads != nullptr && (o.check || o.compare))
        gradCheck = tools::checkBackwardSequences(inst, *grads, sample.sequences);
    std::optional<Comparison> comparison;
    if (o.compare) comparison = compareOutputs(inst, o.load, o.checkRows, grads, sample.sequences, sample.scope);
    int saved = 0;
    if (!o.save.empty()) saved = saveFlashAttention(inst, o.save, grads);
    const bool passed =
        (!check || check->passed) && (!gradCheck || gradCheck->passed) && (!comparison || comparison->passed);

    if (o.json) {
        json j = {{"op", kFlashAttentionOp},
                  {"source", source},
                  {"problem", inst.problem.describe()},
                  {"threads", threads},
                  {"implementation", implementation},
                  {"flops", flops},
                  {"timing", timingJson(timing)},
                  {"gflops", flops / (timing.median() * 1e-3) / 1e9},
                  {"passed", passed}};
        if (check) j["check"] = checkJson(*check);
        if (backwardTiming) {
            json b = {{"implementation", backwardImplementation},
                      {"flops", backwardFlops},
                      {"flopsNote", kBackwardFlopNote},
                      {"timing", timingJson(*backwardTiming)},
                      {"gflops", backwardFlops / (backwardTiming->median() * 1e-3) / 1e9}};
            if (gradCheck) b["check"] = gradCheckJson(*gradCheck, sample, sink);
            j["backward"] = b;
        }
        if (comparison) j["compare"] = comparisonJson(*comparison);
        if (saved) j["saved"] = {{"dir", o.save}, {"npyFiles", saved}};
        fmt::print("{}\n", j.dump(2));
    } else {
        fmt::print("flash-attention ({}): {}\n", source, inst.problem.describe());
        fmt::print("time: {}, {} threads, {}, {:.4g} GFLOP (mask-aware): {}\n", timingText(timing), threads,
                   implementation, flops / 1e9, formatRate(flops, timing.median()));
        if (backwardTiming)
            fmt::print("backward time: {}, {}, {:.4g} GFLOP ({}): {}\n", timingText(*backwardTiming),
                       backwardImplementation, backwardFlops / 1e9, kBackwardFlopNote,
                       formatRate(backwardFlops, backwardTiming->median()));
        if (check) fmt::print("check against the double reference: {}\n", checkLine(*check));
        if (gradCheck)
            fmt::print("backward check against the double reference, {}\n", gradCheckLine(*gradCheck, sample, sink));
        if (comparison)
            fmt::print("compare with {}:\n{}compare: {}\n", o.load, comparisonText(*comparison),
                       comparison->passed ? "PASS" : "FAIL");
        if (saved) fmt::print("saved {} .npy files and params.json to {}\n", saved, o.save);
    }
    return passed ? kExitOk : kExitCheckFailed;
}

int runLoadedFlashAttention(const RunOptions& o, const json& params) {
    FaInstance inst = loadFlashAttention(o.load, params);
    if (!o.backward && !savedBackward(o.load, params)) return runInstance(inst, nullptr, o, "loaded from " + o.load);
    FaGrads grads = loadGradients(inst, o.load, params);
    return runInstance(inst, &grads, o, "loaded from " + o.load);
}

}  // namespace

std::vector<int64_t> parseLengthList(const std::string& text, const std::string& what) {
    return parseIntList(text, what, false);
}

namespace {

// The dense work of the double reference backward of a sequence (it evaluates every score).
double referenceCost(const FaProblem& p, int64_t b) {
    return 2.0 * double(p.qLen(b)) * double(p.kvLen(b)) * double(p.heads) * double(p.dim + p.vdim());
}

// Above this much reference work (about a few seconds of the double reference), --check compares
// the gradients on a sample of the sequences.
constexpr double kBackwardCheckBudget = 4e8;
constexpr int64_t kSampleCandidates = 64;

}  // namespace

SequenceSample backwardSample(const FaProblem& p, int64_t requested) {
    const int64_t count = p.sequenceCount();
    SequenceSample s;
    double total = 0;
    for (int64_t b = 0; b < count; ++b) total += referenceCost(p, b);
    if (requested < 0 || (requested == 0 && total <= kBackwardCheckBudget) || requested >= count) {
        for (int64_t b = 0; b < count; ++b) s.sequences.push_back(b);
    } else if (requested > 0) {
        for (int64_t i = 0; i < requested; ++i) s.sequences.push_back(i * count / requested);
    } else {
        const int64_t candidates = std::min(count, kSampleCandidates);
        double used = 0;
        for (int64_t i = 0; i < candidates; ++i) {
            const int64_t b = i * count / candidates;
            const double cost = referenceCost(p, b);
            if (!s.sequences.empty() && used + cost > kBackwardCheckBudget) continue;
            s.sequences.push_back(b);
            used += cost;
        }
    }
    const int64_t n = int64_t(s.sequences.size());
    const char* unit = p.tnd() ? "sequence" : "batch";
    const char* plural = count == 1 ? "" : p.tnd() ? "s" : "es";
    s.scope = n == count ? fmt::format("all {} {}{}", count, unit, plural)
                         : fmt::format("{} of {} {}{} ({})", n, count, unit, plural,
                                       requested > 0 ? "evenly spaced" : "evenly spaced within the check's budget");
    return s;
}

void addRunOptions(CLI::App& cmd, RunOptions& o, bool attention) {
    cmd.add_option("--load", o.load,
                   "Run the call saved in DIR by --save (or written by hand: params.json and .npy files)")
        ->type_name("DIR");
    cmd.add_flag("--compare", o.compare,
                 "With --load: compare every output file in DIR (attention: attentionOut/softmaxMax/softmaxSum, with "
                 "a backward dq/dk/dv/dsink; block-attention-residuals: hiddenStates/invNorm/probs and the grad* "
                 "files) with ours (max abs/rel error, cosine) and check the file's values against the double "
                 "reference with the tolerance rule; exit 1 if one fails");
    cmd.add_flag("--backward", o.backward,
                 "Also run the backward (FlashAttentionScoreGrad with a random dy; BlockAttentionResidualsGrad with a "
                 "random gradHiddenStates) after the forward: time, --check, --save of the gradients. Implied by "
                 "--load of a directory saved with --backward");
    cmd.add_option("--save", o.save,
                   "Write every input and output (.npy, named as the API argument; with --backward the gradients "
                   "too) and params.json to DIR")
        ->type_name("DIR");
    cmd.add_flag("--check", o.check,
                 "Check against the double-precision reference under the tolerance rule (sampled attention rows; "
                 "with --backward the gradients of all or sampled sequences; sampled block-attention-residuals "
                 "tokens and its weight gradients); exit 1 if it fails");
    cmd.add_option("--check-rows", o.checkRows,
                   "Rows (attention) or tokens (block-attention-residuals) sampled by --check and --compare (-1: "
                   "all)")
        ->check(CLI::Validator(
            [](std::string& text) {
                int64_t v = 0;
                return CLI::detail::lexical_cast(text, v) && v >= -1 ? std::string() : "must be an integer >= -1";
            },
            "INT>=-1"))
        ->capture_default_str();
    if (attention)
        cmd.add_option("--check-sequences", o.checkSequences,
                       "Sequences (batches) whose gradients --check and --compare compare with the reference "
                       "backward (-1: all; N: N evenly spaced) [default: all when the reference's dense work "
                       "(2 S1 S2 N1 (D+Dv) summed) is at most 4e8, else evenly spaced ones within that; dsink is "
                       "always checked over every sequence]")
            ->check(CLI::Validator(
                [](std::string& text) {
                    int64_t v = 0;
                    return CLI::detail::lexical_cast(text, v) && v >= -1 ? std::string() : "must be an integer >= -1";
                },
                "INT>=-1"));
    cmd.add_flag("--json", o.json, "Print one JSON object instead of text");
    cmd.add_option("--repeat", o.repeat, "Timed runs after one warm-up; the median is reported")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    cmd.add_option(
           "--threads", o.threads,
           "Worker threads of device 0 (attnopsSetDeviceThreads); default: ATTNOPS_NUM_THREADS or all usable cores")
        ->check(CLI::PositiveNumber);
}

void addFlashAttentionFlags(CLI::App& cmd, FaFlags& f) {
    FaProblem& p = f.problem;
    auto add = [&](CLI::Option* opt) {
        opt->group("Problem");
        f.all.push_back(opt);
        return opt;
    };
    const auto nonNegative = CLI::NonNegativeNumber;
    add(cmd.add_option("--layout", p.layout, "inputLayout")
            ->transform(CLI::IsMember({"BSH", "SBH", "BSND", "BNSD", "TND"}, CLI::ignore_case))
            ->capture_default_str());
    f.batch =
        add(cmd.add_option("--batch", p.batch, "Batch B (fixed layouts)")->check(nonNegative)->capture_default_str());
    f.qSeqLen = add(cmd.add_option("--q-seqlen", p.qSeqLen, "Query length S1 (fixed layouts)")
                        ->check(nonNegative)
                        ->capture_default_str());
    f.kvSeqLen =
        add(cmd.add_option("--kv-seqlen", p.kvSeqLen, "Key/value length S2 (fixed layouts) [default: --q-seqlen]")
                ->check(nonNegative));
    add(cmd.add_option(
               "--q-seqlens", f.qSeqLens,
               "TND: per-sequence query lengths (not cumulative), comma separated, or @FILE (comma or whitespace "
               "separated)")
            ->type_name("LIST|@FILE"));
    add(cmd.add_option("--kv-seqlens", f.kvSeqLens, "TND: per-sequence key/value lengths [default: --q-seqlens]")
            ->type_name("LIST|@FILE"));
    add(cmd.add_option("--heads", p.heads, "Query heads N1 (headNum)")->check(nonNegative)->capture_default_str());
    f.kvHeads =
        add(cmd.add_option("--kv-heads", p.kvHeads, "Key/value heads N2 [default: --heads]")->check(nonNegative));
    add(cmd.add_option("--dim", p.dim, "Head dim D of query and key")->check(nonNegative)->capture_default_str());
    add(cmd.add_option("--v-dim", p.vDim, "Head dim Dv of value [default: --dim]")->check(nonNegative));
    add(cmd.add_option("--dtype", f.dtype, "dtype of query, key, value and attentionOut")
            ->check(CLI::IsMember({"fp32", "fp16", "bf16"}))
            ->capture_default_str());
    add(cmd.add_option("--scale", p.scale, "scaleValue [default: 1/sqrt(dim); note the C API's own default is 1.0]")->check(notNan));
    add(cmd.add_option("--sparse-mode", p.sparseMode, "sparseMode (0-8)")->capture_default_str());
    add(cmd.add_option("--pre-tokens", p.preTokens, "preTokens")->capture_default_str());
    add(cmd.add_option("--next-tokens", p.nextTokens, "nextTokens")->capture_default_str());
    add(cmd.add_option("--prefix", f.prefix, "Modes 5/6: prefix width per batch, comma separated [default: generated]")
            ->type_name("LIST"));
    add(cmd.add_option("--pse-type", p.pseType,
                       "Generate a pse (realShift) and pass this pseType: 0 (scale*QK + pse), 1 (scale*(QK + pse)), "
                       "2/3 (inner alibi: fp32 slopes [N1]) [default: no pse]")
            ->check(CLI::Range(0, 3)));
    add(cmd.add_option("--pse-shape", p.pseShape,
                       "Shape of a pse of type 0/1: full [B,N1,S1,S2], row [B,N1,1,S2], compressed [1,N1,1024,S2] "
                       "(TND: the flattened full/row forms)")
            ->check(CLI::IsMember({"full", "row", "compressed"}))
            ->capture_default_str());
    add(cmd.add_option("--mask", p.maskKind,
                       "attenMask (1 = masked): auto (the compressed [2048,2048] tensor for modes 2-4 and 6-8, an "
                       "all-zero [S1,S2] mask for a mode-0 band or mode 5, none otherwise), none (NULL: no masking at "
                       "all, whatever the mode), random (30% masked, [B,1,S1,S2]), causal ([S1,S2]), zeros ([S1,S2]), "
                       "compressed (TND masks are [maxSq,maxSkv])")
            ->check(CLI::IsMember({"auto", "none", "random", "causal", "zeros", "compressed"}))
            ->capture_default_str());
    add(cmd.add_option("--keep-prob", p.keepProb, "Dropout keepProb in (0, 1]")->capture_default_str());
    add(cmd.add_option("--seed", p.seed, "Dropout seed (the Philox mask used when no dropMask is given)")
            ->capture_default_str());
    add(cmd.add_option("--offset", p.offset, "Dropout offset")->capture_default_str());
    add(cmd.add_flag("--explicit-drop-mask", p.explicitDropMask,
                     "Materialise the (seed, offset) dropout mask and pass it as dropMask"));
    add(cmd.add_flag("--sink", p.sink, "Pass a random fp32 sink logit per query head"));
    add(cmd.add_option("--inner-precise", p.innerPrecise, "innerPrecise (0, 1, 2)")->capture_default_str());
    add(cmd.add_option("--data-seed", p.dataSeed, "Seed of the random inputs (uniform in [-1, 1])")
            ->capture_default_str());
}

int runFlashAttention(const FaFlags& f, const RunOptions& o) {
    if (!o.load.empty()) {
        for (const CLI::Option* opt : f.all)
            if (opt->count())
                throw CliError(fmt::format("{} cannot be combined with --load: the problem comes from DIR/params.json",
                                           opt->get_name()));
        const json params = readParams(o.load);
        if (params.contains("op") && params["op"] != kFlashAttentionOp)
            throw CliError(
                fmt::format("{}/params.json holds op {}, not {}", o.load, params["op"].dump(), kFlashAttentionOp));
        return runLoadedFlashAttention(o, params);
    }
    if (o.compare) throw CliError("--compare needs --load DIR (the outputs to compare with)");
    FaInstance inst(problemFromFlags(f));
    if (!o.backward) return runInstance(inst, nullptr, o, "generated");
    FaGrads grads = tools::makeGrads(inst);
    return runInstance(inst, &grads, o, "generated");
}

int runLoaded(const RunOptions& o) {
    if (o.load.empty()) throw CliError("run: name an operator (run flash-attention ...) or give --load DIR");
    const json params = readParams(o.load);
    const std::string op = params.contains("op") && params["op"].is_string() ? params["op"].get<std::string>() : "";
    if (op == kFlashAttentionOp) return runLoadedFlashAttention(o, params);
    if (op == kBlockAttentionResidualsOp) return runLoadedBlockAttentionResiduals(o, params);
    if (op == kFusedInferAttentionOp) return runLoadedFusedInferAttention(o, params);
    throw CliError(fmt::format("{}/params.json: \"op\" is {}; known operators: {}, {}, {}", o.load,
                               params.contains("op") ? params["op"].dump() : "missing", kFlashAttentionOp,
                               kBlockAttentionResidualsOp, kFusedInferAttentionOp));
}

}  // namespace attnops::cli

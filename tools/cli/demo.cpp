// `attnops demo`: the library's main job on a realistic batch. Thousands of packed sequences of
// long-tailed lengths (TND), GQA, D = 128, bf16, causal (sparse mode 3), run in a few slices (which
// bounds the memory) with a line per slice: forward and backward, the outputs checked on sampled
// rows and the gradients on sampled sequences against the double reference; then a
// BlockAttentionResiduals forward + backward of model size, checked against the reference; then
// serving (serving.cpp): prefill and token-by-token decode from paged bf16 and int8 caches.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numbers>
#include <numeric>
#include <string>

#include "commands.hpp"
#include "flash_attention_cmd.hpp"
#include "problem_bar.hpp"
#include "problem_grad.hpp"
#include "runner.hpp"
#include "serving.hpp"

namespace attnops::cli {
namespace {

struct DemoShape {
    int64_t sequences;
    double medianLength;  // log-normal lengths: exp(N(log median, sigma)), clamped
    double sigma;
    int64_t minLength, maxLength;
    int64_t slices;
    int64_t checkRowsPerSlice;
    int64_t barTokens, barBlocks, barHidden;
    int64_t barCheckTokens;
};

// The full demo: 3000 sequences, 607K tokens, 1.57 TFLOP forward and the backward of the whole
// batch (3.9 TFLOP counted), in 8 slices, then the BlockAttentionResiduals step (T = 8192, N = 8,
// H = 4096, bf16: 0.67 GB forward and 1.28 GB backward of compulsory traffic). Measured with the
// AVX-512 kernels on the 2-core development machine: 42 s wall (3.5 s of forward, 11.8 s of
// backward; the rest is input generation and the double-precision checks), 2.3 GB peak RSS.
// --quick takes a few seconds.
constexpr DemoShape kFull{3000, 110.0, 1.1, 16, 4096, 8, 32, 8192, 8, 4096, 64};
constexpr DemoShape kQuick{300, 64.0, 0.8, 8, 512, 3, 32, 512, 8, 1024, 64};

constexpr int64_t kHeads = 16, kKvHeads = 4, kDim = 128;
constexpr int64_t kCausalMode = 3;
constexpr uint64_t kLengthSeed = 2024;

// Deterministic long-tailed (log-normal, Box-Muller) lengths, the same on every machine.
std::vector<int64_t> demoLengths(const DemoShape& s) {
    tools::Rng rng(kLengthSeed);
    std::vector<int64_t> lengths;
    while (int64_t(lengths.size()) < s.sequences) {
        const double u1 = 1.0 - rng.uniform(), u2 = rng.uniform();  // u1 in (0, 1]
        const double normal = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
        const double len = s.medianLength * std::exp(s.sigma * normal);
        lengths.push_back(std::clamp(int64_t(std::llround(len)), s.minLength, s.maxLength));
    }
    return lengths;
}

tools::FaProblem demoProblem(std::vector<int64_t> lengths) {
    tools::FaProblem p;
    p.layout = "TND";
    p.qSeqLens = lengths;
    p.kvSeqLens = std::move(lengths);
    p.heads = kHeads;
    p.kvHeads = kKvHeads;
    p.dim = kDim;
    p.dtype = ATTNOPS_BFLOAT16;
    p.sparseMode = kCausalMode;
    return p;
}

// Consecutive slices of roughly equal causal work (sum of S^2).
std::vector<size_t> sliceStarts(const std::vector<int64_t>& lengths, int64_t slices) {
    double total = 0;
    for (int64_t l : lengths) total += double(l) * double(l);
    std::vector<size_t> starts{0};
    double acc = 0;
    for (size_t i = 0; i < lengths.size(); ++i) {
        acc += double(lengths[i]) * double(lengths[i]);
        if (acc >= total * double(starts.size()) / double(slices) && int64_t(starts.size()) < slices &&
            i + 1 < lengths.size())
            starts.push_back(i + 1);
    }
    starts.push_back(lengths.size());
    return starts;
}

double seconds(std::chrono::steady_clock::time_point since) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

void addDemoOptions(CLI::App& cmd, DemoOptions& o) {
    cmd.add_flag(
        "--quick", o.quick,
        "A few-second version (300 sequences up to 512 tokens, BlockAttentionResiduals T=512 N=8 H=1024, serving 8 "
        "requests), for CI");
    cmd.add_flag("--json", o.json, "Print one JSON object (steps and summary) instead of text");
    cmd.add_option("--threads", o.threads, "Worker threads of device 0 [default: all usable cores]")
        ->check(CLI::PositiveNumber);
}

int runDemo(const DemoOptions& o) {
    const auto wallStart = std::chrono::steady_clock::now();
    const DemoShape& shape = o.quick ? kQuick : kFull;
    const int32_t threads = useThreads(o.threads);
    const std::vector<int64_t> lengths = demoLengths(shape);
    const int64_t tokens = std::accumulate(lengths.begin(), lengths.end(), int64_t(0));
    std::vector<int64_t> sorted = lengths;
    std::sort(sorted.begin(), sorted.end());

    if (!o.json) {
        fmt::print("attnops demo{}: {} packed sequences (TND), {} tokens; lengths {}..{}, median {}, mean {:.0f}\n",
                   o.quick ? " --quick" : "", lengths.size(), tokens, sorted.front(), sorted.back(),
                   sorted[sorted.size() / 2], double(tokens) / double(lengths.size()));
        fmt::print(
            "  {} query heads / {} kv heads (GQA), D = {}, bf16, causal (sparse mode {}), {} threads, {} steps\n",
            kHeads, kKvHeads, kDim, kCausalMode, threads, shape.slices + 2);
        std::fflush(stdout);
    }

    const std::vector<size_t> starts = sliceStarts(lengths, shape.slices);
    const size_t totalSteps = starts.size() - 1 + 2;  // attention slices (forward + backward), BAR, serving
    nlohmann::json steps = nlohmann::json::array();
    double flops = 0, forwardSeconds = 0;
    int64_t checkedRows = 0;
    double worstRatio = 0;  // max error / tolerance over the slices
    double bwdFlops = 0, bwdSeconds = 0, bwdWorst = 0;
    int64_t bwdCheckedSequences = 0;
    bool passed = true;
    for (size_t s = 0; s + 1 < starts.size(); ++s) {
        const std::vector<int64_t> part(lengths.begin() + long(starts[s]), lengths.begin() + long(starts[s + 1]));
        const int64_t partTokens = std::accumulate(part.begin(), part.end(), int64_t(0));
        auto t0 = std::chrono::steady_clock::now();
        tools::FaInstance inst(demoProblem(part));
        const double inputSeconds = seconds(t0);
        const Timing timing = timeForward(inst, 1, 0);
        const double partFlops = inst.problem.forwardFlops();
        t0 = std::chrono::steady_clock::now();
        const tools::RowCheck rc = tools::checkForwardRows(inst, shape.checkRowsPerSlice, 7 + s);
        const double checkSeconds = seconds(t0);

        // The slice's backward: FlashAttentionScoreGrad with a random dy, from the forward's outputs.
        tools::FaGrads grads = tools::makeGrads(inst);
        const double bwd = timeCalls([&] { return tools::runBackward(inst, grads); }, 1, 0).ms.front() * 1e-3;
        const SequenceSample sample = backwardSample(inst.problem, 0);
        t0 = std::chrono::steady_clock::now();
        const tools::GradCheck gc = tools::checkBackwardSequences(inst, grads, sample.sequences);
        const double gradCheckSeconds = seconds(t0);
        double gradWorst = 0;
        for (int t = 0; t < 3; ++t)
            if (gc.tolerance[t] > 0) gradWorst = std::max(gradWorst, gc.maxAbsError[t] / gc.tolerance[t]);

        const double fwd = timing.ms.front() * 1e-3;
        flops += partFlops;
        forwardSeconds += fwd;
        bwdFlops += kBackwardFlopFactor * partFlops;
        bwdSeconds += bwd;
        checkedRows += rc.rows;
        bwdCheckedSequences += int64_t(sample.sequences.size());
        worstRatio = std::max(worstRatio, rc.tolerance > 0 ? rc.maxAbsError / rc.tolerance : 0.0);
        bwdWorst = std::max(bwdWorst, gradWorst);
        passed = passed && rc.passed && gc.passed;
        steps.push_back({{"step", s + 1},
                         {"sequences", part.size()},
                         {"tokens", partTokens},
                         {"inputSeconds", inputSeconds},
                         {"forwardSeconds", fwd},
                         {"gflops", partFlops / fwd / 1e9},
                         {"check", checkJson(rc)},
                         {"backwardSeconds", bwd},
                         {"backwardGflops", kBackwardFlopFactor * partFlops / bwd / 1e9},
                         {"gradCheck",
                          {{"scope", sample.scope}, {"worstErrorToTolerance", gradWorst}, {"passed", gc.passed}}}});
        if (!o.json) {
            fmt::print(
                "step {}/{}: sequences {}-{} ({} tokens): forward {:.2f} s, {:.1f} GFLOP/s; backward {:.2f} s, {:.1f} "
                "GFLOP/s; check {} rows and the gradients of {}: {} (inputs {:.1f} s, checks {:.1f} s)\n",
                s + 1, totalSteps, starts[s], starts[s + 1] - 1, partTokens, fwd, partFlops / fwd / 1e9, bwd,
                kBackwardFlopFactor * partFlops / bwd / 1e9, rc.rows, sample.scope,
                rc.passed && gc.passed ? "PASS" : "FAIL", inputSeconds, checkSeconds + gradCheckSeconds);
            if (!rc.passed) fmt::print("  {}\n", checkLine(rc));
            if (!gc.passed) fmt::print("  gradients: {}\n", gc.failure);
            std::fflush(stdout);
        }
    }

    // BlockAttentionResiduals of model size: forward with needBackward, then the grad.
    tools::BarProblem bp;
    bp.tokens = shape.barTokens;
    bp.blocks = shape.barBlocks;
    bp.hidden = shape.barHidden;
    bp.dtype = ATTNOPS_BFLOAT16;
    auto t0 = std::chrono::steady_clock::now();
    tools::BarInstance bar(bp);
    const double barInputSeconds = seconds(t0);
    const Timing barForward = timeCalls([&] { return bar.runForward(true); }, 1);
    const Timing barBackward = timeCalls([&] { return bar.runBackward(); }, 1);
    t0 = std::chrono::steady_clock::now();
    const tools::BarCheck barFwdCheck = tools::checkBarForward(bar, shape.barCheckTokens, true);
    const tools::BarCheck barBwdCheck = tools::checkBarBackward(bar, shape.barCheckTokens);
    const double barCheckSeconds = seconds(t0);
    double barWorst = 0;
    for (const tools::BarCheck* rc : {&barFwdCheck, &barBwdCheck})
        for (int t = 0; t < 3; ++t)
            if (rc->tolerance[t] > 0) barWorst = std::max(barWorst, rc->maxAbsError[t] / rc->tolerance[t]);
    const bool barPassed = barFwdCheck.passed && barBwdCheck.passed;
    passed = passed && barPassed;
    const double barFwdBytes = bp.forwardBytes(true), barBwdBytes = bp.backwardBytes();
    const double barFwdMs = barForward.ms.front(), barBwdMs = barBackward.ms.front();
    if (!o.json) {
        fmt::print(
            "step {}/{}: block attention residuals T={} N={} H={} bf16: forward {}, {}; backward {}, {} (compulsory "
            "traffic); check {} of {} tokens (weight gradients: every token): {} (inputs {:.1f} s, check {:.1f} s)\n",
            totalSteps - 1, totalSteps, bp.tokens, bp.blocks, bp.hidden, formatMs(barFwdMs),
            formatBandwidth(barFwdBytes, barFwdMs), formatMs(barBwdMs), formatBandwidth(barBwdBytes, barBwdMs),
            barBwdCheck.tokens, bp.tokens, barPassed ? "PASS" : "FAIL", barInputSeconds, barCheckSeconds);
        if (!barFwdCheck.passed) fmt::print("  forward: {}\n", barFwdCheck.failure);
        if (!barBwdCheck.passed) fmt::print("  backward: {}\n", barBwdCheck.failure);
        std::fflush(stdout);
    }

    t0 = std::chrono::steady_clock::now();
    const ServingResult serving = runServing(o.quick, o.json, threads, totalSteps, totalSteps);
    const double servingSeconds = seconds(t0);
    passed = passed && serving.passed;

    const double wall = seconds(wallStart);
    if (o.json) {
        const nlohmann::json j = {{"sequences", lengths.size()},
                                  {"tokens", tokens},
                                  {"heads", kHeads},
                                  {"kvHeads", kKvHeads},
                                  {"dim", kDim},
                                  {"dtype", "bf16"},
                                  {"sparseMode", kCausalMode},
                                  {"threads", threads},
                                  {"flops", flops},
                                  {"forwardSeconds", forwardSeconds},
                                  {"gflops", flops / forwardSeconds / 1e9},
                                  {"checkedRows", checkedRows},
                                  {"worstErrorToTolerance", worstRatio},
                                  {"attentionBackward",
                                   {{"flops", bwdFlops},
                                    {"flopsNote", kBackwardFlopNote},
                                    {"backwardSeconds", bwdSeconds},
                                    {"gflops", bwdFlops / bwdSeconds / 1e9},
                                    {"checkedSequences", bwdCheckedSequences},
                                    {"worstErrorToTolerance", bwdWorst}}},
                                  {"blockAttentionResiduals",
                                   {{"tokens", bp.tokens},
                                    {"blocks", bp.blocks},
                                    {"hidden", bp.hidden},
                                    {"dtype", "bf16"},
                                    {"forwardMs", barFwdMs},
                                    {"forwardBytes", barFwdBytes},
                                    {"forwardGBps", barFwdBytes / (barFwdMs * 1e-3) / 1e9},
                                    {"backwardMs", barBwdMs},
                                    {"backwardBytes", barBwdBytes},
                                    {"backwardGBps", barBwdBytes / (barBwdMs * 1e-3) / 1e9},
                                    {"bytesNote", "compulsory traffic, spec section 5"},
                                    {"checkedTokens", barBwdCheck.tokens},
                                    {"worstErrorToTolerance", barWorst},
                                    {"passed", barPassed}}},
                                  {"serving", serving.summary},
                                  {"passed", passed},
                                  {"wallSeconds", wall},
                                  {"steps", steps}};
        fmt::print("{}\n", j.dump(2));
    } else {
        fmt::print(
            "summary: {} sequences, {} tokens, {:.3g} TFLOP (mask-aware) in {:.2f} s of forward: {:.1f} GFLOP/s on "
            "{} threads\n",
            lengths.size(), tokens, flops / 1e12, forwardSeconds, flops / forwardSeconds / 1e9, threads);
        fmt::print("attention backward of the whole batch: {:.3g} TFLOP in {:.2f} s: {:.1f} GFLOP/s\n", bwdFlops / 1e12,
                   bwdSeconds, bwdFlops / bwdSeconds / 1e9);
        fmt::print(
            "block attention residuals: T={} N={} H={} bf16, forward {} ({}), backward {} ({}) of compulsory traffic\n",
            bp.tokens, bp.blocks, bp.hidden, formatMs(barFwdMs), formatBandwidth(barFwdBytes, barFwdMs),
            formatMs(barBwdMs), formatBandwidth(barBwdBytes, barBwdMs));
        fmt::print(
            "check: {} sampled attention rows, worst error/tolerance {:.2f}; attention gradients of {} sampled "
            "sequences, {:.2f}; block attention residuals, {:.2f}; serving prefill and sampled decode steps: {}; "
            "against the double reference: {}\n",
            checkedRows, worstRatio, bwdCheckedSequences, bwdWorst, barWorst, serving.passed ? "PASS" : "FAIL",
            passed ? "PASS" : "FAIL");
        fmt::print("wall time {:.1f} s (serving step {:.1f} s)\n", wall, servingSeconds);
    }
    return passed ? kExitOk : kExitCheckFailed;
}

}  // namespace attnops::cli

// `attnops run [flash-attention]`: a described or loaded FlashAttentionScore problem, timed,
// checked against the reference, saved as .npy files, or compared with saved outputs.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "problem.hpp"

namespace attnops::cli {

// The backward's FLOPs as a multiple of the forward's mask-aware count (dV, dP, dQ, dK and the
// recomputed scores: five matrix products against the forward's two).
constexpr double kBackwardFlopFactor = 2.5;
constexpr const char* kBackwardFlopNote = "2.5 x the forward's mask-aware count";

// Options of `run` that do not describe the problem (valid with --load as well).
struct RunOptions {
    std::string load, save;
    bool compare = false, check = false, json = false, backward = false;
    int64_t checkRows = 64, repeat = 1;
    int64_t checkSequences = 0;  // flash-attention backward check: 0 auto, -1 all, n > 0 sampled
    int32_t threads = 0;
};

// Adds the run options to `cmd` (`run`, `run flash-attention` and `run block-attention-residuals`
// take them); `attention`: also the flash-attention-only ones (--check-sequences).
void addRunOptions(CLI::App& cmd, RunOptions& o, bool attention = true);

// The problem flags of `run flash-attention`, bound to a FaProblem.
struct FaFlags {
    tools::FaProblem problem;
    std::string dtype = "fp32", qSeqLens, kvSeqLens, prefix;
    std::vector<CLI::Option*> all;  // every problem flag, to reject them next to --load
    CLI::Option *batch = nullptr, *qSeqLen = nullptr, *kvSeqLen = nullptr, *kvHeads = nullptr;
};

void addFlashAttentionFlags(CLI::App& cmd, FaFlags& f);

// `run flash-attention ...` (a generated problem, or o.load); returns the exit status.
int runFlashAttention(const FaFlags& f, const RunOptions& o);

// `run --load DIR`: the operator named in DIR/params.json.
int runLoaded(const RunOptions& o);

// The sequences (batches of fixed layouts) whose gradients a backward check compares, and how to
// say so ("all 5 sequences", "12 of 3000 sequences, evenly spaced").
struct SequenceSample {
    std::vector<int64_t> sequences;
    std::string scope;
};

// requested: -1 every one; n > 0 n evenly spaced ones; 0 (auto) every one when the dense work of
// the double reference backward (2 S1 S2 N1 (D+Dv) per sequence) is within a budget of a few
// seconds, else evenly spaced candidates in order while they fit it (at least one).
SequenceSample backwardSample(const tools::FaProblem& p, int64_t requested);

// Parses "3,1,4" or "@FILE" (comma or whitespace separated) into non-negative integers; `what`
// names the flag in errors.
std::vector<int64_t> parseLengthList(const std::string& text, const std::string& what);

}  // namespace attnops::cli

// `attnops run [flash-attention]`: a described or loaded FlashAttentionScore problem, timed,
// checked against the reference, saved as .npy files, or compared with saved outputs.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "problem.hpp"

namespace attnops::cli {

// Options of `run` that do not describe the problem (valid with --load as well).
struct RunOptions {
    std::string load, save;
    bool compare = false, check = false, json = false;
    int64_t checkRows = 64, repeat = 1;
    int32_t threads = 0;
};

// Adds the run options to `cmd` (both `run` and `run flash-attention` take them).
void addRunOptions(CLI::App& cmd, RunOptions& o);

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

// Parses "3,1,4" or "@FILE" (comma or whitespace separated) into non-negative integers; `what`
// names the flag in errors.
std::vector<int64_t> parseLengthList(const std::string& text, const std::string& what);

}  // namespace attnops::cli

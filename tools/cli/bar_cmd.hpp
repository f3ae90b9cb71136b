// `attnops run block-attention-residuals`: a described or loaded BlockAttentionResiduals problem
// (forward, and with --backward its grad), timed with the compulsory traffic of spec section 5,
// checked against the double reference, saved as .npy files, or compared with saved outputs.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "bar_files.hpp"
#include "flash_attention_cmd.hpp"
#include "problem_bar.hpp"

namespace attnops::cli {

// The problem flags of `run block-attention-residuals`, bound to a BarProblem.
struct BarFlags {
    tools::BarProblem problem;
    std::string dtype = "fp32";
    bool needBackward = false;
    std::vector<CLI::Option*> all;  // every problem flag, to reject them next to --load
};

void addBlockAttentionResidualsFlags(CLI::App& cmd, BarFlags& f);

// `run block-attention-residuals ...` (a generated problem, or o.load); returns the exit status.
int runBlockAttentionResiduals(const BarFlags& f, const RunOptions& o);

// `run --load DIR` of a directory whose params.json names block-attention-residuals.
int runLoadedBlockAttentionResiduals(const RunOptions& o, const nlohmann::json& params);

}  // namespace attnops::cli

// `attnops run fused-infer-attention`: a described or loaded FusedInferAttentionScore (V4) call --
// layouts, GQA, actual lengths, sparse modes, paged caches, int8 KV, lse, sink -- timed (GB/s of
// KV read, TFLOP/s), checked against the double reference, saved as .npy files, or compared with
// saved outputs.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "fia_files.hpp"
#include "flash_attention_cmd.hpp"
#include "problem_fia.hpp"

namespace attnops::cli {

// The problem flags of `run fused-infer-attention`, bound to a FiaProblem.
struct FiaFlags {
    tools::FiaProblem problem;
    std::string dtype = "fp16", qSeqLens, kvSeqLens;
    bool noQuantOffset = false, noShuffle = false;
    std::string outQuantDType = "fp32";  // quantScale2 / quantOffset2
    bool noOutQuantOffset = false;
    std::string deqScaleDType = "fp32";  // --full-quant: deqScale1/deqScale2 fp32 or uint64
    std::vector<CLI::Option*> all;  // every problem flag, to reject them next to --load
};

void addFusedInferAttentionFlags(CLI::App& cmd, FiaFlags& f);

// `run fused-infer-attention ...` (a generated problem, or o.load); returns the exit status.
int runFusedInferAttention(const FiaFlags& f, const RunOptions& o);

// `run --load DIR` of a directory whose params.json names fused-infer-attention.
int runLoadedFusedInferAttention(const RunOptions& o, const nlohmann::json& params);

}  // namespace attnops::cli

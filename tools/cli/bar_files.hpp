// A BlockAttentionResiduals call as a directory: one .npy per tensor named as the API argument
// (partialBlock, blockRes in its logical [T,N,H] shape, projWeight, normWeight, hiddenStates,
// invNorm, probs, gradHiddenStates, gradPartialBlock, gradBlockRes, gradProjWeight,
// gradNormWeight) and params.json ("op": "block-attention-residuals", eps, validBlockNum,
// needBackward, backward, blockResLayout, tensors). Saving, loading, comparing.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "files.hpp"
#include "problem_bar.hpp"

namespace attnops::cli {

constexpr const char* kBlockAttentionResidualsOp = "block-attention-residuals";

// Writes the inputs and outputs of `inst`: invNorm/probs when the forward saved them
// (needBackward), the gradient tensors after a backward. Removes stale files of earlier saves.
// Returns the number of .npy files written.
int saveBlockAttentionResiduals(const tools::BarInstance& inst, const std::filesystem::path& dir, bool needBackward,
                                bool backward);

struct LoadedBar {
    tools::BarInstance inst;
    bool needBackward = false;  // params.json's needBackward, or DIR holds invNorm/probs
    bool backward = false;      // params.json's backward, or DIR holds gradHiddenStates
};

// An instance holding DIR's inputs (gradHiddenStates random when DIR has none); outputs not computed.
LoadedBar loadBlockAttentionResiduals(const std::filesystem::path& dir, const nlohmann::json& params);

struct BarComparison {
    std::vector<OutputComparison> outputs;  // those present in DIR
    bool passed = false;
};

// Compares the outputs present in DIR with those of `inst` (already run: the forward, and the
// backward when `backward`) and checks the file's values against the double reference:
// checkBarForward on `sample` tokens (-1: all), checkBarBackward with gradPartialBlock and
// gradBlockRes on `sample` tokens and the weight gradients in full.
BarComparison compareBlockAttentionResiduals(tools::BarInstance& inst, const std::filesystem::path& dir, int64_t sample,
                                             bool needBackward, bool backward);

}  // namespace attnops::cli

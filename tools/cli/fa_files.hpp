// A FlashAttentionScore call as a directory: one .npy per tensor named as the API argument
// (query.npy, ..., attentionOut.npy, actualSeqQLen.npy, ...) and params.json with every
// attribute and every tensor's dtype. Saving, loading, and comparing saved outputs with ours.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "files.hpp"
#include "problem.hpp"
#include "problem_grad.hpp"

namespace attnops::cli {

constexpr const char* kFlashAttentionOp = "flash-attention";

// Writes every input, output and int array of `inst`, and params.json. When dropout is generated
// from (seed, offset), the generated mask is saved as dropMask.npy ("dropMaskGenerated": true) so
// that the directory alone determines the result. With `grads` (a backward run) also dy.npy,
// dq.npy, dk.npy, dv.npy (dsink.npy with a sink) and "backward": true. Removes stale tensor files
// of earlier saves. Returns the number of .npy files written.
int saveFlashAttention(const tools::FaInstance& inst, const std::filesystem::path& dir,
                       const tools::FaGrads* grads = nullptr);

// An instance built from params.json and the input tensors of `dir`; its outputs are allocated
// (statistics lanes as in DIR's softmaxMax.npy when present) and not computed.
tools::FaInstance loadFlashAttention(const std::filesystem::path& dir, const nlohmann::json& params);

// Whether DIR holds a backward call: params.json's "backward": true, or a dy.npy.
bool savedBackward(const std::filesystem::path& dir, const nlohmann::json& params);

// Gradient tensors for `inst`: dy from DIR/dy.npy (attentionOut's dtype and shape) or, when DIR
// has none, random; outputs zeroed.
tools::FaGrads loadGradients(const tools::FaInstance& inst, const std::filesystem::path& dir,
                             const nlohmann::json& params);

struct Comparison {
    std::vector<OutputComparison> outputs;  // those present in DIR
    tools::RowCheck file;                   // the file's forward outputs (ours where DIR lacks one)
    bool passed = false;                    // every output passed
};

// Compares the outputs present in `dir` with those of `inst` (already run): the forward outputs
// on `rows` sampled rows (the rows checkForwardRows samples; -1: every row), and, with `grads`
// (already run), the gradients dq/dk/dv on `sequences` (described by `sequenceScope`) and dsink in
// full, against checkBackwardSequences' reference and tolerances.
Comparison compareOutputs(tools::FaInstance& inst, const std::filesystem::path& dir, int64_t rows,
                          tools::FaGrads* grads = nullptr, const std::vector<int64_t>& sequences = {},
                          const std::string& sequenceScope = "");

nlohmann::json comparisonJson(const Comparison& c);
std::string comparisonText(const Comparison& c);

}  // namespace attnops::cli

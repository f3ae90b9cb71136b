// A FlashAttentionScore call as a directory: one .npy per tensor named as the API argument
// (query.npy, ..., attentionOut.npy, actualSeqQLen.npy, ...) and params.json with every
// attribute and every tensor's dtype. Saving, loading, and comparing saved outputs with ours.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "problem.hpp"

namespace attnops::cli {

constexpr const char* kFlashAttentionOp = "flash-attention";

// Writes every input, output and int array of `inst`, and params.json. When dropout is generated
// from (seed, offset), the generated mask is saved as dropMask.npy ("dropMaskGenerated": true) so
// that the directory alone determines the result. Removes stale tensor files of earlier saves.
// Returns the number of .npy files written.
int saveFlashAttention(const tools::FaInstance& inst, const std::filesystem::path& dir);

// DIR/params.json, parsed.
nlohmann::json readParams(const std::filesystem::path& dir);

// An instance built from params.json and the input tensors of `dir`; its outputs are allocated
// (statistics lanes as in DIR's softmaxMax.npy when present) and not computed.
tools::FaInstance loadFlashAttention(const std::filesystem::path& dir, const nlohmann::json& params);

// One output of DIR against ours and against the double reference.
struct OutputComparison {
    std::string name;
    bool comparable = true;  // same dtype and shape as ours
    // attnops vs the file, every element. Relative errors divide by max(|ours|, 1e-3 max|ours|).
    double maxAbs = 0, maxRel = 0, cosine = 1;
    int64_t elements = 0;
    // The file vs the double reference on sampled rows (attentionOut: absolute error; statistics:
    // relative error), and the bound of the project's tolerance rule.
    double referenceError = 0, tolerance = 0;
    bool passed = false;
    std::string note;  // why it failed, when it did
};

struct Comparison {
    std::vector<OutputComparison> outputs;  // those present in DIR
    tools::RowCheck file;                   // the file's outputs (ours where DIR lacks one)
    bool passed = false;                    // every output passed
};

// Compares the outputs present in `dir` with those of `inst` (already run) on `rows` sampled rows
// (the rows checkForwardRows samples; -1: every row).
Comparison compareOutputs(tools::FaInstance& inst, const std::filesystem::path& dir, int64_t rows);

nlohmann::json comparisonJson(const Comparison& c);
std::string comparisonText(const Comparison& c);

}  // namespace attnops::cli

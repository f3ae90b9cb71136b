// A FusedInferAttentionScore call as a directory: one .npy per tensor named as the API argument
// (query, key, value as given -- for a paged cache the cache itself --, blockTable as given,
// attenMask, key/valueAntiquantScale/Offset, learnableSink, pseShift, queryRope, keyRope, attentionOut,
// softmaxLse; int64 arrays actualSeqLengths, actualSeqLengthsKv) and params.json ("op": "fused-infer-attention" and every
// attribute of the V4 call). Saving, loading, comparing.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "files.hpp"
#include "problem_fia.hpp"

namespace attnops::cli {

constexpr const char* kFusedInferAttentionOp = "fused-infer-attention";

// Writes every input, int array and output of `inst` (already run) and params.json. Removes
// stale files of earlier saves. Returns the number of .npy files written.
int saveFusedInferAttention(const tools::FiaInstance& inst, const std::filesystem::path& dir);

// An instance holding DIR's inputs exactly as saved, its problem derived from params.json and the
// tensors' shapes; outputs allocated, not computed.
tools::FiaInstance loadFusedInferAttention(const std::filesystem::path& dir, const nlohmann::json& params);

struct FiaComparison {
    std::vector<OutputComparison> outputs;  // attentionOut, softmaxLse: those present in DIR
    bool passed = false;
};

// Compares the outputs in DIR with those of `inst` (already run) and checks the file's values
// against the double reference (every row, checkFia's tolerance rule).
FiaComparison compareFusedInferAttention(tools::FiaInstance& inst, const std::filesystem::path& dir);

}  // namespace attnops::cli

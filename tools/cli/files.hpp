// What the operators' directories share: one .npy per tensor named as the API argument plus
// params.json, tensor reading with params.json's declared dtype and shape, attribute lookup, and
// the comparison of a saved output with ours and with the double reference.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "npy.hpp"
#include "problem.hpp"
#include "runner.hpp"

namespace attnops::cli {

// DIR/NAME.npy.
std::filesystem::path npyPath(const std::filesystem::path& dir, const std::string& name);

// The .npy element type of a tensor dtype (bf16 is stored as its raw <u2 bits).
NpyType npyTypeOf(attnopsDataType d);

// DIR/params.json, parsed; and written (pretty printed).
nlohmann::json readParams(const std::filesystem::path& dir);
void writeParams(const std::filesystem::path& dir, const nlohmann::json& params);

// params.json's entry for a tensor under "tensors" (null when it has none).
const nlohmann::json* declaredEntry(const nlohmann::json& params, const std::string& name);

// Reads a floating or mask tensor; `declared` (params.json's entry, may be null) decides between
// dtypes that share a descr (bf16 / <u2) and must agree with the file's shape.
tools::HostTensor readTensor(const std::filesystem::path& path, const nlohmann::json* declared);

// Writes `t` (contiguous, shape `shape`) as DIR/NAME.npy and records it in `tensors`.
void saveTensor(const std::filesystem::path& dir, const std::string& name, attnopsDataType dtype,
                const std::vector<int64_t>& shape, const void* data, nlohmann::json& tensors);

std::string shapeText(const std::vector<int64_t>& shape);

// params.json's KEY, or `fallback` when absent (an error when `required`).
template <class T>
T attribute(const nlohmann::json& params, const char* key, T fallback, bool required = false);

// One output of DIR against ours and against the double reference.
struct OutputComparison {
    std::string name;
    bool comparable = true;  // same dtype and shape as ours
    // attnops vs the file, every element. Relative errors divide by max(|ours|, 1e-3 max|ours|).
    double maxAbs = 0, maxRel = 0, cosine = 1;
    int64_t elements = 0;
    // The file vs the double reference (`metric`, on `scope`: which rows/sequences/tokens were
    // compared), and the bound of the project's tolerance rule.
    std::string metric = "max abs error", scope;
    int64_t rows = -1;  // the rows compared, when rows were sampled
    double referenceError = 0, tolerance = 0;
    bool passed = false;
    std::string note;  // why it failed, when it did
};

// Element-wise comparison of our output with the file's (same dtype and shape).
OutputComparison elementwise(const std::string& name, const tools::HostTensor& ours, const tools::HostTensor& file);

// An output whose file differs from ours in dtype or shape (failed).
OutputComparison incomparable(const std::string& name, const tools::HostTensor& ours, const tools::HostTensor& file);

// The file-vs-reference verdict of an element-wise comparison: passes when the error is finite
// and at most the tolerance, and no NaN appeared on one side only.
void judge(OutputComparison& oc, double referenceError, double tolerance, bool nanMismatch, const std::string& scope,
           const std::string& failure = "");

// {"name": {...}} entries, and the two-line text form of each.
nlohmann::json outputsJson(const std::vector<OutputComparison>& outputs);
std::string outputsText(const std::vector<OutputComparison>& outputs);

// ------------------------------------------------------------------ template definitions

template <class T>
T attribute(const nlohmann::json& params, const char* key, T fallback, bool required) {
    if (!params.contains(key)) {
        if (required) throw CliError(std::string("params.json: \"") + key + "\" is missing");
        return fallback;
    }
    try {
        return params.at(key).get<T>();
    } catch (const nlohmann::json::exception&) {
        throw CliError(std::string("params.json: \"") + key + "\" has the wrong type: " + params.at(key).dump());
    }
}

}  // namespace attnops::cli

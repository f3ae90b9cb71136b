// Saving a FlashAttentionScore call to a directory, loading it back, and comparing outputs.
#include "fa_files.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "files.hpp"
#include "npy.hpp"
#include "runner.hpp"

namespace attnops::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tools::FaGrads;
using tools::FaInstance;
using tools::FaProblem;
using tools::HostTensor;

// Every tensor and int array of a call, by its API argument name.
struct TensorSlot {
    const char* name;
    HostTensor FaInstance::*member;
    bool output;
};
const TensorSlot kTensors[] = {
    {"query", &FaInstance::query, false},
    {"key", &FaInstance::key, false},
    {"value", &FaInstance::value, false},
    {"realShift", &FaInstance::pse, false},
    {"dropMask", &FaInstance::dropMask, false},
    {"attenMask", &FaInstance::attenMask, false},
    {"sink", &FaInstance::sink, false},
    {"attentionOut", &FaInstance::attentionOut, true},
    {"softmaxMax", &FaInstance::softmaxMax, true},
    {"softmaxSum", &FaInstance::softmaxSum, true},
};

struct ArraySlot {
    const char* name;
    std::vector<int64_t> FaInstance::*member;
    bool tndOnly;  // the actual lengths: passed (maybe empty) for TND, never otherwise
};
const ArraySlot kArrays[] = {
    {"actualSeqQLen", &FaInstance::qCumulative, true},
    {"actualSeqKvLen", &FaInstance::kvCumulative, true},
    {"prefix", &FaInstance::prefix, false},
    {"qStartIdx", &FaInstance::qStartIdx, false},
    {"kvStartIdx", &FaInstance::kvStartIdx, false},
};

// The gradient tensors of a backward call: dy (an input) and the outputs.
struct GradSlot {
    const char* name;
    HostTensor FaGrads::*member;
    int index;  // in GradCheck's arrays; -1: dy
};
const GradSlot kGrads[] = {
    {"dy", &FaGrads::dy, -1}, {"dq", &FaGrads::dq, 0},       {"dk", &FaGrads::dk, 1},
    {"dv", &FaGrads::dv, 2},  {"dsink", &FaGrads::dsink, 3},
};

const char* const kLayouts[] = {"BSH", "SBH", "BSND", "BNSD", "TND"};

fs::path fileOf(const fs::path& dir, const std::string& name) { return npyPath(dir, name); }

// Per-sequence lengths from cumulative end offsets (a non-positive difference is length 0).
std::vector<int64_t> lengthsOf(const std::vector<int64_t>& cumulative) {
    std::vector<int64_t> lengths;
    int64_t previous = 0;
    for (int64_t c : cumulative) {
        lengths.push_back(std::max<int64_t>(0, c - previous));
        previous = std::max(previous, c);
    }
    return lengths;
}

// B, S1, S2, N2, D, Dv of a problem from the loaded query/key/value shapes.
void deriveGeometry(FaProblem& p, const HostTensor& q, const HostTensor& k, const HostTensor& v) {
    const size_t rank = p.layout.size();  // the layout string names one axis per letter
    for (const auto& [name, t] : {std::pair{"query", &q}, {"key", &k}, {"value", &v}})
        if (t->shape().size() != rank)
            throw CliError(fmt::format("{}.npy: layout {} needs rank {}, the file has shape {}", name, p.layout, rank,
                                       shapeText(t->shape())));
    const auto &qs = q.shape(), &ks = k.shape(), &vs = v.shape();
    auto div = [](int64_t a, int64_t b) { return b > 0 ? a / b : 0; };
    if (p.layout == "BSH" || p.layout == "SBH") {
        const size_t bAxis = p.layout == "BSH" ? 0 : 1, sAxis = 1 - bAxis;
        p.batch = qs[bAxis];
        p.qSeqLen = qs[sAxis];
        p.kvSeqLen = ks[sAxis];
        p.dim = div(qs[2], p.heads);
        p.kvHeads = div(ks[2], p.dim);
        p.vDim = div(vs[2], p.kvHeads);
    } else if (p.layout == "BSND" || p.layout == "BNSD") {
        const size_t sAxis = p.layout == "BSND" ? 1 : 2, nAxis = 3 - sAxis;
        p.batch = qs[0];
        p.qSeqLen = qs[sAxis];
        p.kvSeqLen = ks[sAxis];
        p.kvHeads = ks[nAxis];
        p.dim = qs[3];
        p.vDim = vs[3];
    } else {
        p.kvHeads = ks[1];
        p.dim = qs[2];
        p.vDim = vs[2];
    }
}

}  // namespace

int saveFlashAttention(const FaInstance& inst, const fs::path& dir, const FaGrads* grads) {
    const FaProblem& p = inst.problem;
    fs::create_directories(dir);
    json tensors = json::object();
    std::set<std::string> written;
    auto save = [&](const std::string& name, NpyType type, const std::string& dtype, const std::vector<int64_t>& shape,
                    const void* data) {
        writeNpy(fileOf(dir, name), type, shape, data);
        tensors[name] = {{"file", name + ".npy"}, {"dtype", dtype}, {"shape", shape}};
        written.insert(name);
    };
    for (const TensorSlot& slot : kTensors) {
        const HostTensor& t = inst.*slot.member;
        if (!t.empty()) save(slot.name, npyTypeOf(t.dtype()), attnopsDataTypeName(t.dtype()), t.shape(), t.data());
    }
    // Dropout generated from (seed, offset): save the bits it used.
    const bool generated = p.keepProb < 1.0 && inst.dropMask.empty();
    if (generated) {
        const HostTensor mask = tools::generatedDropMask(inst);
        save("dropMask", NpyType::U8, attnopsDataTypeName(mask.dtype()), mask.shape(), mask.data());
    }
    for (const ArraySlot& slot : kArrays) {
        const std::vector<int64_t>& v = inst.*slot.member;
        if (slot.tndOnly ? p.tnd() : !v.empty()) save(slot.name, NpyType::I64, "int64", {int64_t(v.size())}, v.data());
    }
    // Files of an earlier save that this call does not have would be loaded with it: remove them.
    for (const TensorSlot& slot : kTensors)
        if (!written.count(slot.name)) fs::remove(fileOf(dir, slot.name));
    for (const ArraySlot& slot : kArrays)
        if (!written.count(slot.name)) fs::remove(fileOf(dir, slot.name));
    for (const GradSlot& slot : kGrads) {
        const HostTensor* t = grads != nullptr ? &(grads->*slot.member) : nullptr;
        if (t != nullptr && !t->empty())
            save(slot.name, npyTypeOf(t->dtype()), attnopsDataTypeName(t->dtype()), t->shape(), t->data());
        else
            fs::remove(fileOf(dir, slot.name));
    }

    const json params = {
        {"op", kFlashAttentionOp},
        {"attnopsVersion", attnopsVersion()},
        {"problem", p.describe()},
        {"layout", p.layout},
        {"headNum", p.heads},
        {"scale", p.effectiveScale()},
        {"keepProb", p.keepProb},
        {"preTokens", p.preTokens},
        {"nextTokens", p.nextTokens},
        {"sparseMode", p.sparseMode},
        {"pseType", p.pseType < 0 ? 1 : p.pseType},
        {"seed", p.seed},
        {"offset", p.offset},
        {"innerPrecise", p.innerPrecise},
        {"dropMaskGenerated", generated},
        {"backward", grads != nullptr},
        {"tensors", tensors},
    };
    writeParams(dir, params);
    return int(written.size());
}

FaInstance loadFlashAttention(const fs::path& dir, const json& params) {
    FaProblem p;
    p.layout = attribute<std::string>(params, "layout", "", true);
    if (std::find(std::begin(kLayouts), std::end(kLayouts), p.layout) == std::end(kLayouts))
        throw CliError(fmt::format("params.json: layout \"{}\" is not one of BSH, SBH, BSND, BNSD, TND", p.layout));
    p.heads = attribute<int64_t>(params, "headNum", 0, true);
    // Absent attributes take the C API's defaults.
    p.scale = attribute<double>(params, "scale", 1.0);
    p.keepProb = attribute<double>(params, "keepProb", 1.0);
    p.preTokens = attribute<int64_t>(params, "preTokens", tools::kNoBand);
    p.nextTokens = attribute<int64_t>(params, "nextTokens", tools::kNoBand);
    p.sparseMode = attribute<int64_t>(params, "sparseMode", 0);
    const int64_t pseType = attribute<int64_t>(params, "pseType", 1);
    p.seed = attribute<int64_t>(params, "seed", 0);
    p.offset = attribute<int64_t>(params, "offset", 0);
    p.innerPrecise = attribute<int64_t>(params, "innerPrecise", 0);

    std::map<std::string, HostTensor> tensors;
    for (const TensorSlot& slot : kTensors) {
        if (slot.output) continue;
        const fs::path path = fileOf(dir, slot.name);
        const json* declared = declaredEntry(params, slot.name);
        if (fs::exists(path))
            tensors.emplace(slot.name, readTensor(path, declared));
        else if (declared != nullptr)
            throw CliError(fmt::format("{}: listed in params.json but missing", path.string()));
    }
    for (const char* required : {"query", "key", "value"})
        if (!tensors.count(required)) throw CliError(fmt::format("{}: missing", fileOf(dir, required).string()));
    std::map<std::string, std::vector<int64_t>> arrays;
    for (const ArraySlot& slot : kArrays) {
        const fs::path path = fileOf(dir, slot.name);
        if (fs::exists(path))
            arrays.emplace(slot.name, readNpyInts(path));
        else if (declaredEntry(params, slot.name) != nullptr)
            throw CliError(fmt::format("{}: listed in params.json but missing", path.string()));
        if (slot.tndOnly && arrays.count(slot.name) && p.layout != "TND")
            fmt::print(stderr, "warning: {}.npy ignored: layout {} is not TND\n", slot.name, p.layout);
    }

    const HostTensor& value = tensors.at("value");
    p.dtype = tensors.at("query").dtype();
    deriveGeometry(p, tensors.at("query"), tensors.at("key"), value);
    if (p.tnd()) {
        p.qSeqLens = lengthsOf(arrays["actualSeqQLen"]);
        p.kvSeqLens = lengthsOf(arrays["actualSeqKvLen"]);
    }
    p.pseType = (tensors.count("realShift") || pseType != 1) ? int(pseType) : -1;
    p.maskKind = tensors.count("attenMask") ? "loaded" : "none";
    p.explicitDropMask = tensors.count("dropMask") > 0;
    p.sink = tensors.count("sink") > 0;
    p.prefix = arrays["prefix"];
    // The fp32 tolerance scales with the size of the inputs (the output is a mix of value rows).
    p.dataScale = 0;
    for (int64_t i = 0; i < value.numel(); ++i) p.dataScale = std::max(p.dataScale, double(std::fabs(value.get(i))));
    const fs::path statsPath = fileOf(dir, "softmaxMax");
    if (fs::exists(statsPath)) {
        const NpyReader stats(statsPath);
        if (!stats.header().shape.empty()) p.statLanes = stats.header().shape.back();
    }

    // Build the instance without generating inputs (nothing of size), then put the loaded ones in.
    FaProblem bare = p;
    bare.batch = 0;
    bare.qSeqLens.clear();
    bare.kvSeqLens.clear();
    bare.pseType = -1;
    bare.maskKind = "none";
    bare.sparseMode = 0;
    bare.keepProb = 1.0;
    bare.sink = false;
    FaInstance inst(bare);
    inst.problem = p;
    for (const TensorSlot& slot : kTensors) {
        auto it = tensors.find(slot.name);
        if (it != tensors.end()) inst.*slot.member = std::move(it->second);
    }
    for (const ArraySlot& slot : kArrays) inst.*slot.member = arrays[slot.name];
    tools::allocateOutputs(inst);
    return inst;
}

bool savedBackward(const fs::path& dir, const json& params) {
    return attribute<bool>(params, "backward", false) || fs::exists(fileOf(dir, "dy"));
}

FaGrads loadGradients(const FaInstance& inst, const fs::path& dir, const json& params) {
    FaGrads grads = tools::makeGrads(inst);
    const fs::path path = fileOf(dir, "dy");
    if (!fs::exists(path)) {
        if (attribute<bool>(params, "backward", false))
            throw CliError(fmt::format("{}: missing (params.json says \"backward\": true)", path.string()));
        return grads;  // a random dy
    }
    HostTensor dy = readTensor(path, declaredEntry(params, "dy"));
    if (dy.dtype() != inst.attentionOut.dtype() || dy.shape() != inst.attentionOut.shape())
        throw CliError(fmt::format("{}: holds {} {}; dy must have attentionOut's dtype and shape ({} {})",
                                   path.string(), attnopsDataTypeName(dy.dtype()), shapeText(dy.shape()),
                                   attnopsDataTypeName(inst.attentionOut.dtype()),
                                   shapeText(inst.attentionOut.shape())));
    grads.dy = std::move(dy);
    return grads;
}

Comparison compareOutputs(FaInstance& inst, const fs::path& dir, int64_t rows, FaGrads* grads,
                          const std::vector<int64_t>& sequences, const std::string& sequenceScope) {
    Comparison c;
    const json params = fs::exists(dir / "params.json") ? readParams(dir) : json::object();

    // Forward outputs.
    std::vector<std::pair<HostTensor FaInstance::*, HostTensor>> fileOutputs;
    for (const TensorSlot& slot : kTensors) {
        const fs::path path = fileOf(dir, slot.name);
        if (!slot.output || !fs::exists(path)) continue;
        HostTensor file = readTensor(path, declaredEntry(params, slot.name));
        const HostTensor& ours = inst.*slot.member;
        if (ours.empty() || file.dtype() != ours.dtype() || file.shape() != ours.shape()) {
            c.outputs.push_back(incomparable(slot.name, ours, file));
            continue;
        }
        c.outputs.push_back(elementwise(slot.name, ours, file));
        fileOutputs.emplace_back(slot.member, std::move(file));
    }
    if (!fileOutputs.empty()) {
        // The file's outputs in place of ours, checked against the reference, then ours back.
        for (auto& [member, tensor] : fileOutputs) std::swap(inst.*member, tensor);
        c.file = tools::checkForwardRows(inst, rows);
        for (auto& [member, tensor] : fileOutputs) std::swap(inst.*member, tensor);
        for (OutputComparison& oc : c.outputs) {
            if (!oc.comparable) continue;
            oc.rows = c.file.rows;
            const std::string scope = fmt::format("{} rows", c.file.rows);
            if (oc.name == "attentionOut") {
                judge(oc, c.file.maxAbsError, c.file.tolerance, c.file.nanMismatch, scope, c.file.firstFailure);
            } else {
                oc.metric = "max rel error";
                judge(oc, oc.name == "softmaxMax" ? c.file.maxSoftmaxMaxError : c.file.maxSoftmaxSumError,
                      c.file.statTolerance, false, scope);
            }
        }
    }

    // Gradients (a backward run): the file's in place of ours against the reference backward.
    const size_t forwardCount = c.outputs.size();
    std::vector<std::pair<const GradSlot*, HostTensor>> fileGrads;
    for (const GradSlot& slot : kGrads) {
        const fs::path path = fileOf(dir, slot.name);
        if (slot.index < 0 || !fs::exists(path)) continue;
        if (grads == nullptr)
            throw CliError(fmt::format("{} holds {}.npy but no dy.npy: the gradients cannot be recomputed",
                                       dir.string(), slot.name));
        HostTensor file = readTensor(path, declaredEntry(params, slot.name));
        const HostTensor& ours = grads->*slot.member;
        if (ours.empty() || file.dtype() != ours.dtype() || file.shape() != ours.shape()) {
            c.outputs.push_back(incomparable(slot.name, ours, file));
            continue;
        }
        c.outputs.push_back(elementwise(slot.name, ours, file));
        fileGrads.emplace_back(&slot, std::move(file));
    }
    if (!fileGrads.empty()) {
        for (auto& [slot, tensor] : fileGrads) std::swap(grads->*slot->member, tensor);
        const tools::GradCheck gc = tools::checkBackwardSequences(inst, *grads, sequences);
        for (auto& [slot, tensor] : fileGrads) std::swap(grads->*slot->member, tensor);
        for (size_t i = forwardCount; i < c.outputs.size(); ++i) {
            OutputComparison& oc = c.outputs[i];
            if (!oc.comparable) continue;
            const GradSlot* slot = nullptr;
            for (const GradSlot& g : kGrads)
                if (oc.name == g.name) slot = &g;
            const int t = slot->index;
            // dsink sums over every sequence and is always checked in full.
            judge(oc, gc.maxAbsError[t], gc.tolerance[t], gc.nanMismatch[t],
                  t == 3 ? std::string("every sequence") : sequenceScope,
                  gc.failure.rfind(oc.name + ":", 0) == 0 ? gc.failure : "");
        }
    }
    if (c.outputs.empty())
        throw CliError(fmt::format(
            "{} holds no output to compare (attentionOut.npy, softmaxMax.npy, softmaxSum.npy, dq.npy, dk.npy, dv.npy, "
            "dsink.npy)",
            dir.string()));
    c.passed = true;
    for (const OutputComparison& oc : c.outputs) c.passed = c.passed && oc.passed;
    return c;
}

json comparisonJson(const Comparison& c) { return {{"outputs", outputsJson(c.outputs)}, {"passed", c.passed}}; }

std::string comparisonText(const Comparison& c) { return outputsText(c.outputs); }

}  // namespace attnops::cli

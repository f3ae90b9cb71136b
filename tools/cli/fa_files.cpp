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

#include "npy.hpp"
#include "runner.hpp"

namespace attnops::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
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

const char* const kLayouts[] = {"BSH", "SBH", "BSND", "BNSD", "TND"};

fs::path fileOf(const fs::path& dir, const std::string& name) { return dir / (name + ".npy"); }

NpyType npyTypeOf(attnopsDataType d) {
    switch (d) {
        case ATTNOPS_FLOAT32: return NpyType::F32;
        case ATTNOPS_FLOAT16: return NpyType::F16;
        case ATTNOPS_BFLOAT16: return NpyType::U16;  // raw bf16 bits
        case ATTNOPS_UINT8: return NpyType::U8;
        case ATTNOPS_BOOL: return NpyType::Bool;
        case ATTNOPS_INT64: return NpyType::I64;
        default: throw CliError(fmt::format("cannot save a tensor of dtype {}", attnopsDataTypeName(d)));
    }
}

// The dtype of a loaded tensor: the file's descr, with params.json deciding between the types
// that share one (bf16 is stored as <u2; bool masks may be stored as |u1).
attnopsDataType loadedDtype(NpyType t, const std::string& declared, const std::string& where) {
    attnopsDataType fromFile = ATTNOPS_FLOAT32;
    switch (t) {
        case NpyType::F32: fromFile = ATTNOPS_FLOAT32; break;
        case NpyType::F16: fromFile = ATTNOPS_FLOAT16; break;
        case NpyType::U16: fromFile = ATTNOPS_BFLOAT16; break;
        case NpyType::U8: fromFile = ATTNOPS_UINT8; break;
        case NpyType::Bool: fromFile = ATTNOPS_BOOL; break;
        case NpyType::I64:
        case NpyType::I32:
            throw CliError(fmt::format("{}: integer data ({}) where a tensor is expected", where, npyDescr(t)));
    }
    if (declared.empty() || declared == attnopsDataTypeName(fromFile)) return fromFile;
    const bool byteMask =
        (fromFile == ATTNOPS_UINT8 || fromFile == ATTNOPS_BOOL) && (declared == "uint8" || declared == "bool");
    if (byteMask) return declared == "bool" ? ATTNOPS_BOOL : ATTNOPS_UINT8;
    throw CliError(
        fmt::format("{}: the file holds {} data but params.json says dtype \"{}\"", where, npyDescr(t), declared));
}

// params.json's entry for a tensor (null when it has none).
const json* declaredEntry(const json& params, const std::string& name) {
    if (!params.contains("tensors") || !params["tensors"].is_object() || !params["tensors"].contains(name))
        return nullptr;
    return &params["tensors"][name];
}

HostTensor readTensor(const fs::path& path, const json* declared) {
    const std::string where = path.string();
    NpyReader r(path);
    std::string declaredDtype;
    if (declared != nullptr && declared->contains("dtype") && (*declared)["dtype"].is_string())
        declaredDtype = (*declared)["dtype"].get<std::string>();
    const attnopsDataType dtype = loadedDtype(r.header().type, declaredDtype, where);
    if (declared != nullptr && declared->contains("shape") && (*declared)["shape"] != json(r.header().shape))
        throw CliError(fmt::format("{}: shape {} differs from params.json's {}", where, json(r.header().shape).dump(),
                                   (*declared)["shape"].dump()));
    HostTensor t(dtype, r.header().shape);
    r.readData(t.data());
    return t;
}

template <class T>
T attribute(const json& params, const char* key, T fallback, bool required = false) {
    if (!params.contains(key)) {
        if (required) throw CliError(fmt::format("params.json: \"{}\" is missing", key));
        return fallback;
    }
    try {
        return params.at(key).get<T>();
    } catch (const json::exception&) {
        throw CliError(fmt::format("params.json: \"{}\" has the wrong type: {}", key, params.at(key).dump()));
    }
}

std::string shapeText(const std::vector<int64_t>& shape) { return json(shape).dump(); }

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

// Element-wise comparison of our output with the file's.
OutputComparison elementwise(const std::string& name, const HostTensor& ours, const HostTensor& file) {
    OutputComparison c;
    c.name = name;
    c.elements = file.numel();
    double maxOurs = 0;
    for (int64_t i = 0; i < ours.numel(); ++i)
        if (std::isfinite(ours.get(i))) maxOurs = std::max(maxOurs, double(std::fabs(ours.get(i))));
    const double floor = std::max(1e-3 * maxOurs, 1e-30);
    double dot = 0, oursSq = 0, fileSq = 0;
    int64_t nonFinite = 0;
    for (int64_t i = 0; i < file.numel(); ++i) {
        const double a = ours.get(i), b = file.get(i);
        if (!std::isfinite(a) || !std::isfinite(b)) {
            if (a == b || (std::isnan(a) && std::isnan(b))) continue;  // -inf statistics of empty rows
            ++nonFinite;
            continue;
        }
        const double d = std::fabs(a - b);
        c.maxAbs = std::max(c.maxAbs, d);
        c.maxRel = std::max(c.maxRel, d / std::max(std::fabs(a), floor));
        dot += a * b;
        oursSq += a * a;
        fileSq += b * b;
    }
    c.cosine = (oursSq == 0 && fileSq == 0)   ? 1.0
               : (oursSq == 0 || fileSq == 0) ? 0.0
                                              : dot / std::sqrt(oursSq * fileSq);
    if (nonFinite > 0) {
        c.maxAbs = c.maxRel = std::numeric_limits<double>::infinity();
        c.note = fmt::format("{} elements differ in being finite (inf/NaN on one side only)", nonFinite);
    }
    return c;
}

}  // namespace

int saveFlashAttention(const FaInstance& inst, const fs::path& dir) {
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
        {"tensors", tensors},
    };
    std::ofstream out(dir / "params.json", std::ios::trunc);
    out << params.dump(2) << '\n';
    if (!out.flush()) throw CliError(fmt::format("{}: write error", (dir / "params.json").string()));
    return int(written.size());
}

json readParams(const fs::path& dir) {
    const fs::path path = dir / "params.json";
    std::ifstream in(path);
    if (!in)
        throw CliError(fmt::format("{}: cannot open (DIR must hold params.json and the .npy files)", path.string()));
    try {
        json j = json::parse(in);
        if (!j.is_object()) throw CliError(fmt::format("{}: expected a JSON object", path.string()));
        return j;
    } catch (const json::parse_error& e) {
        throw CliError(fmt::format("{}: {}", path.string(), e.what()));
    }
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

Comparison compareOutputs(FaInstance& inst, const fs::path& dir, int64_t rows) {
    Comparison c;
    const json params = fs::exists(dir / "params.json") ? readParams(dir) : json::object();
    std::vector<std::pair<HostTensor FaInstance::*, HostTensor>> fileOutputs;
    for (const TensorSlot& slot : kTensors) {
        const fs::path path = fileOf(dir, slot.name);
        if (!slot.output || !fs::exists(path)) continue;
        HostTensor file = readTensor(path, declaredEntry(params, slot.name));
        const HostTensor& ours = inst.*slot.member;
        if (ours.empty() || file.dtype() != ours.dtype() || file.shape() != ours.shape()) {
            OutputComparison oc;
            oc.name = slot.name;
            oc.comparable = false;
            oc.note = fmt::format("the file holds {} {}, attnops writes {} {}", attnopsDataTypeName(file.dtype()),
                                  shapeText(file.shape()), attnopsDataTypeName(ours.dtype()), shapeText(ours.shape()));
            c.outputs.push_back(oc);
            continue;
        }
        c.outputs.push_back(elementwise(slot.name, ours, file));
        fileOutputs.emplace_back(slot.member, std::move(file));
    }
    if (c.outputs.empty())
        throw CliError(fmt::format("{} holds no output to compare (attentionOut.npy, softmaxMax.npy, softmaxSum.npy)",
                                   dir.string()));

    // The file's outputs in place of ours, checked against the reference, then ours back.
    for (auto& [member, tensor] : fileOutputs) std::swap(inst.*member, tensor);
    c.file = tools::checkForwardRows(inst, rows);
    for (auto& [member, tensor] : fileOutputs) std::swap(inst.*member, tensor);

    c.passed = true;
    for (OutputComparison& oc : c.outputs) {
        if (!oc.comparable) {
            c.passed = false;
            continue;
        }
        if (oc.name == "attentionOut") {
            oc.referenceError = c.file.maxAbsError;
            oc.tolerance = c.file.tolerance;
            oc.passed = !c.file.nanMismatch && c.file.maxAbsError <= c.file.tolerance;
            if (!oc.passed && !c.file.firstFailure.empty()) oc.note = c.file.firstFailure;
        } else {
            oc.referenceError = oc.name == "softmaxMax" ? c.file.maxSoftmaxMaxError : c.file.maxSoftmaxSumError;
            oc.tolerance = c.file.statTolerance;
            oc.passed = oc.referenceError <= oc.tolerance;
        }
        c.passed = c.passed && oc.passed;
    }
    return c;
}

json comparisonJson(const Comparison& c) {
    json outputs = json::object();
    for (const OutputComparison& oc : c.outputs) {
        if (!oc.comparable) {
            outputs[oc.name] = {{"passed", false}, {"note", oc.note}};
            continue;
        }
        json o = {
            {"elements", oc.elements},
            {"attnopsVsFile", {{"maxAbsError", oc.maxAbs}, {"maxRelError", oc.maxRel}, {"cosine", oc.cosine}}},
            {"fileVsReference", {{"rows", c.file.rows}, {"error", oc.referenceError}, {"tolerance", oc.tolerance}}},
            {"passed", oc.passed}};
        if (!oc.note.empty()) o["note"] = oc.note;
        outputs[oc.name] = o;
    }
    return {{"outputs", outputs}, {"passed", c.passed}};
}

std::string comparisonText(const Comparison& c) {
    std::string s;
    for (const OutputComparison& oc : c.outputs) {
        if (!oc.comparable) {
            s += fmt::format("  {:<13} FAIL: {}\n", oc.name, oc.note);
            continue;
        }
        s += fmt::format("  {:<13} attnops vs file ({} elements): max abs {:.3g}, max rel {:.3g}, cosine {:.7f}\n",
                         oc.name, oc.elements, oc.maxAbs, oc.maxRel, oc.cosine);
        s += fmt::format("  {:<13} file vs reference ({} rows): {} {:.3g} vs tolerance {:.3g}: {}\n", "", c.file.rows,
                         oc.name == "attentionOut" ? "max abs error" : "max rel error", oc.referenceError, oc.tolerance,
                         oc.passed ? "PASS" : "FAIL");
        if (!oc.note.empty()) s += fmt::format("  {:<13} {}\n", "", oc.note);
    }
    return s;
}

}  // namespace attnops::cli

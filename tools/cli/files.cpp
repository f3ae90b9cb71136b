// Directories of .npy tensors and params.json: the pieces every operator's files share.
#include "files.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>

namespace attnops::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tools::HostTensor;

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
        // int8 KV caches and int32 block tables are tensors; int64 files are the int arrays.
        case NpyType::I8: fromFile = ATTNOPS_INT8; break;
        case NpyType::I32: fromFile = ATTNOPS_INT32; break;
        case NpyType::U64: fromFile = ATTNOPS_UINT64; break;  // uint64 deqScale1/deqScale2 (spec 9.2)
        case NpyType::I64:
            throw CliError(fmt::format("{}: integer data ({}) where a tensor is expected", where, npyDescr(t)));
    }
    if (declared.empty() || declared == attnopsDataTypeName(fromFile)) return fromFile;
    const bool byteMask =
        (fromFile == ATTNOPS_UINT8 || fromFile == ATTNOPS_BOOL) && (declared == "uint8" || declared == "bool");
    if (byteMask) return declared == "bool" ? ATTNOPS_BOOL : ATTNOPS_UINT8;
    throw CliError(
        fmt::format("{}: the file holds {} data but params.json says dtype \"{}\"", where, npyDescr(t), declared));
}

}  // namespace

fs::path npyPath(const fs::path& dir, const std::string& name) { return dir / (name + ".npy"); }

NpyType npyTypeOf(attnopsDataType d) {
    switch (d) {
        case ATTNOPS_FLOAT32: return NpyType::F32;
        case ATTNOPS_FLOAT16: return NpyType::F16;
        case ATTNOPS_BFLOAT16: return NpyType::U16;  // raw bf16 bits
        case ATTNOPS_UINT8: return NpyType::U8;
        case ATTNOPS_BOOL: return NpyType::Bool;
        case ATTNOPS_INT64: return NpyType::I64;
        case ATTNOPS_INT32: return NpyType::I32;
        case ATTNOPS_INT8: return NpyType::I8;
        case ATTNOPS_UINT64: return NpyType::U64;  // full quant deq scales: the fp32 bits in the low half
        default: throw CliError(fmt::format("cannot save a tensor of dtype {}", attnopsDataTypeName(d)));
    }
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

void writeParams(const fs::path& dir, const json& params) {
    std::ofstream out(dir / "params.json", std::ios::trunc);
    out << params.dump(2) << '\n';
    if (!out.flush()) throw CliError(fmt::format("{}: write error", (dir / "params.json").string()));
}

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

void saveTensor(const fs::path& dir, const std::string& name, attnopsDataType dtype, const std::vector<int64_t>& shape,
                const void* data, json& tensors) {
    writeNpy(npyPath(dir, name), npyTypeOf(dtype), shape, data);
    tensors[name] = {{"file", name + ".npy"}, {"dtype", attnopsDataTypeName(dtype)}, {"shape", shape}};
}

std::string shapeText(const std::vector<int64_t>& shape) { return json(shape).dump(); }

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

OutputComparison incomparable(const std::string& name, const HostTensor& ours, const HostTensor& file) {
    OutputComparison oc;
    oc.name = name;
    oc.comparable = false;
    oc.note = ours.empty()
                  ? fmt::format("the file holds {} {}, attnops writes no {}", attnopsDataTypeName(file.dtype()),
                                shapeText(file.shape()), name)
                  : fmt::format("the file holds {} {}, attnops writes {} {}", attnopsDataTypeName(file.dtype()),
                                shapeText(file.shape()), attnopsDataTypeName(ours.dtype()), shapeText(ours.shape()));
    return oc;
}

void judge(OutputComparison& oc, double referenceError, double tolerance, bool nanMismatch, const std::string& scope,
           const std::string& failure) {
    oc.referenceError = referenceError;
    oc.tolerance = tolerance;
    oc.scope = scope;
    oc.passed = oc.comparable && !nanMismatch && std::isfinite(referenceError) && referenceError <= tolerance;
    if (nanMismatch) {
        oc.note = failure.empty() ? "NaN where the reference has none (or the reverse)" : failure;
    } else if (!oc.passed && !failure.empty() && oc.note.empty()) {
        oc.note = failure;
    }
}

json outputsJson(const std::vector<OutputComparison>& outputs) {
    json all = json::object();
    for (const OutputComparison& oc : outputs) {
        if (!oc.comparable) {
            all[oc.name] = {{"passed", false}, {"note", oc.note}};
            continue;
        }
        json reference = {
            {"scope", oc.scope}, {"metric", oc.metric}, {"error", oc.referenceError}, {"tolerance", oc.tolerance}};
        if (oc.rows >= 0) reference["rows"] = oc.rows;
        json o = {{"elements", oc.elements},
                  {"attnopsVsFile", {{"maxAbsError", oc.maxAbs}, {"maxRelError", oc.maxRel}, {"cosine", oc.cosine}}},
                  {"fileVsReference", reference},
                  {"passed", oc.passed}};
        if (!oc.note.empty()) o["note"] = oc.note;
        all[oc.name] = o;
    }
    return all;
}

std::string outputsText(const std::vector<OutputComparison>& outputs) {
    size_t width = 13;
    for (const OutputComparison& oc : outputs) width = std::max(width, oc.name.size());
    std::string s;
    for (const OutputComparison& oc : outputs) {
        if (!oc.comparable) {
            s += fmt::format("  {:<{}} FAIL: {}\n", oc.name, width, oc.note);
            continue;
        }
        s += fmt::format("  {:<{}} attnops vs file ({} elements): max abs {:.3g}, max rel {:.3g}, cosine {:.7f}\n",
                         oc.name, width, oc.elements, oc.maxAbs, oc.maxRel, oc.cosine);
        s += fmt::format("  {:<{}} file vs reference ({}): {} {:.3g} vs tolerance {:.3g}: {}\n", "", width, oc.scope,
                         oc.metric, oc.referenceError, oc.tolerance, oc.passed ? "PASS" : "FAIL");
        if (!oc.note.empty()) s += fmt::format("  {:<{}} {}\n", "", width, oc.note);
    }
    return s;
}

}  // namespace attnops::cli

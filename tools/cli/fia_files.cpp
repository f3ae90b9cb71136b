// Saving a FusedInferAttentionScore call to a directory, loading it back, and comparing outputs.
#include "fia_files.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "npy.hpp"
#include "runner.hpp"

namespace attnops::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tools::FiaInstance;
using tools::FiaProblem;
using tools::HostTensor;

// Every tensor of a call, by its API argument name.
struct Slot {
    const char* name;
    HostTensor FiaInstance::*member;
    bool output;
};
const Slot kSlots[] = {
    {"query", &FiaInstance::query, false},
    {"key", &FiaInstance::key, false},
    {"value", &FiaInstance::value, false},
    {"attenMask", &FiaInstance::attenMask, false},
    {"blockTable", &FiaInstance::blockTable, false},
    {"keyAntiquantScale", &FiaInstance::keyScale, false},
    {"keyAntiquantOffset", &FiaInstance::keyOffset, false},
    {"valueAntiquantScale", &FiaInstance::valueScale, false},
    {"valueAntiquantOffset", &FiaInstance::valueOffset, false},
    {"learnableSink", &FiaInstance::sink, false},
    {"antiquantScale", &FiaInstance::antiquantScale, false},
    {"antiquantOffset", &FiaInstance::antiquantOffset, false},
    {"deqScale1", &FiaInstance::deqScale1, false},
    {"quantScale1", &FiaInstance::quantScale1, false},
    {"deqScale2", &FiaInstance::deqScale2, false},
    {"dequantScaleQuery", &FiaInstance::dequantScaleQuery, false},
    {"quantScale2", &FiaInstance::quantScale2, false},
    {"quantOffset2", &FiaInstance::quantOffset2, false},
    {"keySharedPrefix", &FiaInstance::keySharedPrefix, false},
    {"valueSharedPrefix", &FiaInstance::valueSharedPrefix, false},
    {"pseShift", &FiaInstance::pseShift, false},
    {"queryRope", &FiaInstance::queryRope, false},
    {"keyRope", &FiaInstance::keyRope, false},
    {"attentionOut", &FiaInstance::attentionOut, true},
    {"softmaxLse", &FiaInstance::softmaxLse, true},
};
constexpr const char* kQLens = "actualSeqLengths";
constexpr const char* kKvLens = "actualSeqLengthsKv";
constexpr const char* kPrefixLen = "actualSharedPrefixLen";
// The int64 left-padding tensors, saved and read as integer arrays.
const std::pair<const char*, HostTensor FiaInstance::*> kPaddings[] = {{"queryPaddingSize", &FiaInstance::queryPaddingSize},
                                                                       {"kvPaddingSize", &FiaInstance::kvPaddingSize}};

// File names of tensor-list key/value entries: key_0.npy, value_0.npy, ...
std::string listName(const char* base, size_t i) { return fmt::format("{}_{}", base, i); }

const std::vector<std::string>& layoutNames() {
    static const std::vector<std::string> names = {"BSH",      "BSND",     "BNSD",      "TND",       "NTD",       "BNSD_BSND", "BSH_BNSD",
                                                   "BSND_BNSD", "BSH_NBSD", "BSND_NBSD", "BNSD_NBSD", "NTD_TND", "TND_NTD"};
    return names;
}

std::vector<int64_t> lengthsOf(const std::vector<int64_t>& cumulative) {
    std::vector<int64_t> lengths;
    int64_t previous = 0;
    for (int64_t c : cumulative) {
        lengths.push_back(std::max<int64_t>(0, c - previous));
        previous = c;
    }
    return lengths;
}

// A tensor's dimension, or a clear error naming the file and the rank the layout needs.
int64_t dimOf(const HostTensor& t, size_t rank, size_t axis, const fs::path& path, const std::string& why) {
    if (t.shape().size() != rank)
        throw CliError(fmt::format("{}: shape {} has rank {}, {} needs rank {}", path.string(), shapeText(t.shape()),
                                   t.shape().size(), why, rank));
    return t.shape()[axis];
}

}  // namespace

int saveFusedInferAttention(const FiaInstance& inst, const fs::path& dir) {
    const FiaProblem& p = inst.problem;
    fs::create_directories(dir);
    json tensors = json::object();
    int written = 0;
    for (const Slot& slot : kSlots) {
        const HostTensor& t = inst.*slot.member;
        if (t.empty()) {
            fs::remove(npyPath(dir, slot.name));
            continue;
        }
        saveTensor(dir, slot.name, t.dtype(), t.shape(), t.data(), tensors);
        ++written;
    }
    for (const auto& [name, member] : kPaddings) {
        const HostTensor& t = inst.*member;
        if (t.empty()) {
            fs::remove(npyPath(dir, name));
            continue;
        }
        writeNpy(npyPath(dir, name), NpyType::I64, t.shape(), static_cast<const int64_t*>(t.data()));
        tensors[name] = {{"file", std::string(name) + ".npy"}, {"dtype", "int64"}, {"shape", t.shape()}};
        ++written;
    }
    for (size_t i = 0; i < inst.keyList.size(); ++i)
        for (const auto& [base, list] : {std::pair{"key", &inst.keyList}, std::pair{"value", &inst.valueList}}) {
            const HostTensor& t = (*list)[i];
            saveTensor(dir, listName(base, i), t.dtype(), t.shape(), t.data(), tensors);
            ++written;
        }
    for (const auto& [name, pass, values] : {std::tuple{kQLens, inst.passQLens, &inst.qLensArg},
                                             std::tuple{kKvLens, inst.passKvLens, &inst.kvLensArg},
                                             std::tuple{kPrefixLen, !inst.prefixLenArg.empty(), &inst.prefixLenArg}}) {
        if (!pass) {
            fs::remove(npyPath(dir, name));
            continue;
        }
        writeNpy(npyPath(dir, name), NpyType::I64, {int64_t(values->size())}, values->data());
        tensors[name] = {{"file", std::string(name) + ".npy"}, {"dtype", "int64"}, {"shape", {values->size()}}};
        ++written;
    }
    const json params = {
        {"op", kFusedInferAttentionOp},
        {"attnopsVersion", attnopsVersion()},
        {"problem", p.describe()},
        {"numHeads", p.heads},
        {"scaleValue", std::isnan(p.scale) ? 1.0 / std::sqrt(double(p.dim)) : p.scale},
        {"preTokens", p.preTokens},
        {"nextTokens", p.nextTokens},
        {"inputLayout", p.layout},
        {"numKeyValueHeads", p.kvHeads},
        {"sparseMode", p.sparseMode},
        {"innerPrecise", 0},
        {"blockSize", p.paged() ? p.blockSize : 0},
        {"antiquantMode", p.combinedQuant ? p.keyQuantMode : 0},
        {"softmaxLseFlag", p.lse},
        {"keyAntiquantMode", p.keyQuantMode},
        {"valueAntiquantMode", p.valueQuantMode},
        {"queryQuantMode", p.mlaFullQuant ? 3 : 0},
        {"cacheFormat", p.cache},  // informative: the key's rank decides on load
        {"keyCount", inst.keyList.empty() ? size_t(1) : inst.keyList.size()},  // > 1: key_<i>.npy, value_<i>.npy
        {"tensors", tensors},
    };
    writeParams(dir, params);
    return written;
}

FiaInstance loadFusedInferAttention(const fs::path& dir, const json& params) {
    // Attributes the harness does not pass: refuse rather than silently run another call.
    if (attribute<int64_t>(params, "innerPrecise", 0) != 0)
        throw CliError(fmt::format("params.json: \"innerPrecise\" = {} is not supported by `attnops run` (only 0)",
                                   params["innerPrecise"].dump()));
    const int64_t queryQuantMode = attribute<int64_t>(params, "queryQuantMode", 0);
    if (queryQuantMode != 0 && queryQuantMode != 3)
        throw CliError(fmt::format("params.json: \"queryQuantMode\" = {} is not supported by `attnops run` (0, or 3: MLA full quant)",
                                   queryQuantMode));
    std::map<std::string, HostTensor> files;
    for (const Slot& slot : kSlots) {
        if (slot.output) continue;
        const fs::path path = npyPath(dir, slot.name);
        const json* declared = declaredEntry(params, slot.name);
        if (fs::exists(path))
            files.emplace(slot.name, readTensor(path, declared));
        else if (declared != nullptr)
            throw CliError(fmt::format("{}: listed in params.json but missing", path.string()));
    }
    // Tensor-list key/value: key_<i>.npy and value_<i>.npy, one pair per batch.
    const int64_t keyCount = attribute<int64_t>(params, "keyCount", 1);
    std::vector<HostTensor> keyList, valueList;
    for (int64_t i = 0; keyCount > 1 && i < keyCount; ++i)
        for (auto [base, list] : {std::pair{"key", &keyList}, std::pair{"value", &valueList}}) {
            const std::string name = listName(base, size_t(i));
            if (!fs::exists(npyPath(dir, name))) throw CliError(fmt::format("{}: missing (keyCount = {})", npyPath(dir, name).string(), keyCount));
            list->push_back(readTensor(npyPath(dir, name), declaredEntry(params, name)));
        }
    if (keyCount > 1) {  // batch 0's tensors stand for key and value in the shape parsing below
        files.emplace("key", readTensor(npyPath(dir, listName("key", 0)), nullptr));
        files.emplace("value", readTensor(npyPath(dir, listName("value", 0)), nullptr));
    }
    for (const char* required : {"query", "key", "value"})
        if (!files.count(required)) throw CliError(fmt::format("{}: missing", npyPath(dir, required).string()));
    std::map<std::string, std::vector<int64_t>> arrays;
    for (const char* name : {kQLens, kKvLens, kPrefixLen}) {
        const fs::path path = npyPath(dir, name);
        if (fs::exists(path)) arrays.emplace(name, readNpyInts(path));
        else if (declaredEntry(params, name) != nullptr)
            throw CliError(fmt::format("{}: listed in params.json but missing", path.string()));
    }

    FiaProblem p;
    p.layout = attribute<std::string>(params, "inputLayout", "", true);
    if (std::find(layoutNames().begin(), layoutNames().end(), p.layout) == layoutNames().end())
        throw CliError(fmt::format("params.json: inputLayout \"{}\" is not one of {}", p.layout, fmt::join(layoutNames(), ", ")));
    const std::string in = p.inLayout();
    p.heads = attribute<int64_t>(params, "numHeads", 0, true);
    if (p.heads <= 0) throw CliError(fmt::format("params.json: numHeads = {} must be positive", p.heads));
    p.kvHeads = attribute<int64_t>(params, "numKeyValueHeads", 0);
    if (p.kvHeads == 0) p.kvHeads = p.heads;  // the API's rule: 0 means numHeads
    if (p.kvHeads < 0) throw CliError(fmt::format("params.json: numKeyValueHeads = {} is negative", p.kvHeads));
    p.scale = attribute<double>(params, "scaleValue", 1.0);
    p.preTokens = attribute<int64_t>(params, "preTokens", tools::kNoBand);
    p.nextTokens = attribute<int64_t>(params, "nextTokens", tools::kNoBand);
    p.sparseMode = attribute<int64_t>(params, "sparseMode", 0);
    p.lse = attribute<bool>(params, "softmaxLseFlag", false);
    p.keyQuantMode = attribute<int64_t>(params, "keyAntiquantMode", 0);
    p.valueQuantMode = attribute<int64_t>(params, "valueAntiquantMode", 0);
    const int64_t antiquantMode = attribute<int64_t>(params, "antiquantMode", 0);

    // Shapes: the query gives batch, rows and D; the key (or the cache) the KV side.
    const HostTensor& query = files.at("query");
    const HostTensor& value = files.at("value");
    const fs::path qPath = npyPath(dir, "query"), vPath = npyPath(dir, "value");
    const std::string qWhy = "inputLayout " + p.layout;
    p.dtype = query.dtype();
    // queryQuantMode 3: MLA full quantisation (int8 query, output in the query rope's dtype);
    // otherwise an int8 query is full int8 quantisation: fp16 output (or int8) and pse.
    p.mlaFullQuant = queryQuantMode == 3;
    p.fullQuant = p.dtype == ATTNOPS_INT8 && !p.mlaFullQuant;
    if (p.fullQuant) p.dtype = ATTNOPS_FLOAT16;
    if (p.mlaFullQuant) p.dtype = files.count("queryRope") ? files.at("queryRope").dtype() : ATTNOPS_BFLOAT16;
    if (files.count("deqScale1")) p.deqScaleDType = files.at("deqScale1").dtype();  // fp32 or uint64, passed as given
    int64_t qRows = 0;
    if (p.tnd()) {
        qRows = dimOf(query, 3, in == "TND" ? 0 : 1, qPath, qWhy);
        p.dim = query.shape()[2];
    } else {
        const size_t rank = in == "BSH" ? 3 : 4;
        p.batch = dimOf(query, rank, 0, qPath, qWhy);
        p.qSeqLen = query.shape()[in == "BNSD" ? 2 : 1];
        p.dim = in == "BSH" ? query.shape()[2] / p.heads : query.shape()[3];
    }
    const bool paged = files.count("blockTable") > 0;
    const HostTensor& key = files.at("key");
    p.int8Kv = key.dtype() == ATTNOPS_INT8;
    p.int4Kv = key.dtype() == ATTNOPS_INT32;  // eight int4 per element
    const int64_t pack = p.int4Kv ? 8 : 1;
    if (paged) {
        const size_t rank = key.shape().size();
        p.cache = rank == 3 ? "BnBsH" : rank == 4 ? "BnNBsD" : rank == 5 ? "NZ" : "";
        if (p.cache.empty())
            throw CliError(fmt::format("{}: a paged cache (blockTable.npy is present) has rank 3 (BnBsH), 4 (BnNBsD) "
                                       "or 5 (NZ), the file has shape {}",
                                       npyPath(dir, "key").string(), shapeText(key.shape())));
        p.blockSize = attribute<int64_t>(params, "blockSize", 0, true);
        const HostTensor& table = files.at("blockTable");
        if (table.shape().size() == 2) p.maxBlocksPerSeq = table.shape()[1];
        p.vDim = rank == 3 ? dimOf(value, 3, 2, vPath, "a BnBsH cache") / p.kvHeads
                 : rank == 4 ? dimOf(value, 4, 3, vPath, "a BnNBsD cache")
                             : dimOf(value, 5, 2, vPath, "an NZ cache") * value.shape()[4];
    } else {
        const size_t rank = query.shape().size();
        const size_t rowAxis = in == "BNSD" ? 2 : in == "TND" ? 0 : 1;  // BSH, BSND, NTD: 1
        p.kvSeqLen = dimOf(key, rank, rowAxis, npyPath(dir, "key"), qWhy);
        p.vDim = pack * (in == "BSH" ? dimOf(value, 3, 2, vPath, qWhy) / p.kvHeads : dimOf(value, rank, rank - 1, vPath, qWhy));
    }

    // Lengths exactly as given: TND's query array (and a contiguous KV's) is cumulative, a paged
    // KV array per batch.
    if (p.tnd() && (!arrays.count(kQLens) || !arrays.count(kKvLens)))
        throw CliError(fmt::format("inputLayout {} needs {} and {}", p.layout, npyPath(dir, kQLens).string(),
                                   npyPath(dir, kKvLens).string()));
    if (p.tnd()) {
        p.qLens = lengthsOf(arrays.at(kQLens));
        p.extraQRows = qRows - (arrays.at(kQLens).empty() ? 0 : arrays.at(kQLens).back());
        p.kvLens = paged ? arrays.at(kKvLens) : lengthsOf(arrays.at(kKvLens));
    } else {
        if (arrays.count(kQLens)) p.qLens = arrays.at(kQLens);
        if (arrays.count(kKvLens)) p.kvLens = arrays.at(kKvLens);
    }
    if (paged)
        for (int64_t len : p.kvLens) p.kvSeqLen = std::max(p.kvSeqLen, len);
    p.combinedQuant = files.count("antiquantScale") > 0 && files.count("keyAntiquantScale") == 0;
    if (p.combinedQuant) {  // the problem records the combined style's mode as the key/value modes
        if (antiquantMode != 0 && antiquantMode != 1)
            throw CliError(fmt::format("params.json: antiquantMode = {} must be 0 or 1", antiquantMode));
        p.keyQuantMode = p.valueQuantMode = antiquantMode;
    }
    p.quantOffset = files.count("keyAntiquantOffset") > 0 || files.count("antiquantOffset") > 0;
    p.int8Out = files.count("quantScale2") > 0;
    p.outQuantOffset = files.count("quantOffset2") > 0;
    p.sink = files.count("learnableSink") > 0;
    p.maskKind = files.count("attenMask") ? "file" : "none";
    // Left padding, the shared prefix and the tensor list (informative: the files are passed as they are).
    std::map<std::string, std::vector<int64_t>> paddings;
    for (const auto& [name, member] : kPaddings) {
        const fs::path path = npyPath(dir, name);
        if (fs::exists(path)) paddings.emplace(name, readNpyInts(path));
        else if (declaredEntry(params, name) != nullptr)
            throw CliError(fmt::format("{}: listed in params.json but missing", path.string()));
    }
    const auto firstInt = [&](const char* name) {
        return paddings.count(name) && !paddings.at(name).empty() ? paddings.at(name)[0] : int64_t(-1);
    };
    p.queryPadding = firstInt("queryPaddingSize");
    p.kvPadding = firstInt("kvPaddingSize");
    if (files.count("keySharedPrefix") && files.at("keySharedPrefix").shape().size() >= 3)
        p.prefixRows = files.at("keySharedPrefix").shape()[in == "BNSD" ? 2 : 1];
    if (arrays.count(kPrefixLen) && !arrays.at(kPrefixLen).empty()) p.prefixLen = arrays.at(kPrefixLen)[0];
    p.kvList = keyCount > 1;
    p.pse = files.count("pseShift") ? "file" : "none";
    if (files.count("queryRope")) {  // MLA: the rope width from the query rope's last axis
        const HostTensor& qr = files.at("queryRope");
        if (qr.shape().size() != query.shape().size())
            throw CliError(fmt::format("{}: shape {} must have the query's rank {}", npyPath(dir, "queryRope").string(),
                                       shapeText(qr.shape()), query.shape().size()));
        p.ropeDim = p.layout == "BSH" ? qr.shape().back() / p.heads : qr.shape().back();
    }

    FiaInstance inst(p, FiaInstance::NoInputs{});
    for (const Slot& slot : kSlots) {
        auto it = files.find(slot.name);
        if (it != files.end() && !(p.kvList && (slot.member == &FiaInstance::key || slot.member == &FiaInstance::value)))
            inst.*slot.member = std::move(it->second);
    }
    for (const auto& [name, member] : kPaddings) {
        if (!paddings.count(name)) continue;
        const std::vector<int64_t>& v = paddings.at(name);
        inst.*member = HostTensor(ATTNOPS_INT64, {int64_t(v.size())});
        std::copy(v.begin(), v.end(), static_cast<int64_t*>((inst.*member).data()));
    }
    inst.keyList = std::move(keyList);
    inst.valueList = std::move(valueList);
    if (arrays.count(kPrefixLen)) inst.prefixLenArg = arrays.at(kPrefixLen);
    inst.passQLens = arrays.count(kQLens) > 0;
    inst.passKvLens = arrays.count(kKvLens) > 0;
    if (inst.passQLens) inst.qLensArg = arrays.at(kQLens);
    if (inst.passKvLens) inst.kvLensArg = arrays.at(kKvLens);

    // Outputs: the output layout's shape with Dv (the call checks the rest).
    inst.attentionOut = HostTensor(p.int8Out ? ATTNOPS_INT8 : p.dtype, tools::fiaOutputShape(p, p.tnd() ? qRows : p.qSeqLen));
    if (p.lse)
        inst.softmaxLse = HostTensor(ATTNOPS_FLOAT32, p.tnd() ? std::vector<int64_t>{qRows, p.heads, 1}
                                                              : std::vector<int64_t>{p.batch, p.heads, p.qSeqLen, 1});
    return inst;
}

FiaComparison compareFusedInferAttention(FiaInstance& inst, const fs::path& dir) {
    FiaComparison c;
    const json params = fs::exists(dir / "params.json") ? readParams(dir) : json::object();
    std::vector<std::pair<const Slot*, HostTensor>> fileOutputs;
    for (const Slot& slot : kSlots) {
        if (!slot.output) continue;
        const fs::path path = npyPath(dir, slot.name);
        if (!fs::exists(path)) continue;
        HostTensor file = readTensor(path, declaredEntry(params, slot.name));
        const HostTensor& ours = inst.*slot.member;
        if (ours.empty() || file.dtype() != ours.dtype() || file.shape() != ours.shape()) {
            c.outputs.push_back(incomparable(slot.name, ours, file));
            continue;
        }
        c.outputs.push_back(elementwise(slot.name, ours, file));
        fileOutputs.emplace_back(&slot, std::move(file));
    }
    if (c.outputs.empty())
        throw CliError(fmt::format("{} holds no output to compare (attentionOut.npy, softmaxLse.npy)", dir.string()));
    // The file's values in place of ours against the reference, then ours back.
    for (auto& [slot, tensor] : fileOutputs) std::swap(inst.*slot->member, tensor);
    const tools::FiaCheck rc = tools::checkFia(inst);
    for (auto& [slot, tensor] : fileOutputs) std::swap(inst.*slot->member, tensor);
    // checkFia stops at nothing but records the first failure; it names softmaxLse rows "lse".
    const bool lseFailed = !rc.passed && rc.firstFailure.rfind("lse", 0) == 0;
    const std::string scope = fmt::format("every row ({})", rc.rows);
    for (OutputComparison& oc : c.outputs) {
        if (!oc.comparable) continue;
        if (oc.name == "attentionOut") {
            judge(oc, rc.maxAbsError, rc.tolerance, false, scope);
            if (!rc.passed && !lseFailed) {
                oc.passed = false;
                oc.note = rc.firstFailure;
            }
        } else {
            // The lse bound is relative to 1 + |lse| per row: the verdict is checkFia's.
            judge(oc, rc.maxLseError, rc.lseTolerance, false, scope);
            oc.metric = "max abs error (bound x (1 + |lse|) per row)";
            oc.passed = !lseFailed;
            oc.note = lseFailed ? rc.firstFailure : "";
        }
    }
    c.passed = true;
    for (const OutputComparison& oc : c.outputs) c.passed = c.passed && oc.passed;
    return c;
}

}  // namespace attnops::cli

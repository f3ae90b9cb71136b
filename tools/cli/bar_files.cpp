// Saving a BlockAttentionResiduals call to a directory, loading it back, and comparing outputs.
#include "bar_files.hpp"

#include <fmt/format.h>

#include <cstring>
#include <map>
#include <utility>

#include "npy.hpp"
#include "runner.hpp"

namespace attnops::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tools::BarInstance;
using tools::BarProblem;
using tools::HostTensor;
using tools::StridedTensor;

enum class Kind { Input, Forward, Stats, GradInput, GradOutput };

// Every contiguous tensor of a call, by its API argument name (blockRes, a strided view, apart).
struct Slot {
    const char* name;
    HostTensor BarInstance::*member;
    Kind kind;
};
const Slot kSlots[] = {
    {"partialBlock", &BarInstance::partialBlock, Kind::Input},
    {"projWeight", &BarInstance::projWeight, Kind::Input},
    {"normWeight", &BarInstance::normWeight, Kind::Input},
    {"hiddenStates", &BarInstance::hiddenStates, Kind::Forward},
    {"invNorm", &BarInstance::invNorm, Kind::Stats},
    {"probs", &BarInstance::probs, Kind::Stats},
    {"gradHiddenStates", &BarInstance::gradHiddenStates, Kind::GradInput},
    {"gradPartialBlock", &BarInstance::gradPartialBlock, Kind::GradOutput},
    {"gradBlockRes", &BarInstance::gradBlockRes, Kind::GradOutput},
    {"gradProjWeight", &BarInstance::gradProjWeight, Kind::GradOutput},
    {"gradNormWeight", &BarInstance::gradNormWeight, Kind::GradOutput},
};
constexpr const char* kBlockRes = "blockRes";

const char* layoutName(bool sourceMajor) { return sourceMajor ? "source-major" : "token-major"; }

// Calls copy(viewByte, denseByte, rowBytes) for each H-element row of the strided blockRes view
// and its place in a contiguous [T,N,H] tensor (the hidden axis has stride 1 in both of
// BarInstance's layouts).
template <class Copy>
void forEachRow(const StridedTensor& view, Copy copy) {
    const std::vector<int64_t>& shape = view.shape();
    const size_t elem = attnopsDataTypeSize(view.dtype());
    const size_t rowBytes = size_t(shape[2]) * elem;
    if (rowBytes == 0) return;
    for (int64_t t = 0; t < shape[0]; ++t)
        for (int64_t i = 0; i < shape[1]; ++i)
            copy(size_t(view.offset({t, i, 0})) * elem, size_t(t * shape[1] + i) * rowBytes, rowBytes);
}

HostTensor denseBlockRes(const StridedTensor& view) {
    HostTensor dense(view.dtype(), view.shape());
    auto* out = static_cast<uint8_t*>(dense.data());
    const auto* in = static_cast<const uint8_t*>(view.data());
    forEachRow(view, [&](size_t v, size_t d, size_t n) { std::memcpy(out + d, in + v, n); });
    return dense;
}

void setBlockRes(StridedTensor& view, const HostTensor& dense) {
    auto* out = static_cast<uint8_t*>(view.data());
    const auto* in = static_cast<const uint8_t*>(dense.data());
    forEachRow(view, [&](size_t v, size_t d, size_t n) { std::memcpy(out + v, in + d, n); });
}

std::string tokenScope(int64_t checked, int64_t tokens) {
    return checked >= tokens ? std::string("every token") : fmt::format("{} of {} tokens", checked, tokens);
}

}  // namespace

int saveBlockAttentionResiduals(const BarInstance& inst, const fs::path& dir, bool needBackward, bool backward) {
    const BarProblem& p = inst.problem;
    fs::create_directories(dir);
    json tensors = json::object();
    int written = 0;
    for (const Slot& slot : kSlots) {
        const bool wanted = slot.kind == Kind::Input || slot.kind == Kind::Forward ||
                            (slot.kind == Kind::Stats && needBackward) ||
                            ((slot.kind == Kind::GradInput || slot.kind == Kind::GradOutput) && backward);
        const HostTensor& t = inst.*slot.member;
        if (wanted && !t.empty()) {
            saveTensor(dir, slot.name, t.dtype(), t.shape(), t.data(), tensors);
            ++written;
        } else {
            fs::remove(npyPath(dir, slot.name));
        }
    }
    const HostTensor blockRes = denseBlockRes(inst.blockRes);
    saveTensor(dir, kBlockRes, blockRes.dtype(), blockRes.shape(), blockRes.data(), tensors);
    ++written;

    const json params = {
        {"op", kBlockAttentionResidualsOp},
        {"attnopsVersion", attnopsVersion()},
        {"problem", p.describe()},
        {"eps", p.eps},
        {"validBlockNum", p.validBlockNum},
        {"needBackward", needBackward},
        {"backward", backward},
        {"blockResLayout", layoutName(p.sourceMajor)},
        {"tensors", tensors},
    };
    writeParams(dir, params);
    return written;
}

LoadedBar loadBlockAttentionResiduals(const fs::path& dir, const json& params) {
    std::map<std::string, HostTensor> files;
    for (const char* name : {"partialBlock", kBlockRes, "projWeight", "normWeight", "gradHiddenStates"}) {
        const fs::path path = npyPath(dir, name);
        const json* declared = declaredEntry(params, name);
        if (fs::exists(path))
            files.emplace(name, readTensor(path, declared));
        else if (declared != nullptr)
            throw CliError(fmt::format("{}: listed in params.json but missing", path.string()));
    }
    for (const char* required : {"partialBlock", kBlockRes, "projWeight", "normWeight"})
        if (!files.count(required)) throw CliError(fmt::format("{}: missing", npyPath(dir, required).string()));

    const HostTensor& blockRes = files.at(kBlockRes);
    if (blockRes.shape().size() != 3)
        throw CliError(
            fmt::format("{}: blockRes must be [T,N,H] (its logical shape, whatever the layout), the file "
                        "has shape {}",
                        npyPath(dir, kBlockRes).string(), shapeText(blockRes.shape())));
    BarProblem p;
    p.tokens = blockRes.shape()[0];
    p.blocks = blockRes.shape()[1];
    p.hidden = blockRes.shape()[2];
    p.dtype = files.at("partialBlock").dtype();
    p.eps = attribute<double>(params, "eps", 1e-6);
    p.validBlockNum = attribute<int64_t>(params, "validBlockNum", -1);
    const std::string layout = attribute<std::string>(params, "blockResLayout", "token-major");
    if (layout != "token-major" && layout != "source-major")
        throw CliError(fmt::format("params.json: blockResLayout \"{}\" is not token-major or source-major", layout));
    p.sourceMajor = layout == "source-major";
    p.projWeight2d = files.at("projWeight").shape().size() == 2;

    // The harness keeps one dtype and these shapes; the library would reject anything else too.
    const int64_t t = p.tokens, h = p.hidden;
    const std::pair<const char*, std::vector<int64_t>> expected[] = {
        {"partialBlock", {t, h}},
        {"projWeight", p.projWeight2d ? std::vector<int64_t>{1, h} : std::vector<int64_t>{h}},
        {"normWeight", {h}},
        {"gradHiddenStates", {t, h}},
    };
    for (const auto& [name, shape] : expected) {
        auto it = files.find(name);
        if (it == files.end()) continue;
        if (it->second.shape() != shape)
            throw CliError(fmt::format("{}: shape {}, expected {} (blockRes is {})", npyPath(dir, name).string(),
                                       shapeText(it->second.shape()), shapeText(shape), shapeText(blockRes.shape())));
        if (it->second.dtype() != p.dtype)
            throw CliError(fmt::format("{}: dtype {}, but partialBlock is {}: every main tensor takes one dtype",
                                       npyPath(dir, name).string(), attnopsDataTypeName(it->second.dtype()),
                                       attnopsDataTypeName(p.dtype)));
    }
    if (blockRes.dtype() != p.dtype)
        throw CliError(fmt::format("{}: dtype {}, but partialBlock is {}", npyPath(dir, kBlockRes).string(),
                                   attnopsDataTypeName(blockRes.dtype()), attnopsDataTypeName(p.dtype)));

    LoadedBar loaded{BarInstance(p)};
    BarInstance& inst = loaded.inst;
    inst.partialBlock = std::move(files.at("partialBlock"));
    inst.projWeight = std::move(files.at("projWeight"));
    inst.normWeight = std::move(files.at("normWeight"));
    setBlockRes(inst.blockRes, blockRes);

    const bool hasStats = fs::exists(npyPath(dir, "invNorm")) || fs::exists(npyPath(dir, "probs"));
    loaded.backward = attribute<bool>(params, "backward", false) || files.count("gradHiddenStates") > 0;
    loaded.needBackward = attribute<bool>(params, "needBackward", false) || loaded.backward || hasStats;
    if (files.count("gradHiddenStates"))
        inst.gradHiddenStates = std::move(files.at("gradHiddenStates"));
    else if (attribute<bool>(params, "backward", false))
        throw CliError(fmt::format("{}: missing (params.json says \"backward\": true)",
                                   npyPath(dir, "gradHiddenStates").string()));
    return loaded;
}

BarComparison compareBlockAttentionResiduals(BarInstance& inst, const fs::path& dir, int64_t sample, bool needBackward,
                                             bool backward) {
    BarComparison c;
    const json params = fs::exists(dir / "params.json") ? readParams(dir) : json::object();
    const int64_t tokens = inst.problem.tokens;
    for (const bool grads : {false, true}) {
        const size_t first = c.outputs.size();
        std::vector<std::pair<const Slot*, HostTensor>> fileOutputs;
        for (const Slot& slot : kSlots) {
            const bool isGrad = slot.kind == Kind::GradOutput;
            if ((slot.kind != Kind::Forward && slot.kind != Kind::Stats && !isGrad) || isGrad != grads) continue;
            const fs::path path = npyPath(dir, slot.name);
            if (!fs::exists(path)) continue;
            HostTensor file = readTensor(path, declaredEntry(params, slot.name));
            const HostTensor& ours = inst.*slot.member;
            const bool computed = isGrad ? backward : (slot.kind == Kind::Forward || needBackward);
            if (!computed || file.dtype() != ours.dtype() || file.shape() != ours.shape()) {
                OutputComparison oc = incomparable(slot.name, ours, file);
                if (!computed)
                    oc.note = isGrad ? "DIR holds gradients but no gradHiddenStates.npy: the backward was not run"
                                     : "the forward did not save invNorm/probs (needBackward false)";
                c.outputs.push_back(oc);
                continue;
            }
            c.outputs.push_back(elementwise(slot.name, ours, file));
            fileOutputs.emplace_back(&slot, std::move(file));
        }
        if (fileOutputs.empty()) continue;
        // The file's values in place of ours against the reference, then ours back.
        for (auto& [slot, tensor] : fileOutputs) std::swap(inst.*slot->member, tensor);
        const tools::BarCheck rc =
            grads ? tools::checkBarBackward(inst, sample) : tools::checkBarForward(inst, sample, needBackward);
        for (auto& [slot, tensor] : fileOutputs) std::swap(inst.*slot->member, tensor);
        const std::string sampled = tokenScope(rc.tokens, tokens), every = tokenScope(tokens, tokens);
        for (size_t i = first; i < c.outputs.size(); ++i) {
            OutputComparison& oc = c.outputs[i];
            if (!oc.comparable) continue;
            const std::string& n = oc.name;
            if (n == "hiddenStates") {
                judge(oc, rc.maxAbsError[0], rc.tolerance[0], rc.nanMismatch[0], sampled);
            } else if (n == "invNorm") {
                oc.metric = "max rel error";
                judge(oc, rc.maxAbsError[1], rc.tolerance[1], rc.nanMismatch[1], sampled);
            } else if (n == "probs") {
                judge(oc, rc.maxAbsError[2], rc.tolerance[2], rc.nanMismatch[2], sampled);
            } else if (n == "gradPartialBlock") {
                judge(oc, rc.maxAbsErrorPartial, rc.tolerance[0], rc.nanMismatchPartial, sampled);
            } else if (n == "gradBlockRes") {
                judge(oc, rc.maxAbsErrorBlockRes, rc.tolerance[0], rc.nanMismatchBlockRes, sampled);
            } else if (n == "gradProjWeight") {
                judge(oc, rc.maxAbsError[1], rc.tolerance[1], rc.nanMismatch[1], every);
            } else if (n == "gradNormWeight") {
                judge(oc, rc.maxAbsError[2], rc.tolerance[2], rc.nanMismatch[2], every);
            }
        }
    }
    if (c.outputs.empty())
        throw CliError(
            fmt::format("{} holds no output to compare (hiddenStates.npy, invNorm.npy, probs.npy, "
                        "gradPartialBlock.npy, gradBlockRes.npy, gradProjWeight.npy, gradNormWeight.npy)",
                        dir.string()));
    c.passed = true;
    for (const OutputComparison& oc : c.outputs) c.passed = c.passed && oc.passed;
    return c;
}

}  // namespace attnops::cli

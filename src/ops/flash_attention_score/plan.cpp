// Kernel choice, tile shape and cost-balanced work partition for the forward.
#include "ops/flash_attention_score/plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "ops/flash_attention_score/semantics.hpp"

namespace attnops::fa {
namespace {

constexpr int64_t kChunksPerThread = 16;   // enough slack for dynamic balancing
constexpr int64_t kUnitOverhead = 64;      // cost of a unit that attends nothing (loads, stores)

template <typename T>
void append(std::string& key, const T& value) {
    key.append(reinterpret_cast<const char*>(&value), sizeof value);
}

int64_t queryBlocks(int64_t sq, int64_t rows) { return (sq + rows - 1) / rows; }

const ForwardKernel& chooseKernel(const ForwardParams& p, const std::string& forced) {
    const auto& list = forwardKernels();
    if (!forced.empty()) {
        for (const ForwardKernel* k : list)
            if (forced == k->name) {
                if (!k->available()) fail(ATTNOPS_ERROR_UNSUPPORTED_HARDWARE, fmt::format("ATTNOPS_FORCE_IMPL = {}: this CPU cannot run it", forced));
                if (!k->accepts(p)) unsupported("ATTNOPS_FORCE_IMPL = {}: the implementation does not accept this problem", forced);
                return *k;
            }
        std::string names;
        for (const ForwardKernel* k : list) names += std::string(names.empty() ? "" : ", ") + k->name;
        invalidArgument("ATTNOPS_FORCE_IMPL", forced, "is not a FlashAttentionScore implementation ({})", names);
    }
    for (const ForwardKernel* k : list)
        if (k->available() && k->accepts(p)) return *k;
    internalError("no FlashAttentionScore kernel accepted the problem");
}

}  // namespace

std::string forwardPlanKey(const ForwardParams& p, int32_t threads, const std::string& forcedKernel) {
    std::string key = "fa.fwd|" + forcedKernel + "|";
    append(key, threads);
    append(key, p.layout);
    append(key, p.q.dtype);
    for (int64_t v : {p.batch, p.n1, p.n2, p.d, p.dv, p.mask.sparseMode, p.mask.preTokens, p.mask.nextTokens})
        append(key, v);
    append(key, p.mask.explicitMask);
    append(key, p.pse.form);
    append(key, p.dropout.enabled);
    const auto appendVector = [&](const std::vector<int64_t>& v) {
        append(key, int64_t(v.size()));
        key.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
    };
    if (p.varlen) {
        appendVector(p.seq.qLen);
        appendVector(p.seq.kvLen);
    } else {
        append(key, p.seq.maxQLen);
        append(key, p.seq.maxKvLen);
    }
    appendVector(p.mask.prefix);
    return key;
}

ForwardPlan makeForwardPlan(const ForwardParams& p, int32_t threads, const PlatformInfo& info,
                            const std::string& forcedKernel) {
    ForwardPlan plan;
    plan.kernel = &chooseKernel(p, forcedKernel);
    plan.tile = plan.kernel->tile(p, info);
    plan.threads = std::max(1, threads);
    const uint64_t scratch = plan.kernel->scratchBytes(p, plan.tile);
    plan.scratchPerThread = (scratch + 63) / 64 * 64;
    plan.workspaceBytes = plan.scratchPerThread * uint64_t(plan.threads);

    // Units and their costs (score elements visited, plus a fixed overhead).
    const size_t count = size_t(p.seq.count);
    plan.unitBase.resize(count + 1);
    int64_t units = 0;
    for (size_t b = 0; b < count; ++b) {
        plan.unitBase[b] = units;
        units += p.n2 * queryBlocks(p.seq.qLen[b], plan.tile.queryRows);
    }
    plan.unitBase[count] = units;
    const auto unitCost = [&](int64_t b, const SeqRule& rule, int64_t qb) {
        const int64_t sq = p.seq.qLen[size_t(b)], skv = p.seq.kvLen[size_t(b)];
        const int64_t q0 = qb * plan.tile.queryRows, q1 = std::min(sq, q0 + plan.tile.queryRows);
        const KeyRange keys = keyRange(rule, q0, q1, skv);
        return p.group * ((q1 - q0) * (keys.hi - keys.lo) + kUnitOverhead);
    };
    // Pass 1: total cost; pass 2: cut chunks of about total / (threads * kChunksPerThread).
    double total = 0;
    for (size_t b = 0; b < count; ++b) {
        const SeqRule rule = seqRule(p.mask, int64_t(b), p.seq.qLen[b], p.seq.kvLen[b]);
        const int64_t blocks = queryBlocks(p.seq.qLen[b], plan.tile.queryRows);
        for (int64_t qb = 0; qb < blocks; ++qb) total += double(p.n2) * double(unitCost(int64_t(b), rule, qb));
    }
    const double target = std::max(1.0, total / double(plan.threads * kChunksPerThread));
    plan.chunkStart.push_back(0);
    double running = 0;
    int64_t u = 0;
    for (size_t b = 0; b < count; ++b) {
        const SeqRule rule = seqRule(p.mask, int64_t(b), p.seq.qLen[b], p.seq.kvLen[b]);
        const int64_t blocks = queryBlocks(p.seq.qLen[b], plan.tile.queryRows);
        for (int64_t n2 = 0; n2 < p.n2; ++n2)
            for (int64_t qb = 0; qb < blocks; ++qb, ++u) {
                running += double(unitCost(int64_t(b), rule, qb));
                if (running >= target) {
                    plan.chunkStart.push_back(u + 1);
                    running = 0;
                }
            }
    }
    if (plan.chunkStart.back() != units) plan.chunkStart.push_back(units);
    return plan;
}

WorkUnit unitAt(const ForwardParams& p, const ForwardPlan& plan, int64_t b, int64_t u) {
    const int64_t sq = p.seq.qLen[size_t(b)];
    const int64_t blocks = queryBlocks(sq, plan.tile.queryRows);
    const int64_t local = u - plan.unitBase[size_t(b)];
    WorkUnit w;
    w.b = b;
    w.n2 = local / blocks;
    w.q0 = (local % blocks) * plan.tile.queryRows;
    w.q1 = std::min(sq, w.q0 + plan.tile.queryRows);
    return w;
}

}  // namespace attnops::fa

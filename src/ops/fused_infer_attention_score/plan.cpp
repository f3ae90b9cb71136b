// Kernel choice, tile shape and cost-balanced work partition of FusedInferAttentionScore.
#include "ops/fused_infer_attention_score/plan.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "ops/flash_attention_score/semantics.hpp"

namespace attnops::fia {
namespace {

constexpr int64_t kUnitOverhead = 64;  // cost of a unit that attends nothing (loads, stores)

template <typename T>
void append(std::string& key, const T& value) {
    key.append(reinterpret_cast<const char*>(&value), sizeof value);
}

int64_t blocksOf(int64_t rows, int64_t blockRows) { return (rows + blockRows - 1) / blockRows; }

}  // namespace

WorkUnit unitAt(const Params& p, TileShape tile, int64_t b, int64_t local) {
    const int64_t blocks = blocksOf(p.core.seq.qLen[size_t(b)], tile.queryRows);
    const int64_t first = (local % blocks) * tile.queryRows;
    return WorkUnit{b, local / blocks, first, std::min(p.core.seq.qLen[size_t(b)], first + tile.queryRows)};
}

std::string planKey(const Params& p, int32_t threads) {
    const fa::ForwardParams& c = p.core;
    std::string key;
    append(key, threads);
    append(key, c.q.dtype);
    append(key, p.key.dtype);
    for (int64_t v : {c.batch, c.n1, c.n2, c.d, c.dv, c.mask.sparseMode, c.mask.preTokens, c.mask.nextTokens})
        append(key, v);
    append(key, c.mask.explicitMask);
    append(key, p.table.data != nullptr);
    for (const auto* lens : {&c.seq.qLen, &c.seq.kvLen}) {
        append(key, int64_t(lens->size()));
        key.append(reinterpret_cast<const char*>(lens->data()), lens->size() * sizeof(int64_t));
    }
    return key;
}

Plan makePlan(const Params& p, int32_t threads) {
    Plan plan;
    for (const ForwardKernel* k : forwardKernels())
        if (k->available() && k->accepts(p)) {
            plan.kernel = k;
            break;
        }
    if (plan.kernel == nullptr) internalError("no FusedInferAttentionScore kernel accepted the problem");
    plan.tile = plan.kernel->tile(p);
    plan.threads = std::max(1, threads);
    plan.scratchPerThread = (plan.kernel->scratchBytes(p, plan.tile) + 63) / 64 * 64;
    plan.workspaceBytes = plan.scratchPerThread * uint64_t(plan.threads);
    const TileShape tile = plan.tile;
    const fa::ForwardParams& c = p.core;
    plan.units = fa::partitionUnits(
        c.seq.count, plan.threads, [&](int64_t b) { return c.n2 * blocksOf(c.seq.qLen[size_t(b)], tile.queryRows); },
        [&](int64_t b, int64_t local) {
            const WorkUnit u = unitAt(p, tile, b, local);
            const int64_t sq = c.seq.qLen[size_t(b)], skv = c.seq.kvLen[size_t(b)];
            const fa::KeyRange keys = fa::keyRange(fa::seqRule(c.mask, b, sq, skv), u.q0, u.q1, skv);
            return double(c.group) * double((u.q1 - u.q0) * (keys.hi - keys.lo) + kUnitOverhead);
        });
    return plan;
}

}  // namespace attnops::fia

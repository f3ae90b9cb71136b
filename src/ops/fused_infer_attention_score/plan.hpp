// FusedInferAttentionScore plans: a pure function of the problem and the thread count that picks
// the kernel and tile, partitions the work units by cost and books the workspace.
#pragma once

#include <cstdint>
#include <string>

#include "ops/flash_attention_score/plan.hpp"
#include "ops/fused_infer_attention_score/kernel.hpp"
#include "ops/fused_infer_attention_score/params.hpp"
#include "runtime/plan_cache.hpp"

namespace attnops::fia {

struct Plan : PlanBase {
    const ForwardKernel* kernel = nullptr;
    TileShape tile;
    int32_t threads = 1;
    fa::UnitSpace units;            // (batch, kv head, query block)
    uint64_t scratchPerThread = 0;  // bytes, 64-byte multiple
    uint64_t workspaceBytes = 0;
};

// Signature of everything a plan depends on (shapes, dtypes, mask geometry, lengths).
std::string planKey(const Params& p, int32_t threads);

Plan makePlan(const Params& p, int32_t threads);

// Unit `local` of batch b: kv head local / blocks, rows of block local % blocks.
WorkUnit unitAt(const Params& p, TileShape tile, int64_t b, int64_t local);

}  // namespace attnops::fia

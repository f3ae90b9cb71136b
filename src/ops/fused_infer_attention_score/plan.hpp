// FusedInferAttentionScore plans: a pure function of the problem, the thread count and the forced
// implementation that picks the kernel and tile, cuts long decode contexts into key splits,
// partitions the work units by cost and books the workspace.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/flash_attention_score/plan.hpp"
#include "ops/fused_infer_attention_score/kernel.hpp"
#include "ops/fused_infer_attention_score/params.hpp"
#include "runtime/plan_cache.hpp"

namespace attnops::fia {

// Keys per split of a query block that is its batch's only one (decode, short MTP drafts): a
// multiple of every paged block size in use (16 .. 1024), so splits start on page boundaries,
// and long enough that the partial rows (G * rows * (dv + 2) floats per split) are a fraction of
// a percent of the keys and values the split reads.
constexpr int64_t kSplitKeys = 1024;

struct Plan : PlanBase {
    const ForwardKernel* kernel = nullptr;
    TileShape tile;
    int32_t threads = 1;
    fa::UnitSpace units;               // (batch, kv heads, query block, key split)
    std::vector<int64_t> splits;       // per batch: key splits of its query block (1: not split)
    std::vector<uint64_t> partialAt;   // per batch: first float of its partial rows in the partial area
    int64_t headsPerUnit = 1;          // kv heads of a unit (WorkUnit::heads; the last unit of a batch may have fewer)
    uint64_t scratchPerThread = 0;     // bytes, 64-byte multiple
    uint64_t partialOffset = 0;        // bytes into the workspace of the partial area
    uint64_t workspaceBytes = 0;
};

// Signature of everything a plan depends on (shapes, dtypes, sources, mask geometry, lengths).
std::string planKey(const Params& p, int32_t threads, const std::string& forcedKernel);

// forcedKernel: ATTNOPS_FORCE_IMPL ("" = the fastest legal entry).
Plan makePlan(const Params& p, int32_t threads, const std::string& forcedKernel);

// Unit `local` of batch b; `partialArea` is the workspace's partial area.
WorkUnit unitAt(const Params& p, const Plan& plan, int64_t b, int64_t local, float* partialArea);

}  // namespace attnops::fia

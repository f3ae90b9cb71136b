// The FlashAttentionScore forward plan ("tiling"): a pure function of the problem and the device
// that picks the kernel, the tile shape, the work partition and the workspace booking.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/flash_attention_score/kernel.hpp"
#include "ops/flash_attention_score/params.hpp"
#include "runtime/plan_cache.hpp"

namespace attnops::fa {

struct ForwardPlan : PlanBase {
    const ForwardKernel* kernel = nullptr;
    TileShape tile;
    int32_t threads = 1;
    // Work units are (sequence, kv head, query block), numbered sequence by sequence; sequence b
    // owns units [unitBase[b], unitBase[b+1]).
    std::vector<int64_t> unitBase;
    // Chunks of consecutive units of similar cost; chunk c is [chunkStart[c], chunkStart[c+1]).
    std::vector<int64_t> chunkStart;
    uint64_t scratchPerThread = 0;  // bytes, 64-byte multiple
    uint64_t workspaceBytes = 0;
};

// Signature of everything the plan depends on (shapes, dtypes, mask geometry, lengths).
std::string forwardPlanKey(const ForwardParams& p, int32_t threads, const std::string& forcedKernel);

ForwardPlan makeForwardPlan(const ForwardParams& p, int32_t threads, const PlatformInfo& info,
                            const std::string& forcedKernel);

// Decodes global unit `u` of sequence `b` (unitBase[b] <= u < unitBase[b+1]).
WorkUnit unitAt(const ForwardParams& p, const ForwardPlan& plan, int64_t b, int64_t u);

}  // namespace attnops::fa

// BlockAttentionResiduals plans: kernel, token chunks and the workspace booking (u = g * w, per
// thread scratch, and the backward's per-chunk du partial sums).
#pragma once

#include <cstdint>
#include <string>

#include "ops/block_attention_residuals/kernel.hpp"
#include "ops/block_attention_residuals/params.hpp"
#include "runtime/plan_cache.hpp"

namespace attnops::bar {

struct Plan : PlanBase {
    const Kernel* kernel = nullptr;
    int32_t threads = 1;
    int64_t chunkTokens = 1;        // tokens per work item
    int64_t chunks = 0;
    uint64_t scratchPerThread = 0;
    uint64_t weightsOffset = 0;     // u [H] fp32
    uint64_t partialsOffset = 0;    // backward: du partials [chunks][H] fp32
    uint64_t workspaceBytes = 0;
};

// The backward's chunks depend on T alone (never on the thread count), so the du reduction has
// the same shape, and the same bits, for any number of threads.
int64_t backwardChunkTokens(int64_t tokens);

std::string planKey(const char* direction, const Sources& s, int32_t threads, const std::string& forced);
Plan makeForwardPlan(const ForwardParams& p, int32_t threads, const std::string& forced);
Plan makeBackwardPlan(const BackwardParams& p, int32_t threads, const std::string& forced);

}  // namespace attnops::bar

// BlockAttentionResiduals planning.
#include "ops/block_attention_residuals/plan.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.hpp"

namespace attnops::bar {
namespace {

constexpr int64_t kItemsPerThread = 16;   // forward: work items per thread for balancing
constexpr int64_t kMaxBackwardChunks = 256;
constexpr int64_t kMinBackwardChunk = 16;

uint64_t align64(uint64_t n) { return (n + 63) / 64 * 64; }

const Kernel& choose(const std::string& forced) {
    if (!forced.empty()) {
        for (const Kernel* k : kernels())
            if (forced == k->name) {
                if (!k->available())
                    fail(ATTNOPS_ERROR_UNSUPPORTED_HARDWARE, fmt::format("ATTNOPS_FORCE_IMPL = {}: this CPU cannot run it", forced));
                return *k;
            }
        std::string names;
        for (const Kernel* k : kernels()) names += std::string(names.empty() ? "" : ", ") + k->name;
        invalidArgument("ATTNOPS_FORCE_IMPL", forced, "is not a BlockAttentionResiduals implementation ({})", names);
    }
    for (const Kernel* k : kernels())
        if (k->available()) return *k;
    internalError("no BlockAttentionResiduals kernel is available");
}

}  // namespace

int64_t backwardChunkTokens(int64_t tokens) {
    return std::max(kMinBackwardChunk, (tokens + kMaxBackwardChunks - 1) / kMaxBackwardChunks);
}

std::string planKey(const char* direction, const Sources& s, int32_t threads, const std::string& forced) {
    return fmt::format("bar.{}|{}|{}|{}|{}|{}|{}", direction, forced, threads, s.tokens, s.blocks, s.hidden, int(s.partial.dtype));
}

Plan makeForwardPlan(const ForwardParams& p, int32_t threads, const std::string& forced) {
    Plan plan;
    plan.kernel = &choose(forced);
    plan.threads = std::max(1, threads);
    const int64_t t = p.src.tokens;
    plan.chunkTokens = std::max<int64_t>(1, (t + plan.threads * kItemsPerThread - 1) / (plan.threads * kItemsPerThread));
    plan.chunks = (t + plan.chunkTokens - 1) / plan.chunkTokens;
    plan.scratchPerThread = align64(plan.kernel->forwardScratchBytes(p));
    plan.weightsOffset = plan.scratchPerThread * uint64_t(plan.threads);
    plan.workspaceBytes = plan.weightsOffset + align64(uint64_t(p.src.hidden) * sizeof(float));
    return plan;
}

Plan makeBackwardPlan(const BackwardParams& p, int32_t threads, const std::string& forced) {
    Plan plan;
    plan.kernel = &choose(forced);
    plan.threads = std::max(1, threads);
    const int64_t t = p.src.tokens;
    plan.chunkTokens = backwardChunkTokens(t);
    plan.chunks = (t + plan.chunkTokens - 1) / plan.chunkTokens;
    plan.scratchPerThread = align64(plan.kernel->backwardScratchBytes(p));
    plan.weightsOffset = plan.scratchPerThread * uint64_t(plan.threads);
    plan.partialsOffset = plan.weightsOffset + align64(uint64_t(p.src.hidden) * sizeof(float));
    plan.workspaceBytes = plan.partialsOffset + align64(uint64_t(plan.chunks) * uint64_t(p.src.hidden) * sizeof(float));
    return plan;
}

}  // namespace attnops::bar

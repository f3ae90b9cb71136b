// BlockAttentionResiduals forward and backward drivers, and the implementation list. Tokens are
// independent, so only the backward's weight gradients need care: each fixed token chunk sums its
// own du partial, and the partials are added in chunk order.
#include "ops/block_attention_residuals/ops.hpp"

#include <algorithm>


namespace attnops::bar {

const std::vector<const Kernel*>& kernels() {
    static const std::vector<const Kernel*> list = {&kernelStreamAvx512Bf16(), &kernelStreamAvx512(), &kernelStreamAvx2(),
                                                    &kernelVectorAvx512(),     &kernelVectorAvx2(),   &kernelVectorGeneric(),
                                                    &kernelReference()};
    return list;
}

namespace {

constexpr int64_t kReduceColumns = 1024;  // hidden columns per item of the final du reduction

// u = normWeight * projWeight in fp32, formed once per call.
float* pseudoQuery(const Sources& s, const Plan& plan, void* workspace) {
    float* u = reinterpret_cast<float*>(static_cast<char*>(workspace) + plan.weightsOffset);
    for (int64_t h = 0; h < s.hidden; ++h) u[h] = s.normWeight.load(0, 0, h) * s.projWeight.load(0, 0, h);
    return u;
}

char* scratchOf(const Plan& plan, void* workspace, int worker) {
    return static_cast<char*>(workspace) + plan.scratchPerThread * uint64_t(worker);
}

}  // namespace

void runForward(const ForwardParams& p, const Plan& plan, void* workspace, ThreadPool& pool) {
    pool.requirePlannedFor(plan.threads);
    const float* u = pseudoQuery(p.src, plan, workspace);
    pool.parallelFor(plan.chunks, [&](int64_t c, int worker) {
        const int64_t t0 = c * plan.chunkTokens, t1 = std::min(p.src.tokens, t0 + plan.chunkTokens);
        plan.kernel->forwardTokens(p, u, t0, t1, scratchOf(plan, workspace, worker));
    });
}

void runBackward(const BackwardParams& p, const Plan& plan, void* workspace, ThreadPool& pool) {
    pool.requirePlannedFor(plan.threads);
    const Sources& s = p.src;
    const float* u = pseudoQuery(s, plan, workspace);
    float* partials = reinterpret_cast<float*>(static_cast<char*>(workspace) + plan.partialsOffset);
    pool.parallelFor(plan.chunks, [&](int64_t c, int worker) {
        float* du = partials + c * s.hidden;
        std::fill(du, du + s.hidden, 0.0f);
        const int64_t t0 = c * plan.chunkTokens, t1 = std::min(s.tokens, t0 + plan.chunkTokens);
        plan.kernel->backwardTokens(p, u, t0, t1, du, scratchOf(plan, workspace, worker));
    });
    const int64_t items = (s.hidden + kReduceColumns - 1) / kReduceColumns;
    pool.parallelFor(items, [&](int64_t item, int) {
        const int64_t h1 = std::min(s.hidden, (item + 1) * kReduceColumns);
        for (int64_t h = item * kReduceColumns; h < h1; ++h) {
            double du = 0.0;
            for (int64_t c = 0; c < plan.chunks; ++c) du += partials[c * s.hidden + h];
            // dw = g * du, dg = w * du (spec section 3).
            p.gradProjWeight.store(0, 0, h, float(du * double(s.normWeight.load(0, 0, h))));
            p.gradNormWeight.store(0, 0, h, float(du * double(s.projWeight.load(0, 0, h))));
        }
    });
}

}  // namespace attnops::bar

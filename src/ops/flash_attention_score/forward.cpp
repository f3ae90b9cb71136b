// Forward driver: chunks of work units in parallel (results depend only on the unit, never on
// the thread that ran it), then the TND tails. Also the implementation list.
#include "ops/flash_attention_score/forward.hpp"

#include <algorithm>
#include <limits>


namespace attnops::fa {

const std::vector<const ForwardKernel*>& forwardKernels() {
    static const std::vector<const ForwardKernel*> list = {
        &forwardKernelAmx(),
        &forwardKernelAvx512Bf16(),
        &forwardKernelAvx512(),
        &forwardKernelAvx2(),
        &forwardKernelTiledAvx512(),
        &forwardKernelTiledAvx2(),
        &forwardKernelTiledGeneric(),
        &forwardKernelAmxEmulated(),
        &forwardKernelReference(),
    };
    return list;
}

namespace {

// TND rows beyond the last sequence: attention_out 0, statistics -inf and 0.
void writeTails(const ForwardParams& p) {
    const float negInf = -std::numeric_limits<float>::infinity();
    for (int64_t row = p.seq.qRowsUsed; row < p.qRowsTotal; ++row)
        for (int64_t n1 = 0; n1 < p.n1; ++n1) {
            for (int64_t c = 0; c < p.dv; ++c) p.out.store(0, n1, row, c, 0.0f);
            if (p.writeStats)
                for (int64_t lane = 0; lane < p.statLanes; ++lane) {
                    p.softmaxMax.store(0, n1, row, lane, negInf);
                    p.softmaxSum.store(0, n1, row, lane, 0.0f);
                }
        }
}

}  // namespace

void runForward(const ForwardParams& p, const ForwardPlan& plan, void* workspace, ThreadPool& pool) {
    pool.requirePlannedFor(plan.threads);
    pool.parallelFor(plan.units.chunks(), [&](int64_t c, int worker) {
        void* scratch = static_cast<char*>(workspace) + plan.scratchPerThread * uint64_t(worker);
        plan.units.forEachInChunk(c, [&](int64_t b, int64_t local) {
            plan.kernel->run(p, plan.tile, queryUnitAt(p, plan.tile, b, local), scratch);
        });
    });
    if (p.varlen) writeTails(p);
}

}  // namespace attnops::fa

// Forward driver: chunks of work units in parallel (results depend only on the unit, never on the
// thread that ran it), then the rows outside every batch's actual length. Also the
// implementation list.
#include "ops/fused_infer_attention_score/forward.hpp"

#include <limits>


namespace attnops::fia {

const std::vector<const ForwardKernel*>& forwardKernels() {
    static const std::vector<const ForwardKernel*> list = {&forwardKernelTiled(), &forwardKernelReference()};
    return list;
}

namespace {

// Rows [r0, r1) of batch b (absolute rows; TND: batch 0), every head: output 0, lse +inf.
void writeEmptyRows(const Params& p, int64_t b, int64_t r0, int64_t r1) {
    const float inf = std::numeric_limits<float>::infinity();
    for (int64_t n1 = 0; n1 < p.core.n1; ++n1)
        for (int64_t row = r0; row < r1; ++row) {
            for (int64_t c = 0; c < p.core.dv; ++c) p.core.out.store(b, n1, row, c, 0.0f);
            if (p.writeLse) p.lse.store(b, n1, row, 0, inf);
        }
}

}  // namespace

void runForward(const Params& p, const Plan& plan, void* workspace, ThreadPool& pool) {
    pool.requirePlannedFor(plan.threads);
    pool.parallelFor(plan.units.chunks(), [&](int64_t c, int worker) {
        void* scratch = static_cast<char*>(workspace) + plan.scratchPerThread * uint64_t(worker);
        plan.units.forEachInChunk(
            c, [&](int64_t b, int64_t local) { plan.kernel->run(p, plan.tile, unitAt(p, plan.tile, b, local), scratch); });
    });
    const fa::Sequences& seq = p.core.seq;
    if (p.core.varlen) {
        writeEmptyRows(p, 0, seq.qRowsUsed, p.core.qRowsTotal);
    } else {
        pool.parallelFor(seq.count, [&](int64_t b, int) { writeEmptyRows(p, b, seq.qLen[size_t(b)], p.qSeqCapacity); });
    }
}

}  // namespace attnops::fia

// Backward driver and implementation list. Each unit writes its own rows; dsink is a per-head
// sum over rows in a fixed order; nothing depends on which thread ran what.
#include "ops/flash_attention_score/backward.hpp"


namespace attnops::fa {

const std::vector<const BackwardKernel*>& backwardKernels() {
    static const std::vector<const BackwardKernel*> list = {
        &backwardKernelAmx(),
        &backwardKernelAvx512Bf16(),
        &backwardKernelAvx512Fused(),
        &backwardKernelAvx512(),
        &backwardKernelAvx2Fused(),
        &backwardKernelAvx2(),
        &backwardKernelTiledAvx512(),
        &backwardKernelTiledAvx2(),
        &backwardKernelTiledGeneric(),
        &backwardKernelAmxEmulated(),
        &backwardKernelReference(),
    };
    return list;
}

namespace {

// dsink[n1] = sum of the query units' row terms -p_sink(i) * delta_i (delta recomputed exactly
// as sum_j P_d * dP_d, not from the low-precision attentionIn), in double, sequences then rows
// ascending.
void sinkGradient(const BackwardParams& bp, int64_t n1) {
    const ForwardParams& p = bp.fwd;
    double sum = 0.0;
    for (int64_t b = 0; b < p.seq.count; ++b)
        for (int64_t i = 0; i < p.seq.qLen[size_t(b)]; ++i) sum += bp.sinkRowTerms[bp.sinkRowIndex(b, i) * p.n1 + n1];
    bp.dsink[n1 * bp.dsinkStride] = float(sum);
}

// TND rows beyond the last sequence: dq, dk, dv = 0.
void zeroTails(const BackwardParams& bp) {
    const ForwardParams& p = bp.fwd;
    for (int64_t row = p.seq.qRowsUsed; row < p.qRowsTotal; ++row)
        for (int64_t n1 = 0; n1 < p.n1; ++n1)
            for (int64_t c = 0; c < p.d; ++c) bp.dq.store(0, n1, row, c, 0.0f);
    for (int64_t row = bp.kvRowsUsed; row < bp.kvRowsTotal; ++row)
        for (int64_t n2 = 0; n2 < p.n2; ++n2) {
            for (int64_t c = 0; c < p.d; ++c) bp.dk.store(0, n2, row, c, 0.0f);
            for (int64_t c = 0; c < p.dv; ++c) bp.dv.store(0, n2, row, c, 0.0f);
        }
}

}  // namespace

void runBackward(const BackwardParams& bp, const BackwardPlan& plan, void* workspace, ThreadPool& pool) {
    pool.requirePlannedFor(plan.threads);
    const ForwardParams& p = bp.fwd;
    auto scratchOf = [&](int worker) { return static_cast<char*>(workspace) + plan.scratchPerThread * uint64_t(worker); };
    if (plan.kernel->runHeadUnit != nullptr) {
        pool.parallelFor(plan.headUnits.chunks(), [&](int64_t c, int worker) {
            plan.headUnits.forEachInChunk(c, [&](int64_t b, int64_t n2) {
                plan.kernel->runHeadUnit(bp, plan.tile, KeyUnit{b, n2, 0, p.seq.kvLen[size_t(b)]}, scratchOf(worker));
            });
        });
    } else {
        pool.parallelFor(plan.keyUnits.chunks(), [&](int64_t c, int worker) {
            plan.keyUnits.forEachInChunk(c, [&](int64_t b, int64_t local) {
                plan.kernel->runKeyUnit(bp, plan.tile, keyUnitAt(p, plan.tile, b, local), scratchOf(worker));
            });
        });
        pool.parallelFor(plan.queryUnits.chunks(), [&](int64_t c, int worker) {
            plan.queryUnits.forEachInChunk(c, [&](int64_t b, int64_t local) {
                plan.kernel->runQueryUnit(bp, plan.tile, queryUnitAt(p, plan.tile, b, local), scratchOf(worker));
            });
        });
    }
    if (bp.dsink != nullptr) pool.parallelFor(p.n1, [&](int64_t n1, int) { sinkGradient(bp, n1); });
    if (p.varlen) zeroTails(bp);
}

}  // namespace attnops::fa

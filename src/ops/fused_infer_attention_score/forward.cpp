// Forward driver: chunks of work units in parallel (results depend only on the unit, never on the
// thread that ran it), then the merge of key splits in their fixed order, then the rows outside
// every batch's actual length. Also the implementation list and the end of a row shared by all
// kernels.
#include "ops/fused_infer_attention_score/forward.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>


namespace attnops::fia {

const std::vector<const ForwardKernel*>& forwardKernels() {
    // The prefill routes first: they accept only prefill shapes, which they run faster.
    static const std::vector<const ForwardKernel*> list = {
        &forwardKernelAmxPrefill(),        &forwardKernelAmxEmulatedPrefill(),
        &forwardKernelAvx512Bf16Prefill(), &forwardKernelAvx512Prefill(), &forwardKernelAvx2Prefill(),
        &forwardKernelAvx512Bf16(),        &forwardKernelAvx512(),        &forwardKernelAvx2(),
        &forwardKernelTiled(),
        &forwardKernelReference()};
    return list;
}

void finishRow(const Params& p, int64_t b, int64_t n1, int64_t row, float m, float l, float* acc) {
    const int64_t dv = p.core.dv;
    if (l == 0.0f) {
        for (int64_t c = 0; c < dv; ++c) storeOut(p, b, n1, row, c, 0.0f);
        if (p.writeLse) p.lse.store(b, n1, row, 0, std::numeric_limits<float>::infinity());
        return;
    }
    if (!p.sink.empty()) {  // computed against max(m, sink) so that exp never overflows
        const float sink = p.sink[size_t(n1)];
        const float mFinal = sink > m ? sink : m;
        const float old = std::exp(m - mFinal);
        l = l * old + std::exp(sink - mFinal);
        for (int64_t c = 0; c < dv; ++c) acc[c] *= old;
        m = mFinal;
    }
    for (int64_t c = 0; c < dv; ++c) storeOut(p, b, n1, row, c, acc[c] / l);
    if (p.writeLse) p.lse.store(b, n1, row, 0, std::log(l) + m);
}

void emitRow(const Params& p, const WorkUnit& u, int64_t g, int64_t r, float m, float l, float* acc) {
    const int64_t dv = p.core.dv;
    if (u.partial == nullptr) {
        finishRow(p, u.b, u.n2 * p.core.group + g, p.core.seq.qStart[size_t(u.b)] + u.q0 + r, m, l, acc);
        return;
    }
    float* rec = u.partial + (g * (u.q1 - u.q0) + r) * partialRowFloats(dv);
    rec[0] = m;
    rec[1] = l;
    for (int64_t c = 0; c < dv; ++c) rec[2 + c] = acc[c];
}

namespace {

// Rows [r0, r1) of batch b (absolute rows; TND: batch 0), every head: output 0, lse +inf.
void writeEmptyRows(const Params& p, int64_t b, int64_t r0, int64_t r1) {
    const float inf = std::numeric_limits<float>::infinity();
    for (int64_t n1 = 0; n1 < p.core.n1; ++n1)
        for (int64_t row = r0; row < r1; ++row) {
            for (int64_t c = 0; c < p.core.dv; ++c) storeOut(p, b, n1, row, c, 0.0f);
            if (p.writeLse) p.lse.store(b, n1, row, 0, inf);
        }
}

// The splits of batch b, kv head n2, merged split by split in ascending order (the exact
// rescaling of the online softmax, so a split's state counts as one key block), then finished.
void mergeSplits(const Params& p, const Plan& plan, int64_t b, int64_t n2, const float* area, float* acc) {
    const fa::ForwardParams& c = p.core;
    const int64_t sq = c.seq.qLen[size_t(b)], splits = plan.splits[size_t(b)], rows = c.group * sq;
    const int64_t rec = partialRowFloats(c.dv);
    const float* first = area + plan.partialAt[size_t(b)] + uint64_t(n2 * splits * rows * rec);
    for (int64_t i = 0; i < rows; ++i) {
        float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
        std::fill(acc, acc + c.dv, 0.0f);
        for (int64_t s = 0; s < splits; ++s) {
            const float* part = first + (s * rows + i) * rec;
            if (part[1] == 0.0f) continue;  // the split kept no key of this row
            const float mNew = (part[0] > m || part[0] != part[0]) ? part[0] : m;
            const float old = l == 0.0f ? 0.0f : std::exp(m - mNew), scale = std::exp(part[0] - mNew);
            for (int64_t d = 0; d < c.dv; ++d) acc[d] = acc[d] * old + part[2 + d] * scale;
            l = l * old + part[1] * scale;
            m = mNew;
        }
        const int64_t g = i / sq, r = i % sq;
        finishRow(p, b, n2 * c.group + g, c.seq.qStart[size_t(b)] + r, m, l, acc);
    }
}

}  // namespace

void runForward(const Params& p, const Plan& plan, void* workspace, ThreadPool& pool) {
    pool.requirePlannedFor(plan.threads);
    float* partialArea = reinterpret_cast<float*>(static_cast<char*>(workspace) + plan.partialOffset);
    pool.parallelFor(plan.units.chunks(), [&](int64_t c, int worker) {
        void* scratch = static_cast<char*>(workspace) + plan.scratchPerThread * uint64_t(worker);
        plan.units.forEachInChunk(c, [&](int64_t b, int64_t local) {
            plan.kernel->run(p, plan.tile, unitAt(p, plan, b, local, partialArea), scratch);
        });
    });
    const fa::Sequences& seq = p.core.seq;
    pool.parallelFor(seq.count, [&](int64_t b, int worker) {
        if (plan.splits[size_t(b)] == 1) return;
        // A kernel that splits keys books at least one accumulator row of scratch.
        float* acc = reinterpret_cast<float*>(static_cast<char*>(workspace) + plan.scratchPerThread * uint64_t(worker));
        for (int64_t n2 = 0; n2 < p.core.n2; ++n2) mergeSplits(p, plan, b, n2, partialArea, acc);
    });
    if (p.core.varlen) {
        writeEmptyRows(p, 0, seq.qRowsUsed, p.core.qRowsTotal);
    } else {
        pool.parallelFor(seq.count, [&](int64_t b, int) {  // left padding: rows before qStart too
            writeEmptyRows(p, b, 0, seq.qStart[size_t(b)]);
            writeEmptyRows(p, b, seq.qStart[size_t(b)] + seq.qLen[size_t(b)], p.qSeqCapacity);
        });
    }
}

}  // namespace attnops::fia

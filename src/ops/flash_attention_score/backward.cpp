// Backward driver and implementation list. Each unit writes its own rows; dsink is a per-head
// sum over rows in a fixed order; nothing depends on which thread ran what.
#include "ops/flash_attention_score/backward.hpp"

#include <algorithm>
#include <cstring>

#include "cpu/generic/convert.hpp"
#include "ops/flash_attention_score/bwd_chunks.hpp"
#include "ops/flash_attention_score/semantics.hpp"


namespace attnops::fa {

const std::vector<const BackwardKernel*>& backwardKernels() {
    static const std::vector<const BackwardKernel*> list = {
        &backwardKernelAmxFused(),
        &backwardKernelAmx(),
        &backwardKernelAvx512Bf16Fused(),
        &backwardKernelAvx512Bf16(),
        &backwardKernelAvx512Fused(),
        &backwardKernelAvx512(),
        &backwardKernelAvx2Fused(),
        &backwardKernelAvx2(),
        &backwardKernelTiledAvx512(),
        &backwardKernelTiledAvx2(),
        &backwardKernelTiledGeneric(),
        &backwardKernelAmxEmulatedFused(),
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

// The fused scheme's reduction unit `local` of sequence b (kv head major, then key block): dk
// and dv of the block's rows = the sum of the partials of the chunks whose rows may see it, in
// ascending chunk order (into the first such slice), or 0 when none does.
void reducePartials(const BackwardParams& bp, const BackwardPlan& plan, int64_t b, int64_t local, float* partials) {
    const ForwardParams& p = bp.fwd;
    const int64_t sq = p.seq.qLen[size_t(b)], skv = p.seq.kvLen[size_t(b)], kr = plan.tile.keyRows;
    const int64_t c = chunks::chunksOf(sq, plan.chunkRows), blocks = (skv + kr - 1) / kr;
    const int64_t n2 = local / blocks, k0 = (local % blocks) * kr, k1 = std::min(skv, k0 + kr), nk = k1 - k0;
    const SeqRule rule = seqRule(p.mask, b, sq, skv);
    float* head = partials + plan.partialBase[size_t(b)] + uint64_t(n2 * c * skv * (p.d + p.dv));
    const int64_t kvRow0 = p.seq.kvStart[size_t(b)] + k0;
    for (const bool isDk : {true, false}) {
        const int64_t cols = isDk ? p.d : p.dv;
        float* slices = isDk ? head : head + c * skv * p.d;
        float* acc = nullptr;
        for (int64_t chunk = 0; chunk < c; ++chunk) {
            const int64_t q0 = chunk * plan.chunkRows, q1 = std::min(sq, q0 + plan.chunkRows);
            if (!chunks::chunkSeesKeys(rule, q0, q1, skv, k0, k1)) continue;
            float* slice = slices + (chunk * skv + k0) * cols;
            if (acc == nullptr) {
                acc = slice;
                continue;
            }
            for (int64_t i = 0; i < nk * cols; ++i) acc[i] += slice[i];
        }
        if (acc == nullptr) {
            acc = slices + k0 * cols;
            std::fill(acc, acc + nk * cols, 0.0f);
        }
        const MutView4& out = isDk ? bp.dk : bp.dv;
        for (int64_t r = 0; r < nk; ++r)
            cpu::storeRow(out.data, out.offset(b, n2, kvRow0 + r, 0), out.stride[3], out.dtype, cols, acc + r * cols);
    }
}

}  // namespace

void runBackward(const BackwardParams& bp, const BackwardPlan& plan, void* workspace, ThreadPool& pool) {
    pool.requirePlannedFor(plan.threads);
    const ForwardParams& p = bp.fwd;
    auto scratchOf = [&](int worker) { return static_cast<char*>(workspace) + plan.scratchPerThread * uint64_t(worker); };
    if (plan.kernel->runHeadUnit != nullptr) {
        float* partials = reinterpret_cast<float*>(static_cast<char*>(workspace) + plan.partialOffset);
        pool.parallelFor(plan.headUnits.chunks(), [&](int64_t c, int worker) {
            plan.headUnits.forEachInChunk(c, [&](int64_t b, int64_t local) {
                plan.kernel->runHeadUnit(bp, plan.tile, headChunkAt(p, plan, b, local, partials), scratchOf(worker));
            });
        });
        pool.parallelFor(plan.reduceUnits.chunks(), [&](int64_t c, int) {
            plan.reduceUnits.forEachInChunk(c, [&](int64_t b, int64_t local) { reducePartials(bp, plan, b, local, partials); });
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

namespace {

// A dense fp32 buffer over the logical axes (b, n, row, col) of one gradient: [B][N][rows][cols]
// for fixed layouts, [N][T][cols] for TND (batch stride 0: rows are absolute).
struct DenseGrad {
    int64_t batch, heads, rows, cols;
    uint64_t floats() const { return uint64_t(batch * heads * rows * cols); }
    MutView4 view(float* data, bool varlen) const {
        MutView4 v;
        v.data = data;
        v.dtype = DType::F32;
        v.stride[0] = varlen ? 0 : heads * rows * cols;
        v.stride[1] = rows * cols;
        v.stride[2] = cols;
        v.stride[3] = 1;
        return v;
    }
};

struct DenseGrads {
    DenseGrad dq, dk, dv;
};

DenseGrads denseGrads(const BackwardParams& bp) {
    const ForwardParams& p = bp.fwd;
    const int64_t batch = p.varlen ? 1 : p.batch;
    return {{batch, p.n1, p.qRowsTotal, p.d}, {batch, p.n2, bp.kvRowsTotal, p.d}, {batch, p.n2, bp.kvRowsTotal, p.dv}};
}

uint64_t alignedBytes(uint64_t floats) { return (floats * sizeof(float) + 63) / 64 * 64; }

// dst(b, n, row, :) += src(b, n, row, :) for every element, one (b, n) pair per task.
void addInto(const MutView4& dst, const MutView4& src, const DenseGrad& g, ThreadPool& pool) {
    pool.parallelFor(g.batch * g.heads, [&](int64_t task, int) {
        const int64_t b = task / g.heads, n = task % g.heads;
        auto* out = static_cast<float*>(dst.data);
        const auto* in = static_cast<const float*>(src.data);
        for (int64_t r = 0; r < g.rows; ++r)
            for (int64_t c = 0; c < g.cols; ++c) out[dst.offset(b, n, r, c)] += in[src.offset(b, n, r, c)];
    });
}

}  // namespace

uint64_t accumulateBytes(const BackwardParams& bp) {
    const DenseGrads g = denseGrads(bp);
    return alignedBytes(g.dq.floats()) + alignedBytes(g.dk.floats()) + alignedBytes(g.dv.floats());
}

void runBackwardAccumulating(const BackwardParams& bp, const BackwardPlan& plan, void* workspace, uint64_t offset,
                             ThreadPool& pool) {
    const DenseGrads g = denseGrads(bp);
    char* at = static_cast<char*>(workspace) + offset;
    float* dq = reinterpret_cast<float*>(at);
    float* dk = reinterpret_cast<float*>(at + alignedBytes(g.dq.floats()));
    float* dv = reinterpret_cast<float*>(at + alignedBytes(g.dq.floats()) + alignedBytes(g.dk.floats()));
    BackwardParams local = bp;
    local.dq = g.dq.view(dq, bp.fwd.varlen);
    local.dk = g.dk.view(dk, bp.fwd.varlen);
    local.dv = g.dv.view(dv, bp.fwd.varlen);
    runBackward(local, plan, workspace, pool);
    addInto(bp.dq, local.dq, g.dq, pool);
    addInto(bp.dk, local.dk, g.dk, pool);
    addInto(bp.dv, local.dv, g.dv, pool);
}

}  // namespace attnops::fa

// Kernel choice, tile shape and cost-balanced work partition for the forward and the backward.
#include "ops/flash_attention_score/plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "cpu/bf16_path.hpp"
#include "ops/common/choose_kernel.hpp"
#include "ops/flash_attention_score/bwd_chunks.hpp"
#include "ops/flash_attention_score/semantics.hpp"

namespace attnops::fa {
namespace {

constexpr int64_t kUnitOverhead = 64;  // cost of a unit that attends nothing (loads, stores)
// The forward's, and the backward's, units are claimed largest first (partitionUnits'
// UnitOrder::LargestFirst, guided chunks): in index order causal and packed problems put units
// of very different cost last (a head's last query blocks cost about twice the mean), and the
// threads' idle tail was about half a chunk. By the plan's cost model at 2 threads, index order
// left 1.1% (GQA 32/8 S=2048 causal) and 2.0% (tnd-32k-causal) of the run to that tail with 16
// chunks per thread and 0.30% / 0.36% with 64; largest-first leaves 0.07% / 0.002% with 16 chunks
// per thread (39 and 53 chunks, against 89 and 117 for index order with 64), so the forward is
// back to the default chunk count (bench/results/amd-epyc-zen3-avx2/fwd-bwd-s11-lpt-order-under-load.txt,
// fwd_s11_lpt_tail.cpp; AMD EPYC Zen 3).

template <typename T>
void append(std::string& key, const T& value) {
    key.append(reinterpret_cast<const char*>(&value), sizeof value);
}

int64_t blocksOf(int64_t rows, int64_t blockRows) { return (rows + blockRows - 1) / blockRows; }

// Whether the automatic choice passes over a legal entry: the emulated AMX kernels (forceOnly),
// the avx512-bf16 entries when this CPU computes bf16 faster another way (the process-wide bf16
// path, decided on first need: here), and the AMX forward where its row steps would run (pse,
// explicit mask or dropout: slower than the AVX-512 kernels). Forcing still runs it. The AMX
// backward is chosen for exactly the problems whose forward is AMX: it recomputes the scores with
// the forward's tile arithmetic, and at large |scale| a backward whose scores differ in the last
// bit from the forward's overflows exp (FaScaleExtremes).
bool passedOver(const ForwardKernel& k, const ForwardParams& p, const PlatformInfo&) {
    return k.forceOnly || (&k == &forwardKernelAvx512Bf16() && cpu::bf16Path().path != cpu::Bf16Path::Dot) ||
           (&k == &forwardKernelAmx() && !amxTransposedForward(p));
}
// (The fused backward is not passed over: its chunk split, bwd_chunks.hpp, cuts problems with
// fewer than 16 (sequence, kv head) pairs into chunks aiming at 64 units, so that few pairs still
// give units for several cores, and it does 5 GEMMs where the two-kind scheme does 7.)
bool passedOver(const BackwardKernel& k, const BackwardParams& p, const PlatformInfo&) {
    const bool pairs = &k == &backwardKernelAvx512Bf16Fused() || &k == &backwardKernelAvx512Bf16();
    return k.forceOnly || (pairs && cpu::bf16Path().path != cpu::Bf16Path::Dot) ||
           (&k == &backwardKernelAmx() && !amxTransposedForward(p.fwd));
}

// Cost of query rows [q0, q1) of sequence b against the keys they may attend.
double queryBlockCost(const ForwardParams& p, int64_t b, int64_t q0, int64_t q1) {
    const int64_t sq = p.seq.qLen[size_t(b)], skv = p.seq.kvLen[size_t(b)];
    const KeyRange keys = keyRange(seqRule(p.mask, b, sq, skv), q0, q1, skv);
    return double(p.group) * double((q1 - q0) * (keys.hi - keys.lo) + kUnitOverhead);
}

}  // namespace

UnitSpace partitionUnits(int64_t sequences, int32_t threads, const std::function<int64_t(int64_t)>& unitsOf,
                         const std::function<double(int64_t, int64_t)>& costOf, int64_t chunksPerThread,
                         UnitOrder unitOrder) {
    UnitSpace space;
    space.base.resize(size_t(sequences) + 1);
    int64_t units = 0;
    double total = 0;
    std::vector<double> costs;  // per unit, LargestFirst only
    for (int64_t b = 0; b < sequences; ++b) {
        space.base[size_t(b)] = units;
        const int64_t n = unitsOf(b);
        units += n;
        for (int64_t u = 0; u < n; ++u) {
            const double cost = costOf(b, u);
            total += cost;
            if (unitOrder == UnitOrder::LargestFirst) costs.push_back(cost);
        }
    }
    space.base[size_t(sequences)] = units;
    const double target = std::max(1.0, total / double(std::max(1, threads) * chunksPerThread));
    space.chunkStart.push_back(0);
    double running = 0;
    if (unitOrder == UnitOrder::LargestFirst) {
        space.order.resize(size_t(units));
        for (int64_t u = 0; u < units; ++u) space.order[size_t(u)] = u;
        // Stable: equal costs keep ascending index, so the order is a function of the problem.
        std::stable_sort(space.order.begin(), space.order.end(),
                         [&](int64_t a, int64_t b) { return costs[size_t(a)] > costs[size_t(b)]; });
        // Guided cut: a chunk aims at min(target, remaining / (2 * threads)), so that the chunks
        // shrink towards the end of the loop and the last ones hold single cheap units: the idle
        // tail is bounded by the last chunks, not by a fixed chunk cost (cutting the sorted units
        // into equal chunks leaves a full chunk at the end and gains little).
        const double perClaim = 2.0 * double(std::max(1, threads));
        double remaining = total;
        double aim = std::max(1.0, std::min(target, remaining / perClaim));
        for (int64_t i = 0; i < units; ++i) {
            running += costs[size_t(space.order[size_t(i)])];
            if (running >= aim) {
                space.chunkStart.push_back(i + 1);
                remaining -= running;
                running = 0;
                aim = std::max(1.0, std::min(target, remaining / perClaim));
            }
        }
    } else {
        for (int64_t b = 0; b < sequences; ++b)
            for (int64_t u = 0, n = space.base[size_t(b) + 1] - space.base[size_t(b)]; u < n; ++u) {
                running += costOf(b, u);
                if (running >= target) {
                    space.chunkStart.push_back(space.base[size_t(b)] + u + 1);
                    running = 0;
                }
            }
    }
    if (space.chunkStart.back() != units) space.chunkStart.push_back(units);
    return space;
}

namespace {

// Unit `local` of a sequence of `rows` rows cut into blocks of `blockRows`, kv head major:
// kv head local / blocks, rows [first, last) of block local % blocks.
struct BlockSpan {
    int64_t n2, first, last;
};

BlockSpan blockAt(int64_t rows, int64_t blockRows, int64_t local) {
    const int64_t blocks = blocksOf(rows, blockRows);
    const int64_t first = (local % blocks) * blockRows;
    return {local / blocks, first, std::min(rows, first + blockRows)};
}

}  // namespace

WorkUnit queryUnitAt(const ForwardParams& p, TileShape tile, int64_t b, int64_t local) {
    const BlockSpan s = blockAt(p.seq.qLen[size_t(b)], tile.unitRows(), local);
    return WorkUnit{b, s.n2, s.first, s.last};
}

TileShape fitUnitsToThreads(const ForwardParams& p, TileShape tile, int32_t threads) {
    if (p.blocksPerUnit > 0 || tile.blocksPerUnit <= 1) return tile;
    const auto unitsOf = [&](int64_t rows) {
        int64_t units = 0;
        for (int64_t b = 0; b < p.seq.count; ++b) units += p.n2 * blocksOf(p.seq.qLen[size_t(b)], rows);
        return units;
    };
    const int64_t blocks = unitsOf(tile.queryRows), wanted = kMinUnitsPerThread * int64_t(std::max(1, threads));
    // Halved until every thread has kMinUnitsPerThread units.
    while (tile.blocksPerUnit > 1 && unitsOf(tile.unitRows()) < wanted) tile.blocksPerUnit /= 2;
    // No unit would hold two blocks (short sequences): the larger scratch would serve nothing.
    if (unitsOf(tile.unitRows()) == blocks) tile.blocksPerUnit = 1;
    return tile;
}

HeadChunk headChunkAt(const ForwardParams& p, const BackwardPlan& plan, int64_t b, int64_t local, float* partials) {
    const int64_t sq = p.seq.qLen[size_t(b)], skv = p.seq.kvLen[size_t(b)];
    const int64_t c = chunks::chunksOf(sq, plan.chunkRows);
    HeadChunk h;
    h.b = b;
    h.n2 = local / c;
    const int64_t chunk = local % c;
    h.q0 = std::min(sq, chunk * plan.chunkRows);
    h.q1 = std::min(sq, h.q0 + plan.chunkRows);
    if (c > 1 && partials != nullptr) {
        float* head = partials + plan.partialBase[size_t(b)] + uint64_t(h.n2 * c * skv * (p.d + p.dv));
        h.dkPartial = head + chunk * skv * p.d;
        h.dvPartial = head + c * skv * p.d + chunk * skv * p.dv;
    }
    return h;
}

KeyUnit keyUnitAt(const ForwardParams& p, TileShape tile, int64_t b, int64_t local) {
    const BlockSpan s = blockAt(p.seq.kvLen[size_t(b)], tile.keyRows, local);
    return KeyUnit{b, s.n2, s.first, s.last};
}

std::string forwardPlanKey(const ForwardParams& p, int32_t threads, const std::string& forcedKernel) {
    std::string key = forcedKernel + "|";
    append(key, threads);
    append(key, p.layout);
    append(key, p.q.dtype);
    for (int64_t v : {p.batch, p.n1, p.n2, p.d, p.dv, p.mask.sparseMode, p.mask.preTokens, p.mask.nextTokens})
        append(key, v);
    append(key, p.mask.explicitMask);
    append(key, p.pse.form);
    append(key, p.dropout.enabled);
    append(key, p.sink != nullptr);  // the backward books dsink terms in its workspace
    const auto appendVector = [&](const std::vector<int64_t>& v) {
        append(key, int64_t(v.size()));
        key.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
    };
    if (p.varlen) {
        appendVector(p.seq.qLen);
        appendVector(p.seq.kvLen);
    } else {
        append(key, p.seq.maxQLen);
        append(key, p.seq.maxKvLen);
    }
    appendVector(p.mask.prefix);
    append(key, p.headsPerPass);  // the tile (ATTNOPS_FA_HEADS_PER_PASS)
    append(key, p.blocksPerUnit);  // and ATTNOPS_FA_BLOCKS_PER_UNIT
    return key;
}

ForwardPlan makeForwardPlan(const ForwardParams& p, int32_t threads, const PlatformInfo& info,
                            const std::string& forcedKernel) {
    ForwardPlan plan;
    plan.kernel = &chooseKernel(forwardKernels(), p, forcedKernel, "FlashAttentionScore",
                                 [&](const ForwardKernel& k) { return passedOver(k, p, info); });
    plan.threads = std::max(1, threads);
    const TileShape chosen = plan.kernel->tile(p, info);
    plan.tile = fitUnitsToThreads(p, chosen, plan.threads);
    // The scratch of the blocks per unit chosen before the fit: the workspace then depends on
    // neither the lengths nor the thread count through it (fewer blocks need less).
    plan.scratchPerThread = (plan.kernel->scratchBytes(p, chosen) + 63) / 64 * 64;
    plan.workspaceBytes = plan.scratchPerThread * uint64_t(plan.threads);
    const TileShape tile = plan.tile;
    plan.units = partitionUnits(
        p.seq.count, plan.threads, [&](int64_t b) { return p.n2 * blocksOf(p.seq.qLen[size_t(b)], tile.unitRows()); },
        [&](int64_t b, int64_t local) {  // the unit's query blocks, each against its own keys
            const WorkUnit w = queryUnitAt(p, tile, b, local);
            double cost = 0;
            for (int64_t q0 = w.q0; q0 < w.q1; q0 += tile.queryRows)
                cost += queryBlockCost(p, b, q0, std::min(w.q1, q0 + tile.queryRows));
            return cost;
        },
        kChunksPerThread, UnitOrder::LargestFirst);
    return plan;
}

BackwardPlan makeBackwardPlan(const BackwardParams& bp, int32_t threads, const PlatformInfo& info,
                              const std::string& forcedKernel) {
    const ForwardParams& p = bp.fwd;
    BackwardPlan plan;
    plan.kernel = &chooseKernel(backwardKernels(), bp, forcedKernel, "FlashAttentionScoreGrad",
                                 [&](const BackwardKernel& k) { return passedOver(k, bp, info); });
    plan.tile = plan.kernel->tile(bp, info);
    plan.threads = std::max(1, threads);
    plan.scratchPerThread = (plan.kernel->scratchBytes(bp, plan.tile) + 63) / 64 * 64;
    plan.sinkTermsOffset = plan.scratchPerThread * uint64_t(plan.threads);
    const uint64_t sinkTerms = bp.dsink ? uint64_t(bp.sinkRows) * uint64_t(p.n1) * sizeof(float) : 0;
    plan.workspaceBytes = plan.sinkTermsOffset + (sinkTerms + 63) / 64 * 64;
    const TileShape tile = plan.tile;
    if (plan.kernel->runHeadUnit != nullptr) {
        const int64_t rows = fusedChunkRowsOf(p, *plan.kernel, tile);
        if (rows <= 0) internalError("the fused backward {} was chosen for a problem it declines", plan.kernel->name);
        plan.chunkRows = rows;
        plan.partialBase.resize(size_t(p.seq.count) + 1);
        uint64_t partialFloats = 0;
        for (int64_t b = 0; b < p.seq.count; ++b) {
            plan.partialBase[size_t(b)] = partialFloats;
            partialFloats += chunks::partialFloatsOf(p, b, rows);
        }
        plan.partialBase[size_t(p.seq.count)] = partialFloats;
        plan.partialOffset = plan.workspaceBytes;
        plan.workspaceBytes += (partialFloats * sizeof(float) + 63) / 64 * 64;
        // A chunk unit's cost: its query blocks' costs.
        plan.headUnits = partitionUnits(
            p.seq.count, plan.threads,
            [&](int64_t b) { return p.n2 * chunks::chunksOf(p.seq.qLen[size_t(b)], rows); },
            [&](int64_t b, int64_t local) {
                const HeadChunk c = headChunkAt(p, plan, b, local, nullptr);
                double cost = 0;
                for (int64_t q0 = c.q0; q0 < c.q1; q0 += tile.queryRows)
                    cost += queryBlockCost(p, b, q0, std::min(c.q1, q0 + tile.queryRows));
                return cost + double(kUnitOverhead);
            },
            kChunksPerThread, UnitOrder::LargestFirst);
        // A reduction unit's cost: the partial rows it adds.
        plan.reduceUnits = partitionUnits(
            p.seq.count, plan.threads,
            [&](int64_t b) {
                const int64_t c = chunks::chunksOf(p.seq.qLen[size_t(b)], rows);
                return c == 1 ? 0 : p.n2 * blocksOf(p.seq.kvLen[size_t(b)], tile.keyRows);
            },
            [&](int64_t b, int64_t) { return double(chunks::chunksOf(p.seq.qLen[size_t(b)], rows)); });
        return plan;
    }
    plan.queryUnits = partitionUnits(
        p.seq.count, plan.threads, [&](int64_t b) { return p.n2 * blocksOf(p.seq.qLen[size_t(b)], tile.queryRows); },
        [&](int64_t b, int64_t local) {
            const WorkUnit w = queryUnitAt(p, tile, b, local);
            return queryBlockCost(p, b, w.q0, w.q1);
        },
        kChunksPerThread, UnitOrder::LargestFirst);
    // A key block's cost: the query rows that may see it, times its width.
    plan.keyUnits = partitionUnits(
        p.seq.count, plan.threads, [&](int64_t b) { return p.n2 * blocksOf(p.seq.kvLen[size_t(b)], tile.keyRows); },
        [&](int64_t b, int64_t local) {
            const KeyUnit k = keyUnitAt(p, tile, b, local);
            const int64_t sq = p.seq.qLen[size_t(b)], skv = p.seq.kvLen[size_t(b)];
            const SeqRule rule = seqRule(p.mask, b, sq, skv);
            int64_t rows = 0;
            for (int64_t q0 = 0; q0 < sq; q0 += tile.queryRows) {
                const KeyRange keys = keyRange(rule, q0, std::min(sq, q0 + tile.queryRows), skv);
                if (keys.hi > k.k0 && keys.lo < k.k1) rows += std::min(tile.queryRows, sq - q0);
            }
            return double(p.group) * double(rows * (k.k1 - k.k0) + kUnitOverhead);
        },
        kChunksPerThread, UnitOrder::LargestFirst);
    return plan;
}

}  // namespace attnops::fa

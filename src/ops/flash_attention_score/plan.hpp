// FlashAttentionScore plans ("tiling"): pure functions of the problem and the device that pick
// the kernel, the tile shape, the cost-balanced work partition and the workspace booking.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ops/flash_attention_score/kernel.hpp"
#include "ops/flash_attention_score/params.hpp"
#include "runtime/plan_cache.hpp"

namespace attnops::fa {

// Work units numbered sequence by sequence (sequence b owns [base[b], base[b+1])), cut into
// chunks of similar cost that threads claim dynamically, in chunk index order. Without `order`
// a chunk is a run of consecutive units and memory is O(B + chunks); with it (largest-first
// plans) position i of the claim order is unit order[i], and chunk c is the positions
// [chunkStart[c], chunkStart[c+1]): memory O(units).
struct UnitSpace {
    std::vector<int64_t> base;
    std::vector<int64_t> chunkStart;  // chunk c is [chunkStart[c], chunkStart[c+1])
    std::vector<int64_t> order;       // empty, or a permutation of [0, units)

    int64_t chunks() const { return int64_t(chunkStart.size()) - 1; }

    // Calls visit(b, local) for every unit of chunk c in order (local: index within sequence b).
    template <typename Visit>
    void forEachInChunk(int64_t c, Visit&& visit) const {
        const int64_t u0 = chunkStart[size_t(c)], u1 = chunkStart[size_t(c) + 1];
        if (!order.empty()) {
            for (int64_t i = u0; i < u1; ++i) {
                const int64_t u = order[size_t(i)];
                const size_t b = size_t(std::upper_bound(base.begin(), base.end(), u) - base.begin()) - 1;
                visit(int64_t(b), u - base[b]);
            }
            return;
        }
        int64_t b = int64_t(std::upper_bound(base.begin(), base.end(), u0) - base.begin()) - 1;
        for (int64_t u = u0; u < u1; ++u) {
            while (base[size_t(b) + 1] <= u) ++b;
            visit(b, u - base[size_t(b)]);
        }
    }
};

// Claim order of partitionUnits' units.
enum class UnitOrder {
    Index,         // units in index order (sequence, then the unit's own order)
    LargestFirst,  // descending cost, ties by ascending index: a pure function of the problem
};

// Chunks per thread that partitionUnits aims at: enough slack for dynamic balancing.
constexpr int64_t kChunksPerThread = 16;

// unitsOf(b): units of sequence b; costOf(b, local): relative cost of one unit; chunks of about
// total / (threads * chunksPerThread) cost, cut over the units in `unitOrder`. LargestFirst
// (longest processing time first) leaves the cheapest units for the end of the loop, so that the
// threads finish close together; the order changes no bits where every unit writes only its own
// outputs (the FA forward and backward: nothing accumulates across units).
UnitSpace partitionUnits(int64_t sequences, int32_t threads, const std::function<int64_t(int64_t)>& unitsOf,
                         const std::function<double(int64_t, int64_t)>& costOf,
                         int64_t chunksPerThread = kChunksPerThread, UnitOrder unitOrder = UnitOrder::Index);

struct ForwardPlan : PlanBase {
    const ForwardKernel* kernel = nullptr;
    TileShape tile;
    int32_t threads = 1;
    UnitSpace units;                // (sequence, kv head, query block)
    uint64_t scratchPerThread = 0;  // bytes, 64-byte multiple
    uint64_t workspaceBytes = 0;
};

struct BackwardPlan : PlanBase {
    const BackwardKernel* kernel = nullptr;
    TileShape tile;
    int32_t threads = 1;
    UnitSpace keyUnits;             // (sequence, kv head, key block): dk, dv
    UnitSpace queryUnits;           // (sequence, kv head, query block): dq
    UnitSpace headUnits;            // (sequence, kv head, chunk): all three, when the kernel is fused
    uint64_t scratchPerThread = 0;
    uint64_t sinkTermsOffset = 0;   // bytes into the workspace of BackwardParams::sinkRowTerms
    uint64_t workspaceBytes = 0;
    // The fused scheme's split (ops/flash_attention_score/bwd_chunks.hpp): query rows per chunk,
    // the partial dk, dv of sequences with several chunks (sequence b's from float partialBase[b]
    // of the area at byte partialOffset: per kv head [chunks][kv length][d], then the same with
    // dv), and the reduction units (sequence, kv head, key block) of those sequences.
    int64_t chunkRows = 0;
    std::vector<uint64_t> partialBase;
    uint64_t partialOffset = 0;
    UnitSpace reduceUnits;
};

// The fused scheme's unit `local` of sequence b (kv head major, then chunk), with its partial
// slices in the area `partials` when the sequence has several chunks.
HeadChunk headChunkAt(const ForwardParams& p, const BackwardPlan& plan, int64_t b, int64_t local, float* partials);

// Signature of everything a plan depends on (shapes, dtypes, mask geometry, lengths).
std::string forwardPlanKey(const ForwardParams& p, int32_t threads, const std::string& forcedKernel);

ForwardPlan makeForwardPlan(const ForwardParams& p, int32_t threads, const PlatformInfo& info,
                            const std::string& forcedKernel);
BackwardPlan makeBackwardPlan(const BackwardParams& p, int32_t threads, const PlatformInfo& info,
                              const std::string& forcedKernel);

// Unit `local` of sequence b: query units of the forward and of the backward's dq pass
// (tile.unitRows() rows).
WorkUnit queryUnitAt(const ForwardParams& p, TileShape tile, int64_t b, int64_t local);

// `tile` with its blocksPerUnit halved until every thread has kMinUnitsPerThread units (down to
// one query block per unit), and one block per unit where no sequence has more than one query
// block, unless p.blocksPerUnit (ATTNOPS_FA_BLOCKS_PER_UNIT) forced the count. The vector forward gives the same bytes for any count, so choosing it by the thread
// count keeps results independent of it.
constexpr int64_t kMinUnitsPerThread = 8;
TileShape fitUnitsToThreads(const ForwardParams& p, TileShape tile, int32_t threads);
KeyUnit keyUnitAt(const ForwardParams& p, TileShape tile, int64_t b, int64_t local);

}  // namespace attnops::fa

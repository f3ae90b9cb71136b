// FlashAttentionScore plans, partitionUnits' claim order (ops/flash_attention_score/plan.hpp):
// the largest-first order is a permutation of the units in descending cost with ties in index
// order, the chunks cover it exactly once, it is the same for every call, and by the cost model
// it shortens the 2-thread idle tail of a causal-like and a packed problem against index order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <queue>
#include <utility>
#include <vector>

#include "ops/flash_attention_score/plan.hpp"

namespace fa = attnops::fa;

namespace {

// A packed causal problem: sequences of these lengths, `heads` heads each, blocks of 64 rows,
// a block's cost rows x keys it may see (+64), and an empty sequence in the middle.
struct Problem {
    std::vector<int64_t> lens{300, 0, 1, 129, 64, 700, 65};
    int64_t heads = 3;
    int64_t blocks(int64_t b) const { return (lens[size_t(b)] + 63) / 64; }
    int64_t unitsOf(int64_t b) const { return heads * blocks(b); }
    double costOf(int64_t b, int64_t local) const {
        const int64_t q0 = (local % blocks(b)) * 64, q1 = std::min(lens[size_t(b)], q0 + 64);
        return double((q1 - q0) * q1 + 64);
    }
    fa::UnitSpace partition(int32_t threads, fa::UnitOrder order, int64_t perThread = fa::kChunksPerThread) const {
        return fa::partitionUnits(
            int64_t(lens.size()), threads, [&](int64_t b) { return unitsOf(b); },
            [&](int64_t b, int64_t local) { return costOf(b, local); }, perThread, order);
    }
};

// Units of the space in claim order, as (sequence, local).
std::vector<std::pair<int64_t, int64_t>> claimOrder(const fa::UnitSpace& s) {
    std::vector<std::pair<int64_t, int64_t>> v;
    for (int64_t c = 0; c < s.chunks(); ++c) s.forEachInChunk(c, [&](int64_t b, int64_t l) { v.emplace_back(b, l); });
    return v;
}

// Makespan of threads claiming the chunks dynamically in index order, over total / threads.
double idleTail(const fa::UnitSpace& s, const Problem& p, int threads) {
    std::priority_queue<double, std::vector<double>, std::greater<double>> free;
    for (int t = 0; t < threads; ++t) free.push(0.0);
    double total = 0, makespan = 0;
    for (int64_t c = 0; c < s.chunks(); ++c) {
        double cost = 0;
        s.forEachInChunk(c, [&](int64_t b, int64_t l) { cost += p.costOf(b, l); });
        total += cost;
        const double end = free.top() + cost;
        free.pop();
        free.push(end);
        makespan = std::max(makespan, end);
    }
    return makespan / (total / threads) - 1.0;
}

}  // namespace

TEST(FaPlanOrder, LargestFirstIsADescendingPermutationWithTiesInIndexOrder) {
    const Problem p;
    for (int32_t threads : {1, 2, 3, 7}) {
        const fa::UnitSpace s = p.partition(threads, fa::UnitOrder::LargestFirst);
        const int64_t units = s.base.back();
        ASSERT_EQ(int64_t(s.order.size()), units);
        ASSERT_EQ(s.chunkStart.front(), 0);
        ASSERT_EQ(s.chunkStart.back(), units);
        for (int64_t c = 0; c < s.chunks(); ++c) EXPECT_LT(s.chunkStart[size_t(c)], s.chunkStart[size_t(c) + 1]);
        const auto v = claimOrder(s);
        ASSERT_EQ(int64_t(v.size()), units);
        // Every unit exactly once, with its sequence's own numbering.
        std::vector<int> seen(size_t(units), 0);
        for (const auto& [b, l] : v) {
            ASSERT_GE(l, 0);
            ASSERT_LT(l, p.unitsOf(b));
            ++seen[size_t(s.base[size_t(b)] + l)];
        }
        EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
        // Descending cost; equal costs in ascending (sequence, local).
        for (size_t i = 1; i < v.size(); ++i) {
            const double prev = p.costOf(v[i - 1].first, v[i - 1].second), cur = p.costOf(v[i].first, v[i].second);
            EXPECT_GE(prev, cur) << i;
            if (prev == cur) {
                EXPECT_LT(v[i - 1], v[i]) << i;
            }
        }
        // A pure function of the problem: the same order again.
        EXPECT_EQ(p.partition(threads, fa::UnitOrder::LargestFirst).order, s.order);
    }
    // The most costly unit first: the last block of the 700-row sequence (local 10 of each head,
    // 60 rows x 700 keys), head 0 before its equals in heads 1 and 2.
    const auto v = claimOrder(p.partition(2, fa::UnitOrder::LargestFirst));
    EXPECT_EQ(v[0], std::make_pair(int64_t(5), int64_t(10)));
    EXPECT_EQ(v[1], std::make_pair(int64_t(5), int64_t(21)));
    EXPECT_EQ(v[2], std::make_pair(int64_t(5), int64_t(32)));
}

TEST(FaPlanOrder, IndexOrderStoresNoPermutationAndKeepsUnitOrder) {
    const Problem p;
    const fa::UnitSpace s = p.partition(2, fa::UnitOrder::Index);
    EXPECT_TRUE(s.order.empty());
    const auto v = claimOrder(s);
    ASSERT_EQ(int64_t(v.size()), s.base.back());
    EXPECT_TRUE(std::is_sorted(v.begin(), v.end()));
}

TEST(FaPlanOrder, LargestFirstShortensTheModelsIdleTail) {
    // Few chunks per thread, so that the tail is visible: index order ends with the costly last
    // blocks of the last sequences, largest-first with the cheapest units.
    const Problem p;
    for (int threads : {2, 3}) {
        const double index = idleTail(p.partition(threads, fa::UnitOrder::Index, 4), p, threads);
        const double lpt = idleTail(p.partition(threads, fa::UnitOrder::LargestFirst, 4), p, threads);
        EXPECT_LT(lpt, index) << threads << " threads";
        EXPECT_LT(lpt, 0.05) << threads << " threads";
    }
}

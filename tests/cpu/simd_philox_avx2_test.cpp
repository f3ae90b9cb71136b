// Dropout's eight-lane Philox on AVX2 (Avx2::PhiloxKeep in cpu/avx2/simd_avx2.hpp, the vector
// pse/mask/dropout steps' generator of keep flags) against DropoutBits::BlockByBlock, the one-
// block-at-a-time definition (itself checked against the spec's recipe in tests/core): the same
// flags for every seed, offset, keep probability (every word kept, none, thresholds in between),
// number of groups (whole steps of eight and the remainders) and starting group, including the
// steps whose counter's low word wraps (the high word then differs by lane). Through fill() too,
// from every alignment. Skipped without AVX2/FMA/F16C.
#include "cpu/avx2/simd_avx2.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "avx2_tests.hpp"
#include "core/philox.hpp"

namespace {

using attnops::DropoutBits;
using attnops::cpu::Avx2;

struct Case {
    uint64_t seed, offset;
    float keepProb;
};

const Case kCases[] = {
    {0, 0, 0.5f},
    {1, 0, 0.9f},
    {0x0123456789abcdefull, 0xfedcba9876543210ull, 0.3f},
    {~uint64_t(0), ~uint64_t(0), 0.75f},
    {42, uint64_t(1) << 40, 0.05f},
    {7, 3, 1.0f},                 // every word kept (threshold 2^32)
    {9, 5, 0.0f},                 // none
    {11, 13, std::nextafter(1.0f, 0.0f)},
};

TEST(SimdPhiloxAvx2, WholeGroupsMatchBlockByBlock) {
    SKIP_WITHOUT_AVX2();
    const uint64_t starts[] = {0, 5, 0xfffffff0ull, 0xfffffff9ull, 0xffffffffull, (uint64_t(7) << 32) - 20,
                               ~uint64_t(0) - 40};
    for (const Case& c : kCases) {
        const DropoutBits bits(c.seed, c.offset, c.keepProb);
        for (uint64_t group : starts)
            for (int64_t groups = 0; groups <= 35; ++groups) {
                std::vector<uint8_t> vec(size_t(4 * groups) + 1, 0xEE), ref(size_t(4 * groups) + 1, 0xEE);
                Avx2::PhiloxKeep{}(bits, group, groups, vec.data());
                DropoutBits::BlockByBlock{}(bits, group, groups, ref.data());
                ASSERT_EQ(vec, ref) << "seed " << c.seed << " offset " << c.offset << " keep " << c.keepProb
                                    << " group " << group << " groups " << groups;  // the sentinel byte too
            }
    }
}

TEST(SimdPhiloxAvx2, FillFromEveryAlignmentMatches) {
    SKIP_WITHOUT_AVX2();
    for (const Case& c : kCases) {
        const DropoutBits bits(c.seed, c.offset, c.keepProb);
        for (uint64_t first : {uint64_t(0), uint64_t(1), uint64_t(2), uint64_t(3), (uint64_t(1) << 34) - 61})
            for (int64_t count : {0, 1, 3, 4, 31, 32, 33, 64, 127, 128, 129, 300}) {
                std::vector<uint8_t> vec(static_cast<size_t>(count)), ref(static_cast<size_t>(count));
                bits.fill(first + 3, count, vec.data(), Avx2::PhiloxKeep{});
                bits.fill(first + 3, count, ref.data());
                ASSERT_EQ(vec, ref) << "first " << first + 3 << " count " << count;
            }
    }
}

}  // namespace

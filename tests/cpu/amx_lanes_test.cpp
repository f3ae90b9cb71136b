// cpu/amx/lanes.hpp's narrowing for the fused AMX backward's operands: bf16RowsFlushed (floatToBf16
// after flushing denormal inputs to a zero of their sign, VCVTNE2PS2BF16's rule) on hand-computed
// inputs (ties, denormals, the denormal that round to nearest even would lift to the smallest
// normal, NaN, infinities, overflow), its hardware form equal to the portable one bit for bit
// where the CPU has AVX512-BF16, and pairsOfRows' interleaving.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype.hpp"
#include "cpu/amx/lanes.hpp"
#include "cpu/isa.hpp"

namespace attnops::testsupport {
void amxLanesHwBf16RowsFlushed(const float* lo, const float* hi, uint16_t* out);
}

namespace {

namespace amx = attnops::cpu::amx;

float fromBits(uint32_t b) {
    float f;
    std::memcpy(&f, &b, sizeof f);
    return f;
}

// (input bits, expected bf16 bits)
struct Expect {
    uint32_t in;
    uint16_t out;
};

const std::vector<Expect>& cases() {
    static const std::vector<Expect> v = {
        {0x3F800000u, 0x3F80},  // 1
        {0x3F808000u, 0x3F80},  // tie, even below
        {0x3F818000u, 0x3F82},  // tie, even above
        {0x3F808001u, 0x3F81},  // above the tie
        {0xBF7FFFFFu, 0xBF80},  // rounds up across the exponent
        {0x00000001u, 0x0000},  // smallest denormal: flushed
        {0x007FFFFFu, 0x0000},  // largest denormal: flushed (round to nearest even alone gives 0x0080)
        {0x80400000u, 0x8000},  // negative denormal: negative zero
        {0x00800000u, 0x0080},  // smallest normal
        {0x7F7FFFFFu, 0x7F80},  // overflows to infinity
        {0x7F800000u, 0x7F80},  // infinity
        {0xFF800000u, 0xFF80},  // -infinity
        {0x7FC00001u, 0x7FC0},  // quiet NaN
        {0x7F800001u, 0x7FC0},  // signalling NaN, quieted
        {0x80000000u, 0x8000},  // -0
        {0x42F6E979u, 0x42F7},  // 123.456
    };
    return v;
}

// The first 32 cases, cycled: lanes 0-15 from lo, 16-31 from hi.
void inputs(float* lo, float* hi, uint16_t* want) {
    const auto& c = cases();
    for (size_t i = 0; i < 32; ++i) {
        const Expect& e = c[(i * 7) % c.size()];
        (i < 16 ? lo[i] : hi[i - 16]) = fromBits(e.in);
        want[i] = e.out;
    }
}

TEST(AmxLanes, Bf16RowsFlushedRoundsToNearestEvenAfterFlushingDenormals) {
    float lo[16], hi[16];
    uint16_t want[32];
    inputs(lo, hi, want);
    const amx::H32x rows = amx::bf16RowsFlushed(amx::loadLanes(lo), amx::loadLanes(hi));
    for (int i = 0; i < 32; ++i) EXPECT_EQ(rows[i], want[i]) << "element " << i;
    // Away from denormals it is floatToBf16.
    for (int i = 0; i < 16; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &lo[i], sizeof bits);
        if ((bits & 0x7f800000u) != 0) {
            EXPECT_EQ(rows[i], attnops::floatToBf16(lo[i])) << "element " << i;
        }
    }
}

TEST(AmxLanes, HardwareBf16RowsFlushedEqualsThePortableForm) {
    const attnops::cpu::IsaFeatures& f = attnops::cpu::isa();
    if (!(f.avx512f && f.avx512bw && f.avx512vl && f.avx512bf16 && f.avx2 && f.fma && f.f16c))
        GTEST_SKIP() << "the CPU has no AVX512-BF16: the hardware form cannot run here";
    float lo[16], hi[16];
    uint16_t want[32], hw[32];
    inputs(lo, hi, want);
    attnops::testsupport::amxLanesHwBf16RowsFlushed(lo, hi, hw);
    const amx::H32x portable = amx::bf16RowsFlushed(amx::loadLanes(lo), amx::loadLanes(hi));
    for (int i = 0; i < 32; ++i) EXPECT_EQ(hw[i], portable[i]) << "element " << i;
}

TEST(AmxLanes, PairsOfRowsInterleavesTheTwoRows) {
    amx::H32x rows;
    for (int i = 0; i < 32; ++i) rows[i] = uint16_t(0x100 + i);
    const amx::U16x pairs = amx::pairsOfRows(rows);
    for (int i = 0; i < 16; ++i) EXPECT_EQ(pairs[i], uint32_t(0x100 + i) | (uint32_t(0x110 + i) << 16)) << "pair " << i;
}

}  // namespace

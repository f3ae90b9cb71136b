// The AVX-512 lane sums of FusedInferAttentionScore's dot steps: sum16 (16 vectors at once, the
// 4-key steps of dotRows) gives sum8's bits for every vector, on inputs whose sum depends on the
// order of the additions. Skipped on CPUs without AVX-512 (F, BW, VL, BF16) and AVX2/FMA/F16C.
#include "cpu/avx512/microkernels.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/isa.hpp"

namespace {

using attnops::cpu::Avx512;

bool hasAvx512() {
    const attnops::cpu::IsaFeatures& f = attnops::cpu::isa();
    return f.avx512f && f.avx512bw && f.avx512vl && f.avx512bf16 && f.avx2 && f.fma && f.f16c;
}

// The sums of 16 vectors of 16 floats at x, by sum16 and by two sum8.
ATTNOPS_AVX512_FN void sumsBothWays(const float* x, float* by16, float* by8) {
    Avx512::Vec v[16];
    for (int i = 0; i < 16; ++i) v[i] = Avx512::load(x + 16 * i);
    Avx512::sum16(v, by16);
    Avx512::sum8(v, by8);
    Avx512::sum8(v + 8, by8 + 8);
}

uint32_t bitsOf(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}

TEST(SimdAvx512, Sum16GivesSum8sBitsForEveryVector) {
    if (!hasAvx512()) GTEST_SKIP() << "this CPU has no AVX-512 F/BW/VL/BF16";
    std::mt19937 rng(7);
    // Magnitudes over 40 binades with both signs: each vector's sum rounds differently in
    // another order. Every vector differs, so a lane sent to the wrong output shows too.
    std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
    std::uniform_int_distribution<int> exponent(-20, 20), sign(0, 1);
    int orderSensitive = 0;
    for (int round = 0; round < 200; ++round) {
        std::vector<float> x(256);
        for (float& f : x) f = std::ldexp(mantissa(rng), exponent(rng)) * (sign(rng) ? -1.0f : 1.0f);
        float by16[16], by8[16];
        sumsBothWays(x.data(), by16, by8);
        for (int i = 0; i < 16; ++i) {
            ASSERT_EQ(bitsOf(by16[i]), bitsOf(by8[i])) << "round " << round << " vector " << i;
            float serial = 0.0f;
            for (int c = 0; c < 16; ++c) serial += x[16 * i + c];
            orderSensitive += bitsOf(serial) != bitsOf(by8[i]);
        }
    }
    EXPECT_GT(orderSensitive, 100) << "the inputs should tell summation orders apart";
}

}  // namespace

// The AVX2 instances of the generic building blocks (cpu/simd/microkernels.hpp) against scalar
// definitions: fp16 widening and the GEMM bitwise, the band per lane exactly, exp to 2 ulp; the
// decode kernel's loads (bf16, int8), probability rounding and lane sums.
// Skipped on CPUs without AVX2, FMA and F16C.
#include "cpu/avx2/simd_avx2.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.hpp"
#include "cpu/isa.hpp"
#include "avx2_tests.hpp"

namespace {


using attnops::cpu::Avx2;
namespace simd = attnops::cpu::simd;

// Entry points with the AVX2 target: the building blocks are always inlined into their caller.
ATTNOPS_AVX2_FN void widen(const uint16_t* src, int64_t n, float* dst) { Avx2::widenHalves(src, n, dst); }

ATTNOPS_AVX2_FN void expLanes(const float* x, float* y) { Avx2::store(y, simd::exp<Avx2>(Avx2::load(x))); }

ATTNOPS_AVX2_FN void keptLanes(const attnops::fa::SeqRule& rule, int64_t skv, int64_t key, int64_t row0,
                               int32_t* rowsOut, int32_t* keysOut) {
    const simd::BandLanes<Avx2> band = simd::bandLanes<Avx2>(rule, skv);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(rowsOut), simd::keptRows<Avx2>(band, key, row0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(keysOut), simd::keptKeys<Avx2>(band, key, row0));
}

ATTNOPS_AVX2_FN void loadBf16Lanes(const uint16_t* src, float* dst) { Avx2::store(dst, Avx2::loadBf16(src)); }
ATTNOPS_AVX2_FN void loadInt8Lanes(const int8_t* src, float* dst) { Avx2::store(dst, Avx2::loadInt8(src)); }
ATTNOPS_AVX2_FN void roundLanes(const float* x, float* bf16, float* half) {
    Avx2::store(bf16, Avx2::roundBf16(Avx2::load(x)));
    Avx2::store(half, Avx2::roundHalf(Avx2::load(x)));
}
ATTNOPS_AVX2_FN void sumLanes(const float* x, float* sums8, float* sum0) {
    Avx2::Vec v[8];
    for (int i = 0; i < 8; ++i) v[i] = Avx2::load(x + 8 * i);
    Avx2::sum8(v, sums8);
    *sum0 = Avx2::sumLanes(v[0]);
}

float floatToBits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

TEST(SimdAvx2, WidenHalvesEqualsScalarConversionForEveryValueAndTail) {
    SKIP_WITHOUT_AVX2();
    std::vector<uint16_t> all(65536);
    for (uint32_t h = 0; h < 65536; ++h) all[h] = uint16_t(h);
    std::vector<float> out(65536);
    widen(all.data(), 65536, out.data());
    for (uint32_t h = 0; h < 65536; ++h) {
        uint32_t expect, got;
        const float scalar = attnops::f16ToFloat(uint16_t(h));
        std::memcpy(&expect, &scalar, sizeof expect);
        std::memcpy(&got, &out[h], sizeof got);
        if (std::isnan(scalar)) expect |= 0x00400000u;  // vcvtph2ps quiets signalling NaNs, payload kept
        ASSERT_EQ(got, expect) << "fp16 bits " << h;
    }
    // Tails: nothing past n is written.
    for (int64_t n = 0; n <= 19; ++n) {
        std::vector<float> dst(size_t(n) + 8, -7.0f);
        widen(all.data() + 15360, n, dst.data());  // from 1.0
        for (int64_t c = 0; c < n; ++c) EXPECT_EQ(dst[size_t(c)], attnops::f16ToFloat(uint16_t(15360 + c)));
        for (size_t c = size_t(n); c < dst.size(); ++c) EXPECT_EQ(dst[c], -7.0f) << "n " << n;
    }
}

TEST(SimdAvx2, GemmEqualsScalarFmaChainsBitwise) {
    SKIP_WITHOUT_AVX2();
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (const auto& [m, n, k] :
         {std::array<int64_t, 3>{1, 1, 1}, {6, 16, 8}, {7, 17, 33}, {13, 40, 128}, {64, 64, 5}}) {
        for (bool transA : {false, true}) {
            for (bool accumulate : {false, true}) {
                const int64_t lda = transA ? m + 3 : k + 2, ldb = n + 5, ldc = n + 1;
                std::vector<float> a(size_t((transA ? k : m) * lda)), b(size_t(k * ldb)), c(size_t(m * ldc));
                for (float& x : a) x = dist(rng);
                for (float& x : b) x = dist(rng);
                for (float& x : c) x = dist(rng);
                std::vector<float> expect = c;
                for (int64_t i = 0; i < m; ++i)
                    for (int64_t j = 0; j < n; ++j) {
                        float acc = accumulate ? c[size_t(i * ldc + j)] : 0.0f;
                        for (int64_t kk = 0; kk < k; ++kk)
                            acc = std::fma(transA ? a[size_t(kk * lda + i)] : a[size_t(i * lda + kk)],
                                           b[size_t(kk * ldb + j)], acc);
                        expect[size_t(i * ldc + j)] = acc;
                    }
                if (transA)
                    simd::gemm<Avx2, true>(m, n, k, a.data(), lda, b.data(), ldb, c.data(), ldc, accumulate);
                else
                    simd::gemm<Avx2, false>(m, n, k, a.data(), lda, b.data(), ldb, c.data(), ldc, accumulate);
                ASSERT_EQ(std::memcmp(c.data(), expect.data(), c.size() * sizeof(float)), 0)
                    << m << "x" << n << "x" << k << " transA " << transA << " accumulate " << accumulate;
            }
        }
    }
}

TEST(SimdAvx2, BandLanesEqualTheScalarRule) {
    SKIP_WITHOUT_AVX2();
    const attnops::fa::SeqRule rules[] = {
        {-3, 2, 0}, {0, 0, 4}, {-1000, -5, 0}, {7, 1 << 30, 2}, {-(int64_t(1) << 40), 0, 0}};
    for (const attnops::fa::SeqRule& rule : rules)
        for (int64_t key = 0; key < 40; key += 3)
            for (int64_t row0 = 0; row0 < 40; row0 += 5) {
                int32_t rows[8], keys[8];
                keptLanes(rule, 64, key, row0, rows, keys);
                for (int l = 0; l < 8; ++l) {
                    EXPECT_EQ(rows[l] != 0, rule.keeps(row0 + l, key)) << "row " << row0 + l << " key " << key;
                    EXPECT_EQ(keys[l] != 0, rule.keeps(row0, key + l)) << "row " << row0 << " key " << key + l;
                }
            }
}

TEST(SimdAvx2, ExpIsWithinTwoUlpAndHandlesSpecialValues) {
    SKIP_WITHOUT_AVX2();
    std::vector<float> xs;
    for (float x = -87.0f; x <= 88.0f; x += 0.0173f) xs.push_back(x);
    for (float x : {0.0f, -0.0f, 1e-30f, -1e-30f}) xs.push_back(x);
    xs.resize((xs.size() + 7) / 8 * 8, 0.0f);
    std::vector<float> ys(xs.size());
    for (size_t i = 0; i < xs.size(); i += 8) expLanes(&xs[i], &ys[i]);
    for (size_t i = 0; i < xs.size(); ++i) {
        const double expect = std::exp(double(xs[i]));
        EXPECT_LE(std::abs(double(ys[i]) - expect), 2.0 * std::ldexp(1.0, std::ilogb(expect) - 23)) << "x " << xs[i];
    }
    const float inf = std::numeric_limits<float>::infinity();
    const float special[8] = {-inf, -88.0f, -1000.0f, std::nanf(""), floatToBits(0xFFC00001u), 0.0f, -87.2f, 1.0f};
    float out[8];
    expLanes(special, out);
    EXPECT_EQ(out[0], 0.0f);
    EXPECT_EQ(out[1], 0.0f);
    EXPECT_EQ(out[2], 0.0f);
    EXPECT_TRUE(std::isnan(out[3]));
    EXPECT_TRUE(std::isnan(out[4]));
    EXPECT_EQ(out[5], 1.0f);
    EXPECT_GT(out[6], 0.0f);
}

}  // namespace

TEST(SimdAvx2, DecodeLoadsRoundingAndLaneSums) {
    SKIP_WITHOUT_AVX2();
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> prob(0.0f, 1.0f);
    for (int trial = 0; trial < 2000; ++trial) {
        uint16_t b[8];
        int8_t q[8];
        float x[8], wide[8], ints[8], bf16[8], half[8];
        for (int l = 0; l < 8; ++l) {
            b[l] = uint16_t(rng());
            q[l] = int8_t(rng());
            x[l] = trial % 2 ? prob(rng) : std::ldexp(prob(rng), -int(rng() % 30));  // probabilities, tiny ones too
        }
        loadBf16Lanes(b, wide);
        loadInt8Lanes(q, ints);
        roundLanes(x, bf16, half);
        for (int l = 0; l < 8; ++l) {
            const float expect = attnops::bf16ToFloat(b[l]);
            EXPECT_TRUE(std::memcmp(&expect, &wide[l], sizeof expect) == 0) << b[l];
            EXPECT_EQ(ints[l], float(q[l]));
            EXPECT_EQ(bf16[l], attnops::roundTo(attnops::DType::BF16, x[l])) << x[l];
            EXPECT_EQ(half[l], attnops::roundTo(attnops::DType::F16, x[l])) << x[l];
        }
    }
    float m[64], sums[8], first = 0.0f;
    for (int i = 0; i < 64; ++i) m[i] = float(i % 8 == 3 ? i : -i) * 0.25f;  // exact in fp32: order-free
    sumLanes(m, sums, &first);
    for (int i = 0; i < 8; ++i) {
        float expect = 0.0f;
        for (int l = 0; l < 8; ++l) expect += m[8 * i + l];
        EXPECT_EQ(sums[i], expect) << i;
    }
    EXPECT_EQ(first, sums[0]);
}

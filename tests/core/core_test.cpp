// Core pieces: fp16/bf16 conversions against a double-precision rounding written here, Philox
// known answers and the dropout keep-bit recipe (spec 2.7a), the generated dropout mask and its
// byte count, and the tensor / int-array / status / data-type API.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "attnops/attnops.h"
#include "core/dtype.hpp"
#include "core/handles.hpp"
#include "core/philox.hpp"

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

float fromBits(uint32_t b) { return std::bit_cast<float>(b); }
uint32_t toBits(float f) { return std::bit_cast<uint32_t>(f); }

// ------------------------------------------------------------------ reference 16-bit formats

// A binary floating format with `mantBits` stored fraction bits, minimum normal exponent `emin`
// and largest finite value `maxFinite`.
struct Format {
    int mantBits;
    int emin;
    int expBits;
    double maxFinite;
};
const Format kF16{10, -14, 5, 65504.0};
const Format kBf16{7, -126, 8, std::ldexp(2.0 - std::ldexp(1.0, -7), 127)};

// Rounds the non-negative value x to the format with round-to-nearest-even, in double (exact: x
// comes from a float, so x / ulp is an integer plus a fraction of at most 30 bits). Values whose
// rounding exceeds the largest finite value overflow to +inf (IEEE 754 with unbounded exponent).
double referenceRound(double x, const Format& f) {
    if (x == 0 || std::isinf(x)) return x;
    int e = 0;
    std::frexp(x, &e);  // x = m * 2^e, m in [0.5, 1): floor(log2 x) = e - 1
    const int exponent = std::max(e - 1, f.emin);
    const double ulp = std::ldexp(1.0, exponent - f.mantBits);
    const double q = x / ulp;
    double whole = std::floor(q);
    const double frac = q - whole;
    if (frac > 0.5 || (frac == 0.5 && std::fmod(whole, 2.0) == 1.0)) whole += 1.0;
    const double r = whole * ulp;
    return r > f.maxFinite ? kInf : r;
}

// Decodes a 16-bit pattern of the format (1 sign, expBits exponent, mantBits fraction) in double.
double referenceDecode(uint16_t h, const Format& f) {
    const bool negative = (h >> 15) != 0;
    const uint32_t expMask = (1u << f.expBits) - 1;
    const uint32_t e = (h >> f.mantBits) & expMask;
    const uint32_t m = h & ((1u << f.mantBits) - 1);
    const int bias = (1 << (f.expBits - 1)) - 1;
    double v;
    if (e == expMask)
        v = m != 0 ? std::numeric_limits<double>::quiet_NaN() : kInf;
    else if (e == 0)
        v = std::ldexp(double(m), 1 - bias - f.mantBits);
    else
        v = std::ldexp(double((1u << f.mantBits) + m), int(e) - bias - f.mantBits);
    return negative ? -v : v;
}

bool isNaN16(uint16_t h, const Format& f) {
    const uint32_t expMask = (1u << f.expBits) - 1;
    return ((h >> f.mantBits) & expMask) == expMask && (h & ((1u << f.mantBits) - 1)) != 0;
}

struct Codec {
    const char* name;
    Format format;
    uint16_t (*encode)(float);
    float (*decode)(uint16_t);
};
const Codec kCodecF16{"fp16", kF16, attnops::floatToF16, attnops::f16ToFloat};
const Codec kCodecBf16{"bf16", kBf16, attnops::floatToBf16, attnops::bf16ToFloat};

// Checks encode(x) against the reference rounding; returns false (with a message) on mismatch.
::testing::AssertionResult encodesLikeReference(const Codec& c, float x) {
    const uint16_t h = c.encode(x);
    if (std::isnan(x)) {
        const uint16_t quietBit = uint16_t(1u << (c.format.mantBits - 1));
        if (isNaN16(h, c.format) && (h & quietBit) != 0) return ::testing::AssertionSuccess();
        return ::testing::AssertionFailure() << c.name << ": NaN 0x" << std::hex << toBits(x) << " encoded as 0x" << h
                                             << " (not a quiet NaN)";
    }
    const double want = referenceRound(std::fabs(double(x)), c.format);
    const double got = referenceDecode(h, c.format);
    const bool signOk = ((h >> 15) != 0) == std::signbit(x);
    if (got == (std::signbit(x) ? -want : want) && signOk) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << c.name << ": x = " << std::hexfloat << x << " (bits 0x" << std::hex << toBits(x)
                                         << ") encoded as 0x" << h << " = " << std::hexfloat << got << ", want "
                                         << (std::signbit(x) ? -want : want);
}

// Every value of the format, the midpoints between neighbours (ties) and the floats next to them,
// both signs, plus `randomCount` random float bit patterns. Stops at the first few failures.
void checkEncoderAgainstReference(const Codec& c, int randomCount) {
    int failures = 0;
    auto check = [&](float x) {
        if (failures >= 10) return;
        for (float v : {x, -x}) {
            auto r = encodesLikeReference(c, v);
            if (!r) {
                ++failures;
                ADD_FAILURE() << r.message();
            }
        }
    };
    const uint16_t expMask = uint16_t(((1u << c.format.expBits) - 1) << c.format.mantBits);
    for (uint32_t h = 0; h < expMask; ++h) {  // non-negative finite values
        const double lo = referenceDecode(uint16_t(h), c.format);
        const double hi = h + 1 < expMask ? referenceDecode(uint16_t(h + 1), c.format)
                                          : std::ldexp(1.0, (1 << (c.format.expBits - 1)));  // the value past max
        const float mid = float((lo + hi) / 2);
        ASSERT_EQ(double(mid), (lo + hi) / 2) << "midpoint must be a float";
        check(float(lo));
        check(mid);
        check(std::nextafter(mid, 0.0f));
        check(std::nextafter(mid, std::numeric_limits<float>::infinity()));
        check(std::nextafter(float(lo), std::numeric_limits<float>::infinity()));
    }
    std::mt19937 rng(12345);
    for (int i = 0; i < randomCount; ++i) check(fromBits(uint32_t(rng())));
    // Random floats concentrated where the format's values are (exponents around its range).
    std::uniform_int_distribution<int> exponent(c.format.emin - c.format.mantBits - 3, c.format.emin < -100 ? 129 : 17);
    for (int i = 0; i < randomCount; ++i) {
        const float m = fromBits(0x3f800000u | (uint32_t(rng()) & 0x7fffffu));  // [1, 2)
        check(std::ldexp(m, exponent(rng)));
    }
    for (float special : {0.0f, std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity()})
        check(special);
    EXPECT_EQ(failures, 0);
}

TEST(Fp16, DecodeAllPatternsExactly) {
    for (uint32_t h = 0; h < 65536; ++h) {
        const float got = attnops::f16ToFloat(uint16_t(h));
        const double want = referenceDecode(uint16_t(h), kF16);
        if (std::isnan(want)) {
            ASSERT_TRUE(std::isnan(got)) << std::hex << h;
        } else {
            ASSERT_EQ(double(got), want) << std::hex << h;
            ASSERT_EQ(std::signbit(got), (h >> 15) != 0) << std::hex << h;
        }
    }
}

TEST(Fp16, RoundTripAllPatterns) {
    for (uint32_t h = 0; h < 65536; ++h) {
        const uint16_t back = attnops::floatToF16(attnops::f16ToFloat(uint16_t(h)));
        if (isNaN16(uint16_t(h), kF16))
            ASSERT_TRUE(isNaN16(back, kF16)) << std::hex << h << " -> " << back;
        else
            ASSERT_EQ(back, h) << std::hex << h;
    }
}

TEST(Fp16, EncodeMatchesReferenceRounding) { checkEncoderAgainstReference(kCodecF16, 1 << 21); }

TEST(Fp16, KnownCases) {
    using attnops::floatToF16;
    EXPECT_EQ(floatToF16(1.0f), 0x3c00);
    EXPECT_EQ(floatToF16(-2.0f), 0xc000);
    // Ties go to the even neighbour.
    EXPECT_EQ(floatToF16(1.0f + 0x1p-11f), 0x3c00);
    EXPECT_EQ(floatToF16(1.0f + 3 * 0x1p-11f), 0x3c02);
    EXPECT_EQ(floatToF16(std::nextafter(1.0f + 0x1p-11f, 2.0f)), 0x3c01);
    // Overflow: 65504 is the largest value; 65520 is the tie with 65536 and rounds to inf.
    EXPECT_EQ(floatToF16(65504.0f), 0x7bff);
    EXPECT_EQ(floatToF16(std::nextafter(65520.0f, 0.0f)), 0x7bff);
    EXPECT_EQ(floatToF16(65520.0f), 0x7c00);
    EXPECT_EQ(floatToF16(-1e10f), 0xfc00);
    EXPECT_EQ(floatToF16(std::numeric_limits<float>::infinity()), 0x7c00);
    // Subnormals: 2^-24 is the smallest; 2^-25 is a tie with 0 (even); 1.5 * 2^-24 ties to 2.
    EXPECT_EQ(floatToF16(0x1p-24f), 0x0001);
    EXPECT_EQ(floatToF16(0x1p-25f), 0x0000);
    EXPECT_EQ(floatToF16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
    EXPECT_EQ(floatToF16(1.5f * 0x1p-24f), 0x0002);
    EXPECT_EQ(floatToF16(2.5f * 0x1p-24f), 0x0002);
    EXPECT_EQ(floatToF16(-0x1p-24f), 0x8001);
    EXPECT_EQ(floatToF16(0x1p-14f - 0x1p-25f), 0x0400);  // tie between the largest subnormal and 2^-14
    EXPECT_EQ(floatToF16(0x1p-14f - 0x1p-24f), 0x03ff);
    EXPECT_EQ(floatToF16(std::numeric_limits<float>::denorm_min()), 0x0000);
    EXPECT_EQ(floatToF16(-0.0f), 0x8000);
    EXPECT_EQ(attnops::f16ToFloat(0x0001), 0x1p-24f);
    EXPECT_EQ(attnops::f16ToFloat(0x03ff), 1023 * 0x1p-24f);
    // NaN stays NaN (quiet), whatever its payload.
    for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xffffffffu, 0x7f802000u, 0xff800001u}) {
        const uint16_t h = floatToF16(fromBits(nan));
        EXPECT_TRUE(isNaN16(h, kF16) && (h & 0x200)) << std::hex << nan << " -> " << h;
    }
}

TEST(Bf16, DecodeAllPatternsExactly) {
    for (uint32_t h = 0; h < 65536; ++h) {
        const float got = attnops::bf16ToFloat(uint16_t(h));
        const double want = referenceDecode(uint16_t(h), kBf16);
        if (std::isnan(want)) {
            ASSERT_TRUE(std::isnan(got)) << std::hex << h;
        } else {
            ASSERT_EQ(double(got), want) << std::hex << h;
            ASSERT_EQ(std::signbit(got), (h >> 15) != 0) << std::hex << h;
        }
    }
}

TEST(Bf16, RoundTripAllPatterns) {
    for (uint32_t h = 0; h < 65536; ++h) {
        const uint16_t back = attnops::floatToBf16(attnops::bf16ToFloat(uint16_t(h)));
        if (isNaN16(uint16_t(h), kBf16))
            ASSERT_TRUE(isNaN16(back, kBf16)) << std::hex << h << " -> " << back;
        else
            ASSERT_EQ(back, h) << std::hex << h;
    }
}

TEST(Bf16, EncodeMatchesReferenceRounding) { checkEncoderAgainstReference(kCodecBf16, 1 << 21); }

TEST(Bf16, KnownCases) {
    using attnops::floatToBf16;
    EXPECT_EQ(floatToBf16(1.0f), 0x3f80);
    EXPECT_EQ(floatToBf16(1.0f + 0x1p-8f), 0x3f80);       // tie to even (down)
    EXPECT_EQ(floatToBf16(1.0f + 3 * 0x1p-8f), 0x3f82);   // tie to even (up)
    EXPECT_EQ(floatToBf16(std::nextafter(1.0f + 0x1p-8f, 2.0f)), 0x3f81);
    EXPECT_EQ(floatToBf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds past the largest bf16
    EXPECT_EQ(floatToBf16(fromBits(0x7f7f7fffu)), 0x7f7f);
    EXPECT_EQ(floatToBf16(fromBits(0x7f7f8000u)), 0x7f80);  // tie with 2^128: even is inf
    EXPECT_EQ(floatToBf16(-std::numeric_limits<float>::infinity()), 0xff80);
    EXPECT_EQ(floatToBf16(fromBits(0x00018000u)), 0x0002);  // subnormal tie, odd -> up
    EXPECT_EQ(floatToBf16(fromBits(0x00008000u)), 0x0000);  // subnormal tie, even -> down
    EXPECT_EQ(floatToBf16(fromBits(0x80010000u)), 0x8001);
    for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xffffffffu, 0x7f810000u, 0xff800001u}) {
        const uint16_t h = floatToBf16(fromBits(nan));
        EXPECT_TRUE(isNaN16(h, kBf16) && (h & 0x40)) << std::hex << nan << " -> " << h;
    }
}

// ------------------------------------------------------------------ Philox and dropout bits

using Block = attnops::PhiloxBlock;

TEST(Philox, KnownAnswers) {
    EXPECT_EQ(attnops::philox4x32_10({0, 0, 0, 0}, {0, 0}), (Block{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
    EXPECT_EQ(attnops::philox4x32_10({~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}),
              (Block{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
    // Random123's third vector (digits of pi).
    EXPECT_EQ(attnops::philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
              (Block{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

// The keep bit of spec 2.7a, written from the spec's words.
bool specKeep(uint64_t seed, uint64_t offset, float keepProb, uint64_t i) {
    const uint64_t group = i / 4;
    const Block counter{uint32_t(group & 0xffffffffu), uint32_t(group >> 32), uint32_t(offset & 0xffffffffu),
                        uint32_t(offset >> 32)};
    const std::array<uint32_t, 2> key{uint32_t(seed & 0xffffffffu), uint32_t(seed >> 32)};
    const uint32_t x = attnops::philox4x32_10(counter, key)[i % 4];
    // float32(float32(x) * 2^-32 + 2^-33): the double sum is exact, so one rounding to float.
    const float u = float(double(float(x)) * 0x1p-32 + 0x1p-33);
    return u < keepProb;
}

struct DropCase {
    uint64_t seed, offset;
    float keepProb;
};
const DropCase kDropCases[] = {
    {0, 0, 0.5f},
    {1, 0, 0.9f},
    {0x0123456789abcdefull, 0xfedcba9876543210ull, 0.3f},
    {uint64_t(-2), 12, 0.75f},
    {42, 1ull << 40, 0.05f},
};

TEST(Dropout, KeepBitsFollowSpecRecipe) {
    for (const DropCase& c : kDropCases) {
        const attnops::DropoutBits bits(c.seed, c.offset, c.keepProb);
        std::vector<uint64_t> indices;
        for (uint64_t i = 0; i < 4096; ++i) indices.push_back(i);
        for (uint64_t i : {uint64_t(1) << 32, (uint64_t(1) << 34) + 3, (uint64_t(1) << 62) + 1, ~uint64_t(0) - 7}) {
            for (uint64_t d = 0; d < 8; ++d) indices.push_back(i + d);
        }
        for (uint64_t i : indices) ASSERT_EQ(bits.keep(i), specKeep(c.seed, c.offset, c.keepProb, i)) << "index " << i;
        // fill() from an unaligned start agrees with keep().
        uint8_t flags[203];
        bits.fill(4097, 203, flags);
        for (int e = 0; e < 203; ++e) ASSERT_EQ(flags[e] != 0, specKeep(c.seed, c.offset, c.keepProb, 4097 + uint64_t(e)));
    }
}

// The kernels' integer keep test (word < keepThreshold) is the spec's float one, at the threshold,
// around it, at the ends and on random words; fill() from every alignment and length, also across
// a carry into the counter's high word, agrees with the spec.
TEST(Dropout, IntegerThresholdIsTheFloatTest) {
    using attnops::DropoutBits;
    std::mt19937_64 rng(7);
    for (float p : {1e-9f, 0x1p-33f, 0.05f, 0.1f, 0.3f, 0.5f, 0.7f, 0.9f, 0.99f, std::nextafter(1.0f, 0.0f), 1.0f, 1.5f,
                    0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN()}) {
        const uint64_t t = DropoutBits::keepThreshold(p);
        ASSERT_LE(t, uint64_t(1) << 32);
        std::vector<uint64_t> xs{0, 1, 0xffffffffu, 0x80000000u};
        for (int64_t d = -3; d <= 3; ++d)
            if (int64_t(t) + d >= 0 && int64_t(t) + d <= 0xffffffffll) xs.push_back(uint64_t(int64_t(t) + d));
        for (int k = 0; k < 20000; ++k) xs.push_back(rng() & 0xffffffffu);
        for (uint64_t x : xs)
            ASSERT_EQ(x < t, DropoutBits::uniform(uint32_t(x)) < p) << "keepProb " << p << " word " << x << " threshold " << t;
    }
    for (const DropCase& c : kDropCases) {
        const DropoutBits bits(c.seed, c.offset, c.keepProb);
        for (uint64_t start : {uint64_t(0), (uint64_t(1) << 34) - 13, ~uint64_t(0) - 70})
            for (uint64_t first = start; first < start + 4; ++first)
                for (int64_t count = 0; count <= 41; ++count) {
                    uint8_t flags[41];
                    bits.fill(first, count, flags);
                    for (int64_t e = 0; e < count; ++e)
                        ASSERT_EQ(flags[e] != 0, specKeep(c.seed, c.offset, c.keepProb, first + uint64_t(e)))
                            << "first " << first << " count " << count << " element " << e;
                }
    }
}

TEST(Dropout, UniformIsStrictlyInsideUnitIntervalOrOne) {
    using attnops::DropoutBits;
    EXPECT_EQ(DropoutBits::uniform(0), 0x1p-33f);
    EXPECT_GT(DropoutBits::uniform(0), 0.0f);
    EXPECT_EQ(DropoutBits::uniform(0xffffffffu), 1.0f);  // float(2^32 - 1) = 2^32
    EXPECT_EQ(DropoutBits::uniform(0x80000000u), 0.5f + 0x1p-33f);
}

// Raw 1-D uint8 tensor over a byte vector.
struct ByteTensor {
    std::vector<uint8_t> bytes;
    attnopsTensor* handle = nullptr;
    explicit ByteTensor(int64_t n, uint8_t fill = 0) : bytes(size_t(n), fill) {
        const int64_t shape[1] = {n};
        EXPECT_EQ(attnopsCreateTensor(bytes.empty() ? nullptr : bytes.data(), ATTNOPS_UINT8, 1, shape, nullptr,
                                      ATTNOPS_HOST_MEMORY, &handle),
                  ATTNOPS_SUCCESS);
    }
    ~ByteTensor() { attnopsDestroyTensor(handle); }
    ByteTensor(const ByteTensor&) = delete;
    ByteTensor& operator=(const ByteTensor&) = delete;
};

struct IntArray {
    attnopsIntArray* handle = nullptr;
    explicit IntArray(const std::vector<int64_t>& v) {
        EXPECT_EQ(attnopsCreateIntArray(v.data(), v.size(), &handle), ATTNOPS_SUCCESS);
    }
    ~IntArray() { attnopsDestroyIntArray(handle); }
    IntArray(const IntArray&) = delete;
    IntArray& operator=(const IntArray&) = delete;
};

uint64_t popcount(const std::vector<uint8_t>& bytes, size_t n) {
    uint64_t c = 0;
    for (size_t i = 0; i < n; ++i) c += uint64_t(std::popcount(bytes[i]));
    return c;
}

// Checks a packed mask of `elements` bits: bit k at byte k/8, bit k%8 equals the spec's keep bit;
// the unused bits of the last byte and every byte after it are 0.
void expectPackedSpecMask(const std::vector<uint8_t>& bytes, int64_t elements, uint64_t seed, uint64_t offset,
                          double keepProb) {
    const int64_t used = (elements + 7) / 8;
    ASSERT_GE(int64_t(bytes.size()), used);
    for (int64_t k = 0; k < elements; ++k) {
        const bool bit = ((bytes[size_t(k / 8)] >> (k % 8)) & 1) != 0;
        ASSERT_EQ(bit, specKeep(seed, offset, float(keepProb), uint64_t(k))) << "element " << k;
    }
    if (elements % 8 != 0) {
        EXPECT_EQ(bytes[size_t(used - 1)] >> (elements % 8), 0) << "unused bits of the last byte";
    }
    for (size_t i = size_t(used); i < bytes.size(); ++i) ASSERT_EQ(bytes[i], 0) << "byte " << i << " after the mask";
}

TEST(DropMask, FixedGeometryPacksSpecBitsLsbFirst) {
    const int64_t b = 2, n = 3, s1 = 5, s2 = 7;  // 210 bits: 26 full bytes and 2 bits
    uint64_t bytes = 0;
    ASSERT_EQ(attnopsFlashAttentionDropMaskBytes(b, n, s1, s2, nullptr, nullptr, &bytes), ATTNOPS_SUCCESS);
    EXPECT_EQ(bytes, 27u);
    for (const DropCase& c : kDropCases) {
        ByteTensor out(int64_t(bytes) + 5, 0xab);  // larger than needed: the rest is zeroed
        ASSERT_EQ(attnopsFlashAttentionGenDropMask(b, n, s1, s2, nullptr, nullptr, c.keepProb, int64_t(c.seed),
                                                   int64_t(c.offset), out.handle),
                  ATTNOPS_SUCCESS)
            << attnopsGetLastErrorMessage();
        expectPackedSpecMask(out.bytes, b * n * s1 * s2, c.seed, c.offset, c.keepProb);
    }
}

TEST(DropMask, TndGeometryPacksSpecBitsLsbFirst) {
    // Sequence lengths q 3,0,5,1,2 and kv 4,2,0,7,3, then a "not computed" trailing entry.
    IntArray q({3, 3, 8, 9, 11, 0}), kv({4, 6, 6, 13, 16, 0});
    const int64_t n = 3, elements = n * (3 * 4 + 0 * 2 + 5 * 0 + 1 * 7 + 2 * 3);  // 75
    uint64_t bytes = 0;
    ASSERT_EQ(attnopsFlashAttentionDropMaskBytes(0, n, 0, 0, q.handle, kv.handle, &bytes), ATTNOPS_SUCCESS)
        << attnopsGetLastErrorMessage();
    EXPECT_EQ(bytes, uint64_t((elements + 7) / 8));
    for (const DropCase& c : kDropCases) {
        ByteTensor out(int64_t(bytes), 0xff);
        ASSERT_EQ(attnopsFlashAttentionGenDropMask(0, n, 0, 0, q.handle, kv.handle, c.keepProb, int64_t(c.seed),
                                                   int64_t(c.offset), out.handle),
                  ATTNOPS_SUCCESS)
            << attnopsGetLastErrorMessage();
        expectPackedSpecMask(out.bytes, elements, c.seed, c.offset, c.keepProb);
    }
}

TEST(DropMask, KeptFractionWithinFourSigma) {
    const int64_t s = 1000;  // 1e6 elements
    const double n = double(s * s);
    for (double keepProb : {0.1, 0.5, 0.9}) {
        for (int64_t seed : {int64_t(7), int64_t(0x100000007)}) {
            ByteTensor out(s * s / 8);
            ASSERT_EQ(attnopsFlashAttentionGenDropMask(1, 1, s, s, nullptr, nullptr, keepProb, seed, 3, out.handle),
                      ATTNOPS_SUCCESS);
            const double kept = double(popcount(out.bytes, out.bytes.size()));
            const double sigma = std::sqrt(n * keepProb * (1 - keepProb));
            EXPECT_LE(std::fabs(kept - n * keepProb), 4 * sigma) << "keepProb " << keepProb << " seed " << seed;
        }
    }
}

TEST(DropMask, SeedHighWordAndOffsetChangeTheBits) {
    const int64_t s = 1000;
    const double keepProb = 0.5;
    auto gen = [&](int64_t seed, int64_t offset) {
        ByteTensor out(s * s / 8);
        EXPECT_EQ(attnopsFlashAttentionGenDropMask(1, 1, s, s, nullptr, nullptr, keepProb, seed, offset, out.handle),
                  ATTNOPS_SUCCESS);
        return out.bytes;
    };
    const auto base = gen(5, 0);
    EXPECT_EQ(base, gen(5, 0)) << "same (seed, offset): same mask";
    // Independent masks agree on about half of the bits.
    for (const auto& other : {gen(5 + (int64_t(1) << 32), 0), gen(5, 1), gen(5, int64_t(1) << 32), gen(6, 0)}) {
        uint64_t agree = 0;
        for (size_t i = 0; i < base.size(); ++i) agree += uint64_t(std::popcount(uint8_t(~(base[i] ^ other[i]))));
        const double n = double(s * s);
        EXPECT_LE(std::fabs(double(agree) - n / 2), 4 * std::sqrt(n / 4));
    }
}

TEST(DropMask, KeepProbOneKeepsEverything) {
    // Found by search: for seed 0 and offset 10475606, word 3 of counter 0 is 0xffffff90, whose
    // uniform rounds to exactly 1.0f; keepProb = 1 means no dropout, so the bit must still be 1.
    ASSERT_GE(attnops::DropoutBits(0, 10475606, 1.0f).words(0)[3], 0xffffff80u);
    ASSERT_EQ(attnops::DropoutBits::uniform(attnops::DropoutBits(0, 10475606, 1.0f).words(0)[3]), 1.0f);
    ByteTensor out(1);
    ASSERT_EQ(attnopsFlashAttentionGenDropMask(1, 1, 1, 4, nullptr, nullptr, 1.0, 0, 10475606, out.handle), ATTNOPS_SUCCESS);
    EXPECT_EQ(out.bytes[0], 0x0f);
}

TEST(DropMask, ByteCounts) {
    uint64_t bytes = 0;
    ASSERT_EQ(attnopsFlashAttentionDropMaskBytes(1, 1, 1, 1, nullptr, nullptr, &bytes), ATTNOPS_SUCCESS);
    EXPECT_EQ(bytes, 1u);
    ASSERT_EQ(attnopsFlashAttentionDropMaskBytes(2, 4, 16, 16, nullptr, nullptr, &bytes), ATTNOPS_SUCCESS);
    EXPECT_EQ(bytes, 256u);
    ASSERT_EQ(attnopsFlashAttentionDropMaskBytes(3, 5, 7, 9, nullptr, nullptr, &bytes), ATTNOPS_SUCCESS);
    EXPECT_EQ(bytes, uint64_t((3 * 5 * 7 * 9 + 7) / 8));
    ASSERT_EQ(attnopsFlashAttentionDropMaskBytes(0, 4, 16, 16, nullptr, nullptr, &bytes), ATTNOPS_SUCCESS);
    EXPECT_EQ(bytes, 0u);
    ASSERT_EQ(attnopsFlashAttentionDropMaskBytes(2, 4, 0, 16, nullptr, nullptr, &bytes), ATTNOPS_SUCCESS);
    EXPECT_EQ(bytes, 0u);
    // 64-bit sizes: 2^40 sequences of one score each (the count is arithmetic, nothing per sequence).
    ASSERT_EQ(attnopsFlashAttentionDropMaskBytes(int64_t(1) << 40, 1, 1, 1, nullptr, nullptr, &bytes), ATTNOPS_SUCCESS)
        << attnopsGetLastErrorMessage();
    EXPECT_EQ(bytes, uint64_t(1) << 37);
    ASSERT_EQ(attnopsFlashAttentionDropMaskBytes(8, 64, 1 << 20, 1 << 20, nullptr, nullptr, &bytes), ATTNOPS_SUCCESS);
    EXPECT_EQ(bytes, uint64_t(8) * 64 * (uint64_t(1) << 40) / 8);
    // TND: N1 * sum Sq_i * Skv_i, zero-length sequences and trailing zeros included.
    {
        IntArray q({2, 2, 5, 0, 0}), kv({3, 4, 4, 0, 0});
        ASSERT_EQ(attnopsFlashAttentionDropMaskBytes(0, 2, 0, 0, q.handle, kv.handle, &bytes), ATTNOPS_SUCCESS);
        EXPECT_EQ(bytes, uint64_t((2 * (2 * 3 + 0 * 1 + 3 * 0) + 7) / 8));
    }
    {
        IntArray empty({});
        ASSERT_EQ(attnopsFlashAttentionDropMaskBytes(0, 2, 0, 0, empty.handle, empty.handle, &bytes), ATTNOPS_SUCCESS);
        EXPECT_EQ(bytes, 0u);
    }
}

TEST(DropMask, BadArguments) {
    uint64_t bytes = 0;
    EXPECT_EQ(attnopsFlashAttentionDropMaskBytes(1, 1, 1, 1, nullptr, nullptr, nullptr), ATTNOPS_ERROR_NULL_ARGUMENT);
    EXPECT_EQ(attnopsFlashAttentionDropMaskBytes(1, 0, 1, 1, nullptr, nullptr, &bytes), ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(attnopsGetLastErrorMessage()).find("headNum"), std::string::npos);
    EXPECT_EQ(attnopsFlashAttentionDropMaskBytes(-1, 1, 1, 1, nullptr, nullptr, &bytes), ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(attnopsFlashAttentionDropMaskBytes(1, 1, -1, 1, nullptr, nullptr, &bytes), ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(attnopsFlashAttentionDropMaskBytes(1, 1, 1, -1, nullptr, nullptr, &bytes), ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(attnopsFlashAttentionDropMaskBytes(int64_t(1) << 40, 1 << 20, 1 << 20, 1 << 20, nullptr, nullptr, &bytes),
              ATTNOPS_SUCCESS)
        << "element count overflows int64";
    IntArray q({2, 4}), kv({3, 5}), kvShort({3}), decreasing({4, 2}), negative({-1, 2});
    EXPECT_EQ(attnopsFlashAttentionDropMaskBytes(0, 1, 0, 0, q.handle, nullptr, &bytes), ATTNOPS_ERROR_NULL_ARGUMENT);
    EXPECT_EQ(attnopsFlashAttentionDropMaskBytes(0, 1, 0, 0, nullptr, kv.handle, &bytes), ATTNOPS_ERROR_NULL_ARGUMENT);
    EXPECT_EQ(attnopsFlashAttentionDropMaskBytes(2, 1, 0, 0, q.handle, kv.handle, &bytes), ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(attnopsFlashAttentionDropMaskBytes(0, 1, 0, 0, q.handle, kvShort.handle, &bytes), ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(attnopsFlashAttentionDropMaskBytes(0, 1, 0, 0, decreasing.handle, kv.handle, &bytes), ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(attnopsFlashAttentionDropMaskBytes(0, 1, 0, 0, negative.handle, kv.handle, &bytes), ATTNOPS_ERROR_INVALID_ARGUMENT);
    // A stale int-array handle is an error, not a crash.
    attnopsIntArray* stale = nullptr;
    const int64_t v[1] = {1};
    ASSERT_EQ(attnopsCreateIntArray(v, 1, &stale), ATTNOPS_SUCCESS);
    ASSERT_EQ(attnopsDestroyIntArray(stale), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsFlashAttentionDropMaskBytes(0, 1, 0, 0, stale, stale, &bytes), ATTNOPS_ERROR_INVALID_ARGUMENT);

    // GenDropMask: the output tensor and keepProb.
    ByteTensor small(3, 0x5a);
    EXPECT_EQ(attnopsFlashAttentionGenDropMask(1, 1, 5, 5, nullptr, nullptr, 0.5, 0, 0, small.handle),
              ATTNOPS_ERROR_INVALID_ARGUMENT);  // 25 bits need 4 bytes
    EXPECT_EQ(small.bytes, std::vector<uint8_t>(3, 0x5a)) << "nothing written on failure";
    ByteTensor ok(4);
    EXPECT_EQ(attnopsFlashAttentionGenDropMask(1, 1, 5, 5, nullptr, nullptr, 0.5, 0, 0, nullptr), ATTNOPS_ERROR_NULL_ARGUMENT);
    for (double bad : {0.0, -0.5, 1.5, std::nan("")})
        EXPECT_EQ(attnopsFlashAttentionGenDropMask(1, 1, 5, 5, nullptr, nullptr, bad, 0, 0, ok.handle),
                  ATTNOPS_ERROR_INVALID_ARGUMENT)
            << bad;
    std::vector<float> floats(4);
    const int64_t four[1] = {4}, twoByTwo[2] = {2, 2}, strided[1] = {2};
    attnopsTensor* t = nullptr;
    ASSERT_EQ(attnopsCreateTensor(floats.data(), ATTNOPS_FLOAT32, 1, four, nullptr, ATTNOPS_HOST_MEMORY, &t), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsFlashAttentionGenDropMask(1, 1, 5, 5, nullptr, nullptr, 0.5, 0, 0, t), ATTNOPS_ERROR_INVALID_ARGUMENT);
    attnopsDestroyTensor(t);
    std::vector<uint8_t> raw(16);
    ASSERT_EQ(attnopsCreateTensor(raw.data(), ATTNOPS_UINT8, 2, twoByTwo, nullptr, ATTNOPS_HOST_MEMORY, &t), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsFlashAttentionGenDropMask(1, 1, 5, 5, nullptr, nullptr, 0.5, 0, 0, t), ATTNOPS_ERROR_INVALID_ARGUMENT);
    attnopsDestroyTensor(t);
    ASSERT_EQ(attnopsCreateTensor(raw.data(), ATTNOPS_UINT8, 1, four, strided, ATTNOPS_HOST_MEMORY, &t), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsFlashAttentionGenDropMask(1, 1, 5, 5, nullptr, nullptr, 0.5, 0, 0, t), ATTNOPS_ERROR_INVALID_ARGUMENT);
    attnopsDestroyTensor(t);
    // A destroyed tensor handle is an error, not a crash.
    EXPECT_EQ(attnopsFlashAttentionGenDropMask(1, 1, 5, 5, nullptr, nullptr, 0.5, 0, 0, t), ATTNOPS_ERROR_INVALID_ARGUMENT);
}

// ------------------------------------------------------------------ tensors, arrays, names

TEST(Tensor, ShapeAndStridesAreCopied) {
    std::vector<float> data(2 * 3 * 4);
    int64_t shape[3] = {2, 3, 4};
    int64_t strides[3] = {1, 2, 6};  // a transposed view
    attnopsTensor* t = nullptr;
    ASSERT_EQ(attnopsCreateTensor(data.data(), ATTNOPS_FLOAT32, 3, shape, strides, ATTNOPS_HOST_MEMORY, &t), ATTNOPS_SUCCESS);
    shape[0] = 99;
    strides[0] = 99;
    EXPECT_EQ(t->rank, 3);
    EXPECT_EQ(t->data, data.data());
    EXPECT_EQ(t->dtype, attnops::DType::F32);
    EXPECT_EQ(t->device, ATTNOPS_HOST_MEMORY);
    EXPECT_EQ((std::vector<int64_t>(t->shape.begin(), t->shape.begin() + 3)), (std::vector<int64_t>{2, 3, 4}));
    EXPECT_EQ((std::vector<int64_t>(t->strides.begin(), t->strides.begin() + 3)), (std::vector<int64_t>{1, 2, 6}));
    EXPECT_FALSE(t->isContiguous());
    EXPECT_EQ(t->numel(), 24);
    EXPECT_EQ(attnopsDestroyTensor(t), ATTNOPS_SUCCESS);
}

TEST(Tensor, DefaultStridesAreContiguousRowMajor) {
    std::vector<uint16_t> data(2 * 3 * 4 * 5);
    const int64_t shape[4] = {2, 3, 4, 5};
    attnopsTensor* t = nullptr;
    ASSERT_EQ(attnopsCreateTensor(data.data(), ATTNOPS_BFLOAT16, 4, shape, nullptr, 0, &t), ATTNOPS_SUCCESS);
    EXPECT_EQ((std::vector<int64_t>(t->strides.begin(), t->strides.begin() + 4)), (std::vector<int64_t>{60, 20, 5, 1}));
    EXPECT_TRUE(t->isContiguous());
    EXPECT_EQ(t->dtype, attnops::DType::BF16);
    EXPECT_EQ(t->device, 0);
    attnopsDestroyTensor(t);
    // Empty tensors may have NULL data; their strides are still well defined.
    const int64_t empty[3] = {2, 0, 3};
    ASSERT_EQ(attnopsCreateTensor(nullptr, ATTNOPS_FLOAT16, 3, empty, nullptr, ATTNOPS_HOST_MEMORY, &t), ATTNOPS_SUCCESS);
    EXPECT_EQ(t->numel(), 0);
    EXPECT_EQ(t->strides[2], 1);
    EXPECT_EQ(t->strides[1], 3);
    attnopsDestroyTensor(t);
    // Rank 0: one element.
    float scalar = 1.0f;
    ASSERT_EQ(attnopsCreateTensor(&scalar, ATTNOPS_FLOAT32, 0, nullptr, nullptr, ATTNOPS_HOST_MEMORY, &t), ATTNOPS_SUCCESS);
    EXPECT_EQ(t->rank, 0);
    EXPECT_EQ(t->numel(), 1);
    attnopsDestroyTensor(t);
    // The largest rank.
    std::vector<float> eight(256);
    const int64_t shape8[8] = {2, 2, 2, 2, 2, 2, 2, 2};
    ASSERT_EQ(attnopsCreateTensor(eight.data(), ATTNOPS_FLOAT32, 8, shape8, nullptr, ATTNOPS_HOST_MEMORY, &t), ATTNOPS_SUCCESS);
    EXPECT_EQ(t->strides[0], 128);
    EXPECT_EQ(t->strides[7], 1);
    attnopsDestroyTensor(t);
}

TEST(Tensor, BadArguments) {
    float data[8] = {};
    const int64_t shape[2] = {2, 4};
    attnopsTensor* t = reinterpret_cast<attnopsTensor*>(&data[0]);
    EXPECT_EQ(attnopsCreateTensor(data, ATTNOPS_FLOAT32, 2, shape, nullptr, ATTNOPS_HOST_MEMORY, nullptr),
              ATTNOPS_ERROR_NULL_ARGUMENT);
    EXPECT_EQ(attnopsCreateTensor(data, ATTNOPS_FLOAT32, 9, shape, nullptr, ATTNOPS_HOST_MEMORY, &t),
              ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(t, nullptr) << "the output is cleared on failure";
    const std::string message = attnopsGetLastErrorMessage();
    EXPECT_NE(message.find("rank"), std::string::npos) << message;
    EXPECT_NE(message.find('9'), std::string::npos) << message;
    EXPECT_EQ(attnopsCreateTensor(data, ATTNOPS_FLOAT32, -1, shape, nullptr, ATTNOPS_HOST_MEMORY, &t),
              ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(attnopsCreateTensor(data, ATTNOPS_FLOAT32, 2, nullptr, nullptr, ATTNOPS_HOST_MEMORY, &t),
              ATTNOPS_ERROR_NULL_ARGUMENT);
    EXPECT_EQ(attnopsCreateTensor(data, attnopsDataType(5), 2, shape, nullptr, ATTNOPS_HOST_MEMORY, &t),
              ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(attnopsCreateTensor(data, ATTNOPS_FLOAT32, 2, shape, nullptr, -2, &t), ATTNOPS_ERROR_INVALID_ARGUMENT);
    const int64_t negative[2] = {2, -4};
    EXPECT_EQ(attnopsCreateTensor(data, ATTNOPS_FLOAT32, 2, negative, nullptr, ATTNOPS_HOST_MEMORY, &t),
              ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(attnopsGetLastErrorMessage()).find("shape[1]"), std::string::npos);
    const int64_t negativeStride[2] = {4, -1};
    EXPECT_EQ(attnopsCreateTensor(data, ATTNOPS_FLOAT32, 2, shape, negativeStride, ATTNOPS_HOST_MEMORY, &t),
              ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(attnopsCreateTensor(nullptr, ATTNOPS_FLOAT32, 2, shape, nullptr, ATTNOPS_HOST_MEMORY, &t),
              ATTNOPS_ERROR_NULL_ARGUMENT);
    const int64_t huge[3] = {int64_t(1) << 40, int64_t(1) << 40, 1 << 20};
    EXPECT_EQ(attnopsCreateTensor(data, ATTNOPS_FLOAT32, 3, huge, nullptr, ATTNOPS_HOST_MEMORY, &t),
              ATTNOPS_ERROR_INVALID_ARGUMENT);
    const int64_t fourByTwo[2] = {4, 2}, hugeStride[2] = {int64_t(1) << 62, 1};  // last offset 3 * 2^62 + 1
    EXPECT_EQ(attnopsCreateTensor(data, ATTNOPS_FLOAT32, 2, fourByTwo, hugeStride, ATTNOPS_HOST_MEMORY, &t),
              ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(t, nullptr);

    // Destroy: NULL is fine, a second destroy or a foreign pointer is an error.
    EXPECT_EQ(attnopsDestroyTensor(nullptr), ATTNOPS_SUCCESS);
    ASSERT_EQ(attnopsCreateTensor(data, ATTNOPS_FLOAT32, 2, shape, nullptr, ATTNOPS_HOST_MEMORY, &t), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsDestroyTensor(t), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsDestroyTensor(t), ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(attnopsDestroyTensor(reinterpret_cast<attnopsTensor*>(&data[0])), ATTNOPS_ERROR_INVALID_ARGUMENT);
}

TEST(Tensor, LastErrorMessageIsPerThread) {
    attnopsTensor* t = nullptr;
    const int64_t shape[1] = {-3};
    ASSERT_EQ(attnopsCreateTensor(nullptr, ATTNOPS_FLOAT32, 1, shape, nullptr, ATTNOPS_HOST_MEMORY, &t),
              ATTNOPS_ERROR_INVALID_ARGUMENT);
    const std::string mine = attnopsGetLastErrorMessage();
    EXPECT_NE(mine.find("-3"), std::string::npos) << mine;
    std::string other, otherAfter;
    std::thread worker([&] {
        other = attnopsGetLastErrorMessage();
        attnopsCreateTensor(nullptr, ATTNOPS_FLOAT32, 12, shape, nullptr, ATTNOPS_HOST_MEMORY, &t);
        otherAfter = attnopsGetLastErrorMessage();
    });
    worker.join();
    EXPECT_EQ(other, "") << "a fresh thread has no error message";
    EXPECT_NE(otherAfter.find("rank"), std::string::npos) << otherAfter;
    EXPECT_EQ(std::string(attnopsGetLastErrorMessage()), mine) << "another thread's failure leaves this one's message";
}

TEST(IntArray, ValuesAreCopied) {
    std::vector<int64_t> v{5, -1, int64_t(1) << 60};
    attnopsIntArray* a = nullptr;
    ASSERT_EQ(attnopsCreateIntArray(v.data(), v.size(), &a), ATTNOPS_SUCCESS);
    v[0] = 7;
    v.clear();
    v.shrink_to_fit();
    EXPECT_EQ(a->values, (std::vector<int64_t>{5, -1, int64_t(1) << 60}));
    EXPECT_EQ(attnopsDestroyIntArray(a), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsDestroyIntArray(a), ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(attnopsDestroyIntArray(nullptr), ATTNOPS_SUCCESS);
    ASSERT_EQ(attnopsCreateIntArray(nullptr, 0, &a), ATTNOPS_SUCCESS);
    EXPECT_TRUE(a->values.empty());
    EXPECT_EQ(attnopsDestroyIntArray(a), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsCreateIntArray(nullptr, 2, &a), ATTNOPS_ERROR_NULL_ARGUMENT);
    EXPECT_EQ(a, nullptr);
    const int64_t one = 1;
    EXPECT_EQ(attnopsCreateIntArray(&one, 1, nullptr), ATTNOPS_ERROR_NULL_ARGUMENT);
}

TEST(Names, StatusNames) {
    const std::pair<attnopsStatus, const char*> names[] = {
        {ATTNOPS_SUCCESS, "ATTNOPS_SUCCESS"},
        {ATTNOPS_ERROR_NULL_ARGUMENT, "ATTNOPS_ERROR_NULL_ARGUMENT"},
        {ATTNOPS_ERROR_INVALID_ARGUMENT, "ATTNOPS_ERROR_INVALID_ARGUMENT"},
        {ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION, "ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION"},
        {ATTNOPS_ERROR_UNSUPPORTED_HARDWARE, "ATTNOPS_ERROR_UNSUPPORTED_HARDWARE"},
        {ATTNOPS_ERROR_RUNTIME, "ATTNOPS_ERROR_RUNTIME"},
        {ATTNOPS_ERROR_OUT_OF_MEMORY, "ATTNOPS_ERROR_OUT_OF_MEMORY"},
        {ATTNOPS_ERROR_INTERNAL, "ATTNOPS_ERROR_INTERNAL"},
    };
    for (const auto& [status, name] : names) EXPECT_STREQ(attnopsStatusName(status), name);
    // Values follow the aclnn return codes.
    EXPECT_EQ(int(ATTNOPS_ERROR_NULL_ARGUMENT), 161001);
    EXPECT_EQ(int(ATTNOPS_ERROR_INVALID_ARGUMENT), 161002);
    EXPECT_EQ(int(ATTNOPS_ERROR_RUNTIME), 361001);
    EXPECT_EQ(int(ATTNOPS_ERROR_INTERNAL), 561000);
    ASSERT_NE(attnopsStatusName(attnopsStatus(12345)), nullptr);
    EXPECT_STREQ(attnopsStatusName(attnopsStatus(12345)), "ATTNOPS_UNKNOWN_STATUS");
}

TEST(Names, DataTypes) {
    struct Row {
        attnopsDataType dtype;
        uint64_t size;
        const char* name;
    };
    const Row rows[] = {
        {ATTNOPS_FLOAT32, 4, "fp32"}, {ATTNOPS_FLOAT16, 2, "fp16"},   {ATTNOPS_INT8, 1, "int8"},
        {ATTNOPS_INT32, 4, "int32"},  {ATTNOPS_UINT8, 1, "uint8"},    {ATTNOPS_INT16, 2, "int16"},
        {ATTNOPS_UINT16, 2, "uint16"}, {ATTNOPS_UINT32, 4, "uint32"}, {ATTNOPS_INT64, 8, "int64"},
        {ATTNOPS_UINT64, 8, "uint64"}, {ATTNOPS_FLOAT64, 8, "fp64"},  {ATTNOPS_BOOL, 1, "bool"},
        {ATTNOPS_BFLOAT16, 2, "bf16"},
    };
    for (const Row& r : rows) {
        EXPECT_EQ(attnopsDataTypeSize(r.dtype), r.size) << r.name;
        EXPECT_STREQ(attnopsDataTypeName(r.dtype), r.name);
    }
    // aclDataType values.
    EXPECT_EQ(int(ATTNOPS_BFLOAT16), 27);
    EXPECT_EQ(int(ATTNOPS_BOOL), 12);
    for (int unknown : {5, 13, 26, 28, -1, 1000}) {
        EXPECT_EQ(attnopsDataTypeSize(attnopsDataType(unknown)), 0u) << unknown;
        EXPECT_STREQ(attnopsDataTypeName(attnopsDataType(unknown)), "unknown") << unknown;
    }
}

}  // namespace

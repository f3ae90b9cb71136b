// The AVX2 + FMA + F16C trait that instantiates the generic building blocks of
// cpu/simd/microkernels.hpp with 8-lane ymm vectors. AVX2 has no mask registers: a mask is a
// vector of all-ones / all-zeros 32-bit lanes, tails go through vmaskmovps (masked-off lanes
// neither fault nor store), and the 16-bit fp16 tail through a zero-padded copy. Only the files
// in src/cpu/avx2 include this header; their entries run only behind the avx2/fma/f16c probe.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/philox.hpp"

#define ATTNOPS_AVX2_FN __attribute__((target("avx2,fma,f16c")))
#define ATTNOPS_AVX2_INLINE static inline __attribute__((always_inline)) ATTNOPS_AVX2_FN
#define ATTNOPS_SIMD_FN ATTNOPS_AVX2_FN

namespace attnops::cpu {

struct Avx2 {
    using Vec = __m256;
    using IVec = __m256i;
    using Mask = __m256i;  // lane l set: all 32 bits of lane l are ones
    static constexpr int64_t kLanes = 8;
    // 16 ymm registers: 6 x 2 accumulators + 2 B vectors + 1 broadcast A element.
    static constexpr int kTileRows = 6;
    static constexpr int kTileVectors = 2;
    // Query rows per work unit: whole register tiles (6 rows) and softmax vectors (8 rows), and
    // enough rows that converting a key/value block (done once per block and unit) is a small
    // share of the unit's work.
    static constexpr int64_t kQueryRows = 120;

    ATTNOPS_AVX2_INLINE IVec laneIndex() { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }
    // Lanes [0, n); n may be <= 0 (none) or >= kLanes (all).
    ATTNOPS_AVX2_INLINE Mask tail(int64_t n) {
        return _mm256_cmpgt_epi32(_mm256_set1_epi32(int32_t(std::clamp<int64_t>(n, 0, kLanes))), laneIndex());
    }
    ATTNOPS_AVX2_INLINE Mask all() { return _mm256_set1_epi32(-1); }
    ATTNOPS_AVX2_INLINE Mask none() { return _mm256_setzero_si256(); }
    ATTNOPS_AVX2_INLINE Mask maskAnd(Mask a, Mask b) { return _mm256_and_si256(a, b); }
    ATTNOPS_AVX2_INLINE Mask maskOr(Mask a, Mask b) { return _mm256_or_si256(a, b); }
    ATTNOPS_AVX2_INLINE bool any(Mask m) { return !_mm256_testz_si256(m, m); }

    ATTNOPS_AVX2_INLINE Vec zero() { return _mm256_setzero_ps(); }
    ATTNOPS_AVX2_INLINE Vec set1(float x) { return _mm256_set1_ps(x); }
    ATTNOPS_AVX2_INLINE Vec load(const float* p) { return _mm256_loadu_ps(p); }
    ATTNOPS_AVX2_INLINE Vec loadMasked(Mask m, const float* p) { return _mm256_maskload_ps(p, m); }
    ATTNOPS_AVX2_INLINE void store(float* p, Vec x) { _mm256_storeu_ps(p, x); }
    ATTNOPS_AVX2_INLINE void storeMasked(float* p, Mask m, Vec x) { _mm256_maskstore_ps(p, m, x); }

    ATTNOPS_AVX2_INLINE Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
    ATTNOPS_AVX2_INLINE Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
    ATTNOPS_AVX2_INLINE Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
    ATTNOPS_AVX2_INLINE Vec div(Vec a, Vec b) { return _mm256_div_ps(a, b); }
    ATTNOPS_AVX2_INLINE Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
    ATTNOPS_AVX2_INLINE Vec min(Vec a, Vec b) { return _mm256_min_ps(a, b); }
    ATTNOPS_AVX2_INLINE Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }    // a * b + c
    ATTNOPS_AVX2_INLINE Vec fnmadd(Vec a, Vec b, Vec c) { return _mm256_fnmadd_ps(a, b, c); }  // c - a * b

    ATTNOPS_AVX2_INLINE Mask isNan(Vec a) { return _mm256_castps_si256(_mm256_cmp_ps(a, a, _CMP_UNORD_Q)); }
    ATTNOPS_AVX2_INLINE Mask greater(Vec a, Vec b) { return _mm256_castps_si256(_mm256_cmp_ps(a, b, _CMP_GT_OQ)); }
    ATTNOPS_AVX2_INLINE Mask notEqual(Vec a, Vec b) { return _mm256_castps_si256(_mm256_cmp_ps(a, b, _CMP_NEQ_UQ)); }
    ATTNOPS_AVX2_INLINE Vec select(Mask m, Vec ifClear, Vec ifSet) {
        return _mm256_blendv_ps(ifClear, ifSet, _mm256_castsi256_ps(m));
    }
    ATTNOPS_AVX2_INLINE Vec zeroUnless(Mask m, Vec x) { return _mm256_and_ps(_mm256_castsi256_ps(m), x); }

    ATTNOPS_AVX2_INLINE Vec roundNearest(Vec x) {
        return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    // x * 2^n for integral n in [-126, 127] (the range exp() produces), like cpu::fastExp: the
    // power of two is built in the exponent field.
    ATTNOPS_AVX2_INLINE Vec ldexp(Vec x, Vec n) {
        const IVec bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
        return _mm256_mul_ps(x, _mm256_castsi256_ps(bits));
    }

    // 2^n for t = n + 1.5 * 2^23 (n integral in [-126, 127]): n sits in the low mantissa bits of
    // t, and shifting the biased exponent n + 127 into place drops t's own exponent bits. With
    // t = x + 1.5 * 2^23 rounded (|x| < 2^22), n is x rounded to nearest even, as roundNearest
    // gives, without the round and convert instructions.
    ATTNOPS_AVX2_INLINE Vec pow2OfShifted(Vec t) {
        const __m256i biased = _mm256_add_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(127));
        return _mm256_castsi256_ps(_mm256_slli_epi32(biased, 23));
    }

    ATTNOPS_AVX2_INLINE IVec set1i(int32_t x) { return _mm256_set1_epi32(x); }
    ATTNOPS_AVX2_INLINE IVec addi(IVec a, IVec b) { return _mm256_add_epi32(a, b); }
    ATTNOPS_AVX2_INLINE IVec subi(IVec a, IVec b) { return _mm256_sub_epi32(a, b); }
    // Lanes with lo <= x <= hi: neither lo > x nor x > hi.
    ATTNOPS_AVX2_INLINE Mask inRange(IVec x, IVec lo, IVec hi) {
        return _mm256_andnot_si256(_mm256_or_si256(_mm256_cmpgt_epi32(lo, x), _mm256_cmpgt_epi32(x, hi)), all());
    }

    // kLanes stored elements as fp32: bf16 (a shift), fp16 (vcvtph2ps), int8 (exact).
    ATTNOPS_AVX2_INLINE Vec loadBf16(const uint16_t* p) {
        const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
    }
    ATTNOPS_AVX2_INLINE Vec loadHalf(const uint16_t* p) {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    }
    ATTNOPS_AVX2_INLINE Vec loadInt8(const int8_t* p) {
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
    }
    // kLanes packed int4 (4 bytes, two per byte, low nibble first, two's complement) as fp32,
    // exact: the word goes to every lane, lane i shifts its nibble to the top, an arithmetic
    // shift brings it back sign-extended.
    ATTNOPS_AVX2_INLINE Vec loadInt4(const uint8_t* p) {
        int32_t word;
        std::memcpy(&word, p, sizeof word);
        const __m256i top = _mm256_sllv_epi32(_mm256_set1_epi32(word), _mm256_setr_epi32(28, 24, 20, 16, 12, 8, 4, 0));
        return _mm256_cvtepi32_ps(_mm256_srai_epi32(top, 28));
    }
    // x rounded to the nearest bf16 / fp16 (ties to even), as fp32: the precision model's
    // rounding of probabilities (cpu roundTo); inputs are finite and non-negative or NaN.
    ATTNOPS_AVX2_INLINE Vec roundBf16(Vec x) {
        const __m256i bits = _mm256_castps_si256(x);
        const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
        const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF)));
        return _mm256_castsi256_ps(_mm256_and_si256(rounded, _mm256_set1_epi32(int32_t(0xFFFF0000u))));
    }
    ATTNOPS_AVX2_INLINE Vec roundHalf(Vec x) {
        return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    // out[i] = the sum of the lanes of x[i], i < 8: a fixed pairwise tree (hadd, then the halves).
    ATTNOPS_AVX2_INLINE void sum8(const Vec* x, float* out) {
        const Vec a = _mm256_hadd_ps(_mm256_hadd_ps(x[0], x[1]), _mm256_hadd_ps(x[2], x[3]));
        const Vec b = _mm256_hadd_ps(_mm256_hadd_ps(x[4], x[5]), _mm256_hadd_ps(x[6], x[7]));
        _mm256_storeu_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31)));
    }
    // The sum of the lanes (fixed order).
    ATTNOPS_AVX2_INLINE float sumLanes(Vec x) {
        const __m128 h = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
        const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
        return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
    }

    // dst[c] = fp16 src[c] as fp32, c < n (vcvtph2ps; the tail from a zero-padded copy).
    ATTNOPS_AVX2_INLINE void widenHalves(const uint16_t* src, int64_t n, float* __restrict dst) {
        int64_t c = 0;
        for (; c + kLanes <= n; c += kLanes)
            _mm256_storeu_ps(dst + c, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + c))));
        if (c == n) return;
        alignas(16) uint16_t padded[kLanes] = {};
        std::memcpy(padded, src + c, size_t(n - c) * sizeof(uint16_t));
        storeMasked(dst + c, tail(n - c), _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(padded))));
    }

    // Dropout's keep flags of the whole Philox groups [group, group + groups) (DropoutBits::fill's
    // WholeGroups): eight Philox4x32-10 blocks per step, block l in 32-bit lane l. The 32x32 ->
    // 64-bit products are vpmuludq on the even lanes and on the odd lanes shifted down; the keep
    // test is DropoutBits' integer one (word < threshold). The same flags as BlockByBlock, which
    // takes the last groups (fewer than eight, or a counter whose low word wraps within the step).
    struct PhiloxKeep {
        ATTNOPS_AVX2_FN void operator()(const DropoutBits& bits, uint64_t group, int64_t groups, uint8_t* out) const {
            const __m256i mul0 = _mm256_set1_epi64x(kPhiloxMul0), mul1 = _mm256_set1_epi64x(kPhiloxMul1);
            const bool keepAll = bits.threshold() > 0xffffffffu;
            // word < threshold as a signed compare of both biased by 2^31.
            const __m256i limit = _mm256_set1_epi32(int32_t(uint32_t(bits.threshold()) ^ 0x80000000u));
            const uint64_t offset = bits.offset();
            int64_t g = 0;
            for (; g + 8 <= groups; g += 8) {
                const uint64_t first = group + uint64_t(g);
                if (uint32_t(first) > 0xfffffff8u) break;  // the counter's high word would differ by lane
                __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32(int32_t(uint32_t(first))), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
                __m256i c1 = _mm256_set1_epi32(int32_t(uint32_t(first >> 32)));
                __m256i c2 = _mm256_set1_epi32(int32_t(uint32_t(offset)));
                __m256i c3 = _mm256_set1_epi32(int32_t(uint32_t(offset >> 32)));
                uint32_t k0 = bits.key(0), k1 = bits.key(1);
                for (int round = 0; round < 10; ++round) {
                    // p0 = kMul0 * c0, p1 = kMul1 * c2: low and high 32-bit halves, lane by lane.
                    const __m256i p0Even = _mm256_mul_epu32(c0, mul0), p0Odd = _mm256_mul_epu32(_mm256_srli_epi64(c0, 32), mul0);
                    const __m256i p1Even = _mm256_mul_epu32(c2, mul1), p1Odd = _mm256_mul_epu32(_mm256_srli_epi64(c2, 32), mul1);
                    const __m256i p0Lo = _mm256_blend_epi32(p0Even, _mm256_slli_epi64(p0Odd, 32), 0xAA);
                    const __m256i p0Hi = _mm256_blend_epi32(_mm256_srli_epi64(p0Even, 32), p0Odd, 0xAA);
                    const __m256i p1Lo = _mm256_blend_epi32(p1Even, _mm256_slli_epi64(p1Odd, 32), 0xAA);
                    const __m256i p1Hi = _mm256_blend_epi32(_mm256_srli_epi64(p1Even, 32), p1Odd, 0xAA);
                    c0 = _mm256_xor_si256(_mm256_xor_si256(p1Hi, c1), _mm256_set1_epi32(int32_t(k0)));
                    c2 = _mm256_xor_si256(_mm256_xor_si256(p0Hi, c3), _mm256_set1_epi32(int32_t(k1)));
                    c1 = p1Lo;
                    c3 = p0Lo;
                    k0 += kPhiloxWeyl0;
                    k1 += kPhiloxWeyl1;
                }
                // Flag of word w of block l at byte 4 l + w: each lane's four flags as one 32-bit word.
                const __m256i flags = _mm256_or_si256(
                    _mm256_or_si256(keep(c0, keepAll, limit), _mm256_slli_epi32(keep(c1, keepAll, limit), 8)),
                    _mm256_or_si256(_mm256_slli_epi32(keep(c2, keepAll, limit), 16), _mm256_slli_epi32(keep(c3, keepAll, limit), 24)));
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 4 * g), flags);
            }
            DropoutBits::BlockByBlock{}(bits, group + uint64_t(g), groups - g, out + 4 * g);
        }
        // 1 in the lanes whose word is below the threshold (limit: the threshold biased by 2^31), else 0.
        ATTNOPS_AVX2_INLINE __m256i keep(__m256i word, bool keepAll, __m256i limit) {
            const __m256i one = _mm256_set1_epi32(1);
            if (keepAll) return one;
            return _mm256_and_si256(_mm256_cmpgt_epi32(limit, _mm256_xor_si256(word, _mm256_set1_epi32(int32_t(0x80000000u)))), one);
        }
    };
};

}  // namespace attnops::cpu

#include "cpu/simd/microkernels.hpp"

namespace attnops::cpu::simd {
// The score GEMM's tile on AVX2 (see ScoreTile): 4 keys x 24 query rows.
template <>
struct ScoreTile<Avx2> {
    static constexpr int kRows = 4;
    static constexpr int kVectors = 3;
};
}  // namespace attnops::cpu::simd

// stream-avx2: the streaming BlockAttentionResiduals kernel (cpu/bar_stream.hpp) for CPUs with
// AVX2, FMA and F16C but no AVX-512: the trait's 16 lanes are two ymm halves, lanes 0-7 and 8-15,
// so every reduction has the same order, and gives the same bits, as stream-avx512.
#include <immintrin.h>

#include "cpu/isa.hpp"

#define ATTNOPS_BAR_STREAM_TARGET __attribute__((target("avx2,fma,f16c")))
#include "cpu/bar_stream.hpp"

#define ATTNOPS_AVX2_FN ATTNOPS_BAR_STREAM_TARGET static inline __attribute__((always_inline))

namespace attnops::bar {
namespace {

// The vector trait of cpu/bar_stream.hpp: 16 lanes in two ymm registers.
struct Avx2 {
    struct F {
        __m256 lo, hi;
    };
    using H = __m256i;
    ATTNOPS_AVX2_FN F zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
    ATTNOPS_AVX2_FN F set1(float v) { return {_mm256_set1_ps(v), _mm256_set1_ps(v)}; }
    ATTNOPS_AVX2_FN F load(const float* p) { return {_mm256_load_ps(p), _mm256_load_ps(p + 8)}; }
    ATTNOPS_AVX2_FN F loadu(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
    ATTNOPS_AVX2_FN void store(float* p, F v) {
        _mm256_store_ps(p, v.lo);
        _mm256_store_ps(p + 8, v.hi);
    }
    ATTNOPS_AVX2_FN void storeu(float* p, F v) {
        _mm256_storeu_ps(p, v.lo);
        _mm256_storeu_ps(p + 8, v.hi);
    }
    ATTNOPS_AVX2_FN void streamF(float* p, F v) {
        _mm256_stream_ps(p, v.lo);
        _mm256_stream_ps(p + 8, v.hi);
    }
    ATTNOPS_AVX2_FN F add(F a, F b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
    ATTNOPS_AVX2_FN F mul(F a, F b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
    ATTNOPS_AVX2_FN F fmadd(F a, F b, F c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
    ATTNOPS_AVX2_FN F fnmadd(F a, F b, F c) {
        return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
    }

    ATTNOPS_AVX2_FN H loadH(const uint16_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
    ATTNOPS_AVX2_FN void storeH(uint16_t* p, H h) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h); }
    ATTNOPS_AVX2_FN void streamH(uint16_t* p, H h) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), h); }
    ATTNOPS_AVX2_FN F widenBf16(H h) {
        const __m256i lo = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), hi = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1));
        return {_mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16))};
    }
    // Loads 16 bf16/fp16 values and widens them: each half with one memory-operand vpmovzxwd or
    // vcvtph2ps (loading the 32 bytes and extracting the high half took three more instructions).
    ATTNOPS_AVX2_FN F loadWidenBf16(const uint16_t* p) {
        const __m256i lo = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
        const __m256i hi = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
        return {_mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16))};
    }
    ATTNOPS_AVX2_FN F loadWidenF16(const uint16_t* p) {
        return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
                _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
    }
    ATTNOPS_AVX2_FN F widenF16(H h) {
        return {_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1))};
    }
    // Rounds like cpu::floatToBf16: to nearest even, NaN kept quiet. Each lane's result is below
    // 2^16, so the signed-saturating pack keeps it; the pack interleaves 64-bit blocks of its two
    // inputs, which the permute puts back in order.
    // Without a NaN among the 16 lanes (one compare tells), the rounding alone: five integer
    // operations per 8 lanes instead of nine (the bf16 backward narrows every value it writes).
    ATTNOPS_AVX2_FN H narrowBf16(F v) {
        const bool noNan = _mm256_movemask_ps(_mm256_cmp_ps(v.lo, v.hi, _CMP_UNORD_Q)) == 0;
        const __m256i lo = noNan ? bf16BitsFinite(v.lo) : bf16Bits(v.lo), hi = noNan ? bf16BitsFinite(v.hi) : bf16Bits(v.hi);
        return _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), _MM_SHUFFLE(3, 1, 2, 0));
    }
    ATTNOPS_AVX2_FN H narrowF16(F v) {
        constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        return _mm256_set_m128i(_mm256_cvtps_ph(v.hi, kRound), _mm256_cvtps_ph(v.lo, kRound));
    }
    ATTNOPS_AVX2_FN void fence() { _mm_sfence(); }

    // 16 fp64 lanes (four ymm), lane j holding what fp32 lane j feeds: c + a * b with the product
    // exact (two fp32 values multiply exactly in fp64) and one fp64 rounding.
    struct D {
        __m256d q[4];
    };
    ATTNOPS_AVX2_FN D zeroD() { return {{_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()}}; }
    ATTNOPS_AVX2_FN D fmaddD(F a, F b, D c) {
        const __m256 ah[2] = {a.lo, a.hi}, bh[2] = {b.lo, b.hi};
        for (int j = 0; j < 2; ++j) {
            const __m256d a0 = _mm256_cvtps_pd(_mm256_castps256_ps128(ah[j])), a1 = _mm256_cvtps_pd(_mm256_extractf128_ps(ah[j], 1));
            const __m256d b0 = _mm256_cvtps_pd(_mm256_castps256_ps128(bh[j])), b1 = _mm256_cvtps_pd(_mm256_extractf128_ps(bh[j], 1));
            c.q[2 * j] = _mm256_fmadd_pd(a0, b0, c.q[2 * j]);
            c.q[2 * j + 1] = _mm256_fmadd_pd(a1, b1, c.q[2 * j + 1]);
        }
        return c;
    }
    ATTNOPS_AVX2_FN void storeD(double* p, D v) {
        for (int j = 0; j < 4; ++j) _mm256_storeu_pd(p + 4 * j, v.q[j]);
    }

private:
    // bf16Bits for lanes that hold no NaN: round to nearest even.
    ATTNOPS_AVX2_FN __m256i bf16BitsFinite(__m256 v) {
        const __m256i bits = _mm256_castps_si256(v);
        const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
        return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb), 16);
    }
    // The bf16 bits of 8 floats, one per 32-bit lane (the high half is 0).
    ATTNOPS_AVX2_FN __m256i bf16Bits(__m256 v) {
        const __m256i bits = _mm256_castps_si256(v);
        const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
        const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
        const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
        const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
        return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(quiet), nan));
    }
};

bool hasAvx2() {
    const cpu::IsaFeatures& f = cpu::isa();
    return f.avx2 && f.fma && f.f16c;
}

}  // namespace

const Kernel& kernelStreamAvx2() {
    static const Kernel k{"stream-avx2", hasAvx2, scratch::ForwardTile::bytes, forwardTokens<Avx2>,
                          scratch::Backward::bytes, backwardTokens<Avx2>};
    return k;
}

}  // namespace attnops::bar

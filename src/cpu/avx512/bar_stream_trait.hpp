// The zmm vector trait of the streaming BlockAttentionResiduals kernel (cpu/bar_stream.hpp), shared
// by stream-avx512 (bar_stream.cpp) and stream-avx512-bf16 (bar_stream_bf16.cpp): one zmm register
// holds the 16 lanes; bf16 widens with a shift, fp16 with vcvtph2ps. The including file defines
// ATTNOPS_BAR_STREAM_TARGET, which every function here carries; like cpu/bar_stream.hpp,
// everything here is in an anonymous namespace, a copy per translation unit.
#pragma once

#include <immintrin.h>

#include "cpu/isa.hpp"

#ifndef ATTNOPS_BAR_STREAM_TARGET
#error "define ATTNOPS_BAR_STREAM_TARGET before including cpu/avx512/bar_stream_trait.hpp"
#endif

#define ATTNOPS_AVX512_FN ATTNOPS_BAR_STREAM_TARGET static inline __attribute__((always_inline))

namespace attnops::bar {
namespace {

// The vector trait of cpu/bar_stream.hpp: one zmm register holds the 16 lanes.
struct Avx512 {
    using F = __m512;
    using H = __m256i;
    ATTNOPS_AVX512_FN F zero() { return _mm512_setzero_ps(); }
    ATTNOPS_AVX512_FN F set1(float v) { return _mm512_set1_ps(v); }
    ATTNOPS_AVX512_FN F load(const float* p) { return _mm512_load_ps(p); }
    ATTNOPS_AVX512_FN F loadu(const float* p) { return _mm512_loadu_ps(p); }
    ATTNOPS_AVX512_FN void store(float* p, F v) { _mm512_store_ps(p, v); }
    ATTNOPS_AVX512_FN void storeu(float* p, F v) { _mm512_storeu_ps(p, v); }
    ATTNOPS_AVX512_FN void streamF(float* p, F v) { _mm512_stream_ps(p, v); }
    ATTNOPS_AVX512_FN F add(F a, F b) { return _mm512_add_ps(a, b); }
    ATTNOPS_AVX512_FN F mul(F a, F b) { return _mm512_mul_ps(a, b); }
    ATTNOPS_AVX512_FN F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
    ATTNOPS_AVX512_FN F fnmadd(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }

    ATTNOPS_AVX512_FN H loadH(const uint16_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
    ATTNOPS_AVX512_FN void storeH(uint16_t* p, H h) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h); }
    ATTNOPS_AVX512_FN void streamH(uint16_t* p, H h) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), h); }
    ATTNOPS_AVX512_FN F widenBf16(H h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
    ATTNOPS_AVX512_FN F widenF16(H h) { return _mm512_cvtph_ps(h); }
    ATTNOPS_AVX512_FN F loadWidenBf16(const uint16_t* p) { return widenBf16(loadH(p)); }
    ATTNOPS_AVX512_FN F loadWidenF16(const uint16_t* p) { return widenF16(loadH(p)); }
    // Rounds like cpu::floatToBf16: to nearest even, NaN kept quiet.
    ATTNOPS_AVX512_FN H narrowBf16(F v) {
        const __m512i bits = _mm512_castps_si512(v);
        const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
        const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
        const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)),
                                                      _mm512_set1_epi32(0x7f800000));
        return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
    }
    ATTNOPS_AVX512_FN H narrowF16(F v) { return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
    ATTNOPS_AVX512_FN void fence() { _mm_sfence(); }

    // 16 fp64 lanes (two zmm), lane j holding what fp32 lane j feeds: c + a * b with the product
    // exact (two fp32 values multiply exactly in fp64) and one fp64 rounding.
    struct D {
        __m512d q[2];
    };
    ATTNOPS_AVX512_FN D zeroD() { return {{_mm512_setzero_pd(), _mm512_setzero_pd()}}; }
    ATTNOPS_AVX512_FN D fmaddD(F a, F b, D c) {
        const __m512d a0 = _mm512_cvtps_pd(_mm512_castps512_ps256(a)), b0 = _mm512_cvtps_pd(_mm512_castps512_ps256(b));
        const __m512d a1 = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
        const __m512d b1 = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(b), 1)));
        return {{_mm512_fmadd_pd(a0, b0, c.q[0]), _mm512_fmadd_pd(a1, b1, c.q[1])}};
    }
    ATTNOPS_AVX512_FN void storeD(double* p, D v) {
        _mm512_storeu_pd(p, v.q[0]);
        _mm512_storeu_pd(p + 8, v.q[1]);
    }
};

bool hasAvx512() {
    const cpu::IsaFeatures& f = cpu::isa();
    return f.avx512f && f.avx512bw && f.avx512vl && f.avx2 && f.fma && f.f16c;
}

}  // namespace
}  // namespace attnops::bar

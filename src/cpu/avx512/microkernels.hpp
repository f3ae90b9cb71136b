// AVX-512 building blocks of the flash-attention kernels: the instruction-set trait that
// instantiates the generic ones of cpu/simd/microkernels.hpp with 16-lane zmm vectors and mask
// registers (a 6x64 register-blocked GEMM), their historical avx512:: names (used by the AVX-512
// and AMX kernels), and what only AVX-512 has: vdpbf16ps on bf16 pairs and bf16 pair packing.
// Every function carries the AVX-512 target attribute, so only the files in src/cpu/avx512 (and
// src/cpu/amx) include this header and only CPUs that pass the isa() probe ever reach them.
#pragma once

// GCC 12's AVX-512 headers self-initialise their "undefined" vectors, which -O3 reports as
// maybe-uninitialized at the header lines; the diagnostic is silenced for the header only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

// avx512bf16 is in the target of every function so that the GEMM template serves both element
// kinds; its instructions come only from the Bf16PairDot intrinsics (compilers do not synthesise
// them from fp32 code), which run only behind the avx512bf16 check of their kernel entry.
#define ATTNOPS_AVX512_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))
#define ATTNOPS_AVX512_INLINE static inline __attribute__((always_inline)) ATTNOPS_AVX512_FN
#define ATTNOPS_SIMD_FN ATTNOPS_AVX512_FN

namespace attnops::cpu {

// The trait of cpu/simd: zmm vectors, __mmask16 masks (lanes as bits).
struct Avx512 {
    using Vec = __m512;
    using IVec = __m512i;
    using Mask = __mmask16;
    static constexpr int64_t kLanes = 16;  // floats per zmm register
    static constexpr int kTileRows = 6;    // rows of C held in registers (6 x 4 accumulators + 4 B + 1 A)
    static constexpr int kTileVectors = 4;  // columns of C held in registers, in vectors (64 floats)
    // Query rows per work unit: one GEMM strip, 16 rows per softmax vector.
    static constexpr int64_t kQueryRows = 64;

    ATTNOPS_AVX512_INLINE Mask tail(int64_t n) { return n >= kLanes ? Mask(0xFFFF) : Mask((1u << n) - 1u); }
    ATTNOPS_AVX512_INLINE Mask all() { return Mask(0xFFFF); }
    ATTNOPS_AVX512_INLINE Mask none() { return Mask(0); }
    ATTNOPS_AVX512_INLINE Mask maskAnd(Mask a, Mask b) { return Mask(a & b); }
    ATTNOPS_AVX512_INLINE Mask maskOr(Mask a, Mask b) { return Mask(a | b); }
    ATTNOPS_AVX512_INLINE bool any(Mask m) { return m != 0; }

    ATTNOPS_AVX512_INLINE Vec zero() { return _mm512_setzero_ps(); }
    ATTNOPS_AVX512_INLINE Vec set1(float x) { return _mm512_set1_ps(x); }
    ATTNOPS_AVX512_INLINE Vec load(const float* p) { return _mm512_loadu_ps(p); }
    ATTNOPS_AVX512_INLINE Vec loadMasked(Mask m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
    ATTNOPS_AVX512_INLINE void store(float* p, Vec x) { _mm512_storeu_ps(p, x); }
    ATTNOPS_AVX512_INLINE void storeMasked(float* p, Mask m, Vec x) { _mm512_mask_storeu_ps(p, m, x); }

    ATTNOPS_AVX512_INLINE Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
    ATTNOPS_AVX512_INLINE Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
    ATTNOPS_AVX512_INLINE Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
    ATTNOPS_AVX512_INLINE Vec div(Vec a, Vec b) { return _mm512_div_ps(a, b); }
    ATTNOPS_AVX512_INLINE Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
    ATTNOPS_AVX512_INLINE Vec min(Vec a, Vec b) { return _mm512_min_ps(a, b); }
    ATTNOPS_AVX512_INLINE Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }    // a * b + c
    ATTNOPS_AVX512_INLINE Vec fnmadd(Vec a, Vec b, Vec c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a * b

    ATTNOPS_AVX512_INLINE Mask isNan(Vec a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
    ATTNOPS_AVX512_INLINE Mask greater(Vec a, Vec b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
    ATTNOPS_AVX512_INLINE Mask notEqual(Vec a, Vec b) { return _mm512_cmp_ps_mask(a, b, _CMP_NEQ_UQ); }
    ATTNOPS_AVX512_INLINE Vec select(Mask m, Vec ifClear, Vec ifSet) { return _mm512_mask_mov_ps(ifClear, m, ifSet); }
    ATTNOPS_AVX512_INLINE Vec zeroUnless(Mask m, Vec x) { return _mm512_maskz_mov_ps(m, x); }

    ATTNOPS_AVX512_INLINE Vec roundNearest(Vec x) {
        return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    ATTNOPS_AVX512_INLINE Vec ldexp(Vec x, Vec n) { return _mm512_scalef_ps(x, n); }

    ATTNOPS_AVX512_INLINE IVec set1i(int32_t x) { return _mm512_set1_epi32(x); }
    ATTNOPS_AVX512_INLINE IVec addi(IVec a, IVec b) { return _mm512_add_epi32(a, b); }
    ATTNOPS_AVX512_INLINE IVec subi(IVec a, IVec b) { return _mm512_sub_epi32(a, b); }
    ATTNOPS_AVX512_INLINE IVec laneIndex() {
        return _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    }
    // Lanes with lo <= x <= hi.
    ATTNOPS_AVX512_INLINE Mask inRange(IVec x, IVec lo, IVec hi) {
        return Mask(_mm512_cmp_epi32_mask(x, lo, _MM_CMPINT_NLT) & _mm512_cmp_epi32_mask(x, hi, _MM_CMPINT_LE));
    }

    // kLanes stored elements as fp32: bf16 (a shift), fp16 (vcvtph2ps), int8 (exact).
    ATTNOPS_AVX512_INLINE Vec loadBf16(const uint16_t* p) {
        const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
    }
    ATTNOPS_AVX512_INLINE Vec loadHalf(const uint16_t* p) {
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    }
    ATTNOPS_AVX512_INLINE Vec loadInt8(const int8_t* p) {
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    }
    // kLanes packed int4 (8 bytes, low nibble first, two's complement) as fp32, exact: dword
    // i / 8 goes to lane i, which shifts its nibble to the top and back sign-extended.
    ATTNOPS_AVX512_INLINE Vec loadInt4(const uint8_t* p) {
        const __m512i words = _mm512_castsi128_si512(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
        const __m512i spread = _mm512_permutexvar_epi32(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0), words);
        const __m512i top = _mm512_sllv_epi32(
            spread, _mm512_set_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28));
        return _mm512_cvtepi32_ps(_mm512_srai_epi32(top, 28));
    }
    // x rounded to the nearest bf16 / fp16 (ties to even), as fp32 (see the AVX2 trait).
    ATTNOPS_AVX512_INLINE Vec roundBf16(Vec x) {
        const __m512i bits = _mm512_castps_si512(x);
        const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
        const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
        return _mm512_castsi512_ps(_mm512_and_si512(rounded, _mm512_set1_epi32(int32_t(0xFFFF0000u))));
    }
    ATTNOPS_AVX512_INLINE Vec roundHalf(Vec x) {
        return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    // Lanes 0..7 and 8..15 (vextractf64x4: AVX512F, where vextractf32x8 would need AVX512DQ;
    // the zero-masked form, as GCC 12 reports the "undefined" vector of the unmasked form and of
    // _mm512_castps512_ps256 as uninitialised).
    ATTNOPS_AVX512_INLINE __m256 lowerHalf(Vec x) {
        return _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, _mm512_castps_pd(x), 0));
    }
    ATTNOPS_AVX512_INLINE __m256 upperHalf(Vec x) {
        return _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, _mm512_castps_pd(x), 1));
    }
    // out[i] = the sum of the lanes of x[i], i < 8: each folded to 8 lanes, then the AVX2 tree.
    ATTNOPS_AVX512_INLINE void sum8(const Vec* x, float* out) {
        __m256 h[8];
        for (int i = 0; i < 8; ++i)
            h[i] = _mm256_add_ps(lowerHalf(x[i]), upperHalf(x[i]));
        const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(h[0], h[1]), _mm256_hadd_ps(h[2], h[3]));
        const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(h[4], h[5]), _mm256_hadd_ps(h[6], h[7]));
        _mm256_storeu_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31)));
    }
    // The sums of the lanes of x[0..16) as one vector, lane i for x[i], by sum8's tree for each
    // (lane c + lane c + 8, then adjacent pairs, then pairs of pairs, then the two halves): the
    // same bits as sum8, in 46 instructions for 16 vectors where two sum8 take about 90
    // (FusedInferAttentionScore's dot steps of 4 keys x 4 rows). Two vectors share each register
    // from the first step on.
    ATTNOPS_AVX512_INLINE Vec sum16Lanes(const Vec* x) {
        // (zero-masked forms with every lane kept: GCC 12 reports the "undefined" pass-through
        // vector of the unmasked shuffles as uninitialised, as for lowerHalf)
        Vec t[8], a[4], b[2];
        for (int i = 0; i < 8; ++i)  // lanes 0-7: h of x[i], 8-15: h of x[i + 8] (h[c] = x[c] + x[c + 8])
            t[i] = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(0xFFFF, x[i], x[i + 8], 0x44),
                                 _mm512_maskz_shuffle_f32x4(0xFFFF, x[i], x[i + 8], 0xEE));
        for (int i = 0; i < 4; ++i)  // per 128-bit block: adjacent pairs of t[2i], then of t[2i + 1] (hadd)
            a[i] = _mm512_add_ps(_mm512_maskz_shuffle_ps(0xFFFF, t[2 * i], t[2 * i + 1], 0x88),
                                 _mm512_maskz_shuffle_ps(0xFFFF, t[2 * i], t[2 * i + 1], 0xDD));
        for (int i = 0; i < 2; ++i)  // pairs of pairs
            b[i] = _mm512_add_ps(_mm512_maskz_shuffle_ps(0xFFFF, a[2 * i], a[2 * i + 1], 0x88),
                                 _mm512_maskz_shuffle_ps(0xFFFF, a[2 * i], a[2 * i + 1], 0xDD));
        // blocks of b[i]: first halves of x[4i..4i+3], their second halves, the same for x[4i+8..]
        const Vec c = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(0xFFFF, b[0], b[1], 0x88),
                                    _mm512_maskz_shuffle_f32x4(0xFFFF, b[0], b[1], 0xDD));
        // blocks x0-3, x8-11, x4-7, x12-15, put in order
        return _mm512_maskz_shuffle_f32x4(0xFFFF, c, c, 0xD8);
    }
    // out[i] = the sum of the lanes of x[i], i < 16 (sum16Lanes).
    ATTNOPS_AVX512_INLINE void sum16(const Vec* x, float* out) { _mm512_storeu_ps(out, sum16Lanes(x)); }
    // out[(i / 4) * ld + i % 4] = the sum of the lanes of x[i], i < 16: four rows of four sums
    // (sum16Lanes), stored straight to where they go, in registers all the way.
    ATTNOPS_AVX512_INLINE void sum16Rows(const Vec* x, float* out, int64_t ld) {
        const Vec s = sum16Lanes(x);  // (the zero-masked extracts: see lowerHalf)
        _mm_storeu_ps(out, _mm512_maskz_extractf32x4_ps(0xF, s, 0));
        _mm_storeu_ps(out + ld, _mm512_maskz_extractf32x4_ps(0xF, s, 1));
        _mm_storeu_ps(out + 2 * ld, _mm512_maskz_extractf32x4_ps(0xF, s, 2));
        _mm_storeu_ps(out + 3 * ld, _mm512_maskz_extractf32x4_ps(0xF, s, 3));
    }
    // The sum of the lanes (fixed order).
    ATTNOPS_AVX512_INLINE float sumLanes(Vec x) {
        const __m256 o = _mm256_add_ps(lowerHalf(x), upperHalf(x));
        const __m128 h = _mm_add_ps(_mm256_castps256_ps128(o), _mm256_extractf128_ps(o, 1));
        const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
        return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
    }

    // dst[c] = fp16 src[c] as fp32, c < n (vcvtph2ps).
    ATTNOPS_AVX512_INLINE void widenHalves(const uint16_t* src, int64_t n, float* __restrict dst) {
        for (int64_t c = 0; c < n; c += kLanes) {
            const Mask mk = tail(n - c);
            _mm512_mask_storeu_ps(dst + c, mk, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, src + c)));
        }
    }
};

}  // namespace attnops::cpu

#include "cpu/simd/microkernels.hpp"

namespace attnops::cpu::avx512 {

// The generic building blocks under their AVX-512 names.
constexpr int64_t kLanes = Avx512::kLanes;
constexpr int kTileRows = Avx512::kTileRows;
constexpr int kTileVectors = Avx512::kTileVectors;
using simd::keyBlockRows;
using F32Dot = simd::F32Dot<Avx512>;
using BandLanes = simd::BandLanes<Avx512>;

ATTNOPS_AVX512_INLINE __mmask16 tailMask(int64_t n) { return Avx512::tail(n); }
ATTNOPS_AVX512_INLINE __m512 exp(__m512 x) { return simd::exp<Avx512>(x); }
ATTNOPS_AVX512_INLINE void axpy(int64_t n, float a, const float* __restrict x, float* __restrict y) {
    simd::axpy<Avx512>(n, a, x, y);
}
ATTNOPS_AVX512_INLINE void scaleRow(int64_t n, float a, float* y) { simd::scaleRow<Avx512>(n, a, y); }
ATTNOPS_AVX512_INLINE void loadRow(const fa::View4& view, int64_t b, int64_t n, int64_t row, int64_t cols,
                                   float* __restrict dst) {
    simd::loadRow<Avx512>(view, b, n, row, cols, dst);
}
ATTNOPS_AVX512_INLINE void loadRows(const fa::View4& view, int64_t b, int64_t n, int64_t row0, int64_t rows,
                                    int64_t cols, int64_t ld, float* __restrict dst) {
    simd::loadRows<Avx512>(view, b, n, row0, rows, cols, ld, dst);
}
ATTNOPS_AVX512_INLINE void loadRowsTransposed(const fa::View4& view, int64_t b, int64_t n, int64_t row0, int64_t rows,
                                              int64_t cols, int64_t ld, float* __restrict row, float* __restrict dst) {
    simd::loadRowsTransposed<Avx512>(view, b, n, row0, rows, cols, ld, row, dst);
}
ATTNOPS_AVX512_INLINE BandLanes bandLanes(const fa::SeqRule& rule, int64_t skv) {
    return simd::bandLanes<Avx512>(rule, skv);
}
ATTNOPS_AVX512_INLINE __mmask16 keptRows(const BandLanes& b, int64_t key, int64_t row0) {
    return simd::keptRows<Avx512>(b, key, row0);
}
ATTNOPS_AVX512_INLINE __mmask16 keptKeys(const BandLanes& b, int64_t key0, int64_t row) {
    return simd::keptKeys<Avx512>(b, key0, row);
}
ATTNOPS_AVX512_INLINE bool allFinite(const float* a, int64_t rows, int64_t cols, int64_t ld) {
    return simd::allFinite<Avx512>(a, rows, cols, ld);
}
template <bool TransA, typename Dot = F32Dot>
ATTNOPS_AVX512_FN static void gemm(int64_t m, int64_t n, int64_t k, const typename Dot::Elem* a, int64_t lda,
                                  const typename Dot::Elem* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
    simd::gemm<Avx512, TransA, Dot>(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

// Elements are pairs of bf16 (the low half first) packed in 32 bits; vdpbf16ps adds both
// products of a pair to an fp32 lane, so k counts pairs.
struct Bf16PairDot {
    using Elem = uint32_t;
    ATTNOPS_AVX512_INLINE __m512 broadcast(const uint32_t* a) {
        return _mm512_castsi512_ps(_mm512_set1_epi32(int32_t(*a)));
    }
    ATTNOPS_AVX512_INLINE __m512 load(const uint32_t* b) { return _mm512_castsi512_ps(_mm512_loadu_si512(b)); }
    ATTNOPS_AVX512_INLINE __m512 loadMasked(__mmask16 mk, const uint32_t* b) {
        return _mm512_castsi512_ps(_mm512_maskz_loadu_epi32(mk, b));
    }
    ATTNOPS_AVX512_INLINE __m512 madd(__m512 a, __m512 b, __m512 c) {
        return _mm512_dpbf16_ps(c, (__m512bh)a, (__m512bh)b);
    }
};

// --- bf16 pair packing for Bf16PairDot (bf16 views of any column stride: the unit-stride rows
// take the vector or memcpy path, others are gathered element by element, so the arithmetic and
// hence the bits do not depend on the strides; a view with no columns may have a NULL base, so
// those return before forming a row pointer) ---

ATTNOPS_AVX512_INLINE const uint16_t* bf16Row(const fa::View4& view, int64_t b, int64_t n, int64_t row) {
    return static_cast<const uint16_t*>(view.data) + view.offset(b, n, row, 0);
}

// dst[p * ld + r] = (row r col 2p, row r col 2p + 1) for rows [row0, row0 + rows), a zero high
// half past an odd cols: the B operand of a GEMM whose n axis is rows.
ATTNOPS_AVX512_INLINE void packColumnPairsTransposed(const fa::View4& view, int64_t b, int64_t n, int64_t row0,
                                                     int64_t rows, int64_t cols, int64_t ld, uint32_t* __restrict dst) {
    if (cols <= 0) return;
    const int64_t cs = view.stride[3];
    for (int64_t r = 0; r < rows; ++r) {
        const uint16_t* src = bf16Row(view, b, n, row0 + r);
        for (int64_t p = 0; p < cols / 2; ++p)
            dst[p * ld + r] = uint32_t(src[2 * p * cs]) | (uint32_t(src[(2 * p + 1) * cs]) << 16);
        if (cols % 2 != 0) dst[(cols / 2) * ld + r] = src[(cols - 1) * cs];
    }
}

// Rows as column pairs, dst[r * ldPairs + p]: the A operand of a GEMM whose k axis is columns.
ATTNOPS_AVX512_INLINE void packColumnPairs(const fa::View4& view, int64_t b, int64_t n, int64_t row0, int64_t rows,
                                           int64_t cols, int64_t ldPairs, uint32_t* __restrict dst) {
    if (cols <= 0) return;
    const int64_t cs = view.stride[3];
    for (int64_t r = 0; r < rows; ++r) {
        uint16_t* out = reinterpret_cast<uint16_t*>(dst + r * ldPairs);
        const uint16_t* src = bf16Row(view, b, n, row0 + r);
        if (cs == 1)
            std::memcpy(out, src, size_t(cols) * sizeof(uint16_t));
        else
            for (int64_t c = 0; c < cols; ++c) out[c] = src[c * cs];
        if (cols % 2 != 0) out[cols] = 0;
    }
}

// Row pairs, dst[p * cols + c] = (row 2p col c, row 2p + 1 col c), a zero high half past an odd
// rows: the B operand of a GEMM whose k axis is rows.
ATTNOPS_AVX512_INLINE void packRowPairs(const fa::View4& view, int64_t b, int64_t n, int64_t row0, int64_t rows,
                                        int64_t cols, uint32_t* __restrict dst) {
    if (cols <= 0) return;
    const __m512i lowIdx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                            37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i highIdx = _mm512_add_epi16(lowIdx, _mm512_set1_epi16(16));
    const int64_t cs = view.stride[3];
    for (int64_t p = 0; p < (rows + 1) / 2; ++p) {
        const uint16_t* even = bf16Row(view, b, n, row0 + 2 * p);
        const uint16_t* odd = 2 * p + 1 < rows ? bf16Row(view, b, n, row0 + 2 * p + 1) : nullptr;
        if (cs != 1) {
            for (int64_t c = 0; c < cols; ++c)
                dst[p * cols + c] = uint32_t(even[c * cs]) | (odd != nullptr ? uint32_t(odd[c * cs]) << 16 : 0u);
            continue;
        }
        for (int64_t c = 0; c < cols; c += 2 * kLanes) {
            const int64_t left = cols - c;
            const __mmask32 mk = left >= 32 ? __mmask32(0xFFFFFFFFu) : __mmask32((1u << left) - 1u);
            const __m512i e = _mm512_maskz_loadu_epi16(mk, even + c);
            const __m512i o = odd != nullptr ? _mm512_maskz_loadu_epi16(mk, odd + c) : _mm512_setzero_si512();
            uint32_t* out = dst + p * cols + c;
            _mm512_mask_storeu_epi32(out, tailMask(left), _mm512_permutex2var_epi16(e, lowIdx, o));
            if (left > kLanes) {
                const __m512i high = _mm512_permutex2var_epi16(e, highIdx, o);
                _mm512_mask_storeu_epi32(out + kLanes, tailMask(left - kLanes), high);
            }
        }
    }
}

// fp32 rows [0, rows) of st (rows of length >= 16 * ceil(cols / 16), leading dimension ld) as
// bf16 row pairs: dst[p * ld + c] = (st[2p][c], st[2p + 1][c]) rounded to nearest even.
ATTNOPS_AVX512_INLINE void packFloatRowPairs(const float* st, int64_t rows, int64_t cols, int64_t ld,
                                             uint32_t* __restrict dst) {
    const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                                6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int64_t p = 0; p < (rows + 1) / 2; ++p) {
        const float* even = st + 2 * p * ld;
        const bool hasOdd = 2 * p + 1 < rows;
        for (int64_t c = 0; c < cols; c += kLanes) {
            const __m512 o = hasOdd ? _mm512_loadu_ps(even + ld + c) : _mm512_setzero_ps();
            const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(o, _mm512_loadu_ps(even + c));  // low: even, high: odd
            _mm512_storeu_si512(dst + p * ld + c, _mm512_permutexvar_epi16(interleave, both));
        }
    }
}

// fp32 rows [0, rows) of src (leading dimension ld) as bf16 column pairs, rounded to nearest
// even: dst[r * ldPairs + p] = (src[r][2p], src[r][2p + 1]), a zero high half past an odd cols
// (columns past cols are never read): the A operand of a GEMM whose k axis is columns.
ATTNOPS_AVX512_INLINE void packFloatColumnPairs(const float* src, int64_t rows, int64_t cols, int64_t ld,
                                                int64_t ldPairs, uint32_t* __restrict dst) {
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; c += kLanes) {
            const int64_t left = cols - c;
            const __m256i half = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(tailMask(left), src + r * ld + c));
            const __mmask8 pairs = left >= kLanes ? __mmask8(0xFF) : __mmask8((1u << ((left + 1) / 2)) - 1u);
            _mm256_mask_storeu_epi32(dst + r * ldPairs + c / 2, pairs, half);
        }
}

// Whether the bf16 row pairs [0, (nk + 1) / 2) x [0, dv) are finite: a bf16 is finite iff its
// exponent bits are not all ones.
ATTNOPS_AVX512_INLINE bool pairsFinite(const uint32_t* pairs, int64_t nk, int64_t dv) {
    const __m512i expMask = _mm512_set1_epi16(0x7F80);
    for (int64_t pair = 0; pair < (nk + 1) / 2; ++pair)
        for (int64_t c = 0; c < dv; c += kLanes) {
            const __m512i x = _mm512_maskz_loadu_epi32(tailMask(dv - c), pairs + pair * dv + c);
            if (_mm512_cmpeq_epi16_mask(_mm512_and_si512(x, expMask), expMask) != 0) return false;
        }
    return true;
}

// The bf16-pair operations the generic kernel bodies (cpu/simd/fa_*.hpp) call when they run on
// vdpbf16ps.
struct Bf16Pairs {
    using Dot = Bf16PairDot;
    ATTNOPS_AVX512_INLINE void packColumnPairsTransposed(const fa::View4& view, int64_t b, int64_t n, int64_t row0,
                                                         int64_t rows, int64_t cols, int64_t ld, uint32_t* dst) {
        avx512::packColumnPairsTransposed(view, b, n, row0, rows, cols, ld, dst);
    }
    ATTNOPS_AVX512_INLINE void packColumnPairs(const fa::View4& view, int64_t b, int64_t n, int64_t row0, int64_t rows,
                                               int64_t cols, int64_t ldPairs, uint32_t* dst) {
        avx512::packColumnPairs(view, b, n, row0, rows, cols, ldPairs, dst);
    }
    ATTNOPS_AVX512_INLINE void packRowPairs(const fa::View4& view, int64_t b, int64_t n, int64_t row0, int64_t rows,
                                            int64_t cols, uint32_t* dst) {
        avx512::packRowPairs(view, b, n, row0, rows, cols, dst);
    }
    ATTNOPS_AVX512_INLINE void packFloatRowPairs(const float* st, int64_t rows, int64_t cols, int64_t ld,
                                                 uint32_t* dst) {
        avx512::packFloatRowPairs(st, rows, cols, ld, dst);
    }
    ATTNOPS_AVX512_INLINE void packFloatColumnPairs(const float* src, int64_t rows, int64_t cols, int64_t ld,
                                                    int64_t ldPairs, uint32_t* dst) {
        avx512::packFloatColumnPairs(src, rows, cols, ld, ldPairs, dst);
    }
    ATTNOPS_AVX512_INLINE bool finite(const uint32_t* pairs, int64_t nk, int64_t dv) {
        return pairsFinite(pairs, nk, dv);
    }
    // Lanes i < 16 = (even[i], odd[i]): 16 columns of two bf16 rows as row pairs, a NULL row
    // read as zeros.
    ATTNOPS_AVX512_INLINE __m512 interleavedRows(const uint16_t* even, const uint16_t* odd) {
        const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                                    22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
        const __m256i e = even != nullptr ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(even))
                                          : _mm256_setzero_si256();
        const __m256i o = odd != nullptr ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(odd))
                                         : _mm256_setzero_si256();
        return _mm512_castsi512_ps(
            _mm512_permutexvar_epi16(interleave, _mm512_inserti64x4(_mm512_castsi256_si512(e), o, 1)));
    }
    // One bf16 pair in every lane.
    ATTNOPS_AVX512_INLINE __m512 broadcastPair(const uint32_t* pair) {
        return _mm512_castsi512_ps(_mm512_set1_epi32(int32_t(*pair)));
    }
};

}  // namespace attnops::cpu::avx512

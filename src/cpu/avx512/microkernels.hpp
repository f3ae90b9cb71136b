// AVX-512 building blocks of the flash-attention kernels: a register-blocked fp32 GEMM
// microkernel, a vector exp, and row loaders that convert bf16/fp16 to fp32 on the fly. Every
// function carries the AVX-512 target attribute, so only the files in src/cpu/avx512 include
// this header and only CPUs that pass the isa() probe ever reach them.
//
// Reduction order: each output element of gemm() is a chain of FMAs over k ascending, so the
// result of an element depends on neither the register tile it falls in nor the thread count.
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

#include "cpu/generic/convert.hpp"
#include "ops/flash_attention_score/params.hpp"
#include "ops/flash_attention_score/semantics.hpp"

#define ATTNOPS_AVX512_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define ATTNOPS_AVX512_INLINE static inline __attribute__((always_inline)) ATTNOPS_AVX512_FN

namespace attnops::cpu::avx512 {

constexpr int64_t kLanes = 16;       // floats per zmm register
constexpr int kTileRows = 6;         // rows of C held in registers (6 x 4 accumulators + 4 B + 1 A)
constexpr int kTileVectors = 4;      // columns of C held in registers, in zmm vectors (64 floats)

ATTNOPS_AVX512_INLINE __mmask16 tailMask(int64_t n) {
    return n >= kLanes ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u);
}

// C[MR x 16*NV] (+)= A(MR x K) * B(K x 16*NV); A(m, k) = A[m * lda + k], or A[k * lda + m] when
// TransA. The last vector of each row is masked by `last`.
template <int MR, int NV, bool TransA>
ATTNOPS_AVX512_FN static void gemmTile(int64_t k, const float* __restrict a, int64_t lda, const float* __restrict b,
                                      int64_t ldb, float* __restrict c, int64_t ldc, __mmask16 last, bool accumulate) {
    __m512 acc[MR][NV];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v)
            acc[i][v] = accumulate ? _mm512_maskz_loadu_ps(v == NV - 1 ? last : __mmask16(0xFFFF), c + i * ldc + v * kLanes)
                                   : _mm512_setzero_ps();
    for (int64_t kk = 0; kk < k; ++kk) {
        __m512 bv[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v)
            bv[v] = _mm512_maskz_loadu_ps(v == NV - 1 ? last : __mmask16(0xFFFF), b + kk * ldb + v * kLanes);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
            const __m512 av = _mm512_set1_ps(TransA ? a[kk * lda + i] : a[i * lda + kk]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(av, bv[v], acc[i][v]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v)
            _mm512_mask_storeu_ps(c + i * ldc + v * kLanes, v == NV - 1 ? last : __mmask16(0xFFFF), acc[i][v]);
}

template <int MR, bool TransA>
ATTNOPS_AVX512_FN static void gemmRowStrip(int nv, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                                          float* c, int64_t ldc, __mmask16 last, bool accumulate) {
    switch (nv) {
        case 1: gemmTile<MR, 1, TransA>(k, a, lda, b, ldb, c, ldc, last, accumulate); break;
        case 2: gemmTile<MR, 2, TransA>(k, a, lda, b, ldb, c, ldc, last, accumulate); break;
        case 3: gemmTile<MR, 3, TransA>(k, a, lda, b, ldb, c, ldc, last, accumulate); break;
        default: gemmTile<MR, 4, TransA>(k, a, lda, b, ldb, c, ldc, last, accumulate); break;
    }
}

// C[m x n] (+)= A(m x k) * B[k x n] with row-major B and C; A as in gemmTile.
template <bool TransA>
ATTNOPS_AVX512_FN static void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                                  int64_t ldb, float* c, int64_t ldc, bool accumulate) {
    constexpr int64_t kStripCols = kTileVectors * kLanes;
    for (int64_t n0 = 0; n0 < n; n0 += kStripCols) {
        const int64_t cols = std::min(kStripCols, n - n0);
        const int nv = int((cols + kLanes - 1) / kLanes);
        const __mmask16 last = tailMask(cols - (nv - 1) * kLanes);
        for (int64_t m0 = 0; m0 < m; m0 += kTileRows) {
            const float* aTile = TransA ? a + m0 : a + m0 * lda;
            float* cTile = c + m0 * ldc + n0;
            switch (std::min<int64_t>(kTileRows, m - m0)) {
                case 1: gemmRowStrip<1, TransA>(nv, k, aTile, lda, b + n0, ldb, cTile, ldc, last, accumulate); break;
                case 2: gemmRowStrip<2, TransA>(nv, k, aTile, lda, b + n0, ldb, cTile, ldc, last, accumulate); break;
                case 3: gemmRowStrip<3, TransA>(nv, k, aTile, lda, b + n0, ldb, cTile, ldc, last, accumulate); break;
                case 4: gemmRowStrip<4, TransA>(nv, k, aTile, lda, b + n0, ldb, cTile, ldc, last, accumulate); break;
                case 5: gemmRowStrip<5, TransA>(nv, k, aTile, lda, b + n0, ldb, cTile, ldc, last, accumulate); break;
                default: gemmRowStrip<6, TransA>(nv, k, aTile, lda, b + n0, ldb, cTile, ldc, last, accumulate); break;
            }
        }
    }
}

// exp(x) lane-wise, the algorithm of cpu::fastExp (Cody-Waite reduction, degree-7 polynomial):
// below -87.3 gives 0 (so -inf gives 0), NaN gives NaN.
ATTNOPS_AVX512_INLINE __m512 exp(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.3f), hi = _mm512_set1_ps(88.7f);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __mmask16 live = _mm512_cmp_ps_mask(x, lo, _CMP_GT_OQ);
    const __m512 input = x;
    x = _mm512_min_ps(x, hi);  // live lanes are > -87.3 already
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 poly = _mm512_set1_ps(1.0f / 5040.0f);
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.0f / 720.0f));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.0f / 120.0f));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.0f / 24.0f));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.0f / 6.0f));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(0.5f));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.0f));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.0f));
    const __m512 result = _mm512_maskz_mov_ps(live, _mm512_scalef_ps(poly, n));
    return _mm512_mask_mov_ps(result, nan, input);
}

// y[c] += a * x[c], c < n.
ATTNOPS_AVX512_INLINE void axpy(int64_t n, float a, const float* __restrict x, float* __restrict y) {
    const __m512 av = _mm512_set1_ps(a);
    for (int64_t c = 0; c < n; c += kLanes) {
        const __mmask16 mk = tailMask(n - c);
        _mm512_mask_storeu_ps(y + c, mk, _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(mk, x + c), _mm512_maskz_loadu_ps(mk, y + c)));
    }
}

// y[c] *= a, c < n.
ATTNOPS_AVX512_INLINE void scaleRow(int64_t n, float a, float* y) {
    const __m512 av = _mm512_set1_ps(a);
    for (int64_t c = 0; c < n; c += kLanes) {
        const __mmask16 mk = tailMask(n - c);
        _mm512_mask_storeu_ps(y + c, mk, _mm512_mul_ps(av, _mm512_maskz_loadu_ps(mk, y + c)));
    }
}

// One row of a strided view as fp32: fp16 through vcvtph2ps, the rest through cpu::loadRow.
ATTNOPS_AVX512_INLINE void loadRow(const fa::View4& view, int64_t b, int64_t n, int64_t row, int64_t cols,
                                   float* __restrict dst) {
    if (view.dtype == DType::F16 && view.stride[3] == 1 && cols > 0) {
        const uint16_t* src = static_cast<const uint16_t*>(view.data) + view.offset(b, n, row, 0);
        for (int64_t c = 0; c < cols; c += kLanes) {
            const __mmask16 mk = tailMask(cols - c);
            _mm512_mask_storeu_ps(dst + c, mk, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, src + c)));
        }
        return;
    }
    cpu::loadRow(view.data, view.offset(b, n, row, 0), view.stride[3], view.dtype, cols, dst);
}

// Rows [row0, row0 + rows) of head n, row-major with leading dimension ld.
ATTNOPS_AVX512_INLINE void loadRows(const fa::View4& view, int64_t b, int64_t n, int64_t row0, int64_t rows,
                                    int64_t cols, int64_t ld, float* __restrict dst) {
    for (int64_t r = 0; r < rows; ++r) loadRow(view, b, n, row0 + r, cols, dst + r * ld);
}

// The same rows transposed: dst[c * ld + r]; `row` is a scratch row of at least cols floats.
ATTNOPS_AVX512_INLINE void loadRowsTransposed(const fa::View4& view, int64_t b, int64_t n, int64_t row0, int64_t rows,
                                              int64_t cols, int64_t ld, float* __restrict row, float* __restrict dst) {
    for (int64_t r = 0; r < rows; ++r) {
        loadRow(view, b, n, row0 + r, cols, row);
        for (int64_t c = 0; c < cols; ++c) dst[c * ld + r] = row[c];
    }
}

// The analytic mask of a sequence (fa::SeqRule) evaluated for 16 (query row, key) pairs at a
// time in 32-bit lanes. Usable when both lengths are below 2^28: then every key - row difference
// fits, and clamping the rule's differences to +-2^29 changes no comparison.
struct BandLanes {
    __m512i minDiff, maxDiff;
    int64_t prefixEnd = 0;

    static bool usable(int64_t sq, int64_t skv) {
        constexpr int64_t kMaxLength = int64_t(1) << 28;
        return sq < kMaxLength && skv < kMaxLength;
    }
};

ATTNOPS_AVX512_INLINE BandLanes bandLanes(const fa::SeqRule& rule, int64_t skv) {
    constexpr int64_t kClamp = int64_t(1) << 29;
    BandLanes b;
    b.minDiff = _mm512_set1_epi32(int32_t(std::clamp(rule.minDiff, -kClamp, kClamp)));
    b.maxDiff = _mm512_set1_epi32(int32_t(std::clamp(rule.maxDiff, -kClamp, kClamp)));
    b.prefixEnd = std::min(rule.prefix, skv);
    return b;
}

// Lanes l of query rows row0 + l that keep `key`.
ATTNOPS_AVX512_INLINE __mmask16 keptRows(const BandLanes& b, int64_t key, int64_t row0) {
    if (key < b.prefixEnd) return __mmask16(0xFFFF);
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i diff = _mm512_sub_epi32(_mm512_set1_epi32(int32_t(key - row0)), lane);
    return _mm512_cmp_epi32_mask(diff, b.minDiff, _MM_CMPINT_NLT) & _mm512_cmp_epi32_mask(diff, b.maxDiff, _MM_CMPINT_LE);
}

// Lanes l of keys key0 + l that query row `row` keeps.
ATTNOPS_AVX512_INLINE __mmask16 keptKeys(const BandLanes& b, int64_t key0, int64_t row) {
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i diff = _mm512_add_epi32(_mm512_set1_epi32(int32_t(key0 - row)), lane);
    const __mmask16 prefix = tailMask(std::max<int64_t>(0, b.prefixEnd - key0));
    return prefix | (_mm512_cmp_epi32_mask(diff, b.minDiff, _MM_CMPINT_NLT) &
                     _mm512_cmp_epi32_mask(diff, b.maxDiff, _MM_CMPINT_LE));
}

// Whether rows [0, rows) x cols [0, cols) of a row-major array hold finite values only: then a
// zero probability times them is exactly zero, and masked pairs may go through a GEMM.
ATTNOPS_AVX512_INLINE bool allFinite(const float* a, int64_t rows, int64_t cols, int64_t ld) {
    __mmask16 bad = 0;
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; c += kLanes) {
            const __mmask16 mk = tailMask(cols - c);
            const __m512 x = _mm512_maskz_loadu_ps(mk, a + r * ld + c);
            bad |= _mm512_cmp_ps_mask(_mm512_mul_ps(x, zero), zero, _CMP_NEQ_UQ);  // inf * 0, NaN * 0: NaN
        }
    return bad == 0;
}

}  // namespace attnops::cpu::avx512

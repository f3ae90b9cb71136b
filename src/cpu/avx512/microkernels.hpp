// AVX-512 building blocks of the flash-attention kernels: a register-blocked GEMM microkernel
// (fp32 FMA, or vdpbf16ps on bf16 pairs), a vector exp, the sparse-mode band per lane, row
// loaders that convert bf16/fp16 to fp32 on the fly and bf16 pair packing. Every function
// carries the AVX-512 target attribute, so only the files in src/cpu/avx512 include this header
// and only CPUs that pass the isa() probe ever reach them.
//
// Reduction order: each output element of gemm() is a chain of multiply-adds over k ascending,
// so the result of an element depends on neither the register tile it falls in nor the thread
// count.
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

#include "cpu/generic/convert.hpp"
#include "ops/flash_attention_score/params.hpp"
#include "ops/flash_attention_score/semantics.hpp"

// avx512bf16 is in the target of every function so that the GEMM template serves both element
// kinds; its instructions come only from the Bf16PairDot intrinsics (compilers do not synthesise
// them from fp32 code), which run only behind the avx512bf16 check of their kernel entry.
#define ATTNOPS_AVX512_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))
#define ATTNOPS_AVX512_INLINE static inline __attribute__((always_inline)) ATTNOPS_AVX512_FN

namespace attnops::cpu::avx512 {

constexpr int64_t kLanes = 16;       // floats per zmm register
constexpr int kTileRows = 6;         // rows of C held in registers (6 x 4 accumulators + 4 B + 1 A)
constexpr int kTileVectors = 4;      // columns of C held in registers, in zmm vectors (64 floats)

// Keys per block: 128 (measured best at d = 128 on Zen 5: fewer reloads of the query-side
// operands per FLOP than 64), halved down to 16 until an fp32 key and value block take at most a
// quarter of the per-core L2, so that they stay there while the query blocks stream past.
inline int64_t keyBlockRows(int64_t d, int64_t dv, uint64_t l2Bytes) {
    const uint64_t budget = (l2Bytes != 0 ? l2Bytes : uint64_t(1) << 20) / 4;
    int64_t rows = 128;
    while (rows > 16 && uint64_t(rows * (d + dv)) * sizeof(float) > budget) rows /= 2;
    return rows;
}

ATTNOPS_AVX512_INLINE __mmask16 tailMask(int64_t n) {
    return n >= kLanes ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u);
}

// The multiply-accumulate of a GEMM microkernel, on fp32 elements or on bf16 pairs.
struct F32Dot {
    using Elem = float;  // A and B elements
    ATTNOPS_AVX512_INLINE __m512 broadcast(const float* a) { return _mm512_set1_ps(*a); }
    ATTNOPS_AVX512_INLINE __m512 load(__mmask16 mk, const float* b) { return _mm512_maskz_loadu_ps(mk, b); }
    ATTNOPS_AVX512_INLINE __m512 madd(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
};

// Elements are pairs of bf16 (the low half first) packed in 32 bits; vdpbf16ps adds both
// products of a pair to an fp32 lane, so k counts pairs.
struct Bf16PairDot {
    using Elem = uint32_t;
    ATTNOPS_AVX512_INLINE __m512 broadcast(const uint32_t* a) {
        return _mm512_castsi512_ps(_mm512_set1_epi32(int32_t(*a)));
    }
    ATTNOPS_AVX512_INLINE __m512 load(__mmask16 mk, const uint32_t* b) {
        return _mm512_castsi512_ps(_mm512_maskz_loadu_epi32(mk, b));
    }
    ATTNOPS_AVX512_INLINE __m512 madd(__m512 a, __m512 b, __m512 c) {
        return _mm512_dpbf16_ps(c, (__m512bh)a, (__m512bh)b);
    }
};

// C[MR x 16*NV] (+)= A(MR x K) * B(K x 16*NV); A(m, k) = A[m * lda + k], or A[k * lda + m] when
// TransA. The last vector of each row is masked by `last`.
template <typename Dot, int MR, int NV, bool TransA>
ATTNOPS_AVX512_FN static void gemmTile(int64_t k, const typename Dot::Elem* __restrict a, int64_t lda,
                                      const typename Dot::Elem* __restrict b, int64_t ldb, float* __restrict c,
                                      int64_t ldc, __mmask16 last, bool accumulate) {
    const auto mask = [last](int v) { return v == NV - 1 ? last : __mmask16(0xFFFF); };
    __m512 acc[MR][NV];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v)
            acc[i][v] = accumulate ? _mm512_maskz_loadu_ps(mask(v), c + i * ldc + v * kLanes) : _mm512_setzero_ps();
    for (int64_t kk = 0; kk < k; ++kk) {
        __m512 bv[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) bv[v] = Dot::load(mask(v), b + kk * ldb + v * kLanes);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
            const __m512 av = Dot::broadcast(TransA ? a + kk * lda + i : a + i * lda + kk);
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) acc[i][v] = Dot::madd(av, bv[v], acc[i][v]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v)
            _mm512_mask_storeu_ps(c + i * ldc + v * kLanes, mask(v), acc[i][v]);
}

template <typename Dot, int MR, bool TransA>
ATTNOPS_AVX512_FN static void gemmRowStrip(int nv, int64_t k, const typename Dot::Elem* a, int64_t lda,
                                          const typename Dot::Elem* b, int64_t ldb, float* c, int64_t ldc,
                                          __mmask16 last, bool accumulate) {
    switch (nv) {
        case 1: gemmTile<Dot, MR, 1, TransA>(k, a, lda, b, ldb, c, ldc, last, accumulate); break;
        case 2: gemmTile<Dot, MR, 2, TransA>(k, a, lda, b, ldb, c, ldc, last, accumulate); break;
        case 3: gemmTile<Dot, MR, 3, TransA>(k, a, lda, b, ldb, c, ldc, last, accumulate); break;
        default: gemmTile<Dot, MR, 4, TransA>(k, a, lda, b, ldb, c, ldc, last, accumulate); break;
    }
}

// C[m x n] (+)= A(m x k) * B[k x n] with row-major B and C (fp32 out); A as in gemmTile.
template <bool TransA, typename Dot = F32Dot>
ATTNOPS_AVX512_FN static void gemm(int64_t m, int64_t n, int64_t k, const typename Dot::Elem* a, int64_t lda,
                                  const typename Dot::Elem* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
    constexpr int64_t kStripCols = kTileVectors * kLanes;
    for (int64_t n0 = 0; n0 < n; n0 += kStripCols) {
        const int64_t cols = std::min(kStripCols, n - n0);
        const int nv = int((cols + kLanes - 1) / kLanes);
        const __mmask16 last = tailMask(cols - (nv - 1) * kLanes);
        for (int64_t m0 = 0; m0 < m; m0 += kTileRows) {
            const typename Dot::Elem* aTile = TransA ? a + m0 : a + m0 * lda;
            const typename Dot::Elem* bs = b + n0;
            float* ct = c + m0 * ldc + n0;
            switch (std::min<int64_t>(kTileRows, m - m0)) {
                case 1: gemmRowStrip<Dot, 1, TransA>(nv, k, aTile, lda, bs, ldb, ct, ldc, last, accumulate); break;
                case 2: gemmRowStrip<Dot, 2, TransA>(nv, k, aTile, lda, bs, ldb, ct, ldc, last, accumulate); break;
                case 3: gemmRowStrip<Dot, 3, TransA>(nv, k, aTile, lda, bs, ldb, ct, ldc, last, accumulate); break;
                case 4: gemmRowStrip<Dot, 4, TransA>(nv, k, aTile, lda, bs, ldb, ct, ldc, last, accumulate); break;
                case 5: gemmRowStrip<Dot, 5, TransA>(nv, k, aTile, lda, bs, ldb, ct, ldc, last, accumulate); break;
                default: gemmRowStrip<Dot, 6, TransA>(nv, k, aTile, lda, bs, ldb, ct, ldc, last, accumulate); break;
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
        const __m512 sum = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(mk, x + c), _mm512_maskz_loadu_ps(mk, y + c));
        _mm512_mask_storeu_ps(y + c, mk, sum);
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
    return _mm512_cmp_epi32_mask(diff, b.minDiff, _MM_CMPINT_NLT) &
           _mm512_cmp_epi32_mask(diff, b.maxDiff, _MM_CMPINT_LE);
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

}  // namespace attnops::cpu::avx512

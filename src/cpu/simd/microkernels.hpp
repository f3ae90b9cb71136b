// The flash-attention building blocks written once over an instruction-set trait V (vector
// width, load/store/mask/broadcast/fma/compare/convert): a register-blocked GEMM microkernel,
// a vector exp, the sparse-mode band per lane, row loaders that convert fp16/bf16 to fp32 and
// a finiteness test. No intrinsics here: a per-ISA header (cpu/avx512/microkernels.hpp,
// cpu/avx2/simd_avx2.hpp) defines the trait and ATTNOPS_SIMD_FN, the target attribute every
// function below carries, and then includes this file; each translation unit includes one such
// header, so every instantiation is compiled for exactly one instruction set.
//
// Reduction order: each output element of gemm() is a chain of multiply-adds over k ascending,
// so the result of an element depends on neither the register tile it falls in nor the thread
// count.
#pragma once

#ifndef ATTNOPS_SIMD_FN
#error "include an ISA trait header (cpu/avx512/microkernels.hpp, cpu/avx2/simd_avx2.hpp) instead"
#endif

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cpu/generic/convert.hpp"
#include "ops/flash_attention_score/params.hpp"
#include "ops/flash_attention_score/semantics.hpp"

#define ATTNOPS_SIMD_INLINE static inline __attribute__((always_inline)) ATTNOPS_SIMD_FN
// A member step of a kernel policy (FaSteps, PrefillSteps): inlined into the unit loop that calls it.
#define ATTNOPS_SIMD_STEP __attribute__((always_inline)) ATTNOPS_SIMD_FN

namespace attnops::cpu::simd {

// x, rounded: a value the compiler must treat as stored, so that the product it holds is not
// fused with a later addition. GCC contracts a * b + c across statements and intrinsics by
// default (-ffp-contract=fast, in C++ even with -std=c++20); the backward recomputes the
// forward's scores x = s * scale, which the forward rounds (stores) before exp(x - m), and a
// fused s * scale - m differs from that by up to half an ulp of x: exp turns it into a relative
// error of |x| 2^-24 in P (dv wrong at scale 1e4, inf at 1e10; tests/ops/fa_scale_extremes_test.cpp).
// The empty asm costs no instruction.
template <class Vec>
ATTNOPS_SIMD_INLINE Vec rounded(Vec x) {
    __asm__("" : "+v"(x));
    return x;
}

// Keys per block: 128 (measured best at d = 128 on Zen 5: fewer reloads of the query-side
// operands per FLOP than 64), halved down to 16 until an fp32 key and value block take at most a
// quarter of the per-core L2, so that they stay there while the query blocks stream past.
inline int64_t keyBlockRows(int64_t d, int64_t dv, uint64_t l2Bytes) {
    const uint64_t budget = (l2Bytes != 0 ? l2Bytes : uint64_t(1) << 20) / 4;
    int64_t rows = 128;
    while (rows > 16 && uint64_t(rows * (d + dv)) * sizeof(float) > budget) rows /= 2;
    return rows;
}

// n floats rounded up to a whole number of 64-byte lines: scratch arrays start on a line.
inline int64_t alignUp(int64_t n) {
    constexpr int64_t kAlignFloats = 16;
    return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
}

// The multiply-accumulate of a GEMM microkernel on fp32 elements (a per-ISA header may add
// others with the same members, e.g. bf16 pairs).
template <class V>
struct F32Dot {
    using Elem = float;  // A and B elements
    using Vec = typename V::Vec;
    ATTNOPS_SIMD_INLINE Vec broadcast(const float* a) { return V::set1(*a); }
    ATTNOPS_SIMD_INLINE Vec load(const float* b) { return V::load(b); }
    ATTNOPS_SIMD_INLINE Vec loadMasked(typename V::Mask mk, const float* b) { return V::loadMasked(mk, b); }
    ATTNOPS_SIMD_INLINE Vec madd(Vec a, Vec b, Vec c) { return V::fmadd(a, b, c); }
};

// C[MR x lanes*NV] (+)= A(MR x K) * B(K x lanes*NV); A(m, k) = A[m * lda + k], or A[k * lda + m]
// when TransA. With Tail, the last vector of each row is masked by `last`; without, no mask is
// live in the k loop (on AVX2 it would take a 16th register and spill an accumulator).
template <class V, typename Dot, int MR, int NV, bool TransA, bool Tail>
ATTNOPS_SIMD_FN static void gemmTile(int64_t k, const typename Dot::Elem* __restrict a, int64_t lda,
                                     const typename Dot::Elem* __restrict b, int64_t ldb, float* __restrict c,
                                     int64_t ldc, typename V::Mask last, bool accumulate) {
    constexpr int64_t L = V::kLanes;
    typename V::Vec acc[MR][NV];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
            const float* ci = c + i * ldc + v * L;
            acc[i][v] = !accumulate ? V::zero() : Tail && v == NV - 1 ? V::loadMasked(last, ci) : V::load(ci);
        }
    for (int64_t kk = 0; kk < k; ++kk) {
        typename V::Vec bv[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
            const typename Dot::Elem* bk = b + kk * ldb + v * L;
            bv[v] = Tail && v == NV - 1 ? Dot::loadMasked(last, bk) : Dot::load(bk);
        }
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
            const typename V::Vec av = Dot::broadcast(TransA ? a + kk * lda + i : a + i * lda + kk);
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) acc[i][v] = Dot::madd(av, bv[v], acc[i][v]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
            float* ci = c + i * ldc + v * L;
            if (Tail && v == NV - 1)
                V::storeMasked(ci, last, acc[i][v]);
            else
                V::store(ci, acc[i][v]);
        }
}

// A strip of MR rows, nv (1 .. V::kTileVectors) vectors wide.
template <class V, typename Dot, int MR, bool TransA, bool Tail, int NV = 1>
ATTNOPS_SIMD_FN static void gemmRowStrip(int nv, int64_t k, const typename Dot::Elem* a, int64_t lda,
                                         const typename Dot::Elem* b, int64_t ldb, float* c, int64_t ldc,
                                         typename V::Mask last, bool accumulate) {
    if constexpr (NV < V::kTileVectors) {
        if (nv > NV)
            return gemmRowStrip<V, Dot, MR, TransA, Tail, NV + 1>(nv, k, a, lda, b, ldb, c, ldc, last, accumulate);
    }
    gemmTile<V, Dot, MR, NV, TransA, Tail>(k, a, lda, b, ldb, c, ldc, last, accumulate);
}

// A tile of mr (1 .. V::kTileRows) rows.
template <class V, typename Dot, bool TransA, bool Tail, int MR = 1>
ATTNOPS_SIMD_FN static void gemmRows(int mr, int nv, int64_t k, const typename Dot::Elem* a, int64_t lda,
                                     const typename Dot::Elem* b, int64_t ldb, float* c, int64_t ldc,
                                     typename V::Mask last, bool accumulate) {
    if constexpr (MR < V::kTileRows) {
        if (mr > MR) return gemmRows<V, Dot, TransA, Tail, MR + 1>(mr, nv, k, a, lda, b, ldb, c, ldc, last, accumulate);
    }
    gemmRowStrip<V, Dot, MR, TransA, Tail>(nv, k, a, lda, b, ldb, c, ldc, last, accumulate);
}

// C[m x n] (+)= A(m x k) * B[k x n] with row-major B and C (fp32 out); A as in gemmTile.
template <class V, bool TransA, typename Dot = F32Dot<V>>
ATTNOPS_SIMD_FN static void gemm(int64_t m, int64_t n, int64_t k, const typename Dot::Elem* a, int64_t lda,
                                 const typename Dot::Elem* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
    constexpr int64_t L = V::kLanes, kStripCols = V::kTileVectors * L;
    for (int64_t n0 = 0; n0 < n; n0 += kStripCols) {
        const int64_t cols = std::min(kStripCols, n - n0);
        const int nv = int((cols + L - 1) / L);
        const typename V::Mask last = V::tail(cols - (nv - 1) * L);
        const bool tail = cols != nv * L;
        for (int64_t m0 = 0; m0 < m; m0 += V::kTileRows) {
            const typename Dot::Elem* aTile = TransA ? a + m0 : a + m0 * lda;
            const int mr = int(std::min<int64_t>(V::kTileRows, m - m0));
            if (tail)
                gemmRows<V, Dot, TransA, true>(mr, nv, k, aTile, lda, b + n0, ldb, c + m0 * ldc + n0, ldc, last,
                                               accumulate);
            else
                gemmRows<V, Dot, TransA, false>(mr, nv, k, aTile, lda, b + n0, ldb, c + m0 * ldc + n0, ldc, last,
                                                accumulate);
        }
    }
}

// The register tile of the score GEMM S = K . Q^T (rows: keys, columns: query rows); by
// default the trait's GEMM tile. A trait header may specialise it: on AVX2 a 4 x 3-vector tile
// (12 accumulators, 3 loads and 4 broadcasts per 12 FMAs) issues fewer loads per FMA than the
// 6 x 2 one (8 per 12), and 24 columns divide the 120 query rows of a work unit.
template <class V>
struct ScoreTile {
    static constexpr int kRows = V::kTileRows;
    static constexpr int kVectors = V::kTileVectors;
};

// C[m x n] = A(m x k) * B[k x n] as gemm() (same values: every element a chain over k
// ascending), with the register tile ScoreTile<V> where it fits and gemm()'s tiles for the rest.
template <class V, bool TransA>
ATTNOPS_SIMD_FN static void gemmScores(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                                       int64_t ldb, float* c, int64_t ldc) {
    constexpr int MR = ScoreTile<V>::kRows, NV = ScoreTile<V>::kVectors;
    constexpr int64_t W = NV * V::kLanes;
    const int64_t nFull = n / W * W, mFull = m / MR * MR;
    for (int64_t n0 = 0; n0 < nFull; n0 += W)
        for (int64_t m0 = 0; m0 < mFull; m0 += MR)
            gemmTile<V, F32Dot<V>, MR, NV, TransA, false>(k, TransA ? a + m0 : a + m0 * lda, lda, b + n0, ldb,
                                                          c + m0 * ldc + n0, ldc, V::all(), false);
    if (mFull < m && nFull > 0)
        gemm<V, TransA>(m - mFull, nFull, k, TransA ? a + mFull : a + mFull * lda, lda, b, ldb, c + mFull * ldc, ldc,
                        false);
    if (nFull < n) gemm<V, TransA>(m, n - nFull, k, a, lda, b + nFull, ldb, c + nFull, ldc, false);
}

// The column statistics the forward's online softmax takes from a block of scaled scores: per
// column (query row) c, max[c] = the running V::max over the rows (keys) ascending, starting
// from -inf, and per vector of columns, nan[c / kLanes] = the lanes that met a NaN.
template <class V>
struct ColumnStats {
    float* max;
    typename V::Mask* nan;
};

// gemmScores(m, n, k, a, lda, b, ldb, c, ldc) (TransA false) for n a multiple of the columns of
// ScoreTile<V>, with the softmax's first pass done while each tile is still in registers:
// C = scale * (A . B), the same product (each element is one chain over k ascending, then one
// multiply by scale), and `stats` updated with the max and NaN lanes of every scaled element, rows
// ascending within each column as a separate pass over C would (so even the sign of a zero
// maximum is the same). Rows past the last whole tile (m not a multiple of its rows: AVX-512's
// 6-row tile against 128 keys) go through gemm() and are scaled and reduced right after it, still
// last in each column. This saves the pass that reloaded, scaled and stored the 60 KiB block of
// scores from L2 (fa_forward.hpp: softmaxBlock).
template <class V>
ATTNOPS_SIMD_FN static void gemmScoresScaledMax(int64_t m, int64_t n, int64_t k, const float* __restrict a,
                                                int64_t lda, const float* __restrict b, int64_t ldb,
                                                float* __restrict c, int64_t ldc, float scale,
                                                const ColumnStats<V>& stats) {
    constexpr int MR = ScoreTile<V>::kRows, NV = ScoreTile<V>::kVectors;
    constexpr int64_t L = V::kLanes, W = NV * L;
    const int64_t mFull = m / MR * MR;
    for (int64_t n0 = 0; n0 < n; n0 += W) {
        for (int64_t m0 = 0; m0 < mFull; m0 += MR) {
            const float* am = a + m0 * lda;
            typename V::Vec acc[MR][NV];
#pragma GCC unroll 8
            for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
                for (int v = 0; v < NV; ++v) acc[i][v] = V::zero();
            for (int64_t kk = 0; kk < k; ++kk) {  // gemmTile's loop: one chain per element, k ascending
                typename V::Vec bv[NV];
#pragma GCC unroll 4
                for (int v = 0; v < NV; ++v) bv[v] = V::load(b + kk * ldb + n0 + v * L);
#pragma GCC unroll 8
                for (int i = 0; i < MR; ++i) {
                    const typename V::Vec av = V::set1(am[i * lda + kk]);
#pragma GCC unroll 4
                    for (int v = 0; v < NV; ++v) acc[i][v] = V::fmadd(av, bv[v], acc[i][v]);
                }
            }
            const auto scaleV = V::set1(scale);
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) {
                const int64_t col = n0 + v * L;
                auto colMax = V::load(stats.max + col);
                auto colNan = stats.nan[col / L];
#pragma GCC unroll 8
                for (int i = 0; i < MR; ++i) {
                    const auto x = V::mul(acc[i][v], scaleV);
                    V::store(c + (m0 + i) * ldc + col, x);
                    colNan = V::maskOr(colNan, V::isNan(x));
                    colMax = V::max(colMax, x);
                }
                V::store(stats.max + col, colMax);
                stats.nan[col / L] = colNan;
            }
        }
        if (mFull == m) continue;
        gemm<V, false>(m - mFull, W, k, a + mFull * lda, lda, b + n0, ldb, c + mFull * ldc + n0, ldc, false);
        const auto scaleV = V::set1(scale);
        for (int64_t v = 0; v < NV; ++v) {
            const int64_t col = n0 + v * L;
            auto colMax = V::load(stats.max + col);
            auto colNan = stats.nan[col / L];
            for (int64_t i = mFull; i < m; ++i) {
                const auto x = V::mul(V::load(c + i * ldc + col), scaleV);
                V::store(c + i * ldc + col, x);
                colNan = V::maskOr(colNan, V::isNan(x));
                colMax = V::max(colMax, x);
            }
            V::store(stats.max + col, colMax);
            stats.nan[col / L] = colNan;
        }
    }
}

// exp(x) / 2^n for n = round(x log2(e)) (integral, as a float): the Cody-Waite reduction
// r = x - n ln2 and the degree-7 polynomial of exp(r), without the scaling by 2^n.
template <class V>
ATTNOPS_SIMD_INLINE typename V::Vec expPolynomial(typename V::Vec x, typename V::Vec n) {
    auto r = V::fnmadd(n, V::set1(0.693359375f), x);
    r = V::fnmadd(n, V::set1(-2.12194440e-4f), r);
    auto poly = V::set1(1.0f / 5040.0f);
    poly = V::fmadd(poly, r, V::set1(1.0f / 720.0f));
    poly = V::fmadd(poly, r, V::set1(1.0f / 120.0f));
    poly = V::fmadd(poly, r, V::set1(1.0f / 24.0f));
    poly = V::fmadd(poly, r, V::set1(1.0f / 6.0f));
    poly = V::fmadd(poly, r, V::set1(0.5f));
    poly = V::fmadd(poly, r, V::set1(1.0f));
    return V::fmadd(poly, r, V::set1(1.0f));
}

// The core of exp below for x in [-87.3, 88.7]: Cody-Waite reduction, degree-7 polynomial,
// poly * 2^n. The forward's expNonPositive gives the same bits.
template <class V>
ATTNOPS_SIMD_INLINE typename V::Vec expReduced(typename V::Vec x) {
    const auto n = V::roundNearest(V::mul(x, V::set1(1.44269504088896341f)));
    return V::ldexp(expPolynomial<V>(x, n), n);
}

// exp(x) lane-wise, the algorithm of cpu::fastExp (Cody-Waite reduction, degree-7 polynomial):
// below -87.3 gives 0 (so -inf gives 0), NaN gives NaN. V::ldexp(poly, n) = poly * 2^n.
template <class V>
ATTNOPS_SIMD_INLINE typename V::Vec exp(typename V::Vec x) {
    const auto lo = V::set1(-87.3f), hi = V::set1(88.7f);
    const auto nan = V::isNan(x);
    const auto live = V::greater(x, lo);
    const auto input = x;
    x = V::min(x, hi);  // live lanes are > -87.3 already
    const auto result = V::zeroUnless(live, expReduced<V>(x));
    return V::select(nan, result, input);
}

// y[c] += a * x[c], c < n. Whole vectors are stored unmasked and only a tail vector masked:
// AMD cores microcode the AVX2 masked store (vmaskmovps, 3-4 ns more each than a plain store on
// Zen 3, bench/results/amd-epyc-zen3-avx2/masked_store_cost.cpp), and the backward's row steps
// call this per kept (row, key) pair.
template <class V>
ATTNOPS_SIMD_INLINE void axpy(int64_t n, float a, const float* __restrict x, float* __restrict y) {
    const auto av = V::set1(a);
    int64_t c = 0;
    for (; c + V::kLanes <= n; c += V::kLanes) V::store(y + c, V::fmadd(av, V::load(x + c), V::load(y + c)));
    if (c < n) {
        const auto mk = V::tail(n - c);
        V::storeMasked(y + c, mk, V::fmadd(av, V::loadMasked(mk, x + c), V::loadMasked(mk, y + c)));
    }
}

// y[c] *= a, c < n (whole vectors unmasked, as axpy).
template <class V>
ATTNOPS_SIMD_INLINE void scaleRow(int64_t n, float a, float* y) {
    const auto av = V::set1(a);
    int64_t c = 0;
    for (; c + V::kLanes <= n; c += V::kLanes) V::store(y + c, V::mul(av, V::load(y + c)));
    if (c < n) {
        const auto mk = V::tail(n - c);
        V::storeMasked(y + c, mk, V::mul(av, V::loadMasked(mk, y + c)));
    }
}

// One row of a strided view as fp32: unit-stride fp16 through the ISA's half conversion, the
// rest through cpu::loadRow (bf16 is a shift, vectorised by the compiler under this target).
template <class V>
ATTNOPS_SIMD_INLINE void loadRow(const fa::View4& view, int64_t b, int64_t n, int64_t row, int64_t cols,
                                 float* __restrict dst) {
    if (view.dtype == DType::F16 && view.stride[3] == 1 && cols > 0) {
        V::widenHalves(static_cast<const uint16_t*>(view.data) + view.offset(b, n, row, 0), cols, dst);
        return;
    }
    cpu::loadRow(view.data, view.offset(b, n, row, 0), view.stride[3], view.dtype, cols, dst);
}

// Rows from row0 of head n where they are stored, when loadRows would copy them unchanged (fp32,
// unit column stride, rows adjacent: BNSD): their address; otherwise nullptr. Rows further apart
// (BSH, TND) are copied: rows a multiple of 4 KiB apart would share L1 sets.
inline const float* storedFloatRows(const fa::View4& view, int64_t b, int64_t n, int64_t row0, int64_t cols) {
    if (view.dtype != DType::F32 || view.stride[3] != 1 || view.stride[2] != cols || view.data == nullptr)
        return nullptr;
    return static_cast<const float*>(view.data) + view.offset(b, n, row0, 0);
}

// Rows [row0, row0 + rows) of head n, row-major with leading dimension ld.
template <class V>
ATTNOPS_SIMD_INLINE void loadRows(const fa::View4& view, int64_t b, int64_t n, int64_t row0, int64_t rows, int64_t cols,
                                  int64_t ld, float* __restrict dst) {
    for (int64_t r = 0; r < rows; ++r) loadRow<V>(view, b, n, row0 + r, cols, dst + r * ld);
}

// The same rows transposed: dst[c * ld + r]; `row` is a scratch row of at least cols floats.
template <class V>
ATTNOPS_SIMD_INLINE void loadRowsTransposed(const fa::View4& view, int64_t b, int64_t n, int64_t row0, int64_t rows,
                                            int64_t cols, int64_t ld, float* __restrict row, float* __restrict dst) {
    for (int64_t r = 0; r < rows; ++r) {
        loadRow<V>(view, b, n, row0 + r, cols, row);
        for (int64_t c = 0; c < cols; ++c) dst[c * ld + r] = row[c];
    }
}

// Width of the column strips of the packed B operands: one register tile's columns.
template <class V>
constexpr int64_t stripWidth() {
    return V::kTileVectors * V::kLanes;
}

// kLanes unit-stride elements of dtype Src at src as fp32 (Src: float, or uint16_t with Half
// telling fp16 from bf16).
template <class V, class Src, bool Half>
ATTNOPS_SIMD_INLINE typename V::Vec loadWide(const Src* src) {
    if constexpr (std::is_same_v<Src, float>)
        return V::load(src);
    else if constexpr (Half)
        return V::loadHalf(src);
    else
        return V::loadBf16(src);
}

// Unit-stride rows of Src as fp32 in column strips (see loadRowsStrips); the tail of each row
// (cols not a multiple of kLanes) converted element by element, the same values.
template <class V, class Src, bool Half>
ATTNOPS_SIMD_INLINE void packUnitStrips(const Src* src, int64_t rowStride, int64_t rows, int64_t cols,
                                        float* __restrict dst) {
    constexpr int64_t W = stripWidth<V>(), L = V::kLanes;
    const int64_t full = cols / L * L;
    for (int64_t r = 0; r < rows; ++r) {
        const Src* in = src + r * rowStride;
        float* out = dst + r * W;
        int64_t c = 0;
        // Whole strips first, a strip's vectors at consecutive addresses (no index arithmetic
        // per vector: the division and multiply took 10 instructions per 8 floats on AVX2).
        for (float* strip = out; c + W <= full; c += W, strip += rows * W)
#pragma GCC unroll 4
            for (int64_t w = 0; w < W; w += L) V::store(strip + w, loadWide<V, Src, Half>(in + c + w));
        for (; c < full; c += L) V::store(out + (c / W) * rows * W + c % W, loadWide<V, Src, Half>(in + c));
        for (; c < cols; ++c) {
            float x;
            if constexpr (std::is_same_v<Src, float>)
                x = in[c];
            else if constexpr (Half)
                x = f16ToFloat(in[c]);
            else
                x = bf16ToFloat(in[c]);
            out[(c / W) * rows * W + c % W] = x;
        }
        for (; c % W != 0; ++c) out[(c / W) * rows * W + c % W] = 0.0f;
    }
}

// Rows [row0, row0 + rows) of head n as fp32 in column strips of W = stripWidth<V>() columns,
// each strip contiguous: dst[s * rows * W + r * W + w] = row r, column s * W + w, zero past cols.
// A GEMM over one strip walks W * 4 bytes per row consecutively: a row-major block whose rows
// are a multiple of 512 bytes apart would map a strip's rows into 1/8 of the L1 sets and evict
// itself (Zen 3, L1d 32 KiB 8-way: 27% of the P.V loads missed L1 before the packing).
template <class V>
ATTNOPS_SIMD_INLINE void loadRowsStrips(const fa::View4& view, int64_t b, int64_t n, int64_t row0, int64_t rows,
                                        int64_t cols, float* __restrict dst) {
    constexpr int64_t W = stripWidth<V>();
    if (rows <= 0 || cols <= 0) return;
    const int64_t at = view.offset(b, n, row0, 0), rs = view.stride[2];
    if (view.stride[3] == 1) {
        if (view.dtype == DType::F32)
            return packUnitStrips<V, float, false>(static_cast<const float*>(view.data) + at, rs, rows, cols, dst);
        const uint16_t* src = static_cast<const uint16_t*>(view.data) + at;
        if (view.dtype == DType::BF16) return packUnitStrips<V, uint16_t, false>(src, rs, rows, cols, dst);
        if (view.dtype == DType::F16) return packUnitStrips<V, uint16_t, true>(src, rs, rows, cols, dst);
    }
    for (int64_t r = 0; r < rows; ++r)  // strided columns: element by element
        for (int64_t c = 0; c < (cols + W - 1) / W * W; ++c)
            dst[(c / W) * rows * W + r * W + c % W] = c < cols ? view.load(b, n, row0 + r, c) : 0.0f;
}

// The same rows row-major with leading dimension cols (unit-stride rows converted or copied a
// vector at a time), for the A operand of S = K . Q^T. fp32 rows are copied by the vector loop
// too, not by loadRows' memcpy per row: a 128 x 128 fp32 key block read from L3/DRAM took 4.0-4.8
// instead of 5.5-5.9 us (a libc call per 512-byte row; AMD EPYC Zen 3, one thread, under load,
// bench/results/amd-epyc-zen3-avx2/fwd_s11_block_parts.cpp). The same values (a copy).
template <class V>
ATTNOPS_SIMD_INLINE void loadRowsFast(const fa::View4& view, int64_t b, int64_t n, int64_t row0, int64_t rows,
                                      int64_t cols, float* __restrict dst) {
    constexpr int64_t L = V::kLanes;
    if (rows <= 0 || cols <= 0) return;
    if (view.stride[3] != 1 || cols % L != 0) return loadRows<V>(view, b, n, row0, rows, cols, cols, dst);
    const int64_t rs = view.stride[2];
    if (view.dtype == DType::F32) {
        const float* src = static_cast<const float*>(view.data) + view.offset(b, n, row0, 0);
        for (int64_t r = 0; r < rows; ++r)
#pragma GCC unroll 4
            for (int64_t c = 0; c < cols; c += L) V::store(dst + r * cols + c, V::load(src + r * rs + c));
        return;
    }
    const uint16_t* src = static_cast<const uint16_t*>(view.data) + view.offset(b, n, row0, 0);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; c += L)
            V::store(dst + r * cols + c, view.dtype == DType::BF16 ? loadWide<V, uint16_t, false>(src + r * rs + c)
                                                                   : loadWide<V, uint16_t, true>(src + r * rs + c));
}

// y[c] *= a for c < n: whole vectors unmasked (a masked store is microcoded on AMD cores).
template <class V>
ATTNOPS_SIMD_INLINE void scaleRowUnmasked(int64_t n, float a, float* y) {
    const auto av = V::set1(a);
    int64_t c = 0;
    for (; c + V::kLanes <= n; c += V::kLanes) V::store(y + c, V::mul(av, V::load(y + c)));
    for (; c < n; ++c) y[c] *= a;
}

// C[m x n] (+)= A(m x k) * B with B packed by loadRowsStrips (n columns; its strips of
// stripRows >= k rows, 0 meaning k: the first k rows of a block packed with more); A and C as in
// gemm.
template <class V, bool TransA, typename Dot = F32Dot<V>>
ATTNOPS_SIMD_FN static void gemmStrips(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* bs,
                                       float* c, int64_t ldc, bool accumulate, int64_t stripRows = 0) {
    constexpr int64_t W = stripWidth<V>();
    constexpr int MR = V::kTileRows, NV = V::kTileVectors;
    const int64_t strip = (stripRows > 0 ? stripRows : k) * W;  // floats from one strip to the next
    if (m % MR == 0 && n % W == 0) {
        // Whole register tiles only (the forward's 120 rows x Dv = 128): gemm's tiles called
        // directly, without its per-tile dispatch on the tile's rows and width; the same tiles and
        // operations. P.V of a 120 x 128 block took about 1% less time (AMD EPYC Zen 3, one
        // thread, under load, bench/results/amd-epyc-zen3-avx2/fwd_s11_pv_tile.cpp).
        for (int64_t c0 = 0; c0 < n; c0 += W)
            for (int64_t m0 = 0; m0 < m; m0 += MR)
                gemmTile<V, Dot, MR, NV, TransA, false>(k, TransA ? a + m0 : a + m0 * lda, lda, bs + (c0 / W) * strip,
                                                        W, c + m0 * ldc + c0, ldc, V::all(), accumulate);
        return;
    }
    for (int64_t c0 = 0; c0 < n; c0 += W)
        gemm<V, TransA, Dot>(m, std::min(W, n - c0), k, a, lda, bs + (c0 / W) * strip, W, c + c0, ldc, accumulate);
}

// The analytic mask of a sequence (fa::SeqRule) evaluated for V::kLanes (query row, key) pairs
// at a time in 32-bit lanes. Usable when both lengths are below 2^28: then every key - row
// difference fits, and clamping the rule's differences to +-2^29 changes no comparison.
template <class V>
struct BandLanes {
    typename V::IVec minDiff, maxDiff;
    int64_t prefixEnd = 0;

    static bool usable(int64_t sq, int64_t skv) {
        constexpr int64_t kMaxLength = int64_t(1) << 28;
        return sq < kMaxLength && skv < kMaxLength;
    }
};

template <class V>
ATTNOPS_SIMD_INLINE BandLanes<V> bandLanes(const fa::SeqRule& rule, int64_t skv) {
    constexpr int64_t kClamp = int64_t(1) << 29;
    BandLanes<V> b;
    b.minDiff = V::set1i(int32_t(std::clamp(rule.minDiff, -kClamp, kClamp)));
    b.maxDiff = V::set1i(int32_t(std::clamp(rule.maxDiff, -kClamp, kClamp)));
    b.prefixEnd = std::min(rule.prefix, skv);
    return b;
}

// Lanes l of query rows row0 + l that keep `key`.
template <class V>
ATTNOPS_SIMD_INLINE typename V::Mask keptRows(const BandLanes<V>& b, int64_t key, int64_t row0) {
    if (key < b.prefixEnd) return V::all();
    const auto diff = V::subi(V::set1i(int32_t(key - row0)), V::laneIndex());
    return V::inRange(diff, b.minDiff, b.maxDiff);
}

// Lanes l of keys key0 + l that query row `row` keeps.
template <class V>
ATTNOPS_SIMD_INLINE typename V::Mask keptKeys(const BandLanes<V>& b, int64_t key0, int64_t row) {
    const auto diff = V::addi(V::set1i(int32_t(key0 - row)), V::laneIndex());
    const auto prefix = V::tail(std::max<int64_t>(0, b.prefixEnd - key0));
    return V::maskOr(prefix, V::inRange(diff, b.minDiff, b.maxDiff));
}

// Whether rows [0, rows) x cols [0, cols) of a row-major array hold finite values only: then a
// zero probability times them is exactly zero, and masked pairs may go through a GEMM.
template <class V>
ATTNOPS_SIMD_INLINE bool allFinite(const float* a, int64_t rows, int64_t cols, int64_t ld) {
    auto bad = V::none();
    const auto zero = V::zero();
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; c += V::kLanes) {
            const auto mk = V::tail(cols - c);
            const auto x = V::loadMasked(mk, a + r * ld + c);
            bad = V::maskOr(bad, V::notEqual(V::mul(x, zero), zero));  // inf * 0, NaN * 0: NaN
        }
    return !V::any(bad);
}

}  // namespace attnops::cpu::simd

// The forward's vector steps for blocks with a pse, an explicit attenMask or dropout: the online
// softmax of a block of raw scores St[key][query row] (rows as the V::kLanes lanes of a vector,
// the layout of fa_forward.hpp's softmaxBlock) with the semantics and the bits of the row steps
// (tile::finishScores, tile::updateRowSoftmax, dropoutKeepRow in cpu/generic/score_row.hpp),
// so that FlashAttentionScore forwards with those and FusedInferAttentionScore's prefill route
// (pseShift, masks whose content is read) run their softmax vectorised instead of a row at a time.
//
// Per group of V::kLanes query rows, the pse, mask and keep values of each row are read (or
// computed) contiguously over the block's keys, converted to fp32 and written transposed into
// small [key][lane] tables; the passes over the block then read one vector per key:
//   1. s = scale * (s + before) + after (pseTerm's formula, the same rounding) or s * scale,
//      -inf where the band, the prefix or the explicit mask drops the pair; the row maximum with
//      the row steps' rule ((s > max || s != s) ? s : max: the first of equal values, NaN wins);
//   2. e = exp(s - mNew) with cpu::fastExp's bits (rowExp below, NaN passed through),
//      0 where dropped, summed in key order, then the keep bit: e * invKeepProb or 0.
// Rows that keep no key of the block are left untouched (their lanes get alpha = 1 and
// probability 0), as the row steps skip them.
//
// The caller (runUnitWith) multiplies P.V with a GEMM over every key of the block, so a dropped
// key adds 0 * v: it takes these steps only where the value block is finite (or nothing is
// dropped). One difference in bits remains possible: an accumulator element that is exactly -0
// (an underflowed rescale) becomes +0 when a dropped key's 0 * v is added to it, where the row
// steps skip the key and keep -0.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include "cpu/generic/convert.hpp"
#include "cpu/simd/microkernels.hpp"
#include "ops/flash_attention_score/kernel.hpp"
#include "ops/flash_attention_score/params.hpp"
#include "ops/flash_attention_score/semantics.hpp"

namespace attnops::fa::simd_bias {

namespace simd = cpu::simd;

// Keys of a block the per-lane tables hold (the forward's key blocks have at most 128,
// simd::keyBlockRows); larger blocks keep the row steps.
constexpr int64_t kMaxBlockKeys = 128;

// Whether the unit loop may take these steps for a problem (pse, explicit mask or dropout) with
// key blocks of `keyRows` and sequence lengths sq, skv (the band's lanes are int32); not when
// p.rowSteps (ATTNOPS_FA_ROW_STEPS=1) sends them through the row steps.
template <class V>
inline bool usable(const ForwardParams& p, int64_t keyRows, int64_t sq, int64_t skv) {
    const bool bias = p.pse.form != PseForm::None || p.mask.explicitMask || p.dropout.enabled;
    return bias && keyRows <= kMaxBlockKeys && simd::BandLanes<V>::usable(sq, skv) && !p.rowSteps;
}

// cpu::fastExp for x <= 0 or NaN, a vector at a time, with its operations in its order as the
// compilers build it (GCC contracts a * b + c in C++, clang within an expression): n from
// fma(x, log2e, 1.5 * 2^23) - 1.5 * 2^23, the reduction and the polynomial as FMAs, poly * 2^n;
// 0 below -87.3; NaN comes back as it came in. tests/ops/fa_bias_steps_test.cpp checks the bits
// against fastExp's on every 37th float x <= 0 and where rounding n once or twice differs.
template <class V>
ATTNOPS_SIMD_INLINE typename V::Vec rowExp(typename V::Vec x) {
    const auto shifter = V::set1(12582912.0f);  // 1.5 * 2^23
    const auto n = V::sub(V::fmadd(x, V::set1(1.44269504088896341f), shifter), shifter);
    const auto e = V::zeroUnless(V::greater(x, V::set1(-87.3f)), V::ldexp(simd::expPolynomial<V>(x, n), n));
    return V::select(V::isNan(x), e, x);
}

// The pse values of row i (sequence-local) of head n1 against keys [k0, k0 + nk), as pseTerm
// reads or computes them one at a time (the term before or after the scale; see pseBefore), at
// the addresses of pseRowAddress. Compressed alibi columns outside the table are 0: only masked
// pairs have them (checked).
ATTNOPS_SIMD_INLINE void pseRow(const ForwardParams& p, int64_t b, int64_t n1, int64_t i, int64_t k0, int64_t nk,
                                float* __restrict row) {
    const PseSpec& s = p.pse;
    const View4& v = s.view;
    switch (s.form) {
        case PseForm::None: std::fill(row, row + nk, 0.0f); return;
        case PseForm::Dense:
        case PseForm::TndDense:
        case PseForm::TndRowBroadcast: {
            const PseRowAddress a = pseRowAddress(p, b, n1, i, k0);
            cpu::loadRow(v.data, a.at, a.step, v.dtype, nk, row);
            return;
        }
        case PseForm::CompressedAlibi: {
            const KeyRange k = compressedKeys(s.compressedCols, i, k0, nk);
            std::fill(row, row + nk, 0.0f);
            if (k.hi > k.lo) {
                const PseRowAddress a = pseRowAddress(p, b, n1, i, k.lo);
                cpu::loadRow(v.data, a.at, a.step, v.dtype, k.hi - k.lo, row + (k.lo - k0));
            }
            return;
        }
        case PseForm::Slopes: {
            const double slope = double(v.load(b, n1, 0, 0));
            const int64_t rowPos = i + s.qStartIdx, keyPos = k0 + s.kvStartIdx;
            constexpr int64_t kSmall = int64_t(1) << 29;  // |keyPos - rowPos| + nk stays below 2^31
            if (std::abs(rowPos) < kSmall && std::abs(keyPos) < kSmall && nk < kSmall) {
                // Positions this small are exact in double and so is their difference: the
                // distance as an int32 converts to the same double, in a loop the compiler
                // vectorises (AVX2 converts int32 to double, not int64).
                // (One loop per type: the constant type leaves the sqrt out of type 2's loop.)
                const int32_t first = int32_t(keyPos - rowPos);
                if (s.type == 3)
                    for (int32_t j = 0; j < int32_t(nk); ++j) row[j] = slopeTerm(slope, 3, std::fabs(double(first + j)));
                else
                    for (int32_t j = 0; j < int32_t(nk); ++j) row[j] = slopeTerm(slope, 2, std::fabs(double(first + j)));
                return;
            }
            for (int64_t j = 0; j < nk; ++j)
                row[j] = slopeTerm(slope, s.type, std::fabs(double(keyPos + j) - double(rowPos)));
            return;
        }
    }
}

// Whether pseTerm returns the value as `before` (added to the raw score before the scale).
inline bool pseBefore(const PseSpec& s) { return s.form != PseForm::Slopes && s.type == 1; }

// The explicit mask bits of row i (sequence-local) of head n1 for keys [k0, k0 + nk), as
// explicitMasked reads them: 1 = masked.
ATTNOPS_SIMD_INLINE void maskRow(const ForwardParams& p, int64_t b, int64_t n1, int64_t i, int64_t k0, int64_t nk,
                                 uint8_t* __restrict row) {
    const MaskSpec& m = p.mask;
    int64_t r = i, c = k0;
    if (m.maskGlobalRows) {
        r += p.seq.qStart[size_t(b)];
        c += p.seq.kvStart[size_t(b)];
    }
    const uint8_t* src = m.maskData + b * m.maskStride[0] + n1 * m.maskStride[1] + r * m.maskStride[2] + c * m.maskStride[3];
    for (int64_t j = 0; j < nk; ++j) row[j] = src[j * m.maskStride[3]] != 0 ? 1 : 0;
}

// The bias values of one query row over the keys of a block, as fp32 rows over the keys: the pse
// term, the explicit mask (1 kept by it, 0 masked), the keep bit of dropout (1 / 0). The
// backward's key units read them as they are (their scores are [row][key]); LaneTables below
// transposes them for the [key][row] layouts.
struct RowBias {
    alignas(64) float pse[kMaxBlockKeys];
    alignas(64) float unmasked[kMaxBlockKeys];
    alignas(64) float keep[kMaxBlockKeys];
    alignas(64) uint8_t bits[kMaxBlockKeys];

    // Row i (sequence-local) of head n1 against keys [k0, k0 + nk): only the parts the problem has.
    template <class V>
    ATTNOPS_SIMD_STEP void fill(const ForwardParams& p, int64_t b, int64_t n1, int64_t i, int64_t k0, int64_t nk) {
        if (p.pse.form != PseForm::None) pseRow(p, b, n1, i, k0, nk, pse);
        if (p.mask.explicitMask) {
            maskRow(p, b, n1, i, k0, nk, bits);
            for (int64_t j = 0; j < nk; ++j) unmasked[j] = bits[j] != 0 ? 0.0f : 1.0f;
        }
        if (p.dropout.enabled) {
            if constexpr (requires { typename V::PhiloxKeep; })
                dropoutKeepRow(p, b, n1, i, k0, nk, bits, typename V::PhiloxKeep{});
            else
                dropoutKeepRow(p, b, n1, i, k0, nk, bits);
            for (int64_t j = 0; j < nk; ++j) keep[j] = bits[j] != 0 ? 1.0f : 0.0f;
        }
    }
};

// Per-lane tables of one group of V::kLanes query rows over the keys of a block, [key][lane]:
// RowBias's rows transposed, and after pass 1 of the forward whether the pair is kept at all
// (1 / 0).
template <class V>
struct LaneTables {
    static constexpr int64_t L = V::kLanes;
    alignas(64) float pse[kMaxBlockKeys * L];
    alignas(64) float unmasked[kMaxBlockKeys * L];
    alignas(64) float keep[kMaxBlockKeys * L];
    alignas(64) float kept[kMaxBlockKeys * L];
    RowBias row;  // one row before it is transposed

    // The tables of rows i0 + lane, lane < live, of head n1 against keys [k0, k0 + nk); lanes
    // from `live` on hold neutral values (nothing masked, pse 0: their results are not used).
    ATTNOPS_SIMD_STEP void fill(const ForwardParams& p, int64_t b, int64_t n1, int64_t i0, int64_t live, int64_t k0,
                                  int64_t nk) {
        const bool hasPse = p.pse.form != PseForm::None, explicitMask = p.mask.explicitMask;
        const bool dropout = p.dropout.enabled;
        if (live < L) {
            if (hasPse) std::fill(pse, pse + nk * L, 0.0f);
            if (explicitMask) std::fill(unmasked, unmasked + nk * L, 1.0f);
            if (dropout) std::fill(keep, keep + nk * L, 0.0f);
        }
        for (int64_t lane = 0; lane < live; ++lane) {
            row.template fill<V>(p, b, n1, i0 + lane, k0, nk);
            if (hasPse)
                for (int64_t j = 0; j < nk; ++j) pse[j * L + lane] = row.pse[j];
            if (explicitMask)
                for (int64_t j = 0; j < nk; ++j) unmasked[j * L + lane] = row.unmasked[j];
            if (dropout)
                for (int64_t j = 0; j < nk; ++j) keep[j * L + lane] = row.keep[j];
        }
    }
};

// The finished score of a vector of pairs: scale * (s + before) + after with the pse term of
// pseBefore's side (pseTerm's formula, rounded as the row steps round it), or s * scale.
template <class V>
ATTNOPS_SIMD_INLINE typename V::Vec finishedScore(typename V::Vec s, typename V::Vec scale, bool pse, bool before,
                                                  const float* term) {
    if (!pse) return simd::rounded(V::mul(s, scale));  // rounded as the row step's stored score
    const auto t = V::load(term), zero = V::zero();
    // pseTerm's {before, after} with the other one 0, added as the row step adds it.
    return simd::rounded(V::fmadd(scale, V::add(s, before ? t : zero), before ? zero : t));
}

// The online softmax of a block of raw scores with pse, explicit mask and dropout: rows [0, rows)
// of st (st[j * ld + r], keys k0 + j, sequence-local query rows q0 + r of head n1 of sequence b)
// become the probabilities that multiply V (dropout applied), m and l are updated, the
// accumulator rows (acc, [rows][p.dv]) rescaled. `full`: every pair of the block is inside the
// band (or prefix); otherwise `band` decides per lane. The row steps' results, bit for bit.
template <class V>
ATTNOPS_SIMD_INLINE void softmaxBlock(const ForwardParams& p, int64_t b, int64_t n1, const simd::BandLanes<V>& band, bool full,
                                  int64_t q0, int64_t rows, int64_t k0, int64_t nk, int64_t ld, float* st, float* m,
                                  float* l, float* acc) {
    constexpr int64_t L = V::kLanes;
    LaneTables<V> t;
    const bool pse = p.pse.form != PseForm::None, before = pseBefore(p.pse);
    const bool explicitMask = p.mask.explicitMask, dropout = p.dropout.enabled;
    const auto scale = V::set1(p.scale), negInf = V::set1(-std::numeric_limits<float>::infinity()), zero = V::zero(), one = V::set1(1.0f);
    const auto invKeep = V::set1(p.dropout.invKeepProb);
    for (int64_t r0 = 0; r0 < rows; r0 += L) {
        t.fill(p, b, n1, q0 + r0, std::min(L, rows - r0), k0, nk);
        // Pass 1: finished scores, the pairs kept, the row maximum over them.
        auto rowMax = negInf;
        for (int64_t j = 0; j < nk; ++j) {
            float* at = st + j * ld + r0;
            auto x = finishedScore<V>(V::load(at), scale, pse, before, t.pse + j * L);
            auto kept = full ? V::all() : simd::keptRows<V>(band, k0 + j, q0 + r0);
            if (explicitMask) kept = V::maskAnd(kept, V::notEqual(V::load(t.unmasked + j * L), zero));
            x = V::select(kept, negInf, x);
            V::store(at, x);
            V::store(t.kept + j * L, V::select(kept, zero, one));
            rowMax = V::select(V::maskOr(V::greater(x, rowMax), V::isNan(x)), rowMax, x);
        }
        // Lanes with no kept key keep m, l and the accumulator (alpha 1, probabilities 0).
        const auto active = V::notEqual(rowMax, negInf);
        const auto mOld = V::load(m + r0);
        const auto mNew = V::select(V::maskAnd(active, V::maskOr(V::greater(rowMax, mOld), V::isNan(rowMax))), mOld, rowMax);
        const auto alphaRow = V::zeroUnless(V::notEqual(mOld, negInf), rowExp<V>(V::sub(mOld, mNew)));
        const auto alpha = V::select(active, one, alphaRow);
        // Pass 2: probabilities, their sum in key order, then the keep bits.
        auto sum = zero;
        for (int64_t j = 0; j < nk; ++j) {
            float* at = st + j * ld + r0;
            const auto kept = V::notEqual(V::load(t.kept + j * L), zero);
            // Inactive lanes (every score of the block -inf, some of them kept keys whose pse is
            // -inf) get 0 as the row steps, which skip such a row's block: with mNew = -inf their
            // exp would be NaN.
            auto e = V::zeroUnless(V::maskAnd(kept, active), rowExp<V>(V::sub(V::load(at), mNew)));
            sum = V::add(sum, e);
            if (dropout) e = V::zeroUnless(V::notEqual(V::load(t.keep + j * L), zero), V::mul(e, invKeep));
            V::store(at, e);
        }
        V::store(l + r0, V::select(active, V::load(l + r0), V::fmadd(V::load(l + r0), alpha, sum)));
        V::store(m + r0, mNew);
        alignas(64) float alphas[L];
        V::store(alphas, alpha);
        // Rows whose maximum did not move keep their accumulator (times 1: the same bits).
        for (int64_t r = r0; r < std::min(rows, r0 + L); ++r)
            if (alphas[r - r0] != 1.0f) simd::scaleRowUnmasked<V>(p.dv, alphas[r - r0], acc + r * p.dv);
    }
}

}  // namespace attnops::fa::simd_bias

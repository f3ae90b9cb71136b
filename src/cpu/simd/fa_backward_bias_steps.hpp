// The backward's vector steps for blocks with a pse, an explicit attenMask or dropout: the
// probabilities and dS of a block of raw scores S and dP with the semantics and the bits of the
// row steps (tile::rowGradients in cpu/generic/score_row.hpp and the key unit's sums after it),
// so that FlashAttentionScoreGrad with those runs its blocks through the GEMMs of
// cpu/simd/fa_backward.hpp instead of a row at a time. The pse, mask and keep values come from
// the forward's tables (cpu/simd/fa_bias_steps.hpp): RowBias rows for the key units' [row][key]
// scores, LaneTables for the query units' [key][row] ones.
//
// Per pair, as the row steps: x = scale * (s + before) + after (or s * scale), dropped where the
// band, the prefix or the explicit mask drops the pair; P = fastExp(x - m) / l; with dropout
// dP_d = keep ? dP / keepProb : 0 and P_d = keep ? P / keepProb : 0 (the factor of dV);
// dS = P * (dP_d - delta), stored times the scale. Dropped pairs get P = dS = 0, and so do the
// rows the row steps skip: a saved sum of 0, or no kept key with x != -inf in the block.
//
// The GEMMs after these steps multiply every pair of the block, so a dropped pair adds 0 * q,
// 0 * dO or 0 * k where the row steps skip it: the caller takes these steps only where Q, dO and
// (for dQ) K are finite, and V too with a sink (the row steps' sum_j P dP_d multiplies a dropped
// pair's dP by 0). As in the forward, an accumulator element that is exactly -0 can become +0.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "cpu/simd/fa_bias_steps.hpp"
#include "cpu/simd/microkernels.hpp"
#include "ops/flash_attention_score/params.hpp"

namespace attnops::fa::simd_bias {

// fastExp(x - m): rowExp with x clamped to 88.7 first as fastExp clamps it (x - m > 0 only with
// statistics that are not the forward's). min returns its second operand, x, when x is NaN.
template <class V>
ATTNOPS_SIMD_INLINE typename V::Vec expOfShifted(typename V::Vec x, typename V::Vec m) {
    return rowExp<V>(V::min(V::set1(88.7f), V::sub(x, m)));
}

// The per-row constants of the steps.
template <class V>
struct GradientConstants {
    typename V::Vec scale, invKeep, negInf, zero;
    bool pse, before, explicitMask, dropout;

    ATTNOPS_SIMD_STEP explicit GradientConstants(const ForwardParams& p)
        : scale(V::set1(p.scale)),
          invKeep(V::set1(p.dropout.invKeepProb)),
          negInf(V::set1(-std::numeric_limits<float>::infinity())),
          zero(V::zero()),
          pse(p.pse.form != PseForm::None),
          before(pseBefore(p.pse)),
          explicitMask(p.mask.explicitMask),
          dropout(p.dropout.enabled) {}
};

// Query row i (sequence-local) of head n1 of sequence b against keys [k0, k0 + nk) of a key
// unit: s (raw scores, [nk]) becomes P_d, dp (raw dP) scale * dS; band: the sparse mode's band,
// null when the block keeps every pair by it. m, l: the row's saved statistics, delta its
// rowsum(dO * O). With exactDelta, adds sum_j P dP_d in key order (tile::rowGradients' sum).
// Whole vectors are loaded and stored up to nk rounded up to kLanes (s and dp rows are padded);
// lanes past nk count as dropped.
template <class V>
ATTNOPS_SIMD_INLINE void rowGradients(const ForwardParams& p, const GradientConstants<V>& c, int64_t b, int64_t n1,
                                      const simd::BandLanes<V>* band, int64_t i, int64_t k0, int64_t nk, float m,
                                      float l, float delta, float* s, float* dp, RowBias& t, float* exactDelta) {
    constexpr int64_t L = V::kLanes;
    if (l == 0.0f) {  // fully masked row: the row steps skip it
        std::fill(s, s + nk, 0.0f);
        std::fill(dp, dp + nk, 0.0f);
        return;
    }
    t.template fill<V>(p, b, n1, i, k0, nk);
    const auto vm = V::set1(m), invL = V::set1(1.0f / l), vd = V::set1(delta);
    auto live = V::none();
    // P and dP_d of the kept pairs (0 elsewhere) for the sum in key order, when there is one.
    alignas(64) float probs[kMaxBlockKeys], grads[kMaxBlockKeys];
    for (int64_t j = 0; j < nk; j += L) {
        const auto x = finishedScore<V>(V::load(s + j), c.scale, c.pse, c.before, t.pse + j);
        auto kept = band != nullptr ? simd::keptKeys<V>(*band, k0 + j, i) : V::all();
        if (j + L > nk) kept = V::maskAnd(kept, V::tail(nk - j));
        if (c.explicitMask) kept = V::maskAnd(kept, V::notEqual(V::load(t.unmasked + j), c.zero));
        live = V::maskOr(live, V::maskAnd(kept, V::notEqual(x, c.negInf)));
        const auto pr = V::zeroUnless(kept, V::mul(expOfShifted<V>(x, vm), invL));
        auto g = V::load(dp + j);
        auto pd = pr;
        if (c.dropout) {
            const auto keep = V::notEqual(V::load(t.keep + j), c.zero);
            g = V::zeroUnless(keep, V::mul(g, c.invKeep));
            pd = V::zeroUnless(keep, V::mul(pr, c.invKeep));
        }
        if (exactDelta != nullptr) {
            V::store(probs + j, pr);
            V::store(grads + j, V::zeroUnless(kept, g));
        }
        V::store(dp + j, V::zeroUnless(kept, V::mul(V::mul(pr, V::sub(g, vd)), c.scale)));
        V::store(s + j, pd);
    }
    if (!V::any(live)) {  // no key of the block kept with x != -inf: the row steps skip the row
        std::fill(s, s + nk, 0.0f);
        std::fill(dp, dp + nk, 0.0f);
        return;
    }
    if (exactDelta != nullptr) {
        float sum = 0.0f;
        for (int64_t j = 0; j < nk; ++j) sum = __builtin_fmaf(probs[j], grads[j], sum);
        *exactDelta += sum;
    }
}

// The same for a query unit's [key][row] block (st: raw scores, dpt: raw dP, leading dimension
// ld; query rows row0 + r, r < rows, of head n1; keys k0 + j, j < nk): dpt becomes scale * dS
// (a query unit adds only dS . K). rowMax, rowSum, delta: the rows' saved statistics and deltas;
// with exactDelta, adds each row's sum_j P dP_d (one chain per lane over the keys ascending: the
// row steps' order).
template <class V>
ATTNOPS_SIMD_INLINE void blockGradientsTransposed(const ForwardParams& p, int64_t b, int64_t n1,
                                                  const simd::BandLanes<V>* band, int64_t row0, int64_t rows,
                                                  int64_t k0, int64_t nk, const float* st, float* dpt, int64_t ld,
                                                  const float* rowMax, const float* rowSum, const float* deltas,
                                                  float* exactDelta, LaneTables<V>& t) {
    constexpr int64_t L = V::kLanes;
    const GradientConstants<V> c(p);
    for (int64_t r0 = 0; r0 < rows; r0 += L) {
        t.fill(p, b, n1, row0 + r0, std::min(L, rows - r0), k0, nk);
        const auto m = V::load(rowMax + r0), l = V::load(rowSum + r0), delta = V::load(deltas + r0);
        const auto invL = V::div(V::set1(1.0f), l);
        const auto rowsKept = V::maskAnd(V::tail(rows - r0), V::notEqual(l, c.zero));  // saved sum 0: skipped
        auto live = V::none();
        auto sumPdP = c.zero;
        for (int64_t j = 0; j < nk; ++j) {
            const auto x = finishedScore<V>(V::load(st + j * ld + r0), c.scale, c.pse, c.before, t.pse + j * L);
            auto kept = band != nullptr ? V::maskAnd(rowsKept, simd::keptRows<V>(*band, k0 + j, row0 + r0)) : rowsKept;
            if (c.explicitMask) kept = V::maskAnd(kept, V::notEqual(V::load(t.unmasked + j * L), c.zero));
            live = V::maskOr(live, V::maskAnd(kept, V::notEqual(x, c.negInf)));
            const auto pr = V::zeroUnless(kept, V::mul(expOfShifted<V>(x, m), invL));
            auto g = V::load(dpt + j * ld + r0);
            if (c.dropout) g = V::zeroUnless(V::notEqual(V::load(t.keep + j * L), c.zero), V::mul(g, c.invKeep));
            sumPdP = V::fmadd(pr, V::zeroUnless(kept, g), sumPdP);
            V::store(dpt + j * ld + r0, V::zeroUnless(kept, V::mul(V::mul(pr, V::sub(g, delta)), c.scale)));
        }
        // Rows with no key kept with x != -inf: the row steps skip them (their dS here is 0 or,
        // from a non-finite dP, NaN).
        const auto one = V::set1(1.0f);
        const auto dead = V::maskAnd(V::tail(rows - r0), V::notEqual(V::select(live, c.zero, one), one));
        if (V::any(dead))
            for (int64_t j = 0; j < nk; ++j) V::store(dpt + j * ld + r0, V::zeroUnless(live, V::load(dpt + j * ld + r0)));
        if (exactDelta != nullptr) {
            const auto old = V::load(exactDelta + r0);
            V::store(exactDelta + r0, V::select(live, old, V::add(old, sumPdP)));
        }
    }
}

}  // namespace attnops::fa::simd_bias

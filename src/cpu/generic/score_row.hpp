// Steps on one row of scores shared by the tiled and the AVX-512 forward and backward kernels:
// Q.K^T against a transposed key block; scale, pse and mask; the online-softmax update and the
// store of a forward row; the probabilities and dS of a backward row. Functions are static and
// always inlined, so each ISA-specific entry point compiles its own copy (no inline function is
// shared between translation units built for different instruction sets).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu/generic/convert.hpp"
#include "cpu/generic/fast_exp.hpp"
#include "ops/flash_attention_score/kernel.hpp"
#include "ops/flash_attention_score/params.hpp"
#include "ops/flash_attention_score/semantics.hpp"

#define ATTNOPS_INLINE static inline __attribute__((always_inline))

namespace attnops::fa::tile {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// s[j] = q . kt[:, j] for j < nk, head dim ascending (kt is [d][keyRows]).
ATTNOPS_INLINE void rowScores(const float* __restrict q, const float* __restrict kt, int64_t d, int64_t nk,
                              int64_t keyRows, float* __restrict s) {
    for (int64_t j = 0; j < nk; ++j) s[j] = 0.0f;
    for (int64_t c = 0; c < d; ++c) {
        const float qc = q[c];
        const float* __restrict krow = kt + c * keyRows;
        for (int64_t j = 0; j < nk; ++j) s[j] += qc * krow[j];
    }
}

// Applies scale, pse and the mask to raw scores of row i against keys [k0, k0 + nk) of sequence
// b; kept[j] says whether key k0 + j takes part. Masked scores become -inf. Returns the row max
// over kept keys (-inf if none; NaN if a kept score is NaN).
ATTNOPS_INLINE float finishScores(const ForwardParams& p, int64_t b, int64_t n1, const SeqRule& rule, int64_t i,
                                  int64_t k0, int64_t nk, int64_t skv, float* s, uint8_t* kept) {
    const KeyRange band = rowBand(rule, i, skv);
    const int64_t prefixEnd = std::min(rule.prefix, skv);
    for (int64_t j = 0; j < nk; ++j) {
        const int64_t key = k0 + j;
        kept[j] = ((key >= band.lo && key < band.hi) || key < prefixEnd) ? 1 : 0;
    }
    if (p.mask.explicitMask)
        for (int64_t j = 0; j < nk; ++j)
            if (kept[j] && explicitMasked(p, b, n1, i, k0 + j)) kept[j] = 0;
    if (p.pse.form == PseForm::None) {
        for (int64_t j = 0; j < nk; ++j) s[j] *= p.scale;
    } else {
        for (int64_t j = 0; j < nk; ++j) {
            if (!kept[j]) continue;
            const PseTerm t = pseTerm(p, b, n1, i, k0 + j);
            s[j] = p.scale * (s[j] + t.before) + t.after;
        }
    }
    float rowMax = kNegInf;
    for (int64_t j = 0; j < nk; ++j) {
        s[j] = kept[j] ? s[j] : kNegInf;
        rowMax = (s[j] > rowMax || s[j] != s[j]) ? s[j] : rowMax;
    }
    return rowMax;
}

// Loads rows [row0, row0 + rows) of head n of a strided view as fp32, row-major [rows][cols].
ATTNOPS_INLINE void loadRows(const View4& view, int64_t b, int64_t n, int64_t row0, int64_t rows, int64_t cols,
                             float* __restrict dst) {
    for (int64_t r = 0; r < rows; ++r)
        cpu::loadRow(view.data, view.offset(b, n, row0 + r, 0), view.stride[3], view.dtype, cols, dst + r * cols);
}

// The same rows transposed: dst[c * ld + r]. cols <= kMaxHeadDim.
ATTNOPS_INLINE void loadRowsTransposed(const View4& view, int64_t b, int64_t n, int64_t row0, int64_t rows,
                                       int64_t cols, int64_t ld, float* __restrict dst) {
    float row[kMaxHeadDim];
    for (int64_t r = 0; r < rows; ++r) {
        cpu::loadRow(view.data, view.offset(b, n, row0 + r, 0), view.stride[3], view.dtype, cols, row);
        for (int64_t c = 0; c < cols; ++c) dst[c * ld + r] = row[c];
    }
}

// Online-softmax update of one row with the finished scores of a key block: s becomes the
// probabilities that multiply V (masked keys 0, dropout applied), m and l are updated. Returns
// the factor alpha by which the row's accumulator must be rescaled before P.V is added.
ATTNOPS_INLINE float updateRowSoftmax(const ForwardParams& p, const WorkUnit& u, int64_t n1, int64_t i, int64_t k0,
                                      int64_t nk, float rowMax, float* __restrict s, const uint8_t* kept,
                                      uint8_t* keep, float& m, float& l) {
    const float mNew = (rowMax > m || rowMax != rowMax) ? rowMax : m;
    const float alpha = m == kNegInf ? 0.0f : cpu::fastExp(m - mNew);
    float sum = 0.0f;
    for (int64_t j = 0; j < nk; ++j) {
        const float e = cpu::fastExp(s[j] - mNew);
        s[j] = kept[j] ? e : 0.0f;
    }
    for (int64_t j = 0; j < nk; ++j) sum += s[j];
    l = l * alpha + sum;
    m = mNew;
    if (p.dropout.enabled) {
        dropoutKeepRow(p, u.b, n1, i, k0, nk, keep);
        for (int64_t j = 0; j < nk; ++j) s[j] = keep[j] ? s[j] * p.dropout.invKeepProb : 0.0f;
    }
    return alpha;
}

// updateRowSoftmax, then acc = alpha * acc + P.V over the kept keys.
ATTNOPS_INLINE void accumulateRow(const ForwardParams& p, const WorkUnit& u, int64_t n1, int64_t i, int64_t k0,
                                  int64_t nk, float rowMax, float* __restrict s, const uint8_t* kept,
                                  uint8_t* keep, const float* __restrict v, float& m, float& l,
                                  float* __restrict acc) {
    const float alpha = updateRowSoftmax(p, u, n1, i, k0, nk, rowMax, s, kept, keep, m, l);
    const int64_t dv = p.dv;
    for (int64_t c = 0; c < dv; ++c) acc[c] *= alpha;
    for (int64_t j = 0; j < nk; ++j) {
        if (!kept[j]) continue;  // masked keys never touch the output
        const float pj = s[j];
        const float* __restrict vrow = v + j * dv;
        for (int64_t c = 0; c < dv; ++c) acc[c] += pj * vrow[c];
    }
}

// The learnable sink of head n1 joins a finished row's softmax: m becomes max(m, sink), l and acc
// are rescaled to it (computed against the larger, so that exp never overflows).
ATTNOPS_INLINE void joinSink(const ForwardParams& p, int64_t n1, float& m, float& l, float* acc) {
    if (p.sink == nullptr) return;
    const float sink = p.sink[n1 * p.sinkStride];
    const float mFinal = sink > m ? sink : m;
    const float old = m == kNegInf ? 0.0f : std::exp(m - mFinal);
    l = l * old + std::exp(sink - mFinal);
    for (int64_t c = 0; c < p.dv; ++c) acc[c] *= old;
    m = mFinal;
}

// softmaxMax and softmaxSum of row `row` (absolute) of head n1, when the call writes them.
ATTNOPS_INLINE void storeRowStats(const ForwardParams& p, int64_t b, int64_t n1, int64_t row, float m, float l) {
    if (!p.writeStats) return;
    for (int64_t lane = 0; lane < p.statLanes; ++lane) {
        p.softmaxMax.store(b, n1, row, lane, m);
        p.softmaxSum.store(b, n1, row, lane, l);
    }
}

ATTNOPS_INLINE void storeRow(const ForwardParams& p, const WorkUnit& u, int64_t n1, int64_t i, float m, float l,
                             float* acc) {
    joinSink(p, n1, m, l, acc);
    const int64_t row = p.seq.qStart[size_t(u.b)] + i;
    const float inv = l != 0.0f ? 1.0f / l : 0.0f;  // l == 0: no key kept; NaN propagates
    for (int64_t c = 0; c < p.dv; ++c) p.out.store(u.b, n1, row, c, l != 0.0f ? acc[c] * inv : 0.0f);
    storeRowStats(p, u.b, n1, row, m, l);
}

// Gradients of row i against keys [k0, k0 + nk) from its raw scores s = q . k and dp = dO . v:
// probabilities P (in s), dS (in dp) and, if dropout is on, the keep flags; adds
// sum_j P_d * dP_d to *exactDelta when given. Returns false if no key of the block is kept.
ATTNOPS_INLINE bool rowGradients(const BackwardParams& bp, int64_t b, int64_t n1, const SeqRule& rule, int64_t i,
                                 int64_t k0, int64_t nk, int64_t skv, float m, float l, float delta,
                                 float* __restrict s, float* __restrict dp, uint8_t* kept, uint8_t* keep,
                                 float* exactDelta) {
    const ForwardParams& p = bp.fwd;
    const float rowMax = finishScores(p, b, n1, rule, i, k0, nk, skv, s, kept);
    if (rowMax == kNegInf) return false;
    const float invL = 1.0f / l;
    for (int64_t j = 0; j < nk; ++j) {
        const float e = cpu::fastExp(s[j] - m) * invL;
        s[j] = kept[j] ? e : 0.0f;
    }
    if (p.dropout.enabled) {
        dropoutKeepRow(p, b, n1, i, k0, nk, keep);
        for (int64_t j = 0; j < nk; ++j) dp[j] = keep[j] ? dp[j] * p.dropout.invKeepProb : 0.0f;
    }
    if (exactDelta != nullptr) {  // sum_j P_d dP_d = sum_j P dP (the keep factors pair up)
        // One chain of fused multiply-adds, written out: whether a compiler contracts sum += a * b
        // depends on how it vectorises the loop (GCC: products as vectors, then adds in order;
        // clang: FMAs), and the vector steps (cpu/simd/fa_backward_bias_steps.hpp) give these bits.
        float sum = 0.0f;
        for (int64_t j = 0; j < nk; ++j) sum = __builtin_fmaf(s[j], dp[j], sum);
        *exactDelta += sum;
    }
    for (int64_t j = 0; j < nk; ++j) dp[j] = s[j] * (dp[j] - delta);
    return true;
}

// dsink's per-row terms of query rows [q0, q0 + rows) of head n1 (spec: dsink = -sum over rows of
// pSink * delta, delta recomputed exactly as sum_j P dP): written to their own slots, summed later
// in a fixed order by the driver.
ATTNOPS_INLINE void writeSinkRowTerms(const BackwardParams& bp, int64_t b, int64_t n1, int64_t q0, int64_t rows,
                                      const float* rowMax, const float* rowSum, const float* exactDelta) {
    const ForwardParams& p = bp.fwd;
    const float sink = p.sink[n1 * p.sinkStride];
    for (int64_t r = 0; r < rows; ++r) {
        const float pSink = rowSum[r] != 0.0f ? std::exp(sink - rowMax[r]) / rowSum[r] : 0.0f;
        bp.sinkRowTerms[bp.sinkRowIndex(b, q0 + r) * p.n1 + n1] = -pSink * exactDelta[r];
    }
}

}  // namespace attnops::fa::tile

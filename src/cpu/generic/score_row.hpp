// Steps on one row of scores shared by the tiled forward and backward kernels: Q.K^T against a
// transposed key block, then scale, pse and mask. Functions are static and always inlined, so
// each ISA-specific entry point compiles its own copy (no inline function is shared between
// translation units built for different instruction sets).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "cpu/generic/convert.hpp"
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

}  // namespace attnops::fa::tile

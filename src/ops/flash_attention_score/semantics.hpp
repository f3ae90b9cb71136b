// What FlashAttentionScore computes, element by element: the sparse-mode mask rule, the pse
// term and the dropout keep bit. Kernels and the reference both use these, so the rules live
// here once (spec sections 2.5-2.7a with section 0).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/philox.hpp"
#include "ops/flash_attention_score/params.hpp"

namespace attnops::fa {

// Token counts are clamped to +-2^60 so that band arithmetic (sums of a few such values and row
// indices) never overflows; INT64_MAX-style defaults mean "unbounded".
constexpr int64_t kUnbounded = int64_t(1) << 60;
inline int64_t clampTokens(int64_t v) { return std::clamp(v, -kUnbounded, kUnbounded); }

// The analytic mask of one sequence in top-left coordinates: key j is kept for query i iff
// minDiff <= j - i <= maxDiff, or j < prefix. (The explicit mask, if any, applies on top.)
struct SeqRule {
    int64_t minDiff = -kUnbounded;
    int64_t maxDiff = kUnbounded;
    int64_t prefix = 0;

    bool keeps(int64_t i, int64_t j) const {
        const int64_t diff = j - i;
        return (diff >= minDiff && diff <= maxDiff) || j < prefix;
    }
};

inline SeqRule seqRule(const MaskSpec& m, int64_t b, int64_t sq, int64_t skv) {
    const int64_t d = skv - sq;  // bottom-right origin offset
    const int64_t pre = clampTokens(m.preTokens), next = clampTokens(m.nextTokens);
    const SeqRule causalTopLeft{-kUnbounded, 0, 0};
    const SeqRule causalBottomRight{-kUnbounded, d, 0};
    const SeqRule bandBottomRight{d - pre, d + next, 0};
    switch (m.sparseMode) {
        case 0: return SeqRule{-pre, next, 0};
        case 1: return SeqRule{};
        case 2: return causalTopLeft;
        case 3: return causalBottomRight;
        case 4: return bandBottomRight;
        case 5:
        case 6: return SeqRule{-kUnbounded, d, m.prefix.empty() ? 0 : m.prefix[size_t(b)]};
        case 7: return b == m.lastNonEmpty ? bandBottomRight : causalBottomRight;
        case 8: return b == m.firstNonEmpty ? bandBottomRight : causalTopLeft;
        default: return SeqRule{};
    }
}

// Keys a block of query rows [i0, i1) may attend: the hull [lo, hi) of the band and the prefix.
struct KeyRange {
    int64_t lo = 0, hi = 0;
};

inline KeyRange keyRange(const SeqRule& r, int64_t i0, int64_t i1, int64_t skv) {
    KeyRange band{std::max<int64_t>(0, i0 + std::max(r.minDiff, -kUnbounded)),
                  std::min<int64_t>(skv, (i1 - 1) + r.maxDiff + 1)};
    if (i1 <= i0 || r.minDiff > r.maxDiff || band.hi < band.lo) band = {0, 0};
    const int64_t prefixEnd = std::min(r.prefix, skv);
    if (prefixEnd <= 0) return band;
    if (band.hi <= band.lo) return {0, prefixEnd};
    return {0, std::max(prefixEnd, band.hi)};
}

// Keys [lo, hi) of one row that the band alone keeps (the prefix adds [0, prefix)).
inline KeyRange rowBand(const SeqRule& r, int64_t i, int64_t skv) {
    KeyRange k{std::max<int64_t>(0, i + r.minDiff), std::min<int64_t>(skv, i + r.maxDiff + 1)};
    if (k.hi < k.lo) k.hi = k.lo;
    return k;
}

// Whether every query row of [q0, q1) keeps every key of [k0, k1) by the analytic rule alone.
inline bool blockFullyKept(const SeqRule& rule, int64_t q0, int64_t q1, int64_t k0, int64_t k1, int64_t skv) {
    const int64_t prefixEnd = std::min(rule.prefix, skv);
    if (k1 <= prefixEnd) return true;
    const KeyRange first = rowBand(rule, q0, skv), last = rowBand(rule, q1 - 1, skv);
    return std::max(k0, prefixEnd) >= last.lo && k1 <= first.hi;
}

// Explicit attenMask bit (modes 0, 1, 5): true = masked. i, j are sequence-local.
inline bool explicitMasked(const ForwardParams& p, int64_t b, int64_t n1, int64_t i, int64_t j) {
    const MaskSpec& m = p.mask;
    if (!m.explicitMask) return false;
    int64_t row = i, col = j;
    if (m.maskGlobalRows) {
        row += p.seq.qStart[size_t(b)];
        col += p.seq.kvStart[size_t(b)];
    }
    return m.maskData[b * m.maskStride[0] + n1 * m.maskStride[1] + row * m.maskStride[2] + col * m.maskStride[3]] != 0;
}

// The pse term of score (i, j): S = scale * (R + before) + after. Returns {before, after}.
struct PseTerm {
    float before = 0.0f, after = 0.0f;
};

// Where the stored pse values of row i (sequence-local) of head n1 lie, from key j on: the element
// offset of (i, j) in s.view.data and the step between consecutive keys. For the forms with a
// table (Dense, CompressedAlibi, TndDense, TndRowBroadcast); a compressed alibi column is
// W - 1 - (i - j) and exists for keys in compressedKeys only. pseTerm reads one value here, the
// vector steps (cpu/simd/fa_bias_steps.hpp) a row of them.
struct PseRowAddress {
    int64_t at = 0, step = 0;
};

inline PseRowAddress pseRowAddress(const ForwardParams& p, int64_t b, int64_t n1, int64_t i, int64_t j) {
    const PseSpec& s = p.pse;
    const View4& v = s.view;
    const size_t sb = size_t(b);
    switch (s.form) {
        case PseForm::Dense:
            return {s.physicalRows ? v.offset(b, n1, p.seq.qStart[sb] + i, p.seq.kvStart[sb] + j) : v.offset(b, n1, i, j),
                    v.stride[3]};
        case PseForm::CompressedAlibi: return {v.offset(b, n1, 1023, s.compressedCols - 1 - i + j), v.stride[3]};
        case PseForm::TndDense: {
            const int64_t sq = p.seq.qLen[sb], skv = p.seq.kvLen[sb];
            return {(p.seq.elementBase[sb] + (n1 * sq + i) * skv + j) * v.stride[3], v.stride[3]};
        }
        case PseForm::TndRowBroadcast:
            return {(p.seq.rowBroadcastBase[sb] + n1 * p.seq.kvLen[sb] + j) * v.stride[3], v.stride[3]};
        case PseForm::None:
        case PseForm::Slopes: return {};
    }
    return {};
}

// Keys [lo, hi) of [k0, k0 + nk) that have a compressed alibi column for row i: col = W - 1 -
// (i - j) is in [0, W) for j in [i - W + 1, i]. The others are masked positions only (checked).
inline KeyRange compressedKeys(int64_t w, int64_t i, int64_t k0, int64_t nk) {
    const int64_t lo = std::clamp<int64_t>(i - w + 1, k0, k0 + nk), hi = std::clamp<int64_t>(i + 1, lo, k0 + nk);
    return {lo, hi};
}

// The alibi term -slope * dist (type 2) or -slope * sqrt(dist) (type 3) of a distance dist =
// |key position - row position|, in double, rounded to float once.
inline float slopeTerm(double slope, int64_t type, double dist) {
    return float(-slope * (type == 3 ? std::sqrt(dist) : dist));
}

inline PseTerm pseTerm(const ForwardParams& p, int64_t b, int64_t n1, int64_t i, int64_t j) {
    const PseSpec& s = p.pse;
    float value = 0.0f;
    switch (s.form) {
        case PseForm::None: return {};
        case PseForm::CompressedAlibi: {
            const KeyRange k = compressedKeys(s.compressedCols, i, j, 1);
            if (k.hi <= k.lo) return {};  // masked positions only (checked)
            value = loadAsFloat(s.view.data, pseRowAddress(p, b, n1, i, j).at, s.view.dtype);
            break;
        }
        case PseForm::Dense:
        case PseForm::TndDense:
        case PseForm::TndRowBroadcast:
            value = loadAsFloat(s.view.data, pseRowAddress(p, b, n1, i, j).at, s.view.dtype);
            break;
        case PseForm::Slopes: {
            const double slope = double(s.view.load(b, n1, 0, 0));
            return {0.0f, slopeTerm(slope, s.type, std::fabs(double(j + s.kvStartIdx) - double(i + s.qStartIdx)))};
        }
    }
    if (s.type == 1) return {value, 0.0f};
    return {0.0f, value};
}

// Flat dropout index of (b, n1, i, j).
inline int64_t dropoutIndex(const ForwardParams& p, int64_t b, int64_t n1, int64_t i, int64_t j) {
    const int64_t sq = p.seq.qLen[size_t(b)], skv = p.seq.kvLen[size_t(b)];
    return p.seq.elementBase[size_t(b)] + (n1 * sq + i) * skv + j;
}

inline bool explicitKeepBit(const DropoutSpec& d, int64_t index) {
    return ((d.mask[(index >> 3) * d.maskByteStride] >> (index & 7)) & 1) != 0;
}

// Keep flags (0/1) of the flat indices [first, first + count); whole Philox groups through
// `whole` (DropoutBits::fill).
template <class WholeGroups = DropoutBits::BlockByBlock>
inline void dropoutKeepRange(const DropoutSpec& d, int64_t first, int64_t count, uint8_t* keep, WholeGroups whole = {}) {
    if (d.mask != nullptr) {
        for (int64_t c = 0; c < count; ++c) keep[c] = explicitKeepBit(d, first + c) ? 1 : 0;
    } else {
        DropoutBits(d.seed, d.offset, d.keepThreshold, DropoutBits::Threshold{}).fill(uint64_t(first), count, keep, whole);
    }
}

// Keep flags (0/1) of keys [j0, j0 + count) for row i. With global positions (context
// parallelism) the keys map to global columns that are consecutive in runs (a shard is one or
// two chunks of the global sequence): each run is one range of the global flat index.
template <class WholeGroups = DropoutBits::BlockByBlock>
inline void dropoutKeepRow(const ForwardParams& p, int64_t b, int64_t n1, int64_t i, int64_t j0, int64_t count,
                           uint8_t* keep, WholeGroups whole = {}) {
    const DropoutGlobal& g = p.dropout.global;
    if (!g.enabled) {
        dropoutKeepRange(p.dropout, dropoutIndex(p, b, n1, i, j0), count, keep, whole);
        return;
    }
    const size_t sb = size_t(b);
    const int64_t kvLen = g.kvLen[sb];
    const int64_t rowBase = g.base[sb] + ((g.headOffset + n1) * g.qLen[sb] + g.qRow[size_t(p.seq.qStart[sb] + i)]) * kvLen;
    const int64_t* col = g.kvRow.data() + p.seq.kvStart[sb] + j0;
    for (int64_t c = 0; c < count;) {
        int64_t e = c + 1;
        while (e < count && col[e] == col[e - 1] + 1) ++e;
        dropoutKeepRange(p.dropout, rowBase + col[c], e - c, keep + c, whole);
        c = e;
    }
}

}  // namespace attnops::fa

// The AMX forward with transposed scores, for the problems most calls are: no pse, no explicit
// mask, no dropout (sinks, every sparse mode's band and prefix, GQA, TND and any head dims are
// in). The others take the row-step forward of fa_amx_kernel.hpp (forwardUnit).
//
// Why transposed: the row-step forward computes S = Q.K^T with a query row per tile row, so the
// softmax of a row runs along one row of S, and its max and sum over keys ascending are serial
// chains (about 64 dependent additions a row and block). Here the tiles compute
// S^T = K.Q^T (keys down, query rows across), so 16 query rows sit side by side in a vector:
// every softmax step below is a loop over the rows of a key row, which the compiler vectorises
// for the instruction set of its translation unit (AVX-512 in fa_amx.cpp, SSE2 in the emulated
// build), while each row still sums its keys in ascending order, one addition at a time: the
// same bits on both backends. The products and their operands:
//   S^T  = K . Q^T     A: K rows as stored (packRows)      B: Q in VNNI column pairs, packed once
//   O^T += V^T . P^T   A: V transposed (packRowsTransposed) B: P^T, written in VNNI key pairs by
//                                                            the softmax loop itself
// O^T (dv rows x query rows) stays in scratch; a row's alpha multiplies a column of it, which is a
// vector over rows again. K and V^T are packed once per key block for every head of a pass.
//
// Order of every reduction, fixed per element: TDP chains over k ascending (each in the SDM
// order), the row max and sum over keys ascending, P.V over keys ascending (k chunks ascending).
#pragma once

#ifndef ATTNOPS_AMX_FN
#error "define ATTNOPS_AMX_FN (the attributes of the backend's build) before including fa_amx_forward.hpp"
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cpu/amx/fa_amx_common.hpp"
#include "cpu/amx/lanes.hpp"
#include "core/dtype.hpp"
#include "cpu/generic/score_row.hpp"
#include "ops/flash_attention_score/kernel.hpp"
#include "ops/flash_attention_score/semantics.hpp"

namespace attnops::fa {
namespace {

// Whether a forward takes this kernel: a property of the call, the same for every unit and
// thread count.
inline bool transposedForward(const ForwardParams& p) { return amxTransposedForward(p); }

struct TransposedScratch {
    uint16_t* qb;    // [heads] dChunks x rowTiles B tiles: Q^T
    uint16_t* ka;    // [keyRows][32 dChunks]           K, A of S^T
    uint16_t* vt;    // [16 dvTiles][keyRows]           V^T, A of O^T
    uint16_t* pb;    // keyChunks x rowTiles B tiles    P^T
    float* st;       // [keyRows][rowsPad]              scores, then probabilities
    float* acc;      // [heads][16 dvTiles][rowsPad]    O^T
    float* m;        // [heads][rowsPad]
    float* l;        // [heads][rowsPad]
    float* blockMax; // [rowsPad]
    float* alpha;    // [rowsPad]
    float* vf;       // [keyRows][dv] fp32 V (a block whose values are not all finite)
    float* row;      // [dv] one output row

    TransposedScratch(const ForwardParams& p, TileShape t, Carver& c) {
        const HeadDims h(p);
        const int64_t qr = roundUp(t.queryRows, kTileM), kr = roundUp(t.keyRows, kTileK), heads = headsPerPass(p);
        qb = c.take<uint16_t>(heads * h.dChunks * qr * kTileK);
        ka = c.take<uint16_t>(kr * h.dChunks * kTileK);
        vt = c.take<uint16_t>(h.dvTiles * kTileM * kr);
        pb = c.take<uint16_t>(kr * qr);
        st = c.take<float>(kr * qr);
        acc = c.take<float>(heads * h.dvTiles * kTileM * qr);
        m = c.take<float>(heads * qr);
        l = c.take<float>(heads * qr);
        blockMax = c.take<float>(qr);
        alpha = c.take<float>(qr);
        vf = c.take<float>(kr * h.dv);
        row = c.take<float>(h.dv);
    }
};

using cpu::amx::F16x;
using cpu::amx::I16x;
using cpu::amx::kLanes;
using cpu::amx::loadLanes;
using cpu::amx::select;
using cpu::amx::splat;
using cpu::amx::storeLanes;
using cpu::amx::U16x;

// The 16-bit elements of a dot product from 16 lanes (low halves; cpu::amx::narrow per lane).
template <DotKind kind>
ATTNOPS_AMX_FN U16x narrowLanes(F16x x) {
    if constexpr (kind == DotKind::Bf16) {
        return cpu::amx::bf16Lanes(x);
    } else {
        U16x h{};
        for (int i = 0; i < kLanes; ++i) h[i] = floatToF16(x[i]);
        return h;
    }
}

// Which rows of a block keep key k0 + j: [lo, hi) of its R rows. Row q0 + r keeps the key iff
// minDiff <= key - q0 - r <= maxDiff, or the key is in the prefix.
struct KeptRows {
    int64_t lo, hi;
};
inline KeptRows keptRows(const SeqRule& rule, int64_t q0, int64_t R, int64_t key) {
    if (key < rule.prefix) return {0, R};
    return {std::clamp<int64_t>(key - q0 - rule.maxDiff, 0, R), std::clamp<int64_t>(key - q0 - rule.minDiff + 1, 0, R)};
}
ATTNOPS_AMX_FN inline __attribute__((always_inline)) I16x keptLanes(KeptRows k, int64_t r) {
    const I16x index = cpu::amx::laneIndex() + int32_t(r);
    return (index >= int32_t(k.lo)) & (index < int32_t(k.hi));
}

// Each row's maximum over the block of its kept scaled scores (-inf if it keeps none, NaN if one
// is NaN), keys ascending, from the raw scores [nk keys][R rows] of st, which stay as they are.
// Rounding is monotonic, so for scale > 0 the largest scaled score is the scaled largest raw one
// and for scale < 0 the scaled smallest: the maximum runs over s * sign (exact), times |scale| at
// the end, with the bits of the maximum of the scaled scores (up to the sign of a zero). Scale 0
// maps infinities to NaN: there the maximum runs over the scaled scores themselves.
ATTNOPS_AMX_FN void blockMaxima(const ForwardParams& p, const SeqRule& rule, int64_t q0, int64_t k0, int64_t nk,
                                int64_t R, bool whole, const float* __restrict st, float* __restrict blockMax) {
    const float before = p.scale == 0.0f ? 0.0f : (p.scale > 0.0f ? 1.0f : -1.0f);
    const float after = p.scale == 0.0f ? 1.0f : std::fabs(p.scale);
    for (int64_t r = 0; r < R; r += kLanes) {
        F16x m = splat(tile::kNegInf);
        for (int64_t j = 0; j < nk; ++j) {
            F16x x = loadLanes(st + j * R + r) * before;
            if (!whole) x = select(keptLanes(keptRows(rule, q0, R, k0 + j), r), x, splat(tile::kNegInf));
            m = select((x > m) | (x != x), x, m);
        }
        storeLanes(blockMax + r, m * after);
    }
}

// exp(scale * s - mSub) of key j's 16 rows from r (0 for masked rows and for keys past nk),
// stored over the raw scores where keep.
ATTNOPS_AMX_FN inline __attribute__((always_inline)) F16x probabilityLanes(float scale, const SeqRule& rule, int64_t q0,
                                                                         int64_t k0, int64_t j, int64_t nk, int64_t R,
                                                                         int64_t r, bool whole, F16x mSub,
                                                                         float* __restrict st, bool keep) {
    if (j >= nk) return splat(0.0f);
    F16x x = loadLanes(st + j * R + r) * scale;
    if (!whole) x = select(keptLanes(keptRows(rule, q0, R, k0 + j), r), x, splat(tile::kNegInf));
    const F16x e = cpu::amx::expLanes<false>(x - mSub);
    if (keep) storeLanes(st + j * R + r, e);
    return e;
}

// The online-softmax update of one head's rows with the block's raw scores: m, l and alpha (the
// factor of the accumulator: 0 while nothing was accumulated, 1 where the max did not move), the
// probabilities exp(scale * s - m) of the kept keys (0 for the others and past nk), with tiles as
// the P^T B operand pb (rounded; a pair of keys per lane), without as fp32 in st.
template <DotKind kind>
ATTNOPS_AMX_FN void softmaxBlock(const ForwardParams& p, const SeqRule& rule, int64_t q0, int64_t k0, int64_t nk,
                                 int64_t keyChunks, int64_t R, bool whole, float* __restrict st,
                                 const float* __restrict blockMax, float* __restrict m, float* __restrict l,
                                 float* __restrict alpha, uint16_t* __restrict pb, bool tiles) {
    const int64_t rowTiles = R / kTileN;
    for (int64_t r = 0; r < R; r += kLanes) {
        const F16x mOld = loadLanes(m + r), bm = loadLanes(blockMax + r);
        const F16x mNew = select((bm > mOld) | (bm != bm), bm, mOld);
        const F16x a = select(mOld == tile::kNegInf, splat(0.0f), cpu::amx::expLanes(mOld - mNew));
        storeLanes(alpha + r, a);
        storeLanes(m + r, mNew);
        // A row that kept no key yet subtracts 0: its masked scores (-inf) then give exp 0, as
        // every masked score does, with no test per score (scale * s - m <= 0 or NaN).
        const F16x mSub = select(mNew == tile::kNegInf, splat(0.0f), mNew);
        F16x total = splat(0.0f);
        for (int64_t j = 0; j < keyChunks * kTileK; j += 2) {
            const F16x e0 = probabilityLanes(p.scale, rule, q0, k0, j, nk, R, r, whole, mSub, st, !tiles);
            const F16x e1 = probabilityLanes(p.scale, rule, q0, k0, j + 1, nk, R, r, whole, mSub, st, !tiles);
            total = total + e0;
            total = total + e1;
            // 16 pairs (row r + i: keys j, j + 1) fill one row of a B tile of the chunk
            if (tiles)
                storeLanes(pb + (j / kTileK) * rowTiles * kTileElems + ((j % kTileK) / 2) * kTileK +
                               (r / kTileN) * kTileElems,
                           narrowLanes<kind>(e0) | (narrowLanes<kind>(e1) << 16));
        }
        storeLanes(l + r, loadLanes(l + r) * a + total);
    }
}

template <DotKind kind, class Tiles>
ATTNOPS_AMX_FN void forwardUnitTransposed(const ForwardParams& p, TileShape t, const WorkUnit& u, void* scratch) {
    Carver carver(scratch);
    TransposedScratch sc(p, t, carver);
    const HeadDims h(p);
    const int64_t sq = p.seq.qLen[size_t(u.b)], skv = p.seq.kvLen[size_t(u.b)];
    const SeqRule rule = seqRule(p.mask, u.b, sq, skv);
    const KeyRange keys = keyRange(rule, u.q0, u.q1, skv);
    const int64_t rows = u.q1 - u.q0, rowTiles = tilesOf(rows), R = rowTiles * kTileN;
    const int64_t kr = roundUp(t.keyRows, kTileK), qrPad = roundUp(t.queryRows, kTileM);
    const int64_t lda = h.dChunks * kTileK, dvPad = h.dvTiles * kTileM;
    const int64_t qRow0 = p.seq.qStart[size_t(u.b)] + u.q0;
    for (int64_t g0 = 0; g0 < p.group; g0 += kHeadsPerPass) {
        const int64_t heads = std::min(kHeadsPerPass, p.group - g0);
        for (int64_t g = 0; g < heads; ++g) {
            const int64_t n1 = u.n2 * p.group + g0 + g;
            cpu::amx::packColumnPairs(p.q, u.b, n1, qRow0, rows, h.d, h.dChunks, rowTiles,
                                      sc.qb + g * h.dChunks * qrPad * kTileK);
            std::fill(sc.m + g * qrPad, sc.m + g * qrPad + R, tile::kNegInf);
            std::fill(sc.l + g * qrPad, sc.l + g * qrPad + R, 0.0f);
            std::fill(sc.acc + g * dvPad * qrPad, sc.acc + g * dvPad * qrPad + dvPad * R, 0.0f);
        }
        for (int64_t k0 = keys.lo; k0 < keys.hi; k0 += kr) {
            const int64_t nk = std::min(kr, keys.hi - k0), keyTiles = tilesOf(nk), keyChunks = chunksOf(nk);
            const int64_t ldv = keyChunks * kTileK, kvRow0 = p.seq.kvStart[size_t(u.b)] + k0;
            cpu::amx::packRows(p.k, u.b, u.n2, kvRow0, nk, h.d, keyTiles * kTileM, lda, sc.ka);
            cpu::amx::packRowsTransposed(p.v, u.b, u.n2, kvRow0, nk, h.dv, dvPad, ldv, sc.vt);
            // O^T += V^T.P^T multiplies masked (zero) probabilities by V: only with finite values.
            const bool tiles = allFinite<kind>(sc.vt, dvPad * ldv);
            if (!tiles) tile::loadRows(p.v, u.b, u.n2, kvRow0, nk, h.dv, sc.vf);
            for (int64_t g = 0; g < heads; ++g) {
                float* m = sc.m + g * qrPad;
                float* l = sc.l + g * qrPad;
                float* acc = sc.acc + g * dvPad * qrPad;
                gemm<kind, Tiles>(keyTiles, rowTiles, h.dChunks, sc.ka, lda, sc.qb + g * h.dChunks * qrPad * kTileK,
                                  sc.st, R, false);
                // Every row keeps every key of the block: no test per score.
                const bool whole = blockFullyKept(rule, u.q0, u.q1, k0, k0 + nk, skv);
                blockMaxima(p, rule, u.q0, k0, nk, R, whole, sc.st, sc.blockMax);
                softmaxBlock<kind>(p, rule, u.q0, k0, nk, keyChunks, R, whole, sc.st, sc.blockMax, m, l, sc.alpha,
                                   sc.pb, tiles);
                bool rescale = false;
                for (int64_t r = 0; r < R; r += kLanes) rescale |= cpu::amx::anyLane(loadLanes(sc.alpha + r) != 1.0f);
                if (rescale)  // times 1 changes no bit: skipped while no row's maximum moves
                    for (int64_t c = 0; c < h.dv; ++c)
                        for (int64_t r = 0; r < R; r += kLanes)
                            storeLanes(acc + c * R + r, loadLanes(acc + c * R + r) * loadLanes(sc.alpha + r));
                if (tiles) {
                    gemm<kind, Tiles>(h.dvTiles, rowTiles, keyChunks, sc.vt, ldv, sc.pb, acc, R, true);
                    continue;
                }
                // fp32 steps over the kept keys only (0 * Inf would make NaN where the reference
                // skips the key); rows with no kept key in the block add nothing.
                for (int64_t j = 0; j < nk; ++j)
                    for (int64_t r = 0; r < rows; ++r) {
                        if (sc.blockMax[r] == tile::kNegInf || !rule.keeps(u.q0 + r, k0 + j)) continue;
                        const float pj = sc.st[j * R + r];
                        for (int64_t c = 0; c < h.dv; ++c) acc[c * R + r] += pj * sc.vf[j * h.dv + c];
                    }
            }
        }
        for (int64_t g = 0; g < heads; ++g) {
            const float* acc = sc.acc + g * dvPad * qrPad;
            for (int64_t r = 0; r < rows; ++r) {
                for (int64_t c = 0; c < h.dv; ++c) sc.row[c] = acc[c * R + r];
                tile::storeRow(p, u, u.n2 * p.group + g0 + g, u.q0 + r, sc.m[g * qrPad + r], sc.l[g * qrPad + r],
                               sc.row);
            }
        }
    }
}

}  // namespace
}  // namespace attnops::fa

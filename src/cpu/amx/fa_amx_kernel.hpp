// The AMX flash-attention kernels, forward and backward, written once against the tile
// interface of tiles.hpp and compiled per backend: fa_amx.cpp instantiates them on HwTiles with
// the AVX-512 + AMX target, fa_amx_emulated.cpp on EmuTiles for the x86-64 baseline. The
// including file defines ATTNOPS_AMX_FN, the attributes of every function here (everything has
// internal linkage, so the two builds never meet).
//
// Every product is a GEMM of whole tiles (operands zero-padded by pack.hpp): S = Q.K^T and
// O += P.V in the forward; S, dP = dO.V^T, dV += P^T.dO, dK += dS^T.Q, dQ += dS.K in the backward,
// P and dS rounded to the 16-bit element type (as the naive low-precision computation of the
// tolerance rule rounds them). Scores, the online softmax and the gradients of a row are the
// row steps of score_row.hpp, in fp32, so masks, pse, dropout and sinks follow the one
// definition in semantics.hpp. A block whose operands that multiply masked (zero) probabilities
// are not all finite takes fp32 row steps instead of the P/dS GEMM, because 0 * Inf would make
// NaN where the reference skips the key.
//
// The backward keeps the deterministic unit scheme of the other kernels (fa_backward_tiled.cpp):
// key units own dK/dV rows, query units own dQ rows. Order of every reduction, fixed per element:
// TDP chains over k ascending (each TDP in the SDM order), query heads then query rows ascending
// for dK/dV, keys ascending for dQ and the softmax sums. The TUs are built with
// -ffp-contract=off, so the fp32 steps round identically on both backends and the hardware
// kernels equal the emulated ones bit for bit.
#pragma once

#ifndef ATTNOPS_AMX_FN
#error "define ATTNOPS_AMX_FN (the attributes of the backend's build) before including fa_amx_kernel.hpp"
#endif

#include <algorithm>
#include <vector>
#include <cstdint>

#include "cpu/amx/fa_amx_common.hpp"
#include "cpu/amx/fa_amx_backward.hpp"
#include "cpu/amx/fa_amx_backward_fused.hpp"
#include "cpu/amx/fa_amx_forward.hpp"
#include "cpu/generic/convert.hpp"
#include "cpu/generic/score_row.hpp"
#include "ops/flash_attention_score/kernel.hpp"
#include "ops/flash_attention_score/semantics.hpp"

namespace attnops::fa {
namespace {

using tile::kNegInf;

// 64 query rows (4 row tiles) and 64 keys (4 column tiles of S, 2 k-chunks of P.V) per block.
TileShape amxTile() { return TileShape{64, 64}; }

// --------------------------------------------------------------------------------- forward

struct ForwardScratch {
    uint16_t* qa;   // [heads][queryRows][32 dChunks]  query blocks, A of S = Q.K^T
    uint16_t* kb;   // dChunks x keyTiles B tiles       K^T
    uint16_t* vb;   // keyChunks x dvTiles B tiles      V
    uint16_t* pa;   // [queryRows][keyRows]             P, A of O += P.V
    float* s;       // [queryRows][keyRows]             scores, then probabilities
    float* acc;     // [heads][queryRows][16 dvTiles]
    float* v;       // [keyRows][dv]                    fp32 V for the row steps
    float* m;       // [heads][queryRows]
    float* l;       // [heads][queryRows]
    uint8_t* kept;  // [keyRows]
    uint8_t* keep;  // [keyRows]

    ForwardScratch(const ForwardParams& p, TileShape t, Carver& c) {
        const HeadDims h(p);
        const int64_t qr = t.queryRows, kr = t.keyRows, heads = headsPerPass(p);
        qa = c.take<uint16_t>(heads * qr * h.dChunks * kTileK);
        kb = c.take<uint16_t>(kr * h.dChunks * kTileK);
        vb = c.take<uint16_t>(kr * h.dvTiles * kTileN);
        pa = c.take<uint16_t>(qr * kr);
        s = c.take<float>(qr * kr);
        acc = c.take<float>(heads * qr * h.dvTiles * kTileN);
        v = c.take<float>(kr * h.dv);
        m = c.take<float>(heads * qr);
        l = c.take<float>(heads * qr);
        kept = c.take<uint8_t>(kr);
        keep = c.take<uint8_t>(kr);
    }
};

// One query head's block against one key block: S by tiles, the row steps, then O += P.V by
// tiles (or the fp32 row steps when the value block is not finite: tiles false).
template <DotKind kind, class Tiles>
ATTNOPS_AMX_FN void attendKeyBlock(const ForwardParams& p, const WorkUnit& u, int64_t n1, const SeqRule& rule,
                                   int64_t k0, int64_t nk, int64_t kr, bool tiles, const uint16_t* qa, float* m,
                                   float* l, float* acc, ForwardScratch& sc) {
    const HeadDims h(p);
    const int64_t skv = p.seq.kvLen[size_t(u.b)];
    const int64_t rows = u.q1 - u.q0, rowTiles = tilesOf(rows), ldAcc = h.dvTiles * kTileN;
    gemm<kind, Tiles>(rowTiles, tilesOf(nk), h.dChunks, qa, h.dChunks * kTileK, sc.kb, sc.s, kr, false);
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = u.q0 + r;
        float* s = sc.s + r * kr;
        uint16_t* pRow = sc.pa + r * kr;
        float* accRow = acc + r * ldAcc;
        const float rowMax = tile::finishScores(p, u.b, n1, rule, i, k0, nk, skv, s, sc.kept);
        if (rowMax == kNegInf) {  // nothing kept in this block for this row
            std::fill(pRow, pRow + kr, uint16_t(0));
            continue;
        }
        if (!tiles) {
            tile::accumulateRow(p, u, n1, i, k0, nk, rowMax, s, sc.kept, sc.keep, sc.v, m[r], l[r], accRow);
            continue;
        }
        const float alpha = tile::updateRowSoftmax(p, u, n1, i, k0, nk, rowMax, s, sc.kept, sc.keep, m[r], l[r]);
        for (int64_t c = 0; c < h.dv; ++c) accRow[c] *= alpha;
        for (int64_t j = 0; j < kr; ++j) pRow[j] = j < nk ? cpu::amx::narrow<kind>(s[j]) : uint16_t(0);
    }
    if (tiles) gemm<kind, Tiles>(rowTiles, h.dvTiles, chunksOf(nk), sc.pa, kr, sc.vb, acc, ldAcc, true);
}

template <DotKind kind, class Tiles>
ATTNOPS_AMX_FN void forwardUnit(const ForwardParams& p, TileShape t, const WorkUnit& u, void* scratch) {
    Carver carver(scratch);
    ForwardScratch sc(p, t, carver);
    const HeadDims h(p);
    const int64_t sq = p.seq.qLen[size_t(u.b)], skv = p.seq.kvLen[size_t(u.b)];
    const SeqRule rule = seqRule(p.mask, u.b, sq, skv);
    const KeyRange keys = keyRange(rule, u.q0, u.q1, skv);
    const int64_t rows = u.q1 - u.q0, rowTiles = tilesOf(rows), kr = t.keyRows, qr = t.queryRows;
    const int64_t lda = h.dChunks * kTileK, ldAcc = h.dvTiles * kTileN;
    const int64_t qRow0 = p.seq.qStart[size_t(u.b)] + u.q0;
    std::fill(sc.pa, sc.pa + rowTiles * kTileM * kr, uint16_t(0));  // padding rows stay zero
    for (int64_t g0 = 0; g0 < p.group; g0 += kHeadsPerPass) {
        const int64_t heads = std::min(kHeadsPerPass, p.group - g0);
        for (int64_t g = 0; g < heads; ++g) {
            const int64_t n1 = u.n2 * p.group + g0 + g;
            cpu::amx::packRows(p.q, u.b, n1, qRow0, rows, h.d, rowTiles * kTileM, lda, sc.qa + g * qr * lda);
            std::fill(sc.m + g * qr, sc.m + g * qr + rows, kNegInf);
            std::fill(sc.l + g * qr, sc.l + g * qr + rows, 0.0f);
            std::fill(sc.acc + g * qr * ldAcc, sc.acc + (g * qr + rowTiles * kTileM) * ldAcc, 0.0f);
        }
        for (int64_t k0 = keys.lo; k0 < keys.hi; k0 += kr) {
            const int64_t nk = std::min(kr, keys.hi - k0), keyChunks = chunksOf(nk);
            const int64_t kvRow0 = p.seq.kvStart[size_t(u.b)] + k0;
            cpu::amx::packColumnPairs(p.k, u.b, u.n2, kvRow0, nk, h.d, h.dChunks, tilesOf(nk), sc.kb);
            cpu::amx::packRowPairs(p.v, u.b, u.n2, kvRow0, nk, h.dv, keyChunks, h.dvTiles, sc.vb);
            const bool tiles = allFinite<kind>(sc.vb, keyChunks * h.dvTiles * kTileElems);
            if (!tiles) tile::loadRows(p.v, u.b, u.n2, kvRow0, nk, h.dv, sc.v);
            for (int64_t g = 0; g < heads; ++g)
                attendKeyBlock<kind, Tiles>(p, u, u.n2 * p.group + g0 + g, rule, k0, nk, kr, tiles,
                                            sc.qa + g * qr * lda, sc.m + g * qr, sc.l + g * qr,
                                            sc.acc + g * qr * ldAcc, sc);
        }
        for (int64_t g = 0; g < heads; ++g)
            for (int64_t r = 0; r < rows; ++r)
                tile::storeRow(p, u, u.n2 * p.group + g0 + g, u.q0 + r, sc.m[g * qr + r], sc.l[g * qr + r],
                               sc.acc + (g * qr + r) * ldAcc);
    }
}

// --------------------------------------------------------------------------------- backward

// The arrays of one query head's block in a backward unit.
struct QueryRows {
    uint16_t* qa;       // [queryRows][32 dChunks]   Q, A of S = Q.K^T
    uint16_t* doa;      // [queryRows][32 dvChunks]  dO, A of dP = dO.V^T
    float* dof;         // [queryRows][dv]  fp32 dO rows (delta and the row steps)
    float* dqAcc;       // [queryRows][16 dTiles]
    float* delta;       // [queryRows] rowsum(dO * O)
    float* rowMax;      // [queryRows] saved statistics
    float* rowSum;      // [queryRows]
    float* exactDelta;  // [queryRows] sum_j P_d dP_d (dsink terms)

    QueryRows(const HeadDims& h, int64_t qr, int64_t heads, Carver& c)
        : qa(c.take<uint16_t>(heads * qr * h.dChunks * kTileK)),
          doa(c.take<uint16_t>(heads * qr * h.dvChunks * kTileK)),
          dof(c.take<float>(heads * qr * h.dv)),
          dqAcc(c.take<float>(heads * qr * h.dTiles * kTileN)),
          delta(c.take<float>(heads * qr)),
          rowMax(c.take<float>(heads * qr)),
          rowSum(c.take<float>(heads * qr)),
          exactDelta(c.take<float>(heads * qr)) {}

    // Head g of `heads` such blocks carved together.
    QueryRows head(const HeadDims& h, int64_t qr, int64_t g) const {
        QueryRows r = *this;
        r.qa += g * qr * h.dChunks * kTileK;
        r.doa += g * qr * h.dvChunks * kTileK;
        r.dof += g * qr * h.dv;
        r.dqAcc += g * qr * h.dTiles * kTileN;
        r.delta += g * qr;
        r.rowMax += g * qr;
        r.rowSum += g * qr;
        r.exactDelta += g * qr;
        return r;
    }
};

// One thread's arrays for either kind of backward unit ("rows" are query rows, "keys" key rows).
// A query unit keeps the blocks of up to kHeadsPerPass query heads, so that each key and value
// block is packed once for all of them; a key unit uses the first.
struct BackwardScratch {
    QueryRows query;
    uint16_t* kb;     // dChunks x keyTiles tiles   K^T
    uint16_t* vb;     // dvChunks x keyTiles tiles  V^T
    uint16_t* qb;     // rowChunks x dTiles tiles   Q, B of dK += dS^T.Q (key units)
    uint16_t* dob;    // rowChunks x dvTiles tiles  dO, B of dV += P^T.dO (key units)
    uint16_t* kbr;    // keyChunks x dTiles tiles   K, B of dQ += dS.K (query units)
    uint16_t* pa;     // [max(keyRows, queryRows)]^2 P^T (key units)
    uint16_t* dsa;    // same size                  dS^T (key units) or dS (query units)
    float* s;         // [queryRows][keyRows]       scores, then P (dropout applied)
    float* dp;        // [queryRows][keyRows]       dP, then scale * dS
    float* dkAcc;     // [keyRows][16 dTiles]
    float* dvAcc;     // [keyRows][16 dvTiles]
    float* qf;        // [queryRows][d]   fp32 rows for the row steps
    float* kf;        // [keyRows][d]
    float* out;       // [dv] one row of the forward output
    uint8_t* kept;    // [keyRows]
    uint8_t* keep;    // [keyRows]

    BackwardScratch(const BackwardParams& bp, TileShape t, Carver& c)
        : query(HeadDims(bp.fwd), t.queryRows, headsPerPass(bp.fwd), c) {
        const HeadDims h(bp.fwd);
        const int64_t qr = t.queryRows, kr = t.keyRows, square = std::max(qr, kr) * std::max(qr, kr);
        kb = c.take<uint16_t>(kr * h.dChunks * kTileK);
        vb = c.take<uint16_t>(kr * h.dvChunks * kTileK);
        qb = c.take<uint16_t>(qr * h.dTiles * kTileN);
        dob = c.take<uint16_t>(qr * h.dvTiles * kTileN);
        kbr = c.take<uint16_t>(kr * h.dTiles * kTileN);
        pa = c.take<uint16_t>(square);
        dsa = c.take<uint16_t>(square);
        s = c.take<float>(qr * kr);
        dp = c.take<float>(qr * kr);
        dkAcc = c.take<float>(kr * h.dTiles * kTileN);
        dvAcc = c.take<float>(kr * h.dvTiles * kTileN);
        qf = c.take<float>(qr * h.d);
        kf = c.take<float>(kr * h.d);
        out = c.take<float>(h.dv);
        kept = c.take<uint8_t>(kr);
        keep = c.take<uint8_t>(kr);
    }
};

// Query rows [q0, q0 + rows) of head n1: Q and dO as A operands, fp32 dO rows, delta =
// rowsum(dO * O) (dv ascending) and the saved statistics (lane 0).
ATTNOPS_AMX_FN void loadQueryBlock(const BackwardParams& bp, int64_t b, int64_t n1, int64_t q0, int64_t rows,
                                   const QueryRows& qb, float* outRow) {
    const ForwardParams& p = bp.fwd;
    const HeadDims h(p);
    const int64_t row0 = p.seq.qStart[size_t(b)] + q0, rowsPad = tilesOf(rows) * kTileM;
    cpu::amx::packRows(p.q, b, n1, row0, rows, h.d, rowsPad, h.dChunks * kTileK, qb.qa);
    cpu::amx::packRows(bp.dy, b, n1, row0, rows, h.dv, rowsPad, h.dvChunks * kTileK, qb.doa);
    tile::loadRows(bp.dy, b, n1, row0, rows, h.dv, qb.dof);
    for (int64_t r = 0; r < rows; ++r) {
        cpu::loadRow(p.out.data, p.out.offset(b, n1, row0 + r, 0), p.out.stride[3], p.out.dtype, h.dv, outRow);
        float delta = 0.0f;
        for (int64_t c = 0; c < h.dv; ++c) delta += qb.dof[r * h.dv + c] * outRow[c];
        qb.delta[r] = delta;
        qb.rowMax[r] = loadAsFloat(p.softmaxMax.data, p.softmaxMax.offset(b, n1, row0 + r, 0), DType::F32);
        qb.rowSum[r] = loadAsFloat(p.softmaxSum.data, p.softmaxSum.offset(b, n1, row0 + r, 0), DType::F32);
    }
}

// S and dP of the loaded query block against a key block whose K^T and V^T tiles are packed.
template <DotKind kind, class Tiles>
ATTNOPS_AMX_FN void scoresAndGradients(const HeadDims& h, int64_t rows, int64_t nk, int64_t kr, const QueryRows& qb,
                                       BackwardScratch& sc) {
    gemm<kind, Tiles>(tilesOf(rows), tilesOf(nk), h.dChunks, qb.qa, h.dChunks * kTileK, sc.kb, sc.s, kr, false);
    gemm<kind, Tiles>(tilesOf(rows), tilesOf(nk), h.dvChunks, qb.doa, h.dvChunks * kTileK, sc.vb, sc.dp, kr, false);
}

// Row r of the block through tile::rowGradients, then s := P with dropout (what multiplies dO)
// and dp := scale * dS, both 0 for masked keys and for rows that keep nothing. Returns whether
// the row keeps a key.
ATTNOPS_AMX_FN bool rowTerms(const BackwardParams& bp, int64_t b, int64_t n1, const SeqRule& rule, int64_t i,
                             int64_t k0, int64_t nk, int64_t skv, int64_t r, int64_t kr, const QueryRows& qb,
                             BackwardScratch& sc, float* exactDelta) {
    const ForwardParams& p = bp.fwd;
    float* s = sc.s + r * kr;
    float* dp = sc.dp + r * kr;
    const bool any = qb.rowSum[r] != 0.0f &&  // a fully masked row has P = 0
                     tile::rowGradients(bp, b, n1, rule, i, k0, nk, skv, qb.rowMax[r], qb.rowSum[r], qb.delta[r],
                                        s, dp, sc.kept, sc.keep, exactDelta);
    for (int64_t j = 0; j < nk; ++j) {
        const bool used = any && sc.kept[j];
        float pd = s[j];
        if (p.dropout.enabled) pd = sc.keep[j] ? pd * p.dropout.invKeepProb : 0.0f;
        s[j] = used ? pd : 0.0f;
        dp[j] = used ? p.scale * dp[j] : 0.0f;
    }
    return any;
}

// y[c] += a * x[c], c < n: the row steps' accumulation.
ATTNOPS_AMX_FN void axpy(int64_t n, float a, const float* __restrict x, float* __restrict y) {
    for (int64_t c = 0; c < n; ++c) y[c] += a * x[c];
}

template <DotKind kind, class Tiles>
ATTNOPS_AMX_FN void keyUnit(const BackwardParams& bp, TileShape t, const KeyUnit& u, void* scratch) {
    const ForwardParams& p = bp.fwd;
    Carver carver(scratch);
    BackwardScratch sc(bp, t, carver);
    const HeadDims h(p);
    const int64_t sq = p.seq.qLen[size_t(u.b)], skv = p.seq.kvLen[size_t(u.b)];
    const SeqRule rule = seqRule(p.mask, u.b, sq, skv);
    const int64_t nk = u.k1 - u.k0, keyTiles = tilesOf(nk), kr = t.keyRows;
    const int64_t ldk = h.dTiles * kTileN, ldv = h.dvTiles * kTileN;
    const int64_t kvRow0 = p.seq.kvStart[size_t(u.b)] + u.k0;
    cpu::amx::packColumnPairs(p.k, u.b, u.n2, kvRow0, nk, h.d, h.dChunks, keyTiles, sc.kb);
    cpu::amx::packColumnPairs(p.v, u.b, u.n2, kvRow0, nk, h.dv, h.dvChunks, keyTiles, sc.vb);
    std::fill(sc.dkAcc, sc.dkAcc + keyTiles * kTileM * ldk, 0.0f);
    std::fill(sc.dvAcc, sc.dvAcc + keyTiles * kTileM * ldv, 0.0f);
    for (int64_t g = 0; g < p.group; ++g) {
        const int64_t n1 = u.n2 * p.group + g;
        for (int64_t q0 = 0; q0 < sq; q0 += t.queryRows) {
            const int64_t rows = std::min(t.queryRows, sq - q0), rowChunks = chunksOf(rows);
            const KeyRange keys = keyRange(rule, q0, q0 + rows, skv);
            if (keys.hi <= u.k0 || keys.lo >= u.k1) continue;  // this query block never sees these keys
            const int64_t qRow0 = p.seq.qStart[size_t(u.b)] + q0, rowsPad = tilesOf(rows) * kTileM;
            const QueryRows& qb = sc.query;
            loadQueryBlock(bp, u.b, n1, q0, rows, qb, sc.out);
            scoresAndGradients<kind, Tiles>(h, rows, nk, kr, qb, sc);
            // The P^T and dS^T GEMMs multiply masked zeros by Q and dO: only with finite ones.
            const bool tiles = allFinite<kind>(qb.qa, rowsPad * h.dChunks * kTileK) &&
                               allFinite<kind>(qb.doa, rowsPad * h.dvChunks * kTileK);
            if (!tiles) tile::loadRows(p.q, u.b, n1, qRow0, rows, h.d, sc.qf);
            for (int64_t r = 0; r < rows; ++r) {
                if (!rowTerms(bp, u.b, n1, rule, q0 + r, u.k0, nk, skv, r, kr, qb, sc, nullptr) || tiles) continue;
                for (int64_t j = 0; j < nk; ++j) {
                    if (!sc.kept[j]) continue;
                    axpy(h.dv, sc.s[r * kr + j], qb.dof + r * h.dv, sc.dvAcc + j * ldv);
                    axpy(h.d, sc.dp[r * kr + j], sc.qf + r * h.d, sc.dkAcc + j * ldk);
                }
            }
            if (!tiles) continue;
            const int64_t ldp = rowChunks * kTileK;  // P^T and dS^T: keys x rows, k = rows
            cpu::amx::packRowPairs(bp.dy, u.b, n1, qRow0, rows, h.dv, rowChunks, h.dvTiles, sc.dob);
            cpu::amx::packRowPairs(p.q, u.b, n1, qRow0, rows, h.d, rowChunks, h.dTiles, sc.qb);
            cpu::amx::packFloats<kind, true>(sc.s, kr, rows, nk, keyTiles * kTileM, ldp, sc.pa);
            cpu::amx::packFloats<kind, true>(sc.dp, kr, rows, nk, keyTiles * kTileM, ldp, sc.dsa);
            gemm<kind, Tiles>(keyTiles, h.dvTiles, rowChunks, sc.pa, ldp, sc.dob, sc.dvAcc, ldv, true);
            gemm<kind, Tiles>(keyTiles, h.dTiles, rowChunks, sc.dsa, ldp, sc.qb, sc.dkAcc, ldk, true);
        }
    }
    storeRows(bp.dk, u.b, u.n2, kvRow0, nk, h.d, sc.dkAcc, ldk);
    storeRows(bp.dv, u.b, u.n2, kvRow0, nk, h.dv, sc.dvAcc, ldv);
}

template <DotKind kind, class Tiles>
ATTNOPS_AMX_FN void queryUnit(const BackwardParams& bp, TileShape t, const WorkUnit& u, void* scratch) {
    const ForwardParams& p = bp.fwd;
    Carver carver(scratch);
    BackwardScratch sc(bp, t, carver);
    const HeadDims h(p);
    const int64_t sq = p.seq.qLen[size_t(u.b)], skv = p.seq.kvLen[size_t(u.b)];
    const SeqRule rule = seqRule(p.mask, u.b, sq, skv);
    const KeyRange keys = keyRange(rule, u.q0, u.q1, skv);
    const int64_t rows = u.q1 - u.q0, rowTiles = tilesOf(rows), kr = t.keyRows, qr = t.queryRows;
    const int64_t ldq = h.dTiles * kTileN, qRow0 = p.seq.qStart[size_t(u.b)] + u.q0;
    const bool sink = bp.sinkRowTerms != nullptr;
    for (int64_t g0 = 0; g0 < p.group; g0 += kHeadsPerPass) {
        const int64_t heads = std::min(kHeadsPerPass, p.group - g0);
        for (int64_t g = 0; g < heads; ++g) {
            const QueryRows qb = sc.query.head(h, qr, g);
            loadQueryBlock(bp, u.b, u.n2 * p.group + g0 + g, u.q0, rows, qb, sc.out);
            std::fill(qb.dqAcc, qb.dqAcc + rowTiles * kTileM * ldq, 0.0f);
            std::fill(qb.exactDelta, qb.exactDelta + rows, 0.0f);
        }
        for (int64_t k0 = keys.lo; k0 < keys.hi; k0 += kr) {
            const int64_t nk = std::min(kr, keys.hi - k0), keyTiles = tilesOf(nk), keyChunks = chunksOf(nk);
            const int64_t kvRow0 = p.seq.kvStart[size_t(u.b)] + k0;
            cpu::amx::packColumnPairs(p.k, u.b, u.n2, kvRow0, nk, h.d, h.dChunks, keyTiles, sc.kb);
            cpu::amx::packColumnPairs(p.v, u.b, u.n2, kvRow0, nk, h.dv, h.dvChunks, keyTiles, sc.vb);
            // The dS GEMM multiplies masked zeros by K: only with a finite key block.
            const bool tiles = allFinite<kind>(sc.kb, h.dChunks * keyTiles * kTileElems);
            const int64_t lds = keyChunks * kTileK;  // dS: rows x keys, k = keys
            if (tiles)
                cpu::amx::packRowPairs(p.k, u.b, u.n2, kvRow0, nk, h.d, keyChunks, h.dTiles, sc.kbr);
            else
                tile::loadRows(p.k, u.b, u.n2, kvRow0, nk, h.d, sc.kf);
            for (int64_t g = 0; g < heads; ++g) {
                const int64_t n1 = u.n2 * p.group + g0 + g;
                const QueryRows qb = sc.query.head(h, qr, g);
                scoresAndGradients<kind, Tiles>(h, rows, nk, kr, qb, sc);
                for (int64_t r = 0; r < rows; ++r) {
                    if (!rowTerms(bp, u.b, n1, rule, u.q0 + r, k0, nk, skv, r, kr, qb, sc,
                                  sink ? qb.exactDelta + r : nullptr) ||
                        tiles)
                        continue;
                    for (int64_t j = 0; j < nk; ++j)
                        if (sc.kept[j]) axpy(h.d, sc.dp[r * kr + j], sc.kf + j * h.d, qb.dqAcc + r * ldq);
                }
                if (!tiles) continue;
                cpu::amx::packFloats<kind, false>(sc.dp, kr, rows, nk, rowTiles * kTileM, lds, sc.dsa);
                gemm<kind, Tiles>(rowTiles, h.dTiles, keyChunks, sc.dsa, lds, sc.kbr, qb.dqAcc, ldq, true);
            }
        }
        for (int64_t g = 0; g < heads; ++g) {
            const int64_t n1 = u.n2 * p.group + g0 + g;
            const QueryRows qb = sc.query.head(h, qr, g);
            storeRows(bp.dq, u.b, n1, qRow0, rows, h.d, qb.dqAcc, ldq);
            if (sink) tile::writeSinkRowTerms(bp, u.b, n1, u.q0, rows, qb.rowMax, qb.rowSum, qb.exactDelta);
        }
    }
}

TileShape forwardTile(const ForwardParams& p, const PlatformInfo&) {
    return transposedForward(p) ? transposedForwardTile(p) : amxTile();
}
// Transposed backward: query units of up to 512 rows, key units of up to 1024 keys. A query unit
// packs each key and value block once for all its rows, a key unit each query block's Q and dO
// once for all its keys; both run in strips of 32 (fa_amx_backward.hpp). Against units of 128
// rows and 256 keys without strips (Intel Xeon with AMX, 2 threads): BNSD S4096 0.87x the time,
// causal 0.80x, GQA 32/8 causal 0.93x, TND 32K causal 0.85x (key units of 512: 0-4% slower than
// 1024; one thread, BNSD S2048, key strips in 256-key units were 3% slower than none).
constexpr int64_t kBackwardUnitRows = 512, kBackwardUnitKeys = 1024;
TileShape backwardTile(const BackwardParams& bp, const PlatformInfo&) {
    const ForwardParams& p = bp.fwd;
    if (!transposedForward(p)) return amxTile();
    return TileShape{rowsPerUnit(p, p.seq.qLen, kBackwardUnitRows), rowsPerUnit(p, p.seq.kvLen, kBackwardUnitKeys)};
}

// A thread's scratch holds the largest units rowsPerUnit may choose (transposedForwardScratchBytes).
uint64_t forwardScratchBytes(const ForwardParams& p, TileShape t) {
    return transposedForward(p) ? transposedForwardScratchBytes(p, t) : scratchBytes<ForwardScratch>(p, t);
}
uint64_t backwardScratchBytes(const BackwardParams& p, TileShape t) {
    return transposedForward(p.fwd)
               ? scratchBytes<TransposedBackwardScratch>(p, TileShape{kBackwardUnitRows, kBackwardUnitKeys})
               : scratchBytes<BackwardScratch>(p, t);
}

// Problems the fused backward takes: those of the transposed forward whose chunk split fits the
// bounds of bwd_chunks.hpp (the others take the two-kind scheme of the plain entry).
bool fusedAccepts(const BackwardParams& p) { return transposedForward(p.fwd) && fusedChunkRows(p.fwd) > 0; }

// The entry points of one backend: bf16 through TDPBF16PS, fp16 through TDPFP16PS when
// WithFp16.
template <class Tiles, bool WithFp16>
struct Entries {
    template <DotKind kind>
    static void forwardAs(const ForwardParams& p, TileShape t, const WorkUnit& u, void* s) {
        if (transposedForward(p)) return forwardUnitTransposed<kind, Tiles>(p, t, u, s);
        forwardUnit<kind, Tiles>(p, t, u, s);
    }
    static void forward(const ForwardParams& p, TileShape t, const WorkUnit& u, void* s) {
        if constexpr (WithFp16)
            if (p.q.dtype == DType::F16) return forwardAs<DotKind::Fp16>(p, t, u, s);
        forwardAs<DotKind::Bf16>(p, t, u, s);
    }
    template <DotKind kind>
    static void keyAs(const BackwardParams& p, TileShape t, const KeyUnit& u, void* s) {
        if (transposedForward(p.fwd)) return keyUnitTransposed<kind, Tiles>(p, t, u, s);
        keyUnit<kind, Tiles>(p, t, u, s);
    }
    template <DotKind kind>
    static void queryAs(const BackwardParams& p, TileShape t, const WorkUnit& u, void* s) {
        if (transposedForward(p.fwd)) return queryUnitTransposed<kind, Tiles>(p, t, u, s);
        queryUnit<kind, Tiles>(p, t, u, s);
    }
    static void key(const BackwardParams& p, TileShape t, const KeyUnit& u, void* s) {
        if constexpr (WithFp16)
            if (p.fwd.q.dtype == DType::F16) return keyAs<DotKind::Fp16>(p, t, u, s);
        keyAs<DotKind::Bf16>(p, t, u, s);
    }
    static void query(const BackwardParams& p, TileShape t, const WorkUnit& u, void* s) {
        if constexpr (WithFp16)
            if (p.fwd.q.dtype == DType::F16) return queryAs<DotKind::Fp16>(p, t, u, s);
        queryAs<DotKind::Bf16>(p, t, u, s);
    }
    // The fused scheme (fa_amx_backward_fused.hpp), for the problems fusedAccepts.
    static void head(const BackwardParams& p, TileShape t, const HeadChunk& c, void* s) {
        if constexpr (WithFp16)
            if (p.fwd.q.dtype == DType::F16) return headUnitTransposed<DotKind::Fp16, Tiles>(p, t, c, s);
        headUnitTransposed<DotKind::Bf16, Tiles>(p, t, c, s);
    }
};

}  // namespace
}  // namespace attnops::fa

// The AMX backward with transposed scores, for the problems whose forward is the transposed one
// (fa_amx_forward.hpp: no pse, no explicit mask, no dropout); the others take the row-step
// backward of fa_amx_kernel.hpp. The deterministic two-kind scheme of the other kernels: key units
// own dK/dV rows, query units own dQ rows.
//
// As in the forward, the tiles compute S^T = K.Q^T and dP^T = V.dO^T (keys down, query rows
// across), so the probabilities and gradients of 16 query rows are one vector and every step
// below is a loop over the rows of a key row (cpu/amx/lanes.hpp: the same bits on both tile
// backends). That layout is also the one the remaining products want:
//   key unit    dV  += P^T . dO    A: P^T as computed          B: dO in row pairs
//               dK  += dS^T . Q    A: dS^T as computed         B: Q in row pairs
//   query unit  dQ^T += K^T . dS^T A: K transposed, per block  B: dS^T in key pairs
// so no block of scores or gradients is ever transposed.
//
// Order of every reduction, fixed per element: TDP chains over k ascending (each in the SDM
// order); delta = rowsum(dO * O) in 16 column lanes added in lane order; dK/dV over query heads,
// then query blocks, then rows ascending (the k of their GEMMs); dQ over keys ascending.
#pragma once

#ifndef ATTNOPS_AMX_FN
#error "define ATTNOPS_AMX_FN (the attributes of the backend's build) before including fa_amx_backward.hpp"
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/dtype.hpp"
#include "cpu/amx/fa_amx_common.hpp"
#include "cpu/amx/fa_amx_forward.hpp"
#include "cpu/amx/lanes.hpp"
#include "cpu/generic/convert.hpp"
#include "cpu/generic/score_row.hpp"
#include "ops/flash_attention_score/kernel.hpp"
#include "ops/flash_attention_score/semantics.hpp"

namespace attnops::fa {
namespace {

// The blocks of the two kinds of unit, each small enough that its S^T and dP^T (16 KiB each) stay
// in L1 between the tile products and the vector steps. A key unit (up to TileShape::keyRows
// keys) goes through its query rows in blocks of up to 128 and, in each, through its keys in
// strips of 32 (kStripRows); a query unit (up to TileShape::queryRows rows) through its keys in
// blocks of up to 128 and, in each, through its rows in strips of 32.
constexpr int64_t kKeyUnitQueryRows = 128, kQueryUnitKeyRows = 128;

// One thread's arrays for either kind of unit. A query unit keeps the blocks of up to
// kHeadsPerPass query heads, so that each key block is packed once for all of them; a key unit
// uses the first. (qr: a unit's query rows; br: a key unit's query block, br <= qr; kr: a key
// unit's keys; kq: a query unit's key block, kq <= kr; "block": a key strip's [32][br] or a
// query strip's [kq][32].)
struct TransposedBackwardScratch {
    uint16_t* qb;       // [heads] dChunks x rowTiles B tiles: Q^T      (S^T = K.Q^T)
    uint16_t* dob;      // [heads] dvChunks x rowTiles B tiles: dO^T    (dP^T = V.dO^T)
    float* m;           // [heads][qr] saved row max (0 past the rows)
    float* l;           // [heads][qr] saved row sum
    float* invL;        // [heads][qr] 1 / l, 0 where l = 0 or past the rows
    float* delta;       // [heads][qr] rowsum(dO * O)
    float* exactDelta;  // [heads][qr] sum_j P dP (the dsink terms)
    float* dqAcc;       // [heads][16 dTiles][qr] dQ^T
    uint16_t* qr;       // rowChunks x dTiles B tiles: Q in row pairs     (dK += dS^T.Q)
    uint16_t* dor;      // rowChunks x dvTiles B tiles: dO in row pairs   (dV += P^T.dO)
    uint16_t* ka;       // [kr][32 dChunks]  K rows, A of S^T
    uint16_t* va;       // [kr][32 dvChunks] V rows, A of dP^T
    uint16_t* kt;       // [16 dTiles][kq]   K^T, A of dQ^T
    float* st;          // block: scores, then P
    float* dpt;         // block: dP, then scale * dS
    uint16_t* pa;       // [32][32 rowChunks] P^T, A of dV
    uint16_t* dsa;      // [32][32 rowChunks] scale * dS^T, A of dK
    uint16_t* dsb;      // keyChunks x 2 B tiles: scale * dS^T in key pairs (dQ^T)
    float* dkAcc;       // [kr][16 dTiles]
    float* dvAcc;       // [kr][16 dvTiles]
    float* dof;         // [qr][dv] fp32 dO rows
    float* qf;          // [br][d]  fp32 Q rows (a block whose Q or dO is not all finite)
    float* kf;          // [kq][d]  fp32 K rows (a key block that is not all finite)
    float* row;         // [max(d, dv)]

    TransposedBackwardScratch(const BackwardParams& bp, TileShape t, Carver& c) {
        const HeadDims h(bp.fwd);
        const int64_t qrPad = roundUp(t.queryRows, kTileK), kr = roundUp(t.keyRows, kTileK);
        const int64_t heads = headsPerPass(bp.fwd), dPad = h.dTiles * kTileM;
        qb = c.take<uint16_t>(heads * h.dChunks * qrPad * kTileK);
        dob = c.take<uint16_t>(heads * h.dvChunks * qrPad * kTileK);
        m = c.take<float>(heads * qrPad);
        l = c.take<float>(heads * qrPad);
        invL = c.take<float>(heads * qrPad);
        delta = c.take<float>(heads * qrPad);
        exactDelta = c.take<float>(heads * qrPad);
        dqAcc = c.take<float>(heads * dPad * qrPad);
        const int64_t br = std::min(qrPad, kKeyUnitQueryRows), kq = std::min(kr, kQueryUnitKeyRows);
        const int64_t block = std::max(kStripRows * br, kq * kStripRows);
        qr = c.take<uint16_t>(br * h.dTiles * kTileN);
        dor = c.take<uint16_t>(br * h.dvTiles * kTileN);
        ka = c.take<uint16_t>(kr * h.dChunks * kTileK);
        va = c.take<uint16_t>(kr * h.dvChunks * kTileK);
        kt = c.take<uint16_t>(dPad * kq);
        st = c.take<float>(block);
        dpt = c.take<float>(block);
        pa = c.take<uint16_t>(kStripRows * br);
        dsa = c.take<uint16_t>(kStripRows * br);
        dsb = c.take<uint16_t>(kq * kStripRows);
        dkAcc = c.take<float>(kr * h.dTiles * kTileN);
        dvAcc = c.take<float>(kr * h.dvTiles * kTileN);
        dof = c.take<float>(qrPad * h.dv);
        qf = c.take<float>(br * h.d);
        kf = c.take<float>(kq * h.d);
        row = c.take<float>(std::max(h.d, h.dv));
    }
};

// The arrays of head g of a pass.
struct HeadRows {
    uint16_t *qb, *dob;
    float *m, *l, *invL, *delta, *exactDelta, *dqAcc;
};
inline HeadRows headRows(const TransposedBackwardScratch& sc, const HeadDims& h, int64_t qrPad, int64_t g) {
    return {sc.qb + g * h.dChunks * qrPad * kTileK,   sc.dob + g * h.dvChunks * qrPad * kTileK,
            sc.m + g * qrPad,                          sc.l + g * qrPad,
            sc.invL + g * qrPad,                       sc.delta + g * qrPad,
            sc.exactDelta + g * qrPad,                 sc.dqAcc + g * h.dTiles * kTileM * qrPad};
}

// Rows [row0, row0 + rows) of head n of a view from fp32 rows with leading dimension ld.
ATTNOPS_AMX_FN void storeRows(const MutView4& view, int64_t b, int64_t n, int64_t row0, int64_t rows, int64_t cols,
                              const float* src, int64_t ld) {
    for (int64_t r = 0; r < rows; ++r)
        cpu::storeRow(view.data, view.offset(b, n, row0 + r, 0), view.stride[3], view.dtype, cols, src + r * ld);
}

// sum_c a[c] b[c]: 16 column lanes (c mod 16, ascending), then the lanes added in order.
ATTNOPS_AMX_FN float dotInLanes(const float* a, const float* b, int64_t n) {
    F16x acc = splat(0.0f);
    int64_t c = 0;
    for (; c + kLanes <= n; c += kLanes) acc = acc + loadLanes(a + c) * loadLanes(b + c);
    for (int64_t i = 0; c + i < n; ++i) acc[i] = acc[i] + a[c + i] * b[c + i];
    float sum = 0.0f;
    for (int i = 0; i < kLanes; ++i) sum += acc[i];
    return sum;
}

// Query rows [q0, q0 + rows) of head n1: Q^T and dO^T as B operands, fp32 dO rows, delta and the
// saved statistics (dof: [rows][dv], row: [dv]). Lanes past the rows get m = 0, 1/l = 0,
// delta = 0: their P and dS are 0.
ATTNOPS_AMX_FN void loadQueryRows(const BackwardParams& bp, int64_t b, int64_t n1, int64_t q0, int64_t rows,
                                  int64_t R, const HeadRows& hr, float* dof, float* row) {
    const ForwardParams& p = bp.fwd;
    const HeadDims h(p);
    const int64_t row0 = p.seq.qStart[size_t(b)] + q0, rowTiles = R / kTileN;
    cpu::amx::packColumnPairs(p.q, b, n1, row0, rows, h.d, h.dChunks, rowTiles, hr.qb);
    cpu::amx::packColumnPairs(bp.dy, b, n1, row0, rows, h.dv, h.dvChunks, rowTiles, hr.dob);
    tile::loadRows(bp.dy, b, n1, row0, rows, h.dv, dof);
    for (int64_t r = 0; r < R; ++r) {
        if (r >= rows) {
            hr.m[r] = 0.0f, hr.l[r] = 0.0f, hr.invL[r] = 0.0f, hr.delta[r] = 0.0f;
            continue;
        }
        cpu::loadRow(p.out.data, p.out.offset(b, n1, row0 + r, 0), p.out.stride[3], p.out.dtype, h.dv, row);
        hr.delta[r] = dotInLanes(dof + r * h.dv, row, h.dv);
        hr.m[r] = loadAsFloat(p.softmaxMax.data, p.softmaxMax.offset(b, n1, row0 + r, 0), DType::F32);
        hr.l[r] = loadAsFloat(p.softmaxSum.data, p.softmaxSum.offset(b, n1, row0 + r, 0), DType::F32);
        hr.invL[r] = hr.l[r] != 0.0f ? 1.0f / hr.l[r] : 0.0f;  // a fully masked row has P = 0
    }
}

// P and scale * dS of key row j's 16 lanes from r, from its raw scores x (S^T) and dP^T: 0 where
// the key is not kept (outside the row's band and prefix, or the row's saved sum is 0); with
// exactDelta, adds P dP of the kept lanes to it. kFast where fastExpApplies found the block's
// kept lanes in the range of exp's fast form: the same bits.
template <bool kFast>
ATTNOPS_AMX_FN inline __attribute__((always_inline)) void gradientLanes(float scale, const HeadRows& hr, int64_t r,
                                                                        bool whole, KeptRows band, F16x s, F16x dpr,
                                                                        F16x& pr, F16x& ds, float* exactDelta) {
    const F16x invL = loadLanes(hr.invL + r);
    const I16x live = invL != 0.0f;
    const I16x kept = whole ? live : live & keptLanes(band, r);
    const F16x x = s * scale - loadLanes(hr.m + r);
    const F16x e = kFast ? cpu::amx::expLanesNotNaN(x) : cpu::amx::expLanes(x);
    pr = select(kept, e * invL, splat(0.0f));
    ds = select(kept, pr * (dpr - loadLanes(hr.delta + r)) * scale, splat(0.0f));
    if (exactDelta != nullptr)
        storeLanes(exactDelta + r, loadLanes(exactDelta + r) + select(kept, pr * dpr, splat(0.0f)));
}

// Whether every kept lane of a block (keys [k0, k0 + nk), lanes [0, R)) has exp's argument
// scale * s - m at most 88 and not NaN: there expLanesNotNaN gives expLanes's bits (both exact
// from -inf up to 88, where 2^n stays normal; cpu/amx/lanes.hpp), so gradientLanes<true> gives
// those of gradientLanes<false>. True for any block whose scores and saved statistics came from a
// consistent forward. A pass of its own: on Intel Xeon with AMX (one thread, BNSD S2048 D128) it
// took 3.4% of the backward's time and the gradient steps went from 35% to 26% (the clamps and
// NaN selects of the general exp): 2-4% faster in all (bench/results/intel-xeon-amx/NOTES.md).
ATTNOPS_AMX_FN bool fastExpApplies(const ForwardParams& p, const SeqRule& rule, int64_t q0, int64_t q1, int64_t k0,
                                   int64_t nk, int64_t skv, int64_t R, const HeadRows& hr,
                                   const float* __restrict st) {
    const bool whole = blockFullyKept(rule, q0, q1, k0, k0 + nk, skv);
    I16x outside{};
    for (int64_t j = 0; j < nk; ++j) {
        const KeptRows band = keptRows(rule, q0, R, k0 + j);
        for (int64_t r = 0; r < R; r += kLanes) {
            const I16x live = loadLanes(hr.invL + r) != 0.0f;
            const I16x kept = whole ? live : live & keptLanes(band, r);
            const F16x x = loadLanes(st + j * R + r) * p.scale - loadLanes(hr.m + r);
            outside |= kept & ~(x <= 88.0f);
        }
    }
    return !cpu::amx::anyLane(outside);
}

// The gradients of a block: st (raw S^T) becomes P and dpt (raw dP^T) scale * dS for keys
// [k0, k0 + nk) and the R lanes (gradientLanes); with exactDelta, adds sum_j P dP per lane (keys
// ascending). Whole blocks skip the band test. The tile paths round the values for their
// operands in the same loop instead (blockGradientPairs, blockGradientRows); this fp32 form
// serves the steps of blocks whose operands are not all finite.
template <bool kFast>
ATTNOPS_AMX_FN void blockGradientsWith(const ForwardParams& p, const SeqRule& rule, int64_t q0, int64_t q1, int64_t k0,
                                       int64_t nk, int64_t skv, int64_t R, const HeadRows& hr, float* __restrict st,
                                       float* __restrict dpt, float* exactDelta) {
    const bool whole = blockFullyKept(rule, q0, q1, k0, k0 + nk, skv);
    for (int64_t j = 0; j < nk; ++j) {
        float* __restrict s = st + j * R;
        float* __restrict dp = dpt + j * R;
        const KeptRows band = keptRows(rule, q0, R, k0 + j);
        for (int64_t r = 0; r < R; r += kLanes) {
            F16x pr, ds;
            gradientLanes<kFast>(p.scale, hr, r, whole, band, loadLanes(s + r), loadLanes(dp + r), pr, ds, exactDelta);
            storeLanes(s + r, pr);
            storeLanes(dp + r, ds);
        }
    }
}
ATTNOPS_AMX_FN void blockGradients(const ForwardParams& p, const SeqRule& rule, int64_t q0, int64_t q1, int64_t k0,
                                   int64_t nk, int64_t skv, int64_t R, const HeadRows& hr, float* __restrict st,
                                   float* __restrict dpt, float* exactDelta) {
    if (fastExpApplies(p, rule, q0, q1, k0, nk, skv, R, hr, st))
        blockGradientsWith<true>(p, rule, q0, q1, k0, nk, skv, R, hr, st, dpt, exactDelta);
    else
        blockGradientsWith<false>(p, rule, q0, q1, k0, nk, skv, R, hr, st, dpt, exactDelta);
}

// The query unit's gradients of a block with tiles: only scale * dS, straight into its B operand
// for dQ^T += K^T.dS^T (keyChunks x R/16 tiles: tile row i of a chunk holds keys 2i and 2i + 1
// of its 16 lanes, rounded; 0 past nk), with no fp32 P or dS stored: the query unit multiplies
// nothing else. exactDelta as in blockGradients (keys ascending).
template <DotKind kind, bool kFast>
ATTNOPS_AMX_FN void blockGradientPairsWith(const ForwardParams& p, const SeqRule& rule, int64_t q0, int64_t q1,
                                           int64_t k0, int64_t nk, int64_t keyChunks, int64_t skv, int64_t R,
                                           const HeadRows& hr, const float* __restrict st, const float* __restrict dpt,
                                           float* exactDelta, uint16_t* __restrict dsb) {
    const bool whole = blockFullyKept(rule, q0, q1, k0, k0 + nk, skv);
    const int64_t rowTiles = R / kTileN;
    for (int64_t j = 0; j < keyChunks * kTileK; j += 2) {
        uint16_t* pairRow = dsb + (j / kTileK) * rowTiles * kTileElems + ((j % kTileK) / 2) * kTileK;
        const KeptRows band0 = keptRows(rule, q0, R, k0 + j), band1 = keptRows(rule, q0, R, k0 + j + 1);
        for (int64_t r = 0; r < R; r += kLanes) {
            F16x pr, ds0 = splat(0.0f), ds1 = splat(0.0f);
            if (j < nk)
                gradientLanes<kFast>(p.scale, hr, r, whole, band0, loadLanes(st + j * R + r), loadLanes(dpt + j * R + r),
                                     pr, ds0, exactDelta);
            if (j + 1 < nk)
                gradientLanes<kFast>(p.scale, hr, r, whole, band1, loadLanes(st + (j + 1) * R + r),
                                     loadLanes(dpt + (j + 1) * R + r), pr, ds1, exactDelta);
            storeLanes(pairRow + (r / kTileN) * kTileElems, narrowLanes<kind>(ds0) | (narrowLanes<kind>(ds1) << 16));
        }
    }
}
template <DotKind kind>
ATTNOPS_AMX_FN void blockGradientPairs(const ForwardParams& p, const SeqRule& rule, int64_t q0, int64_t q1, int64_t k0,
                                       int64_t nk, int64_t keyChunks, int64_t skv, int64_t R, const HeadRows& hr,
                                       const float* __restrict st, const float* __restrict dpt, float* exactDelta,
                                       uint16_t* __restrict dsb) {
    if (fastExpApplies(p, rule, q0, q1, k0, nk, skv, R, hr, st))
        blockGradientPairsWith<kind, true>(p, rule, q0, q1, k0, nk, keyChunks, skv, R, hr, st, dpt, exactDelta, dsb);
    else
        blockGradientPairsWith<kind, false>(p, rule, q0, q1, k0, nk, keyChunks, skv, R, hr, st, dpt, exactDelta, dsb);
}

// The key unit's gradients of a strip with tiles: P^T and scale * dS^T straight into their A
// operands for dV += P^T.dO and dK += dS^T.Q ([keyRowsPad][ld]: a key per row, its R lanes
// rounded, zero past nk and R), with no fp32 P or dS stored: blockGradients' values, rounded.
template <DotKind kind, bool kFast>
ATTNOPS_AMX_FN void blockGradientRowsWith(const ForwardParams& p, const SeqRule& rule, int64_t q0, int64_t q1,
                                          int64_t k0, int64_t nk, int64_t skv, int64_t R, const HeadRows& hr,
                                          const float* __restrict st, const float* __restrict dpt, int64_t keyRowsPad,
                                          int64_t ld, uint16_t* __restrict pa, uint16_t* __restrict dsa) {
    const bool whole = blockFullyKept(rule, q0, q1, k0, k0 + nk, skv);
    for (int64_t j = 0; j < keyRowsPad; ++j) {
        uint16_t* pRow = pa + j * ld;
        uint16_t* dsRow = dsa + j * ld;
        int64_t r = 0;
        if (j < nk) {
            const KeptRows band = keptRows(rule, q0, R, k0 + j);
            for (; r < R; r += kLanes) {
                F16x pr, ds;
                gradientLanes<kFast>(p.scale, hr, r, whole, band, loadLanes(st + j * R + r), loadLanes(dpt + j * R + r),
                                     pr, ds, nullptr);
                const cpu::amx::H16x ph = __builtin_convertvector(narrowLanes<kind>(pr), cpu::amx::H16x);
                const cpu::amx::H16x dh = __builtin_convertvector(narrowLanes<kind>(ds), cpu::amx::H16x);
                std::memcpy(pRow + r, &ph, sizeof ph);
                std::memcpy(dsRow + r, &dh, sizeof dh);
            }
        }
        std::fill(pRow + r, pRow + ld, uint16_t(0));
        std::fill(dsRow + r, dsRow + ld, uint16_t(0));
    }
}
template <DotKind kind>
ATTNOPS_AMX_FN void blockGradientRows(const ForwardParams& p, const SeqRule& rule, int64_t q0, int64_t q1, int64_t k0,
                                      int64_t nk, int64_t skv, int64_t R, const HeadRows& hr, const float* __restrict st,
                                      const float* __restrict dpt, int64_t keyRowsPad, int64_t ld,
                                      uint16_t* __restrict pa, uint16_t* __restrict dsa) {
    if (fastExpApplies(p, rule, q0, q1, k0, nk, skv, R, hr, st))
        blockGradientRowsWith<kind, true>(p, rule, q0, q1, k0, nk, skv, R, hr, st, dpt, keyRowsPad, ld, pa, dsa);
    else
        blockGradientRowsWith<kind, false>(p, rule, q0, q1, k0, nk, skv, R, hr, st, dpt, keyRowsPad, ld, pa, dsa);
}

template <DotKind kind, class Tiles>
ATTNOPS_AMX_FN void keyUnitTransposed(const BackwardParams& bp, TileShape t, const KeyUnit& u, void* scratch) {
    const ForwardParams& p = bp.fwd;
    Carver carver(scratch);
    TransposedBackwardScratch sc(bp, t, carver);
    const HeadDims h(p);
    const int64_t sq = p.seq.qLen[size_t(u.b)], skv = p.seq.kvLen[size_t(u.b)];
    const SeqRule rule = seqRule(p.mask, u.b, sq, skv);
    const int64_t nk = u.k1 - u.k0, keyTiles = tilesOf(nk), keyRowsPad = keyTiles * kTileM;
    const int64_t ldk = h.dTiles * kTileN, ldv = h.dvTiles * kTileN;
    const int64_t ldq = h.dChunks * kTileK, ldo = h.dvChunks * kTileK;
    const int64_t kvRow0 = p.seq.kvStart[size_t(u.b)] + u.k0, qrPad = roundUp(t.queryRows, kTileK);
    const int64_t queryRows = std::min(t.queryRows, kKeyUnitQueryRows);
    cpu::amx::TileSession<Tiles> session;  // the tile configuration once per unit
    cpu::amx::packRows(p.k, u.b, u.n2, kvRow0, nk, h.d, keyRowsPad, ldq, sc.ka);
    cpu::amx::packRows(p.v, u.b, u.n2, kvRow0, nk, h.dv, keyRowsPad, ldo, sc.va);
    std::fill(sc.dkAcc, sc.dkAcc + keyRowsPad * ldk, 0.0f);
    std::fill(sc.dvAcc, sc.dvAcc + keyRowsPad * ldv, 0.0f);
    const HeadRows hr = headRows(sc, h, qrPad, 0);
    for (int64_t g = 0; g < p.group; ++g) {
        const int64_t n1 = u.n2 * p.group + g;
        for (int64_t q0 = 0; q0 < sq; q0 += queryRows) {
            const int64_t rows = std::min(queryRows, sq - q0), rowTiles = tilesOf(rows), R = rowTiles * kTileN;
            const int64_t rowChunks = chunksOf(rows), ldr = rowChunks * kTileK;
            const KeyRange keys = keyRange(rule, q0, q0 + rows, skv);
            if (keys.hi <= u.k0 || keys.lo >= u.k1) continue;  // this query block never sees these keys
            const int64_t qRow0 = p.seq.qStart[size_t(u.b)] + q0;
            loadQueryRows(bp, u.b, n1, q0, rows, R, hr, sc.dof, sc.row);
            cpu::amx::packRowPairs(bp.dy, u.b, n1, qRow0, rows, h.dv, rowChunks, h.dvTiles, sc.dor);
            cpu::amx::packRowPairs(p.q, u.b, n1, qRow0, rows, h.d, rowChunks, h.dTiles, sc.qr);
            // The P^T and dS^T GEMMs multiply the zeros of masked keys by Q and dO: only with
            // finite ones; otherwise fp32 steps over the kept keys.
            const bool tiles = allFinite<kind>(sc.qr, rowChunks * h.dTiles * kTileElems) &&
                               allFinite<kind>(sc.dor, rowChunks * h.dvTiles * kTileElems);
            if (!tiles) tile::loadRows(p.q, u.b, n1, qRow0, rows, h.d, sc.qf);
            for (int64_t j0 = 0; j0 < nk; j0 += kStripRows) {
                const int64_t k0 = u.k0 + j0, nkS = std::min(kStripRows, nk - j0), stripTiles = tilesOf(nkS);
                if (keysToLastKept(keys, k0, nkS) == 0) continue;  // no row of the block keeps these keys
                float* dvAcc = sc.dvAcc + j0 * ldv;
                float* dkAcc = sc.dkAcc + j0 * ldk;
                gemmOn<kind>(session.tiles, stripTiles, rowTiles, h.dChunks, sc.ka + j0 * ldq, ldq, hr.qb,
                             rowTiles * kTileElems, sc.st, R, false);
                gemmOn<kind>(session.tiles, stripTiles, rowTiles, h.dvChunks, sc.va + j0 * ldo, ldo, hr.dob,
                             rowTiles * kTileElems, sc.dpt, R, false);
                if (tiles) {
                    blockGradientRows<kind>(p, rule, q0, q0 + rows, k0, nkS, skv, R, hr, sc.st, sc.dpt,
                                            stripTiles * kTileM, ldr, sc.pa, sc.dsa);
                    gemmOn<kind>(session.tiles, stripTiles, h.dvTiles, rowChunks, sc.pa, ldr, sc.dor,
                                 h.dvTiles * kTileElems, dvAcc, ldv, true);
                    gemmOn<kind>(session.tiles, stripTiles, h.dTiles, rowChunks, sc.dsa, ldr, sc.qr,
                                 h.dTiles * kTileElems, dkAcc, ldk, true);
                    continue;
                }
                blockGradients(p, rule, q0, q0 + rows, k0, nkS, skv, R, hr, sc.st, sc.dpt, nullptr);
                for (int64_t r = 0; r < rows; ++r)
                    for (int64_t j = 0; j < nkS; ++j) {
                        if (hr.invL[r] == 0.0f || !rule.keeps(q0 + r, k0 + j)) continue;
                        const float pj = sc.st[j * R + r], dsj = sc.dpt[j * R + r];
                        for (int64_t c = 0; c < h.dv; ++c) dvAcc[j * ldv + c] += pj * sc.dof[r * h.dv + c];
                        for (int64_t c = 0; c < h.d; ++c) dkAcc[j * ldk + c] += dsj * sc.qf[r * h.d + c];
                    }
            }
        }
    }
    storeRows(bp.dk, u.b, u.n2, kvRow0, nk, h.d, sc.dkAcc, ldk);
    storeRows(bp.dv, u.b, u.n2, kvRow0, nk, h.dv, sc.dvAcc, ldv);
}

// Head g's arrays from strip row s0 on.
inline HeadRows stripRows(HeadRows hr, int64_t s0) {
    hr.m += s0, hr.l += s0, hr.invL += s0, hr.delta += s0, hr.exactDelta += s0;
    return hr;
}

// A query unit runs its rows through each key block in strips of 32 (kStripRows), as the forward
// does: a strip's S^T and dP^T (32 lanes x a key block, 16 KiB each at 128 keys), its dS^T tiles
// and its dQ^T (16 KiB at D 128, stored strip-major) stay in L1 between the tile products and
// the vector steps, so that a unit may hold many rows and pack each key and value block for all
// of them.
template <DotKind kind, class Tiles>
ATTNOPS_AMX_FN void queryUnitTransposed(const BackwardParams& bp, TileShape t, const WorkUnit& u, void* scratch) {
    const ForwardParams& p = bp.fwd;
    Carver carver(scratch);
    TransposedBackwardScratch sc(bp, t, carver);
    const HeadDims h(p);
    const int64_t sq = p.seq.qLen[size_t(u.b)], skv = p.seq.kvLen[size_t(u.b)];
    const SeqRule rule = seqRule(p.mask, u.b, sq, skv);
    const KeyRange keys = keyRange(rule, u.q0, u.q1, skv);
    const int64_t rows = u.q1 - u.q0, R = roundUp(rows, kStripRows), rowTiles = R / kTileN;
    const int64_t kr = roundUp(std::min(t.keyRows, kQueryUnitKeyRows), kTileK), qrPad = roundUp(t.queryRows, kTileK);
    const int64_t dPad = h.dTiles * kTileM, ldq = h.dChunks * kTileK, ldo = h.dvChunks * kTileK;
    const int64_t qRow0 = p.seq.qStart[size_t(u.b)] + u.q0;
    const bool sink = bp.sinkRowTerms != nullptr;
    cpu::amx::TileSession<Tiles> session;  // the tile configuration once per unit
    for (int64_t g0 = 0; g0 < p.group; g0 += kHeadsPerPass) {
        const int64_t heads = std::min(kHeadsPerPass, p.group - g0);
        for (int64_t g = 0; g < heads; ++g) {
            const HeadRows hr = headRows(sc, h, qrPad, g);
            loadQueryRows(bp, u.b, u.n2 * p.group + g0 + g, u.q0, rows, R, hr, sc.dof, sc.row);
            std::fill(hr.dqAcc, hr.dqAcc + dPad * R, 0.0f);
            std::fill(hr.exactDelta, hr.exactDelta + R, 0.0f);
        }
        for (int64_t k0 = keys.lo; k0 < keys.hi; k0 += kr) {
            const int64_t nk = std::min(kr, keys.hi - k0), keyTiles = tilesOf(nk), keyChunks = chunksOf(nk);
            const int64_t ldkt = keyChunks * kTileK, kvRow0 = p.seq.kvStart[size_t(u.b)] + k0;
            cpu::amx::packRows(p.k, u.b, u.n2, kvRow0, nk, h.d, keyTiles * kTileM, ldq, sc.ka);
            cpu::amx::packRows(p.v, u.b, u.n2, kvRow0, nk, h.dv, keyTiles * kTileM, ldo, sc.va);
            cpu::amx::packRowsTransposed(p.k, u.b, u.n2, kvRow0, nk, h.d, dPad, ldkt, sc.kt);
            // The dS GEMM multiplies the zeros of masked keys by K: only with a finite key block.
            const bool tiles = allFinite<kind>(sc.kt, dPad * ldkt);
            if (!tiles) tile::loadRows(p.k, u.b, u.n2, kvRow0, nk, h.d, sc.kf);
            for (int64_t g = 0; g < heads; ++g) {
                const HeadRows hr = headRows(sc, h, qrPad, g);
                for (int64_t s0 = 0; s0 < R; s0 += kStripRows) {
                    // The strip's real rows and the keys of the block that one of them keeps.
                    const int64_t q0 = u.q0 + s0, q1 = std::min(u.q1, q0 + kStripRows);
                    const KeyRange strip = keyRange(rule, q0, q1, skv);
                    const int64_t nkS = keysToLastKept(strip, k0, nk), keyChunksS = chunksOf(nkS);
                    if (nkS == 0) continue;
                    const HeadRows hs = stripRows(hr, s0);
                    float* dqAcc = hr.dqAcc + s0 * dPad;  // the strip's dQ^T [16 dTiles][32]
                    const int64_t bStride = rowTiles * kTileElems, bStrip = s0 / kTileN * kTileElems;
                    gemmOn<kind>(session.tiles, tilesOf(nkS), kStripTiles, h.dChunks, sc.ka, ldq, hr.qb + bStrip,
                                 bStride, sc.st, kStripRows, false);
                    gemmOn<kind>(session.tiles, tilesOf(nkS), kStripTiles, h.dvChunks, sc.va, ldo, hr.dob + bStrip,
                                 bStride, sc.dpt, kStripRows, false);
                    float* exactDelta = sink ? hs.exactDelta : nullptr;
                    if (tiles) {
                        blockGradientPairs<kind>(p, rule, q0, q1, k0, nkS, keyChunksS, skv, kStripRows, hs, sc.st,
                                                 sc.dpt, exactDelta, sc.dsb);
                        gemmOn<kind>(session.tiles, h.dTiles, kStripTiles, keyChunksS, sc.kt, ldkt, sc.dsb,
                                     kStripTiles * kTileElems, dqAcc, kStripRows, true);
                        continue;
                    }
                    blockGradients(p, rule, q0, q1, k0, nkS, skv, kStripRows, hs, sc.st, sc.dpt, exactDelta);
                    for (int64_t j = 0; j < nkS; ++j)
                        for (int64_t r = 0; r < q1 - q0; ++r) {
                            if (hs.invL[r] == 0.0f || !rule.keeps(q0 + r, k0 + j)) continue;
                            const float dsj = sc.dpt[j * kStripRows + r];
                            for (int64_t c = 0; c < h.d; ++c) dqAcc[c * kStripRows + r] += dsj * sc.kf[j * h.d + c];
                        }
                }
            }
        }
        for (int64_t g = 0; g < heads; ++g) {
            const int64_t n1 = u.n2 * p.group + g0 + g;
            const HeadRows hr = headRows(sc, h, qrPad, g);
            for (int64_t r = 0; r < rows; ++r) {
                const float* strip = hr.dqAcc + (r / kStripRows) * kStripRows * dPad + r % kStripRows;
                for (int64_t c = 0; c < h.d; ++c) sc.row[c] = strip[c * kStripRows];
                storeRows(bp.dq, u.b, n1, qRow0 + r, 1, h.d, sc.row, h.d);
            }
            if (sink) tile::writeSinkRowTerms(bp, u.b, n1, u.q0, rows, hr.m, hr.l, hr.exactDelta);
        }
    }
}

}  // namespace
}  // namespace attnops::fa

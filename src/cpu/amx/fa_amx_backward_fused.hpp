// The fused AMX backward (entries "amx-fused", "amx-emulated-fused"): the transposed backward of
// fa_amx_backward.hpp without its recomputation. The two-kind scheme computes S^T and dP^T, and
// the gradient steps after them, once in the key units and again in the query units (7 GEMMs
// for the 5 credited), and loads each query block's Q, dO and statistics once per key unit. Here
// a unit is a chunk of query rows of one (sequence, kv head) with every query head of its group
// (ops/flash_attention_score/bwd_chunks.hpp: the chunk size depends on the problem only):
//
//   load the chunk's rows once: per query block of 128 rows, Q^T and dO^T (B of S^T and dP^T),
//     Q and dO in row pairs (B of dK and dV), the statistics and delta
//   for each key block of kFusedKeyRows keys, ascending:
//     pack K, V (A of S^T and dP^T) and K^T (A of dQ^T)
//     for each query head, each query block ascending, each key strip of 32 ascending:
//       S^T, dP^T by tiles; one gradient step writes P^T and dS^T as rows (A of dV and dK) and
//       dS^T in key pairs (B of dQ^T); dV += P^T.dO, dK += dS^T.Q
//     then dQ^T of the query block += K^T.dS^T over the block's strips
//     store the key block's dK, dV (or the chunk's partial of them)
//   store dQ
//
// So each score and gradient is computed once, and the query side's arrays are written once per
// chunk; the key block's arrays stay in L1/L2 while the chunk's rows stream past (a 128 x 128
// block's five GEMMs are some 20 MFLOP against 256 KiB of query-side arrays).
//
// Order of every reduction, fixed per element: TDP chains over k ascending (each in the SDM
// order); delta as in loadQueryRows; dK/dV over query heads, then query blocks, then rows
// ascending within the chunk (then the chunks' partials ascending, in the reduction); dQ over
// key blocks ascending, keys ascending within each; the dsink terms over keys ascending. The
// thread count changes none of it.
#pragma once

#ifndef ATTNOPS_AMX_FN
#error "define ATTNOPS_AMX_FN (the attributes of the backend's build) before including fa_amx_backward_fused.hpp"
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu/amx/fa_amx_backward.hpp"
#include "cpu/amx/fa_amx_common.hpp"
#include "cpu/amx/lanes.hpp"
#include "cpu/generic/score_row.hpp"
#include "ops/flash_attention_score/bwd_chunks.hpp"
#include "ops/flash_attention_score/kernel.hpp"

namespace attnops::fa {
namespace {

// Query rows per block of a chunk (the unit of its arrays, and of the chunk size) and keys per
// key block.
constexpr int64_t kFusedQueryRows = 128, kFusedKeyRows = 128;

// Chunks hold at least 2048 query rows over the group's heads (bwd_chunks.hpp's default is 512):
// a chunk's partial dK, dV are written, faulted in as fresh workspace, read back and added, which
// weighs more against this kernel's faster GEMMs. GQA 32/8 S2048 causal (8 kv heads, so cut into
// chunks): 8 chunks per kv head and 128 MiB of partials with 512 rows, 4 and 64 MiB with 2048,
// 0.91x the time (Intel Xeon with AMX, 2 threads).
constexpr int64_t kFusedChunkGroupRows = 2048;

TileShape fusedBackwardTile(const BackwardParams&, const PlatformInfo&) {
    return TileShape{kFusedQueryRows, kFusedKeyRows};
}

// Rows of a chunk for this kernel (0: the split passes the bounds; the two-kind scheme then).
int64_t fusedChunkRows(const ForwardParams& p) { return chunks::chunkRows(p, kFusedQueryRows, kFusedChunkGroupRows); }

// The arrays of one query block of one query head, kept for the whole unit.
struct FusedBlock {
    HeadRows hr;   // qb, dob: Q^T and dO^T (dChunks / dvChunks x rowTiles tiles); statistics;
                   // dqAcc: dQ^T [16 dTiles][kFusedQueryRows]
    uint16_t* qr;  // rowChunks x dTiles tiles: Q in row pairs   (dK += dS^T.Q)
    uint16_t* dor; // rowChunks x dvTiles tiles: dO in row pairs (dV += P^T.dO)
};

// One thread's arrays: the chunk's query blocks (every head of the group), then the key block's
// and a strip's ("block": a strip's [32][128] scores or gradients).
struct FusedBackwardScratch {
    int64_t blocks = 0;  // query blocks per head
    uint16_t *qb, *dob, *qr, *dor;
    float *m, *l, *invL, *delta, *exactDelta, *dqAcc;
    uint8_t* finite;  // [heads][blocks] whether the block's Q and dO are all finite
    uint16_t* ka;     // [kr][32 dChunks]  K rows, A of S^T
    uint16_t* va;     // [kr][32 dvChunks] V rows, A of dP^T
    uint16_t* kt;     // [16 dTiles][kr]   K^T, A of dQ^T
    float* st;        // block: scores, then P
    float* dpt;       // block: dP, then scale * dS
    uint16_t* pa;     // [32][128] P^T, A of dV
    uint16_t* dsa;    // [32][128] scale * dS^T, A of dK
    uint16_t* dsb;    // keyChunks x rowTiles B tiles: scale * dS^T in key pairs (dQ^T)
    float* dkAcc;     // [kr][16 dTiles]
    float* dvAcc;     // [kr][16 dvTiles]
    float* dof;       // [128][dv] fp32 dO rows
    float* qf;        // [128][d]  fp32 Q rows (a block whose Q or dO is not all finite)
    float* kf;        // [kr][d]   fp32 K rows (a key block that is not all finite)
    float* row;       // [max(d, dv)]

    // For chunks of up to chunkRows rows: a unit carves the layout of its own chunk, within the
    // bytes that fusedBackwardScratchBytes booked for the largest (the split is computed once,
    // by the plan: it walks every sequence).
    FusedBackwardScratch(const BackwardParams& bp, int64_t chunkRows, Carver& c) {
        const ForwardParams& p = bp.fwd;
        const HeadDims h(p);
        const int64_t R = kFusedQueryRows, kr = kFusedKeyRows, rowTiles = R / kTileN, rowChunks = R / kTileK;
        blocks = (std::max<int64_t>(1, chunkRows) + R - 1) / R;
        const int64_t n = p.group * blocks, dPad = h.dTiles * kTileM;
        qb = c.take<uint16_t>(n * h.dChunks * rowTiles * kTileElems);
        dob = c.take<uint16_t>(n * h.dvChunks * rowTiles * kTileElems);
        qr = c.take<uint16_t>(n * rowChunks * h.dTiles * kTileElems);
        dor = c.take<uint16_t>(n * rowChunks * h.dvTiles * kTileElems);
        m = c.take<float>(n * R);
        l = c.take<float>(n * R);
        invL = c.take<float>(n * R);
        delta = c.take<float>(n * R);
        exactDelta = c.take<float>(n * R);
        dqAcc = c.take<float>(n * dPad * R);
        finite = c.take<uint8_t>(n);
        ka = c.take<uint16_t>(kr * h.dChunks * kTileK);
        va = c.take<uint16_t>(kr * h.dvChunks * kTileK);
        kt = c.take<uint16_t>(dPad * kr);
        st = c.take<float>(kStripRows * R);
        dpt = c.take<float>(kStripRows * R);
        pa = c.take<uint16_t>(kStripRows * R);
        dsa = c.take<uint16_t>(kStripRows * R);
        dsb = c.take<uint16_t>((kr / kTileK) * rowTiles * kTileElems);
        dkAcc = c.take<float>(kr * h.dTiles * kTileN);
        dvAcc = c.take<float>(kr * h.dvTiles * kTileN);
        dof = c.take<float>(R * h.dv);
        qf = c.take<float>(R * h.d);
        kf = c.take<float>(kr * h.d);
        row = c.take<float>(std::max(h.d, h.dv));
    }

    // Query block i of head g.
    FusedBlock block(const HeadDims& h, int64_t g, int64_t i) const {
        const int64_t R = kFusedQueryRows, rowTiles = R / kTileN, rowChunks = R / kTileK, k = g * blocks + i;
        FusedBlock fb;
        fb.hr = HeadRows{qb + k * h.dChunks * rowTiles * kTileElems,
                         dob + k * h.dvChunks * rowTiles * kTileElems,
                         m + k * R,
                         l + k * R,
                         invL + k * R,
                         delta + k * R,
                         exactDelta + k * R,
                         dqAcc + k * h.dTiles * kTileM * R};
        fb.qr = qr + k * rowChunks * h.dTiles * kTileElems;
        fb.dor = dor + k * rowChunks * h.dvTiles * kTileElems;
        return fb;
    }
};

uint64_t fusedBackwardScratchBytes(const BackwardParams& p, TileShape) {
    Carver counter(nullptr);
    FusedBackwardScratch layout(p, fusedChunkRows(p.fwd), counter);
    return counter.used();
}

// Two vectors narrowed to the element type as two consecutive rows of 16 (lo in elements 0-15):
// for bf16, bf16RowsFlushed (one VCVTNE2PS2BF16 on the hardware; the denormals it flushes are
// operands the tile products flush in any case).
template <DotKind kind>
ATTNOPS_AMX_FN inline __attribute__((always_inline)) cpu::amx::H32x narrowRows(F16x lo, F16x hi) {
    if constexpr (kind == DotKind::Bf16) {
        return cpu::amx::bf16RowsFlushed(lo, hi);
    } else {
        const cpu::amx::H16x a = __builtin_convertvector(narrowLanes<kind>(lo), cpu::amx::H16x);
        const cpu::amx::H16x b = __builtin_convertvector(narrowLanes<kind>(hi), cpu::amx::H16x);
        return __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
                                       21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
    }
}

// narrowRows' two rows to dst and dst + ld (the second only when `second`).
ATTNOPS_AMX_FN inline __attribute__((always_inline)) void storeRowPair(uint16_t* dst, int64_t ld, bool second,
                                                                       cpu::amx::H32x rows) {
    std::memcpy(dst, &rows, 32);
    if (second) std::memcpy(dst + ld, reinterpret_cast<const char*>(&rows) + 32, 32);
}

// The fused unit's gradients of a strip (keys [k0, k0 + nk), nk <= 32) with tiles: P^T and
// scale * dS^T as rows ([keyRowsPad][ld], as blockGradientRows) and scale * dS^T in key pairs
// (one key chunk of rowTiles B tiles, as blockGradientPairs), from one evaluation of each
// gradient; exactDelta as in blockGradients (keys ascending). Keys are taken two at a time, so
// that each narrowing makes two rows at once (narrowRows).
template <DotKind kind, bool kFast>
ATTNOPS_AMX_FN void stripGradientsWith(const ForwardParams& p, const SeqRule& rule, int64_t q0, int64_t q1, int64_t k0,
                                       int64_t nk, int64_t skv, int64_t R, const HeadRows& hr,
                                       const float* __restrict st, const float* __restrict dpt, int64_t keyRowsPad,
                                       int64_t ld, uint16_t* __restrict pa, uint16_t* __restrict dsa,
                                       uint16_t* __restrict dsb, float* exactDelta) {
    const bool whole = blockFullyKept(rule, q0, q1, k0, k0 + nk, skv);
    for (int64_t j = 0; j < kTileK; j += 2) {
        uint16_t* pairRow = dsb + (j / 2) * kTileK;
        const KeptRows band0 = keptRows(rule, q0, R, k0 + j), band1 = keptRows(rule, q0, R, k0 + j + 1);
        for (int64_t r = 0; r < R; r += kLanes) {
            F16x p0 = splat(0.0f), ds0 = splat(0.0f), p1 = splat(0.0f), ds1 = splat(0.0f);
            if (j < nk)
                gradientLanes<kFast>(p.scale, hr, r, whole, band0, loadLanes(st + j * R + r), loadLanes(dpt + j * R + r),
                                     p0, ds0, exactDelta);
            if (j + 1 < nk)
                gradientLanes<kFast>(p.scale, hr, r, whole, band1, loadLanes(st + (j + 1) * R + r),
                                     loadLanes(dpt + (j + 1) * R + r), p1, ds1, exactDelta);
            const cpu::amx::H32x dsRows = narrowRows<kind>(ds0, ds1);
            storeLanes(pairRow + (r / kTileN) * kTileElems, cpu::amx::pairsOfRows(dsRows));
            if (j < keyRowsPad) {
                storeRowPair(pa + j * ld + r, ld, j + 1 < keyRowsPad, narrowRows<kind>(p0, p1));
                storeRowPair(dsa + j * ld + r, ld, j + 1 < keyRowsPad, dsRows);
            }
        }
        for (int64_t jj = j; jj < std::min(j + 2, keyRowsPad); ++jj) {
            std::fill(pa + jj * ld + R, pa + (jj + 1) * ld, uint16_t(0));
            std::fill(dsa + jj * ld + R, dsa + (jj + 1) * ld, uint16_t(0));
        }
    }
}
template <DotKind kind>
ATTNOPS_AMX_FN void stripGradients(const ForwardParams& p, const SeqRule& rule, int64_t q0, int64_t q1, int64_t k0,
                                   int64_t nk, int64_t skv, int64_t R, const HeadRows& hr, const float* __restrict st,
                                   const float* __restrict dpt, int64_t keyRowsPad, int64_t ld, uint16_t* __restrict pa,
                                   uint16_t* __restrict dsa, uint16_t* __restrict dsb, float* exactDelta) {
    if (fastExpApplies(p, rule, q0, q1, k0, nk, skv, R, hr, st))
        stripGradientsWith<kind, true>(p, rule, q0, q1, k0, nk, skv, R, hr, st, dpt, keyRowsPad, ld, pa, dsa, dsb,
                                       exactDelta);
    else
        stripGradientsWith<kind, false>(p, rule, q0, q1, k0, nk, skv, R, hr, st, dpt, keyRowsPad, ld, pa, dsa, dsb,
                                        exactDelta);
}

// scale * dS^T of a strip from fp32 (dpt: [nk][R]) into its key-pair B tiles, zero past nk:
// stripGradients' pairs, for the strips whose gradients took the fp32 steps.
template <DotKind kind>
ATTNOPS_AMX_FN void packStripPairs(const float* dpt, int64_t nk, int64_t R, uint16_t* __restrict dsb) {
    for (int64_t j = 0; j < kTileK; ++j)
        for (int64_t r = 0; r < R; ++r)
            dsb[(r / kTileN) * kTileElems + (j / 2) * kTileK + 2 * (r % kTileN) + j % 2] =
                j < nk ? cpu::amx::narrow<kind>(dpt[j * R + r]) : uint16_t(0);
}

// One key block [k0, k0 + nk) against the chunk's rows; adds to dkAcc, dvAcc ([nk] rows) and
// the blocks' dqAcc.
template <DotKind kind, class Tiles>
ATTNOPS_AMX_FN void fusedKeyBlock(const BackwardParams& bp, const HeadChunk& c, const SeqRule& rule, int64_t k0,
                                  int64_t nk, Tiles& unit, FusedBackwardScratch& sc) {
    const ForwardParams& p = bp.fwd;
    const HeadDims h(p);
    const int64_t skv = p.seq.kvLen[size_t(c.b)];
    const int64_t keyTiles = tilesOf(nk), keyChunks = chunksOf(nk), ldkt = keyChunks * kTileK;
    const int64_t ldq = h.dChunks * kTileK, ldo = h.dvChunks * kTileK, ldk = h.dTiles * kTileN, ldv = h.dvTiles * kTileN;
    const int64_t dPad = h.dTiles * kTileM, kvRow0 = p.seq.kvStart[size_t(c.b)] + k0;
    const bool sink = bp.sinkRowTerms != nullptr;
    cpu::amx::packRows(p.k, c.b, c.n2, kvRow0, nk, h.d, keyTiles * kTileM, ldq, sc.ka);
    cpu::amx::packRows(p.v, c.b, c.n2, kvRow0, nk, h.dv, keyTiles * kTileM, ldo, sc.va);
    cpu::amx::packRowsTransposed(p.k, c.b, c.n2, kvRow0, nk, h.d, dPad, ldkt, sc.kt);
    // The dQ GEMM multiplies the zero dS of masked keys by K: only with a finite key block.
    const bool kTiles = allFinite<kind>(sc.kt, dPad * ldkt);
    if (!kTiles) tile::loadRows(p.k, c.b, c.n2, kvRow0, nk, h.d, sc.kf);
    for (int64_t g = 0; g < p.group; ++g) {
        const int64_t n1 = c.n2 * p.group + g;
        for (int64_t i = 0; i < sc.blocks; ++i) {
            const int64_t q0 = c.q0 + i * kFusedQueryRows;
            if (q0 >= c.q1) break;
            const int64_t rows = std::min(kFusedQueryRows, c.q1 - q0), rowTiles = tilesOf(rows), R = rowTiles * kTileN;
            const int64_t rowChunks = chunksOf(rows), ldr = rowChunks * kTileK;
            const KeyRange keys = keyRange(rule, q0, q0 + rows, skv);
            if (keysToLastKept(keys, k0, nk) == 0) continue;  // this query block never sees these keys
            const FusedBlock fb = sc.block(h, g, i);
            const HeadRows& hr = fb.hr;
            // The P^T and dS^T GEMMs multiply the zeros of masked keys by Q and dO: only with
            // finite ones; otherwise fp32 steps over the kept keys.
            const bool qTiles = sc.finite[g * sc.blocks + i] != 0;
            if (!qTiles) {
                const int64_t qRow0 = p.seq.qStart[size_t(c.b)] + q0;
                tile::loadRows(p.q, c.b, n1, qRow0, rows, h.d, sc.qf);
                tile::loadRows(bp.dy, c.b, n1, qRow0, rows, h.dv, sc.dof);
            }
            float* exactDelta = sink ? hr.exactDelta : nullptr;
            int64_t firstChunk = -1, lastChunk = -1;  // the key chunks with kept keys
            for (int64_t j0 = 0; j0 < nk; j0 += kStripRows) {
                const int64_t nkS = std::min(kStripRows, nk - j0), stripTiles = tilesOf(nkS);
                if (keysToLastKept(keys, k0 + j0, nkS) == 0) continue;  // no row of the block keeps these keys
                if (firstChunk < 0) firstChunk = j0 / kTileK;
                lastChunk = j0 / kTileK;
                float* dvAcc = sc.dvAcc + j0 * ldv;
                float* dkAcc = sc.dkAcc + j0 * ldk;
                uint16_t* dsb = sc.dsb + (j0 / kTileK) * rowTiles * kTileElems;
                gemmOn<kind>(unit, stripTiles, rowTiles, h.dChunks, sc.ka + j0 * ldq, ldq, hr.qb,
                             rowTiles * kTileElems, sc.st, R, false);
                gemmOn<kind>(unit, stripTiles, rowTiles, h.dvChunks, sc.va + j0 * ldo, ldo, hr.dob,
                             rowTiles * kTileElems, sc.dpt, R, false);
                if (qTiles && kTiles) {
                    stripGradients<kind>(p, rule, q0, q0 + rows, k0 + j0, nkS, skv, R, hr, sc.st, sc.dpt,
                                         stripTiles * kTileM, ldr, sc.pa, sc.dsa, dsb, exactDelta);
                } else {
                    blockGradients(p, rule, q0, q0 + rows, k0 + j0, nkS, skv, R, hr, sc.st, sc.dpt, exactDelta);
                    if (qTiles) {
                        cpu::amx::packFloats<kind, false>(sc.st, R, nkS, R, stripTiles * kTileM, ldr, sc.pa);
                        cpu::amx::packFloats<kind, false>(sc.dpt, R, nkS, R, stripTiles * kTileM, ldr, sc.dsa);
                    } else {
                        for (int64_t r = 0; r < rows; ++r)
                            for (int64_t j = 0; j < nkS; ++j) {
                                if (hr.invL[r] == 0.0f || !rule.keeps(q0 + r, k0 + j0 + j)) continue;
                                const float pj = sc.st[j * R + r], dsj = sc.dpt[j * R + r];
                                for (int64_t col = 0; col < h.dv; ++col)
                                    dvAcc[j * ldv + col] += pj * sc.dof[r * h.dv + col];
                                for (int64_t col = 0; col < h.d; ++col)
                                    dkAcc[j * ldk + col] += dsj * sc.qf[r * h.d + col];
                            }
                    }
                    if (kTiles) {
                        packStripPairs<kind>(sc.dpt, nkS, R, dsb);
                    } else {
                        for (int64_t j = 0; j < nkS; ++j)
                            for (int64_t r = 0; r < rows; ++r) {
                                if (hr.invL[r] == 0.0f || !rule.keeps(q0 + r, k0 + j0 + j)) continue;
                                const float dsj = sc.dpt[j * R + r];
                                for (int64_t col = 0; col < h.d; ++col)
                                    hr.dqAcc[col * kFusedQueryRows + r] += dsj * sc.kf[(j0 + j) * h.d + col];
                            }
                    }
                }
                if (qTiles) {
                    gemmOn<kind>(unit, stripTiles, h.dvTiles, rowChunks, sc.pa, ldr, fb.dor, h.dvTiles * kTileElems,
                                 dvAcc, ldv, true);
                    gemmOn<kind>(unit, stripTiles, h.dTiles, rowChunks, sc.dsa, ldr, fb.qr, h.dTiles * kTileElems,
                                 dkAcc, ldk, true);
                }
            }
            if (kTiles && firstChunk >= 0)
                gemmOn<kind>(unit, h.dTiles, rowTiles, lastChunk - firstChunk + 1, sc.kt + firstChunk * kTileK, ldkt,
                             sc.dsb + firstChunk * rowTiles * kTileElems, rowTiles * kTileElems, hr.dqAcc,
                             kFusedQueryRows, true);
        }
    }
}

// The fused unit: chunk [c.q0, c.q1) of kv head c.n2 of sequence c.b, every query head of its
// group, against every key block its rows may see.
template <DotKind kind, class Tiles>
ATTNOPS_AMX_FN void headUnitTransposed(const BackwardParams& bp, TileShape, const HeadChunk& c, void* scratch) {
    const ForwardParams& p = bp.fwd;
    Carver carver(scratch);
    FusedBackwardScratch sc(bp, c.q1 - c.q0, carver);
    const HeadDims h(p);
    const int64_t sq = p.seq.qLen[size_t(c.b)], skv = p.seq.kvLen[size_t(c.b)];
    const SeqRule rule = seqRule(p.mask, c.b, sq, skv);
    const int64_t ldk = h.dTiles * kTileN, ldv = h.dvTiles * kTileN, dPad = h.dTiles * kTileM;
    const int64_t qStart = p.seq.qStart[size_t(c.b)];
    for (int64_t g = 0; g < p.group; ++g) {
        const int64_t n1 = c.n2 * p.group + g;
        for (int64_t i = 0; i < sc.blocks; ++i) {
            const int64_t q0 = c.q0 + i * kFusedQueryRows;
            if (q0 >= c.q1) break;
            const int64_t rows = std::min(kFusedQueryRows, c.q1 - q0), R = tilesOf(rows) * kTileN;
            const int64_t rowChunks = chunksOf(rows);
            const FusedBlock fb = sc.block(h, g, i);
            loadQueryRows(bp, c.b, n1, q0, rows, R, fb.hr, sc.dof, sc.row);
            cpu::amx::packRowPairs(bp.dy, c.b, n1, qStart + q0, rows, h.dv, rowChunks, h.dvTiles, fb.dor);
            cpu::amx::packRowPairs(p.q, c.b, n1, qStart + q0, rows, h.d, rowChunks, h.dTiles, fb.qr);
            sc.finite[g * sc.blocks + i] = allFinite<kind>(fb.qr, rowChunks * h.dTiles * kTileElems) &&
                                           allFinite<kind>(fb.dor, rowChunks * h.dvTiles * kTileElems);
            for (int64_t col = 0; col < dPad; ++col)  // the block's R lanes of each column (short sequences)
                std::fill_n(fb.hr.dqAcc + col * kFusedQueryRows, R, 0.0f);
            std::fill(fb.hr.exactDelta, fb.hr.exactDelta + R, 0.0f);
        }
    }
    cpu::amx::TileSession<Tiles> session;  // the tile configuration once per unit
    // A one-chunk sequence writes every key block's dk, dv (zero where no row sees it); a chunk
    // writes the partials of the blocks its rows may see, which the reduction reads.
    for (int64_t k0 = 0; k0 < skv; k0 += kFusedKeyRows) {
        const int64_t k1 = std::min(skv, k0 + kFusedKeyRows), nk = k1 - k0;
        const bool seen = chunks::chunkSeesKeys(rule, c.q0, c.q1, skv, k0, k1);
        if (c.dkPartial != nullptr && !seen) continue;
        std::fill(sc.dkAcc, sc.dkAcc + nk * ldk, 0.0f);
        std::fill(sc.dvAcc, sc.dvAcc + nk * ldv, 0.0f);
        if (seen) fusedKeyBlock<kind>(bp, c, rule, k0, nk, session.tiles, sc);
        if (c.dkPartial != nullptr) {
            for (int64_t j = 0; j < nk; ++j) {
                std::memcpy(c.dkPartial + (k0 + j) * h.d, sc.dkAcc + j * ldk, size_t(h.d) * sizeof(float));
                std::memcpy(c.dvPartial + (k0 + j) * h.dv, sc.dvAcc + j * ldv, size_t(h.dv) * sizeof(float));
            }
        } else {
            const int64_t kvRow0 = p.seq.kvStart[size_t(c.b)] + k0;
            storeRows(bp.dk, c.b, c.n2, kvRow0, nk, h.d, sc.dkAcc, ldk);
            storeRows(bp.dv, c.b, c.n2, kvRow0, nk, h.dv, sc.dvAcc, ldv);
        }
    }
    for (int64_t g = 0; g < p.group; ++g) {
        const int64_t n1 = c.n2 * p.group + g;
        for (int64_t i = 0; i < sc.blocks; ++i) {
            const int64_t q0 = c.q0 + i * kFusedQueryRows;
            if (q0 >= c.q1) break;
            const int64_t rows = std::min(kFusedQueryRows, c.q1 - q0);
            const HeadRows hr = sc.block(h, g, i).hr;
            for (int64_t r = 0; r < rows; ++r) {
                for (int64_t col = 0; col < h.d; ++col) sc.row[col] = hr.dqAcc[col * kFusedQueryRows + r];
                storeRows(bp.dq, c.b, n1, qStart + q0 + r, 1, h.d, sc.row, h.d);
            }
            if (bp.sinkRowTerms != nullptr) tile::writeSinkRowTerms(bp, c.b, n1, q0, rows, hr.m, hr.l, hr.exactDelta);
        }
    }
}

}  // namespace
}  // namespace attnops::fa

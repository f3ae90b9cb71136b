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
// vector over rows again. K and V^T are packed once per key block for every head of a pass; the
// unit's rows go through them in strips of 32, a superblock of key blocks at a time (below).
// Where a block has no NaN or infinite score, the softmax takes lanes.hpp's fast steps (MAXPS,
// VSCALEFPS, VCVTNE2PS2BF16 on the hardware), whose portable forms give the same bits.
//
// Order of every reduction, fixed per element: TDP chains over k ascending (each in the SDM
// order), the row sum over keys ascending, P.V over keys ascending (k chunks ascending); the row
// max, which is exact, in two chains (even and odd keys).
#pragma once

#ifndef ATTNOPS_AMX_FN
#error "define ATTNOPS_AMX_FN (the attributes of the backend's build) before including fa_amx_forward.hpp"
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

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

// The rows of a unit run in strips of 32 (two row tiles): a strip's scores and probabilities
// (32 lanes x a key block, 16 KiB at 128 keys) stay in L1 between the tile product that writes
// them and the vector steps that read them, where a whole unit's would not (128 KiB at 256 rows).
// A strip also skips the keys that none of its rows keeps (the causal triangle's far side).
constexpr int64_t kStripRows = 32;
constexpr int64_t kStripTiles = kStripRows / kTileN;
// Key blocks per superblock (forwardUnitTransposedWith).
constexpr int64_t kSuperBlocks = 4;

struct TransposedScratch {
    uint16_t* qb;    // [heads] dChunks x rowTiles B tiles: Q^T
    uint16_t* ka;    // [kSuperBlocks][keyRows][32 dChunks]  K, A of S^T
    uint16_t* vt;    // [kSuperBlocks][16 dvTiles][keyRows]  V^T, A of O^T
    uint16_t* pb;    // keyChunks x 2 B tiles           a strip's P^T
    float* st;       // [keyRows][32]                   a strip's scores, then probabilities
    float* acc;      // [heads][rowsPad / 32][16 dvTiles][32] O^T, a strip's columns together
    float* m;        // [heads][rowsPad]
    float* l;        // [heads][rowsPad]
    float* vf;       // [keyRows][dv] fp32 V (a block whose values are not all finite)
    float* out;      // [16][16 dvTiles]                output rows

    TransposedScratch(const ForwardParams& p, TileShape t, Carver& c) {
        const HeadDims h(p);
        const int64_t qr = roundUp(t.queryRows, kStripRows), kr = roundUp(t.keyRows, kTileK), heads = headsPerPass(p);
        const int64_t dvPad = h.dvTiles * kTileM;
        qb = c.take<uint16_t>(heads * h.dChunks * qr * kTileK);
        ka = c.take<uint16_t>(kSuperBlocks * kr * h.dChunks * kTileK);
        vt = c.take<uint16_t>(kSuperBlocks * dvPad * kr);
        pb = c.take<uint16_t>(kr * kStripRows);
        st = c.take<float>(kr * kStripRows);
        acc = c.take<float>(heads * dvPad * qr);
        m = c.take<float>(heads * qr);
        l = c.take<float>(heads * qr);
        vf = c.take<float>(kr * h.dv);
        out = c.take<float>(kTileM * dvPad);
    }
};

// Blocks of `rows` over the sequences' lengths (query or key/value) and kv heads: work units.
inline int64_t unitsOf(const ForwardParams& p, const std::vector<int64_t>& lengths, int64_t rows) {
    int64_t units = 0;
    for (int64_t b = 0; b < p.seq.count; ++b) units += p.n2 * ((lengths[size_t(b)] + rows - 1) / rows);
    return units;
}

// The largest of `largest`, largest / 2, ... (at least 64) that still cuts the problem into
// kMinUnits units: large blocks amortise the packing of each K/V block over more query rows
// (forward: 256 query rows ran 20% faster than 64 on BNSD S2048 D128, Intel Xeon with AMX,
// bench/results/intel-xeon-amx/), while enough units keep the threads busy. From the shape alone,
// so that the bits never depend on the thread count.
inline int64_t rowsPerUnit(const ForwardParams& p, const std::vector<int64_t>& lengths, int64_t largest) {
    constexpr int64_t kMinUnits = 64;
    int64_t rows = largest;
    while (rows > 64 && unitsOf(p, lengths, rows) < kMinUnits) rows /= 2;
    return rows;
}

// Units of up to 512 query rows where no band limits the keys a row sees (sparse mode 1, or
// mode 0 with pre and next tokens past every length: each unit then packs every key and value,
// and larger units pack them for more rows; BNSD S2048 D128 8% faster than with 256, Intel Xeon
// with AMX, 2 threads) or where the sequences are kLongRows long on average, of up to 256
// otherwise; key blocks of 128. Under a band, 512 rows took 0.90-0.94x the time of 256 on BNSD
// S4096 D128 causal, the same on GQA 32/8 S2048 causal, and 1.00-1.07x on TND 32K causal (41
// sequences, median 512 rows; three interleaved rounds each, the same bits, Intel Xeon with AMX,
// 2 threads, bench/results/intel-xeon-amx/NOTES.md, eighth session).
constexpr int64_t kForwardUnitRows = 512, kForwardBandUnitRows = 256, kForwardKeyRows = 128, kLongRows = 2048;
inline bool bandFree(const ForwardParams& p) {
    const MaskSpec& m = p.mask;
    return m.sparseMode == 1 ||
           (m.sparseMode == 0 && m.preTokens >= p.seq.maxQLen && m.nextTokens >= p.seq.maxKvLen);
}
inline bool longSequences(const ForwardParams& p) {
    int64_t rows = 0;
    for (int64_t b = 0; b < p.seq.count; ++b) rows += p.seq.qLen[size_t(b)];
    return p.seq.count > 0 && rows >= kLongRows * p.seq.count;
}
inline TileShape transposedForwardTile(const ForwardParams& p) {
    const bool large = bandFree(p) || longSequences(p);
    return TileShape{rowsPerUnit(p, p.seq.qLen, large ? kForwardUnitRows : kForwardBandUnitRows), kForwardKeyRows};
}
// A thread's scratch holds the largest unit rowsPerUnit may choose, whatever it chose for this
// call: the workspace then depends on the head dims and the group, never on how many sequences a
// call has (which sets how many units it needs and so the rows of each).
inline uint64_t transposedForwardScratchBytes(const ForwardParams& p, TileShape t) {
    return scratchBytes<TransposedScratch>(p, TileShape{kForwardUnitRows, t.keyRows});
}

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
// The keys of [k0, k0 + nk) up to the last one in `kept` (the keys that some row of a strip or
// block may keep: keyRange), counted from k0; 0 where the two do not meet (the caller skips the
// block).
inline int64_t keysToLastKept(const KeyRange& kept, int64_t k0, int64_t nk) {
    const int64_t end = std::min(k0 + nk, kept.hi);
    return std::max(k0, kept.lo) >= end ? 0 : end - k0;
}
ATTNOPS_AMX_FN inline __attribute__((always_inline)) I16x keptLanes(KeptRows k, int64_t r) {
    const I16x index = cpu::amx::laneIndex() + int32_t(r);
    return (index >= int32_t(k.lo)) & (index < int32_t(k.hi));
}

// a if it is larger than b or NaN, else b: a running maximum that keeps the first NaN it meets.
ATTNOPS_AMX_FN inline __attribute__((always_inline)) F16x maxLanes(F16x b, F16x a) {
    return select((a > b) | (a != a), a, b);
}

// Each lane's maximum over keys [0, nk) of its kept scaled scores (-inf if it keeps none, NaN if
// one is NaN), from the strip's raw scores st [nk][32], which stay as they are. Rounding is
// monotonic, so for scale > 0 the largest scaled score is the scaled largest raw one and for
// scale < 0 the scaled smallest: the maximum runs over s * sign (exact), times |scale| at the end,
// with the bits of the maximum of the scaled scores (up to the sign of a zero). Scale 0 maps
// infinities to NaN: there the maximum runs over the scaled scores themselves. Even and odd keys
// run in separate chains (a maximum is exact: the order changes no bit, up to the sign of a zero),
// four chains in all, so that the comparisons' latency does not bound the loop.
ATTNOPS_AMX_FN inline __attribute__((always_inline)) void maximaStep(const SeqRule& rule, int64_t q0, int64_t key,
                                                                     bool whole, float before, const float* __restrict s,
                                                                     F16x (&m)[kStripTiles]) {
    const KeptRows band = whole ? KeptRows{0, kStripRows} : keptRows(rule, q0, kStripRows, key);
    for (int64_t g = 0; g < kStripTiles; ++g) {
        F16x x = loadLanes(s + g * kLanes) * before;
        if (!whole) x = select(keptLanes(band, g * kLanes), x, splat(tile::kNegInf));
        m[g] = maxLanes(m[g], x);
    }
}
ATTNOPS_AMX_FN void stripMaxima(const ForwardParams& p, const SeqRule& rule, int64_t q0, int64_t k0, int64_t nk,
                                bool whole, const float* __restrict st, F16x (&blockMax)[kStripTiles]) {
    const float before = p.scale == 0.0f ? 0.0f : (p.scale > 0.0f ? 1.0f : -1.0f);
    const float after = p.scale == 0.0f ? 1.0f : std::fabs(p.scale);
    F16x even[kStripTiles], odd[kStripTiles];
    for (int64_t g = 0; g < kStripTiles; ++g) even[g] = odd[g] = splat(tile::kNegInf);
    int64_t j = 0;
    for (; j + 1 < nk; j += 2) {
        maximaStep(rule, q0, k0 + j, whole, before, st + j * kStripRows, even);
        maximaStep(rule, q0, k0 + j + 1, whole, before, st + (j + 1) * kStripRows, odd);
    }
    if (j < nk) maximaStep(rule, q0, k0 + j, whole, before, st + j * kStripRows, even);
    for (int64_t g = 0; g < kStripTiles; ++g) blockMax[g] = maxLanes(even[g], odd[g]) * after;
}

// exp(scale * s - mSub) of key j's 16 rows of lane group g (0 for masked rows and for keys past
// nk), stored over the raw scores where keep.
ATTNOPS_AMX_FN inline __attribute__((always_inline)) F16x probabilityLanes(float scale, KeptRows band, int64_t j,
                                                                         int64_t nk, int64_t g, bool whole, F16x mSub,
                                                                         float* __restrict st, bool keep) {
    if (j >= nk) return splat(0.0f);
    float* at = st + j * kStripRows + g * kLanes;
    F16x x = loadLanes(at) * scale;
    if (!whole) x = select(keptLanes(band, g * kLanes), x, splat(tile::kNegInf));
    const F16x e = cpu::amx::expLanes<false>(x - mSub);
    if (keep) storeLanes(at, e);
    return e;
}

// The fast maxima of a strip's block for scale > 0, where no raw score of it is NaN or infinite
// (the common case; returns false otherwise, and the caller runs stripMaxima): MAXPS's rule in
// place of maxLanes, which gives the same maximum (up to the sign of a zero) in one instruction,
// and no multiplication by the sign; the test is a sum of s - s (NaN for a NaN or infinite score)
// riding along, in one sum per maximum: with a single sum, its chain of dependent additions (4
// cycles each, one per vector of scores) set the pace of the pass (perf annotate, Intel Xeon with
// AMX); the sums only tell zero from NaN, so how they are split changes nothing.
template <bool kWhole>
ATTNOPS_AMX_FN inline __attribute__((always_inline)) void maximaStepFast(const SeqRule& rule, int64_t q0, int64_t key,
                                                                         const float* __restrict s,
                                                                         F16x (&m)[kStripTiles],
                                                                         F16x (&bad)[kStripTiles]) {
    const KeptRows band = kWhole ? KeptRows{0, kStripRows} : keptRows(rule, q0, kStripRows, key);
    for (int64_t g = 0; g < kStripTiles; ++g) {
        F16x x = loadLanes(s + g * kLanes);
        bad[g] = bad[g] + (x - x);
        if (!kWhole) x = select(keptLanes(band, g * kLanes), x, splat(tile::kNegInf));
        m[g] = cpu::amx::maxLanesFast(m[g], x);
    }
}
template <bool kWhole>
ATTNOPS_AMX_FN bool stripMaximaFast(const ForwardParams& p, const SeqRule& rule, int64_t q0, int64_t k0, int64_t nk,
                                    const float* __restrict st, F16x (&blockMax)[kStripTiles]) {
    F16x even[kStripTiles], odd[kStripTiles], badEven[kStripTiles], badOdd[kStripTiles];
    for (int64_t g = 0; g < kStripTiles; ++g) {
        even[g] = odd[g] = splat(tile::kNegInf);
        badEven[g] = badOdd[g] = splat(0.0f);
    }
    int64_t j = 0;
    for (; j + 1 < nk; j += 2) {
        maximaStepFast<kWhole>(rule, q0, k0 + j, st + j * kStripRows, even, badEven);
        maximaStepFast<kWhole>(rule, q0, k0 + j + 1, st + (j + 1) * kStripRows, odd, badOdd);
    }
    if (j < nk) maximaStepFast<kWhole>(rule, q0, k0 + j, st + j * kStripRows, even, badEven);
    I16x bad{};
    for (int64_t g = 0; g < kStripTiles; ++g) bad |= (badEven[g] != 0.0f) | (badOdd[g] != 0.0f);
    if (cpu::amx::anyLane(bad)) return false;
    for (int64_t g = 0; g < kStripTiles; ++g) blockMax[g] = cpu::amx::maxLanesFast(even[g], odd[g]) * p.scale;
    return true;
}

// The online-softmax update of a strip's 32 rows of one head before its probabilities: m becomes
// max(m, blockMax); alpha is the factor of the accumulator (0 while nothing was accumulated, 1
// where the max did not move) and mSub what the scaled scores subtract. Returns whether every new
// maximum is finite or -inf (no NaN or +inf: then no probability of the block can be NaN).
ATTNOPS_AMX_FN bool beginStrip(const F16x (&blockMax)[kStripTiles], float* __restrict m, F16x (&alpha)[kStripTiles],
                               F16x (&mSub)[kStripTiles]) {
    I16x unusual{};
    for (int64_t g = 0; g < kStripTiles; ++g) {
        const F16x mOld = loadLanes(m + g * kLanes), bm = blockMax[g];
        const F16x mNew = maxLanes(mOld, bm);
        alpha[g] = select(mOld == tile::kNegInf, splat(0.0f), cpu::amx::expLanes(mOld - mNew));
        storeLanes(m + g * kLanes, mNew);
        // A row that kept no key yet subtracts 0: its masked scores (-inf) then give exp 0, as
        // every masked score does, with no test per score (scale * s - m <= 0 or NaN).
        mSub[g] = select(mNew == tile::kNegInf, splat(0.0f), mNew);
        unusual |= (mNew != mNew) | (mNew == -tile::kNegInf);
    }
    return !cpu::amx::anyLane(unusual);
}

// The probabilities exp(scale * s - mSub) of a strip's kept keys (0 for the others and past nk),
// their sums added to total (keys ascending), with tiles as the P^T B operand pb (keyChunks x 2
// tiles; rounded, a pair of keys per lane), without as fp32 in st.
template <DotKind kind>
ATTNOPS_AMX_FN void stripProbabilities(const ForwardParams& p, const SeqRule& rule, int64_t q0, int64_t k0, int64_t nk,
                                       int64_t keyChunks, bool whole, float* __restrict st,
                                       const F16x (&mSub)[kStripTiles], F16x (&total)[kStripTiles],
                                       uint16_t* __restrict pb, bool tiles) {
    for (int64_t j = 0; j < keyChunks * kTileK; j += 2) {
        const KeptRows b0 = whole ? KeptRows{0, kStripRows} : keptRows(rule, q0, kStripRows, k0 + j);
        const KeptRows b1 = whole ? KeptRows{0, kStripRows} : keptRows(rule, q0, kStripRows, k0 + j + 1);
        for (int64_t g = 0; g < kStripTiles; ++g) {
            const F16x e0 = probabilityLanes(p.scale, b0, j, nk, g, whole, mSub[g], st, !tiles);
            const F16x e1 = probabilityLanes(p.scale, b1, j + 1, nk, g, whole, mSub[g], st, !tiles);
            total[g] = total[g] + e0;
            total[g] = total[g] + e1;
            // 16 pairs (row 16 g + i: keys j, j + 1) fill one row of B tile g of the chunk
            if (tiles)
                storeLanes(pb + (j / kTileK) * kStripTiles * kTileElems + ((j % kTileK) / 2) * kTileK + g * kTileElems,
                           narrowLanes<kind>(e0) | (narrowLanes<kind>(e1) << 16));
        }
    }
}

// stripProbabilities with tiles where beginStrip and stripMaximaFast found no NaN or infinity:
// the same bits through lanes.hpp's fast steps (no probability is NaN, none denormal: an exp
// result is 0 or at least 2^-126).
template <bool kWhole>
ATTNOPS_AMX_FN inline __attribute__((always_inline)) F16x probabilityLanesFast(float scale, const SeqRule& rule,
                                                                             int64_t q0, int64_t k0, int64_t j,
                                                                             int64_t nk, int64_t g, F16x mSub,
                                                                             const float* __restrict st) {
    if (j >= nk) return splat(0.0f);
    F16x x = loadLanes(st + j * kStripRows + g * kLanes) * scale;
    if (!kWhole) x = select(keptLanes(keptRows(rule, q0, kStripRows, k0 + j), g * kLanes), x, splat(tile::kNegInf));
    return cpu::amx::expLanesNotNaN(x - mSub);
}
template <DotKind kind, bool kWhole>
ATTNOPS_AMX_FN void stripProbabilitiesFast(const ForwardParams& p, const SeqRule& rule, int64_t q0, int64_t k0,
                                           int64_t nk, int64_t keyChunks, const float* __restrict st,
                                           const F16x (&mSub)[kStripTiles], F16x (&total)[kStripTiles],
                                           uint16_t* __restrict pb) {
    // The sums in registers (the loop over the strip's tiles unrolled): GCC kept them in memory, a
    // load and a store per pair of keys in their chains of additions (no change in time measured
    // on an Intel Xeon with AMX, where the exps set the pace).
    F16x sum[kStripTiles];
    for (int64_t g = 0; g < kStripTiles; ++g) sum[g] = total[g];
    for (int64_t j = 0; j < keyChunks * kTileK; j += 2)
#pragma GCC unroll 2
        for (int64_t g = 0; g < kStripTiles; ++g) {
            const F16x e0 = probabilityLanesFast<kWhole>(p.scale, rule, q0, k0, j, nk, g, mSub[g], st);
            const F16x e1 = probabilityLanesFast<kWhole>(p.scale, rule, q0, k0, j + 1, nk, g, mSub[g], st);
            sum[g] = sum[g] + e0;
            sum[g] = sum[g] + e1;
            uint16_t* row = pb + (j / kTileK) * kStripTiles * kTileElems + ((j % kTileK) / 2) * kTileK + g * kTileElems;
            if constexpr (kind == DotKind::Bf16)
                storeLanes(row, cpu::amx::bf16PairsNotDenormal(e0, e1));
            else
                storeLanes(row, narrowLanes<kind>(e0) | (narrowLanes<kind>(e1) << 16));
        }
    for (int64_t g = 0; g < kStripTiles; ++g) total[g] = sum[g];
}

// Row i of head n1 from its accumulator row (dv fp32, scaled here), m and l: tile::storeRow's
// arithmetic, with the rounding to the output's 16-bit type vectorised where the row is
// contiguous.
template <DotKind kind>
ATTNOPS_AMX_FN void storeOutputRow(const ForwardParams& p, const WorkUnit& u, int64_t n1, int64_t i, float m, float l,
                                   float* __restrict acc) {
    tile::joinSink(p, n1, m, l, acc);
    const int64_t row = p.seq.qStart[size_t(u.b)] + i;
    const float inv = l != 0.0f ? 1.0f / l : 0.0f;  // l == 0: no key kept; NaN propagates
    for (int64_t c = 0; c < p.dv; ++c) acc[c] = l != 0.0f ? acc[c] * inv : 0.0f;
    const int64_t offset = p.out.offset(u.b, n1, row, 0);
    int64_t c = 0;
    if (p.out.stride[3] == 1)
        for (; c + kLanes <= p.dv; c += kLanes) {
            const cpu::amx::H16x h = __builtin_convertvector(narrowLanes<kind>(loadLanes(acc + c)), cpu::amx::H16x);
            std::memcpy(static_cast<uint16_t*>(p.out.data) + offset + c, &h, sizeof h);
        }
    for (; c < p.dv; ++c) p.out.store(u.b, n1, row, c, acc[c]);
    tile::storeRowStats(p, u.b, n1, row, m, l);
}

// The end of a row in FlashAttentionScore (storeOutputRow), and what the fp32 steps multiply V
// by: the probability itself. FusedInferAttentionScore's prefill (cpu/amx/fia_amx_prefill.cpp)
// brings its own.
template <DotKind kind>
struct FaRows {
    const ForwardParams& p;
    const WorkUnit& u;
    static float probability(float pj) { return pj; }
    ATTNOPS_AMX_FN void store(int64_t n1, int64_t i, float m, float l, float* acc) const {
        storeOutputRow<kind>(p, u, n1, i, m, l, acc);
    }
};

// One strip's step through one key block [k0, k0 + nk) of a superblock: S^T by tiles (the keys
// [k0, k0 + nkS) that a row of the strip keeps), the online softmax, O^T += V^T.P^T by tiles (or
// the fp32 steps where the block's values are not all finite: tiles false). ka and vt are the
// block's packed K and V^T; m, l and acc the strip's.
template <DotKind kind, class Tiles, class Rows>
ATTNOPS_AMX_FN void stripBlock(const ForwardParams& p, const View4& v, const WorkUnit& u, const SeqRule& rule,
                               const HeadDims& h, Tiles& tileUnit, int64_t q0, int64_t q1, int64_t k0, int64_t nk,
                               int64_t nkS, const uint16_t* ka, const uint16_t* vt, bool tiles, const uint16_t* qb,
                               int64_t qbChunkStride, float* m, float* l, float* acc, TransposedScratch& sc,
                               const Rows& out) {
    const int64_t skv = p.seq.kvLen[size_t(u.b)];
    const int64_t keyChunksS = chunksOf(nkS), lda = h.dChunks * kTileK, ldv = chunksOf(nk) * kTileK;
    gemmOn<kind>(tileUnit, tilesOf(nkS), kStripTiles, h.dChunks, ka, lda, qb, qbChunkStride, sc.st, kStripRows, false);
    // Every row keeps every key of the block: no test per score.
    const bool whole = blockFullyKept(rule, q0, q1, k0, k0 + nkS, skv);
    F16x blockMax[kStripTiles], alpha[kStripTiles], mSub[kStripTiles], total[kStripTiles];
    const bool clean = p.scale > 0.0f && (whole ? stripMaximaFast<true>(p, rule, q0, k0, nkS, sc.st, blockMax)
                                                 : stripMaximaFast<false>(p, rule, q0, k0, nkS, sc.st, blockMax));
    if (!clean) stripMaxima(p, rule, q0, k0, nkS, whole, sc.st, blockMax);
    const bool finite = beginStrip(blockMax, m, alpha, mSub);
    for (int64_t lg = 0; lg < kStripTiles; ++lg) total[lg] = splat(0.0f);
    if (clean && finite && tiles) {
        if (whole)
            stripProbabilitiesFast<kind, true>(p, rule, q0, k0, nkS, keyChunksS, sc.st, mSub, total, sc.pb);
        else
            stripProbabilitiesFast<kind, false>(p, rule, q0, k0, nkS, keyChunksS, sc.st, mSub, total, sc.pb);
    } else {
        stripProbabilities<kind>(p, rule, q0, k0, nkS, keyChunksS, whole, sc.st, mSub, total, sc.pb, tiles);
    }
    for (int64_t lg = 0; lg < kStripTiles; ++lg)
        storeLanes(l + lg * kLanes, loadLanes(l + lg * kLanes) * alpha[lg] + total[lg]);
    I16x moved{};
    for (int64_t lg = 0; lg < kStripTiles; ++lg) moved |= alpha[lg] != 1.0f;
    if (cpu::amx::anyLane(moved))  // times 1 changes no bit: skipped while no row's maximum moves
        for (int64_t c = 0; c < h.dv; ++c)
            for (int64_t lg = 0; lg < kStripTiles; ++lg) {
                float* a = acc + c * kStripRows + lg * kLanes;
                storeLanes(a, loadLanes(a) * alpha[lg]);
            }
    if (tiles) {
        gemmOn<kind>(tileUnit, h.dvTiles, kStripTiles, keyChunksS, vt, ldv, sc.pb, kStripTiles * kTileElems, acc,
                     kStripRows, true);
        return;
    }
    // fp32 steps over the kept keys only (0 * Inf would make NaN where the reference skips the
    // key); rows with no kept key in the block add nothing. Rare: V is read again for it.
    tile::loadRows(v, u.b, u.n2, p.seq.kvStart[size_t(u.b)] + k0, nk, h.dv, sc.vf);
    float rowMax[kStripRows];
    for (int64_t lg = 0; lg < kStripTiles; ++lg) storeLanes(rowMax + lg * kLanes, blockMax[lg]);
    for (int64_t j = 0; j < nkS; ++j)
        for (int64_t r = 0; r < q1 - q0; ++r) {
            if (rowMax[r] == tile::kNegInf || !rule.keeps(q0 + r, k0 + j)) continue;
            const float pj = out.probability(sc.st[j * kStripRows + r]);
            for (int64_t c = 0; c < h.dv; ++c) acc[c * kStripRows + r] += pj * sc.vf[j * h.dv + c];
        }
}

// Rows [u.q0, u.q1) of the query heads of kv head u.n2 against every key they may see, with keys
// and values read from k and v (FlashAttentionScore: p.k, p.v; FusedInferAttentionScore: its
// sources), each row ending in rows.store.
//
// The keys go by superblocks of kSuperBlocks key blocks, packed once for every head and strip of
// the unit (K and V^T, 128 KiB each at D 128: they stay in L2). Inside a superblock each strip
// runs through its key blocks before the next strip starts, so that its Q^T, O^T, m and l stay in
// L1 from one block to the next (1-2% faster than key blocks outermost, Intel Xeon with AMX,
// bench/results/intel-xeon-amx/NOTES.md). A strip still meets its keys in ascending order: the
// order changes no bit.
template <DotKind kind, class Tiles, class Rows>
ATTNOPS_AMX_FN void forwardUnitTransposedWith(const ForwardParams& p, const View4& k, const View4& v, TileShape t,
                                              const WorkUnit& u, void* scratch, const Rows& out) {
    Carver carver(scratch);
    TransposedScratch sc(p, t, carver);
    const HeadDims h(p);
    const int64_t sq = p.seq.qLen[size_t(u.b)], skv = p.seq.kvLen[size_t(u.b)];
    const SeqRule rule = seqRule(p.mask, u.b, sq, skv);
    const KeyRange keys = keyRange(rule, u.q0, u.q1, skv);
    const int64_t rows = u.q1 - u.q0, R = roundUp(rows, kStripRows), rowTiles = R / kTileN;
    const int64_t kr = roundUp(t.keyRows, kTileK), qrPad = roundUp(t.queryRows, kStripRows);
    const int64_t lda = h.dChunks * kTileK, dvPad = h.dvTiles * kTileM;
    const int64_t qRow0 = p.seq.qStart[size_t(u.b)] + u.q0;
    cpu::amx::TileSession<Tiles> session;
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
        for (int64_t sb = keys.lo; sb < keys.hi; sb += kSuperBlocks * kr) {
            const int64_t sbEnd = std::min(keys.hi, sb + kSuperBlocks * kr);
            bool tiles[kSuperBlocks];
            for (int64_t k0 = sb, blk = 0; k0 < sbEnd; k0 += kr, ++blk) {
                const int64_t nk = std::min(kr, sbEnd - k0), kvRow0 = p.seq.kvStart[size_t(u.b)] + k0;
                const int64_t ldv = chunksOf(nk) * kTileK;
                uint16_t* vt = sc.vt + blk * dvPad * kr;
                cpu::amx::packRows(k, u.b, u.n2, kvRow0, nk, h.d, tilesOf(nk) * kTileM, lda, sc.ka + blk * kr * lda);
                cpu::amx::packRowsTransposed(v, u.b, u.n2, kvRow0, nk, h.dv, dvPad, ldv, vt);
                // O^T += V^T.P^T multiplies masked (zero) probabilities by V: only with finite values.
                tiles[blk] = allFinite<kind>(vt, dvPad * ldv);
            }
            for (int64_t g = 0; g < heads; ++g) {
                const uint16_t* qb = sc.qb + g * h.dChunks * qrPad * kTileK;
                for (int64_t s0 = 0; s0 < R; s0 += kStripRows) {
                    // The strip's real rows and the keys that one of them keeps.
                    const int64_t q0 = u.q0 + s0, q1 = std::min(u.q1, q0 + kStripRows);
                    const KeyRange strip = keyRange(rule, q0, q1, skv);
                    for (int64_t k0 = sb, blk = 0; k0 < sbEnd; k0 += kr, ++blk) {
                        const int64_t nk = std::min(kr, sbEnd - k0);
                        const int64_t nkS = keysToLastKept(strip, k0, nk);
                        if (nkS == 0) continue;
                        stripBlock<kind>(p, v, u, rule, h, session.tiles, q0, q1, k0, nk, nkS, sc.ka + blk * kr * lda,
                                         sc.vt + blk * dvPad * kr, tiles[blk], qb + s0 / kTileN * kTileElems,
                                         rowTiles * kTileElems, sc.m + g * qrPad + s0, sc.l + g * qrPad + s0,
                                         sc.acc + g * dvPad * qrPad + s0 * dvPad, sc, out);
                    }
                }
            }
        }
        // O^T back to rows: 16 x 16 transposes of the accumulator, then each row scaled and stored.
        for (int64_t g = 0; g < heads; ++g) {
            const float* acc = sc.acc + g * dvPad * qrPad;
            const int64_t n1 = u.n2 * p.group + g0 + g;
            for (int64_t r0 = 0; r0 < rows; r0 += kLanes) {
                const float* strip = acc + (r0 / kStripRows) * kStripRows * dvPad + r0 % kStripRows;
                for (int64_t c0 = 0; c0 < dvPad; c0 += kLanes) {
                    cpu::amx::U16x x[kLanes];  // x[c][r], then x[r][c]
                    for (int64_t c = 0; c < kLanes; ++c)
                        x[c] = cpu::amx::bitsOf(loadLanes(strip + (c0 + c) * kStripRows));
                    cpu::amx::transposeLanes(x);
                    for (int64_t r = 0; r < kLanes; ++r) storeLanes(sc.out + r * dvPad + c0, cpu::amx::floatsOf(x[r]));
                }
                for (int64_t r = 0; r < std::min(kLanes, rows - r0); ++r)
                    out.store(n1, u.q0 + r0 + r, sc.m[g * qrPad + r0 + r], sc.l[g * qrPad + r0 + r], sc.out + r * dvPad);
            }
        }
    }
}

template <DotKind kind, class Tiles>
ATTNOPS_AMX_FN void forwardUnitTransposed(const ForwardParams& p, TileShape t, const WorkUnit& u, void* scratch) {
    forwardUnitTransposedWith<kind, Tiles>(p, p.k, p.v, t, u, scratch, FaRows<kind>{p, u});
}

}  // namespace
}  // namespace attnops::fa

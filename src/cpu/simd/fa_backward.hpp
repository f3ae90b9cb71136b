// The register-blocked flash-attention backward, written once over an instruction-set trait V
// (cpu/simd/microkernels.hpp) and instantiated by the avx512 and avx2 entries: the tiled
// kernel's deterministic scheme (key units own dk/dv rows, query units own dq rows; see
// fa_backward_tiled.cpp) with every product a register-blocked GEMM: S = Q.K^T, dP = dO.V^T,
// dV += P^T.dO, dK += dS^T.Q, dQ += dS.K; fp32 FMAs, or with Pairs (AVX-512 only,
// cpu::avx512::Bf16Pairs) vdpbf16ps on bf16 pairs.
//
// A key unit transposes its key and value block once and walks the query blocks with scores in
// [query][key] order; a query unit transposes its query and dO block once and walks the key
// blocks with scores in [key][query] order, so no block is transposed inside a loop. Without
// pse, explicit mask, dropout or fully masked rows, blocks are computed with vectors (the sparse
// mode's band evaluated per lane; a partly masked block only when the operands its zero
// probabilities multiply are finite); the others take the row steps shared with the tiled kernel.
//
// The fused scheme (entries "avx2-fused", "avx512-fused"; fp32 products, bf16 and fp16 inputs
// widened to fp32 as they are loaded) does the five GEMMs once: a unit is a chunk of query rows
// of one (sequence, kv head) (ops/flash_attention_score/bwd_chunks.hpp: the chunk size is a
// function of the problem only); it walks the key blocks its rows may see in ascending order as
// key units do, over the chunk's rows only, and also adds dS . K to an fp32 dQ of the chunk in
// its scratch, so S and dP are computed once instead of once per unit kind (7 GEMMs for 5), and
// Q, dO and the row statistics are converted once per chunk instead of once per key block. Its
// dK, dV over the chunk's rows go to dk, dv when the chunk is the whole sequence, else to the
// chunk's partial slice, added over the chunks in ascending order by the reduction
// (ops/flash_attention_score/backward.cpp). Problems whose split would pass the bounds of
// bwd_chunks.hpp go to the two-kind scheme.
//
// Order of every reduction, fixed per element: dot products over the head dim ascending; dK
// and dV over query heads of the group, then query rows ascending (fused scheme: within each
// chunk, then the chunks' partials ascending); dQ over keys ascending (in both schemes).
#pragma once

#include <algorithm>
#include <type_traits>

#include "cpu/generic/score_row.hpp"
#include "cpu/simd/fa_backward_bias_steps.hpp"
#include "cpu/simd/microkernels.hpp"
#include "ops/flash_attention_score/bwd_chunks.hpp"
#include "ops/flash_attention_score/kernel.hpp"
#include "ops/flash_attention_score/semantics.hpp"

namespace attnops::fa::simd_backward {

namespace simd = cpu::simd;
using simd::alignUp;

// One thread's arrays; "rows" are query rows, "keys" key rows. Key units use the [row][key]
// arrays, query units the [key][row] ones.
// Leading dimension of a key unit's GEMM operands with n columns: n rounded up to whole lines,
// plus one line where that is a multiple of 256 bytes, so that a GEMM's column strip (the same
// columns of successive rows) spreads over all L1 sets instead of a few (rows 512 bytes apart,
// d = 128 or 128 keys, fall in 8 of the 64 sets of a 32 KiB 8-way L1 and evict each other).
inline int64_t paddedLd(int64_t n) {
    constexpr int64_t kSetStrideFloats = 64;
    const int64_t ld = alignUp(n);
    return ld % kSetStrideFloats == 0 ? ld + 16 : ld;
}

struct Scratch {
    // Key-unit arrays have padded leading dimensions: paddedLd(d), paddedLd(dv), paddedLd(keyRows).
    float* qRows;       // [queryRows][d]        key unit: Q block;  query unit: unused
    float* doRows;      // [queryRows][dv]       key unit: dO block
    float* kt;          // [d][keyRows]          key unit: K block transposed
    float* vt;          // [dv][keyRows]         key unit: V block transposed
    float* s;           // [queryRows][keyRows]  key unit: scores, then P
    float* dp;          // [queryRows][keyRows]  key unit: dP, then dS * scale
    float* dkAcc;       // [keyRows][d]
    float* dvAcc;       // [keyRows][dv]
    float* qt;          // [d][queryRows]        query unit: Q block transposed
    float* dot;         // [dv][queryRows]       query unit: dO block transposed
    float* k;           // [keyRows][d]          query unit: K block (fused key unit: padded)
    float* v;           // [keyRows][dv]         query unit: V block
    float* st;          // [keyRows][queryRows]  query unit: scores, then P
    float* dpt;         // [keyRows][queryRows]  query unit: dP, then dS * scale
    float* dqAcc;       // [queryRows][d]
    float* delta;       // [queryRows] rowsum(dO * O)
    float* rowMax;      // [queryRows] saved softmax max
    float* rowSum;      // [queryRows] saved softmax sum
    float* exactDelta;  // [queryRows] sum_j P_d dP_d (dsink terms)
    float* row;         // [max(d, dv, keyRows)] one loaded row
    float* dyRow;       // [dv] one loaded dO row (query units)
    float* s1;          // [keyRows] one row of scores (row steps of query units)
    float* dp1;         // [keyRows]
    uint8_t* kept;      // [keyRows]
    uint8_t* keep;      // [keyRows]
    // bf16 pairs (the avx512-bf16 entry); "column pairs" pair adjacent columns of a row, "row
    // pairs" adjacent rows of a column; dPairs = ceil(d / 2), likewise dvPairs, rowPairs, keyPairs.
    uint32_t* ktp;   // [dPairs][keyRows]     key unit: K column pairs, transposed
    uint32_t* vtp;   // [dvPairs][keyRows]    key unit: V column pairs, transposed
    uint32_t* qcp;   // [queryRows][dPairs]   key unit: Q column pairs
    uint32_t* docp;  // [queryRows][dvPairs]  key unit: dO column pairs
    uint32_t* qrp;   // [rowPairs][d]         key unit: Q row pairs
    uint32_t* dorp;  // [rowPairs][dv]        key unit: dO row pairs
    uint32_t* pp;    // [rowPairs][keyRows]   key unit: P row pairs
    uint32_t* dsp;   // [max(rowPairs, keyPairs)][max(keyRows, queryRows)] dS row pairs (both units)
    uint32_t* qtp;   // [dPairs][queryRows]   query unit: Q column pairs, transposed
    uint32_t* dotp;  // [dvPairs][queryRows]  query unit: dO column pairs, transposed
    uint32_t* kcp;   // [keyRows][dPairs]     query unit: K column pairs
    uint32_t* vcp;   // [keyRows][dvPairs]    query unit: V column pairs
    uint32_t* krp;   // [keyPairs][d]         query unit, fused key unit: K row pairs
    uint32_t* dscp;  // [queryRows][keyPairs] fused key unit: dS column pairs (the dQ GEMM)

    template <typename Take>
    void carve(const BackwardParams& p, TileShape t, Take&& take) {
        const int64_t d = p.fwd.d, dv = p.fwd.dv, kr = t.keyRows, qr = t.queryRows;
        const int64_t ld = paddedLd(d), ldv = paddedLd(dv), lk = paddedLd(kr);
        qRows = take(qr * ld);
        doRows = take(qr * ldv);
        kt = take(d * lk);
        vt = take(dv * lk);
        s = take(qr * lk);
        dp = take(qr * lk);
        dkAcc = take(kr * d);
        dvAcc = take(kr * dv);
        qt = take(d * qr);
        dot = take(dv * qr);
        k = take(kr * ld);
        v = take(kr * dv);
        st = take(kr * qr);
        dpt = take(kr * qr);
        dqAcc = take(qr * d);
        delta = take(qr);
        rowMax = take(qr);
        rowSum = take(qr);
        exactDelta = take(qr);
        row = take(std::max({d, dv, kr}));
        dyRow = take(dv);
        s1 = take(kr);
        dp1 = take(kr);
        kept = reinterpret_cast<uint8_t*>(take(kr));
        keep = reinterpret_cast<uint8_t*>(take(kr));
        const int64_t dPairs = (d + 1) / 2, dvPairs = (dv + 1) / 2, rowPairs = (qr + 1) / 2, keyPairs = (kr + 1) / 2;
        auto pairs = [&](int64_t n) { return reinterpret_cast<uint32_t*>(take(n)); };
        ktp = pairs(dPairs * kr);
        vtp = pairs(dvPairs * kr);
        qcp = pairs(qr * dPairs);
        docp = pairs(qr * dvPairs);
        qrp = pairs(rowPairs * d);
        dorp = pairs(rowPairs * dv);
        pp = pairs(rowPairs * kr);
        dsp = pairs(std::max(rowPairs, keyPairs) * std::max(kr, qr));
        qtp = pairs(dPairs * qr);
        dotp = pairs(dvPairs * qr);
        kcp = pairs(kr * dPairs);
        vcp = pairs(kr * dvPairs);
        krp = pairs(keyPairs * d);
        dscp = pairs(qr * keyPairs);
    }

    static int64_t floats(const BackwardParams& p, TileShape t) {
        int64_t total = 0;
        Scratch layout;
        layout.carve(p, t, [&](int64_t n) {
            total += alignUp(n);
            return static_cast<float*>(nullptr);
        });
        return total;
    }

    Scratch(const BackwardParams& p, TileShape t, void* base) {
        float* f = static_cast<float*>(base);
        carve(p, t, [&](int64_t n) {
            float* r = f;
            f += alignUp(n);
            return r;
        });
    }

private:
    Scratch() = default;
};

template <class V>
TileShape chooseTile(const BackwardParams& p, const PlatformInfo& info) {
    TileShape t;
    t.queryRows = V::kQueryRows;
    t.keyRows = simd::keyBlockRows(p.fwd.d, p.fwd.dv, info.l2Bytes);
    return t;
}

inline uint64_t scratchBytes(const BackwardParams& p, TileShape t) {
    return uint64_t(Scratch::floats(p, t)) * sizeof(float);
}

// a . b as one FMA chain over c ascending: the order of the dP = dO . V^T GEMM, so that where
// P = 1 exactly (a single kept key) dP - delta is exactly 0, as in the reference.
ATTNOPS_SIMD_INLINE float dotProduct(int64_t n, const float* a, const float* b) {
    float sum = 0.0f;
    for (int64_t c = 0; c < n; ++c) sum = __builtin_fmaf(a[c], b[c], sum);
    return sum;
}

// The per-row values of query rows [q0, q0 + rows): delta = rowsum(dO * O) and the saved softmax
// statistics (lane 0).
struct RowStats {
    float* delta;
    float* rowMax;
    float* rowSum;
};

// dO rows [q0, q0 + rows) of head n1 (row-major into doRows with leading dimension ldRows, or
// dv when 0, when given; transposed into doT with leading dimension ldt when given) and their
// RowStats (st; sc's arrays when not given).
// Returns whether some row is fully masked (saved sum 0).
template <class V>
ATTNOPS_SIMD_INLINE bool loadQueryStats(const BackwardParams& bp, int64_t b, int64_t n1, int64_t q0, int64_t rows,
                                        int64_t ldt, Scratch& sc, float* doRows, float* doT,
                                        const RowStats* st = nullptr, int64_t ldRows = 0) {
    const RowStats own{sc.delta, sc.rowMax, sc.rowSum};
    if (st == nullptr) st = &own;
    const ForwardParams& p = bp.fwd;
    const int64_t row0 = p.seq.qStart[size_t(b)] + q0, dv = p.dv;
    const View4 out{p.out.data, p.out.dtype, {p.out.stride[0], p.out.stride[1], p.out.stride[2], p.out.stride[3]}};
    float* o = sc.row;
    bool anyEmpty = false;
    for (int64_t r = 0; r < rows; ++r) {
        float* dyRow = doRows != nullptr ? doRows + r * (ldRows != 0 ? ldRows : dv) : sc.dyRow;
        simd::loadRow<V>(bp.dy, b, n1, row0 + r, dv, dyRow);
        if (doT != nullptr)
            for (int64_t c = 0; c < dv; ++c) doT[c * ldt + r] = dyRow[c];
        simd::loadRow<V>(out, b, n1, row0 + r, dv, o);
        st->delta[r] = dotProduct(dv, dyRow, o);
        st->rowMax[r] = loadAsFloat(p.softmaxMax.data, p.softmaxMax.offset(b, n1, row0 + r, 0), DType::F32);
        st->rowSum[r] = loadAsFloat(p.softmaxSum.data, p.softmaxSum.offset(b, n1, row0 + r, 0), DType::F32);
        anyEmpty = anyEmpty || st->rowSum[r] == 0.0f;
    }
    return anyEmpty;
}

ATTNOPS_SIMD_INLINE void storeRows(const MutView4& view, int64_t b, int64_t n, int64_t row0, int64_t rows, int64_t cols,
                                   const float* src) {
    for (int64_t r = 0; r < rows; ++r)
        cpu::storeRow(view.data, view.offset(b, n, row0 + r, 0), view.stride[3], view.dtype, cols, src + r * cols);
}

// One vector of rowProbabilities: keys j .. j + kLanes (the first `live` of them with Masked).
template <class V, bool Masked>
ATTNOPS_SIMD_INLINE void probabilityVector(int64_t j, int64_t live, typename V::Vec vs, typename V::Vec vm,
                                           typename V::Vec invL, typename V::Vec vd, float* s, float* dp,
                                           const simd::BandLanes<V>* band, int64_t row, int64_t key0,
                                           typename V::Vec* sumPdP) {
    const auto mk = V::tail(live);
    const auto kept = band != nullptr ? simd::keptKeys<V>(*band, key0 + j, row) : V::all();
    const auto x = simd::rounded(V::mul(Masked ? V::loadMasked(mk, s + j) : V::load(s + j), vs));  // as the forward's
    const auto pr = V::zeroUnless(kept, V::mul(simd::exp<V>(V::sub(x, vm)), invL));
    const auto g = Masked ? V::loadMasked(mk, dp + j) : V::load(dp + j);
    if (sumPdP != nullptr) *sumPdP = V::fmadd(pr, V::zeroUnless(kept, g), *sumPdP);  // masked dP may be inf
    const auto ds = V::zeroUnless(kept, V::mul(V::mul(pr, V::sub(g, vd)), vs));
    if constexpr (Masked) {
        V::storeMasked(s + j, mk, pr);
        V::storeMasked(dp + j, mk, ds);
    } else {
        V::store(s + j, pr);
        V::store(dp + j, ds);
    }
}

// P = exp(scale * s - m) / l and dp := scale * P * (dp - delta) for query row `row` against nk
// keys from key0; with a band, both are 0 for the pairs it masks. With exactDelta, adds
// sum_j P dP to it (per lane over the key vectors ascending, then the lanes ascending).
// Whole vectors are loaded and stored unmasked, only a tail vector masked: AMD cores microcode
// the vmaskmovps store (two per vector here, 3840 per block of 120 rows and 128 keys: 13 us of
// a block's 200-300 us on Zen 3, masked_store_cost.cpp).
template <class V>
ATTNOPS_SIMD_INLINE void rowProbabilities(int64_t nk, float scale, float m, float l, float delta, float* s, float* dp,
                                          const simd::BandLanes<V>* band, int64_t row, int64_t key0,
                                          float* exactDelta = nullptr) {
    const auto vs = V::set1(scale), vm = V::set1(m), invL = V::set1(1.0f / l), vd = V::set1(delta);
    auto sumPdP = V::zero();
    auto* sums = exactDelta != nullptr ? &sumPdP : nullptr;
    const int64_t whole = nk / V::kLanes * V::kLanes;
    for (int64_t j = 0; j < whole; j += V::kLanes)
        probabilityVector<V, false>(j, V::kLanes, vs, vm, invL, vd, s, dp, band, row, key0, sums);
    // (Lanes past nk load 0 and are not stored: the values of the masked loop this replaced.)
    if (whole < nk) probabilityVector<V, true>(whole, nk - whole, vs, vm, invL, vd, s, dp, band, row, key0, sums);
    if (exactDelta != nullptr) {
        float lanes[V::kLanes];
        V::store(lanes, sumPdP);
        float sum = 0.0f;
        for (float lane : lanes) sum += lane;
        *exactDelta += sum;
    }
}

// Pairs = void: everything in fp32. Otherwise bf16 inputs multiplied as bf16 pairs with
// vdpbf16ps, P and dS rounded to bf16 for the GEMMs they feed (as the naive low-precision computation of the tolerance
// rule rounds them); otherwise everything in fp32.
//
// The fused scheme's per-chunk arrays, [group][q1 - q0] rows (the chunk's query rows [q0, q1)
// of each query head of the group), filled before its first key block: Q and dO as fp32 with
// the key unit's padded leading dimensions, converted once per chunk instead of once per key
// block, and the fp32 dQ accumulator ([group][rows][d]). dkPartial, dvPartial: where the
// chunk's dk, dv sums go ([kv length][d], [kv length][dv]); null: to dk and dv.
// With bf16 pairs (avx512-bf16-fused), also Q and dO packed once per chunk from the bf16
// inputs: as column pairs (qcp [group][rows][dPairs], docp [group][rows][dvPairs]) and as row
// pairs of each query head's rows (qrp [group][ceil(rows / 2)][d], dorp likewise with dv; a
// query block starts at an even row of its head's rows, the block size being even); the fp32
// copies serve the row steps. Null in the fp32 scheme.
struct HeadRows {
    float* q;
    float* dO;
    float* dq;
    RowStats stats;
    float* exactDelta;  // sum_j P dP over all keys, with a sink (its dsink terms)
    int64_t q0, q1;
    float* dkPartial;
    float* dvPartial;
    uint32_t *qcp = nullptr, *docp = nullptr, *qrp = nullptr, *dorp = nullptr;
};

// The lines of `floats` floats from `row` into L2 (prefetcht1), for the GEMMs of the next query
// block: a chunk's fp32 Q, dO and dQ rows are megabytes and come back from L3 once per key block,
// and the S and dP GEMMs, which read Q and dO first (a row tile's 6 rows 576 bytes apart, 2 KiB
// each, too short for the hardware prefetcher), ran at 70% of the FMA peak against 96% with
// them in L2 (bench/results/amd-epyc-zen3-avx2/bwd_components.cpp, Zen 3). The L1 hint
// (prefetcht0) slowed the block: it evicts the current block's GEMM operands.
ATTNOPS_SIMD_INLINE void prefetchToL2(const float* row, int64_t floats) {
    constexpr int64_t kLineFloats = 16;
    for (int64_t c = 0; c < floats; c += kLineFloats) __builtin_prefetch(row + c, 0, 2);
}

// The fused scheme's query block after the one at chunk row `at` (rows [at, at + rows) of the
// HeadRows, [group][chunk rows] in order): the next rows, or the chunk's first block after its
// last (the next key block starts there). Returns its first row; *count: its rows (at most qr).
inline int64_t nextChunkBlock(int64_t at, int64_t rows, int64_t totalRows, int64_t qr, int64_t* count) {
    const int64_t next = at + rows < totalRows ? at + rows : 0;
    *count = std::min(qr, totalRows - next);
    return next;
}

// The fp32 GEMMs of a partly masked block (the vector path: Q, dO and, for dQ, K finite), trimmed
// to the pairs its band keeps, per band of 4 register tiles: S and dP over the key strips a band
// of query rows keeps (the other scores keep stale values, which the probabilities step masks to
// 0 without using them), dV and dK over the query rows that keep a band of keys, dQ over the keys
// a band of query rows keeps. What is skipped is a product with a masked P or dS, exactly +0 there,
// times a finite operand: adding it leaves an accumulator unchanged, so every element is the same
// chain over k ascending with the same bits (except, as in the forward's trimming, the sign of an
// accumulator whose terms so far all underflowed to -0, which a skipped +0 term would have made
// +0), with about half of a diagonal block's work left out (causal S = 2048, 120-row query and
// 128-key blocks: 11% of the GEMM work lies in the masked parts of diagonal blocks).
struct BlockBand {
    SeqRule rule;
    int64_t skv, q0, rows, k0, nk;  // query rows [q0, q0 + rows), keys [k0, k0 + nk) of the sequence

    // Block-relative keys that query rows [i0, i1) (block-relative) may keep.
    KeyRange keysOf(int64_t i0, int64_t i1) const {
        const KeyRange k = keyRange(rule, q0 + i0, q0 + i1, skv);
        const int64_t lo = std::clamp<int64_t>(k.lo - k0, 0, nk), hi = std::clamp<int64_t>(k.hi - k0, 0, nk);
        return {lo, std::max(lo, hi)};
    }
    // Block-relative query rows that keep some key of [j0, j1) (block-relative): a row keeps key
    // j when minDiff <= j - row <= maxDiff, or j is in the prefix.
    KeyRange rowsOf(int64_t j0, int64_t j1) const {
        if (k0 + j0 < std::min(rule.prefix, skv)) return {0, rows};
        if (rule.minDiff > rule.maxDiff) return {0, 0};
        const int64_t lo = std::clamp<int64_t>(k0 + j0 - rule.maxDiff - q0, 0, rows);
        const int64_t hi = std::clamp<int64_t>(k0 + j1 - rule.minDiff - q0, 0, rows);
        return {lo, std::max(lo, hi)};
    }
};

template <class V>
constexpr int64_t kBandRows = 4 * V::kTileRows;

// S = Q . K^T and dP = dO . V^T (row-major Q, dO with leading dimensions ld, ldv; transposed K,
// V and the scores with lk), each band of query rows over whole register-tile strips of the keys
// it keeps.
template <class V>
ATTNOPS_SIMD_INLINE void trimmedScoreGemms(const BlockBand& bb, int64_t d, int64_t dv, const float* q, int64_t ld,
                                           const float* dO, int64_t ldv, const float* kt, const float* vt, float* s,
                                           float* dp, int64_t lk) {
    constexpr int64_t W = simd::stripWidth<V>(), B = kBandRows<V>;
    for (int64_t m0 = 0; m0 < bb.rows; m0 += B) {
        const int64_t mb = std::min(B, bb.rows - m0);
        const KeyRange keys = bb.keysOf(m0, m0 + mb);
        const int64_t lo = keys.lo / W * W, hi = std::min(bb.nk, (keys.hi + W - 1) / W * W);
        if (hi <= lo) continue;
        simd::gemm<V, false>(mb, hi - lo, d, q + m0 * ld, ld, kt + lo, lk, s + m0 * lk + lo, lk, false);
        simd::gemm<V, false>(mb, hi - lo, dv, dO + m0 * ldv, ldv, vt + lo, lk, dp + m0 * lk + lo, lk, false);
    }
}

// dV += P^T . dO and dK += dS^T . Q over the query rows each band of keys is kept by, and (dq
// given) dQ += dS . K over the keys each band of query rows keeps.
template <class V>
ATTNOPS_SIMD_INLINE void trimmedGradientGemms(const BlockBand& bb, int64_t d, int64_t dv, const float* q, int64_t ld,
                                              const float* dO, int64_t ldv, const float* s, const float* dp,
                                              int64_t lk, const float* k, float* dvAcc, float* dkAcc, float* dq) {
    constexpr int64_t B = kBandRows<V>;
    for (int64_t j0 = 0; j0 < bb.nk; j0 += B) {
        const int64_t jb = std::min(B, bb.nk - j0);
        const KeyRange r = bb.rowsOf(j0, j0 + jb);
        if (r.hi <= r.lo) continue;
        simd::gemm<V, true>(jb, dv, r.hi - r.lo, s + r.lo * lk + j0, lk, dO + r.lo * ldv, ldv, dvAcc + j0 * dv, dv,
                            true);
        simd::gemm<V, true>(jb, d, r.hi - r.lo, dp + r.lo * lk + j0, lk, q + r.lo * ld, ld, dkAcc + j0 * d, d, true);
    }
    if (dq == nullptr) return;
    for (int64_t m0 = 0; m0 < bb.rows; m0 += B) {
        const int64_t mb = std::min(B, bb.rows - m0);
        const KeyRange keys = bb.keysOf(m0, m0 + mb);
        if (keys.hi <= keys.lo) continue;
        simd::gemm<V, false>(mb, d, keys.hi - keys.lo, dp + m0 * lk + keys.lo, lk, k + keys.lo * ld, ld, dq + m0 * d,
                             d, true);
    }
}

// trimmedScoreGemms on bf16 pairs: Q and dO as column pairs (leading dimensions dPairs,
// dvPairs), K and V as transposed column pairs and the scores with leading dimension lk.
template <class V, class Pairs>
ATTNOPS_SIMD_INLINE void trimmedPairScoreGemms(const BlockBand& bb, int64_t dPairs, int64_t dvPairs, const uint32_t* qcp,
                                               const uint32_t* docp, const uint32_t* ktp, const uint32_t* vtp, float* s,
                                               float* dp, int64_t lk) {
    using Dot = typename Pairs::Dot;
    constexpr int64_t W = simd::stripWidth<V>(), B = kBandRows<V>;
    for (int64_t m0 = 0; m0 < bb.rows; m0 += B) {
        const int64_t mb = std::min(B, bb.rows - m0);
        const KeyRange keys = bb.keysOf(m0, m0 + mb);
        const int64_t lo = keys.lo / W * W, hi = std::min(bb.nk, (keys.hi + W - 1) / W * W);
        if (hi <= lo) continue;
        simd::gemm<V, false, Dot>(mb, hi - lo, dPairs, qcp + m0 * dPairs, dPairs, ktp + lo, lk, s + m0 * lk + lo, lk,
                                  false);
        simd::gemm<V, false, Dot>(mb, hi - lo, dvPairs, docp + m0 * dvPairs, dvPairs, vtp + lo, lk, dp + m0 * lk + lo,
                                  lk, false);
    }
}

// trimmedGradientGemms on bf16 pairs, whose k axes pair rows (dV, dK: P and dS row pairs pp, dsp
// with leading dimension lk against the Q and dO row pairs qrp, dorp) or keys (dQ: the dS column
// pairs dscp, (nk + 1) / 2 a row, against the K row pairs krp): each range of kept rows or keys
// widened to whole pairs. A skipped pair is two zero products: the same bits as in the full
// GEMMs (but the -0 sign of trimmedGradientGemms).
template <class V, class Pairs>
ATTNOPS_SIMD_INLINE void trimmedPairGradientGemms(const BlockBand& bb, int64_t d, int64_t dv, const uint32_t* pp,
                                                  const uint32_t* dsp, int64_t lk, const uint32_t* qrp,
                                                  const uint32_t* dorp, const uint32_t* dscp, const uint32_t* krp,
                                                  float* dvAcc, float* dkAcc, float* dq) {
    using Dot = typename Pairs::Dot;
    constexpr int64_t B = kBandRows<V>;
    for (int64_t j0 = 0; j0 < bb.nk; j0 += B) {
        const int64_t jb = std::min(B, bb.nk - j0);
        const KeyRange r = bb.rowsOf(j0, j0 + jb);
        if (r.hi <= r.lo) continue;
        const int64_t p0 = r.lo / 2, pairs = (r.hi + 1) / 2 - p0;
        simd::gemm<V, true, Dot>(jb, dv, pairs, pp + p0 * lk + j0, lk, dorp + p0 * dv, dv, dvAcc + j0 * dv, dv, true);
        simd::gemm<V, true, Dot>(jb, d, pairs, dsp + p0 * lk + j0, lk, qrp + p0 * d, d, dkAcc + j0 * d, d, true);
    }
    if (dq == nullptr) return;
    const int64_t keyPairs = (bb.nk + 1) / 2;
    for (int64_t m0 = 0; m0 < bb.rows; m0 += B) {
        const int64_t mb = std::min(B, bb.rows - m0);
        const KeyRange keys = bb.keysOf(m0, m0 + mb);
        if (keys.hi <= keys.lo) continue;
        const int64_t k0 = keys.lo / 2, pairs = (keys.hi + 1) / 2 - k0;
        simd::gemm<V, false, Dot>(mb, d, pairs, dscp + m0 * keyPairs + k0, keyPairs, krp + k0 * d, d, dq + m0 * d, d,
                                  true);
    }
}

// With head (the fused scheme): only the chunk's query rows, and also dQ += dS . K into
// head->dq, from the dS this unit computed anyway, so that no query unit has to compute S and dP
// a second time; the row statistics (and with Pairs, the packed Q and dO) come from head, dk and
// dv go to its partials.
template <class V, class Pairs>
ATTNOPS_SIMD_FN void keyBlock(const BackwardParams& bp, TileShape t, const KeyUnit& u, Scratch& sc,
                              const HeadRows* head) {
    const ForwardParams& p = bp.fwd;
    constexpr bool kPairs = !std::is_void_v<Pairs>;
    const int64_t sq = p.seq.qLen[size_t(u.b)], skv = p.seq.kvLen[size_t(u.b)];
    const SeqRule rule = seqRule(p.mask, u.b, sq, skv);
    const int64_t nk = u.k1 - u.k0, kr = t.keyRows, d = p.d, dv = p.dv;
    // (The bf16-pair packing writes its output with the leading dimension of its input, and the
    // pair GEMMs read that as keyRows: no padding of the score rows there.)
    const int64_t ld = paddedLd(d), ldv = paddedLd(dv), lk = kPairs ? kr : paddedLd(kr);
    const int64_t kvRow0 = p.seq.kvStart[size_t(u.b)] + u.k0;
    const bool vectorRows = p.pse.form == PseForm::None && !p.mask.explicitMask && !p.dropout.enabled;
    const bool bandVector = simd::BandLanes<V>::usable(sq, skv);
    const simd::BandLanes<V> band = simd::bandLanes<V>(rule, skv);
    // pse, explicit mask or dropout: blocks take the vector steps of
    // cpu/simd/fa_backward_bias_steps.hpp where the operands are finite. Not with bf16 pairs:
    // their GEMMs round P and dS to bf16, the row steps do not.
    const bool biasRows = !kPairs && simd_bias::usable<V>(p, kr, sq, skv);
    const simd_bias::GradientConstants<V> biasConstants(p);
    simd_bias::RowBias rowBias;
    const int64_t dPairs = (d + 1) / 2, dvPairs = (dv + 1) / 2;
    if constexpr (kPairs) {
        Pairs::packColumnPairsTransposed(p.k, u.b, u.n2, kvRow0, nk, d, kr, sc.ktp);
        Pairs::packColumnPairsTransposed(p.v, u.b, u.n2, kvRow0, nk, dv, kr, sc.vtp);
    } else {
        simd::loadRowsTransposed<V>(p.k, u.b, u.n2, kvRow0, nk, d, lk, sc.row, sc.kt);
        simd::loadRowsTransposed<V>(p.v, u.b, u.n2, kvRow0, nk, dv, lk, sc.row, sc.vt);
    }
    // The fused scheme's dQ GEMM reads K row-major, and multiplies the zero dS of masked pairs
    // by it: a partly masked block goes through the GEMM only when K is finite.
    const float* kRows = sc.k;
    bool kFinite = true;
    if (head != nullptr) {
        simd::loadRows<V>(p.k, u.b, u.n2, kvRow0, nk, d, ld, sc.k);
        kFinite = simd::allFinite<V>(kRows, nk, d, ld);
        if constexpr (kPairs) Pairs::packRowPairs(p.k, u.b, u.n2, kvRow0, nk, d, sc.krp);  // dQ += dS . K
    }
    // With a sink, the row steps' sum_j P dP_d multiplies the dP of masked pairs by 0: the bias
    // steps' 0 for them is the same only where dP is finite.
    const bool sinkSum = head != nullptr && bp.sinkRowTerms != nullptr;
    const bool vFinite = !(biasRows && sinkSum) || simd::allFinite<V>(sc.vt, dv, nk, lk);
    // dK, dV sums: this chunk's partial slice when the sequence has several chunks.
    const bool partial = head != nullptr && head->dkPartial != nullptr;
    float* const dkAcc = partial ? head->dkPartial + u.k0 * d : sc.dkAcc;
    float* const dvAcc = partial ? head->dvPartial + u.k0 * dv : sc.dvAcc;
    std::fill(dkAcc, dkAcc + nk * d, 0.0f);
    std::fill(dvAcc, dvAcc + nk * dv, 0.0f);
    const int64_t qBegin = head != nullptr ? head->q0 : 0, qEnd = head != nullptr ? head->q1 : sq;
    for (int64_t g = 0; g < p.group; ++g) {
        const int64_t n1 = u.n2 * p.group + g;
        for (int64_t q0 = qBegin; q0 < qEnd; q0 += t.queryRows) {
            const int64_t rows = std::min(t.queryRows, qEnd - q0);
            const KeyRange keys = keyRange(rule, q0, q0 + rows, skv);
            if (keys.hi <= u.k0 || keys.lo >= u.k1) continue;  // this query block never sees these keys
            const int64_t qRow0 = p.seq.qStart[size_t(u.b)] + q0;
            const float* qRows = sc.qRows;
            const float* doRows = sc.doRows;
            const float *delta = sc.delta, *rowMax = sc.rowMax, *rowSum = sc.rowSum;
            float* dq = nullptr;
            float* exactDelta = nullptr;
            bool anyEmpty = false;
            // The next query block's Q, dO and dQ rows, fetched into L2 while this block computes its
            // probabilities (fused scheme).
            const float *nextQ = nullptr, *nextDo = nullptr, *nextDq = nullptr;
            int64_t nextRows = 0;
            // With pairs: the block's packed Q and dO (from head, or packed here).
            const uint32_t *qcp = sc.qcp, *docp = sc.docp, *qrp = sc.qrp, *dorp = sc.dorp;
            if (head != nullptr) {
                const int64_t at = g * (qEnd - qBegin) + (q0 - qBegin);
                const int64_t next = nextChunkBlock(at, rows, p.group * (qEnd - qBegin), t.queryRows, &nextRows);
                nextQ = head->q + next * ld;
                nextDo = head->dO + next * ldv;
                nextDq = head->dq + next * d;
                qRows = head->q + at * ld;
                doRows = head->dO + at * ldv;
                delta = head->stats.delta + at;
                rowMax = head->stats.rowMax + at;
                rowSum = head->stats.rowSum + at;
                anyEmpty = std::find(rowSum, rowSum + rows, 0.0f) != rowSum + rows;
                dq = head->dq + at * d;
                if (bp.sinkRowTerms != nullptr) exactDelta = head->exactDelta + at;
                if constexpr (kPairs) {
                    static_assert(V::kQueryRows % 2 == 0, "query blocks must start on a row pair");
                    const int64_t headRows = qEnd - qBegin, pairAt = g * ((headRows + 1) / 2) + (q0 - qBegin) / 2;
                    qcp = head->qcp + at * dPairs;
                    docp = head->docp + at * dvPairs;
                    qrp = head->qrp + pairAt * d;
                    dorp = head->dorp + pairAt * dv;
                    nextQ = reinterpret_cast<const float*>(head->qcp + next * dPairs);  // the pair GEMMs' A rows
                    nextDo = reinterpret_cast<const float*>(head->docp + next * dvPairs);
                }
            } else {
                simd::loadRows<V>(p.q, u.b, n1, qRow0, rows, d, ld, sc.qRows);
                simd::loadRows<V>(bp.dy, u.b, n1, qRow0, rows, dv, ldv, sc.doRows);
                anyEmpty = loadQueryStats<V>(bp, u.b, n1, q0, rows, 0, sc, nullptr, nullptr);
            }
            const bool full = blockFullyKept(rule, q0, q0 + rows, u.k0, u.k1, skv);
            // Q, dO and (fused) K finite: the zero P and dS of masked pairs may go through the GEMMs.
            const bool finite = (!full || biasRows) && kFinite && simd::allFinite<V>(qRows, rows, d, ld) &&
                                simd::allFinite<V>(doRows, rows, dv, ldv);
            const bool biasPath = biasRows && finite && vFinite;
            const bool vectorPath = (vectorRows && !anyEmpty && (full || (bandVector && finite))) || biasPath;
            const BlockBand blockBand{rule, skv, q0, rows, u.k0, nk};
            if constexpr (kPairs) {
                if (head == nullptr) {
                    Pairs::packColumnPairs(p.q, u.b, n1, qRow0, rows, d, dPairs, sc.qcp);
                    Pairs::packColumnPairs(bp.dy, u.b, n1, qRow0, rows, dv, dvPairs, sc.docp);
                }
                if (vectorPath && !full) {
                    trimmedPairScoreGemms<V, Pairs>(blockBand, dPairs, dvPairs, qcp, docp, sc.ktp, sc.vtp, sc.s, sc.dp,
                                                    kr);
                } else {
                    using Dot = typename Pairs::Dot;
                    simd::gemm<V, false, Dot>(rows, nk, dPairs, qcp, dPairs, sc.ktp, kr, sc.s, lk, false);
                    simd::gemm<V, false, Dot>(rows, nk, dvPairs, docp, dvPairs, sc.vtp, kr, sc.dp, lk, false);
                }
            } else {
                if (vectorPath && !full) {
                    trimmedScoreGemms<V>(blockBand, d, dv, qRows, ld, doRows, ldv, sc.kt, sc.vt, sc.s, sc.dp, lk);
                } else {
                    simd::gemm<V, false>(rows, nk, d, qRows, ld, sc.kt, lk, sc.s, lk, false);      // S = Q . K^T
                    simd::gemm<V, false>(rows, nk, dv, doRows, ldv, sc.vt, lk, sc.dp, lk, false);  // dP = dO . V^T
                }
            }
            if (vectorPath) {
                for (int64_t r = 0; r < rows; ++r) {
                    if (r < nextRows) {
                        prefetchToL2(nextQ + r * (kPairs ? dPairs : ld), kPairs ? dPairs : d);
                        prefetchToL2(nextDo + r * (kPairs ? dvPairs : ldv), kPairs ? dvPairs : dv);
                        prefetchToL2(nextDq + r * d, d);
                    }
                    float* rowDelta = exactDelta != nullptr ? exactDelta + r : nullptr;
                    if (biasPath)
                        simd_bias::rowGradients<V>(p, biasConstants, u.b, n1, full ? nullptr : &band, q0 + r, u.k0,
                                                   nk, rowMax[r], rowSum[r], delta[r], sc.s + r * lk, sc.dp + r * lk,
                                                   rowBias, rowDelta);
                    else
                        rowProbabilities<V>(nk, p.scale, rowMax[r], rowSum[r], delta[r], sc.s + r * lk,
                                            sc.dp + r * lk, full ? nullptr : &band, q0 + r, u.k0, rowDelta);
                }
                if constexpr (kPairs) {
                    const int64_t rowPairs = (rows + 1) / 2;
                    Pairs::packFloatRowPairs(sc.s, rows, nk, lk, sc.pp);
                    Pairs::packFloatRowPairs(sc.dp, rows, nk, lk, sc.dsp);
                    if (head == nullptr) {
                        Pairs::packRowPairs(bp.dy, u.b, n1, qRow0, rows, dv, sc.dorp);
                        Pairs::packRowPairs(p.q, u.b, n1, qRow0, rows, d, sc.qrp);
                    }
                    const int64_t keyPairs = (nk + 1) / 2;
                    // dQ += dS . K (fused scheme), dS rounded to bf16 as for dK
                    if (dq != nullptr) Pairs::packFloatColumnPairs(sc.dp, rows, nk, lk, keyPairs, sc.dscp);
                    if (!full) {
                        trimmedPairGradientGemms<V, Pairs>(blockBand, d, dv, sc.pp, sc.dsp, kr, qrp, dorp, sc.dscp,
                                                           sc.krp, dvAcc, dkAcc, dq);
                    } else {
                        using Dot = typename Pairs::Dot;
                        simd::gemm<V, true, Dot>(nk, dv, rowPairs, sc.pp, kr, dorp, dv, dvAcc, dv, true);
                        simd::gemm<V, true, Dot>(nk, d, rowPairs, sc.dsp, kr, qrp, d, dkAcc, d, true);
                        if (dq != nullptr)
                            simd::gemm<V, false, Dot>(rows, d, keyPairs, sc.dscp, keyPairs, sc.krp, d, dq, d, true);
                    }
                } else if (!full) {
                    trimmedGradientGemms<V>(blockBand, d, dv, qRows, ld, doRows, ldv, sc.s, sc.dp, lk, kRows, dvAcc,
                                            dkAcc, dq);
                } else {
                    simd::gemm<V, true>(nk, dv, rows, sc.s, lk, doRows, ldv, dvAcc, dv, true);  // dV += P^T . dO
                    simd::gemm<V, true>(nk, d, rows, sc.dp, lk, qRows, ld, dkAcc, d, true);     // dK += dS^T . Q
                    if (dq != nullptr) simd::gemm<V, false>(rows, d, nk, sc.dp, lk, kRows, ld, dq, d, true);  // dQ += dS . K
                }
                continue;
            }
            for (int64_t r = 0; r < rows; ++r) {
                if (rowSum[r] == 0.0f) continue;  // fully masked row: P = 0
                float* s = sc.s + r * lk;
                float* dp = sc.dp + r * lk;
                if (!tile::rowGradients(bp, u.b, n1, rule, q0 + r, u.k0, nk, skv, rowMax[r], rowSum[r], delta[r], s,
                                        dp, sc.kept, sc.keep, exactDelta != nullptr ? exactDelta + r : nullptr))
                    continue;
                for (int64_t j = 0; j < nk; ++j) {
                    if (!sc.kept[j]) continue;
                    float pd = s[j];
                    if (p.dropout.enabled) pd = sc.keep[j] ? pd * p.dropout.invKeepProb : 0.0f;
                    simd::axpy<V>(dv, pd, doRows + r * ldv, dvAcc + j * dv);
                    simd::axpy<V>(d, p.scale * dp[j], qRows + r * ld, dkAcc + j * d);
                    if (dq != nullptr) simd::axpy<V>(d, p.scale * dp[j], kRows + j * ld, dq + r * d);
                }
            }
        }
    }
    if (partial) return;
    storeRows(bp.dk, u.b, u.n2, kvRow0, nk, d, dkAcc);
    storeRows(bp.dv, u.b, u.n2, kvRow0, nk, dv, dvAcc);
}

template <class V, class Pairs>
ATTNOPS_SIMD_FN void runKeyUnit(const BackwardParams& bp, TileShape t, const KeyUnit& u, void* scratch) {
    Scratch sc(bp, t, scratch);
    keyBlock<V, Pairs>(bp, t, u, sc, nullptr);
}

// Floats (4-byte elements) of the fused scheme's HeadRows for a chunk of headRows query rows per
// query head ([group][headRows] rows), with the bf16 pairs or without.
inline uint64_t headRowsFloats(const ForwardParams& p, int64_t headRows, bool pairs) {
    const int64_t rows = p.group * headRows;
    uint64_t floats = uint64_t(alignUp(rows * paddedLd(p.d)) + alignUp(rows * paddedLd(p.dv)) + alignUp(rows * p.d) +
                               4 * alignUp(rows));
    if (pairs) {
        const int64_t rowPairs = p.group * ((headRows + 1) / 2);
        floats += uint64_t(alignUp(rows * ((p.d + 1) / 2)) + alignUp(rows * ((p.dv + 1) / 2)) +
                           alignUp(rowPairs * p.d) + alignUp(rowPairs * p.dv));
    }
    return floats;
}

// Problems the fused scheme takes: those with a chunk split within the bounds of
// ops/flash_attention_score/bwd_chunks.hpp (per-thread rows, partials).
template <class V>
bool fusedAccepts(const BackwardParams& bp) {
    return chunks::chunkRows(bp.fwd, V::kQueryRows) > 0;
}

// The fused scheme's per-thread workspace: the Scratch, then the HeadRows of one chunk with all
// its query heads. (The partials are booked by the plan.)
template <bool kPairs>
uint64_t fusedScratchBytes(const BackwardParams& p, TileShape t) {
    const int64_t rows = chunks::chunkRows(p.fwd, t.queryRows);
    return (uint64_t(Scratch::floats(p, t)) + headRowsFloats(p.fwd, rows, kPairs)) * sizeof(float);
}

// The fused scheme: a unit (chunk c.q0..c.q1 of kv head c.n2 of sequence c.b) runs the key
// blocks its rows may see in ascending order, each as a key unit over the chunk's rows that also
// adds its dS . K to the dQ of every row of the chunk. Each dQ element is then one FMA chain
// over the keys ascending (as in a query unit) and has one writer; dK, dV over the chunk's rows
// go to the chunk's own partial slice (summed over chunks in a fixed order by the reduction) or,
// for a one-chunk sequence, to dk, dv. Chunks depend on the problem only: the result does not
// depend on the thread count. With Pairs, the chunk's Q and dO are also packed as bf16 pairs
// here, once, and the five GEMMs run on them.
template <class V, class Pairs = void>
ATTNOPS_SIMD_FN void runHeadUnit(const BackwardParams& bp, TileShape t, const HeadChunk& c, void* scratch) {
    const ForwardParams& p = bp.fwd;
    Scratch sc(bp, t, scratch);
    const int64_t sq = p.seq.qLen[size_t(c.b)], skv = p.seq.kvLen[size_t(c.b)], d = p.d;
    const int64_t rows = c.q1 - c.q0, maxRows = p.group * rows, ld = paddedLd(p.d), ldv = paddedLd(p.dv);
    float* f = static_cast<float*>(scratch) + Scratch::floats(bp, t);
    HeadRows head;
    head.q = f;
    f += alignUp(maxRows * ld);
    head.dO = f;
    f += alignUp(maxRows * ldv);
    head.dq = f;
    f += alignUp(maxRows * d);
    head.stats.delta = f;
    head.stats.rowMax = f + alignUp(maxRows);
    head.stats.rowSum = f + 2 * alignUp(maxRows);
    head.exactDelta = f + 3 * alignUp(maxRows);
    head.q0 = c.q0;
    head.q1 = c.q1;
    head.dkPartial = c.dkPartial;
    head.dvPartial = c.dvPartial;
    const int64_t qRow0 = p.seq.qStart[size_t(c.b)] + c.q0;
    constexpr bool kPairs = !std::is_void_v<Pairs>;
    const int64_t dPairs = (d + 1) / 2, dvPairs = (p.dv + 1) / 2, rowPairs = (rows + 1) / 2;
    if constexpr (kPairs) {
        auto* u = reinterpret_cast<uint32_t*>(f + 4 * alignUp(maxRows));
        head.qcp = u;
        u += alignUp(maxRows * dPairs);
        head.docp = u;
        u += alignUp(maxRows * dvPairs);
        head.qrp = u;
        u += alignUp(p.group * rowPairs * d);
        head.dorp = u;
    }
    std::fill(head.dq, head.dq + maxRows * d, 0.0f);
    std::fill(head.exactDelta, head.exactDelta + maxRows, 0.0f);
    for (int64_t g = 0; g < p.group; ++g) {
        const int64_t n1 = c.n2 * p.group + g;
        const RowStats st{head.stats.delta + g * rows, head.stats.rowMax + g * rows, head.stats.rowSum + g * rows};
        simd::loadRows<V>(p.q, c.b, n1, qRow0, rows, d, ld, head.q + g * rows * ld);
        loadQueryStats<V>(bp, c.b, n1, c.q0, rows, 0, sc, head.dO + g * rows * ldv, nullptr, &st, ldv);
        if constexpr (kPairs) {
            Pairs::packColumnPairs(p.q, c.b, n1, qRow0, rows, d, dPairs, head.qcp + g * rows * dPairs);
            Pairs::packColumnPairs(bp.dy, c.b, n1, qRow0, rows, p.dv, dvPairs, head.docp + g * rows * dvPairs);
            Pairs::packRowPairs(p.q, c.b, n1, qRow0, rows, d, head.qrp + g * rowPairs * d);
            Pairs::packRowPairs(bp.dy, c.b, n1, qRow0, rows, p.dv, head.dorp + g * rowPairs * p.dv);
        }
    }
    // A one-chunk sequence writes every key block's dk, dv (zero where no row sees it); a chunk
    // writes the partials of the blocks its rows may see, which the reduction reads.
    const SeqRule rule = seqRule(p.mask, c.b, sq, skv);
    for (int64_t k0 = 0; k0 < skv; k0 += t.keyRows) {
        const int64_t k1 = std::min(skv, k0 + t.keyRows);
        if (c.dkPartial != nullptr && !chunks::chunkSeesKeys(rule, c.q0, c.q1, skv, k0, k1)) continue;
        keyBlock<V, Pairs>(bp, t, KeyUnit{c.b, c.n2, k0, k1}, sc, &head);
    }
    for (int64_t g = 0; g < p.group; ++g) {
        const int64_t n1 = c.n2 * p.group + g;
        storeRows(bp.dq, c.b, n1, qRow0, rows, d, head.dq + g * rows * d);
        if (bp.sinkRowTerms != nullptr)
            tile::writeSinkRowTerms(bp, c.b, n1, c.q0, rows, head.stats.rowMax + g * rows,
                                    head.stats.rowSum + g * rows, head.exactDelta + g * rows);
    }
}

// rowProbabilities for a [key][row] block, 16 rows per vector (rows from row0, keys from key0);
// adds sum_j P dP to exactDelta when given.
template <class V>
ATTNOPS_SIMD_INLINE void blockProbabilitiesTransposed(const Scratch& sc, int64_t rows, int64_t nk, int64_t ld,
                                                      float scale, float* exactDelta, const simd::BandLanes<V>* band,
                                                      int64_t row0, int64_t key0) {
    const auto vs = V::set1(scale);
    for (int64_t r0 = 0; r0 < rows; r0 += V::kLanes) {
        const auto m = V::load(sc.rowMax + r0);
        const auto invL = V::div(V::set1(1.0f), V::load(sc.rowSum + r0));
        const auto delta = V::load(sc.delta + r0);
        auto sumPdP = V::zero();
        for (int64_t j = 0; j < nk; ++j) {
            float* s = sc.st + j * ld + r0;
            float* dp = sc.dpt + j * ld + r0;
            const auto kept = band != nullptr ? simd::keptRows<V>(*band, key0 + j, row0 + r0) : V::all();
            const auto x = simd::rounded(V::mul(V::load(s), vs));  // as the forward's
            const auto pr = V::zeroUnless(kept, V::mul(simd::exp<V>(V::sub(x, m)), invL));
            const auto g = V::load(dp);
            sumPdP = V::fmadd(pr, g, sumPdP);
            const auto ds = V::mul(V::mul(pr, V::sub(g, delta)), vs);
            V::store(dp, V::zeroUnless(kept, ds));
        }
        if (exactDelta != nullptr) V::store(exactDelta + r0, V::add(V::load(exactDelta + r0), sumPdP));
    }
}

template <class V, class Pairs>
ATTNOPS_SIMD_FN void runQueryUnit(const BackwardParams& bp, TileShape t, const WorkUnit& u, void* scratch) {
    const ForwardParams& p = bp.fwd;
    constexpr bool kPairs = !std::is_void_v<Pairs>;
    Scratch sc(bp, t, scratch);
    const int64_t sq = p.seq.qLen[size_t(u.b)], skv = p.seq.kvLen[size_t(u.b)];
    const SeqRule rule = seqRule(p.mask, u.b, sq, skv);
    const KeyRange keys = keyRange(rule, u.q0, u.q1, skv);
    const int64_t rows = u.q1 - u.q0, qr = t.queryRows, d = p.d, dv = p.dv;
    const int64_t dPairs = (d + 1) / 2, dvPairs = (dv + 1) / 2;
    const int64_t qRow0 = p.seq.qStart[size_t(u.b)] + u.q0;
    const bool vectorRows = p.pse.form == PseForm::None && !p.mask.explicitMask && !p.dropout.enabled;
    const bool bandVector = simd::BandLanes<V>::usable(sq, skv);
    const simd::BandLanes<V> band = simd::bandLanes<V>(rule, skv);
    // pse, explicit mask or dropout: the vector steps of cpu/simd/fa_backward_bias_steps.hpp where
    // K is finite (the dQ GEMM multiplies the zero dS of masked pairs by it) and, with a sink, V
    // and dO too (the row steps' sum_j P dP_d multiplies the dP of masked pairs by 0).
    const bool biasRows = !kPairs && simd_bias::usable<V>(p, t.keyRows, sq, skv);
    simd_bias::LaneTables<V> laneTables;
    for (int64_t g = 0; g < p.group; ++g) {
        const int64_t n1 = u.n2 * p.group + g;
        bool anyEmpty = false;
        if constexpr (kPairs) {
            Pairs::packColumnPairsTransposed(p.q, u.b, n1, qRow0, rows, d, qr, sc.qtp);
            Pairs::packColumnPairsTransposed(bp.dy, u.b, n1, qRow0, rows, dv, qr, sc.dotp);
            anyEmpty = loadQueryStats<V>(bp, u.b, n1, u.q0, rows, qr, sc, nullptr, nullptr);
        } else {
            simd::loadRowsTransposed<V>(p.q, u.b, n1, qRow0, rows, d, qr, sc.row, sc.qt);
            anyEmpty = loadQueryStats<V>(bp, u.b, n1, u.q0, rows, qr, sc, nullptr, sc.dot);
        }
        const bool sinkSum = bp.sinkRowTerms != nullptr;
        const bool doFinite = !(biasRows && sinkSum) || simd::allFinite<V>(sc.dot, dv, rows, qr);
        std::fill(sc.dqAcc, sc.dqAcc + rows * d, 0.0f);
        std::fill(sc.exactDelta, sc.exactDelta + qr, 0.0f);
        float* exactDelta = bp.sinkRowTerms != nullptr ? sc.exactDelta : nullptr;
        for (int64_t k0 = keys.lo; k0 < keys.hi; k0 += t.keyRows) {
            const int64_t nk = std::min(t.keyRows, keys.hi - k0);
            const int64_t kvRow0 = p.seq.kvStart[size_t(u.b)] + k0;
            // fp32 K (the row steps and the dQ GEMM read it) and V, where they are stored when no
            // conversion is needed.
            const float* kRows = simd::storedFloatRows(p.k, u.b, u.n2, kvRow0, d);
            if (kRows == nullptr) {
                simd::loadRows<V>(p.k, u.b, u.n2, kvRow0, nk, d, d, sc.k);
                kRows = sc.k;
            }
            bool biasPath = false;
            if constexpr (kPairs) {
                Pairs::packColumnPairs(p.k, u.b, u.n2, kvRow0, nk, d, dPairs, sc.kcp);
                Pairs::packColumnPairs(p.v, u.b, u.n2, kvRow0, nk, dv, dvPairs, sc.vcp);
                simd::gemm<V, false, typename Pairs::Dot>(nk, rows, dPairs, sc.kcp, dPairs, sc.qtp, qr, sc.st, qr,
                                                          false);
                simd::gemm<V, false, typename Pairs::Dot>(nk, rows, dvPairs, sc.vcp, dvPairs, sc.dotp, qr, sc.dpt, qr,
                                                          false);
            } else {
                const float* vRows = simd::storedFloatRows(p.v, u.b, u.n2, kvRow0, dv);
                if (vRows == nullptr) {
                    simd::loadRows<V>(p.v, u.b, u.n2, kvRow0, nk, dv, dv, sc.v);
                    vRows = sc.v;
                }
                simd::gemm<V, false>(nk, rows, d, kRows, d, sc.qt, qr, sc.st, qr, false);      // S^T = K . Q^T
                simd::gemm<V, false>(nk, rows, dv, vRows, dv, sc.dot, qr, sc.dpt, qr, false);  // dP^T = V . dO^T
                biasPath = biasRows && doFinite && simd::allFinite<V>(kRows, nk, d, d) &&
                           (!sinkSum || simd::allFinite<V>(vRows, nk, dv, dv));
            }
            const bool full = blockFullyKept(rule, u.q0, u.q1, k0, k0 + nk, skv);
            if (biasPath ||
                (vectorRows && !anyEmpty && (full || (bandVector && simd::allFinite<V>(kRows, nk, d, d))))) {
                if (biasPath)
                    simd_bias::blockGradientsTransposed<V>(p, u.b, n1, full ? nullptr : &band, u.q0, rows, k0, nk,
                                                           sc.st, sc.dpt, qr, sc.rowMax, sc.rowSum, sc.delta,
                                                           exactDelta, laneTables);
                else
                    blockProbabilitiesTransposed<V>(sc, rows, nk, qr, p.scale, exactDelta, full ? nullptr : &band,
                                                    u.q0, k0);
                if constexpr (kPairs) {
                    Pairs::packFloatRowPairs(sc.dpt, nk, rows, qr, sc.dsp);
                    Pairs::packRowPairs(p.k, u.b, u.n2, kvRow0, nk, d, sc.krp);
                    simd::gemm<V, true, typename Pairs::Dot>(rows, d, (nk + 1) / 2, sc.dsp, qr, sc.krp, d, sc.dqAcc, d,
                                                             true);
                } else {
                    simd::gemm<V, true>(rows, d, nk, sc.dpt, qr, kRows, d, sc.dqAcc, d, true);  // dQ += dS . K
                }
                continue;
            }
            for (int64_t r = 0; r < rows; ++r) {
                if (sc.rowSum[r] == 0.0f) continue;
                for (int64_t j = 0; j < nk; ++j) {
                    sc.s1[j] = sc.st[j * qr + r];
                    sc.dp1[j] = sc.dpt[j * qr + r];
                }
                if (!tile::rowGradients(bp, u.b, n1, rule, u.q0 + r, k0, nk, skv, sc.rowMax[r], sc.rowSum[r],
                                        sc.delta[r], sc.s1, sc.dp1, sc.kept, sc.keep,
                                        exactDelta ? exactDelta + r : nullptr))
                    continue;
                for (int64_t j = 0; j < nk; ++j)
                    if (sc.kept[j]) simd::axpy<V>(d, p.scale * sc.dp1[j], kRows + j * d, sc.dqAcc + r * d);
            }
        }
        storeRows(bp.dq, u.b, n1, qRow0, rows, d, sc.dqAcc);
        if (exactDelta != nullptr) tile::writeSinkRowTerms(bp, u.b, n1, u.q0, rows, sc.rowMax, sc.rowSum, exactDelta);
    }
}

}  // namespace attnops::fa::simd_backward

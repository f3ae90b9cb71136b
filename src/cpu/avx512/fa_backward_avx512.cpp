// The AVX-512 flash-attention backward: the tiled kernel's deterministic scheme (key units own
// dk/dv rows, query units own dq rows; see fa_backward_tiled.cpp) with every product a
// register-blocked GEMM: S = Q.K^T, dP = dO.V^T, dV += P^T.dO, dK += dS^T.Q, dQ += dS.K; fp32
// FMAs in the "avx512" entry, vdpbf16ps on bf16 pairs in the "avx512-bf16" entry (which accepts
// only problems whose operands are all bf16; the planner gives the others to "avx512").
//
// A key unit transposes its key and value block once and walks the query blocks with scores in
// [query][key] order; a query unit transposes its query and dO block once and walks the key
// blocks with scores in [key][query] order, so no block is transposed inside a loop. Without
// pse, explicit mask, dropout or fully masked rows, blocks are computed with vectors (the sparse
// mode's band evaluated per lane; a partly masked block only when the operands its zero
// probabilities multiply are finite); the others take the row steps shared with the tiled kernel.
//
// Order of every reduction, fixed per element: dot products over the head dim ascending; dK
// and dV over query heads of the group, then query rows ascending; dQ over keys ascending.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/avx512/microkernels.hpp"
#include "cpu/generic/score_row.hpp"
#include "cpu/isa.hpp"
#include "ops/flash_attention_score/kernel.hpp"
#include "ops/flash_attention_score/semantics.hpp"

namespace attnops::fa {
namespace {

namespace simd = cpu::avx512;
using Pairs = simd::Bf16PairDot;
using tile::kNegInf;

constexpr int64_t kAlignFloats = 16;
int64_t alignUp(int64_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

// One thread's arrays; "rows" are query rows, "keys" key rows. Key units use the [row][key]
// arrays, query units the [key][row] ones.
struct Scratch {
    float* qRows;    // [queryRows][d]        key unit: Q block;  query unit: unused
    float* doRows;   // [queryRows][dv]       key unit: dO block
    float* kt;       // [d][keyRows]          key unit: K block transposed
    float* vt;       // [dv][keyRows]         key unit: V block transposed
    float* s;        // [queryRows][keyRows]  key unit: scores, then P
    float* dp;       // [queryRows][keyRows]  key unit: dP, then dS * scale
    float* dkAcc;    // [keyRows][d]
    float* dvAcc;    // [keyRows][dv]
    float* qt;       // [d][queryRows]        query unit: Q block transposed
    float* dot;      // [dv][queryRows]       query unit: dO block transposed
    float* k;        // [keyRows][d]          query unit: K block
    float* v;        // [keyRows][dv]         query unit: V block
    float* st;       // [keyRows][queryRows]  query unit: scores, then P
    float* dpt;      // [keyRows][queryRows]  query unit: dP, then dS * scale
    float* dqAcc;    // [queryRows][d]
    float* delta;    // [queryRows] rowsum(dO * O)
    float* rowMax;   // [queryRows] saved softmax max
    float* rowSum;   // [queryRows] saved softmax sum
    float* exactDelta;  // [queryRows] sum_j P_d dP_d (dsink terms)
    float* row;      // [max(d, dv, keyRows)] one loaded row
    float* dyRow;    // [dv] one loaded dO row (query units)
    float* s1;       // [keyRows] one row of scores (row steps of query units)
    float* dp1;      // [keyRows]
    uint8_t* kept;   // [keyRows]
    uint8_t* keep;   // [keyRows]
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
    uint32_t* krp;   // [keyPairs][d]         query unit: K row pairs

    template <typename Take>
    void carve(const BackwardParams& p, TileShape t, Take&& take) {
        const int64_t d = p.fwd.d, dv = p.fwd.dv, kr = t.keyRows, qr = t.queryRows;
        qRows = take(qr * d);
        doRows = take(qr * dv);
        kt = take(d * kr);
        vt = take(dv * kr);
        s = take(qr * kr);
        dp = take(qr * kr);
        dkAcc = take(kr * d);
        dvAcc = take(kr * dv);
        qt = take(d * qr);
        dot = take(dv * qr);
        k = take(kr * d);
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

TileShape chooseTile(const BackwardParams& p, const PlatformInfo& info) {
    TileShape t;
    t.queryRows = 64;
    t.keyRows = simd::keyBlockRows(p.fwd.d, p.fwd.dv, info.l2Bytes);
    return t;
}

uint64_t scratchBytes(const BackwardParams& p, TileShape t) { return uint64_t(Scratch::floats(p, t)) * sizeof(float); }

bool blockFullyKept(const SeqRule& rule, int64_t q0, int64_t q1, int64_t k0, int64_t k1, int64_t skv) {
    const int64_t prefixEnd = std::min(rule.prefix, skv);
    if (k1 <= prefixEnd) return true;
    const KeyRange first = rowBand(rule, q0, skv), last = rowBand(rule, q1 - 1, skv);
    return std::max(k0, prefixEnd) >= last.lo && k1 <= first.hi;
}

// a . b as one FMA chain over c ascending: the order of the dP = dO . V^T GEMM, so that where
// P = 1 exactly (a single kept key) dP - delta is exactly 0, as in the reference.
ATTNOPS_AVX512_INLINE float dotProduct(int64_t n, const float* a, const float* b) {
    float sum = 0.0f;
    for (int64_t c = 0; c < n; ++c) sum = __builtin_fmaf(a[c], b[c], sum);
    return sum;
}

// dO rows [q0, q0 + rows) of head n1 (row-major into doRows when given, transposed into doT
// with leading dimension ldt when given), delta = rowsum(dO * O) and the saved statistics
// (lane 0). Returns whether some row is fully masked (saved sum 0).
ATTNOPS_AVX512_INLINE bool loadQueryStats(const BackwardParams& bp, int64_t b, int64_t n1, int64_t q0, int64_t rows,
                                          int64_t ldt, Scratch& sc, float* doRows, float* doT) {
    const ForwardParams& p = bp.fwd;
    const int64_t row0 = p.seq.qStart[size_t(b)] + q0, dv = p.dv;
    const View4 out{p.out.data, p.out.dtype, {p.out.stride[0], p.out.stride[1], p.out.stride[2], p.out.stride[3]}};
    float* o = sc.row;
    bool anyEmpty = false;
    for (int64_t r = 0; r < rows; ++r) {
        float* dyRow = doRows != nullptr ? doRows + r * dv : sc.dyRow;
        simd::loadRow(bp.dy, b, n1, row0 + r, dv, dyRow);
        if (doT != nullptr)
            for (int64_t c = 0; c < dv; ++c) doT[c * ldt + r] = dyRow[c];
        simd::loadRow(out, b, n1, row0 + r, dv, o);
        sc.delta[r] = dotProduct(dv, dyRow, o);
        sc.rowMax[r] = loadAsFloat(p.softmaxMax.data, p.softmaxMax.offset(b, n1, row0 + r, 0), DType::F32);
        sc.rowSum[r] = loadAsFloat(p.softmaxSum.data, p.softmaxSum.offset(b, n1, row0 + r, 0), DType::F32);
        anyEmpty = anyEmpty || sc.rowSum[r] == 0.0f;
    }
    return anyEmpty;
}

ATTNOPS_AVX512_INLINE void storeRows(const MutView4& view, int64_t b, int64_t n, int64_t row0, int64_t rows,
                                     int64_t cols, const float* src) {
    for (int64_t r = 0; r < rows; ++r)
        cpu::storeRow(view.data, view.offset(b, n, row0 + r, 0), view.stride[3], view.dtype, cols, src + r * cols);
}

// P = exp(scale * s - m) / l and dp := scale * P * (dp - delta) for query row `row` against nk
// keys from key0; with a band, both are 0 for the pairs it masks.
ATTNOPS_AVX512_INLINE void rowProbabilities(int64_t nk, float scale, float m, float l, float delta, float* s,
                                            float* dp, const simd::BandLanes* band, int64_t row, int64_t key0) {
    const __m512 vs = _mm512_set1_ps(scale), vm = _mm512_set1_ps(m), invL = _mm512_set1_ps(1.0f / l),
                 vd = _mm512_set1_ps(delta);
    for (int64_t j = 0; j < nk; j += simd::kLanes) {
        const __mmask16 mk = simd::tailMask(nk - j);
        const __mmask16 kept = band != nullptr ? simd::keptKeys(*band, key0 + j, row) : __mmask16(0xFFFF);
        const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, s + j), vs);  // rounded like the forward's
        const __m512 pr = _mm512_maskz_mov_ps(kept, _mm512_mul_ps(simd::exp(_mm512_sub_ps(x, vm)), invL));
        _mm512_mask_storeu_ps(s + j, mk, pr);
        const __m512 ds = _mm512_mul_ps(pr, _mm512_sub_ps(_mm512_maskz_loadu_ps(mk, dp + j), vd));
        _mm512_mask_storeu_ps(dp + j, mk, _mm512_maskz_mov_ps(kept, _mm512_mul_ps(ds, vs)));
    }
}

// PairDot: bf16 inputs multiplied as bf16 pairs with vdpbf16ps, P and dS rounded to bf16 for
// the GEMMs they feed (as the naive low-precision computation of the tolerance rule rounds
// them); otherwise everything in fp32.
template <bool PairDot>
ATTNOPS_AVX512_FN void runKeyUnit(const BackwardParams& bp, TileShape t, const KeyUnit& u, void* scratch) {
    const ForwardParams& p = bp.fwd;
    Scratch sc(bp, t, scratch);
    const int64_t sq = p.seq.qLen[size_t(u.b)], skv = p.seq.kvLen[size_t(u.b)];
    const SeqRule rule = seqRule(p.mask, u.b, sq, skv);
    const int64_t nk = u.k1 - u.k0, kr = t.keyRows, d = p.d, dv = p.dv;
    const int64_t kvRow0 = p.seq.kvStart[size_t(u.b)] + u.k0;
    const bool vectorRows = p.pse.form == PseForm::None && !p.mask.explicitMask && !p.dropout.enabled;
    const bool bandVector = simd::BandLanes::usable(sq, skv);
    const simd::BandLanes band = simd::bandLanes(rule, skv);
    const int64_t dPairs = (d + 1) / 2, dvPairs = (dv + 1) / 2;
    if (PairDot) {
        simd::packColumnPairsTransposed(p.k, u.b, u.n2, kvRow0, nk, d, kr, sc.ktp);
        simd::packColumnPairsTransposed(p.v, u.b, u.n2, kvRow0, nk, dv, kr, sc.vtp);
    } else {
        simd::loadRowsTransposed(p.k, u.b, u.n2, kvRow0, nk, d, kr, sc.row, sc.kt);
        simd::loadRowsTransposed(p.v, u.b, u.n2, kvRow0, nk, dv, kr, sc.row, sc.vt);
    }
    std::fill(sc.dkAcc, sc.dkAcc + nk * d, 0.0f);
    std::fill(sc.dvAcc, sc.dvAcc + nk * dv, 0.0f);
    for (int64_t g = 0; g < p.group; ++g) {
        const int64_t n1 = u.n2 * p.group + g;
        for (int64_t q0 = 0; q0 < sq; q0 += t.queryRows) {
            const int64_t rows = std::min(t.queryRows, sq - q0);
            const KeyRange keys = keyRange(rule, q0, q0 + rows, skv);
            if (keys.hi <= u.k0 || keys.lo >= u.k1) continue;  // this query block never sees these keys
            const int64_t qRow0 = p.seq.qStart[size_t(u.b)] + q0;
            simd::loadRows(p.q, u.b, n1, qRow0, rows, d, d, sc.qRows);
            const bool anyEmpty = loadQueryStats(bp, u.b, n1, q0, rows, 0, sc, sc.doRows, nullptr);
            if (PairDot) {
                simd::packColumnPairs(p.q, u.b, n1, qRow0, rows, d, dPairs, sc.qcp);
                simd::packColumnPairs(bp.dy, u.b, n1, qRow0, rows, dv, dvPairs, sc.docp);
                simd::gemm<false, Pairs>(rows, nk, dPairs, sc.qcp, dPairs, sc.ktp, kr, sc.s, kr, false);
                simd::gemm<false, Pairs>(rows, nk, dvPairs, sc.docp, dvPairs, sc.vtp, kr, sc.dp, kr, false);
            } else {
                simd::gemm<false>(rows, nk, d, sc.qRows, d, sc.kt, kr, sc.s, kr, false);    // S = Q . K^T
                simd::gemm<false>(rows, nk, dv, sc.doRows, dv, sc.vt, kr, sc.dp, kr, false);  // dP = dO . V^T
            }
            const bool full = blockFullyKept(rule, q0, q0 + rows, u.k0, u.k1, skv);
            const bool finite = bandVector && simd::allFinite(sc.qRows, rows, d, d) &&
                                simd::allFinite(sc.doRows, rows, dv, dv);
            if (vectorRows && !anyEmpty && (full || finite)) {
                for (int64_t r = 0; r < rows; ++r)
                    rowProbabilities(nk, p.scale, sc.rowMax[r], sc.rowSum[r], sc.delta[r], sc.s + r * kr,
                                     sc.dp + r * kr, full ? nullptr : &band, q0 + r, u.k0);
                if (PairDot) {
                    const int64_t rowPairs = (rows + 1) / 2;
                    simd::packFloatRowPairs(sc.s, rows, nk, kr, sc.pp);
                    simd::packFloatRowPairs(sc.dp, rows, nk, kr, sc.dsp);
                    simd::packRowPairs(bp.dy, u.b, n1, qRow0, rows, dv, sc.dorp);
                    simd::packRowPairs(p.q, u.b, n1, qRow0, rows, d, sc.qrp);
                    simd::gemm<true, Pairs>(nk, dv, rowPairs, sc.pp, kr, sc.dorp, dv, sc.dvAcc, dv, true);
                    simd::gemm<true, Pairs>(nk, d, rowPairs, sc.dsp, kr, sc.qrp, d, sc.dkAcc, d, true);
                } else {
                    simd::gemm<true>(nk, dv, rows, sc.s, kr, sc.doRows, dv, sc.dvAcc, dv, true);  // dV += P^T . dO
                    simd::gemm<true>(nk, d, rows, sc.dp, kr, sc.qRows, d, sc.dkAcc, d, true);     // dK += dS^T . Q
                }
                continue;
            }
            for (int64_t r = 0; r < rows; ++r) {
                if (sc.rowSum[r] == 0.0f) continue;  // fully masked row: P = 0
                float* s = sc.s + r * kr;
                float* dp = sc.dp + r * kr;
                if (!tile::rowGradients(bp, u.b, n1, rule, q0 + r, u.k0, nk, skv, sc.rowMax[r], sc.rowSum[r],
                                        sc.delta[r], s, dp, sc.kept, sc.keep, nullptr))
                    continue;
                for (int64_t j = 0; j < nk; ++j) {
                    if (!sc.kept[j]) continue;
                    float pd = s[j];
                    if (p.dropout.enabled) pd = sc.keep[j] ? pd * p.dropout.invKeepProb : 0.0f;
                    simd::axpy(dv, pd, sc.doRows + r * dv, sc.dvAcc + j * dv);
                    simd::axpy(d, p.scale * dp[j], sc.qRows + r * d, sc.dkAcc + j * d);
                }
            }
        }
    }
    storeRows(bp.dk, u.b, u.n2, kvRow0, nk, d, sc.dkAcc);
    storeRows(bp.dv, u.b, u.n2, kvRow0, nk, dv, sc.dvAcc);
}

// rowProbabilities for a [key][row] block, 16 rows per vector (rows from row0, keys from key0);
// adds sum_j P dP to exactDelta when given.
ATTNOPS_AVX512_INLINE void blockProbabilitiesTransposed(const Scratch& sc, int64_t rows, int64_t nk, int64_t ld,
                                                        float scale, float* exactDelta, const simd::BandLanes* band,
                                                        int64_t row0, int64_t key0) {
    const __m512 vs = _mm512_set1_ps(scale);
    for (int64_t r0 = 0; r0 < rows; r0 += simd::kLanes) {
        const __m512 m = _mm512_loadu_ps(sc.rowMax + r0);
        const __m512 invL = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_loadu_ps(sc.rowSum + r0));
        const __m512 delta = _mm512_loadu_ps(sc.delta + r0);
        __m512 sumPdP = _mm512_setzero_ps();
        for (int64_t j = 0; j < nk; ++j) {
            float* s = sc.st + j * ld + r0;
            float* dp = sc.dpt + j * ld + r0;
            const __mmask16 kept = band != nullptr ? simd::keptRows(*band, key0 + j, row0 + r0) : __mmask16(0xFFFF);
            const __m512 pr = _mm512_maskz_mov_ps(
                kept, _mm512_mul_ps(simd::exp(_mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(s), vs), m)), invL));
            const __m512 g = _mm512_loadu_ps(dp);
            sumPdP = _mm512_fmadd_ps(pr, g, sumPdP);
            const __m512 ds = _mm512_mul_ps(_mm512_mul_ps(pr, _mm512_sub_ps(g, delta)), vs);
            _mm512_storeu_ps(dp, _mm512_maskz_mov_ps(kept, ds));
        }
        if (exactDelta != nullptr)
            _mm512_storeu_ps(exactDelta + r0, _mm512_add_ps(_mm512_loadu_ps(exactDelta + r0), sumPdP));
    }
}

template <bool PairDot>
ATTNOPS_AVX512_FN void runQueryUnit(const BackwardParams& bp, TileShape t, const WorkUnit& u, void* scratch) {
    const ForwardParams& p = bp.fwd;
    Scratch sc(bp, t, scratch);
    const int64_t sq = p.seq.qLen[size_t(u.b)], skv = p.seq.kvLen[size_t(u.b)];
    const SeqRule rule = seqRule(p.mask, u.b, sq, skv);
    const KeyRange keys = keyRange(rule, u.q0, u.q1, skv);
    const int64_t rows = u.q1 - u.q0, qr = t.queryRows, d = p.d, dv = p.dv;
    const int64_t dPairs = (d + 1) / 2, dvPairs = (dv + 1) / 2;
    const int64_t qRow0 = p.seq.qStart[size_t(u.b)] + u.q0;
    const bool vectorRows = p.pse.form == PseForm::None && !p.mask.explicitMask && !p.dropout.enabled;
    const bool bandVector = simd::BandLanes::usable(sq, skv);
    const simd::BandLanes band = simd::bandLanes(rule, skv);
    for (int64_t g = 0; g < p.group; ++g) {
        const int64_t n1 = u.n2 * p.group + g;
        bool anyEmpty = false;
        if (PairDot) {
            simd::packColumnPairsTransposed(p.q, u.b, n1, qRow0, rows, d, qr, sc.qtp);
            simd::packColumnPairsTransposed(bp.dy, u.b, n1, qRow0, rows, dv, qr, sc.dotp);
            anyEmpty = loadQueryStats(bp, u.b, n1, u.q0, rows, qr, sc, nullptr, nullptr);
        } else {
            simd::loadRowsTransposed(p.q, u.b, n1, qRow0, rows, d, qr, sc.row, sc.qt);
            anyEmpty = loadQueryStats(bp, u.b, n1, u.q0, rows, qr, sc, nullptr, sc.dot);
        }
        std::fill(sc.dqAcc, sc.dqAcc + rows * d, 0.0f);
        std::fill(sc.exactDelta, sc.exactDelta + qr, 0.0f);
        float* exactDelta = bp.sinkRowTerms != nullptr ? sc.exactDelta : nullptr;
        for (int64_t k0 = keys.lo; k0 < keys.hi; k0 += t.keyRows) {
            const int64_t nk = std::min(t.keyRows, keys.hi - k0);
            const int64_t kvRow0 = p.seq.kvStart[size_t(u.b)] + k0;
            simd::loadRows(p.k, u.b, u.n2, kvRow0, nk, d, d, sc.k);  // fp32 K: the row steps and the dQ GEMM
            if (PairDot) {
                simd::packColumnPairs(p.k, u.b, u.n2, kvRow0, nk, d, dPairs, sc.kcp);
                simd::packColumnPairs(p.v, u.b, u.n2, kvRow0, nk, dv, dvPairs, sc.vcp);
                simd::gemm<false, Pairs>(nk, rows, dPairs, sc.kcp, dPairs, sc.qtp, qr, sc.st, qr, false);
                simd::gemm<false, Pairs>(nk, rows, dvPairs, sc.vcp, dvPairs, sc.dotp, qr, sc.dpt, qr, false);
            } else {
                simd::loadRows(p.v, u.b, u.n2, kvRow0, nk, dv, dv, sc.v);
                simd::gemm<false>(nk, rows, d, sc.k, d, sc.qt, qr, sc.st, qr, false);     // S^T = K . Q^T
                simd::gemm<false>(nk, rows, dv, sc.v, dv, sc.dot, qr, sc.dpt, qr, false);  // dP^T = V . dO^T
            }
            const bool full = blockFullyKept(rule, u.q0, u.q1, k0, k0 + nk, skv);
            if (vectorRows && !anyEmpty && (full || (bandVector && simd::allFinite(sc.k, nk, d, d)))) {
                blockProbabilitiesTransposed(sc, rows, nk, qr, p.scale, exactDelta, full ? nullptr : &band, u.q0, k0);
                if (PairDot) {
                    simd::packFloatRowPairs(sc.dpt, nk, rows, qr, sc.dsp);
                    simd::packRowPairs(p.k, u.b, u.n2, kvRow0, nk, d, sc.krp);
                    simd::gemm<true, Pairs>(rows, d, (nk + 1) / 2, sc.dsp, qr, sc.krp, d, sc.dqAcc, d, true);
                } else {
                    simd::gemm<true>(rows, d, nk, sc.dpt, qr, sc.k, d, sc.dqAcc, d, true);  // dQ += dS . K
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
                    if (sc.kept[j]) simd::axpy(d, p.scale * sc.dp1[j], sc.k + j * d, sc.dqAcc + r * d);
            }
        }
        storeRows(bp.dq, u.b, n1, qRow0, rows, d, sc.dqAcc);
        if (exactDelta != nullptr) tile::writeSinkRowTerms(bp, u.b, n1, u.q0, rows, sc.rowMax, sc.rowSum, exactDelta);
    }
}

bool acceptsAll(const BackwardParams&) { return true; }

// The avx512-bf16 entry takes problems whose operands are all bf16 (any strides: the packing
// gathers rows whose column stride is not 1); the planner sends the others to avx512.
bool pairOperands(const BackwardParams& bp) {
    for (const View4* v : {&bp.fwd.q, &bp.fwd.k, &bp.fwd.v, &bp.dy})
        if (v->dtype != DType::BF16) return false;
    return true;
}

void keyFloat(const BackwardParams& p, TileShape t, const KeyUnit& u, void* s) { runKeyUnit<false>(p, t, u, s); }
void queryFloat(const BackwardParams& p, TileShape t, const WorkUnit& u, void* s) { runQueryUnit<false>(p, t, u, s); }
void keyPairs(const BackwardParams& p, TileShape t, const KeyUnit& u, void* s) { runKeyUnit<true>(p, t, u, s); }
void queryPairs(const BackwardParams& p, TileShape t, const WorkUnit& u, void* s) { runQueryUnit<true>(p, t, u, s); }

bool hasAvx512() {
    const cpu::IsaFeatures& f = cpu::isa();
    return f.avx512f && f.avx512bw && f.avx512vl && f.avx2 && f.fma && f.f16c;
}

bool hasAvx512Bf16() { return hasAvx512() && cpu::isa().avx512bf16; }

}  // namespace

const BackwardKernel& backwardKernelAvx512Bf16() {
    static const BackwardKernel k{"avx512-bf16", hasAvx512Bf16, pairOperands, chooseTile, scratchBytes, keyPairs,
                                  queryPairs};
    return k;
}
const BackwardKernel& backwardKernelAvx512() {
    static const BackwardKernel k{"avx512", hasAvx512, acceptsAll, chooseTile, scratchBytes, keyFloat, queryFloat};
    return k;
}

}  // namespace attnops::fa

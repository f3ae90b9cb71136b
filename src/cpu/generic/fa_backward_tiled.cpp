// The tiled flash-attention backward kernel in portable C++, compiled for the x86-64 baseline,
// AVX2+FMA and AVX-512 through target attributes like the forward. Scores and probabilities are
// rebuilt block by block from q, k and the saved statistics (never an S1 x S2 matrix).
//
// Determinism scheme: every output element has exactly one writer. A key unit owns dk/dv rows
// of one key block and walks the query rows that can see it (query heads of the group
// ascending, rows ascending); a query unit owns dq rows of one query block and walks the key
// blocks ascending. This recomputes Q.K^T and dO.V^T once more than a scheme that shares dS
// between the passes, but needs no atomics, no per-thread partial sums and no reduction whose
// shape depends on the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/generic/fast_exp.hpp"
#include "cpu/generic/score_row.hpp"
#include "cpu/isa.hpp"
#include "ops/flash_attention_score/kernel.hpp"

namespace attnops::fa {
namespace {

using tile::kNegInf;

constexpr int64_t kAlignFloats = 16;
int64_t alignUp(int64_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

struct Scratch {
    float* kt;      // [d][keyRows]
    float* kf;      // [keyRows][d]
    float* vt;      // [dv][keyRows]
    float* dkAcc;   // [keyRows][d]
    float* dvAcc;   // [keyRows][dv]
    float* qBlock;  // [queryRows][d]
    float* doBlock; // [queryRows][dv]
    float* dqAcc;   // [queryRows][d]
    float* delta;   // [queryRows]  rowsum(dO * O)
    float* rowMax;  // [queryRows]  saved softmax max
    float* rowSum;  // [queryRows]  saved softmax sum
    float* exactDelta;  // [queryRows] sum_j P_d * dP_d (for the dsink terms)
    float* s;       // [keyRows] scores, then probabilities
    float* dp;      // [keyRows] dO . V
    uint8_t* kept;  // [keyRows]
    uint8_t* keep;  // [keyRows]

    static int64_t floats(const BackwardParams& p, TileShape t) {
        const int64_t d = p.fwd.d, dv = p.fwd.dv, kr = t.keyRows, qr = t.queryRows;
        return alignUp(d * kr) * 2 + alignUp(dv * kr) + alignUp(kr * d) + alignUp(kr * dv) + alignUp(qr * d) * 2 +
               alignUp(qr * dv) + 4 * alignUp(qr) + 2 * alignUp(kr) + 2 * alignUp(kr);
    }

    Scratch(const BackwardParams& p, TileShape t, void* base) {
        const int64_t d = p.fwd.d, dv = p.fwd.dv, kr = t.keyRows, qr = t.queryRows;
        float* f = static_cast<float*>(base);
        auto take = [&](int64_t n) {
            float* r = f;
            f += alignUp(n);
            return r;
        };
        kt = take(d * kr);
        kf = take(kr * d);
        vt = take(dv * kr);
        dkAcc = take(kr * d);
        dvAcc = take(kr * dv);
        qBlock = take(qr * d);
        doBlock = take(qr * dv);
        dqAcc = take(qr * d);
        delta = take(qr);
        rowMax = take(qr);
        rowSum = take(qr);
        exactDelta = take(qr);
        s = take(kr);
        dp = take(kr);
        kept = reinterpret_cast<uint8_t*>(take(kr));
        keep = reinterpret_cast<uint8_t*>(take(kr));
    }
};

TileShape chooseTile(const BackwardParams& p, const PlatformInfo&) {
    TileShape t;
    t.queryRows = 64;
    t.keyRows = p.fwd.d <= 128 ? 64 : (p.fwd.d <= 256 ? 32 : 16);
    return t;
}

uint64_t scratchBytes(const BackwardParams& p, TileShape t) { return uint64_t(Scratch::floats(p, t)) * sizeof(float); }

// Loads query rows [q0, q0 + rows) of head n1 with dO, the row sums delta = dO . O and the saved
// statistics (lane 0).
ATTNOPS_INLINE void loadQueryRows(const BackwardParams& bp, int64_t b, int64_t n1, int64_t q0, int64_t rows,
                                  Scratch& sc) {
    const ForwardParams& p = bp.fwd;
    const int64_t row0 = p.seq.qStart[size_t(b)] + q0;
    tile::loadRows(p.q, b, n1, row0, rows, p.d, sc.qBlock);
    tile::loadRows(bp.dy, b, n1, row0, rows, p.dv, sc.doBlock);
    for (int64_t r = 0; r < rows; ++r) {
        float delta = 0.0f;
        for (int64_t c = 0; c < p.dv; ++c)
            delta += sc.doBlock[r * p.dv + c] * loadAsFloat(p.out.data, p.out.offset(b, n1, row0 + r, c), p.out.dtype);
        sc.delta[r] = delta;
        sc.rowMax[r] = loadAsFloat(p.softmaxMax.data, p.softmaxMax.offset(b, n1, row0 + r, 0), DType::F32);
        sc.rowSum[r] = loadAsFloat(p.softmaxSum.data, p.softmaxSum.offset(b, n1, row0 + r, 0), DType::F32);
    }
}

ATTNOPS_INLINE void loadKeyBlock(const BackwardParams& bp, int64_t b, int64_t n2, int64_t k0, int64_t nk,
                                 int64_t keyRows, Scratch& sc) {
    const ForwardParams& p = bp.fwd;
    const int64_t row0 = p.seq.kvStart[size_t(b)] + k0;
    tile::loadRows(p.k, b, n2, row0, nk, p.d, sc.kf);
    tile::loadRowsTransposed(p.k, b, n2, row0, nk, p.d, keyRows, sc.kt);
    tile::loadRowsTransposed(p.v, b, n2, row0, nk, p.dv, keyRows, sc.vt);
}

// For query row r (sequence-local i) against the loaded key block: raw scores and dO . V rows,
// then tile::rowGradients.
ATTNOPS_INLINE bool rowGradients(const BackwardParams& bp, int64_t b, int64_t n1, const SeqRule& rule, int64_t i,
                                 int64_t k0, int64_t nk, int64_t skv, int64_t keyRows, const float* qRow,
                                 const float* doRow, float m, float l, float delta, Scratch& sc,
                                 float* exactDelta) {
    const ForwardParams& p = bp.fwd;
    tile::rowScores(qRow, sc.kt, p.d, nk, keyRows, sc.s);
    tile::rowScores(doRow, sc.vt, p.dv, nk, keyRows, sc.dp);
    return tile::rowGradients(bp, b, n1, rule, i, k0, nk, skv, m, l, delta, sc.s, sc.dp, sc.kept, sc.keep,
                              exactDelta);
}

ATTNOPS_INLINE void runKeyUnitBody(const BackwardParams& bp, TileShape t, const KeyUnit& u, void* scratch) {
    const ForwardParams& p = bp.fwd;
    Scratch sc(bp, t, scratch);
    const int64_t sq = p.seq.qLen[size_t(u.b)], skv = p.seq.kvLen[size_t(u.b)];
    const SeqRule rule = seqRule(p.mask, u.b, sq, skv);
    const int64_t nk = u.k1 - u.k0;
    loadKeyBlock(bp, u.b, u.n2, u.k0, nk, t.keyRows, sc);
    std::fill(sc.dkAcc, sc.dkAcc + nk * p.d, 0.0f);
    std::fill(sc.dvAcc, sc.dvAcc + nk * p.dv, 0.0f);
    for (int64_t g = 0; g < p.group; ++g) {
        const int64_t n1 = u.n2 * p.group + g;
        for (int64_t q0 = 0; q0 < sq; q0 += t.queryRows) {
            const int64_t rows = std::min(t.queryRows, sq - q0);
            const KeyRange keys = keyRange(rule, q0, q0 + rows, skv);
            if (keys.hi <= u.k0 || keys.lo >= u.k1) continue;  // this query block never sees these keys
            loadQueryRows(bp, u.b, n1, q0, rows, sc);
            for (int64_t r = 0; r < rows; ++r) {
                if (sc.rowSum[r] == 0.0f) continue;  // fully masked row: P = 0
                const float* qRow = sc.qBlock + r * p.d;
                const float* doRow = sc.doBlock + r * p.dv;
                if (!rowGradients(bp, u.b, n1, rule, q0 + r, u.k0, nk, skv, t.keyRows, qRow, doRow, sc.rowMax[r],
                                  sc.rowSum[r], sc.delta[r], sc, nullptr))
                    continue;
                for (int64_t j = 0; j < nk; ++j) {
                    if (!sc.kept[j]) continue;
                    float pd = sc.s[j];
                    if (p.dropout.enabled) pd = sc.keep[j] ? pd * p.dropout.invKeepProb : 0.0f;
                    float* __restrict dvRow = sc.dvAcc + j * p.dv;
                    for (int64_t c = 0; c < p.dv; ++c) dvRow[c] += pd * doRow[c];
                    const float ds = p.scale * sc.dp[j];
                    float* __restrict dkRow = sc.dkAcc + j * p.d;
                    for (int64_t c = 0; c < p.d; ++c) dkRow[c] += ds * qRow[c];
                }
            }
        }
    }
    const int64_t row0 = p.seq.kvStart[size_t(u.b)] + u.k0;
    for (int64_t j = 0; j < nk; ++j) {
        for (int64_t c = 0; c < p.d; ++c) bp.dk.store(u.b, u.n2, row0 + j, c, sc.dkAcc[j * p.d + c]);
        for (int64_t c = 0; c < p.dv; ++c) bp.dv.store(u.b, u.n2, row0 + j, c, sc.dvAcc[j * p.dv + c]);
    }
}

ATTNOPS_INLINE void runQueryUnitBody(const BackwardParams& bp, TileShape t, const WorkUnit& u, void* scratch) {
    const ForwardParams& p = bp.fwd;
    Scratch sc(bp, t, scratch);
    const int64_t sq = p.seq.qLen[size_t(u.b)], skv = p.seq.kvLen[size_t(u.b)];
    const SeqRule rule = seqRule(p.mask, u.b, sq, skv);
    const KeyRange keys = keyRange(rule, u.q0, u.q1, skv);
    const int64_t rows = u.q1 - u.q0;
    const int64_t row0 = p.seq.qStart[size_t(u.b)] + u.q0;
    for (int64_t g = 0; g < p.group; ++g) {
        const int64_t n1 = u.n2 * p.group + g;
        loadQueryRows(bp, u.b, n1, u.q0, rows, sc);
        std::fill(sc.dqAcc, sc.dqAcc + rows * p.d, 0.0f);
        std::fill(sc.exactDelta, sc.exactDelta + rows, 0.0f);
        float* exactDelta = bp.sinkRowTerms != nullptr ? sc.exactDelta : nullptr;
        for (int64_t k0 = keys.lo; k0 < keys.hi; k0 += t.keyRows) {
            const int64_t nk = std::min(t.keyRows, keys.hi - k0);
            loadKeyBlock(bp, u.b, u.n2, k0, nk, t.keyRows, sc);
            for (int64_t r = 0; r < rows; ++r) {
                if (sc.rowSum[r] == 0.0f) continue;
                if (!rowGradients(bp, u.b, n1, rule, u.q0 + r, k0, nk, skv, t.keyRows, sc.qBlock + r * p.d,
                                  sc.doBlock + r * p.dv, sc.rowMax[r], sc.rowSum[r], sc.delta[r], sc,
                                  exactDelta ? exactDelta + r : nullptr))
                    continue;
                float* __restrict dq = sc.dqAcc + r * p.d;
                for (int64_t j = 0; j < nk; ++j) {
                    if (!sc.kept[j]) continue;
                    const float ds = p.scale * sc.dp[j];
                    const float* __restrict krow = sc.kf + j * p.d;
                    for (int64_t c = 0; c < p.d; ++c) dq[c] += ds * krow[c];
                }
            }
        }
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < p.d; ++c) bp.dq.store(u.b, n1, row0 + r, c, sc.dqAcc[r * p.d + c]);
        if (exactDelta != nullptr) tile::writeSinkRowTerms(bp, u.b, n1, u.q0, rows, sc.rowMax, sc.rowSum, exactDelta);
    }
}

bool acceptsAll(const BackwardParams&) { return true; }

__attribute__((flatten)) void keyBaseline(const BackwardParams& p, TileShape t, const KeyUnit& u, void* s) {
    runKeyUnitBody(p, t, u, s);
}
__attribute__((flatten)) void queryBaseline(const BackwardParams& p, TileShape t, const WorkUnit& u, void* s) {
    runQueryUnitBody(p, t, u, s);
}
__attribute__((flatten, target("avx2,fma"))) void keyAvx2(const BackwardParams& p, TileShape t, const KeyUnit& u,
                                                          void* s) {
    runKeyUnitBody(p, t, u, s);
}
__attribute__((flatten, target("avx2,fma"))) void queryAvx2(const BackwardParams& p, TileShape t,
                                                            const WorkUnit& u, void* s) {
    runQueryUnitBody(p, t, u, s);
}
#if defined(__clang__)
#define ATTNOPS_TARGET_AVX512 flatten, target("avx512f,avx512bw,avx512vl,avx2,fma"), min_vector_width(512)
#else
#define ATTNOPS_TARGET_AVX512 flatten, target("avx512f,avx512bw,avx512vl,avx2,fma,prefer-vector-width=512")
#endif
__attribute__((ATTNOPS_TARGET_AVX512)) void keyAvx512(const BackwardParams& p, TileShape t, const KeyUnit& u, void* s) {
    runKeyUnitBody(p, t, u, s);
}
__attribute__((ATTNOPS_TARGET_AVX512)) void queryAvx512(const BackwardParams& p, TileShape t, const WorkUnit& u,
                                                        void* s) {
    runQueryUnitBody(p, t, u, s);
}

bool always() { return true; }
bool hasAvx2() { return cpu::isa().avx2 && cpu::isa().fma; }
bool hasAvx512() { return cpu::isa().avx512f && cpu::isa().avx512bw && cpu::isa().avx512vl && hasAvx2(); }

}  // namespace

const BackwardKernel& backwardKernelTiledAvx512() {
    static const BackwardKernel k{"tiled-avx512", hasAvx512, acceptsAll, chooseTile, scratchBytes, keyAvx512, queryAvx512};
    return k;
}
const BackwardKernel& backwardKernelTiledAvx2() {
    static const BackwardKernel k{"tiled-avx2", hasAvx2, acceptsAll, chooseTile, scratchBytes, keyAvx2, queryAvx2};
    return k;
}
const BackwardKernel& backwardKernelTiledGeneric() {
    static const BackwardKernel k{"tiled-generic", always, acceptsAll, chooseTile, scratchBytes, keyBaseline, queryBaseline};
    return k;
}

}  // namespace attnops::fa

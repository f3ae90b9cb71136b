// Component micro-benchmark of the AVX2 flash-attention forward (cpu/simd/fa_forward.hpp), for
// machines shared with other jobs: every figure is the best of many short timings (each well
// under a scheduler slice), against an in-run 12-chain FMA loop timed the same way, 1 thread.
// One 120-row x 128-key block at D = Dv = 128: S = K.Q^T (gemmScores, K L2-resident, and K read
// from an 8 MiB buffer in place, and copied from it first, as the kernel now does), P.V
// (gemmStrips on packed value strips) and the online softmax (softmaxBlock, first block of a row);
// S + softmax as two steps and with the first softmax pass fused into the score GEMM's epilogue.
// Session 9, exp overlap: the softmax's exp pass of block j alone and after block j+1's score
// GEMM, as now, with several softmax vectors per pass (b), cut into chunks among the score GEMM's
// register tiles (a), and with the exps of several keys stage-interleaved (c); every variant
// checked for the same bits (probabilities and l) as softmaxBlockScaled.
// Build from a configured tree (the library builds with -O3):
//   g++ -O3 -std=c++20 -Isrc -Ibuild/include -Iinclude bench/results/amd-epyc-zen3-avx2/fwd_components.cpp
#include "cpu/avx2/simd_avx2.hpp"
#include "cpu/simd/fa_forward.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <random>
#include <vector>
#include "measure.hpp"

using namespace attnops;
using V = cpu::Avx2;

static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}


ATTNOPS_SIMD_FN __attribute__((noinline)) static void softmax(const fa::ForwardParams& p, int64_t qr, int64_t nk,
                                                              float* st, float* m, float* l, float* acc) {
    fa::simd_forward::softmaxBlock<V>(p, qr, nk, qr, st, m, l, acc, nullptr, 0, 0);
}

// S = K.Q^T then the softmax, as two steps (gemmScores, softmaxBlock) and fused (the scaling, max
// and NaN pass in the score GEMM's epilogue: gemmScoresScaledMax, softmaxBlockScaled), K in L2.
ATTNOPS_SIMD_FN __attribute__((noinline)) static void scoresSoftmax(const fa::ForwardParams& p, int64_t qr, int64_t nk,
                                                                    const float* k, const float* qt, float* st,
                                                                    float* m, float* l, float* acc, bool fused) {
    std::fill(m, m + qr, -INFINITY);
    std::fill(l, l + qr, 0.0f);
    if (!fused) {
        cpu::simd::gemmScores<V, false>(nk, qr, p.d, k, p.d, qt, qr, st, qr);
        fa::simd_forward::softmaxBlock<V>(p, qr, nk, qr, st, m, l, acc, nullptr, 0, 0);
        return;
    }
    alignas(64) float colMax[V::kQueryRows];
    V::Mask colNan[V::kQueryRows / V::kLanes];
    std::fill(colMax, colMax + qr, -INFINITY);
    std::fill(colNan, colNan + qr / V::kLanes, V::none());
    const cpu::simd::ColumnStats<V> stats{colMax, colNan};
    cpu::simd::gemmScoresScaledMax<V>(nk, qr, p.d, k, p.d, qt, qr, st, qr, p.scale, stats);
    fa::simd_forward::softmaxBlockScaled<V>(p, qr, nk, qr, st, m, l, acc, stats);
}


// ---- session 9, exp overlap: variants of the softmax's exp pass (same bits per lane) ----

// (b) softmaxUpdate for G softmax vectors (8 query rows each) in one pass over the keys: G
// independent exp chains and sum chains in flight instead of one. Per lane the same operations
// in the same key order. Falls back to softmaxUpdate per vector off the fast path.
template <class V, int G>
ATTNOPS_SIMD_INLINE void softmaxUpdateGroup(const fa::ForwardParams& p, int64_t r0, int64_t rows, int64_t nk,
                                            int64_t ld, float* st, float* m, float* l, float* acc,
                                            const cpu::simd::ColumnStats<V>& stats) {
    using Vec = typename V::Vec;
    constexpr int64_t L = V::kLanes;
    Vec mNew[G], alpha[G], sum[G];
    bool fast = true;
    for (int g = 0; g < G; ++g) {
        const int64_t r = r0 + g * L;
        const auto nan = stats.nan[r / L];
        const auto blockMax = V::select(nan, V::load(stats.max + r), V::set1(__builtin_nanf("")));
        const auto mOld = V::load(m + r);
        const auto takeNew = V::maskOr(V::greater(blockMax, mOld), V::isNan(blockMax));
        mNew[g] = V::select(takeNew, mOld, blockMax);
        const auto started = V::notEqual(mOld, V::set1(fa::simd_forward::kNegInf));
        alpha[g] = V::zeroUnless(started, cpu::simd::exp<V>(V::sub(mOld, mNew[g])));
        fast = fast && !V::any(nan) &&
               !V::any(V::maskOr(V::isNan(mNew[g]), V::greater(mNew[g], V::set1(fa::simd_forward::kMaxFinite))));
        sum[g] = V::zero();
    }
    if (!fast) {
        for (int g = 0; g < G; ++g)
            fa::simd_forward::softmaxUpdate<V>(p, r0 + g * L, rows, nk, fa::KeyRange{0, nk}, ld, st, m, l, acc,
                                               V::load(stats.max + r0 + g * L), stats.nan[(r0 + g * L) / L]);
        return;
    }
    for (int64_t j = 0; j < nk; ++j) {
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) {
            float* s = st + j * ld + r0 + g * L;
            const auto e = fa::simd_forward::expNonPositive<V>(V::sub(V::load(s), mNew[g]));
            V::store(s, e);
            sum[g] = V::add(sum[g], e);
        }
    }
    for (int g = 0; g < G; ++g) {
        const int64_t r = r0 + g * L;
        V::store(l + r, V::fmadd(V::load(l + r), alpha[g], sum[g]));
        V::store(m + r, mNew[g]);
        alignas(64) float alphas[L];
        V::store(alphas, alpha[g]);
        for (int64_t q = r; q < std::min(rows, r + L); ++q)
            if (alphas[q - r] != 1.0f) cpu::simd::scaleRowUnmasked<V>(p.dv, alphas[q - r], acc + q * p.dv);
    }
}

template <int G>
ATTNOPS_SIMD_FN __attribute__((noinline)) static void softmaxGrouped(const fa::ForwardParams& p, int64_t rows,
                                                                     int64_t nk, int64_t ld, float* st, float* m,
                                                                     float* l, float* acc,
                                                                     const cpu::simd::ColumnStats<V>& stats) {
    int64_t r0 = 0;
    for (; r0 + G * V::kLanes <= rows; r0 += G * V::kLanes)
        softmaxUpdateGroup<V, G>(p, r0, rows, nk, ld, st, m, l, acc, stats);
    for (; r0 < rows; r0 += V::kLanes)
        fa::simd_forward::softmaxUpdate<V>(p, r0, rows, nk, fa::KeyRange{0, nk}, ld, st, m, l, acc, V::load(stats.max + r0),
                                           stats.nan[r0 / V::kLanes]);
}

ATTNOPS_SIMD_FN __attribute__((noinline)) static void softmaxScaledNow(const fa::ForwardParams& p, int64_t rows,
                                                                       int64_t nk, int64_t ld, float* st, float* m,
                                                                       float* l, float* acc,
                                                                       const cpu::simd::ColumnStats<V>& stats) {
    fa::simd_forward::softmaxBlockScaled<V>(p, rows, nk, ld, st, m, l, acc, stats);
}

// (c) expNonPositive of G vectors with each operation issued for all G before the next: the same
// operations per lane (same bits), but in program order the G chains alternate, so the
// scheduler's window holds G ready operations at every step instead of one chain's next one
// (GCC at -O2 emits a loop body's exps one after another, (b) above).
template <class V, int G>
ATTNOPS_SIMD_INLINE void expNonPositiveN(typename V::Vec* x) {
    typename V::Mask live[G];
    typename V::Vec t[G], n[G], r[G], poly[G];
    const auto shifter = V::set1(12582912.0f);
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) live[g] = V::greater(x[g], V::set1(-87.3f));
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) t[g] = V::add(V::mul(x[g], V::set1(1.44269504088896341f)), shifter);
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) n[g] = V::sub(t[g], shifter);
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) r[g] = V::fnmadd(n[g], V::set1(0.693359375f), x[g]);
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) r[g] = V::fnmadd(n[g], V::set1(-2.12194440e-4f), r[g]);
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) poly[g] = V::fmadd(V::set1(1.0f / 5040.0f), r[g], V::set1(1.0f / 720.0f));
    const float c[] = {1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f};
#pragma GCC unroll 6
    for (int i = 0; i < 6; ++i)
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) poly[g] = V::fmadd(poly[g], r[g], V::set1(c[i]));
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) x[g] = V::zeroUnless(live[g], V::mul(poly[g], V::pow2OfShifted(t[g])));
}

// softmaxBlockScaled's fast path with the exps of G keys at a time stage-interleaved (c); l
// still summed key by key in order. G = 1: the loop of b5aab60 (one exp per key), which the
// library ran before it took (c) with G = 4 (fa_forward.hpp: expNonPositiveInterleaved).
template <int G>
ATTNOPS_SIMD_FN __attribute__((noinline)) static void softmaxKeysInterleaved(const fa::ForwardParams& p, int64_t rows,
                                                                             int64_t nk, int64_t ld, float* st,
                                                                             float* m, float* l, float* acc,
                                                                             const cpu::simd::ColumnStats<V>& stats) {
    for (int64_t r0 = 0; r0 < rows; r0 += V::kLanes) {
        const auto nan = stats.nan[r0 / V::kLanes];
        const auto blockMax = V::select(nan, V::load(stats.max + r0), V::set1(__builtin_nanf("")));
        const auto mOld = V::load(m + r0);
        const auto takeNew = V::maskOr(V::greater(blockMax, mOld), V::isNan(blockMax));
        const auto mNew = V::select(takeNew, mOld, blockMax);
        if (V::any(nan) ||
            V::any(V::maskOr(V::isNan(mNew), V::greater(mNew, V::set1(fa::simd_forward::kMaxFinite))))) {
            fa::simd_forward::softmaxUpdate<V>(p, r0, rows, nk, fa::KeyRange{0, nk}, ld, st, m, l, acc, V::load(stats.max + r0), nan);
            continue;
        }
        const auto started = V::notEqual(mOld, V::set1(fa::simd_forward::kNegInf));
        const auto alpha = V::zeroUnless(started, cpu::simd::exp<V>(V::sub(mOld, mNew)));
        auto sum = V::zero();
        int64_t j = 0;
        for (; j + G <= nk; j += G) {
            typename V::Vec e[G];
#pragma GCC unroll 8
            for (int g = 0; g < G; ++g) e[g] = V::sub(V::load(st + (j + g) * ld + r0), mNew);
            expNonPositiveN<V, G>(e);
#pragma GCC unroll 8
            for (int g = 0; g < G; ++g) {
                V::store(st + (j + g) * ld + r0, e[g]);
                sum = V::add(sum, e[g]);
            }
        }
        for (; j < nk; ++j) {
            const auto e = fa::simd_forward::expNonPositive<V>(V::sub(V::load(st + j * ld + r0), mNew));
            V::store(st + j * ld + r0, e);
            sum = V::add(sum, e);
        }
        V::store(l + r0, V::fmadd(V::load(l + r0), alpha, sum));
        V::store(m + r0, mNew);
        alignas(64) float alphas[V::kLanes];
        V::store(alphas, alpha);
        for (int64_t r = r0; r < std::min(rows, r0 + V::kLanes); ++r)
            if (alphas[r - r0] != 1.0f) cpu::simd::scaleRowUnmasked<V>(p.dv, alphas[r - r0], acc + r * p.dv);
    }
}

// (a) The exp pass of block j cut into chunks run between the register tiles of block j+1's
// score GEMM (gemmScoresScaledMax's loop, copied here with the hook): the tiles' FMAs and the
// exp chains are independent, so the out-of-order core can overlap them. Fast path only
// (this benchmark's data); the runtime code would fall back as softmaxUpdate does.
struct ExpCursor {
    const fa::ForwardParams* p;
    int64_t rows, nk, ld;
    float *st, *m, *l, *acc;
    const cpu::simd::ColumnStats<V>* stats;
    int64_t r0 = 0, j = 0;
    __m256 mNew, alpha, sum;

    ATTNOPS_SIMD_FN void startRow() {
        const auto blockMax = V::load(stats->max + r0);
        const auto mOld = V::load(m + r0);
        const auto takeNew = V::maskOr(V::greater(blockMax, mOld), V::isNan(blockMax));
        mNew = V::select(takeNew, mOld, blockMax);
        const auto started = V::notEqual(mOld, V::set1(fa::simd_forward::kNegInf));
        alpha = V::zeroUnless(started, cpu::simd::exp<V>(V::sub(mOld, mNew)));
        sum = V::zero();
        j = 0;
    }
    ATTNOPS_SIMD_FN void finishRow() {
        V::store(l + r0, V::fmadd(V::load(l + r0), alpha, sum));
        V::store(m + r0, mNew);
        alignas(64) float alphas[8];
        V::store(alphas, alpha);
        for (int64_t q = r0; q < std::min(rows, r0 + 8); ++q)
            if (alphas[q - r0] != 1.0f) cpu::simd::scaleRowUnmasked<V>(p->dv, alphas[q - r0], acc + q * p->dv);
    }
    // `n` more vectors of the exp pass (keys of the current row vector, then the next one). Not
    // inlined: inlined, GCC hoisted the exp's constants out of the tile loop into registers and
    // spilled the GEMM's accumulators (108 us instead of 48); a call leaves the tile loop its 16
    // registers (no vector register survives a call, and none needs to between tiles).
    ATTNOPS_SIMD_FN __attribute__((noinline)) static void step(ExpCursor& c, int64_t n) {
        while (n > 0 && c.r0 < c.rows) {
            const int64_t take = std::min(n, c.nk - c.j);
            auto s = c.sum;
            const auto mn = c.mNew;
            for (int64_t e = 0; e < take; ++e) {
                float* x = c.st + (c.j + e) * c.ld + c.r0;
                const auto v = fa::simd_forward::expNonPositive<V>(V::sub(V::load(x), mn));
                V::store(x, v);
                s = V::add(s, v);
            }
            c.sum = s;
            c.j += take;
            n -= take;
            if (c.j == c.nk) {
                c.finishRow();
                c.r0 += 8;
                if (c.r0 < c.rows) c.startRow();
            }
        }
    }
};

template <int Chunk>
ATTNOPS_SIMD_FN __attribute__((noinline)) static void scoresWithExp(int64_t m, int64_t n, int64_t k, const float* a,
                                                                    const float* b, float* c, float scale,
                                                                    const cpu::simd::ColumnStats<V>& stats,
                                                                    ExpCursor& cur) {
    constexpr int MR = 4, NV = 3;
    constexpr int64_t L = 8, W = NV * L;
    const int64_t lda = k, ldb = n, ldc = n;
    cur.startRow();
    for (int64_t n0 = 0; n0 < n; n0 += W) {
        for (int64_t m0 = 0; m0 < m; m0 += MR) {
            const float* am = a + m0 * lda;
            V::Vec acc[MR][NV];
#pragma GCC unroll 8
            for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
                for (int v = 0; v < NV; ++v) acc[i][v] = V::zero();
            for (int64_t kk = 0; kk < k; ++kk) {
                V::Vec bv[NV];
#pragma GCC unroll 4
                for (int v = 0; v < NV; ++v) bv[v] = V::load(b + kk * ldb + n0 + v * L);
#pragma GCC unroll 8
                for (int i = 0; i < MR; ++i) {
                    const V::Vec av = V::set1(am[i * lda + kk]);
#pragma GCC unroll 4
                    for (int v = 0; v < NV; ++v) acc[i][v] = V::fmadd(av, bv[v], acc[i][v]);
                }
            }
            const auto scaleV = V::set1(scale);
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) {
                const int64_t col = n0 + v * L;
                auto colMax = V::load(stats.max + col);
                auto colNan = stats.nan[col / L];
#pragma GCC unroll 8
                for (int i = 0; i < MR; ++i) {
                    const auto x = V::mul(acc[i][v], scaleV);
                    V::store(c + (m0 + i) * ldc + col, x);
                    colNan = V::maskOr(colNan, V::isNan(x));
                    colMax = V::max(colMax, x);
                }
                V::store(stats.max + col, colMax);
                stats.nan[col / L] = colNan;
            }
            ExpCursor::step(cur, Chunk);
        }
    }
    ExpCursor::step(cur, int64_t(1) << 40);  // what is left
}

// The reference order for (a): block j+1's score GEMM, then block j's softmax.
ATTNOPS_SIMD_FN __attribute__((noinline)) static void scoresThenExp(const fa::ForwardParams& p, int64_t nk,
                                                                    int64_t qr, const float* k, const float* qt,
                                                                    float* stNext, const cpu::simd::ColumnStats<V>& next,
                                                                    float* st, float* m, float* l, float* acc,
                                                                    const cpu::simd::ColumnStats<V>& stats) {
    cpu::simd::gemmScoresScaledMax<V>(nk, qr, p.d, k, p.d, qt, qr, stNext, qr, p.scale, next);
    fa::simd_forward::softmaxBlockScaled<V>(p, qr, nk, qr, st, m, l, acc, stats);
}

// Block j's scores and column statistics again (the softmax turned them into probabilities),
// m and l as before a first block, block j+1's statistics empty.
ATTNOPS_SIMD_FN __attribute__((noinline)) static void refreshBlock(const fa::ForwardParams& p, int64_t qr, int64_t nk,
                                                                   const float* k, const float* qt, float* st,
                                                                   float* m, float* l,
                                                                   const cpu::simd::ColumnStats<V>& sj,
                                                                   const cpu::simd::ColumnStats<V>& sn) {
    for (const auto* s : {&sj, &sn}) {
        std::fill(s->max, s->max + qr, -INFINITY);
        std::fill(s->nan, s->nan + qr / V::kLanes, V::none());
    }
    cpu::simd::gemmScoresScaledMax<V>(nk, qr, p.d, k, p.d, qt, qr, st, qr, p.scale, sj);
    std::fill(m, m + qr, -INFINITY);
    std::fill(l, l + qr, 0.0f);
}

ATTNOPS_SIMD_FN int main(int argc, char** argv) {
    const int64_t qr = 120, nk = 128, d = 128, dv = 128;
    const int trials = argc > 1 ? std::atoi(argv[1]) : 2000;
    std::vector<float> k(nk * d), qt(d * qr), st(nk * qr), vs(nk * dv), acc(qr * dv), m(qr), l(qr);
    std::vector<float> big(64 * nk * d * 2, 0.5f);
    std::mt19937 g(1);
    std::normal_distribution<float> nd;
    for (auto* v : {&k, &qt, &vs})
        for (float& x : *v) x = nd(g);
    fa::ForwardParams p;
    p.scale = 0.088f;
    p.dv = dv;
    p.d = d;
    std::vector<float> kc(nk * d);
    double bCopy = 1e9, bPeak = 1e9, bScores = 1e9, bCold = 1e9, bPv = 1e9, bSoftmax = 1e9, bTwo = 1e9, bFused = 1e9;
    for (int t = 0; t < trials; ++t) {
        double t0 = now();
        peak(20000);
        bPeak = std::min(bPeak, now() - t0);
        t0 = now();
        cpu::simd::gemmScores<V, false>(nk, qr, d, k.data(), d, qt.data(), qr, st.data(), qr);
        bScores = std::min(bScores, now() - t0);
        const float* cold = big.data() + (t % 64) * nk * d * 2;
        t0 = now();
        cpu::simd::gemmScores<V, false>(nk, qr, d, cold, d, qt.data(), qr, st.data(), qr);
        bCold = std::min(bCold, now() - t0);
        {
            const float* c2 = big.data() + ((t + 32) % 64) * nk * d * 2;
            t0 = now();
            std::copy(c2, c2 + nk * d, kc.data());
            cpu::simd::gemmScores<V, false>(nk, qr, d, kc.data(), d, qt.data(), qr, st.data(), qr);
            bCopy = std::min(bCopy, now() - t0);
        }
        cpu::simd::gemmScores<V, false>(nk, qr, d, k.data(), d, qt.data(), qr, st.data(), qr);
        std::fill(m.begin(), m.end(), -INFINITY);
        std::fill(l.begin(), l.end(), 0.0f);
        t0 = now();
        softmax(p, qr, nk, st.data(), m.data(), l.data(), acc.data());
        bSoftmax = std::min(bSoftmax, now() - t0);
        t0 = now();
        cpu::simd::gemmStrips<V, true>(qr, dv, nk, st.data(), qr, vs.data(), acc.data(), dv, true);
        bPv = std::min(bPv, now() - t0);
        for (bool fused : {t % 2 == 0, t % 2 != 0}) {  // alternate which goes first
            t0 = now();
            scoresSoftmax(p, qr, nk, k.data(), qt.data(), st.data(), m.data(), l.data(), acc.data(), fused);
            double& best = fused ? bFused : bTwo;
            best = std::min(best, now() - t0);
        }
    }
    // Session 9, exp overlap: block j's softmax (scores from gemmScoresScaledMax, refreshed untimed
    // before every timing) as now, with 2 / 3 softmax vectors per pass (b), and after / among the
    // register tiles of block j+1's score GEMM (a), chunks of 6 / 12 / 24 exp vectors per tile.
    std::vector<float> st2(nk * qr), ref(nk * qr), refL(qr);
    alignas(64) float maxJ[V::kQueryRows], maxN[V::kQueryRows];
    V::Mask nanJ[V::kQueryRows / V::kLanes], nanN[V::kQueryRows / V::kLanes];
    const cpu::simd::ColumnStats<V> sj{maxJ, nanJ}, sn{maxN, nanN};
    auto refresh = [&] { refreshBlock(p, qr, nk, k.data(), qt.data(), st.data(), m.data(), l.data(), sj, sn); };
    int mismatches = 0;
    auto check = [&](bool first) {  // same bits as the current softmax (probabilities and l)
        if (first) {
            ref = st;
            refL = l;
        } else if (std::memcmp(ref.data(), st.data(), ref.size() * 4) != 0 ||
                   std::memcmp(refL.data(), l.data(), refL.size() * 4) != 0) {
            ++mismatches;
        }
    };
    constexpr int kVariants = 11;
    const char* names[kVariants] = {"softmax j, library (4 keys interl.)",
                                    "softmax j, 2 vectors per pass   (b)",
                                    "softmax j, 3 vectors per pass   (b)",
                                    "S j+1 then softmax j, library",
                                    "S j+1 then softmax j, 3 per pass (b)",
                                    "S j+1 (hooked copy), exp j after (a0)",
                                    "S j+1 with exp j, 12 per tile   (a)",
                                    "S j+1 with exp j, 24 per tile   (a)",
                                    "softmax j, one exp per key (b5aab60)",
                                    "softmax j, 4 keys interleaved   (c)",
                                    "S j+1 then softmax j, b5aab60 loop"};
    double best[kVariants];
    std::fill(best, best + kVariants, 1e9);
    for (int t = 0; t < trials; ++t) {
        for (int i = 0; i < kVariants; ++i) {
            const int v = (i + t) % kVariants;  // rotate which goes first
            refresh();
            ExpCursor cur{&p, qr, nk, qr, st.data(), m.data(), l.data(), acc.data(), &sj};
            const double t0 = now();
            switch (v) {
                case 0: softmaxScaledNow(p, qr, nk, qr, st.data(), m.data(), l.data(), acc.data(), sj); break;
                case 1: softmaxGrouped<2>(p, qr, nk, qr, st.data(), m.data(), l.data(), acc.data(), sj); break;
                case 2: softmaxGrouped<3>(p, qr, nk, qr, st.data(), m.data(), l.data(), acc.data(), sj); break;
                case 3:
                    scoresThenExp(p, nk, qr, k.data(), qt.data(), st2.data(), sn, st.data(), m.data(), l.data(),
                                  acc.data(), sj);
                    break;
                case 4:
                    cpu::simd::gemmScoresScaledMax<V>(nk, qr, d, k.data(), d, qt.data(), qr, st2.data(), qr, p.scale,
                                                      sn);
                    softmaxGrouped<3>(p, qr, nk, qr, st.data(), m.data(), l.data(), acc.data(), sj);
                    break;
                case 5: scoresWithExp<0>(nk, qr, d, k.data(), qt.data(), st2.data(), p.scale, sn, cur); break;
                case 6: scoresWithExp<12>(nk, qr, d, k.data(), qt.data(), st2.data(), p.scale, sn, cur); break;
                case 7: scoresWithExp<24>(nk, qr, d, k.data(), qt.data(), st2.data(), p.scale, sn, cur); break;
                case 8: softmaxKeysInterleaved<1>(p, qr, nk, qr, st.data(), m.data(), l.data(), acc.data(), sj); break;
                case 9: softmaxKeysInterleaved<4>(p, qr, nk, qr, st.data(), m.data(), l.data(), acc.data(), sj); break;
                default:
                    cpu::simd::gemmScoresScaledMax<V>(nk, qr, d, k.data(), d, qt.data(), qr, st2.data(), qr, p.scale,
                                                      sn);
                    softmaxKeysInterleaved<1>(p, qr, nk, qr, st.data(), m.data(), l.data(), acc.data(), sj);
                    break;
            }
            best[v] = std::min(best[v], now() - t0);
            if (t == 0) check(i == 0 && v == 0 ? true : false);
        }
    }
    const double pk = 20000.0 * 12 * 16 / bPeak / 1e9, flop = 2.0 * nk * qr * d;
    std::printf("best of %d, 1 thread: FMA peak %.1f GFLOP/s\n", trials, pk);
    std::printf("S = K.Q^T, K in L2       %.1f%% of peak\n", 100 * flop / bScores / 1e9 / pk);
    std::printf("S = K.Q^T, K from 8 MiB  %.1f%% of peak\n", 100 * flop / bCold / 1e9 / pk);
    std::printf("copy K from 8 MiB + S   %.1f%% of peak\n", 100 * flop / bCopy / 1e9 / pk);
    std::printf("O += P.V                 %.1f%% of peak\n", 100 * flop / bPv / 1e9 / pk);
    std::printf("softmax                  %.2f us = %.1f%% of the two GEMMs' time at peak\n", bSoftmax * 1e6,
                100 * bSoftmax / (2 * flop / (pk * 1e9)));
    std::printf("S + softmax, two steps   %.2f us (%.1f%% of peak for the S FLOPs)\n", bTwo * 1e6,
                100 * flop / bTwo / 1e9 / pk);
    std::printf("S + softmax, fused       %.2f us (%.1f%% of peak for the S FLOPs)\n", bFused * 1e6,
                100 * flop / bFused / 1e9 / pk);
    std::printf("exp overlap (session 9), same bits as softmaxBlockScaled: %s\n", mismatches == 0 ? "yes" : "NO");
    for (int v = 0; v < kVariants; ++v)
        std::printf("  %-38s %7.2f us%s\n", names[v], best[v] * 1e6,
                    (v >= 3 && v <= 7) || v == 10 ? (" (" + std::to_string(int(1000 * flop / best[v] / 1e9 / pk) / 10.0).substr(0, 4) +
                              "% of peak for the S FLOPs)")
                                 .c_str()
                           : "");
}

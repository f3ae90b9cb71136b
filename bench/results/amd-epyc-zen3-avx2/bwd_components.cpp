// Component micro-benchmark of the AVX2 fused flash-attention backward (cpu/simd/fa_backward.hpp,
// keyBlock's vector path with a HeadRows chunk), for machines shared with other jobs: every figure
// is the best of many short timings against an in-run 12-chain FMA loop timed the same way, one
// thread. D = Dv = 128, one 128-key block, query blocks of 120 rows, with the kernel's exact
// calls, shapes, leading dimensions and operand layouts (its own Scratch carve):
//   S   = Q . K^T     gemm<V,false>(rows, nk, d,  qRows/ld,  kt/lk,     s/lk)
//   dP  = dO . V^T    gemm<V,false>(rows, nk, dv, doRows/ldv, vt/lk,    dp/lk)
//   dV += P^T . dO    gemm<V,true> (nk, dv, rows, s/lk,      doRows/ldv, dvAcc/dv)
//   dK += dS^T . Q    gemm<V,true> (nk, d,  rows, dp/lk,     qRows/ld,   dkAcc/d)
//   dQ += dS . K      gemm<V,false>(rows, d, nk,  dp/lk,     k/ld,       dq/d)
// "warm": one GEMM called again and again on the same operands (L1/L2). "loop": one key block
// against the query blocks of a chunk (16 blocks, 1920 rows: Q, dO, dQ of the chunk stream from
// L3 as in the kernel), the probabilities step between the GEMMs, each GEMM timed on its own and
// summed over the chunk's blocks; argument 2: 1 (default) with the kernel's prefetch of the next
// block's rows, 0 without (as before 03a39f7); argument 3: 1 (default) times a second pass over the
// chunk (its rows in L3, as in the kernel), 0 the first pass after evicting (its rows from DRAM or
// L3, what the earlier rounds in bwd-components-under-load.txt measured). Build from a configured tree:
//   g++ -O2 -std=c++20 -Isrc -Ibuild/include -Iinclude bench/results/amd-epyc-zen3-avx2/bwd_components.cpp
#include "cpu/avx2/simd_avx2.hpp"
#include "cpu/simd/fa_backward.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include "measure.hpp"

using namespace attnops;
using V = cpu::Avx2;
namespace sb = fa::simd_backward;
namespace simd = cpu::simd;

static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}


constexpr int64_t kRows = 120, kKeys = 128, kD = 128, kBlocks = 16;
constexpr int kGemms = 6;
static const char* const kNames[kGemms] = {"S   = Q.K^T  ", "dP  = dO.V^T ", "dV += P^T.dO ",
                                           "dK += dS^T.Q ", "dQ += dS.K   ", "probabilities"};

struct Arrays {
    sb::Scratch* sc;
    float *q, *dO, *dq;  // the chunk's HeadRows: [kBlocks * kRows][ld], [..][ldv], [..][d]
    float *m, *l, *delta;
};

// 0: no prefetch (before 03a39f7); 1: the kernel's prefetch of the next block's Q, dO, dQ rows into L2
// during the probabilities step (prefetchToL2). Tried and dropped (this program, same day): the
// same lines with prefetcht0 (whole loop 64% of peak against 74% without: it evicts the current
// block's operands from L1), and prefetcht0/t1 spread between 24-row slices of the dV, dK, dQ GEMMs
// (79-83%, no better than prefetcht1 in the probabilities step and a GEMM loop order change).
static int gMode = 1;
// 1: the timed pass is the second over the chunk (its rows in L3, as for every key block of the
// kernel but the first); 0: the only pass after 16 MiB of other data (rows from DRAM or L3).
static int gL3 = 1;

// The kernel's calls for query block `blk`; times[i] += the seconds of call i when timed.
ATTNOPS_SIMD_FN __attribute__((noinline)) static void blockCalls(const Arrays& a, int64_t blk, double* times,
                                                                 int only) {
    const int64_t ld = sb::paddedLd(kD), ldv = ld, lk = sb::paddedLd(kKeys), rows = kRows, nk = kKeys, d = kD;
    sb::Scratch& sc = *a.sc;
    const float* qRows = a.q + blk * rows * ld;
    const float* doRows = a.dO + blk * rows * ldv;
    float* dq = a.dq + blk * rows * d;
    double t0 = now(), t1;
    auto lap = [&](int i) {
        t1 = now();
        times[i] += t1 - t0;
        t0 = t1;
    };
    if (only < 0 || only == 0) simd::gemm<V, false>(rows, nk, d, qRows, ld, sc.kt, lk, sc.s, lk, false);
    lap(0);
    if (only < 0 || only == 1) simd::gemm<V, false>(rows, nk, d, doRows, ldv, sc.vt, lk, sc.dp, lk, false);
    lap(1);
    int64_t nextRows = 0;
    const int64_t nb = sb::nextChunkBlock(blk * rows, rows, kBlocks * rows, rows, &nextRows);
    if (only < 0)
        for (int64_t r = 0; r < rows; ++r) {
            if (gMode == 1 && r < nextRows) {
                sb::prefetchToL2(a.q + (nb + r) * ld, d);
                sb::prefetchToL2(a.dO + (nb + r) * ldv, d);
                sb::prefetchToL2(a.dq + (nb + r) * d, d);
            }
            sb::rowProbabilities<V>(nk, 0.088f, a.m[r], a.l[r], a.delta[r], sc.s + r * lk, sc.dp + r * lk, nullptr,
                                    r, 0);
        }
    lap(5);
    if (only < 0 || only == 2) simd::gemm<V, true>(nk, d, rows, sc.s, lk, doRows, ldv, sc.dvAcc, d, true);
    lap(2);
    if (only < 0 || only == 3) simd::gemm<V, true>(nk, d, rows, sc.dp, lk, qRows, ld, sc.dkAcc, d, true);
    lap(3);
    if (only < 0 || only == 4) simd::gemm<V, false>(rows, d, nk, sc.dp, lk, sc.k, ld, dq, d, true);
    lap(4);
}

// A causal diagonal block (query rows 0-119 against keys 0-127) warm, with the GEMMs of the
// whole block (before 03a39f7) or trimmed to the kept pairs (trimmedScoreGemms,
// trimmedGradientGemms), the band's probabilities step between them.
ATTNOPS_SIMD_FN __attribute__((noinline)) static void diagonalBlock(const Arrays& a, bool trim) {
    const int64_t ld = sb::paddedLd(kD), lk = sb::paddedLd(kKeys), rows = kRows, nk = kKeys, d = kD;
    const fa::SeqRule causal{-fa::kUnbounded, 0, 0};
    const sb::BlockBand bb{causal, 2048, 0, rows, 0, nk};
    const auto band = simd::bandLanes<V>(causal, 2048);
    sb::Scratch& sc = *a.sc;
    if (trim) {
        sb::trimmedScoreGemms<V>(bb, d, d, a.q, ld, a.dO, ld, sc.kt, sc.vt, sc.s, sc.dp, lk);
    } else {
        simd::gemm<V, false>(rows, nk, d, a.q, ld, sc.kt, lk, sc.s, lk, false);
        simd::gemm<V, false>(rows, nk, d, a.dO, ld, sc.vt, lk, sc.dp, lk, false);
    }
    for (int64_t r = 0; r < rows; ++r)
        sb::rowProbabilities<V>(nk, 0.088f, a.m[r], a.l[r], a.delta[r], sc.s + r * lk, sc.dp + r * lk, &band, r, 0);
    if (trim) {
        sb::trimmedGradientGemms<V>(bb, d, d, a.q, ld, a.dO, ld, sc.s, sc.dp, lk, sc.k, sc.dvAcc, sc.dkAcc, a.dq);
    } else {
        simd::gemm<V, true>(nk, d, rows, sc.s, lk, a.dO, ld, sc.dvAcc, d, true);
        simd::gemm<V, true>(nk, d, rows, sc.dp, lk, a.q, ld, sc.dkAcc, d, true);
        simd::gemm<V, false>(rows, d, nk, sc.dp, lk, sc.k, ld, a.dq, d, true);
    }
}

int main(int argc, char** argv) {
    const int trials = argc > 1 ? std::atoi(argv[1]) : 300;
    gMode = argc > 2 ? std::atoi(argv[2]) : 1;
    gL3 = argc > 3 ? std::atoi(argv[3]) : 1;
    fa::BackwardParams bp;
    bp.fwd.d = kD;
    bp.fwd.dv = kD;
    fa::TileShape t;
    t.queryRows = kRows;
    t.keyRows = kKeys;
    std::vector<float> scratch(size_t(sb::Scratch::floats(bp, t)) + 16);
    float* base = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t(63));
    sb::Scratch sc(bp, t, base);
    const int64_t ld = sb::paddedLd(kD), lk = sb::paddedLd(kKeys), chunk = kBlocks * kRows;
    std::vector<float> q(chunk * ld + 16), dO(chunk * ld + 16), dq(chunk * kD + 16), m(kRows), l(kRows),
        delta(kRows);
    std::mt19937 g(1);
    std::normal_distribution<float> nd;
    for (auto* v : {&q, &dO})
        for (float& x : *v) x = 0.3f * nd(g);
    for (int64_t i = 0; i < kD * lk; ++i) sc.kt[i] = sc.vt[i] = 0.3f * nd(g);
    for (int64_t i = 0; i < kKeys * ld; ++i) sc.k[i] = 0.3f * nd(g);
    for (int64_t r = 0; r < kRows; ++r) {
        m[r] = 1.0f;
        l[r] = 30.0f;
        delta[r] = 0.1f;
    }
    auto aligned = [](std::vector<float>& v) {
        return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(v.data()) + 63) & ~uintptr_t(63));
    };
    Arrays a{&sc, aligned(q), aligned(dO), aligned(dq), m.data(), l.data(), delta.data()};
    std::fill(sc.dkAcc, sc.dkAcc + kKeys * kD, 0.0f);
    std::fill(sc.dvAcc, sc.dvAcc + kKeys * kD, 0.0f);
    // A chunk's worth of other data between the loop's passes, so that Q, dO, dQ come from L3.
    std::vector<float> evict(size_t(4) << 20);
    double bPeak = 1e9, warm[kGemms], loop[kGemms], whole = 1e9, diagFull = 1e9, diagTrim = 1e9;
    std::fill(warm, warm + kGemms, 1e9);
    std::fill(loop, loop + kGemms, 1e9);
    for (int tr = 0; tr < trials; ++tr) {
        double t0 = now();
        peak(20000);
        bPeak = std::min(bPeak, now() - t0);
        for (int i = 0; i < 5; ++i) {
            double times[kGemms] = {};
            blockCalls(a, 0, times, i);
            std::fill(times, times + kGemms, 0.0);
            blockCalls(a, 0, times, i);
            warm[i] = std::min(warm[i], times[i]);
        }
        for (int trim = 0; trim < 2; ++trim) {
            diagonalBlock(a, trim != 0);
            t0 = now();
            diagonalBlock(a, trim != 0);
            double& best = trim != 0 ? diagTrim : diagFull;
            best = std::min(best, now() - t0);
        }
        for (size_t i = 0; i < evict.size(); i += 16) evict[i] += 1.0f;
        double times[kGemms] = {};
        if (gL3) {  // a first pass brings the chunk into L3, as the kernel's earlier key blocks do
            for (int64_t blk = 0; blk < kBlocks; ++blk) blockCalls(a, blk, times, -1);
            std::fill(times, times + kGemms, 0.0);
        }
        t0 = now();
        for (int64_t blk = 0; blk < kBlocks; ++blk) blockCalls(a, blk, times, -1);
        whole = std::min(whole, now() - t0);
        for (int i = 0; i < kGemms; ++i) loop[i] = std::min(loop[i], times[i] / kBlocks);
    }
    const double pk = 20000.0 * 12 * 16 / bPeak / 1e9, flop = 2.0 * kRows * kKeys * kD;
    std::printf("best of %d, 1 thread: FMA peak %.1f GFLOP/s; rows %ld, keys %ld, d %ld, ld %ld, lk %ld\n", trials, pk,
                long(kRows), long(kKeys), long(kD), long(ld), long(lk));
    std::printf("               warm (us, %% of peak)   loop (us, %% of peak)\n");
    double sum = 0;
    for (int i = 0; i < 5; ++i) {
        sum += loop[i];
        std::printf("%s  %7.2f  %5.1f%%          %7.2f  %5.1f%%\n", kNames[i], warm[i] * 1e6,
                    100 * flop / warm[i] / 1e9 / pk, loop[i] * 1e6, 100 * flop / loop[i] / 1e9 / pk);
    }
    std::printf("%s                            %7.2f  (%.1f%% of the five GEMMs' time at peak)\n", kNames[5],
                loop[5] * 1e6, 100 * loop[5] / (5 * flop / (pk * 1e9)));
    std::printf("causal diagonal block (120 rows x 128 keys, warm): whole-block GEMMs %.2f us, trimmed %.2f us (%.2fx)\n",
                diagFull * 1e6, diagTrim * 1e6, diagFull / diagTrim);
    std::printf("five GEMMs (sum of per-call bests) %.1f%% of peak; whole block loop %.1f%% of peak\n",
                100 * 5 * flop / sum / 1e9 / pk, 100 * 5 * flop * kBlocks / whole / 1e9 / pk);
}

// Component micro-benchmark of the AVX2 flash-attention forward (cpu/simd/fa_forward.hpp), for
// machines shared with other jobs: every figure is the best of many short timings (each well
// under a scheduler slice), against an in-run 12-chain FMA loop timed the same way, 1 thread.
// One 120-row x 128-key block at D = Dv = 128: S = K.Q^T (gemmScores, K L2-resident, and K read
// from an 8 MiB buffer in place, and copied from it first, as the kernel now does), P.V
// (gemmStrips on packed value strips) and the online softmax (softmaxBlock, first block of a row);
// S + softmax as two steps and with the first softmax pass fused into the score GEMM's epilogue.
// Build from a configured tree:
//   g++ -O2 -std=c++20 -Isrc -Ibuild/include -Iinclude bench/results/amd-epyc-zen3-avx2/fwd_components.cpp
#include "cpu/avx2/simd_avx2.hpp"
#include "cpu/simd/fa_forward.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

using namespace attnops;
using V = cpu::Avx2;

static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

__attribute__((target("avx2,fma"), noinline)) static float peak(long n) {
    __m256 a[12];
    for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(float(i));
    const __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
    for (long k = 0; k < n; ++k) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; ++i) a[i] = _mm256_fmadd_ps(a[i], b, c);
        __asm__ volatile("" ::"x"(a[0]), "x"(a[1]), "x"(a[2]), "x"(a[3]), "x"(a[4]), "x"(a[5]), "x"(a[6]), "x"(a[7]),
                         "x"(a[8]), "x"(a[9]), "x"(a[10]), "x"(a[11]));
    }
    float s = 0, t[8];
    for (int i = 0; i < 12; ++i) {
        _mm256_storeu_ps(t, a[i]);
        s += t[0];
    }
    return s;
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

int main(int argc, char** argv) {
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
}

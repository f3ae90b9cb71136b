// Session 11: one key block of the AVX2 forward's unit loop (fa_forward.hpp, fp32, fully kept, no bias), its
// parts timed one by one, one thread, best of many short timings, for a loaded AMD EPYC Zen 3 (family 25
// model 1, 2 vCPUs). 120 query rows x 128 keys, D = Dv = 128; K and V read from a 16 MiB buffer in place
// (another block each timing, so from L3 or DRAM, as the kernel reads a head's K/V once per unit): the K copy
// (loadRowsFast), the V strip packing (loadRowsStrips), the score GEMM with its fused first softmax pass
// (gemmScoresScaledMax, K in scratch), the softmax update (softmaxBlockScaled), P.V (gemmStrips), and the
// whole block as the kernel runs it; % of the in-run FMA peak for the block's 2 GEMMs.
// Build from a configured tree: g++ -O3 -std=c++20 -Isrc -Ibuild/include -Iinclude THIS
#include "cpu/avx2/simd_avx2.hpp"
#include "cpu/simd/fa_forward.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include "measure.hpp"

using namespace attnops;
using V = cpu::Avx2;
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }


constexpr int64_t qr = 120, nk = 128, d = 128, dv = 128, kBlocks = 64;  // 64 blocks of K and V: 8 + 8 MiB

struct Bufs {
    std::vector<float> big, qt, k, vs, st, m, l, acc;
    alignas(64) float colMax[qr];
    V::Mask colNan[qr / 8];
};

ATTNOPS_SIMD_FN __attribute__((noinline)) static void copyK(const fa::View4& kv, int64_t blk, float* k) {
    cpu::simd::loadRowsFast<V>(kv, 0, 0, blk * nk, nk, d, k);
}
// The K copy by vector loads and stores in the loop (as packUnitStrips copies V), no memcpy call per row.
ATTNOPS_SIMD_FN __attribute__((noinline)) static void copyKVec(const fa::View4& kv, int64_t blk, float* k) {
    const float* src = static_cast<const float*>(kv.data) + kv.offset(0, 0, blk * nk, 0);
    for (int64_t r = 0; r < nk; ++r)
#pragma GCC unroll 4
        for (int64_t c = 0; c < d; c += 8) V::store(k + r * d + c, V::load(src + r * kv.stride[2] + c));
}
ATTNOPS_SIMD_FN __attribute__((noinline)) static void packV(const fa::View4& vv, int64_t blk, float* vs) {
    cpu::simd::loadRowsStrips<V>(vv, 0, 0, blk * nk, nk, dv, vs);
}
ATTNOPS_SIMD_FN __attribute__((noinline)) static void scores(Bufs& b, float scale) {
    const cpu::simd::ColumnStats<V> stats{b.colMax, b.colNan};
    std::fill(b.colMax, b.colMax + qr, -INFINITY);
    std::fill(b.colNan, b.colNan + qr / 8, V::none());
    cpu::simd::gemmScoresScaledMax<V>(nk, qr, d, b.k.data(), d, b.qt.data(), qr, b.st.data(), qr, scale, stats);
}
ATTNOPS_SIMD_FN __attribute__((noinline)) static void softmax(const fa::ForwardParams& p, Bufs& b) {
    const cpu::simd::ColumnStats<V> stats{b.colMax, b.colNan};
    fa::simd_forward::softmaxBlockScaled<V>(p, qr, nk, qr, b.st.data(), b.m.data(), b.l.data(), b.acc.data(), stats);
}
ATTNOPS_SIMD_FN __attribute__((noinline)) static void pv(Bufs& b) {
    cpu::simd::gemmStrips<V, true>(qr, dv, nk, b.st.data(), qr, b.vs.data(), b.acc.data(), dv, true);
}

int main(int argc, char** argv) {
    const int trials = argc > 1 ? std::atoi(argv[1]) : 1000;
    Bufs b;
    std::mt19937 g(5);
    std::uniform_real_distribution<float> u(-1, 1);
    b.big.resize(kBlocks * nk * (d + dv));
    for (auto& x : b.big) x = u(g);
    b.qt.resize(d * qr);
    for (auto& x : b.qt) x = u(g);
    b.k.resize(nk * d);
    b.vs.resize(nk * dv);
    b.st.resize(nk * qr);
    b.acc.assign(qr * dv, 0.0f);
    b.m.assign(qr, 0.0f);  // a maximum above every score: alpha = 1 after the first call
    b.l.assign(qr, 0.0f);
    fa::View4 kv{b.big.data(), DType::F32, {0, 0, d, 1}}, vv{b.big.data() + kBlocks * nk * d, DType::F32, {0, 0, dv, 1}};
    fa::ForwardParams p{};
    p.dv = dv;
    p.scale = 0.0884f;
    double best[8] = {1e9, 1e9, 1e9, 1e9, 1e9, 1e9, 1e9, 1e9};
    int64_t blk = 0;
    for (int t = 0; t < trials; ++t) {
        double t0 = now();
        peak(20000);
        best[0] = std::min(best[0], now() - t0);
        blk = (blk + 7) % kBlocks;
        t0 = now(); copyK(kv, blk, b.k.data()); best[1] = std::min(best[1], now() - t0);
        blk = (blk + 7) % kBlocks;
        t0 = now(); copyKVec(kv, blk, b.k.data()); best[7] = std::min(best[7], now() - t0);
        t0 = now(); packV(vv, blk, b.vs.data()); best[2] = std::min(best[2], now() - t0);
        t0 = now(); scores(b, p.scale); best[3] = std::min(best[3], now() - t0);
        t0 = now(); softmax(p, b); best[4] = std::min(best[4], now() - t0);
        t0 = now(); pv(b); best[5] = std::min(best[5], now() - t0);
        blk = (blk + 7) % kBlocks;
        t0 = now();
        copyK(kv, blk, b.k.data());
        packV(vv, blk, b.vs.data());
        scores(b, p.scale);
        softmax(p, b);
        pv(b);
        best[6] = std::min(best[6], now() - t0);
        if (t % 32 == 31) { std::fill(b.acc.begin(), b.acc.end(), 0.0f); std::fill(b.l.begin(), b.l.end(), 0.0f); }
    }
    const double pk = 20000.0 * 12 * 16 / best[0] / 1e9, gemmUs = 2.0 * nk * qr * d / pk / 1e3;
    std::printf("AMD EPYC Zen 3 (family 25 model 1, 2 vCPUs, under load), 1 thread, best of %d: FMA peak %.1f GFLOP/s;"
                " one GEMM of the block at peak %.2f us\n", trials, pk, gemmUs);
    const char* names[] = {"", "K copy from L3/DRAM (loadRowsFast)", "V strip packing (loadRowsStrips)",
                           "S + scale/max epilogue (K in L1/L2)", "softmax update (softmaxBlockScaled)",
                           "P.V (gemmStrips)", "whole block, in sequence"};
    double sum = 0;
    for (int i = 1; i < 6; ++i) {
        sum += best[i];
        std::printf("  %-38s %6.2f us\n", names[i], best[i] * 1e6);
    }
    std::printf("  %-38s %6.2f us\n", "K copy, vector loop (no memcpy per row)", best[7] * 1e6);
    std::printf("  %-38s %6.2f us (sum of parts %.2f): %.1f%% of peak for the 2 GEMMs\n", names[6], best[6] * 1e6,
                sum * 1e6, 100 * 2 * gemmUs / (best[6] * 1e6));
}

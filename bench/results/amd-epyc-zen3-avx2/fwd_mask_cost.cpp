// Where the causal and packed (TND) forward lose against the unmasked one: 1-thread process CPU time (best of N calls)
// per credited FLOP of FlashAttentionScore fp32/bf16 on (a) BNSD N=1 S unmasked, (b) the same causal, (c) TND causal
// with the tnd-32k-causal lengths (bench.cpp's realisticLengths) scaled to one kv head (N1=4 N2=1 D=128), against a
// 12-chain FMA loop's CPU time measured between calls (the in-run peak).
// usage: <binary> dense|causal|tnd S-or-tokens trials [bf16] [threads]
// Build: g++ -O2 -std=c++20 -Iinclude -Ibuild/include THIS build/libattnops.a -lpthread
#include "attnops/attnops.hpp"
#include <immintrin.h>
#include <time.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numbers>
#include <random>
#include <string>
#include <vector>
#include "measure.hpp"

struct Rng {  // tools::Rng
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x1234567ull) {}
    uint64_t next() { uint64_t z = (s += 0x9E3779B97F4A7C15ull); z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull; return z ^ (z >> 31); }
    double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }
};
static std::vector<int64_t> realisticLengths(int64_t tokens) {
    Rng rng(32768); std::vector<int64_t> L; int64_t total = 0;
    while (total < tokens) {
        const double u1 = 1.0 - rng.uniform(), u2 = rng.uniform();
        const double normal = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
        int64_t len = std::clamp(int64_t(std::llround(512.0 * std::exp(0.8 * normal))), int64_t(16), int64_t(4096));
        len = std::min(len, tokens - total); L.push_back(len); total += len;
    }
    return L;
}
int main(int argc, char** argv) {
    const std::string kind = argc > 1 ? argv[1] : "causal";
    const int64_t S = argc > 2 ? atoi(argv[2]) : 1024;
    const int trials = argc > 3 ? atoi(argv[3]) : 20;
    const bool bf16 = argc > 4 && std::string(argv[4]) == "bf16";
    const int threads = argc > 5 ? atoi(argv[5]) : 1;
    const bool tnd = kind == "tnd", causal = kind != "dense";
    const int64_t D = 128, N1 = tnd ? 4 : 1, N2 = 1;
    std::vector<int64_t> lens = tnd ? realisticLengths(S) : std::vector<int64_t>{S};
    int64_t T = 0; double pairs = 0; std::vector<int64_t> cum;
    for (int64_t l : lens) { T += l; cum.push_back(T); pairs += causal ? double(l) * (l + 1) / 2 : double(l) * l; }
    const attnopsDataType dt = bf16 ? ATTNOPS_BFLOAT16 : ATTNOPS_FLOAT32;
    const size_t es = bf16 ? 2 : 4;
    std::vector<char> q(N1 * T * D * es), k(N2 * T * D * es), v(N2 * T * D * es), o(N1 * T * D * es);
    std::vector<float> mx(N1 * T * 8), sm(N1 * T * 8);
    std::mt19937 g(1); std::uniform_real_distribution<float> u(-1, 1);
    for (auto* x : {&q, &k, &v}) {
        if (bf16) { auto* h = reinterpret_cast<uint16_t*>(x->data()); for (size_t i = 0; i < x->size() / 2; ++i) { float f = u(g); uint32_t b; memcpy(&b, &f, 4); h[i] = uint16_t(b >> 16); } }
        else { auto* f = reinterpret_cast<float*>(x->data()); for (size_t i = 0; i < x->size() / 4; ++i) f[i] = u(g); }
    }
    attnopsSetDeviceThreads(0, threads);
    using namespace attnops;
    const std::vector<int64_t> shq = tnd ? std::vector<int64_t>{T, N1, D} : std::vector<int64_t>{1, N1, T, D};
    const std::vector<int64_t> shk = tnd ? std::vector<int64_t>{T, N2, D} : std::vector<int64_t>{1, N2, T, D};
    const std::vector<int64_t> shs = tnd ? std::vector<int64_t>{T, N1, 8} : std::vector<int64_t>{1, N1, T, 8};
    Tensor tq(q.data(), dt, shq), tk(k.data(), dt, shk), tv(v.data(), dt, shk), to(o.data(), dt, shq),
        tm(mx.data(), ATTNOPS_FLOAT32, shs), ts(sm.data(), ATTNOPS_FLOAT32, shs);
    std::vector<uint8_t> mask(2048 * 2048);
    for (int i = 0; i < 2048; ++i) for (int j = 0; j < 2048; ++j) mask[i * 2048 + j] = j > i;
    Tensor tmask(mask.data(), ATTNOPS_BOOL, {2048, 2048});
    IntArray cq(cum), ck(cum);
    FlashAttentionScoreArgs a; a.query = &tq; a.key = &tk; a.value = &tv; a.attentionOut = &to; a.softmaxMax = &tm;
    a.softmaxSum = &ts; a.headNum = N1; a.scaleValue = 0.0884;
    if (causal) { a.sparseMode = 3; a.attenMask = &tmask; }
    if (tnd) { a.inputLayout = "TND"; a.actualSeqQLen = &cq; a.actualSeqKvLen = &ck; }
    Workspace ws;
    flashAttentionScore(a, nullptr, &ws);
    double bp = 1e9, bc = 1e9, bw = 1e9;
    for (int t = 0; t < trials; ++t) {
        double c0 = cpuNow(); peak(100000); double c1 = cpuNow(); bp = std::min(bp, c1 - c0);
        const double w0 = wallNow(); c0 = cpuNow(); flashAttentionScore(a, nullptr, &ws); c1 = cpuNow(); const double w1 = wallNow();
        bc = std::min(bc, c1 - c0); bw = std::min(bw, w1 - w0);
    }
    const double pk = 100000.0 * 12 * 16 / bp / 1e9, fl = 4.0 * pairs * D * N1;
    printf("%s %s T=%ld seqs=%zu threads=%d best of %d: peak %.1f GF/s/thread; cpu %.3f ms = %.1f%% of %d x peak; wall %.3f ms\n",
           kind.c_str(), bf16 ? "bf16" : "fp32", (long)T, lens.size(), threads, trials, pk, bc * 1e3,
           100 * fl / bc / 1e9 / pk, 1, bw * 1e3);
}

// Cycles per (token, kv head) row of the decode microkernels of src/cpu/simd/fia_forward.hpp (avx2):
// the score dot (dotRows) and P.V (accumulateRows) of one 64-key block, 4 query rows (a GQA group
// of 4), D 128, key/value rows in L1/L2 (the same block again and again). Each block is timed with
// rdtsc (TSC ticks at the nominal clock) and the minimum and the 10th percentile over many blocks
// are reported: a block that a preemption or a busy SMT sibling slowed is left out, so the figure
// holds on a loaded machine. Build once against each source tree and alternate the binaries
// (-DRAW_DOTS only for commit f869404, whose dotRows took a `raw` scratch; reverted in ca78ad8):
//   g++ -O2 -std=c++20 -I <tree>/src -I <tree>/include -I build/include -DATTNOPS_STATIC_DEFINE [-DRAW_DOTS]
//       bench/results/amd-epyc-zen3-avx2/decode_s10_cycles.cpp -o /tmp/cycles
#include <x86intrin.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cpu/avx2/simd_avx2.hpp"
#include "cpu/simd/fia_forward.hpp"

using namespace attnops;
using namespace attnops::fia::simd_forward;
using V = cpu::Avx2;

constexpr int64_t kD = 128, kRows = 4, kBlock = 64;

struct Stats {
    double min, p10;
};
static Stats stats(std::vector<double>& t) {
    std::sort(t.begin(), t.end());
    return {t[0] / kBlock, t[t.size() / 10] / kBlock};
}

template <DType T>
void measure(const char* name, int64_t elemBytes, int blocks) {
    const int64_t rowBytes = kD * elemBytes;
    std::vector<char> kv(size_t(2 * kBlock * rowBytes));
    for (size_t i = 0; i < kv.size(); ++i) kv[i] = char((i * 2654435761u >> 13) & 0x3f);  // small finite values
    std::vector<const char*> kr(kBlock), vr(kBlock);
    for (int64_t j = 0; j < kBlock; ++j) {
        kr[size_t(j)] = kv.data() + j * rowBytes;
        vr[size_t(j)] = kv.data() + (kBlock + j) * rowBytes;
    }
    std::vector<float> q(kRows * kD, 0.01f), st(kRows * kBlock, 0.001f), acc(kRows * kD, 0.0f);
    std::vector<int64_t> chunk(kD / 8);
    alignas(64) static float raw[kRows * kBlock * 8];  // unreduced dots (RAW_DOTS)
    for (int64_t v = 0; v < kD / 8; ++v) chunk[size_t(v)] = v * 8;
    std::vector<double> tDot(static_cast<size_t>(blocks)), tPv(static_cast<size_t>(blocks));
    for (int b = 0; b < blocks; ++b) {
        uint64_t t0 = __rdtsc();
        dotRows<V, T, T, kRows, true, false>(kD, kr.data(), chunk.data(), 0, nullptr, nullptr, kBlock, q.data(), kD,
                                             st.data(), nullptr, kBlock, nullptr
#ifdef RAW_DOTS
                                             , raw
#endif
        );
        uint64_t t1 = __rdtsc();
        accumulateRows<V, T, kRows, false, true>(kD, vr.data(), chunk.data(), kBlock, st.data(), kBlock, acc.data(), kD);
        uint64_t t2 = __rdtsc();
        tDot[size_t(b)] = double(t1 - t0);
        tPv[size_t(b)] = double(t2 - t1);
        for (auto& x : st) x = 0.001f;  // the dot wrote scores; P.V reads small probabilities
    }
    const Stats d = stats(tDot), p = stats(tPv);
    std::printf("%-5s TSC ticks per row: dot min %5.1f p10 %5.1f | P.V min %5.1f p10 %5.1f | sum of p10 %5.1f  (check %g)\n",
                name, d.min, d.p10, p.min, p.p10, d.p10 + p.p10, double(acc[0]));
}

int main(int argc, char** argv) {
    const int blocks = argc > 1 ? std::atoi(argv[1]) : 20000;
    measure<DType::BF16>("bf16", 2, blocks);
    measure<DType::I8>("int8", 1, blocks);
}

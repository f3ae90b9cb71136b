// Whether one TDPBF16PS slows the code after it: a dependent chain of scalar 64-bit multiplies (no
// vector unit, latency-bound, so only the clock sets its speed) timed with and without one
// TDPBF16PS before it, for chains of several lengths and after waits of 0.1-100 ms. Not part of
// the build (the record behind NOTES.md, fifth AMX session; amx_bench.hpp holds the timer).
//   g++ -O2 -std=c++20 -mamx-tile -mamx-bf16 freq.cpp -o freq && ./freq
// Intel(R) Xeon(R) Processor, GenuineIntel family 6 model 167 as its KVM guest reported it,
// 2026-12-07, one thread, two runs (15:15 UTC without the 0.1 and 0.3 ms waits / 16:45 UTC):
//   a chain of 250 / 1,000 / 4,000 / 16,000 / 64,000 multiplies right after a TDP:
//     +14% / +42% / +30% / +24% / +17%  and  +11% / +43% / +26% / +25% / +16%
//   a TDP, a wait of 0.1 ms, then the 64,000 chain (54 us): +8.7 us (as with no wait)
//   a TDP, a wait of 0.3 / 1 / 3 / 10 / 30 / 100 ms, then the chain: +2.0 to +3.3 us
// So a tile product slows the scalar code after it by about a fifth (from a sixth to two fifths
// over these lengths) for between 0.1 and 0.3 ms, and after any longer idle a product still adds
// 2-3 us to what follows it. A drop of the core's clock while the tile unit is in use (an AMX
// power licence) fits both; this VM exposes no performance counters, so the clock itself is not
// read. The AMX kernels' vector steps (softmax, packing, gradient steps) therefore run at about
// four fifths of the speed of the same steps in the vector kernels, and a kernel that uses the
// tiles for a small part of its work (the int8 decodes tried in this session) pays that on all of
// it.
#include <cstdio>

#include "amx_bench.hpp"

volatile uint64_t sinkI;

__attribute__((noinline)) void scalar(int n) {  // dependent imul chain: latency-bound, no vector unit
    uint64_t x = 3;
    for (int i = 0; i < n; ++i) { x = x * 0x9E3779B97F4A7C15ull + 1; __asm__ volatile("" : "+r"(x)); }
    sinkI = x;
}
__attribute__((noinline)) void waitNs(double ns) {  // spins on the clock (scalar code)
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() < ns) {}
}

int main() {
    if (!startTiles()) { std::printf("AMX not granted\n"); return 1; }
    const int n = 4000;
    for (int len : {250, 1000, 4000, 16000, 64000}) {
        const double a = medianNs(n / 8, [len] { scalar(len); });
        const double b = medianNs(n / 8, [len] { DP(0, 4, 6); scalar(len); });
        std::printf("chain of %5d multiplies right after a TDP: %.1f -> %.1f ns (%+.1f, %+.0f%%)\n", len, a, b, b - a,
                    100 * (b / a - 1));
    }
    for (double w : {1e5, 3e5, 1e6, 3e6, 1e7, 3e7, 1e8}) {
        const int reps = w >= 1e7 ? 3 : 30;
        const double a = medianNs(reps, [w] { waitNs(w); scalar(64000); });
        const double b = medianNs(reps, [w] { DP(0, 4, 6); waitNs(w); scalar(64000); });
        std::printf("a TDP, a wait of %6.0f us, then a chain of 64000 (%.0f ns): %+.1f ns\n", w / 1e3, a - w, b - a);
    }
    _tile_release();
}

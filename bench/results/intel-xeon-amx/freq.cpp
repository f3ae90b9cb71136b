// Whether one TDPBF16PS slows the code after it: a dependent chain of scalar 64-bit multiplies (no
// vector unit, latency-bound, so only the clock sets its speed) timed with and without one
// TDPBF16PS before it, for chains of several lengths and after waits of 1-100 ms. Not part of the
// build (the record behind NOTES.md, fifth AMX session).
//   g++ -O2 -std=c++20 -mamx-tile -mamx-bf16 freq.cpp -o freq && ./freq
// Intel Xeon with AMX (family 6 model 167 as its KVM guest reported it), 2026-12-07, one thread:
//   chain of 250 / 1,000 / 4,000 / 16,000 / 64,000 multiplies right after a TDP:
//     +14% / +42% / +30% / +24% / +17% (+23 ns ... +9.0 us)
//   a TDP, then a wait of 1 / 3 / 10 / 30 / 100 ms, then the 64,000 chain (54 us): +3.1 / +2.8 /
//     +2.7 / +2.7 / +2.8 us
// A scalar chain slows down after a tile product: the clock drops while the tile unit is in use
// (an AMX power license), by about a fifth, for hundreds of microseconds; after a long idle the
// first product costs about 2.7 us more. The AMX kernels' vector steps (softmax, packing, gradient
// steps) therefore run at about four fifths of the clock of the same steps in the vector kernels,
// and a kernel that uses the tiles for a small part of its work (the int8 decode tried in this
// session) pays the lower clock on all of it.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <x86intrin.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>
struct alignas(64) Cfg { uint8_t palette = 1, start = 0; uint8_t r[14] = {}; uint16_t colsb[16] = {}; uint8_t rows[16] = {}; };
#define DP(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::: "memory")
Cfg cfg;
volatile uint64_t sinkI;
__attribute__((noinline)) void scalar(int n) {  // dependent imul chain: latency-bound, no vector unit
    uint64_t x = 3;
    for (int i = 0; i < n; ++i) { x = x * 0x9E3779B97F4A7C15ull + 1; __asm__ volatile("" : "+r"(x)); }
    sinkI = x;
}
__attribute__((noinline)) void waitNs(double ns) {
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() < ns) {}
}
template <class F>
double time(int reps, F f) {
    std::vector<double> ts;
    for (int r = 0; r < 9; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < reps; ++i) f();
        ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ts.begin(), ts.end());
    return ts[4] * 1e9 / reps;
}
int main() {
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) { std::printf("AMX not granted\n"); return 1; }
    for (int i = 0; i < 8; ++i) { cfg.colsb[i] = 64; cfg.rows[i] = 16; }
    _tile_loadconfig(&cfg);
    const int n = 4000;
    const double plain = time(n, [] { scalar(4000); });
    const double tdp = time(n, [] { DP(0, 4, 6); scalar(4000); });
    std::printf("scalar imul chain (4000): %.1f ns; after one TDP: %.1f ns (%.0f%% slower)\n", plain, tdp, 100 * (tdp / plain - 1));
    for (int len : {250, 1000, 4000, 16000, 64000}) {
        const double a = time(n / 8, [len] { scalar(len); });
        const double b = time(n / 8, [len] { DP(0, 4, 6); scalar(len); });
        std::printf("  chain of %d after a TDP: %.1f -> %.1f ns (%+.1f, %.0f%%)\n", len, a, b, b - a, 100 * (b / a - 1));
    }
    for (double w : {1e6, 3e6, 1e7, 3e7, 1e8}) {
        const int reps = w >= 1e7 ? 3 : 30; const double a = time(reps, [w] { waitNs(w); scalar(64000); });
        const double b = time(reps, [w] { DP(0, 4, 6); waitNs(w); scalar(64000); });
        std::printf("  TDP, wait %.0f us, then a chain of 64000 (%.0f ns): %+.1f ns\n", w / 1e3, a - w, b - a);
    }
    _tile_release();
}

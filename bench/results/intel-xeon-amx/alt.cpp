// Whether the cost a vector phase adds to the tile GEMMs after it is paid per GEMM or per
// alternation: a softmax-like AVX-512 pass (load, two FMAs, store) over 4, 16 or 32 KiB, then 1, 2
// or 4 strip GEMMs (64 TDPBF16PS each, the GEMM of tile_limits.cpp, whose operands take 56 KiB).
// Not part of the build (the record behind NOTES.md, fifth AMX session; amx_bench.hpp holds the
// strip GEMM and the timer).
//   g++ -O2 -std=c++20 -mamx-tile -mamx-bf16 alt.cpp -o alt && ./alt
// Intel(R) Xeon(R) Processor, GenuineIntel family 6 model 167 as its KVM guest reported it,
// 2026-12-07, one thread, ns per TDP of the GEMMs ((combined - vector pass alone) / TDPs); GEMM
// alone 8.9 (15:17 UTC) / 9.1 (16:42 UTC, after the move onto amx_bench.hpp):
//                     1 GEMM       2 GEMMs      4 GEMMs      added per alternation
//   pass over  4 KiB  10.8 / 11.2   10.0 / 10.4   9.4 / 9.8   about 120-140 ns
//   pass over 16 KiB  12.2 / 12.4   12.0 / 12.3  10.6 / 10.8  about 210-420 ns
//   pass over 32 KiB  19.3 / 19.4   14.4 / 14.8  11.8 / 12.1  about 670-760 ns
// Paid once per alternation (the same total for 1, 2 or 4 GEMMs after the pass), and growing with
// what the vector pass touches. Consistent with two causes that this program does not separate
// (this VM exposes no performance counters): the pass runs at the lower clock that tile products
// bring (freq.cpp), and it evicts the GEMM's 56 KiB of operands from the 48 KiB L1. More tile
// work per vector phase, or vector phases that touch less, is what would bring the kernels' 17 ns
// per TDP down.
#include <cstdio>

#include "amx_bench.hpp"

alignas(64) float X[8192];  // the vector pass's buffer (kb KiB of it)

// A softmax-like pass over n floats of X: load, two FMAs, store.
__attribute__((noinline, target("avx512f"))) void vec(int n, int passes) {
    for (int p = 0; p < passes; ++p)
        for (int i = 0; i < n; i += 16) {
            __m512 x = _mm512_load_ps(X + i);
            x = _mm512_fmadd_ps(x, _mm512_set1_ps(0.5f), _mm512_set1_ps(1.0f));
            x = _mm512_fmadd_ps(x, x, _mm512_set1_ps(0.25f));
            _mm512_store_ps(X + i, _mm512_mul_ps(x, _mm512_set1_ps(0.999f)));
        }
}

int main() {
    if (!startTiles()) { std::printf("AMX not granted\n"); return 1; }
    const int n = 20000;
    for (auto& x : stripA) x = 0x3f80;
    for (auto& x : stripB) x = 0x3f80;
    std::printf("gemm alone: %.2f ns/TDP\n", medianNs(n, [] { stripGemm(); }) / 64);
    for (int kb : {4, 16, 32})
        for (int gemms : {1, 2, 4}) {
            const int floats = kb * 256;
            const double v = medianNs(n, [&] { vec(floats, 2); });
            const double vg = medianNs(n, [&] { vec(floats, 2); for (int i = 0; i < gemms; ++i) stripGemm(); });
            std::printf("vector pass over %2d KiB (%.0f ns alone), then %d strip GEMM(s): %.2f ns/TDP\n", kb, v, gemms,
                        (vg - v) / (64.0 * gemms));
        }
    _tile_release();
}

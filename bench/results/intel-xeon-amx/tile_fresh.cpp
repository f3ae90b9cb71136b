// What happens to the tile products around vector work: the 2x2 GEMM of a forward strip (8 A
// tiles x 2 B tiles x 4 k chunks, 64 TDPBF16PS, C zeroed and stored, as in tile_limits.cpp) timed
// alone and after vector steps of the kinds the kernels run between their GEMMs: rewriting the A
// operand with vector stores (the softmax writing P), rewriting another buffer, reading C back with
// vector loads (the softmax reading S), and a register-only AVX-512 FMA chain of varying length.
// Each GEMM line is (the step then the GEMM - the step alone) / 64. Not part of the build (the
// record behind NOTES.md, fifth AMX session; amx_bench.hpp holds the strip GEMM and the timer).
//   g++ -O2 -std=c++20 -mamx-tile -mamx-bf16 tile_fresh.cpp -o tile_fresh && ./tile_fresh
// Intel(R) Xeon(R) Processor, GenuineIntel family 6 model 167 as its KVM guest reported it,
// 2026-12-07, one thread, the same with all-1.0 and random bf16 operands; ns per TDP, two runs
// (15:14 UTC / 16:40 UTC, the second on a busier VM, after this file was moved onto amx_bench.hpp):
//   gemm alone                                         8.9 / 9.6   (tile_limits.cpp: 8.7)
//   after A rewritten by vector stores                17.6 / 18.9
//   after another 32 KiB buffer rewritten             15.5 / 18.5
//   after A rewritten, then an mfence                 18.4 / 19.6
//   after A rewritten and read back (vector loads)    16.2 / 18.0-18.2
//   before C is read back by vector loads             10.6 / 10.6-10.8
//   between FMA chains of 25 / 50 / 100 / 400 / 1600 iterations (20 ns to 3.7 us alone):
//                                      9.3 / 10.1 / 11.9 / 15.9 / 24.7 ns per TDP (both runs)
//   a 3.7 us FMA chain: after one TDP 770-850 ns slower (21-23%), after one tile load no change
//   (within the -80..+30 ns between two plain runs)
// So the kernels' 17-20 ns per TDP is not the tile unit's own rate: the GEMM after a vector phase
// that touched 32 KiB runs at 15-19 ns per TDP whether or not that phase wrote its operands, and
// part of what the subtraction charges to the GEMM is the vector phase itself running slower after
// tile products (freq.cpp).
#include <cstdio>
#include <cstring>
#include <random>

#include "amx_bench.hpp"

alignas(64) uint16_t source[128 * 128];  // the values the vector steps write into A
alignas(64) uint16_t other[128 * 128];   // a buffer of A's size that the GEMM does not read
volatile float sink;

__attribute__((noinline, target("avx512f"))) void rewrite(uint16_t* to) {  // vector stores, A's values
    for (int i = 0; i < 128 * 128; i += 32) _mm512_store_si512(to + i, _mm512_load_si512(source + i));
}
__attribute__((noinline, target("avx512f"))) void readA() {
    __m512i s = _mm512_setzero_si512();
    for (int i = 0; i < 128 * 128; i += 32) s = _mm512_xor_si512(s, _mm512_load_si512(stripA + i));
    sink = float(_mm512_reduce_add_epi32(s));
}
__attribute__((noinline, target("avx512f"))) void readC() {  // vector loads of C
    __m512 s = _mm512_setzero_ps();
    for (int i = 0; i < 128 * 32; i += 16) s = _mm512_add_ps(s, _mm512_load_ps(stripC + i));
    sink = _mm512_reduce_add_ps(s);
}
__attribute__((noinline, target("avx512f"))) void busy(int n) {  // a register-only FMA chain
    __m512 x = _mm512_set1_ps(1.0001f), y = _mm512_set1_ps(0.9999f);
    for (int i = 0; i < n; ++i) { x = _mm512_fmadd_ps(x, y, y); y = _mm512_fmadd_ps(y, x, x); }
    sink = _mm512_reduce_add_ps(_mm512_add_ps(x, y));
}

// The GEMM's cost next to a vector step: (step then GEMM - step alone) per TDP.
template <class F>
void gemmAfter(const char* what, int reps, F step) {
    const double alone = medianNs(reps, step);
    const double both = medianNs(reps, [&] { step(); stripGemm(); });
    std::printf("gemm %-46s %6.2f ns per TDP (the step alone: %.0f ns)\n", what, (both - alone) / 64, alone);
}

int main() {
    if (!startTiles()) { std::printf("AMX not granted\n"); return 1; }
    const int n = 20000;
    for (int data = 0; data < 2; ++data) {
        std::mt19937 g(1);
        std::uniform_real_distribution<float> u(-1, 1);
        auto bf = [&] { float f = data ? u(g) : 1.0f; uint32_t b; std::memcpy(&b, &f, 4); return uint16_t(b >> 16); };
        for (auto& x : source) x = bf();
        for (auto& x : stripB) x = bf();
        std::memcpy(stripA, source, sizeof stripA);
        std::printf("== operands %s\n", data ? "random" : "all 1.0");
        std::printf("gemm %-46s %6.2f ns per TDP\n", "alone", medianNs(n, [] { stripGemm(); }) / 64);
        gemmAfter("after A rewritten by vector stores", n, [] { rewrite(stripA); });
        gemmAfter("after another buffer rewritten", n, [] { rewrite(other); });
        gemmAfter("after A rewritten, then an mfence", n, [] { rewrite(stripA); _mm_mfence(); });
        gemmAfter("after A rewritten and read back", n, [] { rewrite(stripA); readA(); });
        {  // C read back right after the GEMM
            const double alone = medianNs(n, [] { readC(); });
            const double both = medianNs(n, [] { stripGemm(); readC(); });
            std::printf("gemm %-46s %6.2f ns per TDP\n", "before C is read back by vector loads", (both - alone) / 64);
        }
        for (int w : {25, 50, 100, 200, 400, 1600}) {
            char what[64];
            std::snprintf(what, sizeof what, "between FMA chains of %d iterations", w);
            gemmAfter(what, n, [w] { busy(w); });
        }
        const double chain = medianNs(n / 4, [] { busy(1600); });
        const double afterTdp = medianNs(n / 4, [] { DP(0, 4, 6); busy(1600); });
        const double afterLoad = medianNs(n / 4, [] { LD(4, stripA, kStripAStride); busy(1600); });
        const double again = medianNs(n / 4, [] { busy(1600); });
        std::printf("a 1600-iteration FMA chain (%.0f ns): after one TDP %+.0f ns, after one tile load %+.0f ns, "
                    "measured again %+.0f ns\n", chain, afterTdp - chain, afterLoad - chain, again - chain);
    }
    _tile_release();
}

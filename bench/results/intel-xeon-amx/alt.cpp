// Whether the cost a vector phase adds to the tile GEMMs after it is paid per GEMM or per
// alternation: a softmax-like AVX-512 pass (load, two FMAs, store) over 4, 16 or 32 KiB, then 1, 2
// or 4 strip GEMMs (64 TDPBF16PS each, the GEMM of tile_limits.cpp, whose operands take 56 KiB).
// Not part of the build (the record behind NOTES.md, fifth AMX session).
//   g++ -O2 -std=c++20 -mamx-tile -mamx-bf16 alt.cpp -o alt && ./alt
// Intel Xeon with AMX (family 6 model 167 as its KVM guest reported it), 2026-12-07, one thread,
// ns per TDP of the GEMMs ((combined - vector pass alone) / TDPs); alone: 8.9
//                     1 GEMM   2 GEMMs   4 GEMMs    added per alternation
//   pass over  4 KiB   10.8      10.0      9.4        about 120 ns
//   pass over 16 KiB   12.2      12.0     10.6        about 210-420 ns
//   pass over 32 KiB   19.3      14.4     11.8        about 670-750 ns
// Paid once per alternation, and growing with what the vector pass touches: the pass runs at the
// tile unit's lower clock (freq.cpp) and evicts the GEMM's operands from the 48 KiB L1. More tile
// work per vector phase, or vector phases that touch less, is what would bring the kernels' 17 ns
// per TDP down.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>
struct alignas(64) Cfg { uint8_t palette = 1, start = 0; uint8_t r[14] = {}; uint16_t colsb[16] = {}; uint8_t rows[16] = {}; };
#define DP(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::: "memory")
#define LD(i, p, s) __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #i ::"r"(p), "r"((int64_t)(s)) : "memory")
#define ST(i, p, s) __asm__ volatile("tilestored %%tmm" #i ", (%0,%1,1)" ::"r"(p), "r"((int64_t)(s)) : "memory")
#define ZR(i) __asm__ volatile("tilezero %%tmm" #i ::: "memory")
alignas(64) uint16_t A[128 * 128];
alignas(64) uint16_t B[4 * 2 * 512];
alignas(64) float C[128 * 32];
alignas(64) float X[8192];  // the vector phase's buffer (kb KiB of it)
constexpr int64_t lda = 128, aS = lda * 2, bS = 64, cS = 32 * 4;
Cfg cfg;
volatile float sink;
__attribute__((noinline)) void gemm() {
    for (int mt = 0; mt < 8; mt += 2) {
        float* c0 = C + mt * 16 * 32;
        float* c1 = c0 + 16 * 32;
        ZR(0); ZR(1); ZR(2); ZR(3);
        for (int kc = 0; kc < 4; ++kc) {
            const uint16_t* a = A + mt * 16 * lda + kc * 32;
            const uint16_t* b = B + kc * 1024;
            LD(4, a, aS); LD(5, a + 16 * lda, aS); LD(6, b, bS); LD(7, b + 512, bS);
            DP(0, 4, 6); DP(1, 4, 7); DP(2, 5, 6); DP(3, 5, 7);
        }
        ST(0, c0, cS); ST(1, c0 + 16, cS); ST(2, c1, cS); ST(3, c1 + 16, cS);
    }
}
// A softmax-like pass over n floats of X: load, exp-ish polynomial, store.
__attribute__((noinline, target("avx512f"))) void vec(int n, int passes) {
    for (int p = 0; p < passes; ++p)
        for (int i = 0; i < n; i += 16) {
            __m512 x = _mm512_load_ps(X + i);
            x = _mm512_fmadd_ps(x, _mm512_set1_ps(0.5f), _mm512_set1_ps(1.0f));
            x = _mm512_fmadd_ps(x, x, _mm512_set1_ps(0.25f));
            _mm512_store_ps(X + i, _mm512_mul_ps(x, _mm512_set1_ps(0.999f)));
        }
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
    const int n = 20000;
    for (auto& x : A) x = 0x3f80;
    for (auto& x : B) x = 0x3f80;
    const double g = time(n, [] { gemm(); });
    std::printf("gemm alone: %.2f ns/TDP\n", g / 64);
    for (int kb : {4, 16, 32}) for (int gemms : {1, 2, 4}) {
        const int floats = kb * 256;
        const double v = time(n, [&] { vec(floats, 2); });
        const double vg = time(n, [&] { vec(floats, 2); for (int i = 0; i < gemms; ++i) gemm(); });
        std::printf("vector pass over %2d KiB (%.0f ns alone), then %d strip GEMM(s): %.2f ns/TDP\n", kb, v, gemms,
                    (vg - v) / (64.0 * gemms));
    }
    _tile_release();
}

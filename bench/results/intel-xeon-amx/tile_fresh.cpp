// What happens to the tile products around vector work: the 2x2 GEMM of a forward strip (8 A
// tiles x 2 B tiles x 4 k chunks, 64 TDPBF16PS, C zeroed and stored, as in tile_limits.cpp) timed
// alone and after vector steps of the kinds the kernels run between their GEMMs: rewriting the A
// operand with vector stores (the softmax writing P), rewriting another buffer, reading C back with
// vector loads (the softmax reading S), and a register-only AVX-512 FMA chain of varying length.
// Each "->" line is (combined - the vector step alone) / 64. Not part of the build (the record
// behind NOTES.md, fifth AMX session).
//   g++ -O2 -std=c++20 -mamx-tile -mamx-bf16 tile_fresh.cpp -o tile_fresh && ./tile_fresh
// Intel Xeon with AMX (family 6 model 167 as its KVM guest reported it), 2026-12-07, one thread
// (the same with all-1.0 and random bf16 operands):
//   gemm alone                                      8.9 ns/TDP (tile_limits.cpp: 8.7)
//   after A rewritten by vector stores             17.5 ns/TDP
//   after another 32 KiB buffer rewritten          15.5 ns/TDP
//   after A rewritten, with an mfence              18.4 ns/TDP
//   after A rewritten and read back (vector)       16.2 ns/TDP
//   before C is read back by vector loads          10.6 ns/TDP
//   between FMA chains of 25 / 50 / 100 / 400 / 1600 iterations (about 60 ns to 3.7 us):
//                                                  9.3 / 10.1 / 11.9 / 15.9 / 24.7 ns/TDP
//   a 3.7 us FMA chain after one TDP: 790-850 ns slower (21-23%); after one tile load: no change
// So the "17 ns per TDP" of the kernels is not the tile unit's: the GEMM after a vector phase that
// touched 32 KiB runs at about 17 ns per TDP however fresh its own operands are, and part of what
// the subtraction charges to the GEMM is the vector phase itself running slower near tile products
// (freq.cpp: the core's clock drops while the tile unit is in use).
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
struct alignas(64) Cfg { uint8_t palette = 1, start = 0; uint8_t r[14] = {}; uint16_t colsb[16] = {}; uint8_t rows[16] = {}; };
#define DP(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::: "memory")
#define LD(i, p, s) __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #i ::"r"(p), "r"((int64_t)(s)) : "memory")
#define ST(i, p, s) __asm__ volatile("tilestored %%tmm" #i ", (%0,%1,1)" ::"r"(p), "r"((int64_t)(s)) : "memory")
#define ZR(i) __asm__ volatile("tilezero %%tmm" #i ::: "memory")
alignas(64) uint16_t A[128 * 128];
alignas(64) uint16_t Asrc[128 * 128];
alignas(64) uint16_t A2[128 * 128];
alignas(64) uint16_t B[4 * 2 * 512];
alignas(64) float C[128 * 32];
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
__attribute__((noinline, target("avx512f"))) void rewriteA() {  // vector stores of A (same values)
    for (int i = 0; i < 128 * 128; i += 32) _mm512_store_si512(A + i, _mm512_load_si512(Asrc + i));
}
__attribute__((noinline, target("avx512f"))) void rewriteA2() {  // vector stores of another buffer
    for (int i = 0; i < 128 * 128; i += 32) _mm512_store_si512(A2 + i, _mm512_load_si512(Asrc + i));
}
__attribute__((noinline, target("avx512f"))) void rewriteA2nt() {  // non-temporal? no: plain stores of A then sfence
    for (int i = 0; i < 128 * 128; i += 32) _mm512_store_si512(A + i, _mm512_load_si512(Asrc + i));
    _mm_mfence();
}
__attribute__((noinline, target("avx512f"))) void readA() {
    __m512i s = _mm512_setzero_si512();
    for (int i = 0; i < 128 * 128; i += 32) s = _mm512_xor_si512(s, _mm512_load_si512(A + i));
    sink = float(_mm512_reduce_add_epi32(s));
}
__attribute__((noinline, target("avx512f"))) void readC() {  // vector loads of C
    __m512 s = _mm512_setzero_ps();
    for (int i = 0; i < 128 * 32; i += 16) s = _mm512_add_ps(s, _mm512_load_ps(C + i));
    sink = _mm512_reduce_add_ps(s);
}
__attribute__((noinline, target("avx512f"))) void busy(int n) {  // vector work, no memory
    __m512 x = _mm512_set1_ps(1.0001f), y = _mm512_set1_ps(0.9999f);
    for (int i = 0; i < n; ++i) { x = _mm512_fmadd_ps(x, y, y); y = _mm512_fmadd_ps(y, x, x); }
    sink = _mm512_reduce_add_ps(_mm512_add_ps(x, y));
}
template <class F>
double time(const char* name, int reps, F f) {
    std::vector<double> ts;
    for (int r = 0; r < 9; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < reps; ++i) f();
        ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ts.begin(), ts.end());
    const double ns = ts[4] * 1e9 / reps;
    std::printf("%-52s %8.1f ns per strip (%5.2f ns per TDP)\n", name, ns, ns / 64);
    return ns;
}
int main(int argc, char** argv) {
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) { std::printf("AMX not granted\n"); return 1; }
    for (int i = 0; i < 8; ++i) { cfg.colsb[i] = 64; cfg.rows[i] = 16; }
    _tile_loadconfig(&cfg);
    const int n = 20000;
    for (int data = 0; data < 2; ++data) {
        std::mt19937 g(1);
        std::uniform_real_distribution<float> u(-1, 1);
        auto bf = [&] { float f = data ? u(g) : 1.0f; uint32_t b; std::memcpy(&b, &f, 4); return uint16_t(b >> 16); };
        for (auto& x : Asrc) x = bf();
        for (auto& x : B) x = bf();
        std::memcpy(A, Asrc, sizeof A);
        std::printf("== operands %s\n", data ? "random" : "all 1.0");
        time("gemm", n, [] { gemm(); });
        const double rw = time("rewriteA", n, [] { rewriteA(); });
        const double rwg = time("rewriteA + gemm", n, [] { rewriteA(); gemm(); });
        std::printf("   -> gemm after fresh A: %.2f ns per TDP\n", (rwg - rw) / 64);
        const double rc = time("readC", n, [] { readC(); });
        const double grc = time("gemm + readC", n, [] { gemm(); readC(); });
        std::printf("   -> gemm + C read at once: %.2f ns per TDP\n", (grc - rc) / 64);
        {
            const double r2 = time("rewrite other buffer", n, [] { rewriteA2(); });
            const double r2g = time("rewrite other buffer + gemm", n, [] { rewriteA2(); gemm(); });
            std::printf("   -> gemm while another buffer is written: %.2f ns per TDP\n", (r2g - r2) / 64);
            const double mf = time("rewriteA + mfence", n, [] { rewriteA2nt(); });
            const double mfg = time("rewriteA + mfence + gemm", n, [] { rewriteA2nt(); gemm(); });
            std::printf("   -> gemm after fresh A + mfence: %.2f ns per TDP\n", (mfg - mf) / 64);
            const double ra = time("rewriteA + readA", n, [] { rewriteA(); readA(); });
            const double rag = time("rewriteA + readA + gemm", n, [] { rewriteA(); readA(); gemm(); });
            std::printf("   -> gemm after fresh A read back by vector loads: %.2f ns per TDP\n", (rag - ra) / 64);
            {
                const double b = time("busy(1600)", n / 4, [] { busy(1600); });
                const double b1 = time("one TDP + busy(1600)", n / 4, [] { DP(0, 4, 6); busy(1600); });
                const double b2 = time("one tile load + busy(1600)", n / 4, [] { LD(4, A, aS); busy(1600); });
                const double b3 = time("one zmm FMA-heavy burst + busy(1600)", n / 4, [] { busy(1600); });
                std::printf("   -> TDP before busy: +%.1f ns; tile load: +%.1f ns; (noise: %.1f)\n", b1 - b, b2 - b, b3 - b);
            }
            for (int w : {25, 50, 100, 400, 1600}) {
                const double b = time("busy", n, [w] { busy(w); });
                const double gb = time("gemm + busy", n, [w] { gemm(); busy(w); });
                std::printf("   -> busy(%d): gemm %.2f ns per TDP\n", w, (gb - b) / 64);
            }
        }
        const double b = time("busy(200)", n, [] { busy(200); });
        const double gb = time("gemm + busy(200)", n, [] { gemm(); busy(200); });
        std::printf("   -> gemm between vector work: %.2f ns per TDP\n", (gb - b) / 64);
    }
    _tile_release();
}

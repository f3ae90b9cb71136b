// What the tile unit does with its operands in memory: the 2x2 GEMM of a forward strip (8 A tiles
// x 2 B tiles x 4 k chunks, 64 TDPBF16PS) with its operands in registers, in L1 and in L2, with
// its C tiles zeroed and stored (S^T = K.Q^T) or loaded and stored (O^T += V^T.P^T); the cost of
// one tile load, one tile store and one LDTILECFG + TILERELEASE. Not part of the build (the record
// behind NOTES.md, third AMX session).
//   g++ -O2 -std=c++20 -mamx-tile -mamx-bf16 -mavx512f tile_limits.cpp -o tile_limits && ./tile_limits
// Intel Xeon with AMX (family 6 model 167 as its KVM guest reported it), 2026-12-07, one thread:
//   register resident                      5.26 ns/TDP   (16 cycles: the peak)
//   A, B from L1, no C io                  6.53 ns/TDP
//   A from L1, C zeroed and stored         8.73 ns/TDP   (S^T)
//   A from L1, C loaded and stored         9.65 ns/TDP   (O^T)
//   A from L2, C zeroed and stored        10.37 ns/TDP
//     + prefetcht0 of the next step's A   11.02 ns/TDP
//   A from L2, C loaded and stored        10.31 ns/TDP
//     + prefetcht0 of the next step's A   11.34 ns/TDP
//   one tileloadd (16 x 64 B, L1)          2.5-2.8 ns
//   one tilestored                         4.8 ns
//   LDTILECFG + 1 TDP + TILERELEASE       63.8 ns (1 TDP alone: 5.3 ns)
// Tile loads and stores mostly serialise with the TDPs: the strip GEMMs cannot beat 55-60% of
// the peak with operands in L1, 50% from L2, and software prefetch only adds load-port work.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>
struct alignas(64) Cfg { uint8_t palette = 1, start = 0; uint8_t r[14] = {}; uint16_t colsb[16] = {}; uint8_t rows[16] = {}; };
#define DP(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::: "memory")
#define LD(i, p, s) __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #i ::"r"(p), "r"((int64_t)(s)) : "memory")
#define ST(i, p, s) __asm__ volatile("tilestored %%tmm" #i ", (%0,%1,1)" ::"r"(p), "r"((int64_t)(s)) : "memory")
#define ZR(i) __asm__ volatile("tilezero %%tmm" #i ::: "memory")
constexpr int kBlocks = 32;  // A blocks of 32 KiB: 1 MiB, in L2
alignas(64) uint16_t A[kBlocks][128 * 128];
alignas(64) uint16_t B[4 * 2 * 512];
alignas(64) float C[128 * 32];
constexpr int64_t lda = 128, aS = lda * 2, bS = 64, cS = 32 * 4;
Cfg cfg;
// kAFrom: 0 registers only, 1 one A block (L1), 2 a new A block each rep (L2). kCio: 0 none,
// 1 zero/store, 2 load/store. kPrefetch: prefetcht0 of the next k step's A rows.
template <int kAFrom, int kCio, bool kPrefetch>
__attribute__((noinline)) void strip(int reps) {
    for (int r = 0; r < reps; ++r) {
        const uint16_t* Ab = A[kAFrom == 2 ? r % kBlocks : 0];
        for (int mt = 0; mt < 8; mt += 2) {
            float* c0 = C + mt * 16 * 32;
            float* c1 = c0 + 16 * 32;
            if (kCio == 2) { LD(0, c0, cS); LD(1, c0 + 16, cS); LD(2, c1, cS); LD(3, c1 + 16, cS); }
            if (kCio == 1) { ZR(0); ZR(1); ZR(2); ZR(3); }
            for (int kc = 0; kc < 4; ++kc) {
                const uint16_t* a = Ab + mt * 16 * lda + kc * 32;
                const uint16_t* b = B + kc * 1024;
                if (kPrefetch) {
                    const uint16_t* n = kc < 3 ? a + 32 : Ab + ((mt + 2) % 8) * 16 * lda;
                    for (int i = 0; i < 32; ++i) _mm_prefetch((const char*)(n + i * lda), _MM_HINT_T0);
                }
                if (kAFrom > 0) { LD(4, a, aS); LD(5, a + 16 * lda, aS); LD(6, b, bS); LD(7, b + 512, bS); }
                DP(0, 4, 6); DP(1, 4, 7); DP(2, 5, 6); DP(3, 5, 7);
            }
            if (kCio > 0) { ST(0, c0, cS); ST(1, c0 + 16, cS); ST(2, c1, cS); ST(3, c1 + 16, cS); }
        }
    }
}
__attribute__((noinline)) void loads(int reps) { for (int r = 0; r < reps; ++r) for (int i = 0; i < 8; i += 4) { LD(0, C + i * 512, 64); LD(1, C + i * 512 + 512, 64); LD(2, C + i * 512 + 1024, 64); LD(3, C + i * 512 + 1536, 64); } }
__attribute__((noinline)) void stores(int reps) { for (int r = 0; r < reps; ++r) for (int i = 0; i < 8; i += 4) { ST(0, C + i * 512, 64); ST(1, C + i * 512 + 512, 64); ST(2, C + i * 512 + 1024, 64); ST(3, C + i * 512 + 1536, 64); } }
__attribute__((noinline)) void configs(int reps) { for (int r = 0; r < reps; ++r) { _tile_loadconfig(&cfg); DP(0, 4, 6); _tile_release(); } }
template <class F>
void time(const char* name, double per, F f) {
    std::vector<double> ts;
    for (int r = 0; r < 9; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        f();
        ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ts.begin(), ts.end());
    std::printf("%-40s %6.2f ns\n", name, ts[4] * 1e9 / per);
}
int main() {
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) { std::printf("AMX not granted\n"); return 1; }
    for (int i = 0; i < 8; ++i) { cfg.colsb[i] = 64; cfg.rows[i] = 16; }
    _tile_loadconfig(&cfg);
    for (auto& blk : A) for (auto& x : blk) x = 0x3f80;
    for (auto& x : B) x = 0x3f80;
    const int n = 20000;
    const double tdps = n * 64.0;
    time("register resident (per TDP)", tdps, [] { strip<0, 0, false>(n); });
    time("A, B from L1, no C io (per TDP)", tdps, [] { strip<1, 0, false>(n); });
    time("A from L1, C zeroed/stored (per TDP)", tdps, [] { strip<1, 1, false>(n); });
    time("A from L1, C loaded/stored (per TDP)", tdps, [] { strip<1, 2, false>(n); });
    time("A from L2, C zeroed/stored (per TDP)", tdps, [] { strip<2, 1, false>(n); });
    time("  + prefetch (per TDP)", tdps, [] { strip<2, 1, true>(n); });
    time("A from L2, C loaded/stored (per TDP)", tdps, [] { strip<2, 2, false>(n); });
    time("  + prefetch (per TDP)", tdps, [] { strip<2, 2, true>(n); });
    time("tileloadd", n * 8.0, [] { loads(n); });
    time("tilestored", n * 8.0, [] { stores(n); });
    _tile_release();
    time("ldtilecfg + tdp + tilerelease", n, [] { configs(n); });
}

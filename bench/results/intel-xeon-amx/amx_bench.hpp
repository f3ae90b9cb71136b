// Shared by this session's standalone tile-unit programs (tile_fresh.cpp, alt.cpp, freq.cpp; each
// builds alone, see its header): the tile instructions as macros, the tile state request and
// configuration, the strip GEMM of the AMX forward (as in tile_limits.cpp: 8 A tiles x 2 B tiles x
// 4 k chunks, 64 TDPBF16PS, C zeroed and stored) on buffers of its own, and a median timer.
#pragma once

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#define DP(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::: "memory")
#define LD(i, p, s) __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #i ::"r"(p), "r"((int64_t)(s)) : "memory")
#define ST(i, p, s) __asm__ volatile("tilestored %%tmm" #i ", (%0,%1,1)" ::"r"(p), "r"((int64_t)(s)) : "memory")
#define ZR(i) __asm__ volatile("tilezero %%tmm" #i ::: "memory")

struct alignas(64) TileCfg {
    uint8_t palette = 1, start = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};
inline TileCfg tileCfg;

// Asks Linux for the tile state and configures 8 tiles of 16 rows x 64 bytes; false if refused.
inline bool startTiles() {
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) return false;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    for (int i = 0; i < 8; ++i) {
        tileCfg.colsb[i] = 64;
        tileCfg.rows[i] = 16;
    }
    _tile_loadconfig(&tileCfg);
    return true;
}

// The strip GEMM's operands: A 128 x 128 bf16 (32 KiB), B 4 k chunks x 2 tiles, C 128 x 32 fp32.
alignas(64) inline uint16_t stripA[128 * 128];
alignas(64) inline uint16_t stripB[4 * 2 * 512];
alignas(64) inline float stripC[128 * 32];
constexpr int64_t kStripLda = 128, kStripAStride = kStripLda * 2, kStripBStride = 64, kStripCStride = 32 * 4;

// C = A . B by tiles, 2 x 2 C tiles at a time: 64 TDPBF16PS, 64 + 64 tile loads, 16 tile stores.
__attribute__((noinline)) inline void stripGemm() {
    for (int mt = 0; mt < 8; mt += 2) {
        float* c0 = stripC + mt * 16 * 32;
        float* c1 = c0 + 16 * 32;
        ZR(0); ZR(1); ZR(2); ZR(3);
        for (int kc = 0; kc < 4; ++kc) {
            const uint16_t* a = stripA + mt * 16 * kStripLda + kc * 32;
            const uint16_t* b = stripB + kc * 1024;
            LD(4, a, kStripAStride); LD(5, a + 16 * kStripLda, kStripAStride);
            LD(6, b, kStripBStride); LD(7, b + 512, kStripBStride);
            DP(0, 4, 6); DP(1, 4, 7); DP(2, 5, 6); DP(3, 5, 7);
        }
        ST(0, c0, kStripCStride); ST(1, c0 + 16, kStripCStride); ST(2, c1, kStripCStride); ST(3, c1 + 16, kStripCStride);
    }
}

// The median over 9 runs of `reps` calls of f, in ns per call.
template <class F>
double medianNs(int reps, F f) {
    std::vector<double> ts;
    for (int r = 0; r < 9; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < reps; ++i) f();
        ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ts.begin(), ts.end());
    return ts[4] * 1e9 / reps;
}

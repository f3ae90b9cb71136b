// The AMX tile interface the AMX kernels are written against once, with two backends:
// HwTiles (hw_tiles.hpp: the instructions, only on CPUs where cpu::isa().amxGranted) and
// EmuTiles (emu_tiles.hpp: a software model that runs anywhere, enforces palette 1's shape
// rules and follows the SDM arithmetic of TDPBF16PS/TDPFP16PS). A backend offers
//   configure(const TileConfig&)   ldtilecfg      release()                      tilerelease
//   zero(tmm<i>)                   tilezero       load(tmm<i>, base, strideBytes) tileloadd
//   store(tmm<i>, base, stride)    tilestored     dot<kind>(tmm<c>, tmm<a>, tmm<b>) tdpbf16ps / tdpfp16ps
// Tile names are types (tmm<i>) because the instructions encode them as immediates.
#pragma once

#include <cstdint>

namespace attnops::cpu::amx {

constexpr int kTileNames = 8;   // palette 1: tmm0-tmm7
constexpr int kMaxRows = 16;    // rows per tile
constexpr int kRowBytes = 64;   // bytes per tile row (also TMUL maxN)
constexpr int kMaxK = 16;       // TMUL maxK: dwords per A row, rows of B

// The whole-tile operand shapes of the kernels: A is 16 rows x 32 16-bit elements, B is 16 rows
// of 16 element pairs (VNNI layout), C is 16 x 16 fp32.
constexpr int64_t kTileM = 16;
constexpr int64_t kTileN = 16;
constexpr int64_t kTileK = 32;
constexpr int64_t kTileElems = kTileM * kTileK;  // 16-bit elements in one A or B tile

// The 64-byte memory operand of LDTILECFG (palette 1 uses the first 8 colsb and rows entries;
// the others and the reserved bytes must be zero).
struct alignas(64) TileConfig {
    uint8_t palette = 0;
    uint8_t startRow = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads 64 bytes");

// Every tile 16 rows of 64 bytes: the only configuration the kernels use (they pad operands to
// whole tiles), so one ldtilecfg serves every GEMM.
constexpr TileConfig fullTiles() {
    TileConfig c;
    c.palette = 1;
    for (int t = 0; t < kTileNames; ++t) {
        c.colsb[t] = kRowBytes;
        c.rows[t] = kMaxRows;
    }
    return c;
}

template <int I>
struct Tmm {
    static_assert(I >= 0 && I < kTileNames, "palette 1 has tmm0-tmm7");
    static constexpr int index = I;
};
template <int I>
inline constexpr Tmm<I> tmm{};

// Element kind of the A and B tiles of a dot product: TDPBF16PS or TDPFP16PS (AMX-FP16).
enum class DotKind { Bf16, Fp16 };

}  // namespace attnops::cpu::amx

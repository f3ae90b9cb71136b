// The AMX software model (see emu_tiles.hpp for the rules and the arithmetic it follows).
#include "cpu/amx/emu_tiles.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/dtype.hpp"
#include "cpu/isa.hpp"

namespace attnops::cpu::amx {
namespace {

[[noreturn]] void fault(const char* instruction, const char* rule, int value) {
    std::fprintf(stderr, "attnops AMX emulator: %s violates the AMX rules: %s (%d)\n", instruction, rule, value);
    std::abort();
}

// DAZ on an operand, FTZ on a result: a denormal becomes a zero of the same sign.
inline float flushDenormal(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }

inline uint16_t element(const uint8_t* row, int i) {
    uint16_t e;
    std::memcpy(&e, row + 2 * i, sizeof e);
    return e;
}

template <DotKind kind>
inline float widen(uint16_t e) {
    return kind == DotKind::Bf16 ? flushDenormal(bf16ToFloat(e)) : f16ToFloat(e);
}

// One TDP on resolved tile rows; `fma` is std::fma compiled for the FMA unit when the CPU has one
// (both round once, so the bits are the same).
template <DotKind kind>
inline __attribute__((always_inline)) void dotRows(int rows, int pairs, int cols, const uint8_t (*a)[kRowBytes],
                                                   const uint8_t (*b)[kRowBytes], uint8_t (*c)[kRowBytes]) {
    for (int m = 0; m < rows; ++m) {
        float even[kMaxK] = {}, odd[kMaxK] = {};
        for (int k = 0; k < pairs; ++k) {
            const float a0 = widen<kind>(element(a[m], 2 * k)), a1 = widen<kind>(element(a[m], 2 * k + 1));
            for (int n = 0; n < cols; ++n) {
                even[n] = flushDenormal(std::fma(a0, widen<kind>(element(b[k], 2 * n)), even[n]));
                odd[n] = flushDenormal(std::fma(a1, widen<kind>(element(b[k], 2 * n + 1)), odd[n]));
            }
        }
        for (int n = 0; n < cols; ++n) {
            float acc;
            std::memcpy(&acc, c[m] + 4 * n, sizeof acc);
            acc = flushDenormal(flushDenormal(acc) + flushDenormal(even[n] + odd[n]));
            std::memcpy(c[m] + 4 * n, &acc, sizeof acc);
        }
        std::memset(c[m] + 4 * cols, 0, size_t(kRowBytes - 4 * cols));
    }
}

template <DotKind kind>
__attribute__((target("fma"))) void dotRowsFma(int rows, int pairs, int cols, const uint8_t (*a)[kRowBytes],
                                               const uint8_t (*b)[kRowBytes], uint8_t (*c)[kRowBytes]) {
    dotRows<kind>(rows, pairs, cols, a, b, c);
}

template <DotKind kind>
void dotRowsPortable(int rows, int pairs, int cols, const uint8_t (*a)[kRowBytes], const uint8_t (*b)[kRowBytes],
                     uint8_t (*c)[kRowBytes]) {
    dotRows<kind>(rows, pairs, cols, a, b, c);
}

}  // namespace

void EmuTiles::configure(const TileConfig& cfg) {
    if (cfg.palette != 1) fault("ldtilecfg", "only palette 1 is modelled", cfg.palette);
    if (cfg.startRow != 0) fault("ldtilecfg", "start_row restarts are not modelled", cfg.startRow);
    for (int i = 0; i < 14; ++i)
        if (cfg.reserved[i] != 0) fault("ldtilecfg", "reserved byte set", i);
    for (int t = 0; t < 16; ++t) {
        const bool named = t < kTileNames;
        if (!named && (cfg.colsb[t] != 0 || cfg.rows[t] != 0)) fault("ldtilecfg", "palette 1 has 8 tiles; tile", t);
        if (cfg.rows[t] > kMaxRows) fault("ldtilecfg", "more than 16 rows in tile", t);
        if (cfg.colsb[t] > kRowBytes) fault("ldtilecfg", "more than 64 bytes per row in tile", t);
        if ((cfg.rows[t] == 0) != (cfg.colsb[t] == 0)) fault("ldtilecfg", "rows and colsb not both zero in tile", t);
    }
    cfg_ = cfg;
    configured_ = true;
    std::memset(data_, 0, sizeof data_);  // ldtilecfg zeroes the tile data
}

void EmuTiles::requireUsable(int t, const char* instruction) const {
    if (!configured_) fault(instruction, "tiles not configured (no ldtilecfg, or after tilerelease); tile", t);
    if (cfg_.rows[t] == 0) fault(instruction, "tile not configured", t);
    if (cfg_.colsb[t] % 4 != 0) fault(instruction, "colsb not a multiple of 4 in tile", t);
}

void EmuTiles::zeroTile(int t) {
    requireUsable(t, "tilezero");
    std::memset(data_[t], 0, sizeof data_[t]);
}

void EmuTiles::loadTile(int t, const void* base, int64_t strideBytes) {
    requireUsable(t, "tileloadd");
    ++loads_;
    std::memset(data_[t], 0, sizeof data_[t]);  // bytes past colsb and rows past `rows` read as zero
    for (int r = 0; r < cfg_.rows[t]; ++r)
        std::memcpy(data_[t][r], static_cast<const uint8_t*>(base) + r * strideBytes, cfg_.colsb[t]);
}

void EmuTiles::storeTile(int t, void* base, int64_t strideBytes) const {
    requireUsable(t, "tilestored");
    for (int r = 0; r < cfg_.rows[t]; ++r)
        std::memcpy(static_cast<uint8_t*>(base) + r * strideBytes, data_[t][r], cfg_.colsb[t]);
}

void EmuTiles::dotTiles(DotKind kind, int c, int a, int b) {
    const char* name = kind == DotKind::Bf16 ? "tdpbf16ps" : "tdpfp16ps";
    if (c == a || c == b || a == b) fault(name, "source and destination tiles must be distinct; tile", c);
    requireUsable(c, name);
    requireUsable(a, name);
    requireUsable(b, name);
    const int m = cfg_.rows[c], n = cfg_.colsb[c] / 4, k = cfg_.colsb[a] / 4;
    if (cfg_.rows[a] != m) fault(name, "A rows differ from C rows", cfg_.rows[a]);
    if (cfg_.rows[b] != k) fault(name, "B rows differ from A colsb / 4", cfg_.rows[b]);
    if (cfg_.colsb[b] != cfg_.colsb[c]) fault(name, "B colsb differs from C colsb", cfg_.colsb[b]);
    if (k > kMaxK) fault(name, "K above TMUL maxK", k);
    ++dots_;
    const bool fma = isa().fma;
    if (kind == DotKind::Bf16)
        (fma ? dotRowsFma<DotKind::Bf16> : dotRowsPortable<DotKind::Bf16>)(m, k, n, data_[a], data_[b], data_[c]);
    else
        (fma ? dotRowsFma<DotKind::Fp16> : dotRowsPortable<DotKind::Fp16>)(m, k, n, data_[a], data_[b], data_[c]);
    for (int r = m; r < kMaxRows; ++r) std::memset(data_[c][r], 0, kRowBytes);  // rows past M are zeroed
}

}  // namespace attnops::cpu::amx

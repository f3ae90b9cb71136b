// EmuTiles: the software model of AMX palette 1 behind the tile interface of tiles.hpp. Plain
// C++ (no intrinsics), so the AMX kernels and their tests run on any machine.
//
// Shape and state rules that make the hardware raise #UD or #GP (an invalid config, a tile used
// before configuration, a dot product whose tiles are not distinct or whose M/K/N do not agree)
// are kernel bugs here: the model prints the rule and aborts, so tests fail loudly instead of the
// bug waiting for real hardware.
//
// Arithmetic (Intel SDM, TDPBF16PS and TDPFP16PS): for each row m of C, fresh fp32 partial sums
// of the even and of the odd element of every pair, each updated by one fused multiply-add per k
// ascending; then C[m][n] += (even[n] + odd[n]). Every operation rounds to nearest even, treats
// fp32 denormal operands as zero (bf16 inputs widen to fp32 first, so a denormal bf16 is zero;
// fp16 inputs widen exactly, so fp16 denormals keep their value) and flushes denormal results to
// zero; MXCSR is neither read nor written. Unverified against silicon here (no AMX on the
// development machines): tininess is tested after rounding, and NaN payloads are those of fmaf.
#pragma once

#include <cstdint>

#include "cpu/amx/tiles.hpp"

namespace attnops::cpu::amx {

class EmuTiles {
public:
    void configure(const TileConfig& cfg);
    void release() { configured_ = false; }

    template <int I>
    void zero(Tmm<I>) {
        zeroTile(I);
    }
    template <int I>
    void load(Tmm<I>, const void* base, int64_t strideBytes) {
        loadTile(I, base, strideBytes);
    }
    template <int I>
    void store(Tmm<I>, void* base, int64_t strideBytes) const {
        storeTile(I, base, strideBytes);
    }
    template <DotKind kind, int C, int A, int B>
    void dot(Tmm<C>, Tmm<A>, Tmm<B>) {
        dotTiles(kind, C, A, B);
    }

    // Instructions executed since construction (tile loads, dot products): a tiling regression
    // shows up as a count, without hardware.
    uint64_t loads() const { return loads_; }
    uint64_t dots() const { return dots_; }

private:
    void zeroTile(int t);
    void loadTile(int t, const void* base, int64_t strideBytes);
    void storeTile(int t, void* base, int64_t strideBytes) const;
    void dotTiles(DotKind kind, int c, int a, int b);
    void requireUsable(int t, const char* instruction) const;

    TileConfig cfg_{};
    bool configured_ = false;
    uint64_t loads_ = 0, dots_ = 0;
    alignas(64) uint8_t data_[kTileNames][kMaxRows][kRowBytes] = {};
};

}  // namespace attnops::cpu::amx

// Helpers shared by the AMX kernels (fa_amx_kernel.hpp and fa_amx_forward.hpp): tile counts,
// the finiteness test of packed operands, scratch carving, padded head dims. Like them, it takes
// its attributes from ATTNOPS_AMX_FN, defined by the including file, and has internal linkage.
#pragma once

#ifndef ATTNOPS_AMX_FN
#error "define ATTNOPS_AMX_FN (the attributes of the backend's build) before including fa_amx_common.hpp"
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu/amx/pack.hpp"
#include "cpu/amx/tile_gemm.hpp"
#include "cpu/amx/tiles.hpp"
#include "ops/flash_attention_score/kernel.hpp"

namespace attnops::fa {
namespace {

using cpu::amx::DotKind;
using cpu::amx::gemm;
using cpu::amx::gemmOn;
using cpu::amx::kTileElems;
using cpu::amx::kTileK;
using cpu::amx::kTileM;
using cpu::amx::kTileN;
using cpu::amx::roundUp;


int64_t tilesOf(int64_t n) { return (n + kTileN - 1) / kTileN; }
int64_t chunksOf(int64_t n) { return (n + kTileK - 1) / kTileK; }

// Whether n packed elements are all finite (exponent bits not all ones), 32 at a time.
template <DotKind kind>
ATTNOPS_AMX_FN bool allFinite(const uint16_t* x, int64_t n) {
    constexpr uint16_t kExponent = kind == DotKind::Bf16 ? 0x7F80 : 0x7C00;
    typedef uint16_t Halves __attribute__((vector_size(64)));
    Halves nonFinite{};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        Halves h;
        std::memcpy(&h, x + i, sizeof h);
        nonFinite |= (h & kExponent) == kExponent;
    }
    bool finite = true;
    for (int k = 0; k < 32; ++k) finite &= nonFinite[k] == 0;
    for (; i < n; ++i) finite &= (x[i] & kExponent) != kExponent;
    return finite;
}

// Bump allocation of a thread's scratch in 64-byte aligned pieces; with a null base it only
// counts the bytes (scratchBytes).
class Carver {
public:
    explicit Carver(void* base) : base_(static_cast<char*>(base)) {}
    template <typename T>
    T* take(int64_t count) {
        T* p = base_ != nullptr ? reinterpret_cast<T*>(base_ + used_) : nullptr;
        used_ += uint64_t(roundUp(count * int64_t(sizeof(T)), 64));
        return p;
    }
    uint64_t used() const { return used_; }

private:
    char* base_;
    uint64_t used_ = 0;
};

// Padded sizes of the head dims: A operands need whole 32-element k chunks, C tiles 16 columns.
struct HeadDims {
    int64_t d, dv, dChunks, dvChunks, dTiles, dvTiles;
    explicit HeadDims(const ForwardParams& p)
        : d(p.d), dv(p.dv), dChunks(chunksOf(p.d)), dvChunks(chunksOf(p.dv)), dTiles(tilesOf(p.d)),
          dvTiles(tilesOf(p.dv)) {}
};

// Query heads of a group that share one packing of each key and value block in a forward unit
// and a backward query unit: their query blocks, statistics and accumulators stay in scratch
// together (a larger group takes several passes).
constexpr int64_t kHeadsPerPass = 8;

int64_t headsPerPass(const ForwardParams& p) { return std::min(p.group, kHeadsPerPass); }

// Bytes of a thread's scratch: the layout carved from nothing.
template <class Scratch, class Params>
uint64_t scratchBytes(const Params& p, TileShape t) {
    Carver counter(nullptr);
    Scratch layout(p, t, counter);
    return counter.used();
}

}  // namespace
}  // namespace attnops::fa

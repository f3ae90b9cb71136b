// The per-thread scratch layout the BlockAttentionResiduals kernels share (vector-* and
// stream-*): sizes for the plan, and the arrays carved from a thread's slice. Arrays start
// on 64-byte boundaries and are padded to whole 16-float vectors.
#pragma once

#include <cstdint>

#include "ops/block_attention_residuals/params.hpp"

namespace attnops::bar::scratch {

constexpr uint64_t kMaxTileBytes = 1u << 20;  // backward: keep a token's rows up to 1 MiB

inline int64_t alignUp(int64_t n) { return (n + 15) / 16 * 16; }

// Whether all N+1 rows of a token are kept between two passes over them (the backward's, the
// stream kernels' forward); else the backward re-reads them and the forward accumulates per row.
inline bool tileFits(const Sources& s) {
    return uint64_t(s.blocks + 1) * uint64_t(s.hidden) * sizeof(float) <= kMaxTileBytes;
}

// Forward: x [H] (the source row in fp32), acc [H], score [N+1], inv [N+1].
struct Forward {
    float *x, *acc, *score, *inv;
    Forward(const Sources& s, void* base)
        : x(static_cast<float*>(base)),
          acc(x + alignUp(s.hidden)),
          score(acc + alignUp(s.hidden)),
          inv(score + alignUp(s.blocks + 1)) {}
    static uint64_t bytes(const ForwardParams& p) {
        return uint64_t(2 * alignUp(p.src.hidden) + 2 * alignUp(p.src.blocks + 1)) * sizeof(float);
    }
};

// The stream kernels' forward: the token's rows [N+1][H] (one row when they do not fit), acc [H],
// per source the fp64 score [N+1], inv and weight [N+1] (the probabilities).
struct ForwardTile {
    bool cached;
    int64_t rowFloats;
    float* tile;
    float* acc;
    double* score;
    float *inv, *weight;
    ForwardTile(const Sources& s, void* base)
        : cached(tileFits(s)),
          rowFloats(alignUp(s.hidden)),
          tile(static_cast<float*>(base)),
          acc(tile + (cached ? s.blocks + 1 : 1) * rowFloats),
          score(reinterpret_cast<double*>(acc + rowFloats)),
          inv(reinterpret_cast<float*>(score + alignUp(s.blocks + 1))),
          weight(inv + alignUp(s.blocks + 1)) {}
    float* row(int64_t i) const { return tile + (cached ? i : 0) * rowFloats; }
    static uint64_t bytes(const ForwardParams& p) {
        const int64_t rows = tileFits(p.src) ? p.src.blocks + 1 : 1;
        return uint64_t((rows + 1) * alignUp(p.src.hidden) + 4 * alignUp(p.src.blocks + 1)) * sizeof(float);
    }
};

// Backward: the token's rows [N+1][H] (one row when they do not fit), dy [H], a [N+1], c [N+1].
struct Backward {
    bool cached;
    int64_t rowFloats;
    float *tile, *dy, *a, *c;
    Backward(const Sources& s, void* base)
        : cached(tileFits(s)),
          rowFloats(alignUp(s.hidden)),
          tile(static_cast<float*>(base)),
          dy(tile + (cached ? s.blocks + 1 : 1) * rowFloats),
          a(dy + rowFloats),
          c(a + alignUp(s.blocks + 1)) {}
    float* row(int64_t i) const { return tile + (cached ? i : 0) * rowFloats; }
    static uint64_t bytes(const BackwardParams& p) {
        const int64_t rows = tileFits(p.src) ? p.src.blocks + 1 : 1;
        return uint64_t((rows + 1) * alignUp(p.src.hidden) + 2 * alignUp(p.src.blocks + 1)) * sizeof(float);
    }
};

}  // namespace attnops::bar::scratch

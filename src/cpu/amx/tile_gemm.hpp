// The tile loop of the AMX kernels: a GEMM of whole tiles, written once against the tile
// interface of tiles.hpp. Like fa_amx_kernel.hpp, it takes its attributes from ATTNOPS_AMX_FN,
// defined by the including file, and has internal linkage.
#pragma once

#ifndef ATTNOPS_AMX_FN
#error "define ATTNOPS_AMX_FN (the attributes of the backend's build) before including tile_gemm.hpp"
#endif

#include <cstdint>

#include "cpu/amx/tiles.hpp"

namespace attnops::cpu::amx {
namespace {

// C[16 mTiles x 16 nTiles] (+)= A . B on tiles t, configured with fullTiles() by the caller: A
// 16-bit row-major with leading dimension lda (16 mTiles rows, 32 kChunks columns), B VNNI tiles,
// tile (kc, nt) at b + kc * bChunkStride + nt * 512 (bChunkStride: 16-bit elements from one k
// chunk's tiles to the next, so that a B operand can be the column tiles nt0.. of a wider packing),
// C fp32 with leading dimension ldc. 2x2 blocks of C tiles in tmm0-3, A tiles in tmm4-5, B tiles
// in tmm6-7.
template <DotKind kind, class Tiles>
ATTNOPS_AMX_FN void gemmOn(Tiles& t, int64_t mTiles, int64_t nTiles, int64_t kChunks, const uint16_t* a, int64_t lda,
                           const uint16_t* b, int64_t bChunkStride, float* c, int64_t ldc, bool accumulate) {
    constexpr auto c00 = tmm<0>;
    constexpr auto c01 = tmm<1>;
    constexpr auto c10 = tmm<2>;
    constexpr auto c11 = tmm<3>;
    constexpr auto a0 = tmm<4>;
    constexpr auto a1 = tmm<5>;
    constexpr auto b0 = tmm<6>;
    constexpr auto b1 = tmm<7>;
    const int64_t aStride = lda * int64_t(sizeof(uint16_t)), bStride = kTileK * int64_t(sizeof(uint16_t));
    const int64_t cStride = ldc * int64_t(sizeof(float));
    for (int64_t mt = 0; mt < mTiles; mt += 2)
        for (int64_t nt = 0; nt < nTiles; nt += 2) {
            const bool twoRows = mt + 1 < mTiles, twoCols = nt + 1 < nTiles;
            float* cTop = c + mt * kTileM * ldc + nt * kTileN;
            float* cBottom = cTop + kTileM * ldc;
            if (accumulate) {
                t.load(c00, cTop, cStride);
                if (twoCols) t.load(c01, cTop + kTileN, cStride);
                if (twoRows) t.load(c10, cBottom, cStride);
                if (twoRows && twoCols) t.load(c11, cBottom + kTileN, cStride);
            } else {
                t.zero(c00);
                t.zero(c01);
                t.zero(c10);
                t.zero(c11);
            }
            for (int64_t kc = 0; kc < kChunks; ++kc) {
                const uint16_t* aTile = a + mt * kTileM * lda + kc * kTileK;
                const uint16_t* bTile = b + kc * bChunkStride + nt * kTileElems;
                t.load(a0, aTile, aStride);
                if (twoRows) t.load(a1, aTile + kTileM * lda, aStride);
                t.load(b0, bTile, bStride);
                if (twoCols) t.load(b1, bTile + kTileElems, bStride);
                t.template dot<kind>(c00, a0, b0);
                if (twoCols) t.template dot<kind>(c01, a0, b1);
                if (twoRows) t.template dot<kind>(c10, a1, b0);
                if (twoRows && twoCols) t.template dot<kind>(c11, a1, b1);
            }
            t.store(c00, cTop, cStride);
            if (twoCols) t.store(c01, cTop + kTileN, cStride);
            if (twoRows) t.store(c10, cBottom, cStride);
            if (twoRows && twoCols) t.store(c11, cBottom + kTileN, cStride);
        }
}

// The tile configuration for a stretch of code: loaded on construction, released on destruction.
// Nothing between may call code that uses the tiles (they are caller-saved).
template <class Tiles>
class TileSession {
public:
    ATTNOPS_AMX_FN TileSession() {
        static constexpr TileConfig kConfig = fullTiles();
        tiles.configure(kConfig);
    }
    ATTNOPS_AMX_FN ~TileSession() { tiles.release(); }
    TileSession(const TileSession&) = delete;
    TileSession& operator=(const TileSession&) = delete;
    Tiles tiles;
};

// gemmOn in a configuration of its own, B packed as kChunks x nTiles tiles, each k chunk's tiles
// side by side.
template <DotKind kind, class Tiles>
ATTNOPS_AMX_FN void gemm(int64_t mTiles, int64_t nTiles, int64_t kChunks, const uint16_t* a, int64_t lda,
                         const uint16_t* b, float* c, int64_t ldc, bool accumulate) {
    TileSession<Tiles> session;
    gemmOn<kind>(session.tiles, mTiles, nTiles, kChunks, a, lda, b, nTiles * kTileElems, c, ldc, accumulate);
}

}  // namespace
}  // namespace attnops::cpu::amx

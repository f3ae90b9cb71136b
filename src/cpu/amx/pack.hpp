// Operand packing of the AMX kernels, portable C++ shared by both tile backends: 16-bit views
// (bf16 or fp16, moved as raw bits) and fp32 blocks (rounded to nearest even) become whole,
// zero-padded A tiles or VNNI B tiles. Static and always inlined, so each translation unit
// compiles its own copy for its own instruction set.
//
// Layouts (16-bit elements; a B tile holds 16 rows of 16 element pairs, 1 KiB):
//   A operand: dst[r * ld + c], r < rowsPad, c < ld (a multiple of 32), zero outside the data.
//   B operand: kChunks x nTiles tiles, tile (kc, nt) at dst + (kc * nTiles + nt) * kTileElems,
//     element [r][2n + j] = X(k = 32 kc + 2r + j, n = 16 nt + n), zero outside the data.
//     packRowPairs reads X(k, n) = row k, column n (the k axis of the product runs over rows:
//     V in P.V, dO, Q and K in the backward); packColumnPairs reads X(k, n) = row n, column k
//     (the k axis runs over columns: K in Q.K^T, V in dO.V^T), the 16 x 16 dword transpose.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/dtype.hpp"
#include "cpu/amx/lanes.hpp"
#include "cpu/amx/tiles.hpp"
#include "ops/flash_attention_score/params.hpp"

// 64-byte vector values pass between always-inlined functions only (cpu/amx/lanes.hpp; -Wpsabi is
// off for the files that include this one).

// The target of the kernel translation unit, as lanes.hpp's functions, which these call.
#ifdef ATTNOPS_AMX_FN
#define ATTNOPS_AMX_PACK static inline __attribute__((always_inline)) ATTNOPS_AMX_FN
#else
#define ATTNOPS_AMX_PACK static inline __attribute__((always_inline))
#endif

namespace attnops::cpu::amx {

constexpr int64_t roundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// Element (row, col) of head n of a 16-bit view.
ATTNOPS_AMX_PACK uint16_t rawAt(const fa::View4& v, int64_t b, int64_t n, int64_t row, int64_t col) {
    return static_cast<const uint16_t*>(v.data)[v.offset(b, n, row, col)];
}

// Rows [row0, row0 + rows) x columns [0, cols) of head n as an A operand.
ATTNOPS_AMX_PACK void packRows(const fa::View4& v, int64_t b, int64_t n, int64_t row0, int64_t rows, int64_t cols,
                               int64_t rowsPad, int64_t ld, uint16_t* __restrict dst) {
    for (int64_t r = 0; r < rowsPad; ++r) {
        uint16_t* out = dst + r * ld;
        int64_t c = 0;
        if (r < rows && cols > 0) {  // a view without columns may have a NULL base
            if (v.stride[3] == 1)
                std::memcpy(out, static_cast<const uint16_t*>(v.data) + v.offset(b, n, row0 + r, 0), size_t(cols) * 2);
            else
                for (int64_t k = 0; k < cols; ++k) out[k] = rawAt(v, b, n, row0 + r, k);
            c = cols;
        }
        std::fill(out + c, out + ld, uint16_t(0));
    }
}

// Rows [row0, row0 + rows) x columns [0, cols) of head n transposed as an A operand whose k
// axis runs over the rows: dst[c * ld + r] = X(row0 + r, c) for c < colsPad, r < ld (a multiple
// of 32), zero outside the data (V^T in the forward's O^T += V^T.P^T). Where the columns are
// contiguous, whole blocks of 32 rows x 16 columns move as 16 x 16 transposes of row pairs.
ATTNOPS_AMX_PACK void packRowsTransposed(const fa::View4& v, int64_t b, int64_t n, int64_t row0, int64_t rows,
                                         int64_t cols, int64_t colsPad, int64_t ld, uint16_t* __restrict dst) {
    std::fill(dst, dst + colsPad * ld, uint16_t(0));
    rows = std::min(rows, ld);
    cols = std::min(cols, colsPad);
    int64_t fastRows = 0, fastCols = 0;  // the block moved by transposes
    if (v.stride[3] == 1) {
        fastRows = rows / kTileK * kTileK;
        fastCols = cols / kTileN * kTileN;
        const uint16_t* base = static_cast<const uint16_t*>(v.data);
        for (int64_t r0 = 0; r0 < fastRows; r0 += kTileK)
            for (int64_t c0 = 0; c0 < fastCols; c0 += kTileN) {
                U16x x[kTileN];  // x[p][c]: rows r0 + 2p, r0 + 2p + 1 of column c0 + c
                for (int64_t p = 0; p < kTileN; ++p)
                    x[p] = pairLanes(base + v.offset(b, n, row0 + r0 + 2 * p, c0),
                                     base + v.offset(b, n, row0 + r0 + 2 * p + 1, c0));
                transposeLanes(x);  // x[c][p]
                for (int64_t c = 0; c < kTileN; ++c) std::memcpy(dst + (c0 + c) * ld + r0, &x[c], sizeof x[c]);
            }
    }
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = r < fastRows ? fastCols : 0; c < cols; ++c) dst[c * ld + r] = rawAt(v, b, n, row0 + r, c);
}

// B operand whose k axis runs over rows [row0, row0 + rows) and n over columns [0, cols). Where
// the columns are contiguous, each row of a whole tile (32 rows x 16 columns) is two rows' 16
// elements interleaved.
ATTNOPS_AMX_PACK void packRowPairs(const fa::View4& v, int64_t b, int64_t n, int64_t row0, int64_t rows, int64_t cols,
                                   int64_t kChunks, int64_t nTiles, uint16_t* __restrict dst) {
    std::fill(dst, dst + kChunks * nTiles * kTileElems, uint16_t(0));
    rows = std::min(rows, kChunks * kTileK);
    cols = std::min(cols, nTiles * kTileN);
    int64_t fastRows = 0, fastCols = 0;  // the whole tiles moved as vectors
    if (v.stride[3] == 1) {
        fastRows = rows / kTileK * kTileK;
        fastCols = cols / kTileN * kTileN;
        const uint16_t* base = static_cast<const uint16_t*>(v.data);
        for (int64_t k0 = 0; k0 < fastRows; k0 += kTileK)
            for (int64_t c0 = 0; c0 < fastCols; c0 += kTileN) {
                uint16_t* tile = dst + ((k0 / kTileK) * nTiles + c0 / kTileN) * kTileElems;
                for (int64_t r = 0; r < kTileM; ++r)
                    storeLanes(tile + r * kTileK, pairLanes(base + v.offset(b, n, row0 + k0 + 2 * r, c0),
                                                            base + v.offset(b, n, row0 + k0 + 2 * r + 1, c0)));
            }
    }
    for (int64_t k = 0; k < rows; ++k) {
        const int64_t kc = k / kTileK, r = (k % kTileK) / 2, j = k % 2;
        uint16_t* pairRow = dst + kc * nTiles * kTileElems + r * kTileK + j;
        for (int64_t c = k < fastRows ? fastCols : 0; c < cols; ++c)
            pairRow[(c / kTileN) * kTileElems + 2 * (c % kTileN)] = rawAt(v, b, n, row0 + k, c);
    }
}

// B operand whose k axis runs over columns [0, cols) and n over rows [row0, row0 + rows). Where
// the columns are contiguous, a whole tile (16 rows x 32 columns) is the 16 x 16 transpose of
// the rows' column pairs.
ATTNOPS_AMX_PACK void packColumnPairs(const fa::View4& v, int64_t b, int64_t n, int64_t row0, int64_t rows,
                                      int64_t cols, int64_t kChunks, int64_t nTiles, uint16_t* __restrict dst) {
    std::fill(dst, dst + kChunks * nTiles * kTileElems, uint16_t(0));
    rows = std::min(rows, nTiles * kTileN);
    cols = std::min(cols, kChunks * kTileK);
    int64_t fastRows = 0, fastCols = 0;  // the whole tiles moved as vectors
    if (v.stride[3] == 1) {
        fastRows = rows / kTileN * kTileN;
        fastCols = cols / kTileK * kTileK;
        const uint16_t* base = static_cast<const uint16_t*>(v.data);
        for (int64_t x0 = 0; x0 < fastRows; x0 += kTileN)
            for (int64_t k0 = 0; k0 < fastCols; k0 += kTileK) {
                U16x t[kTileN];  // t[x][p]: columns k0 + 2p, k0 + 2p + 1 of row x0 + x
                for (int64_t x = 0; x < kTileN; ++x) std::memcpy(&t[x], base + v.offset(b, n, row0 + x0 + x, k0), 64);
                transposeLanes(t);  // t[p][x]
                uint16_t* tile = dst + ((k0 / kTileK) * nTiles + x0 / kTileN) * kTileElems;
                for (int64_t p = 0; p < kTileM; ++p) storeLanes(tile + p * kTileK, t[p]);
            }
    }
    for (int64_t x = 0; x < rows; ++x) {
        uint16_t* tileColumn = dst + (x / kTileN) * kTileElems + 2 * (x % kTileN);
        for (int64_t k = x < fastRows ? fastCols : 0; k < cols; ++k)
            tileColumn[(k / kTileK) * nTiles * kTileElems + ((k % kTileK) / 2) * kTileK + k % 2] =
                rawAt(v, b, n, row0 + x, k);
    }
}

// fp32 to the 16-bit element of the dot product, rounded to nearest even.
template <DotKind kind>
ATTNOPS_AMX_PACK uint16_t narrow(float x) {
    return kind == DotKind::Bf16 ? floatToBf16(x) : floatToF16(x);
}

// src[r * lds + c] (r < rows, c < cols) as an A operand; Transposed: element (c, r) of the
// result is src[r * lds + c], so dst has cols rows (rowsPad of them) and leading dimension ld.
template <DotKind kind, bool Transposed>
ATTNOPS_AMX_PACK void packFloats(const float* __restrict src, int64_t lds, int64_t rows, int64_t cols, int64_t rowsPad,
                                 int64_t ld, uint16_t* __restrict dst) {
    std::fill(dst, dst + rowsPad * ld, uint16_t(0));
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
            const uint16_t e = narrow<kind>(src[r * lds + c]);
            if (Transposed)
                dst[c * ld + r] = e;
            else
                dst[r * ld + c] = e;
        }
}

}  // namespace attnops::cpu::amx

// The streaming BlockAttentionResiduals kernel (stream-avx512, stream-avx2), written once over a
// 16-lane fp32 vector trait and compiled by one translation unit per ISA. Built to run at memory
// speed:
//   - each source row is read from memory once per token, converted to fp32 as it is loaded
//     while its two dot products (forward: v . v and u . v; backward: dy . v and u . v) are
//     accumulated in the same pass; the fp32 copy stays in L1/L2 for the rest of the token's work;
//   - the forward keeps the token's rows (when they fit, like the backward: fp32 rows as fp32
//     copies, contiguous fp16/bf16 rows in L2 as they are, read again: weighRows), takes the softmax
//     once every score is known, and accumulates o = sum_i p_i x_i in registers over 64-column
//     blocks: one fused multiply-add per element and source, no accumulator row stored per source;
//   - the per-element loops take the element type, the store kind and the dot kind as template
//     arguments, so they carry no per-vector tests, and keep every accumulator in a register
//     (instructions per element on AMD EPYC Zen 3, T=128 N=8 H=4096, callgrind: bf16 forward
//     2.5 -> 1.5, backward 5.6 -> 3.3; fp16 2.1 -> 1.25 and 4.0 -> 2.2; fp32 3.6 -> 3.2 and
//     3.6 -> 2.2);
//   - while a token's cached rows are weighted (forward) or its gradient rows written (backward),
//     the next token's rows are prefetched at the same pace, so its first pass finds them in L2
//     and the memory stream does not pause during the passes that read no new rows (the
//     forward's into L2 only, prefetcht1: see weighRows);
//   - the backward (contiguous rows: backwardTokenByColumns) reads each source row twice, the
//     second time from L2 as it is (no fp32 copy is stored in the first pass), and writes the
//     gradient rows in the loop that accumulates du, in blocks of 256 columns and within a block
//     one row at a time, so du, u and dy of the block stay in L1 and each row still writes runs
//     of whole lines (interleaving the rows' stores by half lines (du in registers) or by one or
//     two 64-byte lines made the backward up to 2x slower on AMD EPYC Zen 3 (AVX2), as the rows'
//     non-temporal lines compete for write-combining; whole rows at a time, as before the blocks,
//     streamed du, u and dy through L1 once per row: on AMD EPYC Zen 4 the blocks take 0.85-0.91x
//     the time, bench/results/amd-epyc-zen4-avx512/bar-bwd-column-blocks-ab-20261207.txt); the
//     vector loop starts on the gradient rows' line boundary, so rows that malloc leaves 16 bytes
//     off a vector boundary are streamed too (before, they went through an fp32 row and a copy:
//     callgrind, T=512 N=8 H=4096, backward instructions per element bf16 5.0 -> 3.8, fp16 3.8 ->
//     2.7, fp32 3.6 -> 2.7). Strided rows keep the row-by-row passes over an fp32 tile (same bits);
//   - large outputs are written with non-temporal stores (from the first vector-aligned element
//     of each row), so written rows do not first cost a read for ownership: the backward writes
//     nearly as many bytes as it reads (fp32 backward on AVX-512: 29 -> 35 GB/s);
//   - the loads run a software prefetch 4 KiB ahead: the rows of consecutive sources and tokens
//     are usually adjacent, and the hardware prefetcher alone left bf16 latency-bound on the
//     AVX-512 machine (on Zen 3 no distance, 0 to 16 KiB, made a difference).
// Rows whose hidden stride is not 1 are gathered through the generic row conversion first.
//
// Every reduction over H has a fixed order (the backward's and the forward's on fp16/bf16 rows:
// two 16-lane fp32 accumulators over fixed 32-column groups; the forward's on fp32 rows: one
// 16-lane fp64 accumulator per dot, see loadWithStats), so results are the same on every run and
// for any thread count. The trait gives
// every ISA the same 16 lanes (AVX2 as two 8-lane halves) and the same fused operations, so
// stream-avx2 and stream-avx512 give the same bits.
//
// The including file defines ATTNOPS_BAR_STREAM_TARGET, the target attribute of its ISA, which
// every function here carries (a target attribute, not per-file flags: inline functions of
// shared headers compiled with AVX-512 flags could be the copy the linker keeps for everyone),
// and a trait V with, over V::F (16 fp32 lanes) and V::H (16 bf16/fp16 lanes, 32 bytes):
//   zero, set1, load/store (64-byte aligned), loadu/storeu, add, mul, fmadd(a, b, c) = a*b + c
//   and fnmadd(a, b, c) = c - a*b (both fused); loadH/storeH (unaligned); widenBf16, widenF16;
//   loadWidenBf16, loadWidenF16 (16 values from memory, unaligned, widened);
//   narrowBf16 (to nearest even, NaN kept quiet: cpu::floatToBf16), narrowF16 (to nearest even);
//   streamF (64-byte aligned), streamH (32-byte aligned): non-temporal stores; fence: orders them;
//   and over V::D (16 fp64 lanes): zeroD, fmaddD(a, b, c) = c + double(a) * double(b) per lane,
//   storeD (unaligned).
// Everything is in an anonymous namespace: each ISA's translation unit keeps its own copy.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu/bar_scratch.hpp"
#include "cpu/generic/convert.hpp"
#include "ops/block_attention_residuals/kernel.hpp"

#ifndef ATTNOPS_BAR_STREAM_TARGET
#error "define ATTNOPS_BAR_STREAM_TARGET (the ISA's target attribute) before including cpu/bar_stream.hpp"
#endif
#define ATTNOPS_BAR_STREAM_INLINE ATTNOPS_BAR_STREAM_TARGET static inline __attribute__((always_inline))

namespace attnops::bar {
namespace {

constexpr int64_t kW = 16;                        // fp32 lanes of a V::F
// Outputs larger than this bypass the caches. Not tuned: any size well above the last-level cache
// share of two cores would do; below it the output may still be read back from cache.
constexpr uint64_t kStreamOutputBytes = 32u << 20;
constexpr int64_t kPrefetchBytes = 4096;            // software prefetch distance
constexpr int64_t kMaxPrefetchRows = 129;           // sources prefetched for the next token (N <= 128)
constexpr int64_t kGradColumns = 256;               // the backward's column block (gradColumns), a multiple of 2 * kW

inline int64_t elementBytes(DType dtype) { return dtype == DType::F32 ? 4 : 2; }

// Elements [index, index + 16) of a contiguous row, converted to fp32.
template <class V>
ATTNOPS_BAR_STREAM_INLINE typename V::F loadFull(const void* row, int64_t index, DType dtype) {
    if (dtype == DType::F32) return V::loadu(static_cast<const float*>(row) + index);
    const uint16_t* p = static_cast<const uint16_t*>(row) + index;
    return dtype == DType::BF16 ? V::loadWidenBf16(p) : V::loadWidenF16(p);
}

// Elements [index, index + min(remaining, 16)) of a contiguous row as fp32, the other lanes 0.
// A row's tail (remaining < 16) goes through a zeroed copy, so nothing past the row is read.
template <class V>
ATTNOPS_BAR_STREAM_INLINE typename V::F load16(const void* row, int64_t index, DType dtype, int64_t remaining) {
    if (remaining >= kW) return loadFull<V>(row, index, dtype);
    alignas(64) unsigned char lanes[kW * 4] = {};
    std::memcpy(lanes, static_cast<const char*>(row) + index * elementBytes(dtype), size_t(remaining * elementBytes(dtype)));
    return loadFull<V>(lanes, 0, dtype);
}

// Elements [index, index + 16) of a contiguous row = v rounded to dtype; `stream`: a
// non-temporal store, used when the whole vector is stored and its address is aligned.
template <class V>
ATTNOPS_BAR_STREAM_INLINE void storeFull(void* row, int64_t index, DType dtype, typename V::F v, bool stream) {
    if (dtype == DType::F32) {
        float* p = static_cast<float*>(row) + index;
        if (stream && (reinterpret_cast<uintptr_t>(p) & 63u) == 0)
            V::streamF(p, v);
        else
            V::storeu(p, v);
        return;
    }
    uint16_t* p = static_cast<uint16_t*>(row) + index;
    const typename V::H h = dtype == DType::BF16 ? V::narrowBf16(v) : V::narrowF16(v);
    if (stream && (reinterpret_cast<uintptr_t>(p) & 31u) == 0)
        V::streamH(p, h);
    else
        V::storeH(p, h);
}

// Elements [index, index + min(remaining, 16)) of a contiguous row = the first lanes of v; a
// row's tail goes through a copy, so nothing past the row is written.
template <class V>
ATTNOPS_BAR_STREAM_INLINE void store16(void* row, int64_t index, DType dtype, typename V::F v, int64_t remaining,
                                       bool stream) {
    if (remaining >= kW) return storeFull<V>(row, index, dtype, v, stream);
    alignas(64) unsigned char lanes[kW * 4];
    storeFull<V>(lanes, 0, dtype, v, false);
    std::memcpy(static_cast<char*>(row) + index * elementBytes(dtype), lanes, size_t(remaining * elementBytes(dtype)));
}

// Where row i of token t starts, as a contiguous row (nullptr: its hidden stride is not 1, or
// the tensor is empty and may have a NULL base, which takes no offset).
inline const void* contiguousRow(const View3& v, int64_t t, int64_t row) {
    if (v.stride[2] != 1 || v.data == nullptr) return nullptr;
    return static_cast<const char*>(v.data) + (t * v.stride[0] + row * v.stride[1]) * elementBytes(v.dtype);
}

inline void* contiguousRow(const MutView3& v, int64_t t, int64_t row) {
    if (v.stride[2] != 1 || v.data == nullptr) return nullptr;
    return static_cast<char*>(v.data) + (t * v.stride[0] + row * v.stride[1]) * elementBytes(v.dtype);
}

// Lanes [e, e + 16) of an fp32 row padded to whole vectors whose padding may hold any bits.
template <class V>
ATTNOPS_BAR_STREAM_INLINE typename V::F loadPadded(const float* y, int64_t e, int64_t remaining) {
    return remaining >= kW ? V::load(y + e) : load16<V>(y, e, DType::F32, remaining);
}

// Where source i of token t starts as a contiguous row of `dtype`; a strided hidden axis is
// gathered into x (fp32) first.
inline const void* sourceRow(const Sources& s, int64_t t, int64_t i, float* x, DType& dtype) {
    const View3& v = i < s.blocks ? s.blockRes : s.partial;
    const int64_t row = i < s.blocks ? i : 0;
    const void* src = contiguousRow(v, t, row);
    dtype = v.dtype;
    if (src == nullptr) {
        cpu::loadRow(v.data, t * v.stride[0] + row * v.stride[1], v.stride[2], v.dtype, s.hidden, x);
        src = x;
        dtype = DType::F32;
    }
    return src;
}

// The rows of consecutive sources (and tokens) usually follow each other in memory: keep the
// stream kPrefetchBytes ahead of the loads (a hint; it may run past the buffer).
ATTNOPS_BAR_STREAM_INLINE void prefetchAhead(const void* src, int64_t e, int64_t bytes) {
    const char* ahead = static_cast<const char*>(src) + kPrefetchBytes + e * bytes;
    for (int64_t line = 0; line < 4 * kW * bytes; line += 64) __builtin_prefetch(ahead + line, 0, 3);
}

// Two accumulators over fixed 32-column groups (column h goes to accumulator (h / 16) % 2),
// combined as a0 + a1, then the lanes in ascending order.
template <class V>
ATTNOPS_BAR_STREAM_INLINE float combine2(const typename V::F a[2]) {
    alignas(64) float lanes[kW];
    V::store(lanes, V::add(a[0], a[1]));
    float s = 0.0f;
    for (float x : lanes) s += x;
    return s;
}

// One read of a row (fp16/bf16, or fp32: DT): x = the row in fp32, dotZ = z . x (z = nullptr:
// x . x) and dotY = y . x in fp32 (the backward's pass, and the forward's for fp16/bf16 rows).
// The element type is a template argument, so the loop carries no per-vector dtype test, and two
// column groups (eight ymm accumulators on AVX2) keep every accumulator in a register (four
// groups spilled on AVX2). z and y are padded to whole vectors; SQUARE: z is x (z unused);
// KEEP: x is stored (else x is unused: the backward's column pass reads the source row again).
template <class V, DType DT, bool SQUARE, bool KEEP = true>
ATTNOPS_BAR_STREAM_INLINE void rowDots(const void* src, int64_t h, const float* __restrict z,
                                       const float* __restrict y, float* x, float& dotZ, float& dotY) {
    typename V::F dz[2], dy[2];
    for (int q = 0; q < 2; ++q) dz[q] = dy[q] = V::zero();
    constexpr int64_t bytes = DT == DType::F32 ? 4 : 2;
    int64_t e = 0;
    for (; e + 4 * kW <= h; e += 4 * kW) {
        prefetchAhead(src, e, bytes);
        for (int j = 0; j < 4; ++j) {
            const typename V::F xv = loadFull<V>(src, e + j * kW, DT);
            if (KEEP) V::store(x + e + j * kW, xv);
            dz[j % 2] = V::fmadd(SQUARE ? xv : V::load(z + e + j * kW), xv, dz[j % 2]);
            dy[j % 2] = V::fmadd(V::load(y + e + j * kW), xv, dy[j % 2]);
        }
    }
    for (; e < h; e += kW) {
        const int q = int(e / kW) % 2;
        const typename V::F xv = load16<V>(src, e, DT, h - e);
        if (KEEP) V::store(x + e, xv);
        dz[q] = V::fmadd(SQUARE ? xv : loadPadded<V>(z, e, h - e), xv, dz[q]);
        dy[q] = V::fmadd(loadPadded<V>(y, e, h - e), xv, dy[q]);
    }
    dotZ = combine2<V>(dz);
    dotY = combine2<V>(dy);
}

template <class V, bool SQUARE>
ATTNOPS_BAR_STREAM_INLINE void rowDotsAs(DType dtype, const void* src, int64_t h, const float* z, const float* y,
                                         float* x, float& dotZ, float& dotY) {
    if (dtype == DType::BF16)
        rowDots<V, DType::BF16, SQUARE>(src, h, z, y, x, dotZ, dotY);
    else if (dtype == DType::F16)
        rowDots<V, DType::F16, SQUARE>(src, h, z, y, x, dotZ, dotY);
    else
        rowDots<V, DType::F32, SQUARE>(src, h, z, y, x, dotZ, dotY);
}

// Loads source i of token t into x (fp32) with rowDots (a strided row is gathered into x first).
template <class V>
ATTNOPS_BAR_STREAM_INLINE void loadWithDots(const Sources& s, int64_t t, int64_t i, const float* __restrict z,
                                            const float* __restrict y, float* x, float& dotZ, float& dotY) {
    DType dtype;
    const void* src = sourceRow(s, t, i, x, dtype);
    if (z == nullptr)
        rowDotsAs<V, true>(dtype, src, s.hidden, z, y, x, dotZ, dotY);
    else
        rowDotsAs<V, false>(dtype, src, s.hidden, z, y, x, dotZ, dotY);
}

// The lanes of an fp64 accumulator summed in lane order.
template <class V>
ATTNOPS_BAR_STREAM_INLINE double sumLanes(const typename V::D& d) {
    double lanes[kW];
    V::storeD(lanes, d);
    double s = 0.0;
    for (double x : lanes) s += x;
    return s;
}

// The forward's pass over source i of token t: loads it into x (fp32) and returns x . x and
// u . x accumulated in fp64 (exact products, lane j of one accumulator per dot taking columns
// j, j + 16, ..., then the lanes in order). The softmax statistics the backward reads (probs,
// invNorm) come from these, and its weight gradients are sensitive to them: where one source's
// probability is near 1, dS_i = p_i (a_i - sum_j p_j a_j) turns an error of a few fp32 ulps in
// the probabilities (what fp32 dots over H give the scores) into errors of ~2e-6 relative in
// gradNormWeight, as large as a naive fp32 implementation's and decided by rounding luck. With
// fp64 dots and an fp64 softmax the statistics are correctly rounded up to a fraction of an ulp,
// and the weight gradients land ~10x below the naive fp32 error (T=3 N=9 H=130 in
// tests/python/test_block_attention_residuals.py). Only fp32 rows take this path: on fp16/bf16
// rows the conversions and fp64 FMAs no longer hide under the (halved) memory stream (bf16
// forward on AMD EPYC Zen 3: 53-75% of DRAM read with fp32 dots, 35-42% with fp64 ones), and
// ulps of fp32 statistics are far below what those dtypes resolve, so they keep the fp32 dots
// (rowDots).
template <class V>
ATTNOPS_BAR_STREAM_INLINE void loadWithStats(const Sources& s, int64_t t, int64_t i, const float* __restrict u,
                                             float* __restrict x, double& sumSquares, double& dotU) {
    if ((i < s.blocks ? s.blockRes : s.partial).dtype != DType::F32) {
        float ss = 0.0f, c = 0.0f;
        loadWithDots<V>(s, t, i, nullptr, u, x, ss, c);
        sumSquares = ss;
        dotU = c;
        return;
    }
    const int64_t h = s.hidden;
    DType dtype;
    const void* src = sourceRow(s, t, i, x, dtype);
    typename V::D ss = V::zeroD(), cu = V::zeroD();
    const int64_t bytes = elementBytes(dtype);
    for (int64_t e = 0; e < h; e += kW) {
        if (e % (4 * kW) == 0) prefetchAhead(src, e, bytes);
        const typename V::F xv = load16<V>(src, e, dtype, h - e);
        V::store(x + e, xv);
        ss = V::fmaddD(xv, xv, ss);
        cu = V::fmaddD(loadPadded<V>(u, e, h - e), xv, cu);
    }
    sumSquares = sumLanes<V>(ss);
    dotU = sumLanes<V>(cu);
}

// Stores the fp32 row x (length h) as row `row` of token t of `out`.
template <class V>
ATTNOPS_BAR_STREAM_INLINE void storeRow(const MutView3& out, int64_t t, int64_t row, int64_t h, const float* x,
                                        bool stream) {
    void* dst = contiguousRow(out, t, row);
    if (dst == nullptr) {
        cpu::storeRow(out.data, t * out.stride[0] + row * out.stride[1], out.stride[2], out.dtype, h, x);
        return;
    }
    int64_t e = 0;
    if (stream) {  // the elements before the first vector-aligned address, one by one
        const uintptr_t bytes = uintptr_t(elementBytes(out.dtype)), vectorBytes = kW * bytes;
        const uintptr_t misaligned = reinterpret_cast<uintptr_t>(dst) % vectorBytes;
        e = misaligned % bytes != 0 ? h : std::min<int64_t>(h, int64_t((vectorBytes - misaligned) % vectorBytes / bytes));
        cpu::storeRow(dst, 0, 1, out.dtype, e, x);
    }
    for (; e < h; e += kW) store16<V>(dst, e, out.dtype, V::loadu(x + e), h - e, stream);
}

// dy = row t of gradHidden as fp32, padded with zeros to whole vectors.
template <class V>
ATTNOPS_BAR_STREAM_INLINE void loadGradRow(const View3& g, int64_t t, int64_t h, float* dy) {
    const void* src = contiguousRow(g, t, 0);
    if (src == nullptr) {
        cpu::loadRow(g.data, t * g.stride[0], g.stride[2], g.dtype, h, dy);
        for (int64_t e = h; e < scratch::alignUp(h); ++e) dy[e] = 0.0f;
        return;
    }
    for (int64_t e = 0; e < h; e += kW) V::store(dy + e, load16<V>(src, e, g.dtype, h - e));
}

inline uint64_t outputBytes(const MutView3& v, uint64_t elements) { return elements * uint64_t(elementBytes(v.dtype)); }

// Whether row `row` of token t of `out` is written straight from registers: contiguous and, when
// streaming, starting on a vector boundary (else it goes through an fp32 row and storeRow).
ATTNOPS_BAR_STREAM_INLINE bool storesDirect(const MutView3& out, int64_t t, int64_t row, bool stream) {
    const void* dst = contiguousRow(out, t, row);
    return dst != nullptr && (!stream || reinterpret_cast<uintptr_t>(dst) % uintptr_t(kW * elementBytes(out.dtype)) == 0);
}

// Prefetches the lines of columns [e, e + cols) of the next token's source rows (rows[i]; nullptr:
// skipped), so that while the current token's cached rows are weighted and stored (no memory
// traffic of their own) the next token's rows are already on their way, and its first pass
// finds them in L2 (a hint: it may run past a row's end).
// Into L2 (prefetcht1; weighRows says why).
ATTNOPS_BAR_STREAM_INLINE void prefetchColumns(const char* const* rows, int64_t count, int64_t rowBytes, int64_t e,
                                               int64_t cols) {
    for (int64_t i = 0; i < count; ++i) {
        if (rows[i] == nullptr) continue;
        const char* p = rows[i] + e * rowBytes;
        for (int64_t line = 0; line < cols * rowBytes; line += 64) __builtin_prefetch(p + line, 0, 2);
    }
}

// The next token's source rows for prefetchColumns (nullptr: not contiguous, or no next token).
inline int64_t nextRows(const Sources& s, int64_t t, int64_t t1, const char** rows, int64_t& rowBytes) {
    const int64_t k = std::min<int64_t>(s.blocks + 1, kMaxPrefetchRows);
    rowBytes = elementBytes(s.partial.dtype);
    for (int64_t i = 0; i < k; ++i) {
        const View3& v = i < s.blocks ? s.blockRes : s.partial;
        rows[i] = t + 1 < t1 ? static_cast<const char*>(contiguousRow(v, t + 1, i < s.blocks ? i : 0)) : nullptr;
    }
    return k;
}

// The forward's weighting pass over a token whose probabilities are known: o = sum_i p_i x_i in
// source order, in registers over 64-column blocks (one fused multiply-add per element and
// source), written to dst (direct) or to acc. The rows are the token's fp32 copies (DT = F32:
// rows padded to whole vectors) or, for fp16/bf16 sources, the contiguous source rows themselves,
// read again from L2 and widened again (the same fp32 values, so the same bits): the first pass
// then stores no fp32 copy, which on AMD EPYC Zen 3 cost a 64-byte store per 16 elements and
// twice the L2 traffic of the fp16/bf16 rows (like the backward's second pass, gradColumns).
// The next token's rows are prefetched at the pace of the blocks, into L2 (prefetcht1): they are
// as large as this token's rows (72 KiB of bf16 at 9 sources x H 4096), which this pass reads
// again from L1/L2, and into a 32 KiB L1 (prefetcht0) they evicted them (AMD EPYC Zen 4: the
// fp32 / bf16 / fp16 forward takes 0.88x / 0.87x / 0.82x the time at 2 threads, 0.77-0.81x at one;
// bench/results/amd-epyc-zen4-avx512/prefetch-l2-ab-20261207.txt). The backward's prefetch
// (gradColumns) stays prefetcht0: prefetcht1 gained nothing there.
// Row is called with a source index and returns the start of its row.
template <class V, DType DT, class Row>
ATTNOPS_BAR_STREAM_INLINE void weighRows(Row rows, int64_t k, int64_t h, const float* weight, void* dst,
                                         DType outType, bool direct, bool stream, float* acc, const char* const* next,
                                         int64_t prefetchRows, int64_t rowBytes) {
    int64_t e = 0;
    for (; e + 4 * kW <= h; e += 4 * kW) {
        prefetchColumns(next, prefetchRows, rowBytes, e, 4 * kW);
        typename V::F o[4];
        for (int j = 0; j < 4; ++j) o[j] = V::zero();
        for (int64_t i = 0; i < k; ++i) {
            const typename V::F w = V::set1(weight[i]);
            for (int j = 0; j < 4; ++j) {
                const typename V::F x = DT == DType::F32 ? V::load(static_cast<const float*>(rows(i)) + e + j * kW)
                                                         : loadFull<V>(rows(i), e + j * kW, DT);
                o[j] = V::fmadd(w, x, o[j]);
            }
        }
        for (int j = 0; j < 4; ++j) {
            if (direct)
                storeFull<V>(dst, e + j * kW, outType, o[j], stream);
            else
                V::store(acc + e + j * kW, o[j]);
        }
    }
    for (; e < h; e += kW) {
        typename V::F o = V::zero();
        for (int64_t i = 0; i < k; ++i) {
            const typename V::F x = DT == DType::F32 ? V::load(static_cast<const float*>(rows(i)) + e)
                                                     : load16<V>(rows(i), e, DT, h - e);
            o = V::fmadd(V::set1(weight[i]), x, o);
        }
        if (direct)
            store16<V>(dst, e, outType, o, h - e, stream);
        else
            V::store(acc + e, o);
    }
}

// The forward. Each source's scores come from one read of its row (fp32 statistics for fp16/bf16
// rows, fp64 for fp32 rows: see loadWithStats) and an fp64 softmax.
// When the token's rows fit in the tile, the probabilities are known before any row is weighted:
// o = sum_i p_i x_i with p_i = exp(s_i - m) / l in fp64 rounded once to fp32 (the probs this
// forward saves), accumulated in source order in registers over 64-column blocks: one fused
// multiply-add per element and source (the online form took a multiply and a fused multiply-add
// and stored an accumulator per 16 columns: bf16 on AMD EPYC Zen 3 spent as long per token in
// this pass, with no memory traffic, as in the pass that reads the rows: callgrind instruction
// counts). The next token's rows are prefetched during this pass. Otherwise (rows re-read) the
// online softmax: acc = acc * decay_i + weight_i * x_i per source, then acc / l.
template <class V>
ATTNOPS_BAR_STREAM_TARGET void forwardTokens(const ForwardParams& p, const float* u, int64_t t0, int64_t t1,
                                             void* scratchBase) {
    const Sources& s = p.src;
    const int64_t h = s.hidden, k = s.blocks + 1;
    const scratch::ForwardTile sc(s, scratchBase);
    float *acc = sc.acc, *inv = sc.inv, *weight = sc.weight;
    double* score = sc.score;
    const double invH = h > 0 ? 1.0 / double(h) : 0.0;
    const bool stream = outputBytes(p.hidden, uint64_t(s.tokens) * uint64_t(h)) > kStreamOutputBytes;
    const char* next[kMaxPrefetchRows];
    // reread: fp16/bf16 sources whose rows all fit in the tile are read again in the weighting
    // pass instead of kept as fp32 copies (weighRows), when every row of the token is contiguous.
    const DType dtype = s.partial.dtype;
    const bool rereadable = sc.cached && dtype != DType::F32 && s.blockRes.dtype == dtype && k <= kMaxPrefetchRows;
    const void* rows[kMaxPrefetchRows];
    for (int64_t t = t0; t < t1; ++t) {
        bool reread = rereadable;
        for (int64_t i = 0; reread && i < k; ++i) {
            rows[i] = contiguousRow(i < s.blocks ? s.blockRes : s.partial, t, i < s.blocks ? i : 0);
            reread = rows[i] != nullptr;
        }
        // The softmax in fp64 (see loadWithStats); the accumulation of the rows in fp32.
        double m = -std::numeric_limits<double>::infinity(), l = 0.0;
        if (!sc.cached)
            for (int64_t e = 0; e < h; e += kW) V::store(acc + e, V::zero());
        for (int64_t i = 0; i < k; ++i) {
            double ss = 0.0, c = 0.0;
            float* x = sc.row(i);
            if (!reread) {
                loadWithStats<V>(s, t, i, u, x, ss, c);
            } else {  // the fp32 dots of loadWithStats' fp16/bf16 path, no fp32 copy stored
                float ssF = 0.0f, cF = 0.0f;
                if (dtype == DType::BF16)
                    rowDots<V, DType::BF16, true, false>(rows[i], h, nullptr, u, nullptr, ssF, cF);
                else
                    rowDots<V, DType::F16, true, false>(rows[i], h, nullptr, u, nullptr, ssF, cF);
                ss = ssF;
                c = cF;
            }
            const double r = 1.0 / std::sqrt(ss * invH + double(p.eps));
            inv[i] = float(r);
            score[i] = r * c;
            const double mNew = (score[i] > m || score[i] != score[i]) ? score[i] : m;
            const double decayI = m == -std::numeric_limits<double>::infinity() ? 0.0 : std::exp(m - mNew);
            const double weightI = std::exp(score[i] - mNew);
            if (!sc.cached) {
                const typename V::F va = V::set1(float(decayI)), vw = V::set1(float(weightI));
                for (int64_t e = 0; e < h; e += kW)
                    V::store(acc + e, V::fmadd(V::load(acc + e), va, V::mul(vw, V::load(x + e))));
            }
            l = l * decayI + weightI;
            m = mNew;
        }
        // weight[i] = p_i, the probability saved for the backward.
        for (int64_t i = 0; i < k; ++i) weight[i] = float(std::exp(score[i] - m) / l);
        if (sc.cached) {
            void* dst = contiguousRow(p.hidden, t, 0);
            const bool direct = storesDirect(p.hidden, t, 0, stream);
            int64_t rowBytes = 0;
            const int64_t prefetchRows = nextRows(s, t, t1, next, rowBytes);
            const auto cachedRow = [&](int64_t i) -> const void* { return sc.row(i); };
            const auto srcRow = [&](int64_t i) -> const void* { return rows[i]; };
            if (!reread)
                weighRows<V, DType::F32>(cachedRow, k, h, weight, dst, p.hidden.dtype, direct, stream, acc, next,
                                         prefetchRows, rowBytes);
            else if (dtype == DType::BF16)
                weighRows<V, DType::BF16>(srcRow, k, h, weight, dst, p.hidden.dtype, direct, stream, acc, next,
                                          prefetchRows, rowBytes);
            else
                weighRows<V, DType::F16>(srcRow, k, h, weight, dst, p.hidden.dtype, direct, stream, acc, next,
                                         prefetchRows, rowBytes);
            if (!direct) storeRow<V>(p.hidden, t, 0, h, acc, stream);
        } else {
            const typename V::F invL = V::set1(float(1.0 / l));
            for (int64_t e = 0; e < h; e += kW) V::store(acc + e, V::mul(V::load(acc + e), invL));
            storeRow<V>(p.hidden, t, 0, h, acc, stream);
        }
        if (p.saveStats)
            for (int64_t i = 0; i < k; ++i) {
                p.invNorm.store(t, i, 0, inv[i]);
                p.probs.store(t, i, 0, weight[i]);
            }
    }
    if (stream) V::fence();  // non-temporal stores are visible before the driver's join
}

// Source row i's gradient over columns [0, h): dv = p_i dy + coefU u - coefV x, written to dst as
// OUT (non-temporal when STREAM; dst then starts on a vector boundary) or, when dst is nullptr,
// over x (no longer needed) for storeRow; and du += coefU x. The element type and the store kind
// are template arguments (DIRECT: dst is not nullptr), so the loop carries no per-vector tests. `ahead` and `ahead2` (nullptr:
// none), the next token's rows of `aheadBytes`-byte elements, are prefetched line by line at the
// pace of this row: while this pass writes, the next token's reads are already on their way.
template <class V, DType OUT, bool STREAM, bool DIRECT>
ATTNOPS_BAR_STREAM_INLINE void gradRow(void* dst, int64_t h, float* x, const float* __restrict dy,
                                       const float* __restrict u, float* __restrict du, float pi, float coefU,
                                       float coefV, const char* ahead, const char* ahead2, int64_t aheadBytes) {
    const typename V::F vp = V::set1(pi), vu = V::set1(coefU), vv = V::set1(coefV);
    int64_t e = 0;
    for (; e + 2 * kW <= h; e += 2 * kW) {
        for (int64_t line = 0; line < 2 * kW * aheadBytes; line += 64) {
            if (ahead != nullptr) __builtin_prefetch(ahead + e * aheadBytes + line, 0, 3);
            if (ahead2 != nullptr) __builtin_prefetch(ahead2 + e * aheadBytes + line, 0, 3);
        }
        for (int j = 0; j < 2; ++j) {
            const int64_t f = e + j * kW;
            const typename V::F xv = V::load(x + f);
            V::storeu(du + f, V::fmadd(vu, xv, V::loadu(du + f)));
            const typename V::F dv = V::fnmadd(vv, xv, V::fmadd(vu, V::load(u + f), V::mul(vp, V::load(dy + f))));
            if (DIRECT)
                storeFull<V>(dst, f, OUT, dv, STREAM);
            else
                V::store(x + f, dv);
        }
    }
    for (; e < h; e += kW) {
        const typename V::F xv = V::load(x + e);
        store16<V>(du, e, DType::F32, V::fmadd(vu, xv, load16<V>(du, e, DType::F32, h - e)), h - e, false);
        const typename V::F dv = V::fnmadd(vv, xv, V::fmadd(vu, V::load(u + e), V::mul(vp, V::load(dy + e))));
        if (DIRECT)
            store16<V>(dst, e, OUT, dv, h - e, STREAM);
        else
            V::store(x + e, dv);
    }
}

template <class V, bool STREAM>
ATTNOPS_BAR_STREAM_INLINE void gradRowAs(DType out, void* dst, int64_t h, float* x, const float* dy, const float* u,
                                         float* du, float pi, float coefU, float coefV, const char* ahead,
                                         const char* ahead2, int64_t aheadBytes) {
    if (dst == nullptr)  // through x and storeRow: the element type does not matter here
        gradRow<V, DType::F32, STREAM, false>(dst, h, x, dy, u, du, pi, coefU, coefV, ahead, ahead2, aheadBytes);
    else if (out == DType::BF16)
        gradRow<V, DType::BF16, STREAM, true>(dst, h, x, dy, u, du, pi, coefU, coefV, ahead, ahead2, aheadBytes);
    else if (out == DType::F16)
        gradRow<V, DType::F16, STREAM, true>(dst, h, x, dy, u, du, pi, coefU, coefV, ahead, ahead2, aheadBytes);
    else
        gradRow<V, DType::F32, STREAM, true>(dst, h, x, dy, u, du, pi, coefU, coefV, ahead, ahead2, aheadBytes);
}

// gradColumns (below): the backward's second pass over a token whose source rows (rows[i].src) and gradient rows
// (rows[i].dst) are all contiguous: dv_i = p_i dy + coefU_i u - coefV_i v_i written and
// du += coefU_i v_i, per column the same operations in the same order as gradRow (the same bits),
// but v_i is read again from its source row (in L2 since the first pass: half the bytes of an
// fp32 copy for fp16/bf16, and the first pass stores no copy), and the vector loop starts where
// the first gradient row reaches a 64-byte line, so misaligned rows are streamed as well. The
// next token's rows (next[i]; next[k]: its gradHidden row) are prefetched at the pace of the rows
// written, so its first pass finds them in cache.

// One source of gradColumns: its row, its gradient row, p_i, coefU_i and coefV_i (one array of
// these: the loop keeps one base register for them, three arrays spilled pointers on AVX2).
struct GradSource {
    const void* src;
    void* dst;
    float p, coefU, coefV;
};

// Columns [e, e + cols) of every source's gradient (cols <= 16; cached stores): the ends of the
// rows that gradColumns' vector loop leaves (before the first line boundary, after the last 32-column block).
template <class V, DType DT>
ATTNOPS_BAR_STREAM_INLINE void gradColumnsPart(const GradSource* __restrict rows, int64_t k, int64_t e, int64_t cols,
                                               const float* __restrict dy, const float* __restrict u,
                                               float* __restrict du) {
    const typename V::F dyv = load16<V>(dy, e, DType::F32, cols), uv = load16<V>(u, e, DType::F32, cols);
    typename V::F d = load16<V>(du, e, DType::F32, cols);
    for (int64_t i = 0; i < k; ++i) {
        const GradSource& r = rows[i];
        const typename V::F vp = V::set1(r.p), vu = V::set1(r.coefU), vv = V::set1(r.coefV);
        const typename V::F x = load16<V>(r.src, e, DT, cols);
        d = V::fmadd(vu, x, d);
        store16<V>(r.dst, e, DT, V::fnmadd(vv, x, V::fmadd(vu, uv, V::mul(vp, dyv))), cols, false);
    }
    store16<V>(du, e, DType::F32, d, cols, false);
}

template <class V, DType DT, bool STREAM>
ATTNOPS_BAR_STREAM_INLINE void gradColumns(const GradSource* __restrict rows, int64_t k, int64_t h,
                                           const float* __restrict dy, const float* __restrict u,
                                           float* __restrict du, const char* const* next) {
    constexpr int64_t bytes = DT == DType::F32 ? 4 : 2;
    // The vector loop starts where the first gradient row reaches a 64-byte line (rows of one
    // token usually share their offset within a line: H * bytes a multiple of 64); the columns
    // before go through gradColumnsPart. storeFull checks each address, so a row with another
    // offset is still written correctly (with cached stores where it is not aligned).
    const uintptr_t misaligned = reinterpret_cast<uintptr_t>(rows[0].dst) % 64u;
    const int64_t lead = misaligned % bytes != 0 ? 0 : std::min<int64_t>(h, int64_t((64u - misaligned) % 64u / bytes));
    for (int64_t e = 0; e < lead;) {
        const int64_t cols = std::min<int64_t>(kW, lead - e);
        gradColumnsPart<V, DT>(rows, k, e, cols, dy, u, du);
        e += cols;
    }
    // Blocks of kGradColumns columns, in each one row at a time, du loaded and stored per row:
    // du, u and dy of a block (3 KiB) stay in L1 while the rows go through it (whole rows at a
    // time streamed 48 KiB of them per row through a 32 KiB L1), and each row still writes whole
    // runs of 8-16 lines (interleaving the rows' non-temporal stores by one or two lines made the
    // backward slower on AMD EPYC Zen 3: write-combining; 64-column blocks gained nothing on Zen 4).
    // Per column the rows come in the same order: the same bits as whole rows.
    const int64_t vecEnd = lead + (h - lead) / (2 * kW) * (2 * kW);
    for (int64_t c0 = lead; c0 < vecEnd; c0 += kGradColumns) {
        const int64_t c1 = std::min(vecEnd, c0 + kGradColumns);
        for (int64_t i = 0; i < k; ++i) {
            const GradSource& r = rows[i];
            const typename V::F vp = V::set1(r.p), vu = V::set1(r.coefU), vv = V::set1(r.coefV);
            const char* ahead = next[i];
            const char* ahead2 = i == 0 ? next[k] : nullptr;  // with row 0, the next gradHidden row
            for (int64_t e = c0; e < c1; e += 2 * kW) {
                for (int64_t line = 0; line < 2 * kW * bytes; line += 64) {
                    if (ahead != nullptr) __builtin_prefetch(ahead + e * bytes + line, 0, 3);
                    if (ahead2 != nullptr) __builtin_prefetch(ahead2 + e * bytes + line, 0, 3);
                }
                for (int j = 0; j < 2; ++j) {
                    const int64_t f = e + j * kW;
                    const typename V::F x = loadFull<V>(r.src, f, DT);
                    V::storeu(du + f, V::fmadd(vu, x, V::loadu(du + f)));
                    storeFull<V>(r.dst, f, DT,
                                 V::fnmadd(vv, x, V::fmadd(vu, V::loadu(u + f), V::mul(vp, V::loadu(dy + f)))), STREAM);
                }
            }
        }
    }
    for (int64_t e = vecEnd; e < h;) {  // the last 1 to 31 columns
        const int64_t cols = std::min<int64_t>(kW, h - e);
        gradColumnsPart<V, DT>(rows, k, e, cols, dy, u, du);
        e += cols;
    }
}

// The backward of one token through gradColumns; false (nothing done) when a source or gradient
// row is not contiguous or the token has more than kMaxPrefetchRows sources: then
// backwardTokens' row-by-row passes (which give the same bits).
template <class V>
ATTNOPS_BAR_STREAM_INLINE bool backwardTokenByColumns(const BackwardParams& p, const float* u, int64_t t, int64_t t1,
                                                      const float* dy, float* du, bool stream) {
    const Sources& s = p.src;
    const int64_t h = s.hidden, k = s.blocks + 1, n = s.blocks;
    if (k > kMaxPrefetchRows) return false;
    GradSource rows[kMaxPrefetchRows];
    const char* next[kMaxPrefetchRows + 1];
    for (int64_t i = 0; i < k; ++i) {
        const View3& v = i < n ? s.blockRes : s.partial;
        const MutView3& out = i < n ? p.gradBlockRes : p.gradPartial;
        const int64_t row = i < n ? i : 0;
        rows[i].src = contiguousRow(v, t, row);
        rows[i].dst = contiguousRow(out, t, row);
        if (rows[i].src == nullptr || rows[i].dst == nullptr) return false;
        next[i] = t + 1 < t1 ? static_cast<const char*>(contiguousRow(v, t + 1, row)) : nullptr;
    }
    next[k] = t + 1 < t1 ? static_cast<const char*>(contiguousRow(p.gradHidden, t + 1, 0)) : nullptr;
    // Pass 1: a_i = dy . v_i and c_i = u . v_i, reading each row once (no fp32 copy kept).
    // a-bar in double: when one p_i is close to 1, a_i - a-bar cancels to a few fp32 ulps.
    float a[kMaxPrefetchRows], c[kMaxPrefetchRows];
    const DType dtype = s.partial.dtype;
    double abar = 0.0;
    for (int64_t i = 0; i < k; ++i) {
        if (dtype == DType::BF16)
            rowDots<V, DType::BF16, false, false>(rows[i].src, h, dy, u, nullptr, a[i], c[i]);
        else if (dtype == DType::F16)
            rowDots<V, DType::F16, false, false>(rows[i].src, h, dy, u, nullptr, a[i], c[i]);
        else
            rowDots<V, DType::F32, false, false>(rows[i].src, h, dy, u, nullptr, a[i], c[i]);
        rows[i].p = p.probs.load(t, i, 0);
        abar += double(rows[i].p) * double(a[i]);
    }
    const float invH = h > 0 ? 1.0f / float(h) : 0.0f;
    for (int64_t i = 0; i < k; ++i) {
        const float ri = p.invNorm.load(t, i, 0);
        const float ds = float(double(rows[i].p) * (double(a[i]) - abar));
        rows[i].coefU = ds * ri;
        rows[i].coefV = ds * ri * ri * ri * c[i] * invH;
    }
    // Pass 2: dv_i = p_i dy + ds_i r_i u - (ds_i r_i^3 c_i / H) v_i; du += ds_i r_i v_i.
    if (stream) {
        if (dtype == DType::BF16)
            gradColumns<V, DType::BF16, true>(rows, k, h, dy, u, du, next);
        else if (dtype == DType::F16)
            gradColumns<V, DType::F16, true>(rows, k, h, dy, u, du, next);
        else
            gradColumns<V, DType::F32, true>(rows, k, h, dy, u, du, next);
    } else {
        if (dtype == DType::BF16)
            gradColumns<V, DType::BF16, false>(rows, k, h, dy, u, du, next);
        else if (dtype == DType::F16)
            gradColumns<V, DType::F16, false>(rows, k, h, dy, u, du, next);
        else
            gradColumns<V, DType::F32, false>(rows, k, h, dy, u, du, next);
    }
    return true;
}

template <class V>
ATTNOPS_BAR_STREAM_TARGET void backwardTokens(const BackwardParams& p, const float* u, int64_t t0, int64_t t1,
                                              float* du, void* scratchBase) {
    const Sources& s = p.src;
    const int64_t h = s.hidden, k = s.blocks + 1, n = s.blocks;
    const scratch::Backward sc(s, scratchBase);
    const bool cached = sc.cached;
    float *dy = sc.dy, *a = sc.a, *c = sc.c;
    const float invH = h > 0 ? 1.0f / float(h) : 0.0f;
    const bool stream = outputBytes(p.gradBlockRes, uint64_t(s.tokens) * uint64_t(k) * uint64_t(h)) > kStreamOutputBytes;
    const int64_t aheadBytes = elementBytes(s.partial.dtype);
    for (int64_t t = t0; t < t1; ++t) {
        loadGradRow<V>(p.gradHidden, t, h, dy);
        if (backwardTokenByColumns<V>(p, u, t, t1, dy, du, stream)) continue;
        // Pass 1: a_i = dy . v_i and c_i = u . v_i, reading each row once. a-bar in double: when
        // one p_i is close to 1, a_i - a-bar cancels to a few fp32 ulps (see bar_vector.cpp).
        double abar = 0.0;
        for (int64_t i = 0; i < k; ++i) {
            loadWithDots<V>(s, t, i, dy, u, sc.row(i), a[i], c[i]);
            abar += double(p.probs.load(t, i, 0)) * double(a[i]);
        }
        // Pass 2: dv_i = p_i dy + ds_i r_i u - (ds_i r_i^3 c_i / H) v_i; du += ds_i r_i v_i.
        for (int64_t i = 0; i < k; ++i) {
            float* x = sc.row(i);
            if (!cached) {
                float unused[2];
                loadWithDots<V>(s, t, i, dy, u, x, unused[0], unused[1]);
            }
            const float pi = p.probs.load(t, i, 0), ri = p.invNorm.load(t, i, 0);
            const float ds = float(double(pi) * (double(a[i]) - abar));
            const float coefU = ds * ri, coefV = ds * ri * ri * ri * c[i] * invH;
            const MutView3& out = i < n ? p.gradBlockRes : p.gradPartial;
            const int64_t row = i < n ? i : 0;
            void* dst = storesDirect(out, t, row, stream) ? contiguousRow(out, t, row) : nullptr;
            // The next token's row i, and with row 0 its gradHidden row (bytes of the main dtype).
            const char* ahead = nullptr;
            const char* ahead2 = nullptr;
            if (t + 1 < t1) {
                ahead = static_cast<const char*>(contiguousRow(i < n ? s.blockRes : s.partial, t + 1, row));
                if (i == 0) ahead2 = static_cast<const char*>(contiguousRow(p.gradHidden, t + 1, 0));
            }
            if (stream)
                gradRowAs<V, true>(out.dtype, dst, h, x, dy, u, du, pi, coefU, coefV, ahead, ahead2, aheadBytes);
            else
                gradRowAs<V, false>(out.dtype, dst, h, x, dy, u, du, pi, coefU, coefV, ahead, ahead2, aheadBytes);
            if (dst == nullptr) storeRow<V>(out, t, row, h, x, stream);
        }
    }
    if (stream) V::fence();
}

}  // namespace
}  // namespace attnops::bar

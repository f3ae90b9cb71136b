// The fused backward's work split (the scheme without recomputation; cpu/simd/fa_backward.hpp):
// the query rows of every (sequence, kv head) are cut into chunks of chunkRows rows, a multiple
// of the kernel's query block, computed from the problem alone (never from the thread count or
// the core count), so that the results are the same bits for any thread count.
//
// A chunk unit computes the dq rows of its chunk completely (for every query head of the group,
// over all keys ascending) and, over its rows only, a partial dk and dv of every key block its
// rows may see. Where a sequence has one chunk, that partial is the whole sum and goes straight
// to dk and dv; otherwise each chunk writes it to its own slice of the workspace and a reduction
// unit per (sequence, kv head, key block) adds the slices over the chunks in ascending order.
// Workspace: the partials of every chunked head at once, bounded by kMaxPartialBytes.
#pragma once

#include <algorithm>
#include <cstdint>

#include "ops/flash_attention_score/params.hpp"
#include "ops/flash_attention_score/semantics.hpp"

namespace attnops::fa::chunks {

// Units the split aims at, whatever the machine: enough for 32-64 cores. The number of
// (sequence, kv head) pairs counts towards it; only problems with fewer than kWholePairs pairs
// are cut.
constexpr int64_t kTargetUnits = 64;
// Pairs from which every (sequence, kv head) is one unit, with no partials: with this many the
// pairs already balance a few cores, and the partial dK/dV of a cut (written, read back and
// added: 4 chunks of 16 heads at S = 2048, D = 128 are 128 MiB of fresh workspace) cost 8% of
// the dense BNSD N = 16 S = 2048 fp32 backward on 2 Zen 3 cores (bench/results/amd-epyc-zen3-avx2/NOTES.md).
constexpr int64_t kWholePairs = 16;
// Fewest query rows (over the group's heads) per chunk: below that, the per-key-block loads and
// the partial dk, dv traffic start to weigh against the chunk's five GEMMs (callgrind, AVX2, one
// head-pair of S = 512 cut in 360 + 152 rows: 3% more instructions than one chunk).
constexpr int64_t kMinGroupRows = 512;
// Bound on the partials of all chunked heads together (fp32 dk, dv per chunk and key).
constexpr uint64_t kMaxPartialBytes = uint64_t(256) << 20;
// Bound on one chunk's per-thread rows (Q, dO, dQ and the row statistics over the group, and
// with bf16 pairs Q and dO packed): 128 MiB, about 47K rows at d = dv = 128.
constexpr uint64_t kMaxChunkRowsBytes = uint64_t(128) << 20;

inline int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Chunks of a sequence of sq query rows (at least one, so that its dk, dv rows are written).
inline int64_t chunksOf(int64_t sq, int64_t chunkRows) { return std::max<int64_t>(1, ceilDiv(sq, chunkRows)); }

// Bound on the floats (4-byte elements) of one chunk's per-thread rows: group * chunkRows rows of
// Q, dO (leading dimensions padded by at most 32), dQ and four row statistics, and for the
// bf16-pair kernel Q and dO packed as column pairs and as row pairs (d + dv + 2 per row, d + dv
// per head for an odd row). The same bound for every kernel, so that the split does not depend
// on which one runs.
inline uint64_t chunkRowsFloats(const ForwardParams& p, int64_t chunkRows) {
    const uint64_t rows = uint64_t(p.group) * uint64_t(chunkRows);
    return rows * uint64_t(p.d + 32 + p.dv + 32 + p.d + 4 + p.d + p.dv + 2) + uint64_t(p.group) * uint64_t(p.d + p.dv) +
           128;
}

// Floats of the partial dk and dv of sequence b's chunked heads (0 when it has one chunk).
inline uint64_t partialFloatsOf(const ForwardParams& p, int64_t b, int64_t chunkRows) {
    const int64_t c = chunksOf(p.seq.qLen[size_t(b)], chunkRows);
    if (c == 1) return 0;
    return uint64_t(p.n2) * uint64_t(c) * uint64_t(p.seq.kvLen[size_t(b)]) * uint64_t(p.d + p.dv);
}

inline uint64_t partialFloats(const ForwardParams& p, int64_t chunkRows) {
    uint64_t total = 0;
    for (int64_t b = 0; b < p.seq.count; ++b) total += partialFloatsOf(p, b, chunkRows);
    return total;
}

// Rows per chunk for a kernel whose query blocks have queryRows rows and whose chunks hold at least
// minGroupRows query rows over the group's heads (where the sequence has that many); 0 when no
// split fits the bounds (the problem then goes to the two-kind scheme). A function of the
// problem's shape and the kernel only.
inline int64_t chunkRows(const ForwardParams& p, int64_t queryRows, int64_t minGroupRows = kMinGroupRows) {
    const int64_t maxQ = std::max<int64_t>(1, p.seq.maxQLen);
    const int64_t whole = ceilDiv(maxQ, queryRows) * queryRows;  // one chunk per sequence
    constexpr int64_t kMaxRows = int64_t(1) << 40;                 // no overflow below
    if (p.group * whole >= kMaxRows) return 0;
    int64_t rows = whole;
    if (p.seq.count * p.n2 < kWholePairs) {
        int64_t sumQ = 0;
        for (int64_t b = 0; b < p.seq.count; ++b) sumQ += p.seq.qLen[size_t(b)];
        const int64_t want = ceilDiv(p.n2 * sumQ, kTargetUnits);
        const int64_t least = ceilDiv(minGroupRows, p.group);
        rows = std::min(whole, ceilDiv(std::max(want, least), queryRows) * queryRows);
    }
    // The per-thread rows bound the chunk from above, the partials from below.
    while (rows > queryRows && chunkRowsFloats(p, rows) * sizeof(float) > kMaxChunkRowsBytes)
        rows = ceilDiv(rows / 2, queryRows) * queryRows;
    while (rows < whole && partialFloats(p, rows) * sizeof(float) > kMaxPartialBytes)
        rows = std::min(whole, rows * 2);
    if (chunkRowsFloats(p, rows) * sizeof(float) > kMaxChunkRowsBytes) return 0;
    if (partialFloats(p, rows) * sizeof(float) > kMaxPartialBytes) return 0;
    return rows;
}

// Key rows [k0, k1) of a block: whether chunk rows [q0, q1) of sequence b may see one of them
// (then the chunk writes its partial for the block; the reduction reads exactly those).
inline bool chunkSeesKeys(const SeqRule& rule, int64_t q0, int64_t q1, int64_t skv, int64_t k0, int64_t k1) {
    const KeyRange keys = keyRange(rule, q0, q1, skv);
    return keys.hi > k0 && keys.lo < k1 && keys.hi > keys.lo;
}

}  // namespace attnops::fa::chunks

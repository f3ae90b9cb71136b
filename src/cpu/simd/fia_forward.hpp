// The FusedInferAttentionScore forward written once over an instruction-set trait V
// (cpu/simd/microkernels.hpp), instantiated by the avx2 and avx512 entries (its Scratch and tile
// constants: cpu/simd/fia_unit.hpp; the bf16-pair decode of avx512-bf16:
// cpu/simd/fia_decode_pairs.hpp). Decode reads the KV cache once: the rows of a whole GQA group
// (G query heads x the unit's query rows) go through each key and value row of their kv head
// together, and every key/value vector is converted in registers (bf16 by a shift, fp16 by
// vcvtph2ps, int8 exactly, int4 from the nibbles of int32 containers by a variable shift up and
// an arithmetic shift down) right before the FMAs that use it, straight from where the row lies
// (strided, paged BnBsH / BnNBsD, NZ), so nothing is copied.
// When several row tiles share a block (prefill, wide GQA groups, MLA), each bf16/int8/int4 block
// is converted to fp32 once instead, in L1-sized runs of keys (packs(); the same bits).
//
// int8/int4 dequantisation (x + offset) * scale never touches the keys and values one by one: it is
// folded into the query rows, the scores, the probabilities and the final accumulators, each
// far fewer than the cache elements they meet (s scale, o offset, c channel, t or j token):
//   key, per channel:  q.k^ = sum_c (q_c s_c) k_c + sum_c q_c s_c o_c        -> q' = q * s, A = q'.o
//   key, per token:    q.k^ = s_t (q.k + o_t sum_c q_c)                       -> B = sum q
//   value, per channel: sum_j p_j v^_jc = s_c (sum_j p_j v_jc + o_c sum_j p_j) -> W = sum p
//   value, per token:   sum_j p_j v^_jc = sum_j (p_j s_j) v_jc + sum_j p_j s_j o_j -> WO
// so the inner loops are the same for every source dtype. fp32 arithmetic throughout, with the
// precision model of spec section A: probabilities rounded to the query dtype before P.V.
//
// MLA: the rope part of a score, q_rope . k_rope, continues the same dot (the query row holds
// [q ; q_rope], the key rope row is read from its own tensor at the key's row), and decode MLA's
// value is the key itself, so each page is fetched once and serves both passes. MLA full
// quantisation (int8 query x dequantScaleQuery per token and head, int8 key x per-tensor scales,
// bf16 rope): the int8 query is kept unscaled, so q.k over the int8 key is the exact integer
// (mlaFullQuant below); the rope dot is then taken apart, and the two meet per score as
// q.k * (dequantScaleQuery * keyScale) + q_rope.k_rope; the value scale ends the accumulator. pseShift is
// added per key by the shared row step (like an explicit mask), and the tree mask of sparse mode
// 9 right after it.
//
// Order of every reduction, fixed per element: q.k over the head dim (then the rope dims) in
// V::kLanes-wide lanes ascending, then the lanes by V::sum8's fixed tree; the row max and sum over keys ascending
// (per lane, then the lanes); P.V over keys ascending. Nothing depends on the thread count.
#pragma once

#include <algorithm>
#include <cstring>
#include <optional>
#include <type_traits>

#include "cpu/generic/score_row.hpp"
#include "cpu/simd/fia_decode_pairs.hpp"
#include "cpu/simd/fia_unit.hpp"
#include "cpu/simd/microkernels.hpp"
#include "ops/flash_attention_score/semantics.hpp"
#include "ops/fused_infer_attention_score/kernel.hpp"

namespace attnops::fia::simd_forward {

// out[r * ldst + k] = the lanes of acc[k * kRowTile + r] summed (sumEach's tree). Four rows of
// four keys go row by row straight from registers where V has sum16Rows, instead of through a
// stack array and 16 scalar copies (Intel Xeon with AMX, one thread, dotRows on 128 int8 keys of
// D 128 in L1 with 4 rows, called from a harness built with GCC 12 -O3 as the library is: 10.6 ns
// a key before, 10.0 after; the same bits).
template <class V, int NR, int NK>
ATTNOPS_SIMD_INLINE void storeSums(const typename V::Vec* acc, float* out, int64_t ldst) {
    if constexpr (NR == 4 && NK == 4 && requires { V::sum16Rows(acc, out, ldst); }) {
        typename V::Vec byRow[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) byRow[i] = acc[(i % 4) * kRowTile + i / 4];
        V::sum16Rows(byRow, out, ldst);
    } else {
        constexpr int kAcc = int(NK * kRowTile);
        alignas(64) float sums[kAcc];
        sumEach<V, kAcc>(acc, sums);
        for (int k = 0; k < NK; ++k)
            for (int r = 0; r < NR; ++r) out[r * ldst + k] = sums[k * kRowTile + r];
    }
}

// st[r * ldst + k] = q_r . key_k for NR rows and the NK keys at keys[0 .. NK): NK x kRowTile
// accumulators, each query vector loaded once for the NK keys. Dense: vector v of a row starts
// at element v * kLanes (the chunk table is not read: no index load per vector). MLA: the rope
// dims (key rope rows of dtype TR) continue the same dot, or with Split (MLA full quantisation)
// make a dot of their own, stored to sr[r * ldst + k], in the same registers once the first is
// stored.
template <class V, DType T, DType TR, int NR, int NK, bool Dense, bool Split>
ATTNOPS_SIMD_INLINE void dotStep(int64_t d, const char* const* keys, const int64_t* kChunk, int64_t dr,
                                 const char* const* ropes, const int64_t* rChunk, const float* q, int64_t ldq,
                                 float* st, float* sr, int64_t ldst) {
    using Vec = typename V::Vec;
    constexpr int kAcc = int(NK * kRowTile);
    Vec acc[kAcc];
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) acc[i] = V::zero();
    for (int64_t c = 0, v = 0; c < d; c += V::kLanes, ++v) {
        const int64_t at = Dense ? c : kChunk[v];
        Vec x[NK];
#pragma GCC unroll 4
        for (int k = 0; k < NK; ++k) x[k] = loadVec<V, T>(keys[k], at);
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
            Vec qv = V::load(q + r * ldq + c);
            keepInRegister<V>(qv);
#pragma GCC unroll 4
            for (int k = 0; k < NK; ++k) acc[k * kRowTile + r] = V::fmadd(qv, x[k], acc[k * kRowTile + r]);
        }
    }
    if constexpr (Split) {
        storeSums<V, NR, NK>(acc, st, ldst);
#pragma GCC unroll 16
        for (int i = 0; i < kAcc; ++i) acc[i] = V::zero();
    }
    for (int64_t c = 0, v = 0; c < dr; c += V::kLanes, ++v) {  // MLA: the rope dims
        const int64_t at = rChunk[v];
        Vec x[NK];
#pragma GCC unroll 4
        for (int k = 0; k < NK; ++k) x[k] = loadVec<V, TR>(ropes[k], at);
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
            Vec qv = V::load(q + r * ldq + d + c);
            keepInRegister<V>(qv);
#pragma GCC unroll 4
            for (int k = 0; k < NK; ++k) acc[k * kRowTile + r] = V::fmadd(qv, x[k], acc[k * kRowTile + r]);
        }
    }
    storeSums<V, NR, NK>(acc, Split ? sr : st, ldst);
}

// st[r * ldst + j] = q_r . key_j for NR rows and keys j < nk, dotKeysOf<V>() keys per step (the
// last step takes the ones left); with Split the rope dots go to sr (dotStep). The first row
// tile prefetches the next block's key and value rows (`pre`, NULL for the others): a block
// ahead of their use, as the cache is read once from scattered pages. A dot's sum is the same
// whatever the step that holds it.
template <class V, DType T, DType TR, int NR, bool Dense, bool Split>
ATTNOPS_SIMD_FN void dotRows(int64_t d, const char* const* kRow, const int64_t* kChunk, int64_t dr,
                             const char* const* rRow, const int64_t* rChunk, int64_t nk, const float* q, int64_t ldq,
                             float* st, float* sr, int64_t ldst, const Scratch* pre) {
    constexpr int64_t kKeys = dotKeysOf<V>();
    static_assert(kKeys == 3 || kKeys == 4, "the remainder below takes one to three keys");
    for (int64_t j = 0; j < nk; j += kKeys) {
        if (pre != nullptr)
            for (int64_t i = j; i < std::min(j + kKeys, pre->preRows); ++i) {
                prefetchRow(pre->kPre[i], pre->kLines, pre->kLineCount);
                if (pre->prefetchValues) prefetchRow(pre->vPre[i], pre->vLines, pre->vLineCount);
                if (dr > 0 && i < pre->nextRows) prefetchRow(pre->rNext[i], pre->rLines, pre->rLineCount);
            }
        const char* const* ropes = dr > 0 ? rRow + j : nullptr;
        float* srj = Split ? sr + j : nullptr;
        switch (std::min(kKeys, nk - j)) {
            case 1: dotStep<V, T, TR, NR, 1, Dense, Split>(d, kRow + j, kChunk, dr, ropes, rChunk, q, ldq, st + j, srj, ldst); break;
            case 2: dotStep<V, T, TR, NR, 2, Dense, Split>(d, kRow + j, kChunk, dr, ropes, rChunk, q, ldq, st + j, srj, ldst); break;
            case 3: dotStep<V, T, TR, NR, 3, Dense, Split>(d, kRow + j, kChunk, dr, ropes, rChunk, q, ldq, st + j, srj, ldst); break;
            default:
                if constexpr (kKeys == 4)
                    dotStep<V, T, TR, NR, 4, Dense, Split>(d, kRow + j, kChunk, dr, ropes, rChunk, q, ldq, st + j, srj, ldst);
                break;
        }
    }
}

// acc[r * ldacc + c .. + NV * kLanes) += sum_j st[r * ldst + j] * value_j[c ..] for NR rows,
// keys ascending. SkipZero: keys whose probability is 0 in every row are skipped (masked keys
// never touch the output, even if their values are not finite). Dense as in dotRows.
template <class V, DType T, int NR, int NV, bool SkipZero, bool Dense>
ATTNOPS_SIMD_FN void accumulateColumns(int64_t c, const char* const* vRow, const int64_t* vChunk, int64_t nk,
                                       const float* st, int64_t ldst, float* acc, int64_t ldacc) {
    using Vec = typename V::Vec;
    constexpr int64_t L = V::kLanes;
    int64_t at[NV];
    for (int v = 0; v < NV; ++v) at[v] = Dense ? c + v * L : vChunk[c / L + v];
    Vec a[kRowTile][NV];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) a[r][v] = V::load(acc + r * ldacc + c + v * L);
    for (int64_t j = 0; j < nk; ++j) {
        if constexpr (SkipZero) {
            bool any = false;
            for (int r = 0; r < NR; ++r) any = any || st[r * ldst + j] != 0.0f;
            if (!any) continue;
        }
        Vec x[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) x[v] = loadVec<V, T>(vRow[j], at[v]);
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
            const Vec pb = V::set1(st[r * ldst + j]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) a[r][v] = V::fmadd(pb, x[v], a[r][v]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) V::store(acc + r * ldacc + c + v * L, a[r][v]);
}

// All dv columns in strips of W vectors (W = 3 with AVX2: 4 rows x 3 accumulators + 3 values + 1
// broadcast probability = its 16 ymm registers; W = 4 with AVX-512's 32 zmm), then the vectors
// left. One vector left over after at least one wide strip goes with the last wide strip as
// strips of 2 + 2 (W 3) or 3 + 2 (W 4): a one-vector strip has only NR accumulators, so each key
// waits for the FMA latency (4 cycles on Zen 3) instead of the FMA throughput. On an Intel Xeon
// with AMX (one thread, accumulateRows on 128 int8 value rows of dv 128 in L1 with 4 rows, from a
// harness built with GCC 12 -O3, three interleaved runs) a key took 7.9-8.0 ns in strips of 4
// against 8.3-8.8 in strips of 3 + 3 + 2. Each column still takes the keys in the same order:
// the same bits.
template <class V, DType T, int NR, bool SkipZero, bool Dense>
ATTNOPS_SIMD_FN void accumulateRows(int64_t dv, const char* const* vRow, const int64_t* vChunk, int64_t nk,
                                    const float* st, int64_t ldst, float* acc, int64_t ldacc) {
    constexpr int64_t L = V::kLanes;
    constexpr int W = L == 16 ? 4 : 3;
    const int64_t vectors = (dv + L - 1) / L;
    int64_t wide = vectors / W, left = vectors % W;
    if (left == 1 && wide > 0) --wide, left += W;
    int64_t c = 0;
    for (int64_t i = 0; i < wide; ++i, c += W * L)
        accumulateColumns<V, T, NR, W, SkipZero, Dense>(c, vRow, vChunk, nk, st, ldst, acc, ldacc);
    // left: W + 1 (as W - 1 and 2), or 0 to W - 1
    if (left > W - 1) {
        accumulateColumns<V, T, NR, W - 1, SkipZero, Dense>(c, vRow, vChunk, nk, st, ldst, acc, ldacc);
        c += (W - 1) * L, left -= W - 1;
    }
    switch (left) {
        case 3: accumulateColumns<V, T, NR, 3, SkipZero, Dense>(c, vRow, vChunk, nk, st, ldst, acc, ldacc); break;
        case 2: accumulateColumns<V, T, NR, 2, SkipZero, Dense>(c, vRow, vChunk, nk, st, ldst, acc, ldacc); break;
        case 1: accumulateColumns<V, T, NR, 1, SkipZero, Dense>(c, vRow, vChunk, nk, st, ldst, acc, ldacc); break;
        default: break;
    }
}

// The row tiles of R rows, each tile of NR = min(kRowTile, rows left) rows.
template <class V, DType T, DType TR, bool Dense, bool Split>
ATTNOPS_SIMD_FN void dotTiles(int64_t R, int64_t d, int64_t dr, const Scratch& sc, int64_t nk, int64_t ldst) {
    const int64_t ldq = d + dr;
    for (int64_t r0 = 0; r0 < R; r0 += kRowTile) {
        const float* q = sc.q + r0 * ldq;
        float* st = sc.st + r0 * ldst;
        float* sr = Split ? sc.sr + r0 * ldst : nullptr;
        const Scratch* pre = r0 == 0 ? &sc : nullptr;
        const char* const* kr = sc.kRow;
        switch (std::min(kRowTile, R - r0)) {
            case 1: dotRows<V, T, TR, 1, Dense, Split>(d, kr, sc.kChunk, dr, sc.rRow, sc.rChunk, nk, q, ldq, st, sr, ldst, pre); break;
            case 2: dotRows<V, T, TR, 2, Dense, Split>(d, kr, sc.kChunk, dr, sc.rRow, sc.rChunk, nk, q, ldq, st, sr, ldst, pre); break;
            case 3: dotRows<V, T, TR, 3, Dense, Split>(d, kr, sc.kChunk, dr, sc.rRow, sc.rChunk, nk, q, ldq, st, sr, ldst, pre); break;
            default: dotRows<V, T, TR, 4, Dense, Split>(d, kr, sc.kChunk, dr, sc.rRow, sc.rChunk, nk, q, ldq, st, sr, ldst, pre); break;
        }
    }
}

template <class V, DType T, DType TR = T, bool Split = false>
ATTNOPS_SIMD_FN void dots(int64_t R, int64_t d, int64_t dr, const Scratch& sc, int64_t nk, int64_t ldst) {
    if (sc.kDense)
        dotTiles<V, T, TR, true, Split>(R, d, dr, sc, nk, ldst);
    else
        dotTiles<V, T, TR, false, Split>(R, d, dr, sc, nk, ldst);
}

template <class V, DType T, bool SkipZero, bool Dense>
ATTNOPS_SIMD_FN void accumulateTiles(int64_t R, int64_t dv, const Scratch& sc, int64_t nk, int64_t ldst) {
    for (int64_t r0 = 0; r0 < R; r0 += kRowTile) {
        const float* st = sc.st + r0 * ldst;
        float* acc = sc.acc + r0 * dv;
        switch (std::min(kRowTile, R - r0)) {
            case 1: accumulateRows<V, T, 1, SkipZero, Dense>(dv, sc.vRow, sc.vChunk, nk, st, ldst, acc, dv); break;
            case 2: accumulateRows<V, T, 2, SkipZero, Dense>(dv, sc.vRow, sc.vChunk, nk, st, ldst, acc, dv); break;
            case 3: accumulateRows<V, T, 3, SkipZero, Dense>(dv, sc.vRow, sc.vChunk, nk, st, ldst, acc, dv); break;
            default: accumulateRows<V, T, 4, SkipZero, Dense>(dv, sc.vRow, sc.vChunk, nk, st, ldst, acc, dv); break;
        }
    }
}

template <class V, DType T, bool SkipZero>
ATTNOPS_SIMD_FN void accumulate(int64_t R, int64_t dv, const Scratch& sc, int64_t nk, int64_t ldst) {
    if (sc.vDense)
        accumulateTiles<V, T, SkipZero, true>(R, dv, sc, nk, ldst);
    else
        accumulateTiles<V, T, SkipZero, false>(R, dv, sc, nk, ldst);
}

// The scores of a block from the cache rows; MLA full quantisation: int8 keys, a bf16 rope dot
// apart (accepts() admits no other key or rope dtype then).
template <class V>
ATTNOPS_SIMD_FN void dotsOf(const Params& p, DType t, int64_t R, int64_t d, int64_t dr, const Scratch& sc, int64_t nk,
                            int64_t ldst) {
    if (mlaFullQuant(p)) return dots<V, DType::I8, DType::BF16, true>(R, d, dr, sc, nk, ldst);
    switch (t) {
        case DType::F16: return dots<V, DType::F16>(R, d, dr, sc, nk, ldst);
        case DType::BF16: return dots<V, DType::BF16>(R, d, dr, sc, nk, ldst);
        case DType::I4: return dots<V, DType::I4>(R, d, dr, sc, nk, ldst);
        default: return dots<V, DType::I8>(R, d, dr, sc, nk, ldst);
    }
}

template <class V, bool SkipZero>
ATTNOPS_SIMD_FN void accumulateOf(DType t, int64_t R, int64_t dv, const Scratch& sc, int64_t nk, int64_t ldst) {
    switch (t) {
        case DType::F16: return accumulate<V, DType::F16, SkipZero>(R, dv, sc, nk, ldst);
        case DType::BF16: return accumulate<V, DType::BF16, SkipZero>(R, dv, sc, nk, ldst);
        case DType::I4: return accumulate<V, DType::I4, SkipZero>(R, dv, sc, nk, ldst);
        default: return accumulate<V, DType::I8, SkipZero>(R, dv, sc, nk, ldst);
    }
}

inline int64_t elementBytes(DType t) { return t == DType::I8 ? 1 : 2; }
// Bytes of `elements` stored elements (packed int4: two per byte; the offsets passed are even).
inline int64_t byteOffset(DType t, int64_t elements) { return t == DType::I4 ? elements / 2 : elements * elementBytes(t); }

// Element offset of vector v of a row (NZ: vector v lies in dim group v * kLanes / dimGroup),
// and the byte offsets of the row's vectors that start a new cache line; returns their count.
inline int64_t chunkOffsets(const KvSource& s, int64_t dim, int64_t lanes, int64_t* chunk, int64_t* lines) {
    int64_t count = 0;
    for (int64_t c = 0, v = 0; c < dim; c += lanes, ++v) {
        chunk[v] = s.dimOffset(c);
        const int64_t at = byteOffset(s.dtype, chunk[v]);
        if (count == 0 || at / kLineBytes != lines[count - 1] / kLineBytes) lines[count++] = at;
    }
    return count;
}

// Whether vector v of a row starts at element v * lanes for every v (not NZ dim groups), so the
// microkernels may compute the offsets instead of reading them.
inline bool denseChunks(const int64_t* chunk, int64_t dim, int64_t lanes) {
    for (int64_t c = 0, v = 0; c < dim; c += lanes, ++v)
        if (chunk[v] != c) return false;
    return true;
}

// Addresses of rows [k0, k0 + nk) of kv head m of batch b: one table lookup per page, then
// rowStride steps (no division per row).
inline void sourceRows(const Params& p, const KvSource& s, int64_t b, int64_t m, int64_t k0, int64_t nk,
                       const char** rows) {
    const char* base = static_cast<const char*>(s.data);
    const int64_t step = byteOffset(s.dtype, s.rowStride);
    if (hasKvParts(s)) {  // shared prefix or tensor-list rows: each row from its own tensor (int4: even offsets)
        for (int64_t j = 0; j < nk; ++j) {
            const KvAddress a = kvAddress(p, s, b, m, k0 + j);
            rows[j] = static_cast<const char*>(a.data) + byteOffset(s.dtype, a.at);
        }
        return;
    }
    const int64_t run = p.table.data == nullptr ? nk : p.table.blockSize;  // rows that step by rowStride
    for (int64_t j = 0; j < nk;) {
        const int64_t t = k0 + j, n = std::min(nk - j, run - (p.table.data == nullptr ? 0 : t % run));
        const char* row = base + byteOffset(s.dtype, kvRowOffset(p, s, b, m, t));
        for (int64_t i = 0; i < n; ++i, row += step) rows[j + i] = row;
        j += n;
    }
}
inline void keyRows(const Params& p, int64_t b, int64_t m, int64_t k0, int64_t nk, const char** rows) {
    sourceRows(p, p.key, b, m, k0, nk, rows);
}
inline void valueRows(const Params& p, int64_t b, int64_t m, int64_t k0, int64_t nk, const char** rows) {
    sourceRows(p, p.value, b, m, k0, nk, rows);
}

// Per-token scale and offset of rows [k0, k0 + nk) of kv head m of batch b (1 and 0 unless the
// source is per-token quantised; modes 3-5 index them by head and/or through the block table).
inline void tokenTerms(const Params& p, const AntiquantSpec& q, int64_t b, int64_t m, int64_t k0, int64_t nk, float* scale,
                       float* offset) {
    // Padded to whole vectors (1 and 0), which the score and softmax steps read past nk.
    const int64_t padded = alignUp(nk);
    if (q.mode != Antiquant::PerToken) {
        std::fill(scale, scale + padded, 1.0f);
        std::fill(offset, offset + padded, 0.0f);
        return;
    }
    for (int64_t j = 0; j < nk; ++j) tokenTerm(p.table, q, b, m, k0 + j, scale[j], offset[j]);
    std::fill(scale + nk, scale + padded, 1.0f);
    std::fill(offset + nk, offset + padded, 0.0f);
}

// Per-channel scale and offset of channel c of kv head m (one entry: per tensor).
inline float channelScale(const AntiquantSpec& q, int64_t m, int64_t c) {
    return q.scale.size() == 1 ? q.scale[0] : q.scale[size_t(m * q.headDim + c)];
}
inline float channelOffset(const AntiquantSpec& q, int64_t m, int64_t c) {
    if (q.offset.empty()) return 0.0f;
    return q.offset.size() == 1 ? q.offset[0] : q.offset[size_t(m * q.headDim + c)];
}

// The query rows of the group, the key dequantisation folded in (A, B of the file comment).
template <class V>
ATTNOPS_SIMD_FN void loadQueries(const Params& p, const WorkUnit& u, int64_t rows, Scratch& sc) {
    const fa::ForwardParams& c = p.core;
    const int64_t d = c.d, qRow0 = c.seq.qStart[size_t(u.b)] + u.q0;
    const AntiquantSpec& kq = p.keyQuant;
    for (int64_t g = 0; g < c.group; ++g)
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t i = g * rows + r;
            float* q = sc.q + i * (d + p.ropeDim);
            const int64_t n1 = u.n2 * c.group + g;
            if (p.ropeDim > 0) simd::loadRow<V>(p.queryRope, u.b, n1, qRow0 + r, p.ropeDim, q + d);
            if (mlaFullQuant(p)) {  // the int8 query as it is (exact dots); its scale and the key's go to qs
                const auto* q8 = static_cast<const int8_t*>(c.q.data) + c.q.offset(u.b, n1, qRow0 + r, 0);
                for (int64_t e = 0; e < d; ++e) q[e] = float(q8[e * c.q.stride[3]]);
                sc.qs[i] = p.queryDequant.at(u.b, n1, qRow0 + r) * kq.scale[0];
                sc.qa[i] = sc.qb[i] = 0.0f;
                continue;
            }
            simd::loadRow<V>(c.q, u.b, n1, qRow0 + r, d, q);
            float a = 0.0f, bsum = 0.0f;
            if (kq.mode == Antiquant::PerChannel) {
                for (int64_t e = 0; e < d; ++e) {
                    q[e] *= channelScale(kq, u.n2, e);
                    a += q[e] * channelOffset(kq, u.n2, e);
                }
            } else if (kq.mode == Antiquant::PerToken) {
                for (int64_t e = 0; e < d; ++e) bsum += q[e];
            }
            sc.qa[i] = a;
            sc.qb[i] = bsum;
        }
}

// Raw dots of row i -> finished scores (dequantisation terms, scale; with `masked`, the band and
// the explicit mask through the shared row step). MLA full quantisation (`rope` not NULL): the
// raw dot is the exact integer q.k, scaled by qs (dequantScaleQuery x key scale) and joined by
// the rope dot. Returns the row max over kept keys (-inf if none, NaN if a kept score is NaN).
template <class V>
ATTNOPS_SIMD_FN float finishRowScores(const Params& p, const WorkUnit& u, const fa::SeqRule& rule, int64_t g,
                                      int64_t row, int64_t k0, int64_t nk, int64_t skv, bool masked, const Scratch& sc,
                                      float* s, float a, float bsum, const float* rope, float qs) {
    using Vec = typename V::Vec;
    const Vec av = V::set1(a), bv = V::set1(bsum), scale = V::set1(masked ? 1.0f : p.core.scale), qsv = V::set1(qs);
    Vec mx = V::set1(kNegInf);
    auto nan = V::none();
    for (int64_t j = 0; j < nk; j += V::kLanes) {  // lanes from nk on: scratch, left out by mk
        const auto mk = V::tail(nk - j);
        const Vec raw = rope == nullptr ? V::load(s + j) : V::fmadd(V::load(s + j), qsv, V::load(rope + j));
        const Vec x = V::mul(V::mul(V::load(sc.kScale + j), V::add(V::add(raw, av), V::mul(V::load(sc.kOffset + j), bv))),
                             scale);
        V::store(s + j, x);
        nan = V::maskOr(nan, V::maskAnd(mk, V::isNan(x)));
        mx = V::max(mx, V::select(mk, V::set1(kNegInf), x));
    }
    if (masked) {
        const float m = fa::tile::finishScores(p.core, u.b, u.n2 * p.core.group + g, rule, row, k0, nk, skv, s, sc.kept);
        return p.tree != nullptr ? applyTreeMask(p, u.b, row, k0, nk, s, sc.kept) : m;
    }
    if (V::any(nan)) return __builtin_nanf("");
    alignas(64) float lanes[V::kLanes];
    V::store(lanes, mx);
    float m = kNegInf;
    for (float x : lanes) m = x > m ? x : m;
    return m;
}

// Online-softmax update of row i with a block of finished scores s: s becomes the rounded
// probabilities times the value token scales, and m, l, w, wo and the accumulator row are
// rescaled and updated.
template <class V>
ATTNOPS_SIMD_FN void softmaxRow(const Params& p, int64_t nk, float rowMax, float* s, const Scratch& sc, int64_t i) {
    using Vec = typename V::Vec;
    const float mOld = sc.m[i];
    const float mNew = (rowMax > mOld || rowMax != rowMax) ? rowMax : mOld;
    const float alpha = mOld == kNegInf ? 0.0f : cpu::fastExp(mOld - mNew);
    const Vec mv = V::set1(mNew);
    Vec sum = V::zero(), w = V::zero(), wo = V::zero();
    for (int64_t j = 0; j < nk; j += V::kLanes) {  // lanes from nk on get probability 0
        const auto mk = V::tail(nk - j);
        const Vec e = V::zeroUnless(mk, simd::exp<V>(V::sub(V::load(s + j), mv)));
        sum = V::add(sum, e);
        Vec pr = e;
        if (p.probDType == DType::BF16) pr = V::roundBf16(e);
        if (p.probDType == DType::F16) pr = V::roundHalf(e);
        pr = V::mul(pr, V::load(sc.vScale + j));
        w = V::add(w, pr);
        wo = V::fmadd(pr, V::load(sc.vOffset + j), wo);
        V::store(s + j, pr);
    }
    sc.l[i] = sc.l[i] * alpha + V::sumLanes(sum);
    sc.w[i] = sc.w[i] * alpha + V::sumLanes(w);
    sc.wo[i] = sc.wo[i] * alpha + V::sumLanes(wo);
    sc.m[i] = mNew;
    float* acc = sc.acc + i * p.core.dv;  // dv is a whole number of vectors (accepts)
    for (int64_t c = 0; c < p.core.dv; c += V::kLanes) V::store(acc + c, V::mul(V::load(acc + c), V::set1(alpha)));
}

// Packed blocks. With one row tile (a decode step of a small GQA group) each key/value vector
// is converted once anyway, straight from the cache; with several (prefill, wide groups, MLA)
// every tile would convert the block again, so from kPackTiles tiles on the block is converted
// to fp32 once per (unit, block), like the FlashAttentionScore forward's packing, in runs of
// keys small enough (kPackBytes) that a run stays in L1 while every row tile reads it: the dots
// of a run, then the next run; after the softmax, the same for the values. No bits change: the
// conversions are exact, every score is its own dot, and each accumulator still takes the keys
// in ascending order (stored and reloaded exactly between runs).
// Keys of a run of `dim`-wide fp32 rows: about kPackBytes, in whole kDotKeys steps, within [8, kKeyRows].
inline int64_t runKeys(int64_t dim) {
    return std::clamp<int64_t>(kPackBytes / (dim * int64_t(sizeof(float))) / kDotKeys * kDotKeys, 8, kKeyRows);
}

// dst[j * ld + c] = row j as fp32 for rows j of [j0, j1), c < dim (vector v at chunk[v]);
// prefetches the same rows of the next block (a block ahead of their use, as dotRows does on
// the unpacked path).
template <class V, DType T>
ATTNOPS_SIMD_FN void packRows(const char* const* rows, const int64_t* chunk, int64_t dim, int64_t j0, int64_t j1,
                              float* dst, int64_t ld, const char* const* next, int64_t nextRows, const int64_t* lines,
                              int64_t lineCount) {
    for (int64_t j = j0; j < j1; ++j) {
        if (j < nextRows) prefetchRow(next[j], lines, lineCount);
        const char* row = rows[j];
        float* out = dst + j * ld;
        for (int64_t c = 0, v = 0; c < dim; c += V::kLanes, ++v) V::store(out + c, loadVec<V, T>(row, chunk[v]));
    }
}

template <class V>
ATTNOPS_SIMD_FN void packOf(DType t, const char* const* rows, const int64_t* chunk, int64_t dim, int64_t j0, int64_t j1,
                            float* dst, int64_t ld, const char* const* next, int64_t nextRows, const int64_t* lines,
                            int64_t lineCount) {
    switch (t) {
        case DType::F16: return packRows<V, DType::F16>(rows, chunk, dim, j0, j1, dst, ld, next, nextRows, lines, lineCount);
        case DType::BF16: return packRows<V, DType::BF16>(rows, chunk, dim, j0, j1, dst, ld, next, nextRows, lines, lineCount);
        case DType::I4: return packRows<V, DType::I4>(rows, chunk, dim, j0, j1, dst, ld, next, nextRows, lines, lineCount);
        default: return packRows<V, DType::I8>(rows, chunk, dim, j0, j1, dst, ld, next, nextRows, lines, lineCount);
    }
}

// Scores of keys [j0, j1) for all R rows from packed key rows [k ; k_rope]: one dot of
// d + ropeDim (the order of the unpacked path, whose rope dims continue the same accumulators),
// or with MLA full quantisation the dot of the d key dims and that of the rope dims apart.
template <class V, bool Split>
ATTNOPS_SIMD_FN void dotsPackedRows(int64_t R, int64_t d, int64_t dr, const Scratch& sc, int64_t n,
                                    const char* const* rows, int64_t j0, int64_t ldst) {
    const int64_t dk = d + dr, dot = Split ? d : dk, rope = Split ? dr : 0;
    for (int64_t r0 = 0; r0 < R; r0 += kRowTile) {
        const float* q = sc.q + r0 * dk;
        float* st = sc.st + r0 * ldst + j0;
        float* sr = Split ? sc.sr + r0 * ldst + j0 : nullptr;
        const int64_t* pr = sc.prChunk;
        switch (std::min(kRowTile, R - r0)) {
            case 1: dotRows<V, DType::F32, DType::F32, 1, true, Split>(dot, rows, sc.pChunk, rope, rows, pr, n, q, dk, st, sr, ldst, nullptr); break;
            case 2: dotRows<V, DType::F32, DType::F32, 2, true, Split>(dot, rows, sc.pChunk, rope, rows, pr, n, q, dk, st, sr, ldst, nullptr); break;
            case 3: dotRows<V, DType::F32, DType::F32, 3, true, Split>(dot, rows, sc.pChunk, rope, rows, pr, n, q, dk, st, sr, ldst, nullptr); break;
            default: dotRows<V, DType::F32, DType::F32, 4, true, Split>(dot, rows, sc.pChunk, rope, rows, pr, n, q, dk, st, sr, ldst, nullptr); break;
        }
    }
}

template <class V>
ATTNOPS_SIMD_FN void dotsPacked(const Params& p, int64_t R, Scratch& sc, int64_t j0, int64_t j1, int64_t ldst) {
    const int64_t d = p.core.d, dk = d + p.ropeDim, n = j1 - j0, next = sc.nextRows;
    packOf<V>(p.key.dtype, sc.kRow, sc.kChunk, d, j0, j1, sc.pk, dk, sc.kPre, sc.preRows, sc.kLines, sc.kLineCount);
    if (p.ropeDim > 0)
        packOf<V>(p.keyRope.dtype, sc.rRow, sc.rChunk, p.ropeDim, j0, j1, sc.pk + d, dk, sc.rNext, next, sc.rLines,
                  sc.rLineCount);
    if (sc.prefetchValues)  // the value rows of the next block (packed later, after the softmax)
        for (int64_t j = j0; j < std::min(j1, sc.preRows); ++j) prefetchRow(sc.vPre[j], sc.vLines, sc.vLineCount);
    if (mlaFullQuant(p))
        dotsPackedRows<V, true>(R, d, p.ropeDim, sc, n, sc.pkRow + j0, j0, ldst);
    else
        dotsPackedRows<V, false>(R, d, p.ropeDim, sc, n, sc.pkRow + j0, j0, ldst);
}

// acc += P.V over keys [j0, j1) for all R rows from packed value rows (the packed key rows when
// the value is the key, packed by dotsPacked).
template <class V, bool SkipZero>
ATTNOPS_SIMD_FN void accumulatePacked(const Params& p, int64_t R, Scratch& sc, int64_t j0, int64_t j1, int64_t ldst) {
    const int64_t dv = p.core.dv;
    if (!p.valueIsKey)
        packOf<V>(p.value.dtype, sc.vRow, sc.vChunk, dv, j0, j1, sc.pv, dv, nullptr, 0, nullptr, 0);
    const char* const* rows = sc.pvRow + j0;
    for (int64_t r0 = 0; r0 < R; r0 += kRowTile) {
        const float* st = sc.st + r0 * ldst + j0;
        float* acc = sc.acc + r0 * dv;
        switch (std::min(kRowTile, R - r0)) {
            case 1: accumulateRows<V, DType::F32, 1, SkipZero, true>(dv, rows, sc.pChunk, j1 - j0, st, ldst, acc, dv); break;
            case 2: accumulateRows<V, DType::F32, 2, SkipZero, true>(dv, rows, sc.pChunk, j1 - j0, st, ldst, acc, dv); break;
            case 3: accumulateRows<V, DType::F32, 3, SkipZero, true>(dv, rows, sc.pChunk, j1 - j0, st, ldst, acc, dv); break;
            default: accumulateRows<V, DType::F32, 4, SkipZero, true>(dv, rows, sc.pChunk, j1 - j0, st, ldst, acc, dv); break;
        }
    }
}

// One kv head's part of a unit: query rows [q0, q1) of every head of kv head n2's group against
// keys [k0, k1), a key block at a time (advance, then compute). With Pairs, the bf16-pair decode
// where pairDecode() holds.
template <class V, class Pairs>
struct HeadRun {
    const Params& p;
    const TileShape t;
    const WorkUnit u;
    Scratch sc;
    const int64_t skv, rows, R, d, dv, ldst;
    const fa::SeqRule rule;
    const bool pack;
    bool pairs = false;
    int64_t k0 = 0, nk = 0;  // the block being computed

    ATTNOPS_SIMD_FN HeadRun(const Params& params, TileShape tile, const WorkUnit& unit, void* scratch)
        : p(params), t(tile), u(unit), sc(params, tile, scratch), skv(params.core.seq.kvLen[size_t(unit.b)]),
          rows(unit.q1 - unit.q0), R(params.core.group * rows),
          d(params.core.d), dv(params.core.dv), ldst(tile.keyRows),
          rule(fa::seqRule(params.core.mask, unit.b, params.core.seq.qLen[size_t(unit.b)], skv)), pack(packs(params, R)) {
        loadQueries<V>(p, u, rows, sc);
        std::fill(sc.m, sc.m + R, kNegInf);
        std::fill(sc.l, sc.l + R, 0.0f);
        std::fill(sc.w, sc.w + R, 0.0f);
        std::fill(sc.wo, sc.wo + R, 0.0f);
        std::fill(sc.acc, sc.acc + R * dv, 0.0f);
        sc.kLineCount = chunkOffsets(p.key, d, V::kLanes, sc.kChunk, sc.kLines);
        sc.vLineCount = chunkOffsets(p.value, dv, V::kLanes, sc.vChunk, sc.vLines);
        sc.rLineCount = p.ropeDim > 0 ? chunkOffsets(p.keyRope, p.ropeDim, V::kLanes, sc.rChunk, sc.rLines) : 0;
        sc.kDense = denseChunks(sc.kChunk, d, V::kLanes);
        sc.vDense = denseChunks(sc.vChunk, dv, V::kLanes);
        sc.prefetchValues = !p.valueIsKey;
        if constexpr (!std::is_void_v<Pairs>) {
            pairs = pairDecode(p, R, sc);
            if (pairs) Pairs::packFloatColumnPairs(sc.q, R, d, d, d / 2, sc.qp);  // exact: a bf16 query
        }
        if (pack) {
            const int64_t dk = d + p.ropeDim;
            for (int64_t j = 0; j < t.keyRows; ++j) {
                sc.pkRow[j] = reinterpret_cast<const char*>(sc.pk + j * dk);
                sc.pvRow[j] = p.valueIsKey ? sc.pkRow[j] : reinterpret_cast<const char*>(sc.pv + j * dv);
            }
            for (int64_t v = 0; v * V::kLanes < std::max(dk, dv); ++v) sc.pChunk[v] = v * V::kLanes;
            if (mlaFullQuant(p))
                for (int64_t v = 0; v * V::kLanes < p.ropeDim; ++v) sc.prChunk[v] = d + v * V::kLanes;
        }
        const int64_t firstRows = std::min(t.keyRows, u.k1 - u.k0);
        if (firstRows > 0) {
            keyRows(p, u.b, u.n2, u.k0, firstRows, sc.kNext);
            valueRows(p, u.b, u.n2, u.k0, firstRows, sc.vNext);
            if (p.ropeDim > 0) sourceRows(p, p.keyRope, u.b, u.n2, u.k0, firstRows, sc.rNext);
        }
    }

    // Makes the block at `from` current: its rows (found a block ahead), the next block's rows
    // (prefetched, by default this head's own: kPre = kNext), the token terms.
    ATTNOPS_SIMD_FN void advance(int64_t from) {
        k0 = from;
        nk = std::min(t.keyRows, u.k1 - k0);
        std::swap(sc.kRow, sc.kNext);
        std::swap(sc.vRow, sc.vNext);
        std::swap(sc.rRow, sc.rNext);
        sc.nextRows = std::max<int64_t>(0, std::min(t.keyRows, u.k1 - k0 - nk));
        keyRows(p, u.b, u.n2, k0 + nk, sc.nextRows, sc.kNext);
        valueRows(p, u.b, u.n2, k0 + nk, sc.nextRows, sc.vNext);
        if (p.ropeDim > 0) sourceRows(p, p.keyRope, u.b, u.n2, k0 + nk, sc.nextRows, sc.rNext);
        sc.kPre = sc.kNext;
        sc.vPre = sc.vNext;
        sc.preRows = sc.nextRows;
        tokenTerms(p, p.keyQuant, u.b, u.n2, k0, nk, sc.kScale, sc.kOffset);
        tokenTerms(p, p.valueQuant, u.b, u.n2, k0, nk, sc.vScale, sc.vOffset);
    }

    // Scores, softmax and P.V of the current block.
    ATTNOPS_SIMD_FN void compute() {
        const fa::ForwardParams& c = p.core;
        if (pairs) {
            pairDots<V, Pairs>(R, d, sc, nk, ldst);
        } else if (pack) {
            const int64_t keyRun = runKeys(d + p.ropeDim);
            for (int64_t j = 0; j < nk; j += keyRun) dotsPacked<V>(p, R, sc, j, std::min(nk, j + keyRun), ldst);
        } else {
            dotsOf<V>(p, p.key.dtype, R, d, p.ropeDim, sc, nk, ldst);
        }
        // pseShift takes the shared row step too (scale, then pse per kept key).
        const bool masked = c.mask.explicitMask || c.pse.form != fa::PseForm::None || p.tree != nullptr ||
                            !fa::blockFullyKept(rule, u.q0, u.q1, k0, k0 + nk, skv);
        for (int64_t i = 0; i < R; ++i) {
            float* s = sc.st + i * ldst;
            const int64_t g = i / rows, row = u.q0 + i % rows;
            const float* rope = mlaFullQuant(p) ? sc.sr + i * ldst : nullptr;
            const float qs = mlaFullQuant(p) ? sc.qs[i] : 1.0f;
            const float rowMax =
                finishRowScores<V>(p, u, rule, g, row, k0, nk, skv, masked, sc, s, sc.qa[i], sc.qb[i], rope, qs);
            if (rowMax == kNegInf) {  // nothing kept in this block for this row
                std::fill(s, s + nk, 0.0f);
                continue;
            }
            softmaxRow<V>(p, nk, rowMax, s, sc, i);
        }
        if (pairs && masked) {
            pairAccumulate<V, Pairs, true>(R, dv, sc, nk, ldst);
        } else if (pairs) {
            pairAccumulate<V, Pairs, false>(R, dv, sc, nk, ldst);
        } else if (pack) {
            const int64_t valueRun = runKeys(dv);
            for (int64_t j = 0; j < nk; j += valueRun) {
                if (masked)
                    accumulatePacked<V, true>(p, R, sc, j, std::min(nk, j + valueRun), ldst);
                else
                    accumulatePacked<V, false>(p, R, sc, j, std::min(nk, j + valueRun), ldst);
            }
        } else if (masked) {
            accumulateOf<V, true>(p.value.dtype, R, dv, sc, nk, ldst);
        } else {
            accumulateOf<V, false>(p.value.dtype, R, dv, sc, nk, ldst);
        }
    }

    // The value dequantisation left to the end, then the rows out (or the split's partial rows).
    ATTNOPS_SIMD_FN void finish() {
        const AntiquantSpec& vq = p.valueQuant;
        for (int64_t i = 0; i < R; ++i) {
            float* acc = sc.acc + i * dv;
            if (vq.mode == Antiquant::PerChannel)
                for (int64_t e = 0; e < dv; ++e)
                    acc[e] = channelScale(vq, u.n2, e) * (acc[e] + channelOffset(vq, u.n2, e) * sc.w[i]);
            else if (vq.mode == Antiquant::PerToken)
                for (int64_t e = 0; e < dv; ++e) acc[e] += sc.wo[i];
            emitRow(p, u, i / rows, i % rows, sc.m[i], sc.l[i], acc);
        }
    }
};

// The unit: its kv heads (WorkUnit::heads, each with scratchBytes of scratch) block by block,
// head after head within a block. One head runs as a loop over its blocks. With several (a
// cache row holding kv heads side by side: Plan::headsPerUnit), head h's dots prefetch the next
// block's rows of every head of the unit for keys [h * n / H, (h + 1) * n / H), key by key in
// head order: for BnBsH pages and BSH / BSND caches, contiguous runs of H rows' slices instead of
// one slice per key and head. Each head's arithmetic is a one-head unit's over the same key blocks
// (the plan gives such units kInterleavedKeyRows-key blocks).
template <class V, class Pairs = void>
ATTNOPS_SIMD_FN void runUnit(const Params& p, TileShape t, const WorkUnit& u, void* scratch) {
    if (u.heads <= 1) {
        HeadRun<V, Pairs> run(p, t, u, scratch);
        for (int64_t k0 = u.k0; k0 < u.k1; k0 += t.keyRows) {
            run.advance(k0);
            run.compute();
        }
        run.finish();
        return;
    }
    std::optional<HeadRun<V, Pairs>> runs[kHeadsPerUnit];
    const int64_t H = std::min(u.heads, kHeadsPerUnit);  // (the plan never gives more)
    const uint64_t perHead = headScratchBytes(scratchBytes(p, t));
    for (int64_t h = 0; h < H; ++h) runs[h].emplace(p, t, headOf(u, h), static_cast<char*>(scratch) + h * perHead);
    for (int64_t k0 = u.k0; k0 < u.k1; k0 += t.keyRows) {
        for (int64_t h = 0; h < H; ++h) runs[h]->advance(k0);
        const int64_t n = runs[0]->sc.nextRows;
        for (int64_t h = 0; h < H; ++h) {  // head h prefetches keys [j0, j1) of every head
            Scratch& sc = runs[h]->sc;
            const int64_t j0 = h * n / H, j1 = (h + 1) * n / H;
            for (int64_t j = j0; j < j1; ++j)
                for (int64_t g = 0; g < H; ++g) {
                    sc.kPreList[(j - j0) * H + g] = runs[g]->sc.kNext[j];
                    sc.vPreList[(j - j0) * H + g] = runs[g]->sc.vNext[j];
                }
            sc.kPre = sc.kPreList;
            sc.vPre = sc.vPreList;
            sc.preRows = (j1 - j0) * H;
        }
        for (int64_t h = 0; h < H; ++h) runs[h]->compute();
    }
    for (int64_t h = 0; h < H; ++h) runs[h]->finish();
}

}  // namespace attnops::fia::simd_forward

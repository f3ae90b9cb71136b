// The FusedInferAttentionScore vector kernels' shared unit parts (cpu/simd/fia_forward.hpp and
// its bf16-pair decode, cpu/simd/fia_decode_pairs.hpp): the tile constants, the per-thread
// Scratch, which problems the vector kernels take, and the small register helpers of the dots.
#pragma once

#include <algorithm>
#include <cstring>

#include "cpu/generic/score_row.hpp"
#include "cpu/simd/microkernels.hpp"
#include "ops/flash_attention_score/semantics.hpp"
#include "ops/fused_infer_attention_score/kernel.hpp"

namespace attnops::fia::simd_forward {

namespace simd = cpu::simd;
using fa::tile::kNegInf;
using simd::alignUp;

constexpr int64_t kRowTile = 4;      // query rows sharing each converted key/value vector
constexpr int64_t kDotKeys = 3;      // keys per dot step: 3 x kRowTile accumulators + 3 keys + 1 query
// Keys per dot step of FusedInferAttentionScore's fp32 dot (dotRows): kDotKeys with 16 vector
// registers (AVX2); 4 with AVX-512's 32, whose 16 accumulators are summed together (V::sum16,
// the same bits). On Intel Xeon with AMX the decode steps took 0.96-0.98x the time (int8 KV, one
// thread with the cache in L2/L3: 0.97x; bf16 KV at 2 threads 0.96-0.97x): the horizontal sums
// were a third of the dot there (bench/results/intel-xeon-amx/NOTES.md).
template <class V>
constexpr int64_t dotKeysOf() { return V::kLanes == 16 ? 4 : kDotKeys; }
                                     // vector = the 16 ymm registers of AVX2 (each query load serves 3 keys)
constexpr int64_t kGroupRows = 64;   // query rows of a unit, all heads of the group together
constexpr int64_t kKeyRows = 128;    // keys per block: a paged cache block of 128 tokens is one step of the
                                     // online softmax (half the per-block setup, finish, softmax and
                                     // rescale work of 64-key blocks: -5.5% instructions per decode row on
                                     // Zen 3). Its keys and values (2 x 32 KiB at D 128, bf16; 2 x 16 KiB
                                     // int8) stay in L2 between the two passes over them. Units of
                                     // several kv heads take kInterleavedKeyRows (kernel.hpp).
constexpr int64_t kLineBytes = 64;

// Units of R query rows convert each key/value block once into packed fp32 runs (see dotsPacked)
// from kPackTiles row tiles on. fp16 is left out: vcvtph2ps converts as it loads, as cheap as an
// fp32 load from a packed run.
constexpr int64_t kPackTiles = 3;
constexpr int64_t kPackBytes = 16 * 1024;
inline bool packs(const Params& p, int64_t R) {
    return R > (kPackTiles - 1) * kRowTile && p.key.dtype != DType::F16;
}

// MLA full quantisation (spec 9.2, queryQuantMode 3): an int8 query scaled per token and head,
// the int8 key (also the value) scaled per tensor, bf16 rope parts. The int8 query stays unscaled
// in the fp32 query rows, so its dot with the int8 keys (converted exactly in registers) is the
// exact integer q.k: every product and partial sum is an integer of magnitude at most
// 128 * 128 * 512 = 2^23, which fp32 holds exactly whatever the order of the additions.
inline bool mlaFullQuant(const Params& p) { return p.queryDequant.scale != nullptr; }

struct Scratch {
    float* q;        // [R][dk] query rows [q ; q_rope] (key per-channel scale folded in; MLA full
                     // quantisation: the int8 query unscaled), R = G * queryRows
    float* qa;       // [R] A: q'.keyOffset (per channel)
    float* qb;       // [R] B: sum of q (per-token key offsets)
    float* st;       // [R][keyRows] scores, then probabilities
    float* acc;      // [R][dv]
    float* m;        // [R] running max
    float* l;        // [R] running sum
    float* w;        // [R] sum of probabilities times value token scales (per-channel value offsets)
    float* wo;       // [R] sum of probabilities times value token scales and offsets (per token)
    float* kScale;   // [keyRows] per-token key scale of the block's keys (1 if none)
    float* kOffset;  // [keyRows]
    float* vScale;   // [keyRows]
    float* vOffset;  // [keyRows]
    const char** kRow;  // [keyRows] address of each key row of the block
    const char** vRow;  // [keyRows]
    const char** kNext;  // [keyRows] key rows of the next block, prefetched during this block's Q.K
    const char** vNext;  // [keyRows] value rows of the next block, likewise
    const char** rRow;   // [keyRows] key rope rows of the block (MLA)
    const char** rNext;  // [keyRows]
    int64_t nextRows = 0;  // rows of the next block
    // The rows this head's dots prefetch (preRows of them): its own next rows (kNext, vNext), or
    // in a unit of several kv heads its share of every head's (runUnit), listed in kPreList.
    const char* const* kPre = nullptr;
    const char* const* vPre = nullptr;
    int64_t preRows = 0;
    const char** kPreList;  // [keyRows + kHeadsPerUnit]
    const char** vPreList;
    bool prefetchValues = true;  // false when the value rows are the key rows
    int64_t* kChunk;    // [d / kLanes] element offset of each vector of a key row (NZ: dim groups)
    int64_t* vChunk;    // [dv / kLanes]
    int64_t* rChunk;    // [ropeDim / kLanes]
    int64_t* kLines;    // [d / kLanes] byte offsets within a key row, one per cache line it touches
    int64_t* vLines;    // [dv / kLanes]
    int64_t* rLines;    // [ropeDim / kLanes]
    int64_t kLineCount = 0, vLineCount = 0, rLineCount = 0;
    bool kDense = false, vDense = false;  // vector v of every key / value row at element v * kLanes
    uint8_t* kept;      // [keyRows]
    // Packed blocks (packs(): several row tiles share each key/value row): the block's key rows
    // [k ; k_rope] and value rows converted to fp32 once, read by every row tile.
    float* pk;            // [keyRows][d + ropeDim] (all five: only where the unit's rows can pack)
    float* pv;            // [keyRows][dv]
    const char** pkRow;   // [keyRows] rows of pk
    const char** pvRow;   // [keyRows] rows of pv (or of pk when the value is the key)
    int64_t* pChunk;      // [max(d + ropeDim, dv) / kLanes] v * kLanes: packed rows are unit stride
    // MLA full quantisation (int8 query, mlaFullQuant()): the exact integer q.k and the rope dot
    // q_rope.k_rope land in separate arrays and meet in finishRowScores, where only the first is
    // scaled by the row's dequantScaleQuery x keyAntiquantScale (all three: only then).
    float* qs;            // [R] dequantScaleQuery(b, n1, row) * key scale
    float* sr;            // [R][keyRows] rope scores
    int64_t* prChunk;     // [ropeDim / kLanes] d + v * kLanes: the rope part of a packed key row
    // The bf16-pair decode (pairDecode()): the query rows and the block's probabilities as bf16
    // column pairs.
    uint32_t* qp;         // [R][d / 2]
    uint32_t* pp;         // [R][keyRows / 2]

    static int64_t floats(const Params& p, TileShape t) {
        const int64_t R = p.core.group * t.queryRows, kr = t.keyRows, dk = p.core.d + p.ropeDim;
        return alignUp(R * (p.core.d + p.ropeDim)) + 2 * alignUp(R) + alignUp(R * kr) + alignUp(R * p.core.dv) +
               4 * alignUp(R) + 4 * alignUp(kr) + 6 * alignUp(2 * kr) + 2 * alignUp(2 * (kr + kHeadsPerUnit)) +
               2 * alignUp(2 * p.core.d) +
               2 * alignUp(2 * p.core.dv) + 2 * alignUp(2 * p.ropeDim) + alignUp(kr) +
               (packs(p, R) ? alignUp(kr * dk) + alignUp(kr * p.core.dv) + 2 * alignUp(2 * kr) +
                                  alignUp(2 * std::max(dk, p.core.dv))
                            : 0) +
               (mlaFullQuant(p) ? alignUp(R) + alignUp(R * kr) + alignUp(2 * p.ropeDim) : 0) +
               alignUp(R * (p.core.d / 2)) + alignUp(R * ((kr + 1) / 2));
    }

    Scratch(const Params& p, TileShape t, void* base) {
        const int64_t R = p.core.group * t.queryRows, kr = t.keyRows;
        float* f = static_cast<float*>(base);
        auto take = [&](int64_t n) {
            float* r = f;
            f += alignUp(n);
            return r;
        };
        q = take(R * (p.core.d + p.ropeDim));
        qa = take(R);
        qb = take(R);
        st = take(R * kr);
        acc = take(R * p.core.dv);
        m = take(R);
        l = take(R);
        w = take(R);
        wo = take(R);
        kScale = take(kr);
        kOffset = take(kr);
        vScale = take(kr);
        vOffset = take(kr);
        kRow = reinterpret_cast<const char**>(take(2 * kr));
        vRow = reinterpret_cast<const char**>(take(2 * kr));
        kNext = reinterpret_cast<const char**>(take(2 * kr));
        vNext = reinterpret_cast<const char**>(take(2 * kr));
        rRow = reinterpret_cast<const char**>(take(2 * kr));
        rNext = reinterpret_cast<const char**>(take(2 * kr));
        kPreList = reinterpret_cast<const char**>(take(2 * (kr + kHeadsPerUnit)));
        vPreList = reinterpret_cast<const char**>(take(2 * (kr + kHeadsPerUnit)));
        kChunk = reinterpret_cast<int64_t*>(take(2 * p.core.d));
        vChunk = reinterpret_cast<int64_t*>(take(2 * p.core.dv));
        kLines = reinterpret_cast<int64_t*>(take(2 * p.core.d));
        vLines = reinterpret_cast<int64_t*>(take(2 * p.core.dv));
        rChunk = reinterpret_cast<int64_t*>(take(2 * p.ropeDim));
        rLines = reinterpret_cast<int64_t*>(take(2 * p.ropeDim));
        kept = reinterpret_cast<uint8_t*>(take(kr));
        const int64_t dk = p.core.d + p.ropeDim, n = packs(p, R) ? 1 : 0;  // units of fewer rows pack less
        pk = take(n * kr * dk);
        pv = take(n * kr * p.core.dv);
        pkRow = reinterpret_cast<const char**>(take(n * 2 * kr));
        pvRow = reinterpret_cast<const char**>(take(n * 2 * kr));
        pChunk = reinterpret_cast<int64_t*>(take(n * 2 * std::max(dk, p.core.dv)));
        const int64_t fq = mlaFullQuant(p) ? 1 : 0;
        qs = take(fq * R);
        sr = take(fq * R * kr);
        prChunk = reinterpret_cast<int64_t*>(take(fq * 2 * p.ropeDim));
        qp = reinterpret_cast<uint32_t*>(take(R * (p.core.d / 2)));
        pp = reinterpret_cast<uint32_t*>(take(R * ((kr + 1) / 2)));
    }
};

inline TileShape chooseTile(const Params& p) {
    return TileShape{std::max<int64_t>(1, kGroupRows / p.core.group), kKeyRows};
}

inline uint64_t scratchBytes(const Params& p, TileShape t) { return uint64_t(Scratch::floats(p, t)) * sizeof(float); }

// Every vector of a row lies in one run of unit-stride elements: the head dims are whole vectors
// and NZ dim groups hold whole vectors.
template <class V>
bool acceptsSource(const KvSource& s, int64_t dim) {
    // The key/value dtypes check.cpp admits (fp32 is not one).
    const bool known = s.dtype == DType::F16 || s.dtype == DType::BF16 || s.dtype == DType::I8;
    // Packed int4 (int32 containers; decode, never paged, spec 9.1): offsets count nibbles, and
    // every row and vector starts on a whole byte (strides are multiples of 8 nibbles), in each
    // tensor of a tensor list too (int4 has no shared prefix).
    if (s.dtype == DType::I4) {
        bool evenParts = s.prefixLen == 0;
        for (const KvPart& e : s.perBatch) evenParts = evenParts && e.dimStride == 1 && e.rowStride % 2 == 0 && e.headStride % 2 == 0;
        return evenParts && dim % V::kLanes == 0 && s.dimStride == 1 && s.dimGroup == 0 && s.rowStride % 2 == 0 &&
               s.headStride % 2 == 0 && s.batchStride % 2 == 0 && s.blockStride % 2 == 0;
    }
    bool unitParts = s.prefixLen == 0 || s.prefix.dimStride == 1;  // shared prefix, tensor-list rows
    for (const KvPart& e : s.perBatch) unitParts = unitParts && e.dimStride == 1;
    return known && unitParts && dim % V::kLanes == 0 && s.dimStride == 1 && (s.dimGroup == 0 || s.dimGroup % V::kLanes == 0);
}

template <class V>
bool accepts(const Params& p) {
    // MLA full quantisation: the int8 query, int8 key/value with per-tensor scales and a bf16 (or
    // no) rope that check_mlaquant.cpp admits; the int8 query of spec 9.2's other full quant
    // (p.fullQuant) has its own rounding steps and stays with the portable kernels.
    const bool query = mlaFullQuant(p) ? p.core.q.dtype == DType::I8 && p.key.dtype == DType::I8 &&
                                             p.value.dtype == DType::I8 && p.keyQuant.mode == Antiquant::PerChannel &&
                                             p.keyQuant.scale.size() == 1 && p.keyQuant.offset.empty() &&
                                             (p.ropeDim == 0 || p.keyRope.dtype == DType::BF16)
                                       : p.core.q.dtype != DType::I8;
    return !p.fullQuant.on && query && acceptsSource<V>(p.key, p.core.d) && acceptsSource<V>(p.value, p.core.dv) &&
           (p.ropeDim == 0 || acceptsSource<V>(p.keyRope, p.ropeDim));
}

// kLanes elements of a stored row from element offset `at`, as fp32.
template <class V, DType T>
ATTNOPS_SIMD_INLINE typename V::Vec loadVec(const char* row, int64_t at) {
    static_assert(T == DType::F16 || T == DType::BF16 || T == DType::I8 || T == DType::I4 || T == DType::F32);
    if constexpr (T == DType::F16) return V::loadHalf(reinterpret_cast<const uint16_t*>(row) + at);
    if constexpr (T == DType::BF16) return V::loadBf16(reinterpret_cast<const uint16_t*>(row) + at);
    if constexpr (T == DType::I8) return V::loadInt8(reinterpret_cast<const int8_t*>(row) + at);
    if constexpr (T == DType::I4) return V::loadInt4(reinterpret_cast<const uint8_t*>(row) + (at >> 1));  // at even
    if constexpr (T == DType::F32) return V::load(reinterpret_cast<const float*>(row) + at);  // a packed block
}

// Keeps a query vector in a register. Left alone, the compilers fold its load into each of the
// kDotKeys FMAs that use it, and the dot then issues kDotKeys x kRowTile + kDotKeys vector loads
// per kDotKeys x kRowTile FMAs, bound by the load ports (Zen 3: two 256-bit loads a cycle) rather
// than the FMAs. An empty asm that "changes" the value forces one load. No arithmetic changes.
template <class V>
ATTNOPS_SIMD_INLINE void keepInRegister(typename V::Vec& x) {
    if constexpr (V::kLanes == 8)
        __asm__("" : "+x"(x));
    else
        __asm__("" : "+v"(x));
}

// Asks for the cache lines of a row (offsets from lineOffsets) ahead of their use: the cache is
// read once, row by row from scattered pages, so the hardware prefetchers see short runs only.
// Into L2 (prefetcht1), not L1: the rows asked for are the next block's (128 keys of bf16 K and V
// at D 128 are 64 KiB, twice a 32 KiB L1), so into L1 they evicted the block being computed and
// each other. On AMD EPYC Zen 4 (2 threads) the bf16 KV decode steps took 0.84x (1 x 128K) and
// 0.88x (32 x 4,096) the time, int8 KV 0.95-1.00x (medians of interleaved rounds,
// bench/results/amd-epyc-zen4-avx512/prefetch-l2-ab-20261207.txt).
ATTNOPS_SIMD_INLINE void prefetchRow(const char* row, const int64_t* lines, int64_t count) {
    for (int64_t i = 0; i < count; ++i) __builtin_prefetch(row + lines[i], 0, 2);
}

// out[i] = the lanes of x[i] summed by V::sum8's tree, i < N (dotStep: NK x kRowTile): whole
// groups of 16 where V has sum16 (the same tree), of 8, then the rest padded by repeating it
// (each output depends on its own vector only).
template <class V, int N>
ATTNOPS_SIMD_INLINE void sumEach(const typename V::Vec* x, float* out) {
    int i = 0;
    if constexpr (requires { V::sum16(x, out); })
        for (; i + 16 <= N; i += 16) V::sum16(x + i, out + i);
    for (; i + 8 <= N; i += 8) V::sum8(x + i, out + i);
    if constexpr (N % 8 != 0) {
        typename V::Vec rest[8];
        alignas(32) float sums[8];
        for (int k = 0; k < 8; ++k) rest[k] = x[i + k % (N % 8)];
        V::sum8(rest, sums);
        for (int k = 0; k < N % 8; ++k) out[i + k] = sums[k];
    }
}

}  // namespace attnops::fia::simd_forward

// FusedInferAttentionScore parameters: the only thing a kernel sees. The attention core (query,
// output, per-batch lengths, mask rule, scale, heads) is a FlashAttentionScore ForwardParams, so
// the mask geometry of semantics.hpp serves both operators; the key/value sources (strided or
// paged, possibly int8 with dequantisation) and the outputs particular to inference live here.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/dtype.hpp"
#include "ops/flash_attention_score/params.hpp"

namespace attnops::fia {

// Largest head dim accepted (spec section 12).
constexpr int64_t kMaxHeadDim = 512;

enum class CacheFormat { None, BnBsH, BnNBsD, NZ };

// Block table of a paged cache: logical row t of batch b is row t % blockSize of physical block
// entry(b, t / blockSize). Every entry a kernel reads was checked in phase 1.
struct BlockTable {
    const int32_t* data = nullptr;  // NULL: not paged
    int64_t rowStride = 0, colStride = 0;
    int64_t blockSize = 0;

    int64_t entry(int64_t b, int64_t block) const { return data[b * rowStride + block * colStride]; }
};

// A strided (head, row, dim) tensor of key or value rows outside the main source: one batch's
// tensor of a tensor-list key/value, or the shared prefix.
struct KvPart {
    const void* data = nullptr;
    int64_t headStride = 0, rowStride = 0, dimStride = 1;
};

// Where element (b, kv head m, row t, dim d) of a key or value source lives. Not paged: rows are
// absolute (TND: the batch's first row plus t) and the batch stride applies. Paged: the batch
// picks the block-table row, `blockStride` a physical block and `rowStride` a row in it. The dim
// index is split as d = group * dimGroup + lane (NZ: D0 lanes; otherwise one group).
struct KvSource {
    const void* data = nullptr;
    DType dtype = DType::F16;
    int64_t batchStride = 0, headStride = 0, rowStride = 0, blockStride = 0;
    int64_t dimStride = 1, dimGroup = 0, dimGroupStride = 0;  // dimGroup 0: no split
    // Rows [0, prefixLen) of every batch are rows of the shared prefix `prefix`; the batch's own
    // rows follow (row t is its row t - prefixLen). Tensor-list key/value: batch b's own rows live
    // in perBatch[b] (data above unused). Neither is paged.
    int64_t prefixLen = 0;
    KvPart prefix;
    std::vector<KvPart> perBatch;

    int64_t dimOffset(int64_t d) const {
        return dimGroup == 0 ? d * dimStride : (d / dimGroup) * dimGroupStride + (d % dimGroup) * dimStride;
    }
};

// Dequantisation x_hat = (x + offset) * scale of an int8 or int4 source (spec 9.1). Modes 0 and 2
// (per-tensor x per-head, expanded to channels) are PerChannel; modes 1 and 3-5 are PerToken with
// a head stride (3, 5) and/or an index through the block table (4, 5).
enum class Antiquant { None, PerChannel, PerToken };

struct AntiquantSpec {
    Antiquant mode = Antiquant::None;
    int64_t headDim = 0;               // D of the source (per-channel index m * headDim + d)
    std::vector<float> scale, offset;  // per-channel: [KV_N * headDim] (one entry: per-tensor)
    // Per-token: fp32 views indexed (b, t); offset data NULL means offset 0.
    const float* tokenScale = nullptr;
    const float* tokenOffset = nullptr;
    int64_t tokenStride[2] = {0, 0};
    int64_t tokenOffsetStride[2] = {0, 0};
    int64_t tokenHeadStride = 0, tokenOffsetHeadStride = 0;  // modes 3, 5: per kv head m
    bool tokenPaged = false;  // modes 4, 5: (b, t) -> (blockTable[b][t / blockSize], t % blockSize)
};

// Quantisation of the output to int8 (spec 9.3): clamp(round_half_even(O * scale + offset)).
struct OutputQuant {
    bool on = false;
    int64_t headDim = 0;               // Dv: per-channel index n1 * headDim + c
    std::vector<float> scale, offset;  // [Q_N * Dv] or one entry (per tensor); offset empty: 0
};

// Full int8 quantisation (spec 9.2): int8 query, key and value. The scores are
// S = fp16(fp16(clamp(fp32(int32(q.k)) * deqScale1, +-65504)) * fp16(scaleValue)) (+ pse); the
// softmax runs over blocks of kFullQuantBlock keys counted from the batch's key 0, each block's
// unnormalised e = exp(S - m) (m: the running max up to that block) quantised to
// P8 = clamp(round_half_even(e * quantScale1), 0, 127) before the exact int32 P8.V, which is
// dequantised with deqScale2 and rescaled across blocks; the sum of the e divides at the end.
// Exactly the rounding steps of the upstream golden; core.scale is 1 then (the scale is `scale`).
constexpr int64_t kFullQuantBlock = 1024;

struct FullQuant {
    bool on = false;
    float deqScale1 = 0.0f;    // decoded and truncated to float19 (section A)
    float quantScale1 = 0.0f;  // fp32
    float deqScale2 = 0.0f;    // fp32, or the float19 of a uint64
    float scale = 0.0f;        // fp16(scaleValue)
};

// The fp16 score of full quantisation from the exact integer dot product (FullQuant above).
inline float fullQuantScore(const FullQuant& f, int64_t dot) {
    constexpr float kF16Max = 65504.0f;
    const float x = std::min(kF16Max, std::max(-kF16Max, float(dot) * f.deqScale1));
    return roundTo(DType::F16, roundTo(DType::F16, x) * f.scale);  // fp16 x fp16: exact in fp32, then rounded
}

// P8 of an unnormalised probability e (FullQuant above).
inline int32_t fullQuantProb(const FullQuant& f, float e) {
    const float y = std::nearbyint(e * f.quantScale1);  // ties to even
    return y != y ? 0 : int32_t(std::min(127.0f, std::max(-128.0f, y)));
}

// MLA full quantisation (spec 9.2 "MLA full quant", queryQuantMode 3): an int8 query dequantised
// per token and head, q_hat(b, n1, row, d) = q * dequantScaleQuery(b, n1, row) (fp32); the rope
// parts stay unscaled and the int8 key/value go through keyQuant/valueQuant (per tensor). The
// maths after that is section 5's, with bf16 probabilities (the rope dtype).
struct QueryDequant {
    const float* scale = nullptr;      // NULL: the query is not dequantised
    int64_t stride[3] = {0, 0, 0};     // (b, n1, row), row as core.q counts it (TND: packed row)

    float at(int64_t b, int64_t n1, int64_t row) const { return scale[b * stride[0] + n1 * stride[1] + row * stride[2]]; }
};

struct Params {
    // Attention core: q and out views (b, n, row, d), per-batch lengths (seq; TND: qStart is
    // the batch's first packed row; paged: kvStart 0), mask rule, scale, n1/n2/group/d/dv.
    // core.k and core.v are unused (see key, value); core.pse is pseShift (Dense, type 0:
    // added unscaled) or None; core.dropout is off.
    fa::ForwardParams core;
    fa::Layout layout = fa::Layout::BNSD;  // BSH, BSND, BNSD or TND
    bool decode = false;           // Q_S == 1, not TND: the incremental (IFA) branch
    int64_t qSeqCapacity = 0;      // Q_S (non-TND): rows per batch of the query and output
    KvSource key, value;
    BlockTable table;              // paged iff table.data != NULL
    CacheFormat cache = CacheFormat::None;
    AntiquantSpec keyQuant, valueQuant;
    OutputQuant outQuant;          // int8 attentionOut (core.out.dtype I8)
    FullQuant fullQuant;           // int8 query (spec 9.2): served by the portable kernels only
    bool writeLse = false;
    fa::MutView4 lse;              // fp32 (b, n1, row, 0)
    std::vector<float> sink;       // [Q_N] learnable sink logits; empty: none
    DType probDType = DType::F16;  // probabilities rounded to it before P.V (precision model)
    // MLA (spec 10 "Rope"): S = scale * (q.k + qRope.kRope) + pse, the rope parts ropeDim wide;
    // the key rope lies like the key (same rows, pages and block table). ropeDim 0: no rope.
    int64_t ropeDim = 0;
    fa::View4 queryRope;           // (b, n1, row, d) like core.q
    KvSource keyRope;
    bool valueIsKey = false;       // decode MLA: value == key (the value input is never read)
    QueryDequant queryDequant;     // MLA full quant (int8 query): portable and SIMD decode kernels
    // Tree mask (sparse mode 9, spec 6; core.mask is then mode 1 without a tensor): key j of
    // batch b is masked for row i iff j >= skv - sq and tree(b, i, j - (skv - sq)) != 0.
    const uint8_t* tree = nullptr;  // NULL: no tree mask
    int64_t treeStride[3] = {0, 0, 0};  // (b, i, c) of the [B, Q_S, Q_S] form
    std::vector<int64_t> treeBase;      // TND: start of batch b's sq x sq block (then b stride 0)
};

// Element `at` of packed int4 data: two per byte, low nibble first, two's complement.
inline int loadInt4(const void* data, int64_t at) {
    const uint8_t byte = static_cast<const uint8_t*>(data)[at >> 1];
    const int nibble = (at & 1) ? byte >> 4 : byte & 0xf;
    return nibble >= 8 ? nibble - 16 : nibble;
}

// Per-token scale and offset of row t of kv head m of batch b (PerToken sources).
inline void tokenTerm(const BlockTable& table, const AntiquantSpec& q, int64_t b, int64_t m, int64_t t, float& scale,
                      float& offset) {
    int64_t rowB = b, rowT = t;
    if (q.tokenPaged) {
        rowB = table.entry(b, t / table.blockSize);
        rowT = t % table.blockSize;
    }
    scale = q.tokenScale[rowB * q.tokenStride[0] + m * q.tokenHeadStride + rowT * q.tokenStride[1]];
    offset = q.tokenOffset ? q.tokenOffset[rowB * q.tokenOffsetStride[0] + m * q.tokenOffsetHeadStride + rowT * q.tokenOffsetStride[1]]
                           : 0.0f;
}

// Whether the tree mask hides key j of row i of batch b (sq, skv: the batch's lengths). Static:
// instruction-set-specific kernels each compile their own copy.
static inline bool treeMasked(const Params& p, int64_t b, int64_t sq, int64_t skv, int64_t i, int64_t j) {
    const int64_t c = j - (skv - sq);
    if (c < 0) return false;  // the context before the draft tokens is always visible
    const int64_t at = p.treeBase.empty() ? b * p.treeStride[0] + i * p.treeStride[1] + c * p.treeStride[2]
                                          : p.treeBase[size_t(b)] + i * sq + c;
    return p.tree[at] != 0;
}

// Applies the tree mask to the finished scores of row i against keys [k0, k0 + nk) (masked: -inf,
// kept 0) and returns the new row max (NaN stays NaN).
static inline float applyTreeMask(const Params& p, int64_t b, int64_t i, int64_t k0, int64_t nk, float* s, uint8_t* kept) {
    const int64_t sq = p.core.seq.qLen[size_t(b)], skv = p.core.seq.kvLen[size_t(b)];
    float rowMax = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < nk; ++j) {
        if (kept[j] && treeMasked(p, b, sq, skv, i, k0 + j)) {
            kept[j] = 0;
            s[j] = -std::numeric_limits<float>::infinity();
        }
        if (kept[j]) rowMax = (s[j] > rowMax || s[j] != s[j]) ? s[j] : rowMax;
    }
    return rowMax;
}

// Offset of row t of head m of batch b in a key or value source (elements).
inline int64_t kvRowOffset(const Params& p, const KvSource& s, int64_t b, int64_t m, int64_t t) {
    if (p.table.data == nullptr)
        return b * s.batchStride + m * s.headStride + (p.core.seq.kvStart[size_t(b)] + t) * s.rowStride;
    const int64_t bs = p.table.blockSize;
    return p.table.entry(b, t / bs) * s.blockStride + m * s.headStride + (t % bs) * s.rowStride;
}

// True when some rows of the source live outside s.data (shared prefix, tensor-list KV).
inline bool hasKvParts(const KvSource& s) { return s.prefixLen > 0 || !s.perBatch.empty(); }

// Element offset of dim 0 of row t of head m of batch b in the tensor `data`, and the dim stride
// there: kvRowOffset for the main source, the prefix or the batch's tensor otherwise.
struct KvAddress {
    const void* data;
    int64_t at, dimStride;
};
inline KvAddress kvAddress(const Params& p, const KvSource& s, int64_t b, int64_t m, int64_t t) {
    if (t < s.prefixLen) return {s.prefix.data, m * s.prefix.headStride + t * s.prefix.rowStride, s.prefix.dimStride};
    t -= s.prefixLen;
    if (!s.perBatch.empty()) {
        const KvPart& e = s.perBatch[size_t(b)];
        return {e.data, m * e.headStride + (p.core.seq.kvStart[size_t(b)] + t) * e.rowStride, e.dimStride};
    }
    return {s.data, kvRowOffset(p, s, b, m, t), s.dimStride};
}

// Dequantised (or converted) element d of row t of head m of batch b.
inline float kvElement(const Params& p, const KvSource& s, const AntiquantSpec& q, int64_t b, int64_t m, int64_t t,
                       int64_t d) {
    const KvAddress a = hasKvParts(s) ? kvAddress(p, s, b, m, t) : KvAddress{s.data, kvRowOffset(p, s, b, m, t), s.dimStride};
    const int64_t at = a.at + (s.dimGroup == 0 ? d * a.dimStride : s.dimOffset(d));
    if (q.mode == Antiquant::None) return loadAsFloat(a.data, at, s.dtype);
    const float x = s.dtype == DType::I4 ? float(loadInt4(a.data, at)) : float(static_cast<const int8_t*>(a.data)[at]);
    if (q.mode == Antiquant::PerChannel) {
        const size_t c = q.scale.size() == 1 ? 0 : size_t(m * q.headDim + d);
        return (x + (q.offset.empty() ? 0.0f : q.offset[c])) * q.scale[c];
    }
    float scale, offset;
    tokenTerm(p.table, q, b, m, t, scale, offset);
    return (x + offset) * scale;
}

// Query element (b, n1, row, d) as the maths sees it: dequantised for MLA full quant.
inline float queryElement(const Params& p, int64_t b, int64_t n1, int64_t row, int64_t d) {
    if (p.queryDequant.scale == nullptr) return p.core.q.load(b, n1, row, d);
    const float x = float(static_cast<const int8_t*>(p.core.q.data)[p.core.q.offset(b, n1, row, d)]);
    return x * p.queryDequant.at(b, n1, row);
}

// The int8 value of output element (b, n1, row, c) whose attention result is `o` (spec 9.3; NaN
// gives 0), or `o` stored in the output dtype.
inline void storeOut(const Params& p, int64_t b, int64_t n1, int64_t row, int64_t c, float o) {
    const OutputQuant& q = p.outQuant;
    if (!q.on) return p.core.out.store(b, n1, row, c, o);
    const size_t i = q.scale.size() == 1 ? 0 : size_t(n1 * q.headDim + c);
    const float y = std::nearbyint(o * q.scale[i] + (q.offset.empty() ? 0.0f : q.offset[i]));  // ties to even
    const float clamped = y != y ? 0.0f : std::min(127.0f, std::max(-128.0f, y));
    static_cast<int8_t*>(p.core.out.data)[p.core.out.offset(b, n1, row, c)] = int8_t(clamped);
}

}  // namespace attnops::fia

// FusedInferAttentionScore argument validation, in the order of the header's documentation:
// operands not implemented yet, layout and shapes, lengths, the paged cache and its block table,
// the mask, dequantisation, then the small inputs and outputs.
#include "ops/fused_infer_attention_score/check.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/handles.hpp"
#include "ops/flash_attention_score/layout.hpp"
#include "ops/flash_attention_score/semantics.hpp"
#include "ops/fused_infer_attention_score/check_features.hpp"

namespace attnops::fia {
namespace {

constexpr int64_t kCompressedMask = 2048;  // side of the compressed mask of modes 2-4
constexpr int64_t kMaxBlockSize = 1024;
constexpr int64_t kBnBsHMaxHidden = 65535;

std::string dtypeName(DType d) { return attnopsDataTypeName(attnopsDataType(int(d))); }
bool isHalf(DType d) { return d == DType::F16 || d == DType::BF16; }
std::vector<int64_t> shapeOf(const attnopsTensor& t) { return {t.shape.begin(), t.shape.begin() + t.rank}; }

void requireRank(const attnopsTensor& t, const char* name, int rank, const std::string& why) {
    if (t.rank != rank) invalidArgument(fmt::format("{}.shape", name), shapeString(t), "must have rank {} ({})", rank, why);
}

void rejectGiven(const void* t, const char* name, const char* what) {
    if (t != nullptr) unsupported("{} is given: {} is not implemented yet (pass NULL)", name, what);
}

// (batch, heads, rows, dim) of an operand whose head count is `heads` (BSH: h / heads = dim).
struct Dims {
    int64_t b = 1, s = 0, n = 0, d = 0;
};
Dims dimsOf(const attnopsTensor& t, fa::Layout l, int64_t heads, const char* name) {
    const fa::Axes a = fa::axesOf(l);
    Dims r;
    if (a.b >= 0) r.b = t.shape[a.b];
    r.s = t.shape[a.s];
    if (a.h >= 0) {
        const int64_t h = t.shape[a.h];
        if (h <= 0 || h % heads != 0)
            invalidArgument(fmt::format("{}.shape", name), shapeString(t), "hidden size {} must be a positive multiple of the heads {}",
                            h, heads);
        r.n = heads;
        r.d = h / heads;
    } else {
        r.n = t.shape[a.n];
        r.d = t.shape[a.d];
        if (r.n != heads)
            invalidArgument(fmt::format("{}.shape", name), shapeString(t), "head axis {} must equal {} (numHeads / numKeyValueHeads)",
                            r.n, heads);
    }
    return r;
}

// Every element of a small tensor as float, in row-major logical order (strides honoured).
std::vector<float> readAll(const attnopsTensor& t) {
    std::vector<float> out(size_t(t.numel()));
    for (int64_t flat = 0; flat < int64_t(out.size()); ++flat) {
        int64_t rest = flat, at = 0;
        for (int i = t.rank - 1; i >= 0; --i) {
            at += (rest % t.shape[i]) * t.strides[i];
            rest /= t.shape[i];
        }
        out[size_t(flat)] = loadAsFloat(t.data, at, t.dtype);
    }
    return out;
}

// Per-batch lengths (spec 7): one entry broadcasts, >= batch entries give the first batch ones.
std::vector<int64_t> perBatch(const attnopsIntArray* a, const char* name, int64_t batch, int64_t deflt, int64_t limit,
                              const char* limitWhy) {
    std::vector<int64_t> lens(size_t(batch), deflt);
    if (a == nullptr) return lens;
    const int64_t n = int64_t(a->values.size());
    if (n != 1 && n < batch)
        invalidArgument(fmt::format("{}.size", name), n, "must be 1 (broadcast) or at least the batch size {}", batch);
    for (int64_t b = 0; b < batch; ++b) {
        const int64_t v = a->values[size_t(n == 1 ? 0 : b)];
        if (v < 0 || v > limit)
            invalidArgument(fmt::format("{}[{}]", name, n == 1 ? 0 : b), v, "must be in [0, {}] ({})", limit, limitWhy);
        lens[size_t(b)] = v;
    }
    return lens;
}

// TND cumulative ends without a leading 0: per-batch (start, length).
void cumulative(const attnopsIntArray& a, const char* name, int64_t total, const char* totalName,
                std::vector<int64_t>& start, std::vector<int64_t>& len) {
    int64_t prev = 0;
    for (size_t i = 0; i < a.values.size(); ++i) {
        const int64_t v = a.values[i];
        if (v < prev) invalidArgument(fmt::format("{}[{}]", name, i), v, "cumulative ends must not decrease (previous {})", prev);
        if (v > total) invalidArgument(fmt::format("{}[{}]", name, i), v, "exceeds {} = {} (rows of the packed tensor)", totalName, total);
        start.push_back(prev);
        len.push_back(v - prev);
        prev = v;
    }
}

bool isMaskDType(DType d) { return d == DType::Bool || d == DType::U8 || d == DType::I8; }

bool isCompressedMask(const attnopsTensor& m) {
    return shapeIs(m, {kCompressedMask, kCompressedMask}) || shapeIs(m, {1, kCompressedMask, kCompressedMask}) ||
           shapeIs(m, {1, 1, kCompressedMask, kCompressedMask});
}

struct Shapes {
    int64_t batch = 0, qS = 0, kvS = 0, n1 = 0, n2 = 0, d = 0, dv = 0;
    int64_t maskCols = 0;  // KV extent a full mask must cover
};

// Full mask of modes 0/1: [Q_S,K], [B|1,Q_S,K], [B|1,1,Q_S,K] with K >= maskCols (dims may be larger).
void fullMask(const attnopsTensor& m, const Shapes& s, fa::MaskSpec& spec) {
    const int r = m.rank;
    const int64_t rows = r >= 2 ? m.shape[r - 2] : 0, cols = r >= 2 ? m.shape[r - 1] : 0;
    bool ok = r >= 2 && r <= 4 && rows >= s.qS && cols >= s.maskCols;
    if (r >= 3) ok = ok && (m.shape[0] == 1 || m.shape[0] == s.batch);
    if (r == 4) ok = ok && m.shape[1] == 1;
    if (!ok)
        invalidArgument("attenMask.shape", shapeString(m), "must be [Q_S,K], [B|1,Q_S,K] or [B|1,1,Q_S,K] with Q_S >= {}, K >= {}, B = {}",
                        s.qS, s.maskCols, s.batch);
    spec.maskStride[0] = r >= 3 && m.shape[0] != 1 ? m.strides[0] : 0;
    spec.maskStride[2] = m.strides[r - 2];
    spec.maskStride[3] = m.strides[r - 1];
}

// Decode mask: [B,K], [B,1,K], [B,1,1,K] with K >= maskCols.
void decodeMask(const attnopsTensor& m, const Shapes& s, fa::MaskSpec& spec) {
    const int r = m.rank;
    bool ok = r >= 2 && r <= 4 && m.shape[0] == s.batch && m.shape[r - 1] >= s.maskCols;
    for (int i = 1; i < r - 1 && ok; ++i) ok = m.shape[i] == 1;
    if (!ok)
        invalidArgument("attenMask.shape", shapeString(m), "with Q_S = 1 must be [B,K], [B,1,K] or [B,1,1,K] with B = {}, K >= {}",
                        s.batch, s.maskCols);
    spec.maskStride[0] = m.strides[0];
    spec.maskStride[3] = m.strides[r - 1];
}

}  // namespace

namespace {

fa::Layout parseLayout(const char* name) {
    if (name == nullptr) nullArgument("inputLayout");
    for (fa::Layout l : {fa::Layout::BSH, fa::Layout::BSND, fa::Layout::BNSD, fa::Layout::TND})
        if (std::strcmp(name, fa::layoutName(l)) == 0) return l;
    for (const char* later : {"BNSD_BSND", "BSH_BNSD", "BSND_BNSD", "BSH_NBSD", "BSND_NBSD", "BNSD_NBSD", "NTD", "NTD_TND", "TND_NTD"})
        if (std::strcmp(name, later) == 0) unsupported("inputLayout = \"{}\": output-transposing and NTD layouts are not implemented yet", name);
    invalidArgument("inputLayout", fmt::format("\"{}\"", name), "must be one of BSH, BSND, BNSD, TND (upper case)");
}

// Separate-style dequantisation parameters of one int8 source (spec 9.1, modes 0 and 1).
AntiquantSpec antiquantOf(const attnopsTensor* scale, const attnopsTensor* offset, int64_t mode, const char* scaleName,
                          const char* offsetName, DType queryDType, const Shapes& s, int64_t headDim, int64_t tokens) {
    AntiquantSpec q;
    q.headDim = headDim;
    if (!scale) nullArgument(scaleName, "is required with int8 key/value (dequantisation)");
    if (offset) {
        if (offset->dtype != scale->dtype)
            invalidArgument(fmt::format("{}.dtype", offsetName), dtypeName(offset->dtype), "must equal {}.dtype ({})", scaleName,
                            dtypeName(scale->dtype));
        if (shapeOf(*offset) != shapeOf(*scale))
            invalidArgument(fmt::format("{}.shape", offsetName), shapeString(*offset), "must equal {}.shape {}", scaleName,
                            shapeString(*scale));
    }
    const int64_t n = s.n2, d = headDim;
    if (mode == 0) {
        if (scale->dtype != queryDType)
            invalidArgument(fmt::format("{}.dtype", scaleName), dtypeName(scale->dtype), "must equal query.dtype ({}) in mode 0",
                            dtypeName(queryDType));
        const bool ok = shapeIs(*scale, {1}) || shapeIs(*scale, {n * d}) || shapeIs(*scale, {n, d}) || shapeIs(*scale, {n, 1, d}) ||
                        shapeIs(*scale, {1, n * d}) || shapeIs(*scale, {1, n, d}) || shapeIs(*scale, {1, n, 1, d});
        if (!ok)
            invalidArgument(fmt::format("{}.shape", scaleName), shapeString(*scale),
                            "per-channel (mode 0) must be [1] or [KV_N*D], [KV_N,D], [KV_N,1,D] with an optional leading 1 "
                            "(KV_N = {}, D = {})",
                            n, d);
        q.mode = Antiquant::PerChannel;
        q.scale = readAll(*scale);
        if (offset) q.offset = readAll(*offset);
        return q;
    }
    if (scale->dtype != DType::F32)
        invalidArgument(fmt::format("{}.dtype", scaleName), dtypeName(scale->dtype), "must be fp32 in mode 1 (per-token)");
    const int r = scale->rank;
    if (!((r == 2 || (r == 3 && scale->shape[0] == 1)) && scale->shape[r - 2] == s.batch && scale->shape[r - 1] >= tokens))
        invalidArgument(fmt::format("{}.shape", scaleName), shapeString(*scale),
                        "per-token (mode 1) must be [B,S] or [1,B,S] with B = {} and S >= {}", s.batch, tokens);
    q.mode = Antiquant::PerToken;
    q.tokenScale = static_cast<const float*>(scale->data);
    q.tokenStride[0] = scale->strides[r - 2];
    q.tokenStride[1] = scale->strides[r - 1];
    if (offset) {
        q.tokenOffset = static_cast<const float*>(offset->data);
        q.tokenOffsetStride[0] = offset->strides[r - 2];
        q.tokenOffsetStride[1] = offset->strides[r - 1];
    }
    return q;
}

}  // namespace

// Key or value source of a paged cache: BnBsH (rank 3), BnNBsD (rank 4) or NZ (rank 5).
KvSource pagedSource(const attnopsTensor& t, CacheFormat f, int64_t headDim) {
    KvSource s;
    s.data = t.data;
    s.dtype = t.dtype;
    s.blockStride = t.strides[0];
    switch (f) {
        case CacheFormat::BnBsH:
            s.rowStride = t.strides[1];
            s.headStride = headDim * t.strides[2];
            s.dimStride = t.strides[2];
            break;
        case CacheFormat::BnNBsD:
            s.headStride = t.strides[1];
            s.rowStride = t.strides[2];
            s.dimStride = t.strides[3];
            break;
        case CacheFormat::NZ:
            s.headStride = t.strides[1];
            s.dimGroupStride = t.strides[2];
            s.rowStride = t.strides[3];
            s.dimStride = t.strides[4];
            s.dimGroup = t.shape[4];
            break;
        case CacheFormat::None: break;
    }
    return s;
}

Params checkForward(const Args& a, int32_t device) {
    Params p;
    fa::ForwardParams& c = p.core;

    // 1. Required operands; operands and attributes of features not implemented yet.
    const attnopsTensor& q = requireTensorOn(a.query, "query", device);
    if (a.key == nullptr || a.keyCount == 0) nullArgument("key", "is required (an array of keyCount >= 1 tensors)");
    if (a.value == nullptr || a.valueCount == 0) nullArgument("value", "is required (an array of valueCount >= 1 tensors)");
    if (a.keyCount != a.valueCount)
        invalidArgument("valueCount", a.valueCount, "must equal keyCount = {} (key[i] and value[i] pair up)", a.keyCount);
    if (a.keyCount > 1) unsupported("keyCount = {}: tensor-list key/value (one tensor per batch) is not implemented yet", a.keyCount);
    const attnopsTensor& k = requireTensorOn(a.key[0], "key[0]", device);
    const attnopsTensor& v = requireTensorOn(a.value[0], "value[0]", device);
    const attnopsTensor& out = requireTensorOn(a.attentionOut, "attentionOut", device);
    rejectGiven(a.deqScale1, "deqScale1", "full int8 quantisation");
    rejectGiven(a.quantScale1, "quantScale1", "full int8 quantisation");
    rejectGiven(a.deqScale2, "deqScale2", "full int8 quantisation");
    rejectGiven(a.quantScale2, "quantScale2", "int8 output (post-quantisation)");
    rejectGiven(a.quantOffset2, "quantOffset2", "int8 output (post-quantisation)");
    rejectGiven(a.antiquantScale, "antiquantScale", "the combined [key; value] dequantisation style (use keyAntiquantScale/valueAntiquantScale)");
    rejectGiven(a.antiquantOffset, "antiquantOffset", "the combined [key; value] dequantisation style");
    rejectGiven(a.queryPaddingSize, "queryPaddingSize", "left padding");
    rejectGiven(a.kvPaddingSize, "kvPaddingSize", "left padding");
    rejectGiven(a.keySharedPrefix, "keySharedPrefix", "the shared prefix");
    rejectGiven(a.valueSharedPrefix, "valueSharedPrefix", "the shared prefix");
    rejectGiven(a.actualSharedPrefixLen, "actualSharedPrefixLen", "the shared prefix");
    rejectGiven(a.dequantScaleQuery, "dequantScaleQuery", "MLA full quantisation");
    if (a.queryQuantMode != 0) unsupported("queryQuantMode = {}: query quantisation is not implemented yet (pass 0)", a.queryQuantMode);
    if (a.antiquantMode != 0 && a.antiquantMode != 1) invalidArgument("antiquantMode", a.antiquantMode, "must be 0 or 1");

    // 2. Layout, dtypes, heads and head dims (spec 4, 11, 12).
    const fa::Layout layout = parseLayout(a.inputLayout);
    p.layout = layout;
    if (a.entry == Entry::IncreFlashAttention && layout == fa::Layout::TND)
        invalidArgument("inputLayout", a.inputLayout, "IncreFlashAttention takes BSH, BSND or BNSD (spec 13.3)");
    c.varlen = layout == fa::Layout::TND;
    const std::string rankWhy = fmt::format("inputLayout {}", fa::layoutName(layout));
    requireRank(q, "query", fa::rankOf(layout), rankWhy);
    if (q.dtype == DType::I8) unsupported("query.dtype = int8: full quantisation is not implemented yet");
    if (!isHalf(q.dtype)) invalidArgument("query.dtype", dtypeName(q.dtype), "must be fp16 or bf16");
    const bool int8Kv = k.dtype == DType::I8;
    if (k.dtype != q.dtype && !int8Kv)
        invalidArgument("key.dtype", dtypeName(k.dtype), "must equal query.dtype ({}) or be int8 (dequantised)", dtypeName(q.dtype));
    if (v.dtype != k.dtype) invalidArgument("value.dtype", dtypeName(v.dtype), "must equal key.dtype ({})", dtypeName(k.dtype));
    if (out.dtype != q.dtype)
        invalidArgument("attentionOut.dtype", dtypeName(out.dtype), "must equal query.dtype ({})", dtypeName(q.dtype));
    if (a.numHeads <= 0) invalidArgument("numHeads", a.numHeads, "must be > 0");
    if (a.numKeyValueHeads < 0) invalidArgument("numKeyValueHeads", a.numKeyValueHeads, "must be >= 0 (0 means numHeads)");
    Shapes s;
    s.n1 = a.numHeads;
    s.n2 = a.numKeyValueHeads == 0 ? a.numHeads : a.numKeyValueHeads;
    if (s.n1 % s.n2 != 0)
        invalidArgument("numKeyValueHeads", s.n2, "must divide numHeads = {} (GQA groups of equal size)", s.n1);
    const Dims dq = dimsOf(q, layout, s.n1, "query");
    s.batch = dq.b;
    s.qS = dq.s;
    s.d = dq.d;
    if (a.entry == Entry::IncreFlashAttention && s.qS != 1)
        invalidArgument("query.shape", shapeString(q), "IncreFlashAttention decodes one token: the query's S must be 1, not {}", s.qS);
    if (s.d > kMaxHeadDim) invalidArgument("query.shape", shapeString(q), "head dim D = {} must be <= {}", s.d, kMaxHeadDim);
    if (s.d < 1) invalidArgument("query.shape", shapeString(q), "head dim D must be >= 1");

    // 3. Key and value: layout tensors, or paged caches with their block table (spec 8).
    const attnopsTensor* table = optionalTensorOn(a.blockTable, "blockTable", device);
    if (shapeOf(v).size() != shapeOf(k).size()) invalidArgument("value.shape", shapeString(v), "must have key's rank {}", k.rank);
    int64_t blockNum = 0;
    if (table == nullptr) {
        requireRank(k, "key", fa::rankOf(layout), rankWhy);
        requireRank(v, "value", fa::rankOf(layout), rankWhy);
        const Dims dk = dimsOf(k, layout, s.n2, "key");
        const Dims dvv = dimsOf(v, layout, s.n2, "value");
        if (!c.varlen && dk.b != s.batch) invalidArgument("key.shape", shapeString(k), "batch {} must equal the query's B = {}", dk.b, s.batch);
        if (!c.varlen && dvv.b != s.batch)
            invalidArgument("value.shape", shapeString(v), "batch {} must equal the query's B = {}", dvv.b, s.batch);
        if (dk.d != s.d) invalidArgument("key.shape", shapeString(k), "head dim {} must equal the query's D = {}", dk.d, s.d);
        if (dvv.s != dk.s) invalidArgument("value.shape", shapeString(v), "sequence length {} must equal the key's {}", dvv.s, dk.s);
        s.kvS = dk.s;
        s.dv = dvv.d;
        if (s.dv != s.d && (s.d > 128 || s.dv > 128 || int8Kv))
            invalidArgument("value.shape", shapeString(v), "head dim {} may differ from D = {} only when both are <= 128 (no int8 key/value)",
                            s.dv, s.d);
        const fa::View4 kv = fa::viewOf<fa::View4>(k, layout, s.d), vv = fa::viewOf<fa::View4>(v, layout, s.dv);
        for (auto [src, view] : {std::pair{&p.key, &kv}, std::pair{&p.value, &vv}}) {
            src->data = view->data;
            src->dtype = view->dtype;
            src->batchStride = view->stride[0];
            src->headStride = view->stride[1];
            src->rowStride = view->stride[2];
            src->dimStride = view->stride[3];
        }
        s.maskCols = s.kvS;
    } else {
        if (a.blockSize <= 0) invalidArgument("blockSize", a.blockSize, "must be > 0 with a blockTable (paged attention)");
        if (a.blockSize % 16 != 0 || a.blockSize > kMaxBlockSize)
            invalidArgument("blockSize", a.blockSize, "must be a multiple of 16 and <= {}", kMaxBlockSize);
        if (int8Kv && a.blockSize % 32 != 0) invalidArgument("blockSize", a.blockSize, "must be a multiple of 32 with int8 key/value");
        if (shapeOf(v) != shapeOf(k))
            invalidArgument("value.shape", shapeString(v), "must equal key.shape {} (paged caches share one format)", shapeString(k));
        const int64_t lanes = int8Kv ? 32 : 16;
        if (k.rank == 3) {
            p.cache = CacheFormat::BnBsH;
            if (k.shape[2] % s.n2 != 0 || k.shape[2] == 0)
                invalidArgument("key.shape", shapeString(k), "BnBsH cache: hidden size {} must be a positive multiple of KV_N = {}", k.shape[2], s.n2);
            if (k.shape[2] > kBnBsHMaxHidden)
                invalidArgument("key.shape", shapeString(k), "BnBsH cache: KV_N*D = {} must be <= {} (use BnNBsD)", k.shape[2], kBnBsHMaxHidden);
            s.dv = k.shape[2] / s.n2;
        } else if (k.rank == 4) {
            p.cache = CacheFormat::BnNBsD;
            if (k.shape[1] != s.n2) invalidArgument("key.shape", shapeString(k), "BnNBsD cache: head axis must be KV_N = {}", s.n2);
            s.dv = k.shape[3];
        } else if (k.rank == 5) {
            p.cache = CacheFormat::NZ;
            if (k.shape[1] != s.n2) invalidArgument("key.shape", shapeString(k), "NZ cache: head axis must be KV_N = {}", s.n2);
            if (k.shape[4] != lanes)
                invalidArgument("key.shape", shapeString(k), "NZ cache: last dim must be D0 = {} for {}", lanes, dtypeName(k.dtype));
            s.dv = k.shape[2] * k.shape[4];
        } else {
            invalidArgument("key.shape", shapeString(k),
                            "a paged cache must be BnBsH [blockNum,blockSize,KV_N*D], BnNBsD [blockNum,KV_N,blockSize,D] or NZ "
                            "[blockNum,KV_N,D/D0,blockSize,D0]");
        }
        const int blockAxis = p.cache == CacheFormat::BnBsH ? 1 : p.cache == CacheFormat::BnNBsD ? 2 : 3;
        if (k.shape[blockAxis] != a.blockSize)
            invalidArgument("key.shape", shapeString(k), "block dim {} must equal blockSize = {}", k.shape[blockAxis], a.blockSize);
        if (s.dv != s.d) invalidArgument("key.shape", shapeString(k), "head dim {} must equal the query's D = {}", s.dv, s.d);
        blockNum = k.shape[0];
        p.key = pagedSource(k, p.cache, s.d);
        p.value = pagedSource(v, p.cache, s.dv);
        if (table->dtype != DType::I32) invalidArgument("blockTable.dtype", dtypeName(table->dtype), "must be int32");
        if (table->rank != 2 || table->shape[0] != (c.varlen ? table->shape[0] : s.batch) || table->shape[1] == 0 || table->shape[0] == 0)
            invalidArgument("blockTable.shape", shapeString(*table), "must be [B, maxBlocksPerSeq] with B = {} and no zero dim", s.batch);
        p.table.data = static_cast<const int32_t*>(table->data);
        p.table.rowStride = table->strides[0];
        p.table.colStride = table->strides[1];
        p.table.blockSize = a.blockSize;
        s.kvS = table->shape[1] * a.blockSize;
        s.maskCols = s.kvS;
    }
    c.n1 = s.n1;
    c.n2 = s.n2;
    c.group = s.n1 / s.n2;
    c.d = s.d;
    c.dv = s.dv;

    // 4. Output shape.
    const std::vector<int64_t> outShape = fa::expectedShape(layout, s.batch, s.qS, s.n1, s.dv);
    if (!shapeIs(out, outShape))
        invalidArgument("attentionOut.shape", shapeString(out), "must be {} (the query's shape with D replaced by Dv)", dimsText(outShape));
    c.q = fa::viewOf<fa::View4>(q, layout, s.d);
    c.out = fa::viewOf<fa::MutView4>(out, layout, s.dv);
    p.qSeqCapacity = s.qS;
    c.qRowsTotal = s.qS;

    // 5. Actual sequence lengths (spec 7).
    const attnopsIntArray* qLens = liveIntArrayOrNull(a.actualSeqLengths, "actualSeqLengths");
    const attnopsIntArray* kvLens = liveIntArrayOrNull(a.actualSeqLengthsKv, a.kvLengthsName);
    fa::Sequences& seq = c.seq;
    if (p.table.data && !kvLens) nullArgument(a.kvLengthsName, "is required with a paged cache (blockTable)");
    if (c.varlen) {
        if (!qLens) nullArgument("actualSeqLengths", "is required with inputLayout TND");
        if (!kvLens) nullArgument(a.kvLengthsName, "is required with inputLayout TND");
        if (kvLens->values.size() != qLens->values.size())
            invalidArgument("actualSeqLengthsKv.size", kvLens->values.size(), "must equal actualSeqLengths.size = {} (one entry per batch)",
                            qLens->values.size());
        cumulative(*qLens, "actualSeqLengths", s.qS, "T", seq.qStart, seq.qLen);
        s.batch = int64_t(seq.qLen.size());
        if (p.table.data) {
            if (table->shape[0] != s.batch)
                invalidArgument("blockTable.shape", shapeString(*table), "must have B = {} rows (one per actualSeqLengths entry)", s.batch);
            seq.kvLen = perBatch(kvLens, a.kvLengthsName, s.batch, 0, s.kvS, "per-batch lengths with a paged cache, <= maxBlocksPerSeq*blockSize");
            seq.kvStart.assign(size_t(s.batch), 0);
        } else {
            const Dims dk = dimsOf(k, layout, s.n2, "key");
            cumulative(*kvLens, "actualSeqLengthsKv", dk.s, "T_kv", seq.kvStart, seq.kvLen);
        }
        seq.qRowsUsed = s.batch > 0 ? seq.qStart.back() + seq.qLen.back() : 0;
    } else {
        p.decode = s.qS == 1 && a.queryRope == nullptr;  // MLA keeps the sparse rules (spec 3)
        seq.qLen = p.decode ? std::vector<int64_t>(size_t(s.batch), 1)
                            : perBatch(qLens, "actualSeqLengths", s.batch, s.qS, s.qS, "the query's S");
        seq.kvLen = perBatch(kvLens, a.kvLengthsName, s.batch, s.kvS, s.kvS,
                             p.table.data ? "maxBlocksPerSeq*blockSize of the block table" : "the key's S");
        seq.qStart.assign(size_t(s.batch), 0);
        seq.kvStart.assign(size_t(s.batch), 0);
        seq.qRowsUsed = s.qS;
    }
    seq.count = s.batch;
    c.batch = s.batch;
    for (int64_t b = 0; b < s.batch; ++b) {
        seq.maxQLen = std::max(seq.maxQLen, seq.qLen[size_t(b)]);
        seq.maxKvLen = std::max(seq.maxKvLen, seq.kvLen[size_t(b)]);
    }

    // 6. Block table entries that will be read: in range, never negative (section A).
    if (p.table.data) {
        for (int64_t b = 0; b < s.batch; ++b) {
            const int64_t used = (seq.kvLen[size_t(b)] + a.blockSize - 1) / a.blockSize;
            for (int64_t j = 0; j < used; ++j) {
                const int64_t id = p.table.entry(b, j);
                if (id < 0 || id >= blockNum)
                    invalidArgument(fmt::format("blockTable[{}][{}]", b, j), id,
                                    "block id must be in [0, blockNum = {}) (entry {} of {} read for {}[{}] = {})", blockNum, j, used,
                                    a.kvLengthsName, b, seq.kvLen[size_t(b)]);
            }
        }
    }

    // 7. Mask and sparse mode (spec 6): the FlashAttentionScore geometry of modes 0-4.
    const attnopsTensor* mask = optionalTensorOn(a.attenMask, "attenMask", device);
    if (mask && !isMaskDType(mask->dtype))
        invalidArgument("attenMask.dtype", dtypeName(mask->dtype), "must be bool, int8 or uint8 (1 = masked)");
    fa::MaskSpec& ms = c.mask;
    ms.sparseMode = 1;  // the full rule; modes below narrow it
    ms.preTokens = ms.nextTokens = fa::kUnbounded;
    if (mask) ms.maskData = static_cast<const uint8_t*>(mask->data);
    const int64_t mode = a.sparseMode;
    if (p.decode) {
        // sparseMode and the tokens are ignored on the incremental branch, and with them the
        // compressed mask of modes 2-4 that callers pass unchanged from their prefill calls.
        if (mask && mode != 9 && !(mode >= 2 && mode <= 4 && isCompressedMask(*mask))) {
            decodeMask(*mask, s, ms);
            ms.explicitMask = true;
        }
    } else {
        if (mode >= 5 && mode <= 8)
            invalidArgument("sparseMode", mode, "modes 5-8 (prefix, global, dilated, block-local) do not exist for this operator");
        if (mode < 0 || mode > 9) invalidArgument("sparseMode", mode, "must be in [0, 4] or 9");
        if (c.varlen && (mode == 1 || mode == 2 || (mode == 0 && mask)))
            invalidArgument("sparseMode", mode, "with inputLayout TND must be 0 without attenMask, 3, 4 or 9{}", mask ? " (attenMask given)" : "");
        if ((mode == 1 || (mode >= 2 && mode <= 4)) && !mask)
            nullArgument("attenMask", fmt::format("is required with sparseMode {} ({})", mode,
                                                  mode == 1 ? "the full mask" : "the compressed 2048x2048 mask"));
        if (mode >= 2 && mode <= 4 && !isCompressedMask(*mask))
            invalidArgument("attenMask.shape", shapeString(*mask), "with sparseMode {} must be the compressed [2048,2048] (or [1,2048,2048], "
                            "[1,1,2048,2048])", mode);
        if ((mode == 0 && mask) || mode == 4) {
            if (a.preTokens < 0 && a.nextTokens < 0)
                invalidArgument("preTokens/nextTokens", fmt::format("{}/{}", a.preTokens, a.nextTokens), "must not both be negative");
            if (fa::clampTokens(a.preTokens) + fa::clampTokens(a.nextTokens) < 0)
                invalidArgument("preTokens/nextTokens", fmt::format("{}/{}", a.preTokens, a.nextTokens),
                                "preTokens + nextTokens must be >= 0 (the band would keep nothing)");
        }
        if (mode == 4 && c.varlen)
            for (int64_t b = 0; b < s.batch; ++b) {
                const int64_t sq = seq.qLen[size_t(b)], skv = seq.kvLen[size_t(b)];
                if (fa::clampTokens(a.preTokens) + sq < 0 || fa::clampTokens(a.nextTokens) + skv < 0)
                    invalidArgument("preTokens/nextTokens", fmt::format("{}/{}", a.preTokens, a.nextTokens),
                                    "batch {} (Sq = {}, Skv = {}) needs preTokens + Sq >= 0 and nextTokens + Skv >= 0", b, sq, skv);
            }
        if (mode == 0 && mask) {
            fullMask(*mask, s, ms);
            ms.explicitMask = true;
            ms.sparseMode = 0;
            ms.preTokens = fa::clampTokens(a.preTokens);
            ms.nextTokens = fa::clampTokens(a.nextTokens);
        } else if (mode == 1) {
            fullMask(*mask, s, ms);
            ms.explicitMask = true;
        } else if (mode >= 2 && mode <= 4) {
            ms.sparseMode = mode;
            ms.preTokens = fa::clampTokens(a.preTokens);
            ms.nextTokens = fa::clampTokens(a.nextTokens);
        }
    }

    // 7b. Features with their own rules (check_features.cpp): pseShift, the MLA rope inputs, the
    // tree mask of sparse mode 9.
    const CheckedShapes checked{layout, s.batch, s.qS, s.n1, s.n2, s.d, s.dv, s.maskCols, int8Kv};
    if (const attnopsTensor* pse = optionalTensorOn(a.pseShift, "pseShift", device)) checkPseShift(a, *pse, checked, p);
    checkRope(a, q, k, v, optionalTensorOn(a.queryRope, "queryRope", device), optionalTensorOn(a.keyRope, "keyRope", device),
              checked, p);
    if (a.sparseMode == 9) checkTreeMask(a, mask, checked, p);  // also on the decode branch (one draft token)

    // 8. Dequantisation of int8 key/value (spec 9.1, separate style, modes 0 and 1).
    const attnopsTensor* kScale = optionalTensorOn(a.keyAntiquantScale, "keyAntiquantScale", device);
    const attnopsTensor* kOffset = optionalTensorOn(a.keyAntiquantOffset, "keyAntiquantOffset", device);
    const attnopsTensor* vScale = optionalTensorOn(a.valueAntiquantScale, "valueAntiquantScale", device);
    const attnopsTensor* vOffset = optionalTensorOn(a.valueAntiquantOffset, "valueAntiquantOffset", device);
    if (int8Kv) {
        for (auto [mode_, name] : {std::pair{a.keyAntiquantMode, "keyAntiquantMode"}, std::pair{a.valueAntiquantMode, "valueAntiquantMode"}}) {
            if (mode_ >= 2 && mode_ <= 5) unsupported("{} = {}: per-head and block-managed dequantisation are not implemented yet", name, mode_);
            if (mode_ != 0 && mode_ != 1) invalidArgument(name, mode_, "must be 0 (per-channel) or 1 (per-token)");
        }
        if (a.keyAntiquantMode != a.valueAntiquantMode && !(a.keyAntiquantMode == 0 && a.valueAntiquantMode == 1))
            invalidArgument("keyAntiquantMode/valueAntiquantMode", fmt::format("{}/{}", a.keyAntiquantMode, a.valueAntiquantMode),
                            "must be equal, or 0 for the key and 1 for the value");
        const int64_t tokens = s.kvS;  // paged: maxBlocksPerSeq * blockSize
        p.keyQuant = antiquantOf(kScale, kOffset, a.keyAntiquantMode, "keyAntiquantScale", "keyAntiquantOffset", q.dtype, s, s.d, tokens);
        p.valueQuant = antiquantOf(vScale, vOffset, a.valueAntiquantMode, "valueAntiquantScale", "valueAntiquantOffset", q.dtype, s, s.dv, tokens);
    } else {
        for (auto [t, name] : {std::pair{kScale, "keyAntiquantScale"}, std::pair{kOffset, "keyAntiquantOffset"},
                               std::pair{vScale, "valueAntiquantScale"}, std::pair{vOffset, "valueAntiquantOffset"}})
            if (t) invalidArgument(name, "non-NULL", "is only used with int8 key/value (key.dtype is {})", dtypeName(k.dtype));
    }

    // 9. Attributes, sink and softmaxLse.
    if (!std::isfinite(a.scaleValue) || !std::isfinite(float(a.scaleValue)))
        invalidArgument("scaleValue", a.scaleValue, "must be finite in fp32");
    c.scale = float(a.scaleValue);
    if (a.innerPrecise < 0 || a.innerPrecise > (p.decode ? 1 : 3))
        invalidArgument("innerPrecise", a.innerPrecise, "must be in [0, {}]{}", p.decode ? 1 : 3, p.decode ? " with Q_S = 1" : "");
    const attnopsTensor* sink = optionalTensorOn(a.learnableSink, "learnableSink", device);
    if (sink) {
        if (sink->dtype != q.dtype)
            invalidArgument("learnableSink.dtype", dtypeName(sink->dtype), "must equal query.dtype ({})", dtypeName(q.dtype));
        if (!shapeIs(*sink, {s.n1})) invalidArgument("learnableSink.shape", shapeString(*sink), "must be [Q_N] = [{}]", s.n1);
        if (int8Kv) unsupported("learnableSink with int8 key/value: the sink is defined for non-quantised attention only");
        if (a.innerPrecise != 0) invalidArgument("innerPrecise", a.innerPrecise, "must be 0 with learnableSink");
        p.sink = readAll(*sink);
    }
    p.writeLse = a.softmaxLseFlag;
    if (a.softmaxLseFlag) {
        const attnopsTensor& lse = requireTensorOn(a.softmaxLse, "softmaxLse", device);
        if (lse.dtype != DType::F32) invalidArgument("softmaxLse.dtype", dtypeName(lse.dtype), "must be fp32");
        const std::vector<int64_t> want = c.varlen ? std::vector<int64_t>{s.qS, s.n1, 1} : std::vector<int64_t>{s.batch, s.n1, s.qS, 1};
        if (!shapeIs(lse, want)) invalidArgument("softmaxLse.shape", shapeString(lse), "must be {}", dimsText(want));
        p.lse.data = lse.data;
        p.lse.dtype = DType::F32;
        if (c.varlen) {
            p.lse.stride[1] = lse.strides[1];
            p.lse.stride[2] = lse.strides[0];
        } else {
            for (int i = 0; i < 3; ++i) p.lse.stride[i] = lse.strides[i];
        }
    }
    p.probDType = q.dtype;
    return p;
}

}  // namespace attnops::fia

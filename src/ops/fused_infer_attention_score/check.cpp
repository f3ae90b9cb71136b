// FusedInferAttentionScore argument validation, in the order of the header's documentation:
// operands not implemented yet, layout and shapes, lengths, the paged cache and its block table,
// the mask, dequantisation, then the small inputs and outputs.
#include "ops/fused_infer_attention_score/check.hpp"

#include "ops/fused_infer_attention_score/check_fullquant.hpp"
#include "ops/fused_infer_attention_score/check_quant.hpp"

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
#include "ops/fused_infer_attention_score/layouts.hpp"
#include "ops/fused_infer_attention_score/check_features.hpp"
#include "runtime/platform.hpp"

namespace attnops::fia {
namespace {

constexpr int64_t kCompressedMask = 2048;  // side of the compressed mask of modes 2-4
constexpr int64_t kMaxBlockSize = 1024;
constexpr int64_t kBnBsHMaxHidden = 65535;

std::string dtypeName(DType d) { return d == DType::I4 ? "int4" : attnopsDataTypeName(attnopsDataType(int(d))); }
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
Dims dimsOf(const attnopsTensor& t, Form l, int64_t heads, const char* name) {
    const fa::Axes a = axesOf(l);
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

const char* formName(Form f) {
    switch (f) {
        case Form::BSH: return "BSH";
        case Form::BSND: return "BSND";
        case Form::BNSD: return "BNSD";
        case Form::TND: return "TND";
        case Form::NTD: return "NTD";
        case Form::NBSD: return "NBSD";
    }
    return "?";
}

// The layouts each entry point takes (spec 13.3, 13.4).
void checkEntryLayout(Entry e, const LayoutPair& l) {
    const bool plain = l.in == l.out && (l.in == Form::BSH || l.in == Form::BSND || l.in == Form::BNSD);
    if (e == Entry::IncreFlashAttention && !plain)
        invalidArgument("inputLayout", l.name, "IncreFlashAttention takes BSH, BSND or BNSD (spec 13.3)");
    if (e == Entry::PromptFlashAttention && !plain && std::strcmp(l.name, "BNSD_BSND") != 0 && std::strcmp(l.name, "TND") != 0)
        invalidArgument("inputLayout", l.name, "PromptFlashAttention takes BSH, BSND, BNSD, BNSD_BSND or TND (spec 13.4)");
}

// Restrictions of the output-transposing layouts (spec 4, 12).
void checkLayoutRules(const LayoutPair& l, int64_t qS, int64_t d, int64_t dv) {
    const std::string name = l.name;
    const bool mla192 = d == 192 && dv == 128;  // prefill MLA merged form
    if (name == "BNSD_BSND" && qS <= 1)
        invalidArgument("inputLayout", l.name, "needs the query's S > 1 (got {}): BNSD_BSND is a prefill layout", qS);
    if (l.out == Form::NBSD && qS > 16)
        invalidArgument("inputLayout", l.name, "needs the query's S <= 16 (got {}): NBSD output is for decode and MTP", qS);
    if (l.out == Form::BNSD && l.in != Form::BNSD && !((d == 64 || d == 128) && dv == d) && !mla192)
        invalidArgument("inputLayout", l.name, "needs D = V_D = 64 or 128 (or Q/K D 192 with V D 128), got D = {}, V_D = {}", d, dv);
    const bool unequalBarred = l.in == Form::NTD || name == "BSH_BNSD" || name == "BSND_BNSD" || name == "BNSD_BSND";
    if (d != dv && unequalBarred && !(mla192 && l.in != Form::NTD))
        invalidArgument("inputLayout", l.name, "does not allow D = {} != V_D = {} (spec 12)", d, dv);
}

LayoutPair parseLayout(const char* name) {
    if (name == nullptr) nullArgument("inputLayout");
    std::string names;
    for (const LayoutPair& l : layoutPairs()) {
        if (std::strcmp(name, l.name) == 0) return l;
        names += names.empty() ? l.name : fmt::format(", {}", l.name);
    }
    invalidArgument("inputLayout", fmt::format("\"{}\"", name), "must be one of {} (upper case)", names);
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

namespace {

// ---- KV addressing features (spec 4, 5 step 2 and 4, 10): tensor-list key/value, left padding,
// shared prefix. Each is refused with the features it cannot be combined with.

constexpr uint64_t kMaxTensorListBatch = 256;

KvPart partOf(const fa::View4& v) { return KvPart{v.data, v.stride[1], v.stride[2], v.stride[3]}; }

// Tensor-list key/value: keyCount = valueCount = B tensors of batch 1, each with its own S.
// Fills the per-batch parts and returns each batch's S; s.kvS becomes the largest.
std::vector<int64_t> tensorListSources(const Args& a, const LayoutPair& lp, Shapes& s, Params& p, int32_t device) {
    if (a.keyCount > kMaxTensorListBatch)
        invalidArgument("keyCount", a.keyCount, "tensor-list key/value take at most {} tensors (one per batch)", kMaxTensorListBatch);
    if (int64_t(a.keyCount) != s.batch)
        invalidArgument("keyCount", a.keyCount, "a tensor list needs one key/value tensor per batch: must equal the query's B = {}", s.batch);
    if (isPacked(lp.in)) invalidArgument("keyCount", a.keyCount, "tensor-list key/value do not exist with inputLayout {}", lp.name);
    std::vector<int64_t> lens;
    s.kvS = 0;
    DType kvType = DType::F16;
    for (uint64_t i = 0; i < a.keyCount; ++i) {
        const std::string kn = fmt::format("key[{}]", i), vn = fmt::format("value[{}]", i);
        // int32 entries: eight int4 each (spec 9.1), strides counted in int4 elements from here on.
        const attnopsTensor k = unpackInt4(requireTensorOn(a.key[i], kn.c_str(), device), kn.c_str());
        const attnopsTensor v = unpackInt4(requireTensorOn(a.value[i], vn.c_str(), device), vn.c_str());
        if (i == 0) kvType = k.dtype;
        if (k.dtype != kvType) invalidArgument(kn + ".dtype", dtypeName(k.dtype), "must equal key[0].dtype ({})", dtypeName(kvType));
        if (v.dtype != kvType) invalidArgument(vn + ".dtype", dtypeName(v.dtype), "must equal key[0].dtype ({})", dtypeName(kvType));
        requireRank(k, kn.c_str(), rankOf(lp.in), fmt::format("inputLayout {}", lp.name));
        requireRank(v, vn.c_str(), rankOf(lp.in), fmt::format("inputLayout {}", lp.name));
        const Dims dk = dimsOf(k, lp.in, s.n2, kn.c_str()), dv = dimsOf(v, lp.in, s.n2, vn.c_str());
        if (dk.b != 1) invalidArgument(kn + ".shape", shapeString(k), "each tensor of a tensor list holds one batch: B must be 1");
        if (dv.b != 1) invalidArgument(vn + ".shape", shapeString(v), "each tensor of a tensor list holds one batch: B must be 1");
        if (dk.d != s.d) invalidArgument(kn + ".shape", shapeString(k), "head dim {} must equal the query's D = {}", dk.d, s.d);
        if (dv.s != dk.s) invalidArgument(vn + ".shape", shapeString(v), "sequence length {} must equal {}'s {}", dv.s, kn, dk.s);
        if (i == 0) s.dv = dv.d;
        if (dv.d != s.dv) invalidArgument(vn + ".shape", shapeString(v), "head dim {} must equal value[0]'s {}", dv.d, s.dv);
        p.key.perBatch.push_back(partOf(viewOf<fa::View4>(k, lp.in, s.d)));
        p.value.perBatch.push_back(partOf(viewOf<fa::View4>(v, lp.in, s.dv)));
        lens.push_back(dk.s);
        s.kvS = std::max(s.kvS, dk.s);
    }
    for (KvSource* src : {&p.key, &p.value}) {  // the main fields describe batch 0 (dtype, dim stride)
        src->data = src->perBatch[0].data;
        src->dtype = kvType;
        src->headStride = src->perBatch[0].headStride;
        src->rowStride = src->perBatch[0].rowStride;
        src->dimStride = src->perBatch[0].dimStride;
    }
    s.maskCols = s.kvS;
    return lens;
}

// One value of an int64 [1] padding-size tensor; negative counts as 0 (spec 5 step 2).
int64_t paddingSize(const attnopsTensor& t, const char* name) {
    if (t.dtype != DType::I64) invalidArgument(fmt::format("{}.dtype", name), dtypeName(t.dtype), "must be int64");
    if (!shapeIs(t, {1})) invalidArgument(fmt::format("{}.shape", name), shapeString(t), "must be [1] (one padding for every batch)");
    return std::max<int64_t>(0, static_cast<const int64_t*>(t.data)[0]);
}

// The combinations left padding, the shared prefix and tensor lists do not exist in (spec 4, 10).
void refuseWith(bool feature, const char* name, const LayoutPair& lp, bool paged, bool list, bool perToken, bool packedOk = false,
                bool bnsdOut = true) {
    if (!feature) return;
    if (paged) invalidArgument(name, "non-NULL", "is not supported with a paged cache (blockTable)");
    if (list) invalidArgument(name, "non-NULL", "is not supported with tensor-list key/value (keyCount > 1)");
    if (!packedOk && isPacked(lp.in)) invalidArgument(name, "non-NULL", "is not supported with inputLayout {}", lp.name);
    if (!bnsdOut && lp.out == Form::BNSD && lp.in != Form::BNSD)
        invalidArgument(name, "non-NULL", "is not supported with inputLayout {}", lp.name);
    if (perToken) unsupported("{} with per-token dequantisation (antiquant modes 1, 3-5) is not implemented", name);
}

// Left padding (spec 5 step 2): the valid rows of each batch end `padding` rows before the end
// of the padded S. Prefill windows that would start before row 0 are refused; decode batches
// whose KV window starts before row 0 attend nothing (spec 10).
void applyLeftPadding(const attnopsTensor* qPad, const attnopsTensor* kvPad, const Args& a, bool decode, const Shapes& s,
                      fa::Sequences& seq) {
    if (qPad && !decode) {
        if (a.actualSeqLengths == nullptr) nullArgument("actualSeqLengths", "is required with queryPaddingSize (left padding)");
        const int64_t pad = paddingSize(*qPad, "queryPaddingSize");
        for (int64_t b = 0; b < s.batch; ++b) {
            const int64_t start = s.qS - pad - seq.qLen[size_t(b)];
            if (start < 0)
                invalidArgument("queryPaddingSize", pad, "batch {}: Q_S {} - padding - actualSeqLengths {} = {} must be >= 0", b, s.qS,
                                seq.qLen[size_t(b)], start);
            seq.qStart[size_t(b)] = start;
        }
    } else if (qPad) {
        paddingSize(*qPad, "queryPaddingSize");  // decode ignores the query's lengths and padding
    }
    if (kvPad) {
        if (a.actualSeqLengthsKv == nullptr) nullArgument(a.kvLengthsName, "is required with kvPaddingSize (left padding)");
        const int64_t pad = paddingSize(*kvPad, "kvPaddingSize");
        for (int64_t b = 0; b < s.batch; ++b) {
            const int64_t start = s.kvS - pad - seq.kvLen[size_t(b)];
            if (start >= 0) {
                seq.kvStart[size_t(b)] = start;
            } else if (decode) {
                seq.kvLen[size_t(b)] = 0;  // the window starts before row 0: output 0 (spec 10)
            } else {
                invalidArgument("kvPaddingSize", pad, "batch {}: KV_S {} - padding - {} {} = {} must be >= 0", b, s.kvS, a.kvLengthsName,
                                seq.kvLen[size_t(b)], start);
            }
        }
    }
}

// Shared prefix (spec 10): [1, prefix_S, ...] key/value rows in the base layout, prepended to
// every batch's KV; actualSharedPrefixLen (one entry, <= prefix_S) picks how many.
void applySharedPrefix(const attnopsTensor* kp, const attnopsTensor* vp, const attnopsIntArray* lenArr, const LayoutPair& lp,
                       DType kvType, Shapes& s, Params& p) {
    if (!kp && !vp) {
        if (lenArr) nullArgument("keySharedPrefix", "is required with actualSharedPrefixLen");
        return;
    }
    if (!kp || !vp) nullArgument(kp ? "valueSharedPrefix" : "keySharedPrefix", "keySharedPrefix and valueSharedPrefix go together");
    for (auto [t, name] : {std::pair{kp, "keySharedPrefix"}, std::pair{vp, "valueSharedPrefix"}}) {
        if (t->dtype != kvType) invalidArgument(fmt::format("{}.dtype", name), dtypeName(t->dtype), "must equal key.dtype ({})", dtypeName(kvType));
        requireRank(*t, name, rankOf(lp.in), fmt::format("inputLayout {}", lp.name));
    }
    const Dims dk = dimsOf(*kp, lp.in, s.n2, "keySharedPrefix"), dv = dimsOf(*vp, lp.in, s.n2, "valueSharedPrefix");
    if (dk.b != 1) invalidArgument("keySharedPrefix.shape", shapeString(*kp), "batch must be 1 (one prefix shared by every batch)");
    if (dv.b != 1) invalidArgument("valueSharedPrefix.shape", shapeString(*vp), "batch must be 1 (one prefix shared by every batch)");
    if (dk.d != s.d) invalidArgument("keySharedPrefix.shape", shapeString(*kp), "head dim {} must equal the query's D = {}", dk.d, s.d);
    if (dv.d != s.dv) invalidArgument("valueSharedPrefix.shape", shapeString(*vp), "head dim {} must equal the value's D = {}", dv.d, s.dv);
    if (dv.s != dk.s)
        invalidArgument("valueSharedPrefix.shape", shapeString(*vp), "prefix length {} must equal keySharedPrefix's {}", dv.s, dk.s);
    int64_t len = dk.s;
    if (lenArr) {
        if (lenArr->values.size() != 1)
            invalidArgument("actualSharedPrefixLen.size", lenArr->values.size(), "must be 1 (one prefix length for every batch)");
        len = lenArr->values[0];
        if (len < 0 || len > dk.s) invalidArgument("actualSharedPrefixLen[0]", len, "must be in [0, prefix_S = {}]", dk.s);
    }
    p.key.prefix = partOf(viewOf<fa::View4>(*kp, lp.in, s.d));
    p.value.prefix = partOf(viewOf<fa::View4>(*vp, lp.in, s.dv));
    p.key.prefixLen = p.value.prefixLen = len;
}

}  // namespace

Params checkForward(const Args& a, int32_t device) {
    Params p;
    fa::ForwardParams& c = p.core;
    c.rowSteps = envFlag("ATTNOPS_FA_ROW_STEPS");  // the prefill route's vector pse/mask steps
    c.headsPerPass = envInt("ATTNOPS_FA_HEADS_PER_PASS", 0);  // the prefill route's heads per pass
    c.blocksPerUnit = envInt("ATTNOPS_FA_BLOCKS_PER_UNIT", 0);  // and query blocks per unit

    // 1. Required operands; operands and attributes of features not implemented yet.
    const attnopsTensor& q = requireTensorOn(a.query, "query", device);
    if (a.key == nullptr || a.keyCount == 0) nullArgument("key", "is required (an array of keyCount >= 1 tensors)");
    if (a.value == nullptr || a.valueCount == 0) nullArgument("value", "is required (an array of valueCount >= 1 tensors)");
    if (a.keyCount != a.valueCount)
        invalidArgument("valueCount", a.valueCount, "must equal keyCount = {} (key[i] and value[i] pair up)", a.keyCount);
    const bool list = a.keyCount > 1;  // tensor-list key/value: one tensor per batch
    // int32 key/value: eight int4 per element, seen from here on as packed int4 (spec 9.1).
    const attnopsTensor k = unpackInt4(requireTensorOn(a.key[0], "key[0]", device), "key");
    const attnopsTensor v = unpackInt4(requireTensorOn(a.value[0], "value[0]", device), "value");
    const attnopsTensor& out = requireTensorOn(a.attentionOut, "attentionOut", device);
    rejectGiven(a.keyRopeAntiquantScale, "keyRopeAntiquantScale", "dequantisation of an int8 key rope");
    if (a.queryQuantMode != 0 && a.queryQuantMode != 3)
        unsupported("queryQuantMode = {}: only 0 and 3 (MLA full quantisation, per token and head) are implemented", a.queryQuantMode);
    if (a.antiquantMode != 0 && a.antiquantMode != 1) invalidArgument("antiquantMode", a.antiquantMode, "must be 0 or 1");

    // 2. Layout, dtypes, heads and head dims (spec 4, 11, 12).
    const LayoutPair lp = parseLayout(a.inputLayout);
    const Form layout = lp.in;
    p.layout = baseLayout(layout);
    checkEntryLayout(a.entry, lp);
    c.varlen = isPacked(layout);
    const std::string rankWhy = fmt::format("inputLayout {}", lp.name);
    requireRank(q, "query", rankOf(layout), rankWhy);
    const bool int8Query = q.dtype == DType::I8;  // full quantisation (spec 9.2, check_fullquant.cpp)
    if (!isHalf(q.dtype) && !int8Query) invalidArgument("query.dtype", dtypeName(q.dtype), "must be fp16, bf16 or int8");
    const bool int8Kv = k.dtype == DType::I8 || k.dtype == DType::I4;  // dequantised (int8 or int4)
    if (k.dtype != q.dtype && !int8Kv)
        invalidArgument("key.dtype", dtypeName(k.dtype), "must equal query.dtype ({}), or be int8 or int32 (packed int4) (dequantised)",
                        dtypeName(q.dtype));
    if (v.dtype != k.dtype) invalidArgument("value.dtype", dtypeName(v.dtype), "must equal key.dtype ({})", dtypeName(k.dtype));
    // int8 query: fp16 unless quantScale2; MLA full quant (queryRope given): the rope's dtype.
    const attnopsTensor* qRopeEarly = optionalTensorOn(a.queryRope, "queryRope", device);
    const DType plainOut = int8Query ? (qRopeEarly ? qRopeEarly->dtype : DType::F16) : q.dtype;
    if (out.dtype != (a.quantScale2 ? DType::I8 : plainOut))
        invalidArgument("attentionOut.dtype", dtypeName(out.dtype), "must be {} ({})", a.quantScale2 ? "int8" : dtypeName(plainOut),
                        a.quantScale2 ? "quantScale2 is given" : int8Query ? "int8 query without quantScale2" : "query.dtype without quantScale2");
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
    std::vector<int64_t> listLens;  // tensor list: each batch's S
    if (list) {
        if (table) invalidArgument("keyCount", a.keyCount, "tensor-list key/value (keyCount > 1) are not supported with a paged cache");
        listLens = tensorListSources(a, lp, s, p, device);
        if (s.dv != s.d && (s.d > 128 || s.dv > 128 || int8Kv))
            invalidArgument("value[0].shape", shapeString(v), "head dim {} may differ from D = {} only when both are <= 128 (no int8 key/value)",
                            s.dv, s.d);
    } else if (table == nullptr) {
        requireRank(k, "key", rankOf(layout), rankWhy);
        requireRank(v, "value", rankOf(layout), rankWhy);
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
        const fa::View4 kv = viewOf<fa::View4>(k, layout, s.d), vv = viewOf<fa::View4>(v, layout, s.dv);
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
    checkLayoutRules(lp, s.qS, s.d, s.dv);
    const std::vector<int64_t> outShape = expectedShape(lp.out, s.batch, s.qS, s.n1, s.dv);
    if (!shapeIs(out, outShape))
        invalidArgument("attentionOut.shape", shapeString(out), "must be {} (inputLayout {}: the output in {} order, D replaced by Dv)",
                        dimsText(outShape), lp.name, formName(lp.out));
    c.q = viewOf<fa::View4>(q, layout, s.d);
    c.out = viewOf<fa::MutView4>(out, lp.out, s.dv);
    p.qSeqCapacity = s.qS;
    c.qRowsTotal = s.qS;

    // 5. Actual sequence lengths (spec 7).
    const attnopsIntArray* qLens = liveIntArrayOrNull(a.actualSeqLengths, "actualSeqLengths");
    const attnopsIntArray* kvLens = liveIntArrayOrNull(a.actualSeqLengthsKv, a.kvLengthsName);
    fa::Sequences& seq = c.seq;
    if (p.table.data && !kvLens) nullArgument(a.kvLengthsName, "is required with a paged cache (blockTable)");
    if (c.varlen) {
        if (!qLens) nullArgument("actualSeqLengths", "is required with inputLayout TND or NTD");
        if (!kvLens) nullArgument(a.kvLengthsName, "is required with inputLayout TND or NTD");
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
        for (size_t b = 0; b < listLens.size(); ++b) {  // tensor list: each batch against its own S
            if (!kvLens) seq.kvLen[b] = listLens[b];
            if (seq.kvLen[b] > listLens[b])
                invalidArgument(fmt::format("{}[{}]", a.kvLengthsName, kvLens->values.size() == 1 ? 0 : b), seq.kvLen[b],
                                "must be <= key[{}]'s S = {} (tensor-list key/value)", b, listLens[b]);
        }
        seq.qStart.assign(size_t(s.batch), 0);
        seq.kvStart.assign(size_t(s.batch), 0);
        seq.qRowsUsed = s.qS;
    }
    // 5b. Left padding and the shared prefix (spec 5 steps 2 and 4, 10).
    const attnopsTensor* qPad = optionalTensorOn(a.queryPaddingSize, "queryPaddingSize", device);
    const attnopsTensor* kvPad = optionalTensorOn(a.kvPaddingSize, "kvPaddingSize", device);
    const attnopsTensor* kPrefix = optionalTensorOn(a.keySharedPrefix, "keySharedPrefix", device);
    const attnopsTensor* vPrefix = optionalTensorOn(a.valueSharedPrefix, "valueSharedPrefix", device);
    const attnopsIntArray* prefixLens = liveIntArrayOrNull(a.actualSharedPrefixLen, "actualSharedPrefixLen");
    // Per-token scales (separate modes 1, 3-5; the combined style's mode 1) index rows that left
    // padding and the prefix shift: refused until that mapping is settled.
    const bool separateStyle = a.keyAntiquantScale || a.keyAntiquantOffset || a.valueAntiquantScale || a.valueAntiquantOffset;
    const auto tokenMode = [](int64_t m) { return m == 1 || (m >= 3 && m <= 5); };
    const bool perToken = int8Kv && (separateStyle ? tokenMode(a.keyAntiquantMode) || tokenMode(a.valueAntiquantMode)
                                                   : a.antiquantMode == 1);
    if ((qPad || kvPad) && k.dtype == DType::I4)
        invalidArgument(qPad ? "queryPaddingSize" : "kvPaddingSize", "non-NULL", "is not supported with int4 key/value (spec 9.1)");
    const bool leftPadding = qPad || kvPad;
    refuseWith(qPad, "queryPaddingSize", lp, p.table.data, list, false, false, false);
    refuseWith(kvPad, "kvPaddingSize", lp, p.table.data, list, perToken, false, false);
    const bool prefixGiven = kPrefix || vPrefix || prefixLens;
    refuseWith(prefixGiven, kPrefix ? "keySharedPrefix" : vPrefix ? "valueSharedPrefix" : "actualSharedPrefixLen", lp, p.table.data,
               list, perToken);
    if (prefixGiven && leftPadding) invalidArgument("keySharedPrefix", "non-NULL", "is not supported with left padding (queryPaddingSize/kvPaddingSize)");
    applyLeftPadding(qPad, kvPad, a, p.decode, s, seq);
    applySharedPrefix(kPrefix, vPrefix, prefixLens, lp, k.dtype, s, p);
    if (p.key.prefixLen > 0) {  // the prefix counts in each batch's skv, and the mask covers it
        for (int64_t& len : seq.kvLen) len += p.key.prefixLen;
        s.maskCols += p.key.prefixLen;
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
    ms.maskGlobalRows = leftPadding;  // left padding: the mask is indexed by physical row and column
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
            invalidArgument("sparseMode", mode, "with inputLayout TND or NTD must be 0 without attenMask, 3, 4 or 9{}", mask ? " (attenMask given)" : "");
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
            // Left padding resets the tokens of mode 0 (spec 6).
            ms.preTokens = leftPadding ? fa::kUnbounded : fa::clampTokens(a.preTokens);
            ms.nextTokens = leftPadding ? fa::kUnbounded : fa::clampTokens(a.nextTokens);
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
    const CheckedShapes checked{p.layout, s.batch, s.qS, s.n1, s.n2, s.d, s.dv, s.maskCols, int8Kv, lp, list};
    if (const attnopsTensor* pse = optionalTensorOn(a.pseShift, "pseShift", device)) {
        checkPseShift(a, *pse, checked, p);
        // Spec 5 step 6: pse[b, n, q0 + i, k0 + j], (q0, k0) the left-padded windows' starts; the
        // shared prefix's columns come first in the assembled KV, so j already counts them.
        p.core.pse.physicalRows = leftPadding;
    }
    checkRope(a, q, k, v, optionalTensorOn(a.queryRope, "queryRope", device), optionalTensorOn(a.keyRope, "keyRope", device),
              checked, p);
    if (a.sparseMode == 9) checkTreeMask(a, mask, checked, p);  // also on the decode branch (one draft token)

    // 8. Dequantisation of int8/int4 key/value and the int8 output (spec 9.1, 9.3).
    QuantShapes qs;
    qs.batch = s.batch;
    qs.n1 = s.n1;
    qs.n2 = s.n2;
    qs.d = s.d;
    qs.dv = s.dv;
    qs.tokens = s.kvS;  // paged: maxBlocksPerSeq * blockSize
    qs.blockNum = blockNum;
    qs.blockSize = a.blockSize;
    qs.decode = p.decode;
    qs.packed = c.varlen;
    qs.query = q.dtype;
    qs.kv = k.dtype;
    FullQuantShapes fq;
    fq.d = s.d;
    fq.decode = p.decode;
    fq.paged = p.table.data != nullptr;
    fq.prefix = prefixGiven;
    fq.rope = a.queryRope || a.keyRope;
    fq.query = q.dtype;
    fq.key = k.dtype;
    fq.out = out.dtype;
    fq.queryTensor = &q;
    fq.layout = p.layout;
    fq.n1 = s.n1;
    fq.dv = s.dv;
    if (!checkFullQuant(a, fq, device, p)) checkAntiquant(a, qs, device, p);
    checkOutputQuant(a, qs, device, p);

    // 9. Attributes, sink and softmaxLse.
    if (!std::isfinite(a.scaleValue) || !std::isfinite(float(a.scaleValue)))
        invalidArgument("scaleValue", a.scaleValue, "must be finite in fp32");
    c.scale = p.fullQuant.on ? 1.0f : float(a.scaleValue);  // full quant: fp16(scaleValue) in fullQuant.scale
    if (a.innerPrecise < 0 || a.innerPrecise > (p.decode ? 1 : 3))
        invalidArgument("innerPrecise", a.innerPrecise, "must be in [0, {}]{}", p.decode ? 1 : 3, p.decode ? " with Q_S = 1" : "");
    const attnopsTensor* sink = optionalTensorOn(a.learnableSink, "learnableSink", device);
    if (sink) {
        // Quantisation first: with an int8 query (full quantisation) no sink dtype would do.
        if (int8Kv) unsupported("learnableSink with int8 key/value: the sink is defined for non-quantised attention only");
        if (sink->dtype != q.dtype)
            invalidArgument("learnableSink.dtype", dtypeName(sink->dtype), "must equal query.dtype ({})", dtypeName(q.dtype));
        if (!shapeIs(*sink, {s.n1})) invalidArgument("learnableSink.shape", shapeString(*sink), "must be [Q_N] = [{}]", s.n1);
        if (a.innerPrecise != 0) invalidArgument("innerPrecise", a.innerPrecise, "must be 0 with learnableSink");
        p.sink = readAll(*sink);
    }
    p.writeLse = a.softmaxLseFlag;
    if (a.softmaxLseFlag) {
        const attnopsTensor& lse = requireTensorOn(a.softmaxLse, "softmaxLse", device);
        if (lse.dtype != DType::F32) invalidArgument("softmaxLse.dtype", dtypeName(lse.dtype), "must be fp32");
        // Packed layouts: [T, Q_N, 1]; all others [B, Q_N, Q_S, 1], whatever the output order.
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
    p.probDType = p.queryDequant.scale ? DType::BF16 : q.dtype;  // MLA full quant: the bf16 rope/output dtype
    return p;
}

}  // namespace attnops::fia

// FlashAttentionScore argument validation, in the order the rules are documented in the header.
#include "ops/flash_attention_score/check.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>

#include "core/error.hpp"
#include "core/fault.hpp"
#include "core/handles.hpp"
#include "core/philox.hpp"
#include "ops/flash_attention_score/layout.hpp"
#include "ops/flash_attention_score/semantics.hpp"
#include "runtime/platform.hpp"

namespace attnops::fa {
namespace {

int64_t checkedMul(int64_t a, int64_t b, const char* what) {
    int64_t r;
    if (__builtin_mul_overflow(a, b, &r)) unsupported("{} overflows 64-bit indexing ({} x {})", what, a, b);
    return r;
}
int64_t checkedAdd(int64_t a, int64_t b, const char* what) {
    int64_t r;
    if (__builtin_add_overflow(a, b, &r)) unsupported("{} overflows 64-bit indexing ({} + {})", what, a, b);
    return r;
}

std::string dtypeName(DType d) { return attnopsDataTypeName(attnopsDataType(int(d))); }

void requireRank(const attnopsTensor& t, const char* name, int rank, const char* why) {
    if (t.rank != rank) invalidArgument(fmt::format("{}.shape", name), shapeString(t), "must have rank {} ({})", rank, why);
}

const attnopsTensor* optionalTensor(const attnopsTensor* t, const char* name, int32_t device) {
    return optionalTensorOn(t, name, device);
}

const attnopsTensor& requiredTensor(const attnopsTensor* t, const char* name, int32_t device) {
    return requireTensorOn(t, name, device);
}

bool isMaskDType(DType d) { return d == DType::Bool || d == DType::U8; }

// A mode of 2-8 without a mask silently loses its causal or band masking, so say so, once per
// process (it is legal and torch_npu code does it on purpose for full blocks).
void warnNullMaskOnce(int64_t mode) {
    static std::once_flag once;
    std::call_once(once, [mode] {
        logWarning(fmt::format("sparseMode = {} with attenMask = NULL: no masking is applied (upstream rule: a NULL "
                               "attenMask means full attention in every mode); pass the compressed 2048x2048 mask for "
                               "causal or band attention. This warning is given once per process.",
                               mode));
    });
}

struct Dims {
    int64_t b = 0, s = 0, n = 0, d = 0;
};

// Reads (b, s, n, d) of one operand; for BSH/SBH `headDim` (when known) splits h into n and d.
Dims dimsOf(const attnopsTensor& t, Layout layout) {
    const Axes a = axesOf(layout);
    Dims r;
    r.b = a.b >= 0 ? t.shape[a.b] : 1;
    r.s = t.shape[a.s];
    if (a.h >= 0) {
        r.n = 0;
        r.d = t.shape[a.h];  // h for now; split by the caller
    } else {
        r.n = t.shape[a.n];
        r.d = t.shape[a.d];
    }
    return r;
}

std::string shapeText(const std::vector<int64_t>& s) { return dimsText(s); }

void validateCumulative(const attnopsIntArray& a, const char* name, int64_t total, const char* totalName) {
    int64_t prev = 0;
    bool inTail = false;
    for (size_t i = 0; i < a.values.size(); ++i) {
        const int64_t v = a.values[i];
        if (v < 0) invalidArgument(fmt::format("{}[{}]", name, i), v, "cumulative sequence ends must be >= 0");
        if (v > total)
            invalidArgument(fmt::format("{}[{}]", name, i), v, "exceeds {} = {} (rows of the packed tensor)", totalName, total);
        if (inTail && v != 0)
            invalidArgument(fmt::format("{}[{}]", name, i), v,
                            "after a trailing 0 every entry must be 0 (trailing zeros mean \"not computed\")");
        if (v < prev) {
            if (v != 0)
                invalidArgument(fmt::format("{}[{}]", name, i), v,
                                "cumulative ends must not decrease (previous {}); only trailing zeros may follow", prev);
            inTail = true;
            continue;
        }
        prev = v;
    }
}

}  // namespace

const char* layoutName(Layout layout) {
    switch (layout) {
        case Layout::BSH: return "BSH";
        case Layout::SBH: return "SBH";
        case Layout::BSND: return "BSND";
        case Layout::BNSD: return "BNSD";
        case Layout::TND: return "TND";
    }
    return "?";
}

Layout parseLayout(const char* name, const char* argument) {
    if (name == nullptr) nullArgument(argument);
    for (Layout l : {Layout::BSH, Layout::SBH, Layout::BSND, Layout::BNSD, Layout::TND})
        if (std::strcmp(name, layoutName(l)) == 0) return l;
    invalidArgument(argument, fmt::format("\"{}\"", name), "must be one of BSH, SBH, BSND, BNSD, TND (upper case)");
}

Sequences fixedSequences(int64_t batch, int64_t s1, int64_t s2, int64_t n1) {
    Sequences seq;
    seq.count = batch;
    const size_t n = size_t(batch);
    allocationPoint();  // the O(B) tables below
    seq.qStart.assign(n, 0);
    seq.kvStart.assign(n, 0);
    seq.qLen.assign(n, s1);
    seq.kvLen.assign(n, s2);
    seq.elementBase.resize(n);
    const int64_t perBatch = checkedMul(checkedMul(n1, s1, "N1*S1"), s2, "N1*S1*S2");
    seq.totalElements = checkedMul(perBatch, batch, "B*N1*S1*S2");
    for (size_t b = 0; b < n; ++b) seq.elementBase[b] = int64_t(b) * perBatch;
    seq.maxQLen = batch > 0 ? s1 : 0;
    seq.maxKvLen = batch > 0 ? s2 : 0;
    seq.qRowsUsed = s1;
    return seq;
}

Sequences tndSequences(const attnopsIntArray& qCum, const attnopsIntArray& kvCum, int64_t t1, int64_t t2, int64_t n1) {
    if (qCum.values.size() != kvCum.values.size())
        invalidArgument("actualSeqKvLen.size", kvCum.values.size(),
                        "must equal actualSeqQLen.size = {} (one entry per sequence)", qCum.values.size());
    validateCumulative(qCum, "actualSeqQLen", t1, "T1");
    validateCumulative(kvCum, "actualSeqKvLen", t2, "T2");
    Sequences seq;
    const size_t n = qCum.values.size();
    seq.count = int64_t(n);
    allocationPoint();  // the O(B) tables below
    seq.qStart.resize(n);
    seq.qLen.resize(n);
    seq.kvStart.resize(n);
    seq.kvLen.resize(n);
    seq.elementBase.resize(n);
    seq.rowBroadcastBase.resize(n);
    int64_t qPrev = 0, kvPrev = 0, elements = 0, rowElements = 0;
    for (size_t b = 0; b < n; ++b) {
        const int64_t qEnd = qCum.values[b], kvEnd = kvCum.values[b];
        seq.qStart[b] = qPrev;
        seq.kvStart[b] = kvPrev;
        seq.qLen[b] = qEnd > qPrev ? qEnd - qPrev : 0;
        seq.kvLen[b] = kvEnd > kvPrev ? kvEnd - kvPrev : 0;
        seq.elementBase[b] = elements;
        seq.rowBroadcastBase[b] = rowElements;
        elements = checkedAdd(elements, checkedMul(n1, checkedMul(seq.qLen[b], seq.kvLen[b], "Sq*Skv"), "N1*Sq*Skv"),
                              "sum of N1*Sq_i*Skv_i");
        rowElements = checkedAdd(rowElements, checkedMul(n1, seq.kvLen[b], "N1*Skv"), "sum of N1*Skv_i");
        seq.maxQLen = std::max(seq.maxQLen, seq.qLen[b]);
        seq.maxKvLen = std::max(seq.maxKvLen, seq.kvLen[b]);
        qPrev = std::max(qPrev, qEnd);
        kvPrev = std::max(kvPrev, kvEnd);
    }
    seq.qRowsUsed = qPrev;
    seq.totalElements = elements;
    return seq;
}

ForwardParams checkForward(const ForwardArgs& a, int32_t device) {
    if (a.extras != nullptr) checkExtras(a.extras);
    ForwardParams p;
    p.rowSteps = envFlag("ATTNOPS_FA_ROW_STEPS");
    p.headsPerPass = envInt("ATTNOPS_FA_HEADS_PER_PASS", 0);
    p.blocksPerUnit = envInt("ATTNOPS_FA_BLOCKS_PER_UNIT", 0);
    // 1. Required operands and the layout.
    const attnopsTensor& q = requiredTensor(a.query, "query", device);
    const attnopsTensor& k = requiredTensor(a.key, "key", device);
    const attnopsTensor& v = requiredTensor(a.value, "value", device);
    const char* outName = a.attentionOutName;
    const attnopsTensor& out = requiredTensor(a.attentionOut, outName, device);
    const Layout layout = parseLayout(a.inputLayout, "inputLayout");
    p.layout = layout;
    p.varlen = layout == Layout::TND;
    const int rank = rankOf(layout);
    const std::string rankWhy = fmt::format("inputLayout {}", layoutName(layout));
    requireRank(q, "query", rank, rankWhy.c_str());
    requireRank(k, "key", rank, rankWhy.c_str());
    requireRank(v, "value", rank, rankWhy.c_str());

    // 2. Data types.
    if (q.dtype != DType::F32 && q.dtype != DType::F16 && q.dtype != DType::BF16)
        invalidArgument("query.dtype", dtypeName(q.dtype), "must be fp32, fp16 or bf16");
    if (k.dtype != q.dtype) invalidArgument("key.dtype", dtypeName(k.dtype), "must equal query.dtype ({})", dtypeName(q.dtype));
    if (v.dtype != q.dtype) invalidArgument("value.dtype", dtypeName(v.dtype), "must equal query.dtype ({})", dtypeName(q.dtype));
    if (out.dtype != q.dtype && !(a.extras != nullptr && out.dtype == DType::F32))
        invalidArgument(fmt::format("{}.dtype", outName), dtypeName(out.dtype), "must equal query.dtype ({}){}", dtypeName(q.dtype),
                        a.extras != nullptr ? " or be fp32 (extended entry point)" : "");

    // 3. Heads and head dims (spec 2.3).
    if (a.headNum <= 0) invalidArgument("headNum", a.headNum, "must be > 0");
    Dims dq = dimsOf(q, layout), dk = dimsOf(k, layout), dvv = dimsOf(v, layout);
    const bool folded = layout == Layout::BSH || layout == Layout::SBH;
    if (folded) {
        const int64_t h1 = dq.d;
        if (h1 % a.headNum != 0 || h1 == 0)
            invalidArgument("query.shape", shapeString(q), "hidden size {} must be a positive multiple of headNum = {}", h1, a.headNum);
        dq.n = a.headNum;
        dq.d = h1 / a.headNum;
        if (dk.d % dq.d != 0 || dk.d == 0)
            invalidArgument("key.shape", shapeString(k), "hidden size {} must be a positive multiple of D = {}", dk.d, dq.d);
        dk.n = dk.d / dq.d;
        dk.d = dq.d;
        if (dvv.d % dk.n != 0)
            invalidArgument("value.shape", shapeString(v), "hidden size {} must be a multiple of N2 = {}", dvv.d, dk.n);
        dvv.n = dk.n;
        dvv.d = dvv.d / dk.n;
    } else if (dq.n != a.headNum) {
        invalidArgument("query.shape", shapeString(q), "head axis N1 = {} must equal headNum = {}", dq.n, a.headNum);
    }
    const int64_t n1 = dq.n, n2 = dk.n, d = dq.d, dv = dvv.d;
    if (d < 1) invalidArgument("query.shape", shapeString(q), "head dim D must be >= 1");
    if (d > kMaxHeadDim) invalidArgument("query.shape", shapeString(q), "head dim D = {} must be <= {}", d, kMaxHeadDim);
    if (dk.d != d) invalidArgument("key.shape", shapeString(k), "head dim {} must equal the query's D = {}", dk.d, d);
    if (n2 < 1) invalidArgument("key.shape", shapeString(k), "must have at least one head (N2 >= 1)");
    if (dvv.n != n2) invalidArgument("value.shape", shapeString(v), "heads {} must equal key heads N2 = {}", dvv.n, n2);
    if (dv > d) invalidArgument("value.shape", shapeString(v), "head dim Dv = {} must be <= D = {}", dv, d);
    if (n1 % n2 != 0) invalidArgument("key.shape", shapeString(k), "N1 = {} must be a multiple of N2 = {} (GQA/MQA)", n1, n2);
    if (!p.varlen) {
        if (dk.b != dq.b) invalidArgument("key.shape", shapeString(k), "batch {} must equal the query's B = {}", dk.b, dq.b);
        if (dvv.b != dq.b) invalidArgument("value.shape", shapeString(v), "batch {} must equal the query's B = {}", dvv.b, dq.b);
    }
    if (dvv.s != dk.s) invalidArgument("value.shape", shapeString(v), "sequence length {} must equal the key's {}", dvv.s, dk.s);
    p.n1 = n1;
    p.n2 = n2;
    p.group = n1 / n2;
    p.d = d;
    p.dv = dv;

    // 4. Output shape.
    const std::vector<int64_t> outShape = expectedShape(layout, dq.b, dq.s, n1, dv);
    if (!shapeIs(out, outShape))
        invalidArgument(fmt::format("{}.shape", outName), shapeString(out), "must be {} (the query's shape with D replaced by Dv)",
                        shapeText(outShape));

    // 5. Sequences.
    const attnopsIntArray* qCum = liveIntArrayOrNull(a.actualSeqQLen, "actualSeqQLen");
    const attnopsIntArray* kvCum = liveIntArrayOrNull(a.actualSeqKvLen, "actualSeqKvLen");
    if (p.varlen) {
        if (!qCum) nullArgument("actualSeqQLen", "is required with inputLayout TND");
        if (!kvCum) nullArgument("actualSeqKvLen", "is required with inputLayout TND");
        p.seq = tndSequences(*qCum, *kvCum, dq.s, dk.s, n1);
        p.batch = p.seq.count;
    } else {
        if (qCum) invalidArgument("actualSeqQLen", "non-NULL", "is only used with inputLayout TND");
        if (kvCum) invalidArgument("actualSeqKvLen", "non-NULL", "is only used with inputLayout TND");
        p.batch = dq.b;
        p.seq = fixedSequences(dq.b, dq.s, dk.s, n1);
    }
    p.qRowsTotal = dq.s;
    p.q = viewOf<View4>(q, layout, d);
    p.k = viewOf<View4>(k, layout, d);
    p.v = viewOf<View4>(v, layout, dv);
    p.out = viewOf<MutView4>(out, layout, dv);

    // 6. Attributes.
    if (!std::isfinite(a.scaleValue) || !std::isfinite(float(a.scaleValue)))
        invalidArgument("scaleValue", a.scaleValue, "must be finite in fp32 (|scale| <= 3.4e38)");
    p.scale = float(a.scaleValue);
    if (a.innerPrecise < 0 || a.innerPrecise > 2) invalidArgument("innerPrecise", a.innerPrecise, "must be 0, 1 or 2");
    if (!(a.keepProb > 0.0 && a.keepProb <= 1.0)) invalidArgument("keepProb", a.keepProb, "must be in (0, 1]");
    if (!std::isfinite(float(1.0 / a.keepProb)))
        invalidArgument("keepProb", a.keepProb, "is too small: 1/keepProb must be finite in fp32");

    // 7. Sparse mode and tokens (spec 2.6 with section 0).
    const int64_t mode = a.sparseMode;
    if (mode < 0 || mode > 8) invalidArgument("sparseMode", mode, "must be in [0, 8]");
    if (!p.varlen && (mode == 7 || mode == 8))
        invalidArgument("sparseMode", mode, "modes 7 and 8 split a varlen batch; they need inputLayout TND");
    if (p.varlen && mode == 5) invalidArgument("sparseMode", mode, "mode 5 is not available with inputLayout TND (use mode 6)");
    p.mask.sparseMode = mode;
    p.mask.preTokens = a.preTokens;
    p.mask.nextTokens = a.nextTokens;
    if (liveTensorOrNull(a.paddingMask, "paddingMask")) invalidArgument("paddingMask", "non-NULL", "is reserved and must be NULL");
    const attnopsTensor* mask = optionalTensor(a.attenMask, "attenMask", device);
    // Without attenMask the tokens are ignored (section 0), so they are not checked either.
    if (mask && (mode == 0 || mode == 4 || mode == 7 || mode == 8)) {
        if (clampTokens(a.preTokens) + clampTokens(a.nextTokens) < 0)
            invalidArgument("preTokens + nextTokens", fmt::format("{} + {}", a.preTokens, a.nextTokens),
                            "must be >= 0: the band -preTokens <= j - i <= nextTokens would be empty");
    }
    for (int64_t b = 0; b < p.seq.count; ++b) {
        if (p.seq.qLen[size_t(b)] > 0 && p.seq.kvLen[size_t(b)] > 0) {
            if (p.mask.firstNonEmpty < 0) p.mask.firstNonEmpty = b;
            p.mask.lastNonEmpty = b;
        }
    }

    // 8. Masks.
    if (mask) {
        if (!isMaskDType(mask->dtype)) invalidArgument("attenMask.dtype", dtypeName(mask->dtype), "must be bool or uint8");
        const bool explicitMode = mode == 0 || mode == 1 || mode == 5;
        if (explicitMode) {
            MaskSpec& m = p.mask;
            m.explicitMask = true;
            m.maskData = static_cast<const uint8_t*>(mask->data);
            const int64_t s1 = dq.s, s2 = dk.s;
            const int r = mask->rank;
            if (p.varlen) {
                if (shapeIs(*mask, {p.seq.maxQLen, p.seq.maxKvLen})) {
                    m.maskGlobalRows = false;
                } else if (shapeIs(*mask, {s1, s2})) {
                    m.maskGlobalRows = true;
                } else {
                    invalidArgument("attenMask.shape", shapeString(*mask), "with TND must be [maxSq, maxSkv] = [{},{}] or [T1, T2] = [{},{}]",
                                    p.seq.maxQLen, p.seq.maxKvLen, s1, s2);
                }
                m.maskStride[2] = mask->strides[0];
                m.maskStride[3] = mask->strides[1];
            } else if (r == 2 && shapeIs(*mask, {s1, s2})) {
                m.maskStride[2] = mask->strides[0];
                m.maskStride[3] = mask->strides[1];
            } else if (r == 4 && mask->shape[2] == s1 && mask->shape[3] == s2 &&
                       ((mask->shape[0] == dq.b && (mask->shape[1] == n1 || mask->shape[1] == 1)) ||
                        (mask->shape[0] == 1 && mask->shape[1] == 1))) {
                m.maskStride[0] = mask->shape[0] == 1 ? 0 : mask->strides[0];
                m.maskStride[1] = mask->shape[1] == 1 ? 0 : mask->strides[1];
                m.maskStride[2] = mask->strides[2];
                m.maskStride[3] = mask->strides[3];
            } else {
                invalidArgument("attenMask.shape", shapeString(*mask),
                                "with sparseMode {} must be [B,N1,S1,S2], [B,1,S1,S2], [1,1,S1,S2] or [S1,S2] = [{},{}]", mode, s1, s2);
            }
        } else {
            const std::vector<int64_t> compressed = mode == 6 ? std::vector<int64_t>{3072, 2048} : std::vector<int64_t>{2048, 2048};
            if (!shapeIs(*mask, compressed))
                invalidArgument("attenMask.shape", shapeString(*mask),
                                "with sparseMode {} must be the compressed {} mask (its content is not read; the mask "
                                "is computed from the mode), or NULL",
                                mode, shapeText(compressed));
        }
    }

    // 9. Prefix (modes 5 and 6).
    const attnopsIntArray* prefix = liveIntArrayOrNull(a.prefix, "prefix");
    if (mode == 5 || mode == 6) {
        if (!prefix) nullArgument("prefix", fmt::format("is required with sparseMode {}", mode));
        if (int64_t(prefix->values.size()) != p.seq.count)
            invalidArgument("prefix.size", prefix->values.size(), "must equal the batch size {}", p.seq.count);
        for (int64_t b = 0; b < p.seq.count; ++b) {
            const int64_t sq = p.seq.qLen[size_t(b)], skv = p.seq.kvLen[size_t(b)];
            const int64_t lo = sq > skv ? 0 : skv - sq;
            const int64_t nb = prefix->values[size_t(b)];
            if (nb < lo || nb > skv)
                invalidArgument(fmt::format("prefix[{}]", b), nb, "must be in [{}, {}] (Sq = {}, Skv = {})", lo, skv, sq, skv);
        }
        p.mask.prefix = prefix->values;
    } else if (prefix) {
        invalidArgument("prefix", "non-NULL", "is only used with sparseMode 5 or 6 (got sparseMode {})", mode);
    }

    // A NULL attenMask means no masking at all, in every mode (section 0): upstream ignores the
    // mode, preTokens and nextTokens then, and torch_npu clients (MindSpeed's ring attention) rely
    // on it. The rule in effect becomes mode 1 without a mask tensor: full attention.
    if (!mask) {
        if (mode >= 2) warnNullMaskOnce(mode);
        p.mask = MaskSpec{};
        p.mask.sparseMode = 1;
        p.mask.preTokens = p.mask.nextTokens = kUnbounded;
    }

    // 10. Start indices.
    const attnopsIntArray* qStart = liveIntArrayOrNull(a.qStartIdx, "qStartIdx");
    const attnopsIntArray* kvStart = liveIntArrayOrNull(a.kvStartIdx, "kvStartIdx");
    if (qStart && qStart->values.empty()) invalidArgument("qStartIdx.size", 0, "must be >= 1 when given (element 0 is used)");
    if (kvStart && kvStart->values.empty()) invalidArgument("kvStartIdx.size", 0, "must be >= 1 when given (element 0 is used)");
    p.pse.qStartIdx = qStart ? qStart->values[0] : 0;
    p.pse.kvStartIdx = kvStart ? kvStart->values[0] : 0;
    constexpr int64_t kMaxStartIdx = int64_t(1) << 62;  // j + kvStartIdx stays within int64
    if (p.pse.qStartIdx < -kMaxStartIdx || p.pse.qStartIdx > kMaxStartIdx || p.pse.kvStartIdx < -kMaxStartIdx ||
        p.pse.kvStartIdx > kMaxStartIdx)  // not llabs: |INT64_MIN| overflows
        invalidArgument("qStartIdx/kvStartIdx", fmt::format("{}/{}", p.pse.qStartIdx, p.pse.kvStartIdx), "must be within +-2^62");

    // 11. pse (spec 2.5).
    const attnopsTensor* pse = optionalTensor(a.realShift, "realShift", device);
    if (a.pseType < 0 || a.pseType > 3) invalidArgument("pseType", a.pseType, "must be 0, 1, 2 or 3");
    p.pse.type = a.pseType;
    if (!pse) {
        if (a.pseType != 1) invalidArgument("pseType", a.pseType, "must be 1 when realShift is NULL");
    } else if (a.pseType >= 2) {
        if (pse->dtype != DType::F32)
            invalidArgument("realShift.dtype", dtypeName(pse->dtype), "must be fp32 (slopes) with pseType {}", a.pseType);
        p.pse.form = PseForm::Slopes;
        p.pse.view.data = pse->data;
        p.pse.view.dtype = DType::F32;
        if (shapeIs(*pse, {p.batch, n1})) {
            p.pse.view.stride[0] = pse->strides[0];
            p.pse.view.stride[1] = pse->strides[1];
        } else if (shapeIs(*pse, {n1})) {
            p.pse.view.stride[1] = pse->strides[0];
        } else {
            invalidArgument("realShift.shape", shapeString(*pse), "with pseType {} must hold slopes [B,N1] = [{},{}] or [N1] = [{}]",
                            a.pseType, p.batch, n1, n1);
        }
    } else {
        if (pse->dtype != q.dtype)
            invalidArgument("realShift.dtype", dtypeName(pse->dtype), "must equal query.dtype ({}) with pseType {}", dtypeName(q.dtype), a.pseType);
        // The compressed alibi form holds the lower triangle only, so the mask must hide the rest.
        auto compressedAllowed = [&]() {
            return mask && (mode == 2 || mode == 3 || (mode == 0 && a.nextTokens <= 0));
        };
        if (p.varlen && pse->rank == 1) {
            p.pse.view.data = pse->data;
            p.pse.view.dtype = pse->dtype;
            p.pse.view.stride[3] = pse->strides[0];
            int64_t rowTotal = 0;
            for (int64_t b = 0; b < p.seq.count; ++b) rowTotal += n1 * p.seq.kvLen[size_t(b)];
            if (pse->shape[0] == p.seq.totalElements) {
                p.pse.form = PseForm::TndDense;
            } else if (pse->shape[0] == rowTotal) {
                p.pse.form = PseForm::TndRowBroadcast;
            } else {
                invalidArgument("realShift.shape", shapeString(*pse),
                                "with TND must be [sum N1*Sq_i*Skv_i] = [{}], [sum N1*Skv_i] = [{}] or the 4-D compressed alibi form",
                                p.seq.totalElements, rowTotal);
            }
        } else if (pse->rank == 4) {
            const int64_t pb = pse->shape[0], pn = pse->shape[1], ps = pse->shape[2], pk = pse->shape[3];
            if (pb != 1 && pb != p.batch)
                invalidArgument("realShift.shape", shapeString(*pse), "batch dim must be 1 or B = {}", p.batch);
            if (pn != n1) invalidArgument("realShift.shape", shapeString(*pse), "head dim must be N1 = {}", n1);
            p.pse.view.data = pse->data;
            p.pse.view.dtype = pse->dtype;
            p.pse.view.stride[0] = pb == 1 ? 0 : pse->strides[0];
            p.pse.view.stride[1] = pse->strides[1];
            p.pse.view.stride[3] = pse->strides[3];
            const int64_t s1 = dq.s, s2 = dk.s;
            const bool compressedShape = ps == 1024;
            if (!p.varlen && ps == s1 && pk == s2) {
                p.pse.form = PseForm::Dense;
                p.pse.view.stride[2] = pse->strides[2];
            } else if (!p.varlen && ps == 1 && pk == s2) {
                p.pse.form = PseForm::Dense;  // row broadcast
                p.pse.view.stride[2] = 0;
            } else if (compressedShape) {
                bool ok = compressedAllowed();
                if (!p.varlen) {
                    ok = ok && s1 > 1024 && s1 == s2 && pk == s2;
                } else {
                    for (int64_t b = 0; b < p.seq.count && ok; ++b)
                        ok = p.seq.qLen[size_t(b)] == p.seq.kvLen[size_t(b)] && p.seq.kvLen[size_t(b)] <= pk;
                }
                if (!ok)
                    invalidArgument("realShift.shape", shapeString(*pse),
                                    "the compressed alibi form [B|1,N1,1024,S2] needs S1 == S2 (every sequence), S1 > 1024 "
                                    "(fixed layouts), S2 <= its last dim, and a lower-triangular mask (an attenMask with sparseMode 2 "
                                    "or 3, or 0 with nextTokens <= 0)");
                p.pse.form = PseForm::CompressedAlibi;
                p.pse.view.stride[2] = pse->strides[2];
                p.pse.compressedCols = pk;
            } else {
                invalidArgument("realShift.shape", shapeString(*pse), "must be [B|1,N1,S1,S2], [B|1,N1,1,S2] or [B|1,N1,1024,S2] with S1 = {}, S2 = {}",
                                s1, s2);
            }
        } else {
            invalidArgument("realShift.shape", shapeString(*pse), "must be 4-D (or 1-D with TND) for pseType {}", a.pseType);
        }
    }

    // 12. Dropout.
    const attnopsTensor* drop = optionalTensor(a.dropMask, "dropMask", device);
    p.dropout.keepProb = float(a.keepProb);
    p.dropout.keepThreshold = DropoutBits::keepThreshold(p.dropout.keepProb);
    p.dropout.enabled = a.keepProb < 1.0;
    p.dropout.invKeepProb = float(1.0 / a.keepProb);
    p.dropout.seed = uint64_t(a.seed);
    p.dropout.offset = uint64_t(a.offset);
    if (p.dropout.enabled && a.extras != nullptr && a.extras->dropGlobal)
        p.dropout.global = checkDropoutGlobal(*a.extras, p, dq.s, dk.s);
    if (drop && p.dropout.enabled) {
        if (drop->dtype != DType::U8) invalidArgument("dropMask.dtype", dtypeName(drop->dtype), "must be uint8 (bit-packed)");
        const int64_t bits = p.dropout.global.enabled ? p.dropout.global.totalElements : p.seq.totalElements;
        const int64_t need = (bits + 7) / 8;
        if (drop->numel() < need)
            invalidArgument("dropMask.numel", drop->numel(), "must be >= ceil({} / 8) = {} bytes (one bit per score{})", bits, need,
                            p.dropout.global.enabled ? " of the global problem" : "");
        if (drop->rank == 1) {
            p.dropout.maskByteStride = drop->strides[0];
        } else if (!drop->isContiguous()) {
            unsupported("dropMask = {} with strides: a multi-dimensional dropMask must be contiguous (or pass a 1-D view)",
                        shapeString(*drop));
        }
        p.dropout.mask = static_cast<const uint8_t*>(drop->data);
    }

    // 13. Sink.
    const attnopsTensor* sink = optionalTensor(a.sink, "sink", device);
    if (sink) {
        if (sink->dtype != DType::F32) invalidArgument("sink.dtype", dtypeName(sink->dtype), "must be fp32");
        if (!shapeIs(*sink, {n1})) invalidArgument("sink.shape", shapeString(*sink), "must be [N1] = [{}]", n1);
        p.sink = static_cast<const float*>(sink->data);
        p.sinkStride = sink->strides[0];
    }

    // 14. Statistics outputs.
    const attnopsTensor* smax = optionalTensor(a.softmaxMax, "softmaxMax", device);
    const attnopsTensor* ssum = optionalTensor(a.softmaxSum, "softmaxSum", device);
    if ((smax == nullptr) != (ssum == nullptr))
        nullArgument(smax ? "softmaxSum" : "softmaxMax", "softmaxMax and softmaxSum are given together or not at all");
    if (smax) {
        for (const auto* t : {smax, ssum}) {
            const char* name = t == smax ? "softmaxMax" : "softmaxSum";
            if (t->dtype != DType::F32) invalidArgument(fmt::format("{}.dtype", name), dtypeName(t->dtype), "must be fp32");
            const int64_t lanes = t->rank > 0 ? t->shape[t->rank - 1] : 0;
            const std::vector<int64_t> want = p.varlen ? std::vector<int64_t>{dq.s, n1, lanes}
                                                       : std::vector<int64_t>{dq.b, n1, dq.s, lanes};
            if ((lanes != 8 && lanes != 1) || !shapeIs(*t, want))
                invalidArgument(fmt::format("{}.shape", name), shapeString(*t), "must be {} with a trailing 8 or 1",
                                p.varlen ? fmt::format("[T1,N1,8|1] = [{},{},8|1]", dq.s, n1)
                                         : fmt::format("[B,N1,S1,8|1] = [{},{},{},8|1]", dq.b, n1, dq.s));
        }
        if (smax->shape[smax->rank - 1] != ssum->shape[ssum->rank - 1])
            invalidArgument("softmaxSum.shape", shapeString(*ssum), "must have the same trailing dim as softmaxMax {}", shapeString(*smax));
        p.writeStats = true;
        p.statLanes = smax->shape[smax->rank - 1];
        for (auto [t, view] : {std::pair{smax, &p.softmaxMax}, std::pair{ssum, &p.softmaxSum}}) {
            view->data = t->data;
            view->dtype = DType::F32;
            if (p.varlen) {
                view->stride[0] = 0;
                view->stride[1] = t->strides[1];
                view->stride[2] = t->strides[0];
                view->stride[3] = t->strides[2];
            } else {
                for (int i = 0; i < 4; ++i) view->stride[i] = t->strides[i];
            }
        }
    }
    const attnopsTensor* softmaxOut = liveTensorOrNull(a.softmaxOut, "softmaxOut");
    if (softmaxOut && softmaxOut->numel() != 0)
        invalidArgument("softmaxOut.shape", shapeString(*softmaxOut), "is reserved: pass NULL or an empty tensor");
    return p;
}

BackwardParams checkBackward(const BackwardArgs& a, int32_t device) {
    // Everything the forward checks, with the statistics and attentionIn as inputs.
    if (a.forward.softmaxMax == nullptr) nullArgument("softmaxMax", "is required by the backward (P is rebuilt from it)");
    if (a.forward.softmaxSum == nullptr) nullArgument("softmaxSum", "is required by the backward (P is rebuilt from it)");
    if (a.forward.attentionOut == nullptr) nullArgument("attentionIn", "is required by the backward (the forward's output)");
    BackwardParams p;
    p.fwd = checkForward(a.forward, device);
    const ForwardParams& f = p.fwd;
    const attnopsTensor& q = requiredTensor(a.forward.query, "query", device);
    const attnopsTensor& k = requiredTensor(a.forward.key, "key", device);
    const attnopsTensor& v = requiredTensor(a.forward.value, "value", device);
    const attnopsTensor& attnIn = requiredTensor(a.forward.attentionOut, "attentionIn", device);

    // dy: the attentionIn's shape and dtype.
    const attnopsTensor& dy = requiredTensor(a.dy, "dy", device);
    if (dy.dtype != q.dtype) invalidArgument("dy.dtype", dtypeName(dy.dtype), "must equal query.dtype ({})", dtypeName(q.dtype));
    if (!shapeIs(dy, std::vector<int64_t>(attnIn.shape.begin(), attnIn.shape.begin() + attnIn.rank)))
        invalidArgument("dy.shape", shapeString(dy), "must equal attentionIn.shape {}", shapeString(attnIn));
    p.dy = viewOf<View4>(dy, f.layout, f.dv);

    // Gradients: the shapes and dtype of query, key, value.
    const auto gradient = [&](const attnopsTensor* t, const char* name, const attnopsTensor& like, const char* likeName, int64_t headDim) {
        const attnopsTensor& g = requiredTensor(t, name, device);
        const bool extended = a.forward.extras != nullptr;
        if (g.dtype != like.dtype && !(extended && g.dtype == DType::F32))
            invalidArgument(fmt::format("{}.dtype", name), dtypeName(g.dtype), "must equal {}.dtype ({}){}", likeName, dtypeName(like.dtype),
                            extended ? " or be fp32 (extended entry point)" : "");
        if (extended && a.forward.extras->accumulateGrads && g.dtype != DType::F32)
            invalidArgument(fmt::format("{}.dtype", name), dtypeName(g.dtype), "must be fp32 with accumulateGrads = 1");
        if (!shapeIs(g, std::vector<int64_t>(like.shape.begin(), like.shape.begin() + like.rank)))
            invalidArgument(fmt::format("{}.shape", name), shapeString(g), "must equal {}.shape {}", likeName, shapeString(like));
        return viewOf<MutView4>(g, f.layout, headDim);
    };
    p.dq = gradient(a.dq, "dqOut", q, "query", f.d);
    p.dk = gradient(a.dk, "dkOut", k, "key", f.d);
    p.dv = gradient(a.dv, "dvOut", v, "value", f.dv);
    p.accumulate = a.forward.extras != nullptr && a.forward.extras->accumulateGrads != 0;
    const Axes axes = axesOf(f.layout);
    p.kvRowsTotal = k.shape[axes.s];
    p.kvRowsUsed = 0;
    for (int64_t b = 0; b < f.seq.count; ++b)
        p.kvRowsUsed = std::max(p.kvRowsUsed, f.seq.kvStart[size_t(b)] + f.seq.kvLen[size_t(b)]);
    if (!f.varlen) p.kvRowsUsed = p.kvRowsTotal;

    const attnopsTensor* softmaxIn = liveTensorOrNull(a.softmaxIn, "softmaxIn");
    if (softmaxIn && softmaxIn->numel() != 0)
        invalidArgument("softmaxIn.shape", shapeString(*softmaxIn), "is reserved: pass NULL or an empty tensor");
    const attnopsTensor* dpse = liveTensorOrNull(a.dpse, "dpseOut");
    if (dpse && dpse->numel() != 0)
        invalidArgument("dpseOut.shape", shapeString(*dpse), "is reserved (no pse gradient is produced): pass NULL or an empty tensor");

    // dsink: with a sink, fp32 [N1].
    const attnopsTensor* dsink = optionalTensor(a.dsink, "dsinkOut", device);
    if (f.sink != nullptr) {
        if (!dsink) nullArgument("dsinkOut", "is required when sinkIn is given");
        if (dsink->dtype != DType::F32) invalidArgument("dsinkOut.dtype", dtypeName(dsink->dtype), "must be fp32");
        if (!shapeIs(*dsink, {f.n1})) invalidArgument("dsinkOut.shape", shapeString(*dsink), "must be [N1] = [{}]", f.n1);
        p.dsink = static_cast<float*>(dsink->data);
        p.dsinkStride = dsink->strides[0];
        p.sinkRows = f.varlen ? f.qRowsTotal : f.batch * f.seq.maxQLen;
    }
    return p;
}

}  // namespace attnops::fa

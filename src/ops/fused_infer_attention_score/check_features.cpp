// pseShift, MLA rope and tree mask rules of FusedInferAttentionScore (spec 10, 1, 3, 6): each
// documented constraint a named check; what passes becomes core.pse, the rope or the tree part of
// Params.
#include "ops/fused_infer_attention_score/check_features.hpp"

#include <fmt/format.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/handles.hpp"
#include "ops/flash_attention_score/layout.hpp"

namespace attnops::fia {
namespace {

constexpr int64_t kMlaDecodeDim = 512;     // decode MLA: Q/K D 512, the key is the value
constexpr int64_t kMlaPrefillDim = 128;    // prefill MLA (separate rope): Q/K/V D 128
constexpr int64_t kMaxMlaQueryRows = 16;   // decode MLA: Q_S (per batch) 1-16
constexpr int64_t kMaxMlaHeads = 128;
constexpr int64_t kNzHalfLanes = 16;        // NZ D0 of a 16-bit cache (int8: 32)
constexpr int64_t kPseDecodeAlign = 16;    // decode pse: D % 16 == 0

// The inputLayout values each MLA form takes (torch_npu v2 doc, "MLA constraints"; spec 3 lists
// the same for D 512): decode MLA's output-transposing forms are the NBSD ones and TND_NTD,
// prefill MLA's the BNSD ones, BNSD_BSND and NTD_TND.
constexpr const char* kMlaDecodeLayouts[] = {"BSH", "BSND", "BNSD", "BSH_NBSD", "BSND_NBSD", "BNSD_NBSD", "TND", "TND_NTD"};
constexpr const char* kMlaPrefillLayouts[] = {"BSH", "BSND", "BNSD", "TND", "NTD", "BSH_BNSD", "BSND_BNSD", "BNSD_BSND", "NTD_TND"};

std::string dtypeName(DType d) { return attnopsDataTypeName(attnopsDataType(int(d))); }

template <size_t N>
void requireMlaLayout(const LayoutPair& lp, int64_t d, const char* const (&names)[N]) {
    std::string list;
    for (const char* name : names) {
        if (std::strcmp(name, lp.name) == 0) return;
        list += list.empty() ? name : fmt::format(", {}", name);
    }
    invalidArgument("inputLayout", lp.name, "MLA with D {} takes {}", d, list);
}

std::vector<int64_t> shapeOf(const attnopsTensor& t) { return {t.shape.begin(), t.shape.begin() + t.rank}; }

// `t`'s shape with its head-dim part sized for `dim` instead: the last axis (BSH / BnBsH: heads *
// dim), or for an NZ cache the D/D0 axis.
std::vector<int64_t> withHeadDim(const attnopsTensor& t, bool hidden, int64_t heads, bool nz, int64_t dim) {
    std::vector<int64_t> shape = shapeOf(t);
    if (nz)
        shape[2] = dim / shape[4];
    else
        shape.back() = hidden ? heads * dim : dim;
    return shape;
}

}  // namespace

void checkPseShift(const Args& a, const attnopsTensor& pse, const CheckedShapes& s, Params& p) {
    if (p.layout == fa::Layout::TND)
        invalidArgument("pseShift", "non-NULL", "is not supported with inputLayout TND (spec 10)");
    if (a.queryRope || a.keyRope) invalidArgument("pseShift", "non-NULL", "is not supported with MLA (queryRope/keyRope given)");
    if (s.d != s.dv)
        invalidArgument("pseShift", "non-NULL", "is not supported when the value's D ({}) differs from the query's ({})", s.dv, s.d);
    if (a.learnableSink) invalidArgument("pseShift", "non-NULL", "is not supported with learnableSink");
    const DType pseType = p.core.q.dtype == DType::I8 ? DType::F16 : p.core.q.dtype;  // int8 query: fp16 (spec 10)
    if (pse.dtype != pseType)
        invalidArgument("pseShift.dtype", dtypeName(pse.dtype), "must be {}: fp16 pse with fp16 or int8 query, bf16 with bf16 (query.dtype is {})",
                        dtypeName(pseType), dtypeName(p.core.q.dtype));
    const bool ok = pse.rank == 4 && (pse.shape[0] == 1 || pse.shape[0] == s.batch) && pse.shape[1] == s.n1 &&
                    pse.shape[2] >= s.qS && pse.shape[3] >= s.maskCols;
    if (!ok)
        invalidArgument("pseShift.shape", shapeString(pse), "must be [B|1, Q_N, P_S1, P_S2] with B = {}, Q_N = {}, P_S1 >= Q_S = {}, "
                        "P_S2 >= {} ({})", s.batch, s.n1, s.qS, s.maskCols,
                        p.table.data ? "maxBlocksPerSeq * blockSize of the block table" : "the key's S");
    if (p.decode && s.d % kPseDecodeAlign != 0)
        invalidArgument("query.shape", fmt::format("D = {}", s.d), "with pseShift and Q_S = 1 the head dim must be a multiple of {}",
                        kPseDecodeAlign);
    if (p.decode && s.int8Kv && pse.shape[2] != 1)
        invalidArgument("pseShift.shape", shapeString(pse), "with int8 key/value and Q_S = 1 must have P_S1 = 1");
    fa::PseSpec& ps = p.core.pse;
    ps.form = fa::PseForm::Dense;
    ps.type = 0;  // added after the scale (spec 5 step 6)
    ps.view.data = pse.data;
    ps.view.dtype = pse.dtype;
    ps.view.stride[0] = pse.shape[0] == 1 ? 0 : pse.strides[0];
    for (int i = 1; i < 4; ++i) ps.view.stride[i] = pse.strides[i];
}

void checkRope(const Args& a, const attnopsTensor& q, const attnopsTensor& k, const attnopsTensor& v,
               const attnopsTensor* qr, const attnopsTensor* kr, const CheckedShapes& s, Params& p) {
    if ((qr == nullptr) != (kr == nullptr))
        nullArgument(qr ? "keyRope" : "queryRope", fmt::format("must be given together with {} (MLA)", qr ? "queryRope" : "keyRope"));
    if (!qr) return;
    if (s.tensorList)
        invalidArgument("keyCount", a.keyCount, "tensor-list key/value are not supported with MLA (queryRope/keyRope given): decode "
                        "MLA (D {}) reads a paged cache, which excludes tensor lists (spec 4, 8), and prefill MLA (D {}) excludes "
                        "them too (torch_npu's MLA constraints)", kMlaDecodeDim, kMlaPrefillDim);
    const bool paged = p.table.data != nullptr, tnd = p.layout == fa::Layout::TND;
    // An int8 query is MLA full quantisation (spec 9.2): int8 key/value, bf16 rope parts.
    const bool fullQuant = q.dtype == DType::I8;
    if (s.int8Kv && !fullQuant)
        invalidArgument("key.dtype", "int8", "MLA (queryRope/keyRope) takes int8 key/value only with an int8 query (MLA full quantisation)");
    if (fullQuant) {
        if (qr->dtype != DType::BF16)
            invalidArgument("queryRope.dtype", dtypeName(qr->dtype), "must be bf16 with an int8 query (MLA full quantisation)");
        if (kr->dtype != DType::BF16)
            invalidArgument("keyRope.dtype", dtypeName(kr->dtype), "must be bf16 with an int8 query (MLA full quantisation)");
    } else {
        if (qr->dtype != q.dtype)
            invalidArgument("queryRope.dtype", dtypeName(qr->dtype), "must equal query.dtype ({})", dtypeName(q.dtype));
        if (kr->dtype != k.dtype) invalidArgument("keyRope.dtype", dtypeName(kr->dtype), "must equal key.dtype ({})", dtypeName(k.dtype));
    }
    if (s.d != kMlaDecodeDim && s.d != kMlaPrefillDim)
        invalidArgument("query.shape", shapeString(q), "with queryRope the query's D must be {} or {}, not {}", kMlaPrefillDim,
                        kMlaDecodeDim, s.d);
    const bool hidden = p.layout == fa::Layout::BSH;
    const std::vector<int64_t> qWant = withHeadDim(q, hidden, s.n1, false, kRopeDim);
    if (shapeOf(*qr) != qWant)
        invalidArgument("queryRope.shape", shapeString(*qr), "must be {} (the query's shape with D = {})", dimsText(qWant), kRopeDim);
    const bool nz = p.cache == CacheFormat::NZ;
    std::vector<int64_t> kWant = withHeadDim(k, paged ? p.cache == CacheFormat::BnBsH : hidden, s.n2, nz, kRopeDim);
    if (nz && kr->dtype != k.dtype) {  // a bf16 rope beside an int8 NZ key: its own 16-lane groups
        kWant[4] = kNzHalfLanes;
        kWant[2] = kRopeDim / kNzHalfLanes;
    }
    if (shapeOf(*kr) != kWant)
        invalidArgument("keyRope.shape", shapeString(*kr), "must be {} (the key's shape with D = {})", dimsText(kWant), kRopeDim);
    for (const auto& [t, name] : {std::pair{a.quantScale2, "quantScale2"}, std::pair{a.quantOffset2, "quantOffset2"},
                                  std::pair{a.keySharedPrefix, "keySharedPrefix"}, std::pair{a.valueSharedPrefix, "valueSharedPrefix"},
                                  std::pair{a.queryPaddingSize, "queryPaddingSize"}, std::pair{a.kvPaddingSize, "kvPaddingSize"}})
        if (t) invalidArgument(name, "non-NULL", "is not supported with MLA (queryRope/keyRope given)");

    if (s.d == kMlaDecodeDim) {  // decode MLA (spec 1, 3, 6, 10)
        requireMlaLayout(s.layoutPair, kMlaDecodeDim, kMlaDecodeLayouts);
        if (s.n2 != 1) invalidArgument("numKeyValueHeads", s.n2, "must be 1 for MLA with D {}", kMlaDecodeDim);
        if (s.n1 > kMaxMlaHeads || (s.n1 & (s.n1 - 1)) != 0)
            invalidArgument("numHeads", s.n1, "must be a power of two <= {} for MLA with D {}", kMaxMlaHeads, kMlaDecodeDim);
        if (!paged) nullArgument("blockTable", fmt::format("is required for MLA with D {} (paged attention)", kMlaDecodeDim));
        if (nz && p.layout == fa::Layout::BNSD)
            invalidArgument("inputLayout", "BNSD", "MLA with an NZ cache takes BSH, BSND or TND");
        for (int64_t b = 0; b < s.batch; ++b)
            if (p.core.seq.qLen[size_t(b)] > kMaxMlaQueryRows)
                invalidArgument(tnd ? fmt::format("actualSeqLengths[{}]", b) : std::string("query.shape"),
                                tnd ? std::to_string(p.core.seq.qLen[size_t(b)]) : shapeString(q),
                                "MLA with D {} takes 1-{} query rows per batch", kMlaDecodeDim, kMaxMlaQueryRows);
        const int64_t mode = a.sparseMode;
        if (!(mode == 3 || mode == 4 || mode == 9 || (mode == 0 && a.attenMask == nullptr)))
            invalidArgument("sparseMode", mode, "MLA with D {} takes sparseMode 0 without attenMask, 3, 4 or 9{}", kMlaDecodeDim,
                            a.attenMask && mode == 0 ? " (attenMask given)" : "");
        if (tnd && a.softmaxLseFlag)
            invalidArgument("softmaxLseFlag", "true", "is not supported for MLA with D {} and inputLayout TND", kMlaDecodeDim);
        if (a.learnableSink) invalidArgument("learnableSink", "non-NULL", "is not supported with decode MLA (D {})", kMlaDecodeDim);
        if (shapeOf(v) != shapeOf(k) || v.dtype != k.dtype)
            invalidArgument("value.shape", shapeString(v), "must equal key.shape {} (decode MLA reads the key as the value)",
                            shapeString(k));
        p.value = p.key;  // the value input does not take effect (spec 1)
        p.valueIsKey = true;
    } else {  // prefill MLA with separate rope (spec 1, 10)
        requireMlaLayout(s.layoutPair, kMlaPrefillDim, kMlaPrefillLayouts);
        if (q.dtype != DType::BF16) invalidArgument("query.dtype", dtypeName(q.dtype), "MLA with D {} takes bf16", kMlaPrefillDim);
        if (s.n1 != s.n2)
            invalidArgument("numKeyValueHeads", s.n2, "must equal numHeads = {} for MLA with D {}", s.n1, kMlaPrefillDim);
        if (paged) invalidArgument("blockTable", "non-NULL", "is not supported for MLA with D {}", kMlaPrefillDim);
        if (s.dv != kMlaPrefillDim)
            invalidArgument("value.shape", shapeString(v), "must have D = {} for MLA with D {}", kMlaPrefillDim, kMlaPrefillDim);
    }

    p.ropeDim = kRopeDim;
    // The rope parts lie like the query and key: in the input form (NTD's axis order is not TND's).
    p.queryRope = viewOf<fa::View4>(*qr, s.layoutPair.in, kRopeDim);
    if (paged) {
        p.keyRope = pagedSource(*kr, p.cache, kRopeDim);
    } else {
        const fa::View4 view = viewOf<fa::View4>(*kr, s.layoutPair.in, kRopeDim);
        p.keyRope.data = view.data;
        p.keyRope.dtype = view.dtype;
        p.keyRope.batchStride = view.stride[0];
        p.keyRope.headStride = view.stride[1];
        p.keyRope.rowStride = view.stride[2];
        p.keyRope.dimStride = view.stride[3];
    }
}

void checkTreeMask(const Args& a, const attnopsTensor* mask, const CheckedShapes& s, Params& p) {
    if (!mask) nullArgument("attenMask", "is required with sparseMode 9 (the tree mask)");
    for (const auto& [t, name] : {std::pair{a.pseShift, "pseShift"}, std::pair{a.quantScale2, "quantScale2"},
                                  std::pair{a.keySharedPrefix, "keySharedPrefix"}, std::pair{a.queryPaddingSize, "queryPaddingSize"},
                                  std::pair{a.kvPaddingSize, "kvPaddingSize"}})
        if (t) invalidArgument(name, "non-NULL", "is not supported with sparseMode 9 (the tree mask)");
    if (s.int8Kv) invalidArgument("key.dtype", "int8", "sparseMode 9 (the tree mask) takes non-quantised key/value");
    const fa::Sequences& seq = p.core.seq;
    for (int64_t b = 0; b < s.batch; ++b)
        if (seq.qLen[size_t(b)] > seq.kvLen[size_t(b)])
            invalidArgument(fmt::format("{}[{}]", a.kvLengthsName, b), seq.kvLen[size_t(b)],
                            "with sparseMode 9 must be >= the batch's query length {} (the draft tokens are the last keys)",
                            seq.qLen[size_t(b)]);
    p.tree = static_cast<const uint8_t*>(mask->data);
    if (p.layout == fa::Layout::TND) {
        int64_t total = 0;
        for (int64_t b = 0; b < s.batch; ++b) {
            p.treeBase.push_back(total * mask->strides[0]);
            total += seq.qLen[size_t(b)] * seq.qLen[size_t(b)];
        }
        if (!shapeIs(*mask, {total}))
            invalidArgument("attenMask.shape", shapeString(*mask),
                            "with sparseMode 9 and inputLayout TND must be [{}] (the sum of each batch's Sq * Sq)", total);
        if (mask->strides[0] != 1)
            invalidArgument("attenMask.strides", mask->strides[0], "the packed tree mask must be contiguous");
        return;
    }
    if (!shapeIs(*mask, {s.batch, s.qS, s.qS}))
        invalidArgument("attenMask.shape", shapeString(*mask), "with sparseMode 9 must be [B, Q_S, Q_S] = [{}, {}, {}]", s.batch,
                        s.qS, s.qS);
    for (int i = 0; i < 3; ++i) p.treeStride[i] = mask->strides[i];
}

}  // namespace attnops::fia

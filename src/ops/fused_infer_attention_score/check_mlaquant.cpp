// MLA full quantisation rules of FusedInferAttentionScore (spec 9.2 "MLA full quant", A2/A3 decode
// MLA with D 512): an int8 query with a per-token-per-head fp32 dequantScaleQuery
// (queryQuantMode 3), int8 key/value (the key read as the value) with per-tensor fp32
// key/valueAntiquantScale (modes 0, no offsets), bf16 rope parts left unscaled, bf16 output. The
// rope and decode-MLA rules themselves are checkRope's (check_features.cpp). Each failure names
// the argument, the value received and the rule broken.
#include "ops/fused_infer_attention_score/check_mlaquant.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/handles.hpp"

namespace attnops::fia {
namespace {

constexpr int64_t kQueryQuantPerTokenHead = 3;  // spec 9.2: the only queryQuantMode of MLA full quant (A2/A3)

std::string dtypeName(DType d) { return d == DType::I4 ? "int4" : attnopsDataTypeName(attnopsDataType(int(d))); }

std::string dimsText(const std::vector<int64_t>& d) {
    std::string s = "[";
    for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
    return s + "]";
}

// A per-tensor fp32 scale [1] of key or value; returns its value.
float perTensorScale(const attnopsTensor* t, const char* name) {
    if (!t) nullArgument(name, "is required with MLA full quantisation (int8 key/value, spec 9.2)");
    if (t->dtype != DType::F32) invalidArgument(fmt::format("{}.dtype", name), dtypeName(t->dtype), "must be fp32 with MLA full quantisation");
    if (!shapeIs(*t, {1})) invalidArgument(fmt::format("{}.shape", name), shapeString(*t), "must be [1] (per tensor) with MLA full quantisation");
    float v = 0.0f;
    std::memcpy(&v, t->data, sizeof v);
    if (!std::isfinite(v)) invalidArgument(name, v, "must be finite");
    return v;
}

}  // namespace

void checkMlaFullQuant(const Args& a, const MlaQuantShapes& s, int32_t device, Params& p) {
    if (a.queryQuantMode != kQueryQuantPerTokenHead)
        invalidArgument("queryQuantMode", a.queryQuantMode, "must be {} (per token and head) with an int8 query and queryRope (MLA full quantisation)",
                        kQueryQuantPerTokenHead);
    if (s.d != 512) invalidArgument("query.shape", fmt::format("D = {}", s.d), "MLA full quantisation takes D = 512 (decode MLA)");
    if (s.key != DType::I8) invalidArgument("key.dtype", dtypeName(s.key), "must be int8 with MLA full quantisation");
    for (auto [t, name] : {std::pair{a.deqScale1, "deqScale1"}, std::pair{a.quantScale1, "quantScale1"}, std::pair{a.deqScale2, "deqScale2"},
                           std::pair{a.antiquantScale, "antiquantScale"}, std::pair{a.antiquantOffset, "antiquantOffset"},
                           std::pair{a.keyAntiquantOffset, "keyAntiquantOffset"}, std::pair{a.valueAntiquantOffset, "valueAntiquantOffset"}})
        if (t) invalidArgument(name, "non-NULL", "is not used with MLA full quantisation (dequantScaleQuery, key/valueAntiquantScale only)");
    for (auto [mode, name] : {std::pair{a.keyAntiquantMode, "keyAntiquantMode"}, std::pair{a.valueAntiquantMode, "valueAntiquantMode"}})
        if (mode != 0) invalidArgument(name, mode, "must be 0 (per tensor) with MLA full quantisation");

    // dequantScaleQuery: the query's shape without D (BSH: [B, S, Q_N]), fp32.
    const attnopsTensor* dq = optionalTensorOn(a.dequantScaleQuery, "dequantScaleQuery", device);
    if (!dq) nullArgument("dequantScaleQuery", "is required with an int8 query and queryRope (MLA full quantisation, spec 9.2)");
    if (dq->dtype != DType::F32) invalidArgument("dequantScaleQuery.dtype", dtypeName(dq->dtype), "must be fp32");
    std::vector<int64_t> want(s.query->shape.begin(), s.query->shape.begin() + s.query->rank - 1);
    if (s.layout == fa::Layout::BSH) want.push_back(s.n1);
    if (!shapeIs(*dq, want))
        invalidArgument("dequantScaleQuery.shape", shapeString(*dq), "must be {} (the query's shape without D: one scale per token and head)",
                        dimsText(want));
    QueryDequant& qd = p.queryDequant;
    qd.scale = static_cast<const float*>(dq->data);
    switch (s.layout) {
        case fa::Layout::BNSD:  // [B, N, S]
            qd.stride[0] = dq->strides[0], qd.stride[1] = dq->strides[1], qd.stride[2] = dq->strides[2];
            break;
        case fa::Layout::TND:  // [T, N]: rows are packed
            qd.stride[0] = 0, qd.stride[1] = dq->strides[1], qd.stride[2] = dq->strides[0];
            break;
        default:  // BSH, BSND: [B, S, N]
            qd.stride[0] = dq->strides[0], qd.stride[1] = dq->strides[2], qd.stride[2] = dq->strides[1];
            break;
    }

    const attnopsTensor* ks = optionalTensorOn(a.keyAntiquantScale, "keyAntiquantScale", device);
    const attnopsTensor* vs = optionalTensorOn(a.valueAntiquantScale, "valueAntiquantScale", device);
    const float keyScale = perTensorScale(ks, "keyAntiquantScale"), valueScale = perTensorScale(vs, "valueAntiquantScale");
    p.keyQuant.mode = Antiquant::PerChannel;  // one entry: per tensor
    p.keyQuant.headDim = s.d;
    p.keyQuant.scale = {keyScale};
    p.valueQuant.mode = Antiquant::PerChannel;
    p.valueQuant.headDim = s.dv;
    p.valueQuant.scale = {valueScale};
}

}  // namespace attnops::fia

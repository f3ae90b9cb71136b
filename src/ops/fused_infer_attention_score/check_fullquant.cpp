// Full int8 quantisation rules of FusedInferAttentionScore (spec 9.2, 11): which operands go
// with an int8 query, their dtypes and shapes, the cases the operator does not define (decode,
// paged cache, shared prefix, MLA, D not 32-aligned), each failure naming the argument, the
// value received and the rule broken.
#include "ops/fused_infer_attention_score/check_fullquant.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <string>

#include "core/error.hpp"
#include "core/handles.hpp"
#include "ops/fused_infer_attention_score/check_mlaquant.hpp"

namespace attnops::fia {
namespace {

constexpr int64_t kInt8DimAlign = 32;        // spec 12: D 32-aligned for int8
constexpr uint32_t kFloat19Mask = 0xffffe000u;  // spec 9.2: the low 13 mantissa bits cleared

std::string dtypeName(DType d) { return d == DType::I4 ? "int4" : attnopsDataTypeName(attnopsDataType(int(d))); }

const attnopsTensor& perTensor(const attnopsTensor* t, const char* name) {
    if (!t) nullArgument(name, "is required with an int8 query (full quantisation, spec 9.2)");
    if (!shapeIs(*t, {1})) invalidArgument(fmt::format("{}.shape", name), shapeString(*t), "must be [1] (per-tensor, spec 9.2)");
    return *t;
}

}  // namespace

float decodeDeqScale(const attnopsTensor& t, bool truncate) {
    uint32_t bits = 0;
    if (t.dtype == DType(ATTNOPS_UINT64)) {
        uint64_t word = 0;
        std::memcpy(&word, t.data, sizeof word);
        bits = uint32_t(word & 0xffffffffu) & kFloat19Mask;  // the fp32 in the low half (upper half ignored)
    } else {
        std::memcpy(&bits, t.data, sizeof bits);
        if (truncate) bits &= kFloat19Mask;
    }
    return bitsToFloat(bits);
}

bool checkFullQuant(const Args& a, const FullQuantShapes& s, int32_t device, Params& p) {
    const attnopsTensor* deq1 = optionalTensorOn(a.deqScale1, "deqScale1", device);
    const attnopsTensor* q1 = optionalTensorOn(a.quantScale1, "quantScale1", device);
    const attnopsTensor* deq2 = optionalTensorOn(a.deqScale2, "deqScale2", device);
    if (s.query != DType::I8) {
        for (auto [t, name] : {std::pair{deq1, "deqScale1"}, std::pair{q1, "quantScale1"}, std::pair{deq2, "deqScale2"},
                               std::pair{a.dequantScaleQuery, "dequantScaleQuery"}})
            if (t) invalidArgument(name, "non-NULL", "is only used with an int8 query (full quantisation; query.dtype is {})",
                                   dtypeName(s.query));
        if (a.queryQuantMode != 0)
            invalidArgument("queryQuantMode", a.queryQuantMode, "must be 0 with a {} query (3 is for an int8 query with MLA)", dtypeName(s.query));
        return false;
    }
    if (s.rope) {  // MLA full quantisation (spec 9.2, decode MLA): its own operands
        MlaQuantShapes m;
        m.query = s.queryTensor;
        m.layout = s.layout;
        m.n1 = s.n1;
        m.d = s.d;
        m.dv = s.dv;
        m.key = s.key;
        checkMlaFullQuant(a, m, device, p);
        return true;
    }
    if (a.queryQuantMode != 0)
        invalidArgument("queryQuantMode", a.queryQuantMode, "must be 0 with an int8 query without queryRope (3 is MLA full quantisation)");
    // The int8-query cases the operator defines (spec 9.2, 11, 12).
    if (s.key != DType::I8)
        invalidArgument("key.dtype", dtypeName(s.key), "must be int8 with an int8 query (full quantisation, spec 9.2)");
    if (s.decode)
        invalidArgument("query.dtype", "int8", "full quantisation needs Q_S > 1 or inputLayout TND (Q_S = 1 decode has no int8 query)");
    if (s.paged) invalidArgument("blockTable", "non-NULL", "is not supported with an int8 query (full quantisation, spec 9.2)");
    if (s.prefix) invalidArgument("keySharedPrefix", "non-NULL", "is not supported with an int8 query (full quantisation, spec 10)");
    if (a.dequantScaleQuery)
        invalidArgument("dequantScaleQuery", "non-NULL", "is only used with MLA full quantisation (an int8 query with queryRope)");
    if (s.d % kInt8DimAlign != 0)
        invalidArgument("query.shape", fmt::format("D = {}", s.d), "full quantisation needs the head dim a multiple of {}", kInt8DimAlign);
    if (s.out != DType::F16 && s.out != DType::I8)
        invalidArgument("attentionOut.dtype", dtypeName(s.out), "must be fp16, or int8 with quantScale2, with an int8 query");
    for (auto [t, name] : {std::pair{a.antiquantScale, "antiquantScale"}, std::pair{a.antiquantOffset, "antiquantOffset"},
                           std::pair{a.keyAntiquantScale, "keyAntiquantScale"}, std::pair{a.keyAntiquantOffset, "keyAntiquantOffset"},
                           std::pair{a.valueAntiquantScale, "valueAntiquantScale"},
                           std::pair{a.valueAntiquantOffset, "valueAntiquantOffset"}})
        if (t) invalidArgument(name, "non-NULL", "is not used with an int8 query (full quantisation takes deqScale1/deqScale2)");

    const attnopsTensor& d1 = perTensor(deq1, "deqScale1");
    const attnopsTensor& qs1 = perTensor(q1, "quantScale1");
    const attnopsTensor& d2 = perTensor(deq2, "deqScale2");
    for (auto [t, name] : {std::pair{&d1, "deqScale1"}, std::pair{&d2, "deqScale2"}})
        if (t->dtype != DType::F32 && t->dtype != DType(ATTNOPS_UINT64))
            invalidArgument(fmt::format("{}.dtype", name), dtypeName(t->dtype), "must be fp32 or uint64 (an fp32 in the low 32 bits)");
    if (qs1.dtype != DType::F32) invalidArgument("quantScale1.dtype", dtypeName(qs1.dtype), "must be fp32");

    FullQuant& f = p.fullQuant;
    f.on = true;
    f.deqScale1 = decodeDeqScale(d1, true);  // the kernel truncates deqScale1 to float19 either way
    f.deqScale2 = decodeDeqScale(d2, false);
    std::memcpy(&f.quantScale1, qs1.data, sizeof f.quantScale1);
    for (auto [v, name] : {std::pair{f.deqScale1, "deqScale1"}, std::pair{f.quantScale1, "quantScale1"}, std::pair{f.deqScale2, "deqScale2"}})
        if (!std::isfinite(v)) invalidArgument(name, v, "must be finite");
    if (!std::isfinite(float(a.scaleValue))) invalidArgument("scaleValue", a.scaleValue, "must be finite in fp32");
    f.scale = roundTo(DType::F16, float(a.scaleValue));
    if (!std::isfinite(f.scale)) invalidArgument("scaleValue", a.scaleValue, "must be finite in fp16 with an int8 query (|x| <= 65504)");
    return true;
}

}  // namespace attnops::fia

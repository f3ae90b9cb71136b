// FusedInferAttentionScore quantisation rules (spec 9.1, 9.3): which dequantisation mode each
// operand shape and dtype means, and the int8 output scales. Each failure names the argument,
// the value received and the rule broken.
#include "ops/fused_infer_attention_score/check_quant.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "core/error.hpp"

namespace attnops::fia {
namespace {

constexpr int64_t kInt4PerInt32 = 8;
constexpr int64_t kInt4DimAlign = 64;
constexpr int64_t kPerChannelOutAlignBytes = 32;

std::string dtypeName(DType d) {
    return d == DType::I4 ? "int4" : attnopsDataTypeName(attnopsDataType(int(d)));
}
std::vector<int64_t> shapeOf(const attnopsTensor& t) { return {t.shape.begin(), t.shape.begin() + t.rank}; }

struct Names {
    std::string scale, offset;
};

void sameAsScale(const attnopsTensor& scale, const attnopsTensor* offset, const Names& nm) {
    if (!offset) return;
    if (offset->dtype != scale.dtype)
        invalidArgument(fmt::format("{}.dtype", nm.offset), dtypeName(offset->dtype), "must equal {}.dtype ({})", nm.scale,
                        dtypeName(scale.dtype));
    if (shapeOf(*offset) != shapeOf(scale))
        invalidArgument(fmt::format("{}.shape", nm.offset), shapeString(*offset), "must equal {}.shape {}", nm.scale,
                        shapeString(scale));
}

void requireDType(const attnopsTensor& t, DType want, const std::string& name, const std::string& why) {
    if (t.dtype != want)
        invalidArgument(fmt::format("{}.dtype", name), dtypeName(t.dtype), "must be {} ({})", dtypeName(want), why);
}

// Per-token views: axes of the batch (or block), the head (-1: none) and the token.
void tokenView(AntiquantSpec& q, const attnopsTensor& scale, const attnopsTensor* offset, int bAxis, int hAxis, int tAxis) {
    q.mode = Antiquant::PerToken;
    q.tokenScale = static_cast<const float*>(scale.data);
    q.tokenStride[0] = scale.strides[bAxis];
    q.tokenStride[1] = scale.strides[tAxis];
    q.tokenHeadStride = hAxis >= 0 ? scale.strides[hAxis] : 0;
    if (offset) {
        q.tokenOffset = static_cast<const float*>(offset->data);
        q.tokenOffsetStride[0] = offset->strides[bAxis];
        q.tokenOffsetStride[1] = offset->strides[tAxis];
        q.tokenOffsetHeadStride = hAxis >= 0 ? offset->strides[hAxis] : 0;
    }
}

// Separate-style parameters of one source in mode 0-5 (spec 9.1 table).
AntiquantSpec antiquantOf(const attnopsTensor* scale, const attnopsTensor* offset, int64_t mode, const Names& nm,
                          const QuantShapes& s, int64_t headDim) {
    AntiquantSpec q;
    q.headDim = headDim;
    if (!scale) nullArgument(nm.scale, "is required with int8/int4 key/value (dequantisation)");
    sameAsScale(*scale, offset, nm);
    const int64_t n = s.n2, d = headDim;
    const bool int4 = s.kv == DType::I4;
    const std::string scaleShape = fmt::format("{}.shape", nm.scale);
    auto int8Only = [&](const char* what) {
        if (int4) invalidArgument(scaleShape, shapeString(*scale), "{} dequantises int8 key/value only (key is int4)", what);
    };
    switch (mode) {
        case 0: {
            requireDType(*scale, s.query, nm.scale, "query.dtype in mode 0");
            const bool ok = shapeIs(*scale, {1}) || shapeIs(*scale, {n * d}) || shapeIs(*scale, {n, d}) ||
                            shapeIs(*scale, {n, 1, d}) || shapeIs(*scale, {1, n * d}) || shapeIs(*scale, {1, n, d}) ||
                            shapeIs(*scale, {1, n, 1, d});
            if (!ok)
                invalidArgument(scaleShape, shapeString(*scale),
                                "per-channel (mode 0) must be [1] or [KV_N*D], [KV_N,D], [KV_N,1,D] with an optional leading 1 "
                                "(KV_N = {}, D = {})",
                                n, d);
            if (scale->numel() == 1 && n * d != 1) int8Only("per-tensor [1] (mode 0)");
            q.mode = Antiquant::PerChannel;
            q.scale = readAll(*scale);
            if (offset) q.offset = readAll(*offset);
            return q;
        }
        case 2: {  // per-tensor x per-head: channel c of head m uses entry m
            int8Only("per-head (mode 2)");
            requireDType(*scale, s.query, nm.scale, "query.dtype in mode 2");
            if (!shapeIs(*scale, {n})) invalidArgument(scaleShape, shapeString(*scale), "per-head (mode 2) must be [KV_N] = [{}]", n);
            q.mode = Antiquant::PerChannel;
            const std::vector<float> perHead = readAll(*scale), perHeadOffset = offset ? readAll(*offset) : std::vector<float>{};
            for (int64_t m = 0; m < n; ++m)
                for (int64_t c = 0; c < d; ++c) {
                    q.scale.push_back(perHead[size_t(m)]);
                    if (offset) q.offset.push_back(perHeadOffset[size_t(m)]);
                }
            return q;
        }
        case 1: {
            requireDType(*scale, DType::F32, nm.scale, "per-token, mode 1");
            const int r = scale->rank;
            if (!((r == 2 || (r == 3 && scale->shape[0] == 1)) && scale->shape[r - 2] == s.batch && scale->shape[r - 1] >= s.tokens))
                invalidArgument(scaleShape, shapeString(*scale), "per-token (mode 1) must be [B,S] or [1,B,S] with B = {} and S >= {}",
                                s.batch, s.tokens);
            tokenView(q, *scale, offset, r - 2, -1, r - 1);
            return q;
        }
        case 3: {
            requireDType(*scale, DType::F32, nm.scale, "per-token x per-head, mode 3");
            if (!(scale->rank == 3 && scale->shape[0] == s.batch && scale->shape[1] == n && scale->shape[2] >= s.tokens))
                invalidArgument(scaleShape, shapeString(*scale), "per-token x per-head (mode 3) must be [B,KV_N,S] with B = {}, KV_N = {}, "
                                "S >= {}", s.batch, n, s.tokens);
            tokenView(q, *scale, offset, 0, 1, 2);
            return q;
        }
        default: {  // 4, 5: per token, laid out like the paged cache
            int8Only(mode == 4 ? "per-token PA-managed (mode 4)" : "per-token x per-head PA-managed (mode 5)");
            requireDType(*scale, DType::F32, nm.scale, fmt::format("PA-managed per-token, mode {}", mode));
            if (s.blockNum == 0)
                nullArgument("blockTable", fmt::format("is required with {} mode {} (scales laid out like the paged cache)", nm.scale, mode));
            const bool ok = mode == 4 ? shapeIs(*scale, {s.blockNum, s.blockSize}) : shapeIs(*scale, {s.blockNum, n, s.blockSize});
            if (!ok)
                invalidArgument(scaleShape, shapeString(*scale), "mode {} must be {} (blockNum = {}, blockSize = {}, KV_N = {})", mode,
                                mode == 4 ? "[blockNum, blockSize]" : "[blockNum, KV_N, blockSize]", s.blockNum, s.blockSize, n);
            tokenView(q, *scale, offset, 0, mode == 4 ? -1 : 1, mode == 4 ? 1 : 2);
            q.tokenPaged = true;
            return q;
        }
    }
}

// Entry i (0 key, 1 value) of a combined [2, ...] operand as a tensor of its own; [2] gives [1].
attnopsTensor sliceLeading(const attnopsTensor& t, int64_t i) {
    attnopsTensor r = t;
    r.data = static_cast<char*>(t.data) + i * t.strides[0] * int64_t(attnopsDataTypeSize(attnopsDataType(int(t.dtype))));
    r.rank = t.rank - 1;
    for (int j = 0; j < r.rank; ++j) {
        r.shape[size_t(j)] = t.shape[size_t(j) + 1];
        r.strides[size_t(j)] = t.strides[size_t(j) + 1];
    }
    if (r.rank == 0) {
        r.rank = 1;
        r.shape[0] = 1;
        r.strides[0] = 1;
    }
    return r;
}

// Combined style: antiquantScale/antiquantOffset [2, ...] = [key, value] (spec 9.1).
void combinedAntiquant(const Args& a, const QuantShapes& s, int32_t device, Params& p) {
    const attnopsTensor* scale = optionalTensorOn(a.antiquantScale, "antiquantScale", device);
    const attnopsTensor* offset = optionalTensorOn(a.antiquantOffset, "antiquantOffset", device);
    if (!scale)
        nullArgument("keyAntiquantScale", "is required with int8/int4 key/value (or the combined antiquantScale with int8)");
    if (s.kv == DType::I4)
        invalidArgument("antiquantScale", "non-NULL", "the combined style dequantises int8 key/value only (int4: pass "
                        "keyAntiquantScale/valueAntiquantScale)");
    const Names nm{"antiquantScale", "antiquantOffset"};
    sameAsScale(*scale, offset, nm);
    const int64_t n = s.n2, d = s.d;
    if (a.antiquantMode == 0) {
        requireDType(*scale, s.query, nm.scale, "query.dtype with antiquantMode 0");
        if (!(shapeIs(*scale, {2}) || shapeIs(*scale, {2, n, 1, d}) || shapeIs(*scale, {2, n, d}) || shapeIs(*scale, {2, n * d})))
            invalidArgument("antiquantScale.shape", shapeString(*scale),
                            "with antiquantMode 0 must be per-tensor [2] or per-channel [2,KV_N,1,D], [2,KV_N,D], [2,KV_N*D] "
                            "(KV_N = {}, D = {})", n, d);
    } else {
        requireDType(*scale, DType::F32, nm.scale, "per-token, antiquantMode 1");
        if (!(scale->rank == 3 && scale->shape[0] == 2 && scale->shape[1] == s.batch && scale->shape[2] >= s.tokens))
            invalidArgument("antiquantScale.shape", shapeString(*scale),
                            "with antiquantMode 1 (per-token) must be [2,B,S] with B = {} and S >= {}", s.batch, s.tokens);
    }
    const char* which[2] = {"key", "value"};
    for (int64_t i = 0; i < 2; ++i) {
        const attnopsTensor sc = sliceLeading(*scale, i);
        attnopsTensor off;
        if (offset) off = sliceLeading(*offset, i);
        const Names part{fmt::format("antiquantScale[{}] ({})", i, which[i]), fmt::format("antiquantOffset[{}] ({})", i, which[i])};
        AntiquantSpec q = antiquantOf(&sc, offset ? &off : nullptr, a.antiquantMode, part, s, i == 0 ? s.d : s.dv);
        (i == 0 ? p.keyQuant : p.valueQuant) = std::move(q);
    }
}

}  // namespace

std::vector<float> readAll(const attnopsTensor& t) {
    // Row-major order, the last dimension innermost; the outer indices advance as an odometer, so
    // no element costs a division (a call reads its scales every time: per-channel int8 scales
    // took 5% of a 1,024-token decode step when each element divided by every dimension).
    std::vector<float> out(size_t(t.numel()));
    if (out.empty()) return out;
    const int last = t.rank - 1;
    const int64_t inner = last >= 0 ? t.shape[size_t(last)] : 1, step = last >= 0 ? t.strides[size_t(last)] : 0;
    std::vector<int64_t> index(size_t(std::max(0, last)), 0);
    int64_t at = 0;
    for (int64_t flat = 0; flat < int64_t(out.size()); flat += inner) {
        for (int64_t i = 0; i < inner; ++i) out[size_t(flat + i)] = loadAsFloat(t.data, at + i * step, t.dtype);
        for (int d = last - 1; d >= 0; --d) {
            at += t.strides[size_t(d)];
            if (++index[size_t(d)] < t.shape[size_t(d)]) break;
            at -= t.strides[size_t(d)] * t.shape[size_t(d)];
            index[size_t(d)] = 0;
        }
    }
    return out;
}

attnopsTensor unpackInt4(const attnopsTensor& t, const char* name) {
    if (t.dtype != DType::I32) return t;
    const int last = t.rank - 1;
    if (last < 0 || t.strides[size_t(last)] != 1)
        invalidArgument(fmt::format("{}.strides", name), dimsText(t.strides.data(), size_t(std::max(t.rank, 0))),
                        "an int32 (packed int4) key/value needs unit stride on its last dim");
    attnopsTensor r = t;
    r.dtype = DType::I4;
    r.shape[size_t(last)] *= kInt4PerInt32;
    for (int i = 0; i < last; ++i) r.strides[size_t(i)] *= kInt4PerInt32;
    return r;
}

void checkAntiquant(const Args& a, const QuantShapes& s, int32_t device, Params& p) {
    const attnopsTensor* kScale = optionalTensorOn(a.keyAntiquantScale, "keyAntiquantScale", device);
    const attnopsTensor* kOffset = optionalTensorOn(a.keyAntiquantOffset, "keyAntiquantOffset", device);
    const attnopsTensor* vScale = optionalTensorOn(a.valueAntiquantScale, "valueAntiquantScale", device);
    const attnopsTensor* vOffset = optionalTensorOn(a.valueAntiquantOffset, "valueAntiquantOffset", device);
    if (s.kv != DType::I8 && s.kv != DType::I4) {
        for (auto [t, name] : {std::pair{kScale, "keyAntiquantScale"}, std::pair{kOffset, "keyAntiquantOffset"},
                               std::pair{vScale, "valueAntiquantScale"}, std::pair{vOffset, "valueAntiquantOffset"}})
            if (t) invalidArgument(name, "non-NULL", "is only used with int8/int4 key/value (key.dtype is {})", dtypeName(s.kv));
        for (auto [t, name] : {std::pair{a.antiquantScale, "antiquantScale"}, std::pair{a.antiquantOffset, "antiquantOffset"}})
            if (t) invalidArgument(name, "non-NULL", "is only used with int8 key/value (key.dtype is {})", dtypeName(s.kv));
        return;
    }
    if (s.kv == DType::I4) {  // spec 9.1 "INT4 KV" and 11: decode, not paged, D 64-aligned
        if (!s.decode)
            invalidArgument("key.dtype", "int32 (packed int4)", "int4 key/value needs a decode query (Q_S = 1, inputLayout not TND)");
        if (s.blockNum > 0) invalidArgument("blockTable", "non-NULL", "int4 key/value cannot be paged with a fp16/bf16 query");
        if (s.d % kInt4DimAlign != 0 || s.dv % kInt4DimAlign != 0)
            invalidArgument("key.shape", fmt::format("D = {}", s.d), "int4 key/value need D a multiple of {} (int32: {})", kInt4DimAlign,
                            kInt4DimAlign / kInt4PerInt32);
    }
    if (!(kScale || kOffset || vScale || vOffset)) return combinedAntiquant(a, s, device, p);
    for (auto [mode, name] : {std::pair{a.keyAntiquantMode, "keyAntiquantMode"}, std::pair{a.valueAntiquantMode, "valueAntiquantMode"}}) {
        if (mode == 6 || mode == 8) unsupported("{} = {}: the Ascend 950 block-scaled formats are not implemented", name, mode);
        if (mode < 0 || mode > 5) invalidArgument(name, mode, "must be in [0, 5] (spec 9.1)");
        if (mode >= 2 && !s.decode)
            invalidArgument(name, mode, "modes 2-5 (per-head, PA-managed) need a decode query (Q_S = 1, inputLayout not TND)");
    }
    const bool split = a.keyAntiquantMode == 0 && a.valueAntiquantMode == 1;  // (the device takes it with fp16 only)
    if (a.keyAntiquantMode != a.valueAntiquantMode && !split)
        invalidArgument("keyAntiquantMode/valueAntiquantMode", fmt::format("{}/{}", a.keyAntiquantMode, a.valueAntiquantMode),
                        "must be equal, or 0 for the key and 1 for the value");
    p.keyQuant = antiquantOf(kScale, kOffset, a.keyAntiquantMode, {"keyAntiquantScale", "keyAntiquantOffset"}, s, s.d);
    p.valueQuant = antiquantOf(vScale, vOffset, a.valueAntiquantMode, {"valueAntiquantScale", "valueAntiquantOffset"}, s, s.dv);
}

void checkOutputQuant(const Args& a, const QuantShapes& s, int32_t device, Params& p) {
    const attnopsTensor* scale = optionalTensorOn(a.quantScale2, "quantScale2", device);
    const attnopsTensor* offset = optionalTensorOn(a.quantOffset2, "quantOffset2", device);
    if (!scale) {
        if (offset) nullArgument("quantScale2", "is required with quantOffset2");
        return;
    }
    if (scale->dtype != DType::F32 && scale->dtype != DType::BF16)
        invalidArgument("quantScale2.dtype", dtypeName(scale->dtype), "must be fp32 or bf16");
    if (scale->dtype == DType::BF16 && s.query != DType::BF16)
        invalidArgument("quantScale2.dtype", "bf16", "bf16 needs a bf16 query (query.dtype is {})", dtypeName(s.query));
    sameAsScale(*scale, offset, {"quantScale2", "quantOffset2"});
    if (s.kv == DType::I4) invalidArgument("quantScale2", "non-NULL", "an int8 output is not available with int4 key/value");
    if (a.learnableSink) invalidArgument("quantScale2", "non-NULL", "an int8 output is not available with learnableSink");
    const int64_t channels = s.n1 * s.dv;
    if (scale->numel() != 1) {
        if (scale->numel() != channels)
            invalidArgument("quantScale2.shape", shapeString(*scale),
                            "must be per-tensor [1] or per-channel with Q_N*Dv = {} elements (e.g. [{}], [{},{}])", channels, channels,
                            s.n1, s.dv);
        if (s.packed && !shapeIs(*scale, {s.n1, s.dv}))
            invalidArgument("quantScale2.shape", shapeString(*scale), "per-channel with inputLayout TND must be [Q_N, Dv] = [{},{}]",
                            s.n1, s.dv);
        if (a.softmaxLseFlag)
            invalidArgument("quantScale2.shape", shapeString(*scale), "per-channel int8 output is not available with softmaxLseFlag");
        if (s.dv * 2 % kPerChannelOutAlignBytes != 0)
            invalidArgument("quantScale2.shape", shapeString(*scale), "per-channel int8 output needs Dv = {} a multiple of {}", s.dv,
                            kPerChannelOutAlignBytes / 2);
    }
    p.outQuant.on = true;
    p.outQuant.headDim = s.dv;
    p.outQuant.scale = readAll(*scale);
    if (offset) p.outQuant.offset = readAll(*offset);
}

}  // namespace attnops::fia

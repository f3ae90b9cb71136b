// BlockAttentionResiduals argument validation (spec section 4 with flash-attention-score.md
// section 0: forward N >= 1, backward N >= 0, validBlockNum -1 or N (0 too in the grad),
// normEps finite and > 0, projWeight [H] or [1,H]).
#include "ops/block_attention_residuals/check.hpp"

#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "core/error.hpp"
#include "core/handles.hpp"

namespace attnops::bar {
namespace {

std::string dtypeName(DType d) { return attnopsDataTypeName(attnopsDataType(int(d))); }

const attnopsTensor& required(const attnopsTensor* t, const char* name, int32_t device) {
    return requireTensorOn(t, name, device);
}

std::string shapeText(const std::vector<int64_t>& s) { return dimsText(s); }

void requireShape(const attnopsTensor& t, const char* name, const std::vector<int64_t>& shape) {
    if (!shapeIs(t, shape)) invalidArgument(fmt::format("{}.shape", name), shapeString(t), "must be {}", shapeText(shape));
}

void requireDType(const attnopsTensor& t, const char* name, DType want, const char* wantName) {
    if (t.dtype != want) invalidArgument(fmt::format("{}.dtype", name), dtypeName(t.dtype), "must be {} ({})", dtypeName(want), wantName);
}

template <typename View>
View view3(const attnopsTensor& t, int64_t st, int64_t si, int64_t sh) {
    View v;
    v.data = t.data;
    v.dtype = t.dtype;
    v.stride[0] = st;
    v.stride[1] = si;
    v.stride[2] = sh;
    return v;
}

// [T,H] -> (t, -, h)
template <typename View>
View rows(const attnopsTensor& t) { return view3<View>(t, t.strides[0], 0, t.strides[1]); }
// [T,N,H] -> (t, i, h)
template <typename View>
View sources(const attnopsTensor& t) { return view3<View>(t, t.strides[0], t.strides[1], t.strides[2]); }
// [H] or [1,H] -> (-, -, h)
template <typename View>
View vector(const attnopsTensor& t) { return view3<View>(t, 0, 0, t.strides[t.rank - 1]); }
// [T,K] fp32 -> (t, i, -)
template <typename View>
View stats(const attnopsTensor& t) { return view3<View>(t, t.strides[0], t.strides[1], 0); }

// The shared inputs: partialBlock [T,H], blockRes [T,N,H], projWeight [H]|[1,H], normWeight [H].
Sources checkSources(const attnopsTensor* partialBlock, const attnopsTensor* blockRes, const attnopsTensor* projWeight,
                     const attnopsTensor* normWeight, int32_t device, int64_t minBlocks) {
    const attnopsTensor& pb = required(partialBlock, "partialBlock", device);
    const attnopsTensor& br = required(blockRes, "blockRes", device);
    const attnopsTensor& pw = required(projWeight, "projWeight", device);
    const attnopsTensor& nw = required(normWeight, "normWeight", device);
    if (pb.dtype != DType::F32 && pb.dtype != DType::F16 && pb.dtype != DType::BF16)
        invalidArgument("partialBlock.dtype", dtypeName(pb.dtype), "must be fp32, fp16 or bf16");
    if (pb.rank != 2) invalidArgument("partialBlock.shape", shapeString(pb), "must be [T,H] (rank 2)");
    const int64_t t = pb.shape[0], h = pb.shape[1];
    if (br.rank != 3) invalidArgument("blockRes.shape", shapeString(br), "must be [T,N,H] (rank 3)");
    const int64_t n = br.shape[1];
    if (br.shape[0] != t || br.shape[2] != h)
        invalidArgument("blockRes.shape", shapeString(br), "must be [T,N,H] with T = {} and H = {} (from partialBlock)", t, h);
    if (n < minBlocks) invalidArgument("blockRes.shape", shapeString(br), "N = {} must be >= {}", n, minBlocks);
    requireDType(br, "blockRes", pb.dtype, "partialBlock.dtype");
    requireDType(pw, "projWeight", pb.dtype, "partialBlock.dtype");
    requireDType(nw, "normWeight", pb.dtype, "partialBlock.dtype");
    if (!shapeIs(pw, {h}) && !shapeIs(pw, {1, h}))
        invalidArgument("projWeight.shape", shapeString(pw), "must be [H] or [1,H] with H = {}", h);
    requireShape(nw, "normWeight", {h});
    Sources s;
    s.tokens = t;
    s.blocks = n;
    s.hidden = h;
    s.blockRes = sources<View3>(br);
    s.partial = rows<View3>(pb);
    s.projWeight = vector<View3>(pw);
    s.normWeight = vector<View3>(nw);
    return s;
}

}  // namespace

ForwardParams checkForward(const ForwardArgs& a, int32_t device) {
    ForwardParams p;
    p.src = checkSources(a.partialBlock, a.blockRes, a.projWeight, a.normWeight, device, 1);
    const Sources& s = p.src;
    if (a.validBlockNum != -1 && a.validBlockNum != s.blocks)
        invalidArgument("validBlockNum", a.validBlockNum, "must be -1 or N = {} (every block takes part)", s.blocks);
    if (!std::isfinite(a.normEps) || a.normEps <= 0.0) invalidArgument("normEps", a.normEps, "must be finite and > 0");
    p.eps = float(a.normEps);
    if (!(p.eps > 0.0f) || !std::isfinite(p.eps))
        invalidArgument("normEps", a.normEps, "must be representable as a positive finite fp32 value");
    const attnopsTensor& out = required(a.hiddenStates, "hiddenStates", device);
    requireDType(out, "hiddenStates", s.partial.dtype, "partialBlock.dtype");
    requireShape(out, "hiddenStates", {s.tokens, s.hidden});
    p.hidden = rows<MutView3>(out);
    p.saveStats = a.needBackward;
    if (a.needBackward) {
        if (a.invNorm == nullptr) nullArgument("invNorm", "is required when needBackward is true");
        if (a.probs == nullptr) nullArgument("probs", "is required when needBackward is true");
    }
    for (auto [t, name, view] : {std::tuple{a.invNorm, "invNorm", &p.invNorm}, std::tuple{a.probs, "probs", &p.probs}}) {
        const attnopsTensor* x = liveTensorOrNull(t, name);
        if (!x || !a.needBackward) continue;
        required(x, name, device);
        requireDType(*x, name, DType::F32, "statistics are fp32");
        requireShape(*x, name, {s.tokens, s.blocks + 1});
        *view = stats<MutView3>(*x);
    }
    return p;
}

BackwardParams checkBackward(const BackwardArgs& a, int32_t device) {
    BackwardParams p;
    p.src = checkSources(a.partialBlock, a.blockRes, a.projWeight, a.normWeight, device, 0);
    const Sources& s = p.src;
    if (a.validBlockNum != -1 && a.validBlockNum != 0 && a.validBlockNum != s.blocks)
        invalidArgument("validBlockNum", a.validBlockNum, "must be -1, 0 or N = {} (every block takes part)", s.blocks);
    const DType main = s.partial.dtype;
    const attnopsTensor& gh = required(a.gradHiddenStates, "gradHiddenStates", device);
    requireDType(gh, "gradHiddenStates", main, "partialBlock.dtype");
    requireShape(gh, "gradHiddenStates", {s.tokens, s.hidden});
    p.gradHidden = rows<View3>(gh);
    for (auto [t, name, view] : {std::tuple{a.invNorm, "invNorm", &p.invNorm}, std::tuple{a.probs, "probs", &p.probs}}) {
        const attnopsTensor& x = required(t, name, device);
        requireDType(x, name, DType::F32, "statistics are fp32");
        requireShape(x, name, {s.tokens, s.blocks + 1});
        *view = stats<View3>(x);
    }
    const attnopsTensor& gp = required(a.gradPartialBlock, "gradPartialBlock", device);
    requireDType(gp, "gradPartialBlock", main, "partialBlock.dtype");
    requireShape(gp, "gradPartialBlock", {s.tokens, s.hidden});
    p.gradPartial = rows<MutView3>(gp);
    const attnopsTensor& gb = required(a.gradBlockRes, "gradBlockRes", device);
    requireDType(gb, "gradBlockRes", main, "partialBlock.dtype");
    requireShape(gb, "gradBlockRes", {s.tokens, s.blocks, s.hidden});
    p.gradBlockRes = sources<MutView3>(gb);
    const attnopsTensor& gw = required(a.gradProjWeight, "gradProjWeight", device);
    const attnopsTensor& pw = requireTensor(a.projWeight, "projWeight");
    requireDType(gw, "gradProjWeight", main, "partialBlock.dtype");
    requireShape(gw, "gradProjWeight", std::vector<int64_t>(pw.shape.begin(), pw.shape.begin() + pw.rank));
    p.gradProjWeight = vector<MutView3>(gw);
    const attnopsTensor& gn = required(a.gradNormWeight, "gradNormWeight", device);
    requireDType(gn, "gradNormWeight", main, "partialBlock.dtype");
    requireShape(gn, "gradNormWeight", {s.hidden});
    p.gradNormWeight = vector<MutView3>(gn);
    return p;
}

}  // namespace attnops::bar

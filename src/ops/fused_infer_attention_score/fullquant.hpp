// Full int8 quantisation (spec 9.2) shared by the reference and the portable kernel: the int8
// element loads and the blocked softmax of Params::fullQuant, written once as a template over the
// accumulation type so that the double reference, its fp32 naive twin and the kernel take the
// same quantisation steps (fp16 scores, int8 probabilities, exact int32 products).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ops/fused_infer_attention_score/kernel.hpp"
#include "ops/fused_infer_attention_score/params.hpp"
#include "ops/fused_infer_attention_score/reference.hpp"

namespace attnops::fia {

// int8 element d of row t of kv head m of batch b (strided, paged, NZ or tensor-list source).
inline int32_t kvInt8(const Params& p, const KvSource& s, int64_t b, int64_t m, int64_t t, int64_t d) {
    const KvAddress a = hasKvParts(s) ? kvAddress(p, s, b, m, t) : KvAddress{s.data, kvRowOffset(p, s, b, m, t), s.dimStride};
    const int64_t at = a.at + (s.dimGroup == 0 ? d * a.dimStride : s.dimOffset(d));
    return static_cast<const int8_t*>(a.data)[at];
}

// int8 element (b, n1, row, d) of the query.
inline int32_t queryInt8(const fa::View4& q, int64_t b, int64_t n1, int64_t row, int64_t d) {
    return static_cast<const int8_t*>(q.data)[q.offset(b, n1, row, d)];
}

// The running state of one full-quant row: max m (over the blocks so far), sum of the
// unquantised e (rescaled), and the dequantised accumulator.
template <typename Real>
struct FullQuantState {
    float m = -std::numeric_limits<float>::infinity();
    Real sum = 0;
    std::vector<Real> acc;
};

// Folds one block of finished scores s[0, nk) (kept[j]: key takes part) into `st`; `value(j, c)`
// is the int8 value element c of the block's key j. The e and P8 are fp32 (std::exp, as the
// kernel computes them), the P8.V products exact integers, the rest in Real.
template <typename Real, typename Value>
void fullQuantBlock(const FullQuant& f, int64_t nk, int64_t dv, const float* s, const uint8_t* kept, Value&& value,
                    FullQuantState<Real>& st, std::vector<int32_t>& p8, std::vector<int64_t>& dot) {
    float blockMax = -std::numeric_limits<float>::infinity();
    bool any = false;
    for (int64_t j = 0; j < nk; ++j)
        if (kept[j]) {
            any = true;
            blockMax = (s[j] > blockMax || s[j] != s[j]) ? s[j] : blockMax;
        }
    if (!any) return;
    const float mNew = (blockMax > st.m || blockMax != blockMax) ? blockMax : st.m;
    const Real alpha = st.m == -std::numeric_limits<float>::infinity() ? Real(0) : Real(std::exp(Real(st.m) - Real(mNew)));
    Real sum = 0;
    p8.assign(size_t(nk), 0);
    for (int64_t j = 0; j < nk; ++j) {
        if (!kept[j]) continue;
        const float e = std::exp(s[j] - mNew);
        sum += Real(e);
        p8[size_t(j)] = fullQuantProb(f, e);
    }
    dot.assign(size_t(dv), 0);
    for (int64_t j = 0; j < nk; ++j)
        if (p8[size_t(j)] != 0)
            for (int64_t c = 0; c < dv; ++c) dot[size_t(c)] += int64_t(p8[size_t(j)]) * value(j, c);
    st.sum = st.sum * alpha + sum;
    for (int64_t c = 0; c < dv; ++c) st.acc[size_t(c)] = st.acc[size_t(c)] * alpha + Real(float(dot[size_t(c)]) * f.deqScale2);
    st.m = mNew;
}

// The unit of a full-quant problem in the portable kernel (cpu/generic/fia_fullquant_tiled.cpp):
// whole rows (the planner never splits the keys of full quantisation), written by finishRow.
void runFullQuantUnit(const Params& p, const WorkUnit& u);

// referenceRow and naiveLowPrecisionRow of a full-quant problem (reference_fullquant.cpp).
ReferenceRow fullQuantReferenceRow(const Params& p, int64_t b, int64_t n1, int64_t i);
std::vector<float> fullQuantNaiveRow(const Params& p, int64_t b, int64_t n1, int64_t i);

}  // namespace attnops::fia

// The reference of full int8 quantisation (spec 9.2), one row at a time: the exact integer
// q.k, the fp16 scores of Params::fullQuant, then the blocked softmax with int8 probabilities
// (fullquant.hpp) in double (the reference) or fp32 (its naive twin for the tolerance rule).
#include <cmath>
#include <limits>

#include "ops/flash_attention_score/semantics.hpp"
#include "ops/fused_infer_attention_score/fullquant.hpp"

namespace attnops::fia {
namespace {

template <typename Real>
FullQuantState<Real> fullQuantRow(const Params& p, int64_t b, int64_t n1, int64_t i) {
    const fa::ForwardParams& c = p.core;
    const int64_t sq = c.seq.qLen[size_t(b)], skv = c.seq.kvLen[size_t(b)];
    const fa::SeqRule rule = fa::seqRule(c.mask, b, sq, skv);
    const int64_t m = n1 / c.group, qRow = c.seq.qStart[size_t(b)] + i;
    FullQuantState<Real> st;
    st.acc.assign(size_t(c.dv), Real(0));
    std::vector<float> s;
    std::vector<uint8_t> kept;
    std::vector<int32_t> p8;
    std::vector<int64_t> dot;
    for (int64_t k0 = 0; k0 < skv; k0 += kFullQuantBlock) {  // blocks counted from key 0 (spec 9.2 step 2)
        const int64_t nk = std::min(kFullQuantBlock, skv - k0);
        s.assign(size_t(nk), 0.0f);
        kept.assign(size_t(nk), 0);
        for (int64_t j = 0; j < nk; ++j) {
            const int64_t key = k0 + j;
            if (!rule.keeps(i, key) || fa::explicitMasked(c, b, n1, i, key)) continue;
            if (p.tree != nullptr && treeMasked(p, b, sq, skv, i, key)) continue;
            int64_t q_k = 0;
            for (int64_t d = 0; d < c.d; ++d) q_k += int64_t(queryInt8(c.q, b, n1, qRow, d)) * kvInt8(p, p.key, b, m, key, d);
            const fa::PseTerm pse = fa::pseTerm(c, b, n1, i, key);
            s[size_t(j)] = c.scale * (fullQuantScore(p.fullQuant, q_k) + pse.before) + pse.after;  // core.scale is 1
            kept[size_t(j)] = 1;
        }
        fullQuantBlock<Real>(p.fullQuant, nk, c.dv, s.data(), kept.data(),
                             [&](int64_t j, int64_t col) { return kvInt8(p, p.value, b, m, k0 + j, col); }, st, p8, dot);
    }
    return st;
}

}  // namespace

ReferenceRow fullQuantReferenceRow(const Params& p, int64_t b, int64_t n1, int64_t i) {
    const FullQuantState<double> st = fullQuantRow<double>(p, b, n1, i);
    ReferenceRow row;
    row.out.assign(size_t(p.core.dv), 0.0);
    row.lse = std::numeric_limits<double>::infinity();
    if (st.sum == 0.0) return row;  // spec A: rows that attend nothing are 0, lse +inf
    for (int64_t c = 0; c < p.core.dv; ++c) row.out[size_t(c)] = st.acc[size_t(c)] / st.sum;
    row.lse = std::log(st.sum) + double(st.m);
    return row;
}

std::vector<float> fullQuantNaiveRow(const Params& p, int64_t b, int64_t n1, int64_t i) {
    const FullQuantState<float> st = fullQuantRow<float>(p, b, n1, i);
    std::vector<float> out(size_t(p.core.dv), 0.0f);
    if (st.sum == 0.0f) return out;
    for (int64_t c = 0; c < p.core.dv; ++c) out[size_t(c)] = roundTo(p.core.out.dtype, st.acc[size_t(c)] / st.sum);
    return out;
}

}  // namespace attnops::fia

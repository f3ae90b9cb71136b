// Full int8 quantisation (spec 9.2) in the portable FusedInferAttentionScore kernel: for each
// block of kFullQuantBlock keys (counted from the batch's key 0) the int8 keys and values are
// gathered once for the whole GQA group, the scores are exact int32 q.k turned into the fp16
// scores of Params::fullQuant, and each row folds the block in with int8 probabilities
// (fullquant.hpp, the same steps as the reference). Every reduction runs in a fixed order, so
// results do not depend on threads. Speed is not the aim here (a correct, readable path).
#include <algorithm>
#include <vector>

#include "cpu/generic/score_row.hpp"
#include "ops/fused_infer_attention_score/fullquant.hpp"

namespace attnops::fia {

void runFullQuantUnit(const Params& p, const WorkUnit& u) {
    const fa::ForwardParams& c = p.core;
    const int64_t sq = c.seq.qLen[size_t(u.b)], skv = c.seq.kvLen[size_t(u.b)];
    const fa::SeqRule rule = fa::seqRule(c.mask, u.b, sq, skv);
    const int64_t rows = u.q1 - u.q0, qRow0 = c.seq.qStart[size_t(u.b)] + u.q0, d = c.d, dv = c.dv;
    std::vector<int32_t> q(size_t(c.group * rows * d));
    for (int64_t g = 0; g < c.group; ++g)
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t k = 0; k < d; ++k) q[size_t((g * rows + r) * d + k)] = queryInt8(c.q, u.b, u.n2 * c.group + g, qRow0 + r, k);
    std::vector<FullQuantState<float>> state(size_t(c.group * rows));
    for (auto& st : state) st.acc.assign(size_t(dv), 0.0f);
    std::vector<int32_t> keys(static_cast<size_t>(kFullQuantBlock * d)), values(static_cast<size_t>(kFullQuantBlock * dv)), p8;
    std::vector<int64_t> dot;
    std::vector<float> s(static_cast<size_t>(kFullQuantBlock));
    std::vector<uint8_t> kept(static_cast<size_t>(kFullQuantBlock));
    for (int64_t block = u.k0 / kFullQuantBlock * kFullQuantBlock; block < u.k1; block += kFullQuantBlock) {
        const int64_t k0 = std::max(u.k0, block), nk = std::min(u.k1, block + kFullQuantBlock) - k0;
        for (int64_t j = 0; j < nk; ++j) {
            for (int64_t k = 0; k < d; ++k) keys[size_t(j * d + k)] = kvInt8(p, p.key, u.b, u.n2, k0 + j, k);
            for (int64_t k = 0; k < dv; ++k) values[size_t(j * dv + k)] = kvInt8(p, p.value, u.b, u.n2, k0 + j, k);
        }
        for (int64_t g = 0; g < c.group; ++g)
            for (int64_t r = 0; r < rows; ++r) {
                const int32_t* qr = q.data() + (g * rows + r) * d;
                for (int64_t j = 0; j < nk; ++j) {
                    const int32_t* kr = keys.data() + j * d;
                    int32_t acc = 0;  // |q.k| <= 128 * 128 * 512: exact in int32
                    for (int64_t k = 0; k < d; ++k) acc += qr[k] * kr[k];
                    s[size_t(j)] = fullQuantScore(p.fullQuant, acc);
                }
                const int64_t n1 = u.n2 * c.group + g;
                fa::tile::finishScores(c, u.b, n1, rule, u.q0 + r, k0, nk, skv, s.data(), kept.data());
                if (p.tree != nullptr) applyTreeMask(p, u.b, u.q0 + r, k0, nk, s.data(), kept.data());
                fullQuantBlock<float>(p.fullQuant, nk, dv, s.data(), kept.data(),
                                      [&](int64_t j, int64_t col) { return values[size_t(j * dv + col)]; },
                                      state[size_t(g * rows + r)], p8, dot);
            }
    }
    for (int64_t g = 0; g < c.group; ++g)
        for (int64_t r = 0; r < rows; ++r) {
            FullQuantState<float>& st = state[size_t(g * rows + r)];
            finishRow(p, u.b, u.n2 * c.group + g, qRow0 + r, st.m, st.sum, st.acc.data());
        }
}

}  // namespace attnops::fia

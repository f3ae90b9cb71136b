// The plain BlockAttentionResiduals forward and backward in double, straight from the spec
// (sections 1.1 and 3): the test oracle; and the naive low-precision variants of the tolerance
// rule.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/block_attention_residuals/params.hpp"

namespace attnops::bar {

struct ReferenceToken {
    std::vector<double> hidden;           // [H]
    std::vector<double> invNorm, probs;   // [N+1]
};
ReferenceToken referenceForwardToken(const Sources& s, double eps, int64_t t);

struct ReferenceTokenGrad {
    std::vector<double> dv;   // [(N+1) * H], source N = the partial block
    std::vector<double> du;   // [H] this token's sum_i ds_i r_i v_i
    std::vector<double> duAbs;  // [H] sum_i |ds_i r_i v_i| (scale of du's rounding error)
};
// Uses the saved invNorm/probs of the params, as the operator does.
ReferenceTokenGrad referenceBackwardToken(const BackwardParams& p, int64_t t);

// Naive low precision: normalised sources, logits and probabilities rounded to the main dtype,
// fp32 accumulation, output rounded.
std::vector<float> naiveForwardToken(const Sources& s, float eps, int64_t t);
// The backward formulas in fp32 with a_i, ds_i and the results rounded to the main dtype.
std::vector<float> naiveBackwardToken(const BackwardParams& p, int64_t t);

}  // namespace attnops::bar

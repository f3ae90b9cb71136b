// The plain FlashAttentionScore forward used as the test oracle: one score row at a time,
// accumulated in double, straight from the spec (section 2.4 with section 0).
#pragma once

#include <cstdint>
#include <vector>

#include "ops/flash_attention_score/params.hpp"

namespace attnops::fa {

struct ReferenceRow {
    std::vector<double> out;  // [dv]
    double max = 0.0;         // softmax_max (-inf for a fully masked row without sink)
    double sum = 0.0;         // softmax_sum
};

// Exact (double) result of query row i (sequence-local) of sequence b, head n1.
ReferenceRow referenceRow(const ForwardParams& p, int64_t b, int64_t n1, int64_t i);

// What a naive low-precision implementation gives for the same row: scores and softmax in fp32
// from the stored inputs, probabilities rounded to the input dtype before P.V, fp32 accumulation,
// the output rounded to the output dtype. The tolerance rule compares against its error.
std::vector<float> naiveLowPrecisionRow(const ForwardParams& p, int64_t b, int64_t n1, int64_t i);

// Gradients of one (sequence b, query head n1) in double, recomputed from the inputs alone (the
// saved statistics and attentionIn are not read): dq [Sq][D], this head's contributions to
// dk [Skv][D] and dv [Skv][Dv], and to dsink.
struct ReferenceHeadGrads {
    std::vector<double> dq, dk, dv;
    double dsink = 0.0;
    std::vector<double> dsinkRows;  // [Sq] each row's term of dsink
};
ReferenceHeadGrads referenceBackwardHead(const BackwardParams& p, int64_t b, int64_t n1);

// The same maths in fp32 with P, dP and dS rounded to the input dtype before each product (none
// for fp32), delta = dO . attentionIn (the operator's formula on its input), and the results
// rounded: the naive implementation of the tolerance rule, for every dtype.
ReferenceHeadGrads naiveLowPrecisionBackwardHead(const BackwardParams& p, int64_t b, int64_t n1);

}  // namespace attnops::fa

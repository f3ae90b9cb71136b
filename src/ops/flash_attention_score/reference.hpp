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

}  // namespace attnops::fa

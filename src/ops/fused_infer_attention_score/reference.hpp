// The plain FusedInferAttentionScore forward used as the test oracle (spec section 5, one row at
// a time in double), and its naive low-precision twin for the tolerance rule of design.md.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/fused_infer_attention_score/params.hpp"

namespace attnops::fia {

struct ReferenceRow {
    std::vector<double> out;  // [dv]; zeros when the row attends nothing
    double lse = 0.0;         // log(sum) + max; +inf when the row attends nothing
};

// Exact result of query row i (batch-local) of batch b, query head n1.
ReferenceRow referenceRow(const Params& p, int64_t b, int64_t n1, int64_t i);

// The upstream golden's precision model computed naively: scores, max and sum in fp32 over the
// whole row, probabilities exp(s - max) rounded to the query dtype before P.V with fp32
// accumulation, division by the sum after P.V, the result rounded to the output dtype.
std::vector<float> naiveLowPrecisionRow(const Params& p, int64_t b, int64_t n1, int64_t i);

}  // namespace attnops::fia

// The backward half of the shared problem description: gradient tensors for a forward instance,
// the FlashAttentionScoreGrad call, and the comparison with the double reference.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/flash_attention_score/params.hpp"
#include "problem.hpp"

namespace attnops::tools {

struct FaGrads {
    HostTensor dy;                // like attentionOut, random
    HostTensor dq, dk, dv;        // like query, key, value
    HostTensor dsink;             // fp32 [N1] when the problem has a sink
};

// dy drawn from `seed`; outputs zeroed.
FaGrads makeGrads(const FaInstance& inst, uint64_t seed = 99);

// Runs the backward with inst's inputs and its forward outputs (attentionOut as attentionIn,
// softmaxMax/Sum as the statistics): both phases and a synchronize.
attnopsStatus runBackward(const FaInstance& inst, FaGrads& grads, attnopsStream* stream = nullptr);

struct GradCheck {
    double maxAbsError[4] = {0, 0, 0, 0};      // dq, dk, dv, dsink vs the double reference
    double maxAbsNaiveError[4] = {0, 0, 0, 0}; // naive implementation vs the reference (fp32: 0 unless measured)
    double maxAbsReference[4] = {0, 0, 0, 0};
    double tolerance[4] = {0, 0, 0, 0};
    bool nanMismatch[4] = {false, false, false, false};  // NaN on one side only, per tensor
    bool passed = true;
    std::string failure;
};

// Every gradient element against referenceBackwardHead (dk, dv summed over each group).
GradCheck checkBackward(const FaInstance& inst, const FaGrads& grads);

// The same on the rows of the listed sequences only (for problems with very many sequences);
// dsink, a sum over every sequence, is still checked in full when the problem has a sink.
GradCheck checkBackwardSequences(const FaInstance& inst, const FaGrads& grads, const std::vector<int64_t>& sequences);

// The validated kernel parameters of the backward call runBackward makes (views over inst's and
// grads' tensors): for tests that evaluate the reference directly.
fa::BackwardParams backwardParams(const FaInstance& inst, const FaGrads& grads);

}  // namespace attnops::tools

// The backward half of the shared problem description: gradient tensors for a forward instance,
// the FlashAttentionScoreGrad call, and the comparison with the double reference.
#pragma once

#include <cstdint>
#include <string>

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
    double maxAbsNaiveError[4] = {0, 0, 0, 0}; // naive low precision vs the reference
    double maxAbsReference[4] = {0, 0, 0, 0};
    double tolerance[4] = {0, 0, 0, 0};
    bool passed = true;
    std::string failure;
};

// Every gradient element against referenceBackwardHead (dk, dv summed over each group).
GradCheck checkBackward(const FaInstance& inst, const FaGrads& grads);

}  // namespace attnops::tools

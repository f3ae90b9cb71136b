// Validation of BlockAttentionResiduals arguments (forward and grad), every rule in order, each
// failure naming the argument, the value received and the rule broken.
#pragma once

#include "attnops/tensor.h"
#include "ops/block_attention_residuals/params.hpp"

namespace attnops::bar {

struct ForwardArgs {
    const attnopsTensor* partialBlock = nullptr;
    const attnopsTensor* blockRes = nullptr;
    const attnopsTensor* projWeight = nullptr;
    const attnopsTensor* normWeight = nullptr;
    int64_t validBlockNum = -1;
    double normEps = 1e-6;
    bool needBackward = false;
    const attnopsTensor* hiddenStates = nullptr;
    const attnopsTensor* invNorm = nullptr;
    const attnopsTensor* probs = nullptr;
};

struct BackwardArgs {
    const attnopsTensor* partialBlock = nullptr;
    const attnopsTensor* blockRes = nullptr;
    const attnopsTensor* projWeight = nullptr;
    const attnopsTensor* normWeight = nullptr;
    const attnopsTensor* gradHiddenStates = nullptr;
    const attnopsTensor* invNorm = nullptr;
    const attnopsTensor* probs = nullptr;
    int64_t validBlockNum = -1;
    const attnopsTensor* gradPartialBlock = nullptr;
    const attnopsTensor* gradBlockRes = nullptr;
    const attnopsTensor* gradProjWeight = nullptr;
    const attnopsTensor* gradNormWeight = nullptr;
};

ForwardParams checkForward(const ForwardArgs& args, int32_t device);
BackwardParams checkBackward(const BackwardArgs& args, int32_t device);

}  // namespace attnops::bar

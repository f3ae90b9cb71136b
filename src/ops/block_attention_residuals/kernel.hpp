// The BlockAttentionResiduals implementation list. Kernels work on a range of tokens; the
// driver precomputes u = normWeight * projWeight in fp32 and owns every cross-token reduction.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/block_attention_residuals/params.hpp"

namespace attnops::bar {

struct Kernel {
    const char* name;
    bool (*available)();
    uint64_t (*forwardScratchBytes)(const ForwardParams&);   // per worker thread
    // Tokens [t0, t1): hiddenStates rows (and invNorm/probs when saveStats).
    void (*forwardTokens)(const ForwardParams&, const float* u, int64_t t0, int64_t t1, void* scratch);
    uint64_t (*backwardScratchBytes)(const BackwardParams&);
    // Tokens [t0, t1): gradPartialBlock and gradBlockRes rows; adds each token's contribution
    // sum_i ds_i r_i v_i to du[H] (tokens ascending).
    void (*backwardTokens)(const BackwardParams&, const float* u, int64_t t0, int64_t t1, float* du, void* scratch);
};

// Fastest first, reference last.
const std::vector<const Kernel*>& kernels();

const Kernel& kernelStreamAvx512();
const Kernel& kernelStreamAvx512Bf16();
const Kernel& kernelStreamAvx2();
const Kernel& kernelVectorAvx512();
const Kernel& kernelVectorAvx2();
const Kernel& kernelVectorGeneric();
const Kernel& kernelReference();

}  // namespace attnops::bar

// The FusedInferAttentionScore implementation list: each entry is a kernel over work units (one
// batch, one kv head with its query-head group, one block of query rows), as for
// FlashAttentionScore, whose unit and tile types it shares.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/flash_attention_score/kernel.hpp"
#include "ops/fused_infer_attention_score/params.hpp"

namespace attnops::fia {

using fa::TileShape;
using fa::WorkUnit;

struct ForwardKernel {
    const char* name;
    bool (*available)();                             // this CPU can run it
    bool (*accepts)(const Params&);                  // it implements this problem
    TileShape (*tile)(const Params&);
    uint64_t (*scratchBytes)(const Params&, TileShape);  // per worker thread
    // Writes rows [q0, q1) of the group's query heads: output and softmaxLse.
    void (*run)(const Params&, TileShape, const WorkUnit&, void* scratch);
};

// Fastest first, reference last.
const std::vector<const ForwardKernel*>& forwardKernels();

const ForwardKernel& forwardKernelTiled();
const ForwardKernel& forwardKernelReference();

}  // namespace attnops::fia

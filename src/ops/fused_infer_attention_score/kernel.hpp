// The FusedInferAttentionScore implementation list: each entry is a kernel over work units (one
// batch, one kv head with its query-head group, one block of query rows, one span of keys). A
// decode step has one query row per head, so a long context is cut into key splits (split-K):
// each split writes its rows' partial softmax state, and the driver merges the splits in their
// fixed order (forward.cpp). Split boundaries come from the problem alone, never from the thread
// count, so the results are bitwise identical for any thread count.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/flash_attention_score/kernel.hpp"
#include "ops/fused_infer_attention_score/params.hpp"

namespace attnops::fia {

using fa::TileShape;

// Floats of the partial state of one query row over one key split: running max m, sum l and
// the unnormalised, dequantised accumulator (dv floats).
inline int64_t partialRowFloats(int64_t dv) { return 2 + dv; }

struct WorkUnit {
    int64_t b = 0, n2 = 0, q0 = 0, q1 = 0;  // batch, kv head, query rows [q0, q1)
    int64_t k0 = 0, k1 = 0;                 // the keys of this unit (the rows' whole key range unless split)
    // NULL: the unit writes its output rows. Otherwise the partial rows of this split, record
    // g * (q1 - q0) + r for query head g of the group and row q0 + r: {m, l, acc[dv]}.
    float* partial = nullptr;
};

struct ForwardKernel {
    const char* name;
    bool (*available)();                             // this CPU can run it
    bool (*accepts)(const Params&);                  // it implements this problem
    TileShape (*tile)(const Params&);
    uint64_t (*scratchBytes)(const Params&, TileShape);  // per worker thread
    // Rows [q0, q1) of the group's query heads against keys [k0, k1): output and softmaxLse, or
    // the partial rows.
    void (*run)(const Params&, TileShape, const WorkUnit&, void* scratch);
    bool splitsKeys = false;  // honours WorkUnit::k0/k1/partial (else gets whole rows, never split)
};

// Fastest first, reference last.
const std::vector<const ForwardKernel*>& forwardKernels();

const ForwardKernel& forwardKernelAvx512Bf16Prefill();  // prefill route (cpu/simd/fia_prefill.hpp)
const ForwardKernel& forwardKernelAvx512Prefill();
const ForwardKernel& forwardKernelAvx2Prefill();
const ForwardKernel& forwardKernelAvx512Bf16();  // bf16-pair decode (cpu/simd/fia_forward.hpp)
const ForwardKernel& forwardKernelAvx512();
const ForwardKernel& forwardKernelAvx2();
const ForwardKernel& forwardKernelTiled();
const ForwardKernel& forwardKernelReference();

// The end of a query row, shared by every kernel and the split merge (forward.cpp): the sink
// joins the sum, then output acc / l and softmaxLse, or 0 and +inf when no key was kept.
// `acc` is clobbered. `row` is the absolute row (TND: packed).
void finishRow(const Params& p, int64_t b, int64_t n1, int64_t row, float m, float l, float* acc);

// Row q0 + r of query head g of unit u: finishRow, or the partial record of a split.
void emitRow(const Params& p, const WorkUnit& u, int64_t g, int64_t r, float m, float l, float* acc);

}  // namespace attnops::fia

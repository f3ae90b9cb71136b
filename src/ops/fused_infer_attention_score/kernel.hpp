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

// The problems of the prefill routes (cpu/simd/fia_prefill.hpp, cpu/amx/fia_amx_prefill.hpp),
// which run FlashAttentionScore's forward with FIA's precision model: the prefill branch (not the
// Q_S = 1 decode step) with at least minQueryRows query rows in its longest sequence, unpaged
// fp16/bf16 key and value without tensor lists, shared prefix or dequantisation, P rounded to the
// query dtype, no MLA rope, tree mask or dropout, sparse modes 0-4.
inline bool prefillRouteProblem(const Params& p, int64_t minQueryRows) {
    const fa::ForwardParams& c = p.core;
    const bool plainSources = p.table.data == nullptr && p.cache == CacheFormat::None && !hasKvParts(p.key) &&
                              !hasKvParts(p.value) && p.key.dimGroup == 0 && p.value.dimGroup == 0;
    const bool plainValues = p.keyQuant.mode == Antiquant::None && p.valueQuant.mode == Antiquant::None &&
                             !p.fullQuant.on && p.key.dtype == c.q.dtype && p.value.dtype == c.q.dtype &&
                             (c.q.dtype == DType::F16 || c.q.dtype == DType::BF16) && p.probDType == c.q.dtype;
    const bool plainCore = p.ropeDim == 0 && !p.valueIsKey && p.tree == nullptr && !c.dropout.enabled &&
                           c.sink == nullptr && !c.writeStats && c.mask.sparseMode >= 0 && c.mask.sparseMode <= 4;
    return !p.decode && plainSources && plainValues && plainCore && c.d <= fa::kMaxHeadDim && c.dv <= fa::kMaxHeadDim &&
           c.seq.maxQLen >= minQueryRows;
}

// The (b, kv head, row, dim) view of an unpaged key or value source with no extra parts: the
// addressing of kvRowOffset (row t of batch b at kvStart[b] + t) as a FlashAttentionScore view.
inline fa::View4 sourceView(const KvSource& s) {
    fa::View4 v;
    v.data = s.data;
    v.dtype = s.dtype;
    v.stride[0] = s.batchStride;
    v.stride[1] = s.headStride;
    v.stride[2] = s.rowStride;
    v.stride[3] = s.dimStride;
    return v;
}

// kv heads per unit where a cache row holds several kv heads side by side (BnBsH pages, BSH and
// BSND caches) and every batch has one query block (decode): a unit then reads its keys' rows of
// kHeadsPerUnit heads, and asks for them whole, a contiguous run per key, instead of one head's
// slice of each (interleavedHeads in plan.cpp).
constexpr int64_t kHeadsPerUnit = 8;
// Keys per online-softmax block in such units (the vector kernels' kKeyRows is 128 otherwise): the
// block being computed and the next one, of every head of the unit, stay in L2 (8 heads x 64 keys
// x 512 bytes of bf16 K and V at D 128 = 256 KiB a block). On an Intel Xeon with AMX (2 threads,
// B=32 x 4,096 GQA 32/8, BnBsH pages, three interleaved rounds) the bf16 decode took 43.3-43.9 ms
// against 48.6-51.0 with 128-key blocks, int8 25.7-26.1 against 26.7-28.1; one-head units on
// BnNBsD pages gained nothing from 64 (34.7-35.5 against 34.1-36.8 ms).
constexpr int64_t kInterleavedKeyRows = 64;

struct WorkUnit {
    int64_t b = 0, n2 = 0, q0 = 0, q1 = 0;  // batch, kv head, query rows [q0, q1)
    int64_t k0 = 0, k1 = 0;                 // the keys of this unit (the rows' whole key range unless split)
    // NULL: the unit writes its output rows. Otherwise the partial rows of this split, record
    // g * (q1 - q0) + r for query head g of the group and row q0 + r: {m, l, acc[dv]}.
    float* partial = nullptr;
    // kv heads [n2, n2 + heads) with the same rows and keys (Plan::headsPerUnit; only for a kernel
    // that interleavesHeads); kv head n2 + h's partial rows start partialHeadStride floats after
    // head n2 + h - 1's.
    int64_t heads = 1;
    int64_t partialHeadStride = 0;
};

// The scratch a unit books per kv head (ForwardKernel::scratchBytes rounded to 64 bytes): head h
// of a unit of several starts h times this into the thread's scratch.
inline uint64_t headScratchBytes(uint64_t kernelBytes) { return (kernelBytes + 63) / 64 * 64; }

// Unit u's kv head n2 + h alone.
inline WorkUnit headOf(const WorkUnit& u, int64_t h) {
    WorkUnit one = u;
    one.n2 = u.n2 + h;
    one.heads = 1;
    if (u.partial != nullptr) one.partial = u.partial + h * u.partialHeadStride;
    return one;
}

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
    // Honours WorkUnit::heads, with scratchBytes per head (else gets one kv head per unit).
    bool interleavesHeads = false;
};

// Fastest first, reference last.
const std::vector<const ForwardKernel*>& forwardKernels();

const ForwardKernel& forwardKernelAmxPrefill();  // prefill route on AMX tiles (cpu/amx/fia_amx_prefill.hpp)
const ForwardKernel& forwardKernelAmxEmulatedPrefill();  // the same on the tile emulator: forced only
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

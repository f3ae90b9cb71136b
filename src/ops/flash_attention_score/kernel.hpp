// The FlashAttentionScore forward implementation list: each entry is a kernel over work units
// (one sequence, one kv head with its query-head group, TileShape::unitRows() query rows).
#pragma once

#include <cstdint>
#include <vector>

#include "ops/flash_attention_score/bwd_chunks.hpp"
#include "ops/flash_attention_score/params.hpp"
#include "runtime/platform.hpp"

namespace attnops::fa {

struct TileShape {
    int64_t queryRows = 64;  // rows of a query block
    int64_t keyRows = 64;    // keys per inner block
    // Query heads of a GQA group that share each packed key/value block (the vector forward,
    // cpu/simd/fa_forward.hpp: headsPerPass); 1 elsewhere.
    int64_t headsPerPass = 1;
    // Query blocks of a forward work unit, which share each packed key/value block too (the vector
    // forward, cpu/simd/fa_forward.hpp: blocksPerUnit); 1 elsewhere.
    int64_t blocksPerUnit = 1;

    int64_t unitRows() const { return queryRows * blocksPerUnit; }  // query rows of a work unit
};

struct WorkUnit {
    int64_t b = 0, n2 = 0, q0 = 0, q1 = 0;  // sequence, kv head, query rows [q0, q1)
};

struct ForwardKernel {
    const char* name;
    bool (*available)();                                      // this CPU can run it
    bool (*accepts)(const ForwardParams&);                    // it implements this problem
    TileShape (*tile)(const ForwardParams&, const PlatformInfo&);
    uint64_t (*scratchBytes)(const ForwardParams&, TileShape);  // per worker thread
    void (*run)(const ForwardParams&, TileShape, const WorkUnit&, void* scratch);
    // Reachable only through ATTNOPS_FORCE_IMPL, never chosen by default (a software model of
    // an instruction set: correct everywhere, far too slow to serve calls).
    bool forceOnly = false;
};

// Fastest first, reference last; entries marked forceOnly are skipped unless forced.
const std::vector<const ForwardKernel*>& forwardKernels();

// Backward work comes in two kinds of units, so that every output element has one writer and
// no atomics or cross-thread sums are needed (determinism):
//   key unit:   dk, dv rows [k0, k1) of kv head n2 of sequence b (summed over the G query heads
//               in ascending order, query rows ascending);
//   query unit: dq rows [q0, q1) of the query heads of kv head n2 (keys ascending);
// or, in a fused kernel, one kind:
//   head unit:  dq, dk, dv rows of kv head n2 of sequence b and of its query heads.
struct KeyUnit {
    int64_t b = 0, n2 = 0, k0 = 0, k1 = 0;
};

// A unit of the fused scheme: query rows [q0, q1) of kv head n2 of sequence b, for every query
// head of its group, against every key they may see. Its dk, dv over these rows go to
// dkPartial ([kv length][d]) and dvPartial ([kv length][dv]), this chunk's slices of the
// workspace, or, when null (the chunk is the whole sequence), straight to dk and dv.
struct HeadChunk {
    int64_t b = 0, n2 = 0, q0 = 0, q1 = 0;
    float* dkPartial = nullptr;
    float* dvPartial = nullptr;
};

struct BackwardKernel {
    const char* name;
    bool (*available)();
    bool (*accepts)(const BackwardParams&);
    TileShape (*tile)(const BackwardParams&, const PlatformInfo&);
    uint64_t (*scratchBytes)(const BackwardParams&, TileShape);  // per worker thread, either unit
    void (*runKeyUnit)(const BackwardParams&, TileShape, const KeyUnit&, void* scratch);
    void (*runQueryUnit)(const BackwardParams&, TileShape, const WorkUnit&, void* scratch);
    bool forceOnly = false;  // as ForwardKernel::forceOnly
    // When set, the fused scheme (ops/flash_attention_score/bwd_chunks.hpp): chunk units write
    // their dq rows and their partial dk, dv; runKeyUnit and runQueryUnit are not called.
    void (*runHeadUnit)(const BackwardParams&, TileShape, const HeadChunk&, void* scratch) = nullptr;
    // The fused scheme's fewest query rows (over the group's heads) per chunk. A faster kernel
    // spends relatively more on a chunk's partial dk, dv, so it may ask for more.
    int64_t chunkGroupRows = chunks::kMinGroupRows;
};

// Rows per chunk of the fused scheme for kernel k with its tile (0: no split fits the bounds).
inline int64_t fusedChunkRowsOf(const ForwardParams& p, const BackwardKernel& k, TileShape tile) {
    return chunks::chunkRows(p, tile.queryRows, k.chunkGroupRows);
}

const std::vector<const BackwardKernel*>& backwardKernels();

const BackwardKernel& backwardKernelAmxFused();
const BackwardKernel& backwardKernelAmx();
const BackwardKernel& backwardKernelAmxEmulatedFused();
const BackwardKernel& backwardKernelAmxEmulated();
const BackwardKernel& backwardKernelAvx512Bf16Fused();
const BackwardKernel& backwardKernelAvx512Bf16();
const BackwardKernel& backwardKernelAvx512Fused();
const BackwardKernel& backwardKernelAvx512();
const BackwardKernel& backwardKernelAvx2Fused();
const BackwardKernel& backwardKernelAvx2();
const BackwardKernel& backwardKernelTiledAvx512();
const BackwardKernel& backwardKernelTiledAvx2();
const BackwardKernel& backwardKernelTiledGeneric();
const BackwardKernel& backwardKernelReference();

// Declared by each kernel file.
const ForwardKernel& forwardKernelAmx();
// Whether the AMX forward runs a problem with transposed scores (cpu/amx/fa_amx_forward.hpp): no
// pse, no explicit mask, no dropout. The others take its row steps, which are slower than the
// AVX-512 kernels, so the automatic choice passes the AMX forward over for them.
inline bool amxTransposedForward(const ForwardParams& p) {
    return p.pse.form == PseForm::None && !p.mask.explicitMask && !p.dropout.enabled;
}
const ForwardKernel& forwardKernelAmxEmulated();
const ForwardKernel& forwardKernelAvx512Bf16();
const ForwardKernel& forwardKernelAvx512();
const ForwardKernel& forwardKernelAvx2();
const ForwardKernel& forwardKernelTiledAvx512();
const ForwardKernel& forwardKernelTiledAvx2();
const ForwardKernel& forwardKernelTiledGeneric();
const ForwardKernel& forwardKernelReference();

}  // namespace attnops::fa

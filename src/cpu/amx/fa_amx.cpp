// The "amx" and "amx-fused" entries: the AMX kernels of fa_amx_kernel.hpp on the tile
// instructions, with the fp32 steps vectorised for AVX-512 (every AMX CPU has it). Available
// where CPUID reports AMX-TILE and AMX-BF16 with a sane palette and Linux granted the tile state
// (cpu::isa()). bf16 problems; fp16 ones too where the CPU has AMX-FP16 and the compiler knows
// TDPFP16PS. "amx-fused" takes the problems fusedAccepts (the backward without recomputation).
// (-Wpsabi is off for this file in CMakeLists.txt: 64-byte vector values of cpu/amx/lanes.hpp
// pass only between always-inlined functions.)
#include "cpu/amx/hw_build.hpp"
#include "cpu/amx/fa_amx_kernel.hpp"

namespace attnops::fa {
namespace {

using Hw = Entries<cpu::amx::HwTiles, cpu::amx::HwTiles::kHasFp16>;
using cpu::amx::hasAmx;

template <typename Params>
bool accepts(const Params& p) {
    return allIn(p, DType::BF16) ||
           (cpu::amx::HwTiles::kHasFp16 && cpu::isa().amxFp16 && allIn(p, DType::F16));
}

bool acceptsFused(const BackwardParams& p) { return accepts(p) && fusedAccepts(p); }

}  // namespace

const ForwardKernel& forwardKernelAmx() {
    static const ForwardKernel k{"amx", hasAmx, accepts<ForwardParams>, forwardTile,
                                 forwardScratchBytes, Hw::forward};
    return k;
}

const BackwardKernel& backwardKernelAmx() {
    static const BackwardKernel k{"amx", hasAmx, accepts<BackwardParams>, backwardTile,
                                  backwardScratchBytes, Hw::key, Hw::query};
    return k;
}

const BackwardKernel& backwardKernelAmxFused() {
    static const BackwardKernel k{"amx-fused", hasAmx, acceptsFused, fusedBackwardTile, fusedBackwardScratchBytes,
                                  nullptr,     nullptr, false,       Hw::head,
                                  kFusedChunkGroupRows};
    return k;
}

}  // namespace attnops::fa

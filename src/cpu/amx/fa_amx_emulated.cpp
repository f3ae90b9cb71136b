// The "amx-emulated" and "amx-emulated-fused" entries: the AMX kernels of fa_amx_kernel.hpp on
// EmuTiles, the software model of the tile unit, built for the x86-64 baseline. They run on every
// machine, so the AMX kernels' packing, tiling, masks, softmax and backward are tested everywhere;
// they model a CPU with AMX-FP16, so they take fp16 problems too. Many times slower than the
// hardware: never chosen by default, only through ATTNOPS_FORCE_IMPL (forceOnly).
// (-Wpsabi is off for this file in CMakeLists.txt: 64-byte vector values of cpu/amx/lanes.hpp
// pass only between always-inlined functions.)
#include "cpu/amx/emu_tiles.hpp"

#define ATTNOPS_AMX_FN
#include "cpu/amx/fa_amx_kernel.hpp"

namespace attnops::fa {
namespace {

using Emulated = Entries<cpu::amx::EmuTiles, true>;

bool always() { return true; }

template <typename Params>
bool accepts(const Params& p) {
    return allIn(p, DType::BF16) || allIn(p, DType::F16);
}

bool acceptsFused(const BackwardParams& p) { return accepts(p) && fusedAccepts(p); }

}  // namespace

const ForwardKernel& forwardKernelAmxEmulated() {
    static const ForwardKernel k{"amx-emulated", always, accepts<ForwardParams>, forwardTile,
                                 forwardScratchBytes, Emulated::forward, true};
    return k;
}

const BackwardKernel& backwardKernelAmxEmulated() {
    static const BackwardKernel k{"amx-emulated", always, accepts<BackwardParams>, backwardTile,
                                  backwardScratchBytes, Emulated::key, Emulated::query,
                                  true};
    return k;
}

const BackwardKernel& backwardKernelAmxEmulatedFused() {
    static const BackwardKernel k{"amx-emulated-fused", always,  acceptsFused, fusedBackwardTile,
                                  fusedBackwardScratchBytes, nullptr, nullptr,     true,
                                  Emulated::head,           kFusedChunkGroupRows};
    return k;
}

}  // namespace attnops::fa

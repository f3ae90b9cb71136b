// The "amx-prefill" FusedInferAttentionScore entry: fia_amx_prefill.hpp on the tile
// instructions, where the CPU has AMX (cpu::amx::hasAmx); bf16 problems, fp16 ones too where the
// CPU has AMX-FP16 and the compiler knows TDPFP16PS. (-Wpsabi is off for this file in
// CMakeLists.txt, as for fa_amx.cpp.)
#include "cpu/amx/hw_build.hpp"
#include "cpu/amx/fia_amx_prefill.hpp"

namespace attnops::fia {
namespace {

bool accepts(const Params& p) {
    return amx_prefill::acceptsProblem(p, cpu::amx::HwTiles::kHasFp16 && cpu::isa().amxFp16);
}

}  // namespace

const ForwardKernel& forwardKernelAmxPrefill() {
    static const ForwardKernel k{"amx-prefill",
                                 cpu::amx::hasAmx,
                                 accepts,
                                 amx_prefill::tile,
                                 amx_prefill::scratchBytes,
                                 amx_prefill::run<cpu::amx::HwTiles, cpu::amx::HwTiles::kHasFp16>,
                                 false};
    return k;
}

}  // namespace attnops::fia

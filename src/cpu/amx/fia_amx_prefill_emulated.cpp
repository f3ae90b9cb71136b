// The "amx-emulated-prefill" FusedInferAttentionScore entry: fia_amx_prefill.hpp on EmuTiles,
// the software model of the tile unit, built for the x86-64 baseline, so that the AMX prefill
// route is tested on every machine (bf16 and fp16). Never chosen by default (the FIA planner
// passes it over), only through ATTNOPS_FORCE_IMPL=amx-emulated-prefill.
#include "cpu/amx/emu_tiles.hpp"

#define ATTNOPS_AMX_FN
#include "cpu/amx/fia_amx_prefill.hpp"

namespace attnops::fia {
namespace {

bool always() { return true; }
bool accepts(const Params& p) { return amx_prefill::acceptsProblem(p, true); }

}  // namespace

const ForwardKernel& forwardKernelAmxEmulatedPrefill() {
    static const ForwardKernel k{"amx-emulated-prefill",
                                 always,
                                 accepts,
                                 amx_prefill::tile,
                                 amx_prefill::scratchBytes,
                                 amx_prefill::run<cpu::amx::EmuTiles, true>,
                                 false};
    return k;
}

}  // namespace attnops::fia

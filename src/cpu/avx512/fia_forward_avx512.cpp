// The AVX-512 FusedInferAttentionScore forward entry "avx512": the decode/prefill kernel of
// cpu/simd/fia_forward.hpp on zmm vectors (fp32 FMAs, keys and values converted in registers).
#include "cpu/avx512/microkernels.hpp"
#include "cpu/isa.hpp"
#include "cpu/simd/fia_forward.hpp"

namespace attnops::fia {
namespace {

bool accepts(const Params& p) { return simd_forward::accepts<cpu::Avx512>(p); }

void run(const Params& p, TileShape t, const WorkUnit& u, void* s) { simd_forward::runUnit<cpu::Avx512>(p, t, u, s); }

bool hasAvx512() {
    const cpu::IsaFeatures& f = cpu::isa();
    return f.avx512f && f.avx512bw && f.avx512vl && f.avx2 && f.fma && f.f16c;
}

}  // namespace

const ForwardKernel& forwardKernelAvx512() {
    static const ForwardKernel k{
        "avx512", hasAvx512, accepts, simd_forward::chooseTile, simd_forward::scratchBytes, run, true};
    return k;
}

}  // namespace attnops::fia

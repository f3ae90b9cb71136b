// The AVX2 FusedInferAttentionScore forward entry "avx2": the decode/prefill kernel of
// cpu/simd/fia_forward.hpp on ymm vectors (fp32 FMAs, keys and values converted in registers).
#include "cpu/avx2/simd_avx2.hpp"
#include "cpu/isa.hpp"
#include "cpu/simd/fia_forward.hpp"

namespace attnops::fia {
namespace {

bool accepts(const Params& p) { return simd_forward::accepts<cpu::Avx2>(p); }

void run(const Params& p, TileShape t, const WorkUnit& u, void* s) { simd_forward::runUnit<cpu::Avx2>(p, t, u, s); }

bool hasAvx2() {
    const cpu::IsaFeatures& f = cpu::isa();
    return f.avx2 && f.fma && f.f16c;
}

}  // namespace

const ForwardKernel& forwardKernelAvx2() {
    static const ForwardKernel k{
        "avx2", hasAvx2, accepts, simd_forward::chooseTile, simd_forward::scratchBytes, run, true, true};
    return k;
}

}  // namespace attnops::fia

// The AVX-512 FusedInferAttentionScore forward entries: "avx512", the decode/prefill kernel of
// cpu/simd/fia_forward.hpp on zmm vectors (fp32 FMAs, keys and values converted in registers),
// and "avx512-bf16", its bf16-pair decode (vdpbf16ps) for bf16 queries against bf16 caches,
// chosen where this CPU's bf16 path is dot (cpu/bf16_path.hpp).
#include "cpu/avx512/microkernels.hpp"
#include "cpu/isa.hpp"
#include "cpu/simd/fia_forward.hpp"

namespace attnops::fia {
namespace {

bool accepts(const Params& p) { return simd_forward::accepts<cpu::Avx512>(p); }

void run(const Params& p, TileShape t, const WorkUnit& u, void* s) { simd_forward::runUnit<cpu::Avx512>(p, t, u, s); }

bool acceptsPairs(const Params& p) { return simd_forward::pairAccepts<cpu::Avx512>(p); }

void runPairs(const Params& p, TileShape t, const WorkUnit& u, void* s) {
    simd_forward::runUnit<cpu::Avx512, cpu::avx512::Bf16Pairs>(p, t, u, s);
}

bool hasAvx512() {
    const cpu::IsaFeatures& f = cpu::isa();
    return f.avx512f && f.avx512bw && f.avx512vl && f.avx2 && f.fma && f.f16c;
}

bool hasAvx512Bf16() { return hasAvx512() && cpu::isa().avx512bf16; }

}  // namespace

const ForwardKernel& forwardKernelAvx512Bf16() {
    static const ForwardKernel k{"avx512-bf16",           hasAvx512Bf16, acceptsPairs, simd_forward::chooseTile,
                                 simd_forward::scratchBytes, runPairs,      true, true};
    return k;
}

const ForwardKernel& forwardKernelAvx512() {
    static const ForwardKernel k{
        "avx512", hasAvx512, accepts, simd_forward::chooseTile, simd_forward::scratchBytes, run, true, true};
    return k;
}

}  // namespace attnops::fia

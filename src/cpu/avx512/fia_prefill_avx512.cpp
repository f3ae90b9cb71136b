// The AVX-512 FusedInferAttentionScore prefill entry "avx512-prefill": the FlashAttentionScore
// forward's structure with FIA's probability rounding (cpu/simd/fia_prefill.hpp) on zmm vectors
// (fp32 FMAs; inputs converted as they are loaded).
#include "cpu/avx512/microkernels.hpp"
#include "cpu/isa.hpp"
#include "cpu/simd/fia_prefill.hpp"

namespace attnops::fia {
namespace {

bool accepts(const Params& p) { return simd_prefill::accepts<cpu::Avx512>(p); }

void run(const Params& p, TileShape t, const WorkUnit& u, void* s) { simd_prefill::runUnit<cpu::Avx512>(p, t, u, s); }

bool hasAvx512() {
    const cpu::IsaFeatures& f = cpu::isa();
    return f.avx512f && f.avx512bw && f.avx512vl && f.avx2 && f.fma && f.f16c;
}

}  // namespace

const ForwardKernel& forwardKernelAvx512Prefill() {
    static const ForwardKernel k{"avx512-prefill",
                                 hasAvx512,
                                 accepts,
                                 simd_prefill::chooseTile<cpu::Avx512>,
                                 simd_prefill::scratchBytes,
                                 run,
                                 false};  // whole query rows: prefill units are query blocks
    return k;
}

}  // namespace attnops::fia

// The AVX2 FusedInferAttentionScore prefill entry "avx2-prefill": the FlashAttentionScore
// forward's structure with FIA's probability rounding (cpu/simd/fia_prefill.hpp) on ymm vectors.
#include "cpu/avx2/simd_avx2.hpp"
#include "cpu/isa.hpp"
#include "cpu/simd/fia_prefill.hpp"

namespace attnops::fia {
namespace {

bool accepts(const Params& p) { return simd_prefill::accepts<cpu::Avx2>(p); }

void run(const Params& p, TileShape t, const WorkUnit& u, void* s) { simd_prefill::runUnit<cpu::Avx2>(p, t, u, s); }

bool hasAvx2() {
    const cpu::IsaFeatures& f = cpu::isa();
    return f.avx2 && f.fma && f.f16c;
}

}  // namespace

const ForwardKernel& forwardKernelAvx2Prefill() {
    static const ForwardKernel k{"avx2-prefill",
                                 hasAvx2,
                                 accepts,
                                 simd_prefill::chooseTile<cpu::Avx2>,
                                 simd_prefill::scratchBytes,
                                 run,
                                 false};  // whole query rows: prefill units are query blocks
    return k;
}

}  // namespace attnops::fia

// The AVX2 flash-attention backward entries "avx2-fused" (the fused scheme) and "avx2" (key and
// query units): the generic register-blocked kernel (cpu/simd/fa_backward.hpp) on ymm vectors,
// inputs converted to fp32 as they are loaded and multiplied with fp32 FMAs.
#include "cpu/avx2/simd_avx2.hpp"
#include "cpu/isa.hpp"
#include "cpu/simd/fa_backward.hpp"

namespace attnops::fa {
namespace {

bool acceptsAll(const BackwardParams&) { return true; }

void keyUnit(const BackwardParams& p, TileShape t, const KeyUnit& u, void* s) {
    simd_backward::runKeyUnit<cpu::Avx2, void>(p, t, u, s);
}
void queryUnit(const BackwardParams& p, TileShape t, const WorkUnit& u, void* s) {
    simd_backward::runQueryUnit<cpu::Avx2, void>(p, t, u, s);
}
void headUnit(const BackwardParams& p, TileShape t, const HeadChunk& u, void* s) {
    simd_backward::runHeadUnit<cpu::Avx2>(p, t, u, s);
}

bool hasAvx2() {
    const cpu::IsaFeatures& f = cpu::isa();
    return f.avx2 && f.fma && f.f16c;
}

}  // namespace

const BackwardKernel& backwardKernelAvx2Fused() {
    static const BackwardKernel k{"avx2-fused",
                                  hasAvx2,
                                  simd_backward::fusedAccepts<cpu::Avx2>,
                                  simd_backward::chooseTile<cpu::Avx2>,
                                  simd_backward::fusedScratchBytes<false>,
                                  nullptr,
                                  nullptr,
                                  false,
                                  headUnit};
    return k;
}

const BackwardKernel& backwardKernelAvx2() {
    static const BackwardKernel k{
        "avx2",  hasAvx2,  acceptsAll, simd_backward::chooseTile<cpu::Avx2>, simd_backward::scratchBytes,
        keyUnit, queryUnit};
    return k;
}

}  // namespace attnops::fa

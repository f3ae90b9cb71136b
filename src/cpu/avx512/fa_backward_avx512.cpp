// The AVX-512 flash-attention backward entries, instances of the generic register-blocked kernel
// (cpu/simd/fa_backward.hpp) on zmm vectors: fp32 FMAs in "avx512-fused" (the fused scheme) and
// "avx512" (key and query units), vdpbf16ps on bf16 pairs in "avx512-bf16-fused" (the fused
// scheme) and "avx512-bf16" (key and query units, for the problems the fused split refuses).
// The pair entries accept only problems whose operands and gradients are all bf16; the planner
// gives the others to the fp32 entries, and all-bf16 ones too when this CPU's bf16 path is the
// widened one (cpu/bf16_path.hpp).
#include "cpu/avx512/microkernels.hpp"
#include "cpu/isa.hpp"
#include "cpu/simd/fa_backward.hpp"

namespace attnops::fa {
namespace {

using Pairs = cpu::avx512::Bf16Pairs;

bool acceptsAll(const BackwardParams&) { return true; }

// The avx512-bf16 entry takes problems whose operands and gradients are all bf16 (any strides:
// the packing gathers rows whose column stride is not 1). It rounds P and dS to bf16, so not fp32
// gradients.
bool pairOperands(const BackwardParams& bp) { return allIn(bp, DType::BF16); }
bool fusedPairOperands(const BackwardParams& bp) {
    return pairOperands(bp) && simd_backward::fusedAccepts<cpu::Avx512>(bp);
}

void keyFloat(const BackwardParams& p, TileShape t, const KeyUnit& u, void* s) {
    simd_backward::runKeyUnit<cpu::Avx512, void>(p, t, u, s);
}
void queryFloat(const BackwardParams& p, TileShape t, const WorkUnit& u, void* s) {
    simd_backward::runQueryUnit<cpu::Avx512, void>(p, t, u, s);
}
void headFloat(const BackwardParams& p, TileShape t, const HeadChunk& u, void* s) {
    simd_backward::runHeadUnit<cpu::Avx512>(p, t, u, s);
}
void headPairs(const BackwardParams& p, TileShape t, const HeadChunk& u, void* s) {
    simd_backward::runHeadUnit<cpu::Avx512, Pairs>(p, t, u, s);
}
void keyPairs(const BackwardParams& p, TileShape t, const KeyUnit& u, void* s) {
    simd_backward::runKeyUnit<cpu::Avx512, Pairs>(p, t, u, s);
}
void queryPairs(const BackwardParams& p, TileShape t, const WorkUnit& u, void* s) {
    simd_backward::runQueryUnit<cpu::Avx512, Pairs>(p, t, u, s);
}

bool hasAvx512() {
    const cpu::IsaFeatures& f = cpu::isa();
    return f.avx512f && f.avx512bw && f.avx512vl && f.avx2 && f.fma && f.f16c;
}

bool hasAvx512Bf16() { return hasAvx512() && cpu::isa().avx512bf16; }

}  // namespace

const BackwardKernel& backwardKernelAvx512Bf16() {
    static const BackwardKernel k{
        "avx512-bf16", hasAvx512Bf16, pairOperands, simd_backward::chooseTile<cpu::Avx512>, simd_backward::scratchBytes,
        keyPairs,      queryPairs};
    return k;
}
const BackwardKernel& backwardKernelAvx512Bf16Fused() {
    static const BackwardKernel k{"avx512-bf16-fused",
                                  hasAvx512Bf16,
                                  fusedPairOperands,
                                  simd_backward::chooseTile<cpu::Avx512>,
                                  simd_backward::fusedScratchBytes<true>,
                                  nullptr,
                                  nullptr,
                                  false,
                                  headPairs};
    return k;
}
const BackwardKernel& backwardKernelAvx512Fused() {
    static const BackwardKernel k{"avx512-fused",
                                  hasAvx512,
                                  simd_backward::fusedAccepts<cpu::Avx512>,
                                  simd_backward::chooseTile<cpu::Avx512>,
                                  simd_backward::fusedScratchBytes<false>,
                                  nullptr,
                                  nullptr,
                                  false,
                                  headFloat};
    return k;
}
const BackwardKernel& backwardKernelAvx512() {
    static const BackwardKernel k{
        "avx512", hasAvx512, acceptsAll, simd_backward::chooseTile<cpu::Avx512>, simd_backward::scratchBytes,
        keyFloat, queryFloat};
    return k;
}

}  // namespace attnops::fa

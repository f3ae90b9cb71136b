// The AVX-512 flash-attention forward entries, instances of the generic register-blocked kernel
// (cpu/simd/fa_forward.hpp) on zmm vectors: "avx512" converts inputs of any dtype to fp32 as they
// are loaded and multiplies with fp32 FMAs; "avx512-bf16" multiplies bf16 inputs as bf16 pairs
// with vdpbf16ps (fp32 accumulation) and accepts only problems whose operands and output are all
// bf16 (the planner gives the others to "avx512", and all-bf16 ones too when this CPU's bf16 path
// is the widened one, cpu/bf16_path.hpp).
#include "cpu/avx512/microkernels.hpp"
#include "cpu/isa.hpp"
#include "cpu/simd/fa_forward.hpp"

namespace attnops::fa {
namespace {

bool acceptsAll(const ForwardParams&) { return true; }

// The avx512-bf16 entry takes problems whose operands and output are all bf16 (any strides: the
// packing gathers rows whose column stride is not 1). It rounds P to bf16, so not fp32 outputs.
bool pairOperands(const ForwardParams& p) { return allIn(p, DType::BF16); }

void runFloat(const ForwardParams& p, TileShape t, const WorkUnit& u, void* s) {
    simd_forward::runUnit<cpu::Avx512, void>(p, t, u, s);
}
void runPairs(const ForwardParams& p, TileShape t, const WorkUnit& u, void* s) {
    simd_forward::runUnit<cpu::Avx512, cpu::avx512::Bf16Pairs>(p, t, u, s);
}

bool hasAvx512() {
    const cpu::IsaFeatures& f = cpu::isa();
    return f.avx512f && f.avx512bw && f.avx512vl && f.avx2 && f.fma && f.f16c;
}

bool hasAvx512Bf16() { return hasAvx512() && cpu::isa().avx512bf16; }

}  // namespace

const ForwardKernel& forwardKernelAvx512Bf16() {
    static const ForwardKernel k{
        "avx512-bf16", hasAvx512Bf16, pairOperands, simd_forward::chooseTile<cpu::Avx512>, simd_forward::scratchBytes,
        runPairs};
    return k;
}
const ForwardKernel& forwardKernelAvx512() {
    static const ForwardKernel k{
        "avx512", hasAvx512, acceptsAll, simd_forward::chooseTile<cpu::Avx512>, simd_forward::scratchBytes, runFloat};
    return k;
}

}  // namespace attnops::fa

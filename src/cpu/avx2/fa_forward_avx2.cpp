// The AVX2 flash-attention forward entry "avx2": the generic register-blocked kernel
// (cpu/simd/fa_forward.hpp) on ymm vectors, inputs of any dtype converted to fp32 as they are
// loaded (fp16 with F16C, bf16 by a shift) and multiplied with fp32 FMAs.
#include "cpu/avx2/simd_avx2.hpp"
#include "cpu/isa.hpp"
#include "cpu/simd/fa_forward.hpp"

namespace attnops::fa {
namespace {

bool acceptsAll(const ForwardParams&) { return true; }

void run(const ForwardParams& p, TileShape t, const WorkUnit& u, void* s) {
    simd_forward::runUnit<cpu::Avx2, void>(p, t, u, s);
}

bool hasAvx2() {
    const cpu::IsaFeatures& f = cpu::isa();
    return f.avx2 && f.fma && f.f16c;
}

}  // namespace

const ForwardKernel& forwardKernelAvx2() {
    static const ForwardKernel k{
        "avx2", hasAvx2, acceptsAll, simd_forward::chooseTile<cpu::Avx2>, simd_forward::scratchBytes, run};
    return k;
}

}  // namespace attnops::fa

// The AVX-512 FusedInferAttentionScore prefill entries: the FlashAttentionScore forward's
// structure with FIA's probability rounding (cpu/simd/fia_prefill.hpp) on zmm vectors.
// "avx512-prefill": fp32 FMAs, inputs converted as they are loaded. "avx512-bf16-prefill": bf16
// problems multiplied as bf16 pairs with vdpbf16ps, chosen where this CPU's bf16 path is the dot
// one (the planner passes it over otherwise, ops/fused_infer_attention_score/plan.cpp), as
// FlashAttentionScore's avx512-bf16.
#include "cpu/avx512/microkernels.hpp"
#include "cpu/isa.hpp"
#include "cpu/simd/fia_prefill.hpp"

namespace attnops::fia {
namespace {

bool accepts(const Params& p) { return simd_prefill::accepts<cpu::Avx512>(p); }
// Every operand bf16 (the route's accepts() asks key and value to have the query's dtype), no
// pseShift and no mask whose content is read: with bf16 pairs the loop gives such blocks to the
// row steps, while avx512-prefill keeps them on its vector pse/mask steps (cpu/simd/fa_bias_steps.hpp).
bool acceptsPairs(const Params& p) {
    const fa::ForwardParams& c = p.core;
    return accepts(p) && c.q.dtype == DType::BF16 && c.pse.form == fa::PseForm::None && !c.mask.explicitMask;
}

void run(const Params& p, TileShape t, const WorkUnit& u, void* s) { simd_prefill::runUnit<cpu::Avx512>(p, t, u, s); }
void runPairs(const Params& p, TileShape t, const WorkUnit& u, void* s) {
    simd_prefill::runUnit<cpu::Avx512, cpu::avx512::Bf16Pairs>(p, t, u, s);
}

bool hasAvx512() {
    const cpu::IsaFeatures& f = cpu::isa();
    return f.avx512f && f.avx512bw && f.avx512vl && f.avx2 && f.fma && f.f16c;
}
bool hasAvx512Bf16() { return hasAvx512() && cpu::isa().avx512bf16; }

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

const ForwardKernel& forwardKernelAvx512Bf16Prefill() {
    static const ForwardKernel k{"avx512-bf16-prefill",
                                 hasAvx512Bf16,
                                 acceptsPairs,
                                 simd_prefill::chooseTile<cpu::Avx512>,
                                 simd_prefill::scratchBytes,
                                 runPairs,
                                 false};
    return k;
}

}  // namespace attnops::fia

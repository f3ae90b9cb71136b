// FusedInferAttentionScore's prefill route on the AMX forward with transposed scores
// (fa_amx_forward.hpp), for the prefill route's problems (fia::prefillRouteProblem) whose core
// has no pseShift and no mask whose content is read. FIA's precision model (spec section A: P
// rounded to the query dtype before P.V, the sum l over the unrounded e) is what that forward
// computes already: its tiles multiply P^T rounded to the 16-bit type while the softmax sums
// the fp32 e; its fp32 steps (a block whose values are not all finite) round each probability
// here (FiaRows::probability). Rows end as the simd prefill route's do
// (cpu/simd/fia_prefill.hpp): FIA's emitRow where a learnable sink or the int8 post-quant is
// present, otherwise FlashAttentionScore's row store (the same bits as FA's amx kernel) plus
// softmaxLse = log(l) + m (+inf where no key was kept). Whole query rows: no key splits. Like the
// kernels it includes, it takes ATTNOPS_AMX_FN from the including file and has internal linkage.
#pragma once

#ifndef ATTNOPS_AMX_FN
#error "define ATTNOPS_AMX_FN (the attributes of the backend's build) before including fia_amx_prefill.hpp"
#endif

#include <cmath>
#include <limits>

#include "cpu/amx/fa_amx_forward.hpp"
#include "ops/fused_infer_attention_score/kernel.hpp"

namespace attnops::fia::amx_prefill {
namespace {

using cpu::amx::DotKind;

// The shortest longest query the route takes (as the AVX-512 prefill route): below it the FIA
// kernels, whose key splits spread a long context over threads, stay.
constexpr int64_t kMinQueryRows = 64;

template <DotKind kind>
struct FiaRows {
    const Params& p;
    const WorkUnit& u;       // FIA's unit (emitRow)
    const fa::WorkUnit& fu;  // the same rows as the forward sees them

    float probability(float pj) const { return roundTo(p.probDType, pj); }
    ATTNOPS_AMX_FN void store(int64_t n1, int64_t i, float m, float l, float* acc) const {
        if (p.outQuant.on || !p.sink.empty()) return emitRow(p, u, n1 - u.n2 * p.core.group, i - u.q0, m, l, acc);
        fa::storeOutputRow<kind>(p.core, fu, n1, i, m, l, acc);
        if (p.writeLse)
            p.lse.store(u.b, n1, p.core.seq.qStart[size_t(u.b)] + i, 0,
                        l == 0.0f ? std::numeric_limits<float>::infinity() : std::log(l) + m);
    }
};

// accepts() of a backend whose tiles take fp16 (TDPFP16PS) when withFp16.
inline bool acceptsProblem(const Params& p, bool withFp16) {
    const DType dt = p.core.q.dtype;
    return prefillRouteProblem(p, kMinQueryRows) && fa::amxTransposedForward(p.core) &&
           (dt == DType::BF16 || (withFp16 && dt == DType::F16));
}

inline TileShape tile(const Params& p) { return fa::transposedForwardTile(p.core); }
inline uint64_t scratchBytes(const Params& p, TileShape t) { return fa::transposedForwardScratchBytes(p.core, t); }

template <class Tiles, DotKind kind>
ATTNOPS_AMX_FN void runAs(const Params& p, TileShape t, const WorkUnit& u, void* scratch) {
    const fa::WorkUnit fu{u.b, u.n2, u.q0, u.q1};
    fa::forwardUnitTransposedWith<kind, Tiles>(p.core, sourceView(p.key), sourceView(p.value), t, fu, scratch,
                                               FiaRows<kind>{p, u, fu});
}

template <class Tiles, bool WithFp16>
ATTNOPS_AMX_FN void run(const Params& p, TileShape t, const WorkUnit& u, void* scratch) {
    if constexpr (WithFp16)
        if (p.core.q.dtype == DType::F16) return runAs<Tiles, DotKind::Fp16>(p, t, u, scratch);
    runAs<Tiles, DotKind::Bf16>(p, t, u, scratch);
}

}  // namespace
}  // namespace attnops::fia::amx_prefill

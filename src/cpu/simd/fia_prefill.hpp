// The FusedInferAttentionScore prefill route: a thin adapter that runs the FlashAttentionScore
// forward's unit loop itself (cpu/simd/fa_forward.hpp, runUnitWith: query block transposed once
// per unit, St = K.Q^T and O += P.V as register-blocked GEMMs, the online softmax vectorised
// across V::kLanes query rows, band trimming of partly masked blocks, the fp32 key copy and the
// V strip packing, the row steps for blocks the vector path cannot take) on an FIA problem whose
// key and value are plain strided tensors. What differs is in PrefillSteps below: the precision
// model of spec section A rounds the probabilities to the query dtype (fp16/bf16) before P.V,
// while the sum l takes the unrounded e (the upstream golden). FA's softmax block writes e and
// adds it to l; the hook then rounds the block of e in place and the loop multiplies the rounded
// values, so the rounding is exactly the one of the reference and of the other FIA kernels (the
// row steps round each kept key's probability the same way). Rows end as FIA's do (spec 5 steps
// 10-11: output 0 and lse +inf when no key was kept, the learnable sink in the sum, int8
// post-quant) through fia::emitRow, or, when none of those extras is present, through FA's vector
// row store (out = acc * (1 / l), the same bits as FA) plus softmaxLse = log(l) + m.
//
// Accepted problems (accepts below): the prefill branch (not the Q_S = 1 decode step), BSH,
// BSND, BNSD or TND query/key/value, no paging, tensor list or shared prefix, no int8/int4
// dequantisation or full quantisation, no MLA rope, no tree mask; sparse modes 0-4 (modes 2-4:
// the compressed mask is the analytic band; modes 0/1 with an attenMask whose content is read),
// pseShift, learnable sink, softmaxLse, left padding, actual lengths, GQA, int8 post-quant of the
// output. pseShift and explicit masks go through the loop's vector pse/mask steps
// (cpu/simd/fa_bias_steps.hpp): FIA's pseShift is FA's dense pse added after the scale (spec 5
// step 6, read by physical rows under left padding) and its mask is FA's explicit mask, so the
// same steps serve both operators. The row steps here serve blocks whose values are not all
// finite while some pair of them is masked. A prefill shape: the longest query is at
// least one query tile (V::kQueryRows); shorter ones keep the FIA kernel, whose key splits spread
// a long context over threads. The choice depends on the problem alone, never on the thread count.
//
// Orders of every reduction as in fa_forward.hpp (fixed per element), so results are the same
// bits for any thread count.
#pragma once

#include <cmath>
#include <limits>

#include "cpu/generic/score_row.hpp"
#include "cpu/simd/fa_forward.hpp"
#include "cpu/simd/microkernels.hpp"
#include "ops/flash_attention_score/semantics.hpp"
#include "ops/fused_infer_attention_score/kernel.hpp"
#include "ops/fused_infer_attention_score/params.hpp"
#include "runtime/platform.hpp"

namespace attnops::fia::simd_prefill {

namespace fs = fa::simd_forward;

template <class V>
bool accepts(const Params& p) {
    return prefillRouteProblem(p, V::kQueryRows);
}

template <class V>
TileShape chooseTile(const Params& p) {
    return fs::chooseTile<V>(p.core, platform());
}

inline uint64_t scratchBytes(const Params& p, TileShape t) { return fs::scratchBytes(p.core, t); }

// The precision model's step: probabilities of rows [0, rows) of a block (st[j][r], ld) rounded
// to `dt` (fp16/bf16) in place. Whole vectors (lanes past `rows` hold values no GEMM reads).
template <class V>
ATTNOPS_SIMD_INLINE void roundProbabilities(DType dt, int64_t rows, int64_t nk, int64_t ld, float* st) {
    for (int64_t j = 0; j < nk; ++j) {
        float* row = st + j * ld;
        if (dt == DType::BF16) {
            for (int64_t r = 0; r < rows; r += V::kLanes) V::store(row + r, V::roundBf16(V::load(row + r)));
        } else {
            for (int64_t r = 0; r < rows; r += V::kLanes) V::store(row + r, V::roundHalf(V::load(row + r)));
        }
    }
}

// FusedInferAttentionScore's steps of the FA forward's unit loop (fa_forward.hpp, runUnitWith).
template <class V>
struct PrefillSteps {
    const Params& p;
    const WorkUnit& u;       // FIA's unit (emitRow)
    const fa::WorkUnit& fu;  // the same rows as the FA loop sees them

    // The precision model: P rounded to the query dtype after it joined the sum, before P.V.
    ATTNOPS_SIMD_STEP void roundProbabilities(int64_t rows, int64_t nk, int64_t ld, float* st) const {
        simd_prefill::roundProbabilities<V>(p.probDType, rows, nk, ld, st);
    }
    // fa::tile::accumulateRow with the same rounding of each kept key's probability.
    ATTNOPS_SIMD_STEP void accumulateRow(int64_t n1, int64_t i, int64_t k0, int64_t nk, float rowMax,
                                         float* __restrict s, const uint8_t* kept, uint8_t* keep,
                                         const float* __restrict v, float& m, float& l, float* __restrict acc) const {
        const float alpha = fa::tile::updateRowSoftmax(p.core, fu, n1, i, k0, nk, rowMax, s, kept, keep, m, l);
        const int64_t dv = p.core.dv;
        for (int64_t c = 0; c < dv; ++c) acc[c] *= alpha;
        for (int64_t j = 0; j < nk; ++j) {
            if (!kept[j]) continue;  // masked keys never touch the output
            const float pj = roundTo(p.probDType, s[j]);
            const float* __restrict vrow = v + j * dv;
            for (int64_t c = 0; c < dv; ++c) acc[c] += pj * vrow[c];
        }
    }
    // FIA's end of row (see the header comment).
    ATTNOPS_SIMD_STEP void storeRow(int64_t g, int64_t r, float m, float l, float* acc, float* tmp) const {
        if (p.outQuant.on || !p.sink.empty()) return emitRow(p, u, g, r, m, l, acc);
        const int64_t n1 = u.n2 * p.core.group + g, i = u.q0 + r;
        fs::storeOutputRow<V>(p.core, fu, n1, i, m, l, acc, tmp);
        if (p.writeLse)
            p.lse.store(u.b, n1, p.core.seq.qStart[size_t(u.b)] + i, 0,
                        l == 0.0f ? std::numeric_limits<float>::infinity() : std::log(l) + m);
    }
};

// Rows [q0, q1) of the query heads of kv head n2 against every key they may see. Pairs = void:
// products in fp32; otherwise (bf16 problems) bf16 pairs, as FlashAttentionScore's avx512-bf16:
// Q.K^T exact products summed in pairs, P.V on the probabilities the precision model rounded to
// bf16 already (the loop's packing rounds them again, which changes nothing).
template <class V, class Pairs = void>
ATTNOPS_SIMD_FN void runUnit(const Params& p, TileShape t, const WorkUnit& u, void* scratch) {
    const fa::WorkUnit fu{u.b, u.n2, u.q0, u.q1};
    fs::runUnitWith<V, Pairs>(p.core, sourceView(p.key), sourceView(p.value), t, fu, scratch, PrefillSteps<V>{p, u, fu});
}

}  // namespace attnops::fia::simd_prefill

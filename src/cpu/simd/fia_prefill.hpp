// The FusedInferAttentionScore prefill route: the FlashAttentionScore forward's register-blocked
// structure (cpu/simd/fa_forward.hpp: query block transposed once per unit, St = K.Q^T and
// O += P.V as GEMMs, the online softmax vectorised across V::kLanes query rows, the partly
// masked and pse/explicit-mask blocks through the shared row steps) run on an FIA problem whose
// key and value are plain strided tensors, with the one step where FIA's maths differs from FA's:
// the precision model of spec section A rounds the probabilities to the query dtype (fp16/bf16)
// before P.V, while the sum l takes the unrounded e (the upstream golden). FA's softmax block
// writes e and adds it to l; this kernel then rounds the block of e in place and multiplies
// the rounded values, so the rounding is exactly the one of the reference and of the other FIA
// kernels. Rows end as FIA's do (spec 5 steps 10-11: output 0 and lse +inf when no key was kept,
// the learnable sink in the sum, int8 post-quant) through fia::emitRow, or, when none of those
// extras is present, through FA's vector row store (out = acc * (1 / l), the same bits as FA)
// plus softmaxLse = log(l) + m.
//
// Accepted problems (accepts below): the prefill branch (not the Q_S = 1 decode step), BSH,
// BSND, BNSD or TND query/key/value, no paging, tensor list or shared prefix, no int8/int4
// dequantisation or full quantisation, no MLA rope, no tree mask, no pseShift and no attenMask
// whose content is read (sparse mode 0 or 1 with a mask); sparse modes 0-4 as bands (modes 2-4:
// the compressed mask is the analytic band), learnable sink, softmaxLse, left padding, actual
// lengths, GQA, int8 post-quant of the output. pseShift and explicit masks would send every block
// through FA's scalar row steps, slower than the FIA kernel's vector rows (measured: bf16 B=2
// S=300/500 D=128, 1.3-1.6x slower), so those stay with the FIA kernel; the row steps here serve
// blocks the band cuts whose values are not all finite. A prefill shape: the longest query is at
// least one query tile (V::kQueryRows); shorter ones keep the FIA kernel, whose key splits spread
// a long context over threads. The choice depends on the problem alone, never on the thread count.
//
// Orders of every reduction as in fa_forward.hpp (fixed per element), so results are the same
// bits for any thread count.
#pragma once

#include <algorithm>
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

namespace simd = cpu::simd;
namespace fs = fa::simd_forward;
using fa::tile::kNegInf;

// The (b, kv head, row, dim) view of an unpaged key or value source with no extra parts: the
// addressing of kvRowOffset (row t of batch b at kvStart[b] + t) as a FlashAttentionScore view.
inline fa::View4 sourceView(const KvSource& s) {
    fa::View4 v;
    v.data = s.data;
    v.dtype = s.dtype;
    v.stride[0] = s.batchStride;
    v.stride[1] = s.headStride;
    v.stride[2] = s.rowStride;
    v.stride[3] = s.dimStride;
    return v;
}

template <class V>
bool accepts(const Params& p) {
    const fa::ForwardParams& c = p.core;
    const bool plainSources = p.table.data == nullptr && p.cache == CacheFormat::None && !hasKvParts(p.key) &&
                              !hasKvParts(p.value) && p.key.dimGroup == 0 && p.value.dimGroup == 0;
    const bool plainValues = p.keyQuant.mode == Antiquant::None && p.valueQuant.mode == Antiquant::None &&
                             !p.fullQuant.on && p.key.dtype == c.q.dtype && p.value.dtype == c.q.dtype &&
                             (c.q.dtype == DType::F16 || c.q.dtype == DType::BF16) && p.probDType == c.q.dtype;
    const bool plainCore = p.ropeDim == 0 && !p.valueIsKey && p.tree == nullptr && !c.dropout.enabled &&
                           c.sink == nullptr && !c.writeStats && c.mask.sparseMode >= 0 && c.mask.sparseMode <= 4 &&
                           c.pse.form == fa::PseForm::None && !c.mask.explicitMask;
    return !p.decode && plainSources && plainValues && plainCore && c.d <= fa::kMaxHeadDim && c.dv <= fa::kMaxHeadDim &&
           c.seq.maxQLen >= V::kQueryRows;
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

// The row steps' online-softmax update (fa::tile::accumulateRow) with the probabilities rounded
// to the query dtype after they join the sum and before P.V.
ATTNOPS_SIMD_INLINE void accumulateRowRounded(const Params& p, const fa::WorkUnit& u, int64_t n1, int64_t i, int64_t k0,
                                              int64_t nk, float rowMax, float* __restrict s, const uint8_t* kept,
                                              uint8_t* keep, const float* __restrict v, float& m, float& l,
                                              float* __restrict acc) {
    const float alpha = fa::tile::updateRowSoftmax(p.core, u, n1, i, k0, nk, rowMax, s, kept, keep, m, l);
    const int64_t dv = p.core.dv;
    for (int64_t c = 0; c < dv; ++c) acc[c] *= alpha;
    for (int64_t j = 0; j < nk; ++j) {
        if (!kept[j]) continue;  // masked keys never touch the output
        const float pj = roundTo(p.probDType, s[j]);
        const float* __restrict vrow = v + j * dv;
        for (int64_t c = 0; c < dv; ++c) acc[c] += pj * vrow[c];
    }
}

// The end of row q0 + r of query head g (see the header comment).
template <class V>
ATTNOPS_SIMD_INLINE void finishRow(const Params& p, const WorkUnit& u, const fa::WorkUnit& fu, int64_t g, int64_t r,
                                   float m, float l, float* acc, float* tmp) {
    if (p.outQuant.on || !p.sink.empty()) return emitRow(p, u, g, r, m, l, acc);
    const int64_t n1 = u.n2 * p.core.group + g, i = u.q0 + r;
    fs::storeOutputRow<V>(p.core, fu, n1, i, m, l, acc, tmp);
    if (p.writeLse)
        p.lse.store(u.b, n1, p.core.seq.qStart[size_t(u.b)] + i, 0,
                    l == 0.0f ? std::numeric_limits<float>::infinity() : std::log(l) + m);
}

// Rows [q0, q1) of the query heads of kv head n2 against every key they may see.
template <class V>
ATTNOPS_SIMD_FN void runUnit(const Params& p, TileShape t, const WorkUnit& u, void* scratch) {
    const fa::ForwardParams& c = p.core;
    const fa::View4 kView = sourceView(p.key), vView = sourceView(p.value);
    fs::Scratch sc(c, t, scratch);
    const fa::WorkUnit fu{u.b, u.n2, u.q0, u.q1};
    const int64_t sq = c.seq.qLen[size_t(u.b)], skv = c.seq.kvLen[size_t(u.b)];
    const fa::SeqRule rule = fa::seqRule(c.mask, u.b, sq, skv);
    const fa::KeyRange keys = fa::keyRange(rule, u.q0, u.q1, skv);
    const int64_t rows = u.q1 - u.q0, qr = t.queryRows, d = c.d, dv = c.dv;
    const bool vectorSoftmax = c.pse.form == fa::PseForm::None && !c.mask.explicitMask;
    const int64_t qRow0 = c.seq.qStart[size_t(u.b)] + u.q0;
    const bool bandVector = simd::BandLanes<V>::usable(sq, skv);
    const simd::BandLanes<V> band = simd::bandLanes<V>(rule, skv);
    for (int64_t g = 0; g < c.group; ++g) {
        const int64_t n1 = u.n2 * c.group + g;
        simd::loadRowsTransposed<V>(c.q, u.b, n1, qRow0, rows, d, qr, sc.s, sc.qt);
        std::fill(sc.m, sc.m + qr, kNegInf);
        std::fill(sc.l, sc.l + qr, 0.0f);
        std::fill(sc.acc, sc.acc + rows * dv, 0.0f);
        for (int64_t k0 = keys.lo; k0 < keys.hi; k0 += t.keyRows) {
            const int64_t nk = std::min(t.keyRows, keys.hi - k0);
            const int64_t kvRow0 = c.seq.kvStart[size_t(u.b)] + k0;
            simd::loadRowsFast<V>(kView, u.b, u.n2, kvRow0, nk, d, sc.k);
            simd::loadRowsStrips<V>(vView, u.b, u.n2, kvRow0, nk, dv, sc.vs);
            simd::gemmScores<V, false>(nk, rows, d, sc.k, d, sc.qt, qr, sc.st, qr);  // St = K . Q^T
            // As in FA: partly masked blocks take the vector path when the band is vectorisable
            // and the values are finite (a masked key's 0 * v must be 0, as if it were skipped).
            const bool full = simd::blockFullyKept(rule, u.q0, u.q1, k0, k0 + nk, skv);
            if (vectorSoftmax && (full || (bandVector && fs::valuesFinite<V, void>(sc.vs, nullptr, nk, dv)))) {
                fs::softmaxBlock<V>(c, rows, nk, qr, sc.st, sc.m, sc.l, sc.acc, full ? nullptr : &band, u.q0, k0);
                roundProbabilities<V>(p.probDType, rows, nk, qr, sc.st);
                simd::gemmStrips<V, true>(rows, dv, nk, sc.st, qr, sc.vs, sc.acc, dv, true);  // acc += P . V
                continue;
            }
            simd::loadRows<V>(vView, u.b, u.n2, kvRow0, nk, dv, dv, sc.v);  // the row steps read fp32 rows
            for (int64_t r = 0; r < rows; ++r) {
                const int64_t i = u.q0 + r;
                for (int64_t j = 0; j < nk; ++j) sc.s[j] = sc.st[j * qr + r];
                const float rowMax = fa::tile::finishScores(c, u.b, n1, rule, i, k0, nk, skv, sc.s, sc.kept);
                if (rowMax == kNegInf) continue;  // nothing kept in this block for this row
                accumulateRowRounded(p, fu, n1, i, k0, nk, rowMax, sc.s, sc.kept, sc.keep, sc.v, sc.m[r], sc.l[r],
                                     sc.acc + r * dv);
            }
        }
        for (int64_t r = 0; r < rows; ++r) finishRow<V>(p, u, fu, g, r, sc.m[r], sc.l[r], sc.acc + r * dv, sc.s);
    }
}

}  // namespace attnops::fia::simd_prefill

// The AVX-512 flash-attention forward: register-blocked GEMMs for S = Q.K^T and O += P.V and an
// online softmax vectorised across 16 query rows. Two entries: "avx512" converts inputs of any
// dtype to fp32 as they are loaded (fp16 through vcvtph2ps, so fp16 keeps fp32 arithmetic and
// its accuracy, never a detour through bf16) and multiplies with fp32 FMAs; "avx512-bf16"
// multiplies bf16 inputs as bf16 pairs with vdpbf16ps (fp32 accumulation) and accepts only
// problems whose operands are all bf16 (the planner gives the others to "avx512").
//
// Scores are kept transposed, St[key][query row]: the query block is transposed once per work
// unit and key/value blocks are used as stored, so no block is transposed inside the key loop,
// and the softmax statistics of 16 rows sit in one vector. Without pse, explicit mask or dropout
// every block takes the vector path (the sparse mode's band evaluated per lane), except a partly
// masked block whose values are not all finite; those and the rest take the row steps shared
// with the tiled kernel, which skip masked keys exactly as the reference does.
//
// Order of every reduction, fixed per element: Q.K over the head dim ascending (in pairs with
// vdpbf16ps), the row max and sum over keys ascending (per lane), P.V over keys ascending.
#include <algorithm>
#include <cstring>

#include "cpu/avx512/microkernels.hpp"
#include "cpu/generic/score_row.hpp"
#include "cpu/isa.hpp"
#include "ops/flash_attention_score/kernel.hpp"
#include "ops/flash_attention_score/semantics.hpp"

namespace attnops::fa {
namespace {

namespace simd = cpu::avx512;
using tile::kNegInf;

constexpr int64_t kAlignFloats = 16;
int64_t alignUp(int64_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

struct Scratch {
    float* qt;    // [d][queryRows]   the query block transposed
    float* k;     // [keyRows][d]
    float* v;     // [keyRows][dv]
    float* st;    // [keyRows][queryRows] scores, then probabilities
    float* acc;   // [queryRows][dv]
    float* m;     // [queryRows] running max
    float* l;     // [queryRows] running sum
    float* s;     // [max(keyRows, d)] one row of scores (row steps), one loaded row (transposes)
    uint8_t* kept;  // [keyRows]
    uint8_t* keep;  // [keyRows]
    // bf16 pairs (the avx512-bf16 entry), dPairs = ceil(d / 2), keyPairs = keyRows / 2:
    uint32_t* qp;   // [dPairs][queryRows]  the query block, column pairs, transposed
    uint32_t* kp;   // [keyRows][dPairs]    the key block, column pairs
    uint32_t* vp;   // [keyPairs][dv]       the value block, row pairs
    uint32_t* pp;   // [keyPairs][queryRows] probabilities, row pairs of st

    static int64_t floats(const ForwardParams& p, TileShape t) {
        const int64_t qr = t.queryRows, kr = t.keyRows, dPairs = (p.d + 1) / 2;
        return alignUp(p.d * qr) + alignUp(kr * p.d) + alignUp(kr * p.dv) + alignUp(kr * qr) + alignUp(qr * p.dv) +
               2 * alignUp(qr) + alignUp(std::max(kr, p.d)) + 2 * alignUp(kr) + alignUp(dPairs * qr) +
               alignUp(kr * dPairs) + alignUp(kr / 2 * p.dv) + alignUp(kr / 2 * qr);
    }

    Scratch(const ForwardParams& p, TileShape t, void* base) {
        const int64_t qr = t.queryRows, kr = t.keyRows;
        float* f = static_cast<float*>(base);
        auto take = [&](int64_t n) {
            float* r = f;
            f += alignUp(n);
            return r;
        };
        qt = take(p.d * qr);
        k = take(kr * p.d);
        v = take(kr * p.dv);
        st = take(kr * qr);
        acc = take(qr * p.dv);
        m = take(qr);
        l = take(qr);
        s = take(std::max(kr, p.d));
        kept = reinterpret_cast<uint8_t*>(take(kr));
        keep = reinterpret_cast<uint8_t*>(take(kr));
        const int64_t dPairs = (p.d + 1) / 2;
        qp = reinterpret_cast<uint32_t*>(take(dPairs * qr));
        kp = reinterpret_cast<uint32_t*>(take(kr * dPairs));
        vp = reinterpret_cast<uint32_t*>(take(kr / 2 * p.dv));
        pp = reinterpret_cast<uint32_t*>(take(kr / 2 * qr));
    }
};

// 64 query rows: the query block is 4 zmm wide (one GEMM strip, 16 rows per softmax vector).
TileShape chooseTile(const ForwardParams& p, const PlatformInfo& info) {
    TileShape t;
    t.queryRows = 64;
    t.keyRows = simd::keyBlockRows(p.d, p.dv, info.l2Bytes);
    return t;
}

uint64_t scratchBytes(const ForwardParams& p, TileShape t) { return uint64_t(Scratch::floats(p, t)) * sizeof(float); }

// Whether every row of [q0, q1) keeps every key of [k0, k1) by the analytic rule alone.
bool blockFullyKept(const SeqRule& rule, int64_t q0, int64_t q1, int64_t k0, int64_t k1, int64_t skv) {
    const int64_t prefixEnd = std::min(rule.prefix, skv);
    if (k1 <= prefixEnd) return true;
    const KeyRange first = rowBand(rule, q0, skv), last = rowBand(rule, q1 - 1, skv);
    return std::max(k0, prefixEnd) >= last.lo && k1 <= first.hi;
}

// Online softmax of a block for rows [0, rows), 16 rows per vector: scales the scores in st,
// turns them into probabilities, updates m and l, and rescales the accumulator rows. With a
// band, pairs it masks get score -inf and probability 0 (query rows from row0, keys from key0).
ATTNOPS_AVX512_INLINE void softmaxBlock(const ForwardParams& p, int64_t rows, int64_t nk, int64_t ld, float* st,
                                        float* m, float* l, float* acc, const simd::BandLanes* band, int64_t row0,
                                        int64_t key0) {
    const __m512 scale = _mm512_set1_ps(p.scale), negInf = _mm512_set1_ps(kNegInf);
    for (int64_t r0 = 0; r0 < rows; r0 += simd::kLanes) {
        __m512 blockMax = negInf;
        __mmask16 nan = 0;
        for (int64_t j = 0; j < nk; ++j) {
            __m512 x = _mm512_mul_ps(_mm512_loadu_ps(st + j * ld + r0), scale);
            if (band != nullptr) x = _mm512_mask_mov_ps(negInf, simd::keptRows(*band, key0 + j, row0 + r0), x);
            _mm512_storeu_ps(st + j * ld + r0, x);
            nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
            blockMax = _mm512_max_ps(blockMax, x);
        }
        blockMax = _mm512_mask_mov_ps(blockMax, nan, _mm512_set1_ps(__builtin_nanf("")));
        const __m512 mOld = _mm512_loadu_ps(m + r0);
        const __mmask16 takeNew =
            _mm512_cmp_ps_mask(blockMax, mOld, _CMP_GT_OQ) | _mm512_cmp_ps_mask(blockMax, blockMax, _CMP_UNORD_Q);
        const __m512 mNew = _mm512_mask_mov_ps(mOld, takeNew, blockMax);
        // alpha = 0 while nothing was accumulated (mOld = -inf), so -inf - -inf never reaches exp.
        const __mmask16 started = _mm512_cmp_ps_mask(mOld, negInf, _CMP_NEQ_UQ);
        const __m512 alpha = _mm512_maskz_mov_ps(started, simd::exp(_mm512_sub_ps(mOld, mNew)));
        const __mmask16 live = _mm512_cmp_ps_mask(mNew, negInf, _CMP_NEQ_UQ);
        __m512 sum = _mm512_setzero_ps();
        for (int64_t j = 0; j < nk; ++j) {
            const __m512 x = _mm512_loadu_ps(st + j * ld + r0);
            const __mmask16 kept = live & _mm512_cmp_ps_mask(x, negInf, _CMP_NEQ_UQ);
            const __m512 e = _mm512_maskz_mov_ps(kept, simd::exp(_mm512_sub_ps(x, mNew)));
            _mm512_storeu_ps(st + j * ld + r0, e);
            sum = _mm512_add_ps(sum, e);
        }
        _mm512_storeu_ps(l + r0, _mm512_fmadd_ps(_mm512_loadu_ps(l + r0), alpha, sum));
        _mm512_storeu_ps(m + r0, mNew);
        alignas(64) float alphas[simd::kLanes];
        _mm512_store_ps(alphas, alpha);
        for (int64_t r = r0; r < std::min(rows, r0 + simd::kLanes); ++r)
            simd::scaleRow(p.dv, alphas[r - r0], acc + r * p.dv);
    }
}

// Whether the value block is finite (bf16 pairs: checked on their fp32 widening).
template <bool PairDot>
ATTNOPS_AVX512_INLINE bool valuesFinite(const Scratch& sc, int64_t nk, int64_t dv) {
    if (!PairDot) return simd::allFinite(sc.v, nk, dv, dv);
    // A bf16 is finite iff its exponent bits are not all ones.
    const __m512i expMask = _mm512_set1_epi16(0x7F80);
    for (int64_t pair = 0; pair < (nk + 1) / 2; ++pair)
        for (int64_t c = 0; c < dv; c += simd::kLanes) {
            const __m512i x = _mm512_maskz_loadu_epi32(simd::tailMask(dv - c), sc.vp + pair * dv + c);
            if (_mm512_cmpeq_epi16_mask(_mm512_and_si512(x, expMask), expMask) != 0) return false;
        }
    return true;
}

// PairDot: bf16 inputs multiplied as bf16 pairs with vdpbf16ps (Q.K^T exact products, P rounded
// to bf16 for P.V like the naive low-precision computation of the tolerance rule); otherwise
// everything is converted to fp32 and multiplied with fp32 FMAs.
template <bool PairDot>
ATTNOPS_AVX512_FN void runUnit(const ForwardParams& p, TileShape t, const WorkUnit& u, void* scratch) {
    Scratch sc(p, t, scratch);
    const int64_t sq = p.seq.qLen[size_t(u.b)], skv = p.seq.kvLen[size_t(u.b)];
    const SeqRule rule = seqRule(p.mask, u.b, sq, skv);
    const KeyRange keys = keyRange(rule, u.q0, u.q1, skv);
    const int64_t rows = u.q1 - u.q0, qr = t.queryRows, d = p.d, dv = p.dv, dPairs = (d + 1) / 2;
    const bool vectorSoftmax = p.pse.form == PseForm::None && !p.mask.explicitMask && !p.dropout.enabled;
    const int64_t qRow0 = p.seq.qStart[size_t(u.b)] + u.q0;
    const bool bandVector = simd::BandLanes::usable(sq, skv);
    const simd::BandLanes band = simd::bandLanes(rule, skv);
    for (int64_t g = 0; g < p.group; ++g) {
        const int64_t n1 = u.n2 * p.group + g;
        if (PairDot)
            simd::packColumnPairsTransposed(p.q, u.b, n1, qRow0, rows, d, qr, sc.qp);
        else
            simd::loadRowsTransposed(p.q, u.b, n1, qRow0, rows, d, qr, sc.s, sc.qt);
        std::fill(sc.m, sc.m + qr, kNegInf);
        std::fill(sc.l, sc.l + qr, 0.0f);
        std::fill(sc.acc, sc.acc + rows * dv, 0.0f);
        for (int64_t k0 = keys.lo; k0 < keys.hi; k0 += t.keyRows) {
            const int64_t nk = std::min(t.keyRows, keys.hi - k0);
            const int64_t kvRow0 = p.seq.kvStart[size_t(u.b)] + k0;
            if (PairDot) {
                simd::packColumnPairs(p.k, u.b, u.n2, kvRow0, nk, d, dPairs, sc.kp);
                simd::gemm<false, simd::Bf16PairDot>(nk, rows, dPairs, sc.kp, dPairs, sc.qp, qr, sc.st, qr, false);
            } else {
                simd::loadRows(p.k, u.b, u.n2, kvRow0, nk, d, d, sc.k);
                simd::loadRows(p.v, u.b, u.n2, kvRow0, nk, dv, dv, sc.v);
                simd::gemm<false>(nk, rows, d, sc.k, d, sc.qt, qr, sc.st, qr, false);  // St = K . Q^T
            }
            // Partly masked blocks go through the GEMM too when the band is vectorisable and the
            // values are finite (a masked key's 0 * v must be 0, as if it were skipped).
            const bool full = blockFullyKept(rule, u.q0, u.q1, k0, k0 + nk, skv);
            if (PairDot) simd::packRowPairs(p.v, u.b, u.n2, kvRow0, nk, dv, sc.vp);
            if (vectorSoftmax && (full || (bandVector && valuesFinite<PairDot>(sc, nk, dv)))) {
                softmaxBlock(p, rows, nk, qr, sc.st, sc.m, sc.l, sc.acc, full ? nullptr : &band, u.q0, k0);
                if (PairDot) {  // acc += P . V
                    simd::packFloatRowPairs(sc.st, nk, rows, qr, sc.pp);
                    simd::gemm<true, simd::Bf16PairDot>(rows, dv, (nk + 1) / 2, sc.pp, qr, sc.vp, dv, sc.acc, dv, true);
                } else {
                    simd::gemm<true>(rows, dv, nk, sc.st, qr, sc.v, dv, sc.acc, dv, true);
                }
                continue;
            }
            if (PairDot) simd::loadRows(p.v, u.b, u.n2, kvRow0, nk, dv, dv, sc.v);  // the row steps read fp32
            for (int64_t r = 0; r < rows; ++r) {
                const int64_t i = u.q0 + r;
                for (int64_t j = 0; j < nk; ++j) sc.s[j] = sc.st[j * qr + r];
                const float rowMax = tile::finishScores(p, u.b, n1, rule, i, k0, nk, skv, sc.s, sc.kept);
                if (rowMax == kNegInf) continue;  // nothing kept in this block for this row
                tile::accumulateRow(p, u, n1, i, k0, nk, rowMax, sc.s, sc.kept, sc.keep, sc.v, sc.m[r], sc.l[r],
                                    sc.acc + r * dv);
            }
        }
        for (int64_t r = 0; r < rows; ++r) tile::storeRow(p, u, n1, u.q0 + r, sc.m[r], sc.l[r], sc.acc + r * dv);
    }
}

bool acceptsAll(const ForwardParams&) { return true; }

// The avx512-bf16 entry takes problems whose operands are all bf16 (any strides: the packing
// gathers rows whose column stride is not 1); the planner sends the others to avx512.
bool pairOperands(const ForwardParams& p) {
    for (const View4* v : {&p.q, &p.k, &p.v})
        if (v->dtype != DType::BF16) return false;
    return true;
}

void runFloat(const ForwardParams& p, TileShape t, const WorkUnit& u, void* s) { runUnit<false>(p, t, u, s); }
void runPairs(const ForwardParams& p, TileShape t, const WorkUnit& u, void* s) { runUnit<true>(p, t, u, s); }

bool hasAvx512() {
    const cpu::IsaFeatures& f = cpu::isa();
    return f.avx512f && f.avx512bw && f.avx512vl && f.avx2 && f.fma && f.f16c;
}

bool hasAvx512Bf16() { return hasAvx512() && cpu::isa().avx512bf16; }

}  // namespace

const ForwardKernel& forwardKernelAvx512Bf16() {
    static const ForwardKernel k{"avx512-bf16", hasAvx512Bf16, pairOperands, chooseTile, scratchBytes, runPairs};
    return k;
}
const ForwardKernel& forwardKernelAvx512() {
    static const ForwardKernel k{"avx512", hasAvx512, acceptsAll, chooseTile, scratchBytes, runFloat};
    return k;
}

}  // namespace attnops::fa

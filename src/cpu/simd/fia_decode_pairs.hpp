// The bf16-pair decode of the FusedInferAttentionScore vector kernel (entry avx512-bf16, Pairs =
// cpu::avx512::Bf16Pairs, called by runUnit in cpu/simd/fia_forward.hpp): vdpbf16ps on
// bf16 pairs instead of fp32 FMAs on converted vectors, for a bf16 query against a bf16 key and
// value cache (no rope, no quantisation), where every row tile of a unit reads the cache straight
// (no packing: decode steps of groups up to 8 query rows) and the rows are dense (not NZ). q.k
// multiplies the query's exact bf16 pairs with the key row's adjacent dims; P.V multiplies the
// probabilities, already rounded to bf16 by the precision model (probDType), as pairs of adjacent
// keys with the two value rows interleaved in registers. Each vdpbf16ps adds the two products of
// a pair to its fp32 lane (denormal inputs read as 0, as on every vdpbf16ps path). The order:
// q.k over the head dim in 16-pair vectors ascending, then the lanes by V::sum8's tree; P.V over
// key pairs ascending. NZ caches and packing units take the fp32 dots of the same entry.
#pragma once

#include <algorithm>
#include <type_traits>

#include "cpu/simd/fia_unit.hpp"

namespace attnops::fia::simd_forward {

// Whether the bf16-pair entry takes the problem (the unit may still take the fp32 dots: pairDecode).
template <class V>
bool pairAccepts(const Params& p) {
    const int64_t rows = std::min<int64_t>(std::max<int64_t>(1, p.core.seq.maxQLen), chooseTile(p).queryRows);
    return accepts<V>(p) && p.core.q.dtype == DType::BF16 && p.key.dtype == DType::BF16 &&
           p.value.dtype == DType::BF16 && p.probDType == DType::BF16 && p.ropeDim == 0 && !mlaFullQuant(p) &&
           p.keyQuant.mode == Antiquant::None && p.valueQuant.mode == Antiquant::None &&
           !packs(p, p.core.group * rows);
}

inline bool pairDecode(const Params& p, int64_t R, const Scratch& sc) {
    return p.core.q.dtype == DType::BF16 && p.key.dtype == DType::BF16 && p.value.dtype == DType::BF16 &&
           p.probDType == DType::BF16 && p.ropeDim == 0 && !mlaFullQuant(p) && p.keyQuant.mode == Antiquant::None &&
           p.valueQuant.mode == Antiquant::None && !packs(p, R) && sc.kDense && sc.vDense;
}

// st[r * ldst + k] = q_r . key_k for NR rows and the NK keys at keys[0 .. NK), from the query
// pairs qp (leading dimension d / 2) and the keys' dims as pairs.
template <class V, class Pairs, int NR, int NK>
ATTNOPS_SIMD_INLINE void pairDotStep(int64_t d, const char* const* keys, const uint32_t* qp, float* st, int64_t ldst) {
    using Vec = typename V::Vec;
    using Dot = typename Pairs::Dot;
    constexpr int kAcc = int(NK * kRowTile);
    Vec acc[kAcc];
    alignas(64) float sums[kAcc];
#pragma GCC unroll 12
    for (int i = 0; i < kAcc; ++i) acc[i] = V::zero();
    const int64_t pairs = d / 2;  // d is a whole number of 16-lane vectors (accepts)
    for (int64_t c = 0; c < pairs; c += V::kLanes) {
        const bool whole = c + V::kLanes <= pairs;
        const auto mk = V::tail(pairs - c);
        Vec x[NK];
#pragma GCC unroll 3
        for (int k = 0; k < NK; ++k) {
            const uint32_t* row = reinterpret_cast<const uint32_t*>(keys[k]) + c;
            x[k] = whole ? Dot::load(row) : Dot::loadMasked(mk, row);
        }
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
            Vec qv = whole ? Dot::load(qp + r * pairs + c) : Dot::loadMasked(mk, qp + r * pairs + c);
            keepInRegister<V>(qv);
#pragma GCC unroll 3
            for (int k = 0; k < NK; ++k) acc[k * kRowTile + r] = Dot::madd(qv, x[k], acc[k * kRowTile + r]);
        }
    }
    sumEach<V, kAcc>(acc, sums);
    for (int k = 0; k < NK; ++k)
        for (int r = 0; r < NR; ++r) st[r * ldst + k] = sums[k * kRowTile + r];
}

// pairDotStep over keys j < nk, kDotKeys at a time; the first row tile prefetches the next
// block's rows (as dotRows).
template <class V, class Pairs, int NR>
ATTNOPS_SIMD_FN void pairDotRows(int64_t d, const char* const* kRow, int64_t nk, const uint32_t* qp, float* st,
                                 int64_t ldst, const Scratch* pre) {
    for (int64_t j = 0; j < nk; j += kDotKeys) {
        if (pre != nullptr)
            for (int64_t i = j; i < std::min(j + kDotKeys, pre->preRows); ++i) {
                prefetchRow(pre->kPre[i], pre->kLines, pre->kLineCount);
                if (pre->prefetchValues) prefetchRow(pre->vPre[i], pre->vLines, pre->vLineCount);
            }
        switch (std::min(kDotKeys, nk - j)) {
            case 1: pairDotStep<V, Pairs, NR, 1>(d, kRow + j, qp, st + j, ldst); break;
            case 2: pairDotStep<V, Pairs, NR, 2>(d, kRow + j, qp, st + j, ldst); break;
            default: pairDotStep<V, Pairs, NR, 3>(d, kRow + j, qp, st + j, ldst); break;
        }
    }
}

template <class V, class Pairs>
ATTNOPS_SIMD_FN void pairDots(int64_t R, int64_t d, const Scratch& sc, int64_t nk, int64_t ldst) {
    if constexpr (!std::is_void_v<Pairs>) {  // (void: never called)
        for (int64_t r0 = 0; r0 < R; r0 += kRowTile) {
            const uint32_t* qp = sc.qp + r0 * (d / 2);
            float* st = sc.st + r0 * ldst;
            const Scratch* pre = r0 == 0 ? &sc : nullptr;
            switch (std::min(kRowTile, R - r0)) {
                case 1: pairDotRows<V, Pairs, 1>(d, sc.kRow, nk, qp, st, ldst, pre); break;
                case 2: pairDotRows<V, Pairs, 2>(d, sc.kRow, nk, qp, st, ldst, pre); break;
                case 3: pairDotRows<V, Pairs, 3>(d, sc.kRow, nk, qp, st, ldst, pre); break;
                default: pairDotRows<V, Pairs, 4>(d, sc.kRow, nk, qp, st, ldst, pre); break;
            }
        }
    }
}

// acc[r * ldacc + c .. + NV * kLanes) += sum over key pairs (j, j + 1) of the probability pair
// pp[r * ldpp + j / 2] times the value rows j, j + 1 interleaved, for NR rows, pairs ascending.
// SkipZero: a key whose probability is 0 in every row is left out (its value row reads as 0, so
// masked keys never touch the output even if their values are not finite), a pair of two such
// keys skipped. Past an odd nk the pair's high key is 0 (probability and value).
template <class V, class Pairs, int NR, int NV, bool SkipZero>
ATTNOPS_SIMD_FN void pairAccumulateColumns(int64_t c, const char* const* vRow, int64_t nk, const float* st,
                                           int64_t ldst, const uint32_t* pp, int64_t ldpp, float* acc,
                                           int64_t ldacc) {
    using Vec = typename V::Vec;
    constexpr int64_t L = V::kLanes;
    Vec a[kRowTile][NV];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r)
        for (int v = 0; v < NV; ++v) a[r][v] = V::load(acc + r * ldacc + c + v * L);
    for (int64_t j = 0; j < nk; j += 2) {
        bool use0 = true, use1 = j + 1 < nk;
        if constexpr (SkipZero) {
            bool any0 = false, any1 = false;
            for (int r = 0; r < NR; ++r) {
                any0 = any0 || st[r * ldst + j] != 0.0f;
                any1 = any1 || (use1 && st[r * ldst + j + 1] != 0.0f);
            }
            use0 = any0;
            use1 = any1;
            if (!use0 && !use1) continue;
        }
        const uint16_t* even = use0 ? reinterpret_cast<const uint16_t*>(vRow[j]) + c : nullptr;
        const uint16_t* odd = use1 ? reinterpret_cast<const uint16_t*>(vRow[j + 1]) + c : nullptr;
        Vec x[NV];
        for (int v = 0; v < NV; ++v)
            x[v] = Pairs::interleavedRows(even != nullptr ? even + v * L : nullptr, odd != nullptr ? odd + v * L : nullptr);
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
            const Vec pb = Pairs::broadcastPair(pp + r * ldpp + j / 2);
            for (int v = 0; v < NV; ++v) a[r][v] = Pairs::Dot::madd(pb, x[v], a[r][v]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r)
        for (int v = 0; v < NV; ++v) V::store(acc + r * ldacc + c + v * L, a[r][v]);
}

// All dv columns, four vectors at a time (4 rows x 4 accumulators + 4 value pairs + 1 broadcast
// probability pair: 21 of the 32 zmm registers), then two, then one.
template <class V, class Pairs, int NR, bool SkipZero>
ATTNOPS_SIMD_FN void pairAccumulateRows(int64_t dv, const char* const* vRow, int64_t nk, const float* st, int64_t ldst,
                                        const uint32_t* pp, int64_t ldpp, float* acc, int64_t ldacc) {
    constexpr int64_t L = V::kLanes;
    int64_t c = 0;
    for (; c + 4 * L <= dv; c += 4 * L)
        pairAccumulateColumns<V, Pairs, NR, 4, SkipZero>(c, vRow, nk, st, ldst, pp, ldpp, acc, ldacc);
    for (; c + 2 * L <= dv; c += 2 * L)
        pairAccumulateColumns<V, Pairs, NR, 2, SkipZero>(c, vRow, nk, st, ldst, pp, ldpp, acc, ldacc);
    if (c < dv) pairAccumulateColumns<V, Pairs, NR, 1, SkipZero>(c, vRow, nk, st, ldst, pp, ldpp, acc, ldacc);
}

template <class V, class Pairs, bool SkipZero>
ATTNOPS_SIMD_FN void pairAccumulate(int64_t R, int64_t dv, const Scratch& sc, int64_t nk, int64_t ldst) {
    if constexpr (!std::is_void_v<Pairs>) {  // (void: never called)
        const int64_t ldpp = (ldst + 1) / 2;
        Pairs::packFloatColumnPairs(sc.st, R, nk, ldst, ldpp, sc.pp);  // exact: bf16 values
        for (int64_t r0 = 0; r0 < R; r0 += kRowTile) {
            const float* st = sc.st + r0 * ldst;
            const uint32_t* pp = sc.pp + r0 * ldpp;
            float* acc = sc.acc + r0 * dv;
            switch (std::min(kRowTile, R - r0)) {
                case 1: pairAccumulateRows<V, Pairs, 1, SkipZero>(dv, sc.vRow, nk, st, ldst, pp, ldpp, acc, dv); break;
                case 2: pairAccumulateRows<V, Pairs, 2, SkipZero>(dv, sc.vRow, nk, st, ldst, pp, ldpp, acc, dv); break;
                case 3: pairAccumulateRows<V, Pairs, 3, SkipZero>(dv, sc.vRow, nk, st, ldst, pp, ldpp, acc, dv); break;
                default: pairAccumulateRows<V, Pairs, 4, SkipZero>(dv, sc.vRow, nk, st, ldst, pp, ldpp, acc, dv); break;
            }
        }
    }
}

}  // namespace attnops::fia::simd_forward

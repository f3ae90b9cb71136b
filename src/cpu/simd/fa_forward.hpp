// The register-blocked flash-attention forward, written once over an instruction-set trait V
// (cpu/simd/microkernels.hpp) and instantiated by the avx512 and avx2 entries: GEMMs for
// S = Q.K^T and O += P.V and an online softmax vectorised across V::kLanes query rows. Inputs of
// any dtype are converted to fp32 as they are loaded (fp16 through the ISA's half conversion, so
// fp16 keeps fp32 arithmetic and its accuracy; bf16 by a shift) and multiplied with fp32 FMAs;
// with Pairs (AVX-512 only, cpu::avx512::Bf16Pairs) bf16 inputs are multiplied as bf16 pairs
// with vdpbf16ps (fp32 accumulation).
//
// Scores are kept transposed, St[key][query row]: the query block is transposed once per work
// unit and key/value blocks are used as stored, so no block is transposed inside the key loop,
// and the softmax statistics of V::kLanes rows sit in one vector. Every block takes the vector
// path (the sparse mode's band evaluated per lane; pse, explicit mask and dropout through
// cpu/simd/fa_bias_steps.hpp with the row steps' bits), except a partly masked block whose
// values are not all finite and, with bf16 pairs, blocks with pse, explicit mask or dropout;
// those take the row steps shared with the tiled kernel, which skip masked keys exactly as the
// reference does.
//
// A work unit holds the query heads of one kv head (a GQA group). They run in passes of
// TileShape::headsPerPass heads over the key blocks: each key and value block is copied or
// converted (K rows, V column strips, or bf16 pairs) once per pass and serves every head of it,
// instead of once per head. Each head keeps its own query block and running state (HeadState),
// and its blocks go through the same steps in the same order as with one head per pass, so the
// bytes do not depend on the number of heads per pass.
//
// The unit loop (runUnitWith) is the one of FlashAttentionScore's forward and of
// FusedInferAttentionScore's prefill route (cpu/simd/fia_prefill.hpp); the steps where the two
// operators differ (the probabilities' rounding before P.V, the row updates of the row steps, the
// end of a row) come from a Steps object (FaSteps here).
//
// Order of every reduction, fixed per element: Q.K over the head dim ascending (in pairs with
// vdpbf16ps), the row max and sum over keys ascending (per lane), P.V over keys ascending.
#pragma once

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "cpu/generic/score_row.hpp"
#include "cpu/simd/fa_bias_steps.hpp"
#include "cpu/simd/microkernels.hpp"
#include "ops/flash_attention_score/kernel.hpp"
#include "ops/flash_attention_score/semantics.hpp"

namespace attnops::fa::simd_forward {

namespace simd = cpu::simd;
using simd::alignUp;
using tile::kNegInf;

// One query head's state in a work unit: its query block and its running softmax and output.
struct HeadState {
    float* qt;     // [d][queryRows]   the query block transposed
    float* acc;    // [queryRows][dv]
    float* m;      // [queryRows] running max
    float* l;      // [queryRows] running sum
    uint32_t* qp;  // [dPairs][queryRows]  bf16 pairs: the query block, column pairs, transposed

    static int64_t floats(const ForwardParams& p, TileShape t) {
        const int64_t qr = t.queryRows, dPairs = (p.d + 1) / 2;
        return alignUp(p.d * qr) + alignUp(qr * p.dv) + 2 * alignUp(qr) + alignUp(dPairs * qr);
    }
};

struct Scratch {
    float* k;       // [keyRows][d]
    float* v;       // [keyRows][dv]
    float* st;      // [keyRows][queryRows] scores, then probabilities
    float* s;       // [max(keyRows, d, dv)] one row of scores (row steps), one loaded row (transposes), an output row
    uint8_t* kept;  // [keyRows]
    uint8_t* keep;  // [keyRows]
    // bf16 pairs (entries with Pairs), dPairs = ceil(d / 2), keyPairs = keyRows / 2:
    uint32_t* kp;  // [keyRows][dPairs]    the key block, column pairs
    uint32_t* vp;  // [keyPairs][dv]       the value block, row pairs
    uint32_t* pp;  // [keyPairs][queryRows] probabilities, row pairs of st
    float* vs;     // [keyRows][dv] the value block in column strips (simd::loadRowsStrips)
    float* heads;  // t.headsPerPass x t.blocksPerUnit HeadStates of HeadState::floats each
    int64_t headFloats;

    // The key and value blocks and their products, shared by the heads of a pass.
    static int64_t sharedFloats(const ForwardParams& p, TileShape t) {
        const int64_t qr = t.queryRows, kr = t.keyRows, dPairs = (p.d + 1) / 2;
        return alignUp(kr * p.d) + alignUp(kr * p.dv) + alignUp(kr * qr) + alignUp(std::max({kr, p.d, p.dv})) +
               2 * alignUp(kr) + alignUp(kr * dPairs) + alignUp(kr / 2 * p.dv) + alignUp(kr / 2 * qr) +
               alignUp(kr * stripCols(p.dv));
    }
    static int64_t floats(const ForwardParams& p, TileShape t) {
        return sharedFloats(p, t) +
               std::max<int64_t>(1, t.headsPerPass) * std::max<int64_t>(1, t.blocksPerUnit) * HeadState::floats(p, t);
    }

    // dv rounded up to whole column strips of any ISA (64 columns: a multiple of every
    // simd::stripWidth, so one layout of the scratch serves every instantiation).
    static int64_t stripCols(int64_t dv) {
        constexpr int64_t kWidest = 64;
        return (dv + kWidest - 1) / kWidest * kWidest;
    }

    Scratch(const ForwardParams& p, TileShape t, void* base) : headFloats(HeadState::floats(p, t)) {
        const int64_t qr = t.queryRows, kr = t.keyRows;
        float* f = static_cast<float*>(base);
        auto take = [&](int64_t n) {
            float* r = f;
            f += alignUp(n);
            return r;
        };
        k = take(kr * p.d);
        v = take(kr * p.dv);
        st = take(kr * qr);
        s = take(std::max({kr, p.d, p.dv}));
        kept = reinterpret_cast<uint8_t*>(take(kr));
        keep = reinterpret_cast<uint8_t*>(take(kr));
        const int64_t dPairs = (p.d + 1) / 2;
        kp = reinterpret_cast<uint32_t*>(take(kr * dPairs));
        vp = reinterpret_cast<uint32_t*>(take(kr / 2 * p.dv));
        pp = reinterpret_cast<uint32_t*>(take(kr / 2 * qr));
        vs = take(kr * stripCols(p.dv));
        heads = f;
    }

    HeadState head(const ForwardParams& p, TileShape t, int64_t h) const {
        float* f = heads + h * headFloats;
        const int64_t qr = t.queryRows;
        HeadState hs;  // the layout of HeadState::floats
        hs.qt = f;
        f += alignUp(p.d * qr);
        hs.acc = f;
        f += alignUp(qr * p.dv);
        hs.m = f;
        f += alignUp(qr);
        hs.l = f;
        f += alignUp(qr);
        hs.qp = reinterpret_cast<uint32_t*>(f);
        return hs;
    }
};

// Query blocks (a query head's rows of one query block) whose state the per-core L2 holds beside
// the blocks a pass shares (the fp32 path's key rows, value strips and scores; the bf16 pairs' are
// smaller), at least 1.
inline int64_t statesInL2(const ForwardParams& p, TileShape t, uint64_t l2Bytes) {
    const uint64_t l2 = l2Bytes != 0 ? l2Bytes : uint64_t(1) << 20;
    const int64_t qr = t.queryRows, kr = t.keyRows;
    const uint64_t shared = uint64_t(kr * (p.d + Scratch::stripCols(p.dv) + qr)) * sizeof(float);
    const uint64_t perState = uint64_t(p.d * qr + qr * p.dv + 2 * qr) * sizeof(float);
    if (l2 < shared + 2 * perState) return 1;
    return std::max<int64_t>(1, int64_t((l2 - shared) / perState));
}

// Query heads of a GQA group per pass over the key blocks (TileShape::headsPerPass): every packed
// key and value block (the K copy and the V strips, or bf16 pairs) then serves that many heads
// instead of one. As many as the L2 holds (statesInL2), at most the group; p.headsPerPass
// (ATTNOPS_FA_HEADS_PER_PASS) overrides.
inline int64_t headsPerPass(const ForwardParams& p, TileShape t, uint64_t l2Bytes) {
    const int64_t group = std::max<int64_t>(1, p.group);
    if (p.headsPerPass > 0) return std::min(p.headsPerPass, group);
    return std::clamp<int64_t>(statesInL2(p, t, l2Bytes), 1, group);
}

// Query blocks per work unit (TileShape::blocksPerUnit), which go through a pass together when
// their key blocks line up (runUnitWith): where the L2 holds states for more than the heads of a
// pass (MHA and small groups), each packed block then serves up to kMaxBlocksPerUnit query blocks
// of a head. Every unit reads its head's keys and values once from L3 or DRAM as it packs them: a
// 120 x 128 fp32 block spent about 7% of its time copying K and packing V (AMD EPYC Zen 3,
// bench/results/amd-epyc-zen3-avx2/fwd-s11-block-parts-under-load.txt), and its 512 KiB L2 holds
// two states. An Intel Xeon's 2 MiB L2 holds 28 (AVX-512, 64 rows, D 128): 8 blocks per unit
// against 2 took 0.89-0.91x the time of the fp32 forward of BNSD S=4096 D=128, 0.82-0.85x causal,
// 0.92-0.93x at D=64 and 0.94x at D=256, GQA 32/8 and TND 32K unchanged (2 threads, two interleaved
// rounds), and 16 gained nothing over 8 (bench/results/intel-xeon-amx/NOTES.md, eighth session).
// A pass keeps at most kMaxStatesPerPass states (heads x blocks): GQA 32/8 with 4 heads per pass
// ran as fast with 2 or 4 blocks per unit and 0.98-1.05x the time of 2 with 8 (32 states, all of the
// L2). p.blocksPerUnit (ATTNOPS_FA_BLOCKS_PER_UNIT) overrides; the plan takes fewer where units
// would be too few for the threads (fa::fitUnitsToThreads).
constexpr int64_t kMaxBlocksPerUnit = 8;
constexpr int64_t kMaxStatesPerPass = 16;
constexpr int64_t kMaxForcedBlocksPerUnit = 16;

inline int64_t blocksPerUnit(const ForwardParams& p, TileShape t, uint64_t l2Bytes) {
    if (p.blocksPerUnit > 0) return std::min(p.blocksPerUnit, kMaxForcedBlocksPerUnit);
    const int64_t states = std::min(statesInL2(p, t, l2Bytes), kMaxStatesPerPass);
    return std::clamp<int64_t>(states / std::max<int64_t>(1, t.headsPerPass), 1, kMaxBlocksPerUnit);
}

// V::kQueryRows query rows (a whole number of softmax vectors); keys by the per-core L2.
template <class V>
TileShape chooseTile(const ForwardParams& p, const PlatformInfo& info) {
    TileShape t;
    t.queryRows = V::kQueryRows;
    t.keyRows = simd::keyBlockRows(p.d, p.dv, info.l2Bytes);
    t.headsPerPass = headsPerPass(p, t, info.l2Bytes);
    t.blocksPerUnit = blocksPerUnit(p, t, info.l2Bytes);
    return t;
}

inline uint64_t scratchBytes(const ForwardParams& p, TileShape t) {
    return uint64_t(Scratch::floats(p, t)) * sizeof(float);
}

constexpr float kMaxFinite = 3.40282347e38f;

// simd::exp for x <= 0 or NaN without its NaN pass-through and overflow clamp: the same bits for
// every x <= 0, and 0 for NaN (x > -87.3 is false for NaN; the lanes computed from it are then
// discarded). The dropped compare, blend and min issue on the FMA pipes on Zen 3, beside the
// GEMMs' FMAs.
//
// Where the trait has pow2OfShifted (AVX2), n = round(x log2(e)) comes from adding and
// subtracting 1.5 * 2^23 (the same n, ties to even, for |x log2(e)| < 2^22, which covers every
// live lane) and 2^n from t's bits: two additions instead of a round and a convert.
template <class V>
ATTNOPS_SIMD_INLINE typename V::Vec expNonPositive(typename V::Vec x) {
    const auto live = V::greater(x, V::set1(-87.3f));
    if constexpr (requires(typename V::Vec t) { V::pow2OfShifted(t); }) {
        const auto shifter = V::set1(12582912.0f);  // 1.5 * 2^23
        const auto t = V::add(V::mul(x, V::set1(1.44269504088896341f)), shifter);
        const auto n = V::sub(t, shifter);
        return V::zeroUnless(live, V::mul(simd::expPolynomial<V>(x, n), V::pow2OfShifted(t)));
    } else {
        return V::zeroUnless(live, simd::expReduced<V>(x));
    }
}

// expNonPositive of kExpChains vectors x[0..kExpChains), on traits with pow2OfShifted (AVX2),
// each operation issued for every vector before the next: per lane the operations of
// expNonPositive (simd::expPolynomial's coefficients in its order), so the same bits. The exp is
// a chain of about 14 dependent operations; written one after another (as GCC emits a loop body
// of single exps), the scheduler's window held about one chain's next operation at a time, and
// the exp pass ran at about twice its FMA-pipe bound. Stage-interleaved, four chains are ready at
// every step: on Zen 3 the softmax of a 120 x 128 block took 14% less time, score GEMM + softmax
// 1.4-1.9% and the 1-thread forward 0.5-2.7% (bench/results/amd-epyc-zen3-avx2/
// fwd-s9-exp-overlap-under-load.txt). Four chains keep their state (live, t, r, poly) in the 16
// registers; eight spilled and were slower. (Placing the exps among the score GEMM's register
// tiles instead was slower: the exp is FMA-pipe work, and the GEMM keeps those pipes busy.)
constexpr int kExpChains = 4;

template <class V>
ATTNOPS_SIMD_INLINE void expNonPositiveInterleaved(typename V::Vec* x) {
    constexpr int G = kExpChains;
    typename V::Mask live[G];
    typename V::Vec t[G], r[G], poly[G];
    const auto shifter = V::set1(12582912.0f);  // 1.5 * 2^23, as in expNonPositive
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) live[g] = V::greater(x[g], V::set1(-87.3f));
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) t[g] = V::add(V::mul(x[g], V::set1(1.44269504088896341f)), shifter);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) r[g] = V::fnmadd(V::sub(t[g], shifter), V::set1(0.693359375f), x[g]);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) r[g] = V::fnmadd(V::sub(t[g], shifter), V::set1(-2.12194440e-4f), r[g]);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) poly[g] = V::fmadd(V::set1(1.0f / 5040.0f), r[g], V::set1(1.0f / 720.0f));
    constexpr float kCoefficients[] = {1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f};
#pragma GCC unroll 6
    for (int i = 0; i < 6; ++i)
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) poly[g] = V::fmadd(poly[g], r[g], V::set1(kCoefficients[i]));
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) x[g] = V::zeroUnless(live[g], V::mul(poly[g], V::pow2OfShifted(t[g])));
}

// Keys of the block [k0, k0 + nk) that some query row of [i0, i1) may keep (the hull of their
// bands and the prefix), block-relative: [lo, hi), empty when lo = hi.
inline KeyRange blockKeys(const SeqRule& rule, int64_t i0, int64_t i1, int64_t k0, int64_t nk, int64_t skv) {
    const KeyRange r = keyRange(rule, i0, i1, skv);
    const int64_t lo = std::clamp<int64_t>(r.lo - k0, 0, nk), hi = std::clamp<int64_t>(r.hi - k0, 0, nk);
    return {lo, std::max(lo, hi)};
}

// The online-softmax update of query rows [r0, r0 + V::kLanes) of a block whose scores in st are
// scaled (and masked) already, given their maximum over the block's keys and the lanes that met
// a NaN: turns the scores into probabilities, updates m and l, and rescales the accumulator rows.
// Keys outside `keys` are masked for every lane: their probability is 0 without an exp (the exp of
// -inf - m is +0 on both paths below, and adding +0 to the sum, which starts at +0, changes no bit).
template <class V>
ATTNOPS_SIMD_INLINE void softmaxUpdate(const ForwardParams& p, int64_t r0, int64_t rows, int64_t nk, KeyRange keys,
                                       int64_t ld, float* st, float* m, float* l, float* acc, typename V::Vec blockMax,
                                       typename V::Mask nan) {
    const auto negInf = V::set1(kNegInf);
    blockMax = V::select(nan, blockMax, V::set1(__builtin_nanf("")));
    const auto mOld = V::load(m + r0);
    const auto takeNew = V::maskOr(V::greater(blockMax, mOld), V::isNan(blockMax));
    const auto mNew = V::select(takeNew, mOld, blockMax);
    // alpha = 0 while nothing was accumulated (mOld = -inf), so -inf - -inf never reaches exp.
    const auto started = V::notEqual(mOld, negInf);
    const auto alpha = V::zeroUnless(started, simd::exp<V>(V::sub(mOld, mNew)));
    const auto live = V::notEqual(mNew, negInf);
    auto sum = V::zero();
    for (int64_t j = 0; j < keys.lo; ++j) V::store(st + j * ld + r0, V::zero());
    for (int64_t j = keys.hi; j < nk; ++j) V::store(st + j * ld + r0, V::zero());
    if (!V::any(nan) && !V::any(V::maskOr(V::isNan(mNew), V::greater(mNew, V::set1(kMaxFinite))))) {
        // No NaN score and no NaN or +inf maximum: x - mNew <= 0 (mNew is at least every x of
        // the block) except where x = mNew = -inf (dead rows): NaN there, and expNonPositive
        // gives 0 for it and for x = -inf, as the masks below do; every other lane is the same
        // exp. Same bits, fewer operations.
        int64_t j = keys.lo;
        if constexpr (requires(typename V::Vec t) { V::pow2OfShifted(t); }) {
            // kExpChains keys at a time, their exps stage-interleaved; l still summed key by key.
            for (; j + kExpChains <= keys.hi; j += kExpChains) {
                typename V::Vec e[kExpChains];
#pragma GCC unroll 4
                for (int g = 0; g < kExpChains; ++g) e[g] = V::sub(V::load(st + (j + g) * ld + r0), mNew);
                expNonPositiveInterleaved<V>(e);
#pragma GCC unroll 4
                for (int g = 0; g < kExpChains; ++g) {
                    V::store(st + (j + g) * ld + r0, e[g]);
                    sum = V::add(sum, e[g]);
                }
            }
        }
        for (; j < keys.hi; ++j) {
            const auto e = expNonPositive<V>(V::sub(V::load(st + j * ld + r0), mNew));
            V::store(st + j * ld + r0, e);
            sum = V::add(sum, e);
        }
    } else {
        for (int64_t j = keys.lo; j < keys.hi; ++j) {
            const auto x = V::load(st + j * ld + r0);
            const auto kept = V::maskAnd(live, V::notEqual(x, negInf));
            const auto e = V::zeroUnless(kept, simd::exp<V>(V::sub(x, mNew)));
            V::store(st + j * ld + r0, e);
            sum = V::add(sum, e);
        }
    }
    V::store(l + r0, V::fmadd(V::load(l + r0), alpha, sum));
    V::store(m + r0, mNew);
    alignas(64) float alphas[V::kLanes];
    V::store(alphas, alpha);
    // Rows whose maximum did not move keep their accumulator (times 1: the same bits).
    for (int64_t r = r0; r < std::min(rows, r0 + V::kLanes); ++r)
        if (alphas[r - r0] != 1.0f) simd::scaleRowUnmasked<V>(p.dv, alphas[r - r0], acc + r * p.dv);
}

// A partly masked block's band as softmaxBlock takes it: the per-lane test, and the rule that
// bounds the keys a vector of rows may keep (the hull of their bands, blockKeys).
template <class V>
struct SoftmaxBand {
    const simd::BandLanes<V>& lanes;
    const SeqRule& rule;
    int64_t skv;
};

// Online softmax of a block for rows [0, rows), V::kLanes rows per vector: scales the scores in
// st, then softmaxUpdate. With a band, pairs it masks get score -inf and probability 0 (query
// rows from row0, keys from key0); keys outside the hull of a vector's rows are not read at all
// (probability 0 stored): max(m, -inf) = m and the NaN test of -inf is false, so skipping them
// changes no maximum, and softmaxUpdate stores their 0 without the exp. On the causal diagonal
// that is about half of the block's softmax.
template <class V>
ATTNOPS_SIMD_INLINE void softmaxBlock(const ForwardParams& p, int64_t rows, int64_t nk, int64_t ld, float* st, float* m,
                                      float* l, float* acc, const SoftmaxBand<V>* band, int64_t row0, int64_t key0) {
    const auto scale = V::set1(p.scale), negInf = V::set1(kNegInf);
    for (int64_t r0 = 0; r0 < rows; r0 += V::kLanes) {
        const KeyRange keys =
            band == nullptr
                ? KeyRange{0, nk}
                : blockKeys(band->rule, row0 + r0, row0 + std::min(rows, r0 + V::kLanes), key0, nk, band->skv);
        auto blockMax = negInf;
        auto nan = V::none();
        for (int64_t j = keys.lo; j < keys.hi; ++j) {
            auto x = V::mul(V::load(st + j * ld + r0), scale);
            if (band != nullptr) x = V::select(simd::keptRows<V>(band->lanes, key0 + j, row0 + r0), negInf, x);
            V::store(st + j * ld + r0, x);
            nan = V::maskOr(nan, V::isNan(x));
            blockMax = V::max(blockMax, x);
        }
        softmaxUpdate<V>(p, r0, rows, nk, keys, ld, st, m, l, acc, blockMax, nan);
    }
}

// softmaxBlock without a band for scores that simd::gemmScoresScaledMax scaled already, with the
// column statistics it gathered: the same values, one pass over st fewer.
template <class V>
ATTNOPS_SIMD_INLINE void softmaxBlockScaled(const ForwardParams& p, int64_t rows, int64_t nk, int64_t ld, float* st,
                                            float* m, float* l, float* acc, const simd::ColumnStats<V>& stats) {
    for (int64_t r0 = 0; r0 < rows; r0 += V::kLanes)
        softmaxUpdate<V>(p, r0, rows, nk, KeyRange{0, nk}, ld, st, m, l, acc, V::load(stats.max + r0),
                         stats.nan[r0 / V::kLanes]);
}

// tile::storeRow's result (out = acc / l, 0 where no key was kept; the statistics) for unit-stride
// fp32 and bf16 outputs without a sink: the row scaled a vector at a time into `tmp` (the same
// product acc * (1 / l)) and rounded to bf16 by a branch-free loop the compiler vectorises (the
// rule of floatToBf16: quiet NaN, else round to nearest even). The scalar per-element store took
// about a tenth of a causal S = 1024 forward's instructions. Everything else: tile::storeRow.
template <class V>
ATTNOPS_SIMD_INLINE void storeOutputRow(const ForwardParams& p, const WorkUnit& u, int64_t n1, int64_t i, float m,
                                        float l, float* acc, float* __restrict tmp) {
    const DType dt = p.out.dtype;
    // Dv = 0: an empty output whose data may be null (no pointer arithmetic on it).
    if (p.dv == 0 || p.sink != nullptr || p.out.stride[3] != 1 || (dt != DType::F32 && dt != DType::BF16))
        return tile::storeRow(p, u, n1, i, m, l, acc);
    const int64_t row = p.seq.qStart[size_t(u.b)] + i, dv = p.dv;
    const int64_t at = p.out.offset(u.b, n1, row, 0);
    float* dst32 = dt == DType::F32 ? static_cast<float*>(p.out.data) + at : tmp;
    if (l != 0.0f) {  // l == 0: no key kept; NaN propagates
        const float inv = 1.0f / l;
        const auto invV = V::set1(inv);
        int64_t c = 0;
        for (; c + V::kLanes <= dv; c += V::kLanes) V::store(dst32 + c, V::mul(V::load(acc + c), invV));
        for (; c < dv; ++c) dst32[c] = acc[c] * inv;
    } else {
        std::fill(dst32, dst32 + dv, 0.0f);
    }
    if (dt == DType::BF16) {
        uint16_t* dst = static_cast<uint16_t*>(p.out.data) + at;
        for (int64_t c = 0; c < dv; ++c) {
            uint32_t bits;
            std::memcpy(&bits, &tmp[c], sizeof bits);
            const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
            const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
            dst[c] = uint16_t(nan ? (bits >> 16) | 0x40u : rounded);
        }
    }
    if (p.writeStats)
        for (int64_t lane = 0; lane < p.statLanes; ++lane) {
            p.softmaxMax.store(u.b, n1, row, lane, m);
            p.softmaxSum.store(u.b, n1, row, lane, l);
        }
}

// Whether the first nk keys of the value block (fp32 column strips vs of stripRows rows each,
// zero-padded, or bf16 row pairs vp) are finite.
template <class V, class Pairs>
ATTNOPS_SIMD_INLINE bool valuesFinite(const float* vs, const uint32_t* vp, int64_t nk, int64_t stripRows, int64_t dv) {
    constexpr int64_t W = simd::stripWidth<V>();
    if constexpr (std::is_void_v<Pairs>) {
        for (int64_t c0 = 0; c0 < dv; c0 += W)
            if (!simd::allFinite<V>(vs + (c0 / W) * stripRows * W, nk, W, W)) return false;
        return true;
    } else {
        return Pairs::finite(vp, nk, dv);
    }
}

// St = K . Q^T (fp32, rows of K at k with leading dimension d) for a partly masked block on the
// band path: a register tile whose keys no query row of its column strip keeps is not computed
// but zeroed (softmaxBlock's band gives their keys probability 0 before P.V reads them), so a
// block on the causal diagonal costs about half a block. The other scores are gemmScores' values.
// False (nothing done) when the block is not made of whole tiles; the caller then runs gemmScores.
template <class V>
ATTNOPS_SIMD_FN static bool bandScores(const SeqRule& rule, int64_t skv, int64_t q0, int64_t k0, int64_t nk,
                                       int64_t rows, int64_t d, const float* k, const float* qt, int64_t qr,
                                       float* st) {
    constexpr int MR = simd::ScoreTile<V>::kRows, NV = simd::ScoreTile<V>::kVectors;
    constexpr int64_t L = V::kLanes, W = NV * L;
    if (nk % MR != 0 || rows % W != 0) return false;
    for (int64_t n0 = 0; n0 < rows; n0 += W) {
        const KeyRange kept = blockKeys(rule, q0 + n0, q0 + n0 + W, k0, nk, skv);
        const int64_t lo = kept.lo / MR * MR, hi = (kept.hi + MR - 1) / MR * MR;
        for (int64_t m = 0; m < nk; ++m)
            if (m < lo || m >= hi)
                for (int64_t c = 0; c < W; c += L) V::store(st + m * qr + n0 + c, V::zero());
        for (int64_t m0 = lo; m0 < hi; m0 += MR)
            simd::gemmTile<V, simd::F32Dot<V>, MR, NV, false, false>(d, k + m0 * d, d, qt + n0, qr, st + m0 * qr + n0,
                                                                     qr, V::all(), false);
    }
    return true;
}

// acc[rows x dv] += P . V (P = pt[key][row], V in column strips of stripRows rows as loadRowsStrips packs it) for a
// partly masked block on the band path: each register tile of query rows runs over the keys some
// row of it keeps, no further. The keys skipped have probability 0 for every row of the tile and
// finite values (the band path requires it), so each would add +-0 to the accumulator, which
// changes nothing (the sum is never -0 unless the rescale underflowed it to -0; then the skipped
// terms would have made it +0, and skipping keeps the reference's -0: it skips masked keys too).
template <class V>
ATTNOPS_SIMD_FN static void bandValues(const SeqRule& rule, int64_t skv, int64_t q0, int64_t k0, int64_t nk,
                                       int64_t rows, int64_t dv, const float* pt, int64_t qr, const float* vs,
                                       int64_t stripRows, float* acc) {
    constexpr int64_t W = simd::stripWidth<V>(), L = V::kLanes;
    constexpr int MR = V::kTileRows;
    using Dot = simd::F32Dot<V>;
    for (int64_t c0 = 0; c0 < dv; c0 += W) {
        const int64_t cols = std::min(W, dv - c0);
        const int nv = int((cols + L - 1) / L);
        const typename V::Mask last = V::tail(cols - (nv - 1) * L);
        const float* strip = vs + (c0 / W) * stripRows * W;
        for (int64_t m0 = 0; m0 < rows; m0 += MR) {
            const int mr = int(std::min<int64_t>(MR, rows - m0));
            const KeyRange kept = blockKeys(rule, q0 + m0, q0 + m0 + mr, k0, nk, skv);
            if (kept.hi == kept.lo) continue;
            const float* a = pt + kept.lo * qr + m0;
            const float* b = strip + kept.lo * W;
            float* c = acc + m0 * dv + c0;
            if (cols != nv * L)
                simd::gemmRows<V, Dot, true, true>(mr, nv, kept.hi - kept.lo, a, qr, b, W, c, dv, last, true);
            else
                simd::gemmRows<V, Dot, true, false>(mr, nv, kept.hi - kept.lo, a, qr, b, W, c, dv, last, true);
        }
    }
}

// bandScores and bandValues on bf16 pairs: St = K . Q^T from the key column pairs kp ([key][dPairs])
// and the transposed query column pairs qp, each strip of query rows the GEMM's columns hold over
// the keys some row of it keeps (the others stored as 0); acc += P . V from the probability row
// pairs pp ([keyPair][row]) and the value row pairs vp ([keyPair][dv]), each register tile of
// query rows over the key pairs holding a key some row of it keeps. A pair skipped is two zero
// products with finite values: the same bits, as in bandValues.
template <class V, class Pairs>
ATTNOPS_SIMD_FN static void bandPairScores(const SeqRule& rule, int64_t skv, int64_t q0, int64_t k0, int64_t nk,
                                           int64_t rows, int64_t dPairs, const uint32_t* kp, const uint32_t* qp,
                                           int64_t qr, float* st) {
    constexpr int64_t W = simd::stripWidth<V>();
    for (int64_t n0 = 0; n0 < rows; n0 += W) {
        const int64_t cols = std::min(W, rows - n0);
        const KeyRange kept = blockKeys(rule, q0 + n0, q0 + n0 + cols, k0, nk, skv);
        for (int64_t m = 0; m < nk; ++m)
            if (m < kept.lo || m >= kept.hi) std::fill(st + m * qr + n0, st + m * qr + n0 + cols, 0.0f);
        if (kept.hi > kept.lo)
            simd::gemm<V, false, typename Pairs::Dot>(kept.hi - kept.lo, cols, dPairs, kp + kept.lo * dPairs, dPairs,
                                                      qp + n0, qr, st + kept.lo * qr + n0, qr, false);
    }
}

template <class V, class Pairs>
ATTNOPS_SIMD_FN static void bandPairValues(const SeqRule& rule, int64_t skv, int64_t q0, int64_t k0, int64_t nk,
                                           int64_t rows, int64_t dv, const uint32_t* pp, int64_t qr,
                                           const uint32_t* vp, float* acc) {
    constexpr int64_t MR = V::kTileRows;
    for (int64_t m0 = 0; m0 < rows; m0 += MR) {
        const int64_t mr = std::min<int64_t>(MR, rows - m0);
        const KeyRange kept = blockKeys(rule, q0 + m0, q0 + m0 + mr, k0, nk, skv);
        if (kept.hi == kept.lo) continue;
        const int64_t p0 = kept.lo / 2, pairs = (kept.hi + 1) / 2 - p0;
        simd::gemm<V, true, typename Pairs::Dot>(mr, dv, pairs, pp + p0 * qr + m0, qr, vp + p0 * dv, dv,
                                                 acc + m0 * dv, dv, true);
    }
}

// The steps where the users of the unit loop (runUnitWith below) differ, as members of a Steps
// object the loop is instantiated with (always inlined, so they cost what the code written in
// place would):
//   roundProbabilities(rows, nk, ld, st): the vector path's probabilities of rows [0, rows) of a
//     block (st[key][row], leading dimension ld), after they joined the sum l and before P.V;
//   accumulateRow(n1, i, k0, nk, rowMax, s, kept, keep, v, m, l, acc): the row steps' update of
//     row i of query head n1 with a block of finished scores (tile::accumulateRow's contract);
//   storeRow(g, r, m, l, acc, tmp): the end of row q0 + r of query head g of the group
//     (acc clobbered; tmp: a scratch row of max(keyRows, d, dv) floats).
// FaSteps is FlashAttentionScore's; FusedInferAttentionScore's prefill route has its own
// (cpu/simd/fia_prefill.hpp: probabilities rounded to the query dtype, FIA's end of row).

// FlashAttentionScore: P multiplies V as the softmax leaves it (dropout in the row steps); rows
// end with the output and the softmax statistics.
template <class V>
struct FaSteps {
    const ForwardParams& p;
    const WorkUnit& u;

    ATTNOPS_SIMD_STEP void roundProbabilities(int64_t, int64_t, int64_t, float*) const {}
    ATTNOPS_SIMD_STEP void accumulateRow(int64_t n1, int64_t i, int64_t k0, int64_t nk, float rowMax,
                                         float* __restrict s, const uint8_t* kept, uint8_t* keep,
                                         const float* __restrict v, float& m, float& l, float* __restrict acc) const {
        tile::accumulateRow(p, u, n1, i, k0, nk, rowMax, s, kept, keep, v, m, l, acc);
    }
    ATTNOPS_SIMD_STEP void storeRow(int64_t g, int64_t r, float m, float l, float* acc, float* tmp) const {
        storeOutputRow<V>(p, u, u.n2 * p.group + g, u.q0 + r, m, l, acc, tmp);
    }
};

// The key range of a pass over query blocks [b0, b0 + nb) of a unit (blocks of qr rows from u.q0):
// the blocks' common first key and their last, empty when every block is empty. Blocks share a
// pass only when their key blocks line up (sharePass), so each block's key blocks are the pass's,
// the last one cut short at the block's own end: the same blocks as in a pass of its own.
// Query block j of a unit (qr rows from u.q0): its rows [q0, q1) and the keys they may see.
struct QueryBlock {
    int64_t q0, q1;
    KeyRange keys;
    bool empty() const { return keys.lo >= keys.hi; }
};

inline QueryBlock queryBlock(const SeqRule& rule, const WorkUnit& u, int64_t qr, int64_t j, int64_t skv) {
    const int64_t q0 = u.q0 + j * qr, q1 = std::min(u.q1, q0 + qr);
    return {q0, q1, keyRange(rule, q0, q1, skv)};
}

inline KeyRange passKeys(const SeqRule& rule, const WorkUnit& u, int64_t qr, int64_t b0, int64_t nb, int64_t skv) {
    KeyRange r{0, 0};
    for (int64_t j = b0; j < b0 + nb; ++j) {
        const QueryBlock b = queryBlock(rule, u, qr, j, skv);
        if (b.empty()) continue;
        r = r.lo < r.hi ? KeyRange{r.lo, std::max(r.hi, b.keys.hi)} : b.keys;
    }
    return r;
}

// Whether the unit's query blocks can go through one pass: every non-empty one starts at the same
// key (causal and unmasked rows; not the band's sliding starts). With bf16 pairs a block cut short
// at an odd key count before the pass's end would read the next key's value beside its zero
// probability (0 * inf is NaN where a pass of its own reads a zero), so such units run block by
// block too.
inline bool sharePass(const SeqRule& rule, const WorkUnit& u, int64_t qr, int64_t skv, bool pairs) {
    const int64_t blocks = (u.q1 - u.q0 + qr - 1) / qr;
    if (blocks < 2) return false;
    const KeyRange all = passKeys(rule, u, qr, 0, blocks, skv);
    for (int64_t j = 0; j < blocks; ++j) {
        const KeyRange k = queryBlock(rule, u, qr, j, skv).keys;
        if (k.lo >= k.hi) continue;
        if (k.lo != all.lo || (pairs && k.hi != all.hi && (k.hi - k.lo) % 2 != 0)) return false;
    }
    return true;
}

// The unit loop: rows [u.q0, u.q1) of the query heads of kv head u.n2 against every key they
// may see, keys and values read from kView / vView (b, kv head, row, dim; rows from
// p.seq.kvStart), the differing steps from `steps`. Pairs = void: everything converted to fp32
// and multiplied with fp32 FMAs. Otherwise bf16 inputs multiplied as bf16 pairs (Q.K^T exact
// products, P rounded to bf16 for P.V like the naive low-precision computation of the tolerance
// rule).
//
// A pass takes t.headsPerPass heads and, where sharePass allows, every query block of the unit
// (else one block at a time); each (head, block) keeps its HeadState, and each key block of the
// pass is packed once for all of them.
template <class V, class Pairs, class Steps>
ATTNOPS_SIMD_FN void runUnitWith(const ForwardParams& p, const View4& kView, const View4& vView, TileShape t,
                                 const WorkUnit& u, void* scratch, const Steps& steps) {
    constexpr bool kPairs = !std::is_void_v<Pairs>;
    Scratch sc(p, t, scratch);
    const int64_t sq = p.seq.qLen[size_t(u.b)], skv = p.seq.kvLen[size_t(u.b)];
    const SeqRule rule = seqRule(p.mask, u.b, sq, skv);
    const int64_t qr = t.queryRows, d = p.d, dv = p.dv, dPairs = (d + 1) / 2;
    const bool vectorSoftmax = p.pse.form == PseForm::None && !p.mask.explicitMask && !p.dropout.enabled;
    // pse, explicit mask or dropout: blocks take the vector steps of cpu/simd/fa_bias_steps.hpp
    // (the row steps' bits) where the values are finite or nothing is masked. Not with bf16 pairs:
    // their P.V rounds P to bf16, the row steps do not.
    const bool biasVector = !kPairs && simd_bias::usable<V>(p, t.keyRows, sq, skv);
    // Without those, a fully kept block whose query rows are whole register tiles has its scores
    // scaled and reduced to their column maxima in the score GEMM's epilogue
    // (simd::gemmScoresScaledMax).
    constexpr int64_t kScoreTileCols = simd::ScoreTile<V>::kVectors * V::kLanes;
    alignas(64) float colMax[V::kQueryRows];
    typename V::Mask colNan[V::kQueryRows / V::kLanes];
    const simd::ColumnStats<V> stats{colMax, colNan};
    const bool bandVector = simd::BandLanes<V>::usable(sq, skv);
    const simd::BandLanes<V> band = simd::bandLanes<V>(rule, skv);
    const SoftmaxBand<V> softmaxBand{band, rule, skv};
    const int64_t perPass = std::clamp<int64_t>(t.headsPerPass, 1, p.group);
    const int64_t blocks = (u.q1 - u.q0 + qr - 1) / qr;
    const int64_t blocksPerPass = sharePass(rule, u, qr, skv, kPairs) ? blocks : 1;
    for (int64_t g0 = 0; g0 < p.group; g0 += perPass)
        for (int64_t b0 = 0; b0 < blocks; b0 += blocksPerPass) {
            const int64_t heads = std::min(perPass, p.group - g0), nb = std::min(blocksPerPass, blocks - b0);
            // State s = h * nb + j: head g0 + h, query block b0 + j.
            const auto block = [&](int64_t j) { return queryBlock(rule, u, qr, b0 + j, skv); };
            for (int64_t h = 0; h < heads; ++h)
                for (int64_t j = 0; j < nb; ++j) {
                    const HeadState hs = sc.head(p, t, h * nb + j);
                    const QueryBlock qb = block(j);
                    const int64_t n1 = u.n2 * p.group + g0 + h, rows = qb.q1 - qb.q0;
                    const int64_t qRow0 = p.seq.qStart[size_t(u.b)] + qb.q0;
                    if constexpr (kPairs)
                        Pairs::packColumnPairsTransposed(p.q, u.b, n1, qRow0, rows, d, qr, hs.qp);
                    else
                        simd::loadRowsTransposed<V>(p.q, u.b, n1, qRow0, rows, d, qr, sc.s, hs.qt);
                    std::fill(hs.m, hs.m + qr, kNegInf);
                    std::fill(hs.l, hs.l + qr, 0.0f);
                    std::fill(hs.acc, hs.acc + rows * dv, 0.0f);
                }
            const KeyRange keys = passKeys(rule, u, qr, b0, nb, skv);
            for (int64_t k0 = keys.lo; k0 < keys.hi; k0 += t.keyRows) {
                const int64_t packed = std::min(t.keyRows, keys.hi - k0);  // keys of the block packed
                const int64_t kvRow0 = p.seq.kvStart[size_t(u.b)] + k0;
                // The key and value blocks are packed once for the states of the pass.
                // Key rows are copied (fp32) or converted into the scratch even where they are stored
                // as fp32 rows: the score GEMM reads each block once per 24-column strip, and on its
                // first strip it ran at 74-80% of the FMA peak with the keys streamed from L3 where
                // they are stored, against 96% from L2; copying the block first (a sequential read)
                // brought copy + GEMM to 80-86% (Zen 3, bench/results/amd-epyc-zen3-avx2/
                // fwd_components.cpp). Widened bf16 and fp16 keys always took this route.
                const float* kRows = sc.k;
                if constexpr (kPairs) {
                    Pairs::packColumnPairs(kView, u.b, u.n2, kvRow0, packed, d, dPairs, sc.kp);
                    Pairs::packRowPairs(vView, u.b, u.n2, kvRow0, packed, dv, sc.vp);
                } else {
                    simd::loadRowsFast<V>(kView, u.b, u.n2, kvRow0, packed, d, sc.k);
                    simd::loadRowsStrips<V>(vView, u.b, u.n2, kvRow0, packed, dv, sc.vs);
                }
                bool rowValues = false;  // sc.v holds the block's values as fp32 rows (the row steps)
                for (int64_t j = 0; j < nb; ++j) {
                    const QueryBlock qb = block(j);
                    const int64_t q0 = qb.q0, q1 = qb.q1, rows = q1 - q0;
                    if (qb.empty() || k0 >= qb.keys.hi) continue;  // past this block's last key
                    const int64_t nk = std::min(t.keyRows, qb.keys.hi - k0);  // <= packed, a prefix
                    const bool wholeScoreTiles = rows % kScoreTileCols == 0 && rows <= V::kQueryRows;
                    // Partly masked blocks go through the GEMM too when the band is vectorisable and
                    // the values are finite (a masked key's 0 * v must be 0, as if it were skipped).
                    const bool full = blockFullyKept(rule, q0, q1, k0, k0 + nk, skv);
                    for (int64_t h = 0; h < heads; ++h) {
                        const HeadState hs = sc.head(p, t, h * nb + j);
                        const int64_t n1 = u.n2 * p.group + g0 + h;
                        bool banded = false;  // the band path: GEMM tiles outside the band skipped
                        bool scaled = false;  // St scaled and its column statistics in `stats` already
                        if constexpr (kPairs) {
                            banded = !full && vectorSoftmax && bandVector &&
                                     valuesFinite<V, Pairs>(sc.vs, sc.vp, nk, packed, dv);
                            if (banded)
                                bandPairScores<V, Pairs>(rule, skv, q0, k0, nk, rows, dPairs, sc.kp, hs.qp, qr, sc.st);
                            else
                                simd::gemm<V, false, typename Pairs::Dot>(nk, rows, dPairs, sc.kp, dPairs, hs.qp, qr,
                                                                          sc.st, qr, false);
                        } else {
                            scaled = vectorSoftmax && full && wholeScoreTiles;
                            if (scaled) {  // St = scale * K . Q^T, with the softmax's first pass
                                std::fill(colMax, colMax + rows, kNegInf);
                                std::fill(colNan, colNan + rows / V::kLanes, V::none());
                                simd::gemmScoresScaledMax<V>(nk, rows, d, kRows, d, hs.qt, qr, sc.st, qr, p.scale,
                                                             stats);
                            } else {
                                banded = !full && vectorSoftmax && bandVector &&
                                         valuesFinite<V, Pairs>(sc.vs, sc.vp, nk, packed, dv) &&
                                         bandScores<V>(rule, skv, q0, k0, nk, rows, d, kRows, hs.qt, qr, sc.st);
                                if (!banded)
                                    simd::gemmScores<V, false>(nk, rows, d, kRows, d, hs.qt, qr, sc.st, qr);  // St = K . Q^T
                            }
                        }
                        const bool biasBlock = biasVector && ((full && !p.mask.explicitMask) ||
                                                              valuesFinite<V, Pairs>(sc.vs, sc.vp, nk, packed, dv));
                        if (scaled || banded || biasBlock ||
                            (vectorSoftmax &&
                             (full || (bandVector && valuesFinite<V, Pairs>(sc.vs, sc.vp, nk, packed, dv))))) {
                            if (scaled)
                                softmaxBlockScaled<V>(p, rows, nk, qr, sc.st, hs.m, hs.l, hs.acc, stats);
                            else if (biasBlock)  // scale, pse, mask, softmax, dropout (cpu/simd/fa_bias_steps.hpp)
                                simd_bias::softmaxBlock<V>(p, u.b, n1, band, full, q0, rows, k0, nk, qr, sc.st, hs.m,
                                                           hs.l, hs.acc);
                            else
                                softmaxBlock<V>(p, rows, nk, qr, sc.st, hs.m, hs.l, hs.acc,
                                                full ? nullptr : &softmaxBand, q0, k0);
                            steps.roundProbabilities(rows, nk, qr, sc.st);
                            if constexpr (kPairs) {  // acc += P . V
                                Pairs::packFloatRowPairs(sc.st, nk, rows, qr, sc.pp);
                                if (banded)
                                    bandPairValues<V, Pairs>(rule, skv, q0, k0, nk, rows, dv, sc.pp, qr, sc.vp, hs.acc);
                                else
                                    simd::gemm<V, true, typename Pairs::Dot>(rows, dv, (nk + 1) / 2, sc.pp, qr, sc.vp,
                                                                             dv, hs.acc, dv, true);
                            } else if (banded) {
                                bandValues<V>(rule, skv, q0, k0, nk, rows, dv, sc.st, qr, sc.vs, packed, hs.acc);
                            } else {
                                simd::gemmStrips<V, true>(rows, dv, nk, sc.st, qr, sc.vs, hs.acc, dv, true, packed);
                            }
                            continue;
                        }
                        if (!rowValues)  // the row steps read fp32 rows
                            simd::loadRows<V>(vView, u.b, u.n2, kvRow0, packed, dv, dv, sc.v);
                        rowValues = true;
                        for (int64_t r = 0; r < rows; ++r) {
                            const int64_t i = q0 + r;
                            for (int64_t c = 0; c < nk; ++c) sc.s[c] = sc.st[c * qr + r];
                            const float rowMax = tile::finishScores(p, u.b, n1, rule, i, k0, nk, skv, sc.s, sc.kept);
                            if (rowMax == kNegInf) continue;  // nothing kept in this block for this row
                            steps.accumulateRow(n1, i, k0, nk, rowMax, sc.s, sc.kept, sc.keep, sc.v, hs.m[r], hs.l[r],
                                                hs.acc + r * dv);
                        }
                    }
                }
            }
            for (int64_t h = 0; h < heads; ++h)
                for (int64_t j = 0; j < nb; ++j) {
                    const HeadState hs = sc.head(p, t, h * nb + j);
                    const QueryBlock qb = block(j);
                    const int64_t r0 = qb.q0 - u.q0, rows = qb.q1 - qb.q0;
                    for (int64_t r = 0; r < rows; ++r)
                        steps.storeRow(g0 + h, r0 + r, hs.m[r], hs.l[r], hs.acc + r * dv, sc.s);
                }
        }
}

// The FlashAttentionScore forward's work unit.
template <class V, class Pairs>
ATTNOPS_SIMD_FN void runUnit(const ForwardParams& p, TileShape t, const WorkUnit& u, void* scratch) {
    runUnitWith<V, Pairs>(p, p.k, p.v, t, u, scratch, FaSteps<V>{p, u});
}

}  // namespace attnops::fa::simd_forward

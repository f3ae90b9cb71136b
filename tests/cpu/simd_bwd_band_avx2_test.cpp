// The backward's trimming of partly masked blocks (cpu/simd/fa_backward.hpp, AVX2 instantiation):
// BlockBand's key and row ranges against the rule pair by pair (every kept pair inside them), and
// trimmedScoreGemms + rowProbabilities + trimmedGradientGemms bit for bit against the whole-block
// GEMMs they replace (the probabilities, dS, dV, dK and dQ from the same accumulators). Covered:
// causal diagonals at several offsets, bottom-right causal, sliding windows (keys cut on both
// sides), a prefix, an empty band, a short key block, short query blocks and a partial strip of
// the value width. Skipped without AVX2/FMA/F16C.
#include "cpu/avx2/simd_avx2.hpp"
#include "cpu/simd/fa_backward.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.hpp"
#include "cpu/isa.hpp"
#include "avx2_tests.hpp"

namespace {

using attnops::testsupport::hasAvx2;
using attnops::floatToBits;

using attnops::cpu::Avx2;
namespace simd = attnops::cpu::simd;
namespace bwd = attnops::fa::simd_backward;
using attnops::fa::KeyRange;
using attnops::fa::SeqRule;
constexpr int64_t kU = attnops::fa::kUnbounded;

struct Case {
    const char* name;
    SeqRule rule;
    int64_t skv, q0, k0, nk, rows, dv;
};

std::vector<Case> cases() {
    const SeqRule causal{-kU, 0, 0};
    return {
        {"causal, block on the diagonal", causal, 2048, 256, 256, 128, 120, 128},
        {"causal, diagonal starts inside the block", causal, 2048, 120, 128, 128, 120, 128},
        {"causal, diagonal ends inside the block", causal, 2048, 120, 0, 128, 120, 128},
        {"causal, first block, partial value strip", causal, 2048, 0, 0, 128, 120, 40},
        {"causal, short key block", causal, 2000, 1880, 1920, 80, 120, 64},
        {"causal, short query block", causal, 2048, 2040, 1920, 128, 8, 128},
        {"causal bottom-right (Skv - Sq = 300)", SeqRule{-kU, 300, 0}, 2348, 120, 256, 128, 120, 72},
        {"sliding window", SeqRule{-50, 0, 0}, 2048, 240, 200, 128, 120, 128},
        {"band, both sides in the block", SeqRule{-20, 10, 0}, 2048, 360, 300, 128, 120, 24},
        {"band below the diagonal only", SeqRule{-300, -100, 0}, 2048, 360, 128, 128, 120, 128},
        {"prefix with causal", SeqRule{-kU, 0, 40}, 2048, 0, 0, 128, 120, 128},
        {"prefix with a window", SeqRule{-10, 0, 70}, 2048, 200, 0, 128, 120, 64},
        {"empty band", SeqRule{5, 1, 0}, 2048, 0, 0, 128, 120, 128},
    };
}

TEST(BwdBandAvx2, RangesHoldEveryKeptPair) {
    for (const Case& c : cases()) {
        const bwd::BlockBand bb{c.rule, c.skv, c.q0, c.rows, c.k0, c.nk};
        constexpr int64_t B = bwd::kBandRows<Avx2>;
        for (int64_t i = 0; i < c.rows; ++i)
            for (int64_t j = 0; j < c.nk; ++j) {
                if (!c.rule.keeps(c.q0 + i, c.k0 + j)) continue;
                const int64_t m0 = i / B * B, j0 = j / B * B;
                const KeyRange keys = bb.keysOf(m0, std::min(c.rows, m0 + B));
                const KeyRange rows = bb.rowsOf(j0, std::min(c.nk, j0 + B));
                ASSERT_TRUE(j >= keys.lo && j < keys.hi) << c.name << ": row " << i << " keeps key " << j;
                ASSERT_TRUE(i >= rows.lo && i < rows.hi) << c.name << ": key " << j << " kept by row " << i;
            }
    }
}

// One block of the backward's vector path, trimmed or whole, from the same inputs and accumulators.
struct Block {
    int64_t ld, ldv, lk, d, dv;
    std::vector<float> q, dO, kt, vt, k, s, dp, dvAcc, dkAcc, dq, m, l, delta;
};

Block makeBlock(std::mt19937& rng, const Case& c, int64_t d) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    Block b;
    b.d = d;
    b.dv = c.dv;
    b.ld = bwd::paddedLd(d);
    b.ldv = bwd::paddedLd(c.dv);
    b.lk = bwd::paddedLd(c.nk);
    auto fill = [&](std::vector<float>& v, size_t n, float scale) {
        v.resize(n);
        for (float& x : v) x = scale * u(rng);
    };
    fill(b.q, size_t(c.rows * b.ld), 1.0f);
    fill(b.dO, size_t(c.rows * b.ldv), 1.0f);
    fill(b.kt, size_t(d * b.lk), 1.0f);
    fill(b.vt, size_t(c.dv * b.lk), 1.0f);
    fill(b.k, size_t(c.nk * b.ld), 1.0f);
    b.s.assign(size_t(c.rows * b.lk), 7.0f);  // stale scores: the trimmed path leaves masked ones
    b.dp.assign(size_t(c.rows * b.lk), -3.0f);
    fill(b.dvAcc, size_t(c.nk * c.dv), 1.0f);  // accumulators from earlier blocks
    fill(b.dkAcc, size_t(c.nk * d), 1.0f);
    fill(b.dq, size_t(c.rows * d), 1.0f);
    b.m.resize(size_t(c.rows));
    b.l.resize(size_t(c.rows));
    b.delta.resize(size_t(c.rows));
    for (int64_t r = 0; r < c.rows; ++r) {
        b.m[size_t(r)] = 1.0f + u(rng);
        b.l[size_t(r)] = 20.0f + 5.0f * u(rng);
        b.delta[size_t(r)] = 0.2f * u(rng);
    }
    return b;
}

ATTNOPS_AVX2_FN void runBlock(Block& b, const Case& c, bool trimmed) {
    const float scale = 0.125f;
    const bwd::BlockBand bb{c.rule, c.skv, c.q0, c.rows, c.k0, c.nk};
    const simd::BandLanes<Avx2> band = simd::bandLanes<Avx2>(c.rule, c.skv);
    if (trimmed) {
        bwd::trimmedScoreGemms<Avx2>(bb, b.d, b.dv, b.q.data(), b.ld, b.dO.data(), b.ldv, b.kt.data(), b.vt.data(),
                                     b.s.data(), b.dp.data(), b.lk);
    } else {
        simd::gemm<Avx2, false>(c.rows, c.nk, b.d, b.q.data(), b.ld, b.kt.data(), b.lk, b.s.data(), b.lk, false);
        simd::gemm<Avx2, false>(c.rows, c.nk, b.dv, b.dO.data(), b.ldv, b.vt.data(), b.lk, b.dp.data(), b.lk, false);
    }
    for (int64_t r = 0; r < c.rows; ++r)
        bwd::rowProbabilities<Avx2>(c.nk, scale, b.m[size_t(r)], b.l[size_t(r)], b.delta[size_t(r)],
                                    b.s.data() + r * b.lk, b.dp.data() + r * b.lk, &band, c.q0 + r, c.k0);
    if (trimmed) {
        bwd::trimmedGradientGemms<Avx2>(bb, b.d, b.dv, b.q.data(), b.ld, b.dO.data(), b.ldv, b.s.data(), b.dp.data(),
                                        b.lk, b.k.data(), b.dvAcc.data(), b.dkAcc.data(), b.dq.data());
    } else {
        simd::gemm<Avx2, true>(c.nk, b.dv, c.rows, b.s.data(), b.lk, b.dO.data(), b.ldv, b.dvAcc.data(), b.dv, true);
        simd::gemm<Avx2, true>(c.nk, b.d, c.rows, b.dp.data(), b.lk, b.q.data(), b.ld, b.dkAcc.data(), b.d, true);
        simd::gemm<Avx2, false>(c.rows, b.d, c.nk, b.dp.data(), b.lk, b.k.data(), b.ld, b.dq.data(), b.d, true);
    }
}

void expectSameBits(const std::vector<float>& a, const std::vector<float>& b, const char* what, const char* name,
                    int64_t ld, int64_t cols) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
        if (int64_t(i) % ld >= cols) continue;  // padding columns
        ASSERT_EQ(floatToBits(a[i]), floatToBits(b[i])) << name << ": " << what << "[" << i / size_t(ld) << "]["
                                              << i % size_t(ld) << "]: " << a[i] << " vs " << b[i];
    }
}

TEST(BwdBandAvx2, TrimmedBlockMatchesWholeBlockBitwise) {
    if (!hasAvx2()) GTEST_SKIP() << "this CPU has no AVX2/FMA/F16C";
    std::mt19937 rng(7);
    int64_t changed = 0;
    for (const Case& c : cases()) {
        const Block start = makeBlock(rng, c, 128);
        Block whole = start, trimmed = start;
        runBlock(whole, c, false);
        runBlock(trimmed, c, true);
        expectSameBits(whole.s, trimmed.s, "P", c.name, whole.lk, c.nk);
        expectSameBits(whole.dp, trimmed.dp, "dS", c.name, whole.lk, c.nk);
        expectSameBits(whole.dvAcc, trimmed.dvAcc, "dV", c.name, c.dv, c.dv);
        expectSameBits(whole.dkAcc, trimmed.dkAcc, "dK", c.name, whole.d, whole.d);
        expectSameBits(whole.dq, trimmed.dq, "dQ", c.name, whole.d, whole.d);
        changed += whole.dvAcc != start.dvAcc;
    }
    EXPECT_GT(changed, 10);  // the blocks kept pairs: the comparison compared gradients
}

}  // namespace

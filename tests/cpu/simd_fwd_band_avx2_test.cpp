// The forward kernel's band path (cpu/simd/fa_forward.hpp, AVX2 instantiation) bit for bit
// against the untrimmed block it replaces: bandScores skips (zeroes) the score tiles that no query
// row of their strip keeps and bandValues runs each row tile's P.V over its rows' keys only; after
// softmaxBlock with the band, the probabilities, maxima, sums and accumulators must equal those of
// gemmScores + softmaxBlock + gemmStrips from the same running state, where that softmaxBlock
// reads every key of the block (the pass before softmaxBlock skipped the keys outside each row
// vector's hull). The untrimmed GEMMs with the hull-limited softmax (the kernel's path for blocks
// bandScores declines) are checked against the same reference. Covered: causal diagonals at
// several offsets of the block (rows that keep none, some or all of its keys), bottom-right causal
// (Sq < Skv), a sliding window (keys cut on both sides), a prefix, a value width with a partial
// strip, and blocks that are not whole tiles (bandScores declines them). Skipped without AVX2/FMA/F16C.
#include "cpu/avx2/simd_avx2.hpp"
#include "cpu/simd/fa_forward.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
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
namespace fwd = attnops::fa::simd_forward;
using attnops::fa::SeqRule;

struct Block {
    int64_t qr, nk, d, dv, rows;
    std::vector<float> k, qt, vs, st, m, l, acc;
};

// How runBlock takes a block: the kernel's band path (trimmed GEMMs, softmax over each row
// vector's keys), the kernel's path for blocks bandScores declines (whole GEMMs, softmax over each
// row vector's keys), or the reference (whole GEMMs, softmax over every key of the block).
enum class Path { Trimmed, WholeGemms, Reference };

// One block along `path`; false when bandScores declined the block (not whole tiles).
ATTNOPS_AVX2_FN bool runBlock(Block& b, const SeqRule& rule, int64_t skv, int64_t q0, int64_t k0, Path path,
                              float scale) {
    attnops::fa::ForwardParams p;
    p.scale = scale;
    p.dv = b.dv;
    const simd::BandLanes<Avx2> band = simd::bandLanes<Avx2>(rule, skv);
    // The reference's hull rule keeps every key, so softmaxBlock reads the whole block; the lanes'
    // test still masks by `rule`.
    const SeqRule everyKey{-attnops::fa::kUnbounded, attnops::fa::kUnbounded, 0};
    const fwd::SoftmaxBand<Avx2> softmaxBand{band, path == Path::Reference ? everyKey : rule, skv};
    const bool trimmed = path == Path::Trimmed;
    if (trimmed) {
        if (!fwd::bandScores<Avx2>(rule, skv, q0, k0, b.nk, b.rows, b.d, b.k.data(), b.qt.data(), b.qr, b.st.data()))
            return false;
    } else {
        simd::gemmScores<Avx2, false>(b.nk, b.rows, b.d, b.k.data(), b.d, b.qt.data(), b.qr, b.st.data(), b.qr);
    }
    fwd::softmaxBlock<Avx2>(p, b.rows, b.nk, b.qr, b.st.data(), b.m.data(), b.l.data(), b.acc.data(), &softmaxBand, q0,
                            k0);
    if (trimmed)
        fwd::bandValues<Avx2>(rule, skv, q0, k0, b.nk, b.rows, b.dv, b.st.data(), b.qr, b.vs.data(), b.nk, b.acc.data());
    else
        simd::gemmStrips<Avx2, true>(b.rows, b.dv, b.nk, b.st.data(), b.qr, b.vs.data(), b.acc.data(), b.dv, true);
    return true;
}

Block makeBlock(std::mt19937& rng, int64_t rows, int64_t nk, int64_t d, int64_t dv) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    Block b{120, nk, d, dv, rows, {}, {}, {}, {}, {}, {}, {}};
    const int64_t w = simd::stripWidth<Avx2>(), strips = (dv + w - 1) / w;
    b.k.resize(size_t(nk * d));
    b.qt.resize(size_t(d * b.qr));
    b.vs.assign(size_t(strips * nk * w), 0.0f);
    for (float& x : b.k) x = u(rng);
    for (float& x : b.qt) x = 3.0f * u(rng);
    for (int64_t s = 0; s < strips; ++s)  // zero past dv, as loadRowsStrips packs it
        for (int64_t r = 0; r < nk; ++r)
            for (int64_t c = 0; c < w && s * w + c < dv; ++c) b.vs[size_t((s * nk + r) * w + c)] = u(rng);
    b.st.assign(size_t(nk * b.qr), 7.0f);  // stale scores: the trimmed path must not read them as kept
    // A running state from an earlier block: some rows started, some not.
    b.m.resize(size_t(b.qr));
    b.l.resize(size_t(b.qr));
    b.acc.resize(size_t(b.qr * dv));
    for (int64_t r = 0; r < b.qr; ++r) {
        const bool started = r % 3 != 0;
        b.m[size_t(r)] = started ? 2.0f * u(rng) : -std::numeric_limits<float>::infinity();
        b.l[size_t(r)] = started ? 1.0f + u(rng) * 0.5f : 0.0f;
        for (int64_t c = 0; c < dv; ++c) b.acc[size_t(r * dv + c)] = started ? u(rng) : 0.0f;
    }
    return b;
}

void expectSameBits(const std::vector<float>& a, const std::vector<float>& b, const char* what, int64_t ld,
                    int64_t cols) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
        if (int64_t(i) % ld >= cols) continue;  // padding columns of the scratch
        ASSERT_EQ(floatToBits(a[i]), floatToBits(b[i])) << what << "[" << i / size_t(ld) << "][" << i % size_t(ld)
                                              << "]: " << a[i] << " vs " << b[i];
    }
}

struct Case {
    const char* name;
    SeqRule rule;
    int64_t skv, q0, k0, nk, rows, dv;
};

TEST(FwdBandAvx2, TrimmedBlockMatchesUntrimmedBitwise) {
    if (!hasAvx2()) GTEST_SKIP() << "this CPU has no AVX2/FMA/F16C";
    constexpr int64_t kU = attnops::fa::kUnbounded;
    const SeqRule causal{-kU, 0, 0};
    const std::vector<Case> cases = {
        {"causal, block on the unit's diagonal", causal, 2048, 240, 240, 128, 120, 128},
        {"causal, diagonal starts inside the block", causal, 2048, 120, 128, 128, 120, 128},
        {"causal, diagonal ends inside the block", causal, 2048, 120, 0, 128, 120, 128},
        {"causal, first unit", causal, 2048, 0, 0, 128, 120, 40},
        {"causal, short block", causal, 2048, 240, 256, 104, 120, 128},
        {"causal bottom-right (Skv - Sq = 300)", SeqRule{-kU, 300, 0}, 2348, 120, 256, 128, 120, 72},
        {"sliding window", SeqRule{-50, 0, 0}, 2048, 240, 200, 128, 120, 128},
        {"sliding window, both sides in the block", SeqRule{-20, 10, 0}, 2048, 360, 300, 128, 120, 24},
        {"prefix and causal", SeqRule{-kU, 0, 70}, 2048, 0, 0, 128, 120, 128},
        {"rows not whole strips (declined)", causal, 2048, 0, 0, 128, 64, 128},
        {"keys not whole tiles (declined)", causal, 2048, 120, 128, 127, 120, 128},
        {"rows not whole vectors (declined)", causal, 2048, 240, 240, 128, 37, 128},
        {"window past the block for the later rows", SeqRule{-10, -5, 0}, 2048, 360, 240, 128, 120, 128},
    };
    std::mt19937 rng(7);
    for (const Case& c : cases) {
        SCOPED_TRACE(c.name);
        for (int64_t d : {64, 128}) {
            const Block start = makeBlock(rng, c.rows, c.nk, d, c.dv);
            Block full = start;
            runBlock(full, c.rule, c.skv, c.q0, c.k0, Path::Reference, 0.125f);
            for (Path path : {Path::Trimmed, Path::WholeGemms}) {
                SCOPED_TRACE(path == Path::Trimmed ? "trimmed GEMMs" : "whole GEMMs");
                Block b = start;
                const bool ran = runBlock(b, c.rule, c.skv, c.q0, c.k0, path, 0.125f);
                if (path == Path::Trimmed) {
                    ASSERT_EQ(ran, c.rows % 24 == 0 && c.nk % 4 == 0);
                }
                if (!ran) continue;
                expectSameBits(b.st, full.st, "probabilities", b.qr, c.rows);
                expectSameBits(b.m, full.m, "m", b.qr, c.rows);
                expectSameBits(b.l, full.l, "l", b.qr, c.rows);
                expectSameBits(b.acc, full.acc, "acc", c.dv, c.dv);
            }
        }
    }
}

// A whole unit's worth of causal blocks: the trimmed path leaves the running state of every row
// equal to the untrimmed one after each block.
TEST(FwdBandAvx2, CausalUnitSequenceMatchesBitwise) {
    if (!hasAvx2()) GTEST_SKIP() << "this CPU has no AVX2/FMA/F16C";
    const SeqRule causal{-attnops::fa::kUnbounded, 0, 0};
    std::mt19937 rng(11);
    const int64_t q0 = 120, rows = 120;  // keys [0, 240): blocks 0-127 and 128-239, both partly masked
    Block trimmed = makeBlock(rng, rows, 128, 64, 128), full = trimmed;
    for (int64_t k0 = 0; k0 < q0 + rows; k0 += 128) {
        const int64_t nk = std::min<int64_t>(128, q0 + rows - k0);
        // Fresh keys and values for each block, the same for both paths.
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        for (size_t i = 0; i < trimmed.k.size(); ++i) trimmed.k[i] = full.k[i] = u(rng);
        for (size_t i = 0; i < trimmed.vs.size(); ++i) trimmed.vs[i] = full.vs[i] = u(rng);
        trimmed.nk = full.nk = nk;
        const bool fullyKept = k0 + nk <= q0 + 1;
        if (fullyKept) continue;  // the kernel takes the unmasked path there, not the band path
        ASSERT_TRUE(runBlock(trimmed, causal, 2048, q0, k0, Path::Trimmed, 0.2f));
        runBlock(full, causal, 2048, q0, k0, Path::Reference, 0.2f);
        expectSameBits(trimmed.m, full.m, "m", trimmed.qr, rows);
        expectSameBits(trimmed.l, full.l, "l", trimmed.qr, rows);
        expectSameBits(trimmed.acc, full.acc, "acc", 128, 128);
    }
}

// The trimming happens: on a causal diagonal block, bandScores leaves the tiles above the
// diagonal of each strip at zero (the untrimmed GEMM's scores there are not zero) and computes
// the others with gemmScores' bits.
TEST(FwdBandAvx2, DiagonalTilesAreSkipped) {
    if (!hasAvx2()) GTEST_SKIP() << "this CPU has no AVX2/FMA/F16C";
    const SeqRule causal{-attnops::fa::kUnbounded, 0, 0};
    std::mt19937 rng(5);
    Block b = makeBlock(rng, 120, 128, 64, 128);
    std::vector<float> trimmed(b.st.size(), std::numeric_limits<float>::quiet_NaN()), full(b.st.size());
    ASSERT_TRUE(fwd::bandScores<Avx2>(causal, 2048, 240, 240, 128, 120, 64, b.k.data(), b.qt.data(), b.qr,
                                      trimmed.data()));
    simd::gemmScores<Avx2, false>(128, 120, 64, b.k.data(), 64, b.qt.data(), b.qr, full.data(), b.qr);
    int64_t skipped = 0;
    for (int64_t key = 0; key < 128; ++key)
        for (int64_t r = 0; r < 120; ++r) {
            const size_t at = size_t(key * b.qr + r);
            const int64_t strip = r / 24, lastRowOfStrip = strip * 24 + 23;  // block-relative (q0 = k0)
            if (key / 4 * 4 > lastRowOfStrip) {  // a 4-key tile wholly above the strip's last row
                ASSERT_EQ(floatToBits(trimmed[at]), 0u) << "key " << key << " row " << r;
                ++skipped;
            } else {
                ASSERT_EQ(floatToBits(trimmed[at]), floatToBits(full[at])) << "key " << key << " row " << r;
            }
        }
    // Strips end at rows 23, 47, 71, 95, 119: 104 + 80 + 56 + 32 + 8 keys above them.
    EXPECT_EQ(skipped, (104 + 80 + 56 + 32 + 8) * 24);
}

}  // namespace

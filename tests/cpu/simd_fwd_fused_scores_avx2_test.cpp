// The forward's fused score GEMM (cpu/simd/microkernels.hpp gemmScoresScaledMax + fa_forward.hpp
// softmaxBlockScaled, AVX2 instantiation) bit for bit against the two steps it replaces on fully
// kept blocks (key counts with and without a partial register tile): gemmScores, then the scaling
// pass of softmaxBlock and the rest of the softmax. Scores, column maxima, NaN lanes,
// probabilities, m, l and the rescaled accumulator must have the same bits, including the sign of
// a zero maximum (scale 0 gives columns of +0 and -0 scores, whose max depends on the order of the
// max operations), NaN and infinite scores, and rows that started in an earlier block. Skipped
// without AVX2/FMA/F16C.
#include "cpu/avx2/simd_avx2.hpp"
#include "cpu/simd/fa_forward.hpp"

#include <gtest/gtest.h>

#include <cmath>
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

constexpr int64_t kQr = Avx2::kQueryRows;  // leading dimension of St and the statistics, as in the kernel
constexpr float kInf = std::numeric_limits<float>::infinity();

// The inputs of one block and the running state of the softmax before it.
struct Block {
    int64_t nk, d, dv, rows;
    std::vector<float> k, qt, m, l, acc;
};

// The state after the block: St (probabilities), m, l, acc, and the scaled scores before the
// softmax with their column maxima and NaN lanes.
struct After {
    std::vector<float> scores, st, m, l, acc, colMax;
    std::vector<uint32_t> nanLanes;
};

Block makeBlock(std::mt19937& rng, int64_t rows, int64_t nk, int64_t d, int64_t dv, bool specials) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    Block b{nk, d, dv, rows, {}, {}, {}, {}, {}};
    b.k.resize(size_t(nk * d));
    b.qt.resize(size_t(d * kQr));
    for (float& x : b.k) x = u(rng);
    for (float& x : b.qt) x = 3.0f * u(rng);
    if (specials) {
        // A zero key (scores +0), a NaN in one key, an infinite element in another (scores +-inf,
        // or NaN where it meets a zero query element), and a huge key whose scores overflow.
        for (int64_t c = 0; c < d; ++c) b.k[size_t(1 % nk * d + c)] = 0.0f;
        if (nk > 2) b.k[size_t(2 * d + d / 2)] = std::numeric_limits<float>::quiet_NaN();
        if (nk > 3) b.k[size_t(3 * d)] = kInf;
        if (nk > 3) b.qt[size_t(5)] = 0.0f;  // query row 5, column 0: inf * 0 in key 3's score
        if (nk > 4)
            for (int64_t c = 0; c < d; ++c) b.k[size_t(4 * d + c)] = 3e37f;
    }
    b.m.resize(size_t(kQr));
    b.l.resize(size_t(kQr));
    b.acc.resize(size_t(kQr * dv));
    for (int64_t r = 0; r < kQr; ++r) {
        const bool started = r % 3 != 0;
        b.m[size_t(r)] = started ? 2.0f * u(rng) : -kInf;
        b.l[size_t(r)] = started ? 1.0f + u(rng) * 0.5f : 0.0f;
        for (int64_t c = 0; c < dv; ++c) b.acc[size_t(r * dv + c)] = started ? u(rng) : 0.0f;
    }
    return b;
}

// The unfused steps: gemmScores, then softmaxBlock (whose first pass scales and reduces).
ATTNOPS_AVX2_FN After twoSteps(const Block& b, float scale) {
    attnops::fa::ForwardParams p;
    p.scale = scale;
    p.dv = b.dv;
    After a{std::vector<float>(size_t(b.nk * kQr), 0.0f), {}, b.m, b.l, b.acc, std::vector<float>(size_t(kQr)), {}};
    simd::gemmScores<Avx2, false>(b.nk, b.rows, b.d, b.k.data(), b.d, b.qt.data(), kQr, a.scores.data(), kQr);
    // The first pass written out: what softmaxBlock computes before softmaxUpdate.
    a.nanLanes.assign(size_t(kQr), 0);
    for (int64_t r = 0; r < b.rows; ++r) {
        float mx = -kInf;
        for (int64_t j = 0; j < b.nk; ++j) {
            const float x = a.scores[size_t(j * kQr + r)] * scale;
            if (std::isnan(x)) a.nanLanes[size_t(r)] = 1;
            mx = mx > x ? mx : x;  // vmaxps(mx, x): x unless mx > x
        }
        a.colMax[size_t(r)] = mx;
    }
    a.st = a.scores;
    fwd::softmaxBlock<Avx2>(p, b.rows, b.nk, kQr, a.st.data(), a.m.data(), a.l.data(), a.acc.data(), nullptr, 0, 0);
    for (int64_t i = 0; i < b.nk * kQr; ++i) a.scores[size_t(i)] *= scale;
    return a;
}

// The fused steps of the kernel.
ATTNOPS_AVX2_FN After fused(const Block& b, float scale) {
    attnops::fa::ForwardParams p;
    p.scale = scale;
    p.dv = b.dv;
    After a{std::vector<float>(size_t(b.nk * kQr), 0.0f), {}, b.m, b.l, b.acc, std::vector<float>(size_t(kQr), -kInf),
            {}};
    Avx2::Mask nan[kQr / Avx2::kLanes];
    for (Avx2::Mask& lanes : nan) lanes = Avx2::none();
    const simd::ColumnStats<Avx2> stats{a.colMax.data(), nan};
    simd::gemmScoresScaledMax<Avx2>(b.nk, b.rows, b.d, b.k.data(), b.d, b.qt.data(), kQr, a.scores.data(), kQr, scale,
                                    stats);
    a.nanLanes.assign(size_t(kQr), 0);
    for (int64_t r = 0; r < b.rows; ++r) {
        alignas(32) uint32_t lanes[Avx2::kLanes];
        _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), nan[r / Avx2::kLanes]);
        a.nanLanes[size_t(r)] = lanes[r % Avx2::kLanes] != 0 ? 1 : 0;
    }
    a.st = a.scores;
    fwd::softmaxBlockScaled<Avx2>(p, b.rows, b.nk, kQr, a.st.data(), a.m.data(), a.l.data(), a.acc.data(), stats);
    return a;
}

void expectSameBits(const std::vector<float>& x, const std::vector<float>& y, const char* what, int64_t ld,
                    int64_t cols, const std::string& name) {
    ASSERT_EQ(x.size(), y.size());
    for (size_t i = 0; i < x.size(); ++i) {
        if (int64_t(i) % ld >= cols) continue;  // columns past the block's rows
        ASSERT_EQ(floatToBits(x[i]), floatToBits(y[i])) << name << ": " << what << "[" << i / size_t(ld) << "]["
                                              << i % size_t(ld) << "]: " << x[i] << " vs " << y[i];
    }
}

struct Case {
    int64_t rows, nk, d, dv;
    bool specials;
    float scale;
};

TEST(FwdFusedScoresAvx2, FusedEpilogueMatchesSeparatePassBitwise) {
    if (!hasAvx2()) GTEST_SKIP() << "this CPU has no AVX2/FMA/F16C";
    const std::vector<Case> cases = {
        {120, 128, 128, 128, false, 0.0883883f},  // the AVX2 unit and key block at D = 128
        {120, 128, 128, 128, true, 0.0883883f},   // NaN, inf, overflowing and zero keys
        {24, 4, 1, 8, false, 1.0f},               // one register tile, d = 1
        {48, 64, 40, 72, true, -0.5f},            // negative scale: the zero key's scores become -0
        {96, 8, 3, 16, false, 0.0f},              // scale 0: columns of +0 and -0, max sign by order
        {120, 128, 64, 64, true, 0.0f},
        {72, 32, 128, 128, true, 1e30f},          // scaled scores overflow to +-inf
        {120, 125, 128, 128, true, 0.0883883f},   // keys past the last whole tile (gemm() rows, then reduced)
        {24, 3, 16, 8, false, 0.0f},              // fewer keys than one tile, scale 0
        {48, 7, 64, 40, true, -1.0f},
    };
    std::mt19937 rng(7);
    for (const Case& c : cases) {
        const Block b = makeBlock(rng, c.rows, c.nk, c.d, c.dv, c.specials);
        const std::string name = "rows " + std::to_string(c.rows) + " nk " + std::to_string(c.nk) + " d " +
                                 std::to_string(c.d) + " scale " + std::to_string(c.scale) +
                                 (c.specials ? " with NaN/inf/zero keys" : "");
        const After want = twoSteps(b, c.scale), got = fused(b, c.scale);
        expectSameBits(want.scores, got.scores, "scaled score", kQr, c.rows, name);
        expectSameBits(want.colMax, got.colMax, "column max", kQr, c.rows, name);
        for (int64_t r = 0; r < c.rows; ++r)
            ASSERT_EQ(want.nanLanes[size_t(r)], got.nanLanes[size_t(r)]) << name << ": NaN lane of row " << r;
        expectSameBits(want.st, got.st, "probability", kQr, c.rows, name);
        expectSameBits(want.m, got.m, "m", kQr, c.rows, name);
        expectSameBits(want.l, got.l, "l", kQr, c.rows, name);
        expectSameBits(want.acc, got.acc, "acc", kQr * c.dv, c.rows * c.dv, name);
    }
}

// The cases above must reach what they claim: a zero column maximum of each sign, NaN lanes and
// infinite scores (else the comparison above could not fail on them).
TEST(FwdFusedScoresAvx2, CasesReachSignedZeroMaximaNaNAndInfinity) {
    if (!hasAvx2()) GTEST_SKIP() << "this CPU has no AVX2/FMA/F16C";
    std::mt19937 rng(7);
    const Block zeroScale = makeBlock(rng, 96, 8, 3, 16, false);
    const After a = twoSteps(zeroScale, 0.0f);
    int plus = 0, minus = 0;
    for (int64_t r = 0; r < 96; ++r) {
        if (floatToBits(a.colMax[size_t(r)]) == 0u) ++plus;
        if (floatToBits(a.colMax[size_t(r)]) == 0x80000000u) ++minus;
    }
    EXPECT_GT(plus, 0);
    EXPECT_GT(minus, 0);
    const Block special = makeBlock(rng, 120, 128, 128, 128, true);
    const After s = twoSteps(special, 0.0883883f);
    int nanRows = 0, infScores = 0;
    for (int64_t r = 0; r < 120; ++r) nanRows += int(s.nanLanes[size_t(r)]);
    for (float x : s.scores) infScores += std::isinf(x) ? 1 : 0;
    EXPECT_EQ(nanRows, 120);  // the NaN key reaches every column
    EXPECT_GT(infScores, 0);
}

}  // namespace

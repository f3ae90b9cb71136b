// The forward softmax's stage-interleaved exp (cpu/simd/fa_forward.hpp, AVX2 instantiation):
// expNonPositiveInterleaved must give, lane for lane, the bits of expNonPositive (its own copy of
// the polynomial's coefficients and order), and softmaxBlock, which runs it on kExpChains keys at
// a time with the last nk % kExpChains keys one at a time, must give the bits of the one-exp-per-
// key pass it replaced, for every remainder of nk (probabilities, m, l and the accumulator), with
// -inf holes, dead rows and a running state from an earlier block. Skipped without AVX2/FMA/F16C.
#include "cpu/avx2/simd_avx2.hpp"
#include "cpu/simd/fa_forward.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.hpp"
#include "avx2_tests.hpp"

namespace {

using attnops::floatToBits;
using attnops::bitsToFloat;

using attnops::cpu::Avx2;
namespace simd = attnops::cpu::simd;
namespace fwd = attnops::fa::simd_forward;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int64_t L = Avx2::kLanes;
constexpr int G = fwd::kExpChains;

// G vectors of x through both exps.
ATTNOPS_AVX2_FN void expBoth(const float* x, float* single, float* interleaved) {
    Avx2::Vec v[G];
    for (int g = 0; g < G; ++g) {
        Avx2::store(single + g * L, fwd::expNonPositive<Avx2>(Avx2::load(x + g * L)));
        v[g] = Avx2::load(x + g * L);
    }
    fwd::expNonPositiveInterleaved<Avx2>(v);
    for (int g = 0; g < G; ++g) Avx2::store(interleaved + g * L, v[g]);
}

ATTNOPS_AVX2_FN void softmax(const attnops::fa::ForwardParams& p, int64_t rows, int64_t nk, int64_t ld, float* st,
                             float* m, float* l, float* acc) {
    fwd::softmaxBlock<Avx2>(p, rows, nk, ld, st, m, l, acc, nullptr, 0, 0);
}

// softmaxBlock's fast path as it was before the interleaving: one expNonPositive per key.
ATTNOPS_AVX2_FN void softmaxOneChain(float scale, int64_t dv, int64_t rows, int64_t nk, int64_t ld, float* st,
                                     float* m, float* l, float* acc) {
    using V = Avx2;
    for (int64_t r0 = 0; r0 < rows; r0 += L) {
        auto blockMax = V::set1(-kInf);
        for (int64_t j = 0; j < nk; ++j) {
            const auto x = V::mul(V::load(st + j * ld + r0), V::set1(scale));
            V::store(st + j * ld + r0, x);
            blockMax = V::max(blockMax, x);
        }
        const auto mOld = V::load(m + r0);
        const auto mNew = V::select(V::greater(blockMax, mOld), mOld, blockMax);
        const auto alpha = V::zeroUnless(V::notEqual(mOld, V::set1(-kInf)), simd::exp<V>(V::sub(mOld, mNew)));
        auto sum = V::zero();
        for (int64_t j = 0; j < nk; ++j) {
            const auto e = fwd::expNonPositive<V>(V::sub(V::load(st + j * ld + r0), mNew));
            V::store(st + j * ld + r0, e);
            sum = V::add(sum, e);
        }
        V::store(l + r0, V::fmadd(V::load(l + r0), alpha, sum));
        V::store(m + r0, mNew);
        alignas(32) float alphas[L];
        V::store(alphas, alpha);
        for (int64_t r = r0; r < std::min(rows, r0 + L); ++r)
            if (alphas[r - r0] != 1.0f)
                for (int64_t c = 0; c < dv; ++c) acc[r * dv + c] *= alphas[r - r0];
    }
}

TEST(FwdExpInterleavedAvx2, MatchesExpNonPositiveBitwise) {
    SKIP_WITHOUT_AVX2();
    std::vector<float> xs = {-0.0f, 0.0f, -kInf, -1e-45f, -1e-38f, -1.17549435e-38f, -87.3f, -87.29999f, -87.30001f,
                             -87.0f, -86.5f, -88.0f, -100.0f, -1e30f, -3.4e38f, -0.5f, -0.34657359f, -0.6931472f, -1.0f,
                             std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN()};
    for (uint32_t u = 0x80000000u; u < 0xFF800000u; u += 991u) xs.push_back(bitsToFloat(u));  // sampled x <= -0
    for (int i = 0; i < 40000; ++i) xs.push_back(-float(i) * (90.0f / 40000.0f));          // the range that matters
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(-88.0f, 0.0f);
    for (int i = 0; i < 40000; ++i) xs.push_back(u(rng));
    while (xs.size() % (G * L) != 0) xs.push_back(-1.5f);
    std::vector<float> single(xs.size()), interleaved(xs.size());
    for (size_t i = 0; i < xs.size(); i += G * L) expBoth(xs.data() + i, single.data() + i, interleaved.data() + i);
    for (size_t i = 0; i < xs.size(); ++i)
        ASSERT_EQ(floatToBits(single[i]), floatToBits(interleaved[i]))
            << "x = " << xs[i] << " (bits " << std::hex << floatToBits(xs[i]) << ")";
    // NaN (x = -inf - -inf in a dead row) gives 0 in both.
    EXPECT_EQ(floatToBits(interleaved[19]), 0u);
    EXPECT_EQ(floatToBits(interleaved[20]), 0u);
}

// Every remainder of nk modulo kExpChains, against the one-chain pass, from the same state.
TEST(FwdExpInterleavedAvx2, SoftmaxBlockMatchesOneChainPassBitwise) {
    SKIP_WITHOUT_AVX2();
    std::mt19937 rng(21);
    std::uniform_real_distribution<float> u(-40.0f, 40.0f);
    const int64_t rows = 24, ld = 40, dv = 12;
    attnops::fa::ForwardParams p;
    p.dv = dv;
    for (bool holes : {false, true})
        for (float scale : {0.088f, 3.0f})  // 3: score differences beyond exp's -87.3 cut-off
            for (int64_t nk : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 31, 128, 130}) {
                p.scale = scale;
                std::vector<float> st(static_cast<size_t>(nk * ld)), m(static_cast<size_t>(rows)), l(static_cast<size_t>(rows)),
                    acc(static_cast<size_t>(rows * dv));
                for (float& x : st) x = u(rng);
                for (int64_t r = 0; r < rows; ++r) {
                    m[size_t(r)] = r < 8 ? -kInf : u(rng) * scale;  // rows 0-7 fresh, the others a running state
                    l[size_t(r)] = r < 8 ? 0.0f : 2.0f + float(r);
                    for (int64_t c = 0; c < dv; ++c) acc[size_t(r * dv + c)] = r < 8 ? 0.0f : u(rng);
                }
                if (holes) {
                    for (int64_t j = 0; j < nk; ++j)
                        for (int64_t r = 0; r < rows; ++r)
                            if ((j + 2 * r) % 3 == 0) st[size_t(j * ld + r)] = -kInf;
                    for (int64_t j = 0; j < nk; ++j) st[size_t(j * ld + 6)] = -kInf;  // a dead row
                }
                std::vector<float> st2 = st, m2 = m, l2 = l, acc2 = acc;
                softmax(p, rows, nk, ld, st.data(), m.data(), l.data(), acc.data());
                softmaxOneChain(p.scale, dv, rows, nk, ld, st2.data(), m2.data(), l2.data(), acc2.data());
                SCOPED_TRACE(::testing::Message() << "holes " << holes << " scale " << scale << " nk " << nk);
                for (size_t i = 0; i < st.size(); ++i) ASSERT_EQ(floatToBits(st[i]), floatToBits(st2[i])) << "st[" << i << "]";
                for (size_t i = 0; i < m.size(); ++i) ASSERT_EQ(floatToBits(m[i]), floatToBits(m2[i])) << "m[" << i << "]";
                for (size_t i = 0; i < l.size(); ++i) ASSERT_EQ(floatToBits(l[i]), floatToBits(l2[i])) << "l[" << i << "]";
                for (size_t i = 0; i < acc.size(); ++i)
                    ASSERT_EQ(floatToBits(acc[i]), floatToBits(acc2[i])) << "acc[" << i << "]";
            }
}

}  // namespace

// The forward kernel's online softmax (cpu/simd/fa_forward.hpp, AVX2 instantiation) bit for bit
// against the general formula it short-cuts: softmaxBlock takes a second pass without NaN and
// overflow handling (expNonPositive) when a block has no NaN score and no NaN or +inf maximum,
// and must give exactly what the masked simd::exp pass gives. Covered: expNonPositive against
// simd::exp over sampled non-positive floats and the edges (-0, subnormals, around the -87.3
// cut-off, -inf); whole blocks with -inf holes, dead rows (every score -inf so far), a running
// state from an earlier block, rows whose maximum does or does not move, and blocks that must
// take the general pass (a NaN score, a +inf score); and the vectorised output row store against
// tile::storeRow (fp32, bf16, fp16; NaN payloads, infinities, rounding ties, l = 0 and NaN). Skipped on CPUs without AVX2, FMA and F16C.
#include "cpu/avx2/simd_avx2.hpp"
#include "cpu/simd/fa_forward.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu/generic/score_row.hpp"
#include "core/dtype.hpp"
#include "cpu/isa.hpp"
#include "avx2_tests.hpp"

namespace {

using attnops::floatToBits;
using attnops::bitsToFloat;

using attnops::cpu::Avx2;
namespace simd = attnops::cpu::simd;
namespace fwd = attnops::fa::simd_forward;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int64_t L = Avx2::kLanes;

ATTNOPS_AVX2_FN void expBoth(const float* x, float* general, float* fast) {
    Avx2::store(general, simd::exp<Avx2>(Avx2::load(x)));
    Avx2::store(fast, fwd::expNonPositive<Avx2>(Avx2::load(x)));
}

ATTNOPS_AVX2_FN void softmax(const attnops::fa::ForwardParams& p, int64_t rows, int64_t nk, int64_t ld, float* st,
                             float* m, float* l, float* acc) {
    fwd::softmaxBlock<Avx2>(p, rows, nk, ld, st, m, l, acc, nullptr, 0, 0);
}

// The general formula of softmaxBlock (every lane through simd::exp, masked by the liveness of
// the row and of the score), as the kernel computed it before the short-cut.
ATTNOPS_AVX2_FN void softmaxGeneral(float scale, int64_t dv, int64_t rows, int64_t nk, int64_t ld, float* st, float* m,
                                    float* l, float* acc) {
    using V = Avx2;
    const auto negInf = V::set1(-kInf);
    for (int64_t r0 = 0; r0 < rows; r0 += L) {
        auto blockMax = negInf;
        auto nan = V::none();
        for (int64_t j = 0; j < nk; ++j) {
            const auto x = V::mul(V::load(st + j * ld + r0), V::set1(scale));
            V::store(st + j * ld + r0, x);
            nan = V::maskOr(nan, V::isNan(x));
            blockMax = V::max(blockMax, x);
        }
        blockMax = V::select(nan, blockMax, V::set1(std::numeric_limits<float>::quiet_NaN()));
        const auto mOld = V::load(m + r0);
        const auto mNew = V::select(V::maskOr(V::greater(blockMax, mOld), V::isNan(blockMax)), mOld, blockMax);
        const auto alpha = V::zeroUnless(V::notEqual(mOld, negInf), simd::exp<V>(V::sub(mOld, mNew)));
        const auto live = V::notEqual(mNew, negInf);
        auto sum = V::zero();
        for (int64_t j = 0; j < nk; ++j) {
            const auto x = V::load(st + j * ld + r0);
            const auto e = V::zeroUnless(V::maskAnd(live, V::notEqual(x, negInf)), simd::exp<V>(V::sub(x, mNew)));
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

void expectSameBits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i)
        ASSERT_EQ(floatToBits(a[i]), floatToBits(b[i])) << what << "[" << i << "]: " << a[i] << " vs " << b[i];
}

TEST(FwdSoftmaxAvx2, ExpNonPositiveMatchesExpBitwise) {
    SKIP_WITHOUT_AVX2();
    std::vector<float> xs = {-0.0f, 0.0f, -kInf, -1e-45f, -1e-38f, -1.17549435e-38f, -87.3f, -87.29999f, -87.30001f,
                             -87.0f, -86.5f, -88.0f, -100.0f, -1e30f, -3.4e38f, -0.5f, -0.34657359f, -0.6931472f, -1.0f};
    for (uint32_t u = 0x80000000u; u < 0xFF800000u; u += 997u) xs.push_back(bitsToFloat(u));  // sampled x <= -0
    for (int i = 0; i < 20000; ++i) xs.push_back(-float(i) * (90.0f / 20000.0f));          // the range that matters
    while (xs.size() % L != 0) xs.push_back(-1.5f);
    std::vector<float> general(xs.size()), fast(xs.size());
    for (size_t i = 0; i < xs.size(); i += L) expBoth(xs.data() + i, general.data() + i, fast.data() + i);
    for (size_t i = 0; i < xs.size(); ++i)
        ASSERT_EQ(floatToBits(general[i]), floatToBits(fast[i])) << "x = " << xs[i] << " (bits " << std::hex << floatToBits(xs[i]) << ")";
    // NaN (x = -inf - -inf in a dead row) gives 0, which the general pass's masks give there.
    alignas(32) float nan[L], g[L], f[L];
    for (float& x : nan) x = std::numeric_limits<float>::quiet_NaN();
    expBoth(nan, g, f);
    for (int64_t i = 0; i < L; ++i) EXPECT_EQ(floatToBits(f[i]), 0u);
}

// Blocks of scores (keys x query rows, ld > rows) through softmaxBlock and the general formula
// from the same running state: every probability, max, sum and accumulator bit equal.
TEST(FwdSoftmaxAvx2, BlockMatchesGeneralFormulaBitwise) {
    SKIP_WITHOUT_AVX2();
    std::mt19937 rng(13);
    std::uniform_real_distribution<float> u(-40.0f, 40.0f);
    const int64_t rows = 24, ld = 32, dv = 20;
    attnops::fa::ForwardParams p;
    p.dv = dv;
    enum Special { None, Holes, DeadRow, NanScore, InfScore, HugeScale, Wide };
    for (Special special : {None, Holes, DeadRow, NanScore, InfScore, HugeScale, Wide})
        for (int64_t nk : {1, 7, 64, 129}) {
            // Wide: score differences beyond the -87.3 cut-off of exp; HugeScale: +inf scores.
            p.scale = special == HugeScale ? 1e37f : special == Wide ? 3.0f : 0.088f;
            std::vector<float> st(static_cast<size_t>(nk * ld)), m(static_cast<size_t>(rows)), l(static_cast<size_t>(rows)),
                acc(static_cast<size_t>(rows * dv));
            for (float& x : st) x = u(rng);
            for (int64_t r = 0; r < rows; ++r) {
                // Rows 0-7 start fresh; the others carry a state whose maximum a block may or may not move.
                m[size_t(r)] = r < 8 ? -kInf : u(rng) * 0.088f;
                l[size_t(r)] = r < 8 ? 0.0f : 1.0f + float(r);
                for (int64_t c = 0; c < dv; ++c) acc[size_t(r * dv + c)] = r < 8 ? 0.0f : u(rng);
            }
            if (special == Holes || special == DeadRow)
                for (int64_t j = 0; j < nk; ++j)
                    for (int64_t r = 0; r < rows; ++r)
                        if ((j + r) % 3 == 0) st[size_t(j * ld + r)] = -kInf;
            if (special == DeadRow)
                for (int64_t j = 0; j < nk; ++j) st[size_t(j * ld + 5)] = st[size_t(j * ld + 17)] = -kInf;
            if (special == DeadRow) m[17] = -kInf, l[17] = 0.0f;
            if (special == NanScore) st[size_t((nk / 2) * ld + 9)] = std::numeric_limits<float>::quiet_NaN();
            if (special == InfScore) st[size_t((nk - 1) * ld + 3)] = kInf;
            std::vector<float> st2 = st, m2 = m, l2 = l, acc2 = acc;
            softmax(p, rows, nk, ld, st.data(), m.data(), l.data(), acc.data());
            softmaxGeneral(p.scale, dv, rows, nk, ld, st2.data(), m2.data(), l2.data(), acc2.data());
            SCOPED_TRACE(::testing::Message() << "special " << int(special) << " nk " << nk);
            for (int64_t j = 0; j < nk; ++j)
                for (int64_t r = 0; r < rows; ++r)
                    ASSERT_EQ(floatToBits(st[size_t(j * ld + r)]), floatToBits(st2[size_t(j * ld + r)])) << "key " << j << " row " << r;
            expectSameBits(m, m2, "m");
            expectSameBits(l, l2, "l");
            expectSameBits(acc, acc2, "acc");
        }
}

ATTNOPS_AVX2_FN void storeFast(const attnops::fa::ForwardParams& p, const attnops::fa::WorkUnit& u, int64_t i, float m,
                               float l, float* acc, float* tmp) {
    fwd::storeOutputRow<Avx2>(p, u, 0, i, m, l, acc, tmp);
}

// An output row written by storeOutputRow and by tile::storeRow: the same bits in every dtype.
TEST(FwdSoftmaxAvx2, OutputRowStoreMatchesScalarStoreBitwise) {
    SKIP_WITHOUT_AVX2();
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-5.0f, 5.0f);
    for (attnops::DType dt : {attnops::DType::F32, attnops::DType::BF16, attnops::DType::F16})
        for (int64_t dv : {1, 8, 37, 128})
            for (float l : {1.0f, 3.0f, 0.37f, 0.0f, std::numeric_limits<float>::quiet_NaN()}) {
                std::vector<float> acc(static_cast<size_t>(dv));
                for (float& x : acc) x = u(rng);
                const float special[] = {kInf, -kInf, std::numeric_limits<float>::quiet_NaN(), bitsToFloat(0x7f800001u),
                                         bitsToFloat(0xffa00000u), bitsToFloat(0x3f808000u), bitsToFloat(0x3f818000u),
                                         bitsToFloat(0x7f7fffffu), 1e-40f, -0.0f};
                for (size_t k = 0; k < sizeof special / sizeof special[0] && k < acc.size(); ++k)
                    acc[k * 3 % acc.size()] = special[k] * (l == 1.0f ? 1.0f : l);  // acc / l gives the value back
                const int64_t rows = 3, row = 1;
                std::vector<uint32_t> fastOut(static_cast<size_t>(rows * dv), 0xdeadbeefu),
                    slowOut(static_cast<size_t>(rows * dv), 0xdeadbeefu);
                attnops::fa::ForwardParams p;
                p.dv = dv;
                p.seq.qStart = {0};
                p.out.dtype = dt;
                const int64_t elemsPerRow = dt == attnops::DType::F32 ? dv : 2 * dv;  // 16-bit rows packed tighter
                p.out.stride[0] = rows * elemsPerRow;
                p.out.stride[1] = rows * elemsPerRow;
                p.out.stride[2] = elemsPerRow;
                p.out.stride[3] = 1;
                const attnops::fa::WorkUnit unit{0, 0, 0, rows};
                std::vector<float> acc2 = acc, tmp(static_cast<size_t>(dv));
                p.out.data = fastOut.data();
                storeFast(p, unit, row, 0.5f, l, acc.data(), tmp.data());
                p.out.data = slowOut.data();
                attnops::fa::tile::storeRow(p, unit, 0, row, 0.5f, l, acc2.data());
                SCOPED_TRACE(::testing::Message() << "dtype " << int(dt) << " dv " << dv << " l " << l);
                // Bits equal, except that a NaN may carry either operand's payload: with l = NaN and a
                // NaN in acc, acc * (1 / l) returns whichever NaN the compiler put first in the
                // multiply (commutative to it), in the scalar store as in the vector one.
                const auto isNanWord = [&](uint32_t w, int half) {
                    if (dt == attnops::DType::F32) return (w & 0x7fffffffu) > 0x7f800000u;
                    const uint32_t h = half ? w >> 16 : w & 0xffffu;
                    return dt == attnops::DType::BF16 ? (h & 0x7fffu) > 0x7f80u : (h & 0x7fffu) > 0x7c00u;
                };
                for (size_t k = 0; k < fastOut.size(); ++k) {
                    if (fastOut[k] == slowOut[k]) continue;
                    const bool payloadOnly = std::isnan(l) && (dt == attnops::DType::F32
                                                                   ? isNanWord(fastOut[k], 0) && isNanWord(slowOut[k], 0)
                                                                   : ((fastOut[k] ^ slowOut[k]) & 0xffffu) == 0 ||
                                                                         (isNanWord(fastOut[k], 0) && isNanWord(slowOut[k], 0)));
                    const bool highOk = dt == attnops::DType::F32 || ((fastOut[k] ^ slowOut[k]) >> 16) == 0 ||
                                        (isNanWord(fastOut[k], 1) && isNanWord(slowOut[k], 1));
                    ASSERT_TRUE(payloadOnly && highOk) << "word " << k << ": " << std::hex << fastOut[k] << " vs " << slowOut[k];
                }
            }
}

}  // namespace

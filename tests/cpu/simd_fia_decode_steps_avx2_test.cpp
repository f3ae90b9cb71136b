// The decode microkernels of cpu/simd/fia_forward.hpp (AVX2 instantiation) bit for bit against
// the narrowest form of the same sums: dotRows (steps of three keys, the last of one or two)
// against one-key steps (dotStep with NK = 1: each score is its own dot whatever the step),
// and accumulateRows (strips of three value vectors, a one-vector remainder taken as two strips
// of two) against one-vector strips (accumulateColumns with NV = 1: each column's chain over the
// keys is the same whatever the strip width). Key counts around the steps of three (1-13, 21,
// 31-33, 63, 64), 1-4 query rows, head dims of 1-17 vectors, bf16/fp16/int8/int4 rows, NaN and
// infinite elements. Skipped without AVX2/FMA/F16C.
#include "cpu/avx2/simd_avx2.hpp"
#include "cpu/simd/fia_forward.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.hpp"
#include "avx2_tests.hpp"

namespace {

using attnops::DType;
using attnops::floatToBits;
using attnops::cpu::Avx2;
namespace dec = attnops::fia::simd_forward;

constexpr int64_t kL = Avx2::kLanes;
constexpr int64_t kBlock = dec::kKeyRows;  // st's leading dimension in the kernel

// Rows of n elements of dtype T as the cache stores them (int4: two per byte), random values,
// with a NaN and an infinity in the first rows when `specials`.
struct Rows {
    std::vector<char> bytes;
    std::vector<const char*> at;
    int64_t rowBytes;
};

Rows makeRows(std::mt19937& rng, DType t, int64_t rows, int64_t n, bool specials) {
    const int64_t rowBytes = t == DType::I4 ? n / 2 : t == DType::I8 ? n : 2 * n;
    Rows r{std::vector<char>(size_t(rows * rowBytes)), std::vector<const char*>(size_t(rows)), rowBytes};
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    std::uniform_int_distribution<int> byte(0, 255);
    for (int64_t j = 0; j < rows; ++j) {
        char* row = r.bytes.data() + j * rowBytes;
        r.at[size_t(j)] = row;
        for (int64_t c = 0; c < n; ++c) {
            if (t == DType::BF16 || t == DType::F16) {
                float x = u(rng);
                if (specials && j == 0 && c == 1) x = std::numeric_limits<float>::quiet_NaN();
                if (specials && j == 1 && c == 2) x = std::numeric_limits<float>::infinity();
                const uint16_t h = t == DType::BF16 ? attnops::floatToBf16(x) : attnops::floatToF16(x);
                std::memcpy(row + 2 * c, &h, 2);
            } else if (t == DType::I8) {
                row[c] = char(byte(rng));
            } else if (c % 2 == 0) {
                row[c / 2] = char(byte(rng));
            }
        }
    }
    return r;
}

template <DType T, int NR>
ATTNOPS_AVX2_FN void dots(int64_t d, const Rows& k, int64_t nk, const float* q, float* st, bool oneKeySteps) {
    std::vector<int64_t> chunk(size_t(d / kL));
    for (int64_t v = 0; v < d / kL; ++v) chunk[size_t(v)] = v * kL;
    if (!oneKeySteps) {
        dec::dotRows<Avx2, T, T, NR, true, false>(d, k.at.data(), chunk.data(), 0, nullptr, nullptr, nk, q, d, st, nullptr,
                                                  kBlock, nullptr);
        return;
    }
    for (int64_t j = 0; j < nk; ++j)
        dec::dotStep<Avx2, T, T, NR, 1, true, false>(d, k.at.data() + j, chunk.data(), 0, nullptr, nullptr, q, d, st + j,
                                                     nullptr, kBlock);
}

template <DType T, int NR>
ATTNOPS_AVX2_FN void values(int64_t dv, const Rows& v, int64_t nk, const float* st, float* acc, bool oneVectorStrips) {
    std::vector<int64_t> chunk(size_t(dv / kL));
    for (int64_t c = 0; c < dv / kL; ++c) chunk[size_t(c)] = c * kL;
    if (!oneVectorStrips) {
        dec::accumulateRows<Avx2, T, NR, false, true>(dv, v.at.data(), chunk.data(), nk, st, kBlock, acc, dv);
        return;
    }
    for (int64_t c = 0; c < dv; c += kL)
        dec::accumulateColumns<Avx2, T, NR, 1, false, true>(c, v.at.data(), chunk.data(), nk, st, kBlock, acc, dv);
}

void expectSameBits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i)
        ASSERT_EQ(floatToBits(a[i]), floatToBits(b[i])) << what << " element " << i << ": " << a[i] << " vs " << b[i];
}

template <DType T, int NR>
void checkDots(std::mt19937& rng, int64_t d, int64_t nk, bool specials) {
    SCOPED_TRACE(testing::Message() << "dtype " << int(T) << " rows " << NR << " d " << d << " keys " << nk);
    const Rows k = makeRows(rng, T, nk, d, specials);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> q(size_t(NR * d));
    for (float& x : q) x = u(rng);
    // Scores of the nk keys only (st's lanes from nk on are scratch for the kernel).
    std::vector<float> steps(size_t(NR * kBlock), -7.0f), single(steps);
    dots<T, NR>(d, k, nk, q.data(), steps.data(), false);
    dots<T, NR>(d, k, nk, q.data(), single.data(), true);
    std::vector<float> a, b;
    for (int64_t r = 0; r < NR; ++r)
        for (int64_t j = 0; j < nk; ++j) {
            a.push_back(steps[size_t(r * kBlock + j)]);
            b.push_back(single[size_t(r * kBlock + j)]);
        }
    expectSameBits(a, b, "score");
}

template <DType T, int NR>
void checkValues(std::mt19937& rng, int64_t dv, int64_t nk, bool specials) {
    SCOPED_TRACE(testing::Message() << "dtype " << int(T) << " rows " << NR << " dv " << dv << " keys " << nk);
    const Rows v = makeRows(rng, T, nk, dv, specials);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    std::vector<float> st(size_t(NR * kBlock)), acc(size_t(NR * dv));
    for (float& x : st) x = u(rng);
    for (float& x : acc) x = u(rng) - 0.5f;
    std::vector<float> strips(acc), single(acc);
    values<T, NR>(dv, v, nk, st.data(), strips.data(), false);
    values<T, NR>(dv, v, nk, st.data(), single.data(), true);
    expectSameBits(strips, single, "accumulator");
}

template <DType T, int NR>
void sweep(std::mt19937& rng) {
    const int64_t keys[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 21, 31, 32, 33, 63, 64};
    for (int64_t nk : keys) {
        for (int64_t d : {kL, 8 * kL, 16 * kL}) checkDots<T, NR>(rng, d, nk, nk > 2);
        for (int64_t vectors = 1; vectors <= 17; ++vectors) checkValues<T, NR>(rng, vectors * kL, nk, nk > 2);
    }
}

template <DType T>
void sweepRows(std::mt19937& rng) {
    sweep<T, 1>(rng);
    sweep<T, 2>(rng);
    sweep<T, 3>(rng);
    sweep<T, 4>(rng);
}

TEST(FiaDecodeSteps, DotStepsAndValueStripsKeepTheBits) {
    SKIP_WITHOUT_AVX2();
    std::mt19937 rng(20261204);
    sweepRows<DType::BF16>(rng);
    sweepRows<DType::F16>(rng);
    sweepRows<DType::I8>(rng);
    sweepRows<DType::I4>(rng);
}

}  // namespace
